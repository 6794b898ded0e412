/* test_broker_unit.c -- the broker's pure routing rules (broker/brk_route.h):
 * rendezvous owners are stable and move only the keys of a worker that
 * leaves, eligibility by model and weight version, the bounded queue that
 * answers BUSY, recent keys and the shard hash. Then the broker in one
 * thread: each message a peer sends goes through the loop's own dispatch
 * (brk_handle), its two ROUTERs and the peers (a client or trainer,
 * workers) are inproc sockets of this process, so each step is
 * deterministic: the sync state machine (broker/brk_sync.c) and the
 * answers of docs/PROTOCOL.md (no_worker vs timeout, too_large vs BUSY,
 * what the malformed counter counts). The process-level behaviour is tested against a
 * running reel-broker elsewhere (tests/cli_sync.sh). */
#include <check.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <unistd.h>
#include <sys/stat.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "broker/brk_broker.h"
#include "broker/brk_workers.h"
#include "broker/brk_check.h"
#include "broker/brk_deliver.h"
#include "broker/brk_ha.h"
#include "broker/brk_ha_int.h"
#include "broker/brk_hot.h"
#include "broker/brk_loop.h"
#include "broker/brk_msg.h"
#include "broker/brk_refused.h"
#include "broker/brk_requests.h"
#include "broker/brk_route.h"
#include "broker/brk_sync.h"
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"
#include "broker/brk_zap.h"
#include "capture_cache/key.h"
#include "base/error.h"
#include "base/sha256.h"
#include "tests/support.h"

#define NKEYS 10000
#define MAXW 16

static brk_peer_t g_peer[MAXW];

static brk_peer_t *mk_peer(int i, const char *name, const char *models, uint64_t version) {
    brk_peer_t *p = &g_peer[i];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->routable = true;
    p->max_inflight = 2;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", models);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
        snprintf(p->models[p->n_models++], BRK_NAME_MAX, "%s", tok);
    brk_peer_set_version(p, BRK_COMPONENT, version);
    return p;
}

/* W workers "w0".."w{W-1}", all serving "small" at version 1. */
static void mk_fleet(int w, const brk_peer_t **peers) {
    for (int i = 0; i < w; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        peers[i] = mk_peer(i, name, "small", 1);
    }
}

static uint64_t key(int i) { return brk_splitmix64((uint64_t)i * 7919u + 1); }

/* Owner name of key i, "" when none. */
static const char *owner_of(const brk_peer_t **peers, int n, uint64_t k) {
    int o = brk_owner(peers, n, k, "small", 1);
    return o < 0 ? "" : peers[o]->name;
}

START_TEST(test_hash_building_blocks_are_the_published_functions) {
    ck_assert_uint_eq(cap_hash_text(""), 0xcbf29ce484222325ull); /* FNV-1a 64 */
    ck_assert_uint_eq(cap_hash_text("a"), 0xaf63dc4c8601ec8cull);
    ck_assert_uint_eq(brk_splitmix64(0), 0xe220a8397b1dcdafull);
    ck_assert_uint_eq(brk_rendezvous_score(42, "w1"), brk_splitmix64(42 ^ cap_hash_text("w1")));
    ck_assert_uint_ne(brk_rendezvous_score(42, "w1"), brk_rendezvous_score(42, "w2"));
    ck_assert_uint_ne(brk_rendezvous_score(42, "w1"), brk_rendezvous_score(43, "w1"));
}
END_TEST

/* A prompt GEN is owned only among workers with a text encoder, a decoded
 * output only among workers with a VAE, and both need both (and the
 * loop); a worker without either still runs every latent GEN. */
START_TEST(test_prompt_and_decoded_gens_are_owned_only_by_workers_that_can_do_them) {
    const brk_peer_t *all[4], *run[4];
    int idx[4];
    mk_fleet(4, all);
    static const char both[2][MSG_NAME_MAX] = { "unipc", "dpm++" };
    ((brk_peer_t *)all[0])->loops = brk_loops_from(NULL, 0);
    ((brk_peer_t *)all[1])->loops = brk_loops_from(NULL, 0) | brk_caps_from("umt5-xxl", "");
    ((brk_peer_t *)all[2])->loops = brk_loops_from(both, 2) | brk_caps_from("umt5-xxl", "wan2.1");
    ((brk_peer_t *)all[3])->loops = brk_loops_from(NULL, 0) | brk_caps_from(NULL, "wan2.1");
    ck_assert_uint_eq(brk_caps_from("", ""), 0);
    ck_assert_uint_eq(brk_caps_from(NULL, NULL), 0);
    unsigned euler = 1u << BRK_LOOP_EULER, text = 1u << BRK_CAP_PROMPT, vae = 1u << BRK_CAP_DECODE;
    ck_assert_int_eq(brk_peers_able(all, 4, euler, run, idx), 4);
    ck_assert_int_eq(brk_peers_able(all, 4, euler | text, run, idx), 2);
    ck_assert_int_eq(idx[0], 1);
    ck_assert_int_eq(idx[1], 2);
    ck_assert_int_eq(brk_peers_able(all, 4, euler | vae, run, idx), 2);
    ck_assert_int_eq(idx[0], 2);
    ck_assert_int_eq(idx[1], 3);
    ck_assert_int_eq(brk_peers_able(all, 4, euler | text | vae, run, idx), 1);
    ck_assert_int_eq(idx[0], 2);
    ck_assert_int_eq(brk_peers_able(all, 4, 1u << BRK_LOOP_UNIPC | text | vae, run, idx), 1);
    ck_assert_int_eq(brk_peers_able(all, 2, euler | vae, run, idx), 0);
}
END_TEST

/* A GEN naming a solver is owned only among workers that announced it;
 * Euler and SDE run everywhere; the solver changes the shard key (each its
 * own graphs) and the loop kind follows sde first. */
START_TEST(test_solver_gens_are_owned_only_by_workers_that_run_the_solver) {
    const brk_peer_t *all[4], *run[4];
    int idx[4];
    mk_fleet(4, all);
    static const char both[2][MSG_NAME_MAX] = { "unipc", "dpm++" }, one[1][MSG_NAME_MAX] = { "dpm++" };
    ((brk_peer_t *)all[0])->loops = brk_loops_from(NULL, 0);  /* an older worker: no solvers */
    ((brk_peer_t *)all[1])->loops = brk_loops_from(both, 2);
    ((brk_peer_t *)all[2])->loops = brk_loops_from(one, 1);
    ((brk_peer_t *)all[3])->loops = brk_loops_from(both, 2);
    ck_assert_int_eq(brk_peers_running(all, 4, BRK_LOOP_EULER, run, idx), 4);
    ck_assert_int_eq(brk_peers_running(all, 4, BRK_LOOP_SDE, run, idx), 4);
    ck_assert_int_eq(brk_peers_running(all, 4, BRK_LOOP_DPMPP, run, idx), 3);
    int n = brk_peers_running(all, 4, BRK_LOOP_UNIPC, run, idx);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(idx[0], 1);
    ck_assert_int_eq(idx[1], 3);
    for (int i = 0; i < 64; i++) {
        int o = brk_owner(run, n, key(i), "small", 1);
        ck_assert(o == 0 || o == 1);
        ck_assert(idx[o] == 1 || idx[o] == 3);
    }
    ck_assert_int_eq(brk_peers_running(all, 1, BRK_LOOP_UNIPC, run, idx), 0);
    ck_assert_int_eq(brk_loop_kind(false, ""), BRK_LOOP_EULER);
    ck_assert_int_eq(brk_loop_kind(false, "euler"), BRK_LOOP_EULER);
    ck_assert_int_eq(brk_loop_kind(true, "euler"), BRK_LOOP_SDE);
    ck_assert_int_eq(brk_loop_kind(false, "unipc"), BRK_LOOP_UNIPC);
    ck_assert_int_eq(brk_loop_kind(false, "dpm++"), BRK_LOOP_DPMPP);
    const int64_t lat[4] = { 4, 2, 8, 8 }, ctx[2] = { 5, 32 };
    uint64_t e = brk_shard_hash("tiny", BRK_LOOP_EULER, lat, ctx, true, 1),
             u = brk_shard_hash("tiny", BRK_LOOP_UNIPC, lat, ctx, true, 1),
             d = brk_shard_hash("tiny", BRK_LOOP_DPMPP, lat, ctx, true, 1);
    ck_assert(e && u && d && e != u && u != d && e != d);
}
END_TEST

START_TEST(test_shard_hash_matches_the_capture_doc_and_ignores_device_and_versions) {
    int64_t lat[4] = { 4, 2, 8, 8 }, ctx[2] = { 5, 32 };
    /* docs/CAPTURE.md: the shard form of the tiny CFG euler step */
    ck_assert_uint_eq(brk_shard_hash("tiny", false, lat, ctx, true, 1), 0xb6d4e43bdf155e32ull);
    uint64_t base = brk_shard_hash("tiny", false, lat, ctx, true, 1);
    ck_assert_uint_ne(brk_shard_hash("tiny", true, lat, ctx, true, 1), base);
    ck_assert_uint_ne(brk_shard_hash("tiny", false, lat, ctx, false, 1), base);
    ck_assert_uint_ne(brk_shard_hash("small", false, lat, ctx, true, 1), base);
    int64_t lat2[4] = { 4, 2, 8, 16 };
    ck_assert_uint_ne(brk_shard_hash("tiny", false, lat2, ctx, true, 1), base);
    /* names that could forge the key text are refused */
    ck_assert_uint_eq(brk_shard_hash("tiny model=x", false, lat, ctx, true, 1), 0);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID); /* the GEN's fault: answered bad_request */
    ck_assert_uint_eq(brk_shard_hash("", false, lat, ctx, true, 1), 0);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    /* a latent past the key's size limits is the GEN's fault too, not too_large */
    int64_t huge[4] = { INT64_MAX / 2, 4, 8, 8 };
    ck_assert_uint_eq(brk_shard_hash("tiny", false, huge, ctx, true, 1), 0);
    ck_assert_str_eq(wire_err_code_of(reel_err_code()), WIRE_E_BAD_REQUEST);
    /* every model name the protocol admits (1..55 bytes) has a key */
    char name[MSG_MODEL_NAME_MAX + 1];
    for (size_t n = 1; n < MSG_MODEL_NAME_MAX; n++) {
        memset(name, 'm', n);
        name[n] = '\0';
        ck_assert_msg(brk_shard_hash(name, false, lat, ctx, true, 1) != 0, "a %zu-byte model name: %s", n,
                      reel_err_text());
    }
    /* a group's batch is part of the key: each size its own graph, and its
     * own worker; 0 and 1 both mean one sample */
    ck_assert_uint_eq(brk_shard_hash("tiny", false, lat, ctx, true, 0), base);
    uint64_t g4 = brk_shard_hash("tiny", false, lat, ctx, true, 4), g8 = brk_shard_hash("tiny", false, lat, ctx, true, 8);
    ck_assert_uint_ne(g4, base);
    ck_assert_uint_ne(g8, g4);
    ck_assert_uint_eq(brk_shard_hash("tiny", false, lat, ctx, true, 65), 0); /* past the largest group */
    brk_shard_memo_t memo;
    memset(&memo, 0, sizeof memo);
    for (int rep = 0; rep < 2; rep++) { /* computed, then from the memo: the same */
        ck_assert_uint_eq(brk_shard_hash_memo(&memo, "tiny", false, lat, ctx, true, 4), g4);
        ck_assert_uint_eq(brk_shard_hash_memo(&memo, "tiny", false, lat, ctx, true, 1), base);
        ck_assert_uint_eq(brk_shard_hash_memo(&memo, "tiny", false, lat, ctx, true, 8), g8);
    }
}
END_TEST

START_TEST(test_same_key_same_owner_across_calls_and_worker_orderings) {
    const brk_peer_t *peers[MAXW], *shuffled[MAXW];
    int w = 7;
    mk_fleet(w, peers);
    for (int i = 0; i < w; i++) shuffled[i] = peers[(i * 3 + 5) % w]; /* a permutation of 7 */
    const brk_peer_t *reversed[MAXW];
    for (int i = 0; i < w; i++) reversed[i] = peers[w - 1 - i];
    for (int i = 0; i < NKEYS; i++) {
        const char *o = owner_of(peers, w, key(i));
        ck_assert_str_ne(o, "");
        ck_assert_str_eq(owner_of(peers, w, key(i)), o);
        ck_assert_str_eq(owner_of(shuffled, w, key(i)), o);
        ck_assert_str_eq(owner_of(reversed, w, key(i)), o);
    }
}
END_TEST

START_TEST(test_keys_spread_evenly_over_workers) {
    const brk_peer_t *peers[MAXW];
    int w = 5, count[MAXW] = { 0 };
    mk_fleet(w, peers);
    for (int i = 0; i < NKEYS; i++) count[brk_owner(peers, w, key(i), "small", 1)]++;
    for (int i = 0; i < w; i++) {
        ck_assert_msg(count[i] > NKEYS / w * 8 / 10 && count[i] < NKEYS / w * 12 / 10,
                      "worker %d owns %d of %d keys", i, count[i], NKEYS);
    }
}
END_TEST

/* Removing one of W workers moves only that worker's keys (about 1/W of
 * them), and adding it back restores every owner. */
START_TEST(test_removing_one_worker_moves_only_its_keys_and_adding_it_back_restores_them) {
    for (int w = 2; w <= 8; w += 3) {
        for (int gone = 0; gone < w; gone++) {
            const brk_peer_t *peers[MAXW], *rest[MAXW];
            mk_fleet(w, peers);
            int n = 0;
            for (int i = 0; i < w; i++)
                if (i != gone) rest[n++] = peers[i];
            static char before[NKEYS][BRK_NAME_MAX];
            int moved = 0;
            for (int i = 0; i < NKEYS; i++) {
                snprintf(before[i], BRK_NAME_MAX, "%s", owner_of(peers, w, key(i)));
                const char *after = owner_of(rest, n, key(i));
                if (strcmp(before[i], after)) {
                    moved++;
                    ck_assert_msg(!strcmp(before[i], peers[gone]->name),
                                  "key %d moved from %s (not the removed %s) to %s", i, before[i],
                                  peers[gone]->name, after);
                }
                ck_assert_str_ne(after, peers[gone]->name);
            }
            double frac = (double)moved / NKEYS, want = 1.0 / w;
            ck_assert_msg(frac > want * 0.8 && frac < want * 1.2,
                          "W=%d: %.3f of the keys moved, expected about %.3f", w, frac, want);
            /* rejoining, listed last this time: every key goes home */
            rest[n++] = peers[gone];
            for (int i = 0; i < NKEYS; i++) ck_assert_str_eq(owner_of(rest, n, key(i)), before[i]);
        }
    }
}
END_TEST

START_TEST(test_an_unroutable_worker_loses_its_keys_until_it_is_routable_again) {
    const brk_peer_t *peers[MAXW];
    int w = 4;
    mk_fleet(w, peers);
    int o = brk_owner(peers, w, key(1), "small", 1);
    g_peer[o].routable = false;
    int o2 = brk_owner(peers, w, key(1), "small", 1);
    ck_assert_int_ge(o2, 0);
    ck_assert_int_ne(o2, o);
    g_peer[o].routable = true;
    ck_assert_int_eq(brk_owner(peers, w, key(1), "small", 1), o);
}
END_TEST

START_TEST(test_eligibility_by_model_and_version) {
    const brk_peer_t *peers[3] = {
        mk_peer(0, "a", "small,tiny", 3),
        mk_peer(1, "b", "tiny", 5),
        mk_peer(2, "c", "large", 9),
    };
    ck_assert(brk_peer_serves(peers[0], "small"));
    ck_assert(!brk_peer_serves(peers[1], "small"));
    ck_assert(brk_peer_eligible(peers[0], "small", 3));
    ck_assert(!brk_peer_eligible(peers[0], "small", 4));
    ck_assert(!brk_peer_eligible(peers[2], "small", 0));
    for (int i = 0; i < 2000; i++) {
        uint64_t k = key(i);
        /* only a serves small; at version 4 nobody has it */
        ck_assert_int_eq(brk_owner(peers, 3, k, "small", 0), 0);
        ck_assert_int_eq(brk_owner(peers, 3, k, "small", 3), 0);
        ck_assert_int_eq(brk_owner(peers, 3, k, "small", 4), -1);
        /* tiny: a or b below 4, only b from 4 to 5, nobody at 6 */
        int o = brk_owner(peers, 3, k, "tiny", 2);
        ck_assert(o == 0 || o == 1);
        ck_assert_int_eq(brk_owner(peers, 3, k, "tiny", 4), 1);
        ck_assert_int_eq(brk_owner(peers, 3, k, "tiny", 5), 1);
        ck_assert_int_eq(brk_owner(peers, 3, k, "tiny", 6), -1);
        ck_assert_int_eq(brk_owner(peers, 3, k, "huge", 0), -1);
    }
    ck_assert_int_eq(brk_owner(peers, 0, key(1), "small", 0), -1);
}
END_TEST

START_TEST(test_a_worker_at_max_inflight_keeps_its_keys) {
    const brk_peer_t *peers[MAXW];
    mk_fleet(3, peers);
    int o = brk_owner(peers, 3, key(7), "small", 1);
    g_peer[o].inflight = g_peer[o].max_inflight;
    ck_assert_int_eq(brk_owner(peers, 3, key(7), "small", 1), o);
}
END_TEST

START_TEST(test_versions_are_tracked_per_component) {
    brk_peer_t p;
    memset(&p, 0, sizeof p);
    ck_assert_uint_eq(brk_peer_version(&p, "transformer"), 0);
    ck_assert_int_eq(brk_peer_set_version(&p, "transformer", 4), 0);
    ck_assert_int_eq(brk_peer_set_version(&p, "vae", 2), 0);
    ck_assert_int_eq(brk_peer_set_version(&p, "transformer", 5), 0);
    ck_assert_uint_eq(brk_peer_version(&p, "transformer"), 5);
    ck_assert_uint_eq(brk_peer_version(&p, "vae"), 2);
    ck_assert_int_eq(p.n_versions, 2);
    for (int i = 2; i < BRK_MAX_COMPONENTS; i++) {
        char n[16];
        snprintf(n, sizeof n, "c%d", i);
        ck_assert_int_eq(brk_peer_set_version(&p, n, 1), 0);
    }
    ck_assert_int_eq(brk_peer_set_version(&p, "one_too_many", 1), -1);
    ck_assert_uint_eq(brk_peer_version(&p, "one_too_many"), 0);
}
END_TEST

START_TEST(test_full_queue_refuses_new_items_and_keeps_fifo_order) {
    brk_queue_t q;
    int item[8];
    ck_assert_int_eq(brk_queue_init(&q, 3), 0);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(brk_queue_push(&q, &item[i]), 0);
    ck_assert_int_eq(brk_queue_push(&q, &item[3]), -1); /* the broker answers BUSY */
    ck_assert_uint_eq(brk_queue_len(&q), 3);
    ck_assert_ptr_eq(brk_queue_remove(&q, 1), &item[1]);
    ck_assert_ptr_eq(brk_queue_at(&q, 0), &item[0]);
    ck_assert_ptr_eq(brk_queue_at(&q, 1), &item[2]);
    ck_assert_int_eq(brk_queue_push(&q, &item[4]), 0);
    ck_assert_int_eq(brk_queue_push(&q, &item[5]), -1);
    /* a requeued request was accepted already: it goes first, past max */
    ck_assert_int_eq(brk_queue_push_front(&q, &item[6]), 0);
    ck_assert_uint_eq(brk_queue_len(&q), 4);
    int *want[] = { &item[6], &item[0], &item[2], &item[4] };
    for (int i = 0; i < 4; i++) ck_assert_ptr_eq(brk_queue_at(&q, i), want[i]);
    ck_assert_int_eq(brk_queue_push(&q, &item[7]), -1);
    while (brk_queue_len(&q)) brk_queue_remove(&q, 0);
    ck_assert_int_eq(brk_queue_push(&q, &item[7]), 0);
    brk_queue_free(&q);
    brk_queue_free(&q); /* idempotent */

    ck_assert_int_eq(brk_queue_init(&q, 0), 0);
    ck_assert_int_eq(brk_queue_push(&q, &item[0]), -1); /* --queue-max 0: never waits */
    brk_queue_free(&q);
}
END_TEST

START_TEST(test_recent_keys_move_to_front_and_keep_the_newest_32) {
    uint64_t keys[BRK_KEYS_RECENT];
    int n = 0;
    brk_keys_note(keys, &n, 1);
    brk_keys_note(keys, &n, 2);
    brk_keys_note(keys, &n, 1);
    ck_assert_int_eq(n, 2);
    ck_assert_uint_eq(keys[0], 1);
    ck_assert_uint_eq(keys[1], 2);
    for (uint64_t h = 10; h < 100; h++) brk_keys_note(keys, &n, h);
    ck_assert_int_eq(n, BRK_KEYS_RECENT);
    for (int i = 0; i < BRK_KEYS_RECENT; i++) ck_assert_uint_eq(keys[i], 99 - (uint64_t)i);
    brk_keys_note(keys, &n, 80);
    ck_assert_int_eq(n, BRK_KEYS_RECENT);
    ck_assert_uint_eq(keys[0], 80);
    ck_assert_uint_eq(keys[1], 99);
    ck_assert_uint_eq(keys[BRK_KEYS_RECENT - 1], 68);
}
END_TEST

/* ---- hot keys (prewarm) ------------------------------------------------------ */

#define HALF BRK_HOT_HALF_LIFE_MS

/* A key of `model` with hash h that needs `needs` (its shapes made up). */
static brk_hot_key_t hot_key(uint64_t h, const char *model, unsigned needs) {
    brk_hot_key_t k;
    memset(&k, 0, sizeof k);
    k.hash = h;
    snprintf(k.model, sizeof k.model, "%s", model);
    k.latent[0] = 4, k.latent[1] = 2, k.latent[2] = 8, k.latent[3] = 8;
    k.context[0] = 5, k.context[1] = 32;
    k.cfg = true;
    k.loop = BRK_LOOP_EULER;
    k.needs = needs;
    k.n = 1;
    return k;
}

/* The slot of (h, model) in t, or NULL. */
static const brk_hot_key_t *hot_find(const brk_hot_t *t, uint64_t h, const char *model) {
    for (int i = 0; i < t->n; i++)
        if (t->k[i].hash == h && !strcmp(t->k[i].model, model)) return &t->k[i];
    return NULL;
}

static const unsigned EULER = 1u << BRK_LOOP_EULER;

/* A key's heat counts its requests and halves every half-life; noting it
 * again adds one to what is left; its shapes are kept; hash 0 is no key;
 * the same hash of another model is another key. */
START_TEST(test_a_hot_key_counts_its_requests_and_halves_every_half_life) {
    static brk_hot_t t;
    memset(&t, 0, sizeof t);
    const int64_t t0 = 5000;
    brk_hot_key_t a = hot_key(0xa11ce, "small", EULER);
    a.n = 4;
    a.loop = BRK_LOOP_UNIPC;
    for (int i = 0; i < 3; i++) brk_hot_note(&t, &a, t0);
    ck_assert_int_eq(t.n, 1);
    const brk_hot_key_t *k = hot_find(&t, 0xa11ce, "small");
    ck_assert_ptr_nonnull(k);
    ck_assert(brk_hot_heat(k, t0) == 3.0);
    ck_assert(brk_hot_heat(k, t0 - 1) == 3.0); /* a clock read before the note: not hotter */
    ck_assert(brk_hot_heat(k, t0 + HALF) == 1.5);
    ck_assert(brk_hot_heat(k, t0 + 2 * HALF) == 0.75);
    ck_assert(brk_hot_heat(k, t0 + HALF / 2) < 3.0 && brk_hot_heat(k, t0 + HALF / 2) > 1.5);
    ck_assert_int_eq(k->n, 4);
    ck_assert_int_eq(k->loop, BRK_LOOP_UNIPC);
    ck_assert_int_eq(k->latent[3], 8);
    ck_assert_int_eq(k->context[1], 32);
    brk_hot_note(&t, &a, t0 + HALF); /* 1.5 left, and one more */
    ck_assert_int_eq(t.n, 1);
    ck_assert(brk_hot_heat(k, t0 + HALF) == 2.5);
    ck_assert(brk_hot_heat(k, t0 + 2 * HALF) == 1.25);

    brk_hot_key_t z = hot_key(0, "small", EULER);
    brk_hot_note(&t, &z, t0);
    ck_assert_int_eq(t.n, 1);
    ck_assert(brk_hot_heat(&z, t0) == 0);
    brk_hot_key_t other = hot_key(0xa11ce, "tiny", EULER);
    brk_hot_note(&t, &other, t0 + HALF);
    ck_assert_int_eq(t.n, 2);
    ck_assert(brk_hot_heat(hot_find(&t, 0xa11ce, "tiny"), t0 + HALF) == 1.0);
    ck_assert(brk_hot_heat(hot_find(&t, 0xa11ce, "small"), t0 + HALF) == 2.5);
}
END_TEST

/* A full table gives the slot of its coldest key (heat decayed to now) to
 * a new one, never a hotter key's. */
START_TEST(test_a_full_hot_table_gives_a_new_key_the_coldest_slot) {
    static brk_hot_t t;
    memset(&t, 0, sizeof t);
    const int64_t t0 = 1000;
    for (int i = 0; i < BRK_HOT_MAX; i++) {
        brk_hot_key_t k = hot_key(key(i), "small", EULER);
        brk_hot_note(&t, &k, t0);
        if (i != 17) brk_hot_note(&t, &k, t0);
    }
    ck_assert_int_eq(t.n, BRK_HOT_MAX);
    brk_hot_key_t x = hot_key(key(BRK_HOT_MAX), "small", EULER), y = hot_key(key(BRK_HOT_MAX + 1), "small", EULER);
    brk_hot_note(&t, &x, t0);
    ck_assert_int_eq(t.n, BRK_HOT_MAX);
    ck_assert_ptr_null(hot_find(&t, key(17), "small"));
    ck_assert_ptr_nonnull(hot_find(&t, key(BRK_HOT_MAX), "small"));
    for (int i = 0; i < BRK_HOT_MAX; i++)
        if (i != 17) ck_assert_msg(hot_find(&t, key(i), "small") != NULL, "key %d (heat 2) was replaced", i);
    /* now x (heat 1) is the coldest: y takes its slot, the heat-2 keys stay */
    brk_hot_note(&t, &y, t0);
    ck_assert_ptr_null(hot_find(&t, key(BRK_HOT_MAX), "small"));
    ck_assert_ptr_nonnull(hot_find(&t, key(BRK_HOT_MAX + 1), "small"));
    for (int i = 0; i < BRK_HOT_MAX; i++)
        if (i != 17) ck_assert_msg(hot_find(&t, key(i), "small") != NULL, "key %d (heat 2) was replaced", i);
    /* coldest by heat now: key 5 noted 10 times long ago decays below keys
     * noted once lately */
    memset(&t, 0, sizeof t);
    for (int i = 0; i < BRK_HOT_MAX; i++) {
        brk_hot_key_t k = hot_key(key(i), "small", EULER);
        int64_t when = i == 5 ? t0 : t0 + 10 * (int64_t)HALF;
        for (int r = 0; r < (i == 5 ? 10 : 1); r++) brk_hot_note(&t, &k, when);
    }
    brk_hot_note(&t, &x, t0 + 10 * (int64_t)HALF);
    ck_assert_ptr_null(hot_find(&t, key(5), "small"));
    ck_assert_ptr_nonnull(hot_find(&t, key(BRK_HOT_MAX), "small"));
    ck_assert_int_eq(t.n, BRK_HOT_MAX);
}
END_TEST

/* out[0..n) is hottest first, ties the lower hash first. */
static void expect_sorted(const brk_hot_key_t **out, int n, int64_t now) {
    for (int i = 1; i < n; i++) {
        double a = brk_hot_heat(out[i - 1], now), b = brk_hot_heat(out[i], now);
        ck_assert_msg(a > b || (a == b && out[i - 1]->hash < out[i]->hash),
                      "out[%d] (heat %g, %016llx) before out[%d] (heat %g, %016llx)", i - 1, a,
                      (unsigned long long)out[i - 1]->hash, i, b, (unsigned long long)out[i]->hash);
    }
}

/* The version a GEN of the tests' keys needs: self's own, so that (as
 * before the broker passed its current one) a worker behind self does not
 * count and one ahead does; 0 for a self out of range. */
static uint64_t hot_req(const brk_peer_t *const *peers, int n, int self) {
    return self >= 0 && self < n ? brk_peer_version(peers[self], BRK_COMPONENT) : 0;
}

/* Is k among out[0..n)? */
static bool hot_in(const brk_hot_key_t *const *out, int n, const brk_hot_key_t *k) {
    for (int i = 0; i < n; i++)
        if (out[i] == k) return true;
    return false;
}

/* With one worker, the order: hottest first, a key noted again moves up,
 * equal heats by hash; max and min_heat cut the list. */
START_TEST(test_hot_keys_are_listed_hottest_first_and_a_key_noted_again_moves_up) {
    static brk_hot_t t;
    memset(&t, 0, sizeof t);
    const brk_peer_t *peers[1] = { mk_peer(0, "w0", "small", 1) };
    g_peer[0].loops = brk_loops_from(NULL, 0);
    const int64_t t0 = 100;
    brk_hot_key_t a = hot_key(0x30, "small", EULER), b = hot_key(0x20, "small", EULER),
                  c = hot_key(0x10, "small", EULER);
    brk_hot_note(&t, &a, t0);
    brk_hot_note(&t, &b, t0);
    brk_hot_note(&t, &b, t0);
    brk_hot_note(&t, &c, t0);
    const brk_hot_key_t *out[8];
    ck_assert_int_eq(brk_hot_owned(&t, t0, peers, 1, 0, hot_req(peers, 1, 0), 0, NULL, NULL, out, 8), 3);
    ck_assert_uint_eq(out[0]->hash, 0x20); /* heat 2 */
    ck_assert_uint_eq(out[1]->hash, 0x10); /* heat 1, the lower hash */
    ck_assert_uint_eq(out[2]->hash, 0x30);
    /* a noted twice more: first */
    brk_hot_note(&t, &a, t0 + 10);
    brk_hot_note(&t, &a, t0 + 10);
    ck_assert_int_eq(brk_hot_owned(&t, t0 + 10, peers, 1, 0, hot_req(peers, 1, 0), 0, NULL, NULL, out, 8), 3);
    ck_assert_uint_eq(out[0]->hash, 0x30);
    ck_assert_uint_eq(out[1]->hash, 0x20);
    ck_assert_uint_eq(out[2]->hash, 0x10);
    expect_sorted(out, 3, t0 + 10);
    /* max: the hottest max of them */
    ck_assert_int_eq(brk_hot_owned(&t, t0 + 10, peers, 1, 0, hot_req(peers, 1, 0), 0, NULL, NULL, out, 2), 2);
    ck_assert_uint_eq(out[0]->hash, 0x30);
    ck_assert_uint_eq(out[1]->hash, 0x20);
    ck_assert_int_eq(brk_hot_owned(&t, t0 + 10, peers, 1, 0, hot_req(peers, 1, 0), 0, NULL, NULL, out, 1), 1);
    ck_assert_uint_eq(out[0]->hash, 0x30);
    ck_assert_int_eq(brk_hot_owned(&t, t0 + 10, peers, 1, 0, hot_req(peers, 1, 0), 0, NULL, NULL, out, 0), 0);
    /* min_heat: a (~3) and b (~2) are at least 1.5, c (~1) is not; a
     * half-life later only a is still over 1.4 */
    ck_assert_int_eq(brk_hot_owned(&t, t0 + 10, peers, 1, 0, hot_req(peers, 1, 0), 1.5, NULL, NULL, out, 8), 2);
    ck_assert_uint_eq(out[0]->hash, 0x30);
    ck_assert_uint_eq(out[1]->hash, 0x20);
    ck_assert_int_eq(brk_hot_owned(&t, t0 + 10 + HALF, peers, 1, 0, hot_req(peers, 1, 0), 1.4, NULL, NULL, out, 8), 1);
    ck_assert_uint_eq(out[0]->hash, 0x30);
    ck_assert_int_eq(brk_hot_owned(&t, t0 + 10, peers, 1, 0, hot_req(peers, 1, 0), 100, NULL, NULL, out, 8), 0);
    /* self out of range, or unable to take work: nothing */
    ck_assert_int_eq(brk_hot_owned(&t, t0, peers, 1, 1, hot_req(peers, 1, 1), 0, NULL, NULL, out, 8), 0);
    ck_assert_int_eq(brk_hot_owned(&t, t0, peers, 1, -1, hot_req(peers, 1, -1), 0, NULL, NULL, out, 8), 0);
    g_peer[0].routable = false;
    ck_assert_int_eq(brk_hot_owned(&t, t0, peers, 1, 0, hot_req(peers, 1, 0), 0, NULL, NULL, out, 8), 0);
}
END_TEST

/* With 3 workers each is listed exactly the hot keys brk_owner gives it
 * (checked key by key over many random ones), hottest first; max keeps
 * the hottest of them and min_heat drops the cooler. */
START_TEST(test_hot_keys_a_worker_is_listed_are_exactly_those_it_owns) {
    static brk_hot_t t;
    const brk_peer_t *peers[3];
    mk_fleet(3, peers);
    for (int i = 0; i < 3; i++) g_peer[i].loops = brk_loops_from(NULL, 0);
    const int64_t t0 = 777;
    uint64_t rs = 0x5eedull;
    int total_keys = 0;
    for (int round = 0; round < 4; round++) {
        memset(&t, 0, sizeof t);
        for (int i = 0; i < 200; i++) {
            rs = brk_splitmix64(rs);
            brk_hot_key_t k = hot_key(rs | 1, "small", EULER);
            for (int r = 0; r <= i % 5; r++) brk_hot_note(&t, &k, t0 - (int64_t)(i % 3) * 1000);
        }
        ck_assert_int_eq(t.n, 200);
        total_keys += t.n;
        int listed = 0;
        for (int self = 0; self < 3; self++) {
            const brk_hot_key_t *out[BRK_HOT_MAX], *top[7], *warm[BRK_HOT_MAX];
            int n = brk_hot_owned(&t, t0, peers, 3, self, hot_req(peers, 3, self), 0, NULL, NULL, out, BRK_HOT_MAX);
            listed += n;
            int mine = 0;
            for (int i = 0; i < t.n; i++) {
                bool owns = brk_owner(peers, 3, t.k[i].hash, "small", 1) == self;
                mine += owns;
                ck_assert_msg(owns == hot_in(out, n, &t.k[i]), "key %016llx: owner %d, listed for w%d: %d",
                              (unsigned long long)t.k[i].hash, brk_owner(peers, 3, t.k[i].hash, "small", 1), self,
                              hot_in(out, n, &t.k[i]));
            }
            ck_assert_int_eq(n, mine);
            ck_assert_int_gt(n, 30); /* about a third each */
            expect_sorted(out, n, t0);
            /* max 7: the first 7 of the whole list */
            ck_assert_int_eq(brk_hot_owned(&t, t0, peers, 3, self, hot_req(peers, 3, self), 0, NULL, NULL, top, 7), 7);
            for (int i = 0; i < 7; i++) ck_assert_ptr_eq(top[i], out[i]);
            /* min_heat 3: exactly the listed ones at least that hot */
            int hot3 = 0;
            for (int i = 0; i < n; i++) hot3 += brk_hot_heat(out[i], t0) >= 3.0;
            int w = brk_hot_owned(&t, t0, peers, 3, self, hot_req(peers, 3, self), 3.0, NULL, NULL, warm, BRK_HOT_MAX);
            ck_assert_int_eq(w, hot3);
            ck_assert_int_gt(w, 0);
            ck_assert_int_lt(w, n);
            for (int i = 0; i < w; i++) ck_assert_ptr_eq(warm[i], out[i]);
        }
        ck_assert_int_eq(listed, t.n); /* every key listed once, to its owner */
    }
    ck_assert_int_eq(total_keys, 800);
}
END_TEST

/* A key is owned among the workers able to run it (its loop, a prompt):
 * a worker without unipc is never listed a unipc key, even one it would
 * own among all; with nobody able, nobody is. The version required is the
 * one self runs: a worker behind it does not count, one ahead does. A
 * worker that does not serve the key's model is never listed it. */
START_TEST(test_hot_keys_go_only_to_workers_able_to_run_them_at_their_version) {
    static brk_hot_t t;
    memset(&t, 0, sizeof t);
    const brk_peer_t *peers[3];
    mk_fleet(3, peers);
    static const char both[2][MSG_NAME_MAX] = { "unipc", "dpm++" };
    g_peer[0].loops = brk_loops_from(NULL, 0);                   /* euler and sde only */
    g_peer[1].loops = brk_loops_from(both, 2);
    g_peer[2].loops = brk_loops_from(both, 2) | brk_caps_from("umt5-xxl", "");
    const unsigned unipc = 1u << BRK_LOOP_UNIPC, prompt = 1u << BRK_CAP_PROMPT;
    const int64_t t0 = 0;
    for (int i = 0; i < 150; i++) {
        brk_hot_key_t k = hot_key(key(i), "small", i % 3 == 0 ? EULER : i % 3 == 1 ? unipc : EULER | prompt);
        k.loop = i % 3 == 1 ? BRK_LOOP_UNIPC : BRK_LOOP_EULER;
        brk_hot_note(&t, &k, t0);
    }
    const brk_hot_key_t *out[3][BRK_HOT_MAX];
    int n[3];
    for (int s = 0; s < 3; s++) n[s] = brk_hot_owned(&t, t0, peers, 3, s, hot_req(peers, 3, s), 0, NULL, NULL, out[s], BRK_HOT_MAX);
    ck_assert_int_eq(n[0] + n[1] + n[2], 150);
    int w0_would = 0;
    for (int i = 0; i < t.n; i++) {
        const brk_hot_key_t *k = &t.k[i];
        const brk_peer_t *able[3];
        int idx[3];
        int m = brk_peers_able(peers, 3, k->needs, able, idx);
        int o = brk_owner(able, m, k->hash, "small", 1);
        ck_assert_int_ge(o, 0);
        for (int s = 0; s < 3; s++) ck_assert(hot_in(out[s], n[s], k) == (idx[o] == s));
        if (k->needs != EULER) {
            ck_assert(!hot_in(out[0], n[0], k));
            if (brk_owner(peers, 3, k->hash, "small", 1) == 0) w0_would++;
        }
        if (k->needs & prompt) ck_assert(hot_in(out[2], n[2], k));
    }
    ck_assert_int_gt(w0_would, 0); /* keys w0 would own among all went to others */
    /* with w0 alone nobody can run the unipc and prompt keys */
    const brk_hot_key_t *alone[BRK_HOT_MAX];
    ck_assert_int_eq(brk_hot_owned(&t, t0, peers, 1, 0, hot_req(peers, 1, 0), 0, NULL, NULL, alone, BRK_HOT_MAX), 50);
    for (int i = 0; i < 50; i++) ck_assert_uint_eq(alone[i]->needs, EULER);

    /* versions: w0 at 1, w1 and w2 at 2 */
    brk_peer_set_version(&g_peer[1], BRK_COMPONENT, 2);
    brk_peer_set_version(&g_peer[2], BRK_COMPONENT, 2);
    for (int s = 0; s < 3; s++) n[s] = brk_hot_owned(&t, t0, peers, 3, s, hot_req(peers, 3, s), 0, NULL, NULL, out[s], BRK_HOT_MAX);
    int both_claim = 0;
    for (int i = 0; i < t.n; i++) {
        const brk_hot_key_t *k = &t.k[i];
        const brk_peer_t *able[3];
        int idx[3];
        int m = brk_peers_able(peers, 3, k->needs, able, idx);
        for (int s = 0; s < 3; s++) {
            uint64_t v = brk_peer_version(&g_peer[s], BRK_COMPONENT);
            int o = brk_owner(able, m, k->hash, "small", v);
            ck_assert(hot_in(out[s], n[s], k) == (o >= 0 && idx[o] == s));
        }
        /* w0 (v1) still counts w1 and w2, but they do not count w0 */
        if (hot_in(out[0], n[0], k)) {
            ck_assert(hot_in(out[1], n[1], k) || hot_in(out[2], n[2], k));
            both_claim++;
        }
    }
    ck_assert_int_gt(both_claim, 0);
    ck_assert_int_eq(n[1] + n[2], 150); /* among the v2 workers every key has its owner */
    /* the broker's current version is 2: w0, behind it (its sync failed),
     * owns nothing, as no GEN without a version would be routed to it */
    ck_assert_int_eq(brk_hot_owned(&t, t0, peers, 3, 0, 2, 0, NULL, NULL, out[0], BRK_HOT_MAX), 0);
    ck_assert_int_eq(brk_hot_owned(&t, t0, peers, 3, 1, 2, 0, NULL, NULL, out[1], BRK_HOT_MAX) +
                         brk_hot_owned(&t, t0, peers, 3, 2, 2, 0, NULL, NULL, out[2], BRK_HOT_MAX), 150);

    /* another model: only the worker serving it */
    memset(&t, 0, sizeof t);
    snprintf(g_peer[1].models[g_peer[1].n_models++], BRK_NAME_MAX, "tiny");
    for (int i = 0; i < 20; i++) {
        brk_hot_key_t k = hot_key(key(i), "tiny", EULER);
        brk_hot_note(&t, &k, t0);
    }
    for (int s = 0; s < 3; s++)
        ck_assert_int_eq(brk_hot_owned(&t, t0, peers, 3, s, hot_req(peers, 3, s), 0, NULL, NULL, out[s], BRK_HOT_MAX), s == 1 ? 20 : 0);
}
END_TEST

