/* test_broker_unit.c -- the broker's pure routing rules (broker/brk_route.h):
 * rendezvous owners are stable and move only the keys of a worker that
 * leaves, eligibility by model and weight version, the bounded queue that
 * answers BUSY, recent keys, the shard hash and the sync version check.
 * No sockets: the process-level behaviour is tested against a running
 * reel-broker elsewhere. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "broker/brk_route.h"
#include "kernels/error.h"

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
    ck_assert_uint_eq(brk_fnv1a64(""), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(brk_fnv1a64("a"), 0xaf63dc4c8601ec8cull);
    ck_assert_uint_eq(brk_splitmix64(0), 0xe220a8397b1dcdafull);
    ck_assert_uint_eq(brk_rendezvous_score(42, "w1"), brk_splitmix64(42 ^ brk_fnv1a64("w1")));
    ck_assert_uint_ne(brk_rendezvous_score(42, "w1"), brk_rendezvous_score(42, "w2"));
    ck_assert_uint_ne(brk_rendezvous_score(42, "w1"), brk_rendezvous_score(43, "w1"));
}
END_TEST

START_TEST(test_shard_hash_matches_the_capture_doc_and_ignores_device_and_versions) {
    int64_t lat[4] = { 4, 2, 8, 8 }, ctx[2] = { 5, 32 };
    /* docs/CAPTURE.md: the shard form of the tiny CFG euler step */
    ck_assert_uint_eq(brk_shard_hash("tiny", false, lat, ctx, true), 0xb6d4e43bdf155e32ull);
    uint64_t base = brk_shard_hash("tiny", false, lat, ctx, true);
    ck_assert_uint_ne(brk_shard_hash("tiny", true, lat, ctx, true), base);
    ck_assert_uint_ne(brk_shard_hash("tiny", false, lat, ctx, false), base);
    ck_assert_uint_ne(brk_shard_hash("small", false, lat, ctx, true), base);
    int64_t lat2[4] = { 4, 2, 8, 16 };
    ck_assert_uint_ne(brk_shard_hash("tiny", false, lat2, ctx, true), base);
    /* names that could forge the key text are refused */
    ck_assert_uint_eq(brk_shard_hash("tiny model=x", false, lat, ctx, true), 0);
    ck_assert_uint_eq(brk_shard_hash("", false, lat, ctx, true), 0);
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

START_TEST(test_sync_versions_must_increase_and_need_a_digest_and_a_payload) {
    const char *sha = "0123456789abcdef0123456789abcdef0123456789ABCDEF0123456789abcdef";
    char why[256];
    ck_assert_int_eq(brk_sync_check("transformer", 1, 0, sha, true, 0, why, sizeof why), BRK_SYNC_OK);
    ck_assert_int_eq(brk_sync_check("transformer", 4, 3, sha, false, 2, why, sizeof why), BRK_SYNC_OK);
    ck_assert_int_eq(brk_sync_check("transformer", 3, 3, sha, true, 0, why, sizeof why), BRK_SYNC_STALE);
    ck_assert_msg(strstr(why, "3") && strstr(why, "not newer"), "message: %s", why);
    ck_assert_int_eq(brk_sync_check("transformer", 2, 5, sha, true, 0, why, sizeof why), BRK_SYNC_STALE);
    ck_assert_msg(strstr(why, "2") && strstr(why, "5"), "names both versions: %s", why);
    ck_assert_int_eq(brk_sync_check("transformer", 0, 0, sha, true, 0, why, sizeof why), BRK_SYNC_STALE);
    ck_assert_int_eq(brk_sync_check("transformer", 6, 5, "abc", true, 0, why, sizeof why), BRK_SYNC_BAD);
    ck_assert_int_eq(brk_sync_check("transformer", 6, 5, NULL, true, 0, why, sizeof why), BRK_SYNC_BAD);
    char bad[65];
    memcpy(bad, sha, 65);
    bad[10] = 'g';
    ck_assert_int_eq(brk_sync_check("transformer", 6, 5, bad, true, 0, why, sizeof why), BRK_SYNC_BAD);
    ck_assert_int_eq(brk_sync_check("transformer", 6, 5, sha, false, 0, why, sizeof why), BRK_SYNC_BAD);
    ck_assert_int_eq(brk_sync_check(NULL, 6, 5, sha, true, 0, why, sizeof why), BRK_SYNC_BAD);
    ck_assert_int_eq(brk_sync_check("a b", 6, 5, sha, true, 0, why, sizeof why), BRK_SYNC_BAD);
}
END_TEST

static Suite *broker_unit_suite(void) {
    Suite *s = suite_create("broker_unit");
    TCase *tc = tcase_create("routing");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hash_building_blocks_are_the_published_functions);
    tcase_add_test(tc, test_shard_hash_matches_the_capture_doc_and_ignores_device_and_versions);
    tcase_add_test(tc, test_same_key_same_owner_across_calls_and_worker_orderings);
    tcase_add_test(tc, test_keys_spread_evenly_over_workers);
    tcase_add_test(tc, test_removing_one_worker_moves_only_its_keys_and_adding_it_back_restores_them);
    tcase_add_test(tc, test_an_unroutable_worker_loses_its_keys_until_it_is_routable_again);
    tcase_add_test(tc, test_eligibility_by_model_and_version);
    tcase_add_test(tc, test_a_worker_at_max_inflight_keeps_its_keys);
    tcase_add_test(tc, test_versions_are_tracked_per_component);
    tcase_add_test(tc, test_full_queue_refuses_new_items_and_keeps_fifo_order);
    tcase_add_test(tc, test_recent_keys_move_to_front_and_keep_the_newest_32);
    tcase_add_test(tc, test_sync_versions_must_increase_and_need_a_digest_and_a_payload);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(broker_unit_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}
