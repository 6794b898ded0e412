/* ops_check.h -- the checks every validating op wrapper makes (ops.c,
 * text_ops.c, ops_video.c): one place for their rules and messages.
 * Internal to kernels/. */
#ifndef REEL_KERNELS_OPS_CHECK_H
#define REEL_KERNELS_OPS_CHECK_H

#include "backend.h"
#include "base/tensor.h"

/* Fails (REEL_E_INVALID, naming op and tensor) unless t is present,
 * contiguous, on s's device, with dtype dt and, when ndim >= 0, ndim dims. */
int kern_op_check(kern_stream_t *s, const char *op, const char *name, const kern_tensor_t *t, kern_dtype_t dt,
                  int ndim);
/* "%op: %name is <t>, expected %want" as REEL_E_INVALID; returns -1. */
int kern_op_shape_fail(const char *op, const char *name, const kern_tensor_t *t, const char *want);

#endif
