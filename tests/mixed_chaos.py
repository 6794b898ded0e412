"""mixed_chaos.py -- mixed traffic with failures against a real cluster
(tests/cli_mixed_chaos.sh), checked by invariants, not timings.

    mixed_chaos.py --build B --dir D --seed S [--seconds T]

It starts one reel-broker and two CPU reel-workers (tiny model, --streams
2, --max-batch 4 --batching always; one --sync-mode steps, one drain),
and a quiet reference broker and worker (--streams 1, --max-batch 1).
Client threads send a seeded random mix of plain GENs, CFG GENs, groups,
SDE rollouts with log-probs and trajectories, GENs whose deadline
expires, CANCELs of requests in flight, resends under one client token
and STATUS calls; a trainer thread publishes v2, v3 and v4 by path
mid-traffic; one worker is killed (SIGKILL) and restarted mid-run. Then:
every request ended in exactly one RESULT or an ERROR of the code its
kind allows; a sample of the RESULTs is bitwise the same request run
alone on the reference worker at the version it reports; every reported
version was current while the request ran; no request started on a
worker after it acked a sync ran on an older version; the catalog
(reelctl why, versions, evictions, report) agrees with what the clients
saw; no daemon crashed. Before the traffic, on clusters of their own: a
broker stopped (SIGSTOP) for a moment while its worker's PROGRESS pile
up, and a client that reads nothing while its requests step, still get
every RESULT (--stall-only runs only these two). Prints one PASS or FAIL
line per check (lib_cli.sh's py_checks counts them). Every wait is
bounded.
"""

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
import reel  # noqa: E402

fails = 0
print_lock = threading.Lock()


def check(ok, what, detail=""):
    global fails
    with print_lock:
        print(("PASS " if ok else "FAIL ") + what + ("" if ok or not detail else f" ({detail})"), flush=True)
        fails += not ok


def note(text):
    with print_lock:
        print(text, flush=True)


