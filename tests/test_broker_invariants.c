/* test_broker_invariants.c -- the broker's invariant checker (broker/brk_check.h):
 * a broker driven through its own dispatch (brk_handle, inproc sockets, as
 * tests/test_broker_unit.c does) into a state with every kind of thing in
 * it -- workers, requests in flight and queued, a current version, a
 * pending SYNC's barrier, an upload half-way with a FETCH parked on it --
 * passes the checker; then each invariant is broken in turn, by hand, and
 * the checker must refuse the state and name what broke. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_broker.h"
#include "base/error.h"
#include "broker/brk_check.h"
#include "broker/brk_loop.h"
#include "broker/brk_msg.h"
#include "broker/brk_requests.h"
#include "broker/brk_sync.h"
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"
#include "base/sha256.h"
#include "tests/support.h"

#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define NW 3
#define NGEN 6
#define UP_SIZE ((size_t)9 << 20)
#define UP_PIECE ((size_t)3 << 19)

typedef struct {
    brk_t b;
    void *trainer;
    void *w[NW];
    char dir[64];
    unsigned char *bytes;
    char sha[65];
} box_t;

static box_t X; /* one per test (CK_FORK=no runs them in turn) */

static void *sock(void *ctx, int type) {
    void *s = zmq_socket(ctx, type);
    ck_assert_ptr_nonnull(s);
    int linger = 0, tmo = 2000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    return s;
}

static void drain(void *s) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) >= 0) {}
    zmq_msg_close(&m);
}

static void deliver(bool worker_side) {
    wire_msg_t *m = calloc(1, sizeof *m);
    wire_err_t err;
    int rc = msg_recv(worker_side ? X.b.workers : X.b.clients, true, 0, m, &err);
    ck_assert_int_ge(rc, 0);
    brk_handle(&X.b, worker_side, &m, rc, &err);
    if (m) {
        wire_msg_close(m);
        free(m);
    }
}

static void from_worker(int i, wire_val_t *hdr) {
    ck_assert_int_eq(wire_send(X.w[i], NULL, hdr, NULL, 0), 0);
    wv_free(&hdr);
    deliver(true);
}

static void ready(int i) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    wire_val_t *h = wire_hdr("READY", 0), *models = wv_arr(), *vers = wv_map();
    wv_push(models, wv_str("tiny"));
    wv_set(vers, "transformer", wv_u64(1));
    wv_set(h, "name", wv_str(name));
    wv_set(h, "models", models);
    wv_set(h, "versions", vers);
    wv_set(h, "max_inflight", wv_u64(2));
    from_worker(i, h);
}

static void sync_v(uint64_t id, uint64_t version, const char *sha) {
    wire_val_t *h = wire_hdr("SYNC", id);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(version));
    wv_set(h, "sha256", wv_str(sha));
    wv_set(h, "path", wv_str("/w/x.safetensors"));
    ck_assert_int_eq(wire_send(X.trainer, NULL, h, NULL, 0), 0);
    wv_free(&h);
    deliver(false);
}

static void ack(int i, uint64_t version) {
    wire_val_t *h = wire_hdr("SYNC_ACK", 0);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(version));
    wv_set(h, "ok", wv_bool(true));
    from_worker(i, h);
}

static void gen(uint64_t id) {
    static float ctx[5 * 32];
    wire_val_t *h = wire_hdr("GEN", id), *ls = wv_arr();
    const int64_t l[4] = { 4, 2, 8, 8 };
    for (int i = 0; i < 4; i++) wv_push(ls, wv_u64((uint64_t)l[i]));
    wv_set(h, "model", wv_str("tiny"));
    wv_set(h, "steps", wv_u64(2));
    wv_set(h, "latent_shape", ls);
    const int64_t cs[2] = { 5, 32 };
    wire_tensor_t t = ts_wire_tensor("context", KERN_F32, 2, cs, ctx, sizeof ctx);
    ck_assert_int_eq(wire_send(X.trainer, NULL, h, &t, 1), 0);
    wv_free(&h);
    deliver(false);
}

