/* attention.c -- the attention op above the kernels: the pick rule, the
 * block plan, and the decomposed path (S = Q·Kᵀ, scale + row softmax,
 * O = P·V) written once, as launches of two backend primitives
 * (KERN_OP_GEMM_BATCHED, KERN_OP_SOFTMAX), so the CPU runs exactly the
 * blocking the GPU runs and `make test` checks it.
 *
 * Layout: q, o are [nq, H·d] and k, v [nk, H·d] with the heads side by side
 * in each row, so head h of a block is a strided view (leading dim H·d,
 * batch stride d): the GEMMs read and write the head slices in place and
 * nothing is repacked. Per block of `heads` heads × `rows` queries:
 *   S[h] = Q[i0:i0+m, h]·K[:, h]ᵀ         batch over h, S F32 [m, ld]
 *   P    = softmax(scale·S) row by row    P in the op's dtype (F32: P = S)
 *   O[i0:i0+m, h] = P[h]·V[:, h]          batch over h, straight into o
 *
 * The plan depends only on (backend kind, dtype, sizes, bound), and the
 * S/P block lives in the scratch taken once per call, whose address goes
 * into the primitives' argument blocks as an ordinary operand: an eager run
 * and a capture of the same call issue the same launches over the same
 * memory, so a replay repeats the eager result bit for bit. Nothing here
 * allocates: the scratch is the workspace's (sized by
 * kern_attention_scratch_bytes) or the stream arena's. */
#include "attention.h"
#include "base/error.h"
#include "registry.h"
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

kern_attn_path_t kern_attention_pick(int64_t nq, int64_t nk, int64_t head_dim) {
    if (head_dim > KERN_ATTN_FUSED_MAX_HEAD_DIM) return KERN_ATTN_DECOMPOSED;
    if (nq <= 0 || nk <= 0) return KERN_ATTN_FUSED;
    /* nq·nk >= MIN, without forming the product */
    return nq >= (KERN_ATTN_DECOMPOSE_MIN_SCORES + nk - 1) / nk ? KERN_ATTN_DECOMPOSED
                                                                 : KERN_ATTN_FUSED;
}

/* ---- which path AUTO takes (the mode and readiness live in attn_policy.c) ---- */

kern_attn_path_t kern_attention_choose(kern_backend_kind_t bk, kern_dtype_t dt, int64_t nq, int64_t nk,
                                       int64_t head_dim, const char **why) {
    static const char *const not_cuda_bf16 = "not CUDA in BF16: the pick rule";
    static const char *const decomposed = "REEL_ATTN=decomposed";
    static const char *const head = "the head is wider than cuDNN SDPA takes (or not a multiple of 8)";
    static const char *const no_kernel = "this build has no cuDNN SDPA kernel";
    static const char *const fused = "cuDNN's fused SDPA";
    static const char *const cpu = "the CPU's attention kernel: direct up to 64 keys and head width, else whole "
                                   "rows below 2^20 scores per head, flash-style blocks from there on";
    kern_attn_mode_t m = kern_attention_mode();
    if (bk == KERN_BACKEND_CPU && m != KERN_ATTN_MODE_DECOMPOSED && kern_registry_lookup(KERN_OP_ATTENTION, bk, dt)) {
        /* every size (kernels/cpu/cpu_attn.h): its scratch stays bounded */
        if (why) *why = cpu;
        return KERN_ATTN_FUSED;
    }
    const char *w = fused;
    bool sdpa = false;
    if (m == KERN_ATTN_MODE_DECOMPOSED) w = decomposed;
    else if (bk != KERN_BACKEND_CUDA || dt != KERN_BF16) w = not_cuda_bf16;
    else if (head_dim > KERN_ATTN_SDPA_MAX_HEAD_DIM || head_dim % 8) w = head;
    else if (!kern_registry_lookup(KERN_OP_ATTENTION_SDPA, bk, dt)) w = no_kernel;
    else {
        static _Thread_local char reason[320]; /* the caller's copy: a backend may rewrite the state's */
        char msg[256];
        sdpa = kern_attention_sdpa_state(reason, sizeof reason);
        if (!sdpa) w = reason;
        else if (kern_attention_sdpa_failed(nq, nk, head_dim, msg, sizeof msg)) {
            snprintf(reason, sizeof reason, "cuDNN's fused SDPA failed for this shape: %s", msg);
            w = reason;
            sdpa = false;
        }
    }
    if (why) *why = w;
    return sdpa ? KERN_ATTN_SDPA : kern_attention_pick(nq, nk, head_dim);
}

