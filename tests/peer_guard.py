"""peer_guard.py -- bounds a raw test peer (security_peer.py, flood_peer.py)
in time, whatever it is stuck in.

A peer that hangs must not hang its suite: one CI run waited 15 minutes on
a security_peer.py that had been asked to listen for 1 s. guard(seconds)
arms two watchdogs for the whole process:
- faulthandler, after seconds + 20: every thread's Python stack to stderr,
  so the log says where it was, then exit 1;
- SIGALRM with its default action, after seconds + 30: the kernel ends the
  process even inside a C call or the interpreter's own teardown.
done(code) ends the peer without the interpreter's teardown (where a
ZeroMQ context may wait on its sockets), once its output is flushed.
"""

import faulthandler
import math
import os
import signal
import sys


def guard(seconds):
    faulthandler.dump_traceback_later(seconds + 20, exit=True)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(int(math.ceil(seconds)) + 30)


def done(code, sock=None):
    if sock is not None:
        sock.close(linger=0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
