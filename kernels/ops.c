/* ops.c -- validating wrappers: check every tensor, fill the argument block,
 * dispatch (see ops.h). Checks happen here, at launch, so a recorded graph
 * replays with none. */
#include "ops.h"
#include "ops_args.h"
#include "ops_check.h"
#include "attention.h"
#include "base/error.h"
#include <math.h>
#include <string.h>

int kern_op_check(kern_stream_t *s, const char *op, const char *name, const kern_tensor_t *t, kern_dtype_t dt,
                  int ndim) {
    char d[96];
    if (!t || !t->data) return reel_fail(REEL_E_INVALID, "%s: %s is missing", op, name);
    if (t->dtype != dt)
        return reel_fail(REEL_E_INVALID, "%s: %s is %s, expected dtype %s", op, name,
                         kern_tensor_describe(t, d, sizeof d), kern_dtype_name(dt));
    if (ndim >= 0 && t->ndim != ndim)
        return reel_fail(REEL_E_INVALID, "%s: %s is %s, expected %d dims", op, name,
                         kern_tensor_describe(t, d, sizeof d), ndim);
    if (!kern_tensor_is_contiguous(t))
        return reel_fail(REEL_E_INVALID, "%s: %s (%s) is not contiguous", op, name,
                         kern_tensor_describe(t, d, sizeof d));
    if (t->device != kern_backend_device(kern_stream_backend(s)))
        return reel_fail(REEL_E_INVALID, "%s: %s lives on device %d, stream on %s", op, name,
                         t->device, kern_backend_device_name(kern_stream_backend(s)));
    return 0;
}

int kern_op_shape_fail(const char *op, const char *name, const kern_tensor_t *t, const char *want) {
    char d[96];
    return reel_fail(REEL_E_INVALID, "%s: %s is %s, expected %s", op, name, kern_tensor_describe(t, d, sizeof d), want);
}

/* Fails unless t is contiguous, on s's device, with dtype dt. */
static int check(kern_stream_t *s, const char *op, const char *name, const kern_tensor_t *t, kern_dtype_t dt) {
    return kern_op_check(s, op, name, t, dt, -1);
}

/* Last dim of t (1 for a scalar). */
static int64_t last_dim(const kern_tensor_t *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

/* A per-row-group parameter (ops_args.h, "Row groups") of width D: [D]
 * contiguous (shared by every group: *groups 1, *stride 0), or a 2-D view
 * [G, D] of G rows with unit column stride (a batch's own rows, say every
 * sample's row k of its modulation: *groups G, *stride its row stride).
 * Also checks dtype and device. */
static int group_param(kern_stream_t *s, const char *op, const char *name, const kern_tensor_t *p,
                       kern_dtype_t dt, int64_t D, int64_t *groups, int64_t *stride) {
    char d[96];
    if (!p || !p->data) return reel_fail(REEL_E_INVALID, "%s: %s is missing", op, name);
    if (p->dtype != dt)
        return reel_fail(REEL_E_INVALID, "%s: %s is %s, expected dtype %s", op, name,
                         kern_tensor_describe(p, d, sizeof d), kern_dtype_name(dt));
    if (p->device != kern_backend_device(kern_stream_backend(s)))
        return reel_fail(REEL_E_INVALID, "%s: %s lives on device %d, stream on %s", op, name, p->device,
                         kern_backend_device_name(kern_stream_backend(s)));
    if (kern_tensor_numel(p) == D && kern_tensor_is_contiguous(p)) {
        *groups = 1;
        *stride = 0;
        return 0;
    }
    if (p->ndim == 2 && p->shape[0] >= 1 && p->shape[1] == D && p->stride[1] == 1 && p->stride[0] >= D) {
        *groups = p->shape[0];
        *stride = p->stride[0];
        return 0;
    }
    return kern_op_shape_fail(op, name, p, "[D], or [G, D] rows with unit column stride and row stride >= D "
                                           "(one per row group)");
}

/* Row groups of `rows` rows from the groups of the parameters (1 where
 * shared): every per-group parameter must have the same G, dividing rows.
 * *group: rows per group, 0 for one group. */
static int row_groups(const char *op, int64_t rows, const int64_t *g, int n, int64_t *group) {
    int64_t G = 1;
    for (int i = 0; i < n; i++) {
        if (g[i] == 1) continue;
        if (G != 1 && g[i] != G)
            return reel_fail(REEL_E_INVALID, "%s: parameters for %lld and for %lld row groups (every per-group "
                             "parameter needs the same rows)", op, (long long)G, (long long)g[i]);
        G = g[i];
    }
    if (G > 1 && (rows < G || rows % G))
        return reel_fail(REEL_E_INVALID, "%s: %lld row groups do not divide %lld rows", op, (long long)G,
                         (long long)rows);
    *group = G > 1 ? rows / G : 0;
    return 0;
}

/* GEMM and GEMM_GELU: the same checks and argument block; group as in
 * kern_gemm_grouped (0: none). */
static int gemm(kern_stream_t *s, kern_op_t opc, const char *op, const kern_tensor_t *x,
                const kern_tensor_t *w, const kern_tensor_t *bias, kern_tensor_t *y, int64_t group) {
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "w", w, dt) || check(s, op, "y", y, dt) ||
        (bias && check(s, op, "bias", bias, dt)))
        return -1;
    if (w->ndim != 2) return kern_op_shape_fail(op, "w", w, "[N, K]");
    int64_t K = last_dim(x), N = w->shape[0];
    if (K <= 0 || N <= 0) return kern_op_shape_fail(op, "w", w, "[N, K] with N, K > 0");
    if (w->shape[1] != K) return kern_op_shape_fail(op, "w", w, "[N, K] with K = x's last dim");
    int64_t M = K ? kern_tensor_numel(x) / K : 0;
    if (last_dim(y) != N || kern_tensor_numel(y) != M * N) return kern_op_shape_fail(op, "y", y, "[M, N]");
    if (bias && kern_tensor_numel(bias) != N) return kern_op_shape_fail(op, "bias", bias, "[N]");
    if (group && M % group) /* group >= 1: kern_gemm_grouped */
        return reel_fail(REEL_E_INVALID, "%s: groups of %lld rows do not divide x's %lld rows", op,
                         (long long)group, (long long)M);
    if (group == M) group = 0;
    kern_gemm_args_t a = { .x = kern_tensor_ptr(x), .w = kern_tensor_ptr(w),
                           .bias = bias ? kern_tensor_ptr(bias) : NULL,
                           .y = kern_tensor_ptr(y), .M = M, .N = N, .K = K, .group = group };
    return kern_dispatch(s, opc, dt, &a);
}

