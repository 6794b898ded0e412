"""Tests of the reel Python client against a real local cluster: a
reel-broker and a reel-worker started on ipc sockets in a temporary folder,
every result compared bitwise with `reelctl run` on the same inputs.

Usage: /usr/bin/python3 clients/python/tests/test_client.py --build BUILD
Prints one line per test and ends with "python: N passed, N failed".
"""

import argparse
import errno
import glob
import json
import multiprocessing
import os
import pickle
import shutil
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock
import urllib.request
import warnings

import msgpack
import numpy as np
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import reel  # noqa: E402
from reel import safetensors  # noqa: E402

BUILD = "build"


def run(*args, check=True):
    p = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} exited {p.returncode}: {p.stdout.decode()[-400:]}")
    return p


class Cluster:
    """A broker and one worker on ipc sockets; killed and removed on stop."""

    def __init__(self, d, weights, broker_flags=(), worker_flags=(), keys=None):
        """keys: a folder made by make_keys: CURVE on both sockets, the
        worker with its key, the readiness check with the client key."""
        self.dir = d
        self.keys = keys
        self.ce = f"ipc://{d}/clients"
        we = f"ipc://{d}/workers"
        if keys:
            broker_flags = ("--keys", keys, *broker_flags)
            worker_flags = ("--key", os.path.join(keys, "worker.key"), "--broker-key",
                            os.path.join(keys, "broker.pub"), *worker_flags)
        self.blog = open(os.path.join(d, "broker.log"), "wb")
        self.wlog = open(os.path.join(d, "worker.log"), "wb")
        self._broker_argv = [f"{BUILD}/reel-broker", "--clients", self.ce, "--workers", we,
                             "--catalog", os.path.join(d, "reel.db"), "--heartbeat-ms", "200", *broker_flags]
        self.broker = subprocess.Popen(self._broker_argv, stdout=self.blog, stderr=subprocess.STDOUT)
        self.worker = subprocess.Popen([f"{BUILD}/reel-worker", "--broker", we, "--name", "py0", "--weights",
                                        weights, "--streams", "2", "--heartbeat-ms", "200", "--warmup", "1",
                                        *worker_flags], stdout=self.wlog, stderr=subprocess.STDOUT)
        self._wait_ready()

    def restart_broker(self, graceful=False):
        """SIGKILL (graceful: SIGTERM) the broker and start it again on the
        same endpoints and catalog (a new boot id); returns at once, before
        workers rejoin."""
        if graceful:
            self.broker.terminate()
        else:
            self.broker.kill()
        self.broker.wait(30)
        self.broker = subprocess.Popen(self._broker_argv, stdout=self.blog, stderr=subprocess.STDOUT)

    def client(self, role="client", **kw):
        """A Client with the key of role (with keys), else a plain one."""
        if self.keys:
            kw.setdefault("key", os.path.join(self.keys, f"{role}.key"))
            kw.setdefault("broker_key", os.path.join(self.keys, "broker.pub"))
        return reel.Client(self.ce, **kw)

    def _wait_ready(self):
        with self.client(timeout=5) as c:
            # 60 s, as the shell suites allow a daemon to start on a busy machine
            end = time.monotonic() + 60
            while time.monotonic() < end:
                try:
                    st = c.status(timeout=2)
                    if any(w.get("name") == "py0" and w.get("routable") for w in st.get("workers", [])):
                        return
                except reel.ReelError:
                    pass
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("the cluster did not become ready in 60 s")

    def stop(self):
        for p in (self.worker, self.broker):
            if p.poll() is None:
                p.terminate()
        for p in (self.worker, self.broker):
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.blog.close()
        self.wlog.close()


