/* attention.cu -- ATTENTION: o[i, h·d:(h+1)·d] = softmax_j(q_i,h·k_j,hᵀ·scale)·v_j,h
 * for every head h, without materialising the score matrix (flash-attention
 * style online softmax) and without scratch memory.
 *
 * One block of 4 warps per (tile of BQ = 4·R queries, head). Each warp owns
 * R query rows outright: it keeps their running max m, running sum l and
 * output accumulator in registers, so only the K/V tile loads need block
 * barriers. Per key tile of BK keys:
 *   1. the block stages K [BK, d] in shared memory (zero-padded rows);
 *   2. each lane scores keys lane, lane+32, ... against the warp's R rows
 *      (Q is read from shared memory as a broadcast, K with an odd row
 *      stride so the 32 lanes hit 32 different banks);
 *   3. per row: tile max by warp shuffle, m' = max(m, tile max),
 *      p = e^(s − m'), l = l·e^(m − m') + Σp, acc ·= e^(m − m'); p goes to
 *      the warp's slice of shared memory;
 *   4. the block stages V in the same buffer and each lane accumulates
 *      acc[r][c] += p[r][j]·v[j][c] for its columns c = lane, lane+32, ...
 * Finally o = acc / l, rounded once to T. All arithmetic is F32.
 *
 * Three tile shapes cover head_dim ≤ 64, ≤ 128, ≤ 256 with at most ~42 KB of
 * shared memory (under the 48 KB every launch may use without opting in);
 * larger head dims are refused. The first key tile always holds a real key
 * (nk ≥ 1), so m is finite from then on and padded keys (score −inf)
 * contribute exactly 0. */
#include "cuda_device.cuh"
#include <limits.h>
#include <math.h>

#define ATTN_WARPS 4

template <typename T, int DMAX, int R, int BK>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
attention_kernel(const T *q, const T *k, const T *v, T *o, int64_t nq, int64_t nk, int d,
                 int64_t ld, float scale, bool kv_shared) {
    /* blockIdx.z: the sample of a batch (kern_attention_args_t.batch) */
    q += (int64_t)blockIdx.z * nq * ld;
    o += (int64_t)blockIdx.z * nq * ld;
    if (!kv_shared) {
        k += (int64_t)blockIdx.z * nk * ld;
        v += (int64_t)blockIdx.z * nk * ld;
    }
    constexpr int BQ = ATTN_WARPS * R; /* query rows per block */
    constexpr int KPL = BK / 32;       /* keys scored per lane */
    constexpr int CPL = DMAX / 32;     /* output columns per lane */
    extern __shared__ __align__(16) float smem[]; /* float4 reads of Q */
    const int dq = (d + 3) & ~3; /* Q row stride: float4 reads, zero-padded */
    const int ks = dq + 1;       /* K/V row stride: odd, so conflict-free columns */
    float *sq = smem;            /* [BQ][dq] */
    float *skv = sq + BQ * dq;   /* [BK][ks] */
    float *sp = skv + BK * ks;   /* [BQ][BK] */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t q0 = (int64_t)blockIdx.x * BQ;
    const int64_t hoff = (int64_t)blockIdx.y * d;

    for (int i = threadIdx.x; i < BQ * dq; i += blockDim.x) {
        const int r = i / dq, c = i % dq;
        const int64_t qi = q0 + r;
        sq[i] = (qi < nq && c < d) ? kc_f32(q[qi * ld + hoff + c]) : 0.0f;
    }

    float m[R], l[R], acc[R][CPL];
#pragma unroll
    for (int r = 0; r < R; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int cc = 0; cc < CPL; cc++) acc[r][cc] = 0.0f;
    }
    const float *wq = sq + warp * R * dq; /* this warp's query rows */
    float *wp = sp + warp * R * BK;       /* this warp's probabilities */

    for (int64_t k0 = 0; k0 < nk; k0 += BK) {
        const int kn = (int)(nk - k0 < BK ? nk - k0 : BK); /* real keys in the tile */

        __syncthreads(); /* Q staged (first tile); V of the last tile consumed */
        for (int i = threadIdx.x; i < BK * dq; i += blockDim.x) {
            const int j = i / dq, c = i % dq;
            skv[j * ks + c] = (j < kn && c < d) ? kc_f32(k[(k0 + j) * ld + hoff + c]) : 0.0f;
        }
        __syncthreads();

        float s[R][KPL];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < KPL; t++) s[r][t] = 0.0f;
        for (int c = 0; c < dq; c += 4) {
            float kv[KPL][4];
#pragma unroll
            for (int t = 0; t < KPL; t++)
#pragma unroll
                for (int u = 0; u < 4; u++) kv[t][u] = skv[(t * 32 + lane) * ks + c + u];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float4 qv = *(const float4 *)(wq + r * dq + c);
#pragma unroll
                for (int t = 0; t < KPL; t++) {
                    s[r][t] = fmaf(qv.x, kv[t][0], s[r][t]);
                    s[r][t] = fmaf(qv.y, kv[t][1], s[r][t]);
                    s[r][t] = fmaf(qv.z, kv[t][2], s[r][t]);
                    s[r][t] = fmaf(qv.w, kv[t][3], s[r][t]);
                }
            }
        }

