/* brk_upload.c -- weights by value (see brk_upload.h). */
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker/brk_log.h"
#include "broker/brk_msg.h"
#include "broker/brk_zap.h"
#include "base/sha256.h"

static void *hasher_main(void *arg) {
    hasher_t *hs = arg;
    pthread_mutex_lock(&hs->mu);
    for (;;) {
        while (!hs->quit && hs->n == 0) pthread_cond_wait(&hs->cv, &hs->mu);
        if (hs->n == 0) break; /* quit, nothing left */
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_move(&m, &hs->q[hs->head]);
        zmq_msg_close(&hs->q[hs->head]);
        hs->head = (hs->head + 1) % HASH_QUEUE;
        hs->n--;
        hs->busy = true;
        pthread_cond_broadcast(&hs->cv); /* room in the queue: the routing thread may wait for it */
        pthread_mutex_unlock(&hs->mu);
        reel_sha256_update(hs->h, zmq_msg_data(&m), zmq_msg_size(&m));
        zmq_msg_close(&m);
        pthread_mutex_lock(&hs->mu);
        hs->busy = false;
        pthread_cond_broadcast(&hs->cv);
    }
    pthread_mutex_unlock(&hs->mu);
    return NULL;
}

bool brk_upload_no_hash_thread = false;

/* NULL when out of memory. Without a thread (it could not start, or
 * brk_upload_no_hash_thread) it hashes inline, as before. */
static hasher_t *hasher_new(void) {
    hasher_t *hs = calloc(1, sizeof *hs);
    if (!hs || !(hs->h = reel_sha256_new())) {
        free(hs);
        return NULL;
    }
    pthread_mutex_init(&hs->mu, NULL);
    pthread_cond_init(&hs->cv, NULL);
    /* Without SIGINT/SIGTERM: the stop signal is the routing thread's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int e = brk_upload_no_hash_thread ? EAGAIN : pthread_create(&hs->th, NULL, hasher_main, hs);
    hs->threaded = e == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) brk_log("cannot start an upload's hashing thread (%s): it hashes on the routing thread", strerror(e));
    return hs;
}

/* Queues the n bytes at p, which are frame's (NULL: no frame to share, so
 * a copy is queued), to be hashed after those queued before. */
static void hasher_push(hasher_t *hs, const zmq_msg_t *frame, const void *p, size_t n) {
    if (!hs->threaded) {
        reel_sha256_update(hs->h, p, n);
        return;
    }
    zmq_msg_t c;
    bool shared = frame && zmq_msg_init(&c) == 0 && zmq_msg_copy(&c, (zmq_msg_t *)frame) == 0;
    if (!shared && zmq_msg_init_size(&c, n) != 0) { /* out of memory: hashed here, in its turn */
        pthread_mutex_lock(&hs->mu);
        while (hs->n > 0 || hs->busy) pthread_cond_wait(&hs->cv, &hs->mu);
        reel_sha256_update(hs->h, p, n);
        pthread_mutex_unlock(&hs->mu);
        return;
    }
    if (!shared && n) memcpy(zmq_msg_data(&c), p, n);
    pthread_mutex_lock(&hs->mu);
    while (hs->n == HASH_QUEUE) pthread_cond_wait(&hs->cv, &hs->mu);
    zmq_msg_t *slot = &hs->q[(hs->head + hs->n) % HASH_QUEUE];
    zmq_msg_init(slot);
    zmq_msg_move(slot, &c);
    zmq_msg_close(&c);
    hs->n++;
    pthread_cond_broadcast(&hs->cv);
    pthread_mutex_unlock(&hs->mu);
}

/* Stops the thread: with hex, after every chunk queued is hashed, the
 * digest into hex; without, the chunks still queued are dropped. Frees
 * hs. NULL-safe. */
static void hasher_end(hasher_t **hp, char hex[65]) {
    hasher_t *hs = *hp;
    if (!hs) return;
    if (hs->threaded) {
        pthread_mutex_lock(&hs->mu);
        if (hex)
            while (hs->n > 0 || hs->busy) pthread_cond_wait(&hs->cv, &hs->mu);
        for (; hs->n > 0; hs->n--, hs->head = (hs->head + 1) % HASH_QUEUE) zmq_msg_close(&hs->q[hs->head]);
        hs->quit = true;
        pthread_cond_broadcast(&hs->cv);
        pthread_mutex_unlock(&hs->mu);
        pthread_join(hs->th, NULL);
    }
    char drop[65];
    reel_sha256_final(&hs->h, hex ? hex : drop);
    pthread_cond_destroy(&hs->cv);
    pthread_mutex_destroy(&hs->mu);
    free(hs);
    *hp = NULL;
}

static void spare_path(const char *dir, unsigned n, char *buf, size_t len) {
    snprintf(buf, len, "%s/.spare-%u", dir, n);
}

/* The N of a file named .spare-N (text: what follows "-"), as spare_path
 * writes it: decimal digits, no sign, no leading zero, below 2^31. NULL,
 * or why it is not one. */
static const char *spare_name(const char *text, unsigned *n) {
    size_t len = strlen(text);
    if (len == 0 || len > 10 || (text[0] == '0' && len > 1)) return "not a name a spare has";
    unsigned long long k = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9') return "not a name a spare has";
        k = k * 10 + (unsigned long long)(text[i] - '0');
    }
    if (k >= (1ull << 31)) return "not a name a spare has";
    *n = (unsigned)k;
    return NULL;
}

