/* brk_opts.c -- reel-broker's command line: defaults, parsing, usage. */
#include "broker/brk_opts.h"

#include "broker/brk_catq.h" /* BRK_CATQ_MAX, the default --catalog-queue */

#include "base/error.h"
#include "base/opts.h"
#include "base/parse.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int set_retain(void *dst, const char *v);
static int set_role(void *dst, const char *v);
static int set_held(void *dst, const char *v);
static int set_fetch(void *dst, const char *v);

#define O(f) offsetof(brk_opts_t, f)
/* Every option: its kind, where it goes, its range and its usage line. */
static const reel_opt_t rows[] = {
    { .name = "clients", .kind = REEL_OPT_STRING, .off = O(clients), .arg = "ENDPOINT",
      .help = "client/trainer ROUTER (default tcp://127.0.0.1:5555)" },
    { .name = "workers", .kind = REEL_OPT_STRING, .off = O(workers), .arg = "ENDPOINT",
      .help = "worker ROUTER (default tcp://127.0.0.1:5556)" },
    { .name = "catalog", .kind = REEL_OPT_STRING, .off = O(catalog), .arg = "PATH",
      .help = "SQLite catalog (default reel.db; \"\" = none)" },
    { .name = "heartbeat-ms", .kind = REEL_OPT_INT, .off = O(heartbeat_ms), .lo = 1, .hi = 3600000, .arg = "N",
      .help = "heartbeat interval (default 1000)" },
    { .name = "liveness", .kind = REEL_OPT_INT, .off = O(liveness), .lo = 1, .hi = 1000, .arg = "N",
      .help = "silent intervals before a worker is dropped (default 3)" },
    { .name = "queue-max", .kind = REEL_OPT_INT, .off = O(queue_max), .lo = 0, .hi = 10000000, .arg = "N",
      .help = "waiting requests before BUSY (default 64)" },
    { .name = "max-held-mb", .kind = REEL_OPT_SET, .set = set_held, .expect = "1..1073741824 (MiB)", .arg = "N",
      .help = "request tensor bytes held at once before BUSY; also the most bytes of answers held for "
              "clients whose queue is full (default 2048)" },
    { .name = "max-fetch-mb", .kind = REEL_OPT_SET, .set = set_fetch, .expect = "4..1073741824 (MiB)", .arg = "N",
      .help = "bytes of uploaded weights read for FETCHes and not yet\n"
              "sent, workers and the peer broker together, before busy (default 512)" },
    { .name = "sync-deadline-ms", .kind = REEL_OPT_U64, .off = O(sync_deadline_ms), .ulo = 1, .uhi = UINT32_MAX,
      .arg = "N", .help = "default weight-sync barrier deadline (default 30000)" },
    { .name = "request-deadline-ms", .kind = REEL_OPT_U64, .off = O(request_deadline_ms), .ulo = 1,
      .uhi = UINT32_MAX, .arg = "N", .help = "default request deadline (default 60000)" },
    { .name = "keys", .kind = REEL_OPT_STRING, .off = O(keys), .arg = "DIR",
      .help = "CURVE on both sockets: peers whose NAME.pub is in DIR, with\n"
              "their roles (reelctl keys new); SIGHUP reloads it" },
    { .name = "key", .kind = REEL_OPT_STRING, .off = O(key), .arg = "FILE",
      .help = "the broker's own key pair (default DIR/broker.key)" },
    { .name = "insecure", .kind = REEL_OPT_FLAG, .off = O(insecure),
      .help = "serve a non-loopback endpoint without keys (anyone who\n"
              "reaches it may run or replace the models)" },
    { .name = "peer", .kind = REEL_OPT_STRING, .off = O(peer), .arg = "ENDPOINT",
      .help = "one of a standby pair: the other broker's client\n"
              "endpoint (docs/OPERATIONS.md \"Two brokers\")" },
    { .name = "role", .kind = REEL_OPT_SET, .set = set_role, .expect = "primary or backup", .arg = "ROLE",
      .help = "with --peer: primary (active when both start) or backup" },
    { .name = "peer-timeout-ms", .kind = REEL_OPT_U64, .off = O(peer_timeout_ms), .ulo = 1, .uhi = UINT32_MAX,
      .arg = "N", .help = "with --peer: its silence before a client's request makes\n"
                          "this broker active (default heartbeat x liveness)" },
    { .name = "weights-dir", .kind = REEL_OPT_STRING, .off = O(weights_dir), .arg = "DIR",
      .help = "keep weights trainers UPLOAD here and serve them to\n"
              "workers (FETCH); without it uploads are refused" },
    { .name = "metrics", .kind = REEL_OPT_STRING, .off = O(metrics), .arg = "ADDR:PORT",
      .help = "serve /metrics (Prometheus), /healthz and /readyz over\n"
              "HTTP there (off by default; e.g. 127.0.0.1:9464)" },
    { .name = "weights-keep", .kind = REEL_OPT_INT, .off = O(weights_keep), .lo = 0, .hi = 1000000, .arg = "N",
      .help = "uploaded versions kept there: the current one and the\n"
              "N-1 before it, and any newer (default 2; 0 = all);\n"
              "the last 2 removed stay as DIR/.spare-N for the next\n"
              "uploads to write over (removed when one finds the\n"
              "disk full)" },
    { .name = "catalog-retain", .kind = REEL_OPT_SET, .set = set_retain, .expect = "days in (0, 36500]",
      .arg = "DAYS",
      .help = "prune raw catalog rows (requests, captures, evictions)\n"
              "older than DAYS (fractions allowed); the summaries\n"
              "reports read, versions and the audit trail are kept" },
    { .name = "catalog-max-rows", .kind = REEL_OPT_I64, .off = O(catalog_max_rows), .lo = 0,
      .hi = (long long)1 << 40, .arg = "N", .help = "keep at most about N raw rows per such table (0 = no cap)" },
    { .name = "catalog-queue", .kind = REEL_OPT_I64, .off = O(catalog_queue), .lo = 16, .hi = 10000000, .arg = "N",
      .help = "records waiting for the catalog writer at most (default\n"
              "100000): past N requests are answered busy; a worker's\n"
              "events past N/4 waiting are shed and counted" },
    { .name = "help", .short_name = 'h', .kind = REEL_OPT_HELP, .help = "this text" },
};
#undef O

