#!/usr/bin/python3
"""Cross-check reelctl (C) against the independent numpy reference tinydit_ref.py.

Usage:
  /usr/bin/python3 tests/crosscheck/test_crosscheck.py --reelctl build/reelctl --workdir DIR
  /usr/bin/python3 tests/crosscheck/test_crosscheck.py --selftest

Exit 0 when every case passes, 1 otherwise.  One line per case with its max
relative error (max|a-b| / max(max|b|, 1e-12), a = reelctl, b = numpy), then
a final `crosscheck: P passed, F failed` line.

After the Euler cases below, the run also does test_solvers.py's work (issue
24): the checks of the numpy UniPC / DPM++ reference solvers_ref.py and the
cross-check of `reelctl run --solver unipc|dpm++` against it at 1e-5.
`--no-solvers` leaves them out; `test_solvers.py --selftest` exercises their
comparison path against fake_reelctl.py.

Then test_tokenizer.py's cross-check (issue 26): `reelctl tokenize` against
Python's sentencepiece with Wan's prompt cleaning, on a model spm_train makes
(`--no-tokenizer` leaves it out).
"""

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_np  # noqa: E402
import test_solvers  # noqa: E402
import test_lora  # noqa: E402
import test_tokenizer  # noqa: E402
import tinydit_ref as ref  # noqa: E402

TOL = 1e-4
TIMEOUT_S = 120
INPUT_SEED = 20240607

# (name, extra run args, uses uncond, steps, shift, cfg)
CASES = [
    ("one step", ["--steps", "1", "--shift", "3.0"], False, 1, 3.0, None),
    ("4-step CFG loop", ["--uncond", None, "--steps", "4", "--shift", "3.0", "--cfg", "5.0"],
     True, 4, 3.0, 5.0),
]


def max_rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


class CmdError(Exception):
    pass


def run_cmd(argv, env=None):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as ex:
        raise CmdError("timed out after %d s: %s\nstderr:\n%s"
                       % (TIMEOUT_S, " ".join(argv), (ex.stderr or b"").decode(errors="replace")))
    except OSError as ex:
        raise CmdError("could not run %s: %s" % (" ".join(argv), ex))
    if p.returncode != 0:
        raise CmdError("exit %d: %s\nstderr:\n%s"
                       % (p.returncode, " ".join(argv), p.stderr.decode(errors="replace")))
    return p


def write_inputs(workdir):
    rng = np.random.default_rng(INPUT_SEED)
    latent = rng.standard_normal((4, 2, 8, 8)).astype(np.float32)   # [C, F, H, W]
    ctx = rng.standard_normal((5, 32)).astype(np.float32)           # [L, T]
    unc = rng.standard_normal((5, 32)).astype(np.float32)           # [L, T], different values
    paths = {k: os.path.join(workdir, k + ".safetensors") for k in ("latent", "ctx", "unc")}
    safetensors_np.save(paths["latent"], {"latent": latent})
    safetensors_np.save(paths["ctx"], {"context": ctx})
    safetensors_np.save(paths["unc"], {"context": unc})
    return paths, latent, ctx, unc


