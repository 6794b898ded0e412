/* report_table.h -- reelctl's tables: an array of JSON objects drawn as
 * columns for people (ctl/report.c's reports use it). */
#ifndef REEL_CTL_REPORT_TABLE_H
#define REEL_CTL_REPORT_TABLE_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

typedef enum {
    CTL_F_TEXT,   /* as is */
    CTL_F_NUM,    /* integer, right-aligned */
    CTL_F_RATE,   /* fraction as a percentage */
    CTL_F_SECS,   /* seconds, 3 decimals */
    CTL_F_TIME,   /* UNIX time as UTC ISO-8601 */
    CTL_F_LIST,   /* array joined with ',' (objects: their values joined with ':') */
    CTL_F_MAP,    /* object as k=v,k=v */
} ctl_fmt_t;

typedef struct {
    const char *key;   /* field of the row object */
    const char *head;  /* column header */
    ctl_fmt_t fmt;
    int max;           /* longer cells are cut with "..."; 0: never */
} ctl_col_t;

#define CTL_NCOLS(a) (sizeof(a) / sizeof((a)[0]))

/* Prints rows (an array of objects) as a table: a header line, then one
 * line per row, columns two spaces apart, numbers right-aligned, control
 * characters shown as '?', long cells cut with "..."; "(none)" after the
 * header when there are no rows. -1 with a REEL_E_NOMEM error "WHAT:
 * report: out of memory" (base/error.h) when a cell cannot be built
 * (nothing printed then). */
int ctl_table_print(const char *what, FILE *out, const json_t *rows, const ctl_col_t *cols, size_t ncols);

#endif
