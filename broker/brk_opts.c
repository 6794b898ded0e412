/* brk_opts.c -- reel-broker's command line: defaults, parsing, usage. */
#include "broker/brk_opts.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: reel-broker [options]\n"
    "  --clients ENDPOINT          client/trainer ROUTER (default tcp://127.0.0.1:5555)\n"
    "  --workers ENDPOINT          worker ROUTER (default tcp://127.0.0.1:5556)\n"
    "  --catalog PATH              SQLite catalog (default reel.db; \"\" = none)\n"
    "  --heartbeat-ms N            heartbeat interval (default 1000)\n"
    "  --liveness N                silent intervals before a worker is dropped (default 3)\n"
    "  --queue-max N               waiting requests before BUSY (default 64)\n"
    "  --max-held-mb N             request tensor bytes held at once before BUSY (default 2048)\n"
    "  --sync-deadline-ms N        default weight-sync barrier deadline (default 30000)\n"
    "  --request-deadline-ms N     default request deadline (default 60000)\n"
    "  --keys DIR                  CURVE on both sockets: peers whose NAME.pub is in DIR, with\n"
    "                              their roles (reelctl keys new); SIGHUP reloads it\n"
    "  --key FILE                  the broker's own key pair (default DIR/broker.key)\n"
    "  --insecure                  serve a non-loopback endpoint without keys (anyone who\n"
    "                              reaches it may run or replace the models)\n"
    "  --weights-dir DIR           keep weights trainers UPLOAD here and serve them to\n"
    "                              workers (FETCH); without it uploads are refused\n"
    "  --metrics ADDR:PORT         serve /metrics (Prometheus), /healthz and /readyz over\n"
    "                              HTTP there (off by default; e.g. 127.0.0.1:9464)\n"
    "  --weights-keep N            uploaded versions kept there: the current one and the\n"
    "                              N-1 before it, and any newer (default 2; 0 = all);\n"
    "                              the last 2 removed stay as DIR/.spare-N for the next\n"
    "                              uploads to write over (removed when one finds the\n"
    "                              disk full)\n"
    "  --catalog-retain DAYS       prune raw catalog rows (requests, captures, evictions)\n"
    "                              older than DAYS (fractions allowed); the summaries\n"
    "                              reports read, versions and the audit trail are kept\n"
    "  --catalog-max-rows N        keep at most about N raw rows per such table (0 = no cap)\n"
    "  -h, --help                  this text\n"
    "Without --keys only loopback (tcp://127.0.0.1, [::1], localhost) and ipc endpoints\n"
    "are served, unless --insecure.\n";

/* Parses a number of days in (0, 36500]. false when s is not one. */
static bool parse_days(const char *s, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v > 0) || v > 36500) return false;
    *out = v;
    return true;
}

/* Parses a decimal in [lo, hi]. false when s is not one. */
static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (!s || !*s || *s == '-') return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static int check(const brk_opts_t *o);

static void defaults(brk_opts_t *o) {
    *o = (brk_opts_t){
        .clients = "tcp://127.0.0.1:5555",
        .workers = "tcp://127.0.0.1:5556",
        .catalog = "reel.db",
        .heartbeat_ms = 1000,
        .liveness = 3,
        .queue_max = 64,
        .sync_deadline_ms = 30000,
        .weights_keep = 2,
        .request_deadline_ms = 60000,
        .max_held_bytes = (uint64_t)2048 << 20,
    };
}

