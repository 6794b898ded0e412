/* gemm_plan.c -- cuBLASLt plans of GEMM shapes, cached per stream (see
 * gemm_plan.h).
 *
 * Row-major y[M,N] = x[M,K]·w[N,K]ᵀ is column-major yᵀ[N,M] = op(w)·x with
 * w stored as a K×N column-major matrix (ld K) taken transposed, x as K×M
 * (ld K) and y as N×M (ld N): A = w (OP_T), B = x (OP_N), C = D = y. The
 * bias then runs along D's rows, as the BIAS epilogue wants it. Compute is
 * CUBLAS_COMPUTE_32F with F32 scale for both dtypes: for F32 operands that
 * is true FP32 (cuBLASLt uses TF32 only when asked, by
 * CUBLAS_COMPUTE_32F_FAST_TF32), for BF16 it is BF16 tensor cores with F32
 * accumulation, one rounding of the result.
 *
 * The cache is a fixed table of LT_PLANS slots, filled on misses and
 * recycled least recently used once full. It belongs to one stream, used by
 * one host thread at a time (kern_cuda_ctx_t), so it takes no lock. */
#include "gemm_plan.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A step of the largest config uses about 15 shapes; a stream serving a
 * few workspace shapes at once stays well inside this. */
#define LT_PLANS 128

typedef struct {
    kern_dtype_t dt;
    bool bias, gelu;
    int64_t M, N, K;                 /* M: one group's rows */
    int64_t groups;                  /* a grouped GEMM's groups (one strided-batched matmul); 1: none */
    uint32_t al_x, al_w, al_y, al_b; /* pointer alignments, capped at 256 */
} lt_key_t;

typedef struct {
    lt_key_t key;
    kern_lt_plan_t plan;
    uint64_t used; /* tick of the last lookup: the LRU order */
} lt_slot_t;

struct kern_lt_plans {
    lt_slot_t slot[LT_PLANS];
    int n;
    uint64_t tick;
};

kern_lt_plans_t *kern_cuda_lt_plans_new(void) {
    kern_lt_plans_t *p = calloc(1, sizeof *p);
    if (!p) reel_fail(REEL_E_NOMEM, "cuda: out of memory for the GEMM plan cache");
    return p;
}

/* Destroys what a (possibly half-built) plan holds. Cannot fail. */
static void plan_free(kern_lt_plan_t *p) {
    if (p->a) (void)cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) (void)cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) (void)cublasLtMatrixLayoutDestroy(p->c);
    if (p->op) (void)cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

void kern_cuda_lt_plans_destroy(kern_lt_plans_t **pp) {
    if (!pp || !*pp) return;
    for (int i = 0; i < (*pp)->n; i++) plan_free(&(*pp)->slot[i].plan);
    free(*pp);
    *pp = NULL;
}

/* The largest power of two dividing v, at most 256 (256 for 0). */
static uint32_t align_bytes(uint64_t v) {
    if (!v) return 256;
    v &= ~v + 1;
    return v > 256 ? 256 : (uint32_t)v;
}

/* The largest power of two dividing p, at most 256; 0 for NULL. */
static uint32_t align_of(const void *p) { return p ? align_bytes((uintptr_t)p) : 0; }

static bool key_eq(const lt_key_t *a, const lt_key_t *b) {
    return a->dt == b->dt && a->bias == b->bias && a->gelu == b->gelu && a->M == b->M &&
           a->N == b->N && a->K == b->K && a->groups == b->groups && a->al_x == b->al_x && a->al_w == b->al_w &&
           a->al_y == b->al_y && a->al_b == b->al_b;
}

