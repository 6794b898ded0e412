/* brk_metrics.c -- the broker's live metrics and health (see brk_metrics.h). */
#include "broker/brk_metrics.h"

#include <stdio.h>
#include <string.h>

#include "broker/brk_broker.h"
#include "broker/brk_catq.h"
#include "broker/brk_log.h"
#include "broker/brk_zap.h"
#include "base/error.h"

/* An ERROR code as a label value: a worker's code is its own text, so
 * only [a-z0-9_] names of up to 31 bytes are kept; the rest is "other". */
static const char *outcome_label(const char *code) {
    size_t n = 0;
    for (const char *p = code; p && *p; p++, n++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')) return "other";
    return n && n < 32 ? code : "other";
}

int brk_metrics_lost_kind(const char *why) {
    if (!why) return BRK_LOST_OTHER;
    return !strcmp(why, "expired")      ? BRK_LOST_EXPIRED
           : !strcmp(why, "disconnect") ? BRK_LOST_DISCONNECT
           : !strcmp(why, "restarted")  ? BRK_LOST_RESTARTED
                                        : BRK_LOST_OTHER;
}

void brk_metrics_request(brk_metrics_t *m, const char *outcome, double seconds) {
    outcome = outcome_label(outcome);
    int i = 0;
    while (i < m->n_outcomes && strcmp(m->outcome[i], outcome)) i++;
    if (i == m->n_outcomes) {
        /* bounded: the last slot is "other", for every code past the rest */
        if (m->n_outcomes == BRK_OUTCOMES_MAX - 1) outcome = "other";
        for (i = 0; i < m->n_outcomes && strcmp(m->outcome[i], outcome); i++) {
        }
        if (i == m->n_outcomes) {
            snprintf(m->outcome[i], sizeof m->outcome[i], "%s", outcome);
            m->n_outcomes++;
        }
    }
    m->requests[i]++;
    reel_hist_observe(&m->request_s, seconds);
}

void brk_metrics_sync(brk_metrics_t *m, bool complete, bool applied, double seconds) {
    if (complete) m->syncs_complete++;
    else if (applied) m->syncs_incomplete++;
    else m->syncs_failed++;
    reel_hist_observe(&m->sync_s, seconds);
}

/* The exposition text of the broker's counters and state. */
static void render(brk_t *b, reel_text_t *t) {
    brk_metrics_t *m = &b->metrics;
    char lb[160], esc[96];
    reel_prom_family(t, "reel_broker_requests_total", "counter",
                     "Requests that ended, by outcome (ok, or the ERROR code the client got).");
    for (int i = 0; i < m->n_outcomes; i++) {
        snprintf(lb, sizeof lb, "outcome=\"%s\"", reel_prom_escape(m->outcome[i], esc, sizeof esc));
        reel_prom_sample(t, "reel_broker_requests_total", lb, (double)m->requests[i]);
    }
    reel_prom_family(t, "reel_broker_steps_total", "counter",
                     "Steps of the requests answered RESULT, by how the worker ran them (its RESULT's stats).");
    reel_prom_sample(t, "reel_broker_steps_total", "ran=\"replayed\"", (double)m->steps_replayed);
    reel_prom_sample(t, "reel_broker_steps_total", "ran=\"captured\"", (double)m->steps_captured);
    reel_prom_sample(t, "reel_broker_steps_total", "ran=\"eager\"", (double)m->steps_eager);
    reel_prom_family(t, "reel_broker_busy_total", "counter", "GENs answered BUSY (queue or memory full).");
    reel_prom_sample(t, "reel_broker_busy_total", "", (double)m->busy);
    reel_prom_family(t, "reel_broker_queue_displaced_total", "counter",
                     "Waiting GENs answered BUSY to give their place in a full queue to a client with fewer "
                     "waiting (counted in reel_broker_busy_total too).");
    reel_prom_sample(t, "reel_broker_queue_displaced_total", "", (double)b->queue_displaced);
    reel_prom_family(t, "reel_broker_requeues_total", "counter", "Requests requeued after their worker died.");
    reel_prom_sample(t, "reel_broker_requeues_total", "", (double)m->requeues);
    reel_prom_family(t, "reel_broker_gen_resends_total", "counter",
                     "GENs a client sent again while their request was live: attached to it, not run twice.");
    reel_prom_sample(t, "reel_broker_gen_resends_total", "", (double)b->resends);
    reel_prom_family(t, "reel_broker_cancels_total", "counter",
                     "Client CANCELs, by whether they named a live request (ended: answered ERROR cancelled) or "
                     "none (answered already, or never sent).");
    reel_prom_sample(t, "reel_broker_cancels_total", "outcome=\"ended\"", (double)b->cancels);
    reel_prom_sample(t, "reel_broker_cancels_total", "outcome=\"unknown\"", (double)b->cancels_unknown);
    reel_prom_family(t, "reel_broker_prewarm_keys_total", "counter", "Hot keys sent to starting workers (PREWARM).");
    reel_prom_sample(t, "reel_broker_prewarm_keys_total", "", (double)b->prewarm_keys_sent);
    reel_prom_family(t, "reel_broker_queue_depth", "gauge", "Requests waiting for a worker slot.");
    reel_prom_sample(t, "reel_broker_queue_depth", "", (double)brk_queue_len(&b->queue));
    reel_prom_family(t, "reel_broker_held_bytes", "gauge", "Tensor bytes of live requests the broker holds.");
    reel_prom_sample(t, "reel_broker_held_bytes", "", (double)b->held_bytes);
    reel_prom_family(t, "reel_broker_request_seconds", "histogram",
                     "Time from a GEN's arrival to its RESULT or ERROR.");
    reel_prom_hist(t, "reel_broker_request_seconds", "", &m->request_s);
    reel_prom_family(t, "reel_broker_queue_wait_seconds", "histogram",
                     "Time from a GEN's arrival to its dispatch to a worker.");
    reel_prom_hist(t, "reel_broker_queue_wait_seconds", "", &m->queue_wait_s);
    reel_prom_family(t, "reel_broker_encode_seconds", "histogram",
                     "A worker's time encoding a GEN's prompt (and negative prompt): GENs with a prompt.");
    reel_prom_hist(t, "reel_broker_encode_seconds", "", &m->encode_s);
    reel_prom_family(t, "reel_broker_decode_seconds", "histogram",
                     "A worker's time decoding a GEN's output to frames or a video: GENs asking for one.");
    reel_prom_hist(t, "reel_broker_decode_seconds", "", &m->decode_s);
    int routable = 0, unroutable = 0, dead = 0, inflight = 0;
    for (int i = 0; i < b->n_w; i++) {
        const brk_worker_t *w = b->w[i];
        /* behind a current version: what needs it cannot go there (STATUS's lagging; brk_sync_lag
         * would say why, but the sync module reports its barriers here: no call back) */
        bool lagging = false;
        for (int c = 0; c < b->n_cur && !lagging; c++)
            lagging = brk_peer_version(&w->route, b->cur[c].component) < b->cur[c].version;
        if (w->dead) dead++;
        else if (w->route.routable && !lagging) routable++;
        else unroutable++;
        if (!w->dead) inflight += w->route.inflight;
    }
    reel_prom_family(t, "reel_broker_workers", "gauge",
                     "Registered workers by state (routable: takes requests; unroutable: live but lagging (behind "
                     "a current version, applying or failed) or full of failed sends; dead: expired, dropped at "
                     "once: reel_broker_workers_lost_total counts them).");
    reel_prom_sample(t, "reel_broker_workers", "state=\"routable\"", routable);
    reel_prom_sample(t, "reel_broker_workers", "state=\"unroutable\"", unroutable);
    reel_prom_sample(t, "reel_broker_workers", "state=\"dead\"", dead);
    reel_prom_family(t, "reel_broker_workers_lost_total", "counter",
                     "Workers dropped, by why: expired (silent past the liveness), disconnect, restarted (a new "
                     "READY under its name), other.");
    static const char *const lost[] = { "why=\"expired\"", "why=\"disconnect\"", "why=\"restarted\"",
                                        "why=\"other\"" };
    for (int k = 0; k < 4; k++) reel_prom_sample(t, "reel_broker_workers_lost_total", lost[k], (double)m->workers_lost[k]);
    reel_prom_family(t, "reel_broker_inflight", "gauge", "Requests running on workers.");
    reel_prom_sample(t, "reel_broker_inflight", "", inflight);
    reel_prom_family(t, "reel_broker_syncs_total", "counter",
                     "Weight syncs that ended: complete (every worker applied it), incomplete (some did), failed "
                     "(none did: nothing changed).");
    reel_prom_sample(t, "reel_broker_syncs_total", "result=\"complete\"", (double)m->syncs_complete);
    reel_prom_sample(t, "reel_broker_syncs_total", "result=\"incomplete\"", (double)m->syncs_incomplete);
    reel_prom_sample(t, "reel_broker_syncs_total", "result=\"failed\"", (double)m->syncs_failed);
    reel_prom_family(t, "reel_broker_sync_seconds", "histogram", "Time from a SYNC's arrival to its SYNC_DONE.");
    reel_prom_hist(t, "reel_broker_sync_seconds", "", &m->sync_s);
    reel_prom_family(t, "reel_broker_weight_version", "gauge", "The current weight version of each component.");
    for (int i = 0; i < b->n_cur; i++) {
        if (!b->cur[i].version) continue;
        snprintf(lb, sizeof lb, "component=\"%s\"", reel_prom_escape(b->cur[i].component, esc, sizeof esc));
        reel_prom_sample(t, "reel_broker_weight_version", lb, (double)b->cur[i].version);
    }
    int pending = 0;
    for (const brk_barrier_t *s = b->barriers; s; s = s->next) pending++;
    reel_prom_family(t, "reel_broker_syncs_pending", "gauge", "Syncs waiting on their barrier.");
    reel_prom_sample(t, "reel_broker_syncs_pending", "", pending);
    reel_prom_family(t, "reel_broker_catalog_queue_depth", "gauge", "Catalog writes queued for the writer thread.");
    reel_prom_sample(t, "reel_broker_catalog_queue_depth", "", (double)brk_catq_pending(b->cat));
    reel_prom_family(t, "reel_broker_catalog_shed_total", "counter",
                     "Catalog events shed (their worker over its quota, or the queue full).");
    reel_prom_sample(t, "reel_broker_catalog_shed_total", "", (double)brk_catq_dropped(b->cat));
    reel_prom_family(t, "reel_broker_catalog_pruned_total", "counter",
                     "Raw catalog rows pruned by --catalog-retain / --catalog-max-rows.");
    reel_prom_sample(t, "reel_broker_catalog_pruned_total", "", (double)brk_catq_pruned(b->cat));
    reel_prom_family(t, "reel_broker_catalog_failed_total", "counter", "Catalog batches that failed to commit.");
    reel_prom_sample(t, "reel_broker_catalog_failed_total", "", (double)brk_catq_failures(b->cat));
    reel_prom_family(t, "reel_broker_auth_refusals_total", "counter",
                     "CURVE handshakes refused (every attempt; the peers: reel_broker_auth_refused_peers_total).");
    reel_prom_sample(t, "reel_broker_auth_refusals_total", "", (double)brk_zap_refused(b->zap));
    reel_prom_family(t, "reel_broker_auth_refused_peers_total", "counter",
                     "Peers (a key from an address on one socket) whose CURVE handshakes were refused.");
    reel_prom_sample(t, "reel_broker_auth_refused_peers_total", "", (double)brk_zap_refused_peers(b->zap));
    reel_prom_family(t, "reel_broker_fetch_bytes_total", "counter",
                     "Uploaded weights sent to workers (FETCH_DATA): from the UPLOAD chunk as it came, "
                     "or read back from --weights-dir.");
    reel_prom_sample(t, "reel_broker_fetch_bytes_total", "from=\"arriving_chunk\"", (double)b->fetch_bytes_shared);
    reel_prom_sample(t, "reel_broker_fetch_bytes_total", "from=\"file\"", (double)b->fetch_bytes_read);
    reel_prom_family(t, "reel_broker_fetch_out_bytes", "gauge",
                     "Bytes of uploaded weights read for FETCHes (workers', a pair's peer broker's) and not yet sent (at most --max-fetch-mb; "
                     "past it FETCHes are answered busy).");
    reel_prom_sample(t, "reel_broker_fetch_out_bytes", "", (double)atomic_load(&b->fetch_out_bytes));
    reel_prom_family(t, "reel_broker_malformed_total", "counter", "Unreadable messages received.");
    reel_prom_sample(t, "reel_broker_malformed_total", "", (double)b->malformed);
    reel_prom_family(t, "reel_broker_worker_refused_total", "counter",
                     "Registered workers' messages refused or dropped for what they said (each logged).");
    reel_prom_sample(t, "reel_broker_worker_refused_total", "", (double)b->worker_refused);
    reel_prom_family(t, "reel_broker_undelivered_total", "counter",
                     "Messages but PROGRESS dropped because their peer could not take them: gone, a worker's full "
                     "queue, or a client's answers held past their bounds.");
    reel_prom_sample(t, "reel_broker_undelivered_total", "", (double)b->undelivered);
    reel_prom_family(t, "reel_broker_progress_dropped_total", "counter",
                     "PROGRESS a client could not take (a full queue, answers held before it, or gone): harmless.");
    reel_prom_sample(t, "reel_broker_progress_dropped_total", "", (double)b->progress_dropped);
    reel_prom_family(t, "reel_broker_answers_held", "gauge",
                     "Answers held for clients whose queue was full, to send when it takes them.");
    reel_prom_sample(t, "reel_broker_answers_held", "", (double)b->answers_held);
    reel_prom_family(t, "reel_broker_answers_held_bytes", "gauge", "The bytes of those answers (at most --max-held-mb).");
    reel_prom_sample(t, "reel_broker_answers_held_bytes", "", (double)b->answers_held_bytes);
}

int brk_metrics_start(brk_t *b) {
    if (!b->opt.metrics) return 0;
    if (!(b->metrics.http = reel_http_start(b->opt.metrics))) return -1;
    brk_log("metrics and health on http://%s (port %d): /metrics, /healthz, /readyz", b->opt.metrics,
            reel_http_port(b->metrics.http));
    return 0;
}

void brk_metrics_publish(brk_t *b, int64_t now) {
    brk_metrics_t *m = &b->metrics;
    if (!m->http || now < m->next_publish_ms) return;
    m->next_publish_ms = now + REEL_HTTP_PUBLISH_MS;
    reel_text_t t = { 0 };
    render(b, &t);
    if (!t.failed) {
        /* Ready once it serves: its sockets are bound and the loop runs. */
        if (reel_http_publish(m->http, t.p, t.n, true, true, NULL) != 0)
            brk_log("metrics: %s", reel_err_text());
    }
    reel_text_free(&t);
}

void brk_metrics_stop(brk_t *b) { reel_http_stop(&b->metrics.http); }
