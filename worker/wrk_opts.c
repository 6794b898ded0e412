/* wrk_opts.c -- reel-worker's command line (see wrk_opts.h). Every value is
 * range-checked here; a bad one is a usage error (exit 2), never a clamp. */
#include "worker/wrk_opts.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema/msg.h"

static const char usage[] =
    "usage: reel-worker --name NAME --weights W.safetensors [options]\n"
    "  --broker ENDPOINT     broker worker endpoint (tcp://127.0.0.1:5556)\n"
    "  --name NAME           worker name and ZeroMQ routing id ([A-Za-z0-9_.:+-], <= 63)\n"
    "  --weights FILE        transformer weights (safetensors)\n"
    "  --weights-version V   version of those weights (1)\n"
    "  --backend cpu|cuda    (cpu; an unusable CUDA device falls back to the CPU)\n"
    "  --no-fallback         with --backend cuda: an unusable CUDA device is an error (exit 1)\n"
    "  --device N            CUDA device ordinal (0)\n"
    "  --dtype f32|bf16      storage of weights and activations (f32; bf16 on CUDA only)\n"
    "  --streams S           stream threads (2)\n"
    "  --budget BYTES        graph + workspace budget, K/M/G suffixes (0 = unlimited)\n"
    "  --max-tokens N        refuse (too_large) a request whose sample has more than N\n"
    "                        tokens, F x H/2 x W/2 (65536; 0 = no limit): a step cannot\n"
    "                        be stopped half-way, and attention costs N^2\n"
    "  --max-inflight K      requests the broker may route here at once (4*S)\n"
    "  --policy evict|inplace  weight sync policy for captured graphs (evict)\n"
    "  --sync-mode steps|drain  apply a sync between any two steps (steps), or only\n"
    "                        once no request is mid-way, holding new ones (drain:\n"
    "                        every request runs on one weight version)\n"
    "  --warmup W            eager calls before a key is captured (2)\n"
    "  --audit-every N       also run eager on 1 replay in N per graph and compare\n"
    "                        bitwise; a mismatch evicts the graph (256; 0 = off)\n"
    "  --heartbeat-ms MS     heartbeat interval (1000)\n"
    "  --liveness N          silent intervals before reconnecting (3)\n"
    "  --events-ms MS        EVENTS batching interval (200)\n"
    "  --metrics ADDR:PORT   serve /metrics (Prometheus), /healthz and /readyz over HTTP\n"
    "                        there (off by default; e.g. 127.0.0.1:9465)\n"
    "  --weights-dir DIR     a directory a SYNC's weights may be read from (repeat for\n"
    "                        more, at most 8; default: the directory of --weights).\n"
    "                        Paths must lie below one, reached without symlinks or '..'\n"
    "  --key FILE            this worker's CURVE key pair, NAME.key (else $REEL_KEY)\n"
    "  --broker-key FILE     the broker's public key, broker.pub (else $REEL_BROKER_KEY)\n"
    "  --artifacts DIR       kernel bundles: each verified (a corrupt one is reported and\n"
    "                        never loaded), enabled ones promoted per kernel key only\n"
    "                        after a parity gate on live inputs (docs/ARTIFACTS.md)\n"
    "  --artifacts-enable ID,ID  the allowlist (default: every verified bundle); an id\n"
    "                        no verified bundle provides stops the start\n"
    "  --artifact-timing off|sync|shadow  measure artifacts against native (off)\n";

const char *wrk_usage(void) { return usage; }

