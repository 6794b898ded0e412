/* brk_upload_int.h -- the upload module's state (internal to broker/brk_upload*.c
 * and tests/test_broker_invariants.c): the slots of uploads in progress, the
 * FETCHes parked on them, their hashing threads, the spares and the
 * removals queued. The module's interface is brk_upload.h. */
#ifndef REEL_BROKER_BRK_UPLOAD_INT_H
#define REEL_BROKER_BRK_UPLOAD_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

#include "base/sha256.h"
#include "broker/brk_upload.h"

/* A FETCH of bytes an upload in progress has not brought yet: answered
 * when they come (or with ERROR when the upload fails). */
typedef struct {
    unsigned char who[256];    /* the asking connection's routing id */
    size_t who_len;
    uint64_t id, offset, max;
} parked_t;

/* An upload's sha256, taken on a thread of its own: hashing is most of
 * what an upload costs the routing thread (SHA-256 runs at 1.6 GB/s a
 * core with SHA-NI, about as fast as loopback moves the bytes), and on a
 * machine with a core to spare the routing thread then only writes and
 * forwards. The chunks wait in order, shared with ZeroMQ (no copy), at
 * most HASH_QUEUE of them (the routing thread waits for room beyond). */
#define HASH_QUEUE 4

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* a chunk queued, one hashed, or quit */
    zmq_msg_t q[HASH_QUEUE];     /* ring: chunks to hash, oldest at head */
    int head, n;
    bool busy, quit, threaded;   /* hashing one / stop / a thread runs (else inline) */
    pthread_t th;
    reel_sha256_t *h;            /* the thread's until it is joined */
} hasher_t;

typedef struct {
    bool open;
    char component[MSG_NAME_MAX];
    uint64_t version, size, received;
    char sha256[65];           /* lowercase */
    int fd;                    /* the .part file (read too: FETCH while it comes) */
    hasher_t *h;               /* of its bytes so far */
    bool recycled;             /* a spare written over (else a new file) */
    uint64_t spare_size;       /* its length when it was opened: cut to size at the end if longer */
    int64_t touched_ms;
    parked_t *parked;          /* in the order they came; grows to BRK_FETCH_PARKED_MAX */
    int n_parked, cap_parked;
    char stalled[300];         /* why the last chunk could not be kept (a full disk); "" while it goes */
} slot_t;

/* A removal --weights-keep asked for: component's current version. */
typedef struct {
    char component[MSG_NAME_MAX];
    uint64_t current;
} prune_t;

#define PRUNES_MAX 8

/* A removed version's file kept for the next upload to write over: its
 * blocks and page-cache pages are there already, where a new file's must
 * be allocated, faulted in and zeroed (on this project's VMs writing 1.2
 * GB into a new file took 2.2 CPU-s, over an old one 0.12: docs/BENCH.md;
 * PostgreSQL recycles its WAL segments for the same reason). Named
 * DIR/.spare-N; at most SPARES_MAX, the oldest removed for a newer one. */
typedef struct {
    unsigned n;                  /* .spare-N */
    uint64_t size;
} spare_t;

#define SPARES_MAX 2

struct brk_uploads {
    slot_t s[BRK_UPLOADS_MAX];
    /* The removals run on a thread of their own, one at a time: freeing
     * a big file's blocks takes a while (1 GB: 0.4 s on this project's
     * VMs; a wan2.1-1.3b file is 5.7 GB), which the routing thread must
     * not wait for. */
    pthread_mutex_t mu;
    prune_t q[PRUNES_MAX];       /* asked, not yet done (one per component) */
    int nq;
    bool running, started;       /* the thread: runs the queue / was created (join it) */
    pthread_t th;
    char *dir;                   /* --weights-dir, the thread's copy */
    int keep;
    spare_t spare[SPARES_MAX];   /* under mu; oldest first */
    int nspare;
    unsigned spare_seq;          /* the next .spare-N */
};

#endif
