/* wrk_main.c -- reel-worker: serves denoising requests from the broker on
 * one device (docs/PROTOCOL.md, "Worker <-> broker").
 *
 * The main thread owns every socket that talks to the broker: one DEALER
 * (routing id = --name), heartbeats both ways, reconnect with backoff when
 * the broker falls silent, REQUEST checking, EVENTS batching, and the PULL
 * end of the pipe through which stream and sync threads hand it finished
 * messages. SIGINT/SIGTERM: send what events are pending and DISCONNECT,
 * abandon requests in flight (the broker requeues them), exit 0. With keys
 * (--key/--broker-key or $REEL_KEY/$REEL_BROKER_KEY) the DEALER speaks
 * CURVE; a SYNC's weights are read only under the weights roots
 * (wrk_weights.h). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "base/error.h"
#include "schema/msg.h"
#include "base/notify.h"
#include "net/http.h"
#include "base/sha256.h"
#include "model/release.h"
#include "model/tdit_program.h"
#include "model/lora.h"
#include "kernels/ops.h"
#include "worker/wrk.h"
#include "worker/wrk_executor.h"
#include "model/t2v.h"
#include "worker/wrk_pipe.h"
#include "worker/wrk_request.h"
#include "worker/wrk_sync.h"

#define BACKOFF_MIN_MS 1000
#define BACKOFF_MAX_MS 8000
#define EVENTS_MAX_PENDING 4096
#define SHUTDOWN_LINGER_MS 500       /* time DISCONNECT gets to leave */
#define DRAIN_MAX 256                /* messages handled per socket per wakeup */

/* ---- signals: a self-pipe the poll loop watches ---------------------------- */

static int g_sig_pipe[2] = { -1, -1 };

static void on_signal(int sig) {
    (void)sig;
    int e = errno;
    char c = 1;
    ssize_t r = write(g_sig_pipe[1], &c, 1); /* full pipe: a wakeup is already pending */
    (void)r;
    errno = e;
}

static int install_signals(void) {
    if (pipe2(g_sig_pipe, O_NONBLOCK | O_CLOEXEC) != 0) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) || sigaction(SIGTERM, &sa, NULL)) return -1;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* ---- the link to the broker ------------------------------------------------ */

typedef struct {
    wrk_t *w;
    wrk_exec_t *exec;
    wrk_syncer_t *sync;
    void *dealer;                /* NULL while waiting to reconnect */
    void *pull;
    wrk_pipe_held_t held;        /* a pipe message the DEALER could not take yet (wrk_pipe_forward) */
    wrk_events_held_t ev_held;   /* an EVENTS the DEALER could not take yet (wrk_events_flush): kept
                                  * across reconnects, the catalog's whichever broker records it */
    int64_t heard;               /* last message from the broker */
    int64_t quiet_until;         /* a large REQUEST is on its way (HEARTBEAT "incoming"): no reconnect before */
    int64_t next_hb, next_events, reconnect_at;
    int64_t next_artifacts;      /* the next snapshot of the artifact keys */
    int backoff_ms;
    int round_from;              /* --broker's index where this round of moves began: the last that served */
    reel_http_t *http;           /* --metrics; NULL without */
    int64_t next_publish;
    bool prewarmed;              /* a PREWARM came: READY asks for none again */
    int64_t ready_at;            /* when the last READY went */
    bool heard_since_ready;      /* the broker sent something but RECONNECT since */
    bool registered;             /* ... and not only ERRORs (a standby's): it serves this worker */
} link_t;

/* ---- live metrics and health (--metrics; net/http.h) ------------------------------ */

static void prom_reasons(reel_text_t *t, const char *name, const char *help, const uint64_t *v, int n,
                         const char *(*reason)(int)) {
    reel_prom_family(t, name, "counter", help);
    for (int i = 0; i < n; i++) {
        char lb[96];
        snprintf(lb, sizeof lb, "reason=\"%s\"", reason(i));
        reel_prom_sample(t, name, lb, (double)v[i]);
    }
}

static const char *decline_name(int i) { return cap_reason_name((cap_reason_t)i); }
static const char *evict_name(int i) { return cap_evict_reason_name((cap_evict_reason_t)i); }

static void render_metrics(link_t *l, reel_text_t *t) {
    wrk_t *w = l->w;
    cap_stats_t st;
    cap_cache_stats(w->cache, &st);
    reel_prom_family(t, "reel_worker_captures_total", "counter", "Graphs captured and verified.");
    reel_prom_sample(t, "reel_worker_captures_total", "", (double)st.captures);
    reel_prom_family(t, "reel_worker_prewarm_captures_total", "counter",
                     "Of the captures, those a prewarm asked for (--prewarm) before any request of the key.");
    reel_prom_sample(t, "reel_worker_prewarm_captures_total", "", (double)st.prewarm_captures);
    {
        /* the attention path and why, as labels (quotes and backslashes made harmless) */
        char reason[sizeof w->attention], lb[sizeof w->attention + 96];
        const char *c = strstr(w->attention, "): ");
        snprintf(reason, sizeof reason, "%s", c ? c + 3 : w->attention);
        for (char *q = reason; *q; q++)
            if (*q == '"' || *q == '\\' || *q == '\n') *q = '\'';
        snprintf(lb, sizeof lb, "path=\"%s\",mode=\"%s\",reason=\"%s\"", w->attention_fused ? "fused" : "decomposed",
                 kern_attention_mode_name(kern_attention_mode()), reason);
        reel_prom_family(t, "reel_worker_attention_info", "gauge",
                         "The attention path for Wan's head shape (d 128, 32760 tokens) in this worker's dtype, its mode and why.");
        reel_prom_sample(t, "reel_worker_attention_info", lb, 1);
        reel_prom_family(t, "reel_worker_attention_fallbacks_total", "counter",
                         "Attention calls whose fused SDPA failed and ran the decomposition instead.");
        reel_prom_sample(t, "reel_worker_attention_fallbacks_total", "", (double)kern_attention_sdpa_fallbacks());
    }
    {
        /* samples per step, as a histogram over 1, 2, 4, ... 64 */
        reel_prom_family(t, "reel_worker_step_samples", "histogram",
                         "Denoising steps by the samples each ran (a batched group's step counts its batch).");
        uint64_t counts[WRK_SAMPLE_BUCKETS + 1], sum, cum = 0;
        char lb[32];
        wrk_step_samples_read(w, counts, &sum);
        for (int i = 0; i <= WRK_SAMPLE_BUCKETS; i++) {
            cum += counts[i];
            if (i < WRK_SAMPLE_BUCKETS) snprintf(lb, sizeof lb, "le=\"%lld\"", (long long)wrk_step_sample_bound(i));
            else snprintf(lb, sizeof lb, "le=\"+Inf\"");
            reel_prom_sample(t, "reel_worker_step_samples_bucket", lb, (double)cum);
        }
        reel_prom_sample(t, "reel_worker_step_samples_sum", "", (double)sum);
        reel_prom_sample(t, "reel_worker_step_samples_count", "", (double)cum);
    }
    reel_prom_family(t, "reel_worker_mixed_steps_total", "counter",
                     "Steps that ran several requests together as one batch (--max-batch).");
    reel_prom_sample(t, "reel_worker_mixed_steps_total", "", (double)atomic_load(&w->mixed_steps));
    reel_prom_family(t, "reel_worker_batch_padded_rows_total", "counter",
                     "Rows of mixed steps computed for no request (--batch-sizes ladder pads to the next size).");
    reel_prom_sample(t, "reel_worker_batch_padded_rows_total", "", (double)atomic_load(&w->padded_rows));
    reel_prom_family(t, "reel_worker_replays_total", "counter", "Steps served by graph replay.");
    reel_prom_sample(t, "reel_worker_replays_total", "", (double)st.replays);
    reel_prom_family(t, "reel_worker_eager_steps_total", "counter", "Steps run eagerly (warmup, declines, captures).");
    reel_prom_sample(t, "reel_worker_eager_steps_total", "", (double)st.eager_runs);
    prom_reasons(t, "reel_worker_declines_total", "Calls declined to eager, by reason.", st.declines,
                 CAP_DECLINE_COUNT, decline_name);
    uint64_t graph_ev[CAP_EVICT_COUNT]; /* an entry evicted while warming up freed no graph */
    for (int i = 0; i < CAP_EVICT_COUNT; i++) graph_ev[i] = cap_graph_evictions(&st, i);
    prom_reasons(t, "reel_worker_evictions_total", "Graphs evicted, by reason.", graph_ev, CAP_EVICT_COUNT,
                 evict_name);
    reel_prom_family(t, "reel_worker_audits_total", "counter", "Replays audited against an eager run.");
    reel_prom_sample(t, "reel_worker_audits_total", "", (double)st.audits);
    reel_prom_family(t, "reel_worker_audit_mismatches_total", "counter",
                     "Audits that found replay != eager (the graph was evicted).");
    reel_prom_sample(t, "reel_worker_audit_mismatches_total", "", (double)st.declines[CAP_DECLINE_AUDIT_MISMATCH]);
    reel_prom_family(t, "reel_worker_graph_bytes", "gauge", "Bytes of live graphs.");
    reel_prom_sample(t, "reel_worker_graph_bytes", "", (double)st.graph_bytes);
    reel_prom_family(t, "reel_worker_workspace_bytes", "gauge", "Bytes of live step workspaces.");
    reel_prom_sample(t, "reel_worker_workspace_bytes", "", (double)st.ws_bytes);
    reel_prom_family(t, "reel_worker_budget_bytes", "gauge", "--budget: graph + workspace bytes allowed (0: no limit).");
    reel_prom_sample(t, "reel_worker_budget_bytes", "", (double)w->opt->budget);
    reel_prom_family(t, "reel_worker_graphs", "gauge", "Live graphs.");
    reel_prom_sample(t, "reel_worker_graphs", "", (double)st.graphs);
    reel_prom_family(t, "reel_worker_step_seconds", "histogram",
                     "A step's wall time through the capture cache, by how it ran (bind + run + copy-out).");
    reel_prom_hist(t, "reel_worker_step_seconds", "ran=\"eager\"", &st.eager_hist);
    reel_prom_hist(t, "reel_worker_step_seconds", "ran=\"replayed\"", &st.replay_hist);
    reel_prom_family(t, "reel_worker_capture_seconds", "histogram", "Capture + verify wall time of a graph.");
    reel_prom_hist(t, "reel_worker_capture_seconds", "", &st.capture_hist);
    reel_prom_family(t, "reel_worker_syncs_total", "counter",
                     "Weight syncs this worker applied, and those it refused or failed (their reasons: its log).");
    reel_prom_sample(t, "reel_worker_syncs_total", "result=\"applied\"", (double)atomic_load(&w->syncs_applied));
    reel_prom_sample(t, "reel_worker_syncs_total", "result=\"failed\"", (double)atomic_load(&w->syncs_failed));
    reel_prom_family(t, "reel_worker_sync_apply_seconds_total", "counter",
                     "Seconds of the applied syncs: read + hash (or fetch), drain, reload.");
    reel_prom_sample(t, "reel_worker_sync_apply_seconds_total", "", (double)atomic_load(&w->sync_us) / 1e6);
    reel_prom_family(t, "reel_worker_inflight", "gauge", "Requests queued or running, per stream.");
    for (int i = 0; i < wrk_exec_streams(l->exec); i++) {
        char lb[32];
        snprintf(lb, sizeof lb, "stream=\"%d\"", i);
        reel_prom_sample(t, "reel_worker_inflight", lb, wrk_exec_stream_load(l->exec, i));
    }
    reel_prom_family(t, "reel_worker_weight_version", "gauge", "The weight version applied, per component.");
    reel_prom_sample(t, "reel_worker_weight_version", "component=\"" TDIT_COMPONENT "\"",
                     (double)atomic_load(&w->applied_version));
}

