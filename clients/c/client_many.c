/* client_many.c -- reel_gen_many (client.h): a round of many GENs on one
 * connection, a window of them in flight. Each is the GEN reel_gen sends
 * (cli_gen_message) and its RESULT is taken as reel_gen takes it
 * (cli_gen_take); the wait is reel_gen's (cli_live_next) over all those
 * in flight, so a lost broker, a restart or a standby move sends every one
 * of them again. What is the round's own: the window, BUSY answers sent
 * again later, each request's timeout from its own send, and which
 * failures end the round. */
#include "client.h"
#include "client_int.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW_DEFAULT 16
#define WINDOW_MAX 1024

/* A request's GEN, built once before anything is sent. */
typedef struct {
    msg_gen_t m;
    wire_tensor_t t[3];         /* m's tensors (g's arrays) */
    size_t nl;                  /* its latent's floats */
    int of, done;               /* progress: its whole count (steps, + a decode's latent frames) and done so far */
    int wait_ms;                /* its wait for its answer, from its own send */
} req_t;

/* The round. Invariants (round_invariants): n_fl <= limit <= window
 * except right after a BUSY (limit then = n_fl, at least 1); every
 * request is in exactly one place: q[head..n) (to send), held (answered
 * BUSY, to go again), fl (in flight), or settled. */
typedef struct {
    reel_client_t *c;
    reel_gen_item_t *items;
    size_t n;
    const reel_gen_many_t *o;
    int window, limit;
    req_t *req;
    size_t *q, head;            /* the requests to send, in order: q[head..n); BUSY ones go back before head */
    size_t *held;               /* answered BUSY, to go again (first BUSY first) after another answer */
    int n_held;
    cli_live_msg_t *fl;         /* in flight: its GEN (id) ... */
    size_t *fl_i;               /* ... its request */
    int64_t *fl_due;            /* ... and when its wait ends */
    int n_fl;
    cli_live_t st;              /* the live wait, begun with the first send */
    bool begun;
    int64_t sum_done, total;    /* progress over all */
} round_t;

#ifdef REEL_INVARIANTS
#include <assert.h>
static int round_invariants(const round_t *x) {
    if (x->n_fl < 0 || x->n_fl > x->window || x->limit < 1 || x->limit > x->window) return 0;
    if (x->head > x->n || (size_t)x->n_held + (size_t)x->n_fl > x->head) return 0;
    for (int k = 0; k < x->n_fl; k++)
        if (x->fl_i[k] >= x->n || x->items[x->fl_i[k]].rc != -1) return 0;
    return 1;
}
#define CHECK_ROUND(x) assert(round_invariants(x))
#else
#define CHECK_ROUND(x) ((void)0)
#endif

static void progress_to(round_t *x) {
    if (x->o->progress)
        x->o->progress(x->o->user, x->sum_done > INT_MAX ? INT_MAX : (int)x->sum_done,
                       x->total > INT_MAX ? INT_MAX : (int)x->total);
}

/* A PROGRESS of GEN id: its request's count, never past its whole nor
 * backwards (the sum never passes the total). */
static void on_progress(void *user, uint64_t id, int done, int total) {
    round_t *x = user;
    (void)total;
    for (int k = 0; k < x->n_fl; k++) {
        if (x->fl[k].id != id) continue;
        req_t *r = &x->req[x->fl_i[k]];
        int d = done < r->of ? done : r->of;
        if (d > r->done) {
            x->sum_done += d - r->done;
            r->done = d;
            progress_to(x);
        }
        return;
    }
}

/* Request i ended with its own outcome: done is told. */
static void ended(round_t *x, size_t i, const float *latent) {
    if (x->o->done) x->o->done(x->o->user, i, &x->items[i], latent);
}

