"""wan_layouts.py -- writes, from a Reel weights file, the checkpoints a
Wan2.1 user has, as the releases and diffusers publish them (the CLI tests'
fixtures; written here in Python, apart from Reel's C reader, so a shared
mistake cannot hide):

  OUT/original/             diffusion_pytorch_model.safetensors (no Reel
                            metadata) + Wan's config.json, F32
  OUT/original-bf16/        the same in BF16
  OUT/sharded/              diffusion_pytorch_model-0000K-of-00003.safetensors
                            + diffusion_pytorch_model.safetensors.index.json
                            + config.json, BF16
  OUT/diffusers/            WanTransformer3DModel config.json + its file under
                            diffusers' names, F16
  OUT/diffusers-sharded/    the same in 2 shards with an index, F32
  OUT/pipeline/             model_index.json + transformer/ (diffusers, F32)
                            + vae/ (a stand-in config)
  OUT/reel-bf16.safetensors  a Reel file holding the BF16 values (the native
  OUT/reel-f16.safetensors   file a BF16/F16 layout must equal)

Usage: wan_layouts.py REEL.safetensors OUT
The diffusers names come from diffusers' convert_wan_to_diffusers.py rename
table, applied the way that script applies it (str.replace, in order)."""

import hashlib
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "crosscheck"))
import safetensors_np  # noqa: E402

RENAME = [
    ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
    ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
    ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
    ("time_projection.1", "condition_embedder.time_proj"),
    ("head.modulation", "scale_shift_table"),
    ("head.head", "proj_out"),
    ("modulation", "scale_shift_table"),
    ("ffn.0", "ffn.net.0.proj"),
    ("ffn.2", "ffn.net.2"),
    ("norm2", "norm__placeholder"),
    ("norm3", "norm2"),
    ("norm__placeholder", "norm3"),
    ("self_attn.q", "attn1.to_q"),
    ("self_attn.k", "attn1.to_k"),
    ("self_attn.v", "attn1.to_v"),
    ("self_attn.o", "attn1.to_out.0"),
    ("self_attn.norm_q", "attn1.norm_q"),
    ("self_attn.norm_k", "attn1.norm_k"),
    ("cross_attn.q", "attn2.to_q"),
    ("cross_attn.k", "attn2.to_k"),
    ("cross_attn.v", "attn2.to_v"),
    ("cross_attn.o", "attn2.to_out.0"),
    ("cross_attn.norm_q", "attn2.norm_q"),
    ("cross_attn.norm_k", "attn2.norm_k"),
]


def diffusers_name(k):
    for a, b in RENAME:
        k = k.replace(a, b)
    return k


def to_bf16_bits(a):
    u = np.ascontiguousarray(a, dtype="<f4").view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def encode(a, dtype):
    if dtype == "F32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(a.astype("<f2")).tobytes()
    return to_bf16_bits(a).tobytes()



