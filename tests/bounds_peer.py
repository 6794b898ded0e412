"""bounds_peer.py -- raw peers that ask the broker for work it must bound,
for tests/cli_peer_bounds.sh.

    bounds_peer.py resend --clients EP --workers EP --weights FILE --weights3 FILE --log BROKER_LOG
                          [--n 500] [--current 2000] [--workers-n 2000]

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
to 2 a resend. Then the fake worker acks v3 --workers-n times and sends
READY --workers-n times more (half of them lagging at v2: each sent v3
again; half at v3 asking for a PREWARM): within the worker's own share of
the log, at most 20 lines a window (before: 1 an ack, 3 a READY), the
rest said as "fw: N more lines ..."; the broker lists fw once.

    bounds_peer.py requests --clients EP --workers EP --log BROKER_LOG [--n 2000]

`requests`: a client resends a live GEN (a model no worker serves: it
waits) --n times from two connections, then cancels it: the one answer
goes to the last resend's connection; then GENs that end, --n each:
failing no_worker (deadline 1 ms), cancelled while queued, and, on a fake
worker, --n / 2 cancelled while running (the worker answers each CANCEL
late) and --n / 4 past their deadline of 1 ms (answered late); then a
worker that never reads is sent GENs until a send to it fails, and sends
--n HEARTBEATs (each: reachable again, a GEN sent, unreachable) and a
DISCONNECT. Checks: each is answered as docs/PROTOCOL.md says; each kind
("GEN resends", "request ends", the worker's share "fu") writes at most
20 lines a 10 s window, and once it is over the lines written and those
counted as left out add up to the events; the log grew by no more; the
broker still answers.

    bounds_peer.py flood --clients EP --workers EP --log BROKER_LOG [--n 2000] [--conns 300]

`flood`: peers that never read send --n each of: SYNCs refused for their
fields, SYNCs of a component not served, junk frames and unknown types,
and 3,000 STATUS (client socket); --conns fresh connections send one RESULT each
(worker socket). Checks: the broker read them all and still answers;
prints "ELAPSED S" (the flood's seconds) for the shell, which counts the
log lines and audit rows.

    bounds_peer.py uploads --clients EP --log BROKER_LOG [--n 300]

`uploads` (a broker with --weights-dir): a trainer sends --n one-chunk
UPLOADs of 1 KiB whose bytes do not hash to their sha256, then one that
does. Checks: each bad one is answered ERROR and the good one stored; the
uploads' lines ("upload ... refused: its bytes hash to ...") write at
most 20 a 10 s window (before: one each), and once it is over "uploads: N
more lines like the ones above" says the rest.

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
from peer_wire import budget_counts, pack, say  # noqa: E402


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

    def __init__(self, ctx, ep, name, **ready):
        self.s = dealer(ctx, ep)
        self.ready = dict({"type": "READY", "name": name, "models": ["fakem"], "versions": {"transformer": 1}},
                          **ready)
        self.s.send_multipart(pack(self.ready))
        self.beat_at = 0.0
        self.inbox = []
        self.fid = 0

    def read_all(self):
        """Sends a FETCH of what is not stored and waits for its answer: the broker read every message this
        worker sent before it (one connection keeps order). True when it came."""
        self.fid += 1
        rid = 900000 + self.fid
        self.s.send_multipart(pack({"type": "FETCH", "id": rid, "component": "transformer", "version": 999,
                                    "sha256": "ab" * 32}))
        return self.wait(lambda h: h.get("id") == rid, 30) is not None

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
    return budget_counts(path, r"sync transformer v2 (resent \(current\)|complete \(applied fw; failed -\))",
                         "SYNC resends")


def kind_lines(path, pattern, who):
    """The broker's log: its lines, those pattern (a regex) finds, the counts "WHO: N more lines like the
    ones above were left out" says, and the lines that say them."""
    return budget_counts(path, pattern, who, prog="reel-broker")


