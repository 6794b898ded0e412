#!/usr/bin/env python3
"""torch_step_gpu.py CONFIG FxHxW L [--layers N] [--reps R] -- one CFG Euler
step of the TinyDiT config CONFIG (tiny, small, wan2.1-1.3b) in PyTorch on
CUDA in BF16, the floor deploy/gpu-check.sh sets Reel's step beside: the
same forward as bench/torch_step.py (TINYDIT.md's block, written with torch
ops), attention by torch's scaled_dot_product_attention (cuDNN or flash, as
torch picks), the conditional and unconditional passes run one after the
other as Wan2.1's text2video.py runs them. Weights are random (N(0, 0.02),
drawn on the GPU: the step's cost does not depend on their values), the
latent is F x H x W with the config's channels, the contexts L tokens.

Prints one line per way, each the median of R steps after a warm-up:
  torch gpu step CONFIG eager MS ms
  torch gpu step CONFIG graph MS ms   (the whole step in one torch.cuda.CUDAGraph)
Nothing is compared with Reel's output (the weights differ): the numbers
are times only, and mean something only on the GPU they ran on."""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as Fn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "crosscheck"))
sys.path.insert(0, HERE)
import tinydit_ref  # noqa: E402
import torch_step  # noqa: E402


def sdpa(q, k, v, H):
    N, D = q.shape
    M = k.shape[0]
    d = D // H
    qh = q.view(1, N, H, d).transpose(1, 2)
    kh = k.view(1, M, H, d).transpose(1, 2)
    vh = v.view(1, M, H, d).transpose(1, 2)
    return Fn.scaled_dot_product_attention(qh, kh, vh).transpose(1, 2).reshape(N, D)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("size")
    ap.add_argument("text", type=int)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script (F32, eager only)")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch gpu step %s: SKIP no CUDA device for torch" % a.config)
        return 0
    base = dict(tinydit_ref.CONFIG_TABLE[a.config])
    if a.layers:
        base["layers"] = a.layers
    cfg = tinydit_ref.Config(a.config, **base)
    F, Hh, Ww = (int(x) for x in a.size.split("x"))
    dev = torch.device(a.device)
    dt = torch.bfloat16 if a.device == "cuda" else torch.float32
    torch.manual_seed(1)
    P = {k: (torch.randn(s, device=dev) * 0.02).to(dt) for k, s in tinydit_ref.expected_shapes(cfg).items()}
    latent = torch.randn((cfg.in_channels, F, Hh, Ww), device=dev).to(dt)
    context = torch.randn((a.text, cfg.text_dim), device=dev).to(dt)
    uncond = torch.randn((a.text, cfg.text_dim), device=dev).to(dt)
    theta = torch_step.rope_angles(F, Hh // 2, Ww // 2, cfg.head_dim).to(dev)
    cos, sin = torch.cos(theta)[:, None, :], torch.sin(theta)[:, None, :]
    if hasattr(Fn, "scaled_dot_product_attention"):  # torch 2.0 on
        torch_step.attention = sdpa
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    out = torch.empty_like(latent)

    temb = torch_step.time_sinusoid(cfg, 0.9, latent)

    def step():
        vc = torch_step.forward(P, cfg, latent, context, 0.9, cos, sin, temb)
        vu = torch_step.forward(P, cfg, latent, uncond, 0.9, cos, sin, temb)
        out.copy_(latent + (0.8 - 0.9) * (vu + 5.0 * (vc - vu)))

    def timed(fn):
        times = []
        for r in range(a.reps + 1):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if r:  # the first is a warm-up
                times.append(time.perf_counter() - t0)
        return 1e3 * float(np.median(times))

    with torch.inference_mode():
        where = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
        print("torch gpu step %s eager %.3f ms (torch %s, %s, %d layers, %s, text %d)" %
              (a.config, timed(step), torch.__version__, where, cfg.layers, a.size, a.text))
        sys.stdout.flush()
        if a.device != "cuda":
            return 0
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # warm-up on a side stream, as torch's docs ask before a capture
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        print("torch gpu step %s graph %.3f ms" % (a.config, timed(g.replay)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
