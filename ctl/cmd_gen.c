/* cmd_gen.c -- client commands against a running broker: `reelctl gen`,
 * `reelctl sync` and `reelctl status`. */
#include "ctl.h"
#include "kernels/error.h"
#include "schema/client.h"
#include "schema/sha256.h"
#include "worker/model/safetensors.h"
#include "worker/model/tinydit.h"
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_BROKER "tcp://127.0.0.1:5555"

static void progress_bar(void *user, int step, int steps) {
    (void)user;
    if (!ctl_tty() || steps <= 0) return;
    int w = 30, fill = step * w / steps;
    fprintf(stderr, "\r[");
    for (int i = 0; i < w; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] step %d/%d", step, steps);
    if (step == steps) fputc('\n', stderr);
    fflush(stderr);
}

int cmd_gen(int argc, char **argv) {
    enum { O_BROKER = 1, O_MODEL, O_VERSION, O_CONTEXT, O_UNCOND, O_CFG, O_LATENT, O_SIZE, O_STEPS,
           O_SHIFT, O_SDE, O_ETA, O_SEED, O_OUT, O_TIMEOUT, O_DEADLINE, O_QUIET, O_CHANNELS, O_KEY, O_BKEY };
    static const struct option opts[] = {
        { "broker", required_argument, 0, O_BROKER }, { "model", required_argument, 0, O_MODEL },
        { "config", required_argument, 0, O_MODEL },
        { "weights-version", required_argument, 0, O_VERSION }, { "context", required_argument, 0, O_CONTEXT },
        { "uncond", required_argument, 0, O_UNCOND }, { "cfg", required_argument, 0, O_CFG },
        { "latent", required_argument, 0, O_LATENT }, { "size", required_argument, 0, O_SIZE },
        { "steps", required_argument, 0, O_STEPS }, { "shift", required_argument, 0, O_SHIFT },
        { "sde", no_argument, 0, O_SDE }, { "eta", required_argument, 0, O_ETA },
        { "seed", required_argument, 0, O_SEED }, { "out", required_argument, 0, O_OUT },
        { "timeout-ms", required_argument, 0, O_TIMEOUT }, { "deadline-ms", required_argument, 0, O_DEADLINE },
        { "quiet", no_argument, 0, O_QUIET }, { "channels", required_argument, 0, O_CHANNELS },
        { "key", required_argument, 0, O_KEY }, { "broker-key", required_argument, 0, O_BKEY },
        { 0, 0, 0, 0 },
    };
    const char *broker = DEFAULT_BROKER, *ctx_path = NULL, *unc_path = NULL, *lat_path = NULL, *out = NULL;
    const char *key = NULL, *broker_key = NULL; /* NULL: $REEL_KEY, $REEL_BROKER_KEY */
    reel_gen_t g;
    memset(&g, 0, sizeof g);
    g.shift = 1.0;
    g.cfg = 1.0;
    g.eta = 0.7;
    g.steps = -1;
    bool have_cfg = false, quiet = false;
    int timeout_ms = 120000, channels = 0;
    int64_t size[3] = { 0 };
    double d;
    uint64_t u;
    int o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case O_BROKER: broker = optarg; break;
        case O_KEY: key = optarg; break;
        case O_BKEY: broker_key = optarg; break;
        case O_MODEL: g.model = optarg; break;
        case O_CONTEXT: ctx_path = optarg; break;
        case O_UNCOND: unc_path = optarg; break;
        case O_LATENT: lat_path = optarg; break;
        case O_OUT: out = optarg; break;
        case O_SDE: g.sde = true; break;
        case O_QUIET: quiet = true; break;
        case O_VERSION:
            if (ctl_parse_u64(optarg, &g.version)) return ctl_die(CTL_USAGE, "--weights-version: '%s' is not a version", optarg);
            break;
        case O_CFG:
            if (ctl_parse_double(optarg, &g.cfg)) return ctl_die(CTL_USAGE, "--cfg: '%s' is not a number", optarg);
            have_cfg = true;
            break;
        case O_SHIFT:
            if (ctl_parse_double(optarg, &g.shift)) return ctl_die(CTL_USAGE, "--shift: '%s' is not a number", optarg);
            break;
        case O_ETA:
            if (ctl_parse_double(optarg, &g.eta)) return ctl_die(CTL_USAGE, "--eta: '%s' is not a number", optarg);
            break;
        case O_STEPS:
            if (ctl_parse_int(optarg, &g.steps) || g.steps < 1) return ctl_die(CTL_USAGE, "--steps: '%s' is not a positive integer", optarg);
            break;
        case O_SEED:
            if (ctl_parse_u64(optarg, &g.seed)) return ctl_die(CTL_USAGE, "--seed: '%s' is not a non-negative integer", optarg);
            break;
        case O_TIMEOUT:
            if (ctl_parse_int(optarg, &timeout_ms) || timeout_ms < 1) return ctl_die(CTL_USAGE, "--timeout-ms: '%s'", optarg);
            break;
        case O_DEADLINE:
            if (ctl_parse_u64(optarg, &u)) return ctl_die(CTL_USAGE, "--deadline-ms: '%s'", optarg);
            g.deadline_ms = u;
            break;
        case O_CHANNELS:
            if (ctl_parse_int(optarg, &channels) || channels < 1) return ctl_die(CTL_USAGE, "--channels: '%s'", optarg);
            break;
        case O_SIZE:
            if (ctl_parse_size(optarg, size) != 0)
                return ctl_die(CTL_USAGE, "--size: expected FxHxW (e.g. 2x16x16), got '%s'", optarg);
            break;
        default: return ctl_die(CTL_USAGE, "gen: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    (void)d;
    if (optind < argc) return ctl_die(CTL_USAGE, "gen: unexpected argument '%s'", argv[optind]);
    /* Never give up before the broker does: it would run the request for nobody. */
    if (g.deadline_ms && g.deadline_ms + 2000 > (uint64_t)timeout_ms)
        timeout_ms = g.deadline_ms + 2000 > INT32_MAX ? INT32_MAX : (int)(g.deadline_ms + 2000);
    if (!g.model || !ctx_path || !out || g.steps < 0)
        return ctl_die(CTL_USAGE, "gen needs --model, --context, --steps and --out");
    if (!!unc_path != have_cfg) return ctl_die(CTL_USAGE, "--uncond and --cfg go together");
    if (!lat_path == !size[0]) return ctl_die(CTL_USAGE, "gen needs --latent FILE or --size FxHxW (with --seed)");

    float *ctx = NULL, *unc = NULL, *lat = NULL, *res_lat = NULL;
    int code = CTL_USAGE;
    reel_client_t *c = NULL;
    if (!(ctx = ctl_read_tensor(ctx_path, "context", 2, g.ctx_shape))) goto done;
    if (unc_path) {
        int64_t us[2];
        if (!(unc = ctl_read_tensor(unc_path, "context", 2, us))) goto done;
        if (us[0] != g.ctx_shape[0] || us[1] != g.ctx_shape[1]) {
            ctl_die(CTL_USAGE, "%s: uncond shape differs from the context's", unc_path);
            goto done;
        }
    }
    if (lat_path) {
        if (!(lat = ctl_read_tensor(lat_path, "latent", 4, g.latent_shape))) goto done;
    } else {
        tdit_config_t cfg;
        if (!channels && tdit_config_builtin(g.model, &cfg) == 0) channels = (int)cfg.in_channels;
        if (!channels) { ctl_die(CTL_USAGE, "--size with a custom model needs --channels C"); goto done; }
        g.latent_shape[0] = channels;
        memcpy(g.latent_shape + 1, size, sizeof size);
    }
    g.context = ctx;
    g.uncond = unc;
    g.latent = lat;
    g.progress = !quiet && ctl_tty();
    size_t n = (size_t)(g.latent_shape[0] * g.latent_shape[1] * g.latent_shape[2] * g.latent_shape[3]);
    code = CTL_FAIL;
    if (!(res_lat = malloc(n * sizeof *res_lat))) { ctl_die(CTL_FAIL, "out of memory"); goto done; }
    if (!(c = reel_client_new_keys(broker, key, broker_key))) { ctl_die(CTL_FAIL, "%s", kern_error()); goto done; }
    reel_gen_result_t r;
    wire_err_t err;
    int rc = reel_gen(c, &g, res_lat, &r, progress_bar, NULL, timeout_ms, &err);
    if (rc != 0) {
        ctl_die(CTL_FAIL, "gen: %s: %s", err.code, err.message);
        goto done;
    }
    st_writer_t *w = st_writer_new();
    char v[32];
    snprintf(v, sizeof v, "%" PRIu64, r.version);
    int wrc = !w || st_writer_add_f32(w, "latent", 4, g.latent_shape, res_lat) ||
              st_writer_meta(w, "worker", r.worker) || st_writer_meta(w, "weights_version", v) ||
              st_writer_meta(w, "config", g.model) || st_writer_save(w, out);
    st_writer_destroy(&w);
    if (wrc) { ctl_die(CTL_FAIL, "%s", kern_error()); goto done; }
    char vers[48];
    if (r.first_version != r.version)
        snprintf(vers, sizeof vers, "v%" PRIu64 "->v%" PRIu64, r.first_version, r.version);
    else
        snprintf(vers, sizeof vers, "v%" PRIu64, r.version);
    fprintf(stderr, "reelctl: gen %s via %s: worker %s, weights %s, %d steps (captured %d, "
            "replayed %d, eager %d%s%s), %.3f s on the worker -> %s\n", g.model, broker, r.worker, vers,
            g.steps, r.captured, r.replayed, r.eager, r.declines[0] ? ": " : "", r.declines, r.seconds, out);
    code = CTL_OK;
done:
    reel_client_destroy(&c);
    free(ctx); free(unc); free(lat); free(res_lat);
    return code;
}

int cmd_sync(int argc, char **argv) {
    static const struct option opts[] = {
        { "broker", required_argument, 0, 'b' }, { "component", required_argument, 0, 'c' },
        { "version", required_argument, 0, 'v' }, { "weights", required_argument, 0, 'w' },
        { "timeout-ms", required_argument, 0, 't' }, { "deadline-ms", required_argument, 0, 'd' },
        { "key", required_argument, 0, 'k' }, { "broker-key", required_argument, 0, 'K' },
        { 0, 0, 0, 0 },
    };
    const char *broker = DEFAULT_BROKER, *component = "transformer", *weights = NULL;
    const char *key = NULL, *broker_key = NULL; /* NULL: $REEL_KEY, $REEL_BROKER_KEY */
    uint64_t version = 0, deadline = 60000;
    int timeout_ms = 120000, o;
    bool have_version = false;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'b': broker = optarg; break;
        case 'k': key = optarg; break;
        case 'K': broker_key = optarg; break;
        case 'c': component = optarg; break;
        case 'w': weights = optarg; break;
        case 'v':
            if (ctl_parse_u64(optarg, &version)) return ctl_die(CTL_USAGE, "--version: '%s' is not a version", optarg);
            have_version = true;
            break;
        case 't':
            if (ctl_parse_int(optarg, &timeout_ms) || timeout_ms < 1) return ctl_die(CTL_USAGE, "--timeout-ms: '%s'", optarg);
            break;
        case 'd':
            if (ctl_parse_u64(optarg, &deadline)) return ctl_die(CTL_USAGE, "--deadline-ms: '%s'", optarg);
            break;
        default: return ctl_die(CTL_USAGE, "sync: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return ctl_die(CTL_USAGE, "sync: unexpected argument '%s'", argv[optind]);
    if (!weights || !have_version) return ctl_die(CTL_USAGE, "sync needs --version V and --weights W.safetensors");
    char path[PATH_MAX], hex[65];
    if (!realpath(weights, path)) return ctl_die(CTL_USAGE, "--weights %s: no such file", weights);
    st_file_t *f = st_open(path); /* refuse a file the workers could not load */
    if (!f) return ctl_die(CTL_USAGE, "%s", kern_error());
    st_close(&f);
    if (reel_sha256_file(path, hex) != 0) return ctl_die(CTL_FAIL, "%s", kern_error());
    reel_client_t *c = reel_client_new_keys(broker, key, broker_key);
    if (!c) return ctl_die(CTL_FAIL, "%s", kern_error());
    reel_sync_result_t r;
    wire_err_t err;
    int rc = reel_sync(c, component, version, hex, path, deadline, &r, timeout_ms, &err);
    reel_client_destroy(&c);
    if (rc != 0) return ctl_die(CTL_FAIL, "sync: %s: %s", err.code, err.message);
    /* The broker makes a version current once some worker applied it: with
     * nobody in `applied` nothing changed, otherwise the failed workers lag
     * (docs/PROTOCOL.md, "Weight syncs"). */
    const char *state = r.complete ? "complete"
                        : !r.applied[0] ? (r.failed[0] ? "FAILED, no worker applied it (the broker's current version is unchanged)"
                                                       : "FAILED, no live worker (the broker's current version is unchanged)")
                        : "INCOMPLETE (it is current; the failed workers lag until a reconnect or a resend catches them up)";
    fprintf(stderr, "reelctl: sync %s v%" PRIu64 ": %s; applied %s; failed %s\n", component, version, state,
            r.applied[0] ? r.applied : "-", r.failed[0] ? r.failed : "-");
    return r.complete ? CTL_OK : CTL_FAIL;
}

static json_t *versions_json(const msg_versions_t *v) {
    json_t *o = json_object();
    for (int i = 0; o && i < v->n; i++) json_object_set_new(o, v->e[i].name, json_integer((json_int_t)v->e[i].n));
    return o;
}

static json_t *worker_json(const msg_worker_status_t *w) {
    json_t *lag = json_object(), *keys = json_array();
    for (int i = 0; lag && i < w->lagging.n; i++)
        json_object_set_new(lag, w->lagging.e[i].name, json_string(w->lagging.e[i].text));
    for (int i = 0; keys && i < w->n_keys; i++) {
        char hex[17];
        json_array_append_new(keys, json_string(msg_hex64(w->keys[i], hex)));
    }
    return json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:b, s:o, s:o, s:o, s:I}", "name", w->name, "device",
                     w->device, "arch", w->arch, "streams", (json_int_t)w->streams, "inflight",
                     (json_int_t)w->inflight, "max_inflight", (json_int_t)w->max_inflight, "routable",
                     w->routable, "versions", versions_json(&w->versions), "lagging", lag, "keys", keys,
                     "alive_ms", (json_int_t)w->alive_ms);
}

