/* attention_cudnn.c -- ATTENTION_SDPA on CUDA: cuDNN's fused flash
 * attention, one CUDNN_BACKEND_OPERATION_SDPA_FWD node (backend graph API,
 * cuDNN >= 9.13) with Q, K, V, O and a by-value scale, BF16 only. Built
 * when the Makefile finds cudnn.h (HAVE_CUDNN); without it this file only
 * gives the stream hooks that do nothing, and no SDPA kernel is
 * registered for CUDA.
 *
 * Layout: q, o [nq, H·d] and k, v [nk, H·d] row-major are BHSD tensors
 * [1, H, n, d] with strides [n·H·d, d, H·d, 1] (heads side by side in each
 * row): cuDNN reads the head slices in place, nothing is repacked. K is the
 * literal K [1, H, nk, d], as the SDPA node takes it.
 *
 * Plans (operation graph, the first engine config the heuristics offer
 * that finalizes, its workspace size) are made per stream and shape, like
 * the cuBLASLt plans (gemm_plan.c), and never inside a capture: a shape
 * first met in a capture fails naming it. The workspace is the stream's
 * preallocated cuBLAS one (stream-ordered; a plan needing more is refused
 * with a message). Forward SDPA uses no atomics and the plan is fixed per
 * shape, so a replay should repeat an eager run bit for bit:
 * tests/test_cuda.c checks that, and checks the results against the cuBLAS
 * decomposition, on a device. AUTO takes it on CUDA in BF16 once cuDNN
 * loads (kernels/ops.h, kern_attention_choose); a failure here other than
 * the capture case above makes kern_attention_run fall back to the
 * decomposition for that shape. This file has never run on a GPU. */
#include "cuda_common.h"
#include "kernels_cuda.h"
#include "../ops_args.h"
#include "../plan_cache.h"

#ifndef HAVE_CUDNN

void kern_cuda_dnn_open(kern_cuda_ctx_t *c) { (void)c; }
void kern_cuda_dnn_close(kern_cuda_ctx_t *c) { (void)c; }

#else

#include <cudnn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SDPA_PLANS 32    /* per stream; least recently used recycled */
#define SDPA_KEEP 48     /* descriptors a plan keeps alive */
#define SDPA_CONFIGS 16  /* engine configs asked of the heuristics */

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_SCALE };

typedef struct {
    int64_t nq, nk, heads, d;
    cudnnBackendDescriptor_t plan;
    cudnnBackendDescriptor_t keep[SDPA_KEEP]; /* what the plan was built from */
    int nkeep;
    int64_t ws_bytes;
} sdpa_plan_t;

/* A stream's plans (kernels/plan_cache.h: by shape, made outside captures,
 * least recently used recycled) and how its cuDNN handle came up. */
typedef struct {
    kern_plan_cache_t *cache;
    cudnnStatus_t create_status; /* why dnn is NULL, when it is */
} sdpa_plans_t;

/* Records a cuDNN failure, with the library's own last message, and
 * returns -1. */
static int dnn_fail(cudnnStatus_t st, const char *stmt, const char *func, int line) {
    char last[256] = "";
    cudnnGetLastErrorString(last, sizeof last);
    return reel_fail(REEL_E_DEVICE, "cuDNN error: %s in `%s` (%s at %s:%d)%s%s", cudnnGetErrorString(st), stmt,
                     func, __FILE__, line, last[0] ? ": " : "", last);
}

/* why = "<what>: <cuDNN's last error string>" (what alone when it has
 * none): a failure that is passed over keeps cuDNN's reason for the
 * message that follows. */
