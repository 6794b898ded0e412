"""adversarial_peers.py -- the daemons' internal sides under a hostile peer,
for tests/cli_adversarial_peers.sh.

    adversarial_peers.py broker --clients EP --workers EP --log BROKER_LOG [--for SECONDS]
    adversarial_peers.py worker --bind EP --log WORKER_LOG --dir DIR [--for SECONDS]

`broker`: a fake worker ("fake", serving model "fakem", which no real
worker serves, so every GEN of it is routed to the fake) registers beside a
real reel-worker serving "tiny", and sends what a broken or hostile worker
could: junk, unknown types, RESULTs for requests it was never sent, for
another worker's request, twice, of the wrong shape, dtype, count or
values or with stats of more steps than the request runs, PROGRESS past
its end, acks of versions never sent, a READY that
changes its model, FETCHes past the end of an upload, HEARTBEATs
announcing messages that never come. After each, the broker must still
answer a real client's tiny GEN bitwise as at the start, never hand a
client a garbage RESULT, and log (or count) what it refused.

`worker`: a fake broker (a ROUTER the reel-worker connects to) sends the
worker malformed REQUESTs, more REQUESTs than it may hold, SYNCs of
missing, foreign, mismatched or outside files, more SYNCs than may wait,
CANCELs of unknown ids, duplicate ids and unknown types; each must be
answered as docs/PROTOCOL.md says, and a valid REQUEST afterwards must
give the bitwise result it gave first.

Prints one PASS/FAIL line per check (tests/lib_cli.sh py_checks), exit 0.
"""

import argparse
import hashlib
import json
import os
import sys
import time

import msgpack
import numpy as np
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_guard import done, guard  # noqa: E402
from peer_wire import PROTO, pack, say  # noqa: E402

CTX = np.random.default_rng(5).standard_normal((5, 32)).astype(np.float32)


def unpack(frames):
    try:
        hdr = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 -- a peer's junk is data here
        return {"type": "?junk"}, {}
    ts = {}
    for desc, frame in zip(hdr.get("tensors") or [], frames[1:]):
        ts[desc["name"]] = (desc["dtype"], tuple(desc["shape"]), bytes(frame))
    return hdr, ts


def log_count(path, text):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return sum(text in line for line in f)
    except OSError:
        return 0


class Peer:
    """A DEALER with an inbox; every wait pumps all peers (their heartbeats)."""

    def __init__(self, net, endpoint, ident=None, heartbeat=False):
        self.net = net
        self.s = net.ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.setsockopt(zmq.SNDTIMEO, 2000)
        if ident:
            self.s.setsockopt(zmq.ROUTING_ID, ident.encode())
        self.s.connect(endpoint)
        self.heartbeat = heartbeat
        self.inbox = []
        net.peers.append(self)

    def send(self, hdr, tensors=()):
        self.s.send_multipart(pack(hdr, tensors))

    def send_raw(self, frames):
        self.s.send_multipart(frames)

    def close(self):
        self.net.peers.remove(self)
        self.s.close(linger=0)

    def wait(self, pred, secs):
        """The first message in the inbox (or to come within secs) that pred takes, removed; None."""
        end = time.monotonic() + secs
        while True:
            for i, (h, t) in enumerate(self.inbox):
                if pred(h, t):
                    return self.inbox.pop(i)
            if time.monotonic() >= end:
                return None
            self.net.pump(0.02)

    def drain(self, secs):
        """What comes within secs (pumping), taken."""
        self.net.settle(secs)
        got, self.inbox = self.inbox, []
        return got


class Net:
    def __init__(self):
        self.ctx = zmq.Context.instance()
        self.peers = []
        self.routers = []
        self.next_hb = 0.0

    def pump(self, secs):
        now = time.monotonic()
        if now >= self.next_hb:
            for p in self.peers:
                if p.heartbeat:
                    try:
                        p.send({"type": "HEARTBEAT"})
                    except zmq.Again:
                        pass
            for r in self.routers:
                r.beat()
            self.next_hb = now + 0.1
        poller = zmq.Poller()
        for p in self.peers:
            poller.register(p.s, zmq.POLLIN)
        for r in self.routers:
            poller.register(r.s, zmq.POLLIN)
        for sock, _ in poller.poll(int(secs * 1000)):
            for p in self.peers:
                if p.s is sock:
                    while True:
                        try:
                            fr = p.s.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        h, t = unpack(fr)
                        if h.get("type") != "HEARTBEAT":
                            p.inbox.append((h, t))
            for r in self.routers:
                if r.s is sock:
                    r.take()

    def settle(self, secs):
        end = time.monotonic() + secs
        while time.monotonic() < end:
            self.pump(min(0.02, max(0.0, end - time.monotonic())))


def f32(a):
    return np.ascontiguousarray(a, dtype=np.float32).tobytes()


def gen_hdr(cid, model, steps, seed, **kw):
    h = {"type": "GEN", "id": cid, "model": model, "steps": steps, "latent_shape": [4, 1, 8, 8], "seed": seed}
    h.update(kw)
    return h


def ctx_tensors():
    return [("context", "F32", (5, 32), f32(CTX))]


def is_answer(cid):
    return lambda h, t: h.get("id") == cid and h.get("type") in ("RESULT", "ERROR", "BUSY")


def why(msg):
    if msg is None:
        return "no answer"
    h, _ = msg
    return f"{h.get('type')} {h.get('code', '')} {str(h.get('message', ''))[:160]}"


