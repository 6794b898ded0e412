/* test_tokenizer.c -- media/tokenizer.h: Wan's prompt cleaning exactly
 * (Python's html.unescape twice, the `regex` module's \s collapsed, str.strip
 * at both ends), the end-of-sequence id kept last on truncation, and one
 * clear error per kind of bad model path.
 *
 * A small umT5-like model (unigram, eos 1, pad 0, unk 2, byte fallback) is
 * trained with Debian's spm_train in a temp folder the unchecked fixture
 * makes and removes (in the parent, so it goes even when a test dies).
 * tests/crosscheck/test_tokenizer.py compares the ids with Python's
 * sentencepiece over many prompts. */
#include "media/tokenizer.h"
#include "base/error.h"
#include "base/sha256.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/support.h"

static char dir[64];

static void train(const char *prefix, const char *extra) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "spm_train --input=%s/corpus.txt --model_prefix=%s/%s --vocab_size=360 --model_type=unigram "
             "--pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1 --byte_fallback=true --character_coverage=1.0 %s "
             ">%s/%s.log 2>&1",
             dir, dir, prefix, extra, dir, prefix);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_tokenizer: spm_train failed: %s (see deploy/install-deps.sh: package sentencepiece)\n", cmd);
        abort();
    }
}

static void make_models(void) {
    ts_mkdtemp(dir, sizeof dir, "tok");
    static const char *words[] = { "the", "a", "cat", "dog", "runs", "quickly", "over", "lazy", "fox", "river",
                                   "mountain", "sunset", "city", "night", "camera", "slowly", "pans", "across",
                                   "green", "field", "with", "flowers", "under", "blue", "sky", "一只", "猫", "在",
                                   "草地", "上", "奔跑", "café", "naïve", "résumé" };
    const size_t nw = sizeof words / sizeof *words;
    FILE *f = fopen(ts_join(dir, "corpus.txt"), "w");
    if (!f) abort();
    uint64_t s = 1;
    for (int line = 0; line < 3000; line++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        int n = 3 + (int)(s >> 60);
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            fprintf(f, "%s%s", i ? " " : "", words[(s >> 33) % nw]);
        }
        fputc('\n', f);
    }
    fclose(f);
    train("m", "");
    train("noeos", "--eos_id=-1 --bos_id=-1 --pad_id=0 --unk_id=1 --vocab_size=300");
    char sub[128];
    snprintf(sub, sizeof sub, "%s/release", dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/release %s/empty && cp %s/m.model %s/release/spiece.model", dir, dir, dir,
             dir);
    if (system(cmd) != 0) abort();
}

static void remove_models(void) { ts_rmtree(dir); }

/* tok_clean of in must give want. */
#define CLEAN_IS(in, want)                                                                     \
    do {                                                                                       \
        char out_[512];                                                                        \
        ck_assert_msg(tok_clean((in), out_, sizeof out_) == 0, "clean: %s", reel_err_text());  \
        ck_assert_msg(!strcmp(out_, (want)), "clean(\"%s\") = \"%s\", want \"%s\"", (in), out_, (want)); \
    } while (0)

START_TEST(test_clean_collapses_unicode_whitespace_runs_and_strips_the_ends) {
    CLEAN_IS("  a \t\n b  ", "a b");
    CLEAN_IS("a\xc2\xa0\xc2\xa0" "b", "a b");           /* U+00A0 */
    CLEAN_IS("a\xe3\x80\x80" "b", "a b");               /* U+3000 */
    CLEAN_IS("a\xe2\x80\x83\xe2\x80\x8a" "b", "a b");   /* U+2003 U+200A */
    CLEAN_IS("a\xe2\x80\xa8" "b\xe2\x80\xa9" "c", "a b c"); /* U+2028 U+2029 */
    CLEAN_IS("a\xc2\x85" "b", "a\xe2\x80\xa6" "b");     /* U+0085: ftfy reads a C1 control as Windows-1252 */
    CLEAN_IS("a\xe2\x80\x8b" "b", "a\xe2\x80\x8b" "b"); /* U+200B is not whitespace */
    CLEAN_IS("", "");
    CLEAN_IS(" \t\xe3\x80\x80 ", "");
}
END_TEST

START_TEST(test_clean_runs_ftfy_fixers_first_quotes_c1_ligatures_width_escapes_controls) {
    CLEAN_IS("cat\xe2\x80\x99s \xe2\x80\x9c" "best\xe2\x80\x9d", "cat's \"best\"");  /* curly quotes */
    CLEAN_IS("\xc2\x93q\xc2\x94 \xc2\x85", "\"q\" \xe2\x80\xa6");   /* C1 as Windows-1252, then uncurled */
    CLEAN_IS("\xef\xac\x81" "ne \xc5\x89", "fine 'n");                      /* fi ligature; U+0149 to U+02BC n to 'n */
    CLEAN_IS("\xef\xbc\xa1\xe3\x80\x80\xef\xbd\x82", "A b");           /* fullwidth A, U+3000, fullwidth b */
    CLEAN_IS("\x1b[36;44mblue\x1b[0m", "blue");                              /* ANSI escapes */
    CLEAN_IS("a\x0b" "b\x0c" "c\xef\xbb\xbf" "d", "ab c" "d");             /* VT and BOM removed, FF kept */
    CLEAN_IS("caf&EACUTE; STRA&SZLIG;E &nTILDE;", "caf\xc3\x89 STRASSE &nTILDE;");
    CLEAN_IS("&amp;amp;amp;lt;", "<");                                         /* ftfy to a fixed point, then twice */
    CLEAN_IS("&#59; &#x41g;", "; Ag;");                                        /* ftfy keeps both; html.unescape does not */
    CLEAN_IS("&amp;amp;\n<b>&amp;amp;amp;</b>", "& <b>&amp;</b>");             /* no ftfy unescape from the '<' line on */
    CLEAN_IS("\xef\xbc\x86" "lt\xef\xbc\x9b", "<");                           /* fullwidth & and ; make an entity */
}
END_TEST

