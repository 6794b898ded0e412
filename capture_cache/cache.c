/* cache.c -- the capture lifecycle (see cache.h).
 *
 * Entries live in one list (most recently used first) guarded by the cache
 * mutex. A dispatch takes its stream's lock (recursive: a re-entrant call
 * on the same thread gets through and finds its entry busy), marks its
 * entry in_use under the cache lock, runs kernels without it, and clears
 * in_use under it again: eviction never frees an entry in use; it marks it
 * doomed and the dispatcher frees it on release. Events are queued while
 * the lock is held and delivered after it is dropped, so a callback may
 * call back into the cache.
 *
 * Every entry owns its workspace, scratch included, so entries of any
 * shapes coexist on one stream: a graph reads only its own entry's memory,
 * the caller's pinned inputs and the weights, each checked before a replay.
 *
 * Lock order: stream lock, then cache lock, then the component lock. A
 * re-entrant dispatch takes a second stream lock only if it is free, so no
 * thread ever waits for a stream lock while holding another. */
#include "cache.h"
#include "kernels/artifacts.h"
#include "base/error.h"
#include "base/names.h"
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum {
    ST_WARMUP,      /* eager runs, learning which inputs stay put */
    ST_CAPTURE,     /* warmup done: the next call captures */
    ST_READY,       /* a verified graph; calls replay after the checks */
    ST_REVERIFY,    /* weights updated in place: next call re-verifies */
    ST_BUDGET,      /* the graph did not fit: eager until the budget has room */
    ST_DISABLED,    /* permanent reason: always eager */
} state_t;

typedef struct {
    char name[CAP_NAME_MAX];
    const void *base;
    size_t bytes;
    uint64_t version;
    uint64_t generation;    /* bumped on every update of the memory */
} comp_t;

/* One stream the cache has seen: its lock serializes calls on it. Slots
 * are allocated one by one and never freed before the cache, so a mutex
 * never moves. */
typedef struct {
    kern_stream_t *s;
    pthread_mutex_t mu;     /* recursive */
    int depth;              /* calls inside mu (nesting); written under the cache lock */
} stream_slot_t;

typedef struct entry {
    struct entry *prev, *next;          /* MRU list */
    cap_key_t key;
    char text[CAP_KEY_TEXT_MAX];
    uint64_t hash;
    kern_stream_t *stream;
    int stream_idx;
    const cap_program_t *prog_id;       /* the caller's table: identity only, never read (it
                                         * may be gone by the time the entry is freed) */
    cap_program_t prog;                 /* a copy of it, taken at creation: what the
                                         * entry calls, including after its program and
                                         * user are gone (cache.h, Lifetimes) */
    void *user;
    void *ws;
    size_t ws_bytes;                           /* the workspace's, plus snap's */
    void *snap;                                /* verify's copy of the inputs: allocated with the
                                                * entry, so no verify or audit allocates device
                                                * memory (which could break another stream's capture) */
    bool transient;                            /* not in the list, not accounted */
    kern_tensor_t static_in[CAP_MAX_INPUTS];   /* slots as the workspace made them */
    kern_graph_t *graph;
    size_t graph_bytes;
    bool admitted;                             /* graph accounted (verified and fit) */
    size_t budget_need;                        /* ST_BUDGET: bytes the graph needed */
    state_t state;
    cap_reason_t disabled_reason;
    int warm;
    int capture_fails;                         /* failed captures so far (CAP_CAPTURE_TRIES) */
    bool told_permanent;                       /* the permanent capture_failed was logged */
    uint64_t since_audit;                      /* replays since the last audit */
    bool ident_stable[CAP_MAX_INPUTS];
    kern_tensor_t ident[CAP_MAX_INPUTS];       /* caller's tensor seen in warmup / pinned */
    bool pinned[CAP_MAX_INPUTS];
    cap_const_t consts[CAP_MAX_CONSTS];
    int n_consts;
    int comp[CAP_MAX_COMPONENTS];              /* index into the component table */
    const void *comp_base[CAP_MAX_COMPONENTS]; /* as baked into the graph */
    uint64_t comp_gen[CAP_MAX_COMPONENTS];
    cap_weight_t *wid;                         /* weight buffers baked in (program's weights()) */
    int n_wid;
    cap_weight_t *wid_now;                     /* room for n_wid + 1: the replay-time listing */
    bool in_use, doomed;
    bool reverify_pending;                     /* an inplace sync landed during a capture */
    cap_evict_reason_t doom_reason;
} entry_t;

typedef struct {
    cap_event_t ev;
    char text[CAP_KEY_TEXT_MAX];
    char comp[CAP_NAME_MAX];
} queued_t;

typedef struct {
    queued_t *q;
    size_t n, cap;
    bool lost;          /* an allocation failed: events were dropped (stats still count) */
} evq_t;

typedef struct { uint64_t hash; cap_reason_t reason; } logged_t;

struct cap_cache {
    kern_backend_t *backend;
    cap_options_t opt;
    pthread_mutex_t lock;
    entry_t *head;                  /* most recently used first */
    comp_t comp[CAP_MAX_COMPONENTS];
    int n_comp;                     /* n_comp, names and versions change under lock and comp_lock */
    pthread_mutex_t comp_lock;      /* lets cap_component_version run without lock, so a
                                     * program callback called under lock may use it */
    stream_slot_t **streams;        /* index = stream number in events */
    int n_streams, cap_streams;
    logged_t *logged;
    size_t n_logged, cap_logged;
    cap_stats_t st;
};

static bool invariants(const cap_cache_t *c);

/* This thread's dispatches. A re-entrant one (depth > 0) must not wait for
 * another stream's lock. One made while this thread captures is refused
 * before it takes any lock: the capture holds the device lock shared, and
 * other threads free device memory and destroy graphs (which take it
 * exclusive) while holding the cache lock, so waiting for the cache lock
 * here could deadlock; nor may a capturing thread allocate a workspace or
 * destroy a graph (kernels/backend.h). */
static __thread struct {
    int depth;              /* cap_dispatch calls in progress */
    kern_stream_t *s;       /* the innermost one's stream, whose lock is held */
    bool capturing;         /* capture() is between begin and end */
} tl;

/* SQLite style: the invariants hold at the end of every public function.
 * Checked in builds with -DREEL_INVARIANTS (make asan, make tsan). */
#ifdef REEL_INVARIANTS
#define CHECK_INVARIANTS(c) assert(cap_cache_invariants(c))
#else
#define CHECK_INVARIANTS(c) ((void)0)
#endif

/* ---- names --------------------------------------------------------------- */

static const char *reason_names[CAP_DECLINE_COUNT] = {
    "warming_up", "not_capturable", "override", "shape_mismatch", "pinned_input_moved",
    "constant_changed", "weights_moved", "verify_mismatch", "capture_failed",
    "budget_exceeded", "backend_unavailable", "mutable_output", "entry_busy", "mutable_input",
    "audit_mismatch", "wrong_stream", "artifact_parity",
};
static const char *evict_names[CAP_EVICT_COUNT] = {
    "weight_sync", "lru", "shape_change", "explicit", "shutdown", "audit_mismatch",
};

const char *cap_reason_name(cap_reason_t r) {
    return (unsigned)r < CAP_DECLINE_COUNT ? reason_names[r] : "?";
}
const char *cap_evict_reason_name(cap_evict_reason_t r) {
    return (unsigned)r < CAP_EVICT_COUNT ? evict_names[r] : "?";
}
const char *cap_policy_name(cap_policy_t p) {
    return p == CAP_POLICY_EVICT ? "evict" : p == CAP_POLICY_INPLACE ? "inplace" : "?";
}
int cap_policy_parse(const char *s, cap_policy_t *out) {
    if (!strcmp(s, "evict")) *out = CAP_POLICY_EVICT;
    else if (!strcmp(s, "inplace")) *out = CAP_POLICY_INPLACE;
    else return kern_fail("unknown weight update policy '%s' (expected evict or inplace)", s);
    return 0;
}
bool cap_reason_permanent(cap_reason_t r) {
    return r == CAP_DECLINE_VERIFY_MISMATCH || r == CAP_DECLINE_BACKEND_UNAVAILABLE;
}

