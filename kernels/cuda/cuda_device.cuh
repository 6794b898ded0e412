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

/* ---- 16-byte vectors: 8 values a load ----
 * The BF16 kernels move 8 values per 16-byte load and store (an F32 one
 * makes two), where the sizes and addresses allow it (kc_vec_ok); each
 * value's arithmetic is the scalar path's, so an element-wise kernel gives
 * the same bits either way. Row kernels reduce each thread's 8 values in
 * order, then as the scalar path does: a different but fixed order. */
#define KC_VEC 8

/* The gated residual's value, x + g·y, rounded twice (product, then sum) by
 * intrinsics the compiler never contracts into one FMA: every kernel that
 * updates a residual (gated_residual.cu, residual_norm.cu) gives the same
 * bits, whatever each kernel's code generation, and the CPU's bits in F32
 * (its C is compiled without contraction). A plain `x + g * y` was
 * contracted in one kernel and not in the other on an H200 (sm_90). */
static __device__ __forceinline__ float kc_residual(float x, float g, float y) {
    return __fadd_rn(x, __fmul_rn(g, y));
}

static inline bool kc_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Every pointer 16-byte aligned (NULL counts as aligned) and n a multiple of 8. */
static inline bool kc_vec_ok(int64_t n, const void *a, const void *b = NULL, const void *c = NULL,
                             const void *d = NULL) {
    return n % KC_VEC == 0 && kc_aligned16(a) && kc_aligned16(b) && kc_aligned16(c) && kc_aligned16(d);
}

static __device__ __forceinline__ void kc_load8(const float *p, float v[KC_VEC]) {
    const float4 a = reinterpret_cast<const float4 *>(p)[0], b = reinterpret_cast<const float4 *>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

static __device__ __forceinline__ void kc_load8(const __nv_bfloat16 *p, float v[KC_VEC]) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __bfloat1622float2(h[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
}

static __device__ __forceinline__ void kc_store8(float *p, const float v[KC_VEC]) {
    reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

/* Rounds each value to nearest even once, as kc_store<__nv_bfloat16>. */
static __device__ __forceinline__ void kc_store8(__nv_bfloat16 *p, const float v[KC_VEC]) {
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    *reinterpret_cast<uint4 *>(p) = u;
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

/* ---- y = f(x) value by value (GELU_TANH, SILU): F is a functor with
 * `__device__ float operator()(float) const`. Where n is a multiple of 8
 * and x, y are 16-byte aligned the values go 8 a load, through the same F:
 * the same bits either way. y may equal x. ---- */
template <typename T, typename F>
__global__ void kc_unary_kernel(const T *x, T *y, int64_t n) {
    const F f;
    KC_FOR(i, n) y[i] = kc_store<T>(f(kc_f32(x[i])));
}

template <typename T, typename F>
__global__ void kc_unary_vec_kernel(const T *x, T *y, int64_t chunks) {
    const F f;
    KC_FOR(c, chunks) {
        float v[KC_VEC];
        kc_load8(x + c * KC_VEC, v);
#pragma unroll
        for (int k = 0; k < KC_VEC; k++) v[k] = f(v[k]);
        kc_store8(y + c * KC_VEC, v);
    }
}

template <typename T, typename F>
static int kc_unary_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_unary_args_t *a = (const kern_unary_args_t *)args;
    if (a->n <= 0) return 0;
    if (kc_vec_ok(a->n, a->x, a->y))
        kc_unary_vec_kernel<T, F><<<kc_blocks(a->n / KC_VEC, KC_THREADS), KC_THREADS, 0, c->stream>>>(
            (const T *)a->x, (T *)a->y, a->n / KC_VEC);
    else
        kc_unary_kernel<T, F><<<kc_blocks(a->n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
            (const T *)a->x, (T *)a->y, a->n);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

#endif