/* The --max-tokens of each test peer (0: none), and a fits test on them:
 * a key's tokens here are F x H x W of its latent (patch 1). */
static int64_t g_bound[3];
static bool fits_bound(void *ctx, int i, const brk_hot_key_t *k) {
    ck_assert_ptr_eq(ctx, g_bound);
    return g_bound[i] <= 0 || k->latent[1] * k->latent[2] * k->latent[3] <= g_bound[i];
}

/* Prewarm ownership is routing's (brk_requests.c, fitting): a key whose
 * samples are too large for a worker's --max-tokens goes to the owner
 * among the workers it fits, so no worker prewarms a key it would never
 * be sent; when it fits none, the owner among all keeps it (the GEN goes
 * there and is answered too_large). Small keys are untouched. */
START_TEST(test_hot_keys_go_to_the_owner_among_the_workers_their_samples_fit) {
    static brk_hot_t t;
    memset(&t, 0, sizeof t);
    const brk_peer_t *peers[3];
    mk_fleet(3, peers);
    for (int i = 0; i < 3; i++) g_peer[i].loops = brk_loops_from(NULL, 0);
    const int64_t t0 = 0;
    for (int i = 0; i < 120; i++) {
        brk_hot_key_t k = hot_key(key(i), "small", EULER);
        if (i % 2) k.latent[2] = k.latent[3] = 64; /* 2 x 64 x 64 = 8192 tokens: big */
        brk_hot_note(&t, &k, t0);
    }
    const brk_hot_key_t *out[3][BRK_HOT_MAX];
    int n[3];
    g_bound[0] = 1000, g_bound[1] = 0, g_bound[2] = 0; /* w0 takes only the small ones */
    for (int s = 0; s < 3; s++) n[s] = brk_hot_owned(&t, t0, peers, 3, s, hot_req(peers, 3, s), 0, fits_bound, g_bound, out[s], BRK_HOT_MAX);
    ck_assert_int_eq(n[0] + n[1] + n[2], 120);
    int moved = 0;
    for (int i = 0; i < t.n; i++) {
        const brk_hot_key_t *k = &t.k[i];
        bool big = k->latent[2] == 64;
        int among_all = brk_owner(peers, 3, k->hash, "small", 1);
        int o = among_all;
        if (big) o = 1 + brk_owner(peers + 1, 2, k->hash, "small", 1); /* w1 or w2 */
        for (int s = 0; s < 3; s++)
            ck_assert_msg(hot_in(out[s], n[s], k) == (o == s), "key %d (%s): owner w%d, listed for w%d: %d", i,
                          big ? "big" : "small", o, s, hot_in(out[s], n[s], k));
        if (big) ck_assert(!hot_in(out[0], n[0], k));
        moved += big && among_all == 0;
    }
    ck_assert_int_gt(moved, 0); /* big keys w0 would own among all went to w1 and w2 */
    /* nobody fits the big ones: the owner among all keeps them */
    g_bound[0] = g_bound[1] = g_bound[2] = 1000;
    for (int s = 0; s < 3; s++) n[s] = brk_hot_owned(&t, t0, peers, 3, s, hot_req(peers, 3, s), 0, fits_bound, g_bound, out[s], BRK_HOT_MAX);
    for (int i = 0; i < t.n; i++)
        for (int s = 0; s < 3; s++)
            ck_assert(hot_in(out[s], n[s], &t.k[i]) == (brk_owner(peers, 3, t.k[i].hash, "small", 1) == s));
    /* a worker behind the version self runs is no candidate, even one the
     * key fits: w1 at v1 while w2 (self) runs v2 and fits none of the big */
    brk_peer_set_version(&g_peer[2], BRK_COMPONENT, 2);
    g_bound[0] = 1000, g_bound[1] = 0, g_bound[2] = 1000;
    n[2] = brk_hot_owned(&t, t0, peers, 3, 2, hot_req(peers, 3, 2), 0, fits_bound, g_bound, out[2], BRK_HOT_MAX);
    for (int i = 0; i < t.n; i++) {
        const brk_hot_key_t *k = &t.k[i];
        /* at v2 only w2 is eligible: it owns every key, big ones too (no
         * eligible worker fits them) */
        ck_assert(hot_in(out[2], n[2], k));
    }
}
END_TEST

/* brk_worker_fits, the one rule routing (fitting) and prewarm
 * ownership (hot_fits) share: a sample's tokens F x H/p x W/p with the
 * patch of the worker's config of the model, against its --max-tokens;
 * no bound, or no config of the model, fits. */
START_TEST(test_a_worker_fits_a_sample_by_its_tokens_under_its_patch) {
    static brk_worker_t w;
    memset(&w, 0, sizeof w);
    w.n_configs = 2;
    snprintf(w.configs[0].name, sizeof w.configs[0].name, "small");
    w.configs[0].patch = 2;
    snprintf(w.configs[1].name, sizeof w.configs[1].name, "wan");
    w.configs[1].patch = 4;
    const int64_t lat[4] = { 16, 4, 16, 16 }; /* small: 4 x 8 x 8 = 256 tokens; wan: 4 x 4 x 4 = 64 */
    w.max_tokens = 0;
    ck_assert(brk_worker_fits(&w, "small", lat)); /* no bound */
    w.max_tokens = 256;
    ck_assert(brk_worker_fits(&w, "small", lat)); /* exactly its bound */
    w.max_tokens = 255;
    ck_assert(!brk_worker_fits(&w, "small", lat));
    w.max_tokens = 64;
    ck_assert(brk_worker_fits(&w, "wan", lat)); /* the model's own patch */
    ck_assert(!brk_worker_fits(&w, "small", lat));
    ck_assert(brk_worker_fits(&w, "other", lat)); /* no config: not judged */
    w.configs[0].patch = 0;
    ck_assert(brk_worker_fits(&w, "small", lat)); /* a config without its patch: not judged */
}
END_TEST

/* ---- the sync state machine ------------------------------------------------ */

#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define NBOXW 3

/* A broker with no loop: its handlers run when a test delivers a message. */
typedef struct {
    brk_t b;
    void *trainer;
    void *w[NBOXW];   /* DEALERs named w0, w1, w2 */
} box_t;

static void *sock(void *ctx, int type) {
    void *s = zmq_socket(ctx, type);
    ck_assert_ptr_nonnull(s);
    int linger = 0, tmo = 2000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    return s;
}

/* The next message on s (a ROUTER when router), within 2 s, with its
 * header as a value tree: what a client written from the page reads. */
static wire_msg_t *take(void *s, bool router) {
    wire_msg_t *m = calloc(1, sizeof *m);
    wire_err_t err;
    ck_assert_ptr_nonnull(m);
    ck_assert_msg(wire_recv(s, router, 0, m, &err) == 0, "no message: %s", zmq_strerror(zmq_errno()));
    return m;
}

static void drop_msg(wire_msg_t **m) {
    if (!*m) return;
    wire_msg_close(*m);
    free(*m);
    *m = NULL;
}

/* True when a message waits on s (s is drained of it). */
static bool has_msg(void *s, const char *type) {
    zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
    if (zmq_poll(&it, 1, 50) <= 0) return false;
    wire_msg_t *m = take(s, false);
    bool same = !strcmp(m->type, type);
    drop_msg(&m);
    return same;
}

/* The next message on the broker's worker or client socket, handled by
 * the loop's dispatch as the running broker would. */
static void deliver(box_t *x, bool worker_side) {
    wire_msg_t *m = calloc(1, sizeof *m);
    wire_err_t err;
    int rc = msg_recv(worker_side ? x->b.workers : x->b.clients, true, 0, m, &err);
    ck_assert_int_ge(rc, 0);
    brk_handle(&x->b, worker_side, &m, rc, &err);
    drop_msg(&m); /* still here unless the broker kept it */
}

/* Worker i's message hdr, delivered to the broker. */
static void from_worker(box_t *x, int i, wire_val_t *hdr) {
    ck_assert_int_eq(wire_send(x->w[i], NULL, hdr, NULL, 0), 0);
    wv_free(&hdr);
    deliver(x, true);
}

/* READY of worker i serving tiny at `version`, with `slots` requests at
 * once (0: max_inflight left out, the broker's default). */
static void ready_as(box_t *x, int i, uint64_t version, uint64_t slots, bool vae) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    wire_val_t *h = wire_hdr("READY", 0), *models = wv_arr(), *vers = wv_map();
    wv_push(models, wv_str("tiny"));
    wv_set(vers, "transformer", wv_u64(version));
    wv_set(h, "name", wv_str(name));
    wv_set(h, "models", models);
    wv_set(h, "versions", vers);
    if (slots) wv_set(h, "max_inflight", wv_u64(slots));
    if (vae) wv_set(h, "vae", wv_str("wan2.1"));
    from_worker(x, i, h);
}

static void ready_with(box_t *x, int i, uint64_t version, uint64_t slots) { ready_as(x, i, version, slots, false); }

static void ready(box_t *x, int i, uint64_t version) { ready_with(x, i, version, 0); }

/* READY of worker i serving tiny at v1 with a VAE (it takes GENs asking
 * for decoded output). */
static void ready_vae(box_t *x, int i) { ready_as(x, i, 1, 0, true); }

static void box_open(box_t *x) {
    memset(x, 0, sizeof *x);
    x->b.next_id = 1;
    x->b.opt.sync_deadline_ms = 30000;
    x->b.opt.request_deadline_ms = 60000;
    x->b.opt.max_held_bytes = (uint64_t)1 << 30;
    x->b.opt.max_fetch_bytes = (uint64_t)512 << 20;
    ck_assert_int_eq(brk_queue_init(&x->b.queue, 8), 0);
    ck_assert_ptr_nonnull(x->b.ctx = zmq_ctx_new());
    x->b.clients = sock(x->b.ctx, ZMQ_ROUTER);
    x->b.workers = sock(x->b.ctx, ZMQ_ROUTER);
    int one = 1;
    zmq_setsockopt(x->b.workers, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    ck_assert_int_eq(zmq_bind(x->b.clients, "inproc://clients"), 0);
    ck_assert_int_eq(zmq_bind(x->b.workers, "inproc://workers"), 0);
    x->trainer = sock(x->b.ctx, ZMQ_DEALER);
    ck_assert_int_eq(zmq_connect(x->trainer, "inproc://clients"), 0);
    for (int i = 0; i < NBOXW; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        x->w[i] = sock(x->b.ctx, ZMQ_DEALER);
        zmq_setsockopt(x->w[i], ZMQ_ROUTING_ID, name, strlen(name));
        ck_assert_int_eq(zmq_connect(x->w[i], "inproc://workers"), 0);
    }
}

static void box_close(box_t *x) {
    brk_req_shutdown(&x->b);
    brk_sync_shutdown(&x->b);
    brk_deliver_stop(&x->b);
    brk_msg_pool_free(&x->b);
    brk_workers_free_events(&x->b);
    brk_queue_free(&x->b.queue);
    for (int i = 0; i < x->b.n_w; i++) free(x->b.w[i]);
    free(x->b.w);
    zmq_close(x->trainer);
    for (int i = 0; i < NBOXW; i++) zmq_close(x->w[i]);
    zmq_close(x->b.clients);
    zmq_close(x->b.workers);
    zmq_ctx_term(x->b.ctx);
}

/* The trainer sends its SYNC (not handled yet). */
static void trainer_sends_sync(box_t *x, uint64_t id, uint64_t version, const char *sha) {
    wire_val_t *h = wire_hdr("SYNC", id);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(version));
    wv_set(h, "sha256", wv_str(sha));
    wv_set(h, "path", wv_str("/w/x.safetensors"));
    ck_assert_int_eq(wire_send(x->trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
}

/* The trainer's SYNC, handled by the broker. */
static void trainer_sync(box_t *x, uint64_t id, uint64_t version, const char *sha) {
    trainer_sends_sync(x, id, version, sha);
    deliver(x, false);
}

/* Worker i receives a SYNC of `version`. */
static void expect_sync(box_t *x, int i, uint64_t version) {
    wire_msg_t *m = take(x->w[i], false);
    uint64_t v = 0;
    ck_assert_str_eq(m->type, "SYNC");
    ck_assert(wv_get_u64(m->hdr, "version", &v));
    ck_assert_uint_eq(v, version);
    drop_msg(&m);
}

static void ack(box_t *x, int i, uint64_t version, const char *error) {
    wire_val_t *h = wire_hdr("SYNC_ACK", 0);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(version));
    wv_set(h, "ok", wv_bool(error == NULL));
    if (error) wv_set(h, "error", wv_str(error));
    from_worker(x, i, h);
}

/* The trainer's next answer (caller frees). */
static wire_msg_t *answer(box_t *x) { return take(x->trainer, false); }

static bool done_complete(const wire_msg_t *m) {
    bool c = true;
    ck_assert_str_eq(m->type, "SYNC_DONE");
    ck_assert(wv_get_bool(m->hdr, "complete", &c));
    return c;
}

static uint64_t u64_of(const wire_msg_t *m, const char *k) {
    uint64_t v = 0;
    ck_assert_msg(wv_get_u64(m->hdr, k, &v), "no %s", k);
    return v;
}

static const char *lag_of(box_t *x, int i, char *buf, size_t len) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    brk_worker_t *w = brk_worker_named(&x->b, name);
    ck_assert_ptr_nonnull(w);
    return brk_sync_lag(&x->b, w, "transformer", buf, len);
}

START_TEST(test_a_sync_becomes_current_only_once_a_worker_applied_it) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    ready(&x, 1, 1);
    trainer_sync(&x, 7, 2, SHA_A);
    expect_sync(&x, 0, 2);
    expect_sync(&x, 1, 2);
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 0); /* pending */
    ack(&x, 1, 2, "cannot open /w/x.safetensors");
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 0);
    ack(&x, 0, 2, NULL);
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 2);
    wire_msg_t *d = answer(&x);
    ck_assert_uint_eq(d->id, 7);
    ck_assert(!done_complete(d));
    ck_assert_uint_eq(u64_of(d, "current"), 2);
    const wire_val_t *f = wv_at(wv_get(d->hdr, "failed"), 0);
    ck_assert_str_eq(wv_get_str(f, "worker"), "w1");
    ck_assert_str_eq(wv_get_str(f, "reason"), "cannot open /w/x.safetensors");
    drop_msg(&d);
    /* w1 lags, with its reason; w0 does not */
    char why[192];
    ck_assert_ptr_null(lag_of(&x, 0, why, sizeof why));
    ck_assert_ptr_nonnull(lag_of(&x, 1, why, sizeof why));
    ck_assert_str_eq(why, "v2: cannot open /w/x.safetensors");
    /* a worker joining now is caught up to v2 */
    ready(&x, 2, 1);
    expect_sync(&x, 2, 2);
    ck_assert_str_eq(lag_of(&x, 2, why, sizeof why), "applying v2");
    box_close(&x);
}
END_TEST

START_TEST(test_a_sync_no_worker_applied_changes_nothing_and_lists_every_reason) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    ready(&x, 1, 1);
    trainer_sync(&x, 1, 2, SHA_A);
    expect_sync(&x, 0, 2);
    expect_sync(&x, 1, 2);
    ack(&x, 0, 2, NULL);
    ack(&x, 1, 2, NULL);
    wire_msg_t *d = answer(&x);
    ck_assert(done_complete(d));
    drop_msg(&d);

    trainer_sync(&x, 2, 3, SHA_B);
    expect_sync(&x, 0, 3);
    expect_sync(&x, 1, 3);
    ack(&x, 0, 3, "not a transformer");
    /* a reason as long as an adapter's refusal gets (path and key name,
     * past 127 bytes: helper-90 saw the key cut off), whole */
    char longwhy[MSG_REASON_MAX];
    snprintf(longwhy, sizeof longwhy, "bad_adapter: /srv/trainer/run-42/checkpoints/adapter-step-000200/%s: "
             "base_model.model.blocks.1.cross_attn.v.lora_B.weight: NaN or infinite values",
             "adapter_model.safetensors");
    ck_assert_uint_gt(strlen(longwhy), 160);
    ack(&x, 1, 3, longwhy);
    d = answer(&x);
    ck_assert(!done_complete(d));
    ck_assert_uint_eq(u64_of(d, "current"), 2);
    ck_assert_uint_eq(wv_len(wv_get(d->hdr, "applied")), 0);
    ck_assert_uint_eq(wv_len(wv_get(d->hdr, "failed")), 2);
    ck_assert_str_eq(wv_get_str(wv_at(wv_get(d->hdr, "failed"), 0), "reason"), "not a transformer");
    ck_assert_str_eq(wv_get_str(wv_at(wv_get(d->hdr, "failed"), 1), "reason"), longwhy);
    drop_msg(&d);
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 2);
    char why[192];
    ck_assert_ptr_null(lag_of(&x, 0, why, sizeof why)); /* nobody lags behind a failed version */
    /* a late joiner gets v2, the current SYNC, never v3 */
    ready(&x, 2, 1);
    expect_sync(&x, 2, 2);
    ck_assert(!has_msg(x.w[2], "SYNC"));
    /* v3 may be published again (a fixed file); a version below it may not */
    trainer_sync(&x, 3, 2, SHA_B);
    d = answer(&x);
    ck_assert_str_eq(d->type, "ERROR");
    ck_assert_str_eq(wv_get_str(d->hdr, "code"), "stale_version");
    drop_msg(&d);
    trainer_sync(&x, 4, 3, SHA_A);
    expect_sync(&x, 0, 3);
    box_close(&x);
}
END_TEST

START_TEST(test_a_sync_with_no_live_worker_fails_and_is_not_current) {
    box_t x;
    box_open(&x);
    trainer_sync(&x, 5, 2, SHA_A);
    wire_msg_t *d = answer(&x);
    ck_assert(!done_complete(d));
    ck_assert_uint_eq(u64_of(d, "current"), 0);
    drop_msg(&d);
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 0);
    ready(&x, 0, 1);
    ck_assert(!has_msg(x.w[0], "SYNC")); /* nothing to catch up to */
    box_close(&x);
}
END_TEST

START_TEST(test_resending_the_current_version_acks_and_retries_only_lagging_workers) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    ready(&x, 1, 1);
    trainer_sync(&x, 1, 2, SHA_A);
    expect_sync(&x, 0, 2);
    expect_sync(&x, 1, 2);
    ack(&x, 0, 2, NULL);
    ack(&x, 1, 2, "disk full");
    wire_msg_t *d = answer(&x);
    drop_msg(&d);

    trainer_sync(&x, 2, 2, SHA_A); /* same version, same sha256: a retry */
    expect_sync(&x, 1, 2);
    ck_assert(!has_msg(x.w[0], "SYNC"));
    char why[192];
    ck_assert_str_eq(lag_of(&x, 1, why, sizeof why), "applying v2");
    ack(&x, 1, 2, NULL);
    d = answer(&x);
    ck_assert_uint_eq(d->id, 2);
    ck_assert(done_complete(d));
    drop_msg(&d);
    ck_assert_ptr_null(lag_of(&x, 1, why, sizeof why));

    trainer_sync(&x, 3, 2, SHA_A); /* nobody lags: complete at once, nothing sent */
    d = answer(&x);
    ck_assert(done_complete(d));
    drop_msg(&d);
    ck_assert(!has_msg(x.w[0], "SYNC") && !has_msg(x.w[1], "SYNC"));

    trainer_sync(&x, 4, 2, SHA_B); /* same version, other weights */
    d = answer(&x);
    ck_assert_str_eq(d->type, "ERROR");
    ck_assert_str_eq(wv_get_str(d->hdr, "code"), "stale_version");
    ck_assert_ptr_nonnull(strstr(wv_get_str(d->hdr, "message"), "current with other weights"));
    drop_msg(&d);
    box_close(&x);
}
END_TEST

START_TEST(test_resending_a_pending_version_joins_its_barrier) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    trainer_sync(&x, 1, 2, SHA_A);
    expect_sync(&x, 0, 2);
    trainer_sync(&x, 2, 2, SHA_A);       /* the trainer timed out and retries */
    ck_assert(!has_msg(x.w[0], "SYNC")); /* not loaded twice */
    trainer_sync(&x, 3, 2, SHA_B);
    wire_msg_t *d = answer(&x);
    ck_assert_str_eq(d->type, "ERROR");
    ck_assert_ptr_nonnull(strstr(wv_get_str(d->hdr, "message"), "pending with other weights"));
    drop_msg(&d);
    trainer_sync(&x, 4, 1, SHA_A); /* below a pending version */
    d = answer(&x);
    ck_assert_str_eq(wv_get_str(d->hdr, "code"), "stale_version");
    drop_msg(&d);
    ack(&x, 0, 2, NULL);
    for (uint64_t id = 1; id <= 2; id++) {
        d = answer(&x);
        ck_assert_uint_eq(d->id, id);
        ck_assert(done_complete(d));
        drop_msg(&d);
    }
    box_close(&x);
}
END_TEST

/* A barrier answers at most BRK_SYNC_TRAINERS_MAX resends: the same
 * SYNC again (identity and id) is one of them already, and a resend past
 * the bound is answered busy naming it; the ones taken each get their
 * SYNC_DONE at the end. Before, every resend while the barrier ran (a
 * barrier waits for an upload for ever) added a trainer and, at the end,
 * a SYNC_DONE. */
START_TEST(test_resends_joining_a_barrier_are_bounded_and_busy_beyond) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    trainer_sync(&x, 1, 2, SHA_A);
    expect_sync(&x, 0, 2);
    for (int k = 0; k < 3; k++) trainer_sync(&x, 1, 2, SHA_A); /* the same SYNC again: one answer */
    for (uint64_t id = 2; id <= BRK_SYNC_TRAINERS_MAX + 5; id++) trainer_sync(&x, id, 2, SHA_A);
    ck_assert_int_eq(x.b.barriers->n_trainers, BRK_SYNC_TRAINERS_MAX);
    for (uint64_t id = BRK_SYNC_TRAINERS_MAX + 1; id <= BRK_SYNC_TRAINERS_MAX + 5; id++) {
        wire_msg_t *d = answer(&x);
        ck_assert_uint_eq(d->id, id);
        ck_assert_str_eq(d->type, "ERROR");
        ck_assert_str_eq(wv_get_str(d->hdr, "code"), "busy");
        ck_assert_ptr_nonnull(strstr(wv_get_str(d->hdr, "message"), "already wait for its barrier"));
        drop_msg(&d);
    }
    ck_assert(!has_msg(x.w[0], "SYNC")); /* not loaded again */
    ack(&x, 0, 2, NULL);
    for (uint64_t id = 1; id <= BRK_SYNC_TRAINERS_MAX; id++) {
        wire_msg_t *d = answer(&x);
        ck_assert_uint_eq(d->id, id);
        ck_assert(done_complete(d));
        drop_msg(&d);
    }
    ck_assert(!has_msg(x.trainer, "SYNC_DONE"));
    box_close(&x);
}
END_TEST

START_TEST(test_a_worker_silent_past_the_deadline_lags_and_a_late_ack_catches_it_up) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    ready(&x, 1, 1);
    trainer_sync(&x, 1, 2, SHA_A);
    expect_sync(&x, 0, 2);
    expect_sync(&x, 1, 2);
    ack(&x, 0, 2, NULL);
    brk_sync_timers(&x.b, INT64_MAX - 1);
    wire_msg_t *d = answer(&x);
    ck_assert(!done_complete(d));
    ck_assert_str_eq(wv_get_str(wv_at(wv_get(d->hdr, "failed"), 0), "reason"), "timeout");
    drop_msg(&d);
    char why[192];
    ck_assert_str_eq(lag_of(&x, 1, why, sizeof why), "v2: no ack within the sync deadline");
    ack(&x, 1, 2, NULL);
    ck_assert_ptr_null(lag_of(&x, 1, why, sizeof why));
    box_close(&x);
}
END_TEST

/* READY carries no sha256: a worker that reports the version of a sync
 * the broker cannot vouch for (not its current version with that sha256)
 * may run other weights under that number, so it is asked like the others
 * and its answer decides. */
START_TEST(test_a_worker_that_reports_the_version_at_ready_is_asked_and_its_ok_makes_it_current) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 2); /* restarted with --weights-version 2 */
    ready(&x, 1, 1);
    trainer_sync(&x, 1, 2, SHA_A);
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 0); /* not on its word */
    expect_sync(&x, 0, 2);
    expect_sync(&x, 1, 2);
    ack(&x, 0, 2, NULL); /* the same weights: ok at once */
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 2);
    ack(&x, 1, 2, NULL);
    wire_msg_t *d = answer(&x);
    ck_assert(done_complete(d));
    drop_msg(&d);
    box_close(&x);
}
END_TEST

/* The trainer's first sync names the version the workers started at (1 by
 * default) with other weights: every worker says stale, nothing changes,
 * and it is not "complete". */
START_TEST(test_a_first_sync_at_the_workers_startup_version_with_other_weights_fails_on_their_stale) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    ready(&x, 1, 1);
    trainer_sync(&x, 1, 1, SHA_A);
    expect_sync(&x, 0, 1);
    expect_sync(&x, 1, 1);
    ack(&x, 0, 1, "stale");
    ack(&x, 1, 1, "stale");
    wire_msg_t *d = answer(&x);
    ck_assert(!done_complete(d));
    ck_assert_str_eq(wv_get_str(wv_at(wv_get(d->hdr, "failed"), 0), "reason"), "stale");
    drop_msg(&d);
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 0);
    box_close(&x);
}
END_TEST

/* A worker drops a SYNC whose broker session ended before it applied it
 * (docs/PROTOCOL.md): when it registers again while the barrier still
 * waits for it, the broker sends the SYNC again on the new session, and
 * the ack of that one completes the sync. Registering again at the
 * version (applied before it reconnected) is asked the same way. */
START_TEST(test_a_worker_that_registers_again_mid_sync_is_sent_the_sync_again) {
    for (int applied_first = 0; applied_first < 2; applied_first++) {
        box_t x;
        box_open(&x);
        ready(&x, 0, 1);
        trainer_sync(&x, 1, 2, SHA_A);
        expect_sync(&x, 0, 2);
        ready(&x, 0, applied_first ? 2 : 1); /* a new session */
        expect_sync(&x, 0, 2);
        ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 0);
        ack(&x, 0, 2, NULL);
        wire_msg_t *d = answer(&x);
        ck_assert(done_complete(d));
        drop_msg(&d);
        ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 2);
        box_close(&x);
    }
}
END_TEST

/* The trainer's SYNC_DONE: not complete, with worker w1's reason `why`
 * (w0, when there, applied it). */
static void expect_w1_failed(box_t *x, const char *why) {
    wire_msg_t *d = answer(x);
    ck_assert(!done_complete(d));
    const wire_val_t *f = wv_get(d->hdr, "failed");
    ck_assert_uint_eq(wv_len(f), 1);
    ck_assert_str_eq(wv_get_str(wv_at(f, 0), "worker"), "w1");
    ck_assert_str_eq(wv_get_str(wv_at(f, 0), "reason"), why);
    drop_msg(&d);
}

/* A SYNC the broker cannot send to a worker (its connection gone between
 * two of its sessions, or its queue full: brk_worker_unreachable, as a
 * failed HEARTBEAT leaves it) is no refusal: the barrier keeps waiting
 * for that worker, undelivered, and sends it the SYNC again when it
 * registers again (READY) or speaks again, whose ack completes the sync;
 * only the worker's loss or the deadline fails it, each saying so. A
 * resend at a registration that fails too (its connection gone again at
 * once) waits for the next time. The trainer is answered by the deadline
 * at the latest, and a SYNC never sent is not kept as one a worker may
 * still apply late. */
START_TEST(test_a_sync_a_worker_could_not_be_sent_waits_for_it_to_come_back_and_fails_only_at_its_loss_or_deadline) {
    enum { BY_READY, BY_SPEAKING, RESEND_FAILS, LOST, DEADLINE, DEADLINE_ALONE, N_WAYS };
    for (int way = 0; way < N_WAYS; way++) {
        box_t x;
        box_open(&x);
        const bool alone = way == DEADLINE_ALONE;
        const int m1 = alone ? 0 : 1; /* w1's member (sorted by name) */
        if (!alone) ready(&x, 0, 1);
        ready(&x, 1, 1);
        brk_worker_unreachable(brk_worker_named(&x.b, "w1"), "HEARTBEAT");
        trainer_sync(&x, 1, 2, SHA_A);
        if (!alone) {
            expect_sync(&x, 0, 2);
            ack(&x, 0, 2, NULL);
            ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 2);
        }
        ck_assert_msg(!has_msg(x.w[1], "SYNC"), "way %d: a SYNC reached an unreachable worker", way);
        ck_assert_msg(!has_msg(x.trainer, "SYNC_DONE"), "way %d: answered while w1 may come back", way);
        ck_assert_ptr_nonnull(x.b.barriers);
        ck_assert(x.b.barriers->m[m1].state == BRK_MEMBER_WAITING && x.b.barriers->m[m1].undelivered);
        ck_assert_int_eq(brk_sync_next_deadline(&x.b), x.b.barriers->deadline_ms); /* the loop wakes for it */
        TS_OK(brk_check(&x.b));
        if (way == RESEND_FAILS) {
            /* what a READY does (brk_sync_joined) while its connection is gone again */
            brk_sync_joined(&x.b, brk_worker_named(&x.b, "w1"));
            ck_assert(!has_msg(x.w[1], "SYNC"));
            ck_assert(!has_msg(x.trainer, "SYNC_DONE"));
            ck_assert(x.b.barriers && x.b.barriers->m[m1].undelivered);
            TS_OK(brk_check(&x.b));
        }
        if (way == BY_READY) {
            ready(&x, 1, 1); /* a new session */
            expect_sync(&x, 1, 2);
        } else if (way == BY_SPEAKING || way == RESEND_FAILS) {
            from_worker(&x, 1, wire_hdr("HEARTBEAT", 0)); /* reachable again */
            expect_sync(&x, 1, 2);
        }
        if (way == BY_READY || way == BY_SPEAKING || way == RESEND_FAILS) {
            ck_assert(!x.b.barriers->m[m1].undelivered);
            TS_OK(brk_check(&x.b));
            ack(&x, 1, 2, NULL);
            wire_msg_t *d = answer(&x);
            ck_assert_uint_eq(d->id, 1);
            ck_assert_msg(done_complete(d), "way %d: not complete once w1 applied it", way);
            ck_assert_uint_eq(wv_len(wv_get(d->hdr, "applied")), 2);
            drop_msg(&d);
        } else if (way == LOST) {
            brk_worker_t *w1 = brk_worker_named(&x.b, "w1");
            w1->dead = true; /* silent past the liveness (brk_workers_timers) */
            w1->dead_why = "expired";
            brk_reap(&x.b);
            expect_w1_failed(&x, "SYNC not delivered: the worker was lost (expired) before it registered again");
        } else {
            brk_sync_timers(&x.b, x.b.barriers->deadline_ms);
            expect_w1_failed(&x, "SYNC not delivered: the worker did not register again before the sync's deadline");
            ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), alone ? 0 : 2);
            ck_assert_int_eq(x.b.n_interrupted, 0); /* never sent: no late ok can come */
        }
        ck_assert_ptr_null(x.b.barriers);
        TS_OK(brk_check(&x.b));
        box_close(&x);
    }
}
END_TEST

static cat_t *temp_catalog(char *dir, char *path, size_t len);
static long long wait_sql_at_least(const char *path, const char *sql, long long want, int polls);
static void remove_dir(const char *dir);

/* The broker handles the next message on its worker (worker_side) or
 * client socket with its worker socket swapped for a PULL socket, on which
 * every send fails ENOTSUP: a send failure that is no transport's (as the
 * codec refusing a message, or ENOMEM), so brk_worker_send leaves the
 * worker routable. */
static void deliver_refusing(box_t *x, bool worker_side) {
    void *real = x->b.workers, *pull = sock(x->b.ctx, ZMQ_PULL);
    ck_assert_int_eq(zmq_send(pull, "x", 1, ZMQ_DONTWAIT), -1);
    ck_assert_int_eq(zmq_errno(), ENOTSUP);
    wire_msg_t *m = calloc(1, sizeof *m);
    wire_err_t err;
    ck_assert_ptr_nonnull(m);
    int rc = msg_recv(worker_side ? real : x->b.clients, true, 0, m, &err);
    ck_assert_int_ge(rc, 0);
    x->b.workers = pull;
    brk_handle(&x->b, worker_side, &m, rc, &err);
    x->b.workers = real;
    drop_msg(&m);
    zmq_close(pull);
}

/* Sync `version` (trainer id `id`) applied by w0 alone: current, its
 * barrier still waiting for w1. */
static void synced_w0_only(box_t *x, uint64_t id, uint64_t version, const char *sha) {
    trainer_sync(x, id, version, sha);
    expect_sync(x, 0, version);
    ack(x, 0, version, NULL);
    ck_assert_uint_eq(brk_current_version(&x->b, "transformer"), version);
}

/* A SYNC whose send fails for another reason than its transport (the
 * worker stays routable: nothing would ever send it again) fails its
 * member at once, "SYNC could not be sent: <error>", recorded in the
 * catalog as any failure; it is not left waiting undelivered until the
 * deadline to fail "did not register again". The send fails so when the
 * sync begins (while another worker, unreachable: a transport failure,
 * still waits undelivered in the same barrier and completes its part once
 * it speaks again), when the SYNC is sent again to a worker that speaks
 * again, and when a worker's catch-up SYNC (v3), which was to cover its
 * wait on an older barrier (v2), cannot be sent. */
START_TEST(test_a_sync_send_that_fails_but_for_its_transport_fails_the_member_at_once_naming_the_error) {
    enum { AT_START, AT_SPEAKING, AT_CATCH_UP, N_WAYS };
    char want[MSG_REASON_MAX], sql[MSG_REASON_MAX + 256];
    snprintf(want, sizeof want, "SYNC could not be sent: %s", zmq_strerror(ENOTSUP));
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM worker_versions WHERE worker = 'w1' AND component = 'transformer' AND version = 2 "
             "AND ok = 0 AND error = '%s'", want);
    for (int way = 0; way < N_WAYS; way++) {
        char dir[] = "/tmp/reel-syncsend.XXXXXX", path[64];
        cat_t *c = temp_catalog(dir, path, sizeof path);
        box_t x;
        box_open(&x);
        ck_assert_ptr_nonnull(x.b.cat = brk_catq_new(&c, BRK_CATQ_MAX));
        ready(&x, 0, 1);
        ready(&x, 1, 1);
        brk_worker_t *w0 = brk_worker_named(&x.b, "w0"), *w1 = brk_worker_named(&x.b, "w1");
        if (way == AT_START) {
            brk_worker_unreachable(w0, "HEARTBEAT"); /* a transport failure: w0 waits */
            trainer_sends_sync(&x, 1, 2, SHA_A);
            deliver_refusing(&x, false);
            ck_assert_ptr_nonnull(x.b.barriers);
            const brk_member_t *m0 = &x.b.barriers->m[0], *m1 = &x.b.barriers->m[1];
            ck_assert_str_eq(m1->worker, "w1");
            ck_assert_int_eq(m1->state, BRK_MEMBER_FAILED);
            ck_assert(!m1->undelivered);
            ck_assert_str_eq(m1->reason, want);
            ck_assert(w1->route.routable);
            ck_assert(m0->state == BRK_MEMBER_WAITING && m0->undelivered); /* the transport failure waits */
            ck_assert(!has_msg(x.w[1], "SYNC"));
            ck_assert(!has_msg(x.trainer, "SYNC_DONE"));
            TS_OK(brk_check(&x.b));
            from_worker(&x, 0, wire_hdr("HEARTBEAT", 0)); /* w0 reachable again: sent it, and applies it */
            expect_sync(&x, 0, 2);
            ack(&x, 0, 2, NULL);
            expect_w1_failed(&x, want);
        } else {
            brk_worker_unreachable(w1, "HEARTBEAT"); /* w1 waits undelivered, as a transport failure does */
            synced_w0_only(&x, 1, 2, SHA_A);
            if (way == AT_CATCH_UP) synced_w0_only(&x, 2, 3, SHA_B); /* v2's wait on w1 is covered by v3's SYNC */
            ck_assert(!has_msg(x.trainer, "SYNC_DONE"));
            TS_OK(brk_check(&x.b));
            wire_val_t *hb = wire_hdr("HEARTBEAT", 0);
            ck_assert_int_eq(wire_send(x.w[1], NULL, hb, NULL, 0), 0);
            wv_free(&hb);
            deliver_refusing(&x, true); /* w1 speaks again: its SYNC (v3 by the catch-up) cannot be sent */
            ck_assert(w1->route.routable);
            ck_assert(!has_msg(x.w[1], "SYNC"));
            expect_w1_failed(&x, want);
            if (way == AT_CATCH_UP) expect_w1_failed(&x, want); /* both barriers: v3's, then v2's */
        }
        ck_assert_ptr_null(x.b.barriers);
        TS_OK(brk_check(&x.b));
        ck_assert_int_eq(wait_sql_at_least(path, sql, 1, 500), 1);
        brk_catq_destroy(&x.b.cat);
        box_close(&x);
        remove_dir(dir);
    }
}
END_TEST

