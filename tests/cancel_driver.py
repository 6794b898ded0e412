"""cancel_driver.py -- the CANCEL message against a real broker and worker
(tests/cli_cancel.sh), over raw DEALER sockets and through the Python
client. Prints one PASS or FAIL line per check (py_checks counts them).

    cancel_driver.py --endpoint EP --python-path DIR

The worker must serve model tiny with --max-inflight 1, so a second GEN
waits at the broker while a first one runs. A long request is tiny with
a [4,4,16,16] latent and 10,000 steps (seconds, at least); every wait is
bounded, and each check waits for the message it looks for.
"""

import argparse
import os
import sys
import time

import msgpack
import numpy as np
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_guard import done, guard  # noqa: E402

CTX = zmq.Context.instance()
LONG = (4, 4, 16, 16)
SHORT = (4, 2, 8, 8)
context = np.random.default_rng(2).standard_normal((5, 32)).astype("<f4")
fails = 0


def check(ok, what, detail=""):
    global fails
    print(("PASS " if ok else "FAIL ") + what + ("" if ok or not detail else f" ({detail})"), flush=True)
    fails += not ok


def dealer(ep):
    s = CTX.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 5000)
    s.connect(ep)
    return s


def send(s, hdr, frames=()):
    hdr = dict(hdr, proto="reel/1")
    s.send_multipart([msgpack.packb(hdr, use_bin_type=True)] + list(frames))


def gen(s, rid, shape=LONG, steps=10000, client=None):
    hdr = {"type": "GEN", "id": rid, "model": "tiny", "steps": steps, "latent_shape": list(shape), "shift": 3.0,
           "seed": rid, "progress": True, "deadline_ms": 300000,
           "tensors": [{"name": "context", "dtype": "F32", "shape": [5, 32], "bytes": context.nbytes}]}
    if client:
        hdr["client"] = client
    send(s, hdr, [context.tobytes()])


def cancel(s, rid, client=None, **extra):
    hdr = {"type": "CANCEL", "id": rid}
    if client is not None:
        hdr["client"] = client
    hdr.update(extra)
    send(s, hdr)


def recv(s, ms):
    """The next header on s within ms, or None."""
    if not s.poll(ms):
        return None
    frames = s.recv_multipart()
    return msgpack.unpackb(frames[0], raw=False, strict_map_key=False)


def until(s, want, ms=60000, seen=None):
    """Headers on s until one satisfies want(h) (returned), or None after
    ms without one; every header passed over goes into seen."""
    while True:
        h = recv(s, ms)
        if h is None or want(h):
            return h
        if seen is not None:
            seen.append(h)


def is_final(rid):
    return lambda h: h.get("id") == rid and h.get("type") in ("RESULT", "ERROR", "BUSY")


def progress_of(rid):
    return lambda h: h.get("id") == rid and h.get("type") == "PROGRESS"


def status(s, rid):
    """A STATUS, and its reply; the headers that came before it."""
    send(s, {"type": "STATUS", "id": rid})
    before = []
    h = until(s, lambda h: h.get("type") == "STATUS_REPLY" and h.get("id") == rid, 30000, before)
    return h, before


def queue_reaches(s, n, first_id):
    """Whether the broker's STATUS says n requests wait, asking over s again
    after each answer (ids from first_id on) for up to 60 s."""
    end = time.monotonic() + 60
    k = 0
    while time.monotonic() < end:
        r, _ = status(s, first_id + k)
        k += 1
        if r and r.get("queue") == n:
            return True
    return False


