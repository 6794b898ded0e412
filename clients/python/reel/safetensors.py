"""Reading and writing safetensors files with numpy only.

A file is an 8-byte little-endian header length N, N bytes of JSON mapping
tensor name -> {"dtype", "shape", "data_offsets"} (plus an optional
"__metadata__" object of strings), then the data. Reel reads F32, BF16 and
F16; this module writes F32 (and F16) and reads all three (BF16 widened to
float32, since numpy has no bfloat16).
"""

import json
import math
import os
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


def checked(tensors, what):
    """The arrays save() writes, name -> C-ordered F32 or F16 numpy array,
    with its refusals (ValueError naming `what` and the tensor), so a
    caller can judge tensors before it touches a file."""
    out = {}
    for name in tensors:
        if not isinstance(name, str):
            raise ValueError(f"{what}: tensor name {name!r} is not a string")
        if name == "__metadata__":
            raise ValueError(f"{what}: a tensor may not be named __metadata__ (the header's metadata entry)")
        try:
            a = _as_numpy(tensors[name])
        except (TypeError, ValueError) as e:  # a ragged nested list, ...
            raise ValueError(f"{what}: {name}: not an array: {e}") from None
        if a.dtype.kind not in "fiu":
            raise ValueError(f"{what}: {name}: dtype {a.dtype} is not a real number (F32 or F16 are written; "
                             "other float and integer dtypes are cast to F32)")
        out[name] = np.asarray(a, dtype=np.float16 if a.dtype == np.float16 else "<f4", order="C")  # 0-d stays 0-d
    return out


def save(path, tensors, metadata=None):
    """Writes tensors (name -> array-like) to path as F32 (F16 stays F16;
    other float and integer dtypes are cast to F32); a 0-d array keeps its
    shape []. Raises ValueError, naming the tensor, for a dtype that is no
    real number (bool, complex, text, objects), a name that is not a
    string, or the name "__metadata__" (the header's own entry).

    metadata: a dict of strings stored in __metadata__ (Reel reads the
    model config from it: {"config": "tiny"} or the size keys).
    """
    header, blobs, off = {}, [], 0
    for name, a in checked(tensors, path).items():
        data = a.tobytes()
        header[name] = {"dtype": "F16" if a.dtype == np.float16 else "F32",
                        "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the data 8-byte aligned
    # written beside it, then renamed over it: a file already at path (the
    # one workers load) is replaced whole or left as it was, never cut
    part = f"{path}.part-{os.getpid()}"
    try:
        with open(part, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for b in blobs:
                f.write(b)
        os.replace(part, path)
    except BaseException:
        if os.path.exists(part):
            os.remove(part)
        raise


def _uints(v, n=None):
    """v as a list of non-negative ints (JSON integers, not bools), or None."""
    if not isinstance(v, list) or (n is not None and len(v) != n):
        return None
    if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
        return None
    return v


def load(path):
    """(tensors, metadata): name -> float32 numpy array (F16 kept), and the
    __metadata__ dict ({} when absent). Raises ValueError naming the file
    (and the tensor, where one is at fault) on a bad file: a header that is
    not UTF-8 JSON or not an object, an entry that is not an object or
    lacks dtype, shape or data_offsets, a dtype other than F32, BF16 or F16,
    data_offsets outside the data or not the size the shape and dtype
    make, two tensors whose bytes overlap (empty ones may share an
    offset)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > _MAX_HEADER or 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} does not fit the file")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError both are
        raise ValueError(f"{path}: the header is not UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is a JSON {type(header).__name__}, not an object")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: __metadata__ is a JSON {type(meta).__name__}, not an object")
    base, out, spans = 8 + n, {}, []
    for name, d in header.items():
        if not isinstance(d, dict):
            raise ValueError(f"{path}: {name}: its entry is a JSON {type(d).__name__}, not an object")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in d:
                raise ValueError(f"{path}: {name}: no {key}")
        dtype = d["dtype"]
        if dtype not in ("F32", "BF16", "F16"):
            raise ValueError(f"{path}: {name}: dtype {dtype} is not F32, BF16 or F16")
        shape, offs = _uints(d["shape"]), _uints(d["data_offsets"], 2)
        if shape is None:
            raise ValueError(f"{path}: {name}: shape {d['shape']!r} is not a list of non-negative integers")
        if offs is None:
            raise ValueError(f"{path}: {name}: data_offsets {d['data_offsets']!r} is not two non-negative integers")
        b0, b1 = offs
        if not b0 <= b1 <= len(raw) - base:
            raise ValueError(f"{path}: {name}: data_offsets outside the file")
        want = math.prod(shape) * (4 if dtype == "F32" else 2)
        if b1 - b0 != want:
            raise ValueError(f"{path}: {name}: shape {shape} of {dtype} is {want} bytes, its data_offsets "
                             f"hold {b1 - b0}")
        if b1 > b0:
            spans.append((b0, b1, name))
        buf = raw[base + b0:base + b1]
        if dtype == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            out[name] = u.view(np.float32).reshape(shape)
        else:
            out[name] = np.frombuffer(buf, dtype=_DTYPES[dtype]).reshape(shape).copy()
    spans.sort()
    for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise ValueError(f"{path}: {n1}: its bytes overlap {n0}'s")
    return out, meta