/* Renders and publishes every REEL_HTTP_PUBLISH_MS: healthy while the main
 * loop runs and the weights are usable; ready while registered with a
 * broker that answers. */
static void publish_metrics(link_t *l, int64_t now, int64_t silent_ms) {
    if (!l->http || now < l->next_publish) return;
    l->next_publish = now + REEL_HTTP_PUBLISH_MS;
    wrk_t *w = l->w;
    reel_text_t t = { 0 };
    render_metrics(l, &t);
    bool healthy = !atomic_load(&w->fatal);
    /* (a new connection counts as heard, for its liveness: only a broker
     * that answered this connection's READY makes the worker ready) */
    bool ready = healthy && l->dealer && l->registered && (now - l->heard < silent_ms || now < l->quiet_until);
    const char *why = !healthy ? "the weights are unusable (exiting)"
                    : !l->dealer ? "not connected to the broker (reconnecting)"
                    : !l->registered ? "no broker has answered its READY yet (connecting)"
                    : !ready ? "the broker has not answered within the heartbeat liveness"
                             : NULL;
    if (!t.failed && reel_http_publish(l->http, t.p, t.n, healthy, ready, why) != 0)
        wrk_log(w, "metrics: %s", reel_err_text());
    reel_text_free(&t);
}

static void log_cache(void *user, int level, const char *msg) {
    if (level >= 1) wrk_log(user, "%s%s", level >= 2 ? "warning: " : "", msg);
}

/* ---- kernel artifacts (docs/ARTIFACTS.md): what goes to the catalog ---- */

#define ARTIFACTS_REPORT_MS 10000 /* every key's counters are sent this often */

/* FNV-1a of a and b, never 0 (EVENTS entries need a key_hash). */
static uint64_t art_hash(const char *a, const char *b) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = a; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;
    for (const char *p = b; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h | 1;
}

/* src as a name of the protocol's alphabet (a bundle's directory name may
 * hold anything): other bytes become '_', at most MSG_NAME_MAX - 1. */
static void art_name(char dst[MSG_NAME_MAX], const char *src) {
    size_t n = 0;
    for (; src[n] && n < MSG_NAME_MAX - 1; n++)
        dst[n] = reel_name_char(src[n]) ? src[n] : '_';
    dst[n] = '\0';
    if (!n) snprintf(dst, MSG_NAME_MAX, "-");
}

/* One EVENTS entry per bundle scanned: the catalog's artifacts table. */
static void push_bundles(wrk_t *w, kern_artifacts_t *set) {
    for (size_t i = 0; i < kern_artifacts_count(set); i++) {
        kern_art_bundle_t b = kern_artifacts_bundle(set, i);
        msg_event_t ev;
        memset(&ev, 0, sizeof ev);
        snprintf(ev.kind, sizeof ev.kind, "artifact");
        art_name(ev.component, b.parsed ? b.m->id : b.bundle);
        ev.key = "";
        ev.key_hash = art_hash(ev.component, "");
        ev.count = 1;
        snprintf(ev.reason, sizeof ev.reason, "%s", !b.verified ? "refused" : b.loaded ? "loaded" : "verified");
        if (b.parsed) {
            art_name(ev.version, b.m->version);
            snprintf(ev.op, sizeof ev.op, "%s", kern_op_name(b.m->op));
            snprintf(ev.backend, sizeof ev.backend, "%s", kern_backend_kind_name(b.m->backend));
            for (int f = 0; f < b.m->n_files; f++)
                if (!strcmp(b.m->files[f].name, b.m->object))
                    snprintf(ev.sha256, sizeof ev.sha256, "%s", b.m->files[f].sha256);
        } else {
            snprintf(ev.version, sizeof ev.version, "-");
            snprintf(ev.op, sizeof ev.op, "-");
            snprintf(ev.backend, sizeof ev.backend, "-");
        }
        ev.verified = b.verified;
        ev.enabled = b.enabled;
        snprintf(ev.detail, sizeof ev.detail, "%s", b.error);
        wrk_events_push(w->events, &ev);
    }
}

