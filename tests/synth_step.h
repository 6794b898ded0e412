/* synth_step.h -- the synthetic step the capture cache's suites drive
 * (test_capture_cache.c, test_capture_adversarial.c): a capturable program
 * (capture_cache/cache.h) small enough to check bit for bit.
 *
 * Its workspace holds two inputs and one output, shaped by the key:
 *     y = latent + context;  y += w · latent     (w: the user's weights)
 * latent (input 0) is copied, context (input 1) pinnable, y the one output.
 * Each suite varies the step through an optional table of hooks
 * (synth_hooks_t): what runs before the workspace is made, when the cache
 * asks for the size or the weights, and at three points of every launch.
 * Every NULL slot (or a NULL table) is the plain step. The hooks run in
 * eager launches and captures alike, never in a replay (which runs the
 * recorded kernels only).
 *
 * A suite's user struct holds a synth_user_t as its FIRST member, so the
 * cache's `void *user` is both: the step reads the synth_user_t, the hooks
 * cast back to the suite's own struct.
 *
 * Helpers that can fail fail the running test (ck_assert), except
 * synth_reference, which returns -1 and is safe off the test's thread. */
#ifndef REEL_TESTS_SYNTH_STEP_H
#define REEL_TESTS_SYNTH_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capture_cache/cache.h"
#include "capture_cache/key.h"
#include "kernels/backend.h"

/* Floats in a weight buffer: the widest row a key may have. */
#define SYNTH_W 64

/* The workspace: x, ctx and y on the backend of the stream it was made on. */
typedef struct {
    kern_backend_t *b;
    kern_tensor_t x, ctx, y;
} synth_ws_t;

typedef struct synth_user synth_user_t;

/* A launch in progress, as its hooks see it. */
typedef struct {
    synth_ws_t *ws;
    const cap_const_t *consts; /* the call's constants (baked when captured) */
    int n_consts;
    kern_stream_t *s;          /* launching, or capturing (kern_stream_is_capturing) */
} synth_launch_t;

/* A hook at one point of a launch: 0, or -1 with the error set (the launch
 * fails). */
typedef int (*synth_stage_fn)(synth_user_t *u, const synth_launch_t *l);

/* The optional parts of a suite's step, one slot each; NULL: nothing. */
typedef struct {
    int (*ws_new)(synth_user_t *u);   /* before the workspace is allocated; -1 (error set) fails ws_new */
    void (*ws_size)(synth_user_t *u); /* when the cache asks the workspace's size */
    int (*weights)(synth_user_t *u);  /* before the weights are listed; -1 (error set) fails weights() */
    synth_stage_fn before_add;        /* at the top of a launch, before its first kernel */
    synth_stage_fn after_add;         /* between the add and the gated residual */
    synth_stage_fn after_residual;    /* after the last kernel of the step */
} synth_hooks_t;

struct synth_user {
    float *w;                   /* the resident weights the step reads: SYNTH_W floats, backend memory */
    const synth_hooks_t *hooks; /* NULL: the plain step */
};

/* ---- the program's callbacks (cap_program_t slots) ---------------------------- */

/* A workspace for key's shapes (latent and y take input 0's, context input
 * 1's) on s's backend; NULL with the error set when the hook refuses, the
 * key has fewer than two inputs or rows wider than SYNTH_W, or memory
 * runs out (REEL_E_NOMEM). Freed by synth_ws_free. */
void *synth_ws_new(void *user, const cap_key_t *key, kern_stream_t *s);
/* Frees ws (NULL: nothing). Never reads user, which may be gone. */
void synth_ws_free(void *user, void *ws);
/* Bytes ws holds. */
size_t synth_ws_bytes(void *user, const void *ws);
/* Bytes synth_ws_new allocates for key (so the cache can admit first). */
size_t synth_ws_size(void *user, const cap_key_t *key);
/* Input slot i: 0 latent, 1 context. */
kern_tensor_t *synth_input(void *user, void *ws, int i);
/* The one output slot, y. */
kern_tensor_t *synth_output(void *user, void *ws, int i);
/* Launches the step on s, reading only the workspace and the weights;
 * 0, or -1 with the error set (a kernel or a hook failed). */
int synth_launch(void *user, void *ws, const cap_const_t *consts, int n_consts, kern_stream_t *s);
/* Lists the one weight buffer (u->w, component 0) as the user points at it
 * now; 1, or -1 when the hook fails it. */
int synth_weights(void *user, cap_weight_t *out, int max);

/* ---- kernels a hook may add ----------------------------------------------------- */

/* y += v in launch l, v baked into the kernel's argument block (a capture
 * keeps it); 0, or -1 with the error set. */
int synth_add_scalar(const synth_launch_t *l, float v);
/* y += the call's constant 0 (F64 or I64, as a float); nothing when the
 * call has none. 0, or -1 with the error set. */
int synth_add_const(const synth_launch_t *l);

/* ---- keys, inputs and references ------------------------------------------------ */

/* The step's key on backend b: inputs "latent" and "context" [rows, cols]
 * F32, component comp at version ver (comp NULL: none), loop "euler",
 * graph F32 "cond" "-" "f32". Fails the test when it cannot be built. */
cap_key_t synth_key(kern_backend_t *b, const char *model, int64_t rows, int64_t cols, const char *comp,
                    uint64_t ver);
/* A host F32 [rows, cols] tensor over p (not copied). */
kern_tensor_t synth_host_tensor(float *p, int64_t rows, int64_t cols);
/* Host F32 tensor with any strides -> its elements in order, contiguous. */
void synth_gather(const kern_tensor_t *t, float *dst);
/* The reference the suites compare every output with, computed apart
 * from every hook: the plain step (no hooks) reading weights w, run once on
 * a fresh workspace on s, outside any cache, synced; out gets y. With
 * n_consts > 0, then y += consts[0] as a float, added here on the host from
 * the caller's value (the bias kernel's one float add, so the bits match),
 * never by synth_add_const. A reference made through a suite's hooks would
 * agree with a step whose hook dropped its effect, or with a replay that
 * kept the value its graph baked. 0, or -1 with the error set; asserts
 * nothing (safe off the test's thread). */
int synth_reference(const float *w, kern_stream_t *s, const cap_key_t *key, const float *x, const float *ctx,
                    const cap_const_t *consts, int n_consts, float *out);
/* The first j with a[j] and b[j] not bitwise equal (NaN payloads and the
 * sign of zero count), or -1 when all n are. */
int64_t synth_first_diff(const float *a, const float *b, int64_t n);

/* ---- data ------------------------------------------------------------------------ */

/* n floats uniform in [lo, hi) from the splitmix64 state *st (advanced), so
 * a suite's draws follow one fixed seed. */
void synth_fill(uint64_t *st, float *p, size_t n, float lo, float hi);

#endif
