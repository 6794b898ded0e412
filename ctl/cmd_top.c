/* cmd_top.c -- `reelctl top`: a live view of the cluster for the operator
 * at the terminal (issue 13, part 6): the broker's queue, versions,
 * requests and the graph hit rate over the last interval and since the
 * broker started, and every worker (state, in flight, version, lag), from
 * one STATUS per interval. On a terminal it redraws in place; piped, it
 * prints plain lines, one block per interval with its time, no escape
 * codes. --count N stops after N views (0: until interrupted). Exit 1
 * (CTL_NO) when the broker did not answer the last view. */
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "base/error.h"
#include "base/parse.h"
#include "clients/c/client.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int s) { (void)s; g_stop = 1; }

/* replayed / all steps, as a percentage string ("-" with none). */
static const char *rate(uint64_t replayed, uint64_t all, char *buf, size_t len) {
    if (!all) snprintf(buf, len, "-");
    else snprintf(buf, len, "%.1f%%", 100.0 * (double)replayed / (double)all);
    return buf;
}

typedef struct {
    bool have;
    uint64_t ok, failed, replayed, all;
    double t;
} sample_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Network text for the terminal: control bytes (escape sequences) as '?'. */
static const char *clean(const char *in, char *out, size_t len) {
    size_t i = 0;
    for (; in && in[i] && i + 1 < len; i++) out[i] = (unsigned char)in[i] < 0x20 || in[i] == 0x7f ? '?' : in[i];
    out[len ? i : 0] = '\0';
    return out;
}

static void view(FILE *o, const char *broker, const msg_status_reply_t *r, sample_t *prev, bool tty) {
    char when[32], hr1[16], hr2[16];
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(when, sizeof when, "%H:%M:%S", &tm);
    uint64_t all = r->steps_replayed + r->steps_eager + r->steps_captured;
    sample_t cur = { true, r->requests_ok, r->requests_failed, r->steps_replayed, all, now_s() };
    /* A restarted broker counts from zero again: no rate across that. */
    if (prev->have && (cur.ok < prev->ok || cur.failed < prev->failed || cur.replayed < prev->replayed ||
                       cur.all < prev->all))
        prev->have = false;
    double dt = prev->have ? cur.t - prev->t : 0;
    if (tty) fputs("\033[H\033[2J", o); /* home, clear: redraw in place */
    fprintf(o, "reelctl top  %s  broker %s\n", when, broker);
    uint64_t v = ctl_version_of(&r->versions, "transformer", NULL), pv = ctl_version_of(&r->pending, "transformer", NULL);
    fprintf(o, "queue %" PRIu64 "/%" PRIu64 "   transformer v%" PRIu64 "%s", r->queue, r->queue_max, v,
            v ? "" : " (no sync applied yet)");
    if (pv) fprintf(o, "   v%" PRIu64 " pending", pv);
    fputc('\n', o);
    if (prev->have && dt > 0) {
        fprintf(o, "requests %.1f/s ok, %.1f/s failed   hit rate %s (last %.1f s), %s since start\n",
                (double)(cur.ok - prev->ok) / dt, (double)(cur.failed - prev->failed) / dt,
                rate(cur.replayed - prev->replayed, cur.all - prev->all, hr1, sizeof hr1), dt,
                rate(cur.replayed, cur.all, hr2, sizeof hr2));
    } else {
        fprintf(o, "requests %" PRIu64 " ok, %" PRIu64 " failed since start   hit rate %s since start\n", cur.ok,
                cur.failed, rate(cur.replayed, cur.all, hr2, sizeof hr2));
    }
    if (r->malformed || r->undelivered || r->auth_refused || r->catalog_dropped || r->catalog_failures)
        fprintf(o, "dropped: %" PRIu64 " malformed, %" PRIu64 " undelivered, %" PRIu64 " refused handshakes (%" PRIu64
                " peers), %" PRIu64 " catalog events shed, %" PRIu64 " catalog writes failed\n", r->malformed,
                r->undelivered, r->auth_refused, r->auth_refused_peers, r->catalog_dropped, r->catalog_failures);
    fprintf(o, "%-16s %-8s %-9s %-8s %-7s %s\n", "WORKER", "DEVICE", "INFLIGHT", "VERSION", "KEYS", "STATE");
    for (size_t i = 0; i < r->n_workers; i++) {
        const msg_worker_status_t *w = &r->workers[i];
        char inf[32];
        snprintf(inf, sizeof inf, "%" PRIu64 "/%" PRIu64, w->inflight, w->max_inflight);
        const char *lag = ctl_lag_of(w, "transformer");
        char dev[64], lagc[256];
        if (lag) lag = clean(lag, lagc, sizeof lagc);
        fprintf(o, "%-16s %-8s %-9s v%-7" PRIu64 " %-7d %s%s%s\n", w->name, clean(w->device, dev, sizeof dev), inf,
                ctl_version_of(&w->versions, "transformer", NULL), w->n_keys, lag ? "lagging: " : "",
                lag ? lag : (w->routable ? "ok" : ""), w->routable ? "" : (lag ? " (unreachable)" : "unreachable"));
    }
    if (!r->n_workers) fprintf(o, "(no worker registered)\n");
    if (!tty) fputc('\n', o);
    fflush(o);
    *prev = cur;
}

