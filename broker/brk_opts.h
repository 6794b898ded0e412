/* brk_opts.h -- reel-broker's command line (internal header). */
#ifndef REEL_BROKER_BRK_OPTS_H
#define REEL_BROKER_BRK_OPTS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *clients;          /* client ROUTER endpoint */
    const char *workers;          /* worker ROUTER endpoint */
    const char *catalog;          /* SQLite path; "" = no catalog */
    int heartbeat_ms;             /* HEARTBEAT interval */
    int liveness;                 /* intervals of silence before a worker is dropped */
    int queue_max;                /* waiting requests before BUSY */
    uint64_t sync_deadline_ms;    /* default SYNC barrier deadline */
    uint64_t request_deadline_ms; /* default GEN deadline */
    uint64_t max_held_bytes;      /* tensor bytes of accepted requests held at once */
    uint64_t max_fetch_bytes;     /* bytes of FETCH answers read and not yet sent, all workers */
    const char *keys;             /* allowlist directory (brk_zap.h); NULL = no keys */
    const char *key;              /* the broker's own NAME.key; NULL = <keys>/broker.key */
    bool insecure;                /* no keys on a non-local endpoint, knowingly */
    const char *weights_dir;      /* where uploaded weights are kept; NULL = uploads refused */
    const char *metrics;          /* ADDR:PORT of /metrics, /healthz, /readyz; NULL = off */
    int weights_keep;             /* uploaded versions kept: the current and N-1 older (0 = all) */
    double catalog_retain_days;   /* raw catalog rows older than this are pruned; 0 = kept */
    int64_t catalog_max_rows;     /* raw rows kept per catalog table; 0 = no cap */
    int64_t catalog_queue;        /* records waiting for the catalog writer before BUSY (events: a quarter per worker) */
    const char *peer;             /* the other broker's client endpoint (a standby pair); NULL = alone */
    bool primary;                 /* --role primary (true) or backup */
    bool role_given;
    uint64_t peer_timeout_ms;     /* peer silence before a client may make this one active; 0 = heartbeat x liveness */
} brk_opts_t;

/* Parses argv into *o (defaults first). Returns 0 to run; 1 when -h was
 * asked (the caller prints brk_usage()); -1 with a REEL_E_INVALID error
 * (base/error.h), one line for after "reel-broker: ", on an unknown
 * flag, a missing or bad value or a stray argument (these end in
 * "(try -h)"), on options that exclude or need each other, and when an
 * endpoint other than loopback or ipc would be served without keys and
 * without --insecure. Prints nothing; keeps pointers into argv. */
int brk_opts_parse(brk_opts_t *o, int argc, char **argv);

/* The text of -h, ending in a newline. Can't fail; static storage. */
const char *brk_usage(void);

/* True when endpoint reaches this host only: ipc://, inproc://, or tcp://
 * on 127.0.0.0/8, [::1] or localhost. Can't fail. */
bool brk_endpoint_local(const char *endpoint);

#endif
