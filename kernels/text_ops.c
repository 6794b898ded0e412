/* text_ops.c -- validating wrappers of the text encoder's ops (ops.h
 * "Text-encoder ops"): check every tensor, fill the argument block,
 * dispatch. Kept apart from ops.c so the denoiser's ops and these grow
 * without touching each other (named apart from cpu/ops_text.c: one
 * archive holds both objects, and ar keys members by file name). */
#include "ops.h"
#include "ops_args.h"
#include "base/error.h"
#include <stdint.h>

/* Fails unless t is present, contiguous, on s's device, with dtype dt. */
static int check(kern_stream_t *s, const char *op, const char *name, const kern_tensor_t *t,
                 kern_dtype_t dt) {
    char d[96];
    if (!t || !t->data) return reel_fail(REEL_E_INVALID, "%s: %s is missing", op, name);
    if (t->dtype != dt)
        return reel_fail(REEL_E_INVALID, "%s: %s is %s, expected dtype %s", op, name,
                         kern_tensor_describe(t, d, sizeof d), kern_dtype_name(dt));
    if (!kern_tensor_is_contiguous(t))
        return reel_fail(REEL_E_INVALID, "%s: %s (%s) is not contiguous", op, name,
                         kern_tensor_describe(t, d, sizeof d));
    if (t->device != kern_backend_device(kern_stream_backend(s)))
        return reel_fail(REEL_E_INVALID, "%s: %s lives on device %d, stream on %s", op, name,
                         t->device, kern_backend_device_name(kern_stream_backend(s)));
    return 0;
}

static int shape_fail(const char *op, const char *name, const kern_tensor_t *t, const char *want) {
    char d[96];
    return reel_fail(REEL_E_INVALID, "%s: %s is %s, expected %s", op, name,
                     kern_tensor_describe(t, d, sizeof d), want);
}

int kern_attention_bias(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                        const kern_tensor_t *v, const kern_tensor_t *rel, int64_t heads,
                        int64_t nk_valid, float scale, kern_tensor_t *o) {
    const char *op = "attention_bias";
    kern_dtype_t dt = q ? q->dtype : KERN_F32;
    if (check(s, op, "q", q, dt) || check(s, op, "k", k, dt) || check(s, op, "v", v, dt) ||
        check(s, op, "o", o, dt) || (rel && check(s, op, "rel", rel, KERN_F32)))
        return -1;
    if (q->ndim != 2) return shape_fail(op, "q", q, "[Nq, H*d]");
    int64_t D = q->shape[1], nq = q->shape[0];
    if (heads <= 0 || D <= 0 || D % heads)
        return reel_fail(REEL_E_INVALID, "%s: width %lld not divisible by %lld heads", op,
                         (long long)D, (long long)heads);
    if (k->ndim != 2 || k->shape[1] != D) return shape_fail(op, "k", k, "[Nk, H*d]");
    if (!kern_tensor_same_shape(k, v)) return shape_fail(op, "v", v, "k's shape");
    if (!kern_tensor_same_shape(q, o)) return shape_fail(op, "o", o, "q's shape");
    int64_t nk = k->shape[0];
    if (nk < 1) return reel_fail(REEL_E_INVALID, "%s: no keys", op);
    if (nk_valid < 1 || nk_valid > nk)
        return reel_fail(REEL_E_INVALID, "%s: %lld valid keys of %lld (needs 1..Nk)", op,
                         (long long)nk_valid, (long long)nk);
    if (!(scale == scale) || scale > 3.0e38f || scale < -3.0e38f)
        return reel_fail(REEL_E_INVALID, "%s: scale must be finite", op);
    if (rel && (rel->ndim != 2 || rel->shape[0] != heads || rel->shape[1] != nq + nk - 1))
        return shape_fail(op, "rel", rel, "[H, Nq + Nk - 1]");
    kern_attention_bias_args_t a = { .q = kern_tensor_ptr(q), .k = kern_tensor_ptr(k),
                                     .v = kern_tensor_ptr(v),
                                     .rel = rel ? kern_tensor_ptr(rel) : NULL,
                                     .o = kern_tensor_ptr(o), .nq = nq, .nk = nk,
                                     .nk_valid = nk_valid, .heads = heads,
                                     .head_dim = D / heads, .scale = scale };
    return kern_dispatch(s, KERN_OP_ATTENTION_BIAS, dt, &a);
}

int kern_mul(kern_stream_t *s, const kern_tensor_t *a_, const kern_tensor_t *b_, kern_tensor_t *y) {
    const char *op = "mul";
    kern_dtype_t dt = a_ ? a_->dtype : KERN_F32;
    if (check(s, op, "a", a_, dt) || check(s, op, "b", b_, dt) || check(s, op, "y", y, dt))
        return -1;
    int64_t n = kern_tensor_numel(a_);
    if (kern_tensor_numel(b_) != n) return shape_fail(op, "b", b_, "a's element count");
    if (kern_tensor_numel(y) != n) return shape_fail(op, "y", y, "a's element count");
    kern_binary_args_t a = { .a = kern_tensor_ptr(a_), .b = kern_tensor_ptr(b_),
                             .y = kern_tensor_ptr(y), .n = n };
    return kern_dispatch(s, KERN_OP_MUL, dt, &a);
}