void kern_attention_describe(kern_backend_kind_t bk, kern_dtype_t dt, char *buf, size_t len) {
    const char *why;
    kern_attn_mode_t m = kern_attention_mode();
    kern_attn_path_t p = kern_attention_choose(bk, dt, 32760, 32760, 128, &why);
    bool bad = kern_attention_env_bad();
    snprintf(buf, len, "attention %s (mode %s%s): %s%s", p == KERN_ATTN_DECOMPOSED ? "decomposed" : "fused",
             kern_attention_mode_name(m), bad ? ", REEL_ATTN not understood" : "", why,
             m == KERN_ATTN_MODE_FUSED && p == KERN_ATTN_DECOMPOSED ? " (WARNING: fused was asked for)" : "");
}

static size_t default_bound(kern_backend_kind_t bk) {
    return bk == KERN_BACKEND_CUDA ? KERN_ATTN_BLOCK_BYTES_CUDA : KERN_ATTN_BLOCK_BYTES_CPU;
}

/* The decomposition's bound when it stands in for a failed SDPA. */
static size_t fallback_bound(kern_backend_kind_t bk) {
    size_t b = default_bound(bk);
    return b < KERN_ATTN_FALLBACK_BYTES ? b : KERN_ATTN_FALLBACK_BYTES;
}

/* FUSED (op ATTENTION) and SDPA (op ATTENTION_SDPA): one launch of the
 * backend's kernel, whose workspace contract is the plan's scratch. */
static int plan_fused(kern_backend_kind_t bk, kern_dtype_t dt, int64_t nq, int64_t nk,
                      int64_t H, int64_t d, kern_attn_path_t path, kern_attn_plan_t *p) {
    const kern_op_t op = path == KERN_ATTN_SDPA ? KERN_OP_ATTENTION_SDPA : KERN_OP_ATTENTION;
    const kern_impl_t *impl = kern_registry_lookup(op, bk, dt);
    if (!impl && path == KERN_ATTN_SDPA)
        return reel_fail(REEL_E_UNSUPPORTED, "attention: no SDPA kernel for %s on %s (on CUDA: cuDNN's fused "
                         "attention, BF16 only, in builds with cuDNN)", kern_dtype_name(dt),
                         kern_backend_kind_name(bk));
    if (!impl)
        return reel_fail(REEL_E_INVALID, "attention: no fused attention kernel for %s on %s",
                         kern_dtype_name(dt), kern_backend_kind_name(bk));
    p->path = path;
    if (impl->workspace_bytes) {
        kern_attention_args_t a;
        memset(&a, 0, sizeof a);
        a.nq = nq;
        a.nk = nk;
        a.heads = H;
        a.head_dim = d;
        p->scratch_bytes = impl->workspace_bytes(&a);
    }
    return 0;
}

/* Heads per batch and query rows per block: all heads and as many rows as
 * fit the bound; when not even one row of every head fits, one row of as
 * many heads as fit (at least one, even past the bound). */
static int plan_decomposed(kern_backend_kind_t bk, kern_dtype_t dt, int64_t nq, int64_t nk,
                           int64_t H, size_t bound, kern_attn_plan_t *p) {
    if (!kern_registry_lookup(KERN_OP_GEMM_BATCHED, bk, dt) ||
        !kern_registry_lookup(KERN_OP_SOFTMAX, bk, dt))
        return reel_fail(REEL_E_INVALID, "attention: no gemm_batched/softmax kernels for %s on %s, so the "
                         "decomposed path cannot run", kern_dtype_name(dt),
                         kern_backend_kind_name(bk));
    const int64_t ld = (nk + 7) & ~(int64_t)7; /* rows of S and P start 32-byte aligned */
    if (ld > INT_MAX)
        return reel_fail(REEL_E_INVALID, "attention: %lld keys exceed the GEMMs' int range", (long long)nk);
    const size_t pe = dt == KERN_F32 ? 0 : kern_dtype_size(dt); /* F32: P is S */
    const size_t per = (size_t)ld * (sizeof(float) + pe);     /* one row of one head */
    p->path = KERN_ATTN_DECOMPOSED;
    p->ld = ld;
    if (nq == 0) {
        p->heads = H;
        return 0;
    }
    if (bound < 1) bound = 1;
    if (per <= bound / (size_t)H) {
        p->heads = H;
        size_t rows = bound / ((size_t)H * per);
        p->rows = rows < (size_t)nq ? (int64_t)rows : nq;
    } else {
        size_t hb = bound / per;
        p->heads = hb < 1 ? 1 : (int64_t)hb;
        p->rows = 1;
    }
    const size_t n = (size_t)p->heads * (size_t)p->rows * (size_t)ld;
    p->scores_bytes = n * sizeof(float);
    p->probs_bytes = n * pe;
    p->scratch_bytes = p->scores_bytes + p->probs_bytes;
    p->blocks = ((H + p->heads - 1) / p->heads) * ((nq + p->rows - 1) / p->rows);
    return 0;
}

