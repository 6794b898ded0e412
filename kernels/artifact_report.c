/* artifact_report.c -- what a set found and measured: the bundles, and per
 * artifact and per kernel key the calls, parity results, fallbacks and the
 * speedup against the native kernel with its spread, as text or JSON. */
#include "artifact_impl.h"
#include "base/error.h"
#include <math.h>
#include <string.h>

size_t kern_artifacts_keys(kern_artifacts_t *set, kern_art_key_stats_t *out, size_t max) {
    art_lock(set);
    size_t n = 0;
    for (const art_key_t *k = set->first; k; k = k->all, n++) {
        if (n >= max) continue;
        kern_art_key_stats_t *o = &out[n];
        snprintf(o->id, sizeof o->id, "%s", k->k->art->m.id);
        snprintf(o->key, sizeof o->key, "%s", k->text);
        snprintf(o->reason, sizeof o->reason, "%s", k->reason);
        o->state = k->state;
        o->n = k->n;
        if (!k->n.timed) o->n.speedup_min = 0;
    }
    art_unlock(set);
    return n;
}

/* Chan's merge of (n, mean, m2) summaries. */
static void merge(kern_art_counts_t *t, double *tm2, const kern_art_counts_t *c, double cm2) {
    uint64_t n = t->timed + c->timed;
    if (c->timed) {
        double d = c->speedup_mean - t->speedup_mean;
        t->speedup_mean += d * (double)c->timed / (double)n;
        *tm2 += cm2 + d * d * (double)t->timed * (double)c->timed / (double)n;
        if (c->speedup_min < t->speedup_min || !t->timed) t->speedup_min = c->speedup_min;
        if (c->speedup_max > t->speedup_max) t->speedup_max = c->speedup_max;
    }
    t->timed = n;
    t->speedup_sd = n > 1 ? sqrt(*tm2 / (double)(n - 1)) : 0;
    t->calls += c->calls;
    t->native_calls += c->native_calls;
    t->parity_pass += c->parity_pass;
    t->parity_fail += c->parity_fail;
    t->fallbacks += c->fallbacks;
    t->native_s += c->native_s;
    t->artifact_s += c->artifact_s;
    t->sync_timed += c->sync_timed;
    t->sync_s += c->sync_s;
    if (c->max_rel_seen > t->max_rel_seen) t->max_rel_seen = c->max_rel_seen;
}

int kern_artifacts_totals(kern_artifacts_t *set, const char *id, kern_art_counts_t *out,
                          int *promoted, int *demoted) {
    memset(out, 0, sizeof *out);
    int p = 0, d = 0;
    bool found = false;
    for (size_t i = 0; i < set->n; i++) found |= set->b[i].parsed && !strcmp(set->b[i].m.id, id);
    if (!found) return reel_fail(REEL_E_INVALID, "artifacts: no bundle has id '%.64s'", id);
    double m2 = 0;
    art_lock(set);
    for (const art_key_t *k = set->first; k; k = k->all) {
        if (strcmp(k->k->art->m.id, id)) continue;
        merge(out, &m2, &k->n, k->m2);
        p += k->state == KERN_ART_PROMOTED;
        d += k->state == KERN_ART_DEMOTED;
    }
    art_unlock(set);
    if (promoted) *promoted = p;
    if (demoted) *demoted = d;
    return 0;
}

/* A JSON string of s (ids, keys and messages are ASCII without quotes in
 * practice; escape anyway). */
