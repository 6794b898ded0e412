/* key.c -- canonical text and hashes of capture keys (see key.h). */
#include "key.h"
#include "base/error.h"
#include "base/names.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool dtype_valid(kern_dtype_t dt) { return (unsigned)dt < KERN_DTYPE_COUNT; }

/* 0 when a tensor of dt and shape is one a workspace could hold: no
 * negative dim, and its byte size fits in int64. -1 with a message. */
static int sig_check(const char *name, kern_dtype_t dt, int ndim, const int64_t *shape) {
    if (!reel_name_valid(name, CAP_NAME_MAX)) return reel_fail(REEL_E_INVALID, "capture key: bad input name '%s'", name ? name : "(null)");
    if (!dtype_valid(dt)) return reel_fail(REEL_E_INVALID, "capture key: input '%s' has unknown dtype %d", name, (int)dt);
    if (ndim < 0 || ndim > KERN_MAX_DIMS) return reel_fail(REEL_E_INVALID, "capture key: input '%s' has %d dims", name, ndim);
    int64_t bytes = (int64_t)kern_dtype_size(dt);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return reel_fail(REEL_E_INVALID, "capture key: input '%s' dim %d is %lld", name, d, (long long)shape[d]);
        if (shape[d] > 0 && bytes > INT64_MAX / shape[d])
            return reel_fail(REEL_E_LIMIT, "capture key: input '%s' is larger than int64 bytes", name);
        bytes *= shape[d];
    }
    return 0;
}

