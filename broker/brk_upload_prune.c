/* brk_upload_prune.c -- the weights dir's housekeeping: --weights-keep
 * removals, run on a thread of their own one at a time (freeing a big
 * file's blocks takes a while, which the routing thread must not wait
 * for: a base/thread.h worker whose `idle` takes the next removal off
 * the queue, woken when one is queued, and whose `leave` does those still
 * queued at a stop); the spares, removed versions' data files kept for the next
 * uploads to write over (brk_upload_int.h, spare_t); and the dir as a
 * previous run left it (its .part files removed, its spares kept). */
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/parse.h"
#include "broker/brk_log.h"

/* ---- spares ------------------------------------------------------------------------ */

/* The largest one no longer than size (a new version of a model is most
 * often the same size as the last; a longer one would have its tail cut,
 * which frees blocks on the routing thread). */
bool brk_upl_take_spare(brk_t *b, uint64_t size, const char *part) {
    struct brk_uploads *u = b->uploads;
    if (!u->dir) return false;
    pthread_mutex_lock(&u->mu);
    int best = -1;
    for (int i = 0; i < u->nspare; i++)
        if (u->spare[i].size <= size && (best < 0 || u->spare[i].size > u->spare[best].size)) best = i;
    spare_t sp = best >= 0 ? u->spare[best] : (spare_t){ 0, 0 };
    if (best >= 0) {
        memmove(u->spare + best, u->spare + best + 1, (size_t)(u->nspare - best - 1) * sizeof *u->spare);
        u->nspare--;
    }
    pthread_mutex_unlock(&u->mu);
    if (best < 0) return false;
    char path[1024];
    brk_upl_spare_path(u->dir, sp.n, path, sizeof path);
    return rename(path, part) == 0;
}

/* Their blocks are what the upload needs; removed here on the routing
 * thread: a rare event, and the upload waits for the room anyway. */
int brk_upl_drop_spares(brk_t *b) {
    struct brk_uploads *u = b->uploads;
    if (!u->dir) return 0;
    pthread_mutex_lock(&u->mu);
    spare_t sp[SPARES_MAX];
    int n = u->nspare;
    memcpy(sp, u->spare, (size_t)n * sizeof *sp);
    u->nspare = 0;
    pthread_mutex_unlock(&u->mu);
    for (int i = 0; i < n; i++) {
        char path[1024];
        brk_upl_spare_path(u->dir, sp[i].n, path, sizeof path);
        if (unlink(path) == 0) brk_log("removed the spare %s for room", path);
    }
    return n;
}

/* Keeps the data file of a removed version as a spare (renamed to
 * DIR/.spare-N), the oldest spare removed when SPARES_MAX are kept.
 * False when it is not one to keep (u NULL, not a regular file of its
 * own: a hard link elsewhere keeps its blocks anyway) or the rename
 * failed: the caller removes it. */