static void upload_first_piece(uint64_t version) {
    wire_tensor_t t = msg_chunk(X.bytes, UP_PIECE);
    msg_upload_t u;
    memset(&u, 0, sizeof u);
    snprintf(u.component, sizeof u.component, "transformer");
    u.version = version;
    snprintf(u.sha256, sizeof u.sha256, "%s", X.sha);
    u.size = UP_SIZE;
    u.chunk = &t;
    ck_assert_int_eq(msg_upload_send(X.trainer, NULL, 50, &u), 0);
    deliver(false);
}

static void fetch_at(int i, uint64_t version, uint64_t offset) {
    msg_fetch_t f;
    memset(&f, 0, sizeof f);
    snprintf(f.component, sizeof f.component, "transformer");
    f.version = version;
    snprintf(f.sha256, sizeof f.sha256, "%s", X.sha);
    f.offset = offset;
    ck_assert_int_eq(msg_send(X.w[i], NULL, MSG_FETCH, 60 + offset, &f, NULL), 0);
    deliver(true);
}

/* The broker of every test: 3 workers at transformer v2 (current, applied
 * by all), 6 GENs of one shard key (2 in flight on its owner, 4 queued),
 * v3 pending (its barrier waits for all 3), v4 uploaded half-way with a
 * FETCH of bytes still to come parked on it. */
