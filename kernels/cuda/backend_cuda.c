/* backend_cuda.c -- the CUDA backend: device memory, non-blocking streams
 * each with its own cuBLAS and cuBLASLt handles, and native CUDA graphs.
 *
 * Launches are always enqueued on the stream (backend.c hands them to
 * cuda_launch even while the stream captures), so a capture is an ordinary
 * cudaStreamBeginCapture/EndCapture pair and a replay is one
 * cudaGraphLaunch. Nothing here allocates while a stream captures: the
 * cuBLAS workspace is allocated with the stream. Every call that touches a
 * device first makes the backend's device current on the calling thread. */
#include "cuda_common.h"
#include "../backend_impl.h"
#include "base/error.h"
#include "kernels/ops.h"
#ifdef HAVE_CUDNN
int reel_cudnn_sdpa_ready(const char **why); /* kernels/cuda/cudnn_lazy.c */
#endif
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuBLAS workspace per stream. NVIDIA recommends 32 MiB on Hopper; cuBLAS
 * falls back to workspace-free algorithms when a GEMM wants more. */
#define CUDA_BLAS_WORKSPACE ((size_t)32 << 20)

/* kern_graph_bytes() of a CUDA graph: the driver does not report what an
 * instantiated graph holds, so this is an estimate per node (a kernel node
 * keeps its launch parameters, a few hundred bytes for Reel's kernels). */
#define CUDA_GRAPH_NODE_BYTES 256

/* kern_free must return the size of the block: cudaFree does not know it,
 * so the backend keeps pointer -> size for every live allocation. */
typedef struct {
    void *ptr;
    size_t bytes;
} cuda_block_t;

typedef struct {
    pthread_mutex_t lock; /* guards block/len/cap: any thread may alloc/free */
    cuda_block_t *block;
    size_t len, cap;
} cuda_impl_t;

typedef struct {
    cudaGraph_t graph;    /* kept so the graph can be inspected or updated */
    cudaGraphExec_t exec;
} cuda_graph_t;

/* Makes `device` current on the calling thread (host threads do not share a
 * current device). Returns -1 with a message on failure. */
static int cuda_use_device(int device) {
    int cur = -1;
    CUDA_CHECK(cudaGetDevice(&cur));
    if (cur != device) CUDA_CHECK(cudaSetDevice(device));
    return 0;
}

/* ---- memory ---------------------------------------------------------- */

static int cuda_malloc(int device, size_t bytes, void **out) {
    if (cuda_use_device(device) != 0) return -1;
    CUDA_CHECK(cudaMalloc(out, bytes));
    return 0;
}

/* Remembers (p, bytes); -1 on out-of-memory (the table is unchanged). */
static int cuda_track(cuda_impl_t *im, void *p, size_t bytes) {
    int rc = 0;
    pthread_mutex_lock(&im->lock);
    if (im->len == im->cap) {
        size_t cap = im->cap ? im->cap * 2 : 64;
        cuda_block_t *nb = realloc(im->block, cap * sizeof *nb);
        if (nb) {
            im->block = nb;
            im->cap = cap;
        } else {
            rc = reel_fail(REEL_E_NOMEM, "cuda: out of host memory tracking device allocations");
        }
    }
    if (rc == 0) im->block[im->len++] = (cuda_block_t){ p, bytes };
    pthread_mutex_unlock(&im->lock);
    return rc;
}

/* Forgets p and returns its size; 0 when p is unknown. Searches from the
 * end: scratch and activations are usually freed soon after allocation. */
static size_t cuda_untrack(cuda_impl_t *im, void *p) {
    size_t bytes = 0;
    pthread_mutex_lock(&im->lock);
    for (size_t i = im->len; i-- > 0;) {
        if (im->block[i].ptr == p) {
            bytes = im->block[i].bytes;
            im->block[i] = im->block[--im->len];
            break;
        }
    }
    pthread_mutex_unlock(&im->lock);
    return bytes;
}

