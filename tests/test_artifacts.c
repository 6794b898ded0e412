/* test_artifacts.c -- kernel artifacts (kernels/artifacts.h): the manifest
 * schema, bundle verification (corrupt manifest, hash mismatch, ABI
 * mismatch, missing object, unlisted file, duplicate id), the allowlist,
 * the parity gate (a wrong artifact is demoted with artifact_parity and
 * never changes a served result; a correct one is promoted, captured and
 * replayed bitwise equal to its own eager run), runtime fallback, the
 * workspace contract, and the timing modes.
 *
 * The bundles are built by `make artifacts` beside this binary: the
 * examples in BUILD/artifacts, the test-only variants in
 * BUILD/artifacts-test. Each test copies what it needs into a fresh root. */
#include <check.h>
#include <libgen.h>
#include <math.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "kernels/artifacts.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "model/tdit_program.h"
#include "tests/support.h"

static char build[PATH_MAX], dir[64], weights[128];

static void setup(void) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert_int_gt(n, 0);
    exe[n] = '\0';
    snprintf(build, sizeof build, "%s", dirname(dirname(exe)));
    ts_mkdtemp(dir, sizeof dir, "test-art");
    snprintf(weights, sizeof weights, "%s/w.safetensors", dir);
    ts_tiny_weights(11, weights);
}

static void teardown(void) {
    if (ts_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    ck_assert_msg(system(cmd) == 0, "failed: %s", cmd);
}

/* A fresh root holding copies of the named bundles: "cpu_*" from the
 * examples, anything else from the test variants. NULL-terminated. */
static const char *root_with(const char *first, ...) {
    static char root[128];
    snprintf(root, sizeof root, "%s/root.XXXXXX", dir); /* unique in forked tests too */
    ck_assert_ptr_nonnull(mkdtemp(root));
    va_list ap;
    va_start(ap, first);
    for (const char *b = first; b; b = va_arg(ap, const char *))
        sh("cp -r '%s/%s/%s' '%s/'", build, strncmp(b, "cpu_", 4) ? "artifacts-test" : "artifacts",
           b, root);
    va_end(ap);
    return root;
}

static void write_file(const char *root, const char *bundle, const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s/%s", root, bundle, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static const kern_art_bundle_t *bundle_named(kern_artifacts_t *set, const char *name) {
    static kern_art_bundle_t b;
    for (size_t i = 0; i < kern_artifacts_count(set); i++) {
        b = kern_artifacts_bundle(set, i);
        if (!strcmp(b.bundle, name)) return &b;
    }
    ck_abort_msg("no bundle %s", name);
    return NULL;
}

static kern_artifacts_t *scan(const char *root) {
    kern_artifacts_t *set = kern_artifacts_scan(root);
    TS_NEW(set);
    return set;
}

/* The state of artifact id at its one key of op (the first key found). */
static kern_art_key_stats_t key_of(kern_artifacts_t *set, const char *id) {
    kern_art_key_stats_t ks[64];
    size_t n = kern_artifacts_keys(set, ks, 64);
    for (size_t i = 0; i < n && i < 64; i++)
        if (!strcmp(ks[i].id, id)) return ks[i];
    ck_abort_msg("no key of %s", id);
    return ks[0];
}

/* ---- the manifest ---------------------------------------------------------------- */

static const char good_manifest[] =
    "{\"id\":\"x-1\",\"version\":\"1.0\",\"op\":\"gemm_gelu\",\"region\":\"ffn\",\"backend\":\"cpu\","
    "\"arch\":[\"any\"],\"dtypes\":[\"F32\"],\"shapes\":{\"M\":[1,64]},\"parity\":\"max_rel=1e-5\","
    "\"abi\":3,\"object\":\"lib.so\",\"files\":{\"lib.so\":"
    "\"E178776A96416AE48569A29749CBD34BDCE83767BE2D223E10D6ECAC94788EC9\"}}";

/* good_manifest with `from` replaced by `to`: must fail naming `field`. */
static void refused(const char *from, const char *to, const char *field) {
    char text[1024], *p = strstr(good_manifest, from);
    ck_assert_msg(p != NULL, "%s not in the manifest", from);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(p - good_manifest), good_manifest, to,
             p + strlen(from));
    kern_art_manifest_t m;
    ck_assert_msg(kern_art_manifest_parse(text, strlen(text), &m) == -1, "accepted: %s", text);
    ck_assert_msg(strstr(reel_err_text(), field) != NULL, "'%s' does not name %s", reel_err_text(), field);
}

START_TEST(test_manifest_schema_accepts_a_good_one_and_names_every_bad_field) {
    kern_art_manifest_t m;
    ck_assert_msg(kern_art_manifest_parse(good_manifest, strlen(good_manifest), &m) == 0, "%s",
                  reel_err_text());
    ck_assert_str_eq(m.id, "x-1");
    ck_assert_int_eq(m.op, KERN_OP_GEMM_GELU);
    ck_assert_int_eq(m.parity, KERN_PARITY_MAX_REL);
    ck_assert(m.max_rel == 1e-5);
    ck_assert_int_eq(m.n_shapes, 1);
    ck_assert_str_eq(m.files[0].sha256, "e178776a96416ae48569a29749cbd34bdce83767be2d223e10d6ecac94788ec9");
    refused("\"region\"", "\"colour\"", "unknown key");
    refused("\"version\":\"1.0\"", "\"version\":\"1.0\",\"id\":\"y\"", "JSON");
    refused("\"gemm_gelu\"", "\"gemm_gelux\"", "op");
    refused("\"gemm_gelu\"", "\"rope3d\"", "rope3d cannot be replaced");
    refused("\"M\":[1,64]", "\"nk\":[1,64]", "no size \"nk\"");
    refused("\"M\":[1,64]", "\"M\":[64,1]", "shapes");
    refused("max_rel=1e-5", "max_rel=2", "parity");
    refused("max_rel=1e-5", "bytes_equal", "parity");
    refused("\"abi\":3", "\"abi\":\"3\"", "abi");
    refused("\"cpu\"", "\"tpu\"", "backend");
    refused("[\"F32\"]", "[\"F64\"]", "dtypes");
    refused("[\"any\"]", "[]", "arch");
    refused("\"lib.so\":", "\"../lib.so\":", "plain file name");
    refused("\"object\":\"lib.so\"", "\"object\":\"other.so\"", "no digest");
    refused("\"E178", "\"X178", "sha256");
    refused("\"x-1\"", "\"x 1\"", "\"id\"");
    ck_assert_int_eq(kern_art_manifest_parse("[]", 2, &m), -1);
    ck_assert_int_eq(kern_art_manifest_parse("", 0, &m), -1);
}
END_TEST

START_TEST(test_timing_and_parity_names_parse_and_junk_is_refused) {
    kern_art_timing_t t;
    ck_assert_int_eq(kern_art_timing_parse("shadow", &t), 0);
    ck_assert_int_eq(t, KERN_ART_TIMING_SHADOW);
    ck_assert_str_eq(kern_art_timing_name(KERN_ART_TIMING_SYNC), "sync");
    ck_assert_int_eq(kern_art_timing_parse("fast", &t), -1);
    kern_parity_kind_t k;
    double r;
    ck_assert_int_eq(kern_art_parity_parse("byte_equal", &k, &r), 0);
    ck_assert_int_eq(k, KERN_PARITY_BYTE_EQUAL);
    ck_assert_int_eq(kern_art_parity_parse("max_rel=0.01", &k, &r), 0);
    ck_assert(r == 0.01);
    ck_assert_int_eq(kern_art_parity_parse("max_rel=0", &k, &r), -1);
    ck_assert_int_eq(kern_art_parity_parse("max_rel=nan", &k, &r), -1);
    ck_assert_int_eq(kern_art_parity_parse("max_rel= 1e-3", &k, &r), -1);
}
END_TEST

/* ---- bundles ---------------------------------------------------------------------- */

START_TEST(test_example_bundles_verify_and_load_and_list_shows_them) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "cpu_attention_parsoftmax", NULL);
    kern_artifacts_t *set = scan(root);
    ck_assert_uint_eq(kern_artifacts_count(set), 2);
    ck_assert_uint_eq(kern_artifacts_refused(set), 0);
    ck_assert_int_eq(kern_artifacts_enable(set, NULL, 0), 0);
    TS_OK(kern_artifacts_install(set, KERN_ART_TIMING_OFF));
    ck_assert_ptr_eq(kern_artifacts_installed(), set);
    for (size_t i = 0; i < 2; i++) ck_assert(kern_artifacts_bundle(set, i).loaded);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_int_eq(kern_artifacts_print(set, f, false, false), 0);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(text, "cpu-gemm-gelu-epilogue"));
    ck_assert_ptr_nonnull(strstr(text, "cpu-attention-parsoftmax"));
    ck_assert_ptr_nonnull(strstr(text, "loaded"));
    free(text);
    kern_artifacts_destroy(&set);
    ck_assert_ptr_null(kern_artifacts_installed());
}
END_TEST