# ---- the broker's worker side --------------------------------------------------------


def run_broker(a):
    net = Net()
    client = Peer(net, a.clients)
    ids = iter(range(1, 1 << 30))

    def tiny_gen(steps=4, seed=11):
        cid = next(ids)
        client.send(gen_hdr(cid, "tiny", steps, seed), ctx_tensors())
        m = client.wait(is_answer(cid), 60)
        if m and m[0]["type"] == "RESULT" and "latent" in m[1]:
            return m[1]["latent"][2], m
        return None, m

    base, m = tiny_gen()
    say(base is not None, f"a real worker answers a tiny GEN before the battery ({why(m) if base is None else 'RESULT'})")
    if base is None:
        done(0, None)

    def real_still_serves(after):
        lat, m = tiny_gen()
        say(lat == base, f"after {after}: the real worker's tiny GEN is answered bitwise as before ({why(m)})")

    def status():
        cid = next(ids)
        client.send({"type": "STATUS", "id": cid})
        m = client.wait(lambda h, t: h.get("id") == cid and h.get("type") == "STATUS_REPLY", 10)
        return m[0] if m else None

    fake = Peer(net, a.workers, "fake", heartbeat=True)
    fake.send({"type": "READY", "name": "fake", "models": ["fakem"], "versions": {"transformer": 1}, "max_inflight": 16})
    st = None
    end = time.monotonic() + 10
    while time.monotonic() < end:
        st = status()
        if st and any(w["name"] == "fake" for w in st["workers"]):
            break
        net.settle(0.1)
    say(st is not None and any(w["name"] == "fake" for w in st["workers"]), "the fake worker registers beside the real one")
    malformed0 = st["malformed"] if st else 0

    def fake_request(**kw):
        """A client GEN of fakem, and the REQUEST the fake got for it: (client id, broker id) or (cid, None)."""
        cid = next(ids)
        client.send(gen_hdr(cid, "fakem", 3, cid, **kw), ctx_tensors())
        m = fake.wait(lambda h, t: h.get("type") == "REQUEST", 10)
        return cid, (m[0]["id"] if m else None)

    good_latent = f32(np.full((4, 1, 8, 8), 0.25))

    def result(rid, tensors=None, **kw):
        h = {"type": "RESULT", "id": rid, "version": 1,
             "stats": {"captured": 0, "replayed": 0, "eager": 3, "declines": {}, "seconds": 0.01}}
        h.update(kw)
        return h, (tensors if tensors is not None else [("latent", "F32", (4, 1, 8, 8), good_latent)])

    # 1. junk and unknown types from a registered worker
    fake.send_raw([b"\xc1 not msgpack"])
    m = fake.wait(lambda h, t: h.get("type") == "ERROR", 5)
    say(m is not None and m[0].get("code") == "malformed", f"junk from a registered worker is answered malformed ({why(m)})")
    fake.send({"type": "FROB", "id": 3})
    m = fake.wait(lambda h, t: h.get("type") == "ERROR", 5)
    say(m is not None and m[0].get("code") == "unknown_type", f"an unknown type from a worker is answered unknown_type ({why(m)})")
    st = status()
    say(st is not None and st["malformed"] >= malformed0 + 1, f"STATUS counts the junk as malformed ({st and st['malformed']})")

    # 2. RESULT for a request it was never sent
    before = log_count(a.log, "sent RESULT for unknown request 987654")
    fake.send(*result(987654))
    net.settle(0.3)
    st = status()
    say(st is not None and log_count(a.log, "sent RESULT for unknown request 987654") > before,
        "a RESULT for a request never sent is discarded and logged")

    # 3. RESULTs that do not fit their request: each ends it as internal, and nothing after it reaches the client
    latent_nan = np.full((4, 1, 8, 8), 0.25, dtype=np.float32)
    latent_nan[0, 0, 3, 3] = np.nan
    bad_results = [
        ("of the wrong shape", {}, [("latent", "F32", (4, 1, 8, 16), f32(np.zeros((4, 1, 8, 16))))]),
        ("of the wrong dtype", {}, [("latent", "BF16", (4, 1, 8, 8), bytes(2 * 256))]),
        ("without its latent", {}, []),
        ("with a tensor it did not ask for", {}, [("latent", "F32", (4, 1, 8, 8), good_latent),
                                                  ("trajectory", "F32", (4, 4, 1, 8, 8), f32(np.zeros((4, 4, 1, 8, 8))))]),
        ("with a NaN latent", {}, [("latent", "F32", (4, 1, 8, 8), f32(latent_nan))]),
        ("at version 0", {"version": 0}, None),
        ("with stats of the wrong type", {"stats": "fast"}, None),
        ("claiming 2^64-1 captured steps", {"stats": {"captured": 2 ** 64 - 1, "replayed": 0, "eager": 0,
                                                      "declines": {}, "seconds": 0.01}}, None),
        ("claiming more steps than its request runs", {"stats": {"captured": 2, "replayed": 2, "eager": 0,
                                                                 "declines": {}, "seconds": 0.01}}, None),
        ("of a group's n for a single sample", {"n": 4, "seeds": [1, 2, 3, 4]}, None),
        ("with version_runs past its steps", {"version_runs": [{"from": 0, "version": 1}, {"from": 99, "version": 1}]}, None),
    ]
    st0 = status()
    for what, fields, tensors in bad_results:
        cid, rid = fake_request()
        if rid is None:
            say(False, f"a RESULT {what}: no REQUEST reached the fake worker")
            continue
        fake.send(*result(rid, tensors, **fields))
        m = client.wait(is_answer(cid), 10)
        say(m is not None and m[0]["type"] == "ERROR" and m[0].get("code") == "internal"
            and "bad RESULT" in str(m[0].get("message")), f"a RESULT {what} ends its request as internal ({why(m)})")
    st = status()
    counted = [(st or {}).get(k, -1) - (st0 or {}).get(k, 0) for k in ("steps_captured", "steps_replayed", "steps_eager")]
    say(counted == [0, 0, 0], f"STATUS steps_* count nothing of the refused RESULTs ({counted})")
    # the good RESULT that comes after a bad one is not forwarded too
    fake.send(*result(rid))
    extra = [h for h, _ in client.drain(0.5) if h.get("id") == cid]
    say(not extra, f"a second RESULT after a refused one is not forwarded ({[h.get('type') for h in extra]})")

    # 4. a RESULT twice: the client gets one
    cid, rid = fake_request()
    fake.send(*result(rid))
    fake.send(*result(rid, [("latent", "F32", (4, 1, 8, 8), f32(np.full((4, 1, 8, 8), 7.0)))]))
    m = client.wait(is_answer(cid), 10)
    extra = [h for h, _ in client.drain(0.5) if h.get("id") == cid]
    say(m is not None and m[0]["type"] == "RESULT" and m[1]["latent"][2] == good_latent and not extra
        and m[0].get("worker") == "fake", f"a RESULT sent twice reaches the client once, the first ({why(m)}, then {len(extra)})")

    # 5. a RESULT that names another worker and claims another worker's request
    cid, rid = fake_request()
    fake.send(*result(rid, worker="w1"))
    m = client.wait(is_answer(cid), 10)
    say(m is not None and m[0].get("worker") == "fake", f"a RESULT naming another worker is corrected to its sender ({m and m[0].get('worker')})")
    tcid = next(ids)
    client.send(gen_hdr(tcid, "tiny", 60, 11), ctx_tensors())
    for k in range(1, 6):
        fake.send(*result(rid + k, [("latent", "F32", (4, 1, 8, 8), f32(np.full((4, 1, 8, 8), 9.0)))]))
    m = client.wait(is_answer(tcid), 60)
    say(m is not None and m[0]["type"] == "RESULT" and m[0].get("worker") != "fake"
        and m[1]["latent"][2] != f32(np.full((4, 1, 8, 8), 9.0)),
        f"RESULTs for another worker's request ids are not taken ({why(m)}, worker {m and m[0].get('worker')})")

    # 6. ERROR codes: a broker's word is internal; unknown_type leaves the request running
    cid, rid = fake_request()
    fake.send({"type": "ERROR", "id": rid, "code": "standby", "message": "go away"})
    m = client.wait(is_answer(cid), 10)
    say(m is not None and m[0].get("code") == "internal" and "standby" in str(m[0].get("message")),
        f"a worker's ERROR standby reaches the client as internal ({why(m)})")
    cid, rid = fake_request()
    fake.send({"type": "ERROR", "id": rid, "code": "unknown_type", "message": "what CANCEL?"})
    early = [h for h, _ in client.drain(0.3) if h.get("id") == cid]
    fake.send(*result(rid))
    m = client.wait(is_answer(cid), 10)
    say(not early and m is not None and m[0]["type"] == "RESULT",
        f"a worker's unknown_type about a request leaves it running to its RESULT ({why(m)})")

    # 7. PROGRESS past its end, backwards, of the wrong type: never forwarded
    cid, rid = fake_request(progress=True)
    refused0 = (status() or {}).get("worker_refused", 0)
    for p in ({"step": 5, "steps": 3}, {"step": 2 ** 64 - 1, "steps": 2 ** 64 - 1}, {"step": "one", "steps": 3},
              {"step": 1, "steps": 3, "decoded": 1, "decode_frames": 1}, {"step": 2, "steps": 3}, {"step": 1, "steps": 3}):
        fake.send(dict(p, type="PROGRESS", id=rid))
    fake.send(*result(rid))
    got = [h for h in [m for m in [client.wait(lambda h, t: h.get("id") == cid, 10)] if m] for h in [h[0]]]
    while got and got[-1].get("type") == "PROGRESS":
        m = client.wait(lambda h, t: h.get("id") == cid, 10)
        if not m:
            break
        got.append(m[0])
    steps = [(h.get("step"), h.get("steps")) for h in got if h.get("type") == "PROGRESS"]
    say(steps == [(2, 3)] and got and got[-1].get("type") == "RESULT",
        f"only a PROGRESS the request can have reaches the client, never backwards ({steps})")
    refused = (status() or {}).get("worker_refused", 0) - refused0
    say(refused == 4, f"a PROGRESS of bad fields and those past their end count in STATUS worker_refused ({refused})")

    # 8. SYNC_ACKs: of a version never sent, and of the wrong types
    fake.send({"type": "SYNC_ACK", "id": 0, "component": "transformer", "version": 2 ** 63 - 1, "ok": True})
    fake.send({"type": "SYNC_ACK", "id": 77, "component": "transformer", "version": "2", "ok": True})
    m = fake.wait(lambda h, t: h.get("type") == "ERROR", 5)
    say(m is not None and m[0].get("code") == "bad_request", f"a SYNC_ACK of the wrong types is answered bad_request ({why(m)})")
    st = status()
    fw = [w for w in (st or {}).get("workers", []) if w["name"] == "fake"]
    say(fw and fw[0]["versions"].get("transformer") == 1,
        f"an ack of a version never sent leaves the worker's version as it was ({fw and fw[0]['versions']})")

    # 9. READYs: impossible loads, a live worker's name, then a change of model mid-life
    for what, r in (("streams 0", {"streams": 0}), ("max_inflight 70000", {"max_inflight": 70000}),
                    ("17 models", {"models": [f"m{i}" for i in range(17)]})):
        hdr = {"type": "READY", "name": "fake", "models": ["fakem"], "versions": {"transformer": 1}}
        hdr.update(r)
        fake.send(hdr)
        m = fake.wait(lambda h, t: h.get("type") == "ERROR", 5)
        say(m is not None and m[0].get("code") == "bad_request", f"a READY with {what} is bad_request ({why(m)})")
    thief = Peer(net, a.workers, "thief", heartbeat=False)
    thief.send({"type": "READY", "name": "w1", "models": ["tiny"]})
    m = thief.wait(lambda h, t: h.get("type") == "ERROR", 5)
    say(m is not None and m[0].get("code") == "bad_request" and "taken" in str(m[0].get("message")),
        f"a READY under a live worker's name from another connection is refused ({why(m)})")
    thief.close()
    real_still_serves("the READYs refused")
    cid, rid = fake_request()
    fake.send({"type": "READY", "name": "fake", "models": ["other"], "versions": {"transformer": 1}})
    early = [h for h, _ in client.drain(0.5) if h.get("id") == cid]
    fake.send({"type": "READY", "name": "fake", "models": ["fakem"], "versions": {"transformer": 1}, "max_inflight": 16})
    m = fake.wait(lambda h, t: h.get("type") == "REQUEST", 10)
    if m:
        fake.send(*result(m[0]["id"]))
    ans = client.wait(is_answer(cid), 10)
    say(not early and m is not None and ans is not None and ans[0]["type"] == "RESULT",
        f"a READY that changes the model mid-request requeues the request once, and it is answered ({why(ans)})")
    old = fake_request()  # an answer of the last session is no answer of this one
    fake.send({"type": "READY", "name": "fake", "models": ["fakem"], "versions": {"transformer": 1}, "max_inflight": 16})
    m = fake.wait(lambda h, t: h.get("type") == "REQUEST", 10)
    if m and m[0]["id"] == old[1]:
        fake.send(*result(m[0]["id"]))
    ans = client.wait(is_answer(old[0]), 10)
    say(ans is not None and ans[0]["type"] == "RESULT", f"a restarted worker's requeued request is answered once ({why(ans)})")

    # 10. FETCH past the end, at 2^64-1, of a version or sha256 not stored
    data = bytes(range(256)) * 4
    sha = hashlib.sha256(data).hexdigest()
    cid = next(ids)
    client.send({"type": "UPLOAD", "id": cid, "component": "transformer", "version": 9, "sha256": sha,
                 "size": len(data), "offset": 0}, [("chunk", "U8", (len(data),), data)])
    m = client.wait(lambda h, t: h.get("id") == cid, 10)
    say(m is not None and m[0].get("complete") is True, f"an upload of 1 KiB is stored ({why(m)})")
    for what, f, want in (("past its end", {"offset": 1024}, 0), ("at 2^36, the largest offset", {"offset": 2 ** 36}, 0),
                          ("of the last bytes", {"offset": 1000, "max": 4 << 20}, 24)):
        fid = next(ids)
        fake.send(dict({"type": "FETCH", "id": fid, "component": "transformer", "version": 9, "sha256": sha}, **f))
        m = fake.wait(lambda h, t, fid=fid: h.get("id") == fid, 10)
        n = len(m[1]["chunk"][2]) if m and "chunk" in m[1] else -1
        say(m is not None and m[0]["type"] == "FETCH_DATA" and n == want and m[0].get("size") == 1024,
            f"a FETCH {what} gets {want} bytes and the size ({why(m)}, {n} bytes)")
    for what, f in (("at 2^64-1", {"version": 9, "sha256": sha, "offset": 2 ** 64 - 1}),
                    ("of max 2^64-1", {"version": 9, "sha256": sha, "max": 2 ** 64 - 1}),
                    ("of a version not stored", {"version": 10, "sha256": sha}),
                    ("of another sha256", {"version": 9, "sha256": "0" * 64}),
                    ("of another component", {"version": 9, "sha256": sha, "component": "vae"})):
        fid = next(ids)
        fake.send(dict({"type": "FETCH", "id": fid, "component": "transformer", "offset": 0}, **f))
        m = fake.wait(lambda h, t, fid=fid: h.get("id") == fid, 10)
        say(m is not None and m[0].get("code") == "bad_request", f"a FETCH {what} is bad_request ({why(m)})")

    # 11. an unreadable RESULT whose id came first still ends its request
    cid, rid = fake_request()
    frames = pack(*result(rid)[:1])
    frames[0] += b"\x00"  # trailing bytes: malformed, after the id was read
    fake.send_raw(frames)
    m = client.wait(is_answer(cid), 10)
    say(m is not None and m[0].get("code") == "internal", f"an unreadable RESULT ends its request as internal ({why(m)})")

    real_still_serves("the battery on the worker socket")

    # 12. a worker that announces large messages that never come, then goes silent, is expired
    ghost = Peer(net, a.workers, "ghost", heartbeat=False)
    ghost.send({"type": "READY", "name": "ghost", "models": ["ghostm"], "versions": {"transformer": 1}})
    end = time.monotonic() + 10
    while time.monotonic() < end and log_count(a.log, "worker ghost ready") < 1:
        net.settle(0.1)
    for _ in range(60):  # 64 MiB each: 2 s of grace each, 120 s if they added up
        ghost.send({"type": "HEARTBEAT", "incoming": 64 << 20})
    net.settle(0.2)
    ghost.close()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 15 and log_count(a.log, "worker ghost lost") < 1:
        net.settle(0.1)
    took = time.monotonic() - t0
    say(log_count(a.log, "worker ghost lost (expired)") >= 1,
        f"a worker that announced 60 large messages and went silent is expired within one message's grace ({took:.1f} s)")

    st = status()
    say(st is not None and any(w["name"] == "w1" for w in st["workers"]) and any(w["name"] == "fake" for w in st["workers"]),
        "the broker still answers STATUS, with both workers")

    # 13. (last: it makes v2 current) a worker's text of invalid UTF-8 bytes, echoed to clients with
    # each bad byte as U+FFFD, still within its field's bound (READY arch: at most 31 bytes; SYNC_DONE
    # failed reason: 511; STATUS lagging: 191), so a client that holds those bounds (reelctl) reads it
    def invalid(hdr, key, n):
        """hdr packed with hdr[key] a string of n bytes 0xff (not UTF-8)."""
        hdr = dict(hdr, proto=PROTO, **{key: "Q" * n})
        raw = msgpack.packb(hdr, use_bin_type=True)
        return raw.replace(b"Q" * n, b"\xff" * n)

    junk = Peer(net, a.workers, "junk", heartbeat=True)
    junk.send_raw([invalid({"type": "READY", "name": "junk", "models": ["junkm"], "versions": {"transformer": 1},
                            "device": "cpu"}, "arch", 31)])
    jw = None
    end = time.monotonic() + 10
    while time.monotonic() < end and not jw:
        jw = [w for w in (status() or {}).get("workers", []) if w["name"] == "junk"]
        net.settle(0.1)
    arch = jw[0]["arch"] if jw else ""
    say(arch == "\ufffd" * 10, f"a READY arch of 31 bytes that are not UTF-8 comes back in STATUS as 10 U+FFFD, "
        f"30 bytes: within its 31 ({len(arch.encode())} bytes)")
    cid = next(ids)
    client.send({"type": "SYNC", "id": cid, "component": "transformer", "version": 2, "sha256": "ab" * 32,
                 "path": "/nonexistent/w.safetensors", "deadline_ms": 20000})
    for p, ok in ((fake, True), (junk, False)):
        m = p.wait(lambda h, t: h.get("type") == "SYNC" and h.get("version") == 2, 10)
        ack = {"type": "SYNC_ACK", "id": m[0]["id"] if m else 0, "component": "transformer", "version": 2, "ok": ok}
        p.send_raw([invalid(ack, "error", 400)] if not ok else pack(ack))
    m = client.wait(lambda h, t: h.get("id") == cid and h.get("type") in ("SYNC_DONE", "ERROR"), 30)
    reasons = {f["worker"]: f["reason"] for f in (m[0].get("failed") or [])} if m else {}
    say(m is not None and m[0].get("applied") == ["fake"] and reasons.get("junk") == "\ufffd" * 170,
        f"a SYNC_ACK error of 400 bytes that are not UTF-8 comes back in SYNC_DONE as 170 U+FFFD, 510 bytes: "
        f"within its 511 ({why(m)}, {len(reasons.get('junk', '').encode())} bytes)")
    jw = [w for w in (status() or {}).get("workers", []) if w["name"] == "junk"]
    lag = jw[0]["lagging"].get("transformer", "") if jw else ""
    say(lag == "v2: " + "\ufffd" * 62, f"its STATUS lagging reason is 'v2: ' and 62 U+FFFD, 190 bytes: within its "
        f"191 ({len(lag.encode())} bytes)")
    done(0, None)


