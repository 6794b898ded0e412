/* test_lora.c -- model/lora.h: PEFT adapters read in both key layouts, the
 * merge W + s·B·A (s = alpha/r, alpha/sqrt(r) with rsLoRA) against a plain
 * triple loop, refusals that name their cause, and merges always
 * recomputed from the exact base: alternating two adapters a thousand
 * times on a loaded model leaves its weights bitwise what the first
 * application gave, and a reload without an adapter returns the base.
 * DoRA (PEFT's use_dora): each merged row scaled to its magnitude, against
 * PEFT's formula in double, and its refusals.
 * tests/crosscheck/test_lora.py checks whole runs against numpy. */
#include "model/lora.h"
#include "base/error.h"
#include "kernels/backend.h"
#include "model/safetensors.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "tests/support.h"

static char dir[64];
static tdit_config_t tiny;

static void setup(void) {
    ts_mkdtemp(dir, sizeof dir, "lora");
    ck_assert_int_eq(tdit_config_builtin("tiny", &tiny), 0);
}

static void teardown(void) { ts_rmtree(dir); }

/* An adapter folder dir/name: config text cfg, and for each module m of
 * mods[] in every layer, A [r, in] and B [out, r] (values from seed),
 * under prefix + "blocks.N." + module name. */
static const char *make_adapter(const char *name, const char *cfg, const char *prefix, const char *const *mods,
                                int nmods, int r, uint64_t seed, kern_dtype_t dt) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", path);
    ck_assert_int_eq(system(cmd), 0);
    ts_write_file(ts_join(path, "adapter_config.json"), cfg, strlen(cfg));
    st_writer_t *w = st_writer_new();
    ck_assert_ptr_nonnull(w);
    for (int64_t n = 0; n < tiny.layers; n++)
        for (int i = 0; i < nmods; i++) {
            bool ffn0 = strstr(mods[i], "ffn.0") || strstr(mods[i], "net.0"), ffn2 = strstr(mods[i], "ffn.2") ||
                                                                                    strstr(mods[i], "net.2");
            int64_t out = ffn0 ? tiny.ffn_dim : tiny.dim, in = ffn2 ? tiny.ffn_dim : tiny.dim;
            int64_t sa[2] = { r, in }, sb[2] = { out, r };
            float *a = malloc((size_t)(r * in) * sizeof *a), *b = malloc((size_t)(out * r) * sizeof *b);
            ts_fill_uniform(a, (size_t)(r * in), seed + 2 * (uint64_t)(n * 16 + i), -0.5f, 0.5f);
            ts_fill_uniform(b, (size_t)(out * r), seed + 2 * (uint64_t)(n * 16 + i) + 1, -0.5f, 0.5f);
            char ka[160], kb[160];
            snprintf(ka, sizeof ka, "%sblocks.%lld.%s.lora_A.weight", prefix, (long long)n, mods[i]);
            snprintf(kb, sizeof kb, "%sblocks.%lld.%s.lora_B.weight", prefix, (long long)n, mods[i]);
            if (dt == KERN_F32) {
                ck_assert_int_eq(st_writer_add_f32(w, ka, 2, sa, a), 0);
                ck_assert_int_eq(st_writer_add_f32(w, kb, 2, sb, b), 0);
            } else {
                uint16_t *ha = malloc((size_t)(r * in) * 2), *hb = malloc((size_t)(out * r) * 2);
                for (int64_t j = 0; j < r * in; j++) ha[j] = kern_f32_to_bf16(a[j]);
                for (int64_t j = 0; j < out * r; j++) hb[j] = kern_f32_to_bf16(b[j]);
                ck_assert_int_eq(st_writer_add(w, ka, KERN_BF16, 2, sa, ha), 0);
                ck_assert_int_eq(st_writer_add(w, kb, KERN_BF16, 2, sb, hb), 0);
                free(ha);
                free(hb);
            }
            free(a);
            free(b);
        }
    ck_assert_int_eq(st_writer_save(w, ts_join(path, "adapter_model.safetensors")), 0);
    st_writer_destroy(&w);
    return path;
}

static const char *const attn[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o" };
static const char *const every[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                     "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2" };
static const char *const every_diffusers[] = { "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                                               "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
                                               "ffn.net.0.proj", "ffn.net.2" };
#define CFG(r, alpha, extra) "{\"peft_type\": \"LORA\", \"r\": " #r ", \"lora_alpha\": " #alpha extra "}"

/* Merges weight into w (D x D, the base weight) and checks it against
 * W + s·B·A computed by a plain loop. */
static void merge_matches(const lora_t *l, const char *weight, double s, float *w) {
    const lora_target_t *t = lora_find(l, weight);
    ck_assert_msg(t != NULL, "%s", weight);
    int64_t D = tiny.dim, r = t->rank;
    float *want = malloc((size_t)(D * D) * sizeof *want);
    for (int64_t i = 0; i < D; i++)
        for (int64_t j = 0; j < D; j++) {
            double acc = 0;
            for (int64_t k = 0; k < r; k++) acc += (double)t->b[i * r + k] * t->a[k * D + j];
            want[i * D + j] = (float)(w[i * D + j] + s * acc);
        }
    TS_OK(lora_merge_into(l, weight, w, D * D));
    ck_assert_msg(ts_max_abs_diff(w, want, (size_t)(D * D)) <= 1e-5, "%s", weight);
    free(want);
}

START_TEST(test_merge_is_w_plus_scale_b_times_a_and_rslora_divides_by_the_root_of_r) {
    for (int rs = 0; rs < 2; rs++) {
        const char *p = make_adapter(rs ? "rs" : "plain", rs ? CFG(4, 6, ", \"use_rslora\": true") : CFG(4, 6, ""),
                                     "base_model.model.", attn, 4, 4, 100, KERN_F32);
        lora_t *l;
        TS_NEW(l = lora_open(p));
        ck_assert_float_eq_tol(lora_scale(l), rs ? 6.0f / 2.0f : 6.0f / 4.0f, 1e-7f);
        ck_assert_int_eq(lora_n_targets(l), (int)(4 * tiny.layers));
        ck_assert_str_eq(lora_layout(l), "wan");
        TS_OK(lora_check(l, &tiny));
        int64_t D = tiny.dim;
        float *w = malloc((size_t)(D * D) * sizeof *w);
        ts_fill_uniform(w, (size_t)(D * D), 7, -1, 1);
        merge_matches(l, "blocks.1.self_attn.o.weight", lora_scale(l), w);
        /* a weight it does not target is left alone; a wrong size is refused */
        float keep = w[0];
        TS_OK(lora_merge_into(l, "blocks.0.ffn.0.weight", w, D * D));
        ck_assert_float_eq(w[0], keep);
        ck_assert_int_eq(lora_merge_into(l, "blocks.1.self_attn.o.weight", w, D * D - 1), -1);
        free(w);
        lora_close(&l);
    }
}
END_TEST

/* A new adapter folder dir/name, written into path, holding config cfg;
 * a writer for its tensors. */
static st_writer_t *adapter_begin(char *path, size_t cap, const char *name, const char *cfg) {
    snprintf(path, cap, "%s/%s", dir, name);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    ts_write_file(ts_join(path, "adapter_config.json"), cfg, strlen(cfg));
    st_writer_t *w = st_writer_new();
    ck_assert_ptr_nonnull(w);
    return w;
}

/* An adapter folder dir/name like make_adapter's, F32, with module i of
 * layer n at rank ranks[n * nmods + i]. */
static const char *make_mixed(const char *name, const char *cfg, const char *prefix, const char *const *mods,
                              int nmods, const int *ranks) {
    static char path[256];
    st_writer_t *w = adapter_begin(path, sizeof path, name, cfg);
    for (int64_t n = 0; n < tiny.layers; n++)
        for (int i = 0; i < nmods; i++) {
            int64_t r = ranks[n * nmods + i], D = tiny.dim, sa[2] = { r, D }, sb[2] = { D, r };
            float *a = malloc((size_t)(r * D) * sizeof *a), *b = malloc((size_t)(D * r) * sizeof *b);
            ts_fill_uniform(a, (size_t)(r * D), 40 + 2 * (uint64_t)(n * 16 + i), -0.5f, 0.5f);
            ts_fill_uniform(b, (size_t)(D * r), 41 + 2 * (uint64_t)(n * 16 + i), -0.5f, 0.5f);
            char ka[160], kb[160];
            snprintf(ka, sizeof ka, "%sblocks.%lld.%s.lora_A.weight", prefix, (long long)n, mods[i]);
            snprintf(kb, sizeof kb, "%sblocks.%lld.%s.lora_B.weight", prefix, (long long)n, mods[i]);
            ck_assert_int_eq(st_writer_add_f32(w, ka, 2, sa, a), 0);
            ck_assert_int_eq(st_writer_add_f32(w, kb, 2, sb, b), 0);
            free(a);
            free(b);
        }
    ck_assert_int_eq(st_writer_save(w, ts_join(path, "adapter_model.safetensors")), 0);
    st_writer_destroy(&w);
    return path;
}

/* weight's merge against W + s·B·A by a plain loop, s = alpha / r (or / sqrt(r)) */
static void merged_at(const lora_t *l, const char *weight, int64_t r, double alpha, bool rs) {
    const lora_target_t *t = lora_find(l, weight);
    ck_assert_msg(t != NULL, "%s", weight);
    ck_assert_int_eq(t->rank, r);
    double s = rs ? alpha / sqrt((double)r) : alpha / (double)r;
    ck_assert_msg(fabs(t->scale - s) <= 1e-6 * fabs(s), "%s: scale %g, want %g", weight, (double)t->scale, s);
    int64_t D = tiny.dim;
    float *w = malloc((size_t)(D * D) * sizeof *w);
    ts_fill_uniform(w, (size_t)(D * D), 9, -1, 1);
    merge_matches(l, weight, s, w);
    free(w);
}

/* PEFT's rank_pattern / alpha_pattern: each module takes the r and alpha of
 * the first key (in the config's order) matching its name as PEFT saw it,
 * re.match(rf"(.*\.)?({key})$", name), else the config's r and lora_alpha. */
START_TEST(test_rank_and_alpha_patterns_give_each_module_its_own_r_and_alpha) {
    /* q: r 4, alpha 6 (no key); k: 8 in block 1 (the first key), 2 elsewhere;
     * v: r 6, alpha 3; o: r 4, alpha 10 ("o" is no suffix of "self_attn.q") */
    const int ranks[] = { 4, 2, 6, 4, 4, 8, 6, 4 };
    ck_assert_int_eq(tiny.layers, 2);
    for (int rs = 0; rs < 2; rs++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 6, \"use_rslora\": %s, "
                 "\"rank_pattern\": {\"blocks\\\\.1\\\\.self_attn\\\\.k\": 8, \"self_attn.[k]\": 2, \"v\": 6}, "
                 "\"alpha_pattern\": {\"^(blocks\\\\.\\\\d+\\\\.)?self_attn\\\\.v\": 3, \"o\": 10}}",
                 rs ? "true" : "false");
        lora_t *l;
        TS_NEW(l = lora_open(make_mixed(rs ? "pat_rs" : "pat", cfg, "base_model.model.", attn, 4, ranks)));
        TS_OK(lora_check(l, &tiny));
        ck_assert_int_eq(lora_rank(l), 8);      /* the largest */
        ck_assert_float_eq(lora_scale(l), 0.0f); /* per target */
        for (int n = 0; n < 2; n++) {
            char wq[64], wk[64], wv[64], wo[64];
            snprintf(wq, sizeof wq, "blocks.%d.self_attn.q.weight", n);
            snprintf(wk, sizeof wk, "blocks.%d.self_attn.k.weight", n);
            snprintf(wv, sizeof wv, "blocks.%d.self_attn.v.weight", n);
            snprintf(wo, sizeof wo, "blocks.%d.self_attn.o.weight", n);
            merged_at(l, wq, 4, 6, rs);
            merged_at(l, wk, n ? 8 : 2, 6, rs);
            merged_at(l, wv, 6, 3, rs);
            merged_at(l, wo, 4, 10, rs);
        }
        lora_close(&l);
    }
    /* diffusers' names are the ones matched: "to_v" is attn1.to_v's and
     * attn2's; the lazy "attn.*?to_q" is the greedy one's match */
    static const char *const dq[] = { "attn1.to_q", "attn1.to_v", "attn2.to_v" };
    const int dr[] = { 4, 2, 2, 4, 2, 2 };
    lora_t *l;
    TS_NEW(l = lora_open(make_mixed("pat_dif", "{\"r\": 4, \"lora_alpha\": 4, \"rank_pattern\": {\"to_v\": 2}, "
                                    "\"alpha_pattern\": {\"attn.*?to_q\": 12}}", "transformer.", dq, 3, dr)));
    merged_at(l, "blocks.1.self_attn.q.weight", 4, 12, false);
    merged_at(l, "blocks.1.self_attn.v.weight", 2, 4, false);
    merged_at(l, "blocks.0.cross_attn.v.weight", 2, 4, false);
    lora_close(&l);
    /* a rank the pattern does not give: refused naming the module */
    const int two[] = { 4, 4, 2, 4, 4, 4, 4, 4 };
    ck_assert_ptr_null(lora_open(make_mixed("pat_bad", "{\"r\": 4, \"lora_alpha\": 4, \"rank_pattern\": "
                                            "{\"self_attn.k\": 4, \"self_attn.v\": 2}}", "", attn, 4, two)));
    ck_assert_msg(strstr(reel_err_text(), "rank 4 is not 2") && strstr(reel_err_text(), "module blocks.1.self_attn.v"),
                  "%s", reel_err_text());
    /* a Python regex POSIX has no equal of: refused naming its key */
    const int four[] = { 4, 4, 4, 4, 4, 4, 4, 4 };
    ck_assert_ptr_null(lora_open(make_mixed("pat_look", "{\"r\": 4, \"lora_alpha\": 4, \"alpha_pattern\": "
                                            "{\"(?<=self_attn\\\\.)q\": 2}}", "", attn, 4, four)));
    ck_assert_msg(strstr(reel_err_text(), "alpha_pattern key '(?<=self_attn\\.)q'"), "%s", reel_err_text());
    ck_assert_ptr_null(lora_open(make_mixed("pat_esc", "{\"r\": 4, \"lora_alpha\": 4, \"rank_pattern\": "
                                            "{\"\\\\bq\": 4}}", "", attn, 4, four)));
    ck_assert_msg(strstr(reel_err_text(), "rank_pattern key '\\bq'"), "%s", reel_err_text());
    ck_assert_ptr_null(lora_open(make_mixed("pat_r0", "{\"r\": 4, \"lora_alpha\": 4, \"rank_pattern\": "
                                            "{\"q\": 0}}", "", attn, 4, four)));
    ck_assert_msg(strstr(reel_err_text(), "rank_pattern 'q' must be a rank"), "%s", reel_err_text());
}
END_TEST