def write(path, tensors, dtype, meta=None, order=None):
    header, chunks, off = {}, [], 0
    if meta:
        header["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    for name in order or tensors:
        a = tensors[name]
        raw = encode(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for c in chunks:
            f.write(c)


def wan_config(m):
    return {"_class_name": "WanModel", "_diffusers_version": "0.30.0", "dim": int(m["dim"]), "eps": 1e-06,
            "ffn_dim": int(m["ffn_dim"]), "freq_dim": int(m["freq_dim"]), "in_dim": int(m["in_channels"]),
            "model_type": "t2v", "num_heads": int(m["heads"]), "num_layers": int(m["layers"]),
            "out_dim": int(m["in_channels"]), "text_dim": int(m["text_dim"]),
            "text_len": int(m.get("text_len", 512)), "patch_size": [1, 2, 2], "window_size": [-1, -1],
            "qk_norm": True, "cross_attn_norm": True}


def diffusers_config(m):
    return {"_class_name": "WanTransformer3DModel", "_diffusers_version": "0.33.0.dev0", "added_kv_proj_dim": None,
            "attention_head_dim": int(m["dim"]) // int(m["heads"]), "cross_attn_norm": True, "eps": 1e-06,
            "ffn_dim": int(m["ffn_dim"]), "freq_dim": int(m["freq_dim"]), "image_dim": None,
            "in_channels": int(m["in_channels"]), "num_attention_heads": int(m["heads"]),
            "num_layers": int(m["layers"]), "out_channels": int(m["in_channels"]), "patch_size": [1, 2, 2],
            "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": int(m["text_dim"])}


def dump(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def sharded(folder, tensors, dtype, nshards, config):
    os.makedirs(folder, exist_ok=True)
    names = list(tensors)
    per = (len(names) + nshards - 1) // nshards
    wm = {}
    for s in range(nshards):
        fname = "diffusion_pytorch_model-%05d-of-%05d.safetensors" % (s + 1, nshards)
        part = names[s * per:(s + 1) * per]
        write(os.path.join(folder, fname), {k: tensors[k] for k in part}, dtype)
        for k in part:
            wm[k] = fname
    total = sum(len(encode(tensors[k], dtype)) for k in names)
    dump(os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json"),
         {"metadata": {"total_size": total}, "weight_map": wm})
    dump(os.path.join(folder, "config.json"), config)


def identity(folder):
    """The sha256 a sync announces for an index: its bytes, then each
    shard's digest in name order (docs/PROTOCOL.md)."""
    idx = os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json")
    with open(idx, "rb") as f:
        raw = f.read()
    h = hashlib.sha256(raw)
    for name in sorted(set(json.loads(raw)["weight_map"].values())):
        with open(os.path.join(folder, name), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def main():
    src, out = sys.argv[1], sys.argv[2]
    tensors, meta = safetensors_np.load(src)
    order = list(tensors)
    diff = {diffusers_name(k): v for k, v in tensors.items()}
    for folder, dtype in (("original", "F32"), ("original-bf16", "BF16")):
        d = os.path.join(out, folder)
        os.makedirs(d, exist_ok=True)
        write(os.path.join(d, "diffusion_pytorch_model.safetensors"), tensors, dtype, order=order)
        dump(os.path.join(d, "config.json"), wan_config(meta))
    sharded(os.path.join(out, "sharded"), tensors, "BF16", 3, wan_config(meta))
    d = os.path.join(out, "diffusers")
    os.makedirs(d, exist_ok=True)
    write(os.path.join(d, "diffusion_pytorch_model.safetensors"), diff, "F16")
    dump(os.path.join(d, "config.json"), diffusers_config(meta))
    sharded(os.path.join(out, "diffusers-sharded"), diff, "F32", 2, diffusers_config(meta))
    p = os.path.join(out, "pipeline")
    os.makedirs(os.path.join(p, "transformer"), exist_ok=True)
    os.makedirs(os.path.join(p, "vae"), exist_ok=True)
    write(os.path.join(p, "transformer", "diffusion_pytorch_model.safetensors"), diff, "F32")
    dump(os.path.join(p, "transformer", "config.json"), diffusers_config(meta))
    dump(os.path.join(p, "vae", "config.json"), {"_class_name": "AutoencoderKLWan"})
    dump(os.path.join(p, "model_index.json"), {"_class_name": "WanPipeline", "_diffusers_version": "0.33.0.dev0",
                                               "transformer": ["diffusers", "WanTransformer3DModel"],
                                               "vae": ["diffusers", "AutoencoderKLWan"]})
    for dtype in ("BF16", "F16"):
        write(os.path.join(out, "reel-%s.safetensors" % dtype.lower()), tensors, dtype, meta=meta, order=order)
    print(json.dumps({"sharded": identity(os.path.join(out, "sharded")),
                      "diffusers-sharded": identity(os.path.join(out, "diffusers-sharded"))}))


if __name__ == "__main__":
    main()