cap_options_t cap_options_default(void) {
    cap_options_t o;
    memset(&o, 0, sizeof o);
    o.warmup = 2;
    o.policy = CAP_POLICY_EVICT;
    o.graphs = true;
    o.pin_inputs = true;
    o.check_weights = true;
    o.audit_every = 0;
    return o;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- events and logging --------------------------------------------------- */

static void log_msg(cap_cache_t *c, int level, const char *msg);

static void evq_push(evq_t *q, cap_event_kind_t kind, int reason, const entry_t *e, size_t bytes,
                     size_t nodes, double secs, const char *comp, uint64_t from, uint64_t to) {
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 8;
        queued_t *n = realloc(q->q, cap * sizeof *n);
        if (!n) { q->lost = true; return; }
        q->q = n;
        q->cap = cap;
    }
    queued_t *x = &q->q[q->n++];
    memset(&x->ev, 0, sizeof x->ev);
    x->ev.kind = kind;
    x->ev.reason = reason;
    snprintf(x->text, sizeof x->text, "%s", e->text);
    x->ev.key_hash = e->hash;
    x->ev.stream = e->stream_idx;
    x->ev.bytes = bytes;
    x->ev.nodes = nodes;
    x->ev.seconds = secs;
    if (comp) snprintf(x->comp, sizeof x->comp, "%s", comp);
    else x->comp[0] = 0;
    x->ev.from_version = from;
    x->ev.to_version = to;
}

/* Delivers and frees the queued events; the queue is empty afterwards. */
static void evq_flush(cap_cache_t *c, evq_t *q) {
    for (size_t i = 0; i < q->n; i++) {
        q->q[i].ev.key_text = q->q[i].text;
        q->q[i].ev.component = q->q[i].comp[0] ? q->q[i].comp : NULL;
        if (c->opt.on_event) c->opt.on_event(c->opt.event_user, &q->q[i].ev);
    }
    if (q->lost) log_msg(c, 2, "capture cache: out of memory queueing events; some were not delivered");
    free(q->q);
    memset(q, 0, sizeof *q);
}

static void log_msg(cap_cache_t *c, int level, const char *msg) {
    if (c->opt.log) c->opt.log(c->opt.log_user, level, msg);
    else if (level >= 2) fprintf(stderr, "reel: warning: %s\n", msg);
}

/* True the first time (hash, reason) is seen. Caller holds the lock. */
static bool first_time(cap_cache_t *c, uint64_t hash, cap_reason_t r) {
    for (size_t i = 0; i < c->n_logged; i++)
        if (c->logged[i].hash == hash && c->logged[i].reason == r) return false;
    if (c->n_logged == c->cap_logged) {
        size_t cap = c->cap_logged ? c->cap_logged * 2 : 32;
        logged_t *l = realloc(c->logged, cap * sizeof *l);
        if (!l) return true; /* log again rather than never */
        c->logged = l;
        c->cap_logged = cap;
    }
    c->logged[c->n_logged].hash = hash;
    c->logged[c->n_logged++].reason = r;
    return true;
}

/* ---- entries ---------------------------------------------------------------- */

static void unlink_entry(cap_cache_t *c, entry_t *e) {
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(cap_cache_t *c, entry_t *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    c->head = e;
}

/* Caller holds the lock (or owns e alone: transient entries never hold an
 * admitted graph). */
static void drop_graph(cap_cache_t *c, entry_t *e) {
    if (!e->graph) return;
    kern_graph_destroy(&e->graph);
    if (e->admitted) {
        c->st.bytes_held -= e->graph_bytes;
        c->st.graph_bytes -= e->graph_bytes;
        c->st.graphs--;
    }
    e->admitted = false;
    e->graph_bytes = 0;
}

/* Frees e (not in use, not linked). An entry in the list has its bytes
 * accounted; a transient one does not. Caller holds the lock for a listed
 * entry. */
static void free_entry(cap_cache_t *c, entry_t *e) {
    assert(!e->transient || !e->graph);
    drop_graph(c, e);
    for (int i = 0; i < e->prog.n_inputs; i++) *e->prog.input(e->user, e->ws, i) = e->static_in[i];
    e->prog.ws_free(e->user, e->ws);
    kern_free(c->backend, e->snap);
    if (!e->transient) {
        c->st.bytes_held -= e->ws_bytes;
        c->st.ws_bytes -= e->ws_bytes;
        c->st.entries--;
    }
    free(e->wid);
    free(e->wid_now);
    free(e);
}

/* Evicts e with reason (or dooms it when a dispatch holds it). */
static void evict(cap_cache_t *c, entry_t *e, cap_evict_reason_t r, evq_t *q, const char *comp,
                  uint64_t from, uint64_t to) {
    evq_push(q, CAP_EV_EVICT, r, e, e->ws_bytes + e->graph_bytes, 0, 0, comp, from, to);
    c->st.evictions[r]++;
    if (e->in_use) {
        e->doomed = true;
        e->doom_reason = r;
        return;
    }
    unlink_entry(c, e);
    free_entry(c, e);
}

/* The slot of stream s, made on first sight; -1 with a message when out of
 * memory. Caller holds the lock. */
static int stream_slot(cap_cache_t *c, kern_stream_t *s) {
    for (int i = 0; i < c->n_streams; i++)
        if (c->streams[i]->s == s) return i;
    if (c->n_streams == c->cap_streams) {
        int cap = c->cap_streams ? c->cap_streams * 2 : 8;
        stream_slot_t **n = realloc(c->streams, (size_t)cap * sizeof *n);
        if (!n) return kern_fail("out of memory");
        c->streams = n;
        c->cap_streams = cap;
    }
    stream_slot_t *sl = calloc(1, sizeof *sl);
    if (!sl) return kern_fail("out of memory");
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    int rc = pthread_mutex_init(&sl->mu, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) {
        free(sl);
        return kern_fail("cannot create a stream lock");
    }
    sl->s = s;
    c->streams[c->n_streams] = sl;
    return c->n_streams++;
}

static int comp_find(const cap_cache_t *c, const char *name) {
    for (int i = 0; i < c->n_comp; i++)
        if (!strcmp(c->comp[i].name, name)) return i;
    return -1;
}

/* Resolves p's components into comp[]; -1 with a message. Caller holds the lock. */
static int resolve_components(const cap_cache_t *c, const cap_program_t *p, int *comp) {
    if (p->n_inputs > CAP_MAX_INPUTS || p->n_components > CAP_MAX_COMPONENTS || p->n_inputs < 0 ||
        p->n_outputs < 0 || p->n_components < 0)
        return kern_fail("program %s: too many inputs or components", p->name);
    for (int i = 0; i < p->n_components; i++) {
        comp[i] = comp_find(c, p->components[i]);
        if (comp[i] < 0)
            return kern_fail("program %s reads weight component '%s', which is not registered", p->name,
                             p->components[i]);
    }
    return 0;
}

/* True when e was made for program p: the same table at the same address
 * (a table freed and another made at its address is another program). */
static bool same_program(const entry_t *e, const cap_program_t *p) {
    return e->prog_id == p && !memcmp(&e->prog, p, sizeof *p);
}

static entry_t *find(cap_cache_t *c, kern_stream_t *s, const cap_program_t *p, void *user, uint64_t hash,
                     const char *text) {
    for (entry_t *e = c->head; e; e = e->next)
        if (!e->doomed && e->hash == hash && e->stream == s && same_program(e, p) && e->user == user &&
            !strcmp(e->text, text))
            return e;
    return NULL;
}

static bool make_room(cap_cache_t *c, entry_t *keep, size_t need, evq_t *q);

/* Evicts every idle entry (lru): the last resort when a workspace cannot
 * be allocated. True if any was evicted. Caller holds the lock. */
static bool evict_idle(cap_cache_t *c, evq_t *q) {
    bool any = false;
    entry_t *next;
    for (entry_t *e = c->head; e; e = next) {
        next = e->next;
        if (e->in_use || e->doomed) continue;
        evict(c, e, CAP_EVICT_LRU, q, NULL, 0, 0);
        any = true;
    }
    return any;
}

/* A new entry for (key, s, p, user) with its own workspace, not linked and
 * not accounted. Takes the lock only to free memory when the first
 * allocation fails. NULL with a message. */
static entry_t *entry_make(cap_cache_t *c, kern_stream_t *s, int sidx, const cap_program_t *p, void *user,
                           const cap_key_t *key, uint64_t hash, const char *text, const int *comp, evq_t *q) {
    entry_t *e = calloc(1, sizeof *e);
    if (!e) { kern_fail("out of memory"); return NULL; }
    e->ws = p->ws_new(user, key, s);
    if (!e->ws) {
        /* Device memory is what idle entries hold: give it back and retry once. */
        pthread_mutex_lock(&c->lock);
        bool freed = evict_idle(c, q);
        pthread_mutex_unlock(&c->lock);
        if (freed) e->ws = p->ws_new(user, key, s);
    }
    if (!e->ws) { free(e); return NULL; }
    e->key = *key;
    snprintf(e->text, sizeof e->text, "%s", text);
    e->hash = hash;
    e->stream = s;
    e->stream_idx = sidx;
    e->prog_id = p;
    memcpy(&e->prog, p, sizeof e->prog);
    e->user = user;
    memcpy(e->comp, comp, sizeof e->comp);
    e->ws_bytes = p->ws_bytes(user, e->ws);
    size_t snap = 0;
    for (int i = 0; i < p->n_inputs; i++) {
        e->static_in[i] = *p->input(user, e->ws, i);
        e->ident_stable[i] = p->pinnable[i] && c->opt.pin_inputs;
        snap += (kern_tensor_bytes(&e->static_in[i]) + 255) & ~(size_t)255;
    }
    if (!(e->snap = kern_alloc(c->backend, snap))) {
        p->ws_free(user, e->ws);
        free(e);
        return NULL;
    }
    e->ws_bytes += snap;
    e->state = ST_WARMUP;
    return e;
}

/* Where verify keeps input i's copy, inside e->snap. */
static void *snap_of(const entry_t *e, int i) {
    size_t off = 0;
    for (int j = 0; j < i; j++) off += (kern_tensor_bytes(&e->static_in[j]) + 255) & ~(size_t)255;
    return (char *)e->snap + off;
}

/* Links e into the list and accounts its workspace. Caller holds the lock. */
static void entry_admit(cap_cache_t *c, entry_t *e) {
    c->st.bytes_held += e->ws_bytes;
    c->st.ws_bytes += e->ws_bytes;
    c->st.entries++;
    push_front(c, e);
}

/* ---- binding ---------------------------------------------------------------- */

static bool same_ident(const kern_tensor_t *a, const kern_tensor_t *b) {
    if (a->data != b->data || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->device != b->device)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d]) return false;
    return true;
}