def budget_checks(log, what, pattern, who, base, n, took, pump):
    """Checks that the n lines of `what` (pattern; summed up as `who`) written since base (kind_lines's
    answer then) were at most BURST a WINDOW_S window over took seconds, and, once their window is over
    (polled, pump() between polls, up to 3 windows), that those written and those counted as left out
    are the n. Returns (the bound on those written, the summary lines since base)."""
    _, w1, _, _ = kind_lines(log, pattern, who)
    most = BURST * (2 + int(took // WINDOW_S))
    say(w1 - base[1] <= most, f"{what} wrote {w1 - base[1]} lines in {took:.1f} s (at most {most}: {BURST} a "
        f"{WINDOW_S} s window)")
    end = time.monotonic() + 3 * WINDOW_S
    while True:
        _, w2, l2, s2 = kind_lines(log, pattern, who)
        if w2 - base[1] + l2 - base[2] >= n or time.monotonic() >= end:
            break
        pump()
    written, left = w2 - base[1], l2 - base[2]
    say(left > 0 and written + left == n, f"once their window is over the log says how many were left out "
        f"('{who}: N more lines like the ones above'): {written} lines written + {left} counted as left out = "
        f"{written + left} of {n}")
    return most, s2 - base[3]


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

    # ---- a worker that repeats itself: its acks, its READYs ----
    # Their lines come out of the worker's shares of the broker's log,
    # kept across a READY again (before: a line for each ack, three for
    # each READY): its acks and the catch-up SYNC or PREWARM a READY asks
    # out of its own ("fw"), the READY's loss and "ready" out of its
    # READYs again's ("fw READYs again").
    fw.read_all()
    pattern = r"reel-broker: (worker fw( applied transformer v3$|: PREWARM with)|sync transformer v3 sent to fw$)"
    again_pat = r"reel-broker: worker fw( lost \(restarted\)| ready \()"
    base = kind_lines(a.log, pattern, "fw")
    base_a = kind_lines(a.log, again_pat, "fw READYs again")
    t0 = time.monotonic()
    ack = {"type": "SYNC_ACK", "id": 0, "component": "transformer", "version": 3, "ok": True}
    for k in range(a.workers_n):
        fw.s.send_multipart(pack(ack))
        if k % 200 == 199:
            fw.beat()
    # half of the READYs lag (v2: each is sent v3 again, a catch-up), half
    # run v3 and ask for a PREWARM
    for k in range(a.workers_n):
        lag = k < a.workers_n // 2
        fw.s.send_multipart(pack(dict(fw.ready, versions={"transformer": 2 if lag else 3},
                                      prewarm=0 if lag else 1)))
        if k % 200 == 199:
            fw.read_all()
    read = fw.read_all()
    took = time.monotonic() - t0
    st = status(rid)
    rid += 1
    regs = [w for w in (st or {}).get("workers", []) if w.get("name") == "fw"]
    say(read and len(regs) == 1, f"{a.workers_n} acks of v3 and {a.workers_n} READYs again from fw: the broker "
        f"read them all and lists fw once ({len(regs)} entries)")
    most, sums = budget_checks(a.log, f"{a.workers_n} acks and the catch-ups and PREWARMs of {a.workers_n} READYs "
                               "again", pattern, "fw", base, 2 * a.workers_n, took,
                               lambda: fw.wait(lambda h: False, 0.1))
    most_a, sums_a = budget_checks(a.log, f"{a.workers_n} READYs again (its loss, 'ready')", again_pat,
                                   "fw READYs again", base_a, 2 * a.workers_n, took,
                                   lambda: fw.wait(lambda h: False, 0.1))
    n2 = kind_lines(a.log, pattern, "fw")[0]
    grown = most + most_a + sums + sums_a
    say(n2 - base[0] <= grown, f"the broker's log grew by {n2 - base[0]} lines over them (at most {grown}: "
        f"{most} + {most_a} and {sums + sums_a} summary lines)")
    st = status(rid)
    say(st is not None and st.get("versions", {}).get("transformer") == 3, "the broker still answers: STATUS, "
        f"v3 current ({(st or {}).get('versions')})")
    done(0, trainer)


CTX = bytes(5 * 32 * 4)      # a GEN's context: [5, 32] F32 zeros


def gen(rid, model, **kw):
    h = dict({"type": "GEN", "id": rid, "model": model, "steps": 2, "latent_shape": [4, 1, 8, 8], "seed": 1}, **kw)
    return pack(h, [("context", "F32", (5, 32), CTX)])


def answers(sock, ids, secs, beat=None):
    """The answers on sock to the ids within secs, as {id: header} (others dropped; beat() between polls)."""
    got, end = {}, time.monotonic() + secs
    while len(got) < len(ids) and time.monotonic() < end:
        if beat:
            beat()
        h = recv(sock, 0.05)
        if h is not None and h.get("id") in ids:
            got[h["id"]] = h
    return got


def run_requests(a):
    """A client's requests in a loop: GENs resent, cancelled, let expire."""
    ctx = zmq.Context.instance()
    fr = FakeWorker(ctx, a.workers, "fr", max_inflight=4096)
    c1, c2 = dealer(ctx, a.clients), dealer(ctx, a.clients)
    rid = iter(range(1000, 1 << 30))

    def status(sock):
        r = next(rid)
        sock.send_multipart(pack({"type": "STATUS", "id": r}))
        return until_answer(sock, r, 30, fr.beat)

    def fr_inflight():
        st = status(c1)
        return next((w.get("inflight") for w in (st or {}).get("workers", []) if w.get("name") == "fr"), None)

    st = None
    end = time.monotonic() + 30
    while time.monotonic() < end and not (st and any(w.get("name") == "fr" for w in st.get("workers", []))):
        st = status(c1)
    say(st is not None and any(w.get("name") == "fr" for w in st.get("workers", [])), "the fake worker registers")
    resend_pat = r"reel-broker: GEN \d+ of client [0-9a-f]+ resent while request \d+ waits"
    ends_pat = (r"reel-broker: (request \d+ (failed: (no_worker|timeout)|cancelled by its client while|"
                r"requeued after losing fu$)|late ERROR for request \d+ from fr discarded)")
    base_r = kind_lines(a.log, resend_pat, "GEN resends")
    base_e = kind_lines(a.log, ends_pat, "request ends")
    t0 = time.monotonic()

    # ---- a live GEN resent in a loop, from two connections ----
    tok = "5eed"
    live = gen(7, "nobody", client=tok, deadline_ms=120000)   # no worker serves it: it waits
    c1.send_multipart(live)
    for k in range(a.n):
        (c1 if k % 2 == 0 else c2).send_multipart(live)
    # one connection's messages are handled in order: once a STATUS on
    # each is answered, every resend was read, and none was answered
    early = []
    for s in (c1, c2):
        r = next(rid)
        s.send_multipart(pack({"type": "STATUS", "id": r}))
        while True:
            h = recv(s, 30)
            if h is None or h.get("id") == r:
                break
            early.append(h)
    # (the broker reads the two connections in turns of its own: the last
    # resend it read comes from either; one more from c2 is the last)
    c2.send_multipart(live)
    r = next(rid)
    c2.send_multipart(pack({"type": "STATUS", "id": r}))
    while True:
        h = recv(c2, 30)
        if h is None or h.get("id") == r:
            break
        early.append(h)
    said = [h for h in early if h.get("id") == 7]
    say(not said, f"{a.n + 1} resends of a live GEN (its model has no worker: it waits): no answer of their own "
        f"({said[:2]})")
    # its answer goes to the last resend's sender (c2): a CANCEL from c1
    c1.send_multipart(pack({"type": "CANCEL", "id": 7, "client": tok}))
    h = until_answer(c2, 7, 30, fr.beat)
    say(h is not None and h.get("type") == "ERROR" and h.get("code") == "cancelled",
        f"cancelled, it is answered on the connection of the last resend, as docs/PROTOCOL.md says ({h})")
    ends = 1

    # ---- GENs that fail no_worker (deadline 1 ms, a model no worker serves) ----
    ok = 0
    for at in range(0, a.n, 50):   # (within --queue-max)
        ids = list(range(100000 + at, 100000 + at + 50))
        for i in ids:
            c1.send_multipart(gen(i, "nobody", deadline_ms=1))
        ok += sum(h.get("code") == "no_worker" for h in answers(c1, ids, 30, fr.beat).values())
    say(ok == a.n, f"{a.n} GENs of a model no worker serves, deadline 1 ms: each answered no_worker ({ok} were)")
    ends += a.n

    # ---- GENs cancelled while queued ----
    ok = 0
    for at in range(0, a.n, 50):
        ids = list(range(200000 + at, 200000 + at + 50))
        for i in ids:
            c1.send_multipart(gen(i, "nobody", deadline_ms=120000))
            c1.send_multipart(pack({"type": "CANCEL", "id": i}))
        ok += sum(h.get("code") == "cancelled" for h in answers(c1, ids, 30, fr.beat).values())
    say(ok == a.n, f"{a.n} GENs cancelled while queued: each answered cancelled ({ok} were)")
    ends += a.n

    # ---- GENs cancelled while running on fr, which answers each CANCEL ----
    half = a.n // 2
    ok, told = 0, 0

    def fr_answers_cancels():
        nonlocal told
        fr.beat()
        keep = []
        for h in fr.inbox:
            if h.get("type") == "CANCEL":
                fr.s.send_multipart(pack({"type": "ERROR", "id": h["id"], "code": "cancelled",
                                          "message": "cancelled by its client"}))
                told += 1
            elif h.get("type") != "REQUEST":
                keep.append(h)
        fr.inbox[:] = keep

    for at in range(0, half, 50):
        ids = list(range(300000 + at, 300000 + at + 50))
        for i in ids:
            c1.send_multipart(gen(i, "fakem", deadline_ms=120000))
            c1.send_multipart(pack({"type": "CANCEL", "id": i}))
        ok += sum(h.get("code") == "cancelled" for h in answers(c1, ids, 30, fr_answers_cancels).values())
    end = time.monotonic() + 30
    while told < half and time.monotonic() < end:
        fr_answers_cancels()
        fr.s.poll(50)
    freed = None
    while time.monotonic() < end and freed != 0:
        freed = fr_inflight()
    say(ok == half and told == half and freed == 0,
        f"{half} GENs cancelled while running on a worker: each answered cancelled ({ok} were), the worker's "
        f"{told} late answers free its slots ({freed} left)")
    ends += 2 * half

    # ---- GENs past their deadline on fr, which answers them late ----
    quarter = a.n // 4
    held = []

    def fr_holds():
        fr.beat()
        held.extend(h["id"] for h in fr.inbox if h.get("type") == "REQUEST")
        fr.inbox[:] = []

    ids = list(range(400000, 400000 + quarter))
    for i in ids:
        c1.send_multipart(gen(i, "fakem", deadline_ms=1))
    got = answers(c1, ids, 30, fr_holds)
    ok = sum(h.get("code") == "timeout" for h in got.values())
    end = time.monotonic() + 30
    while len(held) < quarter and time.monotonic() < end:
        fr_holds()
        fr.s.poll(50)
    for i in held:
        fr.s.send_multipart(pack({"type": "ERROR", "id": i, "code": "internal", "message": "late"}))
    freed = None
    while time.monotonic() < end and freed != 0:
        freed = fr_inflight()
    say(ok == quarter and len(held) == quarter and freed == 0,
        f"{quarter} GENs with a deadline of 1 ms on a worker that answers late: each answered timeout ({ok} "
        f"were), the {len(held)} late answers discarded ({freed} slots left)")
    ends += 2 * quarter

    # ---- a worker that never reads, and speaks: unreachable, reachable again ----
    fu = ctx.socket(zmq.DEALER)
    fu.setsockopt(zmq.LINGER, 0)
    fu.setsockopt(zmq.RCVHWM, 1)
    fu.setsockopt(zmq.RCVBUF, 4096)
    fu.connect(a.workers)
    fu.send_multipart(pack({"type": "READY", "name": "fu", "models": ["fakeu"], "versions": {"transformer": 1},
                            "max_inflight": 65536}))
    toggle_pat = r"reel-broker: worker fu (unreachable \(|reachable again)"
    # GENs routed to it fill its queue until a send to it fails (the
    # broker's log says so: the event waited for), and a few more wait
    sent, end = 0, time.monotonic() + 60
    while kind_lines(a.log, toggle_pat, "fu")[1] == 0 and time.monotonic() < end:
        for _ in range(100):
            c1.send_multipart(gen(500000 + sent, "fakeu", deadline_ms=600000))
            sent += 1
        fu.send_multipart(pack({"type": "HEARTBEAT"}))
        status(c1)
    for i in range(10):
        c1.send_multipart(gen(600000 + i, "fakeu", deadline_ms=600000))
    status(c1)
    base_u = kind_lines(a.log, toggle_pat, "fu")
    say(base_u[1] >= 1, f"a worker that never reads is unreachable once its queue is full ({sent} GENs sent for its model)")
    # each HEARTBEAT makes it reachable again, and a GEN that waits for it
    # is sent at once, and fails: two lines each (before); its DISCONNECT
    # after them one more (it spoke), and its GENs are requeued
    st = status(c1)
    k = next((w.get("inflight") for w in (st or {}).get("workers", []) if w.get("name") == "fu"), 0)
    q = (st or {}).get("queue", 0)
    for _ in range(a.n):
        fu.send_multipart(pack({"type": "HEARTBEAT"}))
    fu.send_multipart(pack({"type": "DISCONNECT"}))
    toggles = 2 * a.n + 1
    gone = False
    end = time.monotonic() + 60
    while not gone and time.monotonic() < end:
        with open(a.log, encoding="utf-8", errors="replace") as f:
            gone = any("worker fu lost (disconnect)" in line for line in f)
        fr.wait(lambda h: False, 0.1)
    # its GENs, all queued now, are cancelled (those the full queue
    # answered BUSY are no more)
    live_u = list(range(500000, 500000 + sent)) + list(range(600000, 600010))
    for i in live_u:
        c1.send_multipart(pack({"type": "CANCEL", "id": i}))
    ok, end = 0, time.monotonic() + 30
    while ok < k + q and time.monotonic() < end:
        fr.beat()
        h = recv(c1, 0.05)
        ok += h is not None and h.get("id") in live_u and h.get("code") == "cancelled"
    say(gone and k > 0 and ok == k + q,
        f"{a.n} HEARTBEATs from it, then its DISCONNECT, read: its {k} GENs requeued and, with the {q} that "
        f"waited, cancelled ({ok} answered cancelled)")
    ends += 2 * k + q
    took = time.monotonic() - t0

    most_r, sums_r = budget_checks(a.log, f"{a.n + 1} resends of a live GEN", resend_pat, "GEN resends", base_r, a.n + 1,
                                   took, lambda: fr.wait(lambda h: False, 0.1))
    most_e, sums_e = budget_checks(a.log, f"{ends} ends of requests (cancelled, no_worker, timeout, late answers)",
                                   ends_pat, "request ends", base_e, ends, took,
                                   lambda: fr.wait(lambda h: False, 0.1))
    most_u, sums_u = budget_checks(a.log, f"{a.n} HEARTBEATs of a worker that never reads", toggle_pat, "fu",
                                   base_u, toggles, took, lambda: fr.wait(lambda h: False, 0.1))
    n2 = kind_lines(a.log, ends_pat, "request ends")[0]
    # everything the broker wrote meanwhile: those lines, fu's "ready",
    # the lines it wrote before its HEARTBEATs, its loss and the summaries
    pre = 1 + base_u[1] + 1
    grown = most_r + most_e + most_u + pre + sums_r + sums_e + sums_u
    say(n2 - base_e[0] <= grown, f"the broker's log grew by {n2 - base_e[0]} lines over them (at most {grown}: "
        f"{most_r} + {most_e} + {most_u}, fu's {pre} of its registration, its queue filling and its loss, and "
        f"{sums_r + sums_e + sums_u} summary lines)")
    if n2 - base_e[0] > grown:
        with open(a.log, encoding="utf-8", errors="replace") as f:
            extra = [ln.rstrip() for ln in f.readlines()[base_e[0]:]
                     if not re.search(resend_pat + "|" + ends_pat + "|" + toggle_pat, ln)]
        print("\n".join("  | " + ln for ln in extra[:12]))
    c1.send_multipart(gen(9, "nobody", deadline_ms=1))
    h = until_answer(c1, 9, 30, fr.beat)
    say(h is not None and h.get("code") == "no_worker", f"the broker still answers a GEN ({h})")
    done(0, c1)


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


def run_uploads(a):
    """A trainer's UPLOADs in a loop, each refused for its bytes."""
    ctx = zmq.Context.instance()
    tr = dealer(ctx, a.clients)
    data = bytes(range(256)) * 4
    sha = hashlib.sha256(data).hexdigest()
    pattern = r"upload transformer v\d+ refused: its bytes hash to"
    base = kind_lines(a.log, pattern, "uploads")
    t0 = time.monotonic()
    refused = 0
    for i in range(a.n):
        rid = 100 + i
        tr.send_multipart(pack({"type": "UPLOAD", "id": rid, "component": "transformer", "version": 7,
                                "sha256": "0" * 64, "size": len(data), "offset": 0},
                               [("chunk", "U8", (len(data),), data)]))
        h = until_answer(tr, rid, 30)
        refused += h is not None and h.get("type") == "ERROR"
    took = time.monotonic() - t0
    say(refused == a.n, f"{a.n} UPLOADs whose bytes do not hash to their sha256: {refused} answered ERROR")
    budget_checks(a.log, f"{a.n} refused UPLOADs", pattern, "uploads", base, a.n, took, lambda: time.sleep(0.1))
    tr.send_multipart(pack({"type": "UPLOAD", "id": 9, "component": "transformer", "version": 7, "sha256": sha,
                            "size": len(data), "offset": 0}, [("chunk", "U8", (len(data),), data)]))
    h = until_answer(tr, 9, 30)
    say(h is not None and h.get("complete") is True, f"then an UPLOAD that hashes right is stored ({h})")
    done(0, tr)


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
    r.add_argument("--workers-n", dest="workers_n", type=int, default=2000)
    q = sub.add_parser("requests")
    q.add_argument("--clients", required=True)
    q.add_argument("--workers", required=True)
    q.add_argument("--log", required=True)
    q.add_argument("--n", type=int, default=2000)
    f = sub.add_parser("flood")
    f.add_argument("--clients", required=True)
    f.add_argument("--workers", required=True)
    f.add_argument("--n", type=int, default=2000)
    f.add_argument("--conns", type=int, default=300)
    f.add_argument("--log", required=True)
    u = sub.add_parser("uploads")
    u.add_argument("--clients", required=True)
    u.add_argument("--log", required=True)
    u.add_argument("--n", type=int, default=300)
    a = ap.parse_args()
    guard(200)
    if a.mode == "resend":
        run_resend(a)
    elif a.mode == "requests":
        run_requests(a)
    elif a.mode == "uploads":
        run_uploads(a)
    else:
        run_flood(a)


if __name__ == "__main__":
    main()
