/* cmd_plan.c -- `reelctl plan`: one denoising step on paper (issue 28).
 *
 *   reelctl plan --config NAME|FILE.json --size FxHxW [--text L] [--cfg]
 *                [--gpu h200|h100|a100] [--attention fused|decomposed]
 *
 * For the step the model runs (TINYDIT.md's block: norm + modulation, the
 * self-attention's q, k, v and o with RMSNorm and RoPE, the cross-attention
 * over L text tokens, the FFN with GELU, the gated residuals; the patch
 * embedding, the text and time embeddings and the head around the blocks),
 * each op group's FLOPs (the matrix products: 2·m·n·k each; the
 * element-wise work is counted in bytes only), its HBM bytes in BF16, and
 * an estimated time: the larger of FLOPs at the device's dense BF16 tensor
 * peak and bytes at its memory bandwidth (published peaks, named in the
 * table below; a real kernel reaches 60-80% of them). Attention's bytes
 * depend on its path: fused (cuDNN's SDPA: Q read, O written, K and V read
 * once per head when they fit half the L2, else once per 128-row tile of
 * queries) or decomposed (the score
 * matrix written in F32, read and the probabilities written in BF16, read
 * again). The attention path is AUTO's on that GPU (fused where cuDNN
 * loads) unless --attention says. With --cfg everything runs twice (the
 * conditional and unconditional passes). The last line is the step total:
 *   total: <F> FLOP, <B> bytes, <T> s */
#include "ctl.h"
#include "base/error.h"
#include "base/parse.h"
#include "model/tinydit.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Published peaks: dense BF16 tensor-core FLOP/s (no sparsity) and HBM
 * bandwidth. */
static const struct {
    const char *name, *what;
    double flops, bytes_per_s, l2;
} gpus[] = {
    { "h200", "NVIDIA H200 SXM (989 TFLOP/s BF16 dense, 4.8 TB/s HBM3e, 50 MB L2)", 989e12, 4.8e12, 50e6 },
    { "h100", "NVIDIA H100 SXM (989 TFLOP/s BF16 dense, 3.35 TB/s HBM3, 50 MB L2)", 989e12, 3.35e12, 50e6 },
    { "a100", "NVIDIA A100 SXM 80GB (312 TFLOP/s BF16 dense, 2.04 TB/s HBM2e, 40 MB L2)", 312e12, 2.039e12, 40e6 },
};

#define BF 2.0 /* bytes of a BF16 value */
#define F32 4.0
#define SDPA_TILE 128.0 /* query rows per tile of the fused kernel: K and V are read once per tile */

typedef struct {
    const char *group;
    double flops, bytes;
} plan_row_t;

static void add(plan_row_t *r, double flops, double bytes) {
    r->flops += flops;
    r->bytes += bytes;
}

/* A GEMM [m, k] x [k, n] (weights [n, k], read once): 2mnk FLOPs; A read,
 * C written, the weights and a bias read. */
static void gemm(plan_row_t *r, double m, double n, double k) {
    add(r, 2 * m * n * k, BF * (m * k + m * n + n * k + n));
}

/* One attention of nq queries over nk keys, H heads of width d; l2 the
 * device's L2 bytes. */
static void attention(plan_row_t *r, double nq, double nk, double H, double d, bool fused, double l2) {
    double D = H * d;
    r->flops += 4 * nq * nk * D; /* Q·Kᵀ and P·V */
    if (fused) {
        /* Q in, O out; K and V once per head when one head's K and V fit
         * half the L2 (the tiles of a head, running side by side, share
         * them), else once per tile of queries */
        double tiles = 2 * nk * d * BF <= l2 / 2 ? 1 : (nq + SDPA_TILE - 1) / SDPA_TILE;
        r->bytes += BF * (nq * D + nq * D) + BF * 2 * nk * D * tiles;
    } else {
        double scores = nq * nk * H;
        /* S written (F32), read by the softmax, P written (BF16) and read;
         * Q, K, V, O once each */
        r->bytes += scores * (F32 + F32 + BF + BF) + BF * (2 * nq * D + 2 * nk * D);
    }
}

