/* t2v.c -- text to video around the DiT: the text encoder with its prompt
 * cache, and the VAE to frames and MP4 (see t2v.h). */
#include "model/t2v.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "media/tokenizer.h"
#include "media/video.h"
#include "model/hf_parts.h"
#include "model/pth.h"
#include "model/t5.h"
#include "model/vae.h"

const char T2V_WAN_NEG_PROMPT[] =
    "\xe8\x89\xb2\xe8\xb0\x83\xe8\x89\xb3\xe4\xb8\xbd\xef\xbc\x8c\xe8\xbf\x87\xe6\x9b\x9d\xef\xbc\x8c\xe9\x9d\x99"
    "\xe6\x80\x81\xef\xbc\x8c\xe7\xbb\x86\xe8\x8a\x82\xe6\xa8\xa1\xe7\xb3\x8a\xe4\xb8\x8d\xe6\xb8\x85\xef\xbc\x8c"
    "\xe5\xad\x97\xe5\xb9\x95\xef\xbc\x8c\xe9\xa3\x8e\xe6\xa0\xbc\xef\xbc\x8c\xe4\xbd\x9c\xe5\x93\x81\xef\xbc\x8c"
    "\xe7\x94\xbb\xe4\xbd\x9c\xef\xbc\x8c\xe7\x94\xbb\xe9\x9d\xa2\xef\xbc\x8c\xe9\x9d\x99\xe6\xad\xa2\xef\xbc\x8c"
    "\xe6\x95\xb4\xe4\xbd\x93\xe5\x8f\x91\xe7\x81\xb0\xef\xbc\x8c\xe6\x9c\x80\xe5\xb7\xae\xe8\xb4\xa8\xe9\x87\x8f"
    "\xef\xbc\x8c\xe4\xbd\x8e\xe8\xb4\xa8\xe9\x87\x8f\xef\xbc\x8cJPEG\xe5\x8e\x8b\xe7\xbc\xa9\xe6\xae\x8b\xe7\x95"
    "\x99\xef\xbc\x8c\xe4\xb8\x91\xe9\x99\x8b\xe7\x9a\x84\xef\xbc\x8c\xe6\xae\x8b\xe7\xbc\xba\xe7\x9a\x84\xef\xbc"
    "\x8c\xe5\xa4\x9a\xe4\xbd\x99\xe7\x9a\x84\xe6\x89\x8b\xe6\x8c\x87\xef\xbc\x8c\xe7\x94\xbb\xe5\xbe\x97\xe4\xb8"
    "\x8d\xe5\xa5\xbd\xe7\x9a\x84\xe6\x89\x8b\xe9\x83\xa8\xef\xbc\x8c\xe7\x94\xbb\xe5\xbe\x97\xe4\xb8\x8d\xe5\xa5"
    "\xbd\xe7\x9a\x84\xe8\x84\xb8\xe9\x83\xa8\xef\xbc\x8c\xe7\x95\xb8\xe5\xbd\xa2\xe7\x9a\x84\xef\xbc\x8c\xe6\xaf"
    "\x81\xe5\xae\xb9\xe7\x9a\x84\xef\xbc\x8c\xe5\xbd\xa2\xe6\x80\x81\xe7\x95\xb8\xe5\xbd\xa2\xe7\x9a\x84\xe8\x82"
    "\xa2\xe4\xbd\x93\xef\xbc\x8c\xe6\x89\x8b\xe6\x8c\x87\xe8\x9e\x8d\xe5\x90\x88\xef\xbc\x8c\xe9\x9d\x99\xe6\xad"
    "\xa2\xe4\xb8\x8d\xe5\x8a\xa8\xe7\x9a\x84\xe7\x94\xbb\xe9\x9d\xa2\xef\xbc\x8c\xe6\x9d\x82\xe4\xb9\xb1\xe7\x9a"
    "\x84\xe8\x83\x8c\xe6\x99\xaf\xef\xbc\x8c\xe4\xb8\x89\xe6\x9d\xa1\xe8\x85\xbf\xef\xbc\x8c\xe8\x83\x8c\xe6\x99"
    "\xaf\xe4\xba\xba\xe5\xbe\x88\xe5\xa4\x9a\xef\xbc\x8c\xe5\x80\x92\xe7\x9d\x80\xe8\xb5\xb0";

/* ---- the prompt cache ------------------------------------------------------------ */

typedef struct entry {
    struct entry *prev, *next;   /* most recent first */
    uint64_t hash;
    char *text;
    float *rows;                 /* [n, dim] */
    int64_t n;
    size_t bytes;                /* what it counts against the bound */
} entry_t;

