/* brk_msg.c -- small helpers the handlers share: clocks, identities,
 * sends to an identity, and headers copied from one message into the next
 * (a REQUEST from a GEN, a RESULT to the client from the worker's). */
#include "broker/brk_broker.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int64_t brk_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void brk_ident_from(brk_ident_t *id, const zmq_msg_t *msg) {
    zmq_msg_t *m = (zmq_msg_t *)msg; /* zmq's getters are not const */
    size_t n = zmq_msg_size(m);
    id->n = n < sizeof id->b ? n : sizeof id->b; /* ZeroMQ identities are <= 255 bytes */
    memcpy(id->b, zmq_msg_data(m), id->n);
}

int brk_send_to(void *sock, const brk_ident_t *to, const wire_val_t *hdr, const wire_tensor_t *t,
                int n) {
    zmq_msg_t id;
    if (zmq_msg_init_size(&id, to->n) < 0) return -1;
    memcpy(zmq_msg_data(&id), to->b, to->n);
    int rc = wire_send(sock, &id, hdr, t, n);
    int e = errno;
    zmq_msg_close(&id);
    errno = e;
    return rc;
}

int brk_forward_to(void *sock, const brk_ident_t *to, const wire_val_t *hdr, wire_msg_t *src) {
    zmq_msg_t id;
    if (zmq_msg_init_size(&id, to->n) < 0) return -1;
    memcpy(zmq_msg_data(&id), to->b, to->n);
    int rc = wire_forward(sock, &id, hdr, src);
    int e = errno;
    zmq_msg_close(&id);
    errno = e;
    return rc;
}

int brk_send_error_to(void *sock, const brk_ident_t *to, uint64_t id, const char *code,
                      const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    zmq_msg_t ident;
    if (zmq_msg_init_size(&ident, to->n) < 0) return -1;
    memcpy(zmq_msg_data(&ident), to->b, to->n);
    int rc = wire_send_error(sock, &ident, id, code, "%s", text);
    int e = errno;
    zmq_msg_close(&ident);
    errno = e;
    return rc;
}

wire_val_t *brk_wv_clone(const wire_val_t *v) {
    if (!v) return NULL;
    switch (v->kind) {
    case WV_NIL: {
        wire_val_t *n = wv_map(); /* no public nil constructor: retag an empty map */
        if (n) n->kind = WV_NIL;
        return n;
    }
    case WV_BOOL: return wv_bool(v->as.b);
    case WV_INT: return wv_i64(v->as.i);
    case WV_UINT: return wv_u64(v->as.u);
    case WV_F64: return wv_f64(v->as.f);
    case WV_STR: return wv_str(v->as.str.s); /* strings with NULs are cut there */
    case WV_ARR: {
        wire_val_t *a = wv_arr();
        for (size_t i = 0; a && i < v->as.c.n; i++)
            if (wv_push(a, brk_wv_clone(v->as.c.v[i])) < 0) wv_free(&a);
        return a;
    }
    case WV_MAP: {
        wire_val_t *m = wv_map();
        for (size_t i = 0; m && i < v->as.c.n; i++)
            if (wv_set(m, v->as.c.k[i], brk_wv_clone(v->as.c.v[i])) < 0) wv_free(&m);
        return m;
    }
    }
    return NULL;
}

wire_val_t *brk_hdr_from(const wire_val_t *src, const char *type, uint64_t id) {
    wire_val_t *h = wire_hdr(type, id);
    if (!h || !src || src->kind != WV_MAP) return h;
    for (size_t i = 0; i < src->as.c.n; i++) {
        const char *k = src->as.c.k[i];
        if (!strcmp(k, "proto") || !strcmp(k, "type") || !strcmp(k, "id") || !strcmp(k, "tensors"))
            continue;
        if (wv_set(h, k, brk_wv_clone(src->as.c.v[i])) < 0) {
            wv_free(&h);
            return NULL;
        }
    }
    return h;
}

char *brk_hex(uint64_t h, char buf[17]) {
    snprintf(buf, 17, "%016llx", (unsigned long long)h);
    return buf;
}
