/* cuda_device.cuh -- device helpers shared by the .cu kernels: F32/BF16
 * loads and stores (all arithmetic is F32 or F64, storage is T), warp and
 * block sums, and launch geometry for grid-stride loops.
 *
 * Only .cu files include this. Nothing here can fail. */
#ifndef REEL_KERNELS_CUDA_DEVICE_CUH
#define REEL_KERNELS_CUDA_DEVICE_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "cuda_common.h"
#include "kernels_cuda.h"
#include "../ops_args.h"

/* Storage <-> compute. Narrowing rounds to nearest even, once. */
static __device__ __forceinline__ float kc_f32(float x) { return x; }
static __device__ __forceinline__ float kc_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T kc_store(float x);
template <> __device__ __forceinline__ float kc_store<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 kc_store<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

/* Double results (timestep embedding, SDE) go straight to the storage type,
 * so BF16 is rounded once and F32 matches the CPU's (float)double. */
template <typename T> __device__ __forceinline__ T kc_store_f64(double x);
template <> __device__ __forceinline__ float kc_store_f64<float>(double x) { return (float)x; }
template <> __device__ __forceinline__ __nv_bfloat16 kc_store_f64<__nv_bfloat16>(double x) {
    return __double2bfloat16(x);
}

static __device__ __forceinline__ float kc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float kc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum of v over the block; every thread gets the result. blockDim.x must be
 * a multiple of 32 (at most 1024); `sh` holds at least 33 floats. Contains
 * __syncthreads(): every thread of the block must call it. */
static __device__ __forceinline__ float kc_block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = kc_warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? sh[lane] : 0.0f;
        v = kc_warp_sum(v);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    v = sh[32];
    __syncthreads(); /* sh may be reused by the next call */
    return v;
}

/* Max of v over the block, as kc_block_sum (same rules for blockDim.x and
 * sh, and every thread must call it). */
static __device__ __forceinline__ float kc_block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = kc_warp_max(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? sh[lane] : -INFINITY;
        v = kc_warp_max(v);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    v = sh[32];
    __syncthreads(); /* sh may be reused by the next call */
    return v;
}

/* Threads per row of the row-wise kernels (norms): a multiple of 32, as
 * kc_block_sum needs, at most 256. */
static inline int kc_row_threads(int64_t dim) {
    int64_t t = (dim + 31) / 32 * 32;
    return (int)(t < 32 ? 32 : t > 256 ? 256 : t);
}

/* Threads per block of the elementwise kernels. */
#define KC_THREADS 256

/* Blocks for a grid-stride loop over n > 0 items: enough to fill any GPU,
 * few enough that gridDim.x never overflows (the loop covers the rest). */
static inline unsigned kc_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    const int64_t cap = 65536;
    return (unsigned)(b < cap ? b : cap);
}

/* Grid-stride loop index over [0, n), 64-bit. */
#define KC_FOR(i, n)                                                          \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

#endif
