/* test_row_groups.c -- the batch-wide ops a mixed batch's step runs (one
 * launch for every sample: kernels/ops.h "Row groups", kern_add_repeat,
 * kern_rmsnorm_rope3d over B samples, kern_attention_batch) on the CPU:
 * bitwise the same ops called group by group (tests/row_groups_check.h,
 * which test_cuda.c runs on CUDA too), the refusals of malformed groups,
 * and a mixed step whose block ops are one graph node each whatever the
 * batch size. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/tinydit.h"
#include "tests/row_groups_check.h"
#include "tests/support.h"

static kern_backend_t *B;
static kern_stream_t *S;

static void setup(void) {
    B = kern_backend_cpu_new();
    ck_assert_ptr_nonnull(B);
    S = kern_stream_new(B);
    ck_assert_ptr_nonnull(S);
}

static void teardown(void) {
    kern_stream_destroy(&S);
    ck_assert_msg(kern_bytes_in_use(B) == 0, "%zu bytes leaked", kern_bytes_in_use(B));
    kern_backend_destroy(&B);
}

static void bitwise(const char *name) {
    char why[512];
    ck_assert_msg(rg_check(B, S, KERN_F32, name, why, sizeof why) == 0, "%s", why);
}

START_TEST(test_layernorm_modulate_by_row_groups_is_bitwise_each_group_alone) { bitwise("layernorm_modulate"); }
END_TEST
START_TEST(test_residual_layernorm_modulate_by_row_groups_is_bitwise_each_group_alone) {
    bitwise("residual_layernorm_modulate");
}
END_TEST
START_TEST(test_residual_layernorm_with_a_gate_per_group_is_bitwise_each_group_alone) { bitwise("residual_layernorm"); }
END_TEST
START_TEST(test_gated_residual_with_a_gate_per_group_is_bitwise_each_group_alone) { bitwise("gated_residual"); }
END_TEST
START_TEST(test_add_repeat_is_bitwise_add_over_each_repeat) { bitwise("add_repeat"); }
END_TEST
START_TEST(test_rmsnorm_rope3d_over_b_samples_is_bitwise_each_sample_alone) { bitwise("rmsnorm_rope3d"); }
END_TEST
START_TEST(test_attention_batch_is_bitwise_each_sample_alone_on_every_cpu_way) { bitwise("attention"); }
END_TEST
START_TEST(test_attention_batch_with_shared_keys_is_bitwise_each_sample_alone) { bitwise("attention_shared_kv"); }
END_TEST
START_TEST(test_timestep_embed_by_sigma_rows_is_bitwise_each_row_alone) { bitwise("timestep_embed"); }
END_TEST
START_TEST(test_cfg_combine_with_a_guidance_per_sample_is_bitwise_each_sample_alone) { bitwise("cfg_combine"); }
END_TEST
START_TEST(test_euler_with_sigmas_per_sample_is_bitwise_each_sample_alone) { bitwise("euler"); }
END_TEST
START_TEST(test_patchify_and_unpatchify_of_a_batch_are_each_samples_exact_copies) { bitwise("patchify"); }
END_TEST

/* A [G, D] view of rows k, k + every, ... of t. */
static kern_tensor_t every_row(const kern_tensor_t *t, int64_t k, int64_t every, int64_t G) {
    kern_tensor_t v = kern_tensor_make(t->data, t->dtype, t->device, 2, (int64_t[]){ G, t->shape[1] });
    v.offset = t->offset + (size_t)(k * t->shape[1]) * 4;
    v.stride[0] = every * t->shape[1];
    return v;
}

static void refused(int rc, const char *want) {
    ck_assert_int_eq(rc, -1);
    ck_assert_msg(strstr(reel_err_text(), want) != NULL, "wanted '%s' in: %s", want, reel_err_text());
}

