#!/usr/bin/python3
"""Cross-check LoRA adapters (model/lora.h) against numpy: a PEFT adapter
folder written here (adapter_config.json + adapter_model.safetensors, keys
in Wan's or diffusers' names, F32/BF16/F16, plain or rsLoRA scale) is
applied by `reelctl run --lora DIR`; numpy merges the same adapter into a
full weights file, W + s * B @ A with s = lora_alpha / r (lora_alpha /
sqrt(r) with use_rslora) as PEFT's LoraLayer computes it, and
`reelctl run` on that file must give the same latent to float rounding.
Full differences (ComfyUI's and lightx2v's X.diff / X.diff_b, PEFT's
lora_bias) are merged by numpy as weight + diff (+ s * diff for a
lora_B.bias) and checked the same way. DoRA (PEFT's use_dora: a
lora_magnitude_vector m per target) is merged by numpy from the DoRA
paper's and PEFT's Linear.merge formula, W' = (m / ||V||_row) * V with
V = W + s * B @ A, the norm over each output row, in float64. Refusals (a
DoRA magnitude without use_dora or of the wrong length, bias training,
modules_to_save, rank above 256, unknown targets, shape mismatches, A
without B, a rank not r, NaN) must exit 2 naming the cause. `reelctl weights inspect` must describe the adapter.

Usage:
  /usr/bin/python3 tests/crosscheck/test_lora.py --reelctl build/reelctl --workdir DIR
Prints one line per check; the last is `lora: P passed, F failed`.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

TIMEOUT_S = 120
WAN_MODULES = ["self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
               "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2"]
DIFFUSERS = {"self_attn.q": "attn1.to_q", "self_attn.k": "attn1.to_k", "self_attn.v": "attn1.to_v",
             "self_attn.o": "attn1.to_out.0", "cross_attn.q": "attn2.to_q", "cross_attn.k": "attn2.to_k",
             "cross_attn.v": "attn2.to_v", "cross_attn.o": "attn2.to_out.0", "ffn.0": "ffn.net.0.proj",
             "ffn.2": "ffn.net.2"}


def encode(a, dtype):
    """(stored bytes, the values as read back) of a float array in dtype."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes(), a.copy()
    if dtype == "F16":
        h = a.astype("<f2")
        return h.tobytes(), h.astype(np.float32)
    u = a.view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")  # round to nearest even
    return r.tobytes(), (r.astype(np.uint32) << 16).view(np.float32)


def write_adapter(d, base, layers, modules, r, alpha, rslora=False, layout="wan", dtype="F32", seed=0,
                  config_extra=None, extra_tensors=None, drop=None, bad_rank=False, dora=False, dora_extra=0):
    """A PEFT adapter folder; returns {weight name: (A, B) as read back},
    with dora {weight name: (A, B, m)}: m, PEFT's lora_magnitude_vector
    (saved as <module>.lora_magnitude_vector, [out] + dora_extra values),
    the base's row norms times 0.6 .. 1.4, as training moves them."""
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors, pairs = {}, {}
    for n in layers:
        for m in modules:
            w = base["blocks.%d.%s.weight" % (n, m)]
            out_f, in_f = w.shape
            ra = r + 1 if bad_rank else r
            a = rng.standard_normal((ra, in_f)).astype(np.float32) * 0.2
            b = rng.standard_normal((out_f, r)).astype(np.float32) * 0.2
            if layout == "wan":
                key = "base_model.model.blocks.%d.%s" % (n, m)
            else:
                key = "transformer.blocks.%d.%s" % (n, DIFFUSERS[m])
            ra_bytes, a_back = encode(a, dtype)
            rb_bytes, b_back = encode(b, dtype)
            if drop != key + ".lora_A.weight":
                tensors[key + ".lora_A.weight"] = (dtype, a.shape, ra_bytes)
            if drop != key + ".lora_B.weight":
                tensors[key + ".lora_B.weight"] = (dtype, b.shape, rb_bytes)
            pairs["blocks.%d.%s.weight" % (n, m)] = (a_back, b_back)
            if dora:
                mag = (np.linalg.norm(w.astype(np.float64), axis=1) *
                       rng.uniform(0.6, 1.4, out_f)).astype(np.float32)
                if dora_extra:
                    mag = np.concatenate([mag, np.ones(dora_extra, np.float32)])
                rm_bytes, m_back = encode(mag, dtype)
                tensors[key + ".lora_magnitude_vector"] = (dtype, mag.shape, rm_bytes)
                pairs["blocks.%d.%s.weight" % (n, m)] = (a_back, b_back, m_back)
    for k, v in (extra_tensors or {}).items():
        raw, _ = encode(v, "F32")
        tensors[k] = ("F32", v.shape, raw)
    safetensors_np.save_raw(os.path.join(d, "adapter_model.safetensors"), tensors)
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "use_rslora": rslora, "use_dora": bool(dora),
           "bias": "none", "modules_to_save": None, "target_modules": sorted(set(m.split(".")[-1] for m in modules)),
           "rank_pattern": {}, "alpha_pattern": {}, "fan_in_fan_out": False}
    cfg.update(config_extra or {})
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    return pairs


