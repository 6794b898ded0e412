/* tinydit.c -- the Wan2.1-style DiT's weights: deterministic initial ones
 * written to a file, and the model loaded from one (../shared/TINYDIT.md is
 * the specification). Its configs and the table of weights a config implies
 * are tdit_config.c's; the forward pass is step.c's.
 *
 * All weights live in one device allocation so their addresses never move
 * while the model lives: graphs captured over them stay valid until the
 * weights themselves change. */
#include "tinydit.h"
#include "tinydit_impl.h"
#include "wan_ckpt.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/ops_args.h"
#include "kernels/philox.h"
#include "kernels/registry.h"
#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- deterministic initial weights --------------------------------------- */

int tdit_weights_init(const tdit_config_t *c, uint64_t seed, const char *path) {
    TRY(tdit_config_validate(c));
    wlist_t l = { 0 };
    st_writer_t *w = NULL;
    float *buf = NULL;
    int rc = -1;
    if (tdit_list_weights(c, NULL, &l) != 0) goto out;
    w = st_writer_new();
    if (!w) goto out;
    char v[32];
    if (st_writer_meta(w, "config", c->name)) goto out;
    const struct { const char *k; int64_t v; } kv[] = {
        { "dim", c->dim }, { "heads", c->heads }, { "layers", c->layers },
        { "ffn_dim", c->ffn_dim }, { "in_channels", c->in_channels },
        { "text_dim", c->text_dim }, { "freq_dim", c->freq_dim },
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        snprintf(v, sizeof v, "%" PRId64, kv[i].v);
        if (st_writer_meta(w, kv[i].k, v)) goto out;
    }
    snprintf(v, sizeof v, "%" PRId64, c->text_len);
    if (c->text_len && st_writer_meta(w, "text_len", v)) goto out;
    snprintf(v, sizeof v, "%" PRIu64, seed);
    if (st_writer_meta(w, "init_seed", v) || st_writer_meta(w, "format", "pt")) goto out;
    for (size_t i = 0; i < l.n; i++) {
        const wentry_t *e = &l.e[i];
        int64_t n = numel_of(e);
        float *nb = realloc(buf, (size_t)n * sizeof *buf);
        if (!nb) { reel_fail(REEL_E_NOMEM, "out of memory initialising %s", e->name); goto out; }
        buf = nb;
        /* Tensor i draws from its own Philox stream (seed, i): adding a
         * tensor never changes the values of the others. */
        double std = e->kind == W_LINEAR ? 1.0 / sqrt((double)e->fan_in)
                   : e->kind == W_MOD ? 1.0 / sqrt((double)c->dim)
                   : 0.02;
        for (int64_t j = 0; j < n; j++) {
            switch (e->kind) {
            case W_NORM: buf[j] = 1.0f; break;
            case W_NORM_BIAS: buf[j] = 0.0f; break;
            default: buf[j] = (float)(std * kern_philox_normal(seed, (uint32_t)i, (uint64_t)j));
            }
        }
        if (st_writer_add_f32(w, e->name, e->ndim, e->shape, buf)) goto out;
    }
    rc = st_writer_save(w, path);
out:
    free(buf);
    free(l.e);
    st_writer_destroy(&w);
    return rc;
}

/* ---- loading ------------------------------------------------------------ */

/* Views t (contiguous) as 2-D [rows, cols]. */
static kern_tensor_t view2(const kern_tensor_t *t, int64_t rows, int64_t cols) {
    kern_tensor_t v = kern_tensor_make(t->data, t->dtype, t->device, 2, SHAPE(rows, cols));
    v.offset = t->offset;
    return v;
}

/* Checks that f holds every tensor of l with its shape (before anything is
 * copied, so a bad file leaves the resident weights intact). */
static int check_file(const st_file_t *f, const wlist_t *l) {
    for (size_t i = 0; i < l->n; i++) {
        const wentry_t *e = &l->e[i];
        const st_tensor_t *t = st_find(f, e->name);
        if (!t) return reel_fail(REEL_E_INVALID, "weights: missing tensor %s", e->name);
        bool ok = t->ndim == e->ndim;
        for (int d = 0; ok && d < e->ndim; d++) ok = t->shape[d] == e->shape[d];
        if (!ok) {
            char a[96], b[96];
            kern_tensor_t ta = kern_tensor_make(NULL, t->dtype, KERN_DEVICE_HOST, t->ndim, t->shape);
            kern_tensor_t tb = kern_tensor_make(NULL, t->dtype, KERN_DEVICE_HOST, e->ndim, e->shape);
            return reel_fail(REEL_E_INVALID, "weights: %s is %s, the config needs %s", e->name,
                             kern_tensor_describe(&ta, a, sizeof a), kern_tensor_describe(&tb, b, sizeof b));
        }
    }
    return 0;
}

