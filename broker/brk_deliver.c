/* brk_deliver.c -- the broker's sends to clients, an answer a full queue
 * cannot take held until it can (see brk_deliver.h). */
#include "broker/brk_deliver.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_log.h"
#include "broker/brk_msg.h"

/* One answer held, in a client's list. */
typedef struct brk_held_msg {
    struct brk_held_msg *next;
    msg_type_t type;
    uint64_t bytes;              /* wire_parts_bytes(&parts) */
    wire_parts_t parts;          /* the routing identity first, as built */
} held_msg_t;

/* A client with answers held, oldest first. */
struct brk_held_client {
    struct brk_held_client *next;
    brk_ident_t ident;
    held_msg_t *head, *tail;
    int n;
    int64_t since_ms;            /* when it last took one of them, or the first was held */
};
typedef struct brk_held_client client_t;

static client_t *find(const brk_t *b, const brk_ident_t *who) {
    for (client_t *c = b->held; c; c = c->next)
        if (brk_ident_eq(&c->ident, who)) return c;
    return NULL;
}

/* Up to 8 bytes of a routing identity, in hex, for the log (ZeroMQ gives
 * a client without one 5 bytes, the first 0). */
static const char *ident_hex(const brk_ident_t *id, char out[20]) {
    size_t n = id->n < 8 ? id->n : 8;
    for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", id->b[i]);
    out[2 * n] = '\0';
    return out;
}

static void msg_drop(brk_t *b, held_msg_t *m) {
    b->answers_held--;
    b->answers_held_bytes -= m->bytes;
    wire_parts_close(&m->parts);
    free(m);
}

/* Unlinks c (it holds nothing any more) and frees it. */
static void client_free(brk_t *b, client_t *c) {
    client_t **p = &b->held;
    while (*p != c) p = &(*p)->next;
    *p = c->next;
    free(c);
}

/* Drops everything held for c, each counted undelivered (errno e: why),
 * and c itself. */
static void client_drop(brk_t *b, client_t *c, int e, const char *why) {
    char hex[20];
    brk_log("client %s: %d answer%s held for it dropped (%s)", ident_hex(&c->ident, hex), c->n, c->n == 1 ? "" : "s",
            why);
    while (c->head) {
        held_msg_t *m = c->head;
        c->head = m->next;
        errno = e;
        brk_undelivered(b, msg_type_name(m->type));
        msg_drop(b, m);
    }
    client_free(b, c);
}

/* Sends c's held answers in order while its queue takes them. true when
 * c was emptied (and freed); false while some are still held (c stays). */
static bool client_flush(brk_t *b, client_t *c, int64_t now) {
    while (c->head) {
        held_msg_t *m = c->head;
        if (wire_parts_send(b->clients, &m->parts) != 0) {
            if (errno == EAGAIN) return false;
            /* gone (EHOSTUNREACH): so is everything behind it */
            client_drop(b, c, errno, "the client is gone");
            return true;
        }
        c->head = m->next;
        if (!c->head) c->tail = NULL;
        c->n--;
        c->since_ms = now;
        msg_drop(b, m); /* (its parts went: nothing left to close) */
    }
    client_free(b, c);
    return true;
}

/* Holds the built message k for client who (k's parts move into the held
 * list). 0, or -1 with errno when the bounds refuse it (dropped, counted). */
static int hold(brk_t *b, const brk_ident_t *who, client_t *c, msg_type_t type, wire_parts_t *k) {
    uint64_t bytes = wire_parts_bytes(k);
    const char *over = c && c->n >= BRK_HELD_PER_CLIENT ? "its held answers are at their bound"
                       : b->answers_held_bytes + bytes > b->opt.max_held_bytes
                           ? "the answers held for clients would pass --max-held-mb"
                           : NULL;
    held_msg_t *m = over ? NULL : calloc(1, sizeof *m);
    client_t *fresh = NULL;
    if (!over && m && !c && !(fresh = calloc(1, sizeof *fresh))) {
        free(m);
        m = NULL;
    }
    if (!m) {
        char hex[20];
        brk_log_kind(&b->refused_log, "answers not held", "client %s: %s not held (%s): dropped", ident_hex(who, hex),
                     msg_type_name(type), over ? over : "out of memory");
        wire_parts_close(k);
        errno = ENOBUFS;
        brk_undelivered(b, msg_type_name(type));
        return -1;
    }
    if (fresh) {
        fresh->ident = *who;
        fresh->since_ms = brk_now_ms();
        fresh->next = b->held;
        b->held = c = fresh;
    }
    m->type = type;
    m->bytes = bytes;
    for (int i = 0; i < k->np; i++) {
        zmq_msg_init(&m->parts.part[i]);
        zmq_msg_move(&m->parts.part[i], &k->part[i]);
    }
    m->parts.np = k->np;
    k->np = 0;
    if (c->tail) c->tail->next = m;
    else c->head = m;
    c->tail = m;
    c->n++;
    b->answers_held++;
    b->answers_held_bytes += bytes;
    return 0;
}

