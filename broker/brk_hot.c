/* brk_hot.c -- the keys that were hot lately (see brk_hot.h). */
#include "broker/brk_hot.h"

#include <math.h>
#include <string.h>

double brk_hot_heat(const brk_hot_key_t *k, int64_t now_ms) {
    if (!k->hash) return 0;
    int64_t dt = now_ms - k->t_ms;
    if (dt <= 0) return k->heat;
    return k->heat * exp2(-(double)dt / BRK_HOT_HALF_LIFE_MS);
}

void brk_hot_note(brk_hot_t *h, const brk_hot_key_t *key, int64_t now_ms) {
    if (!key->hash) return;
    int at = -1, coldest = -1;
    double cold = 0;
    for (int i = 0; i < h->n; i++) {
        if (h->k[i].hash == key->hash && !strcmp(h->k[i].model, key->model)) {
            at = i;
            break;
        }
        double x = brk_hot_heat(&h->k[i], now_ms);
        if (coldest < 0 || x < cold) {
            coldest = i;
            cold = x;
        }
    }
    if (at >= 0) {
        brk_hot_key_t *k = &h->k[at];
        k->heat = brk_hot_heat(k, now_ms) + 1;
        k->t_ms = now_ms;
        return;
    }
    at = h->n < BRK_HOT_MAX ? h->n++ : coldest;
    h->k[at] = *key;
    h->k[at].heat = 1;
    h->k[at].t_ms = now_ms;
}

/* Does peers[self] own k among the peers able to run it (and, of those,
 * the eligible ones it fits, when it fits any)? */
static bool owns(const brk_hot_key_t *k, const brk_peer_t *const *peers, int n, int self, uint64_t required,
                 brk_hot_fits_fn fits, void *ctx) {
    const brk_peer_t *able[n ? n : 1], *fit[n ? n : 1];
    int idx[n ? n : 1], fidx[n ? n : 1];
    int m = brk_peers_able(peers, n, k->needs, able, idx);
    int f = 0;
    for (int i = 0; fits && i < m; i++)
        if (brk_peer_eligible(able[i], k->model, required) && fits(ctx, idx[i], k)) {
            fit[f] = able[i];
            fidx[f++] = idx[i];
        }
    if (f > 0) {
        int o = brk_owner(fit, f, k->hash, k->model, required);
        return o >= 0 && fidx[o] == self;
    }
    int o = brk_owner(able, m, k->hash, k->model, required);
    return o >= 0 && idx[o] == self;
}

int brk_hot_owned(const brk_hot_t *h, int64_t now_ms, const brk_peer_t *const *peers, int n, int self,
                  uint64_t required, double min_heat, brk_hot_fits_fn fits, void *ctx, const brk_hot_key_t **out,
                  int max) {
    int got = 0;
    if (self < 0 || self >= n || max <= 0) return 0;
    double heat[max];
    for (int i = 0; i < h->n; i++) {
        const brk_hot_key_t *k = &h->k[i];
        double x = brk_hot_heat(k, now_ms);
        if (!k->hash || x < min_heat || !owns(k, peers, n, self, required, fits, ctx)) continue;
        /* insertion into the sorted out[0..got) */
        int at = got;
        while (at > 0 && (x > heat[at - 1] || (x == heat[at - 1] && k->hash < out[at - 1]->hash))) at--;
        if (at >= max) continue;
        int last = got < max ? got : max - 1;
        memmove(out + at + 1, out + at, (size_t)(last - at) * sizeof *out);
        memmove(heat + at + 1, heat + at, (size_t)(last - at) * sizeof *heat);
        out[at] = k;
        heat[at] = x;
        if (got < max) got++;
    }
    return got;
}
