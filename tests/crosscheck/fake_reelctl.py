#!/usr/bin/python3
"""A stand-in for `reelctl` used only to exercise test_crosscheck.py's
subprocess/compare path before (or without) the C tool.

It implements just the two commands the cross-check uses, with the numpy
reference computing in float32 (to mimic the C side's precision):
  fake_reelctl.py weights init --config NAME --seed S --out PATH
  fake_reelctl.py run --weights W --latent L --context C [--uncond U]
                      --steps N --shift S [--cfg G] --out PATH

FAKE_REELCTL_BUG=<name> injects a deliberate mistake, so the self-test can
check that the cross-check notices it (negative controls):
  unpatchify  - unpatchify in the patchify order (c, pt, ph, pw)
  rope_swap   - rotate with (frame, column, row) instead of (frame, row, column)
  head_e6     - head modulation from e6 rows 0,1 instead of e
  gelu_erf    - exact erf GELU instead of GELU_tanh
  no_rms      - skip the q/k RMS norms (and their gains)
FAKE_REELCTL_STD=<s> sets the std of the random weights (default 0.02).
This file is not part of the product; never point a real check at it.
"""

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402
import tinydit_ref as ref  # noqa: E402


def _inject_bug(name):
    if not name:
        return
    if name == "unpatchify":
        def bad_unpatchify(y, C, F, Hh, Ww):
            a = y.reshape(F, Hh // 2, Ww // 2, C, 2, 2)      # (f, h, w, c, ph, pw)
            return a.transpose(3, 0, 1, 4, 2, 5).reshape(C, F, Hh, Ww)
        ref.unpatchify = bad_unpatchify
    elif name == "rope_swap":
        good = ref.rope_angles
        ref.rope_angles = lambda pos, d: good(np.asarray(pos)[:, [0, 2, 1]], d)
    elif name == "head_e6":
        # Easiest faithful injection: wrap forward to recompute with e6 rows.
        orig_forward = ref.forward

        def forward(w, latent, context, sigma, dtype=np.float64):
            P = w.as_dtype(dtype)
            D = w.cfg.dim
            s = ref.sinusoid(1000.0 * float(sigma), w.cfg.freq_dim, dtype)
            e = ref.linear(ref.silu(ref.linear(s, P["time_embedding.0.weight"], P["time_embedding.0.bias"])),
                           P["time_embedding.2.weight"], P["time_embedding.2.bias"])
            e6 = ref.linear(ref.silu(e), P["time_projection.1.weight"],
                            P["time_projection.1.bias"]).reshape(6, D)
            saved = P["head.modulation"]
            P["head.modulation"] = (saved.reshape(2, D) + e6[:2] - e).reshape(1, 2, D)
            try:
                return orig_forward(w, latent, context, sigma, dtype)
            finally:
                P["head.modulation"] = saved
        ref.forward = forward
    elif name == "gelu_erf":
        erf = np.vectorize(math.erf)
        ref.gelu_tanh = lambda u: 0.5 * u * (1.0 + erf(u / math.sqrt(2.0))).astype(u.dtype)
    elif name == "no_rms":
        # skips every q/k RMS norm (self and cross attention) and its gain
        ref.rms_norm = lambda x, g, eps=ref.RMS_EPS: x
    else:
        sys.exit("fake_reelctl: unknown FAKE_REELCTL_BUG %r" % name)


def main(argv):
    _inject_bug(os.environ.get("FAKE_REELCTL_BUG", ""))
    if argv[:2] == ["weights", "init"]:
        ap = argparse.ArgumentParser(prog="fake_reelctl weights init")
        ap.add_argument("--config", required=True)
        ap.add_argument("--seed", type=int, required=True)
        ap.add_argument("--out", required=True)
        a = ap.parse_args(argv[2:])
        if a.config not in ref.CONFIG_TABLE:
            sys.exit("fake_reelctl: unknown config %s" % a.config)
        cfg = ref.Config(a.config, **ref.CONFIG_TABLE[a.config])
        std = float(os.environ.get("FAKE_REELCTL_STD", "0.02"))
        safetensors_np.save(a.out, ref.fake_weight_tensors(cfg, a.seed, std), ref.config_metadata(cfg))
        return 0
    if argv[:1] == ["run"]:
        ap = argparse.ArgumentParser(prog="fake_reelctl run")
        for k in ("--weights", "--latent", "--context", "--out"):
            ap.add_argument(k, required=True)
        ap.add_argument("--uncond")
        ap.add_argument("--steps", type=int, required=True)
        ap.add_argument("--shift", type=float, required=True)
        ap.add_argument("--cfg", type=float, default=1.0)
        a = ap.parse_args(argv[1:])
        w = ref.load_weights(a.weights)
        lat = safetensors_np.load(a.latent)[0]["latent"]
        ctx = safetensors_np.load(a.context)[0]["context"]
        unc = safetensors_np.load(a.uncond)[0]["context"] if a.uncond else None
        out = ref.generate(w, lat, ctx, unc, a.steps, a.shift, a.cfg, dtype=np.float32)
        safetensors_np.save(a.out, {"latent": out.astype(np.float32)})
        return 0
    sys.exit("fake_reelctl: unsupported command %r" % (argv,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