/* The trainer's SYNC of a LoRA adapter (its PEFT folder) on base. */
static void trainer_sync_adapter(box_t *x, uint64_t id, uint64_t version, uint64_t base, const char *sha) {
    wire_val_t *h = wire_hdr("SYNC", id);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(version));
    wv_set(h, "sha256", wv_str(sha));
    wv_set(h, "path", wv_str("/w/lora"));
    wv_set(h, "base_version", wv_u64(base));
    ck_assert_int_eq(wire_send(x->trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(x, false);
}

/* One sync of `version` applied by worker 0 alone: complete. */
static void synced(box_t *x, uint64_t id, uint64_t version, uint64_t base, const char *sha) {
    if (base) trainer_sync_adapter(x, id, version, base, sha);
    else trainer_sync(x, id, version, sha);
    expect_sync(x, 0, version);
    ack(x, 0, version, NULL);
    wire_msg_t *d = answer(x);
    ck_assert(done_complete(d));
    drop_msg(&d);
}

/* A worker that joins below the base of the current LoRA adapter (it
 * restarted on its startup weights) is sent the base's full SYNC first,
 * then the adapter: it applies them in order. Adapters after adapters on
 * one base keep it; a new full version lets it go. */
START_TEST(test_a_worker_joining_below_the_current_adapters_base_is_sent_the_base_first) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    synced(&x, 1, 2, 0, SHA_A);     /* v2 full */
    synced(&x, 2, 3, 2, SHA_B);     /* v3: an adapter on v2 */
    synced(&x, 3, 4, 2, SHA_A);     /* v4: another adapter on v2 */
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 4);
    ck_assert_uint_eq(brk_current_base(&x.b, "transformer"), 2);
    ready(&x, 1, 1); /* joins at its startup v1 */
    wire_msg_t *m = take(x.w[1], false);
    uint64_t v = 0, base = 0;
    ck_assert_str_eq(m->type, "SYNC");
    ck_assert(wv_get_u64(m->hdr, "version", &v));
    ck_assert_uint_eq(v, 2);
    ck_assert(!wv_get_u64(m->hdr, "base_version", &base) || base == 0); /* the full version */
    drop_msg(&m);
    m = take(x.w[1], false);
    ck_assert(wv_get_u64(m->hdr, "version", &v) && wv_get_u64(m->hdr, "base_version", &base));
    ck_assert_uint_eq(v, 4);
    ck_assert_uint_eq(base, 2);
    drop_msg(&m);
    ack(&x, 1, 2, NULL);
    ack(&x, 1, 4, NULL);
    char why[192];
    ck_assert_ptr_null(lag_of(&x, 1, why, sizeof why));
    /* a worker at the base itself is sent the adapter alone */
    ready(&x, 2, 2);
    expect_sync(&x, 2, 4);
    ck_assert(!has_msg(x.w[2], "SYNC"));
    /* a new full version: no base kept, a joiner is sent it alone */
    ack(&x, 2, 4, NULL);
    trainer_sync(&x, 4, 5, SHA_B);
    for (int i = 0; i < 3; i++) {
        expect_sync(&x, i, 5);
        ack(&x, i, 5, NULL);
    }
    m = answer(&x);
    ck_assert(done_complete(m));
    drop_msg(&m);
    ck_assert_uint_eq(brk_current_base(&x.b, "transformer"), 0);
    box_close(&x);
}
END_TEST

/* A worker unreachable while a full version became current and while an
 * adapter on it was synced (both barriers wait for it, undelivered) comes
 * back, by speaking or by registering again at its startup v1: it is
 * sent the base's full SYNC first, then the adapter, and applies both in
 * order; both syncs complete. Sent the adapter alone (first), it refused
 * it (its base is v1), and the base was never sent after (the adapter's
 * version counted as sent): the base's barrier ran to its deadline. */
START_TEST(test_a_worker_back_after_missing_a_base_and_its_adapter_is_sent_the_base_first) {
    for (int by_ready = 0; by_ready < 2; by_ready++) {
        box_t x;
        box_open(&x);
        ready(&x, 0, 1);
        ready(&x, 1, 1);
        brk_worker_unreachable(brk_worker_named(&x.b, "w1"), "HEARTBEAT");
        trainer_sync(&x, 1, 2, SHA_A); /* v2 full */
        expect_sync(&x, 0, 2);
        ack(&x, 0, 2, NULL);
        trainer_sync_adapter(&x, 2, 3, 2, SHA_B); /* v3: an adapter on v2 */
        expect_sync(&x, 0, 3);
        ack(&x, 0, 3, NULL);
        ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 3);
        ck_assert(!has_msg(x.trainer, "SYNC_DONE")); /* both wait for w1 */
        TS_OK(brk_check(&x.b));
        if (by_ready) ready(&x, 1, 1);
        else from_worker(&x, 1, wire_hdr("HEARTBEAT", 0)); /* reachable again */
        wire_msg_t *m = take(x.w[1], false);
        uint64_t v = 0, base = 0;
        ck_assert_str_eq(m->type, "SYNC");
        ck_assert(wv_get_u64(m->hdr, "version", &v));
        ck_assert_msg(v == 2, "by_ready %d: the first SYNC to w1 is v%llu, not its base v2", by_ready,
                      (unsigned long long)v);
        ck_assert(!wv_get_u64(m->hdr, "base_version", &base) || base == 0);
        drop_msg(&m);
        m = take(x.w[1], false);
        ck_assert(wv_get_u64(m->hdr, "version", &v) && wv_get_u64(m->hdr, "base_version", &base));
        ck_assert_uint_eq(v, 3);
        ck_assert_uint_eq(base, 2);
        drop_msg(&m);
        ck_assert(!has_msg(x.w[1], "SYNC"));
        TS_OK(brk_check(&x.b));
        ack(&x, 1, 2, NULL);
        ack(&x, 1, 3, NULL);
        bool answered[3] = { false };
        for (int k = 0; k < 2; k++) {
            wire_msg_t *d = answer(&x);
            ck_assert_msg(done_complete(d), "by_ready %d: sync id %llu not complete", by_ready,
                          (unsigned long long)d->id);
            ck_assert_uint_le(d->id, 2);
            answered[d->id] = true;
            drop_msg(&d);
        }
        ck_assert(answered[1] && answered[2]);
        ck_assert_ptr_null(x.b.barriers);
        TS_OK(brk_check(&x.b));
        box_close(&x);
    }
}
END_TEST

/* A sync that ran out of time with no worker done (a drain longer than
 * its deadline) fails, but its workers still hold the SYNC: the late ok of
 * one makes it current then (as a restart's interrupted sync), and a
 * worker that joins is caught up to it, so no worker serves a version its
 * broker does not know. */
START_TEST(test_a_late_ok_after_a_failed_deadline_makes_the_version_current) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    trainer_sync(&x, 1, 2, SHA_A);
    expect_sync(&x, 0, 2);
    brk_sync_timers(&x.b, INT64_MAX - 1);
    wire_msg_t *d = answer(&x);
    ck_assert(!done_complete(d));
    ck_assert_str_eq(wv_get_str(wv_at(wv_get(d->hdr, "failed"), 0), "reason"), "timeout");
    drop_msg(&d);
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 0);
    ack(&x, 0, 2, NULL); /* its drain ended: applied after all */
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 2);
    ready(&x, 1, 1);
    expect_sync(&x, 1, 2);
    box_close(&x);
}
END_TEST

/* ---- refusals and answers of docs/PROTOCOL.md --------------------------------- */

static void sync_fields(box_t *x, uint64_t id, const char *component, uint64_t version, const char *sha,
                        const char *path, bool inline_tensor) {
    wire_val_t *h = wire_hdr("SYNC", id);
    wv_set(h, "component", wv_str(component));
    wv_set(h, "version", wv_u64(version));
    wv_set(h, "sha256", wv_str(sha));
    if (path) wv_set(h, "path", wv_str(path));
    static float w[4];
    const int64_t ws[1] = { 4 };
    wire_tensor_t t = ts_wire_tensor("blocks.0.w", KERN_F32, 1, ws, w, sizeof w);
    ck_assert_int_eq(wire_send(x->trainer, NULL, h, &t, inline_tensor ? 1 : 0), 0);
    wv_free(&h);
    deliver(x, false);
}

/* The trainer's next answer is ERROR code, its message containing want. */
static void expect_error(box_t *x, uint64_t id, const char *code, const char *want) {
    wire_msg_t *d = answer(x);
    ck_assert_str_eq(d->type, "ERROR");
    ck_assert_uint_eq(d->id, id);
    ck_assert_str_eq(wv_get_str(d->hdr, "code"), code);
    ck_assert_msg(strstr(wv_get_str(d->hdr, "message"), want), "'%s' lacks '%s'", wv_get_str(d->hdr, "message"), want);
    drop_msg(&d);
}

START_TEST(test_a_sync_not_newer_for_another_component_inline_or_without_a_path_is_refused_with_its_code) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    trainer_sync(&x, 1, 2, SHA_A);
    expect_sync(&x, 0, 2);
    ack(&x, 0, 2, NULL);
    wire_msg_t *d = answer(&x);
    ck_assert(done_complete(d));
    drop_msg(&d);
    sync_fields(&x, 2, "vae", 3, SHA_A, "/w/x.safetensors", false);
    expect_error(&x, 2, "bad_request", "component \"transformer\" only");
    sync_fields(&x, 3, "transformer", 3, SHA_A, NULL, true);
    expect_error(&x, 3, "bad_request", "inline tensors");
    sync_fields(&x, 4, "transformer", 3, SHA_A, NULL, false);
    expect_error(&x, 4, "bad_request", "neither 'path' nor 'uploaded' given");
    sync_fields(&x, 5, "transformer", 3, "abc", "/w/x.safetensors", false);
    expect_error(&x, 5, "bad_request", "'sha256' must be 64 hex digits");
    sync_fields(&x, 6, "transformer", 1, SHA_A, "/w/x.safetensors", false);
    expect_error(&x, 6, "stale_version", "not newer than the current version 2");
    /* sha256 compares in either case: the same digest in capitals is a resend */
    sync_fields(&x, 7, "transformer", 2, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "/w/x.safetensors",
                false);
    d = answer(&x);
    ck_assert_uint_eq(d->id, 7);
    ck_assert(done_complete(d));
    drop_msg(&d);
    ck_assert(!has_msg(x.w[0], "SYNC"));
    box_close(&x);
}
END_TEST

/* A GEN of the tiny shape from the client (the box's trainer socket):
 * context [5,32], latent [4,2,8,8] when with_latent. */
static void client_gen(box_t *x, uint64_t id, const char *model, bool with_latent) {
    static float ctx[5 * 32], lat[4 * 2 * 8 * 8];
    wire_val_t *h = wire_hdr("GEN", id), *ls = wv_arr();
    const int64_t l[4] = { 4, 2, 8, 8 };
    for (int i = 0; i < 4; i++) wv_push(ls, wv_u64((uint64_t)l[i]));
    wv_set(h, "model", wv_str(model));
    wv_set(h, "steps", wv_u64(2));
    wv_set(h, "latent_shape", ls);
    const int64_t c[2] = { 5, 32 };
    wire_tensor_t t[2] = { ts_wire_tensor("context", KERN_F32, 2, c, ctx, sizeof ctx),
                           ts_wire_tensor("latent", KERN_F32, 4, l, lat, sizeof lat) };
    ck_assert_int_eq(wire_send(x->trainer, NULL, h, t, with_latent ? 2 : 1), 0);
    wv_free(&h);
    deliver(x, false);
}

/* Worker i answers with hdr (a RESULT) at the given version, carrying a
 * latent F32[c,f,8,8] (client_gen asks for [4,2,8,8]). */
static void worker_result(box_t *x, int i, wire_val_t *hdr, uint64_t version, int64_t c, int64_t f) {
    static float lat[4 * 2 * 8 * 8 * 2];
    wv_set(hdr, "version", wv_u64(version));
    wire_val_t *stats = wv_map();
    wv_set(stats, "captured", wv_u64(0));
    wv_set(hdr, "stats", stats);
    const int64_t ls[4] = { c, f, 8, 8 };
    wire_tensor_t t = ts_wire_tensor("latent", KERN_F32, 4, ls, lat, (size_t)(c * f * 64) * sizeof(float));
    ck_assert_int_eq(wire_send(x->w[i], NULL, hdr, &t, 1), 0);
    wv_free(&hdr);
    deliver(x, true);
}

/* A worker's RESULT is checked against the GEN it answers (docs/PROTOCOL.md:
 * "a RESULT whose fields are wrong still ends its request"): one a client
 * could not use -- no latent, a latent of another shape, a version below
 * the request's or 0, a rollout tensor nobody asked for, a group's n for
 * one sample, version runs out of order -- reaches the client as ERROR
 * internal naming the fault, and frees the worker's slot; a right one
 * is forwarded. */
START_TEST(test_a_result_that_does_not_fit_its_request_ends_it_as_internal) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    brk_worker_t *w = brk_worker_named(&x.b, "w0");
    const char *want[] = { "latent is absent", "latent is F32[4,1,8,8]", "version 0", "trajectory, which",
                           "n 3 with 0 seeds", "version_runs[1]", NULL };
    for (int k = 0; k <= 6; k++) {
        client_gen(&x, 500 + (uint64_t)k, "tiny", false);
        wire_msg_t *q = take(x.w[0], false);
        ck_assert_str_eq(q->type, "REQUEST");
        uint64_t id = q->id, left = 0;
        /* the ms the broker still waits for it (--request-deadline-ms 60000 here) */
        ck_assert(wv_get_u64(q->hdr, "deadline_ms", &left) && left > 0 && left <= 60000);
        drop_msg(&q);
        ck_assert_int_eq(w->route.inflight, 1);
        wire_val_t *h = wire_hdr("RESULT", id);
        if (k == 0) {
            wv_set(h, "version", wv_u64(1));
            wv_set(h, "stats", wv_map());
            from_worker(&x, 0, h);
        } else if (k == 3) { /* a trajectory the GEN did not ask for */
            static float lat[4 * 2 * 8 * 8], traj[3 * 4 * 2 * 8 * 8];
            const int64_t l[5] = { 3, 4, 2, 8, 8 };
            wire_tensor_t t[2] = { ts_wire_tensor("latent", KERN_F32, 4, l + 1, lat, sizeof lat),
                                   ts_wire_tensor("trajectory", KERN_F32, 5, l, traj, sizeof traj) };
            wv_set(h, "version", wv_u64(1));
            wv_set(h, "stats", wv_map());
            ck_assert_int_eq(wire_send(x.w[0], NULL, h, t, 2), 0);
            wv_free(&h);
            deliver(&x, true);
        } else {
            if (k == 4) wv_set(h, "n", wv_u64(3));
            if (k == 5) { /* runs must start at 0 and go forward */
                wire_val_t *runs = wv_arr(), *r0 = wv_map(), *r1 = wv_map();
                wv_set(r0, "from", wv_u64(0));
                wv_set(r0, "version", wv_u64(1));
                wv_set(r1, "from", wv_u64(0));
                wv_set(r1, "version", wv_u64(1));
                wv_push(runs, r0);
                wv_push(runs, r1);
                wv_set(h, "version_runs", runs);
            }
            worker_result(&x, 0, h, k == 2 ? 0 : 1, 4, k == 1 ? 1 : 2);
        }
        wire_msg_t *d = answer(&x);
        ck_assert_uint_eq(d->id, 500 + (uint64_t)k);
        if (want[k]) {
            ck_assert_str_eq(d->type, "ERROR");
            ck_assert_str_eq(wv_get_str(d->hdr, "code"), "internal");
            ck_assert_msg(strstr(wv_get_str(d->hdr, "message"), want[k]), "case %d: '%s' lacks '%s'", k,
                          wv_get_str(d->hdr, "message"), want[k]);
        } else {
            ck_assert_str_eq(d->type, "RESULT");
            ck_assert_int_eq(d->n_tensors, 1);
        }
        drop_msg(&d);
        ck_assert_int_eq(w->route.inflight, 0);
    }
    /* one that cannot even be read (its latent frame cut to 3 bytes) ends
     * its request too, not at the deadline */
    client_gen(&x, 600, "tiny", false);
    wire_msg_t *q = take(x.w[0], false);
    uint64_t id = q->id;
    drop_msg(&q);
    void *in = sock(x.b.ctx, ZMQ_PAIR), *out = sock(x.b.ctx, ZMQ_PAIR);
    ck_assert_int_eq(zmq_bind(in, "inproc://bad-result"), 0);
    ck_assert_int_eq(zmq_connect(out, "inproc://bad-result"), 0);
    static float lat[4 * 2 * 8 * 8];
    wire_tensor_t t = { .dtype = KERN_F32, .ndim = 4, .shape = { 4, 2, 8, 8 }, .data = lat, .bytes = sizeof lat };
    snprintf(t.name, sizeof t.name, "latent");
    wire_val_t *h = wire_hdr("RESULT", id);
    wv_set(h, "version", wv_u64(1));
    ck_assert_int_eq(wire_send(out, NULL, h, &t, 1), 0); /* its frames, to send cut short */
    wv_free(&h);
    zmq_msg_t head;
    zmq_msg_init(&head);
    ck_assert_int_ge(zmq_msg_recv(&head, in, 0), 0);
    int hlen = (int)zmq_msg_size(&head);
    ck_assert_int_eq(zmq_msg_send(&head, x.w[0], ZMQ_SNDMORE), hlen);
    ck_assert_int_eq(zmq_send(x.w[0], "abc", 3, 0), 3);
    zmq_close(in);
    zmq_close(out);
    deliver(&x, true);
    expect_error(&x, 600, "internal", "worker w0 sent a bad RESULT");
    ck_assert_int_eq(w->route.inflight, 0);
    ck_assert_ptr_null(x.b.reqs);
    box_close(&x);
}
END_TEST

/* A worker's RESULT stats are bounded by what its request could run: n x
 * steps steps (2 here), each captured, replayed or eager, an eager one
 * under one decline reason, and at most MSG_MAX_BATCH_ROWS rows a batched
 * step. Before, a worker claiming 2^64 - 1 captured steps had them
 * forwarded to the client, added to STATUS steps_captured and cast to int
 * in the catalog. Now such a RESULT ends its request as internal, as
 * other impossible RESULTs do, and nothing of it is counted; one at the
 * bound is forwarded and counted. */
START_TEST(test_a_result_claiming_more_steps_than_its_request_runs_ends_it_as_internal) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    brk_worker_t *w = brk_worker_named(&x.b, "w0");
    static float lat[4 * 2 * 8 * 8];
    const int64_t ls[4] = { 4, 2, 8, 8 };
    struct { const char *key; uint64_t v; const char *decline; const char *want; } cases[] = {
        { "captured", UINT64_MAX, NULL, "18446744073709551615 captured" },
        { "replayed", 3, NULL, "3 replayed" },
        { "eager", 1, NULL, "more than the 2 its request runs" }, /* 2 captured besides: 3 steps */
        { "batched", 3, NULL, "3 batched" },
        { "batch_rows", 65, NULL, "65 batch rows" }, /* in 1 batched step */
        { "eager", 2, "warming_up", "stats.declines.warming_up 3" },
        { "captured", 2, NULL, NULL }, /* at the bound: forwarded */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        client_gen(&x, 700 + k, "tiny", false);
        wire_msg_t *q = take(x.w[0], false);
        uint64_t id = q->id;
        drop_msg(&q);
        wire_val_t *h = wire_hdr("RESULT", id), *stats = wv_map();
        wv_set(h, "version", wv_u64(1));
        if (k == 2) wv_set(stats, "captured", wv_u64(2));
        if (k == 4) wv_set(stats, "batched", wv_u64(1));
        wv_set(stats, cases[k].key, wv_u64(cases[k].v));
        if (cases[k].decline) {
            wire_val_t *d = wv_map();
            wv_set(d, cases[k].decline, wv_u64(3));
            wv_set(stats, "declines", d);
        }
        wv_set(h, "stats", stats);
        wire_tensor_t t = ts_wire_tensor("latent", KERN_F32, 4, ls, lat, sizeof lat);
        ck_assert_int_eq(wire_send(x.w[0], NULL, h, &t, 1), 0);
        wv_free(&h);
        deliver(&x, true);
        wire_msg_t *d = answer(&x);
        ck_assert_uint_eq(d->id, 700 + k);
        if (cases[k].want) {
            ck_assert_str_eq(d->type, "ERROR");
            ck_assert_str_eq(wv_get_str(d->hdr, "code"), "internal");
            ck_assert_msg(strstr(wv_get_str(d->hdr, "message"), cases[k].want), "case %zu: '%s' lacks '%s'", k,
                          wv_get_str(d->hdr, "message"), cases[k].want);
            ck_assert_uint_eq(x.b.metrics.steps_captured + x.b.metrics.steps_replayed + x.b.metrics.steps_eager, 0);
        } else {
            ck_assert_str_eq(d->type, "RESULT");
        }
        drop_msg(&d);
        ck_assert_int_eq(w->route.inflight, 0);
    }
    ck_assert_uint_eq(x.b.metrics.steps_captured, 2);
    box_close(&x);
}
END_TEST

/* A header that breaks after its id and type (trailing bytes, a duplicate
 * key: the tokenizer refuses it before the envelope is read) is still a
 * RESULT or ERROR naming a request its worker holds: it ends that request
 * as internal at once. Before, only a message whose envelope was read
 * did, and the client of a RESULT with one trailing byte waited its
 * deadline out (tests/cli_adversarial_peers.sh, a fake worker). */
START_TEST(test_a_result_whose_header_breaks_after_its_type_still_ends_its_request) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    brk_worker_t *w = brk_worker_named(&x.b, "w0");
    for (int k = 0; k < 3; k++) {
        client_gen(&x, 700 + (uint64_t)k, "tiny", false);
        wire_msg_t *q = take(x.w[0], false);
        uint64_t id = q->id;
        drop_msg(&q);
        unsigned char b[96];
        size_t n = 0;
        b[n++] = k == 1 ? 0x85 : 0x83; /* a map of 3 (5: a key repeated) */
        memcpy(b + n, "\xa5proto\xa6reel/1", 13), n += 13;
        memcpy(b + n, k == 2 ? "\xa4type\xa5""ERROR" : "\xa4type\xa6RESULT", k == 2 ? 11 : 12), n += k == 2 ? 11 : 12;
        memcpy(b + n, "\xa2id\xcf", 4), n += 4;
        for (int i = 7; i >= 0; i--) b[n++] = (unsigned char)(id >> (8 * i));
        if (k == 1) memcpy(b + n, "\xa1x\x01\xa1x\x02", 6), n += 6; /* "x" twice */
        else b[n++] = 0xc0;                                         /* a trailing nil */
        ck_assert_int_eq(zmq_send(x.w[0], b, n, 0), (int)n);
        deliver(&x, true);
        wire_msg_t *e = take(x.w[0], false); /* the worker is told, under the id it sent */
        ck_assert_str_eq(e->type, "ERROR");
        ck_assert_uint_eq(e->id, id);
        ck_assert_str_eq(wv_get_str(e->hdr, "code"), "malformed");
        drop_msg(&e);
        wire_msg_t *d = answer(&x);
        ck_assert_uint_eq(d->id, 700 + (uint64_t)k);
        ck_assert_str_eq(d->type, "ERROR");
        ck_assert_str_eq(wv_get_str(d->hdr, "code"), "internal");
        ck_assert_msg(strstr(wv_get_str(d->hdr, "message"), k == 2 ? "worker w0 sent a bad ERROR" : "worker w0 sent a bad RESULT"),
                      "case %d: %s", k, wv_get_str(d->hdr, "message"));
        drop_msg(&d);
        ck_assert_int_eq(w->route.inflight, 0);
    }
    ck_assert_ptr_null(x.b.reqs);
    box_close(&x);
}
END_TEST

/* A worker's ERROR about a request reaches the client with the worker's
 * code when it is one of the protocol's; any other code (or standby, a
 * broker's word) is internal, its message naming the code with only
 * printable bytes, and the metrics' outcomes stay the protocol's codes. */
START_TEST(test_a_worker_error_code_outside_the_protocol_reaches_the_client_as_internal) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    static const struct {
        const char *code, *message, *want_code, *want;
    } cases[] = {
        { "bad_request", "steps 0", "bad_request", "steps 0" },
        { "too_large", "65537 tokens", "too_large", "65537 tokens" },
        { "weird_code", "m1", "internal", "worker w0 answered with the code 'weird_code', not one of the protocol's: m1" },
        { "i\"} 1\nreel_fake 42\n#", "m2", "internal", "the code 'i\"} 1?reel_fake 42?#'" },
        { "q\\x", "m3", "internal", "the code 'q\\x'" },
        { "standby", "m4", "internal", "the code 'standby'" },
        { "sp ace", "m5", "internal", "the code 'sp ace', not one of the protocol's: m5" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        client_gen(&x, 700 + k, "tiny", false);
        wire_msg_t *q = take(x.w[0], false);
        ck_assert_str_eq(q->type, "REQUEST");
        wire_val_t *h = wire_hdr("ERROR", q->id);
        drop_msg(&q);
        wv_set(h, "code", wv_str(cases[k].code));
        wv_set(h, "message", wv_str(cases[k].message));
        from_worker(&x, 0, h);
        expect_error(&x, 700 + k, cases[k].want_code, cases[k].want);
    }
    ck_assert_ptr_null(x.b.reqs);
    for (int i = 0; i < x.b.metrics.n_outcomes; i++)
        ck_assert_msg(wire_code_known(x.b.metrics.outcome[i]) || !strcmp(x.b.metrics.outcome[i], "ok"),
                      "outcome label '%s'", x.b.metrics.outcome[i]);
    box_close(&x);
}
END_TEST

START_TEST(test_at_its_deadline_a_request_nobody_could_serve_is_no_worker_and_one_that_waited_is_timeout) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);               /* serves tiny, one request at a time */
    client_gen(&x, 1, "tiny", true);
    ck_assert(has_msg(x.w[0], "REQUEST"));
    client_gen(&x, 2, "tiny", true); /* its owner is busy: it waits */
    client_gen(&x, 3, "nosuch", true); /* no live worker serves it */
    brk_req_timers(&x.b, brk_now_ms() + 1000000);
    bool seen[4] = { false };
    for (int i = 0; i < 3; i++) {
        wire_msg_t *d = answer(&x);
        ck_assert_str_eq(d->type, "ERROR");
        ck_assert_uint_le(d->id, 3);
        ck_assert_str_eq(wv_get_str(d->hdr, "code"), d->id == 3 ? "no_worker" : "timeout");
        seen[d->id] = true;
        drop_msg(&d);
    }
    ck_assert(seen[1] && seen[2] && seen[3]);
    box_close(&x);
}
END_TEST

/* Live requests are found by id in BRK_ID_BUCKETS buckets: with more in
 * flight than buckets (several per bucket) and answered in reverse order,
 * each RESULT reaches its client under its own id, once, and the worker's
 * slots all come back. */
START_TEST(test_more_requests_in_flight_than_id_buckets_are_each_answered_under_their_own_id) {
    enum { N = BRK_ID_BUCKETS + BRK_ID_BUCKETS / 2 };
    box_t x;
    box_open(&x);
    wire_val_t *h = wire_hdr("READY", 0), *models = wv_arr(), *vers = wv_map();
    wv_push(models, wv_str("tiny"));
    wv_set(vers, "transformer", wv_u64(1));
    wv_set(h, "name", wv_str("w0"));
    wv_set(h, "models", models);
    wv_set(h, "versions", vers);
    wv_set(h, "max_inflight", wv_u64(N));
    from_worker(&x, 0, h);
    static uint64_t broker_id[N];
    for (uint64_t i = 0; i < N; i++) {
        client_gen(&x, 100000 + i, "tiny", false);
        wire_msg_t *r = take(x.w[0], false);
        ck_assert_str_eq(r->type, "REQUEST");
        broker_id[i] = r->id;
        drop_msg(&r);
    }
    brk_worker_t *w = brk_worker_named(&x.b, "w0");
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(w->route.inflight, N);
    static bool seen[N];
    for (int i = N - 1; i >= 0; i--) {
        worker_result(&x, 0, wire_hdr("RESULT", broker_id[i]), 1, 4, 2);
        wire_msg_t *d = answer(&x);
        ck_assert_str_eq(d->type, "RESULT");
        ck_assert_uint_eq(d->id, 100000 + (uint64_t)i);
        ck_assert(!seen[i]);
        seen[i] = true;
        drop_msg(&d);
    }
    ck_assert_int_eq(w->route.inflight, 0);
    ck_assert_ptr_null(x.b.reqs);
    for (int b = 0; b < BRK_ID_BUCKETS; b++) ck_assert_ptr_null(x.b.by_id[b]);
    box_close(&x);
}
END_TEST

/* ---- resends (docs/PROTOCOL.md "Delivery") ------------------------------------------ */

#define TOKEN_A 0x5eedf00d12345678ull
/* another token with TOKEN_A's low bits: its requests share TOKEN_A's
 * buckets of the client index, so only comparing tokens tells them apart */
#define TOKEN_B (TOKEN_A ^ 0x0badc0ff00000000ull)

/* Another client socket: a DEALER of its own, so another routing identity
 * (a client that lost its connection and made a new one). */
static void *client_sock(box_t *x) {
    void *s = sock(x->b.ctx, ZMQ_DEALER);
    ck_assert_int_eq(zmq_connect(s, "inproc://clients"), 0);
    return s;
}

/* A GEN of the tiny shape from socket s with client token `token` (0:
 * none) and `seed`, handled by the broker. */
/* A tiny GEN from s; shift (0: absent) and context's first value (ctx0)
 * vary what it asks for without changing its seed or shape. */
/* The header of a tiny GEN with client token `token` (0: none) and `seed`. */
static wire_val_t *gen_hdr(uint64_t id, uint64_t token, uint64_t seed) {
    wire_val_t *h = wire_hdr("GEN", id), *ls = wv_arr();
    const int64_t l[4] = { 4, 2, 8, 8 };
    for (int i = 0; i < 4; i++) wv_push(ls, wv_u64((uint64_t)l[i]));
    wv_set(h, "model", wv_str("tiny"));
    wv_set(h, "steps", wv_u64(2));
    wv_set(h, "seed", wv_u64(seed));
    wv_set(h, "latent_shape", ls);
    if (token) {
        char hex[17];
        wv_set(h, "client", wv_str(msg_hex64(token, hex)));
    }
    return h;
}

/* Sends GEN header h (freed) from s with a context whose first value is
 * ctx0, and has the broker handle it. */
static void gen_send(box_t *x, void *s, wire_val_t *h, float ctx0) {
    static float ctx[5 * 32];
    ctx[0] = ctx0;
    const int64_t c[2] = { 5, 32 };
    wire_tensor_t t = ts_wire_tensor("context", KERN_F32, 2, c, ctx, sizeof ctx);
    ck_assert_int_eq(wire_send(s, NULL, h, &t, 1), 0);
    wv_free(&h);
    deliver(x, false);
}

static void gen_from_with(box_t *x, void *s, uint64_t id, uint64_t token, uint64_t seed, bool progress, double shift,
                          float ctx0) {
    wire_val_t *h = gen_hdr(id, token, seed);
    if (shift != 0) wv_set(h, "shift", wv_f64(shift));
    if (progress) wv_set(h, "progress", wv_bool(true));
    gen_send(x, s, h, ctx0);
}

static void gen_from(box_t *x, void *s, uint64_t id, uint64_t token, uint64_t seed, bool progress) {
    gen_from_with(x, s, id, token, seed, progress, 0, 0);
}

/* Nothing waits on s: whatever the broker sends, it sent before deliver()
 * returned, so a bounded look is enough. */
static void quiet(void *s, const char *who) {
    zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
    if (zmq_poll(&it, 1, 100) > 0) {
        wire_msg_t *m = take(s, false);
        ck_abort_msg("%s got %s %llu, expected nothing", who, m->type, (unsigned long long)m->id);
    }
}

/* Worker i's next message is a REQUEST: its (broker) id. */
static uint64_t request_on(box_t *x, int i) {
    wire_msg_t *q = take(x->w[i], false);
    ck_assert_str_eq(q->type, "REQUEST");
    uint64_t id = q->id;
    drop_msg(&q);
    return id;
}

/* The next message on s is `type` under client id `id` (an ERROR's code
 * `code` when not NULL). */
static void expect_on(void *s, const char *type, uint64_t id, const char *code) {
    wire_msg_t *d = take(s, false);
    ck_assert_msg(!strcmp(d->type, type), "got %s %llu, expected %s %llu", d->type, (unsigned long long)d->id, type,
                  (unsigned long long)id);
    ck_assert_uint_eq(d->id, id);
    if (code) ck_assert_str_eq(wv_get_str(d->hdr, "code"), code);
    drop_msg(&d);
}

/* Worker 0 answers request rid with a RESULT of the tiny shape. */
static void serve(box_t *x, uint64_t rid) { worker_result(x, 0, wire_hdr("RESULT", rid), 1, 4, 2); }

static int live_requests(const box_t *x) {
    int n = 0;
    for (const brk_req_t *r = x->b.reqs; r; r = r->next) n++;
    return n;
}

/* Nothing live, nothing indexed, and the invariants hold. */
static void all_answered(box_t *x) {
    ck_assert_ptr_null(x->b.reqs);
    for (int i = 0; i < BRK_ID_BUCKETS; i++) ck_assert_ptr_null(x->b.by_client[i]);
    TS_OK(brk_check(&x->b));
}

/* A GEN sent again from another socket (same client token, same id) while
 * its request waits for a worker is attached to it: no second request, and
 * when a worker serves it, its one RESULT goes to the resend's socket, none
 * to the first. The same while it runs: its PROGRESS follows the resend
 * too, and the worker is not sent it again. */
START_TEST(test_a_gen_resent_while_its_request_lives_is_attached_and_answered_once_to_the_resend) {
    box_t x;
    box_open(&x);
    void *c1 = x.trainer, *c2 = client_sock(&x), *c3 = client_sock(&x);
    gen_from(&x, c1, 5, TOKEN_A, 7, false); /* no worker yet: it waits */
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 1);
    gen_from(&x, c2, 5, TOKEN_A, 7, false); /* the client again, on a new socket */
    ck_assert_uint_eq(x.b.resends, 1);
    ck_assert_int_eq(live_requests(&x), 1);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 1);
    TS_OK(brk_check(&x.b));
    quiet(c1, "the first sender");
    quiet(c2, "the resend's sender");
    ready(&x, 0, 1); /* a worker: the request runs */
    uint64_t rid = request_on(&x, 0);
    quiet(x.w[0], "the worker (one request)");
    serve(&x, rid);
    expect_on(c2, "RESULT", 5, NULL);
    quiet(c2, "the resend's sender (one RESULT)");
    quiet(c1, "the first sender");
    all_answered(&x);

    /* resent while it runs: the PROGRESS before goes to the first sender,
     * the PROGRESS and RESULT after to the resend's */
    gen_from(&x, c1, 6, TOKEN_A, 7, true);
    rid = request_on(&x, 0);
    wire_val_t *p = wire_hdr("PROGRESS", rid);
    wv_set(p, "step", wv_u64(1));
    wv_set(p, "steps", wv_u64(2));
    from_worker(&x, 0, p);
    expect_on(c1, "PROGRESS", 6, NULL);
    gen_from(&x, c3, 6, TOKEN_A, 7, true);
    ck_assert_uint_eq(x.b.resends, 2);
    ck_assert_int_eq(live_requests(&x), 1);
    TS_OK(brk_check(&x.b));
    quiet(x.w[0], "the worker (a resend is not run again)");
    p = wire_hdr("PROGRESS", rid);
    wv_set(p, "step", wv_u64(2));
    wv_set(p, "steps", wv_u64(2));
    from_worker(&x, 0, p);
    expect_on(c3, "PROGRESS", 6, NULL);
    serve(&x, rid);
    expect_on(c3, "RESULT", 6, NULL);
    quiet(c3, "the resend's sender (one RESULT)");
    quiet(c1, "the first sender");
    quiet(c2, "a bystander");
    all_answered(&x);
    zmq_close(c2);
    zmq_close(c3);
    box_close(&x);
}
END_TEST

/* PROGRESS never goes backwards within a run: the parts of a group split
 * over a worker's streams report the group's count and can arrive out of
 * order; the broker forwards a count only past the last one (or the same
 * count with a new total: a decode starting), the rest dropped. */
static void progress_from(box_t *x, uint64_t rid, uint64_t step, uint64_t steps, uint64_t dec, uint64_t frames) {
    wire_val_t *p = wire_hdr("PROGRESS", rid);
    wv_set(p, "step", wv_u64(step));
    wv_set(p, "steps", wv_u64(steps));
    if (frames) {
        wv_set(p, "decoded", wv_u64(dec));
        wv_set(p, "decode_frames", wv_u64(frames));
    }
    from_worker(x, 0, p);
}

static void expect_progress(void *s, uint64_t id, uint64_t step, uint64_t steps, uint64_t dec) {
    wire_msg_t *d = take(s, false);
    ck_assert_msg(!strcmp(d->type, "PROGRESS"), "got %s, expected PROGRESS %llu/%llu", d->type,
                  (unsigned long long)step, (unsigned long long)steps);
    uint64_t got = 0, of = 0, dg = 0;
    ck_assert_uint_eq(d->id, id);
    ck_assert(wv_get_u64(d->hdr, "step", &got) && wv_get_u64(d->hdr, "steps", &of));
    (void)wv_get_u64(d->hdr, "decoded", &dg);
    ck_assert_msg(got == step && of == steps && dg == dec, "PROGRESS %llu/%llu (+%llu decoded), expected %llu/%llu "
                  "(+%llu)", (unsigned long long)got, (unsigned long long)of, (unsigned long long)dg,
                  (unsigned long long)step, (unsigned long long)steps, (unsigned long long)dec);
    drop_msg(&d);
}

START_TEST(test_progress_out_of_order_never_goes_backwards_and_the_result_names_the_brokers_boot) {
    box_t x;
    box_open(&x);
    x.b.boot = 0x5eedb007c0ffee01ull; /* (brk_main draws it at start) */
    void *c = x.trainer;
    ready(&x, 0, 1);
    wire_val_t *h = gen_hdr(9, TOKEN_A, 7); /* 6 steps, 2 latent frames */
    wv_set(h, "steps", wv_u64(6));
    wv_set(h, "progress", wv_bool(true));
    gen_send(&x, c, h, 0);
    uint64_t rid = request_on(&x, 0);
    /* six steps' counts crossed, as a split group's parts cross */
    progress_from(&x, rid, 2, 6, 0, 0);
    progress_from(&x, rid, 1, 6, 0, 0);
    progress_from(&x, rid, 4, 6, 0, 0);
    progress_from(&x, rid, 3, 6, 0, 0);
    progress_from(&x, rid, 6, 6, 0, 0);
    progress_from(&x, rid, 5, 6, 0, 0);
    progress_from(&x, rid, 6, 6, 0, 0); /* a repeat */
    expect_progress(c, 9, 2, 6, 0);
    expect_progress(c, 9, 4, 6, 0);
    expect_progress(c, 9, 6, 6, 0);
    quiet(c, "the client (older counts dropped)");
    /* counts past their end are a worker's fault: dropped, never forwarded;
     * so are totals the request cannot have (more steps than its 6) */
    progress_from(&x, rid, 7, 6, 0, 0);
    progress_from(&x, rid, UINT64_MAX, 6, 0, 0);
    progress_from(&x, rid, 7, 7, 0, 0);
    progress_from(&x, rid, UINT64_MAX, UINT64_MAX, 0, 0);
    quiet(c, "the client (counts past their end dropped)");
    serve(&x, rid);
    /* the RESULT names this broker's boot id (a client's next call starts from it) */
    wire_msg_t *d = take(c, false);
    ck_assert_str_eq(d->type, "RESULT");
    ck_assert_uint_eq(d->id, 9);
    msg_result_t res;
    wire_err_t why;
    ck_assert_int_eq(msg_result_decode(d, &res, &why), 0);
    ck_assert_uint_eq(res.boot, 0x5eedb007c0ffee01ull);
    drop_msg(&d);
    all_answered(&x);
    box_close(&x);
}
END_TEST

