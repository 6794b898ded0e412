/* error.h -- the one error value of the Reel libraries.
 *
 * Every fallible function returns 0 on success and -1 on failure (NULL for
 * constructors) and leaves one error value on its thread: a code (what
 * kind of failure, for the program to act on), a message (one line that
 * names what was wrong and which input; what a caller is answered with)
 * and a detail (errno's text, SQLite's or CUDA's message, for the log;
 * may be empty). The value stays until the next failure on the same
 * thread.
 *
 * It is converted in two places only: to a protocol error at the wire
 * (schema/msg.h: msg_err_from) and to an exit status in a program's main
 * (reel_exit_status). */
#ifndef REEL_BASE_ERROR_H
#define REEL_BASE_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    REEL_OK = 0,
    REEL_E_INVALID,      /* bad input: a malformed value, file, frame or message */
    REEL_E_NOT_FOUND,    /* an unknown id, name, key or a missing file */
    REEL_E_UNSUPPORTED,  /* well formed, but not what this build, backend or model does */
    REEL_E_STATE,        /* not now: busy, draining, closed, already done */
    REEL_E_LIMIT,        /* over a bound: a size, a count, a memory budget */
    REEL_E_IO,           /* the OS, a file, a socket, SQLite */
    REEL_E_DEVICE,       /* CUDA, cuBLAS, cuDNN */
    REEL_E_NOMEM,        /* an allocation failed */
    REEL_E_TIMEOUT,      /* a deadline passed */
    REEL_E_INTERNAL,     /* a bug: a broken invariant, an impossible state */
    REEL_E_COUNT
} reel_code_t;

#define REEL_ERR_MSG 512
#define REEL_ERR_DETAIL 512

typedef struct {
    reel_code_t code;            /* REEL_OK when nothing failed yet (or after a clear) */
    char msg[REEL_ERR_MSG];      /* what was wrong: a caller is answered with it */
    char detail[REEL_ERR_DETAIL];/* for the log; "" when none */
} reel_err_t;

/* Records code and the message (printf format), clears the detail,
 * and returns -1, so failing paths write `return reel_fail(...)`. */
int reel_fail(reel_code_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same with a detail for the log (detail may be NULL). */
int reel_fail_detail(reel_code_t code, const char *detail, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with strerror(errnum) as the detail; code REEL_E_NOMEM when
 * errnum is ENOMEM, else the given code. */
int reel_fail_errno(reel_code_t code, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Adds context in front of the message already recorded on this thread
 * ("loading W: " + message), keeping its code and detail; returns -1. */
int reel_fail_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* This thread's error value. Never NULL. */
const reel_err_t *reel_err(void);
/* Its code (REEL_OK when none). */
reel_code_t reel_err_code(void);
/* "msg" or "msg (detail)": the line for a log. Never NULL. */
const char *reel_err_text(void);
/* Clears this thread's error value. */
void reel_err_clear(void);
/* "invalid", "not_found", ...; "?" for an out-of-range value. */
const char *reel_code_name(reel_code_t code);
/* The exit status a program's main returns for a failure with this code:
 * 2 for what the caller can fix in their input (invalid, not_found,
 * unsupported, limit), 1 for everything else. */
int reel_exit_status(reel_code_t code);

#ifdef __cplusplus
}
#endif
#endif
