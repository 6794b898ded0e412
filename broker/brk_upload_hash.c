/* brk_upload_hash.c -- an upload's sha256, taken on a thread of its own
 * (brk_upload_int.h, hasher_t): the routing thread queues each chunk's
 * frame, shared with ZeroMQ, and waits only when HASH_QUEUE chunks wait
 * already. Without a thread (it could not start, or
 * brk_upload_no_hash_thread) the chunks are hashed inline. */
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_log.h"
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

hasher_t *brk_upl_hasher_new(void) {
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

void brk_upl_hasher_push(hasher_t *hs, const zmq_msg_t *frame, const void *p, size_t n) {
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

void brk_upl_hasher_end(hasher_t **hp, char hex[65]) {
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
