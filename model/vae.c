/* vae.c -- Wan2.1's VAE decoder on the kernel backend (see vae.h).
 *
 * Layout: every activation is channels-last, [T, H, W, C] (kernels/
 * ops_video.h), so a causal 3-D convolution is IM2COL3D + GEMM against
 * weights stored [Cout, kt·kh·kw·Cin] ((dt, dy, dx, c) order: permuted
 * once at load from PyTorch's [Cout, Cin, kt, kh, kw]), and RMS_norm over
 * channels is a row norm.
 *
 * Decoding follows WanVAE_.decode exactly: one latent frame per chunk,
 * each causal conv with a temporal kernel of 3 keeping the last two frames
 * of its input stream (upstream's feat_cache: "last two frames of the
 * chunk, or the last cached frame and this chunk's one"). The upsample3d
 * time conv is not run on the first chunk (upstream marks its cache 'Rep'
 * and passes the frame through), and from the second chunk on it starts
 * from zero padding, as 'Rep' does: its input stream is the frames of
 * chunks 1.. only. Hence 1 + 4(F−1) frames out.
 *
 * Memory: three activation buffers sized for one chunk at the largest
 * stage, one im2col block of at most VAE_COLS_BYTES, and two frames of
 * cache per temporal conv: bounded by one chunk whatever F is. */
#include "vae.h"
#include "kernels/ops.h"
#include "kernels/ops_video.h"
#include "kernels/philox.h"
#include "base/error.h"
#include <jansson.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(x) do { if ((x) != 0) goto err; } while (0)

/* The im2col block of one convolution launch: bounds the scratch of a
 * conv whatever the frame size (more bytes: fewer, larger GEMMs). */
#define VAE_COLS_BYTES_CPU ((size_t)64 << 20)
#define VAE_COLS_BYTES_CUDA ((size_t)256 << 20)
#define VAE_MAX_Z 64

/* Wan2.1's published latent statistics (wan/modules/vae.py, WanVAE). */
static const float wan_mean[16] = { -0.7571f, -0.7089f, -0.9113f, 0.1075f, -0.1745f, 0.9653f,
                                    -0.1517f, 1.5508f, 0.4134f, -0.0715f, 0.5517f, -0.3632f,
                                    -0.1922f, -0.9497f, 0.2503f, -0.2921f };
static const float wan_std[16] = { 2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f,
                                   2.6052f, 2.0743f, 3.2687f, 2.1526f, 2.8652f, 1.5579f,
                                   1.6382f, 1.1253f, 2.8251f, 1.9160f };

/* ---- configs ------------------------------------------------------------ */

static const vae_config_t builtins[] = {
    { .name = "wan2.1", .dim = 96, .z_dim = 16, .dim_mult = { 1, 2, 4, 4 }, .num_res_blocks = 2 },
    { .name = "vae-tiny", .dim = 8, .z_dim = 4, .dim_mult = { 1, 2, 4, 4 }, .num_res_blocks = 2 },
};
#define N_BUILTINS (sizeof builtins / sizeof builtins[0])

const char *vae_config_builtin_name(int i) {
    return i >= 0 && (size_t)i < N_BUILTINS ? builtins[i].name : NULL;
}

int vae_config_builtin(const char *name, vae_config_t *out) {
    for (size_t i = 0; i < N_BUILTINS; i++)
        if (name && !strcmp(name, builtins[i].name)) {
            *out = builtins[i];
            return 0;
        }
    return reel_fail(REEL_E_NOT_FOUND, "unknown VAE config '%s' (known: wan2.1, vae-tiny)", name ? name : "(null)");
}

int vae_config_validate(const vae_config_t *c) {
    if (c->dim < 1 || c->dim > 4096 || c->z_dim < 1 || c->z_dim > VAE_MAX_Z)
        return reel_fail(REEL_E_INVALID, "VAE config %s: dim %" PRId64 " (1..4096) or z_dim %" PRId64
                         " (1..%d) out of range", c->name, c->dim, c->z_dim, VAE_MAX_Z);
    static const int64_t mult[4] = { 1, 2, 4, 4 };
    if (memcmp(c->dim_mult, mult, sizeof mult) || c->num_res_blocks != 2)
        return reel_fail(REEL_E_UNSUPPORTED, "VAE config %s: only dim_mult 1,2,4,4 with 2 residual "
                         "blocks (Wan2.1's) is supported", c->name);
    return 0;
}

/* The channels of the decoder's stages: dims[0] at the middle, dims[i+1]
 * the output of up-sampling stage i (Decoder3d: dim · [mult[-1]] +
 * reversed mult). */
static void stage_dims(const vae_config_t *c, int64_t dims[5]) {
    dims[0] = c->dim * c->dim_mult[3];
    for (int i = 0; i < 4; i++) dims[i + 1] = c->dim * c->dim_mult[3 - i];
}

/* Upsample mode of stage i (0..2; stage 3 has none): temperal_downsample
 * F,T,T reversed. */
