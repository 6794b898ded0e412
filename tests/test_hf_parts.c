/* test_hf_parts.c -- a text encoder and a VAE as diffusers' Wan pipeline
 * publishes them (model/hf_parts.h): transformers' UMT5 names and
 * convert_vae's names map to Wan's, one by one as the published tables
 * say; a renamed file holds the same bytes; a sharded text_encoder/ is
 * read through its index, and each fault of an index is named. (The
 * models computing the same bits from either layout: cli_prompt.) */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "model/hf_parts.h"
#include "model/release.h"
#include "model/safetensors.h"
#include "tests/support.h"

static char dir[128];

static void setup(void) { ts_mkdtemp(dir, sizeof dir, "hfparts"); }
static void teardown(void) { ts_rmtree(dir); }

/* Pairs from the published renames (the table the tests below share):
 * transformers' UMT5EncoderModel state dict against wan/modules/t5.py's
 * T5Encoder, and convert_vae's tables (diffusers'
 * scripts/convert_wan_to_diffusers.py) read backwards. */
static const struct { hf_part_t k; const char *hf, *wan; } map[] = {
    { HF_PART_T5, "shared.weight", "token_embedding.weight" },
    { HF_PART_T5, "encoder.embed_tokens.weight", "token_embedding.weight" },
    { HF_PART_T5, "encoder.final_layer_norm.weight", "norm.weight" },
    { HF_PART_T5, "encoder.block.0.layer.0.SelfAttention.q.weight", "blocks.0.attn.q.weight" },
    { HF_PART_T5, "encoder.block.23.layer.0.SelfAttention.o.weight", "blocks.23.attn.o.weight" },
    { HF_PART_T5, "encoder.block.7.layer.0.SelfAttention.relative_attention_bias.weight",
      "blocks.7.pos_embedding.embedding.weight" },
    { HF_PART_T5, "encoder.block.1.layer.0.layer_norm.weight", "blocks.1.norm1.weight" },
    { HF_PART_T5, "encoder.block.1.layer.1.DenseReluDense.wi_0.weight", "blocks.1.ffn.gate.0.weight" },
    { HF_PART_T5, "encoder.block.1.layer.1.DenseReluDense.wi_1.weight", "blocks.1.ffn.fc1.weight" },
    { HF_PART_T5, "encoder.block.1.layer.1.DenseReluDense.wo.weight", "blocks.1.ffn.fc2.weight" },
    { HF_PART_T5, "encoder.block.10.layer.1.layer_norm.weight", "blocks.10.norm2.weight" },
    { HF_PART_VAE, "post_quant_conv.weight", "conv2.weight" },
    { HF_PART_VAE, "quant_conv.bias", "conv1.bias" },
    { HF_PART_VAE, "decoder.conv_in.weight", "decoder.conv1.weight" },
    { HF_PART_VAE, "decoder.norm_out.gamma", "decoder.head.0.gamma" },
    { HF_PART_VAE, "decoder.conv_out.bias", "decoder.head.2.bias" },
    { HF_PART_VAE, "decoder.mid_block.resnets.0.norm1.gamma", "decoder.middle.0.residual.0.gamma" },
    { HF_PART_VAE, "decoder.mid_block.resnets.1.conv2.weight", "decoder.middle.2.residual.6.weight" },
    { HF_PART_VAE, "decoder.mid_block.attentions.0.to_qkv.bias", "decoder.middle.1.to_qkv.bias" },
    { HF_PART_VAE, "decoder.up_blocks.0.resnets.2.norm2.gamma", "decoder.upsamples.2.residual.3.gamma" },
    { HF_PART_VAE, "decoder.up_blocks.1.resnets.0.conv_shortcut.weight", "decoder.upsamples.4.shortcut.weight" },
    { HF_PART_VAE, "decoder.up_blocks.2.resnets.1.conv1.bias", "decoder.upsamples.9.residual.2.bias" },
    { HF_PART_VAE, "decoder.up_blocks.3.resnets.2.conv2.bias", "decoder.upsamples.14.residual.6.bias" },
    { HF_PART_VAE, "decoder.up_blocks.0.upsamplers.0.time_conv.weight", "decoder.upsamples.3.time_conv.weight" },
    { HF_PART_VAE, "decoder.up_blocks.2.upsamplers.0.resample.1.bias", "decoder.upsamples.11.resample.1.bias" },
    { HF_PART_VAE, "encoder.conv_in.bias", "encoder.conv1.bias" },
    { HF_PART_VAE, "encoder.down_blocks.3.norm1.gamma", "encoder.downsamples.3.residual.0.gamma" },
    { HF_PART_VAE, "encoder.down_blocks.2.resample.1.weight", "encoder.downsamples.2.resample.1.weight" },
};

