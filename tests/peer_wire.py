"""peer_wire.py -- what the raw test peers (adversarial_peers.py,
hoard_peer.py, held_peer.py) share: a check's line, a message's frames as
docs/PROTOCOL.md lays them out (a msgpack header, then one frame per
tensor that its `tensors` entries describe), a process's peak RSS, and
what a log budget (base/logbudget.h) wrote of one kind of line."""

import re
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


def budget_counts(path, line_re, kind, prog=None):
    """A daemon's log at path: (all its lines, the lines line_re (a regex) finds, the counts its "KIND: N
    more lines like the ones above were left out" summaries give, and those summaries). prog, if given,
    is the program name the summaries start with ("reel-broker")."""
    found = re.compile(line_re)
    summary = re.compile((re.escape(prog) + ": " if prog else "") + re.escape(kind) +
                         r": (\d+) more lines like the ones above were left out")
    lines, written, left_out, sums = 0, 0, 0, 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            lines += 1
            if found.search(line):
                written += 1
            m = summary.search(line)
            if m:
                left_out += int(m.group(1))
                sums += 1
    return lines, written, left_out, sums
