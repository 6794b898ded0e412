/* hf_parts.c -- a text encoder's or a VAE's weights under Wan's names,
 * from either release's files (see hf_parts.h).
 *
 * The renames are the published ones, read backwards:
 *  - the text encoder: transformers' UMT5EncoderModel against Wan's
 *    T5Encoder (wan/modules/t5.py). UMT5's gated GELU is
 *    wo(gelu(wi_0(x)) · wi_1(x)), Wan's fc2(fc1(x) · gate(x)): wi_0 is
 *    gate.0, wi_1 fc1, wo fc2; every UMT5 layer has its own
 *    relative_attention_bias, Wan's pos_embedding.embedding.
 *  - the VAE: convert_vae of diffusers' convert_wan_to_diffusers.py:
 *    conv1/conv2 -> quant_conv/post_quant_conv; decoder.conv1 -> conv_in;
 *    middle.0/1/2 -> mid_block.resnets.0, attentions.0, resnets.1;
 *    upsamples.{0,1,2}, {4,5,6}, {8,9,10}, {12,13,14} -> up_blocks.B.
 *    resnets.R; upsamples.{3,7,11} -> up_blocks.{0,1,2}.upsamplers.0;
 *    a residual's 0/2/3/6 -> norm1/conv1/norm2/conv2, shortcut ->
 *    conv_shortcut; head.0/2 -> norm_out/conv_out (the encoder's alike;
 *    Reel reads the decoder only). */
#include "model/hf_parts.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "model/pth.h"

#define HF_MAX_INDEX ((size_t)64 << 20) /* an index.json's bytes */
#define HF_MAX_SHARDS 4096
#define HF_FROM "reel.file_name:" /* metadata: Wan's name -> the file's */
#define HF_LAYOUT "reel.file_names"   /* metadata: "t5" or "vae", the names the file was renamed from */

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* A plain decimal index at *s ("0" or digits without a leading 0, at most
 * 6) followed by '.', read into *v and *s moved past the '.'. */
static bool take_index(const char **s, int *v) {
    const char *p = *s;
    int n = 0, d = 0;
    while (p[d] >= '0' && p[d] <= '9') n = n * 10 + (p[d] - '0'), d++;
    if (d == 0 || d > 6 || (d > 1 && p[0] == '0') || p[d] != '.') return false;
    *v = n;
    *s = p + d + 1;
    return true;
}

/* s starts with prefix: the rest, else NULL. */
static const char *after(const char *s, const char *prefix) {
    size_t k = strlen(prefix);
    return strncmp(s, prefix, k) ? NULL : s + k;
}