/* Takes fl[k] out of flight (the last one moves into its place); its request's index. */
static size_t take_out(round_t *x, int k) {
    size_t i = x->fl_i[k];
    x->n_fl--;
    x->fl[k] = x->fl[x->n_fl];
    x->fl_i[k] = x->fl_i[x->n_fl];
    x->fl_due[k] = x->fl_due[x->n_fl];
    return i;
}

/* Sends what the window has room for: the BUSY ones first, then those not
 * sent yet, each due its wait (cli_gen_wait_ms) after its own send. 0, or -1 with err and
 * *failed (the request whose GEN could not be sent by its timeout, told to
 * done; none when interrupted). */
static int send_more(round_t *x, wire_err_t *err, size_t *failed) {
    for (int k = x->n_held - 1; k >= 0; k--) x->q[--x->head] = x->held[k];
    x->n_held = 0;
    while (x->head < x->n && x->n_fl < x->limit) {
        size_t i = x->q[x->head];
        int64_t due = cli_now_ms() + x->req[i].wait_ms;
        if (!x->begun) { /* the first send: a STATUS before it (the broker's boot id) */
            if (cli_live_begin(x->c, &x->st, due, err) != 0) return -1;
            x->begun = true;
        }
        cli_live_msg_t m = { MSG_GEN, cli_new_id(x->c), &x->req[i].m };
        if (cli_live_send(x->c, &m, due, err) != 0) {
            if (strcmp(err->code, REEL_CLIENT_E_INTERRUPTED)) { /* its own timeout: told, as an answer's is */
                x->items[i].err = *err;
                *failed = i;
                ended(x, i, NULL);
            }
            return -1;
        }
        x->head++;
        x->fl[x->n_fl] = m;
        x->fl_i[x->n_fl] = i;
        x->fl_due[x->n_fl++] = due;
    }
    CHECK_ROUND(x);
    return 0;
}

/* The round's end before its last answer: every request in flight is
 * cancelled (its err: why, `code`, with the message of e). */
static void cancel_in_flight(round_t *x, const char *code, const char *why) {
    for (int k = 0; k < x->n_fl; k++) {
        cli_cancel_gen(x->c, x->fl[k].id);
        reel_gen_item_t *it = &x->items[x->fl_i[k]];
        it->rc = -1;
        cli_set_err(&it->err, code, "%s", why);
    }
    x->n_fl = 0;
}

/* Its requests' GENs into x->req, progress totals, the queue. 0, or -1
 * with err and *failed (a request that cannot be built). */