/* Checks every input against its static slot: -1 with a message if one
 * does not fit. */
static int check_inputs(const entry_t *e, const cap_call_t *call) {
    for (int i = 0; i < e->prog.n_inputs; i++) {
        const kern_tensor_t *in = &call->inputs[i], *st = &e->static_in[i];
        if (!kern_tensor_same_shape(in, st)) {
            char a[96], b[96];
            const char *name = i < e->key.n_inputs ? e->key.inputs[i].name : "?";
            return kern_fail("bind: input %d '%s' is %s; the static workspace holds %s (nothing is resized)",
                             i, name, kern_tensor_describe(in, a, sizeof a), kern_tensor_describe(st, b, sizeof b));
        }
        if (!in->data) return kern_fail("bind: input %d has no data", i);
    }
    return 0;
}

/* Copies src (any strides on the host; contiguous on a device) into the
 * contiguous static tensor dst. */
static int copy_into(kern_stream_t *s, const kern_tensor_t *dst, const kern_tensor_t *src) {
    size_t bytes = kern_tensor_bytes(dst);
    if (kern_tensor_is_contiguous(src)) {
        if (src->device == KERN_DEVICE_HOST && dst->device != KERN_DEVICE_HOST)
            return kern_copy_h2d(s, kern_tensor_ptr(dst), kern_tensor_ptr(src), bytes);
        return kern_copy_d2d(s, kern_tensor_ptr(dst), kern_tensor_ptr(src), bytes);
    }
    if (src->device != KERN_DEVICE_HOST || dst->device != KERN_DEVICE_HOST)
        return kern_fail("bind: a non-contiguous input must be on the host");
    /* Strided gather on the host, element by element. */
    if (kern_stream_sync(s) != 0) return -1;
    size_t es = kern_dtype_size(src->dtype);
    int64_t n = kern_tensor_numel(src), idx[KERN_MAX_DIMS] = { 0 };
    char *out = kern_tensor_ptr(dst);
    const char *in = kern_tensor_ptr(src);
    for (int64_t j = 0; j < n; j++) {
        int64_t off = 0;
        for (int d = 0; d < src->ndim; d++) off += idx[d] * src->stride[d];
        memcpy(out + (size_t)j * es, in + off * (int64_t)es, es);
        for (int d = src->ndim - 1; d >= 0; d--) {
            if (++idx[d] < src->shape[d]) break;
            idx[d] = 0;
        }
    }
    return 0;
}

/* Points every slot at its static buffer (or, for pinned inputs when
 * use_pins, at the caller's tensor) and copies what is not read in place. */
static int bind(entry_t *e, kern_stream_t *s, const cap_call_t *call, bool use_pins, uint64_t *copied,
                uint64_t *pinned) {
    for (int i = 0; i < e->prog.n_inputs; i++) {
        kern_tensor_t *slot = e->prog.input(e->user, e->ws, i);
        size_t bytes = kern_tensor_bytes(&e->static_in[i]);
        if (use_pins && e->pinned[i]) {
            *slot = call->inputs[i];
            *pinned += bytes;
            continue;
        }
        *slot = e->static_in[i];
        if (copy_into(s, slot, &call->inputs[i]) != 0) return -1;
        *copied += bytes;
    }
    return 0;
}

static int copy_out(entry_t *e, kern_stream_t *s, const cap_call_t *call) {
    for (int i = 0; i < e->prog.n_outputs; i++) {
        const kern_tensor_t *src = e->prog.output(e->user, e->ws, i), *dst = &call->outputs[i];
        if (dst->dtype != src->dtype || kern_tensor_numel(dst) != kern_tensor_numel(src) ||
            !kern_tensor_is_contiguous(dst) || !dst->data) {
            char a[96], b[96];
            return kern_fail("copy-out: output %d destination is %s, the step writes %s", i,
                             kern_tensor_describe(dst, a, sizeof a), kern_tensor_describe(src, b, sizeof b));
        }
        size_t bytes = kern_tensor_bytes(src);
        int rc = dst->device == KERN_DEVICE_HOST && src->device != KERN_DEVICE_HOST
                     ? kern_copy_d2h(s, kern_tensor_ptr(dst), kern_tensor_ptr(src), bytes)
                     : kern_copy_d2d(s, kern_tensor_ptr(dst), kern_tensor_ptr(src), bytes);
        if (rc != 0) return -1;
    }
    return kern_stream_sync(s);
}

static bool consts_equal(const entry_t *e, const cap_call_t *call) {
    if (call->n_consts != e->n_consts) return false;
    for (int i = 0; i < e->n_consts; i++) {
        const cap_const_t *a = &e->consts[i], *b = &call->consts[i];
        if (strcmp(a->name, b->name) || a->type != b->type) return false;
        if (a->type == CAP_CONST_I64 ? a->v.i != b->v.i : memcmp(&a->v.f, &b->v.f, sizeof a->v.f))
            return false;
    }
    return true;
}

/* True when some output destination overlaps an input read in place. */
static bool output_aliases_pin(const entry_t *e, const cap_call_t *call) {
    for (int o = 0; o < e->prog.n_outputs; o++) {
        const char *d0 = kern_tensor_ptr(&call->outputs[o]);
        const char *d1 = d0 + kern_tensor_bytes(&call->outputs[o]);
        for (int i = 0; i < e->prog.n_inputs; i++) {
            if (!e->pinned[i]) continue;
            const char *p0 = kern_tensor_ptr(&call->inputs[i]);
            const char *p1 = p0 + kern_tensor_bytes(&call->inputs[i]);
            if (d0 < p1 && p0 < d1) return true;
        }
    }
    return false;
}

/* ---- weight identity ------------------------------------------------------- */

/* Records the weight buffers the graph bakes in (the program's listing
 * now). 0, or -1 with a message. */
static int record_weights(entry_t *e) {
    const cap_program_t *p = &e->prog;
    e->n_wid = 0;
    if (!p->weights) return 0;
    int n = p->weights(e->user, NULL, 0);
    if (n < 0) return -1;
    cap_weight_t *w = calloc((size_t)n + 1, sizeof *w), *now = calloc((size_t)n + 1, sizeof *now);
    if (!w || !now) {
        free(w);
        free(now);
        return kern_fail("out of memory recording weight identities");
    }
    if (p->weights(e->user, w, n) != n) {
        free(w);
        free(now);
        return kern_fail("program %s listed a different number of weights twice in a row", p->name);
    }
    free(e->wid);
    free(e->wid_now);
    e->wid = w;
    e->wid_now = now;
    e->n_wid = n;
    return 0;
}

/* True while every weight buffer the graph read is still where, as large
 * and of the dtype it was at capture (and no buffer was added). */
static bool weights_same(const cap_cache_t *c, entry_t *e) {
    const cap_program_t *p = &e->prog;
    if (!p->weights || !c->opt.check_weights) return true;
    if (!e->wid_now) return false;
    int n = p->weights(e->user, e->wid_now, e->n_wid + 1);
    if (n != e->n_wid) return false;
    for (int i = 0; i < n; i++) {
        const cap_weight_t *a = &e->wid[i], *b = &e->wid_now[i];
        if (a->addr != b->addr || a->bytes != b->bytes || a->dtype != b->dtype || a->component != b->component)
            return false;
    }
    return true;
}

