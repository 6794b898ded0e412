/* wrk_fetch.h -- weights by value, the worker's side (docs/PROTOCOL.md,
 * "Weights by value"): a SYNC with "uploaded" names a file the trainer
 * sent to the broker; the sync thread fetches it back in FETCH chunks on
 * a DEALER of its own (the main thread's socket is the main thread's),
 * straight into memory (its header, and the data buffer the returned
 * st_file_t owns), hashing it as it comes. The file is judged by the size
 * the broker announces before a byte is kept: more than the model can
 * hold is refused at once. */
#ifndef REEL_WORKER_WRK_FETCH_H
#define REEL_WORKER_WRK_FETCH_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "net/keys.h"
#include "schema/msg.h"
#include "model/safetensors.h"

#define WRK_FETCH_WINDOW 4          /* FETCH requests in flight */
#define WRK_FETCH_TIMEOUT_MS 10000  /* the longest wait for the next chunk, re-asks included */
#define WRK_FETCH_RESEND_MS 2000    /* silence after which the next chunk is asked for again */
#define WRK_FETCH_BUSY_PAUSE_MS 50  /* after an ERROR busy, before the next chunk is asked for again */
#define WRK_E_FETCH "bad_weights: the broker could not send the uploaded file"

/* A data buffer kept from one fetch for the next: fresh memory costs a
 * fault and the zeroing of every page when first written, more than the
 * copy into it (a 100 MB fetch here: 0.2 of its 0.3 CPU seconds), so the
 * sync thread hands the applied file's buffer back here (st_take_data)
 * and the next fetch of a file that fits reuses it. Between syncs its
 * pages are the kernel's to take back under memory pressure
 * (wrk_fetch_spare_release: MADV_FREE); pages it did not take cost
 * nothing to write again. */
typedef struct {
    unsigned char *p;               /* NULL: none kept */
    size_t cap;                     /* its bytes (of p, or of the buffer a fetch handed to its file) */
} wrk_fetch_buf_t;

/* Marks the spare's pages free for the kernel to reclaim when memory is
 * short (their contents are not needed; the mapping stays). */
void wrk_fetch_spare_release(wrk_fetch_buf_t *spare);

/* Where the broker is and how to reach it. */
typedef struct {
    void *zctx;
    const char *endpoint;
    const reel_curve_t *curve;      /* NULL or off: plain */
    wrk_fetch_buf_t *spare;         /* NULL: every fetch allocates */
    unsigned *reasked;              /* NULL, or set to the times the broker's silence made it ask again */
} wrk_fetch_src_t;

/* Fetches version m->version of m->component (sha256 m->sha256) from the
 * broker: a file whose data section (past its header) is at most max_data
 * bytes, as a file read by path is judged (0: no limit; the size the
 * broker announces is judged before a byte is kept, the data section as
 * soon as the header's length came). A broker silent for
 * WRK_FETCH_RESEND_MS is asked again from where the file stopped; one
 * silent for WRK_FETCH_TIMEOUT_MS fails the fetch. Returns it open (st_close it)
 * with hex the sha256 of its bytes, or NULL with the error value's message
 * a generic text for the ack and its detail the reason, for the log
 * (wrk_weights.h): WRK_E_FETCH (REEL_E_IO: no connection, the broker
 * answered an error; REEL_E_TIMEOUT: silent; REEL_E_INVALID: a bad
 * answer), WRK_E_MODEL (REEL_E_UNSUPPORTED: a size no model of this
 * worker's holds), WRK_E_FILE (not a safetensors file), WRK_E_STOPPED
 * (REEL_E_STATE). */
st_file_t *wrk_fetch(const wrk_fetch_src_t *src, const msg_sync_t *m, uint64_t max_data, const atomic_bool *stop,
                     char hex[65]);

#endif