START_TEST(test_malformed_row_groups_are_refused_with_a_message_and_nothing_written) {
    const int64_t D = 8;
    kern_tensor_t x = kern_tensor_alloc(B, KERN_F32, 2, (int64_t[]){ 12, D });
    kern_tensor_t y = kern_tensor_alloc(B, KERN_F32, 2, (int64_t[]){ 12, D });
    kern_tensor_t P = kern_tensor_alloc(B, KERN_F32, 2, (int64_t[]){ 30, D });
    ck_assert(x.data && y.data && P.data);
    float *hx = kern_tensor_ptr(&x), *hy = kern_tensor_ptr(&y), *hp = kern_tensor_ptr(&P);
    for (int i = 0; i < 12 * D; i++) hx[i] = hy[i] = 0.25f * (float)(i % 7);
    for (int i = 0; i < 30 * D; i++) hp[i] = 0.5f;
    kern_tensor_t s3 = every_row(&P, 0, 6, 3), s4 = every_row(&P, 1, 6, 4), s5 = every_row(&P, 0, 6, 5);
    /* groups that disagree, that do not divide the rows, a column stride */
    refused(kern_layernorm_modulate(S, &x, &s3, &s4, 1e-6f, &y), "parameters for 3 and for 4 row groups");
    refused(kern_layernorm_modulate(S, &x, &s5, &s5, 1e-6f, &y), "5 row groups do not divide 12 rows");
    kern_tensor_t col = s3;
    col.stride[1] = 2;
    refused(kern_gated_residual(S, &x, &y, &col), "unit column stride");
    kern_tensor_t narrow = s3;
    narrow.stride[0] = D - 1; /* rows that overlap: not rows of a batch */
    refused(kern_residual_layernorm_modulate(S, &x, &y, NULL, &narrow, &s3, 1e-6f, &y), "unit column stride");
    /* an affine LayerNorm's weight is the model's, never per group */
    kern_tensor_t out = kern_tensor_alloc(B, KERN_F32, 2, (int64_t[]){ 12, D });
    ck_assert_ptr_nonnull(out.data);
    refused(kern_residual_layernorm(S, &x, &y, &s3, &s3, NULL, 1e-6f, &out), "shared by every row");
    /* nothing written by any refusal */
    for (int i = 0; i < 12 * D; i++) ck_assert_float_eq(hx[i], 0.25f * (float)(i % 7));
    for (int i = 0; i < 12 * D; i++) ck_assert_float_eq(hy[i], 0.25f * (float)(i % 7));
    /* add: a repeated must divide b; y must not overlap a repeated a */
    kern_tensor_t a5 = kern_tensor_make(hp, KERN_F32, KERN_DEVICE_HOST, 1, (int64_t[]){ 5 });
    a5.data = P.data;
    refused(kern_add_repeat(S, &a5, &x, &y), "a multiple of a's element count");
    kern_tensor_t a8 = kern_tensor_row(&x, 0);
    refused(kern_add_repeat(S, &a8, &y, &x), "y overlaps the repeated a");
    kern_tensor_t y8 = kern_tensor_row(&y, 0);
    refused(kern_add(S, &a8, &y, &y8), "a's element count"); /* plain add still wants equal counts */
    /* rope: rows must be whole samples; attention: the batch must divide */
    kern_tensor_t w = kern_tensor_row(&P, 0);
    refused(kern_rmsnorm_rope3d(S, &x, &w, 1e-6f, 2, 1, 1, 5), "B samples' tokens");
    refused(kern_attention_batch(S, &x, &y, &y, 2, &out, 5, false), "5 samples do not divide q's 12 rows");
    refused(kern_attention_batch(S, &x, &y, &y, 2, &out, 0, true), "must be >= 1");
    /* the per-step ops: scalars that do not divide, shapes that do not match */
    kern_tensor_t g5 = kern_tensor_make(P.data, KERN_F32, P.device, 1, (int64_t[]){ 5 });
    refused(kern_cfg_combine_rows(S, &x, &y, &g5, &out), "5 guidance scales do not divide 96 elements");
    kern_tensor_t sig1 = kern_tensor_make(P.data, KERN_F32, P.device, 1, (int64_t[]){ 6 });
    refused(kern_euler_update_rows(S, &x, &y, &sig1), "[S, k >= 2]");
    kern_tensor_t sig5 = kern_tensor_make(P.data, KERN_F32, P.device, 2, (int64_t[]){ 5, 3 });
    refused(kern_euler_update_rows(S, &x, &y, &sig5), "5 samples' sigmas do not divide 96 elements");
    refused(kern_timestep_embed_rows(S, &sig5, &x), "[S, even width]");
    kern_tensor_t lat = kern_tensor_make(P.data, KERN_F32, P.device, 5, (int64_t[]){ 2, 1, 1, 4, 4 });
    refused(kern_patchify(S, &lat, &x), "[B*F*H/2*W/2, 4C]"); /* 2 samples of 4 tokens of 4: not [12, 8] */
    for (int i = 0; i < 12 * D; i++) ck_assert_float_eq(hx[i], 0.25f * (float)(i % 7));
    kern_free(B, x.data);
    kern_free(B, y.data);
    kern_free(B, P.data);
    kern_free(B, out.data);
}
END_TEST

