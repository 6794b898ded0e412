/* text_ops.c -- validating wrappers of the text encoder's ops (ops.h
 * "Text-encoder ops"): check every tensor, fill the argument block,
 * dispatch. Kept apart from ops.c so the denoiser's ops and these grow
 * without touching each other (named apart from cpu/ops_text.c: one
 * archive holds both objects, and ar keys members by file name). */
#include "ops.h"
#include "ops_args.h"
#include "ops_check.h"
#include "base/error.h"
#include <stdint.h>

static int check(kern_stream_t *s, const char *op, const char *name, const kern_tensor_t *t, kern_dtype_t dt) {
    return kern_op_check(s, op, name, t, dt, -1);
}

int kern_attention_bias(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                        const kern_tensor_t *v, const kern_tensor_t *rel, int64_t heads,
                        int64_t nk_valid, float scale, kern_tensor_t *o) {
    const char *op = "attention_bias";
    kern_dtype_t dt = q ? q->dtype : KERN_F32;
    if (check(s, op, "q", q, dt) || check(s, op, "k", k, dt) || check(s, op, "v", v, dt) ||
        check(s, op, "o", o, dt) || (rel && check(s, op, "rel", rel, KERN_F32)))
        return -1;
    if (q->ndim != 2) return kern_op_shape_fail(op, "q", q, "[Nq, H*d]");
    int64_t D = q->shape[1], nq = q->shape[0];
    if (heads <= 0 || D <= 0 || D % heads)
        return reel_fail(REEL_E_INVALID, "%s: width %lld not divisible by %lld heads", op,
                         (long long)D, (long long)heads);
    if (k->ndim != 2 || k->shape[1] != D) return kern_op_shape_fail(op, "k", k, "[Nk, H*d]");
    if (!kern_tensor_same_shape(k, v)) return kern_op_shape_fail(op, "v", v, "k's shape");
    if (!kern_tensor_same_shape(q, o)) return kern_op_shape_fail(op, "o", o, "q's shape");
    int64_t nk = k->shape[0];
    if (nk < 1) return reel_fail(REEL_E_INVALID, "%s: no keys", op);
    if (nk_valid < 1 || nk_valid > nk)
        return reel_fail(REEL_E_INVALID, "%s: %lld valid keys of %lld (needs 1..Nk)", op,
                         (long long)nk_valid, (long long)nk);
    if (!(scale == scale) || scale > 3.0e38f || scale < -3.0e38f)
        return reel_fail(REEL_E_INVALID, "%s: scale must be finite", op);
    if (rel && (rel->ndim != 2 || rel->shape[0] != heads || rel->shape[1] != nq + nk - 1))
        return kern_op_shape_fail(op, "rel", rel, "[H, Nq + Nk - 1]");
    kern_attention_bias_args_t a = { .q = kern_tensor_ptr(q), .k = kern_tensor_ptr(k),
                                     .v = kern_tensor_ptr(v),
                                     .rel = rel ? kern_tensor_ptr(rel) : NULL,
                                     .o = kern_tensor_ptr(o), .nq = nq, .nk = nk,
                                     .nk_valid = nk_valid, .heads = heads,
                                     .head_dim = D / heads, .scale = scale };
    return kern_dispatch(s, KERN_OP_ATTENTION_BIAS, dt, &a);
}
