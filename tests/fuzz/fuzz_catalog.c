/* fuzz_catalog.c -- libFuzzer harness: the catalog readers (every reelctl
 * report, text and JSON, and the Prometheus text) over a catalog whose rows
 * hold whatever a corrupt file, a bug or a hand edit could put there: the
 * input is decoded into typed values (NULL, integers at the edges, doubles
 * including NaN and infinities, text with invalid UTF-8 and control bytes,
 * blobs) and inserted into every table of the real schema. A report may
 * print "?" for a value it cannot show; it may not crash or hit UB. `reelctl
 * why` runs on the ids (and workers) the fuzzed requests rows hold, and on
 * ids at the edges. */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ctl/report.h"
#include "catalog/catalog.h"

typedef struct { const uint8_t *p; size_t n; } in_t;

/* The next input byte; 0 once the input is used up. */
static unsigned take(in_t *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

/* Binds the next fuzzed value to parameter i of st. */
static void bind_next(sqlite3_stmt *st, int i, in_t *in) {
    static const double reals[] = { 0.0, -0.0, 1e300, -1e300, 1.0 / 0.0, -1.0 / 0.0, 0.0 / 0.0,
                                    1.7e9, 4e18, -4e18, 0.5 };
    static const int64_t ints[] = { 0, 1, -1, INT64_MAX, INT64_MIN, 1700000000, 255, 4096 };
    unsigned k = take(in);
    switch (k % 6) {
    case 0: sqlite3_bind_null(st, i); break;
    case 1: sqlite3_bind_int64(st, i, ints[take(in) % (sizeof ints / sizeof ints[0])]); break;
    case 2: sqlite3_bind_double(st, i, reals[take(in) % (sizeof reals / sizeof reals[0])]); break;
    case 3: {
        uint64_t v = 0;
        for (int b = 0; b < 8; b++) v = (v << 8) | take(in);
        sqlite3_bind_int64(st, i, (int64_t)v);
        break;
    }
    default: {
        size_t len = (size_t)(take(in) & 0x3f);
        if (len > in->n) len = in->n;
        if (k % 6 == 4) sqlite3_bind_text(st, i, (const char *)in->p, (int)len, SQLITE_TRANSIENT);
        else sqlite3_bind_blob(st, i, in->p, (int)len, SQLITE_TRANSIENT);
        in->p += len;
        in->n -= len;
    }
    }
}

static void fill(sqlite3 *db, in_t *in) {
    sqlite3_stmt *tabs;
    if (sqlite3_prepare_v2(db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name", -1, &tabs,
                           NULL) != SQLITE_OK)
        return;
    char names[32][64];
    int nt = 0;
    while (nt < 32 && sqlite3_step(tabs) == SQLITE_ROW)
        snprintf(names[nt++], sizeof names[0], "%s", (const char *)sqlite3_column_text(tabs, 0));
    sqlite3_finalize(tabs);
    for (int t = 0; t < nt && in->n; t++) {
        char sql[256];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM pragma_table_info('%s')", names[t]);
        sqlite3_stmt *q;
        int cols = 0;
        if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
            cols = sqlite3_column_int(q, 0);
        sqlite3_finalize(q);
        if (cols <= 0 || cols > 40) continue;
        char ins[512];
        int off = snprintf(ins, sizeof ins, "INSERT OR IGNORE INTO \"%s\" VALUES (", names[t]);
        for (int c = 0; c < cols; c++) off += snprintf(ins + off, sizeof ins - (size_t)off, c ? ",?" : "?");
        snprintf(ins + off, sizeof ins - (size_t)off, ")");
        sqlite3_stmt *st;
        if (sqlite3_prepare_v2(db, ins, -1, &st, NULL) != SQLITE_OK) continue;
        int rows = 1 + take(in) % 4;
        for (int r = 0; r < rows && in->n; r++) {
            for (int c = 1; c <= cols; c++) bind_next(st, c, in);
            (void)sqlite3_step(st);
            sqlite3_reset(st);
        }
        sqlite3_finalize(st);
    }
}

/* Removes db and its WAL side files. */
static void remove_db(const char *db) {
    char side[96];
    unlink(db);
    snprintf(side, sizeof side, "%s-wal", db);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", db);
    unlink(side);
}

/* The process's catalog file, made on the first run; removed at exit so a
 * run (make test's 3 s included) leaves nothing in /tmp. */
static char path[64];

static void remove_db_at_exit(void) { remove_db(path); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned char *pristine; /* the real schema, migrated once */
    static size_t pristine_len;
    if (!pristine) {
        snprintf(path, sizeof path, "/tmp/reel-fuzz-cat-%d.db", (int)getpid());
        remove_db(path);
        atexit(remove_db_at_exit);
        cat_t *c = cat_open(path, false);
        if (!c) abort();
        cat_close(&c);
        FILE *f = fopen(path, "rb");
        if (!f || fseek(f, 0, SEEK_END) || (pristine_len = (size_t)ftell(f)) == 0) abort();
        rewind(f);
        if (!(pristine = malloc(pristine_len)) || fread(pristine, 1, pristine_len, f) != pristine_len) abort();
        fclose(f);
    }
    remove_db(path);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(pristine, 1, pristine_len, f) != pristine_len) abort();
    fclose(f);
    cat_t *c;
    sqlite3 *db;
    if (sqlite3_open(path, &db) != SQLITE_OK) abort();
    in_t in = { data, size };
    sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    fill(db, &in);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    /* the requests rows' ids and workers, for why */
    long long ids[8] = { 0, 1, -1, INT64_MAX };
    char workers[8][64] = { { 0 } };
    int nid = 4;
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(db, "SELECT id, worker FROM requests LIMIT 4", -1, &q, NULL) == SQLITE_OK) {
        while (nid < 8 && sqlite3_step(q) == SQLITE_ROW) {
            ids[nid] = sqlite3_column_int64(q, 0);
            const unsigned char *w = sqlite3_column_type(q, 1) == SQLITE_TEXT ? sqlite3_column_text(q, 1) : NULL;
            snprintf(workers[nid], sizeof workers[0], "%s", w ? (const char *)w : "");
            nid++;
        }
        sqlite3_finalize(q);
    }
    sqlite3_close(db);
    if (!(c = cat_open(path, true))) return 0;
    FILE *devnull = fopen("/dev/null", "w");
    if (!devnull) abort();
    int (*const reports[])(cat_t *, bool, FILE *) = {
        ctl_report_stats, ctl_report_keys, ctl_report_evictions,
        ctl_report_versions, ctl_report_workers, ctl_report_requests,
    };
    for (size_t r = 0; r < sizeof reports / sizeof reports[0]; r++) {
        (void)reports[r](c, false, devnull);
        (void)reports[r](c, true, devnull);
    }
    (void)ctl_report_metrics(c, devnull);
    for (int i = 0; i < nid; i++)
        for (int json = 0; json < 2; json++) {
            (void)ctl_report_why(c, ids[i], NULL, json, devnull);
            if (workers[i][0]) (void)ctl_report_why(c, ids[i], workers[i], json, devnull);
        }
    fclose(devnull);
    cat_close(&c);
    return 0;
}