def crosscheck(reelctl, workdir, env=None, quiet=False):
    """Run both cases; returns (passed, failed, {case: err})."""
    os.makedirs(workdir, exist_ok=True)
    say = (lambda *a: None) if quiet else print
    wpath = os.path.join(workdir, "w.safetensors")
    errs = {}
    try:
        if os.path.exists(wpath):
            os.remove(wpath)
        run_cmd([reelctl, "weights", "init", "--config", "tiny", "--seed", "7", "--out", wpath], env)
        if not os.path.exists(wpath):
            raise CmdError("weights init exited 0 but wrote no %s" % wpath)
        w = ref.load_weights(wpath)
    except (CmdError, KeyError, ValueError) as ex:
        say("FAIL weights init: %s" % ex)
        return 0, len(CASES), errs
    say("weights: %r" % (w.cfg,))
    paths, latent, ctx, unc = write_inputs(workdir)

    passed = failed = 0
    for idx, (name, extra, use_unc, steps, shift, cfg) in enumerate(CASES):
        out = os.path.join(workdir, "o%d.safetensors" % steps)
        if os.path.exists(out):
            os.remove(out)
        extra = [paths["unc"] if x is None else x for x in extra]
        argv = [reelctl, "run", "--weights", wpath, "--latent", paths["latent"],
                "--context", paths["ctx"]] + extra + ["--out", out]
        try:
            run_cmd(argv, env)
            if not os.path.exists(out):
                raise CmdError("exit 0 but no output file %s" % out)
            tensors, _ = safetensors_np.load(out)
            if "latent" not in tensors:
                raise CmdError("%s has no tensor 'latent' (has %s)" % (out, sorted(tensors)))
            got = tensors["latent"]
            want = ref.generate(w, latent, ctx, unc if use_unc else None, steps, shift, cfg)
            if got.shape != want.shape:
                raise CmdError("output shape %s, expected %s" % (got.shape, want.shape))
            if not np.all(np.isfinite(got)):
                raise CmdError("output has non-finite values")
            err = max_rel_err(got, want)
            errs[name] = err
            ok = err <= TOL
            # Info only (not a pass criterion): the same error measured against
            # the size of the update (output - input latent) rather than the
            # output, which is dominated by the input latent when v is small.
            derr = float(np.max(np.abs(got.astype(np.float64) - want))
                         / max(float(np.max(np.abs(want - latent))), 1e-12))
            say("%s %s: max rel err %.3e (tol %.0e, max|ref| %.3e; info: err/max|ref-latent| %.3e)"
                % ("PASS" if ok else "FAIL", name, err, TOL, float(np.max(np.abs(want))), derr))
        except (CmdError, KeyError, ValueError) as ex:
            ok = False
            say("FAIL %s: %s" % (name, ex))
        passed += ok
        failed += not ok
    return passed, failed, errs