/* ---- the paths of a call ----------------------------------------------------- */

typedef struct {
    uint64_t copied, pinned;
    double t0;
} call_acct_t;

/* Binds every input as a copy and launches: an eager run never reads a
 * caller's tensor in place, so a step that writes its inputs (legal for
 * copied ones) never writes the caller's buffer. */
static int launch_eager(entry_t *e, kern_stream_t *s, const cap_call_t *call, call_acct_t *a) {
    if (bind(e, s, call, false, &a->copied, &a->pinned) != 0) return -1;
    return e->prog.launch(e->user, e->ws, call->consts, call->n_consts, s);
}

static int run_eager(entry_t *e, kern_stream_t *s, const cap_call_t *call, call_acct_t *a) {
    if (launch_eager(e, s, call, a) != 0) return -1;
    return copy_out(e, s, call);
}

/* Host copies of every output, for a bitwise comparison. */
static int outputs_to_host(entry_t *e, kern_stream_t *s, unsigned char **buf, size_t *len) {
    size_t total = 0;
    for (int i = 0; i < e->prog.n_outputs; i++) total += kern_tensor_bytes(e->prog.output(e->user, e->ws, i));
    unsigned char *h = malloc(total ? total : 1);
    if (!h) return kern_fail("out of memory");
    size_t off = 0;
    for (int i = 0; i < e->prog.n_outputs; i++) {
        const kern_tensor_t *t = e->prog.output(e->user, e->ws, i);
        size_t b = kern_tensor_bytes(t);
        if (kern_copy_d2h(s, h + off, kern_tensor_ptr(t), b) != 0) { free(h); return -1; }
        off += b;
    }
    if (kern_stream_sync(s) != 0) { free(h); return -1; }
    *buf = h;
    *len = total;
    return 0;
}

/* Compares each pinned input with its host snapshot; one that changed is
 * restored from it and, if *bad is still -1, named in *bad. 0, or -1 on
 * failure. */
static int pinned_check(entry_t *e, kern_stream_t *s, const cap_call_t *call, unsigned char **hsnap, int *bad) {
    for (int i = 0; i < e->prog.n_inputs; i++) {
        if (!hsnap[i]) continue;
        size_t bytes = kern_tensor_bytes(&call->inputs[i]);
        unsigned char *now = malloc(bytes ? bytes : 1);
        if (!now) return kern_fail("out of memory");
        int rc = kern_copy_d2h(s, now, kern_tensor_ptr(&call->inputs[i]), bytes);
        if (rc == 0) rc = kern_stream_sync(s);
        bool changed = rc == 0 && memcmp(now, hsnap[i], bytes) != 0;
        free(now);
        if (rc != 0) return -1;
        if (!changed) continue;
        if (*bad < 0) *bad = i;
        if (kern_copy_h2d(s, kern_tensor_ptr(&call->inputs[i]), hsnap[i], bytes) != 0 || kern_stream_sync(s) != 0)
            return -1;
    }
    return 0;
}

/* Replays e's graph once and runs eager on the same inputs. Returns 1 when
 * every output is bitwise equal and no input read in place changed; 0 when
 * the outputs differ; 2 when the step wrote a pinned input (*bad names the
 * first; every pinned input is restored, as eager, which copies them, would
 * leave them); -1 on failure. Leaves the workspace as the eager run left it
 * (the call's correct result). Slots must be bound. */
static int verify(cap_cache_t *c, entry_t *e, kern_stream_t *s, const cap_call_t *call, int *bad) {
    (void)c;
    void *snap[CAP_MAX_INPUTS] = { 0 };
    unsigned char *hsnap[CAP_MAX_INPUTS] = { 0 };
    unsigned char *ha = NULL, *hb = NULL;
    size_t la = 0, lb = 0;
    int rc = -1;
    *bad = -1;
    /* Snapshot every input: copied ones because the step may update them in
     * place (legal), pinned ones to prove it does not write them. */
    for (int i = 0; i < e->prog.n_inputs; i++) {
        if (e->pinned[i]) {
            size_t bytes = kern_tensor_bytes(&call->inputs[i]);
            if (!(hsnap[i] = malloc(bytes ? bytes : 1))) { kern_fail("out of memory"); goto out; }
            if (kern_copy_d2h(s, hsnap[i], kern_tensor_ptr(&call->inputs[i]), bytes) != 0) goto out;
            continue;
        }
        size_t bytes = kern_tensor_bytes(&e->static_in[i]);
        snap[i] = snap_of(e, i);
        if (kern_copy_d2d(s, snap[i], kern_tensor_ptr(&e->static_in[i]), bytes) != 0) goto out;
    }
    if (kern_stream_sync(s) != 0) goto out;
    if (kern_graph_replay(e->graph, s) != 0 || outputs_to_host(e, s, &ha, &la) != 0) goto out;
    if (pinned_check(e, s, call, hsnap, bad) != 0) goto out;
    for (int i = 0; i < e->prog.n_inputs; i++)
        if (snap[i] && kern_copy_d2d(s, kern_tensor_ptr(&e->static_in[i]), snap[i],
                                     kern_tensor_bytes(&e->static_in[i])) != 0)
            goto out;
    if (e->prog.launch(e->user, e->ws, call->consts, call->n_consts, s) != 0) goto out;
    if (outputs_to_host(e, s, &hb, &lb) != 0) goto out;
    if (pinned_check(e, s, call, hsnap, bad) != 0) goto out;
    rc = *bad >= 0 ? 2 : la == lb && memcmp(ha, hb, la) == 0;
out:
    if (kern_stream_sync(s) != 0) rc = -1;
    for (int i = 0; i < e->prog.n_inputs; i++) free(hsnap[i]);
    free(ha);
    free(hb);
    return rc;
}

/* Evicts LRU entries other than keep (not in use) until `need` more bytes
 * fit the budget. True when they fit. Caller holds the lock. */
static bool make_room(cap_cache_t *c, entry_t *keep, size_t need, evq_t *q) {
    if (!c->opt.budget_bytes) return true;
    /* Evict nothing unless evicting every idle entry would make it fit: a
     * graph that cannot fit anyway must not cost the other keys theirs. */
    size_t idle = 0;
    for (entry_t *e = c->head; e; e = e->next)
        if (e != keep && !e->in_use && !e->doomed) idle += e->ws_bytes + e->graph_bytes;
    if (need > c->opt.budget_bytes || c->st.bytes_held - idle + need > c->opt.budget_bytes) return false;
    while (c->st.bytes_held + need > c->opt.budget_bytes) {
        entry_t *victim = NULL;
        for (entry_t *e = c->head; e; e = e->next)
            if (e != keep && !e->in_use && !e->doomed) victim = e; /* last = least recent */
        if (!victim) return false;
        evict(c, victim, CAP_EVICT_LRU, q, NULL, 0, 0);
    }
    return true;
}

/* Records a decline: counts, queues the event, logs once per (reason, key). */
static void declined(cap_cache_t *c, entry_t *e, cap_reason_t r, evq_t *q, char *logbuf, size_t loglen) {
    c->st.declines[r]++;
    evq_push(q, CAP_EV_DECLINE, r, e, 0, 0, 0, NULL, 0, 0);
    bool gone = cap_reason_permanent(r) || (r == CAP_DECLINE_CAPTURE_FAILED && e->state == ST_DISABLED);
    /* A retried capture failure is logged again once it becomes permanent. */
    bool now_gone = gone && r == CAP_DECLINE_CAPTURE_FAILED && !e->told_permanent;
    if (now_gone) e->told_permanent = true;
    if (r != CAP_DECLINE_WARMING_UP && (first_time(c, e->hash, r) || now_gone))
        snprintf(logbuf, loglen, "capture declined (%s%s) for %s; further declines for this reason "
                 "and key are counted, not logged", cap_reason_name(r),
                 gone ? ", permanent: the key runs eagerly from now on"
                 : r == CAP_DECLINE_CAPTURE_FAILED ? ", will retry" : "", e->text);
}

/* The graph verified and fit: hold it. Caller holds the lock. */
static void admit_graph(cap_cache_t *c, entry_t *e, size_t gb) {
    e->admitted = true;
    e->graph_bytes = gb;
    c->st.bytes_held += gb;
    c->st.graph_bytes += gb;
    c->st.graphs++;
}

/* Captures e's step (slots bound with pins). On success e->graph is set and
 * admitted, and the workspace holds the verified eager result. On a refusal
 * after verify returns 0 with *why set (and *bad for mutable_input); the
 * workspace holds the eager result. Returns 1 with *why set when nothing
 * ran (the capture or its preparation failed): the caller runs the step.
 * -1 when verify itself fails. */