/* Returns NULL with a message naming the device and size on failure. */
static void *cuda_alloc(kern_backend_t *b, size_t bytes) {
    void *p = NULL;
    if (cuda_malloc(b->device, bytes, &p) != 0) {
        char why[400];
        snprintf(why, sizeof why, "%s", reel_err_text());
        reel_fail(REEL_E_NOMEM, "%s: cannot allocate %zu bytes: %s", b->device_name, bytes, why);
        return NULL;
    }
    if (cuda_track(b->impl, p, bytes) != 0) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

/* Returns the bytes freed. Freeing a pointer this backend did not allocate
 * is a programmer error (asserted). A failing cudaFree (a sticky error from
 * an earlier kernel) is recorded in reel_err_text() but still counts the block
 * as freed: the memory is gone with the context either way. */
static size_t cuda_free(kern_backend_t *b, void *p) {
    size_t bytes = cuda_untrack(b->impl, p);
    assert(bytes > 0 && "kern_free of a pointer this CUDA backend did not allocate");
    cudaError_t e = cudaSuccess;
    if (cuda_use_device(b->device) == 0) e = cudaFree(p);
    if (e != cudaSuccess) kern_cuda_fail(e, "cudaFree(p)", __func__, __FILE__, __LINE__);
    return bytes;
}

static void cuda_destroy(kern_backend_t *b) {
    cuda_impl_t *im = b->impl;
    if (!im) return;
    pthread_mutex_destroy(&im->lock);
    free(im->block);
    free(im);
    b->impl = NULL;
}

/* ---- streams --------------------------------------------------------- */

/* Creates the stream, its cuBLAS handle and the handle's workspace, and its
 * cuBLASLt handle and GEMM plan cache. On failure whatever was created stays
 * in c for cuda_stream_close. */
static int cuda_stream_open(kern_backend_t *b, kern_cuda_ctx_t *c) {
    c->device = b->device;
    if (cuda_use_device(b->device) != 0) return -1;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&c->blas));
    /* SetStream resets the workspace to cuBLAS's own pool: set it first. */
    CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
    CUDA_CHECK(cudaMalloc(&c->blas_ws, CUDA_BLAS_WORKSPACE));
    c->blas_ws_bytes = CUDA_BLAS_WORKSPACE;
    CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes));
    /* The batched GEMM kernels pick the math mode per dtype (gemm_batched.cu). */
    CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    /* GEMM and GEMM_GELU run through cuBLASLt (gemm.c), with blas_ws as
     * workspace and their plans cached per stream (gemm_plan.c). */
    CUBLAS_CHECK(cublasLtCreate(&c->lt));
    c->lt_plans = kern_cuda_lt_plans_new();
    if (!c->lt_plans) return -1;
    /* cuDNN's fused attention (attention_cudnn.c), when built with it. */
    kern_cuda_dnn_open(c);
    return 0;
}

/* Releases what cuda_stream_open created, waiting for queued work first.
 * Cannot fail: errors here are ignored (and cleared from the runtime). */
static void cuda_stream_close(kern_cuda_ctx_t *c) {
    (void)cuda_use_device(c->device);
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    kern_cuda_dnn_close(c);
    kern_cuda_lt_plans_destroy(&c->lt_plans);
    if (c->lt) (void)cublasLtDestroy(c->lt);
    if (c->blas) (void)cublasDestroy(c->blas);
    if (c->blas_ws) (void)cudaFree(c->blas_ws);
    if (c->stream) (void)cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
}

/* Returns a kern_cuda_ctx_t, or NULL with a message (nothing leaks). */
static void *cuda_stream_new(kern_backend_t *b) {
    char why[480];
    kern_cuda_ctx_t *c = calloc(1, sizeof *c);
    if (!c) {
        reel_fail(REEL_E_NOMEM, "cuda: out of memory");
        return NULL;
    }
    if (cuda_stream_open(b, c) != 0) goto err;
    return c;
err:
    snprintf(why, sizeof why, "%s", reel_err_text());
    cuda_stream_close(c);
    free(c);
    reel_fail(REEL_E_IO, "%s: cannot create a stream: %s", b->device_name, why);
    return NULL;
}

static void cuda_stream_destroy(kern_backend_t *b, void *st) {
    (void)b;
    cuda_stream_close(st);
    free(st);
}