/* One EVENTS entry for an artifact at a kernel key: the artifact_keys table. */
static void push_key(wrk_t *w, const kern_art_key_stats_t *k) {
    msg_event_t ev;
    memset(&ev, 0, sizeof ev);
    snprintf(ev.kind, sizeof ev.kind, "artifact_key");
    art_name(ev.component, k->id);
    ev.key = k->key;
    ev.key_hash = art_hash(k->id, k->key);
    snprintf(ev.reason, sizeof ev.reason, "%s", kern_art_state_name(k->state));
    snprintf(ev.detail, sizeof ev.detail, "%s", k->reason);
    ev.count = k->n.calls;
    ev.native = k->n.native_calls;
    ev.pass = k->n.parity_pass;
    ev.fail = k->n.parity_fail;
    ev.fallbacks = k->n.fallbacks;
    ev.timed = k->n.timed;
    ev.speedup = k->n.artifact_s > 0 ? k->n.native_s / k->n.artifact_s : 0;
    ev.speedup_sd = k->n.speedup_sd;
    ev.sync_timed = k->n.sync_timed;
    ev.sync_s = k->n.sync_s;
    wrk_events_push(w->events, &ev);
}

#define ARTIFACT_KEYS_MAX 1024 /* keys sent per snapshot */

/* The keys of the installed set, on the heap (a stream thread's stack is
 * no place for them); NULL when none or out of memory. */
static kern_art_key_stats_t *artifact_keys(size_t *n) {
    kern_artifacts_t *set = kern_artifacts_installed();
    kern_art_key_stats_t *ks = set ? malloc(ARTIFACT_KEYS_MAX * sizeof *ks) : NULL;
    *n = ks ? kern_artifacts_keys(set, ks, ARTIFACT_KEYS_MAX) : 0;
    if (*n > ARTIFACT_KEYS_MAX) *n = ARTIFACT_KEYS_MAX;
    return ks;
}

/* Every key of the installed set (the periodic and the final snapshot). */
static void push_keys(wrk_t *w) {
    size_t n;
    kern_art_key_stats_t *ks = w->events ? artifact_keys(&n) : NULL;
    for (size_t i = 0; ks && i < n; i++) push_key(w, &ks[i]);
    free(ks);
}

/* Artifact verdicts, as they happen: logged, and sent with the key's
 * counters. Runs on a stream thread with no artifact lock held. */
static void log_artifact(void *user, const kern_art_event_t *ev) {
    static const char *const what[] = { "promoted", "demoted", "failed", "ineligible" };
    wrk_t *w = user;
    wrk_log(w, "artifact %s %s at %s%s%s", ev->id, what[ev->kind], ev->key,
            ev->reason[0] ? ": " : "", ev->reason);
    size_t n;
    kern_art_key_stats_t *ks = w->events ? artifact_keys(&n) : NULL;
    for (size_t i = 0; ks && i < n; i++)
        if (!strcmp(ks[i].id, ev->id) && !strcmp(ks[i].key, ev->key)) push_key(w, &ks[i]);
    free(ks);
}

/* --broker A[,B,...] into w->brokers. -1 (logged) on an empty one or too many. */
static int split_brokers(wrk_t *w) {
    const char *p = w->opt->broker;
    atomic_init(&w->broker_at, 0);
    for (w->n_brokers = 0;;) {
        size_t n = strcspn(p, ",");
        bool known = (n > 6 && !strncmp(p, "tcp://", 6)) || (n > 6 && !strncmp(p, "ipc://", 6)) ||
                     (n > 9 && !strncmp(p, "inproc://", 9));
        if (n == 0 || n >= sizeof w->brokers[0] || w->n_brokers == WRK_MAX_BROKERS ||
            (!known && (w->n_brokers > 0 || p[n]))) { /* a list: each one checked now, not at a move */
            wrk_log(w, "--broker '%s': give 1 to %d endpoints (tcp://, ipc:// or inproc://) of under %zu bytes, "
                    "separated by commas", w->opt->broker, WRK_MAX_BROKERS, sizeof w->brokers[0]);
            return -1;
        }
        memcpy(w->brokers[w->n_brokers], p, n);
        w->brokers[w->n_brokers++][n] = '\0';
        if (!p[n]) return 0;
        p += n + 1;
    }
}

static void *dealer_new(wrk_t *w) {
    void *s = zmq_socket(w->zctx, ZMQ_DEALER);
    if (!s) return NULL;
    int zero = 0;
    char ep[1024];
    if (wire_socket_limits(s) != 0 || reel_curve_apply(s, w->curve) != 0 ||
        wire_socket_endpoint(s, w->brokers[atomic_load(&w->broker_at)], ep, sizeof ep) != 0 ||
        zmq_setsockopt(s, ZMQ_ROUTING_ID, w->opt->name, strlen(w->opt->name)) != 0 ||
        /* Sends never wait for a broker that is gone: they fail with EAGAIN. */
        zmq_setsockopt(s, ZMQ_SNDTIMEO, &zero, sizeof zero) != 0 ||
        zmq_connect(s, ep) != 0) {
        int e = errno;
        zmq_close(s);
        errno = e;
        return NULL;
    }
    return s;
}

/* This process's id for READY's boot: random, nonzero, the same for every
 * READY it sends (a broker restart makes it READY again, as the same
 * process; a new process is a restart, its graphs gone). */
static uint64_t process_boot(void) {
    static uint64_t boot;
    while (!boot) {
        uint64_t v = 0;
        if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
            v = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ (uint64_t)wrk_mono_ms();
        boot = v;
    }
    return boot;
}

/* Sends a message without tensors to the broker. -1 while disconnected. */
static int send_msg(link_t *l, msg_type_t type, const void *body) {
    if (!l->dealer) {
        errno = ENOTCONN;
        return -1;
    }
    return msg_send(l->dealer, NULL, type, 0, body, NULL);
}

static int send_ready(link_t *l) {
    wrk_t *w = l->w;
    const wrk_opts_t *o = w->opt;
    const tdit_config_t *cfg = tdit_model_config(w->model);
    char models[1][MSG_NAME_MAX];
    msg_model_t config;
    msg_ready_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "%s", o->name);
    snprintf(r.device, sizeof r.device, "%s", kern_backend_device_name(w->backend));
    snprintf(r.arch, sizeof r.arch, "%s", kern_backend_arch(w->backend));
    r.streams = (uint64_t)o->streams;
    r.budget = o->budget;
    r.max_inflight = (uint64_t)o->max_inflight;
    snprintf(models[0], sizeof models[0], "%s", cfg->name);
    r.models = models;
    r.n_models = 1;
    wrk_model_info(cfg, &config);
    r.configs = &config;
    r.n_configs = 1;
    /* The solvers beyond Euler it runs: the broker routes a GEN naming one
     * only to workers that said so (an older worker would ignore the field
     * and answer Euler's result); "sde-unipc" and "sde-dpm++": SDE
     * rollouts on those grids (an older worker would refuse them). */
    static const char solvers[4][MSG_NAME_MAX] = { "unipc", "dpm++", "sde-unipc", "sde-dpm++" };
    r.solvers = solvers;
    r.n_solvers = 4;
    /* What else it does: prompts in, frames and videos out. */
    if (w->text) snprintf(r.text_encoder, sizeof r.text_encoder, "%s", t2v_text_name(w->text));
    if (w->vae) snprintf(r.vae, sizeof r.vae, "%s", t2v_vae_name(w->vae));
    r.versions.n = 1;
    snprintf(r.versions.e[0].name, sizeof r.versions.e[0].name, "%s", TDIT_COMPONENT);
    r.versions.e[0].n = atomic_load(&w->applied_version);
    /* The hot keys it will own, asked until a PREWARM comes (once) */
    r.prewarm = l->prewarmed ? 0 : (uint64_t)o->prewarm;
    r.max_tokens = o->max_tokens > 0 ? (uint64_t)o->max_tokens : 0;
    r.boot = process_boot();
    l->ready_at = wrk_mono_ms();
    l->heard_since_ready = false;
    l->registered = false;
    return send_msg(l, MSG_READY, &r);
}

/* Sends the pending events, WRK_EVENTS_PER_MSG per EVENTS message. One
 * the broker's connection cannot take (its queue full: a broker stalled
 * or busy) is held and goes first next time; before, the events taken
 * for it were lost, and counted nowhere. */
static void flush_events(link_t *l) {
    if (!l->dealer) return;
    (void)wrk_events_flush(l->w->events, l->dealer, &l->ev_held, 64);
}

