/* timestep_embed.cu -- TIMESTEP_EMBED: emb = [cos(t·ω_j), sin(t·ω_j)],
 * j < dim/2, ω_j = 10000^(−j/(dim/2)), t = t_scale·sigma[0], all in double
 * (like the CPU) and rounded once to T. sigma is read from device memory
 * when the kernel runs, so a captured graph embeds each replay's σ. */
#include "cuda_device.cuh"

template <typename T>
__global__ void timestep_embed_kernel(const float *sigma, T *emb, int64_t half, double t_scale, int64_t sstride) {
    /* blockIdx.y: the row (kern_timestep_args_t.rows), with its own σ */
    sigma += (int64_t)blockIdx.y * sstride;
    emb += (int64_t)blockIdx.y * 2 * half;
    const double t = t_scale * (double)sigma[0];
    KC_FOR(j, half) {
        double w = pow(10000.0, -(double)j / (double)half);
        double s, c;
        sincos(t * w, &s, &c);
        emb[j] = kc_store_f64<T>(c);
        emb[half + j] = kc_store_f64<T>(s);
    }
}

template <typename T>
static int timestep_embed_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_timestep_args_t *a = (const kern_timestep_args_t *)args;
    int64_t half = a->dim / 2, rows = a->rows > 1 ? a->rows : 1;
    if (half <= 0) return 0;
    if (rows > 65535) return reel_fail(REEL_E_LIMIT, "timestep_embed: %lld rows exceed the CUDA grid", (long long)rows);
    timestep_embed_kernel<T><<<dim3(kc_blocks(half, 128), (unsigned)rows), 128, 0, c->stream>>>(
        a->sigma, (T *)a->emb, half, (double)a->t_scale, a->sigma_stride);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_timestep_embed_f32(void *ctx, const void *args) {
    return timestep_embed_launch<float>(ctx, args);
}

extern "C" int kern_cuda_timestep_embed_bf16(void *ctx, const void *args) {
    return timestep_embed_launch<__nv_bfloat16>(ctx, args);
}
