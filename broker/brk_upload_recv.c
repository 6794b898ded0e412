/* brk_upload_recv.c -- UPLOAD, phase by phase (brk_upload_chunk): the
 * chunk admitted (a weights dir, a component served, not stored already),
 * its upload's slot found, replaced or opened (a new .part, or a spare
 * written over), the chunk written in order and queued to hash, and the
 * upload finished: its digest compared, the file published, the trainer
 * answered. One chunk_t carries the chunk through them. FETCHes waiting
 * for the bytes are answered as they come (brk_upload_serve.c). */
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"
#include "broker/brk_sync.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "broker/brk_log.h"
#include "broker/brk_deliver.h"
#include "broker/brk_msg.h"
#include "broker/brk_zap.h"

/* One UPLOAD chunk on its way through brk_upload_chunk's phases. */
typedef struct {
    brk_t *b;
    const zmq_msg_t *from;     /* the trainer's connection */
    uint64_t id;
    const msg_upload_t *u;
    const wire_msg_t *m;       /* the message u was decoded from (NULL: none) */
    char sha[65];              /* u's sha256, lowercase */
    slot_t *s;                 /* its upload's slot, once found or opened */
    char digest[65];           /* the bytes' sha256, once all came */
    brk_who_t who;             /* the trainer, for the audit, once all came */
    bool replace;              /* the version is stored with other bytes, never applied: they go once a slot is had */
} chunk_t;

static void ack(brk_t *b, const zmq_msg_t *to, uint64_t id, const char *comp, uint64_t v, uint64_t received,
                bool complete) {
    msg_upload_ack_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.component, sizeof a.component, "%s", comp);
    a.version = v;
    a.received = received;
    a.complete = complete;
    if (!to) return; /* a copy from the peer broker (brk_ha_copy.c): no one to answer */
    (void)brk_client_send(b, to, MSG_UPLOAD_ACK, id, &a, NULL); /* (held when its queue is full) */
}

