/* test_video.c -- media/video.h: Wan2.1's float-to-uint8 rule exactly, an
 * H.264 MP4 that probes and decodes back to what was written (PSNR above
 * 30 dB: CRF 18 on a smooth moving gradient gives about 45 dB, so 30 dB
 * catches a wrong colour matrix, a swapped channel or a shifted frame but
 * not the codec's own loss), the memory writer probing and decoding as
 * the file writer does, and clear refusals of what H.264 4:2:0 cannot hold. */
#include "media/video.h"
#include "base/error.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/support.h"

static char dir[64];
static void make_dir(void) { ts_mkdtemp(dir, sizeof dir, "video"); }
static void remove_dir(void) { ts_rmtree(dir); }

enum { F = 9, H = 48, W = 64 };

/* A gradient moving 3 pixels right and 2 down per frame, each channel its own. */
static uint8_t *pattern(void) {
    uint8_t *p = malloc((size_t)F * H * W * 3);
    ck_assert_ptr_nonnull(p);
    for (int f = 0; f < F; f++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                uint8_t *px = p + (((size_t)f * H + y) * W + x) * 3;
                px[0] = (uint8_t)(((x + 3 * f) * 255) / (W + 3 * F));
                px[1] = (uint8_t)(((y + 2 * f) * 255) / (H + 2 * F));
                px[2] = (uint8_t)(128 + 60 * sin((x + y + 4 * f) * 0.1));
            }
    return p;
}

static double psnr(const uint8_t *a, const uint8_t *b, size_t n) {
    double se = 0;
    for (size_t i = 0; i < n; i++) se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return se == 0 ? INFINITY : 10 * log10(255.0 * 255.0 / (se / (double)n));
}

START_TEST(test_frames_from_f32_is_wan_cache_video_exactly) {
    /* [3,F=1,H=1,W=8] */
    const float v[3 * 8] = {
        -1.0f, 1.0f, 0.0f, -3.0f, 2.5f, 0.5f, -0.5f, NAN,
        1.0f / 255 - 1, 2.0f / 255 - 1, 0.99f, -0.999f, 0.0039215f, 1e-7f, -1e-7f, 0.003922f,
        0, 0, 0, 0, 0, 0, 0, 0,
    };
    uint8_t rgb[8 * 3];
    video_frames_from_f32(v, 1, 1, 8, rgb);
    /* clamp, (x+1)/2, *255 in F32, truncated */
    const uint8_t r[8] = { 0, 255, 127, 0, 255, 191, 63, 0 };
    for (int i = 0; i < 8; i++) ck_assert_msg(rgb[i * 3] == r[i], "R[%d] = %d, want %d", i, rgb[i * 3], r[i]);
    for (int i = 0; i < 8; i++) {
        float x = v[8 + i] < -1 ? -1 : v[8 + i] > 1 ? 1 : v[8 + i];
        float y = (x + 1.0f) / 2.0f;
        float z = y * 255.0f;
        ck_assert_int_eq(rgb[i * 3 + 1], (int)z);
        ck_assert_int_eq(rgb[i * 3 + 2], 127);
    }
    /* the truncation rule: 1/255 - 1 lands just under or on 0.5 and 1.0 */
    ck_assert_int_le(rgb[0 * 3 + 1], 1);
    ck_assert_int_eq(rgb[2 * 3 + 1], 253); /* 0.99 -> 253.72 -> 253 */
    ck_assert_int_eq(rgb[3 * 3 + 1], 0);   /* -0.999 -> 0.1275 -> 0 */
}
END_TEST

START_TEST(test_frames_from_f32_reads_channel_planes_into_interleaved_pixels) {
    enum { FF = 2, HH = 2, WW = 3, P = FF * HH * WW };
    float v[3 * P];
    for (int c = 0; c < 3; c++)
        for (int p = 0; p < P; p++) v[c * P + p] = (float)(c * P + p) / (3 * P) * 2 - 1;
    uint8_t rgb[P * 3];
    video_frames_from_f32(v, FF, HH, WW, rgb);
    for (int p = 0; p < P; p++)
        for (int c = 0; c < 3; c++) {
            uint8_t one;
            float x = v[c * P + p];
            one = (uint8_t)(((x + 1.0f) / 2.0f) * 255.0f);
            ck_assert_int_eq(rgb[p * 3 + c], one);
        }
}
END_TEST