START_TEST(test_clean_removes_information_separators_as_ftfy_does_before_the_whitespace_steps) {
    /* U+001C..U+001F are control characters to ftfy (removed), so neither
     * the `regex` module's \s nor str.strip() ever sees them */
    CLEAN_IS("\x1c" "a\x1f" "b\x1d", "ab");
    CLEAN_IS("a \x1e b", "a b");
}
END_TEST

START_TEST(test_clean_unescapes_html_twice_as_python_does) {
    CLEAN_IS("&amp; &lt; &gt; &quot; &#39; &apos;", "& < > \" ' '");
    CLEAN_IS("&#65;&#x42;&#X43;&#68", "ABCD");
    CLEAN_IS("&amp;lt;b&amp;gt;", "<b>");      /* twice */
    CLEAN_IS("&amp;amp;lt;", "<");             /* ftfy's unescape first, then twice */
    CLEAN_IS("<i>&amp;amp;lt;", "<i>&lt;");    /* twice only: ftfy unescapes no line with a '<' */
    CLEAN_IS("fish &amp chips", "fish & chips"); /* legacy name without ';' */
    CLEAN_IS("&ampx &notit;", "&x \xc2\xacit;"); /* longest listed prefix */
    CLEAN_IS("&foo; & &#; &#x; &", "&foo; & &#; &#x; &");
    CLEAN_IS("&#0;|&#128;|&#1;|&#xD800;|&#99999999999;|&#x110000;",
             "\xef\xbf\xbd|\xe2\x82\xac||\xef\xbf\xbd|\xef\xbf\xbd|\xef\xbf\xbd");
    CLEAN_IS("&#13;x&#10;y", "x y");           /* CR and LF become whitespace, then one space */
    CLEAN_IS("&NotNestedGreaterGreater;&fjlig;", "\xe2\xaa\xa2\xcc\xb8" "fj");
    CLEAN_IS("&eacute;t&eacute; &#x1F408;", "\xc3\xa9t\xc3\xa9 \xf0\x9f\x90\x88");
    CLEAN_IS("&nbsp;a&nbsp;&nbsp;b&nbsp;", "a b"); /* entities become whitespace before the collapse */
}
END_TEST

START_TEST(test_clean_refuses_invalid_utf8_and_an_output_that_does_not_fit) {
    char out[8];
    ck_assert_int_eq(tok_clean("a\xff" "b", out, sizeof out), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "UTF-8"));
    ck_assert_int_eq(tok_clean("\xed\xa0\x80", out, sizeof out), -1); /* a surrogate */
    ck_assert_int_eq(tok_clean("\xc0\xaf", out, sizeof out), -1);     /* overlong */
    ck_assert_int_eq(tok_clean("12345678", out, sizeof out), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_LIMIT);
    TS_OK(tok_clean("1234567", out, sizeof out));
}
END_TEST

START_TEST(test_open_reads_a_file_or_a_release_folder_with_eos_pad_vocab_and_identity) {
    tok_t *t, *u;
    TS_NEW(t = tok_open(ts_join(dir, "m.model")));
    TS_NEW(u = tok_open(ts_join(dir, "release")));
    ck_assert_int_eq(tok_eos_id(t), 1);
    ck_assert_int_eq(tok_pad_id(t), 0);
    ck_assert_int_eq(tok_vocab_size(t), 360);
    char hex[65], want[80];
    TS_OK(reel_sha256_file(ts_join(dir, "m.model"), hex));
    snprintf(want, sizeof want, "sha256:%s", hex);
    ck_assert_str_eq(tok_identity(t), want);
    ck_assert_str_eq(tok_identity(u), want);
    tok_close(&t);
    tok_close(&u);
    ck_assert_ptr_null(t);
    tok_close(&t);
    tok_close(NULL);
}
END_TEST

START_TEST(test_bad_model_paths_fail_with_one_clear_error_each) {
    ck_assert_ptr_null(tok_open(ts_join(dir, "missing.model")));
    ck_assert_int_eq(reel_err_code(), REEL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "missing.model"));
    ck_assert_ptr_null(tok_open(ts_join(dir, "corpus.txt")));
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "not a SentencePiece model"));
    ck_assert_ptr_null(tok_open(ts_join(dir, "empty")));
    ck_assert_int_eq(reel_err_code(), REEL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "without spiece.model"));
    ck_assert_ptr_null(tok_open(ts_join(dir, "noeos.model")));
    ck_assert_int_eq(reel_err_code(), REEL_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "end-of-sequence"));
}
END_TEST

