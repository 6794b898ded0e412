/* ops_attention.h -- what the CPU attention kernel offers beyond its
 * registry entries: its floor, for bench_cpu_step (issue 31 §4). */
#ifndef REEL_KERNELS_CPU_OPS_ATTENTION_H
#define REEL_KERNELS_CPU_OPS_ATTENTION_H

/* An ATTENTION (or ATTENTION_SDPA) node's matrix products alone: with the
 * node's own argument block (kern_attention_args_t), the very sgemm calls
 * the kernel makes (scores, then weights·values, per item), on the same
 * items, lanes and threads, and nothing between them (no softmax, no
 * running max or rescale). The direct way (up to 64 keys and head width)
 * makes no BLAS call: its own score and weights·values loops, with the
 * scores standing in for the weights (cpu_vec_attn_direct_products). o and
 * the scratch get meaningless values. 0, or -1 with the kernel's error. */
int kern_cpu_attention_products(const void *args);

#endif