/* Scans root, expects bundle `bad` refused with `why` (and naming it), the
 * others verified; installs and proves the worker's kernels still serve. */
static void expect_refused(const char *root, const char *bad, const char *why) {
    kern_artifacts_t *set = scan(root);
    const kern_art_bundle_t *b = bundle_named(set, bad);
    ck_assert(!b->verified);
    ck_assert_msg(strstr(b->error, why) && strstr(b->error, bad), "error '%s' (wanted %s, %s)",
                  b->error, why, bad);
    ck_assert_int_eq(kern_artifacts_enable(set, NULL, 0), 0);
    TS_OK(kern_artifacts_install(set, KERN_ART_TIMING_OFF));
    ck_assert(!bundle_named(set, bad)->loaded);
    ck_assert(bundle_named(set, "cpu_gemm_gelu_epilogue")->loaded);
    kern_artifacts_destroy(&set);
}

START_TEST(test_corrupt_manifest_is_refused_naming_the_bundle_and_the_others_still_load) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "cpu_attention_parsoftmax", NULL);
    write_file(root, "cpu_attention_parsoftmax", "manifest.json", "{\"id\": \"cpu-attention-parsoftmax\",");
    expect_refused(root, "cpu_attention_parsoftmax", "not JSON");
}
END_TEST

START_TEST(test_hash_mismatch_is_refused_naming_the_file) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "wrong", NULL);
    sh("printf 'x' >> '%s/wrong/libtest_wrong.so'", root);
    expect_refused(root, "wrong", "hash mismatch for libtest_wrong.so");
}
END_TEST

START_TEST(test_abi_mismatch_in_the_manifest_is_refused_before_anything_loads) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "wrong", NULL);
    sh("sed -i 's/\"abi\": 3/\"abi\": 1/' '%s/wrong/manifest.json'", root);
    expect_refused(root, "wrong", "ABI mismatch: built for artifact ABI 1");
}
END_TEST

START_TEST(test_object_built_for_another_abi_is_refused_at_load_and_named) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "abi2", NULL);
    kern_artifacts_t *set = scan(root);
    ck_assert(bundle_named(set, "abi2")->verified); /* its manifest says the host ABI, its object 1 */
    ck_assert_int_eq(kern_artifacts_enable(set, NULL, 0), 0);
    ck_assert_int_eq(kern_artifacts_install(set, KERN_ART_TIMING_OFF), 0); /* not named: skipped */
    const kern_art_bundle_t *b = bundle_named(set, "abi2");
    ck_assert(!b->loaded);
    ck_assert_msg(strstr(b->error, "bundle abi2: ABI mismatch") != NULL, "%s", b->error);
    kern_artifacts_destroy(&set);
    /* Named in the allowlist, the same failure stops the start. */
    set = scan(root);
    const char *ids[] = { "test-abi2-gemm-gelu" };
    ck_assert_int_eq(kern_artifacts_enable(set, ids, 1), 0);
    ck_assert_int_eq(kern_artifacts_install(set, KERN_ART_TIMING_OFF), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "test-abi2-gemm-gelu"));
    ck_assert_ptr_null(kern_artifacts_installed());
    kern_artifacts_destroy(&set);
}
END_TEST

START_TEST(test_missing_shared_object_is_refused) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "wrong", NULL);
    sh("rm '%s/wrong/libtest_wrong.so'", root);
    expect_refused(root, "wrong", "the shared object libtest_wrong.so is missing");
}
END_TEST

START_TEST(test_a_file_the_manifest_does_not_list_is_refused) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "wrong", NULL);
    write_file(root, "wrong", "extra.so", "not listed");
    expect_refused(root, "wrong", "extra.so is not listed");
}
END_TEST

START_TEST(test_duplicate_id_refuses_both_bundles) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "cpu_attention_parsoftmax", NULL);
    sh("cp -r '%s/cpu_attention_parsoftmax' '%s/copy_of_attention'", root, root);
    kern_artifacts_t *set = scan(root);
    for (int i = 0; i < 2; i++) {
        const char *n = i ? "copy_of_attention" : "cpu_attention_parsoftmax";
        const kern_art_bundle_t *b = bundle_named(set, n);
        ck_assert(!b->verified);
        ck_assert_msg(strstr(b->error, "duplicate id cpu-attention-parsoftmax") != NULL, "%s", b->error);
    }
    ck_assert(bundle_named(set, "cpu_gemm_gelu_epilogue")->verified);
    const char *ids[] = { "cpu-attention-parsoftmax" };
    ck_assert_int_eq(kern_artifacts_enable(set, ids, 1), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "duplicate id"));
    kern_artifacts_destroy(&set);
}
END_TEST

START_TEST(test_unknown_id_in_the_allowlist_is_an_error_naming_it) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", NULL);
    kern_artifacts_t *set = scan(root);
    ck_assert_int_eq(kern_artifacts_enable_list(set, "cpu-gemm-gelu-epilogue,no-such-kernel"), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "unknown id 'no-such-kernel'"));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "cpu-gemm-gelu-epilogue")); /* what there is */
    ck_assert(!kern_artifacts_bundle(set, 0).enabled);
    ck_assert_int_eq(kern_artifacts_enable_list(set, "cpu-gemm-gelu-epilogue,"), -1);
    ck_assert_int_eq(kern_artifacts_enable_list(set, ""), -1);
    ck_assert_int_eq(kern_artifacts_enable_list(set, "cpu-gemm-gelu-epilogue"), 0);
    ck_assert(kern_artifacts_bundle(set, 0).enabled);
    kern_artifacts_destroy(&set);
}
END_TEST

START_TEST(test_allowlist_naming_a_refused_bundle_is_an_error) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "wrong", NULL);
    sh("printf 'x' >> '%s/wrong/libtest_wrong.so'", root);
    kern_artifacts_t *set = scan(root);
    ck_assert_int_eq(kern_artifacts_enable_list(set, "test-wrong-gemm-gelu"), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "hash mismatch"));
    kern_artifacts_destroy(&set);
}
END_TEST

START_TEST(test_the_allowlist_narrows_what_loads) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "cpu_attention_parsoftmax", NULL);
    kern_artifacts_t *set = scan(root);
    ck_assert_int_eq(kern_artifacts_enable_list(set, "cpu-attention-parsoftmax"), 0);
    ck_assert_int_eq(kern_artifacts_install(set, KERN_ART_TIMING_OFF), 0);
    ck_assert(bundle_named(set, "cpu_attention_parsoftmax")->loaded);
    ck_assert(!bundle_named(set, "cpu_gemm_gelu_epilogue")->loaded);
    kern_artifacts_destroy(&set);
}
END_TEST

/* ---- the gate, on ops ------------------------------------------------------------------ */

typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    kern_tensor_t x, w, bias, y;
} gg_t;

/* A GEMM + GELU as a block's feed-forward runs it: in region block.ffn,
 * where the test bundles (region "ffn") apply. */
static gg_t gg_open(int64_t M, int64_t N, int64_t K) {
    gg_t g;
    kern_artifacts_set_region("block.ffn");
    g.b = kern_backend_cpu_new();
    g.s = kern_stream_new(g.b);
    g.x = kern_tensor_alloc(g.b, KERN_F32, 2, (int64_t[]){ M, K });
    g.w = kern_tensor_alloc(g.b, KERN_F32, 2, (int64_t[]){ N, K });
    g.bias = kern_tensor_alloc(g.b, KERN_F32, 1, (int64_t[]){ N });
    g.y = kern_tensor_alloc(g.b, KERN_F32, 2, (int64_t[]){ M, N });
    tdit_initial_latent(1, g.x.data, (size_t)(M * K));
    tdit_initial_latent(2, g.w.data, (size_t)(N * K));
    tdit_initial_latent(3, g.bias.data, (size_t)N);
    return g;
}

static void gg_close(gg_t *g) {
    kern_free(g->b, g->x.data);
    kern_free(g->b, g->w.data);
    kern_free(g->b, g->bias.data);
    kern_free(g->b, g->y.data);
    kern_stream_destroy(&g->s);
    kern_backend_destroy(&g->b);
}

static void gg_run(gg_t *g, float *out) {
    memset(g->y.data, 0xff, kern_tensor_bytes(&g->y));
    TS_OK(kern_gemm_gelu(g->s, &g->x, &g->w, &g->bias, &g->y));
    memcpy(out, g->y.data, kern_tensor_bytes(&g->y));
}

