"""wan_diffusers_parts.py -- writes a Wan text encoder and VAE (Reel's files,
under Wan's names) as a diffusers pipeline publishes them
(Wan-AI/Wan2.1-T2V-*-Diffusers), for the CLI tests. Written here in
Python, from the published renames, apart from Reel's C reader
(model/hf_parts.c), so a shared mistake cannot hide:

  OUT/text_encoder/   transformers' UMT5EncoderModel names, in 2 shards
                      (model-0000K-of-00002.safetensors) with
                      model.safetensors.index.json and a config.json; F32
                      (the source's values widened: the same numbers);
                      shared.weight and its tied encoder.embed_tokens.weight
  OUT/vae/            diffusion_pytorch_model.safetensors under the names
                      diffusers' convert_wan_to_diffusers.py convert_vae
                      gives, and a config.json

Usage: wan_diffusers_parts.py T5.safetensors VAE.safetensors OUT

The UMT5 names are transformers' (modeling_umt5: UMT5EncoderModel holds
shared, encoder.block.N.layer.0.SelfAttention.{q,k,v,o,relative_attention_bias},
layer.0.layer_norm, layer.1.DenseReluDense.{wi_0,wi_1,wo}, layer.1.layer_norm,
encoder.final_layer_norm); Wan's T5Encoder (wan/modules/t5.py) computes
fc2(fc1(x) * gelu(gate(x))) where UMT5 computes wo(gelu(wi_0(x)) * wi_1(x)):
gate.0 is wi_0, fc1 wi_1, fc2 wo."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "crosscheck"))
import safetensors_np  # noqa: E402


def umt5_name(k):
    if k == "token_embedding.weight":
        return "shared.weight"
    if k == "norm.weight":
        return "encoder.final_layer_norm.weight"
    parts = k.split(".")
    assert parts[0] == "blocks", k
    n, rest = parts[1], ".".join(parts[2:])
    table = {
        "attn.q.weight": "layer.0.SelfAttention.q.weight",
        "attn.k.weight": "layer.0.SelfAttention.k.weight",
        "attn.v.weight": "layer.0.SelfAttention.v.weight",
        "attn.o.weight": "layer.0.SelfAttention.o.weight",
        "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
        "norm1.weight": "layer.0.layer_norm.weight",
        "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
        "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
        "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
        "norm2.weight": "layer.1.layer_norm.weight",
    }
    return "encoder.block.%s.%s" % (n, table[rest])


MIDDLE = {"residual.0.gamma": "norm1.gamma", "residual.2.bias": "conv1.bias", "residual.2.weight": "conv1.weight",
          "residual.3.gamma": "norm2.gamma", "residual.6.bias": "conv2.bias", "residual.6.weight": "conv2.weight"}


def vae_name(key):
    """convert_vae's renames, in the order that function tries them."""
    for side in ("encoder", "decoder"):
        for i, j in (("0", "0"), ("2", "1")):
            for a, b in MIDDLE.items():
                if key == "%s.middle.%s.%s" % (side, i, a):
                    return "%s.mid_block.resnets.%s.%s" % (side, j, b)
        for a in ("norm.gamma", "to_qkv.weight", "to_qkv.bias", "proj.weight", "proj.bias"):
            if key == "%s.middle.1.%s" % (side, a):
                return "%s.mid_block.attentions.0.%s" % (side, a)
        for a, b in (("head.0.gamma", "norm_out.gamma"), ("head.2.bias", "conv_out.bias"),
                     ("head.2.weight", "conv_out.weight")):
            if key == "%s.%s" % (side, a):
                return "%s.%s" % (side, b)
    quant = {"conv1.weight": "quant_conv.weight", "conv1.bias": "quant_conv.bias",
             "conv2.weight": "post_quant_conv.weight", "conv2.bias": "post_quant_conv.bias"}
    if key in quant:
        return quant[key]
    for side in ("encoder", "decoder"):
        for s in ("weight", "bias"):
            if key == "%s.conv1.%s" % (side, s):
                return "%s.conv_in.%s" % (side, s)
    if key.startswith("encoder.downsamples."):
        k = key.replace("encoder.downsamples.", "encoder.down_blocks.")
        for a, b in ((".residual.0.gamma", ".norm1.gamma"), (".residual.2.bias", ".conv1.bias"),
                     (".residual.2.weight", ".conv1.weight"), (".residual.3.gamma", ".norm2.gamma"),
                     (".residual.6.bias", ".conv2.bias"), (".residual.6.weight", ".conv2.weight"),
                     (".shortcut.bias", ".conv_shortcut.bias"), (".shortcut.weight", ".conv_shortcut.weight")):
            if a in k:
                return k.replace(a, b)
        return k
    if key.startswith("decoder.upsamples."):
        idx = int(key.split(".")[2])
        if "residual" in key:
            groups = {0: (0, 0), 1: (0, 1), 2: (0, 2), 4: (1, 0), 5: (1, 1), 6: (1, 2), 8: (2, 0), 9: (2, 1),
                      10: (2, 2), 12: (3, 0), 13: (3, 1), 14: (3, 2)}
            if idx not in groups:
                return key
            b, r = groups[idx]
            for a, c in MIDDLE.items():
                if "." + a in key:
                    return "decoder.up_blocks.%d.resnets.%d.%s" % (b, r, c)
            return key
        if ".shortcut." in key:
            if idx == 4:
                return key.replace(".shortcut.", ".resnets.0.conv_shortcut.").replace("decoder.upsamples.4",
                                                                                     "decoder.up_blocks.1")
            return key.replace("decoder.upsamples.", "decoder.up_blocks.").replace(".shortcut.", ".conv_shortcut.")
        if ".resample." in key or ".time_conv." in key:
            ups = {3: 0, 7: 1, 11: 2}
            if idx in ups:
                return key.replace("decoder.upsamples.%d" % idx, "decoder.up_blocks.%d.upsamplers.0" % ups[idx])
            return key.replace("decoder.upsamples.", "decoder.up_blocks.")
        return key.replace("decoder.upsamples.", "decoder.up_blocks.")
    return key