/* A worker's PROGRESS whose fields are wrong (a step of the wrong type, a
 * total that is no uint) is dropped, logged within the worker's share of
 * the log and counted in STATUS worker_refused, as a PROGRESS past its
 * end and a bad RESULT are. Before, it was dropped with no trace at all. */
START_TEST(test_a_progress_with_bad_fields_is_dropped_and_counted_as_a_worker_refusal) {
    box_t x;
    box_open(&x);
    void *c = x.trainer;
    ready(&x, 0, 1);
    wire_val_t *h = gen_hdr(9, TOKEN_A, 7);
    wv_set(h, "progress", wv_bool(true));
    gen_send(&x, c, h, 0);
    uint64_t rid = request_on(&x, 0);
    ck_assert_uint_eq(x.b.worker_refused, 0);
    wire_val_t *p = wire_hdr("PROGRESS", rid);
    wv_set(p, "step", wv_str("one"));
    wv_set(p, "steps", wv_u64(2));
    from_worker(&x, 0, p);
    p = wire_hdr("PROGRESS", rid);
    wv_set(p, "step", wv_u64(1)); /* a total that is no uint */
    wv_set(p, "steps", wv_f64(2.5));
    from_worker(&x, 0, p);
    ck_assert_uint_eq(x.b.worker_refused, 2);
    progress_from(&x, rid, 7, 2, 0, 0); /* past its end */
    ck_assert_uint_eq(x.b.worker_refused, 3);
    quiet(c, "the client (bad PROGRESS dropped)");
    progress_from(&x, rid, 1, 2, 0, 0); /* a good one still goes on */
    expect_progress(c, 9, 1, 2, 0);
    h = wire_hdr("STATUS", 11);
    ck_assert_int_eq(wire_send(c, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(&x, false);
    wire_msg_t *d = take(c, false);
    ck_assert_str_eq(d->type, "STATUS_REPLY");
    ck_assert_uint_eq(u64_of(d, "worker_refused"), 3);
    ck_assert_uint_eq(u64_of(d, "malformed"), 0);
    drop_msg(&d);
    serve(&x, rid);
    d = take(c, false);
    ck_assert_str_eq(d->type, "RESULT");
    drop_msg(&d);
    all_answered(&x);
    box_close(&x);
}
END_TEST

/* ---- answers to a client whose queue is full (broker/brk_deliver.h) --------------- */

/* A client whose connection holds 2 messages: the broker's client socket
 * made anew (ZeroMQ reads an inproc peer's HWM at its bind) as brk_main
 * makes it -- ZMQ_ROUTER_MANDATORY, sends that never wait -- with a send
 * HWM of 1, and a client with a receive HWM of 1. */
static void *small_client(box_t *x) {
    int one = 1, zero = 0;
    zmq_close(x->b.clients);
    x->b.clients = sock(x->b.ctx, ZMQ_ROUTER);
    zmq_setsockopt(x->b.clients, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(x->b.clients, ZMQ_SNDTIMEO, &zero, sizeof zero);
    zmq_setsockopt(x->b.clients, ZMQ_SNDHWM, &one, sizeof one);
    ck_assert_int_eq(zmq_bind(x->b.clients, "inproc://small-clients"), 0);
    void *s = sock(x->b.ctx, ZMQ_DEALER);
    zmq_setsockopt(s, ZMQ_RCVHWM, &one, sizeof one);
    ck_assert_int_eq(zmq_connect(s, "inproc://small-clients"), 0);
    return s;
}

/* The loop's retries until nothing is held (what the client read made
 * room for), at most 2 s: ZeroMQ tells the broker's socket about the room
 * through its own commands, which a send reads. */
static void retry_until_sent(box_t *x, uint64_t left) {
    for (int i = 0; i < 2000 && x->b.answers_held > left; i++) {
        brk_deliver_retry(&x->b, brk_now_ms());
        if (x->b.answers_held > left) zmq_poll(NULL, 0, 1);
    }
    ck_assert_uint_eq(x->b.answers_held, left);
}

static void status_from(box_t *x, void *s, uint64_t id) {
    wire_val_t *h = wire_hdr("STATUS", id);
    ck_assert_int_eq(wire_send(s, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(x, false);
}

/* A RESULT that finds its client's queue full (a burst of PROGRESS filled
 * it) is held, not dropped: the client read nothing and waited out its
 * timeout before. The answers after it (a STATUS_REPLY, another request's
 * ERROR) wait behind it, PROGRESS meanwhile is dropped and counted, and
 * each goes, in order, as the client reads and makes room. */
START_TEST(test_an_answer_that_finds_its_clients_queue_full_is_held_and_sent_in_order_as_it_reads) {
    box_t x;
    box_open(&x);
    void *c = small_client(&x);
    ready_with(&x, 0, 1, 2);
    wire_val_t *h = gen_hdr(9, TOKEN_A, 7);
    wv_set(h, "steps", wv_u64(6));
    wv_set(h, "progress", wv_bool(true));
    gen_send(&x, c, h, 0);
    uint64_t rid = request_on(&x, 0);
    gen_from(&x, c, 10, TOKEN_A, 8, true);
    uint64_t rid2 = request_on(&x, 0);
    const uint64_t before = x.b.undelivered, before_p = x.b.progress_dropped;
    for (uint64_t k = 1; k <= 6; k++) progress_from(&x, rid, k, 6, 0, 0);
    ck_assert_uint_eq(x.b.progress_dropped, before_p + 4); /* two fit */
    ck_assert_uint_eq(x.b.undelivered, before); /* (PROGRESS counts apart) */
    serve(&x, rid);
    ck_assert_uint_eq(x.b.answers_held, 1);
    ck_assert_uint_eq(x.b.progress_dropped, before_p + 4);
    progress_from(&x, rid2, 1, 2, 0, 0); /* behind an answer held: dropped */
    ck_assert_uint_eq(x.b.progress_dropped, before_p + 5);
    status_from(&x, c, 11);
    wire_val_t *e = wire_hdr("ERROR", rid2);
    wv_set(e, "code", wv_str(WIRE_E_INTERNAL));
    wv_set(e, "message", wv_str("ends the test"));
    from_worker(&x, 0, e);
    ck_assert_uint_eq(x.b.answers_held, 3);
    ck_assert_uint_eq(x.b.undelivered, before);
    all_answered(&x); /* (the requests ended: only their answers wait) */
    expect_progress(c, 9, 1, 6, 0);
    expect_progress(c, 9, 2, 6, 0);
    quiet(c, "the client (its answers held)");
    retry_until_sent(&x, 1); /* room for two */
    expect_on(c, "RESULT", 9, NULL);
    expect_on(c, "STATUS_REPLY", 11, NULL);
    retry_until_sent(&x, 0);
    expect_on(c, "ERROR", 10, WIRE_E_INTERNAL);
    ck_assert_uint_eq(x.b.undelivered, before);
    ck_assert_uint_eq(x.b.progress_dropped, before_p + 5);
    /* STATUS says so: the PROGRESS apart, none undelivered */
    wire_val_t *sh = wire_hdr("STATUS", 12);
    ck_assert_int_eq(wire_send(c, NULL, sh, NULL, 0), 0);
    wv_free(&sh);
    deliver(&x, false);
    wire_msg_t *d = take(c, false);
    ck_assert_str_eq(d->type, "STATUS_REPLY");
    ck_assert_uint_eq(u64_of(d, "progress_dropped"), before_p + 5);
    ck_assert_uint_eq(u64_of(d, "undelivered"), before);
    drop_msg(&d);
    TS_OK(brk_check(&x.b));
    zmq_close(c);
    box_close(&x);
}
END_TEST

/* A client must not pin the broker's memory by never reading: its held
 * answers are dropped, each counted undelivered, once it took none of
 * them for BRK_HELD_MS, and an answer that would take the answers held
 * past --max-held-mb is never held. */
START_TEST(test_answers_held_for_a_client_that_never_reads_are_dropped_and_counted_past_their_bounds) {
    box_t x;
    box_open(&x);
    void *c = small_client(&x);
    ready_with(&x, 0, 1, 2);
    gen_from(&x, c, 9, TOKEN_A, 7, false);
    uint64_t rid = request_on(&x, 0);
    gen_from(&x, c, 10, TOKEN_A, 8, false);
    uint64_t rid2 = request_on(&x, 0);
    status_from(&x, c, 1);
    status_from(&x, c, 2); /* the queue is full */
    const uint64_t before = x.b.undelivered;
    serve(&x, rid);
    ck_assert_uint_eq(x.b.answers_held, 1);
    brk_deliver_retry(&x.b, brk_now_ms() + BRK_HELD_MS / 2);
    ck_assert_uint_eq(x.b.answers_held, 1);
    brk_deliver_retry(&x.b, brk_now_ms() + BRK_HELD_MS);
    ck_assert_uint_eq(x.b.answers_held, 0);
    ck_assert_uint_eq(x.b.answers_held_bytes, 0);
    ck_assert_uint_eq(x.b.undelivered, before + 1);
    /* the bytes: a RESULT larger than --max-held-mb allows is dropped at once */
    x.b.opt.max_held_bytes = 1024; /* the RESULT's latent alone is 2 KiB */
    serve(&x, rid2);
    ck_assert_uint_eq(x.b.answers_held, 0);
    ck_assert_uint_eq(x.b.undelivered, before + 2);
    all_answered(&x);
    expect_on(c, "STATUS_REPLY", 1, NULL);
    expect_on(c, "STATUS_REPLY", 2, NULL);
    quiet(c, "the client (its answers dropped)");
    zmq_close(c);
    box_close(&x);
}
END_TEST

/* Worker 0 ends request rid with an ERROR; the client gets it under id,
 * and nothing is left live. */
static void end_by_worker(box_t *x, void *c, uint64_t rid, uint64_t id) {
    wire_val_t *e = wire_hdr("ERROR", rid);
    wv_set(e, "code", wv_str(WIRE_E_INTERNAL));
    wv_set(e, "message", wv_str("ends the test"));
    from_worker(x, 0, e);
    expect_on(c, "ERROR", id, WIRE_E_INTERNAL);
    all_answered(x);
}

/* A decoded GEN's PROGRESS: after its steps, its decode's frames count on
 * (the first decode message, 0 of 2 frames, changes the total), never
 * backwards and never past the end. */
START_TEST(test_a_decoded_gens_progress_counts_its_frames_on_and_never_past_the_end) {
    box_t x;
    box_open(&x);
    void *c = x.trainer;
    ready_vae(&x, 0);
    wire_val_t *h = gen_hdr(9, TOKEN_A, 7); /* 6 steps, 2 latent frames, decoded */
    wv_set(h, "steps", wv_u64(6));
    wv_set(h, "progress", wv_bool(true));
    wv_set(h, "output", wv_str("frames"));
    gen_send(&x, c, h, 0);
    uint64_t rid = request_on(&x, 0);
    progress_from(&x, rid, 6, 6, 0, 0);
    expect_progress(c, 9, 6, 6, 0);
    /* the decode: its first message (0 of 2 frames) changes the total */
    progress_from(&x, rid, 6, 6, 0, 2);
    progress_from(&x, rid, 6, 6, 0, 0); /* another part's last step, arriving after the decode began */
    progress_from(&x, rid, 6, 6, 1, 2);
    progress_from(&x, rid, 6, 6, 0, 2);
    progress_from(&x, rid, 6, 6, 2, 2);
    expect_progress(c, 9, 6, 6, 0); /* 0 of 2 frames: a new total */
    expect_progress(c, 9, 6, 6, 1);
    expect_progress(c, 9, 6, 6, 2);
    quiet(c, "the client (an older decode count, and a last step after the decode began, dropped)");
    /* counts past their end are a worker's fault: dropped, never forwarded;
     * so are totals the request cannot have (more steps than its 6, more
     * frames than its 2), which would pin the count and drop every later
     * one as going backwards */
    progress_from(&x, rid, 7, 6, 2, 2);
    progress_from(&x, rid, 6, 6, 3, 2);
    progress_from(&x, rid, UINT64_MAX, 6, 0, 0);
    progress_from(&x, rid, 7, 7, 2, 2);
    progress_from(&x, rid, 6, 6, 3, 3);
    progress_from(&x, rid, UINT64_MAX, UINT64_MAX, 0, 0);
    progress_from(&x, rid, 6, 6, UINT64_MAX, UINT64_MAX);
    quiet(c, "the client (counts past their end dropped)");
    end_by_worker(&x, c, rid, 9);
    box_close(&x);
}
END_TEST

/* A GEN whose output is its latent decodes nothing: a PROGRESS counting
 * decoded frames for it is a worker's fault, dropped (helper-87 saw one
 * forwarded); its step counts still go through. */
START_TEST(test_a_latent_gens_progress_never_counts_decoded_frames) {
    box_t x;
    box_open(&x);
    void *c = x.trainer;
    ready(&x, 0, 1);
    wire_val_t *h = gen_hdr(9, TOKEN_A, 7); /* 2 steps, 2 latent frames, output latent */
    wv_set(h, "progress", wv_bool(true));
    gen_send(&x, c, h, 0);
    uint64_t rid = request_on(&x, 0);
    progress_from(&x, rid, 1, 2, 0, 0);
    progress_from(&x, rid, 2, 2, 0, 2); /* frames it never decodes */
    progress_from(&x, rid, 2, 2, 1, 2);
    progress_from(&x, rid, 2, 2, 0, 0);
    expect_progress(c, 9, 1, 2, 0);
    expect_progress(c, 9, 2, 2, 0);
    quiet(c, "the client (decoded frames of a latent GEN dropped)");
    end_by_worker(&x, c, rid, 9);
    box_close(&x);
}
END_TEST

/* A group's PROGRESS counts every sample's steps (and decoded frames):
 * up to n x its steps, n x its latent frames, and no further. */
START_TEST(test_a_groups_progress_runs_to_n_times_its_steps_and_frames_and_no_further) {
    box_t x;
    box_open(&x);
    void *c = x.trainer;
    ready_vae(&x, 0);
    wire_val_t *h = gen_hdr(9, TOKEN_A, 7); /* 2 steps, 2 latent frames, decoded */
    wv_set(h, "n", wv_u64(3));
    wv_set(h, "progress", wv_bool(true));
    wv_set(h, "output", wv_str("frames"));
    gen_send(&x, c, h, 0);
    uint64_t rid = request_on(&x, 0);
    progress_from(&x, rid, 2, 6, 0, 0);
    progress_from(&x, rid, 6, 6, 0, 0);
    progress_from(&x, rid, 7, 7, 0, 0); /* more than 3 x 2 steps */
    progress_from(&x, rid, 6, 6, 6, 6);
    progress_from(&x, rid, 6, 6, 7, 7); /* more than 3 x 2 frames */
    expect_progress(c, 9, 2, 6, 0);
    expect_progress(c, 9, 6, 6, 0);
    expect_progress(c, 9, 6, 6, 6);
    quiet(c, "the client (a group's counts past n x its steps or frames dropped)");
    end_by_worker(&x, c, rid, 9);
    box_close(&x);
}
END_TEST

/* A GEN of tiny with a 16 MiB latent (its time at 32 MiB/s: 500 ms) sent
 * by the trainer (deliver() hands it to the broker, which then sends the
 * worker the HEARTBEAT that announces it and the REQUEST). */
static uint64_t big_gen(box_t *x, uint64_t id, uint64_t seed) {
    static float ctx[5 * 32], lat[4 * 16 * 256 * 256];
    const int64_t cs[2] = { 5, 32 }, ls[4] = { 4, 16, 256, 256 };
    wire_val_t *h = wire_hdr("GEN", id), *shape = wv_arr();
    for (int i = 0; i < 4; i++) wv_push(shape, wv_u64((uint64_t)ls[i]));
    wv_set(h, "model", wv_str("tiny"));
    wv_set(h, "steps", wv_u64(2));
    wv_set(h, "seed", wv_u64(seed));
    wv_set(h, "latent_shape", shape);
    wire_tensor_t t[2] = { ts_wire_tensor("context", KERN_F32, 2, cs, ctx, sizeof ctx),
                           ts_wire_tensor("latent", KERN_F32, 4, ls, lat, sizeof lat) };
    ck_assert_int_eq(wire_send(x->trainer, NULL, h, t, 2), 0);
    wv_free(&h);
    return sizeof ctx + sizeof lat;
}

/* A REQUEST of a MiB or more goes after a HEARTBEAT that says how large
 * it is ("incoming"), and its worker is not expired for silence until it
 * has had twice its time at 32 MiB/s (to take it in, and to handle it
 * without heartbeats): nothing else reaches a worker while a large
 * message arrives, and helper-87 saw a healthy worker dropped twice over
 * one 256 MiB GEN (worker_lost). */
START_TEST(test_a_large_request_is_announced_and_its_worker_given_time_before_it_counts_as_silent) {
    box_t x;
    box_open(&x);
    x.b.opt.heartbeat_ms = 100; /* silent for 300 ms: dead, but for the grace */
    x.b.opt.liveness = 3;
    ready(&x, 0, 1);
    brk_worker_t *w = x.b.w[0];
    uint64_t bytes = big_gen(&x, 3, 7);
    int64_t sent = brk_now_ms();
    w->seen_ms = sent; /* heard just now (a sanitizer takes a while to send 16 MiB) */
    deliver(&x, false);
    wire_msg_t *m = take(x.w[0], false);
    ck_assert_str_eq(m->type, "HEARTBEAT");
    ck_assert_uint_eq(msg_heartbeat_incoming(m), bytes);
    drop_msg(&m);
    request_on(&x, 0);
    const int64_t grace = (int64_t)(bytes / MSG_SLOW_BYTES_PER_MS);
    ck_assert_int_ge(w->quiet_until_ms, sent + 2 * grace);
    brk_workers_timers(&x.b, w->seen_ms + 600, 1); /* silent twice its liveness, inside the grace */
    ck_assert_msg(!w->dead, "expired inside the grace of a large REQUEST");
    brk_workers_timers(&x.b, w->quiet_until_ms + 1, 1);
    ck_assert_msg(w->dead && !strcmp(w->dead_why, "expired"), "still alive after the grace");
    box_close(&x);
}
END_TEST

/* Large REQUESTs back to back: each one's time is added after the last
 * one's (they arrive one after another); but a worker already silent past
 * its liveness gets no more time by being sent more (helper-88: a hung
 * worker kept alive by each large GEN routed to it). */
START_TEST(test_large_requests_add_up_their_grace_but_a_silent_worker_gets_none) {
    box_t x;
    box_open(&x);
    x.b.opt.heartbeat_ms = 100;
    x.b.opt.liveness = 3;
    ready_with(&x, 0, 1, 4);
    brk_worker_t *w = x.b.w[0];
    int64_t before = 0;
    for (int k = 0; k < 3; k++) {
        uint64_t bytes = big_gen(&x, 3 + (uint64_t)k, (uint64_t)k);
        w->seen_ms = k < 2 ? brk_now_ms() : brk_now_ms() - 10000; /* heard just now; then silent for 10 s */
        deliver(&x, false);
        wire_msg_t *m = take(x.w[0], false);
        ck_assert_str_eq(m->type, "HEARTBEAT");
        drop_msg(&m);
        request_on(&x, 0);
        const int64_t grace = (int64_t)(bytes / MSG_SLOW_BYTES_PER_MS);
        if (k == 1) ck_assert_int_ge(w->quiet_until_ms, before + 2 * grace); /* after the first's */
        if (k == 2) ck_assert_int_eq(w->quiet_until_ms, before);             /* silent: none added */
        before = w->quiet_until_ms;
    }
    box_close(&x);
}
END_TEST

/* The other way: a worker's HEARTBEAT with "incoming" (a large RESULT
 * follows, and nothing else of the worker's until it has) keeps the broker
 * from expiring it for that message's time at 32 MiB/s from then, and at
 * most a 512 MiB frame's time. */
START_TEST(test_a_workers_announced_large_message_postpones_its_expiry) {
    box_t x;
    box_open(&x);
    x.b.opt.heartbeat_ms = 100;
    x.b.opt.liveness = 3;
    ready(&x, 0, 1);
    brk_worker_t *w = x.b.w[0];
    wire_val_t *h = wire_hdr("HEARTBEAT", 0);
    wv_set(h, "incoming", wv_u64((uint64_t)64 << 20)); /* 64 MiB: 2 s */
    int64_t before = brk_now_ms();
    from_worker(&x, 0, h);
    ck_assert_int_ge(w->quiet_until_ms, before + 1999);
    brk_workers_timers(&x.b, w->seen_ms + 1000, 1); /* silent past its 300 ms, inside the 2 s */
    ck_assert_msg(!w->dead, "expired while its announced message arrives");
    brk_workers_timers(&x.b, w->quiet_until_ms + 1, 1);
    ck_assert_msg(w->dead, "alive past the announced message's time");
    box_close(&x);
    box_open(&x); /* a huge one is bounded */
    ready(&x, 0, 1);
    h = wire_hdr("HEARTBEAT", 0);
    wv_set(h, "incoming", wv_u64(UINT64_MAX));
    before = brk_now_ms();
    from_worker(&x, 0, h);
    ck_assert_int_le(x.b.w[0]->quiet_until_ms, brk_now_ms() + (int64_t)(WIRE_MAX_FRAME / MSG_SLOW_BYTES_PER_MS));
    box_close(&x);
}
END_TEST

/* A worker's announcements do not add up: one connection keeps order, so
 * what an earlier HEARTBEAT announced has come when the next one does (or
 * never will). A worker that sent 60 announcing 64 MiB each and then went
 * silent was kept 120 s, requests routed to it (found by
 * tests/cli_adversarial_peers.sh); it is expired after one message's time
 * now. A large REQUEST's grace still stands. */
START_TEST(test_a_workers_announcements_do_not_add_up_past_one_messages_time) {
    box_t x;
    box_open(&x);
    x.b.opt.heartbeat_ms = 100;
    x.b.opt.liveness = 3;
    ready(&x, 0, 1);
    brk_worker_t *w = x.b.w[0];
    const int64_t grace = (int64_t)(((uint64_t)64 << 20) / MSG_SLOW_BYTES_PER_MS); /* 2 s */
    int64_t before = brk_now_ms();
    for (int k = 0; k < 60; k++) {
        wire_val_t *h = wire_hdr("HEARTBEAT", 0);
        wv_set(h, "incoming", wv_u64((uint64_t)64 << 20));
        from_worker(&x, 0, h);
    }
    ck_assert_int_ge(w->quiet_until_ms, before + grace);
    ck_assert_int_le(w->quiet_until_ms, brk_now_ms() + grace);
    brk_workers_timers(&x.b, brk_now_ms() + grace + 1, 1);
    ck_assert_msg(w->dead && !strcmp(w->dead_why, "expired"), "kept past one announced message's time");
    box_close(&x);
    box_open(&x); /* an announcement does not cut a large REQUEST's grace short */
    x.b.opt.heartbeat_ms = 100;
    x.b.opt.liveness = 3;
    ready(&x, 0, 1);
    w = x.b.w[0];
    w->quiet_until_ms = brk_now_ms() + 100000;
    wire_val_t *h = wire_hdr("HEARTBEAT", 0);
    wv_set(h, "incoming", wv_u64((uint64_t)64 << 20));
    from_worker(&x, 0, h);
    brk_workers_timers(&x.b, brk_now_ms() + 50000, 1);
    ck_assert_msg(!w->dead, "a REQUEST's grace was cut short by the worker's announcement");
    box_close(&x);
}
END_TEST

/* A small REQUEST goes bare: no HEARTBEAT before it, no grace. */
START_TEST(test_a_small_request_goes_unannounced_and_leaves_the_liveness_as_it_was) {
    box_t x;
    box_open(&x);
    x.b.opt.heartbeat_ms = 10;
    x.b.opt.liveness = 3;
    ready(&x, 0, 1);
    gen_from(&x, x.trainer, 3, TOKEN_A, 7, false);
    request_on(&x, 0); /* the first message on the worker's socket */
    brk_worker_t *w = x.b.w[0];
    ck_assert_int_eq(w->quiet_until_ms, 0);
    brk_workers_timers(&x.b, w->seen_ms + 31, 1);
    ck_assert_msg(w->dead, "not expired after its liveness");
    box_close(&x);
}
END_TEST

/* A prompt GEN needs the model's text_len, from a worker's READY configs.
 * A model announced without one (by a worker that is not reel-worker) is
 * bad_request at once, saying so, and the message names its GEN; a model
 * nobody announces is no_worker (helper-87 found the first answered as the
 * second). Both begin "GEN: " where they are the GEN's fault. */
START_TEST(test_a_prompt_for_a_model_announced_without_a_config_is_bad_request_naming_why) {
    box_t x;
    box_open(&x);
    void *c = x.trainer;
    ready(&x, 0, 1); /* tiny, no configs */
    for (int i = 0; i < 2; i++) {
        wire_val_t *h = gen_hdr(5 + (uint64_t)i, TOKEN_A, 7);
        if (i) wv_set(h, "model", wv_str("nosuch"));
        wv_set(h, "prompt", wv_str("a cat"));
        ck_assert_int_eq(wire_send(c, NULL, h, NULL, 0), 0);
        wv_free(&h);
        deliver(&x, false);
        wire_msg_t *d = take(c, false);
        ck_assert_str_eq(d->type, "ERROR");
        ck_assert_uint_eq(d->id, 5 + (uint64_t)i);
        const char *msg = wv_get_str(d->hdr, "message");
        if (i == 0) {
            ck_assert_str_eq(wv_get_str(d->hdr, "code"), "bad_request");
            ck_assert_msg(!strncmp(msg, "GEN: ", 5) && strstr(msg, "model tiny takes no 'prompt' here: its workers "
                                                                      "announce no config"),
                          "'%s'", msg);
        } else {
            ck_assert_str_eq(wv_get_str(d->hdr, "code"), "no_worker");
            ck_assert_msg(strstr(msg, "no live worker announces model nosuch"), "'%s'", msg);
        }
        drop_msg(&d);
    }
    all_answered(&x);
    box_close(&x);
}
END_TEST

/* The next message on s is ERROR bad_request to GEN id, naming `field` as
 * the one its resend changed. */
static void expect_differs(void *s, uint64_t id, const char *field) {
    wire_msg_t *d = take(s, false);
    ck_assert_str_eq(d->type, "ERROR");
    ck_assert_uint_eq(d->id, id);
    ck_assert_str_eq(wv_get_str(d->hdr, "code"), "bad_request");
    char want[64];
    snprintf(want, sizeof want, "(its '%s' differs", field);
    ck_assert_msg(strstr(wv_get_str(d->hdr, "message"), want), "'%s' does not name %s", wv_get_str(d->hdr, "message"),
                  field);
    drop_msg(&d);
}

/* A GEN under a live request's client token and id whose fields differ
 * (here its seed) is not that request: bad_request to its sender, and the
 * live request goes on, answered to its own sender -- whether it runs or
 * waits. */
START_TEST(test_a_resend_that_differs_from_its_live_request_is_bad_request_and_the_request_goes_on) {
    box_t x;
    box_open(&x);
    void *c1 = x.trainer, *c2 = client_sock(&x);
    ready(&x, 0, 1); /* one request at a time */
    gen_from(&x, c1, 5, TOKEN_A, 7, false);
    uint64_t r5 = request_on(&x, 0);
    /* id 5 + BRK_ID_BUCKETS: the same bucket of the client index as 5, so
     * only comparing ids tells them apart; it waits for the slot */
    gen_from(&x, c1, 5 + BRK_ID_BUCKETS, TOKEN_A, 7, false);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 1);
    gen_from(&x, c2, 5, TOKEN_A, 8, false); /* another seed: not the running one */
    wire_msg_t *d = take(c2, false);
    ck_assert_str_eq(d->type, "ERROR");
    ck_assert_uint_eq(d->id, 5);
    ck_assert_str_eq(wv_get_str(d->hdr, "code"), "bad_request");
    ck_assert_msg(strstr(wv_get_str(d->hdr, "message"), "names a live request that is not this one (its 'seed' differs"),
                  "'%s'", wv_get_str(d->hdr, "message"));
    drop_msg(&d);
    gen_from(&x, c2, 5 + BRK_ID_BUCKETS, TOKEN_A, 1, false); /* nor the waiting one */
    expect_differs(c2, 5 + BRK_ID_BUCKETS, "seed");
    /* the same seed and shape, but another shift, or one context value
     * changed: another request too (its sender would get a result it did
     * not ask for), and the answer names the field that differs */
    gen_from_with(&x, c2, 5, TOKEN_A, 7, false, 3.0, 0);
    expect_differs(c2, 5, "shift");
    gen_from_with(&x, c2, 5, TOKEN_A, 7, false, 0, 1.0f);
    expect_differs(c2, 5, "context");
    gen_from_with(&x, c2, 5 + BRK_ID_BUCKETS, TOKEN_A, 7, false, 0, -0.0f); /* -0 is not 0 to the bytes */
    expect_differs(c2, 5 + BRK_ID_BUCKETS, "context");
    ck_assert_uint_eq(x.b.resends, 0);
    ck_assert_int_eq(live_requests(&x), 2);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 1);
    TS_OK(brk_check(&x.b));
    quiet(x.w[0], "the worker");
    quiet(c1, "the first sender");
    serve(&x, r5);
    expect_on(c1, "RESULT", 5, NULL);
    uint64_t r2 = request_on(&x, 0);
    serve(&x, r2);
    expect_on(c1, "RESULT", 5 + BRK_ID_BUCKETS, NULL);
    quiet(c1, "the first sender");
    quiet(c2, "the refused sender");
    all_answered(&x);
    zmq_close(c2);
    box_close(&x);
}
END_TEST

/* A tiny GEN from s (as gen_from) that spells out one default: 0 solver
 * "euler", 1 output "latent", 2 seeds [seed] (n = 1), 3 a cfg of 5 that
 * nothing reads (no uncond), 4 n = 1 and eta 0.25 without sde; 5 seeds
 * [seed + 1]: another seed. */
static void gen_spelled(box_t *x, void *s, uint64_t id, uint64_t token, uint64_t seed, int what) {
    wire_val_t *h = gen_hdr(id, token, seed);
    if (what == 0) wv_set(h, "solver", wv_str("euler"));
    if (what == 1) wv_set(h, "output", wv_str("latent"));
    if (what == 2 || what == 5) {
        wire_val_t *ss = wv_arr();
        wv_push(ss, wv_u64(what == 2 ? seed : seed + 1));
        wv_set(h, "seeds", ss);
    }
    if (what == 3) wv_set(h, "cfg", wv_f64(5.0));
    if (what == 4) {
        wv_set(h, "n", wv_u64(1));
        wv_set(h, "eta", wv_f64(0.25));
    }
    gen_send(x, s, h, 0);
}

/* "A field that is absent takes its default": a resend that spells a
 * default out, or adds a field the request does not read, asks for what
 * the live request asks and is attached to it (a client library that
 * writes its defaults out, resending after a reconnect, keeps its
 * request); a different seed given as seeds is still another request. */
START_TEST(test_a_resend_that_spells_out_defaults_is_the_same_live_request) {
    box_t x;
    box_open(&x);
    void *c1 = x.trainer, *c2 = client_sock(&x);
    ready(&x, 0, 1);
    gen_from(&x, c1, 5, TOKEN_A, 7, false);
    uint64_t r5 = request_on(&x, 0);
    for (int what = 0; what < 5; what++) {
        gen_spelled(&x, c2, 5, TOKEN_A, 7, what);
        quiet(c2, "the resend's sender (attached)");
        ck_assert_msg(x.b.resends == (uint64_t)what + 1, "spelled default %d: %llu resends", what,
                      (unsigned long long)x.b.resends);
    }
    gen_spelled(&x, c2, 5, TOKEN_A, 7, 5);
    expect_differs(c2, 5, "seeds");
    ck_assert_uint_eq(x.b.resends, 5);
    ck_assert_int_eq(live_requests(&x), 1);
    serve(&x, r5);
    expect_on(c2, "RESULT", 5, NULL);
    quiet(c1, "the first sender");
    quiet(x.w[0], "the worker (a resend is not run again)");
    all_answered(&x);
    zmq_close(c2);
    box_close(&x);
}
END_TEST

/* A RESULT names the worker the request ran on: the broker sent it there,
 * so a worker's RESULT that names another (a bug, or a worker claiming
 * another's work) reaches the client corrected, and one that names none
 * gets its name. */
START_TEST(test_a_result_names_the_worker_the_broker_sent_the_request_to) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    const char *claimed[] = { "someoneelse", NULL };
    for (int k = 0; k < 2; k++) {
        gen_from(&x, x.trainer, 40 + (uint64_t)k, TOKEN_A, 7, false);
        uint64_t r = request_on(&x, 0);
        wire_val_t *h = wire_hdr("RESULT", r);
        if (claimed[k]) wv_set(h, "worker", wv_str(claimed[k]));
        worker_result(&x, 0, h, 1, 4, 2);
        wire_msg_t *d = take(x.trainer, false);
        ck_assert_str_eq(d->type, "RESULT");
        ck_assert_uint_eq(d->id, 40 + (uint64_t)k);
        ck_assert_str_eq(wv_get_str(d->hdr, "worker"), "w0");
        drop_msg(&d);
    }
    all_answered(&x);
    box_close(&x);
}
END_TEST

/* A client id is only unique per client token: the same id under another
 * token, or under none, is a request of its own, each answered to its
 * sender. */
START_TEST(test_the_same_id_under_another_token_or_none_is_a_request_of_its_own) {
    box_t x;
    box_open(&x);
    void *c1 = x.trainer, *c2 = client_sock(&x), *c3 = client_sock(&x);
    ready(&x, 0, 1);
    gen_from(&x, c1, 5, TOKEN_A, 7, false);
    uint64_t ra = request_on(&x, 0);
    gen_from(&x, c2, 5, TOKEN_B, 7, false);
    gen_from(&x, c3, 5, 0, 7, false);
    ck_assert_uint_eq(x.b.resends, 0);
    ck_assert_int_eq(live_requests(&x), 3);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 2);
    TS_OK(brk_check(&x.b));
    quiet(c2, "the second client");
    quiet(c3, "the third client");
    serve(&x, ra);
    expect_on(c1, "RESULT", 5, NULL);
    uint64_t rb = request_on(&x, 0); /* FIFO: token B's, then the untokened one */
    ck_assert_uint_ne(rb, ra);
    serve(&x, rb);
    expect_on(c2, "RESULT", 5, NULL);
    uint64_t rn = request_on(&x, 0);
    ck_assert_uint_ne(rn, rb);
    serve(&x, rn);
    expect_on(c3, "RESULT", 5, NULL);
    quiet(c1, "the first client");
    quiet(c2, "the second client");
    quiet(c3, "the third client");
    all_answered(&x);
    zmq_close(c2);
    zmq_close(c3);
    box_close(&x);
}
END_TEST

/* Once answered, a request is forgotten: its client token and id sent
 * again is a new request, run and answered again (from either socket). */
START_TEST(test_an_answered_request_is_forgotten_and_its_id_again_is_a_new_request) {
    box_t x;
    box_open(&x);
    void *c1 = x.trainer, *c2 = client_sock(&x);
    ready(&x, 0, 1);
    gen_from(&x, c1, 5, TOKEN_A, 7, false);
    uint64_t r1 = request_on(&x, 0);
    serve(&x, r1);
    expect_on(c1, "RESULT", 5, NULL);
    all_answered(&x);
    gen_from(&x, c1, 5, TOKEN_A, 7, false);
    uint64_t r2 = request_on(&x, 0);
    ck_assert_uint_ne(r2, r1);
    serve(&x, r2);
    expect_on(c1, "RESULT", 5, NULL);
    all_answered(&x);
    gen_from(&x, c2, 5, TOKEN_A, 7, false);
    uint64_t r3 = request_on(&x, 0);
    ck_assert_uint_ne(r3, r2);
    serve(&x, r3);
    expect_on(c2, "RESULT", 5, NULL);
    ck_assert_uint_eq(x.b.resends, 0);
    quiet(c1, "the first socket");
    quiet(c2, "the second socket");
    all_answered(&x);
    zmq_close(c2);
    box_close(&x);
}
END_TEST

/* A request given up at its deadline (answered timeout while its worker
 * still holds it) leaves the client index: its token and id sent again is
 * a new request, which a further resend attaches to; the worker's late
 * RESULT of the old one reaches nobody. */
START_TEST(test_a_resend_of_an_abandoned_request_is_a_new_request) {
    box_t x;
    box_open(&x);
    void *c1 = x.trainer, *c2 = client_sock(&x), *c3 = client_sock(&x);
    ready(&x, 0, 1);
    gen_from(&x, c1, 5, TOKEN_A, 7, false);
    uint64_t r1 = request_on(&x, 0);
    brk_req_timers(&x.b, brk_now_ms() + 1000000);
    expect_on(c1, "ERROR", 5, "timeout");
    ck_assert_int_eq(x.b.reqs->state, REQ_ABANDONED);
    TS_OK(brk_check(&x.b));
    gen_from(&x, c2, 5, TOKEN_A, 7, false); /* a new request: it waits for the abandoned one's slot */
    ck_assert_uint_eq(x.b.resends, 0);
    ck_assert_int_eq(live_requests(&x), 2);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 1);
    TS_OK(brk_check(&x.b));
    quiet(c2, "the resend's sender");
    gen_from(&x, c3, 5, TOKEN_A, 7, false); /* attached to the new one, not the abandoned */
    ck_assert_uint_eq(x.b.resends, 1);
    ck_assert_int_eq(live_requests(&x), 2);
    TS_OK(brk_check(&x.b));
    serve(&x, r1); /* late: discarded, its slot freed, the new request runs */
    uint64_t r2 = request_on(&x, 0);
    ck_assert_uint_ne(r2, r1);
    quiet(c1, "the first sender (the late RESULT is not forwarded)");
    quiet(c2, "the second sender");
    quiet(c3, "the third sender");
    serve(&x, r2);
    expect_on(c3, "RESULT", 5, NULL);
    quiet(c1, "the first sender");
    quiet(c2, "the second sender");
    quiet(c3, "the third sender (one RESULT)");
    all_answered(&x);
    zmq_close(c2);
    zmq_close(c3);
    box_close(&x);
}
END_TEST

/* ---- CANCEL (docs/PROTOCOL.md "Cancelling") --------------------------------------------- */

/* READY of worker i serving tiny at version 1 with `slots` requests at once. */
static void ready_slots(box_t *x, int i, uint64_t slots) { ready_with(x, i, 1, slots); }