/* A new broker session: requests of the old one are abandoned (the broker
 * requeued them when it gave up on us, or never knew them). */
static void new_session(link_t *l) { atomic_fetch_add(&l->w->epoch, 1); }

/* Closes the DEALER: a new session starts at reconnect_at, on the next
 * endpoint of --broker when it lists two (a standby pair: at once while
 * there is one not tried since the last broker that served, with the
 * backoff once all were). why: the log line's reason. */
static void drop_link(link_t *l, int64_t now, const char *why) {
    wrk_t *w = l->w;
    const char *was = w->brokers[atomic_load(&w->broker_at)];
    zmq_close(l->dealer);
    l->dealer = NULL;
    wrk_pipe_held_clear(&l->held); /* the session's: the broker requeues its requests */
    l->quiet_until = 0; /* (a heads-up was this connection's) */
    new_session(l);
    int next = (atomic_load(&w->broker_at) + 1) % w->n_brokers;
    atomic_store(&w->broker_at, next);
    if (w->n_brokers > 1 && next != l->round_from) {
        wrk_log(w, "reconnecting: %s at %s: trying %s", why, was, w->brokers[next]);
        l->reconnect_at = now;
        return;
    }
    /* Silence is all a refused CURVE handshake gives: say where to look. */
    const reel_curve_t *cv = w->curve;
    wrk_log(w, "reconnecting: %s at %s; %s in %d ms%s", why, was, w->brokers[next], l->backoff_ms,
            cv && cv->on ? " (with keys: check --broker-key is the broker's, and that the broker lists this "
                           "worker's public key with the worker role)"
                         : "");
    l->reconnect_at = now + l->backoff_ms;
    l->backoff_ms = l->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : l->backoff_ms * 2;
}

static void start_reconnect(link_t *l, int64_t now) {
    char why[512], hint[256] = "";
    /* Never answered since READY: the broker routes to workers by name
     * (the DEALER's routing id), and ZeroMQ drops a second peer whose id
     * a live one holds, without a word to either: the likeliest cause. */
    if (!l->heard_since_ready)
        snprintf(hint, sizeof hint, " (no answer to READY: the broker is not listening there, or another worker named "
                                    "'%s' is connected to it: ZeroMQ drops a second peer under a live one's name)",
                 l->w->opt->name);
    snprintf(why, sizeof why, "nothing from the broker for %lld ms%s", (long long)(now - l->heard), hint);
    drop_link(l, now, why);
}

/* (Re)creates the DEALER and introduces the worker. -1 when the socket
 * cannot be made (an endpoint ZeroMQ rejects). */
static int connect_broker(link_t *l, int64_t now) {
    if (!(l->dealer = dealer_new(l->w))) {
        wrk_log(l->w, "cannot connect to %s: %s", l->w->brokers[atomic_load(&l->w->broker_at)], zmq_strerror(errno));
        return -1;
    }
    if (send_ready(l) != 0) wrk_log(l->w, "cannot send READY: %s", zmq_strerror(errno));
    l->heard = now;
    l->next_hb = now + l->w->opt->heartbeat_ms;
    return 0;
}

/* A prompt needs the text encoder, a decoded output the VAE (the broker
 * routes neither here without them; an older broker might). */
static int media_fits(const wrk_t *w, const msg_gen_t *r, wire_err_t *err) {
    const char *why = r->prompt && *r->prompt && !w->text ? "a 'prompt': this worker has no text encoder (--t5)"
                      : msg_gen_decodes(r) && !w->vae   ? "a decoded 'output': this worker has no VAE (--vae)"
                                                        : NULL;
    if (!why) return 0;
    snprintf(err->code, sizeof err->code, "%s", WIRE_E_BAD_REQUEST);
    snprintf(err->message, sizeof err->message, "%s", why);
    return -1;
}

/* Whether the tensors request r would keep (*bytes) fit beside those
 * the held REQUESTs keep, within --max-held-mb: else busy (or too_large,
 * for one larger than the bound alone: it never fits), before a byte of
 * them is copied. Each held one keeps its bytes until its job ends. */
static int held_bytes_fit(wrk_t *w, const msg_gen_t *r, size_t *bytes, wire_err_t *err) {
    *bytes = wrk_request_bytes(r, tdit_model_config(w->model));
    if (!w->held_max) return 0;
    const size_t held = wrk_held_bytes(w);
    const double mib = 1024.0 * 1024.0;
    if (*bytes > w->held_max) {
        snprintf(err->code, sizeof err->code, "%s", WIRE_E_TOO_LARGE);
        snprintf(err->message, sizeof err->message,
                 "a request keeping %.1f MiB of tensors, more than worker %s's --max-held-mb %zu for all it holds",
                 (double)*bytes / mib, w->opt->name, w->held_max >> 20);
        return -1;
    }
    if (held + *bytes <= w->held_max) return 0;
    snprintf(err->code, sizeof err->code, "%s", WIRE_E_BUSY);
    snprintf(err->message, sizeof err->message,
             "worker %s holds %.1f MiB of requests' tensors, this one %.1f MiB more: at most --max-held-mb %zu, "
             "none more until one ends", w->opt->name, (double)held / mib, (double)*bytes / mib, w->held_max >> 20);
    return -1;
}

static void handle_request(link_t *l, wire_msg_t *m) {
    wrk_t *w = l->w;
    wrk_job_t *job = NULL;
    wire_err_t err;
    msg_gen_t r;
    /* Reel's broker sends at most max_inflight. The slack covers a job
     * still letting go of its hold when the broker, its RESULT in hand,
     * sends the next REQUEST, and an earlier session's requests ending
     * their step; past it only a broker that ignores max_inflight sends
     * more, and each would hold its tensors here. Refused before any of
     * them is copied. */
    const size_t held = wrk_holds(w), most = (size_t)WRK_HELD_PER_INFLIGHT * (size_t)w->opt->max_inflight;
    if (held >= most) {
        wrk_log_refused(w, "request %" PRIu64 " refused: %zu requests held already (%d x --max-inflight %d)", m->id,
                        held, WRK_HELD_PER_INFLIGHT, w->opt->max_inflight);
        msg_send_error(l->dealer, NULL, m->id, WIRE_E_BUSY,
                       "worker %s holds %zu requests, %d x its max_inflight %d: none more until one ends", w->opt->name,
                       held, WRK_HELD_PER_INFLIGHT, w->opt->max_inflight);
        return;
    }
    const tdit_config_t *cfg = tdit_model_config(w->model);
    size_t bytes = 0;
    if (msg_request_decode(m, &r, &err) != 0 || wrk_request_fits(&r, cfg, w->opt->max_tokens, &err) != 0 ||
        media_fits(w, &r, &err) != 0 || held_bytes_fit(w, &r, &bytes, &err) != 0 ||
        wrk_job_from_request(&r, m->id, cfg, atomic_load(&w->applied_version), &job, &err) != 0) {
        wrk_log_refused(w, "request %" PRIu64 " refused: %s", m->id, err.message);
        /* a field error names its type */
        msg_send_error(l->dealer, NULL, m->id, err.code, "%s%s", strcmp(err.code, WIRE_E_BAD_REQUEST) ? "" : "GEN: ",
                       err.message);
        return;
    }
    job->epoch = atomic_load(&w->epoch);
    if (wrk_hold_take(w, job, bytes) != 0) { /* a request no CANCEL could stop is not run */
        wrk_log_refused(w, "request %" PRIu64 " refused: %s", m->id, reel_err_text());
        msg_send_error(l->dealer, NULL, m->id, WIRE_E_INTERNAL, "%s", reel_err_text());
        wrk_job_free(&job);
        return;
    }
    wrk_exec_submit(l->exec, job);
}

/* --max-held-mb, or by default WRK_HELD_BYTES_PER_INFLIGHT x
 * --max-inflight x the most one request of the model keeps, in whole MiB
 * (the message of a refusal names it as a flag's value). */
