/* test_vae.c -- Wan2.1's VAE decoder (model/vae.h) and its video ops
 * (kernels/ops_video.h) on the CPU backend: configs and the refusal of bad
 * checkpoints, the frame count and size of a decode, causality across
 * chunks, and hand-checked convolution, upsampling and interleave cases.
 * The numerical check against an independent implementation is
 * tests/crosscheck/test_vae.py. */
#include "support.h"
#include "model/vae.h"
#include "kernels/ops_video.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char dir[64];
static kern_backend_t *B;
static kern_stream_t *S;

static void setup(void) {
    ts_mkdtemp(dir, sizeof dir, "vae");
    TS_NEW(B = kern_backend_cpu_new());
    TS_NEW(S = kern_stream_new(B));
}

static void teardown(void) {
    kern_stream_destroy(&S);
    kern_backend_destroy(&B);
    ts_rmtree(dir);
}

/* vae-tiny (or dim/z overridden when > 0) random weights at dir/name. */
static const char *tiny_weights(const char *name, int64_t dim, int64_t z) {
    vae_config_t c;
    TS_OK(vae_config_builtin("vae-tiny", &c));
    if (dim > 0) c.dim = dim;
    if (z > 0) c.z_dim = z;
    const char *p = ts_join(dir, name);
    TS_OK(vae_weights_init(&c, 7, p));
    return p;
}

static vae_model_t *load(const char *path) {
    st_file_t *f;
    TS_NEW(f = st_open(path));
    vae_model_t *m = vae_model_load(B, f, KERN_F32);
    st_close(&f);
    return m;
}

/* A copy of src at dst without tensor `drop` (NULL: none), tensor `reshape`
 * given shape [2] instead (NULL: none), and metadata kv pairs. */
static void copy_weights(const char *src, const char *dst, const char *drop, const char *reshape,
                         const char *const *meta) {
    st_file_t *f;
    TS_NEW(f = st_open(src));
    st_writer_t *w;
    TS_NEW(w = st_writer_new());
    float two[2] = { 1, 1 };
    int64_t s2[1] = { 2 };
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        if (drop && !strcmp(t->name, drop)) continue;
        if (reshape && !strcmp(t->name, reshape)) TS_OK(st_writer_add_f32(w, t->name, 1, s2, two));
        else TS_OK(st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data));
    }
    for (; meta && meta[0]; meta += 2) TS_OK(st_writer_meta(w, meta[0], meta[1]));
    TS_OK(st_writer_save(w, dst));
    st_writer_destroy(&w);
    st_close(&f);
}

static float *rand_latent(int64_t z, int64_t F, int64_t H, int64_t W, uint64_t seed) {
    size_t n = (size_t)(z * F * H * W);
    float *x = malloc(n * sizeof *x);
    ck_assert(x != NULL);
    ts_fill_uniform(x, n, seed, -2.0f, 2.0f);
    return x;
}

static float *decode(vae_model_t *m, const float *lat, int64_t F, int64_t H, int64_t W) {
    size_t n = (size_t)(3 * vae_video_frames(F) * 64 * H * W);
    float *v = malloc(n * sizeof *v);
    ck_assert(v != NULL);
    TS_OK(vae_decode(m, S, lat, F, H, W, v, NULL, NULL));
    return v;
}

/* ---- configs --------------------------------------------------------------- */

START_TEST(test_builtin_configs_are_wan21_and_tiny_and_an_unknown_name_is_refused_naming_them) {
    vae_config_t c;
    TS_OK(vae_config_builtin("wan2.1", &c));
    ck_assert_int_eq(c.dim, 96);
    ck_assert_int_eq(c.z_dim, 16);
    ck_assert_int_eq(c.num_res_blocks, 2);
    ck_assert_int_eq(c.dim_mult[0], 1);
    ck_assert_int_eq(c.dim_mult[3], 4);
    TS_OK(vae_config_builtin("vae-tiny", &c));
    ck_assert_int_eq(c.z_dim, 4); /* the demo DiT "tiny" has 4 latent channels */
    ck_assert_int_eq(vae_config_builtin("wan9", &c), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "wan2.1"));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "vae-tiny"));
    ck_assert_str_eq(vae_config_builtin_name(0), "wan2.1");
    ck_assert_ptr_null(vae_config_builtin_name(2));
}
END_TEST