# ---- the worker's broker side --------------------------------------------------------


class FakeBroker:
    def __init__(self, net, endpoint):
        self.net = net
        self.s = net.ctx.socket(zmq.ROUTER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.bind(endpoint)
        self.worker = None
        self.inbox = []
        net.routers.append(self)

    def beat(self):
        if self.worker:
            self.send({"type": "HEARTBEAT"})

    def take(self):
        while True:
            try:
                fr = self.s.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            h, t = unpack(fr[1:])
            if h.get("type") == "READY":
                self.worker = fr[0]
            if h.get("type") == "FETCH":  # from the worker's fetch connection: answered there
                h["_from"] = fr[0]
            if h.get("type") not in ("HEARTBEAT", "EVENTS"):
                self.inbox.append((h, t))

    def send(self, hdr, tensors=()):
        self.s.send_multipart([self.worker] + pack(hdr, tensors))

    def send_raw(self, frames):
        self.s.send_multipart([self.worker] + frames)

    def send_to(self, ident, hdr):
        self.s.send_multipart([ident] + pack(hdr))

    def wait(self, pred, secs):
        end = time.monotonic() + secs
        while True:
            for i, (h, t) in enumerate(self.inbox):
                if pred(h, t):
                    return self.inbox.pop(i)
            if time.monotonic() >= end:
                return None
            self.net.pump(0.02)

    def drain(self, secs):
        self.net.settle(secs)
        got, self.inbox = self.inbox, []
        return got


def request_hdr(rid, **kw):
    h = {"type": "REQUEST", "id": rid, "model": "tiny", "steps": 3, "latent_shape": [4, 1, 8, 8], "seed": 3,
         "version": 1, "deadline_ms": 30000}
    h.update(kw)
    return h


def sha_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_worker(a):
    net = Net()
    fb = FakeBroker(net, a.bind)
    m = fb.wait(lambda h, t: h.get("type") == "READY", 60)
    say(m is not None, "the worker registers with the fake broker")
    if m is None:
        done(0, None)
    max_inflight = int(m[0].get("max_inflight") or 1)
    fb.send({"type": "HEARTBEAT"})
    ids = iter(range(100, 1 << 30))

    def request(**kw):
        rid = kw.pop("rid", None) or next(ids)
        tensors = kw.pop("tensors", None)
        end = time.monotonic() + 60
        while True:
            # A worker that heard no heartbeat for its liveness (this fake
            # starved of CPU on a busy machine) registers again and drops
            # the old session's requests, as with a real broker: sent again
            # to the new session, as a broker that requeues would.
            fb.send(request_hdr(rid, **kw), ctx_tensors() if tensors is None else tensors)
            m = fb.wait(lambda h, t: (h.get("id") == rid and h.get("type") in ("RESULT", "ERROR"))
                        or h.get("type") == "READY", max(0.0, end - time.monotonic()))
            if m is not None and m[0].get("type") == "READY":
                continue
            return rid, m

    rid, m = request()
    base = m[1]["latent"][2] if m and m[0]["type"] == "RESULT" and "latent" in m[1] else None
    say(base is not None, f"a valid REQUEST is answered with a RESULT ({why(m)})")
    if base is None:
        done(0, None)

    def still_bitwise(after):
        rid, m = request()
        say(m is not None and m[0]["type"] == "RESULT" and m[1]["latent"][2] == base,
            f"after {after}: a valid REQUEST gives the bitwise same latent ({why(m)})")

    nan_ctx = CTX.copy()
    nan_ctx[1, 1] = np.inf
    nan_lat = np.zeros((4, 1, 8, 8), dtype=np.float32)
    nan_lat[0, 0, 0, 0] = np.nan
    bad = [
        ("without latent_shape", {"latent_shape": None}, None, "bad_request"),
        ("with a latent_shape of 3 dims", {"latent_shape": [4, 8, 8]}, None, "bad_request"),
        ("with an odd height", {"latent_shape": [4, 1, 7, 8]}, None, "bad_request"),
        ("with a zero dim", {"latent_shape": [4, 0, 8, 8]}, None, "bad_request"),
        ("of the wrong channels", {"latent_shape": [16, 1, 8, 8]}, None, "bad_request"),
        ("with 0 steps", {"steps": 0}, None, "bad_request"),
        ("with 10001 steps", {"steps": 10001}, None, "bad_request"),
        ("with steps of the wrong type", {"steps": "3"}, None, "bad_request"),
        ("with a version above the worker's", {"version": 5}, None, "bad_request"),
        ("of another model", {"model": "small"}, None, "bad_request"),
        ("with an infinite context", {}, [("context", "F32", (5, 32), f32(nan_ctx))], "bad_request"),
        ("with a NaN latent", {}, ctx_tensors() + [("latent", "F32", (4, 1, 8, 8), f32(nan_lat))], "bad_request"),
        ("with a context of the wrong width", {}, [("context", "F32", (5, 16), f32(np.zeros((5, 16))))], "bad_request"),
        ("with a BF16 context", {}, [("context", "BF16", (5, 32), bytes(320))], "bad_request"),
        ("without a context", {}, [], "bad_request"),
        ("with an uncond of other rows", {}, ctx_tensors() + [("uncond", "F32", (3, 32), f32(np.zeros((3, 32))))],
         "bad_request"),
        ("with a tensor of another name", {}, ctx_tensors() + [("weights", "F32", (2,), f32(np.zeros(2)))], "bad_request"),
        ("with a shift of 0", {"shift": 0}, None, "bad_request"),
        ("with too many tokens", {"latent_shape": [4, 2, 512, 512]}, None, "too_large"),
    ]
    for what, fields, tensors, code in bad:
        kw = dict(fields)
        for k, v in list(kw.items()):
            if v is None:
                kw.pop(k)
        hdr = request_hdr(0, **kw)
        for k, v in fields.items():
            if v is None:
                hdr.pop(k, None)
        rid = next(ids)
        hdr["id"] = rid
        fb.send(hdr, ctx_tensors() if tensors is None else tensors)
        m = fb.wait(lambda h, t, rid=rid: h.get("id") == rid and h.get("type") in ("RESULT", "ERROR"), 30)
        say(m is not None and m[0]["type"] == "ERROR" and m[0].get("code") == code,
            f"a REQUEST {what} is answered {code} ({why(m)})")

    # a huge deadline is clamped, not overflowed: the request runs
    rid, m = request(deadline_ms=2 ** 64 - 1)
    say(m is not None and m[0]["type"] == "RESULT" and m[1]["latent"][2] == base,
        f"a REQUEST with deadline_ms 2^64-1 runs to its bitwise RESULT ({why(m)})")

    # junk and unknown types
    fb.send_raw([b"\xc1junk"])
    m = fb.wait(lambda h, t: h.get("type") == "ERROR", 10)
    say(m is not None and m[0].get("code") == "malformed", f"junk from the broker is answered malformed ({why(m)})")
    fb.send({"type": "FROB", "id": 5})
    m = fb.wait(lambda h, t: h.get("type") == "ERROR", 10)
    say(m is not None and m[0].get("code") == "unknown_type", f"an unknown type is answered unknown_type ({why(m)})")

    # CANCELs of ids it does not run are ignored: no answer, and a REQUEST of that id later runs
    fb.send({"type": "CANCEL", "id": 424242})
    quiet = fb.drain(0.5)
    say(not quiet, f"a CANCEL of an unknown id gets no answer ({[h.get('type') for h, _ in quiet]})")
    rid, m = request(rid=424242)
    say(m is not None and m[0]["type"] == "RESULT" and m[1]["latent"][2] == base,
        f"a REQUEST whose id an earlier CANCEL named (before it came) runs ({why(m)})")

    # duplicate ids: two REQUESTs of one id are both answered
    rid = next(ids)
    fb.send(request_hdr(rid), ctx_tensors())
    fb.send(request_hdr(rid), ctx_tensors())
    got = []
    for _ in range(2):
        m = fb.wait(lambda h, t: h.get("id") == rid and h.get("type") in ("RESULT", "ERROR"), 60)
        if m:
            got.append(m)
    say(len(got) == 2 and all(g[0]["type"] == "RESULT" and g[1]["latent"][2] == base for g in got),
        f"two REQUESTs of one id are each answered bitwise ({[why(g) for g in got]})")

    # A broker that ignores max_inflight: the worker holds at most 4 x its
    # max_inflight REQUESTs; each one past that is answered busy at once,
    # and the held ones run on (long ones here: none ends before the
    # answers are counted), then end when cancelled. Before: every one was
    # taken, each holding its tensors, as many as the broker sent. The two
    # REQUESTs just answered count until their jobs let go (after their
    # RESULTs went: a busy machine lags there), so up to 2 more of the
    # burst may be refused; the refused are always its last ones.
    most, extra = 4 * max_inflight, 3
    rids = [next(ids) for _ in range(most + extra)]
    for rid in rids:
        fb.send(request_hdr(rid, steps=10000, latent_shape=[4, 1, 32, 32]), ctx_tensors())
    answers = []
    for _ in range(extra):
        m = fb.wait(lambda h, t: h.get("id") in rids and h.get("type") in ("RESULT", "ERROR"), 30)
        if m:
            answers.append(m)
    answers += [g for g in fb.drain(0.5) if g[0].get("id") in rids and g[0].get("type") in ("RESULT", "ERROR")]
    # every id not answered yet is cancelled: a held one ends cancelled, and
    # a refusal that came late (a busy machine) is still its busy answer
    for rid in rids:
        if all(h["id"] != rid for h, _ in answers):
            fb.send({"type": "CANCEL", "id": rid})
    ended = []
    for _ in range(len(rids) - len(answers)):
        m = fb.wait(lambda h, t: h.get("id") in rids and h.get("type") in ("RESULT", "ERROR"), 60)
        if m:
            ended.append(m)
    every = answers + ended
    refused = sorted(h["id"] for h, _ in every if h["type"] == "ERROR" and h.get("code") == "busy")
    held = rids[:len(rids) - len(refused)]
    say(extra <= len(refused) <= extra + 2 and refused == rids[len(held):] and
        all(f"holds {most} requests" in h.get("message", "") for h, _ in every if h.get("code") == "busy"),
        f"{most + extra} REQUESTs to a worker of max_inflight {max_inflight}: those past {most} held are answered "
        f"busy ({len(held)} held) ({[why(g) for g in every if g[0].get('code') == 'busy']})")
    cancelled = [g for g in every if g[0]["id"] in held]
    say(len(cancelled) == len(held) > 0 and all(h["type"] == "ERROR" and h.get("code") == "cancelled"
                                                for h, _ in cancelled),
        f"the {len(held)} held REQUESTs run until cancelled ({[why(g) for g in cancelled]})")

    still_bitwise("the refused REQUESTs")

    # SYNCs the worker must refuse, each answered with its generic reason, the weights unchanged
    d = a.dir
    other = os.path.join(d, "w2.safetensors")
    alien = os.path.join(d, "alien.safetensors")
    syncs = [
        ("of a path outside its weights directories", {"path": "/etc/passwd", "sha256": "0" * 64},
         "path not under the worker's weights directories"),
        ("of a relative path", {"path": "w2.safetensors", "sha256": sha_file(other)}, "path not under"),
        ("with a .. component", {"path": os.path.join(d, "..", os.path.basename(d), "w2.safetensors"),
                                  "sha256": sha_file(other)}, "path not under"),
        ("of a missing file", {"path": os.path.join(d, "nothing.safetensors"), "sha256": "0" * 64},
         "not a safetensors file"),
        ("of a symlink", {"path": os.path.join(d, "link.safetensors"), "sha256": sha_file(other)},
         "not a safetensors file"),
        ("of a file that is not safetensors", {"path": os.path.join(d, "junk.safetensors"),
                                                "sha256": sha_file(os.path.join(d, "junk.safetensors"))},
         "not a safetensors file"),
        ("of another model's weights", {"path": alien, "sha256": sha_file(alien)}, "not weights of this worker's model"),
        ("whose sha256 does not match", {"path": other, "sha256": "ab" * 32}, "sha256 mismatch"),
        ("of another component", {"path": other, "sha256": sha_file(other), "component": "vae"}, ""),
        ("at the applied version with other weights", {"path": other, "sha256": sha_file(other), "version": 1}, "stale"),
    ]
    for what, f, reason in syncs:
        sid = next(ids)
        hdr = {"type": "SYNC", "id": sid, "component": "transformer", "version": 2}
        hdr.update(f)
        fb.send(hdr)
        m = fb.wait(lambda h, t, sid=sid: h.get("id") == sid and h.get("type") in ("SYNC_ACK", "ERROR"), 30)
        ok = m is not None and m[0]["type"] == "SYNC_ACK" and m[0].get("ok") is False and reason in str(m[0].get("error"))
        say(ok, f"a SYNC {what} is acked not ok ({m and m[0].get('error')})")
    sid = next(ids)
    fb.send({"type": "SYNC", "id": sid, "component": "transformer", "version": "2", "path": other})
    m = fb.wait(lambda h, t, sid=sid: h.get("id") == sid and h.get("type") in ("SYNC_ACK", "ERROR"), 30)
    say(m is not None and (m[0]["type"] == "ERROR" or m[0].get("ok") is False),
        f"a SYNC that cannot be read is refused ({why(m) if m and m[0]['type'] == 'ERROR' else m and m[0].get('error')})")
    # A broker that sends SYNCs without end: at most 16 wait for the sync
    # thread (the one it applies included), and those waiting hold at most
    # twice the model in F32 of inline weights; each past that is acked
    # not ok at once (busy), the rest wait their turn. The sync thread is
    # kept on an uploaded version whose FETCH goes unanswered. Before:
    # every SYNC was queued, each holding its message, inline tensors and
    # all, as many as the broker sent.
    busy = "busy: too many SYNCs wait on this worker"
    sent = []

    def sync(version, tensors=(), **kw):
        sid = next(ids)
        hdr = {"type": "SYNC", "id": sid, "component": "transformer", "version": version, "sha256": "ab" * 32}
        hdr.update(kw)
        fb.send(hdr, tensors)
        sent.append(sid)
        return sid

    def acks(n, secs):
        got = []
        for _ in range(n):
            m = fb.wait(lambda h, t: h.get("id") in sent and h.get("type") in ("SYNC_ACK", "ERROR"), secs)
            if m:
                got.append(m[0])
        return got + [h for h, _ in fb.drain(0.5) if h.get("id") in sent and h.get("type") in ("SYNC_ACK", "ERROR")]

    sync(2, uploaded=True)
    fetch = fb.wait(lambda h, t: h.get("type") == "FETCH", 30)
    say(fetch is not None, "the sync thread fetches an uploaded version, its FETCH unanswered")
    with open(os.path.join(d, "w.safetensors"), "rb") as f:
        head = f.read(8)
        meta = json.loads(f.read(int.from_bytes(head, "little")))
    params = sum(int(np.prod(v["shape"])) for k, v in meta.items() if k != "__metadata__")
    blob = [("x", "F32", (params * 4 // 5,), bytes(params * 4 // 5 * 4))]  # 0.8 of the model in F32
    inline = [sync(3, blob) for _ in range(3)]
    got = acks(1, 30)
    say([(h.get("id"), h.get("version"), h.get("ok"), h.get("error")) for h in got] == [(inline[2], 3, False, busy)],
        f"3 SYNCs of 0.8 x the model inline: the third, past twice the model waiting, is acked busy ({got})")
    paths = [sync(4 + i, path="/etc/passwd") for i in range(16)]
    got = acks(3, 30)
    say(sorted(h.get("id") for h in got) == paths[13:] and all(h.get("ok") is False and h.get("error") == busy
                                                                for h in got),
        f"16 more SYNCs, 3 waiting: the 3 past 16 waiting are acked busy at once, with their versions "
        f"({[(h.get('version'), h.get('error')) for h in got]})")
    fb.send_to(fetch[0]["_from"], {"type": "ERROR", "id": fetch[0].get("id", 0), "code": "bad_request",
                                   "message": "no such upload"})
    waiting = [sent[0]] + inline[:2] + paths[:13]
    got = acks(len(waiting), 60)
    say(sorted(h.get("id") for h in got) == sorted(waiting) and all(h.get("ok") is False and h.get("error") != busy
                                                                    for h in got),
        f"the {len(waiting)} SYNCs that waited are each answered in turn, none busy "
        f"({sorted(set(str(h.get('error')) for h in got))})")
    still_bitwise("the refused SYNCs")
    done(0, None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("side", choices=["broker", "worker"])
    ap.add_argument("--clients")
    ap.add_argument("--workers")
    ap.add_argument("--bind")
    ap.add_argument("--log")
    ap.add_argument("--dir")
    ap.add_argument("--for", dest="secs", type=float, default=120.0)
    a = ap.parse_args()
    guard(a.secs)
    if a.side == "broker":
        run_broker(a)
    else:
        run_worker(a)


if __name__ == "__main__":
    main()