static void set_held_max(wrk_t *w) {
    const wrk_opts_t *o = w->opt;
    const size_t most = wrk_request_bytes_most(tdit_model_config(w->model)), mib = (size_t)1 << 20;
    const size_t dflt = WRK_HELD_BYTES_PER_INFLIGHT * (size_t)o->max_inflight * most;
    const size_t mb = o->max_held_mb >= 0 ? (size_t)o->max_held_mb : (dflt + mib - 1) / mib;
    w->held_max = mb * mib;
    char bound[96] = "no bound on their tensors (--max-held-mb 0)";
    if (mb)
        snprintf(bound, sizeof bound, "%zu MiB of their tensors (--max-held-mb%s)", mb,
                 o->max_held_mb < 0 ? ", default" : "");
    wrk_log(w, "holds at most %d requests (%d x --max-inflight %d) and %s", WRK_HELD_PER_INFLIGHT * o->max_inflight,
            WRK_HELD_PER_INFLIGHT, o->max_inflight, bound);
}

/* PREWARM: the keys this worker will own that were hot lately, to
 * capture in the background (the streams, between their requests). Taken
 * once; a key this worker cannot run is logged and skipped. */
static void handle_prewarm(link_t *l, wire_msg_t *m) {
    wrk_t *w = l->w;
    wire_err_t err;
    msg_prewarm_t p;
    if (msg_prewarm_decode(m, &p, &err) != 0 || msg_prewarm_validate(&p, &err) != 0) {
        wrk_log_refused(w, "bad PREWARM: %s", err.message);
        msg_send_error(l->dealer, NULL, m->id, err.code, "PREWARM: %s", err.message);
        return;
    }
    if (l->prewarmed || !w->opt->prewarm) {
        wrk_log_refused(w, "PREWARM ignored: %s", l->prewarmed ? "one came already" : "--prewarm 0");
        return;
    }
    l->prewarmed = true;
    wrk_prewarm_t keys[MSG_MAX_PREWARM];
    int n = 0;
    for (size_t i = 0; i < p.n_keys && n < w->opt->prewarm; i++) {
        if (wrk_prewarm_from_key(&p.keys[i], tdit_model_config(w->model), w->opt->max_tokens, &keys[n], &err) != 0) {
            wrk_log(w, "prewarm: key %016llx skipped: %s", (unsigned long long)p.keys[i].key_hash, err.message);
            continue;
        }
        n++;
    }
    wrk_log(w, "prewarm: %d key%s of %zu to capture on each of %d stream%s", n, n == 1 ? "" : "s", p.n_keys,
            wrk_exec_streams(l->exec), wrk_exec_streams(l->exec) == 1 ? "" : "s");
    if (n && wrk_exec_prewarm(l->exec, keys, n) != 0) wrk_log(w, "prewarm: %s", reel_err_text());
}

/* Handles one message from the broker. Returns 1 when one was handled, 0
 * when none was waiting, -1 on a socket error. */
static int handle_broker(link_t *l) {
    wrk_t *w = l->w;
    wire_msg_t *m = calloc(1, sizeof *m);
    if (!m) return -1;
    wire_err_t err;
    int r = msg_recv(l->dealer, false, ZMQ_DONTWAIT, m, &err);
    if (r < 0) {
        int e = errno;
        free(m);
        return e == EAGAIN || e == EINTR ? 0 : -1;
    }
    /* Any message is a heartbeat. And any but a heads-up ends the wait a
     * heads-up began: one connection keeps order, so the REQUEST it
     * announced has come (or was never sent), and silence from here on is
     * the broker's again. */
    l->heard = wrk_mono_ms();
    l->quiet_until = 0;
    msg_type_t type = r == 0 ? msg_type(m) : MSG_UNKNOWN;
    /* (an ERROR standby is no broker that serves: the backoff keeps growing
     * while both of a pair refuse) */
    if (type != MSG_ERROR) {
        l->backoff_ms = BACKOFF_MIN_MS;
        l->round_from = atomic_load(&w->broker_at); /* it serves: a move from here tries the others first */
    }
    if (type != MSG_RECONNECT) l->heard_since_ready = true;
    if (type != MSG_RECONNECT && type != MSG_ERROR) l->registered = true;
    if (r == 1) {
        wrk_log_refused(w, "bad message from the broker: %s: %s", err.code, err.message);
        msg_send_error(l->dealer, NULL, m->id, err.code, "%s", err.message);
    } else if (type == MSG_REQUEST) {
        if (!atomic_load(&w->stop)) handle_request(l, m);
    } else if (type == MSG_SYNC) {
        wrk_syncer_submit(l->sync, m, l->dealer); /* the sync thread owns it now (or it was refused) */
        return 1;
    } else if (type == MSG_PREWARM) {
        if (!atomic_load(&w->stop)) handle_prewarm(l, m);
    } else if (type == MSG_CANCEL) {
        /* its stream drops the request before its next step (wrk_cancelled);
         * one of an id not held (answered already, or never sent) marks nothing */
        msg_cancel_t c;
        if (msg_cancel_decode(m, &c, &err) == 0) (void)wrk_cancel_note(w, m->id);
        else wrk_log_refused(w, "bad CANCEL from the broker: %s", err.message);
    } else if (type == MSG_HEARTBEAT) {
        /* counted above; "incoming": a large REQUEST follows, and nothing
         * else reaches us until it has: silence until then is no death */
        uint64_t in = msg_heartbeat_incoming(m);
        if (in > 0) { /* at most a frame's time: no broker makes us wait longer for one message */
            const uint64_t most = (uint64_t)WIRE_MAX_FRAME / MSG_SLOW_BYTES_PER_MS;
            l->quiet_until = wrk_mono_ms() + (int64_t)(in / MSG_SLOW_BYTES_PER_MS < most ? in / MSG_SLOW_BYTES_PER_MS : most);
        }
    } else if (type == MSG_RECONNECT) {
        /* A restarted broker answers RECONNECT to every message of the old
         * session that reaches it (a RESULT, an ack, a heartbeat) before it
         * reads our READY: those come after the READY went and before
         * anything the broker sends once it registered us (one connection
         * keeps order). Each one obeyed would register us again, and the
         * broker takes a second READY from a live worker for a restart: it
         * requeues what we run, and a request that sees two such losses
         * fails. So a RECONNECT is obeyed only once the broker said
         * something else since our READY, or after a liveness period
         * without (a READY it refused, or lost). */
        int64_t quiet = (int64_t)w->opt->heartbeat_ms * w->opt->liveness;
        if (!l->heard_since_ready && wrk_mono_ms() - l->ready_at < quiet) {
            wire_msg_close(m);
            free(m);
            return 1;
        }
        new_session(l);
        if (send_ready(l) != 0) wrk_log(w, "cannot send READY: %s", zmq_strerror(errno));
        wire_msg_close(m);
        free(m);
        return 1;
    } else if (type == MSG_ERROR) {
        msg_error_t *e = malloc(sizeof *e);
        bool standby = false;
        if (e && msg_error_decode(m, e, &err) == 0) {
            wrk_log_said(w, "broker says: %s: %s (id %" PRIu64 ")", e->code, e->message, m->id);
            standby = !strcmp(e->code, WIRE_E_STANDBY);
        }
        free(e);
        if (standby) { /* the standby of a pair: the other one serves */
            wire_msg_close(m);
            free(m);
            drop_link(l, wrk_mono_ms(), "the broker is the standby");
            return 1;
        }
    } else {
        msg_send_error(l->dealer, NULL, m->id, WIRE_E_UNKNOWN, "a worker does not handle '%.64s'", m->type);
    }
    wire_msg_close(m);
    free(m);
    return 1;
}