static int put(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int put(char *out, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, len, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < len ? 1 : 0;
}

/* The published renames of one kind, each pair read either way. */
typedef struct { const char *hf, *wan; } name_pair_t;

/* A UMT5 block's tensors (after encoder.block.N. / blocks.N.). */
static const name_pair_t t5_block[] = {
    { "layer.0.SelfAttention.q.weight", "attn.q.weight" },
    { "layer.0.SelfAttention.k.weight", "attn.k.weight" },
    { "layer.0.SelfAttention.v.weight", "attn.v.weight" },
    { "layer.0.SelfAttention.o.weight", "attn.o.weight" },
    { "layer.0.SelfAttention.relative_attention_bias.weight", "pos_embedding.embedding.weight" },
    { "layer.0.layer_norm.weight", "norm1.weight" },
    { "layer.1.DenseReluDense.wi_0.weight", "ffn.gate.0.weight" },
    { "layer.1.DenseReluDense.wi_1.weight", "ffn.fc1.weight" },
    { "layer.1.DenseReluDense.wo.weight", "ffn.fc2.weight" },
    { "layer.1.layer_norm.weight", "norm2.weight" },
};

/* A VAE residual block's parts (each followed by weight, bias or gamma). */
static const name_pair_t resnet[] = {
    { "norm1.", "residual.0." }, { "conv1.", "residual.2." }, { "norm2.", "residual.3." },
    { "conv2.", "residual.6." }, { "conv_shortcut.", "shortcut." },
};

/* r, starting with one of t's names (diffusers', or Wan's when back), as
 * the other into buf: the whole of r (tail false) or that prefix and the
 * rest of r, which must not be empty (tail true). NULL when none matches
 * or it does not fit. */
static const char *swap(const name_pair_t *t, size_t n, bool back, bool tail, const char *r, char *buf, size_t len) {
    for (size_t i = 0; i < n; i++) {
        const char *rest = after(r, back ? t[i].wan : t[i].hf);
        if (rest && (tail ? *rest != '\0' : *rest == '\0'))
            return snprintf(buf, len, "%s%s", back ? t[i].hf : t[i].wan, rest) < (int)len ? buf : NULL;
    }
    return NULL;
}

static const char *resnet_part(const char *r, char *buf, size_t len, bool back) {
    return swap(resnet, sizeof resnet / sizeof resnet[0], back, true, r, buf, len);
}

static int t5_name(const char *n, char *out, size_t len) {
    const char *r, *w;
    char part[128];
    int b;
    if (!strcmp(n, "shared.weight") || !strcmp(n, "encoder.embed_tokens.weight"))
        return put(out, len, "token_embedding.weight");
    if (!strcmp(n, "encoder.final_layer_norm.weight")) return put(out, len, "norm.weight");
    if (!(r = after(n, "encoder.block.")) || !take_index(&r, &b)) return 0;
    w = swap(t5_block, sizeof t5_block / sizeof t5_block[0], false, false, r, part, sizeof part);
    return w ? put(out, len, "blocks.%d.%s", b, w) : 0;
}

static int vae_name(const char *n, char *out, size_t len) {
    const char *r, *side;
    char part[256];
    int b, k;
    if ((r = after(n, "post_quant_conv."))) return put(out, len, "conv2.%s", r);
    if ((r = after(n, "quant_conv."))) return put(out, len, "conv1.%s", r);
    if ((r = after(n, "decoder."))) side = "decoder";
    else if ((r = after(n, "encoder."))) side = "encoder";
    else return 0;
    const char *s;
    if ((s = after(r, "conv_in."))) return put(out, len, "%s.conv1.%s", side, s);
    if ((s = after(r, "norm_out."))) return put(out, len, "%s.head.0.%s", side, s);
    if ((s = after(r, "conv_out."))) return put(out, len, "%s.head.2.%s", side, s);
    if ((s = after(r, "mid_block.attentions.0."))) return put(out, len, "%s.middle.1.%s", side, s);
    if ((s = after(r, "mid_block.resnets.")) && take_index(&s, &k) && k <= 1 && resnet_part(s, part, sizeof part, false))
        return put(out, len, "%s.middle.%d.%s", side, 2 * k, part);
    if (!strcmp(side, "decoder") && (s = after(r, "up_blocks.")) && take_index(&s, &b) && b <= 3) {
        const char *t;
        if ((t = after(s, "resnets.")) && take_index(&t, &k) && k <= 2 && resnet_part(t, part, sizeof part, false))
            return put(out, len, "decoder.upsamples.%d.%s", 4 * b + k, part);
        if (b <= 2 && (t = after(s, "upsamplers.0.")) && *t) return put(out, len, "decoder.upsamples.%d.%s", 4 * b + 3, t);
    }
    /* the encoder's down_blocks keep Wan's numbering (convert_vae renames the prefix and the parts only) */
    if (!strcmp(side, "encoder") && (s = after(r, "down_blocks.")) && take_index(&s, &b)) {
        if (resnet_part(s, part, sizeof part, false)) return put(out, len, "encoder.downsamples.%d.%s", b, part);
        return put(out, len, "encoder.downsamples.%d.%s", b, s);
    }
    return 0;
}

/* ---- back: Wan's name -> the file's (for messages) ------------------------------- */

static int t5_file_name(const char *n, char *out, size_t len) {
    const char *r, *h;
    char part[128];
    int b;
    if (!strcmp(n, "token_embedding.weight")) return put(out, len, "shared.weight");
    if (!strcmp(n, "norm.weight")) return put(out, len, "encoder.final_layer_norm.weight");
    if (!(r = after(n, "blocks.")) || !take_index(&r, &b)) return 0;
    h = swap(t5_block, sizeof t5_block / sizeof t5_block[0], true, false, r, part, sizeof part);
    return h ? put(out, len, "encoder.block.%d.%s", b, h) : 0;
}

static int vae_file_name(const char *n, char *out, size_t len) {
    const char *r, *side, *s;
    char part[256];
    int k;
    if ((r = after(n, "conv2."))) return put(out, len, "post_quant_conv.%s", r);
    if ((r = after(n, "conv1."))) return put(out, len, "quant_conv.%s", r);
    if ((r = after(n, "decoder."))) side = "decoder";
    else if ((r = after(n, "encoder."))) side = "encoder";
    else return 0;
    if ((s = after(r, "conv1."))) return put(out, len, "%s.conv_in.%s", side, s);
    if ((s = after(r, "head.0."))) return put(out, len, "%s.norm_out.%s", side, s);
    if ((s = after(r, "head.2."))) return put(out, len, "%s.conv_out.%s", side, s);
    if ((s = after(r, "middle.1."))) return put(out, len, "%s.mid_block.attentions.0.%s", side, s);
    if ((s = after(r, "middle.")) && take_index(&s, &k) && (k == 0 || k == 2) && resnet_part(s, part, sizeof part, true))
        return put(out, len, "%s.mid_block.resnets.%d.%s", side, k / 2, part);
    if (!strcmp(side, "decoder") && (s = after(r, "upsamples.")) && take_index(&s, &k) && k < 16) {
        if (k % 4 == 3) return put(out, len, "decoder.up_blocks.%d.upsamplers.0.%s", k / 4, s);
        if (resnet_part(s, part, sizeof part, true))
            return put(out, len, "decoder.up_blocks.%d.resnets.%d.%s", k / 4, k % 4, part);
    }
    if (!strcmp(side, "encoder") && (s = after(r, "downsamples.")) && take_index(&s, &k))
        return resnet_part(s, part, sizeof part, true) ? put(out, len, "encoder.down_blocks.%d.%s", k, part)
                                                      : put(out, len, "encoder.down_blocks.%d.%s", k, s);
    return 0;
}

int hf_part_wan_name(hf_part_t kind, const char *name, char *out, size_t len) {
    int rc = kind == HF_PART_T5 ? t5_name(name, out, len) : vae_name(name, out, len);
    if (rc != 1) snprintf(out, len, "%s", name);
    return rc;
}

/* ---- one file under Wan's names ------------------------------------------------- */

/* f (taken: closed, or become the result) with its tensors under Wan's
 * names, over the same data buffer; f itself when none is renamed. */
static st_file_t *renamed(st_file_t *f, hf_part_t kind, const char *origin, const json_t *extra) {
    size_t n = st_count(f);
    bool any = false, shared = st_find(f, "shared.weight") != NULL;
    char nm[512];
    for (size_t i = 0; i < n && !any; i++) any = hf_part_wan_name(kind, st_at(f, i)->name, nm, sizeof nm) == 1;
    if (!any && !extra) return f; /* (a config's latents still go into the metadata) */
    json_t *hdr = json_object(), *meta = json_object();
    st_file_t *out = NULL;
    if (!hdr || !meta || json_object_set(hdr, "__metadata__", meta) ||
        json_object_set_new(meta, HF_LAYOUT, json_string(kind == HF_PART_T5 ? "t5" : "vae")) ||
        (extra && json_object_update(meta, (json_t *)extra))) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const st_tensor_t *t = st_at(f, i);
        /* UMT5's embed_tokens is tied to shared: one of them is the
         * embedding, so the same shape (transformers refuses another) */
        if (kind == HF_PART_T5 && shared && !strcmp(t->name, "encoder.embed_tokens.weight")) {
            const st_tensor_t *sh = st_find(f, "shared.weight");
            if (t->ndim != sh->ndim || memcmp(t->shape, sh->shape, (size_t)t->ndim * sizeof *t->shape)) {
                reel_fail(REEL_E_INVALID, "%s: encoder.embed_tokens.weight is tied to shared.weight but of another "
                          "shape", origin);
                goto done;
            }
            continue;
        }
        const bool ren = hf_part_wan_name(kind, t->name, nm, sizeof nm) == 1;
        const char *name = ren ? nm : t->name;
        if (json_object_get(hdr, name) || !strcmp(name, "__metadata__")) {
            reel_fail(REEL_E_INVALID, "%s: %s and another tensor both stand for %s", origin, t->name, name);
            goto done;
        }
        /* the file's own name, for messages about it (hf_part_explain) */
        char mk[600];
        if (ren && snprintf(mk, sizeof mk, "%s%s", HF_FROM, name) < (int)sizeof mk &&
            json_object_set_new(meta, mk, json_string(t->name))) {
            reel_fail(REEL_E_NOMEM, "out of memory");
            goto done;
        }
        json_t *shape = json_array();
        for (int d = 0; shape && d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t off = st_offset(f, t);
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", kern_dtype_name(t->dtype), "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + t->nbytes));
        if (!e || json_object_set_new(hdr, name, e)) {
            reel_fail(REEL_E_NOMEM, "out of memory");
            goto done;
        }
    }
    char *text = json_dumps(hdr, JSON_COMPACT);
    if (!text) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto done;
    }
    size_t dlen = st_data_len(f);
    unsigned char *data = st_take_data(f);
    out = st_adopt(origin, text, strlen(text), data, dlen);
    free(text);