/* A CANCEL of client id `id` from socket s (token 0: none). */
static void cancel_from(box_t *x, void *s, uint64_t id, uint64_t token) {
    wire_val_t *h = wire_hdr("CANCEL", id);
    if (token) {
        char hex[17];
        wv_set(h, "client", wv_str(msg_hex64(token, hex)));
    }
    ck_assert_int_eq(wire_send(s, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(x, false);
}

/* A queued GEN is dropped and answered cancelled; a running one is
 * answered at once, its worker is told, and its slot stays taken until the
 * worker's answer; only the GEN's connection or its token names it; an
 * unknown_type ERROR (a worker older than CANCEL) ends no request. */
START_TEST(test_cancel_names_only_its_own_gen_and_a_running_one_keeps_its_slot_until_the_worker_answers) {
    box_t x;
    box_open(&x);
    void *c1 = x.trainer, *c2 = client_sock(&x);
    ready_slots(&x, 0, 1);
    gen_from(&x, c1, 1, TOKEN_A, 7, false);
    const uint64_t rid1 = request_on(&x, 0);
    gen_from(&x, c1, 2, TOKEN_A, 8, false); /* the one slot is taken: it waits */
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 1);

    cancel_from(&x, c2, 2, 0);       /* another connection, no token: names nothing */
    cancel_from(&x, c2, 2, TOKEN_B); /* another token: nothing */
    cancel_from(&x, c1, 99, 0);      /* an id never sent: nothing */
    ck_assert_uint_eq(x.b.cancels_unknown, 3);
    ck_assert_uint_eq(x.b.cancels, 0);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 1);
    quiet(c1, "the GENs' sender");
    quiet(c2, "the stranger");

    cancel_from(&x, c2, 2, TOKEN_A); /* its token, from another connection: the queued GEN ends */
    expect_on(c1, "ERROR", 2, WIRE_E_CANCELLED);
    quiet(c2, "the canceller (no reply of its own)");
    quiet(x.w[0], "the worker (it never had the queued GEN)");
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 0);
    ck_assert_uint_eq(x.b.cancels, 1);
    TS_OK(brk_check(&x.b));

    cancel_from(&x, c1, 1, 0); /* its own connection, no token: the running GEN ends */
    expect_on(c1, "ERROR", 1, WIRE_E_CANCELLED);
    wire_msg_t *m = take(x.w[0], false);
    ck_assert_str_eq(m->type, "CANCEL");
    ck_assert_uint_eq(m->id, rid1);
    drop_msg(&m);
    brk_worker_t *w = brk_worker_named(&x.b, "w0");
    ck_assert_int_eq(w->route.inflight, 1); /* the worker still runs it */
    cancel_from(&x, c1, 1, 0);              /* again: answered already, names nothing */
    ck_assert_uint_eq(x.b.cancels_unknown, 4);
    quiet(c1, "the sender (one final reply)");
    TS_OK(brk_check(&x.b));

    gen_from(&x, c1, 3, TOKEN_A, 9, false); /* waits for the cancelled one's slot */
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 1);
    quiet(x.w[0], "the worker (its slot is taken)");
    wire_val_t *e = wire_hdr("ERROR", rid1);
    wv_set(e, "code", wv_str(WIRE_E_CANCELLED));
    wv_set(e, "message", wv_str("cancelled by its client after 3 of 10 steps"));
    from_worker(&x, 0, e);
    quiet(c1, "the sender (the worker's late ERROR is not forwarded)");
    const uint64_t rid3 = request_on(&x, 0); /* the slot is free: the next GEN runs */

    e = wire_hdr("ERROR", rid3); /* what a worker older than CANCEL answers to one */
    wv_set(e, "code", wv_str(WIRE_E_UNKNOWN));
    wv_set(e, "message", wv_str("a worker does not handle 'CANCEL'"));
    from_worker(&x, 0, e);
    quiet(c1, "the sender (an unknown_type ERROR ends no request)");
    ck_assert_int_eq(w->route.inflight, 1);
    serve(&x, rid3);
    expect_on(c1, "RESULT", 3, NULL);
    all_answered(&x);
    zmq_close(c2);
    box_close(&x);
}
END_TEST

/* Senders take turns for a free slot (brk_pump): after client A queued
 * three GENs behind its running one, client B's single GEN (no token: its
 * connection names it) goes next, then A's in their order. */
START_TEST(test_a_free_slot_goes_to_the_sender_with_the_fewest_requests_and_each_sender_keeps_its_order) {
    box_t x;
    box_open(&x);
    void *a = x.trainer, *bs = client_sock(&x);
    ready_slots(&x, 0, 1);
    gen_from(&x, a, 1, TOKEN_A, 1, false);
    uint64_t rid = request_on(&x, 0);
    for (uint64_t i = 2; i <= 4; i++) gen_from(&x, a, i, TOKEN_A, i, false);
    gen_from(&x, bs, 1, 0, 9, false);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 4);
    serve(&x, rid);
    expect_on(a, "RESULT", 1, NULL);
    rid = request_on(&x, 0); /* B's, though A's three came first */
    serve(&x, rid);
    expect_on(bs, "RESULT", 1, NULL);
    quiet(a, "A (B's turn)");
    for (uint64_t i = 2; i <= 4; i++) { /* then A's, in order */
        rid = request_on(&x, 0);
        serve(&x, rid);
        expect_on(a, "RESULT", i, NULL);
        TS_OK(brk_check(&x.b));
    }
    quiet(bs, "B");
    all_answered(&x);

    /* The count of running requests matters, not only who went last: with
     * two slots, B's first GEN runs, then A's; A queues two more, B one.
     * When A's ends, A has none running and B one: A's next goes, though
     * A was served last. */
    zmq_close(bs);
    box_close(&x);
    box_open(&x);
    a = x.trainer;
    bs = client_sock(&x);
    ready_slots(&x, 0, 2);
    gen_from(&x, bs, 10, 0, 10, false);
    const uint64_t rb = request_on(&x, 0);
    gen_from(&x, a, 20, TOKEN_A, 20, false);
    const uint64_t ra = request_on(&x, 0);
    gen_from(&x, a, 21, TOKEN_A, 21, false);
    gen_from(&x, a, 22, TOKEN_A, 22, false);
    gen_from(&x, bs, 11, 0, 11, false);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 3);
    serve(&x, ra);
    expect_on(a, "RESULT", 20, NULL);
    rid = request_on(&x, 0); /* A's 21: A has none running, B one */
    serve(&x, rid);
    expect_on(a, "RESULT", 21, NULL);
    serve(&x, rb);
    expect_on(bs, "RESULT", 10, NULL);
    for (int k = 0; k < 2; k++) { /* then B's 11 and A's 22, one each */
        rid = request_on(&x, 0);
        serve(&x, rid);
    }
    wire_msg_t *ma = take(a, false), *mb = take(bs, false);
    ck_assert_str_eq(ma->type, "RESULT");
    ck_assert_uint_eq(ma->id, 22);
    ck_assert_str_eq(mb->type, "RESULT");
    ck_assert_uint_eq(mb->id, 11);
    drop_msg(&ma);
    drop_msg(&mb);
    all_answered(&x);
    zmq_close(bs);
    box_close(&x);
}
END_TEST

/* The next final reply on s is BUSY for id, and says why. */
static void expect_busy_on(void *s, uint64_t id, const char *why) {
    wire_msg_t *d = take(s, false);
    ck_assert_msg(!strcmp(d->type, "BUSY") && d->id == id, "got %s %llu, expected BUSY %llu", d->type,
                  (unsigned long long)d->id, (unsigned long long)id);
    const char *m = wv_get_str(d->hdr, "message");
    ck_assert_msg(m && strstr(m, why), "BUSY %llu says '%s', expected '%s'", (unsigned long long)id, m ? m : "",
                  why);
    drop_msg(&d);
}

/* A full queue (8 places here) makes way for a newcomer when the sender
 * with the most GENs waiting has at least two more than the newcomer's
 * sender (make_way): that sender's newest waiting GEN is answered BUSY
 * and the newcomer waits in its place. A sender alone fills the queue;
 * shares even out one place at a time and never swap back; the sender
 * that gives way is the one with the most waiting, not the first in the
 * queue; every sender's remaining GENs still run in their order. */
START_TEST(test_a_full_queue_gives_a_newcomer_the_newest_place_of_the_client_with_the_most_waiting) {
    const uint64_t TOKEN_C = TOKEN_A ^ 1;
    box_t x;
    box_open(&x);
    void *a = x.trainer, *bs = client_sock(&x), *cs = client_sock(&x);
    ready_slots(&x, 0, 1);
    gen_from(&x, a, 1, TOKEN_A, 1, false);
    uint64_t rid = request_on(&x, 0);
    for (uint64_t i = 2; i <= 9; i++) gen_from(&x, a, i, TOKEN_A, i, false);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 8);
    gen_from(&x, a, 10, TOKEN_A, 10, false); /* alone: its own share is the whole queue */
    expect_busy_on(a, 10, "queue full");
    ck_assert_uint_eq(x.b.queue_displaced, 0);

    gen_from(&x, bs, 1, TOKEN_B, 101, false); /* A 8 waiting, B 0: A's newest (9) gives way */
    expect_busy_on(a, 9, "gave its place");
    gen_from(&x, bs, 2, TOKEN_B, 102, false); /* A 7, B 1 */
    expect_busy_on(a, 8, "gave its place");
    gen_from(&x, bs, 3, TOKEN_B, 103, false); /* A 6, B 2 */
    expect_busy_on(a, 7, "gave its place");
    gen_from(&x, bs, 4, TOKEN_B, 104, false); /* A 5, B 3: A is still two ahead */
    expect_busy_on(a, 6, "gave its place");
    ck_assert_uint_eq(x.b.queue_displaced, 4);
    gen_from(&x, bs, 5, TOKEN_B, 105, false); /* A 4, B 4: even, B's own is refused */
    expect_busy_on(bs, 5, "queue full");
    gen_from(&x, a, 11, TOKEN_A, 11, false); /* and A's: no swapping back */
    expect_busy_on(a, 11, "queue full");
    quiet(a, "A");
    quiet(bs, "B");

    gen_from(&x, cs, 1, TOKEN_C, 201, false); /* A 4, B 4, C 0: A (first of the most) gives its newest */
    expect_busy_on(a, 5, "gave its place");
    gen_from(&x, cs, 2, TOKEN_C, 202, false); /* A 3, B 4, C 1: B has the most now */
    expect_busy_on(bs, 4, "gave its place");
    gen_from(&x, cs, 3, TOKEN_C, 203, false); /* A 3, B 3, C 2: one apart is even enough */
    expect_busy_on(cs, 3, "queue full");
    ck_assert_uint_eq(x.b.queue_displaced, 6);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 8);
    quiet(a, "A");
    quiet(bs, "B");
    quiet(cs, "C");
    TS_OK(brk_check(&x.b));

    /* what waits is A's 2..4, B's 1..3, C's 1..2: each runs, in its sender's order */
    serve(&x, rid);
    expect_on(a, "RESULT", 1, NULL);
    uint64_t next_a = 2, next_b = 1, next_c = 1;
    for (int k = 0; k < 8; k++) {
        rid = request_on(&x, 0);
        serve(&x, rid);
        zmq_pollitem_t it[3] = { { a, 0, ZMQ_POLLIN, 0 }, { bs, 0, ZMQ_POLLIN, 0 }, { cs, 0, ZMQ_POLLIN, 0 } };
        ck_assert_int_eq(zmq_poll(it, 3, 5000), 1);
        void *from = it[0].revents ? a : it[1].revents ? bs : cs;
        uint64_t *next = from == a ? &next_a : from == bs ? &next_b : &next_c;
        expect_on(from, "RESULT", (*next)++, NULL);
        TS_OK(brk_check(&x.b));
    }
    ck_assert_uint_eq(next_a, 5);
    ck_assert_uint_eq(next_b, 4);
    ck_assert_uint_eq(next_c, 3);
    all_answered(&x);
    zmq_close(bs);
    zmq_close(cs);
    box_close(&x);
}
END_TEST

/* make_way only where one place given up makes room: a queue that
 * requeued requests hold past --queue-max (they go back to its front
 * whatever its size) displaces no one, and the newcomer is refused as on
 * any full queue. (Before, A's newest was answered "gave its place" and B
 * was refused all the same.) */
START_TEST(test_a_queue_held_past_its_max_by_requeued_requests_displaces_no_one) {
    box_t x;
    box_open(&x);
    void *a = x.trainer, *bs = client_sock(&x);
    ready_slots(&x, 0, 2);
    gen_from(&x, a, 1, TOKEN_A, 1, false);
    gen_from(&x, a, 2, TOKEN_A, 2, false);
    (void)request_on(&x, 0);
    (void)request_on(&x, 0);
    for (uint64_t i = 3; i <= 10; i++) gen_from(&x, a, i, TOKEN_A, i, false);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 8);
    from_worker(&x, 0, wire_hdr("DISCONNECT", 0)); /* w0 goes: 1 and 2 go back to the front, past the max */
    brk_reap(&x.b);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 10);
    TS_OK(brk_check(&x.b));
    gen_from(&x, bs, 1, TOKEN_B, 101, false);
    expect_busy_on(bs, 1, "queue full");
    quiet(a, "A (none of its waiting GENs gives way for nothing)");
    ck_assert_uint_eq(x.b.queue_displaced, 0);
    ck_assert_uint_eq(brk_queue_len(&x.b.queue), 10);
    zmq_close(bs);
    box_close(&x);
}
END_TEST

/* Requests that waited with no owner (no worker yet) all learn they have
 * one when a worker comes, though only one slot is free: at their
 * deadline they would be timeout, not no_worker. */
START_TEST(test_every_waiting_request_notes_its_owner_even_when_one_slot_is_free) {
    box_t x;
    box_open(&x);
    for (uint64_t i = 1; i <= 3; i++) gen_from(&x, x.trainer, i, TOKEN_A, i, false);
    for (const brk_req_t *r = x.b.reqs; r; r = r->next) ck_assert(!r->had_owner);
    ready_slots(&x, 0, 1);
    uint64_t rid = request_on(&x, 0);
    for (const brk_req_t *r = x.b.reqs; r; r = r->next)
        ck_assert_msg(r->had_owner, "request %llu waits without knowing it has an owner", (unsigned long long)r->id);
    for (uint64_t i = 1; i <= 3; i++) {
        serve(&x, rid);
        expect_on(x.trainer, "RESULT", i, NULL);
        if (i < 3) rid = request_on(&x, 0);
    }
    all_answered(&x);
    box_close(&x);
}
END_TEST

/* Which of workers 0 and 1 got the next message (a REQUEST): its index,
 * its id in *rid. */
static int request_on_either(box_t *x, uint64_t *rid) {
    for (int tries = 0; tries < 40; tries++)
        for (int i = 0; i < 2; i++) {
            zmq_pollitem_t it = { x->w[i], 0, ZMQ_POLLIN, 0 };
            if (zmq_poll(&it, 1, 25) > 0) {
                *rid = request_on(x, i);
                return i;
            }
        }
    ck_abort_msg("no REQUEST reached either worker");
    return -1;
}

/* A key keeps its worker across a sync (helper-91: between the first
 * worker's ack and the last, GENs needing the new version went to
 * whichever worker had acked, and captured their keys there too). Two
 * workers at v1; the key's owner is learnt from a first GEN. A sync of v2:
 * the other worker acks first (v2 is current, so a GEN now needs v2); the
 * key's next GEN waits while its owner applies v2 -- nothing reaches
 * either worker -- and goes to the owner when its ack comes. Then a sync
 * of v3 that the owner fails: its waiting GEN goes to the worker that has
 * v3, the next owner; and the owner, registering again behind v3 and
 * caught up outside any barrier, takes no keys before its ack. */
START_TEST(test_a_key_waits_for_its_owner_to_apply_a_sync_and_moves_only_if_the_owner_fails_it) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    ready(&x, 1, 1);
    uint64_t rid;
    gen_from(&x, x.trainer, 1, TOKEN_A, 1, false);
    const int own = request_on_either(&x, &rid), other = 1 - own;
    worker_result(&x, own, wire_hdr("RESULT", rid), 1, 4, 2);
    expect_on(x.trainer, "RESULT", 1, NULL);

    trainer_sync(&x, 50, 2, SHA_A);
    expect_sync(&x, 0, 2);
    expect_sync(&x, 1, 2);
    ack(&x, other, 2, NULL);
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 2);
    gen_from(&x, x.trainer, 2, TOKEN_A, 2, false);
    quiet(x.w[other], "the worker that applied v2 first (not the key's owner)");
    quiet(x.w[own], "the owner, still applying v2");
    ack(&x, own, 2, NULL);
    ck_assert_int_eq(request_on_either(&x, &rid), own);
    worker_result(&x, own, wire_hdr("RESULT", rid), 2, 4, 2);
    wire_msg_t *d = answer(&x); /* the barrier's SYNC_DONE, then the RESULT */
    ck_assert_str_eq(d->type, "SYNC_DONE");
    drop_msg(&d);
    expect_on(x.trainer, "RESULT", 2, NULL);

    trainer_sync(&x, 51, 3, SHA_B);
    expect_sync(&x, 0, 3);
    expect_sync(&x, 1, 3);
    ack(&x, other, 3, NULL);
    gen_from(&x, x.trainer, 3, TOKEN_A, 3, false);
    quiet(x.w[other], "the other worker while the owner applies v3");
    ack(&x, own, 3, "bad_weights: NaN or infinite values");
    ck_assert_int_eq(request_on_either(&x, &rid), other);
    worker_result(&x, other, wire_hdr("RESULT", rid), 3, 4, 2);
    d = answer(&x);
    ck_assert_str_eq(d->type, "SYNC_DONE");
    drop_msg(&d);
    expect_on(x.trainer, "RESULT", 3, NULL);

    /* The owner registers again behind v3 (a restart): it is caught up
     * to v3 by a SYNC of no barrier, with no deadline, and takes no keys
     * before its ack (helper-92): the key's GEN goes to the other worker
     * at once. */
    ready(&x, own, 1);
    expect_sync(&x, own, 3);
    gen_from(&x, x.trainer, 4, TOKEN_A, 4, false);
    ck_assert_int_eq(request_on_either(&x, &rid), other);
    worker_result(&x, other, wire_hdr("RESULT", rid), 3, 4, 2);
    expect_on(x.trainer, "RESULT", 4, NULL);
    all_answered(&x);
    box_close(&x);
}
END_TEST

/* Answers to bad messages are budgeted per peer (brk_reply_allowed): a
 * client sending junk gets BRK_REPLY_BURST answers and then only counts,
 * another client still gets its answers, and junk on the worker socket
 * from a peer that is not a registered worker is never answered. */
START_TEST(test_answers_to_junk_are_budgeted_per_peer_and_strangers_on_the_worker_socket_get_none) {
    box_t x;
    box_open(&x);
    int sent = (int)BRK_REPLY_BURST + 30;
    for (int i = 0; i < sent; i++) {
        ck_assert_int_eq(zmq_send(x.trainer, "\x81\xa1", 2, 0), 2);
        deliver(&x, false);
    }
    int answered = 0;
    while (has_msg(x.trainer, "ERROR")) answered++;
    /* the budget refills at BRK_REPLY_RATE a second: a slow run earns a few more */
    ck_assert_int_ge(answered, (int)BRK_REPLY_BURST);
    ck_assert_int_le(answered, (int)BRK_REPLY_BURST + 5);
    ck_assert_uint_eq(x.b.replies_suppressed, (uint64_t)(sent - answered));
    ck_assert_uint_eq(x.b.malformed, (uint64_t)sent);
    /* another peer has its own budget */
    void *other = sock(x.b.ctx, ZMQ_DEALER);
    ck_assert_int_eq(zmq_connect(other, "inproc://clients"), 0);
    ck_assert_int_eq(zmq_send(other, "\x81\xa1", 2, 0), 2);
    deliver(&x, false);
    ck_assert(has_msg(other, "ERROR"));
    zmq_close(other);
    /* a stranger on the worker socket: counted, never answered */
    uint64_t before = x.b.replies_suppressed;
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(zmq_send(x.w[2], "\x81\xa1", 2, 0), 2);
        deliver(&x, true);
    }
    ck_assert(!has_msg(x.w[2], "ERROR"));
    ck_assert_uint_eq(x.b.replies_suppressed, before + 5);
    ck_assert_uint_eq(x.b.malformed, (uint64_t)sent + 6);
    box_close(&x);
}
END_TEST

/* Weights by value need --weights-dir: without it an UPLOAD is refused
 * with a reason, and a SYNC naming an uploaded version the broker does not
 * hold is refused before any worker is asked. */
START_TEST(test_uploads_need_a_weights_dir_and_a_sync_by_value_needs_the_upload) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    static unsigned char bytes[16];
    wire_tensor_t t = msg_chunk(bytes, sizeof bytes);
    msg_upload_t u;
    memset(&u, 0, sizeof u);
    snprintf(u.component, sizeof u.component, "transformer");
    u.version = 2;
    snprintf(u.sha256, sizeof u.sha256, "%s", SHA_A);
    u.size = sizeof bytes;
    u.chunk = &t;
    ck_assert_int_eq(msg_upload_send(x.trainer, NULL, 5, &u), 0);
    deliver(&x, false);
    expect_error(&x, 5, "bad_request", "start it with --weights-dir");
    wire_val_t *h = wire_hdr("SYNC", 6);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(2));
    wv_set(h, "sha256", wv_str(SHA_A));
    wv_set(h, "uploaded", wv_bool(true));
    ck_assert_int_eq(wire_send(x.trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(&x, false);
    expect_error(&x, 6, "bad_request", "keeps no uploaded weights");
    ck_assert(!has_msg(x.w[0], "SYNC")); /* no worker was asked */
    /* a chunk that is not U8 bytes, or runs past the size: bad_request */
    t.dtype = KERN_F32;
    t.shape[0] = sizeof bytes / 4;
    ck_assert_int_eq(msg_upload_send(x.trainer, NULL, 7, &u), 0);
    deliver(&x, false);
    expect_error(&x, 7, "bad_request", "U8");
    box_close(&x);
}
END_TEST

/* ---- weights by value: fetches of an upload still coming ---------------------- */

#define UP_SIZE ((size_t)9 << 20) /* 9 MiB: fetched as 4 + 4 + 1 */
#define UP_PIECE ((size_t)3 << 19) /* uploaded in 1.5 MiB chunks */

/* The trainer's UPLOAD of bytes[off, off + n) of an UP_SIZE file; its answer. */
static wire_msg_t *upload_piece(box_t *x, uint64_t id, uint64_t v, const char *sha, const unsigned char *bytes,
                                size_t off, size_t n) {
    wire_tensor_t t = msg_chunk(bytes + off, n);
    msg_upload_t u;
    memset(&u, 0, sizeof u);
    snprintf(u.component, sizeof u.component, "transformer");
    u.version = v;
    snprintf(u.sha256, sizeof u.sha256, "%s", sha);
    u.size = UP_SIZE;
    u.offset = off;
    u.chunk = &t;
    ck_assert_int_eq(msg_upload_send(x->trainer, NULL, id, &u), 0);
    deliver(x, false);
    return take(x->trainer, false);
}

/* The trainer's UPLOADs of bytes[from, to) in UP_PIECE chunks (the last
 * cut at to), each answered UPLOAD_ACK. */
static void upload_acked(box_t *x, uint64_t id, uint64_t v, const char *sha, const unsigned char *bytes, size_t from,
                         size_t to) {
    for (size_t off = from; off < to; off += UP_PIECE) {
        wire_msg_t *a = upload_piece(x, id, v, sha, bytes, off, to - off < UP_PIECE ? to - off : UP_PIECE);
        ck_assert_str_eq(a->type, "UPLOAD_ACK");
        drop_msg(&a);
    }
}

/* Worker i's FETCH of (v, sha) at offset, max 4 MiB. */
static void fetch_at(box_t *x, int i, uint64_t id, uint64_t v, const char *sha, uint64_t offset) {
    msg_fetch_t f;
    memset(&f, 0, sizeof f);
    snprintf(f.component, sizeof f.component, "transformer");
    f.version = v;
    snprintf(f.sha256, sizeof f.sha256, "%s", sha);
    f.offset = offset;
    ck_assert_int_eq(msg_send(x->w[i], NULL, MSG_FETCH, id, &f, NULL), 0);
    deliver(x, true);
}

/* The FETCH_DATA waiting on worker i's socket: its offset and size checked,
 * its bytes compared with bytes at that offset. */
static void expect_data(box_t *x, int i, uint64_t id, const unsigned char *bytes, uint64_t offset, size_t n) {
    wire_msg_t *m = take(x->w[i], false);
    msg_fetch_data_t d;
    wire_err_t e;
    ck_assert_str_eq(m->type, "FETCH_DATA");
    ck_assert_uint_eq(m->id, id);
    ck_assert_int_eq(msg_fetch_data_decode(m, &d, &e), 0);
    ck_assert_uint_eq(d.offset, offset);
    ck_assert_uint_eq(d.size, UP_SIZE);
    ck_assert_uint_eq(d.chunk->bytes, n);
    ck_assert(memcmp(d.chunk->data, bytes + offset, n) == 0);
    drop_msg(&m);
}

/* The box with --weights-dir a new directory (dir: a mkdtemp template,
 * filled in) and --weights-keep keep, uploads started. */
static void upload_box_open(box_t *x, char *dir, int keep) {
    box_open(x);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    x->b.opt.weights_dir = dir;
    x->b.opt.weights_keep = keep;
    brk_upload_start(&x->b);
    ck_assert_ptr_nonnull(x->b.uploads);
}

/* Stops the uploads (again: harmless), removes dir, closes the box. */
static void upload_box_close(box_t *x, const char *dir) {
    brk_upload_stop(&x->b);
    ck_assert_int_eq(ts_rmtree(dir), 0);
    box_close(x);
}

/* UP_SIZE bytes of a pattern (mul and shift pick it), and their sha256. */
static unsigned char *pattern(uint32_t mul, int shift, char sha[65]) {
    unsigned char *p = malloc(UP_SIZE);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < UP_SIZE; i++) p[i] = (unsigned char)((uint32_t)i * mul >> shift);
    reel_sha256_buf(p, UP_SIZE, sha);
    return p;
}

/* Worker i's FETCH of (v, sha) at offset, max bytes. */
static void fetch_max(box_t *x, int i, uint64_t id, uint64_t v, const char *sha, uint64_t offset, uint64_t max) {
    msg_fetch_t f;
    memset(&f, 0, sizeof f);
    snprintf(f.component, sizeof f.component, "transformer");
    f.version = v;
    snprintf(f.sha256, sizeof f.sha256, "%s", sha);
    f.offset = offset;
    f.max = max;
    ck_assert_int_eq(msg_send(x->w[i], NULL, MSG_FETCH, id, &f, NULL), 0);
    deliver(x, true);
}

/* A worker connection that sends FETCHes of a stored version without
 * reading the answers gets at most BRK_FETCH_OUT_MAX read for it, the
 * rest answered busy, and more again once it read them; another
 * connection is served meanwhile. Before, every FETCH had up to 4 MiB
 * read on the routing thread and held until sent, however many a
 * flooding worker key sent. */
START_TEST(test_a_connection_gets_at_most_16_fetch_answers_on_their_way_and_busy_beyond) {
    box_t x;
    char dir[] = "/tmp/reel-brk-upload.XXXXXX", sha[65];
    upload_box_open(&x, dir, 0);
    unsigned char *bytes = pattern(2654435761u, 13, sha);
    upload_acked(&x, 10, 2, sha, bytes, 0, UP_SIZE);
    ck_assert(brk_upload_stored(&x.b, "transformer", 2, sha));
    const int sent = BRK_FETCH_OUT_MAX + 4;
    for (int k = 0; k < sent; k++) fetch_max(&x, 0, 100 + (uint64_t)k, 2, sha, 64 * (uint64_t)k, 64);
    fetch_max(&x, 1, 200, 2, sha, 0, 64); /* another connection: served */
    expect_data(&x, 1, 200, bytes, 0, 64);
    wire_msg_t *got[BRK_FETCH_OUT_MAX + 4];
    for (int k = 0; k < sent; k++) { /* read all before any is dropped: each answer still held */
        got[k] = take(x.w[0], false);
        ck_assert_uint_eq(got[k]->id, 100 + (uint64_t)k);
        if (k < BRK_FETCH_OUT_MAX) {
            ck_assert_str_eq(got[k]->type, "FETCH_DATA");
        } else {
            ck_assert_str_eq(got[k]->type, "ERROR");
            ck_assert_str_eq(wv_get_str(got[k]->hdr, "code"), "busy");
            ck_assert_ptr_nonnull(strstr(wv_get_str(got[k]->hdr, "message"), "still being sent"));
        }
    }
    fetch_max(&x, 0, 300, 2, sha, 0, 64); /* 16 still held by this side: busy */
    wire_msg_t *m = take(x.w[0], false);
    ck_assert_str_eq(m->type, "ERROR");
    drop_msg(&m);
    for (int k = 0; k < sent; k++) drop_msg(&got[k]); /* read: their buffers go */
    fetch_max(&x, 0, 301, 2, sha, 64, 64);
    expect_data(&x, 0, 301, bytes, 64, 64);
    free(bytes);
    upload_box_close(&x, dir);
}
END_TEST

/* The answer FETCH id of worker i waits with: an ERROR busy naming
 * --max-fetch-mb. */
static void expect_fetch_bytes_busy(box_t *x, int i, uint64_t id) {
    wire_msg_t *m = take(x->w[i], false);
    ck_assert_str_eq(m->type, "ERROR");
    ck_assert_uint_eq(m->id, id);
    ck_assert_str_eq(wv_get_str(m->hdr, "code"), "busy");
    ck_assert_msg(strstr(wv_get_str(m->hdr, "message"), "--max-fetch-mb"), "%s", wv_get_str(m->hdr, "message"));
    drop_msg(&m);
}

/* The bytes of FETCH answers read and not yet sent are bounded over all
 * connections (--max-fetch-mb): within each connection's 16, a FETCH of
 * a stored version, or of an upload's bytes that came, whose bytes would
 * pass it is answered busy, naming the bound, and is served once answers
 * were read; a FETCH parked on an upload is answered busy when its bytes
 * come past the bound. Before, 64 connections of 16 answers of 4 MiB that
 * nobody read held 4 GiB. */
START_TEST(test_fetch_answers_on_their_way_to_all_connections_are_bounded_in_bytes_and_busy_beyond) {
    box_t x;
    char dir[] = "/tmp/reel-brk-upload.XXXXXX", sha[65], sha3[65];
    upload_box_open(&x, dir, 0);
    x.b.opt.max_fetch_bytes = 3 * 64;
    unsigned char *bytes = pattern(2654435761u, 13, sha);
    upload_acked(&x, 10, 2, sha, bytes, 0, UP_SIZE);
    fetch_max(&x, 0, 100, 2, sha, 0, 64);
    fetch_max(&x, 0, 101, 2, sha, 64, 64);
    fetch_max(&x, 1, 200, 2, sha, 0, 64);
    fetch_max(&x, 1, 201, 2, sha, 64, 64); /* 4 x 64 > 3 x 64 */
    wire_msg_t *a = take(x.w[0], false), *b = take(x.w[0], false), *c = take(x.w[1], false);
    ck_assert_str_eq(a->type, "FETCH_DATA");
    ck_assert_str_eq(b->type, "FETCH_DATA");
    ck_assert_str_eq(c->type, "FETCH_DATA");
    expect_fetch_bytes_busy(&x, 1, 201);
    ck_assert_uint_eq(atomic_load(&x.b.fetch_out_bytes), 3 * 64);
    drop_msg(&a); /* read: its buffer goes, and room with it */
    ck_assert_uint_eq(atomic_load(&x.b.fetch_out_bytes), 2 * 64);
    fetch_max(&x, 1, 202, 2, sha, 64, 64);
    expect_data(&x, 1, 202, bytes, 64, 64);
    drop_msg(&b);
    drop_msg(&c);
    ck_assert_uint_eq(atomic_load(&x.b.fetch_out_bytes), 0);

    /* an upload in progress: a FETCH of bytes that came past the bound is
     * busy; one parked is answered busy when its bytes come past it */
    unsigned char *bytes3 = pattern(40503u, 7, sha3);
    wire_msg_t *up = upload_piece(&x, 11, 3, sha3, bytes3, 0, UP_PIECE);
    drop_msg(&up);
    fetch_max(&x, 0, 300, 3, sha3, 0, 64);
    fetch_max(&x, 0, 301, 3, sha3, 64, 64);
    fetch_max(&x, 0, 302, 3, sha3, 128, 64);
    fetch_max(&x, 1, 400, 3, sha3, UP_PIECE, 64); /* parked: not come yet */
    a = take(x.w[0], false);
    b = take(x.w[0], false);
    c = take(x.w[0], false);
    ck_assert_str_eq(a->type, "FETCH_DATA");
    fetch_max(&x, 0, 303, 3, sha3, 192, 64);
    expect_fetch_bytes_busy(&x, 0, 303);
    up = upload_piece(&x, 12, 3, sha3, bytes3, UP_PIECE, UP_PIECE);
    ck_assert_str_eq(up->type, "UPLOAD_ACK");
    drop_msg(&up);
    expect_fetch_bytes_busy(&x, 1, 400);
    drop_msg(&a);
    drop_msg(&b);
    drop_msg(&c);
    fetch_max(&x, 1, 401, 3, sha3, UP_PIECE, 64); /* asked again with room: served */
    expect_data(&x, 1, 401, bytes3, UP_PIECE, 64);
    ck_assert_uint_eq(atomic_load(&x.b.fetch_out_bytes), 0);
    free(bytes3);
    free(bytes);
    upload_box_close(&x, dir);
}
END_TEST

/* A SYNC may name an upload still coming (docs/PROTOCOL.md, "Weights by
 * value"): a worker's FETCH of bytes that came is answered at once, one
 * of bytes still to come waits and is answered, whole, when they came:
 * never a short chunk (a worker asks for fixed offsets), and in the
 * order asked (one past the end too: it waits for the whole file). One
 * that would wait past BRK_FETCH_PARKED_MAX is busy; an upload that fails,
 * or that nobody finishes (BRK_UPLOAD_IDLE_MS), answers the waiting ones
 * ERROR. */
START_TEST(test_fetches_of_an_upload_still_coming_wait_for_whole_chunks_and_fail_with_it) {
    box_t x;
    char dir[] = "/tmp/reel-brk-upload.XXXXXX", sha[65];
    upload_box_open(&x, dir, 0);
    unsigned char *bytes = pattern(2654435761u, 13, sha);
    wire_msg_t *a = upload_piece(&x, 10, 2, sha, bytes, 0, UP_PIECE);
    ck_assert_str_eq(a->type, "UPLOAD_ACK");
    drop_msg(&a);
    /* held while it comes: a SYNC may name it; not stored yet */
    ck_assert(brk_upload_held(&x.b, "transformer", 2, sha));
    ck_assert(!brk_upload_stored(&x.b, "transformer", 2, sha));
    ck_assert(!brk_upload_held(&x.b, "transformer", 2, SHA_B));
    ck_assert_msg(strstr(reel_err()->msg, "being uploaded with other weights"), "%s", reel_err()->msg);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID); /* SYNC: bad_request */
    /* 1.5 MiB came: worker 0 asks 4 ahead as a worker does before it knows
     * the size (the last past the end): all wait */
    fetch_at(&x, 0, 20, 2, sha, 0);
    fetch_at(&x, 0, 21, 2, sha, (uint64_t)4 << 20);
    fetch_at(&x, 0, 22, 2, sha, (uint64_t)8 << 20);
    fetch_at(&x, 0, 23, 2, sha, (uint64_t)12 << 20);
    ck_assert(!has_msg(x.w[0], "FETCH_DATA"));
    for (size_t off = UP_PIECE; off < ((size_t)4 << 20); off += UP_PIECE) { /* up to 4.5 MiB */
        ck_assert(!has_msg(x.w[0], "FETCH_DATA"));
        a = upload_piece(&x, 11, 2, sha, bytes, off, UP_PIECE);
        drop_msg(&a);
    }
    expect_data(&x, 0, 20, bytes, 0, (size_t)4 << 20);  /* whole, once 4 MiB came */
    ck_assert(!has_msg(x.w[0], "FETCH_DATA"));          /* 4..8 MiB still waits */
    /* worker 0 asks again for 8 MiB (a silence made it re-ask): folded
     * into the waiting FETCH, which keeps its place and takes the new id */
    fetch_at(&x, 0, 24, 2, sha, (uint64_t)8 << 20);
    ck_assert(!has_msg(x.w[0], "FETCH_DATA"));
    /* worker 1 asks for the first chunk now: answered at once */
    fetch_at(&x, 1, 30, 2, sha, 0);
    expect_data(&x, 1, 30, bytes, 0, (size_t)4 << 20);
    /* the rest comes; the last chunk is short because the file ends there */
    upload_acked(&x, 12, 2, sha, bytes, 3 * UP_PIECE, UP_SIZE);
    /* in the order asked: the one past the end did not overtake the others */
    expect_data(&x, 0, 21, bytes, (uint64_t)4 << 20, (size_t)4 << 20);
    expect_data(&x, 0, 24, bytes, (uint64_t)8 << 20, (size_t)1 << 20); /* the re-ask's id, once */
    expect_data(&x, 0, 23, bytes, (uint64_t)12 << 20, 0);
    ck_assert(!has_msg(x.w[0], "FETCH_DATA")); /* the folded one was answered once */
    ck_assert(brk_upload_stored(&x.b, "transformer", 2, sha));
    /* 1.5 MiB chunks never line up with a 4 MiB FETCH: every answer read back */
    ck_assert_uint_eq(x.b.fetch_bytes_shared, 0);
    ck_assert_uint_eq(x.b.fetch_bytes_read, 3 * ((uint64_t)4 << 20) + ((uint64_t)1 << 20));

    /* v3: fetches waiting beyond the bound are busy, and all fail with the upload */
    bytes[0] ^= 1; /* the bytes sent will not hash to sha3 */
    char sha3[65];
    reel_sha256_buf(bytes + 1, UP_SIZE - 1, sha3);
    a = upload_piece(&x, 40, 3, sha3, bytes, 0, UP_PIECE);
    drop_msg(&a);
    /* a connection whose pipes hold every answer (no high-water mark) */
    int zero = 0;
    zmq_setsockopt(x.b.workers, ZMQ_SNDHWM, &zero, sizeof zero);
    void *big = sock(x.b.ctx, ZMQ_DEALER);
    zmq_setsockopt(big, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(big, ZMQ_ROUTING_ID, "wbig", 4);
    ck_assert_int_eq(zmq_connect(big, "inproc://workers"), 0);
    void *w2 = x.w[2];
    x.w[2] = big;
    for (int i = 0; i < BRK_FETCH_PARKED_MAX; i++)
        fetch_at(&x, 2, 100 + (uint64_t)i, 3, sha3, ((uint64_t)4 << 20) + (uint64_t)i);
    ck_assert(!has_msg(x.w[2], "FETCH_DATA"));
    fetch_at(&x, 2, 99, 3, sha3, (uint64_t)3 << 20);
    wire_msg_t *m = take(x.w[2], false);
    ck_assert_str_eq(m->type, "ERROR");
    ck_assert_uint_eq(m->id, 99);
    drop_msg(&m);
    for (size_t off = UP_PIECE; off < UP_SIZE; off += UP_PIECE) {
        a = upload_piece(&x, 41, 3, sha3, bytes, off, UP_PIECE);
        bool last = off + UP_PIECE >= UP_SIZE;
        ck_assert_str_eq(a->type, last ? "ERROR" : "UPLOAD_ACK"); /* the digest is checked at the end */
        drop_msg(&a);
    }
    for (int i = 0; i < BRK_FETCH_PARKED_MAX; i++) {
        m = take(x.w[2], false);
        ck_assert_str_eq(m->type, "ERROR"); /* answered, and never with the bad bytes */
        ck_assert_uint_eq(m->id, 100 + (uint64_t)i);
        drop_msg(&m);
    }
    ck_assert(!brk_upload_held(&x.b, "transformer", 3, sha3));
    x.w[2] = w2;
    zmq_close(big);

    /* v4: an upload nobody finishes is given up after BRK_UPLOAD_IDLE_MS,
     * and the FETCHes waiting on it are answered */
    a = upload_piece(&x, 50, 4, sha, bytes, 0, UP_PIECE);
    drop_msg(&a);
    fetch_at(&x, 0, 60, 4, sha, (uint64_t)4 << 20);
    brk_upload_timers(&x.b, brk_now_ms() + 1000);
    ck_assert(brk_upload_held(&x.b, "transformer", 4, sha)); /* not yet */
    ck_assert(!has_msg(x.w[0], "ERROR"));
    brk_upload_timers(&x.b, brk_now_ms() + BRK_UPLOAD_IDLE_MS + 1000);
    ck_assert(!brk_upload_held(&x.b, "transformer", 4, sha));
    m = take(x.w[0], false);
    ck_assert_str_eq(m->type, "ERROR");
    ck_assert_uint_eq(m->id, 60);
    drop_msg(&m);
    free(bytes);
    upload_box_close(&x, dir);
}
END_TEST

