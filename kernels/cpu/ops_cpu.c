/* ops_cpu.c -- registers every CPU F32 kernel with the registry.
 *
 * The kernels live one job per file (ops_gemm.c, ops_norm.c, ...), each
 * exposing one registration hook; this file only calls them in op order.
 * Every CPU kernel is capturable except the SDE update, whose noise makes a
 * step an eager break by contract (DESIGN.md "Capturable step contract"). */
#include "../registry.h"

/* Registration hooks of the kernel files in this directory. Each registers
 * its kernels for (op, KERN_BACKEND_CPU, KERN_F32); none can fail short of a
 * full registry table, in which case lookups later report the missing op. */
void kern_cpu_register_gemm(void);        /* ops_gemm.c */
void kern_cpu_register_norm(void);        /* ops_norm.c */
void kern_cpu_register_elementwise(void); /* ops_elementwise.c */
void kern_cpu_register_attention(void);   /* ops_attention.c */
void kern_cpu_register_rope(void);        /* ops_rope.c */
void kern_cpu_register_patch(void);       /* ops_patch.c */
void kern_cpu_register_step(void);        /* ops_step.c */
void kern_cpu_register_softmax(void);     /* ops_softmax.c */
void kern_cpu_register_fused(void);       /* ops_fused.c */

void kern_cpu_register_all(void) {
    kern_cpu_register_gemm();
    kern_cpu_register_norm();
    kern_cpu_register_elementwise();
    kern_cpu_register_attention();
    kern_cpu_register_rope();
    kern_cpu_register_patch();
    kern_cpu_register_step();
    kern_cpu_register_softmax();
    kern_cpu_register_fused();
}
