/* report_html.c -- `reelctl report --html OUT.html` (issue 13, part 4): one
 * self-contained HTML file drawn from the catalog (cat_query_report): no
 * script, no stylesheet or font fetched, the charts inline SVG drawn here.
 *   1. graph hit rate and requests over time, each weight sync a marked line;
 *   2. captures and evictions between each sync and the next;
 *   3. declines by reason;
 *   4. per-worker and per-key tables, and the slowest requests with their
 *      step breakdown (captured, replayed, eager).
 * Every string from the catalog (key texts, names, reasons: they came over
 * the network) is HTML-escaped. */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "base/error.h"
#include "base/parse.h"
#include "catalog/catalog.h"
#include "catalog/catalog_query.h"
#include "ctl/report.h"

static void esc(FILE *o, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", o); break;
        case '<': fputs("&lt;", o); break;
        case '>': fputs("&gt;", o); break;
        case '"': fputs("&quot;", o); break;
        case '\'': fputs("&#39;", o); break;
        default: fputc(*s, o);
        }
    }
}

static const char *str(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}
static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

static void clock_text(double t, char *buf, size_t len) {
    struct tm tm;
    time_t s = isfinite(t) && t > -1e12 && t < 1e12 ? (time_t)t : 0;
    if (!isfinite(t) || t <= -1e12 || t >= 1e12 || !gmtime_r(&s, &tm) ||
        !strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tm))
        snprintf(buf, len, "?");
}

#define W 860
#define H 240
#define PAD 48

/* Chart 1: hit rate (line, left axis 0..100%) and requests (bars) per
 * bucket, each sync a dashed vertical line labelled with its version. */
static void chart_timeline(FILE *o, json_t *r) {
    json_t *tl = json_object_get(r, "timeline"), *syncs = json_object_get(r, "syncs");
    int nb = (int)json_integer_value(json_object_get(r, "buckets"));
    double t0 = num(r, "t0"), bw = num(r, "bucket_seconds");
    double maxreq = 1;
    size_t i;
    json_t *b;
    json_array_foreach(tl, i, b) if (num(b, "requests") > maxreq) maxreq = num(b, "requests");
    double cw = (double)(W - 2 * PAD) / (nb > 0 ? nb : 1);
    fprintf(o, "<svg class=\"chart\" id=\"timeline\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\" "
               "aria-label=\"graph hit rate and requests over time\">\n", W, H, W, H);
    fprintf(o, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"axis\"/>\n", PAD, H - PAD, W - PAD, H - PAD);
    fprintf(o, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"axis\"/>\n", PAD, PAD / 2, PAD, H - PAD);
    for (int p = 0; p <= 100; p += 50) {
        double y = H - PAD - (H - 1.5 * PAD) * p / 100.0;
        fprintf(o, "<text x=\"%d\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%d%%</text>\n", PAD - 4, y + 4, p);
    }
    json_array_foreach(tl, i, b) {
        double x = PAD + cw * num(b, "bucket"), h = (H - 1.5 * PAD) * num(b, "requests") / maxreq;
        fprintf(o, "<rect class=\"req\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>%.0f requests"
                   "</title></rect>\n", x + 1, H - PAD - h, cw > 2 ? cw - 2 : cw, h, num(b, "requests"));
    }
    fputs("<polyline class=\"hit\" points=\"", o);
    json_array_foreach(tl, i, b) {
        double steps = num(b, "steps");
        if (steps <= 0) continue;
        double x = PAD + cw * (num(b, "bucket") + 0.5), y = H - PAD - (H - 1.5 * PAD) * num(b, "replayed") / steps;
        fprintf(o, "%.1f,%.1f ", x, y);
    }
    fputs("\"/>\n", o);
    json_array_foreach(syncs, i, b) {
        double x = PAD + (bw > 0 ? (num(b, "t") - t0) / bw * cw : 0);
        if (x < PAD) x = PAD;
        if (x > W - PAD) x = W - PAD;
        fprintf(o, "<line class=\"sync\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
                   "<text class=\"synclabel\" x=\"%.1f\" y=\"%d\">", x, PAD / 2, x, H - PAD, x + 3, PAD / 2 + 10);
        esc(o, str(b, "component"));
        fprintf(o, " v%" PRId64 "</text>\n", (int64_t)num(b, "version"));
    }
    char a[48], z[48];
    clock_text(t0, a, sizeof a);
    clock_text(num(r, "t1"), z, sizeof z);
    fprintf(o, "<text x=\"%d\" y=\"%d\" class=\"tick\">%s</text><text x=\"%d\" y=\"%d\" class=\"tick\" "
               "text-anchor=\"end\">%s</text>\n", PAD, H - PAD + 18, a, W - PAD, H - PAD + 18, z);
    fprintf(o, "<text x=\"%d\" y=\"%d\" class=\"legend\"><tspan class=\"hitl\">&#9472; hit rate (replayed / all "
               "steps)</tspan>  <tspan class=\"reql\">&#9632; requests (max %.0f per bucket)</tspan>  "
               "<tspan class=\"syncl\">&#9474; weight sync</tspan></text>\n", PAD, H - 8, maxreq);
    fputs("</svg>\n", o);
}

