#!/usr/bin/python3
"""Wan2.1's VAE decoder: check the numpy reference vae_ref.py against itself
(the whole-clip causal decode equals upstream's per-frame cached loop), then
cross-check `reelctl decode` against it.

Usage:
  /usr/bin/python3 tests/crosscheck/test_vae.py --reelctl build/reelctl --workdir DIR
  /usr/bin/python3 tests/crosscheck/test_vae.py --reference   (reference checks only)

Cross-check: weights from `reelctl weights init-vae` (vae-tiny, dim 8 z_dim 4;
dim 4 z_dim 3; dim 4 z_dim 16, which un-normalises with Wan's mean and std), latents of F = 1, 2, 3 frames written
here, `reelctl decode` against vae_ref.decode_whole in float64. Each case
prints max|a - b| / max|b| (a = reelctl, b = numpy) against TOL = 1e-4, and
the share of values the clamp left alone (a case that only compared ±1s would
prove little).
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_np  # noqa: E402
import vae_ref as ref  # noqa: E402

TOL = 1e-4
TIMEOUT_S = 120
# (name, init-vae arguments, weights seed, latent H, W). No dim below 4: at
# dim 2 the last stage normalises 2 channels, a map whose condition (~200,
# measured by perturbing the input by 1e-7) lifts F32 rounding to ~1e-4.
CONFIGS = (("vae-tiny", ["--config", "vae-tiny"], 5, 3, 4),
           ("dim4-z3", ["--config", "vae-tiny", "--dim", "4", "--z-dim", "3"], 9, 4, 3),
           # z_dim 16: Wan's published latent mean and std un-normalise z
           ("dim4-z16", ["--config", "wan2.1", "--dim", "4"], 13, 2, 3))
FRAMES = (1, 2, 3)
INPUT_SEED = 20261203


def max_rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        print("  %s %s%s" % ("ok  " if ok else "FAIL", name, (": " + detail) if detail else ""))
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def reference_checks(c):
    """The whole-clip decode equals upstream's per-frame cached loop (the
    claim vae_ref.py's docstring argues), frames and size are right, and the
    decode is causal."""
    for dim, z, seed in ((4, 3, 1), (8, 4, 2)):
        w = ref.random_weights(dim, z, seed)
        lat = np.random.default_rng(seed + 100).standard_normal((z, 3, 3, 2))
        a = ref.decode_whole(w, lat)
        b = ref.decode_chunked(w, lat)
        c.check("reference dim %d z %d: whole-clip decode shape [3, 9, 24, 16]" % (dim, z), a.shape == (3, 9, 24, 16),
                str(a.shape))
        err = float(np.max(np.abs(a - b)))
        c.check("reference dim %d z %d: whole-clip == per-frame cached loop" % (dim, z), err < 1e-12, "max |diff| %.3g" % err)
        p = ref.decode_whole(w, lat[:, :2])
        c.check("reference dim %d z %d: F=2 gives F=3's first 5 frames" % (dim, z),
                float(np.max(np.abs(p - a[:, :5]))) < 1e-12)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stderr.decode(errors="replace")))


def crosscheck(reelctl, workdir, c):
    rng = np.random.default_rng(INPUT_SEED)
    for name, args, seed, H, W in CONFIGS:
        wpath = os.path.join(workdir, "vae-%s.safetensors" % name)
        try:
            run([reelctl, "weights", "init-vae"] + args + ["--seed", str(seed), "--out", wpath])
        except Exception as e:  # noqa: BLE001
            c.check("%s: weights init-vae" % name, False, str(e))
            continue
        w, _ = safetensors_np.load(wpath)
        w = {k: v.astype(np.float64) for k, v in w.items()}
        z = ref.config_from_weights(w)["z_dim"]
        for F in FRAMES:
            case = "%s F=%d latent [%d,%d,%d,%d]" % (name, F, z, F, H, W)
            lat = rng.standard_normal((z, F, H, W)).astype(np.float32)
            lpath = os.path.join(workdir, "lat-%s-%d.safetensors" % (name, F))
            opath = os.path.join(workdir, "video-%s-%d.safetensors" % (name, F))
            safetensors_np.save(lpath, {"latent": lat})
            try:
                run([reelctl, "decode", "--quiet", "--vae", wpath, lpath, "-o", opath])
                got, _ = safetensors_np.load(opath)
                got = got["video"]
            except Exception as e:  # noqa: BLE001
                c.check(case, False, str(e))
                continue
            want = ref.decode_whole(w, lat)
            if got.shape != want.shape:
                c.check(case, False, "shape %s, expected %s" % (got.shape, want.shape))
                continue
            err = max_rel_err(got, want)
            free = float(np.mean(np.abs(want) < 1.0))
            c.check(case, err <= TOL and free > 0.5,
                    "video %s, max rel err %.3g (tol %g), %.0f%% unclamped" % (list(got.shape), err, TOL, 100 * free))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reelctl", help="path to the reelctl binary")
    ap.add_argument("--workdir", help="directory for weights, inputs and outputs (default: a temporary one)")
    ap.add_argument("--reference", action="store_true", help="check the numpy reference alone")
    a = ap.parse_args()
    c = Checks()
    print("-- numpy reference: whole-clip causal decode vs upstream's per-frame cached loop")
    reference_checks(c)
    if not a.reference:
        if not a.reelctl:
            ap.error("--reelctl is required (or --reference)")
        print("-- reelctl decode vs vae_ref.decode_whole")
        if a.workdir:
            os.makedirs(a.workdir, exist_ok=True)
            crosscheck(a.reelctl, a.workdir, c)
        else:
            with tempfile.TemporaryDirectory(prefix="reel-vae-") as d:
                crosscheck(a.reelctl, d, c)
    print("vae-crosscheck: %d passed, %d failed" % (c.passed, c.failed))
    return 0 if c.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
