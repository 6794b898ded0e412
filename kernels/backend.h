/* backend.h -- devices, memory, streams and graphs behind one interface.
 *
 * A backend is an opaque handle over one device (the CPU, or one CUDA GPU).
 * Work is launched on streams; a stream can be captured into a graph that is
 * later replayed with one call. A graph reads the addresses that were live at
 * capture: keeping them valid is the caller's job (capture_cache does it).
 *
 * Convention: functions return 0 on success and -1 on failure with a message
 * in reel_err_text(); constructors return NULL on failure. _destroy(&p) accepts
 * NULL and sets *p = NULL. */
#ifndef REEL_KERNELS_BACKEND_H
#define REEL_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdbool.h>
#include "base/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KERN_BACKEND_CPU = 0, KERN_BACKEND_CUDA = 1, KERN_BACKEND_COUNT } kern_backend_kind_t;

typedef struct kern_backend kern_backend_t;
typedef struct kern_stream kern_stream_t;
typedef struct kern_graph kern_graph_t;

/* "cpu" or "cuda". */
const char *kern_backend_kind_name(kern_backend_kind_t k);
/* Parses "cpu"/"cuda"; -1 if unknown. */
int kern_backend_kind_parse(const char *s, kern_backend_kind_t *out);

/* The CPU backend; cannot fail except on out-of-memory (NULL). */
kern_backend_t *kern_backend_cpu_new(void);
/* The CPU backend's thread pool (kernels/cpu/cpu_pool.h), process-wide:
 * the threads that may run one kernel's tasks, the caller included, shared
 * by every stream. n >= 1 sets it; n <= 0 goes back to the default:
 * REEL_THREADS, else the cores this process may run on. OpenBLAS itself
 * runs single-threaded inside the pool's tasks. Results do not depend on
 * the size. */
void kern_cpu_threads_set(int n);
int kern_cpu_threads(void);
/* The CUDA backend on GPU `device`. Returns NULL with a one-line reason in
 * reel_err_text() when Reel was built without CUDA, no driver or device is
 * present, or the device is unusable. */
kern_backend_t *kern_backend_cuda_new(int device);
/* Either of the above by kind. */
kern_backend_t *kern_backend_new(kern_backend_kind_t kind, int device);
/* Frees the backend. Every stream, graph and allocation must be gone. */
void kern_backend_destroy(kern_backend_t **b);

kern_backend_kind_t kern_backend_kind(const kern_backend_t *b);
/* "cpu" or "cuda:0" -- stable, for keys and logs. */
const char *kern_backend_device_name(const kern_backend_t *b);
/* "cpu-avx2", "cpu-avx512", "cpu-generic", "sm_90" ... */
const char *kern_backend_arch(const kern_backend_t *b);
/* KERN_DEVICE_HOST for the CPU, the CUDA ordinal otherwise. */
int kern_backend_device(const kern_backend_t *b);
/* The memory its allocations come from, in bytes: the host's physical
 * memory on the CPU, the device's on CUDA; 0 when not known. What no
 * freeing could ever make room beyond (capture_cache/cache.c). */
size_t kern_backend_mem_total(const kern_backend_t *b);

/* Device memory. kern_alloc returns NULL (message set) on failure; the
 * memory is 64-byte aligned and uninitialised. kern_free(NULL) is a no-op. */
void *kern_alloc(kern_backend_t *b, size_t bytes);
void kern_free(kern_backend_t *b, void *p);
/* Bytes currently allocated through kern_alloc on this backend. */
size_t kern_bytes_in_use(const kern_backend_t *b);

/* The device lock. Captures hold it shared from kern_capture_begin to
 * kern_capture_end; kern_alloc, kern_free, kern_stream_new/destroy and
 * kern_graph_destroy hold it exclusive, so no call that could synchronize
 * the device runs while any stream of it captures. On a capturing thread
 * kern_alloc and kern_stream_new fail with a message and kern_free is
 * deferred to the end of the capture. One thread captures one stream at a
 * time. */
/* Captures in progress on b (for tests and assertions). */
int kern_backend_captures_active(const kern_backend_t *b);
/* Streams of b that exist now (executor streams live as long as the
 * worker; nothing creates one per request). */