/* Also where errors of kernels that already ran (illegal address ...) are
 * reported: launches only report launch errors. */
static int cuda_stream_sync(void *st) {
    kern_cuda_ctx_t *c = st;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return 0;
}

static int cuda_copy(void *st, void *dst, const void *src, size_t n, int dir) {
    static const enum cudaMemcpyKind kind[3] = {
        cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
    };
    kern_cuda_ctx_t *c = st;
    assert(dir >= 0 && dir < 3);
    if (cuda_use_device(c->device) != 0) return -1;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind[dir], c->stream));
    return 0;
}

static int cuda_launch(void *st, kern_fn_t fn, const void *args) {
    kern_cuda_ctx_t *c = st;
    if (cuda_use_device(c->device) != 0) return -1;
    return fn(c, args);
}

/* ---- graphs ---------------------------------------------------------- */

/* ThreadLocal: only this thread's unsafe calls (cudaMalloc, synchronous
 * copies) invalidate the capture; other threads' streams keep working. */
static int cuda_capture_begin(void *st) {
    kern_cuda_ctx_t *c = st;
    if (cuda_use_device(c->device) != 0) return -1;
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    return 0;
}

/* Ends the capture into g and instantiates it. On failure the parts made so
 * far stay in g for cuda_graph_free. */
static int cuda_graph_build(kern_cuda_ctx_t *c, cuda_graph_t *g, size_t *nodes) {
    /* First, whatever happens: the stream must leave capture mode. */
    CUDA_CHECK(cudaStreamEndCapture(c->stream, &g->graph));
    CUDA_CHECK(cudaGraphGetNodes(g->graph, NULL, nodes));
    CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
    /* Moves the upload out of the first replay's latency. */
    CUDA_CHECK(cudaGraphUpload(g->exec, c->stream));
    return 0;
}

static void cuda_graph_free(cuda_graph_t *g) {
    if (g->exec) (void)cudaGraphExecDestroy(g->exec);
    if (g->graph) (void)cudaGraphDestroy(g->graph);
    free(g);
}

/* Returns the instantiated graph in *graph; -1 with a message (capture
 * invalidated by an illegal call, instantiation failure) and nothing kept
 * otherwise. The stream is never left capturing. */
static int cuda_capture_end(void *st, void **graph, size_t *nodes, size_t *bytes) {
    kern_cuda_ctx_t *c = st;
    *graph = NULL;
    cuda_graph_t *g = calloc(1, sizeof *g);
    if (!g) {
        cudaGraph_t lost = NULL;
        if (cudaStreamEndCapture(c->stream, &lost) == cudaSuccess && lost) cudaGraphDestroy(lost);
        (void)cudaGetLastError();
        return reel_fail(REEL_E_NOMEM, "cuda: out of memory ending a capture");
    }
    if (cuda_graph_build(c, g, nodes) != 0) {
        cuda_graph_free(g);
        return -1;
    }
    *bytes = sizeof *g + *nodes * CUDA_GRAPH_NODE_BYTES;
    *graph = g;
    return 0;
}

static int cuda_graph_launch(void *graph, void *st) {
    cuda_graph_t *g = graph;
    kern_cuda_ctx_t *c = st;
    if (cuda_use_device(c->device) != 0) return -1;
    CUDA_CHECK(cudaGraphLaunch(g->exec, c->stream));
    return 0;
}

static void cuda_graph_destroy(void *graph) { cuda_graph_free(graph); }

static const kern_backend_iface_t cuda_iface = {
    .kind_name      = "cuda",
    .destroy        = cuda_destroy,        /* frees the allocation table */
    .alloc          = cuda_alloc,          /* cudaMalloc, tracked for free's size */
    .free           = cuda_free,           /* cudaFree, returns the tracked size */
    .stream_new     = cuda_stream_new,     /* non-blocking stream + cuBLAS(Lt) handles */
    .stream_destroy = cuda_stream_destroy, /* syncs, then releases both */
    .stream_sync    = cuda_stream_sync,    /* cudaStreamSynchronize */
    .copy           = cuda_copy,           /* cudaMemcpyAsync on the stream */
    .launch         = cuda_launch,         /* kernel enqueues on ctx->stream */
    .capture_begin  = cuda_capture_begin,  /* native: cudaStreamBeginCapture */
    .capture_end    = cuda_capture_end,    /* EndCapture + Instantiate + Upload */
    .graph_launch   = cuda_graph_launch,   /* cudaGraphLaunch */
    .graph_destroy  = cuda_graph_destroy,  /* exec + graph */
};