def dump(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def main():
    t5_src, vae_src, out = sys.argv[1], sys.argv[2], sys.argv[3]
    t5, _ = safetensors_np.load(t5_src)
    te = os.path.join(out, "text_encoder")
    os.makedirs(te, exist_ok=True)
    names = sorted(t5)
    shards = [{}, {}]
    for i, k in enumerate(names):
        shards[i % 2][umt5_name(k)] = np.ascontiguousarray(t5[k], dtype=np.float32)
    # transformers ties the encoder's embedding to shared; a file may hold both
    shards[1]["encoder.embed_tokens.weight"] = shards[0].get("shared.weight", shards[1].get("shared.weight"))
    weight_map = {}
    for i, sh in enumerate(shards):
        fn = "model-%05d-of-00002.safetensors" % (i + 1)
        safetensors_np.save(os.path.join(te, fn), sh)
        weight_map.update({k: fn for k in sh})
    dump(os.path.join(te, "model.safetensors.index.json"), {"metadata": {}, "weight_map": weight_map})
    dump(os.path.join(te, "config.json"), {"architectures": ["UMT5EncoderModel"], "model_type": "umt5"})
    vae, _ = safetensors_np.load(vae_src)
    vd = os.path.join(out, "vae")
    os.makedirs(vd, exist_ok=True)
    conv = {}
    for k, v in vae.items():
        n = vae_name(k)
        assert n not in conv, n
        conv[n] = np.ascontiguousarray(v, dtype=np.float32)
    safetensors_np.save(os.path.join(vd, "diffusion_pytorch_model.safetensors"), conv)
    dump(os.path.join(vd, "config.json"), {"_class_name": "AutoencoderKLWan", "z_dim": int(vae["conv2.weight"].shape[0])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