int cmd_plan(int argc, char **argv) {
    static const struct option opts[] = {
        { "config", required_argument, 0, 'c' }, { "size", required_argument, 0, 's' },
        { "text", required_argument, 0, 't' },   { "cfg", no_argument, 0, 'g' },
        { "gpu", required_argument, 0, 'G' },    { "attention", required_argument, 0, 'a' },
        { 0, 0, 0, 0 },
    };
    const char *config = NULL, *gpu = "h200", *attn = NULL;
    int64_t size[3] = { 0, 0, 0 }, text = 0;
    bool cfg = false, have_size = false;
    int o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'c': config = optarg; break;
        case 's':
            if (ctl_size_parse(optarg, "--size", size) != 0) return -1;
            have_size = true;
            break;
        case 't':
            if (reel_parse_i64(optarg, 1, 65536, "--text", &text)) return -1;
            break;
        case 'g': cfg = true; break;
        case 'G': gpu = optarg; break;
        case 'a': attn = optarg; break;
        default: return ctl_fail_usage("plan", "plan: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "plan: unexpected argument '%s'", argv[optind]);
    if (!config || !have_size)
        return reel_fail(REEL_E_INVALID, "usage: reelctl plan --config NAME|FILE.json --size FxHxW [--text L] [--cfg] "
                         "[--gpu h200|h100|a100] [--attention fused|decomposed]");
    int gi = -1;
    for (int i = 0; i < (int)(sizeof gpus / sizeof gpus[0]); i++)
        if (!strcmp(gpus[i].name, gpu)) gi = i;
    if (gi < 0) return reel_fail(REEL_E_INVALID, "plan: --gpu %s: one of h200, h100, a100", gpu);
    if (attn && strcmp(attn, "fused") && strcmp(attn, "decomposed"))
        return reel_fail(REEL_E_INVALID, "plan: --attention %s: fused or decomposed", attn);
    tdit_config_t c;
    if (tdit_config_builtin(config, &c) != 0 && ctl_config_from_json(config, &c) != 0)
        return ctl_fail_as(REEL_E_INVALID, "--config %s: ", config);
    if (size[1] % 2 || size[2] % 2)
        return reel_fail(REEL_E_INVALID, "plan: --size %lldx%lldx%lld: height and width must be even (2x2 patches)",
                         (long long)size[0], (long long)size[1], (long long)size[2]);
    double D = (double)c.dim, H = (double)c.heads, d = D / H, Fd = (double)c.ffn_dim, C = (double)c.in_channels;
    double T = (double)c.text_dim, Fq = (double)c.freq_dim, N = (double)c.layers;
    double S = (double)size[0] * (double)(size[1] / 2) * (double)(size[2] / 2);
    double L = text ? (double)text : c.text_len ? (double)c.text_len : 512;
    /* AUTO's attention on this GPU: cuDNN's fused SDPA for BF16 heads it takes */
    bool fused = attn ? !strcmp(attn, "fused") : d <= 128 && (int64_t)d % 8 == 0;

    enum { SELF_PROJ, SELF_ATTN, CROSS_PROJ, CROSS_ATTN, FFN, ELEMENTWISE, EMBED, NGROUPS };
    plan_row_t r[NGROUPS] = {
        { "self-attention q, k, v, o", 0, 0 }, { fused ? "self-attention (fused)" : "self-attention (decomposed)", 0, 0 },
        { "cross-attention q, k, v, o", 0, 0 }, { fused ? "cross-attention (fused)" : "cross-attention (decomposed)", 0, 0 },
        { "FFN (2 GEMMs, GELU)", 0, 0 }, { "norms, modulation, RoPE, residuals", 0, 0 },
        { "patch embedding, head, text and time embeddings", 0, 0 },
    };
    for (int b = 0; b < (int)N; b++) {
        for (int i = 0; i < 4; i++) gemm(&r[SELF_PROJ], S, D, D);
        attention(&r[SELF_ATTN], S, S, H, d, fused, gpus[gi].l2);
        gemm(&r[CROSS_PROJ], S, D, D);          /* q */
        gemm(&r[CROSS_PROJ], L, D, D);          /* k */
        gemm(&r[CROSS_PROJ], L, D, D);          /* v */
        gemm(&r[CROSS_PROJ], S, D, D);          /* o */
        attention(&r[CROSS_ATTN], S, L, H, d, fused, gpus[gi].l2);
        gemm(&r[FFN], S, Fd, D);
        gemm(&r[FFN], S, D, Fd);
        add(&r[FFN], 0, BF * 2 * S * Fd);       /* GELU: a read and a write of the hidden */
        /* element-wise, each a read and a write of [S, D]: norm1 + modulate,
         * RMSNorm + RoPE on q and k, gated residual; norm3; RMSNorm on
         * cross q, k; residual; norm2 + modulate; gated residual */
        add(&r[ELEMENTWISE], 0, BF * 2 * S * D * 9 + BF * 2 * L * D * 1);
    }
    gemm(&r[EMBED], S, D, 4 * C);                /* the 1x2x2 patch embedding */
    gemm(&r[EMBED], S, 4 * C, D);                /* the head */
    gemm(&r[EMBED], L, D, T);                    /* text embedding, 2 Linears */
    gemm(&r[EMBED], L, D, D);
    gemm(&r[EMBED], 1, D, Fq);                   /* time embedding, 2 Linears and the projection */
    gemm(&r[EMBED], 1, D, D);
    gemm(&r[EMBED], 1, 6 * D, D);
    double passes = cfg ? 2 : 1, tf = 0, tb = 0, tt = 0;
    printf("reelctl plan: %s (dim %lld, %lld heads of %lld, %lld layers, FFN %lld), latent %lldx%lldx%lld: %.0f "
           "tokens, %.0f text tokens%s, BF16, attention %s%s\n",
           c.name, (long long)c.dim, (long long)c.heads, (long long)(c.dim / c.heads), (long long)c.layers,
           (long long)c.ffn_dim, (long long)size[0], (long long)size[1], (long long)size[2], S, L,
           cfg ? ", CFG (2 passes)" : "", fused ? "fused (cuDNN SDPA)" : "decomposed", attn ? " (--attention)" : "");
    printf("on %s; time per group = max(FLOPs / peak, bytes / bandwidth)\n", gpus[gi].what);
    printf("%-50s %12s %12s %10s %s\n", "op group", "FLOP", "bytes", "est. s", "bound by");
    for (int i = 0; i < NGROUPS; i++) {
        double f = r[i].flops * passes, by = r[i].bytes * passes;
        double t1 = f / gpus[gi].flops, t2 = by / gpus[gi].bytes_per_s, t = t1 > t2 ? t1 : t2;
        printf("%-50s %12.3e %12.3e %10.4f %s\n", r[i].group, f, by, t, t1 >= t2 ? "compute" : "memory");
        tf += f;
        tb += by;
        tt += t;
    }
    printf("total: %.4e FLOP, %.4e bytes, %.4g s\n", tf, tb, tt); /* %g: tiny's step is µs */
    return 0;
}