static kern_artifacts_t *install_only(const char *root, const char *ids, kern_art_timing_t t) {
    kern_artifacts_t *set = scan(root);
    TS_OK(kern_artifacts_enable_list(set, ids));
    TS_OK(kern_artifacts_install(set, t));
    return set;
}

/* Regions (kernels/artifacts.h): a manifest names one of the model's, an
 * unknown name is refused naming the field; a region matches itself, what
 * lies below it, and the two groups theirs; and an artifact is judged only
 * at launches in its region: the same GEMM + GELU in the text embedding
 * stays native and unjudged while the feed-forward's is promoted. */
START_TEST(test_an_artifact_replaces_its_op_only_in_its_region) {
    refused("\"region\":\"ffn\"", "\"region\":\"mlp\"", "no region named \"mlp\"");
    ck_assert(kern_art_region_matches("", NULL));
    ck_assert(kern_art_region_matches("", "head"));
    ck_assert(kern_art_region_matches("ffn", "block.ffn"));
    ck_assert(!kern_art_region_matches("ffn", "embed.text"));
    ck_assert(!kern_art_region_matches("ffn", NULL));
    ck_assert(kern_art_region_matches("attention", "block.self_attn"));
    ck_assert(kern_art_region_matches("attention", "block.cross_attn"));
    ck_assert(!kern_art_region_matches("attention", "block.ffn"));
    ck_assert(kern_art_region_matches("block.self_attn", "block.self_attn"));
    ck_assert(!kern_art_region_matches("block.self_attn", "block.cross_attn"));
    ck_assert(kern_art_region_matches("block", "block.cross_attn"));
    ck_assert(!kern_art_region_matches("block", "blocks"));
    ck_assert(kern_art_region_matches("embed", "embed.text"));
    enum { M = 24, N = 40, K = 16 };
    gg_t g = gg_open(M, N, K);
    static float native[M * N], got[M * N];
    gg_run(&g, native);
    kern_artifacts_t *set = install_only(root_with("cpu_gemm_gelu_epilogue", NULL), "cpu-gemm-gelu-epilogue",
                                         KERN_ART_TIMING_OFF);
    kern_artifacts_set_region("embed.text");
    gg_run(&g, got);
    ck_assert_int_eq(memcmp(got, native, sizeof got), 0);
    kern_art_key_stats_t ks[4];
    ck_assert_uint_eq(kern_artifacts_keys(set, ks, 4), 0); /* not even judged */
    kern_artifacts_set_region("block.ffn");
    gg_run(&g, got);
    ck_assert_uint_eq(kern_artifacts_keys(set, ks, 4), 1);
    ck_assert_int_eq(ks[0].state, KERN_ART_PROMOTED);
    kern_artifacts_destroy(&set);
    gg_close(&g);
}
END_TEST

/* Each capture key is judged on its own (kern_artifacts_set_scope, which
 * cap_dispatch sets): the same launch under two capture keys is two keys,
 * each with its own shadow run and verdict, named by the capture key's
 * hash; a launch under none has its own key without one. */
START_TEST(test_each_capture_key_gets_its_own_shadow_run_and_verdict) {
    enum { M = 24, N = 40, K = 16 };
    gg_t g = gg_open(M, N, K);
    static float got[M * N];
    kern_artifacts_t *set = install_only(root_with("wrong", NULL), "test-wrong-gemm-gelu", KERN_ART_TIMING_OFF);
    uint64_t prev = kern_artifacts_set_scope(0x0123456789abcdefull);
    gg_run(&g, got);
    gg_run(&g, got);
    kern_artifacts_set_scope(0xfedcba9876543210ull);
    gg_run(&g, got);
    kern_artifacts_set_scope(prev);
    gg_run(&g, got);
    kern_art_key_stats_t ks[8];
    ck_assert_uint_eq(kern_artifacts_keys(set, ks, 8), 3);
    ck_assert_msg(strstr(ks[0].key, " @0123456789abcdef"), "%s", ks[0].key);
    ck_assert_msg(strstr(ks[1].key, " @fedcba9876543210"), "%s", ks[1].key);
    ck_assert_msg(!strchr(ks[2].key, '@'), "%s", ks[2].key);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(ks[i].state, KERN_ART_DEMOTED);
        ck_assert_uint_eq(ks[i].n.parity_fail, 1); /* one shadow run each */
    }
    ck_assert_uint_eq(ks[0].n.native_calls, 1);    /* its second call: native, no second shadow run */
    kern_artifacts_destroy(&set);
    gg_close(&g);
}
END_TEST

START_TEST(test_wrong_artifact_is_demoted_with_artifact_parity_and_never_changes_an_op_result) {
    enum { M = 24, N = 40, K = 16 };
    static float native[M * N], got[M * N];
    gg_t g = gg_open(M, N, K);
    gg_run(&g, native);
    kern_artifacts_t *set = install_only(root_with("wrong", NULL), "test-wrong-gemm-gelu",
                                         KERN_ART_TIMING_OFF);
    for (int i = 0; i < 3; i++) {
        gg_run(&g, got);
        ck_assert_int_eq(memcmp(got, native, sizeof got), 0);
    }
    kern_art_key_stats_t k = key_of(set, "test-wrong-gemm-gelu");
    ck_assert_int_eq(k.state, KERN_ART_DEMOTED);
    ck_assert_msg(strncmp(k.reason, "artifact_parity: byte_equal", 27) == 0, "%s", k.reason);
    ck_assert_uint_eq(k.n.parity_fail, 1);
    ck_assert_uint_eq(k.n.parity_pass, 0);
    ck_assert_uint_eq(k.n.native_calls, 2);
    ck_assert_msg(!strncmp(k.key, "gemm_gelu F32 cpu-", 18) &&
                  strstr(k.key, " M=24 N=40 K=16 bias=1"), "%s", k.key); /* arch in between */
    kern_artifacts_destroy(&set);
    gg_close(&g);
}
END_TEST

START_TEST(test_example_gemm_gelu_is_promoted_and_equal_to_native_at_every_shape) {
    static const int64_t shapes[][3] = { { 1, 8, 4 }, { 33, 17, 5 }, { 160, 128, 64 },
                                         { 600, 512, 96 }, { 100, 3000, 700 } }; /* the last two
                                                                         * on every core */
    kern_artifacts_t *set = install_only(root_with("cpu_gemm_gelu_epilogue", NULL),
                                         "cpu-gemm-gelu-epilogue", KERN_ART_TIMING_OFF);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        gg_t g = gg_open(shapes[i][0], shapes[i][1], shapes[i][2]);
        size_t n = (size_t)(shapes[i][0] * shapes[i][1]);
        float *a = malloc(n * 4), *b = malloc(n * 4);
        gg_run(&g, a); /* parity: native served */
        gg_run(&g, b); /* promoted: the artifact's */
        ck_assert_int_eq(memcmp(a, b, n * 4), 0);
        kern_artifacts_uninstall(set);
        gg_run(&g, b);
        ck_assert_int_eq(kern_artifacts_install(set, KERN_ART_TIMING_OFF), 0);
        ck_assert_int_eq(memcmp(a, b, n * 4), 0);
        free(a);
        free(b);
        gg_close(&g);
    }
    kern_art_counts_t t;
    int promoted = 0, demoted = 0;
    ck_assert_int_eq(kern_artifacts_totals(set, "cpu-gemm-gelu-epilogue", &t, &promoted, &demoted), 0);
    ck_assert_int_eq(promoted, 5);
    ck_assert_int_eq(demoted, 0);
    ck_assert_uint_eq(t.parity_pass, 5);
    ck_assert_uint_eq(t.calls, 10);
    kern_artifacts_destroy(&set);
}
END_TEST

