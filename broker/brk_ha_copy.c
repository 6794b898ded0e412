/* brk_ha_copy.c -- each broker of a pair keeps the uploaded weights it
 * may have to serve (brk_ha_int.h). A version sent by value lives in the
 * weights dir of the broker it was uploaded to; workers FETCH it from
 * there. After a takeover, a worker that joins (or catches up) FETCHes the
 * current version from the new active broker, so:
 * - the standby keeps a copy of each current uploaded version its active
 *   peer announces (PEER's syncs);
 * - the active broker fetches, from its standby peer, each current
 *   uploaded version it does not store: one it adopted from the peer (a
 *   takeover before the copy ended, its old active back as the standby;
 *   two actives resolved).
 * It FETCHes the file from the peer's client socket, 4 chunks in flight,
 * as a worker does from the worker socket, and stores it through the
 * upload module as a trainer's upload (hashed, compared with the announced
 * sha256, kept with its digest, audited "copied from the peer broker",
 * older uploaded versions pruned by --weights-keep); while it comes, a
 * worker's FETCH of it waits for its bytes as for an upload's. A standby's
 * copy that stalls keeps what came and resumes there at its next try; one
 * refused starts over; each failure of the same version doubles the wait
 * before the next try (5 s to 320 s); a FETCH answered busy is asked
 * again, as a stall's; a copy of a version no longer wanted,
 * or one under way when this broker takes over or steps down, stops and
 * its part is removed. */
#include "broker/brk_ha_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "broker/brk_log.h"
#include "broker/brk_msg.h"
#include "broker/brk_sync.h"
#include "broker/brk_upload.h"

#define PEER_NAME(c) ((c)->from_active ? "the active broker" : "the standby broker")

/* FETCHes up to BRK_HA_COPY_WINDOW chunks ahead of what came. A send the
 * socket cannot take now (no connection to the peer) is asked again by
 * the timers. */
static void ask(brk_t *b, int64_t now) {
    struct brk_ha *h = b->ha;
    brk_ha_copy_t *c = &h->copy;
    while (c->asked < c->size && c->asked - c->next < (uint64_t)BRK_HA_COPY_WINDOW * MSG_CHUNK_MAX) {
        msg_fetch_t f;
        memset(&f, 0, sizeof f);
        snprintf(f.component, sizeof f.component, "%s", c->component);
        f.version = c->version;
        snprintf(f.sha256, sizeof f.sha256, "%s", c->sha256);
        f.offset = c->asked;
        f.max = MSG_CHUNK_MAX;
        if (msg_fetch_send(h->sock, NULL, c->next_id, &f) != 0) break;
        c->next_id++;
        c->asked += MSG_CHUNK_MAX;
    }
    c->asked_ms = now;
}

/* How a copy ends: stopped (takeover, the version no longer the peer's),
 * failed for good (refused: tried again with a growing delay), or stalled
 * (no answer: its partial upload kept, the next try resumes there). */
typedef enum { COPY_STOPPED, COPY_REFUSED, COPY_STALLED } copy_end_t;

/* The copy's partial upload removed (a slot that stayed open would make
 * a FETCH of it after a takeover wait for bytes that never come). */
static void drop_partial(brk_t *b) {
    brk_ha_copy_t *c = &b->ha->copy;
    if (c->kept) brk_upload_drop(b, c->kept_component, c->kept_version, c->kept_sha256);
    c->kept = false;
}