/* Pairs from the published renames: transformers' UMT5EncoderModel state
 * dict against wan/modules/t5.py's T5Encoder, and convert_vae's tables
 * (diffusers' scripts/convert_wan_to_diffusers.py) read backwards. */
START_TEST(test_published_names_map_to_wans_and_others_stay) {
    char out[256];
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        ck_assert_msg(hf_part_wan_name(map[i].k, map[i].hf, out, sizeof out) == 1, "%s not renamed", map[i].hf);
        ck_assert_str_eq(out, map[i].wan);
    }
    /* Wan's own names, and names no table gives, stay as they are */
    static const struct { hf_part_t k; const char *name; } keep[] = {
        { HF_PART_T5, "blocks.0.attn.q.weight" },
        { HF_PART_T5, "encoder.block.01.layer.0.SelfAttention.q.weight" }, /* not a plain index */
        { HF_PART_T5, "encoder.block.-1.layer.0.SelfAttention.q.weight" },
        { HF_PART_T5, "encoder.block.0.layer.2.DenseReluDense.wo.weight" },
        { HF_PART_T5, "decoder.block.0.layer.0.SelfAttention.q.weight" }, /* a decoder's: the model names it */
        { HF_PART_VAE, "decoder.conv1.weight" },
        { HF_PART_VAE, "decoder.up_blocks.4.resnets.0.conv1.weight" },
        { HF_PART_VAE, "decoder.up_blocks.0.resnets.3.conv1.weight" },
        { HF_PART_VAE, "decoder.up_blocks.3.upsamplers.0.resample.1.weight" }, /* the last stage has none */
        { HF_PART_VAE, "decoder.mid_block.resnets.2.norm1.gamma" },
        { HF_PART_VAE, "decoder.up_blocks.0.resnets.0.norm3.gamma" },
    };
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        ck_assert_msg(hf_part_wan_name(keep[i].k, keep[i].name, out, sizeof out) == 0, "%s renamed to %s",
                      keep[i].name, out);
        ck_assert_str_eq(out, keep[i].name);
    }
}
END_TEST

/* Writes tensors names[0..n) (F32, 3 x 4, values from seed + i, or BF16
 * when bf16) to path. */
static void write_file(const char *path, const char *const *names, size_t n, uint64_t seed, bool bf16) {
    st_writer_t *w = st_writer_new();
    float v[12];
    uint16_t h[12];
    for (size_t i = 0; i < n; i++) {
        ts_fill_uniform(v, 12, seed + i, -1, 1);
        for (int j = 0; j < 12; j++) h[j] = kern_f32_to_bf16(v[j]);
        TS_OK(st_writer_add(w, names[i], bf16 ? KERN_BF16 : KERN_F32, 2, (int64_t[]){ 3, 4 }, bf16 ? (void *)h : (void *)v));
    }
    TS_OK(st_writer_save(w, path));
    st_writer_destroy(&w);
}

