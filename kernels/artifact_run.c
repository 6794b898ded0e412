/* artifact_run.c -- the dispatch hook of an installed artifact set: the
 * state of every kernel key, the parity gate (a shadow run on live inputs),
 * the timing modes, and the trampoline that falls back to the native kernel
 * when an artifact fails at run time (see artifacts.h for the rules).
 *
 * Nothing here changes what the native path computes: a key that is not
 * promoted runs the native kernel on the caller's block, untouched, and the
 * shadow run gives the artifact a copy of the block whose output points at
 * a buffer of the set's. The set's mutex guards keys and counters and is
 * never held while a kernel runs, while backend memory is allocated or
 * freed (that takes the device lock, which a capture on another thread
 * holds), or while an event callback runs: each of those places checks it
 * (ART_ASSERT_UNLOCKED, artifact_impl.h). */
#include "artifact_impl.h"
#include "backend_impl.h"
#include "base/error.h"
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The set kern_dispatch routes through (one per process): set by
 * kern_artifacts_install / _uninstall (artifacts.c) under the install lock,
 * read by the hook on every launch. */
static _Atomic(kern_artifacts_t *) installed;

kern_artifacts_t *kern_artifacts_installed(void) { return atomic_load(&installed); }

void art_run_set_installed(kern_artifacts_t *set) {
    ART_CHECK(art_install_lock_mine(), "art_run_set_installed needs the install lock held");
    atomic_store(&installed, set);
}

static _Thread_local uint64_t tl_promoted, tl_demoted, tl_scope;
static _Thread_local const char *tl_region;

const char *kern_artifacts_set_region(const char *region) {
    const char *old = tl_region;
    tl_region = region;
    return old;
}

/* at is r or lies below it (r + "."). */
static bool region_under(const char *at, const char *r) {
    size_t n = strlen(r);
    return !strncmp(at, r, n) && (at[n] == '\0' || at[n] == '.');
}

bool kern_art_region_matches(const char *want, const char *at) {
    if (!want || !want[0]) return true;
    if (!at) at = "";
    if (!strcmp(want, "attention")) return region_under(at, "block.self_attn") || region_under(at, "block.cross_attn");
    if (!strcmp(want, "ffn")) return region_under(at, "block.ffn");
    return region_under(at, want);
}

uint64_t kern_artifacts_set_scope(uint64_t scope) {
    uint64_t old = tl_scope;
    tl_scope = scope;
    return old;
}

void kern_artifacts_thread_decisions(uint64_t *promoted, uint64_t *demoted) {
    *promoted = tl_promoted;
    *demoted = tl_demoted;
}

