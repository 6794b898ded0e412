/* kernels_cuda.h -- the host entry points of the CUDA kernels, one .cu each
 * (GEMM and GEMM_GELU: gemm.c, host code over cuBLASLt).
 *
 * Each is a kern_fn_t: `ctx` is the stream's kern_cuda_ctx_t, `args` the op's
 * argument block from ops_args.h. Each enqueues its work on ctx->stream and
 * returns 0, or -1 with a message (bad sizes, launch or cuBLAS failure).
 * Errors of the kernel itself surface at the next stream sync. They read
 * `args` only during the call, so a captured graph holds its own copy. */
#ifndef REEL_KERNELS_CUDA_KERNELS_H
#define REEL_KERNELS_CUDA_KERNELS_H

#ifdef __cplusplus
extern "C" {
#endif

int kern_cuda_gemm_f32(void *ctx, const void *args);
int kern_cuda_gemm_bf16(void *ctx, const void *args);
int kern_cuda_layernorm_f32(void *ctx, const void *args);
int kern_cuda_layernorm_bf16(void *ctx, const void *args);
int kern_cuda_rmsnorm_f32(void *ctx, const void *args);
int kern_cuda_rmsnorm_bf16(void *ctx, const void *args);
int kern_cuda_modulate_f32(void *ctx, const void *args);
int kern_cuda_modulate_bf16(void *ctx, const void *args);
int kern_cuda_gated_residual_f32(void *ctx, const void *args);
int kern_cuda_gated_residual_bf16(void *ctx, const void *args);
int kern_cuda_add_f32(void *ctx, const void *args);
int kern_cuda_add_bf16(void *ctx, const void *args);
int kern_cuda_gelu_tanh_f32(void *ctx, const void *args);
int kern_cuda_gelu_tanh_bf16(void *ctx, const void *args);
int kern_cuda_silu_f32(void *ctx, const void *args);
int kern_cuda_silu_bf16(void *ctx, const void *args);
int kern_cuda_attention_f32(void *ctx, const void *args);
int kern_cuda_attention_bf16(void *ctx, const void *args);
int kern_cuda_rope3d_f32(void *ctx, const void *args);
int kern_cuda_rope3d_bf16(void *ctx, const void *args);
int kern_cuda_patchify_f32(void *ctx, const void *args);
int kern_cuda_patchify_bf16(void *ctx, const void *args);
int kern_cuda_unpatchify_f32(void *ctx, const void *args);
int kern_cuda_unpatchify_bf16(void *ctx, const void *args);
int kern_cuda_timestep_embed_f32(void *ctx, const void *args);
int kern_cuda_timestep_embed_bf16(void *ctx, const void *args);
int kern_cuda_cfg_combine_f32(void *ctx, const void *args);
int kern_cuda_cfg_combine_bf16(void *ctx, const void *args);
int kern_cuda_euler_f32(void *ctx, const void *args);
int kern_cuda_euler_bf16(void *ctx, const void *args);
int kern_cuda_sde_f32(void *ctx, const void *args);
int kern_cuda_sde_bf16(void *ctx, const void *args);
int kern_cuda_sde_dev_f32(void *ctx, const void *args);
int kern_cuda_sde_dev_bf16(void *ctx, const void *args);
int kern_cuda_multistep_f32(void *ctx, const void *args);
int kern_cuda_multistep_bf16(void *ctx, const void *args);
int kern_cuda_gemm_batched_f32(void *ctx, const void *args);
int kern_cuda_gemm_batched_bf16(void *ctx, const void *args);
int kern_cuda_softmax_f32(void *ctx, const void *args);
int kern_cuda_softmax_bf16(void *ctx, const void *args);
int kern_cuda_gemm_gelu_f32(void *ctx, const void *args);
int kern_cuda_gemm_gelu_bf16(void *ctx, const void *args);
int kern_cuda_layernorm_modulate_f32(void *ctx, const void *args);
int kern_cuda_layernorm_modulate_bf16(void *ctx, const void *args);
int kern_cuda_residual_norm_f32(void *ctx, const void *args);
int kern_cuda_residual_norm_bf16(void *ctx, const void *args);
int kern_cuda_rmsnorm_rope3d_f32(void *ctx, const void *args);
int kern_cuda_rmsnorm_rope3d_bf16(void *ctx, const void *args);
/* The text encoder's (attention_bias.cu, mul.cu). */
int kern_cuda_attention_bias_f32(void *ctx, const void *args);
int kern_cuda_attention_bias_bf16(void *ctx, const void *args);
int kern_cuda_mul_f32(void *ctx, const void *args);
int kern_cuda_mul_bf16(void *ctx, const void *args);
/* attention_cudnn.c, in builds with cuDNN (HAVE_CUDNN) only. */
int kern_cuda_attention_sdpa_bf16(void *ctx, const void *args);

/* The video ops (ops_video.h): im2col3d.cu, upsample2x.cu, frame_interleave.cu. */
int kern_cuda_im2col3d_f32(void *ctx, const void *args);
int kern_cuda_im2col3d_bf16(void *ctx, const void *args);
int kern_cuda_upsample2x_f32(void *ctx, const void *args);
int kern_cuda_upsample2x_bf16(void *ctx, const void *args);
int kern_cuda_frame_interleave_f32(void *ctx, const void *args);
int kern_cuda_frame_interleave_bf16(void *ctx, const void *args);

#ifdef __cplusplus
}
#endif
#endif