static bool stage_temporal(int i) { return i < 2; }

int vae_config_from_weights(const st_file_t *f, vae_config_t *out) {
    const char *origin = st_origin(f);
    const st_tensor_t *t = st_find(f, "decoder.conv1.weight");
    if (!t) return reel_fail(REEL_E_INVALID, "%s: no tensor decoder.conv1.weight: not a Wan VAE checkpoint", origin);
    if (t->ndim != 5 || t->shape[2] != 3 || t->shape[3] != 3 || t->shape[4] != 3 || t->shape[0] % 4 ||
        t->shape[0] < 4)
        return reel_fail(REEL_E_INVALID, "%s: decoder.conv1.weight has shape [%" PRId64 ",...] of rank %d, "
                         "expected [4*dim, z_dim, 3, 3, 3]", origin, t->ndim ? t->shape[0] : 0, t->ndim);
    vae_config_t c = { .dim = t->shape[0] / 4, .z_dim = t->shape[1], .dim_mult = { 1, 2, 4, 4 },
                       .num_res_blocks = 2 };
    snprintf(c.name, sizeof c.name, "custom");
    for (size_t i = 0; i < N_BUILTINS; i++)
        if (builtins[i].dim == c.dim && builtins[i].z_dim == c.z_dim) memcpy(c.name, builtins[i].name, sizeof c.name);
    if (!st_find(f, "decoder.upsamples.3.resample.1.weight") || st_find(f, "decoder.upsamples.15.residual.0.gamma"))
        return reel_fail(REEL_E_UNSUPPORTED, "%s: the decoder's blocks are not Wan2.1's (3 residual blocks "
                         "per stage, then a resample)", origin);
    if (vae_config_validate(&c) != 0) return -1;
    *out = c;
    return 0;
}

/* ---- the model ------------------------------------------------------------ */

typedef struct {
    kern_tensor_t w, b;       /* [Cout, kt·kh·kw·Cin] and [Cout] */
    int64_t cin, cout, kt, kh, kw;
    kern_tensor_t cache;      /* kt == 3: [2, H, W, Cin], allocated on first use in a decode */
    int64_t ncache;           /* frames of it that hold the stream's last frames */
} conv_t;

typedef struct { kern_tensor_t g; int64_t c; } norm_t;     /* gamma [C] */
typedef struct { norm_t n0, n1; conv_t c0, c1, sc; bool has_sc; } rblock_t;
typedef struct { norm_t n; conv_t q, k, v, proj; } attn_t;
typedef struct { conv_t conv, tconv; bool temporal; } resample_t;

struct vae_model {
    kern_backend_t *b;
    vae_config_t cfg;
    float mean[VAE_MAX_Z], std[VAE_MAX_Z];
    conv_t conv2, conv1, head_c;
    rblock_t mid0, mid2, up[4][3];
    attn_t attn;
    resample_t rs[3];
    norm_t head_n;
    void **allocs;            /* every device allocation of weights */
    size_t n_allocs, cap_allocs, bytes;
};

/* ---- walking the weights: one description for init, load and checks ------ */

typedef enum { W_CONV, W_BIAS, W_GAMMA } wkind_t;

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[KERN_MAX_DIMS];
    wkind_t kind;
    int64_t fan_in;
} wentry_t;

/* Either lists entries (m NULL) or loads them from f into m. */
typedef struct {
    vae_model_t *m;
    const st_file_t *f;
    kern_stream_t *s;
    wentry_t *e;
    size_t n, cap;
} walk_t;

static int64_t numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

static int add_entry(walk_t *w, const char *name, int ndim, const int64_t *shape, wkind_t kind, int64_t fan_in) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        wentry_t *e = realloc(w->e, cap * sizeof *e);
        if (!e) return reel_fail(REEL_E_NOMEM, "out of memory listing VAE weights");
        w->e = e;
        w->cap = cap;
    }
    wentry_t *e = &w->e[w->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = ndim;
    memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->kind = kind;
    e->fan_in = fan_in;
    return 0;
}

/* A device tensor of m holding host data [numel], shaped ndim/shape. */
static int upload(walk_t *w, const float *host, int ndim, const int64_t *shape, kern_tensor_t *out) {
    vae_model_t *m = w->m;
    size_t bytes = (size_t)numel(ndim, shape) * sizeof(float);
    if (m->n_allocs == m->cap_allocs) {
        size_t cap = m->cap_allocs ? 2 * m->cap_allocs : 128;
        void **a = realloc(m->allocs, cap * sizeof *a);
        if (!a) return reel_fail(REEL_E_NOMEM, "out of memory loading the VAE");
        m->allocs = a;
        m->cap_allocs = cap;
    }
    void *p = kern_alloc(m->b, bytes);
    if (!p) return -1;
    m->allocs[m->n_allocs++] = p;
    m->bytes += bytes;
    *out = kern_tensor_make(p, KERN_F32, kern_backend_device(m->b), ndim, shape);
    return kern_copy_h2d(w->s, p, host, bytes);
}