def cancelled(h, why):
    return h is not None and h.get("type") == "ERROR" and h.get("code") == "cancelled" and why in h.get("message", "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--python-path", required=True)
    a = ap.parse_args()
    guard(600)
    ep = a.endpoint
    x, y, z = dealer(ep), dealer(ep), dealer(ep)

    # a running request: ERROR cancelled at once, and the worker stops it
    gen(x, 1, client="00000000000000a1")
    p = until(x, progress_of(1))
    check(p is not None, "a long GEN runs (PROGRESS came)")
    cancel(x, 1, client="00000000000000a1")
    h = until(x, is_final(1), 30000)
    check(cancelled(h, "its worker stops it at its next step"), "CANCEL of a running GEN: ERROR cancelled", h)
    gen(x, 2, shape=SHORT, steps=2)
    h = until(x, is_final(2), 120000)
    check(h is not None and h.get("type") == "RESULT",
          "the worker (one slot) serves the next GEN after the cancelled one", h)

    # a queued request: dropped before it starts
    gen(x, 3, client="00000000000000a1")
    check(until(x, progress_of(3)) is not None, "a long GEN runs again")
    gen(x, 4, shape=SHORT, steps=2, client="00000000000000a1")
    # the broker holds GEN 4 (the worker has one slot): STATUS says so
    check(queue_reaches(y, 1, 1000), "the second GEN waits at the broker (STATUS queue 1)")
    cancel(x, 4, client="00000000000000a1")
    seen = []
    h = until(x, is_final(4), 30000, seen)
    check(cancelled(h, "it had not started"), "CANCEL of a queued GEN: ERROR cancelled, it had not started", h)
    check(not any(s.get("id") == 4 for s in seen), "the queued GEN never reported a step")
    cancel(x, 3, client="00000000000000a1")
    check(cancelled(until(x, is_final(3), 30000), "its worker stops it"), "and the running one is cancelled too")

    # another connection cannot cancel it (no token), nor a wrong token
    gen(x, 5)
    check(until(x, progress_of(5)) is not None, "a GEN without a client token runs")
    cancel(y, 5)
    cancel(y, 5, client="00000000deadbeef")
    r, before = status(y, 2000)
    check(r is not None and not before, "CANCELs naming no request of theirs get no answer of their own", before)
    # The broker read y's CANCELs before it answered y's STATUS, and reads
    # x's STATUS after that: an answer they caused would reach x before
    # x's STATUS_REPLY (one socket, one peer: in order).
    r, before = status(x, 2001)
    finals = [h for h in before if h.get("id") == 5 and h.get("type") != "PROGRESS"]
    check(r is not None and not finals,
          "another connection's CANCEL (no token, or a wrong one) leaves the GEN running", finals)
    # a token names only a request of that token, on its own connection too
    cancel(x, 5, client="00000000deadbeef")
    r, before = status(x, 2002)
    finals = [h for h in before if h.get("id") == 5 and h.get("type") != "PROGRESS"]
    check(r is not None and not finals,
          "its own connection's CANCEL with a token the GEN did not have leaves it running", finals)
    cancel(x, 5)
    check(cancelled(until(x, is_final(5), 30000), "cancelled by its client"),
          "its own connection's CANCEL (no token) ends it")

    # the token names it from a new connection (a client that reconnected)
    gen(x, 6, client="00000000000000b2")
    check(until(x, progress_of(6)) is not None, "a GEN with token b2 runs")
    cancel(z, 6, client="00000000000000b2")
    check(cancelled(until(x, is_final(6), 30000), "cancelled"),
          "a CANCEL with its token from another connection ends it; the ERROR goes to the GEN's sender")
    r, before = status(z, 3000)
    check(r is not None and not before, "the canceller gets nothing but its STATUS reply", before)

    # unknown, already answered, malformed
    cancel(x, 424242)
    cancel(x, 2)  # answered RESULT above
    r, before = status(x, 4000)
    check(r is not None and not [b for b in before if b.get("type") != "PROGRESS"],
          "a CANCEL of an unknown id, or of one answered already, gets no reply", before)
    cancel(x, 7, client=12)
    h = until(x, lambda h: h.get("id") == 7, 30000)
    check(h is not None and h.get("type") == "ERROR" and "CANCEL" in h.get("message", ""),
          "a CANCEL whose client is not a hash: an ERROR naming CANCEL", h)
    send(x, {"type": "CANCEL", "id": 8, "tensors": [{"name": "x", "dtype": "F32", "shape": [1], "bytes": 4}]},
         [b"\0\0\0\0"])
    h = until(x, lambda h: h.get("id") == 8, 30000)
    check(h is not None and h.get("type") == "ERROR", "a CANCEL with a tensor: an ERROR", h)
    r, _ = status(x, 5000)
    check(r is not None, "the broker still answers")

    # turns (docs/PROTOCOL.md "Routing"): client c3 queues four GENs behind
    # its running one; y's single GEN, sent after them, runs before them
    gen(x, 31, client="00000000000000c3")
    check(until(x, progress_of(31)) is not None, "client c3's long GEN runs")
    for i in range(32, 36):
        gen(x, i, shape=SHORT, steps=2, client="00000000000000c3")
    gen(y, 41, shape=SHORT, steps=2)
    check(queue_reaches(z, 5, 6000), "c3's four GENs and y's one wait at the broker (STATUS queue 5)")
    cancel(x, 31, client="00000000000000c3")
    check(cancelled(until(x, is_final(31), 30000), "cancelled"), "c3's long GEN cancelled: the slot frees")
    finals = {}
    for i in range(32, 36):
        finals[i] = until(x, is_final(i), 120000)
    finals[41] = until(y, is_final(41), 120000)
    check(all(h is not None and h.get("type") == "RESULT" for h in finals.values()),
          "all five are served", {k: (v or {}).get("type") for k, v in finals.items()})

    # a full queue makes way (docs/PROTOCOL.md "Routing"; the broker runs
    # with --queue-max 8): client f1 runs one long GEN and fills the eight
    # places; its next is BUSY at once (alone, its share is the whole
    # queue). z's single GEN then takes the place of f1's newest waiting
    # one, which is answered BUSY, and runs once f1 gives up on the rest.
    f1 = "00000000000000f1"
    gen(x, 60, client=f1)
    check(until(x, progress_of(60)) is not None, "client f1's long GEN runs")
    for i in range(61, 69):
        gen(x, i, client=f1)
    check(queue_reaches(z, 8, 6100), "f1's eight more GENs fill the queue (STATUS queue 8, --queue-max 8)")
    gen(x, 69, client=f1)
    h = until(x, is_final(69), 30000)
    check(h is not None and h.get("type") == "BUSY" and "queue full" in h.get("message", ""),
          "f1's next GEN is BUSY at once: the queue is full and f1 is alone in it", h)
    gen(z, 70, shape=SHORT, steps=2)
    h = until(x, is_final(68), 30000)
    check(h is not None and h.get("type") == "BUSY" and "gave its place" in h.get("message", ""),
          "z's GEN takes the place of f1's newest waiting one (68: BUSY, 'gave its place')", h)
    for i in list(range(61, 68)) + [60]:
        cancel(x, i, client=f1)
    ends, t_end = {}, time.monotonic() + 60
    while len(ends) < 8 and time.monotonic() < t_end:
        h = recv(x, 1000)
        if h and h.get("type") in ("RESULT", "ERROR", "BUSY") and 60 <= h.get("id", 0) < 68:
            ends[h["id"]] = h
    check(len(ends) == 8 and all(cancelled(h, "cancelled") for h in ends.values()),
          "f1 cancels its seven waiting GENs and its running one", {k: v.get("type") for k, v in ends.items()})
    h = until(z, is_final(70), 120000)
    check(h is not None and h.get("type") == "RESULT", "z's GEN is served", h)

    # the Python client cancels what it gives up on
    sys.path.insert(0, a.python_path)
    import reel
    c = reel.Client(ep, timeout=30)
    try:
        c.gen("tiny", context, steps=10000, latent_shape=LONG, timeout=1.5)
        check(False, "Client.gen with timeout 1.5 s of a long GEN raises ReelTimeout")
    except reel.ReelTimeout:
        check(True, "Client.gen with timeout 1.5 s of a long GEN raises ReelTimeout")

    def interrupt(step, steps):
        if step >= 3:
            raise KeyboardInterrupt

    try:
        c.gen("tiny", context, steps=10000, latent_shape=LONG, progress=interrupt)
        check(False, "a KeyboardInterrupt in its progress callback ends Client.gen")
    except KeyboardInterrupt:
        check(True, "a KeyboardInterrupt in its progress callback ends Client.gen")
    out = c.gen("tiny", context, steps=2, latent_shape=SHORT)
    check(out.latent.shape == SHORT, "the same Client serves the next GEN (the cancelled ones' ERRORs dropped)")
    c.close()
    for s in (x, y, z):
        s.close(linger=0)
    done(1 if fails else 0)


if __name__ == "__main__":
    main()