START_TEST(test_example_attention_is_promoted_and_equal_to_native_at_every_shape) {
    static const int64_t shapes[][4] = { { 32, 32, 2, 16 }, { 32, 5, 2, 16 }, { 300, 300, 4, 32 },
                                         { 1100, 500, 3, 64 },   /* softmax on every core */
                                         { 1100, 1000, 2, 16 } }; /* >= 2^20 scores a head: flash */
    kern_artifacts_t *set = install_only(root_with("cpu_attention_parsoftmax", NULL),
                                         "cpu-attention-parsoftmax", KERN_ART_TIMING_OFF);
    kern_backend_t *b = kern_backend_cpu_new();
    kern_stream_t *s = kern_stream_new(b);
    kern_artifacts_set_region("block.self_attn"); /* as a block's self-attention runs it */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t nq = shapes[i][0], nk = shapes[i][1], H = shapes[i][2], D = H * shapes[i][3];
        kern_tensor_t q = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ nq, D });
        kern_tensor_t k = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ nk, D });
        kern_tensor_t v = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ nk, D });
        kern_tensor_t o = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ nq, D });
        tdit_initial_latent(4, q.data, (size_t)(nq * D));
        tdit_initial_latent(5, k.data, (size_t)(nk * D));
        tdit_initial_latent(6, v.data, (size_t)(nk * D));
        size_t bytes = kern_tensor_bytes(&o);
        float *r[3] = { malloc(bytes), malloc(bytes), malloc(bytes) };
        for (int j = 0; j < 3; j++) {
            if (j == 2) kern_artifacts_uninstall(set);
            TS_OK(kern_attention(s, &q, &k, &v, H, &o));
            memcpy(r[j], o.data, bytes);
        }
        ck_assert_int_eq(kern_artifacts_install(set, KERN_ART_TIMING_OFF), 0);
        ck_assert_int_eq(memcmp(r[0], r[2], bytes), 0); /* the parity run serves native */
        ck_assert_int_eq(memcmp(r[1], r[2], bytes), 0); /* the artifact: native's bytes */
        for (int j = 0; j < 3; j++) free(r[j]);
        kern_free(b, q.data);
        kern_free(b, k.data);
        kern_free(b, v.data);
        kern_free(b, o.data);
    }
    int promoted = 0;
    kern_art_counts_t t;
    ck_assert_int_eq(kern_artifacts_totals(set, "cpu-attention-parsoftmax", &t, &promoted, NULL), 0);
    ck_assert_int_eq(promoted, 5);
    ck_assert(t.max_rel_seen == 0);
    kern_artifacts_destroy(&set);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
}
END_TEST

/* A mixed batch's attention (kern_attention_batch, ABI 3's batch): the
 * parity run sizes its shadow output for every sample (it was one
 * sample's: the artifact wrote past it), and both the parity run and the
 * promoted artifact give each sample native's bytes for it alone. */
START_TEST(test_example_attention_on_a_batch_is_each_samples_native_bytes) {
    static const int64_t shapes[][6] = { { 3, 32, 32, 2, 16, 0 }, { 4, 17, 5, 3, 8, 1 } }; /* B nq nk H d shared */
    kern_artifacts_t *set = install_only(root_with("cpu_attention_parsoftmax", NULL),
                                         "cpu-attention-parsoftmax", KERN_ART_TIMING_OFF);
    kern_backend_t *b = kern_backend_cpu_new();
    kern_stream_t *s = kern_stream_new(b);
    kern_artifacts_set_region("block.cross_attn");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t B = shapes[i][0], nq = shapes[i][1], nk = shapes[i][2], H = shapes[i][3], D = H * shapes[i][4];
        const bool shared = shapes[i][5] != 0;
        const int64_t kr = shared ? nk : B * nk;
        kern_tensor_t q = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ B * nq, D });
        kern_tensor_t k = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ kr, D });
        kern_tensor_t v = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ kr, D });
        kern_tensor_t o = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ B * nq, D });
        tdit_initial_latent(7, q.data, (size_t)(B * nq * D));
        tdit_initial_latent(8, k.data, (size_t)(kr * D));
        tdit_initial_latent(9, v.data, (size_t)(kr * D));
        size_t bytes = kern_tensor_bytes(&o);
        float *r[3] = { malloc(bytes), malloc(bytes), malloc(bytes) };
        for (int j = 0; j < 2; j++) { /* the parity run, then the promoted artifact */
            TS_OK(kern_attention_batch(s, &q, &k, &v, H, &o, B, shared));
            memcpy(r[j], o.data, bytes);
        }
        kern_artifacts_uninstall(set);
        for (int64_t sb = 0; sb < B; sb++) { /* native, sample by sample */
            kern_tensor_t qb = kern_tensor_make(q.data, KERN_F32, q.device, 2, (int64_t[]){ nq, D });
            kern_tensor_t ob = kern_tensor_make(o.data, KERN_F32, o.device, 2, (int64_t[]){ nq, D });
            kern_tensor_t kb = kern_tensor_make(k.data, KERN_F32, k.device, 2, (int64_t[]){ nk, D }), vb = kb;
            vb.data = v.data;
            qb.offset = ob.offset = (size_t)(sb * nq * D) * 4;
            if (!shared) kb.offset = vb.offset = (size_t)(sb * nk * D) * 4;
            TS_OK(kern_attention(s, &qb, &kb, &vb, H, &ob));
        }
        memcpy(r[2], o.data, bytes);
        ck_assert_int_eq(kern_artifacts_install(set, KERN_ART_TIMING_OFF), 0);
        ck_assert_msg(memcmp(r[0], r[2], bytes) == 0, "batch %zu: the parity run differs from native", i);
        ck_assert_msg(memcmp(r[1], r[2], bytes) == 0, "batch %zu: the artifact differs from native", i);
        for (int j = 0; j < 3; j++) free(r[j]);
        kern_free(b, q.data);
        kern_free(b, k.data);
        kern_free(b, v.data);
        kern_free(b, o.data);
    }
    int promoted = 0;
    kern_art_counts_t t;
    ck_assert_int_eq(kern_artifacts_totals(set, "cpu-attention-parsoftmax", &t, &promoted, NULL), 0);
    ck_assert_int_eq(promoted, 2);
    kern_artifacts_destroy(&set);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
}
END_TEST

/* The timing modes reach into graph replays on the CPU backend (the
 * trampoline a graph holds runs on the replaying thread): under SHADOW
 * every replay runs both kernels, times them and applies the parity rule,
 * and an artifact that goes wrong in a replay is demoted there, the
 * replay serving the native bytes and every later replay running native;
 * under SYNC every replay times the artifact's call. */
START_TEST(test_shadow_and_sync_timing_cover_graph_replays) {
    enum { M = 8, N = 16, K = 8, REPLAYS = 3 };
    static float native[M * N], got[M * N];
    gg_t g = gg_open(M, N, K);
    gg_run(&g, native);
    kern_artifacts_t *set = install_only(root_with("flaky", NULL), "test-flaky-gemm-gelu",
                                         KERN_ART_TIMING_SHADOW);
    gg_run(&g, got); /* the parity run: promoted */
    ck_assert_int_eq(key_of(set, "test-flaky-gemm-gelu").state, KERN_ART_PROMOTED);
    ck_assert_int_eq(kern_capture_begin(g.s), 0);
    ck_assert_int_eq(kern_gemm_gelu(g.s, &g.x, &g.w, &g.bias, &g.y), 0);
    kern_graph_t *graph = NULL;
    ck_assert_int_eq(kern_capture_end(g.s, &graph), 0);
    for (int i = 0; i < REPLAYS; i++) {
        memset(g.y.data, 0, sizeof got);
        ck_assert_int_eq(kern_graph_replay(graph, g.s), 0);
        ck_assert_int_eq(memcmp(g.y.data, native, sizeof got), 0);
    }
    kern_art_key_stats_t k = key_of(set, "test-flaky-gemm-gelu");
    ck_assert_uint_eq(k.n.timed, 1 + REPLAYS);       /* the parity run, and every replay */
    ck_assert_uint_eq(k.n.parity_pass, 1 + REPLAYS);
    ck_assert(k.n.speedup_min > 0);
    setenv("REEL_TEST_ARTIFACT_WRONG", "1", 1);      /* one ulp off from now on */
    memset(g.y.data, 0, sizeof got);
    ck_assert_int_eq(kern_graph_replay(graph, g.s), 0);
    ck_assert_int_eq(memcmp(g.y.data, native, sizeof got), 0); /* the native bytes served */
    k = key_of(set, "test-flaky-gemm-gelu");
    ck_assert_int_eq(k.state, KERN_ART_DEMOTED);
    ck_assert_msg(!strncmp(k.reason, "artifact_parity", 15), "%s", k.reason);
    ck_assert_uint_eq(k.n.parity_fail, 1);
    unsetenv("REEL_TEST_ARTIFACT_WRONG");
    ck_assert_int_eq(kern_graph_replay(graph, g.s), 0);
    ck_assert_int_eq(memcmp(g.y.data, native, sizeof got), 0);
    ck_assert_uint_eq(key_of(set, "test-flaky-gemm-gelu").n.native_calls, 1); /* demoted: native */
    kern_graph_destroy(&graph);
    kern_artifacts_destroy(&set);

    set = install_only(root_with("flaky", NULL), "test-flaky-gemm-gelu", KERN_ART_TIMING_SYNC);
    gg_run(&g, got);
    ck_assert_int_eq(kern_capture_begin(g.s), 0);
    ck_assert_int_eq(kern_gemm_gelu(g.s, &g.x, &g.w, &g.bias, &g.y), 0);
    ck_assert_int_eq(kern_capture_end(g.s, &graph), 0);
    for (int i = 0; i < REPLAYS; i++) ck_assert_int_eq(kern_graph_replay(graph, g.s), 0);
    k = key_of(set, "test-flaky-gemm-gelu");
    ck_assert_uint_eq(k.n.sync_timed, REPLAYS);
    ck_assert(k.n.sync_s > 0);
    kern_graph_destroy(&graph);
    kern_artifacts_destroy(&set);
    gg_close(&g);
}
END_TEST

