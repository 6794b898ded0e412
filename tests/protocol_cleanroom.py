"""protocol_cleanroom.py -- a Reel client written from docs/PROTOCOL.md (and
docs/MODEL.md "Seeded noise" and "Samplers", which it links to for values on
the wire) alone: raw pyzmq and msgpack, nothing of clients/python or of
tests/spec_client.py, as a user or an outside test team writes one. It
drives a live broker and the workers behind it the way the document tells a
client and a trainer to, and prints one PASS or FAIL line per promise the
document makes; a FAIL is a place where the daemons and the document
disagree.

    protocol_cleanroom.py --clients EP --workers NAME,NAME --v2 FILE --v3 FILE
                          [--for SECONDS]

EP: the broker's client endpoint, with the workers NAME,NAME behind it, each
serving the tiny model at version 1 (no sync applied yet) with one slot
(--streams 1 --max-inflight 1), the broker started with --max-held-mb 1 and
--weights-dir (tests/cli_protocol_cleanroom.sh starts them). FILE --v2:
other tiny weights inside the workers' weights directory (published by
path as version 2); --v3: more, outside it (uploaded by value as version
3, and named by path to be refused). Every wait is bounded; the whole run
within --for seconds. Exit 0 when it ran to its end (the verdicts are in
the lines), 1 when it ran out of time, 2 on a bad argument.
"""

import argparse
import hashlib
import math
import os
import re
import struct
import sys
import time

import msgpack
import zmq

PROTO = "reel/1"
M32 = 0xFFFFFFFF
FINAL = ("RESULT", "ERROR", "BUSY")
C, F, H, W = 4, 1, 8, 8          # a tiny latent: C = in_channels 4, H, W multiples of patch 2
T = 32                           # the tiny model's text_dim
LONG = {"steps": 10000, "latent_shape": [C, 1, 32, 32]}   # a GEN that runs for seconds: cancelled, never awaited
CODES = {"malformed", "too_large", "proto_mismatch", "unknown_type", "bad_request", "busy",
         "stale_version", "no_worker", "timeout", "worker_lost", "cancelled", "forbidden",
         "standby", "shutdown", "internal"}

npass = 0
nfail = 0
END = 0.0


def check(cond, what, detail=""):
    global npass, nfail
    if cond:
        npass += 1
        print("PASS " + what, flush=True)
    else:
        nfail += 1
        print("FAIL " + what + (": " + str(detail) if detail != "" else ""), flush=True)
    return cond


def left():
    return END - time.monotonic()


class OutOfTime(Exception):
    pass


# ---- values -----------------------------------------------------------------

def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bytes(vals):
    return struct.pack("<%df" % len(vals), *vals)