static int cmp_spare(const void *a, const void *b) {
    unsigned x = ((const spare_t *)a)->n, y = ((const spare_t *)b)->n;
    return x < y ? -1 : x > y;
}

/* DIR/<prefix>COMPONENT-vVERSION<suffix> into buf. */
static void file_of(const brk_t *b, const char *prefix, const char *comp, uint64_t v, const char *suffix, char *buf,
                    size_t len) {
    snprintf(buf, len, "%s/%s%s-v%" PRIu64 "%s", b->opt.weights_dir, prefix, comp, v, suffix);
}

static void lower(const char *in, char out[65]) {
    for (int i = 0; i < 64; i++) out[i] = (char)(in[i] >= 'A' && in[i] <= 'F' ? in[i] - 'A' + 'a' : in[i]);
    out[64] = '\0';
}

static void ack(brk_t *b, const zmq_msg_t *to, uint64_t id, const char *comp, uint64_t v, uint64_t received,
                bool complete) {
    msg_upload_ack_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.component, sizeof a.component, "%s", comp);
    a.version = v;
    a.received = received;
    a.complete = complete;
    if (msg_upload_ack_send(b->clients, to, id, &a) != 0) brk_undelivered(b, "UPLOAD_ACK");
}

static void fail_parked(brk_t *b, slot_t *s, const char *why);
static void serve_parked(brk_t *b, slot_t *s, const msg_upload_t *u, const wire_msg_t *m);

static void close_slot(brk_t *b, slot_t *s, bool remove_part) {
    if (!s->open) return;
    fail_parked(b, s, remove_part ? "the upload failed or was replaced" : "the upload closed");
    free(s->parked);
    if (s->fd >= 0) close(s->fd);
    hasher_end(&s->h, NULL);
    if (remove_part) {
        char part[1024];
        file_of(b, ".", s->component, s->version, ".part", part, sizeof part);
        unlink(part);
    }
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

/* ---- stored files --------------------------------------------------------------- */

bool brk_upload_stored(brk_t *b, const char *comp, uint64_t v, const char *sha256, char *why, size_t len) {
    if (!b->opt.weights_dir) {
        snprintf(why, len, "this broker keeps no uploaded weights (start it with --weights-dir)");
        return false;
    }
    char path[1024], got[80] = "";
    file_of(b, "", comp, v, ".sha256", path, sizeof path);
    FILE *f = fopen(path, "re");
    if (f) {
        if (!fgets(got, sizeof got, f)) got[0] = '\0';
        fclose(f);
    }
    got[strcspn(got, "\r\n")] = '\0';
    if (strlen(got) != 64) {
        snprintf(why, len, "%s v%" PRIu64 " was not uploaded to this broker (UPLOAD it first)", comp, v);
        return false;
    }
    if (strcasecmp(got, sha256) != 0) {
        snprintf(why, len, "%s v%" PRIu64 " was uploaded with other weights (sha256 %.16s...)", comp, v, got);
        return false;
    }
    /* A digest without its file: a --weights-keep removal under way, or
     * cut short (it removes the data first): no longer stored. */
    file_of(b, "", comp, v, ".safetensors", path, sizeof path);
    if (access(path, F_OK) != 0) {
        snprintf(why, len, "%s v%" PRIu64 " was not uploaded to this broker (UPLOAD it first)", comp, v);
        return false;
    }
    return true;
}

/* Renames the .part into place and writes DIR/C-vV.sha256 beside it (by
 * a temporary file and a rename): from then on the version is served. No
 * fsync: it would stall the routing loop for as long as the disk takes
 * to write the whole file (seconds for a large model, and heartbeats
 * missed meanwhile); a file a crash left short or torn is caught where it
 * matters, by the worker's sha256 check of what it fetched, and the
 * trainer uploads it again. */
static int publish(brk_t *b, const slot_t *s, char *why, size_t len) {
    char part[1024], final[1024], sum[1024], tmp[1100];
    file_of(b, ".", s->component, s->version, ".part", part, sizeof part);
    file_of(b, "", s->component, s->version, ".safetensors", final, sizeof final);
    file_of(b, "", s->component, s->version, ".sha256", sum, sizeof sum);
    snprintf(tmp, sizeof tmp, "%s.tmp", sum);
    /* (tried again after a full disk: the data may be in place already) */
    if (rename(part, final) != 0 && !(errno == ENOENT && access(final, F_OK) == 0)) goto fail;
    int tfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    FILE *f = tfd >= 0 ? fdopen(tfd, "w") : NULL;
    if (!f) {
        if (tfd >= 0) close(tfd);
        goto fail;
    }
    int bad = fprintf(f, "%s\n", s->sha256) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, sum) != 0) goto fail;
    return 0;
fail:;
    int e = errno;
    snprintf(why, len, "cannot store the upload: %s", strerror(e));
    unlink(tmp);
    errno = e;
    return -1;
}

/* ---- receiving ------------------------------------------------------------------- */

static slot_t *slot_of(brk_t *b, const char *comp, uint64_t v) {
    for (int i = 0; i < BRK_UPLOADS_MAX; i++)
        if (b->uploads->s[i].open && b->uploads->s[i].version == v && !strcmp(b->uploads->s[i].component, comp))
            return &b->uploads->s[i];
    return NULL;
}

