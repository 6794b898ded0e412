/* gelu_tanh.cu -- GELU_TANH: y = 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³)))
 * over n elements, F32 arithmetic (TINYDIT.md). y may equal x; 8 values a
 * load where the sizes allow (cuda_device.cuh, kc_unary_launch). */
#include "cuda_device.cuh"

struct gelu_tanh_op {
    __device__ float operator()(float u) const {
        const float k0 = 0.7978845608028654f; /* √(2/π) */
        return 0.5f * u * (1.0f + tanhf(k0 * (u + 0.044715f * u * u * u)));
    }
};

extern "C" int kern_cuda_gelu_tanh_f32(void *ctx, const void *args) {
    return kc_unary_launch<float, gelu_tanh_op>(ctx, args);
}

extern "C" int kern_cuda_gelu_tanh_bf16(void *ctx, const void *args) {
    return kc_unary_launch<__nv_bfloat16, gelu_tanh_op>(ctx, args);
}