/* The poll loop. Returns the exit code. */
static int serve(link_t *l) {
    wrk_t *w = l->w;
    const int hb = w->opt->heartbeat_ms;
    const int64_t silent_ms = (int64_t)hb * w->opt->liveness;
    l->next_events = wrk_mono_ms() + w->opt->events_ms;
    for (;;) {
        if (atomic_load(&w->fatal)) return 1;
        int64_t now = wrk_mono_ms();
        int64_t wake = l->next_events;
        if (l->http && l->next_publish < wake) wake = l->next_publish;
        if (l->dealer) {
            if (l->next_hb < wake) wake = l->next_hb;
            const int64_t deaf = l->heard + silent_ms > l->quiet_until ? l->heard + silent_ms : l->quiet_until;
            if (deaf < wake) wake = deaf;
        } else if (l->reconnect_at < wake) {
            wake = l->reconnect_at;
        }
        /* While a message waits for room on the DEALER, the pipe waits
         * behind it (its order is the streams'), and room is polled for. */
        const bool held = l->held.np > 0;
        zmq_pollitem_t it[3] = {
            { NULL, g_sig_pipe[0], ZMQ_POLLIN, 0 },
            { l->pull, 0, held ? 0 : ZMQ_POLLIN, 0 },
            { l->dealer, 0, ZMQ_POLLIN | (held ? ZMQ_POLLOUT : 0), 0 },
        };
        /* Without a DEALER the pipe waits: its messages go out after READY. */
        int n = l->dealer ? 3 : 1;
        long timeout = wake > now ? (long)(wake - now) : 0;
        if (zmq_poll(it, n, timeout) < 0) {
            if (errno == EINTR) continue;
            wrk_log(w, "poll: %s", zmq_strerror(errno));
            return 1;
        }
        if (it[0].revents & ZMQ_POLLIN) return 0;
        if (n == 3 && (it[2].revents & ZMQ_POLLIN)) {
            int got = 0;
            for (int i = 0; i < DRAIN_MAX && l->dealer; i++) {
                int r = handle_broker(l);
                if (r < 0) wrk_log(w, "receive: %s", zmq_strerror(errno));
                if (r <= 0) break;
                got++;
            }
            /* The time spent handling what came is no silence of the
             * broker's (a 256 MiB REQUEST takes a while to check): heard
             * now. (A HEARTBEAT goes below when one is due.) */
            if (got && l->dealer) l->heard = wrk_mono_ms();
        }
        if (n == 3 && l->dealer && l->held.np && (it[2].revents & ZMQ_POLLOUT))
            wrk_pipe_retry(&l->held, l->dealer, atomic_load(&w->epoch));
        if (n == 3 && l->dealer && !l->held.np && (it[1].revents & ZMQ_POLLIN)) /* (the link may have dropped just above) */
            for (int i = 0; i < DRAIN_MAX; i++) {
                int f = wrk_pipe_forward(l->pull, l->dealer, atomic_load(&w->epoch), ZMQ_DONTWAIT, &l->held);
                if (f < 0 || f == 2) break;
            }
        now = wrk_mono_ms();
        if (l->dealer && now - l->heard >= silent_ms && now >= l->quiet_until) {
            start_reconnect(l, now);
        } else if (!l->dealer && now >= l->reconnect_at) {
            if (connect_broker(l, now) != 0) return 1;
        } else if (l->dealer && now >= l->next_hb) {
            if (send_msg(l, MSG_HEARTBEAT, NULL) != 0 && errno != EAGAIN)
                wrk_log(w, "cannot send HEARTBEAT: %s", zmq_strerror(errno));
            l->next_hb = now + hb;
            reel_notify("WATCHDOG=1"); /* systemd: the main loop is alive */
        }
        if (w->opt->artifacts && now >= l->next_artifacts) {
            push_keys(w);
            l->next_artifacts = now + ARTIFACTS_REPORT_MS;
        }
        if (now >= l->next_events) {
            flush_events(l);
            wrk_log_budgets_tick(w); /* a flood that stopped: its lines left out are told */
            l->next_events = now + w->opt->events_ms;
        }
        publish_metrics(l, now, silent_ms);
    }
}

/* ---- startup and shutdown ---------------------------------------------------- */

/* Loads the weights and their identity (the sha256 a sync announces),
 * each file read once: a Reel file, or a Wan2.1 release in any layout
 * wan_ckpt.h reads (the operator's path: symlinks followed, no FIFO). */
static tdit_model_t *load_model(wrk_t *w, char sha[65]) {
    const char *path = w->opt->weights;
    tdit_model_t *m = NULL;
    /* the operator's own file: the reason (the detail) says it all */
    st_file_t *f = wrk_weights_load(NULL, path, NULL, 0, &w->stop, sha);
    if (!f) wrk_log(w, "%s", reel_err()->detail);
    else if (wrk_weights_finite(f) != 0) wrk_log(w, "%s: %s", path, reel_err()->detail);
    else if (!(m = tdit_model_load_judged(w->backend, f, w->dtype))) wrk_log(w, "%s: %s", path, reel_err_text());
    if (m && w->opt->lora) { /* the base adapters merge from */
        w->base.file = f;
        w->base.version = w->opt->weights_version;
        snprintf(w->base.sha, sizeof w->base.sha, "%s", sha);
        f = NULL;
    }
    st_close(&f);
    return m;
}

/* --artifacts DIR: every bundle verified and reported (a refused one is
 * logged and never loaded; the worker serves with native kernels), the
 * allowlist applied, the enabled ones loaded and routed, before any stream
 * dispatches. An unknown or refused id in the allowlist, or a named bundle
 * that cannot be loaded, stops the start: 0, or 2. */
static int setup_artifacts(wrk_t *w, kern_artifacts_t **out) {
    const wrk_opts_t *o = w->opt;
    *out = NULL;
    if (!o->artifacts) return 0;
    kern_artifacts_t *set = kern_artifacts_scan(o->artifacts);
    if (!set) {
        wrk_log(w, "artifacts: %s", reel_err_text());
        return 2;
    }
    int rc = o->artifacts_enable ? kern_artifacts_enable_list(set, o->artifacts_enable)
                                 : kern_artifacts_enable(set, NULL, 0);
    if (rc == 0) {
        kern_artifacts_on_event(set, log_artifact, w);
        rc = kern_artifacts_install(set, o->artifact_timing);
    }
    for (size_t i = 0; i < kern_artifacts_count(set); i++) {
        kern_art_bundle_t b = kern_artifacts_bundle(set, i);
        if (b.error[0]) wrk_log(w, "artifact refused: %s", b.error);
        else wrk_log(w, "artifact %s %s: verified%s", b.m->id, b.m->version,
                     b.loaded ? ", loaded" : ", not enabled");
    }
    if (rc != 0) {
        wrk_log(w, "%s", reel_err_text());
        kern_artifacts_destroy(&set);
        return 2;
    }
    *out = set;
    return 0;
}

/* The text encoder and the VAE: by flag, else a release folder's parts
 * when --weights is one. Their bytes and the prompt cache's bound count
 * against --budget: the cache gets what is left. -1 with a logged message
 * (a usage error: exit 2). */
