/* cmd_weights.c -- `reelctl weights init|info`: deterministic random weights
 * (nothing to download) and a summary of a weights file. */
#include "ctl.h"
#include "kernels/error.h"
#include "worker/model/tinydit.h"
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A config from a JSON file {"name":..., "dim":..., ...}. */
static int config_from_json(const char *path, tdit_config_t *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return kern_fail("%s: cannot open: %s", path, strerror(errno));
    char buf[64 * 1024];
    size_t n = fread(buf, 1, sizeof buf, f);
    bool more = !feof(f) && fgetc(f) != EOF;
    fclose(f);
    if (more) return kern_fail("%s: larger than %zu bytes: not a model config", path, sizeof buf);
    return tdit_config_from_json(buf, n, path, c);
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