/* A counted repetition of a group that itself repeats by count grows
 * glibc's compiled regex by the product of the counts: the rank_pattern
 * key "((.{0,255}){255}){255}" held regcomp, and with it lora_open (a
 * reelctl run, a worker's sync), for minutes and gigabytes. Such a key is
 * refused at once naming it, and so is one whose counts add up past 255;
 * counts as trainers write them (blocks\.\d{1,2}\.) still read. */
START_TEST(test_a_pattern_key_that_repeats_a_counted_repetition_is_refused_not_compiled) {
    const int four[] = { 4, 4, 4, 4, 4, 4, 4, 4 };
    static const char *const bad[] = { "((.{0,255}){255}){255}", "(q{2}){3}", ".{0,200}.{0,56}", "q{256}" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cfg[256], name[32];
        snprintf(cfg, sizeof cfg, "{\"r\": 4, \"lora_alpha\": 4, \"rank_pattern\": {\"%s\": 2}}", bad[i]);
        snprintf(name, sizeof name, "pat_count%zu", i);
        ck_assert_ptr_null(lora_open(make_mixed(name, cfg, "", attn, 4, four)));
        ck_assert_msg(strstr(reel_err_text(), bad[i]) && strstr(reel_err_text(), "count"), "%s", reel_err_text());
    }
    lora_t *l;
    TS_NEW(l = lora_open(make_mixed("pat_count_ok", "{\"r\": 4, \"lora_alpha\": 4, \"rank_pattern\": "
                                    "{\"blocks\\\\.\\\\d{1,2}\\\\.self_attn\\\\.q{1}\": 4, \".{0,255}\": 4}}",
                                    "", attn, 4, four)));
    lora_close(&l);
}
END_TEST

/* A key as PEFT reads it: Python's re takes a '{' that starts no
 * quantifier ("a{x}", "a{", "{}", "a{1,2,3}") as a literal and reads
 * "{,n}" and "{,}", where glibc's ERE refused such a key (an adapter PEFT
 * loads refused) or counted otherwise; a '}' alone is a literal that a
 * '?' after it repeats ("a}?" matched only "a}"). What Python refuses
 * (nothing to repeat, a repeated repetition, {m,n} with m > n, "a)") is
 * refused. Each row is Python 3.11's answer, computed with /usr/bin/python3
 * as re.match(rf"(.*\.)?({key})$", name): 1, 0, or -1 for re.error. */
START_TEST(test_pattern_keys_match_module_names_as_pythons_re_reads_them) {
    static const struct {
        const char *key, *name;
        int python;
    } rows[] = {
        { "a{x}", "a{x}", 1 },
        { "a{", "a{", 1 },
        { "a{}", "a{}", 1 },
        { "a{1", "a{1", 1 },
        { "a{1,2,3}", "a{1,2,3}", 1 },
        { "{", "{", 1 },
        { "}", "}", 1 },
        { "{}", "{}", 1 },
        { "{x", "{x", 1 },
        { "q{1}{", "q{", 1 },
        { "a{,2}{", "aa{", 1 },
        { "a{x*}", "a{xx}", 1 },
        { "a{x*}", "a{}", 1 },
        { "a}?", "a", 1 },
        { "a}?", "a}", 1 },
        { "ffn.{0", "blocks.0.ffn.{0", 1 },
        { "a{,2}", "x.aa", 1 },
        { "a{,2}", "aaa", 0 },
        { "a{,}", "aaaa", 1 },
        { "a{2}", "aa", 1 },
        { "a{2}", "a{2}", 0 },
        { "a{02}", "aa", 1 },
        { "a{1,}?", "aaa", 1 },
        { "x{1}", "x", 1 },
        { "x{,1}y", "y", 1 },
        { "a{0}", "x.", 1 },
        { "a{0}", "x.a", 0 },
        { "a{1,2}?", "aa", 1 },
        { "blocks\\.\\d{1,2}\\.self_attn\\.q", "blocks.12.self_attn.q", 1 },
        { "blocks\\.\\d{1,2}\\.self_attn\\.q", "blocks.123.self_attn.q", 0 },
        { "blocks.[0-9]{2,}.ffn.0", "blocks.40.ffn.0", 1 },
        { "blocks.[0-9]{2,}.ffn.0", "blocks.4.ffn.0", 0 },
        { "{1,}", "a", -1 },
        { "{,1}", "a", -1 },
        { "x|{2}", "x", -1 },
        { "^{2}", "a", -1 },
        { "({1})", "a", -1 },
        { "a{2}{3}", "aaaaaa", -1 },
        { "a*{2}", "a", -1 },
        { "a**", "a", -1 },
        { "a?{2}", "a", -1 },
        { "a{1}?{2}", "a", -1 },
        { "a*??", "a", -1 },
        { "a{3,2}", "aaa", -1 },
        { "a{4294967295}", "a", -1 },
        { "*a", "a", -1 },
        { "a|*", "a", -1 },
        { "(*a)", "a", -1 },
        { "a)", "a", -1 },
        { "a*?", "aaa", 1 },
        { "a+?", "a", 1 },
        { "a|", "x.", 1 },
        { "a|", "a", 1 },
        { "|a", "a", 1 },
        { "()", "x.", 1 },
        { "self_attn.q", "blocks.0.self_attn.q", 1 },
        { "self_attn.q", "blocks.0.self_attnXq", 1 },
        { "elf_attn.q", "blocks.0.self_attn.q", 0 },
        { "blocks.1.self_attn.k", "blocks.11.self_attn.k", 0 },
        { "blocks\\.1.self_attn.k", "blocks.1.self_attn.k", 1 },
        { "blocks\\.1.self_attn.k", "blocks.1Xself_attn.k", 1 },
        { "q", "q", 1 },
        { "q", "x.q", 1 },
        { "q", "xq", 0 },
        { "to_out.0", "attn1.to_out.0", 1 },
        { "", "x.", 1 },
        { "", "q", 0 },
        { "\\.q", "x..q", 1 },
        { "\\.q", "x.q", 0 },
        { "q.", "q\n", 0 },
        { "q.", "q.", 1 },
        { "blocks.0.ffn.0", "xblocks.0.ffn.0", 0 },
        { "blocks.0.ffn.0", "x.blocks.0.ffn.0", 1 },
        { "ffn\\.0", "blocks.0.ffnX0", 0 },
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int got = lora_pattern_match(rows[i].key, rows[i].name);
        ck_assert_msg(got == rows[i].python, "key '%s', name '%s': %d, Python %d (%s)", rows[i].key, rows[i].name, got,
                      rows[i].python, got < 0 ? reel_err_text() : "");
        if (got < 0) ck_assert_msg(strstr(reel_err_text(), rows[i].key), "%s", reel_err_text());
    }
    /* what Python reads and Reel refuses, naming the key: a possessive
     * quantifier (Python 3.11's; an error before), nested counts, and a
     * ')' that would close PEFT's own group around the key */
    static const char *const refused[] = { "a{1,2}+", "(a{2}){3}", "a)|(b" };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ck_assert_int_eq(lora_pattern_match(refused[i], "a"), -1);
        ck_assert_msg(strstr(reel_err_text(), refused[i]), "%s", reel_err_text());
    }
    /* and in an adapter: keys with literal braces load (and match no
     * module), a {m} one gives its modules their rank */
    const int ranks[] = { 4, 2, 4, 4, 4, 2, 4, 4 };
    lora_t *l;
    TS_NEW(l = lora_open(make_mixed("pat_brace", "{\"r\": 4, \"lora_alpha\": 4, \"rank_pattern\": "
                                    "{\"self_attn.{q}\": 2, \"ffn.{0\": 2, \"self_attn.k{1}\": 2}}", "", attn, 4,
                                    ranks)));
    merged_at(l, "blocks.1.self_attn.k.weight", 2, 4, false);
    merged_at(l, "blocks.1.self_attn.q.weight", 4, 4, false);
    lora_close(&l);
}
END_TEST

/* An adapter folder dir/name of every block Linear in `blocks` blocks
 * (Wan's names under base_model.model., [8, 8] Linears), module i of
 * block n at rank rank_of(n), and config cfg. */