#pragma unroll
        for (int r = 0; r < R; r++) {
            float tmax = -INFINITY;
#pragma unroll
            for (int t = 0; t < KPL; t++) {
                s[r][t] = (t * 32 + lane < kn) ? s[r][t] * scale : -INFINITY;
                tmax = fmaxf(tmax, s[r][t]);
            }
            const float mnew = fmaxf(m[r], kc_warp_max(tmax));
            const float corr = expf(m[r] - mnew); /* 0 on the first tile */
            float psum = 0.0f;
#pragma unroll
            for (int t = 0; t < KPL; t++) {
                const float p = expf(s[r][t] - mnew);
                wp[r * BK + t * 32 + lane] = p;
                psum += p;
            }
            l[r] = l[r] * corr + kc_warp_sum(psum);
            m[r] = mnew;
#pragma unroll
            for (int cc = 0; cc < CPL; cc++) acc[r][cc] *= corr;
        }

        __syncthreads(); /* every warp is done with K */
        for (int i = threadIdx.x; i < BK * dq; i += blockDim.x) {
            const int j = i / dq, c = i % dq;
            skv[j * ks + c] = (j < kn && c < d) ? kc_f32(v[(k0 + j) * ld + hoff + c]) : 0.0f;
        }
        __syncthreads();

        for (int j = 0; j < kn; j++) {
            float vv[CPL];
#pragma unroll
            for (int cc = 0; cc < CPL; cc++) {
                const int c = cc * 32 + lane;
                vv[cc] = c < d ? skv[j * ks + c] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float p = wp[r * BK + j];
#pragma unroll
                for (int cc = 0; cc < CPL; cc++) acc[r][cc] = fmaf(p, vv[cc], acc[r][cc]);
            }
        }
    }

#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t qi = q0 + warp * R + r;
        if (qi >= nq) continue;
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int cc = 0; cc < CPL; cc++) {
            const int c = cc * 32 + lane;
            if (c < d) o[qi * ld + hoff + c] = kc_store<T>(acc[r][cc] * inv);
        }
    }
}

/* Launches one tile shape. Shared memory: Q [BQ][dq], K/V [BK][dq + 1],
 * P [BQ][BK] floats -- at most 42,112 bytes (DMAX 256: 8·256 + 32·257 +
 * 8·32 floats). */
template <typename T, int DMAX, int R, int BK>
static int attention_shape(const kern_cuda_ctx_t *c, const kern_attention_args_t *a) {
    const int BQ = ATTN_WARPS * R;
    const int d = (int)a->head_dim, dq = (d + 3) & ~3;
    const size_t smem = sizeof(float) * ((size_t)BQ * dq + (size_t)BK * (dq + 1) + (size_t)BQ * BK);
    const int64_t tiles = (a->nq + BQ - 1) / BQ;
    if (tiles > INT_MAX) return reel_fail(REEL_E_LIMIT, "attention: %lld queries exceed the CUDA grid",
                                          (long long)a->nq);
    dim3 grid((unsigned)tiles, (unsigned)a->heads, (unsigned)(a->batch > 1 ? a->batch : 1));
    attention_kernel<T, DMAX, R, BK><<<grid, ATTN_WARPS * 32, smem, c->stream>>>(
        (const T *)a->q, (const T *)a->k, (const T *)a->v, (T *)a->o, a->nq, a->nk, d,
        a->heads * a->head_dim, a->scale, a->kv_shared);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

template <typename T>
static int attention_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_attention_args_t *a = (const kern_attention_args_t *)args;
    if (a->nq <= 0 || a->heads <= 0) return 0;
    if (a->nk <= 0) return reel_fail(REEL_E_INVALID, "attention: no keys");
    if (a->heads > 65535)
        return reel_fail(REEL_E_LIMIT, "attention: %lld heads exceed the CUDA grid (65535)", (long long)a->heads);
    if (a->batch > 65535)
        return reel_fail(REEL_E_LIMIT, "attention: a batch of %lld exceeds the CUDA grid (65535)", (long long)a->batch);
    if (a->head_dim <= 64) return attention_shape<T, 64, 8, 64>(c, a);
    if (a->head_dim <= 128) return attention_shape<T, 128, 8, 32>(c, a);
    if (a->head_dim <= 256) return attention_shape<T, 256, 2, 32>(c, a);
    return reel_fail(REEL_E_LIMIT, "attention: head_dim %lld exceeds the CUDA kernel's limit of 256",
                     (long long)a->head_dim);
}

extern "C" int kern_cuda_attention_f32(void *ctx, const void *args) {
    return attention_launch<float>(ctx, args);
}

extern "C" int kern_cuda_attention_bf16(void *ctx, const void *args) {
    return attention_launch<__nv_bfloat16>(ctx, args);
}