done:
    json_decref(hdr);
    json_decref(meta);
    st_close(&f);
    return out;
}

void hf_part_explain(const st_file_t *f) {
    if (!f || reel_err_code() == REEL_OK) return;
    const reel_err_t e = *reel_err();
    char notes[REEL_ERR_MSG] = "";
    size_t nn = 0;
    int found = 0;
    for (const char *p = e.msg; *p && found < 3;) { /* each token of name characters */
        size_t k = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.");
        if (k == 0) {
            p++;
            continue;
        }
        char key[600], fn[512], tok[256];
        if (k < sizeof tok && snprintf(key, sizeof key, "%s%.*s", HF_FROM, (int)k, p) < (int)sizeof key) {
            snprintf(tok, sizeof tok, "%.*s", (int)k, p);
            const char *orig = st_meta(f, key), *layout = st_meta(f, HF_LAYOUT);
            /* a tensor the file lacks: the name it would have there */
            if (!orig && layout &&
                (!strcmp(layout, "t5") ? t5_file_name(tok, fn, sizeof fn) : vae_file_name(tok, fn, sizeof fn)) == 1)
                orig = fn;
            if (orig && nn < sizeof notes) {
                nn += (size_t)snprintf(notes + nn, sizeof notes - nn, "%s%s is %s", found ? "; " : "", tok, orig);
                found++;
            }
        }
        p += k;
    }
    if (found) reel_fail_detail(e.code, e.detail[0] ? e.detail : NULL, "%s (in the file: %s)", e.msg, notes);
}