static const char *make_wide(const char *name, const char *cfg, int blocks, int (*rank_of)(int)) {
    static char path[256];
    st_writer_t *w = adapter_begin(path, sizeof path, name, cfg);
    float v[8 * LORA_MAX_RANK];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) v[i] = 0.01f * (float)(i % 7);
    for (int n = 0; n < blocks; n++)
        for (int i = 0; i < 10; i++) {
            int64_t r = rank_of(n), sa[2] = { r, 8 }, sb[2] = { 8, r };
            char ka[160], kb[160];
            snprintf(ka, sizeof ka, "base_model.model.blocks.%d.%s.lora_A.weight", n, every[i]);
            snprintf(kb, sizeof kb, "base_model.model.blocks.%d.%s.lora_B.weight", n, every[i]);
            ck_assert_int_eq(st_writer_add_f32(w, ka, 2, sa, v), 0);
            ck_assert_int_eq(st_writer_add_f32(w, kb, 2, sb, v), 0);
        }
    ck_assert_int_eq(st_writer_save(w, ts_join(path, "adapter_model.safetensors")), 0);
    st_writer_destroy(&w);
    return path;
}

static int rank_2_below_100(int n) { return n < 100 ? 2 : 1; }

static double ms_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* A config with a key per module, as tools that allocate ranks per layer
 * write it (1,000 rank_pattern keys, 300 alpha_pattern keys), against an
 * adapter of 4,000 modules (8,000 tensors): every module gets the first
 * matching key's r and alpha. Each key was a regex run for every matrix
 * (8,000 x 1,300: lora_open took 5.3 s on 2 cores); a key that is a
 * module's name is now compared as characters, and a module's name is
 * matched once. Its time is printed, not asserted. */
START_TEST(test_a_thousand_pattern_keys_against_thousands_of_modules_give_each_its_own_r_and_alpha) {
    enum { BLOCKS = 400 };
    char *cfg = malloc(LORA_CONFIG_MAX);
    ck_assert_ptr_nonnull(cfg);
    for (int form = 0; form < 2; form++) {
        /* form 0: literal module names (PEFT's own, dots unescaped), and
         * escaped ones for alpha; form 1: regexes, one per block */
        int o = snprintf(cfg, LORA_CONFIG_MAX, "{\"r\": 1, \"lora_alpha\": 4, \"rank_pattern\": {");
        for (int n = 0; n < 100; n++)
            for (int i = 0; i < (form ? 1 : 10); i++)
                o += snprintf(cfg + o, (size_t)(LORA_CONFIG_MAX - o), "%s\"blocks.%d.%s\": 2", n || i ? ", " : "", n,
                              form ? "((self|cross)_attn\\\\.[qkvo]|ffn\\\\.[02])" : every[i]);
        o += snprintf(cfg + o, (size_t)(LORA_CONFIG_MAX - o), "}, \"alpha_pattern\": {");
        for (int n = 100; n < 130; n++)
            for (int i = 0; i < (form ? 1 : 10); i++)
                o += snprintf(cfg + o, (size_t)(LORA_CONFIG_MAX - o), "%s\"blocks\\\\.%d\\\\.%s\": 8",
                              n > 100 || i ? ", " : "", n, form ? "(self|cross)_attn\\\\.[qkvo]" : every[i]);
        o += snprintf(cfg + o, (size_t)(LORA_CONFIG_MAX - o), "}}");
        ck_assert_int_lt(o, LORA_CONFIG_MAX);
        const char *p = make_wide(form ? "wide_re" : "wide", cfg, BLOCKS, rank_2_below_100);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        lora_t *l;
        TS_NEW(l = lora_open(p));
        fprintf(stderr, "test_lora: lora_open of %d modules against %s keys (%d bytes of config) took %.0f ms\n",
                BLOCKS * 10, form ? "100 + 30 regex" : "1000 + 300 literal", o, ms_since(&t0));
        ck_assert_int_eq(lora_n_targets(l), BLOCKS * 10);
        /* literal keys run no regex; regex keys run once per module and
         * key up to the first that matches, not once per matrix */
        long runs = 0;
        for (int n = 0; form && n < BLOCKS; n++)
            for (int i = 0; i < 10; i++)
                runs += (n < 100 ? n + 1 : 100) + (n >= 100 && n < 130 && i < 8 ? n - 99 : 30);
        ck_assert_int_eq(lora_regex_runs(l), runs);
        for (int n = 0; n < BLOCKS; n++)
            for (int i = 0; i < 10; i++) {
                char wt[80];
                snprintf(wt, sizeof wt, "blocks.%d.%s.weight", n, every[i]);
                const lora_target_t *t = lora_find(l, wt);
                ck_assert_msg(t != NULL, "%s", wt);
                /* form 1's alpha keys name attention only: the FFN keeps lora_alpha */
                double alpha = n >= 100 && n < 130 && (!form || i < 8) ? 8 : 4;
                ck_assert_msg(t->rank == rank_2_below_100(n) && t->alpha == alpha, "%s: rank %lld alpha %g", wt,
                              (long long)t->rank, t->alpha);
            }
        lora_close(&l);
    }
    free(cfg);
}
END_TEST

START_TEST(test_diffusers_names_and_bf16_map_to_the_same_weights_as_wan_names) {
    const char *p = make_adapter("dif", CFG(2, 2, ""), "transformer.", every_diffusers, 10, 2, 5, KERN_BF16);
    lora_t *l;
    TS_NEW(l = lora_open(p));
    ck_assert_str_eq(lora_layout(l), "diffusers");
    ck_assert_int_eq(lora_n_targets(l), (int)(10 * tiny.layers));
    for (int i = 0; i < 10; i++) {
        char want[96];
        snprintf(want, sizeof want, "blocks.0.%s.weight", every[i]);
        ck_assert_msg(lora_find(l, want) != NULL, "%s", want);
    }
    int64_t D = tiny.dim, H = tiny.ffn_dim, r = 2; /* BF16: 2 bytes a value */
    ck_assert_uint_eq(lora_bytes(l), (size_t)(tiny.layers * (8 * (r * D + D * r) + (r * D + H * r) + (r * H + D * r)) * 2));
    TS_OK(lora_check(l, &tiny));
    lora_close(&l);
}
END_TEST

/* lora_open(path) must fail naming `needle`. */
static void refused(const char *path, const char *needle) {
    lora_t *l = lora_open(path);
    ck_assert_msg(l == NULL, "%s: accepted", path);
    ck_assert_msg(strstr(reel_err_text(), needle) != NULL, "%s: '%s' does not name '%s'", path, reel_err_text(),
                  needle);
}

/* One LoRA matrix pair (and alpha > 0: its alpha key) of rank r for
 * module m of layer n into w, keys `pre` + blocks.n. + m (or kohya's
 * pre + blocks_n_ + m with '_' for '.') + the suffixes down/up. */
static void add_pair(st_writer_t *w, const char *pre, bool kohya, int64_t n, const char *m, int64_t r,
                     const char *down, const char *up, float alpha, uint64_t seed) {
    bool ffn0 = strstr(m, "ffn.0") || strstr(m, "net.0"), ffn2 = strstr(m, "ffn.2") || strstr(m, "net.2");
    int64_t out = ffn0 ? tiny.ffn_dim : tiny.dim, in = ffn2 ? tiny.ffn_dim : tiny.dim;
    int64_t sa[2] = { r, in }, sb[2] = { out, r };
    float *a = malloc((size_t)(r * in) * sizeof *a), *b = malloc((size_t)(out * r) * sizeof *b);
    ts_fill_uniform(a, (size_t)(r * in), seed, -0.5f, 0.5f);
    ts_fill_uniform(b, (size_t)(out * r), seed + 1, -0.5f, 0.5f);
    char mod[96], ka[200], kb[200], kal[200];
    snprintf(mod, sizeof mod, "%s", m);
    if (kohya)
        for (char *c = mod; *c; c++)
            if (*c == '.') *c = '_';
    snprintf(ka, sizeof ka, kohya ? "%sblocks_%lld_%s.%s.weight" : "%sblocks.%lld.%s.%s.weight", pre, (long long)n, mod, down);
    snprintf(kb, sizeof kb, kohya ? "%sblocks_%lld_%s.%s.weight" : "%sblocks.%lld.%s.%s.weight", pre, (long long)n, mod, up);
    snprintf(kal, sizeof kal, kohya ? "%sblocks_%lld_%s.alpha" : "%sblocks.%lld.%s.alpha", pre, (long long)n, mod);
    ck_assert_int_eq(st_writer_add_f32(w, ka, 2, sa, a), 0);
    ck_assert_int_eq(st_writer_add_f32(w, kb, 2, sb, b), 0);
    if (alpha > 0) ck_assert_int_eq(st_writer_add_f32(w, kal, 0, sa, &alpha), 0);
    free(a);
    free(b);
}

/* Saves *w at path and frees it. */
static void written(st_writer_t **w, const char *path) {
    TS_OK(st_writer_save(*w, path));
    st_writer_destroy(w);
}

/* The scale of target `weight` of l (asserting it is there). */
static float scale_of(const lora_t *l, const char *weight) {
    const lora_target_t *t = lora_find(l, weight);
    ck_assert_msg(t != NULL, "%s", weight);
    return t->scale;
}

/* An adapter without adapter_config.json takes the file's own config, as
 * diffusers loads it: diffusers' save_lora_weights file (its folder holds
 * pytorch_lora_weights.safetensors only) with each target's rank from its
 * matrices and s = 1, or with diffusers' lora_adapter_metadata; ComfyUI's
 * Wan LoRA (diffusion_model. + lora_down / lora_up, a module's alpha:
 * s = alpha / rank) and kohya's (lora_unet_blocks_N_self_attn_q). Each
 * target merges with its own scale; mixing an alpha key with a config's
 * lora_alpha, an alpha without matrices and matrices of two ranks are
 * refused by name. */