static void jstr(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void print_bundles(kern_artifacts_t *set, FILE *f, bool json) {
    if (!json) fprintf(f, "%-32s %-10s %-18s %-5s %-8s %s\n", "ID", "VERSION", "OP", "BACK",
                       "STATUS", "PARITY / ERROR");
    for (size_t i = 0; i < set->n; i++) {
        const art_bundle_t *a = &set->b[i];
        const char *status = !a->verified ? "refused" : a->loaded ? "loaded" : "verified";
        char parity[40];
        if (a->m.parity == KERN_PARITY_MAX_REL) snprintf(parity, sizeof parity, "max_rel=%g", a->m.max_rel);
        else snprintf(parity, sizeof parity, "byte_equal");
        const char *sha = ""; /* the object's digest */
        for (int k = 0; a->parsed && k < a->m.n_files; k++)
            if (!strcmp(a->m.files[k].name, a->m.object)) sha = a->m.files[k].sha256;
        if (json) {
            fprintf(f, "%s{\"bundle\":", i ? "," : "");
            jstr(f, a->bundle);
            fprintf(f, ",\"id\":");
            jstr(f, a->parsed ? a->m.id : "");
            fprintf(f, ",\"version\":");
            jstr(f, a->parsed ? a->m.version : "");
            fprintf(f, ",\"op\":\"%s\",\"backend\":\"%s\",\"status\":\"%s\",\"verified\":%s,"
                    "\"enabled\":%s,\"parity\":\"%s\",\"sha256\":\"%s\",\"error\":",
                    a->parsed ? kern_op_name(a->m.op) : "",
                    a->parsed ? kern_backend_kind_name(a->m.backend) : "", status,
                    a->verified ? "true" : "false", a->enabled ? "true" : "false",
                    a->parsed ? parity : "", sha);
            jstr(f, a->error);
            fputc('}', f);
            continue;
        }
        if (!a->parsed) {
            fprintf(f, "%-32s %-10s %-18s %-5s %-8s %s\n", "-", "-", "-", "-", status, a->error);
            continue;
        }
        fprintf(f, "%-32s %-10s %-18s %-5s %-8s %s\n", a->m.id, a->m.version,
                kern_op_name(a->m.op), kern_backend_kind_name(a->m.backend), status,
                a->verified ? parity : a->error);
    }
}

static void print_totals(kern_artifacts_t *set, FILE *f, bool json) {
    bool first = true;
    if (!json)
        fprintf(f, "\n%-32s %8s %8s %6s %6s %6s %9s %s\n", "ARTIFACT", "CALLS", "NATIVE", "PASS",
                "FAIL", "FALLBK", "SPEEDUP", "SPREAD (sd, min..max, timed calls)");
    for (size_t i = 0; i < set->n; i++) {
        const art_bundle_t *a = &set->b[i];
        if (!a->loaded) continue;
        kern_art_counts_t t;
        int p = 0, d = 0;
        if (kern_artifacts_totals(set, a->m.id, &t, &p, &d) != 0) continue;
        double sp = t.artifact_s > 0 ? t.native_s / t.artifact_s : 0;
        if (json) {
            fprintf(f, "%s{\"id\":", first ? "" : ",");
            jstr(f, a->m.id);
            fprintf(f, ",\"calls\":%llu,\"native_calls\":%llu,\"parity_pass\":%llu,"
                    "\"parity_fail\":%llu,\"fallbacks\":%llu,\"keys_promoted\":%d,"
                    "\"keys_demoted\":%d,\"timed\":%llu,\"native_s\":%.9g,\"artifact_s\":%.9g,"
                    "\"speedup\":%.6g,\"speedup_mean\":%.6g,\"speedup_sd\":%.6g,"
                    "\"speedup_min\":%.6g,\"speedup_max\":%.6g,\"sync_timed\":%llu,"
                    "\"sync_s\":%.9g,\"max_rel_seen\":%.6g}",
                    (unsigned long long)t.calls, (unsigned long long)t.native_calls,
                    (unsigned long long)t.parity_pass, (unsigned long long)t.parity_fail,
                    (unsigned long long)t.fallbacks, p, d, (unsigned long long)t.timed,
                    t.native_s, t.artifact_s, sp, t.speedup_mean, t.speedup_sd,
                    t.timed ? t.speedup_min : 0, t.speedup_max,
                    (unsigned long long)t.sync_timed, t.sync_s, t.max_rel_seen);
        } else {
            char spread[96] = "-";
            if (t.timed)
                snprintf(spread, sizeof spread, "sd %.3f, %.3f..%.3f, n=%llu", t.speedup_sd,
                         t.speedup_min, t.speedup_max, (unsigned long long)t.timed);
            char speed[16] = "-";
            if (t.timed) snprintf(speed, sizeof speed, "%.3fx", sp);
            fprintf(f, "%-32s %8llu %8llu %6llu %6llu %6llu %9s %s\n", a->m.id,
                    (unsigned long long)t.calls, (unsigned long long)t.native_calls,
                    (unsigned long long)t.parity_pass, (unsigned long long)t.parity_fail,
                    (unsigned long long)t.fallbacks, speed, spread);
        }
        first = false;
    }
}

static void print_keys(kern_artifacts_t *set, FILE *f, bool json) {
    bool first = true;
    if (!json) fprintf(f, "\n%-28s %-10s %8s %6s %6s %9s  %s\n", "ARTIFACT", "STATE", "CALLS",
                       "PASS", "FAIL", "SPEEDUP", "KEY / REASON");
    art_lock(set);
    for (const art_key_t *k = set->first; k; k = k->all) {
        const kern_art_counts_t *c = &k->n;
        double sp = c->artifact_s > 0 ? c->native_s / c->artifact_s : 0;
        if (json) {
            fprintf(f, "%s{\"id\":", first ? "" : ",");
            jstr(f, k->k->art->m.id);
            fprintf(f, ",\"key\":");
            jstr(f, k->text);
            fprintf(f, ",\"state\":\"%s\",\"reason\":", kern_art_state_name(k->state));
            jstr(f, k->reason);
            fprintf(f, ",\"calls\":%llu,\"native_calls\":%llu,\"parity_pass\":%llu,"
                    "\"parity_fail\":%llu,\"fallbacks\":%llu,\"timed\":%llu,\"speedup\":%.6g,"
                    "\"speedup_sd\":%.6g,\"native_s\":%.9g,\"artifact_s\":%.9g}",
                    (unsigned long long)c->calls, (unsigned long long)c->native_calls,
                    (unsigned long long)c->parity_pass, (unsigned long long)c->parity_fail,
                    (unsigned long long)c->fallbacks, (unsigned long long)c->timed, sp,
                    c->speedup_sd, c->native_s, c->artifact_s);
        } else {
            char speed[16] = "-";
            if (c->timed) snprintf(speed, sizeof speed, "%.3fx", sp);
            fprintf(f, "%-28.28s %-10s %8llu %6llu %6llu %9s  %s%s%s\n", k->k->art->m.id,
                    kern_art_state_name(k->state), (unsigned long long)c->calls,
                    (unsigned long long)c->parity_pass, (unsigned long long)c->parity_fail,
                    speed, k->text, k->reason[0] ? " -- " : "", k->reason);
        }
        first = false;
    }
    art_unlock(set);
}

int kern_artifacts_print(kern_artifacts_t *set, FILE *f, bool keys, bool json) {
    if (json) fprintf(f, "{\"root\":");
    if (json) jstr(f, set->root);
    if (json) fprintf(f, ",\"timing\":\"%s\",\"bundles\":[", kern_art_timing_name(set->timing));
    print_bundles(set, f, json);
    if (json) fprintf(f, "]");
    if (keys) {
        if (json) fprintf(f, ",\"artifacts\":[");
        print_totals(set, f, json);
        if (json) fprintf(f, "],\"keys\":[");
        print_keys(set, f, json);
        if (json) fprintf(f, "]");
    }
    if (json) fprintf(f, "}\n");
    return ferror(f) ? -1 : 0;
}
