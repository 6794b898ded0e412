/* register_cuda.c -- lists every CUDA kernel for the registry (see
 * registry.h, kern_cuda_kernels): F32 and BF16 for every op, no workspace
 * (no kernel uses the stream arena; the decomposed attention's score block
 * is the op's, kernels/attention.c; the cuBLAS(Lt) GEMMs use the stream's
 * preallocated cuBLAS workspace), all capturable except SDE, whose seed
 * and step are launch arguments a graph would bake in (SDE_DEV reads them
 * from device memory and is capturable). */
#include "kernels_cuda.h"
#include "../ops_args.h"
#include "../ops_video_args.h"

/* One entry: OP is the kern_op_t suffix, stem the kernel's file stem. */
#define CUDA_KERNEL(OP, stem, DT, dt, args_t, cap)                            \
    {                                                                         \
        .op = KERN_OP_##OP, .backend = KERN_BACKEND_CUDA, .dtype = KERN_##DT, \
        .name = "cuda_" #stem "_" #dt, .fn = kern_cuda_##stem##_##dt,         \
        .args_size = sizeof(args_t), .workspace_bytes = NULL, .capturable = cap \
    }

#define CUDA_KERNEL_PAIR(OP, stem, args_t, cap) \
    CUDA_KERNEL(OP, stem, F32, f32, args_t, cap), CUDA_KERNEL(OP, stem, BF16, bf16, args_t, cap)

static const kern_impl_t cuda_kernels[] = {
    CUDA_KERNEL_PAIR(GEMM, gemm, kern_gemm_args_t, true),
    CUDA_KERNEL_PAIR(LAYERNORM, layernorm, kern_norm_args_t, true),
    CUDA_KERNEL_PAIR(RMSNORM, rmsnorm, kern_norm_args_t, true),
    CUDA_KERNEL_PAIR(MODULATE, modulate, kern_modulate_args_t, true),
    CUDA_KERNEL_PAIR(GATED_RESIDUAL, gated_residual, kern_residual_args_t, true),
    CUDA_KERNEL_PAIR(ADD, add, kern_binary_args_t, true),
    CUDA_KERNEL_PAIR(GELU_TANH, gelu_tanh, kern_unary_args_t, true),
    CUDA_KERNEL_PAIR(SILU, silu, kern_unary_args_t, true),
    CUDA_KERNEL_PAIR(ATTENTION, attention, kern_attention_args_t, true),
    CUDA_KERNEL_PAIR(ROPE3D, rope3d, kern_rope3d_args_t, true),
    CUDA_KERNEL_PAIR(PATCHIFY, patchify, kern_patch_args_t, true),
    CUDA_KERNEL_PAIR(UNPATCHIFY, unpatchify, kern_patch_args_t, true),
    CUDA_KERNEL_PAIR(TIMESTEP_EMBED, timestep_embed, kern_timestep_args_t, true),
    CUDA_KERNEL_PAIR(CFG_COMBINE, cfg_combine, kern_cfg_args_t, true),
    CUDA_KERNEL_PAIR(EULER, euler, kern_euler_args_t, true),
    CUDA_KERNEL_PAIR(SDE, sde, kern_sde_args_t, false),
    CUDA_KERNEL_PAIR(SDE_DEV, sde_dev, kern_sde_args_t, true),
    CUDA_KERNEL_PAIR(MULTISTEP, multistep, kern_multistep_args_t, true),
    CUDA_KERNEL_PAIR(GEMM_BATCHED, gemm_batched, kern_gemm_batched_args_t, true),
    CUDA_KERNEL_PAIR(SOFTMAX, softmax, kern_softmax_args_t, true),
    CUDA_KERNEL_PAIR(GEMM_GELU, gemm_gelu, kern_gemm_args_t, true),
    CUDA_KERNEL_PAIR(LAYERNORM_MODULATE, layernorm_modulate, kern_norm_modulate_args_t, true),
    CUDA_KERNEL_PAIR(RESIDUAL_NORM, residual_norm, kern_residual_norm_args_t, true),
    CUDA_KERNEL_PAIR(RMSNORM_ROPE3D, rmsnorm_rope3d, kern_rmsnorm_rope_args_t, true),
    CUDA_KERNEL_PAIR(ATTENTION_BIAS, attention_bias, kern_attention_bias_args_t, true),
    CUDA_KERNEL_PAIR(MUL, mul, kern_binary_args_t, true),
    CUDA_KERNEL_PAIR(IM2COL3D, im2col3d, kern_im2col3d_args_t, true),
    CUDA_KERNEL_PAIR(UPSAMPLE2X, upsample2x, kern_video_args_t, true),
    CUDA_KERNEL_PAIR(FRAME_INTERLEAVE, frame_interleave, kern_video_args_t, true),
};

/* cuDNN's fused attention (attention_cudnn.c): BF16 only, and only in
 * builds with cuDNN; ATTENTION_SDPA has no F32 CUDA kernel. */
#ifdef HAVE_CUDNN
static const kern_impl_t cudnn_kernels[] = {
    CUDA_KERNEL(ATTENTION_SDPA, attention_sdpa, BF16, bf16, kern_attention_args_t, true),
};
#endif

/* Listed once by kern_registry_init, which registers them (this file
 * never calls the registry). Cannot fail: the registry's table holds 256
 * entries and Reel registers a few tens (a full table would drop kernels,
 * and the lookup would then name the missing one). */
size_t kern_cuda_kernels(const kern_impl_t **out, size_t max) {
    size_t n = 0;
    for (size_t i = 0; i < sizeof cuda_kernels / sizeof cuda_kernels[0]; i++, n++)
        if (n < max) out[n] = &cuda_kernels[i];
#ifdef HAVE_CUDNN
    for (size_t i = 0; i < sizeof cudnn_kernels / sizeof cudnn_kernels[0]; i++, n++)
        if (n < max) out[n] = &cudnn_kernels[i];
#endif
    return n;
}
