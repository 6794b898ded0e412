"""spec_client.py -- a Reel client written from docs/PROTOCOL.md alone (raw
ZeroMQ and MessagePack, nothing of Reel's own client code), as an outside
reviewer would write one, checking a live reel-broker and reel-worker
against the document: every client-facing message and field, and each
refusal of "Limits, and what each refusal means" with its code and `id`.

    spec_client.py --clients EP [--workers WEP] --weights-dir DIR --weights2 W2
                   [--weights3 W3] [--for S] [-k NAME]

EP: the broker's client endpoint, one worker "w1" behind it serving the
tiny model at version 1, no sync applied yet (tests/cli_spec_client.sh
starts them: the worker with --streams 1 --max-inflight 1 --max-tokens
256, the broker with --max-held-mb 1 --queue-max 4 --weights-dir). W2:
other weights of the worker's model under DIR, the worker's weights
directory, published as version 2 by path; W3: more, uploaded by value
(UPLOAD) and published as version 3. WEP: the broker's worker endpoint,
where a worker of this client's own answers REQUESTs as a check asks,
to see what the broker makes of a worker's answers.
Prints one PASS or FAIL line per check; -k runs only the sections whose
name holds NAME (checks of versions expect a whole run's order: no sync before
the "sync" section). Each
wait is bounded; the whole run within --for seconds. Exit 0 when it ran
to its end (the checks' verdicts are in the lines), 2 on a bad argument.
"""

import argparse
import hashlib
import math
import os
import struct
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_guard import done, guard  # noqa: E402

M32 = 0xFFFFFFFF
MODEL = "tiny"
C, T = 4, 32  # the tiny model's in_channels and text_dim (checked in STATUS models)
fails = 0
ctx = zmq.Context.instance()


def check(name, cond, detail=""):
    global fails
    if cond:
        print(f"PASS {name}")
    else:
        fails += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""))
    sys.stdout.flush()
    return bool(cond)


# ---- Seeded noise (docs/MODEL.md): Philox4x32-10, Box-Muller in double ----
def philox(seed, step, index):
    k0, k1 = seed & M32, (seed >> 32) & M32
    c0, c1, c2, c3 = index & M32, (index >> 32) & M32, step & M32, 0x5245454C
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def philox_normal(seed, step, j):
    r = philox(seed, step, j)
    u1, u2 = (r[0] + 1) / 2**32, r[1] / 2**32
    return f32(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2))


def drawn(seed, count):
    """A sample's initial latent drawn from its seed, element j in C,F,H,W order."""
    return [philox_normal(seed, M32, j) for j in range(count)]


def prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# ---- tensors --------------------------------------------------------------
def tensor(name, shape, values=None, dtype="F32", raw=None):
    """(descriptor, frame): values F32 (a list), or raw bytes as they are."""
    if raw is None:
        raw = struct.pack(f"<{len(values)}f", *values)
    return {"name": name, "dtype": dtype, "shape": list(shape), "bytes": len(raw)}, raw


def floats(frame):
    return list(struct.unpack(f"<{len(frame) // 4}f", frame))


def values(seed, count, scale=1.0):
    return [scale * philox_normal(seed, 7, j) for j in range(count)]


def context(L=5, seed=11, width=T, name="context"):
    return tensor(name, [L, width], values(seed, L * width))


# ---- connections ----------------------------------------------------------
class Conn:
    """One DEALER to the broker's client endpoint (no empty delimiter)."""

    def __init__(self, ep):
        self.s = ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.setsockopt(zmq.MAXMSGSIZE, 512 << 20)
        self.s.setsockopt(zmq.SNDTIMEO, 5000)
        self.s.connect(ep)

    def send(self, hdr, tensors=(), frames=None):
        """hdr: a dict (proto added when absent; tensors' descriptors set
        from TENSORS) or bytes sent as they are; FRAMES overrides the frames."""
        if isinstance(hdr, dict):
            hdr = dict(hdr)
            hdr.setdefault("proto", "reel/1")
            if tensors:
                hdr["tensors"] = [t[0] for t in tensors]
            hdr = msgpack.packb(hdr, use_bin_type=True)
        parts = [hdr] + (list(frames) if frames is not None else [t[1] for t in tensors])
        self.s.send_multipart(parts)

    def recv(self, timeout=30.0):
        """(header, {name: frame}, [frames]) of the next message, or None."""
        if not self.s.poll(int(timeout * 1000)):
            return None
        parts = self.s.recv_multipart()
        h = msgpack.unpackb(parts[0], raw=False, strict_map_key=False)
        named = {}
        for d, f in zip(h.get("tensors") or [], parts[1:]):
            named[d["name"]] = (d, f)
        return h, named, parts[1:]

    def final(self, timeout=60.0, progress=None):
        """The first reply that is not a PROGRESS (those go to PROGRESS)."""
        end = time.monotonic() + timeout
        while True:
            r = self.recv(max(0.0, end - time.monotonic()))
            if r is None or r[0].get("type") != "PROGRESS":
                return r
            if progress is not None:
                progress.append(r[0])

    def close(self):
        self.s.close(linger=0)


EP = None


def conn():
    return Conn(EP)


def gen(id_, steps=4, shape=(C, 1, 8, 8), ctx_t=None, **fields):
    h = {"type": "GEN", "id": id_, "model": MODEL, "steps": steps, "latent_shape": list(shape)}
    h.update(fields)
    return h, [ctx_t or context()]


def ask(hdr, tensors=(), timeout=60.0, progress=None, frames=None):
    """Sends on a new connection; the final reply (None when none came)."""
    c = conn()
    try:
        c.send(hdr, tensors, frames)
        return c.final(timeout, progress)
    finally:
        c.close()


def refused(name, hdr, tensors=(), code="bad_request", id_=None, says=None, frames=None, timeout=30.0):
    """Checks the first answer is ERROR CODE carrying ID_ (the header's own
    when None), its message holding SAYS (a str or a tuple of them)."""
    if id_ is None:
        id_ = hdr.get("id", 0) if isinstance(hdr, dict) else 0
    r = ask(hdr, tensors, timeout, frames=frames)
    if r is None:
        return check(name, False, "no answer")
    h = r[0]
    got = f"{h.get('type')} {h.get('code')} id={h.get('id')} '{h.get('message')}'"
    ok = h.get("type") == "ERROR" and h.get("code") == code and h.get("id") == id_
    if ok and says is not None:
        for s in (says,) if isinstance(says, str) else says:
            ok = ok and s in (h.get("message") or "")
    return check(name, ok, f"expected ERROR {code} id={id_}" + (f" saying {says!r}" if says else "") + f", got {got}")


def result(name, hdr, tensors=(), timeout=60.0, progress=None):
    r = ask(hdr, tensors, timeout, progress)
    if r is None or r[0].get("type") != "RESULT":
        check(name, False, f"expected RESULT, got {r[0] if r else 'nothing'}")
        return None
    return r


# ---- raw msgpack, for encodings msgpack.packb would not choose -----------
def P(x):
    return msgpack.packb(x, use_bin_type=True)


def rawmap(pairs):
    """A map from (packed key, packed value) pairs, as they are (duplicates kept)."""
    n = len(pairs)
    head = bytes([0x80 | n]) if n < 16 else (b"\xde" + struct.pack(">H", n) if n < 65536 else b"\xdf" + struct.pack(">I", n))
    return head + b"".join(k + v for k, v in pairs)


def rawhdr(d, extra=()):
    """D's entries packed in order (proto first when absent), then EXTRA raw pairs."""
    pairs = [(P(k), P(v)) for k, v in ({"proto": "reel/1"} | d).items()]
    return rawmap(pairs + list(extra))


_DROP = object()  # a field gen() leaves out


# ===========================================================================
# Sections
# ===========================================================================
def sec_status(a):
    c = conn()
    c.send({"type": "STATUS", "id": 77})
    r = c.final(30)
    c.close()
    if not check("STATUS is answered STATUS_REPLY carrying the request's id", r and r[0].get("type") == "STATUS_REPLY" and r[0].get("id") == 77,
                 str(r and r[0])):
        return
    s = r[0]
    for f in ("workers", "queue", "queue_max", "versions", "pending", "malformed", "catalog_dropped", "catalog_failures",
              "catalog_pending", "undelivered", "replies_suppressed", "auth_refused", "requests_ok", "requests_failed",
              "steps_replayed", "steps_eager", "steps_captured", "models", "boot"):
        check(f"STATUS_REPLY carries '{f}'", f in s, f"keys: {sorted(s)}")
    for f in ("ha_state", "ha_role", "ha_term", "ha_peer"):
        check(f"STATUS_REPLY of a broker alone has no '{f}'", f not in s)
    # absent while 0 / while empty
    check("STATUS_REPLY without refused handshakes leaves out auth_refused_peers (absent while 0)",
          "auth_refused_peers" not in s, f"auth_refused_peers={s.get('auth_refused_peers')!r}")
    check("STATUS_REPLY without refused handshakes leaves out auth_refused_recent (absent while empty)",
          "auth_refused_recent" not in s, f"auth_refused_recent={s.get('auth_refused_recent')!r}")
    check("STATUS versions is empty before any sync was applied", s.get("versions") == {}, str(s.get("versions")))
    check("STATUS boot is a hash (1..16 hex digits)", isinstance(s.get("boot"), str) and 1 <= len(s["boot"]) <= 16
          and all(ch in "0123456789abcdefABCDEF" for ch in s["boot"]), repr(s.get("boot")))
    w = (s.get("workers") or [{}])[0]
    for f in ("name", "device", "arch", "streams", "inflight", "max_inflight", "routable", "versions", "lagging", "keys", "alive_ms"):
        check(f"STATUS workers[] carries '{f}'", f in w, f"keys: {sorted(w)}")
    for f in ("text_encoder", "vae"):
        check(f"STATUS workers[] '{f}' is absent when the worker's READY named none", f not in w, f"{f}={w.get(f)!r}")
    check("STATUS workers[] versions is the startup version 1", w.get("versions") == {"transformer": 1}, str(w.get("versions")))
    check("STATUS workers[] lagging is empty when none", w.get("lagging") == {}, str(w.get("lagging")))
    m = (s.get("models") or [{}])[0]
    check("STATUS models[] gives the tiny model's config (in_channels 4, text_dim 32, patch 2)",
          m.get("name") == MODEL and m.get("in_channels") == C and m.get("text_dim") == T and m.get("patch") == 2 and "layers" in m, str(m))
    # id optional: absent reads as 0
    r = ask({"type": "STATUS"})
    check("STATUS without id is answered with id 0", r and r[0].get("type") == "STATUS_REPLY" and r[0].get("id") == 0, str(r and r[0]))
    refused("STATUS with tensors is bad_request", {"type": "STATUS", "id": 5}, [context()], "bad_request", 5)