/* Renames the spare that suits an upload of size bytes to part: the
 * largest one no longer than that (a new version of a model is most often
 * the same size as the last; a longer one would have its tail cut, which
 * frees blocks on the routing thread). True when one was taken. */
static bool take_spare(brk_t *b, uint64_t size, const char *part) {
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
    spare_path(u->dir, sp.n, path, sizeof path);
    return rename(path, part) == 0;
}

/* Removes every spare (a full disk: their blocks are what the upload
 * needs), here on the routing thread: a rare event, and the upload waits
 * for the room anyway. Returns how many were removed. */
static int drop_spares(brk_t *b) {
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
        spare_path(u->dir, sp[i].n, path, sizeof path);
        if (unlink(path) == 0) brk_log("removed the spare %s for room", path);
    }
    return n;
}

/* A new upload of u in a free slot (.part created, empty, or a spare to
 * write over). NULL with why and *code (busy: every slot is taken). */
static slot_t *open_slot(brk_t *b, const msg_upload_t *u, const char *sha, const char **code, char *why,
                         size_t len) {
    slot_t *s = NULL, *idle = NULL;
    for (int i = 0; i < BRK_UPLOADS_MAX && !s; i++)
        if (!b->uploads->s[i].open) s = &b->uploads->s[i];
        else if (!idle || b->uploads->s[i].touched_ms < idle->touched_ms) idle = &b->uploads->s[i];
    if (!s && idle && brk_now_ms() - idle->touched_ms >= BRK_UPLOAD_STALE_MS) {
        brk_log("upload %s v%" PRIu64 " given up for a new one: no chunk in %d s", idle->component,
                idle->version, (int)((brk_now_ms() - idle->touched_ms) / 1000));
        close_slot(b, idle, true);
        s = idle;
    }
    if (!s) {
        *code = WIRE_E_BUSY;
        snprintf(why, len, "%d uploads are in progress; finish one first (or retry when one ends)", BRK_UPLOADS_MAX);
        return NULL;
    }
    *code = WIRE_E_INTERNAL;
    char part[1024];
    file_of(b, ".", u->component, u->version, ".part", part, sizeof part);
    bool spare = take_spare(b, u->size, part);
    int fd = open(part, O_RDWR | O_CREAT | (spare ? 0 : O_TRUNC) | O_CLOEXEC | O_NOFOLLOW, 0600);
    /* a spare's length now, not as recorded (cut at the end if longer) */
    struct stat st = { 0 };
    bool unsized = spare && fd >= 0 && fstat(fd, &st) != 0;
    hasher_t *h = fd >= 0 && !unsized ? hasher_new() : NULL;
    if (!h) {
        snprintf(why, len, "cannot open %.200s: %s", part, fd < 0 || unsized ? strerror(errno) : "out of memory");
        if (fd >= 0) close(fd);
        if (spare) unlink(part); /* not left behind with old bytes in it */
        return NULL;
    }
    *s = (slot_t){ .open = true, .version = u->version, .size = u->size, .fd = fd, .h = h, .recycled = spare,
                   .spare_size = spare ? (uint64_t)st.st_size : 0, .touched_ms = brk_now_ms() };
    snprintf(s->component, sizeof s->component, "%s", u->component);
    snprintf(s->sha256, sizeof s->sha256, "%s", sha);
    return s;
}

/* Appends the chunk at s->received (frame: its bytes' frame, NULL: none).
 * 0, or -1 with why (nothing counted). */
static int append(brk_t *b, slot_t *s, const msg_upload_t *u, const zmq_msg_t *frame, char *why, size_t len) {
    const unsigned char *p = u->chunk->data;
    size_t n = u->chunk->bytes, done = 0;
    bool dropped = false;
    while (done < n) {
        ssize_t w = pwrite(s->fd, p + done, n - done, (off_t)(s->received + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == ENOSPC || errno == EDQUOT) && !dropped) {
            dropped = true;
            if (drop_spares(b) > 0) continue;
        }
        if (w <= 0) {
            snprintf(why, len, "cannot write the upload: %s", w < 0 ? strerror(errno) : "no progress");
            if (ftruncate(s->fd, (off_t)s->received) != 0) { /* the next try writes over it anyway */ }
            return -1;
        }
        done += (size_t)w;
    }
    hasher_push(s->h, frame, p, n);
    s->received += n;
    return 0;
}

/* All of it came: hashed, compared, published. Answers the trainer. u, m:
 * the last chunk and its message (serve_parked). */
