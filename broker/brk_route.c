/* brk_route.c -- rendezvous owners, eligibility, the bounded queue, recent
 * keys and the sync version check (see brk_route.h). Pure: no sockets, no
 * clocks, no catalog. */
#include "broker/brk_route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture_cache/key.h"
#include "base/error.h"

uint64_t brk_splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* FNV-1a alone is a weak mix (nearby names give nearby hashes); the
 * splitmix finaliser makes every bit of the score depend on both inputs, so
 * owners spread evenly over workers. The name is hashed as capture keys
 * are (cap_hash_text), by the one FNV-1a of the tree. */
uint64_t brk_rendezvous_score(uint64_t shard_hash, const char *name) {
    return brk_splitmix64(shard_hash ^ cap_hash_text(name));
}

bool brk_component_served(const char *comp) {
    if (!strcmp(comp, BRK_COMPONENT)) return true;
    reel_fail(REEL_E_UNSUPPORTED, "workers serve component \"%s\" only, not \"%s\"", BRK_COMPONENT, comp);
    return false;
}

int brk_loop_kind(bool sde, const char *solver) {
    const bool unipc = solver && !strcmp(solver, "unipc"), dpmpp = solver && !strcmp(solver, "dpm++");
    if (sde) return unipc ? BRK_LOOP_SDE_UNIPC : dpmpp ? BRK_LOOP_SDE_DPMPP : BRK_LOOP_SDE;
    return unipc ? BRK_LOOP_UNIPC : dpmpp ? BRK_LOOP_DPMPP : BRK_LOOP_EULER;
}

uint64_t brk_shard_hash(const char *model, int loop, const int64_t latent[4],
                        const int64_t context[2], bool cfg, int64_t batch) {
    char full[CAP_MODEL_MAX];
    if (!model || !*model) {
        reel_fail(REEL_E_INVALID, "GEN: empty model name");
        return 0;
    }
    if (snprintf(full, sizeof full, "tinydit:%s", model) >= (int)sizeof full) {
        reel_fail(REEL_E_INVALID, "model name '%.64s' is too long", model);
        return 0;
    }
    cap_key_t k;
    static const char *const kinds[] = { "euler", "sde", "unipc", "dpm++", "sde-unipc", "sde-dpm++" };
    const char *kind = loop >= 0 && loop < (int)(sizeof kinds / sizeof kinds[0]) ? kinds[loop] : "euler";
    if (cap_key_denoise_batch(&k, "", "", full, kind, KERN_F32, batch > 1 ? batch : 1, latent,
                              context, cfg, BRK_COMPONENT, 0) < 0) {
        /* Whatever the key refused (a name, a size past its limits) is the
         * GEN's fault: invalid, whichever code the key gave it. */
        reel_err_t e = *reel_err();
        reel_fail_detail(REEL_E_INVALID, e.detail[0] ? e.detail : NULL, "%s", e.msg);
        return 0;
    }
    return cap_key_shard_hash(&k);
}

uint64_t brk_shard_hash_memo(brk_shard_memo_t *memo, const char *model, int loop, const int64_t latent[4],
                             const int64_t context[2], bool cfg, int64_t batch) {
    size_t len = model ? strnlen(model, BRK_NAME_MAX) : BRK_NAME_MAX;
    if (batch < 1) batch = 1;
    if (len == 0 || len >= BRK_NAME_MAX) return brk_shard_hash(model, loop, latent, context, cfg, batch);
    uint64_t h = brk_splitmix64(cap_hash_text(model) ^ (uint64_t)loop << 1 ^ (uint64_t)cfg ^ (uint64_t)batch << 3);
    for (int i = 0; i < 4; i++) h = brk_splitmix64(h ^ (uint64_t)latent[i]);
    for (int i = 0; i < 2; i++) h = brk_splitmix64(h ^ (uint64_t)context[i]);
    brk_shard_memo_slot_t *s = &memo->slot[h % BRK_SHARD_MEMO];
    if (!strcmp(s->model, model) && s->loop == loop && s->cfg == cfg && s->batch == batch &&
        !memcmp(s->latent, latent, sizeof s->latent) && !memcmp(s->context, context, sizeof s->context))
        return s->hash;
    uint64_t shard = brk_shard_hash(model, loop, latent, context, cfg, batch);
    if (!shard) return 0;
    memcpy(s->model, model, len + 1);
    s->loop = loop;
    s->cfg = cfg;
    s->batch = batch;
    memcpy(s->latent, latent, sizeof s->latent);
    memcpy(s->context, context, sizeof s->context);
    s->hash = shard;
    return shard;
}

/* ---- peers ----------------------------------------------------------------- */

uint64_t brk_peer_version(const brk_peer_t *p, const char *comp) {
    for (int i = 0; i < p->n_versions; i++)
        if (!strcmp(p->versions[i].name, comp)) return p->versions[i].version;
    return 0;
}

