/* silu.cu -- SILU: y = u / (1 + e^(−u)) over n elements, F32 arithmetic.
 * y may equal x. For u → −∞ e^(−u) overflows to inf and y is −0, not NaN.
 * 8 values a load where the sizes allow (cuda_device.cuh, kc_unary_launch). */
#include "cuda_device.cuh"

struct silu_op {
    __device__ float operator()(float u) const { return u / (1.0f + expf(-u)); }
};

extern "C" int kern_cuda_silu_f32(void *ctx, const void *args) {
    return kc_unary_launch<float, silu_op>(ctx, args);
}

extern "C" int kern_cuda_silu_bf16(void *ctx, const void *args) {
    return kc_unary_launch<__nv_bfloat16, silu_op>(ctx, args);
}
