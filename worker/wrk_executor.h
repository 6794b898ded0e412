/* wrk_executor.h -- S stream threads that run requests step by step.
 *
 * Each stream thread owns one kern_stream_t and a PUSH end of the pipe. It
 * loops: take newly submitted jobs, then run ONE step of each active job in
 * turn (so the steps of in-flight requests interleave on the stream), each
 * step under the read side of the step lock. After a step it sends PROGRESS
 * when asked; after the last, RESULT (or ERROR on a failure) and frees the
 * job. Jobs of an old broker session (wrk_t.epoch) are dropped silently
 * between steps; on stop, every job is dropped after at most the step in
 * progress. */
#ifndef REEL_WORKER_WRK_EXECUTOR_H
#define REEL_WORKER_WRK_EXECUTOR_H

#include "worker/wrk.h"
#include "worker/wrk_request.h"

typedef struct wrk_exec wrk_exec_t;

/* Creates w->opt->streams streams and starts their threads. NULL with a
 * message in reel_err_text() (nothing left running). */
wrk_exec_t *wrk_exec_new(wrk_t *w);
/* Queues job on the stream with the fewest jobs (queued + active), taking
 * ownership. Can't fail. */
void wrk_exec_submit(wrk_exec_t *x, wrk_job_t *job);
/* The streams, and the jobs (queued + running) on stream i. */
int wrk_exec_streams(const wrk_exec_t *x);
int wrk_exec_stream_load(wrk_exec_t *x, int i);
/* Jobs queued or active on all streams. */
int wrk_exec_inflight(wrk_exec_t *x);
/* Sets w->stop, wakes and joins every thread and frees every job. The
 * threads finish at most the step they are in. The streams stay (graphs
 * captured on them may still be in the cache). Idempotent. */
void wrk_exec_stop(wrk_exec_t *x);
/* wrk_exec_stop, then frees the streams: destroy the capture cache first.
 * NULL-safe. */
void wrk_exec_destroy(wrk_exec_t **x);

#endif