START_TEST(test_adapters_without_a_config_take_the_files_own_ranks_and_alphas) {
    char path[256];
    /* diffusers: no config, ranks 2 and 3 */
    snprintf(path, sizeof path, "%s/dsaved", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    st_writer_t *w = st_writer_new();
    add_pair(w, "transformer.", false, 0, "attn1.to_q", 2, "lora_A", "lora_B", 0, 1);
    add_pair(w, "transformer.", false, 1, "ffn.net.2", 3, "lora_A", "lora_B", 0, 3);
    written(&w, ts_join(path, "pytorch_lora_weights.safetensors"));
    ck_assert(lora_is_adapter(path));
    lora_t *l;
    TS_NEW(l = lora_open(path));
    ck_assert_str_eq(lora_layout(l), "diffusers");
    ck_assert_int_eq(lora_rank(l), 3);
    ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.q.weight"), 1.0f);
    ck_assert_float_eq(scale_of(l, "blocks.1.ffn.2.weight"), 1.0f);
    TS_OK(lora_check(l, &tiny));
    /* the merge uses the target's scale: W + 1·B·A */
    const lora_target_t *t = lora_find(l, "blocks.1.ffn.2.weight");
    int64_t O = t->out, I = t->in, r = t->rank;
    float *wt = calloc((size_t)(O * I), sizeof *wt);
    TS_OK(lora_merge_into(l, "blocks.1.ffn.2.weight", wt, O * I));
    double acc = 0;
    for (int64_t k = 0; k < r; k++) acc += (double)t->b[5 * r + k] * t->a[k * I + 7];
    ck_assert_double_le(fabs(wt[5 * I + 7] - acc), 1e-6);
    free(wt);
    lora_close(&l);
    /* the same file with diffusers' metadata: r 2, lora_alpha 8 (s = 4) */
    w = st_writer_new();
    add_pair(w, "transformer.", false, 0, "attn1.to_q", 2, "lora_A", "lora_B", 0, 1);
    TS_OK(st_writer_meta(w, "lora_adapter_metadata", "{\"transformer.r\": 2, \"transformer.lora_alpha\": 8, "
                                                     "\"transformer.peft_type\": \"LORA\", \"transformer.use_dora\": false}"));
    written(&w, ts_join(path, "pytorch_lora_weights.safetensors"));
    TS_NEW(l = lora_open(ts_join(path, "pytorch_lora_weights.safetensors")));
    ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.q.weight"), 4.0f);
    ck_assert_float_eq(lora_scale(l), 4.0f);
    lora_close(&l);
    /* ComfyUI: one file, lora_down / lora_up, alphas 8 (rank 4: s = 2) and none (s = 1) */
    w = st_writer_new();
    add_pair(w, "diffusion_model.", false, 0, "self_attn.q", 4, "lora_down", "lora_up", 8, 5);
    add_pair(w, "diffusion_model.", false, 1, "cross_attn.o", 4, "lora_down", "lora_up", 0, 7);
    const char *comfy = ts_join(dir, "wan_comfy.safetensors");
    written(&w, comfy);
    ck_assert(lora_is_adapter(comfy));
    TS_NEW(l = lora_open(comfy));
    ck_assert_str_eq(lora_layout(l), "wan");
    ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.q.weight"), 2.0f);
    ck_assert_float_eq(scale_of(l, "blocks.1.cross_attn.o.weight"), 1.0f);
    ck_assert_float_eq(lora_scale(l), 0.0f); /* per target */
    char desc[512];
    TS_OK(lora_describe(l, desc, sizeof desc));
    ck_assert_msg(strstr(desc, "\"config\":\"per target\""), "%s", desc);
    lora_close(&l);
    /* ComfyUI's / ai-toolkit's diffusion_model.<Wan name>.lora_A / lora_B
     * without .alpha keys, and a diffusers file (transformer.) under a name
     * of its own: no name PEFT saves, and diffusers' Wan loader takes them
     * at s = 1 (_convert_non_diffusers_wan_lora_to_diffusers) */
    w = st_writer_new();
    add_pair(w, "diffusion_model.", false, 0, "self_attn.q", 4, "lora_A", "lora_B", 0, 5);
    add_pair(w, "diffusion_model.", false, 1, "ffn.2", 4, "lora_A", "lora_B", 0, 7);
    const char *comfy_ab = ts_join(dir, "wan_ai_toolkit.safetensors");
    written(&w, comfy_ab);
    TS_NEW(l = lora_open(comfy_ab));
    ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.q.weight"), 1.0f);
    ck_assert_float_eq(scale_of(l, "blocks.1.ffn.2.weight"), 1.0f);
    TS_OK(lora_check(l, &tiny));
    lora_close(&l);
    w = st_writer_new();
    add_pair(w, "transformer.", false, 0, "attn1.to_q", 2, "lora_A", "lora_B", 0, 1);
    const char *renamed = ts_join(dir, "my_wan_style.safetensors");
    written(&w, renamed);
    TS_NEW(l = lora_open(renamed));
    ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.q.weight"), 1.0f);
    lora_close(&l);
    /* kohya / musubi-tuner: lora_unet_blocks_0_self_attn_k, ffn_0; alpha 1 at rank 4: s = 0.25 */
    w = st_writer_new();
    add_pair(w, "lora_unet_", true, 0, "self_attn.k", 4, "lora_down", "lora_up", 1, 9);
    add_pair(w, "lora_unet_", true, 1, "ffn.0", 4, "lora_down", "lora_up", 1, 11);
    const char *kohya = ts_join(dir, "kohya.safetensors");
    written(&w, kohya);
    TS_NEW(l = lora_open(kohya));
    ck_assert_str_eq(lora_layout(l), "kohya");
    ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.k.weight"), 0.25f);
    ck_assert_float_eq(scale_of(l, "blocks.1.ffn.0.weight"), 0.25f);
    TS_OK(lora_check(l, &tiny));
    lora_close(&l);
    /* a PEFT folder whose adapter_config.json did not come along: nothing
     * says its scale (s = alpha / r is in the missing config), so refused
     * rather than merged at s = 1; as a SYNC by value whose sender read it
     * ("{}"), or under diffusers' file name, it is the file's own */
    snprintf(path, sizeof path, "%s/peftnocfg", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    w = st_writer_new();
    add_pair(w, "base_model.model.", false, 0, "self_attn.q", 4, "lora_A", "lora_B", 0, 13);
    written(&w, ts_join(path, "adapter_model.safetensors"));
    refused(path, "nothing in it says its scale");
    st_file_t *pf;
    TS_NEW(pf = st_open(ts_join(path, "adapter_model.safetensors")));
    TS_NEW(l = lora_parse("{}", 2, "lora_config", pf, NULL));
    ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.q.weight"), 1.0f);
    lora_close(&l);
    st_close(&pf);
    /* a weights file of a model is not an adapter */
    const char *model = ts_join(dir, "model.safetensors");
    ts_tiny_weights(3, model);
    ck_assert(!lora_is_adapter(model));
    /* refusals */
    snprintf(path, sizeof path, "%s/alphacfg", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    w = st_writer_new();
    add_pair(w, "", false, 0, "self_attn.q", 4, "lora_down", "lora_up", 8, 5);
    written(&w, ts_join(path, "adapter_model.safetensors"));
    ts_write_file(ts_join(path, "adapter_config.json"), CFG(4, 8, ""), strlen(CFG(4, 8, "")));
    refused(path, "a module's alpha beside a config's lora_alpha");
    float one = 1;
    int64_t sa[2] = { 4, 64 }, sb[2] = { 64, 3 };
    float *z = calloc(64 * 4, sizeof *z);
    w = st_writer_new();
    TS_OK(st_writer_add_f32(w, "diffusion_model.blocks.0.self_attn.q.alpha", 0, sa, &one));
    written(&w, ts_join(dir, "alphaonly.safetensors"));
    refused(ts_join(dir, "alphaonly.safetensors"), "has an alpha and no matrices");
    /* a negative module alpha turns the adapter's sign (as a negative
     * lora_alpha does); 0 is refused (kohya's rank or diffusers' nothing) */
    float negative = -2, zero = 0;
    w = st_writer_new();
    add_pair(w, "diffusion_model.", false, 0, "self_attn.q", 4, "lora_down", "lora_up", 0, 21);
    TS_OK(st_writer_add_f32(w, "diffusion_model.blocks.0.self_attn.q.alpha", 0, sa, &negative));
    written(&w, ts_join(dir, "negalpha.safetensors"));
    TS_NEW(l = lora_open(ts_join(dir, "negalpha.safetensors")));
    ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.q.weight"), -0.5f);
    lora_close(&l);
    w = st_writer_new();
    add_pair(w, "diffusion_model.", false, 0, "self_attn.q", 4, "lora_down", "lora_up", 0, 21);
    TS_OK(st_writer_add_f32(w, "diffusion_model.blocks.0.self_attn.q.alpha", 0, sa, &zero));
    written(&w, ts_join(dir, "zeroalpha.safetensors"));
    refused(ts_join(dir, "zeroalpha.safetensors"), "alpha 0 (a finite value, not 0");
    w = st_writer_new();
    TS_OK(st_writer_add_f32(w, "diffusion_model.blocks.0.self_attn.q.lora_down.weight", 2, sa, z));
    TS_OK(st_writer_add_f32(w, "diffusion_model.blocks.0.self_attn.q.lora_up.weight", 2, sb, z));
    written(&w, ts_join(dir, "tworanks.safetensors"));
    refused(ts_join(dir, "tworanks.safetensors"), "its other matrix's is");
    /* kohya's DoRA: its magnitude as dora_scale beside the two matrices */
    w = st_writer_new();
    int64_t sm[2] = { 1, 64 };
    TS_OK(st_writer_add_f32(w, "lora_unet_blocks_0_self_attn_q.lora_down.weight", 2, sa, z));
    TS_OK(st_writer_add_f32(w, "lora_unet_blocks_0_self_attn_q.lora_up.weight", 2, (int64_t[2]){ 64, 4 }, z));
    TS_OK(st_writer_add_f32(w, "lora_unet_blocks_0_self_attn_q.dora_scale", 2, sm, z));
    written(&w, ts_join(dir, "kdora.safetensors"));
    refused(ts_join(dir, "kdora.safetensors"), "kohya's / LyCORIS' DoRA");
    free(z);
}
END_TEST

START_TEST(test_refusals_name_their_cause) {
    refused(make_adapter("bias", CFG(4, 8, ", \"bias\": \"all\""), "", attn, 4, 4, 1, KERN_F32), "bias training");
    refused(make_adapter("mts", CFG(4, 8, ", \"modules_to_save\": [\"head\"]"), "", attn, 4, 4, 1, KERN_F32),
            "modules_to_save");
    refused(make_adapter("big", CFG(257, 8, ""), "", attn, 4, 4, 1, KERN_F32), "above 256");
    refused(make_adapter("norank", "{\"lora_alpha\": 8}", "", attn, 4, 4, 1, KERN_F32), "r must be");
    refused(make_adapter("loha", CFG(4, 8, ", \"peft_type\": \"LOHA\""), "", attn, 4, 4, 1, KERN_F32), "peft_type");
    refused(make_adapter("rank", CFG(8, 8, ""), "", attn, 4, 4, 1, KERN_F32), "is not the config's r");
    static const char *const norm[] = { "norm3" };
    refused(make_adapter("norm", CFG(4, 8, ""), "", norm, 1, 4, 1, KERN_F32), "unknown target");
    const char *p = make_adapter("badjson", CFG(4, 8, ""), "", attn, 4, 4, 1, KERN_F32);
    ts_write_file(ts_join(p, "adapter_config.json"), "{\"r\": 4,", 8);
    refused(p, "adapter_config.json");
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none", dir);
    refused(missing, "no such adapter");
    /* a shape the model does not have: lora_check names the weight */
    lora_t *l;
    TS_NEW(l = lora_open(make_adapter("ok", CFG(4, 8, ""), "", attn, 4, 4, 1, KERN_F32)));
    tdit_config_t wide = tiny;
    wide.dim *= 2;
    wide.heads *= 2;
    ck_assert_int_eq(lora_check(l, &wide), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "shape mismatch"));
    tdit_config_t shallow = tiny;
    shallow.layers = 1;
    ck_assert_int_eq(lora_check(l, &shallow), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "does not have"));
    lora_close(&l);
    /* a FIFO (or /dev/zero) where a file should be: refused at once, never
     * waited on or read forever (helper-75: run --lora and weights inspect
     * hung) -- as the adapter file, and as a folder's adapter_config.json */
    char fifo[256];
    snprintf(fifo, sizeof fifo, "%s/fifo.safetensors", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert(!lora_is_adapter(fifo));
    refused(fifo, "not a regular file");
    const char *fc = make_adapter("fifocfg", CFG(4, 8, ""), "", attn, 4, 4, 1, KERN_F32);
    char fcp[256];
    snprintf(fcp, sizeof fcp, "%s/adapter_config.json", fc);
    ck_assert_int_eq(unlink(fcp), 0);
    ck_assert_int_eq(mkfifo(fcp, 0600), 0);
    refused(fc, "not a regular file");
    /* a scale that would take the merged weights past F32's range */
    TS_NEW(l = lora_open(make_adapter("huge", CFG(4, 1e38, ""), "", attn, 4, 4, 1, KERN_F32)));
    ck_assert_int_eq(lora_check(l, &tiny), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "could overflow F32"));
    lora_close(&l);
}
END_TEST

/* PEFT merges (B·A)·s: B·A is formed in F32 before the scale, so a tiny
 * scale cannot bring back values B·A took past F32's range. A scale of
 * 1e-30 on B and A of 1e30 passed lora_check (s·r·max|B|·max|A| = 1e30)
 * and the merge wrote infinities into the weight (tests/fuzz/fuzz_lora.c
 * found it); now lora_check refuses it by the unscaled product. */
START_TEST(test_a_tiny_scale_does_not_let_b_times_a_past_f32s_range) {
    char path[256];
    snprintf(path, sizeof path, "%s/tiny_scale", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    const char *cfg = "{\"peft_type\": \"LORA\", \"r\": 1, \"lora_alpha\": 1e-30}";
    ts_write_file(ts_join(path, "adapter_config.json"), cfg, strlen(cfg));
    int64_t D = tiny.dim, sa[2] = { 1, D }, sb[2] = { D, 1 };
    float *big = malloc((size_t)D * sizeof *big);
    for (int64_t j = 0; j < D; j++) big[j] = 1e30f;
    st_writer_t *w = st_writer_new();
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(st_writer_add_f32(w, "base_model.model.blocks.0.self_attn.q.lora_A.weight", 2, sa, big), 0);
    ck_assert_int_eq(st_writer_add_f32(w, "base_model.model.blocks.0.self_attn.q.lora_B.weight", 2, sb, big), 0);
    ck_assert_int_eq(st_writer_save(w, ts_join(path, "adapter_model.safetensors")), 0);
    st_writer_destroy(&w);
    free(big);
    lora_t *l;
    TS_NEW(l = lora_open(path));
    ck_assert_int_eq(lora_check(l, &tiny), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "could overflow F32"));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "blocks.0.self_attn.q.weight"));
    lora_close(&l);
}
END_TEST

