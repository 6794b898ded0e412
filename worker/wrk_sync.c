/* wrk_sync.c -- weight syncs (see wrk_sync.h). The slow parts (reading and
 * hashing the weights) run on the sync thread before the step lock is
 * taken, so the main thread keeps heartbeating and streams keep stepping
 * until the copy itself. */
#include "worker/wrk_sync.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>
#include <unistd.h>
#include "kernels/error.h"
#include "worker/model/tdit_program.h"
#include "worker/wrk_pipe.h"

/* ---- sha256 --------------------------------------------------------------- */

static void to_hex(const unsigned char d[crypto_hash_sha256_BYTES], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < crypto_hash_sha256_BYTES; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = 0;
}

/* sodium_init is idempotent and thread-safe; sha256 needs nothing it could
 * fail to set up (no randomness), so its result only picks implementations. */
static void sodium_ready(void) {
    int r = sodium_init();
    (void)r;
}

void wrk_sha256_hex(const void *buf, size_t n, char hex[65]) {
    unsigned char d[crypto_hash_sha256_BYTES];
    sodium_ready();
    crypto_hash_sha256(d, buf, n);
    to_hex(d, hex);
}

int wrk_sha256_fd(int fd, char hex[65]) {
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) return kern_fail("out of memory");
    sodium_ready();
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    for (;;) {
        ssize_t n = read(fd, buf, CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            return kern_fail("read: %s", strerror(e));
        }
        if (n == 0) break;
        crypto_hash_sha256_update(&st, buf, (unsigned long long)n);
    }
    free(buf);
    unsigned char d[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&st, d);
    to_hex(d, hex);
    return 0;
}

