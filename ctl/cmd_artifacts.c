/* cmd_artifacts.c -- `reelctl artifacts list|verify|report DIR`: the kernel
 * bundles under DIR as a worker would see them (docs/ARTIFACTS.md).
 *
 *   list DIR [--json]                  every bundle: verified or refused, why
 *   verify DIR [--enable IDS] [--json] the same, then loads the enabled ones;
 *                                      exit 1 when any bundle is refused or
 *                                      fails to load, 2 for an unknown id
 *   report DIR [--enable IDS] [--timing off|sync|shadow] [--config NAME]
 *          [--size FxHxW] [--steps N] [--graphs on|off] [--json]
 *                                      runs a denoising loop in this process,
 *                                      native first, then with the artifacts,
 *                                      and prints per artifact and per kernel
 *                                      key: calls, parity passes and failures,
 *                                      fallbacks, speedup with spread; and
 *                                      whether the served result equals native
 *   report --catalog PATH [--json]     what the workers reported to the catalog:
 *                                      per artifact, and per worker and key */
#include "ctl.h"
#include "ctl/report.h"
#include "kernels/artifacts.h"
#include "base/error.h"
#include "base/parse.h"
#include "model/tdit_program.h"
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *dir, *enable, *config, *catalog;
    kern_art_timing_t timing;
    bool json, graphs;
    int steps;
    int64_t size[3];
} art_opts_t;

static int parse(int argc, char **argv, art_opts_t *o) {
    enum { O_ENABLE = 1, O_TIMING, O_CONFIG, O_SIZE, O_STEPS, O_GRAPHS, O_JSON, O_CATALOG };
    static const struct option opts[] = {
        { "enable", required_argument, 0, O_ENABLE }, { "timing", required_argument, 0, O_TIMING },
        { "config", required_argument, 0, O_CONFIG }, { "size", required_argument, 0, O_SIZE },
        { "steps", required_argument, 0, O_STEPS },   { "graphs", required_argument, 0, O_GRAPHS },
        { "json", no_argument, 0, O_JSON },           { "catalog", required_argument, 0, O_CATALOG },
        { 0, 0, 0, 0 },
    };
    memset(o, 0, sizeof *o);
    o->timing = KERN_ART_TIMING_SHADOW;
    o->config = "tiny";
    o->steps = 6;
    o->graphs = true;
    o->size[0] = 2, o->size[1] = 8, o->size[2] = 8;
    opterr = 0;
    optind = 2; /* argv[0] "artifacts", argv[1] the subcommand */
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_ENABLE: o->enable = optarg; break;
        case O_CONFIG: o->config = optarg; break;
        case O_JSON: o->json = true; break;
        case O_CATALOG: o->catalog = optarg; break;
        case O_TIMING:
            if (kern_art_timing_parse(optarg, &o->timing)) return ctl_fail_as(REEL_E_INVALID, NULL);
            break;
        case O_SIZE:
            if (ctl_size_parse(optarg, "--size", o->size)) return -1;
            break;
        case O_STEPS:
            if (reel_parse_int(optarg, 1, 1000, "--steps", &o->steps)) return -1;
            break;
        case O_GRAPHS:
            if (strcmp(optarg, "on") && strcmp(optarg, "off"))
                return reel_fail(REEL_E_INVALID, "--graphs: on or off, not '%s'", optarg);
            o->graphs = !strcmp(optarg, "on");
            break;
        default: {
            char key[32]; /* argv[1]: list, verify or report (cmd_artifacts checked) */
            snprintf(key, sizeof key, "artifacts %s", argv[1]);
            return ctl_fail_usage(key, "%s: unknown or incomplete option '%s'", key, argv[optind - 1]);
        }
        }
    }
    if (o->catalog && optind == argc) return 0; /* report --catalog: no directory */
    if (optind != argc - 1) return reel_fail(REEL_E_INVALID, "artifacts: give one bundle directory");
    o->dir = argv[optind];
    return 0;
}

/* Scans o->dir and applies the allowlist: NULL with the error value set
 * (a missing directory, an unknown id: exit 2). */
