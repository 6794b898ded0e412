/* backend.c -- the dispatcher over backend vtables, and the recorded graphs
 * of backends without native ones (the CPU).
 *
 * A recorded graph is a flat list of (kernel, argument block) pairs; replay
 * walks the list and calls each kernel with no lookup, validation or
 * allocation, so it reads exactly the addresses resolved at capture.
 *
 * The device lock. Thread-local capture mode keeps *this* thread's unsafe
 * calls from breaking its capture, but a cudaFree (or cudaMalloc, stream
 * or cuBLAS handle creation, graph destruction) on another thread may
 * synchronize the whole device and invalidate a capture in progress. So
 * every capture holds the backend's rwlock shared from begin to end, and
 * every such call holds it exclusive: none runs while any stream of the
 * device captures. The CPU backend follows the same rules, so the tests
 * here exercise them. A thread that allocates while it captures gets an
 * error (it would invalidate its own capture, or deadlock); a free it asks
 * for is deferred until its capture ends. */
#include "backend_impl.h"
#include "base/error.h"
#include "cpu/cpu_verdict.h"
#include <assert.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kern_fn_t fn;
    size_t args_off;       /* into the graph's argument arena */
} rec_node_t;

struct kern_graph {
    kern_backend_t *backend;
    kern_stream_t *origin;  /* stream captured on: pins its arena */
    size_t replays;
    size_t nodes;
    size_t bytes;
    /* recorded graphs */
    rec_node_t *node;
    size_t node_cap;
    unsigned char *args;
    size_t args_len, args_cap;
    bool failed;           /* an allocation failed while recording */
    /* native graphs */
    void *native;
};

struct kern_stream {
    kern_backend_t *backend;
    void *impl;
    bool capturing;
    kern_graph_t *rec;      /* graph being recorded (CPU); NULL otherwise */
    kern_graph_t *pending;  /* graph under capture (any backend) */
    void *arena;
    size_t arena_size;
    kern_scratch_t bound;   /* caller-owned scratch, preferred over the arena */
    size_t graphs_alive;    /* graphs captured here that still exist (atomic:
                             * a cache may evict a graph from another thread) */
};

const char *kern_backend_kind_name(kern_backend_kind_t k) {
    return k == KERN_BACKEND_CUDA ? "cuda" : "cpu";
}

int kern_backend_kind_parse(const char *s, kern_backend_kind_t *out) {
    if (!strcmp(s, "cpu")) *out = KERN_BACKEND_CPU;
    else if (!strcmp(s, "cuda")) *out = KERN_BACKEND_CUDA;
    else return reel_fail(REEL_E_INVALID, "unknown backend '%s' (expected cpu or cuda)", s);
    return 0;
}

kern_backend_t *kern_backend_cpu_new_impl(void); /* backend_cpu.c */

/* Threads capturing right now: the device lock is held shared. */
static __thread int tl_capturing;

static void capture_release(kern_backend_t *b);

/* Sets up what every backend shares; destroys b and returns NULL on failure. */
static kern_backend_t *backend_common_init(kern_backend_t *b) {
    if (!b) return NULL;
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    /* Writers first: a stream of captures must not starve a free forever. */
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    int rc = pthread_rwlock_init(&b->dev_lock, &a);
    pthread_rwlockattr_destroy(&a);
    if (rc != 0 || pthread_mutex_init(&b->deferred_mu, NULL) != 0) {
        if (rc == 0) pthread_rwlock_destroy(&b->dev_lock);
        reel_fail(REEL_E_IO, "cannot create the device lock");
        if (b->iface && b->iface->destroy) b->iface->destroy(b);
        free(b);
        return NULL;
    }
    b->dev_lock_ok = true;
    return b;
}

kern_backend_t *kern_backend_cpu_new(void) { return backend_common_init(kern_backend_cpu_new_impl()); }

kern_backend_t *kern_backend_cuda_new(int device) {
#ifdef HAVE_CUDA
    kern_backend_t *b = calloc(1, sizeof *b);
    if (!b) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    if (kern_cuda_backend_init(b, device) != 0) { free(b); return NULL; }
    return backend_common_init(b);
#else
    (void)device;
    reel_fail(REEL_E_UNSUPPORTED, "CUDA backend unavailable: Reel was built without CUDA (CUDA=0)");
    return NULL;
#endif
}

