"""held_peer.py -- a fake broker that ignores the worker's max_inflight and
sends REQUESTs with large tensors, for tests/cli_worker_held.sh.

    held_peer.py --bind EP --log WORKER_LOG --pid WORKER_PID --bound-mb N [--for SECONDS]

The worker connects to --bind (a ROUTER), started with --max-held-mb N and
a --max-inflight whose 4 x bound lets far more than N MiB of such
REQUESTs be held. The peer sends REQUESTs each keeping 1,024,000 bytes (a
context of 8,000 rows of 32 floats), too many steps to end, one at a time
(an unknown type after each: its answer says the REQUEST before it was
handled, so ZeroMQ queues nothing of the next). Checks:
  - those that fit the bound (N MiB / 1,024,000 bytes of them) are held,
    every later one is answered busy naming --max-held-mb N;
  - the worker's peak resident memory (VmHWM) grew by less than N + 64
    MiB over the burst of 16 x N MiB (before the bound: every one held,
    within 4 x --max-inflight; not judged under ASan, whose quarantine
    keeps what was freed);
  - each held REQUEST cancelled ends cancelled;
  - then as many REQUESTs of that size as the bound holds are taken again,
    and each runs to its RESULT (the ended ones' bytes were released; a
    busy answer while a cancelled job still lets go is asked again);
  - a flood of 2,000 refused REQUESTs writes at most 20 refusal lines a
    10 s window to the worker's log (before: one each), and the lines left
    out are counted and said once their window is over: the lines written
    and those counts add up to every refusal of the run;
  - a valid REQUEST afterwards still gets its RESULT;
  - 2,000 REQUESTs that end without a RESULT (every other one cancelled
    at once, the others with a deadline of 1 ms), each answered cancelled
    or timeout, write at most 20 "request N failed" lines a 10 s window
    (before: one each), and once it is over "request ends: N more lines
    like the ones above" says the rest: with the lines written, the
    2,000; the worker still runs a REQUEST afterwards;
  - 300 groups of 2 that the worker splits into batches of 1 (it runs with
    --max-tokens 16, one sample's tokens), each run to its RESULT, write
    at most 20 "a group of 2 runs in batches of 1" lines a 10 s window
    (before: one each), and "request notes: N more lines ..." says the
    rest once the window is over;
  - 300 SYNCs of a path that is not there, each acked not ok, write at
    most 20 "sync to vN refused" lines a 10 s window (before: one each),
    and "sync refusals: N more lines ..." says the rest.
Before the burst, 2,000 ERRORs from the fake broker (a broker that says
ERROR in a loop), with a refused REQUEST after every 200:
  - their "broker says: ..." lines are at most 20 a 10 s window (before:
    one each), and those left out are said once their window is over
    ("broker ERRORs: N more lines like the ones above were left out"): the
    lines written and those counts add up to the 2,000;
  - the 10 refused REQUESTs among them each still write their line (the
    ERRORs' budget is their own: they do not use up the refusals');
  - the worker still runs a REQUEST to its RESULT afterwards.

Prints one PASS/FAIL line per check (tests/lib_cli.sh py_checks), exit 0.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from adversarial_peers import FakeBroker, Net, f32, request_hdr, why  # noqa: E402
from peer_guard import done, guard  # noqa: E402
from peer_wire import budget_counts, say, vm_hwm_kb  # noqa: E402

ROWS = 8000                  # a context of 8,000 x 32 floats: 1,024,000 bytes kept
BIG = np.random.default_rng(9).standard_normal((ROWS, 32)).astype(np.float32)
SMALL = np.random.default_rng(5).standard_normal((5, 32)).astype(np.float32)
BURST, WINDOW_S = 20, 10     # the log's budget for refusals (base/logbudget.h)


def refusal_lines(path):
    """The worker's log lines of refused REQUESTs, and the counts of those left out."""
    _, written, left_out, _ = budget_counts(path, r"request \d+ refused: ", "refused messages")
    return written, left_out


