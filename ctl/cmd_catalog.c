/* cmd_catalog.c -- `reelctl stats|keys|evictions|versions|workers|requests
 * [--catalog PATH] [--json]`: operator reports from the catalog, read-only,
 * while the broker keeps writing it (WAL).
 *
 * The catalog is "reel.db" unless $REEL_CATALOG or --catalog says otherwise.
 * Exit 0 with the report on stdout; 2 for a bad flag, an unknown report or
 * a catalog that does not exist (invalid, not_found); 1 when the catalog
 * can not be read (io). */
#include "ctl.h"
#include "base/error.h"
#include "ctl/report.h"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*report_fn)(cat_t *c, bool json, FILE *out);

/* `reelctl versions`: the CTL_VERSIONS_SHOWN newest of each component,
 * every one with --all (a trainer publishing every few minutes makes
 * thousands). */
#define CTL_VERSIONS_SHOWN 10
static bool versions_all;
static int versions(cat_t *c, bool json, FILE *out) {
    return ctl_report_versions_recent(c, json, out, versions_all ? 0 : CTL_VERSIONS_SHOWN);
}

/* `reelctl metrics`: Prometheus text (--json makes no sense here: ignored). */
static int metrics(cat_t *c, bool json, FILE *out) {
    (void)json;
    return ctl_report_metrics(c, out);
}

static const struct {
    const char *name;
    report_fn fn;
} reports[] = {
    { "stats", ctl_report_stats },         { "keys", ctl_report_keys },
    { "evictions", ctl_report_evictions }, { "versions", versions },
    { "workers", ctl_report_workers },     { "requests", ctl_report_requests },
    { "metrics", metrics },
};

#define USAGE                                                                                      \
    "usage: reelctl stats|keys|evictions|versions|workers|requests|metrics [--catalog PATH]... [--json]" \
    " (several --catalog: their union, each request once: a standby pair's two)"                     \
    " (metrics: [--broker EP] adds the broker's live counters; versions: the 10 newest of each component,"     \
    " --all for every one)"

int cmd_catalog(int argc, char **argv) {
    if (argc < 1 || !argv[0]) return reel_fail(REEL_E_INVALID, USAGE);
    report_fn fn = NULL;
    for (size_t i = 0; i < sizeof reports / sizeof reports[0]; i++)
        if (strcmp(argv[0], reports[i].name) == 0) fn = reports[i].fn;
    if (!fn) return reel_fail(REEL_E_INVALID, "unknown report '%s'; " USAGE, argv[0]);

    static const struct option opts[] = {
        { "catalog", required_argument, 0, 'c' }, { "json", no_argument, 0, 'j' },
        { "broker", required_argument, 0, 'b' },
        { "all", no_argument, 0, 'a' },
        { 0, 0, 0, 0 },
    };
    const char *broker = NULL; /* metrics: the broker's live counters too */
    const char *env = getenv("REEL_CATALOG");
    const char *path = env && *env ? env : "reel.db";
    const char *paths[CTL_MAX_CATALOGS];
    int n_paths = 0;
    bool json = false;
    int o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            if (n_paths == CTL_MAX_CATALOGS)
                return reel_fail(REEL_E_INVALID, "%s: at most %d --catalog", argv[0], CTL_MAX_CATALOGS);
            path = paths[n_paths++] = optarg;
            break;
        case 'b':
            if (fn != metrics) return reel_fail(REEL_E_INVALID, "%s: --broker is for metrics", argv[0]);
            broker = optarg;
            break;
        case 'j': json = true; break;
        case 'a':
            if (fn != versions) return reel_fail(REEL_E_INVALID, "%s: --all is for versions", argv[0]);
            versions_all = true;
            break;
        default: return ctl_fail_usage(argv[0], "%s: unknown or incomplete option '%s'", argv[0], argv[optind - 1]);
        }
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "%s: unexpected argument '%s'", argv[0], argv[optind]);
    if (!*path) return reel_fail(REEL_E_INVALID, "--catalog: empty path");
    /* The broker's counters first: they still answer when its disk is full. */
    if (broker && ctl_broker_metrics(broker, stdout) != 0) return ctl_fail_as(REEL_E_IO, "metrics: ");
    if (broker && access(path, F_OK) != 0) return 0; /* no catalog here: the broker's counters alone */
    /* A missing catalog is a wrong path (the user's to fix), not a failure of the catalog. */
    if (access(path, F_OK) != 0)
        return reel_fail(REEL_E_NOT_FOUND, "catalog %s does not exist (use --catalog PATH or $REEL_CATALOG)", path);

    if (n_paths == 0) paths[n_paths++] = path;
    for (int i = 0; i < n_paths; i++)
        if (!*paths[i]) return reel_fail(REEL_E_INVALID, "--catalog: empty path");
    ctl_catalog_t cc; /* several: their union (a standby pair's two catalogs) */
    int orc = ctl_catalog_open(paths, n_paths, &cc);
    if (orc == CTL_CATALOG_BAD_PATH) return -1; /* its code: exit 2 */
    if (orc != 0) return ctl_fail_as(REEL_E_IO, NULL);
    int rc = fn(cc.c, json, stdout);
    ctl_catalog_close(&cc);
    return rc != 0 ? ctl_fail_as(REEL_E_IO, "%s: ", argv[0]) : 0;
}