kern_backend_t *kern_backend_new(kern_backend_kind_t kind, int device) {
    return kind == KERN_BACKEND_CUDA ? kern_backend_cuda_new(device) : kern_backend_cpu_new();
}

static void drain_deferred(kern_backend_t *b);

void kern_backend_destroy(kern_backend_t **bp) {
    if (!bp || !*bp) return;
    kern_backend_t *b = *bp;
    if (b->dev_lock_ok) {
        drain_deferred(b);
        pthread_rwlock_destroy(&b->dev_lock);
        pthread_mutex_destroy(&b->deferred_mu);
    }
    free(b->deferred);
    if (b->iface->destroy) b->iface->destroy(b);
    free(b);
    *bp = NULL;
}

/* ---- the device lock ------------------------------------------------------ */

/* Takes the device lock exclusive for `what`; -1 with a message when this
 * thread is capturing. */
static int excl_begin(kern_backend_t *b, const char *what) {
    if (tl_capturing)
        return reel_fail(REEL_E_STATE, "%s while this thread captures a graph: it would invalidate the capture "
                         "(reserve memory before capturing)", what);
    pthread_rwlock_wrlock(&b->dev_lock);
    assert(__atomic_load_n(&b->captures_active, __ATOMIC_ACQUIRE) == 0 &&
           "a device-wide call ran while a capture was in progress");
    return 0;
}

static void excl_end(kern_backend_t *b) { pthread_rwlock_unlock(&b->dev_lock); }

/* Frees what capturing threads asked to free. Takes the lock exclusive;
 * never called by a capturing thread. */
static void drain_deferred(kern_backend_t *b) {
    pthread_mutex_lock(&b->deferred_mu);
    size_t n = b->n_deferred;
    void **d = b->deferred;
    b->deferred = NULL;
    b->n_deferred = b->cap_deferred = 0;
    pthread_mutex_unlock(&b->deferred_mu);
    if (!n) {
        free(d);
        return;
    }
    pthread_rwlock_wrlock(&b->dev_lock);
    for (size_t i = 0; i < n; i++) __atomic_fetch_sub(&b->bytes_in_use, b->iface->free(b, d[i]), __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&b->dev_lock);
    free(d);
}

int kern_backend_captures_active(const kern_backend_t *b) {
    return __atomic_load_n(&b->captures_active, __ATOMIC_ACQUIRE);
}

size_t kern_backend_streams_alive(const kern_backend_t *b) {
    return __atomic_load_n(&b->streams_alive, __ATOMIC_ACQUIRE);
}

kern_backend_kind_t kern_backend_kind(const kern_backend_t *b) { return b->kind; }
const char *kern_backend_device_name(const kern_backend_t *b) { return b->device_name; }
const char *kern_backend_arch(const kern_backend_t *b) { return b->arch; }
int kern_backend_device(const kern_backend_t *b) { return b->device; }
size_t kern_backend_mem_total(const kern_backend_t *b) { return b->mem_total; }

void *kern_alloc(kern_backend_t *b, size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (excl_begin(b, "device allocation") != 0) return NULL;
    void *p = b->iface->alloc(b, bytes);
    excl_end(b);
    if (p) __atomic_fetch_add(&b->bytes_in_use, bytes, __ATOMIC_RELAXED);
    return p;
}

void kern_free(kern_backend_t *b, void *p) {
    if (!p) return;
    if (tl_capturing) {
        /* Not now: freeing could invalidate this thread's capture. */
        pthread_mutex_lock(&b->deferred_mu);
        if (b->n_deferred == b->cap_deferred) {
            size_t cap = b->cap_deferred ? b->cap_deferred * 2 : 16;
            void **n = realloc(b->deferred, cap * sizeof *n);
            if (n) {
                b->deferred = n;
                b->cap_deferred = cap;
            }
        }
        bool queued = b->n_deferred < b->cap_deferred;
        if (queued) b->deferred[b->n_deferred++] = p;
        pthread_mutex_unlock(&b->deferred_mu);
        if (queued) return;
        /* Out of host memory to remember it: leaking a block beats breaking
         * the capture (the backend's accounting still shows it). */
        return;
    }
    pthread_rwlock_wrlock(&b->dev_lock);
    size_t bytes = b->iface->free(b, p);
    pthread_rwlock_unlock(&b->dev_lock);
    __atomic_fetch_sub(&b->bytes_in_use, bytes, __ATOMIC_RELAXED);
}