static int capture(cap_cache_t *c, entry_t *e, kern_stream_t *s, const cap_call_t *call,
                   cap_reason_t *why, int *bad, evq_t *q, double *secs) {
    double t0 = now();
    kern_graph_t *g = NULL;
    *why = CAP_DECLINE_COUNT;
    if (record_weights(e) != 0) {
        *why = CAP_DECLINE_CAPTURE_FAILED;
        goto failed;
    }
    if (kern_capture_begin(s) != 0) {
        *why = CAP_DECLINE_BACKEND_UNAVAILABLE;
        return 1;
    }
    tl.capturing = true;
    int lrc = e->prog.launch(e->user, e->ws, call->consts, call->n_consts, s);
    int erc = kern_capture_end(s, &g);
    tl.capturing = false;
    if (lrc != 0 || erc != 0) {
        kern_graph_destroy(&g);
        *why = CAP_DECLINE_CAPTURE_FAILED;
        goto failed;
    }
    e->graph = g;
    int v = verify(c, e, s, call, bad);
    if (v != 1) {
        e->graph = NULL;
        kern_graph_destroy(&g);
        if (v < 0) return -1;
        *why = v == 2 ? CAP_DECLINE_MUTABLE_INPUT : CAP_DECLINE_VERIFY_MISMATCH;
        return 0; /* the workspace holds the eager result */
    }
    size_t gb = kern_graph_bytes(g);
    pthread_mutex_lock(&c->lock);
    bool fits = make_room(c, e, gb, q);
    if (fits) {
        admit_graph(c, e, gb);
        c->st.captures++;
        c->st.verifies++;
        *secs = now() - t0;
        c->st.capture_seconds += *secs;
        reel_hist_observe(&c->st.capture_hist, *secs);
        evq_push(q, CAP_EV_CAPTURE, 0, e, gb + e->ws_bytes, kern_graph_nodes(g), *secs, NULL, 0, 0);
    }
    pthread_mutex_unlock(&c->lock);
    if (!fits) {
        e->graph = NULL;
        kern_graph_destroy(&g);
        e->budget_need = gb;
        *why = CAP_DECLINE_BUDGET_EXCEEDED;
    }
    return 0;
failed: {
    char msg[CAP_KEY_TEXT_MAX + 560];
    snprintf(msg, sizeof msg, "capture of %s failed: %.500s", e->text, kern_error());
    log_msg(c, 2, msg);
    return 1;
}
}

/* The entry stops reading input i in place and captures again (copying
 * it) on its next call. Caller holds the lock. */
static void unpin_and_recapture(cap_cache_t *c, entry_t *e, int i) {
    drop_graph(c, e);
    if (i >= 0) e->ident_stable[i] = false;
    memset(e->pinned, 0, sizeof e->pinned);
    e->state = ST_CAPTURE;
}

/* One call in progress: what the phases of a dispatch share. */
typedef enum { P_EAGER, P_CAPTURE, P_REPLAY, P_REVERIFY, P_AUDIT } path_t;

typedef struct {
    cap_cache_t *c;
    kern_stream_t *s;
    stream_slot_t *sl;
    const cap_program_t *p;
    void *user;
    const cap_call_t *call;
    entry_t *e;
    path_t path;
    cap_reason_t reason;        /* COUNT: no decline */
    cap_ran_t ran;
    call_acct_t acct;
    evq_t q;
    char logbuf[CAP_KEY_TEXT_MAX + 200];
} dispatch_t;

/* True when every registered component the key names is at its registered
 * version. Caller holds the lock. */
static bool key_versions_current(const cap_cache_t *c, const cap_key_t *k) {
    for (int i = 0; i < k->n_components; i++) {
        int ci = comp_find(c, k->components[i].name);
        if (ci >= 0 && c->comp[ci].version != k->components[i].version) return false;
    }
    return true;
}

/* Finds the call's entry, or admits a new one; a busy entry, a new one the
 * budget cannot hold, or a call already declined (d->reason set) gives a
 * transient entry instead (d->reason says why). Caller holds the lock,
 * which is dropped and retaken around the workspace allocation. -1 with a
 * message when no workspace can be made. */
static int acquire(dispatch_t *d, int si, const int *comp, const char *text, uint64_t hash) {
    cap_cache_t *c = d->c;
    d->e = d->reason == CAP_DECLINE_COUNT ? find(c, d->s, d->p, d->user, hash, text) : NULL;
    if (d->e && d->e->in_use) {
        d->reason = CAP_DECLINE_ENTRY_BUSY;
        d->e = NULL;
    } else if (!d->e && d->reason == CAP_DECLINE_COUNT && d->p->ws_size &&
               !make_room(c, NULL, d->p->ws_size(d->user, d->call->key), &d->q)) {
        d->reason = CAP_DECLINE_BUDGET_EXCEEDED;
    }
    if (d->e) return 0;
    pthread_mutex_unlock(&c->lock);
    entry_t *e = entry_make(c, d->s, si, d->p, d->user, d->call->key, hash, text, comp, &d->q);
    pthread_mutex_lock(&c->lock);
    if (!e) return -1;
    /* A sync may have landed while the lock was down: an entry of the old
     * version would be re-keyed onto the live one by the next in-place sync. */
    if (d->reason == CAP_DECLINE_COUNT && !key_versions_current(c, d->call->key)) d->reason = CAP_DECLINE_WEIGHTS_MOVED;
    if (d->reason == CAP_DECLINE_COUNT && make_room(c, NULL, e->ws_bytes, &d->q)) {
        entry_admit(c, e);
    } else {
        e->transient = true;
        if (d->reason == CAP_DECLINE_COUNT) d->reason = CAP_DECLINE_BUDGET_EXCEEDED;
    }
    d->e = e;
    return 0;
}

/* Runs the call eagerly in a transient entry and frees it. Caller holds
 * the lock; it is released on return. */
static int run_transient(dispatch_t *d, double t0) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    c->st.transient_runs++;
    pthread_mutex_unlock(&c->lock);
    int rc = run_eager(e, d->s, d->call, &d->acct);
    pthread_mutex_lock(&c->lock);
    c->st.bind_bytes_copied += d->acct.copied;
    if (rc == 0) {
        c->st.eager_runs++;
        c->st.eager_seconds += now() - t0;
        declined(c, e, d->reason, &d->q, d->logbuf, sizeof d->logbuf);
    }
    d->sl->depth--;
    pthread_mutex_unlock(&c->lock);
    free_entry(c, e);
    d->ran = CAP_RAN_EAGER;
    return rc;
}

/* The checks a READY (or REVERIFY) entry passes before it may replay; sets
 * d->reason on the first miss and repairs the entry for what follows. */
static void check_replay(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    const cap_call_t *call = d->call;
    for (int i = 0; i < d->p->n_inputs; i++)
        if (e->pinned[i] && !same_ident(&e->ident[i], &call->inputs[i])) {
            /* Never read the old address. The input does not stay put, so
             * stop pinning it: the next call captures again, copying it. */
            d->reason = CAP_DECLINE_PINNED_INPUT_MOVED;
            e->ident_stable[i] = false;
        }
    if (d->reason == CAP_DECLINE_PINNED_INPUT_MOVED) {
        unpin_and_recapture(c, e, -1);
        return;
    }
    if (!consts_equal(e, call)) {
        d->reason = CAP_DECLINE_CONSTANT_CHANGED;
        return;
    }
    bool moved = false;
    for (int i = 0; i < d->p->n_components; i++) {
        const comp_t *k = &c->comp[e->comp[i]];
        if (k->base != e->comp_base[i] || k->generation != e->comp_gen[i]) moved = true;
    }
    if (moved || !weights_same(c, e)) {
        /* The graph baked weights that are no longer where it reads: drop
         * it (never replay it again) and learn again. */
        d->reason = CAP_DECLINE_WEIGHTS_MOVED;
        drop_graph(c, e);
        e->state = ST_WARMUP;
        e->warm = 0;
        return;
    }
    if (output_aliases_pin(e, call)) {
        d->reason = CAP_DECLINE_MUTABLE_OUTPUT;
        return;
    }
    if (kern_graph_stream(e->graph) != d->s) {
        /* A graph baked its stream's scratch and cuBLAS workspace. */
        d->reason = CAP_DECLINE_WRONG_STREAM;
        unpin_and_recapture(c, e, -1);
    }
}

/* Chooses the path of the call from the entry's state. Caller holds the
 * lock (syncs read and write entry states under it). */
