"""peer_wire.py -- what the raw test peers (adversarial_peers.py,
hoard_peer.py, held_peer.py) share: a check's line, a message's frames as
docs/PROTOCOL.md lays them out (a msgpack header, then one frame per
tensor that its `tensors` entries describe), and a process's peak RSS."""

import sys

import msgpack

PROTO = "reel/1"


def say(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
    sys.stdout.flush()


def pack(hdr, tensors=()):
    """hdr (proto added when absent) and tensors [(name, dtype, shape, bytes)] as frames."""
    hdr = dict(hdr)
    hdr.setdefault("proto", PROTO)
    frames = []
    if tensors:
        hdr["tensors"] = []
        for name, dtype, shape, data in tensors:
            hdr["tensors"].append({"name": name, "dtype": dtype, "shape": list(shape), "bytes": len(data)})
            frames.append(data)
    return [msgpack.packb(hdr, use_bin_type=True)] + frames


def vm_hwm_kb(pid):
    """Process pid's peak resident set (VmHWM) in KiB, or -1."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1
