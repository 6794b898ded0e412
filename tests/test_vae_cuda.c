/* test_vae_cuda.c -- the video ops (kernels/ops_video.h) and the VAE
 * decoder (model/vae.h) on CUDA against the CPU backend.
 *
 * Without a usable GPU (or in a CUDA=0 build) the suite prints one line,
 * "test_vae_cuda: SKIP: <reason>", and exits 0 without running anything.
 *
 * The video ops only move data, so CUDA must equal the CPU bit for bit
 * (F32, and BF16 against the CPU on the exact F32 widening). The decoder
 * is compared by NMSE = Σ(y − r)² / Σr² (y CUDA, r CPU): at most 1e-8 for
 * vae-tiny and 1e-7 for the wan2.1 config, whose middle attention (head
 * width 384) takes the decomposed cuBLAS path. Runs in-process (CK_NOFORK):
 * a CUDA context does not survive fork(). */
#include <stdio.h>

#ifndef HAVE_CUDA
int main(void) {
    printf("test_vae_cuda: SKIP: built without CUDA (CUDA=0)\n");
    return 0;
}
#else

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/backend.h"
#include "kernels/ops_video.h"
#include "model/vae.h"
#include "tests/support.h"

static kern_backend_t *G, *C;
static kern_stream_t *GS, *CS;
static char dir[64];

static void setup(void) {
    ts_mkdtemp(dir, sizeof dir, "vae-cuda");
    TS_NEW(G = kern_backend_cuda_new(0));
    TS_NEW(C = kern_backend_cpu_new());
    TS_NEW(GS = kern_stream_new(G));
    TS_NEW(CS = kern_stream_new(C));
}

static void teardown(void) {
    kern_stream_destroy(&GS);
    kern_stream_destroy(&CS);
    kern_backend_destroy(&G);
    kern_backend_destroy(&C);
    ts_rmtree(dir);
}

/* A device copy of host data n elements of dt (freed by the caller). */
static kern_tensor_t dev(const void *host, kern_dtype_t dt, int ndim, const int64_t *shape) {
    kern_tensor_t t = kern_tensor_alloc(G, dt, ndim, shape);
    ck_assert_msg(t.data != NULL, "alloc: %s", reel_err_text());
    if (host) TS_OK(kern_copy_h2d(GS, t.data, host, kern_tensor_bytes(&t)));
    return t;
}

/* The F32 data of n elements, rounded through BF16 when bf16. */
static void fill(float *x, uint16_t *h, size_t n, uint64_t seed, bool bf16) {
    ts_fill_uniform(x, n, seed, -1, 1);
    for (size_t i = 0; bf16 && i < n; i++) {
        h[i] = kern_f32_to_bf16(x[i]);
        x[i] = kern_bf16_to_f32(h[i]);
    }
}

/* y (device, n elements of dt) equals the CPU's r bit for bit. */
static void expect_equal(const kern_tensor_t *y, const float *r, size_t n, bool bf16, const char *what) {
    TS_OK(kern_stream_sync(GS));
    size_t es = bf16 ? 2 : 4;
    unsigned char *h = malloc(n * es);
    TS_OK(kern_copy_d2h(GS, h, y->data, n * es));
    TS_OK(kern_stream_sync(GS));
    for (size_t i = 0; i < n; i++) {
        float v;
        if (bf16) { uint16_t u; memcpy(&u, h + 2 * i, 2); v = kern_bf16_to_f32(u); }
        else memcpy(&v, h + 4 * i, 4);
        ck_assert_msg(memcmp(&v, &r[i], 4) == 0, "%s: element %zu is %g on CUDA, %g on the CPU", what, i, v, r[i]);
    }
    free(h);
}