/* On failure: a message through kern_cublas_fail, and a jump to `err`. */
#define LT_TRY(expr)                                                                     \
    do {                                                                                 \
        cublasStatus_t lt_st_ = (expr);                                                  \
        if (lt_st_ != CUBLAS_STATUS_SUCCESS) {                                           \
            kern_cublas_fail(lt_st_, #expr, __func__, __FILE__, __LINE__);               \
            goto err;                                                                    \
        }                                                                                \
    } while (0)

/* Sets the epilogue of p->op: bias and/or GELU as asked. */
static int set_epilogue(kern_lt_plan_t *p, bool bias, bool gelu) {
    cublasLtEpilogue_t e = gelu ? (bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU)
                                : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    return 0;
}

/* The heuristic's first algorithm for p as described, in *found (false when
 * cuBLASLt has none). Fails only on a cuBLASLt error. */
static int heuristic(kern_cuda_ctx_t *c, const lt_key_t *k, kern_lt_plan_t *p, bool *found) {
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    const uint64_t ws = c->blas_ws_bytes;
    const uint32_t al[4] = { k->al_w, k->al_x, k->al_y, k->al_y }; /* A, B, C, D */
    const cublasLtMatmulPreferenceAttributes_t attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    };
    *found = false;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws, sizeof ws));
    for (int i = 0; i < 4; i++)
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, attr[i], &al[i], sizeof al[i]));
    memset(&res, 0, sizeof res);
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->a, p->b, p->c, p->c, pref,
                                                       1, &res, &n);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
        kern_cublas_fail(st, "cublasLtMatmulAlgoGetHeuristic", __func__, __FILE__, __LINE__);
        goto err;
    }
    if (st == CUBLAS_STATUS_SUCCESS && n > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
        p->algo = res.algo;
        *found = true;
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    return 0;
err:
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    return -1;
}

static int plan_build(kern_cuda_ctx_t *c, const lt_key_t *k, const void *bias, kern_lt_plan_t *p);

/* Whether every group's x and y keep the alignments the key (its first
 * group's) gives the heuristic: groups M·K and M·N elements apart. */
static bool groups_keep_alignment(const lt_key_t *k) {
    const uint64_t esz = k->dt == KERN_BF16 ? 2 : 4;
    return align_bytes((uint64_t)(k->M * k->K) * esz) >= k->al_x &&
           align_bytes((uint64_t)(k->M * k->N) * esz) >= k->al_y;
}

/* For a grouped key k: the algorithm and epilogue of the same GEMM with
 * one group (the plan a lone request's call gets, the heuristic being
 * deterministic), set in p when cuBLASLt accepts that algorithm for p's
 * batched layout within the workspace; *found says whether it did. p's
 * descriptors are built. Fails only on a cuBLASLt error.
 *
 * cublasLtMatmulAlgoCheck sees no pointers ("SUCCESS doesn't fully
 * guarantee algo will run (will fail if e.g. buffers are not correctly
 * aligned)", cublasLt.h): the lone algorithm was picked for the first
 * group's alignments, so it is not tried where a later group's x or y
 * would be less aligned than that. */
static int pinned_algo(kern_cuda_ctx_t *c, const lt_key_t *k, const void *bias, kern_lt_plan_t *p, bool *found) {
    lt_key_t one = *k;
    kern_lt_plan_t lone;
    cublasLtMatmulHeuristicResult_t res;
    *found = false;
    if (!groups_keep_alignment(k)) return 0;
    one.groups = 1;
    const int built = plan_build(c, &one, bias, &lone);
    if (built < 0) return -1; /* a cuBLASLt error: reported */
    if (built > 0) {
        /* no algorithm for the lone shape: the heuristic of the batched
         * one decides, as before */
        reel_err_clear();
        return 0;
    }
    p->post_gelu = lone.post_gelu;
    if (set_epilogue(p, k->bias, k->gelu && !lone.post_gelu) != 0) goto err;
    memset(&res, 0, sizeof res);
    cublasStatus_t st = cublasLtMatmulAlgoCheck(c->lt, p->op, p->a, p->b, p->c, p->c, &lone.algo, &res);
    if (st == CUBLAS_STATUS_SUCCESS && res.state == CUBLAS_STATUS_SUCCESS && res.workspaceSize <= c->blas_ws_bytes) {
        p->algo = lone.algo;
        *found = true;
    } else {
        p->post_gelu = false; /* the heuristic path sets its own */
    }
    plan_free(&lone);
    return 0;
err:
    plan_free(&lone);
    return -1;
}

/* Builds the plan of key k; `bias` is the bias pointer of the call (the
 * heuristic reads its alignment from it). A GELU that no algorithm takes as
 * an epilogue falls back to the bias-only epilogue plus the GELU kernel.
 * 1 (with a message) when cuBLASLt has no algorithm for k, -1 on a
 * cuBLASLt error; either way p is left empty. */
