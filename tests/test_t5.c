/* test_t5.c -- the umT5 text encoder (model/t5.h): configs from shapes and
 * the refusals of bad checkpoints, the bucket function against the table
 * of the published formula, padding that leaves the real rows alone, a
 * one-layer model of width 4 against a computation written out in the
 * test, and ids outside the vocabulary refused.
 *
 * Weight files go to a scratch directory the unchecked fixture removes in
 * the parent, so it goes even when a forked test dies. */
#include "model/t5.h"
#include "model/safetensors.h"
#include "kernels/backend.h"
#include "base/error.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/support.h"

static char tmpdir[64];

static void make_tmpdir(void) { ts_mkdtemp(tmpdir, sizeof tmpdir, "t5"); }
static void remove_tmpdir(void) { ts_rmtree(tmpdir); }

/* Random weights of builtin `name` in dt, opened. */
static st_file_t *random_file(const char *name, kern_dtype_t dt, uint64_t seed) {
    t5_config_t c;
    TS_OK(t5_config_builtin(name, &c));
    const char *p = ts_join(tmpdir, "w.safetensors");
    TS_OK(t5_weights_init(&c, seed, dt, p));
    st_file_t *f;
    TS_NEW(f = st_open(p));
    return f;
}

/* f's tensors, less `drop` (NULL: none), plus `add` of shape (d0, d1) when
 * add is not NULL (replacing a tensor of that name), as a new file. */
static st_file_t *edited(const st_file_t *f, const char *drop, const char *add, int64_t d0, int64_t d1) {
    st_writer_t *w;
    TS_NEW(w = st_writer_new());
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        if ((drop && !strcmp(t->name, drop)) || (add && !strcmp(t->name, add))) continue;
        TS_OK(st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data));
    }
    if (add) {
        float *z = calloc((size_t)(d0 * d1), sizeof *z);
        TS_OK(st_writer_add_f32(w, add, 2, (const int64_t[]){ d0, d1 }, z));
        free(z);
    }
    const char *p = ts_join(tmpdir, "edited.safetensors");
    TS_OK(st_writer_save(w, p));
    st_writer_destroy(&w);
    st_file_t *g;
    TS_NEW(g = st_open(p));
    return g;
}

START_TEST(test_builtin_umt5_xxl_is_wans_config_and_unknown_names_are_refused) {
    t5_config_t c;
    TS_OK(t5_config_builtin("umt5-xxl", &c));
    ck_assert(c.vocab == 256384 && c.dim == 4096 && c.dim_attn == 4096 && c.dim_ffn == 10240 &&
              c.heads == 64 && c.layers == 24 && c.buckets == 32 && c.max_dist == 128);
    TS_OK(t5_config_builtin("t5-tiny", &c));
    ck_assert(c.vocab >= 320);
    TS_OK(t5_config_validate(&c));
    ck_assert_int_eq(t5_config_builtin("t5-huge", &c), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "t5-huge"));
}
END_TEST

START_TEST(test_config_is_inferred_from_the_shapes_of_random_weights) {
    const char *names[] = { "t5-tiny", "t5-small" };
    for (int i = 0; i < 2; i++)
        for (int d = 0; d < 2; d++) {
            st_file_t *f = random_file(names[i], d ? KERN_BF16 : KERN_F32, 3);
            t5_config_t want, got;
            TS_OK(t5_config_builtin(names[i], &want));
            TS_OK(t5_config_from_weights(f, &got));
            ck_assert_msg(!memcmp(&want, &got, sizeof want), "%s: inferred config differs", names[i]);
            st_close(&f);
        }
}
END_TEST

START_TEST(test_missing_tensor_is_refused_naming_it) {
    st_file_t *f = random_file("t5-tiny", KERN_F32, 1);
    st_file_t *g = edited(f, "blocks.1.ffn.fc2.weight", NULL, 0, 0);
    t5_config_t c;
    ck_assert_int_eq(t5_config_from_weights(g, &c), -1);
    ck_assert_msg(strstr(reel_err_text(), "blocks.1.ffn.fc2.weight"), "%s", reel_err_text());
    st_close(&g);
    g = edited(f, "token_embedding.weight", NULL, 0, 0);
    ck_assert_int_eq(t5_config_from_weights(g, &c), -1);
    ck_assert_msg(strstr(reel_err_text(), "token_embedding.weight"), "%s", reel_err_text());
    st_close(&g);
    st_close(&f);
}
END_TEST

