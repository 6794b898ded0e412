/* brk_opts.h -- reel-broker's command line (internal header). */
#ifndef REEL_BROKER_BRK_OPTS_H
#define REEL_BROKER_BRK_OPTS_H

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
} brk_opts_t;

/* Parses argv into *o (defaults first). Returns 0 to run; 1 when -h was
 * asked (usage printed to stdout: exit 0); 2 on an unknown flag, a missing
 * or bad value or a stray argument (message on stderr: exit 2). */
int brk_opts_parse(brk_opts_t *o, int argc, char **argv);

#endif