struct t2v_text {
    pthread_mutex_t mu;          /* one encode at a time; guards the cache */
    tok_t *tok;
    t5_model_t *t5;
    kern_stream_t *s;            /* its own: the callers' streams hold captured graphs */
    int64_t text_len, dim;
    size_t max_bytes;
    entry_t *head, *tail;
    t2v_text_stats_t st;
};

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void unlink_entry(t2v_text_t *t, entry_t *e) {
    if (e->prev) e->prev->next = e->next;
    else t->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else t->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(t2v_text_t *t, entry_t *e) {
    e->next = t->head;
    e->prev = NULL;
    if (t->head) t->head->prev = e;
    t->head = e;
    if (!t->tail) t->tail = e;
}

static void entry_free(entry_t *e) {
    if (!e) return;
    free(e->text);
    free(e->rows);
    free(e);
}

static entry_t *cache_find(t2v_text_t *t, const char *text, uint64_t h) {
    for (entry_t *e = t->head; e; e = e->next)
        if (e->hash == h && !strcmp(e->text, text)) return e;
    return NULL;
}

/* Keeps e (most recent) and drops the least recent past the bound; an
 * entry larger than the bound on its own is not kept (freed). */
static void cache_put(t2v_text_t *t, entry_t *e) {
    if (e->bytes > t->max_bytes) {
        entry_free(e);
        return;
    }
    push_front(t, e);
    t->st.bytes += e->bytes;
    t->st.entries++;
    while (t->st.bytes > t->max_bytes && t->tail) {
        entry_t *old = t->tail;
        unlink_entry(t, old);
        t->st.bytes -= old->bytes;
        t->st.entries--;
        t->st.evictions++;
        entry_free(old);
    }
}

/* ---- the text encoder ------------------------------------------------------------ */

t2v_text_t *t2v_text_new(kern_backend_t *b, const char *t5_path, const char *tok_path, int64_t text_len,
                         int64_t text_dim, size_t cache_bytes) {
    if (text_len < 1) {
        reel_fail(REEL_E_INVALID, "a text encoder needs a model with text_len (the DiT's config has none)");
        return NULL;
    }
    t2v_text_t *t = calloc(1, sizeof *t);
    if (!t) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->text_len = text_len;
    t->max_bytes = cache_bytes;
    st_file_t *f = NULL;
    if (!(t->tok = tok_open(tok_path)) || !(f = hf_part_open(t5_path, HF_PART_T5)) ||
        !(t->t5 = t5_model_load(b, f, KERN_F32)) || !(t->s = kern_stream_new(b))) {
        hf_part_explain(f); /* a renamed file's own names */
        reel_fail_prefix("text encoder: ");
        st_close(&f);
        t2v_text_destroy(&t);
        return NULL;
    }
    st_close(&f);
    const t5_config_t *c = t5_model_config(t->t5);
    t->dim = c->dim;
    if (c->dim != text_dim || tok_vocab_size(t->tok) > c->vocab) {
        reel_fail(REEL_E_INVALID, "text encoder: %s is %lld wide with a vocabulary of %lld; the DiT takes text_dim "
                  "%lld and the tokenizer has %d pieces", t5_path, (long long)c->dim, (long long)c->vocab,
                  (long long)text_dim, tok_vocab_size(t->tok));
        t2v_text_destroy(&t);
        return NULL;
    }
    return t;
}

void t2v_text_destroy(t2v_text_t **tp) {
    if (!tp || !*tp) return;
    t2v_text_t *t = *tp;
    for (entry_t *e = t->head, *n; e; e = n) {
        n = e->next;
        entry_free(e);
    }
    kern_stream_destroy(&t->s);
    t5_model_destroy(&t->t5);
    tok_close(&t->tok);
    pthread_mutex_destroy(&t->mu);
    free(t);
    *tp = NULL;
}

const char *t2v_text_name(const t2v_text_t *t) { return t5_model_config(t->t5)->name; }
size_t t2v_text_bytes(const t2v_text_t *t) { return t5_model_bytes(t->t5); }

void t2v_text_stats(t2v_text_t *t, t2v_text_stats_t *out) {
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    pthread_mutex_unlock(&t->mu);
}

/* A new cache entry: text tokenized and encoded at its real length. */
static entry_t *encode(t2v_text_t *t, const char *text, uint64_t h) {
    int32_t *ids = malloc((size_t)t->text_len * sizeof *ids);
    entry_t *e = calloc(1, sizeof *e);
    int n = ids && e ? tok_encode(t->tok, text, (int)t->text_len, ids, (int)t->text_len) : -1;
    if (!ids || !e) reel_fail(REEL_E_NOMEM, "out of memory encoding a prompt");
    if (n < 1 || !(e->rows = malloc((size_t)n * (size_t)t->dim * sizeof *e->rows)) || !(e->text = strdup(text)) ||
        t5_encode(t->t5, t->s, ids, n, 0, e->rows) != 0) {
        if (n >= 1 && (!e->rows || !e->text)) reel_fail(REEL_E_NOMEM, "out of memory encoding a prompt");
        free(ids);
        entry_free(e);
        return NULL;
    }
    free(ids);
    e->hash = h;
    e->n = n;
    e->bytes = (size_t)n * (size_t)t->dim * sizeof(float) + strlen(text) + 1 + sizeof *e;
    return e;
}

int t2v_text_context(t2v_text_t *t, const char *text, float **out, int64_t *rows) {
    *out = NULL;
    float *ctx = calloc((size_t)(t->text_len * t->dim), sizeof *ctx);
    if (!ctx) return reel_fail(REEL_E_NOMEM, "out of memory for a context of %lld rows", (long long)t->text_len);
    uint64_t h = fnv1a(text);
    pthread_mutex_lock(&t->mu);
    entry_t *e = cache_find(t, text, h);
    if (e) {
        unlink_entry(t, e);
        t->st.bytes -= e->bytes;
        t->st.entries--;
        t->st.hits++;
    } else {
        e = encode(t, text, h);
        t->st.misses++;
    }
    if (!e) {
        pthread_mutex_unlock(&t->mu);
        free(ctx);
        return -1;
    }
    memcpy(ctx, e->rows, (size_t)e->n * (size_t)t->dim * sizeof *ctx);
    *rows = e->n;
    cache_put(t, e);
    pthread_mutex_unlock(&t->mu);
    *out = ctx;
    return 0;
}

/* ---- the VAE --------------------------------------------------------------------- */

struct t2v_vae {
    pthread_mutex_t mu;
    vae_model_t *m;
    kern_stream_t *s;            /* its own, as the text encoder's */
};

t2v_vae_t *t2v_vae_new(kern_backend_t *b, const char *path, int64_t in_channels) {
    t2v_vae_t *v = calloc(1, sizeof *v);
    if (!v) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&v->mu, NULL);
    st_file_t *f = hf_part_open(path, HF_PART_VAE);
    if (!f || !(v->m = vae_model_load(b, f, KERN_F32)) || !(v->s = kern_stream_new(b))) {
        hf_part_explain(f);
        reel_fail_prefix("VAE: ");
        st_close(&f);
        t2v_vae_destroy(&v);
        return NULL;
    }
    st_close(&f);
    if (vae_model_config(v->m)->z_dim != in_channels) {
        reel_fail(REEL_E_INVALID, "VAE: %s decodes %lld latent channels; the DiT makes %lld", path,
                  (long long)vae_model_config(v->m)->z_dim, (long long)in_channels);
        t2v_vae_destroy(&v);
        return NULL;
    }
    return v;
}

