#!/usr/bin/python3
"""deploy_check.py -- the deployment files, checked offline (issue 13, part 3).

No cluster here, so the Kubernetes manifests are checked structurally, the
way a reviewer would, and against Reel itself:
  - every file of deploy/k8s/kustomization.yaml parses, every object has
    apiVersion, kind and a name, and the kinds are the ones expected;
  - workloads: selectors match their pod labels; every container has an
    image, cpu and memory requests, liveness on /healthz and readiness on
    /readyz at a port it declares; Prometheus scrape annotations name the
    port its --metrics flag serves; every volumeMount names a volume, every
    claim a PersistentVolumeClaim and every secret a name;
  - the flags in the containers' args are flags reel-broker and
    reel-worker accept (their --help, from BUILD);
  - GPU workers ask for exactly one nvidia.com/gpu (request = limit), the
    CPU variant for none; the broker is one replica, Recreate (it owns the
    catalog); each StatefulSet has its governing Service; every Service
    selects a workload and targets ports it declares;
  - deploy/grafana/reel.json parses, and every metric its panels query is
    one Reel exports (names collected from the code);
  - the key volumes run: each pod's init container over a Secret and an
    emptyDir made as Kubernetes makes them (as root), then the broker of
    broker.yaml and of broker-pair.yaml started as the pod's user on what
    it left, and a worker of each StatefulSet registering with it (SKIP
    when not root).
Prints PASS/FAIL lines; exits 1 on any failure.
Usage: deploy_check.py REPO BUILD
"""
import json
import os
import re
import subprocess
import sys

import yaml

repo, build = sys.argv[1], sys.argv[2]
failures = 0


def check(ok, what):
    global failures
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures += 1


k8s = os.path.join(repo, "deploy", "k8s")
kust = yaml.safe_load(open(os.path.join(k8s, "kustomization.yaml")))
files = list(kust["resources"]) + ["workers-cpu.yaml"]
objs = []
for f in files:
    path = os.path.join(k8s, f)
    check(os.path.exists(path), "kustomization resource %s exists" % f)
    for d in yaml.safe_load_all(open(path)):
        if d:
            objs.append((f, d))
check(all(o.get("apiVersion") and o.get("kind") and o.get("metadata", {}).get("name") for _, o in objs),
      "every object has apiVersion, kind and metadata.name (%d objects)" % len(objs))
kinds = {o["kind"] for _, o in objs}
check(kinds <= {"Namespace", "PersistentVolumeClaim", "Deployment", "StatefulSet", "Service"},
      "only the expected kinds: %s" % sorted(kinds))

flags = {}
for prog in ("reel-broker", "reel-worker"):
    out = subprocess.run([os.path.join(build, prog), "--help"], capture_output=True, text=True)
    flags[prog] = set(re.findall(r"--([a-z][a-z0-9-]*)", out.stdout + out.stderr))
    check(len(flags[prog]) > 5, "%s --help lists its flags (%d)" % (prog, len(flags[prog])))

pvcs = {o["metadata"]["name"] for _, o in objs if o["kind"] == "PersistentVolumeClaim"}
services = [(f, o) for f, o in objs if o["kind"] == "Service"]
workloads = [(f, o) for f, o in objs if o["kind"] in ("Deployment", "StatefulSet")]
check(len(workloads) == 3, "a broker Deployment and two worker StatefulSets (GPU, CPU)")