static void finish(brk_t *b, const zmq_msg_t *from, uint64_t id, slot_t *s, const msg_upload_t *u,
                   const wire_msg_t *m) {
    char got[65], why[256];
    hasher_end(&s->h, got);
    brk_who_t who;
    brk_zap_sender(b->zap, &who);
    char final[1024];
    file_of(b, "", s->component, s->version, ".safetensors", final, sizeof final);
    if (strcmp(got, s->sha256) != 0) {
        brk_log("upload %s v%" PRIu64 " refused: its bytes hash to %.16s..., not %.16s...", s->component, s->version,
                got, s->sha256);
        brk_cq_audit(b->cat, who.name, reel_role_name(who.role), "upload", s->component, s->version, s->sha256,
                     NULL, "refused: sha256 mismatch");
        brk_error_to(b, false, from, id, WIRE_E_BAD_REQUEST, "UPLOAD: the bytes hash to %s, not the announced %s",
                     got, s->sha256);
        close_slot(b, s, true);
        return;
    }
    if (s->spare_size > s->size && ftruncate(s->fd, (off_t)s->size) != 0) {
        snprintf(why, sizeof why, "cannot cut the recycled file to size: %s", strerror(errno));
        brk_log("upload %s v%" PRIu64 ": %s", s->component, s->version, why);
        brk_error_to(b, false, from, id, WIRE_E_INTERNAL, "UPLOAD: %s", why);
        close_slot(b, s, true);
        return;
    }
    int rc = publish(b, s, why, sizeof why);
    if (rc != 0 && (errno == ENOSPC || errno == EDQUOT) && drop_spares(b) > 0) rc = publish(b, s, why, sizeof why);
    if (rc != 0) {
        brk_log("upload %s v%" PRIu64 ": %s", s->component, s->version, why);
        brk_error_to(b, false, from, id, WIRE_E_INTERNAL, "UPLOAD: %s", why);
        close_slot(b, s, true);
        return;
    }
    serve_parked(b, s, u, m); /* a SYNC that came first: its workers wait for the last chunks */
    brk_log("upload %s v%" PRIu64 " stored: %" PRIu64 " bytes, sha256 %.16s... (%s)", s->component, s->version,
            s->size, s->sha256, final);
    brk_cq_audit(b->cat, who.name, reel_role_name(who.role), "upload", s->component, s->version, s->sha256, final,
                 "stored");
    ack(b, from, id, s->component, s->version, s->size, true);
    close_slot(b, s, false);
}

void brk_upload_chunk(brk_t *b, const zmq_msg_t *from, uint64_t id, const msg_upload_t *u, const wire_msg_t *m) {
    char why[300], sha[65];
    if (!b->opt.weights_dir || !b->uploads) {
        brk_error_to(b, false, from, id, WIRE_E_BAD_REQUEST,
                     "UPLOAD: this broker keeps no uploaded weights (start it with --weights-dir)");
        return;
    }
    if (!brk_component_served(u->component, why, sizeof why)) { /* nothing could ever sync it */
        brk_error_to(b, false, from, id, WIRE_E_BAD_REQUEST, "UPLOAD: %s", why);
        return;
    }
    lower(u->sha256, sha);
    if (brk_upload_stored(b, u->component, u->version, sha, why, sizeof why)) {
        ack(b, from, id, u->component, u->version, u->size, true); /* sent again: it is there */
        return;
    }
    if (strstr(why, "other weights")) {
        brk_error_to(b, false, from, id, WIRE_E_STALE, "UPLOAD: %s", why);
        return;
    }
    slot_t *s = slot_of(b, u->component, u->version);
    if (s && (strcmp(s->sha256, sha) || s->size != u->size)) {
        if (u->offset != 0) {
            brk_error_to(b, false, from, id, WIRE_E_BAD_REQUEST,
                         "UPLOAD: %s v%" PRIu64 " is being uploaded with %s (%" PRIu64 " bytes, sha256 %.16s...); "
                         "offset 0 replaces it", u->component, u->version,
                         strcmp(s->sha256, sha) ? "other weights" : "another size", s->size, s->sha256);
            return;
        }
        close_slot(b, s, true);
        s = NULL;
    }
    if (!s && u->offset != 0) { /* nothing held: from the start */
        ack(b, from, id, u->component, u->version, 0, false);
        return;
    }
    const char *code = WIRE_E_INTERNAL;
    if (!s && !(s = open_slot(b, u, sha, &code, why, sizeof why))) {
        brk_error_to(b, false, from, id, code, "UPLOAD: %s", why);
        return;
    }
    if (u->offset != s->received) { /* out of order: where to go on (not progress: the slot's clock stays) */
        ack(b, from, id, u->component, u->version, s->received, false);
        return;
    }
    const zmq_msg_t *frame = NULL; /* the chunk's frame in m */
    for (int k = 0; m && k < m->n_tensors && !frame; k++)
        if (u->chunk == &m->t[k]) frame = &m->frame[k];
    if (append(b, s, u, frame, why, sizeof why) != 0) {
        /* The bytes cannot be kept (a full disk): the workers waiting for
         * them hear it now, and so does every FETCH of them until a chunk
         * goes in again, not after their own timeout. The slot stays: the
         * trainer may resume when there is room. */
        brk_log("upload %s v%" PRIu64 " stalls at %" PRIu64 " of %" PRIu64 " bytes: %s", s->component, s->version,
                s->received, s->size, why);
        snprintf(s->stalled, sizeof s->stalled, "%s", why);
        s->touched_ms = brk_now_ms(); /* a trainer retrying at the right offset keeps its slot */
        fail_parked(b, s, why);
        brk_error_to(b, false, from, id, WIRE_E_INTERNAL, "UPLOAD: %s", why);
        return;
    }
    s->stalled[0] = '\0';
    s->touched_ms = brk_now_ms(); /* idle is measured from the last bytes kept */
    if (s->received == s->size) {
        finish(b, from, id, s, u, m);
    } else {
        serve_parked(b, s, u, m);
        ack(b, from, id, u->component, u->version, s->received, false);
    }
}

/* ---- serving ---------------------------------------------------------------------- */

static void free_chunk(void *data, void *hint) {
    (void)hint;
    free(data);
}

/* FETCH_DATA: the bytes of fd from offset (at most max, none past end),
 * the file being size bytes long; or ERROR when they cannot be read. The
 * chunk's frame is the buffer it was read into, handed to ZeroMQ (freed
 * once sent): no copy of it on the routing thread. */