int kern_gemm(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *w,
              const kern_tensor_t *bias, kern_tensor_t *y) {
    return gemm(s, KERN_OP_GEMM, "gemm", x, w, bias, y, 0);
}

int kern_gemm_gelu(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *w,
                   const kern_tensor_t *bias, kern_tensor_t *y) {
    return gemm(s, KERN_OP_GEMM_GELU, "gemm_gelu", x, w, bias, y, 0);
}

int kern_gemm_grouped(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *w,
                      const kern_tensor_t *bias, kern_tensor_t *y, int64_t group, bool gelu) {
    if (group < 1)
        return reel_fail(REEL_E_INVALID, "%s: groups of %lld rows: need at least 1", gelu ? "gemm_gelu" : "gemm",
                         (long long)group);
    return gelu ? gemm(s, KERN_OP_GEMM_GELU, "gemm_gelu", x, w, bias, y, group)
                : gemm(s, KERN_OP_GEMM, "gemm", x, w, bias, y, group);
}

static int norm(kern_stream_t *s, kern_op_t opc, const char *op, const kern_tensor_t *x,
                const kern_tensor_t *weight, const kern_tensor_t *bias, float eps,
                kern_tensor_t *y) {
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "y", y, dt) ||
        (weight && check(s, op, "weight", weight, dt)) || (bias && check(s, op, "bias", bias, dt)))
        return -1;
    int64_t D = last_dim(x);
    if (!kern_tensor_same_shape(x, y)) return kern_op_shape_fail(op, "y", y, "x's shape");
    if (weight && kern_tensor_numel(weight) != D) return kern_op_shape_fail(op, "weight", weight, "[D]");
    if (bias && kern_tensor_numel(bias) != D) return kern_op_shape_fail(op, "bias", bias, "[D]");
    if (bias && !weight) return reel_fail(REEL_E_INVALID, "%s: bias without weight", op);
    if (!(eps > 0)) return reel_fail(REEL_E_INVALID, "%s: eps must be > 0", op);
    kern_norm_args_t a = { .x = kern_tensor_ptr(x), .weight = weight ? kern_tensor_ptr(weight) : NULL,
                           .bias = bias ? kern_tensor_ptr(bias) : NULL, .y = kern_tensor_ptr(y),
                           .rows = D ? kern_tensor_numel(x) / D : 0, .dim = D, .eps = eps };
    return kern_dispatch(s, opc, dt, &a);
}

int kern_layernorm(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *weight,
                   const kern_tensor_t *bias, float eps, kern_tensor_t *y) {
    return norm(s, KERN_OP_LAYERNORM, "layernorm", x, weight, bias, eps, y);
}

int kern_rmsnorm(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *weight,
                 float eps, kern_tensor_t *y) {
    if (!weight) return reel_fail(REEL_E_INVALID, "rmsnorm: weight is missing");
    return norm(s, KERN_OP_RMSNORM, "rmsnorm", x, weight, NULL, eps, y);
}

int kern_modulate(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *shift,
                  const kern_tensor_t *scale, kern_tensor_t *y) {
    const char *op = "modulate";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "shift", shift, dt) ||
        check(s, op, "scale", scale, dt) || check(s, op, "y", y, dt))
        return -1;
    int64_t D = last_dim(x);
    if (!kern_tensor_same_shape(x, y)) return kern_op_shape_fail(op, "y", y, "x's shape");
    if (kern_tensor_numel(shift) != D) return kern_op_shape_fail(op, "shift", shift, "[D]");
    if (kern_tensor_numel(scale) != D) return kern_op_shape_fail(op, "scale", scale, "[D]");
    kern_modulate_args_t a = { .x = kern_tensor_ptr(x), .shift = kern_tensor_ptr(shift),
                               .scale = kern_tensor_ptr(scale), .y = kern_tensor_ptr(y),
                               .rows = D ? kern_tensor_numel(x) / D : 0, .dim = D };
    return kern_dispatch(s, KERN_OP_MODULATE, dt, &a);
}