for f, w in workloads:
    name = "%s %s (%s)" % (w["kind"], w["metadata"]["name"], f)
    spec = w["spec"]
    pod = spec["template"]
    labels = pod["metadata"].get("labels", {})
    sel = spec["selector"]["matchLabels"]
    check(all(labels.get(k) == v for k, v in sel.items()), name + ": the selector matches the pod labels")
    ps = pod["spec"]
    vols = {v["name"]: v for v in ps.get("volumes", [])}
    for v in vols.values():
        if "persistentVolumeClaim" in v:
            check(v["persistentVolumeClaim"]["claimName"] in pvcs,
                  name + ": claim %s is defined" % v["persistentVolumeClaim"]["claimName"])
        if "secret" in v:
            check(bool(v["secret"].get("secretName")), name + ": secret volume %s names its Secret" % v["name"])
    for c in ps.get("initContainers", []) + ps["containers"]:
        for m in c.get("volumeMounts", []):
            check(m["name"] in vols, name + ": mount %s of %s names a volume" % (m["name"], c["name"]))
    c = ps["containers"][0]
    check(bool(c.get("image")), name + ": an image")
    req = c.get("resources", {}).get("requests", {})
    check("cpu" in req and "memory" in req, name + ": cpu and memory requests")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        g = c.get(probe, {}).get("httpGet", {})
        check(g.get("path") == path and g.get("port") in ports, name + ": %s on %s at a declared port" % (probe, path))
    args = c.get("args", [])
    prog = args[0] if args else ""
    check(prog in flags, name + ": runs reel-broker or reel-worker (%s)" % prog)
    used = [a[2:].split("=")[0] for a in args[1:] if a.startswith("--")]
    unknown = [u for u in used if u not in flags.get(prog, set())]
    check(not unknown, name + ": every flag is one %s accepts%s" % (prog, (": not " + ", ".join(unknown)) if unknown else ""))
    metrics = [a.split("=", 1)[1] for a in args if a.startswith("--metrics=")]
    ann = pod["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true" and metrics and
          metrics[0].rsplit(":", 1)[1] == ann.get("prometheus.io/port") and
          int(ann.get("prometheus.io/port", 0)) in ports.values(),
          name + ": Prometheus annotations name the --metrics port (%s)" % (metrics[0] if metrics else "none"))
    gpu_req = req.get("nvidia.com/gpu")
    gpu_lim = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    if "--backend=cuda" in args:
        check(gpu_req == 1 and gpu_lim == 1, name + ": one GPU per worker (request = limit = 1)")
    else:
        check(gpu_req is None and gpu_lim is None, name + ": no GPU asked")
    if w["kind"] == "Deployment":
        check(spec.get("replicas") == 1 and spec.get("strategy", {}).get("type") == "Recreate",
              name + ": one replica, Recreate (it owns the catalog)")
    else:
        governing = [s for sf, s in services if sf == f and s["metadata"]["name"] == spec.get("serviceName")]
        check(len(governing) == 1 and governing[0]["spec"].get("clusterIP") == "None",
              name + ": its governing headless Service %s" % spec.get("serviceName"))