START_TEST(test_video_ops_on_cuda_equal_the_cpu_bit_for_bit) {
    const bool bf16 = _i == 1;
    const kern_dtype_t dt = bf16 ? KERN_BF16 : KERN_F32;
    enum { T = 3, H = 5, W = 7, Cc = 6, P = 2, R = 11 };
    const int64_t xs[4] = { T, H, W, Cc }, ps[4] = { P, H, W, Cc }, cs[2] = { R, 27 * Cc };
    float x[T * H * W * Cc], prev[P * H * W * Cc], cols[R * 27 * Cc];
    uint16_t xh[T * H * W * Cc], ph[P * H * W * Cc];
    fill(x, xh, sizeof x / sizeof *x, 1, bf16);
    fill(prev, ph, sizeof prev / sizeof *prev, 2, bf16);
    kern_tensor_t cx = kern_tensor_make(x, KERN_F32, KERN_DEVICE_HOST, 4, xs);
    kern_tensor_t cp = kern_tensor_make(prev, KERN_F32, KERN_DEVICE_HOST, 4, ps);
    kern_tensor_t cc = kern_tensor_make(cols, KERN_F32, KERN_DEVICE_HOST, 2, cs);
    kern_tensor_t gx = dev(bf16 ? (void *)xh : x, dt, 4, xs), gp = dev(bf16 ? (void *)ph : prev, dt, 4, ps);
    kern_tensor_t gc = dev(NULL, dt, 2, cs);
    for (int64_t p = 0; p <= P; p++) /* no history, one frame, two frames */
        for (int64_t row0 = 0; row0 + R <= T * H * W; row0 += 37) {
            kern_tensor_t cpv = cp, gpv = gp;
            cpv.shape[0] = gpv.shape[0] = p;
            cpv.offset = gpv.offset = 0;
            TS_OK(kern_im2col3d(CS, p ? &cpv : NULL, &cx, 3, 3, 3, row0, &cc));
            TS_OK(kern_im2col3d(GS, p ? &gpv : NULL, &gx, 3, 3, 3, row0, &gc));
            expect_equal(&gc, cols, R * 27 * Cc, bf16, "im2col3d");
        }
    const int64_t us[4] = { T, 2 * H, 2 * W, Cc }, is[4] = { 2 * T, H, W, Cc / 2 };
    float up[T * 4 * H * W * Cc], il[T * H * W * Cc];
    kern_tensor_t cu = kern_tensor_make(up, KERN_F32, KERN_DEVICE_HOST, 4, us);
    kern_tensor_t ci = kern_tensor_make(il, KERN_F32, KERN_DEVICE_HOST, 4, is);
    kern_tensor_t gu = dev(NULL, dt, 4, us), gi = dev(NULL, dt, 4, is);
    TS_OK(kern_upsample2x(CS, &cx, &cu));
    TS_OK(kern_upsample2x(GS, &gx, &gu));
    expect_equal(&gu, up, sizeof up / sizeof *up, bf16, "upsample2x");
    TS_OK(kern_frame_interleave(CS, &cx, &ci));
    TS_OK(kern_frame_interleave(GS, &gx, &gi));
    expect_equal(&gi, il, sizeof il / sizeof *il, bf16, "frame_interleave");
    kern_free(G, gx.data);
    kern_free(G, gp.data);
    kern_free(G, gc.data);
    kern_free(G, gu.data);
    kern_free(G, gi.data);
}
END_TEST

/* config's random weights decoded on both backends: NMSE within tol. */
static void decode_both(const char *config, int64_t F, int64_t H, int64_t W, double tol) {
    vae_config_t c;
    TS_OK(vae_config_builtin(config, &c));
    const char *path = ts_join(dir, "vae.safetensors");
    TS_OK(vae_weights_init(&c, 3, path));
    st_file_t *f;
    TS_NEW(f = st_open(path));
    vae_model_t *mg, *mc;
    TS_NEW(mg = vae_model_load(G, f, KERN_F32));
    TS_NEW(mc = vae_model_load(C, f, KERN_F32));
    st_close(&f);
    size_t nl = (size_t)(c.z_dim * F * H * W), nv = (size_t)(3 * vae_video_frames(F) * 64 * H * W);
    float *lat = malloc(nl * sizeof *lat), *vg = malloc(nv * sizeof *vg), *vc = malloc(nv * sizeof *vc);
    ts_fill_uniform(lat, nl, 9, -2, 2);
    TS_OK(vae_decode(mg, GS, lat, F, H, W, vg, NULL, NULL));
    TS_OK(vae_decode(mc, CS, lat, F, H, W, vc, NULL, NULL));
    double e = ts_nmse(vc, vg, nv);
    printf("test_vae_cuda: %s latent [%lld,%lld,%lld,%lld]: NMSE %.3g (tol %g)\n", config, (long long)c.z_dim,
           (long long)F, (long long)H, (long long)W, e, tol);
    ck_assert_msg(e <= tol, "%s: NMSE %g > %g", config, e, tol);
    free(lat);
    free(vg);
    free(vc);
    vae_model_destroy(&mg);
    vae_model_destroy(&mc);
}

START_TEST(test_vae_tiny_decodes_on_cuda_as_on_the_cpu) {
    decode_both("vae-tiny", 3, 4, 6, 1e-8);
}
END_TEST

START_TEST(test_wan21_config_decodes_on_cuda_as_on_the_cpu) {
    decode_both("wan2.1", 2, 4, 4, 1e-7);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("vae_cuda");
    TCase *tc = tcase_create("vae_cuda");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_video_ops_on_cuda_equal_the_cpu_bit_for_bit, 0, 2);
    tcase_add_test(tc, test_vae_tiny_decodes_on_cuda_as_on_the_cpu);
    tcase_add_test(tc, test_wan21_config_decodes_on_cuda_as_on_the_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run_cuda(suite(), "test_vae_cuda"); }

#endif /* HAVE_CUDA */