/* The bytes of tensor `name` in f equal those of `src_name` in src. */
static void same_bytes(const st_file_t *f, const char *name, const st_file_t *src, const char *src_name) {
    const st_tensor_t *a = st_find(f, name), *b = st_find(src, src_name);
    ck_assert_msg(a && b, "%s / %s missing", name, src_name);
    ck_assert_int_eq(a->dtype, b->dtype);
    ck_assert_uint_eq(a->nbytes, b->nbytes);
    ck_assert_msg(!memcmp(a->data, b->data, a->nbytes), "%s: other bytes than %s", name, src_name);
}

START_TEST(test_a_renamed_file_holds_the_same_bytes_under_wans_names) {
    static const char *const hf[] = { "shared.weight", "encoder.embed_tokens.weight",
                                      "encoder.block.0.layer.1.DenseReluDense.wi_0.weight",
                                      "encoder.final_layer_norm.weight" };
    const char *p = ts_join(dir, "t5.safetensors");
    write_file(p, hf, 4, 10, true);
    st_file_t *src, *f;
    TS_NEW(src = st_open(p));
    TS_NEW(f = hf_part_open(p, HF_PART_T5));
    ck_assert_uint_eq(st_count(f), 3); /* the tied embed_tokens dropped beside shared */
    same_bytes(f, "token_embedding.weight", src, "shared.weight");
    same_bytes(f, "blocks.0.ffn.gate.0.weight", src, "encoder.block.0.layer.1.DenseReluDense.wi_0.weight");
    same_bytes(f, "norm.weight", src, "encoder.final_layer_norm.weight");
    st_close(&f);
    st_close(&src);
    /* embed_tokens alone is the embedding */
    p = ts_join(dir, "t5b.safetensors");
    write_file(p, hf + 1, 3, 20, false);
    TS_NEW(src = st_open(p));
    TS_NEW(f = hf_part_open(p, HF_PART_T5));
    same_bytes(f, "token_embedding.weight", src, "encoder.embed_tokens.weight");
    st_close(&f);
    st_close(&src);
    /* a file already in Wan's names opens as it is */
    static const char *const wan[] = { "token_embedding.weight", "norm.weight" };
    p = ts_join(dir, "wan.safetensors");
    write_file(p, wan, 2, 30, false);
    TS_NEW(src = st_open(p));
    TS_NEW(f = hf_part_open(p, HF_PART_T5));
    same_bytes(f, "norm.weight", src, "norm.weight");
    st_close(&f);
    st_close(&src);
    /* embed_tokens tied to shared but of another shape: refused */
    {
        st_writer_t *w = st_writer_new();
        float v[12] = { 0 };
        TS_OK(st_writer_add_f32(w, "shared.weight", 2, (int64_t[]){ 3, 4 }, v));
        TS_OK(st_writer_add_f32(w, "encoder.embed_tokens.weight", 2, (int64_t[]){ 4, 3 }, v));
        TS_OK(st_writer_save(w, ts_join(dir, "tie.safetensors")));
        st_writer_destroy(&w);
        ck_assert_ptr_null(hf_part_open(ts_join(dir, "tie.safetensors"), HF_PART_T5));
        ck_assert_msg(strstr(reel_err_text(), "tied to shared.weight but of another shape"), "%s", reel_err_text());
    }
    /* two names for one of Wan's (not a tie: the VAE has none) are refused */
    static const char *const two[] = { "decoder.conv_in.weight", "decoder.conv1.weight" };
    p = ts_join(dir, "two.safetensors");
    write_file(p, two, 2, 40, false);
    ck_assert_ptr_null(hf_part_open(p, HF_PART_VAE));
    ck_assert_msg(strstr(reel_err_text(), "both stand for decoder.conv1.weight"), "%s", reel_err_text());
}
END_TEST

/* An index and its shards in folder d (made): shard 1 holds names a, shard
 * 2 names b; the index text idx (NULL: the weight_map both files say). */
