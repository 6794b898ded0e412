#!/usr/bin/python3
"""Wan's samplers: check the numpy reference solvers_ref.py, and cross-check
`reelctl run --solver unipc|dpm++` against it (issue 24, section 2).

Usage:
  /usr/bin/python3 tests/crosscheck/test_solvers.py --reelctl build/reelctl --workdir DIR
  /usr/bin/python3 tests/crosscheck/test_solvers.py --reference     (reference checks only)
  /usr/bin/python3 tests/crosscheck/test_solvers.py --selftest      (reference checks, then the
                       comparison path against fake_reelctl.py with injected solver bugs)
test_crosscheck.py (what `make test` runs) runs the reference checks and the
cross-check after its own Euler cases.

Cross-check: configs tiny and small (weights from `reelctl weights init`,
inputs written here), CFG off and on (g = 5), steps 1, 2, 3, 6, shift 1, 3, 5,
both solvers, plus steps 5 and 10 at shift 1 (where numpy's linspace gives
the int timesteps 399 and 299, not 400 and 300), one `--size FxHxW --seed K`
run per solver, and bitwise equality of `--graphs on` (default warm-up and
--warmup 0) with `--graphs off`.  Each case prints its max relative error
max|a - b| / max|b| (a = reelctl, b = numpy in float64) against TOL = 1e-5.
A reelctl whose `run` lacks --solver FAILS every case (it is not skipped).
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_np  # noqa: E402
import solvers_ref as sr  # noqa: E402
import tinydit_ref as ref  # noqa: E402

TOL = 1e-5
TIMEOUT_S = 120
CFG_SCALE = 5.0
SOLVER_NAMES = ("unipc", "dpm++")
STEPS = (1, 2, 3, 6)
SHIFTS = (1.0, 3.0, 5.0)
# (config, weights seed, latent [C, F, H, W], context rows L)
CONFIGS = (("tiny", 7, (4, 2, 8, 8), 5), ("small", 11, (16, 3, 6, 8), 7))
INPUT_SEED = 20250311
SIZE_SEED = 4242


def max_rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


class Checks:
    def __init__(self, tag="solvers"):
        self.results = []
        self.tag = tag

    def __call__(self, name, cond, detail=""):
        self.results.append(bool(cond))
        print("%s %s %s%s" % ("PASS" if cond else "FAIL", self.tag, name, (": " + detail) if detail else ""))
        return bool(cond)

    @property
    def passed(self):
        return sum(self.results)

    @property
    def failed(self):
        return len(self.results) - sum(self.results)


# ---------------------------------------------------------------------------
# Analytic velocity fields
# ---------------------------------------------------------------------------
class GaussianField:
    """Data x0 ~ N(mu, diag(s^2)), flow x = (1-sigma) x0 + sigma eps.

    The marginal at sigma is N((1-sigma) mu, std^2), std^2 = (1-sigma)^2 s^2 + sigma^2,
    and the probability-flow ODE keeps z = (x - (1-sigma) mu)/std constant, so
      v(x, sigma) = dx/dsigma = -mu + (std'/std)(x - (1-sigma) mu),
      std std' = sigma - (1-sigma) s^2,
    and the exact solution from (x_a, sigma_a) is
      x(sigma) = (1-sigma) mu + std(sigma) (x_a - (1-sigma_a) mu)/std(sigma_a).
    Its x0 prediction x - sigma v = E[x0 | x] is not constant, so the
    multistep terms matter."""

    def __init__(self, dim, seed):
        rng = np.random.default_rng(seed)
        self.mu = rng.standard_normal(dim)
        self.s = np.exp(rng.uniform(-1.5, 0.5, dim))
        self.x_start = rng.standard_normal(dim)

    def std(self, sigma):
        return np.sqrt((1 - sigma) ** 2 * self.s ** 2 + sigma ** 2)

    def velocity(self, x, t, sigma):
        sg = float(sigma)
        return -self.mu + ((sg - (1 - sg) * self.s ** 2) / self.std(sg) ** 2) * (x - (1 - sg) * self.mu)

    def exact(self, x_a, sigma_a, sigma_b):
        sa, sb = float(sigma_a), float(sigma_b)
        return (1 - sb) * self.mu + self.std(sb) * (x_a - (1 - sa) * self.mu) / self.std(sa)


def euler_loop(velocity_fn, x, sigmas, timesteps):
    """Plain Euler on the same schedule (the first-order control)."""
    x = np.asarray(x, dtype=np.float64)
    for i in range(len(timesteps)):
        x = x + (float(sigmas[i + 1]) - float(sigmas[i])) * velocity_fn(x, int(timesteps[i]), float(sigmas[i]))
    return x


def nonlinear_velocity(dim, seed):
    """A smooth non-linear field that also depends on the int timestep."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((dim, dim)) * 0.3
    mu = rng.standard_normal(dim)

    def fn(x, t, sigma):
        s = t / 1000.0
        return np.tanh(A @ x) * (1 + s) + mu * np.cos(3 * s) + 0.5 * x
    return fn


# ---------------------------------------------------------------------------
# Reference checks (no reelctl)
# ---------------------------------------------------------------------------
# Derived by hand from the upstream definitions (see solvers_ref.py), exact
# rational arithmetic then float32 rounding / truncation:
#   UniPC: u_i = s_max (1 - i/N), s_max = float32(0.999) = 0.9990000128746033,
#          sigma = S u/(1 + (S-1) u);  DPM++: u_i = 1 - i/N, same shift.
# e.g. UniPC N=4 S=5: u_0 = 0.99900001 -> 4.99500006/4.99600005 = 0.99979985 -> t 999;
#      u_3 = 0.24975 -> 1.24875/1.999 = 0.62468734 -> t 624 (DPM++: 0.625 -> 625).
SCHEDULES = {
    ("unipc", 4, 1.0): ([0.9990000128746033, 0.7492499947547913, 0.49950000643730164, 0.24975000321865082, 0.0],
                        [999, 749, 499, 249]),
    ("unipc", 4, 3.0): ([0.9996664524078369, 0.8996397852897644, 0.7496247887611389, 0.49966657161712646, 0.0],
                        [999, 899, 749, 499]),
    ("unipc", 4, 5.0): ([0.9997998476028442, 0.9372654557228088, 0.8330553770065308, 0.6246873736381531, 0.0],
                        [999, 937, 833, 624]),
    ("unipc", 1, 5.0): ([0.9997998476028442, 0.0], [999]),
    ("dpm++", 4, 1.0): ([1.0, 0.75, 0.5, 0.25, 0.0], [1000, 750, 500, 250]),
    ("dpm++", 4, 3.0): ([1.0, 0.8999999761581421, 0.75, 0.5, 0.0], [1000, 900, 750, 500]),
    ("dpm++", 4, 5.0): ([1.0, 0.9375, 0.8333333134651184, 0.625, 0.0], [1000, 937, 833, 625]),
    ("dpm++", 1, 5.0): ([1.0, 0.0], [1000]),
    ("dpm++", 5, 3.0): ([1.0, 0.9230769276618958, 0.8181818127632141, 0.6666666865348816, 0.4285714328289032, 0.0],
                        [1000, 923, 818, 666, 428]),
    # Exact arithmetic says t = 400, 200 here; numpy's linspace (u_i = 1 + i*(-1/5))
    # gives u_3 = 0.3999999999999999, so upstream passes 399 and 199.
    ("dpm++", 5, 1.0): ([1.0, 0.800000011920929, 0.6000000238418579, 0.4000000059604645, 0.20000000298023224, 0.0],
                        [1000, 800, 600, 399, 199]),
}


def reference_checks(check):
    # --- schedules ------------------------------------------------------------
    bad = []
    for (name, N, S), (sig, ts) in SCHEDULES.items():
        gs, gt = sr.SOLVERS[name][0](N, S)
        if not (gs.dtype == np.float32 and gt.dtype == np.int64 and np.array_equal(gs, np.array(sig, np.float32))
                and np.array_equal(gt, ts)):
            bad.append("%s N=%d S=%g: got %s %s" % (name, N, S, gs.tolist(), gt.tolist()))
    check("schedules: float32 sigmas and int64 timesteps as derived by hand (%d cases)" % len(SCHEDULES),
          not bad, "; ".join(bad))
    ok = True
    for N in (1, 2, 3, 6, 10, 50, 200):
        for S in (1.0, 3.0, 5.0, 8.0):
            us, ut = sr.unipc_schedule(N, S)
            ds, dt = sr.dpmpp_schedule(N, S)
            for sg, ts in ((us, ut), (ds, dt)):
                ok &= sg.shape == (N + 1,) and ts.shape == (N,) and sg[-1] == 0 and np.all(np.diff(sg) < 0)
                ok &= bool(np.all(np.diff(ts) <= 0)) and bool(np.all(ts >= 0))
            ok &= ds[0] == 1.0 and dt[0] == 1000 and ut[0] == 999
            ok &= us[0] == np.float32(S * sr.unipc_sigma_max() / (1 + (S - 1) * sr.unipc_sigma_max()))
    check("schedules: N+1 sigmas ending at 0, decreasing; dpm++ starts at sigma 1 / t 1000, unipc at "
          "shift(float32(0.999)) / t 999", ok)
    # The shift is applied once for dpm++ (the scheduler's own shift is the constructor's 1).
    ds, _ = sr.dpmpp_schedule(6, 5.0)
    u = 1.0 - np.arange(6) / 6.0
    check("dpm++ sigmas = get_sampling_sigmas (shift applied once), within float32 rounding",
          np.allclose(ds[:-1], 5 * u / (1 + 4 * u), rtol=1e-7, atol=0))

    # --- orders ----------------------------------------------------------------
    want = {1: ([1], [0], [1]), 2: ([1, 1], [0, 1], [1, 1]), 3: ([1, 2, 1], [0, 1, 2], [1, 2, 1]),
            6: ([1, 2, 2, 2, 2, 1], [0, 1, 2, 2, 2, 2], [1, 2, 2, 2, 2, 1])}
    got = {N: sr.unipc_orders(N) + (sr.dpmpp_orders(N),) for N in want}
    check("orders: unipc predictor min(2, N-i, i+1), corrector = previous predictor's order from step 1; "
          "dpm++ 1, 2, .., 2, 1", all(tuple(got[N]) == want[N] for N in want), repr(got))

    # --- upstream's index quirk -----------------------------------------------
    rep = {S: sr.smallest_repeating_steps(S) for S in (1.0, 3.0, 5.0)}
    dp_rep = any(sr.first_timestep_repeats(sr.dpmpp_schedule(N, S)[1]) for N in (2, 1000, 100000) for S in (1.0, 5.0, 20.0))
    check("index quirk: unipc t_0 == t_1 first at N = 501 (shift 3), 251 (shift 5), never for shift 1 "
          "(below 100000 steps); never for dpm++", rep == {1.0: None, 3.0: 501, 5.0: 251} and not dp_rep, repr(rep))

    # --- exactness on a point-mass data set -------------------------------------
    # Data = one point x_d: the exact velocity is v = (x - x_d)/sigma, the x0
    # prediction x - sigma v = x_d is exact, and the exact path is
    # x(sigma) = x_d + (sigma/sigma_0)(x_0 - x_d).  Every step of both solvers
    # must stay on it, and the result must be x_d.
    rng = np.random.default_rng(11)
    xd = rng.standard_normal(40)
    x0 = rng.standard_normal(40) * 2
    worst = 0.0
    for name, (sched, loop) in sr.SOLVERS.items():
        for N in (1, 2, 3, 6, 17):
            for S in (1.0, 3.0, 5.0):
                sg, ts = sched(N, S)
                path = []
                out = loop(lambda x, t, s: (x - xd) / s, x0, sg, ts, trace=lambda i, x: path.append(x.copy()))
                for i, x in enumerate(path):
                    worst = max(worst, max_rel_err(x, xd + (float(sg[i + 1]) / float(sg[0])) * (x0 - xd)))
                worst = max(worst, max_rel_err(out, xd))
    check("point-mass field v = (x - x_d)/sigma: both solvers follow the exact path and end on x_d",
          worst < 1e-13, "max rel err %.1e" % worst)

    # --- first-order steps are Euler; the dpm++ step after sigma = 1 is first order ---
    f = nonlinear_velocity(24, 5)
    x0 = np.random.default_rng(6).standard_normal(24)
    errs = []
    for name, (sched, loop) in sr.SOLVERS.items():
        for S in (1.0, 5.0):
            sg, ts = sched(1, S)
            s0 = float(sg[0])
            errs.append(max_rel_err(loop(f, x0, sg, ts), x0 - s0 * f(x0, ts[0], s0)))
            sg, ts = sched(2, S)
            s0, s1 = float(sg[0]), float(sg[1])
            x1 = x0 + (s1 - s0) * f(x0, ts[0], s0)
            errs.append(max_rel_err(loop(f, x0, sg, ts), x1 - s1 * f(x1, ts[1], s1)))
    for S in (1.0, 3.0):
        sg, ts = sr.dpmpp_schedule(3, S)
        s = [float(v) for v in sg]
        x1 = x0 + (s[1] - s[0]) * f(x0, ts[0], s[0])
        x2 = x1 + (s[2] - s[1]) * f(x1, ts[1], s[1])
        errs.append(max_rel_err(sr.dpmpp_loop(f, x0, sg, ts), x2 - s[2] * f(x2, ts[2], s[2])))
    check("N=1: x - sigma_0 v(x, t_0); N=2: Euler then x0 prediction; dpm++ N=3: Euler, Euler "
          "(sigma_0 = 1 makes r infinite), x0 prediction", max(errs) < 1e-13, "max rel err %.1e" % max(errs))

    # --- UniP-2 with a = 1/2 is DPM-Solver++(2M) --------------------------------
    # Two separately written updates: unipc_loop without its corrector must
    # equal dpmpp_loop on any schedule (same orders 1, 2, .., 2, 1).
    errs = []
    for name in SOLVER_NAMES:
        for N in (3, 6, 20):
            sg, ts = sr.SOLVERS[name][0](N, 3.0)
            errs.append(max_rel_err(sr.unipc_loop(f, x0, sg, ts, corrector=False), sr.dpmpp_loop(f, x0, sg, ts)))
    check("UniP-2 (bh2, a = 1/2) without UniC equals DPM-Solver++(2M) on both schedules",
          max(errs) < 1e-12, "max rel err %.1e" % max(errs))
    sg, ts = sr.unipc_schedule(6, 3.0)
    d = max_rel_err(sr.unipc_loop(f, x0, sg, ts), sr.unipc_loop(f, x0, sg, ts, corrector=False))
    check("the corrector changes the unipc result", d > 1e-4, "rel diff %.1e" % d)

    # --- convergence order ---------------------------------------------------
    # On a grid uniform in lambda the asymptotic orders show cleanly:
    # DPM-Solver++(2M) 2, UniPC 3 (UniP-2 + UniC-2) until the first-order
    # final step's O(h^2) dominates, Euler 1.  Observed order between N and
    # 2N: log2(err_N / err_2N), measured at N = 32 -> 64 -> 128.
    g = GaussianField(32, 3)
    def observed(loop, lam_lo, lam_hi, Ns=(32, 64, 128), **kw):
        e = []
        for N in Ns:
            lam = np.linspace(lam_lo, lam_hi, N + 1)
            sg = 1.0 / (1.0 + np.exp(lam))             # lambda = log((1-sigma)/sigma)
            ts = np.zeros(N, np.int64)
            out = loop(g.velocity, g.x_start, sg, ts, **kw)
            e.append(float(np.max(np.abs(out - g.exact(g.x_start, sg[0], sg[-1])))))
        return [math.log2(e[i] / e[i + 1]) for i in range(len(e) - 1)], e
    o_u, e_u = observed(sr.unipc_loop, -3, 3)
    o_d, e_d = observed(sr.dpmpp_loop, -3, 3)
    o_n, _ = observed(sr.unipc_loop, -3, 3, corrector=False)
    o_e, _ = observed(euler_loop, -3, 3)
    o_u2, _ = observed(sr.unipc_loop, -5, 1)
    check("convergence on a uniform-lambda grid (Gaussian data, exact flow known): unipc order ~3, "
          "dpm++ ~2, unipc without UniC ~2, Euler ~1",
          min(o_u) > 2.7 and 1.85 < min(o_d) and max(o_d) < 2.3 and max(o_n) < 2.3 and min(o_n) > 1.85
          and max(o_e) < 1.2 and min(o_u2) > 1.85,
          "unipc %s, dpm++ %s, no UniC %s, Euler %s, unipc on [-5, 1] %s" % tuple(
              "/".join("%.2f" % v for v in o) for o in (o_u, o_d, o_n, o_e, o_u2)))
    # On Wan's own schedules (uniform in sigma, then shifted) the lambda steps
    # near sigma = 1 do not shrink with N (dpm++ starts at lambda = -inf), so
    # the order is lower than asymptotic; both must still clearly beat Euler.
    lines, ok = [], True
    for name, (sched, loop) in sr.SOLVERS.items():
        for S in (1.0, 3.0, 5.0):
            e, ee = [], []
            for N in (16, 32, 64, 128):
                sg, ts = sched(N, S)
                ex = g.exact(g.x_start, sg[0], 0.0)
                e.append(float(np.max(np.abs(loop(g.velocity, g.x_start, sg, ts) - ex))))
                ee.append(float(np.max(np.abs(euler_loop(g.velocity, g.x_start, sg, ts) - ex))))
            o, oe = math.log2(e[0] / e[-1]) / 3, math.log2(ee[0] / ee[-1]) / 3
            ok &= o > 1.3 and oe < 1.05 and all(e[i + 1] < e[i] for i in range(3)) and e[-1] < ee[-1] / 5
            lines.append("%s S=%g %.2f (Euler %.2f)" % (name, S, o, oe))
    check("convergence on Wan's schedules, N = 16 -> 128: mean order > 1.3, Euler's < 1.05, "
          "error at 128 below a fifth of Euler's", ok, ", ".join(lines))

    # --- coefficient precision --------------------------------------------------
    # Upstream computes the scalars in float32, this reference in float64;
    # the difference must be far inside the 1e-5 cross-check tolerance.
    worst = 0.0
    for name, (sched, loop) in sr.SOLVERS.items():
        for N in (1, 2, 3, 6, 50):
            for S in (1.0, 3.0, 5.0):
                sg, ts = sched(N, S)
                worst = max(worst, max_rel_err(loop(f, x0, sg, ts, coef_dtype=np.float32), loop(f, x0, sg, ts)))
    check("float32 vs float64 scalar coefficients differ by < 1e-6 (steps up to 50)", worst < 1e-6,
          "max rel diff %.1e" % worst)

    # --- tinydit glue -------------------------------------------------------------
    cfg = ref.Config("tiny", **ref.CONFIG_TABLE["tiny"])
    tmp = tempfile.mkdtemp(prefix="reel_solvers_")
    wp = os.path.join(tmp, "w.safetensors")
    safetensors_np.save(wp, ref.fake_weight_tensors(cfg, 3, std=0.1), {"config": "tiny"})
    w = ref.load_weights(wp)
    r = np.random.default_rng(2)
    lat, ctx = r.standard_normal((4, 2, 4, 4)), r.standard_normal((3, 32))
    e1 = max_rel_err(ref.forward(w, lat, ctx, 0.0, timestep=937), ref.forward(w, lat, ctx, 0.937))
    e2 = max_rel_err(ref.forward(w, lat, ctx, 0.9375, timestep=937), ref.forward(w, lat, ctx, 0.9375))
    g1 = sr.generate(w, lat, ctx, None, 1, 5.0, None, "dpm++")
    e3 = max_rel_err(g1, lat - ref.forward(w, lat, ctx, 1.0))
    sg, ts = sr.unipc_schedule(1, 5.0)
    e4 = max_rel_err(sr.generate(w, lat, ctx, None, 1, 5.0, None, "unipc"),
                     lat - float(sg[0]) * ref.forward(w, lat, ctx, 0.0, timestep=999))
    check("tinydit glue: the transformer sees the int timestep (t=937 not 937.5); 1 step = x - sigma_0 v(x, t_0)",
          e1 < 1e-12 and e2 > 1e-4 and e3 < 1e-13 and e4 < 1e-13,
          "t 937 vs sigma .937 %.1e, vs 937.5 %.1e" % (e1, e2))


# ---------------------------------------------------------------------------
# Cross-check against reelctl
# ---------------------------------------------------------------------------
class CmdError(Exception):
    pass


def run_cmd(argv, env=None):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as ex:
        raise CmdError("timed out after %d s: %s\nstderr:\n%s"
                       % (TIMEOUT_S, " ".join(argv), (ex.stderr or b"").decode(errors="replace")))
    except OSError as ex:
        raise CmdError("could not run %s: %s" % (" ".join(argv), ex))
    if p.returncode != 0:
        raise CmdError("exit %d: %s\nstderr:\n%s"
                       % (p.returncode, " ".join(argv), p.stderr.decode(errors="replace").strip()))
    return p


def load_latent(path):
    if not os.path.exists(path):
        raise CmdError("exit 0 but no output file %s" % path)
    tensors, _ = safetensors_np.load(path)
    if "latent" not in tensors:
        raise CmdError("%s has no tensor 'latent' (has %s)" % (path, sorted(tensors)))
    return tensors["latent"]


def raw_latent_bytes(path):
    """The stored bytes of the 'latent' tensor (bitwise comparison)."""
    with open(path, "rb") as fh:
        blob = fh.read()
    n = int.from_bytes(blob[:8], "little")
    import json
    hdr = json.loads(blob[8:8 + n])
    b, e = hdr["latent"]["data_offsets"]
    return hdr["latent"]["dtype"], blob[8 + n + b:8 + n + e]


def plan_cases(configs, size_case, graphs_case):
    """Every case as a dict; kind is 'cmp' (numpy comparison), 'size' or 'graphs'."""
    cases = []
    for cname, _, _, _ in configs:
        for solver in SOLVER_NAMES:
            for use_cfg in (False, True):
                for N in STEPS:
                    for S in SHIFTS:
                        cases.append(dict(kind="cmp", config=cname, solver=solver, cfg=use_cfg, steps=N, shift=S))
    first = configs[0][0]
    for solver in SOLVER_NAMES:
        for N in (5, 10):      # linspace rounding: dpm++ passes t = 399 (and 299), not 400 (300)
            cases.append(dict(kind="cmp", config=first, solver=solver, cfg=True, steps=N, shift=1.0))
        if size_case:
            cases.append(dict(kind="size", config=first, solver=solver, cfg=True, steps=3, shift=5.0))
    if graphs_case:
        for cname, _, _, _ in configs:
            for solver in SOLVER_NAMES:
                cases.append(dict(kind="graphs", config=cname, solver=solver, cfg=True, steps=6, shift=5.0))
    return cases


def case_name(c):
    return "%s %s %s steps=%d shift=%g%s" % (
        c["solver"], c["config"], "cfg=%g" % CFG_SCALE if c["cfg"] else "no-cfg", c["steps"], c["shift"],
        {"cmp": "", "size": " (--size/--seed)", "graphs": " (--graphs on == off, bitwise)"}[c["kind"]])


def setup_inputs(reelctl, workdir, tag, cname, seed, lshape, L, input_seed, env=None):
    """Config cname's weights from `reelctl weights init` (seed), and a
    latent, context and uncond drawn from input_seed, written under
    workdir as TAG_*: (weights path, weights, lat, ctx, unc, {lat, ctx,
    unc: path}, lshape). Raises CmdError and the loaders' errors."""
    wpath = os.path.join(workdir, "%s_w_%s.safetensors" % (tag, cname))
    if os.path.exists(wpath):
        os.remove(wpath)
    run_cmd([reelctl, "weights", "init", "--config", cname, "--seed", str(seed), "--out", wpath], env)
    w = ref.load_weights(wpath)
    rng = np.random.default_rng(input_seed)
    lat = rng.standard_normal(lshape).astype(np.float32)
    ctx = rng.standard_normal((L, w.cfg.text_dim)).astype(np.float32)
    unc = rng.standard_normal((L, w.cfg.text_dim)).astype(np.float32)
    paths = {k: os.path.join(workdir, "%s_%s_%s.safetensors" % (tag, k, cname)) for k in ("lat", "ctx", "unc")}
    safetensors_np.save(paths["lat"], {"latent": lat})
    safetensors_np.save(paths["ctx"], {"context": ctx})
    safetensors_np.save(paths["unc"], {"context": unc})
    return wpath, w, lat, ctx, unc, paths, lshape


def crosscheck_solvers(reelctl, workdir, env=None, quiet=False, configs=CONFIGS, size_case=True,
                       graphs_case=True, backend=None):
    """Returns (passed, failed, {case name: err})."""
    say = (lambda *a: None) if quiet else print
    os.makedirs(workdir, exist_ok=True)
    cases = plan_cases(configs, size_case, graphs_case)
    errs = {}
    setups = {}
    for cname, seed, lshape, L in configs:
        try:
            setups[cname] = setup_inputs(reelctl, workdir, "solver", cname, seed, lshape, L, INPUT_SEED + seed, env)
        except (CmdError, KeyError, ValueError, OSError) as ex:
            say("FAIL solvers weights init %s: %s" % (cname, ex))
            n = sum(1 for c in cases if c["config"] == cname)
            return 0, n + sum(1 for c in cases if c["config"] != cname), errs

    def argv_for(c, out, latent_args):
        wpath, w, lat, ctx, unc, paths, lshape = setups[c["config"]]
        a = [reelctl, "run", "--weights", wpath] + latent_args + ["--context", paths["ctx"]]
        if c["cfg"]:
            a += ["--uncond", paths["unc"], "--cfg", repr(CFG_SCALE)]
        a += ["--steps", str(c["steps"]), "--shift", repr(c["shift"]), "--solver", c["solver"], "--out", out]
        if backend:
            a += ["--backend", backend]
        return a

    passed = failed = 0
    for idx, c in enumerate(cases):
        name = case_name(c)
        wpath, w, lat, ctx, unc, paths, lshape = setups[c["config"]]
        out = os.path.join(workdir, "solver_out.safetensors")
        try:
            if os.path.exists(out):
                os.remove(out)
            if c["kind"] == "graphs":
                got = {}
                for label, extra in (("off", ["--graphs", "off"]), ("on", ["--graphs", "on"]),
                                     ("on, warmup 0", ["--graphs", "on", "--warmup", "0"])):
                    o = os.path.join(workdir, "solver_g%d.safetensors" % len(got))
                    if os.path.exists(o):
                        os.remove(o)
                    run_cmd(argv_for(c, o, ["--latent", paths["lat"]]) + extra, env)
                    load_latent(o)
                    got[label] = raw_latent_bytes(o)
                same = [k for k in got if got[k] == got["off"]]
                ok = len(same) == len(got)
                say("%s solvers %s: %s" % ("PASS" if ok else "FAIL", name,
                                             "bitwise equal" if ok else "differs from off: %s"
                                             % ", ".join(k for k in got if k not in same)))
            else:
                if c["kind"] == "size":
                    F, H, W = lshape[1:]
                    tr = os.path.join(workdir, "solver_size_latent.safetensors")
                    run_cmd([reelctl, "tensor", "rand", "--name", "latent", "--shape", ",".join(map(str, lshape)),
                             "--seed", str(SIZE_SEED), "--out", tr], env)
                    x0 = load_latent(tr)
                    run_cmd(argv_for(c, out, ["--size", "%dx%dx%d" % (F, H, W), "--seed", str(SIZE_SEED)]), env)
                else:
                    x0 = lat
                    run_cmd(argv_for(c, out, ["--latent", paths["lat"]]), env)
                got = load_latent(out)
                want = sr.generate(w, x0, ctx, unc if c["cfg"] else None, c["steps"], c["shift"],
                                   CFG_SCALE if c["cfg"] else None, c["solver"])
                if got.shape != want.shape:
                    raise CmdError("output shape %s, expected %s" % (got.shape, want.shape))
                if not np.all(np.isfinite(got)):
                    raise CmdError("output has non-finite values")
                err = max_rel_err(got, want)
                errs[name] = err
                ok = err <= TOL
                say("%s solvers %s: max rel err %.3e (tol %.0e, max|ref| %.3e)"
                    % ("PASS" if ok else "FAIL", name, err, TOL, float(np.max(np.abs(want)))))
        except (CmdError, KeyError, ValueError, OSError) as ex:
            msg = str(ex)
            if idx == 0 and "--solver" in msg and ("unknown" in msg or "usage" in msg.lower()):
                say("FAIL solvers: `reelctl run` does not take --solver yet, so all %d solver cases fail: %s"
                    % (len(cases), msg.splitlines()[-1] if msg.splitlines() else msg))
                return 0, len(cases), errs
            ok = False
            say("FAIL solvers %s: %s" % (name, msg))
        passed += ok
        failed += not ok
    return passed, failed, errs


def crosscheck_sde_grid(reelctl, workdir, env=None, configs=CONFIGS):
    """SDE steps on a solver's grid (`run --sde --solver unipc|dpm++`:
    Flow-GRPO's Wan rollouts with Wan's scheduler): the sigmas and int
    timesteps of that solver's schedule. With eta 0 the SDE step is the
    Euler step, so the reference is euler_loop over the solver's own
    schedule with the transformer at its int t (1000 sigma would differ:
    tiny's sinusoid turns about a radian per unit of t). Returns (passed,
    failed)."""
    os.makedirs(workdir, exist_ok=True)
    passed = failed = 0
    grid_cases = [(so, steps, shift) for so in SOLVER_NAMES for steps, shift in ((3, 3.0), (6, 5.0))]
    for cname, seed, lshape, L in configs:
        try:
            wpath, w, lat, ctx, unc, paths, _ = setup_inputs(reelctl, workdir, "grid", cname, seed, lshape, L,
                                                             INPUT_SEED + seed + 1, env)
        except (CmdError, KeyError, ValueError, OSError) as ex:
            print("FAIL solvers sde on a grid, %s's weights: %s" % (cname, ex))
            failed += len(grid_cases)
            continue
        for so, steps, shift in grid_cases:
            name = "%s sde on the %s grid, eta 0, %d steps, shift %g, CFG" % (cname, so, steps, shift)
            out = os.path.join(workdir, "grid_out.safetensors")
            try:
                if os.path.exists(out):
                    os.remove(out)
                run_cmd([reelctl, "run", "--weights", wpath, "--latent", paths["lat"], "--context", paths["ctx"],
                         "--uncond", paths["unc"], "--cfg", repr(CFG_SCALE), "--steps", str(steps), "--shift",
                         repr(shift), "--solver", so, "--sde", "--eta", "0", "--out", out], env)
                got = load_latent(out)
                sig, ts = sr.SOLVERS[so][0](steps, shift)
                want = euler_loop(sr.dit_velocity_fn(w, ctx, unc, CFG_SCALE), lat, sig, ts)
                err = max_rel_err(got, want)
                ok = bool(np.all(np.isfinite(got))) and err <= TOL
                print("%s solvers %s: max rel err %.3e (tol %.0e)" % ("PASS" if ok else "FAIL", name, err, TOL))
            except (CmdError, KeyError, ValueError, OSError) as ex:
                ok = False
                print("FAIL solvers %s: %s" % (name, ex))
            passed += ok
            failed += not ok
    return passed, failed


# ---------------------------------------------------------------------------
# Self-test of the comparison path with fake_reelctl.py (negative controls)
# ---------------------------------------------------------------------------
FAKE_BUGS = ("t_float", "t_round", "no_corrector", "a_solve", "dpm_unipc_sched", "dpm_shift_twice",
             "exact_linspace", "euler")


def fake_selftest(check):
    fake = os.path.join(HERE, "fake_reelctl.py")
    env = dict(os.environ)
    env.pop("FAKE_REELCTL_BUG", None)
    env["FAKE_REELCTL_STD"] = "0.1"
    tmp = tempfile.mkdtemp(prefix="reel_solvers_fake_")
    tiny = CONFIGS[:1]
    print("-- solver comparison path against fake_reelctl.py (numpy in float32):")
    p, f, errs = crosscheck_solvers(fake, os.path.join(tmp, "ok"), env, configs=tiny, size_case=False)
    check("comparison path passes against the float32 fake", p > 0 and f == 0,
          "%d passed, %d failed, worst %.1e" % (p, f, max(errs.values()) if errs else float("nan")))
    for bug in FAKE_BUGS:
        env["FAKE_REELCTL_BUG"] = bug
        p, f, errs = crosscheck_solvers(fake, os.path.join(tmp, bug), env, quiet=True, configs=tiny,
                                        size_case=False, graphs_case=False)
        worst = max(errs.values()) if errs else float("nan")
        check("comparison path catches injected solver bug %s" % bug, f >= 1,
              "%d of %d cases fail, worst %.1e" % (f, p + f, worst))
    env["FAKE_REELCTL_BUG"] = "no_solver_flag"
    p, f, _ = crosscheck_solvers(fake, os.path.join(tmp, "noflag"), env, quiet=True, configs=tiny)
    check("a reelctl without --solver fails every case (not skipped)", p == 0 and f == len(plan_cases(tiny, True, True)))


def run_reference_checks():
    c = Checks()
    reference_checks(c)
    return c.passed, c.failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reelctl")
    ap.add_argument("--workdir")
    ap.add_argument("--backend", help="pass --backend to reelctl run (default: reelctl's default)")
    ap.add_argument("--reference", action="store_true", help="reference checks only")
    ap.add_argument("--selftest", action="store_true", help="reference checks and the fake comparison path")
    a = ap.parse_args()
    if a.reference or a.selftest:
        c = Checks()
        reference_checks(c)
        if a.selftest:
            fake_selftest(c)
        print("solvers: %d passed, %d failed" % (c.passed, c.failed))
        return 0 if c.failed == 0 else 1
    if not a.reelctl or not a.workdir:
        ap.error("--reelctl and --workdir are required (or --reference / --selftest)")
    rp, rf = run_reference_checks()
    p, f, _ = crosscheck_solvers(a.reelctl, a.workdir, backend=a.backend)
    gp, gf = crosscheck_sde_grid(a.reelctl, a.workdir) if not a.backend else (0, 0)
    print("solvers: %d passed, %d failed" % (rp + p + gp, rf + f + gf))
    return 0 if rf + f + gf == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
