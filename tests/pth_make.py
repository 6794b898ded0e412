#!/usr/bin/env python3
"""pth_make.py OUTDIR -- the .pth archives tests/test_pth.c reads.

torch is not needed: a stand-in `torch` module (the storage classes and
torch._utils' rebuild functions, never called) lets Python's own pickle
write exactly the opcodes torch.save writes for a state dict (protocol 2,
persistent ids ('storage', torch.XStorage, key, 'cpu', numel), tensors as
_rebuild_tensor_v2 REDUCEs, an OrderedDict with its `_metadata` BUILD), and
two zip writers lay the records out: one as torch's miniz writer does
(entries 64-byte aligned by an 'FB' extra field, sizes in a data descriptor,
a zip64 end record always; optionally zip64 extra fields everywhere) and
Python's zipfile (sizes in the local header; force_zip64; deflate).

Writes, into OUTDIR:
  good.pth, zip64.pth, pyzip.pth, pyzip64.pth, proto4.pth   the same tensors
  expect.safetensors   what each must read as: every tensor contiguous, in its
                       dtype, gathered here by explicit strided indexing
  bad_*.pth            one refusal each (see CASES at the bottom)
Storage element i of storage number k is ((7 i + 3 k) mod 61 - 30) / 4, exact in
F32, F16 and BF16.
"""
import collections
import json
import os
import pickle
import struct
import sys
import types
import zipfile

# ---- a stand-in torch: only names, so pickle can find them by module --------
torch = types.ModuleType("torch")
torch_utils = types.ModuleType("torch._utils")
torch._utils = torch_utils
for cls in ("FloatStorage", "BFloat16Storage", "HalfStorage", "LongStorage"):
    setattr(torch, cls, type(cls, (), {"__module__": "torch"}))


def _rebuild_tensor_v2(*args):
    raise AssertionError("never called")


def _rebuild_parameter(*args):
    raise AssertionError("never called")


for fn in (_rebuild_tensor_v2, _rebuild_parameter):
    fn.__module__ = "torch._utils"
    setattr(torch_utils, fn.__name__, fn)
sys.modules["torch"] = torch
sys.modules["torch._utils"] = torch_utils

STORAGE_TYPE = {"F32": torch.FloatStorage, "BF16": torch.BFloat16Storage, "F16": torch.HalfStorage,
                "I64": torch.LongStorage}


def value(k, i):
    return ((7 * i + 3 * k) % 61 - 30) / 4.0


def pack(dtype, xs):
    if dtype == "F32":
        return struct.pack("<%df" % len(xs), *xs)
    if dtype == "F16":
        return struct.pack("<%de" % len(xs), *xs)
    if dtype == "BF16":
        return b"".join(struct.pack("<f", x)[2:] for x in xs)
    if dtype == "I64":
        return struct.pack("<%dq" % len(xs), *[int(x) for x in xs])
    raise ValueError(dtype)


class Storage:
    def __init__(self, dtype, key, numel, record=True):
        self.dtype, self.key, self.numel, self.record = dtype, str(key), numel, record
        self.values = [value(int(key), i) for i in range(numel)]

    def data(self):
        return pack(self.dtype, self.values)


class Tensor:
    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

    def __reduce_ex__(self, proto):
        return (torch_utils._rebuild_tensor_v2,
                (self.storage, self.offset, self.size, self.stride, False, collections.OrderedDict()))

    def elements(self):
        """Row-major gather by explicit indexing (what the C reader must match)."""
        out, idx = [], [0] * len(self.size)
        n = 1
        for s in self.size:
            n *= s
        for _ in range(n):
            out.append(self.storage.values[self.offset + sum(i * s for i, s in zip(idx, self.stride))])
            for d in reversed(range(len(idx))):
                idx[d] += 1
                if idx[d] < self.size[d]:
                    break
                idx[d] = 0
        return out


class Parameter:
    def __init__(self, tensor):
        self.tensor = tensor

    def __reduce_ex__(self, proto):
        return (torch_utils._rebuild_parameter, (self.tensor, True, collections.OrderedDict()))


class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", STORAGE_TYPE[obj.dtype], obj.key, "cpu", obj.numel)
        return None


def dumps(obj, protocol=2, fix_imports=True):
    import io
    buf = io.BytesIO()
    TorchPickler(buf, protocol=protocol, fix_imports=fix_imports).dump(obj)
    return buf.getvalue()


def storages_of(tensors):
    seen = {}
    for t in tensors:
        t = t.tensor if isinstance(t, Parameter) else t
        seen.setdefault(t.storage.key, t.storage)
    return [s for s in seen.values() if s.record]