static void last_error(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void last_error(char *why, size_t len, const char *fmt, ...) {
    char last[200] = "";
    cudnnGetLastErrorString(last, sizeof last);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(why, len, fmt, ap);
    va_end(ap);
    if (last[0] && n >= 0 && (size_t)n < len) snprintf(why + n, len - (size_t)n, ": %s", last);
}

/* On failure: the message, then a jump to `err`. */
#define DNN_TRY(expr)                                                         \
    do {                                                                      \
        cudnnStatus_t dnn_st_ = (expr);                                       \
        if (dnn_st_ != CUDNN_STATUS_SUCCESS) {                                \
            dnn_fail(dnn_st_, #expr, __func__, __LINE__);                     \
            goto err;                                                         \
        }                                                                     \
    } while (0)

static void plan_free(sdpa_plan_t *p) {
    if (p->plan) (void)cudnnBackendDestroyDescriptor(p->plan);
    for (int i = p->nkeep; i-- > 0;) (void)cudnnBackendDestroyDescriptor(p->keep[i]);
    memset(p, 0, sizeof *p);
}

/* kern_plan_free_fn: a cached plan and its descriptors. */
static void cached_plan_free(void *ctx, void *plan) {
    (void)ctx;
    plan_free(plan);
    free(plan);
}

void kern_cuda_dnn_open(kern_cuda_ctx_t *c) {
    sdpa_plans_t *ps = calloc(1, sizeof *ps);
    if (!ps) return;
    if (!(ps->cache = kern_plan_cache_new(SDPA_PLANS, cached_plan_free, NULL))) {
        free(ps);
        return;
    }
    c->dnn_plans = ps;
    cudnnHandle_t h = NULL;
    ps->create_status = cudnnCreate(&h);
    if (ps->create_status != CUDNN_STATUS_SUCCESS) return;
    ps->create_status = cudnnSetStream(h, c->stream);
    if (ps->create_status != CUDNN_STATUS_SUCCESS) {
        (void)cudnnDestroy(h);
        return;
    }
    c->dnn = h;
}

void kern_cuda_dnn_close(kern_cuda_ctx_t *c) {
    sdpa_plans_t *ps = c->dnn_plans;
    if (ps) {
        kern_plan_cache_destroy(&ps->cache);
        free(ps);
        c->dnn_plans = NULL;
    }
    if (c->dnn) (void)cudnnDestroy((cudnnHandle_t)c->dnn);
    c->dnn = NULL;
}

/* A finalized tensor descriptor, kept in p; -1 with a message on failure. */
static int tensor(sdpa_plan_t *p, cudnnBackendDescriptor_t *out, int64_t uid,
                  cudnnDataType_t dt, const int64_t dims[4], const int64_t strides[4],
                  bool by_value) {
    cudnnBackendDescriptor_t t = NULL;
    const int64_t align = 16;
    const bool no = false, yes = true;
    DNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
    p->keep[p->nkeep++] = t; /* freed with the plan, finalized or not */
    DNN_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    DNN_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
    DNN_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
    DNN_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    DNN_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
                                     &align));
    DNN_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &no));
    if (by_value)
        DNN_TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1,
                                         &yes));
    DNN_TRY(cudnnBackendFinalize(t));
    *out = t;
    return 0;
err:
    return -1;
}

/* A descriptor of type ty, kept in p. */
static int create(sdpa_plan_t *p, cudnnBackendDescriptorType_t ty, cudnnBackendDescriptor_t *out) {
    DNN_TRY(cudnnBackendCreateDescriptor(ty, out));
    p->keep[p->nkeep++] = *out;
    return 0;
err:
    return -1;
}

/* The finalized operation graph of one SDPA node over BHSD views of q, k,
 * v, o (see the top of this file). */
