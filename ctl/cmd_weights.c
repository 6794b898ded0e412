/* cmd_weights.c -- `reelctl weights init|inspect|info|export`: deterministic
 * random weights (nothing to download), what a checkpoint holds, in any
 * layout model/wan_ckpt.h reads (info is inspect's old name), and a
 * checkpoint written back in the layout a Wan2.1 release ships. */
#include "ctl.h"
#include "model/lora.h"
#include "model/release.h"
#include "base/error.h"
#include "base/opts.h"
#include "base/parse.h"
#include "model/t5.h"
#include "model/tinydit.h"
#include "model/wan_ckpt.h"
#include <jansson.h>
#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>


static int weights_init(int argc, char **argv) {
    static const struct option opts[] = {
        { "config", required_argument, 0, 'c' }, { "seed", required_argument, 0, 's' },
        { "out", required_argument, 0, 'o' }, { 0, 0, 0, 0 },
    };
    const char *config = NULL, *out = NULL;
    uint64_t seed = 0;
    int o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'c': config = optarg; break;
        case 'o': out = optarg; break;
        case 's':
            if (reel_parse_u64(optarg, 0, UINT64_MAX, "--seed", &seed)) return -1;
            break;
        default:
            return ctl_fail_usage("weights init", "weights init: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "weights init: unexpected argument '%s'", argv[optind]);
    if (!config || !out) return reel_fail(REEL_E_INVALID, "weights init needs --config and --out");
    tdit_config_t c;
    if (tdit_config_builtin(config, &c) != 0) {
        char names[256] = "";
        for (int i = 0; tdit_config_builtin_name(i); i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%.55s", i ? ", " : "",
                     tdit_config_builtin_name(i));
        if (access(config, R_OK) != 0)
            return reel_fail(REEL_E_NOT_FOUND,
                             "--config: '%s' is neither a built-in config (%s) nor a readable JSON file", config, names);
        if (ctl_config_from_json(config, &c) != 0) return ctl_fail_as(REEL_E_INVALID, "--config %s: ", config);
    }
    if (ctl_out_spares(out, "--config", config, (const char *)NULL) != 0) return -1;
    /* Every tensor is held until the file is written: a config past this
     * machine's memory is refused here, not found out by the OOM killer. */
    int64_t params = tdit_config_params(&c);
    double need = 4.0 * (double)params, have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (params < 0) return ctl_fail_as(REEL_E_INVALID, "--config %s: ", config);
    if (have > 0 && need > have)
        return reel_fail(REEL_E_LIMIT,
                         "--config %s: %" PRId64 " parameters are %.1f GiB of F32 weights, more than this machine's "
                         "%.1f GiB of memory (weights init holds them all until the file is written)",
                         config, params, need / (1 << 30), have / (1 << 30));
    if (tdit_weights_init(&c, seed, out) != 0) return ctl_fail_as(REEL_E_IO, NULL);
    fprintf(stderr, "reelctl: wrote %s: config %s (D=%" PRId64 " H=%" PRId64 " layers=%" PRId64
            "), %" PRId64 " parameters, seed %" PRIu64 "\n", out, c.name, c.dim, c.heads, c.layers,
            tdit_config_params(&c), seed);
    return 0;
}

static json_t *file_json(const wan_file_t *f) {
    return json_pack("{s:s, s:I, s:s}", "name", f->name, "bytes", (json_int_t)f->bytes, "sha256", f->sha256);
}

/* What a checkpoint holds, as text or JSON: its layout, config, size,
 * files and the identity a sync by path would announce. */
/* `weights inspect ADAPTER`: rank, alpha, scale, layout, targets. */
static int lora_inspect(const char *path, bool json) {
    lora_t *l = lora_open(path);
    if (!l) return ctl_fail_as(REEL_E_INVALID, NULL);
    int n = lora_n_targets(l);
    if (json) {
        json_t *targets = json_array();
        for (int i = 0; i < n; i++) {
            const lora_target_t *t = lora_target(l, i);
            json_t *one = json_pack("{s:s, s:I, s:I, s:I, s:f}", "weight", t->weight, "out", (json_int_t)t->out, "in",
                                    (json_int_t)t->in, "rank", (json_int_t)t->rank, "scale", (double)t->scale);
            if (one && t->d) { /* a full difference: its shape and scale */
                json_t *shape = json_array();
                for (int d = 0; d < t->d_ndim; d++) json_array_append_new(shape, json_integer(t->d_shape[d]));
                json_object_set_new(one, "diff", json_pack("{s:o, s:f}", "shape", shape, "scale", (double)t->d_scale));
            }
            json_array_append_new(targets, one);
        }
        json_t *root = json_pack("{s:s, s:s, s:s, s:i, s:f, s:b, s:f, s:I, s:s, s:o}", "path", path, "kind", "lora",
                                 "layout", lora_layout(l), "rank", lora_rank(l), "alpha", lora_alpha(l), "rslora",
                                 lora_rslora(l), "scale", (double)lora_scale(l), "bytes", (json_int_t)lora_bytes(l),
                                 "sha256", lora_sha256(l), "targets", targets);
        char *text = root ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (text) printf("%s\n", text);
        free(text);
        json_decref(root);
        lora_close(&l);
        return text ? 0 : reel_fail(REEL_E_NOMEM, "out of memory");
    }
    printf("%s: LoRA adapter (%s names)\n", path, lora_layout(l));
    if (lora_scale(l) != 0)
        printf("  rank %d, alpha %g%s: scale %g\n", lora_rank(l), lora_alpha(l), lora_rslora(l) ? ", rsLoRA" : "",
               (double)lora_scale(l));
    else if (lora_rank(l) == 0) /* no low-rank part at all */
        printf("  full differences only (no low-rank part)\n");
    else /* from the file, targets of other ranks or alphas */
        printf("  ranks up to %d; alpha and scale per target (below)\n", lora_rank(l));
    printf("  %d targets, %zu bytes, sha256 %s\n", n, lora_bytes(l), lora_sha256(l));
    for (int i = 0; i < n; i++) {
        const lora_target_t *t = lora_target(l, i);
        if (t->a)
            printf("  %-32s [%lld, %lld] rank %lld, scale %g\n", t->weight, (long long)t->out, (long long)t->in,
                   (long long)t->rank, (double)t->scale);
        if (t->d) {
            char shape[96] = "";
            for (int d = 0; d < t->d_ndim; d++)
                snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "",
                         (long long)t->d_shape[d]);
            printf("  %-32s [%s] difference, scale %g\n", t->weight, shape, (double)t->d_scale);
        }
    }
    lora_close(&l);
    return 0;
}

