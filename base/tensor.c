/* tensor.c -- descriptor helpers and float narrowing (see tensor.h). */
#include "tensor.h"
#include <assert.h>
#include <stdio.h>
#include <string.h>

size_t kern_dtype_size(kern_dtype_t dt) { return dt == KERN_F32 ? 4 : 2; }

/* Whether any of n values has an exponent field >= lim, by adding to each
 * field what carries it into the word's top bit exactly when it is:
 * (w & mask) + add with add = (2^bits - lim) << shift. One or, one and and
 * one add a value, branch-free in blocks of SCAN_BLOCK (a trip count the
 * compiler turns into vector code at -O2; the early exit is per block). */
#define SCAN_BLOCK 64

static bool f32_field_reaches(const unsigned char *b, size_t n, uint32_t lim) {
    const uint32_t add = (256u - lim) << 23;
    uint32_t acc = 0;
    size_t i = 0;
    for (; i + SCAN_BLOCK <= n; i += SCAN_BLOCK) {
        uint32_t blk = 0;
        for (size_t j = 0; j < SCAN_BLOCK; j++) {
            uint32_t w;
            memcpy(&w, b + 4 * (i + j), 4);
            blk |= (w & 0x7f800000u) + add;
        }
        if ((acc |= blk) & 0x80000000u) return true;
    }
    for (; i < n; i++) {
        uint32_t w;
        memcpy(&w, b + 4 * i, 4);
        acc |= (w & 0x7f800000u) + add;
    }
    return (acc & 0x80000000u) != 0;
}

/* The same over 16-bit values: BF16 (8 exponent bits at 7) or F16 (5 at 10). */
static bool h16_field_reaches(const unsigned char *b, size_t n, uint16_t mask, uint16_t add) {
    uint16_t acc = 0;
    size_t i = 0;
    for (; i + SCAN_BLOCK <= n; i += SCAN_BLOCK) {
        uint16_t blk = 0;
        for (size_t j = 0; j < SCAN_BLOCK; j++) {
            uint16_t h;
            memcpy(&h, b + 2 * (i + j), 2);
            blk |= (uint16_t)((h & mask) + add);
        }
        if ((acc |= blk) & 0x8000u) return true;
    }
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, b + 2 * i, 2);
        acc |= (uint16_t)((h & mask) + add);
    }
    return (acc & 0x8000u) != 0;
}

bool kern_all_finite(const void *p, size_t n, kern_dtype_t dt) {
    /* an all-ones exponent: NaN or infinity */
    if (dt == KERN_F32) return !f32_field_reaches(p, n, 255u);
    if (dt == KERN_F16) return !h16_field_reaches(p, n, 0x7c00u, 1u << 10);
    return !h16_field_reaches(p, n, 0x7f80u, 1u << 7);
}

bool kern_all_below(const void *p, size_t n, kern_dtype_t dt, int e) {
    assert(e >= 0 && e < 128);
    /* 8 exponent bits, bias 127: |x| >= 2^e iff field >= 127 + e (<= 254) */
    const uint32_t lim = 127u + (uint32_t)e;
    if (dt == KERN_F32) return !f32_field_reaches(p, n, lim);
    if (dt == KERN_BF16) return !h16_field_reaches(p, n, 0x7f80u, (uint16_t)((256u - lim) << 7));
    /* F16: 5 exponent bits, bias 15; 31 is NaN or infinity */
    const uint32_t lim16 = 15u + (uint32_t)e < 31u ? 15u + (uint32_t)e : 31u;
    return !h16_field_reaches(p, n, 0x7c00u, (uint16_t)((32u - lim16) << 10));
}

const char *kern_dtype_name(kern_dtype_t dt) {
    switch (dt) {
    case KERN_F32: return "F32";
    case KERN_BF16: return "BF16";
    case KERN_F16: return "F16";
    default: return "?";
    }
}

int kern_dtype_parse(const char *name, kern_dtype_t *out) {
    if (!strcmp(name, "F32")) *out = KERN_F32;
    else if (!strcmp(name, "BF16")) *out = KERN_BF16;
    else if (!strcmp(name, "F16")) *out = KERN_F16;
    else return -1;
    return 0;
}

kern_tensor_t kern_tensor_make(void *data, kern_dtype_t dt, int device,
                               int ndim, const int64_t *shape) {
    assert(ndim >= 0 && ndim <= KERN_MAX_DIMS);
    kern_tensor_t t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    t.device = device;
    t.data = data;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = s;
        s *= shape[i];
    }
    return t;
}

int64_t kern_tensor_numel(const kern_tensor_t *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t kern_tensor_bytes(const kern_tensor_t *t) {
    return (size_t)kern_tensor_numel(t) * kern_dtype_size(t->dtype);
}

bool kern_tensor_is_contiguous(const kern_tensor_t *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool kern_tensor_same_shape(const kern_tensor_t *a, const kern_tensor_t *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

char *kern_shape_text(int ndim, const int64_t *shape, char *buf, size_t len) {
    if (!len) return buf;
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

char *kern_tensor_describe(const kern_tensor_t *t, char *buf, size_t len) {
    if (!len) return buf;
    size_t n = (size_t)snprintf(buf, len, "%s", kern_dtype_name(t->dtype));
    if (n < len) kern_shape_text(t->ndim, t->shape, buf + n, len - n);
    return buf;
}

kern_tensor_t kern_tensor_row(const kern_tensor_t *t, int64_t row) {
    assert(t->ndim >= 1 && row >= 0 && row < t->shape[0]);
    kern_tensor_t r = *t;
    r.offset += (size_t)(row * t->stride[0]) * kern_dtype_size(t->dtype);
    for (int i = 1; i < t->ndim; i++) {
        r.shape[i - 1] = t->shape[i];
        r.stride[i - 1] = t->stride[i];
    }
    r.ndim = t->ndim - 1;
    return r;
}

float kern_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kern_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float kern_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else { /* subnormal: renormalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kern_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;           /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;          /* overflow -> inf */
    if (a < 0x38800000u) {                                 /* subnormal or 0 */
        if (a < 0x33000000u) return sign;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* value / 2^-24, in 1..24 bits */
        uint32_t half = 1u << (shift - 1);
        uint32_t r = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = ((a >> 13) - (112u << 10));
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return sign | (uint16_t)r;
}