size_t kern_bytes_in_use(const kern_backend_t *b) {
    return __atomic_load_n(&b->bytes_in_use, __ATOMIC_RELAXED);
}

kern_tensor_t kern_tensor_alloc(kern_backend_t *b, kern_dtype_t dt, int ndim,
                                const int64_t *shape) {
    kern_tensor_t t = kern_tensor_make(NULL, dt, b->device, ndim, shape);
    t.data = kern_alloc(b, kern_tensor_bytes(&t));
    return t;
}

kern_stream_t *kern_stream_new(kern_backend_t *b) {
    kern_stream_t *s = calloc(1, sizeof *s);
    if (!s) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    s->backend = b;
    /* A stream brings a cuBLAS handle and its workspace: device-wide. */
    if (excl_begin(b, "stream creation") != 0) { free(s); return NULL; }
    s->impl = b->iface->stream_new(b);
    excl_end(b);
    if (!s->impl) { free(s); return NULL; }
    __atomic_fetch_add(&b->streams_alive, 1, __ATOMIC_RELEASE);
    return s;
}

void kern_stream_destroy(kern_stream_t **sp) {
    if (!sp || !*sp) return;
    kern_stream_t *s = *sp;
    assert(!s->capturing && "stream destroyed while capturing");
    assert(__atomic_load_n(&s->graphs_alive, __ATOMIC_ACQUIRE) == 0 &&
           "stream destroyed while its graphs live");
    kern_backend_t *b = s->backend;
    kern_free(b, s->arena);
    assert(!tl_capturing && "stream destroyed by a capturing thread");
    pthread_rwlock_wrlock(&b->dev_lock);
    b->iface->stream_destroy(b, s->impl);
    pthread_rwlock_unlock(&b->dev_lock);
    __atomic_fetch_sub(&b->streams_alive, 1, __ATOMIC_RELEASE);
    free(s);
    *sp = NULL;
}

kern_backend_t *kern_stream_backend(const kern_stream_t *s) { return s->backend; }
void *kern_stream_impl(const kern_stream_t *s) { return s->impl; }
bool kern_stream_is_capturing(const kern_stream_t *s) { return s->capturing; }
size_t kern_stream_scratch_size(const kern_stream_t *s) { return s->arena_size; }

int kern_stream_sync(kern_stream_t *s) {
    if (s->capturing) return reel_fail(REEL_E_STATE, "stream sync while capturing");
    return s->backend->iface->stream_sync(s->impl);
}

/* Appends one node to the graph being recorded. */
static int record(kern_graph_t *g, kern_fn_t fn, const void *args, size_t size) {
    if (g->nodes == g->node_cap) {
        size_t cap = g->node_cap ? g->node_cap * 2 : 64;
        rec_node_t *n = realloc(g->node, cap * sizeof *n);
        if (!n) goto oom;
        g->node = n;
        g->node_cap = cap;
    }
    size_t off = (g->args_len + 15) & ~(size_t)15;
    if (off + size > g->args_cap) {
        size_t cap = g->args_cap ? g->args_cap * 2 : 4096;
        while (cap < off + size) cap *= 2;
        unsigned char *a = realloc(g->args, cap);
        if (!a) goto oom;
        g->args = a;
        g->args_cap = cap;
    }
    memcpy(g->args + off, args, size);
    g->node[g->nodes].fn = fn;
    g->node[g->nodes].args_off = off;
    g->nodes++;
    g->args_len = off + size;
    return 0;
oom:
    g->failed = true;
    return reel_fail(REEL_E_NOMEM, "out of memory while recording a graph node");
}