START_TEST(test_config_from_weights_reads_dim_and_z_dim_from_decoder_conv1) {
    st_file_t *f;
    vae_config_t c;
    TS_NEW(f = st_open(tiny_weights("t.st", 0, 0)));
    TS_OK(vae_config_from_weights(f, &c));
    ck_assert_int_eq(c.dim, 8);
    ck_assert_int_eq(c.z_dim, 4);
    ck_assert_str_eq(c.name, "vae-tiny");
    st_close(&f);
    TS_NEW(f = st_open(tiny_weights("c.st", 4, 3)));
    TS_OK(vae_config_from_weights(f, &c));
    ck_assert_int_eq(c.dim, 4);
    ck_assert_int_eq(c.z_dim, 3);
    ck_assert_str_eq(c.name, "custom");
    st_close(&f);
}
END_TEST

START_TEST(test_a_file_without_decoder_conv1_is_refused_as_not_a_vae_naming_the_file) {
    const char *src = tiny_weights("t.st", 0, 0), *dst = ts_join(dir, "bad.st");
    copy_weights(src, dst, "decoder.conv1.weight", NULL, NULL);
    ck_assert_ptr_null(load(dst));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "decoder.conv1.weight"));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "bad.st"));
}
END_TEST

START_TEST(test_a_misshapen_decoder_conv1_is_refused_naming_it) {
    const char *src = tiny_weights("t.st", 0, 0), *dst = ts_join(dir, "bad.st");
    copy_weights(src, dst, NULL, "decoder.conv1.weight", NULL);
    ck_assert_ptr_null(load(dst));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "decoder.conv1.weight"));
}
END_TEST

START_TEST(test_a_missing_or_misshapen_block_tensor_is_refused_naming_it) {
    const char *src = tiny_weights("t.st", 0, 0), *dst = ts_join(dir, "bad.st");
    copy_weights(src, dst, "decoder.upsamples.7.time_conv.bias", NULL, NULL);
    ck_assert_ptr_null(load(dst));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "decoder.upsamples.7.time_conv.bias"));
    copy_weights(src, dst, NULL, "decoder.middle.1.norm.gamma", NULL);
    ck_assert_ptr_null(load(dst));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "decoder.middle.1.norm.gamma"));
    copy_weights(src, dst, NULL, "decoder.head.2.weight", NULL);
    ck_assert_ptr_null(load(dst));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "decoder.head.2.weight"));
}
END_TEST

START_TEST(test_malformed_latent_statistics_metadata_is_refused_naming_the_key) {
    const char *src = tiny_weights("t.st", 0, 0), *dst = ts_join(dir, "bad.st");
    const char *const m1[] = { "latents_mean", "[0, 0, 0]", NULL };
    copy_weights(src, dst, NULL, NULL, m1);
    ck_assert_ptr_null(load(dst));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "latents_mean"));
    const char *const m2[] = { "latents_std", "[1, 1, 0, 1]", NULL };
    copy_weights(src, dst, NULL, NULL, m2);
    ck_assert_ptr_null(load(dst));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "latents_std"));
}
END_TEST

START_TEST(test_only_f32_compute_is_offered) {
    st_file_t *f;
    TS_NEW(f = st_open(tiny_weights("t.st", 0, 0)));
    ck_assert_ptr_null(vae_model_load(B, f, KERN_BF16));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "F32"));
    st_close(&f);
}
END_TEST

/* ---- decoding ---------------------------------------------------------------- */

typedef struct { int64_t calls, last_done, last_total, stop_at; bool in_order; } progress_t;

static int on_progress(void *user, int64_t done, int64_t total) {
    progress_t *p = user;
    p->in_order = p->in_order && done == p->last_done + 1;
    p->calls++;
    p->last_done = done;
    p->last_total = total;
    return p->stop_at && done >= p->stop_at; /* a cancelled request's decode stops there */
}