/* Reads tensor name of the expected shape widened to F32 (malloc'd). */
static float *read_host(walk_t *w, const char *name, int ndim, const int64_t *shape) {
    float *h = malloc((size_t)numel(ndim, shape) * sizeof *h);
    if (!h) { reel_fail(REEL_E_NOMEM, "out of memory reading %s", name); return NULL; }
    if (st_read_f32(w->f, name, ndim, shape, h) != 0) {
        free(h);
        return NULL;
    }
    if (!kern_all_finite(h, (size_t)numel(ndim, shape), KERN_F32)) {
        free(h);
        reel_fail(REEL_E_INVALID, "%s: tensor %s holds a NaN or an infinity", st_origin(w->f), name);
        return NULL;
    }
    return h;
}

/* Rows [r0, r0+n) of a [rows, K] host matrix w (permuted) onto the device
 * as c's weight, and bias rows likewise. */
static int conv_upload(walk_t *w, const float *wt, const float *bias, int64_t r0, conv_t *c) {
    int64_t K = c->kt * c->kh * c->kw * c->cin;
    int64_t ws[2] = { c->cout, K }, bs[1] = { c->cout };
    if (upload(w, wt + r0 * K, 2, ws, &c->w) || upload(w, bias + r0, 1, bs, &c->b)) return -1;
    return kern_stream_sync(w->s);
}

/* PyTorch's [Cout, Cin, taps] to [Cout, taps, Cin]. */
static void permute_taps(const float *src, float *dst, int64_t cout, int64_t cin, int64_t taps) {
    for (int64_t o = 0; o < cout; o++)
        for (int64_t i = 0; i < cin; i++)
            for (int64_t t = 0; t < taps; t++) dst[(o * taps + t) * cin + i] = src[(o * cin + i) * taps + t];
}

/* prefix.weight [cout, cin, (kt,) kh, kw] (ndim 5, or 4 for a 2-D conv
 * with kt 1) and prefix.bias [cout]. split > 1: the rows are `split`
 * convs of cout/split outputs each, into c[0..split) (to_qkv). */
static int w_conv(walk_t *w, const char *prefix, int64_t cin, int64_t cout, int64_t kt, int64_t kh,
                  int64_t kw, int ndim, conv_t *c, int split) {
    char wn[96], bn[96];
    snprintf(wn, sizeof wn, "%s.weight", prefix);
    snprintf(bn, sizeof bn, "%s.bias", prefix);
    int64_t shape[5] = { cout, cin, kt, kh, kw };
    if (ndim == 4) { shape[2] = kh; shape[3] = kw; }
    int64_t taps = kt * kh * kw;
    if (!w->m)
        return add_entry(w, wn, ndim, shape, W_CONV, cin * taps) || add_entry(w, bn, 1, shape, W_BIAS, cin * taps);
    float *raw = read_host(w, wn, ndim, shape), *bias = raw ? read_host(w, bn, 1, shape) : NULL;
    float *perm = bias ? malloc((size_t)numel(ndim, shape) * sizeof *perm) : NULL;
    int rc = -1;
    if (bias && !perm) reel_fail(REEL_E_NOMEM, "out of memory loading %s", wn);
    if (perm) {
        permute_taps(raw, perm, cout, cin, taps);
        rc = 0;
        for (int i = 0; i < split && rc == 0; i++) {
            c[i] = (conv_t){ .cin = cin, .cout = cout / split, .kt = kt, .kh = kh, .kw = kw };
            rc = conv_upload(w, perm, bias, i * (cout / split), &c[i]);
        }
    }
    free(raw);
    free(bias);
    free(perm);
    return rc;
}

/* prefix.gamma [C, 1, 1(, 1)]: ndim 4 for RMS_norm(images=False), 3 for
 * the attention's RMS_norm(images=True). RMS_norm has no bias here. */
static int w_gamma(walk_t *w, const char *prefix, int64_t C, int ndim, norm_t *n) {
    char gn[96];
    snprintf(gn, sizeof gn, "%s.gamma", prefix);
    int64_t shape[4] = { C, 1, 1, 1 };
    if (!w->m) return add_entry(w, gn, ndim, shape, W_GAMMA, 0);
    float *g = read_host(w, gn, ndim, shape);
    if (!g) return -1;
    n->c = C;
    int rc = upload(w, g, 1, shape, &n->g);
    if (rc == 0) rc = kern_stream_sync(w->s);
    free(g);
    return rc;
}

