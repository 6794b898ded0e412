"""bounds_peer.py -- raw peers that ask the broker for work it must bound,
for tests/cli_peer_bounds.sh.

    bounds_peer.py resend --clients EP --workers EP --weights FILE --weights3 FILE --log BROKER_LOG
                          [--n 500] [--current 2000]

`resend`: a fake worker registers (READY) and never acks until told; a
trainer sends SYNC v2 (by path) and, while its barrier waits on that
worker, sends the very same SYNC (same connection, same id) again --n
times; then the worker acks, the trainer gets its SYNC_DONE, and resends
v2 --current times now that it is current (each answered SYNC_DONE at
once: nothing lags); then v3 is synced and applied, so v2 stops being
current. The audit rows are counted by the shell (the catalog's writer
stores them after the answers). Checks: every message is answered as the
protocol says; the current version's resends write at most 20 log lines
a 10 s window (before: 2 each, "resent (current)" and "complete"), and
once the window is over "SYNC resends: N more lines like the ones above
were left out" says the rest: the lines written and those counts add up
to 2 a resend.

    bounds_peer.py flood --clients EP --workers EP --log BROKER_LOG [--n 2000] [--conns 300]

`flood`: peers that never read send --n each of: SYNCs refused for their
fields, SYNCs of a component not served, junk frames and unknown types,
and 3,000 STATUS (client socket); --conns fresh connections send one RESULT each
(worker socket). Checks: the broker read them all and still answers;
prints "ELAPSED S" (the flood's seconds) for the shell, which counts the
log lines and audit rows.

Prints one PASS/FAIL line per check (tests/lib_cli.sh py_checks), exit 0.
"""

import argparse
import hashlib
import os
import re
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_guard import done, guard  # noqa: E402
from peer_wire import pack, say  # noqa: E402


def dealer(ctx, ep):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 5000)
    s.connect(ep)
    return s


def recv(sock, secs):
    """The next message's header on sock within secs, or None."""
    if not sock.poll(int(secs * 1000)):
        return None
    return msgpack.unpackb(sock.recv_multipart()[0], raw=False, strict_map_key=False)


def sha_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class FakeWorker:
    """A registered worker that heartbeats while it waits and acks only when told."""

    def __init__(self, ctx, ep, name):
        self.s = dealer(ctx, ep)
        self.s.send_multipart(pack({"type": "READY", "name": name, "models": ["fakem"],
                                    "versions": {"transformer": 1}}))
        self.beat_at = 0.0
        self.inbox = []

    def beat(self):
        """A HEARTBEAT when one is due; what came meanwhile kept. Never waits."""
        now = time.monotonic()
        if now >= self.beat_at:
            self.s.send_multipart(pack({"type": "HEARTBEAT"}))
            self.beat_at = now + 0.1
        while True:
            h = recv(self.s, 0)
            if h is None:
                return
            self.inbox.append(h)

    def wait(self, pred, secs):
        """The first message matching pred within secs (heartbeats sent meanwhile), or None."""
        end = time.monotonic() + secs
        while True:
            self.beat()
            for i, h in enumerate(self.inbox):
                if pred(h):
                    return self.inbox.pop(i)
            if time.monotonic() >= end:
                return None
            self.s.poll(50)


def until_answer(sock, rid, secs, beat=None):
    """The answer to id rid on sock within secs (other messages dropped; beat() between polls)."""
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if beat:
            beat()
        h = recv(sock, 0.05)
        if h is not None and h.get("id") == rid:
            return h
    return None


BURST, WINDOW_S = 20, 10     # a log budget (base/logbudget.h)


def resend_lines(path):
    """The broker's log: its lines, the lines of v2's resends once current, their counts left out and the
    lines that say those counts."""
    lines, written, left_out, sums = 0, 0, 0, 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            lines += 1
            if re.search(r"sync transformer v2 (resent \(current\)|complete \(applied fw; failed -\))", line):
                written += 1
            m = re.search(r"SYNC resends: (\d+) more lines like the ones above were left out", line)
            if m:
                left_out += int(m.group(1))
                sums += 1
    return lines, written, left_out, sums