START_TEST(test_decode_gives_1_plus_4_f_minus_1_frames_of_8h_by_8w_in_unit_range_with_progress_per_frame) {
    vae_model_t *m;
    TS_NEW(m = load(tiny_weights("t.st", 0, 0)));
    ck_assert_int_eq(vae_video_frames(3), 9);
    int64_t F = 3, H = 2, W = 3;
    float *lat = rand_latent(4, F, H, W, 1);
    size_t n = (size_t)(3 * 9 * 16 * 24);
    float *v = malloc((n + 1) * sizeof *v);
    v[n] = 12345.0f; /* a guard past the end */
    progress_t p = { .in_order = true };
    TS_OK(vae_decode(m, S, lat, F, H, W, v, on_progress, &p));
    ck_assert_float_eq(v[n], 12345.0f);
    ck_assert_int_eq(p.calls, F);
    ck_assert_int_eq(p.last_total, F);
    ck_assert(p.in_order);
    size_t inside = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(v[i] >= -1.0f && v[i] <= 1.0f, "video[%zu] = %g outside [-1, 1]", i, v[i]);
        inside += fabsf(v[i]) < 1.0f;
    }
    ck_assert_msg(inside > n / 2, "only %zu of %zu values unclamped: the test weights saturate", inside, n);
    free(v);
    free(lat);
    vae_model_destroy(&m);
}
END_TEST

/* A progress callback that asks to stop (its request was cancelled) ends
 * the decode after that latent frame with VAE_E_STOPPED; the model's causal
 * caches are left for the next decode, which gives the same video as one
 * never interrupted. */
START_TEST(test_a_decode_its_progress_stops_ends_there_and_the_next_decode_is_whole) {
    vae_model_t *m;
    TS_NEW(m = load(tiny_weights("t.st", 0, 0)));
    int64_t F = 3, H = 2, W = 3;
    float *lat = rand_latent(4, F, H, W, 1);
    size_t n = (size_t)(3 * 9 * 16 * 24);
    float *ref = malloc(n * sizeof *ref), *v = malloc(n * sizeof *v);
    TS_OK(vae_decode(m, S, lat, F, H, W, ref, NULL, NULL));
    progress_t p = { .in_order = true, .stop_at = 2 };
    ck_assert_int_eq(vae_decode(m, S, lat, F, H, W, v, on_progress, &p), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_STATE);
    ck_assert_msg(strstr(reel_err_text(), VAE_E_STOPPED " after 2 of 3 latent frames"), "%s", reel_err_text());
    ck_assert_int_eq(p.calls, 2); /* no frame decoded past the stop */
    memset(v, 0, n * sizeof *v);
    TS_OK(vae_decode(m, S, lat, F, H, W, v, NULL, NULL));
    ck_assert_msg(memcmp(v, ref, n * sizeof *v) == 0, "the decode after a stopped one differs");
    free(v);
    free(ref);
    free(lat);
    vae_model_destroy(&m);
}
END_TEST

/* The narrowest decoders: with dim 1 the last stage has 1 channel and the
 * head's 3 RGB channels are the widest activation at full size (the
 * scratch was once sized without them: a heap overflow under ASan, a
 * corrupted heap in a plain build). Every dim from 1 decodes, twice alike,
 * in range. */
START_TEST(test_the_narrowest_decoders_decode_within_their_buffers) {
    for (int64_t dim = 1; dim <= 3; dim++) {
        char name[32];
        snprintf(name, sizeof name, "d%lld.st", (long long)dim);
        vae_model_t *m;
        TS_NEW(m = load(tiny_weights(name, dim, 0)));
        int64_t F = 2, H = 2, W = 2;
        float *lat = rand_latent(4, F, H, W, 3);
        float *a = decode(m, lat, F, H, W), *b = decode(m, lat, F, H, W);
        size_t n = (size_t)(3 * vae_video_frames(F) * 64 * H * W);
        ck_assert_msg(!memcmp(a, b, n * sizeof *a), "dim %lld: two decodes differ", (long long)dim);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(a[i] >= -1.0f && a[i] <= 1.0f, "dim %lld: video[%zu] = %g", (long long)dim, i, a[i]);
        free(a);
        free(b);
        free(lat);
        vae_model_destroy(&m);
    }
}
END_TEST

/* Upstream decodes one latent frame at a time with causal caches, so the
 * frames a prefix of the latent decodes to never change when more frames
 * follow: F = 1 gives the first frame of F = 3, F = 2 its first 5. */