START_TEST(test_inconsistent_shape_is_refused_naming_the_tensor) {
    st_file_t *f = random_file("t5-tiny", KERN_F32, 1);
    st_file_t *g = edited(f, NULL, "blocks.1.attn.k.weight", 32, 31);
    t5_config_t c;
    ck_assert_int_eq(t5_config_from_weights(g, &c), -1);
    ck_assert_msg(strstr(reel_err_text(), "blocks.1.attn.k.weight") && strstr(reel_err_text(), "[32,31]"), "%s",
                  reel_err_text());
    st_close(&g);
    /* 5 heads do not divide dim_attn 32 */
    g = edited(f, NULL, "blocks.0.pos_embedding.embedding.weight", 32, 5);
    ck_assert_int_eq(t5_config_from_weights(g, &c), -1);
    ck_assert_msg(strstr(reel_err_text(), "heads"), "%s", reel_err_text());
    st_close(&g);
    kern_backend_t *b;
    TS_NEW(b = kern_backend_cpu_new());
    g = edited(f, NULL, "blocks.0.ffn.fc1.weight", 64, 33);
    ck_assert_ptr_null(t5_model_load(b, g, KERN_F32));
    ck_assert_msg(strstr(reel_err_text(), "fc1"), "%s", reel_err_text());
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    st_close(&g);
    kern_backend_destroy(&b);
    st_close(&f);
}
END_TEST

/* A tensor holding a NaN or an infinity is refused at load, naming the
 * file and the tensor (the encoder would otherwise write a context of NaN
 * and the DiT be blamed for it), and nothing stays allocated. */
START_TEST(test_weights_with_nan_or_inf_are_refused_at_load_naming_file_and_tensor) {
    st_file_t *f0 = random_file("t5-tiny", KERN_F32, 1);
    st_close(&f0);
    const char *in = ts_join(tmpdir, "w.safetensors"), *out = ts_join(tmpdir, "poisoned.safetensors");
    const struct { const char *name; float poison; } cases[] = {
        { "blocks.0.attn.q.weight", NAN }, { "token_embedding.weight", INFINITY },
        { "blocks.1.ffn.fc2.weight", -INFINITY }, { "blocks.1.pos_embedding.embedding.weight", NAN },
        { "norm.weight", NAN },
    };
    kern_backend_t *b;
    TS_NEW(b = kern_backend_cpu_new());
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ts_weights_rewrite(in, out, cases[i].name, -1, NULL, cases[i].poison);
        st_file_t *g;
        TS_NEW(g = st_open(out));
        ck_assert_ptr_null(t5_model_load(b, g, KERN_F32));
        ck_assert_msg(strstr(reel_err_text(), "poisoned.safetensors") && strstr(reel_err_text(), cases[i].name) &&
                      strstr(reel_err_text(), isnan(cases[i].poison) ? "NaN" : "infinity"),
                      "%s: %s", cases[i].name, reel_err_text());
        ck_assert_uint_eq(kern_bytes_in_use(b), 0);
        st_close(&g);
    }
    /* the same file unpoisoned loads */
    st_file_t *f;
    TS_NEW(f = st_open(in));
    t5_model_t *m;
    TS_NEW(m = t5_model_load(b, f, KERN_F32));
    t5_model_destroy(&m);
    st_close(&f);
    kern_backend_destroy(&b);
}
END_TEST