static const char *sharded(const char *name, const char *const *a, size_t na, const char *const *b, size_t nb,
                           const char *idx) {
    static char d[256];
    snprintf(d, sizeof d, "%s/%s", dir, name);
    ck_assert_int_eq(mkdir(d, 0700), 0);
    write_file(ts_join(d, "model-00001-of-00002.safetensors"), a, na, 50, true);
    write_file(ts_join(d, "model-00002-of-00002.safetensors"), b, nb, 60, false);
    char text[2048];
    if (!idx) {
        size_t n = (size_t)snprintf(text, sizeof text, "{\"metadata\": {}, \"weight_map\": {");
        for (size_t i = 0; i < na + nb; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                                  i ? ", " : "", i < na ? a[i] : b[i - na], i < na ? 1 : 2);
        snprintf(text + n, sizeof text - n, "}}");
        idx = text;
    }
    ts_write_file(ts_join(d, "model.safetensors.index.json"), idx, strlen(idx));
    return d;
}

static void refused(const char *path, const char *needle) {
    st_file_t *f = hf_part_open(path, HF_PART_T5);
    ck_assert_msg(f == NULL, "%s: opened", path);
    ck_assert_msg(strstr(reel_err_text(), needle), "%s: '%s' does not say '%s'", path, reel_err_text(), needle);
}

START_TEST(test_a_sharded_text_encoder_is_read_through_its_index_and_each_fault_named) {
    static const char *const a[] = { "shared.weight", "encoder.block.0.layer.0.SelfAttention.q.weight" };
    static const char *const b[] = { "encoder.block.0.layer.0.SelfAttention.k.weight", "encoder.final_layer_norm.weight" };
    const char *d = sharded("ok", a, 2, b, 2, NULL);
    st_file_t *f, *s1, *s2;
    TS_NEW(s1 = st_open(ts_join(d, "model-00001-of-00002.safetensors")));
    TS_NEW(s2 = st_open(ts_join(d, "model-00002-of-00002.safetensors")));
    for (int by_index = 0; by_index < 2; by_index++) {
        TS_NEW(f = hf_part_open(by_index ? ts_join(d, "model.safetensors.index.json") : d, HF_PART_T5));
        ck_assert_uint_eq(st_count(f), 4);
        same_bytes(f, "token_embedding.weight", s1, "shared.weight"); /* BF16, kept so */
        same_bytes(f, "blocks.0.attn.q.weight", s1, "encoder.block.0.layer.0.SelfAttention.q.weight");
        same_bytes(f, "blocks.0.attn.k.weight", s2, "encoder.block.0.layer.0.SelfAttention.k.weight");
        same_bytes(f, "norm.weight", s2, "encoder.final_layer_norm.weight");
        st_close(&f);
    }
    st_close(&s1);
    st_close(&s2);

    /* the faults of an index, each named */
    d = sharded("missing", a, 2, b, 2,
                "{\"weight_map\": {\"x.weight\": \"model-00003-of-00002.safetensors\", "
                "\"shared.weight\": \"model-00001-of-00002.safetensors\"}}");
    refused(d, "its shard model-00003-of-00002.safetensors is not a file beside it");
    d = sharded("notin", a, 2, b, 2,
                "{\"weight_map\": {\"shared.weight\": \"model-00001-of-00002.safetensors\", "
                "\"encoder.block.0.layer.0.SelfAttention.q.weight\": \"model-00001-of-00002.safetensors\", "
                "\"encoder.block.0.layer.0.SelfAttention.k.weight\": \"model-00001-of-00002.safetensors\", "
                "\"encoder.final_layer_norm.weight\": \"model-00002-of-00002.safetensors\"}}");
    refused(d, "is in model-00002-of-00002.safetensors, its weight_map says model-00001-of-00002.safetensors");
    d = sharded("gone", a, 2, b, 2,
                "{\"weight_map\": {\"shared.weight\": \"model-00001-of-00002.safetensors\", "
                "\"encoder.block.0.layer.0.SelfAttention.q.weight\": \"model-00001-of-00002.safetensors\", "
                "\"nowhere.weight\": \"model-00001-of-00002.safetensors\"}}");
    refused(d, "nowhere.weight is in no shard (its weight_map says model-00001-of-00002.safetensors)");
    static const char *const dup[] = { "shared.weight" };
    d = sharded("twice", a, 2, dup, 1, NULL); /* shared.weight in both: the map names one (its last) */
    refused(d, "shared.weight is in model-00001-of-00002.safetensors, its weight_map says "
               "model-00002-of-00002.safetensors");
    d = sharded("stray", a, 2, b, 2, "{\"weight_map\": {\"shared.weight\": \"model-00001-of-00002.safetensors\"}}");
    refused(d, "encoder.block.0.layer.0.SelfAttention.q.weight is in model-00001-of-00002.safetensors, and its "
               "weight_map does not name it");
    d = sharded("slash", a, 2, b, 2, "{\"weight_map\": {\"shared.weight\": \"../model-00001-of-00002.safetensors\"}}");
    refused(d, "is not a file name beside the index");
    d = sharded("nomap", a, 2, b, 2, "{\"weight_map\": []}");
    refused(d, "no \"weight_map\" object");
    d = sharded("notjson", a, 2, b, 2, "{\"weight_map\": ");
    refused(d, "not valid JSON");
    char empty[256];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    ck_assert_int_eq(mkdir(empty, 0700), 0);
    refused(empty, "a folder without model.safetensors");
    refused(ts_join(dir, "none"), "cannot open");
}
END_TEST