int kern_attention_plan(kern_backend_kind_t bk, kern_dtype_t dt, int64_t nq, int64_t nk,
                        int64_t heads, int64_t head_dim, const kern_attn_opts_t *opts,
                        kern_attn_plan_t *plan) {
    memset(plan, 0, sizeof *plan);
    if (nq < 0 || nk < 1 || heads < 1 || head_dim < 1)
        return reel_fail(REEL_E_INVALID, "attention: nq=%lld nk=%lld heads=%lld head_dim=%lld: need nq >= 0 "
                         "and the others >= 1", (long long)nq, (long long)nk, (long long)heads,
                         (long long)head_dim);
    if (nk > INT_MAX || head_dim > INT_MAX / heads)
        return reel_fail(REEL_E_INVALID, "attention: nk=%lld, width %lld·%lld exceed the GEMMs' int range",
                         (long long)nk, (long long)heads, (long long)head_dim);
    kern_attn_path_t path = opts ? opts->path : KERN_ATTN_AUTO;
    bool fallback = opts && opts->fallback;
    if (path == KERN_ATTN_AUTO) {
        path = kern_attention_choose(bk, dt, nq, nk, head_dim, NULL);
        fallback = true;
    }
    switch (path) {
    case KERN_ATTN_FUSED:
        return plan_fused(bk, dt, nq, nk, heads, head_dim, path, plan);
    case KERN_ATTN_SDPA: {
        if (plan_fused(bk, dt, nq, nk, heads, head_dim, path, plan)) return -1;
        if (!fallback) return 0;
        /* room for the decomposition too, should SDPA fail when it runs */
        kern_attn_plan_t d;
        if (plan_decomposed(bk, dt, nq, nk, heads, fallback_bound(bk), &d)) return -1;
        plan->fallback = true;
        if (d.scratch_bytes > plan->scratch_bytes) plan->scratch_bytes = d.scratch_bytes;
        return 0;
    }
    case KERN_ATTN_DECOMPOSED:
        return plan_decomposed(bk, dt, nq, nk, heads,
                               opts && opts->block_bytes ? opts->block_bytes : default_bound(bk),
                               plan);
    default:
        return reel_fail(REEL_E_INVALID, "attention: unknown path %d", (int)path);
    }
}

size_t kern_attention_scratch_bytes(kern_backend_kind_t bk, kern_dtype_t dt, int64_t nq,
                                    int64_t nk, int64_t heads, int64_t head_dim) {
    kern_attn_plan_t p;
    return kern_attention_plan(bk, dt, nq, nk, heads, head_dim, NULL, &p) == 0 ? p.scratch_bytes
                                                                               : 0;
}

