#!/usr/bin/python3
"""Cross-check `reelctl plan` (ctl/cmd_plan.c): its step total of FLOPs
against the matrix products of the DiT written here from TINYDIT.md's block
(2·m·n·k per GEMM; 4·nq·nk·dim for an attention's two products), for
built-in configs at several sizes, with and without CFG; the shape of the
last line; the decomposed path moving more bytes than the fused one at
Wan's size; bad arguments refused.

Usage: /usr/bin/python3 tests/crosscheck/test_plan.py --reelctl build/reelctl
The last line is `plan: P passed, F failed`."""

import argparse
import re
import subprocess
import sys

CONFIGS = {  # dim, heads, layers, ffn, in_channels, text_dim, freq_dim (TINYDIT.md, Wan2.1's configs)
    "tiny": (64, 4, 2, 128, 4, 32, 256),
    "small": (384, 6, 12, 1024, 16, 256, 256),
    "wan2.1-1.3b": (1536, 12, 30, 8960, 16, 4096, 256),
    "wan2.1-14b": (5120, 40, 40, 13824, 16, 4096, 256),
}
TOTAL = re.compile(r"^total: ([0-9.]+e[+-][0-9]+) FLOP, ([0-9.]+e[+-][0-9]+) bytes, ([0-9.]+(?:e[+-][0-9]+)?) s$")


def flops(cfg, f, h, w, text, guided):
    dim, heads, layers, ffn, c, t, fq = CONFIGS[cfg]
    s = f * (h // 2) * (w // 2)
    gemm = lambda m, n, k: 2 * m * n * k  # noqa: E731
    block = (4 * gemm(s, dim, dim) + 4 * s * s * dim               # self: q k v o, QK^T and PV
             + 2 * gemm(s, dim, dim) + 2 * gemm(text, dim, dim)    # cross: q, o; k, v over the text
             + 4 * s * text * dim                                  # cross attention
             + gemm(s, ffn, dim) + gemm(s, dim, ffn))              # FFN
    outer = (gemm(s, dim, 4 * c) + gemm(s, 4 * c, dim)             # patch embedding, head
             + gemm(text, dim, t) + gemm(text, dim, dim)           # text embedding
             + gemm(1, dim, fq) + gemm(1, dim, dim) + gemm(1, 6 * dim, dim))  # time embedding, projection
    return (layers * block + outer) * (2 if guided else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reelctl", required=True)
    a = ap.parse_args()
    passed = failed = 0

    def check(ok, what, detail=""):
        nonlocal passed, failed
        passed += bool(ok)
        failed += not ok
        print("%s plan %s%s" % ("ok  " if ok else "FAIL", what, "" if ok else "  " + detail))

    def plan(*args):
        return subprocess.run([a.reelctl, "plan", *map(str, args)], capture_output=True, text=True, timeout=60)

    cases = [("tiny", 2, 8, 8, 5, False), ("tiny", 1, 16, 32, 7, True), ("small", 4, 16, 16, 16, True),
             ("wan2.1-1.3b", 21, 60, 104, 512, True), ("wan2.1-1.3b", 1, 60, 104, 77, False),
             ("wan2.1-14b", 21, 90, 160, 512, True)]
    for cfg, f, h, w, text, guided in cases:
        args = ["--config", cfg, "--size", f"{f}x{h}x{w}", "--text", text] + (["--cfg"] if guided else [])
        r = plan(*args)
        m = TOTAL.match(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
        want = flops(cfg, f, h, w, text, guided)
        got = float(m.group(1)) if m else None
        ok = got is not None and abs(got - want) <= 1e-4 * want
        check(ok, "%s %dx%dx%d text %d%s: %.4e FLOP (formula %.4e)" % (cfg, f, h, w, text, " CFG" if guided else "",
                                                                       got or 0, want),
              "rc %d %s%s" % (r.returncode, r.stderr.strip(), r.stdout[-300:]))
    wan = ["--config", "wan2.1-1.3b", "--size", "21x60x104", "--text", "512", "--cfg"]
    fused, dec = plan(*wan, "--attention", "fused"), plan(*wan, "--attention", "decomposed")
    mf, md = TOTAL.match(fused.stdout.strip().splitlines()[-1]), TOTAL.match(dec.stdout.strip().splitlines()[-1])
    check(mf and md and float(md.group(2)) > 10 * float(mf.group(2)) and float(md.group(3)) > float(mf.group(3)),
          "at Wan's size the decomposition moves over 10x the fused path's bytes and takes longer",
          fused.stdout[-200:] + dec.stdout[-200:])
    check(mf and float(mf.group(3)) <= 1.0, "the fused wan2.1-1.3b CFG step at 480x832x81 on an H200: <= 1.0 s "
          "(issue 28's goal)", fused.stdout[-300:])
    for name, args, needle in (("an unknown GPU", ["--config", "tiny", "--size", "1x8x8", "--gpu", "v100"], "h200"),
                               ("an odd height", ["--config", "tiny", "--size", "1x7x8"], "even"),
                               ("no size", ["--config", "tiny"], "usage"),
                               ("an unknown config", ["--config", "nope", "--size", "1x8x8"], "nope")):
        r = plan(*args)
        check(r.returncode == 2 and needle in r.stderr, "refused: %s (exit 2)" % name,
              "rc %d: %s" % (r.returncode, r.stderr.strip()))
    print("plan: %d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
