#!/usr/bin/env python3
"""st_to_pth.py IN.safetensors OUT.pth -- the same tensors as a PyTorch
checkpoint laid out as torch.save writes it (tests/pth_make.py's stand-in
torch and zip writer; torch itself is not needed): what a Wan2.1 release
ships (`models_t5_umt5-xxl-enc-bf16.pth`, `Wan2.1_VAE.pth`). The tests
build small release folders with it."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pth_make as pm  # noqa: E402

SIZE = {"F32": 4, "BF16": 2, "F16": 2}


class RawStorage(pm.Storage):
    """A storage holding given bytes (pth_make's hold a formula's values)."""

    def __init__(self, dtype, key, raw):
        self.dtype, self.key, self.raw, self.record = dtype, str(key), raw, True
        self.numel = len(raw) // SIZE[dtype]

    def data(self):
        return self.raw


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = []
    for name, d in header.items():
        if name == "__metadata__":
            continue
        a, b = d["data_offsets"]
        out.append((name, d["dtype"], d["shape"], blob[base + a:base + b]))
    return out


def main(src, dst):
    items = []
    for key, (name, dtype, shape, raw) in enumerate(read_safetensors(src)):
        stride, acc = [], 1
        for s in reversed(shape):
            stride.insert(0, acc)
            acc *= s
        items.append((name, pm.Tensor(RawStorage(dtype, key, raw), 0, shape, stride)))
    pkl = pm.dumps(pm.state_dict(items))
    root = os.path.splitext(os.path.basename(dst))[0]
    blob = pm.torch_zip(root, pm.records(pkl, pm.storages_of([t for _, t in items])))
    pm.write(dst, blob)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