/* A horizontal bar chart of (label, values...) rows. */
static void chart_bars(FILE *o, const char *id, const char *aria, json_t *rows, const char *label_key,
                       const char *const *keys, const char *const *classes, int nk, bool version_label) {
    size_t n = json_array_size(rows);
    double max = 1;
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) for (int k = 0; k < nk; k++) if (num(r, keys[k]) > max) max = num(r, keys[k]);
    int row_h = 14 * nk + 8, h = (int)(n ? n : 1) * row_h + 30;
    fprintf(o, "<svg class=\"chart\" id=\"%s\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\" "
               "aria-label=\"%s\">\n", id, W, h, W, h, aria);
    json_array_foreach(rows, i, r) {
        int y = (int)i * row_h + 10;
        fprintf(o, "<text x=\"200\" y=\"%d\" class=\"tick\" text-anchor=\"end\">", y + 11);
        if (version_label) {
            esc(o, str(r, "component"));
            if (num(r, "version") > 0) fprintf(o, " v%" PRId64, (int64_t)num(r, "version"));
        } else {
            esc(o, str(r, label_key));
        }
        fputs("</text>\n", o);
        for (int k = 0; k < nk; k++) {
            double v = num(r, keys[k]) > 0 ? num(r, keys[k]) : 0, w = (W - 280) * v / max;
            fprintf(o, "<rect class=\"%s\" x=\"208\" y=\"%d\" width=\"%.1f\" height=\"12\"/><text x=\"%.1f\" y=\"%d\" "
                       "class=\"tick\">%.0f%s%s</text>\n", classes[k], y + 14 * k, w, 212 + w, y + 14 * k + 10, v,
                    nk > 1 ? " " : "", nk > 1 ? keys[k] : "");
        }
    }
    if (!n) fprintf(o, "<text x=\"208\" y=\"24\" class=\"tick\">(none)</text>\n");
    fputs("</svg>\n", o);
}

/* Where the workers' time went: the loops, encoding prompts, decoding
 * outputs (seconds and shares); nothing when no request took any. */
static void time_split(FILE *o, const json_t *t) {
    double loop = json_number_value(json_object_get(t, "loop_seconds")),
           enc = json_number_value(json_object_get(t, "encode_seconds")),
           dec = json_number_value(json_object_get(t, "decode_seconds")), all = loop + enc + dec;
    if (!(all > 0)) return;
    fprintf(o, "<h2>Where the workers' time went</h2>\n<p>Denoising loops of the requests that ended ok (a failed "
               "request's time is the broker's wait for it, not a worker's).</p>\n"
               "<table><tr><th>denoising loops</th><th>encoding prompts"
               "</th><th>decoding outputs</th></tr>\n<tr><td>%.3f s (%.1f%%)</td><td>%.3f s (%.1f%%)</td>"
               "<td>%.3f s (%.1f%%)</td></tr></table>\n",
            loop, 100 * loop / all, enc, 100 * enc / all, dec, 100 * dec / all);
}