bool wrk_sha256_valid(const char *s) {
    if (!s || strlen(s) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    return true;
}

/* ---- reading the weights a SYNC carries ----------------------------------- */

static int say(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* Hashes and opens path through one descriptor, so the bytes hashed are
 * the bytes loaded even if the path is replaced meanwhile. */
static st_file_t *open_path(const char *path, char hex[65], char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        say(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    st_file_t *f = NULL;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    if (wrk_sha256_fd(fd, hex) != 0) say(err, errlen, "%s: %s", path, kern_error());
    else if (!(f = st_open(proc))) say(err, errlen, "%s: %s", path, kern_error());
    close(fd);
    return f;
}

/* Writes the inline tensors (with cfg as metadata, which tdit_model_reload
 * needs) to a private temporary file and opens it. */
static st_file_t *open_inline(const wire_msg_t *m, const tdit_config_t *cfg, char hex[65], char *err,
                              size_t errlen) {
    sodium_ready();
    crypto_hash_sha256_state hs;
    crypto_hash_sha256_init(&hs);
    for (int i = 0; i < m->n_tensors; i++)
        crypto_hash_sha256_update(&hs, m->t[i].data, (unsigned long long)m->t[i].bytes);
    unsigned char d[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&hs, d);
    to_hex(d, hex);

    st_file_t *f = NULL;
    st_writer_t *w = st_writer_new();
    char dir[] = "/tmp/reel-worker-sync-XXXXXX", path[sizeof dir + 32];
    bool have_dir = false;
    if (!w) { say(err, errlen, "%s", kern_error()); goto out; }
    for (int i = 0; i < m->n_tensors; i++)
        if (st_writer_add(w, m->t[i].name, m->t[i].dtype, m->t[i].ndim, m->t[i].shape, m->t[i].data) != 0) {
            say(err, errlen, "%s", kern_error());
            goto out;
        }
    char v[32];
    const struct { const char *k; int64_t v; } meta[] = {
        { "dim", cfg->dim }, { "heads", cfg->heads }, { "layers", cfg->layers },
        { "ffn_dim", cfg->ffn_dim }, { "in_channels", cfg->in_channels },
        { "text_dim", cfg->text_dim }, { "freq_dim", cfg->freq_dim },
    };
    int rc = st_writer_meta(w, "config", cfg->name);
    for (size_t i = 0; rc == 0 && i < sizeof meta / sizeof meta[0]; i++) {
        snprintf(v, sizeof v, "%" PRId64, meta[i].v);
        rc = st_writer_meta(w, meta[i].k, v);
    }
    if (rc != 0) { say(err, errlen, "%s", kern_error()); goto out; }
    if (!mkdtemp(dir)) { say(err, errlen, "cannot create a temporary directory: %s", strerror(errno)); goto out; }
    have_dir = true;
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    if (st_writer_save(w, path) != 0 || !(f = st_open(path))) say(err, errlen, "inline weights: %s", kern_error());
    unlink(path);
out:
    if (have_dir) rmdir(dir);
    st_writer_destroy(&w);
    return f;
}

int wrk_sync_read(const wire_msg_t *m, const tdit_config_t *cfg, st_file_t **out, char hex[65], char *err,
                  size_t errlen) {
    *out = NULL;
    const char *component = wv_get_str(m->hdr, "component");
    const char *sha = wv_get_str(m->hdr, "sha256");
    const char *path = wv_get_str(m->hdr, "path");
    uint64_t version;
    if (!component) return say(err, errlen, "missing 'component'");
    if (strcmp(component, TDIT_COMPONENT) != 0)
        return say(err, errlen, "unknown component '%.64s' (this worker has '%s')", component, TDIT_COMPONENT);
    if (!wv_get_u64(m->hdr, "version", &version)) return say(err, errlen, "missing or bad 'version'");
    if (!wrk_sha256_valid(sha)) return say(err, errlen, "'sha256' must be 64 hex digits");
    if (path && m->n_tensors > 0) return say(err, errlen, "both 'path' and inline tensors given");
    if (!path && m->n_tensors == 0) return say(err, errlen, "neither 'path' nor inline tensors given");
    *out = path ? open_path(path, hex, err, errlen) : open_inline(m, cfg, hex, err, errlen);
    return *out ? 0 : -1;
}

/* ---- the sync thread ------------------------------------------------------- */

typedef struct node {
    wire_msg_t *m;
    struct node *next;
} node_t;

struct wrk_syncer {
    wrk_t *w;
    pthread_t th;
    bool started;
    void *push;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    node_t *head, *tail;
    bool quit;
    char applied_sha[65];        /* of the applied version; "" when unknown */
};

static void free_msg(wire_msg_t **mp) {
    if (!*mp) return;
    wire_msg_close(*mp);
    free(*mp);
    *mp = NULL;
}

static void ack(wrk_syncer_t *s, const wire_msg_t *m, uint64_t version, const char *error) {
    wire_val_t *h = wire_hdr("SYNC_ACK", m->id);
    int rc = !h;
    rc = rc || wv_set(h, "component", wv_str(TDIT_COMPONENT));
    rc = rc || wv_set(h, "version", wv_u64(version));
    rc = rc || wv_set(h, "ok", wv_bool(error == NULL));
    if (error) rc = rc || wv_set(h, "error", wv_str(error));
    /* Epoch 0: an ack is about the worker's state, not a broker session. */
    if (rc || wrk_pipe_send(s->push, 0, h, NULL, 0) != 0)
        wrk_log(s->w, "cannot queue SYNC_ACK of v%" PRIu64, version);
    wv_free(&h);
}

static void process(wrk_syncer_t *s, const wire_msg_t *m) {
    wrk_t *w = s->w;
    char err[512], hex[65];
    uint64_t version = 0;
    (void)wv_get_u64(m->hdr, "version", &version);
    uint64_t applied = atomic_load(&w->applied_version);
    const char *want = wv_get_str(m->hdr, "sha256");
    if (wv_get(m->hdr, "version") && version < applied) {
        wrk_log(w, "sync to v%" PRIu64 " refused: stale (applied v%" PRIu64 ")", version, applied);
        ack(s, m, version, "stale");
        return;
    }
    st_file_t *f = NULL;
    if (wrk_sync_read(m, tdit_model_config(w->model), &f, hex, err, sizeof err) != 0) {
        wrk_log(w, "sync to v%" PRIu64 " refused: %s", version, err);
        ack(s, m, version, err);
        return;
    }
    if (strcasecmp(hex, want) != 0) {
        wrk_log(w, "sync to v%" PRIu64 " refused: sha256 mismatch (got %s, expected %s)", version, hex, want);
        ack(s, m, version, "sha256 mismatch");
    } else if (version == applied) {
        /* A repeated SYNC (e.g. resent after a reconnect) is applied already. */
        bool same = s->applied_sha[0] && !strcasecmp(s->applied_sha, hex);
        if (!same) wrk_log(w, "sync to v%" PRIu64 " refused: stale (v%" PRIu64 " applied with other weights)", version, applied);
        ack(s, m, version, same ? NULL : "stale");
    } else {
        const char *fail = NULL;
        if (w->opt->sync_drain) {
            /* Every request runs on one version: hold new requests and let
             * the ones mid-way finish on the old weights first. */
            atomic_store(&w->draining, true);
            int n = atomic_load(&w->running);
            if (n) wrk_log(w, "draining %d request(s) before applying v%" PRIu64, n, version);
            while (atomic_load(&w->running) > 0 && !atomic_load(&w->stop)) {
                struct timespec ts = { 0, 5 * 1000 * 1000 };
                nanosleep(&ts, NULL);
            }
        }
        pthread_rwlock_wrlock(&w->step_lock);
        if (tdit_model_reload(w->model, f) != 0) {
            snprintf(err, sizeof err, "%s", kern_error());
            fail = err;
            if (strstr(err, "part-way")) atomic_store(&w->fatal, true);
        } else if (cap_component_update(w->cache, TDIT_COMPONENT, tdit_model_weights(w->model),
                                        tdit_model_bytes(w->model), version) < 0) {
            /* New weights under the old version's graphs and keys: unusable. */
            snprintf(err, sizeof err, "%s", kern_error());
            fail = err;
            atomic_store(&w->fatal, true);
        } else {
            atomic_store(&w->applied_version, version);
        }
        pthread_rwlock_unlock(&w->step_lock);
        atomic_store(&w->draining, false);
        if (fail) {
            wrk_log(w, "sync to v%" PRIu64 " failed: %s%s", version, fail,
                    atomic_load(&w->fatal) ? " (weights unusable: exiting)" : "");
        } else {
            snprintf(s->applied_sha, sizeof s->applied_sha, "%s", hex);
            wrk_log(w, "applied %s v%" PRIu64 " (%s)", TDIT_COMPONENT, version, cap_policy_name(w->opt->policy));
        }
        ack(s, m, version, fail);
    }
    st_close(&f);
}

static void *sync_main(void *arg) {
    wrk_syncer_t *s = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->quit && !s->head) pthread_cond_wait(&s->cv, &s->mu);
        node_t *n = s->quit ? NULL : s->head;
        if (n) {
            s->head = n->next;
            if (!s->head) s->tail = NULL;
        }
        pthread_mutex_unlock(&s->mu);
        if (!n) break;
        process(s, n->m);
        free_msg(&n->m);
        free(n);
    }
    return NULL;
}

wrk_syncer_t *wrk_syncer_new(wrk_t *w, const char initial_sha[65]) {
    wrk_syncer_t *s = calloc(1, sizeof *s);
    if (!s) { kern_fail("out of memory"); return NULL; }
    s->w = w;
    if (initial_sha) snprintf(s->applied_sha, sizeof s->applied_sha, "%s", initial_sha);
    if (pthread_mutex_init(&s->mu, NULL) || pthread_cond_init(&s->cv, NULL)) {
        free(s);
        kern_fail("cannot create the sync lock");
        return NULL;
    }
    if (!(s->push = wrk_pipe_push_new(w->zctx))) {
        kern_fail("sync pipe: %s", zmq_strerror(errno));
        goto err;
    }
    int e = pthread_create(&s->th, NULL, sync_main, s);
    if (e) {
        kern_fail("cannot start the sync thread: %s", strerror(e));
        goto err;
    }
    s->started = true;
    return s;
err:
    wrk_syncer_destroy(&s);
    return NULL;
}

void wrk_syncer_submit(wrk_syncer_t *s, wire_msg_t *m) {
    node_t *n = malloc(sizeof *n);
    if (!n) {
        /* Not acked: the broker's deadline reports it. */
        wrk_log(s->w, "out of memory queueing a SYNC; dropped");
        free_msg(&m);
        return;
    }
    n->m = m;
    n->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = n;
    else s->head = n;
    s->tail = n;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void wrk_syncer_destroy(wrk_syncer_t **sp) {
    if (!sp || !*sp) return;
    wrk_syncer_t *s = *sp;
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->th, NULL);
    for (node_t *n = s->head, *next; n; n = next) {
        next = n->next;
        free_msg(&n->m);
        free(n);
    }
    if (s->push) zmq_close(s->push);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    *sp = NULL;
}
