/* brk_log.c -- one whole line per event on stderr (see brk_log.h). */
#include "broker/brk_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void brk_log(const char *fmt, ...) {
    char line[1024];
    int n = snprintf(line, sizeof line, "reel-broker: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    fwrite(line, 1, len, stderr); /* one call: stdio locks the stream around it */
}