/* A file without alphas whose targets' ranks differ (ComfyUI's and
 * ai-toolkit's diffusion_model. names, diffusers' transformer. names):
 * every target at s = 1, ComfyUI's rule (no alpha: 1.0) and diffusers'
 * since it mirrors ranks into alphas; not the first module's rank over
 * each one's (r_first / r_m: 0.5 and 0.25 here), which diffusers' older
 * get_peft_kwargs gave (lora_alpha = the first lora_B's rank). */
START_TEST(test_alpha_less_files_of_mixed_ranks_take_s_1_per_target_not_the_first_ranks_ratio) {
    const char *pre[] = { "diffusion_model.", "transformer." };
    const char *q[] = { "self_attn.q", "attn1.to_q" }, *k[] = { "self_attn.k", "attn1.to_k" },
               *f2[] = { "ffn.2", "ffn.net.2" };
    for (int i = 0; i < 2; i++) {
        st_writer_t *w = st_writer_new();
        add_pair(w, pre[i], false, 0, q[i], 2, "lora_A", "lora_B", 0, 21);
        add_pair(w, pre[i], false, 0, k[i], 4, "lora_A", "lora_B", 0, 23);
        add_pair(w, pre[i], false, 1, f2[i], 8, "lora_A", "lora_B", 0, 25);
        char name[64];
        snprintf(name, sizeof name, "mixed_ranks_%d.safetensors", i);
        const char *path = ts_join(dir, name);
        written(&w, path);
        lora_t *l;
        TS_NEW(l = lora_open(path));
        ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.q.weight"), 1.0f);
        ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.k.weight"), 1.0f);
        ck_assert_float_eq(scale_of(l, "blocks.1.ffn.2.weight"), 1.0f);
        ck_assert_int_eq(lora_rank(l), 8);
        TS_OK(lora_check(l, &tiny));
        lora_close(&l);
    }
}
END_TEST

/* What a test of a loaded model stands on: the tiny config's weights (from
 * seed) written to dir/name and opened, and a CPU backend to load them on.
 * Fails the test when either cannot be had; rig_close releases both. */
typedef struct {
    st_file_t *f;
    kern_backend_t *b;
} rig_t;

static rig_t rig_open(const char *name, uint64_t seed) {
    rig_t r;
    const char *path = ts_join(dir, name);
    ts_tiny_weights(seed, path);
    TS_NEW(r.f = st_open(path));
    TS_NEW(r.b = kern_backend_cpu_new());
    return r;
}

static void rig_close(rig_t *r) {
    kern_backend_destroy(&r->b);
    st_close(&r->f);
}

/* The model's weights, copied to the host. */
static float *snapshot(const tdit_model_t *m, size_t *n) {
    size_t bytes = tdit_model_bytes(m);
    float *p = malloc(bytes);
    memcpy(p, tdit_model_weights(m), bytes); /* CPU backend: the arena is host memory */
    *n = bytes / sizeof(float);
    return p;
}

START_TEST(test_a_thousand_alternating_merges_leave_no_drift_and_no_adapter_returns_the_base) {
    rig_t rig = rig_open("w.safetensors", 3);
    st_file_t *f = rig.f;
    kern_backend_t *b = rig.b;
    lora_t *x, *y;
    TS_NEW(x = lora_open(make_adapter("x", CFG(4, 8, ""), "base_model.model.", every, 10, 4, 11, KERN_F32)));
    TS_NEW(y = lora_open(make_adapter("y", CFG(2, 4, ", \"use_rslora\": true"), "transformer.", every_diffusers, 10,
                                      2, 12, KERN_BF16)));
    tdit_model_t *m;
    TS_NEW(m = tdit_model_load(b, f, KERN_F32));
    size_t n;
    float *base = snapshot(m, &n);
    tdit_weight_edit_t ex = lora_edit(x, true), ey = lora_edit(y, true);
    TS_OK(tdit_model_reload_edit(m, f, &ex));
    float *first_x = snapshot(m, &n);
    ck_assert_int_ne(memcmp(first_x, base, n * sizeof(float)), 0);
    TS_OK(tdit_model_reload_edit(m, f, &ey));
    float *first_y = snapshot(m, &n);
    for (int i = 0; i < 1000; i++) {
        TS_OK(tdit_model_reload_edit(m, f, (i & 1) ? &ey : &ex));
        const float *want = (i & 1) ? first_y : first_x;
        ck_assert_msg(!memcmp(tdit_model_weights(m), want, n * sizeof(float)), "sync %d drifted", i);
    }
    TS_OK(tdit_model_reload(m, f));
    ck_assert_msg(!memcmp(tdit_model_weights(m), base, n * sizeof(float)), "a reload without an adapter is the base");
    /* a first load with the adapter equals the base plus a reload with it */
    tdit_weight_edit_t all = lora_edit(x, false);
    tdit_model_t *m2;
    TS_NEW(m2 = tdit_model_load_edit(b, f, KERN_F32, &all));
    ck_assert(!memcmp(tdit_model_weights(m2), first_x, n * sizeof(float)));
    ck_assert_ptr_null(tdit_model_load_edit(b, f, KERN_F32, &ex)); /* a first load copies every weight */
    tdit_model_destroy(&m2);
    free(base);
    free(first_x);
    free(first_y);
    tdit_model_destroy(&m);
    lora_close(&x);
    lora_close(&y);
    rig_close(&rig);
}
END_TEST

/* One F32 tensor of the given shape, values uniform in [lo, hi), into w. */
static void add_values(st_writer_t *w, const char *key, int ndim, const int64_t *shape, uint64_t seed, float lo,
                       float hi) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    float *v = malloc((size_t)n * sizeof *v);
    ts_fill_uniform(v, (size_t)n, seed, lo, hi);
    TS_OK(st_writer_add_f32(w, key, ndim, shape, v));
    free(v);
}

/* Full differences as ComfyUI, diffusers and lightx2v's / CausVid's Wan
 * LoRAs carry them: X.diff adds to X.weight and X.diff_b to X.bias, at
 * scale 1, for any weight (norms, biases, the patch embedding, the head);
 * the Linears outside the blocks take lora_down / lora_up too; PEFT's
 * lora_B.bias adds s times itself. A model loaded with the adapter is
 * bitwise the model loaded from a file holding base + difference (and
 * base + s·B·A where there is a low-rank part). */