static void decide(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    d->path = P_EAGER;
    if (d->call->not_capturable) d->reason = CAP_DECLINE_NOT_CAPTURABLE;
    else if (d->call->override || !c->opt.graphs) d->reason = CAP_DECLINE_OVERRIDE;
    else switch (e->state) {
    case ST_DISABLED:
        d->reason = e->disabled_reason;
        break;
    case ST_WARMUP:
        d->reason = CAP_DECLINE_WARMING_UP;
        break;
    case ST_BUDGET:
        if (!c->opt.budget_bytes || c->st.bytes_held + e->budget_need <= c->opt.budget_bytes)
            d->path = P_CAPTURE;
        else
            d->reason = CAP_DECLINE_BUDGET_EXCEEDED;
        break;
    case ST_CAPTURE:
        d->path = P_CAPTURE;
        break;
    case ST_READY:
    case ST_REVERIFY:
        check_replay(d);
        if (d->reason != CAP_DECLINE_COUNT) break;
        if (e->state == ST_REVERIFY) {
            d->path = P_REVERIFY;
        } else if (c->opt.audit_every > 0 && ++e->since_audit >= (uint64_t)c->opt.audit_every) {
            e->since_audit = 0;
            d->path = P_AUDIT;
        } else {
            d->path = P_REPLAY;
        }
        break;
    }
}

/* An eager call; in warmup it also learns which pinnable inputs stay put. */
static int run_eager_path(dispatch_t *d) {
    entry_t *e = d->e;
    if (e->state == ST_WARMUP && d->reason == CAP_DECLINE_WARMING_UP) {
        for (int i = 0; i < d->p->n_inputs; i++) {
            if (!e->ident_stable[i]) continue;
            if (e->warm > 0 && !same_ident(&e->ident[i], &d->call->inputs[i])) e->ident_stable[i] = false;
            e->ident[i] = d->call->inputs[i];
        }
        if (++e->warm >= d->c->opt.warmup) {
            pthread_mutex_lock(&d->c->lock); /* state is read under the lock by syncs */
            e->state = ST_CAPTURE;
            pthread_mutex_unlock(&d->c->lock);
        }
    }
    return run_eager(e, d->s, d->call, &d->acct);
}

/* Chooses what the capture reads in place and what it bakes. */
static void prepare_capture(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    const cap_call_t *call = d->call;
    for (int i = 0; i < d->p->n_inputs; i++)
        e->pinned[i] = e->ident_stable[i] && e->warm > 0 && same_ident(&e->ident[i], &call->inputs[i]) &&
                       call->inputs[i].device == kern_backend_device(c->backend) &&
                       kern_tensor_is_contiguous(&call->inputs[i]);
    if (output_aliases_pin(e, call)) memset(e->pinned, 0, sizeof e->pinned);
    for (int i = 0; i < d->p->n_inputs; i++)
        if (e->pinned[i]) e->ident[i] = call->inputs[i];
    e->n_consts = call->n_consts; /* 0..CAP_MAX_CONSTS: check_call */
    if (e->n_consts > 0) memcpy(e->consts, call->consts, (size_t)e->n_consts * sizeof *e->consts);
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < d->p->n_components; i++) {
        e->comp_base[i] = c->comp[e->comp[i]].base;
        e->comp_gen[i] = c->comp[e->comp[i]].generation;
    }
    pthread_mutex_unlock(&c->lock);
}

/* Warmup done: capture, verify, and publish or refuse the graph. */
static int run_capture_path(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    cap_reason_t why = CAP_DECLINE_COUNT;
    double secs = 0;
    int bad = -1;
    prepare_capture(d);
    call_acct_t pins = { 0, 0, 0 };
    int rc = bind(e, d->s, d->call, true, &pins.copied, &pins.pinned);
    if (rc == 0) rc = capture(c, e, d->s, d->call, &why, &bad, &d->q, &secs);
    if (rc == 1) rc = launch_eager(e, d->s, d->call, &d->acct); /* the slots may point at pinned inputs */
    else {
        d->acct.copied += pins.copied;
        d->acct.pinned += pins.pinned;
    }
    if (rc != 0) return rc;
    /* The entry's state follows the capture, whatever copy-out does: a
     * published graph must be owned by a READY entry. */
    pthread_mutex_lock(&c->lock);
    if (why == CAP_DECLINE_COUNT) {
        e->state = e->reverify_pending ? ST_REVERIFY : ST_READY;
        e->since_audit = 0;
        if (e->reverify_pending)
            for (int i = 0; i < d->p->n_components; i++) e->comp_gen[i] = c->comp[e->comp[i]].generation;
        d->ran = CAP_RAN_CAPTURED;
    } else if (why == CAP_DECLINE_MUTABLE_INPUT) {
        d->reason = why;
        unpin_and_recapture(c, e, bad);
    } else if (why == CAP_DECLINE_CAPTURE_FAILED && ++e->capture_fails < CAP_CAPTURE_TRIES) {
        /* Often transient (another thread invalidated a CUDA capture): try
         * again on the next call. */
        d->reason = why;
        memset(e->pinned, 0, sizeof e->pinned);
        e->state = ST_CAPTURE;
    } else {
        d->reason = why;
        e->state = why == CAP_DECLINE_BUDGET_EXCEEDED ? ST_BUDGET : ST_DISABLED;
        e->disabled_reason = why;
        memset(e->pinned, 0, sizeof e->pinned);
    }
    e->reverify_pending = false;
    pthread_mutex_unlock(&c->lock);
    return copy_out(e, d->s, d->call);
}

/* A re-verification after an inplace sync, or a runtime audit: replay and
 * eager on the same inputs, the eager result kept. */