/* What to send: a body to encode, or a received message to forward. */
typedef struct {
    const void *body;
    const wire_msg_t *share;
    const wire_msg_t *fwd;
    const msg_set_t *set;
    int n_set;
} out_t;

static int build(void *sock, const zmq_msg_t *to, msg_type_t type, uint64_t id, const out_t *o, wire_parts_t *keep) {
    return o->fwd ? msg_forward_keep(sock, to, o->fwd, type, id, o->set, o->n_set, keep)
                  : msg_send_keep(sock, to, type, id, o->body, o->share, keep);
}

/* A message to a client not sent: a PROGRESS counts apart (harmless: the
 * next one says more), anything else as undelivered. */
static void dropped(brk_t *b, msg_type_t type) {
    if (type == MSG_PROGRESS) b->progress_dropped++;
    else brk_undelivered(b, msg_type_name(type));
}

static int deliver(brk_t *b, const zmq_msg_t *to, msg_type_t type, uint64_t id, const out_t *o) {
    brk_ident_t who;
    brk_ident_from(&who, to);
    client_t *c = find(b, &who);
    /* what is held goes first: a queue with room again takes it now */
    if (c && client_flush(b, c, brk_now_ms())) c = NULL;
    const bool droppable = type == MSG_PROGRESS;
    if (c && droppable) { /* behind answers held: the next PROGRESS says more */
        errno = EAGAIN;
        dropped(b, type);
        return -1;
    }
    wire_parts_t k = { .np = 0 };
    /* a client with answers held: this one waits behind them, unsent */
    int rc = build(c ? NULL : b->clients, to, type, id, o, droppable ? NULL : &k);
    if (rc == 0 && !c) return 0;
    if (k.np) return hold(b, &who, c, type, &k);
    dropped(b, type); /* gone, a PROGRESS to a full queue, or refused (errno) */
    return -1;
}

int brk_client_send(brk_t *b, const zmq_msg_t *to, msg_type_t type, uint64_t id, const void *body,
                    const wire_msg_t *share) {
    out_t o = { .body = body, .share = share };
    return deliver(b, to, type, id, &o);
}

/* A zmq_msg_t holding identity `to`. -1 with errno. */
static int ident_msg(zmq_msg_t *m, const brk_ident_t *to) {
    if (zmq_msg_init_size(m, to->n) < 0) return -1;
    memcpy(zmq_msg_data(m), to->b, to->n);
    return 0;
}

int brk_client_send_ident(brk_t *b, const brk_ident_t *to, msg_type_t type, uint64_t id, const void *body) {
    zmq_msg_t ident;
    if (ident_msg(&ident, to) < 0) {
        dropped(b, type);
        return -1;
    }
    int rc = brk_client_send(b, &ident, type, id, body, NULL);
    int e = errno;
    zmq_msg_close(&ident);
    errno = e;
    return rc;
}

int brk_client_forward(brk_t *b, const zmq_msg_t *to, const wire_msg_t *m, msg_type_t type, uint64_t id,
                       const msg_set_t *set, int n_set) {
    out_t o = { .fwd = m, .set = set, .n_set = n_set };
    return deliver(b, to, type, id, &o);
}

