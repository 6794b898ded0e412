"""flood_peer.py -- a peer that floods a broker socket with junk and never
reads what comes back (tests/cli_flood.sh).

    flood_peer.py --endpoint EP --for SECONDS [--ready NAME [--events]] [--burst N]

Connects a DEALER and, for SECONDS, sends bursts of N messages (2,000 by
default: the size of the flood that stalled the broker for over a minute
before it stopped waiting on peers) every 100 ms, cycling through four
kinds of junk: bytes that are not msgpack, a truncated map, a header of an
unknown type, and a GEN without its fields. With --ready it first
registers as worker NAME serving a model nobody asks for, so the broker
knows it (and may answer it, within its budget); with --events as well,
its bursts are valid EVENTS messages of 16 declines each (the catalog's
event flood) instead of junk. It never receives. Ends with one line:
"flood: N messages sent".
"""

import argparse
import os
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_guard import done, guard  # noqa: E402


def junk():
    unknown = msgpack.packb({"proto": "reel/1", "type": "NOSUCH", "id": 1})
    bad_gen = msgpack.packb({"proto": "reel/1", "type": "GEN", "id": 2})
    return [os.urandom(24), b"\x81\xa1", unknown, bad_gen]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--for", dest="secs", type=float, default=5.0)
    ap.add_argument("--ready")
    ap.add_argument("--burst", type=int, default=2000)
    ap.add_argument("--events", action="store_true")
    a = ap.parse_args()
    guard(a.secs)
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)  # queue what the broker has not read yet
    s.setsockopt(zmq.RCVHWM, 1)  # and take (almost) nothing back
    if a.ready:
        s.setsockopt(zmq.ROUTING_ID, a.ready.encode())
    s.connect(a.endpoint)
    if a.ready:
        s.send(msgpack.packb({"proto": "reel/1", "type": "READY", "id": 0, "name": a.ready,
                              "models": ["nobody-asks-for-this"], "versions": {"transformer": 0}}))
    kinds = junk()
    if a.events:
        ev = [{"kind": "decline", "reason": "warming_up", "key": f"reel-key/1 flood {i}",
               "key_hash": "%016x" % (i + 1), "count": 1} for i in range(16)]
        kinds = [msgpack.packb({"proto": "reel/1", "type": "EVENTS", "id": 0, "events": ev})]
    sent = 0
    end = time.monotonic() + a.secs
    while time.monotonic() < end:
        for i in range(a.burst):
            try:
                s.send(kinds[i % len(kinds)], zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                break
        time.sleep(0.1)
    print(f"flood: {sent} messages sent", flush=True)
    done(0, s)


if __name__ == "__main__":
    main()