START_TEST(test_differences_add_to_any_weight_and_outside_linears_take_a_lora) {
    const int64_t D = tiny.dim, C = tiny.in_channels;
    const char *base = ts_join(dir, "base.safetensors");
    char basep[256];
    snprintf(basep, sizeof basep, "%s", base);
    ts_tiny_weights(21, basep);
    /* ComfyUI's names: diffusion_model. + Wan's */
    st_writer_t *w = st_writer_new();
    add_pair(w, "diffusion_model.", false, 0, "self_attn.q", 4, "lora_down", "lora_up", 8, 31);
    add_values(w, "diffusion_model.blocks.0.self_attn.q.diff_b", 1, (int64_t[]){ D }, 33, -0.5f, 0.5f);
    add_values(w, "diffusion_model.blocks.0.norm3.diff", 1, (int64_t[]){ D }, 34, -0.5f, 0.5f);
    add_values(w, "diffusion_model.blocks.0.norm3.diff_b", 1, (int64_t[]){ D }, 35, -0.5f, 0.5f);
    add_values(w, "diffusion_model.blocks.1.cross_attn.norm_k.diff", 1, (int64_t[]){ D }, 36, -0.5f, 0.5f);
    add_values(w, "diffusion_model.blocks.1.ffn.2.diff", 2, (int64_t[]){ D, tiny.ffn_dim }, 37, -0.5f, 0.5f);
    add_values(w, "diffusion_model.patch_embedding.diff", 5, (int64_t[]){ D, C, 1, 2, 2 }, 38, -0.5f, 0.5f);
    add_values(w, "diffusion_model.time_projection.1.diff_b", 1, (int64_t[]){ 6 * D }, 39, -0.5f, 0.5f);
    add_values(w, "diffusion_model.head.head.lora_down.weight", 2, (int64_t[]){ 2, D }, 40, -0.5f, 0.5f);
    add_values(w, "diffusion_model.head.head.lora_up.weight", 2, (int64_t[]){ 4 * C, 2 }, 41, -0.5f, 0.5f);
    add_values(w, "diffusion_model.head.head.diff_b", 1, (int64_t[]){ 4 * C }, 42, -0.5f, 0.5f);
    add_values(w, "diffusion_model.text_embedding.0.lora_down.weight", 2, (int64_t[]){ 2, tiny.text_dim }, 43, -0.5f,
               0.5f);
    add_values(w, "diffusion_model.text_embedding.0.lora_up.weight", 2, (int64_t[]){ D, 2 }, 44, -0.5f, 0.5f);
    /* the modulations: lightx2v's X.diff_m, and X.diff of a parameter without ".weight" (as ComfyUI maps it) */
    add_values(w, "diffusion_model.blocks.1.diff_m", 3, (int64_t[]){ 1, 6, D }, 45, -0.5f, 0.5f);
    add_values(w, "diffusion_model.head.modulation.diff", 3, (int64_t[]){ 1, 2, D }, 46, -0.5f, 0.5f);
    const char *comfy = ts_join(dir, "causvid_like.safetensors");
    char comfyp[256];
    snprintf(comfyp, sizeof comfyp, "%s", comfy);
    written(&w, comfyp);
    ck_assert(lora_is_adapter(comfyp));
    lora_t *l;
    TS_NEW(l = lora_open(comfyp));
    TS_OK(lora_check(l, &tiny));
    ck_assert_str_eq(lora_layout(l), "wan");
    const lora_target_t *t = lora_find(l, "blocks.0.norm3.bias");
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_null(t->a);
    ck_assert_float_eq(t->d_scale, 1.0f);
    ck_assert_ptr_nonnull(lora_find(l, "patch_embedding.weight"));
    ck_assert_ptr_nonnull(lora_find(l, "text_embedding.0.weight"));
    ck_assert_float_eq(scale_of(l, "blocks.0.self_attn.q.weight"), 2.0f); /* alpha 8, rank 4 */
    ck_assert_float_eq(scale_of(l, "head.head.weight"), 1.0f);             /* no alpha: s = 1 */
    char desc[512];
    TS_OK(lora_describe(l, desc, sizeof desc));
    ck_assert_ptr_nonnull(lora_find(l, "blocks.1.modulation"));
    ck_assert_ptr_nonnull(lora_find(l, "head.modulation"));
    ck_assert_msg(strstr(desc, "\"diffs\":10") && strstr(desc, "norm3") && strstr(desc, "head.head") &&
                  strstr(desc, "patch_embedding"), "%s", desc);
    /* a difference alone is exactly added */
    float zero[64] = { 0 };
    TS_OK(lora_merge_into(l, "blocks.0.norm3.bias", zero, D));
    for (int64_t i = 0; i < D; i++) ck_assert_float_eq(zero[i], t->d[i]);

    /* the oracle: a weights file holding every merged value, written here */
    st_file_t *bf;
    TS_NEW(bf = st_open(basep));
    w = st_writer_new();
    int changed = 0;
    for (size_t i = 0; i < st_count(bf); i++) {
        const st_tensor_t *bt = st_at(bf, i);
        int64_t n = 1;
        for (int d = 0; d < bt->ndim; d++) n *= bt->shape[d];
        float *v = malloc((size_t)n * sizeof *v);
        TS_OK(st_read_f32(bf, bt->name, bt->ndim, bt->shape, v));
        const lora_target_t *g = lora_find(l, bt->name);
        if (g) {
            changed++;
            ck_assert(!(g->a && g->d)); /* none here has both */
            if (g->a) /* s·B·A by the merge itself (test_merge_is_w_plus_scale_b_times_a checks it) */
                TS_OK(lora_merge_into(l, bt->name, v, n));
            else
                for (int64_t j = 0; j < n; j++) v[j] += g->d[j];
        }
        TS_OK(st_writer_add_f32(w, bt->name, bt->ndim, bt->shape, v));
        free(v);
    }
    ck_assert_int_eq(changed, lora_n_targets(l));
    const char *merged = ts_join(dir, "merged.safetensors");
    char mergedp[256];
    snprintf(mergedp, sizeof mergedp, "%s", merged);
    const char *keys[] = { "config", "dim", "heads", "layers", "ffn_dim", "in_channels", "text_dim", "freq_dim" };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (st_meta(bf, keys[i])) TS_OK(st_writer_meta(w, keys[i], st_meta(bf, keys[i])));
    written(&w, mergedp);
    kern_backend_t *b;
    TS_NEW(b = kern_backend_cpu_new());
    st_file_t *mf;
    TS_NEW(mf = st_open(mergedp));
    tdit_model_t *want, *got, *again;
    TS_NEW(want = tdit_model_load(b, mf, KERN_F32));
    tdit_weight_edit_t all = lora_edit(l, false), only = lora_edit(l, true);
    TS_NEW(got = tdit_model_load_edit(b, bf, KERN_F32, &all));
    ck_assert_int_eq(tdit_model_bytes(got), tdit_model_bytes(want));
    ck_assert_msg(!memcmp(tdit_model_weights(got), tdit_model_weights(want), tdit_model_bytes(want)),
                  "the adapter's merge is base + difference");
    /* a LoRA sync in place (only the targets copied again) gives the same */
    TS_NEW(again = tdit_model_load(b, bf, KERN_F32));
    ck_assert(memcmp(tdit_model_weights(again), tdit_model_weights(want), tdit_model_bytes(want)));
    TS_OK(tdit_model_reload_edit(again, bf, &only));
    ck_assert(!memcmp(tdit_model_weights(again), tdit_model_weights(want), tdit_model_bytes(want)));
    tdit_model_destroy(&want);
    tdit_model_destroy(&got);
    tdit_model_destroy(&again);
    kern_backend_destroy(&b);
    st_close(&mf);
    st_close(&bf);
    lora_close(&l);

    /* a difference for every weight of the model: its description still
     * fits a worker's ack (512 bytes), the modules past 192 bytes counted */
    size_t nw;
    tdit_weight_t *all_w = tdit_config_weights(&tiny, &nw);
    ck_assert_ptr_nonnull(all_w);
    w = st_writer_new();
    for (size_t i = 0; i < nw; i++) {
        char key[160];
        const char *nm = all_w[i].name;
        size_t ln = strlen(nm);
        if (ln > 7 && !strcmp(nm + ln - 7, ".weight")) snprintf(key, sizeof key, "diffusion_model.%.*s.diff", (int)(ln - 7), nm);
        else if (ln > 5 && !strcmp(nm + ln - 5, ".bias")) snprintf(key, sizeof key, "diffusion_model.%.*s.diff_b", (int)(ln - 5), nm);
        else snprintf(key, sizeof key, "diffusion_model.%s.diff", nm); /* a modulation */
        add_values(w, key, all_w[i].ndim, all_w[i].shape, 90 + i, -0.01f, 0.01f);
    }
    free(all_w);
    char everyp[256];
    snprintf(everyp, sizeof everyp, "%s", ts_join(dir, "every.safetensors"));
    written(&w, everyp);
    TS_NEW(l = lora_open(everyp));
    TS_OK(lora_check(l, &tiny));
    ck_assert_int_eq(lora_n_targets(l), (int)nw);
    char small[512];
    TS_OK(lora_describe(l, small, sizeof small));
    ck_assert_msg(strstr(small, " more\"") && strstr(small, "\"modules\":\"patch_embedding,"), "%s", small);
    lora_close(&l);

    /* PEFT's lora_bias: lora_B.bias adds s times itself (r 4, alpha 8: s = 2) */
    char path[256];
    snprintf(path, sizeof path, "%s/peftbias", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    w = st_writer_new();
    add_pair(w, "base_model.model.", false, 1, "ffn.0", 4, "lora_A", "lora_B", 0, 51);
    add_values(w, "base_model.model.blocks.1.ffn.0.lora_B.bias", 1, (int64_t[]){ tiny.ffn_dim }, 52, -1, 1);
    written(&w, ts_join(path, "adapter_model.safetensors"));
    const char *cfg = CFG(4, 8, ", \"lora_bias\": true");
    ts_write_file(ts_join(path, "adapter_config.json"), cfg, strlen(cfg));
    TS_NEW(l = lora_open(path));
    TS_OK(lora_check(l, &tiny));
    t = lora_find(l, "blocks.1.ffn.0.bias");
    ck_assert_ptr_nonnull(t);
    ck_assert_float_eq(t->d_scale, 2.0f);
    float *bias = calloc((size_t)tiny.ffn_dim, sizeof *bias);
    TS_OK(lora_merge_into(l, "blocks.1.ffn.0.bias", bias, tiny.ffn_dim));
    for (int64_t i = 0; i < tiny.ffn_dim; i++) ck_assert_float_eq(bias[i], 2.0f * t->d[i]);
    free(bias);
    lora_close(&l);
    /* the same file under a config that does not say "lora_bias": true
     * (PEFT would drop the key): refused naming it, as is a lora_bias
     * that is not a boolean */
    static const char *const not_said[] = { "", ", \"lora_bias\": false", ", \"lora_bias\": null" };
    for (size_t i = 0; i < sizeof not_said / sizeof not_said[0]; i++) {
        char c[256];
        snprintf(c, sizeof c, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8%s}", not_said[i]);
        ts_write_file(ts_join(path, "adapter_config.json"), c, strlen(c));
        refused(path, "does not say \"lora_bias\": true");
    }
    cfg = CFG(4, 8, ", \"lora_bias\": \"yes\"");
    ts_write_file(ts_join(path, "adapter_config.json"), cfg, strlen(cfg));
    refused(path, "lora_bias must be true or false");
    /* with no config the key says it, as diffusers reads it (the file
     * says its scale by a module alpha: 4 over rank 4, s = 1) */
    w = st_writer_new();
    add_pair(w, "diffusion_model.", false, 1, "ffn.0", 4, "lora_A", "lora_B", 4, 51);
    add_values(w, "diffusion_model.blocks.1.ffn.0.lora_B.bias", 1, (int64_t[]){ tiny.ffn_dim }, 52, -1, 1);
    written(&w, ts_join(dir, "biasnocfg.safetensors"));
    TS_NEW(l = lora_open(ts_join(dir, "biasnocfg.safetensors")));
    TS_OK(lora_check(l, &tiny));
    t = lora_find(l, "blocks.1.ffn.0.bias");
    ck_assert_ptr_nonnull(t);
    ck_assert_float_eq(t->d_scale, 1.0f);
    lora_close(&l);
}
END_TEST

/* What a difference may not be: refused by name, nothing changed. */
START_TEST(test_differences_refused_name_their_cause) {
    struct {
        const char *key;
        int ndim;
        int64_t shape[2];
        const char *key2; /* a second tensor, or NULL */
        const char *needle;
        bool at_check; /* refused by lora_check, not lora_open */
    } cases[] = {
        { "diffusion_model.blocks.0.norm3.diff", 1, { 32 }, NULL, "shape mismatch", true },
        { "diffusion_model.blocks.0.self_attn.q.diff", 2, { 4, 64 }, NULL, "shape mismatch", true },
        { "diffusion_model.blocks.0.modulation.diff", 1, { 64 }, NULL, "shape mismatch", true },
        { "diffusion_model.blocks.1.diff_m", 1, { 64 }, NULL, "shape mismatch", true },
        { "diffusion_model.blocks.0.norm1.diff", 1, { 64 }, NULL, "does not have", true }, /* Wan's norm1 has no weight */
        { "diffusion_model.blocks.01.norm3.diff", 1, { 64 }, NULL, "does not have", true },
        { "diffusion_model.blocks.9223372036854775808.time_projection.1.diff_b", 1, { 384 }, NULL, "does not have",
          true },
        { "diffusion_model.blocks.-1.head.head.diff_b", 1, { 16 }, NULL, "unknown target", false },
        { "diffusion_model.blocks.-1.head.head.lora_down.weight", 2, { 2, 64 }, NULL, "unknown target", false },
        { "diffusion_model.blocks.+0.self_attn.q.lora_down.weight", 2, { 2, 64 }, NULL, "unknown target", false },
        { "diffusion_model.blocks.7.norm3.diff", 1, { 64 }, NULL, "does not have", true },
        { "diffusion_model.blocks.0.self_attn.q.diff_b", 1, { 64 }, "diffusion_model.blocks.0.self_attn.q.lora_B.bias",
          "a second difference", false },
        { "transformer.blocks.0.attn1.to_q.lora_B.bias", 1, { 64 }, NULL, "without its Linear's lora_A", false },
        { "lora_unet_blocks_0_norm3.diff", 1, { 64 }, NULL, "kohya's names", false },
        { "base_model.model.blocks.0.self_attn.q.bias", 1, { 64 }, NULL, "bias training", false },
        { "diffusion_model.blocks.0.self_attn..diff", 1, { 64 }, NULL, "unknown target", false },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        st_writer_t *w = st_writer_new();
        add_values(w, cases[i].key, cases[i].ndim, cases[i].shape, 60 + i, -1, 1);
        if (cases[i].key2) add_values(w, cases[i].key2, cases[i].ndim, cases[i].shape, 70 + i, -1, 1);
        char path[256];
        snprintf(path, sizeof path, "%s/refused%zu.safetensors", dir, i);
        written(&w, path);
        if (!cases[i].at_check) {
            refused(path, cases[i].needle);
            continue;
        }
        lora_t *l = lora_open(path);
        ck_assert_msg(l != NULL, "%s: %s", cases[i].key, reel_err_text());
        ck_assert_msg(lora_check(l, &tiny) == -1, "%s passed the check", cases[i].key);
        ck_assert_msg(strstr(reel_err_text(), cases[i].needle), "%s: '%s'", cases[i].key, reel_err_text());
        lora_close(&l);
    }
    /* a non-finite difference */
    st_writer_t *w = st_writer_new();
    float v[64] = { 0 };
    v[9] = NAN;
    TS_OK(st_writer_add_f32(w, "diffusion_model.blocks.0.norm3.diff", 1, (int64_t[]){ 64 }, v));
    written(&w, ts_join(dir, "nan.safetensors"));
    refused(ts_join(dir, "nan.safetensors"), "NaN or infinite");
    /* a difference that could leave F32's range */
    w = st_writer_new();
    for (int i = 0; i < 64; i++) v[i] = 2e37f;
    TS_OK(st_writer_add_f32(w, "diffusion_model.blocks.0.norm3.diff", 1, (int64_t[]){ 64 }, v));
    written(&w, ts_join(dir, "huge.safetensors"));
    lora_t *l;
    TS_NEW(l = lora_open(ts_join(dir, "huge.safetensors")));
    ck_assert_int_eq(lora_check(l, &tiny), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "could overflow F32"));
    lora_close(&l);
}
END_TEST