static int plan_build(kern_cuda_ctx_t *c, const lt_key_t *k, const void *bias, kern_lt_plan_t *p) {
    const cudaDataType_t t = k->dt == KERN_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    bool found = false;
    memset(p, 0, sizeof *p);
    LT_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (k->bias) {
        const int32_t bt = (int32_t)t;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                              sizeof bt));
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof bias));
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&p->a, t, (uint64_t)k->K, (uint64_t)k->N, k->K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->b, t, (uint64_t)k->K, (uint64_t)k->M, k->K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->c, t, (uint64_t)k->N, (uint64_t)k->M, k->N));
    if (k->groups > 1) {
        /* A grouped GEMM: one strided-batched matmul, group g's x and y
         * rows a group further on, the same w and bias for every group. */
        const int32_t count = (int32_t)k->groups;
        const int64_t sw = 0, sx = k->M * k->K, sy = k->M * k->N, sb = 0;
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sw, sizeof sw));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sx, sizeof sx));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->c, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sy, sizeof sy));
        if (k->bias)
            LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &sb, sizeof sb));
    }
    if (k->groups > 1) {
        /* A grouped GEMM first tries the very algorithm a lone group's
         * GEMM gets, with its epilogue: one kernel configuration for both
         * makes each group's bits those of the lone call wherever the
         * kernel computes its batch entries alike, where the heuristic,
         * asked about the batched shape, may pick another kernel (it picks
         * by the whole problem). The merge probe (model/gemm_merge.c)
         * still decides whether the two agree. */
        if (pinned_algo(c, k, bias, p, &found) != 0) goto err;
    }
    if (!found && set_epilogue(p, k->bias, k->gelu) != 0) goto err;
    if (!found && heuristic(c, k, p, &found) != 0) goto err;
    if (!found && k->gelu) {
        p->post_gelu = true;
        if (set_epilogue(p, k->bias, false) != 0 || heuristic(c, k, p, &found) != 0) goto err;
    }
    if (!found) {
        reel_fail(REEL_E_DEVICE, "gemm: cuBLASLt has no algorithm for %s M=%lld N=%lld K=%lld x %lld groups%s%s "
                  "(alignments x %u, w %u, y %u, bias %u bytes; workspace %zu bytes)",
                  kern_dtype_name(k->dt), (long long)k->M, (long long)k->N, (long long)k->K, (long long)k->groups,
                  k->bias ? " +bias" : "", k->gelu ? " +gelu" : "", k->al_x, k->al_w, k->al_y,
                  k->al_b, c->blas_ws_bytes);
        plan_free(p);
        return 1;
    }
    return 0;
err:
    plan_free(p);
    return -1;
}

/* Fails when s captures; the message names the shape. */
static int refuse_in_capture(kern_cuda_ctx_t *c, const lt_key_t *k) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(c->stream, &cs));
    if (cs == cudaStreamCaptureStatusNone) return 0;
    return reel_fail(REEL_E_DEVICE, "gemm: no cuBLASLt plan yet for %s M=%lld N=%lld K=%lld x %lld groups%s%s on "
                     "this stream, and none is made inside a capture: run the shape eagerly on this stream "
                     "before capturing it", kern_dtype_name(k->dt), (long long)k->M,
                     (long long)k->N, (long long)k->K, (long long)k->groups, k->bias ? " +bias" : "",
                     k->gelu ? " +gelu" : "");
}

int kern_lt_plan_get(kern_cuda_ctx_t *c, const kern_gemm_args_t *a, kern_dtype_t dt, bool gelu,
                     const kern_lt_plan_t **out) {
    kern_lt_plans_t *ps = c->lt_plans;
    lt_key_t k;
    memset(&k, 0, sizeof k);
    k.dt = dt;
    k.bias = a->bias != NULL;
    k.gelu = gelu;
    k.groups = a->group > 0 && a->group < a->M && a->M % a->group == 0 ? a->M / a->group : 1;
    k.M = a->M / k.groups;
    k.N = a->N;
    k.K = a->K;
    k.al_x = align_of(a->x);
    k.al_w = align_of(a->w);
    k.al_y = align_of(a->y);
    k.al_b = align_of(a->bias);
    ps->tick++;
    int lru = 0;
    for (int i = 0; i < ps->n; i++) {
        if (key_eq(&ps->slot[i].key, &k)) {
            ps->slot[i].used = ps->tick;
            *out = &ps->slot[i].plan;
            return 0;
        }
        if (ps->slot[i].used < ps->slot[lru].used) lru = i;
    }
    if (refuse_in_capture(c, &k) != 0) return -1;
    kern_lt_plan_t fresh;
    if (plan_build(c, &k, a->bias, &fresh) != 0) return -1;
    int i = lru;
    if (ps->n < LT_PLANS) i = ps->n++;
    else plan_free(&ps->slot[i].plan); /* the least recently used */
    ps->slot[i].key = k;
    ps->slot[i].plan = fresh;
    ps->slot[i].used = ps->tick;
    *out = &ps->slot[i].plan;
    return 0;
}