def sec_gen(a):
    cl = context()
    h, t = gen(101, steps=5, seed=3)
    r = result("GEN with a context gets a RESULT", h, t)
    if r is None:
        return
    hd, named, _ = r
    check("RESULT carries the GEN's id", hd.get("id") == 101, str(hd.get("id")))
    for f in ("version", "stats", "worker", "key_hash", "boot"):
        check(f"RESULT carries '{f}'", f in hd, f"keys: {sorted(hd)}")
    st = hd.get("stats") or {}
    for f in ("captured", "replayed", "eager", "declines", "seconds"):
        check(f"RESULT stats carries '{f}'", f in st, f"stats keys: {sorted(st)}")
    check("RESULT stats counts every step (captured + replayed + eager = steps)",
          st.get("captured", 0) + st.get("replayed", 0) + st.get("eager", 0) == 5, str(st))
    check("RESULT version is the worker's startup version 1", hd.get("version") == 1, str(hd.get("version")))
    check("RESULT of one sample has no n and no seeds", "n" not in hd and "seeds" not in hd)
    lat = named.get("latent")
    check("RESULT latent is F32 [C,F,H,W]", lat and lat[0]["dtype"] == "F32" and lat[0]["shape"] == [C, 1, 8, 8] and len(lat[1]) == 4 * C * 64,
          str(lat and lat[0]))
    check("RESULT boot is the STATUS boot", hd.get("boot") == status().get("boot"), f"{hd.get('boot')}")
    vr = hd.get("version_runs")
    check("RESULT version_runs is one run from step 0 at version 1", vr == [{"from": 0, "version": 1}], str(vr))

    # the same GEN again: deterministic, bitwise
    r2 = result("the same GEN again gets a RESULT", h | {"id": 102}, t)
    if r2:
        check("the same GEN twice gives the bitwise same latent", r2[1]["latent"][1] == lat[1])
    # Seeded noise: x_0 drawn here, sent as the latent, gives the seeded GEN's bits
    x0 = drawn(3, C * 64)
    r3 = result("GEN with a latent gets a RESULT", gen(103, steps=5, seed=3)[0], [cl, tensor("latent", [C, 1, 8, 8], x0)])
    if r3:
        check("GEN with x_0 drawn by the client (philox_normal(seed, 0xFFFFFFFF, j)) gives the bits of the GEN drawing it from its seed",
              r3[1]["latent"][1] == lat[1])
    r4 = result("GEN with return_trajectory gets a RESULT", gen(104, steps=5, seed=3, return_trajectory=True)[0], [cl])
    if r4:
        tr = r4[1].get("trajectory")
        check("trajectory is F32 [N+1,C,F,H,W]", tr and tr[0]["shape"] == [6, C, 1, 8, 8], str(tr and tr[0]))
        if tr:
            check("trajectory[0] is the seed's latent as the client draws it (docs/MODEL.md Seeded noise)",
                  floats(tr[1][: 4 * C * 64]) == x0)
            check("trajectory[N] is the result's latent", tr[1][-4 * C * 64:] == lat[1])
            check("a GEN asking for its trajectory gives the same latent", r4[1]["latent"][1] == lat[1])
    # a seed > 2^32: both halves of the key
    big = (1 << 40) + 12345
    r5 = result("GEN with a 64-bit seed gets a RESULT", gen(105, steps=2, seed=big, return_trajectory=True)[0], [cl])
    if r5 and r5[1].get("trajectory"):
        check("a 64-bit seed draws x_0 by its two 32-bit halves", floats(r5[1]["trajectory"][1][: 4 * C * 64]) == drawn(big, C * 64))
    # unknown extra fields are ignored at every level
    h6, t6 = gen(106, steps=5, seed=3, future_field={"a": [1, 2]})
    t6 = [({**t6[0][0], "future": 1}, t6[0][1])]
    r6 = result("GEN with unknown fields (top level and in a tensor descriptor) gets a RESULT", h6, t6)
    if r6:
        check("unknown fields change nothing", r6[1]["latent"][1] == lat[1])
    # the defaults: shift 1.0, seed 0, cfg 1.0, and eta 0.7 with sde
    d0 = result("a GEN leaving shift, seed and cfg out", gen(108, steps=3)[0], [cl])
    d1 = result("a GEN writing shift 1.0, seed 0 and cfg 1.0 out", gen(109, steps=3, shift=1.0, seed=0, cfg=1.0, version=0, deadline_ms=0)[0], [cl])
    if d0 and d1:
        check("shift 1.0, seed 0, cfg 1.0, version 0 and deadline_ms 0 are the defaults", d0[1]["latent"][1] == d1[1]["latent"][1])
    e0 = result("an SDE GEN without eta", gen(110, steps=3, sde=True, seed=4)[0], [cl])
    e1 = result("an SDE GEN with eta 0.7", gen(111, steps=3, sde=True, seed=4, eta=0.7)[0], [cl])
    if e0 and e1:
        check("eta's default is 0.7", e0[1]["latent"][1] == e1[1]["latent"][1])
    f32hdr = rawhdr({"type": "GEN", "id": 112, "model": MODEL, "steps": 3, "latent_shape": [C, 1, 8, 8], "tensors": [cl[0]]},
                    [(P("shift"), b"\xca" + struct.pack(">f", 1.0)), (P("cfg"), P(1))])
    r = ask(f32hdr, [cl])
    check("a number in float32 format, and an integer as a number, are read (shift 1.0 as float32, cfg 1)",
          r and r[0].get("type") == "RESULT" and d0 and r[1]["latent"][1] == d0[1]["latent"][1], str(r and r[0]))
    # every integer format reads as a uint: steps 5 as uint64 and int8, seed 3 as uint16
    raw = rawhdr({"type": "GEN", "id": 107, "model": MODEL, "latent_shape": [C, 1, 8, 8], "tensors": [cl[0]]},
                 [(P("steps"), b"\xcf" + struct.pack(">Q", 5)), (P("seed"), b"\xd0\x03")])
    r7 = ask(raw, [cl])
    check("uints in uint64 and int8 formats read as their values (steps 5, seed 3)",
          r7 and r7[0].get("type") == "RESULT" and r7[1]["latent"][1] == lat[1], str(r7 and r7[0]))


def sec_cfg(a):
    cl = context()
    un = context(seed=12, name="uncond")
    base = result("GEN without uncond", gen(201, steps=4, seed=9)[0], [cl])
    cfg_ignored = result("GEN with cfg 3 and no uncond", gen(202, steps=4, seed=9, cfg=3.0)[0], [cl])
    if base and cfg_ignored:
        check("cfg without uncond is not used (the bits of cfg 1)", base[1]["latent"][1] == cfg_ignored[1]["latent"][1])
    g = result("GEN with uncond and cfg 3 (CFG)", gen(203, steps=4, seed=9, cfg=3.0)[0], [cl, un])
    g2 = result("the same CFG GEN again", gen(204, steps=4, seed=9, cfg=3.0)[0], [cl, un])
    if g and base:
        check("CFG changes the result", g[1]["latent"][1] != base[1]["latent"][1])
    if g and g2:
        check("a CFG GEN is deterministic", g[1]["latent"][1] == g2[1]["latent"][1])
    g3 = result("GEN with uncond and cfg 1", gen(205, steps=4, seed=9, cfg=1.0)[0], [cl, un])
    if g3 and base:
        check("uncond with cfg 1 gives the conditional result (v_u + 1 (v_c - v_u) = v_c, to rounding)",
              max(abs(x - y) for x, y in zip(floats(g3[1]["latent"][1]), floats(base[1]["latent"][1]))) < 1e-4)
    refused("uncond of another width T is bad_request naming uncond", gen(206, seed=9, cfg=2.0)[0],
            [cl, context(seed=12, width=16, name="uncond")], "bad_request", 206, "uncond")
    refused("uncond of another length L (a model without text_len) is bad_request naming uncond", gen(207, seed=9, cfg=2.0)[0],
            [cl, context(L=3, seed=12, name="uncond")], "bad_request", 207, "uncond")


def sec_group(a):
    cl = context()
    single = {}
    for i, s in enumerate((21, 22, 23)):
        r = result(f"single GEN with seed {s}", gen(300 + i, steps=4, seed=s, sde=True, eta=0.5, return_log_probs=True)[0], [cl])
        if r:
            single[s] = r
    g = result("GEN with n 3 and seeds", gen(310, steps=4, n=3, seeds=[21, 22, 23], sde=True, eta=0.5, return_log_probs=True)[0], [cl])
    if g:
        hd, named, _ = g
        check("a group's RESULT carries n and seeds", hd.get("n") == 3 and hd.get("seeds") == [21, 22, 23], f"n={hd.get('n')} seeds={hd.get('seeds')}")
        lat = named.get("latent")
        check("a group's latent is [n,C,F,H,W]", lat and lat[0]["shape"] == [3, C, 1, 8, 8], str(lat and lat[0]))
        lp = named.get("log_probs")
        check("a group's log_probs is [n,N]", lp and lp[0]["shape"] == [3, 4], str(lp and lp[0]))
        sg = named.get("sigmas")
        check("a group's sigmas has no leading n ([N+1])", sg and sg[0]["shape"] == [5], str(sg and sg[0]))
        n1 = 4 * C * 64
        for i, s in enumerate((21, 22, 23)):
            if s in single and lat:
                check(f"group sample {i} is bitwise the single GEN with its seed (latent, log_probs)",
                      lat[1][i * n1:(i + 1) * n1] == single[s][1]["latent"][1]
                      and lp[1][i * 16:(i + 1) * 16] == single[s][1]["log_probs"][1])
        check("a group's stats count its batched steps (N, not n x N)",
              sum(hd.get("stats", {}).get(k, 0) for k in ("captured", "replayed", "eager")) == 4, str(hd.get("stats")))
        if 21 in single:
            check("a group's key_hash (batch n) is not the single sample's", hd.get("key_hash") != single[21][0].get("key_hash"))
    g2 = result("GEN with n 3, no seeds, seed 21", gen(311, steps=4, n=3, seed=21, sde=True, eta=0.5, return_log_probs=True)[0], [cl])
    if g2 and g:
        check("without seeds sample i has seed + i", g2[0].get("seeds") == [21, 22, 23] and g2[1]["latent"][1] == g[1]["latent"][1],
              str(g2[0].get("seeds")))
    g3 = result("GEN with n 1 and seeds [22]", gen(312, steps=4, n=1, seeds=[22], seed=99, sde=True, eta=0.5, return_log_probs=True)[0], [cl])
    if g3 and 22 in single:
        hd = g3[0]
        check("n 1 is one sample: no n, no seeds, latent [C,F,H,W]", "n" not in hd and "seeds" not in hd
              and g3[1]["latent"][0]["shape"] == [C, 1, 8, 8], f"{sorted(hd)} {g3[1]['latent'][0]}")
        check("with n 1 seeds[0] replaces seed", g3[1]["latent"][1] == single[22][1]["latent"][1])
    # a group with its latents sent: [n,C,F,H,W]
    lats = drawn(21, C * 64) + drawn(22, C * 64)
    g4 = result("GEN with n 2 and a latent [n,C,F,H,W]", gen(313, steps=4, n=2, seeds=[21, 22], sde=True, eta=0.5)[0],
                [cl, tensor("latent", [2, C, 1, 8, 8], lats)])
    if g4 and 21 in single:
        check("a group's sent latents give the bits of the drawn ones", g4[1]["latent"][1][: 4 * C * 64] == single[21][1]["latent"][1])
    # seeds wrap modulo 2^64
    g5 = result("GEN with n 2 and seed 2^64-1", gen(314, steps=2, n=2, seed=(1 << 64) - 1)[0], [cl])
    if g5:
        check("seed + i wraps modulo 2^64", g5[0].get("seeds") == [(1 << 64) - 1, 0], str(g5[0].get("seeds")))
    refused("seeds of another length than n is bad_request naming seeds", gen(320, n=3, seeds=[1, 2])[0], [cl], "bad_request", 320, "seeds")
    refused("an empty seeds array is bad_request", gen(321, n=1, seeds=[])[0], [cl], "bad_request", 321, "seeds")
    refused("n 65 is bad_request naming n", gen(322, n=65)[0], [cl], "bad_request", 322, "'n'")
    refused("n 0 is bad_request naming n", gen(323, n=0)[0], [cl], "bad_request", 323, "'n'")
    refused("a group's latent [C,F,H,W] (no leading n) is bad_request naming latent", gen(324, n=2)[0],
            [cl, tensor("latent", [C, 1, 8, 8], drawn(1, C * 64))], "bad_request", 324, "latent")
    refused("a group whose n latents exceed 256 MiB is too_large", gen(325, n=8, shape=(C, 1, 2048, 2048))[0], [cl], "too_large", 325)