START_TEST(test_written_mp4_probes_as_h264_with_every_frame_and_decodes_close_to_the_input) {
    uint8_t *rgb = pattern();
    const char *path = ts_join(dir, "a.mp4");
    TS_OK(video_write_mp4(path, rgb, F, H, W, VIDEO_FPS_WAN));
    video_info_t vi;
    TS_OK(video_probe(path, &vi));
    ck_assert_int_eq(vi.frames, F);
    ck_assert_int_eq(vi.height, H);
    ck_assert_int_eq(vi.width, W);
    ck_assert_double_eq_tol(vi.fps, 16.0, 1e-9);
    ck_assert_str_eq(vi.codec, "h264");
    uint8_t *back = NULL;
    TS_OK(video_decode_rgb(path, &back, &vi));
    ck_assert_int_eq(vi.frames, F);
    for (int f = 0; f < F; f++) {
        size_t fb = (size_t)H * W * 3;
        double db = psnr(rgb + f * fb, back + f * fb, fb);
        ck_assert_msg(db > 30, "frame %d: PSNR %.1f dB", f, db);
        if (f > 0) /* the frame is its own, not its neighbour */
            ck_assert_msg(psnr(rgb + (f - 1) * fb, back + f * fb, fb) < db, "frame %d matches frame %d better", f, f - 1);
    }
    free(back);
    free(rgb);
}
END_TEST

START_TEST(test_memory_encode_probes_and_decodes_as_the_file_does) {
    /* Not byte for byte: libx264's SIMD code gives a few bytes more or less
     * on some encodes of the same frames in one process (media/video.c). */
    uint8_t *rgb = pattern();
    const char *path = ts_join(dir, "b.mp4"), *mpath = ts_join(dir, "b_mem.mp4");
    TS_OK(video_write_mp4(path, rgb, F, H, W, VIDEO_FPS_WAN));
    uint8_t *mem = NULL;
    size_t n = 0;
    TS_OK(video_encode_mp4(rgb, F, H, W, VIDEO_FPS_WAN, &mem, &n));
    ck_assert_uint_gt(n, 8);
    ck_assert_int_eq(memcmp(mem + 4, "ftyp", 4), 0); /* an MP4 from its first byte */
    ts_write_file(mpath, mem, n);
    video_info_t a, b;
    uint8_t *fa = NULL, *fb = NULL;
    TS_OK(video_decode_rgb(path, &fa, &a));
    TS_OK(video_decode_rgb(mpath, &fb, &b));
    ck_assert_int_eq(a.frames, b.frames);
    ck_assert_int_eq(a.height, b.height);
    ck_assert_int_eq(a.width, b.width);
    ck_assert_double_eq(a.fps, b.fps);
    ck_assert_str_eq(a.codec, b.codec);
    size_t bytes = (size_t)F * H * W * 3;
    ck_assert_msg(psnr(fa, fb, bytes) > 40, "file and memory decode %.1f dB apart", psnr(fa, fb, bytes));
    ck_assert_msg(psnr(rgb, fb, bytes) > 30, "memory encode %.1f dB from the input", psnr(rgb, fb, bytes));
    free(fa);
    free(fb);
    free(mem);
    free(rgb);
}
END_TEST

START_TEST(test_one_frame_and_other_fps_round_trip) {
    uint8_t *rgb = pattern();
    const char *path = ts_join(dir, "one.mp4");
    TS_OK(video_write_mp4(path, rgb, 1, H, W, 24));
    video_info_t vi;
    TS_OK(video_probe(path, &vi));
    ck_assert_int_eq(vi.frames, 1);
    ck_assert_double_eq_tol(vi.fps, 24.0, 1e-9);
    free(rgb);
}
END_TEST

