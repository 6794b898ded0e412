#!/usr/bin/python3
"""A stand-in for `reelctl` used only to exercise test_crosscheck.py's
subprocess/compare path before (or without) the C tool.

It implements just the two commands the cross-check uses, with the numpy
reference computing in float32 (to mimic the C side's precision):
  fake_reelctl.py weights init --config NAME --seed S --out PATH
  fake_reelctl.py run --weights W --latent L --context C [--uncond U]
                      --steps N --shift S [--cfg G] [--solver euler|unipc|dpm++]
                      [--graphs on|off] [--warmup N] --out PATH

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

        def forward(w, latent, context, sigma, dtype=np.float64, timestep=None):
            P = w.as_dtype(dtype)
            D = w.cfg.dim
            t = 1000.0 * float(sigma) if timestep is None else float(timestep)
            s = ref.sinusoid(t, w.cfg.freq_dim, dtype)
            e = ref.linear(ref.silu(ref.linear(s, P["time_embedding.0.weight"], P["time_embedding.0.bias"])),
                           P["time_embedding.2.weight"], P["time_embedding.2.bias"])
            e6 = ref.linear(ref.silu(e), P["time_projection.1.weight"],
                            P["time_projection.1.bias"]).reshape(6, D)
            saved = P["head.modulation"]
            P["head.modulation"] = (saved.reshape(2, D) + e6[:2] - e).reshape(1, 2, D)
            try:
                return orig_forward(w, latent, context, sigma, dtype, timestep=timestep)
            finally:
                P["head.modulation"] = saved
        ref.forward = forward
    elif name == "gelu_erf":
        erf = np.vectorize(math.erf)
        ref.gelu_tanh = lambda u: 0.5 * u * (1.0 + erf(u / math.sqrt(2.0))).astype(u.dtype)
    elif name == "no_rms":
        # skips every q/k RMS norm (self and cross attention) and its gain
        ref.rms_norm = lambda x, g, eps=ref.RMS_EPS: x
    elif name in SOLVER_BUGS:
        pass                       # applied in run_solver
    else:
        sys.exit("fake_reelctl: unknown FAKE_REELCTL_BUG %r" % name)


# Solver bugs (test_solvers.py's negative controls), for `run --solver`:
#   t_float         the transformer gets 1000*sigma instead of the int64 timestep
#   t_round         timesteps rounded to nearest instead of truncated
#   no_corrector    UniPC without UniC
#   a_solve         UniP-2 / UniC-1 coefficient from the linear solve, not 1/2
#   dpm_unipc_sched dpm++ on UniPC's schedule (sigma_0 = shift(0.999), t_0 = 999)
#   dpm_shift_twice dpm++ applies the shift again in set_timesteps
#   exact_linspace  u_i = 1 - i/N exactly instead of numpy's linspace arithmetic
#   euler           --solver ignored: Euler on the TINYDIT.md schedule
#   no_solver_flag  `run` rejects --solver, as reelctl did before issue 24
SOLVER_BUGS = ("t_float", "t_round", "no_corrector", "a_solve", "dpm_unipc_sched", "dpm_shift_twice",
               "exact_linspace", "euler", "no_solver_flag")


def run_solver(w, lat, ctx, unc, steps, shift, cfg, solver, bug):
    import solvers_ref as sr
    f32 = np.float32
    if bug == "euler":
        return ref.generate(w, lat, ctx, unc, steps, shift, cfg, dtype=f32)
    if bug == "t_round":
        def finish(sig64):
            return (np.concatenate([sig64, [0.0]]).astype(np.float32),
                    np.round(sig64 * 1000).astype(np.int64))
        sr._finish = finish
    if bug == "exact_linspace":
        # u_i = start*(1 - i/N) in exact-as-possible form instead of numpy's start + i*step
        def unipc_schedule(N, S):
            return sr._finish(sr._shift(sr.unipc_sigma_max() * (1.0 - np.arange(N) / N), S))

        def dpmpp_schedule(N, S):
            return sr._finish(sr._shift(1.0 - np.arange(N) / N, S))
        sr.SOLVERS = {"unipc": (unipc_schedule, sr.unipc_loop), "dpm++": (dpmpp_schedule, sr.dpmpp_loop)}
    sched = sr.SOLVERS[solver][0]
    if solver == "dpm++" and bug == "dpm_unipc_sched":
        sched = sr.unipc_schedule
    sigmas, timesteps = sched(steps, shift)
    if solver == "dpm++" and bug == "dpm_shift_twice":
        sigmas, timesteps = sr._finish(sr._shift(sr._shift(np.linspace(1.0, 0.0, steps + 1)[:steps], shift), shift))
    vf = sr.dit_velocity_fn(w, ctx, unc, cfg, f32)
    if bug == "t_float":
        vf0 = vf
        vf = lambda x, t, sigma: vf0(x, 1000.0 * sigma, sigma)  # noqa: E731
    kw = dict(dtype=f32, coef_dtype=f32)
    if solver == "unipc":
        kw.update(corrector=(bug != "no_corrector"), fixed_half=(bug != "a_solve"))
    return sr.SOLVERS[solver][1](vf, lat, sigmas, timesteps, **kw)


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
        bug = os.environ.get("FAKE_REELCTL_BUG", "")
        if bug != "no_solver_flag":
            ap.add_argument("--solver", choices=("euler", "unipc", "dpm++"), default="euler")
        ap.add_argument("--graphs", choices=("on", "off"), default="on")     # no effect here
        ap.add_argument("--warmup", type=int, default=2)                     # no effect here
        ap.add_argument("--backend", default="cpu")                          # no effect here
        a = ap.parse_args(argv[1:])
        w = ref.load_weights(a.weights)
        lat = safetensors_np.load(a.latent)[0]["latent"]
        ctx = safetensors_np.load(a.context)[0]["context"]
        unc = safetensors_np.load(a.uncond)[0]["context"] if a.uncond else None
        if getattr(a, "solver", "euler") == "euler":
            out = ref.generate(w, lat, ctx, unc, a.steps, a.shift, a.cfg, dtype=np.float32)
        else:
            out = run_solver(w, lat, ctx, unc, a.steps, a.shift, a.cfg if unc is not None else None,
                             a.solver, bug)
        safetensors_np.save(a.out, {"latent": out.astype(np.float32)})
        return 0
    sys.exit("fake_reelctl: unsupported command %r" % (argv,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