int cap_key_add_input(cap_key_t *k, const char *name, kern_dtype_t dt, int ndim, const int64_t *shape) {
    if (!k) return reel_fail(REEL_E_INVALID, "capture key: no key");
    if (ndim > 0 && !shape) return reel_fail(REEL_E_INVALID, "capture key: input '%s' has %d dims and no shape", name ? name : "(null)", ndim);
    if (k->n_inputs >= CAP_MAX_INPUTS) return reel_fail(REEL_E_LIMIT, "capture key: more than %d inputs", CAP_MAX_INPUTS);
    if (sig_check(name, dt, ndim, shape) != 0) return -1;
    cap_sig_t *s = &k->inputs[k->n_inputs++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->dtype = dt;
    s->ndim = ndim;
    if (ndim > 0) memcpy(s->shape, shape, (size_t)ndim * sizeof *shape); /* a scalar's shape may be NULL */
    return 0;
}

int cap_key_add_component(cap_key_t *k, const char *name, uint64_t version) {
    if (!k) return reel_fail(REEL_E_INVALID, "capture key: no key");
    if (k->n_components >= CAP_MAX_COMPONENTS)
        return reel_fail(REEL_E_LIMIT, "capture key: more than %d components", CAP_MAX_COMPONENTS);
    if (!reel_name_valid(name, CAP_NAME_MAX))
        return reel_fail(REEL_E_INVALID, "capture key: bad component name '%s'", name ? name : "(null)");
    if (cap_key_reads(k, name)) return reel_fail(REEL_E_INVALID, "capture key: component '%s' twice", name);
    cap_component_ver_t *c = &k->components[k->n_components++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->version = version;
    return 0;
}

int cap_key_set_version(cap_key_t *k, const char *name, uint64_t version) {
    if (!k || !name) return reel_fail(REEL_E_INVALID, "capture key: no %s", k ? "component name" : "key");
    for (int i = 0; i < k->n_components; i++)
        if (!strcmp(k->components[i].name, name)) {
            k->components[i].version = version;
            return 0;
        }
    return reel_fail(REEL_E_INVALID, "capture key does not read component '%s'", name);
}

bool cap_key_reads(const cap_key_t *k, const char *name) {
    if (!k || !name) return false;
    for (int i = 0; i < k->n_components; i++)
        if (!strcmp(k->components[i].name, name)) return true;
    return false;
}

typedef struct { char *buf; size_t len, n; int overflow; } out_t;

static void put(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_t *o, const char *fmt, ...) {
    if (o->overflow) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(o->buf + o->n, o->len - o->n, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= o->len - o->n) o->overflow = 1;
    else o->n += (size_t)w;
}

static int cmp_comp(const void *a, const void *b) {
    return strcmp(((const cap_component_ver_t *)a)->name, ((const cap_component_ver_t *)b)->name);
}

/* Re-checks what the add functions check, for keys written directly into
 * the struct: no name may forge the text form (an input named
 * "latent:F32[4,8],context" would print as two inputs). */
static int parts_check(const cap_key_t *k) {
    for (int i = 0; i < k->n_inputs; i++) {
        const cap_sig_t *s = &k->inputs[i];
        if (sig_check(s->name, s->dtype, s->ndim, s->shape) != 0) return -1;
    }
    for (int i = 0; i < k->n_components; i++) {
        if (!reel_name_valid(k->components[i].name, CAP_NAME_MAX))
            return reel_fail(REEL_E_INVALID, "capture key: component %d has a bad name", i);
        for (int j = 0; j < i; j++) /* cap_key_add_component refuses a second one too */
            if (!strcmp(k->components[j].name, k->components[i].name))
                return reel_fail(REEL_E_INVALID, "capture key: component '%s' twice", k->components[i].name);
    }
    if (!dtype_valid(k->graph.dtype)) return reel_fail(REEL_E_INVALID, "capture key: unknown graph dtype %d", (int)k->graph.dtype);
    return 0;
}

int cap_key_text(const cap_key_t *k, bool shard, char *buf, size_t len) {
    if (!k || !buf) return reel_fail(REEL_E_INVALID, "capture key: no %s", k ? "buffer" : "key");
    if (len == 0) return reel_fail(REEL_E_INVALID, "capture key: no room for the text");
    if ((!shard && (!reel_name_valid(k->device, sizeof k->device) || !reel_name_valid(k->arch, sizeof k->arch))) ||
        !reel_name_valid(k->model, sizeof k->model) || !reel_name_valid(k->loop, sizeof k->loop) ||
        !reel_name_valid(k->graph.cfg, sizeof k->graph.cfg) || !reel_name_valid(k->graph.expert, sizeof k->graph.expert) ||
        !reel_name_valid(k->graph.sched, sizeof k->graph.sched) || k->n_inputs < 0 || k->n_inputs > CAP_MAX_INPUTS ||
        k->n_components < 0 || k->n_components > CAP_MAX_COMPONENTS)
        return reel_fail(REEL_E_INVALID, "capture key: a field is empty or has characters outside [A-Za-z0-9_.:+-]");
    if (parts_check(k) != 0) return -1;
    out_t o = { buf, len, 0, 0 };
    put(&o, "reel-key/1");
    if (!shard) put(&o, " device=%s arch=%s", k->device, k->arch);
    put(&o, " model=%s loop=%s inputs=", k->model, k->loop);
    for (int i = 0; i < k->n_inputs; i++) {
        const cap_sig_t *s = &k->inputs[i];
        char shape[KERN_MAX_DIMS * 21 + 3]; /* every dim at its longest: never cut */
        put(&o, "%s%s:%s%s", i ? "," : "", s->name, kern_dtype_name(s->dtype),
            kern_shape_text(s->ndim, s->shape, shape, sizeof shape));
    }
    if (!shard) {
        cap_component_ver_t sorted[CAP_MAX_COMPONENTS];
        memcpy(sorted, k->components, (size_t)k->n_components * sizeof *sorted);
        qsort(sorted, (size_t)k->n_components, sizeof *sorted, cmp_comp);
        put(&o, " weights=");
        if (k->n_components == 0) put(&o, "-");
        for (int i = 0; i < k->n_components; i++)
            put(&o, "%s%s@%llu", i ? "," : "", sorted[i].name, (unsigned long long)sorted[i].version);
    }
    put(&o, " graph=dtype:%s,cfg:%s,expert:%s,sched:%s", kern_dtype_name(k->graph.dtype), k->graph.cfg,
        k->graph.expert, k->graph.sched);
    if (o.overflow) return reel_fail(REEL_E_INVALID, "capture key text longer than %zu bytes", len - 1);
    return (int)o.n;
}

uint64_t cap_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h ? h : 1;
}

uint64_t cap_hash_text(const char *s) { return s ? cap_hash_bytes(s, strlen(s)) : cap_hash_bytes("", 0); }

static uint64_t hash(const cap_key_t *k, bool shard) {
    char buf[CAP_KEY_TEXT_MAX];
    if (cap_key_text(k, shard, buf, sizeof buf) < 0) return 0;
    return cap_hash_text(buf);
}

uint64_t cap_key_hash(const cap_key_t *k) { return hash(k, false); }
uint64_t cap_key_shard_hash(const cap_key_t *k) { return hash(k, true); }

int cap_key_denoise(cap_key_t *k, const char *device, const char *arch, const char *model,
                    const char *loop, kern_dtype_t dt, const int64_t latent[4],
                    const int64_t context[2], bool cfg, const char *component, uint64_t version) {
    return cap_key_denoise_batch(k, device, arch, model, loop, dt, 1, latent, context, cfg, component, version);
}

static int key_denoise(cap_key_t *k, const char *device, const char *arch, const char *model, const char *loop,
                       kern_dtype_t dt, int64_t batch, bool mixed, const int64_t latent[4], const int64_t context[2],
                       bool cfg, const char *component, uint64_t version) {
    if (!k) return reel_fail(REEL_E_INVALID, "capture key: no key");
    memset(k, 0, sizeof *k);
    if (!device || !arch || !model || !loop || !latent || !context || !component)
        return reel_fail(REEL_E_INVALID, "capture key: a denoising key needs a device, arch, model, loop, latent and "
                         "context shape and component (device and arch may be \"\" for shard hashing)");
    /* euler-unipc, sde-unipc, ...: Euler or SDE steps on a multistep
     * solver's grid, each step's timestep bound beside its σ (σ rows of 4) */
    static const char *const loops[] = { "euler", "sde", "unipc", "dpm++", "euler-unipc", "sde-unipc", "euler-dpm++",
                                         "sde-dpm++" };
    size_t li = 0;
    while (li < sizeof loops / sizeof loops[0] && strcmp(loop, loops[li])) li++;
    if (li == sizeof loops / sizeof loops[0])
        return reel_fail(REEL_E_INVALID, "capture key: unknown loop '%.32s' (euler, sde, unipc, dpm++, or euler or "
                         "sde on the unipc or dpm++ grid: sde-unipc, ...)", loop);
    const bool grid = li >= 4;
    const int64_t sw = grid ? 4 : 3;
    if (batch < 1 || batch > CAP_MAX_BATCH)
        return reel_fail(REEL_E_INVALID, "capture key: batch %lld outside 1..%d", (long long)batch, CAP_MAX_BATCH);
    if (snprintf(k->device, sizeof k->device, "%s", device) >= (int)sizeof k->device ||
        snprintf(k->arch, sizeof k->arch, "%s", arch) >= (int)sizeof k->arch ||
        snprintf(k->model, sizeof k->model, "%s", model) >= (int)sizeof k->model ||
        snprintf(k->loop, sizeof k->loop, "%s", loop) >= (int)sizeof k->loop)
        return reel_fail(REEL_E_LIMIT, "capture key: device, arch, model or loop name too long");
    /* A batch of B > 1 adds a leading dimension to the latent and gives
     * every sample its own SDE parameters; B = 1 is the single key, as it
     * always was. */
    const int64_t lat5[5] = { batch, latent[0], latent[1], latent[2], latent[3] };
    bool sde = !strncmp(loop, "sde", 3);
    /* A multistep solver's step (UniPC, DPM++) reads its coefficients and
     * keeps its history (three latents) in the workspace. */
    bool ms = !strcmp(loop, "unipc") || !strcmp(loop, "dpm++");
    int64_t lat_n = batch;
    for (int i = 0; i < 4; i++)
        if (__builtin_mul_overflow(lat_n, latent[i], &lat_n))
            return reel_fail(REEL_E_INVALID, "capture key: a latent of %lld x [%lld,%lld,%lld,%lld] overflows",
                             (long long)batch, (long long)latent[0], (long long)latent[1], (long long)latent[2],
                             (long long)latent[3]);
    if (mixed && ms)
        return reel_fail(REEL_E_UNSUPPORTED, "capture key: a mixed batch runs Euler and SDE steps only, not %s", loop);
    if (mixed && (context[0] <= 0 || context[0] > INT64_MAX / batch))
        return reel_fail(REEL_E_INVALID, "capture key: a mixed batch's context rows overflow");
    /* A mixed batch: every sample its own σ, guidance and context rows. */
    const int64_t ctx_m[2] = { mixed ? batch * context[0] : context[0], context[1] };
    if ((batch == 1 ? cap_key_add_input(k, "latent", dt, 4, latent) : cap_key_add_input(k, "latent", dt, 5, lat5)) ||
        (mixed ? cap_key_add_input(k, "sigmas", KERN_F32, 2, (const int64_t[]){ batch, sw })
               : cap_key_add_input(k, "sigmas", KERN_F32, 1, (const int64_t[]){ sw })) ||
        (mixed ? cap_key_add_input(k, "guidance", KERN_F32, 2, (const int64_t[]){ batch, 1 })
               : cap_key_add_input(k, "guidance", KERN_F32, 1, (const int64_t[]){ 1 })) ||
        cap_key_add_input(k, "context", dt, 2, ctx_m) ||
        (cfg && cap_key_add_input(k, "uncond", dt, 2, ctx_m)) ||
        /* An SDE step reads eta, seed and step from the workspace too. */
        (sde && (batch == 1 ? cap_key_add_input(k, "sde", KERN_F32, 1, (const int64_t[]){ 4 })
                            : cap_key_add_input(k, "sde", KERN_F32, 2, (const int64_t[]){ batch, 4 }))) ||
        (ms && (cap_key_add_input(k, "solver", KERN_F32, 1, (const int64_t[]){ 16 }) ||
                cap_key_add_input(k, "history", dt, 2, (const int64_t[]){ 3, lat_n }))) ||
        cap_key_add_component(k, component, version))
        return -1;
    k->graph.dtype = dt;
    snprintf(k->graph.cfg, sizeof k->graph.cfg, "%s", cfg ? "cond+uncond" : "cond");
    snprintf(k->graph.expert, sizeof k->graph.expert, "-");
    snprintf(k->graph.sched, sizeof k->graph.sched, "f32");
    return 0;
}

int cap_key_denoise_batch(cap_key_t *k, const char *device, const char *arch, const char *model,
                          const char *loop, kern_dtype_t dt, int64_t batch, const int64_t latent[4],
                          const int64_t context[2], bool cfg, const char *component, uint64_t version) {
    return key_denoise(k, device, arch, model, loop, dt, batch, false, latent, context, cfg, component, version);
}

int cap_key_denoise_mixed(cap_key_t *k, const char *device, const char *arch, const char *model,
                          const char *loop, kern_dtype_t dt, int64_t batch, const int64_t latent[4],
                          const int64_t context[2], bool cfg, const char *component, uint64_t version) {
    if (batch < 2) return reel_fail(REEL_E_INVALID, "capture key: a mixed batch holds 2..%d samples, not %lld",
                                    CAP_MAX_BATCH, (long long)batch);
    return key_denoise(k, device, arch, model, loop, dt, batch, true, latent, context, cfg, component, version);
}