int kern_gated_residual(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *y,
                        const kern_tensor_t *gate) {
    const char *op = "gated_residual";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "y", y, dt)) return -1;
    int64_t D = last_dim(x), gg = 1, gs = 0, group = 0;
    if (kern_tensor_numel(y) != kern_tensor_numel(x) || last_dim(y) != D)
        return kern_op_shape_fail(op, "y", y, "x's shape");
    const int64_t rows = D ? kern_tensor_numel(x) / D : 0;
    if (gate && (group_param(s, op, "gate", gate, dt, D, &gg, &gs) || row_groups(op, rows, &gg, 1, &group)))
        return -1;
    kern_residual_args_t a = { .x = kern_tensor_ptr(x), .y = kern_tensor_ptr(y),
                               .gate = gate ? kern_tensor_ptr(gate) : NULL,
                               .rows = rows, .dim = D, .group = group, .gate_stride = gs };
    return kern_dispatch(s, KERN_OP_GATED_RESIDUAL, dt, &a);
}

/* Whether the bytes of a and b overlap. */
static bool overlap(const kern_tensor_t *a, const kern_tensor_t *b) {
    const char *pa = kern_tensor_ptr(a), *pb = kern_tensor_ptr(b);
    return pa < pb + kern_tensor_bytes(b) && pb < pa + kern_tensor_bytes(a);
}

/* RESIDUAL_NORM: x += gate·y, then out = LN(x) modulated (p0 shift, p1
 * scale) or affine (p0 weight, p1 bias). */
static int residual_norm(kern_stream_t *s, const char *op, kern_tensor_t *x, const kern_tensor_t *y,
                         const kern_tensor_t *gate, const kern_tensor_t *p0, const kern_tensor_t *p1,
                         bool modulate, float eps, kern_tensor_t *out) {
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    const char *n0 = modulate ? "shift" : "weight", *n1 = modulate ? "scale" : "bias";
    if (check(s, op, "x", x, dt) || check(s, op, "y", y, dt) || check(s, op, "out", out, dt)) return -1;
    if (modulate && (!p0 || !p1)) return reel_fail(REEL_E_INVALID, "%s: %s is missing", op, p0 ? n1 : n0);
    int64_t D = last_dim(x);
    if (kern_tensor_numel(y) != kern_tensor_numel(x) || last_dim(y) != D)
        return kern_op_shape_fail(op, "y", y, "x's shape");
    if (!kern_tensor_same_shape(x, out)) return kern_op_shape_fail(op, "out", out, "x's shape");
    if (p1 && !p0) return reel_fail(REEL_E_INVALID, "%s: bias without weight", op);
    /* gate, and a modulation's shift and scale, per row group; an affine
     * LayerNorm's weight and bias are the model's: [D] */
    int64_t g[3] = { 1, 1, 1 }, st[3] = { 0, 0, 0 }, group = 0;
    const int64_t rows = D ? kern_tensor_numel(x) / D : 0;
    if ((gate && group_param(s, op, "gate", gate, dt, D, &g[0], &st[0])) ||
        (p0 && group_param(s, op, n0, p0, dt, D, &g[1], &st[1])) ||
        (p1 && group_param(s, op, n1, p1, dt, D, &g[2], &st[2])))
        return -1;
    if (!modulate && (g[1] > 1 || g[2] > 1))
        return reel_fail(REEL_E_INVALID, "%s: the LayerNorm's %s is [D], shared by every row", op,
                         g[1] > 1 ? n0 : n1);
    if (row_groups(op, rows, g, 3, &group)) return -1;
    if (!(eps > 0)) return reel_fail(REEL_E_INVALID, "%s: eps must be > 0", op);
    if (overlap(out, x) || overlap(out, y))
        return reel_fail(REEL_E_INVALID, "%s: out overlaps x or y (the fused pass reads them while it writes out)", op);
    kern_residual_norm_args_t a = { .x = kern_tensor_ptr(x), .y = kern_tensor_ptr(y),
                                    .gate = gate ? kern_tensor_ptr(gate) : NULL,
                                    .p0 = p0 ? kern_tensor_ptr(p0) : NULL, .p1 = p1 ? kern_tensor_ptr(p1) : NULL,
                                    .out = kern_tensor_ptr(out), .rows = rows,
                                    .dim = D, .eps = eps, .modulate = modulate, .group = group,
                                    .gate_stride = st[0], .p0_stride = st[1], .p1_stride = st[2] };
    return kern_dispatch(s, KERN_OP_RESIDUAL_NORM, dt, &a);
}

int kern_residual_layernorm_modulate(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *y,
                                     const kern_tensor_t *gate, const kern_tensor_t *shift,
                                     const kern_tensor_t *scale, float eps, kern_tensor_t *out) {
    return residual_norm(s, "residual_layernorm_modulate", x, y, gate, shift, scale, true, eps, out);
}