int brk_peer_set_version(brk_peer_t *p, const char *comp, uint64_t version) {
    for (int i = 0; i < p->n_versions; i++)
        if (!strcmp(p->versions[i].name, comp)) {
            p->versions[i].version = version;
            return 0;
        }
    if (p->n_versions >= BRK_MAX_COMPONENTS) return -1;
    brk_version_t *v = &p->versions[p->n_versions++];
    snprintf(v->name, sizeof v->name, "%s", comp);
    v->version = version;
    return 0;
}

unsigned brk_loops_from(const char (*solvers)[MSG_NAME_MAX], size_t n) {
    unsigned bits = 1u << BRK_LOOP_EULER | 1u << BRK_LOOP_SDE;
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(solvers[i], "unipc")) bits |= 1u << BRK_LOOP_UNIPC;
        else if (!strcmp(solvers[i], "dpm++")) bits |= 1u << BRK_LOOP_DPMPP;
        else if (!strcmp(solvers[i], "sde-unipc")) bits |= 1u << BRK_LOOP_SDE_UNIPC;
        else if (!strcmp(solvers[i], "sde-dpm++")) bits |= 1u << BRK_LOOP_SDE_DPMPP;
    }
    return bits;
}

unsigned brk_caps_from(const char *text_encoder, const char *vae) {
    return (text_encoder && *text_encoder ? 1u << BRK_CAP_PROMPT : 0u) | (vae && *vae ? 1u << BRK_CAP_DECODE : 0u);
}

int brk_peers_able(const brk_peer_t *const *peers, int n, unsigned needs, const brk_peer_t **out, int *idx) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if ((peers[i]->loops & needs) == needs) {
            out[k] = peers[i];
            idx[k++] = i;
        }
    return k;
}

int brk_peers_running(const brk_peer_t *const *peers, int n, int loop, const brk_peer_t **out, int *idx) {
    return brk_peers_able(peers, n, 1u << loop, out, idx);
}

bool brk_peer_serves(const brk_peer_t *p, const char *model) {
    for (int i = 0; i < p->n_models; i++)
        if (!strcmp(p->models[i], model)) return true;
    return false;
}

bool brk_peer_has(const brk_peer_t *p, uint64_t required) { return brk_peer_version(p, BRK_COMPONENT) >= required; }

bool brk_peer_eligible(const brk_peer_t *p, const char *model, uint64_t required) {
    return p->routable && brk_peer_serves(p, model) &&
           (brk_peer_has(p, required) || (p->applying && p->applying >= required));
}

int brk_owner(const brk_peer_t *const *peers, int n, uint64_t shard_hash, const char *model,
              uint64_t required) {
    int best = -1;
    uint64_t best_score = 0;
    for (int i = 0; i < n; i++) {
        if (!brk_peer_eligible(peers[i], model, required)) continue;
        uint64_t s = brk_rendezvous_score(shard_hash, peers[i]->name);
        if (best < 0 || s > best_score ||
            (s == best_score && strcmp(peers[i]->name, peers[best]->name) < 0)) {
            best = i;
            best_score = s;
        }
    }
    return best;
}

/* ---- queue ------------------------------------------------------------------- */

int brk_queue_init(brk_queue_t *q, size_t max) {
    memset(q, 0, sizeof *q);
    q->max = max;
    q->cap = max ? max : 1;
    q->v = malloc(q->cap * sizeof *q->v);
    if (!q->v) {
        q->cap = 0;
        return -1;
    }
    return 0;
}

void brk_queue_free(brk_queue_t *q) {
    free(q->v);
    q->v = NULL;
    q->n = q->cap = 0;
}

static int queue_room(brk_queue_t *q) {
    if (q->n < q->cap) return 0;
    size_t cap = q->cap ? q->cap * 2 : 8;
    void **v = realloc(q->v, cap * sizeof *v);
    if (!v) return -1;
    q->v = v;
    q->cap = cap;
    return 0;
}

int brk_queue_push(brk_queue_t *q, void *item) {
    if (q->n >= q->max || queue_room(q) < 0) return -1;
    q->v[q->n++] = item;
    return 0;
}

int brk_queue_push_front(brk_queue_t *q, void *item) {
    if (queue_room(q) < 0) return -1;
    memmove(q->v + 1, q->v, q->n * sizeof *q->v);
    q->v[0] = item;
    q->n++;
    return 0;
}

void *brk_queue_remove(brk_queue_t *q, size_t i) {
    void *item = q->v[i];
    memmove(q->v + i, q->v + i + 1, (q->n - i - 1) * sizeof *q->v);
    q->n--;
    return item;
}

void brk_queue_compact(brk_queue_t *q) {
    size_t o = 0;
    for (size_t i = 0; i < q->n; i++)
        if (q->v[i]) q->v[o++] = q->v[i];
    q->n = o;
}

/* ---- recent keys -------------------------------------------------------------- */

void brk_keys_note(uint64_t keys[BRK_KEYS_RECENT], int *n, uint64_t h) {
    int at = *n < BRK_KEYS_RECENT ? *n : BRK_KEYS_RECENT - 1; /* slot that drops out */
    for (int i = 0; i < *n; i++)
        if (keys[i] == h) {
            at = i;
            break;
        }
    if (at == *n) (*n)++;
    memmove(keys + 1, keys, (size_t)at * sizeof *keys);
    keys[0] = h;
}