/* ---- shards ------------------------------------------------------------------- */

/* The shards an index names, laid back to back in one buffer under one
 * header: each shard's header read first (judged as st_open judges it),
 * then its data read straight into its place, so the whole is held once.
 * Each tensor its weight_map names must be in the shard it names; a
 * tensor in two shards, or in a shard its weight_map does not name it in,
 * is refused. */
static st_file_t *open_sharded(const char *index) {
    json_error_t je;
    struct stat st;
    int fd = open(index, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        reel_fail_errno(errno == ENOENT ? REEL_E_NOT_FOUND : REEL_E_IO, errno, "%s: cannot open", index);
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > HF_MAX_INDEX) {
        close(fd);
        reel_fail(REEL_E_INVALID, "%s: not a regular file of at most %zu bytes", index, HF_MAX_INDEX);
        return NULL;
    }
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        reel_fail(REEL_E_NOMEM, "%s: out of memory opening it", index);
        return NULL;
    }
    json_t *root = json_loadf(fp, 0, &je);
    fclose(fp);
    if (!root) {
        reel_fail(REEL_E_INVALID, "%s: not valid JSON: %s (line %d)", index, je.text, je.line);
        return NULL;
    }
    const json_t *map = json_object_get(root, "weight_map");
    st_file_t *out = NULL;
    json_t *hdr = json_object(), *seen = json_object();
    const char **shards = calloc(HF_MAX_SHARDS, sizeof *shards);
    st_header_t **heads = calloc(HF_MAX_SHARDS, sizeof *heads);
    uint64_t *base = calloc(HF_MAX_SHARDS, sizeof *base);
    unsigned char *data = NULL;
    size_t ns = 0, total = 0;
    char dir[PATH_MAX], p[PATH_MAX];
    const char *slash = strrchr(index, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - index) : 1, slash ? index : ".");
    if (!hdr || !seen || !shards || !heads || !base) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto done;
    }
    if (!json_is_object(map) || json_object_size(map) == 0) {
        reel_fail(REEL_E_INVALID, "%s: no \"weight_map\" object naming the shards", index);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)map, key, v) { /* the shards, each once */
        const char *s = json_string_value(v);
        if (!s || !*s || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, "..")) {
            reel_fail(REEL_E_INVALID, "%s: weight_map[\"%.64s\"] is not a file name beside the index", index, key);
            goto done;
        }
        if (json_object_get(seen, s)) continue; /* (a set: an index may name a shard a million times) */
        if (ns == HF_MAX_SHARDS) {
            reel_fail(REEL_E_LIMIT, "%s: more than %d shards", index, HF_MAX_SHARDS);
            goto done;
        }
        shards[ns++] = s;
        if (json_object_set_new(seen, s, json_true())) {
            reel_fail(REEL_E_NOMEM, "out of memory");
            goto done;
        }
    }
    for (size_t i = 0; i < ns; i++) { /* each shard's header: its tensors, where they go */
        int sfd = -1;
        if (snprintf(p, sizeof p, "%s/%s", dir, shards[i]) >= (int)sizeof p ||
            (sfd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) < 0) {
            reel_fail(REEL_E_NOT_FOUND, "%s: its shard %s is not a file beside it", index, shards[i]);
            goto done;
        }
        heads[i] = st_header_read(sfd, p, NULL, NULL);
        close(sfd);
        if (!heads[i]) goto done;
        base[i] = total;
        if (__builtin_add_overflow(total, (size_t)st_header_data_len(heads[i]), &total)) {
            reel_fail(REEL_E_LIMIT, "%s: its shards hold more bytes than this machine addresses", index);
            goto done;
        }
        for (size_t t = 0; t < st_header_count(heads[i]); t++) {
            const st_entry_t *x = st_header_at(heads[i], t);
            const char *says = json_string_value(json_object_get(map, x->name));
            if (!says) {
                reel_fail(REEL_E_INVALID, "%s: %s is in %s, and its weight_map does not name it", index, x->name,
                          shards[i]);
                goto done;
            }
            if (strcmp(says, shards[i])) {
                reel_fail(REEL_E_INVALID, "%s: %s is in %s, its weight_map says %s", index, x->name, shards[i], says);
                goto done;
            }
            if (json_object_get(hdr, x->name)) {
                reel_fail(REEL_E_INVALID, "%s: %s is in two shards (%s one of them)", index, x->name, shards[i]);
                goto done;
            }
            json_t *shape = json_array();
            for (int d = 0; shape && d < x->ndim; d++) json_array_append_new(shape, json_integer(x->shape[d]));
            uint64_t off = base[i] + x->begin;
            json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", kern_dtype_name(x->dtype), "shape", shape,
                                  "data_offsets", (json_int_t)off, (json_int_t)(off + x->nbytes));
            if (!e || json_object_set_new(hdr, x->name, e)) {
                reel_fail(REEL_E_NOMEM, "out of memory");
                goto done;
            }
        }
    }
    json_object_foreach((json_t *)map, key, v)
        if (!json_object_get(hdr, key)) {
            reel_fail(REEL_E_INVALID, "%s: %s is in no shard (its weight_map says %s)", index, key, json_string_value(v));
            goto done;
        }
    if (!(data = malloc(total ? total : 1))) {
        reel_fail(REEL_E_NOMEM, "%s: out of memory for %zu bytes of shards", index, total);
        goto done;
    }
    for (size_t i = 0; i < ns; i++) { /* the data, each shard's into its place */
        int sfd = -1;
        if (snprintf(p, sizeof p, "%s/%s", dir, shards[i]) >= (int)sizeof p || /* (fitted above) */
            (sfd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) < 0) {
            reel_fail_errno(REEL_E_IO, errno, "%s: cannot open", p);
            goto done;
        }
        int rc = st_header_read_data(heads[i], sfd, p, data + base[i], NULL, NULL);
        close(sfd);
        if (rc != 0) goto done;
    }
    char *text = json_dumps(hdr, JSON_COMPACT);
    if (!text) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto done;
    }
    out = st_adopt(index, text, strlen(text), data, total);
    data = NULL; /* the result's, or freed */
    free(text);