static void serve(brk_t *b, const zmq_msg_t *to, uint64_t id, const char *comp, uint64_t v, int fd, uint64_t size,
                  uint64_t offset, uint64_t max) {
    uint64_t n = offset >= size ? 0 : size - offset < max ? size - offset : max;
    unsigned char *buf = malloc(n ? n : 1);
    ssize_t got = buf && n ? pread(fd, buf, n, (off_t)offset) : 0;
    wire_msg_t *sh = buf && got == (ssize_t)n ? calloc(1, sizeof *sh) : NULL;
    if (!sh || zmq_msg_init_data(&sh->frame[0], buf, n, free_chunk, NULL) != 0) {
        brk_error_to(b, true, to, id, WIRE_E_INTERNAL, "FETCH: cannot read %s v%" PRIu64 ": %s", comp, v,
                     !buf || (sh == NULL && got == (ssize_t)n) ? "out of memory"
                     : got < 0                                 ? strerror(errno)
                     : got != (ssize_t)n                       ? "the file is shorter than it was"
                                                               : "out of memory");
        free(sh);
        free(buf);
        return;
    }
    sh->n_tensors = 1;
    sh->t[0] = msg_chunk(buf, n);
    msg_fetch_data_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.component, sizeof d.component, "%s", comp);
    d.version = v;
    d.offset = offset;
    d.size = size;
    d.chunk = &sh->t[0];
    if (msg_send(b->workers, to, MSG_FETCH_DATA, id, &d, sh) != 0) brk_undelivered(b, "FETCH_DATA");
    else b->fetch_bytes_read += n;
    zmq_msg_close(&sh->frame[0]); /* zmq holds its own reference while it sends */
    free(sh);
}

/* Whether a FETCH of (offset, max) can be answered whole from what an
 * upload in progress holds: a worker asks for fixed offsets and takes
 * each answer as the whole chunk, so a chunk is never sent short. */
static bool ready(const slot_t *s, uint64_t offset, uint64_t max) {
    /* Past the end: answered empty, but only once all came, so that it
     * does not overtake the same connection's FETCHes still waiting
     * (a worker asks 4 ahead before it knows the size). */
    if (offset >= s->size) return s->received >= s->size;
    uint64_t end = s->size - offset < max ? s->size : offset + max;
    return s->received >= end;
}

static void serve_slot(brk_t *b, slot_t *s, const zmq_msg_t *to, uint64_t id, uint64_t offset, uint64_t max) {
    serve(b, to, id, s->component, s->version, s->fd, s->size, offset, max);
}

/* FETCH_DATA of the chunk u that just came, in m: when the FETCH asks for
 * exactly those bytes (a worker's fixed offsets and the trainer's chunks
 * line up, as they do at the default 4 MiB), its frame goes out shared
 * with ZeroMQ (reference-counted: no read back from the file, no copy, for
 * every worker that waits for it). False when the FETCH asks for other
 * bytes. */
static bool serve_arrived(brk_t *b, slot_t *s, const zmq_msg_t *to, uint64_t id, uint64_t offset, uint64_t max,
                          const msg_upload_t *u, const wire_msg_t *m) {
    if (!u || !m || offset != u->offset || offset >= s->size) return false;
    uint64_t n = s->size - offset < max ? s->size - offset : max;
    if (n != u->chunk->bytes) return false;
    msg_fetch_data_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.component, sizeof d.component, "%s", s->component);
    d.version = s->version;
    d.offset = offset;
    d.size = s->size;
    d.chunk = u->chunk;
    if (msg_send(b->workers, to, MSG_FETCH_DATA, id, &d, m) != 0) brk_undelivered(b, "FETCH_DATA");
    else b->fetch_bytes_shared += n;
    return true;
}

static int grow_parked(slot_t *s) {
    int cap = s->cap_parked ? 2 * s->cap_parked : 16;
    if (cap > BRK_FETCH_PARKED_MAX) cap = BRK_FETCH_PARKED_MAX;
    parked_t *p = realloc(s->parked, (size_t)cap * sizeof *p);
    if (!p) return -1;
    s->parked = p;
    s->cap_parked = cap;
    return 0;
}

/* The routing id of parked FETCH p as a message to send to. -1: no memory. */
static int parked_to(const parked_t *p, zmq_msg_t *to) {
    if (zmq_msg_init_size(to, p->who_len) != 0) return -1;
    memcpy(zmq_msg_data(to), p->who, p->who_len);
    return 0;
}

/* Answers the parked FETCHes the bytes have come for, in the order they
 * came (one connection's answers must keep its order); those asking for
 * exactly chunk u (in m) with its frame (serve_arrived). */
static void serve_parked(brk_t *b, slot_t *s, const msg_upload_t *u, const wire_msg_t *m) {
    int keep = 0;
    for (int i = 0; i < s->n_parked; i++) {
        parked_t *p = &s->parked[i];
        if (!ready(s, p->offset, p->max)) {
            s->parked[keep++] = *p;
            continue;
        }
        zmq_msg_t to;
        if (parked_to(p, &to) != 0) { /* out of memory: it waits for the next chunk */
            s->parked[keep++] = *p;
            continue;
        }
        if (!serve_arrived(b, s, &to, p->id, p->offset, p->max, u, m)) serve_slot(b, s, &to, p->id, p->offset, p->max);
        zmq_msg_close(&to);
    }
    s->n_parked = keep;
}