/* A weight with a NaN or an infinity (in the file, or after an edit such
 * as a LoRA merge that overflowed) would make every result NaN: refused
 * at load, naming it (unless the caller judged the file: the _judged
 * forms). A reload checks the file before it copies, so only an edit's
 * values are judged here then. False with a message. */
static bool finite_weight(const char *name, const float *v, size_t n, const tdit_weight_edit_t *edit) {
    if (kern_all_finite(v, n, KERN_F32)) return true;
    reel_fail(REEL_E_INVALID, "tensor %s holds a NaN or an infinity%s", name,
              edit && edit->adjust ? " (after the adapter's edit)" : "");
    return false;
}

/* A finite F32 of magnitude 0x1.fefp127 (3.3962e38) or more rounds to an
 * infinity in BF16 (round to nearest even): true when none of the n at p
 * does (nor is a NaN or an infinity). */
#define BF16_PAST_MAX "tensor %s holds a value past BF16's largest (3.3962e38): it would be an infinity in bf16"
static bool bf16_finite(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, b + 4 * i, 4);
        if ((u & 0x7fffffffu) >= 0x7f7f8000u) return false;
    }
    return true;
}

/* The bytes after a tensor of `bytes` up to its 256-byte slot's end. */
static size_t pad_of(size_t bytes) { return (256 - bytes % 256) % 256; }

/* Copies every tensor of l from f into m's arena, in list order, each
 * 256-byte aligned, the rest of its slot zeroed (the arena's bytes are
 * what tdit_model_weights shows: none left as the allocator had them);
 * with set_slots, points the model's tensors at them.
 * An edit (or NULL) picks the tensors copied and adjusts their values. */
static int copy_weights(tdit_model_t *m, const st_file_t *f, const wlist_t *l, bool set_slots,
                        const tdit_weight_edit_t *edit, bool judged) {
    assert(!set_slots || !edit || !edit->want); /* a first load copies every tensor */
    size_t esz = kern_dtype_size(m->dtype), maxn = 0;
    /* F32 on the CPU: each tensor is read straight into the arena (one
     * copy, and no staging buffer: a fresh one costs a fault and a
     * zeroing per page, more than the copy on the VMs measured). */
    bool direct = m->dtype == KERN_F32 && kern_backend_kind(m->backend) == KERN_BACKEND_CPU;
    for (size_t i = 0; i < l->n && !direct; i++)
        if ((size_t)numel_of(&l->e[i]) > maxn) maxn = (size_t)numel_of(&l->e[i]);
    float *host = direct ? NULL : malloc(maxn * sizeof *host);
    uint16_t *narrow = m->dtype == KERN_F32 ? NULL : malloc(maxn * esz);
    kern_stream_t *s = kern_stream_new(m->backend);
    int rc = -1;
    if (!s) goto out;
    if ((!direct && !host) || (m->dtype != KERN_F32 && !narrow)) { reel_fail(REEL_E_NOMEM, "out of memory"); goto out; }
    size_t off = 0;
    for (size_t i = 0; i < l->n; i++) {
        const wentry_t *e = &l->e[i];
        size_t n = (size_t)numel_of(e);
        kern_tensor_t t = kern_tensor_make((char *)m->arena + off, m->dtype,
                                           kern_backend_device(m->backend), e->ndim, e->shape);
        if (edit && edit->want && !edit->want(edit->user, e->name)) {
            off += (n * esz + 255) & ~(size_t)255;
            continue;
        }
        if (direct) {
            if (st_read_f32(f, e->name, e->ndim, e->shape, kern_tensor_ptr(&t)) != 0) goto out;
            if (edit && edit->adjust && edit->adjust(edit->user, e->name, kern_tensor_ptr(&t), (int64_t)n) != 0) goto out;
            if (((set_slots && !judged) || (edit && edit->adjust)) &&
                !finite_weight(e->name, kern_tensor_ptr(&t), n, edit))
                goto out;
            if (set_slots) *e->slot = t;
            memset((char *)kern_tensor_ptr(&t) + n * esz, 0, pad_of(n * esz));
            off += (n * esz + 255) & ~(size_t)255;
            continue;
        }
        if (st_read_f32(f, e->name, e->ndim, e->shape, host) != 0) goto out;
        if (edit && edit->adjust && edit->adjust(edit->user, e->name, host, (int64_t)n) != 0) goto out;
        if (((set_slots && !judged) || (edit && edit->adjust)) && !finite_weight(e->name, host, n, edit)) goto out;
        if (set_slots) *e->slot = t;
        const void *src = host;
        if (m->dtype == KERN_BF16) {
            /* a finite F32 within half a BF16 ulp of FLT_MAX or beyond it
             * rounds to infinity: refused like an infinity in the file */
            bool inf = false;
            for (size_t j = 0; j < n; j++) {
                narrow[j] = kern_f32_to_bf16(host[j]);
                inf |= (narrow[j] & 0x7fffu) == 0x7f80u;
            }
            if (inf) {
                reel_fail(REEL_E_INVALID, BF16_PAST_MAX, e->name);
                goto out;
            }
            src = narrow;
        }
        static const unsigned char zeros[256];
        if (kern_copy_h2d(s, kern_tensor_ptr(&t), src, n * esz) != 0 ||
            (pad_of(n * esz) && kern_copy_h2d(s, (char *)kern_tensor_ptr(&t) + n * esz, zeros, pad_of(n * esz)) != 0) ||
            kern_stream_sync(s) != 0)
            goto out;
        off += (n * esz + 255) & ~(size_t)255;
    }
    rc = 0;
out:
    kern_stream_destroy(&s);
    free(host);
    free(narrow);
    return rc;
}

