/* test_wan_ckpt.c -- Wan2.1 checkpoints as published (model/wan_ckpt.h):
 * a release-layout folder, a sharded index, a diffusers folder and a
 * pipeline root, written here from Reel's own weights (F32, BF16, F16),
 * load as the native file does, tensor by tensor and to the bit in a
 * forward pass; every bad checkpoint gets a message naming what is wrong
 * and loads nothing.
 *
 * The layouts are written by this file's own code: names renamed by the
 * diffusers script's table applied its way (str.replace in order), not by
 * wan_ckpt's, so a mistake in one is not repeated in the other. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "kernels/philox.h"
#include "base/sha256.h"
#include "model/tinydit.h"
#include "model/wan_ckpt.h"
#include "tests/support.h"

static char dir[64];
static char native[128];   /* tiny, text_len 512, F32, Reel metadata */
static tdit_config_t tiny;

static const char *at(const char *rel) {
    static char p[4][PATH_MAX];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, rel);
    return p[k];
}

/* ---- writing checkpoints the way they are published ----------------------------- */

/* diffusers' convert_wan_to_diffusers.py TRANSFORMER_KEYS_RENAME_DICT, applied
 * as that script applies it: every pair in order, str.replace. */
static void diffusers_of(const char *wan, char *out, size_t len) {
    static const char *const pairs[][2] = {
        { "time_embedding.0", "condition_embedder.time_embedder.linear_1" },
        { "time_embedding.2", "condition_embedder.time_embedder.linear_2" },
        { "text_embedding.0", "condition_embedder.text_embedder.linear_1" },
        { "text_embedding.2", "condition_embedder.text_embedder.linear_2" },
        { "time_projection.1", "condition_embedder.time_proj" },
        { "head.modulation", "scale_shift_table" }, { "head.head", "proj_out" },
        { "modulation", "scale_shift_table" }, { "ffn.0", "ffn.net.0.proj" }, { "ffn.2", "ffn.net.2" },
        { "norm2", "norm__placeholder" }, { "norm3", "norm2" }, { "norm__placeholder", "norm3" },
        { "self_attn.q", "attn1.to_q" }, { "self_attn.k", "attn1.to_k" }, { "self_attn.v", "attn1.to_v" },
        { "self_attn.o", "attn1.to_out.0" }, { "self_attn.norm_q", "attn1.norm_q" },
        { "self_attn.norm_k", "attn1.norm_k" }, { "cross_attn.q", "attn2.to_q" }, { "cross_attn.k", "attn2.to_k" },
        { "cross_attn.v", "attn2.to_v" }, { "cross_attn.o", "attn2.to_out.0" },
        { "cross_attn.norm_q", "attn2.norm_q" }, { "cross_attn.norm_k", "attn2.norm_k" },
    };
    char a[256], b[256];
    snprintf(a, sizeof a, "%s", wan);
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const char *from = pairs[i][0], *to = pairs[i][1];
        b[0] = '\0';
        for (const char *p = a;;) {
            const char *hit = strstr(p, from);
            if (!hit) {
                strcat(b, p);
                break;
            }
            strncat(b, p, (size_t)(hit - p));
            strcat(b, to);
            p = hit + strlen(from);
        }
        snprintf(a, sizeof a, "%s", b);
    }
    snprintf(out, len, "%s", a);
}

typedef struct {
    bool diffusers;          /* diffusers' names and config.json */
    kern_dtype_t dt;
    int shards;              /* 0: one file, diffusion_pytorch_model.safetensors */
    const char *drop;        /* a (Wan) tensor left out */
    const char *dup;         /* a (Wan) tensor written into shards 0 and 1 too */
    const char *extra;       /* a tensor added, [4] */
    const char *reshape;     /* a (Wan) tensor written flat */
    const char *config;      /* config.json text; NULL: the layout's own; "-": none */
    const char *shard_name;  /* what the index calls shard 0; NULL: its own name */
} lay_t;

static const char *wan_json =
    "{\"_class_name\":\"WanModel\",\"_diffusers_version\":\"0.30.0\",\"dim\":64,\"eps\":1e-06,\"ffn_dim\":128,"
    "\"freq_dim\":256,\"in_dim\":4,\"model_type\":\"t2v\",\"num_heads\":4,\"num_layers\":2,\"out_dim\":4,"
    "\"text_dim\":32,\"text_len\":512}";
static const char *diff_json =
    "{\"_class_name\":\"WanTransformer3DModel\",\"_diffusers_version\":\"0.33.0\",\"added_kv_proj_dim\":null,"
    "\"attention_head_dim\":16,\"cross_attn_norm\":true,\"eps\":1e-06,\"ffn_dim\":128,\"freq_dim\":256,"
    "\"image_dim\":null,\"in_channels\":4,\"num_attention_heads\":4,\"num_layers\":2,\"out_channels\":4,"
    "\"patch_size\":[1,2,2],\"qk_norm\":\"rms_norm_across_heads\",\"rope_max_seq_len\":1024,\"text_dim\":32}";

/* text with the first `from` replaced by `to`, into out. */
static const char *subst(char *out, size_t len, const char *text, const char *from, const char *to) {
    const char *hit = strstr(text, from);
    ck_assert_ptr_nonnull(hit);
    snprintf(out, len, "%.*s%s%s", (int)(hit - text), text, to, hit + strlen(from));
    return out;
}