int kern_residual_layernorm(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *y,
                            const kern_tensor_t *gate, const kern_tensor_t *weight,
                            const kern_tensor_t *bias, float eps, kern_tensor_t *out) {
    return residual_norm(s, "residual_layernorm", x, y, gate, weight, bias, false, eps, out);
}

/* ADD and MUL: y = a (op) b over the same element count. */
/* repeat: a may repeat to b's size (kern_add_repeat). */
static int binary(kern_stream_t *s, kern_op_t opc, const char *op, const kern_tensor_t *a_, const kern_tensor_t *b_,
                  kern_tensor_t *y, bool repeat) {
    kern_dtype_t dt = a_ ? a_->dtype : KERN_F32;
    if (check(s, op, "a", a_, dt) || check(s, op, "b", b_, dt) || check(s, op, "y", y, dt))
        return -1;
    int64_t n = kern_tensor_numel(b_), na = kern_tensor_numel(a_);
    if (repeat ? (na < 1 || n % na) : na != n)
        return kern_op_shape_fail(op, "b", b_, repeat ? "a multiple of a's element count" : "a's element count");
    if (kern_tensor_numel(y) != n) return kern_op_shape_fail(op, "y", y, "b's element count");
    if (na != n && overlap(y, a_)) /* a repeated is read after y's first rows are written */
        return reel_fail(REEL_E_INVALID, "%s: y overlaps the repeated a", op);
    kern_binary_args_t a = { .a = kern_tensor_ptr(a_), .b = kern_tensor_ptr(b_),
                             .y = kern_tensor_ptr(y), .n = n, .a_period = na != n ? na : 0 };
    return kern_dispatch(s, opc, dt, &a);
}

int kern_add(kern_stream_t *s, const kern_tensor_t *a, const kern_tensor_t *b, kern_tensor_t *y) {
    return binary(s, KERN_OP_ADD, "add", a, b, y, false);
}

int kern_add_repeat(kern_stream_t *s, const kern_tensor_t *a, const kern_tensor_t *b, kern_tensor_t *y) {
    return binary(s, KERN_OP_ADD, "add", a, b, y, true);
}

int kern_mul(kern_stream_t *s, const kern_tensor_t *a, const kern_tensor_t *b, kern_tensor_t *y) {
    return binary(s, KERN_OP_MUL, "mul", a, b, y, false);
}

static int unary(kern_stream_t *s, kern_op_t opc, const char *op, const kern_tensor_t *x,
                 kern_tensor_t *y) {
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "y", y, dt)) return -1;
    if (kern_tensor_numel(y) != kern_tensor_numel(x)) return kern_op_shape_fail(op, "y", y, "x's element count");
    kern_unary_args_t a = { .x = kern_tensor_ptr(x), .y = kern_tensor_ptr(y), .n = kern_tensor_numel(x) };
    return kern_dispatch(s, opc, dt, &a);
}

int kern_gelu_tanh(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y) {
    return unary(s, KERN_OP_GELU_TANH, "gelu_tanh", x, y);
}

int kern_silu(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y) {
    return unary(s, KERN_OP_SILU, "silu", x, y);
}

int kern_attention(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                   const kern_tensor_t *v, int64_t heads, kern_tensor_t *o) {
    return kern_attention_ex(s, q, k, v, heads, o, NULL);
}

/* Validates here; the path, the blocks and the launches are attention.c's.
 * batch samples (kern_attention_batch): q and o of batch·nq rows, k and v
 * of batch·nk rows or, kv_shared, nk rows for all. */