def f32_list(buf):
    return list(struct.unpack("<%df" % (len(buf) // 4), buf))


def philox(ctr, key):
    """Philox4x32-10 (docs/MODEL.md "Seeded noise")."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def philox_normal(seed, step, j):
    r = philox((j & M32, j >> 32, step, 0x5245454C), (seed & M32, seed >> 32))
    u1 = (r[0] + 1) / 2.0 ** 32
    u2 = r[1] / 2.0 ** 32
    return f32(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2))


def seeded_latent(seed, n=C * F * H * W):
    return [philox_normal(seed, 0xFFFFFFFF, j) for j in range(n)]


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h or 1


def splitmix64(x):
    m = 0xFFFFFFFFFFFFFFFF
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def is_uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_hash(v):
    return isinstance(v, str) and re.fullmatch(r"[0-9a-fA-F]{1,16}", v) is not None


def is_name(v):
    return isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_.:+-]{1,63}", v) is not None


# ---- the wire ---------------------------------------------------------------

def tensor(name, shape, data, dtype="F32"):
    return {"name": name, "dtype": dtype, "shape": list(shape), "bytes": len(data)}, data


class Peer:
    """One DEALER to the broker's client endpoint: no delimiter frame,
    linger 0, ZMQ_MAXMSGSIZE 512 MiB (docs/PROTOCOL.md "Sockets")."""

    def __init__(self, ctx, ep, routing_id=None):
        self.s = ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        if routing_id:
            self.s.setsockopt(zmq.ROUTING_ID, routing_id.encode())
        self.s.setsockopt(zmq.MAXMSGSIZE, 512 << 20)
        self.s.connect(ep)
        self.kept = []    # messages read while waiting for others

    def close(self):
        self.s.close(0)

    def send(self, typ, mid=None, tensors=(), **fields):
        h = {"proto": PROTO, "type": typ}
        if mid is not None:
            h["id"] = mid
        h.update(fields)
        if tensors:
            h["tensors"] = [d for d, _ in tensors]
        self.s.send_multipart([msgpack.packb(h, use_bin_type=True)] + [b for _, b in tensors])

    def send_raw(self, frames):
        self.s.send_multipart(frames)

    def recv(self, timeout):
        """The next message (header, {name: (descriptor, bytes)}) within
        timeout seconds, else None."""
        if self.kept:
            return self.kept.pop(0)
        timeout = min(timeout, max(left(), 0.0))
        if self.s.poll(int(timeout * 1000)) == 0:
            if left() <= 0:
                raise OutOfTime()
            return None
        return decode_reply(self.s.recv_multipart())

    def wait(self, pred, timeout):
        """The first message pred accepts within timeout; the others read
        meanwhile are kept for later waits."""
        end = time.monotonic() + timeout
        seen = []
        try:
            while True:
                for i, m in enumerate(self.kept):
                    if pred(m):
                        del self.kept[i]
                        return m
                t = end - time.monotonic()
                if t <= 0:
                    return None
                for tick in TICKS:
                    tick()
                if self.s.poll(int(min(t, max(left(), 0.0), 0.05) * 1000) + 1) == 0:
                    if left() <= 0:
                        raise OutOfTime()
                    continue
                m = decode_reply(self.s.recv_multipart())
                if pred(m):
                    return m
                seen.append(m)
        finally:
            self.kept.extend(seen)

    def ask(self, typ, mid, timeout=5.0, tensors=(), **fields):
        """Sends one message and returns the first answer carrying its id."""
        self.send(typ, mid, tensors, **fields)
        return self.wait(lambda m: m[0].get("id", 0) == (mid or 0), timeout)

    def final(self, mid, timeout):
        """Every message of id mid up to its final one: (progress list, final)."""
        prog = []
        end = time.monotonic() + timeout
        while True:
            m = self.wait(lambda m: m[0].get("id", 0) == mid, end - time.monotonic())
            if m is None:
                return prog, None
            if m[0].get("type") == "PROGRESS":
                prog.append(m[0])
                continue
            return prog, m


wire_faults = []
TICKS = []    # called while any wait polls: a worker of this client's own keeps its heartbeats


def decode_reply(frames):
    """A reply as the document says every message is: a msgpack map header
    of valid UTF-8 strings with proto, type and a uint id, then one frame per
    tensor descriptor, each of the bytes it announces."""
    try:
        h = msgpack.unpackb(frames[0], raw=False, strict_map_key=True)
    except Exception as e:
        wire_faults.append("a reply header that is not strict msgpack with UTF-8 strings (%s)" % e)
        return {"type": "?"}, {}
    if not isinstance(h, dict):
        wire_faults.append("a reply header that is not a map")
        return {"type": "?"}, {}
    if h.get("proto") != PROTO:
        wire_faults.append("a %s whose proto is %r" % (h.get("type"), h.get("proto")))
    if not isinstance(h.get("type"), str):
        wire_faults.append("a reply without a string type")
    if "id" in h and not is_uint(h["id"]):
        wire_faults.append("a %s whose id is %r" % (h.get("type"), h["id"]))
    descs = h.get("tensors", [])
    ts = {}
    if len(descs) != len(frames) - 1:
        wire_faults.append("a %s with %d tensor descriptors and %d frames" % (h.get("type"), len(descs), len(frames) - 1))
    size = {"F32": 4, "BF16": 2, "F16": 2, "U8": 1}
    for d, b in zip(descs, frames[1:]):
        n = size.get(d.get("dtype"), 0)
        for x in d.get("shape", []):
            n *= x
        if n != d.get("bytes") or n != len(b):
            wire_faults.append("%s tensor %s: %s bytes for shape %s, frame %d" % (h.get("type"), d.get("name"), d.get("bytes"), d.get("shape"), len(b)))
        ts[d.get("name")] = (d, b)
    return h, ts


def is_error(m, code, mid=None):
    return m is not None and m[0].get("type") == "ERROR" and m[0].get("code") == code and \
        (mid is None or m[0].get("id", 0) == mid)


def show(m):
    if m is None:
        return "no answer"
    h = dict(m[0])
    h.pop("proto", None)
    if m[1]:
        h["tensors"] = {k: v[0]["shape"] for k, v in m[1].items()}
    s = repr(h)
    return s if len(s) < 400 else s[:400] + "..."


def ctx_tensor(rows=3, seed=1, name="context", width=T):
    vals = [f32(math.sin(0.37 * (i + 1) * (seed + 1))) for i in range(rows * width)]
    return tensor(name, [rows, width], f32_bytes(vals))


def gen_fields(**kw):
    f = {"model": "tiny", "steps": 3, "latent_shape": [C, F, H, W], "seed": 1}
    f.update(kw)
    return f


# ---- the checks -------------------------------------------------------------

class Run:
    def __init__(self, args):
        self.ctx = zmq.Context()
        self.ep = args.clients
        self.workers = sorted(args.workers.split(","))
        self.args = args
        self.c = self.peer()
        self.next_id = 1000

    def peer(self):
        return Peer(self.ctx, self.ep)

    def nid(self):
        self.next_id += 1
        return self.next_id

    def status(self, p=None):
        p = p or self.c
        mid = self.nid()
        m = p.ask("STATUS", mid, 5.0)
        return m[0] if m and m[0].get("type") == "STATUS_REPLY" else None

    def gen(self, p=None, tensors=None, timeout=20.0, **kw):
        """One GEN, its PROGRESS and its final answer."""
        p = p or self.c
        mid = self.nid()
        if tensors is None:
            tensors = [ctx_tensor()]
        p.send("GEN", mid, tensors, **gen_fields(**kw))
        prog, fin = p.final(mid, timeout)
        return mid, prog, fin

    # -- STATUS ---------------------------------------------------------------
    def t_status(self):
        m = self.c.ask("STATUS", 77)
        check(m is not None and m[0].get("type") == "STATUS_REPLY" and m[0].get("id") == 77,
              "STATUS id 77 is answered STATUS_REPLY carrying id 77", show(m))
        self.c.send("STATUS")
        m2 = self.c.wait(lambda m: m[0].get("type") == "STATUS_REPLY", 5.0)
        check(m2 is not None and m2[0].get("id", 0) == 0, "a STATUS without id is answered with id 0", show(m2))
        if m is None:
            return
        s = m[0]
        uints = ["queue", "queue_max", "malformed", "catalog_dropped", "catalog_failures", "catalog_pending",
                 "undelivered", "replies_suppressed", "auth_refused", "requests_ok", "requests_failed",
                 "steps_replayed", "steps_eager", "steps_captured"]
        bad = [k for k in uints if not is_uint(s.get(k))]
        check(not bad, "STATUS_REPLY carries every uint field the document lists (%d)" % len(uints),
              "absent or not a uint: %s" % bad)
        for k in ("worker_refused", "progress_dropped", "auth_refused_peers", "auth_refused_recent",
                  "ha_state", "ha_role", "ha_term", "ha_peer"):
            check(k not in s, "STATUS_REPLY leaves out %s (absent while 0 or empty, or from a broker alone)" % k,
                  "it has %s = %r" % (k, s.get(k)))
        check(s.get("versions") == {} and s.get("pending") == {},
              "STATUS versions and pending are empty maps before any sync", (s.get("versions"), s.get("pending")))
        check(is_hash(s.get("boot")), "STATUS boot is a hash (1..16 hex digits)", s.get("boot"))
        self.boot = s.get("boot")
        ws = s.get("workers")
        check(isinstance(ws, list) and sorted(w.get("name") for w in ws) == self.workers,
              "STATUS workers lists the live workers %s" % self.workers, ws)
        for w in ws or []:
            want = {"name": is_name, "device": lambda v: isinstance(v, str), "arch": lambda v: isinstance(v, str),
                    "streams": is_uint, "inflight": is_uint, "max_inflight": is_uint,
                    "routable": lambda v: isinstance(v, bool),
                    "versions": lambda v: isinstance(v, dict) and all(is_uint(x) for x in v.values()),
                    "lagging": lambda v: v == {}, "keys": lambda v: isinstance(v, list) and all(is_hash(x) for x in v),
                    "alive_ms": is_uint}
            bad = [k for k, ok in want.items() if not ok(w.get(k))]
            check(not bad, "STATUS worker %s has every field the document lists, typed as it says" % w.get("name"),
                  "absent or mistyped: %s in %r" % (bad, w))
            check("text_encoder" not in w and "vae" not in w,
                  "STATUS worker %s leaves out text_encoder and vae (its READY named none)" % w.get("name"), w)
            check(w.get("versions") == {"transformer": 1} and w.get("streams") == 1 and w.get("max_inflight") == 1,
                  "STATUS worker %s: versions {transformer: 1}, streams 1, max_inflight 1 as started" % w.get("name"), w)
        ms = s.get("models")
        tiny = [x for x in ms or [] if isinstance(x, dict) and x.get("name") == "tiny"]
        check(len(tiny) == 1 and tiny[0].get("in_channels") == C and tiny[0].get("text_dim") == T
              and tiny[0].get("patch") == 2 and is_uint(tiny[0].get("layers")) and tiny[0].get("text_len", 0) == 0,
              "STATUS models has tiny: in_channels 4, text_dim 32, patch 2, layers, no text_len", ms)
        m = self.c.ask("STATUS", 78, tensors=[ctx_tensor()])
        check(is_error(m, "bad_request", 78), "a STATUS with tensors is ERROR bad_request with its id", show(m))

    # -- GEN ------------------------------------------------------------------
    def t_gen(self):
        mid, prog, fin = self.gen(progress=True, steps=4, seed=5)
        ok = fin is not None and fin[0].get("type") == "RESULT"
        check(ok, "a GEN (context, seed, progress) is answered RESULT with its id", show(fin))
        steps = [(p.get("step"), p.get("steps")) for p in prog]
        check(len(prog) >= 1 and all(is_uint(a) and b == 4 for a, b in steps)
              and all(steps[i][0] <= steps[i + 1][0] for i in range(len(steps) - 1)) and steps[-1][0] == 4,
              "its PROGRESS carry step (never going back, the last = steps) and steps 4, before the RESULT", steps)
        check(all("decoded" not in p and "decode_frames" not in p for p in prog),
              "PROGRESS of a GEN whose output is its latent carry no decoded, decode_frames", prog)
        if not ok:
            return
        r, ts = fin
        check(r.get("version") == 1 and r.get("first_version", r.get("version")) == 1,
              "RESULT version (and first_version, default version) 1: the workers' startup version", r)
        st = r.get("stats")
        st_ok = isinstance(st, dict) and all(is_uint(st.get(k)) for k in ("captured", "replayed", "eager")) and \
            isinstance(st.get("declines"), dict) and all(is_uint(v) for v in st["declines"].values()) and \
            is_num(st.get("seconds")) and all(is_uint(st.get(k, 0)) for k in ("batched", "batch_rows", "padded_rows")) \
            and ("capture_key" not in st or is_hash(st["capture_key"]))
        check(st_ok, "RESULT stats: captured, replayed, eager (uints), declines {name: uint}, seconds", st)
        check(st_ok and st["captured"] + st["replayed"] + st["eager"] == 4,
              "RESULT stats count each of its 4 steps once (captured + replayed + eager)", st)
        check(r.get("worker") in self.workers, "RESULT worker names a live worker", r.get("worker"))
        check(is_hash(r.get("key_hash")), "RESULT key_hash is a hash", r.get("key_hash"))
        check(r.get("version_runs") == [{"from": 0, "version": 1}], "RESULT version_runs [{from 0, version 1}]",
              r.get("version_runs"))
        check(r.get("boot") == self.boot, "RESULT boot is STATUS boot", (r.get("boot"), self.boot))
        check(all(is_num(r.get(k, 0)) for k in ("encode_seconds", "decode_seconds")),
              "RESULT encode_seconds, decode_seconds numbers when present", r)
        check("n" not in r and "seeds" not in r, "a single GEN's RESULT has no n, seeds", r)
        lt = ts.get("latent")
        check(list(ts) == ["latent"] and lt[0]["dtype"] == "F32" and lt[0]["shape"] == [C, F, H, W],
              "RESULT carries latent F32 [C,F,H,W] and no other tensor", {k: v[0] for k, v in ts.items()})
        if is_hash(r.get("key_hash")):
            kh = int(r["key_hash"], 16)
            owner = max(self.workers, key=lambda n: splitmix64(kh ^ fnv1a64(n)))
            check(r.get("worker") == owner,
                  "the rendezvous owner of key_hash runs it: max splitmix64(key ^ fnv1a64(name)) is %s" % owner,
                  r.get("worker"))
        mid2, prog2, fin2 = self.gen(progress=False, steps=4, seed=5)
        check(fin2 is not None and not prog2, "a GEN with progress false gets no PROGRESS", prog2)
        check(fin2 is not None and fin2[1].get("latent", (0, 1))[1] == lt[1],
              "the same GEN again gives the bitwise same latent (deterministic)", show(fin2))
        # the seeded x_0 and the trajectory
        mid3, _, fin3 = self.gen(steps=4, seed=5, return_trajectory=True, return_timesteps=True)
        ok3 = fin3 is not None and fin3[0].get("type") == "RESULT"
        check(ok3, "a GEN with return_trajectory and return_timesteps is answered RESULT", show(fin3))
        if ok3:
            ts3 = fin3[1]
            tr = ts3.get("trajectory")
            check(tr is not None and tr[0]["shape"] == [5, C, F, H, W] and tr[0]["dtype"] == "F32",
                  "its trajectory is F32 [N+1,C,F,H,W]", tr and tr[0])
            tm = ts3.get("timesteps")
            check(tm is not None and tm[0]["shape"] == [4] and tm[0]["dtype"] == "F32",
                  "its timesteps is F32 [N]", tm and tm[0])
            if tm is not None and tm[0]["shape"] == [4]:
                want = [f32(1000.0 * f32(1.0 - i / 4.0)) for i in range(4)]
                check(f32_list(tm[1]) == want, "timesteps are 1000 sigma_i of Euler's schedule (shift 1)",
                      (f32_list(tm[1]), want))
            if tr is not None and tr[0]["shape"] == [5, C, F, H, W]:
                n = C * F * H * W
                x = f32_list(tr[1])
                x0 = seeded_latent(5)
                check(x[:n] == x0, "trajectory[0], x_0, is philox_normal(seed, 0xFFFFFFFF, j) (MODEL.md)",
                      (x[:3], x0[:3]))
                check(tr[1][-4 * n:] == lt[1], "trajectory[N] is the RESULT latent", "")
                check(ts3["latent"][1] == lt[1], "asking for a trajectory does not change the latent", "")
            # a latent sent is x_0 itself
            lat = tensor("latent", [C, F, H, W], f32_bytes(seeded_latent(5)))
            _, _, fin4 = self.gen(steps=4, seed=999, tensors=[ctx_tensor(), lat])
            check(fin4 is not None and fin4[1].get("latent", (0, 1))[1] == lt[1],
                  "a GEN sending the drawn x_0 as latent gives the seeded GEN's bits", show(fin4))

    def t_cfg(self):
        _, _, a = self.gen(steps=3, seed=2)
        _, _, b = self.gen(steps=3, seed=2, cfg=4.0, tensors=[ctx_tensor(), ctx_tensor(3, 9, "uncond")])
        check(b is not None and b[0].get("type") == "RESULT", "a GEN with uncond [L,T] and cfg 4 is answered RESULT",
              show(b))
        check(a is not None and b is not None and b[0].get("type") == "RESULT" and
              a[1]["latent"][1] != b[1]["latent"][1], "CFG changes the latent", "")
        _, _, e = self.gen(steps=3, cfg=4.0, tensors=[ctx_tensor(), ctx_tensor(2, 9, "uncond")])
        check(is_error(e, "bad_request") and "uncond" in e[0].get("message", ""),
              "an uncond of another length L than the context's, for a model without text_len, is bad_request", show(e))
        _, _, e = self.gen(steps=3, cfg=4.0, tensors=[ctx_tensor(), ctx_tensor(3, 9, "uncond", 16)])
        check(is_error(e, "bad_request") and "uncond" in e[0].get("message", ""),
              "an uncond of another width than the context's T is bad_request naming uncond", show(e))

    def t_sde(self):
        _, _, r = self.gen(steps=3, seed=3, sde=True, eta=0.7, shift=3.0, return_log_probs=True,
                           return_means=True, return_timesteps=True)
        ok = r is not None and r[0].get("type") == "RESULT"
        check(ok, "an SDE GEN with return_log_probs, return_means, return_timesteps is answered RESULT", show(r))
        if ok:
            ts = r[1]
            shapes = {k: v[0]["shape"] for k, v in ts.items()}
            want = {"latent": [C, F, H, W], "log_probs": [3], "means": [3, C, F, H, W], "sigmas": [4], "timesteps": [3]}
            check(shapes == want, "its tensors: latent, log_probs [N], means [N,C,F,H,W], sigmas [N+1], timesteps [N]",
                  shapes)
            if "sigmas" in ts and ts["sigmas"][0]["shape"] == [4]:
                S = 3.0
                sig = [f32(S * u / (1 + (S - 1) * u)) for u in (1.0, 2 / 3.0, 1 / 3.0, 0.0)]
                check(f32_list(ts["sigmas"][1]) == sig, "sigmas are Euler's schedule S u / (1 + (S-1) u), shift 3",
                      (f32_list(ts["sigmas"][1]), sig))
            if "log_probs" in ts:
                check(all(math.isfinite(v) for v in f32_list(ts["log_probs"][1])), "log_probs are finite", "")
        _, _, e = self.gen(steps=3, return_log_probs=True)
        check(is_error(e, "bad_request"), "return_log_probs without sde is bad_request", show(e))
        _, _, e = self.gen(steps=3, sde=True, eta=0.0, return_means=True)
        check(is_error(e, "bad_request"), "return_means with sde and eta 0 is bad_request", show(e))
        _, _, e = self.gen(steps=3, sde=False, eta=-1.0)
        check(e is not None and e[0].get("type") == "RESULT",
              "eta out of its range is not read without sde (RESULT)", show(e))
        _, _, e = self.gen(steps=3, sde=False, eta="x")
        check(is_error(e, "bad_request") and "eta" in e[0].get("message", ""),
              "eta must be a number even without sde (bad_request naming eta)", show(e))

    def t_group(self):
        _, _, r = self.gen(steps=3, n=3, seeds=[11, 12, 13])
        ok = r is not None and r[0].get("type") == "RESULT"
        check(ok, "a group GEN (n 3, seeds) is answered one RESULT", show(r))
        if ok:
            check(r[0].get("n") == 3 and r[0].get("seeds") == [11, 12, 13], "its RESULT has n 3 and seeds", r[0])
            lt = r[1].get("latent")
            check(lt is not None and lt[0]["shape"] == [3, C, F, H, W], "its latent is [n,C,F,H,W]", lt and lt[0])
            _, _, one = self.gen(steps=3, seed=12)
            n = C * F * H * W * 4
            check(lt is not None and one is not None and one[0].get("type") == "RESULT" and
                  lt[1][n:2 * n] == one[1]["latent"][1],
                  "sample 1 of the group is bitwise the single GEN of seed 12", show(one))
        _, _, r = self.gen(steps=2, n=3, seed=40)
        check(r is not None and r[0].get("seeds") == [40, 41, 42], "a group without seeds has seeds seed + i", show(r))
        _, _, e = self.gen(steps=2, n=3, seeds=[1, 2])
        check(is_error(e, "bad_request") and "seeds" in e[0].get("message", ""),
              "n 3 with 2 seeds is bad_request naming seeds", show(e))
        _, _, e = self.gen(steps=2, n=2, seeds=[])
        check(is_error(e, "bad_request"), "an empty seeds array is bad_request", show(e))
        _, _, e = self.gen(steps=2, n=65)
        check(is_error(e, "bad_request") and "'n'" in e[0].get("message", ""), "n 65 is bad_request naming n", show(e))
        _, _, r = self.gen(steps=2, n=1, seeds=[12])
        check(r is not None and r[0].get("type") == "RESULT" and "n" not in r[0] and
              r[1]["latent"][0]["shape"] == [C, F, H, W], "n 1 is a single sample: latent [C,F,H,W], no n", show(r))

    def t_solvers(self):
        for s in ("unipc", "dpm++", "euler"):
            _, _, r = self.gen(steps=3, solver=s)
            check(r is not None and r[0].get("type") == "RESULT", "solver %s is answered RESULT" % s, show(r))
        _, _, r = self.gen(steps=3, solver="unipc", return_timesteps=True, shift=1.0)
        if r is not None and "timesteps" in r[1]:
            # N values of linspace(0.999, 0, N+1)[:N], shift 1; t = floor(1000 sigma) of the double
            sig = [0.99900001287460327 * (1 - i / 3.0) for i in range(3)]
            want = [f32(float(math.floor(1000.0 * s))) for s in sig]
            check(f32_list(r[1]["timesteps"][1]) == want, "unipc timesteps are floor(1000 sigma_i) (MODEL.md Samplers)",
                  (f32_list(r[1]["timesteps"][1]), want))
        _, _, e = self.gen(steps=3, solver="rk4")
        check(is_error(e, "bad_request") and "solver" in e[0].get("message", ""),
              "an unknown solver is bad_request naming solver", show(e))

    def t_in_flight(self):
        ids = {}
        for k in range(6):
            mid = self.nid()
            ids[mid] = 20 + k
            self.c.send("GEN", mid, [ctx_tensor()], **gen_fields(seed=20 + k, steps=2, progress=True))
        finals = {}
        end = time.monotonic() + 30
        while len(finals) < len(ids) and time.monotonic() < end:
            m = self.c.wait(lambda m: m[0].get("id") in ids and m[0].get("type") in FINAL, end - time.monotonic())
            if m is None:
                break
            finals.setdefault(m[0]["id"], []).append(m)
        check(len(finals) == 6 and all(len(v) == 1 and v[0][0]["type"] == "RESULT" for v in finals.values()),
              "6 GENs in flight on one connection: each gets one RESULT, with its own id",
              {k: [x[0]["type"] for x in v] for k, v in finals.items()})
        lat = {finals[k][0][1]["latent"][1] for k in finals if finals[k][0][0]["type"] == "RESULT"}
        check(len(lat) == len(finals), "their 6 seeds gave 6 different latents", len(lat))
        # nothing more for them (a STATUS behind them as a marker)
        self.status()
        extra = [m for m in self.c.kept if m[0].get("id") in ids and m[0].get("type") != "PROGRESS"]
        self.c.kept = [m for m in self.c.kept if m[0].get("id") not in ids]
        check(not extra, "no second final answer for any of them", [show(m) for m in extra])

    def t_waits(self):
        t0 = time.monotonic()
        _, _, e = self.gen(steps=2, model="nosuch", deadline_ms=400, timeout=10)
        check(is_error(e, "no_worker"), "a GEN of a model no worker serves ends no_worker at its deadline_ms", show(e))
        check(time.monotonic() - t0 < 9, "... well before the broker's default deadline", time.monotonic() - t0)
        _, _, e = self.gen(steps=2, version=99, deadline_ms=400, timeout=10)
        check(is_error(e, "no_worker"), "a GEN needing version 99 (none has it) ends no_worker at its deadline", show(e))
        _, _, e = self.gen(steps=2, output="frames", deadline_ms=400, timeout=10)
        check(is_error(e, "no_worker"), "output frames with no VAE worker live ends no_worker at its deadline", show(e))
        _, _, e = self.gen(steps=2, output="gif")
        check(is_error(e, "bad_request") and "output" in e[0].get("message", ""),
              "output gif is bad_request naming output", show(e))
        _, _, e = self.gen(steps=2, prompt="a cat", tensors=[])
        check(is_error(e, "bad_request") and "prompt" in e[0].get("message", ""),
              "a prompt for the tiny model (no text_len) is bad_request (\"takes no 'prompt'\")", show(e))
        _, _, e = self.gen(steps=2, prompt="a cat")
        check(is_error(e, "bad_request"), "prompt with a context is bad_request", show(e))
        _, _, e = self.gen(steps=2, negative_prompt="blur")
        check(is_error(e, "bad_request") and "negative_prompt" in e[0].get("message", ""),
              "negative_prompt without prompt is bad_request naming it", show(e))

    def t_cancel(self):
        a = self.peer()
        b = self.peer()
        try:
            # a running GEN, cancelled by its own connection
            mid = self.nid()
            a.send("GEN", mid, [ctx_tensor()], **gen_fields(seed=60, progress=True, **LONG))
            p = a.wait(lambda m: m[0].get("id") == mid, 10)
            check(p is not None and p[0].get("type") == "PROGRESS", "a long GEN reports PROGRESS", show(p))
            # another connection without the token names nothing
            b.send("CANCEL", mid)
            st = self.status(b)
            check(st is not None, "a CANCEL from another connection gets no reply of its own (STATUS answered next)", st)
            # a STATUS on the GEN's connection drains what was sent it before
            # the CANCEL was read: a PROGRESS after that one is newer
            self.status(a)
            fins = [m for m in a.kept if m[0].get("id") == mid and m[0].get("type") in FINAL]
            a.kept = [m for m in a.kept if m[0].get("id") != mid]
            p2 = a.wait(lambda m: m[0].get("id") == mid, 10)
            check(not fins and p2 is not None and p2[0].get("type") == "PROGRESS",
                  "... and names nothing: the GEN runs on", (show(p2), [show(m) for m in fins]))
            a.send("CANCEL", mid)
            _, fin = a.final(mid, 10)
            check(is_error(fin, "cancelled", mid) and "cancelled by its client" in fin[0].get("message", ""),
                  "CANCEL of a running GEN: ERROR cancelled with its id, \"cancelled by its client ...\"", show(fin))
            # nothing after the final answer
            st = self.status(a)
            late = [m for m in a.kept if m[0].get("id") == mid]
            a.kept = []
            check(not late, "nothing comes for a GEN after its ERROR cancelled", [show(m) for m in late])
            # a token names it from any connection; a queued one never starts
            tok = "c1ea2100"
            m1, m2 = self.nid(), self.nid()
            a.send("GEN", m1, [ctx_tensor()], **gen_fields(seed=61, progress=True, client=tok, **LONG))
            p = a.wait(lambda m: m[0].get("id") == m1, 10)
            a.send("GEN", m2, [ctx_tensor()], **gen_fields(seed=61, progress=True, client=tok, **LONG))
            st = self.status(a)
            q = [m for m in a.kept if m[0].get("id") == m2]
            check(st is not None and st.get("queue", 0) >= 1 and not q,
                  "a second GEN of the same key waits in the queue (its owner has one slot)", (st and st.get("queue"), q))
            b.send("CANCEL", m2, client="C1EA2100")
            _, fin = a.final(m2, 10)
            check(is_error(fin, "cancelled", m2) and "had not started" in fin[0].get("message", ""),
                  "a CANCEL with the client token (any case) from another connection ends the queued one: "
                  "\"(it had not started)\", to the GEN's connection", show(fin))
            b.send("CANCEL", m1, client="0badc0de")
            self.status(b)
            a.send("CANCEL", m1, client="0badc0de")
            st = self.status(a)
            got = [m for m in a.kept if m[0].get("id") == m1 and m[0].get("type") != "PROGRESS"]
            check(not got, "a CANCEL with another token names nothing, on either connection", [show(m) for m in got])
            a.send("CANCEL", m1)
            _, fin = a.final(m1, 10)
            check(is_error(fin, "cancelled", m1), "a tokenless CANCEL from the GEN's connection ends its token GEN",
                  show(fin))
            # unknown id, bad CANCELs
            a.kept = []
            a.send("CANCEL", 987654)
            m = a.ask("STATUS", 31)
            check(m is not None and m[0].get("type") == "STATUS_REPLY",
                  "a CANCEL of an unknown id is ignored: no reply, the next answer is the STATUS's", show(m))
            m = a.ask("CANCEL", 32, client=12)
            check(is_error(m, "bad_request", 32) and "client" in m[0].get("message", ""),
                  "a CANCEL whose client is not a hash is ERROR bad_request naming client", show(m))
            m = a.ask("CANCEL", 33, tensors=[ctx_tensor()])
            check(is_error(m, "bad_request", 33), "a CANCEL with tensors is ERROR bad_request", show(m))
        finally:
            a.close()
            b.close()

    def t_resend(self):
        a = self.peer()
        b = self.peer()
        try:
            tok = "5e11d"
            mid = 4242
            a.send("GEN", mid, [ctx_tensor()], **gen_fields(seed=70, progress=True, client=tok, **LONG))
            p = a.wait(lambda m: m[0].get("id") == mid, 10)
            check(p is not None and p[0].get("type") == "PROGRESS", "a token GEN runs", show(p))
            m = b.ask("GEN", mid, 10, [ctx_tensor()], **gen_fields(seed=71, client=tok, **LONG))
            check(is_error(m, "bad_request", mid) and "'seed' differs" in m[0].get("message", ""),
                  "a resend of a live (client, id) asking another seed is bad_request \"its 'seed' differs\"", show(m))
            b.send("GEN", mid, [ctx_tensor()], **gen_fields(seed=70, client="00" + tok.upper(), progress=False,
                                                          deadline_ms=5000, **LONG))
            p = b.wait(lambda m: m[0].get("id") == mid, 10)
            check(p is not None and p[0].get("type") == "PROGRESS",
                  "the same GEN resent from another connection attaches: its PROGRESS (the live one's) come there",
                  show(p))
            self.status(a)
            a.kept = []
            b.send("CANCEL", mid, client=tok)
            _, fin = b.final(mid, 10)
            check(is_error(fin, "cancelled", mid), "its final answer comes to the resend's connection "
                  "(token 005E11D is 5e11d: tokens compare as numbers)", show(fin))
            st = self.status(a)
            got = [m for m in a.kept if m[0].get("id") == mid and m[0].get("type") in FINAL]
            check(st is not None and not got, "... and not to the first connection", [show(x) for x in got])
            # two live tokenless GENs of one id on one connection both run; each CANCEL stops one
            a.kept = []
            a.send("GEN", 77, [ctx_tensor()], **gen_fields(seed=72, progress=True, **LONG))
            a.send("GEN", 77, [ctx_tensor()], **gen_fields(seed=73, **LONG))
            p = a.wait(lambda m: m[0].get("id") == 77, 10)
            a.send("CANCEL", 77, client="77")
            st = self.status(a)
            got = [m for m in a.kept if m[0].get("id") == 77 and m[0].get("type") in FINAL]
            check(p is not None and not got, "a CANCEL with a token names nothing for a tokenless GEN, even on "
                  "its own connection", [show(x) for x in got])
            a.send("CANCEL", 77)
            f1 = a.wait(lambda m: m[0].get("id") == 77 and m[0].get("type") in FINAL, 10)
            a.send("CANCEL", 77)
            f2 = a.wait(lambda m: m[0].get("id") == 77 and m[0].get("type") in FINAL, 10)
            check(is_error(f1, "cancelled", 77) and is_error(f2, "cancelled", 77),
                  "two live tokenless GENs of one id both run; a CANCEL stops one, a second the other",
                  (show(f1), show(f2)))
            # an answered (client, id) is forgotten: sent again, it runs again
            for k in range(2):
                a.send("GEN", 78, [ctx_tensor()], **gen_fields(steps=2, client=tok))
                _, fin = a.final(78, 10)
                check(fin is not None and fin[0].get("type") == "RESULT",
                      "a (client, id) already answered, sent again, is a new request (%d)" % k, show(fin))
        finally:
            a.close()
            b.close()

    def t_more(self):
        st0 = self.status()
        mid = 2 ** 64 - 1
        self.c.send("GEN", mid, [ctx_tensor()], **gen_fields(steps=2, deadline_ms=2 ** 40, extra={"x": [1]}))
        _, r = self.c.final(mid, 20)
        check(r is not None and r[0].get("type") == "RESULT" and r[0].get("id") == mid,
              "id 2^64-1, deadline_ms 2^40 (clamped) and unknown fields: RESULT with that id", show(r))
        d, b = ctx_tensor()
        d = dict(d, note="x")
        _, _, r = self.gen(steps=2, tensors=[(d, b)])
        check(r is not None and r[0].get("type") == "RESULT", "an unknown key in a tensor descriptor is ignored",
              show(r))
        kh = r[0].get("key_hash") if r else None
        st = self.status()
        owner = [w for w in (st or {}).get("workers", []) if w.get("name") == (r[0].get("worker") if r else None)]
        check(owner and kh in owner[0].get("keys", []), "STATUS keys of the worker that ran it hold its key_hash",
              (kh, owner))
        if st0 and st:
            check(st["requests_ok"] - st0["requests_ok"] == 2 and st["requests_failed"] == st0["requests_failed"],
                  "STATUS requests_ok counts the 2 RESULTs", (st0["requests_ok"], st["requests_ok"]))
            steps = sum(st[k] - st0[k] for k in ("steps_replayed", "steps_eager", "steps_captured"))
            check(steps == 4, "STATUS steps_replayed + steps_eager + steps_captured grew by their 4 steps", steps)
        # a running request past its deadline
        _, _, e = self.gen(deadline_ms=300, timeout=15, **LONG)
        check(is_error(e, "timeout"), "a GEN still running at its deadline_ms ends ERROR timeout", show(e))
        st2 = self.status()
        if st and st2:
            check(st2["requests_failed"] - st["requests_failed"] == 1 and st2["requests_ok"] == st["requests_ok"],
                  "STATUS requests_failed counts it", (st["requests_failed"], st2["requests_failed"]))
        # the worker's bound and the size rules
        _, _, e = self.gen(steps=2, latent_shape=[C, 1, 1024, 1024], tensors=[ctx_tensor()])
        check(is_error(e, "too_large") and "token" in e[0].get("message", ""),
              "a sample of 262144 tokens, past every worker's --max-tokens 65536: ERROR too_large", show(e))
        _, _, e = self.gen(steps=2, n=64, latent_shape=[C, 1, 512, 520])
        check(is_error(e, "too_large"), "a group whose n latents exceed 256 MiB: ERROR too_large", show(e))
        _, _, e = self.gen(steps=2, output="frames", latent_shape=[C, 9, 1024, 1024])
        check(is_error(e, "too_large"), "decoded frames past one 512 MiB frame: ERROR too_large at once", show(e))
        _, _, e = self.gen(steps=2, latent_shape=[C, 1, 4096, 4098])
        check(is_error(e, "bad_request"), "F x H x W over 2^24 is bad_request", show(e))
        # types a client does not send
        for t in ("HEARTBEAT", "PROGRESS", "RESULT", "SYNC_ACK", "EVENTS", "DISCONNECT", "SYNC_DONE",
                  "STATUS_REPLY", "BUSY", "UPLOAD_ACK", "FETCH_DATA", "REQUEST", "RECONNECT", "PREWARM"):
            p = self.peer()
            m = p.ask(t, 90, 3)
            check(is_error(m, "unknown_type", 90), "%s from a client is ERROR unknown_type" % t, show(m))
            p.close()
        p = self.peer()
        p.send("PEER", 91, state="active", role="primary", term=3)
        m = p.ask("STATUS", 92)
        check(m is not None and m[0].get("type") == "STATUS_REPLY" and not p.kept,
              "a PEER to a broker alone is never answered", [show(m)] + [show(x) for x in p.kept])
        p.close()
        p = self.peer()
        p.send_raw([b"\x83\xa5proto\xa6reel/1\xa2id\x05\xa4type\xa3\xffZ\xfe"])
        m = p.wait(lambda m: True, 5)
        check(is_error(m, "unknown_type", 5) and "\ufffd" in m[0].get("message", ""),
              "a type of invalid UTF-8 is echoed with U+FFFD in valid UTF-8 (unknown_type)", show(m))
        p.close()

    def t_busy(self):
        a = self.peer()
        b = self.peer()
        st0 = self.status()
        try:
            ids = [self.nid() for _ in range(10)]
            a.send("GEN", ids[0], [ctx_tensor()], **gen_fields(seed=80, progress=True, **LONG))
            a.wait(lambda m: m[0].get("id") == ids[0], 10)
            for i in ids[1:]:
                a.send("GEN", i, [ctx_tensor()], **gen_fields(seed=80, **LONG))
            m = a.wait(lambda m: m[0].get("type") in FINAL, 5)
            check(m is not None and m[0].get("type") == "BUSY" and m[0].get("id") == ids[9] and
                  isinstance(m[0].get("message"), str),
                  "a GEN past --queue-max 8 waiting is answered BUSY {message} with its id", show(m))
            st = self.status()
            check(st is not None and st.get("queue") == 8 and st.get("queue_max") == 8,
                  "STATUS queue 8 of queue_max 8", st and (st.get("queue"), st.get("queue_max")))
            w = [x for x in (st or {}).get("workers", []) if x.get("inflight") == 1]
            check(len(w) == 1 and w[0].get("max_inflight") == 1, "STATUS inflight 1 on the owner running it", w)
            mb = self.nid()
            b.send("GEN", mb, [ctx_tensor()], **gen_fields(seed=81, **LONG))
            m = a.wait(lambda m: m[0].get("type") in FINAL, 5)
            check(m is not None and m[0].get("type") == "BUSY" and m[0].get("id") == ids[8],
                  "another client's GEN takes the place of the flooding client's newest waiting one (BUSY)", show(m))
            st = self.status()
            check(st is not None and st.get("queue") == 8, "the queue is still 8", st and st.get("queue"))
            for i in ids[:8]:
                a.send("CANCEL", i)
            b.send("CANCEL", mb)
            got = {}
            end = time.monotonic() + 10
            while len(got) < 9 and time.monotonic() < end:
                for pp in (a, b):
                    m = pp.wait(lambda m: m[0].get("type") in FINAL, 0.2)
                    if m is not None:
                        got[m[0].get("id")] = m[0].get("code")
            check(sorted(got) == sorted(ids[:8] + [mb]) and set(got.values()) == {"cancelled"},
                  "each of the 9 left is answered ERROR cancelled", got)
            st1 = self.status()
            if st0 and st1:
                check(st1["requests_failed"] - st0["requests_failed"] == 9 and st1["requests_ok"] == st0["requests_ok"],
                      "STATUS requests_failed counts the 9 cancelled, not the 2 BUSY",
                      (st0["requests_failed"], st1["requests_failed"]))
        finally:
            a.close()
            b.close()

    def t_values(self):
        _, prog, r = self.gen(steps=2, n=3, seed=90, progress=True)
        st = [(p.get("step"), p.get("steps")) for p in prog]
        check(r is not None and r[0].get("type") == "RESULT" and prog and st[-1][0] == st[-1][1] and
              all(b == st[-1][1] for _, b in st) and st[-1][1] in (2, 6),
              "a group's PROGRESS count its batched steps, the last one the total", st)
        check(r is not None and r[0].get("version_runs") == [{"from": 0, "version": r[0].get("version")}],
              "a group's version_runs: one run from 0", r and r[0].get("version_runs"))
        _, _, e = self.gen(steps=2, n=3, seeds=[1, "2", 3])
        check(is_error(e, "bad_request") and "seeds" in e[0].get("message", ""),
              "a seed that is not a uint is bad_request naming seeds", show(e))
        lat = tensor("latent", [C, F, H, 6], f32_bytes([0.0] * (C * F * H * 6)))
        _, _, e = self.gen(steps=2, tensors=[ctx_tensor(), lat])
        check(is_error(e, "bad_request") and "latent" in e[0].get("message", ""),
              "a latent tensor of another shape than latent_shape is bad_request naming latent", show(e))
        lat = tensor("latent", [C, F, H, W], f32_bytes([0.0] * (C * F * H * W)))
        _, _, e = self.gen(steps=2, n=2, tensors=[ctx_tensor(), lat])
        check(is_error(e, "bad_request") and "latent" in e[0].get("message", ""),
              "a group's latent must be [n,C,F,H,W]: [C,F,H,W] is bad_request naming latent", show(e))
        d, b = ctx_tensor()
        b = f32_bytes([float("nan")]) + b[4:]
        _, _, e = self.gen(steps=2, tensors=[(d, b)])
        check(is_error(e, "bad_request") and "context" in e[0].get("message", ""),
              "a NaN in context is bad_request naming the tensor", show(e))
        _, _, e = self.gen(steps=4, cfg=3e38, tensors=[ctx_tensor(), ctx_tensor(3, 9, "uncond")])
        if e is not None and e[0].get("type") == "RESULT":
            check(all(math.isfinite(v) for v in f32_list(e[1]["latent"][1])),
                  "cfg 3e38: a RESULT never holds NaN or infinity", show(e))
        else:
            check(is_error(e, "bad_request") and "NaN or infinite" in e[0].get("message", "") and
                  "guidance" in e[0].get("message", ""),
                  "cfg 3e38 overflows the loop: bad_request \"the loop's result holds NaN or infinite values...\" "
                  "naming the guidance scale", show(e))
        _, _, e = self.gen(steps=2, cfg=1e39, tensors=[ctx_tensor(), ctx_tensor(3, 9, "uncond")])
        check(is_error(e, "bad_request") and "cfg" in e[0].get("message", ""),
              "cfg 1e39 (not finite as float32) is bad_request naming cfg", show(e))
        _, _, e = self.gen(steps=2, solver="unipc", shift=1e30)
        check(is_error(e, "bad_request") and "sigma" in e[0].get("message", ""),
              "unipc with shift 1e30 is bad_request naming the sigma", show(e))
        _, _, e = self.gen(steps=2, solver="s" * 16)
        check(is_error(e, "bad_request") and "solver" in e[0].get("message", ""),
              "a solver of 16 characters is bad_request", show(e))
        _, _, e = self.gen(steps=2, sde=True, eta=-0.5)
        check(is_error(e, "bad_request") and "eta" in e[0].get("message", ""),
              "eta < 0 with sde is bad_request naming eta", show(e))
        t0 = time.monotonic()
        _, _, e = self.gen(steps=2, model="nosuch", prompt="a cat", tensors=[], timeout=10)
        check(is_error(e, "no_worker") and time.monotonic() - t0 < 5,
              "a prompt GEN of a model no live worker announces is no_worker at once", show(e))
        _, _, e = self.gen(steps=2, prompt="a\x01cat", tensors=[])
        check(is_error(e, "bad_request") and "prompt" in e[0].get("message", ""),
              "a prompt with a control character is bad_request", show(e))
        _, _, e = self.gen(steps=2, prompt="p" * 4097, tensors=[])
        check(is_error(e, "too_large"), "a prompt of 4097 bytes is too_large (the wire's longest string)", show(e))

    def t_partial(self):
        """v4 under wb's weights directories only: wb applies it, wa lags."""
        a = self.args
        sha4 = hashlib.sha256(open(a.v4, "rb").read()).hexdigest()
        m = self.sync(component="transformer", version=4, sha256=sha4, path=a.v4)
        ok = m is not None and m[0].get("type") == "SYNC_DONE"
        d = m[0] if ok else {}
        check(ok and d.get("applied") == ["wb"] and d.get("complete") is False and d.get("current") == 4 and
              [f.get("worker") for f in d.get("failed", [])] == ["wa"],
              "v4 that only wb can read: SYNC_DONE applied [wb], failed [wa], complete false, current 4", show(m))
        st = self.status()
        wa = [w for w in (st or {}).get("workers", []) if w.get("name") == "wa"]
        check(st is not None and st.get("versions") == {"transformer": 4} and wa and
              wa[0].get("lagging") == {"transformer": "v4: bad_weights: path not under the worker's weights directories"},
              "STATUS: current 4, wa lagging {transformer: \"v4: \" and its reason}", wa)
        for k in range(3):
            _, _, r = self.gen(steps=2, seed=100 + k, latent_shape=[C, 1, 8, 8 + 2 * k])
            check(r is not None and r[0].get("worker") == "wb" and r[0].get("version") == 4,
                  "a GEN without version goes to wb, at v4 (key %d)" % k, show(r))
        _, _, r = self.gen(steps=2, version=3, seed=7)
        check(r is not None and r[0].get("type") == "RESULT" and r[0].get("version") >= 3,
              "version is a minimum: version 3 runs on a worker at 3 or later", show(r))

    def t_upload_sync(self):
        """v5 by value, its SYNC sent once the first chunk is acknowledged:
        pending while the rest comes, then applied by both workers (wa,
        lagging since v4, is caught up)."""
        raw = open(os.path.join(os.path.dirname(self.args.v2), "w1.safetensors"), "rb").read()
        sha = hashlib.sha256(raw).hexdigest()
        half = len(raw) // 2
        up = dict(component="transformer", version=5, sha256=sha, size=len(raw))
        m = self.c.ask("UPLOAD", 80, 10, [tensor("chunk", [half], raw[:half], "U8")], offset=0, **up)
        check(m is not None and m[0].get("type") == "UPLOAD_ACK" and m[0].get("received") == half,
              "UPLOAD v5, first half acknowledged", show(m))
        sid = self.nid()
        self.c.send("SYNC", sid, component="transformer", version=5, sha256=sha, uploaded=True)
        st = self.status()
        early = [x for x in self.c.kept if x[0].get("id") == sid]
        check(st is not None and st.get("pending") == {"transformer": 5} and st.get("versions") == {"transformer": 4}
              and not early, "a SYNC of an upload in progress: STATUS pending {transformer: 5} while the rest comes",
              (st and st.get("pending"), [show(x) for x in early]))
        m = self.c.ask("UPLOAD", 81, 10, [tensor("chunk", [len(raw) - half], raw[half:], "U8")], offset=half, **up)
        check(m is not None and m[0].get("type") == "UPLOAD_ACK" and m[0].get("complete") is True,
              "the last chunk: complete", show(m))
        m = self.c.wait(lambda m: m[0].get("id") == sid, 30)
        check(m is not None and m[0].get("type") == "SYNC_DONE" and sorted(m[0].get("applied", [])) == self.workers
              and m[0].get("complete") is True and m[0].get("current") == 5,
              "SYNC_DONE: applied by both (the lagging worker caught up), complete, current 5", show(m))
        st = self.status()
        check(st is not None and st.get("pending") == {} and
              all(w.get("lagging") == {} and w.get("versions") == {"transformer": 5} for w in st.get("workers", [])),
              "STATUS: nothing pending, both workers at 5, none lagging", st and st.get("workers"))

    # -- a worker of this client's own ------------------------------------------
    def t_worker(self):
        """A worker written from "Worker <-> broker" on the worker endpoint,
        serving a model "fake" no real worker serves: what the broker makes
        of its answers is what the client sees."""
        st = self.status()
        cur = (st or {}).get("versions", {}).get("transformer", 1)
        fk = Peer(self.ctx, self.args.worker_ep, "fk")
        inbox = []
        last = [0.0]

        def tick():
            if time.monotonic() - last[0] > 0.05 and registered[0]:
                fk.send("HEARTBEAT")
                last[0] = time.monotonic()
            while fk.s.poll(0):
                m = decode_reply(fk.s.recv_multipart())
                if m[0].get("type") == "SYNC":
                    fk.send("SYNC_ACK", m[0].get("id", 0), component=m[0].get("component"),
                            version=m[0].get("version"), ok=True)
                elif m[0].get("type") != "HEARTBEAT":
                    inbox.append(m)

        def wget(pred, timeout):
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                tick()
                for i, m in enumerate(inbox):
                    if pred(m):
                        return inbox.pop(i)
                fk.s.poll(50)
            return None

        registered = [False]
        TICKS.append(tick)
        try:
            fk.send("HEARTBEAT")
            m = wget(lambda m: True, 5)
            check(m is not None and m[0].get("type") == "RECONNECT",
                  "a HEARTBEAT from a worker the broker does not know is answered RECONNECT", show(m))
            ready = dict(name="fk", device="fake", arch="none", streams=1, max_inflight=4, models=["fake"],
                         versions={"transformer": cur},
                         configs=[{"name": "fake", "in_channels": C, "text_dim": T, "patch": 2, "layers": 1}])
            fk.send("READY", **dict(ready, streams=0))
            m = wget(lambda m: m[0].get("type") == "ERROR", 5)
            check(is_error(m, "bad_request") and "streams" in m[0].get("message", ""),
                  "a READY with streams 0 is bad_request naming streams", show(m))
            fk.send("READY", **ready)
            registered[0] = True
            st = None
            end = time.monotonic() + 10
            while time.monotonic() < end:
                st = self.status()
                if st and any(w.get("name") == "fk" for w in st.get("workers", [])):
                    break
            w = [x for x in (st or {}).get("workers", []) if x.get("name") == "fk"]
            check(w and w[0].get("device") == "fake" and w[0].get("max_inflight") == 4,
                  "a READY registers the worker: STATUS lists it (device, max_inflight)", w)
            refused0 = (st or {}).get("worker_refused", 0)

            def req(mid, **kw):
                f = gen_fields(model="fake", steps=2, **kw)
                self.c.send("GEN", mid, [ctx_tensor()], **f)
                return wget(lambda m: m[0].get("type") == "REQUEST", 10)

            lat0 = f32_bytes([0.25] * (C * F * H * W))
            stats = {"captured": 0, "replayed": 0, "eager": 2, "declines": {}, "seconds": 0.01}

            def result(rid, lat=lat0, **kw):
                fk.send("RESULT", rid, [tensor("latent", [C, F, H, W], lat)],
                        **dict(dict(version=cur, stats=stats, worker="liar"), **kw))

            r = req(500, progress=True, seed=3, zzz_unknown=1)
            h = r[0] if r else {}
            rid = h.get("id")
            check(r is not None and is_uint(rid) and h.get("model") == "fake" and h.get("steps") == 2 and
                  h.get("seed") == 3 and h.get("progress") is True and h.get("latent_shape") == [C, F, H, W],
                  "a GEN reaches its worker as REQUEST: the GEN's fields, the broker's id", show(r))
            check("zzz_unknown" not in h, "the REQUEST drops the GEN's unknown top-level fields", show(r))
            check(h.get("version") == cur and is_uint(h.get("deadline_ms")) and 0 < h["deadline_ms"] <= 60000,
                  "REQUEST version = the required version (the current one), deadline_ms the broker's wait left",
                  show(r))
            check(r is not None and r[1].get("context", (0, 0))[1] == ctx_tensor()[1],
                  "REQUEST carries the GEN's context bytes", show(r))
            fk.send("PROGRESS", rid, step=1, steps=2)
            fk.send("PROGRESS", rid, step=5, steps=2)
            fk.send("PROGRESS", rid, step=2, steps=2)
            result(rid)
            prog, fin = self.c.final(500, 10)
            check([(p.get("step"), p.get("steps")) for p in prog] == [(1, 2), (2, 2)],
                  "the worker's PROGRESS reach the client with its id; one past its end is dropped",
                  [(p.get("step"), p.get("steps")) for p in prog])
            ok = fin is not None and fin[0].get("type") == "RESULT"
            check(ok and fin[0].get("worker") == "fk" and fin[1].get("latent", (0, 0))[1] == lat0,
                  "the worker's RESULT reaches the client with its id, worker set by the broker", show(fin))
            check(ok and "first_version" not in fin[0],
                  "a RESULT without first_version is forwarded as the worker sent it (no first_version)", show(fin))
            st = self.status()
            check(st is not None and st.get("worker_refused", 0) == refused0 + 1,
                  "STATUS worker_refused counts the PROGRESS past its end", st and st.get("worker_refused"))
            for mid, code, want in ((501, "weird", "internal"), (502, "shutdown", "internal"),
                                    (503, "standby", "internal"), (504, "timeout", "timeout"),
                                    (505, "bad_request", "bad_request")):
                r = req(mid)
                fk.send("ERROR", r[0]["id"] if r else 0, code=code, message="said by fk")
                _, fin = self.c.final(mid, 10)
                check(is_error(fin, want, mid) and (want != "internal" or code in fin[0].get("message", "")),
                      "a worker's ERROR %s reaches the client as %s%s" % (code, want,
                                                                          " naming it" if want == "internal" else ""),
                      show(fin))
            st0 = self.status()
            r = req(510)
            result(r[0]["id"] if r else 0, stats=dict(stats, eager=5))
            _, fin = self.c.final(510, 10)
            check(is_error(fin, "internal", 510), "a RESULT whose stats count 5 steps of 2 ends the GEN internal",
                  show(fin))
            r = req(511)
            result(r[0]["id"] if r else 0, lat=f32_bytes([float("nan")] * (C * F * H * W)))
            _, fin = self.c.final(511, 10)
            check(is_error(fin, "internal", 511) and "bad RESULT" in fin[0].get("message", ""),
                  "a RESULT whose latent holds NaN: internal \"worker fk sent a bad RESULT\"", show(fin))
            result(999999)
            st1 = self.status()
            if st0 and st1:
                check(st1.get("worker_refused", 0) - st0.get("worker_refused", 0) == 3,
                      "worker_refused counts the bad stats, the NaN latent and a RESULT for a request it does not hold",
                      (st0.get("worker_refused"), st1.get("worker_refused")))
            r = req(512)
            self.c.send("CANCEL", 512)
            _, fin = self.c.final(512, 10)
            check(is_error(fin, "cancelled", 512), "a CANCEL is answered cancelled at once", show(fin))
            cm = wget(lambda m: m[0].get("type") == "CANCEL", 5)
            check(cm is not None and r is not None and cm[0].get("id") == r[0]["id"],
                  "the worker running it is sent CANCEL with the broker's request id", show(cm))
            fk.send("ERROR", r[0]["id"] if r else 0, code="cancelled", message="dropped")
            st = self.status()
            late = [m for m in self.c.kept if m[0].get("id") == 512]
            check(not late, "the worker's own ERROR cancelled after it reaches the client no more", [show(m) for m in late])
            fk.send("SYNC_ACK", 0, component="transformer", version=1, ok=False, error="e" * 512)
            m = wget(lambda m: m[0].get("type") == "ERROR", 5)
            check(is_error(m, "bad_request") and "'error'" in m[0].get("message", ""),
                  "a SYNC_ACK whose error passes 511 bytes is bad_request naming error", show(m))
            r = req(513)
            fk.send("ERROR", r[0]["id"] if r else 0, code="c" * 32, message="a code of 32 bytes")
            _, fin = self.c.final(513, 10)
            check(is_error(fin, "internal", 513), "a worker's ERROR whose code passes 31 bytes ends its GEN internal",
                  show(fin))
            fk.send("DISCONNECT")
            registered[0] = False
            end = time.monotonic() + 5
            while time.monotonic() < end:
                st = self.status()
                if st and not any(w.get("name") == "fk" for w in st.get("workers", [])):
                    break
            check(st is not None and not any(w.get("name") == "fk" for w in st.get("workers", [])),
                  "DISCONNECT: the broker forgets the worker", st and [w.get("name") for w in st.get("workers", [])])
        finally:
            TICKS.remove(tick)
            fk.close()

    # -- refusals ---------------------------------------------------------------
    def refused(self, frames, code, mid, what):
        """frames sent on a fresh connection (each has its own budget of
        refusals): the answer is ERROR code with id mid, and the broker
        answers the next STATUS."""
        p = self.peer()
        try:
            p.send_raw(frames)
            m = p.wait(lambda m: True, 5)
            if code in ("malformed", "proto_mismatch", "too_large"):
                self.read_refusals += 1
            ok = is_error(m, code) and m[0].get("id", 0) == mid
            check(ok, what + ": ERROR %s, id %d" % (code, mid), show(m))
            if ok:
                check(isinstance(m[0].get("message"), str) and m[0]["message"] != "",
                      what + ": the ERROR has a message", show(m))
        finally:
            p.close()

    def t_refusals(self):
        st0 = self.status()
        self.read_refusals = 0

        def hdr(**kw):
            h = {"proto": PROTO}
            h.update(kw)
            return h

        pk = lambda h: msgpack.packb(h, use_bin_type=True)
        g = gen_fields()
        cd, cb = ctx_tensor()
        gh = lambda **kw: pk(hdr(type="GEN", id=5, tensors=[cd], **dict(g, **kw)))
        self.refused([b"\xc1\xc1 not msgpack"], "malformed", 0, "bytes that are not msgpack")
        self.refused([pk([PROTO, "STATUS"])], "malformed", 0, "a header that is an array")
        self.refused([pk(hdr(type="STATUS", id=6)) + b"\x00"], "malformed", 6, "a header with trailing bytes")
        self.refused([pk({"id": 6, "proto": PROTO, "type": "STATUS"})[:-3]], "malformed", 6, "a truncated header")
        self.refused([b"\x84\xa2id\x07\xa5proto\xa6reel/1\xa2id\x08" + pk("type") + pk("STATUS")],
                     "malformed", 8, "a duplicate key (id read twice: the last one)")
        self.refused([pk({"id": 9, "proto": PROTO, 1: "x", "type": "STATUS"})], "malformed", 9, "a map key that is not a string")
        self.refused([pk(hdr(id=10, type="STATUS", blob=b"\x00\x01"))], "malformed", 10, "a bin value")
        self.refused([pk(hdr(id=-3, type="STATUS"))], "malformed", 0, "an id that is a negative integer")
        self.refused([pk(hdr(id="7", type="STATUS"))], "malformed", 0, "an id that is a string")
        self.refused([pk(hdr(id=11))], "malformed", 11, "a header without type")
        self.refused([pk(hdr(id=12, type=5))], "malformed", 12, "a type that is not a string")
        self.refused([pk(hdr(id=13, type="STA\x00TUS"))], "malformed", 13, "a type holding a NUL byte")
        self.refused([pk({"id": 14, "type": "STATUS"})], "proto_mismatch", 14, "a header without proto")
        self.refused([pk({"id": 15, "proto": "reel/2", "type": "STATUS"})], "proto_mismatch", 15, "proto reel/2")
        self.refused([pk(hdr(id=16, type="READY", name="x", models=[]))], "unknown_type", 16, "a client sending READY")
        self.refused([pk(hdr(id=17, type="FROBNICATE"))], "unknown_type", 17, "an unknown type")
        self.refused([pk(hdr(id=18, type="FETCH", component="transformer", version=1, sha256="0" * 64))],
                     "unknown_type", 18, "FETCH on the client socket of a broker with no peer, without keys")
        # limits
        self.refused([pk(hdr(id=20, type="STATUS", pad="x" * 4000, pad2=["y" * 4000] * 70))], "too_large", 0,
                     "a header over 256 KiB")
        deep = 1
        for _ in range(8):
            deep = [deep]     # the map, then 8 arrays: 9 levels
        self.refused([pk(hdr(id=21, type="STATUS", deep=deep))], "too_large", 21, "nesting of 9 levels")
        deep7 = 1
        for _ in range(7):
            deep7 = [deep7]
        p = self.peer()
        m = p.ask("STATUS", 22, extra=deep7)
        check(m is not None and m[0].get("type") == "STATUS_REPLY",
              "nesting of 8 levels (the map, then 7 arrays) is taken; unknown fields are ignored", show(m))
        p.close()
        self.refused([pk(hdr(id=23, type="STATUS", big=list(range(4097))))], "too_large", 23, "an array of 4097 entries")
        self.refused([pk(hdr(id=24, type="STATUS", s="z" * 4097))], "too_large", 24, "a string of 4097 bytes")
        self.refused([pk(hdr(id=29, type="STATUS", m={("k%d" % i): 0 for i in range(4097)}))], "too_large", 29,
                     "a map of 4097 entries")
        self.refused([pk({"id": 30, "proto": PROTO, "type": "STATUS", "k" * 4097: 1})], "too_large", 30,
                     "a map key of 4097 bytes")
        self.refused([pk(hdr(id=31, type="T" * 4097))], "too_large", 31, "a type of 4097 bytes")
        self.refused([b""], "malformed", 0, "an empty frame")
        self.refused([pk(hdr(id=1.5, type="STATUS"))], "malformed", 0, "an id that is a float")
        self.refused([pk(hdr(id=32, type="STATUS", tensors="x"))], "malformed", 32, "tensors that is not an array")
        head = b"\x84" + pk("id") + pk(25) + pk("proto") + pk(PROTO) + pk("type") + pk("STATUS") + pk("a")
        self.refused([head + b"\xdc\x10\x01"], "too_large", 25,
                     "an array announcing 4097 entries, with no bytes for them")
        self.refused([b"\x84\xa2id\x1a\xa5proto\xa6reel/1\xa4type\xa6STATUS\xa1a\xdc\x00\x10"], "malformed", 26,
                     "an array of 16 entries the bytes cannot hold")
        nine = [tensor("t%d" % i, [1], f32_bytes([0.0])) for i in range(9)]
        self.refused([pk(hdr(id=27, type="GEN", tensors=[d for d, _ in nine], **g))] + [b for _, b in nine],
                     "too_large", 27, "9 tensors")
        d7, b7 = tensor("context", [1, 1, 1, 1, 1, 1, 32], f32_bytes([0.0] * 32))
        self.refused([pk(hdr(id=28, type="GEN", tensors=[d7], **g)), b7], "too_large", 28, "a tensor of 7 dims")
        # tensor frames against their descriptors
        self.refused([gh()], "malformed", 5, "a tensor descriptor without its frame")
        self.refused([gh(), cb, cb], "malformed", 5, "a frame more than the descriptors")
        self.refused([gh(), cb[:-4]], "malformed", 5, "a frame shorter than its bytes")
        self.refused([pk(hdr(type="GEN", id=5, tensors=[dict(cd, bytes=cd["bytes"] + 4)], **g)), cb + b"\0" * 4],
                     "malformed", 5, "bytes not product(shape) x dtype size")
        self.refused([pk(hdr(type="GEN", id=5, tensors=[dict(cd, dtype="F64")], **g)), cb], "malformed", 5,
                     "dtype F64 (not in the list)")
        self.refused([pk(hdr(type="GEN", id=5, tensors=[dict(cd, name="")], **g)), cb], "malformed", 5,
                     "an empty tensor name")
        self.refused([pk(hdr(type="GEN", id=5, tensors=[dict(cd, name="n" * 48)], **g)), cb], "malformed", 5,
                     "a tensor name of 48 bytes")
        self.refused([pk(hdr(type="GEN", id=5, tensors=[cd, cd], **g)), cb, cb], "malformed", 5,
                     "a repeated tensor name")
        # fields
        u8 = {"name": "context", "dtype": "U8", "shape": [3, T * 4], "bytes": 3 * T * 4}
        self.refused([pk(hdr(type="GEN", id=5, tensors=[u8], **g)), cb], "bad_request", 5,
                     "a U8 context (a dtype of the list where the field wants F32)")
        other = tensor("weights", [3, T], cb)
        self.refused([pk(hdr(type="GEN", id=5, tensors=[cd, other[0]], **g)), cb, cb], "bad_request", 5,
                     "a GEN tensor of a name it does not take")
        self.refused([pk(hdr(type="GEN", id=5, **g))], "bad_request", 5, "a GEN without context or prompt")
        for field, val, why in (("steps", 6.0, "a float"), ("steps", "6", "a string"), ("steps", True, "a bool"),
                                ("steps", None, "nil"), ("steps", 0, "0"), ("steps", 10001, "10001"),
                                ("model", "bad name!", "not a name"), ("model", "m" * 56, "of 56 characters"),
                                ("latent_shape", [4, 1, 8], "3 dims"), ("latent_shape", [8, 1, 8, 8], "C 8"),
                                ("latent_shape", [4, 1, 7, 8], "H 7, not a multiple of patch 2"),
                                ("shift", 0.0, "0"), ("shift", float("nan"), "NaN"),
                                ("cfg", float("inf"), "infinite"), ("sde", 1, "1 for a bool"),
                                ("seed", -1, "negative"), ("version", 2 ** 63, "2^63"),
                                ("client", 12, "an integer for a hash"), ("client", "xyz", "not hex"),
                                ("seeds", [1, 2], "of 2 with n 1")):
            fl = dict(g, n=1) if field == "seeds" else dict(g)
            fl[field] = val
            self.refused([pk(hdr(type="GEN", id=5, tensors=[cd], **fl)), cb], "bad_request", 5,
                         "GEN %s %s" % (field, why))
        p = self.peer()
        m = p.ask("GEN", 40, 5, [ctx_tensor()], **gen_fields(steps=6.0))
        check(is_error(m, "bad_request", 40) and m[0].get("message", "").startswith("GEN: 'steps' must be a non-negative integer"),
              "the message of steps 6.0 is \"GEN: 'steps' must be a non-negative integer\"", show(m))
        m = p.ask("GEN", 41, 5, [ctx_tensor()], **gen_fields(steps=0))
        check(is_error(m, "bad_request", 41) and m[0].get("message", "").startswith("GEN: 'steps' must be in 1..10000 (got 0)"),
              "the message of steps 0 is \"GEN: 'steps' must be in 1..10000 (got 0)\"", show(m))
        m = p.ask("GEN", 42, 5, [ctx_tensor(rows=2, width=16)], **gen_fields())
        check(is_error(m, "bad_request", 42) and "context" in m[0].get("message", ""),
              "a context of width 16 for text_dim 32 is bad_request naming context", show(m))
        # more than --max-held-mb (1 MiB) of tensors on its own: too_large
        big = tensor("latent", [C, 1, 256, 264], b"\0" * (C * 256 * 264 * 4))
        m = p.ask("GEN", 43, 10, [ctx_tensor(), big], **gen_fields(latent_shape=[C, 1, 256, 264]))
        check(is_error(m, "too_large", 43), "a GEN of more tensor bytes than --max-held-mb is ERROR too_large", show(m))
        m = p.ask("GEN", 44, 10, [ctx_tensor()], **gen_fields(latent_shape=[C, 1, 65537, 8]))
        check(is_error(m, "bad_request", 44), "a latent_shape dim of 65537 is bad_request", show(m))
        for i, (why, shape, dtype) in enumerate((("a context of 0 rows", [0, T], "F32"),
                                                 ("an F16 context", [3, T], "F16"),
                                                 ("a BF16 context", [3, T], "BF16"))):
            n = shape[0] * shape[1] * (4 if dtype == "F32" else 2)
            m = p.ask("GEN", 45 + i, 5, [tensor("context", shape, b"\0" * n, dtype)], **gen_fields())
            check(is_error(m, "bad_request", 45 + i) and "context" in m[0].get("message", ""),
                  "%s is bad_request naming context" % why, show(m))
        m = p.ask("GEN", 48, 5, [ctx_tensor()], **gen_fields(latent_shape=[C, 0, 8, 8]))
        check(is_error(m, "bad_request", 48), "a latent_shape with F = 0 is bad_request", show(m))
        p.send("GEN", None, [ctx_tensor()], **gen_fields(steps=1))
        m = p.wait(lambda m: m[0].get("type") in FINAL, 10)
        check(m is not None and m[0].get("type") == "RESULT" and m[0].get("id", 0) == 0,
              "a GEN without id is answered with id 0", show(m))
        p.close()
        st1 = self.status()
        check(st1 is not None, "the broker keeps serving after every refusal", "")
        if st0 and st1:
            check(st1["malformed"] - st0["malformed"] == self.read_refusals,
                  "STATUS malformed counts each of the %d refused while being read (malformed, a header limit, "
                  "proto_mismatch), not bad_request, unknown_type or a GEN too large for --max-held-mb"
                  % self.read_refusals, (st0["malformed"], st1["malformed"]))

    def t_budget(self):
        p = self.peer()
        st0 = self.status()
        try:
            n = 60
            for i in range(n):
                p.send("NOPE", 100 + i)
            # a STATUS behind them: one connection keeps order, so every answer
            # to the burst that is sent comes before the STATUS_REPLY
            r = p.ask("STATUS", 999, 10)
            got = [m for m in p.kept if m[0].get("id", 0) in range(100, 100 + n)]
            p.kept = []
            st1 = r[0] if r is not None and r[0].get("type") == "STATUS_REPLY" else None
            check(st1 is not None and 20 <= len(got) < n and all(is_error(m, "unknown_type") for m in got),
                  "a burst of %d bad messages on one connection: at least 20 answered, not all; a STATUS after "
                  "them is answered" % n, (len(got), show(r)))
            if st0 and st1:
                d = st1["replies_suppressed"] - st0["replies_suppressed"]
                check(d == n - len(got), "STATUS replies_suppressed counts each refusal not sent", (d, n - len(got)))
            q = self.peer()
            m = q.ask("NOPE", 9)
            check(is_error(m, "unknown_type", 9), "a new connection has a fresh budget", show(m))
            q.close()
        finally:
            p.close()

    # -- the trainer ------------------------------------------------------------
    def sync(self, p=None, timeout=30.0, **f):
        p = p or self.c
        mid = self.nid()
        m = p.ask("SYNC", mid, timeout, **f)
        return m

    def t_sync(self):
        a = self.args
        sha2 = hashlib.sha256(open(a.v2, "rb").read()).hexdigest()
        raw3 = open(a.v3, "rb").read()
        sha3 = hashlib.sha256(raw3).hexdigest()
        m = self.sync(component="transformer", version=2, sha256=sha2.upper(), path=a.v2)
        ok = m is not None and m[0].get("type") == "SYNC_DONE"
        check(ok, "a SYNC of v2 by path is answered SYNC_DONE with its id", show(m))
        if ok:
            d = m[0]
            check(d.get("component") == "transformer" and d.get("version") == 2 and sorted(d.get("applied", [])) ==
                  self.workers and d.get("failed") == [] and d.get("complete") is True and d.get("current") == 2,
                  "SYNC_DONE: component, version 2, applied by both workers, failed [], complete, current 2", d)
        st = self.status()
        check(st is not None and st.get("versions") == {"transformer": 2} and st.get("pending") == {} and
              all(w.get("versions") == {"transformer": 2} and w.get("lagging") == {} for w in st.get("workers", [])),
              "STATUS versions {transformer: 2}, nothing pending, each worker at 2, none lagging", st)
        _, _, r = self.gen(steps=2)
        check(r is not None and r[0].get("version") == 2 and r[0].get("version_runs") == [{"from": 0, "version": 2}],
              "a GEN after it runs on v2", show(r))
        m = self.sync(component="transformer", version=2, sha256=sha2, path=a.v2)
        check(m is not None and m[0].get("type") == "SYNC_DONE" and m[0].get("complete") is True and m[0].get("current") == 2,
              "the same SYNC again is an ack (SYNC_DONE complete), not stale", show(m))
        m = self.sync(component="transformer", version=2, sha256=sha3, path=a.v2)
        check(is_error(m, "stale_version"), "v2 again with another sha256 is ERROR stale_version", show(m))
        m = self.sync(component="transformer", version=1, sha256=sha2, path=a.v2)
        check(is_error(m, "stale_version"), "a SYNC older than the current version is ERROR stale_version", show(m))
        # failures reported per worker, nothing changes
        m = self.sync(component="transformer", version=3, sha256=sha3, path=a.v3)
        ok = m is not None and m[0].get("type") == "SYNC_DONE"
        check(ok and m[0].get("applied") == [] and m[0].get("complete") is False and m[0].get("current") == 2 and
              sorted(f.get("worker") for f in m[0].get("failed", [])) == self.workers and
              all(f.get("reason") == "bad_weights: path not under the worker's weights directories"
                  for f in m[0].get("failed", [])),
              "v3 by a path outside the weights directories: SYNC_DONE failed by each worker "
              "\"bad_weights: path not under the worker's weights directories\", current 2", show(m))
        m = self.sync(component="transformer", version=3, sha256=sha3, path="wd/../w3.safetensors")
        check(m is not None and m[0].get("type") == "SYNC_DONE" and m[0].get("applied") == [] and m[0].get("failed") and
              all(f.get("reason") == "bad_weights: path not under the worker's weights directories"
                  for f in m[0].get("failed", [])),
              "a relative path with '..' is refused by its text alone: the same generic reason", show(m))
        m = self.sync(component="transformer", version=3, sha256=sha3, path=a.v2)
        check(m is not None and m[0].get("type") == "SYNC_DONE" and m[0].get("applied") == [] and
              all(f.get("reason") == "sha256 mismatch" for f in m[0].get("failed", [])) and m[0].get("failed"),
              "v3 again (the failed version may be published again) with a wrong sha256: failed \"sha256 mismatch\"",
              show(m))
        # each run of refusals on a connection of its own: a peer is answered
        # about its bad messages 20 at once, then 10 a second ("replies_suppressed")
        q = self.peer()
        for why, f in (("another component", dict(component="vae", version=3, sha256=sha3, path=a.v2)),
                       ("a sha256 of 63 digits", dict(component="transformer", version=3, sha256=sha3[:63], path=a.v2)),
                       ("both path and uploaded", dict(component="transformer", version=3, sha256=sha3, path=a.v2,
                                                       uploaded=True)),
                       ("neither path nor uploaded", dict(component="transformer", version=3, sha256=sha3)),
                       ("version 0", dict(component="transformer", version=0, sha256=sha3, path=a.v2)),
                                              ("a path of 1024 bytes", dict(component="transformer", version=3, sha256=sha3,
                                                     path="/" + "p" * 1023))):
            m = self.sync(q, timeout=10, **f)
            check(is_error(m, "bad_request"), "a SYNC with %s is ERROR bad_request" % why, show(m))
        for why, f in (("version 2^63", dict(component="transformer", version=2 ** 63, sha256=sha3, path=a.v2)),
                       ("a client that is not a hash", dict(component="transformer", version=3, sha256=sha3,
                                                            path=a.v2, client="token!"))):
            m = self.sync(q, timeout=10, **f)
            check(is_error(m, "bad_request"), "a SYNC with %s is ERROR bad_request" % why, show(m))
        m = self.c.ask("SYNC", 55, 10, [ctx_tensor()], component="transformer", version=3, sha256=sha3, path=a.v2)
        check(is_error(m, "bad_request", 55), "a SYNC with inline tensors is ERROR bad_request", show(m))
        # by value
        half = len(raw3) // 2
        up = dict(component="transformer", version=3, sha256=sha3, size=len(raw3))
        ch = lambda lo, hi: [tensor("chunk", [hi - lo], raw3[lo:hi], "U8")]
        m = self.c.ask("UPLOAD", 60, 10, ch(0, half), offset=0, **up)
        ok = m is not None and m[0].get("type") == "UPLOAD_ACK"
        check(ok and m[0].get("received") == half and m[0].get("complete") is False and
              m[0].get("component") == "transformer" and m[0].get("version") == 3,
              "UPLOAD of the first half: UPLOAD_ACK component, version, received = its bytes, complete false", show(m))
        m = self.c.ask("UPLOAD", 61, 10, ch(half + 8, len(raw3)), offset=half + 8, **up)
        check(m is not None and m[0].get("type") == "UPLOAD_ACK" and m[0].get("received") == half,
              "a chunk at another offset than received is not written: its answer says where to go on", show(m))
        m = self.c.ask("UPLOAD", 62, 10, [tensor("chunk", [4], b"\0" * 16)], offset=half, **up)
        check(is_error(m, "bad_request", 62), "an UPLOAD chunk that is F32 is bad_request", show(m))
        m = self.c.ask("UPLOAD", 63, 10, ch(half, len(raw3)), offset=half, **up)
        check(m is not None and m[0].get("type") == "UPLOAD_ACK" and m[0].get("received") == len(raw3) and
              m[0].get("complete") is True, "the last chunk: received = size, complete", show(m))
        m = self.sync(component="transformer", version=3, sha256=sha3, uploaded=True)
        check(m is not None and m[0].get("type") == "SYNC_DONE" and sorted(m[0].get("applied", [])) == self.workers
              and m[0].get("complete") is True and m[0].get("current") == 3,
              "SYNC uploaded v3: the workers fetch it, SYNC_DONE applied by both, current 3", show(m))
        _, _, r = self.gen(steps=2)
        check(r is not None and r[0].get("version") == 3, "a GEN after it runs on v3", show(r))
        # an upload's edges
        q.close()
        q = self.peer()
        up3 = dict(component="transformer", version=3, sha256=sha3, size=len(raw3))
        m = q.ask("UPLOAD", 64, 10, ch(0, 16), offset=0, **up3)
        check(m is not None and m[0].get("type") == "UPLOAD_ACK" and m[0].get("complete") is True and
              m[0].get("received") == len(raw3),
              "UPLOAD of a version the broker holds with the same sha256: complete at once", show(m))
        m = q.ask("UPLOAD", 65, 10, ch(0, 16), offset=0, **dict(up3, version=2))
        check(is_error(m, "stale_version", 65), "UPLOAD of a version older than the current one: stale_version",
              show(m))
        m = q.ask("UPLOAD", 66, 10, ch(0, 16), offset=0, **dict(up3, sha256=sha2))
        check(is_error(m, "stale_version", 66), "UPLOAD of the current version with another sha256: stale_version",
              show(m))
        for i, (why, f, t) in enumerate((
                ("size 0", dict(up3, version=9, size=0), ch(0, 16)),
                ("size 2^36 + 1", dict(up3, version=9, size=2 ** 36 + 1), ch(0, 16)),
                ("offset + n past size", dict(up3, version=9, size=8), ch(0, 16)),
                ("an empty chunk", dict(up3, version=9), [tensor("chunk", [0], b"", "U8")]),
                ("no chunk", dict(up3, version=9), []),
                ("another component", dict(up3, version=9, component="vae"), ch(0, 16)))):
            m = q.ask("UPLOAD", 70 + i, 10, t, offset=0, **f)
            check(is_error(m, "bad_request", 70 + i), "an UPLOAD with %s is bad_request" % why, show(m))
        big = 4 * 1024 * 1024 + 1
        m = q.ask("UPLOAD", 79, 10, [tensor("chunk", [big], b"\0" * big, "U8")], offset=0,
                       **dict(up3, version=9, size=2 * big))
        check(m is not None and m[0].get("type") == "ERROR" and m[0].get("code") in ("bad_request", "too_large"),
              "an UPLOAD chunk of 4 MiB + 1 is refused", show(m))
        # on a connection of its own: the refusals above used up this one's
        # answers to bad messages (20 at once, then 10 a second: "replies_suppressed")
        fresh = self.peer()
        m = self.sync(fresh, component="transformer", version=4, sha256=sha3, uploaded=True)
        fresh.close()
        q.close()
        check(is_error(m, "bad_request"), "SYNC uploaded of a version the broker does not hold is bad_request", show(m))


def main():
    global END
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", required=True)
    ap.add_argument("--workers", required=True)
    ap.add_argument("--v2", required=True)
    ap.add_argument("--v3", required=True)
    ap.add_argument("--v4", required=True)
    ap.add_argument("--worker-ep", required=True)
    ap.add_argument("--for", dest="secs", type=float, default=45)
    ap.add_argument("-k", dest="only", default="")
    a = ap.parse_args()
    END = time.monotonic() + a.secs
    r = Run(a)
    names = ["status", "gen", "cfg", "sde", "group", "solvers", "in_flight", "more", "values", "busy", "waits", "cancel", "resend",
             "refusals", "budget", "sync", "partial", "upload_sync", "worker"]
    rc = 0
    try:
        for n in names:
            if a.only and a.only not in n:
                continue
            t0 = time.monotonic()
            getattr(r, "t_" + n)()
            print("  (%s: %.1f s)" % (n, time.monotonic() - t0), flush=True)
    except OutOfTime:
        check(False, "the checks ran to their end within %.0f s" % a.secs)
        rc = 1
    seen = sorted(set(wire_faults))
    check(not seen, "every reply was a well-formed reel/1 message", seen[:5])
    r.c.close()
    r.ctx.term()
    print("%d passed, %d failed" % (npass, nfail))
    return rc


if __name__ == "__main__":
    sys.exit(main())
