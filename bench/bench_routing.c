/* bench_routing.c -- what rendezvous routing buys, computed with the
 * broker's own routing functions (broker/brk_route.c): total captures for
 * K keys over W workers under rendezvous routing vs round-robin (a key
 * captures once on every worker it lands on), and the share of keys that
 * move when one of W workers leaves. */
#include <stdio.h>
#include <string.h>
#include "broker/brk_route.h"

#define K 96
#define REQS_PER_KEY 20

static int owner(uint64_t key, char names[][16], int w, int skip) {
    int best = -1;
    uint64_t bs = 0;
    for (int i = 0; i < w; i++) {
        if (i == skip) continue;
        uint64_t s = brk_rendezvous_score(key, names[i]);
        if (best < 0 || s > bs) { best = i; bs = s; }
    }
    return best;
}

int main(int argc, char **argv) {
    (void)argc; (void)argv;
    uint64_t keys[K];
    for (int k = 0; k < K; k++) { /* K distinct capture keys: latent shapes x CFG */
        const int64_t lat[4] = { 16, 1 + k % 4, 8 * (1 + (k / 4) % 4), 8 * (1 + (k / 16) % 3) };
        const int64_t ctx[2] = { 16, 256 };
        keys[k] = brk_shard_hash("small", false, lat, ctx, (k / 48) % 2, 1);
    }
    int distinct = 0;
    for (int i = 0; i < K; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= keys[i] == keys[j];
        distinct += !dup;
    }
    printf("routing: %d keys (%d distinct shard hashes), %d requests each, interleaved\n", K, distinct, REQS_PER_KEY);
    for (int w = 2; w <= 8; w *= 2) {
        char names[8][16];
        for (int i = 0; i < w; i++) snprintf(names[i], sizeof names[i], "w%d", i + 1);
        static unsigned char seen_rv[K][8], seen_rr[K][8];
        memset(seen_rv, 0, sizeof seen_rv);
        memset(seen_rr, 0, sizeof seen_rr);
        int cap_rv = 0, cap_rr = 0, rr = 0, order[K];
        uint64_t rng = 0x5eed;
        for (int k = 0; k < K; k++) order[k] = k;
        for (int r = 0; r < REQS_PER_KEY; r++) {
            for (int i = K - 1; i > 0; i--) { /* requests arrive in a random order each round */
                rng = brk_splitmix64(rng);
                int j = (int)(rng % (uint64_t)(i + 1)), t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
            for (int n = 0; n < K; n++) {
                int k = order[n];
                int a = owner(keys[k], names, w, -1), b = rr++ % w;
                if (!seen_rv[k][a]) { seen_rv[k][a] = 1; cap_rv++; }
                if (!seen_rr[k][b]) { seen_rr[k][b] = 1; cap_rr++; }
            }
        }
        int moved = 0, foreign = 0;
        for (int k = 0; k < K; k++) {
            int before = owner(keys[k], names, w, -1), during = owner(keys[k], names, w, w - 1);
            if (before != during) {
                moved++;
                foreign += before != w - 1; /* a key that moved but was not the leaver's */
            }
        }
        printf("routing W=%d: captures rendezvous %d vs round-robin %d (%.2fx); one worker leaves: %d/%d keys "
               "move (%.3f, expect %.3f), %d of them were not the leaver's\n",
               w, cap_rv, cap_rr, (double)cap_rr / cap_rv, moved, K, (double)moved / K, 1.0 / w, foreign);
    }
    return 0;
}
