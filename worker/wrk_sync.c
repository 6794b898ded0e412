/* wrk_sync.c -- weight syncs (see wrk_sync.h). The slow parts (reading and
 * hashing the weights) run on the sync thread before the step lock is
 * taken, so the main thread keeps heartbeating and streams keep stepping
 * until the copy itself. A path is read under the weights roots only,
 * and what goes back in the ack is generic (wrk_weights.h). */
#include "worker/wrk_sync.h"

#include <assert.h>
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
#include "base/thread.h"
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
    if (!w) { say(err, errlen, "%s", reel_err_text()); goto out; }
    for (int i = 0; i < m->n_tensors; i++)
        if (st_writer_add(w, m->tensors[i]->name, m->tensors[i]->dtype, m->tensors[i]->ndim, m->tensors[i]->shape,
                          m->tensors[i]->data) != 0) {
            say(err, errlen, "%s", reel_err_text());
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
    if (rc != 0) { say(err, errlen, "%s", reel_err_text()); goto out; }
    if (!mkdtemp(dir)) { say(err, errlen, "cannot create a temporary directory: %s", strerror(errno)); goto out; }
    have_dir = true;
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    if (st_writer_save(w, path) != 0 || !(f = st_open(path))) say(err, errlen, "inline weights: %s", reel_err_text());
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
            say(err, errlen, "%s", reel_err_text());
            snprintf(wire, wlen, "%s", why == WAN_E_MODEL ? WRK_E_MODEL : WRK_E_FILE);
        }
    } else if (!(*out = open_inline(m, cfg, hex, err, errlen))) {
        snprintf(wire, wlen, "%s", WRK_E_FILE);
    }
    return *out ? 0 : -1;
}

/* ---- the sync thread (base/thread.h) -------------------------------------- */