static int round_open(round_t *x, wire_err_t *err, size_t *failed) {
    size_t n = x->n;
    x->req = calloc(n, sizeof *x->req);
    x->q = malloc(n * sizeof *x->q);
    x->held = malloc((size_t)x->window * sizeof *x->held);
    x->fl = malloc((size_t)x->window * sizeof *x->fl);
    x->fl_i = malloc((size_t)x->window * sizeof *x->fl_i);
    x->fl_due = malloc((size_t)x->window * sizeof *x->fl_due);
    if (!x->req || !x->q || !x->held || !x->fl || !x->fl_i || !x->fl_due) {
        cli_set_err(err, WIRE_E_INTERNAL, "out of memory for a round of %zu requests", n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        reel_gen_item_t *it = &x->items[i];
        req_t *r = &x->req[i];
        wire_err_t e;
        if (cli_gen_message(x->c, &it->g, &r->m, r->t, &r->nl, &e) != 0) {
            cli_set_err(err, e.code, "requests[%zu]: %s", i, e.message);
            it->err = *err;
            *failed = i;
            return -1;
        }
        r->m.progress = x->o->progress != NULL;
        r->wait_ms = cli_gen_wait_ms(x->o->timeout_ms, r->m.deadline_ms);
        r->of = (int)r->m.steps + (msg_gen_decodes(&r->m) ? (int)it->g.latent_shape[1] : 0);
        x->total += r->of;
        x->q[i] = i;
    }
    return 0;
}

static void round_close(round_t *x) {
    free(x->req);
    free(x->q);
    free(x->held);
    free(x->fl);
    free(x->fl_i);
    free(x->fl_due);
}

/* The wait for x's GENs ran past the due time of some: each late one fails
 * "timeout" and is cancelled. Without keep_going the first sent of them
 * ends the round (1 returned, *failed set); with it all of them end and
 * the round goes on (0). -1 when none is late. */
static int settle_late(round_t *x, size_t *failed) {
    int64_t now = cli_now_ms();
    int first = -1;
    for (int k = 0; k < x->n_fl; k++)
        if (x->fl_due[k] <= now && (first < 0 || x->fl_due[k] < x->fl_due[first])) first = k;
    if (first < 0) return -1;
    for (int k = 0; k < x->n_fl;) {
        if (x->fl_due[k] > now || (!x->o->keep_going && k != first)) {
            k++;
            continue;
        }
        cli_cancel_gen(x->c, x->fl[k].id);
        bool was_first = k == first;
        size_t i = take_out(x, k);
        if (first == x->n_fl) first = k; /* it moved into k's place */
        reel_gen_item_t *it = &x->items[i];
        cli_set_err(&it->err, WIRE_E_TIMEOUT, "no answer to requests[%zu] within %d ms%s", i, x->req[i].wait_ms,
                    cli_handshake_hint(x->c));
        ended(x, i, NULL);
        if (!x->o->keep_going && was_first) {
            *failed = i;
            return 1;
        }
    }
    return 0;
}

/* The BUSY answer e to fl[k]: back to held, the window down to what the
 * broker holds of the round. 0 going on; 1 when none of the round is left
 * in flight (the queue is full of others' requests): the BUSY is the
 * request's failure (with keep_going, every one's still to send), *failed
 * its index. */
static int on_busy(round_t *x, int k, const wire_err_t *e, size_t *failed) {
    size_t i = take_out(x, k);
    x->items[i].busy++;
    x->held[x->n_held++] = i;
    x->limit = x->n_fl > 1 ? x->n_fl : 1;
    if (x->n_fl > 0) return 0; /* it goes again once another of the round is answered */
    for (int h = 0; h < x->n_held; h++) { /* answered BUSY, not to be sent again */
        size_t j = x->held[h];
        x->items[j].rc = 1;
        x->items[j].err = *e;
        ended(x, j, NULL);
    }
    x->n_held = 0;
    if (x->o->keep_going)
        for (; x->head < x->n; x->head++) {
            size_t j = x->q[x->head];
            x->items[j].rc = 1;
            cli_set_err(&x->items[j].err, WIRE_E_BUSY, "not sent: %s", e->message);
            ended(x, j, NULL);
        }
    *failed = i;
    return 1;
}

int reel_gen_many(reel_client_t *c, reel_gen_item_t *items, size_t n, const reel_gen_many_t *o, size_t *failed,
                  wire_err_t *err) {
    size_t fail_none;
    if (!failed) failed = &fail_none;
    *failed = REEL_GEN_NO_INDEX;
    static const reel_gen_many_t none;
    if (!o) o = &none;
    if (o->window < 0 || o->window > WINDOW_MAX || o->timeout_ms < 0) {
        cli_set_err(err, WIRE_E_BAD_REQUEST, "reel_gen_many: window %d (1..%d; 0: %d) or timeout_ms %d (0: at least %d) "
                    "out of range", o->window, WINDOW_MAX, WINDOW_DEFAULT, o->timeout_ms, CLI_GEN_WAIT_MIN_MS);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        items[i].rc = -1;
        items[i].busy = 0;
        memset(&items[i].res, 0, sizeof items[i].res);
        cli_set_err(&items[i].err, REEL_CLIENT_E_NOT_SENT, "not sent: the round ended first");
    }
    round_t x = { .c = c, .items = items, .n = n, .o = o };
    x.window = o->window ? o->window : WINDOW_DEFAULT;
    x.limit = x.window;
    if (n == 0) return 0;
    int rc = 0;
    if (round_open(&x, err, failed) != 0) {
        round_close(&x);
        return -1;
    }
    if (cli_call_begin(c, err) != 0) {
        round_close(&x);
        return -1;
    }
    if (send_more(&x, err, failed) != 0) {
        rc = -1;
        goto end;
    }
    while (x.n_fl > 0) {
        int64_t due = x.fl_due[0];
        for (int k = 1; k < x.n_fl; k++)
            if (x.fl_due[k] < due) due = x.fl_due[k];
        wire_msg_t a;
        wire_err_t e;
        if (cli_live_next(c, &x.st, x.fl, x.n_fl, due, &a, on_progress, &x, &e) != 0) {
            int late = strcmp(e.code, WIRE_E_TIMEOUT) ? -1 : settle_late(&x, failed);
            if (late < 0) { /* interrupted, or the connection failed: the round ends */
                *err = e;
                rc = -1;
                goto end;
            }
            if (late > 0) {
                *err = items[*failed].err;
                rc = -1;
                goto end;
            }
        } else {
            int k = 0;
            while (k < x.n_fl && x.fl[k].id != a.id) k++; /* (cli_live_next answers only for them) */
            if (k == x.n_fl) {
                wire_msg_close(&a);
                continue;
            }
            wire_err_t ae;
            if (cli_answer_is_error(&a, &ae)) {
                wire_msg_close(&a);
                if (!strcmp(ae.code, WIRE_E_BUSY)) {
                    if (on_busy(&x, k, &ae, failed) == 0 || o->keep_going)
                        continue; /* no room made: nothing more goes now (or, none left, the round ends) */
                    *err = ae;
                    rc = 1;
                    goto end;
                }
                size_t i = take_out(&x, k);
                items[i].rc = 1;
                items[i].err = ae;
                ended(&x, i, NULL);
                if (!o->keep_going) {
                    *failed = i;
                    *err = ae;
                    rc = 1;
                    goto end;
                }
            } else {
                size_t i = take_out(&x, k);
                const float *lat = NULL;
                if (cli_gen_take(&items[i].g, x.req[i].nl, &a, items[i].out, &items[i].res, &lat, &ae) != 0) {
                    wire_msg_close(&a);
                    items[i].err = ae;
                    ended(&x, i, NULL);
                    if (!o->keep_going) {
                        *failed = i;
                        *err = ae;
                        rc = -1;
                        goto end;
                    }
                } else {
                    items[i].rc = 0;
                    memset(&items[i].err, 0, sizeof items[i].err);
                    x.sum_done += x.req[i].of - x.req[i].done;
                    x.req[i].done = x.req[i].of;
                    progress_to(&x);
                    ended(&x, i, lat);
                    wire_msg_close(&a);
                }
            }
            if (x.limit < x.window) x.limit++; /* an answer: the broker made room */
        }
        if (send_more(&x, err, failed) != 0) {
            rc = -1;
            goto end;
        }
    }
end:
    if (x.n_fl > 0) {
        char why[160];
        if (!strcmp(err->code, REEL_CLIENT_E_INTERRUPTED) || *failed == REEL_GEN_NO_INDEX)
            snprintf(why, sizeof why, "cancelled: the round ended (%s)", err->code);
        else
            snprintf(why, sizeof why, "cancelled: requests[%zu] failed (%s)", *failed, err->code);
        cancel_in_flight(&x, !strcmp(err->code, REEL_CLIENT_E_INTERRUPTED) ? REEL_CLIENT_E_INTERRUPTED
                                                                            : WIRE_E_CANCELLED, why);
    }
    cli_call_end(c);
    if (o->keep_going && rc == 0) /* the first failed request in the list is the call's */
        for (size_t i = 0; i < n; i++)
            if (items[i].rc != 0) {
                *failed = i;
                *err = items[i].err;
                rc = items[i].rc;
                break;
            }
    round_close(&x);
    return rc;
}
