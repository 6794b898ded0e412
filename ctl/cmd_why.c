/* cmd_why.c -- `reelctl why ID [--worker NAME] [--catalog PATH]... [--json]`:
 * why one request was slow, from the catalog (ctl/report_why.c draws it,
 * catalog/catalog_why.c finds it), read-only while the broker writes.
 *
 * ID is the request id `reelctl requests` shows (the client's; ids repeat
 * across clients and broker restarts: the newest row wins, or the newest
 * on --worker). Exit 0 with the answer on stdout; 2 for a bad ID or flag,
 * a catalog that does not exist or an id it does not hold (invalid,
 * not_found); 1 when the catalog can not be read (io; also a catalog from
 * before schema 12, as for every catalog report: the broker migrates it). */
#include "ctl.h"
#include "base/error.h"
#include "base/parse.h"
#include "ctl/report.h"
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHY_USAGE "usage: reelctl why ID [--worker NAME] [--catalog PATH]... [--json]"

int cmd_why(int argc, char **argv) {
    static const struct option opts[] = {
        { "catalog", required_argument, 0, 'c' }, { "worker", required_argument, 0, 'w' },
        { "json", no_argument, 0, 'j' },
        { 0, 0, 0, 0 },
    };
    const char *env = getenv("REEL_CATALOG");
    const char *paths[CTL_MAX_CATALOGS];
    const char *worker = NULL, *id_text = NULL;
    int n_paths = 0;
    bool json = false;
    int o;
    opterr = 0;
    optind = 1;
    /* '-' first: ID may come before or after the options */
    while ((o = getopt_long(argc, argv, "-", opts, NULL)) != -1) {
        switch (o) {
        case 1:
            if (id_text) return reel_fail(REEL_E_INVALID, "why: unexpected argument '%s'; " WHY_USAGE, optarg);
            id_text = optarg;
            break;
        case 'c':
            if (n_paths == CTL_MAX_CATALOGS)
                return reel_fail(REEL_E_INVALID, "why: at most %d --catalog", CTL_MAX_CATALOGS);
            if (!*optarg) return reel_fail(REEL_E_INVALID, "--catalog: empty path");
            paths[n_paths++] = optarg;
            break;
        case 'w':
            if (!*optarg) return reel_fail(REEL_E_INVALID, "--worker: empty name");
            worker = optarg;
            break;
        case 'j': json = true; break;
        default: return ctl_fail_usage("why", "why: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (!id_text) return reel_fail(REEL_E_INVALID, "why: which request? " WHY_USAGE);
    /* Ids are stored as SQLite's signed 64-bit integers: one past
     * INT64_MAX shows negative in `reelctl requests`, and is taken so. */
    long long id;
    if (id_text[0] == '-') {
        int64_t v;
        if (reel_parse_i64(id_text, INT64_MIN, -1, "why: ID", &v) != 0) return -1;
        id = v;
    } else {
        uint64_t v;
        if (reel_parse_u64(id_text, 0, UINT64_MAX, "why: ID", &v) != 0) return -1;
        id = (long long)v;
    }
    if (n_paths == 0) paths[n_paths++] = env && *env ? env : "reel.db";

    ctl_catalog_t cc; /* several: their union (a standby pair's two catalogs) */
    /* A missing catalog (a wrong path) or an id the catalog does not hold
     * is the user's to fix (exit 2); any other failure is the catalog's. */
    int rc = ctl_catalog_open(paths, n_paths, &cc);
    if (rc == CTL_CATALOG_BAD_PATH) return -1; /* its code: exit 2 */
    if (rc == 0) {
        rc = ctl_report_why(cc.c, id, worker, json, stdout);
        ctl_catalog_close(&cc);
    }
    if (rc != 0) return ctl_fail_as(reel_err_code() == REEL_E_NOT_FOUND ? REEL_E_NOT_FOUND : REEL_E_IO, NULL);
    return 0;
}