START_TEST(test_encode_appends_eos_and_an_empty_prompt_is_eos_alone) {
    tok_t *t;
    TS_NEW(t = tok_open(ts_join(dir, "m.model")));
    int32_t ids[64];
    ck_assert_int_eq(tok_encode(t, "", 64, ids, 64), 1);
    ck_assert_int_eq(ids[0], 1);
    ck_assert_int_eq(tok_encode(t, " \t&nbsp; ", 64, ids, 64), 1);
    int n = tok_encode(t, "the cat runs over the green field", 64, ids, 64);
    ck_assert_int_gt(n, 2);
    ck_assert_int_eq(ids[n - 1], 1);
    for (int i = 0; i < n - 1; i++) ck_assert_int_gt(ids[i], 2); /* no eos, pad or unk inside */
    /* the cleaning is applied: spacing and entities do not change the ids */
    int32_t jds[64];
    ck_assert_int_eq(tok_encode(t, "  the&#32;cat\n\nruns over &#x74;he green\xe3\x80\x80" "field ", 64, jds, 64), n);
    ck_assert_int_eq(memcmp(ids, jds, (size_t)n * sizeof *ids), 0);
    tok_close(&t);
}
END_TEST

START_TEST(test_truncation_keeps_eos_last_and_the_leading_pieces) {
    tok_t *t;
    TS_NEW(t = tok_open(ts_join(dir, "m.model")));
    const char *p = "the cat runs quickly over the lazy dog under the blue sky 一只猫在草地上奔跑";
    int32_t full[128], cut[128];
    int n = tok_encode(t, p, 128, full, 128);
    ck_assert_int_gt(n, 8);
    for (int m = 1; m <= n + 1; m++) {
        int k = tok_encode(t, p, m, cut, 128);
        ck_assert_int_eq(k, m < n ? m : n);
        ck_assert_int_eq(cut[k - 1], 1);
        ck_assert_int_eq(memcmp(cut, full, (size_t)(k - 1) * sizeof *cut), 0);
    }
    ck_assert_int_eq(tok_encode(t, p, 1, cut, 1), 1); /* max_len 1: eos alone */
    ck_assert_int_eq(cut[0], 1);
    tok_close(&t);
}
END_TEST

START_TEST(test_encode_refuses_max_len_zero_a_small_cap_and_bad_utf8) {
    tok_t *t;
    TS_NEW(t = tok_open(ts_join(dir, "m.model")));
    int32_t ids[4];
    ck_assert_int_eq(tok_encode(t, "the cat", 0, ids, 4), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_int_eq(tok_encode(t, "the cat runs over the dog", 64, ids, 4), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_LIMIT);
    ck_assert_int_eq(tok_encode(t, "the cat runs over the dog", 4, ids, 4), 4); /* truncation makes it fit */
    ck_assert_int_eq(tok_encode(t, "\xff", 4, ids, 4), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    tok_close(&t);
}
END_TEST

START_TEST(test_bytes_outside_the_vocabulary_fall_back_to_byte_pieces_not_unk) {
    tok_t *t;
    TS_NEW(t = tok_open(ts_join(dir, "m.model")));
    int32_t ids[32];
    int n = tok_encode(t, "\xf0\x9f\x90\x88", 32, ids, 32); /* an emoji the corpus never had */
    ck_assert_int_ge(n, 5);                                  /* its 4 bytes (maybe after a "▁") + eos */
    for (int i = 0; i < n - 1; i++) ck_assert_int_ne(ids[i], 2);
    tok_close(&t);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("core");
    tcase_add_unchecked_fixture(tc, make_models, remove_models);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_clean_collapses_unicode_whitespace_runs_and_strips_the_ends);
    tcase_add_test(tc, test_clean_removes_information_separators_as_ftfy_does_before_the_whitespace_steps);
    tcase_add_test(tc, test_clean_runs_ftfy_fixers_first_quotes_c1_ligatures_width_escapes_controls);
    tcase_add_test(tc, test_clean_unescapes_html_twice_as_python_does);
    tcase_add_test(tc, test_clean_refuses_invalid_utf8_and_an_output_that_does_not_fit);
    tcase_add_test(tc, test_open_reads_a_file_or_a_release_folder_with_eos_pad_vocab_and_identity);
    tcase_add_test(tc, test_bad_model_paths_fail_with_one_clear_error_each);
    tcase_add_test(tc, test_encode_appends_eos_and_an_empty_prompt_is_eos_alone);
    tcase_add_test(tc, test_truncation_keeps_eos_last_and_the_leading_pieces);
    tcase_add_test(tc, test_encode_refuses_max_len_zero_a_small_cap_and_bad_utf8);
    tcase_add_test(tc, test_bytes_outside_the_vocabulary_fall_back_to_byte_pieces_not_unk);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(suite()); }