static int run_verify_path(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    int bad = -1;
    int rc = bind(e, d->s, d->call, true, &d->acct.copied, &d->acct.pinned);
    int v = rc == 0 ? verify(c, e, d->s, d->call, &bad) : -1;
    if (v < 0) rc = -1;
    if (rc == 0) rc = copy_out(e, d->s, d->call);
    pthread_mutex_lock(&c->lock);
    if (d->path == P_REVERIFY) c->st.reverifies++;
    else c->st.audits++;
    if (v == 1) {
        e->state = ST_READY;
        d->ran = CAP_RAN_REPLAYED;
        c->st.replays++;
    } else if (v == 2) {
        d->reason = CAP_DECLINE_MUTABLE_INPUT;
        unpin_and_recapture(c, e, bad);
    } else if (v == 0 && d->path == P_REVERIFY) {
        drop_graph(c, e);
        e->state = ST_DISABLED;
        e->disabled_reason = d->reason = CAP_DECLINE_VERIFY_MISMATCH;
    } else if (v == 0) {
        /* Something the graph baked in changed and no check saw it: the
         * entry cannot be trusted; the call keeps the eager result. */
        d->reason = CAP_DECLINE_AUDIT_MISMATCH;
        drop_graph(c, e);
        evict(c, e, CAP_EVICT_AUDIT_MISMATCH, &d->q, NULL, 0, 0);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static int run_replay_path(dispatch_t *d) {
    int rc = bind(d->e, d->s, d->call, true, &d->acct.copied, &d->acct.pinned);
    if (rc == 0) rc = kern_graph_replay(d->e->graph, d->s);
    if (rc == 0) rc = copy_out(d->e, d->s, d->call);
    d->ran = CAP_RAN_REPLAYED;
    return rc;
}

/* A kernel artifact's parity gate (kernels/artifacts.h) decided during
 * this call, on this thread: a demotion means the native result was served
 * (reason artifact_parity). A graph captured or checked in this call may
 * hold launches from before the decision, and its verify may have failed
 * for that alone: it is dropped and the entry captures again on its next
 * call, never disabled for it (a decision is not a capture fault). */
static void artifact_decided(dispatch_t *d, uint64_t promoted0, uint64_t demoted0) {
    uint64_t promoted, demoted;
    kern_artifacts_thread_decisions(&promoted, &demoted);
    if (promoted == promoted0 && demoted == demoted0) return;
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    pthread_mutex_lock(&c->lock);
    bool graph_path = d->path == P_CAPTURE || d->path == P_REVERIFY || d->path == P_AUDIT;
    if (graph_path && !e->doomed &&
        (e->graph || (e->state == ST_DISABLED && e->disabled_reason == CAP_DECLINE_VERIFY_MISMATCH)))
        unpin_and_recapture(c, e, -1);
    if (graph_path && d->ran != CAP_RAN_EAGER) {
        /* The call serves its eager run's result: count it so. */
        if (d->ran == CAP_RAN_REPLAYED) c->st.replays--;
        d->ran = CAP_RAN_EAGER;
    }
    if (d->ran == CAP_RAN_EAGER && (demoted != demoted0 || graph_path))
        d->reason = CAP_DECLINE_ARTIFACT_PARITY;
    pthread_mutex_unlock(&c->lock);
}

/* Counts the call and releases the entry (freeing it if it was evicted
 * meanwhile). Takes the lock. */
static void account(dispatch_t *d, int rc, double t0) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    pthread_mutex_lock(&c->lock);
    double dt = now() - t0;
    c->st.bind_bytes_copied += d->acct.copied;
    c->st.bind_bytes_pinned += d->acct.pinned;
    if (rc == 0) {
        if (d->ran == CAP_RAN_EAGER) {
            c->st.eager_runs++;
            c->st.eager_seconds += dt;
            reel_hist_observe(&c->st.eager_hist, dt);
            declined(c, e, d->reason, &d->q, d->logbuf, sizeof d->logbuf);
        } else if (d->ran == CAP_RAN_REPLAYED && d->path == P_REPLAY) {
            c->st.replays++;
            c->st.replay_seconds += dt;
            reel_hist_observe(&c->st.replay_hist, dt);
        }
    }
    e->in_use = false;
    if (e->doomed) {
        unlink_entry(c, e);
        free_entry(c, e);
    }
    d->sl->depth--;
    pthread_mutex_unlock(&c->lock);
}

/* One call on stream slot si, whose lock the caller holds: acquire the
 * entry, decide the path, run it, account. */
static int dispatch_locked(dispatch_t *d, int si, const char *text, uint64_t hash, double t0) {
    cap_cache_t *c = d->c;
    int comp[CAP_MAX_COMPONENTS] = { 0 };
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    d->sl = c->streams[si];
    d->sl->depth++;
    c->st.calls++;
    /* A key for another version than the resident one must get no entry:
     * an inplace sync would re-key an entry of the old version onto it. */
    if (d->reason == CAP_DECLINE_COUNT && !key_versions_current(c, d->call->key))
        d->reason = CAP_DECLINE_WEIGHTS_MOVED;
    if (resolve_components(c, d->p, comp) != 0 || acquire(d, si, comp, text, hash) != 0) {
        d->sl->depth--;
        pthread_mutex_unlock(&c->lock);
        return -1;
    }
    if (check_inputs(d->e, d->call) != 0) {
        c->st.declines[CAP_DECLINE_SHAPE_MISMATCH]++;
        evq_push(&d->q, CAP_EV_DECLINE, CAP_DECLINE_SHAPE_MISMATCH, d->e, 0, 0, 0, NULL, 0, 0);
        d->sl->depth--;
        pthread_mutex_unlock(&c->lock);
        if (d->e->transient) free_entry(c, d->e);
        return -1;
    }
    d->acct = (call_acct_t){ 0, 0, t0 };
    if (d->e->transient) return run_transient(d, t0);
    d->e->in_use = true;
    unlink_entry(c, d->e);
    push_front(c, d->e);
    decide(d);
    pthread_mutex_unlock(&c->lock);
    uint64_t promoted, demoted;
    kern_artifacts_thread_decisions(&promoted, &demoted);
    switch (d->path) {
    case P_EAGER: rc = run_eager_path(d); break;
    case P_CAPTURE: rc = run_capture_path(d); break;
    case P_REVERIFY:
    case P_AUDIT: rc = run_verify_path(d); break;
    case P_REPLAY: rc = run_replay_path(d); break;
    }
    artifact_decided(d, promoted, demoted);
    account(d, rc, t0);
    return rc;
}

/* Checks what the cache copies from a call before it reads it: -1 with a
 * message. A capture bakes at most CAP_MAX_CONSTS constants and compares
 * their names on replay. */
static int check_call(const cap_call_t *call) {
    if (call->n_consts < 0 || call->n_consts > CAP_MAX_CONSTS)
        return kern_fail("dispatch: %d constants (a call has 0..%d)", call->n_consts, CAP_MAX_CONSTS);
    if (call->n_consts > 0 && !call->consts) return kern_fail("dispatch: %d constants and no array", call->n_consts);
    for (int i = 0; i < call->n_consts; i++)
        if (!memchr(call->consts[i].name, 0, sizeof call->consts[i].name))
            return kern_fail("dispatch: the name of constant %d is not terminated", i);
    return 0;
}

/* Takes the lock of the call's stream: its slot (index in *si), or NULL
 * with a message. Calls on one stream are serialized, so two threads sharing a
 * stream never bind, replay or copy out of one workspace at the same time.
 * A re-entrant dispatch only tries the lock: waiting could deadlock (this
 * thread's launch waiting for stream B while B's owner's launch waits for
 * this thread's stream). If B is busy the call moves to the outer call's
 * stream, whose lock this thread holds, and declines entry_busy (a
 * transient workspace; a stream is never used by two threads at once). */
static stream_slot_t *lock_stream(dispatch_t *d, int *si) {
    cap_cache_t *c = d->c;
    bool nested = tl.depth > 0;
    pthread_mutex_lock(&c->lock);
    *si = stream_slot(c, d->s);
    int oi = nested && kern_stream_backend(tl.s) == c->backend ? stream_slot(c, tl.s) : -1;
    stream_slot_t *sl = *si >= 0 ? c->streams[*si] : NULL, *osl = oi >= 0 ? c->streams[oi] : NULL;
    pthread_mutex_unlock(&c->lock);
    if (!sl) return NULL;
    if (!nested) {
        pthread_mutex_lock(&sl->mu);
        return sl;
    }
    if (pthread_mutex_trylock(&sl->mu) == 0) return sl;
    if (!osl || pthread_mutex_trylock(&osl->mu) != 0) {
        kern_fail("re-entrant dispatch: stream %d is busy on another thread and the outer call's stream "
                  "cannot serve it", *si);
        return NULL;
    }
    d->s = tl.s;
    d->reason = CAP_DECLINE_ENTRY_BUSY;
    *si = oi;
    return osl;
}

int cap_dispatch(cap_cache_t *c, kern_stream_t *s, const cap_program_t *p, void *user,
                 const cap_call_t *call, cap_result_t *res) {
    char text[CAP_KEY_TEXT_MAX];
    double t0 = now();
    if (tl.capturing)
        return kern_fail("dispatch while this thread captures a step (a step may not dispatch from a launch "
                         "being captured; the call may be made again outside the capture)");
    if (kern_stream_backend(s) != c->backend) return kern_fail("dispatch: stream of another backend");
    if (check_call(call) != 0 || cap_key_text(call->key, false, text, sizeof text) < 0) return -1;
    uint64_t hash = cap_hash_text(text);
    dispatch_t dd = { .c = c, .s = s, .p = p, .user = user, .call = call, .reason = CAP_DECLINE_COUNT,
                      .ran = CAP_RAN_EAGER },
               *d = &dd;
    int si;
    stream_slot_t *sl = lock_stream(d, &si);
    if (!sl) return -1;
    int rc;
    if (kern_stream_is_capturing(d->s))
        rc = kern_fail("dispatch on a stream that is capturing (a step may not dispatch from its launch)");
    else {
        /* Kernel artifacts are judged per capture key (kernels/artifacts.h). */
        uint64_t scope = kern_artifacts_set_scope(hash);
        kern_stream_t *outer = tl.s;
        tl.depth++;
        tl.s = d->s;
        rc = dispatch_locked(d, si, text, hash, t0);
        tl.depth--;
        tl.s = outer;
        kern_artifacts_set_scope(scope);
    }
    pthread_mutex_unlock(&sl->mu);
    if (d->logbuf[0]) log_msg(c, 2, d->logbuf);
    evq_flush(c, &d->q);
    if (res && rc == 0) {
        res->ran = d->ran;
        res->reason = d->ran == CAP_RAN_EAGER ? d->reason : CAP_DECLINE_COUNT;
    }
    CHECK_INVARIANTS(c);
    return rc;
}

/* ---- invariants ---------------------------------------------------------------- */

#define INV(cond)                                                                              \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "capture cache invariant violated: %s (%s:%d)\n", #cond, __FILE__, \
                    __LINE__);                                                                 \
            return false;                                                                      \
        }                                                                                      \
    } while (0)