static bool recycle(struct brk_uploads *u, const char *dir, const char *file) {
    struct stat st;
    if (!u || lstat(file, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) return false;
    pthread_mutex_lock(&u->mu);
    unsigned n = u->spare_seq++;
    pthread_mutex_unlock(&u->mu);
    char path[1024], old[1024];
    brk_upl_spare_path(dir, n, path, sizeof path);
    if (rename(file, path) != 0) return false;
    spare_t drop = { 0, 0 };
    bool dropping = false;
    pthread_mutex_lock(&u->mu);
    if (u->nspare == SPARES_MAX) {
        drop = u->spare[0];
        dropping = true;
        memmove(u->spare, u->spare + 1, (size_t)(SPARES_MAX - 1) * sizeof *u->spare);
        u->nspare--;
    }
    u->spare[u->nspare++] = (spare_t){ n, (uint64_t)st.st_size };
    pthread_mutex_unlock(&u->mu);
    if (dropping) {
        brk_upl_spare_path(dir, drop.n, old, sizeof old);
        unlink(old);
    }
    return true;
}

/* ---- removals ---------------------------------------------------------------------- */

static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The versions of comp stored under dir older than current, newest first,
 * in a new array (the caller frees it) of *n; NULL with *n = 0 when there
 * are none or the dir cannot be read. Out of memory: those listed so far. */
static uint64_t *older_versions(const char *dir, const char *comp, uint64_t current, size_t *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    uint64_t *older = NULL;
    size_t cap = 0, plen = strlen(comp);
    for (struct dirent *e; (e = readdir(d));) {
        /* COMP-vN.sha256: a stored version (its .safetensors beside it) */
        const char *s = e->d_name;
        size_t len = strlen(s);
        if (len < plen + 10 || strncmp(s, comp, plen) || strncmp(s + plen, "-v", 2) ||
            strcmp(s + len - 7, ".sha256"))
            continue;
        /* N: all of what lies between, decimal (the dir is anybody's: a
         * name is read as strictly as a peer's text) */
        char digits[24];
        size_t nd = len - 7 - (plen + 2);
        uint64_t v;
        if (nd >= sizeof digits) continue;
        memcpy(digits, s + plen + 2, nd);
        digits[nd] = '\0';
        if (reel_parse_u64(digits, 1, UINT64_MAX, "a stored version", &v) != 0 || v >= current) continue;
        if (*n == cap) {
            uint64_t *g = realloc(older, (cap = cap ? 2 * cap : 16) * sizeof *older);
            if (!g) break;
            older = g;
        }
        older[(*n)++] = v;
    }
    closedir(d);
    if (*n) qsort(older, *n, sizeof *older, cmp_desc);
    return older;
}

/* Removes the files of comp's uploaded versions older than current but
 * for the keep - 1 newest, under dir. The data first, then the digest: a
 * removal cut short (the broker killed) leaves a digest, which the next
 * one finds and finishes; the version is not served meanwhile (FETCH:
 * cannot open). A removed data file is kept as a spare (recycle). One
 * that cannot be removed is logged and left. */
static void prune_dir(struct brk_uploads *u, const char *dir, int keep, const char *comp, uint64_t current,
                      uint64_t base) {
    size_t n;
    uint64_t *older = older_versions(dir, comp, current, &n);
    /* the current one counts as one of the `keep`; the base of a current
     * adapter is kept besides (a worker that joins below it is sent it) */
    if (base)
        for (size_t i = 0; i < n; i++)
            if (older[i] == base) {
                memmove(older + i, older + i + 1, (n - i - 1) * sizeof *older);
                n--;
                break;
            }
    for (size_t i = (size_t)keep - 1; i < n; i++) {
        char sum[1024], file[1024];
        snprintf(sum, sizeof sum, "%s/%s-v%" PRIu64 ".sha256", dir, comp, older[i]);
        snprintf(file, sizeof file, "%s/%s-v%" PRIu64 ".safetensors", dir, comp, older[i]);
        if ((!recycle(u, dir, file) && unlink(file) != 0 && errno != ENOENT) ||
            (unlink(sum) != 0 && errno != ENOENT)) {
            brk_log("--weights-keep: cannot remove %s v%" PRIu64 ": %s", comp, older[i], strerror(errno));
            continue;
        }
        brk_log("removed uploaded %s v%" PRIu64 " (--weights-keep %d, v%" PRIu64 " is current)", comp, older[i],
                keep, current);
    }
    free(older);
}

/* Takes the next removal off the queue and does it. False when none
 * was queued. */
static bool prune_next(struct brk_uploads *u) {
    prune_t p = { .current = 0 };
    pthread_mutex_lock(&u->mu);
    bool any = u->nq > 0;
    if (any) {
        p = u->q[0];
        memmove(u->q, u->q + 1, (size_t)(u->nq - 1) * sizeof *u->q);
        u->nq--;
        u->removing = true;
    }
    pthread_mutex_unlock(&u->mu);
    if (!any) return false;
    prune_dir(u, u->dir, u->keep, p.component, p.current, p.base);
    pthread_mutex_lock(&u->mu);
    u->removing = false;
    if (u->nq == 0) pthread_cond_broadcast(&u->done);
    pthread_mutex_unlock(&u->mu);
    return true;
}

/* Between wakes: one removal, then at once the next (0), or sleep until
 * brk_upload_prune queues one (-1). Can't fail: a removal that fails is
 * logged. */
static int64_t prune_idle(void *user) { return prune_next(user) ? 0 : -1; }

/* The last thing on the thread (a stop): the removals still queued, so
 * that every one asked is done before the state goes. */
static void prune_leave(void *user) {
    while (prune_next(user)) {
    }
}

/* No items are posted: the queue is q. */
static void prune_run(void *user, void *item) {
    (void)user;
    (void)item;
}

void brk_upl_prune_start(brk_t *b) {
    struct brk_uploads *u = b->uploads;
    if (!u->dir || u->keep <= 0) return; /* nothing to remove, or inline (out of memory) */
    reel_thread_opts_t o = { .name = "upload-prune",
                             .user = u,
                             .run = prune_run,
                             .idle = prune_idle,
                             .leave = prune_leave,
                             .block_signals = true /* the stop signal must interrupt the routing thread's poll */ };
    if (!(u->th = reel_thread_start(&o)))
        brk_log("cannot start the --weights-keep removal thread (%s): removals run on the routing thread",
                reel_err_text());
}

void brk_upl_prune_stop(brk_t *b) {
    reel_thread_stop(&b->uploads->th, REEL_THREAD_DRAIN); /* leave does what is queued */
}

void brk_upl_prunes_wait(brk_t *b) {
    struct brk_uploads *u = b->uploads;
    if (!u) return;
    pthread_mutex_lock(&u->mu);
    while (u->nq > 0 || u->removing) pthread_cond_wait(&u->done, &u->mu);
    pthread_mutex_unlock(&u->mu);
}

/* Queues comp's removal (u->mu held): one per component, the newest
 * current asked wins; a full queue drops it (the next SYNC asks again). */
static void prune_queue(struct brk_uploads *u, const char *comp, uint64_t current, uint64_t base) {
    int i = 0;
    while (i < u->nq && strcmp(u->q[i].component, comp)) i++;
    if (i == u->nq && u->nq < PRUNES_MAX) {
        snprintf(u->q[i].component, sizeof u->q[i].component, "%s", comp);
        u->q[i].current = current;
        u->q[i].base = base;
        u->nq++;
    }
    if (i < u->nq && current > u->q[i].current) { /* the newest asked wins */
        u->q[i].current = current;
        u->q[i].base = base;
    }
}

void brk_upload_prune(brk_t *b, const char *comp, uint64_t current, uint64_t base) {
    int keep = b->opt.weights_keep;
    if (!b->opt.weights_dir || keep <= 0) return;
    struct brk_uploads *u = b->uploads;
    if (!u || !u->dir) { /* no copy of the dir for a thread (out of memory at start) */
        prune_dir(NULL, b->opt.weights_dir, keep, comp, current, base);
        return;
    }
    pthread_mutex_lock(&u->mu);
    prune_queue(u, comp, current, base);
    pthread_mutex_unlock(&u->mu);
    if (u->th) reel_thread_wake(u->th);
    else while (prune_next(u)) { /* no thread: here, as it could not start */
    }
}

/* ---- the dir a previous run left ------------------------------------------------- */

#define FOUND_MAX 64

/* The startup scan of the weights dir. */
typedef struct {
    brk_t *b;
    const char *dir;             /* --weights-dir */
    spare_t found[FOUND_MAX];    /* the spares found so far (the newest FOUND_MAX) */
    int nfound;
} scan_t;

/* The N of a file named .spare-N (text: what follows "-"), as
 * brk_upl_spare_path writes it: decimal digits, no sign, no leading zero,
 * below 2^31. 0 with *n, or -1 with a REEL_E_INVALID error. */
static int spare_name(const char *text, unsigned *n) {
    uint64_t k;
    if ((text[0] == '0' && text[1]) || reel_parse_u64(text, 0, INT32_MAX, "a spare's number", &k) != 0)
        return reel_fail(REEL_E_INVALID, "not a name a spare has");
    *n = (unsigned)k;
    return 0;
}

static int cmp_spare(const void *a, const void *b) {
    unsigned x = ((const spare_t *)a)->n, y = ((const spare_t *)b)->n;
    return x < y ? -1 : x > y;
}

/* With found full: the newest are kept, so the oldest of them or spare sn
 * goes. True when the oldest went (sn took its place); false when sn is
 * the oldest. */
static bool scan_displace(scan_t *sc, unsigned sn, uint64_t size) {
    int old = 0;
    for (int i = 1; i < sc->nfound; i++)
        if (sc->found[i].n < sc->found[old].n) old = i;
    if (sn <= sc->found[old].n) return false;
    char gone[1024];
    brk_upl_spare_path(sc->dir, sc->found[old].n, gone, sizeof gone);
    if (unlink(gone) == 0) brk_log("removed %s: a spare past the %d kept", gone, SPARES_MAX);
    sc->found[old] = (spare_t){ .n = sn, .size = size };
    return true;
}

/* DIR/name, a file named .spare-*: noted when a previous run's spare,
 * else removed (or, when it cannot be, logged for the operator). */
static void scan_spare(scan_t *sc, const char *name, const char *path) {
    struct stat st;
    unsigned sn = 0;
    const char *reason = spare_name(name + 7, &sn) != 0 ? reel_err()->msg : NULL;
    if (!reason && (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1))
        reason = "not a file of its own";
    if (!reason && sc->nfound == FOUND_MAX) {
        if (scan_displace(sc, sn, (uint64_t)st.st_size)) return;
        reason = "a spare past those kept";
    }
    if (!reason) {
        sc->found[sc->nfound++] = (spare_t){ .n = sn, .size = (uint64_t)st.st_size };
        return;
    }
    if (unlink(path) == 0) brk_log("removed %s: %s", path, reason);
    else brk_log("%s is in the way of the spares (%s): remove it", path, reason);
}

/* The spares found, oldest first (numbers grow): the newest SPARES_MAX
 * kept for the next uploads (none without the removal thread's copy of
 * the dir), the others removed; the next .spare-N numbered past them all. */
static void scan_keep(scan_t *sc) {
    struct brk_uploads *u = sc->b->uploads;
    qsort(sc->found, (size_t)sc->nfound, sizeof *sc->found, cmp_spare);
    for (int i = 0; i < sc->nfound; i++) {
        if (sc->found[i].n >= u->spare_seq) u->spare_seq = sc->found[i].n + 1;
        if (u->dir && i >= sc->nfound - SPARES_MAX) {
            u->spare[u->nspare++] = sc->found[i];
            continue;
        }
        char path[1024];
        brk_upl_spare_path(sc->dir, sc->found[i].n, path, sizeof path);
        if (unlink(path) == 0) brk_log("removed %s: a spare past the %d kept", path, SPARES_MAX);
    }
}

void brk_upl_scan_dir(brk_t *b) {
    scan_t sc = { .b = b, .dir = b->opt.weights_dir };
    DIR *d = opendir(sc.dir);
    if (!d) {
        brk_log("--weights-dir %s: %s (uploads will fail until it exists)", sc.dir, strerror(errno));
        return;
    }
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", sc.dir, e->d_name);
        if (!strncmp(e->d_name, ".spare-", 7)) scan_spare(&sc, e->d_name, path);
        else if (e->d_name[0] == '.' && n >= 6 && !strcmp(e->d_name + n - 5, ".part") && unlink(path) == 0)
            brk_log("removed %s: an upload a previous run did not finish", path);
    }
    closedir(d);
    scan_keep(&sc);
}
