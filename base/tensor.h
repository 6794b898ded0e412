/* tensor.h -- the tensor descriptor every Reel op takes.
 *
 * A descriptor never owns memory: `data` is a base pointer (host or device),
 * `offset` a byte offset into it, `stride` counts elements per dimension.
 * Helpers below compute sizes and contiguity; none of them can fail. */
#ifndef REEL_BASE_TENSOR_H
#define REEL_BASE_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KERN_MAX_DIMS 5
#define KERN_DEVICE_HOST (-1) /* device field of host (CPU) tensors */

typedef enum {
    KERN_F32 = 0,
    KERN_BF16 = 1,
    KERN_F16 = 2,
    KERN_DTYPE_COUNT
} kern_dtype_t;

typedef struct {
    kern_dtype_t dtype;
    int ndim;                        /* 0..KERN_MAX_DIMS; 0 is a scalar */
    int64_t shape[KERN_MAX_DIMS];
    int64_t stride[KERN_MAX_DIMS];   /* in elements */
    size_t offset;                   /* in bytes, from data */
    int device;                      /* KERN_DEVICE_HOST or a CUDA ordinal */
    void *data;
} kern_tensor_t;

/* Bytes per element of `dt`: 4, 2 or 2. */
size_t kern_dtype_size(kern_dtype_t dt);
/* True when none of the n elements of dtype dt at p (any alignment) is a
 * NaN or an infinity: one pass, about as fast as reading them. */
bool kern_all_finite(const void *p, size_t n, kern_dtype_t dt);
/* True when every one of the n values at p is finite with |x| < 2^e
 * (0 <= e < 128): an exponent test, as fast as kern_all_finite. */
bool kern_all_below(const void *p, size_t n, kern_dtype_t dt, int e);
/* "F32", "BF16", "F16"; "?" for an out-of-range value. */
const char *kern_dtype_name(kern_dtype_t dt);
/* Parses a safetensors dtype name ("F32", "BF16", "F16"); -1 if unknown. */
int kern_dtype_parse(const char *name, kern_dtype_t *out);

/* A contiguous (row-major) descriptor over `data` on `device`. ndim may be 0.
 * Asserts ndim <= KERN_MAX_DIMS (programmer error). */
kern_tensor_t kern_tensor_make(void *data, kern_dtype_t dt, int device,
                               int ndim, const int64_t *shape);
/* Product of shape (1 for a scalar). */
int64_t kern_tensor_numel(const kern_tensor_t *t);
/* numel * dtype size. */
size_t kern_tensor_bytes(const kern_tensor_t *t);
/* True when strides are the row-major strides of shape. */
bool kern_tensor_is_contiguous(const kern_tensor_t *t);
/* data + offset. */
static inline void *kern_tensor_ptr(const kern_tensor_t *t) {
    return (char *)t->data + t->offset;
}
/* True when dtype, ndim and every dim match. */
bool kern_tensor_same_shape(const kern_tensor_t *a, const kern_tensor_t *b);
/* Writes "[2,3,4]" into buf (always NUL-terminated, cut short when len is
 * too small); returns buf. The one shape text of Reel's messages. */
char *kern_shape_text(int ndim, const int64_t *shape, char *buf, size_t len);
/* Writes "F32[2,3,4]" into buf (always NUL-terminated); returns buf. */
char *kern_tensor_describe(const kern_tensor_t *t, char *buf, size_t len);
/* A view of row `row` of a contiguous 2-D (or higher: first dim) tensor,
 * with the first dimension dropped. */
kern_tensor_t kern_tensor_row(const kern_tensor_t *t, int64_t row);

/* bfloat16 / float16 <-> float32, round-to-nearest-even on narrowing. */
float kern_bf16_to_f32(uint16_t h);
uint16_t kern_f32_to_bf16(float f);
float kern_f16_to_f32(uint16_t h);
uint16_t kern_f32_to_f16(float f);

#ifdef __cplusplus
}
#endif
#endif