static void setup(void) {
    memset(&X, 0, sizeof X);
    X.b.next_id = 1;
    X.b.opt.sync_deadline_ms = 30000;
    X.b.opt.request_deadline_ms = 60000;
    X.b.opt.max_held_bytes = (uint64_t)1 << 30;
    X.b.opt.max_fetch_bytes = (uint64_t)512 << 20;
    ck_assert_int_eq(brk_queue_init(&X.b.queue, 8), 0);
    ck_assert_ptr_nonnull(X.b.ctx = zmq_ctx_new());
    X.b.clients = sock(X.b.ctx, ZMQ_ROUTER);
    X.b.workers = sock(X.b.ctx, ZMQ_ROUTER);
    int one = 1;
    zmq_setsockopt(X.b.workers, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    ck_assert_int_eq(zmq_bind(X.b.clients, "inproc://clients"), 0);
    ck_assert_int_eq(zmq_bind(X.b.workers, "inproc://workers"), 0);
    X.trainer = sock(X.b.ctx, ZMQ_DEALER);
    ck_assert_int_eq(zmq_connect(X.trainer, "inproc://clients"), 0);
    for (int i = 0; i < NW; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        X.w[i] = sock(X.b.ctx, ZMQ_DEALER);
        zmq_setsockopt(X.w[i], ZMQ_ROUTING_ID, name, strlen(name));
        ck_assert_int_eq(zmq_connect(X.w[i], "inproc://workers"), 0);
    }
    snprintf(X.dir, sizeof X.dir, "/tmp/reel-brk-inv.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(X.dir));
    X.b.opt.weights_dir = X.dir;
    brk_upload_start(&X.b);
    ck_assert_ptr_nonnull(X.b.uploads);
    X.bytes = malloc(UP_SIZE);
    ck_assert_ptr_nonnull(X.bytes);
    for (size_t i = 0; i < UP_SIZE; i++) X.bytes[i] = (unsigned char)(i * 2654435761u >> 13);
    reel_sha256_buf(X.bytes, UP_SIZE, X.sha);

    for (int i = 0; i < NW; i++) ready(i);
    sync_v(1, 2, SHA_A);
    for (int i = 0; i < NW; i++) ack(i, 2);
    ck_assert_uint_eq(brk_current_version(&X.b, "transformer"), 2);
    for (uint64_t k = 0; k < NGEN; k++) gen(100 + k);
    sync_v(2, 3, SHA_B);
    upload_first_piece(4);
    fetch_at(0, 4, (uint64_t)4 << 20);
    drain(X.trainer);
    for (int i = 0; i < NW; i++) drain(X.w[i]);
}

static void teardown(void) {
    brk_upload_stop(&X.b);
    brk_req_shutdown(&X.b);
    brk_sync_shutdown(&X.b);
    brk_msg_pool_free(&X.b);
    brk_queue_free(&X.b.queue);
    for (int i = 0; i < X.b.n_w; i++) free(X.b.w[i]);
    free(X.b.w);
    zmq_close(X.trainer);
    for (int i = 0; i < NW; i++) zmq_close(X.w[i]);
    zmq_close(X.b.clients);
    zmq_close(X.b.workers);
    zmq_ctx_term(X.b.ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", X.dir);
    ck_assert_int_eq(system(cmd), 0);
    free(X.bytes);
}

/* The checker refuses the state, naming `want`. */
static void broken(const char *want) {
    ck_assert_msg(brk_check(&X.b) == -1, "the checker passed a state with '%s' broken", want);
    ck_assert_int_eq(reel_err_code(), REEL_E_INTERNAL); /* a broken invariant is a bug */
    ck_assert_msg(strstr(reel_err()->msg, want) != NULL, "checker said '%s', expected '%s'", reel_err()->msg, want);
}

static void holds(void) {
    TS_OK(brk_check(&X.b));
}

static brk_req_t *req_in(brk_req_state_t st) {
    for (brk_req_t *r = X.b.reqs; r; r = r->next)
        if (r->state == st) return r;
    ck_abort_msg("no request in state %d", (int)st);
    return NULL;
}

static brk_worker_t *owner(void) { return req_in(REQ_INFLIGHT)->worker; }

static slot_t *open_slot(void) {
    for (int i = 0; i < BRK_UPLOADS_MAX; i++)
        if (X.b.uploads->s[i].open) return &X.b.uploads->s[i];
    ck_abort_msg("no upload open");
    return NULL;
}

START_TEST(test_a_broker_with_work_of_every_kind_passes_and_the_state_is_what_the_test_built) {
    holds();
    ck_assert_int_eq(X.b.n_w, NW);
    ck_assert_int_eq(owner()->route.inflight, 2);
    ck_assert_uint_eq(brk_queue_len(&X.b.queue), NGEN - 2);
    ck_assert_ptr_nonnull(X.b.barriers);
    ck_assert_ptr_nonnull(X.b.barriers->sync);   /* v3 pending */
    ck_assert_int_eq(open_slot()->n_parked, 1);
    /* and it still holds once the work is answered by the broker itself */
    brk_req_timers(&X.b, INT64_MAX / 2);
    brk_reap(&X.b);
    holds();
}
END_TEST

START_TEST(test_a_broken_prev_link_in_the_requests_list_is_named) {
    brk_req_t *second = X.b.reqs->next;
    brk_req_t *was = second->prev;
    second->prev = NULL;
    broken("requests list");
    second->prev = was;
    holds();
}
END_TEST

START_TEST(test_a_request_missing_from_its_id_bucket_is_named) {
    brk_req_t *r = X.b.reqs;
    brk_req_t **h = &X.b.by_id[r->id % BRK_ID_BUCKETS];
    ck_assert_ptr_eq(*h, r); /* ids are sequential: alone in its bucket */
    *h = r->id_next;
    broken("id buckets");
    *h = r;
    holds();
    /* in the wrong bucket */
    brk_req_t **other = &X.b.by_id[(r->id + 1) % BRK_ID_BUCKETS];
    brk_req_t *was = *other;
    *h = r->id_next;
    *other = r;
    brk_req_t *rn = r->id_next;
    r->id_next = was;
    broken("bucket");
    r->id_next = rn;
    *other = was;
    *h = r;
    holds();
}
END_TEST

/* The client index (brk_t.by_client: requests a resend may name) holds
 * exactly the live requests with a client token, and no two of one token
 * and id: one left out, one in it twice over, one in it without a token
 * are each named. */
START_TEST(test_a_client_index_that_disagrees_with_the_requests_tokens_is_named) {
    brk_req_t *q = req_in(REQ_QUEUED), *f = req_in(REQ_INFLIGHT);
    ck_assert_ptr_ne(q, f);
    for (int i = 0; i < BRK_ID_BUCKETS; i++) ck_assert_ptr_null(X.b.by_client[i]); /* no GEN had a token */
    q->client = 0x77; /* a token, but not in the index */
    broken("client index holds 0 requests, 1 have a token");
    int bq = (int)brk_client_bucket(0x77, q->client_id), wrong = (bq + 1) % BRK_ID_BUCKETS;
    X.b.by_client[wrong] = q; /* in the index, but in another bucket than its own */
    broken("not its own");
    X.b.by_client[wrong] = NULL;
    X.b.by_client[bq] = q; /* now where a resend looks for it */
    holds();
    uint64_t f_id = f->client_id;
    f->client = 0x77; /* another request of the same token and id, indexed too */
    f->client_id = q->client_id;
    q->ck_next = f;
    broken("are both client id");
    f->client_id = f_id; /* its own id, but still chained in q's bucket */
    int bf = (int)brk_client_bucket(0x77, f_id);
    if (bf != bq) {
        broken("not its own");
        q->ck_next = NULL;
        X.b.by_client[bf] = f; /* in its own bucket: fine */
    }
    holds();
    f->client = 0; /* indexed without a token (and a third request with one, so the counts agree) */
    brk_req_t *o = NULL;
    for (brk_req_t *r = X.b.reqs; r && !o; r = r->next)
        if (r != q && r != f) o = r;
    o->client = 0x99;
    broken("has no token");
    o->client = 0;
    /* more indexed than have a token (or, found first, the one without) */
    broken("client index");
    q->ck_next = NULL;
    f->ck_next = NULL;
    X.b.by_client[bq] = NULL;
    X.b.by_client[bf] = NULL;
    q->client = 0;
    holds();
}
END_TEST

START_TEST(test_a_queue_that_disagrees_with_the_queued_requests_is_named) {
    void *first = X.b.queue.v[0], *second = X.b.queue.v[1];
    X.b.queue.n--; /* one queued request lost from the queue */
    broken("the queue holds");
    X.b.queue.n++;
    X.b.queue.v[1] = first; /* one twice, one missing */
    broken("twice");
    X.b.queue.v[1] = second;
    brk_req_t *q = req_in(REQ_QUEUED);
    q->state = REQ_ABANDONED; /* in the queue but not queued */
    q->worker = owner();
    broken("queue");
    q->state = REQ_QUEUED;
    q->worker = NULL;
    holds();
}
END_TEST

START_TEST(test_a_request_in_flight_on_no_registered_worker_is_named) {
    brk_req_t *r = req_in(REQ_INFLIGHT);
    brk_worker_t *w = r->worker;
    r->worker = NULL;
    broken("not registered");
    r->worker = w;
    holds();
}
END_TEST

START_TEST(test_a_worker_inflight_count_off_by_one_is_named) {
    brk_worker_t *w = owner();
    w->route.inflight--;
    broken("inflight is 1, it holds 2");
    w->route.inflight++;
    brk_worker_t *idle = X.b.w[0] == w ? X.b.w[1] : X.b.w[0];
    idle->route.inflight = 1;
    broken("inflight is 1, it holds 0");
    idle->route.inflight = 0;
    w->route.max_inflight = 1;
    broken("max_inflight");
    w->route.max_inflight = 2;
    holds();
}
END_TEST

START_TEST(test_held_bytes_that_are_not_the_sum_of_the_requests_is_named) {
    X.b.held_bytes += 1;
    broken("held_bytes");
    X.b.held_bytes -= 2;
    broken("held_bytes");
    X.b.held_bytes += 1;
    holds();
}
END_TEST

START_TEST(test_a_dead_worker_left_registered_or_a_name_twice_is_named) {
    X.b.w[1]->dead = true;
    X.b.w[1]->dead_why = "expired";
    broken("dead");
    X.b.w[1]->dead = false;
    char was[BRK_NAME_MAX];
    snprintf(was, sizeof was, "%s", X.b.w[2]->route.name);
    snprintf(X.b.w[2]->route.name, sizeof X.b.w[2]->route.name, "%s", X.b.w[0]->route.name);
    broken("two workers are named");
    snprintf(X.b.w[2]->route.name, sizeof X.b.w[2]->route.name, "%s", was);
    X.b.w[2]->ident = X.b.w[0]->ident;
    broken("routing identity");
    X.b.w[2]->ident.b[1] = '2';
    holds();
}
END_TEST

START_TEST(test_barrier_membership_that_does_not_match_the_workers_is_named) {
    brk_barrier_t *s = X.b.barriers;
    ck_assert_int_eq(s->n, NW);
    brk_member_t saved = s->m[0];
    snprintf(s->m[0].worker, sizeof s->m[0].worker, "ghost"); /* a worker dropped without failing its entry */
    broken("not registered");
    s->m[0] = saved;
    snprintf(s->m[1].worker, sizeof s->m[1].worker, "%s", s->m[0].worker);
    broken("twice");
    s->m[1] = saved;
    snprintf(s->m[1].worker, sizeof s->m[1].worker, "w1");
    holds();
    s->m[0].state = 7;
    broken("has state 7");
    s->m[0].state = BRK_MEMBER_WAITING;
    for (int i = 0; i < s->n; i++) s->m[i].state = BRK_MEMBER_FAILED; /* settled but kept */
    broken("waits for nobody");
    /* held (a resend of a sync a restart interrupted): it waits for
     * workers that have not registered yet, until its end */
    s->hold = true;
    s->hold_until_ms = 1;
    holds();
    s->hold_until_ms = 0;
    broken("held with no end");
    s->hold = false;
    for (int i = 0; i < s->n; i++) s->m[i].state = BRK_MEMBER_WAITING;
    brk_worker_t *w = brk_worker_named(&X.b, s->m[2].worker);
    uint64_t sent = w->syncs[0].sent;
    w->syncs[0].sent = 2; /* waiting for an ack of a version it was never sent */
    broken("was sent only v2");
    w->syncs[0].sent = sent;
    holds();
}
END_TEST

START_TEST(test_two_barriers_for_one_version_or_a_sync_not_the_barrier_s_own_are_named) {
    brk_barrier_t *s = X.b.barriers;
    s->sync->version = 9;
    broken("holds the SYNC of transformer v9");
    s->sync->version = 3;
    brk_barrier_t twin = *s;
    twin.next = NULL;
    s->next = &twin;
    broken("two barriers for transformer v3");
    s->next = NULL;
    holds();
}
END_TEST

START_TEST(test_a_current_version_without_its_sync_is_named) {
    brk_current_t *c = &X.b.cur[0];
    msg_sync_t *sy = c->sync;
    c->sync = NULL;
    broken("current transformer is v2 without a SYNC");
    c->sync = sy;
    c->version = 5;
    broken("holds the SYNC of transformer v2");
    c->version = 2;
    holds();
}
END_TEST

START_TEST(test_upload_slots_whose_counts_do_not_match_what_they_hold_are_named) {
    slot_t *s = open_slot();
    uint64_t received = s->received;
    s->received = s->size + 1;
    broken("received");
    s->received = received + 4096; /* counted, not written */
    broken("its file holds");
    s->received = received;
    holds();
    s->n_parked = s->cap_parked + 1;
    broken("parked FETCHes in room for");
    s->n_parked = 1;
    parked_t p = s->parked[0];
    s->parked[0].offset = 0; /* bytes that came, still parked */
    s->parked[0].max = 4096;
    broken("waits for bytes that came");
    s->parked[0] = p;
    snprintf(s->stalled, sizeof s->stalled, "disk full");
    broken("stalled with 1 FETCHes");
    s->stalled[0] = '\0';
    holds();
    /* a closed slot holding a file; two slots of one version */
    slot_t *other = s == &X.b.uploads->s[0] ? &X.b.uploads->s[1] : &X.b.uploads->s[0];
    other->fd = 0;
    broken("closed but holds state");
    other->fd = -1;
    slot_t saved = *other;
    *other = *s;
    broken("two upload slots hold transformer v4");
    *other = saved;
    holds();
    X.b.uploads->nspare = SPARES_MAX + 1;
    broken("spares kept");
    X.b.uploads->nspare = 0;
    holds();
}
END_TEST

/* The bound on an upload's hashing thread is a count beside the thread's
 * own queue: one past HASH_QUEUE waiting behind the chunk in progress, or
 * one counting a chunk the thread does not hold (a routing thread that
 * would wait for room nobody makes), is named. */
START_TEST(test_a_hashing_count_past_its_bound_or_past_what_its_thread_holds_is_named) {
    hasher_t *h = open_slot()->h;
    ck_assert_ptr_nonnull(h->th);
    pthread_mutex_lock(&h->mu);
    while (h->pending > 0) pthread_cond_wait(&h->room, &h->mu); /* the first piece hashed */
    pthread_mutex_unlock(&h->mu);
    reel_thread_pause(h->th); /* between chunks, holding none, until resumed */
    holds();
    pthread_mutex_lock(&h->mu);
    h->pending = 1;
    pthread_mutex_unlock(&h->mu);
    broken("counts 1 chunks pending to hash, its thread holds 0");
    pthread_mutex_lock(&h->mu);
    h->pending = HASH_QUEUE + 2;
    pthread_mutex_unlock(&h->mu);
    broken("pending to hash (at most");
    pthread_mutex_lock(&h->mu);
    h->pending = 0;
    pthread_mutex_unlock(&h->mu);
    reel_thread_resume(h->th);
    holds();
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("broker_invariants");
    TCase *tc = tcase_create("checker");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_a_broker_with_work_of_every_kind_passes_and_the_state_is_what_the_test_built);
    tcase_add_test(tc, test_a_broken_prev_link_in_the_requests_list_is_named);
    tcase_add_test(tc, test_a_request_missing_from_its_id_bucket_is_named);
    tcase_add_test(tc, test_a_client_index_that_disagrees_with_the_requests_tokens_is_named);
    tcase_add_test(tc, test_a_queue_that_disagrees_with_the_queued_requests_is_named);
    tcase_add_test(tc, test_a_request_in_flight_on_no_registered_worker_is_named);
    tcase_add_test(tc, test_a_worker_inflight_count_off_by_one_is_named);
    tcase_add_test(tc, test_held_bytes_that_are_not_the_sum_of_the_requests_is_named);
    tcase_add_test(tc, test_a_dead_worker_left_registered_or_a_name_twice_is_named);
    tcase_add_test(tc, test_barrier_membership_that_does_not_match_the_workers_is_named);
    tcase_add_test(tc, test_two_barriers_for_one_version_or_a_sync_not_the_barrier_s_own_are_named);
    tcase_add_test(tc, test_a_current_version_without_its_sync_is_named);
    tcase_add_test(tc, test_upload_slots_whose_counts_do_not_match_what_they_hold_are_named);
    tcase_add_test(tc, test_a_hashing_count_past_its_bound_or_past_what_its_thread_holds_is_named);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return ts_run(suite());
}