def said_lines(path):
    """The worker's log lines of the broker's ERRORs, the counts of those left out, the lines that say
    those counts, and all its lines."""
    lines, written, left_out, sums = budget_counts(path, "broker says: ", "broker ERRORs")
    return written, left_out, sums, lines


def ended_lines(path):
    """The worker's log lines of requests that ended without a RESULT, the counts of those left out, the lines
    that say those counts, and all its lines."""
    lines, written, left_out, sums = budget_counts(path, r"request \d+ failed: ", "request ends")
    return written, left_out, sums, lines


def noted_lines(path):
    """The worker's log lines noting a group split into batches, the counts of those left out, the lines that
    say those counts, and all its lines."""
    lines, written, left_out, sums = budget_counts(path, r"a group of \d+ runs in batches of \d+", "request notes")
    return written, left_out, sums, lines


def sync_lines(path):
    """The worker's log lines of SYNCs refused or failed, the counts of those left out, the lines that say
    those counts, and all its lines."""
    lines, written, left_out, sums = budget_counts(path, r"sync (to v\d+ )?(refused|failed): ", "sync refusals")
    return written, left_out, sums, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--bound-mb", type=int, required=True)
    ap.add_argument("--for", dest="secs", type=float, default=200.0)
    a = ap.parse_args()
    guard(a.secs)
    net = Net()
    fb = FakeBroker(net, a.bind)
    m = fb.wait(lambda h, t: h.get("type") == "READY", 60)
    say(m is not None, "the worker registers with the fake broker")
    if m is None:
        done(0)
    max_inflight = int(m[0].get("max_inflight") or 1)
    ids = iter(range(100, 1 << 30))
    refusals = 0                 # every REQUEST the worker refused (each writes a line, or counts as left out)

    def answer(rid, secs):
        return fb.wait(lambda h, t: h.get("id") == rid and h.get("type") in ("RESULT", "ERROR"), secs)

    def handled(rid):
        """Sends an unknown type after REQUEST rid; its answer says rid was handled."""
        mark = next(ids)
        fb.send({"type": "FROB", "id": mark})
        return fb.wait(lambda h, t: h.get("id") == mark and h.get("type") == "ERROR", 30) is not None

    def said_in_full(count, w0, l0, n, kind):
        """Waits (three windows at most) until the n lines of one kind sent since count (a *_lines function)
        said w0 written and l0 left out are all in the log, written or counted in KIND's summaries; checks
        that some were left out and that they add up. Its summaries and all its lines then."""
        end = time.monotonic() + 3 * WINDOW_S
        while True:
            written, left_out, sums, lines = count(a.log)
            if written - w0 + left_out - l0 >= n or time.monotonic() >= end:
                break
            net.pump(0.1)
        say(left_out > l0 and written - w0 + left_out - l0 == n,
            f"once their window is over the log says how many were left out ('{kind}: N more lines like the "
            f"ones above'): {written - w0} lines written + {left_out - l0} counted as left out = "
            f"{written - w0 + left_out - l0} of {n}")
        return sums, lines

    def run_to_result(ctx, steps, secs):
        """A REQUEST sent until it is not busy (a job that ended may still let go): its answer."""
        nonlocal refusals
        end = time.monotonic() + secs
        while True:
            rid = next(ids)
            fb.send(request_hdr(rid, steps=steps), [("context", "F32", ctx.shape, f32(ctx))])
            got = answer(rid, max(0.0, end - time.monotonic()))
            if got is None or got[0].get("code") != "busy" or time.monotonic() >= end:
                if got is not None and got[0]["type"] == "ERROR":
                    refusals += 1
                return got
            refusals += 1

    got = run_to_result(SMALL, 3, 60)
    say(got is not None and got[0]["type"] == "RESULT", f"a small REQUEST runs to its RESULT ({why(got)})")

    # ---- a broker that says ERROR in a loop: the log keeps their budget ----
    e0, l0, s0, n0 = said_lines(a.log)
    r0, _ = refusal_lines(a.log)
    t0 = time.monotonic()
    n_err, marks, refused = 2000, 0, 0
    for at in range(0, n_err, 200):  # 200 at a time: within ZeroMQ's queue, none dropped
        for k in range(at, at + 200):
            fb.send({"type": "ERROR", "id": 500000 + k, "code": "internal", "message": f"flood {k}"})
        # refused (steps 0): its line is the refusals' budget's; its answer
        # says every ERROR before it was handled (one connection keeps order)
        rid = next(ids)
        marks += 1
        fb.send(request_hdr(rid, steps=0), [("context", "F32", SMALL.shape, f32(SMALL))])
        g = answer(rid, 30)
        refused += g is not None and g[0].get("code") == "bad_request"
    refusals += refused
    took = time.monotonic() - t0
    e1, _, _, _ = said_lines(a.log)
    r1, _ = refusal_lines(a.log)
    most = BURST * (2 + int(took // WINDOW_S))
    say(refused == marks and e1 - e0 <= most,
        f"{n_err} ERRORs from the broker in {took:.1f} s wrote {e1 - e0} 'broker says' lines "
        f"(at most {most}: {BURST} a {WINDOW_S} s window; {refused} of the {marks} REQUESTs among them refused)")
    say(r1 - r0 == marks, f"the {marks} refused REQUESTs among the ERRORs each wrote their line ({r1 - r0} did): "
        "the ERRORs' budget is their own")
    sums, n2 = said_in_full(said_lines, e0, l0, n_err, "broker ERRORs")
    # everything the worker wrote meanwhile: those lines (within the bound
    # above), the refusals' and the summaries
    grown = most + marks + (sums - s0)
    say(n2 - n0 <= grown, f"the worker's log grew by {n2 - n0} lines over {n_err} ERRORs (at most {grown}: {most}, "
        f"{marks} refusals and {sums - s0} summary line{'' if sums - s0 == 1 else 's'})")
    got = run_to_result(SMALL, 3, 60)
    say(got is not None and got[0]["type"] == "RESULT",
        f"after the ERRORs a small REQUEST runs to its RESULT ({why(got)})")

    # ---- the burst: far more than the bound, one REQUEST at a time ----
    fit = a.bound_mb * (1 << 20) // BIG.nbytes
    n = 16 * fit
    say(n <= 4 * max_inflight, f"{n} REQUESTs are within the count bound, 4 x max_inflight {max_inflight}: only "
        f"--max-held-mb can refuse them")
    hwm0 = vm_hwm_kb(a.pid)
    rids, lost = [], []
    for _ in range(n):
        rid = next(ids)
        rids.append(rid)
        fb.send(request_hdr(rid, steps=10000), [("context", "F32", BIG.shape, f32(BIG))])
        if not handled(rid):
            lost.append(rid)
    # (a busy answer comes before the unknown type's that followed its REQUEST: all are in)
    early = [g for g in fb.drain(0) if g[0].get("id") in rids and g[0].get("type") in ("RESULT", "ERROR")]
    hwm1 = vm_hwm_kb(a.pid)
    busy = [g for g in early if g[0].get("code") == "busy"]
    refusals += len(early)
    held = [r for r in rids if all(g[0]["id"] != r for g in early)]
    named = all(f"--max-held-mb {a.bound_mb}" in str(g[0].get("message", "")) for g in busy)
    say(not lost and held == rids[:fit] and len(busy) == len(early) == n - fit and named,
        f"{n} REQUESTs of {BIG.nbytes} bytes: the first {fit} held, each later one answered busy naming "
        f"--max-held-mb {a.bound_mb} ({len(held)} held, {len(busy)} busy of {len(early)} answers"
        f"{'; ' + why(busy[0]) if busy else ''}{'; ' + why(early[0]) if early and not busy else ''})")
    grew = (hwm1 - hwm0) / 1024.0
    if os.environ.get("ASAN_OPTIONS"):
        print(f"  (the worker's peak resident memory grew by {grew:.0f} MiB: not judged under ASan)")
    else:
        say(0 <= grew < a.bound_mb + 64, f"the worker's peak resident memory grew by {grew:.0f} MiB over "
            f"{n} REQUESTs of {n * BIG.nbytes >> 20} MiB (under --max-held-mb {a.bound_mb} + 64)")

    # ---- the held ones end: cancelled ----
    for rid in held:
        fb.send({"type": "CANCEL", "id": rid})
    ended = [answer(rid, 60) for rid in held]
    say(len(held) > 0 and all(g is not None and g[0].get("code") == "cancelled" for g in ended),
        f"the {len(held)} held REQUESTs end cancelled ({[why(g) for g in ended[:3]]})")

    # ---- their bytes were released: the bound's worth is taken again, and runs ----
    again, end = [], time.monotonic() + 60
    for _ in range(fit):
        again.append(run_to_result(BIG, 2, max(1.0, end - time.monotonic())))
    say(all(g is not None and g[0]["type"] == "RESULT" for g in again),
        f"then {fit} REQUESTs of {BIG.nbytes} bytes are taken again and each runs to its RESULT "
        f"({[why(g) for g in again if g is None or g[0]['type'] != 'RESULT'][:3]})")

    # ---- a flood of refusals: the log keeps its budget ----
    w0, _ = refusal_lines(a.log)
    t0 = time.monotonic()
    flood = [next(ids) for _ in range(2000)]
    answers = 0
    for at in range(0, len(flood), 200):  # read as it goes: the worker's answers stay within ZeroMQ's queues
        for rid in flood[at:at + 200]:
            fb.send(request_hdr(rid, steps=0), [("context", "F32", SMALL.shape, f32(SMALL))])
        for rid in flood[at:at + 200]:
            g = answer(rid, 30)
            answers += g is not None and g[0].get("code") == "bad_request"
    refusals += answers
    took = time.monotonic() - t0
    w1, _ = refusal_lines(a.log)
    most = BURST * (2 + int(took // WINDOW_S))
    say(answers == len(flood) and w1 - w0 <= most,
        f"{len(flood)} refused REQUESTs ({answers} answered bad_request in {took:.1f} s) wrote {w1 - w0} refusal "
        f"lines to the log (at most {most}: {BURST} a {WINDOW_S} s window)")
    # the lines left out are said once their window is over: every refusal is accounted for
    end = time.monotonic() + 3 * WINDOW_S
    while True:
        written, left_out = refusal_lines(a.log)
        if written + left_out >= refusals or time.monotonic() >= end:
            break
        net.pump(0.1)
    say(written + left_out == refusals,
        f"the log accounts for every refusal: {written} lines written + {left_out} counted as left out = "
        f"{written + left_out} of {refusals}")

    got = run_to_result(SMALL, 3, 60)
    say(got is not None and got[0]["type"] == "RESULT",
        f"after the flood a small REQUEST runs to its RESULT ({why(got)})")

    # ---- REQUESTs that end without a RESULT, in a loop: cancelled, or past their deadline ----
    e0, l0, s0, n0 = ended_lines(a.log)
    t0 = time.monotonic()
    n_end, ok = 2000, 0
    for at in range(0, n_end, 50):  # 50 at a time: within 4 x --max-inflight
        batch = [next(ids) for _ in range(50)]
        for k, rid in enumerate(batch):
            if (at + k) % 2 == 0:   # cancelled
                fb.send(request_hdr(rid, steps=10000), [("context", "F32", SMALL.shape, f32(SMALL))])
                fb.send({"type": "CANCEL", "id": rid})
            else:                   # its deadline passes before its first step is over
                fb.send(request_hdr(rid, steps=10000, deadline_ms=1), [("context", "F32", SMALL.shape, f32(SMALL))])
        for k, rid in enumerate(batch):
            g = answer(rid, 30)
            ok += g is not None and g[0].get("code") == ("cancelled" if (at + k) % 2 == 0 else "timeout")
    took = time.monotonic() - t0
    e1, _, _, _ = ended_lines(a.log)
    most = BURST * (2 + int(took // WINDOW_S))
    say(ok == n_end and e1 - e0 <= most,
        f"{n_end} REQUESTs cancelled or past their deadline ({ok} answered cancelled or timeout in {took:.1f} s) "
        f"wrote {e1 - e0} 'request N failed' lines (at most {most}: {BURST} a {WINDOW_S} s window; before: one each)")
    sums, n2 = said_in_full(ended_lines, e0, l0, n_end, "request ends")
    grown = most + (sums - s0)
    say(n2 - n0 <= grown, f"the worker's log grew by {n2 - n0} lines over them (at most {grown}: {most} and "
        f"{sums - s0} summary line{'' if sums - s0 == 1 else 's'})")
    got = run_to_result(SMALL, 3, 60)
    say(got is not None and got[0]["type"] == "RESULT",
        f"after them a small REQUEST runs to its RESULT ({why(got)})")

    # ---- groups the worker splits into batches (--max-tokens 16: one 16-token sample a batch), in a loop:
    # each request's start notes its split, within the budget 'request notes' ----
    w0, l0, s0, n0 = noted_lines(a.log)
    t0 = time.monotonic()
    n_split, ran = 300, 0
    for at in range(0, n_split, 50):
        batch = [next(ids) for _ in range(50)]
        for rid in batch:
            fb.send(request_hdr(rid, steps=1, n=2, seeds=[rid, rid + 1]),
                    [("context", "F32", SMALL.shape, f32(SMALL))])
        for rid in batch:
            g = answer(rid, 60)
            ran += g is not None and g[0].get("type") == "RESULT"
    took = time.monotonic() - t0
    w1, _, _, _ = noted_lines(a.log)
    most = BURST * (2 + int(took // WINDOW_S))
    say(ran == n_split and w1 - w0 <= most,
        f"{n_split} groups of 2 split into batches of 1 ({ran} ran to their RESULT in {took:.1f} s) wrote "
        f"{w1 - w0} 'a group of 2 runs in batches of 1' lines (at most {most}: {BURST} a {WINDOW_S} s window; "
        f"before: one each)")
    said_in_full(noted_lines, w0, l0, n_split, "request notes")

    # ---- SYNCs the sync thread refuses (a path that is not there), in a loop: 'sync refusals' ----
    w0, l0, s0, n0 = sync_lines(a.log)
    t0 = time.monotonic()
    n_sync, acked = 300, 0
    for k in range(n_sync):
        sid = next(ids)
        fb.send({"type": "SYNC", "id": sid, "component": "transformer", "version": 2 + k, "sha256": "ab" * 32,
                 "path": "/nonexistent/w.safetensors"})
        m = fb.wait(lambda h, t, sid=sid: h.get("id") == sid and h.get("type") in ("SYNC_ACK", "ERROR"), 30)
        acked += m is not None and m[0]["type"] == "SYNC_ACK" and m[0].get("ok") is False
    took = time.monotonic() - t0
    w1, _, _, _ = sync_lines(a.log)
    most = BURST * (2 + int(took // WINDOW_S))
    say(acked == n_sync and w1 - w0 <= most,
        f"{n_sync} SYNCs of a file that is not there ({acked} acked not ok in {took:.1f} s) wrote {w1 - w0} "
        f"'sync to vN refused' lines (at most {most}: {BURST} a {WINDOW_S} s window; before: one each)")
    said_in_full(sync_lines, w0, l0, n_sync, "sync refusals")
    got = run_to_result(SMALL, 3, 60)
    say(got is not None and got[0]["type"] == "RESULT",
        f"after them a small REQUEST runs to its RESULT ({why(got)})")
    done(0)


if __name__ == "__main__":
    main()