static void table(FILE *o, json_t *rows, const char *const *cols, const char *const *heads, int n) {
    fputs("<table><tr>", o);
    for (int k = 0; k < n; k++) fprintf(o, "<th>%s</th>", heads[k]);
    fputs("</tr>\n", o);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        fputs("<tr>", o);
        for (int k = 0; k < n; k++) {
            json_t *v = json_object_get(r, cols[k]);
            fputs("<td>", o);
            if (json_is_string(v)) esc(o, json_string_value(v));
            else if (json_is_integer(v)) fprintf(o, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
            else if (json_is_real(v)) {
                double d = json_real_value(v);
                if (!strcmp(cols[k], "t") || !strcmp(cols[k], "last_seen") || !strcmp(cols[k], "first_seen")) {
                    char buf[48];
                    clock_text(d, buf, sizeof buf);
                    fputs(buf, o);
                } else {
                    fprintf(o, "%.3f", d);
                }
            } else if (json_is_object(v)) {
                const char *key;
                json_t *x;
                json_object_foreach(v, key, x) {
                    esc(o, key);
                    fprintf(o, "=%" JSON_INTEGER_FORMAT " ", json_integer_value(x));
                }
            } else if (json_is_array(v)) {
                fprintf(o, "%zu", json_array_size(v));
            }
            fputs("</td>", o);
        }
        fputs("</tr>\n", o);
    }
    fputs("</table>\n", o);
}