static int w_rblock(walk_t *w, const char *prefix, int64_t in, int64_t out, rblock_t *r) {
    char p[96];
    r->has_sc = in != out;
    snprintf(p, sizeof p, "%s.residual.0", prefix);
    if (w_gamma(w, p, in, 4, &r->n0)) return -1;
    snprintf(p, sizeof p, "%s.residual.2", prefix);
    if (w_conv(w, p, in, out, 3, 3, 3, 5, &r->c0, 1)) return -1;
    snprintf(p, sizeof p, "%s.residual.3", prefix);
    if (w_gamma(w, p, out, 4, &r->n1)) return -1;
    snprintf(p, sizeof p, "%s.residual.6", prefix);
    if (w_conv(w, p, out, out, 3, 3, 3, 5, &r->c1, 1)) return -1;
    snprintf(p, sizeof p, "%s.shortcut", prefix);
    if (r->has_sc && w_conv(w, p, in, out, 1, 1, 1, 5, &r->sc, 1)) return -1;
    return 0;
}

/* The whole decoder, in the order of WanVAE_'s state dict. */
static int walk(walk_t *w, const vae_config_t *c) {
    vae_model_t *m = w->m, dummy;
    if (!m) {
        memset(&dummy, 0, sizeof dummy);
        m = &dummy;
    }
    int64_t dims[5], z = c->z_dim;
    stage_dims(c, dims);
    char p[96];
    if (w_conv(w, "conv2", z, z, 1, 1, 1, 5, &m->conv2, 1)) return -1;
    if (w_conv(w, "decoder.conv1", z, dims[0], 3, 3, 3, 5, &m->conv1, 1)) return -1;
    if (w_rblock(w, "decoder.middle.0", dims[0], dims[0], &m->mid0)) return -1;
    if (w_gamma(w, "decoder.middle.1.norm", dims[0], 3, &m->attn.n)) return -1;
    conv_t qkv[3];
    memset(qkv, 0, sizeof qkv);
    if (w_conv(w, "decoder.middle.1.to_qkv", dims[0], 3 * dims[0], 1, 1, 1, 4, qkv, 3)) return -1;
    m->attn.q = qkv[0], m->attn.k = qkv[1], m->attn.v = qkv[2];
    if (w_conv(w, "decoder.middle.1.proj", dims[0], dims[0], 1, 1, 1, 4, &m->attn.proj, 1)) return -1;
    if (w_rblock(w, "decoder.middle.2", dims[0], dims[0], &m->mid2)) return -1;
    int idx = 0;
    for (int i = 0; i < 4; i++) {
        int64_t in = i ? dims[i] / 2 : dims[i], out = dims[i + 1];
        for (int j = 0; j < 3; j++, idx++) {
            snprintf(p, sizeof p, "decoder.upsamples.%d", idx);
            if (w_rblock(w, p, in, out, &m->up[i][j])) return -1;
            in = out;
        }
        if (i == 3) break;
        resample_t *r = &m->rs[i];
        r->temporal = stage_temporal(i);
        snprintf(p, sizeof p, "decoder.upsamples.%d.resample.1", idx);
        if (w_conv(w, p, out, out / 2, 1, 3, 3, 4, &r->conv, 1)) return -1;
        snprintf(p, sizeof p, "decoder.upsamples.%d.time_conv", idx);
        if (r->temporal && w_conv(w, p, out, 2 * out, 3, 1, 1, 5, &r->tconv, 1)) return -1;
        idx++;
    }
    if (w_gamma(w, "decoder.head.0", dims[4], 4, &m->head_n)) return -1;
    return w_conv(w, "decoder.head.2", dims[4], 3, 3, 3, 3, 5, &m->head_c, 1);
}

/* ---- random weights ------------------------------------------------------ */

int vae_weights_init(const vae_config_t *c, uint64_t seed, const char *path) {
    if (vae_config_validate(c) != 0) return -1;
    walk_t w = { 0 };
    st_writer_t *wr = NULL;
    float *buf = NULL;
    int rc = -1;
    if (walk(&w, c) != 0) goto out;
    if (!(wr = st_writer_new())) goto out;
    char v[32];
    snprintf(v, sizeof v, "%" PRIu64, seed);
    if (st_writer_meta(wr, "config", c->name) || st_writer_meta(wr, "init_seed", v) ||
        st_writer_meta(wr, "format", "pt"))
        goto out;
    for (size_t i = 0; i < w.n; i++) {
        const wentry_t *e = &w.e[i];
        int64_t n = numel(e->ndim, e->shape);
        float *nb = realloc(buf, (size_t)n * sizeof *buf);
        if (!nb) { reel_fail(REEL_E_NOMEM, "out of memory initialising %s", e->name); goto out; }
        buf = nb;
        /* Tensor i draws from its own Philox stream (seed, i). Conv
         * weights N(0, 1/fan_in): activations keep their scale through
         * the stack; gammas near 1 and small biases, so every parameter
         * matters to the output a test compares. */
        for (int64_t j = 0; j < n; j++) {
            double g = kern_philox_normal(seed, (uint32_t)i, (uint64_t)j);
            buf[j] = (float)(e->kind == W_CONV ? g / sqrt((double)e->fan_in)
                           : e->kind == W_GAMMA ? 1.0 + 0.1 * g
                           : 0.05 * g);
        }
        if (st_writer_add_f32(wr, e->name, e->ndim, e->shape, buf)) goto out;
    }
    rc = st_writer_save(wr, path);
out:
    free(buf);
    free(w.e);
    st_writer_destroy(&wr);
    return rc;
}