struct wrk_syncer {
    wrk_t *w;
    reel_thread_t *th;           /* takes the SYNC messages, in order */
    void *push;                  /* the thread's while it runs */
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

/* One SYNC on its way through the phases of process(): read, check, drain,
 * apply, ack. */
typedef struct {
    wrk_syncer_t *s;
    wrk_t *w;
    msg_sync_t *m;               /* decoded */
    uint64_t id, version, applied;
    st_file_t *f;                /* the weights read */
    char hex[65];                /* their sha256 */
    char err[512];               /* the detail, for the log */
    char wire[MSG_REASON_MAX];   /* the reason the ack carries */
    const char *fail;            /* the apply's reason, NULL when it applied */
    struct timespec t0, t1, tf, t2, t3; /* start, read, NaN checked, drained, applied */
} sync_op_t;

#define SECS(a, b) ((double)((b).tv_sec - (a).tv_sec) + 1e-9 * (double)((b).tv_nsec - (a).tv_nsec))

/* Decodes the message. -1 after acking a refusal (its version may be what
 * is wrong: the ack says 0). */
static int sync_decode(sync_op_t *op, wire_msg_t *wm) {
    wire_err_t e;
    op->id = wm->id;
    op->m = malloc(sizeof *op->m);
    if (!op->m || msg_sync_decode(wm, op->m, &e) != 0) {
        const char *why = op->m ? e.message : "out of memory";
        wrk_log(op->w, "sync refused: %s", why);
        ack(op->s, op->id, 0, why);
        return -1;
    }
    op->version = op->m->version;
    op->applied = atomic_load(&op->w->applied_version);
    return 0;
}

/* Reads and hashes the weights, before any lock. -1 after acking a
 * refusal (stale, or what wrk_sync_read answers). */
static int sync_read_phase(sync_op_t *op) {
    wrk_t *w = op->w;
    if (op->version < op->applied) {
        wrk_log(w, "sync to v%" PRIu64 " refused: stale (applied v%" PRIu64 ")", op->version, op->applied);
        ack(op->s, op->id, op->version, "stale");
        return -1;
    }
    unsigned reasked = 0;
    const wrk_fetch_src_t src = { w->zctx, w->opt->broker, w->curve, &op->s->spare, &reasked };
    clock_gettime(CLOCK_MONOTONIC, &op->t0);
    if (wrk_sync_read(op->m, tdit_model_config(w->model), w->roots, &src, &w->stop, &op->f, op->hex, op->wire,
                      sizeof op->wire, op->err, sizeof op->err) != 0) {
        /* The detail stays here; the broker (and the trainer) get the
         * generic reason. */
        wrk_log(w, "sync to v%" PRIu64 " refused: %s (answered: %s)", op->version, op->err, op->wire);
        ack(op->s, op->id, op->version, op->wire);
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &op->t1);
    if (reasked)
        wrk_log(w, "fetch of v%" PRIu64 ": the broker went silent; asked again %u time(s) and resumed", op->version,
                reasked);
    return 0;
}

/* The weights read against the SYNC: their sha256, a repeated version
 * (acked ok when the same weights), no NaN or infinity. 0 when they are
 * to be applied; -1 after acking. */
static int sync_check(sync_op_t *op) {
    wrk_t *w = op->w;
    uint64_t v = op->version;
    if (strcasecmp(op->hex, op->m->sha256) != 0) {
        wrk_log(w, "sync to v%" PRIu64 " refused: sha256 mismatch (got %s, expected %s)", v, op->hex, op->m->sha256);
        ack(op->s, op->id, v, "sha256 mismatch");
        return -1;
    }
    if (v == op->applied) {
        /* A repeated SYNC (e.g. resent after a reconnect) is applied already. */
        bool same = op->s->applied_sha[0] && !strcasecmp(op->s->applied_sha, op->hex);
        if (!same) wrk_log(w, "sync to v%" PRIu64 " refused: stale (v%" PRIu64 " applied with other weights)", v, op->applied);
        ack(op->s, op->id, v, same ? NULL : "stale");
        return -1;
    }
    if (wrk_weights_finite(op->f, op->err, sizeof op->err) != 0) {
        wrk_log(w, "sync to v%" PRIu64 " refused: %s", v, op->err);
        ack(op->s, op->id, v, WRK_E_NONFINITE);
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &op->tf); /* after the NaN check */
    return 0;
}

/* --sync-mode drain: every request runs on one version: hold new requests
 * and let the ones mid-way finish on the old weights first (sleeping until
 * the last one ends, or the worker stops). */
static void sync_drain(sync_op_t *op) {
    wrk_t *w = op->w;
    if (w->opt->sync_drain) {
        atomic_store(&w->draining, true);
        int n = atomic_load(&w->running);
        if (n) wrk_log(w, "draining %d request(s) before applying v%" PRIu64, n, op->version);
        wrk_wait_drained(w);
    }
    clock_gettime(CLOCK_MONOTONIC, &op->t2);
}

/* The reload and the cache's update. The caller holds the write side of
 * the step lock. Sets op->fail (and wrk_t.fatal when the weights are
 * left unusable) on failure. */
static void sync_apply_locked(sync_op_t *op) {
    wrk_t *w = op->w;
    assert(reel_owner_mine(&w->step_writer));
    if (tdit_model_reload(w->model, op->f) != 0) {
        snprintf(op->err, sizeof op->err, "%s", reel_err_text());
        op->fail = WRK_E_MODEL; /* the tensor names and shapes stay in the log */
        if (strstr(op->err, "part-way")) {
            atomic_store(&w->fatal, true);
            op->fail = "internal: the weights could not be loaded whole (worker exiting)";
        }
    } else if (cap_component_update(w->cache, TDIT_COMPONENT, tdit_model_weights(w->model), tdit_model_bytes(w->model),
                                    op->version) < 0) {
        /* New weights under the old version's graphs and keys: unusable. */
        snprintf(op->err, sizeof op->err, "%s", reel_err_text());
        op->fail = "internal: the capture cache could not take the weights (worker exiting)";
        atomic_store(&w->fatal, true);
    } else {
        atomic_store(&w->applied_version, op->version);
    }
}

/* Applies between steps (steps in progress finish first), then ends the
 * drain. */
static void sync_apply(sync_op_t *op) {
    wrk_t *w = op->w;
    pthread_rwlock_wrlock(&w->step_lock);
    reel_owner_set(&w->step_writer);
    sync_apply_locked(op);
    reel_owner_clear(&w->step_writer);
    pthread_rwlock_unlock(&w->step_lock);
    wrk_drain_end(w);
    clock_gettime(CLOCK_MONOTONIC, &op->t3);
}

/* The applied sync's log line and counters, or the failure's; then the ack. */
static void sync_ack(sync_op_t *op) {
    wrk_t *w = op->w;
    if (op->fail) {
        wrk_log(w, "sync to v%" PRIu64 " failed: %s%s (answered: %s)", op->version, op->err,
                atomic_load(&w->fatal) ? " (weights unusable: exiting)" : "", op->fail);
    } else {
        atomic_fetch_add(&w->syncs_applied, 1);
        atomic_fetch_add(&w->sync_us, (uint64_t)(SECS(op->t0, op->t3) * 1e6));
        snprintf(op->s->applied_sha, sizeof op->s->applied_sha, "%s", op->hex);
        /* Where a sync's time went: reading (or fetching) and hashing
         * the file, draining, and the weights copied in under the lock. */
        wrk_log(w, "applied %s v%" PRIu64 " (%s): %s %.3f s, NaN check %.3f s, drain %.3f s, reload %.3f s",
                TDIT_COMPONENT, op->version, cap_policy_name(w->opt->policy),
                op->m->uploaded ? "fetch + hash" : "read + hash", SECS(op->t0, op->t1), SECS(op->t1, op->tf),
                SECS(op->tf, op->t2), SECS(op->t2, op->t3));
    }
    ack(op->s, op->id, op->version, op->fail);
}

/* One SYNC, phase by phase; each refusal is acked where it is found. */
static void process(wrk_syncer_t *s, wire_msg_t *wm) {
    sync_op_t op = { .s = s, .w = s->w };
    if (sync_decode(&op, wm) == 0 && sync_read_phase(&op) == 0 && sync_check(&op) == 0) {
        sync_drain(&op);
        sync_apply(&op);
        sync_ack(&op);
    }
    if (op.f && op.m->uploaded && !s->spare.p && (s->spare.p = st_take_data(op.f)))
        wrk_fetch_spare_release(&s->spare); /* the next fetch writes into it, if the kernel left it */
    st_close(&op.f);
    free(op.m);
}

static void sync_run(void *arg, void *item) {
    wire_msg_t *m = item;
    process(arg, m);
    free_msg(&m);
}

static void sync_discard(void *arg, void *item) {
    (void)arg;
    wire_msg_t *m = item;
    free_msg(&m);
}

wrk_syncer_t *wrk_syncer_new(wrk_t *w, const char initial_sha[65]) {
    wrk_syncer_t *s = calloc(1, sizeof *s);
    if (!s) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    s->w = w;
    if (initial_sha) snprintf(s->applied_sha, sizeof s->applied_sha, "%s", initial_sha);
    if (!(s->push = wrk_pipe_push_new(w->zctx))) {
        reel_fail(REEL_E_IO, "sync pipe: %s", zmq_strerror(errno));
        goto err;
    }
    reel_thread_opts_t o = { .name = "sync", .user = s, .run = sync_run, .discard = sync_discard,
                             .block_signals = true };
    if (!(s->th = reel_thread_start(&o))) goto err;
    return s;
err:
    wrk_syncer_destroy(&s);
    return NULL;
}

void wrk_syncer_submit(wrk_syncer_t *s, wire_msg_t *m) {
    /* Not acked when it fails (freed by sync_discard): the broker's
     * deadline reports it. */
    if (reel_thread_post(s->th, m) != 0) wrk_log(s->w, "%s: a SYNC dropped", reel_err_text());
}

void wrk_syncer_destroy(wrk_syncer_t **sp) {
    if (!sp || !*sp) return;
    wrk_syncer_t *s = *sp;
    reel_thread_stop(&s->th, REEL_THREAD_DISCARD); /* after the sync in progress */
    free(s->spare.p);
    if (s->push) zmq_close(s->push);
    free(s);
    *sp = NULL;
}
