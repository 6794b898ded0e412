#!/usr/bin/env python3
"""torch_step.py WEIGHTS LABEL F H W L REPS -- one CFG Euler step of the
TinyDiT in WEIGHTS (a Reel .safetensors) in PyTorch eager, float32, the way
a PyTorch user would write it (F.linear, matmul + softmax attention: this
is torch 1.13, Debian's, before scaled_dot_product_attention), on the same
inputs bench_cpu_step gives Reel: latent tdit_initial_latent(1), contexts
(2), sigmas (0.9, 0.8), guidance 5. Prints, per thread count (1 and the
cores), "torch step LABEL threads=N MS ms" with the median of REPS steps.
The forward pass is tests/crosscheck/tinydit_ref.py's (TINYDIT.md),
written with torch ops; the inputs are drawn here by numpy, so Reel's and
PyTorch's outputs are not compared (tests/crosscheck does that)."""
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as Fn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "crosscheck"))
import safetensors_np  # noqa: E402
import tinydit_ref  # noqa: E402


def rope_angles(F, Hg, Wg, d):
    pos = tinydit_ref.token_grid(F, Hg, Wg)
    return torch.from_numpy(tinydit_ref.rope_angles(pos, d)).float()


def apply_rope(x, cos, sin):
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def rms(x, g, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g


def attention(q, k, v, H):
    N, D = q.shape
    M = k.shape[0]
    d = D // H
    qh = q.view(N, H, d).transpose(0, 1)
    kh = k.view(M, H, d).transpose(0, 1)
    vh = v.view(M, H, d).transpose(0, 1)
    p = torch.softmax(qh @ kh.transpose(1, 2) / math.sqrt(d), dim=-1)
    return (p @ vh).transpose(0, 1).reshape(N, D)


def time_sinusoid(cfg, sigma, like):
    return torch.from_numpy(tinydit_ref.sinusoid(1000.0 * sigma, cfg.freq_dim, np.float32)).to(like)


def forward(P, cfg, latent, context, sigma, cos, sin, s=None):
    """s: time_sinusoid(cfg, sigma, latent), when the caller made it already
    (a CUDA graph's capture cannot copy from the host)."""
    D, H, C, d = cfg.dim, cfg.heads, cfg.in_channels, cfg.head_dim
    _, F, Hh, Ww = latent.shape
    if s is None:
        s = time_sinusoid(cfg, sigma, latent)
    e = Fn.linear(Fn.silu(Fn.linear(s, P["time_embedding.0.weight"], P["time_embedding.0.bias"])),
                  P["time_embedding.2.weight"], P["time_embedding.2.bias"])
    e6 = Fn.linear(Fn.silu(e), P["time_projection.1.weight"], P["time_projection.1.bias"]).view(6, D)
    c = Fn.linear(Fn.gelu(Fn.linear(context, P["text_embedding.0.weight"], P["text_embedding.0.bias"]),
                          approximate="tanh"), P["text_embedding.2.weight"], P["text_embedding.2.bias"])
    a = latent.reshape(C, F, Hh // 2, 2, Ww // 2, 2).permute(1, 2, 4, 0, 3, 5).reshape(-1, C * 4)
    x = Fn.linear(a, P["patch_embedding.weight"].reshape(D, C * 4), P["patch_embedding.bias"])
    N = x.shape[0]
    for i in range(cfg.layers):
        p = "blocks.%d." % i
        sh1, sc1, g1, sh2, sc2, g2 = P[p + "modulation"].view(6, D) + e6
        a = Fn.layer_norm(x, (D,), eps=1e-6) * (1 + sc1) + sh1
        sa = p + "self_attn."
        q = rms(Fn.linear(a, P[sa + "q.weight"], P[sa + "q.bias"]), P[sa + "norm_q.weight"])
        k = rms(Fn.linear(a, P[sa + "k.weight"], P[sa + "k.bias"]), P[sa + "norm_k.weight"])
        v = Fn.linear(a, P[sa + "v.weight"], P[sa + "v.bias"])
        q = apply_rope(q.view(N, H, d), cos, sin).view(N, D)
        k = apply_rope(k.view(N, H, d), cos, sin).view(N, D)
        x = x + g1 * Fn.linear(attention(q, k, v, H), P[sa + "o.weight"], P[sa + "o.bias"])
        ca = p + "cross_attn."
        b = Fn.layer_norm(x, (D,), P[p + "norm3.weight"], P[p + "norm3.bias"], eps=1e-6)
        q = rms(Fn.linear(b, P[ca + "q.weight"], P[ca + "q.bias"]), P[ca + "norm_q.weight"])
        k = rms(Fn.linear(c, P[ca + "k.weight"], P[ca + "k.bias"]), P[ca + "norm_k.weight"])
        v = Fn.linear(c, P[ca + "v.weight"], P[ca + "v.bias"])
        x = x + Fn.linear(attention(q, k, v, H), P[ca + "o.weight"], P[ca + "o.bias"])
        f = Fn.layer_norm(x, (D,), eps=1e-6) * (1 + sc2) + sh2
        h = Fn.gelu(Fn.linear(f, P[p + "ffn.0.weight"], P[p + "ffn.0.bias"]), approximate="tanh")
        x = x + g2 * Fn.linear(h, P[p + "ffn.2.weight"], P[p + "ffn.2.bias"])
    shift, scale = P["head.modulation"].view(2, D) + e
    y = Fn.linear(Fn.layer_norm(x, (D,), eps=1e-6) * (1 + scale) + shift, P["head.head.weight"],
                  P["head.head.bias"])
    return y.view(F, Hh // 2, Ww // 2, 1, 2, 2, C).permute(6, 0, 3, 1, 4, 2, 5).reshape(C, F, Hh, Ww)


def main():
    path, label = sys.argv[1], sys.argv[2]
    F, Hh, Ww, L, reps = (int(a) for a in sys.argv[3:8])
    tensors, meta = safetensors_np.load(path)
    cfg = tinydit_ref.config_from_metadata(meta)
    P = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in tensors.items()}
    rng = np.random.default_rng(1)
    latent = torch.from_numpy(rng.standard_normal((cfg.in_channels, F, Hh, Ww)).astype(np.float32))
    context = torch.from_numpy(rng.standard_normal((L, cfg.text_dim)).astype(np.float32))
    uncond = torch.from_numpy(rng.standard_normal((L, cfg.text_dim)).astype(np.float32))
    theta = rope_angles(F, Hh // 2, Ww // 2, cfg.head_dim)
    cos, sin = torch.cos(theta)[:, None, :], torch.sin(theta)[:, None, :]
    cores = os.cpu_count() or 1
    for threads in sorted({1, cores}):
        torch.set_num_threads(threads)
        times = []
        with torch.inference_mode():
            for r in range(reps + 1):
                t0 = time.perf_counter()
                vc = forward(P, cfg, latent, context, 0.9, cos, sin)
                vu = forward(P, cfg, latent, uncond, 0.9, cos, sin)
                v = vu + 5.0 * (vc - vu)
                out = latent + (0.8 - 0.9) * v
                if r:  # the first is a warmup
                    times.append(time.perf_counter() - t0)
        del out
        print("torch step %s threads=%d %.3f ms" % (label, threads, 1e3 * float(np.median(times))))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
