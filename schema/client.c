/* client.c -- the broker client (see client.h). */
#include "client.h"
#include "kernels/error.h"
#include <errno.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct reel_client {
    void *ctx;
    void *sock;
    uint64_t next_id;
};

reel_client_t *reel_client_new(const char *endpoint) {
    reel_client_t *c = calloc(1, sizeof *c);
    if (!c) { kern_fail("out of memory"); return NULL; }
    c->ctx = zmq_ctx_new();
    c->sock = c->ctx ? zmq_socket(c->ctx, ZMQ_DEALER) : NULL;
    if (!c->sock || wire_socket_limits(c->sock) != 0 || zmq_connect(c->sock, endpoint) != 0) {
        kern_fail("cannot connect to broker '%s': %s", endpoint, zmq_strerror(zmq_errno()));
        reel_client_destroy(&c);
        return NULL;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->next_id = ((uint64_t)ts.tv_nsec << 16) ^ (uint64_t)ts.tv_sec; /* ids unique per client */
    c->next_id &= 0x7fffffffffffull;
    return c;
}

void reel_client_destroy(reel_client_t **cp) {
    if (!cp || !*cp) return;
    if ((*cp)->sock) zmq_close((*cp)->sock);
    if ((*cp)->ctx) zmq_ctx_term((*cp)->ctx);
    free(*cp);
    *cp = NULL;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void set_err(wire_err_t *err, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(wire_err_t *err, const char *code, const char *fmt, ...) {
    snprintf(err->code, sizeof err->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

/* Waits for the message answering `id` (skipping stale ones); PROGRESS is
 * passed to fn. 0 with *m filled, -1 on timeout/transport failure. */
static int await(reel_client_t *c, uint64_t id, int64_t deadline, wire_msg_t *m,
                 reel_progress_fn fn, void *user, wire_err_t *err) {
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            set_err(err, WIRE_E_TIMEOUT, "no answer from the broker in time");
            return -1;
        }
        zmq_pollitem_t it = { c->sock, 0, ZMQ_POLLIN, 0 };
        int rc = zmq_poll(&it, 1, (long)left);
        if (rc < 0) {
            if (errno == EINTR) continue;
            set_err(err, WIRE_E_INTERNAL, "poll: %s", zmq_strerror(errno));
            return -1;
        }
        if (rc == 0) continue;
        wire_err_t e;
        rc = wire_recv(c->sock, false, ZMQ_DONTWAIT, m, &e);
        if (rc < 0) continue;
        if (rc == 1) { /* a malformed answer: not ours to trust */
            wire_msg_close(m);
            continue;
        }
        if (m->id != id) {
            wire_msg_close(m);
            continue;
        }
        if (!strcmp(m->type, "PROGRESS")) {
            uint64_t step = 0, steps = 0;
            wv_get_u64(m->hdr, "step", &step);
            wv_get_u64(m->hdr, "steps", &steps);
            if (fn) fn(user, (int)step, (int)steps);
            wire_msg_close(m);
            continue;
        }
        return 0;
    }
}

/* ERROR/BUSY -> 1 with err set; else 0. */
static int answer_is_error(const wire_msg_t *m, wire_err_t *err) {
    if (!strcmp(m->type, "BUSY")) {
        const char *msg = wv_get_str(m->hdr, "message");
        set_err(err, WIRE_E_BUSY, "%s", msg ? msg : "broker busy");
        return 1;
    }
    if (!strcmp(m->type, "ERROR")) {
        const char *code = wv_get_str(m->hdr, "code"), *msg = wv_get_str(m->hdr, "message");
        set_err(err, code ? code : WIRE_E_INTERNAL, "%s", msg ? msg : "");
        return 1;
    }
    return 0;
}

/* Sends h (consumed; NULL means out of memory while building it) with n
 * tensors and waits for the answer to `id`: 0 with *m holding it, 1 when
 * the broker answered ERROR or BUSY (err set), -1 on transport failure or
 * timeout (err set). */
static int call(reel_client_t *c, uint64_t id, wire_val_t *h, const wire_tensor_t *t, int n,
                int timeout_ms, reel_progress_fn fn, void *user, wire_msg_t *m, wire_err_t *err) {
    if (!h) {
        set_err(err, WIRE_E_INTERNAL, "out of memory");
        return -1;
    }
    int rc = wire_send(c->sock, NULL, h, t, n);
    wv_free(&h);
    if (rc != 0) {
        set_err(err, WIRE_E_INTERNAL, "send: %s", zmq_strerror(errno));
        return -1;
    }
    if (await(c, id, now_ms() + timeout_ms, m, fn, user, err) != 0) return -1;
    if (answer_is_error(m, err)) {
        wire_msg_close(m);
        return 1;
    }
    return 0;
}

static wire_val_t *shape_val(const int64_t *s, int n) {
    wire_val_t *a = wv_arr();
    for (int i = 0; a && i < n; i++)
        if (wv_push(a, wv_u64((uint64_t)s[i])) != 0) { wv_free(&a); return NULL; }
    return a;
}

int reel_gen(reel_client_t *c, const reel_gen_t *g, float *out, reel_gen_result_t *res,
             reel_progress_fn progress, void *user, int timeout_ms, wire_err_t *err) {
    uint64_t id = ++c->next_id;
    wire_val_t *h = wire_hdr("GEN", id);
    int ok = h && !wv_set(h, "model", wv_str(g->model)) && !wv_set(h, "version", wv_u64(g->version)) &&
             !wv_set(h, "steps", wv_u64((uint64_t)g->steps)) && !wv_set(h, "shift", wv_f64(g->shift)) &&
             !wv_set(h, "cfg", wv_f64(g->cfg)) && !wv_set(h, "sde", wv_bool(g->sde)) &&
             !wv_set(h, "eta", wv_f64(g->eta)) && !wv_set(h, "seed", wv_u64(g->seed)) &&
             !wv_set(h, "latent_shape", shape_val(g->latent_shape, 4)) &&
             !wv_set(h, "progress", wv_bool(g->progress)) &&
             !wv_set(h, "deadline_ms", wv_u64(g->deadline_ms));
    if (!ok) wv_free(&h);
    wire_tensor_t t[3];
    int n = 0;
    memset(t, 0, sizeof t);
    size_t nl = (size_t)(g->latent_shape[0] * g->latent_shape[1] * g->latent_shape[2] * g->latent_shape[3]);
    size_t nc = (size_t)(g->ctx_shape[0] * g->ctx_shape[1]);
    const float *src[3] = { g->context, g->uncond, g->latent };
    const char *names[3] = { "context", "uncond", "latent" };
    for (int i = 0; i < 3; i++) {
        if (!src[i]) continue;
        wire_tensor_t *x = &t[n++];
        snprintf(x->name, sizeof x->name, "%s", names[i]);
        x->dtype = KERN_F32;
        x->ndim = i == 2 ? 4 : 2;
        memcpy(x->shape, i == 2 ? g->latent_shape : g->ctx_shape, (size_t)x->ndim * sizeof(int64_t));
        x->data = src[i];
        x->bytes = (i == 2 ? nl : nc) * sizeof(float);
    }
    wire_msg_t m;
    int rc = call(c, id, h, t, n, timeout_ms, progress, user, &m, err);
    if (rc != 0) return rc;
    rc = -1;
    const wire_tensor_t *lat = wire_msg_tensor(&m, "latent");
    if (strcmp(m.type, "RESULT") || !lat || lat->dtype != KERN_F32 || lat->bytes != nl * sizeof(float)) {
        set_err(err, WIRE_E_MALFORMED, "unexpected answer %s (latent %s)", m.type, lat ? "of the wrong size" : "missing");
        goto done;
    }
    memcpy(out, lat->data, lat->bytes);
    if (res) {
        memset(res, 0, sizeof *res);
        const char *w = wv_get_str(m.hdr, "worker"), *kh = wv_get_str(m.hdr, "key_hash");
        snprintf(res->worker, sizeof res->worker, "%s", w ? w : "?");
        snprintf(res->key_hash, sizeof res->key_hash, "%s", kh ? kh : "");
        wv_get_u64(m.hdr, "version", &res->version);
        res->first_version = res->version;
        wv_get_u64(m.hdr, "first_version", &res->first_version);
        const wire_val_t *st = wv_get(m.hdr, "stats");
        int64_t v;
        if (wv_get_i64(st, "captured", &v)) res->captured = (int)v;
        if (wv_get_i64(st, "replayed", &v)) res->replayed = (int)v;
        if (wv_get_i64(st, "eager", &v)) res->eager = (int)v;
        wv_get_f64(st, "seconds", &res->seconds);
        const wire_val_t *d = wv_get(st, "declines");
        size_t off = 0;
        for (size_t i = 0; d && d->kind == WV_MAP && i < d->as.c.n; i++) {
            uint64_t cnt = 0;
            wv_as_u64(d->as.c.v[i], &cnt);
            int w2 = snprintf(res->declines + off, sizeof res->declines - off, "%s%s=%llu", off ? "," : "",
                              d->as.c.k[i], (unsigned long long)cnt);
            if (w2 < 0 || (size_t)w2 >= sizeof res->declines - off) break;
            off += (size_t)w2;
        }
    }
    rc = 0;
done:
    wire_msg_close(&m);
    return rc;
}

static void join_list(const wire_val_t *arr, char *out, size_t len, bool failed) {
    size_t off = 0;
    out[0] = 0;
    for (size_t i = 0; arr && i < wv_len(arr); i++) {
        const wire_val_t *v = wv_at(arr, i);
        char item[160];
        if (failed) {
            const char *w = wv_get_str(v, "worker"), *r = wv_get_str(v, "reason");
            snprintf(item, sizeof item, "%s:%s", w ? w : "?", r ? r : "?");
        } else {
            snprintf(item, sizeof item, "%s", v && v->kind == WV_STR ? v->as.str.s : "?");
        }
        int w2 = snprintf(out + off, len - off, "%s%s", off ? "," : "", item);
        if (w2 < 0 || (size_t)w2 >= len - off) break;
        off += (size_t)w2;
    }
}

int reel_sync(reel_client_t *c, const char *component, uint64_t version, const char *sha256,
              const char *path, uint64_t deadline_ms, reel_sync_result_t *res, int timeout_ms,
              wire_err_t *err) {
    uint64_t id = ++c->next_id;
    wire_val_t *h = wire_hdr("SYNC", id);
    if (h && (wv_set(h, "component", wv_str(component)) || wv_set(h, "version", wv_u64(version)) ||
              wv_set(h, "sha256", wv_str(sha256)) || wv_set(h, "path", wv_str(path)) ||
              wv_set(h, "deadline_ms", wv_u64(deadline_ms))))
        wv_free(&h);
    wire_msg_t m;
    int rc = call(c, id, h, NULL, 0, timeout_ms, NULL, NULL, &m, err);
    if (rc != 0) return rc;
    rc = -1;
    if (strcmp(m.type, "SYNC_DONE")) {
        set_err(err, WIRE_E_MALFORMED, "unexpected answer %s", m.type);
    } else {
        if (res) {
            res->complete = false;
            wv_get_bool(m.hdr, "complete", &res->complete);
            join_list(wv_get(m.hdr, "applied"), res->applied, sizeof res->applied, false);
            join_list(wv_get(m.hdr, "failed"), res->failed, sizeof res->failed, true);
        }
        rc = 0;
    }
    wire_msg_close(&m);
    return rc;
}

int reel_status(reel_client_t *c, wire_val_t **reply, int timeout_ms, wire_err_t *err) {
    uint64_t id = ++c->next_id;
    wire_msg_t m;
    int rc = call(c, id, wire_hdr("STATUS", id), NULL, 0, timeout_ms, NULL, NULL, &m, err);
    if (rc != 0) return rc;
    *reply = m.hdr;
    m.hdr = NULL;
    wire_msg_close(&m);
    return 0;
}
int reel_sha256_file(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return kern_fail("%s: %s", path, strerror(errno));
    if (sodium_init() < 0) {
        fclose(f);
        return kern_fail("libsodium failed to initialise");
    }
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) crypto_hash_sha256_update(&st, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) return kern_fail("%s: read error", path);
    unsigned char d[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&st, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return 0;
}