tdit_model_t *tdit_model_load(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype) {
    return tdit_model_load_edit(b, f, dtype, NULL);
}

static tdit_model_t *load(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype, const tdit_weight_edit_t *edit,
                          bool judged);

tdit_model_t *tdit_model_load_edit(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype,
                                   const tdit_weight_edit_t *edit) {
    return load(b, f, dtype, edit, false);
}

tdit_model_t *tdit_model_load_judged(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype) {
    return load(b, f, dtype, NULL, true);
}

static tdit_model_t *load(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype, const tdit_weight_edit_t *edit,
                          bool judged) {
    if (edit && edit->want) {
        reel_fail(REEL_E_INVALID, "a first load copies every weight (an edit's `want` is for reloads)");
        return NULL;
    }
    tdit_model_t *m = calloc(1, sizeof *m);
    wlist_t l = { 0 };
    if (!m) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    m->backend = b;
    m->dtype = dtype;
    if (dtype != KERN_F32 && !(dtype == KERN_BF16 && kern_backend_kind(b) == KERN_BACKEND_CUDA)) {
        reel_fail(REEL_E_UNSUPPORTED, "model dtype %s is not supported on %s (CPU computes in F32)",
                  kern_dtype_name(dtype), kern_backend_device_name(b));
        goto err;
    }
    if (tdit_config_from_meta(f, &m->cfg) != 0) goto err;
    m->blocks = calloc((size_t)m->cfg.layers, sizeof *m->blocks);
    if (!m->blocks) { reel_fail(REEL_E_NOMEM, "out of memory"); goto err; }
    if (tdit_list_weights(&m->cfg, m, &l) != 0 || check_file(f, &l) != 0) goto err;
    /* One allocation, each tensor 256-byte aligned inside it. */
    size_t total = 0, esz = kern_dtype_size(dtype);
    for (size_t i = 0; i < l.n; i++) total += ((size_t)numel_of(&l.e[i]) * esz + 255) & ~(size_t)255;
    m->arena = kern_alloc(b, total);
    if (!m->arena) goto err;
    m->bytes = total;
    if (copy_weights(m, f, &l, true, edit, judged) != 0) goto err;
    /* Views the forward pass wants. */
    int64_t D = m->cfg.dim;
    m->patch.w = view2(&m->patch.w, D, 4 * m->cfg.in_channels);
    m->head_mod = view2(&m->head_mod, 2, D);
    for (int64_t i = 0; i < m->cfg.layers; i++)
        m->blocks[i].modulation = view2(&m->blocks[i].modulation, 6, D);
    if (!(m->tensors = malloc(l.n * sizeof *m->tensors))) { reel_fail(REEL_E_NOMEM, "out of memory"); goto err; }
    for (size_t i = 0; i < l.n; i++) m->tensors[i] = l.e[i].slot;
    m->n_tensors = (int)l.n;
    free(l.e);
    return m;
err:
    free(l.e);
    tdit_model_destroy(&m);
    return NULL;
}