static int attention(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k, const kern_tensor_t *v,
                     int64_t heads, kern_tensor_t *o, int64_t batch, bool kv_shared, const kern_attn_opts_t *opts) {
    const char *op = "attention";
    kern_dtype_t dt = q ? q->dtype : KERN_F32;
    if (check(s, op, "q", q, dt) || check(s, op, "k", k, dt) || check(s, op, "v", v, dt) ||
        check(s, op, "o", o, dt))
        return -1;
    if (q->ndim != 2) return kern_op_shape_fail(op, "q", q, "[Nq, H*d]");
    int64_t D = q->shape[1];
    if (heads <= 0 || D % heads) return reel_fail(REEL_E_INVALID, "%s: width %lld not divisible by %lld heads", op,
                                                 (long long)D, (long long)heads);
    if (k->ndim != 2 || k->shape[1] != D) return kern_op_shape_fail(op, "k", k, "[Nk, H*d]");
    if (!kern_tensor_same_shape(k, v)) return kern_op_shape_fail(op, "v", v, "k's shape");
    if (!kern_tensor_same_shape(q, o)) return kern_op_shape_fail(op, "o", o, "q's shape");
    if (batch < 1) return reel_fail(REEL_E_INVALID, "%s: a batch of %lld: must be >= 1", op, (long long)batch);
    if (q->shape[0] % batch)
        return reel_fail(REEL_E_INVALID, "%s: %lld samples do not divide q's %lld rows", op, (long long)batch,
                         (long long)q->shape[0]);
    if (!kv_shared && k->shape[0] % batch)
        return reel_fail(REEL_E_INVALID, "%s: %lld samples do not divide k's %lld rows (kv not shared)", op,
                         (long long)batch, (long long)k->shape[0]);
    const int64_t nk = kv_shared ? k->shape[0] : k->shape[0] / batch;
    if (nk < 1) return reel_fail(REEL_E_INVALID, "%s: no keys", op);
    int64_t d = D / heads;
    kern_attention_args_t a = { .q = kern_tensor_ptr(q), .k = kern_tensor_ptr(k),
                                .v = kern_tensor_ptr(v), .o = kern_tensor_ptr(o),
                                .nq = q->shape[0] / batch, .nk = nk, .heads = heads,
                                .head_dim = d, .scale = (float)(1.0 / sqrt((double)d)), .batch = 1 };
    if (batch == 1) return kern_attention_run(s, dt, &a, opts);
    /* The fused kernel takes the whole batch in one launch; the other paths
     * (SDPA, the decomposition) run sample by sample. */
    kern_attn_plan_t p;
    kern_backend_kind_t bk = kern_backend_kind(kern_stream_backend(s));
    if (kern_attention_plan(bk, dt, a.nq, a.nk, heads, d, opts, &p)) return -1;
    if (p.path == KERN_ATTN_FUSED) {
        a.batch = batch;
        a.kv_shared = kv_shared;
        return kern_dispatch(s, KERN_OP_ATTENTION, dt, &a);
    }
    const size_t esz = kern_dtype_size(dt);
    for (int64_t b = 0; b < batch; b++) {
        kern_attention_args_t ab = a;
        ab.q = (const char *)a.q + (size_t)(b * a.nq * D) * esz;
        ab.o = (char *)a.o + (size_t)(b * a.nq * D) * esz;
        if (!kv_shared) {
            ab.k = (const char *)a.k + (size_t)(b * nk * D) * esz;
            ab.v = (const char *)a.v + (size_t)(b * nk * D) * esz;
        }
        if (kern_attention_run(s, dt, &ab, opts)) return -1;
    }
    return 0;
}

int kern_attention_ex(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                      const kern_tensor_t *v, int64_t heads, kern_tensor_t *o,
                      const kern_attn_opts_t *opts) {
    return attention(s, q, k, v, heads, o, 1, false, opts);
}

int kern_attention_batch(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                         const kern_tensor_t *v, int64_t heads, kern_tensor_t *o, int64_t batch, bool kv_shared) {
    return attention(s, q, k, v, heads, o, batch, kv_shared, NULL);
}

int kern_rope3d(kern_stream_t *s, kern_tensor_t *x, int64_t heads, int64_t frames,
                int64_t rows, int64_t cols) {
    const char *op = "rope3d";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt)) return -1;
    if (x->ndim != 2 || x->shape[0] != frames * rows * cols)
        return kern_op_shape_fail(op, "x", x, "[F*Hp*Wp, H*d]");
    if (heads <= 0 || x->shape[1] % heads || (x->shape[1] / heads) % 2)
        return reel_fail(REEL_E_INVALID, "%s: head width must be even and divide the row", op);
    kern_rope3d_args_t a = { .x = kern_tensor_ptr(x), .heads = heads,
                             .head_dim = x->shape[1] / heads, .frames = frames,
                             .rows = rows, .cols = cols };
    return kern_dispatch(s, KERN_OP_ROPE3D, dt, &a);
}

int kern_layernorm_modulate(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *shift,
                            const kern_tensor_t *scale, float eps, kern_tensor_t *y) {
    const char *op = "layernorm_modulate";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "y", y, dt)) return -1;
    int64_t D = last_dim(x), g[2] = { 1, 1 }, st[2] = { 0, 0 }, group = 0;
    if (!kern_tensor_same_shape(x, y)) return kern_op_shape_fail(op, "y", y, "x's shape");
    const int64_t rows = D ? kern_tensor_numel(x) / D : 0;
    if (group_param(s, op, "shift", shift, dt, D, &g[0], &st[0]) ||
        group_param(s, op, "scale", scale, dt, D, &g[1], &st[1]) || row_groups(op, rows, g, 2, &group))
        return -1;
    if (!(eps > 0)) return reel_fail(REEL_E_INVALID, "%s: eps must be > 0", op);
    kern_norm_modulate_args_t a = { .x = kern_tensor_ptr(x), .shift = kern_tensor_ptr(shift),
                                    .scale = kern_tensor_ptr(scale), .y = kern_tensor_ptr(y),
                                    .rows = rows, .dim = D, .eps = eps, .group = group,
                                    .shift_stride = st[0], .scale_stride = st[1] };
    return kern_dispatch(s, KERN_OP_LAYERNORM_MODULATE, dt, &a);
}