const char *kern_art_state_name(kern_art_state_t s) {
    static const char *const n[] = { "undecided", "promoted", "demoted", "failed", "ineligible" };
    return (unsigned)s <= KERN_ART_INELIGIBLE ? n[s] : "?";
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- keys ------------------------------------------------------------------ */

static uint64_t key_hash(const art_kernel_t *k, uint64_t scope, const char *arch, const int64_t *sz, int n) {
    uint64_t h = 1469598103934665603ull;
#define MIX(p, len)                                                     \
    for (size_t i_ = 0; i_ < (len); i_++) h = (h ^ ((const unsigned char *)(p))[i_]) * 1099511628211ull
    MIX(&k, sizeof k);
    MIX(&scope, sizeof scope);
    MIX(arch, strlen(arch));
    MIX(sz, (size_t)n * sizeof *sz);
#undef MIX
    return h;
}

/* The key of (k, the thread's capture key, arch, sizes), made on first
 * sight; NULL when out of memory (the launch then runs native). *state
 * gets its state. */
static art_key_t *key_get(kern_artifacts_t *set, const art_kernel_t *k, const art_op_t *od,
                          const char *arch, const int64_t *sz, kern_art_state_t *state) {
    uint64_t scope = tl_scope;
    uint64_t h = key_hash(k, scope, arch, sz, od->n_dims);
    art_lock(set);
    if (!set->bucket) {
        set->n_bucket = 256;
        if (!(set->bucket = calloc(set->n_bucket, sizeof *set->bucket))) {
            art_unlock(set);
            return NULL;
        }
    }
    art_key_t *key = set->bucket[h % set->n_bucket];
    while (key && !(key->hash == h && key->k == k && key->scope == scope && !strcmp(key->arch, arch) &&
                    !memcmp(key->sizes, sz, (size_t)od->n_dims * sizeof *sz)))
        key = key->next;
    if (!key && (key = calloc(1, sizeof *key))) {
        key->k = k;
        key->scope = scope;
        key->hash = h;
        snprintf(key->arch, sizeof key->arch, "%s", arch);
        memcpy(key->sizes, sz, (size_t)od->n_dims * sizeof *sz);
        int off = snprintf(key->text, sizeof key->text, "%s %s %s", kern_op_name(od->op),
                           kern_dtype_name(k->impl.dtype), arch);
        for (int i = 0; i < od->n_dims && off > 0 && (size_t)off < sizeof key->text; i++)
            off += snprintf(key->text + off, sizeof key->text - (size_t)off, " %s=%lld",
                            od->dims[i], (long long)sz[i]);
        if (scope && off > 0 && (size_t)off < sizeof key->text)
            snprintf(key->text + off, sizeof key->text - (size_t)off, " @%016llx", (unsigned long long)scope);
        key->n.speedup_min = INFINITY;
        key->n.speedup_max = 0;
        key->next = set->bucket[h % set->n_bucket];
        set->bucket[h % set->n_bucket] = key;
        if (set->last) set->last->all = key;
        else set->first = key;
        set->last = key;
        set->n_keys++;
    }
    if (key) *state = key->state;
    art_unlock(set);
    return key;
}

void art_run_free(kern_artifacts_t *set) {
    for (art_key_t *k = set->first, *nx; k; k = nx) {
        nx = k->all;
        free(k);
    }
    set->first = set->last = NULL;
    free(set->bucket);
    set->bucket = NULL;
    set->n_keys = 0;
}

/* ---- events and state changes ---------------------------------------------------- */

static void emit(kern_artifacts_t *set, kern_art_event_kind_t kind, const art_key_t *key,
                 const char *reason) {
    art_lock(set);
    kern_art_event_fn fn = set->on_event;
    void *user = set->event_user;
    art_unlock(set);
    if (!fn) return;
    /* No artifact lock is held (artifacts.h): the listener may call back
     * into the set (kern_artifacts_keys) without deadlocking. */
    ART_ASSERT_UNLOCKED(set);
    ART_CHECK(!art_install_lock_mine(), "an event is delivered with the install lock held");
    kern_art_event_t ev = { .kind = kind, .id = key->k->art->m.id, .key = key->text,
                            .reason = reason };
    fn(user, &ev);
}

/* Moves key to state with a reason and tells the listener. */
static void decide(kern_artifacts_t *set, art_key_t *key, kern_art_state_t st, const char *why) {
    char reason[192];
    snprintf(reason, sizeof reason, "%s", why);
    art_lock(set);
    bool changed = key->state != st;
    key->state = st;
    if (changed) snprintf(key->reason, sizeof key->reason, "%s", why);
    art_unlock(set);
    if (!changed) return;
    if (st == KERN_ART_PROMOTED) tl_promoted++;
    if (st == KERN_ART_DEMOTED) tl_demoted++;
    kern_art_event_kind_t kind = st == KERN_ART_PROMOTED ? KERN_ART_EV_PROMOTED
                               : st == KERN_ART_DEMOTED ? KERN_ART_EV_DEMOTED
                               : st == KERN_ART_FAILED ? KERN_ART_EV_FAILED
                               : KERN_ART_EV_INELIGIBLE;
    emit(set, kind, key, reason);
}

static void count(kern_artifacts_t *set, uint64_t *field) {
    art_lock(set);
    (*field)++;
    art_unlock(set);
}

/* ---- the trampoline ------------------------------------------------------------- */

/* What follows the op's argument block in a trampoline launch, at a fixed
 * offset past every op's block (the trampoline does not know the op). */
typedef struct {
    const art_kernel_t *k;
    kern_kernel_fn_t native;
    art_key_t *key;
    kern_artifacts_t *set;
    const art_op_t *od;
    bool replayed;   /* recorded into a graph on a host backend: its replays run here, on this thread */
} tramp_t;

#define TRAMP_OFF 256
_Static_assert(TRAMP_OFF + sizeof(tramp_t) <= ART_BLOCK_MAX, "trampoline block");

static void timed(kern_artifacts_t *set, art_key_t *key, double tn, double ta);
static int compare(const void *a, const void *n, int64_t ne, kern_dtype_t dt,
                   const kern_art_manifest_t *m, double *rel);

/* A replay on a host backend under SHADOW timing: what shadow_cmp does for
 * an eager call, inside the graph. The artifact into a buffer of its own,
 * the native kernel into the real output, both timed, then the parity
 * rule: a pass serves the artifact's bytes, a failure the native ones and
 * demotes the key (its later replays run native, below). */
static int replay_shadow(const tramp_t *t, void *ctx, const void *blk) {
    const art_op_t *od = t->od;
    const kern_dtype_t dt = t->k->impl.dtype;
    const int64_t ne = od->out_elems(blk);
    const size_t bytes = (size_t)ne * kern_dtype_size(dt);
    void *real, *sh = malloc(bytes ? bytes : 1);
    if (!sh) return t->k->impl.fn(ctx, blk) == 0 ? 0 : t->native(ctx, blk);
    memcpy(&real, (const char *)blk + od->out_off, sizeof real);
    unsigned char b2[ART_BLOCK_MAX];
    memcpy(b2, blk, od->args_size);
    memcpy(b2 + od->out_off, &sh, sizeof sh);
    double t0 = now();
    int ra = t->k->impl.fn(ctx, b2);
    double t1 = now();
    int rn = t->native(ctx, blk);
    double t2 = now();
    if (rn != 0 || ra != 0) {
        if (rn == 0) count(t->set, &t->key->n.fallbacks);
        free(sh);
        return rn;
    }
    double rel = 0;
    bool pass = compare(sh, real, ne, dt, &t->k->art->m, &rel) == 0;
    char why[REEL_ERR_MSG] = "";
    if (!pass) snprintf(why, sizeof why, "%s", reel_err()->msg); /* before anything else may fail */
    art_lock(t->set);
    art_key_t *key = t->key;
    key->n.calls++;
    if (pass) key->n.parity_pass++;
    else key->n.parity_fail++;
    if (rel > key->n.max_rel_seen) key->n.max_rel_seen = rel;
    timed(t->set, key, t2 - t1, t1 - t0);
    art_unlock(t->set);
    if (!pass) decide(t->set, key, KERN_ART_DEMOTED, why);
    else if (t->k->art->m.parity != KERN_PARITY_BYTE_EQUAL) memcpy(real, sh, bytes);
    free(sh);
    return 0;
}

/* Runs the artifact; when it fails, the native kernel on the same block
 * (its scratch is sized for both), counted as a fallback: in an eager run
 * and in every replay of a graph that captured it. A replay on a host
 * backend also honours the timing mode (SYNC: the artifact's call timed;
 * SHADOW: replay_shadow) and a demotion made since the capture (native). */
static int trampoline(void *ctx, const void *blk) {
    tramp_t t;
    memcpy(&t, (const char *)blk + TRAMP_OFF, sizeof t);
    ART_ASSERT_UNLOCKED(t.set); /* kernels run here, eager or in a replay */
    if (t.replayed) {
        art_lock(t.set);
        kern_art_state_t st = t.key->state;
        art_unlock(t.set);
        if (st != KERN_ART_PROMOTED) {
            count(t.set, &t.key->n.native_calls);
            return t.native(ctx, blk);
        }
        if (t.set->timing == KERN_ART_TIMING_SHADOW) return replay_shadow(&t, ctx, blk);
        if (t.set->timing == KERN_ART_TIMING_SYNC) {
            double t0 = now();
            int r = t.k->impl.fn(ctx, blk);
            double t1 = now();
            if (r == 0) {
                art_lock(t.set);
                t.key->n.calls++;
                t.key->n.sync_timed++;
                t.key->n.sync_s += t1 - t0;
                art_unlock(t.set);
                return 0;
            }
            count(t.set, &t.key->n.fallbacks);
            return t.native(ctx, blk);
        }
    }
    if (t.k->impl.fn(ctx, blk) == 0) return 0;
    count(t.set, &t.key->n.fallbacks);
    return t.native(ctx, blk);
}

/* Fills the header's scratch for `bytes` (what both kernels need). */
static int take_scratch(kern_stream_t *s, void *args, size_t bytes) {
    kern_args_hdr_t *hdr = args;
    hdr->scratch = NULL;
    hdr->scratch_bytes = bytes;
    if (bytes && !(hdr->scratch = kern_stream_scratch(s, bytes))) return -1;
    return 0;
}

static size_t ws_of(const kern_impl_t *impl, const void *args) {
    return impl->workspace_bytes ? impl->workspace_bytes(args) : 0;
}

/* Launches k through the trampoline (recorded when s captures). */
static int launch_tramp(kern_artifacts_t *set, kern_stream_t *s, const art_kernel_t *k,
                        art_key_t *key, const kern_impl_t *native, const void *args) {
    unsigned char blk[ART_BLOCK_MAX];
    memset(blk, 0, sizeof blk);
    memcpy(blk, args, k->impl.args_size);
    const tramp_t t = { k, native->fn, key, set, art_op(k->impl.op),
                        kern_stream_is_capturing(s) && kern_backend_kind(kern_stream_backend(s)) == KERN_BACKEND_CPU };
    memcpy(blk + TRAMP_OFF, &t, sizeof t);
    size_t a = ws_of(&k->impl, blk), n = ws_of(native, blk);
    if (take_scratch(s, blk, a > n ? a : n) != 0) return -1;
    return kern_stream_launch(s, trampoline, blk, TRAMP_OFF + sizeof t);
}

/* ---- the shadow run ------------------------------------------------------------ */

static float elem(const void *p, kern_dtype_t dt, int64_t i) {
    if (dt == KERN_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == KERN_BF16 ? kern_bf16_to_f32(h) : kern_f16_to_f32(h);
}

/* Compares the artifact's output a with the native one n (host memory) by
 * m's rule. max_rel: every element's |a − n| / max(|n|, 1e-3·max|n|) is at
 * most R (the floor keeps values that cancel to nearly zero from reading
 * as huge relative errors); non-finite values must be identical. Sets
 * *rel to the largest relative difference seen: 0 within the manifest's
 * parity, -1 with the sentence saying how not in the error value. */
static int compare(const void *a, const void *n, int64_t ne, kern_dtype_t dt,
                   const kern_art_manifest_t *m, double *rel) {
    size_t esz = kern_dtype_size(dt);
    *rel = 0;
    if (m->parity == KERN_PARITY_BYTE_EQUAL) {
        if (!memcmp(a, n, (size_t)ne * esz)) return 0;
        int64_t first = -1, differ = 0;
        for (int64_t i = 0; i < ne; i++)
            if (memcmp((const char *)a + i * esz, (const char *)n + i * esz, esz)) {
                if (first < 0) first = i;
                differ++;
            }
        return reel_fail(REEL_E_INVALID, "artifact_parity: byte_equal: %lld of %lld elements differ (first at "
                 "%lld: native %.9g, artifact %.9g)", (long long)differ, (long long)ne,
                 (long long)first, elem(n, dt, first), elem(a, dt, first));
    }
    double scale = 0;
    for (int64_t i = 0; i < ne; i++) {
        double v = fabs((double)elem(n, dt, i));
        if (isfinite(v) && v > scale) scale = v;
    }
    double floor = scale * 1e-3 > DBL_MIN ? scale * 1e-3 : DBL_MIN;
    int64_t worst = -1;
    for (int64_t i = 0; i < ne; i++) {
        double x = elem(a, dt, i), y = elem(n, dt, i);
        if (!isfinite(x) || !isfinite(y)) {
            if (memcmp((const char *)a + i * esz, (const char *)n + i * esz, esz)) {
                *rel = INFINITY;
                return reel_fail(REEL_E_INVALID, "artifact_parity: element %lld is %.9g, native %.9g",
                                 (long long)i, x, y);
            }
            continue;
        }
        double r = fabs(x - y) / (fabs(y) > floor ? fabs(y) : floor);
        if (r > *rel) {
            *rel = r;
            worst = i;
        }
    }
    if (*rel <= m->max_rel) return 0;
    return reel_fail(REEL_E_INVALID, "artifact_parity: max relative difference %.3g > %.3g (element %lld: "
             "native %.9g, artifact %.9g)", *rel, m->max_rel, (long long)worst,
             elem(n, dt, worst), elem(a, dt, worst));
}

/* Host views of the two outputs: the buffers themselves on the CPU, copies
 * otherwise (*own set: the caller frees them). */
static int to_host(kern_stream_t *s, const void *x, const void *y, size_t bytes, const void **hx,
                   const void **hy, void **own) {
    *own = NULL;
    if (kern_backend_device(kern_stream_backend(s)) == KERN_DEVICE_HOST) {
        *hx = x;
        *hy = y;
        return 0;
    }
    char *h = malloc(2 * bytes + 1);
    if (!h) return reel_fail(REEL_E_NOMEM, "out of memory");
    if (kern_copy_d2h(s, h, x, bytes) || kern_copy_d2h(s, h + bytes, y, bytes) ||
        kern_stream_sync(s)) {
        free(h);
        return -1;
    }
    *own = h;
    *hx = h;
    *hy = h + bytes;
    return 0;
}

/* Adds one timed call (native tn, artifact ta seconds) to key's counters
 * and its running speedup statistics. The set's mutex held (checked). */
static void timed(kern_artifacts_t *set, art_key_t *key, double tn, double ta) {
    ART_ASSERT_LOCKED(set);
    kern_art_counts_t *c = &key->n;
    c->timed++;
    c->native_s += tn;
    c->artifact_s += ta;
    double r = tn / (ta > 1e-12 ? ta : 1e-12);
    double d = r - c->speedup_mean;
    c->speedup_mean += d / (double)c->timed;
    key->m2 += d * (r - c->speedup_mean);
    c->speedup_sd = c->timed > 1 ? sqrt(key->m2 / (double)(c->timed - 1)) : 0;
    if (r < c->speedup_min) c->speedup_min = r;
    if (r > c->speedup_max) c->speedup_max = r;
}

/* The artifact into a shadow buffer, then the native kernel into the real
 * output, on the same live inputs, each synchronized and timed; then the
 * parity rule. deciding: the key's first comparison (promote or demote;
 * the native result is served). Otherwise (SHADOW timing of a promoted
 * key) a failure demotes and serves native, a pass serves the artifact's
 * result. Returns the call's 0 / -1 (the native kernel's). */
static int shadow_cmp(kern_artifacts_t *set, kern_stream_t *s, const art_kernel_t *k,
                      art_key_t *key, const kern_impl_t *native, const art_op_t *od,
                      kern_dtype_t dt, void *args, bool deciding, void *sh);

static int shadow_run(kern_artifacts_t *set, kern_stream_t *s, const art_kernel_t *k,
                      art_key_t *key, const kern_impl_t *native, const art_op_t *od,
                      kern_dtype_t dt, void *args, bool deciding) {
    const size_t bytes = (size_t)od->out_elems(args) * kern_dtype_size(dt);
    /* The shadow output lives for this run only: a set never holds memory
     * of a backend or stream that may go away before it. Allocated and
     * freed outside the timed region (never while s captures), and
     * without the set's mutex (the allocator may wait for a capture). */
    ART_ASSERT_UNLOCKED(set);
    void *sh = bytes ? kern_alloc(kern_stream_backend(s), bytes) : NULL;
    if (bytes && !sh) { /* no room to compare: native, still undecided */
        count(set, &key->n.native_calls);
        return kern_launch_impl(s, native, args);
    }
    int rc = shadow_cmp(set, s, k, key, native, od, dt, args, deciding, sh);
    if (sh && kern_stream_sync(s) != 0) rc = -1; /* the copy out of sh, if any, is done */
    ART_ASSERT_UNLOCKED(set);
    kern_free(kern_stream_backend(s), sh);
    return rc;
}

static int shadow_cmp(kern_artifacts_t *set, kern_stream_t *s, const art_kernel_t *k,
                      art_key_t *key, const kern_impl_t *native, const art_op_t *od,
                      kern_dtype_t dt, void *args, bool deciding, void *sh) {
    ART_ASSERT_UNLOCKED(set); /* both kernels run here */
    const kern_art_manifest_t *m = &k->art->m;
    const int64_t ne = od->out_elems(args);
    const size_t bytes = (size_t)ne * kern_dtype_size(dt);
    void *real;
    memcpy(&real, (const char *)args + od->out_off, sizeof real);
    unsigned char blk[ART_BLOCK_MAX];
    memcpy(blk, args, od->args_size);
    memcpy(blk + od->out_off, &sh, sizeof sh);
    if (kern_stream_sync(s) != 0) return -1;
    double t0 = now();
    int ra = kern_launch_impl(s, &k->impl, blk);
    if (ra == 0) ra = kern_stream_sync(s);
    char fail[256];
    if (ra != 0) snprintf(fail, sizeof fail, "runtime_failure: %s", reel_err_text());
    double t1 = now();
    int rn = kern_launch_impl(s, native, args);
    if (rn == 0) rn = kern_stream_sync(s);
    double t2 = now();
    if (rn != 0) return -1; /* the call fails as the native kernel did */
    if (ra != 0) {
        art_lock(set);
        key->n.fallbacks++;
        bool give_up = key->state == KERN_ART_UNDECIDED && ++key->fail_streak >= 3;
        art_unlock(set);
        if (give_up) decide(set, key, KERN_ART_FAILED, fail);
        return 0;
    }
    const void *ha = NULL, *hn = NULL;
    void *own;
    if (to_host(s, sh, real, bytes, &ha, &hn, &own) != 0) return -1;
    double rel = 0;
    bool pass = compare(ha, hn, ne, dt, m, &rel) == 0;
    char why[REEL_ERR_MSG] = "";
    if (!pass) snprintf(why, sizeof why, "%s", reel_err()->msg); /* before anything else may fail */
    free(own);
    art_lock(set);
    key->n.calls++;
    key->fail_streak = 0;
    if (pass) key->n.parity_pass++;
    else key->n.parity_fail++;
    if (rel > key->n.max_rel_seen) key->n.max_rel_seen = rel;
    timed(set, key, t2 - t1, t1 - t0);
    art_unlock(set);
    if (!pass) decide(set, key, KERN_ART_DEMOTED, why);
    else if (deciding) decide(set, key, KERN_ART_PROMOTED, "");
    else if (m->parity != KERN_PARITY_BYTE_EQUAL && bytes)
        return kern_copy_d2d(s, real, sh, bytes); /* serve the promoted artifact's result */
    return 0;
}

/* ---- dispatch ------------------------------------------------------------------ */

static bool sizes_ok(const kern_art_manifest_t *m, const art_op_t *od, const int64_t *sz) {
    for (int i = 0; i < m->n_shapes; i++)
        for (int d = 0; d < od->n_dims; d++)
            if (!strcmp(m->shapes[i].name, od->dims[d]) &&
                (sz[d] < m->shapes[i].min || sz[d] > m->shapes[i].max))
                return false;
    return true;
}

static bool arch_ok(const kern_art_manifest_t *m, const char *arch) {
    for (int i = 0; i < m->n_arch; i++)
        if (!strcmp(m->arch[i], "any") || !strcmp(m->arch[i], arch)) return true;
    return false;
}

enum { NEXT = 0, HANDLED = 1, NATIVE = 2 };

/* One candidate at its key: HANDLED (*rc is the call's), NEXT (try the
 * next candidate) or NATIVE (run the native kernel, no other candidate). */
static int run_key(kern_artifacts_t *set, kern_stream_t *s, const art_kernel_t *k, art_key_t *key,
                   kern_art_state_t st, const kern_impl_t *native, const art_op_t *od,
                   kern_dtype_t dt, void *args, int *rc) {
    if (st == KERN_ART_UNDECIDED && ws_of(&k->impl, args) > ws_of(native, args)) {
        char why[160];
        snprintf(why, sizeof why, "workspace: asks %zu bytes of scratch, the native kernel's "
                 "contract grants %zu", ws_of(&k->impl, args), ws_of(native, args));
        decide(set, key, KERN_ART_INELIGIBLE, why);
        st = KERN_ART_INELIGIBLE;
    }
    if (st != KERN_ART_UNDECIDED && st != KERN_ART_PROMOTED) {
        count(set, &key->n.native_calls);
        return NEXT;
    }
    if (kern_stream_is_capturing(s)) {
        /* Only a promoted artifact is captured; an undecided key is
         * decided on an eager call, never inside a graph. */
        if (st != KERN_ART_PROMOTED || !k->impl.capturable) {
            count(set, &key->n.native_calls);
            return NATIVE;
        }
        *rc = launch_tramp(set, s, k, key, native, args);
        if (*rc == 0) count(set, &key->n.calls);
        return HANDLED;
    }
    if (st == KERN_ART_UNDECIDED || set->timing == KERN_ART_TIMING_SHADOW) {
        *rc = shadow_run(set, s, k, key, native, od, dt, args, st == KERN_ART_UNDECIDED);
        return HANDLED;
    }
    if (set->timing == KERN_ART_TIMING_OFF) {
        *rc = launch_tramp(set, s, k, key, native, args);
        if (*rc == 0) count(set, &key->n.calls);
        return HANDLED;
    }
    /* SYNC: the artifact's launch alone, synchronized on both sides. */
    if ((*rc = kern_stream_sync(s)) != 0) return HANDLED;
    double t0 = now();
    *rc = launch_tramp(set, s, k, key, native, args);
    if (*rc == 0) *rc = kern_stream_sync(s);
    double t1 = now();
    if (*rc == 0) {
        art_lock(set);
        key->n.calls++;
        key->n.sync_timed++;
        key->n.sync_s += t1 - t0;
        art_unlock(set);
    }
    return HANDLED;
}

int art_dispatch_hook(kern_stream_t *s, kern_op_t op, kern_dtype_t dt, void *args,
                      const kern_impl_t *native, int *rc) {
    kern_artifacts_t *set = kern_artifacts_installed();
    if (!set || (unsigned)op >= KERN_OP_COUNT || (unsigned)dt >= KERN_DTYPE_COUNT) return 0;
    ART_ASSERT_UNLOCKED(set); /* a kernel runs next: the artifact or the native one */
    kern_backend_t *b = kern_stream_backend(s);
    const kern_backend_kind_t bk = kern_backend_kind(b);
    const int nc = set->n_cand[op][bk][dt];
    if (nc == 0) return 0;
    const art_op_t *od = art_op(op);
    int64_t sz[KERN_ART_MAX_DIMS] = { 0 };
    od->sizes(args, sz);
    const char *arch = kern_backend_arch(b);
    for (int i = 0; i < nc; i++) {
        const art_kernel_t *k = set->cand[op][bk][dt][i];
        if (!sizes_ok(&k->art->m, od, sz) || !arch_ok(&k->art->m, arch) ||
            !kern_art_region_matches(k->art->m.region, tl_region))
            continue;
        kern_art_state_t st;
        art_key_t *key = key_get(set, k, od, arch, sz, &st);
        if (!key) return 0;
        int r = run_key(set, s, k, key, st, native, od, dt, args, rc);
        if (r == HANDLED) return 1;
        if (r == NATIVE) return 0;
    }
    return 0;
}
