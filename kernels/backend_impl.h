/* backend_impl.h -- the internal vtable each backend fills (ggml style).
 * Only kernels/ includes this. One static const table per backend. */
#ifndef REEL_KERNELS_BACKEND_IMPL_H
#define REEL_KERNELS_BACKEND_IMPL_H

#include "backend.h"
#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A kernel: runs (CPU) or enqueues (CUDA) the op described by `args`.
 * `ctx` is NULL on the CPU and a kern_cuda_ctx_t* on CUDA. Returns 0 or -1
 * with a message set. A kernel never allocates and never looks anything up. */
typedef int (*kern_fn_t)(void *ctx, const void *args);

typedef struct kern_backend_iface {
    const char *kind_name;
    void  (*destroy)(kern_backend_t *b);                         /* frees impl state */
    void *(*alloc)(kern_backend_t *b, size_t bytes);
    size_t (*free)(kern_backend_t *b, void *p);                  /* returns bytes freed */
    void *(*stream_new)(kern_backend_t *b);                      /* impl stream state */
    void  (*stream_destroy)(kern_backend_t *b, void *st);
    int   (*stream_sync)(void *st);
    int   (*copy)(void *st, void *dst, const void *src, size_t n, int dir); /* 0 h2d,1 d2h,2 d2d; eager only */
    int   (*launch)(void *st, kern_fn_t fn, const void *args);   /* eager launch */
    int   (*capture_begin)(void *st);                            /* NULL: recorded by the dispatcher */
    int   (*capture_end)(void *st, void **graph, size_t *nodes, size_t *bytes);
    int   (*graph_launch)(void *graph, void *st);
    void  (*graph_destroy)(void *graph);
} kern_backend_iface_t;

struct kern_backend {
    const kern_backend_iface_t *iface;
    kern_backend_kind_t kind;
    int device;
    char device_name[32];
    char arch[32];
    size_t mem_total;      /* kern_backend_mem_total: 0 when not known */
    size_t bytes_in_use;   /* atomic: streams on several threads allocate */
    void *impl;
    /* The device lock (backend.c): captures hold it shared from begin to
     * end; calls that may synchronize the whole device (alloc, free, stream
     * create/destroy, graph destroy) hold it exclusive. */
    pthread_rwlock_t dev_lock;
    bool dev_lock_ok;
    int captures_active;   /* atomic: captures holding dev_lock shared */
    size_t streams_alive;  /* atomic */
    pthread_mutex_t deferred_mu;  /* frees asked for by a capturing thread */
    void **deferred;
    size_t n_deferred, cap_deferred;
};

/* Launches kernel `fn` with its argument block on s: records a copy of the
 * block when s is capturing on a backend without native graphs (the CPU),
 * else runs it. args_size bytes of args are copied when recorded. */
int kern_stream_launch(kern_stream_t *s, kern_fn_t fn, const void *args, size_t args_size);
/* The backend-private stream state (cudaStream_t context on CUDA). */
void *kern_stream_impl(const kern_stream_t *s);

#ifdef HAVE_CUDA
/* Fills b for CUDA device `device`; -1 with a message when unusable. */
int kern_cuda_backend_init(kern_backend_t *b, int device);
#endif

#ifdef __cplusplus
}
#endif
#endif
