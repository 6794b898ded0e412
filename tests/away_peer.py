"""away_peer.py -- a raw worker for tests/cli_sync_undelivered.sh that leaves
its broker session and comes back on cue, as a reel-worker between two
sessions does (its connection gone while it registers again).

    away_peer.py --endpoint EP --name NAME [--version V] [--for SECONDS]

Connects a DEALER whose routing id is NAME (as reel-worker's), registers
(READY serving tiny at transformer V, 1 by default), sends HEARTBEAT every
100 ms and acks every SYNC ok at once (with the SYNC's id: V becomes its
version). SIGUSR1: it goes away: the socket closes (linger 0, so the
broker's route to it is gone) and it sends nothing. SIGUSR2: it comes
back: a new socket under the same routing id, READY at the version it
runs. Prints one line per event ("ready V", "SYNC V", "away") and ends
after SECONDS (60), bounded by peer_guard.
"""

import argparse
import os
import signal
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_guard import done, guard  # noqa: E402

cue = {"away": False, "back": False}


def say(line):
    print(line)
    sys.stdout.flush()


def send(s, hdr):
    hdr["proto"] = "reel/1"
    try:
        s.send(msgpack.packb(hdr, use_bin_type=True), zmq.NOBLOCK)
    except zmq.Again:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--for", dest="secs", type=float, default=60.0)
    a = ap.parse_args()
    guard(a.secs)
    signal.signal(signal.SIGUSR1, lambda *_: cue.update(away=True))
    signal.signal(signal.SIGUSR2, lambda *_: cue.update(back=True))
    ctx = zmq.Context.instance()
    version = a.version

    def connect():
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, a.name.encode())
        s.connect(a.endpoint)
        send(s, {"type": "READY", "name": a.name, "models": ["tiny"], "versions": {"transformer": version}})
        say(f"ready {version}")
        return s

    s = connect()
    end = time.monotonic() + a.secs
    next_hb = 0.0
    while time.monotonic() < end:
        if cue["away"]:
            cue["away"] = False
            if s is not None:
                s.close(linger=0)
                s = None
                say("away")
        if cue["back"]:
            cue["back"] = False
            if s is None:
                s = connect()
        if s is None:
            time.sleep(0.02)
            continue
        now = time.monotonic()
        if now >= next_hb:
            send(s, {"type": "HEARTBEAT"})
            next_hb = now + 0.1
        if not s.poll(20):
            continue
        try:
            frames = s.recv_multipart(zmq.NOBLOCK)
            hdr = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
        except (zmq.Again, ValueError, msgpack.UnpackException):
            continue
        if hdr.get("type") == "SYNC":
            v = int(hdr.get("version", 0))
            say(f"SYNC {v}")
            send(s, {"type": "SYNC_ACK", "id": hdr.get("id", 0), "component": hdr.get("component"), "version": v,
                     "ok": True})
            version = max(version, v)
    done(0, s)


if __name__ == "__main__":
    main()