/* ---- loading --------------------------------------------------------------- */

/* n floats from metadata key (a JSON array) into out; 0 when the key is
 * absent (out untouched), -1 with a message when it is malformed. */
static int meta_floats(const st_file_t *f, const char *key, int64_t n, float *out) {
    const char *s = st_meta(f, key);
    if (!s) return 0;
    json_error_t je;
    json_t *a = json_loads(s, 0, &je);
    int rc = 0;
    if (!json_is_array(a) || (int64_t)json_array_size(a) != n) {
        rc = reel_fail(REEL_E_INVALID, "%s: metadata %s is not an array of %" PRId64 " numbers", st_origin(f), key, n);
    } else {
        for (int64_t i = 0; i < n && rc == 0; i++) {
            json_t *x = json_array_get(a, (size_t)i);
            if (!json_is_number(x) || !isfinite(json_number_value(x)))
                rc = reel_fail(REEL_E_INVALID, "%s: metadata %s[%" PRId64 "] is not a finite number", st_origin(f), key, i);
            else out[i] = (float)json_number_value(x);
        }
    }
    json_decref(a);
    return rc;
}

vae_model_t *vae_model_load(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype) {
    if (dtype != KERN_F32) {
        reel_fail(REEL_E_UNSUPPORTED, "VAE: compute dtype %s: only F32 is supported", kern_dtype_name(dtype));
        return NULL;
    }
    vae_model_t *m = calloc(1, sizeof *m);
    walk_t w = { .m = m, .f = f };
    if (!m) { reel_fail(REEL_E_NOMEM, "out of memory loading the VAE"); return NULL; }
    m->b = b;
    TRY(vae_config_from_weights(f, &m->cfg));
    for (int64_t i = 0; i < m->cfg.z_dim; i++) {
        m->mean[i] = m->cfg.z_dim == 16 ? wan_mean[i] : 0.0f;
        m->std[i] = m->cfg.z_dim == 16 ? wan_std[i] : 1.0f;
    }
    TRY(meta_floats(f, "latents_mean", m->cfg.z_dim, m->mean));
    TRY(meta_floats(f, "latents_std", m->cfg.z_dim, m->std));
    for (int64_t i = 0; i < m->cfg.z_dim; i++)
        if (!(m->std[i] > 0)) {
            reel_fail(REEL_E_INVALID, "%s: latents_std[%" PRId64 "] must be > 0", st_origin(f), i);
            goto err;
        }
    if (!(w.s = kern_stream_new(b))) goto err;
    TRY(walk(&w, &m->cfg));
    kern_stream_destroy(&w.s);
    return m;
err:
    kern_stream_destroy(&w.s);
    vae_model_destroy(&m);
    return NULL;
}

void vae_model_destroy(vae_model_t **mp) {
    if (!mp || !*mp) return;
    vae_model_t *m = *mp;
    for (size_t i = 0; i < m->n_allocs; i++) kern_free(m->b, m->allocs[i]);
    free(m->allocs);
    free(m);
    *mp = NULL;
}

const vae_config_t *vae_model_config(const vae_model_t *m) { return &m->cfg; }
size_t vae_model_bytes(const vae_model_t *m) { return m->bytes; }

/* ---- decoding ------------------------------------------------------------ */

typedef struct {
    vae_model_t *m;
    kern_stream_t *s;
    int dev;
    float *buf[3];            /* activations, each max_elems floats */
    int64_t max_elems;
    kern_tensor_t cols;       /* F32 [R, Kmax] */
    int64_t cols_elems;
    conv_t **cached;          /* the convs whose caches this decode allocated */
    size_t n_cached, cap_cached;
} dec_t;

static kern_tensor_t act(dec_t *d, float *p, int64_t T, int64_t H, int64_t W, int64_t C) {
    int64_t shape[4] = { T, H, W, C };
    return kern_tensor_make(p, KERN_F32, d->dev, 4, shape);
}

static kern_tensor_t flat2(const kern_tensor_t *t, int64_t rows, int64_t cols) {
    int64_t shape[2] = { rows, cols };
    kern_tensor_t v = kern_tensor_make(t->data, t->dtype, t->device, 2, shape);
    v.offset = t->offset;
    return v;
}

/* A frame (or two) of the cache: [n, H, W, C] from slot `first`. */
static kern_tensor_t cache_view(const conv_t *c, int64_t first, int64_t n) {
    kern_tensor_t v = c->cache;
    v.shape[0] = n;
    v.offset = c->cache.offset + (size_t)(first * c->cache.shape[1] * c->cache.shape[2] * c->cin) * sizeof(float);
    return v;
}