/* Nodes of g whose kernel is op's CPU kernel. */
static size_t nodes_of(kern_graph_t *g, kern_op_t op) {
    const kern_impl_t *impl = kern_registry_lookup(op, KERN_BACKEND_CPU, KERN_F32);
    ck_assert_ptr_nonnull(impl);
    size_t n = 0;
    for (size_t i = 0; i < kern_graph_nodes(g); i++) {
        int (*fn)(void *, const void *);
        const void *args;
        ck_assert_int_eq(kern_graph_node(g, i, &fn, &args), 0);
        n += fn == impl->fn;
    }
    return n;
}

/* The captured CFG step of a mixed batch of b tiny requests. */
static kern_graph_t *mixed_graph(tdit_model_t *m, int64_t b, tdit_ws_t **ws) {
    tdit_shape_t sh = { 2, 8, 8, 5, true, b, TDIT_SOLVER_EULER, true, TDIT_SOLVER_EULER };
    *ws = tdit_ws_new(m, S, &sh);
    ck_assert_msg(*ws != NULL, "%s", reel_err_text());
    const size_t nl = 4 * 2 * 8 * 8, nc = 5 * 32;
    float lat[4 * 2 * 8 * 8], ctx[5 * 32], unc[5 * 32];
    for (int64_t i = 0; i < b; i++) {
        const float sig[3] = { 0.9f, 0.8f, 0.9f };
        ts_fill_uniform(lat, nl, 10 + (uint64_t)i, -1, 1);
        ts_fill_uniform(ctx, nc, 20 + (uint64_t)i, -1, 1);
        ts_fill_uniform(unc, nc, 30 + (uint64_t)i, -1, 1);
        ck_assert_int_eq(tdit_ws_bind_sample_latent(*ws, S, i, lat, nl), 0);
        ck_assert_int_eq(tdit_ws_bind_sample(*ws, S, i, ctx, unc, nc, sig, 3.0f), 0);
    }
    kern_graph_t *g = NULL;
    ck_assert_int_eq(tdit_step(m, *ws, S), 0); /* eager first: the GEMM merge verdicts */
    ck_assert_int_eq(kern_capture_begin(S), 0);
    ck_assert_msg(tdit_step(m, *ws, S) == 0, "%s", reel_err_text());
    ck_assert_int_eq(kern_capture_end(S, &g), 0);
    return g;
}

