#!/usr/bin/env python3
"""tcp_relay.py -- a TCP relay on loopback that a test can cut: the link
between the two brokers of a standby pair (tests/cli_standby.sh), and
nothing else, goes through it.

    tcp_relay.py LISTEN_PORT TARGET_PORT READY_FILE

Forwards every connection to 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT.
SIGUSR1 cuts the link: every relayed connection is closed and new ones
are refused (the listening socket is closed) until SIGUSR2 restores it.
Writes "listening" (and later "cut", "restored") lines to READY_FILE, so
the test waits for the event, never for a moment. SIGTERM ends it."""
import os
import selectors
import signal
import socket
import sys

listen_port, target_port, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
sel = selectors.DefaultSelector()
pairs = {}          # socket -> its other end
lsock = None
want = []           # signals seen, handled in the loop
r, w = os.pipe()
os.set_blocking(w, False)


def note(line):
    with open(ready, "a") as f:
        f.write(line + "\n")


def on_signal(signum, frame):
    want.append(signum)
    try:
        os.write(w, b"x")
    except OSError:
        pass


def listen():
    global lsock
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", listen_port))
    lsock.listen(16)
    lsock.setblocking(False)
    sel.register(lsock, selectors.EVENT_READ)


def close(s):
    o = pairs.pop(s, None)
    for x in (s, o):
        if x is None:
            continue
        pairs.pop(x, None)
        try:
            sel.unregister(x)
        except (KeyError, ValueError):
            pass
        x.close()


def cut():
    global lsock
    for s in list(pairs):
        close(s)
    if lsock is not None:
        sel.unregister(lsock)
        lsock.close()
        lsock = None


signal.signal(signal.SIGUSR1, on_signal)
signal.signal(signal.SIGUSR2, on_signal)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
sel.register(r, selectors.EVENT_READ)
listen()
note("listening")
while True:
    for key, _ in sel.select():
        s = key.fileobj
        if s == r:
            os.read(r, 64)
            while want:
                sig = want.pop(0)
                if sig == signal.SIGUSR1 and lsock is not None:
                    cut()
                    note("cut")
                elif sig == signal.SIGUSR2 and lsock is None:
                    listen()
                    note("restored")
        elif s is lsock:
            try:
                c, _ = lsock.accept()
            except OSError:
                continue
            t = socket.socket()
            try:
                t.connect(("127.0.0.1", target_port))
            except OSError:
                c.close()
                t.close()
                continue
            for x in (c, t):
                x.setblocking(False)
                sel.register(x, selectors.EVENT_READ)
            pairs[c], pairs[t] = t, c
        elif s in pairs:
            try:
                data = s.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                close(s)
                continue
            try:
                pairs[s].setblocking(True)
                pairs[s].sendall(data)
                pairs[s].setblocking(False)
            except OSError:
                close(s)