static int usage_error(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int usage_error(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* A whole decimal integer in [lo, hi]; -1 on junk or out of range. */
static int parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int wrk_parse_bytes(const char *s, size_t *out) {
    if (!s || !isdigit((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return -1;
    unsigned shift = 0;
    switch (tolower((unsigned char)*end)) {
    case 'k': shift = 10; end++; break;
    case 'm': shift = 20; end++; break;
    case 'g': shift = 30; end++; break;
    case 't': shift = 40; end++; break;
    default: break;
    }
    if (shift && (!strcmp(end, "iB") || !strcmp(end, "ib"))) end += 2;
    else if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    if (shift && v > (SIZE_MAX >> shift)) return -1;
    if (v > SIZE_MAX) return -1;
    *out = (size_t)v << shift;
    return 0;
}

int wrk_opts_parse(int argc, char **argv, wrk_opts_t *o, char *err, size_t errlen) {
    enum { O_BROKER = 1, O_NAME, O_WEIGHTS, O_WVER, O_BACKEND, O_DEVICE, O_STREAMS, O_BUDGET,
           O_INFLIGHT, O_POLICY, O_WARMUP, O_HB, O_LIVENESS, O_EVENTS, O_METRICS, O_HELP, O_SYNCMODE, O_DTYPE,
           O_AUDIT, O_WDIR, O_KEY, O_BKEY, O_ART, O_ARTEN, O_ARTTIME, O_NOFALLBACK, O_MAXTOK };
    static const struct option opts[] = {
        { "broker", required_argument, 0, O_BROKER },
        { "name", required_argument, 0, O_NAME },
        { "weights", required_argument, 0, O_WEIGHTS },
        { "weights-version", required_argument, 0, O_WVER },
        { "backend", required_argument, 0, O_BACKEND },
        { "no-fallback", no_argument, 0, O_NOFALLBACK },
        { "device", required_argument, 0, O_DEVICE },
        { "streams", required_argument, 0, O_STREAMS },
        { "budget", required_argument, 0, O_BUDGET },
        { "max-tokens", required_argument, 0, O_MAXTOK },
        { "max-inflight", required_argument, 0, O_INFLIGHT },
        { "policy", required_argument, 0, O_POLICY },
        { "sync-mode", required_argument, 0, O_SYNCMODE },
        { "dtype", required_argument, 0, O_DTYPE },
        { "warmup", required_argument, 0, O_WARMUP },
        { "audit-every", required_argument, 0, O_AUDIT },
        { "heartbeat-ms", required_argument, 0, O_HB },
        { "liveness", required_argument, 0, O_LIVENESS },
        { "events-ms", required_argument, 0, O_EVENTS },
        { "metrics", required_argument, 0, O_METRICS },
        { "weights-dir", required_argument, 0, O_WDIR },
        { "key", required_argument, 0, O_KEY },
        { "broker-key", required_argument, 0, O_BKEY },
        { "artifacts", required_argument, 0, O_ART },
        { "artifacts-enable", required_argument, 0, O_ARTEN },
        { "artifact-timing", required_argument, 0, O_ARTTIME },
        { "help", no_argument, 0, O_HELP },
        { 0, 0, 0, 0 },
    };
    memset(o, 0, sizeof *o);
    o->broker = "tcp://127.0.0.1:5556";
    o->weights_version = 1;
    o->backend = KERN_BACKEND_CPU;
    o->streams = 2;
    o->max_tokens = WRK_MAX_TOKENS;
    o->max_inflight = -1;
    o->policy = CAP_POLICY_EVICT;
    o->warmup = 2;
    o->audit_every = 256;
    o->heartbeat_ms = 1000;
    o->liveness = 3;
    o->events_ms = 200;

    long long v;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case O_BROKER: o->broker = a; break;
        case O_NAME: o->name = a; break;
        case O_WEIGHTS: o->weights = a; break;
        case O_HELP: o->help = true; break;
        case O_KEY: o->key = a; break;
        case O_BKEY: o->broker_key = a; break;
        case O_ART: o->artifacts = a; break;
        case O_ARTEN: o->artifacts_enable = a; break;
        case O_ARTTIME:
            if (kern_art_timing_parse(a, &o->artifact_timing))
                return usage_error(err, errlen, "--artifact-timing: expected off, sync or shadow, got '%s'", a);
            break;
        case O_WDIR:
            if (o->n_weights_dirs >= (int)(sizeof o->weights_dirs / sizeof o->weights_dirs[0]))
                return usage_error(err, errlen, "--weights-dir: at most %d directories",
                                   (int)(sizeof o->weights_dirs / sizeof o->weights_dirs[0]));
            if (a[0] != '/') return usage_error(err, errlen, "--weights-dir: '%s' must be an absolute path", a);
            o->weights_dirs[o->n_weights_dirs++] = a;
            break;
        case O_WVER:
            if (parse_int(a, 1, INT64_MAX, &v)) return usage_error(err, errlen, "--weights-version: expected an integer >= 1, got '%s'", a);
            o->weights_version = (uint64_t)v;
            break;
        case O_BACKEND:
            if (kern_backend_kind_parse(a, &o->backend) != 0)
                return usage_error(err, errlen, "--backend: expected cpu or cuda, got '%s'", a);
            break;
        case O_NOFALLBACK: o->no_fallback = true; break;
        case O_DEVICE:
            if (parse_int(a, 0, 1023, &v)) return usage_error(err, errlen, "--device: expected 0..1023, got '%s'", a);
            o->device = (int)v;
            break;
        case O_STREAMS:
            if (parse_int(a, 1, WRK_MAX_STREAMS, &v))
                return usage_error(err, errlen, "--streams: expected 1..%d, got '%s'", WRK_MAX_STREAMS, a);
            o->streams = (int)v;
            break;
        case O_MAXTOK:
            if (parse_int(a, 0, (long long)1 << 24, &v))
                return usage_error(err, errlen, "--max-tokens: expected 0..16777216, got '%s'", a);
            o->max_tokens = (int64_t)v;
            break;
        case O_BUDGET:
            if (wrk_parse_bytes(a, &o->budget))
                return usage_error(err, errlen, "--budget: expected bytes with an optional K/M/G suffix, got '%s'", a);
            break;
        case O_INFLIGHT:
            if (parse_int(a, 1, 4096, &v)) return usage_error(err, errlen, "--max-inflight: expected 1..4096, got '%s'", a);
            o->max_inflight = (int)v;
            break;
        case O_POLICY:
            if (cap_policy_parse(a, &o->policy) != 0)
                return usage_error(err, errlen, "--policy: expected evict or inplace, got '%s'", a);
            break;
        case O_DTYPE:
            if (!strcmp(a, "f32")) o->bf16 = false;
            else if (!strcmp(a, "bf16")) o->bf16 = true;
            else return usage_error(err, errlen, "--dtype: expected f32 or bf16, got '%s'", a);
            break;
        case O_SYNCMODE:
            if (!strcmp(a, "steps")) o->sync_drain = false;
            else if (!strcmp(a, "drain")) o->sync_drain = true;
            else return usage_error(err, errlen, "--sync-mode: expected steps or drain, got '%s'", a);
            break;
        case O_WARMUP:
            if (parse_int(a, 0, 1000, &v)) return usage_error(err, errlen, "--warmup: expected 0..1000, got '%s'", a);
            o->warmup = (int)v;
            break;
        case O_AUDIT:
            if (parse_int(a, 0, 1000000000, &v))
                return usage_error(err, errlen, "--audit-every: expected 0..1000000000, got '%s'", a);
            o->audit_every = (int)v;
            break;
        case O_HB:
            if (parse_int(a, 10, 3600000, &v)) return usage_error(err, errlen, "--heartbeat-ms: expected 10..3600000, got '%s'", a);
            o->heartbeat_ms = (int)v;
            break;
        case O_LIVENESS:
            if (parse_int(a, 1, 1000, &v)) return usage_error(err, errlen, "--liveness: expected 1..1000, got '%s'", a);
            o->liveness = (int)v;
            break;
        case O_METRICS: o->metrics = a; break;
        case O_EVENTS:
            if (parse_int(a, 10, 3600000, &v)) return usage_error(err, errlen, "--events-ms: expected 10..3600000, got '%s'", a);
            o->events_ms = (int)v;
            break;
        default:
            return usage_error(err, errlen, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (o->help) return 0;
    if (optind < argc) return usage_error(err, errlen, "unexpected argument '%s'", argv[optind]);
    if (!o->name) return usage_error(err, errlen, "--name NAME is required");
    if (!reel_name_valid(o->name, WRK_NAME_MAX))
        return usage_error(err, errlen, "--name: '%s' must be 1..%d characters of [A-Za-z0-9_.:+-]", o->name, WRK_NAME_MAX - 1);
    if (!o->weights) return usage_error(err, errlen, "--weights W.safetensors is required");
    if (o->artifacts_enable && !o->artifacts)
        return usage_error(err, errlen, "--artifacts-enable needs --artifacts DIR");
    if (o->no_fallback && o->backend != KERN_BACKEND_CUDA)
        return usage_error(err, errlen, "--no-fallback is for --backend cuda");
    if (o->max_inflight < 0) o->max_inflight = 4 * o->streams;
    return 0;
}
