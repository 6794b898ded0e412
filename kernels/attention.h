/* attention.h -- the attention op's driver, internal to kernels/: ops.c
 * validates the tensors and hands the resolved argument block here, which
 * runs the path the plan chooses (see ops.h for the paths and the rule). */
#ifndef REEL_KERNELS_ATTENTION_H
#define REEL_KERNELS_ATTENTION_H

#include "ops.h"
#include "ops_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Launches attention described by `a` (pointers resolved, sizes checked by
 * the caller; a->hdr is filled here) in dtype dt on s: FUSED dispatches the
 * backend's attention kernel; DECOMPOSED takes the plan's scratch from s
 * (bound scratch, else the arena) and dispatches three primitives per
 * block. Returns 0, or -1 with a message naming attention; o may be partly
 * written when a later block fails. */
int kern_attention_run(kern_stream_t *s, kern_dtype_t dt, kern_attention_args_t *a,
                       const kern_attn_opts_t *opts);

#ifdef __cplusplus
}
#endif
#endif