int kern_rmsnorm_rope3d(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *weight,
                        float eps, int64_t heads, int64_t frames, int64_t rows, int64_t cols) {
    const char *op = "rmsnorm_rope3d";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "weight", weight, dt)) return -1;
    if (frames <= 0 || rows <= 0 || cols <= 0)
        return reel_fail(REEL_E_INVALID, "%s: grid %lldx%lldx%lld: every size must be >= 1", op, (long long)frames,
                         (long long)rows, (long long)cols);
    const int64_t T = frames * rows * cols; /* tokens of one sample */
    if (x->ndim != 2 || x->shape[0] < T || x->shape[0] % T)
        return kern_op_shape_fail(op, "x", x, "[B*F*Hp*Wp, H*d] (B samples' tokens, B >= 1)");
    if (heads <= 0 || x->shape[1] % heads || (x->shape[1] / heads) % 2)
        return reel_fail(REEL_E_INVALID, "%s: head width must be even and divide the row", op);
    if (kern_tensor_numel(weight) != x->shape[1]) return kern_op_shape_fail(op, "weight", weight, "[H*d]");
    if (!(eps > 0)) return reel_fail(REEL_E_INVALID, "%s: eps must be > 0", op);
    kern_rmsnorm_rope_args_t a = { .x = kern_tensor_ptr(x), .weight = kern_tensor_ptr(weight),
                                   .heads = heads, .head_dim = x->shape[1] / heads,
                                   .frames = frames, .rows = rows, .cols = cols, .eps = eps,
                                   .batch = x->shape[0] / T };
    return kern_dispatch(s, KERN_OP_RMSNORM_ROPE3D, dt, &a);
}

static int patch(kern_stream_t *s, kern_op_t opc, const char *op, const kern_tensor_t *latent,
                 const kern_tensor_t *tokens, const void *src, void *dst) {
    kern_dtype_t dt = latent ? latent->dtype : KERN_F32;
    if (check(s, op, "latent", latent, dt) || check(s, op, "tokens", tokens, dt)) return -1;
    /* one sample [C, F, H, W], or B of them [B, C, F, H, W] */
    const int o = latent->ndim == 5;
    if ((latent->ndim != 4 && !o) || latent->shape[o + 2] % 2 || latent->shape[o + 3] % 2 || (o && latent->shape[0] < 1))
        return kern_op_shape_fail(op, "latent", latent, "[C, F, H, W] or [B, C, F, H, W] with H, W even");
    int64_t Bn = o ? latent->shape[0] : 1, C = latent->shape[o], F = latent->shape[o + 1], H = latent->shape[o + 2],
            W = latent->shape[o + 3];
    if (tokens->ndim != 2 || tokens->shape[0] != Bn * F * (H / 2) * (W / 2) || tokens->shape[1] != 4 * C)
        return kern_op_shape_fail(op, "tokens", tokens, "[B*F*H/2*W/2, 4C]");
    kern_patch_args_t a = { .src = src, .dst = dst, .C = C, .F = F, .H = H, .W = W, .batch = Bn };
    return kern_dispatch(s, opc, dt, &a);
}

int kern_patchify(kern_stream_t *s, const kern_tensor_t *latent, kern_tensor_t *tokens) {
    if (!latent || !tokens) return reel_fail(REEL_E_INVALID, "patchify: missing tensor");
    return patch(s, KERN_OP_PATCHIFY, "patchify", latent, tokens, kern_tensor_ptr(latent),
                 kern_tensor_ptr(tokens));
}

int kern_unpatchify(kern_stream_t *s, const kern_tensor_t *tokens, kern_tensor_t *latent) {
    if (!latent || !tokens) return reel_fail(REEL_E_INVALID, "unpatchify: missing tensor");
    return patch(s, KERN_OP_UNPATCHIFY, "unpatchify", latent, tokens, kern_tensor_ptr(tokens),
                 kern_tensor_ptr(latent));
}

/* Per-step scalars are F32 device tensors with at least `n` elements. */
static int check_scalars(kern_stream_t *s, const char *op, const char *name,
                         const kern_tensor_t *t, int64_t n) {
    if (check(s, op, name, t, KERN_F32)) return -1;
    if (kern_tensor_numel(t) < n) return reel_fail(REEL_E_INVALID, "%s: %s needs at least %lld F32 values", op, name, (long long)n);
    return 0;
}

/* emb = sinusoid(t_scale·t[0]): t is σ (scaled by 1000) or the timestep itself. */
static int timestep_embed(kern_stream_t *s, const char *name, const kern_tensor_t *t, float t_scale,
                          kern_tensor_t *emb) {
    const char *op = "timestep_embed";
    kern_dtype_t dt = emb ? emb->dtype : KERN_F32;
    if (check_scalars(s, op, name, t, 1) || check(s, op, "emb", emb, dt)) return -1;
    int64_t dim = kern_tensor_numel(emb);
    if (dim < 2 || dim % 2) return kern_op_shape_fail(op, "emb", emb, "an even width");
    kern_timestep_args_t a = { .sigma = kern_tensor_ptr(t), .emb = kern_tensor_ptr(emb), .dim = dim, .t_scale = t_scale };
    return kern_dispatch(s, KERN_OP_TIMESTEP_EMBED, dt, &a);
}

/* Rows of sigmas, column col scaled by t_scale (kern_timestep_embed_rows,
 * kern_timestep_embed_rows_at). */
