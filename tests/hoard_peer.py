"""hoard_peer.py -- peers that make a daemon hold memory for them, for
tests/cli_hoard.sh.

    hoard_peer.py fetch --clients EP --workers EP --pid BROKER_PID --bound-mb N
                        [--fetch-on EP] [--conns 8] [--per 16] [--sync CMD...]

`fetch`: stores 8 MiB as transformer v99 (an UPLOAD on the client socket),
then opens --conns connections to the worker socket (or --fetch-on EP:
the client socket of a standby pair's broker, where its peer fetches)
that each ask --per FETCHes of 4 MiB of it and read nothing (a receive queue of one message:
what ZeroMQ and the kernel hold for them stays small, the rest waits in
the broker). Without a bound over all connections the broker reads and
holds every answer (8 x 16 x 4 MiB = 512 MiB); with --max-fetch-mb N it
holds at most N MiB and answers the rest busy, naming the bound. Checks:
  - a FETCH from another connection meanwhile is answered busy, naming
    --max-fetch-mb;
  - the broker's peak resident memory (VmHWM) grew by less than N + 64
    MiB over the whole attack (skipped under ASan, whose quarantine keeps
    what was freed);
  - once they read, every FETCH had its answer, fewer than half of them
    data, the others busy naming --max-fetch-mb;
  - with --sync, CMD (a reelctl sync --upload that a real worker must
    fetch) started while they hold, then they go: it exits 0.

`resend`: uploads the first 256 KiB of FILE as transformer VERSION and
sends its SYNC (its barrier then waits for the rest of the upload), then
sends the SYNC again N times under new ids, and under its own id too.
Checks: all but 64 of the new ids are answered busy naming the barrier's
bound, at once; once the rest of the upload comes and the worker applies
it, the first SYNC and 63 resends get one SYNC_DONE each, complete, and
nothing more comes.

Prints one PASS/FAIL line per check (tests/lib_cli.sh py_checks), exit 0.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_guard import done, guard  # noqa: E402
from peer_wire import pack, say, vm_hwm_kb  # noqa: E402

MiB = 1 << 20


def header(frames):
    return msgpack.unpackb(frames[0], raw=False, strict_map_key=False)


def recv(sock, secs):
    """The next message on sock within secs: (header, frames), or None."""
    if not sock.poll(int(secs * 1000)):
        return None
    fr = sock.recv_multipart()
    return header(fr), fr


def dealer(ctx, ep, rcvhwm=None):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 5000)
    if rcvhwm is not None:
        s.setsockopt(zmq.RCVHWM, rcvhwm)
        s.setsockopt(zmq.RCVBUF, 4096)
    s.connect(ep)
    return s


def run_fetch(a):
    ctx = zmq.Context.instance()
    trainer = dealer(ctx, a.clients)
    data = os.urandom(8 * MiB)
    sha = hashlib.sha256(data).hexdigest()
    ack = None
    for k, off in enumerate(range(0, len(data), 4 * MiB)):
        chunk = data[off:off + 4 * MiB]
        trainer.send_multipart(pack({"type": "UPLOAD", "id": 10 + k, "component": "transformer", "version": 99,
                                     "sha256": sha, "size": len(data), "offset": off, "client": "10a2"},
                                    [("chunk", "U8", (len(chunk),), chunk)]))
        ack = recv(trainer, 30)
        if ack is not None and ack[0].get("code") == "standby" and k == 0:
            # one of a pair whose peer is silent: the same UPLOAD (its
            # client token) from another connection is a client back from
            # the other broker, which makes this one take over
            trainer.close(linger=0)
            trainer = dealer(ctx, a.clients)
            trainer.send_multipart(pack({"type": "UPLOAD", "id": 10, "component": "transformer", "version": 99,
                                         "sha256": sha, "size": len(data), "offset": 0, "client": "10a2"},
                                        [("chunk", "U8", (len(chunk),), chunk)]))
            ack = recv(trainer, 30)
        if ack is None or ack[0].get("type") != "UPLOAD_ACK":
            break
    say(ack is not None and ack[0].get("complete") is True,
        f"8 MiB are stored as transformer v99 ({ack[0] if ack else 'no answer'})")
    if ack is None or ack[0].get("complete") is not True:
        done(0)
    fetch = {"type": "FETCH", "component": "transformer", "version": 99, "sha256": sha, "offset": 0,
             "max": 4 * MiB}
    hwm0 = vm_hwm_kb(a.pid)

    on = a.fetch_on or a.workers
    hoarders = [dealer(ctx, on, rcvhwm=1) for _ in range(a.conns)]
    # another connection asks for one byte after each round of the
    # hoarders' FETCHes, until it is told the bound is reached: the round
    # before it fills the bound again whatever the hoarders took into
    # their own queues meanwhile (each takes one answer off the broker:
    # after the hoarders' burst alone, a probe on a busy machine found the
    # bound drained and was served for 30 s)
    probe = dealer(ctx, on)
    # every connection up first (a one-byte FETCH answered on each): on a
    # busy machine a connection still in its handshake has its FETCHes
    # read after the others', all at once. A hoarder leaves that answer
    # unread: it fills its queue (RCVHWM 1), so no 4 MiB answer leaves the
    # broker for it later and the bound stays reached whatever the order
    # the broker reads the connections in
    for i, s in enumerate(hoarders + [probe]):
        s.send_multipart(pack(dict(fetch, id=900000 + i, max=1)))
        if not s.poll(30000):
            say(False, f"connection {i} is answered a one-byte FETCH (no answer)")
            done(0)
    m = recv(probe, 1)
    if m is None or m[0].get("type") != "FETCH_DATA":
        say(False, f"the probe is answered a one-byte FETCH ({m[0] if m else 'no answer'})")
        done(0)
    told, last = None, None
    pid = 1
    for k in range(a.per):
        for i, h in enumerate(hoarders):
            h.send_multipart(pack(dict(fetch, id=1000 * (i + 1) + k)))
        probe.send_multipart(pack(dict(fetch, id=pid, max=1)))
        pid += 1
    for _ in range(pid - 1):
        m = recv(probe, 10)
        if m is None:
            break
        last = m[0]
        if told is None and last.get("code") == "busy" and "--max-fetch-mb" in str(last.get("message", "")):
            told = last
    end = time.monotonic() + 30
    while told is None and time.monotonic() < end:
        probe.send_multipart(pack(dict(fetch, id=pid, max=1)))
        m = recv(probe, 5)
        if m is not None:
            last = m[0]
            if last.get("code") == "busy" and "--max-fetch-mb" in str(last.get("message", "")):
                told = last
        pid += 1
    say(told is not None, f"while {a.conns} connections hold their answers unread, another connection's FETCH is "
        f"answered busy naming --max-fetch-mb ({told or last})")

    sync = None
    if a.sync:
        sync = subprocess.Popen(a.sync, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    hwm1 = vm_hwm_kb(a.pid)
    # they read now: what each got, in its order
    data_n, busy_n, other = 0, 0, []
    for h in hoarders:
        m = recv(h, 60)  # the one-byte answer of the start
        if m is None or m[0].get("type") != "FETCH_DATA":
            other.append(f"the first answer: {m[0] if m else 'none'}")
        for _ in range(a.per):
            m = recv(h, 60)
            if m is None:
                other.append("no answer")
                break
            hdr = m[0]
            if hdr.get("type") == "FETCH_DATA":
                data_n += 1
            elif hdr.get("code") == "busy" and "--max-fetch-mb" in str(hdr.get("message", "")):
                busy_n += 1
            else:
                other.append(f"{hdr.get('type')} {hdr.get('code', '')} {str(hdr.get('message', ''))[:120]}")
    total = a.conns * a.per
    hwm2 = vm_hwm_kb(a.pid)
    grew = (max(hwm1, hwm2) - hwm0) / 1024.0
    if os.environ.get("ASAN_OPTIONS"):
        print(f"  (the broker's peak resident memory grew by {grew:.0f} MiB: not judged under ASan)")
    else:
        say(0 <= grew < a.bound_mb + 64, f"the broker's peak resident memory grew by {grew:.0f} MiB under "
            f"{total} FETCHes of 4 MiB nobody read (under --max-fetch-mb {a.bound_mb} + 64)")
    say(data_n + busy_n == total and data_n < total // 2 and busy_n > 0,
        f"every one of the {total} FETCHes was answered: {data_n} with data, {busy_n} busy naming --max-fetch-mb"
        + (f"; others: {other[:3]}" if other else ""))
    for h in hoarders:
        h.close(linger=0)
    probe.close(linger=0)

    if sync is not None:
        try:
            out, _ = sync.communicate(timeout=120)
            rc = sync.returncode
        except subprocess.TimeoutExpired:
            sync.kill()
            out, rc = sync.communicate()[0], "timeout"
        text = out.decode(errors="replace").strip().splitlines()
        say(rc == 0, f"a real worker's fetch begun while they held the bound completes once they go "
            f"(exit {rc}: {text[-1] if text else ''})")
    done(0, trainer)


def run_resend(a):
    ctx = zmq.Context.instance()
    trainer = dealer(ctx, a.clients)
    data = open(a.weights, "rb").read()
    sha = hashlib.sha256(data).hexdigest()
    piece = 256 << 10

    def upload(off, rid):
        chunk = data[off:off + piece]
        trainer.send_multipart(pack({"type": "UPLOAD", "id": rid, "component": "transformer", "version": a.version,
                                     "sha256": sha, "size": len(data), "offset": off},
                                    [("chunk", "U8", (len(chunk),), chunk)]))
        while True:
            m = recv(trainer, 30)
            if m is None or m[0].get("id") == rid:
                return m

    m = upload(0, 10)
    say(m is not None and m[0].get("received") == piece, f"the first 256 KiB of v{a.version} are taken "
        f"({m[0] if m else 'no answer'})")
    sync = {"type": "SYNC", "component": "transformer", "version": a.version, "sha256": sha, "uploaded": True,
            "deadline_ms": 60000}
    trainer.send_multipart(pack(dict(sync, id=1)))
    for _ in range(3):
        trainer.send_multipart(pack(dict(sync, id=1)))
    for k in range(a.n):
        trainer.send_multipart(pack(dict(sync, id=100 + k)))
    busy, other = set(), []
    end = time.monotonic() + 30
    while len(busy) < a.n - 63 and time.monotonic() < end:
        m = recv(trainer, max(0.0, end - time.monotonic()))
        if m is None:
            break
        h = m[0]
        if h.get("code") == "busy" and "already wait for its barrier" in str(h.get("message", "")):
            busy.add(h.get("id"))
        else:
            other.append(f"{h.get('type')} {h.get('id')} {h.get('code', '')} {str(h.get('message', ''))[:100]}")
    say(len(busy) == a.n - 63 and not other, f"{len(busy)} of {a.n} resends of a SYNC waiting for its upload are "
        f"answered busy naming the barrier's bound, nothing else yet ({other[:3]})")

    off, rid, last = piece, 11, None
    while off < len(data):
        last = upload(off, rid)
        off, rid = off + piece, rid + 1
    say(last is not None and last[0].get("complete") is True, "the rest of the upload comes")
    done_ids, other = [], []
    end = time.monotonic() + 60
    while len(done_ids) < 64 and time.monotonic() < end:
        m = recv(trainer, max(0.0, end - time.monotonic()))
        if m is None:
            break
        h = m[0]
        if h.get("type") == "SYNC_DONE" and h.get("complete") and h.get("applied") == ["w1"]:
            done_ids.append(h.get("id"))
        else:
            other.append(f"{h.get('type')} {h.get('id')} {h.get('code', '')} {str(h.get('message', ''))[:100]}")
    # the broker answers one connection in order: whatever else the barrier
    # sent comes before the answer to a STATUS sent now
    trainer.send_multipart(pack({"type": "STATUS", "id": 7}))
    while True:
        m = recv(trainer, 30)
        if m is None or m[0].get("type") == "STATUS_REPLY":
            break
        h = m[0]
        if h.get("type") == "SYNC_DONE":
            done_ids.append(h.get("id"))
        else:
            other.append(f"{h.get('type')} {h.get('id')} {h.get('code', '')}")
    want = [1] + [100 + k for k in range(a.n) if 100 + k not in busy]
    say(sorted(done_ids) == sorted(want) and len(want) == 64 and not other and m is not None,
        f"the SYNC and the 63 resends taken get one SYNC_DONE each, complete, applied by w1, and nothing more "
        f"({len(done_ids)} SYNC_DONEs; {other[:3]})")
    done(0, trainer)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--clients", required=True)
    f.add_argument("--workers", required=True)
    f.add_argument("--pid", type=int, required=True)
    f.add_argument("--bound-mb", type=int, required=True)
    f.add_argument("--fetch-on")
    f.add_argument("--conns", type=int, default=8)
    f.add_argument("--per", type=int, default=16)
    f.add_argument("--sync", nargs=argparse.REMAINDER)
    r = sub.add_parser("resend")
    r.add_argument("--clients", required=True)
    r.add_argument("--weights", required=True)
    r.add_argument("--version", type=int, required=True)
    r.add_argument("--n", type=int, default=1000)
    a = ap.parse_args()
    guard(200)
    if a.mode == "fetch":
        run_fetch(a)
    else:
        run_resend(a)


if __name__ == "__main__":
    main()
