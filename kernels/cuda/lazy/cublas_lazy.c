/* cublas_lazy.c -- cuBLAS and cuBLASLt opened on first use (dlopen), for
 * reelctl, reel-worker, the tests and the benches.
 *
 * Loading libcublasLt runs about 0.3 s of its static initialisation before
 * main, in every process that links it: every `reelctl stats`, every CPU
 * worker's start and every test binary paid it, though only the CUDA
 * backend calls cuBLAS. Those binaries link this file instead of -lcublas
 * -lcublasLt (Makefile, BIN_LDLIBS): each cuBLAS
 * function the CUDA backend calls is defined here with the header's own
 * prototype (the compiler checks they agree) and forwards to the library,
 * opened (the same sonames the linker would have recorded, found the same
 * way: the executable's rpath, then the system's) the first time one is
 * called. When they cannot be opened every call returns
 * CUBLAS_STATUS_NOT_INITIALIZED and cublasGetStatusString says why, so
 * the CUDA backend fails to start with that reason (and reelctl falls back
 * to the CPU as it does for any CUDA failure, unless --no-fallback; so
 * does the worker). Only the GPU check's tools (deploy/gpu_*.c) link
 * cuBLAS as before; this file is outside the kernels/cuda sources of
 * libreel.a, so the library never carries it. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define LAZY_STR_(x) #x
#define LAZY_STR(x) LAZY_STR_(x)
#define LT_SONAME "libcublasLt.so." LAZY_STR(CUBLAS_VER_MAJOR)
#define BLAS_SONAME "libcublas.so." LAZY_STR(CUBLAS_VER_MAJOR)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *lib_lt, *lib_blas;
static pthread_mutex_t why_mu = PTHREAD_MUTEX_INITIALIZER;
static char why[512]; /* the first reason cuBLAS is missing; written once, under why_mu */

static void set_why(const char *fmt, const char *a, const char *b) {
    pthread_mutex_lock(&why_mu);
    if (!why[0]) snprintf(why, sizeof why, fmt, a, b);
    pthread_mutex_unlock(&why_mu);
}

static const char *get_why(void) {
    pthread_mutex_lock(&why_mu);
    const char *w = why[0] ? why : NULL;
    pthread_mutex_unlock(&why_mu);
    return w;
}

static void open_libs(void) {
    lib_lt = dlopen(LT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib_lt) {
        set_why("cuBLAS could not be loaded: %s%s", dlerror(), "");
        return;
    }
    lib_blas = dlopen(BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib_blas) set_why("cuBLAS could not be loaded: %s%s", dlerror(), "");
}

/* The function `name` of the library (lt: cuBLASLt), cached in *slot;
 * NULL (and why[] says it) when it cannot be had. */
static void *lazy_sym(int lt, const char *name, void **slot) {
    void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (p) return p;
    pthread_once(&once, open_libs);
    void *lib = lt ? lib_lt : lib_blas;
    if (!lib) return NULL;
    p = dlsym(lib, name);
    if (!p) {
        set_why("cuBLAS has no %s (%s)", name, lt ? LT_SONAME : BLAS_SONAME);
        return NULL;
    }
    __atomic_store_n(slot, p, __ATOMIC_RELEASE);
    return p;
}

/* Defines `name` (params) forwarding (args) to the library's. */
#define LAZY(lt, name, params, args)                                                     \
    cublasStatus_t CUBLASWINAPI name params {                                           \
        static void *slot;                                                              \
        cublasStatus_t(*fn) params = (cublasStatus_t(*) params)lazy_sym(lt, #name, &slot); \
        return fn ? fn args : CUBLAS_STATUS_NOT_INITIALIZED;                            \
    }

LAZY(1, cublasLtCreate, (cublasLtHandle_t * h), (h))
LAZY(1, cublasLtDestroy, (cublasLtHandle_t h), (h))
LAZY(1, cublasLtMatmulDescCreate, (cublasLtMatmulDesc_t * d, cublasComputeType_t c, cudaDataType_t s), (d, c, s))
LAZY(1, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))
LAZY(1, cublasLtMatmulDescSetAttribute,
     (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n), (d, a, buf, n))
LAZY(1, cublasLtMatrixLayoutCreate, (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld),
     (l, t, rows, cols, ld))