/* A loader's message about a renamed file names the file's own tensor
 * too: one the file holds (by the name it was renamed from) and one it
 * lacks (by the name it would have there); a message about a file that
 * was not renamed, or that names no tensor, is left as it is. */
START_TEST(test_a_message_about_a_renamed_file_names_its_own_tensors) {
    static const char *const hf[] = { "decoder.conv_in.weight", "decoder.norm_out.gamma" };
    const char *p = ts_join(dir, "vae.safetensors");
    write_file(p, hf, 2, 70, false);
    st_file_t *f;
    TS_NEW(f = hf_part_open(p, HF_PART_VAE));
    reel_fail(REEL_E_INVALID, "x: decoder.conv1.weight: shape [3,4], expected [8,4,3,3,3]");
    hf_part_explain(f);
    ck_assert_str_eq(reel_err_text(), "x: decoder.conv1.weight: shape [3,4], expected [8,4,3,3,3] (in the file: "
                                      "decoder.conv1.weight is decoder.conv_in.weight)");
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    reel_fail(REEL_E_NOT_FOUND, "x: decoder.upsamples.4.residual.2.weight: no such tensor");
    hf_part_explain(f);
    ck_assert_str_eq(reel_err_text(), "x: decoder.upsamples.4.residual.2.weight: no such tensor (in the file: "
                                      "decoder.upsamples.4.residual.2.weight is decoder.up_blocks.1.resnets.0.conv1.weight)");
    ck_assert_int_eq(reel_err_code(), REEL_E_NOT_FOUND);
    /* every published pair, back from Wan's name to the file's */
    st_file_t *t5f;
    static const char *const one[] = { "shared.weight" };
    write_file(ts_join(dir, "t5one.safetensors"), one, 1, 73, false);
    TS_NEW(t5f = hf_part_open(ts_join(dir, "t5one.safetensors"), HF_PART_T5));
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (!strcmp(map[i].hf, "encoder.embed_tokens.weight")) continue; /* the tie: back to shared.weight */
        char want[400];
        snprintf(want, sizeof want, "(in the file: %s is %s)", map[i].wan, map[i].hf);
        reel_fail(REEL_E_NOT_FOUND, "x: %s: no such tensor", map[i].wan);
        hf_part_explain(map[i].k == HF_PART_T5 ? t5f : f);
        ck_assert_msg(strstr(reel_err_text(), want), "'%s' lacks '%s'", reel_err_text(), want);
    }
    st_close(&t5f);
    reel_fail(REEL_E_INVALID, "x: not a VAE at all");
    hf_part_explain(f);
    ck_assert_str_eq(reel_err_text(), "x: not a VAE at all");
    st_close(&f);
    /* a T5 file's: blocks.N.ffn.gate.0.weight is UMT5's wi_0 */
    static const char *const t5[] = { "shared.weight" };
    p = ts_join(dir, "t5.safetensors");
    write_file(p, t5, 1, 71, false);
    TS_NEW(f = hf_part_open(p, HF_PART_T5));
    reel_fail(REEL_E_INVALID, "x: blocks.1.ffn.gate.0.weight: no such tensor");
    hf_part_explain(f);
    ck_assert_msg(strstr(reel_err_text(), "blocks.1.ffn.gate.0.weight is encoder.block.1.layer.1.DenseReluDense.wi_0.weight"),
                  "%s", reel_err_text());
    st_close(&f);
    /* a file in Wan's names gets no note */
    static const char *const wan[] = { "decoder.conv1.weight" };
    p = ts_join(dir, "wanvae.safetensors");
    write_file(p, wan, 1, 72, false);
    TS_NEW(f = hf_part_open(p, HF_PART_VAE));
    reel_fail(REEL_E_INVALID, "x: decoder.conv1.weight: shape [3,4]");
    hf_part_explain(f);
    ck_assert_str_eq(reel_err_text(), "x: decoder.conv1.weight: shape [3,4]");
    st_close(&f);
}
END_TEST