def lp_ref(x, xn, mu, s_i):
    """log-probability of XN given mean MU and std S_I, mean over elements."""
    n = len(x)
    acc = 0.0
    for a_, m in zip(xn, mu):
        d = a_ - m
        acc += -(d * d) / (2 * s_i * s_i) - math.log(s_i) - math.log(math.sqrt(2 * math.pi))
    return acc / n


def sec_rollout(a):
    cl = context()
    N, S, eta, seed = 5, 2.0, 0.7, 41
    hdr = gen(401, steps=N, seed=seed, shift=S, sde=True, eta=eta, return_trajectory=True, return_log_probs=True,
              return_means=True, return_timesteps=True)[0]
    r = result("SDE GEN with every rollout output", hdr, [cl])
    if not r:
        return
    nm = r[1]
    E = C * 64
    shapes = {"trajectory": [N + 1, C, 1, 8, 8], "log_probs": [N], "sigmas": [N + 1], "timesteps": [N], "means": [N, C, 1, 8, 8]}
    for k, sh in shapes.items():
        check(f"rollout '{k}' is F32 {sh}", k in nm and nm[k][0]["shape"] == sh and nm[k][0]["dtype"] == "F32",
              str(nm.get(k, [None])[0]))
    if not all(k in nm for k in shapes):
        return
    sig = floats(nm["sigmas"][1])
    want = [f32(S * (1 - i / N) / (1 + (S - 1) * (1 - i / N))) for i in range(N + 1)]
    check("sigmas are Euler's shifted schedule S u/(1 + (S-1) u)", all(abs(x - y) <= 1e-6 for x, y in zip(sig, want)), f"{sig} vs {want}")
    ts = floats(nm["timesteps"][1])
    check("timesteps are 1000 sigma_i of the F32 sigma, rounded to F32", ts == [f32(1000.0 * s) for s in sig[:N]], f"{ts}")
    tr, mu, lp = floats(nm["trajectory"][1]), floats(nm["means"][1]), floats(nm["log_probs"][1])
    ok_lp, ok_noise, worst = True, True, 0.0
    for i in range(N):
        si, sn = sig[i], sig[i + 1]
        sp = sig[1] if si == 1.0 else si
        std = eta * math.sqrt(si / (1 - sp))
        s_i = std * math.sqrt(-(sn - si))
        x, xn, m = tr[i * E:(i + 1) * E], tr[(i + 1) * E:(i + 2) * E], mu[i * E:(i + 1) * E]
        ref = lp_ref(x, xn, m, s_i)
        if abs(ref - lp[i]) > 1e-3 * max(1.0, abs(ref)):
            ok_lp = False
        # the step's noise: x_{i+1} = mu_i + s_i eps, eps = philox_normal(seed, i, j)
        if i < N - 1:
            for j in range(E):
                eps = (xn[j] - m[j]) / s_i
                worst = max(worst, abs(eps - philox_normal(seed, i, j)))
            if worst > 1e-2:
                ok_noise = False
    check("log_probs are the mean Gaussian log-density of x_{i+1} about means[i] with s_i = std sqrt(-delta)", ok_lp, f"{lp}")
    check("the SDE noise of step i is philox_normal(seed, i, j) (docs/MODEL.md)", ok_noise, f"worst |eps - philox| {worst}")
    r2 = result("Euler GEN with return_timesteps only", gen(402, steps=N, seed=seed, shift=S, return_timesteps=True)[0], [cl])
    if r2:
        check("return_timesteps alone returns timesteps (any loop) and no rollout tensors",
              "timesteps" in r2[1] and "trajectory" not in r2[1] and "log_probs" not in r2[1] and "means" not in r2[1], str(sorted(r2[1])))
    refused("return_log_probs without sde is bad_request", gen(403, return_log_probs=True)[0], [cl], "bad_request", 403, "return_log_probs")
    refused("return_means with sde and eta 0 is bad_request", gen(404, sde=True, eta=0.0, return_means=True)[0], [cl], "bad_request", 404, "return_means")


def sec_progress(a):
    prog = []
    r = result("GEN with progress", gen(501, steps=6, seed=1, progress=True)[0], [context()], progress=prog)
    if not r:
        return
    steps = [p.get("step") for p in prog]
    check("PROGRESS messages come before the RESULT, with the GEN's id", prog and all(p.get("id") == 501 for p in prog), str(prog[:2]))
    check("PROGRESS carries steps = the GEN's steps", prog and all(p.get("steps") == 6 for p in prog), str(prog[:2]))
    check("PROGRESS step never goes back and ends at steps", steps == sorted(steps) and steps and steps[-1] == 6
          and all(1 <= s <= 6 for s in steps), str(steps))
    check("PROGRESS of a latent GEN has no decoded or decode_frames", all("decoded" not in p and "decode_frames" not in p for p in prog))
    prog2 = []
    result("GEN without progress", gen(502, steps=6, seed=1)[0], [context()], progress=prog2)
    check("no PROGRESS unless asked", prog2 == [], str(prog2[:2]))


# a context of 8200 rows: 1049600 bytes, past the broker's --max-held-mb 1
BIG_CONTEXT = tensor("context", [8200, T], raw=bytes(8200 * T * 4))
LONG = dict(steps=10000, shape=(C, 1, 32, 32))  # 256 tokens: seconds on the CPU