/* Caller holds the lock. */
static bool invariants(const cap_cache_t *c) {
    size_t n = 0, ws = 0, gb = 0, graphs = 0;
    const entry_t *prev = NULL;
    for (const entry_t *e = c->head; e; prev = e, e = e->next) {
        INV(e->prev == prev);
        INV(!e->transient);
        INV(e->ws != NULL && e->prog_id != NULL);
        INV(e->stream_idx >= 0 && e->stream_idx < c->n_streams);
        INV(c->streams[e->stream_idx]->s == e->stream);
        INV(!e->doomed || e->in_use);              /* a doomed entry is freed on release */
        INV(!e->admitted || e->graph != NULL);
        INV(e->admitted || e->graph_bytes == 0);
        for (int i = 0; i < e->prog.n_components; i++) INV(e->comp[i] >= 0 && e->comp[i] < c->n_comp);
        if (!e->in_use) {
            /* Between calls a graph exists exactly when the entry may replay it. */
            INV((e->state == ST_READY || e->state == ST_REVERIFY) == (e->graph != NULL));
            INV(e->state != ST_DISABLED || cap_reason_permanent(e->disabled_reason) ||
                (e->disabled_reason == CAP_DECLINE_CAPTURE_FAILED && e->capture_fails >= CAP_CAPTURE_TRIES));
            INV(!e->reverify_pending);
        }
        if (n < 4096)
            for (const entry_t *f = e->next; f; f = f->next)
                INV(e->doomed || f->doomed || !(e->hash == f->hash && e->stream == f->stream &&
                                                e->prog_id == f->prog_id && !memcmp(&e->prog, &f->prog, sizeof e->prog) &&
                                                e->user == f->user &&
                                                !strcmp(e->text, f->text)));
        n++;
        ws += e->ws_bytes;
        gb += e->graph_bytes;
        if (e->admitted) graphs++;
    }
    INV(n == c->st.entries);
    INV(ws == c->st.ws_bytes);
    INV(gb == c->st.graph_bytes);
    INV(graphs == c->st.graphs);
    INV(c->st.bytes_held == c->st.ws_bytes + c->st.graph_bytes);
    INV(!c->opt.budget_bytes || c->st.bytes_held <= c->opt.budget_bytes);
    for (int i = 0; i < c->n_streams; i++) {
        int busy = 0;
        for (const entry_t *e = c->head; e; e = e->next)
            if (e->in_use && e->stream_idx == i) busy++;
        INV(c->streams[i]->depth >= 0);
        INV(busy <= c->streams[i]->depth);     /* only a call on that stream holds its entries */
    }
    for (int i = 0; i < c->n_comp; i++) INV(c->comp[i].generation >= 1);
    return true;
}

bool cap_cache_invariants(const cap_cache_t *c) {
    cap_cache_t *m = (cap_cache_t *)c;
    pthread_mutex_lock(&m->lock);
    bool ok = invariants(c);
    pthread_mutex_unlock(&m->lock);
    return ok;
}

/* ---- cache-wide operations ---------------------------------------------------- */

cap_cache_t *cap_cache_new(kern_backend_t *b, const cap_options_t *opt) {
    cap_options_t o = opt ? *opt : cap_options_default();
    if (o.warmup < 0) o.warmup = 2;
    if (o.warmup > 1000) { kern_fail("warmup %d is out of range (0..1000)", o.warmup); return NULL; }
    if (o.audit_every < 0) { kern_fail("audit_every %d is negative (0 turns audits off)", o.audit_every); return NULL; }
    if (o.policy != CAP_POLICY_EVICT && o.policy != CAP_POLICY_INPLACE) {
        kern_fail("unknown weight update policy %d", (int)o.policy);
        return NULL;
    }
    cap_cache_t *c = calloc(1, sizeof *c);
    if (!c) { kern_fail("out of memory"); return NULL; }
    c->backend = b;
    c->opt = o;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->comp_lock, NULL);
    CHECK_INVARIANTS(c);
    return c;
}

void cap_cache_destroy(cap_cache_t **cp) {
    if (!cp || !*cp) return;
    cap_cache_t *c = *cp;
    CHECK_INVARIANTS(c);
    evq_t q = { 0 };
    pthread_mutex_lock(&c->lock);
    while (c->head) {
        assert(!c->head->in_use && "cap_cache_destroy during a dispatch");
        evict(c, c->head, CAP_EVICT_SHUTDOWN, &q, NULL, 0, 0);
    }
    pthread_mutex_unlock(&c->lock);
    evq_flush(c, &q);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->comp_lock);
    for (int i = 0; i < c->n_streams; i++) {
        pthread_mutex_destroy(&c->streams[i]->mu);
        free(c->streams[i]);
    }
    free(c->logged);
    free(c->streams);
    free(c);
    *cp = NULL;
}

int cap_component_register(cap_cache_t *c, const char *name, const void *base, size_t bytes,
                           uint64_t version) {
    int rc = 0;
    /* Keys must be able to name it (cap_key_add_component). */
    if (!reel_name_valid(name, CAP_NAME_MAX))
        return kern_fail("bad component name '%s' (1..%d characters of [A-Za-z0-9_.:+-])", name ? name : "(null)",
                         CAP_NAME_MAX - 1);
    pthread_mutex_lock(&c->lock);
    pthread_mutex_lock(&c->comp_lock);
    if (comp_find(c, name) >= 0) rc = kern_fail("component '%s' is already registered", name);
    else if (c->n_comp == CAP_MAX_COMPONENTS) rc = kern_fail("more than %d components", CAP_MAX_COMPONENTS);
    else {
        comp_t *k = &c->comp[c->n_comp];
        snprintf(k->name, sizeof k->name, "%s", name);
        k->base = base;
        k->bytes = bytes;
        k->version = version;
        k->generation = 1;
        c->n_comp++;
    }
    pthread_mutex_unlock(&c->comp_lock);
    pthread_mutex_unlock(&c->lock);
    CHECK_INVARIANTS(c);
    return rc;
}

/* Takes comp_lock only: program callbacks run under lock call it. */
int64_t cap_component_version(const cap_cache_t *c, const char *name) {
    cap_cache_t *m = (cap_cache_t *)c;
    pthread_mutex_lock(&m->comp_lock);
    int i = comp_find(c, name);
    int64_t v = i < 0 ? -1 : (int64_t)c->comp[i].version;
    pthread_mutex_unlock(&m->comp_lock);
    return v;
}

int cap_component_update(cap_cache_t *c, const char *name, const void *base, size_t bytes,
                         uint64_t new_version) {
    evq_t qq = { 0 }, *q = &qq;
    int n = 0;
    pthread_mutex_lock(&c->lock);
    int ci = comp_find(c, name);
    comp_t *k = ci >= 0 ? &c->comp[ci] : NULL;
    if (!k) n = kern_fail("weight sync: unknown component '%s'", name);
    else if (new_version <= k->version)
        n = kern_fail("weight sync: %s version %llu is not newer than the resident %llu", name,
                      (unsigned long long)new_version, (unsigned long long)k->version);
    else if (c->opt.policy == CAP_POLICY_INPLACE && (base != k->base || bytes != k->bytes))
        n = kern_fail("weight sync: inplace policy needs %s at its resident address and size", name);
    if (n == 0) {
        uint64_t from = k->version;
        pthread_mutex_lock(&c->comp_lock);
        k->version = new_version;
        pthread_mutex_unlock(&c->comp_lock);
        k->generation++;
        k->base = base;
        k->bytes = bytes;
        entry_t *next;
        for (entry_t *e = c->head; e; e = next) {
            next = e->next;
            if (e->doomed || !cap_key_reads(&e->key, name)) continue;
            n++;
            if (c->opt.policy == CAP_POLICY_EVICT) {
                evict(c, e, CAP_EVICT_WEIGHT_SYNC, q, name, from, new_version);
                continue;
            }
            /* inplace: same addresses, new contents -- re-key, re-verify. */
            cap_key_set_version(&e->key, name, new_version);
            cap_key_text(&e->key, false, e->text, sizeof e->text);
            e->hash = cap_hash_text(e->text);
            for (int i = 0; i < e->prog.n_components; i++)
                if (e->comp[i] == ci) e->comp_gen[i] = k->generation;
            if (e->state == ST_READY) e->state = ST_REVERIFY;
            else if (e->in_use) e->reverify_pending = true; /* capturing: verify again after */
        }
    }
    pthread_mutex_unlock(&c->lock);
    evq_flush(c, q);
    CHECK_INVARIANTS(c);
    return n;
}

int cap_evict_key(cap_cache_t *c, const cap_key_t *key, cap_evict_reason_t reason) {
    char text[CAP_KEY_TEXT_MAX];
    /* The other reasons are the cache's own: an event claiming one would lie. */
    if (reason != CAP_EVICT_EXPLICIT && reason != CAP_EVICT_SHAPE_CHANGE)
        return kern_fail("evict key: reason %d is not explicit or shape_change", (int)reason);
    if (cap_key_text(key, false, text, sizeof text) < 0) return -1;
    evq_t qq = { 0 }, *q = &qq;
    int n = 0;
    pthread_mutex_lock(&c->lock);
    entry_t *next;
    for (entry_t *e = c->head; e; e = next) {
        next = e->next;
        if (!e->doomed && !strcmp(e->text, text)) {
            evict(c, e, reason, q, NULL, 0, 0);
            n++;
        }
    }
    pthread_mutex_unlock(&c->lock);
    evq_flush(c, q);
    CHECK_INVARIANTS(c);
    return n;
}

void cap_cache_stats(const cap_cache_t *c, cap_stats_t *out) {
    cap_cache_t *m = (cap_cache_t *)c;
    pthread_mutex_lock(&m->lock);
    *out = c->st;
    pthread_mutex_unlock(&m->lock);
}