static kern_artifacts_t *open_set(const art_opts_t *o) {
    kern_artifacts_t *set = kern_artifacts_scan(o->dir);
    if (!set) {
        ctl_fail_as(REEL_E_INVALID, NULL);
        return NULL;
    }
    int rc = o->enable ? kern_artifacts_enable_list(set, o->enable) : kern_artifacts_enable(set, NULL, 0);
    if (rc != 0) {
        ctl_fail_as(REEL_E_INVALID, NULL);
        kern_artifacts_destroy(&set);
        return NULL;
    }
    return set;
}

static void print_refusals(kern_artifacts_t *set) {
    for (size_t i = 0; i < kern_artifacts_count(set); i++) {
        kern_art_bundle_t b = kern_artifacts_bundle(set, i);
        if (b.error[0]) fprintf(stderr, "reelctl: %s\n", b.error);
    }
}

/* list, or verify (load): 0, CTL_NO when a bundle is refused or fails to
 * load, -1 when loading failed as a whole. */
static int cmd_list(const art_opts_t *o, bool load) {
    kern_artifacts_t *set = open_set(o);
    if (!set) return -1;
    int rc = 0;
    if (load) {
        rc = kern_artifacts_install(set, KERN_ART_TIMING_OFF);
        kern_artifacts_uninstall(set);
    }
    kern_artifacts_print(set, stdout, false, o->json);
    bool bad = rc != 0 || kern_artifacts_refused(set) > 0;
    if (load && rc == 0)
        for (size_t i = 0; i < kern_artifacts_count(set); i++)
            bad |= kern_artifacts_bundle(set, i).error[0] != '\0';
    if (load) print_refusals(set);
    if (load && rc == 0 && kern_artifacts_count(set) == 0 && kern_artifacts_refused(set) == 0) {
        /* a mistyped or empty folder must not pass for a verified one */
        fprintf(stderr, "reelctl: %s holds no kernel artifact bundle: nothing was verified\n", o->dir);
        bad = true;
    }
    if (rc != 0) ctl_fail_as(REEL_E_IO, NULL);
    kern_artifacts_destroy(&set);
    return rc != 0 ? -1 : load && bad ? CTL_NO : 0;
}


/* One loop of m through a fresh cache (or eagerly); its wall time. */
static int run_loop(tdit_model_t *m, kern_backend_t *b, kern_stream_t *s, const tdit_shape_t *sh,
                    const tdit_loop_t *p, bool graphs, const float *lat, const float *ctx,
                    float *out, double *secs, tdit_run_stats_t *st) {
    cap_options_t co = cap_options_default();
    co.graphs = graphs;
    cap_cache_t *c = cap_cache_new(b, &co);
    if (!c || tdit_register_weights(c, m, 1) != 0) {
        cap_cache_destroy(&c);
        return -1;
    }
    double t0 = ctl_now();
    int rc = tdit_generate_cached(m, c, s, NULL, sh, p, lat, ctx, NULL, out, st);
    *secs = ctl_now() - t0;
    cap_cache_destroy(&c); /* before the caller's stream goes (cache.h, Lifetimes) */
    return rc;
}

