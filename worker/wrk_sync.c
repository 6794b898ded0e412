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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>
#include <unistd.h>
#include "base/error.h"
#include "base/sha256.h"
#include "base/thread.h"
#include "model/lora.h"
#include "model/tdit_program.h"
#include "model/wan_ckpt.h"
#include "worker/wrk_pipe.h"
#include "worker/wrk_weights.h"

/* ---- reading the weights a SYNC carries ----------------------------------- */

/* Reads the checkpoint a peer named (a file, an index or a folder), under
 * the weights roots, judged against the running model and by its size
 * first, each file read once and hashed as it is read (wrk_weights.h). */
static st_file_t *open_path(const char *path, const tdit_config_t *cfg, const wrk_roots_t *roots,
                            const atomic_bool *stop, char hex[65]) {
    /* Every parameter in F32: the most a file of this model holds. */
    uint64_t max_data = cfg ? (uint64_t)tdit_config_params(cfg) * sizeof(float) : 0;
    return wrk_weights_load(roots, path, cfg, max_data, stop, hex);
}

/* The failure just recorded, answered as what it is to a peer: inline
 * tensors that do not make a weights file. */
static void not_a_file(const char *what) {
    wrk_refuse(reel_err_code(), WRK_E_FILE, "%s%s", what, reel_err_text());
}

/* Writes the inline tensors (with cfg as metadata, which tdit_model_reload
 * needs) to a private temporary file and opens it. NULL with WRK_E_FILE
 * and the reason. */