for f, s in services:
    sel = s["spec"]["selector"]
    targets = [w for wf, w in workloads if wf == f and all(
        w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
    check(len(targets) == 1, "Service %s (%s) selects a workload of its file" % (s["metadata"]["name"], f))
    if targets:
        names = {p["name"] for p in targets[0]["spec"]["template"]["spec"]["containers"][0].get("ports", [])}
        check(all(p["targetPort"] in names for p in s["spec"]["ports"]),
              "Service %s targets ports its pods declare" % s["metadata"]["name"])

# the standby pair (broker-pair.yaml, instead of broker.yaml): two
# brokers of one StatefulSet, each the other's --peer, one primary
pair = list(yaml.safe_load_all(open(os.path.join(k8s, "broker-pair.yaml"))))
ss = [o for o in pair if o and o["kind"] == "StatefulSet"]
hs = [o for o in pair if o and o["kind"] == "Service"]
check(len(ss) == 1 and ss[0]["spec"].get("replicas") == 2, "broker-pair.yaml: one StatefulSet of 2 brokers")
check(len(hs) == 1 and hs[0]["spec"].get("clusterIP") == "None" and ss and
      hs[0]["metadata"]["name"] == ss[0]["spec"]["serviceName"],
      "broker-pair.yaml: its governing headless Service gives the peers stable names")
if ss:
    pod = ss[0]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    script = " ".join(c.get("command", []))
    used = set(re.findall(r"--([a-z][a-z-]*)=", script))
    unknown = sorted(u for u in used if u not in flags.get("reel-broker", set()))
    check("reel-broker" in script and not unknown,
          "broker-pair.yaml: every reel-broker flag is one it accepts" + (": not " + ", ".join(unknown) if unknown else ""))
    check({"peer", "role"} <= used and "role=primary" in script and "role=backup" in script,
          "broker-pair.yaml: each pod names the other as --peer, one primary and one backup")
    peer_host = re.search(r"--peer=tcp://reel-broker-\$peer\.([a-z-]+):", script)
    check(bool(peer_host) and peer_host.group(1) == ss[0]["spec"]["serviceName"],
          "broker-pair.yaml: the peer address is the other pod's stable name")
    anti = pod["spec"].get("affinity", {}).get("podAntiAffinity", {})
    check(bool(anti.get("requiredDuringSchedulingIgnoredDuringExecution")),
          "broker-pair.yaml: the two brokers never share a node")
    vols = {v["name"] for v in pod["spec"].get("volumes", [])} | \
        {t["metadata"]["name"] for t in ss[0]["spec"].get("volumeClaimTemplates", [])}
    check(all(m["name"] in vols for m in c.get("volumeMounts", [])),
          "broker-pair.yaml: every volumeMount names a volume or claim template (its own catalog each)")

# The key volumes as Kubernetes makes them, run (not only read): the
# Secrets hold what docs/DEPLOY.md's step 2 puts in them (reel-broker-keys:
# broker.key and every NAME.pub; reel-worker-keys: broker.pub and every
# worker's NAME.key) at the volume's defaultMode, owned by root; an emptyDir
# is 1777. Each pod's init container runs its own command over those
# folders as root (as its securityContext says), then the daemon starts as
# the pod's runAsUser with the manifest's --keys/--key/--broker-key paths:
# the broker must come up, and a worker of each StatefulSet must register
# with it (a broker that refuses a keys folder others may write, or a key
# the daemon's user cannot read, fails here as it would in the cluster).
def run_pods():
    import shutil
    import tempfile
    import time
    if os.geteuid() != 0:
        print("SKIP the key volumes run: the init containers chown as root, and this is not root")
        return
    T = tempfile.mkdtemp(prefix="reel-k8s.")
    os.chmod(T, 0o755)
    procs = []

    def as_user(pod, argv):
        uid = pod["spec"].get("securityContext", {}).get("runAsUser", 0)
        return ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups"] + argv, uid

    def wait_line(log, pattern, proc, what, secs=60, count=1):
        """Until log holds count lines matching pattern (a later worker of
        the same name must not pass on an earlier one's line)."""
        end = time.monotonic() + secs
        while time.monotonic() < end:
            text = open(log, errors="replace").read()
            if len(re.findall(pattern, text)) >= count:
                return True
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        text = open(log, errors="replace").read().strip().splitlines()
        print("  %s: %s" % (what, " / ".join(text[-3:]) or "(no output)"))
        return False

    def stage(tag, pod, pod_name, keydir):
        """The pod's volumes under T/tag and its init containers run; returns
        the main container's mounts as {mountPath: host folder}, or None."""
        root = os.path.join(T, tag)
        os.makedirs(root)
        host = {}
        uid = pod["spec"].get("securityContext", {}).get("runAsUser", 0)
        for v in pod["spec"].get("volumes", []):
            d = os.path.join(root, v["name"])
            os.makedirs(d)
            if "secret" in v:
                sec = v["secret"]["secretName"]
                names = sorted(os.listdir(keydir))
                pick = ["broker.key"] + [n for n in names if n.endswith(".pub")] if sec == "reel-broker-keys" else \
                    ["broker.pub"] + [n for n in names if n.endswith(".key") and n not in ("broker.key", "trainer.key")]
                for n in pick:
                    shutil.copy(os.path.join(keydir, n), d)
                    os.chmod(os.path.join(d, n), v["secret"].get("defaultMode", 0o644))
                os.chmod(d, 0o755)
            elif "emptyDir" in v:
                os.chmod(d, 0o1777)
            else:  # a claim: the pod's user may write it (fsGroup)
                os.chown(d, uid, uid)
            host[v["name"]] = d

        def paths(c):
            m = {x["mountPath"]: host[x["name"]] for x in c.get("volumeMounts", []) if x["name"] in host}
            pat = re.compile(r"(?<![\w.-])(%s)(?![\w.-])" % "|".join(re.escape(k) for k in sorted(m, key=len, reverse=True)))
            return lambda s: pat.sub(lambda g: m[g.group(1)], s.replace("$(POD_NAME)", pod_name)) if m else s

        for c in pod["spec"].get("initContainers", []):
            cmd = c.get("command", [])
            sub = paths(c)
            r = subprocess.run([sub(a) for a in cmd], capture_output=True, text=True)
            if r.returncode != 0:
                check(False, "%s: init container %s runs (%s)" % (tag, c["name"], r.stderr.strip()[-200:]))
                return None
        return paths(pod["spec"]["containers"][0])

    try:
        keydir = os.path.join(T, "keys")
        reelctl = os.path.join(build, "reelctl")
        gen = [["--role", "broker"], ["--role", "trainer", "--name", "trainer"]]
        gen += [["--role", "worker", "--name", "reel-worker-0"]]
        for g in gen:
            subprocess.run([reelctl, "keys", "new"] + g + ["--out", keydir], check=True, capture_output=True)
        run = os.path.join(T, "run")
        os.makedirs(run)
        wdir = os.path.join(T, "weights")
        os.makedirs(wdir)
        subprocess.run([reelctl, "weights", "init", "--config", "tiny", "--out",
                        os.path.join(wdir, "w.safetensors")], check=True, capture_output=True)
        os.chmod(T, 0o755)
        for d in (keydir, run, wdir):
            os.chmod(d, 0o755)
        os.chmod(os.path.join(wdir, "w.safetensors"), 0o644)

        brokers = [(f, o["spec"]["template"]) for f, o in objs if o["kind"] == "Deployment"]
        brokers += [("broker-pair.yaml", o["spec"]["template"]) for o in ss]
        workers = [(f, o["spec"]["template"]) for f, o in objs if o["kind"] == "StatefulSet"]
        # one broker at a time, each with a worker of every StatefulSet
        for bi, (bf, bpod) in enumerate(brokers):
            tag = "broker%d" % bi
            sub = stage(tag, bpod, "reel-broker-0", keydir)
            if sub is None:
                continue
            c = bpod["spec"]["containers"][0]
            text = " ".join(c.get("args", []) + c.get("command", []))
            kv = dict(re.findall(r"--(keys|key)=(\S+)", text))
            os.chown(run, bpod["spec"].get("securityContext", {}).get("runAsUser", 0), -1)
            state = os.path.join(T, tag + "-state")
            os.makedirs(state)
            argv, uid = as_user(bpod, [os.path.join(build, "reel-broker"),
                                       "--clients=ipc://%s/%s-c" % (run, tag), "--workers=ipc://%s/%s-w" % (run, tag),
                                       "--keys=" + sub(kv.get("keys", "")), "--key=" + sub(kv.get("key", "")),
                                       "--catalog=%s/reel.db" % state, "--weights-dir=" + state])
            os.chown(state, uid, uid)
            blog = os.path.join(T, tag + ".log")
            bp = subprocess.Popen(argv, stdout=open(blog, "w"), stderr=subprocess.STDOUT)
            procs.append(bp)
            up = wait_line(blog, r"ready clients=", bp, bf + "'s broker")
            check(up, "%s: the broker starts with its key volume as the init container leaves it" % bf)
            if not up:
                continue
            for wi, (wf, wpod) in enumerate(workers):
                wtag = "%s-worker%d" % (tag, wi)
                wsub = stage(wtag, wpod, "reel-worker-0", keydir)
                if wsub is None:
                    continue
                wc = wpod["spec"]["containers"][0]
                wkv = dict(re.findall(r"--(key|broker-key)=(\S+)", " ".join(wc.get("args", []))))
                argv, _ = as_user(wpod, [os.path.join(build, "reel-worker"), "--name=reel-worker-0",
                                         "--broker=ipc://%s/%s-w" % (run, tag),
                                         "--key=" + wsub(wkv.get("key", "")),
                                         "--broker-key=" + wsub(wkv.get("broker-key", "")),
                                         "--weights=" + os.path.join(wdir, "w.safetensors"), "--backend=cpu"])
                wlog = os.path.join(T, wtag + ".log")
                wp = subprocess.Popen(argv, stdout=open(wlog, "w"), stderr=subprocess.STDOUT)
                procs.append(wp)
                joined = wait_line(blog, r"worker reel-worker-0 ready", wp, wf + "'s worker", count=wi + 1)
                if not joined:
                    print("  broker: " + " / ".join(open(blog).read().strip().splitlines()[-3:]))
                check(joined, "%s: its worker's keys, as its init container leaves them, register it with %s's broker"
                      % (wf, bf))
                wp.terminate()
                wp.wait(30)
                # the next worker registers under the same name: wait for this one's leave
                wait_line(blog, r"worker reel-worker-0 lost", bp, "its leave", 20, count=wi + 1)
            bp.terminate()
            bp.wait(30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(T, ignore_errors=True)


run_pods()

# the dashboard queries only what Reel exports
exported = set()
for src in ("broker/brk_metrics.c", "worker/wrk_main.c"):
    exported |= set(re.findall(r'"(reel_(?:broker|worker)_[a-z_]+)"', open(os.path.join(repo, src)).read()))
check(len(exported) > 20, "metric names collected from the code (%d)" % len(exported))
dash = json.load(open(os.path.join(repo, "deploy", "grafana", "reel.json")))
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
check(len(dash["panels"]) >= 6 and len(exprs) >= 6, "the dashboard has panels with queries (%d, %d)" % (len(dash["panels"]), len(exprs)))
used = set(re.findall(r"reel_[a-z_]+", " ".join(exprs)))
base = {re.sub(r"_(bucket|sum|count)$", "", u) for u in used}
unknown = sorted(u for u in base if u not in exported)
check(not unknown, "every metric the dashboard queries is exported" + (": not " + ", ".join(unknown) if unknown else ""))
want = ["reel_broker_requests_total", "reel_broker_request_seconds", "reel_worker_replays_total",
        "reel_worker_captures_total", "reel_worker_evictions_total", "reel_worker_graph_bytes",
        "reel_worker_budget_bytes", "reel_worker_declines_total"]
check(all(w in base for w in want), "it shows request rate and latency, hit rate, captures and evictions, graph "
      "memory vs budget, declines by reason")
sys.exit(1 if failures else 0)