int kern_stream_launch(kern_stream_t *s, kern_fn_t fn, const void *args, size_t args_size) {
    if (s->rec) return record(s->rec, fn, args, args_size);
    return s->backend->iface->launch(s->impl, fn, args);
}

typedef struct { void *dst; const void *src; size_t n; } copy_args_t;

static int copy_kernel(void *ctx, const void *a) {
    (void)ctx;
    const copy_args_t *c = a;
    memmove(c->dst, c->src, c->n);
    return 0;
}

static int copy(kern_stream_t *s, void *dst, const void *src, size_t n, int dir) {
    if (n == 0) return 0;
    if (s->rec) {
        copy_args_t a = { dst, src, n };
        return record(s->rec, copy_kernel, &a, sizeof a);
    }
    return s->backend->iface->copy(s->impl, dst, src, n, dir);
}

int kern_copy_h2d(kern_stream_t *s, void *d, const void *h, size_t n) { return copy(s, d, h, n, 0); }
int kern_copy_d2h(kern_stream_t *s, void *h, const void *d, size_t n) { return copy(s, h, d, n, 1); }
int kern_copy_d2d(kern_stream_t *s, void *d, const void *x, size_t n) { return copy(s, d, x, n, 2); }

int kern_stream_reserve(kern_stream_t *s, size_t bytes) {
    if (bytes <= s->arena_size) return 0;
    if (s->capturing)
        return reel_fail(REEL_E_INVALID, "scratch arena too small (%zu < %zu bytes) during capture: "
                         "reserve it before capturing", s->arena_size, bytes);
    size_t alive = __atomic_load_n(&s->graphs_alive, __ATOMIC_ACQUIRE);
    if (alive)
        return reel_fail(REEL_E_LIMIT, "scratch arena too small (%zu < %zu bytes) while %zu graph(s) "
                         "captured on this stream hold its address",
                         s->arena_size, bytes, alive);
    void *p = kern_alloc(s->backend, bytes);
    if (!p) return -1;
    /* The old arena may still be read by queued work: sync before freeing. */
    if (s->arena && s->backend->iface->stream_sync(s->impl) != 0) {
        kern_free(s->backend, p);
        return -1;
    }
    kern_free(s->backend, s->arena);
    s->arena = p;
    s->arena_size = bytes;
    return 0;
}

kern_scratch_t kern_stream_bind_scratch(kern_stream_t *s, kern_scratch_t sc) {
    kern_scratch_t prev = s->bound;
    s->bound = sc.base ? sc : (kern_scratch_t){ NULL, 0 };
    return prev;
}

void *kern_stream_scratch(kern_stream_t *s, size_t bytes) {
    if (s->bound.base) {
        if (bytes <= s->bound.bytes) return s->bound.base;
        reel_fail(REEL_E_INVALID, "bound scratch too small (%zu < %zu bytes): the workspace's scratch was not "
                  "sized from its kernels' workspace_bytes contracts", s->bound.bytes, bytes);
        return NULL;
    }
    if (kern_stream_reserve(s, bytes) != 0) return NULL;
    return s->arena;
}

int kern_capture_begin(kern_stream_t *s) {
    if (s->capturing) return reel_fail(REEL_E_STATE, "stream is already capturing");
    if (tl_capturing) return reel_fail(REEL_E_STATE, "this thread is already capturing on another stream");
    kern_graph_t *g = calloc(1, sizeof *g);
    if (!g) return reel_fail(REEL_E_NOMEM, "out of memory");
    g->backend = s->backend;
    g->origin = s;
    /* Shared: captures on other streams proceed, device-wide calls wait. */
    pthread_rwlock_rdlock(&s->backend->dev_lock);
    __atomic_fetch_add(&s->backend->captures_active, 1, __ATOMIC_ACQ_REL);
    tl_capturing = 1;
    if (s->backend->iface->capture_begin &&
        s->backend->iface->capture_begin(s->impl) != 0) {
        capture_release(s->backend);
        free(g);
        return -1;
    }
    s->pending = g;
    /* Recorded backends divert launches into g; native ones capture. */
    s->rec = s->backend->iface->capture_begin ? NULL : g;
    s->capturing = true;
    return 0;
}

