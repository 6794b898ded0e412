/* test_t2v.c -- text to video around the DiT (model/t2v.h): a prompt's
 * context is the tokenizer's ids through the encoder, cut to their real
 * length and padded with zero rows to text_len; the prompt cache keeps
 * the most recent within its byte bound (hits, misses, evictions); the VAE
 * side decodes n latents to frames (each the single decode's) and one to an
 * MP4; every mismatch between the parts is refused with what differs;
 * release_find names a release folder's parts by their release names. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "media/tokenizer.h"
#include "media/video.h"
#include "model/release.h"
#include "model/t2v.h"
#include "model/t5.h"
#include "model/vae.h"
#include "tests/support.h"

static char g_dir[64];
static const char *g_t5, *g_tok, *g_vae;
static char g_t5p[256], g_tokp[256], g_vaep[256];

/* The parts, once: t5-tiny (dim 32), a tokenizer trained here, vae-tiny. */
static void parts(void) {
    if (g_t5) return;
    ts_mkdtemp(g_dir, sizeof g_dir, "t2v");
    snprintf(g_t5p, sizeof g_t5p, "%s", ts_join(g_dir, "t5.safetensors"));
    snprintf(g_vaep, sizeof g_vaep, "%s", ts_join(g_dir, "vae.safetensors"));
    snprintf(g_tokp, sizeof g_tokp, "%s", ts_join(g_dir, "spiece.model"));
    FILE *f = fopen(ts_join(g_dir, "corpus.txt"), "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 40; i++) fprintf(f, "line %d a cat on a skateboard ocean river sky tree bird\n", i);
    fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "spm_train --input=%s/corpus.txt --model_prefix=%s/spiece --vocab_size=300 "
             "--model_type=unigram --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1 --byte_fallback=true "
             "--character_coverage=1.0 --hard_vocab_limit=false >/dev/null 2>&1", g_dir, g_dir);
    ck_assert_msg(system(cmd) == 0, "spm_train failed (Debian's sentencepiece package)");
    t5_config_t tc;
    TS_OK(t5_config_builtin("t5-tiny", &tc));
    TS_OK(t5_weights_init(&tc, 3, KERN_F32, g_t5p));
    vae_config_t vc;
    TS_OK(vae_config_builtin("vae-tiny", &vc));
    TS_OK(vae_weights_init(&vc, 5, g_vaep));
    g_t5 = g_t5p;
    g_tok = g_tokp;
    g_vae = g_vaep;
}

/* After each test (in its own process under CK_FORK): its parts removed. */
static void teardown_parts(void) {
    if (g_dir[0]) ts_rmtree(g_dir);
    g_dir[0] = 0;
    g_t5 = g_tok = g_vae = NULL;
}

/* The context is the encoder's output for the tokenizer's ids, then zero rows. */
START_TEST(test_a_prompt_context_is_its_ids_through_the_encoder_padded_with_zero_rows) {
    parts();
    kern_backend_t *b;
    TS_NEW(b = kern_backend_cpu_new());
    const int64_t L = 16, D = 32;
    t2v_text_t *t;
    TS_NEW(t = t2v_text_new(b, g_t5, g_tok, L, D, 1 << 20));
    ck_assert_str_eq(t2v_text_name(t), "t5-tiny");
    float *ctx = NULL;
    int64_t rows = 0;
    TS_OK(t2v_text_context(t, "a cat on a skateboard", &ctx, &rows));
    tok_t *tok;
    TS_NEW(tok = tok_open(g_tok));
    int32_t ids[16];
    int n = tok_encode(tok, "a cat on a skateboard", (int)L, ids, (int)L);
    ck_assert_int_eq(rows, n);
    st_file_t *f;
    TS_NEW(f = st_open(g_t5));
    t5_model_t *m;
    TS_NEW(m = t5_model_load(b, f, KERN_F32));
    kern_stream_t *s;
    TS_NEW(s = kern_stream_new(b));
    float want[16 * 32];
    TS_OK(t5_encode(m, s, ids, n, 0, want));
    ck_assert_int_eq(memcmp(ctx, want, (size_t)n * D * sizeof(float)), 0);
    for (int64_t i = (int64_t)n * D; i < L * D; i++) ck_assert_float_eq(ctx[i], 0.0f);
    free(ctx);
    /* a prompt longer than text_len is cut there, eos last */
    char longp[2048] = "";
    for (int i = 0; i < 100; i++) strcat(longp, "ocean river ");
    TS_OK(t2v_text_context(t, longp, &ctx, &rows));
    ck_assert_int_eq(rows, L);
    free(ctx);
    kern_stream_destroy(&s);
    t5_model_destroy(&m);
    st_close(&f);
    tok_close(&tok);
    t2v_text_destroy(&t);
    kern_backend_destroy(&b);
}
END_TEST