START_TEST(test_runtime_failure_falls_back_to_native_counted_and_never_demotes) {
    enum { M = 8, N = 16, K = 8 };
    static float native[M * N], got[M * N];
    gg_t g = gg_open(M, N, K);
    gg_run(&g, native);
    kern_artifacts_t *set = install_only(root_with("flaky", NULL), "test-flaky-gemm-gelu",
                                         KERN_ART_TIMING_OFF);
    gg_run(&g, got); /* promoted */
    ck_assert_int_eq(key_of(set, "test-flaky-gemm-gelu").state, KERN_ART_PROMOTED);
    setenv("REEL_TEST_ARTIFACT_FAIL", "1", 1);
    for (int i = 0; i < 4; i++) {
        gg_run(&g, got);
        ck_assert_int_eq(memcmp(got, native, sizeof got), 0);
    }
    /* And in a replay: the graph holds the trampoline, which falls back. */
    ck_assert_int_eq(kern_capture_begin(g.s), 0);
    ck_assert_int_eq(kern_gemm_gelu(g.s, &g.x, &g.w, &g.bias, &g.y), 0);
    kern_graph_t *graph = NULL;
    ck_assert_int_eq(kern_capture_end(g.s, &graph), 0);
    memset(g.y.data, 0, sizeof got);
    ck_assert_int_eq(kern_graph_replay(graph, g.s), 0);
    ck_assert_int_eq(memcmp(g.y.data, native, sizeof got), 0);
    unsetenv("REEL_TEST_ARTIFACT_FAIL");
    memset(g.y.data, 0, sizeof got);
    ck_assert_int_eq(kern_graph_replay(graph, g.s), 0);
    ck_assert_int_eq(memcmp(g.y.data, native, sizeof got), 0);
    kern_graph_destroy(&graph);
    kern_art_key_stats_t k = key_of(set, "test-flaky-gemm-gelu");
    ck_assert_int_eq(k.state, KERN_ART_PROMOTED);
    ck_assert_uint_eq(k.n.fallbacks, 5);
    ck_assert_uint_eq(k.n.parity_fail, 0);
    kern_artifacts_destroy(&set);
    gg_close(&g);
}
END_TEST

START_TEST(test_an_artifact_failing_before_any_verdict_is_benched_after_three_tries) {
    enum { M = 8, N = 16, K = 8 };
    static float native[M * N], got[M * N];
    gg_t g = gg_open(M, N, K);
    gg_run(&g, native);
    kern_artifacts_t *set = install_only(root_with("flaky", NULL), "test-flaky-gemm-gelu",
                                         KERN_ART_TIMING_OFF);
    setenv("REEL_TEST_ARTIFACT_FAIL", "1", 1);
    for (int i = 0; i < 4; i++) {
        gg_run(&g, got);
        ck_assert_int_eq(memcmp(got, native, sizeof got), 0);
    }
    unsetenv("REEL_TEST_ARTIFACT_FAIL");
    kern_art_key_stats_t k = key_of(set, "test-flaky-gemm-gelu");
    ck_assert_int_eq(k.state, KERN_ART_FAILED);
    ck_assert_msg(strstr(k.reason, "failing on purpose") != NULL, "%s", k.reason);
    ck_assert_uint_eq(k.n.fallbacks, 3);
    ck_assert_uint_eq(k.n.native_calls, 1);
    kern_artifacts_destroy(&set);
    gg_close(&g);
}
END_TEST

START_TEST(test_an_artifact_asking_more_scratch_than_native_is_ineligible) {
    enum { M = 8, N = 16, K = 8 };
    static float native[M * N], got[M * N];
    gg_t g = gg_open(M, N, K);
    gg_run(&g, native);
    kern_artifacts_t *set = install_only(root_with("greedy", NULL), "test-greedy-gemm-gelu",
                                         KERN_ART_TIMING_OFF);
    gg_run(&g, got);
    ck_assert_int_eq(memcmp(got, native, sizeof got), 0);
    kern_art_key_stats_t k = key_of(set, "test-greedy-gemm-gelu");
    ck_assert_int_eq(k.state, KERN_ART_INELIGIBLE);
    ck_assert_msg(strstr(k.reason, "workspace: asks 1048576 bytes") != NULL, "%s", k.reason);
    kern_artifacts_destroy(&set);
    gg_close(&g);
}
END_TEST

START_TEST(test_shadow_timing_compares_every_call_and_sync_times_each_artifact_call) {
    enum { M = 64, N = 128, K = 32, CALLS = 6 };
    static float got[M * N];
    gg_t g = gg_open(M, N, K);
    kern_artifacts_t *set = install_only(root_with("cpu_gemm_gelu_epilogue", NULL),
                                         "cpu-gemm-gelu-epilogue", KERN_ART_TIMING_SHADOW);
    for (int i = 0; i < CALLS; i++) gg_run(&g, got);
    kern_art_key_stats_t k = key_of(set, "cpu-gemm-gelu-epilogue");
    ck_assert_int_eq(k.state, KERN_ART_PROMOTED);
    ck_assert_uint_eq(k.n.parity_pass, CALLS);
    ck_assert_uint_eq(k.n.timed, CALLS);
    ck_assert(k.n.native_s > 0 && k.n.artifact_s > 0);
    ck_assert(k.n.speedup_min > 0 && k.n.speedup_min <= k.n.speedup_mean &&
              k.n.speedup_mean <= k.n.speedup_max);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_int_eq(kern_artifacts_print(set, f, true, true), 0);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(text, "\"parity_pass\":6"));
    ck_assert_ptr_nonnull(strstr(text, "\"speedup\":"));
    free(text);
    kern_artifacts_destroy(&set);
    set = install_only(root_with("cpu_gemm_gelu_epilogue", NULL), "cpu-gemm-gelu-epilogue",
                       KERN_ART_TIMING_SYNC);
    for (int i = 0; i < CALLS; i++) gg_run(&g, got);
    k = key_of(set, "cpu-gemm-gelu-epilogue");
    ck_assert_uint_eq(k.n.timed, 1);          /* the parity run */
    ck_assert_uint_eq(k.n.sync_timed, CALLS - 1);
    ck_assert(k.n.sync_s > 0);
    kern_artifacts_destroy(&set);
    gg_close(&g);
}
END_TEST

/* ---- through the capture cache and the model ------------------------------------------- */

enum { NL = 4 * 2 * 8 * 8, NC = 5 * 32 };
static const tdit_shape_t SHAPE = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };

typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    tdit_model_t *m;
    float lat[NL], ctx[NC], unc[NC];
} model_t;

static void quiet(void *u, int level, const char *msg) { (void)u; (void)level; (void)msg; }

static model_t *model_open(void) {
    model_t *f = calloc(1, sizeof *f);
    f->b = kern_backend_cpu_new();
    f->s = kern_stream_new(f->b);
    f->m = tdit_model_load_path(f->b, weights, KERN_F32);
    TS_NEW(f->m);
    tdit_initial_latent(1, f->lat, NL);
    tdit_initial_latent(2, f->ctx, NC);
    tdit_initial_latent(3, f->unc, NC);
    return f;
}

static void model_close(model_t *f) {
    tdit_model_destroy(&f->m);
    kern_stream_destroy(&f->s);
    ck_assert_uint_eq(kern_bytes_in_use(f->b), 0);
    kern_backend_destroy(&f->b);
    free(f);
}

static const tdit_loop_t LOOP = { .steps = 6, .shift = 3.0, .guidance = 4.0f };

/* The pure eager loop, no cache (with whatever set is installed). */
static void eager(model_t *f, float *out) {
    tdit_ws_t *ws = tdit_ws_new(f->m, f->s, &SHAPE);
    ck_assert_msg(tdit_generate(f->m, ws, f->s, &LOOP, f->lat, f->ctx, f->unc, out, NULL) == 0,
                  "%s", reel_err_text());
    tdit_ws_destroy(&ws);
}

