/* thread.h -- one worker thread and its queue: start, post, pause, resume,
 * stop. The thread takes posted items one at a time, in the order they were
 * posted, and hands each to `run`; between items it may do work of its own
 * (`idle`), and it sleeps on a condition variable when there is nothing to
 * do: no polling, no sleeps.
 *
 * Threads share nothing mutable but the queue: a poster hands an item over
 * and does not touch it again; the thread's own state lives in `user` and
 * is the thread's alone (a pause is how another thread may look at it: the
 * thread is then between items and stays there until resumed).
 *
 * Every function may be called from any thread but the worker thread
 * itself, except reel_thread_post, reel_thread_post_quiet, reel_thread_wake,
 * reel_thread_stopping and reel_thread_backlog, which it may call too. */
#ifndef REEL_BASE_THREAD_H
#define REEL_BASE_THREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct reel_thread reel_thread_t;

typedef struct {
    const char *name;            /* for messages; copied (the first 15 bytes name the OS thread) */
    void *user;                  /* passed to every callback */
    /* Takes one item, on the thread, in posting order; the item is run's
     * from then on (free it there). Required. */
    void (*run)(void *user, void *item);
    /* Work of the thread's own, done when no item waits (after the items
     * posted so far). Returns how long to wait for the next item before it
     * is called again: 0 at once, > 0 at most that many milliseconds, < 0
     * until an item is posted or reel_thread_wake. NULL: the thread only
     * runs items. Called once when the thread starts. */
    int64_t (*idle)(void *user);
    /* Frees an item that will never run (a stop that discards, a post
     * that fails). NULL: items need no freeing. */
    void (*discard)(void *user, void *item);
    /* On the thread, first and last thing (NULL: nothing): per-thread
     * setup, and what must be undone on the thread itself. */
    void (*enter)(void *user);
    void (*leave)(void *user);
    bool block_signals;          /* SIGINT and SIGTERM blocked on the thread (they are the main thread's) */
} reel_thread_opts_t;

/* What reel_thread_stop does with the items still queued. */
typedef enum {
    REEL_THREAD_DRAIN,           /* runs every queued item, then stops */
    REEL_THREAD_DISCARD,         /* stops after the item (or idle call) in progress; queued ones go to discard */
} reel_thread_stop_t;

/* Starts the thread (opts is copied). NULL with an error value (base/error.h)
 * when the thread or its lock cannot be made (nothing is left running). */
reel_thread_t *reel_thread_start(const reel_thread_opts_t *opts);

/* Queues item for the thread and wakes it. Takes ownership of item
 * whatever it returns: 0 when queued; -1 with a message when out of
 * memory or the thread is stopping, item then handed to discard on the
 * calling thread. */
int reel_thread_post(reel_thread_t *t, void *item);

/* As reel_thread_post, but the thread is not woken: the item waits for
 * its next wake (a post, reel_thread_wake, a resume, a stop, or the end of
 * the wait idle asked for). For posters that batch, so that a sleeping
 * thread is woken once per batch rather than once per item; the poster
 * sees to it that a wake comes. Same ownership and failures. */
int reel_thread_post_quiet(reel_thread_t *t, void *item);

/* Makes the thread call idle again soon, however long idle asked to wait
 * (the state idle looks at changed). Can't fail. */
void reel_thread_wake(reel_thread_t *t);

/* Waits until the thread is between items (not inside run or idle) and
 * holds it there until the matching reel_thread_resume; posts still queue.
 * Pauses nest (each needs its resume). Can't fail; never from the thread
 * itself (assert). */
void reel_thread_pause(reel_thread_t *t);
/* Ends one pause; the thread goes on when none is left. Can't fail. */
void reel_thread_resume(reel_thread_t *t);

/* Calls fn(arg, item) on each queued item, oldest first; only while the
 * thread is paused (assert), so what it sees holds still: for checks and
 * reports; fn must not call this thread's functions. Can't fail. */
void reel_thread_each(reel_thread_t *t, void (*fn)(void *arg, void *item), void *arg);

/* True once reel_thread_stop was called: a long run or idle may end early. */
bool reel_thread_stopping(reel_thread_t *t);

/* Items posted whose run has not returned yet (queued, and the one in
 * progress). */
size_t reel_thread_backlog(reel_thread_t *t);

/* Stops the thread as `how` says, joins it and frees it; sets *t NULL.
 * NULL-safe; never from the thread itself, nor while it is paused
 * (assert). Can't fail. */
void reel_thread_stop(reel_thread_t **t, reel_thread_stop_t how);

/* Who holds a lock, so that "the caller holds the lock" is a check rather
 * than a comment: reel_owner_set right after taking the lock (a mutex, the
 * write side of a rwlock), reel_owner_clear right before releasing it, and
 * assert(reel_owner_mine(&o)) where the caller must hold it. Each costs
 * one relaxed atomic. */
typedef struct {
    _Atomic uintptr_t id;        /* the holder's reel_thread_self(); 0: nobody */
} reel_owner_t;

/* A number that names the calling thread, never 0. */
uintptr_t reel_thread_self(void);
void reel_owner_set(reel_owner_t *o);
void reel_owner_clear(reel_owner_t *o);
bool reel_owner_mine(const reel_owner_t *o);

#endif
