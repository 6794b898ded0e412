/* ctl_common.c -- the helpers every reelctl subcommand uses (ctl.h):
 * messages and exit codes, number and size parsing, reading an input
 * tensor, the clock and the terminal test. It calls no subcommand, so the
 * cmd_*.c files and reelctl.c's dispatch never call one another in a
 * circle. */
#include "ctl.h"
#include "base/error.h"
#include "schema/msg.h"
#include "model/safetensors.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int ctl_die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("reelctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int ctl_parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (!*s || *s == '-') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int ctl_parse_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !*s || *end || v < -2147483647L || v > 2147483647L) return -1;
    *out = (int)v;
    return 0;
}

int ctl_parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !*s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

bool ctl_tty(void) { return isatty(2); }

double ctl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ctl_parse_size(const char *s, int64_t out[3]) {
    long long f, h, w;
    char tail;
    if (sscanf(s, "%lldx%lldx%lld%c", &f, &h, &w, &tail) != 3 || f <= 0 || h <= 0 || w <= 0) return -1;
    /* what a GEN may carry (docs/PROTOCOL.md): never a 64 GiB allocation here */
    if (f > MSG_MAX_DIM || h > MSG_MAX_DIM || w > MSG_MAX_DIM || f * h * w > MSG_MAX_FHW) return -1;
    out[0] = f;
    out[1] = h;
    out[2] = w;
    return 0;
}

/* Reads tensor `name` of `path` as F32 of rank ndim; shape out; NULL (and
 * a message, exit code 2) on any problem. */
float *ctl_read_tensor(const char *path, const char *name, int ndim, int64_t *shape) {
    st_file_t *f = st_open(path);
    if (!f) { ctl_die(CTL_USAGE, "%s", kern_error()); return NULL; }
    const st_tensor_t *t = st_find(f, name);
    float *buf = NULL;
    if (!t) ctl_die(CTL_USAGE, "%s: no tensor named '%s'", path, name);
    else if (t->ndim != ndim) ctl_die(CTL_USAGE, "%s: tensor '%s' has %d dimensions, expected %d", path, name, t->ndim, ndim);
    else {
        int64_t n = 1;
        for (int i = 0; i < ndim; i++) { shape[i] = t->shape[i]; n *= t->shape[i]; }
        buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
        if (!buf || st_read_f32(f, name, ndim, shape, buf) != 0) {
            ctl_die(CTL_USAGE, "%s: %s", path, buf ? kern_error() : "out of memory");
            free(buf);
            buf = NULL;
        } else if (!kern_all_finite(buf, (size_t)n, KERN_F32)) { /* a model input: as a worker judges it */
            ctl_die(CTL_USAGE, "%s: tensor '%s' holds NaN or infinite values", path, name);
            free(buf);
            buf = NULL;
        }
    }
    st_close(&f);
    return buf;
}