/* ---- DoRA (PEFT's use_dora) --------------------------------------------------------- */

/* A DoRA adapter folder dir/name: config cfg; for every layer and module
 * of mods, lora_A / lora_B (add_pair) and, unless mods[i] is `skip`, its
 * magnitude of out + extra values uniform in [0.5, 2) under prefix +
 * blocks.N. + module + msuf (PEFT's ".lora_magnitude_vector"). */
static const char *make_dora(const char *name, const char *cfg, const char *prefix, const char *const *mods, int nmods,
                             int64_t r, uint64_t seed, const char *msuf, int extra, const char *skip) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    ts_write_file(ts_join(path, "adapter_config.json"), cfg, strlen(cfg));
    st_writer_t *w = st_writer_new();
    for (int64_t n = 0; n < tiny.layers; n++)
        for (int i = 0; i < nmods; i++) {
            uint64_t sd = seed + 4 * (uint64_t)(n * 16 + i);
            add_pair(w, prefix, false, n, mods[i], r, "lora_A", "lora_B", 0, sd);
            if (skip && !strcmp(skip, mods[i])) continue;
            bool ffn0 = strstr(mods[i], "ffn.0") || strstr(mods[i], "net.0");
            int64_t out = (ffn0 ? tiny.ffn_dim : tiny.dim) + extra;
            char km[200];
            snprintf(km, sizeof km, "%sblocks.%lld.%s%s", prefix, (long long)n, mods[i], msuf);
            add_values(w, km, 1, (int64_t[]){ out }, sd + 2, 0.5f, 2.0f);
        }
    written(&w, ts_join(path, "adapter_model.safetensors"));
    return path;
}

/* weight's DoRA merge onto w (out x in) against PEFT's formula in double,
 * from the adapter's own tensors: V = W + s·B·A, W' = (m_i / ||V_i||)·V_i
 * per output row i. The merge works in F32 (V rounded once per value, the
 * norm rounded to F32, an F32 division and product, each a few ulp), so
 * each value is within 16 ulp of 2 (|W'| <= max m = 2): 4e-6; and each
 * merged row's norm is its magnitude (1e-5 relative). Returns the largest
 * difference seen. */
static double dora_matches(const lora_t *l, const char *weight, double s, float *w, int64_t out, int64_t in) {
    const lora_target_t *t = lora_find(l, weight);
    ck_assert_msg(t != NULL && t->m != NULL, "%s", weight);
    ck_assert_int_eq(t->m_len, out);
    int64_t r = t->rank;
    double *v = malloc((size_t)(out * in) * sizeof *v);
    float *want = malloc((size_t)(out * in) * sizeof *want);
    for (int64_t i = 0; i < out; i++) {
        double ss = 0;
        for (int64_t j = 0; j < in; j++) {
            double acc = 0;
            for (int64_t k = 0; k < r; k++) acc += (double)t->b[i * r + k] * t->a[k * in + j];
            v[i * in + j] = (double)w[i * in + j] + s * acc;
            ss += v[i * in + j] * v[i * in + j];
        }
        for (int64_t j = 0; j < in; j++) want[i * in + j] = (float)((double)t->m[i] / sqrt(ss) * v[i * in + j]);
    }
    TS_OK(lora_merge_into(l, weight, w, out * in));
    double err = ts_max_abs_diff(w, want, (size_t)(out * in));
    ck_assert_msg(err <= 4e-6, "%s: %g from PEFT's DoRA", weight, err);
    for (int64_t i = 0; i < out; i++) {
        double ss = 0;
        for (int64_t j = 0; j < in; j++) ss += (double)w[i * in + j] * w[i * in + j];
        ck_assert_msg(fabs(sqrt(ss) - t->m[i]) <= 1e-5 * t->m[i], "%s row %lld: norm %g, magnitude %g", weight,
                      (long long)i, sqrt(ss), (double)t->m[i]);
    }
    free(v);
    free(want);
    return err;
}

/* A DoRA adapter as PEFT saves it (base_model.model. names, magnitudes
 * under .lora_magnitude_vector) in dir/name: config cfg, rank r, mods in
 * every layer, values from seed; opened and checked against the tiny
 * config (the test fails otherwise). */
static lora_t *open_peft_dora(const char *name, const char *cfg, const char *const *mods, int nmods, int64_t r,
                              uint64_t seed) {
    lora_t *l;
    TS_NEW(l = lora_open(make_dora(name, cfg, "base_model.model.", mods, nmods, r, seed, ".lora_magnitude_vector", 0,
                                   NULL)));
    TS_OK(lora_check(l, &tiny));
    return l;
}

/* PEFT's DoRA merge (tuners/lora/layer.py Linear.merge with use_dora):
 * W' = (m / ||W + s·B·A||_row) ⊙ (W + s·B·A), s as for LoRA (alpha / r,
 * alpha / sqrt(r) with use_rslora, per module with the patterns); the
 * magnitude under PEFT's saved name and its in-memory ones, Wan's and
 * diffusers' module names. */
START_TEST(test_dora_merges_as_peft_scales_each_row_to_its_magnitude) {
    static const char *const mods[] = { "self_attn.q", "cross_attn.o", "ffn.0", "ffn.2" };
    double worst = 0;
    for (int rs = 0; rs < 2; rs++) {
        const char *p = make_dora(rs ? "dora_rs" : "dora", rs ? CFG(4, 6, ", \"use_dora\": true, \"use_rslora\": true")
                                                              : CFG(4, 6, ", \"use_dora\": true, \"lora_dropout\": 0.1"),
                                  "base_model.model.", mods, 4, 4, 300, rs ? ".lora_magnitude_vector.default.weight"
                                                                          : ".lora_magnitude_vector", 0, NULL);
        lora_t *l;
        TS_NEW(l = lora_open(p));
        TS_OK(lora_check(l, &tiny));
        double s = rs ? 6.0 / 2.0 : 6.0 / 4.0;
        ck_assert_float_eq_tol(lora_scale(l), (float)s, 1e-7f);
        char desc[512];
        TS_OK(lora_describe(l, desc, sizeof desc));
        ck_assert_msg(strstr(desc, "\"dora\":8,"), "%s", desc);
        int64_t D = tiny.dim, F = tiny.ffn_dim;
        float *w = malloc((size_t)(D * F) * sizeof *w);
        const struct { const char *name; int64_t out, in; } ws[] = {
            { "blocks.0.self_attn.q.weight", D, D }, { "blocks.1.cross_attn.o.weight", D, D },
            { "blocks.1.ffn.0.weight", F, D }, { "blocks.0.ffn.2.weight", D, F } };
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            ts_fill_uniform(w, (size_t)(ws[i].out * ws[i].in), 17 + i, -1, 1);
            worst = fmax(worst, dora_matches(l, ws[i].name, s, w, ws[i].out, ws[i].in));
        }
        /* a weight it does not target is left alone */
        float keep = w[0];
        TS_OK(lora_merge_into(l, "blocks.0.self_attn.k.weight", w, D * D));
        ck_assert_float_eq(w[0], keep);
        free(w);
        lora_close(&l);
    }
    /* diffusers' names, a rank_pattern / alpha_pattern module */
    static const char *const dmods[] = { "attn1.to_q", "attn2.to_v" };
    lora_t *l;
    TS_NEW(l = lora_open(make_dora("dora_dif", "{\"r\": 4, \"lora_alpha\": 4, \"use_dora\": true, \"alpha_pattern\": "
                                   "{\"to_v\": 12}}", "transformer.", dmods, 2, 4, 400, ".lora_magnitude_vector.weight",
                                   0, NULL)));
    int64_t D = tiny.dim;
    float *w = malloc((size_t)(D * D) * sizeof *w);
    ts_fill_uniform(w, (size_t)(D * D), 5, -1, 1);
    worst = fmax(worst, dora_matches(l, "blocks.1.self_attn.q.weight", 1.0, w, D, D));
    ts_fill_uniform(w, (size_t)(D * D), 6, -1, 1);
    worst = fmax(worst, dora_matches(l, "blocks.0.cross_attn.v.weight", 3.0, w, D, D));
    /* a row whose W + s·B·A is 0 has no direction: refused naming it */
    const lora_target_t *t = lora_find(l, "blocks.0.cross_attn.v.weight");
    float *b = (float *)t->b;
    for (int64_t k = 0; k < t->rank; k++) b[3 * t->rank + k] = 0;
    memset(w + 3 * D, 0, (size_t)D * sizeof *w);
    ck_assert_int_eq(lora_merge_into(l, "blocks.0.cross_attn.v.weight", w, D * D), -1);
    ck_assert_msg(strstr(reel_err_text(), "blocks.0.cross_attn.v.weight: DoRA row 3"), "%s", reel_err_text());
    /* lora_check_merge finds it on the base before any reload */
    st_writer_t *sw = st_writer_new();
    TS_OK(st_writer_add_f32(sw, "blocks.0.cross_attn.v.weight", 2, (int64_t[]){ D, D }, w));
    ts_fill_uniform(w, (size_t)(D * D), 7, -1, 1);
    TS_OK(st_writer_add_f32(sw, "blocks.0.self_attn.q.weight", 2, (int64_t[]){ D, D }, w));
    TS_OK(st_writer_add_f32(sw, "blocks.1.self_attn.q.weight", 2, (int64_t[]){ D, D }, w));
    TS_OK(st_writer_add_f32(sw, "blocks.1.cross_attn.v.weight", 2, (int64_t[]){ D, D }, w));
    const char *zb = ts_join(dir, "zerorow.safetensors");
    written(&sw, zb);
    st_file_t *f;
    TS_NEW(f = st_open(zb));
    ck_assert_int_eq(lora_check_merge(l, f), -1);
    ck_assert_msg(strstr(reel_err_text(), "DoRA row 3"), "%s", reel_err_text());
    st_close(&f);
    free(w);
    lora_close(&l);
    fprintf(stderr, "test_lora: DoRA merges within %.3g of the double-precision reference\n", worst);
}
END_TEST

/* DoRA on a loaded model: a reload with it rewrites only its targets, and
 * the base again (a reload of its targets without the adapter, the
 * worker's "--lora none") is the base bitwise; a first load with it equals
 * a reload with it; lora_check_merge passes on the base. */
