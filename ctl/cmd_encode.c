/* cmd_encode.c -- `reelctl encode`: a prompt's token ids through the umT5
 * text encoder (model/t5.h) into a context file, tensor `context` [n, dim]
 * F32: what `run --context` and `gen --context` take.
 *
 * The ids come from --ids here; encode_ids() takes them from anywhere (a
 * tokenizer's output), so a --prompt option only has to produce them. */
#include "ctl.h"
#include "base/error.h"
#include "base/parse.h"
#include "media/tokenizer.h"
#include "model/pth.h"
#include "model/hf_parts.h"
#include "model/t5.h"
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ENCODE_MAX_IDS 65536

typedef struct {
    const char *t5;      /* the encoder's weights (safetensors) */
    const char *out;     /* where the context goes */
    kern_backend_kind_t kind;
    kern_dtype_t dtype;  /* the encoder's: F32, or BF16 on CUDA */
    int64_t pad_to;      /* 0: run at the ids' own length */
} encode_opts_t;

/* Parses "5,17,1" into a new array (*ids, caller frees) of *n ids, each
 * in 0..INT32_MAX (the vocabulary bound is the model's to check). */
static int parse_ids(const char *s, int32_t **ids, int64_t *n) {
    int32_t *v = malloc(sizeof *v * ENCODE_MAX_IDS);
    if (!v) return reel_fail(REEL_E_NOMEM, "out of memory");
    int64_t k = 0;
    char item[32];
    for (const char *p = s;;) {
        size_t len = strcspn(p, ",");
        if (k == ENCODE_MAX_IDS) {
            free(v);
            return reel_fail(REEL_E_LIMIT, "--ids: more than %d ids", ENCODE_MAX_IDS);
        }
        if (len == 0 || len >= sizeof item) {
            free(v);
            return reel_fail(REEL_E_INVALID, "--ids: '%.60s' is not a comma-separated list of token ids", s);
        }
        memcpy(item, p, len);
        item[len] = '\0';
        int64_t x;
        if (reel_parse_i64(item, 0, INT32_MAX, "--ids", &x)) {
            free(v);
            return -1;
        }
        v[k++] = (int32_t)x;
        if (!p[len]) break;
        p += len + 1;
    }
    *ids = v;
    *n = k;
    return 0;
}

/* The ids of prompt as Wan's T5EncoderModel makes them (media/tokenizer.h:
 * cleaned, the end-of-sequence id, at most text_len): the context is then
 * the prompt's real length, as Wan cuts it. 0, or -1 (exit 2). */
static int prompt_ids(const char *tokenizer, const char *prompt, int64_t text_len, int32_t **ids, int64_t *n) {
    tok_t *t = tok_open(tokenizer);
    if (!t) return ctl_fail_as(REEL_E_INVALID, "--tokenizer: ");
    int32_t *v = malloc((size_t)text_len * sizeof *v);
    int got = v ? tok_encode(t, prompt, (int)text_len, v, (int)text_len) : -1;
    if (!v) reel_fail(REEL_E_NOMEM, "out of memory");
    tok_close(&t);
    if (got < 1) {
        free(v);
        return ctl_fail_as(REEL_E_INVALID, "--prompt: ");
    }
    *ids = v;
    *n = got;
    return 0;
}

/* Encodes ids[0..n) with the weights o->t5 and writes o->out. 0, or -1
 * with the error value set (a bad file or id exits 2, a device 1). */