static void verror_to(brk_t *b, bool worker_side, const zmq_msg_t *to, uint64_t id, const char *code,
                      const char *fmt, va_list ap) {
    msg_error_t e;
    snprintf(e.code, sizeof e.code, "%s", code);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    if (!to) { /* no one asked (a copy from the peer broker): logged */
        brk_log("%s: %s", e.code, e.message);
        return;
    }
    if (!worker_side) {
        (void)brk_client_send(b, to, MSG_ERROR, id, &e, NULL); /* (counted when dropped) */
        return;
    }
    if (msg_error_send(b->workers, to, id, &e) != 0) brk_undelivered(b, "ERROR to a worker");
}

void brk_error_to(brk_t *b, bool worker_side, const zmq_msg_t *to, uint64_t id, const char *code,
                  const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror_to(b, worker_side, to, id, code, fmt, ap);
    va_end(ap);
}

void brk_error_from(brk_t *b, bool worker_side, const zmq_msg_t *to, uint64_t id, const reel_err_t *r,
                    const char *what) {
    brk_error_to(b, worker_side, to, id, wire_err_code_of(r->code), "%s%s", what ? what : "", r->msg);
}

void brk_error_to_ident(brk_t *b, const brk_ident_t *to, uint64_t id, const char *code, const char *fmt, ...) {
    zmq_msg_t ident;
    if (ident_msg(&ident, to) < 0) {
        brk_undelivered(b, "ERROR");
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    verror_to(b, false, &ident, id, code, fmt, ap);
    va_end(ap);
    zmq_msg_close(&ident);
}

void brk_deliver_retry(brk_t *b, int64_t now) {
    for (client_t *c = b->held, *next; c; c = next) {
        next = c->next; /* (c may be freed) */
        if (client_flush(b, c, now)) continue;
        if (now - c->since_ms >= BRK_HELD_MS) {
            char why[96];
            snprintf(why, sizeof why, "it took none of them for %d ms", BRK_HELD_MS);
            client_drop(b, c, ETIMEDOUT, why);
        }
    }
}

int64_t brk_deliver_next_wake(const brk_t *b, int64_t now) { return b->held ? now + BRK_HELD_RETRY_MS : INT64_MAX; }

void brk_deliver_stop(brk_t *b) {
    brk_deliver_retry(b, brk_now_ms());
    while (b->held) client_drop(b, b->held, ESHUTDOWN, "the broker stops");
}

#define BROKEN(...) return reel_fail(REEL_E_INTERNAL, __VA_ARGS__)

int brk_deliver_check(const brk_t *b) {
    uint64_t n = 0, bytes = 0;
    for (const client_t *c = b->held; c; c = c->next) {
        char hex[20];
        if (!c->head || c->n <= 0) BROKEN("client %s is listed with no answer held", ident_hex(&c->ident, hex));
        int k = 0;
        const held_msg_t *last = NULL;
        for (const held_msg_t *m = c->head; m; last = m, m = m->next, k++) {
            if (k >= BRK_HELD_PER_CLIENT) BROKEN("client %s: more than %d answers held", ident_hex(&c->ident, hex),
                                                 BRK_HELD_PER_CLIENT);
            if (m->type == MSG_PROGRESS) BROKEN("client %s: a PROGRESS is held", ident_hex(&c->ident, hex));
            if (m->parts.np < 2 || m->bytes != wire_parts_bytes(&m->parts))
                BROKEN("client %s: a held %s has %d parts of %llu bytes, noted %llu", ident_hex(&c->ident, hex),
                       msg_type_name(m->type), m->parts.np, (unsigned long long)wire_parts_bytes(&m->parts),
                       (unsigned long long)m->bytes);
            bytes += m->bytes;
        }
        if (k != c->n || last != c->tail)
            BROKEN("client %s: %d answers held, noted %d (or its tail is not the last)", ident_hex(&c->ident, hex), k,
                   c->n);
        for (const client_t *d = c->next; d; d = d->next)
            if (brk_ident_eq(&c->ident, &d->ident)) BROKEN("client %s is listed twice", ident_hex(&c->ident, hex));
        n += (uint64_t)k;
    }
    if (n != b->answers_held || bytes != b->answers_held_bytes)
        BROKEN("answers held: %llu of %llu bytes, noted %llu of %llu", (unsigned long long)n,
               (unsigned long long)bytes, (unsigned long long)b->answers_held,
               (unsigned long long)b->answers_held_bytes);
    return 0;
}