/* ---- construction ---------------------------------------------------- */

/* The oldest architecture the kernels are built for (Makefile: sm_80,
 * sm_90 and compute_90 PTX, which newer GPUs JIT). */
#define CUDA_MIN_MAJOR 8

int kern_cuda_backend_init(kern_backend_t *b, int device) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        /* Without libcuda the runtime says "driver version is insufficient";
         * name the real cause: no driver at all, or an old one. */
        int drv = 0, rt = 0;
        (void)cudaDriverGetVersion(&drv);
        (void)cudaRuntimeGetVersion(&rt);
        (void)cudaGetLastError();
        if (drv == 0)
            return reel_fail(REEL_E_DEVICE, "CUDA backend unavailable: no CUDA driver installed "
                             "(cudaGetDeviceCount: %s)", cudaGetErrorString(e));
        if (e == cudaErrorInsufficientDriver)
            return reel_fail(REEL_E_DEVICE, "CUDA backend unavailable: the CUDA driver (%d.%d) is older than "
                             "the runtime Reel was built with (%d.%d)", drv / 1000,
                             drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        return reel_fail(REEL_E_DEVICE, "CUDA backend unavailable: no CUDA device (cudaGetDeviceCount: %s)",
                         cudaGetErrorString(e));
    }
    if (count <= 0)
        return reel_fail(REEL_E_DEVICE, "CUDA backend unavailable: no CUDA device (cudaGetDeviceCount: 0)");
    if (device < 0 || device >= count)
        return reel_fail(REEL_E_DEVICE, "CUDA backend unavailable: no CUDA device %d (%d present)", device, count);
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return reel_fail(REEL_E_DEVICE, "CUDA backend unavailable: cuda:%d: cudaGetDeviceProperties: %s", device,
                         cudaGetErrorString(e));
    }
    if (prop.major < CUDA_MIN_MAJOR)
        return reel_fail(REEL_E_DEVICE, "CUDA backend unavailable: cuda:%d (%s) is sm_%d%d, Reel's kernels need "
                         "sm_%d0 or newer", device, prop.name, prop.major, prop.minor,
                         CUDA_MIN_MAJOR);
    /* Creating the context now turns "device busy or prohibited" into a
     * clean failure here rather than at the first allocation. */
    e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaFree(NULL);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return reel_fail(REEL_E_DEVICE, "CUDA backend unavailable: cuda:%d is unusable: %s", device,
                         cudaGetErrorString(e));
    }
    cuda_impl_t *im = calloc(1, sizeof *im);
    if (!im) return reel_fail(REEL_E_NOMEM, "cuda: out of memory");
    if (pthread_mutex_init(&im->lock, NULL) != 0) {
        free(im);
        return reel_fail(REEL_E_DEVICE, "cuda: cannot create the allocation table's mutex");
    }
    b->iface = &cuda_iface;
    b->kind = KERN_BACKEND_CUDA;
    b->device = device;
    snprintf(b->device_name, sizeof b->device_name, "cuda:%d", device);
    snprintf(b->arch, sizeof b->arch, "sm_%d%d", prop.major, prop.minor);
    b->mem_total = prop.totalGlobalMem;
    b->impl = im;
    /* The fused attention runs where cuDNN loads (every device here is
     * sm_80 or newer): kernels/ops.h, kern_attention_choose. */
#ifdef HAVE_CUDNN
    const char *why = NULL;
    bool dnn = reel_cudnn_sdpa_ready(&why) == 1;
    kern_attention_set_sdpa_ready(dnn, dnn ? NULL : why);
#else
    kern_attention_set_sdpa_ready(false, "built without cuDNN (no cudnn.h beside the toolkit)");
#endif
    return 0;
}
