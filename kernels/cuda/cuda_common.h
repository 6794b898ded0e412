/* cuda_common.h -- the per-stream state CUDA kernels receive, and the one
 * error path of the CUDA backend.
 *
 * Every CUDA runtime or cuBLAS call goes through CUDA_CHECK / CUBLAS_CHECK:
 * on failure they record "<error> in `<statement>` (<function> at
 * <file>:<line>)" through reel_fail(REEL_E_INVALID, ) and return -1 from the enclosing
 * function. They never abort: a CUDA error is the caller's to handle.
 * Shared by the C files (gcc) and the .cu files (nvcc). */
#ifndef REEL_KERNELS_CUDA_COMMON_H
#define REEL_KERNELS_CUDA_COMMON_H

#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The GEMM plans of one stream (gemm_plan.c): cuBLASLt descriptors and
 * the heuristic's algorithm per GEMM shape. */
typedef struct kern_lt_plans kern_lt_plans_t;

/* What a CUDA kernel gets as `ctx`: one per kern_stream_t, used by one host
 * thread at a time. The cuBLAS handle is bound to `stream` and owns the
 * preallocated `blas_ws`, so cuBLAS never allocates (illegal in a capture).
 * The cuBLASLt handle `lt` and its plans are the stream's too, created and
 * destroyed with it; cuBLASLt matmuls take `blas_ws` as their workspace
 * (they are enqueued on the same stream as the cuBLAS calls, so stream
 * order keeps the two users of the buffer apart). */
typedef struct {
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    size_t blas_ws_bytes;
    int device;
    cublasLtHandle_t lt;
    kern_lt_plans_t *lt_plans;
    void *dnn;       /* cudnnHandle_t on `stream`, NULL without cuDNN (attention_cudnn.c) */
    void *dnn_plans; /* its SDPA plans */
} kern_cuda_ctx_t;

/* An empty plan cache for one stream; NULL with a message on out-of-memory.
 * Creates nothing on the device. */
kern_lt_plans_t *kern_cuda_lt_plans_new(void);
/* Releases every plan (host objects only: graphs that baked a plan's
 * algorithm keep working). NULL-safe; sets *p to NULL. */
void kern_cuda_lt_plans_destroy(kern_lt_plans_t **p);

/* Gives the stream a cuDNN handle bound to it and an empty SDPA plan cache
 * when Reel is built with cuDNN (HAVE_CUDNN); does nothing otherwise.
 * Cannot fail: without a usable cuDNN, c->dnn stays NULL and the SDPA
 * kernel says why when it is asked to run. */
void kern_cuda_dnn_open(kern_cuda_ctx_t *c);
/* Releases what kern_cuda_dnn_open made. NULL-safe. Cannot fail. */
void kern_cuda_dnn_close(kern_cuda_ctx_t *c);

/* Records a CUDA runtime failure and returns -1. Also clears the runtime's
 * last-error slot, so a later cudaGetLastError() after a kernel launch does
 * not report this (already reported) failure a second time. */
static inline int kern_cuda_fail(cudaError_t e, const char *stmt, const char *func,
                                 const char *file, int line) {
    (void)cudaGetLastError();
    return reel_fail(REEL_E_DEVICE, "CUDA error: %s (%s) in `%s` (%s at %s:%d)", cudaGetErrorString(e),
                     cudaGetErrorName(e), stmt, func, file, line);
}

/* Records a cuBLAS failure and returns -1. */
static inline int kern_cublas_fail(cublasStatus_t st, const char *stmt, const char *func,
                                   const char *file, int line) {
    return reel_fail(REEL_E_DEVICE, "cuBLAS error: %s in `%s` (%s at %s:%d)", cublasGetStatusString(st),
                     stmt, func, file, line);
}

#define CUDA_CHECK(expr)                                                          \
    do {                                                                          \
        cudaError_t kern_cuda_err_ = (expr);                                      \
        if (kern_cuda_err_ != cudaSuccess)                                        \
            return kern_cuda_fail(kern_cuda_err_, #expr, __func__, __FILE__, __LINE__); \
    } while (0)

#define CUBLAS_CHECK(expr)                                                        \
    do {                                                                          \
        cublasStatus_t kern_cublas_st_ = (expr);                                  \
        if (kern_cublas_st_ != CUBLAS_STATUS_SUCCESS)                             \
            return kern_cublas_fail(kern_cublas_st_, #expr, __func__, __FILE__, __LINE__); \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