/* y = conv(x), with x's causal history from c's cache when kt > 1; then
 * the cache keeps the last two frames of the stream (upstream's cache_x:
 * x[-2:], or the cache's last frame and x's one when x has one). */
static int conv_run(dec_t *d, conv_t *c, const kern_tensor_t *x, kern_tensor_t *y) {
    int64_t K = c->kt * c->kh * c->kw * c->cin;
    int64_t rows = d->cols_elems / K;
    kern_tensor_t cols = flat2(&d->cols, rows, K);
    if (c->kt == 1) return kern_conv3d_causal(d->s, NULL, x, &c->w, &c->b, c->kt, c->kh, c->kw, &cols, y);
    int64_t T = x->shape[0], H = x->shape[1], W = x->shape[2];
    if (!c->cache.data) {
        if (d->n_cached == d->cap_cached) {
            size_t cap = d->cap_cached ? 2 * d->cap_cached : 64;
            conv_t **a = realloc(d->cached, cap * sizeof *a);
            if (!a) return reel_fail(REEL_E_NOMEM, "out of memory decoding");
            d->cached = a;
            d->cap_cached = cap;
        }
        float *p = kern_alloc(d->m->b, (size_t)(2 * H * W * c->cin) * sizeof(float));
        if (!p) return -1;
        d->cached[d->n_cached++] = c;
        c->cache = act(d, p, 2, H, W, c->cin);
        c->ncache = 0;
    }
    kern_tensor_t prev = cache_view(c, 0, c->ncache);
    if (kern_conv3d_causal(d->s, c->ncache ? &prev : NULL, x, &c->w, &c->b, c->kt, c->kh, c->kw, &cols, y))
        return -1;
    size_t frame = (size_t)(H * W * c->cin) * sizeof(float);
    char *cache = kern_tensor_ptr(&c->cache);
    const char *src = kern_tensor_ptr(x);
    if (T >= 2) {
        c->ncache = 2;
        return kern_copy_d2d(d->s, cache, src + (size_t)(T - 2) * frame, 2 * frame);
    }
    if (c->ncache == 2 && kern_copy_d2d(d->s, cache, cache + frame, frame)) return -1;
    if (c->ncache < 2) c->ncache++;
    return kern_copy_d2d(d->s, cache + (size_t)(c->ncache - 1) * frame, src, frame);
}

/* RMS_norm over channels: F.normalize(x)·√C·gamma = x/√(mean x²)·gamma,
 * F.normalize's floor max(‖x‖, 1e-12) as eps = 1e-24/C inside the mean
 * (the two differ only for rows of norm near 1e-12). Then SiLU. */
static int norm_silu(dec_t *d, const norm_t *n, const kern_tensor_t *x, kern_tensor_t *y, bool silu) {
    int64_t C = n->c, rows = kern_tensor_numel(x) / C;
    kern_tensor_t xv = flat2(x, rows, C), yv = flat2(y, rows, C);
    if (kern_rmsnorm(d->s, &xv, &n->g, 1e-24f / (float)C, &yv)) return -1;
    return silu ? kern_silu(d->s, &yv, &yv) : 0;
}

/* x (in buf[xi], [T,H,W,in]) becomes the block's output [T,H,W,out] in
 * place; the other two buffers are scratch. */
static int rblock_run(dec_t *d, rblock_t *r, int xi, kern_tensor_t *x) {
    int64_t T = x->shape[0], H = x->shape[1], W = x->shape[2];
    float *A = d->buf[(xi + 1) % 3], *B = d->buf[(xi + 2) % 3];
    kern_tensor_t a = act(d, A, T, H, W, r->c0.cin), b = act(d, B, T, H, W, r->c0.cout);
    if (norm_silu(d, &r->n0, x, &a, true) || conv_run(d, &r->c0, &a, &b)) return -1;
    a = act(d, A, T, H, W, r->c1.cin);
    if (norm_silu(d, &r->n1, &b, &a, true) || conv_run(d, &r->c1, &a, &b)) return -1;
    kern_tensor_t y = act(d, d->buf[xi], T, H, W, r->c1.cout);
    if (r->has_sc) {
        a = act(d, A, T, H, W, r->sc.cout);
        if (conv_run(d, &r->sc, x, &a) || kern_add(d->s, &b, &a, &y)) return -1;
    } else if (kern_add(d->s, &b, x, &y)) {
        return -1;
    }
    *x = y;
    return 0;
}

/* The middle's single-head attention over each frame's H·W pixels (SDPA's
 * default scale 1/√C), proj, residual: in place on x. */
