/* cpu_vmath.h -- the CPU backend's element-wise transcendentals, 16 floats
 * at a time: e^x, GELU-tanh, SiLU and the row softmax.
 *
 * Written with GCC's vector extensions over a 16-float vector and nothing
 * but IEEE +, −, ×, ÷, fused multiply-add written out (cpu_vfma: C's
 * fmaf, rounded once), compares and bit operations (-std=c17 leaves no
 * other multiply-add contracted), so every lane computes the same bits
 * whether the compiler emits AVX-512, AVX2, SSE2 or NEON: a kernel compiled
 * for each (CPU_VEC_DISPATCH, runtime dispatch on x86: x86-64-v4, -v3 and
 * baseline) and an artifact compiled with its own flags agree byte for
 * byte (tests/test_vmath.c runs each level this machine has against the
 * baseline). The baseline level has no FMA instruction: there fmaf is a
 * libm call per lane, slow but exact. An array's tail goes through the
 * same vector code (copied into a padded vector), so an element's result
 * never depends on where it falls in its array: a request batched with
 * others gets the bits it gets alone.
 *
 * e^x: Cody-Waite reduction x = n·ln2 + r, |r| <= ln2/2, and Cephes'
 * degree-7 expf polynomial, both by fused multiply-adds (a third fewer
 * instructions than separate ones); 2^n applied as two exact powers so
 * results in the subnormal range round once. Measured against double exp
 * over every float in [−87.3, 88.7] (2,237,661,186 of them): at most 1 ulp
 * (tests/test_vmath.c holds it to 2). x above 88.72 gives +inf; results below 2^−126 are subnormals
 * rounded once, +0 from about −103.97; NaN gives NaN.
 *
 * GELU-tanh: 0.5·u·(1 + tanh(z)) = u·σ(2z) = u / (1 + e^(−2z)), z =
 * √(2/π)·(u + 0.044715·u³): one exponential and a division, no cancellation
 * near u → −∞ (where 1 + tanh z loses every digit in float). The
 * exponential is taken in base 2, its argument w = −2z·log2 e formed
 * directly from u (cpu_vgelu_tanh): 10 multiplies and fused multiply-adds
 * a vector where the base-e form took 15, and no less accurate (against a
 * long-double reference over every float with |u| <= 12: docs/BENCH.md,
 * "GELU in base 2").
 *
 * Only kernels/cpu/ and the CPU artifacts include this. */
#ifndef REEL_KERNELS_CPU_VMATH_H
#define REEL_KERNELS_CPU_VMATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Compiles the function for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 with
 * FMA) and baseline x86-64 and picks one at load time (an ifunc);
 * elsewhere, and under ASan or TSan (whose instrumented resolvers run
 * before the runtime is up and crash), one build for the compiler's flags
 * (the Makefile gives sanitizer builds -mfma where the machine has it):
 * the same bits either way. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(REEL_NO_VEC_DISPATCH) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define CPU_VEC_DISPATCH __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_VEC_DISPATCH

#endif