def merged(base, pairs, r, alpha, rslora, dora=True):
    """W + s * B @ A per target; with a magnitude m (DoRA, unless dora is
    False) each output row i of V = W + s * B @ A scaled to m_i:
    m_i / ||V_i|| * V_i (PEFT's Linear.merge with use_dora). In float64."""
    s = alpha / np.sqrt(r) if rslora else alpha / r
    out = dict(base)
    for name, ab in pairs.items():
        a, b = ab[0], ab[1]
        v = base[name].astype(np.float64) + s * (b.astype(np.float64) @ a.astype(np.float64))
        if len(ab) == 3 and dora:
            v = (ab[2].astype(np.float64) / np.linalg.norm(v, axis=1))[:, None] * v
        out[name] = v.astype(np.float32)
    return out


def run(reelctl, args):
    return subprocess.run([reelctl] + args, capture_output=True, text=True, timeout=TIMEOUT_S)


def crosscheck_lora(reelctl, workdir):
    os.makedirs(workdir, exist_ok=True)
    passed = failed = 0

    def check(ok, what, detail=""):
        nonlocal passed, failed
        passed += bool(ok)
        failed += not ok
        print("%s lora %s%s" % ("ok  " if ok else "FAIL", what, "" if ok else "  " + detail))

    w = os.path.join(workdir, "base.safetensors")
    r0 = run(reelctl, ["weights", "init", "--config", "tiny", "--seed", "11", "--out", w])
    if r0.returncode != 0:
        check(False, "weights init", r0.stderr)
        return passed, failed
    base, meta = safetensors_np.load(w)
    layers = int(meta.get("layers", 2))
    lat, ctx = os.path.join(workdir, "lat.safetensors"), os.path.join(workdir, "ctx.safetensors")
    rng = np.random.default_rng(3)
    c_in, dim_t = base["patch_embedding.weight"].shape[1], base["text_embedding.0.weight"].shape[1]
    safetensors_np.save(lat, {"latent": rng.standard_normal((c_in, 1, 8, 8)).astype(np.float32)})
    safetensors_np.save(ctx, {"context": rng.standard_normal((5, dim_t)).astype(np.float32)})
    io = ["--latent", lat, "--context", ctx, "--steps", "3", "--shift", "3"]
    ref0 = os.path.join(workdir, "ref0.safetensors")
    r0 = run(reelctl, ["run", "--weights", w] + io + ["--out", ref0])
    base_out = safetensors_np.load(ref0)[0]["latent"] if r0.returncode == 0 else None

    def against_merged(name, lora, full, o1, o2):
        """run --lora LORA against run on numpy's merged file FULL: within
        1e-4 relative, and not the base's result. The --lora latent, or None
        when a run failed."""
        r1 = run(reelctl, ["run", "--weights", w, "--lora", lora] + io + ["--out", o1])
        r2 = run(reelctl, ["run", "--weights", full] + io + ["--out", o2])
        if r1.returncode or r2.returncode:
            check(False, name, "rc %d %s / rc %d %s" % (r1.returncode, r1.stderr.strip(), r2.returncode,
                                                       r2.stderr.strip()))
            return None
        a, b = safetensors_np.load(o1)[0]["latent"], safetensors_np.load(o2)[0]["latent"]
        err = float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))
        moved = base_out is not None and float(np.max(np.abs(a - base_out))) > 1e-3
        check(err < 1e-4 and moved, "%s: run --lora = numpy's merged file (rel. err %.2e), and not the base"
              % (name, err), "err %.3e moved %s" % (err, moved))
        return a

    cases = [
        ("wan names, F32, q k v o of both attentions", dict(layout="wan", dtype="F32", r=4, alpha=8,
                                                            modules=WAN_MODULES[:8])),
        ("diffusers names, BF16, every Linear", dict(layout="diffusers", dtype="BF16", r=2, alpha=3,
                                                     modules=WAN_MODULES)),
        ("wan names, F16, rsLoRA, the FFN only", dict(layout="wan", dtype="F16", r=8, alpha=16, rslora=True,
                                                      modules=["ffn.0", "ffn.2"])),
        ("one layer's self-attention q, rank 1", dict(layout="wan", dtype="F32", r=1, alpha=1,
                                                      modules=["self_attn.q"], only_layer=0)),
    ]
    for i, (name, c) in enumerate(cases):
        d = os.path.join(workdir, "adapter%d" % i)
        lay = [c["only_layer"]] if "only_layer" in c else list(range(layers))
        pairs = write_adapter(d, base, lay, c["modules"], c["r"], c["alpha"], c.get("rslora", False), c["layout"],
                              c["dtype"], seed=i)
        full = os.path.join(workdir, "merged%d.safetensors" % i)
        safetensors_np.save(full, merged(base, pairs, c["r"], c["alpha"], c.get("rslora", False)), meta)
        o1 = os.path.join(workdir, "lora%d.safetensors" % i)
        a = against_merged(name, d, full, o1, os.path.join(workdir, "full%d.safetensors" % i))
        if a is None:
            continue
        if i == 0:
            r3 = run(reelctl, ["weights", "inspect", d, "--json"])
            try:
                j = json.loads(r3.stdout)
                ok = (j["kind"] == "lora" and j["rank"] == 4 and j["alpha"] == 8 and abs(j["scale"] - 2) < 1e-6 and
                      j["layout"] == "wan" and len(j["targets"]) == 8 * layers and not j["rslora"])
            except (ValueError, KeyError):
                ok = False
            check(ok, "weights inspect --json describes the adapter (rank 4, alpha 8, scale 2, %d targets)"
                  % (8 * layers), r3.stdout + r3.stderr)
            r4 = run(reelctl, ["run", "--weights", w, "--lora", os.path.join(d, "adapter_model.safetensors")] + io
                     + ["--out", o1 + ".2"])
            same = r4.returncode == 0 and np.array_equal(safetensors_np.load(o1 + ".2")[0]["latent"], a)
            check(same, "the adapter's .safetensors path (config beside it) gives the folder's result bitwise",
                  r4.stderr)

    # Without adapter_config.json, as ComfyUI and diffusers load such files
    # (its lora_conversion_utils): a ComfyUI Wan LoRA (diffusion_model. +
    # lora_down / lora_up, each module's alpha: s = alpha / rank, none:
    # s = 1), diffusers' save_lora_weights folder (s = 1), and an
    # ai-toolkit file (diffusion_model. + lora_A / lora_B) without alphas
    # whose ranks differ: s = 1 for each, not the first rank over its own.
    rng = np.random.default_rng(21)
    for name, keyfmt, down, up, alphas, ranks, fname in [
        ("ComfyUI's Wan LoRA (lora_down/up, per-module alpha)", "diffusion_model.blocks.%d.%s", "lora_down",
         "lora_up", {"self_attn.q": 16.0, "cross_attn.v": 2.0, "ffn.0": None}, {}, "wan_lora.safetensors"),
        ("diffusers' pytorch_lora_weights.safetensors (no config: s = 1)", "transformer.blocks.%d.%s", "lora_A",
         "lora_B", {"self_attn.o": None, "ffn.2": None}, {}, "pytorch_lora_weights.safetensors"),
        ("an alpha-less lora_A/B file of ranks 2, 4, 8 (s = 1 each)", "diffusion_model.blocks.%d.%s", "lora_A",
         "lora_B", {"self_attn.q": None, "self_attn.k": None, "ffn.2": None},
         {"self_attn.q": 2, "self_attn.k": 4, "ffn.2": 8}, "mixed_ranks.safetensors"),
    ]:
        d = os.path.join(workdir, "noconfig_" + os.path.splitext(fname)[0])
        os.makedirs(d, exist_ok=True)
        tensors, out = {}, dict(base)
        for n in range(layers):
            for m, alpha in alphas.items():
                wname = "blocks.%d.%s.weight" % (n, m)
                o_f, i_f = base[wname].shape
                r = ranks.get(m, 4)
                a = rng.standard_normal((r, i_f)).astype(np.float32) * 0.2
                b = rng.standard_normal((o_f, r)).astype(np.float32) * 0.2
                mod = m if keyfmt.startswith("diffusion_model.") else DIFFUSERS[m]
                key = keyfmt % (n, mod)
                tensors[key + "." + down + ".weight"] = ("F32", a.shape, encode(a, "F32")[0])
                tensors[key + "." + up + ".weight"] = ("F32", b.shape, encode(b, "F32")[0])
                if alpha is not None:
                    tensors[key + ".alpha"] = ("F32", (), encode(np.array(alpha, np.float32), "F32")[0])
                s_m = (alpha if alpha is not None else r) / r
                out[wname] = (base[wname].astype(np.float64) + s_m * (b.astype(np.float64) @ a.astype(np.float64))
                              ).astype(np.float32)
        lf = os.path.join(d, fname)
        safetensors_np.save_raw(lf, tensors)
        full = os.path.join(d, "merged.safetensors")
        safetensors_np.save(full, out, meta)
        against_merged(name, lf if keyfmt.startswith("diffusion_model.") else d, full, os.path.join(d, "lora.safetensors"),
                       os.path.join(d, "full.safetensors"))

    # Full differences, as ComfyUI applies them (weight += strength * diff,
    # strength 1) and as lightx2v's and CausVid's Wan LoRAs carry them:
    # X.diff adds to X.weight, X.diff_b to X.bias, for norms, biases, the
    # patch embedding and the head; the Linears outside the blocks take
    # lora_down / lora_up with an alpha. PEFT's lora_bias (lora_B.bias)
    # adds s times itself to the Linear's bias, as PEFT's merge does.
    d = os.path.join(workdir, "diffs")
    os.makedirs(d, exist_ok=True)
    tensors, out = {}, dict(base)

    def diff(wname, key, scale=1.0):
        dv = rng.standard_normal(base[wname].shape).astype(np.float32) * 0.05
        tensors[key] = ("F32", dv.shape, encode(dv, "F32")[0])
        out[wname] = (out[wname].astype(np.float64) + scale * dv.astype(np.float64)).astype(np.float32)

    for n in range(layers):
        diff("blocks.%d.norm3.weight" % n, "diffusion_model.blocks.%d.norm3.diff" % n)
        diff("blocks.%d.norm3.bias" % n, "diffusion_model.blocks.%d.norm3.diff_b" % n)
        diff("blocks.%d.self_attn.norm_q.weight" % n, "diffusion_model.blocks.%d.self_attn.norm_q.diff" % n)
        diff("blocks.%d.cross_attn.v.bias" % n, "diffusion_model.blocks.%d.cross_attn.v.diff_b" % n)
        diff("blocks.%d.ffn.0.bias" % n, "diffusion_model.blocks.%d.ffn.0.diff_b" % n)
    diff("blocks.0.modulation", "diffusion_model.blocks.0.diff_m")  # lightx2v's
    diff("head.modulation", "diffusion_model.head.modulation.diff")  # ComfyUI maps a parameter to itself
    diff("patch_embedding.weight", "diffusion_model.patch_embedding.diff")
    diff("time_projection.1.bias", "diffusion_model.time_projection.1.diff_b")
    diff("head.head.bias", "diffusion_model.head.head.diff_b")
    for wname, r, alpha in [("head.head.weight", 2, 4.0), ("time_embedding.0.weight", 4, None)]:
        o_f, i_f = base[wname].shape
        a = rng.standard_normal((r, i_f)).astype(np.float32) * 0.2
        b = rng.standard_normal((o_f, r)).astype(np.float32) * 0.2
        key = "diffusion_model." + wname[:-len(".weight")]
        tensors[key + ".lora_down.weight"] = ("F32", a.shape, encode(a, "F32")[0])
        tensors[key + ".lora_up.weight"] = ("F32", b.shape, encode(b, "F32")[0])
        if alpha is not None:
            tensors[key + ".alpha"] = ("F32", (), encode(np.array(alpha, np.float32), "F32")[0])
        s_m = (alpha if alpha is not None else r) / r
        out[wname] = (base[wname].astype(np.float64) + s_m * (b.astype(np.float64) @ a.astype(np.float64))
                      ).astype(np.float32)
    lf = os.path.join(d, "causvid_like.safetensors")
    safetensors_np.save_raw(lf, tensors)
    full = os.path.join(d, "merged.safetensors")
    safetensors_np.save(full, out, meta)
    against_merged("differences (.diff, .diff_b) and LoRAs outside the blocks, ComfyUI's names", lf, full,
                   os.path.join(d, "lora.safetensors"), os.path.join(d, "full.safetensors"))
    d = os.path.join(workdir, "lora_bias")
    pairs = write_adapter(d, base, [0], ["ffn.0", "self_attn.o"], 4, 8, config_extra={"lora_bias": True})
    full_w = merged(base, pairs, 4, 8, False)
    extra = {}
    for m in ["ffn.0", "self_attn.o"]:
        bv = rng.standard_normal(base["blocks.0.%s.bias" % m].shape).astype(np.float32) * 0.1
        extra["base_model.model.blocks.0.%s.lora_B.bias" % m] = bv
        full_w["blocks.0.%s.bias" % m] = (base["blocks.0.%s.bias" % m].astype(np.float64) +
                                          (8 / 4) * bv.astype(np.float64)).astype(np.float32)
    write_adapter(d, base, [0], ["ffn.0", "self_attn.o"], 4, 8, config_extra={"lora_bias": True},
                  extra_tensors=extra)
    full = os.path.join(d, "merged.safetensors")
    safetensors_np.save(full, full_w, meta)
    against_merged("PEFT's lora_bias: lora_B.bias adds s times itself", d, full, os.path.join(d, "lora.safetensors"),
                   os.path.join(d, "full.safetensors"))

    # DoRA, as PEFT saves it (use_dora: true, <module>.lora_magnitude_vector)
    # and merges it: numpy's W' = m / ||V||_row * V against run --lora, and
    # not what the same A, B give as a plain LoRA
    for i, (name, c) in enumerate([
        ("DoRA, wan names, F32, attention and FFN", dict(layout="wan", dtype="F32", r=4, alpha=8,
                                                         modules=WAN_MODULES[:4] + ["ffn.0", "ffn.2"])),
        ("DoRA, diffusers names, BF16, rsLoRA, every Linear", dict(layout="diffusers", dtype="BF16", r=2, alpha=3,
                                                                   rslora=True, modules=WAN_MODULES)),
    ]):
        d = os.path.join(workdir, "dora%d" % i)
        pairs = write_adapter(d, base, list(range(layers)), c["modules"], c["r"], c["alpha"], c.get("rslora", False),
                              c["layout"], c["dtype"], seed=40 + i, dora=True)
        full = os.path.join(d, "merged.safetensors")
        safetensors_np.save(full, merged(base, pairs, c["r"], c["alpha"], c.get("rslora", False)), meta)
        a = against_merged(name, d, full, os.path.join(d, "lora.safetensors"), os.path.join(d, "full.safetensors"))
        plain = os.path.join(d, "plain.safetensors")
        safetensors_np.save(plain, merged(base, pairs, c["r"], c["alpha"], c.get("rslora", False), dora=False), meta)
        r2 = run(reelctl, ["run", "--weights", plain] + io + ["--out", os.path.join(d, "plain_out.safetensors")])
        if a is not None and r2.returncode == 0:
            p = safetensors_np.load(os.path.join(d, "plain_out.safetensors"))[0]["latent"]
            gap = float(np.max(np.abs(a - p)) / (np.max(np.abs(p)) + 1e-30))
            check(gap > 1e-2, "%s: the magnitudes matter (rel. %.2e from the plain LoRA's run)" % (name, gap),
                  "gap %.3e" % gap)
        if i == 0:
            r3 = run(reelctl, ["weights", "inspect", d, "--json"])
            check(r3.returncode == 0, "weights inspect reads a DoRA adapter", r3.stderr)

    refusals = [
        ("DoRA (use_dora) without magnitudes", dict(config_extra={"use_dora": True}), "no lora_magnitude_vector"),
        ("DoRA magnitude keys without use_dora",
         dict(extra_tensors={"base_model.model.blocks.0.self_attn.q.lora_magnitude_vector": np.ones(4, np.float32)}),
         "does not say \"use_dora\": true"),
        ("a DoRA magnitude of the wrong length", dict(dora=True, dora_extra=1), "(one magnitude per output row)"),
        ("a DoRA magnitude for a module without lora_A / lora_B",
         dict(dora=True, extra_tensors={"base_model.model.blocks.0.ffn.0.lora_magnitude_vector":
                                        np.ones(base["blocks.0.ffn.0.weight"].shape[0], np.float32)}),
         "without lora_A and lora_B"),
        ("kohya's / LyCORIS' dora_scale",
         dict(extra_tensors={"base_model.model.blocks.0.self_attn.q.dora_scale": np.ones(4, np.float32)}),
         "kohya's / LyCORIS' DoRA"),
        ("bias training", dict(config_extra={"bias": "lora_only"}), "bias training"),
        ("modules_to_save", dict(config_extra={"modules_to_save": ["head"]}), "modules_to_save"),
        ("rank above 256", dict(config_extra={"r": 300}), "above 256"),
        ("peft_type other than LORA", dict(config_extra={"peft_type": "LOHA"}), "peft_type"),
        ("a rank rank_pattern does not give", dict(config_extra={"rank_pattern": {"q": 8}}), "rank_pattern 'q'"),
        ("unknown target", dict(extra_tensors={"base_model.model.blocks.0.norm3.lora_A.weight":
                                               np.ones((4, 8), np.float32)}), "unknown target"),
        ("a target that is no Linear (the patch embedding, a convolution)",
         dict(extra_tensors={"base_model.model.patch_embedding.lora_A.weight": np.ones((4, 8), np.float32)}),
         "unknown target"),
        ("a base bias's own values (bias training)",
         dict(extra_tensors={"base_model.model.blocks.0.self_attn.q.bias": np.ones(8, np.float32)}), "bias training"),
        ("A without B", dict(drop="base_model.model.blocks.0.self_attn.k.lora_B.weight"), "without lora_B"),
        ("a rank that is not r", dict(bad_rank=True), "is not the config's r"),
        ("a layer the model lacks", dict(layers_override=[0, layers + 3]), "does not have"),
    ]
    for i, (name, c, needle) in enumerate(refusals):
        d = os.path.join(workdir, "bad%d" % i)
        lay = c.pop("layers_override", [0])
        if lay[-1] >= layers:  # a block the model does not have: build its matrices from block 0's shapes
            base2 = dict(base)
            for m in WAN_MODULES[:4]:
                base2["blocks.%d.%s.weight" % (lay[-1], m)] = base["blocks.0.%s.weight" % m]
            write_adapter(d, base2, lay, WAN_MODULES[:4], 4, 8, **c)
        else:
            write_adapter(d, base, lay, WAN_MODULES[:4], 4, 8, **c)
        r1 = run(reelctl, ["run", "--weights", w, "--lora", d] + io + ["--out", os.path.join(d, "o.safetensors")])
        check(r1.returncode == 2 and needle in r1.stderr and not os.path.exists(os.path.join(d, "o.safetensors")),
              "refused: %s (exit 2, '%s')" % (name, needle), "rc %d: %s" % (r1.returncode, r1.stderr.strip()))
    # a shape mismatch: an adapter made for a wider model
    d = os.path.join(workdir, "wide")
    wide = {"blocks.0.self_attn.q.weight": np.zeros((base["blocks.0.self_attn.q.weight"].shape[0] * 2,
                                                     base["blocks.0.self_attn.q.weight"].shape[1]), np.float32)}
    write_adapter(d, wide, [0], ["self_attn.q"], 4, 8)
    r1 = run(reelctl, ["run", "--weights", w, "--lora", d] + io + ["--out", os.path.join(d, "o.safetensors")])
    check(r1.returncode == 2 and "shape mismatch" in r1.stderr, "refused: a shape mismatch names the weight",
          "rc %d: %s" % (r1.returncode, r1.stderr.strip()))
    d = os.path.join(workdir, "nan")
    write_adapter(d, base, [0], ["self_attn.q"], 4, 8,
                  extra_tensors={"base_model.model.blocks.0.self_attn.k.lora_A.weight":
                                 np.full((4, base["blocks.0.self_attn.k.weight"].shape[1]), np.nan, np.float32),
                                 "base_model.model.blocks.0.self_attn.k.lora_B.weight":
                                 np.ones((base["blocks.0.self_attn.k.weight"].shape[0], 4), np.float32)})
    r1 = run(reelctl, ["run", "--weights", w, "--lora", d] + io + ["--out", os.path.join(d, "o.safetensors")])
    check(r1.returncode == 2 and "NaN" in r1.stderr, "refused: NaN values", r1.stderr.strip())
    r1 = run(reelctl, ["run", "--weights", w, "--lora", os.path.join(workdir, "missing")] + io +
             ["--out", os.path.join(workdir, "o.safetensors")])
    check(r1.returncode == 2 and "no such adapter" in r1.stderr, "refused: a missing adapter", r1.stderr.strip())
    return passed, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reelctl", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    p, f = crosscheck_lora(a.reelctl, a.workdir)
    print("lora: %d passed, %d failed" % (p, f))
    return 0 if f == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