/* A FETCH waiting for exactly the chunk that comes (the trainer's chunks
 * and the worker's offsets line up, as at the default 4 MiB) is answered
 * with that chunk's frame, shared with ZeroMQ, for every worker waiting,
 * the last short chunk too; one asked after the bytes came is read back
 * from the file; reel_broker_fetch_bytes_total counts both. */
START_TEST(test_a_chunk_workers_wait_for_goes_to_them_as_it_came) {
    box_t x;
    char dir[] = "/tmp/reel-brk-fanout.XXXXXX", sha[65];
    upload_box_open(&x, dir, 0);
    unsigned char *bytes = pattern(2246822519u, 11, sha);
    const size_t M4 = (size_t)4 << 20;
    wire_msg_t *a = upload_piece(&x, 10, 2, sha, bytes, 0, M4);
    drop_msg(&a);
    for (int w = 0; w < 2; w++) /* both wait for 4..8 and 8..9 MiB */
        for (int k = 1; k < 3; k++) fetch_at(&x, w, (uint64_t)(100 * w + k), 2, sha, (uint64_t)k * M4);
    ck_assert(!has_msg(x.w[0], "FETCH_DATA"));
    ck_assert_uint_eq(x.b.fetch_bytes_shared, 0);
    a = upload_piece(&x, 11, 2, sha, bytes, M4, M4);
    drop_msg(&a);
    a = upload_piece(&x, 12, 2, sha, bytes, 2 * M4, UP_SIZE - 2 * M4);
    ck_assert_str_eq(a->type, "UPLOAD_ACK");
    drop_msg(&a);
    /* over inproc a shared frame arrives as the same bytes in memory: both
     * workers' answers point at one buffer (a copy would not) */
    wire_msg_t *m0 = take(x.w[0], false), *m1 = take(x.w[1], false);
    ck_assert_str_eq(m0->type, "FETCH_DATA");
    ck_assert_str_eq(m1->type, "FETCH_DATA");
    ck_assert_int_eq(m0->n_tensors, 1);
    ck_assert_int_eq(m1->n_tensors, 1);
    ck_assert_ptr_eq(m0->t[0].data, m1->t[0].data);
    ck_assert(memcmp(m0->t[0].data, bytes + M4, M4) == 0);
    drop_msg(&m0);
    drop_msg(&m1);
    for (int w = 0; w < 2; w++) expect_data(&x, w, (uint64_t)(100 * w + 2), bytes, 2 * M4, UP_SIZE - 2 * M4);
    ck_assert_uint_eq(x.b.fetch_bytes_shared, 2 * (UP_SIZE - M4));
    ck_assert_uint_eq(x.b.fetch_bytes_read, 0);
    fetch_at(&x, 2, 300, 2, sha, 0); /* after it came: from the file */
    expect_data(&x, 2, 300, bytes, 0, M4);
    ck_assert_uint_eq(x.b.fetch_bytes_read, M4);
    free(bytes);
    upload_box_close(&x, dir);
}
END_TEST

/* An upload replaced half-way (an UPLOAD at offset 0 with another sha256:
 * the trainer started over with other bytes) drops what its hashing
 * thread still held; one with another sha256 at any other offset is
 * refused; the new bytes are then stored under their own digest and
 * served, nothing of the first upload in them. */
/* Version v: three pieces of old, then another sha256 mid-way (refused:
 * only offset 0 replaces), then new from offset 0: stored under new's
 * digest only and served to worker w with new's bytes. */
static void check_replaced_half_way(box_t *x, uint64_t v, int w, const unsigned char *old, const char *sha_old,
                                    const unsigned char *new, const char *sha_new) {
    upload_acked(x, 10, v, sha_old, old, 0, 3 * UP_PIECE);
    wire_msg_t *a = upload_piece(x, 11, v, sha_new, new, UP_PIECE, UP_PIECE);
    ck_assert_str_eq(a->type, "ERROR");
    drop_msg(&a);
    upload_acked(x, 12, v, sha_new, new, 0, UP_SIZE);
    ck_assert_msg(brk_upload_stored(&x->b, "transformer", v, sha_new), "%s", reel_err_text());
    ck_assert(!brk_upload_stored(&x->b, "transformer", v, sha_old));
    fetch_at(x, w, 20, v, sha_new, 0);
    expect_data(x, w, 20, new, 0, (size_t)4 << 20);
}

START_TEST(test_an_upload_replaced_half_way_is_stored_with_the_new_bytes_only) {
    box_t x;
    char dir[] = "/tmp/reel-brk-replace.XXXXXX", sha_old[65], sha_new[65];
    upload_box_open(&x, dir, 0);
    unsigned char *old = pattern(2654435761u, 13, sha_old), *new = pattern(2246822519u, 7, sha_new);
    check_replaced_half_way(&x, 2, 0, old, sha_old, new, sha_new);
    free(old);
    free(new);
    upload_box_close(&x, dir);
}
END_TEST

/* A second trainer's UPLOAD at offset 0 with other bytes does not replace
 * an upload whose SYNC is under way (that would fail the first trainer's
 * accepted sync): stale_version, and the first upload goes on to be
 * stored and served. */
