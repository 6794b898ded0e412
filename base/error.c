/* error.c -- the thread-local error value (base/error.h). */
#include "base/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local reel_err_t err;
static _Thread_local char err_text[REEL_ERR_MSG + REEL_ERR_DETAIL + 4];

static int record(reel_code_t code, const char *detail, const char *fmt, va_list ap) {
    /* the message may be built from the previous one (reel_fail_prefix,
     * or a caller passing reel_err()->msg): format into a copy first */
    char msg[REEL_ERR_MSG];
    vsnprintf(msg, sizeof msg, fmt, ap);
    char det[REEL_ERR_DETAIL];
    snprintf(det, sizeof det, "%s", detail ? detail : "");
    err.code = code > REEL_OK && code < REEL_E_COUNT ? code : REEL_E_INTERNAL;
    memcpy(err.msg, msg, sizeof msg);
    memcpy(err.detail, det, sizeof det);
    return -1;
}

int reel_fail(reel_code_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(code, NULL, fmt, ap);
    va_end(ap);
    return -1;
}

int reel_fail_detail(reel_code_t code, const char *detail, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(code, detail, fmt, ap);
    va_end(ap);
    return -1;
}

int reel_fail_errno(reel_code_t code, int errnum, const char *fmt, ...) {
    char buf[128];
    /* GNU strerror_r returns the text (maybe not in buf) */
    const char *s = strerror_r(errnum, buf, sizeof buf);
    va_list ap;
    va_start(ap, fmt);
    record(errnum == ENOMEM ? REEL_E_NOMEM : code, s, fmt, ap);
    va_end(ap);
    return -1;
}

int reel_fail_prefix(const char *fmt, ...) {
    char pre[REEL_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    /* pre, then as much of the old message as fits (cut, never overrun) */
    size_t n = strlen(pre), m = strlen(err.msg);
    if (n + m >= REEL_ERR_MSG) m = REEL_ERR_MSG - 1 - n;
    memmove(err.msg + n, err.msg, m);
    memcpy(err.msg, pre, n);
    err.msg[n + m] = '\0';
    if (err.code == REEL_OK) err.code = REEL_E_INTERNAL;
    return -1;
}

const reel_err_t *reel_err(void) { return &err; }

reel_code_t reel_err_code(void) { return err.code; }

const char *reel_err_text(void) {
    if (err.detail[0]) snprintf(err_text, sizeof err_text, "%s (%s)", err.msg, err.detail);
    else snprintf(err_text, sizeof err_text, "%s", err.msg);
    return err_text;
}

void reel_err_clear(void) {
    err.code = REEL_OK;
    err.msg[0] = '\0';
    err.detail[0] = '\0';
}

const char *reel_code_name(reel_code_t code) {
    static const char *const names[REEL_E_COUNT] = {
        [REEL_OK] = "ok",           [REEL_E_INVALID] = "invalid", [REEL_E_NOT_FOUND] = "not_found",
        [REEL_E_UNSUPPORTED] = "unsupported", [REEL_E_STATE] = "state", [REEL_E_LIMIT] = "limit",
        [REEL_E_IO] = "io",         [REEL_E_DEVICE] = "device",   [REEL_E_NOMEM] = "nomem",
        [REEL_E_TIMEOUT] = "timeout", [REEL_E_INTERNAL] = "internal",
    };
    return code >= 0 && code < REEL_E_COUNT ? names[code] : "?";
}

int reel_exit_status(reel_code_t code) {
    switch (code) {
    case REEL_OK: return 0;
    case REEL_E_INVALID:
    case REEL_E_NOT_FOUND:
    case REEL_E_UNSUPPORTED:
    case REEL_E_LIMIT: return 2;
    default: return 1;
    }
}
