/* registry.c -- the kernel table (see registry.h). A fixed-size array is
 * enough: Reel registers tens of kernels, never thousands. */
#include "registry.h"
#include "backend_impl.h"
#include "base/error.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#define REGISTRY_MAX 256

static kern_impl_t table[REGISTRY_MAX];
static size_t table_len;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
/* slot + 1 of each (op, backend, dtype) in table, 0 for none: what every
 * dispatch looks up, read without the lock (a scan of the table under the
 * lock was about 80 ns of each eager launch, a tenth of a tiny CPU step,
 * and the lock was shared by every stream). Written under the lock,
 * published with release after its table entry. */
static _Atomic int slot_of[KERN_OP_COUNT][KERN_BACKEND_COUNT][KERN_DTYPE_COUNT];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static const char *op_names[KERN_OP_COUNT] = {
    "gemm", "layernorm", "rmsnorm", "modulate", "gated_residual", "add",
    "gelu_tanh", "silu", "attention", "rope3d", "patchify", "unpatchify",
    "timestep_embed", "cfg_combine", "euler", "sde", "gemm_batched", "softmax",
    "gemm_gelu", "layernorm_modulate", "rmsnorm_rope3d", "attention_sdpa", "sde_dev",
    "multistep", "attention_bias", "mul",
    "im2col3d", "upsample2x", "frame_interleave", "residual_norm",
};

const char *kern_op_name(kern_op_t op) {
    return (unsigned)op < KERN_OP_COUNT ? op_names[op] : "?";
}

int kern_registry_register(const kern_impl_t *impl) {
    int rc = 0;
    pthread_mutex_lock(&table_lock);
    size_t i;
    for (i = 0; i < table_len; i++)
        if (table[i].op == impl->op && table[i].backend == impl->backend &&
            table[i].dtype == impl->dtype)
            break;
    if (i < table_len) table[i] = *impl;
    else if (table_len < REGISTRY_MAX) table[table_len++] = *impl;
    else rc = reel_fail(REEL_E_INVALID, "kernel registry full (%d entries)", REGISTRY_MAX);
    if (rc == 0 && (unsigned)impl->op < KERN_OP_COUNT && (unsigned)impl->backend < KERN_BACKEND_COUNT &&
        (unsigned)impl->dtype < KERN_DTYPE_COUNT)
        atomic_store_explicit(&slot_of[impl->op][impl->backend][impl->dtype], (int)i + 1, memory_order_release);
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* Registers every kernel a backend lists, in its order. A full table
 * drops the rest (a lookup then names the missing kernel): Reel registers
 * a few tens of the 256. */
static void register_list(size_t (*list)(const kern_impl_t **out, size_t max)) {
    const kern_impl_t *k[REGISTRY_MAX];
    size_t n = list(k, REGISTRY_MAX);
    for (size_t i = 0; i < n && i < REGISTRY_MAX; i++) (void)kern_registry_register(k[i]);
}

static void register_builtins(void) {
    register_list(kern_cpu_kernels);
#ifdef HAVE_CUDA
    register_list(kern_cuda_kernels);
#endif
}

void kern_registry_init(void) { pthread_once(&init_once, register_builtins); }

const kern_impl_t *kern_registry_lookup(kern_op_t op, kern_backend_kind_t b, kern_dtype_t dt) {
    kern_registry_init();
    if ((unsigned)op >= KERN_OP_COUNT || (unsigned)b >= KERN_BACKEND_COUNT || (unsigned)dt >= KERN_DTYPE_COUNT)
        return NULL;
    int slot = atomic_load_explicit(&slot_of[op][b][dt], memory_order_acquire);
    return slot ? &table[slot - 1] : NULL;
}

size_t kern_registry_list(const kern_impl_t **out, size_t max) {
    kern_registry_init();
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0; i < table_len && i < max; i++) out[i] = &table[i];
    size_t n = table_len;
    pthread_mutex_unlock(&table_lock);
    return n;
}

/* Artifacts (kernels/artifacts.h) route launches through here. Atomic,
 * though it only changes while no stream dispatches: a relaxed load is one
 * branch per launch when it is NULL. */
static _Atomic(kern_dispatch_hook_t) dispatch_hook;

void kern_registry_set_hook(kern_dispatch_hook_t hook) { atomic_store(&dispatch_hook, hook); }

int kern_dispatch(kern_stream_t *s, kern_op_t op, kern_dtype_t dt, void *args) {
    kern_backend_kind_t bk = kern_backend_kind(kern_stream_backend(s));
    const kern_impl_t *impl = kern_registry_lookup(op, bk, dt);
    if (!impl)
        return reel_fail(REEL_E_INVALID, "no %s kernel for %s on %s", kern_op_name(op),
                         kern_dtype_name(dt), kern_backend_kind_name(bk));
    kern_dispatch_hook_t hook = atomic_load_explicit(&dispatch_hook, memory_order_relaxed);
    int rc;
    if (hook && hook(s, op, dt, args, impl, &rc)) return rc;
    return kern_launch_impl(s, impl, args);
}

int kern_launch_impl(kern_stream_t *s, const kern_impl_t *impl, void *args) {
    if (kern_stream_is_capturing(s) && !impl->capturable)
        return reel_fail(REEL_E_INVALID, "kernel %s is not capturable", impl->name);
    kern_args_hdr_t *hdr = args;
    hdr->scratch = NULL;
    hdr->scratch_bytes = impl->workspace_bytes ? impl->workspace_bytes(args) : 0;
    if (hdr->scratch_bytes) {
        hdr->scratch = kern_stream_scratch(s, hdr->scratch_bytes);
        if (!hdr->scratch) { /* the caller learns which kernel wanted it */
            char why[256];
            snprintf(why, sizeof why, "%s", reel_err_text());
            return reel_fail(reel_err_code(), "kernel %s: %s", impl->name, why);
        }
    }
    return kern_stream_launch(s, impl->fn, args, impl->args_size);
}