START_TEST(test_other_bytes_do_not_replace_an_upload_whose_sync_is_under_way) {
    box_t x;
    char dir[] = "/tmp/reel-brk-underway.XXXXXX", sha_old[65], sha_new[65];
    upload_box_open(&x, dir, 0);
    unsigned char *old = pattern(2654435761u, 13, sha_old), *new = pattern(2246822519u, 7, sha_new);
    ready(&x, 0, 1);
    upload_acked(&x, 10, 2, sha_old, old, 0, 3 * UP_PIECE);
    wire_val_t *h = wire_hdr("SYNC", 11);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(2));
    wv_set(h, "sha256", wv_str(sha_old));
    wv_set(h, "uploaded", wv_bool(true));
    ck_assert_int_eq(wire_send(x.trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(&x, false);
    ck_assert(brk_sync_under_way(&x.b, "transformer", 2));
    wire_msg_t *r = upload_piece(&x, 12, 2, sha_new, new, 0, UP_PIECE);
    ck_assert_str_eq(r->type, "ERROR");
    ck_assert_str_eq(wv_get_str(r->hdr, "code"), "stale_version");
    drop_msg(&r);
    upload_acked(&x, 13, 2, sha_old, old, 3 * UP_PIECE, UP_SIZE);
    ck_assert_msg(brk_upload_stored(&x.b, "transformer", 2, sha_old), "%s", reel_err_text());
    free(old);
    free(new);
    upload_box_close(&x, dir);
}
END_TEST

/* Where an upload's hashing thread cannot start, the routing thread
 * hashes each chunk as it comes (brk_upload_no_hash_thread stands in
 * for a failed pthread_create): the same digests, so the same answers. A
 * whole upload is stored, with a chunk a worker waited for forwarded as
 * it came; bytes that are not the announced ones are refused at the last
 * chunk and nothing of them is kept; an upload replaced half-way is
 * stored with the new bytes only. */
START_TEST(test_without_a_hashing_thread_uploads_are_hashed_inline_with_the_same_outcomes) {
    box_t x;
    char dir[] = "/tmp/reel-brk-inline.XXXXXX", sha_a[65], sha_b[65];
    brk_upload_no_hash_thread = true;
    upload_box_open(&x, dir, 0);
    unsigned char *a = pattern(2654435761u, 13, sha_a), *b = pattern(2246822519u, 7, sha_b);
    const size_t M4 = (size_t)4 << 20;
    /* v2: whole, one chunk forwarded to the worker that waited for it */
    wire_msg_t *r = upload_piece(&x, 10, 2, sha_a, a, 0, M4);
    ck_assert_str_eq(r->type, "UPLOAD_ACK");
    drop_msg(&r);
    fetch_at(&x, 0, 20, 2, sha_a, M4);
    ck_assert(!has_msg(x.w[0], "FETCH_DATA"));
    r = upload_piece(&x, 11, 2, sha_a, a, M4, M4);
    drop_msg(&r);
    expect_data(&x, 0, 20, a, M4, M4);
    ck_assert_uint_eq(x.b.fetch_bytes_shared, M4);
    r = upload_piece(&x, 12, 2, sha_a, a, 2 * M4, UP_SIZE - 2 * M4);
    ck_assert_str_eq(r->type, "UPLOAD_ACK");
    drop_msg(&r);
    ck_assert_msg(brk_upload_stored(&x.b, "transformer", 2, sha_a), "%s", reel_err_text());
    /* v3: announced as a's digest, b's bytes: refused at the last chunk */
    for (size_t off = 0; off < UP_SIZE; off += UP_PIECE) {
        r = upload_piece(&x, 30 + off / UP_PIECE, 3, sha_a, b, off, UP_PIECE);
        if (off + UP_PIECE < UP_SIZE) {
            ck_assert_str_eq(r->type, "UPLOAD_ACK");
        } else {
            ck_assert_str_eq(r->type, "ERROR");
            ck_assert_str_eq(wv_get_str(r->hdr, "code"), "bad_request");
            ck_assert_ptr_nonnull(strstr(wv_get_str(r->hdr, "message"), sha_b));
        }
        drop_msg(&r);
    }
    ck_assert(!brk_upload_stored(&x.b, "transformer", 3, sha_a));
    char path[300];
    struct stat st;
    snprintf(path, sizeof path, "%s/transformer-v3.safetensors", dir);
    ck_assert_int_ne(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/.transformer-v3.part", dir);
    ck_assert_int_ne(stat(path, &st), 0);
    check_replaced_half_way(&x, 4, 1, a, sha_a, b, sha_b); /* v4 */
    brk_upload_no_hash_thread = false;
    free(a);
    free(b);
    upload_box_close(&x, dir);
}
END_TEST

/* An UPLOAD of a component workers do not serve is bad_request (nothing
 * could ever sync it, and it would hold one of the upload slots); a
 * fifth upload while four are open is busy (retry later), and goes in
 * once one of them ended. */
START_TEST(test_uploads_of_another_component_are_refused_and_a_fifth_open_one_is_busy) {
    box_t x;
    char dir[] = "/tmp/reel-brk-slots.XXXXXX", sha[65];
    upload_box_open(&x, dir, 0);
    unsigned char *bytes = pattern(2654435761u, 13, sha);
    wire_tensor_t t = msg_chunk(bytes, UP_PIECE);
    msg_upload_t u;
    memset(&u, 0, sizeof u);
    snprintf(u.component, sizeof u.component, "vae");
    u.version = 2;
    snprintf(u.sha256, sizeof u.sha256, "%s", sha);
    u.size = UP_SIZE;
    u.chunk = &t;
    ck_assert_int_eq(msg_upload_send(x.trainer, NULL, 5, &u), 0);
    deliver(&x, false);
    expect_error(&x, 5, "bad_request", "not \"vae\"");
    char part[300];
    struct stat st;
    snprintf(part, sizeof part, "%s/.vae-v2.part", dir);
    ck_assert_int_ne(stat(part, &st), 0);
    for (uint64_t v = 2; v <= 5; v++) { /* four open uploads */
        wire_msg_t *a = upload_piece(&x, 10 + v, v, sha, bytes, 0, UP_PIECE);
        ck_assert_str_eq(a->type, "UPLOAD_ACK");
        drop_msg(&a);
    }
    wire_msg_t *a = upload_piece(&x, 20, 6, sha, bytes, 0, UP_PIECE);
    ck_assert_str_eq(a->type, "ERROR");
    ck_assert_str_eq(wv_get_str(a->hdr, "code"), "busy");
    ck_assert_ptr_nonnull(strstr(wv_get_str(a->hdr, "message"), "UPLOAD: 4 uploads are in progress; finish one first"));
    drop_msg(&a);
    upload_acked(&x, 30, 2, sha, bytes, UP_PIECE, UP_SIZE); /* v2 ends */
    a = upload_piece(&x, 21, 6, sha, bytes, 0, UP_PIECE);
    ck_assert_str_eq(a->type, "UPLOAD_ACK");
    drop_msg(&a);
    /* v2 is stored, never applied: other weights under its number would
     * replace it, but take a slot first, and none is free: busy, and the
     * stored v2 stays */
    a = upload_piece(&x, 22, 2, SHA_B, bytes, 0, UP_PIECE);
    ck_assert_str_eq(a->type, "ERROR");
    ck_assert_str_eq(wv_get_str(a->hdr, "code"), "busy");
    drop_msg(&a);
    ck_assert(brk_upload_stored(&x.b, "transformer", 2, sha));
    /* v9 current (synced by path): an upload of v7, older, could never be
     * synced, so it is refused stale_version, not busy though four slots
     * are open: it would take none */
    TS_OK(brk_sync_restore(&x.b, "transformer", 9, SHA_B, "/w/v9.safetensors", 0, NULL));
    a = upload_piece(&x, 23, 7, sha, bytes, 0, UP_PIECE);
    ck_assert_str_eq(a->type, "ERROR");
    ck_assert_str_eq(wv_get_str(a->hdr, "code"), "stale_version");
    ck_assert_msg(strstr(wv_get_str(a->hdr, "message"), "UPLOAD: transformer v7 is older than the current v9"), "%s",
                  wv_get_str(a->hdr, "message"));
    drop_msg(&a);
    /* v3, begun before v9 became current: its next chunk is refused the
     * same way and its slot freed, so a newer upload (v10) finds room */
    a = upload_piece(&x, 24, 10, sha, bytes, 0, UP_PIECE);
    ck_assert_str_eq(wv_get_str(a->hdr, "code"), "busy");
    drop_msg(&a);
    a = upload_piece(&x, 25, 3, sha, bytes, UP_PIECE, UP_PIECE);
    ck_assert_str_eq(wv_get_str(a->hdr, "code"), "stale_version");
    drop_msg(&a);
    a = upload_piece(&x, 26, 10, sha, bytes, 0, UP_PIECE);
    ck_assert_str_eq(a->type, "UPLOAD_ACK");
    drop_msg(&a);
    snprintf(part, sizeof part, "%s/.transformer-v3.part", dir);
    ck_assert_int_ne(stat(part, &st), 0);
    free(bytes);
    upload_box_close(&x, dir);
}
END_TEST

/* A version stored but never applied (newer than the current one, no SYNC
 * of it under way: its SYNC failed, or none came) may be uploaded again
 * with other bytes, which replace the stored ones (PROTOCOL.md, "Failed":
 * a fixed file may be published again). Once a SYNC of it is under way,
 * or it is current, other bytes are stale_version and the stored ones
 * stay. */
START_TEST(test_an_upload_with_other_bytes_replaces_a_version_never_applied) {
    box_t x;
    char dir[] = "/tmp/reel-brk-replace.XXXXXX", sha[65], sha2[65], sha3[65];
    upload_box_open(&x, dir, 0);
    unsigned char *one = pattern(2654435761u, 13, sha), *two = pattern(40503u, 7, sha2), *three = pattern(97u, 3, sha3);
    upload_acked(&x, 10, 2, sha, one, 0, UP_SIZE);
    ck_assert(brk_upload_stored(&x.b, "transformer", 2, sha));
    upload_acked(&x, 11, 2, sha2, two, 0, UP_SIZE); /* replaced: stored under v2 now */
    ck_assert(brk_upload_stored(&x.b, "transformer", 2, sha2));
    ck_assert(!brk_upload_stored(&x.b, "transformer", 2, sha));
    /* a SYNC of v2 pending on a worker: its bytes may be fetched at any
     * moment, so other bytes are refused and v2's stay */
    ready(&x, 0, 1);
    trainer_sync(&x, 12, 2, sha2);
    expect_sync(&x, 0, 2);
    wire_msg_t *a = upload_piece(&x, 13, 2, sha3, three, 0, UP_PIECE);
    ck_assert_str_eq(wv_get_str(a->hdr, "code"), "stale_version");
    ck_assert_msg(strstr(wv_get_str(a->hdr, "message"), "a SYNC of it is under way"), "%s", wv_get_str(a->hdr, "message"));
    drop_msg(&a);
    ck_assert(brk_upload_stored(&x.b, "transformer", 2, sha2));
    /* applied: current, and other bytes under its number are stale for good */
    ack(&x, 0, 2, NULL);
    a = answer(&x);
    ck_assert(done_complete(a));
    drop_msg(&a);
    a = upload_piece(&x, 14, 2, sha3, three, 0, UP_PIECE);
    ck_assert_str_eq(wv_get_str(a->hdr, "code"), "stale_version");
    ck_assert_ptr_nonnull(strstr(wv_get_str(a->hdr, "message"), "UPLOAD: transformer v2 was uploaded with other weights"));
    drop_msg(&a);
    ck_assert(brk_upload_stored(&x.b, "transformer", 2, sha2));
    free(one); free(two); free(three);
    upload_box_close(&x, dir);
}
END_TEST

/* Lines of the file at path holding needle. */
static int lines_with(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* A registered worker that floods the broker with faulty messages (ERRORs
 * for requests it does not hold) writes at most REEL_LOG_BURST lines a
 * window to the log, not one a message (a hostile peer filled 134 MiB in
 * 10 s); the first line after a window says how many were left out. */
START_TEST(test_a_worker_flooding_faulty_messages_has_a_bounded_share_of_the_log) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    char path[] = "/tmp/reel-brk-log.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    ck_assert_int_eq(dup2(fd, 2), 2);
    for (uint64_t id = 1000; id < 1200; id++) {
        wire_val_t *h = wire_hdr("ERROR", id);
        wv_set(h, "code", wv_str("internal"));
        wv_set(h, "message", wv_str("no such request"));
        from_worker(&x, 0, h);
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    ck_assert_int_eq(lines_with(path, "sent ERROR for unknown request"), REEL_LOG_BURST);
    unlink(path);
    /* the budget itself: a window's extra lines counted, and said once the window is over */
    reel_log_budget_t lb = { 0 };
    fd = mkstemp(strcpy(path, "/tmp/reel-brk-log.XXXXXX"));
    saved = dup(2);
    ck_assert_int_eq(dup2(fd, 2), 2);
    for (int i = 0; i < REEL_LOG_BURST + 7; i++) brk_log_limited(&lb, "w9", "line %d", i);
    ck_assert_uint_eq(lb.suppressed, 7);
    lb.window_ms -= REEL_LOG_WINDOW_MS; /* the window is over */
    brk_log_limited(&lb, "w9", "after the window");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    ck_assert_int_eq(lines_with(path, "w9: 7 more lines like the ones above were left out"), 1);
    ck_assert_int_eq(lines_with(path, "after the window"), 1);
    ck_assert_int_eq(lines_with(path, "line "), REEL_LOG_BURST);
    unlink(path);
    box_close(&x);
}
END_TEST

/* Peers' refused messages share the log by kind (brk_log_kind): each
 * kind writes its first REEL_LOG_BURST lines of a window as they are,
 * one kind's flood leaves another's lines alone, and the lines left out
 * are summed up once the window is over even when no line of that kind
 * comes again (brk_log_kinds_summary, from the loop's timers). */
START_TEST(test_refused_messages_share_the_log_by_kind_and_are_summed_up_after_the_window) {
    brk_log_kinds_t t;
    memset(&t, 0, sizeof t);
    char path[] = "/tmp/reel-brk-kinds.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    ck_assert_int_eq(dup2(fd, 2), 2);
    for (int i = 0; i < 1000; i++) brk_log_kind(&t, "SYNC refused", "SYNC refused: flood %d", i);
    for (int i = 0; i < 3; i++) brk_log_kind(&t, "RECONNECT", "unknown worker sent X %d", i);
    brk_log_kinds_summary(&t); /* the window still runs: nothing to say yet */
    for (int i = 0; i < t.n; i++) t.lb[i].window_ms -= REEL_LOG_WINDOW_MS; /* the window is over */
    brk_log_kinds_summary(&t);
    brk_log_kinds_summary(&t); /* said once */
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    ck_assert_int_eq(t.n, 2);
    ck_assert_int_eq(lines_with(path, "SYNC refused: flood "), REEL_LOG_BURST);
    ck_assert_int_eq(lines_with(path, "SYNC refused: flood 0"), 1);
    ck_assert_int_eq(lines_with(path, "unknown worker sent X "), 3);
    ck_assert_int_eq(lines_with(path, "SYNC refused: 980 more lines like the ones above were left out"), 1);
    ck_assert_int_eq(lines_with(path, "more lines like"), 1); /* none for RECONNECT: nothing was left out */
    unlink(path);
}
END_TEST

/* Worker i's READY at v1 with tiny's config (patch 2) and --max-tokens
 * max_tokens (0: none). */
static void ready_tokens(box_t *x, int i, uint64_t max_tokens) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    wire_val_t *h = wire_hdr("READY", 0), *models = wv_arr(), *vers = wv_map(), *cfgs = wv_arr(), *c = wv_map();
    wv_push(models, wv_str("tiny"));
    wv_set(vers, "transformer", wv_u64(1));
    wv_set(c, "name", wv_str("tiny"));
    wv_set(c, "in_channels", wv_u64(4));
    wv_set(c, "text_dim", wv_u64(32));
    wv_set(c, "patch", wv_u64(2));
    wv_set(c, "layers", wv_u64(2));
    wv_push(cfgs, c);
    wv_set(h, "name", wv_str(name));
    wv_set(h, "models", models);
    wv_set(h, "versions", vers);
    wv_set(h, "configs", cfgs);
    if (max_tokens) wv_set(h, "max_tokens", wv_u64(max_tokens));
    from_worker(x, i, h);
}

/* The worker the next REQUEST went to (0 or 1), its request answered. */
static int request_went_to(box_t *x) {
    zmq_pollitem_t it[2] = { { x->w[0], 0, ZMQ_POLLIN, 0 }, { x->w[1], 0, ZMQ_POLLIN, 0 } };
    ck_assert_int_gt(zmq_poll(it, 2, 2000), 0);
    int i = it[0].revents & ZMQ_POLLIN ? 0 : 1;
    uint64_t rid = request_on(x, i);
    worker_result(x, i, wire_hdr("RESULT", rid), 1, 4, 2);
    return i;
}

/* Workers of several --max-tokens (READY max_tokens): a shape too large
 * for its key's owner goes to a worker it fits (it used to fail too_large
 * on every request while another worker could run it); when none fits it
 * goes to its owner as before, whose too_large names its bound. */
START_TEST(test_a_shape_too_large_for_its_owner_goes_to_a_worker_it_fits) {
    box_t x;
    box_open(&x);
    ready_tokens(&x, 0, 0);
    ready_tokens(&x, 1, 0);
    gen_from(&x, x.trainer, 1, 0, 1, false); /* tiny [4,2,8,8]: 32 tokens a sample */
    int owner = request_went_to(&x);
    expect_on(x.trainer, "RESULT", 1, NULL);
    ready_tokens(&x, owner, 16); /* the owner restarts with --max-tokens 16 */
    for (uint64_t id = 2; id < 6; id++) {
        gen_from(&x, x.trainer, id, 0, id, false);
        ck_assert_int_eq(request_went_to(&x), 1 - owner);
        expect_on(x.trainer, "RESULT", id, NULL);
    }
    ready_tokens(&x, 1 - owner, 16); /* neither fits: the owner, as before */
    gen_from(&x, x.trainer, 7, 0, 7, false);
    ck_assert_int_eq(request_went_to(&x), owner);
    expect_on(x.trainer, "RESULT", 7, NULL);
    ready_tokens(&x, owner, 32); /* exactly its tokens: fits */
    gen_from(&x, x.trainer, 8, 0, 8, false);
    ck_assert_int_eq(request_went_to(&x), owner);
    expect_on(x.trainer, "RESULT", 8, NULL);
    /* a worker that fits but serves another model is no owner: the
     * bounded one of the model still gets it (and would answer too_large) */
    ready_tokens(&x, owner, 16);
    wire_val_t *h = wire_hdr("READY", 0), *models = wv_arr(), *vers = wv_map();
    wv_push(models, wv_str("small"));
    wv_set(vers, "transformer", wv_u64(1));
    wv_set(h, "name", wv_str(owner ? "w0" : "w1"));
    wv_set(h, "models", models);
    wv_set(h, "versions", vers);
    from_worker(&x, 1 - owner, h);
    gen_from(&x, x.trainer, 9, 0, 9, false);
    ck_assert_int_eq(request_went_to(&x), owner);
    expect_on(x.trainer, "RESULT", 9, NULL);
    box_close(&x);
}
END_TEST

/* --weights-keep 2: once v5 is current (an adapter on v1), the files of v2
 * and v3 go (on the removal thread: brk_upload_stop waits for it), v4 and
 * v5 stay, v1 stays besides them (the current adapter's base), a v6
 * still to come is never touched; a digest whose file a cut-short removal
 * already took is finished (and is not a stored version meanwhile); other
 * components are not touched, and one pruned next keeps its own current
 * version and the newer one. */
START_TEST(test_weights_keep_removes_older_versions_and_finishes_a_cut_short_removal) {
    box_t x;
    char dir[] = "/tmp/reel-brk-keep.XXXXXX", path[128];
    upload_box_open(&x, dir, 2);
    const char *names[] = { "transformer-v1", "transformer-v2", "transformer-v3", "transformer-v4", "transformer-v5",
                            "transformer-v6", "vae-v1",         "vae-v2",         "vae-v3" };
    const int N = (int)(sizeof names / sizeof *names);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 2; k++) {
            if (i == 1 && k == 0) continue; /* v2: its digest only, as a removal cut short leaves it */
            snprintf(path, sizeof path, "%s/%s.%s", dir, names[i], k ? "sha256" : "safetensors");
            FILE *f = fopen(path, "w");
            ck_assert_ptr_nonnull(f);
            fputs("x", f);
            fclose(f);
        }
    /* a digest without its data (a removal under way or cut short) is not stored */
    const char *sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    snprintf(path, sizeof path, "%s/transformer-v3.sha256", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s\n", sha);
    fclose(f);
    ck_assert(brk_upload_stored(&x.b, "transformer", 3, sha));
    snprintf(path, sizeof path, "%s/transformer-v3.safetensors", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert(!brk_upload_stored(&x.b, "transformer", 3, sha));
    ck_assert_msg(strstr(reel_err()->msg, "was not uploaded"), "%s", reel_err()->msg);
    ck_assert_int_eq(reel_err_code(), REEL_E_NOT_FOUND); /* FETCH, SYNC: bad_request */
    /* current v5, an adapter on v1: v1 stays besides the --weights-keep 2
     * (v5 and v4); v2 and v3 go */
    brk_upload_prune(&x.b, "transformer", 5, 1);
    brk_upload_prune(&x.b, "transformer", 5, 1); /* asked twice: one removal */
    snprintf(path, sizeof path, "%s/transformer-v2.sha256", dir);
    brk_upl_prunes_wait(&x.b);
    ck_assert_int_eq(access(path, F_OK), -1);
    /* another component then, its queue slot the one transformer used:
     * vae v2 is current, v3 newer (pending): nothing of vae goes */
    brk_upload_prune(&x.b, "vae", 2, 0);
    brk_upload_stop(&x.b);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 2; k++) {
            snprintf(path, sizeof path, "%s/%s.%s", dir, names[i], k ? "sha256" : "safetensors");
            bool gone = i == 1 || i == 2;
            ck_assert_msg((access(path, F_OK) != 0) == gone, "%s: %s", path, gone ? "not removed" : "removed");
        }
    upload_box_close(&x, dir);
}
END_TEST

/* Writes n bytes of value c to dir/name. */
static void fill_file(const char *dir, const char *name, size_t n, int c) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (size_t i = 0; i < n; i++) fputc(c, f);
    ck_assert_int_eq(fclose(f), 0);
}

static int count_spares(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls -A %s | grep -c '^\\.spare-'", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* A removed version's file is kept as a spare (DIR/.spare-N) and the next
 * upload at least as long writes over it, the same file (its blocks and
 * cached pages), never showing its old bytes: a FETCH while the upload
 * comes gets the new ones, and the stored file is the upload's length. A
 * spare longer than the upload is left for another; a file with another
 * hard link is removed, not kept; at most two spares are kept, across a
 * restart too (the newest; the rest, and names not of a spare, removed),
 * and a restarted broker's spares are written over too. */
START_TEST(test_a_removed_version_s_file_is_written_over_by_the_next_upload) {
    box_t x;
    char dir[] = "/tmp/reel-brk-spare.XXXXXX", path[256];
    upload_box_open(&x, dir, 2);
    /* v1 shorter than the upload to come, v2 longer, v3 kept */
    fill_file(dir, "transformer-v1.safetensors", UP_SIZE - 12345, 0xAA);
    fill_file(dir, "transformer-v2.safetensors", UP_SIZE + 4096, 0xBB);
    fill_file(dir, "transformer-v3.safetensors", 10, 'x');
    for (int v = 1; v <= 3; v++) {
        snprintf(path, sizeof path, "transformer-v%d.sha256", v);
        fill_file(dir, path, 3, 'x');
    }
    struct stat st1, st2, st;
    snprintf(path, sizeof path, "%s/transformer-v1.safetensors", dir);
    ck_assert_int_eq(stat(path, &st1), 0);
    snprintf(path, sizeof path, "%s/transformer-v2.safetensors", dir);
    ck_assert_int_eq(stat(path, &st2), 0);
    brk_upload_prune(&x.b, "transformer", 4, 0); /* v1 and v2 go: spares */
    snprintf(path, sizeof path, "%s/transformer-v1.sha256", dir);
    brk_upl_prunes_wait(&x.b);
    ck_assert_int_eq(access(path, F_OK), -1);
    ck_assert_int_eq(access(path, F_OK), -1);
    ck_assert_int_eq(count_spares(dir), 2);

    char sha[65];
    unsigned char *bytes = pattern(2654435761u, 13, sha);
    wire_msg_t *a = upload_piece(&x, 10, 5, sha, bytes, 0, UP_PIECE);
    ck_assert_str_eq(a->type, "UPLOAD_ACK");
    drop_msg(&a);
    snprintf(path, sizeof path, "%s/.transformer-v5.part", dir);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_ino, st1.st_ino); /* v1's file, written over; v2's, too long, stays */
    ck_assert_int_eq(count_spares(dir), 1);
    /* a FETCH of what came, and one of bytes still to come: the new bytes only */
    fetch_at(&x, 0, 20, 5, sha, 0);
    ck_assert(!has_msg(x.w[0], "FETCH_DATA"));
    fetch_at(&x, 0, 21, 5, sha, (uint64_t)8 << 20);
    upload_acked(&x, 11, 5, sha, bytes, UP_PIECE, UP_SIZE);
    expect_data(&x, 0, 20, bytes, 0, (size_t)4 << 20);
    expect_data(&x, 0, 21, bytes, (uint64_t)8 << 20, (size_t)1 << 20);
    ck_assert(brk_upload_stored(&x.b, "transformer", 5, sha));
    snprintf(path, sizeof path, "%s/transformer-v5.safetensors", dir);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_ino, st1.st_ino);
    ck_assert_int_eq((long long)st.st_size, (long long)UP_SIZE);
    fetch_at(&x, 1, 22, 5, sha, (uint64_t)8 << 20); /* from the stored file: its size, its bytes */
    expect_data(&x, 1, 22, bytes, (uint64_t)8 << 20, (size_t)1 << 20);

    /* v3 has another hard link: removed, not kept (v2's spare stays the one) */
    char link3[256];
    snprintf(path, sizeof path, "%s/transformer-v3.safetensors", dir);
    snprintf(link3, sizeof link3, "%s/elsewhere", dir);
    ck_assert_int_eq(link(path, link3), 0);
    fill_file(dir, "transformer-v6.safetensors", 10, 'x');
    fill_file(dir, "transformer-v6.sha256", 3, 'x');
    brk_upload_prune(&x.b, "transformer", 6, 0); /* v3 goes, v5 stays */
    snprintf(path, sizeof path, "%s/transformer-v3.sha256", dir);
    brk_upl_prunes_wait(&x.b);
    ck_assert_int_eq(access(path, F_OK), -1);
    ck_assert_int_eq(count_spares(dir), 1);
    ck_assert_int_eq(stat(link3, &st), 0);
    ck_assert_int_eq((int)st.st_nlink, 1); /* v3's name went, the other link stays */
    brk_upload_stop(&x.b);

    /* a restart keeps the two newest spares, removes the rest and what only looks like one */
    fill_file(dir, ".spare-900", 10, 'x');
    fill_file(dir, ".spare-901", UP_SIZE, 'x');
    fill_file(dir, ".spare-0901", 10, 'x');
    fill_file(dir, ".spare-+7", 10, 'x');
    ck_assert_int_eq(count_spares(dir), 5);
    brk_upload_start(&x.b);
    ck_assert_int_eq(count_spares(dir), 2);
    snprintf(path, sizeof path, "%s/.spare-901", dir);
    ck_assert_int_eq(stat(path, &st1), 0);
    snprintf(path, sizeof path, "%s/.spare-900", dir);
    ck_assert_int_eq(access(path, F_OK), 0);
    /* ... and the next upload writes over the one that fits (901), the
     * next removal's spare taking a number of its own */
    a = upload_piece(&x, 12, 7, sha, bytes, 0, UP_PIECE);
    drop_msg(&a);
    snprintf(path, sizeof path, "%s/.transformer-v7.part", dir);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_ino, st1.st_ino);
    fill_file(dir, "transformer-v7.safetensors", 10, 'x');
    brk_upload_prune(&x.b, "transformer", 7, 0); /* v5 goes: .spare-902 */
    snprintf(path, sizeof path, "%s/transformer-v5.sha256", dir);
    brk_upl_prunes_wait(&x.b);
    ck_assert_int_eq(access(path, F_OK), -1);
    brk_upload_stop(&x.b);
    snprintf(path, sizeof path, "%s/.spare-902", dir);
    ck_assert_int_eq(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/.spare-900", dir);
    ck_assert_int_eq(access(path, F_OK), 0);

    /* more spares than the startup scan holds (64), in no order: the two
     * newest stay, every other one goes, nothing else is touched */
    for (int i = 0; i < 100; i++) {
        char name[32];
        snprintf(name, sizeof name, ".spare-%d", 1000 + (i * 37) % 100);
        fill_file(dir, name, 10, 'x');
    }
    brk_upload_start(&x.b);
    brk_upload_stop(&x.b);
    ck_assert_int_eq(count_spares(dir), 2);
    snprintf(path, sizeof path, "%s/.spare-1099", dir);
    ck_assert_int_eq(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/.spare-1098", dir);
    ck_assert_int_eq(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/transformer-v7.safetensors", dir);
    ck_assert_int_eq(access(path, F_OK), 0);
    free(bytes);
    upload_box_close(&x, dir);
}
END_TEST

/* The outcome label of a request's metrics (brk_counters.h): a worker's
 * ERROR code is its own text, so only [a-z0-9_] names are labels, the
 * rest "other", and past BRK_OUTCOMES_MAX - 1 codes everything new is
 * "other" too: the label set stays bounded and valid. */
START_TEST(test_request_outcome_labels_are_bounded_and_clean) {
    brk_metrics_t m;
    memset(&m, 0, sizeof m);
    brk_metrics_request(&m, "ok", 0.1);
    brk_metrics_request(&m, "timeout", 0.2);
    brk_metrics_request(&m, "bad code\xff\n", 0.3);
    brk_metrics_request(&m, "", 0.3);
    ck_assert_int_eq(m.n_outcomes, 3);
    ck_assert_str_eq(m.outcome[2], "other");
    ck_assert_uint_eq(m.requests[2], 2);
    for (int i = 0; i < 60; i++) {
        char code[24];
        snprintf(code, sizeof code, "code_%d", i);
        brk_metrics_request(&m, code, 0.01);
    }
    ck_assert_int_le(m.n_outcomes, BRK_OUTCOMES_MAX);
    uint64_t total = 0;
    for (int i = 0; i < m.n_outcomes; i++) {
        total += m.requests[i];
        for (const char *p = m.outcome[i]; *p; p++) ck_assert((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_');
    }
    ck_assert_uint_eq(total, 64);
    ck_assert_uint_eq(m.request_s.n, 64);
}
END_TEST

START_TEST(test_a_request_larger_than_the_broker_may_ever_hold_is_too_large_and_one_that_must_wait_busy) {
    box_t x;
    box_open(&x);
    x.b.opt.max_held_bytes = 3000;      /* a GEN with its latent holds 2688 bytes */
    client_gen(&x, 1, "tiny", false);   /* 640 bytes: held (no worker) */
    client_gen(&x, 2, "tiny", true);    /* would exceed what is held now: retry later */
    wire_msg_t *d = answer(&x);
    ck_assert_str_eq(d->type, "BUSY");
    ck_assert_uint_eq(d->id, 2);
    drop_msg(&d);
    x.b.opt.max_held_bytes = 2000;      /* now a GEN with its latent can never fit */
    client_gen(&x, 3, "tiny", true);
    expect_error(&x, 3, "too_large", "more than the broker holds at once");
    box_close(&x);
}
END_TEST

START_TEST(test_the_malformed_counter_counts_unreadable_messages_not_wrong_fields) {
    box_t x;
    box_open(&x);
    ck_assert_int_eq(zmq_send(x.trainer, "\x81\xa1", 2, 0), 2); /* a truncated map */
    deliver(&x, false);
    expect_error(&x, 0, "malformed", "map of 1 entries in 1 bytes");
    wire_val_t *h = wire_hdr("GEN", 9); /* readable, but no model, steps or shape */
    ck_assert_int_eq(wire_send(x.trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(&x, false);
    expect_error(&x, 9, "bad_request", "missing 'model'");
    h = wire_hdr("NOSUCH", 10);
    ck_assert_int_eq(wire_send(x.trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(&x, false);
    expect_error(&x, 10, "unknown_type", "NOSUCH");
    h = wire_hdr("STATUS", 11);
    ck_assert_int_eq(wire_send(x.trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(&x, false);
    wire_msg_t *d = answer(&x);
    ck_assert_str_eq(d->type, "STATUS_REPLY");
    ck_assert_uint_eq(d->id, 11);
    ck_assert_uint_eq(u64_of(d, "malformed"), 1);
    drop_msg(&d);
    box_close(&x);
}
END_TEST

START_TEST(test_status_lists_each_model_with_the_config_its_worker_announced) {
    box_t x;
    box_open(&x);
    wire_val_t *h = wire_hdr("READY", 0), *models = wv_arr(), *configs = wv_arr(), *c = wv_map();
    wv_push(models, wv_str("tiny"));
    wv_set(c, "name", wv_str("tiny"));
    wv_set(c, "in_channels", wv_u64(4));
    wv_set(c, "text_dim", wv_u64(32));
    wv_set(c, "patch", wv_u64(2));
    wv_set(c, "layers", wv_u64(2));
    wv_push(configs, c);
    wv_set(h, "name", wv_str("w0"));
    wv_set(h, "models", models);
    wv_set(h, "configs", configs);
    from_worker(&x, 0, h);
    h = wire_hdr("STATUS", 12);
    ck_assert_int_eq(wire_send(x.trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(&x, false);
    wire_msg_t *d = answer(&x);
    const wire_val_t *m = wv_at(wv_get(d->hdr, "models"), 0);
    uint64_t v = 0;
    ck_assert_str_eq(wv_get_str(m, "name"), "tiny");
    ck_assert(wv_get_u64(m, "in_channels", &v) && v == 4);
    ck_assert(wv_get_u64(m, "text_dim", &v) && v == 32);
    ck_assert(wv_get_u64(m, "patch", &v) && v == 2);
    ck_assert(wv_get_u64(m, "layers", &v) && v == 2);
    /* every counter is there from the start, 0 before anything happened */
    const char *counters[] = { "queue", "malformed", "undelivered", "requests_ok", "requests_failed",
                               "steps_replayed", "steps_eager", "steps_captured" };
    for (size_t i = 0; i < sizeof counters / sizeof *counters; i++)
        ck_assert_msg(wv_get_u64(d->hdr, counters[i], &v) && v == 0, "STATUS_REPLY lacks %s: 0", counters[i]);
    ck_assert_msg(!wv_get(d->hdr, "progress_dropped"), "progress_dropped is absent while 0");
    drop_msg(&d);
    box_close(&x);
}
END_TEST

/* ---- the catalog writer ------------------------------------------------------------ */

/* A catalog in a fresh directory (dir must be a mkdtemp template). */
static cat_t *temp_catalog(char *dir, char *path, size_t len) {
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, len, "%s/c.db", dir);
    cat_t *c = cat_open(path, false);
    TS_NEW(c);
    return c;
}

static long long sql_int(const char *path, const char *sql) {
    sqlite3 *db;
    sqlite3_stmt *q;
    long long v = -1;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
        v = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
    return v;
}

/* Waits, in 10 ms polls up to `polls` of them, until query sql on the
 * catalog at path counts at least `want` (rows the writer thread writes);
 * what it counts then. */
static long long wait_sql_at_least(const char *path, const char *sql, long long want, int polls) {
    long long got = sql_int(path, sql);
    for (int i = 0; i < polls && got < want; i++) {
        usleep(10000);
        got = sql_int(path, sql);
    }
    return got;
}

static void remove_dir(const char *dir) {
    ck_assert_int_eq(ts_rmtree(dir), 0);
}

START_TEST(test_the_catalog_writer_commits_many_records_in_a_few_transactions_and_loses_none) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    brk_catq_t *q = brk_catq_new(&c, BRK_CATQ_MAX);
    ck_assert_ptr_nonnull(q);
    ck_assert_ptr_null(c); /* the queue owns it */
    for (int i = 0; i < 2000; i++) {
        brk_cq_decline(q, "w0", "reel-key/1 x", "00000000000000aa", "warming_up", 1);
        brk_cq_request(q, (uint64_t)i, "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0);
    }
    brk_cq_weight_state(q, "transformer", 1, "failed", ""); /* OPT: "" is no reason */
    brk_cq_eviction(q, "w0", NULL, "00000000000000aa", 0, "lru", NULL, 0, 0, 0); /* TEXT: NULL is "" */
    uint64_t batches = 0;
    (void)wait_sql_at_least(path, "SELECT count(*) FROM requests", 2000, 200);
    batches = brk_catq_batches(q);
    brk_catq_destroy(&q);
    ck_assert_ptr_null(q);
    /* 4002 records: by count (BRK_CATQ_BATCH) or by time, never one each */
    ck_assert_msg(batches >= 1 && batches <= 4002 / BRK_CATQ_BATCH + 4, "%llu transactions",
                  (unsigned long long)batches);
    ck_assert_int_eq(sql_int(path, "SELECT sum(count) FROM declines"), 2000);
    ck_assert_int_eq(sql_int(path, "SELECT count(*) FROM requests"), 2000);
    ck_assert_int_eq(sql_int(path, "SELECT count(*) FROM evictions WHERE key_text = '' AND component = ''"), 1);
    remove_dir(dir);
}
END_TEST

/* Events have a quota per worker and kept records have none: while the
 * writer cannot write (another connection holds the catalog's write lock),
 * a worker flooding events is shed at max/4 waiting, another worker's
 * events and every request row still queue, the queue says it is behind
 * once max kept records wait, and when the lock goes everything queued is
 * written: the rows of every request, the events within quota. */
START_TEST(test_a_worker_flooding_events_is_shed_at_its_quota_and_request_rows_are_never_dropped) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    sqlite3 *lock;
    ck_assert_int_eq(sqlite3_open(path, &lock), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(lock, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    enum { MAX = 100, QUOTA = MAX / 4 };
    brk_catq_t *q = brk_catq_new(&c, MAX);
    ck_assert_ptr_nonnull(q);
    for (int i = 0; i < 200; i++) {
        char key[32];
        snprintf(key, sizeof key, "reel-key/1 k%d", i);
        brk_cq_decline(q, "flood", key, "00000000000000aa", "warming_up", 1);
    }
    for (int i = 0; i < 10; i++) brk_cq_decline(q, "calm", "reel-key/1 c", "00000000000000bb", "warming_up", 1);
    ck_assert_uint_eq(brk_catq_dropped(q), 200 - QUOTA);
    ck_assert(!brk_catq_behind(q));
    for (int i = 0; i < MAX + 20; i++) brk_cq_request(q, (uint64_t)i, "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0);
    ck_assert(brk_catq_behind(q)); /* the loop answers BUSY now */
    ck_assert_uint_eq(brk_catq_dropped(q), 200 - QUOTA); /* not one request row shed */
    ck_assert_uint_ge(brk_catq_pending(q), MAX + 20);
    ck_assert_int_eq(sqlite3_exec(lock, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(lock);
    for (int i = 0; i < 500 && brk_catq_pending(q) > 0; i++) usleep(10000);
    ck_assert_uint_eq(brk_catq_pending(q), 0);
    ck_assert(!brk_catq_behind(q));
    brk_catq_destroy(&q);
    ck_assert_int_eq(sql_int(path, "SELECT count(*) FROM requests"), MAX + 20);
    ck_assert_int_eq(sql_int(path, "SELECT coalesce(sum(count), 0) FROM declines WHERE worker = 'calm'"), 10);
    ck_assert_int_eq(sql_int(path, "SELECT coalesce(sum(count), 0) FROM declines WHERE worker = 'flood'"), QUOTA);
    remove_dir(dir);
}
END_TEST

START_TEST(test_a_lone_catalog_record_is_written_within_the_batch_window) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    brk_catq_t *q = brk_catq_new(&c, BRK_CATQ_MAX);
    brk_cq_worker_seen(q, "w0", "cpu", "avx2", 1, 0, NULL);
    int waited = 0;
    while (sql_int(path, "SELECT count(*) FROM workers") < 1 && waited < 2000) {
        usleep(5000);
        waited += 5;
    }
    /* due after BRK_CATQ_WAIT_MS; a loaded machine may take longer, not seconds */
    ck_assert_msg(waited < 2000, "the record did not reach SQLite in 2 s");
    ck_assert_uint_eq(brk_catq_batches(q), 1);
    brk_catq_destroy(&q);
    remove_dir(dir);
}
END_TEST


/* Records pushed just before the stop -- fewer than a batch, their window
 * not over, most of them posted without waking the writer -- are all
 * written by destroy: none is lost at shutdown. */
START_TEST(test_records_still_waiting_at_destroy_are_all_written_before_it_returns) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    brk_catq_t *q = brk_catq_new(&c, BRK_CATQ_MAX);
    ck_assert_ptr_nonnull(q);
    for (int i = 0; i < BRK_CATQ_BATCH / 2; i++) {
        brk_cq_request(q, (uint64_t)i, "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0);
        brk_cq_decline(q, "w0", "reel-key/1 x", "00000000000000aa", "warming_up", 1);
    }
    brk_catq_destroy(&q);
    ck_assert_ptr_null(q);
    ck_assert_int_eq(sql_int(path, "SELECT count(*) FROM requests"), BRK_CATQ_BATCH / 2);
    ck_assert_int_eq(sql_int(path, "SELECT sum(count) FROM declines"), BRK_CATQ_BATCH / 2);
    remove_dir(dir);
}
END_TEST


/* A batch whose summaries the store refuses for good (here a trigger on
 * rollups refuses worker "bad") is written again record by record: the
 * bad record is refused and counted, the rest of the batch lands, and the
 * queue behind it keeps moving (before, the batch was retried forever). */
START_TEST(test_a_batch_the_store_refuses_for_good_is_written_record_by_record) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "CREATE TRIGGER no_bad BEFORE INSERT ON rollups WHEN NEW.worker = 'bad'"
                                      " BEGIN SELECT RAISE(ABORT, 'no bad workers'); END", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    brk_catq_t *q = brk_catq_new(&c, BRK_CATQ_MAX);
    for (int i = 0; i < 10; i++)
        brk_cq_request(q, (uint64_t)i, i == 4 ? "bad" : "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0);
    (void)wait_sql_at_least(path, "SELECT count(*) FROM requests", 9, 300);
    brk_cq_request(q, 99, "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0); /* after it: still written */
    (void)wait_sql_at_least(path, "SELECT count(*) FROM requests", 10, 300);
    ck_assert_uint_eq(brk_catq_refused(q), 1);
    brk_catq_destroy(&q);
    ck_assert_int_eq(sql_int(path, "SELECT count(*) FROM requests"), 10);
    ck_assert_int_eq(sql_int(path, "SELECT count(*) FROM requests WHERE worker = 'bad'"), 0);
    ck_assert_int_eq(sql_int(path, "SELECT sum(requests) FROM key_totals"), 10);
    remove_dir(dir);
}
END_TEST

/* With retention on, the writer thread prunes raw rows older than it in
 * its own small transactions, counts them, and keeps the summaries. */
START_TEST(test_the_writer_prunes_raw_rows_past_the_retention_and_counts_them) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    ck_assert_int_eq(cat_begin(c), 0);
    for (int i = 0; i < 3000; i++)
        ck_assert_int_eq(cat_request(c, (uint64_t)i, "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1000.0 + i), 0);
    ck_assert_int_eq(cat_commit(c), 0);
    brk_catq_t *q = brk_catq_new(&c, BRK_CATQ_MAX);
    brk_cq_request(q, 5000, "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0); /* now: kept */
    brk_catq_retain(q, 86400, 0);
    for (int i = 0; i < 500 && brk_catq_pruned(q) < 3000; i++) usleep(10000);
    ck_assert_uint_eq(brk_catq_pruned(q), 3000); /* more than one transaction's worth (BRK_CATQ_PRUNE_BATCH) */
    brk_catq_destroy(&q);
    ck_assert_int_eq(sql_int(path, "SELECT count(*) FROM requests"), 1);
    ck_assert_int_eq(sql_int(path, "SELECT id FROM requests"), 5000);
    ck_assert_int_eq(sql_int(path, "SELECT sum(requests) FROM key_totals"), 3001);
    remove_dir(dir);
}
END_TEST

/* Reads or writes n bytes at the start of the file at path. */
static void file_head(const char *path, unsigned char *buf, size_t n, bool write) {
    FILE *f = fopen(path, write ? "r+b" : "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(write ? fwrite(buf, 1, n, f) : fread(buf, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

/* SQLite keeps a WAL connection that once read a header that is not a
 * database's failing with "file is not a database" after the header is
 * whole again; a fresh connection reads it. The writer opens its catalog
 * again after a refused batch: while the header is broken the batches
 * fail and wait, and once it is restored they land, with every record
 * pushed meanwhile (before, every retry failed until a restart and the
 * stop lost them). */
START_TEST(test_the_catalog_writer_writes_again_once_an_unreadable_catalog_is_readable_again) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    brk_catq_t *q = brk_catq_new(&c, BRK_CATQ_MAX);
    brk_cq_request(q, 1, "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0);
    ck_assert_int_eq(wait_sql_at_least(path, "SELECT count(*) FROM requests", 1, 500), 1);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    unsigned char head[100], junk[100];
    file_head(path, head, sizeof head, false);
    memset(junk, 'x', sizeof junk);
    file_head(path, junk, sizeof junk, true);
    for (uint64_t i = 2; i <= 4; i++)
        brk_cq_request(q, i, "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0);
    for (int i = 0; i < 1000 && brk_catq_failures(q) < 2; i++) usleep(10000);
    ck_assert_uint_ge(brk_catq_failures(q), 2); /* refused, and refused again on a retry */
    ck_assert_uint_eq(brk_catq_pending(q), 3);
    file_head(path, head, sizeof head, true);
    /* (pending drops when a batch is taken, before it commits: wait on the rows) */
    ck_assert_int_eq(wait_sql_at_least(path, "SELECT count(*) FROM requests", 4, 1000), 4);
    ck_assert_uint_eq(brk_catq_pending(q), 0);
    brk_cq_request(q, 5, "w0", "00000000000000aa", 1, 2, 0, 2, 0, 0.01, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0);
    brk_catq_destroy(&q);
    ck_assert_int_eq(sql_int(path, "SELECT count(*) FROM requests"), 5);
    ck_assert_int_eq(sql_int(path, "SELECT sum(requests) FROM key_totals"), 5);
    remove_dir(dir);
}
END_TEST

/* workers.last_seen means when the worker was last heard: READY sets it;
 * while it lives a message moves it at most once a minute
 * (BRK_HEARD_EVERY_MS, so a heartbeat costs no write); its leaving moves
 * it to its last message. Before, it stayed at READY forever. */
START_TEST(test_a_workers_last_seen_follows_its_messages_at_most_once_a_minute_and_at_its_leaving) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    box_t x;
    box_open(&x);
    ck_assert_ptr_nonnull(x.b.cat = brk_catq_new(&c, BRK_CATQ_MAX));
    ready(&x, 0, 1);
    const char *span = "SELECT CAST(round((last_seen - first_seen) * 1000) AS INTEGER) FROM workers WHERE name = 'w0'";
    (void)wait_sql_at_least(path, span, 0, 500);
    ck_assert_int_eq(sql_int(path, span), 0);
    brk_worker_t *w = x.b.w[0];
    from_worker(&x, 0, wire_hdr("HEARTBEAT", 0)); /* within the minute: nothing written */
    /* a minute on: as if READY came 61 s ago (the catalog's first_seen too) */
    w->heard_ms -= 61000;
    w->seen_ms -= 61000;
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "UPDATE workers SET first_seen = first_seen - 61, last_seen = last_seen - 61",
                                  NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    uint64_t before = brk_catq_batches(x.b.cat);
    from_worker(&x, 0, wire_hdr("HEARTBEAT", 0));
    (void)wait_sql_at_least(path, span, 60000, 500);
    ck_assert_int_ge(sql_int(path, span), 60000); /* heard now, not at READY */
    ck_assert_int_eq(brk_catq_batches(x.b.cat), before + 1);
    from_worker(&x, 0, wire_hdr("HEARTBEAT", 0)); /* the next minute's: nothing yet */
    from_worker(&x, 0, wire_hdr("HEARTBEAT", 0));
    /* its leaving: last_seen at its last message */
    w->heard_ms -= 30000;
    w->seen_ms = brk_now_ms();
    long long heard = sql_int(path, span);
    ck_assert_int_eq(sql_int(path, "SELECT gone_at IS NULL FROM workers WHERE name = 'w0'"), 1);
    from_worker(&x, 0, wire_hdr("DISCONNECT", 0));
    brk_reap(&x.b);
    for (int i = 0; i < 500 && sql_int(path, "SELECT gone_at IS NOT NULL FROM workers WHERE name = 'w0'") != 1; i++)
        usleep(10000);
    ck_assert_int_ge(sql_int(path, span), heard);
    ck_assert_int_ge(sql_int(path, span), 61000);
    ck_assert_int_eq(sql_int(path, "SELECT gone_reason = 'disconnect' FROM workers WHERE name = 'w0'"), 1);
    brk_catq_destroy(&x.b.cat);
    box_close(&x);
    remove_dir(dir);
}
END_TEST

/* An EVENTS message of worker socket i: a capture and an eviction of key
 * hash h (16 hex digits). */
static void events_from(box_t *x, int i, const char *h) {
    wire_val_t *hdr = wire_hdr("EVENTS", 0), *evs = wv_arr(), *c = wv_map(), *e = wv_map();
    wv_set(c, "kind", wv_str("capture"));
    wv_set(c, "reason", wv_str("demand"));
    wv_set(c, "key", wv_str("the key's text"));
    wv_set(c, "key_hash", wv_str(h));
    wv_set(c, "bytes", wv_u64(1000));
    wv_set(e, "kind", wv_str("evict"));
    wv_set(e, "reason", wv_str("weight_sync"));
    wv_set(e, "key", wv_str("the key's text"));
    wv_set(e, "key_hash", wv_str(h));
    wv_set(e, "component", wv_str("transformer"));
    wv_set(e, "from", wv_u64(1));
    wv_set(e, "to", wv_u64(2));
    wv_push(evs, c);
    wv_push(evs, e);
    wv_set(hdr, "events", evs);
    from_worker(x, i, hdr);
}

/* EVENTS that reach a broker before their worker's READY (the broker
 * restarted, or expired the worker) are kept and recorded as the worker's
 * once the READY on the same connection registers it: w0's capture and
 * eviction land in the catalog under w0. Before, they were answered
 * RECONNECT and dropped: the catalog lost the capture but kept the later
 * eviction. Another connection's events are not adopted by w0's READY,
 * and with no READY of their own they are dropped after the wait, counted
 * in STATUS catalog_dropped. */
START_TEST(test_events_sent_before_ready_are_recorded_once_their_connection_registers) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    box_t x;
    box_open(&x);
    x.b.opt.heartbeat_ms = 1000;
    x.b.opt.liveness = 3;
    ck_assert_ptr_nonnull(x.b.cat = brk_catq_new(&c, BRK_CATQ_MAX));
    events_from(&x, 0, "00000000000000a0");
    wire_msg_t *m = take(x.w[0], false);
    ck_assert_str_eq(m->type, "RECONNECT");
    drop_msg(&m);
    events_from(&x, 1, "00000000000000b1"); /* w1 never sends READY */
    m = take(x.w[1], false);
    ck_assert_str_eq(m->type, "RECONNECT");
    drop_msg(&m);
    ck_assert_int_eq(x.b.n_orphans, 2);
    ready(&x, 0, 1);
    ck_assert_int_eq(x.b.n_orphans, 1); /* w1's wait on */
    const char *mine = "SELECT (SELECT count(*) FROM captures WHERE worker = 'w0' AND key_hash = '00000000000000a0' AND "
                       "placeholder = 0) + (SELECT count(*) FROM evictions WHERE worker = 'w0' AND key_hash = "
                       "'00000000000000a0')";
    ck_assert_int_eq(wait_sql_at_least(path, mine, 2, 500), 2);
    ck_assert_int_eq(sql_int(path, "SELECT count(*) FROM captures WHERE key_hash = '00000000000000b1'"), 0);
    brk_workers_timers(&x.b, brk_now_ms() + 20000, 1); /* past the wait: w1's are dropped */
    ck_assert_int_eq(x.b.n_orphans, 0);
    ck_assert_uint_eq(x.b.orphan_events_lost, 2);
    wire_val_t *h = wire_hdr("STATUS", 12);
    ck_assert_int_eq(wire_send(x.trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(&x, false);
    m = answer(&x);
    uint64_t dropped = 0;
    ck_assert_str_eq(m->type, "STATUS_REPLY");
    ck_assert(wv_get_u64(m->hdr, "catalog_dropped", &dropped) && dropped >= 2);
    drop_msg(&m);
    brk_catq_destroy(&x.b.cat);
    box_close(&x);
    remove_dir(dir);
}
END_TEST

/* STATUS catalog_dropped of the box's broker (no catalog: only what the
 * broker itself counted). */
static uint64_t catalog_dropped_of(box_t *x) {
    wire_val_t *h = wire_hdr("STATUS", 13);
    ck_assert_int_eq(wire_send(x->trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(x, false);
    wire_msg_t *m = answer(x);
    uint64_t dropped = UINT64_MAX;
    ck_assert_str_eq(m->type, "STATUS_REPLY");
    ck_assert(wv_get_u64(m->hdr, "catalog_dropped", &dropped));
    drop_msg(&m);
    return dropped;
}

/* The events a worker says it lost (EVENTS `dropped`: past its buffer, or
 * in an EVENTS it could not send) count in STATUS catalog_dropped, from a
 * registered worker and from a connection not registered yet alike: they
 * are missing from the catalog. Before, the broker read the count and
 * dropped it. */
START_TEST(test_events_a_worker_reports_lost_count_in_catalog_dropped) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    ck_assert_uint_eq(catalog_dropped_of(&x), 0);
    wire_val_t *h = wire_hdr("EVENTS", 0);
    wv_set(h, "events", wv_arr());
    wv_set(h, "dropped", wv_u64(5));
    from_worker(&x, 0, h);
    ck_assert_uint_eq(catalog_dropped_of(&x), 5);
    h = wire_hdr("EVENTS", 0); /* w1: not registered (told RECONNECT) */
    wv_set(h, "events", wv_arr());
    wv_set(h, "dropped", wv_u64(7));
    from_worker(&x, 1, h);
    wire_msg_t *m = take(x.w[1], false);
    ck_assert_str_eq(m->type, "RECONNECT");
    drop_msg(&m);
    ck_assert_uint_eq(catalog_dropped_of(&x), 12);
    box_close(&x);
}
END_TEST

/* One unregistered connection flooding EVENTS keeps at most 16 messages
 * (its own oldest go first), so it cannot push out another connection's
 * kept events: w0's are recorded at its READY after w1 sent 200. (Before,
 * one cap of 64 for all dropped the oldest: w0's.) */
START_TEST(test_a_flood_of_events_before_ready_cannot_push_out_another_workers) {
    char dir[] = "/tmp/reel-catq.XXXXXX", path[64];
    cat_t *c = temp_catalog(dir, path, sizeof path);
    box_t x;
    box_open(&x);
    x.b.opt.heartbeat_ms = 1000;
    x.b.opt.liveness = 3;
    ck_assert_ptr_nonnull(x.b.cat = brk_catq_new(&c, BRK_CATQ_MAX));
    events_from(&x, 0, "00000000000000a0"); /* w0's, kept for its READY */
    wire_msg_t *m = take(x.w[0], false);
    drop_msg(&m);
    for (int i = 0; i < 200; i++) events_from(&x, 1, "00000000000000b1"); /* w1: never READY */
    ck_assert_int_eq(x.b.n_orphans, 1 + 16);
    ck_assert_uint_eq(x.b.orphan_events_lost, (200 - 16) * 2);
    ready(&x, 0, 1);
    ck_assert_int_eq(x.b.n_orphans, 16);
    const char *mine = "SELECT count(*) FROM captures WHERE worker = 'w0' AND key_hash = '00000000000000a0'";
    ck_assert_int_eq(wait_sql_at_least(path, mine, 1, 500), 1);
    brk_catq_destroy(&x.b.cat);
    box_close(&x);
    remove_dir(dir);
}
END_TEST

/* ---- keys, roles and bounds (issue 10) ----------------------------------------- */

/* Before: a worker could ack any version, 2^64-1 included, and became
 * eligible for every request. */
START_TEST(test_an_ack_of_a_version_a_worker_was_never_sent_is_ignored) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    ack(&x, 0, (uint64_t)INT64_MAX, NULL);
    ck_assert_uint_eq(brk_peer_version(&x.b.w[0]->route, "transformer"), 1);
    /* one it was sent counts */
    trainer_sync(&x, 1, 2, SHA_A);
    expect_sync(&x, 0, 2);
    ack(&x, 0, 2, NULL);
    ck_assert_uint_eq(brk_peer_version(&x.b.w[0]->route, "transformer"), 2);
    wire_msg_t *d = answer(&x);
    ck_assert(done_complete(d));
    drop_msg(&d);
    /* 2^64-1 does not even decode: the worker is told */
    wire_val_t *h = wire_hdr("SYNC_ACK", 0);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(UINT64_MAX));
    wv_set(h, "ok", wv_bool(true));
    from_worker(&x, 0, h);
    wire_msg_t *e = take(x.w[0], false);
    ck_assert_str_eq(e->type, "ERROR");
    ck_assert_ptr_nonnull(strstr(wv_get_str(e->hdr, "message"), "'version' must be in 0..9223372036854775807"));
    drop_msg(&e);
    ck_assert_uint_eq(brk_peer_version(&x.b.w[0]->route, "transformer"), 2);
    box_close(&x);
}
END_TEST


/* An ack of a version below the last one sent, but never sent itself, is
 * refused too. Before, the broker remembered only the newest version it
 * sent a worker: one sent v5 that acked v3 ok was recorded as running v3
 * (eligible for requests that need it). Now it stays at v1, the refusal
 * counted, and its ack of v5 then counts. */
START_TEST(test_an_ack_of_an_older_version_never_sent_is_ignored) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    trainer_sync(&x, 1, 5, SHA_A);
    expect_sync(&x, 0, 5);
    ack(&x, 0, 3, NULL);
    ck_assert_uint_eq(brk_peer_version(&x.b.w[0]->route, "transformer"), 1);
    ck_assert_uint_eq(x.b.worker_refused, 1);
    ack(&x, 0, 1, NULL); /* the version it reported at READY: no refusal */
    ck_assert_uint_eq(x.b.worker_refused, 1);
    ack(&x, 0, 5, NULL);
    ck_assert_uint_eq(brk_peer_version(&x.b.w[0]->route, "transformer"), 5);
    wire_msg_t *d = answer(&x);
    ck_assert(done_complete(d));
    drop_msg(&d);
    ck_assert_uint_eq(x.b.worker_refused, 1);
    box_close(&x);
}
END_TEST

/* Worker i receives a SYNC of `version`; its id. */
static uint64_t expect_sync_id(box_t *x, int i, uint64_t version) {
    wire_msg_t *m = take(x->w[i], false);
    uint64_t v = 0, id = m->id;
    ck_assert_str_eq(m->type, "SYNC");
    ck_assert(wv_get_u64(m->hdr, "version", &v));
    ck_assert_uint_eq(v, version);
    drop_msg(&m);
    return id;
}

static void ack_id(box_t *x, int i, uint64_t version, const char *error, uint64_t id) {
    wire_val_t *h = wire_hdr("SYNC_ACK", id);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(version));
    wv_set(h, "ok", wv_bool(error == NULL));
    if (error) wv_set(h, "error", wv_str(error));
    from_worker(x, i, h);
}

/* A worker's answer to an earlier SYNC of a version (it failed, and the
 * trainer sent the version again) is not taken for the answer to the
 * last: the barrier waits for that one. Before, a late failure of the
 * first fetch (one the previous broker process never answered, say)
 * failed the new sync. */
START_TEST(test_an_ack_answering_an_earlier_sync_of_the_version_is_ignored) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    trainer_sync(&x, 1, 2, SHA_A);
    uint64_t first = expect_sync_id(&x, 0, 2);
    ck_assert_uint_ne(first, 0);
    ack_id(&x, 0, 2, "bad_weights: the broker could not send the uploaded file", first);
    wire_msg_t *d = answer(&x);
    ck_assert(!done_complete(d)); /* that sync failed */
    drop_msg(&d);
    trainer_sync(&x, 2, 2, SHA_A); /* published again */
    uint64_t second = expect_sync_id(&x, 0, 2);
    ck_assert_uint_ne(second, first);
    ack_id(&x, 0, 2, "bad_weights: the broker could not send the uploaded file", first); /* late, the old one */
    ck_assert_uint_eq(brk_peer_version(&x.b.w[0]->route, "transformer"), 1);
    zmq_pollitem_t it = { x.trainer, 0, ZMQ_POLLIN, 0 };
    ck_assert_int_eq(zmq_poll(&it, 1, 100), 0); /* no answer yet: the barrier waits */
    ack_id(&x, 0, 2, NULL, second);
    ck_assert_uint_eq(brk_peer_version(&x.b.w[0]->route, "transformer"), 2);
    d = answer(&x);
    ck_assert(done_complete(d));
    drop_msg(&d);
    box_close(&x);
}
END_TEST

/* Before: brk_now_ms() + (int64_t)(2^63-1) overflowed: the barrier was
 * already past its deadline and the sync failed at once. */
START_TEST(test_a_sync_deadline_of_2_63_is_clamped_not_overflowed) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    wire_val_t *h = wire_hdr("SYNC", 1);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(2));
    wv_set(h, "sha256", wv_str(SHA_A));
    wv_set(h, "path", wv_str("/w/x.safetensors"));
    wv_set(h, "deadline_ms", wv_u64((uint64_t)INT64_MAX));
    ck_assert_int_eq(wire_send(x.trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(&x, false);
    expect_sync(&x, 0, 2);
    ck_assert_ptr_nonnull(x.b.barriers);
    int64_t now = brk_now_ms();
    ck_assert_int_gt(x.b.barriers->deadline_ms, now + (int64_t)BRK_SYNC_DEADLINE_MAX_MS - 60000);
    ck_assert_int_le(x.b.barriers->deadline_ms, now + (int64_t)BRK_SYNC_DEADLINE_MAX_MS);
    brk_sync_timers(&x.b, now + 1000);
    ck_assert(!has_msg(x.trainer, "SYNC_DONE")); /* still waiting for w0 */
    ack(&x, 0, 2, NULL);
    wire_msg_t *d = answer(&x);
    ck_assert(done_complete(d));
    drop_msg(&d);
    box_close(&x);
}
END_TEST

/* Before: a version >= 2^63 was accepted (and broke every later GEN, also
 * after a restart), a path of any length too (restored cut to 1023). */
START_TEST(test_versions_past_2_63_and_paths_past_1023_bytes_are_bad_request) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    sync_fields(&x, 1, "transformer", (uint64_t)INT64_MAX + 1, SHA_A, "/w/x.safetensors", false);
    expect_error(&x, 1, "bad_request", "'version' must be in 1..9223372036854775807");
    sync_fields(&x, 2, "transformer", 0, SHA_A, "/w/x.safetensors", false);
    expect_error(&x, 2, "bad_request", "'version' must be in 1..");
    char path[1100];
    memset(path, 'a', sizeof path - 1);
    path[0] = '/';
    path[sizeof path - 1] = '\0';
    sync_fields(&x, 3, "transformer", 2, SHA_A, path, false);
    expect_error(&x, 3, "bad_request", "'path' must be a string of at most 1023 bytes");
    path[1023] = '\0'; /* 1023 bytes: the longest taken */
    sync_fields(&x, 4, "transformer", 2, SHA_A, path, false);
    expect_sync(&x, 0, 2);
    ck_assert(!has_msg(x.trainer, "ERROR"));
    /* a worker claiming 2^63 at READY is refused, not made eligible */
    wire_val_t *h = wire_hdr("READY", 0), *models = wv_arr(), *vers = wv_map();
    wv_push(models, wv_str("tiny"));
    wv_set(vers, "transformer", wv_u64((uint64_t)INT64_MAX + 1));
    wv_set(h, "name", wv_str("w1"));
    wv_set(h, "models", models);
    wv_set(h, "versions", vers);
    from_worker(&x, 1, h);
    wire_msg_t *e = take(x.w[1], false);
    ck_assert_str_eq(e->type, "ERROR");
    ck_assert_ptr_nonnull(strstr(wv_get_str(e->hdr, "message"), "'versions' transformer must be in 0.."));
    drop_msg(&e);
    ck_assert_int_eq(x.b.n_w, 1);
    box_close(&x);
}
END_TEST

static int opts(brk_opts_t *o, ...) {
    char *argv[16] = { "reel-broker" };
    int argc = 1;
    va_list ap;
    va_start(ap, o);
    for (char *a; (a = va_arg(ap, char *)) && argc < 15;) argv[argc++] = a;
    va_end(ap);
    return brk_opts_parse(o, argc, argv);
}

/* Before: a broker bound 0.0.0.0 with nothing asked of its peers. */
/* brk_ha_next: the fencing rule of a standby pair, case by case. */
static brk_ha_state_t ha(brk_ha_state_t st, bool primary, uint64_t term, int peer, uint64_t peer_term, bool silent,
                         bool asks) {
    brk_ha_view_t v = { .state = st, .primary = primary, .term = term, .peer_heard = peer >= 0,
                        .peer = peer >= 0 ? (brk_ha_state_t)peer : BRK_HA_STARTING, .peer_term = peer_term,
                        .peer_silent = silent, .client_asks = asks };
    return brk_ha_next(&v);
}

START_TEST(test_the_standby_pair_rule_never_makes_a_second_active_broker_while_the_peer_is_heard) {
    const brk_ha_state_t S = BRK_HA_STARTING, A = BRK_HA_ACTIVE, Y = BRK_HA_STANDBY;
    /* both start: the primary takes it, the backup waits */
    ck_assert_int_eq(ha(S, true, 0, S, 0, false, false), A);
    ck_assert_int_eq(ha(S, false, 0, S, 0, false, false), Y);
    ck_assert_int_eq(ha(S, true, 0, Y, 0, false, false), A);
    ck_assert_int_eq(ha(S, false, 0, Y, 0, false, false), Y);
    /* the peer active: standby, whatever a client asks (a cut elsewhere) */
    for (int asks = 0; asks < 2; asks++) {
        ck_assert_int_eq(ha(S, true, 0, A, 2, false, asks), Y);  /* the old primary returns */
        ck_assert_int_eq(ha(Y, true, 0, A, 2, false, asks), Y);
        ck_assert_int_eq(ha(Y, false, 1, A, 1, false, asks), Y);
    }
    /* a standby with a standby peer: the primary serves, the backup not */
    ck_assert_int_eq(ha(Y, true, 2, Y, 2, false, false), A);
    ck_assert_int_eq(ha(Y, false, 2, Y, 2, false, false), Y);
    /* a standby with a starting peer waits for that one to choose */
    ck_assert_int_eq(ha(Y, false, 2, S, 0, false, false), Y);
    ck_assert_int_eq(ha(Y, true, 2, S, 0, false, false), Y);
    /* the peer silent: takeover only when a client asks (came back) */
    ck_assert_int_eq(ha(Y, false, 1, -1, 1, true, false), Y);
    ck_assert_int_eq(ha(Y, false, 1, -1, 1, true, true), A);
    ck_assert_int_eq(ha(S, false, 0, -1, 0, true, true), A);
    /* ... and not before the peer timeout */
    ck_assert_int_eq(ha(Y, false, 1, -1, 1, false, true), Y);
    ck_assert_int_eq(ha(S, true, 0, -1, 0, false, true), S);
    /* an active broker stays so: alone, or beside a standby or a starting one */
    ck_assert_int_eq(ha(A, true, 1, -1, 0, true, false), A);
    ck_assert_int_eq(ha(A, false, 2, Y, 0, false, true), A);
    ck_assert_int_eq(ha(A, true, 1, S, 0, false, false), A);
    /* two actives: the higher term keeps it; at the same term, the primary */
    ck_assert_int_eq(ha(A, true, 1, A, 2, false, false), Y);
    ck_assert_int_eq(ha(A, false, 2, A, 1, false, false), A);
    ck_assert_int_eq(ha(A, true, 3, A, 3, false, false), A);
    ck_assert_int_eq(ha(A, false, 3, A, 3, false, false), Y);
    ck_assert_str_eq(brk_ha_name(Y), "standby");
    ck_assert_int_eq(brk_ha_parse("active"), A);
    ck_assert_int_eq(brk_ha_parse("leader"), -1);
}
END_TEST

/* ---- a standby's copy of the active peer's uploads (brk_ha_copy.c) ---- */

/* The peer's PEER, in state, announcing version v of transformer
 * (uploaded, sha) current (v 0: none): handled as the loop would. */
static void peer_says(box_t *x, const char *state, uint64_t v, const char *sha) {
    msg_peer_t p;
    msg_sync_t sy;
    memset(&p, 0, sizeof p);
    memset(&sy, 0, sizeof sy);
    snprintf(p.state, sizeof p.state, "%s", state);
    snprintf(p.role, sizeof p.role, "primary");
    p.term = 1;
    p.boot = 1;
    snprintf(sy.component, sizeof sy.component, "transformer");
    sy.version = v;
    snprintf(sy.sha256, sizeof sy.sha256, "%s", sha);
    sy.uploaded = true;
    p.syncs = &sy;
    p.n_syncs = v ? 1 : 0;
    brk_ha_peer(&x->b, NULL, &p);
}

static void peer_announces(box_t *x, uint64_t v, const char *sha) { peer_says(x, "active", v, sha); }

/* The next FETCH the standby sent the peer (ROUTER peer): its offset
 * checked; the message kept in *q to answer. */
static void peer_takes_fetch(void *peer, wire_msg_t **q, msg_fetch_t *f, uint64_t version, uint64_t offset) {
    wire_err_t e;
    *q = take(peer, true);
    ck_assert_str_eq((*q)->type, "FETCH");
    ck_assert_int_eq(msg_fetch_decode(*q, f, &e), 0);
    ck_assert_uint_eq(f->version, version);
    ck_assert_uint_eq(f->offset, offset);
}

/* The peer answers FETCH q with the bytes there (none past the end). */
static void peer_answers(void *peer, wire_msg_t **q, const msg_fetch_t *f, const unsigned char *bytes) {
    uint64_t n = f->offset >= UP_SIZE ? 0 : UP_SIZE - f->offset < MSG_CHUNK_MAX ? UP_SIZE - f->offset : MSG_CHUNK_MAX;
    wire_tensor_t t = msg_chunk(bytes + (f->offset < UP_SIZE ? f->offset : 0), n);
    msg_fetch_data_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.component, sizeof d.component, "%s", f->component);
    d.version = f->version;
    d.offset = f->offset;
    d.size = UP_SIZE;
    d.chunk = &t;
    ck_assert_int_eq(msg_fetch_data_send(peer, &(*q)->identity, (*q)->id, &d), 0);
    drop_msg(q);
}

/* Every message the standby has waiting from the peer, handled. */
static void standby_reads(box_t *x) {
    for (int i = 0; i < 100; i++) {
        zmq_pollitem_t it = { brk_ha_socket(&x->b), 0, ZMQ_POLLIN, 0 };
        if (zmq_poll(&it, 1, 200) <= 0) return;
        brk_ha_answers(&x->b);
    }
}

/* A standby pair's standby (docs/OPERATIONS.md "Uploaded versions on
 * both"): it FETCHes the peer's current uploaded version, 4 chunks ahead,
 * and stores it as an upload; a copy that stalls keeps what came and its
 * next try (after the retry wait) resumes there, answers to the earlier
 * try's FETCHes ignored; a version the peer replaced stops its copy (the
 * part removed) and the new one is copied; a refusal doubles the wait;
 * taking over removes the part. An active broker fetches, from its
 * standby peer, a current uploaded version it does not store, and makes
 * current a newer one the standby announces. */
START_TEST(test_a_standby_copies_the_peers_upload_resuming_a_stall_and_stopping_a_replaced_one) {
    box_t x;
    char dir[] = "/tmp/reel-brk-hacopy.XXXXXX", sha[65], sha6[65], sha7[65];
    upload_box_open(&x, dir, 0);
    x.b.opt.heartbeat_ms = 200;
    x.b.opt.liveness = 5;
    void *peer = sock(x.b.ctx, ZMQ_ROUTER);
    ck_assert_int_eq(zmq_bind(peer, "inproc://peer"), 0);
    x.b.opt.peer = "inproc://peer";
    x.b.opt.primary = false;
    ck_assert_int_eq(brk_ha_start(&x.b), 0);
    struct brk_ha *h = x.b.ha;
    unsigned char *bytes = pattern(2654435761u, 13, sha);
    unsigned char *b6 = pattern(40503u, 7, sha6), *b7 = pattern(69069u, 11, sha7);
    (void)b6;

    /* the peer active with v5: standby, and the copy asks 4 chunks ahead */
    peer_announces(&x, 5, sha);
    ck_assert(!brk_ha_active(&x.b));
    ck_assert(h->copy.on);
    wire_msg_t *q[4];
    msg_fetch_t f[4];
    for (int i = 0; i < 4; i++) peer_takes_fetch(peer, &q[i], &f[i], 5, (uint64_t)i * MSG_CHUNK_MAX);
    /* only the first chunk comes; then silence past the timeout: stalled,
     * the 4 MiB that came kept */
    peer_answers(peer, &q[0], &f[0], bytes);
    standby_reads(&x);
    uint64_t held = 0;
    ck_assert(brk_upload_progress(&x.b, "transformer", 5, sha, &held));
    ck_assert_uint_eq(held, MSG_CHUNK_MAX);
    h->copy.progress_ms -= BRK_HA_COPY_TIMEOUT_MS + 1;
    brk_ha_copy_timers(&x.b, brk_now_ms());
    ck_assert(!h->copy.on);
    ck_assert(brk_upload_progress(&x.b, "transformer", 5, sha, &held));
    ck_assert_uint_eq(held, MSG_CHUNK_MAX);
    /* not tried again before its wait; then resumed at 4 MiB */
    /* (the clock moved by moving the failure back: a PEER is considered
     * at its arrival, the peer heard) */
    h->copy.failed_ms -= BRK_HA_COPY_RETRY_MS - 1000;
    brk_ha_copy_consider(&x.b, brk_now_ms());
    ck_assert(!h->copy.on);
    h->copy.failed_ms -= 1001;
    brk_ha_copy_consider(&x.b, brk_now_ms());
    ck_assert(h->copy.on);
    ck_assert_uint_eq(h->copy.from, MSG_CHUNK_MAX);
    /* the first try's FETCHes at 4 and 8 MiB, answered late: ignored
     * (their ids are the earlier copy's) */
    peer_answers(peer, &q[1], &f[1], bytes);
    peer_answers(peer, &q[2], &f[2], bytes);
    drop_msg(&q[3]);
    standby_reads(&x);
    ck_assert(brk_upload_progress(&x.b, "transformer", 5, sha, &held));
    ck_assert_uint_eq(held, MSG_CHUNK_MAX);
    for (int i = 0; i < 4; i++) peer_takes_fetch(peer, &q[i], &f[i], 5, (uint64_t)(i + 1) * MSG_CHUNK_MAX);
    for (int i = 0; i < 4; i++) peer_answers(peer, &q[i], &f[i], bytes);
    standby_reads(&x);
    ck_assert_msg(brk_upload_stored(&x.b, "transformer", 5, sha), "v5 stored: %s", reel_err_text());
    ck_assert(!h->copy.on);
    ck_assert_uint_eq(h->copy.copied, 1);
    char path[1100];
    snprintf(path, sizeof path, "%s/transformer-v5.safetensors", dir);
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    unsigned char *got = malloc(UP_SIZE + 1);
    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(fread(got, 1, UP_SIZE + 1, fp), UP_SIZE);
    fclose(fp);
    ck_assert(memcmp(got, bytes, UP_SIZE) == 0);
    free(got);

    /* v6 announced, its copy under way; v7 replaces it: v6's stops, its
     * part removed, and v7's starts */
    peer_announces(&x, 6, sha6);
    ck_assert(h->copy.on && h->copy.version == 6);
    for (int i = 0; i < 4; i++) peer_takes_fetch(peer, &q[i], &f[i], 6, (uint64_t)i * MSG_CHUNK_MAX);
    peer_answers(peer, &q[0], &f[0], b6);
    for (int i = 1; i < 4; i++) drop_msg(&q[i]);
    standby_reads(&x);
    ck_assert(brk_upload_progress(&x.b, "transformer", 6, sha6, &held));
    peer_announces(&x, 7, sha7);
    ck_assert(!brk_upload_progress(&x.b, "transformer", 6, sha6, &held));
    ck_assert(h->copy.on && h->copy.version == 7);
    /* refused: the wait doubles with each refusal of the same version */
    for (int round = 1; round <= 2; round++) {
        for (int i = 0; i < 4; i++) peer_takes_fetch(peer, &q[i], &f[i], 7, (uint64_t)i * MSG_CHUNK_MAX);
        ck_assert_int_eq(msg_send_error(peer, &q[0]->identity, q[0]->id, WIRE_E_BAD_REQUEST, "FETCH: not stored"), 0);
        for (int i = 0; i < 4; i++) drop_msg(&q[i]);
        standby_reads(&x);
        ck_assert(!h->copy.on);
        ck_assert_int_eq(h->copy.failures, round);
        ck_assert_int_eq(h->copy.retry_ms, (int64_t)BRK_HA_COPY_RETRY_MS << (round - 1));
        h->copy.failed_ms -= h->copy.retry_ms - 500;
        brk_ha_copy_consider(&x.b, brk_now_ms());
        ck_assert(!h->copy.on);
        h->copy.failed_ms -= 501;
        brk_ha_copy_consider(&x.b, brk_now_ms());
        ck_assert(h->copy.on);
    }
    /* taking over mid-copy: the copy stops and its part goes */
    for (int i = 0; i < 4; i++) peer_takes_fetch(peer, &q[i], &f[i], 7, (uint64_t)i * MSG_CHUNK_MAX);
    peer_answers(peer, &q[0], &f[0], b7);
    for (int i = 1; i < 4; i++) drop_msg(&q[i]);
    standby_reads(&x);
    ck_assert(brk_upload_progress(&x.b, "transformer", 7, sha7, &held));
    brk_ha_copy_stop(&x.b, "this broker took over");
    ck_assert(!h->copy.on);
    ck_assert(!brk_upload_progress(&x.b, "transformer", 7, sha7, &held));
    ck_assert(brk_upload_stored(&x.b, "transformer", 5, sha)); /* what was copied stays */

    /* Active now, with v8 current (uploaded, adopted from the peer) and
     * not stored here: it fetches v8 from its standby peer */
    h->state = BRK_HA_ACTIVE;
    msg_sync_t s8;
    memset(&s8, 0, sizeof s8);
    snprintf(s8.component, sizeof s8.component, "transformer");
    s8.version = 8;
    snprintf(s8.sha256, sizeof s8.sha256, "%s", sha7); /* (b7's bytes) */
    s8.uploaded = true;
    ck_assert_int_eq(brk_sync_adopt(&x.b, &s8, "test: the peer's"), 1);
    peer_says(&x, "standby", 0, NULL);
    ck_assert(brk_ha_active(&x.b));
    ck_assert(h->copy.on && h->copy.version == 8 && !h->copy.from_active);
    for (int i = 0; i < 4; i++) peer_takes_fetch(peer, &q[i], &f[i], 8, (uint64_t)i * MSG_CHUNK_MAX);
    for (int i = 0; i < 4; i++) peer_answers(peer, &q[i], &f[i], b7);
    standby_reads(&x);
    ck_assert_msg(brk_upload_stored(&x.b, "transformer", 8, sha7), "v8 stored: %s", reel_err_text());
    ck_assert_uint_eq(h->copy.copied, 2);
    /* a newer version the standby peer announces (made current while it
     * was active, unheard here) becomes current, and is fetched from it */
    peer_says(&x, "standby", 9, sha);
    ck_assert(brk_ha_active(&x.b));
    ck_assert_uint_eq(brk_current_version(&x.b, "transformer"), 9);
    ck_assert(h->copy.on && h->copy.version == 9);

    free(bytes);
    free(b6);
    free(b7);
    brk_ha_stop(&x.b);
    zmq_close(peer);
    upload_box_close(&x, dir);
}
END_TEST

/* A peer that answers the copy's FETCH busy (it holds --max-fetch-mb of
 * answers not yet read, or 16 to this connection: brk_upload_serve.c)
 * did not refuse the version: the copy goes on, asks again for the chunk
 * it wants next once BRK_HA_COPY_RESEND_MS pass without one, and stores
 * it; no failure is counted. (A busy used to end the copy as refused,
 * its part removed, tried again from the start 5 s later.) */
START_TEST(test_a_copy_answered_busy_asks_again_instead_of_failing) {
    box_t x;
    char dir[] = "/tmp/reel-brk-habusy.XXXXXX", sha[65];
    upload_box_open(&x, dir, 0);
    x.b.opt.heartbeat_ms = 200;
    x.b.opt.liveness = 5;
    void *peer = sock(x.b.ctx, ZMQ_ROUTER);
    ck_assert_int_eq(zmq_bind(peer, "inproc://peer-busy"), 0);
    x.b.opt.peer = "inproc://peer-busy";
    x.b.opt.primary = false;
    ck_assert_int_eq(brk_ha_start(&x.b), 0);
    struct brk_ha *h = x.b.ha;
    unsigned char *bytes = pattern(2654435761u, 13, sha);

    peer_announces(&x, 5, sha);
    ck_assert(h->copy.on);
    wire_msg_t *q[4];
    msg_fetch_t f[4];
    for (int i = 0; i < 4; i++) peer_takes_fetch(peer, &q[i], &f[i], 5, (uint64_t)i * MSG_CHUNK_MAX);
    peer_answers(peer, &q[0], &f[0], bytes);
    ck_assert_int_eq(msg_send_error(peer, &q[1]->identity, q[1]->id, WIRE_E_BUSY,
                                    "FETCH: 512.0 MiB of answers are on their way (--max-fetch-mb 512)"), 0);
    for (int i = 1; i < 4; i++) drop_msg(&q[i]);
    standby_reads(&x);
    ck_assert(h->copy.on);
    ck_assert_int_eq(h->copy.failures, 0);
    uint64_t held = 0;
    ck_assert(brk_upload_progress(&x.b, "transformer", 5, sha, &held));
    ck_assert_uint_eq(held, MSG_CHUNK_MAX);
    /* nothing more comes: asked again from 4 MiB (the rest of the 9 MiB:
     * 2 chunks), and then answered */
    h->copy.progress_ms -= BRK_HA_COPY_RESEND_MS;
    h->copy.asked_ms -= BRK_HA_COPY_RESEND_MS;
    brk_ha_copy_timers(&x.b, brk_now_ms());
    ck_assert(h->copy.on);
    for (int i = 0; i < 2; i++) peer_takes_fetch(peer, &q[i], &f[i], 5, (uint64_t)(i + 1) * MSG_CHUNK_MAX);
    for (int i = 0; i < 2; i++) peer_answers(peer, &q[i], &f[i], bytes);
    standby_reads(&x);
    ck_assert_msg(brk_upload_stored(&x.b, "transformer", 5, sha), "v5 stored: %s", reel_err_text());
    ck_assert_uint_eq(h->copy.copied, 1);
    ck_assert_int_eq(h->copy.failures, 0);

    free(bytes);
    brk_ha_stop(&x.b);
    zmq_close(peer);
    upload_box_close(&x, dir);
}
END_TEST

START_TEST(test_pair_options_need_each_other) {
    brk_opts_t o;
    ck_assert_int_eq(opts(&o, "--peer", "tcp://127.0.0.1:6555", NULL), -1);
    ck_assert_str_eq(reel_err()->msg, "--peer needs --role primary or --role backup (one of each in a pair)");
    ck_assert_int_eq(opts(&o, "--role", "primary", NULL), -1);
    ck_assert_str_eq(reel_err()->msg, "--role and --peer-timeout-ms need --peer ENDPOINT");
    ck_assert_int_eq(opts(&o, "--peer", "ipc:///x", "--role", "leader", NULL), -1);
    ck_assert_int_eq(opts(&o, "--peer", "ipc:///x", "--role", "backup", "--peer-timeout-ms", "2500", NULL), 0);
    ck_assert(!o.primary);
    ck_assert_int_eq((int)o.peer_timeout_ms, 2500);
    ck_assert_int_eq(opts(&o, "--peer", "ipc:///x", "--role", "primary", NULL), 0);
    ck_assert(o.primary);
    /* a timeout under two heartbeats would take a live peer for a silent one */
    ck_assert_int_eq(opts(&o, "--peer", "ipc:///x", "--role", "primary", "--peer-timeout-ms", "1500", NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "under two heartbeats"));
    ck_assert_int_eq(opts(&o, "--peer", "ipc:///x", "--role", "primary", "--heartbeat-ms", "200", "--peer-timeout-ms",
                          "400", NULL), 0);
    /* the keys of a pair (one shared key pair): --keys is enough */
    ck_assert_int_eq(opts(&o, "--peer", "ipc:///x", "--role", "primary", "--keys", "/k", NULL), 0);
}
END_TEST

/* --max-fetch-mb: 512 MiB unless given, never under one chunk (4 MiB: a
 * smaller bound could never serve a FETCH of MSG_CHUNK_MAX). */
START_TEST(test_max_fetch_mb_defaults_to_512_and_holds_at_least_one_chunk) {
    brk_opts_t o;
    ck_assert_int_eq(opts(&o, NULL), 0);
    ck_assert_uint_eq(o.max_fetch_bytes, (uint64_t)512 << 20);
    ck_assert_int_eq(opts(&o, "--max-fetch-mb", "3", NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "--max-fetch-mb"));
    ck_assert_int_eq(opts(&o, "--max-fetch-mb", "4", NULL), 0);
    ck_assert_uint_eq(o.max_fetch_bytes, MSG_CHUNK_MAX);
}
END_TEST

/* The request keys a standby remembers: a GEN by token and id, weights by
 * what they are. */
START_TEST(test_a_standby_names_requests_by_client_token_and_weights) {
    msg_gen_t g;
    memset(&g, 0, sizeof g);
    ck_assert_uint_eq(brk_ha_key_gen(&g, 7), 0); /* no token: never a comeback */
    g.client = 42;
    uint64_t k = brk_ha_key_gen(&g, 7);
    ck_assert_uint_ne(k, 0);
    ck_assert_uint_eq(brk_ha_key_gen(&g, 7), k);
    ck_assert_uint_ne(brk_ha_key_gen(&g, 8), k);
    g.client = 43;
    ck_assert_uint_ne(brk_ha_key_gen(&g, 7), k);
    const char *sha = "ab01";
    ck_assert_uint_eq(brk_ha_key_weights(0, "transformer", 3, sha), 0); /* no token: never a comeback */
    uint64_t w = brk_ha_key_weights(7, "transformer", 3, sha);
    ck_assert_uint_ne(w, 0);
    ck_assert_uint_eq(brk_ha_key_weights(7, "transformer", 3, sha), w);
    ck_assert_uint_ne(brk_ha_key_weights(8, "transformer", 3, sha), w); /* another trainer */
    ck_assert_uint_ne(brk_ha_key_weights(7, "transformer", 4, sha), w);
    ck_assert_uint_ne(brk_ha_key_weights(7, "transformer", 3, "ab02"), w);
}
END_TEST

START_TEST(test_without_keys_only_loopback_and_ipc_endpoints_are_served_unless_insecure) {
    ck_assert(brk_endpoint_local("ipc:///run/reel/c"));
    ck_assert(brk_endpoint_local("inproc://x"));
    ck_assert(brk_endpoint_local("tcp://127.0.0.1:5555"));
    ck_assert(brk_endpoint_local("tcp://127.1.2.3:5555"));
    ck_assert(brk_endpoint_local("tcp://[::1]:5555"));
    ck_assert(brk_endpoint_local("tcp://localhost:5555"));
    ck_assert(!brk_endpoint_local("tcp://0.0.0.0:5555"));
    ck_assert(!brk_endpoint_local("tcp://*:5555"));
    ck_assert(!brk_endpoint_local("tcp://10.0.0.5:5555"));
    ck_assert(!brk_endpoint_local("tcp://1270.0.0.1:5555"));
    ck_assert(!brk_endpoint_local("tcp://127.0.0.1.evil:5555"));
    ck_assert(!brk_endpoint_local("tcp://eth0:5555"));
    ck_assert(!brk_endpoint_local("udp://127.0.0.1:5555"));
    brk_opts_t o;
    ck_assert_int_eq(opts(&o, NULL), 0); /* the defaults are loopback */
    ck_assert_ptr_null(o.keys);
    ck_assert_int_eq(opts(&o, "--clients", "tcp://0.0.0.0:5555", NULL), -1);
    ck_assert_str_eq(reel_err()->msg, "refusing to serve tcp://0.0.0.0:5555 without keys: give --keys DIR "
                                      "(reelctl keys new) or --insecure");
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_int_eq(opts(&o, "--workers", "tcp://*:5556", NULL), -1);
    ck_assert_int_eq(opts(&o, "--clients", "tcp://0.0.0.0:5555", "--insecure", NULL), 0);
    ck_assert(o.insecure);
    ck_assert_int_eq(opts(&o, "--clients", "tcp://0.0.0.0:5555", "--keys", "/etc/reel/keys", NULL), 0);
    ck_assert_str_eq(o.keys, "/etc/reel/keys");
    ck_assert_int_eq(opts(&o, "--keys", "/k", "--insecure", NULL), -1);
    ck_assert_int_eq(opts(&o, "--key", "/k/broker.key", NULL), -1);
    ck_assert_str_eq(reel_err()->msg, "--key needs --keys DIR (the peers it admits)");
    ck_assert_int_eq(opts(&o, "--liveness", "0", NULL), -1); /* a syntax error points at -h */
    ck_assert_str_eq(reel_err()->msg, "--liveness: '0' is a bad value: expected 1..1000 (try -h)");
    ck_assert_int_eq(opts(&o, "stray", NULL), -1);
    ck_assert_str_eq(reel_err()->msg, "unexpected argument 'stray' (try -h)");
    ck_assert_int_eq(opts(&o, "-h", NULL), 1);
}
END_TEST

/* Without keys every peer has every role (loopback and ipc only): a SYNC
 * passes the gate and is audited under "-". */
START_TEST(test_without_keys_the_gate_admits_everyone_and_the_sender_is_none) {
    box_t x;
    box_open(&x);
    ready(&x, 0, 1);
    brk_who_t who;
    brk_zap_sender(x.b.zap, &who);
    ck_assert_int_eq(who.role, REEL_ROLE_NONE);
    ck_assert_str_eq(who.name, "-");
    ck_assert_str_eq(x.b.w[0]->key, "");
    trainer_sync(&x, 1, 2, SHA_A);
    expect_sync(&x, 0, 2);
    box_close(&x);
}
END_TEST

/* ---- refused peers (brk_refused.h) ----------------------------------------------- */

/* A key, 40 characters as z85 gives them, numbered. */
static const char *refused_key(int i, char *buf) {
    snprintf(buf, MSG_REFUSED_KEY_MAX, "K%039d", i);
    return buf;
}

/* One client refused 2,500 times (a Reel client retrying while its calls
 * wait) is one peer: counted once, with its 2,500 handshakes, and logged
 * at its first refusal and at each 1000th, not 2,500 times (nor just ten,
 * which left the next peer's refusal unlogged). */
START_TEST(test_a_peer_refused_again_and_again_is_one_peer_logged_at_its_first_and_each_1000th) {
    brk_refused_t t;
    TS_OK(brk_refused_init(&t));
    char k[MSG_REFUSED_KEY_MAX];
    int logged = 0;
    uint64_t mine = 0;
    for (int i = 0; i < 2500; i++)
        logged += brk_refused_note(&t, false, refused_key(1, k), "", "10.0.0.7", "not in the allowlist", 1000 + i,
                                   &mine);
    ck_assert_int_eq(logged, 3); /* its 1st, 1000th and 2000th */
    ck_assert_uint_eq(mine, 2500);
    ck_assert_uint_eq(brk_refused_peers(&t), 1);
    /* another peer's first refusal is logged after all that */
    ck_assert(brk_refused_note(&t, true, refused_key(2, k), "w2", "10.0.0.8", "key w2 is a client key", 4000, NULL));
    msg_refused_peer_t out[BRK_REFUSED_PEERS];
    ck_assert_uint_eq(brk_refused_recent(&t, out, BRK_REFUSED_PEERS, 4500), 2);
    ck_assert_str_eq(out[0].socket, "worker"); /* the latest first */
    ck_assert_str_eq(out[0].name, "w2");
    ck_assert_uint_eq(out[0].count, 1);
    ck_assert_uint_eq(out[0].ago_ms, 500);
    ck_assert_str_eq(out[1].socket, "client");
    ck_assert_str_eq(out[1].key, refused_key(1, k));
    ck_assert_str_eq(out[1].address, "10.0.0.7");
    ck_assert_str_eq(out[1].why, "not in the allowlist");
    ck_assert_uint_eq(out[1].count, 2500);
    ck_assert_uint_eq(out[1].ago_ms, 4500 - 3499);
    brk_refused_fini(&t);
}
END_TEST

/* What one peer is: a key from an address on one socket. The same key
 * from another address, or on the other socket, is another; a handshake
 * refused before its key was read (no CURVE, a HELLO that does not
 * decrypt) has neither, and counts once per socket and reason. */
START_TEST(test_a_refused_peer_is_a_key_from_an_address_on_one_socket) {
    brk_refused_t t;
    TS_OK(brk_refused_init(&t));
    char k[MSG_REFUSED_KEY_MAX];
    brk_refused_note(&t, false, refused_key(1, k), "", "10.0.0.7", "not in the allowlist", 1, NULL);
    brk_refused_note(&t, false, refused_key(1, k), "", "10.0.0.7", "not in the allowlist", 2, NULL);
    ck_assert_uint_eq(brk_refused_peers(&t), 1);
    brk_refused_note(&t, false, refused_key(1, k), "", "10.0.0.9", "not in the allowlist", 3, NULL);
    brk_refused_note(&t, true, refused_key(1, k), "", "10.0.0.7", "not in the allowlist", 4, NULL);
    ck_assert_uint_eq(brk_refused_peers(&t), 3);
    for (int i = 0; i < 3; i++) brk_refused_note(&t, false, "", "", "", "not CURVE", 5 + i, NULL);
    brk_refused_note(&t, false, NULL, NULL, NULL, "does not decrypt", 9, NULL);
    brk_refused_note(&t, true, "", "", "", "not CURVE", 10, NULL);
    ck_assert_uint_eq(brk_refused_peers(&t), 6);
    msg_refused_peer_t out[BRK_REFUSED_PEERS];
    ck_assert_uint_eq(brk_refused_recent(&t, out, 2, 10), 2); /* at most max */
    ck_assert_str_eq(out[0].key, "");
    ck_assert_str_eq(out[0].why, "not CURVE");
    ck_assert_str_eq(out[0].socket, "worker");
    ck_assert_str_eq(out[1].why, "does not decrypt");
    ck_assert_uint_eq(brk_refused_recent(&t, out, BRK_REFUSED_PEERS, 10), 6);
    ck_assert_uint_eq(out[2].count, 3); /* the keyless client peer, not CURVE */
    brk_refused_fini(&t);
}
END_TEST

/* A peer that cycles keys (5,000 of them) costs the broker the table's 32
 * entries: the latest stay, the one seen least recently made room each
 * time, the peers counted are 5,000, and the log got the first ten and
 * each 1000th new peer: 15 lines. A peer refused before the flood fell
 * out; refused again, it is taken in again (and counted again). */
START_TEST(test_a_peer_cycling_keys_keeps_the_refused_table_bounded) {
    brk_refused_t t;
    TS_OK(brk_refused_init(&t));
    char k[MSG_REFUSED_KEY_MAX];
    brk_refused_note(&t, false, refused_key(999999, k), "", "10.0.0.1", "not in the allowlist", 0, NULL);
    int logged = 0;
    for (int i = 0; i < 5000; i++)
        logged += brk_refused_note(&t, false, refused_key(i, k), "", "10.6.6.6", "not in the allowlist", 1 + i, NULL);
    ck_assert_uint_eq(brk_refused_peers(&t), 5001);
    ck_assert_int_eq(logged, 9 + 5); /* the 2nd..10th new peers (the first came before), 1000th..5000th */
    msg_refused_peer_t out[BRK_REFUSED_PEERS + 1];
    ck_assert_uint_eq(brk_refused_recent(&t, out, BRK_REFUSED_PEERS + 1, 5000), BRK_REFUSED_PEERS);
    for (int i = 0; i < BRK_REFUSED_PEERS; i++) {
        ck_assert_str_eq(out[i].key, refused_key(4999 - i, k));
        ck_assert_uint_eq(out[i].count, 1);
    }
    brk_refused_note(&t, false, refused_key(999999, k), "", "10.0.0.1", "not in the allowlist", 6000, NULL);
    ck_assert_uint_eq(brk_refused_peers(&t), 5002);
    ck_assert_uint_eq(brk_refused_recent(&t, out, 1, 6000), 1);
    ck_assert_str_eq(out[0].key, refused_key(999999, k));
    ck_assert_uint_eq(out[0].count, 1); /* taken in afresh */
    brk_refused_fini(&t);
}
END_TEST

static Suite *broker_unit_suite(void) {
    Suite *s = suite_create("broker_unit");
    TCase *tc = tcase_create("routing");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hash_building_blocks_are_the_published_functions);
    tcase_add_test(tc, test_shard_hash_matches_the_capture_doc_and_ignores_device_and_versions);
    tcase_add_test(tc, test_solver_gens_are_owned_only_by_workers_that_run_the_solver);
    tcase_add_test(tc, test_prompt_and_decoded_gens_are_owned_only_by_workers_that_can_do_them);
    tcase_add_test(tc, test_same_key_same_owner_across_calls_and_worker_orderings);
    tcase_add_test(tc, test_keys_spread_evenly_over_workers);
    tcase_add_test(tc, test_removing_one_worker_moves_only_its_keys_and_adding_it_back_restores_them);
    tcase_add_test(tc, test_an_unroutable_worker_loses_its_keys_until_it_is_routable_again);
    tcase_add_test(tc, test_eligibility_by_model_and_version);
    tcase_add_test(tc, test_a_worker_at_max_inflight_keeps_its_keys);
    tcase_add_test(tc, test_versions_are_tracked_per_component);
    tcase_add_test(tc, test_full_queue_refuses_new_items_and_keeps_fifo_order);
    tcase_add_test(tc, test_recent_keys_move_to_front_and_keep_the_newest_32);
    tcase_add_test(tc, test_a_hot_key_counts_its_requests_and_halves_every_half_life);
    tcase_add_test(tc, test_a_full_hot_table_gives_a_new_key_the_coldest_slot);
    tcase_add_test(tc, test_hot_keys_are_listed_hottest_first_and_a_key_noted_again_moves_up);
    tcase_add_test(tc, test_hot_keys_a_worker_is_listed_are_exactly_those_it_owns);
    tcase_add_test(tc, test_hot_keys_go_only_to_workers_able_to_run_them_at_their_version);
    tcase_add_test(tc, test_hot_keys_go_to_the_owner_among_the_workers_their_samples_fit);
    tcase_add_test(tc, test_a_worker_fits_a_sample_by_its_tokens_under_its_patch);
    suite_add_tcase(s, tc);
    TCase *sy = tcase_create("sync");
    tcase_set_timeout(sy, 60);
    tcase_add_test(sy, test_a_sync_becomes_current_only_once_a_worker_applied_it);
    tcase_add_test(sy, test_a_sync_no_worker_applied_changes_nothing_and_lists_every_reason);
    tcase_add_test(sy, test_a_sync_with_no_live_worker_fails_and_is_not_current);
    tcase_add_test(sy, test_resending_the_current_version_acks_and_retries_only_lagging_workers);
    tcase_add_test(sy, test_resending_a_pending_version_joins_its_barrier);
    tcase_add_test(sy, test_resends_joining_a_barrier_are_bounded_and_busy_beyond);
    tcase_add_test(sy, test_a_worker_silent_past_the_deadline_lags_and_a_late_ack_catches_it_up);
    tcase_add_test(sy, test_a_worker_that_reports_the_version_at_ready_is_asked_and_its_ok_makes_it_current);
    tcase_add_test(sy, test_a_first_sync_at_the_workers_startup_version_with_other_weights_fails_on_their_stale);
    tcase_add_test(sy, test_a_worker_that_registers_again_mid_sync_is_sent_the_sync_again);
    tcase_add_test(sy, test_a_sync_a_worker_could_not_be_sent_waits_for_it_to_come_back_and_fails_only_at_its_loss_or_deadline);
    tcase_add_test(sy, test_a_sync_send_that_fails_but_for_its_transport_fails_the_member_at_once_naming_the_error);
    tcase_add_test(sy, test_a_worker_joining_below_the_current_adapters_base_is_sent_the_base_first);
    tcase_add_test(sy, test_a_worker_back_after_missing_a_base_and_its_adapter_is_sent_the_base_first);
    tcase_add_test(sy, test_a_late_ok_after_a_failed_deadline_makes_the_version_current);
    tcase_add_test(sy, test_a_sync_not_newer_for_another_component_inline_or_without_a_path_is_refused_with_its_code);
    suite_add_tcase(s, sy);
    TCase *an = tcase_create("answers");
    tcase_set_timeout(an, 60);
    tcase_add_test(an, test_at_its_deadline_a_request_nobody_could_serve_is_no_worker_and_one_that_waited_is_timeout);
    tcase_add_test(an, test_a_request_larger_than_the_broker_may_ever_hold_is_too_large_and_one_that_must_wait_busy);
    tcase_add_test(an, test_more_requests_in_flight_than_id_buckets_are_each_answered_under_their_own_id);
    tcase_add_test(an, test_a_result_that_does_not_fit_its_request_ends_it_as_internal);
    tcase_add_test(an, test_a_result_claiming_more_steps_than_its_request_runs_ends_it_as_internal);
    tcase_add_test(an, test_a_result_whose_header_breaks_after_its_type_still_ends_its_request);
    tcase_add_test(an, test_a_worker_error_code_outside_the_protocol_reaches_the_client_as_internal);
    tcase_add_test(an, test_a_gen_resent_while_its_request_lives_is_attached_and_answered_once_to_the_resend);
    tcase_add_test(an, test_progress_out_of_order_never_goes_backwards_and_the_result_names_the_brokers_boot);
    tcase_add_test(an, test_a_progress_with_bad_fields_is_dropped_and_counted_as_a_worker_refusal);
    tcase_add_test(an, test_an_answer_that_finds_its_clients_queue_full_is_held_and_sent_in_order_as_it_reads);
    tcase_add_test(an, test_answers_held_for_a_client_that_never_reads_are_dropped_and_counted_past_their_bounds);
    tcase_add_test(an, test_a_groups_progress_runs_to_n_times_its_steps_and_frames_and_no_further);
    tcase_add_test(an, test_a_latent_gens_progress_never_counts_decoded_frames);
    tcase_add_test(an, test_a_decoded_gens_progress_counts_its_frames_on_and_never_past_the_end);
    tcase_add_test(an, test_a_resend_that_differs_from_its_live_request_is_bad_request_and_the_request_goes_on);
    tcase_add_test(an, test_a_prompt_for_a_model_announced_without_a_config_is_bad_request_naming_why);
    tcase_add_test(an, test_a_large_request_is_announced_and_its_worker_given_time_before_it_counts_as_silent);
    tcase_add_test(an, test_a_small_request_goes_unannounced_and_leaves_the_liveness_as_it_was);
    tcase_add_test(an, test_large_requests_add_up_their_grace_but_a_silent_worker_gets_none);
    tcase_add_test(an, test_a_workers_announced_large_message_postpones_its_expiry);
    tcase_add_test(an, test_a_workers_announcements_do_not_add_up_past_one_messages_time);
    tcase_add_test(an, test_a_resend_that_spells_out_defaults_is_the_same_live_request);
    tcase_add_test(an, test_a_result_names_the_worker_the_broker_sent_the_request_to);
    tcase_add_test(an, test_the_same_id_under_another_token_or_none_is_a_request_of_its_own);
    tcase_add_test(an, test_an_answered_request_is_forgotten_and_its_id_again_is_a_new_request);
    tcase_add_test(an, test_a_resend_of_an_abandoned_request_is_a_new_request);
    tcase_add_test(an, test_cancel_names_only_its_own_gen_and_a_running_one_keeps_its_slot_until_the_worker_answers);
    tcase_add_test(an, test_a_free_slot_goes_to_the_sender_with_the_fewest_requests_and_each_sender_keeps_its_order);
    tcase_add_test(an, test_a_full_queue_gives_a_newcomer_the_newest_place_of_the_client_with_the_most_waiting);
    tcase_add_test(an, test_a_queue_held_past_its_max_by_requeued_requests_displaces_no_one);
    tcase_add_test(an, test_every_waiting_request_notes_its_owner_even_when_one_slot_is_free);
    tcase_add_test(an, test_a_key_waits_for_its_owner_to_apply_a_sync_and_moves_only_if_the_owner_fails_it);
    tcase_add_test(an, test_uploads_need_a_weights_dir_and_a_sync_by_value_needs_the_upload);
    tcase_add_test(an, test_fetches_of_an_upload_still_coming_wait_for_whole_chunks_and_fail_with_it);
    tcase_add_test(an, test_a_connection_gets_at_most_16_fetch_answers_on_their_way_and_busy_beyond);
    tcase_add_test(an, test_fetch_answers_on_their_way_to_all_connections_are_bounded_in_bytes_and_busy_beyond);
    tcase_add_test(an, test_weights_keep_removes_older_versions_and_finishes_a_cut_short_removal);
    tcase_add_test(an, test_a_removed_version_s_file_is_written_over_by_the_next_upload);
    tcase_add_test(an, test_a_chunk_workers_wait_for_goes_to_them_as_it_came);
    tcase_add_test(an, test_an_upload_replaced_half_way_is_stored_with_the_new_bytes_only);
    tcase_add_test(an, test_other_bytes_do_not_replace_an_upload_whose_sync_is_under_way);
    tcase_add_test(an, test_uploads_of_another_component_are_refused_and_a_fifth_open_one_is_busy);
    tcase_add_test(an, test_a_shape_too_large_for_its_owner_goes_to_a_worker_it_fits);
    tcase_add_test(an, test_a_worker_flooding_faulty_messages_has_a_bounded_share_of_the_log);
    tcase_add_test(an, test_refused_messages_share_the_log_by_kind_and_are_summed_up_after_the_window);
    tcase_add_test(an, test_an_upload_with_other_bytes_replaces_a_version_never_applied);
    tcase_add_test(an, test_without_a_hashing_thread_uploads_are_hashed_inline_with_the_same_outcomes);
    tcase_add_test(an, test_request_outcome_labels_are_bounded_and_clean);
    tcase_add_test(an, test_answers_to_junk_are_budgeted_per_peer_and_strangers_on_the_worker_socket_get_none);
    tcase_add_test(an, test_the_malformed_counter_counts_unreadable_messages_not_wrong_fields);
    tcase_add_test(an, test_status_lists_each_model_with_the_config_its_worker_announced);
    suite_add_tcase(s, an);
    TCase *se = tcase_create("security");
    tcase_add_test(se, test_a_peer_refused_again_and_again_is_one_peer_logged_at_its_first_and_each_1000th);
    tcase_add_test(se, test_a_refused_peer_is_a_key_from_an_address_on_one_socket);
    tcase_add_test(se, test_a_peer_cycling_keys_keeps_the_refused_table_bounded);
    tcase_add_test(se, test_an_ack_of_a_version_a_worker_was_never_sent_is_ignored);
    tcase_add_test(se, test_an_ack_of_an_older_version_never_sent_is_ignored);
    tcase_add_test(se, test_an_ack_answering_an_earlier_sync_of_the_version_is_ignored);
    tcase_add_test(se, test_a_sync_deadline_of_2_63_is_clamped_not_overflowed);
    tcase_add_test(se, test_versions_past_2_63_and_paths_past_1023_bytes_are_bad_request);
    tcase_add_test(se, test_without_keys_only_loopback_and_ipc_endpoints_are_served_unless_insecure);
    tcase_add_test(se, test_without_keys_the_gate_admits_everyone_and_the_sender_is_none);
    tcase_add_test(se, test_the_standby_pair_rule_never_makes_a_second_active_broker_while_the_peer_is_heard);
    tcase_add_test(se, test_pair_options_need_each_other);
    tcase_add_test(se, test_max_fetch_mb_defaults_to_512_and_holds_at_least_one_chunk);
    tcase_add_test(se, test_a_standby_copies_the_peers_upload_resuming_a_stall_and_stopping_a_replaced_one);
    tcase_add_test(se, test_a_copy_answered_busy_asks_again_instead_of_failing);
    tcase_add_test(se, test_a_standby_names_requests_by_client_token_and_weights);
    suite_add_tcase(s, se);

    TCase *cq = tcase_create("catalog writer");
    tcase_set_timeout(cq, 60);
    tcase_add_test(cq, test_the_catalog_writer_commits_many_records_in_a_few_transactions_and_loses_none);
    tcase_add_test(cq, test_a_lone_catalog_record_is_written_within_the_batch_window);
    tcase_add_test(cq, test_records_still_waiting_at_destroy_are_all_written_before_it_returns);
    tcase_add_test(cq, test_a_batch_the_store_refuses_for_good_is_written_record_by_record);
    tcase_add_test(cq, test_the_writer_prunes_raw_rows_past_the_retention_and_counts_them);
    tcase_add_test(cq, test_a_worker_flooding_events_is_shed_at_its_quota_and_request_rows_are_never_dropped);
    tcase_add_test(cq, test_the_catalog_writer_writes_again_once_an_unreadable_catalog_is_readable_again);
    tcase_add_test(cq, test_a_workers_last_seen_follows_its_messages_at_most_once_a_minute_and_at_its_leaving);
    tcase_add_test(cq, test_events_sent_before_ready_are_recorded_once_their_connection_registers);
    tcase_add_test(cq, test_events_a_worker_reports_lost_count_in_catalog_dropped);
    tcase_add_test(cq, test_a_flood_of_events_before_ready_cannot_push_out_another_workers);
    suite_add_tcase(s, cq);
    return s;
}

int main(void) {
    return ts_run(broker_unit_suite());
}
