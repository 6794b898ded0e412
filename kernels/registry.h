/* registry.h -- which kernel implements an op on a backend for a dtype.
 *
 * Every kernel is registered once for (op, backend, dtype) with a workspace
 * contract: workspace_bytes(args) is the only scratch it may use, taken from
 * the stream's arena (reserved before capture: nothing allocates inside a
 * capture). Non-capturable kernels refuse to launch on a capturing stream. */
#ifndef REEL_KERNELS_REGISTRY_H
#define REEL_KERNELS_REGISTRY_H

#include <stddef.h>
#include <stdbool.h>
#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KERN_OP_GEMM,            /* y = x·wᵀ + b */
    KERN_OP_LAYERNORM,       /* over the last dim, optional affine */
    KERN_OP_RMSNORM,         /* over the last dim, weight */
    KERN_OP_MODULATE,        /* y = x·(1 + scale) + shift */
    KERN_OP_GATED_RESIDUAL,  /* x += gate·y (gate optional) */
    KERN_OP_ADD,             /* y = a + b */
    KERN_OP_GELU_TANH,
    KERN_OP_SILU,
    KERN_OP_ATTENTION,       /* multi-head softmax(q·kᵀ/√d)·v */
    KERN_OP_ROPE3D,          /* in place on q or k */
    KERN_OP_PATCHIFY,
    KERN_OP_UNPATCHIFY,
    KERN_OP_TIMESTEP_EMBED,  /* sinusoid of 1000·σ, σ read from memory */
    KERN_OP_CFG_COMBINE,     /* v = vu + g·(vc − vu), g read from memory */
    KERN_OP_EULER,           /* x += (σ₁ − σ₀)·v, σ read from memory */
    KERN_OP_SDE,             /* Flow-GRPO SDE update with Philox noise */
    KERN_OP_GEMM_BATCHED,    /* c_b = α·a_b·op(b_b), strided batch (decomposed attention) */
    KERN_OP_SOFTMAX,         /* p = softmax(scale·s) per row (decomposed attention) */
    KERN_OP_GEMM_GELU,       /* y = GELU_tanh(x·wᵀ + b): Linear then GELU in one op */
    KERN_OP_LAYERNORM_MODULATE, /* y = LN(x)·(1 + scale) + shift, LN without affine */
    KERN_OP_RMSNORM_ROPE3D,  /* in place: RMSNorm over the row, then 3-D RoPE per head */
    KERN_OP_ATTENTION_SDPA,  /* attention by a library's fused SDPA (CUDA: cuDNN, BF16) */
    KERN_OP_SDE_DEV,         /* the SDE update with eta, seed and step read from device memory */
    KERN_OP_MULTISTEP,       /* a multistep solver's update (UniPC, DPM++), coefficients read from memory */
    KERN_OP_ATTENTION_BIAS,  /* softmax(scale·q·kᵀ + relative-position bias, key mask)·v (T5) */
    KERN_OP_MUL,             /* y = a·b elementwise (T5's gated feed-forward) */
    KERN_OP_IM2COL3D,        /* columns of a causal 3-D conv, channels-last (ops_video.h) */
    KERN_OP_UPSAMPLE2X,      /* nearest 2x in space, [T,H,W,C] -> [T,2H,2W,C] */
    KERN_OP_FRAME_INTERLEAVE,/* [T,H,W,2C] -> [2T,H,W,C]: Wan's upsample3d frame doubling */
    KERN_OP_RESIDUAL_NORM,   /* x += gate·y, then LN(x) modulated or affine: the pair in one pass */
    KERN_OP_COUNT
} kern_op_t;

/* Every argument block starts with this header; the dispatcher fills it. */
typedef struct {
    void *scratch;           /* arena base, or NULL when workspace is 0 */
    size_t scratch_bytes;
} kern_args_hdr_t;

typedef int (*kern_kernel_fn_t)(void *ctx, const void *args);

typedef struct {
    kern_op_t op;
    kern_backend_kind_t backend;
    kern_dtype_t dtype;
    const char *name;                            /* e.g. "gemm_openblas" */
    kern_kernel_fn_t fn;                         /* runs / enqueues the op */
    size_t args_size;                            /* sizeof its argument block */
    size_t (*workspace_bytes)(const void *args); /* NULL: needs none */
    bool capturable;
} kern_impl_t;

/* "gemm", "layernorm", ...; "?" when out of range. */
const char *kern_op_name(kern_op_t op);

/* Registers impl (copied). A second registration for the same triple
 * replaces the first (a tuned kernel overriding the native one). Returns -1
 * when the table is full. Thread-safe. */
int kern_registry_register(const kern_impl_t *impl);
/* Registers every built-in kernel (CPU, and CUDA when built). Idempotent
 * and thread-safe; lookups call it themselves. */
void kern_registry_init(void);
/* The kernel for (op, backend, dtype), or NULL. */
const kern_impl_t *kern_registry_lookup(kern_op_t op, kern_backend_kind_t b, kern_dtype_t dt);
/* Up to max entries in registration order; returns how many exist. */
size_t kern_registry_list(const kern_impl_t **out, size_t max);

/* The built-in kernels of a backend (kernels/cpu/ops_cpu.c,
 * kernels/cuda/register_cuda.c): up to max pointers to its static tables'
 * entries in out, in registration order; returns how many it has (more
 * than max: the rest are not listed). Cannot fail. kern_registry_init
 * registers them: a backend's files never call the registry. */
size_t kern_cpu_kernels(const kern_impl_t **out, size_t max);
#ifdef HAVE_CUDA
size_t kern_cuda_kernels(const kern_impl_t **out, size_t max);
#endif

/* Launches the kernel registered for (op, stream's backend, dt) on s with
 * the argument block `args` (whose first member is a kern_args_hdr_t):
 * takes scratch from the arena, refuses non-capturable kernels while
 * capturing. When a dispatch hook is set (kernel artifacts,
 * kernels/artifacts.h) the launch is offered to it first. Returns 0 or -1
 * with a message. */
int kern_dispatch(kern_stream_t *s, kern_op_t op, kern_dtype_t dt, void *args);
/* kern_dispatch's launch of one given kernel: refuses a non-capturable one
 * on a capturing stream, fills the header's scratch from impl's workspace
 * contract, launches (or records). 0, or -1 with a message. */
int kern_launch_impl(kern_stream_t *s, const kern_impl_t *impl, void *args);

/* The dispatch hook: kern_dispatch calls it, once the native kernel is
 * found, with that kernel; it returns 1 when it launched the op itself
 * (the launch's 0 / -1 in *rc) and 0 to let the native kernel run. Set
 * only by kern_artifacts_install / _uninstall (NULL: no hook, one branch
 * per launch), never while a stream dispatches. */
typedef int (*kern_dispatch_hook_t)(kern_stream_t *s, kern_op_t op, kern_dtype_t dt, void *args,
                                    const kern_impl_t *native, int *rc);
void kern_registry_set_hook(kern_dispatch_hook_t hook);

#ifdef __cplusplus
}
#endif
#endif