static int artifacts_report(const art_opts_t *o) {
    kern_artifacts_t *set = open_set(o);
    if (!set) return -1;
    print_refusals(set);
    tdit_config_t cfg;
    char dir[] = "/tmp/reelctl-artifacts.XXXXXX", wpath[64];
    if (tdit_config_builtin(o->config, &cfg) != 0) {
        ctl_fail_as(REEL_E_INVALID, "--config: ");
        kern_artifacts_destroy(&set);
        return -1;
    }
    if (!mkdtemp(dir)) {
        kern_artifacts_destroy(&set);
        return reel_fail(REEL_E_IO, "cannot make a temporary directory");
    }
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", dir);
    tdit_shape_t shape = { o->size[0], o->size[1], o->size[2], 8, false, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    size_t nl = (size_t)(cfg.in_channels * shape.frames * shape.height * shape.width);
    size_t nc = (size_t)(shape.text_len * cfg.text_dim);
    float *lat = malloc(nl * 4), *ctx = malloc(nc * 4), *a = malloc(nl * 4), *b_ = malloc(nl * 4);
    kern_backend_t *be = kern_backend_cpu_new();
    kern_stream_t *s = be ? kern_stream_new(be) : NULL;
    tdit_model_t *m = NULL;
    tdit_loop_t p = { .steps = o->steps, .shift = 3.0, .guidance = 1.0f };
    double tn = 0, ta = 0;
    tdit_run_stats_t st;
    int code = -1;
    if (!lat || !ctx || !a || !b_ || !s) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto out;
    }
    if (tdit_weights_init(&cfg, 7, wpath) != 0 || !(m = tdit_model_load_path(be, wpath, KERN_F32))) {
        ctl_fail_as(REEL_E_IO, NULL);
        goto out;
    }
    tdit_initial_latent(1, lat, nl);
    tdit_initial_latent(2, ctx, nc);
    if (run_loop(m, be, s, &shape, &p, o->graphs, lat, ctx, a, &tn, &st) != 0) {
        ctl_fail_as(REEL_E_INTERNAL, "native run: ");
        goto out;
    }
    if (kern_artifacts_install(set, o->timing) != 0) {
        ctl_fail_as(REEL_E_INVALID, NULL);
        goto out;
    }
    int rc = run_loop(m, be, s, &shape, &p, o->graphs, lat, ctx, b_, &ta, &st);
    kern_artifacts_uninstall(set);
    if (rc != 0) {
        ctl_fail_as(REEL_E_INTERNAL, "run with artifacts: ");
        goto out;
    }
    double maxd = 0;
    for (size_t i = 0; i < nl; i++) maxd = fmax(maxd, fabs((double)a[i] - (double)b_[i]));
    bool equal = !memcmp(a, b_, nl * 4);
    if (o->json) {
        printf("{\"run\":{\"config\":\"%s\",\"size\":\"%lldx%lldx%lld\",\"steps\":%d,\"graphs\":%s,"
               "\"native_s\":%.6f,\"artifacts_s\":%.6f,\"equal_to_native\":%s,\"max_abs_diff\":%.6g,"
               "\"artifact_parity_declines\":%d},\"report\":", o->config, (long long)o->size[0],
               (long long)o->size[1], (long long)o->size[2], o->steps, o->graphs ? "true" : "false",
               tn, ta, equal ? "true" : "false", maxd, st.declines[CAP_DECLINE_ARTIFACT_PARITY]);
        kern_artifacts_print(set, stdout, true, true);
        printf("}\n");
    } else {
        printf("loop: %s, %lldx%lldx%lld, %d steps, graphs %s, timing %s\n", o->config,
               (long long)o->size[0], (long long)o->size[1], (long long)o->size[2], o->steps,
               o->graphs ? "on" : "off", kern_art_timing_name(o->timing));
        printf("native %.3f s, with artifacts %.3f s (%.3fx, timing overhead included); served "
               "result %s native%s\n\n", tn, ta, ta > 0 ? tn / ta : 0,
               equal ? "bitwise equal to" : "differs from", equal ? "" : " (see max_rel rules)");
        if (!equal) printf("largest |difference| %.3g\n\n", maxd);
        kern_artifacts_print(set, stdout, true, false);
    }
    code = 0;
out:
    tdit_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&be);
    unlink(wpath);
    rmdir(dir);
    free(lat);
    free(ctx);
    free(a);
    free(b_);
    kern_artifacts_destroy(&set);
    return code;
}

int cmd_artifacts(int argc, char **argv) {
    if (argc < 2) return ctl_fail_usage("artifacts", "artifacts: which one? (list, verify or report)");
    const char *sub = argv[1];
    if (strcmp(sub, "list") && strcmp(sub, "verify") && strcmp(sub, "report"))
        return ctl_fail_usage("artifacts", "artifacts: unknown subcommand '%s' (list, verify, report)", sub);
    art_opts_t o;
    if (parse(argc, argv, &o) != 0) return -1;
    if (o.catalog && (strcmp(sub, "report") || o.dir))
        return reel_fail(REEL_E_INVALID, "artifacts: --catalog goes with report, without a directory");
    if (o.catalog) {
        cat_t *c = cat_open(o.catalog, true);
        if (!c) return ctl_fail_as(REEL_E_IO, NULL);
        int rc = ctl_report_artifacts(c, o.json, stdout) == 0 ? 0 : ctl_fail_as(REEL_E_IO, NULL);
        cat_close(&c);
        return rc;
    }
    if (!strcmp(sub, "report")) return artifacts_report(&o);
    return cmd_list(&o, !strcmp(sub, "verify"));
}
