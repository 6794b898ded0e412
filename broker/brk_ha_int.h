/* brk_ha_int.h -- a standby pair's state, shared by brk_ha.c (the rules,
 * PEER, taking over and stepping down) and brk_ha_copy.c (the standby's
 * copies of the active broker's uploaded weights). The module's interface
 * is brk_ha.h. */
#ifndef REEL_BROKER_BRK_HA_INT_H
/* SYNCs a PEER carries: each component's current one and, for an adapter,
 * the full version it is on. */
#define BRK_HA_SYNCS (2 * BRK_MAX_COMPONENTS)
#define REEL_BROKER_BRK_HA_INT_H

#include "broker/brk_ha.h"

#define BRK_HA_COPY_WINDOW 4         /* FETCHes in flight, of MSG_CHUNK_MAX each */
#define BRK_HA_COPY_RESEND_MS 2000   /* no answer this long: the chunk wanted next asked again */
#define BRK_HA_COPY_TIMEOUT_MS 10000 /* no chunk this long: the copy fails (tried again later) */
#define BRK_HA_COPY_RETRY_MS 5000    /* a version whose copy failed waits this long (doubled per failure, to 64x) */

/* The copy of one uploaded version from the active peer, in progress or
 * the last that failed. */
typedef struct {
    bool on;
    bool from_active;                /* a standby's copy (else the active broker's, from its standby) */
    char component[MSG_NAME_MAX];
    uint64_t version;
    char sha256[65];
    uint64_t size;                   /* UINT64_MAX until the first answer */
    uint64_t next, asked;            /* the offset wanted next; FETCHes sent up to here */
    uint64_t first_id;               /* this copy's FETCHes have ids from here on */
    uint64_t next_id;
    int64_t started_ms, progress_ms, asked_ms;
    uint64_t from;                   /* the offset it started at (a resumed copy) */
    char failed_component[MSG_NAME_MAX];
    uint64_t failed_version;         /* the last that failed (0: none), at failed_ms */
    int64_t failed_ms;
    int failures;                    /* of that version in a row */
    int64_t retry_ms;                /* its wait before the next try: BRK_HA_COPY_RETRY_MS doubled per failure */
    bool kept;                       /* a stalled copy's partial upload is open here (resumed by the next try) */
    char kept_component[MSG_NAME_MAX];
    uint64_t kept_version;
    char kept_sha256[65];
    bool no_dir_warned;              /* "no --weights-dir" said */
    uint64_t copied;                 /* versions copied since start */
} brk_ha_copy_t;

#define BRK_HA_REFUSED 256     /* requests a standby remembers answering standby */

struct brk_ha {
    brk_ha_state_t state;
    bool primary;
    uint64_t term;
    void *sock;                  /* DEALER to the peer's client endpoint */
    int64_t timeout_ms;          /* peer silence before a client may make this one active */
    int64_t started_ms, seen_ms; /* seen_ms: the last PEER (0: never) */
    int64_t next_send_ms;
    brk_ha_state_t peer;
    bool peer_primary;
    uint64_t peer_term, peer_boot;
    int64_t role_warned_ms;      /* the last "same --role" warning */
    msg_sync_t *syncs;           /* the peer's current SYNCs, last heard, each after the full
                                  * version it is on when it is a LoRA adapter (BRK_HA_SYNCS) */
    int n_syncs;
    bool silence_logged;         /* "peer silent" said for this silence */
    struct { uint64_t key, conn; int64_t at; } refused[BRK_HA_REFUSED]; /* requests answered standby lately */
    int next_refused;
    brk_ha_copy_t copy;
};


/* brk_ha_copy.c. Each current uploaded version this broker may have to
 * serve and does not store (as the standby, its active peer's; as the
 * active broker, its own, while its standby peer is heard) is fetched
 * from the peer (FETCH on its client socket) and stored as an upload is,
 * so that workers can FETCH it here after a takeover. One at a time;
 * considered at every PEER. */
void brk_ha_copy_consider(brk_t *b, int64_t now);
/* An answer on the DEALER to the peer: FETCH_DATA or ERROR of the copy. */
void brk_ha_copy_answer(brk_t *b, wire_msg_t *m);
/* Asks again after a silence; fails a copy silent past its timeout. */
void brk_ha_copy_timers(brk_t *b, int64_t now);
/* Ends the copy in progress, and removes its partial file and a stalled
 * copy's (taking over: no part may stay to be served): why is logged. */
void brk_ha_copy_stop(brk_t *b, const char *why);

#endif