START_TEST(test_decoding_a_prefix_of_the_latent_gives_the_same_leading_frames_bit_for_bit) {
    vae_model_t *m;
    TS_NEW(m = load(tiny_weights("t.st", 0, 0)));
    int64_t F = 3, H = 3, W = 2, z = 4, plane = 64 * H * W;
    float *lat = rand_latent(z, F, H, W, 2);
    float *v3 = decode(m, lat, 3, H, W);
    for (int64_t f = 1; f <= 2; f++) {
        float *pre = malloc((size_t)(z * f * H * W) * sizeof *pre);
        for (int64_t c = 0; c < z; c++) memcpy(pre + c * f * H * W, lat + c * F * H * W, (size_t)(f * H * W) * sizeof *pre);
        float *v = decode(m, pre, f, H, W);
        int64_t fo = vae_video_frames(f);
        for (int64_t c = 0; c < 3; c++)
            ck_assert_msg(memcmp(v + c * fo * plane, v3 + c * 9 * plane, (size_t)(fo * plane) * sizeof *v) == 0,
                          "F=%lld: channel %lld's first %lld frames differ from F=3's", (long long)f, (long long)c,
                          (long long)fo);
        free(v);
        free(pre);
    }
    /* and the later frames do depend on the later latents */
    lat[1 * F * H * W + 2 * H * W] += 1.0f; /* channel 1, frame 2 */
    float *w3 = decode(m, lat, 3, H, W);
    ck_assert(memcmp(w3, v3, (size_t)(5 * plane) * sizeof *w3) == 0);
    ck_assert(memcmp(w3 + 5 * plane, v3 + 5 * plane, (size_t)(4 * plane) * sizeof *w3) != 0);
    free(w3);
    free(v3);
    free(lat);
    vae_model_destroy(&m);
}
END_TEST

START_TEST(test_decode_returns_every_byte_it_allocated_and_decodes_again_identically) {
    vae_model_t *m;
    TS_NEW(m = load(tiny_weights("t.st", 0, 0)));
    size_t base = kern_bytes_in_use(B);
    ck_assert_uint_eq(base, vae_model_bytes(m));
    float *lat = rand_latent(4, 2, 2, 2, 3);
    float *a = decode(m, lat, 2, 2, 2);
    /* all that stays is the stream's own arena (the attention's scratch) */
    ck_assert_uint_eq(kern_bytes_in_use(B), base + kern_stream_scratch_size(S));
    float *b = decode(m, lat, 2, 2, 2); /* the caches start empty again */
    ck_assert(memcmp(a, b, (size_t)(3 * 5 * 256) * sizeof *a) == 0);
    free(a);
    free(b);
    free(lat);
    vae_model_destroy(&m);
}
END_TEST

START_TEST(test_identity_latent_statistics_metadata_changes_nothing_and_others_do) {
    const char *src = tiny_weights("t.st", 0, 0), *same = ts_join(dir, "same.st"), *other = ts_join(dir, "o.st");
    const char *const m1[] = { "latents_mean", "[0, 0, 0, 0]", "latents_std", "[1, 1, 1, 1]", NULL };
    const char *const m2[] = { "latents_mean", "[0, 0.5, 0, 0]", "latents_std", "[1, 1, 2, 1]", NULL };
    copy_weights(src, same, NULL, NULL, m1);
    copy_weights(src, other, NULL, NULL, m2);
    vae_model_t *a, *b, *c;
    TS_NEW(a = load(src));
    TS_NEW(b = load(same));
    TS_NEW(c = load(other));
    float *lat = rand_latent(4, 1, 2, 2, 4);
    float *va = decode(a, lat, 1, 2, 2), *vb = decode(b, lat, 1, 2, 2), *vc = decode(c, lat, 1, 2, 2);
    ck_assert(memcmp(va, vb, 3 * 256 * sizeof *va) == 0);
    ck_assert(memcmp(va, vc, 3 * 256 * sizeof *va) != 0);
    free(va);
    free(vb);
    free(vc);
    free(lat);
    vae_model_destroy(&a);
    vae_model_destroy(&b);
    vae_model_destroy(&c);
}
END_TEST

START_TEST(test_decode_refuses_an_empty_or_huge_latent) {
    vae_model_t *m;
    TS_NEW(m = load(tiny_weights("t.st", 0, 0)));
    float x = 0, v = 0;
    ck_assert_int_eq(vae_decode(m, S, &x, 0, 1, 1, &v, NULL, NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "vae_decode"));
    ck_assert_int_eq(vae_decode(m, S, &x, 1, 5000, 1, &v, NULL, NULL), -1);
    vae_model_destroy(&m);
}
END_TEST