static int encode_ids(const encode_opts_t *o, const int32_t *ids, int64_t n) {
    int rc = -1;
    kern_backend_t *b = NULL;
    kern_stream_t *s = NULL;
    t5_model_t *m = NULL;
    st_writer_t *w = NULL;
    float *ctx = NULL;
    st_file_t *f = hf_part_open(o->t5, HF_PART_T5); /* the release's .pth, a safetensors copy, diffusers' text_encoder/ */
    if (!f) {
        ctl_fail_as(REEL_E_INVALID, "--t5: ");
        goto out;
    }
    if (!(b = kern_backend_new(o->kind, 0)) || !(s = kern_stream_new(b))) {
        ctl_fail_as(REEL_E_DEVICE, NULL);
        goto out;
    }
    if (!(m = t5_model_load(b, f, o->dtype))) {
        hf_part_explain(f);
        ctl_fail_as(REEL_E_INVALID, "--t5 %s: ", o->t5);
        goto out;
    }
    st_close(&f);
    const t5_config_t *c = t5_model_config(m);
    ctx = malloc((size_t)(n * c->dim) * sizeof *ctx);
    if (!ctx) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto out;
    }
    if (t5_encode(m, s, ids, n, o->pad_to, ctx)) {
        ctl_fail_as(REEL_E_INVALID, NULL);
        goto out;
    }
    char len[32];
    snprintf(len, sizeof len, "%" PRId64, n);
    if (!(w = st_writer_new()) || st_writer_add_f32(w, "context", 2, (const int64_t[]){ n, c->dim }, ctx) ||
        st_writer_meta(w, "t5_config", c->name) || st_writer_meta(w, "tokens", len) ||
        st_writer_save(w, o->out)) {
        ctl_fail_as(REEL_E_IO, NULL);
        goto out;
    }
    fprintf(stderr, "reelctl: wrote %s: context [%" PRId64 ", %" PRId64 "] from %" PRId64 " ids (t5 %s, %s %s)\n",
            o->out, n, c->dim, n, c->name, kern_backend_device_name(b), kern_dtype_name(o->dtype));
    rc = 0;
out:
    st_writer_destroy(&w);
    free(ctx);
    t5_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
    st_close(&f);
    return rc;
}

int cmd_encode(int argc, char **argv) {
    static const struct option opts[] = {
        { "t5", required_argument, 0, 't' },     { "ids", required_argument, 0, 'i' },
        { "pad-to", required_argument, 0, 'p' }, { "out", required_argument, 0, 'o' },
        { "backend", required_argument, 0, 'b' }, { "dtype", required_argument, 0, 'd' },
        { "prompt", required_argument, 0, 'P' }, { "tokenizer", required_argument, 0, 'T' },
        { "text-len", required_argument, 0, 'L' },
        { 0, 0, 0, 0 },
    };
    const char *prompt = NULL, *tokenizer = NULL;
    int64_t text_len = 512;
    encode_opts_t o = { .kind = KERN_BACKEND_CPU, .dtype = KERN_F32 };
    const char *ids_text = NULL;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
        switch (c) {
        case 't': o.t5 = optarg; break;
        case 'i': ids_text = optarg; break;
        case 'o': o.out = optarg; break;
        case 'P': prompt = optarg; break;
        case 'T': tokenizer = optarg; break;
        case 'L':
            if (reel_parse_i64(optarg, 1, ENCODE_MAX_IDS, "--text-len", &text_len)) return -1;
            break;
        case 'p':
            if (reel_parse_i64(optarg, 1, ENCODE_MAX_IDS, "--pad-to", &o.pad_to)) return -1;
            break;
        case 'b':
            if (kern_backend_kind_parse(optarg, &o.kind)) return reel_fail(REEL_E_INVALID, "--backend: '%s' is not cpu or cuda", optarg);
            break;
        case 'd':
            if (!strcmp(optarg, "f32")) o.dtype = KERN_F32;
            else if (!strcmp(optarg, "bf16")) o.dtype = KERN_BF16;
            else return reel_fail(REEL_E_INVALID, "--dtype: '%s' is not f32 or bf16", optarg);
            break;
        default: return ctl_fail_usage("encode", "encode: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "encode: unexpected argument '%s'", argv[optind]);
    if (ctl_out_spares(o.out, "--t5", o.t5, "--tokenizer", tokenizer, (const char *)NULL) != 0) return -1;
    if (!o.t5 || !o.out || !ids_text == !prompt || !prompt != !tokenizer)
        return reel_fail(REEL_E_INVALID, "usage: reelctl encode --t5 T5 (--tokenizer PATH --prompt TEXT [--text-len N] | "
                         "--ids 5,17,1) [--pad-to N] -o OUT.safetensors");
    int32_t *ids = NULL;
    int64_t n = 0;
    if (prompt ? prompt_ids(tokenizer, prompt, text_len, &ids, &n) : parse_ids(ids_text, &ids, &n)) return -1;
    if (o.pad_to && o.pad_to < n) {
        free(ids);
        return reel_fail(REEL_E_INVALID, "--pad-to %" PRId64 " is shorter than the %" PRId64 " ids", o.pad_to, n);
    }
    int rc = encode_ids(&o, ids, n);
    free(ids);
    return rc;
}
