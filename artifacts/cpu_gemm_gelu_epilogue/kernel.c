/* kernel.c -- artifact cpu-gemm-gelu-epilogue: GEMM_GELU on the CPU with
 * its GELU-tanh epilogue spread over every core.
 *
 * The native kernel (kernels/cpu/ops_gemm.c) cuts y into tiles (bias, one
 * sgemm onto it, the GELU-tanh of cpu_vmath.h while the tile is in cache)
 * and runs them on its thread pool. Here the tiles' bias and sgemm are the
 * native kernel's, call for call (cpu_gemm_tiles.h), run one after the
 * other, and the epilogue runs afterwards in slices on one thread per core:
 * an example of an artifact, no longer faster than the native kernel. Every
 * element goes through the same operations in the same order (the GELU is
 * element-wise, so who computes it does not matter), so the manifest asks
 * for byte_equal; the parity gate proves it per kernel key on live inputs.
 * Outputs under 256 Ki elements stay on the calling thread (the threads
 * would cost more than they save: OpenBLAS's pool is still spinning after
 * the GEMM). A thread that cannot be started is not a failure: its slice
 * runs inline. */
#include "kernels/artifact_abi.h"
#include "kernels/cpu/cpu_gemm_tiles.h"
#include "kernels/cpu/cpu_vmath.h"
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

const uint32_t reel_artifact_abi = KERN_ART_OBJECT_ABI;
static int (*fail)(const char *fmt, ...);
static long cpus = 1; /* cores online, read once at init (sysconf reads a file) */

#define MAX_THREADS 16
#define MIN_PARALLEL ((int64_t)1 << 18)

/* The native GELU-tanh: cpu_vmath.h's, whose bits do not depend on the ISA
 * it is compiled for or on where an element falls in its slice. */
CPU_VEC_DISPATCH static void gelu_range(float *y, int64_t n) { cpu_gelu_tanh_n(y, y, n); }

typedef struct { float *y; int64_t lo, hi; } slice_t;

static void *gelu_slice(void *p) {
    const slice_t *s = p;
    gelu_range(s->y + s->lo, s->hi - s->lo);
    return NULL;
}

static void gelu_all(float *y, int64_t n) {
    int p = n < MIN_PARALLEL || cpus < 2 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
    slice_t sl[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = { false };
    for (int t = 0; t < p; t++) {
        sl[t] = (slice_t){ y, n * t / p, n * (t + 1) / p };
        if (t > 0) started[t] = pthread_create(&th[t], NULL, gelu_slice, &sl[t]) == 0;
    }
    gelu_slice(&sl[0]);
    for (int t = 1; t < p; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else gelu_slice(&sl[t]);
    }
}

static int gemm_gelu_par(void *ctx, const void *args) {
    (void)ctx;
    const kern_gemm_args_t *a = args;
    const float *x = a->x, *w = a->w, *bias = a->bias;
    float *y = a->y;
    const int64_t M = a->M, N = a->N, K = a->K;
    if (M <= 0 || N <= 0) return 0;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return fail("gemm_gelu_epilogue: M=%lld N=%lld K=%lld exceed the BLAS int range",
                    (long long)M, (long long)N, (long long)K);
    const cpu_gemm_tiles_t t = cpu_gemm_tiles(M, N, K, a->group); /* the native kernel's calls, one by one */
    for (int64_t i = 0; i < cpu_gemm_tile_count(&t); i++) {
        int64_t r0, c0, rows, cols;
        cpu_gemm_tile(x, w, bias, y, M, N, K, &t, i, &r0, &c0, &rows, &cols);
    }
    gelu_all(y, M * N);
    return 0;
}

int reel_artifact_init(const kern_art_host_t *host) {
    fail = host->fail;
    cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const kern_impl_t impl = {
        .op = KERN_OP_GEMM_GELU, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
        .name = "gemm_gelu_epilogue_cpu", .fn = gemm_gelu_par,
        .args_size = sizeof(kern_gemm_args_t), .workspace_bytes = NULL, .capturable = true,
    };
    return host->register_kernel(host->reg, &impl);
}
