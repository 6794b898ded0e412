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
/* Hands the keys p[0..n) to every stream (a request may land on any): each
 * stream captures them in order, one in each round where no request
 * stepped, with zero inputs and the shape a request of the key would run
 * there (a request of a key still listed captures it at its first step) (a group's
 * part on that stream, its sub-batch under the budget). Held while a
 * drain holds requests. The keys are copied. 0, or -1 with a message (out
 * of memory: nothing handed). */
int wrk_exec_prewarm(wrk_exec_t *x, const wrk_prewarm_t *p, int n);
/* Keys handed to the streams and not yet tried, over all streams. */
int wrk_exec_prewarm_left(wrk_exec_t *x);
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