static int timestep_embed_rows(kern_stream_t *s, const kern_tensor_t *sigmas, int64_t col, float t_scale,
                               kern_tensor_t *emb) {
    const char *op = "timestep_embed";
    kern_dtype_t dt = emb ? emb->dtype : KERN_F32;
    if (check(s, op, "sigmas", sigmas, KERN_F32) || check(s, op, "emb", emb, dt)) return -1;
    if (sigmas->ndim != 2 || sigmas->shape[0] < 1 || sigmas->shape[1] < 1)
        return kern_op_shape_fail(op, "sigmas", sigmas, "[S, k] (row r's σ first)");
    const int64_t S = sigmas->shape[0];
    if (emb->ndim != 2 || emb->shape[0] != S || emb->shape[1] < 2 || emb->shape[1] % 2)
        return kern_op_shape_fail(op, "emb", emb, "[S, even width] (S: the sigmas' rows)");
    if (col < 0 || col >= sigmas->shape[1])
        return kern_op_shape_fail(op, "sigmas", sigmas, "[S, k] with k above the column read");
    kern_timestep_args_t a = { .sigma = (const float *)kern_tensor_ptr(sigmas) + col, .emb = kern_tensor_ptr(emb),
                               .dim = emb->shape[1], .t_scale = t_scale, .rows = S, .sigma_stride = sigmas->shape[1] };
    return kern_dispatch(s, KERN_OP_TIMESTEP_EMBED, dt, &a);
}

int kern_timestep_embed_rows(kern_stream_t *s, const kern_tensor_t *sigmas, kern_tensor_t *emb) {
    return timestep_embed_rows(s, sigmas, 0, 1000.0f, emb);
}

int kern_timestep_embed_rows_at(kern_stream_t *s, const kern_tensor_t *rows, int64_t col, kern_tensor_t *emb) {
    return timestep_embed_rows(s, rows, col, 1.0f, emb);
}

int kern_timestep_embed(kern_stream_t *s, const kern_tensor_t *sigma, kern_tensor_t *emb) {
    return timestep_embed(s, "sigma", sigma, 1000.0f, emb);
}

int kern_timestep_embed_at(kern_stream_t *s, const kern_tensor_t *at, kern_tensor_t *emb) {
    return timestep_embed(s, "t", at, 1.0f, emb);
}

int kern_multistep_update(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v, kern_tensor_t *h,
                          const kern_tensor_t *coef) {
    const char *op = "multistep";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "v", v, dt) || check(s, op, "h", h, dt) ||
        check_scalars(s, op, "coef", coef, KERN_MS_COEFS))
        return -1;
    int64_t n = kern_tensor_numel(x);
    if (kern_tensor_numel(v) != n) return kern_op_shape_fail(op, "v", v, "x's element count");
    if (kern_tensor_numel(h) != 3 * n) return kern_op_shape_fail(op, "h", h, "3 times x's element count");
    kern_multistep_args_t a = { .x = kern_tensor_ptr(x), .v = kern_tensor_ptr(v), .h = kern_tensor_ptr(h),
                                .coef = kern_tensor_ptr(coef), .n = n };
    return kern_dispatch(s, KERN_OP_MULTISTEP, dt, &a);
}

int kern_cfg_combine(kern_stream_t *s, const kern_tensor_t *vc, const kern_tensor_t *vu,
                     const kern_tensor_t *g, kern_tensor_t *v) {
    const char *op = "cfg_combine";
    kern_dtype_t dt = vc ? vc->dtype : KERN_F32;
    if (check(s, op, "vc", vc, dt) || check(s, op, "vu", vu, dt) || check(s, op, "v", v, dt) ||
        check_scalars(s, op, "g", g, 1))
        return -1;
    int64_t n = kern_tensor_numel(vc);
    if (kern_tensor_numel(vu) != n) return kern_op_shape_fail(op, "vu", vu, "vc's element count");
    if (kern_tensor_numel(v) != n) return kern_op_shape_fail(op, "v", v, "vc's element count");
    kern_cfg_args_t a = { .vc = kern_tensor_ptr(vc), .vu = kern_tensor_ptr(vu),
                          .g = kern_tensor_ptr(g), .v = kern_tensor_ptr(v), .n = n };
    return kern_dispatch(s, KERN_OP_CFG_COMBINE, dt, &a);
}

int kern_cfg_combine_rows(kern_stream_t *s, const kern_tensor_t *vc, const kern_tensor_t *vu,
                          const kern_tensor_t *g, kern_tensor_t *v) {
    const char *op = "cfg_combine";
    kern_dtype_t dt = vc ? vc->dtype : KERN_F32;
    if (check(s, op, "vc", vc, dt) || check(s, op, "vu", vu, dt) || check(s, op, "v", v, dt) ||
        check(s, op, "g", g, KERN_F32))
        return -1;
    const int64_t n = kern_tensor_numel(vc), S = kern_tensor_numel(g);
    if (kern_tensor_numel(vu) != n) return kern_op_shape_fail(op, "vu", vu, "vc's element count");
    if (kern_tensor_numel(v) != n) return kern_op_shape_fail(op, "v", v, "vc's element count");
    if (S < 1 || n % S)
        return reel_fail(REEL_E_INVALID, "%s: %lld guidance scales do not divide %lld elements", op, (long long)S,
                         (long long)n);
    kern_cfg_args_t a = { .vc = kern_tensor_ptr(vc), .vu = kern_tensor_ptr(vu), .g = kern_tensor_ptr(g),
                          .v = kern_tensor_ptr(v), .n = n, .group = S > 1 ? n / S : 0 };
    return kern_dispatch(s, KERN_OP_CFG_COMBINE, dt, &a);
}