static int open_media(wrk_t *w, size_t *cache_budget) {
    const wrk_opts_t *o = w->opt;
    release_parts_t rel;
    memset(&rel, 0, sizeof rel);
    struct stat st;
    if (stat(o->weights, &st) == 0 && S_ISDIR(st.st_mode) && release_find(o->weights, &rel) != 0) rel.t5[0] = 0;
    /* each by its flag, else the folder's: a release folder may supply
     * either half (as reelctl run takes them) */
    const char *t5 = o->t5 ? o->t5 : rel.t5[0] ? rel.t5 : NULL;
    const char *tok = o->tokenizer ? o->tokenizer : rel.tokenizer[0] ? rel.tokenizer : NULL;
    if (!t5 != !tok) {
        if (o->t5 || o->tokenizer) {
            wrk_log(w, "%s needs its %s: %s (or --weights on a release folder holding %s)",
                    o->t5 ? "--t5" : "--tokenizer", o->t5 ? "tokenizer" : "text encoder",
                    o->t5 ? "--tokenizer PATH (spiece.model or its folder)" : "--t5 FILE", o->t5 ? RELEASE_TOKENIZER_DIR "/" : RELEASE_T5_NAME);
            return -1;
        }
        char why[3 * PATH_MAX];
        release_text_missing(o->weights, &rel, why, sizeof why);
        wrk_log(w, "warning: %s holds %s but no %s: no text encoder, GENs with a prompt are not routed here "
                "(give --t5 FILE and --tokenizer PATH): %s", o->weights, t5 ? t5 : tok,
                t5 ? "tokenizer (" RELEASE_TOKENIZER_DIR "/spiece.model, or a pipeline's " RELEASE_DIFFUSERS_TOKENIZER
                     "/spiece.model)"
                   : "text encoder (" RELEASE_T5_NAME ", or a pipeline's " RELEASE_DIFFUSERS_T5 "/)", why);
        t5 = tok = NULL;
    }
    const char *vae = o->vae ? o->vae : rel.vae[0] ? rel.vae : NULL;
    const tdit_config_t *cfg = tdit_model_config(w->model);
    if (t5 && !(w->text = t2v_text_new(w->backend, t5, tok, cfg->text_len, cfg->text_dim, o->text_cache))) {
        wrk_log(w, "%s", reel_err_text());
        return -1;
    }
    if (vae && !(w->vae = t2v_vae_new(w->backend, vae, cfg->in_channels))) {
        wrk_log(w, "%s", reel_err_text());
        return -1;
    }
    size_t base = w->base.file ? st_data_len(w->base.file) : 0;
    size_t used = (w->text ? t2v_text_bytes(w->text) + o->text_cache : 0) + (w->vae ? t2v_vae_bytes(w->vae) : 0) + base;
    if (w->base.file)
        wrk_log(w, "LoRA syncs accepted: base v%" PRIu64 " kept for them (%zu bytes)", w->base.version, base);
    if (w->text) wrk_log(w, "text encoder %s (%s, tokenizer %s): prompts accepted", t2v_text_name(w->text), t5, tok);
    if (w->vae) wrk_log(w, "VAE %s (%s): frames and videos", t2v_vae_name(w->vae), vae);
    else if (w->text && !o->t5 && !o->tokenizer) { /* a release folder short of its VAE: say so, as for the text encoder */
        char dbuf[PATH_MAX];
        wrk_log(w, "no VAE: %s/ has no %s (nor Wan2.1_VAE.safetensors)%s%s%s (give --vae FILE): GENs asking for frames or "
                "a video are not routed here", release_dir(o->weights, dbuf), RELEASE_VAE_NAME, rel.pipeline ? " and no " : "",
                rel.pipeline ? RELEASE_DIFFUSERS_VAE : "", rel.pipeline ? "/" : "");
    }
    *cache_budget = o->budget;
    if (o->budget && used >= o->budget) {
        char parts[128] = "";
        if (w->text) snprintf(parts, sizeof parts, "the text encoder and its cache");
        if (w->vae) snprintf(parts + strlen(parts), sizeof parts - strlen(parts), "%sthe VAE", *parts ? ", " : "");
        if (base) snprintf(parts + strlen(parts), sizeof parts - strlen(parts), "%sthe LoRA base", *parts ? ", " : "");
        wrk_log(w, "--budget %zu bytes is used up by %s (%zu bytes)", o->budget, parts, used);
        return -1;
    }
    if (o->budget) *cache_budget = o->budget - used;
    return 0;
}

/* The weights roots and the keys, from the options. -1 (logged) on a bad
 * one: a usage error, exit 2. */
static int setup_access(wrk_t *w, wrk_roots_t *roots, reel_curve_t *curve) {
    const wrk_opts_t *o = w->opt;
    memset(roots, 0, sizeof *roots);
    int rc = 0;
    for (int i = 0; i < o->n_weights_dirs && rc == 0; i++) rc = wrk_roots_add(roots, o->weights_dirs[i]);
    if (rc == 0 && o->n_weights_dirs == 0) rc = wrk_roots_add_dir_of(roots, o->weights);
    if (rc != 0) {
        wrk_log(w, "%s", reel_err_text());
        return -1;
    }
    for (int i = 0; i < roots->n; i++) wrk_log(w, "syncs read weights under %s", roots->real[i]);
    if (reel_curve_resolve(o->key, o->broker_key, 1u << REEL_ROLE_WORKER, curve) != 0) {
        wrk_log(w, "keys: %s", reel_err_text());
        return -1;
    }
    if (curve->on) wrk_log(w, "CURVE: key %s, broker key %.8s...", curve->self.name, curve->server_key);
    w->roots = roots;
    w->curve = curve;
    return 0;
}

/* What run() builds, phase by phase, and tears down in one place. */
typedef struct {
    wrk_t w;
    link_t l;
    bool lock_ok;
    char sha[65];
    kern_artifacts_t *artifacts; /* --artifacts: installed until the graphs are gone */
} run_t;

/* The backend --backend asks for (CUDA falls back to the CPU unless
 * --no-fallback) and the dtype it computes in. -1 with a logged message. */
static int open_backend(run_t *r) {
    wrk_t *w = &r->w;
    const wrk_opts_t *o = w->opt;
    if (o->backend == KERN_BACKEND_CUDA) {
        w->backend = kern_backend_cuda_new(o->device);
        if (!w->backend && o->no_fallback) {
            wrk_log(w, "cuda unusable (%s), and --no-fallback was given", reel_err_text());
            return -1;
        }
        if (!w->backend) wrk_log(w, "cuda unusable (%s); using the CPU backend", reel_err_text());
    }
    if (!w->backend && !(w->backend = kern_backend_cpu_new())) {
        wrk_log(w, "%s", reel_err_text());
        return -1;
    }
    if (o->attention) {
        kern_attn_mode_t m = KERN_ATTN_MODE_AUTO;
        kern_attention_mode_parse(o->attention, &m); /* checked with the options */
        kern_attention_set_mode(m);
    }
    kern_backend_kind_t bk = kern_backend_kind(w->backend);
    if (bk == KERN_BACKEND_CPU) {
        /* one pool for every stream's kernels (kernels/cpu/cpu_pool.h) */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int threads = o->threads;
        if (threads == 0 && o->blas_threads > 0) threads = o->blas_threads;
        if (threads == 0 && o->blas_threads < 0) { /* the default pool, shared out over the streams */
            kern_cpu_threads_set(0);
            int def = kern_cpu_threads();
            threads = def > o->streams ? def / o->streams : 1;
        }
        if (o->blas_threads != 0) wrk_log(w, "--blas-threads is deprecated: it sets --threads %d", threads);
        kern_cpu_threads_set(threads);
        int pt = kern_cpu_threads();
        wrk_log(w, "CPU backend: %d stream%s sharing a pool of %d thread%s on %ld cores", o->streams,
                o->streams == 1 ? "" : "s", pt, pt == 1 ? "" : "s", cores);
    }
    w->dtype = o->bf16 ? KERN_BF16 : KERN_F32;
    if (o->bf16 && bk != KERN_BACKEND_CUDA) w->dtype = KERN_F32;
    kern_attention_describe(bk, w->dtype, w->attention, sizeof w->attention);
    w->attention_fused = kern_attention_choose(bk, w->dtype, 32760, 32760, 128, NULL) != KERN_ATTN_DECOMPOSED;
    wrk_log(w, "%s", w->attention);
    if (o->bf16 && kern_backend_kind(w->backend) != KERN_BACKEND_CUDA) {
        wrk_log(w, "bf16 needs a CUDA device; computing in F32 on the CPU");
        w->dtype = KERN_F32;
    }
    return 0;
}

/* The capture cache over the model, and the step lock syncs take.
 * -1 with a logged message. */
static int open_cache(run_t *r, size_t budget) {
    wrk_t *w = &r->w;
    const wrk_opts_t *o = w->opt;
    cap_options_t co = cap_options_default();
    co.budget_bytes = budget;
    co.warmup = o->warmup;
    co.audit_every = o->audit_every;
    co.policy = o->policy;
    co.on_event = wrk_events_on_cache;
    co.event_user = w->events;
    co.log = log_cache;
    co.log_user = w;
    if (!(w->cache = cap_cache_new(w->backend, &co)) ||
        tdit_register_weights(w->cache, w->model, o->weights_version) != 0) {
        wrk_log(w, "capture cache: %s", reel_err_text());
        return -1;
    }
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* Writer preference: a sync waiting for the lock stops new steps from
     * starting, so streams stepping back to back cannot starve it. */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    r->lock_ok = pthread_rwlock_init(&w->step_lock, &ra) == 0;
    pthread_rwlockattr_destroy(&ra);
    if (!r->lock_ok) {
        wrk_log(w, "cannot create the step lock");
        return -1;
    }
    return 0;
}