static int weights_inspect(int argc, char **argv, const char *cmd) {
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] == '-' && argv[i][1])
            return ctl_fail_usage("weights inspect", "weights %s: unknown option '%s'", cmd, argv[i]);
        else if (path) return reel_fail(REEL_E_INVALID, "weights %s: unexpected argument '%s'", cmd, argv[i]);
        else path = argv[i];
    }
    if (!path)
        return reel_fail(REEL_E_INVALID, "usage: reelctl weights %s PATH [--json] (a weights file, a sharded index or "
                         "a folder: a Wan2.1 release, a diffusers transformer or pipeline)", cmd);
    if (lora_is_adapter(path)) return lora_inspect(path, json);
    /* every byte hashed, nothing kept: a 14B release needs no 28 GB here */
    wan_opts_t o = { .no_data = true };
    wan_ckpt_t *ck = wan_ckpt_open(path, &o);
    if (!ck) return ctl_fail_as(REEL_E_INVALID, NULL);
    const tdit_config_t *c = wan_ckpt_config(ck);
    wan_summary_t s;
    wan_ckpt_summary(ck, &s);
    const wan_file_t *idx = wan_ckpt_index(ck);
    /* a release folder's or pipeline root's other parts, by where they are
     * (each is read, and judged, by the worker or reelctl run that loads it) */
    release_parts_t rel;
    memset(&rel, 0, sizeof rel);
    struct stat pst;
    if (stat(path, &pst) == 0 && S_ISDIR(pst.st_mode) && release_find(path, &rel) != 0) memset(&rel, 0, sizeof rel);
    if (json) {
        json_t *dt = json_object(), *files = json_array();
        for (int d = 0; d < KERN_DTYPE_COUNT; d++)
            if (s.dtype_count[d]) json_object_set_new(dt, kern_dtype_name((kern_dtype_t)d), json_integer((json_int_t)s.dtype_count[d]));
        for (size_t i = 0; i < wan_ckpt_n_files(ck); i++) json_array_append_new(files, file_json(wan_ckpt_file_at(ck, i)));
        json_t *cfg = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "name", c->name, "dim",
                                (json_int_t)c->dim, "heads", (json_int_t)c->heads, "layers", (json_int_t)c->layers,
                                "ffn_dim", (json_int_t)c->ffn_dim, "in_channels", (json_int_t)c->in_channels,
                                "text_dim", (json_int_t)c->text_dim, "freq_dim", (json_int_t)c->freq_dim, "text_len",
                                (json_int_t)c->text_len);
        json_t *root = json_pack("{s:s, s:s, s:o, s:I, s:I, s:o, s:I, s:I, s:o, s:o, s:s}", "path", path, "layout",
                                 wan_layout_name(wan_ckpt_layout(ck)), "config", cfg, "tensors", (json_int_t)s.tensors,
                                 "parameters", (json_int_t)s.parameters, "dtypes", dt, "tensor_bytes",
                                 (json_int_t)s.tensor_bytes, "file_bytes", (json_int_t)s.file_bytes, "index",
                                 idx ? file_json(idx) : json_null(), "files", files, "sha256", wan_ckpt_identity(ck));
        if (root)
            json_object_set_new(root, "parts", json_pack("{s:s?, s:s?, s:s?}", "text_encoder", rel.t5[0] ? rel.t5 : NULL,
                                                         "tokenizer", rel.tokenizer[0] ? rel.tokenizer : NULL, "vae",
                                                         rel.vae[0] ? rel.vae : NULL));
        char *text = root ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (text) printf("%s\n", text);
        free(text);
        json_decref(root);
        wan_ckpt_destroy(&ck);
        return text ? 0 : reel_fail(REEL_E_NOMEM, "out of memory");
    }
    char dts[64] = "";
    for (int d = 0; d < KERN_DTYPE_COUNT; d++)
        if (s.dtype_count[d])
            snprintf(dts + strlen(dts), sizeof dts - strlen(dts), "%s%s %zu", dts[0] ? ", " : "",
                     kern_dtype_name((kern_dtype_t)d), s.dtype_count[d]);
    printf("path        %s\nlayout      %s\nconfig      %s\ndim         %" PRId64 "\nheads       %" PRId64
           "\nlayers      %" PRId64 "\nffn_dim     %" PRId64 "\nin_channels %" PRId64 "\ntext_dim    %" PRId64
           "\nfreq_dim    %" PRId64 "\ntext_len    %" PRId64 "%s\ntensors     %zu\nparameters  %" PRId64
           "\ndtypes      %s\nbytes       %" PRIu64 " in tensors, %" PRIu64 " in %zu file(s)\n",
           path, wan_layout_name(wan_ckpt_layout(ck)), c->name, c->dim, c->heads, c->layers, c->ffn_dim,
           c->in_channels, c->text_dim, c->freq_dim, c->text_len, c->text_len ? "" : " (none: contexts are not padded)",
           s.tensors, s.parameters, dts, s.tensor_bytes, s.file_bytes, wan_ckpt_n_files(ck));
    if (idx) printf("index       %s  %" PRIu64 " bytes  sha256 %s\n", idx->name, idx->bytes, idx->sha256);
    for (size_t i = 0; i < wan_ckpt_n_files(ck); i++) {
        const wan_file_t *f = wan_ckpt_file_at(ck, i);
        printf("file        %s  %" PRIu64 " bytes  sha256 %s\n", f->name, f->bytes, f->sha256);
    }
    printf("sha256      %s  (%s)\n", wan_ckpt_identity(ck),
           idx ? "a sync by path announces it: the index's bytes, then each shard's sha256 (docs/PROTOCOL.md)"
               : "a sync by path announces it: the file's bytes");
    if (rel.t5[0]) printf("text enc    %s\n", rel.t5);
    if (rel.tokenizer[0]) printf("tokenizer   %s\n", rel.tokenizer);
    if (rel.vae[0]) printf("vae         %s\n", rel.vae);
    wan_ckpt_destroy(&ck);
    return 0;
}