int cmd_top(int argc, char **argv) {
    static const struct option opts[] = {
        { "broker", required_argument, 0, 'b' }, { "interval-ms", required_argument, 0, 'i' },
        { "count", required_argument, 0, 'n' }, { "key", required_argument, 0, 'k' },
        { "broker-key", required_argument, 0, 'K' }, { 0, 0, 0, 0 },
    };
    const char *broker = DEFAULT_BROKER, *key = NULL, *broker_key = NULL;
    int interval = 1000, count = 0, o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'b': broker = optarg; break;
        case 'k': key = optarg; break;
        case 'K': broker_key = optarg; break;
        case 'i':
            if (reel_parse_int(optarg, 100, 3600000, "--interval-ms", &interval)) return -1;
            break;
        case 'n':
            if (reel_parse_int(optarg, 0, INT_MAX, "--count", &count)) return -1;
            break;
        default: return ctl_fail_usage("top", "top: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "top: unexpected argument '%s'", argv[optind]);
    reel_client_t *c = reel_client_new_keys(broker, key, broker_key);
    if (!c) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    bool tty = isatty(STDOUT_FILENO);
    sample_t prev = { 0 };
    int rc = 0;
    for (int n = 0; !g_stop && (count == 0 || n < count); n++) {
        if (n) {
            struct timespec ts = { interval / 1000, (long)(interval % 1000) * 1000000L };
            while (nanosleep(&ts, &ts) != 0 && !g_stop) { /* resumed after a signal that did not stop us */ }
            if (g_stop) break;
        }
        reel_status_t *s = NULL;
        wire_err_t err;
        if (reel_status(c, &s, interval > 5000 ? interval : 5000, &err) != 0) {
            /* the broker may come back: say so and keep watching */
            char msg[sizeof err.message], when[32];
            time_t t = time(NULL);
            struct tm tm;
            localtime_r(&t, &tm);
            strftime(when, sizeof when, "%H:%M:%S", &tm); /* each block has its time, this one too */
            fprintf(stdout, "%sreelctl top  %s  broker %s: %s: %s\n", tty ? "\033[H\033[2J" : "", when, broker,
                    err.code, clean(err.message, msg, sizeof msg));
            fflush(stdout);
            prev.have = false;
            rc = CTL_NO;
            continue;
        }
        rc = 0;
        view(stdout, broker, reel_status_reply(s), &prev, tty);
        reel_status_free(&s);
    }
    reel_client_destroy(&c);
    return rc;
}