START_TEST(test_dora_reloads_and_the_base_again_is_the_base_bitwise) {
    rig_t rig = rig_open("w.safetensors", 3);
    st_file_t *f = rig.f;
    kern_backend_t *b = rig.b;
    lora_t *x = open_peft_dora("dx", CFG(4, 8, ", \"use_dora\": true"), every, 10, 4, 500), *y;
    TS_NEW(y = lora_open(make_adapter("py", CFG(2, 4, ""), "base_model.model.", attn, 4, 2, 12, KERN_F32)));
    TS_OK(lora_check_merge(x, f));
    TS_OK(lora_check_merge(y, f)); /* plain: nothing to judge */
    tdit_model_t *m;
    TS_NEW(m = tdit_model_load(b, f, KERN_F32));
    size_t n;
    float *base = snapshot(m, &n);
    tdit_weight_edit_t ex = lora_edit(x, true), ey = lora_edit(y, true);
    TS_OK(tdit_model_reload_edit(m, f, &ex));
    float *first_x = snapshot(m, &n);
    ck_assert_int_ne(memcmp(first_x, base, n * sizeof(float)), 0);
    for (int i = 0; i < 20; i++) {
        TS_OK(tdit_model_reload_edit(m, f, (i & 1) ? &ex : &ey));
        if (i & 1) ck_assert_msg(!memcmp(tdit_model_weights(m), first_x, n * sizeof(float)), "sync %d drifted", i);
    }
    /* the base again: the DoRA adapter's targets re-read, nothing merged */
    TS_OK(tdit_model_reload_edit(m, f, &ex));
    tdit_weight_edit_t none = { ex.want, NULL, ex.user };
    TS_OK(tdit_model_reload_edit(m, f, &none));
    ck_assert_msg(!memcmp(tdit_model_weights(m), base, n * sizeof(float)), "the base again is the base");
    tdit_weight_edit_t all = lora_edit(x, false);
    tdit_model_t *m2;
    TS_NEW(m2 = tdit_model_load_edit(b, f, KERN_F32, &all));
    ck_assert(!memcmp(tdit_model_weights(m2), first_x, n * sizeof(float)));
    tdit_model_destroy(&m2);
    free(base);
    free(first_x);
    tdit_model_destroy(&m);
    lora_close(&x);
    lora_close(&y);
    rig_close(&rig);
}
END_TEST

/* The worker's edit for an adapter sync (worker/wrk_sync.c): the weights
 * either adapter targets are re-read from the base, the next one merged. */
typedef struct {
    const lora_t *next, *prev;
} sync_pair_t;
static bool sync_want(void *user, const char *name) {
    const sync_pair_t *p = user;
    return lora_find(p->next, name) || (p->prev && lora_find(p->prev, name));
}
static int sync_adjust(void *user, const char *name, float *w, int64_t numel) {
    return lora_merge_into(((const sync_pair_t *)user)->next, name, w, numel);
}

/* A sync from one DoRA adapter to another: DoRA's factor depends on the
 * weight it scales, so the second must be merged onto the base, never
 * onto the first's merged rows; the result is bitwise a first load with
 * the second, whichever came before (also their shared targets). */
START_TEST(test_dora_after_dora_merges_from_the_base) {
    static const char *const two[] = { "self_attn.q", "self_attn.k" };
    static const char *const three[] = { "self_attn.k", "cross_attn.o", "ffn.0" };
    rig_t rig = rig_open("wdd.safetensors", 4);
    st_file_t *f = rig.f;
    kern_backend_t *b = rig.b;
    lora_t *x = open_peft_dora("ddx", CFG(4, 8, ", \"use_dora\": true"), two, 2, 4, 700);
    lora_t *z = open_peft_dora("ddz", CFG(2, 4, ", \"use_dora\": true"), three, 3, 2, 800);
    tdit_weight_edit_t all_z = lora_edit(z, false), all_x = lora_edit(x, false);
    tdit_model_t *ref_z, *ref_x, *m;
    TS_NEW(ref_z = tdit_model_load_edit(b, f, KERN_F32, &all_z));
    TS_NEW(ref_x = tdit_model_load_edit(b, f, KERN_F32, &all_x));
    TS_NEW(m = tdit_model_load(b, f, KERN_F32));
    size_t bytes = tdit_model_bytes(m);
    sync_pair_t px = { x, NULL }, pz = { z, x }, px2 = { x, z };
    tdit_weight_edit_t ex = { sync_want, sync_adjust, &px }, ez = { sync_want, sync_adjust, &pz },
                       ex2 = { sync_want, sync_adjust, &px2 };
    for (int round = 0; round < 3; round++) {
        TS_OK(tdit_model_reload_edit(m, f, round ? &ex2 : &ex));
        ck_assert_msg(!memcmp(tdit_model_weights(m), tdit_model_weights(ref_x), bytes), "round %d: x", round);
        TS_OK(tdit_model_reload_edit(m, f, &ez));
        ck_assert_msg(!memcmp(tdit_model_weights(m), tdit_model_weights(ref_z), bytes),
                      "round %d: DoRA z after DoRA x is not z on the base", round);
    }
    tdit_model_destroy(&m);
    tdit_model_destroy(&ref_x);
    tdit_model_destroy(&ref_z);
    lora_close(&x);
    lora_close(&z);
    rig_close(&rig);
}
END_TEST

START_TEST(test_dora_refusals_name_their_cause) {
    static const char *const two[] = { "self_attn.q", "self_attn.k" };
    const char *vec = ".lora_magnitude_vector";
    /* a magnitude without use_dora: PEFT would not load it */
    refused(make_dora("d_nocfg", CFG(4, 8, ""), "base_model.model.", two, 2, 4, 1, vec, 0, NULL),
            "does not say \"use_dora\": true");
    refused(make_dora("d_false", CFG(4, 8, ", \"use_dora\": false"), "base_model.model.", two, 2, 4, 1, vec, 0, NULL),
            "does not say \"use_dora\": true");
    /* use_dora with a module missing its magnitude */
    refused(make_dora("d_missing", CFG(4, 8, ", \"use_dora\": true"), "base_model.model.", two, 2, 4, 1, vec, 0,
                      "self_attn.k"), "self_attn.k.weight has lora_A and lora_B but no lora_magnitude_vector");
    refused(make_adapter("d_none", CFG(4, 8, ", \"use_dora\": true"), "", attn, 4, 4, 1, KERN_F32),
            "no lora_magnitude_vector");
    /* a magnitude of the wrong length: named with both sizes */
    refused(make_dora("d_len", CFG(4, 8, ", \"use_dora\": true"), "base_model.model.", two, 2, 4, 1, vec, 1, NULL),
            "has 65 values, its lora_B 64 rows");
    refused(make_dora("d_suffix", CFG(4, 8, ", \"use_dora\": true"), "base_model.model.", two, 2, 4, 1,
                      ".lora_magnitude_vector.other", 0, NULL), "not a lora_magnitude_vector");
    refused(make_dora("d_lorabias", CFG(4, 8, ", \"use_dora\": true, \"lora_bias\": true"), "base_model.model.", two, 2,
                      4, 1, vec, 0, NULL), "use_dora with lora_bias");
    refused(make_dora("d_bad", CFG(4, 8, ", \"use_dora\": \"yes\""), "base_model.model.", two, 2, 4, 1, vec, 0, NULL),
            "use_dora must be true or false");
    /* file-level cases: [out, 1], a magnitude alone, a NaN, a .diff on the
     * same weight, kohya's names, kohya's dora_scale */
    const int64_t D = tiny.dim;
    static const struct {
        const char *key;
        int ndim;
        int64_t shape[2];
        const char *needle;
    } cases[] = {
        { "blocks.0.self_attn.q.lora_magnitude_vector", 2, { 64, 1 }, "a lora_magnitude_vector is [out]" },
        { "blocks.0.self_attn.v.lora_magnitude_vector", 1, { 64 }, "without lora_A and lora_B" },
        { "blocks.0.self_attn.q.diff", 2, { 64, 64 }, "a full difference (.diff) on a DoRA module" },
        { "blocks.0.norm3.lora_magnitude_vector", 1, { 64 }, "unknown target" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/dcase%zu", dir, i);
        ck_assert_int_eq(mkdir(path, 0700), 0);
        const char *cfg = CFG(4, 8, ", \"use_dora\": true");
        ts_write_file(ts_join(path, "adapter_config.json"), cfg, strlen(cfg));
        st_writer_t *w = st_writer_new();
        add_pair(w, "", false, 0, "self_attn.q", 4, "lora_A", "lora_B", 0, 80 + i);
        if (strcmp(cases[i].key, "blocks.0.self_attn.q.lora_magnitude_vector"))
            add_values(w, "blocks.0.self_attn.q.lora_magnitude_vector", 1, (int64_t[]){ D }, 90 + i, 0.5f, 2);
        add_values(w, cases[i].key, cases[i].ndim, cases[i].shape, 70 + i, 0.5f, 2);
        written(&w, ts_join(path, "adapter_model.safetensors"));
        refused(path, cases[i].needle);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/dnan", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    const char *cfg = CFG(4, 8, ", \"use_dora\": true");
    ts_write_file(ts_join(path, "adapter_config.json"), cfg, strlen(cfg));
    st_writer_t *w = st_writer_new();
    add_pair(w, "", false, 0, "self_attn.q", 4, "lora_A", "lora_B", 0, 95);
    float mv[64];
    for (int i = 0; i < 64; i++) mv[i] = 1;
    mv[5] = NAN;
    TS_OK(st_writer_add_f32(w, "blocks.0.self_attn.q.lora_magnitude_vector", 1, (int64_t[]){ 64 }, mv));
    written(&w, ts_join(path, "adapter_model.safetensors"));
    refused(path, "NaN or infinite");
    /* a magnitude that could carry a weight past F32: lora_check */
    snprintf(path, sizeof path, "%s/dhuge", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    ts_write_file(ts_join(path, "adapter_config.json"), cfg, strlen(cfg));
    w = st_writer_new();
    add_pair(w, "", false, 0, "self_attn.q", 4, "lora_A", "lora_B", 0, 95);
    for (int i = 0; i < 64; i++) mv[i] = 3e37f;
    TS_OK(st_writer_add_f32(w, "blocks.0.self_attn.q.lora_magnitude_vector", 1, (int64_t[]){ 64 }, mv));
    written(&w, ts_join(path, "adapter_model.safetensors"));
    lora_t *l;
    TS_NEW(l = lora_open(path));
    ck_assert_int_eq(lora_check(l, &tiny), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "could overflow F32"));
    lora_close(&l);
    /* kohya's names: refused naming PEFT's */
    w = st_writer_new();
    add_pair(w, "lora_unet_", true, 0, "self_attn.q", 4, "lora_down", "lora_up", 4, 96);
    add_values(w, "lora_unet_blocks_0_self_attn_q.lora_magnitude_vector", 1, (int64_t[]){ D }, 97, 0.5f, 2);
    written(&w, ts_join(dir, "kmag.safetensors"));
    refused(ts_join(dir, "kmag.safetensors"), "a DoRA magnitude in kohya's names is not supported");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("lora");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_merge_is_w_plus_scale_b_times_a_and_rslora_divides_by_the_root_of_r);
    tcase_add_test(tc, test_diffusers_names_and_bf16_map_to_the_same_weights_as_wan_names);
    tcase_add_test(tc, test_rank_and_alpha_patterns_give_each_module_its_own_r_and_alpha);
    tcase_add_test(tc, test_a_pattern_key_that_repeats_a_counted_repetition_is_refused_not_compiled);
    tcase_add_test(tc, test_pattern_keys_match_module_names_as_pythons_re_reads_them);
    tcase_add_test(tc, test_a_thousand_pattern_keys_against_thousands_of_modules_give_each_its_own_r_and_alpha);
    tcase_add_test(tc, test_refusals_name_their_cause);
    tcase_add_test(tc, test_adapters_without_a_config_take_the_files_own_ranks_and_alphas);
    tcase_add_test(tc, test_alpha_less_files_of_mixed_ranks_take_s_1_per_target_not_the_first_ranks_ratio);
    tcase_add_test(tc, test_a_thousand_alternating_merges_leave_no_drift_and_no_adapter_returns_the_base);
    tcase_add_test(tc, test_differences_add_to_any_weight_and_outside_linears_take_a_lora);
    tcase_add_test(tc, test_differences_refused_name_their_cause);
    tcase_add_test(tc, test_dora_merges_as_peft_scales_each_row_to_its_magnitude);
    tcase_add_test(tc, test_dora_reloads_and_the_base_again_is_the_base_bitwise);
    tcase_add_test(tc, test_dora_refusals_name_their_cause);
    tcase_add_test(tc, test_dora_after_dora_merges_from_the_base);
    tcase_add_test(tc, test_a_tiny_scale_does_not_let_b_times_a_past_f32s_range);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(suite()); }