START_TEST(test_tensor_no_encoder_has_is_refused_naming_it) {
    st_file_t *f = random_file("t5-tiny", KERN_F32, 1);
    st_file_t *g = edited(f, NULL, "decoder.blocks.0.norm1.weight", 1, 32);
    t5_config_t c;
    ck_assert_int_eq(t5_config_from_weights(g, &c), -1);
    ck_assert_msg(strstr(reel_err_text(), "decoder.blocks.0.norm1.weight"), "%s", reel_err_text());
    st_close(&g);
    /* a layer after a gap: layers counts 0, 1 and stops */
    g = edited(f, NULL, "blocks.3.attn.q.weight", 32, 32);
    ck_assert_int_eq(t5_config_from_weights(g, &c), -1);
    ck_assert_msg(strstr(reel_err_text(), "blocks.3.attn.q.weight"), "%s", reel_err_text());
    st_close(&g);
    st_close(&f);
}
END_TEST

/* T5's buckets for 32 buckets, max distance 128, from the published
 * formula evaluated in float32 (numpy, as torch does): offsets −20..20. */
START_TEST(test_buckets_match_the_table_of_the_published_formula) {
    static const int64_t want[41] = {
        10, 10, 10, 10, 10, 9, 9, 9, 9, 8, 8, 8, 8, 7, 6, 5, 4, 3, 2, 1, 0,
        17, 18, 19, 20, 21, 22, 23, 24, 24, 24, 24, 25, 25, 25, 25, 26, 26, 26, 26, 26,
    };
    for (int64_t r = -20; r <= 20; r++)
        ck_assert_msg(t5_bucket(r, 32, 128) == want[r + 20], "bucket(%lld) = %lld, want %lld", (long long)r,
                      (long long)t5_bucket(r, 32, 128), (long long)want[r + 20]);
    /* the boundaries of the far buckets and the cap */
    const int64_t far[][2] = { { 22, 26 }, { 23, 27 }, { 31, 27 }, { 32, 28 }, { 45, 28 }, { 46, 29 },
                               { 63, 29 }, { 64, 30 }, { 90, 30 }, { 91, 31 }, { 128, 31 }, { 5000, 31 },
                               { -23, 11 }, { -91, 15 }, { -5000, 15 } };
    for (size_t i = 0; i < sizeof far / sizeof far[0]; i++)
        ck_assert_msg(t5_bucket(far[i][0], 32, 128) == far[i][1], "bucket(%lld) = %lld, want %lld",
                      (long long)far[i][0], (long long)t5_bucket(far[i][0], 32, 128), (long long)far[i][1]);
}
END_TEST

START_TEST(test_padding_leaves_the_real_rows_as_unpadded) {
    st_file_t *f = random_file("t5-small", KERN_F32, 5);
    kern_backend_t *b;
    kern_stream_t *s;
    t5_model_t *m;
    TS_NEW(b = kern_backend_cpu_new());
    TS_NEW(s = kern_stream_new(b));
    TS_NEW(m = t5_model_load(b, f, KERN_F32));
    const int32_t ids[5] = { 3, 999, 0, 42, 1 };
    int64_t D = t5_model_config(m)->dim;
    float *a = malloc(sizeof *a * 5 * D), *p = malloc(sizeof *p * 5 * D);
    TS_OK(t5_encode(m, s, ids, 5, 0, a));
    TS_OK(t5_encode(m, s, ids, 5, 37, p));
    double mx = 0;
    for (int64_t i = 0; i < 5 * D; i++) mx = fmax(mx, fabs(a[i]));
    double diff = ts_max_abs_diff(a, p, (size_t)(5 * D));
    ck_assert_msg(diff <= 1e-5 * mx, "padded rows differ by %g (max %g)", diff, mx);
    /* pad_to == n is the unpadded run */
    TS_OK(t5_encode(m, s, ids, 5, 5, p));
    ck_assert(ts_max_abs_diff(a, p, (size_t)(5 * D)) == 0);
    free(a);
    free(p);
    t5_model_destroy(&m);
    t5_model_destroy(&m); /* idempotent */
    kern_stream_destroy(&s); /* its scratch arena is the rest */
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    kern_backend_destroy(&b);
    st_close(&f);
}
END_TEST

