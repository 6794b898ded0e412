#!/usr/bin/env python3
"""make_seeds.py -- writes the seed corpora of the harnesses that read a
folder a user brings (tests/fuzz/fuzz_files.h's archives):

  corpus/lora/       PEFT adapters (Wan's, diffusers' and kohya's names,
                     rank_pattern / alpha_pattern, rsLoRA, DoRA, lora_bias,
                     .diff / .diff_b / .diff_m, diffusers' metadata config)
  corpus/wan_ckpt/   Wan2.1 checkpoints: wan-original, wan-sharded (index),
                     diffusers, a diffusers pipeline, a Reel file
  corpus/release/    a release folder's parts: Wan's T5 and VAE files,
                     diffusers' text_encoder/ (sharded, UMT5 names) and
                     vae/ (AutoencoderKLWan names), a scheduler config

Each a small valid example of its kind, on models small enough to load in
a fuzz run (the DiT: dim 8 or 4; the VAE: dim 1; the T5: dim 4).
Deterministic; Python's standard library only.

Usage: make_seeds.py [CORPUS_DIR]   (default: tests/fuzz/corpus)"""

import json
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def values(n, seed):
    """n small exact values, different per seed."""
    return [((7 * i + 3 * seed) % 17 - 8) / 16.0 for i in range(n)]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def encode(vals, dtype):
    if dtype == "F32":
        return struct.pack("<%df" % len(vals), *vals)
    if dtype == "F16":
        return struct.pack("<%de" % len(vals), *vals)
    # BF16: the top half of the F32 (the values are exact in BF16)
    return b"".join(struct.pack("<f", v)[2:] for v in vals)