def run_resend(a):
    ctx = zmq.Context.instance()
    fw = FakeWorker(ctx, a.workers, "fw")
    trainer = dealer(ctx, a.clients)
    beat = fw.beat

    def status(rid):
        trainer.send_multipart(pack({"type": "STATUS", "id": rid}))
        return until_answer(trainer, rid, 30, beat)

    st, rid = None, 1000
    end = time.monotonic() + 30
    while time.monotonic() < end:
        st = status(rid)
        rid += 1
        if st and any(w.get("name") == "fw" for w in st.get("workers", [])):
            break
        fw.wait(lambda h: False, 0.1)
    say(st is not None and any(w.get("name") == "fw" for w in st.get("workers", [])), "the fake worker registers")

    sync = {"type": "SYNC", "id": 1, "component": "transformer", "version": 2, "sha256": sha_file(a.weights),
            "path": os.path.abspath(a.weights), "deadline_ms": 120000}
    trainer.send_multipart(pack(sync))
    got = fw.wait(lambda h: h.get("type") == "SYNC" and h.get("version") == 2, 30)
    say(got is not None, "the fake worker is sent SYNC v2, and its barrier waits for its ack")
    if got is None:
        done(0, trainer)
    for _ in range(a.n):
        trainer.send_multipart(pack(sync))
        beat()
    # one connection's messages are handled in order: the STATUS answer
    # comes after every resend was read
    st = status(rid)
    rid += 1
    say(st is not None and st.get("pending", {}).get("transformer") == 2,
        f"{a.n} resends of the same SYNC while its barrier waits: no answer of their own, v2 still pending")
    fw.s.send_multipart(pack({"type": "SYNC_ACK", "id": got["id"], "component": "transformer", "version": 2,
                              "ok": True}))
    d = until_answer(trainer, 1, 30, beat)
    say(d is not None and d.get("type") == "SYNC_DONE" and d.get("complete") is True,
        f"once the worker acks, the trainer's one SYNC_DONE comes, complete ({d})")

    # (a STATUS answered: the lines of v2's barrier are all written)
    status(rid)
    rid += 1
    n0, w0, l0, s0 = resend_lines(a.log)
    t0 = time.monotonic()
    answered = 0
    for k in range(a.current):
        trainer.send_multipart(pack(dict(sync, id=10000 + k)))
        if k % 50 == 49 or k == a.current - 1:
            # a few in flight at a time: the trainer's queue never fills
            while answered <= k:
                h = until_answer(trainer, 10000 + answered, 30, beat)
                if h is None or h.get("type") != "SYNC_DONE" or h.get("complete") is not True:
                    break
                answered += 1
    took = time.monotonic() - t0
    say(answered == a.current, f"{a.current} resends of v2 once current: each answered SYNC_DONE complete at once "
        f"({answered} were)")
    _, w1, _, _ = resend_lines(a.log)
    most = BURST * (2 + int(took // WINDOW_S))
    say(w1 - w0 <= most, f"they wrote {w1 - w0} lines of resends in {took:.1f} s (at most {most}: {BURST} a "
        f"{WINDOW_S} s window)")
    # the lines left out are said once their window is over (the broker's
    # timers): with those written, 2 a resend
    end = time.monotonic() + 3 * WINDOW_S
    while True:
        n2, w2, l2, s2 = resend_lines(a.log)
        if w2 - w0 + l2 - l0 >= 2 * a.current or time.monotonic() >= end:
            break
        fw.wait(lambda h: False, 0.1)
    say(l2 > l0 and w2 - w0 + l2 - l0 == 2 * a.current,
        f"once their window is over the log says how many were left out: {w2 - w0} lines written + {l2 - l0} "
        f"counted as left out = {w2 - w0 + l2 - l0} of {2 * a.current}")
    # everything the broker wrote meanwhile: those lines (within the
    # bound above), the first resend's audit line and the summaries
    grown = most + 1 + (s2 - s0)
    say(n2 - n0 <= grown, f"the broker's log grew by {n2 - n0} lines over {a.current} resends (at most {grown}: "
        f"{most}, the first resend's audit line and {s2 - s0} summary line{'' if s2 - s0 == 1 else 's'})")

    sync3 = dict(sync, id=3, version=3, sha256=sha_file(a.weights3), path=os.path.abspath(a.weights3))
    trainer.send_multipart(pack(sync3))
    got = fw.wait(lambda h: h.get("type") == "SYNC" and h.get("version") == 3, 30)
    if got is not None:
        fw.s.send_multipart(pack({"type": "SYNC_ACK", "id": got["id"], "component": "transformer", "version": 3,
                                  "ok": True}))
    d = until_answer(trainer, 3, 30, beat)
    say(d is not None and d.get("type") == "SYNC_DONE" and d.get("current") == 3,
        f"v3 is synced and applied: v2 is no longer current ({d})")
    done(0, trainer)


def run_flood(a):
    """Refused messages by the thousand, from peers that never read."""
    ctx = zmq.Context.instance()
    t0 = time.monotonic()

    def reader_less(ep):
        s = dealer(ctx, ep)
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 4096)
        return s

    sha = "ab" * 32
    bad = reader_less(a.clients)       # SYNCs refused for their fields (version 0)
    stale = reader_less(a.clients)     # SYNCs refused by the sync module (a component not served)
    asker = reader_less(a.clients)     # STATUS, never reading the answers
    junk = reader_less(a.clients)      # frames that do not parse, and unknown types
    for i in range(a.n):
        bad.send_multipart(pack({"type": "SYNC", "id": i + 1, "component": "transformer", "version": 0,
                                 "sha256": sha, "path": "/w/x.safetensors"}))
        stale.send_multipart(pack({"type": "SYNC", "id": i + 1, "component": "vae", "version": 5, "sha256": sha,
                                   "path": "/w/x.safetensors"}))
        junk.send_multipart([b"\x01junk"])
        junk.send_multipart(pack({"type": "NOPE", "id": i + 1}))
    # past ZeroMQ's queue (1,000) and the answers held for one client
    # (1,024): each further answer is dropped, "not held"
    for i in range(3000):
        asker.send_multipart(pack({"type": "STATUS", "id": i + 1}))
    # strangers on the worker socket: a fresh connection each, one message;
    # each stays until it is told to RECONNECT (the broker read it: on a
    # busy machine its handshake can take longer than a closing socket
    # waits, and the message never came)
    strangers = []
    for i in range(a.conns):
        s = dealer(ctx, a.workers)
        s.send_multipart(pack({"type": "RESULT", "id": i + 1}))
        strangers.append(s)
    end = time.monotonic() + 60
    told = 0
    for s in strangers:
        h = recv(s, max(0.0, end - time.monotonic()))
        told += h is not None and h.get("type") == "RECONNECT"
        s.close(linger=0)
    say(told == a.conns, f"each of the {a.conns} strangers on the worker socket is told to RECONNECT ({told} were)")
    # one connection's messages are handled in order: once a STATUS on
    # each flooding connection is answered, all came before it was read
    for s, name in ((bad, "bad"), (stale, "stale"), (junk, "junk")):
        while recv(s, 0) is not None:
            pass
        s.send_multipart(pack({"type": "STATUS", "id": 999999}))
        h = until_answer(s, 999999, 60)
        say(h is not None and h.get("type") == "STATUS_REPLY", f"the broker read the {name} flood ({a.n} messages)"
            " and still answers STATUS on that connection")
    # the asker stays until its STATUS are read: its answers' drops are
    # logged (and only 20 of them: the rest are left out)
    end = time.monotonic() + 60
    seen = 0
    while time.monotonic() < end:
        with open(a.log, encoding="utf-8", errors="replace") as f:
            seen = sum("STATUS_REPLY not held" in line for line in f)
        if seen >= 20:
            break
        time.sleep(0.1)
    say(seen >= 20, f"the 3,000 STATUS never read overflow what the broker holds for their client ({seen} lines)")
    print(f"ELAPSED {time.monotonic() - t0:.1f}")
    for s in (bad, stale, asker, junk):
        s.close(linger=0)
    done(0)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("resend")
    r.add_argument("--clients", required=True)
    r.add_argument("--workers", required=True)
    r.add_argument("--weights", required=True)
    r.add_argument("--weights3", required=True)
    r.add_argument("--log", required=True)
    r.add_argument("--n", type=int, default=500)
    r.add_argument("--current", type=int, default=2000)
    f = sub.add_parser("flood")
    f.add_argument("--clients", required=True)
    f.add_argument("--workers", required=True)
    f.add_argument("--n", type=int, default=2000)
    f.add_argument("--conns", type=int, default=300)
    f.add_argument("--log", required=True)
    a = ap.parse_args()
    guard(200)
    if a.mode == "resend":
        run_resend(a)
    else:
        run_flood(a)


if __name__ == "__main__":
    main()