START_TEST(test_ids_outside_the_vocabulary_and_bad_lengths_are_refused) {
    st_file_t *f = random_file("t5-tiny", KERN_F32, 5);
    kern_backend_t *b;
    kern_stream_t *s;
    t5_model_t *m;
    TS_NEW(b = kern_backend_cpu_new());
    TS_NEW(s = kern_stream_new(b));
    TS_NEW(m = t5_model_load(b, f, KERN_F32));
    float out[3 * 32];
    for (size_t i = 0; i < 3 * 32; i++) out[i] = 7.0f;
    const int32_t big[3] = { 1, 320, 2 }, neg[3] = { 1, 2, -1 };
    ck_assert_int_eq(t5_encode(m, s, big, 3, 0, out), -1);
    ck_assert_msg(strstr(reel_err_text(), "id 320") && strstr(reel_err_text(), "position 1"), "%s", reel_err_text());
    ck_assert_int_eq(t5_encode(m, s, neg, 3, 0, out), -1);
    ck_assert_msg(strstr(reel_err_text(), "id -1"), "%s", reel_err_text());
    ck_assert_int_eq(t5_encode(m, s, big, 0, 0, out), -1);
    const int32_t ok[3] = { 1, 2, 3 };
    ck_assert_int_eq(t5_encode(m, s, ok, 3, 2, out), -1);
    for (size_t i = 0; i < 3 * 32; i++) ck_assert(out[i] == 7.0f);
    /* BF16 has no CPU kernels: refused naming what is missing */
    ck_assert_ptr_null(t5_model_load(b, f, KERN_BF16));
    ck_assert_msg(strstr(reel_err_text(), "BF16"), "%s", reel_err_text());
    t5_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
    st_close(&f);
}
END_TEST

/* ---- one layer of width 4, written out ------------------------------------- */

/* vocab 6, dim 4, dim_attn 4 (2 heads of 2), ffn 2, 1 layer, 4 buckets:
 * with 4 buckets, offset 0 is bucket 0, a key before the query bucket 1,
 * a key after it bucket 3 (buckets/4 = 1 exact offset; every larger one
 * caps at the half's last bucket). */
#define HV 6
#define HD 4
#define HF 2
#define HH 2
#define HB 4

static const float E[HV][HD] = { { 0, 0, 0, 0 }, { 1, 2, -1, 0.5f }, { -1, 0.5f, 2, 1 },
                                 { 0.25f, -2, 1, 1 }, { 3, 0, 0, -1 }, { 1, 1, 1, 1 } };
static const float N1[HD] = { 1, 0.5f, 2, 1 }, N2[HD] = { 1, 1, 0.5f, 1.5f }, NF[HD] = { 2, 1, 1, 0.5f };
static const float WQ[HD][HD] = { { 0.5f, 0, 0, 0.1f }, { 0, 0.5f, 0.2f, 0 }, { 0.1f, 0, 0.5f, 0 }, { 0, 0, 0.3f, 0.5f } };
static const float WK[HD][HD] = { { 0.4f, 0.1f, 0, 0 }, { 0, 0.3f, 0, 0.2f }, { 0, 0, 0.6f, 0 }, { 0.2f, 0, 0, 0.4f } };
static const float WV[HD][HD] = { { 1, 0, 0, 0 }, { 0, 1, 0, 0 }, { 0, 0, 1, 0 }, { 0, 0, 0, 1 } };
static const float WO[HD][HD] = { { 0.5f, 0.5f, 0, 0 }, { 0, 0.5f, 0.5f, 0 }, { 0, 0, 0.5f, 0.5f }, { 0.5f, 0, 0, 0.5f } };
static const float WG[HF][HD] = { { 0.3f, -0.2f, 0.1f, 0.4f }, { -0.5f, 0.2f, 0.3f, 0.1f } };
static const float W1[HF][HD] = { { 0.2f, 0.2f, -0.1f, 0.3f }, { 0.1f, -0.4f, 0.2f, 0.2f } };
static const float W2[HD][HF] = { { 0.5f, -0.3f }, { 0.2f, 0.4f }, { -0.1f, 0.6f }, { 0.3f, 0.3f } };
static const float POS[HB][HH] = { { 0.5f, -0.5f }, { 1.0f, 0.0f }, { 9.0f, 9.0f }, { -1.0f, 0.75f } };

