/* ctl.h -- shared pieces of reelctl's subcommands. Exit codes: 0 success,
 * 1 a runtime failure, 2 bad usage or bad input (wrong shapes, missing
 * tensors, unknown flags). */
#ifndef REEL_CTL_H
#define REEL_CTL_H

#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include "schema/msg.h"

#define CTL_OK 0
#define CTL_FAIL 1
#define CTL_USAGE 2

int cmd_weights(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_kernels(int argc, char **argv);
int cmd_artifacts(int argc, char **argv);
int cmd_tensor(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_sync(int argc, char **argv);
#define DEFAULT_BROKER "tcp://127.0.0.1:5555" /* reelctl's --broker when none is given */
int cmd_status(int argc, char **argv);
int cmd_top(int argc, char **argv);
/* From a STATUS_REPLY (cmd_gen.c): the version of `name` in v (0 when
 * absent; *found, when not NULL, says which), and why worker w lags on
 * `component` (NULL when it does not). */
uint64_t ctl_version_of(const msg_versions_t *v, const char *name, bool *found);
const char *ctl_lag_of(const msg_worker_status_t *w, const char *component);
int cmd_report(int argc, char **argv);
/* The broker's live counters (STATUS_REPLY) in the Prometheus text format
 * on out: `reelctl metrics --broker EP`. 0, or -1 with kern_error set. */
int ctl_broker_metrics(const char *broker, FILE *out);
int cmd_catalog(int argc, char **argv);
int cmd_keys(int argc, char **argv);       /* keys new (cmd_keys.c) */

/* ---- the helpers every subcommand uses (ctl_common.c) ---- */

/* Prints "reelctl: <msg>" to stderr and returns code. */
int ctl_die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses a whole decimal integer / finite float; -1 on junk. */
int ctl_parse_u64(const char *s, uint64_t *out);
int ctl_parse_int(const char *s, int *out);
int ctl_parse_double(const char *s, double *out);
/* Reads tensor `name` of safetensors file `path` widened to F32; it must
 * have rank ndim; its shape goes to shape. NULL after printing a message
 * (the caller exits CTL_USAGE), also for NaN or infinite values (a model
 * input is judged as a worker judges it). The caller frees. */
float *ctl_read_tensor(const char *path, const char *name, int ndim, int64_t *shape);
/* Parses "FxHxW" (three positive integers, each at most 65536, F x H x W
 * at most 2^24 as a GEN's latent); -1 on anything else. */
int ctl_parse_size(const char *s, int64_t out[3]);
/* Monotonic seconds. */
double ctl_now(void);
/* True when stderr is a terminal. */
bool ctl_tty(void);

#endif
