/* brk_hot.h -- the keys that were hot lately, for prewarm (internal
 * header; pure: no socket, clock or catalog, so every rule is unit-tested
 * in tests/test_broker_unit.c).
 *
 * Every GEN the broker accepts notes its shard key here with the shapes it
 * is made of (model, loop kind, latent, context, cfg, n). A key's heat is
 * a count of its requests that halves every BRK_HOT_HALF_LIFE_MS without
 * one. The table holds BRK_HOT_MAX keys; a new key takes the place of the
 * coldest. A worker that starts with READY `prewarm` K is sent the K
 * hottest keys it owns (brk_owner over the live workers able to run
 * them, itself included) so it captures them before their requests
 * come (docs/CAPTURE.md "Prewarm"). The table lives in the broker's
 * memory: a broker restart starts it empty. */
#ifndef REEL_BROKER_BRK_HOT_H
#define REEL_BROKER_BRK_HOT_H

#include <stdbool.h>
#include <stdint.h>

#include "broker/brk_route.h"

#define BRK_HOT_MAX 256
#define BRK_HOT_HALF_LIFE_MS (10 * 60 * 1000)

typedef struct {
    uint64_t hash;                 /* the shard hash (0: a free slot) */
    char model[BRK_NAME_MAX];
    int64_t latent[4];             /* [C, F, H, W] */
    int64_t context[2];            /* [L, T] as the key has them (L padded to text_len) */
    bool cfg;
    int loop;                      /* BRK_LOOP_* */
    unsigned needs;                /* 1u << loop | BRK_CAP_* bits: who may own it */
    int64_t n;                     /* samples of the GEN (1: single) */
    double heat;                   /* decayed request count at t_ms */
    int64_t t_ms;                  /* when heat was last brought up to date */
} brk_hot_key_t;

typedef struct {
    brk_hot_key_t k[BRK_HOT_MAX];
    int n;
} brk_hot_t;

/* One request of key (its fields but heat and t_ms) at now_ms. */
void brk_hot_note(brk_hot_t *h, const brk_hot_key_t *key, int64_t now_ms);
/* k's heat at now_ms. */
double brk_hot_heat(const brk_hot_key_t *k, int64_t now_ms);
/* Whether peers[i] takes a sample of k (its --max-tokens). */
typedef bool (*brk_hot_fits_fn)(void *ctx, int i, const brk_hot_key_t *k);

/* The hottest keys (at most max, hottest first; ties: the lower hash)
 * that peers[self] owns among peers[0..n), with heat at least min_heat.
 * Owning is routing's rule for a GEN of the key that needs version
 * `required` (the broker's current one, for a GEN that names none):
 * brk_owner among the peers able to run it, narrowed to those eligible
 * that `fits` says take its samples when any does (fits NULL: all do); a
 * self behind `required` owns nothing. Pointers into h, valid until its
 * next note. The count. */
int brk_hot_owned(const brk_hot_t *h, int64_t now_ms, const brk_peer_t *const *peers, int n, int self,
                  uint64_t required, double min_heat, brk_hot_fits_fn fits, void *ctx, const brk_hot_key_t **out,
                  int max);

#endif
