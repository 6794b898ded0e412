/* cmd_decode.c -- `reelctl decode --vae W LATENT -o OUT` and `reelctl
 * weights init-vae`: latents to video through Wan2.1's VAE decoder
 * (model/vae.h) in this process, and random VAE weights for tests and the
 * demo. LATENT holds tensor `latent` [z, F, H, W] (what `reelctl run`
 * writes); OUT gets tensor `video` [3, 1+4(F-1), 8H, 8W], F32 in [-1, 1]. */
#include "ctl.h"
#include "base/error.h"
#include "base/opts.h"
#include "model/safetensors.h"
#include "media/video.h"
#include "model/pth.h"
#include "model/hf_parts.h"
#include "model/vae.h"
#include "kernels/backend.h"
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *vae, *out, *backend;
    bool quiet;
} decode_opts_t;

#define O(f) offsetof(decode_opts_t, f)
static const reel_opt_t decode_rows[] = {
    { .name = "vae", .kind = REEL_OPT_STRING, .off = O(vae) },
    { .name = "out", .short_name = 'o', .kind = REEL_OPT_STRING, .off = O(out) },
    { .name = "backend", .kind = REEL_OPT_STRING, .off = O(backend) },
    { .name = "quiet", .kind = REEL_OPT_FLAG, .off = O(quiet) },
};
#undef O

/* "decoded frame 3/5" on stderr, per latent frame. */
static int progress(void *user, int64_t done, int64_t total) {
    const double *t0 = user;
    fprintf(stderr, "reelctl: decode: latent frame %" PRId64 "/%" PRId64 " (%.2f s)\n", done, total,
            ctl_now() - *t0);
    return 0;
}

/* video [3,F,H,W] in [-1,1] as an H.264 MP4 at Wan's 16 fps, its frames
 * converted as Wan's cache_video does (media/video.h). 0 or -1. */
static int write_mp4(const char *path, const float *video, const int64_t vs[4]) {
    uint8_t *rgb = malloc((size_t)(vs[1] * vs[2] * vs[3] * 3));
    if (!rgb) return reel_fail(REEL_E_NOMEM, "out of memory for the frames");
    video_frames_from_f32(video, vs[1], vs[2], vs[3], rgb);
    int rc = video_write_mp4(path, rgb, vs[1], vs[2], vs[3], VIDEO_FPS_WAN);
    free(rgb);
    return rc;
}

int cmd_decode(int argc, char **argv) {
    decode_opts_t o = { .backend = "cpu" };
    int rest = argc;
    if (reel_opts_parse(decode_rows, sizeof decode_rows / sizeof decode_rows[0], &o, argc, argv, &rest))
        return rest ? reel_fail_prefix("decode: ") : ctl_fail_usage("decode", "decode: %s", reel_err()->msg);
    if (rest != argc - 1 || !o.vae || !o.out)
        return reel_fail(REEL_E_INVALID, "usage: reelctl decode --vae VAE LATENT.safetensors -o OUT.safetensors|OUT.mp4");
    const char *lpath = argv[rest];
    if (ctl_out_spares(o.out, "--vae", o.vae, "the latent", lpath, (const char *)NULL) != 0) return -1;
    /* where the output goes, before the decode: its folder, and never a
     * link written through (the MP4 writer would follow one) */
    if (ctl_out_folder(o.out) != 0 || ctl_out_file(o.out) != 0) return -1;
    kern_backend_kind_t kind;
    if (kern_backend_kind_parse(o.backend, &kind) != 0) return ctl_fail_as(REEL_E_INVALID, "--backend: ");
    int64_t ls[4];
    float *lat = NULL, *video = NULL;
    st_file_t *wf = NULL;
    kern_backend_t *b = NULL;
    kern_stream_t *s = NULL;
    vae_model_t *m = NULL;
    st_writer_t *w = NULL;
    int rc = -1;
    if (!(lat = ctl_read_tensor(lpath, "latent", 4, ls))) goto out;
    if (!(wf = hf_part_open(o.vae, HF_PART_VAE))) { ctl_fail_as(REEL_E_INVALID, "--vae: "); goto out; }
    if (!(b = kern_backend_new(kind, 0)) || !(s = kern_stream_new(b))) { ctl_fail_as(REEL_E_DEVICE, NULL); goto out; }
    if (!(m = vae_model_load(b, wf, KERN_F32))) { /* names the file */
        hf_part_explain(wf);
        ctl_fail_as(REEL_E_INVALID, "--vae: ");
        goto out;
    }
    st_close(&wf);
    const vae_config_t *c = vae_model_config(m);
    if (ls[0] != c->z_dim) {
        reel_fail(REEL_E_INVALID, "%s: latent has %" PRId64 " channels, the VAE (%s) expects z_dim %" PRId64,
                  lpath, ls[0], c->name, c->z_dim);
        goto out;
    }
    if (vae_latent_check(m, ls[1], ls[2], ls[3]) != 0) {
        ctl_fail_as(REEL_E_INVALID, "%s: ", lpath);
        goto out;
    }
    int64_t vs[4] = { 3, vae_video_frames(ls[1]), 8 * ls[2], 8 * ls[3] };
    if (!(video = malloc((size_t)(vs[0] * vs[1] * vs[2] * vs[3]) * sizeof *video))) {
        reel_fail(REEL_E_NOMEM, "decode: out of memory for the video");
        goto out;
    }
    double t0 = ctl_now();
    if (vae_decode(m, s, lat, ls[1], ls[2], ls[3], video, o.quiet ? NULL : progress, &t0) != 0) {
        ctl_fail_as(reel_err_code() == REEL_E_INVALID ? REEL_E_INVALID : REEL_E_IO, "decode: ");
        goto out;
    }
    double secs = ctl_now() - t0;
    if (ctl_has_ext(o.out, ".mp4") ? write_mp4(o.out, video, vs) != 0
                      : (!(w = st_writer_new()) || st_writer_add_f32(w, "video", 4, vs, video) ||
                         st_writer_meta(w, "vae_config", c->name) || st_writer_save(w, o.out))) {
        ctl_fail_as(REEL_E_IO, NULL);
        goto out;
    }
    fprintf(stderr, "reelctl: decoded latent [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] with VAE %s on %s "
            "to video [3,%" PRId64 ",%" PRId64 ",%" PRId64 "] in %.3f s (%.3f s per latent frame): %s\n",
            ls[0], ls[1], ls[2], ls[3], c->name, kern_backend_device_name(b), vs[1], vs[2], vs[3], secs,
            secs / (double)ls[1], o.out);
    rc = 0;
out:
    st_writer_destroy(&w);
    vae_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
    st_close(&wf);
    free(lat);
    free(video);
    return rc;
}