/* A pipeline root is found as model/wan_ckpt.c finds one: model_index.json,
 * or transformer/ with no weights beside it; its text_encoder/, tokenizer/
 * and vae/ are its parts. A release folder (weights of its own) is not. */
START_TEST(test_a_pipeline_root_without_model_index_json_still_gives_its_parts) {
    char root[256];
    snprintf(root, sizeof root, "%s/pipe", dir);
    ck_assert_int_eq(mkdir(root, 0700), 0);
    static const char *const sub[] = { "transformer", "text_encoder", "vae", "tokenizer" };
    for (size_t i = 0; i < 4; i++) ck_assert_int_eq(mkdir(ts_join(root, sub[i]), 0700), 0);
    char tok[300];
    snprintf(tok, sizeof tok, "%s/tokenizer", root);
    ts_write_file(ts_join(tok, "spiece.model"), "x", 1);
    release_parts_t rel;
    TS_OK(release_find(root, &rel));
    ck_assert_msg(strstr(rel.t5, "/pipe/text_encoder") && strstr(rel.vae, "/pipe/vae") &&
                      strstr(rel.tokenizer, "/pipe/tokenizer"), "t5 '%s' vae '%s' tokenizer '%s'", rel.t5, rel.vae,
                  rel.tokenizer);
    /* weights of its own beside transformer/: a release folder, not a root */
    ts_write_file(ts_join(root, "diffusion_pytorch_model.safetensors"), "x", 1);
    TS_OK(release_find(root, &rel));
    ck_assert_msg(!rel.t5[0] && !rel.vae[0] && !rel.tokenizer[0], "t5 '%s' vae '%s'", rel.t5, rel.vae);
}
END_TEST

/* A part folder's config.json is judged against what Reel runs: a
 * residual (Wan2.2) VAE and a UMT5 of another feed-forward, distance or
 * eps are refused naming the field; a VAE's latents_mean and latents_std
 * become the metadata its loader scales by. */