static void fail_parked(brk_t *b, slot_t *s, const char *why) {
    for (int i = 0; i < s->n_parked; i++) {
        parked_t *p = &s->parked[i];
        zmq_msg_t to;
        if (parked_to(p, &to) != 0) continue;
        brk_error_to(b, true, &to, p->id, WIRE_E_BAD_REQUEST, "FETCH: %s v%" PRIu64 ": %s", s->component,
                     s->version, why);
        zmq_msg_close(&to);
    }
    s->n_parked = 0;
}

/* A FETCH from the connection `from` at offset that waits already (the
 * worker asked again after a silence: docs/PROTOCOL.md, "Weights by
 * value"): it takes the new id, keeping its place in the order. */
static bool refold(slot_t *s, const zmq_msg_t *from, uint64_t id, uint64_t offset, uint64_t max) {
    size_t n = zmq_msg_size(from);
    const void *who = zmq_msg_data((zmq_msg_t *)from);
    for (int i = 0; i < s->n_parked; i++) {
        parked_t *p = &s->parked[i];
        if (p->offset == offset && p->who_len == n && !memcmp(p->who, who, n)) {
            p->id = id;
            p->max = max;
            return true;
        }
    }
    return false;
}

void brk_upload_fetch(brk_t *b, const zmq_msg_t *from, uint64_t id, const msg_fetch_t *f) {
    char why[300], path[1024], sha[65];
    uint64_t max = f->max && f->max < MSG_CHUNK_MAX ? f->max : MSG_CHUNK_MAX;
    lower(f->sha256, sha);
    /* An upload in progress of these bytes: what came is served, the rest
     * when it comes (a SYNC may name a version still coming). */
    slot_t *s = b->uploads ? slot_of(b, f->component, f->version) : NULL;
    if (s && !strcmp(s->sha256, sha)) {
        if (ready(s, f->offset, max)) {
            serve_slot(b, s, from, id, f->offset, max);
        } else if (s->stalled[0]) {
            brk_error_to(b, true, from, id, WIRE_E_INTERNAL, "FETCH: %s v%" PRIu64 ": the upload stalled: %s",
                         s->component, s->version, s->stalled);
        } else if (refold(s, from, id, f->offset, max)) {
            /* a worker asking again for a chunk it waits for: one answer */
        } else if (s->n_parked == BRK_FETCH_PARKED_MAX || zmq_msg_size(from) > sizeof s->parked[0].who ||
                   (s->n_parked == s->cap_parked && grow_parked(s) != 0)) {
            brk_error_to(b, true, from, id, WIRE_E_BUSY, "FETCH: %d fetches already wait for %s v%" PRIu64,
                         s->n_parked, s->component, s->version);
        } else {
            parked_t *p = &s->parked[s->n_parked++];
            p->who_len = zmq_msg_size(from);
            memcpy(p->who, zmq_msg_data((zmq_msg_t *)from), p->who_len);
            p->id = id;
            p->offset = f->offset;
            p->max = max;
        }
        return;
    }
    if (!brk_upload_stored(b, f->component, f->version, f->sha256, why, sizeof why)) {
        brk_error_to(b, true, from, id, WIRE_E_BAD_REQUEST, "FETCH: %s", why);
        return;
    }
    file_of(b, "", f->component, f->version, ".safetensors", path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        brk_error_to(b, true, from, id, WIRE_E_INTERNAL, "FETCH: cannot open %s v%" PRIu64 ": %s", f->component,
                     f->version, strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    uint64_t size = (uint64_t)st.st_size;
    serve(b, from, id, f->component, f->version, fd, size, f->offset, max);
    close(fd);
}

bool brk_upload_held(brk_t *b, const char *comp, uint64_t v, const char *sha256, char *why, size_t len) {
    if (brk_upload_stored(b, comp, v, sha256, why, len)) return true;
    char sha[65];
    lower(sha256, sha);
    slot_t *s = b->uploads ? slot_of(b, comp, v) : NULL;
    if (s && strcmp(s->sha256, sha) != 0) {
        snprintf(why, len, "%s v%" PRIu64 " is being uploaded with other weights (sha256 %.16s...)", comp, v,
                 s->sha256);
        return false;
    }
    return s != NULL;
}

/* ---- uploads nobody finishes ------------------------------------------------------ */

void brk_upload_timers(brk_t *b, int64_t now) {
    if (!b->uploads) return;
    for (int i = 0; i < BRK_UPLOADS_MAX; i++) {
        slot_t *s = &b->uploads->s[i];
        if (!s->open || now - s->touched_ms < BRK_UPLOAD_IDLE_MS) continue;
        brk_log("upload %s v%" PRIu64 " given up: no chunk in %d s (%" PRIu64 " of %" PRIu64 " bytes came)",
                s->component, s->version, BRK_UPLOAD_IDLE_MS / 1000, s->received, s->size);
        close_slot(b, s, true);
    }
}

/* ---- retention -------------------------------------------------------------------- */

static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
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
    spare_path(dir, n, path, sizeof path);
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
        spare_path(dir, drop.n, old, sizeof old);
        unlink(old);
    }
    return true;
}

/* Removes the files of comp's uploaded versions older than current but
 * for the keep - 1 newest, under dir. The data first, then the digest: a
 * removal cut short (the broker killed) leaves a digest, which the next
 * one finds and finishes; the version is not served meanwhile (FETCH:
 * cannot open). A removed data file is kept as a spare (recycle). */