done:
    for (size_t i = 0; heads && i < ns; i++) st_header_free(&heads[i]);
    free(heads);
    free(base);
    free(data);
    free(shards);
    json_decref(hdr);
    json_decref(seen);
    json_decref(root);
    return out;
}

/* The part's config.json in folder dir, judged against what Reel runs:
 * transformers' UMT5 (gated GELU, 128 as the relative attention's
 * distance, RMS eps 1e-6) or diffusers' AutoencoderKLWan (Wan2.1's, not
 * Wan2.2's residual one). A VAE's latents_mean and latents_std go into
 * *extra as the metadata vae.c reads (the pipeline scales by them). 0 with
 * none there; -1 naming what differs. */
static int read_part_config(const char *dir, hf_part_t kind, json_t **extra) {
    char p[PATH_MAX];
    struct stat st;
    *extra = NULL;
    if (snprintf(p, sizeof p, "%s/config.json", dir) >= (int)sizeof p || stat(p, &st) != 0) return 0;
    if (!S_ISREG(st.st_mode) || st.st_size > (1 << 20))
        return reel_fail(REEL_E_INVALID, "%s: not a regular file of at most 1 MiB", p);
    json_error_t je;
    json_t *c = json_load_file(p, 0, &je);
    if (!json_is_object(c)) {
        json_decref(c);
        return reel_fail(REEL_E_INVALID, "%s: not a JSON object (%s)", p, je.text);
    }
    int rc = 0;
    const char *s;
    const json_t *v;
    if (kind == HF_PART_T5) {
        if ((s = json_string_value(json_object_get(c, "model_type"))) && strcmp(s, "umt5") && strcmp(s, "t5"))
            rc = reel_fail(REEL_E_UNSUPPORTED, "%s: model_type '%.32s' is not a UMT5 encoder", p, s);
        else if ((s = json_string_value(json_object_get(c, "feed_forward_proj"))) && strcmp(s, "gated-gelu"))
            rc = reel_fail(REEL_E_UNSUPPORTED, "%s: feed_forward_proj '%.32s' (Wan's umT5 is gated-gelu)", p, s);
        else if ((v = json_object_get(c, "relative_attention_max_distance")) && json_integer_value(v) != 128)
            rc = reel_fail(REEL_E_UNSUPPORTED, "%s: relative_attention_max_distance %lld (Wan's umT5: 128)", p,
                           (long long)json_integer_value(v));
        else if ((v = json_object_get(c, "layer_norm_epsilon")) && fabs(json_number_value(v) - 1e-6) > 1e-12)
            rc = reel_fail(REEL_E_UNSUPPORTED, "%s: layer_norm_epsilon %g (Wan's umT5: 1e-6)", p, json_number_value(v));
    } else {
        if (json_is_true(json_object_get(c, "is_residual")))
            rc = reel_fail(REEL_E_UNSUPPORTED, "%s: a residual VAE (is_residual: Wan2.2's), not Wan2.1's", p);
        for (int i = 0; !rc && i < 2; i++) {
            const char *k = i ? "latents_std" : "latents_mean";
            if (!(v = json_object_get(c, k))) continue;
            char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!*extra) *extra = json_object();
            if (!text || !*extra || json_object_set_new(*extra, k, json_string(text)))
                rc = reel_fail(REEL_E_NOMEM, "out of memory");
            free(text);
        }
    }
    json_decref(c);
    if (rc) {
        json_decref(*extra);
        *extra = NULL;
    }
    return rc;
}

