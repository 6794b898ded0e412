/* wire_types.c -- the leaves of the codec: the wire's dtypes (a kernel
 * dtype, or U8 for raw bytes) and the error a bad message is answered
 * with. The reader (wire_tok.c), the writer (wire_buf.c), the transport
 * (wire.c) and the messages (msg*.c) all use them; this file calls none of
 * them back, so their call graph has no circle. */
#include "schema/wire_codec.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void wire_set_err(wire_err_t *err, const char *code, const char *fmt, ...) {
    if (!err) return;
    snprintf(err->code, sizeof err->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

size_t wire_dtype_size(kern_dtype_t dt) { return dt == WIRE_U8 ? 1 : kern_dtype_size(dt); }
const char *wire_dtype_name(kern_dtype_t dt) { return dt == WIRE_U8 ? "U8" : kern_dtype_name(dt); }
int wire_dtype_parse(const char *name, kern_dtype_t *out) {
    if (!strcmp(name, "U8")) {
        *out = WIRE_U8;
        return 0;
    }
    return kern_dtype_parse(name, out);
}

const char *wire_err_code_of(reel_code_t code) {
    switch (code) {
    case REEL_E_INVALID:
    case REEL_E_NOT_FOUND:
    case REEL_E_UNSUPPORTED: return WIRE_E_BAD_REQUEST;
    case REEL_E_LIMIT: return WIRE_E_TOO_LARGE;
    case REEL_E_STATE: return WIRE_E_BUSY;
    case REEL_E_TIMEOUT: return WIRE_E_TIMEOUT;
    default: return WIRE_E_INTERNAL;
    }
}

void wire_err_from(wire_err_t *e, const reel_err_t *r, const char *what) {
    snprintf(e->code, sizeof e->code, "%s", wire_err_code_of(r->code));
    /* what, then as much of the message as fits */
    size_t cap = sizeof e->message - 1, n = strnlen(what ? what : "", cap);
    memcpy(e->message, what ? what : "", n);
    size_t m = strnlen(r->msg, cap - n);
    memcpy(e->message + n, r->msg, m);
    e->message[n + m] = '\0';
}