size_t kern_backend_streams_alive(const kern_backend_t *b);
/* Allocates a contiguous tensor of the given shape; data NULL on failure. */
kern_tensor_t kern_tensor_alloc(kern_backend_t *b, kern_dtype_t dt, int ndim,
                                const int64_t *shape);

/* Streams: ordered queues of work. On the CPU, work runs on the calling
 * thread at launch time (unless the stream is capturing). */
kern_stream_t *kern_stream_new(kern_backend_t *b);
void kern_stream_destroy(kern_stream_t **s);
kern_backend_t *kern_stream_backend(const kern_stream_t *s);
/* Waits for all work queued on s. */
int kern_stream_sync(kern_stream_t *s);

/* Copies, ordered on stream s. Host pointers are ordinary memory. On the CPU
 * backend all three are memcpy (and are recorded when capturing). On CUDA a
 * host<->device copy inside a capture needs page-locked host memory, which
 * Reel does not allocate: keep host copies outside captures there. */
int kern_copy_h2d(kern_stream_t *s, void *dst, const void *src, size_t n);
int kern_copy_d2h(kern_stream_t *s, void *dst, const void *src, size_t n);
int kern_copy_d2d(kern_stream_t *s, void *dst, const void *src, size_t n);

/* Scratch memory of kernels. A kernel's scratch (its workspace_bytes
 * contract) comes from the scratch bound to the stream when one is bound,
 * else from the stream's own arena.
 *
 * Bound scratch is caller-owned: a step workspace binds its own scratch
 * around its launches, so a graph captured from it bakes the workspace's
 * memory, which lives exactly as long as the graph's cache entry, and
 * workspaces of any shapes coexist on one stream. A kernel asking for more
 * than the bound size fails (the workspace was sized wrong).
 *
 * The stream arena serves launches outside any workspace (op tests,
 * tools). Reserve it before capture; it can grow only while no graph
 * captured on the stream is alive (a live graph baked in its address).
 * kern_stream_scratch returns the scratch base or NULL (message set) if it
 * cannot provide `bytes`. */
typedef struct { void *base; size_t bytes; } kern_scratch_t;
/* Binds sc (base NULL: unbinds) to s; returns the previous binding, so
 * nested binders restore it. Can't fail. */
kern_scratch_t kern_stream_bind_scratch(kern_stream_t *s, kern_scratch_t sc);
int kern_stream_reserve(kern_stream_t *s, size_t bytes);
void *kern_stream_scratch(kern_stream_t *s, size_t bytes);
size_t kern_stream_scratch_size(const kern_stream_t *s);

/* Graphs. Between begin and end, launches on s are recorded, not run. A
 * failed end_capture leaves s not capturing and *out NULL. */
int kern_capture_begin(kern_stream_t *s);
int kern_capture_end(kern_stream_t *s, kern_graph_t **out);
bool kern_stream_is_capturing(const kern_stream_t *s);
/* Replays g on s, which must be the stream g was captured on (a graph
 * bakes its stream's scratch and cuBLAS workspace): -1 with a message
 * otherwise. */
int kern_graph_replay(kern_graph_t *g, kern_stream_t *s);
/* The stream g was captured on. */
kern_stream_t *kern_graph_stream(const kern_graph_t *g);
void kern_graph_destroy(kern_graph_t **g);
/* Kernel launches recorded in g. */
size_t kern_graph_nodes(const kern_graph_t *g);
/* Host/device memory g holds (argument blocks, instantiated graph). */
size_t kern_graph_bytes(const kern_graph_t *g);
/* Times g has been replayed. */
size_t kern_graph_replays(const kern_graph_t *g);
/* Node i of a recorded graph (the CPU's): its kernel function and argument
 * block, as the dispatcher recorded them, for profiles (bench_cpu_step
 * runs nodes one by one). -1 for a native graph or i >= its nodes. */
int kern_graph_node(const kern_graph_t *g, size_t i, int (**fn)(void *ctx, const void *args),
                    const void **args);

#ifdef __cplusplus
}
#endif
#endif
