/* brk_upload_hash.c -- an upload's sha256, taken on a thread of its own
 * (brk_upload_int.h, hasher_t): a base/thread.h worker per upload. The
 * routing thread posts each chunk's frame, shared with ZeroMQ, and waits
 * only when HASH_QUEUE chunks wait already behind the one being hashed;
 * `run` hashes one and makes room. Ending an upload stops the thread:
 * draining (every chunk hashed, then the digest) or discarding (the
 * upload failed: what still waits is dropped). Without a thread (it could
 * not start, or brk_upload_no_hash_thread) the chunks are hashed inline. */
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/sha256.h"
#include "broker/brk_log.h"

/* One chunk, on the thread: hashed, its frame released, room made. */
static void hash_run(void *user, void *item) {
    hasher_t *hs = user;
    zmq_msg_t *m = item;
    reel_sha256_update(hs->h, zmq_msg_data(m), zmq_msg_size(m));
    zmq_msg_close(m);
    free(m);
    pthread_mutex_lock(&hs->mu);
    hs->pending--;
    pthread_cond_signal(&hs->room); /* one waiter at most: the routing thread */
    pthread_mutex_unlock(&hs->mu);
}

/* A chunk that will not be hashed: a post that failed (the poster uncounts
 * it and hashes the bytes itself) or a discarding stop (the upload failed,
 * its count no longer read). */
static void hash_discard(void *user, void *item) {
    (void)user;
    zmq_msg_close(item);
    free(item);
}

bool brk_upload_no_hash_thread = false;

hasher_t *brk_upl_hasher_new(void) {
    hasher_t *hs = calloc(1, sizeof *hs);
    if (!hs || !(hs->h = reel_sha256_new())) {
        free(hs);
        return NULL;
    }
    pthread_mutex_init(&hs->mu, NULL);
    pthread_cond_init(&hs->room, NULL);
    reel_thread_opts_t o = { .name = "upload-hash",
                             .user = hs,
                             .run = hash_run,
                             .discard = hash_discard,
                             .block_signals = true /* the stop signal is the routing thread's */ };
    if (brk_upload_no_hash_thread) reel_fail(REEL_E_IO, "no thread (brk_upload_no_hash_thread)");
    else hs->th = reel_thread_start(&o);
    if (!hs->th) brk_log("cannot start an upload's hashing thread (%s): it hashes on the routing thread", reel_err_text());
    return hs;
}

/* Hashes the n bytes at p here, after every chunk posted before them.
 * The thread is idle then (nothing pending, its last run past mu), so
 * the hash is the routing thread's for the while: mu orders it between
 * the thread's runs. */
static void hash_here(hasher_t *hs, const void *p, size_t n) {
    pthread_mutex_lock(&hs->mu);
    while (hs->pending > 0) pthread_cond_wait(&hs->room, &hs->mu);
    reel_sha256_update(hs->h, p, n);
    pthread_mutex_unlock(&hs->mu);
}

void brk_upl_hasher_push(hasher_t *hs, const zmq_msg_t *frame, const void *p, size_t n) {
    if (!hs->th) {
        reel_sha256_update(hs->h, p, n);
        return;
    }
    zmq_msg_t *c = malloc(sizeof *c);
    bool shared = c && frame && zmq_msg_init(c) == 0 && zmq_msg_copy(c, (zmq_msg_t *)frame) == 0;
    if (!c || (!shared && zmq_msg_init_size(c, n) != 0)) { /* out of memory: hashed here, in its turn */
        free(c);
        hash_here(hs, p, n);
        return;
    }
    if (!shared && n) memcpy(zmq_msg_data(c), p, n);
    pthread_mutex_lock(&hs->mu);
    while (hs->pending > HASH_QUEUE) pthread_cond_wait(&hs->room, &hs->mu);
    hs->pending++;
    pthread_mutex_unlock(&hs->mu);
    if (reel_thread_post(hs->th, c) != 0) { /* out of memory: c discarded, the bytes hashed here */
        pthread_mutex_lock(&hs->mu);
        hs->pending--;
        pthread_mutex_unlock(&hs->mu);
        hash_here(hs, p, n);
    }
}

void brk_upl_hasher_end(hasher_t **hp, char hex[65]) {
    hasher_t *hs = *hp;
    if (!hs) return;
    /* with hex, every chunk posted is hashed first; the join makes the
     * hash ours */
    reel_thread_stop(&hs->th, hex ? REEL_THREAD_DRAIN : REEL_THREAD_DISCARD);
    char drop[65];
    reel_sha256_final(&hs->h, hex ? hex : drop);
    pthread_cond_destroy(&hs->room);
    pthread_mutex_destroy(&hs->mu);
    free(hs);
    *hp = NULL;
}