LAZY(1, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))
LAZY(1, cublasLtMatrixLayoutSetAttribute,
     (cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void *buf, size_t n), (l, a, buf, n))
LAZY(1, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * p), (p))
LAZY(1, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))
LAZY(1, cublasLtMatmulPreferenceSetAttribute,
     (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *buf, size_t n), (p, a, buf, n))
LAZY(1, cublasLtMatmulAlgoGetHeuristic,
     (cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
      cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int want,
      cublasLtMatmulHeuristicResult_t results[], int *got),
     (h, op, a, b, c, d, pref, want, results, got))
LAZY(1, cublasLtMatmulAlgoCheck,
     (cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
      cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t *algo,
      cublasLtMatmulHeuristicResult_t *result),
     (h, op, a, b, c, d, algo, result))
LAZY(1, cublasLtMatmul,
     (cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A, cublasLtMatrixLayout_t ad,
      const void *B, cublasLtMatrixLayout_t bd, const void *beta, const void *C, cublasLtMatrixLayout_t cd, void *D,
      cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsn, cudaStream_t s),
     (h, op, alpha, A, ad, B, bd, beta, C, cd, D, dd, algo, ws, wsn, s))

LAZY(0, cublasCreate_v2, (cublasHandle_t * h), (h))
LAZY(0, cublasDestroy_v2, (cublasHandle_t h), (h))
LAZY(0, cublasSetWorkspace_v2, (cublasHandle_t h, void *ws, size_t n), (h, ws, n))
LAZY(0, cublasSetStream_v2, (cublasHandle_t h, cudaStream_t s), (h, s))
LAZY(0, cublasSetMathMode, (cublasHandle_t h, cublasMath_t m), (h, m))
LAZY(0, cublasGemmStridedBatchedEx,
     (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
      const void *A, cudaDataType at, int lda, long long int sa, const void *B, cudaDataType bt, int ldb,
      long long int sb, const void *beta, void *C, cudaDataType ct, int ldc, long long int sc, int batch,
      cublasComputeType_t comp, cublasGemmAlgo_t algo),
     (h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, comp, algo))

const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
    static void *slot;
    const char *(*fn)(cublasStatus_t) = (const char *(*)(cublasStatus_t))lazy_sym(0, "cublasGetStatusString", &slot);
    const char *w = get_why();
    /* NOT_INITIALIZED is what a missing library or function returns here */
    if (w && (!fn || status == CUBLAS_STATUS_NOT_INITIALIZED)) return w;
    return fn ? fn(status) : "cuBLAS is not loaded";
}

/* For tests/test_cublas_lazy.c: opens the libraries and resolves every
 * function above; 0, or -1 with the reason in *reason. */
int reel_cublas_lazy_check(const char **reason);
int reel_cublas_lazy_check(const char **reason) {
    static const struct {
        int lt;
        const char *name;
    } all[] = {
        { 1, "cublasLtCreate" }, { 1, "cublasLtDestroy" }, { 1, "cublasLtMatmulDescCreate" },
        { 1, "cublasLtMatmulDescDestroy" }, { 1, "cublasLtMatmulDescSetAttribute" },
        { 1, "cublasLtMatrixLayoutCreate" }, { 1, "cublasLtMatrixLayoutDestroy" },
        { 1, "cublasLtMatrixLayoutSetAttribute" },
        { 1, "cublasLtMatmulPreferenceCreate" }, { 1, "cublasLtMatmulPreferenceDestroy" },
        { 1, "cublasLtMatmulPreferenceSetAttribute" }, { 1, "cublasLtMatmulAlgoGetHeuristic" },
        { 1, "cublasLtMatmulAlgoCheck" }, { 1, "cublasLtMatmul" },
        { 0, "cublasCreate_v2" }, { 0, "cublasDestroy_v2" },
        { 0, "cublasSetWorkspace_v2" }, { 0, "cublasSetStream_v2" }, { 0, "cublasSetMathMode" },
        { 0, "cublasGemmStridedBatchedEx" }, { 0, "cublasGetStatusString" },
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        void *slot = NULL;
        if (!lazy_sym(all[i].lt, all[i].name, &slot)) {
            *reason = get_why();
            return -1;
        }
    }
    *reason = NULL;
    return 0;
}
