/* cmd_weights.c -- `reelctl weights init|info`: deterministic random weights
 * (nothing to download) and a summary of a weights file. */
#include "ctl.h"
#include "kernels/error.h"
#include "worker/model/tinydit.h"
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A config from a JSON file {"name":..., "dim":..., ...}. */
static int config_from_json(const char *path, tdit_config_t *c) {
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return kern_fail("%s:%d: %s", path, je.line, je.text);
    int rc = -1;
    if (!json_is_object(root)) { kern_fail("%s: not a JSON object", path); goto out; }
    memset(c, 0, sizeof *c);
    json_t *name = json_object_get(root, "name");
    snprintf(c->name, sizeof c->name, "%s", json_is_string(name) ? json_string_value(name) : "custom");
    struct { const char *k; int64_t *v; } keys[] = {
        { "dim", &c->dim }, { "heads", &c->heads }, { "layers", &c->layers },
        { "ffn_dim", &c->ffn_dim }, { "in_channels", &c->in_channels },
        { "text_dim", &c->text_dim }, { "freq_dim", &c->freq_dim },
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(root, keys[i].k);
        if (!json_is_integer(v)) { kern_fail("%s: '%s' must be an integer", path, keys[i].k); goto out; }
        *keys[i].v = json_integer_value(v);
    }
    rc = tdit_config_validate(c);
out:
    json_decref(root);
    return rc;
}

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
            if (ctl_parse_u64(optarg, &seed)) return ctl_die(CTL_USAGE, "--seed: '%s' is not a non-negative integer", optarg);
            break;
        default: return ctl_die(CTL_USAGE, "weights init: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return ctl_die(CTL_USAGE, "weights init: unexpected argument '%s'", argv[optind]);
    if (!config || !out) return ctl_die(CTL_USAGE, "weights init needs --config and --out");
    tdit_config_t c;
    if (tdit_config_builtin(config, &c) != 0) {
        if (access(config, R_OK) != 0)
            return ctl_die(CTL_USAGE, "--config: '%s' is neither a built-in config (tiny, small, "
                           "wan2.1-1.3b) nor a readable JSON file", config);
        if (config_from_json(config, &c) != 0)
            return ctl_die(CTL_USAGE, "--config %s: %s", config, kern_error());
    }
    if (tdit_weights_init(&c, seed, out) != 0) return ctl_die(CTL_FAIL, "%s", kern_error());
    fprintf(stderr, "reelctl: wrote %s: config %s (D=%" PRId64 " H=%" PRId64 " layers=%" PRId64
            "), %" PRId64 " parameters, seed %" PRIu64 "\n", out, c.name, c.dim, c.heads, c.layers,
            tdit_config_params(&c), seed);
    return CTL_OK;
}

static int weights_info(int argc, char **argv) {
    if (argc != 2) return ctl_die(CTL_USAGE, "usage: reelctl weights info W.safetensors");
    st_file_t *f = st_open(argv[1]);
    if (!f) return ctl_die(CTL_USAGE, "%s", kern_error());
    tdit_config_t c;
    if (tdit_config_from_meta(f, &c) != 0) {
        st_close(&f);
        return ctl_die(CTL_USAGE, "%s: %s", argv[1], kern_error());
    }
    printf("file        %s\nconfig      %s\ndim         %" PRId64 "\nheads       %" PRId64
           "\nlayers      %" PRId64 "\nffn_dim     %" PRId64 "\nin_channels %" PRId64
           "\ntext_dim    %" PRId64 "\nfreq_dim    %" PRId64 "\ntensors     %zu\nparameters  %" PRId64 "\n",
           argv[1], c.name, c.dim, c.heads, c.layers, c.ffn_dim, c.in_channels, c.text_dim,
           c.freq_dim, st_count(f), tdit_config_params(&c));
    st_close(&f);
    return CTL_OK;
}

int cmd_weights(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "init")) return weights_init(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "info")) return weights_info(argc - 1, argv + 1);
    return ctl_die(CTL_USAGE, "usage: reelctl weights init|info ...");
}
