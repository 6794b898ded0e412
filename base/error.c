/* error.c -- thread-local last-error buffer (see error.h). */
#include "error.h"
#include <stdarg.h>
#include <stdio.h>

static _Thread_local char err_buf[512];

int kern_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return -1;
}

const char *kern_error(void) { return err_buf; }

void kern_error_clear(void) { err_buf[0] = '\0'; }