/* LRU within the byte bound: hits, misses, the least recent evicted, an
 * entry larger than the bound never kept; a hit is the bitwise same. */
START_TEST(test_the_prompt_cache_keeps_the_most_recent_within_its_bound) {
    parts();
    kern_backend_t *b;
    TS_NEW(b = kern_backend_cpu_new());
    t2v_text_t *t;
    /* Prompts long enough to be cut at text_len 16, whatever the tokenizer
     * makes of them: every entry holds 16 rows of 32 floats (2 KiB) plus its
     * text (64 bytes) and its bookkeeping, so 5000 bytes hold two, not three. */
    TS_NEW(t = t2v_text_new(b, g_t5, g_tok, 16, 32, 5000));
    const char *p[3] = { "a cat on a skateboard, ocean river sky tree bird, line 1 line 2 line 3 !!!",
                         "a bird over the river, ocean river sky tree bird, line 4 line 5 line 6 ???",
                         "a tree by the ocean, sky tree bird ocean river sky, line 7 line 8 line 9 ..." };
    float *c0, *again, *x;
    int64_t r;
    TS_OK(t2v_text_context(t, p[0], &c0, &r));
    ck_assert_int_eq(r, 16); /* cut at text_len: the sizes above hold */
    TS_OK(t2v_text_context(t, p[0], &again, &r));
    ck_assert_int_eq(memcmp(c0, again, 16 * 32 * sizeof(float)), 0);
    free(again);
    t2v_text_stats_t st;
    t2v_text_stats(t, &st);
    ck_assert_uint_eq(st.misses, 1);
    ck_assert_uint_eq(st.hits, 1);
    ck_assert_uint_eq(st.entries, 1);
    TS_OK(t2v_text_context(t, p[1], &x, &r));
    free(x);
    TS_OK(t2v_text_context(t, p[2], &x, &r)); /* p[0] is the least recent: evicted */
    free(x);
    t2v_text_stats(t, &st);
    ck_assert_uint_eq(st.misses, 3);
    ck_assert_uint_eq(st.evictions, 1);
    ck_assert_uint_le(st.bytes, 5000);
    TS_OK(t2v_text_context(t, p[2], &x, &r)); /* the most recent: a hit */
    free(x);
    TS_OK(t2v_text_context(t, p[0], &again, &r)); /* evicted: encoded again, the same */
    ck_assert_int_eq(memcmp(c0, again, 16 * 32 * sizeof(float)), 0);
    free(again);
    free(c0);
    t2v_text_stats(t, &st);
    ck_assert_uint_eq(st.hits, 2);
    ck_assert_uint_eq(st.misses, 4);
    t2v_text_destroy(&t);
    /* a bound smaller than any entry: nothing is kept, every call encodes */
    TS_NEW(t = t2v_text_new(b, g_t5, g_tok, 16, 32, 100));
    for (int i = 0; i < 2; i++) {
        TS_OK(t2v_text_context(t, p[0], &x, &r));
        free(x);
    }
    t2v_text_stats(t, &st);
    ck_assert_uint_eq(st.hits, 0);
    ck_assert_uint_eq(st.misses, 2);
    ck_assert_uint_eq(st.entries, 0);
    t2v_text_destroy(&t);
    kern_backend_destroy(&b);
}
END_TEST

START_TEST(test_parts_that_do_not_fit_the_dit_are_refused_saying_what_differs) {
    parts();
    kern_backend_t *b;
    TS_NEW(b = kern_backend_cpu_new());
    ck_assert_ptr_null(t2v_text_new(b, g_t5, g_tok, 0, 32, 1024));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "text_len"));
    ck_assert_ptr_null(t2v_text_new(b, g_t5, g_tok, 16, 4096, 1024));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "text_dim 4096"));
    ck_assert_ptr_null(t2v_text_new(b, g_t5, ts_join(g_dir, "nowhere"), 16, 32, 1024));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "text encoder: "));
    ck_assert_ptr_null(t2v_vae_new(b, g_vae, 16));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "decodes 4 latent channels; the DiT makes 16"));
    ck_assert_ptr_null(t2v_vae_new(b, g_t5, 4)); /* not a VAE */
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "VAE: "));
    kern_backend_destroy(&b);
}
END_TEST

/* n latents decode to n videos of frames, each the single decode's; one
 * to an MP4 that probes as its frames. */
START_TEST(test_latents_decode_to_frames_and_one_to_an_mp4) {
    parts();
    kern_backend_t *b;
    TS_NEW(b = kern_backend_cpu_new());
    t2v_vae_t *v;
    TS_NEW(v = t2v_vae_new(b, g_vae, 4));
    const int64_t shape[4] = { 4, 2, 4, 4 };
    const size_t nl = 4 * 2 * 4 * 4, px = 5 * 32 * 32 * 3;
    float lat[2 * 4 * 2 * 4 * 4];
    ts_fill_uniform(lat, 2 * nl, 9, -1.0f, 1.0f);
    uint8_t *both = NULL, *one = NULL, *mp4 = NULL;
    size_t len = 0;
    TS_OK(t2v_vae_decode(v, lat, 2, shape, &both, NULL, NULL));
    TS_OK(t2v_vae_decode(v, lat + nl, 1, shape, &one, &mp4, &len));
    ck_assert_int_eq(memcmp(both + px, one, px), 0);
    ck_assert_uint_gt(len, 8);
    ck_assert_int_eq(memcmp(mp4 + 4, "ftyp", 4), 0);
    const char *path = ts_join(g_dir, "one.mp4");
    ts_write_file(path, mp4, len);
    video_info_t info;
    TS_OK(video_probe(path, &info));
    ck_assert_int_eq(info.frames, 5);
    ck_assert_int_eq(info.height, 32);
    ck_assert_int_eq(info.width, 32);
    free(both);
    free(one);
    free(mp4);
    t2v_vae_destroy(&v);
    kern_backend_destroy(&b);
}
END_TEST

START_TEST(test_a_release_folder_names_its_parts) {
    char d[64];
    ts_mkdtemp(d, sizeof d, "rel");
    release_parts_t p;
    TS_OK(release_find(d, &p));
    ck_assert_str_eq(p.t5, "");
    ck_assert_str_eq(p.vae, "");
    ck_assert_str_eq(p.tokenizer, "");
    ts_write_file(ts_join(d, RELEASE_T5_NAME), "x", 1);
    ts_write_file(ts_join(d, "Wan2.1_VAE.safetensors"), "x", 1);
    mkdir(ts_join(d, "google"), 0755);
    mkdir(ts_join(d, RELEASE_TOKENIZER_DIR), 0755);
    ts_write_file(ts_join(d, RELEASE_TOKENIZER_DIR "/spiece.model"), "x", 1);
    TS_OK(release_find(d, &p));
    ck_assert_str_eq(p.t5, ts_join(d, RELEASE_T5_NAME));
    ck_assert_str_eq(p.vae, ts_join(d, "Wan2.1_VAE.safetensors"));
    ck_assert_str_eq(p.tokenizer, ts_join(d, RELEASE_TOKENIZER_DIR));
    ck_assert_int_eq(release_find(ts_join(d, RELEASE_T5_NAME), &p), -1); /* a file, not a folder */
    ck_assert_int_eq(release_find(ts_join(d, "missing"), &p), -1);
    /* a part under its release name that is no file (a FIFO, a folder) is
     * still named, so its loader refuses it as "not a regular file" rather
     * than the folder being said to lack it (helper-75) */
    ck_assert_int_eq(unlink(ts_join(d, RELEASE_T5_NAME)), 0);
    ck_assert_int_eq(mkfifo(ts_join(d, RELEASE_T5_NAME), 0600), 0);
    ck_assert_int_eq(unlink(ts_join(d, RELEASE_TOKENIZER_DIR "/spiece.model")), 0);
    ck_assert_int_eq(mkdir(ts_join(d, RELEASE_TOKENIZER_DIR "/spiece.model"), 0755), 0);
    TS_OK(release_find(d, &p));
    ck_assert_str_eq(p.t5, ts_join(d, RELEASE_T5_NAME));
    ck_assert_str_eq(p.tokenizer, ts_join(d, RELEASE_TOKENIZER_DIR));
    kern_backend_t *b;
    TS_NEW(b = kern_backend_cpu_new());
    ck_assert_ptr_null(t2v_text_new(b, p.t5, p.tokenizer, 512, 32, 0));
    ck_assert_msg(strstr(reel_err_text(), "not a regular file"), "%s", reel_err_text());
    kern_backend_destroy(&b);
    ts_rmtree(d);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("t2v");
    TCase *t = tcase_create("t2v");
    tcase_set_timeout(t, 120);
    tcase_add_checked_fixture(t, NULL, teardown_parts);
    tcase_add_test(t, test_a_prompt_context_is_its_ids_through_the_encoder_padded_with_zero_rows);
    tcase_add_test(t, test_the_prompt_cache_keeps_the_most_recent_within_its_bound);
    tcase_add_test(t, test_parts_that_do_not_fit_the_dit_are_refused_saying_what_differs);
    tcase_add_test(t, test_latents_decode_to_frames_and_one_to_an_mp4);
    tcase_add_test(t, test_a_release_folder_names_its_parts);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return ts_run(suite()); }