void brk_upl_close_slot(brk_t *b, slot_t *s, bool remove_part) {
    if (!s->open) return;
    brk_upl_fail_parked(b, s, WIRE_E_BAD_REQUEST, remove_part ? "the upload failed or was replaced" : "the upload closed");
    free(s->parked);
    if (s->fd >= 0) close(s->fd);
    brk_upl_hasher_end(&s->h, NULL);
    if (remove_part) {
        char part[1024];
        brk_upl_path(b, ".", s->component, s->version, ".part", part, sizeof part);
        unlink(part);
    }
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

/* ---- the slot ---------------------------------------------------------------------- */

/* A free slot, or the one idle longest when it had no chunk for
 * BRK_UPLOAD_STALE_MS (given up for the new upload); NULL when none. */
static slot_t *free_slot(brk_t *b) {
    slot_t *s = NULL, *idle = NULL;
    for (int i = 0; i < BRK_UPLOADS_MAX && !s; i++)
        if (!b->uploads->s[i].open) s = &b->uploads->s[i];
        else if (!idle || b->uploads->s[i].touched_ms < idle->touched_ms) idle = &b->uploads->s[i];
    if (!s && idle && brk_now_ms() - idle->touched_ms >= BRK_UPLOAD_STALE_MS) {
        brk_log_kind(&b->request_log, BRK_UPLOAD_LINES, "upload %s v%" PRIu64 " given up for a new one: no chunk in %d s",
                     idle->component, idle->version, (int)((brk_now_ms() - idle->touched_ms) / 1000));
        brk_upl_close_slot(b, idle, true);
        s = idle;
    }
    return s;
}

/* A new upload of c->u in a free slot (.part created, empty, or a spare
 * to write over). NULL with the error value: REEL_E_STATE when every slot
 * is taken (busy), REEL_E_IO or REEL_E_NOMEM when the file cannot be
 * opened (internal). */
static slot_t *open_slot(chunk_t *c) {
    brk_t *b = c->b;
    const msg_upload_t *u = c->u;
    slot_t *s = free_slot(b);
    if (!s) {
        reel_fail(REEL_E_STATE, "%d uploads are in progress; finish one first (or retry when one ends)",
                  BRK_UPLOADS_MAX);
        return NULL;
    }
    char part[1024];
    brk_upl_path(b, ".", u->component, u->version, ".part", part, sizeof part);
    bool spare = brk_upl_take_spare(b, u->size, part);
    int fd = open(part, O_RDWR | O_CREAT | (spare ? 0 : O_TRUNC) | O_CLOEXEC | O_NOFOLLOW, 0600);
    /* a spare's length now, not as recorded (cut at the end if longer) */
    struct stat st = { 0 };
    bool unsized = spare && fd >= 0 && fstat(fd, &st) != 0;
    hasher_t *h = fd >= 0 && !unsized ? brk_upl_hasher_new() : NULL;
    if (!h) {
        /* strerror in the message, not the detail: the trainer is told */
        reel_fail(fd < 0 || unsized ? REEL_E_IO : REEL_E_NOMEM, "cannot open %.200s: %s", part,
                  fd < 0 || unsized ? strerror(errno) : "out of memory");
        if (fd >= 0) close(fd);
        if (spare) unlink(part); /* not left behind with old bytes in it */
        return NULL;
    }
    *s = (slot_t){ .open = true, .version = u->version, .size = u->size, .fd = fd, .h = h, .recycled = spare,
                   .spare_size = spare ? (uint64_t)st.st_size : 0, .touched_ms = brk_now_ms() };
    snprintf(s->component, sizeof s->component, "%s", u->component);
    snprintf(s->sha256, sizeof s->sha256, "%s", c->sha);
    return s;
}

/* ---- the phases ------------------------------------------------------------------- */

/* Removes the stored copy of comp v (its digest first: without it the
 * version is not stored, whatever is left). 0, or -1 with an internal
 * error. */
static int forget_stored(brk_t *b, const char *comp, uint64_t v) {
    char sum[1024], file[1024];
    brk_upl_path(b, "", comp, v, ".sha256", sum, sizeof sum);
    brk_upl_path(b, "", comp, v, ".safetensors", file, sizeof file);
    if ((unlink(sum) != 0 && errno != ENOENT) || (unlink(file) != 0 && errno != ENOENT))
        return reel_fail(REEL_E_IO, "cannot remove the stored %s v%" PRIu64 " to replace it: %s", comp, v,
                         strerror(errno));
    brk_log_kind(&b->request_log, BRK_UPLOAD_LINES,
                 "%s v%" PRIu64 ": an UPLOAD with other weights replaces the stored ones (never applied: newer than the "
                 "current version, no SYNC of it under way)",
                 comp, v);
    return 0;
}

/* Whether the chunk may go on to its slot: this broker keeps uploads, the
 * component is one a SYNC could name, and the version is not stored
 * already (answered complete again) or with other weights (STALE).
 * False when answered. */
static bool chunk_admit(chunk_t *c) {
    brk_t *b = c->b;
    const msg_upload_t *u = c->u;
    if (!b->opt.weights_dir || !b->uploads) {
        brk_error_to(b, false, c->from, c->id, WIRE_E_BAD_REQUEST,
                     "UPLOAD: this broker keeps no uploaded weights (start it with --weights-dir)");
        return false;
    }
    if (!brk_component_served(u->component)) { /* nothing could ever sync it: unsupported, bad_request */
        brk_error_from(b, false, c->from, c->id, reel_err(), "UPLOAD: ");
        return false;
    }
    brk_upl_lower(u->sha256, c->sha);
    if (brk_upload_stored(b, u->component, u->version, c->sha)) {
        ack(b, c->from, c->id, u->component, u->version, u->size, true); /* sent again: it is there */
        return false;
    }
    /* Stored with other weights (invalid): taken for good once a SYNC of
     * it is under way or it became current (workers may hold those bytes
     * under that version), and stale_version has no library code to come
     * from. A version newer than the current one with no SYNC under way
     * was never applied (its SYNC failed, or none came): the new bytes
     * replace the stored ones, as a fixed file may be published again. */
    uint64_t cur = brk_current_version(b, u->component);
    if (reel_err_code() == REEL_E_INVALID) {
        if (u->version <= cur || brk_sync_under_way(b, u->component, u->version)) {
            brk_error_to(b, false, c->from, c->id, WIRE_E_STALE, "UPLOAD: %s%s", reel_err()->msg,
                         u->version <= cur ? "" : " and a SYNC of it is under way");
            return false;
        }
        c->replace = true; /* chunk_slot removes them once this upload has its slot */
    }
    /* Older than the current version: a SYNC of it would be stale_version,
     * so its bytes could never be used (they would only hold a slot). */
    if (u->version < cur) {
        /* one begun before a newer version became current gives up its slot */
        slot_t *old = brk_upl_slot(b, u->component, u->version);
        if (old) brk_upl_close_slot(b, old, true);
        brk_error_to(b, false, c->from, c->id, WIRE_E_STALE,
                     "UPLOAD: %s v%" PRIu64 " is older than the current v%" PRIu64 ": a SYNC of it would be "
                     "stale_version", u->component, u->version, cur);
        return false;
    }
    return true;
}

/* c->s: the upload's slot, the one of other bytes replaced by a chunk at
 * offset 0, or a new one; the chunk must be the one it waits for. False
 * when answered: refused, or told where to go on (the slot's clock stays:
 * that is not progress). */
static bool chunk_slot(chunk_t *c) {
    brk_t *b = c->b;
    const msg_upload_t *u = c->u;
    slot_t *s = brk_upl_slot(b, u->component, u->version);
    if (s && (strcmp(s->sha256, c->sha) || s->size != u->size)) {
        /* A SYNC of these very bytes is under way (accepted, its workers
         * fetching them): other bytes under its version are stale_version,
         * as once they are stored, not a replacement that fails it. */
        const char *pending = brk_sync_under_way_sha(b, u->component, u->version);
        if (pending && !strcasecmp(pending, s->sha256) && strcasecmp(pending, c->sha)) {
            brk_error_to(b, false, c->from, c->id, WIRE_E_STALE,
                         "UPLOAD: %s v%" PRIu64 " is being uploaded with other weights (sha256 %.16s...) and a SYNC "
                         "of it is under way", u->component, u->version, s->sha256);
            return false;
        }
        if (u->offset != 0) {
            brk_error_to(b, false, c->from, c->id, WIRE_E_BAD_REQUEST,
                         "UPLOAD: %s v%" PRIu64 " is being uploaded with %s (%" PRIu64 " bytes, sha256 %.16s...); "
                         "offset 0 replaces it", u->component, u->version,
                         strcmp(s->sha256, c->sha) ? "other weights" : "another size", s->size, s->sha256);
            return false;
        }
        brk_upl_close_slot(b, s, true);
        s = NULL;
    }
    if (!s && u->offset != 0) { /* nothing held: from the start */
        ack(b, c->from, c->id, u->component, u->version, 0, false);
        return false;
    }
    if (!s && !(s = open_slot(c))) {
        brk_error_from(b, false, c->from, c->id, reel_err(), "UPLOAD: "); /* busy or internal */
        return false;
    }
    if (c->replace && forget_stored(b, u->component, u->version) != 0) {
        brk_error_from(b, false, c->from, c->id, reel_err(), "UPLOAD: ");
        brk_upl_close_slot(b, s, true);
        return false;
    }
    c->s = s;
    if (u->offset != s->received) { /* out of order: where to go on */
        ack(b, c->from, c->id, u->component, u->version, s->received, false);
        return false;
    }
    return true;
}

/* Appends the chunk at s->received (frame: its bytes' frame, NULL: none)
 * and queues it to hash. A full disk: the spares are removed and the
 * write tried once more. 0, or -1 with a REEL_E_IO error (nothing
 * counted, the file cut back to what was). */
static int append(chunk_t *c, const zmq_msg_t *frame) {
    slot_t *s = c->s;
    const unsigned char *p = c->u->chunk->data;
    size_t n = c->u->chunk->bytes, done = 0;
    bool dropped = false;
    while (done < n) {
        ssize_t w = pwrite(s->fd, p + done, n - done, (off_t)(s->received + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == ENOSPC || errno == EDQUOT) && !dropped) {
            dropped = true;
            if (brk_upl_drop_spares(c->b) > 0) continue;
        }
        if (w <= 0) {
            reel_fail(REEL_E_IO, "cannot write the upload: %s", w < 0 ? strerror(errno) : "no progress");
            if (ftruncate(s->fd, (off_t)s->received) != 0) { /* the next try writes over it anyway */ }
            return -1;
        }
        done += (size_t)w;
    }
    brk_upl_hasher_push(s->h, frame, p, n);
    s->received += n;
    return 0;
}

/* The chunk written and counted. False when it cannot be kept (a full
 * disk): the workers waiting for the bytes hear it now, and so does every
 * FETCH of them until a chunk goes in again, not after their own timeout;
 * the trainer is answered ERROR and the slot stays (it may resume when
 * there is room). */
static bool chunk_write(chunk_t *c) {
    slot_t *s = c->s;
    const zmq_msg_t *frame = NULL; /* the chunk's frame in m */
    for (int k = 0; c->m && k < c->m->n_tensors && !frame; k++)
        if (c->u->chunk == &c->m->t[k]) frame = &c->m->frame[k];
    if (append(c, frame) != 0) {
        const reel_err_t e = *reel_err(); /* a copy: answering the FETCHes may fail on its own */
        brk_log_kind(&c->b->request_log, BRK_UPLOAD_LINES,
                     "upload %s v%" PRIu64 " stalls at %" PRIu64 " of %" PRIu64 " bytes: %s", s->component, s->version,
                     s->received, s->size, e.msg);
        snprintf(s->stalled, sizeof s->stalled, "%.299s", e.msg); /* its messages are shorter */
        s->touched_ms = brk_now_ms(); /* a trainer retrying at the right offset keeps its slot */
        brk_upl_fail_parked(c->b, s, WIRE_E_INTERNAL, e.msg); /* the broker's disk, not the request */
        brk_error_from(c->b, false, c->from, c->id, &e, "UPLOAD: "); /* io: internal */
        return false;
    }
    s->stalled[0] = '\0';
    s->touched_ms = brk_now_ms(); /* idle is measured from the last bytes kept */
    return true;
}

/* ---- the end of an upload ------------------------------------------------------- */

/* Renames the .part into place and writes DIR/C-vV.sha256 beside it (by
 * a temporary file and a rename): from then on the version is served. No
 * fsync: it would stall the routing loop for as long as the disk takes
 * to write the whole file (seconds for a large model, and heartbeats
 * missed meanwhile); a file a crash left short or torn is caught where it
 * matters, by the worker's sha256 check of what it fetched, and the
 * trainer uploads it again. 0, or -1 with a REEL_E_IO error and errno. */
static int publish(brk_t *b, const slot_t *s) {
    char part[1024], final[1024], sum[1024], tmp[1100];
    brk_upl_path(b, ".", s->component, s->version, ".part", part, sizeof part);
    brk_upl_path(b, "", s->component, s->version, ".safetensors", final, sizeof final);
    brk_upl_path(b, "", s->component, s->version, ".sha256", sum, sizeof sum);
    snprintf(tmp, sizeof tmp, "%s.tmp", sum);
    /* (tried again after a full disk: the data may be in place already) */
    if (rename(part, final) != 0 && !(errno == ENOENT && access(final, F_OK) == 0)) goto fail;
    int tfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    FILE *f = tfd >= 0 ? fdopen(tfd, "w") : NULL;
    if (!f) {
        if (tfd >= 0) close(tfd);
        goto fail;
    }
    int bad = fprintf(f, "%s\n", s->sha256) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, sum) != 0) goto fail;
    return 0;