typedef struct {
    const char *config, *out;
    uint64_t seed;
    int64_t dim, z_dim;
} init_vae_opts_t;

#define O(f) offsetof(init_vae_opts_t, f)
static const reel_opt_t init_rows[] = {
    { .name = "config", .kind = REEL_OPT_STRING, .off = O(config) },
    { .name = "out", .kind = REEL_OPT_STRING, .off = O(out) },
    { .name = "seed", .kind = REEL_OPT_U64, .off = O(seed), .ulo = 0, .uhi = UINT64_MAX },
    { .name = "dim", .kind = REEL_OPT_I64, .off = O(dim), .lo = 1, .hi = 4096 },
    { .name = "z-dim", .kind = REEL_OPT_I64, .off = O(z_dim), .lo = 1, .hi = 64 },
};
#undef O

/* `weights init-vae --config NAME [--dim D] [--z-dim Z] --seed S --out
 * PATH`: argv[0] is "init-vae". */
int cmd_weights_init_vae(int argc, char **argv) {
    init_vae_opts_t o = { 0 };
    int rest = argc;
    if (reel_opts_parse(init_rows, sizeof init_rows / sizeof init_rows[0], &o, argc, argv, &rest))
        return rest ? reel_fail_prefix("weights init-vae: ")
                    : ctl_fail_usage("weights init-vae", "weights init-vae: %s", reel_err()->msg);
    if (rest < argc) return reel_fail(REEL_E_INVALID, "weights init-vae: unexpected argument '%s'", argv[rest]);
    if (!o.config || !o.out) return reel_fail(REEL_E_INVALID, "weights init-vae needs --config and --out");
    vae_config_t c;
    if (vae_config_builtin(o.config, &c) != 0) return ctl_fail_as(REEL_E_INVALID, "--config: ");
    if (o.dim || o.z_dim) {
        if (o.dim) c.dim = o.dim;
        if (o.z_dim) c.z_dim = o.z_dim;
        snprintf(c.name, sizeof c.name, "custom");
    }
    if (vae_weights_init(&c, o.seed, o.out) != 0) return ctl_fail_as(REEL_E_IO, NULL);
    fprintf(stderr, "reelctl: wrote %s: VAE config %s (dim=%" PRId64 " z_dim=%" PRId64 "), seed %" PRIu64 "\n",
            o.out, c.name, c.dim, c.z_dim, o.seed);
    return 0;
}