static int build_graph(cudnnHandle_t h, sdpa_plan_t *p, cudnnBackendDescriptor_t *graph) {
    const int64_t H = p->heads, d = p->d, W = H * d;
    const int64_t dq[4] = { 1, H, p->nq, d }, sq[4] = { p->nq * W, d, W, 1 };
    const int64_t dk[4] = { 1, H, p->nk, d }, sk[4] = { p->nk * W, d, W, 1 };
    const int64_t one[4] = { 1, 1, 1, 1 };
    cudnnBackendDescriptor_t q, k, v, o, scale, op;
    if (tensor(p, &q, UID_Q, CUDNN_DATA_BFLOAT16, dq, sq, false) ||
        tensor(p, &k, UID_K, CUDNN_DATA_BFLOAT16, dk, sk, false) ||
        tensor(p, &v, UID_V, CUDNN_DATA_BFLOAT16, dk, sk, false) ||
        tensor(p, &o, UID_O, CUDNN_DATA_BFLOAT16, dq, sq, false) ||
        tensor(p, &scale, UID_SCALE, CUDNN_DATA_FLOAT, one, one, true) ||
        create(p, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, &op))
        return -1;
    const cudnnBackendAttributeName_t names[5] = {
        CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC,
        CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC,
        CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC,
    };
    cudnnBackendDescriptor_t ts[5] = { q, k, v, o, scale };
    for (int i = 0; i < 5; i++)
        DNN_TRY(cudnnBackendSetAttribute(op, names[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ts[i]));
    DNN_TRY(cudnnBackendFinalize(op));
    if (create(p, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph)) return -1;
    DNN_TRY(cudnnBackendSetAttribute(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op));
    DNN_TRY(cudnnBackendSetAttribute(*graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE,
                                     1, &h));
    DNN_TRY(cudnnBackendFinalize(*graph));
    return 0;
err:
    return -1;
}

/* The execution plan of the first engine config, in heuristic mode A then
 * FALLBACK, that finalizes and fits the stream's workspace. The order is
 * cuDNN's and depends only on the graph and the device: the same shape
 * gets the same plan every time. */
static int build_plan(kern_cuda_ctx_t *c, sdpa_plan_t *p, cudnnBackendDescriptor_t graph) {
    cudnnHandle_t h = (cudnnHandle_t)c->dnn;
    const cudnnBackendHeurMode_t modes[2] = { CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK };
    char why[256] = "the heuristics offered no engine config";
    for (int m = 0; m < 2; m++) {
        cudnnBackendDescriptor_t heur, cfg[SDPA_CONFIGS];
        int64_t count = 0;
        if (p->nkeep + 1 + SDPA_CONFIGS > SDPA_KEEP - 1) break;
        if (create(p, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur)) return -1;
        DNN_TRY(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
        DNN_TRY(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE,
                                         1, &modes[m]));
        if (cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS) {
            last_error(why, sizeof why, "the heuristics (mode %s) did not finalize", m ? "FALLBACK" : "A");
            continue;
        }
        for (int i = 0; i < SDPA_CONFIGS; i++)
            if (create(p, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[i])) return -1;
        if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, SDPA_CONFIGS, &count,
                                     cfg) != CUDNN_STATUS_SUCCESS)
            continue;
        for (int64_t i = 0; i < count && i < SDPA_CONFIGS; i++) {
            cudnnBackendDescriptor_t plan = NULL;
            int64_t ws = 0, nws = 0;
            DNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan));
            if (cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                         1, &h) != CUDNN_STATUS_SUCCESS ||
                cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]) !=
                    CUDNN_STATUS_SUCCESS ||
                cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS ||
                cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &nws, &ws) != CUDNN_STATUS_SUCCESS) {
                last_error(why, sizeof why, "engine config %lld of %lld did not finalize",
                           (long long)i + 1, (long long)count);
                (void)cudnnBackendDestroyDescriptor(plan);
                continue;
            }
            if (ws < 0 || (uint64_t)ws > c->blas_ws_bytes) {
                snprintf(why, sizeof why, "the plans offered need %lld bytes of workspace, the "
                         "stream has %zu", (long long)ws, c->blas_ws_bytes);
                (void)cudnnBackendDestroyDescriptor(plan);
                continue;
            }
            p->plan = plan;
            p->ws_bytes = ws;
            return 0;
        }
    }
    return reel_fail(REEL_E_DEVICE, "attention_sdpa: cuDNN has no plan for nq=%lld nk=%lld heads=%lld d=%lld "
                     "BF16: %s", (long long)p->nq, (long long)p->nk, (long long)p->heads,
                     (long long)p->d, why);