/* One block: heads [h0, h0 + hn), queries [i0, i0 + m). */
static int run_block(kern_stream_t *s, kern_dtype_t dt, const kern_attention_args_t *a,
                     const kern_attn_plan_t *p, char *scores, char *probs, int64_t h0,
                     int64_t hn, int64_t i0, int64_t m) {
    const size_t esz = kern_dtype_size(dt);
    const int64_t d = a->head_dim, ld = a->heads * d, nk = a->nk;
    const size_t qoff = (size_t)(i0 * ld + h0 * d) * esz, koff = (size_t)(h0 * d) * esz;
    kern_gemm_batched_args_t qk = {
        .a = (const char *)a->q + qoff, .b = (const char *)a->k + koff, .c = scores,
        .batch = hn, .m = m, .n = nk, .k = d,
        .lda = ld, .ldb = ld, .ldc = p->ld,
        .stride_a = d, .stride_b = d, .stride_c = m * p->ld,
        .alpha = 1.0f, .trans_b = true, .c_f32 = true,
    };
    if (kern_dispatch(s, KERN_OP_GEMM_BATCHED, dt, &qk)) return -1;
    kern_softmax_args_t sm = {
        .s = (const float *)scores, .p = probs, .rows = hn * m, .n = nk,
        .lds = p->ld, .ldp = p->ld, .scale = a->scale,
    };
    if (kern_dispatch(s, KERN_OP_SOFTMAX, dt, &sm)) return -1;
    kern_gemm_batched_args_t pv = {
        .a = probs, .b = (const char *)a->v + koff, .c = (char *)a->o + qoff,
        .batch = hn, .m = m, .n = d, .k = nk,
        .lda = p->ld, .ldb = ld, .ldc = ld,
        .stride_a = m * p->ld, .stride_b = d, .stride_c = d,
        .alpha = 1.0f, .trans_b = false, .c_f32 = false,
    };
    return kern_dispatch(s, KERN_OP_GEMM_BATCHED, dt, &pv);
}

/* SDPA failed for a's shape: remembered (logged the first time), and p
 * becomes the decomposition's plan within the fallback bound, which the
 * SDPA plan's scratch covers. */
static int sdpa_fall_back(kern_backend_kind_t bk, kern_dtype_t dt, const kern_attention_args_t *a,
                          kern_attn_plan_t *p) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", reel_err_text());
    if (kern_attention_sdpa_fail(a->nq, a->nk, a->head_dim, msg))
        fprintf(stderr, "reel: attention: cuDNN's fused SDPA failed for nq=%lld nk=%lld heads=%lld d=%lld: %s; "
                "this shape runs the decomposition from now on\n", (long long)a->nq, (long long)a->nk,
                (long long)a->heads, (long long)a->head_dim, msg);
    kern_attn_opts_t fo = { .path = KERN_ATTN_DECOMPOSED, .block_bytes = fallback_bound(bk) };
    return kern_attention_plan(bk, dt, a->nq, a->nk, a->heads, a->head_dim, &fo, p);
}

int kern_attention_run(kern_stream_t *s, kern_dtype_t dt, kern_attention_args_t *a,
                       const kern_attn_opts_t *opts) {
    kern_backend_kind_t bk = kern_backend_kind(kern_stream_backend(s));
    kern_attn_plan_t p;
    if (kern_attention_plan(bk, dt, a->nq, a->nk, a->heads, a->head_dim, opts, &p)) return -1;
    if (p.path == KERN_ATTN_FUSED) return kern_dispatch(s, KERN_OP_ATTENTION, dt, a);
    if (p.path == KERN_ATTN_SDPA) {
        if (kern_dispatch(s, KERN_OP_ATTENTION_SDPA, dt, a) == 0) return 0;
        /* state: a shape first met inside a capture, which is tried again, not a failure of SDPA */
        if (!p.fallback || reel_err_code() == REEL_E_STATE) return -1;
        if (sdpa_fall_back(bk, dt, a, &p)) return -1;
    }
    if (a->nq == 0) return 0;
    char *scores = kern_stream_scratch(s, p.scratch_bytes);
    if (!scores) {
        char why[256];
        snprintf(why, sizeof why, "%s", reel_err_text());
        return reel_fail(REEL_E_INVALID, "attention (decomposed): %s", why);
    }
    char *probs = p.probs_bytes ? scores + p.scores_bytes : scores;
    for (int64_t h0 = 0; h0 < a->heads; h0 += p.heads) {
        int64_t hn = a->heads - h0 < p.heads ? a->heads - h0 : p.heads;
        for (int64_t i0 = 0; i0 < a->nq; i0 += p.rows) {
            int64_t m = a->nq - i0 < p.rows ? a->nq - i0 : p.rows;
            if (run_block(s, dt, a, &p, scores, probs, h0, hn, i0, m)) return -1;
        }
    }
    return 0;
}