/* STATUS_REPLY as one line of JSON, its fields in wire order. */
static void status_json(const msg_status_reply_t *r, FILE *f) {
    json_t *ws = json_array(), *models = json_array();
    for (size_t i = 0; ws && i < r->n_workers; i++) json_array_append_new(ws, worker_json(&r->workers[i]));
    for (size_t i = 0; models && i < r->n_models; i++) {
        const msg_model_t *m = &r->models[i];
        json_array_append_new(models, json_pack("{s:s, s:I, s:I, s:I, s:I}", "name", m->name, "in_channels",
                                                (json_int_t)m->in_channels, "text_dim", (json_int_t)m->text_dim,
                                                "patch", (json_int_t)m->patch, "layers", (json_int_t)m->layers));
    }
    json_t *o = json_pack("{s:o, s:I, s:I, s:o, s:o, s:I, s:I, s:o}", "workers", ws, "queue", (json_int_t)r->queue,
                          "queue_max", (json_int_t)r->queue_max, "versions", versions_json(&r->versions),
                          "pending", versions_json(&r->pending), "malformed", (json_int_t)r->malformed,
                          "catalog_dropped", (json_int_t)r->catalog_dropped, "models", models);
    if (o) json_dumpf(o, f, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
}

/* The version of `name` in v (0 when absent). */
static uint64_t version_of(const msg_versions_t *v, const char *name, bool *found) {
    for (int i = 0; i < v->n; i++)
        if (!strcmp(v->e[i].name, name)) {
            if (found) *found = true;
            return v->e[i].n;
        }
    if (found) *found = false;
    return 0;
}

static const char *lag_of(const msg_worker_status_t *w, const char *component) {
    for (int i = 0; i < w->lagging.n; i++)
        if (!strcmp(w->lagging.e[i].name, component)) return w->lagging.e[i].text;
    return NULL;
}

static void status_text(const msg_status_reply_t *r, const char *broker) {
    uint64_t v = version_of(&r->versions, "transformer", NULL), pv;
    if (v) printf("broker %s: queue %" PRIu64 "/%" PRIu64 ", transformer v%" PRIu64 "\n", broker, r->queue, r->queue_max, v);
    else printf("broker %s: queue %" PRIu64 "/%" PRIu64 ", transformer: no sync applied yet\n", broker, r->queue, r->queue_max);
    bool pending;
    pv = version_of(&r->pending, "transformer", &pending);
    if (pending) printf("transformer v%" PRIu64 " pending (no worker has applied it yet)\n", pv);
    printf("%-12s %-8s %-11s %-8s %-9s %-8s %-5s %s\n", "WORKER", "DEVICE", "ARCH", "STREAMS", "INFLIGHT", "VERSION",
           "KEYS", "STATE");
    for (size_t i = 0; i < r->n_workers; i++) {
        const msg_worker_status_t *w = &r->workers[i];
        char infs[48];
        snprintf(infs, sizeof infs, "%" PRIu64 "/%" PRIu64, w->inflight, w->max_inflight);
        /* lagging: behind the current version, and why (its error, a
         * missed deadline, a sync on its way) */
        const char *lag = lag_of(w, "transformer");
        printf("%-12s %-8s %-11s %-8" PRIu64 " %-9s v%-7" PRIu64 " %-5d %s%s%s\n", w->name, w->device, w->arch,
               w->streams, infs, version_of(&w->versions, "transformer", NULL), w->n_keys, lag ? "lagging: " : "",
               lag ? lag : w->routable ? "ok" : "", !w->routable ? (lag ? " (unreachable)" : "unreachable") : "");
    }
}

int cmd_status(int argc, char **argv) {
    const char *broker = DEFAULT_BROKER, *key = NULL, *broker_key = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--broker") && i + 1 < argc) broker = argv[++i];
        else if (!strcmp(argv[i], "--key") && i + 1 < argc) key = argv[++i];
        else if (!strcmp(argv[i], "--broker-key") && i + 1 < argc) broker_key = argv[++i];
        else return ctl_die(CTL_USAGE, "status: unknown option '%s'", argv[i]);
    }
    reel_client_t *c = reel_client_new_keys(broker, key, broker_key);
    if (!c) return ctl_die(CTL_FAIL, "%s", kern_error());
    reel_status_t *s = NULL;
    wire_err_t err;
    int rc = reel_status(c, &s, 5000, &err);
    reel_client_destroy(&c);
    if (rc != 0) return ctl_die(CTL_FAIL, "status: %s: %s", err.code, err.message);
    if (json) {
        status_json(reel_status_reply(s), stdout);
        fputc('\n', stdout);
    } else {
        status_text(reel_status_reply(s), broker);
    }
    reel_status_free(&s);
    return CTL_OK;
}
