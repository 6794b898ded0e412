/* brk_upload.c -- weights by value (see brk_upload.h): the module's core,
 * its state made and freed, idle uploads given up, and its invariants.
 * The phases live beside it (brk_upload_int.h lists the files): UPLOAD in
 * brk_upload_recv.c, FETCH in brk_upload_serve.c, removals and spares in
 * brk_upload_prune.c. */
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "broker/brk_log.h"

/* ---- lifecycle ----------------------------------------------------------------------- */

void brk_upload_start(brk_t *b) {
    if (!b->opt.weights_dir) return;
    if (!(b->uploads = calloc(1, sizeof *b->uploads))) {
        brk_log("out of memory: uploads refused");
        return;
    }
    for (int i = 0; i < BRK_UPLOADS_MAX; i++) b->uploads->s[i].fd = -1;
    pthread_mutex_init(&b->uploads->mu, NULL);
    pthread_cond_init(&b->uploads->done, NULL);
    b->uploads->dir = strdup(b->opt.weights_dir); /* NULL: removals run inline */
    b->uploads->keep = b->opt.weights_keep;
    brk_upl_scan_dir(b);
    brk_upl_prune_start(b); /* after the scan: the spares it found are in place */
}

void brk_upload_stop(brk_t *b) {
    if (!b->uploads) return;
    for (int i = 0; i < BRK_UPLOADS_MAX; i++) brk_upl_close_slot(b, &b->uploads->s[i], true);
    /* the hashing threads are stopped with their slots; the removals
     * asked for finish before the state they touch goes (the queue is a
     * few entries) */
    brk_upl_prune_stop(b);
    pthread_cond_destroy(&b->uploads->done);
    pthread_mutex_destroy(&b->uploads->mu);
    free(b->uploads->dir);
    free(b->uploads);
    b->uploads = NULL;
}

/* ---- uploads nobody finishes ------------------------------------------------------ */

void brk_upload_timers(brk_t *b, int64_t now) {
    if (!b->uploads) return;
    for (int i = 0; i < BRK_UPLOADS_MAX; i++) {
        slot_t *s = &b->uploads->s[i];
        if (!s->open || now - s->touched_ms < BRK_UPLOAD_IDLE_MS) continue;
        brk_log_kind(&b->request_log, BRK_UPLOAD_LINES,
                     "upload %s v%" PRIu64 " given up: no chunk in %d s (%" PRIu64 " of %" PRIu64 " bytes came)",
                     s->component, s->version, BRK_UPLOAD_IDLE_MS / 1000, s->received, s->size);
        brk_upl_close_slot(b, s, true);
    }
}

/* ---- invariants ---------------------------------------------------------------------- */

#define BROKEN(...) return reel_fail(REEL_E_INTERNAL, __VA_ARGS__)

/* The FETCHes parked on open slot s: each with an identity, none whose
 * bytes came (one whose bytes came is answered at once), none while the
 * upload stalls. */
static int check_parked(const slot_t *s) {
    const char *c = s->component;
    unsigned long long v = (unsigned long long)s->version;
    if (s->n_parked < 0 || s->n_parked > s->cap_parked || s->cap_parked > BRK_FETCH_PARKED_MAX ||
        (s->cap_parked && !s->parked))
        BROKEN("upload %s v%llu: %d parked FETCHes in room for %d", c, v, s->n_parked, s->cap_parked);
    for (int k = 0; k < s->n_parked; k++) {
        const parked_t *p = &s->parked[k];
        if (p->who_len == 0 || p->who_len > sizeof p->who)
            BROKEN("upload %s v%llu: parked FETCH %d has a %zu-byte identity", c, v, k, p->who_len);
        if (brk_upl_ready(s, p->offset, p->max))
            BROKEN("upload %s v%llu: a FETCH at %llu waits for bytes that came", c, v, (unsigned long long)p->offset);
    }
    if (s->stalled[0] && s->n_parked)
        BROKEN("upload %s v%llu stalled with %d FETCHes still waiting", c, v, s->n_parked);
    return 0;
}

static int check_slot(const slot_t *s, int i) {
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
    if (check_parked(s)) return -1;
    /* The bound's count is at most HASH_QUEUE waiting behind the chunk
     * being hashed, and never more than the thread holds: a count the
     * thread will not lower would leave the routing thread waiting for
     * room. (The backlog is read first: only the routing thread posts, and a run
     * lowers `pending` before the thread lowers its backlog, so the
     * second read can only be lower.) */
    hasher_t *h = s->h;
    size_t backlog = h->th ? reel_thread_backlog(h->th) : 0;
    pthread_mutex_lock(&h->mu);
    int pending = h->pending;
    pthread_mutex_unlock(&h->mu);
    if (pending < 0 || pending > HASH_QUEUE + 1)
        BROKEN("upload %s v%llu: %d chunks pending to hash (at most %d)", c, v, pending, HASH_QUEUE + 1);
    if ((size_t)pending > backlog)
        BROKEN("upload %s v%llu counts %d chunks pending to hash, its thread holds %zu", c, v, pending, backlog);
    return 0;
}

int brk_upload_check(const brk_t *b) {
    const struct brk_uploads *u = b->uploads;
    if (!u) return 0;
    for (int i = 0; i < BRK_UPLOADS_MAX; i++) {
        if (check_slot(&u->s[i], i)) return -1;
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