def records(pkl, storages):
    rs = [("data.pkl", pkl), ("byteorder", b"little")]
    rs += [("data/%s" % s.key, s.data()) for s in storages]
    rs += [("version", b"3\n"), (".data/serialization_id", b"1234567890")]
    return rs


# ---- zip writers ---------------------------------------------------------
def torch_zip(root, recs, zip64=False):
    """The layout torch's miniz writer produces (see caffe2/serialize)."""
    import zlib
    out, cent = bytearray(), []
    for name, data in recs:
        nm, ofs, crc, n = ("%s/%s" % (root, name)).encode(), len(out), zlib.crc32(data), len(data)
        z64 = struct.pack("<HHQQQ", 1, 24, n, n, ofs) if zip64 else b""
        pad = (-(ofs + 30 + len(nm) + len(z64) + 4)) % 64
        extra = z64 + b"FB" + struct.pack("<H", pad) + b"Z" * pad
        flags = 0x0808 if n else 0x0800
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, flags, 0, 0, 0, 0, 0, 0, len(nm), len(extra))
        out += nm + extra
        assert len(out) % 64 == 0
        out += data
        if n:
            out += struct.pack("<IIQQ", 0x08074B50, crc, n, n) if zip64 else struct.pack("<IIII", 0x08074B50, crc, n, n)
        big = 0xFFFFFFFF if zip64 else None
        cx = struct.pack("<HHQQQ", 1, 24, n, n, ofs) if zip64 else b""
        cent.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0x031E, 0x2D if zip64 else 0x14, flags, 0, 0, 0,
                                crc, big or n, big or n, len(nm), len(cx), 0, 0, 0, 0, big or ofs) + nm + cx)
    cd_ofs, cd = len(out), b"".join(cent)
    out += cd
    z64_ofs, count = len(out), len(cent)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x2D, 0x2D, 0, 0, count, count, len(cd), cd_ofs)
    out += struct.pack("<IIQI", 0x07064B50, 0, z64_ofs, 1)
    c16, c32 = (0xFFFF, 0xFFFFFFFF) if zip64 else (count, None)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, c16, c16, c32 or len(cd), c32 or cd_ofs, 0)
    return bytes(out)


def py_zip(path, root, recs, force_zip64=False, deflate=()):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in recs:
            info = zipfile.ZipInfo("%s/%s" % (root, name))
            if name in deflate:
                info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=force_zip64) as f:
                f.write(data)


def central(blob):
    """(position, name) of every central directory record of a torch_zip blob."""
    (cd_size, cd_ofs) = struct.unpack_from("<II", blob, len(blob) - 22 + 12)
    at, out = cd_ofs, []
    while at < cd_ofs + cd_size:
        nl, xl, cl = struct.unpack_from("<HHH", blob, at + 28)
        out.append((at, blob[at + 46:at + 46 + nl].decode()))
        at += 46 + nl + xl + cl
    return out


def patch_central(blob, name, offset, fmt, value):
    b = bytearray(blob)
    pos = [p for p, n in central(blob) if n.endswith("/" + name)][0]
    struct.pack_into(fmt, b, pos + offset, value)
    return bytes(b)


def local_offset(blob, name):
    pos = [p for p, n in central(blob) if n.endswith("/" + name)][0]
    return struct.unpack_from("<I", blob, pos + 42)[0]


# ---- what is saved ---------------------------------------------------------
def good_tensors():
    s = [Storage("BF16", 0, 12), Storage("F32", 1, 4), Storage("F16", 2, 12), Storage("F32", 3, 40),
         Storage("BF16", 4, 24), Storage("F32", 5, 6), Storage("F32", 6, 1), Storage("F32", 7, 0),
         Storage("F16", 8, 3)]
    return [
        ("enc.w", Tensor(s[0], 0, (3, 4), (4, 1))),
        ("enc.b", Tensor(s[1], 0, (4,), (1,))),
        ("dec.h", Tensor(s[2], 0, (2, 3, 2), (6, 2, 1))),
        ("view.t", Tensor(s[3], 5, (3, 4), (1, 6))),        # strided, offset
        ("shared.a", Tensor(s[4], 0, (2, 6), (6, 1))),      # two views of one storage
        ("shared.b", Tensor(s[4], 12, (12,), (1,))),
        ("p.w", Parameter(Tensor(s[5], 0, (2, 3), (3, 1)))),
        ("s", Tensor(s[6], 0, (), ())),                     # a scalar
        ("e", Tensor(s[7], 0, (0, 3), (3, 1))),             # empty
        ("bcast", Tensor(s[8], 0, (2, 3), (0, 1))),         # an expanded view (stride 0)
    ]