/* The loop through a fresh capture cache (warmup w). */
static void cached(model_t *f, int warmup, float *out, tdit_run_stats_t *st) {
    cap_options_t o = cap_options_default();
    o.log = quiet;
    o.warmup = warmup;
    o.audit_every = 2;
    cap_cache_t *c = cap_cache_new(f->b, &o);
    ck_assert_int_eq(tdit_register_weights(c, f->m, 1), 0);
    memset(st, 0, sizeof *st);
    ck_assert_msg(tdit_generate_cached(f->m, c, f->s, NULL, &SHAPE, &LOOP, f->lat, f->ctx, f->unc,
                                       out, st) == 0, "%s", reel_err_text());
    ck_assert(cap_cache_invariants(c));
    cap_cache_destroy(&c);
}

START_TEST(test_wrong_artifact_never_changes_a_served_result_and_the_call_declines_artifact_parity) {
    model_t *f = model_open();
    static float native[NL], got[NL];
    eager(f, native);
    kern_artifacts_t *set = install_only(root_with("wrong", "cpu_attention_parsoftmax", NULL),
                                         "test-wrong-gemm-gelu,cpu-attention-parsoftmax",
                                         KERN_ART_TIMING_SHADOW);
    tdit_run_stats_t st;
    cached(f, 2, got, &st);
    ck_assert_int_eq(memcmp(got, native, sizeof got), 0);
    ck_assert_int_eq(st.declines[CAP_DECLINE_ARTIFACT_PARITY], 1); /* the first call's */
    ck_assert_int_eq(st.declines[CAP_DECLINE_WARMING_UP], 1);
    ck_assert_int_eq(st.captured, 1);
    ck_assert_int_eq(st.replayed, LOOP.steps - 3);
    /* The report says which artifact failed, and which one is fine. */
    int promoted = 0, demoted = 0;
    kern_art_counts_t t;
    ck_assert_int_eq(kern_artifacts_totals(set, "test-wrong-gemm-gelu", &t, &promoted, &demoted), 0);
    ck_assert_int_eq(promoted, 0);
    /* The FFN's key under the one capture key: region "ffn" leaves the
     * text embedding's GEMM + GELU (the same op) native, unjudged. */
    ck_assert_int_eq(demoted, 1);
    kern_art_key_stats_t wk = key_of(set, "test-wrong-gemm-gelu");
    ck_assert_msg(strstr(wk.key, " @") != NULL, "%s", wk.key); /* judged under its capture key */
    ck_assert_int_eq(kern_artifacts_totals(set, "cpu-attention-parsoftmax", &t, &promoted, &demoted), 0);
    ck_assert_int_eq(promoted, 2); /* self and cross attention */
    ck_assert_int_eq(demoted, 0);
    eager(f, got);
    ck_assert_int_eq(memcmp(got, native, sizeof got), 0);
    kern_artifacts_destroy(&set);
    model_close(f);
}
END_TEST

START_TEST(test_correct_artifacts_are_promoted_captured_and_replayed_bitwise_equal_to_their_eager_run) {
    model_t *f = model_open();
    static float native[NL], eager_art[NL], got[NL];
    eager(f, native);
    kern_artifacts_t *set = install_only(root_with("cpu_gemm_gelu_epilogue", "cpu_attention_parsoftmax", NULL),
                                         "cpu-gemm-gelu-epilogue,cpu-attention-parsoftmax",
                                         KERN_ART_TIMING_OFF);
    tdit_run_stats_t st;
    cached(f, 2, got, &st);
    eager(f, eager_art);
    ck_assert_int_eq(st.captured, 1);
    ck_assert_int_eq(st.replayed, LOOP.steps - 3);
    ck_assert_int_eq(st.declines[CAP_DECLINE_ARTIFACT_PARITY], 0);
    ck_assert_int_eq(memcmp(got, eager_art, sizeof got), 0);
    ck_assert_int_eq(memcmp(got, native, sizeof got), 0); /* byte_equal artifacts */
    /* Per capture key: the FFN's GEMM + GELU, self- and cross-attention
     * under the cache's one capture key, and the same three again for the
     * eager loop outside the cache (no capture key): each judged apart. */
    kern_art_key_stats_t ks[16];
    size_t n = kern_artifacts_keys(set, ks, 16), scoped = 0;
    ck_assert_uint_eq(n, 6);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(ks[i].state, KERN_ART_PROMOTED);
        ck_assert_uint_ge(ks[i].n.calls, 1);
        if (strstr(ks[i].key, " @")) {
            scoped++;
            ck_assert_uint_gt(ks[i].n.calls, 1); /* eager, captured: replays are not dispatches */
        }
    }
    ck_assert_uint_eq(scoped, 3);
    kern_artifacts_destroy(&set);
    model_close(f);
}
END_TEST

START_TEST(test_an_artifact_with_its_own_bytes_is_captured_and_its_graph_replays_them) {
    model_t *f = model_open();
    static float native[NL], eager_art[NL], got[NL];
    eager(f, native);
    kern_artifacts_t *set = install_only(root_with("close", NULL), "test-close-gemm-gelu",
                                         KERN_ART_TIMING_OFF);
    eager(f, eager_art);
    kern_artifacts_destroy(&set);
    set = install_only(root_with("close", NULL), "test-close-gemm-gelu", KERN_ART_TIMING_OFF);
    tdit_run_stats_t st;
    cached(f, 2, got, &st);
    ck_assert_int_eq(st.captured, 1);
    ck_assert_int_eq(st.replayed, LOOP.steps - 3);
    ck_assert_int_ne(memcmp(eager_art, native, sizeof got), 0); /* it is another kernel */
    ck_assert_int_eq(memcmp(got, eager_art, sizeof got), 0);    /* and the graph ran it */
    kern_artifacts_destroy(&set);
    model_close(f);
}
END_TEST

START_TEST(test_shadow_mode_catches_an_artifact_going_wrong_inside_a_capture_and_recaptures_native) {
    model_t *f = model_open();
    static float native[NL], got[NL];
    eager(f, native);
    kern_artifacts_t *set = install_only(root_with("flaky", NULL), "test-flaky-gemm-gelu",
                                         KERN_ART_TIMING_SHADOW);
    cap_options_t o = cap_options_default();
    o.log = quiet;
    cap_cache_t *c = cap_cache_new(f->b, &o);
    ck_assert_int_eq(tdit_register_weights(c, f->m, 1), 0);
    tdit_req_t *r = tdit_req_new(f->m, f->s, &SHAPE, &LOOP, f->lat, f->ctx, f->unc);
    TS_NEW(r);
    cap_result_t res[LOOP.steps];
    for (int i = 0; i < LOOP.steps; i++) {
        /* Promoted in warmup; from the capture on it is one ulp off. */
        if (i == 2) setenv("REEL_TEST_ARTIFACT_WRONG", "1", 1);
        TS_OK(tdit_req_step(r, c, f->s, &res[i]));
    }
    unsetenv("REEL_TEST_ARTIFACT_WRONG");
    /* The capture's verify ran the artifact in the replay and, in shadow,
     * beside native in the eager run: demoted there, so the graph (which
     * held the artifact) is dropped instead of the entry being disabled,
     * and the next call captures native. */
    ck_assert_int_eq(res[2].ran, CAP_RAN_EAGER);
    ck_assert_int_eq(res[2].reason, CAP_DECLINE_ARTIFACT_PARITY);
    ck_assert_int_eq(res[3].ran, CAP_RAN_CAPTURED);
    ck_assert_int_eq(res[4].ran, CAP_RAN_REPLAYED);
    ck_assert_int_eq(res[5].ran, CAP_RAN_REPLAYED);
    ck_assert_int_eq(tdit_req_read(r, f->s, got, NL), 0);
    ck_assert_int_eq(memcmp(got, native, sizeof got), 0); /* its wrong bytes never served */
    cap_stats_t cs;
    cap_cache_stats(c, &cs);
    ck_assert_uint_eq(cs.declines[CAP_DECLINE_VERIFY_MISMATCH], 0);
    ck_assert(cap_cache_invariants(c));
    kern_art_counts_t t;
    int demoted = 0;
    ck_assert_int_eq(kern_artifacts_totals(set, "test-flaky-gemm-gelu", &t, NULL, &demoted), 0);
    ck_assert_int_ge(demoted, 1);
    tdit_req_destroy(&r);
    cap_cache_destroy(&c);
    kern_artifacts_destroy(&set);
    model_close(f);
}
END_TEST

