/* report.h -- reelctl's catalog reports: each prints one query of
 * catalog/catalog_query.h to out, as JSON on one line (json) or as a table
 * for people; metrics prints the stats as Prometheus text (counters end in
 * _total; labels worker and reason, and artifact, result and state for
 * kernel artifacts: no per-key cardinality). Each
 * reads one snapshot of the catalog. 0, or -1 with the error value of
 * base/error.h set: the catalog's own when it could not be read, io when
 * out could not be written, nomem. */
#ifndef REEL_CTL_REPORT_H
#define REEL_CTL_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "catalog/catalog.h"

/* The catalog a report reads: one path (read-only), or, for several
 * (the two brokers of a standby pair, each with its own), their union:
 * a temporary catalog they are merged into (cat_merge: each request
 * once, by id), removed by ctl_catalog_close. 0; CTL_CATALOG_BAD_PATH
 * with the error set (REEL_E_NOT_FOUND or REEL_E_INVALID: the user's to
 * fix, exit 2) for a path that is missing, not a regular file or not a
 * SQLite file; or -1 with a message (the catalog's failure). */
#define CTL_CATALOG_BAD_PATH (-2)
#define CTL_MAX_CATALOGS 4
typedef struct {
    cat_t *c;
    char tmp[4096]; /* the union's file ("" for one catalog) */
} ctl_catalog_t;
int ctl_catalog_open(const char *const *paths, int n, ctl_catalog_t *out);
void ctl_catalog_close(ctl_catalog_t *cc);
int ctl_report_stats(cat_t *c, bool json, FILE *out);     /* per worker + overall */
int ctl_report_keys(cat_t *c, bool json, FILE *out);
int ctl_report_evictions(cat_t *c, bool json, FILE *out);
int ctl_report_versions(cat_t *c, bool json, FILE *out);
/* The `limit` newest versions of each component (0: all), with a line
 * under the table when older ones are left out. */
int ctl_report_versions_recent(cat_t *c, bool json, FILE *out, int limit);
int ctl_report_workers(cat_t *c, bool json, FILE *out);
int ctl_report_requests(cat_t *c, bool json, FILE *out);
int ctl_report_metrics(cat_t *c, FILE *out);
/* `reelctl why` (report_why.c): request `id` (the newest with it, on
 * `worker` when not NULL) joined to its graph's history and a verdict,
 * as cat_query_why gives it (catalog/catalog_query.h); not_found when no
 * row has the id. */
int ctl_report_why(cat_t *c, long long id, const char *worker, bool json, FILE *out);
/* Kernel artifacts: per artifact, then per (worker, artifact, kernel key). */
int ctl_report_artifacts(cat_t *c, bool json, FILE *out);

#endif