static int attn_run(dec_t *d, attn_t *at, int xi, kern_tensor_t *x) {
    int64_t T = x->shape[0], HW = x->shape[1] * x->shape[2], C = x->shape[3];
    float *A = d->buf[(xi + 1) % 3], *B = d->buf[(xi + 2) % 3];
    for (int64_t t = 0; t < T; t++) {
        int64_t sh[2] = { HW, C };
        kern_tensor_t xf = kern_tensor_make(d->buf[xi] + t * HW * C, KERN_F32, d->dev, 2, sh);
        kern_tensor_t a = kern_tensor_make(A, KERN_F32, d->dev, 2, sh);
        kern_tensor_t q = kern_tensor_make(B, KERN_F32, d->dev, 2, sh);
        kern_tensor_t k = kern_tensor_make(B + HW * C, KERN_F32, d->dev, 2, sh);
        kern_tensor_t v = kern_tensor_make(B + 2 * HW * C, KERN_F32, d->dev, 2, sh);
        kern_tensor_t o = kern_tensor_make(B + 3 * HW * C, KERN_F32, d->dev, 2, sh);
        if (norm_silu(d, &at->n, &xf, &a, false) || kern_gemm(d->s, &a, &at->q.w, &at->q.b, &q) ||
            kern_gemm(d->s, &a, &at->k.w, &at->k.b, &k) || kern_gemm(d->s, &a, &at->v.w, &at->v.b, &v) ||
            kern_attention(d->s, &q, &k, &v, 1, &o) || kern_gemm(d->s, &o, &at->proj.w, &at->proj.b, &a) ||
            kern_add(d->s, &xf, &a, &xf))
            return -1;
    }
    return 0;
}

/* Resample: on chunks after the first, upsample3d's time conv to 2C
 * channels and the frame interleave (T -> 2T); then nearest 2x and the
 * 3x3 conv to C/2, per frame. x ends in buf[xi]. */
static int resample_run(dec_t *d, resample_t *r, bool first_chunk, int xi, kern_tensor_t *x) {
    int64_t T = x->shape[0], H = x->shape[1], W = x->shape[2], C = x->shape[3];
    float *A = d->buf[(xi + 1) % 3], *B = d->buf[(xi + 2) % 3];
    kern_tensor_t in = *x;
    if (r->temporal && !first_chunk) {
        kern_tensor_t a = act(d, A, T, H, W, 2 * C), b = act(d, B, 2 * T, H, W, C);
        if (conv_run(d, &r->tconv, x, &a) || kern_frame_interleave(d->s, &a, &b)) return -1;
        T *= 2;
        in = b;
    }
    kern_tensor_t up = act(d, in.data == A ? B : A, T, 2 * H, 2 * W, C);
    kern_tensor_t y = act(d, d->buf[xi], T, 2 * H, 2 * W, C / 2);
    if (kern_upsample2x(d->s, &in, &up) || conv_run(d, &r->conv, &up, &y)) return -1;
    *x = y;
    return 0;
}

/* The largest activation of a chunk of one latent frame at latent size
 * H x W (frames double after each temporal stage but on the first chunk:
 * the second chunk is the largest), and the widest im2col row. */
static void plan_sizes(const vae_config_t *c, int64_t F, int64_t H, int64_t W, int64_t *max_elems, int64_t *max_k) {
    int64_t dims[5];
    stage_dims(c, dims);
#define GROW(v, x) do { int64_t x_ = (x); if (x_ > (v)) (v) = x_; } while (0)
    int64_t T = 1, mx = H * W * c->z_dim, hw = H * W;
    GROW(mx, 4 * hw * dims[0]); /* q, k, v, o of the attention */
    for (int i = 0; i < 4; i++) {
        int64_t in = i ? dims[i] / 2 : dims[i], out = dims[i + 1];
        GROW(mx, T * hw * (in > out ? in : out));
        if (i == 3) break;
        if (stage_temporal(i) && F > 1) {
            GROW(mx, T * hw * 2 * out);
            T *= 2;
        }
        hw *= 4;
        GROW(mx, T * hw * out);
    }
    /* the head's RGB output at full size: wider than the last stage when
     * that stage has fewer than 3 channels (dim 1) */
    GROW(mx, T * hw * 3);
#undef GROW
    *max_elems = mx;
    *max_k = 27 * dims[0]; /* the widest im2col row: a 3x3x3 conv over the widest stage */
}

static void dec_release(dec_t *d) {
    for (size_t i = 0; i < d->n_cached; i++) {
        kern_free(d->m->b, d->cached[i]->cache.data);
        d->cached[i]->cache = (kern_tensor_t){ 0 };
        d->cached[i]->ncache = 0;
    }
    free(d->cached);
    for (int i = 0; i < 3; i++) kern_free(d->m->b, d->buf[i]);
    kern_free(d->m->b, d->cols.data);
}

int vae_latent_check(const vae_model_t *m, int64_t F, int64_t H, int64_t W) {
    if (F < 1 || H < 1 || W < 1 || F > 100000 || H > 4096 || W > 4096)
        return reel_fail(REEL_E_INVALID, "vae_decode: latent [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                         "] out of range (F 1..100000, H and W 1..4096)", m->cfg.z_dim, F, H, W);
    return 0;
}