START_TEST(test_corrupt_bundles_leave_the_model_serving_native_results) {
    model_t *f = model_open();
    static float native[NL], got[NL];
    eager(f, native);
    const char *root = root_with("wrong", "flaky", "abi2", NULL);
    write_file(root, "wrong", "manifest.json", "not json");
    sh("rm '%s/flaky/libtest_flaky.so'", root);
    kern_artifacts_t *set = scan(root);
    ck_assert_uint_eq(kern_artifacts_refused(set), 2);
    ck_assert_int_eq(kern_artifacts_enable(set, NULL, 0), 0);
    ck_assert_int_eq(kern_artifacts_install(set, KERN_ART_TIMING_OFF), 0);
    tdit_run_stats_t st;
    cached(f, 2, got, &st);
    ck_assert_int_eq(memcmp(got, native, sizeof got), 0);
    size_t loaded = 0;
    for (size_t i = 0; i < kern_artifacts_count(set); i++) loaded += kern_artifacts_bundle(set, i).loaded;
    ck_assert_uint_eq(loaded, 0);
    kern_artifacts_destroy(&set);
    model_close(f);
}
END_TEST

/* ---- reel-worker ---------------------------------------------------------------------- */

START_TEST(test_worker_refuses_to_start_when_the_allowlist_names_an_unknown_id) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", NULL);
    char log[256];
    snprintf(log, sizeof log, "%s/worker-unknown.log", dir);
    char cmd[PATH_MAX + 1024];
    snprintf(cmd, sizeof cmd, "timeout 30 '%.1024s/reel-worker' --name w1 --weights '%s' --broker "
             "ipc://%s/none --artifacts '%s' --artifacts-enable cpu-gemm-gelu-epilogue,nope "
             ">'%s' 2>&1", build, weights, dir, root, log);
    int st = system(cmd);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 2, "exit status %d", st);
    sh("grep -q \"unknown id 'nope' in the allowlist\" '%s'", log);
    sh("! grep -q 'ready' '%s'", log);
}
END_TEST

/* A real broker and a worker with a corrupt bundle, the wrong artifact and
 * a correct one enabled in shadow timing: the worker reports the corrupt
 * bundle, serves, demotes the wrong artifact with artifact_parity, and
 * `reelctl gen` returns exactly what `reelctl run` (no artifacts) does;
 * the catalog then holds every bundle and key, and `reelctl artifacts
 * report --catalog`, `stats` and `metrics` show them. */
START_TEST(test_worker_with_corrupt_and_wrong_bundles_serves_native_results_and_the_catalog_says_which_failed) {
    const char *root = root_with("wrong", "flaky", "cpu_attention_parsoftmax", NULL);
    sh("rm '%s/flaky/libtest_flaky.so'", root);
    char script[256];
    snprintf(script, sizeof script, "%s/cluster.sh", dir);
    FILE *f = fopen(script, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
        "set -u\nB='%s'; D='%s'; W='%s'; ROOT='%s'\n"
        /* Under TSan the daemons' libzmq (not instrumented) reads as racy:
         * the in-process suites are where TSan looks, not these processes. */
        "export TSAN_OPTIONS=report_bugs=0\n"
        "wait_for() { i=0; while [ $i -lt 200 ]; do grep -q \"$2\" \"$1\" && return 0; sleep 0.1; i=$((i+1)); done; "
        "echo \"timed out waiting for $2 in $1\"; cat \"$1\"; return 1; }\n"
        "$B/reel-broker --clients ipc://$D/c --workers ipc://$D/w --catalog $D/reel.db "
        "--heartbeat-ms 200 >$D/broker.log 2>&1 & BP=$!\n"
        /* The worker beats as often as the broker expects (its default is
         * 1 s, past the broker's 600 ms liveness here): else an idle moment
         * expires it and its request is run twice. */
        "$B/reel-worker --name w1 --weights $W --broker ipc://$D/w --artifacts $ROOT "
        "--artifact-timing shadow --heartbeat-ms 200 >$D/worker.log 2>&1 & WP=$!\n"
        "trap 'kill $WP $BP 2>/dev/null; wait 2>/dev/null' EXIT\n"
        "wait_for $D/broker.log 'worker w1 ready' || exit 1\n"
        "grep -q 'artifact refused: bundle flaky: the shared object libtest_flaky.so is missing' "
        "$D/worker.log || { cat $D/worker.log; exit 1; }\n"
        "$B/reelctl tensor rand --name context --shape 5,32 --seed 2 --out $D/ctx.safetensors >/dev/null || exit 1\n"
        "timeout 60 $B/reelctl gen --broker ipc://$D/c --model tiny --context $D/ctx.safetensors "
        "--size 2x8x8 --seed 3 --steps 6 --timeout-ms 30000 --out $D/g.safetensors 2>$D/gen.log || "
        "{ cat $D/gen.log $D/worker.log; exit 1; }\n"
        "grep -q 'artifact_parity=1' $D/gen.log || { cat $D/gen.log; exit 1; }\n"
        "timeout 60 $B/reelctl run --weights $W --context $D/ctx.safetensors --size 2x8x8 --seed 3 "
        "--steps 6 --out $D/r.safetensors 2>/dev/null || exit 1\n"
        "$B/reelctl tensor diff $D/g.safetensors $D/r.safetensors || exit 1\n"
        "grep -q 'artifact test-wrong-gemm-gelu demoted at gemm_gelu' $D/worker.log || { cat $D/worker.log; exit 1; }\n"
        "grep -q 'artifact cpu-attention-parsoftmax promoted at attention' $D/worker.log || exit 1\n"
        /* A clean stop sends the final counters; the broker's writer
         * commits everything queued before it exits. */
        "kill -TERM $WP; wait $WP; kill -TERM $BP; wait $BP; trap - EXIT\n"
        "$B/reelctl artifacts report --catalog $D/reel.db --json > $D/report.json || exit 1\n"
        "$B/reelctl metrics --catalog $D/reel.db > $D/metrics.txt || exit 1\n"
        "$B/reelctl stats --catalog $D/reel.db > $D/stats.txt || exit 1\n"
        "/usr/bin/python3 - $D <<'PY' || { cat $D/report.json $D/metrics.txt; exit 1; }\n"
        "import json, sys\n"
        "d = sys.argv[1]\n"
        "r = json.load(open(d + '/report.json'))\n"
        "a = {x['id']: x for x in r['artifacts']}\n"
        "w = a['test-wrong-gemm-gelu']\n"
        "assert w['status'] == 'loaded' and w['verified'] == 1 and w['enabled'] == 1, w\n"
        "assert w['demoted'] == 1 and w['promoted'] == 0 and w['parity_fail'] == 1, w\n"
        "assert a['test-flaky-gemm-gelu']['status'] == 'refused', a\n"
        "assert 'libtest_flaky.so is missing' in a['test-flaky-gemm-gelu']['reason'], a\n"
        "p = a['cpu-attention-parsoftmax']\n"
        "assert p['promoted'] == 2 and p['calls'] > 2 and p['timed'] > 0 and p['speedup'] > 0, p\n"
        "ks = [k for k in r['keys'] if k['id'] == 'test-wrong-gemm-gelu']\n"
        "assert all(k['state'] == 'demoted' and k['reason'].startswith('artifact_parity') for k in ks), ks\n"
        "m = open(d + '/metrics.txt').read()\n"
        "assert 'reel_artifact_parity_total{artifact=\"test-wrong-gemm-gelu\",result=\"fail\"} 1' in m, m\n"
        "assert 'reel_declines_total{worker=\"w1\",reason=\"artifact_parity\"} 1' in m, m\n"
        "assert 'cpu-attention-parsoftmax' in open(d + '/stats.txt').read()\n"
        "PY\n",
        build, dir, weights, root);
    fclose(f);
    sh("timeout 120 sh '%s'", script);
}
END_TEST

/* A real worker pointed at a directory where every kind of bad bundle sits
 * beside a good one: a corrupt manifest, a hash mismatch, an ABI other
 * than this Reel's in the manifest, an object built for another ABI,
 * a missing shared object, and two bundles with one id. It starts, logs
 * each refusal naming the bundle and why, loads the good one, and serves
 * a gen that is exactly what `reelctl run` computes; `reelctl artifacts
 * verify` says the same of the directory (and exits 1). */