def state_dict(items):
    d = collections.OrderedDict(items)
    d._metadata = collections.OrderedDict([("", {"version": 1}), ("enc", {"version": 1})])
    return d


def write_expect(path, items):
    """expect.safetensors: every tensor contiguous in its own dtype."""
    header, blobs, at = {}, [], 0
    for name, t in items:
        t = t.tensor if isinstance(t, Parameter) else t
        raw = pack(t.storage.dtype, t.elements())
        header[name] = {"dtype": t.storage.dtype, "shape": list(t.size), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write(path, blob):
    with open(path, "wb") as f:
        f.write(blob)


class Evil:
    """Pickles as a call of fn(*args): what a malicious checkpoint holds."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def os_system_pickle(items):
    """GLOBAL 'os system' exactly (os.system is posix.system in CPython)."""
    def system(cmd):
        raise AssertionError("never called")
    system.__module__, system.__qualname__ = "os", "system"
    real = os.system
    os.system = system
    try:
        return dumps(collections.OrderedDict(items + [("x", Evil(system, "echo pwned"))]))
    finally:
        os.system = real


def main(out):
    items = good_tensors()
    tensors = [t for _, t in items]
    sts = storages_of(tensors)
    recs = records(dumps(state_dict(items)), sts)
    write_expect(os.path.join(out, "expect.safetensors"), items)
    good = torch_zip("good", recs)
    write(os.path.join(out, "good.pth"), good)
    write(os.path.join(out, "zip64.pth"), torch_zip("archive", recs, zip64=True))
    write(os.path.join(out, "proto4.pth"), torch_zip("archive", records(dumps(state_dict(items), protocol=4), sts)))
    plain = records(dumps(dict(items)), sts)
    py_zip(os.path.join(out, "pyzip.pth"), "archive", plain)
    py_zip(os.path.join(out, "pyzip64.pth"), "archive", plain, force_zip64=True)

    small = items[:2]
    small_sts = storages_of([t for _, t in small])

    def bad(name, blob):
        write(os.path.join(out, "bad_%s.pth" % name), blob)

    bad("os_system", torch_zip("archive", records(os_system_pickle(small), small_sts)))
    bad("eval", torch_zip("archive", records(
        dumps(collections.OrderedDict(small + [("x", Evil(eval, "1+1"))]), fix_imports=False), small_sts)))
    long_st = Storage("I64", 0, 4)
    bad("long", torch_zip("archive", records(dumps({"ids": Tensor(long_st, 0, (4,), (1,))}), [long_st])))
    bad("truncated", good[:len(good) * 6 // 10])
    bad("overlap", patch_central(good, "data/1", 42, "<I", local_offset(good, "data/0") + 8))
    py_zip(os.path.join(out, "bad_deflate.pth"), "archive", recs, deflate=("data/0",))
    mism = bytearray(good)
    at = local_offset(good, "data/0") + 30 + len("good/data/")
    mism[at:at + 1] = b"9"
    bad("mismatch", bytes(mism))
    big = patch_central(good, "data/0", 20, "<I", 0x7FFF0000)
    bad("beyond", patch_central(big, "data/0", 24, "<I", 0x7FFF0000))
    st = Storage("F32", 0, 8)
    bad("small_storage", torch_zip("archive", records(dumps({"w.small": Tensor(st, 0, (4, 4), (4, 1))}), [st])))
    # a shape whose reach overflows 2^64 elements: said so, not "need 0"
    bad("overflow_view", torch_zip("archive", records(dumps({"w.huge": Tensor(st, 0, (1 << 40, 1 << 40),
                                                                                (1 << 40, 1))}), [st])))
    ghost = Storage("F32", 7, 4, record=False)
    bad("missing", torch_zip("archive", records(dumps({"w.ghost": Tensor(ghost, 0, (4,), (1,))}),
                                                  storages_of([small[0][1]]))))
    one = Storage("F32", 0, 1)
    bad("expand", torch_zip("archive", records(dumps({"w.expand": Tensor(one, 0, (1 << 20,), (0,))}), [one])))
    bad("list", torch_zip("archive", records(dumps([t for _, t in small]), small_sts)))
    bad("opcode", torch_zip("archive", records(b"\x80\x02}q\x00\xfe.", [])))
    bad("not_tensor", torch_zip("archive", records(dumps(collections.OrderedDict(small + [("n", 3)])), small_sts)))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: pth_make.py OUTDIR")
    main(sys.argv[1])
