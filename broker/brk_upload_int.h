/* brk_upload_int.h -- the upload module's state and its files' shared
 * functions (internal to broker/brk_upload*.c and
 * tests/test_broker_invariants.c): the slots of uploads in progress, the
 * FETCHes parked on them, their hashing threads, the spares and the
 * removals queued. The module's interface is brk_upload.h.
 *
 * The module's files, each calling only those listed after it (no call
 * cycle between them):
 *   brk_upload.c        create/destroy, idle uploads given up, invariants
 *   brk_upload_recv.c   UPLOAD: a slot opened or resumed, the chunk
 *                       written, the upload finished and published
 *   brk_upload_hash.c   an upload's sha256, on a thread of its own
 *   brk_upload_serve.c  FETCH: served from a stored file or an upload in
 *                       progress, parked until its bytes come
 *   brk_upload_prune.c  --weights-keep removals on their thread, the
 *                       spares, the weights dir found at startup
 *   brk_upload_files.c  the weights dir's names, the slot of a version,
 *                       stored and held versions */
#ifndef REEL_BROKER_BRK_UPLOAD_INT_H
#define REEL_BROKER_BRK_UPLOAD_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

#include "base/sha256.h"
#include "base/thread.h"
#include "broker/brk_upload.h"

/* A FETCH of bytes an upload in progress has not brought yet: answered
 * when they come (or with ERROR when the upload fails). */
typedef struct {
    unsigned char who[256];    /* the asking connection's routing id */
    size_t who_len;
    uint64_t id, offset, max;
} parked_t;

/* An upload's sha256, taken on a thread of its own (base/thread.h):
 * hashing is most of what an upload costs the routing thread (SHA-256
 * runs at 1.6 GB/s a core with SHA-NI, about as fast as loopback moves
 * the bytes), and on a machine with a core to spare the routing thread
 * then only writes and forwards. Each chunk is posted as its frame,
 * shared with ZeroMQ (no copy), and hashed in posting order; at most
 * HASH_QUEUE wait behind the one being hashed (the routing thread waits
 * for room beyond: the thread's queue has no bound of its own, so the
 * bound is `pending`, under mu, and `room` its condition). */
#define HASH_QUEUE 4

typedef struct {
    reel_thread_t *th;           /* NULL: no thread (it could not start, or brk_upload_no_hash_thread): inline */
    pthread_mutex_t mu;
    pthread_cond_t room;         /* to the routing thread: a chunk hashed */
    int pending;                 /* under mu: chunks posted whose hashing has not ended (<= HASH_QUEUE + 1) */
    reel_sha256_t *h;            /* the thread's until it is stopped (inline: the routing thread's) */
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
    uint64_t base; /* the current adapter's base (0: none): kept, and not one of the `keep` */
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
    /* The removals run on a thread of their own (base/thread.h), one at
     * a time: freeing a big file's blocks takes a while (1 GB: 0.4 s on
     * this project's VMs; a wan2.1-1.3b file is 5.7 GB), which the
     * routing thread must not wait for. It has no items: its `idle` takes
     * the next removal off q, and a removal queued wakes it. */
    reel_thread_t *th;           /* NULL: none (--weights-keep 0), or removals inline (no thread, no copy of the dir) */
    pthread_mutex_t mu;
    pthread_cond_t done;         /* to brk_upl_prunes_wait: a removal ended with none left */
    prune_t q[PRUNES_MAX];       /* under mu: asked, not yet begun (one per component) */
    int nq;
    bool removing;               /* under mu: one taken off q and under way */
    char *dir;                   /* --weights-dir, the thread's copy */
    int keep;
    spare_t spare[SPARES_MAX];   /* under mu; oldest first */
    int nspare;
    unsigned spare_seq;          /* the next .spare-N */
};

/* ---- brk_upload_recv.c ---- */

/* Closes slot s (nothing when closed): its parked FETCHes answered ERROR,
 * its file closed, its hashing thread stopped; with remove_part its .part
 * removed. Can't fail. */
void brk_upl_close_slot(brk_t *b, slot_t *s, bool remove_part);

/* ---- brk_upload_hash.c ---- */

/* NULL when out of memory. Without a thread (it could not start, or
 * brk_upload_no_hash_thread) it hashes inline. */
hasher_t *brk_upl_hasher_new(void);
/* Queues the n bytes at p, which are frame's (NULL: no frame to share, so
 * a copy is queued), to be hashed after those queued before. Out of
 * memory: hashed here, in its turn. Can't fail. */
void brk_upl_hasher_push(hasher_t *hs, const zmq_msg_t *frame, const void *p, size_t n);
/* Stops the thread: with hex, after every chunk queued is hashed, the
 * digest into hex; without, the chunks still queued are dropped. Frees
 * *hp and sets it NULL. NULL-safe. */
void brk_upl_hasher_end(hasher_t **hp, char hex[65]);

/* ---- brk_upload_serve.c ---- */

/* Whether a FETCH of (offset, max) can be answered whole from what the
 * upload in s holds. */
bool brk_upl_ready(const slot_t *s, uint64_t offset, uint64_t max);
/* Answers the parked FETCHes the bytes have come for, in the order they
 * came; those asking for exactly chunk u (in m; NULL: none) with its
 * frame. One it has no memory for waits for the next chunk. */
void brk_upl_serve_parked(brk_t *b, slot_t *s, const msg_upload_t *u, const wire_msg_t *m);
/* Answers every parked FETCH of s ERROR code (bad_request: the upload
 * failed; internal: the broker cannot keep it) with reason, and
 * forgets them. */
void brk_upl_fail_parked(brk_t *b, slot_t *s, const char *code, const char *reason);

/* ---- brk_upload_prune.c ---- */

/* Renames the spare that suits an upload of size bytes to part. True when
 * one was taken; false when none suits or the rename failed. */
bool brk_upl_take_spare(brk_t *b, uint64_t size, const char *part);
/* Removes every spare (a full disk). Returns how many were dropped. */
int brk_upl_drop_spares(brk_t *b);
/* Waits until every removal asked so far is done (what a test checks
 * the dir after). Can't fail. */
void brk_upl_prunes_wait(brk_t *b);
/* Starts the removal thread (brk_upload_start; none with --weights-keep
 * 0; without the dir's copy, or when it cannot start (logged), the
 * removals run inline)
 * and stops it once the removals asked are done (brk_upload_stop). */
void brk_upl_prune_start(brk_t *b);
void brk_upl_prune_stop(brk_t *b);
/* Startup: removes the .part files a previous run left and keeps its
 * newest spares (those past SPARES_MAX, or not a spare's, removed). A
 * weights dir that cannot be read is logged, and left for the uploads to
 * fail on. */
void brk_upl_scan_dir(brk_t *b);

/* ---- brk_upload_files.c ---- */

/* DIR/<prefix>COMPONENT-vVERSION<suffix> into buf (cut to len). */
void brk_upl_path(const brk_t *b, const char *prefix, const char *comp, uint64_t v, const char *suffix, char *buf,
                  size_t len);
/* DIR/.spare-N into buf (cut to len). */
void brk_upl_spare_path(const char *dir, unsigned n, char *buf, size_t len);
/* The 64 hex digits at in, lowercase, into out. */
void brk_upl_lower(const char *in, char out[65]);
/* The open slot of comp's version v, or NULL. b->uploads must be set. */
slot_t *brk_upl_slot(brk_t *b, const char *comp, uint64_t v);

#endif