def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape, values)] -> the file's bytes."""
    hdr, data = {}, b""
    if meta:
        hdr["__metadata__"] = meta
    for name, dtype, shape, vals in tensors:
        b = encode(vals, dtype)
        hdr[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def archive(files):
    """[(name, bytes)] -> a fuzz_files.h archive."""
    out = b""
    for i, (name, body) in enumerate(files):
        out += (b"" if i == 0 else b"\n") + b"==> " + name.encode() + b"\n" + body
    return out


def put(kind, name, files):
    d = os.path.join(OUT, kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(archive(files))


def js(o):
    return json.dumps(o).encode()


# ---- the DiT ---------------------------------------------------------------------------

def dit_weights(dim, layers, ffn, cin, text, freq):
    """Reel's (= Wan's) names and shapes, in TINYDIT.md's order."""
    w = [("patch_embedding.weight", [dim, cin, 1, 2, 2]), ("patch_embedding.bias", [dim])]
    for m, i in (("text_embedding.0", text), ("text_embedding.2", dim), ("time_embedding.0", freq),
                 ("time_embedding.2", dim)):
        w += [(m + ".weight", [dim, i]), (m + ".bias", [dim])]
    w += [("time_projection.1.weight", [6 * dim, dim]), ("time_projection.1.bias", [6 * dim])]
    for n in range(layers):
        b = "blocks.%d." % n
        w.append((b + "modulation", [1, 6, dim]))
        for a in ("self_attn", "cross_attn"):
            if a == "cross_attn":
                w += [(b + "norm3.weight", [dim]), (b + "norm3.bias", [dim])]
            for p in "qkvo":
                w += [(b + a + "." + p + ".weight", [dim, dim]), (b + a + "." + p + ".bias", [dim])]
            w += [(b + a + ".norm_q.weight", [dim]), (b + a + ".norm_k.weight", [dim])]
        w += [(b + "ffn.0.weight", [ffn, dim]), (b + "ffn.0.bias", [ffn]), (b + "ffn.2.weight", [dim, ffn]),
              (b + "ffn.2.bias", [dim])]
    w += [("head.modulation", [1, 2, dim]), ("head.head.weight", [4 * cin, dim]), ("head.head.bias", [4 * cin])]
    return w


RENAME = [("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
          ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
          ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
          ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
          ("time_projection.1", "condition_embedder.time_proj"), ("head.modulation", "scale_shift_table"),
          ("head.head", "proj_out"), ("modulation", "scale_shift_table"), ("ffn.0", "ffn.net.0.proj"),
          ("ffn.2", "ffn.net.2"), ("norm2", "norm__placeholder"), ("norm3", "norm2"), ("norm__placeholder", "norm3"),
          ("self_attn.q", "attn1.to_q"), ("self_attn.k", "attn1.to_k"), ("self_attn.v", "attn1.to_v"),
          ("self_attn.o", "attn1.to_out.0"), ("self_attn.norm_q", "attn1.norm_q"),
          ("self_attn.norm_k", "attn1.norm_k"), ("cross_attn.q", "attn2.to_q"), ("cross_attn.k", "attn2.to_k"),
          ("cross_attn.v", "attn2.to_v"), ("cross_attn.o", "attn2.to_out.0"), ("cross_attn.norm_q", "attn2.norm_q"),
          ("cross_attn.norm_k", "attn2.norm_k")]


def diffusers_name(k):
    for a, b in RENAME:
        k = k.replace(a, b)
    return k


def wan_seeds():
    D, H, L, F, C, T, Q = 4, 2, 1, 4, 2, 4, 4
    wts = dit_weights(D, L, F, C, T, Q)
    wan_cfg = {"_class_name": "WanModel", "_diffusers_version": "0.30.0", "dim": D, "eps": 1e-06, "ffn_dim": F,
               "freq_dim": Q, "in_dim": C, "model_type": "t2v", "num_heads": H, "num_layers": L, "out_dim": C,
               "text_len": 16, "text_dim": T, "patch_size": [1, 2, 2], "qk_norm": True, "cross_attn_norm": True,
               "window_size": [-1, -1]}
    dif_cfg = {"_class_name": "WanTransformer3DModel", "_diffusers_version": "0.33.0", "added_kv_proj_dim": None,
               "attention_head_dim": D // H, "cross_attn_norm": True, "eps": 1e-06, "ffn_dim": F, "freq_dim": Q,
               "image_dim": None, "in_channels": C, "num_attention_heads": H, "num_layers": L, "out_channels": C,
               "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": T}
    ts = lambda dt, ren=lambda k: k: [(ren(k), dt, s, values(numel(s), i)) for i, (k, s) in enumerate(wts)]
    put("wan_ckpt", "original", [("diffusion_pytorch_model.safetensors", safetensors(ts("F32"))),
                                 ("config.json", js(wan_cfg))])
    # sharded: two shards and the index naming each tensor's
    t = ts("BF16")
    shards = [t[: len(t) // 2], t[len(t) // 2:]]
    names = ["diffusion_pytorch_model-0000%d-of-00002.safetensors" % (i + 1) for i in range(2)]
    wm = {x[0]: names[i] for i in range(2) for x in shards[i]}
    idx = {"metadata": {"total_size": sum(len(encode(x[3], "BF16")) for x in t)}, "weight_map": wm}
    put("wan_ckpt", "sharded", [("diffusion_pytorch_model.safetensors.index.json", js(idx)),
                                ("config.json", js(wan_cfg)),
                                (names[0], safetensors(shards[0])), (names[1], safetensors(shards[1]))])
    put("wan_ckpt", "diffusers", [("diffusion_pytorch_model.safetensors", safetensors(ts("F16", diffusers_name))),
                                  ("config.json", js(dif_cfg))])
    put("wan_ckpt", "pipeline", [("model_index.json", js({"_class_name": "WanPipeline",
                                                          "transformer": ["diffusers", "WanTransformer3DModel"],
                                                          "transformer_2": [None, None]})),
                                 ("transformer/config.json", js(dif_cfg)),
                                 ("transformer/diffusion_pytorch_model.safetensors",
                                  safetensors(ts("BF16", diffusers_name)))])
    meta = {"config": "custom", "dim": str(D), "heads": str(H), "layers": str(L), "ffn_dim": str(F),
            "in_channels": str(C), "text_dim": str(T), "freq_dim": str(Q), "text_len": "16", "format": "pt"}
    put("wan_ckpt", "reel", [("model.safetensors", safetensors(ts("F32"), meta))])


# ---- LoRA adapters, on the DiT of dim 8, 2 layers, ffn 16 (fuzz_lora.c's) ------------------

LD, LF = 8, 16


def lora_mats(key_of, mods, r, dt="F32", seed=0, down_up=False):
    """A and B of each (block, module) under key_of(block, module)."""
    t = []
    for i, (n, m) in enumerate(mods):
        out = LF if m in ("ffn.0", "ffn.net.0.proj") else LD
        inn = LF if m in ("ffn.2", "ffn.net.2") else LD
        k = key_of(n, m)
        a, b = (".lora_down.weight", ".lora_up.weight") if down_up else (".lora_A.weight", ".lora_B.weight")
        t += [(k + a, dt, [r, inn], values(r * inn, seed + 2 * i)), (k + b, dt, [out, r], values(out * r, seed + 2 * i + 1))]
    return t


def lora_seeds():
    wan = lambda n, m: "base_model.model.blocks.%d.%s" % (n, m)
    cfg = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q", "k", "ffn.0"], "bias": "none",
           "use_rslora": False, "fan_in_fan_out": False, "modules_to_save": None}
    mods = [(0, "self_attn.q"), (1, "self_attn.k"), (0, "ffn.0"), (1, "ffn.2"), (0, "cross_attn.o")]
    put("lora", "peft_wan", [("adapter_model.safetensors", safetensors(lora_mats(wan, mods, 2))),
                             ("adapter_config.json", js(cfg))])
    # diffusers' names, BF16, rank_pattern / alpha_pattern and rsLoRA
    dif = lambda n, m: "transformer.blocks.%d.%s" % (n, m)
    pat = dict(cfg, r=2, use_rslora=True, rank_pattern={"attn1\\.to_q": 4, "blocks\\.1\\..*": 2},
               alpha_pattern={"to_[qk]": 8.5, "ffn\\.net\\.\\d\\.proj": 2})
    t = lora_mats(dif, [(0, "attn1.to_q")], 4, "BF16") + lora_mats(dif, [(1, "attn1.to_k"), (0, "ffn.net.0.proj")], 2,
                                                                       "BF16", 9)
    put("lora", "peft_patterns", [("adapter_config.json", js(pat)), ("adapter_model.safetensors", safetensors(t))])
    # kohya / ComfyUI: lora_down / lora_up with alphas, no config
    koh = lambda n, m: "lora_unet_blocks_%d_%s" % (n, m.replace(".", "_"))
    t = lora_mats(koh, [(0, "self_attn.q"), (1, "cross_attn.v")], 2, "F16", 3, down_up=True)
    t += [("lora_unet_blocks_0_self_attn_q.alpha", "F32", [], [2.0]), ("lora_unet_blocks_1_cross_attn_v.alpha", "F32",
                                                                      [], [1.0])]
    put("lora", "kohya", [("wan_lora.safetensors", safetensors(t))])
    # DoRA: a magnitude per output row
    dora = dict(cfg, use_dora=True)
    t = lora_mats(wan, [(0, "self_attn.q"), (1, "ffn.0")], 2, "F32", 5)
    t += [("base_model.model.blocks.0.self_attn.q.lora_magnitude_vector", "F32", [LD], values(LD, 1)),
          ("base_model.model.blocks.1.ffn.0.lora_magnitude_vector", "F32", [LF], values(LF, 2))]
    put("lora", "dora", [("adapter_model.safetensors", safetensors(t)), ("adapter_config.json", js(dora))])
    # full differences and PEFT's lora_bias, and the Linears outside the blocks
    bias = dict(cfg, lora_bias=True)
    top = lambda n, m: "diffusion_model.%s" % m
    t = lora_mats(top, [(0, "text_embedding.0"), (0, "head.head")], 2, "F32", 7)
    t[2:4] = [(t[2][0], "F32", [2, LD], values(2 * LD, 3)), (t[3][0], "F32", [16, 2], values(32, 4))]
    t += [("diffusion_model.text_embedding.0.lora_B.bias", "F32", [LD], values(LD, 5)),
          ("diffusion_model.blocks.0.norm3.diff", "F32", [LD], values(LD, 6)),
          ("diffusion_model.blocks.0.norm3.diff_b", "F32", [LD], values(LD, 7)),
          ("diffusion_model.blocks.1.modulation.diff", "F32", [1, 6, LD], values(6 * LD, 8)),
          ("diffusion_model.head.diff_m", "F32", [1, 2, LD], values(2 * LD, 9)),
          ("diffusion_model.patch_embedding.diff", "BF16", [LD, 4, 1, 2, 2], values(LD * 16, 10))]
    put("lora", "diffs", [("adapter_config.json", js(bias)), ("adapter_model.safetensors", safetensors(t))])
    # diffusers' save_lora_weights: no config file, its config in the metadata
    meta = {"lora_adapter_metadata": json.dumps({"transformer.r": 2, "transformer.lora_alpha": 2,
                                                 "transformer.use_dora": False, "transformer.peft_type": "LORA"})}
    t = lora_mats(dif, [(0, "attn2.to_v"), (1, "ffn.net.2")], 2, "F32", 11)
    put("lora", "diffusers_meta", [("pytorch_lora_weights.safetensors", safetensors(t, meta))])


# ---- a release's text encoder, VAE and scheduler -----------------------------------------

def t5_weights(vocab, dim, ffn, heads, layers, buckets):
    w = [("token_embedding.weight", [vocab, dim])]
    for n in range(layers):
        b = "blocks.%d." % n
        w += [(b + "norm1.weight", [dim])] + [(b + "attn.%s.weight" % p, [dim, dim]) for p in "qkvo"]
        w += [(b + "norm2.weight", [dim]), (b + "ffn.gate.0.weight", [ffn, dim]), (b + "ffn.fc1.weight", [ffn, dim]),
              (b + "ffn.fc2.weight", [dim, ffn]), (b + "pos_embedding.embedding.weight", [buckets, heads])]
    return w + [("norm.weight", [dim])]


UMT5 = {"attn.q.weight": "layer.0.SelfAttention.q.weight", "attn.k.weight": "layer.0.SelfAttention.k.weight",
        "attn.v.weight": "layer.0.SelfAttention.v.weight", "attn.o.weight": "layer.0.SelfAttention.o.weight",
        "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
        "norm1.weight": "layer.0.layer_norm.weight", "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
        "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight", "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
        "norm2.weight": "layer.1.layer_norm.weight"}


def umt5_name(k):
    if k == "token_embedding.weight":
        return "shared.weight"
    if k == "norm.weight":
        return "encoder.final_layer_norm.weight"
    p = k.split(".")
    return "encoder.block.%s.%s" % (p[1], UMT5[".".join(p[2:])])


def vae_weights(dim, z):
    """Wan2.1's VAE decoder (dim_mult 1, 2, 4, 4; 2 residual blocks + 1 per stage), and conv2."""
    w = [("conv2.weight", [z, z, 1, 1, 1]), ("conv2.bias", [z]),
         ("decoder.conv1.weight", [4 * dim, z, 3, 3, 3]), ("decoder.conv1.bias", [4 * dim])]

    def res(p, cin, cout):
        r = [(p + "residual.0.gamma", [cin, 1, 1, 1]), (p + "residual.2.weight", [cout, cin, 3, 3, 3]),
             (p + "residual.2.bias", [cout]), (p + "residual.3.gamma", [cout, 1, 1, 1]),
             (p + "residual.6.weight", [cout, cout, 3, 3, 3]), (p + "residual.6.bias", [cout])]
        return r + ([(p + "shortcut.weight", [cout, cin, 1, 1, 1]), (p + "shortcut.bias", [cout])] if cin != cout else [])

    c = 4 * dim
    w += res("decoder.middle.0.", c, c)
    w += [("decoder.middle.1.norm.gamma", [c, 1, 1]), ("decoder.middle.1.to_qkv.weight", [3 * c, c, 1, 1]),
          ("decoder.middle.1.to_qkv.bias", [3 * c]), ("decoder.middle.1.proj.weight", [c, c, 1, 1]),
          ("decoder.middle.1.proj.bias", [c])]
    w += res("decoder.middle.2.", c, c)
    cin, k = c, 0
    for s, mult in enumerate((4, 4, 2, 1)):
        cout = dim * mult
        for r in range(3):
            w += res("decoder.upsamples.%d." % k, cin if r == 0 else cout, cout)
            k += 1
        if s < 3:
            p = "decoder.upsamples.%d." % k
            w += [(p + "resample.1.weight", [cout // 2, cout, 3, 3]), (p + "resample.1.bias", [cout // 2])]
            if s < 2:
                w += [(p + "time_conv.weight", [2 * cout, cout, 3, 1, 1]), (p + "time_conv.bias", [2 * cout])]
            k += 1
            cin = cout // 2
    return w + [("decoder.head.0.gamma", [dim, 1, 1, 1]), ("decoder.head.2.weight", [3, dim, 3, 3, 3]),
                ("decoder.head.2.bias", [3])]


RESNET = {"residual.0.": "norm1.", "residual.2.": "conv1.", "residual.3.": "norm2.", "residual.6.": "conv2.",
          "shortcut.": "conv_shortcut."}


def vae_diffusers_name(k):
    """convert_vae of diffusers' convert_wan_to_diffusers.py, on the decoder's names."""
    if k.startswith("conv2."):
        return "post_quant_conv." + k[6:]
    r = k[len("decoder."):]

    def part(s):
        for a, b in RESNET.items():
            if s.startswith(a):
                return b + s[len(a):]
        return s

    for a, b in (("conv1.", "conv_in."), ("head.0.", "norm_out."), ("head.2.", "conv_out."),
                 ("middle.1.", "mid_block.attentions.0.")):
        if r.startswith(a):
            return "decoder." + b + r[len(a):]
    if r.startswith("middle."):
        n, rest = r[7:].split(".", 1)
        return "decoder.mid_block.resnets.%d.%s" % (int(n) // 2, part(rest))
    n, rest = r[len("upsamples."):].split(".", 1)
    n = int(n)
    if n % 4 == 3:
        return "decoder.up_blocks.%d.upsamplers.0.%s" % (n // 4, rest)
    return "decoder.up_blocks.%d.resnets.%d.%s" % (n // 4, n % 4, part(rest))


def release_seeds():
    t5 = [(k, "BF16", s, values(numel(s), i)) for i, (k, s) in enumerate(t5_weights(6, 4, 4, 2, 1, 4))]
    vae = [(k, "BF16", s, values(numel(s), i)) for i, (k, s) in enumerate(vae_weights(1, 1))]
    put("release", "wan", [("models_t5_umt5-xxl-enc-bf16.safetensors", safetensors(t5)),
                           ("Wan2.1_VAE.safetensors", safetensors(vae)),
                           ("google/umt5-xxl/tokenizer_config.json", b"{}")])
    u = [(umt5_name(k), "F32", s, v) for k, _, s, v in t5]
    u.append(("encoder.embed_tokens.weight", "F32", u[0][2], u[0][3]))
    names = ["model-0000%d-of-00002.safetensors" % (i + 1) for i in range(2)]
    shards = [u[: len(u) // 2], u[len(u) // 2:]]
    idx = {"metadata": {"total_size": 0}, "weight_map": {x[0]: names[i] for i in range(2) for x in shards[i]}}
    te_cfg = {"architectures": ["UMT5EncoderModel"], "model_type": "umt5", "feed_forward_proj": "gated-gelu",
              "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-06, "d_model": 4}
    sched = {"_class_name": "UniPCMultistepScheduler", "flow_shift": 3.0, "use_flow_sigmas": True,
             "prediction_type": "flow_prediction", "solver_order": 2, "solver_type": "bh2", "predict_x0": True,
             "lower_order_final": True, "final_sigmas_type": "zero", "num_train_timesteps": 1000}
    vae_cfg = {"_class_name": "AutoencoderKLWan", "base_dim": 1, "z_dim": 1, "is_residual": False,
               "latents_mean": [0.5], "latents_std": [2.0]}
    put("release", "pipeline", [
        ("model_index.json", js({"_class_name": "WanPipeline"})),
        ("text_encoder/config.json", js(te_cfg)),
        ("text_encoder/model.safetensors.index.json", js(idx)),
        ("text_encoder/" + names[0], safetensors(shards[0])), ("text_encoder/" + names[1], safetensors(shards[1])),
        ("vae/config.json", js(vae_cfg)),
        ("vae/diffusion_pytorch_model.safetensors",
         safetensors([(vae_diffusers_name(k), d, s, v) for k, d, s, v in vae])),
        ("scheduler/scheduler_config.json", js(sched)),
        ("tokenizer/tokenizer.json", b"{}")])
    put("release", "euler", [("model_index.json", js({"_class_name": "WanPipeline"})),
                             ("scheduler/scheduler_config.json",
                              js({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 5.0,
                                  "use_karras_sigmas": False, "stochastic_sampling": 0})),
                             ("text_encoder/model.safetensors", safetensors(u[:-1]))])
    put("release", "dpm", [("model_index.json", js({"_class_name": "WanPipeline"})),
                           ("scheduler/scheduler_config.json",
                            js({"_class_name": "DPMSolverMultistepScheduler", "flow_shift": 2.0, "use_flow_sigmas": True,
                                "algorithm_type": "dpmsolver++", "solver_type": "logrho", "variance_type": None}))])


wan_seeds()
lora_seeds()
release_seeds()