/* Kernels whose loops carry 16-float sums have two forms with the same
 * bits (the softmax and flash rows below, the direct attention in
 * cpu_attn.h): the 16-float one for AVX-512 and the half-vector one (_h)
 * for AVX2 and baseline x86-64, each slower on the other's hardware.
 * target_clones would compile one form for every level, so
 * CPU_BY_LEVEL_FNS(name, (params), wide, half) defines name's forms, each
 * compiled for its own level, and CPU_BY_LEVEL(name, (args)) calls the one
 * for the CPU it runs on (__builtin_cpu_supports reads what libgcc's
 * constructor found: called before it, the baseline runs, same bits). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(REEL_NO_VEC_DISPATCH)
#define CPU_BY_LEVEL_FNS(name, params, wide, half)                                \
    __attribute__((target("arch=x86-64-v4"))) static void name##_v4 params { \
        wide;                                                                 \
    }                                                                         \
    __attribute__((target("arch=x86-64-v3"))) static void name##_v3 params { \
        half;                                                                 \
    }                                                                         \
    static void name##_v1 params { half; }
#define CPU_BY_LEVEL(name, args)                      \
    (__builtin_cpu_supports("x86-64-v4")   ? name##_v4 args \
     : __builtin_cpu_supports("x86-64-v3") ? name##_v3 args \
                                           : name##_v1 args)
#elif defined(__AVX512F__) /* one build (REEL_NO_VEC_DISPATCH, clang, not x86): the form its flags suit */
#define CPU_BY_LEVEL_FNS(name, params, wide, half) static void name##_one params { wide; }
#define CPU_BY_LEVEL(name, args) name##_one args
#else
#define CPU_BY_LEVEL_FNS(name, params, wide, half) static void name##_one params { half; }
#define CPU_BY_LEVEL(name, args) name##_one args
#endif

/* Every helper is inlined into its caller, so a vector never crosses a call
 * (whose ABI would depend on the ISA: GCC's -Wpsabi warning, silenced in
 * the files that include this). */
#define CPU_VINLINE static inline __attribute__((always_inline))
#pragma GCC diagnostic ignored "-Wpsabi" /* to the end of the file: GCC reports it there */

#define CPU_VW 16 /* floats per vector */
typedef float cpu_vf __attribute__((vector_size(CPU_VW * 4)));
typedef int32_t cpu_vi __attribute__((vector_size(CPU_VW * 4)));
typedef uint32_t cpu_vu __attribute__((vector_size(CPU_VW * 4)));
typedef double cpu_vd __attribute__((vector_size(CPU_VW * 4))); /* 8 doubles */

/* v in every lane. For constants and once-per-row values: GCC 12 builds a
 * splat of a value loaded in a loop with 16 masked inserts, so hot loops
 * multiply by the scalar instead (vector · scalar broadcasts once). */
CPU_VINLINE cpu_vf cpu_vsplat(float v) {
    cpu_vf r = { v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v };
    return r;
}