/* Ends this thread's hold on the device lock, then runs the frees it
 * deferred while capturing. */
static void capture_release(kern_backend_t *b) {
    tl_capturing = 0;
    __atomic_fetch_sub(&b->captures_active, 1, __ATOMIC_ACQ_REL);
    pthread_rwlock_unlock(&b->dev_lock);
    drain_deferred(b);
}

static void graph_free(kern_graph_t *g) {
    if (g->native) g->backend->iface->graph_destroy(g->native);
    free(g->node);
    free(g->args);
    free(g);
}

int kern_capture_end(kern_stream_t *s, kern_graph_t **out) {
    *out = NULL;
    if (!s->capturing) return reel_fail(REEL_E_INVALID, "stream is not capturing");
    kern_backend_t *b = s->backend;
    kern_graph_t *g = s->pending;
    s->pending = NULL;
    s->rec = NULL;
    s->capturing = false;
    int rc = 0;
    if (b->iface->capture_end) {
        /* End and instantiate under the shared hold: still no device-wide
         * call runs on another thread until the graph exists. */
        size_t nodes = 0, bytes = 0;
        rc = b->iface->capture_end(s->impl, &g->native, &nodes, &bytes);
        g->nodes = nodes;
        g->bytes = bytes;
    } else if (g->failed) {
        rc = reel_fail(REEL_E_NOMEM, "graph recording ran out of memory");
    } else {
        g->bytes = g->nodes * sizeof(rec_node_t) + g->args_len;
    }
    capture_release(b);
    if (rc != 0) {
        pthread_rwlock_wrlock(&b->dev_lock);
        graph_free(g);
        pthread_rwlock_unlock(&b->dev_lock);
        return -1;
    }
    __atomic_fetch_add(&s->graphs_alive, 1, __ATOMIC_RELEASE);
    *out = g;
    return 0;
}

int kern_graph_replay(kern_graph_t *g, kern_stream_t *s) {
    if (s->capturing) return reel_fail(REEL_E_INVALID, "graph replay on a capturing stream");
    if (s->backend != g->backend) return reel_fail(REEL_E_INVALID, "graph replayed on another backend");
    /* It baked its stream's scratch and cuBLAS workspace: replaying it on
     * another stream would race with that stream's own work. */
    if (s != g->origin) return reel_fail(REEL_E_INVALID, "graph replayed on a stream other than the one that captured it");
    int rc = 0;
    if (g->native) {
        rc = g->backend->iface->graph_launch(g->native, s->impl);
    } else {
        cpu_replay_mark(1); /* the CPU's kernels ask OpenBLAS nothing new in a replay */
        for (size_t i = 0; i < g->nodes && rc == 0; i++)
            rc = g->node[i].fn(NULL, g->args + g->node[i].args_off);
        cpu_replay_mark(-1);
    }
    if (rc == 0) g->replays++;
    return rc;
}

void kern_graph_destroy(kern_graph_t **gp) {
    if (!gp || !*gp) return;
    kern_graph_t *g = *gp;
    kern_backend_t *b = g->backend;
    size_t was = __atomic_fetch_sub(&g->origin->graphs_alive, 1, __ATOMIC_RELEASE);
    assert(was > 0);
    (void)was;
    /* Destroying an instantiated graph may free device memory. */
    assert(!tl_capturing && "graph destroyed by a capturing thread");
    pthread_rwlock_wrlock(&b->dev_lock);
    graph_free(g);
    pthread_rwlock_unlock(&b->dev_lock);
    *gp = NULL;
}

kern_stream_t *kern_graph_stream(const kern_graph_t *g) { return g->origin; }

size_t kern_graph_nodes(const kern_graph_t *g) { return g->nodes; }
size_t kern_graph_bytes(const kern_graph_t *g) { return g->bytes; }
size_t kern_graph_replays(const kern_graph_t *g) { return g->replays; }

int kern_graph_node(const kern_graph_t *g, size_t i, int (**fn)(void *ctx, const void *args),
                    const void **args) {
    if (g->native || i >= g->nodes) return -1;
    *fn = g->node[i].fn;
    *args = g->args + g->node[i].args_off;
    return 0;
}