static void put_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Adds tensor t of the native file to w as `name` in dtype dt. */
static void add_as(st_writer_t *w, const st_file_t *src, const st_tensor_t *t, const char *name, kern_dtype_t dt,
                   bool flat) {
    size_t n = t->nbytes / 4;
    float *v = malloc(n * sizeof *v);
    uint16_t *h = malloc(n * sizeof *h);
    ck_assert_int_eq(st_read_f32(src, t->name, -1, NULL, v), 0);
    for (size_t i = 0; i < n; i++) h[i] = dt == KERN_BF16 ? kern_f32_to_bf16(v[i]) : kern_f32_to_f16(v[i]);
    int64_t one[1] = { (int64_t)n };
    ck_assert_msg(st_writer_add(w, name, dt, flat ? 1 : t->ndim, flat ? one : t->shape,
                                dt == KERN_F32 ? (const void *)v : (const void *)h) == 0, "%s", reel_err_text());
    free(v);
    free(h);
}

/* Writes the native weights as layout l into folder (made). */
static void write_layout(const char *folder, const lay_t *l) {
    ck_assert_int_eq(mkdir(folder, 0700), 0);
    st_file_t *src = st_open(native);
    ck_assert_ptr_nonnull(src);
    int nf = l->shards ? l->shards : 1;
    st_writer_t *w[8];
    char fname[8][96], idx[16384] = "{\"metadata\":{\"total_size\":0},\"weight_map\":{";
    for (int s = 0; s < nf; s++) {
        w[s] = st_writer_new();
        if (l->shards) snprintf(fname[s], sizeof fname[s], "diffusion_pytorch_model-%05d-of-%05d.safetensors", s + 1, nf);
        else snprintf(fname[s], sizeof fname[s], "diffusion_pytorch_model.safetensors");
    }
    size_t n = st_count(src), per = (n + (size_t)nf - 1) / (size_t)nf;
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        const st_tensor_t *t = st_at(src, i);
        if (l->drop && !strcmp(t->name, l->drop)) continue;
        char name[256];
        if (l->diffusers) diffusers_of(t->name, name, sizeof name);
        else snprintf(name, sizeof name, "%s", t->name);
        int s = (int)(i / per);
        bool flat = l->reshape && !strcmp(t->name, l->reshape);
        add_as(w[s], src, t, name, l->dt, flat);
        if (l->dup && !strcmp(t->name, l->dup)) add_as(w[s == 0 ? 1 : 0], src, t, name, l->dt, false);
        const char *fn = s == 0 && l->shard_name ? l->shard_name : fname[s];
        snprintf(idx + strlen(idx), sizeof idx - strlen(idx), "%s\"%s\":\"%s\"", first ? "" : ",", name, fn);
        first = false;
    }
    if (l->extra) {
        float z[4] = { 0 };
        ck_assert_int_eq(st_writer_add_f32(w[nf - 1], l->extra, 1, (const int64_t[]){ 4 }, z), 0);
        snprintf(idx + strlen(idx), sizeof idx - strlen(idx), ",\"%s\":\"%s\"", l->extra, fname[nf - 1]);
    }
    strcat(idx, "}}");
    char p[PATH_MAX];
    for (int s = 0; s < nf; s++) {
        snprintf(p, sizeof p, "%s/%s", folder, fname[s]);
        TS_OK(st_writer_save(w[s], p));
        st_writer_destroy(&w[s]);
    }
    if (l->shards) {
        snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", folder);
        put_text(p, idx);
    }
    const char *cfg = l->config ? l->config : l->diffusers ? diff_json : wan_json;
    if (strcmp(cfg, "-")) {
        snprintf(p, sizeof p, "%s/config.json", folder);
        put_text(p, cfg);
    }
    st_close(&src);
}

/* A native Reel file holding the values of dtype dt (what a BF16 or F16
 * checkpoint must equal). */
static void write_native_as(const char *path, kern_dtype_t dt) {
    st_file_t *src = st_open(native);
    st_writer_t *w = st_writer_new();
    for (size_t i = 0; i < st_count(src); i++) add_as(w, src, st_at(src, i), st_at(src, i)->name, dt, false);
    const char *keys[] = { "config", "dim", "heads", "layers", "ffn_dim", "in_channels", "text_dim", "freq_dim",
                           "text_len" };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) st_writer_meta(w, keys[i], st_meta(src, keys[i]));
    ck_assert_int_eq(st_writer_save(w, path), 0);
    st_writer_destroy(&w);
    st_close(&src);
}

static void setup(void) {
    ts_mkdtemp(dir, sizeof dir, "test-wan");
    ck_assert_int_eq(tdit_config_builtin("tiny", &tiny), 0);
    tiny.text_len = 512;
    snprintf(native, sizeof native, "%s/native.safetensors", dir);
    TS_OK(tdit_weights_init(&tiny, 11, native));
    write_native_as(at("native-bf16.safetensors"), KERN_BF16);
    write_native_as(at("native-f16.safetensors"), KERN_F16);
    write_layout(at("original"), &(lay_t){ .dt = KERN_F32 });
    write_layout(at("original-bf16"), &(lay_t){ .dt = KERN_BF16 });
    write_layout(at("sharded"), &(lay_t){ .dt = KERN_BF16, .shards = 3 });
    write_layout(at("sharded-f32"), &(lay_t){ .dt = KERN_F32, .shards = 2 });
    write_layout(at("diffusers"), &(lay_t){ .diffusers = true, .dt = KERN_F16 });
    write_layout(at("diffusers-sharded"), &(lay_t){ .diffusers = true, .dt = KERN_F32, .shards = 3 });
    ck_assert_int_eq(mkdir(at("pipeline"), 0700), 0);
    put_text(at("pipeline/model_index.json"), "{\"_class_name\":\"WanPipeline\",\"transformer\":[\"diffusers\","
                                              "\"WanTransformer3DModel\"],\"vae\":[\"diffusers\",\"AutoencoderKLWan\"]}");
    write_layout(at("pipeline/transformer"), &(lay_t){ .diffusers = true, .dt = KERN_F32 });
    ck_assert_int_eq(mkdir(at("pipeline/vae"), 0700), 0);
    put_text(at("pipeline/vae/config.json"), "{\"_class_name\":\"AutoencoderKLWan\"}");
}

