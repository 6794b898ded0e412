/* wrk_weights.c -- weights files a peer named, read safely (see
 * wrk_weights.h). */
#include "worker/wrk_weights.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/sha256.h"
#include "model/wan_ckpt.h"

int wrk_refuse(reel_code_t code, const char *answer, const char *fmt, ...) {
    char detail[REEL_ERR_DETAIL];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return reel_fail_detail(code, detail, "%s", answer);
}

int wrk_weights_refused(void) {
    reel_code_t c = reel_err_code();
    const char *answer = c == REEL_E_STATE ? WRK_E_STOPPED : c == REEL_E_UNSUPPORTED ? WRK_E_MODEL : WRK_E_FILE;
    return reel_fail_detail(c, reel_err_text(), "%s", answer);
}

/* What a file that cannot be opened with errno e is: missing, refused (a
 * symlink met with O_NOFOLLOW), or unreadable. */
static reel_code_t errno_code(int e) {
    return e == ENOENT ? REEL_E_NOT_FOUND : e == ELOOP || e == ENOTDIR ? REEL_E_INVALID : e == ENOMEM ? REEL_E_NOMEM
                                                                                                      : REEL_E_IO;
}

/* ---- roots -------------------------------------------------------------------- */

int wrk_roots_add(wrk_roots_t *r, const char *dir) {
    if (r->n >= WRK_MAX_ROOTS) return reel_fail(REEL_E_LIMIT, "more than %d weights directories", WRK_MAX_ROOTS);
    if (strlen(dir) >= PATH_MAX) return reel_fail(REEL_E_LIMIT, "weights directory %.64s...: path too long", dir);
    char real[PATH_MAX];
    struct stat sb;
    if (!realpath(dir, real)) return reel_fail(REEL_E_IO, "weights directory %s: %s", dir, strerror(errno));
    if (stat(real, &sb) != 0 || !S_ISDIR(sb.st_mode)) return reel_fail(REEL_E_INVALID, "weights directory %s: not a directory", dir);
    snprintf(r->given[r->n], PATH_MAX, "%s", dir);
    /* "/srv/w/" names the same root as "/srv/w" */
    for (size_t n = strlen(r->given[r->n]); n > 1 && r->given[r->n][n - 1] == '/'; n--) r->given[r->n][n - 1] = '\0';
    snprintf(r->real[r->n], PATH_MAX, "%s", real);
    r->n++;
    return 0;
}

int wrk_roots_add_dir_of(wrk_roots_t *r, const char *file) {
    char real[PATH_MAX];
    if (!realpath(file, real)) return reel_fail(REEL_E_IO, "%s: %s", file, strerror(errno));
    char *slash = strrchr(real, '/');
    if (slash == real) slash[1] = '\0'; /* a file in / */
    else if (slash) *slash = '\0';
    return wrk_roots_add(r, real);
}

/* ---- opening under a root --------------------------------------------------------- */

/* The part of path below root (NULL when path is not under it). */
static const char *below(const char *path, const char *root) {
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/') return path + 1;
    if (strncmp(path, root, n) || path[n] != '/') return NULL;
    return path + n + 1;
}

/* True when rel is one or more plain components ("a/b.safetensors"): no
 * empty one, no "." and no "..", nothing after a trailing '/'. */
static bool plain_relative(const char *rel) {
    if (!*rel) return false;
    for (const char *c = rel;;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.') || n > NAME_MAX) return false;
        if (!e) return true;
        c = e + 1;
    }
}