# ---------------------------------------------------------------------------
# Self-test: checks of the numpy model that follow from the page alone.
# ---------------------------------------------------------------------------
def selftest():
    results = []

    def check(name, cond, detail=""):
        results.append(bool(cond))
        print("%s selftest %s%s" % ("PASS" if cond else "FAIL", name, (": " + detail) if detail else ""))

    rng = np.random.default_rng(1)
    tmp = tempfile.mkdtemp(prefix="reel_crosscheck_")

    # --- safetensors round trip, header padding, BF16/F16 widening -------------
    p = os.path.join(tmp, "rt.safetensors")
    a = rng.standard_normal((3, 5)).astype(np.float32)
    safetensors_np.save(p, {"a": a, "s": np.float32(2.5)}, {"config": "tiny", "dim": 64})
    with open(p, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    t, meta = safetensors_np.load(p)
    check("safetensors F32 round trip", np.array_equal(t["a"], a) and t["s"].shape == ()
          and float(t["s"]) == 2.5 and meta == {"config": "tiny", "dim": "64"} and n % 8 == 0)
    vals = np.array([1.0, -2.5, 0.15625, 3.0e4, -1e-3], dtype=np.float32)
    bf = (vals.view(np.uint32) >> 16).astype("<u2")        # exact for these truncations
    safetensors_np.save_raw(p, {"b": ("BF16", [5], bf.tobytes()),
                                "h": ("F16", [5], vals.astype("<f2").tobytes())})
    t, _ = safetensors_np.load(p)
    check("safetensors BF16/F16 widen",
          np.array_equal(t["b"], (bf.astype(np.uint32) << 16).view(np.float32))
          and t["b"][0] == 1.0 and t["b"][1] == -2.5
          and np.array_equal(t["h"], vals.astype(np.float16).astype(np.float32))
          and t["b"].dtype == np.float32 and t["h"].dtype == np.float32)

    # --- config from metadata ------------------------------------------------
    c1 = ref.config_from_metadata({"config": "tiny"})
    c2 = ref.config_from_metadata({"config": "x", "dim": "64", "heads": "4", "layers": "2",
                                   "ffn_dim": "128", "in_channels": "4", "text_dim": "32",
                                   "freq_dim": "256"})
    check("config table / metadata", vars(c1) == dict(vars(c2), name="tiny") and c1.head_dim == 16)

    # --- primitives ---------------------------------------------------------
    s0 = ref.sinusoid(0.0, 256)
    s1 = ref.sinusoid(1000.0, 256)
    check("sinusoid t=0 is [1]*128 + [0]*128", s0.shape == (256,) and np.all(s0[:128] == 1) and np.all(s0[128:] == 0))
    check("sinusoid omega_j = 10000^(-j/128)",
          abs(s1[0] - math.cos(1000.0)) < 1e-15 and abs(s1[128 + 5] - math.sin(1000.0 * 10000 ** (-5 / 128))) < 1e-12
          and abs(s1[127] - math.cos(1000.0 * 10000 ** (-127 / 128))) < 1e-12)
    check("GELU_tanh values", abs(ref.gelu_tanh(np.array(1.0)) - 0.8411919906082768) < 1e-12
          and ref.gelu_tanh(np.array(0.0)) == 0.0)
    W = rng.standard_normal((3, 2))
    bvec = rng.standard_normal(3)
    xv = rng.standard_normal((4, 2))
    check("Linear = x W^T + b (W [out, in])",
          np.allclose(ref.linear(xv, W, bvec), [[sum(xv[n, i] * W[o, i] for i in range(2)) + bvec[o] for o in range(3)] for n in range(4)]))
    z = ref.layer_norm(rng.standard_normal((7, 64)) * 3 + 1)
    check("LN no-affine: mean 0, var ~1", np.allclose(z.mean(-1), 0) and np.allclose(z.var(-1), 1, atol=1e-5))
    r = ref.rms_norm(rng.standard_normal((7, 64)) * 3, np.ones(64))
    check("RMS over width: mean square ~1", np.allclose((r * r).mean(-1), 1, atol=1e-5))
    q = rng.standard_normal((3, 8))
    k = rng.standard_normal((1, 8))
    v = rng.standard_normal((1, 8))
    check("attention with one key returns v", np.allclose(ref.attention(q, k, v, 2), np.repeat(v, 3, 0)))
    k = rng.standard_normal((5, 8))
    v = rng.standard_normal((5, 8))
    o = ref.attention(q, k, v, 2)
    brute = np.zeros_like(o)
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        sc = q[:, sl] @ k[:, sl].T / 2.0
        pr = np.exp(sc) / np.exp(sc).sum(1, keepdims=True)
        brute[:, sl] = pr @ v[:, sl]
    check("attention per head = brute force", np.allclose(o, brute))

    # --- patchify / unpatchify --------------------------------------------------
    C, F, Hh, Ww = 3, 2, 6, 4
    lat = rng.standard_normal((C, F, Hh, Ww))
    tok = ref.patchify(lat)
    brute_tok = np.zeros((F * (Hh // 2) * (Ww // 2), 4 * C))
    for f in range(F):
        for h in range(Hh // 2):
            for w_ in range(Ww // 2):
                n = (f * (Hh // 2) + h) * (Ww // 2) + w_
                for c in range(C):
                    for ph in range(2):
                        for pw in range(2):
                            brute_tok[n, ((c * 1 + 0) * 2 + ph) * 2 + pw] = lat[c, f, 2 * h + ph, 2 * w_ + pw]
    check("patchify = (f,h,w) tokens, (c,pt,ph,pw) vector", np.array_equal(tok, brute_tok))
    y = rng.standard_normal((F * (Hh // 2) * (Ww // 2), 4 * C))
    un = ref.unpatchify(y, C, F, Hh, Ww)
    brute_un = np.full((C, F, Hh, Ww), np.nan)
    for f in range(F):
        for h in range(Hh // 2):
            for w_ in range(Ww // 2):
                n = (f * (Hh // 2) + h) * (Ww // 2) + w_
                for ph in range(2):
                    for pw in range(2):
                        for c in range(C):
                            brute_un[c, f + 0, 2 * h + ph, 2 * w_ + pw] = y[n, ((0 * 2 + ph) * 2 + pw) * C + c]
    check("unpatchify = (pt,ph,pw,c) c fastest -> latent[c,f+pt,2h+ph,2w+pw]", np.array_equal(un, brute_un))
    perm = tok.reshape(-1, C, 4).transpose(0, 2, 1).reshape(-1, 4 * C)   # (c, p) -> (p, c)
    check("unpatchify inverts patchify after (c,p)->(p,c) reorder", np.array_equal(ref.unpatchify(perm, C, F, Hh, Ww), lat))
    check("unpatchify order differs from patchify order (page's note)",
          not np.array_equal(ref.unpatchify(tok, C, F, Hh, Ww), lat))
    Wpe = rng.standard_normal((5, C, 1, 2, 2))
    bpe = rng.standard_normal(5)
    emb = ref.linear(tok, Wpe.reshape(5, 4 * C), bpe)
    conv = np.zeros_like(emb)
    for n, (f, h, w_) in enumerate(ref.token_grid(F, Hh // 2, Ww // 2)):
        for o_ in range(5):
            conv[n, o_] = bpe[o_] + np.sum(Wpe[o_, :, 0] * lat[:, f, 2 * h:2 * h + 2, 2 * w_:2 * w_ + 2])
    check("patch embedding = Conv3d(kernel=stride=(1,2,2)) with [D,C,1,2,2] weight", np.allclose(emb, conv))

    # --- RoPE -------------------------------------------------------------
    d = 16
    check("RoPE parts for d=16 are (8, 4, 4); d=128 -> (44, 42, 42)",
          ref.rope_parts(16) == (8, 4, 4) and ref.rope_parts(128) == (44, 42, 42))
    xq = rng.standard_normal((1, 3, d))
    th0 = ref.rope_angles(np.zeros((1, 3)), d)
    check("RoPE at position 0 is identity", np.array_equal(ref.apply_rope(xq, th0), xq))
    pos = np.array([[1, 2, 3], [0, 5, 1], [7, 0, 0], [3, 3, 3]])
    xq = rng.standard_normal((4, 3, d))
    rq = ref.apply_rope(xq, ref.rope_angles(pos, d))
    pn = lambda a: a[..., 0::2] ** 2 + a[..., 1::2] ** 2  # noqa: E731
    check("RoPE preserves pair norms", np.allclose(pn(rq), pn(xq)))
    th = ref.rope_angles(pos, d)
    brute_th = np.zeros((4, d // 2))
    for n in range(4):
        for jj in range(d // 2):
            # frame part: real dims [0, 8) -> pairs 0..3 (r=8); row: dims [8,12) -> pairs 4,5 (r=4); col: pairs 6,7
            if jj < 4:
                brute_th[n, jj] = pos[n, 0] * 10000 ** (-2 * jj / 8)
            elif jj < 6:
                brute_th[n, jj] = pos[n, 1] * 10000 ** (-2 * (jj - 4) / 4)
            else:
                brute_th[n, jj] = pos[n, 2] * 10000 ** (-2 * (jj - 6) / 4)
    check("RoPE angles = brute force from the page (d=16)", np.allclose(th, brute_th))
    a0, b0 = xq[0, 0, 2], xq[0, 0, 3]
    t1 = th[0, 1]
    check("RoPE rotation (a,b)->(a cos - b sin, a sin + b cos)",
          np.allclose(rq[0, 0, 2:4], [a0 * math.cos(t1) - b0 * math.sin(t1), a0 * math.sin(t1) + b0 * math.cos(t1)]))
    qv = rng.standard_normal((1, 1, d))
    kv = rng.standard_normal((1, 1, d))
    dots = []
    for shift3 in ([0, 0, 0], [2, 1, 3]):
        pq = np.array([[4, 2, 1]]) + shift3
        pk = np.array([[1, 3, 2]]) + shift3
        dots.append(float(np.sum(ref.apply_rope(qv, ref.rope_angles(pq, d)) * ref.apply_rope(kv, ref.rope_angles(pk, d)))))
    check("RoPE q.k depends only on relative position", abs(dots[0] - dots[1]) < 1e-12)

    # --- schedule ---------------------------------------------------------
    ok = True
    for N in (1, 4, 30):
        for S in (1.0, 3.0, 5.0):
            sg = ref.sigma_schedule(N, S)
            ok &= sg.shape == (N + 1,) and sg[0] == 1.0 and sg[-1] == 0.0 and np.all(np.diff(sg) < 0)
            if S == 1.0:
                ok &= np.allclose(sg, 1 - np.arange(N + 1) / N)
    sg = ref.sigma_schedule(4, 3.0)
    ok &= np.allclose(sg, [1.0, 0.9, 0.75, 0.5, 0.0])   # 3u/(1+2u) at u = 1, .75, .5, .25, 0
    check("sigma schedule: sigma_0 = 1, sigma_N = 0, decreasing, S=1 linear, S=3 N=4 values", ok,
          "N=4 S=3: %s" % np.array2string(sg, precision=4))

    # --- whole model on fake weights ----------------------------------------
    cfg = ref.Config("tiny", **ref.CONFIG_TABLE["tiny"])
    wp = os.path.join(tmp, "fake_w.safetensors")
    safetensors_np.save(wp, ref.fake_weight_tensors(cfg, 7), {"config": "tiny"})
    w = ref.load_weights(wp)   # config from the table via "config" only
    lat = rng.standard_normal((4, 2, 8, 8))
    ctx = rng.standard_normal((5, 32))
    unc = rng.standard_normal((5, 32))
    v = ref.forward(w, lat, ctx, 0.75)
    check("forward shape and finite", v.shape == lat.shape and np.all(np.isfinite(v)), "max|v| %.3e" % np.max(np.abs(v)))
    g1 = ref.generate(w, lat, ctx, None, 1, 3.0, None)
    check("1-step Euler = x - v(x, t=1000)", np.allclose(g1, lat - ref.forward(w, lat, ctx, 1.0), rtol=0, atol=1e-14))
    gn = ref.generate(w, lat, ctx, None, 3, 3.0, None)
    gc1 = ref.generate(w, lat, ctx, unc, 3, 3.0, 1.0)
    gc0 = ref.generate(w, lat, ctx, unc, 3, 3.0, 0.0)
    gu = ref.generate(w, lat, unc, None, 3, 3.0, None)
    check("CFG g=1 equals no guidance; g=0 equals uncond only",
          max_rel_err(gc1, gn) < 1e-13 and max_rel_err(gc0, gu) < 1e-13)
    check("context matters (v_c != v_u)", max_rel_err(ref.forward(w, lat, unc, 0.5), ref.forward(w, lat, ctx, 0.5)) > 1e-6)
    # Does the time embedding / modulation path matter? v at different sigma must differ.
    check("timestep matters", max_rel_err(ref.forward(w, lat, ctx, 0.3), ref.forward(w, lat, ctx, 0.9)) > 1e-6)
    # float32 vs float64: how much of the 1e-4 tolerance plain float32 rounding uses.
    e1 = max_rel_err(ref.forward(w, lat, ctx, 1.0, dtype=np.float32), ref.forward(w, lat, ctx, 1.0))
    e4 = max_rel_err(ref.generate(w, lat, ctx, unc, 4, 3.0, 5.0, dtype=np.float32),
                     ref.generate(w, lat, ctx, unc, 4, 3.0, 5.0))
    check("float32 rounding well inside tolerance", e1 < TOL / 10 and e4 < TOL / 10,
          "forward %.2e, 4-step CFG %.2e" % (e1, e4))

    # --- the comparison path, end to end, with the fake reelctl ---------------
    fake = os.path.join(HERE, "fake_reelctl.py")
    env = dict(os.environ)
    env.pop("FAKE_REELCTL_BUG", None)
    env.pop("FAKE_REELCTL_STD", None)
    print("-- comparison path against fake_reelctl.py (numpy in float32):")
    pz, fz, errs = crosscheck(fake, os.path.join(tmp, "fake_ok"), env)
    check("comparison path passes against the float32 fake", pz == len(CASES) and fz == 0)
    # Negative controls: deliberate mistakes in the fake must fail at least one
    # case.  With N(0, 0.02) weights the velocity is small next to the latent
    # and a GELU_tanh -> erf swap is invisible at 1e-4, so these use std 0.1.
    env["FAKE_REELCTL_STD"] = "0.1"
    for bug in ("unpatchify", "rope_swap", "head_e6", "gelu_erf", "no_rms"):
        env["FAKE_REELCTL_BUG"] = bug
        pz, fz, errs = crosscheck(fake, os.path.join(tmp, "fake_" + bug), env, quiet=True)
        check("comparison path catches injected bug %s (weights std 0.1)" % bug, fz >= 1,
              ", ".join("%s %.2e" % kv for kv in errs.items()))
    env["FAKE_REELCTL_BUG"] = ""
    pz, fz, _ = crosscheck("/nonexistent/reelctl", os.path.join(tmp, "missing"), env, quiet=True)
    check("missing tool is a failure", pz == 0 and fz == len(CASES))

    # --- the UniPC / DPM++ reference (solvers_ref.py) --------------------------
    print("-- UniPC / DPM++ reference checks (test_solvers.py --selftest adds its fake comparison path):")
    sc = test_solvers.Checks()
    test_solvers.reference_checks(sc)
    results.extend(sc.results)

    npass = sum(results)
    nfail = len(results) - npass
    print("crosscheck: %d passed, %d failed" % (npass, nfail))
    return 0 if nfail == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reelctl", help="path to the reelctl binary")
    ap.add_argument("--workdir", help="directory for weights, inputs and outputs")
    ap.add_argument("--selftest", action="store_true", help="check the numpy model alone (no reelctl needed)")
    ap.add_argument("--no-solvers", action="store_true", help="Euler cases only (no UniPC / DPM++)")
    ap.add_argument("--no-tokenizer", action="store_true", help="leave out the tokenizer cross-check")
    a = ap.parse_args()
    if a.selftest:
        return selftest()
    if not a.reelctl or not a.workdir:
        ap.error("--reelctl and --workdir are required (or --selftest)")
    passed, failed, _ = crosscheck(a.reelctl, a.workdir)
    if not a.no_solvers:
        print("-- UniPC / DPM++ (issue 24): reference checks, then reelctl run --solver vs solvers_ref.py")
        rp, rf = test_solvers.run_reference_checks()
        sp, sf, _ = test_solvers.crosscheck_solvers(a.reelctl, a.workdir)
        gp, gf = test_solvers.crosscheck_sde_grid(a.reelctl, a.workdir)
        passed += rp + sp + gp
        failed += rf + sf + gf
    if not a.no_tokenizer:
        print("-- tokenizer (issue 26): reelctl tokenize vs Python's sentencepiece and Wan's cleaning")
        tp, tf = test_tokenizer.crosscheck_tokenizer(a.reelctl, os.path.join(a.workdir, "tokenizer"))
        passed += tp
        failed += tf
    print("-- reelctl plan (issue 28): its FLOPs against the block's matrix products written in Python")
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_plan.py"),
                        "--reelctl", a.reelctl], capture_output=True, text=True, timeout=300)
    print(r.stdout, end="")
    m = re.search(r"^plan: (\d+) passed, (\d+) failed", r.stdout, re.M)
    passed += int(m.group(1)) if m else 0
    failed += int(m.group(2)) if m else 1
    print("-- LoRA (issue 27): reelctl run --lora vs numpy's W + s*B@A in a full file; refusals by name")
    lp, lf = test_lora.crosscheck_lora(a.reelctl, os.path.join(a.workdir, "lora"))
    passed += lp
    failed += lf
    print("crosscheck: %d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
