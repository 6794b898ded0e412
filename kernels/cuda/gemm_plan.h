/* gemm_plan.h -- the cuBLASLt plan of one GEMM shape on one stream: its
 * descriptors and the algorithm cuBLASLt's heuristic picked for it, cached
 * per stream (kern_cuda_ctx_t.lt_plans) so each shape is planned once.
 *
 * A plan is looked up by (dtype, bias or not, GELU or not, M, N, K, and the
 * alignment of each pointer, capped at 256 bytes: the heuristic picks
 * kernels by alignment). A miss runs the heuristic, which is host work, but
 * never inside a capture (issue 8: nothing is planned or searched while a
 * graph records): a miss on a capturing stream fails with a message naming
 * the shape, and the capture fails with it. The capture cache then runs the
 * call eagerly, which plans the shape, and its next capture succeeds; the
 * cache's warm-up runs (2 by default) plan every shape before the first
 * capture. The heuristic is deterministic: the same shape on the same
 * device gets the same algorithm, so eager runs and replays on a stream
 * compute the same bits. */
#ifndef REEL_KERNELS_CUDA_GEMM_PLAN_H
#define REEL_KERNELS_CUDA_GEMM_PLAN_H

#include <stdbool.h>
#include "cuda_common.h"
#include "../ops_args.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    cublasLtMatmulDesc_t op;        /* compute F32, epilogue, transposes */
    cublasLtMatrixLayout_t a, b, c; /* w, x and y in column-major terms */
    cublasLtMatmulAlgo_t algo;      /* the heuristic's first choice */
    bool post_gelu;                 /* no GELU epilogue algorithm: GELU runs after, as a kernel */
} kern_lt_plan_t;

/* The plan for GEMM args `a` in dtype dt (F32 or BF16), with a GELU
 * epilogue when gelu. The pointer stays valid until the next call on this
 * stream (a full cache evicts its least recently used plan). Returns -1
 * with a message when the shape is not planned and the stream captures,
 * when cuBLASLt has no algorithm for it, or on a cuBLASLt failure. */
int kern_lt_plan_get(kern_cuda_ctx_t *c, const kern_gemm_args_t *a, kern_dtype_t dt, bool gelu,
                     const kern_lt_plan_t **out);

#ifdef __cplusplus
}
#endif
#endif