int brk_opts_parse(brk_opts_t *o, int argc, char **argv) {
    defaults(o);
    enum { O_CLIENTS = 256, O_WORKERS, O_CATALOG, O_HB, O_LIVE, O_QMAX, O_SYNC, O_REQ, O_HELD, O_KEYS, O_KEY,
           O_INSECURE, O_WDIR, O_WKEEP, O_METRICS, O_RETAIN, O_MAXROWS };
    static const struct option longs[] = {
        { "clients", required_argument, NULL, O_CLIENTS },
        { "workers", required_argument, NULL, O_WORKERS },
        { "catalog", required_argument, NULL, O_CATALOG },
        { "heartbeat-ms", required_argument, NULL, O_HB },
        { "liveness", required_argument, NULL, O_LIVE },
        { "queue-max", required_argument, NULL, O_QMAX },
        { "sync-deadline-ms", required_argument, NULL, O_SYNC },
        { "request-deadline-ms", required_argument, NULL, O_REQ },
        { "max-held-mb", required_argument, NULL, O_HELD },
        { "keys", required_argument, NULL, O_KEYS },
        { "key", required_argument, NULL, O_KEY },
        { "insecure", no_argument, NULL, O_INSECURE },
        { "weights-dir", required_argument, NULL, O_WDIR },
        { "weights-keep", required_argument, NULL, O_WKEEP },
        { "metrics", required_argument, NULL, O_METRICS },
        { "catalog-retain", required_argument, NULL, O_RETAIN },
        { "catalog-max-rows", required_argument, NULL, O_MAXROWS },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    opterr = 0; /* our own messages, one format */
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
        uint64_t v = 0;
        const char *bad = NULL;
        switch (c) {
        case 'h': fputs(usage, stdout); return 1;
        case O_CLIENTS: o->clients = optarg; break;
        case O_WORKERS: o->workers = optarg; break;
        case O_CATALOG: o->catalog = optarg; break;
        case O_KEYS: o->keys = optarg; break;
        case O_KEY: o->key = optarg; break;
        case O_INSECURE: o->insecure = true; break;
        case O_WDIR: o->weights_dir = optarg; break;
        case O_HB:
            if (parse_u64(optarg, 1, 3600000, &v)) o->heartbeat_ms = (int)v;
            else bad = "--heartbeat-ms";
            break;
        case O_LIVE:
            if (parse_u64(optarg, 1, 1000, &v)) o->liveness = (int)v;
            else bad = "--liveness";
            break;
        case O_QMAX:
            if (parse_u64(optarg, 0, 10000000, &v)) o->queue_max = (int)v;
            else bad = "--queue-max";
            break;
        case O_SYNC:
            if (parse_u64(optarg, 1, UINT32_MAX, &v)) o->sync_deadline_ms = v;
            else bad = "--sync-deadline-ms";
            break;
        case O_REQ:
            if (parse_u64(optarg, 1, UINT32_MAX, &v)) o->request_deadline_ms = v;
            else bad = "--request-deadline-ms";
            break;
        case O_METRICS: o->metrics = optarg; break;
        case O_WKEEP:
            if (parse_u64(optarg, 0, 1000000, &v)) o->weights_keep = (int)v;
            else bad = "--weights-keep";
            break;
        case O_RETAIN:
            if (!parse_days(optarg, &o->catalog_retain_days)) bad = "--catalog-retain";
            break;
        case O_MAXROWS:
            if (parse_u64(optarg, 0, (uint64_t)1 << 40, &v)) o->catalog_max_rows = (int64_t)v;
            else bad = "--catalog-max-rows";
            break;
        case O_HELD:
            if (parse_u64(optarg, 1, (uint64_t)1 << 30, &v)) o->max_held_bytes = v << 20;
            else bad = "--max-held-mb";
            break;
        case ':':
            fprintf(stderr, "reel-broker: option '%s' needs a value (try -h)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "reel-broker: unknown option '%s' (try -h)\n", argv[optind - 1]);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "reel-broker: bad value '%s' for %s (try -h)\n", optarg, bad);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "reel-broker: unexpected argument '%s' (try -h)\n", argv[optind]);
        return 2;
    }
    return check(o);
}

/* The rules across options, after parsing. 0, or 2 with a message. */
static int check(const brk_opts_t *o) {
    if (o->key && !o->keys) {
        fprintf(stderr, "reel-broker: --key needs --keys DIR (the peers it admits)\n");
        return 2;
    }
    if (o->keys && o->insecure) {
        fprintf(stderr, "reel-broker: --keys and --insecure exclude each other\n");
        return 2;
    }
    /* Secure by default: without keys, anyone who reaches a port may run
     * requests, publish weights and pose as a worker. */
    const char *open_ep = !brk_endpoint_local(o->clients) ? o->clients
                        : !brk_endpoint_local(o->workers) ? o->workers : NULL;
    if (open_ep && !o->keys && !o->insecure) {
        fprintf(stderr, "reel-broker: refusing to serve %s without keys: give --keys DIR (reelctl keys new) "
                        "or --insecure\n", open_ep);
        return 2;
    }
    return 0;
}

bool brk_endpoint_local(const char *ep) {
    if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9)) return true;
    if (strncmp(ep, "tcp://", 6)) return false; /* pgm, udp, ws...: never local */
    const char *h = ep + 6;
    if (!strncmp(h, "[::1]:", 6) || !strncmp(h, "localhost:", 10)) return true;
    /* 127.a.b.c: four decimal octets, the first 127, then ':' */
    unsigned a, b, c, d;
    char colon;
    int n = 0;
    return sscanf(h, "%3u.%3u.%3u.%3u%c%n", &a, &b, &c, &d, &colon, &n) == 5 && a == 127 && b < 256 && c < 256 &&
           d < 256 && colon == ':' && n > 0;
}