void t2v_vae_destroy(t2v_vae_t **vp) {
    if (!vp || !*vp) return;
    kern_stream_destroy(&(*vp)->s);
    vae_model_destroy(&(*vp)->m);
    pthread_mutex_destroy(&(*vp)->mu);
    free(*vp);
    *vp = NULL;
}

const char *t2v_vae_name(const t2v_vae_t *v) { return vae_model_config(v->m)->name; }
size_t t2v_vae_bytes(const t2v_vae_t *v) { return vae_model_bytes(v->m); }

/* Progress over a sample's latent frames, reported over all n samples. */
typedef struct {
    vae_progress_fn fn;
    void *user;
    int64_t base, total;
} decode_progress_t;

static int sample_progress(void *user, int64_t done, int64_t total) {
    (void)total;
    decode_progress_t *p = user;
    return p->fn(p->user, p->base + done, p->total);
}

int t2v_vae_decode(t2v_vae_t *v, const float *latents, int n, const int64_t shape[4],
                   uint8_t **frames, uint8_t **mp4, size_t *mp4_len) {
    return t2v_vae_decode_progress(v, latents, n, shape, frames, mp4, mp4_len, NULL, NULL);
}

int t2v_vae_decode_progress(t2v_vae_t *v, const float *latents, int n, const int64_t shape[4], uint8_t **frames,
                            uint8_t **mp4, size_t *mp4_len, vae_progress_fn progress, void *user) {
    *frames = NULL;
    if (mp4) *mp4 = NULL;
    int64_t F = vae_video_frames(shape[1]), H = 8 * shape[2], W = 8 * shape[3];
    size_t px = (size_t)(F * H * W), lat = (size_t)(shape[0] * shape[1] * shape[2] * shape[3]);
    float *video = malloc(3 * px * sizeof *video);
    uint8_t *rgb = malloc((size_t)n * px * 3);
    if (!video || !rgb) {
        free(video);
        free(rgb);
        return reel_fail(REEL_E_NOMEM, "out of memory for %d decoded video(s) of %lld frames", n, (long long)F);
    }
    int rc = 0;
    pthread_mutex_lock(&v->mu);
    decode_progress_t dp = { progress, user, 0, (int64_t)n * shape[1] };
    for (int i = 0; i < n && rc == 0; i++) {
        dp.base = (int64_t)i * shape[1];
        rc = vae_decode(v->m, v->s, latents + (size_t)i * lat, shape[1], shape[2], shape[3], video,
                        progress ? sample_progress : NULL, &dp);
        if (rc == 0) video_frames_from_f32(video, F, H, W, rgb + (size_t)i * px * 3);
    }
    pthread_mutex_unlock(&v->mu);
    free(video);
    if (rc == 0 && mp4) rc = video_encode_mp4(rgb, F, H, W, VIDEO_FPS_WAN, mp4, mp4_len);
    if (rc != 0) {
        free(rgb);
        return -1;
    }
    *frames = rgb;
    return 0;
}