fail:;
    int e = errno;
    reel_fail(REEL_E_IO, "cannot store the upload: %s", strerror(e));
    unlink(tmp);
    errno = e;
    return -1;
}

/* Whether the bytes hash to the digest announced. False: refused (logged,
 * audited, the trainer answered, the slot closed and its .part removed). */
static bool finish_digest(chunk_t *c) {
    slot_t *s = c->s;
    if (strcmp(c->digest, s->sha256) == 0) return true;
    brk_log_kind(&c->b->request_log, BRK_UPLOAD_LINES,
                 "upload %s v%" PRIu64 " refused: its bytes hash to %.16s..., not %.16s...", s->component, s->version,
                 c->digest, s->sha256);
    brk_cq_audit(c->b->cat, c->who.name, reel_role_name(c->who.role), "upload", s->component, s->version, s->sha256,
                 NULL, "refused: sha256 mismatch");
    brk_error_to(c->b, false, c->from, c->id, WIRE_E_BAD_REQUEST, "UPLOAD: the bytes hash to %s, not the announced %s",
                 c->digest, s->sha256);
    brk_upl_close_slot(c->b, s, true);
    return false;
}

/* The file cut to size (a longer spare written over) and published, once
 * more after a full disk's spares are removed. False: the trainer answered
 * ERROR, the slot closed and its .part removed. */