int vae_decode(vae_model_t *m, kern_stream_t *s, const float *latent, int64_t F, int64_t H, int64_t W,
               float *video, vae_progress_fn progress, void *user) {
    const vae_config_t *c = &m->cfg;
    if (vae_latent_check(m, F, H, W) != 0) return -1;
    if (kern_stream_backend(s) != m->b)
        return reel_fail(REEL_E_INVALID, "vae_decode: the stream is not on the model's backend");
    dec_t d = { .m = m, .s = s, .dev = kern_backend_device(m->b) };
    int64_t max_k, z = c->z_dim, Fo = vae_video_frames(F), OH = 8 * H, OW = 8 * W;
    plan_sizes(c, F, H, W, &d.max_elems, &max_k);
    size_t cols_bytes = kern_backend_kind(m->b) == KERN_BACKEND_CUDA ? VAE_COLS_BYTES_CUDA : VAE_COLS_BYTES_CPU;
    int64_t rows = (int64_t)(cols_bytes / sizeof(float)) / max_k;
    if (rows < 1) rows = 1;
    d.cols_elems = rows * max_k;
    float *in = malloc((size_t)(H * W * z) * sizeof *in), *out = malloc((size_t)(4 * OH * OW * 3) * sizeof *out);
    int rc = -1;
    if (!in || !out) { reel_fail(REEL_E_NOMEM, "vae_decode: out of memory"); goto err; }
    for (int i = 0; i < 3; i++)
        if (!(d.buf[i] = kern_alloc(m->b, (size_t)d.max_elems * sizeof(float)))) goto err;
    int64_t cs[2] = { rows, max_k };
    void *cp = kern_alloc(m->b, (size_t)d.cols_elems * sizeof(float));
    if (!cp) goto err;
    d.cols = kern_tensor_make(cp, KERN_F32, d.dev, 2, cs);
    for (int64_t f = 0; f < F; f++) {
        /* z / (1/std) + mean, as WanVAE's scale = [mean, 1/std] is applied */
        for (int64_t ch = 0; ch < z; ch++) {
            float inv = 1.0f / m->std[ch];
            const float *src = latent + (ch * F + f) * H * W;
            for (int64_t p = 0; p < H * W; p++) in[p * z + ch] = src[p] / inv + m->mean[ch];
        }
        kern_tensor_t x = act(&d, d.buf[0], 1, H, W, z), y = act(&d, d.buf[1], 1, H, W, z);
        TRY(kern_copy_h2d(s, d.buf[0], in, (size_t)(H * W * z) * sizeof(float)));
        TRY(conv_run(&d, &m->conv2, &x, &y));
        x = act(&d, d.buf[0], 1, H, W, m->conv1.cout);
        TRY(conv_run(&d, &m->conv1, &y, &x));
        TRY(rblock_run(&d, &m->mid0, 0, &x));
        TRY(attn_run(&d, &m->attn, 0, &x));
        TRY(rblock_run(&d, &m->mid2, 0, &x));
        for (int i = 0; i < 4; i++) {
            for (int j = 0; j < 3; j++) TRY(rblock_run(&d, &m->up[i][j], 0, &x));
            if (i < 3) TRY(resample_run(&d, &m->rs[i], f == 0, 0, &x));
        }
        int64_t T = x.shape[0];
        kern_tensor_t a = act(&d, d.buf[1], T, OH, OW, x.shape[3]), o = act(&d, d.buf[2], T, OH, OW, 3);
        TRY(norm_silu(&d, &m->head_n, &x, &a, true));
        TRY(conv_run(&d, &m->head_c, &a, &o));
        TRY(kern_copy_d2h(s, out, d.buf[2], (size_t)(T * OH * OW * 3) * sizeof(float)));
        TRY(kern_stream_sync(s));
        if (!kern_all_finite(out, (size_t)(T * OH * OW * 3), KERN_F32)) { /* never a video of NaN */
            reel_fail(REEL_E_INVALID,
                      "vae_decode: latent frame %" PRId64 " " VAE_E_NONFINITE ": the latent's values are too large "
                      "for the VAE (or its weights overflow)",
                      f);
            goto err;
        }
        /* [T, 8H, 8W, 3] channels-last to [3, F', 8H, 8W], clamped */
        int64_t f0 = f ? 1 + 4 * (f - 1) : 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t ch = 0; ch < 3; ch++) {
                float *dst = video + (ch * Fo + f0 + t) * OH * OW;
                const float *srcp = out + t * OH * OW * 3 + ch;
                for (int64_t p = 0; p < OH * OW; p++) {
                    float v = srcp[p * 3];
                    dst[p] = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
                }
            }
        if (progress && progress(user, f + 1, F) != 0) {
            reel_fail(REEL_E_STATE, VAE_E_STOPPED " after %lld of %lld latent frames", (long long)(f + 1),
                      (long long)F);
            goto err;
        }
    }
    rc = 0;
err:
    if (rc != 0) (void)kern_stream_sync(s);
    dec_release(&d);
    free(in);
    free(out);
    return rc;
}