START_TEST(test_worker_reports_every_kind_of_bad_bundle_and_serves) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", "wrong", "close", "greedy", "abi2", "flaky",
                                 "cpu_attention_parsoftmax", NULL);
    write_file(root, "wrong", "manifest.json", "{\"id\": \"broken\", ");  /* corrupt manifest */
    sh("printf 'x' >> '%s/close/libtest_close.so'", root);               /* hash mismatch */
    sh("sed -i 's/\"abi\": 3/\"abi\": 1/' '%s/greedy/manifest.json'", root); /* manifest ABI */
    sh("rm '%s/flaky/libtest_flaky.so'", root);                          /* missing object */
    sh("cp -r '%s/cpu_attention_parsoftmax' '%s/copy_of_attention'", root, root); /* duplicate id */
    char script[256];
    snprintf(script, sizeof script, "%s/bad-bundles.sh", dir);
    FILE *f = fopen(script, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
        "set -u\nB='%s'; D='%s/bad'; W='%s'; ROOT='%s'\nmkdir -p $D\n"
        "export TSAN_OPTIONS=report_bugs=0\n"
        "wait_for() { i=0; while [ $i -lt 200 ]; do grep -q \"$2\" \"$1\" && return 0; sleep 0.1; i=$((i+1)); done; "
        "echo \"timed out waiting for $2 in $1\"; cat \"$1\"; return 1; }\n"
        "need() { grep -q \"$1\" $D/worker.log || { echo \"worker.log lacks: $1\"; cat $D/worker.log; exit 1; }; }\n"
        "$B/reel-broker --clients ipc://$D/c --workers ipc://$D/w --catalog $D/reel.db --heartbeat-ms 200 "
        ">$D/broker.log 2>&1 & BP=$!\n"
        "$B/reel-worker --name w1 --weights $W --broker ipc://$D/w --artifacts $ROOT --heartbeat-ms 200 "
        ">$D/worker.log 2>&1 & WP=$!\n"
        "trap 'kill $WP $BP 2>/dev/null; wait 2>/dev/null' EXIT\n"
        "wait_for $D/broker.log 'worker w1 ready' || exit 1\n"
        "need 'artifact refused: bundle wrong: .*manifest'\n"
        "need 'artifact refused: bundle close: hash mismatch for libtest_close.so'\n"
        "need 'artifact refused: bundle greedy: .*ABI'\n"
        "need 'artifact refused: bundle abi2: .*ABI'\n"
        "need 'artifact refused: bundle flaky: the shared object libtest_flaky.so is missing'\n"
        "need 'artifact refused: bundle copy_of_attention: .*cpu-attention-parsoftmax'\n"
        "need 'artifact refused: bundle cpu_attention_parsoftmax: .*cpu-attention-parsoftmax'\n"
        "need 'artifact cpu-gemm-gelu-epilogue .*loaded'\n"
        "$B/reelctl tensor rand --name context --shape 5,32 --seed 2 --out $D/ctx.safetensors >/dev/null || exit 1\n"
        "timeout 60 $B/reelctl gen --broker ipc://$D/c --model tiny --context $D/ctx.safetensors "
        "--size 2x8x8 --seed 3 --steps 4 --timeout-ms 30000 --out $D/g.safetensors 2>$D/gen.log || "
        "{ cat $D/gen.log $D/worker.log; exit 1; }\n"
        "timeout 60 $B/reelctl run --weights $W --context $D/ctx.safetensors --size 2x8x8 --seed 3 "
        "--steps 4 --out $D/r.safetensors 2>/dev/null || exit 1\n"
        "$B/reelctl tensor diff $D/g.safetensors $D/r.safetensors || exit 1\n"
        "kill -0 $WP || { echo 'the worker died'; exit 1; }\n"
        "$B/reelctl artifacts verify $ROOT > $D/list.txt 2>/dev/null; rc=$?\n"
        "[ $rc = 1 ] || { echo \"artifacts verify exit $rc\"; cat $D/list.txt; exit 1; }\n"
        "n=$(grep -c ' refused ' $D/list.txt); [ \"$n\" = 7 ] || { echo \"$n refused\"; cat $D/list.txt; exit 1; }\n"
        "grep -q 'cpu-gemm-gelu-epilogue .* loaded ' $D/list.txt || { cat $D/list.txt; exit 1; }\n",
        build, dir, weights, root);
    fclose(f);
    sh("timeout 120 sh '%s'", script);
}
END_TEST

START_TEST(test_an_unreadable_root_is_an_error_naming_it) {
    ck_assert_ptr_null(kern_artifacts_scan("/nonexistent/reel-artifacts"));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "/nonexistent/reel-artifacts"));
}
END_TEST

/* A bundle given where the folder of bundles belongs would scan as an
 * empty set ("nothing refused" reads as a pass): refused, naming it. */
START_TEST(test_a_bundle_given_as_the_root_is_refused_not_read_as_an_empty_set) {
    const char *root = root_with("cpu_gemm_gelu_epilogue", NULL);
    char one[256];
    snprintf(one, sizeof one, "%s/cpu_gemm_gelu_epilogue", root);
    reel_err_clear();
    ck_assert_ptr_null(kern_artifacts_scan(one));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "is a bundle"));
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    kern_artifacts_t *set = scan(root); /* its folder scans as before */
    ck_assert_uint_eq(kern_artifacts_count(set), 1);
    kern_artifacts_destroy(&set);
}
END_TEST

int main(void) {
    Suite *su = suite_create("artifacts");
    TCase *tc = tcase_create("artifacts");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_manifest_schema_accepts_a_good_one_and_names_every_bad_field);
    tcase_add_test(tc, test_timing_and_parity_names_parse_and_junk_is_refused);
    tcase_add_test(tc, test_example_bundles_verify_and_load_and_list_shows_them);
    tcase_add_test(tc, test_corrupt_manifest_is_refused_naming_the_bundle_and_the_others_still_load);
    tcase_add_test(tc, test_hash_mismatch_is_refused_naming_the_file);
    tcase_add_test(tc, test_abi_mismatch_in_the_manifest_is_refused_before_anything_loads);
    tcase_add_test(tc, test_object_built_for_another_abi_is_refused_at_load_and_named);
    tcase_add_test(tc, test_missing_shared_object_is_refused);
    tcase_add_test(tc, test_a_file_the_manifest_does_not_list_is_refused);
    tcase_add_test(tc, test_duplicate_id_refuses_both_bundles);
    tcase_add_test(tc, test_unknown_id_in_the_allowlist_is_an_error_naming_it);
    tcase_add_test(tc, test_allowlist_naming_a_refused_bundle_is_an_error);
    tcase_add_test(tc, test_the_allowlist_narrows_what_loads);
    tcase_add_test(tc, test_wrong_artifact_is_demoted_with_artifact_parity_and_never_changes_an_op_result);
    tcase_add_test(tc, test_example_gemm_gelu_is_promoted_and_equal_to_native_at_every_shape);
    tcase_add_test(tc, test_example_attention_is_promoted_and_equal_to_native_at_every_shape);
    tcase_add_test(tc, test_example_attention_on_a_batch_is_each_samples_native_bytes);
    tcase_add_test(tc, test_runtime_failure_falls_back_to_native_counted_and_never_demotes);
    tcase_add_test(tc, test_an_artifact_replaces_its_op_only_in_its_region);
    tcase_add_test(tc, test_each_capture_key_gets_its_own_shadow_run_and_verdict);
    tcase_add_test(tc, test_shadow_and_sync_timing_cover_graph_replays);
    tcase_add_test(tc, test_worker_reports_every_kind_of_bad_bundle_and_serves);
    tcase_add_test(tc, test_an_artifact_failing_before_any_verdict_is_benched_after_three_tries);
    tcase_add_test(tc, test_an_artifact_asking_more_scratch_than_native_is_ineligible);
    tcase_add_test(tc, test_shadow_timing_compares_every_call_and_sync_times_each_artifact_call);
    tcase_add_test(tc, test_wrong_artifact_never_changes_a_served_result_and_the_call_declines_artifact_parity);
    tcase_add_test(tc, test_correct_artifacts_are_promoted_captured_and_replayed_bitwise_equal_to_their_eager_run);
    tcase_add_test(tc, test_an_artifact_with_its_own_bytes_is_captured_and_its_graph_replays_them);
    tcase_add_test(tc, test_shadow_mode_catches_an_artifact_going_wrong_inside_a_capture_and_recaptures_native);
    tcase_add_test(tc, test_corrupt_bundles_leave_the_model_serving_native_results);
    tcase_add_test(tc, test_an_unreadable_root_is_an_error_naming_it);
    tcase_add_test(tc, test_a_bundle_given_as_the_root_is_refused_not_read_as_an_empty_set);
    tcase_add_test(tc, test_worker_refuses_to_start_when_the_allowlist_names_an_unknown_id);
    /* A real broker and worker: the main suite runs it; under the
     * sanitizers' unit-only runs the daemons are sanitizer builds, and TSan
     * reports races inside the uninstrumented libzmq. */
    if (!getenv("REEL_UNIT_ONLY"))
        tcase_add_test(tc, test_worker_with_corrupt_and_wrong_bundles_serves_native_results_and_the_catalog_says_which_failed);
    else
        printf("test_artifacts: the broker+worker process test runs in the main suite only (REEL_UNIT_ONLY)\n");
    suite_add_tcase(su, tc);
    return ts_run(su);
}
