"""Minimal safetensors reader/writer (pure Python + numpy).

Format: 8-byte little-endian u64 header length N, then N bytes of JSON
  {name: {"dtype": str, "shape": [..], "data_offsets": [begin, end]},
   "__metadata__": {str: str}}
then the data section; offsets are relative to the start of the data section.

Reading supports F32, F16 and BF16; every tensor is returned as float32
(BF16 widened as uint16 << 16 viewed as float32, F16 via numpy).
Writing writes F32 tensors and string metadata; the header is padded with
spaces to a multiple of 8 bytes.
"""

import json
import struct

import numpy as np

_ELEM_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def _decode(dtype, raw, shape):
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        a = u.view(np.float32)
    else:
        raise ValueError("unsupported safetensors dtype %r" % dtype)
    return a.reshape(shape).astype(np.float32, copy=True)


def load(path):
    """Return (tensors: dict name -> float32 ndarray, metadata: dict str->str)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError("%s: too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError("%s: header length %d exceeds file size" % (path, n))
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, info in header.items():
        dtype = info["dtype"]
        shape = [int(s) for s in info["shape"]]
        b, e = info["data_offsets"]
        if dtype not in _ELEM_SIZE:
            raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, dtype))
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * _ELEM_SIZE[dtype] or e > len(data):
            raise ValueError("%s: tensor %s has bad data_offsets %r" % (path, name, [b, e]))
        tensors[name] = _decode(dtype, bytes(data[b:e]), shape)
    return tensors, dict(meta)


def save(path, tensors, metadata=None):
    """Write tensors (dict name -> array, stored as F32) and string metadata."""
    header = {}
    chunks = []
    off = 0
    for name in tensors:
        a = np.array(tensors[name], dtype="<f4", order="C")  # keeps 0-d shapes
        raw = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for c in chunks:
            f.write(c)


def save_raw(path, tensors, metadata=None):
    """Like save() but tensors is name -> (dtype_str, shape, raw_bytes).

    Used only by the self-test to produce BF16/F16 files."""
    header = {}
    chunks = []
    off = 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for c in chunks:
            f.write(c)