static void rmsn(const double *x, const float *w, double *y) {
    double q = 0;
    for (int i = 0; i < HD; i++) q += x[i] * x[i];
    double r = 1.0 / sqrt(q / HD + 1e-6);
    for (int i = 0; i < HD; i++) y[i] = x[i] * r * w[i];
}

/* The encoder written out for n tokens (no padding). */
static void by_hand(const int32_t *ids, int n, double out[][HD]) {
    double x[8][HD], h[8][HD], q[8][HD], k[8][HD], v[8][HD], o[8][HD];
    for (int i = 0; i < n; i++)
        for (int c = 0; c < HD; c++) x[i][c] = E[ids[i]][c];
    for (int i = 0; i < n; i++) rmsn(x[i], N1, h[i]);
    for (int i = 0; i < n; i++)
        for (int r = 0; r < HD; r++) {
            q[i][r] = k[i][r] = v[i][r] = 0;
            for (int c = 0; c < HD; c++) {
                q[i][r] += WQ[r][c] * h[i][c];
                k[i][r] += WK[r][c] * h[i][c];
                v[i][r] += WV[r][c] * h[i][c];
            }
        }
    for (int hd = 0; hd < HH; hd++)
        for (int i = 0; i < n; i++) {
            double s[8], mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                int bucket = j == i ? 0 : j < i ? 1 : 3;
                s[j] = q[i][2 * hd] * k[j][2 * hd] + q[i][2 * hd + 1] * k[j][2 * hd + 1] + POS[bucket][hd];
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
            for (int c = 0; c < 2; c++) {
                double acc = 0;
                for (int j = 0; j < n; j++) acc += s[j] / sum * v[j][2 * hd + c];
                o[i][2 * hd + c] = acc;
            }
        }
    for (int i = 0; i < n; i++)
        for (int r = 0; r < HD; r++)
            for (int c = 0; c < HD; c++) x[i][r] += WO[r][c] * o[i][c];
    for (int i = 0; i < n; i++) {
        rmsn(x[i], N2, h[i]);
        double f[HF];
        for (int r = 0; r < HF; r++) {
            double g = 0, a = 0;
            for (int c = 0; c < HD; c++) {
                g += WG[r][c] * h[i][c];
                a += W1[r][c] * h[i][c];
            }
            g = 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
            f[r] = a * g;
        }
        for (int r = 0; r < HD; r++) x[i][r] += W2[r][0] * f[0] + W2[r][1] * f[1];
        rmsn(x[i], NF, out[i]);
    }
}