int tdit_model_reload(tdit_model_t *m, const st_file_t *f) { return tdit_model_reload_edit(m, f, NULL); }

static int reload(tdit_model_t *m, const st_file_t *f, const tdit_weight_edit_t *edit, bool judged);

int tdit_model_reload_edit(tdit_model_t *m, const st_file_t *f, const tdit_weight_edit_t *edit) {
    return reload(m, f, edit, false);
}

int tdit_model_reload_judged(tdit_model_t *m, const st_file_t *f, const tdit_weight_edit_t *edit) {
    return reload(m, f, edit, true);
}

static int reload(tdit_model_t *m, const st_file_t *f, const tdit_weight_edit_t *edit, bool judged) {
    tdit_config_t c;
    if (tdit_config_from_meta(f, &c) != 0) return -1;
    if (!tdit_config_same_network(&c, &m->cfg))
        return reel_fail(REEL_E_INVALID, "weights: config %s does not match the resident %s", c.name, m->cfg.name);
    wlist_t l = { 0 };
    int rc = tdit_list_weights(&m->cfg, NULL, &l);
    if (rc == 0) rc = check_file(f, &l);
    /* A NaN in the file is found before any resident weight changes (one
     * made by the edit itself is found only as it is copied). */
    for (size_t i = 0; rc == 0 && !judged && i < l.n; i++) {
        const st_tensor_t *t = st_find(f, l.e[i].name);
        if (t && (!edit || !edit->want || edit->want(edit->user, l.e[i].name)) &&
            !kern_all_finite(t->data, t->nbytes / kern_dtype_size(t->dtype), t->dtype))
            rc = reel_fail(REEL_E_INVALID, "tensor %s holds a NaN or an infinity", l.e[i].name);
    }
    /* so is an F32 that a BF16 model would round to infinity */
    for (size_t i = 0; rc == 0 && m->dtype == KERN_BF16 && i < l.n; i++) {
        const st_tensor_t *t = st_find(f, l.e[i].name);
        if (t && t->dtype == KERN_F32 && (!edit || !edit->want || edit->want(edit->user, l.e[i].name)) &&
            !bf16_finite(t->data, t->nbytes / 4))
            rc = reel_fail(REEL_E_INVALID, BF16_PAST_MAX, l.e[i].name);
    }
    if (rc == 0 && copy_weights(m, f, &l, false, edit, judged) != 0)
        rc = reel_fail_prefix("weights: reload failed part-way, resident weights are mixed: ");
    free(l.e);
    return rc;
}

tdit_model_t *tdit_model_load_path(kern_backend_t *b, const char *path, kern_dtype_t dtype) {
    st_file_t *f = wan_ckpt_load(path);
    if (!f) return NULL;
    tdit_model_t *m = tdit_model_load(b, f, dtype);
    st_close(&f);
    return m;
}

void tdit_model_destroy(tdit_model_t **mp) {
    if (!mp || !*mp) return;
    tdit_model_t *m = *mp;
    kern_free(m->backend, m->arena);
    free(m->blocks);
    free(m->tensors);
    free(m);
    *mp = NULL;
}

int tdit_model_n_tensors(const tdit_model_t *m) { return m->n_tensors; }

const kern_tensor_t *tdit_model_tensor(const tdit_model_t *m, int i) {
    return i >= 0 && i < m->n_tensors ? m->tensors[i] : NULL;
}

int tdit_model_relocate(tdit_model_t *m) {
    void *old = m->arena, *arena = kern_alloc(m->backend, m->bytes);
    if (!arena) return -1;
    kern_stream_t *s = kern_stream_new(m->backend);
    int rc = s ? kern_copy_d2d(s, arena, old, m->bytes) : -1;
    if (rc == 0) rc = kern_stream_sync(s);
    kern_stream_destroy(&s);
    if (rc != 0) {
        kern_free(m->backend, arena);
        return -1;
    }
    for (int i = 0; i < m->n_tensors; i++)
        m->tensors[i]->data = (char *)arena + ((char *)m->tensors[i]->data - (char *)old);
    m->arena = arena;
    kern_free(m->backend, old);
    return 0;
}

const tdit_config_t *tdit_model_config(const tdit_model_t *m) { return &m->cfg; }
kern_backend_t *tdit_model_backend(const tdit_model_t *m) { return m->backend; }
kern_dtype_t tdit_model_dtype(const tdit_model_t *m) { return m->dtype; }
size_t tdit_model_bytes(const tdit_model_t *m) { return m->bytes; }
const void *tdit_model_weights(const tdit_model_t *m) { return m->arena; }