class Cluster:
    """The daemons this driver started, by name: each a Popen with its log."""

    def __init__(self, build, d):
        self.build, self.d = build, d
        self.procs = {}
        self.exits = []  # (name, returncode, expected)

    def start(self, name, argv):
        log = open(os.path.join(self.d, name + ".log"), "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs[name] = p
        return p

    def log(self, name):
        try:
            with open(os.path.join(self.d, name + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_log(self, name, text, count, seconds, proc=None):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.log(name).count(text) >= count:
                return True
            if proc is not None and proc.poll() is not None:
                return self.log(name).count(text) >= count
            time.sleep(0.05)
        return False

    def broker(self, name, ce, we, catalog, heartbeat_ms=200):
        p = self.start(name, [f"{self.build}/reel-broker", "--clients", ce, "--workers", we, "--catalog", catalog,
                              "--heartbeat-ms", str(heartbeat_ms), "--queue-max", "256"])
        return self.wait_log(name, "reel-broker: ready", 1, 60, p)

    def worker(self, name, blog, we, weights, *extra):
        before = self.log(blog).count(f"worker {name} ready")
        p = self.start(name, [f"{self.build}/reel-worker", "--broker", we, "--name", name, "--weights", weights,
                              "--heartbeat-ms", "200", "--warmup", "1"] + list(extra))
        return self.wait_log(blog, f"worker {name} ready", before + 1, 60, p)

    def kill9(self, name):
        p = self.procs[name]
        p.kill()
        rc = p.wait(30)
        self.exits.append((name, rc, -9))
        return rc

    def stop_all(self):
        """SIGTERM to every daemon still running, workers first; each one's
        exit status kept (0 expected of a clean stop)."""
        order = sorted(self.procs, key=lambda n: "broker" in n)
        for n in order:
            p = self.procs[n]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait(30)
                self.exits.append((n, "hung", 0))
                continue
            self.exits.append((n, rc, 0))
        self.procs = {}


# ---- the requests ----------------------------------------------------------
SHAPES = [(4, 1, 4, 4), (4, 2, 8, 8), (4, 1, 8, 8)]
KINDS = ["plain", "plain", "cfg", "cfg", "group", "sde", "sde", "deadline", "deadline_group", "cancel", "cancel_queued",
         "cancel_group", "resend", "resend_other", "status"]
RAW = ("cancel", "cancel_queued", "cancel_group", "resend", "resend_other")
# What each kind may end in besides a RESULT: its documented ERROR codes.
ALLOWED = {"plain": set(), "cfg": set(), "group": set(), "sde": set(), "resend": set(),
           "resend_other": set(), "deadline": {"timeout"}, "deadline_group": {"timeout"}, "cancel": {"cancelled"},
           "cancel_queued": {"cancelled"}, "cancel_group": {"cancelled"}}


class Record:
    """One request as its client saw it."""

    def __init__(self, kind, spec, client_id, thread):
        self.kind, self.spec, self.id, self.thread = kind, spec, client_id, thread
        self.t0 = self.t1 = None
        self.finals = []  # ("RESULT", hdr, tensors) or ("ERROR", code, message)
        self.results = None  # GenResults (a list for a group)


def contexts(rng_seed):
    g = np.random.default_rng(rng_seed)
    ctx = [g.standard_normal((L, 32)).astype("<f4") for L in (3, 5, 5, 7)]
    unc = [g.standard_normal((L, 32)).astype("<f4") for L in (3, 5, 5, 7)]
    return ctx, unc


def draw_spec(rng, kind, ctx, unc):
    k = rng.randrange(len(ctx))
    spec = {"model": "tiny", "ctx": k, "latent_shape": rng.choice(SHAPES), "steps": rng.randint(3, 8),
            "shift": rng.choice([1.0, 2.0, 3.0]), "seed": rng.randrange(1, 1 << 31)}
    if kind == "cfg":
        spec.update(unc=k, cfg=rng.choice([2.0, 4.5]))
    elif kind == "group":
        spec.update(n=rng.randint(2, 4))
        if rng.random() < 0.5:
            spec.update(unc=k, cfg=3.0)
    elif kind == "sde":
        spec.update(sde=True, eta=rng.choice([0.5, 0.8]), return_log_probs=True, return_trajectory=True,
                    return_means=rng.random() < 0.3)
        if rng.random() < 0.3:
            spec.update(unc=k, cfg=2.5)
    elif kind == "deadline":
        # far more steps than its deadline allows on this machine
        spec.update(latent_shape=(4, 4, 16, 16), steps=5000, deadline_ms=rng.randint(1, 150))
    elif kind == "deadline_group":
        spec.update(latent_shape=(4, 4, 16, 16), steps=5000, deadline_ms=rng.randint(1, 150), n=rng.randint(2, 3))
    elif kind in ("cancel", "cancel_queued"):
        spec.update(latent_shape=(4, 4, 16, 16), steps=3000)
    elif kind == "cancel_group":
        spec.update(latent_shape=(4, 2, 8, 8), steps=3000, n=rng.randint(2, 4))
    elif kind in ("resend", "resend_other"):
        # long enough to be still running when the resend comes
        spec.update(latent_shape=(4, 2, 8, 8), steps=rng.randint(3000, 5000))
    return spec


def gen_kwargs(spec, ctx, unc):
    kw = {"steps": spec["steps"], "latent_shape": spec["latent_shape"], "shift": spec["shift"]}
    for f in ("sde", "eta", "return_log_probs", "return_trajectory", "return_means", "deadline_ms"):
        if f in spec:
            kw[f] = spec[f]
    if "unc" in spec:
        kw.update(uncond=unc[spec["unc"]], cfg=spec["cfg"])
    return kw


def raw_gen_header(rid, spec, ctx, unc, token):
    c = ctx[spec["ctx"]]
    if "n" in spec:
        hdr_n = {"n": spec["n"]}
    else:
        hdr_n = {}
    hdr = {"proto": "reel/1", "type": "GEN", "id": rid, "model": "tiny", "steps": spec["steps"],
           "latent_shape": list(spec["latent_shape"]), "shift": spec["shift"], "seed": spec["seed"],
           "progress": True, "deadline_ms": 60000, "client": token,
           "tensors": [{"name": "context", "dtype": "F32", "shape": list(c.shape), "bytes": c.nbytes}]}
    hdr.update(hdr_n)
    return hdr, [c.tobytes()]


def unpack(frames):
    hdr = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
    tensors = {}
    for i, t in enumerate(hdr.get("tensors") or []):
        tensors[t["name"]] = np.frombuffer(frames[1 + i], dtype="<f4").reshape(t["shape"])
    return hdr, tensors


class RawPeer:
    """A DEALER of a client thread's own, for what the client library does
    not let a test steer: CANCEL at a chosen step, a resend from another
    connection under the same token. Every message it reads is kept by id,
    so the end of the run can count each request's final answers."""

    def __init__(self, ep):
        self.ep = ep
        self.socks = []
        self.seen = {}  # id -> [(type, hdr, tensors)] of every socket

    def socket(self):
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDTIMEO, 5000)
        s.connect(self.ep)
        self.socks.append(s)
        return s

    def read(self, s, ms):
        if not s.poll(ms):
            return None
        hdr, tensors = unpack(s.recv_multipart())
        self.seen.setdefault(hdr.get("id", 0), []).append((hdr.get("type"), hdr, tensors, s))
        return hdr

    def until(self, s, rid, want, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            h = self.read(s, max(1, int((end - time.monotonic()) * 1000)))
            if h is not None and h.get("id") == rid and want(h):
                return h
        return None

    def drain(self):
        """Reads every socket until a STATUS sent on it now is answered: the
        broker answers a connection in order, so whatever it sent before
        is read."""
        for s in self.socks:
            sid = random.randrange(1 << 40, 1 << 41)
            s.send_multipart([msgpack.packb({"proto": "reel/1", "type": "STATUS", "id": sid})])
            self.until(s, sid, lambda h: h.get("type") == "STATUS_REPLY", 20)

    def close(self):
        for s in self.socks:
            s.close(0)


FINAL = ("RESULT", "ERROR", "BUSY")


class Run:
    def __init__(self, args):
        self.args = args
        self.records = []
        self.rec_lock = threading.Lock()
        self.syncs = {1: {"sent": 0.0, "done": 0.0, "applied": None}}  # version -> times (monotonic)
        self.stop = threading.Event()
        self.statuses = []
        self.errors = []  # unexpected exceptions in threads

    def add(self, r):
        with self.rec_lock:
            self.records.append(r)


def client_thread(run, i, ce, ctx, unc, deadline):
    rng = random.Random(run.args.seed * 1000 + i)
    kinds = run.args.kinds.split(",") if run.args.kinds else KINDS
    cl = reel.Client(ce, timeout=60)
    raw = RawPeer(ce)
    rs = raw.socket()
    token = format(rng.randrange(1, 1 << 63), "016x")
    rid_next = [rng.randrange(1 << 32, 1 << 33)]
    try:
        while time.monotonic() < deadline and not run.stop.is_set():
            kind = rng.choice(kinds)
            if kind == "status":
                t0 = time.monotonic()
                st = cl.status(timeout=20)
                run.statuses.append((t0, time.monotonic(), st))
                continue
            spec = draw_spec(rng, kind, ctx, unc)
            if kind in RAW:
                rid_next[0] += 1
                r = Record(kind, spec, rid_next[0], i)
                r.token = token
                r.raw = raw
                run.add(r)
                hdr, frames = raw_gen_header(r.id, spec, ctx, unc, token)
                r.t0 = time.monotonic()
                rs.send_multipart([msgpack.packb(hdr)] + frames)
                if kind == "cancel_queued":
                    # at once: queued, or just started
                    rs.send_multipart([msgpack.packb({"proto": "reel/1", "type": "CANCEL", "id": r.id,
                                                      "client": token})])
                    raw.until(rs, r.id, lambda h: h.get("type") in FINAL, 60)
                    r.t1 = time.monotonic()
                    continue
                # a first PROGRESS: the request runs (or it already ended)
                h = raw.until(rs, r.id, lambda h: h.get("type") in ("PROGRESS",) + FINAL, 60)
                if h is not None and h.get("type") == "PROGRESS":
                    if kind.startswith("cancel"):
                        rs.send_multipart([msgpack.packb({"proto": "reel/1", "type": "CANCEL", "id": r.id,
                                                          "client": token})])
                        raw.until(rs, r.id, lambda h: h.get("type") in FINAL, 60)
                    elif kind == "resend":
                        s2 = raw.socket()
                        r.resent_on = s2
                        s2.send_multipart([msgpack.packb(hdr)] + frames)
                        raw.until(s2, r.id, lambda h: h.get("type") in FINAL, 60)
                    else:
                        # the same id and token asking for another seed: refused on
                        # its own connection, the live request goes on
                        s2 = raw.socket()
                        other = dict(hdr, seed=hdr["seed"] + 1)
                        s2.send_multipart([msgpack.packb(other)] + frames)
                        e = raw.until(s2, r.id, lambda h: h.get("type") in FINAL, 30)
                        r.other_answer = e
                        raw.until(rs, r.id, lambda h: h.get("type") in FINAL, 60)
                r.t1 = time.monotonic()
                continue
            kw = gen_kwargs(spec, ctx, unc)
            r = Record(kind, spec, None, i)
            run.add(r)
            r.t0 = time.monotonic()
            try:
                if "n" in spec:
                    res = cl.gen_group("tiny", ctx[spec["ctx"]], n=spec["n"], seed=spec["seed"], **kw)
                    r.results = res
                    r.id = res[0].header.get("id")
                    r.finals.append(("RESULT", res[0].header, None))
                else:
                    res = cl.gen("tiny", ctx[spec["ctx"]], seed=spec["seed"], **kw)
                    r.results = [res]
                    r.id = res.header.get("id")
                    r.finals.append(("RESULT", res.header, None))
            except reel.ReelError as e:
                r.id = e.request_id
                r.finals.append(("ERROR", e.code, str(e)))
            r.t1 = time.monotonic()
    except Exception as e:  # noqa: BLE001 -- reported as a failed check
        run.errors.append(f"client {i}: {type(e).__name__}: {e}")
    finally:
        raw.drain()
        with run.rec_lock:
            for r in run.records:
                if getattr(r, "raw", None) is raw:
                    for typ, h, t, s in raw.seen.get(r.id, []):
                        if r.kind == "resend_other" and s is not raw.socks[0]:
                            continue  # the refused resend's own answer: checked apart
                        if typ in FINAL:
                            if typ == "RESULT":
                                r.finals.append(("RESULT", h, t))
                            elif typ == "ERROR":
                                r.finals.append(("ERROR", h.get("code"), h.get("message")))
                            else:
                                r.finals.append(("BUSY", "busy", h.get("message")))
                            if r.kind == "resend" and s is not getattr(r, "resent_on", None):
                                r.final_on_first = True
        raw.close()
        cl.close()


def trainer_thread(run, ce, d, t_start, seconds):
    cl = reel.Client(ce, timeout=90)
    try:
        for v, frac in ((2, 0.2), (3, 0.5), (4, 0.75)):
            at = t_start + seconds * frac
            while time.monotonic() < at and not run.stop.is_set():
                time.sleep(0.05)
            run.syncs[v] = {"sent": time.monotonic(), "done": None, "applied": None}
            res = cl.sync(v, path=os.path.join(d, f"w{v}.safetensors"), deadline_ms=40000, timeout=80)
            run.syncs[v].update(done=time.monotonic(), applied=list(res.applied), failed=res.failed,
                                complete=res.complete, current=res.current)
            note(f"  sync v{v}: {res}")
    except Exception as e:  # noqa: BLE001
        run.errors.append(f"trainer: {type(e).__name__}: {e}")
    finally:
        cl.close()


def killer_thread(run, cluster, name, weights, we, at, extra, in_barrier):
    while time.monotonic() < at and not run.stop.is_set():
        time.sleep(0.05)
    if in_barrier:
        # just after the trainer's SYNC of v3 went: the kill falls in its barrier
        while 3 not in run.syncs and not run.stop.is_set():
            time.sleep(0.005)
    if run.stop.is_set():
        return
    t_kill = time.monotonic()  # (before the signal: kill9 waits for the exit)
    rc = cluster.kill9(name)
    note(f"  killed {name} (exit {rc}) at {t_kill - run.t_start:.1f} s")
    run.killed = (name, t_kill)
    run.killed_wall = time.time()
    ok = cluster.worker(name, "broker", we, weights, *extra)
    run.restarted = time.monotonic()
    check(ok, f"{name} restarted after its SIGKILL registers again")


def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def cpu_ticks(pid):
    """utime + stime of process pid, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def worker_inflight(port):
    """reel_worker_inflight from the worker's /metrics, or None."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as f:
            for line in f.read().decode().splitlines():
                if line.startswith("reel_worker_inflight"):
                    return float(line.split()[-1])
    except OSError:
        return None
    return None


def stall_check(build, d):
    """A broker stalled (SIGSTOP) for less than its worker's liveness while
    the worker finishes a request that asked for PROGRESS: the worker's
    queue to the broker fills with PROGRESS, and the RESULT behind them
    must still reach the client once the broker goes on -- not be lost, the
    client waiting out its deadline for a request that ran -- and so must
    they reach a client with ZeroMQ's default receive queue, which that
    burst of PROGRESS, forwarded, can fill in turn."""
    cluster = Cluster(build, d)
    ce, we = f"ipc://{d}/stall-clients", f"ipc://{d}/stall-workers"
    port = free_port()
    try:
        # the broker's default heartbeat (1 s; ZeroMQ's own heartbeats on
        # the connection then time out after 3 s, longer than the stall,
        # and never reset it)
        ok = cluster.broker("stall-broker", ce, we, f"{d}/stall.db", 1000) and cluster.worker(
            "stall", "stall-broker", we, f"{d}/w1.safetensors", "--streams", "1", "--heartbeat-ms", "1000",
            "--liveness", "60", "--metrics", f"127.0.0.1:{port}")
        check(ok, "stall check: a broker and a worker start")
        if not ok:
            return
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        # ZeroMQ's default receive queue: the burst of PROGRESS after the
        # stall may fill it, and the RESULTs behind must still come (the
        # broker holds what a full client queue cannot take and drops only
        # PROGRESS: slow_reader_check makes that sure)
        s.connect(ce)
        c = np.random.default_rng(1).standard_normal((3, 32)).astype("<f4")
        # many short steps, each a PROGRESS: far more than the connection's queue holds
        h = {"proto": "reel/1", "type": "GEN", "id": 1, "model": "tiny", "steps": 8000, "latent_shape": [4, 1, 4, 4],
             "seed": 1, "progress": True, "deadline_ms": 20000,
             "tensors": [{"name": "context", "dtype": "F32", "shape": [3, 32], "bytes": c.nbytes}]}
        s.send_multipart([msgpack.packb(h), c.tobytes()])
        # and one without PROGRESS behind it on the worker's one stream: it
        # runs while the first one's RESULT is forwarded, so the worker is
        # done (inflight 0, below) only well after that RESULT met the full
        # connection
        s.send_multipart([msgpack.packb(dict(h, id=2, progress=False, steps=3000)), c.tobytes()])
        first = None
        if s.poll(30000):
            first = msgpack.unpackb(s.recv_multipart()[0], raw=False)
        check(first is not None and first.get("type") == "PROGRESS", "stall check: the request runs", repr(first))
        broker = cluster.procs["stall-broker"]
        broker.send_signal(signal.SIGSTOP)
        try:
            # until the worker ran it to the end (its RESULT queued behind the PROGRESS)
            end = time.monotonic() + 60
            while time.monotonic() < end and worker_inflight(port) != 0:
                time.sleep(0.05)
            done = worker_inflight(port) == 0
            # ... and its main thread forwarded all the streams sent (a
            # backlog of PROGRESS in its pipe goes out behind the stall):
            # until the worker's CPU time stops growing
            last, end = None, time.monotonic() + 60
            while time.monotonic() < end:
                cpu = cpu_ticks(cluster.procs["stall"].pid)
                if cpu == last:
                    break
                last = cpu
                time.sleep(0.2)
        finally:
            broker.send_signal(signal.SIGCONT)
        check(done, "stall check: the worker finished the request while the broker was stopped")
        finals = {}
        nprog = 0
        end = time.monotonic() + 40
        while len(finals) < 2 and time.monotonic() < end and s.poll(int((end - time.monotonic()) * 1000)):
            m = msgpack.unpackb(s.recv_multipart()[0], raw=False)
            if m.get("type") == "PROGRESS":
                nprog += 1
            if m.get("type") != "PROGRESS":
                finals[m.get("id")] = {k: m.get(k) for k in ("type", "code", "message")}
        check(all(finals.get(i, {}).get("type") == "RESULT" for i in (1, 2)),
              "a broker stalled shorter than its worker's liveness still gets the RESULTs queued behind a flood "
              "of PROGRESS", repr(finals))
        note(f"  ({nprog} PROGRESS came after the stall)")
        s.close(0)
    finally:
        cluster.stop_all()
        for name, rc, want in cluster.exits:
            check(rc == want, f"stall check: {name} exits {want}", f"exit {rc}")


def status_of(sock, sid):
    """A STATUS sent on sock (a DEALER of its own), its reply's header or None."""
    sock.send_multipart([msgpack.packb({"proto": "reel/1", "type": "STATUS", "id": sid})])
    end = time.monotonic() + 10
    while time.monotonic() < end and sock.poll(int((end - time.monotonic()) * 1000)):
        m = msgpack.unpackb(sock.recv_multipart()[0], raw=False)
        if m.get("type") == "STATUS_REPLY" and m.get("id") == sid:
            return m
    return None


def slow_reader_check(build, d):
    """A client that reads nothing while its request steps (busy elsewhere)
    with ZeroMQ's default receive queue: the broker forwards the request's
    PROGRESS until the client's queue is full, drops those it cannot take,
    and must hold the RESULT that finds the queue full and send it once the
    client reads -- not drop it, the client waiting out its timeout for a
    request that ran (its liveness STATUS meets the same broker: no
    resend)."""
    cluster = Cluster(build, d)
    ce, we = f"ipc://{d}/slow-clients", f"ipc://{d}/slow-workers"
    try:
        ok = cluster.broker("slow-broker", ce, we, f"{d}/slow.db") and cluster.worker(
            "slow", "slow-broker", we, f"{d}/w1.safetensors", "--streams", "1")
        check(ok, "slow reader check: a broker and a worker start")
        if not ok:
            return
        ctx = zmq.Context.instance()
        s, st = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
        for so in (s, st):
            so.setsockopt(zmq.LINGER, 0)
            so.connect(ce)
        undelivered0 = (status_of(st, 99) or {}).get("undelivered", 0)
        c = np.random.default_rng(1).standard_normal((3, 32)).astype("<f4")
        # two requests of a PROGRESS per step: far more than the client's
        # queue holds (ZeroMQ's default 1,000 at each end, and the socket's
        # buffers)
        h = {"proto": "reel/1", "type": "GEN", "id": 1, "model": "tiny", "steps": 10000, "latent_shape": [4, 1, 4, 4],
             "seed": 1, "progress": True, "deadline_ms": 60000,
             "tensors": [{"name": "context", "dtype": "F32", "shape": [3, 32], "bytes": c.nbytes}]}
        s.send_multipart([msgpack.packb(h), c.tobytes()])
        s.send_multipart([msgpack.packb(dict(h, id=2, seed=2)), c.tobytes()])
        # s reads nothing until the broker has forwarded both answers
        st_reply, end, sid = None, time.monotonic() + 120, 100
        while time.monotonic() < end:
            sid += 1
            st_reply = status_of(st, sid)
            if st_reply and st_reply.get("requests_ok", 0) + st_reply.get("requests_failed", 0) >= 2:
                break
            time.sleep(0.05)
        check(st_reply is not None and st_reply.get("requests_ok") == 2, "slow reader check: the requests ran",
              repr(st_reply and {k: st_reply.get(k) for k in ("requests_ok", "requests_failed")}))
        check(st_reply is not None and st_reply.get("progress_dropped", 0) > 0,
              "slow reader check: the client's queue filled (the broker dropped PROGRESS it could not take, "
              "counted in progress_dropped)", repr(st_reply and st_reply.get("progress_dropped")))
        check(st_reply is not None and st_reply.get("undelivered", 0) == undelivered0,
              "slow reader check: nothing but PROGRESS went undelivered",
              repr(st_reply and (undelivered0, st_reply.get("undelivered"))))
        finals, nprog, t_read = {}, 0, time.monotonic()
        while len(finals) < 2 and s.poll(10000):
            m = msgpack.unpackb(s.recv_multipart()[0], raw=False)
            if m.get("type") == "PROGRESS":
                nprog += 1
            else:
                finals[m.get("id")] = {k: m.get(k) for k in ("type", "code", "message")}
        check(all(finals.get(i, {}).get("type") == "RESULT" for i in (1, 2)),
              "a client that read nothing while its requests ran gets their RESULTs behind the PROGRESS that filled "
              "its queue", repr(finals))
        note(f"  ({nprog} PROGRESS came, {st_reply and st_reply.get('progress_dropped')} dropped; the RESULTs "
             f"{(time.monotonic() - t_read) * 1000:.0f} ms after the client began to read)")
        s.close(0)
        st.close(0)
    finally:
        cluster.stop_all()
        for name, rc, want in cluster.exits:
            check(rc == want, f"slow reader check: {name} exits {want}", f"exit {rc}")


def bitwise(a, b):
    return a is not None and b is not None and a.shape == b.shape and a.tobytes() == b.tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--sample", type=int, default=24)
    ap.add_argument("--kinds", default="", help="only these kinds (comma-separated): to narrow a failure down")
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--stall-only", action="store_true", help="only the checks of a broker stalled (SIGSTOP) and of a client that reads late")
    ap.add_argument("--no-syncs", action="store_true")
    args = ap.parse_args()
    d, build = args.dir, args.build
    note(f"  seed {args.seed}")
    rng = random.Random(args.seed)
    for v, s in ((1, 7), (2, 8), (3, 9), (4, 10)):
        subprocess.run([f"{build}/reelctl", "weights", "init", "--config", "tiny", "--seed", str(s), "--out",
                        f"{d}/w{v}.safetensors"], check=True, stderr=subprocess.DEVNULL)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stall_check(build, d)
    slow_reader_check(build, d)
    if args.stall_only:
        sys.exit(1 if fails else 0)
    cluster = Cluster(build, d)
    run = Run(args)
    run.killed = run.restarted = None
    try:
        ce, we, db = f"ipc://{d}/clients", f"ipc://{d}/workers", f"{d}/reel.db"
        if not cluster.broker("broker", ce, we, db):
            check(False, "the broker starts")
            return
        wflags = {"wa": ["--streams", "2", "--max-batch", "4", "--batching", "always", "--sync-mode", "steps"],
                  "wb": ["--streams", "2", "--max-batch", "4", "--batching", "always", "--sync-mode", "drain"]}
        for n, f in wflags.items():
            check(cluster.worker(n, "broker", we, f"{d}/w1.safetensors", *f), f"worker {n} ({' '.join(f)}) starts")
        rce, rwe = f"ipc://{d}/ref-clients", f"ipc://{d}/ref-workers"
        refok = cluster.broker("ref-broker", rce, rwe, f"{d}/ref.db") and \
            cluster.worker("ref", "ref-broker", rwe, f"{d}/w1.safetensors", "--streams", "1", "--max-batch", "1")
        check(refok, "the reference broker and worker start")

        ctx, unc = contexts(args.seed)
        run.t_start = t_start = time.monotonic()
        deadline = t_start + args.seconds
        victim = rng.choice(list(wflags))
        kill_at = t_start + args.seconds * rng.uniform(0.3, 0.6)
        in_barrier = rng.random() < 0.5
        note(f"  {args.threads} client threads for {args.seconds:.0f} s; {victim} killed "
             + ("in the barrier of the sync of v3" if in_barrier else f"at {kill_at - t_start:.1f} s")
             + "; syncs at 20%, 50%, 75%")
        if in_barrier:
            kill_at = t_start
        th = [threading.Thread(target=client_thread, args=(run, i, ce, ctx, unc, deadline))
              for i in range(args.threads)]
        if not args.no_syncs:
            th.append(threading.Thread(target=trainer_thread, args=(run, ce, d, t_start, args.seconds)))
        if not args.no_kill:
            th.append(threading.Thread(target=killer_thread,
                                   args=(run, cluster, victim, f"{d}/w1.safetensors", we, kill_at, wflags[victim],
                                         in_barrier)))
        for t in th:
            t.start()
        for t in th:
            t.join(args.seconds + 150)
            if t.is_alive():
                check(False, "a traffic thread ends within its bound")
                run.stop.set()
        check(not run.errors, "no client, trainer or killer thread raised", "; ".join(run.errors[:4]))
        recs = [r for r in run.records if r.t1 is not None]
        by_kind = {}
        for r in recs:
            by_kind[r.kind] = by_kind.get(r.kind, 0) + 1
        note(f"  {len(recs)} requests: {json.dumps(by_kind, sort_keys=True)}; {len(run.statuses)} STATUS calls")
        check_answers(recs)
        check_versions(run, recs)
        check_statuses(run)
        check_catalog(run, recs, db, build)
        check_reference(run, recs, rce, ctx, unc, d, args.sample, rng)
    finally:
        run.stop.set()
        cluster.stop_all()
        for name, rc, want in cluster.exits:
            check(rc == want, f"{name} exits {want}", f"exit {rc}; log tail: "
                  + " | ".join(cluster.log(name).strip().splitlines()[-3:]))
    sys.exit(1 if fails else 0)


def check_answers(recs):
    bad = []
    outcomes = {}
    for r in recs:
        n = len(r.finals)
        if n != 1:
            bad.append(f"{r.kind} #{r.id}: {n} final answers {[f[:2] if f[0] != 'RESULT' else 'RESULT' for f in r.finals]}")
            continue
        f = r.finals[0]
        outcomes[(r.kind, f[0] if f[0] == "RESULT" else f[1])] = outcomes.get(
            (r.kind, f[0] if f[0] == "RESULT" else f[1]), 0) + 1
        if f[0] == "RESULT":
            if r.kind.startswith("deadline"):
                bad.append(f"deadline #{r.id}: a RESULT after a deadline of {r.spec['deadline_ms']} ms for 5000 steps")
            continue
        if f[1] not in ALLOWED[r.kind]:
            bad.append(f"{r.kind} #{r.id}: ERROR {f[1]}: {f[2]}")
        if r.kind == "resend" and getattr(r, "final_on_first", False):
            bad.append(f"resend #{r.id}: the final answer went to the first connection, not the resend's")
    note("  outcomes: " + ", ".join(f"{k}/{o} {c}" for (k, o), c in sorted(outcomes.items())))
    check(not bad, f"each of {len(recs)} requests ended in exactly one RESULT or an ERROR its kind allows",
          "; ".join(bad[:6]) + (f"; and {len(bad) - 6} more" if len(bad) > 6 else ""))
    for k in ("plain", "cfg", "group", "sde", "resend", "resend_other"):
        n = sum(1 for r in recs if r.kind == k)
        okn = sum(1 for r in recs if r.kind == k and len(r.finals) == 1 and r.finals[0][0] == "RESULT")
        if n:
            check(okn == n, f"every {k} request got its RESULT ({okn} of {n})")
    res_ok = sum(1 for r in recs if r.kind == "resend" and getattr(r, "resent_on", None) is not None)
    note(f"  {res_ok} resends sent while their request ran")
    others = [r for r in recs if r.kind == "resend_other" and hasattr(r, "other_answer")]
    badr = [f"#{r.id}: {r.other_answer}" for r in others
            if not (r.other_answer and r.other_answer.get("type") == "ERROR"
                    and r.other_answer.get("code") == "bad_request" and "seed" in r.other_answer.get("message", ""))]
    check(not badr, f"{len(others)} resends asking for another seed under a live request's token and id were "
          "refused bad_request naming the seed", "; ".join(badr[:4]))


def result_versions(r):
    """(first_version, version, worker) of each RESULT of r (a group: each sample)."""
    out = []
    f = r.finals[0]
    if r.results:
        for g in r.results:
            out.append((g.first_version, g.version, g.worker, g.versions))
    else:
        h = f[1]
        v = h.get("version", 0)
        out.append((h.get("first_version", v), v, h.get("worker", ""), None))
    return out


def version_bounds(syncs, r):
    """The versions current at some moment while r ran: from the newest
    whose SYNC_DONE came before its GEN to the newest whose SYNC went
    before its answer came."""
    lo = max(v for v, s in syncs.items() if s["done"] is not None and s["done"] <= r.t0 and (v == 1 or s["applied"]))
    hi = max(v for v, s in syncs.items() if s["sent"] <= r.t1)
    return lo, hi


def check_versions(run, recs):
    syncs = run.syncs
    bad = []
    mixed = 0
    for r in recs:
        if len(r.finals) != 1 or r.finals[0][0] != "RESULT":
            continue
        lo, hi = version_bounds(syncs, r)
        for fv, v, w, vs in result_versions(r):
            if not (lo <= fv <= v <= hi):
                bad.append(f"{r.kind} #{r.id} on {w}: versions {fv}..{v}, while {lo}..{hi} were current")
            if fv != v:
                mixed += 1
                if w == "wb":
                    bad.append(f"{r.kind} #{r.id} on the drain worker wb mixed versions {fv}..{v}")
    check(not bad, "every RESULT's versions were current while it ran, and the drain worker never mixed them",
          "; ".join(bad[:6]))
    note(f"  {mixed} results ran across a sync (steps mode)")
    for v in (2, 3, 4):
        s = syncs.get(v)
        check(s is not None and s.get("done") is not None and s.get("applied"),
              f"sync v{v} was applied", repr(s))


def check_statuses(run):
    bad = []
    for t0, t1, st in run.statuses:
        cur = (st.get("versions") or {}).get("transformer", 1)
        lo = max(v for v, s in run.syncs.items() if s["done"] is not None and s["done"] <= t0 and
                 (v == 1 or s["applied"]))
        hi = max(v for v, s in run.syncs.items() if s["sent"] <= t1)
        if not lo <= cur <= hi:
            bad.append(f"STATUS current v{cur} while {lo}..{hi}")
        if st.get("queue", 0) > st.get("queue_max", 0):
            bad.append(f"STATUS queue {st.get('queue')} > queue_max {st.get('queue_max')}")
        for w in st.get("workers", []):
            if w.get("inflight", 0) > w.get("max_inflight", 0):
                bad.append(f"{w.get('name')} inflight {w.get('inflight')} > {w.get('max_inflight')}")
    check(not bad, f"{len(run.statuses)} STATUS replies: current version, queue and in-flight counts in range",
          "; ".join(bad[:6]))


def sql(db, q, args=()):
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return c.execute(q, args).fetchall()
    finally:
        c.close()


def reelctl(build, *argv):
    p = subprocess.run([f"{build}/reelctl"] + list(argv), capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def check_catalog(run, recs, db, build):
    finals = [r for r in recs if len(r.finals) == 1 and r.id]
    want = {}
    for r in finals:
        f = r.finals[0]
        status = "ok" if f[0] == "RESULT" else f[1]
        worker = f[1].get("worker") if f[0] == "RESULT" else None
        version = f[1].get("version") if f[0] == "RESULT" else None
        if "n" in r.spec and r.results:
            version = max(g.version for g in r.results)
        want.setdefault(r.id, []).append((r, status, worker, version))
    # the writer thread stores rows after the replies: wait for the rows
    end = time.monotonic() + 30
    rows = []
    while time.monotonic() < end:
        rows = sql(db, "SELECT id, worker, status, version, error, broker_id, started, t FROM requests")
        have = {row[0] for row in rows}
        if all(i in have for i in want):
            break
        time.sleep(0.1)
    byid = {}
    for row in rows:
        byid.setdefault(row[0], []).append(row)
    bad = []
    for i, lst in want.items():
        got = byid.get(i, [])
        if len(got) != len(lst):
            bad.append(f"#{i} ({lst[0][0].kind}, {lst[0][1]}): {len(got)} rows")
            continue
        for (r, status, worker, version), row in zip(lst, got):
            if row[2] != status or (worker and row[1] != worker) or (version is not None and row[3] != version):
                bad.append(f"#{i} {r.kind}: client saw {status} on {worker} v{version}, catalog {row[2]} on "
                           f"{row[1]} v{row[3]}")
    check(not bad, f"the catalog has a row for each of {len(want)} requests, with the outcome, worker and "
          "version its client saw", "; ".join(bad[:6]) + (f"; and {len(bad) - 6} more" if len(bad) > 6 else ""))
    # why, for one request of each outcome
    seen = set()
    bad = []
    for i, lst in want.items():
        r, status, worker, version = lst[0]
        if status in seen or len(lst) != 1:
            continue
        seen.add(status)
        rc, out, err = reelctl(build, "why", str(i), "--catalog", db, "--json")
        try:
            j = json.loads(out)
        except ValueError:
            bad.append(f"why {i}: exit {rc}, not JSON: {err.strip()[:200]}")
            continue
        js = json.dumps(j)
        if status not in js:
            bad.append(f"why {i} ({status}) does not say {status}: {js[:300]}")
    check(not bad, f"reelctl why agrees for one request of each outcome ({', '.join(sorted(seen))})",
          "; ".join(bad[:4]))
    # versions: v2..v4 each recorded, v4 current, the others superseded
    rc, out, err = reelctl(build, "versions", "--catalog", db, "--json")
    try:
        vj = json.loads(out)
    except ValueError:
        vj = None
    states = {}
    if vj is not None:
        for item in (vj if isinstance(vj, list) else vj.get("versions", [])):
            states[item.get("version")] = item.get("state")
    check(states.get(4) == "current" and states.get(2) == "superseded" and states.get(3) == "superseded",
          "reelctl versions: v4 current, v2 and v3 superseded", f"exit {rc}: {out[:300]} {err[:200]}")
    # the evictions of each sync: every worker that applied it and had
    # graphs at the broker (a capture before the sync's end) recorded its
    # weight_sync evictions, from the version before to it
    bad = []
    end = time.monotonic() + 15
    while True:
        ev = sql(db, "SELECT worker, from_version, to_version, count(*) FROM evictions WHERE reason = 'weight_sync' "
                     "GROUP BY worker, from_version, to_version")
        evs = {(w, f, t): c for w, f, t, c in ev}
        bad = []
        for v in (2, 3, 4):
            s = run.syncs.get(v) or {}
            for w in s.get("applied") or []:
                # a process restarted since the sync before held no graphs
                # to evict: its predecessor's are recorded worker_restarted;
                # and one SIGKILLed just after it acked may not have sent
                # the EVENTS of its evictions yet (they go after the ack,
                # from its main loop): those graphs are recorded
                # worker_restarted too (checked below)
                if run.killed and run.killed[0] == w and run.killed[1] > (run.syncs[v - 1]["done"] or 0) - 1:
                    if run.killed[1] < s["done"] + 2.0:
                        continue
                if not any(k[0] == w and k[2] == v for k in evs):
                    bad.append(f"{w} applied v{v} but no weight_sync eviction to v{v} is recorded")
        if not bad or time.monotonic() > end:
            break
        time.sleep(0.2)
    check(not bad, "each worker that applied a sync has its weight_sync evictions recorded",
          "; ".join(bad[:6]) + f" (recorded: {sorted(evs.items())})")
    if run.killed:
        name = run.killed[0]
        n = sql(db, "SELECT count(*) FROM evictions WHERE reason = 'worker_restarted' AND worker = ?", (name,))[0][0]
        # none is due when the catalog had no graph of it held at the kill:
        # no capture since its last eviction (a sync that had just evicted
        # every graph, before a new capture's EVENTS came)
        kt = getattr(run, "killed_wall", time.time())
        held = sql(db, "SELECT count(*) FROM captures WHERE worker = ?1 AND t <= ?2 AND t > "
                       "(SELECT coalesce(max(t), 0) FROM evictions WHERE worker = ?1 AND t <= ?2 "
                       "AND reason <> 'worker_restarted')", (name, kt))[0][0]
        check(n > 0 or held == 0,
              f"the catalog records the graphs of the killed {name} evicted (worker_restarted: {n}; "
              f"captures after its last eviction before the kill: {held})")
    # each applied sync is in worker_versions for each worker that applied it
    wv = {(w, v) for w, v in sql(db, "SELECT worker, version FROM worker_versions WHERE component = 'transformer' "
                                     "AND ok = 1")}
    miss = [f"{w} v{v}" for v in (2, 3, 4) for w in (run.syncs.get(v) or {}).get("applied") or [] if (w, v) not in wv]
    check(not miss, "the catalog's worker_versions has each worker's ack of each sync", ", ".join(miss))
    # a request that ended without a RESULT records the version it needed:
    # the current one when the broker took it
    bad = []
    for i, lst in want.items():
        for (r, status, worker, version), row in zip(lst, byid.get(i, [])):
            if status == "ok":
                continue
            lo, hi = version_bounds(run.syncs, r)
            # 0: no sync was current yet when the broker took it
            if not (lo <= row[3] <= hi or (row[3] == 0 and lo == 1)):
                bad.append(f"#{i} {r.kind} {status}: catalog version {row[3]}, while {lo}..{hi} were current")
    check(not bad, "each request without a RESULT has in the catalog a version current while it waited",
          "; ".join(bad[:6]) + (f"; and {len(bad) - 6} more" if len(bad) > 6 else ""))
    rc, out, err = reelctl(build, "report", "--json", "--catalog", db)
    check(rc == 0 and out.strip().startswith("{"), "reelctl report --json reads the catalog", err[:200])
    rc, out, err = reelctl(build, "keys", "--catalog", db)
    check(rc == 0, "reelctl keys reads the catalog", err[:200])
    # no request started on a worker after it acked a version ran on an older one
    acks = sql(db, "SELECT worker, version, t FROM worker_versions WHERE component = 'transformer' AND ok = 1")
    bad = []
    for row in rows:
        i, worker, status, version, error, bid, started, t = row
        if status != "ok" or started is None:
            continue
        for w, v, ta in acks:
            if w == worker and started > ta and version < v and v > 1:
                bad.append(f"#{i} started on {worker} {started - ta:.3f} s after its ack of v{v} but ran on v{version}")
    check(not bad, "no request started on a worker after its ack of a sync ran on an older version",
          "; ".join(bad[:6]))


def check_reference(run, recs, rce, ctx, unc, d, sample, rng):
    ok = [r for r in recs if len(r.finals) == 1 and r.finals[0][0] == "RESULT"
          and r.kind in ("plain", "cfg", "group", "sde", "resend", "resend_other")]
    one = []
    for r in ok:
        vs = result_versions(r)
        if all(fv == v for fv, v, _, _ in vs) and len({v for _, v, _, _ in vs}) == 1:
            one.append((vs[0][1], r))
    pick = rng.sample(one, min(sample, len(one)))
    # every kind in the sample where one is there
    for k in ("group", "sde", "cfg", "resend", "plain"):
        if not any(r.kind == k for _, r in pick):
            c = [x for x in one if x[1].kind == k]
            if c:
                pick.append(rng.choice(c))
    pick.sort(key=lambda x: x[0])
    cl = reel.Client(rce, timeout=60)
    bad = []
    at = 1
    compared = 0
    try:
        for v, r in pick:
            if v != at:
                res = cl.sync(v, path=os.path.join(d, f"w{v}.safetensors"), timeout=60)
                if not res.applied:
                    bad.append(f"the reference worker did not apply v{v}: {res}")
                    break
                at = v
            spec = r.spec
            kw = gen_kwargs(spec, ctx, unc)
            kw.pop("deadline_ms", None)
            if r.kind == "group":
                ref = cl.gen_group("tiny", ctx[spec["ctx"]], n=spec["n"], seed=spec["seed"], version=v, **kw)
                got = r.results
            elif r.kind in ("resend", "resend_other"):
                ref = [cl.gen("tiny", ctx[spec["ctx"]], seed=spec["seed"], version=v, **kw)]
                h, t = r.finals[0][1], r.finals[0][2]
                got = [type("G", (), {"latent": t.get("latent")})()]
            else:
                ref = [cl.gen("tiny", ctx[spec["ctx"]], seed=spec["seed"], version=v, **kw)]
                got = r.results
            for j, (a, b) in enumerate(zip(got, ref)):
                for f in ("latent", "trajectory", "log_probs", "means", "sigmas"):
                    x, y = getattr(a, f, None), getattr(b, f, None)
                    if x is None and y is None:
                        continue
                    if f != "latent" and r.kind.startswith("resend"):
                        continue
                    if not bitwise(x, y):
                        bad.append(f"{r.kind} #{r.id} (v{v}, sample {j}, {r.results[0].worker if r.results else '?'}):"
                                   f" {f} differs from the reference")
            compared += 1
    finally:
        cl.close()
    check(not bad and compared >= min(10, len(one)),
          f"{compared} sampled RESULTs (of {len(one)} on one version) are bitwise the request run alone on the "
          "reference worker", "; ".join(bad[:6]))


if __name__ == "__main__":
    main()
