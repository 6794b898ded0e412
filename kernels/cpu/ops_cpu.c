/* ops_cpu.c -- lists every CPU F32 kernel for the registry.
 *
 * The kernels live one job per file (ops_gemm.c, ops_norm.c, ...), each
 * holding one static table of its kernels; this file only gathers those
 * tables in op order. The registry registers what it lists (registry.c):
 * no kernel file calls the registry, so the registry calling down into
 * them is no circle. Every CPU kernel is capturable except the SDE update,
 * whose noise makes a step an eager break by contract (DESIGN.md
 * "Capturable step contract"). */
#include "../registry.h"

/* The tables of the kernel files in this directory: each sets *out to its
 * kernels (op, KERN_BACKEND_CPU, KERN_F32) and returns how many; none can
 * fail. */
size_t kern_cpu_gemm_kernels(const kern_impl_t **out);        /* ops_gemm.c */
size_t kern_cpu_norm_kernels(const kern_impl_t **out);        /* ops_norm.c */
size_t kern_cpu_elementwise_kernels(const kern_impl_t **out); /* ops_elementwise.c */
size_t kern_cpu_attention_kernels(const kern_impl_t **out);   /* ops_attention.c */
size_t kern_cpu_rope_kernels(const kern_impl_t **out);        /* ops_rope.c */
size_t kern_cpu_patch_kernels(const kern_impl_t **out);       /* ops_patch.c */
size_t kern_cpu_step_kernels(const kern_impl_t **out);        /* ops_step.c */
size_t kern_cpu_softmax_kernels(const kern_impl_t **out);     /* ops_softmax.c */
size_t kern_cpu_fused_kernels(const kern_impl_t **out);       /* ops_fused.c */
size_t kern_cpu_text_kernels(const kern_impl_t **out);        /* ops_text.c */
size_t kern_cpu_video_kernels(const kern_impl_t **out);       /* ops_video.c */

size_t kern_cpu_kernels(const kern_impl_t **out, size_t max) {
    size_t (*const files[])(const kern_impl_t **) = {
        kern_cpu_gemm_kernels, kern_cpu_norm_kernels, kern_cpu_elementwise_kernels,
        kern_cpu_attention_kernels, kern_cpu_rope_kernels, kern_cpu_patch_kernels,
        kern_cpu_step_kernels, kern_cpu_softmax_kernels, kern_cpu_fused_kernels,
        kern_cpu_text_kernels,
        kern_cpu_video_kernels,
    };
    size_t n = 0;
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        const kern_impl_t *k;
        size_t nk = files[f](&k);
        for (size_t i = 0; i < nk; i++, n++)
            if (n < max) out[n] = &k[i];
    }
    return n;
}