START_TEST(test_a_mixed_steps_block_ops_are_one_node_each_whatever_the_batch) {
    char dir[64], path[128];
    ts_mkdtemp(dir, sizeof dir, "test-rowgroups");
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    ts_tiny_weights(3, path);
    tdit_model_t *m = tdit_model_load_path(B, path, KERN_F32);
    ck_assert_msg(m != NULL, "%s", reel_err_text());
    const int64_t layers = tdit_model_config(m)->layers;
    tdit_ws_t *w2, *w8;
    kern_graph_t *g2 = mixed_graph(m, 2, &w2), *g8 = mixed_graph(m, 8, &w8);
    /* per block and branch (CFG: 2): one adaLN, one residual + LN each
     * (2), one gated residual, two RMSNorm+RoPE, two attentions, one
     * modulation add (plus the head's two adds and its adaLN); the
     * unconditional branch starts from the conditional one's context-free
     * part (docs/MODEL.md "Loop"), so it runs `shared` fewer: the first
     * block's adaLN, self-attention residual + LN, RMSNorm+RoPEs and
     * self-attention */
    struct { kern_op_t op; size_t per_block, head, shared; } want[] = {
        { KERN_OP_LAYERNORM_MODULATE, 1, 1, 1 }, { KERN_OP_RESIDUAL_NORM, 2, 0, 1 }, { KERN_OP_GATED_RESIDUAL, 1, 0, 0 },
        { KERN_OP_RMSNORM_ROPE3D, 2, 0, 2 },     { KERN_OP_ATTENTION, 2, 0, 1 },     { KERN_OP_ADD, 1, 2, 0 },
        /* and per branch outside the blocks: the time embedding, its two
         * SiLUs, patchify (the conditional branch's only), unpatchify */
        { KERN_OP_TIMESTEP_EMBED, 0, 1, 1 },     { KERN_OP_SILU, 0, 2, 2 },          { KERN_OP_PATCHIFY, 0, 1, 1 },
        { KERN_OP_UNPATCHIFY, 0, 1, 0 },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const size_t expect = 2 * ((size_t)layers * want[i].per_block + want[i].head) - want[i].shared;
        ck_assert_msg(nodes_of(g2, want[i].op) == expect && nodes_of(g8, want[i].op) == expect,
                      "%s: %zu nodes at B=2, %zu at B=8, want %zu at both", kern_op_name(want[i].op),
                      nodes_of(g2, want[i].op), nodes_of(g8, want[i].op), expect);
    }
    /* the step's end: one CFG combine and one update for the batch */
    ck_assert_int_eq(nodes_of(g2, KERN_OP_CFG_COMBINE), 1);
    ck_assert_int_eq(nodes_of(g8, KERN_OP_CFG_COMBINE), 1);
    ck_assert_int_eq(nodes_of(g2, KERN_OP_EULER), 1);
    ck_assert_int_eq(nodes_of(g8, KERN_OP_EULER), 1);
    /* and the whole graph: the same at B = 2 and 8 where every GEMM merged
     * (the probe's verdict on this machine), else only the GEMMs grow */
    const size_t n2 = kern_graph_nodes(g2), n8 = kern_graph_nodes(g8);
    const size_t gm2 = nodes_of(g2, KERN_OP_GEMM) + nodes_of(g2, KERN_OP_GEMM_GELU);
    const size_t gm8 = nodes_of(g8, KERN_OP_GEMM) + nodes_of(g8, KERN_OP_GEMM_GELU);
    ck_assert_msg(n8 - gm8 == n2 - gm2, "B=8: %zu nodes (%zu GEMMs), B=2: %zu (%zu GEMMs)", n8, gm8, n2, gm2);
    kern_graph_destroy(&g2);
    kern_graph_destroy(&g8);
    tdit_ws_destroy(&w2);
    tdit_ws_destroy(&w8);
    tdit_model_destroy(&m);
    ck_assert_int_eq(ts_rmtree(dir), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("row_groups");
    TCase *tc = tcase_create("cpu");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_layernorm_modulate_by_row_groups_is_bitwise_each_group_alone);
    tcase_add_test(tc, test_residual_layernorm_modulate_by_row_groups_is_bitwise_each_group_alone);
    tcase_add_test(tc, test_residual_layernorm_with_a_gate_per_group_is_bitwise_each_group_alone);
    tcase_add_test(tc, test_gated_residual_with_a_gate_per_group_is_bitwise_each_group_alone);
    tcase_add_test(tc, test_add_repeat_is_bitwise_add_over_each_repeat);
    tcase_add_test(tc, test_rmsnorm_rope3d_over_b_samples_is_bitwise_each_sample_alone);
    tcase_add_test(tc, test_attention_batch_is_bitwise_each_sample_alone_on_every_cpu_way);
    tcase_add_test(tc, test_attention_batch_with_shared_keys_is_bitwise_each_sample_alone);
    tcase_add_test(tc, test_timestep_embed_by_sigma_rows_is_bitwise_each_row_alone);
    tcase_add_test(tc, test_cfg_combine_with_a_guidance_per_sample_is_bitwise_each_sample_alone);
    tcase_add_test(tc, test_euler_with_sigmas_per_sample_is_bitwise_each_sample_alone);
    tcase_add_test(tc, test_patchify_and_unpatchify_of_a_batch_are_each_samples_exact_copies);
    tcase_add_test(tc, test_malformed_row_groups_are_refused_with_a_message_and_nothing_written);
    tcase_add_test(tc, test_a_mixed_steps_block_ops_are_one_node_each_whatever_the_batch);
    suite_add_tcase(s, tc);
    return ts_run(s);
}
