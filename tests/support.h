/* support.h -- what the Check suites share: running a suite, a scratch
 * directory, files, seeded data and the comparisons the backend tests
 * make, and the wire tensor the protocol tests build. Every helper that
 * can fail fails the running test (ck_assert) with the reason, so a test
 * reads as its steps. Linked into every tests/test_* binary. */
#ifndef REEL_TESTS_SUPPORT_H
#define REEL_TESTS_SUPPORT_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/tensor.h"
#include "schema/wire.h"

/* call (an int-returning library call) is 0, else the test fails naming
 * the call and the thread's error value (base/error.h). */
#define TS_OK(call) ck_assert_msg((call) == 0, "%s: %s", #call, reel_err_text())
/* expr (a constructor) is not NULL, else the test fails the same way. */
#define TS_NEW(expr) ck_assert_msg((expr) != NULL, "%s: %s", #expr, reel_err_text())

/* fn(arg) run on a new thread (joined); its answer. For checks that
 * something holds only on the calling thread (a lock's owner). */
bool ts_on_other_thread(bool (*fn)(void *), void *arg);

/* Runs s (CK_NORMAL), frees the runner; the exit status for main: 0 when
 * every test passed, 1 otherwise. */
int ts_run(Suite *s);
/* A CUDA suite: "NAME: SKIP: why" and exit status 0 when no CUDA device is
 * usable (no driver, a build without CUDA); else runs s without fork (a
 * CUDA context does not survive fork()), as ts_run. */
int ts_run_cuda(Suite *s, const char *name);

/* ---- scratch directories ---------------------------------------------------------- */

/* Creates /tmp/reel-TAG-XXXXXX into buf (len >= 64) and returns buf; fails
 * the test (or, outside one, aborts with the reason) when it cannot. */
char *ts_mkdtemp(char *buf, size_t len, const char *tag);
/* Copies a DiT weights file `in` to `out` (its config metadata too) with
 * tensor `victim` changed: ndim > 0, replaced by zeros of `shape` (at most
 * 64 elements); ndim 0, dropped; ndim < 0, kept (F32) with its element 3
 * set to `poison`. Asserts on any failure. */
void ts_weights_rewrite(const char *in, const char *out, const char *victim, int ndim, const int64_t *shape,
                        float poison);
/* Removes dir and everything under it (no shell; links are removed, never
 * followed). 0, or -1 when something could not be removed. NULL and a
 * missing dir are fine. */
int ts_rmtree(const char *dir);
/* dir/name in one of 8 rotating static buffers (so a call may take a few). */
const char *ts_join(const char *dir, const char *name);

/* ---- files ------------------------------------------------------------------------- */

/* Writes n bytes to path (created 0644, truncated); fails the test on error. */
void ts_write_file(const char *path, const void *p, size_t n);
/* The whole file, NUL-terminated (malloc; *n its length without the NUL);
 * fails the test on error. */
char *ts_read_file(const char *path, size_t *n);

/* ---- data ------------------------------------------------------------------------- */

/* The next value of the splitmix64 sequence whose state is *state
 * (advanced): the same on every machine, no libc state. */
uint64_t ts_splitmix64(uint64_t *state);
/* n floats uniform in [lo, hi) from a seed (splitmix64: the same on every
 * machine). */
void ts_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi);
/* max |a[i] - b[i]| (NaN when either holds a NaN). */
double ts_max_abs_diff(const float *a, const float *b, size_t n);
/* Normalised mean squared error of x against ref: sum (x-ref)^2 / sum ref^2
 * (0 for two zero vectors). */
double ts_nmse(const float *ref, const float *x, size_t n);

/* ---- models --------------------------------------------------------------------- */

/* Writes the `tiny` config's deterministic weights for seed to path (what
 * `reelctl weights init --config tiny --seed SEED` writes); fails the test
 * with the reason when it cannot. */
void ts_tiny_weights(uint64_t seed, const char *path);

/* ---- wire ------------------------------------------------------------------------ */

/* A wire tensor descriptor over data (not copied). */
wire_tensor_t ts_wire_tensor(const char *name, kern_dtype_t dt, int ndim, const int64_t *shape, const void *data,
                             size_t bytes);

#endif