st_file_t *hf_part_open(const char *path, hf_part_t kind) {
    static const char *const names[] = { "model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json",
                                         "model.safetensors", "diffusion_pytorch_model.safetensors" };
    struct stat st;
    char found[PATH_MAX];
    json_t *extra = NULL;
    if (stat(path, &st) != 0) {
        reel_fail_errno(errno == ENOENT ? REEL_E_NOT_FOUND : REEL_E_IO, errno, "%s: cannot open", path);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        size_t i = 0;
        for (; i < sizeof names / sizeof names[0]; i++)
            if (snprintf(found, sizeof found, "%s/%s", path, names[i]) < (int)sizeof found && lstat(found, &st) == 0)
                break;
        if (i == sizeof names / sizeof names[0]) {
            reel_fail(REEL_E_NOT_FOUND, "%s: a folder without model.safetensors, diffusion_pytorch_model.safetensors "
                      "or either's .index.json (diffusers' %s)", path, kind == HF_PART_T5 ? "text_encoder/" : "vae/");
            return NULL;
        }
        if (read_part_config(path, kind, &extra) != 0) return NULL;
        path = found;
    }
    st_file_t *f = ends_with(path, ".index.json") ? open_sharded(path) : weights_open_any(path);
    st_file_t *out = f ? renamed(f, kind, path, extra) : NULL;
    json_decref(extra);
    return out;
}