int ctl_report_html(cat_t *c, double since, FILE *o) {
    json_t *r = cat_query_report(c, since);
    if (!r) return -1;
    json_t *st = json_object_get(json_object_get(r, "stats"), "overall");
    /* the requests of the range (--since), from the timeline */
    double steps = 0, rep = 0, reqs = 0;
    size_t bi;
    json_t *bk;
    json_array_foreach(json_object_get(r, "timeline"), bi, bk) {
        steps += num(bk, "steps");
        rep += num(bk, "replayed");
        reqs += num(bk, "requests");
    }
    char made[48];
    clock_text((double)time(NULL), made, sizeof made);
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
          "<meta name=\"viewport\" content=\"width=device-width\">\n<title>Reel capture report</title>\n"
          "<style>\nbody{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:940px}\n"
          "h1{font-size:20px}h2{font-size:16px;margin-top:28px}\n"
          ".axis{stroke:#888}.tick{font-size:11px;fill:#444}.legend{font-size:12px}\n"
          ".req{fill:#cfe0f3}.hit{fill:none;stroke:#1b6ac9;stroke-width:2}.hitl{fill:#1b6ac9}.reql{fill:#6c94c2}\n"
          ".sync{stroke:#d9822b;stroke-dasharray:4 3;stroke-width:1.5}.synclabel{font-size:11px;fill:#d9822b}"
          ".syncl{fill:#d9822b}\n.cap{fill:#4c9a5b}.evi{fill:#c0504d}.dec{fill:#8064a2}\n"
          "table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 6px;"
          "text-align:left}th{background:#f3f3f3}\n.sum{font-size:15px}\n</style></head><body>\n", o);
    /* No step in range: no hit rate ("-", as `reelctl stats` prints), not 0%. */
    char hit[16] = "-";
    if (steps > 0) snprintf(hit, sizeof hit, "%.1f%%", 100 * rep / steps);
    fprintf(o, "<h1>Reel capture report</h1>\n<p class=\"sum\">%.0f requests, %.0f steps, %.0f replayed: "
               "graph hit rate <b>%s</b>. %s: %.0f captures, %.0f evictions; %.0f declines in the whole "
               "catalog.</p>\n",
            reqs, steps, rep, hit,
            since > 0 ? "From the hour of the start on" : "In the whole catalog", num(st, "captures"),
            num(st, "evictions"), num(st, "declines"));
    const char *source = json_string_value(json_object_get(r, "source"));
    bool summaries = source && !strcmp(source, "summaries");
    fprintf(o, "<p class=\"tick\">Made %s from the catalog.</p>\n", made);
    if (since > 0) {
        char s[48];
        clock_text(since, s, sizeof s);
        fprintf(o, "<p class=\"tick\">From %s.</p>\n", s);
    }
    fputs("<h2>Graph hit rate and requests over time, weight syncs marked</h2>\n", o);
    chart_timeline(o, r);
    if (summaries)
        fputs("<p class=\"tick\">From the catalog's summaries (its raw rows are many, or pruned): the timeline "
              "per minute, the slowest requests of each hour, syncs counted per minute.</p>\n", o);
    time_split(o, json_object_get(r, "time_split"));
    fputs("<h2>Captures and evictions per weight sync</h2>\n<p class=\"tick\">Between each applied sync and the "
          "next (the first row: before the first sync).</p>\n", o);
    json_t *per = json_array();
    json_t *first = json_pack("{s:s, s:i, s:O, s:O}", "component", "(start)", "version", 0, "captures",
                              json_object_get(json_object_get(r, "before_first_sync"), "captures"), "evictions",
                              json_object_get(json_object_get(r, "before_first_sync"), "evictions"));
    if (per && first) json_array_append_new(per, first);
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(r, "syncs"), i, s) json_array_append(per, s);
    static const char *const ce[] = { "captures", "evictions" }, *const cec[] = { "cap", "evi" };
    chart_bars(o, "per-sync", "captures and evictions per weight sync", per, "component", ce, cec, 2, true);
    json_decref(per);
    json_t *unapplied = json_object_get(r, "unapplied_syncs");
    if (json_array_size(unapplied)) {
        /* No worker applied them (failed), or none yet (pending): the
         * weights did not move, so they are neither lines on the timeline
         * nor rows above. */
        fputs("<p class=\"tick\" id=\"unapplied-syncs\">Syncs not applied (not drawn):", o);
        json_array_foreach(unapplied, i, s) {
            char when[48];
            clock_text(num(s, "t"), when, sizeof when);
            fputs(i ? "; " : " ", o);
            esc(o, str(s, "component"));
            fprintf(o, " v%" PRId64 " at %s, ", (int64_t)num(s, "version"), when);
            esc(o, str(s, "state"));
            if (*str(s, "reason")) {
                fputs(" (", o);
                esc(o, str(s, "reason"));
                fputs(")", o);
            }
        }
        fputs(".</p>\n", o);
    }
    fputs("<h2>Declines to eager, by reason</h2>\n", o);
    static const char *const dk[] = { "count" }, *const dc[] = { "dec" };
    chart_bars(o, "declines", "declines by reason", json_object_get(r, "declines"), "reason", dk, dc, 1, false);
    fputs("<h2>Workers</h2>\n", o);
    static const char *const wc[] = { "name", "device", "arch", "streams", "versions", "first_seen", "last_seen",
                                      "gone_reason" },
                             *const wh[] = { "worker", "device", "arch", "streams", "versions", "first seen",
                                             "last seen", "gone" };
    table(o, json_object_get(r, "workers"), wc, wh, 8);
    fputs("<h2>Capture keys, most replayed first</h2>\n", o);
    static const char *const kc[] = { "key_hash", "captures", "replays", "declines", "workers", "key_text" },
                             *const kh[] = { "key", "captures", "replays", "declines", "workers", "key text" };
    table(o, json_object_get(r, "keys"), kc, kh, 6);
    fputs("<h2>The slowest requests, with their steps</h2>\n<p>seconds: for a request that ended ok, its "
          "denoising loop on its worker; for a failed one (any other status), how long the broker held it, from "
          "its arrival to its failure.</p>\n", o);
    static const char *const sc[] = { "t", "id", "worker", "key_hash", "version", "steps", "captured", "replayed",
                                      "eager", "seconds", "status" },
                             *const sh[] = { "time", "id", "worker", "key", "version", "steps", "captured",
                                             "replayed", "eager", "seconds", "status" };
    table(o, json_object_get(r, "slowest"), sc, sh, 11);
    fputs("</body></html>\n", o);
    json_decref(r);
    return ferror(o) ? reel_fail(REEL_E_IO, "writing the report failed") : 0;
}