static bool finish_store(chunk_t *c) {
    brk_t *b = c->b;
    slot_t *s = c->s;
    int rc = 0;
    if (s->spare_size > s->size && ftruncate(s->fd, (off_t)s->size) != 0) {
        rc = reel_fail(REEL_E_IO, "cannot cut the recycled file to size: %s", strerror(errno));
    } else {
        rc = publish(b, s);
        if (rc != 0 && (errno == ENOSPC || errno == EDQUOT) && brk_upl_drop_spares(b) > 0) rc = publish(b, s);
    }
    if (rc == 0) return true;
    brk_log_kind(&b->request_log, BRK_UPLOAD_LINES, "upload %s v%" PRIu64 ": %s", s->component, s->version,
                 reel_err()->msg);
    brk_error_from(b, false, c->from, c->id, reel_err(), "UPLOAD: "); /* io: internal */
    brk_upl_close_slot(b, s, true);
    return false;
}

/* All of it came: hashed, compared, published; the FETCHes waiting for
 * the last bytes answered (a SYNC that came first: its workers wait for
 * them), the trainer answered complete, the slot closed. */
static void chunk_finish(chunk_t *c) {
    slot_t *s = c->s;
    brk_upl_hasher_end(&s->h, c->digest);
    brk_zap_sender(c->b->zap, &c->who);
    if (!c->from) { /* a copy of the peer broker's (brk_ha_copy.c) */
        memset(&c->who, 0, sizeof c->who);
        snprintf(c->who.name, sizeof c->who.name, "peer broker");
        c->who.role = REEL_ROLE_BROKER;
    }
    if (!finish_digest(c) || !finish_store(c)) return;
    char final[1024];
    brk_upl_path(c->b, "", s->component, s->version, ".safetensors", final, sizeof final);
    brk_upl_serve_parked(c->b, s, c->u, c->m);
    brk_log_kind(&c->b->request_log, BRK_UPLOAD_LINES,
                 "upload %s v%" PRIu64 " stored: %" PRIu64 " bytes, sha256 %.16s... (%s)", s->component, s->version,
                 s->size, s->sha256, final);
    brk_cq_audit(c->b->cat, c->who.name, reel_role_name(c->who.role), "upload", s->component, s->version, s->sha256,
                 final, c->from ? "stored" : "stored: copied from the peer broker of the pair");
    ack(c->b, c->from, c->id, s->component, s->version, s->size, true);
    brk_upl_close_slot(c->b, s, false);
}

