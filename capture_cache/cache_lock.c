/* cache_lock.c -- the capture cache's locks that know their owner
 * (cache_impl.h): the thread id they record and what a violation prints. */
#include "cache_impl.h"
#include "base/error.h"
#include <stdio.h>
#include <stdlib.h>

void cap_lock_violation(const char *what, const char *file, int line) {
    fprintf(stderr, "capture cache lock check failed: %s (%s:%d)\n", what, file, line);
    abort();
}

int cap_lock_init(cap_lock_t *l, bool recursive) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    if (recursive) pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    int rc = pthread_mutex_init(&l->mu, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) return reel_fail(REEL_E_IO, "cannot create a lock");
#ifdef CAP_LOCK_CHECKS
    atomic_init(&l->owner, 0);
    l->depth = 0;
#endif
    return 0;
}

void cap_lock_destroy(cap_lock_t *l) {
#ifdef CAP_LOCK_CHECKS
    if (atomic_load_explicit(&l->owner, memory_order_relaxed) != 0)
        cap_lock_violation("destroyed while held", __FILE__, __LINE__);
#endif
    pthread_mutex_destroy(&l->mu);
}