err:
    return -1;
}

/* kern_plan_make_fn: the graph and the plan for one shape, on c's handle. */
static int plan_make(void *ctx, const kern_plan_shape_t *sh, void **out) {
    kern_cuda_ctx_t *c = ctx;
    sdpa_plan_t *p = calloc(1, sizeof *p);
    if (!p) return reel_fail(REEL_E_NOMEM, "attention_sdpa: out of memory");
    p->nq = sh->nq;
    p->nk = sh->nk;
    p->heads = sh->heads;
    p->d = sh->d;
    cudnnBackendDescriptor_t graph = NULL;
    if (build_graph((cudnnHandle_t)c->dnn, p, &graph) || build_plan(c, p, graph)) {
        plan_free(p);
        free(p);
        return -1;
    }
    *out = p;
    return 0;
}

/* The plan for a's sizes on c's stream: cached, or made outside a capture
 * (a shape first met inside one fails with code state, and the capture is
 * tried again after an eager run has made it). */
static int plan_get(kern_cuda_ctx_t *c, const kern_attention_args_t *a, const sdpa_plan_t **out) {
    sdpa_plans_t *ps = c->dnn_plans;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(c->stream, &cs));
    const kern_plan_shape_t sh = { a->nq, a->nk, a->heads, a->head_dim };
    void *p = NULL;
    if (kern_plan_cache_get(ps->cache, &sh, cs != cudaStreamCaptureStatusNone, plan_make, c, &p))
        return reel_fail_prefix("attention_sdpa: ");
    *out = p;
    return 0;
}

/* Enqueues o = softmax(q·kᵀ·scale)·v per head on c's stream. Fails on a
 * stream without cuDNN, pointers not 16-byte aligned, no plan, or a cuDNN
 * error. */
int kern_cuda_attention_sdpa_bf16(void *ctx, const void *args) {
    kern_cuda_ctx_t *c = (kern_cuda_ctx_t *)ctx;
    const kern_attention_args_t *a = (const kern_attention_args_t *)args;
    cudnnBackendDescriptor_t pack = NULL;
    if (a->nq <= 0) return 0;
    if (!c->dnn) {
        const sdpa_plans_t *ps = c->dnn_plans;
        return reel_fail(REEL_E_DEVICE, "attention_sdpa: this stream has no cuDNN handle (cudnnCreate: %s)",
                         ps ? cudnnGetErrorString(ps->create_status) : "out of memory");
    }
    const void *ptr[4] = { a->q, a->k, a->v, a->o };
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ptr[i] % 16)
            return reel_fail(REEL_E_INVALID, "attention_sdpa: q, k, v and o must be 16-byte aligned for cuDNN");
    const sdpa_plan_t *p = NULL;
    if (plan_get(c, a, &p)) return -1;
    float scale = a->scale; /* by value: read when the call is enqueued (a graph bakes it) */
    void *data[5] = { (void *)a->q, (void *)a->k, (void *)a->v, a->o, &scale };
    const int64_t uids[5] = { UID_Q, UID_K, UID_V, UID_O, UID_SCALE };
    void *ws = p->ws_bytes ? c->blas_ws : NULL;
    DNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
    DNN_TRY(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 5,
                                     uids));
    DNN_TRY(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                     CUDNN_TYPE_VOID_PTR, 5, data));
    DNN_TRY(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                     1, &ws));
    DNN_TRY(cudnnBackendFinalize(pack));
    DNN_TRY(cudnnBackendExecute((cudnnHandle_t)c->dnn, p->plan, pack));
    (void)cudnnBackendDestroyDescriptor(pack);
    return 0;
err:
    if (pack) (void)cudnnBackendDestroyDescriptor(pack);
    return -1;
}

#endif /* HAVE_CUDNN */
