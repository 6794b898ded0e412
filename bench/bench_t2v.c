/* bench_t2v.c -- the two ends of text to video on the CPU (issue 26): prompt
 * encodes per second through the worker's text side (model/t2v.h), cache
 * miss (tokenize + umT5) and hit (a copy), and the VAE decode per video
 * frame, on the small stand-ins `make demo` serves (t5-small, 256 wide;
 * vae-tiny with 16 latent channels) and on the wan2.1 VAE config (dim 96)
 * at a small spatial size. Ratios side by side in one run; absolute times
 * mean something only for this machine (docs/BENCH.md; docs/GPU.md
 * estimates the real sizes on an H200).
 * Usage: bench_t2v BUILD */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "bench/bench.h"
#include "media/video.h"
#include "model/t2v.h"
#include "model/t5.h"
#include "model/vae.h"

#define N_PROMPTS 24

static int die(const char *what) {
    fprintf(stderr, "bench_t2v: %s: %s\n", what, reel_err_text());
    return 1;
}

/* A tokenizer trained here (Debian's spm_train), in dir. */
static int tokenizer(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "for i in $(seq 1 60); do echo \"line $i a cat on a skateboard, a red car at night in "
             "the rain, mountains rivers sky tree bird ocean\"; done >%s/corpus.txt && spm_train --input=%s/corpus.txt "
             "--model_prefix=%s/spiece --vocab_size=400 --model_type=unigram --pad_id=0 --eos_id=1 --unk_id=2 "
             "--bos_id=-1 --byte_fallback=true --character_coverage=1.0 --hard_vocab_limit=false >/dev/null 2>&1",
             dir, dir, dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int bench_text(kern_backend_t *b, const char *dir) {
    char t5p[512], tokp[512];
    snprintf(t5p, sizeof t5p, "%s/t5.safetensors", dir);
    snprintf(tokp, sizeof tokp, "%s/spiece.model", dir);
    t5_config_t c;
    if (t5_config_builtin("t5-small", &c) || t5_weights_init(&c, 3, KERN_F32, t5p)) return die("t5 weights");
    t2v_text_t *t = t2v_text_new(b, t5p, tokp, 512, c.dim, (size_t)64 << 20);
    if (!t) return die("text encoder");
    char prompts[N_PROMPTS][160];
    for (int i = 0; i < N_PROMPTS; i++)
        snprintf(prompts[i], sizeof prompts[i], "prompt %d: a cat on a skateboard crossing a street at night, "
                 "rain, neon signs, a red car passing by, camera %d", i, i * 7);
    float *ctx;
    int64_t rows;
    double t0 = bench_now();
    for (int i = 0; i < N_PROMPTS; i++) {
        if (t2v_text_context(t, prompts[i], &ctx, &rows)) return die("encode");
        free(ctx);
    }
    double miss = (bench_now() - t0) / N_PROMPTS;
    t0 = bench_now();
    for (int r = 0; r < 20; r++)
        for (int i = 0; i < N_PROMPTS; i++) {
            if (t2v_text_context(t, prompts[i], &ctx, &rows)) return die("encode");
            free(ctx);
        }
    double hit = (bench_now() - t0) / (20 * N_PROMPTS);
    printf("t5-small (dim %lld, %lld layers), prompts of %lld tokens, context padded to 512 rows:\n",
           (long long)c.dim, (long long)c.layers, (long long)rows);
    printf("  cache miss (tokenize + encode): %8.1f prompts/s (%.2f ms each)\n", 1.0 / miss, 1e3 * miss);
    printf("  cache hit (a copy of the rows): %8.1f prompts/s (%.3f ms each), %.0fx the miss\n", 1.0 / hit,
           1e3 * hit, miss / hit);
    t2v_text_destroy(&t);
    return 0;
}

/* Seconds per video frame of a decode of latent [z, F, H, W]. */
static int bench_vae(kern_backend_t *b, const char *dir, const char *config, int64_t z, int64_t F, int64_t H,
                     int64_t W) {
    char path[512];
    snprintf(path, sizeof path, "%s/vae-%s.safetensors", dir, config);
    vae_config_t c;
    if (vae_config_builtin(config, &c)) return die("vae config");
    c.z_dim = z;
    if (vae_weights_init(&c, 5, path)) return die("vae weights");
    t2v_vae_t *v = t2v_vae_new(b, path, z);
    if (!v) return die("vae");
    size_t n = (size_t)(z * F * H * W);
    float *lat = malloc(n * sizeof *lat);
    for (size_t i = 0; i < n; i++) lat[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    const int64_t shape[4] = { z, F, H, W };
    uint8_t *frames, *mp4;
    size_t len;
    double t0 = bench_now();
    if (t2v_vae_decode(v, lat, 1, shape, &frames, NULL, NULL)) return die("decode");
    double dec = bench_now() - t0;
    int64_t vf = vae_video_frames(F);
    t0 = bench_now();
    if (video_encode_mp4(frames, vf, 8 * H, 8 * W, VIDEO_FPS_WAN, &mp4, &len)) return die("mp4");
    double h264 = bench_now() - t0;
    free(frames);
    free(mp4);
    printf("VAE %s (dim %lld, z %lld), latent %lldx%lldx%lld -> %lld frames of %lldx%lld: %.3f s per video frame "
           "(%.3f s per latent frame); + H.264: %.3f s per frame\n", config, (long long)c.dim, (long long)z,
           (long long)F, (long long)H, (long long)W, (long long)vf, (long long)(8 * H), (long long)(8 * W),
           dec / (double)vf, dec / (double)F, h264 / (double)vf);
    free(lat);
    t2v_vae_destroy(&v);
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/reel-bench-t2v-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    kern_backend_t *b = kern_backend_cpu_new();
    int rc = !b || tokenizer(dir) ? die("tokenizer (spm_train)")
             : bench_text(b, dir) || bench_vae(b, dir, "vae-tiny", 16, 3, 8, 8) ||
                     bench_vae(b, dir, "wan2.1", 16, 2, 8, 8);
    kern_backend_destroy(&b);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = 1;
    return rc;
}