int cmd_report(int argc, char **argv) {
    static const struct option opts[] = {
        { "html", required_argument, 0, 'o' }, { "catalog", required_argument, 0, 'c' },
        { "since", required_argument, 0, 's' }, { "json", no_argument, 0, 'j' }, { 0, 0, 0, 0 },
    };
    bool json = false; /* --json: the report's data on stdout, what the page draws */
    const char *env = getenv("REEL_CATALOG");
    const char *path = env && *env ? env : "reel.db", *out = NULL;
    const char *paths[CTL_MAX_CATALOGS];
    int n_paths = 0;
    double since = 0;
    int o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'o': out = optarg; break;
        case 'j': json = true; break;
        case 'c':
            if (n_paths == CTL_MAX_CATALOGS) return reel_fail(REEL_E_INVALID, "report: at most %d --catalog", CTL_MAX_CATALOGS);
            path = paths[n_paths++] = optarg;
            break;
        case 's': {
            /* UNIX seconds, or -N: the last N seconds */
            double v;
            if (reel_parse_f64(optarg, -DBL_MAX, DBL_MAX, "--since", &v))
                return reel_fail(REEL_E_INVALID, "--since: '%s' is not a time", optarg);
            since = optarg[0] == '-' ? (double)time(NULL) + v : v; /* -0 too: now */
            break;
        }
        default: return ctl_fail_usage("report", "report: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "report: unexpected argument '%s'", argv[optind]);
    if (!out == !json) return reel_fail(REEL_E_INVALID, "report needs --html OUT.html or --json (one of them)");
    int orc;
    if (access(path, F_OK) != 0)
        return reel_fail(REEL_E_NOT_FOUND, "catalog %s does not exist (use --catalog PATH or $REEL_CATALOG)", path);
    if (json) {
        if (n_paths == 0) paths[n_paths++] = path;
        ctl_catalog_t cc;
        if ((orc = ctl_catalog_open(paths, n_paths, &cc)) != 0)
            return orc == CTL_CATALOG_BAD_PATH ? -1 : ctl_fail_as(REEL_E_IO, NULL);
        json_t *r = cat_query_report(cc.c, since);
        int rc = r ? json_dumpf(r, stdout, JSON_INDENT(1) | JSON_REAL_PRECISION(17)) : -1;
        json_decref(r);
        ctl_catalog_close(&cc);
        if (rc != 0 || fputc('\n', stdout) == EOF || fflush(stdout) != 0)
            return r ? reel_fail(REEL_E_IO, "report: writing the JSON failed") : ctl_fail_as(REEL_E_IO, "report: ");
        return 0;
    }
    struct stat os;
    if (lstat(out, &os) == 0 && !S_ISREG(os.st_mode)) /* replaced by rename: only a regular file may be */
        return reel_fail(REEL_E_INVALID, "%s: exists and is not a regular file", out);
    if (n_paths == 0) paths[n_paths++] = path;
    ctl_catalog_t cc; /* several: their union (a standby pair's two catalogs) */
    if ((orc = ctl_catalog_open(paths, n_paths, &cc)) != 0)
        return orc == CTL_CATALOG_BAD_PATH ? -1 : ctl_fail_as(REEL_E_IO, NULL);
    cat_t *c = cc.c;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    int tfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    FILE *f = tfd >= 0 ? fdopen(tfd, "w") : NULL;
    if (!f) {
        int e = errno;
        if (tfd >= 0) close(tfd);
        ctl_catalog_close(&cc);
        return reel_fail(REEL_E_IO, "report: cannot write %s (%s: %s)", out, tmp, strerror(e));
    }
    int rc = ctl_report_html(c, since, f);
    ctl_catalog_close(&cc);
    if (fclose(f) != 0 && rc == 0) rc = reel_fail(REEL_E_IO, "writing the report failed");
    if (rc != 0 || rename(tmp, out) != 0) {
        int e = errno;
        unlink(tmp);
        return rc ? ctl_fail_as(REEL_E_IO, "report: ")
                  : reel_fail(REEL_E_IO, "report: cannot rename %s to %s: %s", tmp, out, strerror(e));
    }
    fprintf(stderr, "reelctl: report written to %s\n", out);
    return 0;
}
