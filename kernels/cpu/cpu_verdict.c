/* cpu_verdict.c -- see cpu_verdict.h. */
#include "cpu_verdict.h"
#include <string.h>

static __thread int tl_replaying;

void cpu_replay_mark(int delta) { tl_replaying += delta; }
bool cpu_replaying(void) { return tl_replaying > 0; }

/* The caller holds t->mu. */
static const cpu_verdict_t *find(const cpu_verdicts_t *t, const int64_t key[CPU_VERDICT_KEY]) {
    for (int i = 0; i < t->n; i++)
        if (!memcmp(t->v[i].key, key, sizeof t->v[i].key)) return &t->v[i];
    return NULL;
}

int cpu_verdict_find(cpu_verdicts_t *t, const int64_t key[CPU_VERDICT_KEY]) {
    pthread_mutex_lock(&t->mu);
    const cpu_verdict_t *v = find(t, key);
    int r = v ? v->ok : -1;
    pthread_mutex_unlock(&t->mu);
    return r;
}

bool cpu_verdict_keep(cpu_verdicts_t *t, const int64_t key[CPU_VERDICT_KEY], bool ok) {
    pthread_mutex_lock(&t->mu);
    const cpu_verdict_t *v = find(t, key);
    if (v) {
        ok = v->ok;
    } else if (t->n < CPU_VERDICTS) {
        memcpy(t->v[t->n].key, key, sizeof t->v[t->n].key);
        t->v[t->n++].ok = ok;
    } else {
        ok = false;
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}

bool cpu_verdict_ask(cpu_verdicts_t *t, const int64_t key[CPU_VERDICT_KEY], int (*probe)(const void *ctx),
                     const void *ctx) {
    int known = cpu_verdict_find(t, key);
    if (known >= 0) return known == 1;
    if (cpu_replaying()) return false;
    int r = probe(ctx);
    if (r < 0) return false;
    return cpu_verdict_keep(t, key, r == 1);
}

void cpu_verdict_count(cpu_verdicts_t *t, int *yes, int *no) {
    pthread_mutex_lock(&t->mu);
    *yes = *no = 0;
    for (int i = 0; i < t->n; i++) ++*(t->v[i].ok ? yes : no);
    pthread_mutex_unlock(&t->mu);
}

void cpu_verdict_forget(cpu_verdicts_t *t) {
    pthread_mutex_lock(&t->mu);
    t->n = 0;
    pthread_mutex_unlock(&t->mu);
}
