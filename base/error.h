/* error.h -- the one error path of the Reel libraries.
 *
 * Every fallible function returns 0 on success and -1 on failure (or NULL for
 * constructors) and leaves a human-readable message in a thread-local buffer
 * that kern_error() returns until the next failure on the same thread. */
#ifndef REEL_BASE_ERROR_H
#define REEL_BASE_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* Records a message (printf format) and returns -1, so failing paths can
 * write `return kern_fail("...")`. */
int kern_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last message recorded on this thread ("" if none). Never NULL. */
const char *kern_error(void);
/* Clears the message. */
void kern_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif
