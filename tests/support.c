/* support.c -- the Check suites' shared helpers (tests/support.h). */
#include "tests/support.h"
#include "base/error.h"
#include "kernels/backend.h"
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "model/tinydit.h"

int ts_run(Suite *s) {
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}

int ts_run_cuda(Suite *s, const char *name) {
    kern_backend_t *probe = kern_backend_cuda_new(0);
    if (!probe) {
        printf("%s: SKIP: %s\n", name, reel_err_text());
        srunner_free(srunner_create(s)); /* frees s */
        return 0;
    }
    kern_backend_destroy(&probe);
    SRunner *r = srunner_create(s);
    srunner_set_fork_status(r, CK_NOFORK);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}

char *ts_mkdtemp(char *buf, size_t len, const char *tag) {
    int n = snprintf(buf, len, "/tmp/reel-%s-XXXXXX", tag);
    if (n < 0 || (size_t)n >= len || !mkdtemp(buf)) {
        /* fixtures run outside a test too (unchecked ones): say why and stop */
        fprintf(stderr, "ts_mkdtemp(%s): %s\n", tag, strerror(errno ? errno : ENAMETOOLONG));
        abort();
    }
    return buf;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) && errno != ENOENT ? -1 : 0;
}

int ts_rmtree(const char *dir) {
    if (!dir || !dir[0]) return 0;
    struct stat st;
    if (lstat(dir, &st) && errno == ENOENT) return 0;
    /* depth first, never following a link */
    return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) ? -1 : 0;
}

const char *ts_join(const char *dir, const char *name) {
    static _Thread_local char bufs[8][512];
    static _Thread_local unsigned i;
    char *b = bufs[i++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

void ts_write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot write %s: %s", path, strerror(errno));
    ck_assert_msg(fwrite(p, 1, n, f) == n, "short write to %s", path);
    ck_assert_msg(fclose(f) == 0, "cannot close %s: %s", path, strerror(errno));
}

char *ts_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot read %s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    ck_assert_ptr_nonnull(b);
    for (size_t got; (got = fread(b + len, 1, cap - len - 1, f)) > 0;) {
        len += got;
        if (cap - len - 1 == 0) {
            b = realloc(b, cap *= 2);
            ck_assert_ptr_nonnull(b);
        }
    }
    ck_assert_msg(!ferror(f), "error reading %s", path);
    fclose(f);
    b[len] = '\0';
    if (n) *n = len;
    return b;
}

uint64_t ts_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ts_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(ts_splitmix64(&s) >> 11) * 0x1.0p-53;
        x[i] = (float)(lo + (hi - lo) * u);
    }
}

double ts_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) return NAN;
        if (d > m) m = d;
    }
    return m;
}

double ts_nmse(const float *ref, const float *x, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return num / den;
}

wire_tensor_t ts_wire_tensor(const char *name, kern_dtype_t dt, int ndim, const int64_t *shape, const void *data,
                             size_t bytes) {
    wire_tensor_t t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < ndim && i < WIRE_MAX_DIMS; i++) t.shape[i] = shape[i];
    t.data = data;
    t.bytes = bytes;
    return t;
}

void ts_tiny_weights(uint64_t seed, const char *path) {
    tdit_config_t c;
    ck_assert_int_eq(tdit_config_builtin("tiny", &c), 0);
    ck_assert_msg(tdit_weights_init(&c, seed, path) == 0, "tiny weights %s: %s", path, reel_err_text());
}

typedef struct {
    bool (*fn)(void *);
    void *arg;
    bool answer;
} other_t;

static void *other_main(void *p) {
    other_t *o = p;
    o->answer = o->fn(o->arg);
    return NULL;
}

bool ts_on_other_thread(bool (*fn)(void *), void *arg) {
    other_t o = { fn, arg, false };
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, other_main, &o), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    return o.answer;
}

void ts_weights_rewrite(const char *path, const char *out, const char *victim, int ndim, const int64_t *shape,
                        float poison) {
    st_file_t *in = st_open(path);
    ck_assert_ptr_nonnull(in);
    st_writer_t *w = st_writer_new();
    const char *keys[] = { "config", "dim", "heads", "layers", "ffn_dim", "in_channels", "text_dim", "freq_dim" };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (st_meta(in, keys[i])) ck_assert_int_eq(st_writer_meta(w, keys[i], st_meta(in, keys[i])), 0);
    float zeros[64] = { 0 };
    for (size_t i = 0; i < st_count(in); i++) {
        const st_tensor_t *t = st_at(in, i);
        if (strcmp(t->name, victim) != 0) {
            ck_assert_int_eq(st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data), 0);
        } else if (ndim > 0) {
            ck_assert_int_eq(st_writer_add_f32(w, t->name, ndim, shape, zeros), 0);
        } else if (ndim < 0) {
            ck_assert_int_eq(t->dtype, KERN_F32);
            float *d = malloc(t->nbytes);
            memcpy(d, t->data, t->nbytes);
            d[3] = poison;
            ck_assert_int_eq(st_writer_add_f32(w, t->name, t->ndim, t->shape, d), 0);
            free(d);
        }
    }
    ck_assert_int_eq(st_writer_save(w, out), 0);
    st_writer_destroy(&w);
    st_close(&in);
}
