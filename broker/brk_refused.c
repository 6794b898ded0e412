/* brk_refused.c -- the refused peers, each counted once, in a table of
 * the most recent (see brk_refused.h). A linear scan of 32 entries per
 * refusal: refusals come at the pace of handshakes. */
#include "broker/brk_refused.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"

int brk_refused_init(brk_refused_t *t) {
    memset(t, 0, sizeof *t);
    if (pthread_mutex_init(&t->mu, NULL) != 0) return reel_fail(REEL_E_IO, "cannot create a mutex");
    return 0;
}

void brk_refused_fini(brk_refused_t *t) { pthread_mutex_destroy(&t->mu); }

static bool same_peer(const brk_refused_peer_t *p, bool worker_side, const char *key, const char *address,
                      const char *why) {
    if (p->worker_side != worker_side || strcmp(p->key, key) || strcmp(p->address, address)) return false;
    return key[0] || !strcmp(p->why, why); /* no key: one peer per reason */
}

bool brk_refused_note(brk_refused_t *t, bool worker_side, const char *key, const char *name, const char *address,
                      const char *why, int64_t now_ms, uint64_t *peer_count) {
    char k[MSG_REFUSED_KEY_MAX], a[MSG_REFUSED_ADDR_MAX], w[MSG_REFUSED_WHY_MAX];
    snprintf(k, sizeof k, "%s", key ? key : "");
    snprintf(a, sizeof a, "%s", address ? address : "");
    snprintf(w, sizeof w, "%s", why ? why : "");
    pthread_mutex_lock(&t->mu);
    brk_refused_peer_t *p = NULL;
    for (int i = 0; i < t->n && !p; i++)
        if (same_peer(&t->e[i], worker_side, k, a, w)) p = &t->e[i];
    bool fresh = !p, worth;
    if (fresh) {
        if (t->n < BRK_REFUSED_PEERS) {
            p = &t->e[t->n++];
        } else { /* the one seen least recently makes room */
            p = &t->e[0];
            for (int i = 1; i < t->n; i++)
                if (t->e[i].last_ms < p->last_ms) p = &t->e[i];
        }
        memset(p, 0, sizeof *p);
        p->worker_side = worker_side;
        memcpy(p->key, k, sizeof k);
        memcpy(p->address, a, sizeof a);
        t->peers++;
    }
    snprintf(p->name, sizeof p->name, "%s", name ? name : "");
    memcpy(p->why, w, sizeof w);
    p->count++;
    p->last_ms = now_ms;
    worth = fresh ? t->peers <= 10 || t->peers % 1000 == 0 : p->count % 1000 == 0;
    if (peer_count) *peer_count = p->count;
    pthread_mutex_unlock(&t->mu);
    return worth;
}

uint64_t brk_refused_peers(brk_refused_t *t) {
    pthread_mutex_lock(&t->mu);
    uint64_t n = t->peers;
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t brk_refused_recent(brk_refused_t *t, msg_refused_peer_t *out, size_t max, int64_t now_ms) {
    pthread_mutex_lock(&t->mu);
    bool taken[BRK_REFUSED_PEERS] = { false };
    size_t n = 0;
    for (; n < max && n < (size_t)t->n; n++) { /* the most recent not listed yet: 32 x 32 at most */
        int best = -1;
        for (int i = 0; i < t->n; i++)
            if (!taken[i] && (best < 0 || t->e[i].last_ms > t->e[best].last_ms)) best = i;
        taken[best] = true;
        const brk_refused_peer_t *p = &t->e[best];
        msg_refused_peer_t *o = &out[n];
        memset(o, 0, sizeof *o);
        snprintf(o->socket, sizeof o->socket, "%s", p->worker_side ? "worker" : "client");
        memcpy(o->key, p->key, sizeof o->key);
        memcpy(o->name, p->name, sizeof o->name);
        memcpy(o->address, p->address, sizeof o->address);
        memcpy(o->why, p->why, sizeof o->why);
        o->count = p->count;
        o->ago_ms = now_ms > p->last_ms ? (uint64_t)(now_ms - p->last_ms) : 0;
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}