int kern_euler_update(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                      const kern_tensor_t *sigmas) {
    const char *op = "euler";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "v", v, dt) ||
        check_scalars(s, op, "sigmas", sigmas, 2))
        return -1;
    int64_t n = kern_tensor_numel(x);
    if (kern_tensor_numel(v) != n) return kern_op_shape_fail(op, "v", v, "x's element count");
    kern_euler_args_t a = { .x = kern_tensor_ptr(x), .v = kern_tensor_ptr(v),
                            .sigmas = kern_tensor_ptr(sigmas), .n = n };
    return kern_dispatch(s, KERN_OP_EULER, dt, &a);
}

int kern_euler_update_rows(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                           const kern_tensor_t *sigmas) {
    const char *op = "euler";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "v", v, dt) || check(s, op, "sigmas", sigmas, KERN_F32)) return -1;
    if (sigmas->ndim != 2 || sigmas->shape[0] < 1 || sigmas->shape[1] < 2)
        return kern_op_shape_fail(op, "sigmas", sigmas, "[S, k >= 2] (row r: sample r's σ_i, σ_i+1)");
    const int64_t n = kern_tensor_numel(x), S = sigmas->shape[0];
    if (kern_tensor_numel(v) != n) return kern_op_shape_fail(op, "v", v, "x's element count");
    if (n % S)
        return reel_fail(REEL_E_INVALID, "%s: %lld samples' sigmas do not divide %lld elements", op, (long long)S,
                         (long long)n);
    kern_euler_args_t a = { .x = kern_tensor_ptr(x), .v = kern_tensor_ptr(v), .sigmas = kern_tensor_ptr(sigmas),
                            .n = n, .group = S > 1 ? n / S : 0, .sigma_stride = sigmas->shape[1] };
    return kern_dispatch(s, KERN_OP_EULER, dt, &a);
}

/* An SDE step's σ row: 3 values (σ_i, σ_{i+1}, σ_1: Euler's grid) or a
 * solver's grid's 4 (and t_i), which selects its form of std. */
static int check_sde_sigmas(kern_stream_t *s, const char *op, const kern_tensor_t *sigmas) {
    if (check_scalars(s, op, "sigmas", sigmas, 3)) return -1;
    if (kern_tensor_numel(sigmas) > 4)
        return kern_op_shape_fail(op, "sigmas", sigmas, "3 values (σ_i, σ_i+1, σ_1) or a grid's 4 (and t_i)");
    return 0;
}

int kern_sde_update(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                    const kern_tensor_t *sigmas, float eta, uint64_t seed, uint32_t step) {
    const char *op = "sde";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "v", v, dt) ||
        check_sde_sigmas(s, op, sigmas))
        return -1;
    int64_t n = kern_tensor_numel(x);
    if (kern_tensor_numel(v) != n) return kern_op_shape_fail(op, "v", v, "x's element count");
    if (!(eta >= 0) || !isfinite(eta)) return reel_fail(REEL_E_INVALID, "%s: eta must be finite and >= 0", op);
    kern_sde_args_t a = { .x = kern_tensor_ptr(x), .v = kern_tensor_ptr(v),
                          .sigmas = kern_tensor_ptr(sigmas), .eta = eta, .step = step,
                          .seed = seed, .n = n, .grid = kern_tensor_numel(sigmas) >= 4 };
    return kern_dispatch(s, KERN_OP_SDE, dt, &a);
}

void kern_sde_params_pack(float params[4], float eta, uint64_t seed, uint32_t step) {
    const uint32_t bits[3] = { (uint32_t)seed, (uint32_t)(seed >> 32), step };
    params[0] = eta;
    memcpy(&params[1], bits, sizeof bits);
}

int kern_sde_update_dev_mean(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                             const kern_tensor_t *sigmas, const kern_tensor_t *params, kern_tensor_t *mean) {
    const char *op = "sde_dev";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (check(s, op, "x", x, dt) || check(s, op, "v", v, dt) ||
        check_sde_sigmas(s, op, sigmas) || check_scalars(s, op, "params", params, 4) ||
        (mean && check(s, op, "mean", mean, dt)))
        return -1;
    int64_t n = kern_tensor_numel(x);
    if (kern_tensor_numel(v) != n) return kern_op_shape_fail(op, "v", v, "x's element count");
    if (mean && kern_tensor_numel(mean) != n) return kern_op_shape_fail(op, "mean", mean, "x's element count");
    /* eta is checked by the caller that packs it: the kernel cannot refuse. */
    kern_sde_args_t a = { .x = kern_tensor_ptr(x), .v = kern_tensor_ptr(v),
                          .sigmas = kern_tensor_ptr(sigmas), .params = kern_tensor_ptr(params),
                          .mean = mean ? kern_tensor_ptr(mean) : NULL, .n = n,
                          .grid = kern_tensor_numel(sigmas) >= 4 };
    return kern_dispatch(s, KERN_OP_SDE_DEV, dt, &a);
}

int kern_sde_update_dev(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                        const kern_tensor_t *sigmas, const kern_tensor_t *params) {
    return kern_sde_update_dev_mean(s, x, v, sigmas, params, NULL);
}