CPU_VINLINE cpu_vf cpu_vload(const float *p) {
    cpu_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

CPU_VINLINE void cpu_vstore(float *p, cpu_vf v) { memcpy(p, &v, sizeof v); }

/* The first n < CPU_VW floats of p, the rest `fill`. */
CPU_VINLINE cpu_vf cpu_vload_part(const float *p, int64_t n, float fill) {
    float t[CPU_VW];
    for (int i = 0; i < CPU_VW; i++) t[i] = i < n ? p[i] : fill;
    return cpu_vload(t);
}

CPU_VINLINE void cpu_vstore_part(float *p, cpu_vf v, int64_t n) {
    float t[CPU_VW];
    cpu_vstore(t, v);
    memcpy(p, t, (size_t)n * sizeof(float));
}

/* 8 floats: half a vector. Shuffles and compares are written at this
 * width or lane by lane: on an AVX2 clone GCC splits a 16-float add or
 * multiply into two 8-float instructions, but expands a 16-float compare
 * or two-vector shuffle element by element (its -Wvector-operation-
 * performance), which made the AVX2 clone of the direct attention 9x
 * slower than the AVX-512 one. */
typedef float cpu_vh __attribute__((vector_size(CPU_VW * 2)));
typedef double cpu_vq __attribute__((vector_size(CPU_VW * 2))); /* 4 doubles */

CPU_VINLINE cpu_vh cpu_vhalf(const cpu_vf *v, int h) {
    cpu_vh r;
    memcpy(&r, (const char *)v + h * sizeof r, sizeof r);
    return r;
}

CPU_VINLINE void cpu_vset_half(cpu_vf *v, int h, cpu_vh x) { memcpy((char *)v + h * sizeof x, &x, sizeof x); }

CPU_VINLINE cpu_vh cpu_vhload(const float *p) {
    cpu_vh v;
    memcpy(&v, p, sizeof v);
    return v;
}

CPU_VINLINE void cpu_vhstore(float *p, cpu_vh v) { memcpy(p, &v, sizeof v); }

CPU_VINLINE cpu_vh cpu_vhsplat(float v) {
    cpu_vh r = { v, v, v, v, v, v, v, v };
    return r;
}

CPU_VINLINE cpu_vh cpu_vhmax2(cpu_vh a, cpu_vh b) { /* cpu_vmax2 on 8 lanes */
    cpu_vh r;
    for (int i = 0; i < CPU_VW / 2; i++) r[i] = b[i] > a[i] ? b[i] : a[i];
    return r;
}

/* Transposes the 8 x 8 floats r[0..7] (each 8 wide) in place: AVX's
 * unpack, shuffle and 128-bit permute pattern (24 one-instruction
 * shuffles on AVX2 and AVX-512). */
CPU_VINLINE void cpu_vtranspose8(cpu_vh *r) {
    cpu_vh t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[2 * i + 1] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 2; k++) {
            u[4 * i + 2 * k] = __builtin_shufflevector(t[4 * i + k], t[4 * i + k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[4 * i + 2 * k + 1] = __builtin_shufflevector(t[4 * i + k], t[4 * i + k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    }
    for (int i = 0; i < 4; i++) {
        r[i] = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        r[i + 4] = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

/* One round of cpu_vtranspose16: t[2i], t[2i + 1] interleave m[i] with
 * m[i + 8]. */
CPU_VINLINE void cpu_vtranspose16_round(const cpu_vf *m, cpu_vf *t) {
    for (int i = 0; i < CPU_VW / 2; i++) {
        t[2 * i] = __builtin_shufflevector(m[i], m[i + 8], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        t[2 * i + 1] = __builtin_shufflevector(m[i], m[i + 8], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14,
                                               30, 15, 31);
    }
}

/* Transposes the 16 x 16 floats m[0..15] in place: lane j of m[i] becomes
 * lane i of m[j]. Four rounds of interleaving m[i] with m[i + 8] (64 two-
 * vector shuffles, where element by element took 256 loads and stores),
 * back and forth between m and a second array (a 1 KB copy after each
 * round was a rep movs each: 8 of them per 16 query rows of the direct
 * attention). Moves bits only. */
CPU_VINLINE void cpu_vtranspose16(cpu_vf *m) {
    cpu_vf t[CPU_VW];
    cpu_vtranspose16_round(m, t);
    cpu_vtranspose16_round(t, m);
    cpu_vtranspose16_round(m, t);
    cpu_vtranspose16_round(t, m);
}

/* cpu_vtranspose16 as four 8 x 8 blocks, the off-diagonal two swapped:
 * for AVX2 (see cpu_vh), where the two-vector 16-float shuffles above go
 * element by element. The same bits. */
CPU_VINLINE void cpu_vtranspose16_h(cpu_vf *m) {
    cpu_vh b[4][8]; /* [0] rows 0-7 cols 0-7, [1] rows 0-7 cols 8-15, [2] rows 8-15 cols 0-7, [3] the rest */
    for (int i = 0; i < 8; i++) {
        b[0][i] = cpu_vhalf(&m[i], 0);
        b[1][i] = cpu_vhalf(&m[i], 1);
        b[2][i] = cpu_vhalf(&m[i + 8], 0);
        b[3][i] = cpu_vhalf(&m[i + 8], 1);
    }
    for (int k = 0; k < 4; k++) cpu_vtranspose8(b[k]);
    for (int i = 0; i < 8; i++) {
        cpu_vset_half(&m[i], 0, b[0][i]);
        cpu_vset_half(&m[i], 1, b[2][i]);
        cpu_vset_half(&m[i + 8], 0, b[1][i]);
        cpu_vset_half(&m[i + 8], 1, b[3][i]);
    }
}

/* max(a, b) per lane; a NaN b gives a. */
CPU_VINLINE cpu_vf cpu_vmax2(cpu_vf a, cpu_vf b) {
    cpu_vf r;
    for (int i = 0; i < CPU_VW; i++) r[i] = b[i] > a[i] ? b[i] : a[i];
    return r;
}

/* min(a, b) per lane; a NaN a gives a. */
CPU_VINLINE cpu_vf cpu_vmin2(cpu_vf a, cpu_vf b) {
    cpu_vf r;
    for (int i = 0; i < CPU_VW; i++) r[i] = a[i] > b[i] ? b[i] : a[i];
    return r;
}

/* a·b + c per lane, rounded once (C's fmaf): the same bits on every ISA.
 * One instruction a vector where the clone has FMA (x86-64-v3 and v4,
 * AArch64); a libm call per lane on an x86-64 without it. */
CPU_VINLINE cpu_vf cpu_vfma(cpu_vf a, cpu_vf b, cpu_vf c) {
    cpu_vf r;
    for (int i = 0; i < CPU_VW; i++) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
}

/* e^x's reduction and polynomial: x = n·ln2 + r, p = e^r; n returned as an
 * integer per lane. x is already clamped. */
CPU_VINLINE cpu_vf cpu_vexp_core(cpu_vf x, cpu_vi *ni) {
    /* n = round(x·log2 e): adding 1.5·2^23 leaves n in the low mantissa bits */
    const cpu_vf magic = cpu_vsplat(12582912.0f);
    cpu_vf t = cpu_vfma(x, cpu_vsplat(1.44269504088896341f), magic);
    cpu_vf n = t - magic;
    /* ln 2 in two parts: n·c1 is exact, so the first step is x − n·c1 */
    cpu_vf r = cpu_vfma(n, cpu_vsplat(-0.693359375f), x);
    r = cpu_vfma(n, cpu_vsplat(2.12194440e-4f), r);
    cpu_vf z = r * r;
    cpu_vf p = cpu_vsplat(1.9875691500e-4f);
    p = cpu_vfma(p, r, cpu_vsplat(1.3981999507e-3f));
    p = cpu_vfma(p, r, cpu_vsplat(8.3334519073e-3f));
    p = cpu_vfma(p, r, cpu_vsplat(4.1665795894e-2f));
    p = cpu_vfma(p, r, cpu_vsplat(1.6666665459e-1f));
    p = cpu_vfma(p, r, cpu_vsplat(5.0000001201e-1f));
    *ni = (cpu_vi)((cpu_vu)t - (cpu_vu)magic);
    return cpu_vfma(p, z, r) + cpu_vsplat(1.0f);
}

/* e^x per lane (see the header comment for range and error). */
CPU_VINLINE cpu_vf cpu_vexp(cpu_vf x) {
    const cpu_vf hi = cpu_vsplat(88.8f), lo = cpu_vsplat(-104.0f);
    x = cpu_vmax2(cpu_vmin2(x, hi), lo); /* NaN compares false: it stays */
    cpu_vi ni;
    cpu_vf p = cpu_vexp_core(x, &ni);
    /* 2^n as 2^n1·2^n2, each a normal float for n in [−150, 128] */
    cpu_vi n1 = ni >> 1, n2 = ni - n1; /* ni in [−150, 128] unless x is NaN */
    cpu_vf s1 = (cpu_vf)(((cpu_vu)n1 + 127u) << 23), s2 = (cpu_vf)(((cpu_vu)n2 + 127u) << 23);
    return p * s1 * s2;
}

/* 1 + e^x per lane, as 1 + cpu_vexp(x) to the bit: below x = −86 e^x is
 * under 2^−124 and 1 + it rounds to 1 whatever it is, so x is clamped
 * there and e^x taken as (2p)·2^(n−1), one power of two that stays normal
 * for n in [−124, 128] (the same bits as p·2^n1·2^n2 wherever that is
 * normal, and +inf where it overflows). */
CPU_VINLINE cpu_vf cpu_vexp_1p(cpu_vf x) {
    const cpu_vf hi = cpu_vsplat(88.8f), lo = cpu_vsplat(-86.0f);
    x = cpu_vmax2(cpu_vmin2(x, hi), lo);
    cpu_vi ni;
    cpu_vf p = cpu_vexp_core(x, &ni);
    cpu_vf s = (cpu_vf)(((cpu_vu)ni + 126u) << 23);
    return cpu_vsplat(1.0f) + (p + p) * s;
}

/* 1 + 2^w per lane, for GELU: w clamped to [−30, 128] (below −30, 1 +
 * 2^w rounds to 1 whatever 2^w is; from 128 it overflows); w = n + f, n =
 * round(w), f = w − n exact (Sterbenz) in [−0.5, 0.5]; 2·2^f by a degree-6
 * polynomial fitted to 2^f's relative error (at most 2.0e-9, with the
 * constant term 1 exact; the coefficients doubled, exactly), then times
 * 2^(n−1), one power of two, normal for n in [−30, 128]. */
CPU_VINLINE cpu_vf cpu_vexp2_1p(cpu_vf w) {
    w = cpu_vmax2(cpu_vmin2(w, cpu_vsplat(128.0f)), cpu_vsplat(-30.0f)); /* NaN stays */
    const cpu_vf magic = cpu_vsplat(12582912.0f); /* 1.5·2^23: w + magic rounds w to an integer */
    const cpu_vf t = w + magic;
    const cpu_vf f = w - (t - magic);
    cpu_vf q = cpu_vsplat(2 * 1.535336196e-4f);
    q = cpu_vfma(q, f, cpu_vsplat(2 * 1.339887502e-3f));
    q = cpu_vfma(q, f, cpu_vsplat(2 * 9.618436918e-3f));
    q = cpu_vfma(q, f, cpu_vsplat(2 * 5.550332367e-2f));
    q = cpu_vfma(q, f, cpu_vsplat(2 * 2.402264774e-1f));
    q = cpu_vfma(q, f, cpu_vsplat(2 * 6.931471825e-1f));
    q = cpu_vfma(q, f, cpu_vsplat(2.0f));
    const cpu_vi n = (cpu_vi)((cpu_vu)t - (cpu_vu)magic);
    return cpu_vsplat(1.0f) + q * (cpu_vf)(((cpu_vu)n + 126u) << 23);
}

/* GELU-tanh per lane: u / (1 + e^(−2z)) = u / (1 + 2^w), w = −2z·log2 e =
 * u·(B + A·u²), B = −2·√(2/π)·log2 e, A = 0.044715·B: the exponential's
 * argument in base 2 directly, so its reduction is one exact subtraction
 * (w's own rounding, three operations, is the error the base-e form had
 * in −2z). */
CPU_VINLINE cpu_vf cpu_vgelu_tanh(cpu_vf u) {
    const cpu_vf w = u * cpu_vfma(u * u, cpu_vsplat(-1.029432396e-1f), cpu_vsplat(-2.302208198f));
    return u / cpu_vexp2_1p(w);
}

/* SiLU per lane: u / (1 + e^(−u)); for a finite u whose e^(−u) overflows,
 * −0, the limit. SiLU(−inf) and GELU(−inf) are NaN (−inf / +inf), as
 * PyTorch's u·σ(u) gives. */
CPU_VINLINE cpu_vf cpu_vsilu(cpu_vf u) { return u / cpu_vexp_1p(-u); }

/* One lane's result for a scalar, the same bits as in an array. */
CPU_VINLINE float cpu_gelu_tanh1(float u) { return cpu_vgelu_tanh(cpu_vsplat(u))[0]; }

/* y[i] = f(x[i]) for i < n over the whole array, tail included; y may
 * equal x. */
#define CPU_VMAP(y, x, n, f)                                                   \
    do {                                                                       \
        int64_t i_ = 0;                                                        \
        for (; i_ + CPU_VW <= (n); i_ += CPU_VW)                               \
            cpu_vstore((y) + i_, f(cpu_vload((x) + i_)));                      \
        if (i_ < (n))                                                          \
            cpu_vstore_part((y) + i_, f(cpu_vload_part((x) + i_, (n) - i_, 0.0f)), (n) - i_); \
    } while (0)

CPU_VINLINE void cpu_gelu_tanh_n(float *y, const float *x, int64_t n) { CPU_VMAP(y, x, n, cpu_vgelu_tanh); }
CPU_VINLINE void cpu_silu_n(float *y, const float *x, int64_t n) { CPU_VMAP(y, x, n, cpu_vsilu); }
CPU_VINLINE void cpu_exp_n(float *y, const float *x, int64_t n) { CPU_VMAP(y, x, n, cpu_vexp); }

/* The 16 lanes' sum in double, in a fixed order, from s = lanes l + l + 8
 * (lo: l = 0-3, hi: 4-7): ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)),
 * by shuffles (a store and scalar adds stalled on the store). */
CPU_VINLINE double cpu_vsum_d4(cpu_vq lo, cpu_vq hi) {
    typedef double v2d __attribute__((vector_size(16)));
    const cpu_vq u = lo + hi;
    const v2d w = __builtin_shufflevector(u, u, 0, 2) + __builtin_shufflevector(u, u, 1, 3);
    return w[0] + w[1];
}

/* The same of a (lanes 0-7) and b (lanes 8-15). */
CPU_VINLINE double cpu_vsum_d(cpu_vd a, cpu_vd b) {
    const cpu_vd s = a + b;
    cpu_vq s0, s1; /* halves by memcpy: see cpu_vh */
    memcpy(&s0, &s, sizeof s0);
    memcpy(&s1, (const char *)&s + sizeof s0, sizeof s1);
    return cpu_vsum_d4(s0, s1);
}

/* The softmax's steps below take `half`, a constant where they are
 * inlined: false, the 16-float form (AVX-512); true, the same lanes' same
 * operations on half vectors (cpu_vh, 4-double sums), the form an AVX2
 * clone keeps in registers (rows of 1,024: 1.85x faster there, 1.2x slower
 * on AVX-512). The same bits either way (tests/test_vmath.c). */

/* max_j scale·s_j over a row of n >= 1 (−inf for a row of −inf). */
CPU_VINLINE float cpu_row_max(const float *s, int64_t n, float scale, const bool half) {
    float t[CPU_VW];
    int64_t j = 0;
    if (half) {
        cpu_vh m0 = cpu_vhsplat(-INFINITY), m1 = m0;
        for (; j + CPU_VW <= n; j += CPU_VW) {
            m0 = cpu_vhmax2(m0, cpu_vhload(s + j) * scale);
            m1 = cpu_vhmax2(m1, cpu_vhload(s + j + CPU_VW / 2) * scale);
        }
        cpu_vhstore(t, m0);
        cpu_vhstore(t + CPU_VW / 2, m1);
    } else {
        cpu_vf vs = cpu_vsplat(scale), mv = cpu_vsplat(-INFINITY);
        for (; j + CPU_VW <= n; j += CPU_VW) mv = cpu_vmax2(mv, cpu_vload(s + j) * vs);
        cpu_vstore(t, mv);
    }
    float m = t[0];
    for (int i = 1; i < CPU_VW; i++) m = t[i] > m ? t[i] : m;
    for (; j < n; j++) { /* the tail, element by element: the same products */
        float v = s[j] * scale;
        m = v > m ? v : m;
    }
    return m;
}

/* p_j = e^(scale·s_j − m) for j < n (p may equal s), and their sum in
 * double over 16 lanes in a fixed order (cpu_vsum_d's tree). */
CPU_VINLINE double cpu_exp_shift_sum(float *p, const float *s, int64_t n, float scale, float m, const bool half) {
    typedef float v4f __attribute__((vector_size(16)));
    const cpu_vf vs = cpu_vsplat(scale), vm = cpu_vsplat(m);
    cpu_vd acc0 = { 0 }, acc1 = { 0 };                   /* lanes 0-7, 8-15 */
    cpu_vq acc[4] = { { 0 }, { 0 }, { 0 }, { 0 } };      /* half: lanes 0-3, 4-7, 8-11, 12-15 */
    for (int64_t j = 0; j < n; j += CPU_VW) {
        int64_t k = n - j < CPU_VW ? n - j : CPU_VW;
        cpu_vf e;
        if (k == CPU_VW) {
            e = cpu_vexp(cpu_vload(s + j) * vs - vm);
            cpu_vstore(p + j, e);
        } else { /* padded lanes count 0 in the sum */
            e = cpu_vexp(cpu_vload_part(s + j, k, 0.0f) * vs - vm);
            cpu_vstore_part(p + j, e, k);
            for (int64_t i = k; i < CPU_VW; i++) e[i] = 0.0f;
        }
        if (half) {
            for (int q = 0; q < 4; q++) {
                v4f f;
                memcpy(&f, (const char *)&e + q * sizeof f, sizeof f);
                acc[q] += __builtin_convertvector(f, cpu_vq);
            }
        } else {
            cpu_vh lo, hi;
            memcpy(&lo, &e, sizeof lo);
            memcpy(&hi, (const char *)&e + sizeof lo, sizeof hi);
            acc0 += __builtin_convertvector(lo, cpu_vd);
            acc1 += __builtin_convertvector(hi, cpu_vd);
        }
    }
    if (half) { /* acc0, acc1 from their quarters: what cpu_vsum_d adds first, lane l + lane l + 8 */
        return cpu_vsum_d4(acc[0] + acc[2], acc[1] + acc[3]);
    }
    return cpu_vsum_d(acc0, acc1);
}

/* One softmax row: x_j = scale·s_j, m = max x_j, e_j = e^(x_j − m), summed
 * in double over 16 lanes, p_j = e_j·(float)(1/Σ). n >= 1; p may equal s.
 * Each step is a function of the row alone: the same row gives the same
 * bits wherever it is. */
CPU_VINLINE void cpu_softmax_row_do(float *p, const float *s, int64_t n, float scale, const bool half) {
    const float m = cpu_row_max(s, n, scale, half);
    const float inv = (float)(1.0 / cpu_exp_shift_sum(p, s, n, scale, m, half));
    const cpu_vf vi = cpu_vsplat(inv);
    int64_t j = 0;
    for (; j + CPU_VW <= n; j += CPU_VW) cpu_vstore(p + j, cpu_vload(p + j) * vi);
    for (; j < n; j++) p[j] *= inv;
}

CPU_VINLINE void cpu_softmax_row(float *p, const float *s, int64_t n, float scale) {
    cpu_softmax_row_do(p, s, n, scale, false);
}

CPU_VINLINE void cpu_softmax_row_h(float *p, const float *s, int64_t n, float scale) {
    cpu_softmax_row_do(p, s, n, scale, true);
}

/* The dispatched array forms (cpu_vec.c). y may equal x; p may equal s
 * (lds == ldp); rows of n >= 1. The kernels call GELU, SiLU and the
 * softmax; exp stands alone for tests/test_vmath.c (the softmax's own). */
void cpu_vec_gelu_tanh(float *y, const float *x, int64_t n);
void cpu_vec_silu(float *y, const float *x, int64_t n);
void cpu_vec_exp(float *y, const float *x, int64_t n);
void cpu_vec_softmax_rows(float *p, int64_t ldp, const float *s, int64_t lds, int64_t rows, int64_t n,
                          float scale);

#endif
