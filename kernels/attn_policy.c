/* attn_policy.c -- the attention mode (REEL_ATTN, --attention) and whether
 * cuDNN's fused SDPA can run in this process (kernels/ops.h): state only,
 * calling nothing of the kernels, so the CUDA backend can report to it and
 * attention.c read it without a circle. */
#include "kernels/ops.h"
#include "base/error.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t mode_mu = PTHREAD_MUTEX_INITIALIZER;
static bool mode_set;
static kern_attn_mode_t mode_now;
static bool env_bad;
static bool sdpa_ready;
static char sdpa_why[256] = "no CUDA backend has come up in this process";

int kern_attention_mode_parse(const char *s, kern_attn_mode_t *out) {
    if (!strcmp(s, "auto")) *out = KERN_ATTN_MODE_AUTO;
    else if (!strcmp(s, "fused")) *out = KERN_ATTN_MODE_FUSED;
    else if (!strcmp(s, "decomposed")) *out = KERN_ATTN_MODE_DECOMPOSED;
    else return reel_fail(REEL_E_INVALID, "attention mode '%s': auto, fused or decomposed", s);
    return 0;
}

const char *kern_attention_mode_name(kern_attn_mode_t m) {
    return m == KERN_ATTN_MODE_FUSED ? "fused" : m == KERN_ATTN_MODE_DECOMPOSED ? "decomposed" : "auto";
}

kern_attn_mode_t kern_attention_mode(void) {
    pthread_mutex_lock(&mode_mu);
    if (!mode_set) {
        const char *e = getenv("REEL_ATTN");
        kern_attn_mode_t m = KERN_ATTN_MODE_AUTO;
        if (e && *e && kern_attention_mode_parse(e, &m) != 0) env_bad = true;
        mode_now = m;
        mode_set = true;
    }
    kern_attn_mode_t m = mode_now;
    pthread_mutex_unlock(&mode_mu);
    return m;
}

void kern_attention_mode_reload(void) {
    pthread_mutex_lock(&mode_mu);
    mode_set = false;
    env_bad = false;
    pthread_mutex_unlock(&mode_mu);
}

void kern_attention_set_mode(kern_attn_mode_t m) {
    pthread_mutex_lock(&mode_mu);
    mode_now = m;
    mode_set = true;
    env_bad = false;
    pthread_mutex_unlock(&mode_mu);
}

void kern_attention_set_sdpa_ready(bool ready, const char *why) {
    pthread_mutex_lock(&mode_mu);
    sdpa_ready = ready;
    snprintf(sdpa_why, sizeof sdpa_why, "%s", why ? why : "");
    pthread_mutex_unlock(&mode_mu);
}

bool kern_attention_sdpa_state(char *why, size_t len) {
    pthread_mutex_lock(&mode_mu);
    bool ready = sdpa_ready;
    if (why && len) snprintf(why, len, "%s", sdpa_why);
    pthread_mutex_unlock(&mode_mu);
    return ready;
}

bool kern_attention_env_bad(void) {
    kern_attention_mode(); /* reads $REEL_ATTN once */
    pthread_mutex_lock(&mode_mu);
    bool bad = env_bad;
    pthread_mutex_unlock(&mode_mu);
    return bad;
}

/* ---- shapes whose fused SDPA failed at run time ---- */

#define FAILED_MAX 64 /* shapes remembered; past that, the oldest is overwritten */

typedef struct {
    int64_t nq, nk, d;
    char msg[256];
} failed_shape_t;

static failed_shape_t failed[FAILED_MAX];
static int failed_n, failed_next;
static uint64_t fallbacks;

static int failed_find(int64_t nq, int64_t nk, int64_t d) {
    for (int i = 0; i < failed_n; i++)
        if (failed[i].nq == nq && failed[i].nk == nk && failed[i].d == d) return i;
    return -1;
}

bool kern_attention_sdpa_fail(int64_t nq, int64_t nk, int64_t head_dim, const char *msg) {
    pthread_mutex_lock(&mode_mu);
    fallbacks++;
    bool fresh = failed_find(nq, nk, head_dim) < 0;
    if (fresh) {
        failed_shape_t *f = &failed[failed_next];
        failed_next = (failed_next + 1) % FAILED_MAX;
        if (failed_n < FAILED_MAX) failed_n++;
        f->nq = nq;
        f->nk = nk;
        f->d = head_dim;
        snprintf(f->msg, sizeof f->msg, "%s", msg ? msg : "");
    }
    pthread_mutex_unlock(&mode_mu);
    return fresh;
}

bool kern_attention_sdpa_failed(int64_t nq, int64_t nk, int64_t head_dim, char *why, size_t len) {
    pthread_mutex_lock(&mode_mu);
    int i = failed_find(nq, nk, head_dim);
    if (i >= 0 && why && len) snprintf(why, len, "%s", failed[i].msg);
    pthread_mutex_unlock(&mode_mu);
    return i >= 0;
}

uint64_t kern_attention_sdpa_fallbacks(void) {
    pthread_mutex_lock(&mode_mu);
    uint64_t n = fallbacks;
    pthread_mutex_unlock(&mode_mu);
    return n;
}

void kern_attention_sdpa_forget(void) {
    pthread_mutex_lock(&mode_mu);
    failed_n = failed_next = 0;
    fallbacks = 0;
    pthread_mutex_unlock(&mode_mu);
}
