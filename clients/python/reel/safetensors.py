"""Reading and writing safetensors files with numpy only.

A file is an 8-byte little-endian header length N, N bytes of JSON mapping
tensor name -> {"dtype", "shape", "data_offsets"} (plus an optional
"__metadata__" object of strings), then the data. Reel reads F32, BF16 and
F16; this module writes F32 (and F16) and reads all three (BF16 widened to
float32, since numpy has no bfloat16).
"""

import json
import struct

import numpy as np

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2")}
_MAX_HEADER = 100 * 1024 * 1024


def _as_numpy(x):
    """numpy array of x (a numpy array, a torch tensor, or a nested list)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch, without importing it
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def save(path, tensors, metadata=None):
    """Writes tensors (name -> array-like) to path as F32 (F16 stays F16).

    metadata: a dict of strings stored in __metadata__ (Reel reads the
    model config from it: {"config": "tiny"} or the size keys).
    """
    header, blobs, off = {}, [], 0
    for name in tensors:
        a = _as_numpy(tensors[name])
        if a.dtype != np.float16:
            a = a.astype("<f4", copy=False)
        a = np.ascontiguousarray(a)
        data = a.tobytes()
        header[name] = {"dtype": "F16" if a.dtype == np.float16 else "F32",
                        "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path):
    """(tensors, metadata): name -> float32 numpy array (F16 kept), and the
    __metadata__ dict ({} when absent). Raises ValueError on a bad file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > _MAX_HEADER or 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} does not fit the file")
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base, out = 8 + n, {}
    for name, d in header.items():
        b0, b1 = d["data_offsets"]
        if not 0 <= b0 <= b1 <= len(raw) - base:
            raise ValueError(f"{path}: {name}: data_offsets outside the file")
        buf = raw[base + b0:base + b1]
        shape = tuple(d["shape"])
        if d["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            out[name] = u.view(np.float32).reshape(shape)
        elif d["dtype"] in _DTYPES:
            out[name] = np.frombuffer(buf, dtype=_DTYPES[d["dtype"]]).reshape(shape).copy()
        else:
            raise ValueError(f"{path}: {name}: dtype {d['dtype']} is not F32, BF16 or F16")
    return out, meta