/* ---- the video ops ------------------------------------------------------------ */

static kern_tensor_t t4(float *p, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t s[4] = { a, b, c, d };
    return kern_tensor_make(p, KERN_F32, KERN_DEVICE_HOST, 4, s);
}

static kern_tensor_t t2(float *p, int64_t a, int64_t b) {
    int64_t s[2] = { a, b };
    return kern_tensor_make(p, KERN_F32, KERN_DEVICE_HOST, 2, s);
}

/* A 3x3x3 kernel of ones on one pixel, one channel: only the centre tap
 * of each frame is inside the picture, so y = bias + the frames at t-2,
 * t-1 and t (zeros, the cache's, x's). */
START_TEST(test_causal_conv_of_a_single_pixel_sums_the_cached_and_current_frames_by_hand) {
    float ones[27], bias[1] = { 0.5f }, x[1] = { 1.0f }, prev[2] = { 2.0f, 4.0f }, y[1], cols[27];
    for (int i = 0; i < 27; i++) ones[i] = 1.0f;
    kern_tensor_t w = t2(ones, 1, 27), b = kern_tensor_make(bias, KERN_F32, KERN_DEVICE_HOST, 1, (int64_t[]){ 1 });
    kern_tensor_t xt = t4(x, 1, 1, 1, 1), yt = t4(y, 1, 1, 1, 1), ct = t2(cols, 1, 27);
    TS_OK(kern_conv3d_causal(S, NULL, &xt, &w, &b, 3, 3, 3, &ct, &yt));
    ck_assert_float_eq(y[0], 1.5f);              /* 0 + 0 + 1 + 0.5 */
    kern_tensor_t p1 = t4(prev + 1, 1, 1, 1, 1), p2 = t4(prev, 2, 1, 1, 1);
    TS_OK(kern_conv3d_causal(S, &p1, &xt, &w, &b, 3, 3, 3, &ct, &yt));
    ck_assert_float_eq(y[0], 5.5f);              /* 0 + 4 + 1 + 0.5 */
    TS_OK(kern_conv3d_causal(S, &p2, &xt, &w, &b, 3, 3, 3, &ct, &yt));
    ck_assert_float_eq(y[0], 7.5f);              /* 2 + 4 + 1 + 0.5 */
    ck_assert_int_eq(kern_conv3d_causal(S, &p2, &xt, &w, &b, 1, 3, 3, &ct, &yt), -1); /* P > kt-1 */
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "conv3d_causal"));
}
END_TEST

/* A 2-frame, 3x4, 2-channel clip after one cached frame, against the
 * convolution written as its sum (not as im2col), with a column block of
 * 5 rows so the blocks straddle rows and frames. */
START_TEST(test_causal_conv_in_small_column_blocks_matches_the_direct_sum) {
    enum { T = 2, H = 3, W = 4, C = 2, O = 3, KT = 3, KH = 3, KW = 3, K = KT * KH * KW * C };
    float x[T * H * W * C], prev[H * W * C], w[O * K], bias[O], y[T * H * W * O], cols[5 * K];
    ts_fill_uniform(x, sizeof x / sizeof *x, 1, -1, 1);
    ts_fill_uniform(prev, sizeof prev / sizeof *prev, 2, -1, 1);
    ts_fill_uniform(w, sizeof w / sizeof *w, 3, -1, 1);
    ts_fill_uniform(bias, O, 4, -1, 1);
    kern_tensor_t xt = t4(x, T, H, W, C), pt = t4(prev, 1, H, W, C), wt = t2(w, O, K), yt = t4(y, T, H, W, O);
    kern_tensor_t bt = kern_tensor_make(bias, KERN_F32, KERN_DEVICE_HOST, 1, (int64_t[]){ O }), ct = t2(cols, 5, K);
    TS_OK(kern_conv3d_causal(S, &pt, &xt, &wt, &bt, KT, KH, KW, &ct, &yt));
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++)
            for (int j = 0; j < W; j++)
                for (int o = 0; o < O; o++) {
                    double s = bias[o];
                    for (int dt = 0; dt < KT; dt++)
                        for (int dy = 0; dy < KH; dy++)
                            for (int dx = 0; dx < KW; dx++)
                                for (int c = 0; c < C; c++) {
                                    int lt = t + dt - 2, yy = i + dy - 1, xx = j + dx - 1; /* lt: -2 zero, -1 prev */
                                    if (lt < -1 || yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
                                    float in = lt < 0 ? prev[(yy * W + xx) * C + c] : x[((lt * H + yy) * W + xx) * C + c];
                                    s += (double)w[o * K + ((dt * KH + dy) * KW + dx) * C + c] * in;
                                }
                    double d = fabs(s - y[((t * H + i) * W + j) * O + o]);
                    if (d > worst) worst = d;
                }
    ck_assert_msg(worst < 1e-5, "max |conv - direct sum| = %g", worst);
}
END_TEST

