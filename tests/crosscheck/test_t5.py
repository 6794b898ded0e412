#!/usr/bin/python3
"""The umT5 text encoder: `reelctl encode` against the numpy reference
t5_ref.py (written from Wan2.1's wan/modules/t5.py, not from Reel's C).

Usage:
  /usr/bin/python3 tests/crosscheck/test_t5.py --reelctl build/reelctl --workdir DIR

Weights: `reelctl weights init-t5` for t5-tiny and t5-small, F32 and BF16
(the numpy side reads the same file, BF16 widened). Ids: length 1, 3, 17,
and 150 and 200 (beyond max_dist 128, so the far log buckets and the capped
last bucket are used), each unpadded and padded (--pad-to), whose real rows
must match the reference run at the same padded length. Each case prints
max|a - b| / max|b| (a = reelctl, b = numpy in float64) against TOL = 1e-4.
Also: an id >= vocab exits 2 naming it, and the bucket function of the
reference against the values T5 publishes for 32 buckets / 128.
Last line: "t5: N passed, N failed".
"""

import argparse
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_np  # noqa: E402
import t5_ref  # noqa: E402

TOL = 1e-4
TIMEOUT_S = 120


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)


def bucket_checks(ck):
    # HF/T5's bidirectional table for 32 buckets, max distance 128: offsets
    # 0..7 exact, 8..11 -> 8, 12..15 -> 9, 16..22 -> 10, 23..31 -> 11,
    # 32..45 -> 12, 46..63 -> 13, 64..90 -> 14, >= 91 -> 15; +16 for keys
    # after the query.
    def want(r):
        a = abs(r)
        edges = [(8, 8), (12, 9), (16, 10), (23, 11), (32, 12), (46, 13), (64, 14), (91, 15)]
        b = a
        for lo, v in edges:
            if a >= lo:
                b = v
        return b + (16 if r > 0 else 0)
    rel = np.arange(-300, 301)
    got = t5_ref.bucket(rel)
    ck.check(all(int(g) == want(int(r)) for r, g in zip(rel, got)),
             "reference buckets match T5's published 32/128 table over -300..300")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reelctl", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    ck = Checks()
    bucket_checks(ck)
    rng = np.random.default_rng(7)
    for cfg in ("t5-tiny", "t5-small"):
        for dt in ("f32", "bf16"):
            wpath = os.path.join(a.workdir, "%s-%s.safetensors" % (cfg, dt))
            r = run([a.reelctl, "weights", "init-t5", "--config", cfg, "--seed", "11",
                     "--dtype", dt, "--out", wpath])
            ck.check(r.returncode == 0, "weights init-t5 %s %s (%s)" % (cfg, dt, r.stderr.strip()))
            if r.returncode:
                continue
            w, _ = safetensors_np.load(wpath)
            vocab = w["token_embedding.weight"].shape[0]
            for n, pad in ((1, 0), (1, 8), (3, 0), (17, 0), (17, 40), (150, 0), (200, 256)):
                ids = [int(i) for i in rng.integers(0, vocab, size=n)]
                ids[-1] = vocab - 1  # the last row of the embedding
                out = os.path.join(a.workdir, "ctx.safetensors")
                cmd = [a.reelctl, "encode", "--t5", wpath, "--ids", ",".join(map(str, ids)), "-o", out]
                if pad:
                    cmd += ["--pad-to", str(pad)]
                r = run(cmd)
                what = "%s %s n=%d pad=%d" % (cfg, dt, n, pad)
                if r.returncode:
                    ck.check(False, "%s: reelctl failed: %s" % (what, r.stderr.strip()))
                    continue
                got = safetensors_np.load(out)[0]["context"]
                ref = t5_ref.encode(w, ids, pad)
                err = float(np.abs(got - ref).max() / np.abs(ref).max())
                ck.check(got.shape == ref.shape and err <= TOL,
                         "%s: shape %s, max rel err %.2e (tol %.0e)" % (what, got.shape, err, TOL))
            r = run([a.reelctl, "encode", "--t5", wpath, "--ids", "1,%d" % vocab, "-o",
                     os.path.join(a.workdir, "bad.safetensors")])
            ck.check(r.returncode == 2 and ("id %d" % vocab) in r.stderr,
                     "%s %s: id %d (= vocab) refused with exit 2 (%s)" % (cfg, dt, vocab, r.stderr.strip()))
    print("t5: %d passed, %d failed" % (ck.passed, ck.failed))
    return 1 if ck.failed else 0


if __name__ == "__main__":
    sys.exit(main())