def fd_count():
    """This process's open file descriptors."""
    return len(os.listdir("/proc/self/fd")) - 1


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class ClientTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="reel-py-")
        cls.w1 = os.path.join(cls.dir, "w1.safetensors")
        cls.w2 = os.path.join(cls.dir, "w2.safetensors")
        run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "7", "--out", cls.w1)
        run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "8", "--out", cls.w2)
        cls.ctx, cls.unc, cls.lat = rand((5, 32), 2), rand((5, 32), 3), rand((4, 2, 8, 8), 1)
        for name, a in (("ctx", cls.ctx), ("unc", cls.unc)):
            safetensors.save(os.path.join(cls.dir, f"{name}.safetensors"), {"context": a})
        safetensors.save(os.path.join(cls.dir, "lat.safetensors"), {"latent": cls.lat})
        cls.cluster = Cluster(cls.dir, cls.w1)
        cls.c = reel.Client(cls.cluster.ce, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.cluster.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def reference(self, weights, steps, cfg=None, latent=True, seed=0, size=None, sde=False, solver=None):
        """reelctl run on the same inputs: the latent it writes."""
        out = os.path.join(self.dir, f"ref-{time.monotonic_ns()}.safetensors")
        args = [f"{BUILD}/reelctl", "run", "--weights", weights, "--context", os.path.join(self.dir, "ctx.safetensors"),
                "--steps", steps, "--shift", "3", "--out", out]
        if cfg is not None:
            args += ["--uncond", os.path.join(self.dir, "unc.safetensors"), "--cfg", cfg]
        args += ["--latent", os.path.join(self.dir, "lat.safetensors")] if latent else ["--size", size, "--seed", seed]
        if sde:
            args += ["--sde", "--eta", "0.7"]
        if solver:
            args += ["--solver", solver]
        run(*args)
        t, _ = safetensors.load(out)
        return t["latent"]

    def test_a_reply_cut_by_an_interrupt_between_its_frames_leaves_the_next_call_whole(self):
        # pyzmq reads a message's frames one by one (recv_multipart is a
        # Python loop): a Ctrl-C after the first frame left the rest in the
        # socket, and the next call read a tensor frame as its header
        # (msgpack.ExtraData, not a ReelError)
        with reel.Client(self.cluster.ce, timeout=60) as c:
            kw = dict(latent=self.lat, steps=3, shift=3.0, return_trajectory=True)
            want = c.gen("tiny", self.ctx, **kw)
            real_recv, seen = zmq.Socket.recv, []

            def recv(sock, *a, **k):
                if sock is c._sock:
                    seen.append(1)
                    if len(seen) == 2:  # the reply's second frame: a SIGINT's handler runs here
                        raise KeyboardInterrupt
                return real_recv(sock, *a, **k)

            with mock.patch.object(zmq.Socket, "recv", recv):
                with self.assertRaises(KeyboardInterrupt):
                    c.gen("tiny", self.ctx, **kw)
            for _ in range(2):
                r = c.gen("tiny", self.ctx, **kw)
                self.assertTrue(np.array_equal(r.latent, want.latent))
                self.assertTrue(np.array_equal(r.trajectory, want.trajectory))

    def test_answered_clients_hold_one_socket_each(self):
        # each socket's handshake monitor (two more sockets: libzmq's and
        # its reader) ends once the broker answered, and with each call:
        # 400 live clients fit a context's 1023 sockets (with the monitors
        # kept, the 342nd failed)
        ctx = zmq.Context()
        cs = []
        try:
            for _ in range(400):
                cs.append(reel.Client(self.cluster.ce, timeout=10, context=ctx))
                self.assertIn("workers", cs[-1].status(timeout=5))
            self.assertTrue(all(c._mon is None for c in cs))
        finally:
            for c in cs:
                c.close()
            ctx.term()

    def test_sockets_closed_as_they_handshake_or_dropped_never_stop_the_client(self):
        # Each move opens a socket and a monitor of its handshakes; two moves
        # in a row close a socket whose handshake may still be running.
        # libzmq's IO thread sends those events with a blocking send: before
        # the monitor was stopped first, a reader closed under a running
        # handshake left the IO thread waiting, and every call after it
        # timed out (a run here: from the 121st of 200). A broker of its own
        # on loopback TCP (the window is widest there), and a context of its
        # own: a lost IO thread would take every other test's client too.
        log = os.path.join(self.dir, "tcp-broker.log")
        with open(log, "wb") as out:
            b = subprocess.Popen([f"{BUILD}/reel-broker", "--clients", "tcp://127.0.0.1:0", "--workers",
                                  f"ipc://{self.dir}/tcp-broker-w", "--catalog", ""], stdout=out,
                                 stderr=subprocess.STDOUT)
        ctx = zmq.Context()
        try:
            ep, end = None, time.monotonic() + 30
            while ep is None and time.monotonic() < end and b.poll() is None:
                m = re.search(r"ready clients=(tcp://\S+)", open(log).read())
                ep = m.group(1) if m else time.sleep(0.05)
            self.assertIsNotNone(ep, open(log).read())
            with reel.Client(f"{ep},{ep}", timeout=10, context=ctx) as c:
                answered = 0
                for _ in range(200):
                    c._switch()
                    c._switch()
                    try:
                        answered += "workers" in c.status(timeout=5)
                    except reel.ReelTimeout:
                        break  # the rest would time out too
                self.assertEqual((answered, c.switches), (200, 400))
            # clients dropped without close(): the garbage collector closed
            # a socket and its monitor's reader in any order (before the
            # finalizer, two runs here lost the IO thread after 51 and 64)
            answered = 0
            for _ in range(200):
                d = reel.Client(f"{ep},{ep}", timeout=10, context=ctx)
                d._switch()
                del d
                with reel.Client(ep, timeout=10, context=ctx) as c:
                    try:
                        answered += "workers" in c.status(timeout=5)
                    except reel.ReelTimeout:
                        break
            self.assertEqual(answered, 200)
        finally:
            b.terminate()
            b.wait(30)
            ctx.term()

    def test_2000_clients_in_one_process_hold_nothing_until_called_and_each_answers_then_closes(self):
        # A trainer-pattern probe: each Client opened its socket and a handshake
        # monitor when made (three sockets, three descriptors), so the
        # 342nd never-called one failed ('Too many open files': the shared
        # context's 1023 sockets, or ulimit -n 1024). Now none is opened
        # before the first call, and close() gives the descriptors back.
        before, held = fd_count(), reel.client._open_count
        cs = [reel.Client(self.cluster.ce, timeout=10) for _ in range(2000)]
        self.assertLessEqual(fd_count(), before, "clients never called hold descriptors")
        self.assertEqual(reel.client._open_count, held)
        answered, most, most_held = 0, 0, 0
        for c in cs:  # the others still alive
            answered += "workers" in c.status()
            most_held = max(most_held, reel.client._open_count - held)
            c.close()
            most = max(most, fd_count())
        self.assertEqual(answered, 2000)
        self.assertEqual((most_held, reel.client._open_count), (1, held), "a socket outlived its close()")
        # a closed socket's descriptors go a moment later (libzmq's reaper
        # thread: up to a hundred behind on a busy machine), never two a
        # client kept (4000)
        self.assertLess(most - before, 1000, f"{most - before} descriptors more at the most")
        with self.assertRaises(reel.ReelError) as e:
            cs[0].status()
        self.assertEqual(e.exception.code, "closed")

    def test_out_of_sockets_or_descriptors_a_call_raises_oserror_naming_the_limit(self):
        # Clients called and kept open until the process has no socket
        # left: an OSError EMFILE that says which limit and what to do, not
        # zmq's bare 'Too many open files'. First a context of 16 sockets.
        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, 16)
        cs = []
        try:
            with self.assertRaises(OSError) as e:
                for _ in range(40):
                    cs.append(reel.Client(self.cluster.ce, timeout=10, context=ctx))
                    cs[-1].status()
            self.assertEqual(e.exception.errno, errno.EMFILE)
            self.assertIn("the ZeroMQ context has all its 16 sockets in use", str(e.exception))
            self.assertIn("zmq.MAX_SOCKETS", str(e.exception))
        finally:
            for c in cs:
                c.close()
            ctx.term()
        # Then the process's open files (in a child: the limit is the
        # process's): the socket that cannot be made is the OSError; a
        # connection libzmq cannot make is retried silently, and the
        # timeout says why.
        script = f"""
import json, os, resource, sys
sys.path.insert(0, {os.path.dirname(HERE)!r})
import reel
with reel.Client({self.cluster.ce!r}, timeout=10) as c:
    c.status()  # the context's own descriptors made
used = len(os.listdir("/proc/self/fd")) - 1
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 24, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
cs, out = [], None
for _ in range(40):
    cs.append(reel.Client({self.cluster.ce!r}, timeout=2))
    try:
        cs[-1].status()
    except OSError as e:
        out = ["OSError", e.errno, str(e)]
        break
    except reel.ReelTimeout as e:
        out = ["ReelTimeout", 0, str(e)]
        break
print(json.dumps([len(cs), out]))
"""
        p = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout.decode()[-2000:])
        made, out = json.loads(p.stdout.decode().strip().splitlines()[-1])
        self.assertIsNotNone(out, f"{made} clients called and none ran out of descriptors")
        self.assertIn("open files (ulimit -n) in use", out[2], out)
        if out[0] == "OSError":
            self.assertEqual(out[1], errno.EMFILE)

    def test_a_client_made_before_a_fork_answers_in_the_child_on_a_socket_and_token_of_its_own(self):
        # A trainer's DataLoader workers (multiprocessing's fork): the
        # client made in the parent was used in the child on the parent's
        # socket (whose context has no IO thread there: the child's call
        # hung past its timeout), with the parent's token and next ids (the
        # broker would take the child's GEN for the parent's, resent).
        with reel.Client(self.cluster.ce, timeout=60) as c:
            kw = dict(latent=self.lat, steps=2, shift=3.0)
            want = c.gen("tiny", self.ctx, **kw)
            mp = multiprocessing.get_context("fork")
            q = mp.Queue()

            def child():
                try:
                    r = c.gen("tiny", self.ctx, **kw)
                    q.put(["ok", r.latent.tobytes() == want.latent.tobytes(), c._token])
                except BaseException as e:
                    q.put(["error", repr(e), 0])

            kids = [mp.Process(target=child) for _ in range(2)]
            for k in kids:
                k.start()
            try:
                got = [q.get(timeout=60) for _ in kids]
            finally:
                for k in kids:
                    k.join(30)
                    if k.is_alive():
                        k.kill()
            for how, same, _ in got:
                self.assertEqual((how, same), ("ok", True), got)
            tokens = {c._token} | {t for _, _, t in got}
            self.assertEqual(len(tokens), 3, "a child kept the parent's token (or another child's)")
            self.assertTrue(np.array_equal(c.gen("tiny", self.ctx, **kw).latent, want.latent))
            with self.assertRaises(TypeError) as e:  # spawn's way: said plainly
                pickle.dumps(c)
            self.assertIn("make one in each process", str(e.exception))

    # -- generations -------------------------------------------------------

    def test_gen_with_cfg_equals_reelctl_run_bitwise(self):
        r = self.c.gen("tiny", self.ctx, uncond=self.unc, cfg=4.0, latent=self.lat, steps=6, shift=3.0)
        ref = self.reference(self.w1, 6, cfg=4)
        self.assertEqual(r.latent.shape, (4, 2, 8, 8))
        self.assertTrue(np.array_equal(r.latent, ref), "latent differs from reelctl run")
        self.assertEqual(r.worker, "py0")
        self.assertEqual(r.captured + r.replayed + r.eager, 6)

    def test_repeated_key_replays_graphs_and_stays_exact(self):
        ref = self.reference(self.w1, 5)
        last = None
        for _ in range(3):
            last = self.c.gen("tiny", self.ctx, latent=self.lat, steps=5, shift=3.0)
            self.assertTrue(np.array_equal(last.latent, ref))
        self.assertGreater(last.replayed, 0, f"no step replayed: {last.stats}")

    def test_gen_without_latent_draws_it_from_the_seed_like_reelctl_run(self):
        r = self.c.gen("tiny", self.ctx, latent_shape=(4, 1, 4, 4), seed=11, steps=4, shift=3.0)
        ref = self.reference(self.w1, 4, latent=False, seed=11, size="1x4x4")
        self.assertTrue(np.array_equal(r.latent, ref))

    def test_gen_group_returns_each_sample_in_order_bitwise_as_single_gens(self):
        seeds = [5, 9, 5, 13]  # a repeated seed gives the same sample twice
        kw = dict(latent_shape=(4, 1, 4, 4), steps=3, shift=3.0, sde=True, eta=0.7, return_log_probs=True,
                  return_trajectory=True, return_means=True)
        g = self.c.gen_group("tiny", self.ctx, n=4, seeds=seeds, **kw)
        self.assertEqual(len(g), 4)
        for s, r in zip(seeds, g):
            one = self.c.gen("tiny", self.ctx, seed=s, **kw)
            self.assertEqual(r.seed, s)
            for what in ("latent", "log_probs", "trajectory", "means", "sigmas"):
                self.assertTrue(np.array_equal(getattr(r, what), getattr(one, what)), f"seed {s}: {what}")
            self.assertEqual(r.versions, one.versions)
        self.assertEqual(g[0].trajectory.shape, (4, 4, 1, 4, 4))
        self.assertTrue(np.array_equal(g[0].latent, g[2].latent))
        self.assertFalse(np.array_equal(g[0].latent, g[1].latent))
        # the same group as n separate requests: the same bits
        u = self.c.gen_group("tiny", self.ctx, n=4, seeds=seeds, batched=False, **kw)
        for a, b in zip(g, u):
            self.assertTrue(np.array_equal(a.latent, b.latent) and np.array_equal(a.log_probs, b.log_probs))
        # seed + i without seeds, and the limits
        h = self.c.gen_group("tiny", self.ctx, n=2, seed=9, latent_shape=(4, 1, 4, 4), steps=3, shift=3.0,
                             sde=True, eta=0.7)
        self.assertTrue(np.array_equal(h[0].latent, g[1].latent))
        self.assertEqual([r.seed for r in h], [9, 10])
        for bad in (dict(n=0), dict(n=65), dict(n=2, seeds=[1]), dict(n=2, latents=[self.lat])):
            with self.assertRaises(ValueError):
                self.c.gen_group("tiny", self.ctx, latent_shape=(4, 1, 4, 4), steps=1, **bad)

    def test_a_batched_group_is_one_graph_replayed_and_takes_given_latents(self):
        lats = [rand((4, 1, 4, 4), 30 + i) for i in range(3)]
        steps = []
        first = self.c.gen_group("tiny", self.ctx, n=3, latents=lats, steps=4, shift=3.0,
                                 progress=lambda i, n: steps.append((i, n)))
        # the group's batched steps (split over the worker's two streams:
        # both parts' steps), rising to the total
        total = steps[-1][1]
        self.assertIn(total, (4, 8), steps)
        self.assertEqual(max(i for i, _ in steps), total, steps)
        # The worker has two streams, each with its own graphs; the group's
        # parts keep their streams (part p on stream p), so from the second
        # run on, every batched step is a replay.
        runs = [self.c.gen_group("tiny", self.ctx, n=3, latents=lats, steps=4, shift=3.0) for _ in range(2)]
        self.assertEqual([(r[0].replayed, r[0].eager, r[0].captured) for r in runs], [(total, 0, 0)] * 2,
                         [r[0].stats for r in runs])
        again = runs[-1]
        self.assertEqual(again[0].stats, again[2].stats)  # the group's steps, shared
        # the RESULT names the group's shard key, the one the broker routed
        # by (batch 3), not a part's or a single's
        one = self.c.gen("tiny", self.ctx, latent=lats[0], steps=4, shift=3.0)
        self.assertNotEqual(again[0].key_hash, one.key_hash)
        routed = [k for w in self.c.status()["workers"] for k in w.get("keys", [])]
        self.assertIn(again[0].key_hash, routed)
        # and its capture key: the graph of its last step (16 hex digits),
        # which is neither shard hash (a part of one sample on a stream may
        # share a single's graph, so it is not compared with one's)
        self.assertRegex(again[0].capture_key, r"^[0-9a-f]{16}$", again[0].stats)
        self.assertRegex(one.capture_key, r"^[0-9a-f]{16}$", one.stats)
        self.assertNotIn(again[0].capture_key, (again[0].key_hash, one.key_hash))
        self.assertNotIn(one.capture_key, (again[0].key_hash, one.key_hash))
        for i in range(3):
            self.assertTrue(np.array_equal(first[i].latent, again[i].latent))
            one = self.c.gen("tiny", self.ctx, latent=lats[i], steps=4, shift=3.0)
            self.assertTrue(np.array_equal(first[i].latent, one.latent), f"sample {i}")

    def test_groups_and_singles_in_flight_together_are_each_bitwise_their_own(self):
        # Groups (split over the worker's two streams) and single requests
        # in flight at once from several clients: every sample is what it
        # is alone, in its place.
        kw = dict(latent_shape=(4, 1, 4, 4), steps=3, shift=3.0, sde=True, eta=0.7, return_log_probs=True)
        alone = {s: self.c.gen("tiny", self.ctx, seed=s, **kw) for s in range(60, 72)}
        out, errors = {}, []

        def group(i):
            try:
                with self.cluster.client(timeout=60) as c:
                    out[("g", i)] = c.gen_group("tiny", self.ctx, n=4, seed=60 + 4 * (i % 3), **kw)
            except Exception as e:  # reported below
                errors.append(e)

        def single(s):
            try:
                with self.cluster.client(timeout=60) as c:
                    out[("s", s)] = [c.gen("tiny", self.ctx, seed=s, **kw)]
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=group, args=(i,)) for i in range(5)]
        threads += [threading.Thread(target=single, args=(s,)) for s in range(60, 72, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        self.assertEqual(errors, [])
        self.assertEqual(len(out), 11)
        for (kind, i), rs in out.items():
            seeds = [60 + 4 * (i % 3) + k for k in range(4)] if kind == "g" else [i]
            for s, r in zip(seeds, rs):
                self.assertTrue(np.array_equal(r.latent, alone[s].latent), f"{kind}{i} seed {s}: latent")
                self.assertTrue(np.array_equal(r.log_probs, alone[s].log_probs), f"{kind}{i} seed {s}: log-probs")

    def test_gen_many_returns_each_request_in_order_bitwise_as_gen_with_at_most_window_in_flight(self):
        reqs = []
        for k in range(7):  # other contexts, seeds, step counts, shifts, guidance and SDE rollouts
            kw = dict(model="tiny", context=rand((5, 32), 40 + k), latent_shape=(4, 1, 4, 4), steps=2 + k % 3,
                      seed=70 + k, shift=1.0 + k % 2)
            if k % 3 == 1:
                kw.update(uncond=self.unc, cfg=3.0 + k)
            if k % 3 == 2:
                kw.update(sde=True, eta=0.5, return_log_probs=True)
            reqs.append(kw)
        with reel.Client(self.cluster.ce, timeout=60) as c:
            flying, most, seen = set(), [0], []
            real_send, real_recv = c._send_gen, c._recv_live

            def send(rid, *a):
                flying.add(rid)
                most[0] = max(most[0], len(flying))
                real_send(rid, *a)

            def recv(*a, **k):
                got = real_recv(*a, **k)
                flying.discard(got[0])
                return got

            c._send_gen, c._recv_live = send, recv
            out = c.gen_many(reqs, window=3, progress=lambda done, total: seen.append((done, total)))
        self.assertEqual(most[0], 3, "at most window=3 in flight, and the window filled")
        total = sum(r["steps"] for r in reqs)
        self.assertEqual(seen[-1], (total, total))
        self.assertEqual([d for d, _ in seen], sorted(d for d, _ in seen), "progress never goes back")
        self.assertEqual(len(out), len(reqs))
        for k, (kw, r) in enumerate(zip(reqs, out)):
            kw = dict(kw)
            one = self.c.gen(kw.pop("model"), **kw)
            self.assertTrue(np.array_equal(r.latent, one.latent), f"request {k}: latent")
            if kw.get("sde"):
                self.assertTrue(np.array_equal(r.log_probs, one.log_probs), f"request {k}: log-probs")
        self.assertEqual(self.c.gen_many([]), [])

    def test_gen_many_takes_groups_each_sample_bitwise_gen_group_beside_single_requests(self):
        kw = dict(latent_shape=(4, 1, 4, 4), steps=3, shift=3.0, sde=True, eta=0.7, return_log_probs=True)
        ctxs = [rand((5, 32), 90 + b) for b in range(3)]
        reqs = [dict(model="tiny", context=ctxs[b], n=3, seed=10 * b, **kw) for b in range(3)]
        reqs.append(dict(model="tiny", context=self.ctx, seed=5, **kw))  # a single request beside them
        out = self.c.gen_many(reqs, window=2)
        self.assertEqual(len(out), 4)
        for b in range(3):
            g = self.c.gen_group("tiny", ctxs[b], n=3, seed=10 * b, **kw)
            self.assertEqual([r.seed for r in out[b]], [10 * b, 10 * b + 1, 10 * b + 2])
            for k, (a, x) in enumerate(zip(out[b], g)):
                self.assertTrue(np.array_equal(a.latent, x.latent), f"group {b} sample {k}: latent")
                self.assertTrue(np.array_equal(a.log_probs, x.log_probs), f"group {b} sample {k}: log-probs")
        self.assertTrue(np.array_equal(out[3].latent, self.c.gen("tiny", self.ctx, seed=5, **kw).latent))
        # seeds and latents given; a group of one is a list of one
        lats = [rand((4, 1, 4, 4), 300 + i) for i in range(2)]
        out = self.c.gen_many([dict(model="tiny", context=self.ctx, n=2, seeds=[7, 7], latents=lats, steps=2),
                               dict(model="tiny", context=self.ctx, n=1, seed=4, latent_shape=(4, 1, 4, 4),
                                    steps=2)])
        g = self.c.gen_group("tiny", self.ctx, n=2, seeds=[7, 7], latents=lats, steps=2)
        for a, x in zip(out[0], g):
            self.assertTrue(np.array_equal(a.latent, x.latent))
        self.assertEqual((len(out[1]), out[1][0].seed), (1, 4))
        base = dict(model="tiny", context=self.ctx, steps=1, latent_shape=(4, 1, 4, 4))
        with self.assertRaisesRegex(TypeError, "batched"):
            self.c.gen_many([dict(base, n=2, batched=False)])
        with self.assertRaisesRegex(ValueError, r"requests\[1\]: seeds must give one seed per sample"):
            self.c.gen_many([base, dict(base, n=2, seeds=[1])])
        with self.assertRaisesRegex(TypeError, r"requests\[0\]: a group takes latents="):
            self.c.gen_many([dict(base, n=2, latent=lats[0])])

    def test_gen_many_checks_every_request_first_and_a_requests_error_names_its_index(self):
        good = dict(model="tiny", context=self.ctx, latent_shape=(4, 1, 4, 4), steps=1, seed=3)
        with self.assertRaisesRegex(ValueError, r"requests\[1\]"):
            self.c.gen_many([good, dict(good, steps=0)])
        with self.assertRaisesRegex(TypeError, r"requests\[0\] has no model"):
            self.c.gen_many([dict(context=self.ctx, steps=1, latent_shape=(4, 1, 4, 4))])
        with self.assertRaisesRegex(TypeError, "gen_many"):
            self.c.gen_many([dict(good, timeout=5)])
        for bad in (good, "tiny", 3):
            with self.assertRaises(TypeError):
                self.c.gen_many(bad)
        with self.assertRaises(ValueError):
            self.c.gen_many([good], window=0)
        bad = dict(good, context=rand((5, 7), 1))  # a context of the wrong width: the broker's bad_request
        with self.assertRaises(reel.ReelError) as e:
            self.c.gen_many([good, bad, good])
        self.assertEqual((e.exception.code, e.exception.index), ("bad_request", 1))
        out = self.c.gen_many([good, bad, dict(good, seed=4)], return_exceptions=True)
        self.assertIsInstance(out[1], reel.ReelError)
        self.assertEqual((out[1].code, out[1].index), ("bad_request", 1))
        self.assertTrue(np.array_equal(out[0].latent, self.c.gen(**dict(good)).latent))
        self.assertFalse(np.array_equal(out[0].latent, out[2].latent))
        # a request past its timeout: its ReelTimeout in its place (and cancelled), the others answered
        long = dict(good, latent_shape=(4, 4, 16, 16), uncond=self.unc, cfg=2.0, steps=10000)
        out = self.c.gen_many([long, good], timeout=3, return_exceptions=True)
        self.assertIsInstance(out[0], reel.ReelTimeout)
        self.assertEqual(out[0].index, 0)
        self.assertTrue(np.array_equal(out[1].latent, self.c.gen(**dict(good)).latent))
        with self.assertRaises(reel.ReelTimeout) as e:
            self.c.gen_many([good, long], timeout=3)
        self.assertEqual(e.exception.index, 1)

    def test_gen_group_raises_the_error_of_a_bad_sample(self):
        for batched in (True, False):
            with self.assertRaises(reel.ReelError) as e:
                self.c.gen_group("tiny", rand((5, 7), 1), n=3, latent_shape=(4, 1, 4, 4), steps=1, batched=batched)
            self.assertEqual(e.exception.code, "bad_request")
        self.assertEqual(len(self.c.gen_group("tiny", self.ctx, n=1, latent_shape=(4, 1, 4, 4), steps=1)), 1)

    def test_wan_solvers_equal_reelctl_run_and_replay_on_a_warm_key(self):
        for solver in ("unipc", "dpm++"):
            ref = self.reference(self.w1, 5, cfg=4, solver=solver)
            # The worker's streams each warm the key up once (graphs are per
            # stream): within a few requests one replays every step.
            for _ in range(6):
                r = self.c.gen("tiny", self.ctx, uncond=self.unc, cfg=4.0, latent=self.lat, steps=5, shift=3.0,
                               solver=solver)
                self.assertTrue(np.array_equal(r.latent, ref), f"{solver}: latent differs from reelctl run")
                if (r.replayed, r.eager) == (5, 0):
                    break
            self.assertEqual((r.replayed, r.eager), (5, 0), f"{solver} on a warm key: {r.stats}")
        euler = self.c.gen("tiny", self.ctx, uncond=self.unc, cfg=4.0, latent=self.lat, steps=5, shift=3.0)
        self.assertFalse(np.array_equal(euler.latent, ref))

    def test_a_bad_solver_is_a_value_error_at_once(self):
        for solver in ("ddim", "sde-unipc", "", None):
            with self.assertRaises(ValueError, msg=repr(solver)):
                self.c.gen("tiny", self.ctx, latent=self.lat, steps=2, solver=solver)

    def test_sde_on_a_solvers_grid_equals_reelctl_run_and_returns_that_schedule(self):
        # Flow-GRPO's Wan rollouts: SDE steps on UniPC's (or DPM++'s) sigmas and int timesteps
        for solver in ("unipc", "dpm++"):
            r = self.c.gen("tiny", self.ctx, latent=self.lat, steps=4, shift=3.0, sde=True, eta=0.7, solver=solver,
                           return_log_probs=True)
            self.assertTrue(np.array_equal(r.latent, self.reference(self.w1, 4, sde=True, solver=solver)), solver)
            euler = self.c.gen("tiny", self.ctx, latent=self.lat, steps=4, shift=3.0, sde=True, eta=0.7,
                               return_log_probs=True)
            self.assertTrue(np.all(r.sigmas[:-1] > r.sigmas[1:]) and r.sigmas[-1] == 0, solver)
            self.assertFalse(np.array_equal(r.latent, euler.latent), solver)
            # the transformer's t: the solver's ints, trunc(1000 sigma); Euler's 1000 sigma itself
            self.assertEqual(r.timesteps.shape, (4,))
            self.assertTrue(np.array_equal(r.timesteps, np.floor(r.timesteps)), (solver, r.timesteps))
            self.assertTrue(np.all(np.abs(r.timesteps - 1000 * r.sigmas[:-1].astype(np.float64)) < 1), solver)
            self.assertTrue(np.array_equal(euler.timesteps,
                                           (1000.0 * euler.sigmas[:-1].astype(np.float64)).astype(np.float32)))
            if solver == "unipc":  # from sigma_max 0.999, where Euler's start at 1
                self.assertTrue(r.sigmas[0] < 1 and not np.array_equal(r.sigmas, euler.sigmas))
            else:  # DPM++'s sigmas are Euler's; its transformer takes their int timesteps
                self.assertTrue(np.array_equal(r.sigmas, euler.sigmas))

    def test_sde_gen_equals_reelctl_run_sde(self):
        r = self.c.gen("tiny", self.ctx, latent=self.lat, steps=4, shift=3.0, sde=True, eta=0.7)
        ref = self.reference(self.w1, 4, sde=True)
        self.assertTrue(np.array_equal(r.latent, ref))

    def test_sde_rollout_log_probs_match_an_independent_numpy_computation(self):
        steps, eta, cfg = 5, 0.7, 4.0
        r = self.c.gen("tiny", self.ctx, uncond=self.unc, cfg=cfg, latent=self.lat, steps=steps, shift=3.0,
                       sde=True, eta=eta, seed=3, return_trajectory=True, return_log_probs=True,
                       return_means=True)
        self.assertEqual(r.trajectory.shape, (steps + 1, 4, 2, 8, 8))
        self.assertEqual(r.log_probs.shape, (steps,))
        self.assertEqual(r.sigmas.shape, (steps + 1,))
        self.assertEqual(r.means.shape, (steps, 4, 2, 8, 8))
        self.assertTrue(np.array_equal(r.trajectory[0], self.lat))
        self.assertTrue(np.array_equal(r.trajectory[-1], r.latent))
        self.assertEqual(r.versions, [r.version] * steps)
        # The schedule and an independent velocity: TINYDIT.md's mean and log p.
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "tests",
                                        "crosscheck"))
        import tinydit_ref as ref
        w = ref.load_weights(self.w1)
        self.assertTrue(np.allclose(r.sigmas, ref.sigma_schedule(steps, 3.0), rtol=1e-6, atol=1e-7))
        sig = r.sigmas.astype(np.float64)
        for i in range(steps):
            x, x1 = r.trajectory[i].astype(np.float64), r.trajectory[i + 1].astype(np.float64)
            v = ref.velocity(w, x, self.ctx.astype(np.float64), self.unc.astype(np.float64), sig[i], cfg)
            d = sig[i + 1] - sig[i]
            sp = sig[1] if sig[i] == 1.0 else sig[i]
            std = eta * np.sqrt(sig[i] / (1.0 - sp))
            mu = x * (1 + std * std * d / (2 * sig[i])) + v * (1 + std * std * (1 - sig[i]) / (2 * sig[i])) * d
            s_i = std * np.sqrt(-d)
            lp = np.mean(-(x1 - mu) ** 2 / (2 * s_i * s_i)) - np.log(s_i) - np.log(np.sqrt(2 * np.pi))
            self.assertLess(abs(r.log_probs[i] - lp) / abs(lp), 1e-5, f"step {i}: {r.log_probs[i]} vs {lp}")
            self.assertTrue(np.allclose(r.means[i], mu, rtol=1e-4, atol=1e-5), f"step {i}: means differ")

    def test_log_probs_without_sde_noise_are_refused(self):
        """Here, before anything is sent (the broker refuses it as
        bad_request too: test_msg)."""
        with self.assertRaises(ValueError) as e:
            self.c.gen("tiny", self.ctx, latent=self.lat, steps=2, return_log_probs=True)
        self.assertIn("need sde=True with eta > 0", str(e.exception))
        with self.assertRaises(ValueError):
            self.c.gen("tiny", self.ctx, latent=self.lat, steps=2, sde=True, eta=0.0, return_means=True)
        with self.assertRaises(ValueError):  # 1e-50 is 0 as the float32 the step reads
            self.c.gen("tiny", self.ctx, latent=self.lat, steps=2, sde=True, eta=1e-50, return_log_probs=True)

    def test_trajectory_of_an_euler_loop_steps_from_the_latent_to_the_result(self):
        r = self.c.gen("tiny", self.ctx, latent=self.lat, steps=3, shift=3.0, return_trajectory=True)
        self.assertEqual(r.trajectory.shape, (4, 4, 2, 8, 8))
        self.assertTrue(np.array_equal(r.trajectory[0], self.lat))
        self.assertTrue(np.array_equal(r.trajectory[-1], r.latent))
        self.assertTrue(np.array_equal(r.latent, self.reference(self.w1, 3)))
        self.assertIsNone(r.log_probs)

    def test_progress_callback_sees_every_step_in_order(self):
        seen = []
        self.c.gen("tiny", self.ctx, latent=self.lat, steps=7, shift=3.0, progress=lambda s, n: seen.append((s, n)))
        self.assertEqual(seen, [(i, 7) for i in range(1, 8)])

    def test_a_call_from_inside_its_own_progress_callback_is_refused_and_the_outer_call_still_gets_its_result(self):
        refused, seen = [], []

        def progress(step, steps):
            seen.append(step)
            try:
                self.c.status(timeout=5)  # would read, and drop, the outer GEN's PROGRESS and RESULT
            except RuntimeError as e:
                refused.append(str(e))

        r = self.c.gen("tiny", self.ctx, latent=self.lat, steps=3, shift=3.0, progress=progress, timeout=20)
        self.assertEqual(seen, [1, 2, 3])
        self.assertEqual(len(refused), 3, refused)
        self.assertIn("from inside its own progress callback", refused[0])
        self.assertTrue(np.array_equal(r.latent, self.reference(self.w1, 3)))
        self.assertIn("workers", self.c.status())  # after the call, calls run again

    def test_gen_many_refuses_a_call_from_its_progress_callback_after_a_result_too_and_still_returns_every_result(
            self):
        """gen_many reports progress both from its receive loop (PROGRESS)
        and after each RESULT; a call of the same Client from either is
        refused: run there it read, and dropped, the round's later replies
        (the round then ended in ReelTimeout)."""
        reqs = [dict(model="tiny", context=rand((5, 32), 90 + k), latent_shape=(4, 1, 4, 4), steps=2, seed=k)
                for k in range(3)]
        ran, refused = [], []

        def progress(done, total):
            try:
                self.c.status(timeout=5)
                ran.append(done)
            except RuntimeError as e:
                refused.append(str(e))

        out = self.c.gen_many(reqs, window=3, progress=progress, timeout=20)
        self.assertEqual(ran, [], "a call from the progress callback ran on the round's socket")
        self.assertGreaterEqual(len(refused), 3, "at least one progress call per RESULT")  # (and per PROGRESS)
        self.assertIn("from inside its own progress callback", refused[-1])
        for k, r in enumerate(out):
            kw = dict(reqs[k])
            self.assertTrue(np.array_equal(r.latent, self.c.gen(kw.pop("model"), **kw).latent), k)

    def test_unknown_model_raises_no_worker_or_timeout_at_the_deadline(self):
        with self.assertRaises(reel.ReelError) as e:
            self.c.gen("nosuchmodel", self.ctx, latent=self.lat, steps=2, deadline_ms=300)
        self.assertIn(e.exception.code, ("no_worker", "timeout"))

    def test_context_of_the_wrong_width_raises_a_clear_error_and_the_cluster_keeps_serving(self):
        with self.assertRaises(reel.ReelError) as e:
            self.c.gen("tiny", rand((5, 16), 4), latent=self.lat, steps=2, deadline_ms=5000)
        self.assertIn(e.exception.code, ("bad_request", "internal"))
        self.assertTrue(e.exception.message)
        r = self.c.gen("tiny", self.ctx, latent=self.lat, steps=2, shift=3.0)
        self.assertEqual(r.latent.shape, (4, 2, 8, 8))

    def test_latent_shape_is_required_without_a_latent(self):
        with self.assertRaises(ValueError):
            self.c.gen("tiny", self.ctx, steps=2)

    def test_status_lists_the_worker_and_queue(self):
        st = self.c.status()
        self.assertEqual(st.get("type"), "STATUS_REPLY")
        names = [w.get("name") for w in st.get("workers", [])]
        self.assertIn("py0", names)
        self.assertIn("queue_max", st)

    def test_torch_tensors_in_give_torch_tensors_out(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed here (the client never needs it)")
        r = self.c.gen("tiny", torch.from_numpy(self.ctx), latent=torch.from_numpy(self.lat), steps=3, shift=3.0)
        self.assertTrue(torch.is_tensor(r.latent))
        self.assertTrue(np.array_equal(r.latent.numpy(), self.reference(self.w1, 3)))

    def test_results_are_torch_when_any_tensor_argument_is_torch_the_same_rule_for_gen_and_gen_group(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed here (the client never needs it)")
        T = torch.from_numpy
        kw = dict(steps=2, shift=3.0)
        for ctx, unc, lat, want in ((self.ctx, None, self.lat, False), (T(self.ctx), None, self.lat, True),
                                    (self.ctx, None, T(self.lat), True), (self.ctx, T(self.unc), self.lat, True)):
            why = f"context {type(ctx).__name__}, uncond {type(unc).__name__}, latent {type(lat).__name__}"
            extra = dict(uncond=unc, cfg=2.0) if unc is not None else {}
            r = self.c.gen("tiny", ctx, latent=lat, **kw, **extra)
            self.assertEqual(torch.is_tensor(r.latent), want, "gen: " + why)
            for batched in (True, False):
                for lats in ([lat, self.lat], [self.lat, lat]):  # torch first or second
                    g = self.c.gen_group("tiny", ctx, n=2, latents=lats, batched=batched, **kw, **extra)
                    self.assertEqual([torch.is_tensor(x.latent) for x in g], [want, want],
                                     f"gen_group batched={batched}: {why}")
        g = self.c.gen_group("tiny", self.ctx, n=2, latents=T(np.stack([self.lat, self.lat])), **kw)
        self.assertTrue(torch.is_tensor(g[0].latent), "gen_group with one [n, ...] torch tensor")

    # -- syncs (in order: they change the cluster's weights) ----------------

    def test_z1_sync_by_state_dict_applies_and_later_gens_run_on_it(self):
        sd, meta = safetensors.load(self.w2)
        res = self.c.sync(2, state_dict=sd, config=meta.get("config", "tiny"), weights_dir=self.dir)
        self.assertTrue(res.complete, res)
        self.assertEqual(res.applied, ["py0"])
        self.assertEqual(res.current, 2)
        r = self.c.gen("tiny", self.ctx, latent=self.lat, steps=4, shift=3.0)
        self.assertEqual(r.version, 2)
        self.assertTrue(np.array_equal(r.latent, self.reference(self.w2, 4)))
        # The same version and file again is an ack, not stale_version.
        again = self.c.sync(2, path=os.path.join(self.dir, "transformer-v2.safetensors"))
        self.assertTrue(again.complete, again)

    def test_z2_sync_nobody_can_apply_raises_sync_failed_and_changes_nothing(self):
        bad = os.path.join(self.dir, "bad.safetensors")
        with open(bad, "wb") as f:
            f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
        with self.assertRaises(reel.SyncFailed) as e:
            self.c.sync(3, path=bad)
        self.assertEqual(e.exception.result.applied, [])
        self.assertEqual([w for w, _ in e.exception.result.failed], ["py0"])
        self.assertEqual(self.c.status().get("versions", {}).get("transformer"), 2)
        r = self.c.gen("tiny", self.ctx, latent=self.lat, steps=2, shift=3.0)
        self.assertEqual(r.version, 2)

    def test_z3_an_older_version_raises_stale_version(self):
        with self.assertRaises(reel.ReelError) as e:
            self.c.sync(1, path=self.w1)
        self.assertEqual(e.exception.code, "stale_version")

    def test_z4_the_grpo_example_publishes_versions_and_its_rollouts_follow_them(self):
        ex = os.path.join(os.path.dirname(HERE), "examples", "grpo_loop.py")
        p = subprocess.run([sys.executable, ex, "--broker", self.cluster.ce, "--weights", self.w2, "--model", "tiny",
                            "--iters", "2", "--group", "3", "--prompts", "2", "--latent", "1x4x4", "--weights-dir",
                            self.dir, "--start-version", "10", "--full"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=300)
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("published v10", out)
        self.assertIn("the next rollouts ran on v11 (published last: v11)", out)
        self.assertEqual(self.c.status().get("versions", {}).get("transformer"), 11)

    def test_sync_needs_exactly_one_source_and_wan_names(self):
        with self.assertRaises(ValueError):
            self.c.sync(9)
        with self.assertRaises(ValueError):
            self.c.sync(9, state_dict={"w": np.zeros(3)}, config="tiny")

    def test_a_path_that_is_not_a_regular_file_a_bad_window_or_model_is_a_value_error_at_once(self):
        fifo = os.path.join(self.dir, "fifo.safetensors")
        os.mkfifo(fifo)
        t0 = time.monotonic()
        for path in (fifo, "/dev/zero", self.dir):  # read forever, or no file
            for upload in (False, True):
                with self.assertRaises(ValueError):
                    self.c.sync(9, path=path, upload=upload, timeout=3)
        with self.assertRaises(ValueError):
            self.c.upload(9, self.w2, window=0)
        for model in (None, "", 7):
            with self.assertRaises(ValueError):
                self.c.gen(model, self.ctx, latent=self.lat, steps=2)
        self.assertLess(time.monotonic() - t0, 3.0)

    def test_arguments_of_the_wrong_kind_are_refused_by_name_before_anything_is_sent(self):
        kw = dict(latent=self.lat, steps=2)
        cases = [  # (what the user passed, the exception, words its message must hold)
            (dict(kw, steps=2.9), TypeError, "steps must be an integer"),
            (dict(kw, steps=True), TypeError, "steps must be an integer"),
            (dict(kw, steps="2"), TypeError, "steps must be an integer"),
            (dict(kw, steps=None), TypeError, "steps must be an integer"),
            (dict(kw, seed=3.9), TypeError, "seed must be an integer"),
            (dict(kw, seed=2 ** 64), ValueError, "seed must be in 0..18446744073709551615"),
            (dict(kw, seed=-1), ValueError, "seed must be in"),
            (dict(kw, cfg="3"), TypeError, "cfg must be a number"),
            (dict(kw, shift=None), TypeError, "shift must be a number"),
            (dict(kw, sde="no"), TypeError, "sde must be True or False"),
            (dict(kw, deadline_ms=1.5), TypeError, "deadline_ms must be an integer"),
            (dict(steps=2, latent_shape=(4, 1, 4.7, 4.9)), TypeError, "latent_shape[2] must be an integer"),
            (dict(steps=2, latent_shape=4), ValueError, "latent_shape must be 4 integers"),
            (dict(steps=2, latent_shape="4144"), ValueError, "latent_shape must be 4 integers"),
            (dict(kw, timeout=0), ValueError, "timeout must be a finite number of seconds > 0"),
            (dict(kw, timeout=-5), ValueError, "timeout must be a finite number of seconds > 0"),
            # the ranges of PROTOCOL.md "What a GEN must satisfy" that need no model (helper-90: the
            # broker's bad_request came back where the README promised a ValueError)
            (dict(kw, steps=0), ValueError, "steps must be in 1..10000"),
            (dict(kw, steps=10001), ValueError, "steps must be in 1..10000"),
            (dict(steps=2, latent_shape=(4, 0, 8, 8)), ValueError, "latent_shape[1] must be in 1..65536"),
            (dict(steps=2, latent_shape=(4, 2, 65537, 8)), ValueError, "latent_shape[2] must be in 1..65536"),
            (dict(steps=2, latent_shape=(1, 4096, 4096, 2)), ValueError, "F x H x W must be at most"),
            (dict(steps=2, latent_shape=(128, 16, 256, 256)), ValueError, "more than 256 MiB"),
            (dict(kw, shift=0.0), ValueError, "shift must be > 0"),
            (dict(kw, shift=float("nan")), ValueError, "shift must be > 0"),
            (dict(kw, cfg=float("nan")), ValueError, "cfg must be a finite number"),
            (dict(kw, cfg=float("inf")), ValueError, "cfg must be a finite number"),
            (dict(kw, cfg=1e39), ValueError, "fits a float32"),
            (dict(kw, sde=True, eta=-0.5), ValueError, "eta must be >= 0"),
            (dict(kw, sde=True, eta=float("nan")), ValueError, "eta must be >= 0"),
            (dict(kw, version=2 ** 63), ValueError, "version must be in 0..9223372036854775807"),
        ]
        t0 = time.monotonic()
        for args, exc, words in cases:
            with self.assertRaises(exc, msg=str(args)) as e:
                self.c.gen("tiny", self.ctx, **args)
            self.assertIn(words, str(e.exception), str(args))
        for bad, words in ((self.ctx.astype(np.complex64), "real numbers"), (self.ctx > 0, "real numbers"),
                           (self.ctx.tobytes(), "array of numbers"), ("abc", "array of numbers"),
                           (np.float32(1), "got shape ()")):
            with self.assertRaises((TypeError, ValueError)) as e:
                self.c.gen("tiny", bad, latent=self.lat, steps=2)
            self.assertIn(words, str(e.exception))
        with self.assertRaises(TypeError) as e:
            self.c.gen_group("tiny", self.ctx, n=2, latent=np.stack([self.lat, self.lat]), steps=2)
        self.assertIn("latents=", str(e.exception))
        for seeds, exc in (({1, 2}, TypeError), (5, TypeError), ([1.5, 2.5], TypeError), ([1], ValueError)):
            with self.assertRaises(exc, msg=repr(seeds)):
                self.c.gen_group("tiny", self.ctx, n=2, seeds=seeds, latent_shape=(4, 2, 8, 8), steps=2)
        with self.assertRaises(ValueError):
            self.c.gen_group("tiny", self.ctx, n=2, latents=[self.lat, self.lat[:, :1]], steps=2)
        with self.assertRaises(TypeError):
            self.c.sync(2.7, path=self.w2, timeout=3)
        self.assertLess(time.monotonic() - t0, 2.0)  # refused here, nothing waited for
        # what is right is taken, numpy scalars and lossless dtypes included: float64 equal to the
        # float32 values gives the same bits
        a = self.c.gen("tiny", self.ctx, latent=self.lat, steps=np.int64(2), seed=np.uint32(0), cfg=np.float32(1))
        b = self.c.gen("tiny", self.ctx.astype(np.float64), latent=self.lat.astype(np.float64), steps=2)
        self.assertTrue(np.array_equal(a.latent, b.latent))
        with self.assertWarns(UserWarning):  # guidance without an unconditional context is off: said
            self.c.gen("tiny", self.ctx, latent=self.lat, steps=2, cfg=5.0)

    def test_an_infinite_or_nan_timeout_is_a_value_error_naming_it_as_every_call_has_a_deadline(self):
        t0 = time.monotonic()
        for bad in (float("inf"), float("nan"), np.float64("inf"), -float("inf")):
            calls = (lambda: self.c.gen("tiny", self.ctx, latent=self.lat, steps=2, timeout=bad),
                     lambda: self.c.gen_group("tiny", self.ctx, n=2, latent_shape=(4, 2, 8, 8), steps=2, timeout=bad),
                     lambda: self.c.status(timeout=bad),
                     lambda: self.c.sync(99, path=self.w2, timeout=bad),
                     lambda: reel.Client(self.cluster.ce, timeout=bad))
            for call in calls:
                with self.assertRaises(ValueError, msg=repr(bad)) as e:
                    call()
                self.assertIn("timeout must be a finite number of seconds > 0", str(e.exception))
        self.assertLess(time.monotonic() - t0, 2.0)  # refused here, nothing waited for

    def test_text_and_liveness_of_the_wrong_kind_are_refused_by_name_before_anything_is_sent(self):
        t0 = time.monotonic()
        kw = dict(steps=2, latent_shape=(4, 2, 8, 8))
        for field, bad, exc, words in (("prompt", b"a cat", TypeError, "prompt must be text"),
                                       ("prompt", ["a", "cat"], TypeError, "prompt must be text"),
                                       ("prompt", 7, TypeError, "prompt must be text"),
                                       ("prompt", "a \ud800 cat", ValueError, "prompt is not valid text"),
                                       ("negative_prompt", b"x", TypeError, "negative_prompt must be text"),
                                       ("negative_prompt", "\udfff", ValueError, "negative_prompt is not valid text")):
            args = {"prompt": "a cat", field: bad}
            with self.assertRaises(exc, msg=f"{field}={bad!r}") as e:
                self.c.gen("tiny", cfg=5.0, **args, **kw)
            self.assertIn(words, str(e.exception))
        with self.assertRaises(ValueError) as e:
            self.c.gen("tiny\ud800", self.ctx, **kw)
        self.assertIn("model is not valid text", str(e.exception))
        for bad, exc in (("2", TypeError), (True, TypeError), (-1, ValueError), (float("inf"), ValueError),
                         (float("nan"), ValueError)):
            with self.assertRaises(exc, msg=repr(bad)) as e:
                reel.Client(self.cluster.ce, liveness=bad)
            self.assertIn("liveness must be", str(e.exception))
        old = os.environ.get("REEL_CLIENT_LIVENESS_MS")
        try:
            for bad in ("1.5", "abc", "-5"):
                os.environ["REEL_CLIENT_LIVENESS_MS"] = bad
                with self.assertRaises(ValueError, msg=bad) as e:
                    reel.Client(self.cluster.ce)
                self.assertIn("REEL_CLIENT_LIVENESS_MS must be a whole number of milliseconds", str(e.exception))
            os.environ["REEL_CLIENT_LIVENESS_MS"] = "250"
            with reel.Client(self.cluster.ce) as c:
                self.assertEqual(c.liveness, 0.25)
        finally:
            if old is None:
                os.environ.pop("REEL_CLIENT_LIVENESS_MS", None)
            else:
                os.environ["REEL_CLIENT_LIVENESS_MS"] = old
        with reel.Client(self.cluster.ce, liveness=0) as c:
            self.assertEqual(c.liveness, 0.0)
        self.assertLess(time.monotonic() - t0, 2.0)  # refused here, nothing waited for

    def test_the_warning_of_cfg_without_uncond_points_at_the_callers_line(self):
        for call in (lambda: self.c.gen("tiny", self.ctx, latent=self.lat, steps=2, cfg=5.0),
                     lambda: self.c.gen_group("tiny", self.ctx, n=2, latents=[self.lat, self.lat], steps=2, cfg=5.0),
                     lambda: self.c.gen_group("tiny", self.ctx, n=2, latents=[self.lat, self.lat], steps=2, cfg=5.0,
                                              batched=False)):
            with warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                call()
            self.assertTrue(got, "no warning")
            for w in got:
                self.assertIn("without uncond", str(w.message))
                self.assertEqual(os.path.abspath(w.filename), os.path.abspath(__file__))

    def test_bad_endpoints_are_refused_by_name_and_a_closed_client_says_so(self):
        for ep in ("localhost:5555", "tcp://127.0.0.1", "http://x:1", ""):
            with self.assertRaises(ValueError) as e:
                reel.Client(ep)
            self.assertIn("endpoint", str(e.exception))
        k = reel.Client(" " + self.cluster.ce + " , " + self.cluster.ce, timeout=10)  # spaces around commas
        self.assertEqual(k.endpoints, (self.cluster.ce, self.cluster.ce))
        self.assertIn("workers", k.status())
        k.close()
        for call in (lambda: k.status(), lambda: k.gen("tiny", self.ctx, latent=self.lat, steps=2)):
            with self.assertRaises(reel.ReelError) as e:
                call()
            self.assertEqual(e.exception.code, "closed")

    def test_a_bracketed_ipv6_endpoint_is_taken_and_a_port_outside_1_to_65535_is_not(self):
        for ep in ("tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://[::1]:70000", "tcp://[::1]", "tcp://::1:5555",
                   "tcp://[x]:5555"):
            with self.assertRaises(ValueError, msg=ep) as e:
                reel.Client(ep)
            self.assertIn("endpoint", str(e.exception))
        for ep in ("tcp://[::1]:5555", "tcp://[fe80::1%eth0]:5555", "tcp://127.0.0.1:65535", "tcp://[::1]:1,tcp://a:2"):
            reel.Client(ep).close()
        # and it talks over IPv6 (a stand-in broker answering one STATUS), where the host has [::1]
        ctx = zmq.Context.instance()
        r = ctx.socket(zmq.ROUTER)
        r.setsockopt(zmq.IPV6, 1)
        r.setsockopt(zmq.LINGER, 0)
        try:
            port = r.bind_to_random_port("tcp://[::1]")
        except zmq.ZMQError as e:
            r.close()
            self.skipTest(f"no IPv6 loopback here: {e}")

        def answer():
            if r.poll(10000):
                peer, hdr = r.recv_multipart()
                rid = msgpack.unpackb(hdr)["id"]
                r.send_multipart([peer, msgpack.packb({"proto": "reel/1", "type": "STATUS_REPLY", "id": rid,
                                                       "workers": []})])

        t = threading.Thread(target=answer)
        t.start()
        try:
            with reel.Client(f"tcp://[::1]:{port}", timeout=10) as c:
                self.assertEqual(c.status()["workers"], [])
        finally:
            t.join(15)
            r.close()

    def test_a_group_gives_each_sample_its_own_arrays_seed_and_progress_either_way(self):
        kw = dict(n=3, seeds=[4, 5, 6], steps=2, latent_shape=(4, 2, 8, 8), sde=True, return_log_probs=True)
        for batched in (True, False):
            seen = []
            g = self.c.gen_group("tiny", self.ctx, batched=batched, progress=lambda s, t: seen.append((s, t)), **kw)
            self.assertEqual([r.seed for r in g], [4, 5, 6], f"batched={batched}")
            self.assertTrue(seen and seen[-1][0] == seen[-1][1], f"batched={batched}: progress {seen}")
            self.assertIsNot(g[0].sigmas, g[1].sigmas)
            before = g[1].sigmas.copy()
            g[0].sigmas[:] = -1
            g[0].latent[:] = 7
            g[0].stats["replayed"] = -1
            self.assertIsInstance(g[0].stats.get("declines"), dict, g[0].stats)  # nested: its own too
            g[0].stats["declines"]["edited"] = 1
            self.assertTrue(np.array_equal(g[1].sigmas, before))
            self.assertFalse((g[1].latent == 7).all())
            self.assertNotEqual(g[1].stats.get("replayed"), -1)
            self.assertNotIn("edited", g[1].stats["declines"], f"batched={batched}")

    def test_a_groups_seed_plus_i_wraps_modulo_2_to_the_64_as_the_protocol_says(self):
        """seed = 2^64 - 1, n = 2: samples 2^64 - 1 and 0 (helper-90: the
        client refused it), each bitwise gen() with its seed, batched or
        not."""
        kw = dict(steps=2, latent_shape=(4, 2, 8, 8))
        alone = [self.c.gen("tiny", self.ctx, seed=s, **kw) for s in (2 ** 64 - 1, 0)]
        for batched in (True, False):
            g = self.c.gen_group("tiny", self.ctx, n=2, seed=2 ** 64 - 1, batched=batched, **kw)
            self.assertEqual([r.seed for r in g], [2 ** 64 - 1, 0], f"batched={batched}")
            for r, a in zip(g, alone):
                self.assertTrue(np.array_equal(r.latent, a.latent), f"batched={batched}, seed {r.seed}")

    def test_a_state_dict_with_a_tensor_the_model_lacks_is_refused_here_naming_it(self):
        """A worker refuses such a file and says only bad_weights: not
        weights of this worker's model (helper-90: an optimizer's tensor
        left in a state dict); the client names the tensor before it
        writes or sends anything."""
        sd, _ = safetensors.load(self.w1)
        sd["optimizer.exp_avg"] = np.zeros(3, np.float32)
        d = tempfile.mkdtemp(dir=self.dir)
        t0 = time.monotonic()
        with self.assertRaises(ValueError) as e:
            self.c.sync(77, state_dict=sd, config="tiny", weights_dir=d, timeout=3)
        self.assertIn("'optimizer.exp_avg'", str(e.exception))
        self.assertEqual(os.listdir(d), [], "nothing written")
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertNotIn("transformer", self.c.status().get("pending", {}))

    def test_calls_from_two_threads_run_one_at_a_time_and_each_gets_its_own_answer(self):
        import threading
        out, errors = {}, []

        def worker(t):
            try:
                for i in range(4):
                    out[(t, i)] = self.c.gen("tiny", self.ctx, latent_shape=(4, 2, 8, 8), steps=2, seed=10 * t + i)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(t,)) for t in (1, 2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(len(out), 8)
        for (t, i), r in out.items():
            alone = self.c.gen("tiny", self.ctx, latent_shape=(4, 2, 8, 8), steps=2, seed=10 * t + i)
            self.assertTrue(np.array_equal(r.latent, alone.latent), f"thread {t} call {i}")

    def test_an_empty_file_is_refused_at_once_not_waited_on(self):
        empty = os.path.join(self.dir, "empty.safetensors")
        open(empty, "wb").close()
        t0 = time.monotonic()
        with self.assertRaises(ValueError) as e:
            self.c.upload(30, empty, timeout=10)
        self.assertIn("empty file", str(e.exception))
        self.assertLess(time.monotonic() - t0, 2.0)

    def test_z5_a_state_dict_sent_by_value_leaves_no_file_behind_even_when_refused(self):
        # (this broker keeps no uploads: the sync is refused, and the
        # folder the client made for the file goes all the same)
        sd, meta = safetensors.load(self.w2)
        before = set(glob.glob(os.path.join(tempfile.gettempdir(), "reel-sync-*")))
        with self.assertRaises(reel.ReelError) as e:
            self.c.sync(12, state_dict=sd, config=meta.get("config", "tiny"), upload=True)
        self.assertIn("--weights-dir", str(e.exception))
        self.assertEqual(set(glob.glob(os.path.join(tempfile.gettempdir(), "reel-sync-*"))), before)

    def test_z6_sync_by_path_names_a_wan_release_folder_with_its_identity(self):
        # w2 as a Wan2.1 release ships it (F32: the same values), synced by
        # its folder: the client computes the identity reelctl prints.
        rel = os.path.join(self.dir, "release-w2")
        run(f"{BUILD}/reelctl", "weights", "export", self.w2, "--out", rel)
        out = subprocess.run([f"{BUILD}/reelctl", "weights", "inspect", rel, "--json"], check=True,
                             capture_output=True, text=True).stdout
        self.assertEqual(reel.checkpoint_identity(rel), json.loads(out)["sha256"])
        versions = self.c.status().get("versions", {})
        res = self.c.sync(versions.get("transformer", 1) + 20, path=rel)
        self.assertTrue(res.complete, res.failed)
        r = self.c.gen("tiny", self.ctx, latent=self.lat, steps=3, shift=3.0)
        self.assertTrue(np.array_equal(r.latent, self.reference(self.w2, 3)))
        with self.assertRaises(ValueError):
            self.c.sync(99, path=self.dir)  # several checkpoints in one folder: name one


class CancelTests(unittest.TestCase):
    """The client cancels what it gives up on (docs/PROTOCOL.md
    "Cancelling"), against a stand-in broker (a ROUTER on ipc) that
    answers STATUS, sends what each test asks, and records every message."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="reel-cancel-")
        self.ep = f"ipc://{self.dir}/b"
        self.r = zmq.Context.instance().socket(zmq.ROUTER)
        self.r.setsockopt(zmq.LINGER, 0)
        self.r.bind(self.ep)
        self.got, self.stop = [], threading.Event()
        self.on_gen = lambda peer, hdr: None  # what the stand-in does with each GEN
        self.t = threading.Thread(target=self.serve)
        self.t.start()
        self.ctx = np.zeros((5, 32), np.float32)

    def tearDown(self):
        self.stop.set()
        self.t.join(10)
        self.r.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def send(self, peer, hdr):
        self.r.send_multipart([peer, msgpack.packb(dict(hdr, proto="reel/1"))])

    def serve(self):
        while not self.stop.is_set():
            if not self.r.poll(50):
                continue
            frames = self.r.recv_multipart()
            peer, hdr = frames[0], msgpack.unpackb(frames[1], raw=False)
            self.got.append(hdr)
            if hdr["type"] == "STATUS":
                self.send(peer, {"type": "STATUS_REPLY", "id": hdr["id"], "workers": [], "boot": "00000000000000b1"})
            elif hdr["type"] == "GEN":
                self.on_gen(peer, hdr)

    def cancels(self, n):
        """The CANCELs received, once there are n (within 10 s)."""
        end = time.monotonic() + 10
        while time.monotonic() < end:
            c = [h for h in self.got if h["type"] == "CANCEL"]
            if len(c) >= n:
                return c
            time.sleep(0.01)
        return [h for h in self.got if h["type"] == "CANCEL"]

    def gens(self):
        return [h for h in self.got if h["type"] == "GEN"]

    def test_a_gen_that_times_out_is_cancelled_by_its_id_and_token(self):
        with reel.Client(self.ep, timeout=30) as c:
            with self.assertRaises(reel.ReelTimeout):
                c.gen("tiny", self.ctx, latent_shape=(4, 2, 8, 8), steps=4, timeout=0.5)
            (g,) = self.gens()
            (x,) = self.cancels(1)
            self.assertEqual((x["id"], x["client"]), (g["id"], g["client"]))
            self.assertEqual(set(x) - {"proto", "type", "id", "client"}, set())

    def test_an_exception_out_of_the_progress_callback_cancels_the_gen_and_the_client_serves_on(self):
        self.on_gen = lambda peer, hdr: self.send(peer, {"type": "PROGRESS", "id": hdr["id"], "step": 1, "steps": 4})

        def stop(step, steps):
            raise KeyboardInterrupt

        with reel.Client(self.ep, timeout=30) as c:
            with self.assertRaises(KeyboardInterrupt):
                c.gen("tiny", self.ctx, latent_shape=(4, 2, 8, 8), steps=4, progress=stop)
            (g,) = self.gens()
            (x,) = self.cancels(1)
            self.assertEqual((x["id"], x["client"]), (g["id"], g["client"]))
            self.assertEqual(c.status()["workers"], [])  # the same client goes on

    def test_a_failed_sample_of_single_gens_cancels_the_others_not_itself(self):
        first = []

        def answer(peer, hdr):  # the first GEN fails; the others get no answer
            if not first:
                first.append(hdr["id"])
                self.send(peer, {"type": "ERROR", "id": hdr["id"], "code": "bad_request", "message": "no"})

        self.on_gen = answer
        with reel.Client(self.ep, timeout=30) as c:
            with self.assertRaises(reel.ReelError) as e:
                c.gen_group("tiny", self.ctx, n=3, latent_shape=(4, 2, 8, 8), steps=4, batched=False, timeout=20)
            self.assertEqual(e.exception.code, "bad_request")
            x = self.cancels(2)
            ids = sorted(g["id"] for g in self.gens())
            self.assertEqual(len(ids), 3)
            self.assertEqual(sorted(h["id"] for h in x), sorted(set(ids) - set(first)))

    def test_an_answered_gen_is_not_cancelled(self):
        self.on_gen = lambda peer, hdr: self.send(peer, {"type": "ERROR", "id": hdr["id"], "code": "no_worker",
                                                         "message": "none"})
        with reel.Client(self.ep, timeout=30) as c:
            with self.assertRaises(reel.ReelError):
                c.gen("tiny", self.ctx, latent_shape=(4, 2, 8, 8), steps=4, timeout=5)
            self.assertEqual(c.status()["workers"], [])  # a round trip after the call: anything it sent is in
        self.assertEqual([h for h in self.got if h["type"] == "CANCEL"], [])


class NoBrokerTests(unittest.TestCase):
    """Nothing listening where the Client points (no cluster)."""

    def test_a_timeout_with_nothing_listening_says_so_naming_the_endpoint(self):
        d = tempfile.mkdtemp(prefix="reel-py-nobroker-")
        try:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()  # a port that refuses
            for ep in (f"ipc://{d}/nobody-bound-this", f"tcp://127.0.0.1:{port}"):
                with reel.Client(ep, timeout=1.5) as c:
                    with self.assertRaises(reel.ReelTimeout) as cm:
                        c.status()
                self.assertIn(f"; nothing accepted a connection at {ep} (is a broker running there?",
                              str(cm.exception))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_a_move_to_the_other_broker_that_cannot_make_its_socket_raises_the_oserror_emfile(self):
        """A standby pair's client that goes silent moves to the other
        broker on a new socket; when the process has no socket left for
        it, the call raises the OSError EMFILE naming the limit (the error
        the client promises), not the AttributeError its cancelling of the
        GEN on the socket it no longer had raised over it; the next call
        opens a socket again."""
        d = tempfile.mkdtemp(prefix="reel-py-nomove-")
        try:
            eps = f"ipc://{d}/a,ipc://{d}/b"
            real = reel.client._new_socket
            made = []

            def first_only(ctx, kind):  # the first socket, then none: EMFILE as _new_socket raises it
                if made:
                    raise OSError(errno.EMFILE, "no socket left (test)")
                made.append(kind)
                return real(ctx, kind)

            with reel.Client(eps, timeout=5, liveness=0.1) as c:
                with mock.patch.object(reel.client, "_new_socket", side_effect=first_only):
                    with self.assertRaises(OSError) as e:
                        c.gen("tiny", rand((5, 32), 1), latent_shape=(4, 1, 4, 4), steps=1)
                self.assertEqual(e.exception.errno, errno.EMFILE, repr(e.exception))
                self.assertEqual(c.switches, 1)
                with self.assertRaises(reel.ReelTimeout):  # a socket again, nothing listening
                    c.status(timeout=0.5)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_a_pair_of_standbys_gone_silent_times_out_saying_every_broker_is_the_standby(self):
        """Two stand-in brokers that answer their first two messages as a
        pair's standby does (a GEN ERROR standby, a STATUS its reply) and
        then say nothing: the GEN's deadline comes while one of them is
        asked, and the timeout still says what the answers said (the C
        client's message too), not a bare "no answer"."""
        d = tempfile.mkdtemp(prefix="reel-py-standbys-")
        ctx = zmq.Context.instance()
        stop = threading.Event()
        peers = []
        for k in "ab":
            r = ctx.socket(zmq.ROUTER)
            r.setsockopt(zmq.LINGER, 0)
            r.bind(f"ipc://{d}/{k}")
            peers.append(r)

        def serve(r):
            left = 2
            while not stop.is_set():
                if not r.poll(50):
                    continue
                f = r.recv_multipart()
                if left == 0:
                    continue
                left -= 1
                h = msgpack.unpackb(f[1], raw=False)
                i = h.get("id", 0)
                if h.get("type") == "STATUS":  # a standby answers STATUS as any broker
                    a = {"proto": "reel/1", "type": "STATUS_REPLY", "id": i, "workers": [], "queue": 0}
                else:
                    a = {"proto": "reel/1", "type": "ERROR", "id": i, "code": "standby",
                         "message": "standby (a test peer)"}
                r.send_multipart([f[0], msgpack.packb(a)])

        threads = [threading.Thread(target=serve, args=(r,), daemon=True) for r in peers]
        for t in threads:
            t.start()
        try:
            with reel.Client(f"ipc://{d}/a,ipc://{d}/b", timeout=3, liveness=0.1) as c:
                with self.assertRaises(reel.ReelTimeout) as cm:
                    # (timeout=3: the call's own wait, not the GEN's deadline plus its margin)
                    c.gen("tiny", rand((5, 32), 1), latent_shape=(4, 1, 4, 4), steps=1, timeout=3)
            self.assertRegex(str(cm.exception), r"every broker is the standby \(\d+ answers standby, "
                                                 r"the last broker asked none in time\)")
        finally:
            stop.set()
            for t in threads:
                t.join(5)
            for r in peers:
                r.close()
            shutil.rmtree(d, ignore_errors=True)


class HangUp:
    """A TCP port that accepts every connection and closes it at once: a
    broker that fails every handshake of a client that has not its keys
    (libzmq's connection error: the client tries again). .accepts counts
    them; wait_for(n) waits for n more (event-driven, bounded)."""

    def __init__(self):
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(512)
        self.ep = f"tcp://127.0.0.1:{self.srv.getsockname()[1]}"
        self.accepts = 0
        self.cv = threading.Condition()
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self):
        while True:
            try:
                s, _ = self.srv.accept()
            except OSError:
                return
            s.close()
            with self.cv:
                self.accepts += 1
                self.cv.notify_all()

    def wait_for(self, n, secs=60):
        with self.cv:
            at = self.accepts
            return self.cv.wait_for(lambda: self.accepts >= at + n, timeout=secs)

    def close(self):
        self.srv.shutdown(socket.SHUT_RDWR)
        self.srv.close()
        self.t.join(10)


def fast_reconnects():
    """Client sockets that try again 1 ms after a failure (libzmq's
    default, 100 ms or more, would take minutes for thousands)."""
    real = zmq.Socket.connect

    def connect(sock, addr):
        sock.setsockopt(zmq.RECONNECT_IVL, 1)
        return real(sock, addr)
    return mock.patch.object(zmq.Socket, "connect", connect)


def pending_events(c):
    """Handshake events waiting in c's monitor pipe (none without a watch)."""
    n = 0
    while c._mon is not None:
        try:
            c._mon.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            break
        n += 1
    return n


class IdleClientTests(unittest.TestCase):
    """A client whose connection keeps failing, between calls and in one:
    the handshake events it watches for its hints stay bounded."""

    def setUp(self):
        self.hang = HangUp()

    def tearDown(self):
        self.hang.close()

    def test_an_idle_client_whose_handshakes_fail_piles_up_no_events_and_its_next_call_still_says_why(self):
        # A trainer-pattern probe: the monitor stayed on between calls with an
        # unbounded pipe (3 events a failed handshake, ~20 a second at
        # libzmq's pace: 60,420 events and +7.5 MB after 20,140 failures);
        # now the watch runs only while a call runs.
        said = "the broker closed every handshake"
        with fast_reconnects(), reel.Client(self.hang.ep, timeout=0.5) as c:
            with self.assertRaises(reel.ReelTimeout) as e:
                c.status()
            self.assertIn(said, str(e.exception))
            seen = c._hs_events
            self.assertTrue(self.hang.wait_for(3000), "the client stopped trying to connect")
            self.assertEqual(pending_events(c), 0, "events piled up while no call ran")
            self.assertIsNone(c._mon)  # one socket held between calls, not three
            self.assertEqual(c._hs_events, seen, "events read while no call ran")
            with self.assertRaises(reel.ReelTimeout) as e:
                c.status()
            self.assertIn(said, str(e.exception))
            self.assertGreater(c._hs_events, seen)

    def test_a_call_reads_the_handshake_events_as_they_come(self):
        # a call that waits long (a GEN's 65 s) read them only at its end
        reads, stop = [], []
        real = reel.Client._read_handshakes

        class Enough(Exception):
            pass

        def read(c):
            before = c._hs_events
            real(c)
            reads.append(c._hs_events - before)
            if sum(reads) >= 3000 and not stop:
                stop.append(1)
                raise Enough  # (the call's end then stops its watch: that read is not stopped)
        with fast_reconnects(), mock.patch.object(reel.Client, "_read_handshakes", read), \
                reel.Client(self.hang.ep, timeout=60) as c:
            with self.assertRaises(Enough):
                c.status()
            self.assertIsNone(c._mon, "the watch outlived its call")
        self.assertLessEqual(max(reads), 64, f"a backlog of {max(reads)} events at one read")


class GenResultTests(unittest.TestCase):
    """GenResult from a RESULT header alone (no cluster)."""

    def test_a_group_samples_version_and_first_version_are_its_own_steps(self):
        # a group of 2 x 3 steps split over two streams, a sync landing
        # between steps: sample 0 ran v3, v3, v3; sample 1 ran v3, v4, v4.
        # The header's version (4) is the newest of the samples' last steps
        # and first_version (3) the oldest of their first ones.
        hdr = {"type": "RESULT", "version": 4, "first_version": 3, "n": 2, "seeds": [7, 8],
               "version_runs": [{"from": 0, "version": 3}, {"from": 4, "version": 4}], "stats": {}}
        lat = np.zeros((2, 4, 1, 2, 2), np.float32)
        s0 = reel.client.GenResult(hdr, {"latent": lat}, 0.1, 3, lambda a: a, sample=0)
        s1 = reel.client.GenResult(hdr, {"latent": lat}, 0.1, 3, lambda a: a, sample=1)
        self.assertEqual(s0.versions, [3, 3, 3])
        self.assertEqual((s0.version, s0.first_version), (3, 3))
        self.assertEqual(s1.versions, [3, 4, 4])
        self.assertEqual((s1.version, s1.first_version), (4, 3))
        self.assertEqual((s0.seed, s1.seed), (7, 8))
        one = reel.client.GenResult({"type": "RESULT", "version": 5, "stats": {}}, {"latent": lat[0]}, 0.1, 3,
                                    lambda a: a)
        self.assertEqual((one.version, one.first_version, one.versions), (5, 5, [5, 5, 5]))


class BusyTests(unittest.TestCase):
    """A broker with room for one waiting request answers BUSY beyond it."""

    def test_requests_beyond_the_queue_raise_busy_error(self):
        d = tempfile.mkdtemp(prefix="reel-py-busy-")
        try:
            w = os.path.join(d, "w.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "1", "--out", w)
            cl = Cluster(d, w, broker_flags=("--queue-max", "1"), worker_flags=("--max-inflight", "1"))
            try:
                ctx, lat = rand((5, 32), 1), rand((4, 2, 8, 8), 2)
                outcomes = []

                def one(steps):
                    with reel.Client(cl.ce, timeout=120) as c:
                        try:
                            c.gen("tiny", ctx, latent=lat, steps=steps, deadline_ms=120000)
                            outcomes.append("ok")
                        except reel.BusyError as e:
                            self.assertEqual(e.code, "busy")
                            outcomes.append("busy")
                        except reel.ReelError as e:
                            outcomes.append(e.code)

                # Two long GENs take the worker's one slot and the queue's one
                # place; only once STATUS shows both taken do three more go
                # out, so each of those is BUSY however fast or slow the
                # machine (five at once, of 300 steps each, hoped the first
                # would still run when the others arrived)
                ts = [threading.Thread(target=one, args=(6000,)) for _ in range(2)]
                for t in ts:
                    t.start()
                with reel.Client(cl.ce, timeout=10) as c:
                    end = time.monotonic() + 60
                    while time.monotonic() < end:
                        st = c.status()
                        if st.get("queue") == 1 and sum(w.get("inflight", 0) for w in st["workers"]) == 1:
                            break
                        time.sleep(0.02)
                    self.assertEqual((st.get("queue"), sum(w.get("inflight", 0) for w in st["workers"])), (1, 1), st)
                more = [threading.Thread(target=one, args=(2,)) for _ in range(3)]
                for t in more:
                    t.start()
                    t.join(120)
                for t in ts:
                    t.join(120)
                self.assertEqual(sorted(outcomes), ["busy", "busy", "busy", "ok", "ok"], outcomes)
            finally:
                cl.stop()
        finally:
            shutil.rmtree(d, ignore_errors=True)


class GenManyBusyTests(unittest.TestCase):
    """gen_many against a broker with one slot and one place in its queue:
    what is answered BUSY goes again after another answer; with nothing
    of the call in flight, BUSY is raised (or put in each place)."""

    def test_busy_requests_go_again_and_busy_with_nothing_in_flight_is_raised(self):
        d = tempfile.mkdtemp(prefix="reel-py-many-")
        try:
            w = os.path.join(d, "w.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "1", "--out", w)
            cl = Cluster(d, w, broker_flags=("--queue-max", "1"), worker_flags=("--max-inflight", "1"))
            try:
                # 300 steps (tens of ms): the five are sent long before the first ends,
                # on a busy machine too (at 30 steps the first could end first)
                reqs = [dict(model="tiny", context=rand((5, 32), 60 + k), latent_shape=(4, 1, 4, 4), steps=300,
                             seed=k) for k in range(5)]
                with reel.Client(cl.ce, timeout=120) as c:
                    busy, real = [], c._recv_live

                    def recv(*a, **k):
                        try:
                            return real(*a, **k)
                        except reel.BusyError as e:
                            busy.append(e.request_id)
                            raise

                    c._recv_live = recv
                    out = c.gen_many(reqs, window=5)  # one runs, one waits: at least three answered BUSY at first
                    self.assertGreaterEqual(len(busy), 3, busy)
                    for k, r in enumerate(out):
                        kw = dict(reqs[k])
                        self.assertTrue(np.array_equal(r.latent, c.gen(kw.pop("model"), **kw).latent), k)

                    # A round much larger than the queue: after a BUSY no more go than the
                    # broker holds, one more per answer, so BUSY answers stay about one per
                    # request (resending every held one at each answer gave ~20 per request)
                    many = [dict(model="tiny", context=rand((5, 32), 200 + k), latent_shape=(4, 1, 4, 4), steps=2,
                                 seed=k) for k in range(40)]
                    del busy[:]
                    out = c.gen_many(many, window=40)
                    self.assertLess(len(busy), 3 * len(many), f"{len(busy)} BUSY answers for {len(many)} requests")
                    for k in (0, 17, 39):
                        kw = dict(many[k])
                        self.assertTrue(np.array_equal(out[k].latent, c.gen(kw.pop("model"), **kw).latent), k)

                    # Another client's long GENs hold the slot and the place in the queue:
                    # nothing of gen_many's can be in flight, so BUSY is its answer.
                    stop, ended = threading.Event(), []

                    def hold():
                        def check(step, steps):
                            if stop.is_set():
                                raise RuntimeError("stop")
                        with reel.Client(cl.ce, timeout=120) as h:
                            try:
                                h.gen("tiny", rand((5, 32), 1), latent_shape=(4, 1, 4, 4), steps=10000,
                                      deadline_ms=120000, progress=check)
                            except RuntimeError:
                                ended.append(1)

                    ts = [threading.Thread(target=hold) for _ in range(2)]
                    for t in ts:
                        t.start()
                    try:
                        end = time.monotonic() + 60
                        while time.monotonic() < end:
                            st = c.status()
                            if st.get("queue") == 1 and sum(x.get("inflight", 0) for x in st["workers"]) == 1:
                                break
                            time.sleep(0.02)
                        with self.assertRaises(reel.BusyError) as e:
                            c.gen_many(reqs[:3])
                        self.assertIn(e.exception.index, (0, 1, 2))  # the last of them answered
                        out = c.gen_many(reqs[:3], return_exceptions=True)
                        self.assertTrue(all(isinstance(x, reel.BusyError) for x in out), out)
                        self.assertEqual([x.index for x in out], [0, 1, 2])
                    finally:
                        stop.set()
                        for t in ts:
                            t.join(120)
                    self.assertEqual(len(ended), 2)
            finally:
                cl.stop()
        finally:
            shutil.rmtree(d, ignore_errors=True)


class BatchingTests(unittest.TestCase):
    """Many clients' single requests batched into shared steps by a worker
    (--max-batch): each result, rollout fields included, bitwise the same
    request served alone by a worker that never batches."""

    def serve(self, d, tag, w, jobs, *worker_flags):
        """jobs queued at a fresh broker first, then a worker with those
        flags starts: it holds several at once. Results by job, and the
        worker's mixed steps (from its /metrics)."""
        ce, we = f"ipc://{d}/{tag}.c", f"ipc://{d}/{tag}.w"
        logs = [open(os.path.join(d, f"{tag}.{n}.log"), "wb") for n in ("broker", "worker")]
        broker = subprocess.Popen([f"{BUILD}/reel-broker", "--clients", ce, "--workers", we, "--catalog",
                                   os.path.join(d, f"{tag}.db"), "--heartbeat-ms", "200"],
                                  stdout=logs[0], stderr=subprocess.STDOUT)
        worker = None
        try:
            out, errors = {}, []

            def one(k, kw):
                try:
                    with reel.Client(ce, timeout=120) as c:
                        out[k] = c.gen("tiny", **kw)
                except Exception as e:  # reported below
                    errors.append(e)

            threads = [threading.Thread(target=one, args=(k, kw)) for k, kw in enumerate(jobs)]
            for t in threads:
                t.start()
            with reel.Client(ce, timeout=10) as c:
                end = time.monotonic() + 60
                while c.status(timeout=5).get("queue") != len(jobs) and time.monotonic() < end:
                    time.sleep(0.05)
            worker = subprocess.Popen([f"{BUILD}/reel-worker", "--broker", we, "--name", tag, "--weights", w,
                                       "--streams", "1", "--heartbeat-ms", "200", "--warmup", "1",
                                       "--metrics", "127.0.0.1:0", *worker_flags],
                                      stdout=logs[1], stderr=subprocess.STDOUT)
            for t in threads:
                t.join(180)
            self.assertEqual(errors, [])
            log = open(os.path.join(d, f"{tag}.worker.log")).read()
            port = log.split("(port ")[1].split(")")[0]
            want = sum(kw["steps"] for kw in jobs)
            end = time.monotonic() + 30
            while True:  # the page is published every 500 ms: wait for the one with every step
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
                m = {ln.split()[0]: float(ln.split()[1]) for ln in page.splitlines()
                     if ln and not ln.startswith("#") and len(ln.split()) == 2}
                if m.get("reel_worker_step_samples_sum") == want or time.monotonic() > end:
                    break
                time.sleep(0.1)
            self.assertEqual(m.get("reel_worker_step_samples_sum"), want)
            return out, m["reel_worker_mixed_steps_total"]
        finally:
            for p in (worker, broker):
                if p and p.poll() is None:
                    p.terminate()
                    p.wait(30)
            for f in logs:
                f.close()

    def test_single_requests_of_many_clients_share_steps_and_each_is_bitwise_alone(self):
        d = tempfile.mkdtemp(prefix="reel-py-batch-")
        try:
            w = os.path.join(d, "w.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "3", "--out", w)
            unc = rand((5, 32), 99)
            jobs = []
            for k in range(8):
                kw = dict(context=rand((5, 32), 10 + k), latent_shape=(4, 2, 8, 8), steps=3 + k % 4,
                          shift=1.0 + k % 3, seed=500 + k, uncond=unc, cfg=2.0 + k)
                if k % 2:
                    kw.update(sde=True, eta=0.3 + 0.1 * (k % 3), return_log_probs=True, return_trajectory=True)
                jobs.append(kw)
            alone, mixed0 = self.serve(d, "alone", w, jobs, "--max-batch", "1")
            self.assertEqual(mixed0, 0)
            batched, mixed = self.serve(d, "batched", w, jobs, "--max-batch", "4", "--batching", "always")
            self.assertGreater(mixed, 0, "the queued requests shared steps")
            self.assertEqual(sum(r.batched for r in alone.values()), 0)
            self.assertGreater(sum(r.batched for r in batched.values()), 0, "results say which steps were batched")
            self.assertEqual({r.mean_batch for r in alone.values()}, {0.0})
            for r in batched.values():  # --max-batch 4, ladder: batches of 2..4 requests padded to 2 or 4 rows
                if r.batched:
                    self.assertTrue(2 <= r.mean_batch <= 4, r.stats)
                    self.assertLessEqual(r.padded_rows, r.batched, r.stats)
            for k, kw in enumerate(jobs):
                a, b = alone[k], batched[k]
                self.assertTrue(np.array_equal(a.latent, b.latent), f"request {k}: latent")
                if kw.get("sde"):
                    self.assertTrue(np.array_equal(a.log_probs, b.log_probs), f"request {k}: log-probs")
                    self.assertTrue(np.array_equal(a.trajectory, b.trajectory), f"request {k}: trajectory")
        finally:
            shutil.rmtree(d, ignore_errors=True)


class PrewarmTests(unittest.TestCase):
    """A worker that restarts with --prewarm captures the keys it served
    before, in the background; a client's first request of such a key
    then replays every step, and its result is bitwise the one before."""

    def test_a_restarted_worker_replays_hot_keys_from_their_first_request(self):
        import sqlite3
        d = tempfile.mkdtemp(prefix="reel-py-prewarm-")
        cl = None
        try:
            w = os.path.join(d, "w.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "5", "--out", w)
            cl = Cluster(d, w, worker_flags=("--prewarm", "0"))
            jobs = [dict(context=rand((5, 32), 1), latent_shape=(4, 2, 8, 8), steps=4, seed=11),
                    dict(context=rand((5, 32), 2), uncond=rand((5, 32), 3), cfg=3.0, latent_shape=(4, 2, 8, 16),
                         steps=3, seed=12, sde=True, eta=0.5, return_log_probs=True)]
            before = []
            with cl.client(timeout=60) as c:
                for kw in jobs:
                    for _ in range(2):
                        r = c.gen("tiny", **kw)
                    before.append(r)
            cl.worker.kill()
            cl.worker.wait(30)
            log = open(os.path.join(d, "worker2.log"), "wb")
            cl.worker = subprocess.Popen([f"{BUILD}/reel-worker", "--broker", f"ipc://{d}/workers", "--name", "py0",
                                          "--weights", w, "--streams", "2", "--heartbeat-ms", "200", "--warmup", "1",
                                          "--prewarm", "8"], stdout=log, stderr=subprocess.STDOUT)
            db = os.path.join(d, "reel.db")
            end, rows = time.monotonic() + 60, 0
            while time.monotonic() < end and rows < 4:  # 2 keys, on each of 2 streams
                try:
                    with sqlite3.connect(db, timeout=5) as con:
                        rows = con.execute("SELECT count(*) FROM captures WHERE origin = 'prewarm'").fetchone()[0]
                except sqlite3.Error:
                    pass
                time.sleep(0.1)
            log.close()
            self.assertEqual(rows, 4, "each hot key captured on each stream, recorded as prewarm")
            with cl.client(timeout=60) as c:
                for kw, b in zip(jobs, before):
                    r = c.gen("tiny", **kw)
                    self.assertEqual((r.captured, r.eager, r.replayed), (0, 0, kw["steps"]),
                                     f"replayed from the first step: {r.stats}")
                    self.assertTrue(np.array_equal(r.latent, b.latent), "bitwise the result before the restart")
                    if kw.get("sde"):
                        self.assertTrue(np.array_equal(r.log_probs, b.log_probs))
        finally:
            if cl:
                cl.stop()
            shutil.rmtree(d, ignore_errors=True)


class BrokerRestartTests(unittest.TestCase):
    """A GEN survives its broker: killed (SIGKILL) and restarted on the
    same endpoints while the GEN runs, the client (liveness 0.2 s) sends
    it again, and gets one result, bitwise the one an undisturbed run
    gives."""

    def test_a_gen_in_flight_when_the_broker_dies_is_sent_again_and_answered_once(self):
        d = tempfile.mkdtemp(prefix="reel-py-brestart-")
        cl = None
        try:
            w = os.path.join(d, "w.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "5", "--out", w)
            cl = Cluster(d, w, worker_flags=("--streams", "1"))
            kw = dict(context=rand((5, 32), 1), latent_shape=(4, 2, 8, 8), steps=4000, seed=21)
            with cl.client(timeout=120) as c:
                want = c.gen("tiny", **kw)
                self.assertEqual(c.resends, 0)
            out, errors = {}, []

            def one():
                try:
                    with cl.client(timeout=120, liveness=0.2) as c:
                        out["r"] = c.gen("tiny", **kw)
                        out["resends"] = c.resends
                except Exception as e:  # reported below
                    errors.append(e)

            t = threading.Thread(target=one)
            t.start()
            with cl.client(timeout=10, liveness=0) as c:
                end = time.monotonic() + 30
                while time.monotonic() < end and not sum(x.get("inflight", 0) for x in c.status()["workers"]):
                    time.sleep(0.02)
            cl.restart_broker()
            t.join(120)
            self.assertEqual(errors, [])
            self.assertGreaterEqual(out["resends"], 1, "the client sent its GEN again")
            self.assertTrue(np.array_equal(out["r"].latent, want.latent), "bitwise the undisturbed result")
        finally:
            if cl:
                cl.stop()
            shutil.rmtree(d, ignore_errors=True)

    def test_gens_in_flight_when_the_broker_is_stopped_and_restarted_are_answered_by_the_new_one(self):
        """SIGTERM (a restart, a deploy): the stopping broker answers the
        GENs it holds ERROR shutdown, which is no answer to a client with
        liveness: it waits, sends them again to the broker that comes back,
        and gets one result each, bitwise (gen and gen_many). One without
        liveness gets the ERROR (code "shutdown")."""
        d = tempfile.mkdtemp(prefix="reel-py-bterm-")
        cl = None
        try:
            w = os.path.join(d, "w.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "5", "--out", w)
            cl = Cluster(d, w, worker_flags=("--streams", "1"))
            reqs = [dict(model="tiny", context=rand((5, 32), k), latent_shape=(4, 2, 8, 8), steps=3000, seed=30 + k)
                    for k in range(3)]
            with cl.client(timeout=120) as c:
                want = c.gen_many(reqs)
            out, errors = {}, []

            def one():
                try:
                    with cl.client(timeout=120, liveness=0.2) as c:
                        kw = dict(reqs[0])
                        out["r"] = c.gen(kw.pop("model"), **kw)
                except Exception as e:  # reported below
                    errors.append(e)

            def many():
                try:
                    with cl.client(timeout=120, liveness=0.2) as c:
                        out["many"] = c.gen_many(reqs[1:])
                except Exception as e:  # reported below
                    errors.append(e)

            def bare():
                try:
                    with cl.client(timeout=120, liveness=0) as c:
                        kw = dict(reqs[0])
                        c.gen(kw.pop("model"), **kw)
                except reel.ReelError as e:
                    out["bare"] = e

            ts = [threading.Thread(target=f) for f in (one, many, bare)]
            for t in ts:
                t.start()
            with cl.client(timeout=10, liveness=0) as c:
                end = time.monotonic() + 30
                held = 0
                while time.monotonic() < end and held < 4:  # all four GENs at the broker, running or queued
                    st = c.status()
                    held = sum(x.get("inflight", 0) for x in st["workers"]) + st.get("queue", 0)
                    if held < 4:
                        time.sleep(0.02)
                self.assertEqual(held, 4, "the four GENs reached the broker")
            cl.restart_broker(graceful=True)
            for t in ts:
                t.join(120)
            self.assertEqual(errors, [])
            self.assertEqual(getattr(out.get("bare"), "code", None), "shutdown", f"the bare client got {out.get('bare')!r}")
            self.assertTrue(np.array_equal(out["r"].latent, want[0].latent), "gen: bitwise the undisturbed result")
            for got, w_ in zip(out["many"], want[1:]):
                self.assertTrue(np.array_equal(got.latent, w_.latent), "gen_many: bitwise the undisturbed results")
        finally:
            if cl:
                cl.stop()
            shutil.rmtree(d, ignore_errors=True)

    def test_gen_many_sends_a_gen_lost_to_a_restart_again_at_the_new_brokers_first_result(self):
        """A fake broker (a ROUTER this test drives) restarted quicker than
        a liveness of silence (5 s): a GEN sent before it is lost, one sent
        since is answered by the new broker, its RESULT naming its boot. The
        lost one goes again then (its id), not after a silence that the
        answers to the later ones never leave (a window cycling through the
        new broker: the lost waited out their timeouts). As test_client.c's
        test of reel_gen_many."""
        d = tempfile.mkdtemp(prefix="reel-py-lost-")
        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(f"ipc://{d}/b")
        boot_a, boot_b = 0x1111aaaa2222bbbb, 0x3333cccc4444dddd
        reqs = [dict(model="tiny", context=rand((5, 32), k), latent_shape=(4, 1, 2, 2), steps=2, seed=100 + k)
                for k in range(4)]
        out, errors = {}, []
        c = reel.Client(f"ipc://{d}/b", timeout=20, liveness=5)

        def one():
            try:
                out["r"] = c.gen_many(reqs, window=2)
            except Exception as e:  # reported below
                errors.append(e)

        def recv(secs=10):
            self.assertTrue(router.poll(int(secs * 1000)), f"nothing from the client within {secs} s")
            fr = router.recv_multipart()
            return fr[0], msgpack.unpackb(fr[1], raw=False)

        def reply(who, hdr, *frames):
            router.send_multipart([who, msgpack.packb(dict(hdr, proto=reel.client.PROTO), use_bin_type=True)]
                                  + list(frames))

        def result(who, rid, seed, boot):
            lat = np.full((4, 1, 2, 2), seed, dtype=np.float32)
            reply(who, {"type": "RESULT", "id": rid, "boot": format(boot, "016x"), "worker": "fake", "version": 1,
                        "tensors": [{"name": "latent", "dtype": "F32", "shape": [4, 1, 2, 2], "bytes": lat.nbytes}]},
                  lat.tobytes())

        t = threading.Thread(target=one)
        t.start()
        try:
            ping, gens = None, []
            while ping is None or len(gens) < 2:  # a STATUS first, then the two GENs
                who, h = recv()
                if h["type"] == "STATUS":
                    ping = h["id"]
                else:
                    gens.append(h["id"])
            reply(who, {"type": "STATUS_REPLY", "id": ping, "boot": format(boot_a, "016x")})
            result(who, gens[0], 100, boot_a)
            _, h = recv()
            self.assertEqual((h["type"], h["seed"]), ("GEN", 102))
            id2 = h["id"]
            # the broker restarts: gens[1] (seed 101) is lost; id2 reached the new one
            result(who, id2, 102, boot_b)
            again, id3, end = False, None, time.monotonic() + 2
            while not again or id3 is None:
                left = end - time.monotonic()
                self.assertTrue(left > 0 and router.poll(int(left * 1000)),
                                f"GEN {gens[1]}, lost to the restart, not sent again within 2 s of the new "
                                "broker's first RESULT")
                _, h = recv()
                if h["type"] != "GEN":
                    continue  # (a STATUS of a slow machine's silence)
                if h["id"] == gens[1]:
                    self.assertEqual(h["seed"], 101)
                    again = True
                else:
                    self.assertEqual((id3, h["seed"]), (None, 103))
                    id3 = h["id"]
            result(who, gens[1], 101, boot_b)
            result(who, id3, 103, boot_b)
            t.join(20)
            self.assertEqual(errors, [])
            self.assertEqual([float(r.latent.flat[0]) for r in out["r"]], [100, 101, 102, 103])
        finally:
            t.join(30)
            c.close()
            router.close()
            ctx.term()
            shutil.rmtree(d, ignore_errors=True)

    def test_a_client_learns_a_restarted_brokers_boot_from_a_result_and_never_resends_a_live_gen(self):
        """The broker restarts between two calls of one client (liveness
        0.2 s); the call after the restart is answered, its RESULT naming
        the new broker's boot id. A later long GEN, during which the
        client's liveness STATUSes are answered by that same broker, is
        never sent again (before RESULT carried `boot`, the client still
        held the old boot id, took the answer for a restart and sent the
        live GEN again: run twice when the first answer was on its way)."""
        d = tempfile.mkdtemp(prefix="reel-py-bboot-")
        cl = None
        try:
            w = os.path.join(d, "w.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "5", "--out", w)
            cl = Cluster(d, w, worker_flags=("--streams", "1"))
            short = dict(context=rand((5, 32), 1), latent_shape=(4, 2, 8, 8), steps=2, seed=3)
            with cl.client(timeout=120, liveness=0.2) as c:
                c.gen("tiny", **short)
                boot_a = c.status()["boot"]
                cl.restart_broker()
                with cl.client(timeout=10, liveness=0) as probe:
                    end = time.monotonic() + 60
                    while time.monotonic() < end and not probe.status()["workers"]:
                        time.sleep(0.02)
                    boot_b = probe.status()["boot"]
                self.assertNotEqual(boot_a, boot_b, "a restarted broker has a new boot id")
                c.gen("tiny", **short)  # answered by the new broker: its RESULT names boot_b
                before = c.resends
                c.gen("tiny", **dict(short, steps=3000, seed=4))  # several liveness periods long
                self.assertEqual(c.resends, before, "a live GEN was sent again to the broker that held it")
        finally:
            if cl:
                cl.stop()
            shutil.rmtree(d, ignore_errors=True)

    def test_a_sync_that_timed_out_while_the_broker_was_down_never_reaches_it_when_it_returns(self):
        """The broker is killed; sync(v5) raises ReelTimeout; the broker
        starts again. The client's next call goes over its socket: had the
        SYNC stayed queued there (helper-90), the new broker would take it
        first and apply v5, which the trainer was told failed. Nothing of
        v5 appears, before or after the worker rejoins."""
        d = tempfile.mkdtemp(prefix="reel-py-ghost-")
        cl = None
        try:
            w, w2 = os.path.join(d, "w.safetensors"), os.path.join(d, "w2.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "5", "--out", w)
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "6", "--out", w2)
            cl = Cluster(d, w)
            with cl.client(timeout=30, liveness=0) as c:
                c.status()
                cl.broker.kill()
                cl.broker.wait(30)
                with self.assertRaises(reel.ReelTimeout):
                    c.sync(5, path=w2, timeout=2)
                cl.broker = subprocess.Popen(cl._broker_argv, stdout=cl.blog, stderr=subprocess.STDOUT)
                st = c.status(timeout=20)
                self.assertNotIn("transformer", st.get("pending", {}), st)
                end = time.monotonic() + 30
                while time.monotonic() < end and not any(x.get("name") == "py0" and x.get("routable")
                                                         for x in st.get("workers", [])):
                    time.sleep(0.05)
                    st = c.status(timeout=5)
                self.assertTrue(any(x.get("name") == "py0" for x in st.get("workers", [])), st)
                self.assertNotIn("transformer", st.get("pending", {}), st)
                self.assertNotEqual(st.get("versions", {}).get("transformer"), 5, st)
                # v5 may still be published (never stale_version), at once.
                # On a busy machine the worker can give up on the restarted
                # broker just after its READY and register again on a new
                # socket: a SYNC the broker cannot send it in between waits
                # for it to register again (tests/cli_sync_undelivered.sh).
                self.assertEqual(c.sync(5, path=w2, timeout=30).version, 5, "v5 may still be published")
        finally:
            if cl:
                cl.stop()
            shutil.rmtree(d, ignore_errors=True)

    def test_a_sync_whose_broker_dies_before_the_ack_is_sent_again_and_completes(self):
        """A raw worker (tests/security_peer.py) gets SYNC v2 and does not
        ack; the broker is killed and restarted; the worker registers again
        running v2 (its ack was lost with the broker). The client (liveness
        0.2 s) sends the SYNC again to the new broker, and its sync ends
        complete, applied by that worker; STATUS says v2 is current."""
        d = tempfile.mkdtemp(prefix="reel-py-srestart-")
        procs = []
        peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "security_peer.py")
        ce, we = f"ipc://{d}/clients", f"ipc://{d}/workers"

        def broker():
            p = subprocess.Popen([f"{BUILD}/reel-broker", "--clients", ce, "--workers", we, "--catalog",
                                  os.path.join(d, "reel.db"), "--heartbeat-ms", "200"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            procs.append(p)
            return p

        def raw_worker(version, out):
            ready = json.dumps({"type": "READY", "name": "raw", "models": ["tiny"],
                                "versions": {"transformer": version}})
            p = subprocess.Popen([sys.executable, peer, "--endpoint", we, "--id", f"raw{version}", "--for", "60",
                                  "--heartbeat", ready], stdout=open(out, "w"), stderr=subprocess.STDOUT)
            procs.append(p)
            return p

        def until(cond, what, secs=30):
            end = time.monotonic() + secs
            while time.monotonic() < end:
                if cond():
                    return
                time.sleep(0.02)
            self.fail(f"no {what} within {secs} s")

        def registered(c):
            return any(w.get("name") == "raw" for w in c.status(timeout=2).get("workers", []))

        try:
            w2 = os.path.join(d, "w2.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "6", "--out", w2)
            b = broker()
            p1 = raw_worker(1, os.path.join(d, "p1.out"))
            with reel.Client(ce, timeout=5, liveness=0) as c:
                until(lambda: registered(c), "registration")
            out, errors = {}, []

            def one():
                try:
                    with reel.Client(ce, timeout=120, liveness=0.2) as c:
                        out["r"] = c.sync(2, path=w2)
                        out["resends"] = c.resends
                except Exception as e:  # reported below
                    errors.append(e)

            t = threading.Thread(target=one)
            t.start()
            until(lambda: '"type": "SYNC"' in open(os.path.join(d, "p1.out")).read(), "SYNC at the raw worker")

            def pending_recorded():  # the new broker learns v2's sha256 from it (the catalog writes in batches)
                try:
                    with sqlite3.connect(f"file:{os.path.join(d, 'reel.db')}?mode=ro", uri=True) as db:
                        return db.execute("SELECT count(*) FROM weight_versions WHERE version = 2").fetchone()[0] == 1
                except sqlite3.Error:
                    return False
            # READY carries no sha256: the new broker takes the worker's word
            # for v2 only as the sync it finds interrupted in its catalog (a
            # real worker would also answer the SYNC sent again: ok at once)
            until(pending_recorded, "the pending v2 in the catalog")
            b.kill()
            b.wait(30)
            p1.kill()
            p1.wait(30)
            broker()
            raw_worker(2, os.path.join(d, "p2.out"))
            t.join(120)
            self.assertEqual(errors, [])
            self.assertGreaterEqual(out["resends"], 1, "the client sent its SYNC again")
            self.assertTrue(out["r"].complete, out["r"])
            self.assertEqual(out["r"].applied, ["raw"])
            with reel.Client(ce, timeout=10, liveness=0) as c:
                self.assertEqual(c.status()["versions"].get("transformer"), 2)
        finally:
            for p in procs:
                p.kill()
                p.wait(30)
            shutil.rmtree(d, ignore_errors=True)
    def test_a_sync_by_value_whose_broker_dies_mid_upload_uploads_again_and_completes(self):
        """sync(upload=True) of small's weights (100 MB); the broker frozen
        as soon as it logs the SYNC, then killed and restarted: the client
        uploads again to the new broker, sends the SYNC again and ends
        complete; the new broker holds the file byte for byte."""
        self._upload_through_a_broker_restart(graceful=False)

    def test_a_sync_by_value_whose_broker_is_stopped_mid_upload_goes_again_to_the_next_and_completes(self):
        """The same with the broker stopped on purpose (SIGTERM) as soon as
        it logs the SYNC: its ERROR shutdown is no answer; the client
        uploads and syncs again to the broker that comes back (it used to
        raise the ERROR)."""
        self._upload_through_a_broker_restart(graceful=True)

    def _upload_through_a_broker_restart(self, graceful):
        d = tempfile.mkdtemp(prefix="reel-py-urestart-")
        procs = []
        ce, we, up = f"ipc://{d}/clients", f"ipc://{d}/workers", os.path.join(d, "up")
        os.mkdir(up)
        blog = os.path.join(d, "broker.log")

        def broker(log):
            p = subprocess.Popen([f"{BUILD}/reel-broker", "--clients", ce, "--workers", we, "--catalog",
                                  os.path.join(d, "reel.db"), "--heartbeat-ms", "200", "--weights-dir", up],
                                 stdout=open(log, "w"), stderr=subprocess.STDOUT)
            procs.append(p)
            return p

        try:
            s1, s2 = os.path.join(d, "s1.safetensors"), os.path.join(d, "s2.safetensors")
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "small", "--seed", "11", "--out", s1)
            run(f"{BUILD}/reelctl", "weights", "init", "--config", "small", "--seed", "12", "--out", s2)
            b = broker(blog)
            procs.append(subprocess.Popen([f"{BUILD}/reel-worker", "--broker", we, "--name", "pyu", "--weights", s1,
                                           "--streams", "1", "--heartbeat-ms", "200"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
            with reel.Client(ce, timeout=5, liveness=0) as c:
                end = time.monotonic() + 60
                while time.monotonic() < end and not any(w.get("name") == "pyu" for w in c.status(timeout=2)["workers"]):
                    time.sleep(0.02)
            out, errors = {}, []

            def one():
                try:
                    with reel.Client(ce, timeout=60, liveness=0.2) as c:
                        out["r"] = c.sync(2, path=s2, upload=True)
                        out["resends"] = c.resends
                except Exception as e:  # reported below
                    errors.append(e)

            t = threading.Thread(target=one)
            t.start()
            end = time.monotonic() + 60
            while time.monotonic() < end and "sync transformer v2 accepted" not in open(blog).read():
                time.sleep(0.005)
            if graceful:
                stored = os.path.exists(os.path.join(up, "transformer-v2.safetensors"))
                b.terminate()
            else:
                b.send_signal(signal.SIGSTOP)
                stored = os.path.exists(os.path.join(up, "transformer-v2.safetensors"))
                b.kill()
            b.wait(30)
            broker(os.path.join(d, "broker2.log"))
            t.join(120)
            self.assertEqual(errors, [])
            self.assertTrue(out["r"].complete, out["r"])
            if not stored:  # else the upload ended before the freeze (a few ms' race): nothing went again
                self.assertGreaterEqual(out["resends"], 1, "the client uploaded and synced again")
            with open(os.path.join(up, "transformer-v2.safetensors"), "rb") as a, open(s2, "rb") as want:
                self.assertTrue(a.read() == want.read(), "the new broker holds the file byte for byte")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(30)
            shutil.rmtree(d, ignore_errors=True)


def free_ports(n):
    """n free loopback TCP ports (bound to port 0, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for so in socks:
            so.bind(("127.0.0.1", 0))
        return [so.getsockname()[1] for so in socks]
    finally:
        for so in socks:
            so.close()


def wait_log(path, pattern, secs, proc=None, count=1):
    """Until the log at path has count lines matching the regex pattern;
    False after secs, or once proc (when given) has ended without them."""
    rx = re.compile(pattern)
    end = time.monotonic() + secs
    while True:
        try:
            with open(path, errors="replace") as f:
                if sum(1 for ln in f if rx.search(ln)) >= count:
                    return True
        except FileNotFoundError:
            pass
        if time.monotonic() >= end or (proc is not None and proc.poll() is not None):
            return False
        time.sleep(0.02)


class Pair:
    """A standby pair (docs/PROTOCOL.md "A standby broker"): broker A
    (--role primary) and B (--role backup) on loopback TCP client endpoints,
    each the other's --peer, with workers given both worker endpoints; each
    broker keeps uploads in its own folder, DIR/upa and DIR/upb. Started, A
    is active (term 1), B standby and every worker registered with A;
    stop() kills what is left."""

    def __init__(self, d, weights, workers=("pw0",), broker_flags=()):
        self.dir, self.weights = d, weights
        pa, pb = free_ports(2)
        self.ca, self.cb = f"tcp://127.0.0.1:{pa}", f"tcp://127.0.0.1:{pb}"
        self.pair = f"{self.ca},{self.cb}"
        self.wa, self.wb = f"ipc://{d}/wa", f"ipc://{d}/wb"
        self.procs, self.logs = [], []
        try:
            self.a = self._broker("a", self.ca, self.wa, self.cb, "primary", broker_flags)
            self.b = self._broker("b", self.cb, self.wb, self.ca, "backup", broker_flags)
            if not (wait_log(self.log("a"), r"reel-broker: active \(term 1\)", 30, self.a) and
                    wait_log(self.log("b"), r"reel-broker: standby", 30, self.b)):
                raise RuntimeError(f"the pair did not choose: A {self.tail('a')!r}, B {self.tail('b')!r}")
            self._wait_a_sees_b_standby(30)
            for name in workers:
                w = self._spawn(name, [f"{BUILD}/reel-worker", "--broker", f"{self.wa},{self.wb}", "--name", name,
                                       "--weights", weights, "--streams", "1", "--heartbeat-ms", "200"])
                if not wait_log(self.log("a"), rf"worker {name} ready", 60, w):
                    raise RuntimeError(f"worker {name} did not register with A: {self.tail(name)!r}")
        except BaseException:
            self.stop()
            raise

    def _wait_a_sees_b_standby(self, secs):
        """B logs "standby" before A has heard it say so: A's STATUS
        shows its peer "starting" until then. Waits for A's view."""
        end = time.monotonic() + secs
        with reel.Client(self.ca, timeout=10) as c:
            while True:
                st = c.status()
                if st.get("ha_peer") == "standby":
                    return
                if time.monotonic() >= end:
                    raise RuntimeError(f"A never saw B as standby: {st!r}")
                time.sleep(0.02)

    def log(self, name):
        return os.path.join(self.dir, f"{name}.log")

    def tail(self, name):
        try:
            with open(self.log(name), errors="replace") as f:
                return f.read()[-600:]
        except FileNotFoundError:
            return ""

    def _spawn(self, name, args):
        log = open(self.log(name), "wb")
        self.logs.append(log)
        p = subprocess.Popen([str(a) for a in args], stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def _broker(self, name, clients, workers, peer, role, flags):
        up = os.path.join(self.dir, f"up{name}")
        os.makedirs(up, exist_ok=True)
        return self._spawn(name, [f"{BUILD}/reel-broker", "--clients", clients, "--workers", workers, "--catalog",
                                  os.path.join(self.dir, f"{name}.db"), "--heartbeat-ms", "200", "--peer", peer,
                                  "--role", role, "--peer-timeout-ms", "1500", "--weights-dir", up, *flags])

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(30)
        for f in self.logs:
            f.close()


class StandbyPairTests(unittest.TestCase):
    """A client given both brokers of a standby pair ("A,B"): it talks to
    the active one, moves on ERROR standby (a GEN, a SYNC, an upload) and
    when its broker dies; given the standby alone, it gets ERROR standby.
    No broker dies here: the clients' liveness (1 s) only keeps a slow
    answer on a busy machine from counting as a silence."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="reel-py-pair-")
        try:
            cls.w1, cls.w2 = (os.path.join(cls.dir, f"w{v}.safetensors") for v in (1, 2))
            for v, w in ((1, cls.w1), (2, cls.w2)):
                run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", 40 + v, "--out", w)
            cls.ctx, cls.lat = rand((5, 32), 2), rand((4, 2, 8, 8), 1)
            cls.pair = Pair(cls.dir, cls.w1)
        except BaseException:
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.pair.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def client(self, endpoints, **kw):
        kw.setdefault("timeout", 60)
        kw.setdefault("liveness", 1.0)
        return reel.Client(endpoints, **kw)

    def test_a_gen_through_the_pair_is_answered_by_the_active_broker_and_status_shows_it(self):
        p = self.pair
        with self.client(p.pair) as c:
            st = c.status()
            self.assertEqual((st.get("ha_state"), st.get("ha_role"), st.get("ha_term"), st.get("ha_peer")),
                             ("active", "primary", 1, "standby"), st)
            self.assertEqual([w.get("name") for w in st["workers"]], ["pw0"])
            r = c.gen("tiny", self.ctx, latent=self.lat, steps=3, shift=3.0)
            self.assertEqual(r.worker, "pw0")
            self.assertEqual((c.endpoint, c.switches), (p.ca, 0), "A answered: no move")
        # the standby first in the list: refused there, the client moves to A
        with self.client(f"{p.cb},{p.ca}") as c:
            self.assertEqual(c.endpoint, p.cb)
            again = c.gen("tiny", self.ctx, latent=self.lat, steps=3, shift=3.0)
            self.assertTrue(np.array_equal(again.latent, r.latent))
            self.assertEqual(c.endpoint, p.ca)
            self.assertGreaterEqual(c.switches, 1)
        with self.client(f"{p.cb},{p.ca}") as c:  # STATUS: the active one's, and the client stays there
            self.assertEqual(c.status().get("ha_state"), "active")
            self.assertEqual((c.endpoint, c.switches), (p.ca, 1))

    def test_the_standby_alone_answers_standby_naming_the_active_broker(self):
        p = self.pair
        with self.client(p.cb) as c:
            st = c.status()
            self.assertEqual((st.get("ha_state"), st.get("ha_role"), st.get("workers")), ("standby", "backup", []))
            t0 = time.monotonic()
            with self.assertRaises(reel.ReelError) as e:
                c.gen("tiny", self.ctx, latent=self.lat, steps=2)
            self.assertEqual(e.exception.code, "standby")
            self.assertIn(p.ca, e.exception.message)
            self.assertLess(time.monotonic() - t0, 10)
            with self.assertRaises(reel.ReelError) as e:
                c.sync(2, path=self.w2)
            self.assertEqual(e.exception.code, "standby")
            self.assertEqual(c.switches, 0)

    def test_syncs_by_path_and_by_value_through_the_pair_move_past_the_standby(self):
        p = self.pair
        with self.client(f"{p.cb},{p.ca}") as c:
            res = c.sync(2, path=self.w2)
            self.assertTrue(res.complete, res)
            self.assertEqual((res.applied, c.endpoint), (["pw0"], p.ca))
        with self.client(f"{p.cb},{p.ca}") as c:
            res = c.sync(3, path=self.w1, upload=True)  # refused by B, uploaded to A, fetched from A
            self.assertTrue(res.complete, res)
            self.assertEqual((res.applied, c.endpoint), (["pw0"], p.ca))
            self.assertGreaterEqual(c.switches, 1)
        with open(os.path.join(self.dir, "upa", "transformer-v3.safetensors"), "rb") as a, open(self.w1, "rb") as w:
            self.assertTrue(a.read() == w.read(), "A holds the upload byte for byte")
        self.assertEqual(os.listdir(os.path.join(self.dir, "upb")), [])
        with self.client(p.pair) as c:
            r = c.gen("tiny", self.ctx, latent=self.lat, steps=2, shift=3.0)
            self.assertEqual(r.version, 3)


class StandbyTakeoverTests(unittest.TestCase):
    """The active broker of a pair SIGKILLed while a client's GEN runs
    there: the client (given "A,B", liveness 0.3 s) moves to B, which takes
    over (the fencing rule: A silent past the peer timeout, and this client
    back with a GEN B refused), the worker moves too, and the GEN is
    answered once, bitwise the same request run again through the pair.
    Then a sync by value through the pair: A silent, the upload goes to B."""

    def test_the_active_broker_killed_under_a_gen_the_other_answers_it_once_and_bitwise(self):
        d = tempfile.mkdtemp(prefix="reel-py-takeover-")
        p = None
        try:
            w1, w2 = (os.path.join(d, f"w{v}.safetensors") for v in (1, 2))
            for v, w in ((1, w1), (2, w2)):
                run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", 50 + v, "--out", w)
            p = Pair(d, w1)
            kw = dict(context=rand((5, 32), 1), latent_shape=(4, 2, 8, 8), steps=8000, seed=21)  # ~1.5 s
            out, errors = {}, []

            def one():
                try:
                    with reel.Client(p.pair, timeout=120, liveness=0.3) as c:
                        out["r"] = c.gen("tiny", **kw)
                        out["switches"], out["endpoint"] = c.switches, c.endpoint
                except Exception as e:  # reported below
                    errors.append(e)

            t = threading.Thread(target=one)
            t.start()
            with reel.Client(p.ca, timeout=10, liveness=0) as c:  # until A's worker runs it
                end = time.monotonic() + 30
                while time.monotonic() < end and not sum(x.get("inflight", 0) for x in c.status()["workers"]):
                    time.sleep(0.02)
                self.assertTrue(sum(x.get("inflight", 0) for x in c.status()["workers"]), "the GEN runs at A")
            p.a.kill()
            p.a.wait(30)
            t.join(120)
            self.assertFalse(t.is_alive(), "the GEN was answered within its timeout")
            self.assertEqual(errors, [])
            self.assertTrue(wait_log(p.log("b"), r"reel-broker: active \(term 2\)", 1), p.tail("b"))
            self.assertGreaterEqual(out["switches"], 1, "the client moved")
            self.assertEqual(out["endpoint"], p.cb)
            with reel.Client(p.cb, timeout=10, liveness=0) as c:
                st = c.status()
            self.assertEqual((st.get("ha_state"), st.get("ha_term"), st.get("ha_peer")), ("active", 2, "silent"), st)
            self.assertEqual((st.get("requests_ok"), st.get("requests_failed")), (1, 0), "B answered it once")
            # the same request again through the pair (A first: silent, then B)
            with reel.Client(p.pair, timeout=120, liveness=0.3) as c:
                again = c.gen("tiny", **kw)
                self.assertEqual(c.endpoint, p.cb)
                self.assertTrue(np.array_equal(out["r"].latent, again.latent), "bitwise the request run again")
            # a sync by value through the pair: A silent, the upload goes to B
            with reel.Client(p.pair, timeout=60, liveness=0.3) as c:
                res = c.sync(2, path=w2, upload=True)
                self.assertTrue(res.complete, res)
                self.assertEqual(res.applied, ["pw0"])
                self.assertEqual(c.endpoint, p.cb)
                self.assertGreaterEqual(c.switches, 1)
                self.assertEqual(c.gen("tiny", **dict(kw, steps=2)).version, 2)
            with open(os.path.join(d, "upb", "transformer-v2.safetensors"), "rb") as a, open(w2, "rb") as w:
                self.assertTrue(a.read() == w.read(), "B holds the upload byte for byte")
        finally:
            if p:
                p.stop()
            shutil.rmtree(d, ignore_errors=True)


def make_keys(d):
    """A broker key and a client, trainer and worker key in d/keys."""
    k = os.path.join(d, "keys")
    for role in ("broker", "client", "trainer", "worker"):
        run(f"{BUILD}/reelctl", "keys", "new", "--role", role, "--out", k)
    return k


class CurveTests(unittest.TestCase):
    """A broker with keys: the client talks CURVE with its key; a client
    key may generate but not sync, a trainer key may; no key, no answer."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="reel-py-curve-")
        cls.w1 = os.path.join(cls.dir, "w1.safetensors")
        cls.w2 = os.path.join(cls.dir, "w2.safetensors")
        run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "7", "--out", cls.w1)
        run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "8", "--out", cls.w2)
        cls.keys = make_keys(cls.dir)
        cls.cluster = Cluster(cls.dir, cls.w1, keys=cls.keys)
        cls.ctx, cls.lat = rand((5, 32), 2), rand((4, 2, 8, 8), 1)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_a_client_key_generates_over_curve(self):
        with self.cluster.client("client", timeout=60) as c:
            r = c.gen("tiny", self.ctx, latent=self.lat, steps=2, shift=3.0)
        self.assertEqual(r.worker, "py0")
        self.assertEqual(r.latent.shape, (4, 2, 8, 8))

    def test_a_client_key_may_not_sync_and_a_trainer_key_may(self):
        with self.cluster.client("client", timeout=30) as c:
            with self.assertRaises(reel.ReelError) as e:
                c.sync(2, path=self.w2)
        self.assertEqual(e.exception.code, "forbidden")
        with self.cluster.client("trainer", timeout=30) as c:
            res = c.sync(2, path=self.w2)
        self.assertTrue(res.complete, res)

    def test_keys_from_the_environment(self):
        env = {"REEL_KEY": os.path.join(self.keys, "client.key"),
               "REEL_BROKER_KEY": os.path.join(self.keys, "broker.pub")}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with reel.Client(self.cluster.ce, timeout=10) as c:
                self.assertIn("py0", [w.get("name") for w in c.status().get("workers", [])])
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_without_a_key_the_broker_never_answers(self):
        with reel.Client(self.cluster.ce, timeout=1) as c:
            with self.assertRaises(reel.ReelTimeout) as e:
                c.status(timeout=1)
        # the socket's monitor saw why: the timeout says it
        # (libzmq tells a mechanism mismatch, or the broker hanging up first: both name the keys)
        self.assertRegex(str(e.exception), "requires CURVE keys and this client has none")

    def test_a_refused_key_or_another_brokers_key_is_named_in_the_timeout(self):
        other = os.path.join(self.dir, "other")
        run(f"{BUILD}/reelctl", "keys", "new", "--role", "client", "--name", "stranger", "--out", other)
        run(f"{BUILD}/reelctl", "keys", "new", "--role", "broker", "--name", "elsewhere", "--out", other)
        cases = [(os.path.join(other, "stranger.key"), os.path.join(self.keys, "broker.pub"),
                  "the broker refused this client's key at the handshake (ZAP status 400"),
                 (os.path.join(self.keys, "client.key"), os.path.join(other, "elsewhere.pub"),
                  "is probably not its public key")]
        for key, broker_key, said in cases:
            with reel.Client(self.cluster.ce, timeout=2, key=key, broker_key=broker_key) as c:
                with self.assertRaises(reel.ReelTimeout) as e:
                    c.status(timeout=2)
            self.assertIn(said, str(e.exception))
        with self.cluster.client("client", timeout=30) as c:  # the right keys: no hint, an answer
            self.assertIn("py0", [w.get("name") for w in c.status().get("workers", [])])

    def test_a_key_refused_then_added_and_reloaded_is_admitted_at_the_same_clients_next_call(self):
        # libzmq never retries a handshake the broker's ZAP handler refused:
        # the socket stayed dead, and every later call of the client timed
        # out, even once its key was added and the broker reloaded (SIGHUP).
        # A call on such a socket now opens a fresh one (same keys), and so
        # does a call whose socket is refused while it waits (0.1 s, then
        # twice as long each time up to 1 s: a few handshakes in 2 s, not a
        # loop); its timeout still says the key was refused.
        later = os.path.join(self.dir, "later")
        run(f"{BUILD}/reelctl", "keys", "new", "--role", "client", "--name", "late", "--out", later)
        said = "the broker refused this client's key at the handshake (ZAP status 400"
        blog = os.path.join(self.dir, "broker.log")
        with reel.Client(self.cluster.ce, timeout=2, key=os.path.join(later, "late.key"),
                         broker_key=os.path.join(self.keys, "broker.pub")) as c:
            fresh = 0
            for _ in range(2):  # the second call on a fresh socket, refused again
                with self.assertRaises(reel.ReelTimeout) as e:
                    c.status()
                self.assertIn(said, str(e.exception))
                self.assertGreaterEqual(c._fresh, fresh + 1)  # tried again during the call
                self.assertLessEqual(c._fresh, fresh + 8)  # with backoff
                fresh = c._fresh
            with open(blog, errors="replace") as f:
                reloads = sum(1 for ln in f if "SIGHUP: keys reloaded" in ln)
            shutil.copy(os.path.join(later, "late.pub"), self.keys)
            self.cluster.broker.send_signal(signal.SIGHUP)
            self.assertTrue(wait_log(blog, r"SIGHUP: keys reloaded from .*: 4 keys", 60, self.cluster.broker,
                                     count=reloads + 1), "the broker did not reload its keys")
            self.assertIn("py0", [w.get("name") for w in c.status(timeout=30).get("workers", [])])
            self.assertEqual(c._fresh, fresh + 1)  # the call's first socket: a fresh one

    def test_a_key_reloaded_while_a_call_waits_lets_that_call_through(self):
        # A call whose socket the broker refused never tried again during
        # the call: its key added and the broker reloaded meanwhile, the
        # call still timed out (only the next call was admitted). It now
        # tries a fresh socket (0.1 s, doubling to 1 s) until its timeout.
        # A STATUS and a GEN (liveness 0.3 s: its STATUS pings and resends
        # go on the fresh sockets too), of two clients, wait up to 60 s; the
        # key is added once each has tried two fresh sockets, and both are
        # answered soon after.
        later = os.path.join(self.dir, "later2")
        run(f"{BUILD}/reelctl", "keys", "new", "--role", "client", "--name", "waiter", "--out", later)
        blog = os.path.join(self.dir, "broker.log")
        got = {}
        keys = dict(key=os.path.join(later, "waiter.key"), broker_key=os.path.join(self.keys, "broker.pub"))
        with reel.Client(self.cluster.ce, timeout=60, **keys) as c, \
                reel.Client(self.cluster.ce, timeout=60, liveness=0.3, **keys) as g:
            def call(name, fn):
                try:
                    got[name] = fn()
                except BaseException as e:  # (said below)
                    got[name + " error"] = e
            ts = [threading.Thread(target=call, args=("status", lambda: c.status(timeout=60))),
                  threading.Thread(target=call, args=("gen", lambda: g.gen("tiny", self.ctx, latent=self.lat, steps=2,
                                                                           shift=3.0, timeout=60)))]
            t0 = time.monotonic()
            for t in ts:
                t.start()
            while min(c._fresh, g._fresh) < 2 and all(t.is_alive() for t in ts) and time.monotonic() - t0 < 20:
                time.sleep(0.02)
            retried = (c._fresh, g._fresh)
            with open(blog, errors="replace") as f:
                reloads = sum(1 for ln in f if "SIGHUP: keys reloaded" in ln)
            shutil.copy(os.path.join(later, "waiter.pub"), self.keys)
            self.cluster.broker.send_signal(signal.SIGHUP)
            reloaded = wait_log(blog, r"SIGHUP: keys reloaded", 60, self.cluster.broker, count=reloads + 1)
            for t in ts:
                t.join(70)
            self.assertTrue(reloaded, "the broker did not reload its keys")
            self.assertGreaterEqual(min(retried), 2, f"the waiting calls tried no fresh socket after their key was "
                                    f"refused: {retried}")
            self.assertEqual(sorted(got), ["gen", "status"], got)
            self.assertIn("py0", [w.get("name") for w in got["status"].get("workers", [])])
            self.assertEqual(got["gen"].latent.shape, (4, 2, 8, 8))
            self.assertLess(time.monotonic() - t0, 40)

    def test_without_a_key_each_call_after_the_first_times_out_too_instead_of_blocking_in_a_send(self):
        # After the broker refuses the handshake the DEALER has no pipe: a
        # blocking send would wait forever. The calls run in a child process
        # that the test kills after 60 s (a hang is a failure, not a stuck test).
        up = os.path.join(self.dir, "up.bin")
        with open(up, "wb") as f:
            f.write(b"x" * 1000)
        script = f"""
import json, sys, time
import numpy as np
sys.path.insert(0, {os.path.dirname(HERE)!r})
import reel
ctx, lat = np.zeros((5, 32), np.float32), np.zeros((4, 2, 8, 8), np.float32)
out = []
for liveness in (None, 0.3):
    with reel.Client({self.cluster.ce!r}, timeout=1, liveness=liveness) as c:
        for name, call in (("status", lambda: c.status(timeout=1)),
                           ("gen", lambda: c.gen("tiny", ctx, latent=lat, steps=2, timeout=1.5)),
                           ("status", lambda: c.status(timeout=1)),
                           ("upload", lambda: c.upload(9, {up!r}, timeout=1)),
                           ("gen", lambda: c.gen("tiny", ctx, latent=lat, steps=2, timeout=1.5))):
            t0 = time.monotonic()
            try:
                call()
                why = "answered"
            except reel.ReelTimeout:
                why = "timeout"
            out.append([name, why, time.monotonic() - t0])
print(json.dumps(out))
"""
        try:
            p = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("a call of a client without a key blocked past every timeout")
        self.assertEqual(p.returncode, 0, p.stdout.decode()[-2000:])
        calls = json.loads(p.stdout.decode().strip().splitlines()[-1])
        self.assertEqual(len(calls), 10)
        for name, why, secs in calls:
            self.assertEqual(why, "timeout", calls)
            self.assertLess(secs, 4.0, f"{name} took {secs:.1f} s for a timeout of at most 1.5 s")

    def test_the_socket_of_a_move_to_another_endpoint_keeps_the_keys(self):
        ce = self.cluster.ce
        with self.cluster.client("client", timeout=10) as c0, reel.Client(
                f"{ce},{ce}", timeout=10, key=os.path.join(self.keys, "client.key"),
                broker_key=os.path.join(self.keys, "broker.pub")) as c:
            self.assertEqual(c.status().get("workers", [{}])[0].get("name"), "py0")
            c._switch()  # what a standby answer or a silence does: a new socket, the next endpoint
            self.assertEqual((c.switches, c.endpoint), (1, ce))
            r = c.gen("tiny", self.ctx, latent=self.lat, steps=2, shift=3.0)
            self.assertTrue(np.array_equal(r.latent, c0.gen("tiny", self.ctx, latent=self.lat, steps=2,
                                                            shift=3.0).latent))

    def test_keys_that_cannot_be_a_clients_are_refused_before_connecting(self):
        k = self.keys
        with self.assertRaises(ValueError):  # a worker's key
            reel.Client(self.cluster.ce, key=os.path.join(k, "worker.key"), broker_key=os.path.join(k, "broker.pub"))
        with self.assertRaises(ValueError):  # a peer's public key as the broker's
            reel.Client(self.cluster.ce, key=os.path.join(k, "client.key"), broker_key=os.path.join(k, "client.pub"))
        with self.assertRaises(ValueError):  # one without the other
            reel.Client(self.cluster.ce, key=os.path.join(k, "client.key"), broker_key=None)


def make_text_video_parts(d):
    """A DiT config with text_len, a umT5 encoder (t5-tiny), its tokenizer
    (trained here with spm_train, umT5's special ids) and a VAE (vae-tiny):
    the small stand-ins of a Wan2.1 release's parts."""
    corpus = os.path.join(d, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("a cat on a skateboard in the park\nthe quick brown fox jumps over the lazy dog\n"
                "a red car driving at night in the rain\nmountains, rivers and a blue sky at dawn\n")
        for i in range(40):
            f.write(f"line {i} with words like ocean mountain river sky cloud sun moon star tree flower bird\n")
    run("spm_train", f"--input={corpus}", f"--model_prefix={d}/spiece", "--vocab_size=300", "--model_type=unigram",
        "--pad_id=0", "--eos_id=1", "--unk_id=2", "--bos_id=-1", "--byte_fallback=true", "--character_coverage=1.0",
        "--hard_vocab_limit=false")
    cfg = os.path.join(d, "tinyt.json")
    with open(cfg, "w") as f:
        json.dump({"name": "tinyt", "dim": 64, "heads": 4, "layers": 2, "ffn_dim": 128, "in_channels": 4,
                   "text_dim": 32, "freq_dim": 256, "text_len": 16}, f)
    parts = {k: os.path.join(d, f"{k}.safetensors") for k in ("dit", "t5", "vae")}
    run(f"{BUILD}/reelctl", "weights", "init", "--config", cfg, "--seed", "7", "--out", parts["dit"])
    run(f"{BUILD}/reelctl", "weights", "init-t5", "--config", "t5-tiny", "--seed", "3", "--out", parts["t5"])
    run(f"{BUILD}/reelctl", "weights", "init-vae", "--config", "vae-tiny", "--seed", "5", "--out", parts["vae"])
    parts["tokenizer"] = os.path.join(d, "spiece.model")
    return parts


def frames_of(video):
    """[3, F, H, W] in [-1, 1] to uint8 [F, H, W, 3] as Wan's cache_video
    does, in float32: clamp, (x + 1) / 2, x 255, truncate."""
    x = np.clip(video.astype(np.float32), np.float32(-1), np.float32(1))
    x = (x + np.float32(1)) / np.float32(2)
    x = np.clip(x, np.float32(0), np.float32(1)) * np.float32(255)
    return x.astype(np.uint8).transpose(1, 2, 3, 0)


class PromptTests(unittest.TestCase):
    """Prompt in, frames or a video out (issue 26): a worker with a text
    encoder and a VAE; every latent bitwise reelctl run --prompt, every
    frame the decode of that latent."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="reel-pyt2v-")
        cls.p = make_text_video_parts(cls.dir)
        cls.cluster = Cluster(cls.dir, cls.p["dit"], worker_flags=("--t5", cls.p["t5"], "--tokenizer",
                                                                    cls.p["tokenizer"], "--vae", cls.p["vae"]))
        cls.c = reel.Client(cls.cluster.ce, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.cluster.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_prompt(self, prompt, out, cfg=None, neg=None, seed=1):
        args = [f"{BUILD}/reelctl", "run", "--weights", self.p["dit"], "--t5", self.p["t5"], "--tokenizer",
                self.p["tokenizer"], "--vae", self.p["vae"], "--prompt", prompt, "--size", "2x8x8", "--seed", seed,
                "--steps", "4", "--shift", "3", "--out", out]
        if cfg is not None:
            args += ["--cfg", cfg]
        if neg is not None:
            args += ["--negative-prompt", neg]
        run(*args)

    def test_prompt_to_frames_equals_reelctl_run_and_the_decoded_latent(self):
        r = self.c.gen("tinyt", prompt="a cat on a skateboard", cfg=4.0, negative_prompt="blurry", steps=4,
                       shift=3.0, seed=1, latent_shape=(4, 2, 8, 8), output="frames")
        self.assertEqual(r.frames.shape, (5, 64, 64, 3))
        self.assertEqual(r.frames.dtype, np.uint8)
        out = os.path.join(self.dir, "run.mp4")
        self.run_prompt("a cat on a skateboard", out, cfg=4, neg="blurry")
        ref, _ = safetensors.load(out + ".safetensors")
        self.assertTrue(np.array_equal(r.latent, ref["latent"]), "the latent differs from reelctl run --prompt")
        dec = os.path.join(self.dir, "dec.safetensors")
        lat = os.path.join(self.dir, "lat-t2v.safetensors")
        safetensors.save(lat, {"latent": r.latent})
        run(f"{BUILD}/reelctl", "decode", "--vae", self.p["vae"], lat, "-o", dec, "--quiet")
        v, _ = safetensors.load(dec)
        self.assertTrue(np.array_equal(r.frames, frames_of(v["video"])), "frames are not the decoded latent")
        self.assertGreater(r.decode_seconds, 0.0)
        self.assertGreater(r.encode_seconds, 0.0)

    def test_a_video_output_is_an_mp4_of_the_decoded_frames(self):
        r = self.c.gen("tinyt", prompt="a red car at night", steps=3, seed=2, latent_shape=(4, 3, 8, 8),
                       output="video")
        self.assertIsNone(r.frames)
        self.assertEqual(r.video[4:8], b"ftyp")
        path = os.path.join(self.dir, "v.mp4")
        with open(path, "wb") as f:
            f.write(r.video)
        p = run(f"{BUILD}/reelctl", "video", "probe", path, "--json")
        info = json.loads(p.stdout.decode().strip().splitlines()[0])
        self.assertEqual((info["frames"], info["height"], info["width"], info["codec"]), (9, 64, 64, "h264"))

    def test_guidance_without_a_negative_prompt_uses_wans_default(self):
        r = self.c.gen("tinyt", prompt="mountains at dawn", cfg=5.0, steps=3, shift=3.0, seed=4,
                       latent_shape=(4, 2, 8, 8))
        out = os.path.join(self.dir, "neg.mp4")
        self.run_prompt("mountains at dawn", out, cfg=5, seed=4)  # reelctl run also defaults to Wan's
        ref, _ = safetensors.load(out + ".safetensors")
        self.assertFalse(np.array_equal(r.latent, ref["latent"]))  # 3 steps vs 4: differ
        r4 = self.c.gen("tinyt", prompt="mountains at dawn", cfg=5.0, steps=4, shift=3.0, seed=4,
                        latent_shape=(4, 2, 8, 8))
        self.assertTrue(np.array_equal(r4.latent, ref["latent"]))
        other = self.c.gen("tinyt", prompt="mountains at dawn", cfg=5.0, negative_prompt="a cat", steps=4,
                           shift=3.0, seed=4, latent_shape=(4, 2, 8, 8))
        self.assertFalse(np.array_equal(other.latent, r4.latent), "a negative prompt changes nothing")

    def test_progress_counts_the_steps_then_the_decodes_latent_frames(self):
        seen = []
        r = self.c.gen("tinyt", prompt="a red car at night", steps=3, seed=2, latent_shape=(4, 3, 8, 8),
                       output="frames", progress=lambda step, steps: seen.append((step, steps)))
        self.assertEqual(r.frames.shape, (9, 64, 64, 3))
        # the steps (of 3), then the decode's 3 latent frames after them (of 3 + 3)
        self.assertEqual(seen[-4:], [(3, 3), (4, 6), (5, 6), (6, 6)], f"progress: {seen}")
        self.assertEqual([a for a, _ in seen], sorted(a for a, _ in seen))
        seen.clear()
        self.c.gen("tinyt", prompt="a red car at night", steps=3, seed=2, latent_shape=(4, 3, 8, 8),
                   progress=lambda step, steps: seen.append((step, steps)))
        self.assertEqual(seen[-1], (3, 3), "a latent output reports the steps only")

    def test_gen_many_progress_counts_each_decodes_latent_frames_and_never_passes_or_goes_back_from_its_total(self):
        """gen_many's total counts a decoded output's latent frames as
        gen()'s progress does (the decode's PROGRESS counts past the
        steps): before, the total was the steps alone, the count passed it
        during a decode and went back at the RESULT."""
        reqs = [dict(model="tinyt", prompt="a red car at night", steps=3, seed=2, latent_shape=(4, 3, 8, 8),
                     output="frames"),
                dict(model="tinyt", prompt="a red car at night", steps=2, seed=3, latent_shape=(4, 3, 8, 8))]
        seen = []
        out = self.c.gen_many(reqs, window=1, progress=lambda done, total: seen.append((done, total)))
        self.assertEqual({t for _, t in seen}, {3 + 3 + 2}, f"one total, the decode's frames in it: {seen}")
        self.assertEqual([d for d, _ in seen], sorted(d for d, _ in seen), f"progress went back: {seen}")
        self.assertEqual(seen[-1], (8, 8))
        self.assertEqual(out[0].frames.shape, (9, 64, 64, 3))

    def test_a_group_of_one_prompt_returns_each_samples_frames(self):
        rs = self.c.gen_group("tinyt", prompt="a cat on a skateboard", n=2, seeds=[5, 6], steps=3,
                              latent_shape=(4, 2, 8, 8), output="frames")
        self.assertEqual([r.frames.shape for r in rs], [(5, 64, 64, 3)] * 2)
        one = self.c.gen("tinyt", prompt="a cat on a skateboard", steps=3, seed=6, latent_shape=(4, 2, 8, 8),
                         output="frames")
        self.assertTrue(np.array_equal(rs[1].frames, one.frames))

    def test_a_prompt_alone_samples_with_wans_text_to_video_defaults(self):
        alone = self.c.gen("tinyt", prompt="a cat on a skateboard", seed=3, latent_shape=(4, 2, 8, 8))
        given = self.c.gen("tinyt", prompt="a cat on a skateboard", seed=3, latent_shape=(4, 2, 8, 8), steps=50,
                           shift=5.0, cfg=5.0, solver="unipc")
        self.assertTrue(np.array_equal(alone.latent, given.latent), "not unipc, 50 steps, shift 5, cfg 5")
        out = os.path.join(self.dir, "alone.safetensors")
        run(f"{BUILD}/reelctl", "run", "--weights", self.p["dit"], "--t5", self.p["t5"], "--tokenizer",
            self.p["tokenizer"], "--vae", self.p["vae"], "--prompt", "a cat on a skateboard", "--size", "2x8x8",
            "--seed", "3", "--out", out)
        ref, _ = safetensors.load(out)
        self.assertTrue(np.array_equal(alone.latent, ref["latent"]), "reelctl run --prompt alone differs")
        with self.assertRaises(TypeError):  # a context has no defaults: steps are the caller's
            self.c.gen("tinyt", rand((5, 32), 1), latent_shape=(4, 2, 8, 8))
        # gen_group takes gen's defaults too (it refused a prompt without steps: helper-76), batched or not
        for batched in (True, False):
            g = self.c.gen_group("tinyt", prompt="a cat on a skateboard", n=2, seed=3, latent_shape=(4, 2, 8, 8),
                                 batched=batched)
            self.assertTrue(np.array_equal(g[0].latent, alone.latent), f"batched={batched}: sample 0 is gen's")
        with self.assertRaises(TypeError) as e:
            self.c.gen_group("tinyt", rand((5, 32), 1), n=2, latent_shape=(4, 2, 8, 8))
        self.assertIn("steps", str(e.exception))
        with self.assertRaises(TypeError):  # a flag is a bool
            self.c.gen_group("tinyt", prompt="x", n=2, steps=2, latent_shape=(4, 2, 8, 8), batched="no")

    def test_prompt_arguments_are_checked_before_sending(self):
        ctx = rand((5, 32), 1)
        for kw in ({"prompt": "x", "context": ctx}, {"negative_prompt": "x", "context": ctx},
                   {"prompt": "x", "output": "gif"}, {}):
            with self.assertRaises(ValueError, msg=str(kw)):
                self.c.gen("tinyt", steps=2, latent_shape=(4, 2, 8, 8), **kw)
        # a negative prompt without guidance: nothing would read it (reelctl refuses it too)
        for cfg in (1, 1.0):
            with self.assertRaises(ValueError, msg=f"cfg={cfg}") as e:
                self.c.gen("tinyt", prompt="x", negative_prompt="blurry", cfg=cfg, steps=2, latent_shape=(4, 2, 8, 8))
            self.assertIn("used only with guidance", str(e.exception))
        # an empty prompt: a GEN reads it as none, so the broker would answer
        # "missing tensor 'context'" (reelctl run and gen refuse it too, exit
        # 2): the message says how to send Wan's empty-prompt context
        for call in (lambda: self.c.gen("tinyt", prompt="", steps=2, latent_shape=(4, 2, 8, 8)),
                     lambda: self.c.gen_group("tinyt", prompt="", n=2, steps=2, latent_shape=(4, 2, 8, 8))):
            with self.assertRaises(ValueError) as e:
                call()
            self.assertIn("prompt is empty: a GEN reads an empty prompt as none", str(e.exception))
            self.assertIn("reelctl encode --t5 T5 --tokenizer PATH --prompt '' -o C.safetensors and pass its "
                          "tensor 'context' as context=", str(e.exception))
        # a video is one sample's MP4: a batched group asks for frames (the
        # broker's bad_request, said before sending); n separate GENs may
        with self.assertRaises(ValueError) as e:
            self.c.gen_group("tinyt", prompt="x", n=2, steps=2, latent_shape=(4, 2, 8, 8), output="video")
        self.assertIn("a group (n=2) asks for output='frames'", str(e.exception))
        rs = self.c.gen_group("tinyt", prompt="x", n=2, steps=2, latent_shape=(4, 2, 8, 8), output="video",
                              batched=False)
        self.assertTrue(all(bytes(r.video[4:8]) == b"ftyp" for r in rs), "each sample's MP4")

    def test_bad_text_is_refused_here_and_by_the_broker_and_the_cluster_keeps_serving(self):
        # the client refuses what the broker would, before sending: the
        # broker's rule (4096 bytes; control characters but tab, newline, CR)
        bad = {"x" * 4097: "4097 bytes: at most 4096", "\u00e9" * 2049: "4098 bytes: at most 4096",
               "a bell \x07": "U+0007 at character 7", "del \x7f": "U+007F", "next line \x85": "U+0085",
               "escape \x1b[31m": "U+001B"}
        for text, needle in bad.items():
            for kw in ({"prompt": text}, {"prompt": "fine", "negative_prompt": text, "cfg": 5.0}):
                with self.assertRaises(ValueError, msg=repr(kw)[:60]) as e:
                    self.c.gen("tinyt", steps=2, latent_shape=(4, 2, 8, 8), **kw)
                self.assertIn(needle, str(e.exception))
        r = self.c.gen("tinyt", prompt="x" * 4096, steps=1, latent_shape=(4, 2, 8, 8))
        self.assertEqual(r.latent.shape, (4, 2, 8, 8))
        r = self.c.gen("tinyt", prompt="tab\tnewline\nreturn\r", steps=1, latent_shape=(4, 2, 8, 8))
        self.assertEqual(r.latent.shape, (4, 2, 8, 8))
        # and the broker refuses them itself, for clients without the check
        with mock.patch.object(reel.client, "_prompt_text", lambda name, v: v):
            with self.assertRaises(reel.ReelError) as e:
                self.c.gen("tinyt", prompt="x" * 20000, steps=2, latent_shape=(4, 2, 8, 8))
            self.assertEqual(e.exception.code, "too_large")
            with self.assertRaises(reel.ReelError) as e:
                self.c.gen("tinyt", prompt="a bell \x07", steps=2, latent_shape=(4, 2, 8, 8))
            self.assertEqual(e.exception.code, "bad_request")
            self.assertIn("control characters", str(e.exception))
        r = self.c.gen("tinyt", prompt="still serving", steps=2, latent_shape=(4, 2, 8, 8))
        self.assertEqual(r.latent.shape, (4, 2, 8, 8))


class LoraTests(unittest.TestCase):
    """LoRA syncs (issue 27): a PEFT state dict published with sync_lora,
    merged by a worker run with --lora; every GEN bitwise reelctl run
    --lora on the folder it was written to; the base back; refusals."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="reel-pylora-")
        cls.w = os.path.join(cls.dir, "base.safetensors")
        run(f"{BUILD}/reelctl", "weights", "init", "--config", "tiny", "--seed", "7", "--out", cls.w)
        cls.ctx, cls.lat = rand((5, 32), 2), rand((4, 1, 8, 8), 1)
        safetensors.save(os.path.join(cls.dir, "ctx.safetensors"), {"context": cls.ctx})
        safetensors.save(os.path.join(cls.dir, "lat.safetensors"), {"latent": cls.lat})
        os.makedirs(os.path.join(cls.dir, "up"))
        cls.cluster = Cluster(cls.dir, cls.w, broker_flags=("--weights-dir", os.path.join(cls.dir, "up")),
                              worker_flags=("--lora",))
        cls.c = reel.Client(cls.cluster.ce, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.cluster.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def adapter(self, seed, modules=("q", "k", "v", "o"), r=4, torch_tensors=False):
        rng = np.random.default_rng(seed)
        sd = {}
        for n in range(2):
            for m in modules:
                key = f"base_model.model.blocks.{n}.self_attn.{m}"
                sd[key + ".lora_A.weight"] = (rng.standard_normal((r, 64)) * 0.2).astype(np.float32)
                sd[key + ".lora_B.weight"] = (rng.standard_normal((64, r)) * 0.2).astype(np.float32)
        if torch_tensors:
            import torch
            sd = {k: torch.from_numpy(v) for k, v in sd.items()}
        return sd

    def reference(self, lora=None):
        out = os.path.join(self.dir, f"ref-{time.monotonic_ns()}.safetensors")
        args = [f"{BUILD}/reelctl", "run", "--weights", self.w, "--context", os.path.join(self.dir, "ctx.safetensors"),
                "--latent", os.path.join(self.dir, "lat.safetensors"), "--steps", "3", "--shift", "3", "--out", out]
        if lora:
            args += ["--lora", lora]
        run(*args)
        return safetensors.load(out)[0]["latent"]

    def gen(self):
        return self.c.gen("tiny", self.ctx, latent=self.lat, steps=3, shift=3.0).latent

    def next_version(self):
        return (self.c.status().get("versions", {}).get("transformer") or 1) + 1

    def test_a_state_dict_adapter_is_merged_and_back_to_the_base(self):
        base = self.gen()
        self.assertTrue(np.array_equal(base, self.reference()))
        try:
            import torch  # noqa: F401
            torch_ok = True
        except ImportError:
            torch_ok = False
        v = self.next_version()
        res = self.c.sync_lora(v, 1, lora=self.adapter(1, torch_tensors=torch_ok),
                               lora_config={"r": 4, "lora_alpha": 8, "target_modules": ["q", "k", "v", "o"]},
                               weights_dir=self.dir)
        self.assertTrue(res.complete, res)
        folder = os.path.join(self.dir, f"transformer-v{v}-lora")
        got = self.gen()
        self.assertTrue(np.array_equal(got, self.reference(folder)), "GEN after the LoRA sync != run --lora")
        self.assertFalse(np.array_equal(got, base))
        # a PEFT folder by path, then the base again
        v2 = self.next_version()
        self.c.sync_lora(v2, 1, lora=folder)
        self.assertTrue(np.array_equal(self.gen(), got))
        ident = reel.checkpoint_identity(self.w)
        self.c.sync_lora(self.next_version(), 1, base_sha256=ident)
        self.assertTrue(np.array_equal(self.gen(), base), "the base again is not the base")

    def test_an_adapter_by_value_is_uploaded_and_merged(self):
        v = self.next_version()
        sd = self.adapter(5, modules=("q", "o"), r=2)
        cfg = {"r": 2, "lora_alpha": 3, "use_rslora": True}
        res = self.c.sync(v, lora=sd, lora_config=cfg, base=1, upload=True)  # its folder made and removed here
        self.assertTrue(res.complete, res)
        folder = tempfile.mkdtemp(dir=self.dir)  # the same adapter, for the reference run
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            json.dump(dict(cfg, peft_type="LORA"), f)
        safetensors.save(os.path.join(folder, "adapter_model.safetensors"), sd)
        self.assertTrue(np.array_equal(self.gen(), self.reference(folder)), "GEN after an uploaded adapter != run --lora")

    def test_a_comfyui_lora_file_without_a_config_by_path_and_by_value(self):
        """A ComfyUI Wan LoRA (one .safetensors: diffusion_model. keys,
        lora_down/lora_up, a module's alpha; no adapter_config.json) by
        path and by value: the workers take the file's own ranks and
        alphas, every GEN bitwise reelctl run --lora on the same file."""
        rng = np.random.default_rng(9)
        sd = {}
        for n in range(2):
            for m, alpha in (("self_attn.q", 16.0), ("cross_attn.o", None)):
                key = f"diffusion_model.blocks.{n}.{m}"
                sd[key + ".lora_down.weight"] = (rng.standard_normal((4, 64)) * 0.2).astype(np.float32)
                sd[key + ".lora_up.weight"] = (rng.standard_normal((64, 4)) * 0.2).astype(np.float32)
                if alpha is not None:
                    sd[key + ".alpha"] = np.array(alpha, np.float32)
        folder = tempfile.mkdtemp(dir=self.dir)
        f = os.path.join(folder, "wan_lora.safetensors")
        safetensors.save(f, sd)
        want = self.reference(f)
        res = self.c.sync_lora(self.next_version(), 1, lora=f)
        self.assertTrue(res.complete, res)
        self.assertTrue(np.array_equal(self.gen(), want), "GEN after a ComfyUI LoRA by path != run --lora")
        self.c.sync_lora(self.next_version(), 1, base_sha256=reel.checkpoint_identity(self.w))
        res = self.c.sync_lora(self.next_version(), 1, lora=f, upload=True)
        self.assertTrue(res.complete, res)
        self.assertTrue(np.array_equal(self.gen(), want), "GEN after a ComfyUI LoRA by value != run --lora")
        # a state dict with lora_config=None: its own ranks, s = 1 (diffusers'
        # file name in the folder written), by path, as run --lora reads it
        v = self.next_version()
        res = self.c.sync_lora(v, 1, lora=self.adapter(8, modules=("q",)), weights_dir=self.dir)
        self.assertTrue(res.complete, res)
        folder = os.path.join(self.dir, f"transformer-v{v}-lora")
        self.assertFalse(os.path.exists(os.path.join(folder, "adapter_config.json")))
        self.assertTrue(np.array_equal(self.gen(), self.reference(folder)), "a config-less state dict != run --lora")
        self.c.sync_lora(self.next_version(), 1, base_sha256=reel.checkpoint_identity(self.w))  # the base again

    def test_the_grpo_example_trains_and_publishes_an_adapter_run_after_run(self):
        # last of LoraTests: the runs without --base make another version the workers' base
        ex = os.path.join(os.path.dirname(HERE), "examples", "grpo_loop.py")
        v, base = self.next_version(), 1  # the worker's base: its startup weights (no full sync here)
        p = subprocess.run([sys.executable, ex, "--broker", self.cluster.ce, "--weights", self.w, "--model", "tiny",
                            "--iters", "2", "--group", "2", "--latent", "1x4x4", "--weights-dir", self.dir, "--rank", "4",
                            "--base", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 0, out)
        self.assertIn(f"published v{v} (adapter on base v{base})", out)
        self.assertIn(f"the next rollouts ran on v{v + 1} (published last: v{v + 1})", out)
        # Without --base, run after run: the current version is the last
        # run's adapter, no base; each run publishes --weights as its base.
        for run_ in range(2):
            v = self.next_version()
            p = subprocess.run([sys.executable, ex, "--broker", self.cluster.ce, "--weights", self.w, "--model",
                                "tiny", "--iters", "2", "--group", "2", "--latent", "1x4x4", "--weights-dir", self.dir,
                                "--rank", "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
            out = p.stdout.decode()
            self.assertEqual(p.returncode, 0, f"run {run_ + 1} without --base: {out}")
            self.assertIn(f"published v{v} (the base: {self.w} whole)", out)
            self.assertIn(f"published v{v + 1} (adapter on base v{v})", out)
            self.assertIn(f"the next rollouts ran on v{v + 2} (published last: v{v + 2})", out)

    def test_a_thousand_alternating_adapter_syncs_leave_the_output_bitwise_the_first(self):
        folders = []
        for seed in (11, 12):
            d = tempfile.mkdtemp(dir=self.dir)
            with open(os.path.join(d, "adapter_config.json"), "w") as f:
                json.dump({"peft_type": "LORA", "r": 4, "lora_alpha": 8}, f)
            safetensors.save(os.path.join(d, "adapter_model.safetensors"), self.adapter(seed))
            folders.append(d)
        v = self.next_version()
        self.c.sync_lora(v, 1, lora=folders[0])
        first = self.gen()
        # W + s*B@A merged by numpy into a full file: GEN matches it to float rounding
        w, meta = safetensors.load(self.w)
        a_sd = self.adapter(11)
        for n in range(2):
            for m in ("q", "k", "v", "o"):
                key = f"base_model.model.blocks.{n}.self_attn.{m}"
                name = f"blocks.{n}.self_attn.{m}.weight"
                w[name] = (w[name].astype(np.float64) + 2.0 * (a_sd[key + ".lora_B.weight"].astype(np.float64) @
                                                               a_sd[key + ".lora_A.weight"])).astype(np.float32)
        merged = os.path.join(self.dir, "merged.safetensors")
        safetensors.save(merged, w, meta)
        out = os.path.join(self.dir, "merged-run.safetensors")
        run(f"{BUILD}/reelctl", "run", "--weights", merged, "--context", os.path.join(self.dir, "ctx.safetensors"),
            "--latent", os.path.join(self.dir, "lat.safetensors"), "--steps", "3", "--shift", "3", "--out", out)
        ref = safetensors.load(out)[0]["latent"]
        err = float(np.max(np.abs(first - ref)) / np.max(np.abs(ref)))
        self.assertLess(err, 1e-4, f"GEN after the LoRA sync vs the merged full file: rel. err {err}")
        for i in range(1, 1001):  # the other adapter, then this one, ... ending on this one (i = 1000)
            v += 1
            self.c.sync_lora(v, 1, lora=folders[i % 2])
            if i == 1:
                self.assertFalse(np.array_equal(self.gen(), first), "the second adapter changed nothing")
        self.assertTrue(np.array_equal(self.gen(), first), "1000 syncs later the adapter's output moved")

    def test_adapter_arguments_are_checked_before_any_file_is_written_or_uploaded(self):
        cfg = {"r": 4, "lora_alpha": 8}
        tmp = tempfile.mkdtemp(dir=self.dir)
        old_tmp, tempfile.tempdir = tempfile.tempdir, tmp  # where a folder made here would go
        try:
            v = self.next_version()
            t0 = time.monotonic()
            with self.assertRaises(ValueError) as e:  # the broker would refuse it only after the upload
                self.c.sync_lora(v, v, lora=self.adapter(6), lora_config=cfg, upload=True)
            self.assertIn(f"base ({v}) must be below version ({v})", str(e.exception))
            with self.assertRaises(ValueError) as e:
                self.c.sync_lora(v, 1, lora={}, lora_config=cfg, upload=True)
            self.assertIn("no LoRA tensors", str(e.exception))
            with self.assertRaises(TypeError) as e:
                self.c.sync_lora(v, 1, lora=self.adapter(6), lora_config=dict(cfg, target_modules={"q"}), upload=True)
            self.assertIn("lora_config must hold JSON values", str(e.exception))
            with self.assertRaises(ValueError):  # a tensor save refuses: the folder made for it goes too
                self.c.sync_lora(v, 1, lora=dict(self.adapter(6), bad=np.ones(2, bool)), lora_config=cfg)
            # ... and in a weights_dir holding that version's adapter from an earlier try, nothing is touched
            # (it was judged only as it was saved, after the earlier files were removed: helper-76)
            keep = os.path.join(self.dir, "keep-lora")
            folder = os.path.join(keep, f"transformer-v{v}-lora")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "adapter_model.safetensors"), "wb") as f:
                f.write(b"an earlier try")
            with self.assertRaises(ValueError):
                self.c.sync_lora(v, 1, lora=dict(self.adapter(6), bad=np.ones(2, bool)), lora_config=cfg,
                                 weights_dir=keep)
            with open(os.path.join(folder, "adapter_model.safetensors"), "rb") as f:
                self.assertEqual(f.read(), b"an earlier try")
            self.assertEqual(os.listdir(folder), ["adapter_model.safetensors"])
            # a full sync by state dict with a bad tensor: an existing file of that version in weights_dir is
            # left whole (it was removed: helper-77), and no temporary folder is left behind
            with open(os.path.join(keep, f"transformer-v{v}.safetensors"), "wb") as f:
                f.write(b"the file the workers load")
            with self.assertRaises(ValueError):
                self.c.sync(v, state_dict={"patch_embedding.weight": np.ones(2, bool)}, config="tiny",
                            weights_dir=keep)
            with open(os.path.join(keep, f"transformer-v{v}.safetensors"), "rb") as f:
                self.assertEqual(f.read(), b"the file the workers load")
            self.assertFalse([n for n in os.listdir(keep) if ".part-" in n], "a part file was left")
            with self.assertRaises(ValueError):
                self.c.sync(v, state_dict={"patch_embedding.weight": np.ones(2, bool)}, config="tiny")
            self.assertEqual(os.listdir(tmp), [], "a refused state dict left its temporary folder")
            # a PEFT folder whose adapter_config.json did not come along: refused here, by the workers' rule,
            # before any upload (it was sent as "{}" and merged at s = 1: helper-75); a config that is a folder too
            peft = os.path.join(self.dir, "peft-noconfig")
            os.makedirs(peft, exist_ok=True)
            reel.safetensors.save(os.path.join(peft, "adapter_model.safetensors"), self.adapter(6))
            with self.assertRaises(ValueError) as e:
                self.c.sync_lora(v, 1, lora=peft, upload=True)
            self.assertIn("nothing in it says its scale", str(e.exception))
            os.makedirs(os.path.join(peft, "adapter_config.json"))
            with self.assertRaises(ValueError) as e:
                self.c.sync_lora(v, 1, lora=peft, upload=True)
            self.assertIn("not a regular file", str(e.exception))
            self.assertLess(time.monotonic() - t0, 2.0)
            self.assertEqual(os.listdir(tmp), [], "a refused adapter left files behind")
            self.assertEqual(self.next_version(), v, "a refused adapter used up a version")
            # numpy scalars in the config are numbers: applied as the same config in ints would be
            res = self.c.sync_lora(v, 1, lora=self.adapter(6), lora_config={"r": np.int64(4),
                                   "lora_alpha": np.float32(8.0), "use_rslora": np.bool_(False)}, upload=True)
            self.assertTrue(res.complete, res)
            self.assertEqual(os.listdir(tmp), [], "an uploaded adapter's folder was left behind")
        finally:
            tempfile.tempdir = old_tmp

    def test_refused_adapters_name_their_cause_and_change_nothing(self):
        before = self.gen()
        v = self.next_version()
        with self.assertRaises(reel.SyncFailed) as e:
            self.c.sync_lora(v, 1, lora=self.adapter(2), lora_config={"r": 4, "lora_alpha": 8, "use_dora": True},
                             weights_dir=self.dir)
        self.assertIn("DoRA", str(e.exception.result.failed))
        with self.assertRaises(reel.SyncFailed) as e:
            sd = self.adapter(3)
            sd["base_model.model.blocks.0.norm3.lora_A.weight"] = np.ones((4, 64), np.float32)
            self.c.sync_lora(v, 1, lora=sd, lora_config={"r": 4, "lora_alpha": 8}, weights_dir=self.dir)
        self.assertIn("unknown target", str(e.exception.result.failed))
        with self.assertRaises(ValueError):  # a config without r (None: the tensors' own, s = 1)
            self.c.sync_lora(v, 1, lora=self.adapter(4), lora_config={"lora_alpha": 8})
        self.assertTrue(np.array_equal(self.gen(), before), "a refused adapter changed the weights")


class SafetensorsTests(unittest.TestCase):
    """reel.safetensors on bad files (each a ValueError naming the file and
    the tensor at fault) and on what it cannot write; no cluster."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="reel-py-st-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def raw(self, header, data=b""):
        """A file of header (bytes, or an object written as JSON) and data."""
        h = header if isinstance(header, bytes) else json.dumps(header).encode()
        path = os.path.join(self.dir, f"f{time.monotonic_ns()}.safetensors")
        with open(path, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + data)
        return path

    def test_every_bad_file_is_a_value_error_naming_the_file_and_the_tensor(self):
        t = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
        cases = [  # (header, data, words the message holds besides the path)
            ([1, 2], b"", "not an object"),
            ({"w": [1, 2]}, b"", "w: its entry is a JSON list"),
            ({"w": {"dtype": "F32", "shape": [2]}}, bytes(8), "w: no data_offsets"),
            ({"w": dict(t, shape=[3])}, bytes(8), "w: shape [3] of F32 is 12 bytes"),
            ({"w": dict(t, dtype="BF16", shape=[2], data_offsets=[0, 3])}, bytes(3), "w: shape [2] of BF16"),
            ({"w": dict(t, shape=[-2])}, bytes(8), "w: shape"),
            ({"w": dict(t, data_offsets=[0])}, bytes(8), "w: data_offsets"),
            ({"w": dict(t, data_offsets=[0, 16])}, bytes(8), "w: data_offsets outside the file"),
            ({"w": dict(t, dtype="I64")}, bytes(8), "w: dtype I64"),
            (b'{"w": {"dtype": "F32"', bytes(8), "not UTF-8 JSON"),
            (b'{"w\xff": 1}', b"", "not UTF-8 JSON"),
            ({"a": t, "b": dict(t, data_offsets=[4, 12])}, bytes(12), "b: its bytes overlap a's"),
            ({"__metadata__": [1], "w": t}, bytes(8), "__metadata__"),
        ]
        for header, data, words in cases:
            path = self.raw(header, data)
            with self.assertRaises(ValueError, msg=repr(header)) as e:
                safetensors.load(path)
            self.assertIn(path, str(e.exception))
            self.assertIn(words, str(e.exception), repr(header))
        # empty tensors may share an offset, with each other and with a tensor's start
        path = self.raw({"e1": dict(t, shape=[0], data_offsets=[0, 0]), "e2": dict(t, shape=[2, 0],
                         data_offsets=[0, 0]), "w": t}, np.arange(2, dtype="<f4").tobytes())
        got, _ = safetensors.load(path)
        self.assertEqual((got["e1"].shape, got["e2"].shape, list(got["w"])), ((0,), (2, 0), [0.0, 1.0]))

    def test_save_keeps_a_0d_array_and_refuses_what_it_cannot_write(self):
        path = os.path.join(self.dir, "s.safetensors")
        safetensors.save(path, {"s": np.float32(2.5), "v": np.arange(3)})
        got, _ = safetensors.load(path)
        self.assertEqual(got["s"].shape, ())
        self.assertEqual(float(got["s"]), 2.5)
        self.assertEqual(got["v"].dtype, np.float32)
        for bad, words in (({"b": np.ones(2, bool)}, "b: dtype bool"), ({"c": np.ones(2, np.complex64)}, "c: dtype"),
                           ({"__metadata__": np.ones(2, np.float32)}, "__metadata__"),
                           ({"t": ["a", "b"]}, "t: dtype"), ({3: np.ones(2)}, "3")):
            with self.assertRaises(ValueError, msg=repr(bad)) as e:
                safetensors.save(path, bad)
            self.assertIn(words, str(e.exception))
        try:
            import torch
        except ImportError:
            return
        with self.assertRaises(ValueError):
            safetensors.save(path, {"b": torch.ones(2, dtype=torch.bool)})


class Result(unittest.TextTestResult):
    pass


def _flat(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _flat(t)
        else:
            yield t


def main():
    global BUILD
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("-k", dest="only", default=None, help="only the tests whose name holds this text")
    a = ap.parse_args()
    BUILD = os.path.abspath(a.build)
    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    suite.addTests(loader.loadTestsFromTestCase(SafetensorsTests))
    suite.addTests(loader.loadTestsFromTestCase(ClientTests))
    suite.addTests(loader.loadTestsFromTestCase(CancelTests))
    suite.addTests(loader.loadTestsFromTestCase(GenResultTests))
    suite.addTests(loader.loadTestsFromTestCase(NoBrokerTests))
    suite.addTests(loader.loadTestsFromTestCase(IdleClientTests))
    suite.addTests(loader.loadTestsFromTestCase(BusyTests))
    suite.addTests(loader.loadTestsFromTestCase(GenManyBusyTests))
    suite.addTests(loader.loadTestsFromTestCase(BatchingTests))
    suite.addTests(loader.loadTestsFromTestCase(PrewarmTests))
    suite.addTests(loader.loadTestsFromTestCase(BrokerRestartTests))
    suite.addTests(loader.loadTestsFromTestCase(StandbyPairTests))
    suite.addTests(loader.loadTestsFromTestCase(StandbyTakeoverTests))
    suite.addTests(loader.loadTestsFromTestCase(CurveTests))
    suite.addTests(loader.loadTestsFromTestCase(PromptTests))
    suite.addTests(loader.loadTestsFromTestCase(LoraTests))
    if a.only:
        suite = unittest.TestSuite(t for t in _flat(suite) if a.only in t.id())
    res = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    bad = len(res.failures) + len(res.errors)
    for t, why in res.skipped:
        print(f"SKIP {t.id()}: {why}")
    print(f"python: {res.testsRun - bad - len(res.skipped)} passed, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