/* ZeroMQ, the pipe the threads wake the loop through, the streams, the
 * sync thread and --metrics. -1 with a logged message; *code 2 when the
 * metrics address is the user's to fix. */
static int open_links(run_t *r, int *code) {
    wrk_t *w = &r->w;
    link_t *l = &r->l;
    if (!(w->zctx = zmq_ctx_new())) {
        wrk_log(w, "zmq: %s", zmq_strerror(errno));
        return -1;
    }
    if (!(l->pull = wrk_pipe_pull_new(w->zctx))) {
        wrk_log(w, "pipe: %s", zmq_strerror(errno));
        return -1;
    }
    if (!(l->exec = wrk_exec_new(w)) || !(l->sync = wrk_syncer_new(w, r->sha))) {
        wrk_log(w, "%s", reel_err_text());
        return -1;
    }
    if (w->opt->metrics) {
        if (!(l->http = reel_http_start(w->opt->metrics))) {
            wrk_log(w, "%s", reel_err_text());
            *code = 2;
            return -1;
        }
        wrk_log(w, "metrics and health on http://%s (port %d): /metrics, /healthz, /readyz", w->opt->metrics,
                reel_http_port(l->http));
    }
    return 0;
}

/* The streams stopped (the step in progress ends), every graph leaves the
 * cache as a shutdown eviction (docs/CAPTURE.md: every graph that leaves
 * is one), its event queued for the EVENTS say_goodbye sends before
 * DISCONNECT -- after it the broker forgets the worker and its events --
 * so a worker that left cleanly has captures - evictions == 0 in the
 * catalog. Costs DISCONNECT at most the step in progress. */
static void empty_cache(run_t *r) {
    wrk_exec_stop(r->l.exec);
    if (r->w.cache && cap_cache_evict_all(r->w.cache) < 0) wrk_log(&r->w, "%s", reel_err_text());
}

/* The last words of a clean stop: the cache's counters, the artifacts'. */
static void log_totals(run_t *r) {
    wrk_t *w = &r->w;
    cap_stats_t cs;
    cap_cache_stats(w->cache, &cs);
    uint64_t graphless = 0;
    for (int i = 0; i < CAP_EVICT_COUNT; i++) graphless += cs.graphless_evictions[i];
    char more[96] = ""; /* entries evicted with no graph: their workspaces alone */
    if (graphless) snprintf(more, sizeof more, "; %llu entries holding no graph evicted", (unsigned long long)graphless);
    wrk_log(w, "stopping; capture cache: %llu captures, %llu replays (%llu audited, %llu audit "
            "mismatches), %llu eager (%llu in transient workspaces), %llu evictions (%llu at shutdown)%s",
            (unsigned long long)cs.captures, (unsigned long long)cs.replays, (unsigned long long)cs.audits,
            (unsigned long long)cs.declines[CAP_DECLINE_AUDIT_MISMATCH], (unsigned long long)cs.eager_runs,
            (unsigned long long)cs.transient_runs, (unsigned long long)cap_graph_evictions(&cs, -1),
            (unsigned long long)cap_graph_evictions(&cs, CAP_EVICT_SHUTDOWN), more);
    if (r->artifacts) {
        wrk_log(w, "stopping; artifacts (timing %s):", kern_art_timing_name(w->opt->artifact_timing));
        kern_artifacts_print(r->artifacts, stderr, true, false);
    }
}

/* Says goodbye first, so the broker requeues our requests at once. */
static void say_goodbye(run_t *r) {
    link_t *l = &r->l;
    wrk_stop(&r->w);
    if (!l->dealer) return;
    if (r->artifacts) push_keys(&r->w); /* the final counters */
    flush_events(l);
    send_msg(l, MSG_DISCONNECT, NULL);
    int linger = SHUTDOWN_LINGER_MS;
    zmq_setsockopt(l->dealer, ZMQ_LINGER, &linger, sizeof linger);
}

/* Everything run() built, in the order that keeps each thing's users
 * gone before it; safe on a half-built run. */
static void teardown(run_t *r) {
    wrk_t *w = &r->w;
    link_t *l = &r->l;
    wrk_stop(w);
    reel_http_stop(&l->http); /* it reads nothing of ours: only what was published */
    if (l->dealer) zmq_close(l->dealer);
    wrk_pipe_held_clear(&l->held);
    wrk_events_held_clear(&l->ev_held); /* (the worker stops: no one to report it to) */
    wrk_exec_stop(l->exec);
    wrk_syncer_destroy(&l->sync);
    if (l->pull) zmq_close(l->pull);
    if (w->zctx) zmq_ctx_term(w->zctx);
    /* No step runs now; the cache goes before the streams its graphs used. */
    cap_cache_destroy(&w->cache);
    wrk_exec_destroy(&l->exec);
    kern_artifacts_destroy(&r->artifacts); /* after every graph that may hold its kernels */
    if (r->lock_ok) pthread_rwlock_destroy(&w->step_lock);
    tdit_model_destroy(&w->model);
    t2v_text_destroy(&w->text);
    t2v_vae_destroy(&w->vae);
    st_close(&w->base.file);
    lora_close(&w->base.applied);
    wrk_events_destroy(&w->events);
    kern_backend_destroy(&w->backend);
    wrk_shared_fini(w);
}

/* The worker's life: set up phase by phase, serve, stop. The exit status:
 * 0 after a clean stop, 2 for what the user can fix (keys, artifacts, the
 * model, the metrics address, the broker's address), 1 otherwise. */
static int run(const wrk_opts_t *o) {
    static run_t r; /* large (the roots, the link): not on the stack */
    static wrk_roots_t roots;
    static reel_curve_t curve;
    memset(&r, 0, sizeof r);
    wrk_t *w = &r.w;
    w->opt = o;
    atomic_init(&w->applied_version, o->weights_version);
    atomic_init(&w->epoch, 1);
    atomic_init(&w->stop, false);
    atomic_init(&w->fatal, false);
    atomic_init(&w->draining, false);
    atomic_init(&w->running, 0);
    if (wrk_shared_init(w) != 0) {
        wrk_log(w, "%s", reel_err_text());
        return 1;
    }
    r.l.w = w;
    r.l.backoff_ms = BACKOFF_MIN_MS;
    if (split_brokers(w) != 0) return 2;
    if (sodium_init() < 0) { wrk_log(w, "libsodium cannot initialise"); return 1; }
    if (setup_access(w, &roots, &curve) != 0) return 2;
    if (install_signals() != 0) { wrk_log(w, "signals: %s", strerror(errno)); return 1; }

    int code = 1;
    if (open_backend(&r) != 0) goto out;
    if (setup_artifacts(w, &r.artifacts) != 0 || !(w->model = load_model(w, r.sha))) {
        code = 2;
        goto out;
    }
    if (!(w->events = wrk_events_new(EVENTS_MAX_PENDING))) { wrk_log(w, "out of memory"); goto out; }
    if (r.artifacts) push_bundles(w, r.artifacts); /* sent with the first EVENTS */
    size_t budget = o->budget;
    if (open_media(w, &budget) != 0) {
        code = 2;
        goto out;
    }
    set_held_max(w);
    if (open_cache(&r, budget) != 0 || open_links(&r, &code) != 0) goto out;
    if (connect_broker(&r.l, wrk_mono_ms()) != 0) { code = 2; goto out; }
    wrk_log(w, "ready (%s, %d streams)", kern_backend_device_name(w->backend), o->streams);
    reel_notify("READY=1\nSTATUS=serving");

    code = serve(&r.l);
    empty_cache(&r);
    if (code == 0) log_totals(&r);
    reel_notify("STOPPING=1");
    say_goodbye(&r);
out:
    teardown(&r);
    return code;
}

int main(int argc, char **argv) {
    wire_tune_malloc();
    wrk_opts_t o;
    if (wrk_opts_parse(argc, argv, &o) != 0) {
        fprintf(stderr, "reel-worker: %s (try -h)\n", reel_err_text());
        return reel_exit_status(reel_err_code());
    }
    if (o.help) {
        fputs(wrk_usage(), stdout);
        return 0;
    }
    return run(&o);
}