int wrk_weights_open_dir(const wrk_roots_t *r, const char *path, const char **last) {
    const char *rel = NULL;
    int root = -1;
    if (!path || path[0] != '/')
        return wrk_refuse(REEL_E_INVALID, WRK_E_PATH, "%s: not an absolute path", path ? path : "(none)");
    if (strlen(path) >= PATH_MAX)
        return wrk_refuse(REEL_E_LIMIT, WRK_E_PATH, "path of %zu bytes: too long", strlen(path));
    for (int i = 0; i < r->n && !rel; i++) {
        root = i;
        if (!(rel = below(path, r->real[i]))) rel = below(path, r->given[i]);
    }
    if (!rel) return wrk_refuse(REEL_E_INVALID, WRK_E_PATH, "%s: not under any weights directory", path);
    if (!plain_relative(rel))
        return wrk_refuse(REEL_E_INVALID, WRK_E_PATH, "%s: an empty, '.' or '..' component below %s", path,
                          r->real[root]);

    char comp[NAME_MAX + 1];
    int dir = open(r->real[root], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return wrk_refuse(errno_code(errno), WRK_E_FILE, "%s: %s", r->real[root], strerror(errno));
    for (const char *c = rel;;) {
        const char *e = strchr(c, '/');
        if (!e) {
            *last = c;
            return dir;
        }
        size_t n = (size_t)(e - c);
        memcpy(comp, c, n);
        comp[n] = '\0';
        /* O_NOFOLLOW on every component: a symlink anywhere is ELOOP (or
         * ENOTDIR), never followed. */
        int next = openat(dir, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        close(dir);
        if (next < 0)
            return wrk_refuse(errno_code(err), WRK_E_FILE, "%s: %s at '%s'%s", path, strerror(err), comp,
                              err == ELOOP || err == ENOTDIR ? " (symlinks are not followed)" : "");
        dir = next;
        c = e + 1;
    }
}

int wrk_weights_open(const wrk_roots_t *r, const char *path) {
    const char *last;
    int dir = wrk_weights_open_dir(r, path, &last);
    if (dir < 0) return -1;
    /* The last one opens without blocking (a FIFO does not wait). */
    int fd = openat(dir, last, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    int err = errno;
    close(dir);
    if (fd < 0)
        return wrk_refuse(errno_code(err), WRK_E_FILE, "%s: %s at '%s'%s", path, strerror(err), last,
                          err == ELOOP || err == ENOTDIR ? " (symlinks are not followed)" : "");
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return wrk_refuse(REEL_E_INVALID, WRK_E_FILE, "%s: not a regular file", path);
    }
    return fd;
}

st_file_t *wrk_weights_load(const wrk_roots_t *r, const char *path, const tdit_config_t *expect, uint64_t max_data,
                            const atomic_bool *stop, char hex[65]) {
    wan_opts_t o = { .nofollow = r != NULL, .expect = expect, .max_data = max_data, .stop = stop };
    wan_ckpt_t *c = NULL;
    if (!r) {
        c = wan_ckpt_open(path, &o);
    } else {
        const char *last;
        int dir = wrk_weights_open_dir(r, path, &last);
        if (dir < 0) return NULL;
        c = wan_ckpt_openat(dir, last, path, &o);
        close(dir);
    }
    if (!c) {
        wrk_weights_refused();
        return NULL;
    }
    snprintf(hex, 65, "%s", wan_ckpt_identity(c));
    st_file_t *f = wan_ckpt_take(c);
    wan_ckpt_destroy(&c);
    return f;
}

int wrk_weights_finite(const st_file_t *f) {
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        const size_t n = t->nbytes / kern_dtype_size(t->dtype);
        if (kern_all_below(t->data, n, t->dtype, WRK_WEIGHT_EXP)) continue; /* one pass: finite and small */
        if (!kern_all_finite(t->data, n, t->dtype)) /* which of the two, for the answer */
            return wrk_refuse(REEL_E_INVALID, WRK_E_NONFINITE, "tensor %s holds NaN or infinite values", t->name);
        return wrk_refuse(REEL_E_INVALID, WRK_E_DIVERGED,
                              "tensor %s holds values of magnitude 2^%d (1.7e7) or more: a diverged trainer's "
                              "weights, which every step would overflow", t->name, WRK_WEIGHT_EXP);
    }
    return 0;
}

/* ---- reading ------------------------------------------------------------------------ */

static st_file_t *read_judged(int fd, const char *path, uint64_t max_data, bool whole_model, const atomic_bool *stop,
                              char hex[65]);

st_file_t *wrk_weights_read(int fd, const char *path, uint64_t max_data, const atomic_bool *stop, char hex[65]) {
    return read_judged(fd, path, max_data, true, stop, hex);
}

st_file_t *wrk_adapter_read(int fd, const char *path, uint64_t max_data, const atomic_bool *stop, char hex[65]) {
    return read_judged(fd, path, max_data, false, stop, hex);
}

static st_file_t *read_judged(int fd, const char *path, uint64_t max_data, bool whole_model, const atomic_bool *stop,
                              char hex[65]) {
    st_probe_t p;
    if (st_probe_fd(fd, path, &p) != 0) {
        wrk_refuse(reel_err_code(), WRK_E_FILE, "%s", reel_err_text());
        return NULL;
    }
    /* Before a byte of data is read: a file larger than the model could
     * be (or a sparse 50 GiB one) is refused now, not after a minute of
     * hashing; one whose tensors cannot hold the model, too. */
    if (max_data && p.data_len > max_data) {
        wrk_refuse(REEL_E_UNSUPPORTED, WRK_E_MODEL, "%s: %llu data bytes, more than the model's %llu", path,
                   (unsigned long long)p.data_len, (unsigned long long)max_data);
        return NULL;
    }
    if (max_data && whole_model && p.bytes < max_data / 2) {
        wrk_refuse(REEL_E_UNSUPPORTED, WRK_E_MODEL,
                   "%s: %zu tensors of %llu bytes cannot hold the model (%llu bytes in F32)",
                   path, p.count, (unsigned long long)p.bytes, (unsigned long long)max_data);
        return NULL;
    }
    reel_sha256_hook_t k = { reel_sha256_new(), stop, false };
    if (!k.h) {
        wrk_refuse(REEL_E_NOMEM, WRK_E_FILE, "out of memory");
        return NULL;
    }
    st_file_t *f = st_open_fd(fd, path, reel_sha256_hook, &k);
    if (!f) {
        if (k.stopped)
            wrk_refuse(REEL_E_STATE, WRK_E_STOPPED, "%s", reel_err_text());
        else
            wrk_refuse(reel_err_code(), WRK_E_FILE, "%s", reel_err_text());
        reel_sha256_free(&k.h);
        return NULL;
    }
    reel_sha256_final(&k.h, hex);
    return f;
}