/* Wan's config.json for c, as a T2V release ships it (text_len 512 when c
 * has none: what Wan's T2V configs use). NULL when out of memory. */
static json_t *wan_config_json(const tdit_config_t *c) {
    return json_pack("{s:s, s:s, s:I, s:f, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:[iii], s:[ii], s:b, s:b}",
                     "_class_name", "WanModel", "_diffusers_version", "0.30.0", "dim", (json_int_t)c->dim, "eps", 1e-6,
                     "ffn_dim", (json_int_t)c->ffn_dim, "freq_dim", (json_int_t)c->freq_dim, "in_dim",
                     (json_int_t)c->in_channels, "model_type", "t2v", "num_heads", (json_int_t)c->heads, "num_layers",
                     (json_int_t)c->layers, "out_dim", (json_int_t)c->in_channels, "text_dim", (json_int_t)c->text_dim,
                     "text_len", (json_int_t)(c->text_len ? c->text_len : 512), "patch_size", 1, 2, 2, "window_size",
                     -1, -1, "qk_norm", 1, "cross_attn_norm", 1);
}

/* `weights export PATH --out DIR [--dtype f32|bf16|f16]`: the checkpoint at
 * PATH (any layout) as the original Wan2.1 release layout, in DIR:
 * diffusion_pytorch_model.safetensors (Wan's names, no Reel metadata) and
 * Wan's config.json beside it. What a user hands Wan's own tools. */
