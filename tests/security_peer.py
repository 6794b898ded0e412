"""security_peer.py -- a raw Reel peer for tests/cli_security.sh: what an
attacker (or a buggy peer) on the same network can send, byte for byte.

    security_peer.py --endpoint EP [--id ROUTING_ID] [--key K --broker-key B]
                     [--for SECONDS] [--answered] [--heartbeat] [--repeat N] [HEADER_JSON ...]

Connects a DEALER (with CURVE when keys are given), sends each header
(the list N times over with --repeat N)
(a JSON object; "proto" is added; integers may be any size, so a version
of 2**64-1 goes out as msgpack uint64), then listens for SECONDS, sending
HEARTBEAT every 200 ms with --heartbeat, and prints one line per message
received: its type, then code and message for an ERROR, or the JSON of
the header for anything else. With --answered it stops at the first
message that is not a HEARTBEAT (the answer a check waits for: SECONDS is
then only its bound, generous for a busy machine, not a window the answer
must fall in). Ends with "peer: N messages (T REQUEST)".
Exit 0; 3 when a key cannot be read.
"""

import argparse
import json
import os
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
from reel.client import read_key  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_guard import done, guard  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--id")
    ap.add_argument("--key")
    ap.add_argument("--broker-key")
    ap.add_argument("--for", dest="secs", type=float, default=1.0)
    ap.add_argument("--heartbeat", action="store_true")
    ap.add_argument("--answered", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="send the headers this many times over (a flood)")
    ap.add_argument("headers", nargs="*")
    a = ap.parse_args()
    guard(a.secs)
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 2000)  # a send that cannot be queued fails, never waits
    if a.id:
        s.setsockopt(zmq.ROUTING_ID, a.id.encode())
    if a.key:
        try:
            mine, server = read_key(a.key, True), read_key(a.broker_key, False)
        except (OSError, ValueError) as e:
            print(f"peer: {e}")
            done(3, s)
        s.curve_serverkey = server["public-key"].encode()
        s.curve_publickey = mine["public-key"].encode()
        s.curve_secretkey = mine["secret-key"].encode()
    s.connect(a.endpoint)
    for h in a.headers * a.repeat:
        hdr = json.loads(h)
        hdr["proto"] = "reel/1"
        try:
            s.send(msgpack.packb(hdr, use_bin_type=True))
        except zmq.Again:
            print("peer: a send could not be queued in 2 s")
    end = time.monotonic() + a.secs
    next_hb = 0.0
    n = requests = 0
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if a.heartbeat and now >= next_hb:
            try:
                s.send(msgpack.packb({"proto": "reel/1", "type": "HEARTBEAT"}), zmq.NOBLOCK)
            except zmq.Again:
                pass
            next_hb = now + 0.2
        if not s.poll(50):
            continue
        try:
            frames = s.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            continue
        n += 1
        try:
            hdr = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
        except Exception:
            print("UNREADABLE")
            continue
        t = hdr.get("type", "?")
        requests += t == "REQUEST"
        if t == "ERROR":
            print(f"ERROR {hdr.get('code')} {hdr.get('message')}")
        elif t != "HEARTBEAT":
            print(f"{t} {json.dumps(hdr, default=str, sort_keys=True)}")
        sys.stdout.flush()
        if a.answered and t != "HEARTBEAT":
            break
    print(f"peer: {n} messages ({requests} REQUEST)")
    done(0, s)


if __name__ == "__main__":
    main()