static void prune_dir(struct brk_uploads *u, const char *dir, int keep, const char *comp, uint64_t current) {
    DIR *d = opendir(dir);
    if (!d) return;
    uint64_t *older = NULL;
    size_t n = 0, cap = 0, plen = strlen(comp);
    for (struct dirent *e; (e = readdir(d));) {
        /* COMP-vN.sha256: a stored version (its .safetensors beside it) */
        const char *s = e->d_name;
        size_t len = strlen(s);
        if (len < plen + 10 || strncmp(s, comp, plen) || strncmp(s + plen, "-v", 2) ||
            strcmp(s + len - 7, ".sha256"))
            continue;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s + plen + 2, &end, 10);
        if (errno || end != s + len - 7 || v == 0 || v >= current) continue;
        if (n == cap) {
            uint64_t *g = realloc(older, (cap = cap ? 2 * cap : 16) * sizeof *older);
            if (!g) break;
            older = g;
        }
        older[n++] = v;
    }
    closedir(d);
    if (n) qsort(older, n, sizeof *older, cmp_desc);
    /* the current one counts as one of the `keep` */
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

static void *prune_main(void *arg) {
    struct brk_uploads *u = arg;
    pthread_mutex_lock(&u->mu);
    while (u->nq > 0) {
        prune_t p = u->q[0];
        memmove(u->q, u->q + 1, (size_t)(u->nq - 1) * sizeof *u->q);
        u->nq--;
        pthread_mutex_unlock(&u->mu);
        prune_dir(u, u->dir, u->keep, p.component, p.current);
        pthread_mutex_lock(&u->mu);
    }
    u->running = false;
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

void brk_upload_prune(brk_t *b, const char *comp, uint64_t current) {
    int keep = b->opt.weights_keep;
    if (!b->opt.weights_dir || keep <= 0) return;
    struct brk_uploads *u = b->uploads;
    if (!u || !u->dir) { /* no thread to hand it to (out of memory at start) */
        prune_dir(NULL, b->opt.weights_dir, keep, comp, current);
        return;
    }
    pthread_mutex_lock(&u->mu);
    int i = 0;
    while (i < u->nq && strcmp(u->q[i].component, comp)) i++;
    if (i == u->nq && u->nq < PRUNES_MAX) {
        snprintf(u->q[i].component, sizeof u->q[i].component, "%s", comp);
        u->q[i].current = current;
        u->nq++;
    }
    if (i < u->nq && current > u->q[i].current) u->q[i].current = current; /* the newest asked wins */
    bool inline_run = false;
    if (!u->running && u->nq > 0) {
        if (u->started) pthread_join(u->th, NULL); /* done with its queue: it only returns now */
        /* Without SIGINT/SIGTERM, as every thread but the routing one:
         * the stop signal must interrupt the routing thread's poll. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        u->started = u->running = pthread_create(&u->th, NULL, prune_main, u) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        inline_run = !u->started;
    }
    pthread_mutex_unlock(&u->mu);
    if (inline_run) prune_main(u); /* no thread: here, as before */
}

/* ---- lifecycle ----------------------------------------------------------------------- */

void brk_upload_start(brk_t *b) {
    if (!b->opt.weights_dir) return;
    if (!(b->uploads = calloc(1, sizeof *b->uploads))) {
        brk_log("out of memory: uploads refused");
        return;
    }
    for (int i = 0; i < BRK_UPLOADS_MAX; i++) b->uploads->s[i].fd = -1;
    pthread_mutex_init(&b->uploads->mu, NULL);
    b->uploads->dir = strdup(b->opt.weights_dir); /* NULL: removals run inline */
    b->uploads->keep = b->opt.weights_keep;
    DIR *d = opendir(b->opt.weights_dir);
    if (!d) {
        brk_log("--weights-dir %s: %s (uploads will fail until it exists)", b->opt.weights_dir, strerror(errno));
        return;
    }
    struct brk_uploads *u = b->uploads;
    spare_t found[64];
    int nfound = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", b->opt.weights_dir, e->d_name);
        if (!strncmp(e->d_name, ".spare-", 7)) {
            /* a previous run's spares: the newest SPARES_MAX kept for the next uploads */
            struct stat st;
            unsigned sn = 0;
            const char *why = spare_name(e->d_name + 7, &sn);
            if (!why && (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1))
                why = "not a file of its own";
            if (!why && nfound == (int)(sizeof found / sizeof found[0])) {
                /* full: the newest are kept, so the oldest of them or this one goes */
                int old = 0;
                for (int i = 1; i < nfound; i++)
                    if (found[i].n < found[old].n) old = i;
                if (sn > found[old].n) {
                    char gone[1024];
                    spare_path(b->opt.weights_dir, found[old].n, gone, sizeof gone);
                    if (unlink(gone) == 0) brk_log("removed %s: a spare past the %d kept", gone, SPARES_MAX);
                    found[old] = (spare_t){ .n = sn, .size = (uint64_t)st.st_size };
                    continue;
                }
                why = "a spare past those kept";
            }
            if (!why) {
                found[nfound++] = (spare_t){ .n = sn, .size = (uint64_t)st.st_size };
                continue;
            }
            if (unlink(path) == 0) brk_log("removed %s: %s", path, why);
            else brk_log("%s is in the way of the spares (%s): remove it", path, why);
            continue;
        }
        if (e->d_name[0] != '.' || n < 6 || strcmp(e->d_name + n - 5, ".part")) continue;
        if (unlink(path) == 0) brk_log("removed %s: an upload a previous run did not finish", path);
    }
    closedir(d);
    /* oldest first (numbers grow); past SPARES_MAX the oldest go */
    qsort(found, (size_t)nfound, sizeof *found, cmp_spare);
    for (int i = 0; i < nfound; i++) {
        if (found[i].n >= u->spare_seq) u->spare_seq = found[i].n + 1;
        if (u->dir && i >= nfound - SPARES_MAX) {
            u->spare[u->nspare++] = found[i];
            continue;
        }
        char path[1024];
        spare_path(b->opt.weights_dir, found[i].n, path, sizeof path);
        if (unlink(path) == 0) brk_log("removed %s: a spare past the %d kept", path, SPARES_MAX);
    }
}

void brk_upload_stop(brk_t *b) {
    if (!b->uploads) return;
    for (int i = 0; i < BRK_UPLOADS_MAX; i++) close_slot(b, &b->uploads->s[i], true);
    /* removals asked for finish first (the queue is a few entries) */
    pthread_mutex_lock(&b->uploads->mu);
    bool started = b->uploads->started;
    pthread_mutex_unlock(&b->uploads->mu);
    if (started) pthread_join(b->uploads->th, NULL);
    pthread_mutex_destroy(&b->uploads->mu);
    free(b->uploads->dir);
    free(b->uploads);
    b->uploads = NULL;
}

/* ---- invariants ---------------------------------------------------------------------- */

#define BROKEN(...)                      \
    do {                                 \
        snprintf(why, len, __VA_ARGS__); \
        return -1;                       \
    } while (0)

static int check_slot(const slot_t *s, int i, char *why, size_t len) {
    if (!s->open) {
        if (s->fd != -1 || s->h || s->parked || s->n_parked || s->cap_parked || s->received || s->stalled[0])
            BROKEN("upload slot %d is closed but holds state", i);
        return 0;
    }
    const char *c = s->component;
    unsigned long long v = (unsigned long long)s->version;
    if (s->fd < 0 || !s->h) BROKEN("upload %s v%llu is open without its file or hasher", c, v);
    if (s->received > s->size)
        BROKEN("upload %s v%llu received %llu of %llu bytes", c, v, (unsigned long long)s->received,
               (unsigned long long)s->size);
    if (!s->recycled && s->spare_size) BROKEN("upload %s v%llu: a new file with a spare's size", c, v);
    /* what was counted is on disk: the .part is at least that long */
    struct stat st;
    if (fstat(s->fd, &st) == 0 && (uint64_t)st.st_size < s->received)
        BROKEN("upload %s v%llu counts %llu bytes, its file holds %lld", c, v, (unsigned long long)s->received,
               (long long)st.st_size);
    if (strlen(s->sha256) != 64) BROKEN("upload %s v%llu has no sha256", c, v);
    if (s->n_parked < 0 || s->n_parked > s->cap_parked || s->cap_parked > BRK_FETCH_PARKED_MAX ||
        (s->cap_parked && !s->parked))
        BROKEN("upload %s v%llu: %d parked FETCHes in room for %d", c, v, s->n_parked, s->cap_parked);
    for (int k = 0; k < s->n_parked; k++) {
        const parked_t *p = &s->parked[k];
        if (p->who_len == 0 || p->who_len > sizeof p->who)
            BROKEN("upload %s v%llu: parked FETCH %d has a %zu-byte identity", c, v, k, p->who_len);
        /* one whose bytes came is answered at once (serve_parked) */
        if (ready(s, p->offset, p->max))
            BROKEN("upload %s v%llu: a FETCH at %llu waits for bytes that came", c, v, (unsigned long long)p->offset);
    }
    if (s->stalled[0] && s->n_parked)
        BROKEN("upload %s v%llu stalled with %d FETCHes still waiting", c, v, s->n_parked);
    int queued;
    pthread_mutex_lock((pthread_mutex_t *)&s->h->mu);
    queued = s->h->n;
    pthread_mutex_unlock((pthread_mutex_t *)&s->h->mu);
    if (queued < 0 || queued > HASH_QUEUE) BROKEN("upload %s v%llu: %d chunks queued to hash", c, v, queued);
    return 0;
}

int brk_upload_check(const brk_t *b, char *why, size_t len) {
    const struct brk_uploads *u = b->uploads;
    if (!u) return 0;
    for (int i = 0; i < BRK_UPLOADS_MAX; i++) {
        if (check_slot(&u->s[i], i, why, len)) return -1;
        for (int j = 0; j < i && u->s[i].open; j++)
            if (u->s[j].open && u->s[j].version == u->s[i].version && !strcmp(u->s[j].component, u->s[i].component))
                BROKEN("two upload slots hold %s v%llu", u->s[i].component, (unsigned long long)u->s[i].version);
    }
    pthread_mutex_lock((pthread_mutex_t *)&u->mu);
    int nspare = u->nspare, nq = u->nq;
    pthread_mutex_unlock((pthread_mutex_t *)&u->mu);
    if (nspare < 0 || nspare > SPARES_MAX) BROKEN("%d spares kept (at most %d)", nspare, SPARES_MAX);
    if (nq < 0 || nq > PRUNES_MAX) BROKEN("%d removals queued (at most %d)", nq, PRUNES_MAX);
    return 0;
}