static void end(brk_t *b, copy_end_t how, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void end(brk_t *b, copy_end_t how, const char *fmt, ...) {
    brk_ha_copy_t *c = &b->ha->copy;
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    int64_t now = brk_now_ms();
    if (how != COPY_STOPPED) {
        bool again = c->failed_version == c->version && !strcmp(c->failed_component, c->component);
        c->failures = again ? c->failures + 1 : 1;
        snprintf(c->failed_component, sizeof c->failed_component, "%s", c->component);
        c->failed_version = c->version;
        c->failed_ms = now;
        int shift = c->failures - 1 < 6 ? c->failures - 1 : 6; /* 5 s, 10 s, ... 320 s */
        c->retry_ms = (int64_t)BRK_HA_COPY_RETRY_MS << shift;
    }
    char retry[64] = "";
    if (how != COPY_STOPPED) snprintf(retry, sizeof retry, "; tried again in %" PRId64 " s", c->retry_ms / 1000);
    brk_log("copy of %s v%" PRIu64 " from %s %s at %" PRIu64 " of %" PRIu64 " bytes: %s%s%s",
            c->component, c->version, PEER_NAME(c), how == COPY_STOPPED ? "stopped" : "failed", c->next,
            c->size == UINT64_MAX ? 0 : c->size, why, how == COPY_STALLED ? " (what came is kept)" : "", retry);
    c->on = false;
    c->kept = true; /* this copy's part: resumed by the next try when it stalled, else removed now */
    snprintf(c->kept_component, sizeof c->kept_component, "%s", c->component);
    c->kept_version = c->version;
    snprintf(c->kept_sha256, sizeof c->kept_sha256, "%s", c->sha256);
    /* (an active broker's part goes: workers' FETCHes would wait on it) */
    if (how != COPY_STALLED || b->ha->state != BRK_HA_STANDBY) drop_partial(b);
}

void brk_ha_copy_stop(brk_t *b, const char *why) {
    if (!b->ha) return;
    if (b->ha->copy.on) end(b, COPY_STOPPED, "%s", why);
    drop_partial(b); /* a stalled copy's part too */
}

static void start(brk_t *b, const msg_sync_t *s, int64_t now) {
    brk_ha_copy_t *c = &b->ha->copy;
    /* one partial copy at a time: another version's is given up */
    if (c->kept && (c->kept_version != s->version || strcmp(c->kept_component, s->component) ||
                    strcmp(c->kept_sha256, s->sha256)))
        drop_partial(b);
    c->kept = false;
    c->on = true;
    c->from_active = b->ha->state == BRK_HA_STANDBY;
    snprintf(c->component, sizeof c->component, "%s", s->component);
    c->version = s->version;
    snprintf(c->sha256, sizeof c->sha256, "%s", s->sha256);
    c->size = UINT64_MAX;
    uint64_t held = 0;
    /* (resumed where a stalled try stopped, if its part is still open) */
    c->next = c->asked = c->from = brk_upload_progress(b, c->component, c->version, c->sha256, &held) ? held : 0;
    /* Ids on the DEALER to the peer are the copies' alone (a PEER goes
     * with 0): each copy's start after the last one's, so an answer to an
     * earlier copy is told apart. */
    c->first_id = ++c->next_id;
    c->started_ms = c->progress_ms = now;
    brk_log("copying %s v%" PRIu64 " (uploaded, sha256 %.16s...) from %s%s", c->component, c->version, c->sha256,
            PEER_NAME(c), c->from ? " where an earlier try stopped" : "");
    ask(b, now);
}

/* The full version the peer's current SYNC of comp is on when that is a
 * LoRA adapter (as PEER last said), else this broker's own (0: none). */
static uint64_t peer_base(const brk_t *b, const char *comp) {
    const struct brk_ha *h = b->ha;
    const msg_sync_t *top = NULL;
    for (int i = 0; h && i < h->n_syncs; i++)
        if (!strcmp(h->syncs[i].component, comp) && (!top || h->syncs[i].version > top->version)) top = &h->syncs[i];
    return top ? top->base_version : brk_current_base(b, comp);
}

/* The uploaded versions this broker should store and may fetch from its
 * peer, in out (BRK_HA_SYNCS): as the standby, its active peer's
 * current ones; as the active broker, its own current ones while its
 * standby peer is heard (only it may hold them). How many. */
static int wanted(const brk_t *b, int64_t now, const msg_sync_t **out) {
    const struct brk_ha *h = b->ha;
    int n = 0;
    if (!h->seen_ms || now - h->seen_ms >= h->timeout_ms) return 0;
    if (h->state == BRK_HA_STANDBY && h->peer == BRK_HA_ACTIVE) {
        for (int i = 0; i < h->n_syncs && n < BRK_HA_SYNCS; i++)
            if (h->syncs[i].uploaded) out[n++] = &h->syncs[i];
    } else if (h->state == BRK_HA_ACTIVE && h->peer == BRK_HA_STANDBY) {
        for (int i = 0; i < b->n_cur && n < BRK_HA_SYNCS - 1; i++) {
            if (b->cur[i].sync && b->cur[i].base && b->cur[i].base->uploaded) out[n++] = b->cur[i].base;
            if (b->cur[i].sync && b->cur[i].sync->uploaded) out[n++] = b->cur[i].sync;
        }
    }
    return n;
}

/* Whether the copy in progress is still of a wanted version, from the
 * same side. */
static bool still_wanted(const brk_t *b, int64_t now) {
    const brk_ha_copy_t *c = &b->ha->copy;
    const msg_sync_t *w[BRK_HA_SYNCS];
    int n = wanted(b, now, w);
    if (c->from_active != (b->ha->state == BRK_HA_STANDBY)) return false;
    for (int i = 0; i < n; i++)
        if (w[i]->version == c->version && !strcmp(w[i]->component, c->component) && !strcmp(w[i]->sha256, c->sha256))
            return true;
    return false;
}

void brk_ha_copy_consider(brk_t *b, int64_t now) {
    struct brk_ha *h = b->ha;
    brk_ha_copy_t *c = &h->copy;
    if (c->on && !still_wanted(b, now)) end(b, COPY_STOPPED, "no longer wanted (another version is current, or the pair's states changed)");
    if (c->on) return;
    const msg_sync_t *w[BRK_HA_SYNCS];
    int n = wanted(b, now, w);
    for (int i = 0; i < n; i++) {
        const msg_sync_t *s = w[i];
        if (!b->opt.weights_dir) {
            if (!c->no_dir_warned)
                brk_log("warning: %s v%" PRIu64 " was uploaded, and this broker has no --weights-dir to keep a copy "
                        "in: if it is the active broker, workers that join cannot fetch it", s->component,
                        s->version);
            c->no_dir_warned = true;
            return;
        }
        if (brk_upload_stored(b, s->component, s->version, s->sha256)) continue;
        if (reel_err_code() == REEL_E_INVALID) continue; /* other bytes under that version here: never served */
        if (c->failed_version == s->version && !strcmp(c->failed_component, s->component) &&
            now - c->failed_ms < c->retry_ms)
            continue;
        start(b, s, now);
        return;
    }
}

/* The chunk at c->next (d, decoded from m): stored through the upload
 * module (as a trainer's chunk, answered to no one; its frame shared with
 * the hashing thread, not copied); the copy goes on, ends stored, or
 * fails. */
static void chunk(brk_t *b, const msg_fetch_data_t *d, const wire_msg_t *m) {
    brk_ha_copy_t *c = &b->ha->copy;
    int64_t now = brk_now_ms();
    if (c->size == UINT64_MAX) {
        if (d->size == 0 || d->size > MSG_UPLOAD_MAX) {
            end(b, COPY_REFUSED, "%s says the file is %" PRIu64 " bytes", PEER_NAME(c), d->size);
            return;
        }
        c->size = d->size;
    } else if (d->size != c->size) {
        end(b, COPY_REFUSED, "the file changed size at %s (%" PRIu64 " bytes, was %" PRIu64 ")", PEER_NAME(c), d->size,
            c->size);
        return;
    }
    uint64_t n = d->chunk->bytes;
    if (n == 0) return; /* past the end: asked before the size was known */
    msg_upload_t u;
    memset(&u, 0, sizeof u);
    snprintf(u.component, sizeof u.component, "%s", c->component);
    u.version = c->version;
    snprintf(u.sha256, sizeof u.sha256, "%s", c->sha256);
    u.size = c->size;
    u.offset = d->offset;
    u.chunk = d->chunk;
    brk_upload_chunk(b, NULL, 0, &u, m);
    uint64_t held = 0;
    if (brk_upload_stored(b, c->component, c->version, c->sha256)) {
        c->next = c->size;
        c->copied++;
        c->failed_version = 0; /* its failures forgotten */
        c->failures = 0;
        brk_log("copied %s v%" PRIu64 " from %s: %" PRIu64 " bytes in %.2f s", c->component, c->version,
                PEER_NAME(c), c->size - c->from, (double)(now - c->started_ms) / 1000.0);
        c->on = false;
        /* the peer's current: --weights-keep as there, its adapter's base kept */
        brk_upload_prune(b, c->component, c->version, peer_base(b, c->component));
        brk_ha_copy_consider(b, now);                  /* the next component's, if any */
    } else if (brk_upload_progress(b, c->component, c->version, c->sha256, &held)) {
        if (held != d->offset + n) { /* (not kept, or the part is not where the copy thought: go on from it) */
            brk_log("copy of %s v%" PRIu64 ": the chunk at %" PRIu64 " was not kept here; going on from %" PRIu64,
                    c->component, c->version, d->offset, held);
            c->asked = held;
        } else {
            c->progress_ms = now;
        }
        c->next = held;
        ask(b, now);
    } else {
        end(b, COPY_REFUSED, "this broker did not keep the chunk at %" PRIu64 " (a refusal is logged above; else "
            "its partial copy was given up)", d->offset);
    }
}

void brk_ha_copy_answer(brk_t *b, wire_msg_t *m) {
    brk_ha_copy_t *c = &b->ha->copy;
    wire_err_t err;
    if (!c->on || m->id < c->first_id || m->id >= c->next_id) return; /* an answer to an earlier copy */
    if (msg_type(m) == MSG_FETCH_DATA) {
        msg_fetch_data_t d;
        if (msg_fetch_data_decode(m, &d, &err) != 0 || msg_fetch_data_validate(&d, &err) != 0) {
            end(b, COPY_REFUSED, "a bad FETCH_DATA from %s: %s", PEER_NAME(c), err.message);
            return;
        }
        if (strcmp(d.component, c->component) || d.version != c->version || d.offset != c->next) return; /* stale */
        chunk(b, &d, m);
    } else if (msg_type(m) == MSG_ERROR) {
        msg_error_t e;
        if (msg_error_decode(m, &e, &err) != 0) end(b, COPY_REFUSED, "a bad ERROR from %s: %s", PEER_NAME(c), err.message);
        else if (strcmp(e.code, WIRE_E_BUSY)) end(b, COPY_REFUSED, "%s answered %s: %s", PEER_NAME(c), e.code, e.message);
        /* busy (the peer holds --max-fetch-mb of answers not yet read, or
         * this connection's 16): no failure; the chunk wanted next is
         * asked again after BRK_HA_COPY_RESEND_MS without one (the
         * timers), and the copy stalls only past BRK_HA_COPY_TIMEOUT_MS */
    }
}

void brk_ha_copy_timers(brk_t *b, int64_t now) {
    struct brk_ha *h = b->ha;
    brk_ha_copy_t *c = &h->copy;
    if (!c->on) return;
    if (now - c->progress_ms >= BRK_HA_COPY_TIMEOUT_MS) {
        end(b, COPY_STALLED, "no chunk from %s for %d s", PEER_NAME(c), BRK_HA_COPY_TIMEOUT_MS / 1000);
    } else if (now - c->progress_ms >= BRK_HA_COPY_RESEND_MS && now - c->asked_ms >= BRK_HA_COPY_RESEND_MS) {
        c->asked = c->next; /* what was in flight is lost or late: asked again from what is wanted next */
        ask(b, now);
    }
}
