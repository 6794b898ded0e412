/* kernel.c -- test-only GEMM_GELU artifacts that misbehave on purpose, one
 * object per variant (ART_VARIANT_*), bundled under BUILD/artifacts-test,
 * never beside the examples. tests/test_artifacts.c uses them to prove the
 * gate:
 *   wrong   GELU by erf instead of tanh: a plausible, wrong kernel that the
 *           byte_equal gate must demote (artifact_parity) without it ever
 *           changing a served result
 *   close   the native result moved by one ulp: within its manifest's
 *           max_rel, so it is promoted, and its (different) bytes show
 *           that a graph captured it and replays it
 *   flaky   correct, but fails while REEL_TEST_ARTIFACT_FAIL is set (a
 *           runtime failure falls back to native and never demotes) and
 *           is one ulp off while REEL_TEST_ARTIFACT_WRONG is set (an
 *           artifact going wrong after its promotion, for shadow timing)
 *   greedy  correct, but asks more scratch than the native kernel's
 *           contract grants: ineligible
 *   abi2    correct, but its object says it speaks artifact ABI 1, not the host's */
#include "kernels/artifact_abi.h"
#include "kernels/cpu/cpu_gemm_tiles.h"
#include "kernels/cpu/cpu_vmath.h"
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const uint32_t reel_artifact_abi = KERN_ART_OBJECT_ABI;
static int (*fail)(const char *fmt, ...);

/* The native GELU-tanh's bits, one element at a time. */
static inline float gelu_tanh(float u) { return cpu_gelu_tanh1(u); }

static int run(void *ctx, const void *args) {
    (void)ctx;
    const kern_gemm_args_t *a = args;
    const float *x = a->x, *w = a->w, *bias = a->bias;
    float *y = a->y;
    const int64_t M = a->M, N = a->N, K = a->K;
#ifdef ART_VARIANT_flaky
    if (getenv("REEL_TEST_ARTIFACT_FAIL")) return fail("test-flaky-gemm-gelu: failing on purpose");
#endif
    if (M <= 0 || N <= 0) return 0;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return fail("sizes exceed the BLAS int range");
    const cpu_gemm_tiles_t t = cpu_gemm_tiles(M, N, K, a->group); /* the native kernel's sgemm calls */
    for (int64_t i = 0; i < cpu_gemm_tile_count(&t); i++) {
        int64_t r0, c0, rows, cols;
        cpu_gemm_tile(x, w, bias, y, M, N, K, &t, i, &r0, &c0, &rows, &cols);
    }
    for (int64_t i = 0; i < M * N; i++) {
#if defined(ART_VARIANT_wrong)
        y[i] = 0.5f * y[i] * (1.0f + erff(y[i] * 0.70710678f));
#elif defined(ART_VARIANT_close)
        y[i] = nextafterf(gelu_tanh(y[i]), INFINITY);
#elif defined(ART_VARIANT_flaky)
        y[i] = getenv("REEL_TEST_ARTIFACT_WRONG") ? nextafterf(gelu_tanh(y[i]), INFINITY)
                                                   : gelu_tanh(y[i]);
#else
        y[i] = gelu_tanh(y[i]);
#endif
    }
    return 0;
}

#ifdef ART_VARIANT_greedy
static size_t greedy_workspace(const void *args) {
    (void)args;
    return (size_t)1 << 20;
}
#endif

int reel_artifact_init(const kern_art_host_t *host) {
    fail = host->fail;
    const kern_impl_t impl = {
        .op = KERN_OP_GEMM_GELU, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
        .name = "gemm_gelu_test_variant", .fn = run, .args_size = sizeof(kern_gemm_args_t),
#ifdef ART_VARIANT_greedy
        .workspace_bytes = greedy_workspace,
#endif
        .capturable = true,
    };
    return host->register_kernel(host->reg, &impl);
}