START_TEST(test_one_layer_of_width_4_matches_the_computation_written_out) {
    st_writer_t *w;
    TS_NEW(w = st_writer_new());
    TS_OK(st_writer_add_f32(w, "token_embedding.weight", 2, (const int64_t[]){ HV, HD }, &E[0][0]));
    TS_OK(st_writer_add_f32(w, "blocks.0.norm1.weight", 1, (const int64_t[]){ HD }, N1));
    TS_OK(st_writer_add_f32(w, "blocks.0.attn.q.weight", 2, (const int64_t[]){ HD, HD }, &WQ[0][0]));
    TS_OK(st_writer_add_f32(w, "blocks.0.attn.k.weight", 2, (const int64_t[]){ HD, HD }, &WK[0][0]));
    TS_OK(st_writer_add_f32(w, "blocks.0.attn.v.weight", 2, (const int64_t[]){ HD, HD }, &WV[0][0]));
    TS_OK(st_writer_add_f32(w, "blocks.0.attn.o.weight", 2, (const int64_t[]){ HD, HD }, &WO[0][0]));
    TS_OK(st_writer_add_f32(w, "blocks.0.norm2.weight", 1, (const int64_t[]){ HD }, N2));
    TS_OK(st_writer_add_f32(w, "blocks.0.ffn.gate.0.weight", 2, (const int64_t[]){ HF, HD }, &WG[0][0]));
    TS_OK(st_writer_add_f32(w, "blocks.0.ffn.fc1.weight", 2, (const int64_t[]){ HF, HD }, &W1[0][0]));
    TS_OK(st_writer_add_f32(w, "blocks.0.ffn.fc2.weight", 2, (const int64_t[]){ HD, HF }, &W2[0][0]));
    TS_OK(st_writer_add_f32(w, "blocks.0.pos_embedding.embedding.weight", 2, (const int64_t[]){ HB, HH }, &POS[0][0]));
    TS_OK(st_writer_add_f32(w, "norm.weight", 1, (const int64_t[]){ HD }, NF));
    const char *p = ts_join(tmpdir, "hand.safetensors");
    TS_OK(st_writer_save(w, p));
    st_writer_destroy(&w);
    st_file_t *f;
    TS_NEW(f = st_open(p));
    t5_config_t c;
    TS_OK(t5_config_from_weights(f, &c));
    ck_assert(c.vocab == HV && c.dim == HD && c.dim_attn == HD && c.dim_ffn == HF && c.heads == HH &&
              c.layers == 1 && c.buckets == HB && !strcmp(c.name, "custom"));
    /* bucket 2 (offset 0 ... never: only offsets > 0 in the far half) is unused */
    ck_assert(t5_bucket(0, HB, 128) == 0 && t5_bucket(-1, HB, 128) == 1 && t5_bucket(-7, HB, 128) == 1 &&
              t5_bucket(1, HB, 128) == 3 && t5_bucket(7, HB, 128) == 3);
    kern_backend_t *b;
    kern_stream_t *s;
    t5_model_t *m;
    TS_NEW(b = kern_backend_cpu_new());
    TS_NEW(s = kern_stream_new(b));
    TS_NEW(m = t5_model_load(b, f, KERN_F32));
    const int32_t ids[4] = { 1, 4, 2, 3 };
    double want[4][HD];
    float got[4 * HD], pad[4 * HD];
    for (int n = 1; n <= 4; n++) {
        by_hand(ids, n, want);
        TS_OK(t5_encode(m, s, ids, n, 0, got));
        TS_OK(t5_encode(m, s, ids, n, 6, pad)); /* padding: token 0, masked */
        for (int i = 0; i < n; i++)
            for (int cc = 0; cc < HD; cc++) {
                ck_assert_msg(fabs(got[i * HD + cc] - want[i][cc]) <= 1e-5 * (1 + fabs(want[i][cc])),
                              "n=%d row %d col %d: %g, by hand %g", n, i, cc, got[i * HD + cc], want[i][cc]);
                ck_assert_msg(fabs(pad[i * HD + cc] - want[i][cc]) <= 1e-5 * (1 + fabs(want[i][cc])),
                              "padded n=%d row %d col %d: %g, by hand %g", n, i, cc, pad[i * HD + cc], want[i][cc]);
            }
    }
    t5_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
    st_close(&f);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("t5");
    TCase *tc = tcase_create("core");
    tcase_add_unchecked_fixture(tc, make_tmpdir, remove_tmpdir);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_builtin_umt5_xxl_is_wans_config_and_unknown_names_are_refused);
    tcase_add_test(tc, test_config_is_inferred_from_the_shapes_of_random_weights);
    tcase_add_test(tc, test_missing_tensor_is_refused_naming_it);
    tcase_add_test(tc, test_inconsistent_shape_is_refused_naming_the_tensor);
    tcase_add_test(tc, test_tensor_no_encoder_has_is_refused_naming_it);
    tcase_add_test(tc, test_buckets_match_the_table_of_the_published_formula);
    tcase_add_test(tc, test_padding_leaves_the_real_rows_as_unpadded);
    tcase_add_test(tc, test_ids_outside_the_vocabulary_and_bad_lengths_are_refused);
    tcase_add_test(tc, test_one_layer_of_width_4_matches_the_computation_written_out);
    tcase_add_test(tc, test_weights_with_nan_or_inf_are_refused_at_load_naming_file_and_tensor);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(suite()); }