void brk_upload_chunk(brk_t *b, const zmq_msg_t *from, uint64_t id, const msg_upload_t *u, const wire_msg_t *m) {
    chunk_t c = { .b = b, .from = from, .id = id, .u = u, .m = m };
    if (!chunk_admit(&c) || !chunk_slot(&c) || !chunk_write(&c)) return;
    slot_t *s = c.s;
    if (s->received == s->size) {
        chunk_finish(&c);
    } else {
        brk_upl_serve_parked(b, s, u, m);
        ack(b, from, id, u->component, u->version, s->received, false);
    }
}

bool brk_upload_progress(brk_t *b, const char *component, uint64_t version, const char *sha256, uint64_t *received) {
    char sha[65];
    brk_upl_lower(sha256, sha);
    slot_t *s = b->uploads ? brk_upl_slot(b, component, version) : NULL;
    if (!s || strcmp(s->sha256, sha)) return false;
    *received = s->received;
    return true;
}

void brk_upload_drop(brk_t *b, const char *component, uint64_t version, const char *sha256) {
    char sha[65];
    brk_upl_lower(sha256, sha);
    slot_t *s = b->uploads ? brk_upl_slot(b, component, version) : NULL;
    if (s && !strcmp(s->sha256, sha)) brk_upl_close_slot(b, s, true);
}