def wait_progress(c, id_, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = c.recv(end - time.monotonic())
        if r is None:
            return None
        if r[0].get("type") == "PROGRESS" and r[0].get("id") == id_:
            return r[0]
        if r[0].get("type") != "PROGRESS":
            return r[0]
    return None


def sec_cancel(a):
    tok = "5eed0001"
    cl = context()
    c = conn()
    c.send(*gen(601, progress=True, client=tok, **LONG))
    p = wait_progress(c, 601)
    if not check("a long GEN starts (a PROGRESS)", p and p.get("type") == "PROGRESS", str(p)):
        c.close()
        return
    # a CANCEL from another connection without the token names nothing
    o = conn()
    o.send({"type": "CANCEL", "id": 601})
    o.send({"type": "STATUS", "id": 9})
    r = o.final(10)
    check("a CANCEL names nothing from another connection without the token: no reply (the next answer is the STATUS's)",
          r and r[0].get("type") == "STATUS_REPLY", str(r and r[0]))
    # another token names nothing, even on the sending connection
    c.send({"type": "CANCEL", "id": 601, "client": "5eed0002"})
    c.send({"type": "STATUS", "id": 10})
    r = c.final(10)
    check("a CANCEL with another token names nothing, on the GEN's own connection too", r and r[0].get("type") == "STATUS_REPLY", str(r and r[0]))
    # the token, from another connection (as a resend would), cancels it
    o.send({"type": "CANCEL", "id": 601, "client": tok})
    r = c.final(30)
    check("CANCEL with the GEN's id and token ends it: ERROR cancelled, with the GEN's id, to the GEN's sender",
          r and r[0].get("type") == "ERROR" and r[0].get("code") == "cancelled" and r[0].get("id") == 601, str(r and r[0]))
    check("a running request's cancel says its worker stops it", r and "its worker stops it at its next step" in (r[0].get("message") or ""),
          str(r and r[0].get("message")))
    o.send({"type": "STATUS", "id": 13})
    r = o.final(10)
    check("nothing answers the CANCEL itself (the next answer is the STATUS's)", r and r[0].get("type") == "STATUS_REPLY", str(r and r[0]))
    # a queued GEN (max_inflight 1: the first holds the slot) is dropped unrun
    c.send(*gen(602, progress=True, **LONG))
    p = wait_progress(c, 602)
    c.send(*gen(603, steps=4, seed=1))
    # the queue is ours to see: STATUS queue 1
    end = time.monotonic() + 10
    q = None
    while time.monotonic() < end:
        s = ask({"type": "STATUS", "id": 1})
        q = s and s[0].get("queue")
        if q == 1:
            break
        time.sleep(0.05)
    check("a second GEN waits in the broker's queue while the worker's one slot is taken (STATUS queue 1)", q == 1, f"queue {q}")
    c.send({"type": "CANCEL", "id": 603})
    r = c.final(10)
    check("a tokenless CANCEL from the GEN's connection cancels a queued GEN: it had not started",
          r and r[0].get("type") == "ERROR" and r[0].get("code") == "cancelled" and r[0].get("id") == 603
          and "it had not started" in (r[0].get("message") or ""), str(r and r[0]))
    c.send({"type": "CANCEL", "id": 602})
    r = c.final(30)
    check("a tokenless CANCEL ends the running GEN", r and r[0].get("code") == "cancelled" and r[0].get("id") == 602, str(r and r[0]))
    # a CANCEL of an answered request is ignored
    c.send({"type": "CANCEL", "id": 602})
    c.send({"type": "STATUS", "id": 11})
    r = c.final(10)
    check("a CANCEL of an answered request is ignored (no reply)", r and r[0].get("type") == "STATUS_REPLY", str(r and r[0]))
    c.close()
    o.close()
    refused("CANCEL with a client that is not a hash is bad_request", {"type": "CANCEL", "id": 3, "client": "xyz"}, (), "bad_request", 3, "client")
    refused("CANCEL with tensors is bad_request", {"type": "CANCEL", "id": 4}, [cl], "bad_request", 4)


def sec_resend(a):
    tok = "00abc123"
    h, t = gen(701, progress=True, client=tok, seed=5, **LONG)
    c1 = conn()
    c1.send(h, t)
    p = wait_progress(c1, 701)
    if not check("a long GEN with a client token starts", p and p.get("type") == "PROGRESS", str(p)):
        c1.close()
        return
    # a resend that differs is refused; the live one goes on
    refused("a resend under the same token and id with another seed is bad_request naming seed",
            h | {"seed": 6}, t, "bad_request", 701, ("'seed' differs",))
    # the resend, from another connection, with another deadline and progress off and the token's other spelling
    c2 = conn()
    c2.send(h | {"client": "ABC123", "progress": False, "deadline_ms": 120000}, t)
    p2 = wait_progress(c2, 701)
    check("a resend under the same token (compared as a number) gets the live request's answers from then on",
          p2 and p2.get("type") == "PROGRESS" and p2.get("id") == 701, str(p2))
    # the first sender holds it no more: its tokenless CANCEL names nothing
    c1.send({"type": "CANCEL", "id": 701})
    c1.send({"type": "STATUS", "id": 12})
    r = c1.final(10)
    check("once a resend attached, a tokenless CANCEL from the connection that sent the GEN first names nothing",
          r and r[0].get("type") == "STATUS_REPLY", str(r and r[0]))
    # the resend's connection holds it: its tokenless CANCEL names it
    c2.send({"type": "CANCEL", "id": 701})
    r2 = c2.final(30)
    check("a tokenless CANCEL from the resend's connection ends it; its one final reply goes to the resend's sender",
          r2 and r2[0].get("code") == "cancelled" and r2[0].get("id") == 701, str(r2 and r2[0]))
    # anything the broker sent c1 for it would come before this STATUS's answer
    c1.send({"type": "STATUS", "id": 15})
    r1 = c1.final(10)
    check("the first sender gets no final reply once a resend attached (the next answer is the STATUS's)",
          r1 and r1[0].get("type") == "STATUS_REPLY", str(r1 and r1[0]))
    c1.close()
    c2.close()
    # answered: forgotten; the same id is a new request
    h3, t3 = gen(702, steps=3, seed=5, client=tok)
    r = result("a GEN with a token is answered", h3, t3)
    r3 = result("the same token and id again after its answer is a new request", h3 | {"seed": 6}, t3)
    if r and r3:
        check("a new request under an answered id runs afresh", r[1]["latent"][1] != r3[1]["latent"][1])


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def sec_sync(a):
    w2 = os.path.abspath(a.weights2)
    sha = sha256_of(w2)
    cl = context()
    before = result("a GEN on version 1", gen(801, steps=4, seed=2)[0], [cl])
    base = {"type": "SYNC", "component": "transformer", "sha256": sha, "path": w2}
    r = ask(base | {"id": 830, "version": 1}, timeout=60)
    hd = r and r[0]
    check("a first SYNC at the workers' startup version 1 with other weights: they answer 'stale', current 0 (none applied yet)",
          hd and hd.get("type") == "SYNC_DONE" and hd.get("applied") == [] and hd.get("complete") is False and hd.get("current") == 0
          and [f.get("reason") for f in hd.get("failed") or []] == ["stale"], str(hd))
    r = ask(base | {"id": 831, "version": 2, "sha256": "ab" * 32}, timeout=60)
    hd = r and r[0]
    check("a failed SYNC before any applied: SYNC_DONE current 0", hd and hd.get("type") == "SYNC_DONE" and hd.get("current") == 0, str(hd))
    w = (status().get("workers") or [{}])[0]
    check("a sync nobody applied leaves no worker lagging", w.get("lagging") == {} and w.get("versions") == {"transformer": 1}, str(w))
    refused("SYNC with a client that is not a hash is bad_request naming client", base | {"id": 832, "version": 2, "client": "zz"}, (),
            "bad_request", 832, "'client'")
    sync = {"type": "SYNC", "id": 802, "component": "transformer", "version": 2, "sha256": sha, "path": w2}
    r = ask(sync, timeout=60)
    hd = r and r[0]
    ok = hd and hd.get("type") == "SYNC_DONE"
    check("SYNC by path is answered SYNC_DONE with the SYNC's id", ok and hd.get("id") == 802, str(hd))
    if ok:
        check("SYNC_DONE: component, version, applied [w1], failed [], complete, current 2",
              hd.get("component") == "transformer" and hd.get("version") == 2 and hd.get("applied") == ["w1"]
              and hd.get("failed") == [] and hd.get("complete") is True and hd.get("current") == 2, str(hd))
    w = (status().get("workers") or [{}])[0]
    check("STATUS workers[] versions shows the applied version 2", w.get("versions") == {"transformer": 2}, str(w.get("versions")))
    s = ask({"type": "STATUS", "id": 1})
    check("STATUS versions shows the current version 2", s and s[0].get("versions") == {"transformer": 2}, str(s and s[0].get("versions")))
    after = result("a GEN without version after the sync", gen(803, steps=4, seed=2)[0], [cl])
    if after:
        check("it runs on version 2", after[0].get("version") == 2 and after[0].get("first_version", 2) == 2, str(after[0].get("version")))
        if before:
            check("other weights give another result", after[1]["latent"][1] != before[1]["latent"][1])
    r = ask(sync | {"id": 804, "sha256": sha.upper()}, timeout=60)
    check("a resend of the current version (sha256 in upper case) is an ack: SYNC_DONE complete",
          r and r[0].get("type") == "SYNC_DONE" and r[0].get("id") == 804 and r[0].get("complete") is True and r[0].get("current") == 2,
          str(r and r[0]))
    refused("the current version with another sha256 is stale_version", sync | {"id": 805, "sha256": "0" * 64}, (), "stale_version", 805)
    refused("an older version is stale_version", sync | {"id": 806, "version": 1}, (), "stale_version", 806)
    # failed syncs change nothing
    r = ask(sync | {"id": 807, "version": 3, "sha256": "ab" * 32}, timeout=60)
    hd = r and r[0]
    check("a SYNC whose file does not match its sha256: SYNC_DONE failed 'sha256 mismatch', nothing applied, current unchanged",
          hd and hd.get("type") == "SYNC_DONE" and hd.get("applied") == [] and hd.get("complete") is False and hd.get("current") == 2
          and [f.get("reason") for f in hd.get("failed") or []] == ["sha256 mismatch"] and hd["failed"][0].get("worker") == "w1", str(hd))
    r = ask(sync | {"id": 808, "version": 3, "path": "/etc/passwd"}, timeout=60)
    hd = r and r[0]
    check("a path outside the weights directories fails 'bad_weights: path not under the worker's weights directories'",
          hd and hd.get("type") == "SYNC_DONE" and [f.get("reason") for f in hd.get("failed") or []]
          == ["bad_weights: path not under the worker's weights directories"], str(hd))
    r = ask(sync | {"id": 809, "version": 3, "path": os.path.join(a.weights_dir, "absent.safetensors")}, timeout=60)
    hd = r and r[0]
    check("a missing file under the weights directory fails 'bad_weights: not a safetensors file'",
          hd and hd.get("type") == "SYNC_DONE" and [f.get("reason") for f in hd.get("failed") or []] == ["bad_weights: not a safetensors file"],
          str(hd))
    r = ask(sync | {"id": 810, "version": 3, "path": "w2.safetensors"}, timeout=60)
    hd = r and r[0]
    check("a relative path fails as not under the weights directories (said of its text alone)",
          hd and hd.get("type") == "SYNC_DONE" and [f.get("reason") for f in hd.get("failed") or []]
          == ["bad_weights: path not under the worker's weights directories"], str(hd))
    s = ask({"type": "STATUS", "id": 1})
    check("failed syncs leave the current version", s and s[0].get("versions") == {"transformer": 2} and s[0].get("pending") == {},
          str(s and (s[0].get("versions"), s[0].get("pending"))))
    # GEN version is a minimum: version 1 runs on the worker's 2
    r = result("GEN with version 1 after the sync", gen(811, steps=2, seed=2, version=1)[0], [cl])
    if r:
        check("a GEN's version is a minimum (1 runs on 2)", r[0].get("version") == 2, str(r[0].get("version")))
    r = ask(gen(812, steps=2, seed=2, version=9, deadline_ms=400)[0], [cl], timeout=30)
    check("a GEN needing a version no worker has: ERROR no_worker at its deadline", r and r[0].get("type") == "ERROR"
          and r[0].get("code") == "no_worker" and r[0].get("id") == 812, str(r and r[0]))
    # field rules of SYNC
    refused("SYNC of another component is bad_request", sync | {"id": 820, "version": 3, "component": "vae"}, (), "bad_request", 820, "component")
    refused("SYNC without path or uploaded is bad_request", {k: v for k, v in sync.items() if k != "path"} | {"id": 821, "version": 3},
            (), "bad_request", 821)
    refused("SYNC with both path and uploaded is bad_request", sync | {"id": 822, "version": 3, "uploaded": True}, (), "bad_request", 822)
    refused("SYNC with inline tensors is bad_request", sync | {"id": 823, "version": 3}, [context()], "bad_request", 823)
    refused("SYNC path of 1024 bytes is bad_request naming path", sync | {"id": 824, "version": 3, "path": "/" + "a" * 1023}, (),
            "bad_request", 824, "path")
    refused("SYNC version 2^63 is bad_request naming version", sync | {"id": 825, "version": 1 << 63}, (), "bad_request", 825, "version")
    refused("SYNC version 0 is bad_request naming version", sync | {"id": 826, "version": 0}, (), "bad_request", 826, "version")
    refused("SYNC sha256 of 63 hex digits is bad_request naming sha256", sync | {"id": 827, "version": 3, "sha256": "a" * 63}, (),
            "bad_request", 827, "sha256")
    refused("SYNC without sha256 is bad_request naming sha256", {k: v for k, v in sync.items() if k != "sha256"} | {"id": 828, "version": 3},
            (), "bad_request", 828, "sha256")
    refused("SYNC with uploaded false and no path is bad_request (false counts as absent)",
            {k: v for k, v in sync.items() if k != "path"} | {"id": 829, "version": 3, "uploaded": False}, (), "bad_request", 829)


def sec_limits(a):
    cl = context()
    g, t = gen(901)
    # ---- before the header is read: id 0
    refused("a header over 256 KiB is too_large, id 0", g | {"pad": "x" * 4000, "more": ["y" * 4000] * 70}, t, "too_large", 0)
    refused("bytes that are not MessagePack are malformed, id 0", b"\xc1\xc1\xc1", (), "malformed", 0)
    refused("a root that is not a map is malformed, id 0", P([1, 2, 3]), (), "malformed", 0)
    refused("trailing bytes after the header are malformed", P(g | {"proto": "reel/1", "tensors": [t[0][0]]}) + b"\x00", t, "malformed", 901)
    refused("truncated data is malformed", P({"proto": "reel/1", "type": "STATUS", "id": 902, "x": "abcdef"})[:-3], (), "malformed", 902)
    # ---- limits read as the header goes: the id when it came before
    deep = 1
    for _ in range(8):
        deep = [deep]  # the header map is level 1: x at level 2 .. 9
    refused("nesting past 8 levels is too_large, with the id read before it", {"type": "STATUS", "id": 903, "x": deep}, (), "too_large", 903)
    ok8 = 1
    for _ in range(7):
        ok8 = [ok8]
    r = ask({"type": "STATUS", "id": 904, "x": ok8})
    check("nesting of 8 levels is read (an unknown field, ignored)", r and r[0].get("type") == "STATUS_REPLY" and r[0].get("id") == 904, str(r and r[0]))
    refused("a nesting fault before the id: id 0", rawmap([(P("proto"), P("reel/1")), (P("x"), P(deep)), (P("type"), P("STATUS")), (P("id"), P(905))]),
            (), "too_large", 0)
    refused("an array of 4097 entries is too_large", {"type": "STATUS", "id": 906, "x": [0] * 4097}, (), "too_large", 906)
    r = ask({"type": "STATUS", "id": 907, "x": [0] * 4096})
    check("an array of 4096 entries is read", r and r[0].get("type") == "STATUS_REPLY", str(r and r[0]))
    refused("a map announcing 4464 entries with no bytes for them is too_large (the limit first)",
            b"\x84" + P("proto") + P("reel/1") + P("type") + P("STATUS") + P("id") + P(908) + P("x") + b"\xde\x11\x70", (), "too_large", 908)
    refused("an array announcing 4000 entries the bytes cannot hold is malformed",
            b"\x84" + P("proto") + P("reel/1") + P("type") + P("STATUS") + P("id") + P(909) + P("x") + b"\xdc\x0f\xa0\x01", (), "malformed", 909)
    refused("a string of 4097 bytes is too_large", {"type": "STATUS", "id": 910, "x": "a" * 4097}, (), "too_large", 910)
    r = ask({"type": "STATUS", "id": 911, "x": "a" * 4096})
    check("a string of 4096 bytes is read", r and r[0].get("type") == "STATUS_REPLY", str(r and r[0]))
    nine = [tensor(f"t{i}", [1], [0.0]) for i in range(9)]
    refused("nine tensors are too_large", g, nine, "too_large", 901)
    refused("a tensor of 7 dims is too_large", g, [cl, tensor("latent", [1, 1, 1, C, 1, 8, 8], drawn(1, C * 64))], "too_large", 901)
    # ---- malformed
    refused("map keys that are not strings are malformed", rawmap([(P("proto"), P("reel/1")), (P("type"), P("STATUS")), (P("id"), P(912)),
                                                                   (P(5), P(1))]), (), "malformed", 912)
    refused("a map key holding a NUL is malformed", {"type": "STATUS", "id": 913, "a\0b": 1}, (), "malformed", 913)
    refused("a duplicate key at the top level is malformed, with the id (found once the map is read)",
            rawmap([(P("proto"), P("reel/1")), (P("type"), P("STATUS")), (P("id"), P(914)), (P("id"), P(915))]), (), "malformed", 915)
    refused("a duplicate key in a nested map is malformed, with the id read before it",
            rawmap([(P("proto"), P("reel/1")), (P("type"), P("STATUS")), (P("id"), P(916)),
                    (P("x"), rawmap([(P("a"), P(1)), (P("a"), P(2))]))]), (), "malformed", 916)
    refused("a bin value is malformed", {"type": "STATUS", "id": 917, "x": b"bytes"}, (), "malformed", 917)
    refused("an ext value is malformed", {"type": "STATUS", "id": 918, "x": msgpack.ExtType(1, b"ab")}, (), "malformed", 918)
    refused("an id that is not a uint (-1) is malformed, id 0", {"type": "STATUS", "id": -1}, (), "malformed", 0)
    refused("an id that is a string is malformed, id 0", {"type": "STATUS", "id": "7"}, (), "malformed", 0)
    refused("an id that is a float is malformed, id 0", {"type": "STATUS", "id": 7.0}, (), "malformed", 0)
    refused("a repeated id gives the last one read", rawmap([(P("proto"), P("reel/1")), (P("id"), P(919)), (P("type"), P("STATUS")),
                                                             (P("id"), P(920))]), (), "malformed", 920)
    refused("a missing type is malformed", {"id": 921}, (), "malformed", 921)
    refused("a type that is not a string is malformed", {"id": 922, "type": 3}, (), "malformed", 922)
    refused("a type with a NUL is malformed", {"id": 923, "type": "STA\0TUS"}, (), "malformed", 923)
    # tensor descriptors that do not match the frames
    d, f = cl
    refused("a descriptor without its frame is malformed", g, [cl], "malformed", 901, frames=[])
    refused("a frame without a descriptor is malformed", g, [cl], "malformed", 901, frames=[f, f])
    refused("an empty tensor name is malformed", g, [({**d, "name": ""}, f)], "malformed", 901)
    refused("a tensor name of 48 bytes is malformed", g, [({**d, "name": "c" * 48}, f)], "malformed", 901)
    refused("a repeated tensor name is malformed", g, [cl, cl], "malformed", 901)
    refused("a dtype not in the list is malformed", g, [({**d, "dtype": "F64"}, f)], "malformed", 901)
    refused("bytes other than product(shape) x size are malformed", g, [({**d, "bytes": len(f) - 4}, f[:-4])], "malformed", 901)
    refused("a frame of another length than bytes is malformed", g, [(d, f[:-4])], "malformed", 901)
    # ---- proto, type
    refused("proto missing is proto_mismatch, with the id", rawmap([(P("type"), P("STATUS")), (P("id"), P(924))]), (), "proto_mismatch", 924)
    refused("proto reel/2 is proto_mismatch", {"type": "STATUS", "id": 925, "proto": "reel/2"}, (), "proto_mismatch", 925)
    refused("a type the broker does not take from a client (READY) is unknown_type", {"type": "READY", "id": 926, "name": "x", "models": []},
            (), "unknown_type", 926)
    refused("an unknown type is unknown_type", {"type": "FROB", "id": 927}, (), "unknown_type", 927)
    # ---- the order: frame and limits, id's type, proto, type, fields
    refused("order: a limit (too_large) before the id's type", {"type": "STATUS", "id": -1, "x": "a" * 5000}, (), "too_large", 0)
    refused("order: the id's type before proto", {"type": "STATUS", "id": "x", "proto": "reel/9"}, (), "malformed", 0)
    refused("order: proto before type", {"type": "FROB", "id": 928, "proto": "reel/9"}, (), "proto_mismatch", 928)
    refused("order: type before the fields", {"type": "FROB", "id": 929, "steps": -1}, (), "unknown_type", 929)
    refused("order: proto before a missing type", {"id": 930, "proto": "reel/9"}, (), "proto_mismatch", 930)
    refused("order: proto before a type that is not a string", {"id": 931, "type": 3, "proto": "reel/9"}, (), "proto_mismatch", 931)
    refused("a limit broken before the id is read: id 0",
            rawmap([(P("proto"), P("reel/1")), (P("x"), P("a" * 5000)), (P("type"), P("STATUS")), (P("id"), P(932))]), (), "too_large", 0)
    refused("a map key of 4097 bytes is too_large", {"type": "STATUS", "id": 933, "k" * 4097: 1}, (), "too_large", 933)
    refused("a tensors entry that is not an array is malformed", {"type": "STATUS", "id": 934, "tensors": "x"}, (), "malformed", 934)


def sec_fields(a):
    cl = context()

    def bad(name, id_, says, **fields):
        h, t = gen(id_)
        for k, v in fields.items():
            if v is _DROP:
                h.pop(k, None)
            else:
                h[k] = v
        refused(name, h, t, "bad_request", id_, says)

    bad("steps 0 is bad_request with the doc's words", 1001, "GEN: 'steps' must be in 1..10000 (got 0)", steps=0)
    bad("steps 10001 is bad_request", 1002, "'steps'", steps=10001)
    bad("steps 6.0 (a float) is bad_request with the doc's words", 1003, "GEN: 'steps' must be a non-negative integer", steps=6.0)
    bad("steps as a string is bad_request", 1004, "'steps'", steps="6")
    bad("steps true is bad_request", 1005, "'steps'", steps=True)
    bad("steps nil is the wrong type (nil is not absent)", 1006, "'steps'", steps=None)
    bad("steps missing is bad_request", 1007, "'steps'", steps=_DROP)
    bad("model missing is bad_request", 1008, "'model'", model=_DROP)
    bad("latent_shape missing is bad_request", 1009, "'latent_shape'", latent_shape=_DROP)
    bad("a model name of 56 characters is bad_request", 1010, "'model'", model="m" * 56)
    bad("a model name with a space is bad_request", 1011, "'model'", model="a b")
    bad("latent_shape of 3 entries is bad_request", 1012, "'latent_shape'", latent_shape=[C, 8, 8])
    bad("latent_shape with 0 is bad_request", 1013, "'latent_shape'", latent_shape=[C, 0, 8, 8])
    bad("latent_shape past 65536 is bad_request", 1014, "'latent_shape'", latent_shape=[C, 1, 8, 65538])
    bad("F x H x W past 2^24 is bad_request", 1015, "'latent_shape'", latent_shape=[C, 1, 8192, 4096])
    bad("version 2^63 is bad_request", 1016, "'version'", version=1 << 63)
    bad("shift 0 is bad_request", 1017, "'shift'", shift=0)
    bad("shift -1 is bad_request", 1018, "'shift'", shift=-1.0)
    bad("shift NaN is bad_request", 1019, "'shift'", shift=float("nan"))
    bad("cfg infinite is bad_request", 1020, "'cfg'", cfg=float("inf"))
    bad("cfg finite as a double but not as a float32 is bad_request", 1021, "'cfg'", cfg=1e39)
    bad("sde 1 (not a bool) is bad_request", 1022, "'sde'", sde=1)
    bad("eta -1 with sde is bad_request", 1023, "'eta'", sde=True, eta=-1.0)
    bad("eta as a string without sde is bad_request (a number either way)", 1024, "'eta'", eta="x")
    bad("solver 'heun' is bad_request", 1025, "'solver'", solver="heun")
    bad("seed -1 is bad_request", 1026, "'seed'", seed=-1)
    bad("progress 1 is bad_request", 1027, "'progress'", progress=1)
    bad("deadline_ms -5 is bad_request", 1028, "'deadline_ms'", deadline_ms=-5)
    bad("client 'xyz' (not hex) is bad_request", 1029, "'client'", client="xyz")
    bad("client of 17 hex digits is bad_request", 1030, "'client'", client="1" * 17)
    bad("client as an integer is the wrong type", 1031, "'client'", client=5)
    bad("output 'gif' is bad_request", 1032, "'output'", output="gif")
    bad("negative_prompt without prompt is bad_request", 1033, "negative_prompt", negative_prompt="x")
    bad("return_trajectory 1 is bad_request", 1034, "'return_trajectory'", return_trajectory=1)
    bad("client '' (no digits) is bad_request", 1057, "'client'", client="")
    bad("eta NaN without sde is bad_request (a number either way)", 1065, "'eta'", eta=float("nan"))
    bad("eta past float32 with sde is bad_request", 1066, "'eta'", sde=True, eta=1e39)
    r = ask(gen(1067, eta=1e39)[0], [cl])
    check("eta past float32 without sde is read and ignored (finite as a double)", r and r[0].get("type") == "RESULT", str(r and r[0]))
    refused("uncond with a prompt is bad_request naming uncond (the protocol's rule before the model's)", gen(1068, prompt="a cat", cfg=2.0)[0],
            [context(name="uncond")], "bad_request", 1068, "uncond")
    bad("a prompt with a NUL is bad_request naming prompt", 1058, "'prompt'", prompt="a\0b")
    bad("output video for a group is bad_request (a group asks for frames)", 1059, "'video'", n=2, output="video")
    bad("a solver name of 16 characters is bad_request", 1060, "'solver'", solver="u" * 16)
    bad("latent_shape of floats is bad_request", 1061, "'latent_shape'", latent_shape=[4.0, 1, 8, 8])
    refused("a BF16 latent is bad_request naming latent", gen(1062)[0], [cl, tensor("latent", [C, 1, 8, 8], dtype="BF16", raw=bytes(2 * C * 64))],
            "bad_request", 1062, "latent")
    r = ask(gen(1063, model="m" * 55, deadline_ms=200)[0], [cl], timeout=30)
    check("a model name of 55 characters is read (no_worker: none serves it)", r and r[0].get("code") == "no_worker", str(r and r[0]))
    r = ask(gen(1064, output="frames", shape=(C, 1, 64, 64), deadline_ms=300)[0], [cl], timeout=30)
    check("output frames past --max-tokens with no worker holding a VAE: no_worker at its deadline (routing, before any worker's bound)",
          r and r[0].get("code") == "no_worker" and r[0].get("id") == 1064, str(r and r[0]))
    refused("a GEN without context or prompt is bad_request naming context", gen(1035)[0], [], "bad_request", 1035, "context")
    refused("prompt and context together are bad_request", gen(1036, prompt="a cat")[0], [cl], "bad_request", 1036)
    refused("a U8 context is bad_request naming context", gen(1037)[0], [tensor("context", [5, T], dtype="U8", raw=bytes(5 * T))],
            "bad_request", 1037, "context")
    refused("an F16 context is bad_request naming context", gen(1038)[0], [tensor("context", [5, T], dtype="F16", raw=bytes(2 * 5 * T))],
            "bad_request", 1038, "context")
    refused("a tensor of another name is bad_request", gen(1039)[0], [cl, tensor("noise", [4], [0.0] * 4)], "bad_request", 1039)
    refused("a latent of another shape than latent_shape is bad_request naming latent", gen(1040)[0],
            [cl, tensor("latent", [C, 1, 8, 6], drawn(1, C * 48))], "bad_request", 1040, "latent")
    refused("a context of 1 dim is bad_request naming context", gen(1041)[0], [tensor("context", [T], [0.0] * T)], "bad_request", 1041, "context")
    nan_ctx = tensor("context", [5, T], [float("nan")] + [0.0] * (5 * T - 1))
    refused("a context holding NaN is bad_request naming context", gen(1042)[0], [nan_ctx], "bad_request", 1042, "context")
    refused("a latent holding infinity is bad_request naming latent", gen(1043)[0],
            [cl, tensor("latent", [C, 1, 8, 8], [float("inf")] + [0.0] * (C * 64 - 1))], "bad_request", 1043, "latent")
    # the model's rules (the worker, or the broker when it knows them)
    refused("C other than the model's in_channels is bad_request", gen(1044, shape=(3, 1, 8, 8))[0], [cl], "bad_request", 1044)
    refused("T other than the model's text_dim is bad_request", gen(1045)[0], [context(width=16)], "bad_request", 1045)
    refused("H not a multiple of the patch is bad_request", gen(1046, shape=(C, 1, 7, 8))[0], [cl], "bad_request", 1046)
    # the worker's bounds, last
    refused("a sample past the worker's --max-tokens is too_large", gen(1047, shape=(C, 1, 64, 64))[0], [cl], "too_large", 1047)
    refused("order: wrong channels with too many tokens is bad_request for the channels, not too_large",
            gen(1048, shape=(3, 1, 64, 64))[0], [cl], "bad_request", 1048)
    refused("order: a protocol field rule before the model's (steps 0 with wrong channels)", gen(1049, shape=(3, 1, 8, 8), steps=0)[0], [cl],
            "bad_request", 1049, "'steps'")
    refused("a prompt to a model without text_len is bad_request: takes no 'prompt'", gen(1050, prompt="a cat")[0], [], "bad_request", 1050,
            "takes no 'prompt'")
    r = ask(gen(1051, output="frames", deadline_ms=400)[0], [cl], timeout=30)
    check("output frames with no worker holding a VAE: ERROR no_worker at its deadline", r and r[0].get("type") == "ERROR"
          and r[0].get("code") == "no_worker" and r[0].get("id") == 1051, str(r and r[0]))
    refused("a GEN whose tensors are more than the broker may ever hold (--max-held-mb 1) is too_large",
            gen(1052)[0], [BIG_CONTEXT], "too_large", 1052, "--max-held-mb")
    # a deadline past 2^31-1 is clamped, not refused
    r = ask(gen(1053, deadline_ms=(1 << 40))[0], [cl])
    check("deadline_ms past 2^31-1 is clamped, not refused", r and r[0].get("type") == "RESULT", str(r and r[0]))
    r = ask(gen(1054, eta=-1.0)[0], [cl])
    check("eta -1 without sde is read and ignored", r and r[0].get("type") == "RESULT", str(r and r[0]))
    r = ask(gen(1055, solver="euler", output="latent", n=1, client="0")[0], [cl])
    check("defaults written out (solver euler, output latent, n 1, client 0) are read", r and r[0].get("type") == "RESULT", str(r and r[0]))
    r = ask(gen(1056, model="nosuch", deadline_ms=300)[0], [cl], timeout=30)
    check("a model no worker serves: no_worker at its deadline", r and r[0].get("code") == "no_worker" and r[0].get("id") == 1056, str(r and r[0]))


def status():
    r = ask({"type": "STATUS", "id": 1})
    return r[0] if r and r[0].get("type") == "STATUS_REPLY" else {}


def sec_counters(a):
    cl = context()
    s0 = status()
    refused("a malformed message (counted)", b"\xc1", (), "malformed", 0)
    refused("a header limit (too_large, counted)", {"type": "STATUS", "id": 2, "x": "a" * 5000}, (), "too_large", 2)
    refused("a proto_mismatch (counted)", {"type": "STATUS", "id": 3, "proto": "reel/0"}, (), "proto_mismatch", 3)
    refused("an unknown_type (not counted)", {"type": "FROB", "id": 4}, (), "unknown_type", 4)
    refused("a bad_request (not counted)", gen(5, steps=0)[0], [cl], "bad_request", 5)
    refused("a GEN too_large for its tensors' size (not counted)", gen(6)[0], [BIG_CONTEXT], "too_large", 6, "--max-held-mb")
    s1 = status()
    check("STATUS malformed counts malformed, header too_large and proto_mismatch, not unknown_type, bad_request or a GEN's size",
          s1.get("malformed", -1) - s0.get("malformed", 0) == 3, f"{s0.get('malformed')} -> {s1.get('malformed')}")
    check("GENs refused on arrival count in neither requests_ok nor requests_failed",
          s1.get("requests_ok") == s0.get("requests_ok") and s1.get("requests_failed") == s0.get("requests_failed"),
          f"ok {s0.get('requests_ok')} -> {s1.get('requests_ok')}, failed {s0.get('requests_failed')} -> {s1.get('requests_failed')}")
    r = result("a GEN for the counters", gen(7, steps=3, seed=1)[0], [cl])
    ask(gen(8, model="nosuch", deadline_ms=200)[0], [cl], timeout=30)
    s2 = status()
    check("a RESULT counts in requests_ok, a no_worker in requests_failed",
          s2.get("requests_ok") == s1.get("requests_ok", 0) + 1 and s2.get("requests_failed") == s1.get("requests_failed", 0) + 1,
          f"ok {s1.get('requests_ok')} -> {s2.get('requests_ok')}, failed {s1.get('requests_failed')} -> {s2.get('requests_failed')}")
    steps = sum(s2.get(k, 0) - s1.get(k, 0) for k in ("steps_replayed", "steps_eager", "steps_captured"))
    check("the steps counters grow by the RESULT's steps", steps == 3, f"{steps}")
    if r:
        w = (s2.get("workers") or [{}])[0]
        check("the RESULT's worker is the worker's name", r[0].get("worker") == w.get("name"), f"{r[0].get('worker')} vs {w.get('name')}")
        check("the RESULT's key_hash is among the worker's STATUS keys", r[0].get("key_hash") in (w.get("keys") or []),
              f"{r[0].get('key_hash')} not in {w.get('keys')}")
    # the bound on refusals: 20 at once, then 10 a second; the rest counted
    c = conn()
    for i in range(40):
        c.send(b"\xc1")
    got = 0
    while c.recv(1.0) is not None:
        got += 1
    c.close()
    s3 = status()
    sup = s3.get("replies_suppressed", 0) - s2.get("replies_suppressed", 0)
    check("a burst of 40 bad messages is answered about 20 times (20 at once, 10 a second after)", 20 <= got < 40, f"{got} answers")
    check("the refusals not sent are counted in replies_suppressed", got + sup == 40, f"{got} answered, {sup} suppressed")
    r = ask(b"\xc1")
    check("a new connection has a fresh budget", r and r[0].get("code") == "malformed", str(r and r[0]))


def sec_strings(a):
    cl = context()
    # a type that is not UTF-8, echoed: sent as valid UTF-8 (strict decoding here)
    raw = rawmap([(P("proto"), P("reel/1")), (P("type"), b"\xa5FR\xffOB"), (P("id"), P(1101))])
    c = conn()
    c.send(raw)
    ok = c.s.poll(30000)
    parts = c.s.recv_multipart() if ok else None
    c.close()
    try:
        h = msgpack.unpackb(parts[0], raw=False) if parts else None
        check("an ERROR echoing a type that is not UTF-8 decodes strictly (U+FFFD for the bad byte)",
              h and h.get("code") == "unknown_type" and h.get("id") == 1101, str(h))
    except ValueError as e:
        check("an ERROR echoing a type that is not UTF-8 decodes strictly (U+FFFD for the bad byte)", False, str(e))
    raw = rawhdr({"type": "GEN", "id": 1102, "steps": 2, "latent_shape": [C, 1, 8, 8], "tensors": [cl[0]]}, [(P("model"), b"\xa3t\xffy")])
    refused("a model name that is not UTF-8 is bad_request naming model", raw, [cl], "bad_request", 1102, "'model'")
    refused("a prompt of 4097 bytes is too_large as the message is read", gen(1103, prompt="a" * 4097)[0], [], "too_large", 1103)
    refused("a prompt with a control character is bad_request naming prompt (the protocol's rule before the model's)",
            gen(1104, prompt="a\x01b")[0], [], "bad_request", 1104, "prompt")
    r = ask(gen(1105, prompt="")[0], [cl])
    check("an empty prompt is the same as none: a GEN with it and a context runs", r and r[0].get("type") == "RESULT", str(r and r[0]))
    refused("an empty prompt is none: without a context it is bad_request naming context", gen(1106, prompt="")[0], [], "bad_request", 1106,
            "context")
    refused("negative_prompt with an empty prompt (none) is bad_request", gen(1107, prompt="", negative_prompt="x")[0], [cl],
            "bad_request", 1107, "negative_prompt")
    r = ask({"type": "STATUS", "id": (1 << 64) - 1})
    check("an id of 2^64-1 comes back as it is", r and r[0].get("id") == (1 << 64) - 1, str(r and r[0].get("id")))


def sec_queue(a):
    """The worker's one slot held by a long GEN: timeout, BUSY, giving a place."""
    cl = context()
    hold = conn()
    hold.send(*gen(1201, progress=True, **LONG))
    p = wait_progress(hold, 1201)
    if not check("a long GEN holds the worker's one slot", p and p.get("type") == "PROGRESS", str(p)):
        hold.close()
        return
    r = ask(gen(1202, steps=2, deadline_ms=300)[0], [cl], timeout=30)
    check("a GEN an eligible worker could serve but that waited past its deadline: ERROR timeout",
          r and r[0].get("type") == "ERROR" and r[0].get("code") == "timeout" and r[0].get("id") == 1202, str(r and r[0]))
    # given up at its deadline: forgotten, its token and id sent again are a new request
    r = ask(gen(1203, steps=2, deadline_ms=300, client="7e58")[0], [cl], timeout=30)
    r2 = ask(gen(1203, steps=2, deadline_ms=300, client="7e58", seed=1)[0], [cl], timeout=30)
    check("a request given up at its deadline is forgotten: the same token and id again is a new request (its own timeout)",
          r and r2 and r[0].get("code") == "timeout" and r2[0].get("code") == "timeout", f"{r and r[0]} / {r2 and r2[0]}")
    # a GEN no live worker can serve waits in the queue too
    nw = conn()
    nw.send(*gen(1204, model="nosuch", deadline_ms=20000))
    end = time.monotonic() + 10
    while time.monotonic() < end and status().get("queue") != 1:
        time.sleep(0.05)
    check("a GEN for a model nobody serves waits in the queue (STATUS queue 1)", status().get("queue") == 1)
    nw.send({"type": "CANCEL", "id": 1204})
    r = nw.final(10)
    check("a queued GEN for an unserved model is cancelled unstarted", r and r[0].get("code") == "cancelled", str(r and r[0]))
    nw.close()
    # tensors held past --max-held-mb beside the others: BUSY
    half = tensor("context", [4200, T], raw=bytes(4200 * T * 4))
    h1 = conn()
    h1.send(gen(1205, steps=2)[0], [half])
    end = time.monotonic() + 10
    while time.monotonic() < end and status().get("queue") != 1:
        time.sleep(0.05)
    r = ask(gen(1206, steps=2)[0], [half], timeout=10)
    check("a GEN whose tensors do not fit beside those the broker holds (--max-held-mb) is BUSY",
          r and r[0].get("type") == "BUSY" and r[0].get("id") == 1206, str(r and r[0]))
    h1.send({"type": "CANCEL", "id": 1205})
    h1.final(10)
    h1.close()
    qmax = status().get("queue_max", 0)
    A = conn()
    for i in range(qmax):
        A.send(*gen(1300 + i, steps=2, seed=i))
    end = time.monotonic() + 10
    while time.monotonic() < end and status().get("queue") != qmax:
        time.sleep(0.05)
    r = None
    A.send(*gen(1300 + qmax, steps=2))
    r = A.final(10)
    check("a GEN to a full queue from the sender holding it is answered BUSY with its id and a message",
          r and r[0].get("type") == "BUSY" and r[0].get("id") == 1300 + qmax and isinstance(r[0].get("message"), str), str(r and r[0]))
    B = conn()
    B.send(*gen(1400, steps=2))
    r = A.final(10)
    check("a full queue makes way for another sender: the newest of the one with most waiting is answered BUSY (it gave its place)",
          r and r[0].get("type") == "BUSY" and r[0].get("id") == 1300 + qmax - 1, str(r and r[0]))
    check("a GEN giving its place says so in its BUSY", r and "place" in (r[0].get("message") or ""), str(r and r[0]))
    B.send({"type": "STATUS", "id": 14})
    r = B.final(10)
    check("the new sender's GEN is not refused at once (the next answer is the STATUS's)", r and r[0].get("type") == "STATUS_REPLY",
          str(r and r[0]))
    hold.send({"type": "CANCEL", "id": 1201})
    hold.final(30)
    for i in range(qmax - 1):
        A.send({"type": "CANCEL", "id": 1300 + i})
    B.send({"type": "CANCEL", "id": 1400})
    r = B.final(30)
    check("the GEN that took the place was queued (cancelled unstarted) or ran", r and r[0].get("id") == 1400
          and r[0].get("type") in ("RESULT", "ERROR"), str(r and r[0]))
    n = 0
    while A.final(5) is not None:
        n += 1
        if n >= qmax - 1:
            break
    A.close()
    B.close()
    hold.close()
    end = time.monotonic() + 10
    while time.monotonic() < end and status().get("queue") != 0:
        time.sleep(0.05)


def sec_resend_rules(a):
    """What a resend must match, compared as the worker reads it."""
    tok = "7e57"
    h, t = gen(1501, progress=True, client=tok, seed=5, **LONG)
    c1 = conn()
    c1.send(h, t)
    p = wait_progress(c1, 1501)
    if not check("a long GEN with a token starts", p and p.get("type") == "PROGRESS", str(p)):
        c1.close()
        return

    def attaches(name, hdr, tensors=t):
        c = conn()
        c.send(hdr, tensors)
        r = wait_progress(c, 1501, 30)
        c.close()
        return check(name, r and r.get("type") == "PROGRESS", str(r))

    attaches("a resend with the defaults written out (solver euler, output latent, n 1, seeds [seed]) attaches",
             h | {"solver": "euler", "output": "latent", "n": 1, "seeds": [5]})
    attaches("a resend with another eta (not read without sde) attaches", h | {"eta": 0.3})
    attaches("a resend with another cfg (not read without uncond) attaches", h | {"cfg": 4.0})
    refused("a resend with version 1 written out (the original had none) differs in version", h | {"version": 1}, t, "bad_request", 1501,
            "'version' differs")
    refused("a resend whose context has other bytes is bad_request", h, [context(seed=99)], "bad_request", 1501, "differs")
    refused("a resend with a latent (even the seed's) differs", h, t + [tensor("latent", [C, 1, 32, 32], drawn(5, C * 1024))],
            "bad_request", 1501, "differs")
    refused("a resend with other steps is bad_request naming steps", h | {"steps": 9999}, t, "bad_request", 1501, "'steps' differs")
    # its holder is the last resend's connection (closed): a CANCEL with the
    # token from any connection ends it; the worker's slot frees once it stopped
    c = conn()
    c.send({"type": "CANCEL", "id": 1501, "client": tok})
    end = time.monotonic() + 20
    while time.monotonic() < end and ((status().get("workers") or [{}])[0].get("inflight") or 0) > 0:
        time.sleep(0.05)
    check("a CANCEL with the token, from a connection that sent no GEN, stops the request (the worker's slot frees)",
          ((status().get("workers") or [{}])[0].get("inflight") or 0) == 0)
    c.close()
    c1.close()
    # two tokenless GENs with one id on one connection both run
    c = conn()
    c.send(*gen(1502, steps=2, seed=1))
    c.send(*gen(1502, steps=2, seed=2))
    r1, r2 = c.final(30), c.final(30)
    c.close()
    check("two live tokenless GENs with one id on one connection both run",
          r1 and r2 and r1[0].get("type") == r2[0].get("type") == "RESULT" and r1[0].get("id") == r2[0].get("id") == 1502
          and r1[1]["latent"][1] != r2[1]["latent"][1], f"{r1 and r1[0].get('type')} {r2 and r2[0].get('type')}")


def sec_upload(a):
    w3 = a.weights3
    if not w3:
        return
    data = open(w3, "rb").read()
    sha = hashlib.sha256(data).hexdigest()
    ver = a.upload_version
    base = {"type": "UPLOAD", "component": "transformer", "version": ver, "sha256": sha, "size": len(data)}

    def chunk(off, n):
        return tensor("chunk", [len(data[off:off + n])], dtype="U8", raw=data[off:off + n])

    refused("an UPLOAD chunk in F32 is bad_request naming chunk", base | {"id": 1601, "offset": 0}, [tensor("chunk", [1], [0.0])],
            "bad_request", 1601, "chunk")
    refused("an UPLOAD of size 0 is bad_request naming size", base | {"id": 1602, "offset": 0, "size": 0}, [chunk(0, 16)], "bad_request", 1602,
            "size")
    refused("an UPLOAD of another component is bad_request", base | {"id": 1603, "offset": 0, "component": "vae"}, [chunk(0, 16)],
            "bad_request", 1603, "component")
    refused("an UPLOAD chunk past size is bad_request", base | {"id": 1604, "offset": len(data) - 4}, [chunk(len(data) - 16, 16)],
            "bad_request", 1604)
    refused("an UPLOAD of size 2^36 + 1 is bad_request naming size", base | {"id": 1605, "offset": 0, "size": (1 << 36) + 1}, [chunk(0, 16)],
            "bad_request", 1605, "size")
    refused("an UPLOAD without its chunk is bad_request naming chunk", base | {"id": 1606, "offset": 0}, (), "bad_request", 1606, "chunk")
    wrong = base | {"id": 1607, "offset": 0, "sha256": "ef" * 32, "size": 16}
    refused("an UPLOAD whose bytes hash to another digest is bad_request", wrong, [chunk(0, 16)], "bad_request", 1607, "hash to")
    c = conn()
    step = 256 << 10
    off = 0
    acks = []
    i = 0
    while off < len(data):
        c.send(base | {"id": 1610 + i, "offset": off}, [chunk(off, step)])
        r = c.final(30)
        acks.append(r and r[0])
        if not (r and r[0].get("type") == "UPLOAD_ACK"):
            break
        off = r[0].get("received", off)
        i += 1
        if i == 1:
            # a chunk at another offset is not written; its answer says where to go on
            c.send(base | {"id": 1699, "offset": 0}, [chunk(0, step)])
            r2 = c.final(30)
            check("an UPLOAD at another offset than received is answered with where the copy ends",
                  r2 and r2[0].get("type") == "UPLOAD_ACK" and r2[0].get("received") == off and r2[0].get("id") == 1699, str(r2 and r2[0]))
    last = acks[-1] if acks else None
    check("UPLOAD chunks are each answered UPLOAD_ACK with their id; the last complete with received = size",
          last and last.get("type") == "UPLOAD_ACK" and last.get("complete") is True and last.get("received") == len(data)
          and last.get("component") == "transformer" and last.get("version") == ver, str(last))
    c.close()
    r = ask({"type": "SYNC", "id": 1620, "component": "transformer", "version": ver, "sha256": sha, "uploaded": True}, timeout=60)
    check("SYNC uploaded: SYNC_DONE applied by the worker, current the uploaded version",
          r and r[0].get("type") == "SYNC_DONE" and r[0].get("applied") == ["w1"] and r[0].get("current") == ver, str(r and r[0]))
    refused("SYNC uploaded of a version the broker does not hold is bad_request",
            {"type": "SYNC", "id": 1621, "component": "transformer", "version": ver + 1, "sha256": "cd" * 32, "uploaded": True}, (),
            "bad_request", 1621)
    refused("FETCH from a client of a broker with no peer is unknown_type",
            {"type": "FETCH", "id": 1622, "component": "transformer", "version": ver, "sha256": sha}, (), "unknown_type", 1622)


class FakeWorker:
    """A worker of its own on the worker endpoint ("Worker <-> broker"):
    READY, HEARTBEATs, acks every SYNC, and answers each REQUEST with what
    the check asks, so the broker's handling of a worker's answers is seen
    from the client's side."""

    def __init__(self, ep, name):
        self.s = ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.setsockopt(zmq.ROUTING_ID, name.encode())
        self.s.connect(ep)
        self.name = name
        self.beat = 0.0
        self.send({"type": "READY", "name": name, "device": "cpu", "arch": "fake", "streams": 1, "max_inflight": 4,
                   "models": ["fakem"], "versions": {"transformer": 1}})

    def send(self, hdr, tensors=()):
        hdr = {"proto": "reel/1", "id": 0} | hdr
        if tensors:
            hdr["tensors"] = [t[0] for t in tensors]
        self.s.send_multipart([msgpack.packb(hdr, use_bin_type=True)] + [t[1] for t in tensors])

    def pump(self, timeout):
        """Heartbeats and acks until a REQUEST comes (its header) or TIMEOUT."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if time.monotonic() - self.beat > 0.1:
                self.send({"type": "HEARTBEAT"})
                self.beat = time.monotonic()
            if not self.s.poll(50):
                continue
            parts = self.s.recv_multipart()
            h = msgpack.unpackb(parts[0], raw=False)
            t = h.get("type")
            if t == "REQUEST":
                return h
            if t == "SYNC":
                self.send({"type": "SYNC_ACK", "id": h.get("id", 0), "component": h.get("component"), "version": h.get("version"), "ok": True})
            elif t == "RECONNECT":
                self.send({"type": "READY", "name": self.name, "models": ["fakem"], "versions": {"transformer": 1}, "max_inflight": 4})
        return None

    def close(self):
        self.send({"type": "DISCONNECT"})
        self.s.close(linger=100)


def sec_fake(a):
    if not a.workers:
        return
    fw = FakeWorker(a.workers, "fake1")
    end = time.monotonic() + 10
    seen = False
    while time.monotonic() < end and not seen:
        fw.pump(0.1)
        seen = any(w.get("name") == "fake1" for w in status().get("workers") or [])
    if not check("a worker of the client's own registers (READY) and shows in STATUS", seen):
        fw.close()
        return
    lat = tensor("latent", [C, 1, 8, 8], drawn(1, C * 64))

    def run(id_, answer, **fields):
        """A GEN of model fakem; ANSWER(request header) sends the fake's
        answer; returns (client's PROGRESS list, final reply header)."""
        c = conn()
        c.send(*gen(id_, model="fakem", **fields))
        req = fw.pump(10)
        if req is None:
            c.close()
            return [], None
        answer(req)
        prog = []
        r = None
        end = time.monotonic() + 10
        while time.monotonic() < end:
            fw.pump(0.05)
            x = c.recv(0.05)
            if x is None:
                continue
            if x[0].get("type") == "PROGRESS":
                prog.append(x[0])
                continue
            r = x
            break
        c.close()
        return prog, r and r[0]

    def err(code, message="boom"):
        return lambda q: fw.send({"type": "ERROR", "id": q["id"], "code": code, "message": message})

    _, r = run(1701, err("weird_code"))
    check("a worker's ERROR code that is not in the list reaches the client as internal, naming the worker's code",
          r and r.get("type") == "ERROR" and r.get("code") == "internal" and r.get("id") == 1701 and "weird_code" in (r.get("message") or ""), str(r))
    _, r = run(1702, err("standby"))
    check("a worker's ERROR standby (a broker's word) reaches the client as internal", r and r.get("code") == "internal" and r.get("id") == 1702,
          str(r))
    _, r = run(1703, err("bad_request", "worker says no"))
    check("a worker's ERROR bad_request reaches the client with its code and message and the client's id",
          r and r.get("code") == "bad_request" and r.get("id") == 1703 and "worker says no" in (r.get("message") or ""), str(r))

    def good(q, extra=None, latent=None, stats=None):
        h = {"type": "RESULT", "id": q["id"], "worker": "liar", "version": max(1, q.get("version") or 1),
             "stats": stats if stats is not None else {"captured": 0, "replayed": 0, "eager": 4, "declines": {}, "seconds": 0.001, "future": 1},
             "zzz_unknown": 5}
        if extra:
            h.update(extra)
        fw.send(h, [latent or lat])

    _, r = run(1704, good)
    check("a worker's RESULT reaches the client with the client's id", r and r.get("type") == "RESULT" and r.get("id") == 1704, str(r))
    if r and r.get("type") == "RESULT":
        check("RESULT worker is set by the broker whatever the worker's RESULT says", r.get("worker") == "fake1", str(r.get("worker")))
        check("unknown top-level RESULT fields are dropped", "zzz_unknown" not in r, str(sorted(r)))
        check("a known field goes on whole, unknown keys nested in it kept (stats.future)", (r.get("stats") or {}).get("future") == 1,
              str(r.get("stats")))
        check("first_version is forwarded as the worker sent it (absent: the reader takes version)", "first_version" not in r
              or r.get("first_version") == r.get("version"), str(r))
    nan_lat = tensor("latent", [C, 1, 8, 8], [float("nan")] + [0.0] * (C * 64 - 1))
    _, r = run(1705, lambda q: good(q, latent=nan_lat))
    check("a worker's RESULT whose latent holds NaN: the client gets ERROR internal naming the worker",
          r and r.get("type") == "ERROR" and r.get("code") == "internal" and r.get("id") == 1705 and "fake1" in (r.get("message") or ""), str(r))
    _, r = run(1706, lambda q: fw.send({"type": "RESULT", "id": q["id"], "version": max(1, q.get("version") or 1)}, [lat]))
    check("a worker's RESULT without its required stats still ends the request: ERROR internal", r and r.get("code") == "internal"
          and r.get("id") == 1706, str(r))

    def progress_then_result(q):
        for st, sts, extra in ((1, 4, {}), (3, 4, {}), (2, 4, {}), (9, 4, {}), (3, 99, {}), (4, 4, {"decoded": 1, "decode_frames": 1})):
            fw.send({"type": "PROGRESS", "id": q["id"], "step": st, "steps": sts} | extra)
        fw.send({"type": "PROGRESS", "id": q["id"], "step": 4, "steps": 4})
        good(q)

    prog, r = run(1707, progress_then_result, progress=True)
    got = [(p.get("step"), p.get("steps"), p.get("decoded")) for p in prog]
    check("the broker drops a worker's PROGRESS that goes back, passes its end, or has decoded frames for a latent output",
          got == [(1, 4, None), (3, 4, None), (4, 4, None)] and r and r.get("type") == "RESULT", f"{got} then {r and r.get('type')}")
    fw.close()


SECTIONS = [("status", sec_status), ("gen", sec_gen), ("cfg", sec_cfg), ("group", sec_group), ("rollout", sec_rollout),
            ("progress", sec_progress), ("limits", sec_limits), ("fields", sec_fields), ("cancel", sec_cancel),
            ("resend", sec_resend), ("counters", sec_counters), ("strings", sec_strings), ("queue", sec_queue),
            ("rules", sec_resend_rules), ("fake", sec_fake), ("sync", sec_sync), ("upload", sec_upload)]


def main():
    global EP
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", required=True)
    ap.add_argument("--weights-dir", required=True)
    ap.add_argument("--workers", default="", help="the broker's worker endpoint: a worker of this client's own joins there")
    ap.add_argument("--weights2", required=True)
    ap.add_argument("--weights3", default="", help="other weights, uploaded by value (the broker has --weights-dir)")
    ap.add_argument("--upload-version", type=int, default=3)
    ap.add_argument("--for", dest="secs", type=float, default=120.0)
    ap.add_argument("-k", dest="only", default="")
    a = ap.parse_args()
    guard(a.secs)
    EP = a.clients
    for name, fn in SECTIONS:
        if a.only and a.only not in name:
            continue
        t0 = time.monotonic()
        fn(a)
        print(f"spec_client: section {name}: {time.monotonic() - t0:.1f} s")
    print(f"spec_client: {fails} failed")
    done(0)


if __name__ == "__main__":
    main()
