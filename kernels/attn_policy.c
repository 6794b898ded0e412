/* attn_policy.c -- the attention mode (REEL_ATTN, --attention) and whether
 * cuDNN's fused SDPA can run in this process (kernels/ops.h): state only,
 * calling nothing of the kernels, so the CUDA backend can report to it and
 * attention.c read it without a circle. */
#include "kernels/ops.h"
#include "base/error.h"

#include <pthread.h>
#include <stdbool.h>
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
