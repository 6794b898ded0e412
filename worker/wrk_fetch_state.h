/* wrk_fetch_state.h -- a fetch in progress (wrk_fetch.c) and its
 * invariants, for wrk_fetch.c and tests/test_worker_invariants.c. */
#ifndef REEL_WORKER_WRK_FETCH_STATE_H
#define REEL_WORKER_WRK_FETCH_STATE_H

#include <stdbool.h>
#include <stdint.h>
#include "worker/wrk_check.h"
#include "worker/wrk_fetch.h"

/* The FETCH requests: WRK_FETCH_WINDOW slots of MSG_CHUNK_MAX bytes asked
 * ahead of what came. */
typedef struct {
    void *sock;
    const msg_sync_t *m;
    uint64_t next_id;
    uint64_t asked;              /* the offset the next FETCH asks for */
    uint64_t size;               /* the file's, from the first answer; UINT64_MAX before */
    unsigned reasked;            /* times the broker's silence made it ask again */
    unsigned dropped;            /* answers dropped: not the chunk needed next */
} wrk_fetch_t;

/* The file in memory as it arrives: its length field, its header and its
 * data, each allocated once the length field is in. */
typedef struct {
    unsigned char len8[8];
    char *hdr;
    unsigned char *data;
    size_t cap;                  /* data's size */
    uint64_t hlen, dlen;
    uint64_t max_data;           /* the model's data bytes; 0: no limit */
    wrk_fetch_buf_t *spare;
} wrk_fetch_mem_t;

/* Between answers, `done` bytes in: no more than the file; the next ask
 * neither behind what came nor more than the window's slots ahead; the
 * buffers exist exactly once the header's length came, header and data
 * adding up to the file, the data buffer big enough. 0, or -1 with
 * reel_err_text() naming the first that does not hold. Checked at every
 * answer with -DREEL_INVARIANTS. */
int wrk_fetch_invariants(const wrk_fetch_t *f, const wrk_fetch_mem_t *m, uint64_t done);

#endif