#define NROWS (sizeof rows / sizeof rows[0])

/* A number of days in (0, 36500]. -1: the row's expect gives the message
 * (base/opts.h). */
static int set_retain(void *dst, const char *s) {
    double v;
    if (reel_parse_f64(s, 0, 36500, "--catalog-retain", &v) != 0 || !(v > 0)) return -1;
    ((brk_opts_t *)dst)->catalog_retain_days = v;
    return 0;
}

/* MiB in [1, 2^30], kept as bytes. -1 as above. */
static int set_held(void *dst, const char *s) {
    uint64_t v;
    if (reel_parse_u64(s, 1, 1ull << 30, "--max-held-mb", &v) != 0) return -1;
    ((brk_opts_t *)dst)->max_held_bytes = v << 20;
    return 0;
}

/* MiB in [4, 2^30], kept as bytes: one answer (a chunk, 4 MiB at most)
 * always fits. -1 as above. */
static int set_fetch(void *dst, const char *s) {
    uint64_t v;
    if (reel_parse_u64(s, 4, 1ull << 30, "--max-fetch-mb", &v) != 0) return -1;
    ((brk_opts_t *)dst)->max_fetch_bytes = v << 20;
    return 0;
}

static int check(const brk_opts_t *o);

static int set_role(void *dst, const char *v) {
    brk_opts_t *o = dst;
    if (!strcmp(v, "primary")) o->primary = true;
    else if (!strcmp(v, "backup")) o->primary = false;
    else return reel_fail(REEL_E_INVALID, "--role must be primary or backup, not '%s'", v);
    o->role_given = true;
    return 0;
}

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
        .max_fetch_bytes = (uint64_t)512 << 20,
        .catalog_queue = BRK_CATQ_MAX,
    };
}

const char *brk_usage(void) {
    static char text[4096];
    if (!text[0]) {
        char buf[sizeof text] = "usage: reel-broker [options]\n";
        reel_opts_usage(rows, NROWS, 30, buf, sizeof buf);
        size_t k = strlen(buf); /* what fitted */
        snprintf(buf + k, sizeof buf - k, "%s",
                 "Without --keys only loopback (tcp://127.0.0.1, [::1], localhost) and ipc endpoints\n"
                 "are served, unless --insecure.\n");
        memcpy(text, buf, sizeof text);
    }
    return text;
}

int brk_opts_parse(brk_opts_t *o, int argc, char **argv) {
    defaults(o);
    int rest = argc;
    int rc = reel_opts_parse(rows, NROWS, o, argc, argv, &rest);
    if (rc == 1) return 1;
    /* a mistake in the syntax: the usage says how it goes */
    if (rc != 0) return reel_fail(reel_err_code(), "%s (try -h)", reel_err()->msg);
    if (rest < argc) return reel_fail(REEL_E_INVALID, "unexpected argument '%s' (try -h)", argv[rest]);
    return check(o);
}

/* The rules across options, after parsing. 0, or -1 with an invalid error. */
static int check(const brk_opts_t *o) {
    if (o->key && !o->keys) return reel_fail(REEL_E_INVALID, "--key needs --keys DIR (the peers it admits)");
    if (o->keys && o->insecure) return reel_fail(REEL_E_INVALID, "--keys and --insecure exclude each other");
    if (!o->peer && (o->role_given || o->peer_timeout_ms))
        return reel_fail(REEL_E_INVALID, "--role and --peer-timeout-ms need --peer ENDPOINT");
    if (o->peer && o->peer_timeout_ms && o->peer_timeout_ms < 2 * (uint64_t)o->heartbeat_ms)
        return reel_fail(REEL_E_INVALID, "--peer-timeout-ms %llu is under two heartbeats (%d ms): a live peer "
                                         "would look silent between its PEERs",
                         (unsigned long long)o->peer_timeout_ms, o->heartbeat_ms);
    if (o->peer && !o->role_given)
        return reel_fail(REEL_E_INVALID, "--peer needs --role primary or --role backup (one of each in a pair)");
    /* Secure by default: without keys, anyone who reaches a port may run
     * requests, publish weights and pose as a worker. */
    const char *open_ep = !brk_endpoint_local(o->clients) ? o->clients
                        : !brk_endpoint_local(o->workers) ? o->workers : NULL;
    if (open_ep && !o->keys && !o->insecure)
        return reel_fail(REEL_E_INVALID,
                         "refusing to serve %s without keys: give --keys DIR (reelctl keys new) or --insecure",
                         open_ep);
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