START_TEST(test_a_part_folders_config_json_is_judged_and_its_latents_taken) {
    char vd[256], td[256];
    snprintf(vd, sizeof vd, "%s/vae", dir);
    snprintf(td, sizeof td, "%s/text_encoder", dir);
    ck_assert_int_eq(mkdir(vd, 0700), 0);
    ck_assert_int_eq(mkdir(td, 0700), 0);
    static const char *const vn[] = { "decoder.conv_in.weight" };
    static const char *const tn[] = { "shared.weight" };
    write_file(ts_join(vd, "diffusion_pytorch_model.safetensors"), vn, 1, 80, false);
    write_file(ts_join(td, "model.safetensors"), tn, 1, 81, false);
    const char *c = "{\"_class_name\": \"AutoencoderKLWan\", \"is_residual\": true}";
    ts_write_file(ts_join(vd, "config.json"), c, strlen(c));
    ck_assert_ptr_null(hf_part_open(vd, HF_PART_VAE));
    ck_assert_msg(strstr(reel_err_text(), "a residual VAE (is_residual: Wan2.2's)"), "%s", reel_err_text());
    c = "{\"_class_name\": \"AutoencoderKLWan\", \"latents_mean\": [0.5, -1], \"latents_std\": [2, 3]}";
    ts_write_file(ts_join(vd, "config.json"), c, strlen(c));
    st_file_t *f;
    TS_NEW(f = hf_part_open(vd, HF_PART_VAE));
    ck_assert_str_eq(st_meta(f, "latents_mean"), "[0.5,-1]");
    ck_assert_str_eq(st_meta(f, "latents_std"), "[2,3]");
    st_close(&f);
    /* the same beside a file already in Wan's names (nothing to rename) */
    static const char *const wn[] = { "decoder.conv1.weight" };
    write_file(ts_join(vd, "diffusion_pytorch_model.safetensors"), wn, 1, 82, false);
    TS_NEW(f = hf_part_open(vd, HF_PART_VAE));
    ck_assert_ptr_nonnull(st_find(f, "decoder.conv1.weight"));
    ck_assert_str_eq(st_meta(f, "latents_std"), "[2,3]");
    st_close(&f);
    static const struct { const char *cfg, *needle; } bad[] = {
        { "{\"model_type\": \"umt5\", \"feed_forward_proj\": \"relu\"}", "feed_forward_proj 'relu'" },
        { "{\"model_type\": \"umt5\", \"relative_attention_max_distance\": 64}", "relative_attention_max_distance 64" },
        { "{\"model_type\": \"umt5\", \"layer_norm_epsilon\": 1e-5}", "layer_norm_epsilon 1e-05" },
        { "{\"model_type\": \"bert\"}", "model_type 'bert'" },
        { "[1, 2]", "not a JSON object" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_write_file(ts_join(td, "config.json"), bad[i].cfg, strlen(bad[i].cfg));
        ck_assert_ptr_null(hf_part_open(td, HF_PART_T5));
        ck_assert_msg(strstr(reel_err_text(), bad[i].needle), "'%s' lacks '%s'", reel_err_text(), bad[i].needle);
    }
    c = "{\"model_type\": \"umt5\", \"feed_forward_proj\": \"gated-gelu\", \"relative_attention_max_distance\": 128, "
        "\"layer_norm_epsilon\": 1e-06}";
    ts_write_file(ts_join(td, "config.json"), c, strlen(c));
    TS_NEW(f = hf_part_open(td, HF_PART_T5));
    st_close(&f);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("hf_parts");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_published_names_map_to_wans_and_others_stay);
    tcase_add_test(tc, test_a_renamed_file_holds_the_same_bytes_under_wans_names);
    tcase_add_test(tc, test_a_sharded_text_encoder_is_read_through_its_index_and_each_fault_named);
    tcase_add_test(tc, test_a_message_about_a_renamed_file_names_its_own_tensors);
    tcase_add_test(tc, test_a_pipeline_root_without_model_index_json_still_gives_its_parts);
    tcase_add_test(tc, test_a_part_folders_config_json_is_judged_and_its_latents_taken);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(suite()); }
