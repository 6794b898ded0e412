/* artifact_lock.c -- the artifact locks that know their owner
 * (artifact_impl.h): the install lock, and what a broken lock promise
 * prints before it aborts. A set's own mutex is inline in the header. */
#include "artifact_impl.h"
#include <stdio.h>
#include <stdlib.h>

/* Serialises install and uninstall; the installed set itself is the
 * dispatcher's (artifact_run.c). */
static pthread_mutex_t install_mu = PTHREAD_MUTEX_INITIALIZER;
static reel_owner_t install_owner;

void art_lock_violation(const char *what, const char *file, int line) {
    fprintf(stderr, "artifact lock check failed: %s (%s:%d)\n", what, file, line);
    abort();
}

void art_install_lock(void) {
    pthread_mutex_lock(&install_mu);
#ifdef ART_LOCK_CHECKS
    reel_owner_set(&install_owner);
#endif
}

void art_install_unlock(void) {
#ifdef ART_LOCK_CHECKS
    ART_CHECK(reel_owner_mine(&install_owner), "the install lock unlocked by a thread that does not hold it");
    reel_owner_clear(&install_owner);
#endif
    pthread_mutex_unlock(&install_mu);
}

bool art_install_lock_mine(void) { return reel_owner_mine(&install_owner); }