static int weights_export(int argc, char **argv) {
    static const struct option opts[] = {
        { "out", required_argument, 0, 'o' }, { "dtype", required_argument, 0, 'd' }, { 0, 0, 0, 0 },
    };
    const char *out = NULL, *dts = "f32";
    int o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'o') out = optarg;
        else if (o == 'd') dts = optarg;
        else
            return ctl_fail_usage("weights export", "weights export: unknown or incomplete option '%s'", argv[optind - 1]);
    }
    if (optind != argc - 1 || !out)
        return reel_fail(REEL_E_INVALID, "usage: reelctl weights export PATH --out DIR [--dtype f32|bf16|f16]");
    kern_dtype_t dt;
    if (!strcmp(dts, "f32")) dt = KERN_F32;
    else if (!strcmp(dts, "bf16")) dt = KERN_BF16;
    else if (!strcmp(dts, "f16")) dt = KERN_F16;
    else return reel_fail(REEL_E_INVALID, "--dtype: '%s' is not f32, bf16 or f16", dts);
    const char *path = argv[optind];
    int code = -1;
    st_file_t *f = wan_ckpt_load(path); /* judged whole before anything is written */
    tdit_config_t c;
    size_t n = 0;
    tdit_weight_t *ws = NULL;
    st_writer_t *w = NULL;
    float *buf = NULL;
    uint16_t *half = NULL;
    json_t *cj = NULL;
    char fpath[PATH_MAX], cpath[PATH_MAX];
    if (!f) {
        ctl_fail_as(REEL_E_INVALID, NULL);
        goto out;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        reel_fail(REEL_E_IO, "%s: cannot create: %s", out, strerror(errno));
        goto out;
    }
    /* the checkpoint loaded whole: its config and layout read back (exit 1, as always) */
    if (tdit_config_from_meta(f, &c) != 0 || !(ws = tdit_config_weights(&c, &n)) || !(w = st_writer_new())) {
        ctl_fail_as(REEL_E_INTERNAL, "%s: ", path);
        goto out;
    }
    if ((size_t)snprintf(fpath, sizeof fpath, "%s/diffusion_pytorch_model.safetensors", out) >= sizeof fpath ||
        (size_t)snprintf(cpath, sizeof cpath, "%s/config.json", out) >= sizeof cpath) {
        reel_fail(REEL_E_LIMIT, "--out %s: path too long", out);
        goto out;
    }
    if (ctl_out_spares(fpath, "PATH", path, (const char *)NULL) != 0 ||
        ctl_out_spares(cpath, "PATH", path, (const char *)NULL) != 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        int64_t numel = 1;
        for (int d = 0; d < ws[i].ndim; d++) numel *= ws[i].shape[d];
        /* Each pointer kept as soon as its realloc succeeds: `out` frees
         * exactly what is live, whichever of the two failed. */
        float *nb = realloc(buf, (size_t)numel * sizeof *buf);
        if (nb) buf = nb;
        uint16_t *nh = dt == KERN_F32 || !nb ? half : realloc(half, (size_t)numel * sizeof *half);
        if (nh) half = nh;
        if (!nb || (dt != KERN_F32 && !nh)) {
            reel_fail(REEL_E_NOMEM, "out of memory");
            goto out;
        }
        if (st_read_f32(f, ws[i].name, ws[i].ndim, ws[i].shape, buf) != 0) {
            ctl_fail_as(REEL_E_IO, NULL);
            goto out;
        }
        for (int64_t j = 0; dt != KERN_F32 && j < numel; j++)
            half[j] = dt == KERN_BF16 ? kern_f32_to_bf16(buf[j]) : kern_f32_to_f16(buf[j]);
        if (st_writer_add(w, ws[i].name, dt, ws[i].ndim, ws[i].shape, dt == KERN_F32 ? (const void *)buf : half) != 0) {
            ctl_fail_as(REEL_E_INTERNAL, NULL); /* a tensor of our own list: a bug */
            goto out;
        }
    }
    if (st_writer_save(w, fpath) != 0) {
        ctl_fail_as(REEL_E_IO, NULL);
        goto out;
    }
    if (!(cj = wan_config_json(&c)) || json_dump_file(cj, cpath, JSON_INDENT(2)) != 0) {
        reel_fail(REEL_E_IO, "%s: cannot write", cpath);
        goto out;
    }
    fprintf(stderr, "reelctl: wrote %s as a Wan2.1 release: %s (%zu tensors, %s) and %s\n", path, fpath, n,
            kern_dtype_name(dt), cpath);
    code = 0;