START_TEST(test_upsample2x_repeats_each_pixel_and_interleave_alternates_channel_halves) {
    float x[2 * 2 * 1 * 2] = { 1, 2, 3, 4, 5, 6, 7, 8 }, y[2 * 4 * 2 * 2];
    kern_tensor_t xt = t4(x, 2, 2, 1, 2), yt = t4(y, 2, 4, 2, 2);
    TS_OK(kern_upsample2x(S, &xt, &yt));
    /* frame 0, row Y, col X -> x[0, Y/2, 0] */
    const float want_up[] = { 1, 2, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 3, 4,
                              5, 6, 5, 6, 5, 6, 5, 6, 7, 8, 7, 8, 7, 8, 7, 8 };
    ck_assert(memcmp(y, want_up, sizeof want_up) == 0);
    /* x as [T=2, H=2, W=1, 2C=2]: frame 2t+k is channel k of frame t */
    float z[4 * 2 * 1 * 1];
    kern_tensor_t zt = t4(z, 4, 2, 1, 1);
    TS_OK(kern_frame_interleave(S, &xt, &zt));
    const float want_il[] = { 1, 3, 2, 4, 5, 7, 6, 8 };
    ck_assert(memcmp(z, want_il, sizeof want_il) == 0);
    kern_tensor_t bad = t4(z, 2, 2, 1, 2);
    ck_assert_int_eq(kern_frame_interleave(S, &xt, &bad), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "frame_interleave"));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("vae");
    TCase *tc = tcase_create("vae");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_builtin_configs_are_wan21_and_tiny_and_an_unknown_name_is_refused_naming_them);
    tcase_add_test(tc, test_config_from_weights_reads_dim_and_z_dim_from_decoder_conv1);
    tcase_add_test(tc, test_a_file_without_decoder_conv1_is_refused_as_not_a_vae_naming_the_file);
    tcase_add_test(tc, test_a_misshapen_decoder_conv1_is_refused_naming_it);
    tcase_add_test(tc, test_a_missing_or_misshapen_block_tensor_is_refused_naming_it);
    tcase_add_test(tc, test_malformed_latent_statistics_metadata_is_refused_naming_the_key);
    tcase_add_test(tc, test_only_f32_compute_is_offered);
    tcase_add_test(tc, test_decode_gives_1_plus_4_f_minus_1_frames_of_8h_by_8w_in_unit_range_with_progress_per_frame);
    tcase_add_test(tc, test_a_decode_its_progress_stops_ends_there_and_the_next_decode_is_whole);
    tcase_add_test(tc, test_decoding_a_prefix_of_the_latent_gives_the_same_leading_frames_bit_for_bit);
    tcase_add_test(tc, test_decode_returns_every_byte_it_allocated_and_decodes_again_identically);
    tcase_add_test(tc, test_the_narrowest_decoders_decode_within_their_buffers);
    tcase_add_test(tc, test_identity_latent_statistics_metadata_changes_nothing_and_others_do);
    tcase_add_test(tc, test_decode_refuses_an_empty_or_huge_latent);
    tcase_add_test(tc, test_causal_conv_of_a_single_pixel_sums_the_cached_and_current_frames_by_hand);
    tcase_add_test(tc, test_causal_conv_in_small_column_blocks_matches_the_direct_sum);
    tcase_add_test(tc, test_upsample2x_repeats_each_pixel_and_interleave_alternates_channel_halves);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return ts_run(suite());
}