static st_file_t *open_inline(const msg_sync_t *m, const tdit_config_t *cfg, char hex[65]) {
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
    if (!w) { not_a_file(""); goto out; }
    for (int i = 0; i < m->n_tensors; i++)
        if (st_writer_add(w, m->tensors[i]->name, m->tensors[i]->dtype, m->tensors[i]->ndim, m->tensors[i]->shape,
                          m->tensors[i]->data) != 0) {
            not_a_file("");
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
    if (rc != 0) { not_a_file(""); goto out; }
    if (!mkdtemp(dir)) {
        wrk_refuse(REEL_E_IO, WRK_E_FILE, "cannot create a temporary directory: %s", strerror(errno));
        goto out;
    }
    have_dir = true;
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    if (st_writer_save(w, path) != 0 || !(f = st_open(path))) not_a_file("inline weights: ");
    unlink(path);
out:
    if (have_dir) rmdir(dir);
    st_writer_destroy(&w);
    return f;
}

int wrk_sync_read(const msg_sync_t *m, const tdit_config_t *cfg, const wrk_roots_t *roots,
                  const wrk_fetch_src_t *fetch, const atomic_bool *stop, st_file_t **out, char hex[65]) {
    *out = NULL;
    wire_err_t e;
    /* What is wrong with the message itself is said as it is: it tells
     * the sender nothing it did not send. */
    if (strcmp(m->component, TDIT_COMPONENT) != 0)
        return reel_fail(REEL_E_NOT_FOUND, "unknown component '%.64s' (this worker has '%s')", m->component,
                         TDIT_COMPONENT);
    if (msg_sync_validate(m, true, &e) != 0) return reel_fail(REEL_E_INVALID, "%s", e.message);
    if (m->path[0]) {
        *out = open_path(m->path, cfg, roots, stop, hex);
    } else if (m->uploaded) {
        /* Every parameter in F32: the most data a file of this model holds. */
        uint64_t max = cfg ? (uint64_t)tdit_config_params(cfg) * sizeof(float) : 0;
        *out = wrk_fetch(fetch, m, max, stop, hex);
        /* A release file uploaded as it is (no Reel metadata): judged
         * against the running model, Wan's or diffusers' names made Reel's. */
        if (*out && wan_ckpt_adopt(out, cfg) != 0) wrk_weights_refused();
    } else {
        *out = open_inline(m, cfg, hex);
    }
    return *out ? 0 : -1;
}

/* ---- the sync thread (base/thread.h) -------------------------------------- */

struct wrk_syncer {
    wrk_t *w;
    reel_thread_t *th;           /* takes the SYNC messages, in order */
    _Atomic size_t inline_bytes; /* the inline tensors of the SYNCs posted and not yet processed */
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

static void ack(wrk_syncer_t *s, uint64_t id, uint64_t version, const char *error, const char *adapter) {
    msg_sync_ack_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.component, sizeof a.component, "%s", TDIT_COMPONENT);
    a.version = version;
    a.ok = error == NULL;
    if (adapter) snprintf(a.adapter, sizeof a.adapter, "%s", adapter);
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
    msg_sync_t *m;               /* decoded once `decoded` */
    bool decoded;
    uint64_t id, version, applied;
    uint64_t epoch;              /* the broker session it came in (wrk_t.epoch) */
    st_file_t *f;                /* the weights read (a full version) */
    bool adapter;                /* base_version given: an adapter on the base, or the base again */
    lora_t *lora;                /* the adapter read (NULL with `adapter`: the base itself) */
    char hex[65];                /* their sha256 */
    bool applying;               /* past the checks: a failure now is the apply's */
    struct timespec t0, t1, tf, t2, t3; /* start, read, NaN checked, drained, applied */
} sync_op_t;

/* sync_apply's answer for a SYNC whose broker session ended first. */
#define SYNC_ABANDONED 2

#define SECS(a, b) ((double)((b).tv_sec - (a).tv_sec) + 1e-9 * (double)((b).tv_nsec - (a).tv_nsec))

/* Each phase below returns 0 to go on, or -1 with the error value: its
 * message is what the ack answers, its detail (the path, errno, what the
 * file said) is for the log only (wrk_weights.h). sync_ack answers. */

/* Decodes the message (a refusal's ack says version 0: the version may be
 * what is wrong). */
static int sync_decode(sync_op_t *op, wire_msg_t *wm) {
    wire_err_t e;
    op->id = wm->id;
    if (!(op->m = malloc(sizeof *op->m))) return reel_fail(REEL_E_NOMEM, "out of memory");
    if (msg_sync_decode(wm, op->m, &e) != 0) return reel_fail(REEL_E_INVALID, "%s", e.message);
    op->decoded = true;
    op->adapter = op->m->base_version > 0;
    op->version = op->m->version;
    op->applied = atomic_load(&op->w->applied_version);
    return 0;
}

/* The text of an adapter_config.json open at fd: at most LORA_CONFIG_MAX
 * bytes into a malloc'd buffer (*n). NULL with WRK_E_FILE. */
static char *read_config(int fd, const char *path, size_t *n) {
    char *text = malloc(LORA_CONFIG_MAX + 1);
    if (!text) {
        wrk_refuse(REEL_E_NOMEM, WRK_E_FILE, "out of memory");
        return NULL;
    }
    *n = 0;
    for (;;) {
        ssize_t r = read(fd, text + *n, LORA_CONFIG_MAX + 1 - *n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            wrk_refuse(REEL_E_IO, WRK_E_FILE, "%s: %s", path, strerror(errno));
            free(text);
            return NULL;
        }
        *n += (size_t)r;
        if (r == 0 || *n > LORA_CONFIG_MAX) break;
    }
    if (*n > LORA_CONFIG_MAX) {
        wrk_refuse(REEL_E_LIMIT, WRK_E_FILE, "%s: larger than %d bytes", path, LORA_CONFIG_MAX);
        free(text);
        return NULL;
    }
    return text;
}

/* The most data an adapter of the model can hold: rank LORA_MAX_RANK on
 * every Linear of every block, in F32. */
static uint64_t adapter_max_bytes(const tdit_config_t *c) {
    uint64_t D = (uint64_t)c->dim, F = (uint64_t)c->ffn_dim;
    return (uint64_t)c->layers * LORA_MAX_RANK * (8 * 2 * D + 2 * (D + F)) * sizeof(float);
}

/* op->lora from a config's text and the weights read, checked against
 * the model; on a refusal NULL, answered `bad_adapter: <why>`. */
static void adapter_parse(sync_op_t *op, const char *text, size_t n, const char *what, const st_file_t *f) {
    op->lora = lora_parse(text, n, what, f, op->hex);
    /* lora_check also refuses a merge that could leave F32's range (it
     * would serve NaN): before the lock, not after */
    if (op->lora && lora_check(op->lora, tdit_model_config(op->w->model)) == 0) {
        /* nor one that could carry a weight to 2^WRK_WEIGHT_EXP, which a
         * full sync of such values is refused for (wrk_weights_finite):
         * trained weights are far below 2^23, so a delta that can reach it is
         * the adapter's, and every step on it would overflow */
        const double bound = (double)(1 << (WRK_WEIGHT_EXP - 1));
        if (lora_max_delta(op->lora) >= bound)
            reel_fail(REEL_E_INVALID, "its merge could add %.3g to a weight (scale x rank x max|A| x max|B|, plus "
                      "max|difference|, or a DoRA max|magnitude|), 2^%d or more: every step would overflow",
                      lora_max_delta(op->lora), WRK_WEIGHT_EXP - 1);
        /* DoRA divides each row by its norm on the base: a row it cannot
         * merge is refused now, not part-way through the reload (which
         * would leave the weights unusable) */
        else if (lora_check_merge(op->lora, op->w->base.file) == 0)
            return;
    }
    char answer[REEL_ERR_MSG];
    snprintf(answer, sizeof answer, "bad_adapter: %s", reel_err_text());
    wrk_refuse(reel_err_code() == REEL_E_UNSUPPORTED ? REEL_E_UNSUPPORTED : REEL_E_INVALID, answer, "%s",
               reel_err_text());
    lora_close(&op->lora);
}

/* The adapter a SYNC with base_version names (wrk_weights.h's rules for
 * a path: under the roots, regular files, judged by size first, read
 * once and hashed as read), checked against the model; or, with no path,
 * the base again (its sha256 is the base's). What the adapter has wrong
 * (kohya's DoRA, a PEFT DoRA row of norm 0 on the base, an unknown
 * target, a shape) is answered by name. */
static int adapter_read(sync_op_t *op, const wrk_fetch_src_t *src) {
    wrk_t *w = op->w;
    const msg_sync_t *m = op->m;
    wire_err_t e;
    if (strcmp(m->component, TDIT_COMPONENT) != 0)
        return reel_fail(REEL_E_NOT_FOUND, "unknown component '%.64s' (this worker has '%s')", m->component,
                         TDIT_COMPONENT);
    if (msg_sync_validate(m, false, &e) != 0) return reel_fail(REEL_E_INVALID, "%s", e.message);
    if (!w->base.file) return wrk_refuse(REEL_E_UNSUPPORTED, WRK_E_NO_LORA, "a SYNC with base_version");
    if (m->base_version != w->base.version)
        return wrk_refuse(REEL_E_STATE, WRK_E_BASE, "base v%" PRIu64 " asked, this worker's base is v%" PRIu64,
                          m->base_version, w->base.version);
    uint64_t max = adapter_max_bytes(tdit_model_config(w->model));
    if (m->uploaded) { /* its weights from the broker, its config in the SYNC */
        st_file_t *f = wrk_fetch(src, m, max, &w->stop, op->hex);
        if (!f) return -1;
        adapter_parse(op, m->lora_config, strlen(m->lora_config), "lora_config", f);
        st_close(&f);
        return op->lora ? 0 : -1;
    }
    if (!m->path[0]) {
        snprintf(op->hex, sizeof op->hex, "%s", w->base.sha);
        return 0;
    }
    char cfg[MSG_PATH_MAX + 32], wts[MSG_PATH_MAX + 32];
    size_t len = strlen(m->path);
    if (len > 12 && !strcmp(m->path + len - 12, ".safetensors")) {
        const char *slash = strrchr(m->path, '/');
        if (slash) snprintf(cfg, sizeof cfg, "%.*s/adapter_config.json", (int)(slash - m->path), m->path);
        else snprintf(cfg, sizeof cfg, "adapter_config.json"); /* refused as any relative path is */
        snprintf(wts, sizeof wts, "%s", m->path);
    } else {
        snprintf(cfg, sizeof cfg, "%s/adapter_config.json", m->path);
    }
    /* No adapter_config.json (diffusers' and ComfyUI's LoRAs have none):
     * the weights file's own config (lora_parse with none: the file must
     * say its scale). */
    int fd = wrk_weights_open(w->roots, cfg);
    if (fd < 0 && reel_err_code() != REEL_E_NOT_FOUND) return -1;
    size_t n = 0;
    char *text = fd < 0 ? strdup("") : read_config(fd, cfg, &n);
    if (fd >= 0) close(fd);
    if (!text) return fd < 0 ? wrk_refuse(REEL_E_NOMEM, WRK_E_FILE, "out of memory") : -1;
    st_file_t *f = NULL;
    /* a folder's weights: PEFT's file or diffusers' (safetensors only) */
    static const char *const names[] = { "adapter_model.safetensors", "pytorch_lora_weights.safetensors" };
    const bool file = len > 12 && !strcmp(m->path + len - 12, ".safetensors");
    fd = file ? wrk_weights_open(w->roots, wts) : -1;
    for (size_t i = 0; !file && i < sizeof names / sizeof names[0] && fd < 0; i++) {
        if (i && reel_err_code() != REEL_E_NOT_FOUND) break;
        snprintf(wts, sizeof wts, "%s/%s", m->path, names[i]);
        fd = wrk_weights_open(w->roots, wts);
    }
    if (fd < 0 && !file && reel_err_code() == REEL_E_NOT_FOUND)
        wrk_refuse(REEL_E_NOT_FOUND, WRK_E_FILE, "%s: no adapter_model.safetensors or pytorch_lora_weights.safetensors",
                   m->path);
    if (fd >= 0) {
        f = wrk_adapter_read(fd, wts, max, &w->stop, op->hex);
        close(fd);
    }
    if (f) adapter_parse(op, text, n, cfg, f);
    st_close(&f);
    free(text);
    return op->lora ? 0 : -1;
}

/* Reads and hashes the weights, before any lock: stale, or what
 * wrk_sync_read answers. */
static int sync_read_phase(sync_op_t *op) {
    wrk_t *w = op->w;
    if (op->version < op->applied) return wrk_refuse(REEL_E_STATE, "stale", "applied v%" PRIu64, op->applied);
    /* The version applied already: its sha256 says whether these are the
     * same weights, without reading the file again (a broker sends the
     * applied version to learn exactly that: READY carries no sha256). */
    if (!op->adapter && op->version == op->applied && op->s->applied_sha[0]) {
        if (!strcasecmp(op->s->applied_sha, op->m->sha256)) return 1;
        return wrk_refuse(REEL_E_STATE, "stale", "v%" PRIu64 " applied with other weights (sha256 %.16s...)",
                          op->applied, op->s->applied_sha);
    }
    unsigned reasked = 0;
    const wrk_fetch_src_t src = { w->zctx, wrk_broker_endpoint(w), w->curve, &op->s->spare, &reasked };
    clock_gettime(CLOCK_MONOTONIC, &op->t0);
    if (op->adapter) {
        if (adapter_read(op, &src) != 0) return -1;
    } else if (wrk_sync_read(op->m, tdit_model_config(w->model), w->roots, &src, &w->stop, &op->f, op->hex) != 0) {
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &op->t1);
    if (reasked)
        wrk_log(w, "fetch of v%" PRIu64 ": the broker went silent; asked again %u time(s) and resumed", op->version,
                reasked);
    return 0;
}

/* The weights read against the SYNC: their sha256, a repeated version
 * (1: the same weights, applied already: acked ok), no NaN or infinity.
 * 0 when they are to be applied. */
static int sync_check(sync_op_t *op) {
    uint64_t v = op->version;
    if (strcasecmp(op->hex, op->m->sha256) != 0)
        return wrk_refuse(REEL_E_INVALID, "sha256 mismatch", "got %s, expected %s", op->hex, op->m->sha256);
    if (v == op->applied) {
        /* A repeated SYNC (e.g. resent after a reconnect) is applied already. */
        bool same = op->s->applied_sha[0] && !strcasecmp(op->s->applied_sha, op->hex);
        return same ? 1 : wrk_refuse(REEL_E_STATE, "stale", "v%" PRIu64 " applied with other weights", op->applied);
    }
    if (op->f && wrk_weights_finite(op->f) != 0) return -1; /* an adapter's values were checked as read */
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
 * the step lock. -1 (the cause's code, its text the detail; wrk_t.fatal
 * set when the weights are left unusable) on failure. */
/* Which weights an adapter sync copies: the new adapter's targets, and
 * the previous one's (they go back to the base's values). */
typedef struct {
    const lora_t *next, *prev;
} adapter_edit_t;

static bool adapter_want(void *user, const char *name) {
    const adapter_edit_t *e = user;
    return (e->next && lora_find(e->next, name)) || (e->prev && lora_find(e->prev, name));
}

static int adapter_adjust(void *user, const char *name, float *w, int64_t numel) {
    const adapter_edit_t *e = user;
    return e->next ? lora_merge_into(e->next, name, w, numel) : 0;
}

/* An adapter (or the base again) merged from the exact base into the
 * resident buffers: only the weights either adapter touches are
 * rewritten, every address stays, and every captured graph is kept and
 * re-verified on its next replay (the inplace path, whatever --policy
 * says: docs/CAPTURE.md). The caller holds the write lock. */
static int adapter_apply_locked(sync_op_t *op) {
    wrk_t *w = op->w;
    adapter_edit_t ae = { op->lora, w->base.applied };
    tdit_weight_edit_t edit = { adapter_want, adapter_adjust, &ae };
    if (tdit_model_reload_judged(w->model, w->base.file, &edit) != 0) { /* judged at start or at its sync */
        atomic_store(&w->fatal, true);
        return reel_fail_detail(reel_err_code(), reel_err_text(),
                                "internal: the adapter could not be merged whole (worker exiting)");
    }
    if (cap_component_update_policy(w->cache, TDIT_COMPONENT, tdit_model_weights(w->model), tdit_model_bytes(w->model),
                                    op->version, CAP_POLICY_INPLACE) < 0) {
        atomic_store(&w->fatal, true);
        return reel_fail_detail(reel_err_code(), reel_err_text(),
                                "internal: the capture cache could not take the weights (worker exiting)");
    }
    lora_close(&w->base.applied);
    w->base.applied = op->lora;
    op->lora = NULL;
    atomic_store(&w->applied_version, op->version);
    return 0;
}

static int sync_apply_locked(sync_op_t *op) {
    wrk_t *w = op->w;
    assert(reel_owner_mine(&w->step_writer));
    if (op->adapter) return adapter_apply_locked(op);
    if (tdit_model_reload_judged(w->model, op->f, NULL) != 0) { /* sync_check judged its values */
        if (strstr(reel_err()->msg, "part-way")) {
            atomic_store(&w->fatal, true);
            return reel_fail_detail(reel_err_code(), reel_err_text(),
                                    "internal: the weights could not be loaded whole (worker exiting)");
        }
        /* the tensor names and shapes stay in the log */
        return reel_fail_detail(reel_err_code(), reel_err_text(), "%s", WRK_E_MODEL);
    }
    if (cap_component_update(w->cache, TDIT_COMPONENT, tdit_model_weights(w->model), tdit_model_bytes(w->model),
                             op->version) < 0) {
        /* New weights under the old version's graphs and keys: unusable. */
        atomic_store(&w->fatal, true);
        return reel_fail_detail(reel_err_code(), reel_err_text(),
                                "internal: the capture cache could not take the weights (worker exiting)");
    }
    atomic_store(&w->applied_version, op->version);
    if (w->base.file) { /* a full version is the new base adapters merge from */
        st_close(&w->base.file);
        w->base.file = op->f;
        op->f = NULL;
        w->base.version = op->version;
        snprintf(w->base.sha, sizeof w->base.sha, "%s", op->hex);
        lora_close(&w->base.applied);
    }
    return 0;
}

/* Applies between steps (steps in progress finish first), then ends the
 * drain. */
static int sync_apply(sync_op_t *op) {
    wrk_t *w = op->w;
    pthread_rwlock_wrlock(&w->step_lock);
    reel_owner_set(&w->step_writer);
    int rc;
    if (op->epoch != atomic_load(&w->epoch)) {
        /* Its broker session ended before it was applied: that broker
         * may have given up on this worker and failed the sync, and a
         * sync it failed must change nothing. Not applied and not
         * answered: a broker that still wants it sends it again when this
         * worker registers (docs/PROTOCOL.md, "Weight syncs"). */
        rc = SYNC_ABANDONED;
    } else {
        op->applying = true;
        rc = sync_apply_locked(op);
    }
    reel_owner_clear(&w->step_writer);
    pthread_rwlock_unlock(&w->step_lock);
    wrk_drain_end(w);
    clock_gettime(CLOCK_MONOTONIC, &op->t3);
    return rc;
}

/* The one place a SYNC is answered, after its phases returned rc: 0
 * applied (its log line and counters), 1 applied already (ok, nothing
 * done), -1 refused or failed: the error value's message is the answer,
 * reel_err_text() (with the detail) the log line. */
static void sync_ack(sync_op_t *op, int rc) {
    wrk_t *w = op->w;
    if (rc < 0 && !op->decoded) {
        wrk_log_sync_refused(w, "sync refused: %s", reel_err_text());
    } else if (rc < 0) {
        wrk_log_sync_refused(w, "sync to v%" PRIu64 " %s: %s", op->version, op->applying ? "failed" : "refused",
                             reel_err_text());
    } else if (rc == 0) {
        atomic_fetch_add(&w->syncs_applied, 1);
        atomic_fetch_add(&w->sync_us, (uint64_t)(SECS(op->t0, op->t3) * 1e6));
        snprintf(op->s->applied_sha, sizeof op->s->applied_sha, "%s", op->hex);
        /* Where a sync's time went: reading (or fetching) and hashing
         * the file, draining, and the weights copied in under the lock. */
        if (op->adapter)
            wrk_log(w, "applied %s v%" PRIu64 " (%s on base v%" PRIu64 ", graphs kept): read + hash %.3f s, drain "
                    "%.3f s, merge %.3f s", TDIT_COMPONENT, op->version,
                    w->base.applied ? "LoRA adapter" : "no adapter", op->m->base_version, SECS(op->t0, op->t1),
                    SECS(op->tf, op->t2), SECS(op->t2, op->t3));
        else
            wrk_log(w, "applied %s v%" PRIu64 " (%s): %s %.3f s, NaN check %.3f s, drain %.3f s, reload %.3f s",
                    TDIT_COMPONENT, op->version, cap_policy_name(w->opt->policy),
                    op->m->uploaded ? "fetch + hash" : "read + hash", SECS(op->t0, op->t1), SECS(op->t1, op->tf),
                    SECS(op->tf, op->t2), SECS(op->t2, op->t3));
    }
    char adapter[MSG_REASON_MAX] = "";
    if (rc >= 0 && op->adapter && w->base.applied && lora_describe(w->base.applied, adapter, sizeof adapter) != 0)
        adapter[0] = '\0'; /* too long to report: the sync stands */
    ack(op->s, op->id, op->decoded ? op->version : 0, rc < 0 ? reel_err()->msg : NULL, adapter[0] ? adapter : NULL);
}

/* One SYNC, phase by phase, answered once. */
static void process(wrk_syncer_t *s, wire_msg_t *wm, uint64_t epoch) {
    sync_op_t op = { .s = s, .w = s->w, .epoch = epoch };
    int rc = sync_decode(&op, wm);
    if (rc == 0) rc = sync_read_phase(&op);
    if (rc == 0) rc = sync_check(&op);
    if (rc == 0) {
        sync_drain(&op);
        rc = sync_apply(&op);
    }
    if (rc == SYNC_ABANDONED)
        wrk_log(s->w, "sync to v%" PRIu64 " abandoned: the broker session it came in ended before it was applied "
                "(a broker that still wants it sends it again)", op.version);
    else if (rc < 0 && op.decoded && op.epoch != atomic_load(&s->w->epoch))
        /* refused or failed after its session ended (a fetch from a broker
         * that died, say): nobody there waits for the answer either */
        wrk_log(s->w, "sync to v%" PRIu64 " abandoned, not answered: the broker session it came in ended, and it "
                "failed: %s", op.version, reel_err_text());
    else
        sync_ack(&op, rc);
    if (op.f && op.m->uploaded && !s->spare.p && (s->spare.p = st_take_data(op.f)))
        wrk_fetch_spare_release(&s->spare); /* the next fetch writes into it, if the kernel left it */
    st_close(&op.f);
    lora_close(&op.lora);
    free(op.m);
}

/* A SYNC, the broker session it came in, and its inline tensors' bytes. */
typedef struct {
    wire_msg_t *m;
    uint64_t epoch;
    size_t bytes;
} sync_item_t;

static void sync_run(void *arg, void *item) {
    wrk_syncer_t *s = arg;
    sync_item_t *it = item;
    process(s, it->m, it->epoch);
    free_msg(&it->m);
    atomic_fetch_sub(&s->inline_bytes, it->bytes);
    free(it);
}

static void sync_discard(void *arg, void *item) {
    wrk_syncer_t *s = arg;
    sync_item_t *it = item;
    free_msg(&it->m);
    atomic_fetch_sub(&s->inline_bytes, it->bytes);
    free(it);
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

/* SYNC m refused before it was queued (too many wait): acked not ok on
 * reply at once, with its component and version when it can be read (0
 * otherwise, as the sync thread acks one it cannot read). */
static void refuse_busy(wrk_syncer_t *s, wire_msg_t *m, void *reply, const char *why) {
    msg_sync_ack_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.component, sizeof a.component, "%s", TDIT_COMPONENT);
    snprintf(a.error, sizeof a.error, "%s", WRK_E_SYNC_BUSY);
    msg_sync_t *sm = malloc(sizeof *sm);
    wire_err_t e;
    if (sm && msg_sync_decode(m, sm, &e) == 0) {
        snprintf(a.component, sizeof a.component, "%s", sm->component);
        a.version = sm->version;
    }
    free(sm);
    wrk_log_refused(s->w, "sync to v%" PRIu64 " refused: %s (%s)", a.version, WRK_E_SYNC_BUSY, why);
    atomic_fetch_add(&s->w->syncs_failed, 1);
    if (msg_send(reply, NULL, MSG_SYNC_ACK, m->id, &a, NULL) != 0)
        wrk_log(s->w, "cannot send the SYNC_ACK of v%" PRIu64 ": %s", a.version, zmq_strerror(errno));
}

void wrk_syncer_submit(wrk_syncer_t *s, wire_msg_t *m, void *reply) {
    /* A broker sends one SYNC per version and reports a worker that did
     * not ack in time, so a queue this deep is a broker that sends
     * without end (or a trainer far ahead of this worker): each waiting
     * SYNC holds its message, inline tensors and all. */
    size_t bytes = 0, waiting = reel_thread_backlog(s->th), held = atomic_load(&s->inline_bytes);
    for (int i = 0; i < m->n_tensors; i++) bytes += m->t[i].bytes;
    const tdit_config_t *cfg = tdit_model_config(s->w->model);
    /* twice the model in F32: two whole versions by value (the broker sends none: only a peer that sends
     * weights inline itself); one alone is always taken, and judged */
    const size_t most_bytes = 2 * (size_t)tdit_config_params(cfg) * sizeof(float);
    char why[192] = "";
    if (waiting >= WRK_SYNC_WAITING_MAX)
        snprintf(why, sizeof why, "%zu SYNCs wait already, at most %d", waiting, WRK_SYNC_WAITING_MAX);
    else if (waiting > 0 && held + bytes > most_bytes)
        snprintf(why, sizeof why, "the SYNCs waiting hold %zu bytes of inline weights, this one %zu more: at most "
                 "%zu, twice the model in F32", held, bytes, most_bytes);
    if (why[0]) {
        refuse_busy(s, m, reply, why);
        free_msg(&m);
        return;
    }
    /* Not acked when it fails (freed by sync_discard): the broker's
     * deadline reports it. */
    sync_item_t *it = malloc(sizeof *it);
    if (!it) {
        wrk_log(s->w, "out of memory: a SYNC dropped");
        free_msg(&m);
        return;
    }
    it->m = m;
    it->epoch = atomic_load(&s->w->epoch);
    it->bytes = bytes;
    atomic_fetch_add(&s->inline_bytes, bytes);
    if (reel_thread_post(s->th, it) != 0) wrk_log(s->w, "%s: a SYNC dropped", reel_err_text()); /* discarded */
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