out:
    json_decref(cj);
    free(buf);
    free(half);
    free(ws);
    st_writer_destroy(&w);
    st_close(&f);
    return code;
}

typedef struct {
    const char *config, *out;
    uint64_t seed;
    bool bf16;
} init_t5_opts_t;

static const char *const t5_dtypes[] = { "f32", "bf16", NULL };

#define O(f) offsetof(init_t5_opts_t, f)
static const reel_opt_t init_t5_rows[] = {
    { .name = "config", .kind = REEL_OPT_STRING, .off = O(config) },
    { .name = "out", .kind = REEL_OPT_STRING, .off = O(out) },
    { .name = "seed", .kind = REEL_OPT_U64, .off = O(seed), .ulo = 0, .uhi = UINT64_MAX },
    { .name = "dtype", .kind = REEL_OPT_BOOL_CHOICE, .off = O(bf16), .choices = t5_dtypes },
};
#undef O

/* `weights init-t5 --config NAME --seed S [--dtype f32|bf16] --out PATH`:
 * random umT5 encoder weights under the release's names (model/t5.h). */
static int weights_init_t5(int argc, char **argv) {
    init_t5_opts_t o = { 0 };
    int rest = argc;
    if (reel_opts_parse(init_t5_rows, sizeof init_t5_rows / sizeof init_t5_rows[0], &o, argc, argv, &rest))
        return rest ? reel_fail_prefix("weights init-t5: ")
                    : ctl_fail_usage("weights init-t5", "weights init-t5: %s", reel_err()->msg);
    if (rest < argc) return reel_fail(REEL_E_INVALID, "weights init-t5: unexpected argument '%s'", argv[rest]);
    if (!o.config || !o.out) return reel_fail(REEL_E_INVALID, "weights init-t5 needs --config and --out");
    kern_dtype_t dt = o.bf16 ? KERN_BF16 : KERN_F32;
    t5_config_t c;
    if (t5_config_builtin(o.config, &c) != 0) return ctl_fail_as(REEL_E_INVALID, "--config: ");
    if (t5_weights_init(&c, o.seed, dt, o.out) != 0) return ctl_fail_as(REEL_E_IO, NULL);
    fprintf(stderr, "reelctl: wrote %s: t5 config %s (vocab %" PRId64 " dim %" PRId64 " layers %" PRId64 "), %s, seed %"
            PRIu64 "\n", o.out, c.name, c.vocab, c.dim, c.layers, kern_dtype_name(dt), o.seed);
    return 0;
}

int cmd_weights(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "init-t5")) return weights_init_t5(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "export")) return weights_export(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "init")) return weights_init(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "init-vae")) return cmd_weights_init_vae(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "inspect")) return weights_inspect(argc - 1, argv + 1, "inspect");
    if (argc >= 2 && !strcmp(argv[1], "info")) return weights_inspect(argc - 1, argv + 1, "info");
    if (argc < 2) return ctl_fail_usage("weights", "weights: which one? (init, init-t5, init-vae, inspect, export)");
    return ctl_fail_usage("weights", "weights: unknown subcommand '%s' (init, init-t5, init-vae, inspect, export)",
                          argv[1]);
}