START_TEST(test_odd_sizes_no_frames_and_bad_fps_are_refused_clearly) {
    uint8_t *rgb = pattern();
    uint8_t *out = (uint8_t *)1;
    size_t len = 1;
    const char *path = ts_join(dir, "odd.mp4");
    ck_assert_int_eq(video_write_mp4(path, rgb, F, 47, W, 16), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "even"));
    ck_assert_int_eq(video_encode_mp4(rgb, F, H, 63, 16, &out, &len), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "even"));
    ck_assert_ptr_null(out);
    ck_assert_uint_eq(len, 0);
    ck_assert_int_eq(video_write_mp4(path, rgb, 0, H, W, 16), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "frames"));
    ck_assert_int_eq(video_write_mp4(path, rgb, F, H, W, 0), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "fps"));
    ck_assert_int_eq(video_write_mp4(ts_join(dir, "no/such/dir.mp4"), rgb, F, H, W, 16), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_IO);
    free(rgb);
}
END_TEST

START_TEST(test_probe_of_a_missing_or_non_video_file_fails_naming_it) {
    video_info_t vi;
    const char *missing = ts_join(dir, "missing.mp4");
    ck_assert_int_eq(video_probe(missing, &vi), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "missing.mp4"));
    const char *junk = ts_join(dir, "junk.mp4");
    ts_write_file(junk, "this is not a video at all, just some text bytes", 48);
    ck_assert_int_eq(video_probe(junk, &vi), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "junk.mp4"));
    /* a text file FFmpeg would take for 'tty' art and "decode" */
    const char *text = ts_join(dir, "notes.txt");
    char lines[4096];
    size_t n = 0;
    for (int i = 0; i < 60; i++) n += (size_t)snprintf(lines + n, sizeof lines - n, "line %d of some notes\n", i);
    ts_write_file(text, lines, n);
    ck_assert_int_eq(video_probe(text, &vi), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "notes.txt"));
    /* a playlist naming another file: not followed */
    const char *m3u = ts_join(dir, "list.m3u8");
    const char *pl = "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nfile:///etc/passwd\n#EXT-X-ENDLIST\n";
    ts_write_file(m3u, pl, strlen(pl));
    ck_assert_int_eq(video_probe(m3u, &vi), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
}
END_TEST

START_TEST(test_ffprobe_counts_the_same_frames) {
    uint8_t *rgb = pattern();
    const char *path = ts_join(dir, "c.mp4");
    TS_OK(video_write_mp4(path, rgb, F, H, W, VIDEO_FPS_WAN));
    free(rgb);
    char cmd[512], line[128] = "";
    snprintf(cmd, sizeof cmd,
             "ffprobe -v error -count_frames -select_streams v:0 -show_entries "
             "stream=nb_read_frames,width,height,codec_name,avg_frame_rate -of csv=p=0 %s",
             path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, p));
    ck_assert_int_eq(pclose(p), 0);
    line[strcspn(line, "\n")] = '\0';
    ck_assert_str_eq(line, "h264,64,48,16/1,9");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("video");
    TCase *tc = tcase_create("core");
    tcase_add_unchecked_fixture(tc, make_dir, remove_dir);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_frames_from_f32_is_wan_cache_video_exactly);
    tcase_add_test(tc, test_frames_from_f32_reads_channel_planes_into_interleaved_pixels);
    tcase_add_test(tc, test_written_mp4_probes_as_h264_with_every_frame_and_decodes_close_to_the_input);
    tcase_add_test(tc, test_memory_encode_probes_and_decodes_as_the_file_does);
    tcase_add_test(tc, test_one_frame_and_other_fps_round_trip);
    tcase_add_test(tc, test_odd_sizes_no_frames_and_bad_fps_are_refused_clearly);
    tcase_add_test(tc, test_probe_of_a_missing_or_non_video_file_fails_naming_it);
    tcase_add_test(tc, test_ffprobe_counts_the_same_frames);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(suite()); }