static void teardown(void) {
    if (ts_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
}

/* ---- checks ----------------------------------------------------------------------- */

/* Every tensor of want is in got, same shape, same values (widened); got
 * holds no other; its metadata is tiny's config with text_len 512. */
static void same_weights(const st_file_t *got, const char *want_path) {
    st_file_t *want = st_open(want_path);
    ck_assert_ptr_nonnull(want);
    ck_assert_uint_eq(st_count(got), st_count(want));
    for (size_t i = 0; i < st_count(want); i++) {
        const st_tensor_t *w = st_at(want, i), *g = st_find(got, w->name);
        ck_assert_msg(g != NULL, "%s missing", w->name);
        ck_assert_int_eq(g->ndim, w->ndim);
        for (int d = 0; d < w->ndim; d++) ck_assert_int_eq(g->shape[d], w->shape[d]);
        ck_assert_int_eq(g->dtype, w->dtype);
        size_t n = w->nbytes / kern_dtype_size(w->dtype);
        float *a = malloc(n * 4), *b = malloc(n * 4);
        ck_assert_int_eq(st_read_f32(got, w->name, -1, NULL, a), 0);
        ck_assert_int_eq(st_read_f32(want, w->name, -1, NULL, b), 0);
        ck_assert_msg(!memcmp(a, b, n * 4), "%s differs", w->name);
        free(a);
        free(b);
    }
    tdit_config_t c;
    TS_OK(tdit_config_from_meta(got, &c));
    ck_assert(tdit_config_same_network(&c, &tiny));
    ck_assert_str_eq(c.name, "tiny");
    ck_assert_int_eq(c.text_len, 512);
    st_close(&want);
}

static wan_ckpt_t *open_ok(const char *path, const wan_opts_t *o) {
    wan_ckpt_t *c = wan_ckpt_open(path, o);
    ck_assert_msg(c != NULL, "%s: %s", path, reel_err_text());
    return c;
}

START_TEST(test_every_published_layout_loads_tensor_for_tensor_as_the_native_file) {
    static const struct { const char *path, *same_as, *layout; kern_dtype_t dt; size_t files; } cases[] = {
        { "original", "native.safetensors", "wan-original", KERN_F32, 1 },
        { "original/diffusion_pytorch_model.safetensors", "native.safetensors", "wan-original", KERN_F32, 1 },
        { "original-bf16", "native-bf16.safetensors", "wan-original", KERN_BF16, 1 },
        { "sharded", "native-bf16.safetensors", "wan-sharded", KERN_BF16, 3 },
        { "sharded/diffusion_pytorch_model.safetensors.index.json", "native-bf16.safetensors", "wan-sharded",
          KERN_BF16, 3 },
        { "sharded-f32/", "native.safetensors", "wan-sharded", KERN_F32, 2 },
        { "diffusers", "native-f16.safetensors", "diffusers", KERN_F16, 1 },
        { "diffusers-sharded", "native.safetensors", "diffusers", KERN_F32, 3 },
        { "pipeline", "native.safetensors", "diffusers-pipeline", KERN_F32, 1 },
        { "native.safetensors", "native.safetensors", "reel", KERN_F32, 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wan_ckpt_t *c = open_ok(at(cases[i].path), NULL);
        ck_assert_str_eq(wan_layout_name(wan_ckpt_layout(c)), cases[i].layout);
        ck_assert_uint_eq(wan_ckpt_n_files(c), cases[i].files);
        same_weights(wan_ckpt_file(c), at(cases[i].same_as));
        wan_summary_t s;
        wan_ckpt_summary(c, &s);
        ck_assert_uint_eq(s.tensors, st_count(wan_ckpt_file(c)));
        ck_assert_uint_eq(s.dtype_count[cases[i].dt], s.tensors);
        ck_assert_int_eq(s.parameters, tdit_config_params(&tiny));
        ck_assert_int_eq(wan_ckpt_config(c)->text_len, 512);
        wan_ckpt_destroy(&c);
    }
    wan_ckpt_destroy(NULL);
}
END_TEST

/* Two steps with CFG on the CPU, eager; the latent after them. */
static float *two_steps(const char *weights) {
    kern_backend_t *b = kern_backend_cpu_new();
    kern_stream_t *s = kern_stream_new(b);
    tdit_model_t *m = tdit_model_load_path(b, weights, KERN_F32);
    ck_assert_msg(m != NULL, "%s: %s", weights, reel_err_text());
    ck_assert_int_eq(tdit_model_config(m)->text_len, 512);
    tdit_shape_t sh = { .frames = 2, .height = 8, .width = 8, .text_len = 5, .cfg = true, .batch = 1 };
    tdit_ws_t *ws = tdit_ws_new(m, s, &sh);
    TS_NEW(ws);
    size_t nl = 4 * 2 * 8 * 8, nc = 5 * 32;
    float *lat = malloc(nl * 4), ctx[5 * 32], unc[5 * 32];
    for (size_t j = 0; j < nl; j++) lat[j] = kern_philox_normal(1, 0, j);
    for (size_t j = 0; j < nc; j++) {
        ctx[j] = kern_philox_normal(2, 0, j);
        unc[j] = kern_philox_normal(3, 0, j);
    }
    double sig[3];
    tdit_schedule(2, 3.0, sig);
    ck_assert_int_eq(tdit_ws_bind_latent(ws, s, lat, nl), 0);
    ck_assert_int_eq(tdit_ws_bind_context(ws, s, ctx, nc, false), 0);
    ck_assert_int_eq(tdit_ws_bind_context(ws, s, unc, nc, true), 0);
    for (int i = 0; i < 2; i++) {
        const float sv[3] = { (float)sig[i], (float)sig[i + 1], (float)sig[1] };
        ck_assert_int_eq(tdit_ws_bind_step(ws, s, sv, 4.0f), 0);
        TS_OK(tdit_step(m, ws, s));
    }
    ck_assert_int_eq(tdit_ws_read_latent(ws, s, lat, nl), 0);
    ck_assert_int_eq(kern_stream_sync(s), 0);
    tdit_ws_destroy(&ws);
    tdit_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
    return lat;
}

START_TEST(test_a_release_folder_a_shard_set_and_a_pipeline_step_bitwise_as_the_native_file) {
    const size_t nl = 4 * 2 * 8 * 8;
    float *ref = two_steps(native), *ref16 = two_steps(at("native-bf16.safetensors"));
    const char *f32[] = { "original", "sharded-f32", "diffusers-sharded", "pipeline" };
    for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++) {
        float *got = two_steps(at(f32[i]));
        ck_assert_msg(!memcmp(got, ref, nl * 4), "%s: not bitwise the native result", f32[i]);
        free(got);
    }
    float *got = two_steps(at("sharded")); /* BF16 shards: as the native file of those BF16 values */
    ck_assert_msg(!memcmp(got, ref16, nl * 4), "sharded BF16: not bitwise the native BF16 file's result");
    ck_assert_msg(memcmp(got, ref, nl * 4), "BF16 rounding changed nothing: the test proves nothing");
    free(got);
    free(ref);
    free(ref16);
}
END_TEST

START_TEST(test_the_identity_is_the_file_bytes_or_the_index_then_each_shard_digest) {
    char want[65], part[3][65];
    wan_ckpt_t *c = open_ok(at("original"), &(wan_opts_t){ .no_data = true });
    ck_assert_ptr_null(wan_ckpt_file(c)); /* no_data: hashed, not kept */
    ck_assert_int_eq(reel_sha256_file(at("original/diffusion_pytorch_model.safetensors"), want), 0);
    ck_assert_str_eq(wan_ckpt_identity(c), want);
    ck_assert_ptr_null(wan_ckpt_index(c));
    ck_assert_str_eq(wan_ckpt_file_at(c, 0)->name, "diffusion_pytorch_model.safetensors");
    wan_ckpt_destroy(&c);

    /* index bytes ++ sha256(shard 1) ++ sha256(shard 2) ++ sha256(shard 3), raw digests in name order */
    c = open_ok(at("sharded"), NULL);
    FILE *f = fopen(at("sharded/diffusion_pytorch_model.safetensors.index.json"), "rb");
    unsigned char buf[32768];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    for (int s = 0; s < 3; s++) {
        char p[96];
        snprintf(p, sizeof p, "sharded/diffusion_pytorch_model-%05d-of-00003.safetensors", s + 1);
        ck_assert_int_eq(reel_sha256_file(at(p), part[s]), 0);
        ck_assert_str_eq(wan_ckpt_file_at(c, (size_t)s)->sha256, part[s]);
        for (int b = 0; b < 32; b++) {
            unsigned v;
            sscanf(part[s] + 2 * b, "%2x", &v);
            buf[n++] = (unsigned char)v;
        }
    }
    reel_sha256_buf(buf, n, want);
    ck_assert_str_eq(wan_ckpt_identity(c), want);
    ck_assert_ptr_nonnull(wan_ckpt_index(c));
    wan_ckpt_destroy(&c);
    /* the pipeline's file is named from the root */
    c = open_ok(at("pipeline"), &(wan_opts_t){ .no_data = true });
    ck_assert_str_eq(wan_ckpt_file_at(c, 0)->name, "transformer/diffusion_pytorch_model.safetensors");
    wan_ckpt_destroy(&c);
}
END_TEST

/* Opens path, which must fail with code with every substring in the message. */
#define expect_refused(path, o, code, ...)                                                           \
    do {                                                                                             \
        reel_err_clear();                                                                            \
        wan_ckpt_t *c_ = wan_ckpt_open((path), (o));                                                 \
        ck_assert_msg(c_ == NULL, "%s loaded", (path));                                              \
        ck_assert_msg(reel_err_code() == (code), "%s: code %s, wanted %s: %s", (path),               \
                      reel_code_name(reel_err_code()), reel_code_name(code), reel_err_text());      \
        const char *subs_[] = { __VA_ARGS__ };                                                       \
        for (size_t i_ = 0; i_ < sizeof subs_ / sizeof subs_[0]; i_++)                               \
            ck_assert_msg(strstr(reel_err_text(), subs_[i_]), "'%s' lacks '%s'", reel_err_text(), subs_[i_]); \
    } while (0)

START_TEST(test_incomplete_duplicated_and_extra_tensors_are_refused_naming_tensor_and_shard) {
    write_layout(at("missing"), &(lay_t){ .dt = KERN_F32, .shards = 2, .drop = "blocks.1.ffn.2.bias" });
    expect_refused(at("missing"), NULL, REEL_E_UNSUPPORTED, "missing tensor blocks.1.ffn.2.bias");
    write_layout(at("missing-d"), &(lay_t){ .diffusers = true, .dt = KERN_F32, .drop = "blocks.0.norm3.weight" });
    expect_refused(at("missing-d"), NULL, REEL_E_UNSUPPORTED, "missing tensor blocks.0.norm2.weight"); /* its diffusers name */
    write_layout(at("dup"), &(lay_t){ .dt = KERN_F32, .shards = 3, .dup = "blocks.0.self_attn.q.weight" });
    expect_refused(at("dup"), NULL, REEL_E_UNSUPPORTED, "blocks.0.self_attn.q.weight", "two files",
                   "diffusion_pytorch_model-00001-of-00003.safetensors",
                   "diffusion_pytorch_model-00002-of-00003.safetensors");
    write_layout(at("extra"), &(lay_t){ .dt = KERN_F32, .shards = 2, .extra = "blocks.0.lora_A.weight" });
    expect_refused(at("extra"), NULL, REEL_E_UNSUPPORTED, "unknown tensor 'blocks.0.lora_A.weight'",
                   "diffusion_pytorch_model-00002-of-00002.safetensors");
    write_layout(at("shape"), &(lay_t){ .dt = KERN_BF16, .reshape = "head.modulation" });
    expect_refused(at("shape"), NULL, REEL_E_UNSUPPORTED, "head.modulation is BF16 [128]", "[1,2,64]");
    write_layout(at("mixed"), &(lay_t){ .dt = KERN_F32, .config = diff_json, .extra = "proj_out.weight" });
    expect_refused(at("mixed"), NULL, REEL_E_UNSUPPORTED, "proj_out.weight");
}
END_TEST

START_TEST(test_a_missing_shard_or_an_index_reaching_outside_its_folder_is_refused) {
    write_layout(at("noshard"), &(lay_t){ .dt = KERN_F32, .shards = 3 });
    ck_assert_int_eq(unlink(at("noshard/diffusion_pytorch_model-00002-of-00003.safetensors")), 0);
    expect_refused(at("noshard"), NULL, REEL_E_NOT_FOUND, "diffusion_pytorch_model-00002-of-00003.safetensors",
                   "No such file");
    write_layout(at("escape"), &(lay_t){ .dt = KERN_F32, .shards = 2, .shard_name = "../native.safetensors" });
    expect_refused(at("escape"), NULL, REEL_E_INVALID, "'../native.safetensors'", "not a file in the index's folder");
    write_layout(at("escape2"), &(lay_t){ .dt = KERN_F32, .shards = 2, .shard_name = "sub/x.safetensors" });
    expect_refused(at("escape2"), NULL, REEL_E_INVALID, "'sub/x.safetensors'");
    /* the index names a file that holds other tensors than it says */
    write_layout(at("liar"), &(lay_t){ .dt = KERN_F32, .shards = 2,
                                       .shard_name = "diffusion_pytorch_model-00002-of-00002.safetensors" });
    expect_refused(at("liar"), NULL, REEL_E_UNSUPPORTED, "which does not hold it");
    /* a tensor of shard 2 the index puts in shard 1 */
    write_layout(at("moved"), &(lay_t){ .dt = KERN_F32, .shards = 2 });
    FILE *f = fopen(at("moved/diffusion_pytorch_model.safetensors.index.json"), "r");
    char idx[16384], moved[16384];
    idx[fread(idx, 1, sizeof idx - 1, f)] = '\0';
    fclose(f);
    put_text(at("moved/diffusion_pytorch_model.safetensors.index.json"),
             subst(moved, sizeof moved, idx, "\"head.head.bias\":\"diffusion_pytorch_model-00002",
                   "\"head.head.bias\":\"diffusion_pytorch_model-00001"));
    expect_refused(at("moved"), NULL, REEL_E_UNSUPPORTED, "head.head.bias", "00002-of-00002.safetensors",
                   "is here, but the index puts it in diffusion_pytorch_model-00001-of-00002.safetensors");
}
END_TEST

START_TEST(test_foreign_wan_models_are_refused_naming_what_was_found) {
    char cfg[1024];
    subst(cfg, sizeof cfg, wan_json, "\"t2v\"", "\"i2v\"");
    write_layout(at("i2v"), &(lay_t){ .dt = KERN_F32, .config = cfg });
    expect_refused(at("i2v"), NULL, REEL_E_UNSUPPORTED, "model_type 'i2v'", "image-to-video");
    subst(cfg, sizeof cfg, wan_json, "\"t2v\"", "\"flf2v\"");
    write_layout(at("flf2v"), &(lay_t){ .dt = KERN_F32, .config = cfg });
    expect_refused(at("flf2v"), NULL, REEL_E_UNSUPPORTED, "flf2v");
    write_layout(at("inout"), &(lay_t){ .dt = KERN_F32, .config = "{\"dim\":64,\"num_heads\":4,\"num_layers\":2,"
                                        "\"ffn_dim\":128,\"in_dim\":36,\"out_dim\":4,\"text_dim\":32}" });
    expect_refused(at("inout"), NULL, REEL_E_UNSUPPORTED, "in_dim 36 != out_dim 4");
    write_layout(at("img"), &(lay_t){ .dt = KERN_F32, .extra = "img_emb.proj.1.weight" });
    expect_refused(at("img"), NULL, REEL_E_UNSUPPORTED, "img_emb.proj.1.weight", "image embedding");
    write_layout(at("kimg"), &(lay_t){ .dt = KERN_F32, .extra = "blocks.0.cross_attn.k_img.weight" });
    expect_refused(at("kimg"), NULL, REEL_E_UNSUPPORTED, "k_img", "image-to-video");
    write_layout(at("dimg"), &(lay_t){ .diffusers = true, .dt = KERN_F32, .extra = "blocks.1.attn2.add_k_proj.weight" });
    expect_refused(at("dimg"), NULL, REEL_E_UNSUPPORTED, "add_k_proj");
    subst(cfg, sizeof cfg, diff_json, "\"image_dim\":null", "\"image_dim\":1280");
    write_layout(at("dimgcfg"), &(lay_t){ .diffusers = true, .dt = KERN_F32, .config = cfg });
    expect_refused(at("dimgcfg"), NULL, REEL_E_UNSUPPORTED, "image_dim");
    write_layout(at("vace"), &(lay_t){ .dt = KERN_F32, .config = "{\"_class_name\":\"VaceWanModel\",\"dim\":64}" });
    expect_refused(at("vace"), NULL, REEL_E_UNSUPPORTED, "class 'VaceWanModel'");
    snprintf(cfg, sizeof cfg, "%.*s,\"qk_norm\":false}", (int)(strlen(wan_json) - 1), wan_json);
    write_layout(at("noqk"), &(lay_t){ .dt = KERN_F32, .config = cfg });
    expect_refused(at("noqk"), NULL, REEL_E_UNSUPPORTED, "qk_norm");
    subst(cfg, sizeof cfg, wan_json, "1e-06", "1e-05");
    write_layout(at("eps"), &(lay_t){ .dt = KERN_F32, .config = cfg });
    expect_refused(at("eps"), NULL, REEL_E_UNSUPPORTED, "eps");
    ck_assert_int_eq(mkdir(at("pipe-i2v"), 0700), 0);
    put_text(at("pipe-i2v/model_index.json"), "{\"_class_name\":\"WanImageToVideoPipeline\"}");
    write_layout(at("pipe-i2v/transformer"), &(lay_t){ .diffusers = true, .dt = KERN_F32 });
    expect_refused(at("pipe-i2v"), NULL, REEL_E_UNSUPPORTED, "WanImageToVideoPipeline");
}
END_TEST

START_TEST(test_a_missing_or_malformed_config_json_is_refused) {
    write_layout(at("nocfg"), &(lay_t){ .dt = KERN_F32, .config = "-" });
    expect_refused(at("nocfg"), NULL, REEL_E_INVALID, "no Reel metadata and no config.json");
    write_layout(at("badcfg"), &(lay_t){ .dt = KERN_F32, .config = "{\"dim\": 64," });
    expect_refused(at("badcfg"), NULL, REEL_E_INVALID, "config.json", "not valid JSON");
    write_layout(at("cfgtype"), &(lay_t){ .dt = KERN_F32, .config = "{\"dim\":\"64\"}" });
    expect_refused(at("cfgtype"), NULL, REEL_E_INVALID, "'dim' is not an integer");
    write_layout(at("cfgarr"), &(lay_t){ .dt = KERN_F32, .config = "[1,2]" });
    expect_refused(at("cfgarr"), NULL, REEL_E_INVALID, "not a JSON object");
    /* another size: refused against the model expected, loads on its own as a custom config */
    char cfg[1024];
    subst(cfg, sizeof cfg, wan_json, "\"ffn_dim\":128", "\"ffn_dim\":256");
    write_layout(at("other"), &(lay_t){ .dt = KERN_F32, .config = cfg });
    expect_refused(at("other"), NULL, REEL_E_UNSUPPORTED, "the config needs");
    expect_refused(at("original"), (&(wan_opts_t){ .expect = &(tdit_config_t){ "small", 384, 6, 12, 1024, 16, 256, 256, 0 } }),
                   REEL_E_UNSUPPORTED, "does not match the resident small");
    /* a folder of nothing, of two checkpoints, and a FIFO */
    ck_assert_int_eq(mkdir(at("empty"), 0700), 0);
    expect_refused(at("empty"), NULL, REEL_E_NOT_FOUND, "no safetensors file or index");
    /* a folder holding only a PyTorch checkpoint says so */
    ck_assert_int_eq(mkdir(at("pthonly"), 0700), 0);
    ts_write_file(ts_join(at("pthonly"), "diffusion_pytorch_model.pth"), "PK\3\4", 4);
    expect_refused(at("pthonly"), NULL, REEL_E_NOT_FOUND, "only PyTorch checkpoints such as diffusion_pytorch_model.pth");
    ck_assert_int_eq(mkdir(at("two"), 0700), 0);
    ck_assert_int_eq(tdit_weights_init(&tiny, 1, at("two/a.safetensors")), 0);
    ck_assert_int_eq(tdit_weights_init(&tiny, 2, at("two/b.safetensors")), 0);
    expect_refused(at("two"), NULL, REEL_E_INVALID, "several checkpoints", "a.safetensors", "b.safetensors");
    ck_assert_int_eq(mkfifo(at("fifo.safetensors"), 0600), 0);
    expect_refused(at("fifo.safetensors"), NULL, REEL_E_INVALID, "not a regular file");
    expect_refused(at("original/config.json"), NULL, REEL_E_INVALID, "no safetensors index");
}
END_TEST

START_TEST(test_without_its_config_a_raw_file_is_judged_against_the_model_expected) {
    wan_opts_t o = { .expect = &tiny };
    write_layout(at("raw"), &(lay_t){ .diffusers = true, .dt = KERN_BF16, .config = "-" });
    wan_ckpt_t *c = open_ok(at("raw/diffusion_pytorch_model.safetensors"), &o);
    ck_assert_str_eq(wan_layout_name(wan_ckpt_layout(c)), "diffusers");
    same_weights(wan_ckpt_file(c), at("native-bf16.safetensors"));
    wan_ckpt_destroy(&c);
    tdit_config_t small;
    ck_assert_int_eq(tdit_config_builtin("small", &small), 0);
    o.expect = &small;
    o.max_data = (uint64_t)tdit_config_params(&small) * 4;
    expect_refused(at("raw"), &o, REEL_E_UNSUPPORTED, "cannot hold the model");
}
END_TEST

START_TEST(test_symlinks_inside_a_checkpoint_are_followed_only_when_allowed) {
    write_layout(at("linked"), &(lay_t){ .dt = KERN_F32, .shards = 2 });
    ck_assert_int_eq(rename(at("linked/diffusion_pytorch_model-00002-of-00002.safetensors"), at("blob")), 0);
    ck_assert_int_eq(symlink(at("blob"), at("linked/diffusion_pytorch_model-00002-of-00002.safetensors")), 0);
    wan_ckpt_t *c = open_ok(at("linked"), NULL); /* a Hugging Face cache snapshot is all symlinks */
    same_weights(wan_ckpt_file(c), native);
    wan_ckpt_destroy(&c);
    expect_refused(at("linked"), (&(wan_opts_t){ .nofollow = true }), REEL_E_INVALID, "symlinks are not followed",
                   "00002-of-00002");
}
END_TEST

START_TEST(test_a_stop_ends_the_read_with_its_own_kind) {
    static atomic_bool stop = true;
    expect_refused(at("sharded"), (&(wan_opts_t){ .stop = &stop }), REEL_E_STATE, "reading stopped");
}
END_TEST

START_TEST(test_an_uploaded_release_file_in_memory_gets_reel_names_without_a_copy) {
    st_file_t *f = st_open(at("diffusers/diffusion_pytorch_model.safetensors"));
    ck_assert_ptr_nonnull(f);
    const void *data = st_at(f, 0)->data;
    const void *lo = data;
    for (size_t i = 0; i < st_count(f); i++)
        if (st_at(f, i)->data < lo) lo = st_at(f, i)->data;
    TS_OK(wan_ckpt_adopt(&f, &tiny));
    same_weights(f, at("native-f16.safetensors"));
    const void *lo2 = st_at(f, 0)->data;
    for (size_t i = 0; i < st_count(f); i++)
        if (st_at(f, i)->data < lo2) lo2 = st_at(f, i)->data;
    ck_assert_ptr_eq(lo, lo2); /* the same buffer */
    st_close(&f);
    /* a Reel file stays as it is */
    f = st_open(native);
    ck_assert_int_eq(wan_ckpt_adopt(&f, &tiny), 0);
    ck_assert_str_eq(st_meta(f, "config"), "tiny");
    st_close(&f);
    /* an image model's file: refused, closed */
    write_layout(at("upimg"), &(lay_t){ .dt = KERN_F32, .extra = "img_emb.proj.0.weight", .config = "-" });
    f = st_open(at("upimg/diffusion_pytorch_model.safetensors"));
    ck_assert_int_eq(wan_ckpt_adopt(&f, &tiny), -1);
    ck_assert_ptr_null(f);
    ck_assert_int_eq(reel_err_code(), REEL_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "img_emb.proj.0.weight"));
    f = st_open(at("original/diffusion_pytorch_model.safetensors"));
    ck_assert_int_eq(wan_ckpt_adopt(&f, NULL), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
}
END_TEST

START_TEST(test_a_packed_checkpoint_is_one_reel_file_that_carries_text_len) {
    TS_OK(wan_ckpt_pack(at("sharded"), at("packed.safetensors")));
    wan_ckpt_t *c = open_ok(at("packed.safetensors"), NULL);
    ck_assert_str_eq(wan_layout_name(wan_ckpt_layout(c)), "reel");
    same_weights(wan_ckpt_file(c), at("native-bf16.safetensors"));
    ck_assert_str_eq(st_meta(wan_ckpt_file(c), "text_len"), "512");
    wan_ckpt_destroy(&c);
    ck_assert_int_eq(wan_ckpt_pack(at("i-do-not-exist"), at("nothing.safetensors")), -1);
    ck_assert_int_eq(access(at("nothing.safetensors"), F_OK), -1);
}
END_TEST

START_TEST(test_what_a_sync_announces_by_path_and_by_upload) {
    wan_sync_source_t s;
    char hex[65];
    /* by path: the folder itself, its identity */
    ck_assert_int_eq(wan_sync_source(at("sharded"), false, &s), 0);
    wan_ckpt_t *c = open_ok(at("sharded"), &(wan_opts_t){ .no_data = true });
    ck_assert_str_eq(s.sha256, wan_ckpt_identity(c));
    wan_ckpt_destroy(&c);
    ck_assert_ptr_nonnull(strstr(s.path, "/sharded"));
    ck_assert_str_eq(s.tmpdir, "");
    wan_sync_source_done(&s);
    /* by upload, one file: that file as it is */
    ck_assert_int_eq(wan_sync_source(at("pipeline"), true, &s), 0);
    ck_assert_ptr_nonnull(strstr(s.path, "/pipeline/transformer/diffusion_pytorch_model.safetensors"));
    ck_assert_int_eq(reel_sha256_file(s.path, hex), 0);
    ck_assert_str_eq(s.sha256, hex);
    wan_sync_source_done(&s);
    /* by upload, shards: packed into one Reel file, removed after */
    ck_assert_int_eq(wan_sync_source(at("sharded"), true, &s), 0);
    ck_assert_str_ne(s.tmpdir, "");
    ck_assert_int_eq(reel_sha256_file(s.path, hex), 0);
    ck_assert_str_eq(s.sha256, hex);
    char path[PATH_MAX], tmp[PATH_MAX];
    snprintf(path, sizeof path, "%s", s.path);
    snprintf(tmp, sizeof tmp, "%s", s.tmpdir);
    c = open_ok(path, NULL);
    same_weights(wan_ckpt_file(c), at("native-bf16.safetensors"));
    wan_ckpt_destroy(&c);
    wan_sync_source_done(&s);
    ck_assert_int_eq(access(path, F_OK), -1);
    ck_assert_int_eq(access(tmp, F_OK), -1);
    wan_sync_source_done(NULL);
    ck_assert_int_eq(wan_sync_source(at("i2v-nothing"), false, &s), -1);
}
END_TEST

START_TEST(test_configs_carry_text_len_and_know_wan2_1_14b) {
    tdit_config_t c;
    ck_assert_int_eq(tdit_config_builtin("wan2.1-14b", &c), 0);
    ck_assert_int_eq(c.dim, 5120);
    ck_assert_int_eq(c.heads, 40);
    ck_assert_int_eq(c.layers, 40);
    ck_assert_int_eq(c.ffn_dim, 13824);
    ck_assert_int_eq(c.text_len, 0);
    int64_t p = tdit_config_params(&c);
    ck_assert_msg(p > 14000000000LL && p < 14400000000LL, "%lld parameters", (long long)p);
    ck_assert_int_eq(tdit_config_builtin("wan2.1-15b", &c), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "wan2.1-14b"));
    /* text_len in a Reel file's metadata and in a JSON config; absent is 0 */
    st_file_t *f = st_open(native);
    ck_assert_int_eq(tdit_config_from_meta(f, &c), 0);
    ck_assert_int_eq(c.text_len, 512);
    st_close(&f);
    const char *j = "{\"dim\":64,\"heads\":4,\"layers\":2,\"ffn_dim\":128,\"in_channels\":4,\"text_dim\":32,"
                    "\"freq_dim\":256,\"text_len\":77}";
    ck_assert_int_eq(tdit_config_from_json(j, strlen(j), "t", &c), 0);
    ck_assert_int_eq(c.text_len, 77);
    const char *bad = "{\"dim\":64,\"heads\":4,\"layers\":2,\"ffn_dim\":128,\"in_channels\":4,\"text_dim\":32,"
                      "\"freq_dim\":256,\"text_len\":-1}";
    ck_assert_int_eq(tdit_config_from_json(bad, strlen(bad), "t", &c), -1);
    tdit_config_t t;
    ck_assert_int_eq(tdit_config_builtin("tiny", &t), 0);
    ck_assert_int_eq(tdit_weights_init(&t, 3, at("no-text-len.safetensors")), 0);
    f = st_open(at("no-text-len.safetensors"));
    ck_assert_ptr_null(st_meta(f, "text_len"));
    ck_assert_int_eq(tdit_config_from_meta(f, &c), 0);
    ck_assert_int_eq(c.text_len, 0);
    st_close(&f);
    for (int i = 0; tdit_config_builtin_name(i); i++) ck_assert_int_eq(tdit_config_builtin(tdit_config_builtin_name(i), &c), 0);
    ck_assert_ptr_null(tdit_config_builtin_name(-1));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("wan_ckpt");
    TCase *tc = tcase_create("layouts");
    tcase_set_timeout(tc, 120);
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_every_published_layout_loads_tensor_for_tensor_as_the_native_file);
    tcase_add_test(tc, test_a_release_folder_a_shard_set_and_a_pipeline_step_bitwise_as_the_native_file);
    tcase_add_test(tc, test_the_identity_is_the_file_bytes_or_the_index_then_each_shard_digest);
    tcase_add_test(tc, test_incomplete_duplicated_and_extra_tensors_are_refused_naming_tensor_and_shard);
    tcase_add_test(tc, test_a_missing_shard_or_an_index_reaching_outside_its_folder_is_refused);
    tcase_add_test(tc, test_foreign_wan_models_are_refused_naming_what_was_found);
    tcase_add_test(tc, test_a_missing_or_malformed_config_json_is_refused);
    tcase_add_test(tc, test_without_its_config_a_raw_file_is_judged_against_the_model_expected);
    tcase_add_test(tc, test_symlinks_inside_a_checkpoint_are_followed_only_when_allowed);
    tcase_add_test(tc, test_a_stop_ends_the_read_with_its_own_kind);
    tcase_add_test(tc, test_an_uploaded_release_file_in_memory_gets_reel_names_without_a_copy);
    tcase_add_test(tc, test_a_packed_checkpoint_is_one_reel_file_that_carries_text_len);
    tcase_add_test(tc, test_what_a_sync_announces_by_path_and_by_upload);
    tcase_add_test(tc, test_configs_carry_text_len_and_know_wan2_1_14b);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return ts_run(suite());
}
