/* wrk_sync.c -- weight syncs (see wrk_sync.h). The slow parts (reading and
 * hashing the weights) run on the sync thread before the step lock is
 * taken, so the main thread keeps heartbeating and streams keep stepping
 * until the copy itself. A path is read under the weights roots only,
 * and what goes back in the ack is generic (wrk_weights.h). */
#include "worker/wrk_sync.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>
#include <unistd.h>
#include "base/error.h"
#include "base/sha256.h"
#include "model/tdit_program.h"
#include "model/wan_ckpt.h"
#include "worker/wrk_pipe.h"
#include "worker/wrk_weights.h"

/* ---- reading the weights a SYNC carries ----------------------------------- */

static int say(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* Reads the checkpoint a peer named (a file, an index or a folder), under
 * the weights roots, judged against the running model and by its size
 * first, each file read once and hashed as it is read (wrk_weights.h). */
static st_file_t *open_path(const char *path, const tdit_config_t *cfg, const wrk_roots_t *roots,
                            const atomic_bool *stop, char hex[65], char *wire, size_t wlen, char *err,
                            size_t errlen) {
    const char *code = WRK_E_FILE;
    /* Every parameter in F32: the most a file of this model holds. */
    uint64_t max_data = cfg ? (uint64_t)tdit_config_params(cfg) * sizeof(float) : 0;
    st_file_t *f = wrk_weights_load(roots, path, cfg, max_data, stop, hex, &code, err, errlen);
    if (!f) snprintf(wire, wlen, "%s", code);
    return f;
}

/* Writes the inline tensors (with cfg as metadata, which tdit_model_reload
 * needs) to a private temporary file and opens it. */
static st_file_t *open_inline(const msg_sync_t *m, const tdit_config_t *cfg, char hex[65], char *err,
                              size_t errlen) {
    const void *part[WIRE_MAX_TENSORS];
    size_t len[WIRE_MAX_TENSORS];
    for (int i = 0; i < m->n_tensors; i++) {
        part[i] = m->tensors[i]->data;
        len[i] = m->tensors[i]->bytes;
    }
    reel_sha256_parts(part, len, m->n_tensors, hex);

    st_file_t *f = NULL;
    st_writer_t *w = st_writer_new();
    char dir[] = "/tmp/reel-worker-sync-XXXXXX", path[sizeof dir + 32];
    bool have_dir = false;
    if (!w) { say(err, errlen, "%s", kern_error()); goto out; }
    for (int i = 0; i < m->n_tensors; i++)
        if (st_writer_add(w, m->tensors[i]->name, m->tensors[i]->dtype, m->tensors[i]->ndim, m->tensors[i]->shape,
                          m->tensors[i]->data) != 0) {
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

int wrk_sync_read(const msg_sync_t *m, const tdit_config_t *cfg, const wrk_roots_t *roots,
                  const wrk_fetch_src_t *fetch, const atomic_bool *stop, st_file_t **out, char hex[65], char *wire,
                  size_t wlen, char *err, size_t errlen) {
    *out = NULL;
    wire_err_t e;
    /* What is wrong with the message itself is said as it is: it tells
     * the sender nothing it did not send. */
    if (strcmp(m->component, TDIT_COMPONENT) != 0) {
        say(err, errlen, "unknown component '%.64s' (this worker has '%s')", m->component, TDIT_COMPONENT);
        snprintf(wire, wlen, "%s", err);
        return -1;
    }
    if (msg_sync_validate(m, true, &e) != 0) {
        say(err, errlen, "%s", e.message);
        snprintf(wire, wlen, "%s", err);
        return -1;
    }
    if (m->path[0]) {
        *out = open_path(m->path, cfg, roots, stop, hex, wire, wlen, err, errlen);
    } else if (m->uploaded) {
        /* Every parameter in F32: the most data a file of this model holds. */
        uint64_t max = cfg ? (uint64_t)tdit_config_params(cfg) * sizeof(float) : 0;
        *out = wrk_fetch(fetch, m, max, stop, hex, wire, wlen, err, errlen);
        /* A release file uploaded as it is (no Reel metadata): judged
         * against the running model, Wan's or diffusers' names made Reel's. */
        wan_fail_t why;
        if (*out && wan_ckpt_adopt(out, cfg, &why) != 0) {
            say(err, errlen, "%s", kern_error());
            snprintf(wire, wlen, "%s", why == WAN_E_MODEL ? WRK_E_MODEL : WRK_E_FILE);
        }
    } else if (!(*out = open_inline(m, cfg, hex, err, errlen))) {
        snprintf(wire, wlen, "%s", WRK_E_FILE);
    }
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
    wrk_fetch_buf_t spare;       /* a fetched file's data buffer, for the next fetch */
};

static void free_msg(wire_msg_t **mp) {
    if (!*mp) return;
    wire_msg_close(*mp);
    free(*mp);
    *mp = NULL;
}

static void ack(wrk_syncer_t *s, uint64_t id, uint64_t version, const char *error) {
    msg_sync_ack_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.component, sizeof a.component, "%s", TDIT_COMPONENT);
    a.version = version;
    a.ok = error == NULL;
    if (error) {
        snprintf(a.error, sizeof a.error, "%s", error);
        atomic_fetch_add(&s->w->syncs_failed, 1); /* refused or failed: its reason is in the log */
    }
    /* Epoch 0: an ack is about the worker's state, not a broker session. */
    if (wrk_pipe_send(s->push, 0, MSG_SYNC_ACK, id, &a) != 0)
        wrk_log(s->w, "cannot queue SYNC_ACK of v%" PRIu64, version);
}

static void process(wrk_syncer_t *s, wire_msg_t *wm) {
    wrk_t *w = s->w;
    char err[512], wire[MSG_REASON_MAX], hex[65];
    wire_err_t e;
    msg_sync_t *m = malloc(sizeof *m);
    if (!m || msg_sync_decode(wm, m, &e) != 0) {
        /* Its version may be what is wrong: the ack says 0. */
        const char *why = m ? e.message : "out of memory";
        wrk_log(w, "sync refused: %s", why);
        ack(s, wm->id, 0, why);
        free(m);
        return;
    }
    uint64_t version = m->version, id = wm->id;
    uint64_t applied = atomic_load(&w->applied_version);
    const char *want = m->sha256;
    st_file_t *f = NULL;
    if (version < applied) {
        wrk_log(w, "sync to v%" PRIu64 " refused: stale (applied v%" PRIu64 ")", version, applied);
        ack(s, id, version, "stale");
        goto out;
    }
    unsigned reasked = 0;
    const wrk_fetch_src_t src = { w->zctx, w->opt->broker, w->curve, &s->spare, &reasked };
    struct timespec t0, t1, tf, t2, t3;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (wrk_sync_read(m, tdit_model_config(w->model), w->roots, &src, &w->stop, &f, hex, wire, sizeof wire, err,
                      sizeof err) != 0) {
        /* The detail stays here; the broker (and the trainer) get the
         * generic reason. */
        wrk_log(w, "sync to v%" PRIu64 " refused: %s (answered: %s)", version, err, wire);
        ack(s, id, version, wire);
        goto out;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (reasked)
        wrk_log(w, "fetch of v%" PRIu64 ": the broker went silent; asked again %u time(s) and resumed", version, reasked);
    if (strcasecmp(hex, want) != 0) {
        wrk_log(w, "sync to v%" PRIu64 " refused: sha256 mismatch (got %s, expected %s)", version, hex, want);
        ack(s, id, version, "sha256 mismatch");
    } else if (version == applied) {
        /* A repeated SYNC (e.g. resent after a reconnect) is applied already. */
        bool same = s->applied_sha[0] && !strcasecmp(s->applied_sha, hex);
        if (!same) wrk_log(w, "sync to v%" PRIu64 " refused: stale (v%" PRIu64 " applied with other weights)", version, applied);
        ack(s, id, version, same ? NULL : "stale");
    } else if (wrk_weights_finite(f, err, sizeof err) != 0) {
        wrk_log(w, "sync to v%" PRIu64 " refused: %s", version, err);
        ack(s, id, version, WRK_E_NONFINITE);
    } else {
        const char *fail = NULL;
        clock_gettime(CLOCK_MONOTONIC, &tf); /* after the NaN check */
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
        clock_gettime(CLOCK_MONOTONIC, &t2);
        pthread_rwlock_wrlock(&w->step_lock);
        if (tdit_model_reload(w->model, f) != 0) {
            snprintf(err, sizeof err, "%s", kern_error());
            fail = WRK_E_MODEL; /* the tensor names and shapes stay in the log */
            if (strstr(err, "part-way")) {
                atomic_store(&w->fatal, true);
                fail = "internal: the weights could not be loaded whole (worker exiting)";
            }
        } else if (cap_component_update(w->cache, TDIT_COMPONENT, tdit_model_weights(w->model),
                                        tdit_model_bytes(w->model), version) < 0) {
            /* New weights under the old version's graphs and keys: unusable. */
            snprintf(err, sizeof err, "%s", kern_error());
            fail = "internal: the capture cache could not take the weights (worker exiting)";
            atomic_store(&w->fatal, true);
        } else {
            atomic_store(&w->applied_version, version);
        }
        pthread_rwlock_unlock(&w->step_lock);
        atomic_store(&w->draining, false);
        clock_gettime(CLOCK_MONOTONIC, &t3);
        if (!fail) {
            atomic_fetch_add(&w->syncs_applied, 1);
            atomic_fetch_add(&w->sync_us, (uint64_t)((double)(t3.tv_sec - t0.tv_sec) * 1e6 +
                                                     (double)(t3.tv_nsec - t0.tv_nsec) / 1e3));
        }
        if (fail) {
            wrk_log(w, "sync to v%" PRIu64 " failed: %s%s (answered: %s)", version, err,
                    atomic_load(&w->fatal) ? " (weights unusable: exiting)" : "", fail);
        } else {
            snprintf(s->applied_sha, sizeof s->applied_sha, "%s", hex);
            /* Where a sync's time went: reading (or fetching) and hashing
             * the file, draining, and the weights copied in under the lock. */
#define SECS(a, b) ((double)((b).tv_sec - (a).tv_sec) + 1e-9 * (double)((b).tv_nsec - (a).tv_nsec))
            wrk_log(w, "applied %s v%" PRIu64 " (%s): %s %.3f s, NaN check %.3f s, drain %.3f s, reload %.3f s",
                    TDIT_COMPONENT, version, cap_policy_name(w->opt->policy), m->uploaded ? "fetch + hash" : "read + hash",
                    SECS(t0, t1), SECS(t1, tf), SECS(tf, t2), SECS(t2, t3));
#undef SECS
        }
        ack(s, id, version, fail);
    }
out:
    if (f && m->uploaded && !s->spare.p && (s->spare.p = st_take_data(f)))
        wrk_fetch_spare_release(&s->spare); /* the next fetch writes into it, if the kernel left it */
    st_close(&f);
    free(m);
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
    free(s->spare.p);
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
