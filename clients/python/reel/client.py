"""A client of the Reel broker, written from docs/PROTOCOL.md.

One Client is one ZeroMQ DEALER socket on the broker's client endpoint (of
a standby pair: on one of the two brokers' at a time), opened at its first
call on the process's shared zmq.Context.instance(). Its calls run one
at a time: a call from another thread waits for the running one (use one
Client per thread for calls side by side). Every call has a client-side
deadline, so nothing hangs when the broker is gone or refuses the
connection (a send that cannot go by then raises ReelTimeout too). Arguments are checked
before anything is sent: an integer field takes an integer (not a float,
a bool or a string), a number field a number, tensors real numbers (cast
to little-endian float32); a wrong one raises TypeError or ValueError
naming it.
"""

import copy
import errno
import functools
import hashlib
import itertools
import json
import math
import os
import random
import re
import threading
import warnings
import shutil
import stat
import struct
import sys
import tempfile
import time
import weakref

try:
    import resource  # (Unix: the open-file limit an error names)
except ImportError:
    resource = None
import msgpack
import numpy as np
import zmq
import zmq.utils.z85

from . import safetensors

PROTO = "reel/1"
MAX_MSG = 512 << 20
MAX_BROKERS = 4  # endpoints in a list: a broker, or a standby pair
# docs/PROTOCOL.md "What a GEN must satisfy" (schema/msg.h)
MAX_STEPS = 10000
MAX_DIM = 65536  # each of C, F, H, W
MAX_FHW = 1 << 24
MAX_GEN_BYTES = 256 << 20  # the latents of a GEN (n of them), and its tensors
_FLT_MAX = float(np.finfo(np.float32).max)
STANDBY_PAUSE = 0.2  # seconds, after a round of "standby" answers (a pair still choosing)
_DTYPE_SIZE = {"F32": 4, "BF16": 2, "F16": 2}
_MAX_MS = (1 << 31) - 1  # the longest a zmq timeout may be, in ms
# A call whose socket the broker refused for good tries a fresh one after
# 0.1 s, then after twice as long each time, up to once a second: a key
# added (and the broker reloaded) lets the waiting call through within a
# second, and a refused client costs the broker a handshake a second.
_RETRY_MIN, _RETRY_MAX = 0.1, 1.0



class _Default:
    """An argument not given: gen()'s default for it (None stays a type
    error, as for any other argument)."""

    def __repr__(self):
        return "<default>"


_DEFAULT = _Default()

# What gen() takes with a prompt for steps, shift, cfg and solver not given:
# Wan2.1's generate.py text-to-video defaults (reelctl's --prompt the same).
WAN_T2V_STEPS = 50
WAN_T2V_SHIFT = 5.0
WAN_T2V_CFG = 5.0
WAN_T2V_SOLVER = "unipc"

class ReelError(Exception):
    """The broker answered ERROR: .code (e.g. "no_worker", "bad_request",
    "stale_version", "timeout") and .message say why."""

    def __init__(self, code, message, request_id=0):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


class BusyError(ReelError):
    """The broker answered BUSY: its queue (or the bytes it holds) is full.
    Nothing was started; retry later."""

    def __init__(self, message, request_id=0):
        super().__init__("busy", message, request_id)


class _Refreshed(Exception):
    """Raised inside a call when its socket, refused for good by the
    broker's handshake, was replaced by a fresh one (Client._refresh): what
    went on the old one reached no broker, and the call sends again what
    it waits for. Never leaves the Client."""


class _BrokerLost(Exception):
    """An upload attempt ended on a silent or restarted broker, or on the
    standby of a pair (Client._upload). .done: the SYNC_DONE header if it
    came; .heard: when the broker last answered; .standby: it answered
    ERROR standby; .acked: when the attempt's last UPLOAD_ACK or SYNC_DONE
    came (None: none)."""

    def __init__(self, done, heard, standby=False, acked=None):
        super().__init__("broker lost")
        self.done, self.heard, self.standby, self.acked = done, heard, standby, acked


def _says_its_scale(weights):
    """Whether a LoRA weights file read without adapter_config.json names
    its own scale, by the rule the workers and reelctl apply (docs/MODEL.md
    "LoRA adapters"): a module's .alpha, lora_down/lora_up names, diffusers'
    lora_adapter_metadata or file name, or no low-rank tensor at all."""
    if os.path.basename(weights) == "pytorch_lora_weights.safetensors":
        return True
    try:
        with open(weights, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 0 < n <= (100 << 20) else {}
    except (OSError, ValueError):
        return True  # unreadable here: the workers judge it and say why
    if not isinstance(header, dict):
        return True
    meta = header.get("__metadata__")
    if isinstance(meta, dict) and "lora_adapter_metadata" in meta:
        return True
    names = [k for k in header if k != "__metadata__"]
    if any(k.endswith(".alpha") or ".lora_down." in k or ".lora_up." in k for k in names):
        return True
    return not any(".lora_A." in k or ".lora_B." in k for k in names)


class ReelTimeout(ReelError):
    """No answer within the client's timeout (the broker may be down)."""

    def __init__(self, message, request_id=0):
        super().__init__("timeout", message, request_id)


class SyncFailed(ReelError):
    """A weight sync that no worker applied: nothing changed. .result is the
    SyncResult, with each worker's reason in .result.failed."""

    def __init__(self, result, request_id=0):
        reasons = ", ".join(f"{w} ({r})" for w, r in result.failed) or "no live worker"
        super().__init__("sync_failed", f"{result.component} v{result.version} applied by no worker: "
                         f"{reasons}; current is still v{result.current}", request_id)
        self.result = result


class GenResult:
    """What a GEN returned: .latent (torch when any tensor argument, context,
    uncond, latent or one of a group's latents, was a torch tensor; else
    numpy; .trajectory, .log_probs, .sigmas and .means likewise), .worker, .version (weights of its last step),
    .first_version (of its first step), .versions (the weight version of every step; a group's sample: its
    own steps', and .version and .first_version its own too), .stats
    (the RESULT's stats map: captured, replayed, eager, declines, seconds, batched,
    batch_rows, padded_rows, capture_key),
    .key_hash (the shard hash), .capture_key (the capture key of the graph
    its last step ran under, a mixed batch's when it ran batched: what the
    catalog's captures and evictions are recorded by; "" from an older
    worker) and .seconds (client wall time). With the rollout options:
    .trajectory [N+1, C, F, H, W] (x_0 ... x_N), .log_probs [N] (each SDE
    step's Flow-GRPO log-probability), .sigmas [N+1], .timesteps [N] (each step's t as
    the transformer took it), .means [N, C, F, H, W];
    None when not asked for. With output="frames": .frames, uint8 [F', H',
    W', 3] (F' = 1+4(F-1), H' = 8H, W' = 8W); with output="video": .video,
    the MP4's bytes; .encode_seconds and .decode_seconds: the worker's time
    encoding the prompt and decoding. .seed: the sample's seed when it came from a
    group (gen_group), else None. A group's samples hold the same .stats
    (the group's batched steps), each its own copy (nested maps included),
    and the same .seconds."""

    def __init__(self, hdr, tensors, seconds, steps, convert, sample=None):
        # sample: this sample's index in a group's RESULT (its tensors
        # carry a leading [n]; version_runs cover the n x N grid).
        pick = (lambda a: a) if sample is None else (lambda a: a[sample])
        self.latent = convert(pick(tensors["latent"]))
        self.worker = hdr.get("worker", "")
        self.version = hdr.get("version", 0)
        self.first_version = hdr.get("first_version", self.version)
        self.stats = copy.deepcopy(dict(hdr.get("stats", {}) or {}))  # a group's samples: each its own copy
        self.key_hash = hdr.get("key_hash", "")
        self.seconds = seconds
        self.header = hdr
        n = int(hdr.get("n", 1) or 1)
        runs = sorted((r.get("from", 0), r.get("version", 0)) for r in (hdr.get("version_runs") or []))
        if runs:
            bounds = [f for f, _ in runs[1:]] + [n * steps]
            grid = [v for (f, v), end in zip(runs, bounds) for _ in range(f, end)]
            at = (sample or 0) * steps
            self.versions = grid[at:at + steps]
            if len(self.versions) == steps and steps > 0:
                # this sample's own: a group's header says the newest of its
                # samples' last steps and the oldest of their first steps
                self.version, self.first_version = self.versions[-1], self.versions[0]
        else:
            self.versions = [self.version] * steps
        seeds = hdr.get("seeds") or []
        self.seed = int(seeds[sample]) if sample is not None and sample < len(seeds) else None
        self.trajectory = convert(pick(tensors["trajectory"])) if "trajectory" in tensors else None
        self.log_probs = convert(pick(tensors["log_probs"])) if "log_probs" in tensors else None
        # [N+1], one for a group: each sample its own copy (editing one changes no other)
        self.sigmas = (convert(tensors["sigmas"] if sample is None else tensors["sigmas"].copy())
                       if "sigmas" in tensors else None)
        # [N] with sigmas: each step's timestep as the transformer took it (1000 sigma on Euler's grid,
        # the solver's int t on UniPC's or DPM++'s); None from an older worker
        self.timesteps = (convert(tensors["timesteps"] if sample is None else tensors["timesteps"].copy())
                          if "timesteps" in tensors else None)
        self.means = convert(pick(tensors["means"])) if "means" in tensors else None
        # output="frames": uint8 [F', H', W', 3] (numpy, whatever the inputs);
        # output="video": the MP4's bytes
        self.frames = pick(tensors["frames"]) if "frames" in tensors else None
        self.video = tensors["video"].tobytes() if "video" in tensors else None
        self.encode_seconds = float(hdr.get("encode_seconds", 0.0) or 0.0)
        self.decode_seconds = float(hdr.get("decode_seconds", 0.0) or 0.0)

    @property
    def captured(self):
        return self.stats.get("captured", 0)

    @property
    def replayed(self):
        return self.stats.get("replayed", 0)

    @property
    def eager(self):
        return self.stats.get("eager", 0)

    @property
    def batched(self):
        """Of its steps, those the worker ran in one step with other requests
        (each bitwise the step alone)."""
        return self.stats.get("batched", 0)

    @property
    def mean_batch(self):
        """The mean number of requests in the batches of its batched steps
        (0.0 when none ran batched)."""
        b = self.stats.get("batched", 0)
        return self.stats.get("batch_rows", 0) / b if b else 0.0

    @property
    def capture_key(self):
        """The capture key hash of its last step, as hex ("" when the worker
        did not say): `reelctl why` and the catalog's keys use it."""
        return self.stats.get("capture_key", "") or ""

    @property
    def padded_rows(self):
        """Padding rows (computed and thrown away) in those batches, summed."""
        return self.stats.get("padded_rows", 0)

    @property
    def declines(self):
        return dict(self.stats.get("declines", {}) or {})

    def __repr__(self):
        return (f"GenResult(worker={self.worker!r}, version={self.version}, shape={tuple(self.latent.shape)}, "
                f"captured={self.captured}, replayed={self.replayed}, eager={self.eager})")


class SyncResult:
    """SYNC_DONE: .component, .version, .applied [worker], .failed
    [(worker, reason)], .complete (every live worker applied it), .current
    (the component's current version now)."""

    def __init__(self, hdr):
        self.component = hdr.get("component", "")
        self.version = hdr.get("version", 0)
        self.applied = list(hdr.get("applied", []) or [])
        self.failed = [(f.get("worker", "?"), f.get("reason", "?")) for f in (hdr.get("failed", []) or [])]
        self.complete = bool(hdr.get("complete", False))
        self.current = hdr.get("current", 0)
        self.header = hdr

    def __repr__(self):
        return (f"SyncResult({self.component} v{self.version}: complete={self.complete}, "
                f"applied={self.applied}, failed={self.failed}, current={self.current})")


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _f32(name, x, ndim):
    """x (numpy, torch, a nested list) as a C-contiguous little-endian
    float32 array of ndim dimensions. Real numbers of any float or integer
    dtype are cast to float32 (rounded to nearest, as numpy casts); other
    dtypes (bool, complex, strings, objects) and text are refused."""
    if isinstance(x, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be an array of numbers, got {type(x).__name__}")
    try:
        raw = safetensors._as_numpy(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be an array of numbers: {e}") from None
    if raw.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers (float32, or a float or integer dtype cast to it), "
                        f"got dtype {raw.dtype}")
    if raw.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {raw.shape}")
    return np.ascontiguousarray(raw, dtype="<f4")


def _uint(name, v, lo=0, hi=(1 << 64) - 1):
    """v as an int in lo..hi: a Python or numpy integer (not a bool, a
    float or a string: the protocol refuses a float for an integer field,
    and a truncated one would be another request)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {v!r} ({type(v).__name__})")
    v = int(v)
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {v}")
    return v


def _num(name, v):
    """v as a float: a Python or numpy number, not a bool or a string."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {v!r} ({type(v).__name__})")
    return float(v)


def _flag(name, v):
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {v!r} ({type(v).__name__})")
    return bool(v)


def _text(name, v):
    """v, a str that encodes as UTF-8 (a lone surrogate does not): bytes, a
    list or a number would be sent as their repr, another request."""
    if not isinstance(v, str):
        raise TypeError(f"{name} must be text (a str), got {type(v).__name__}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} is not valid text: {e.reason} at character {e.start} (a lone surrogate)") from None
    return v


# The wire's longest string (docs/PROTOCOL.md "Prompts and videos"): a
# longer prompt would be too_large at the broker.
_MAX_TEXT = 4096


# An empty prompt, refused as reelctl run and gen refuse it (ctl/ctl.h
# CTL_EMPTY_PROMPT), saying how to get Wan2.1's empty-prompt context.
_EMPTY_PROMPT = ("prompt is empty: a GEN reads an empty prompt as none (docs/PROTOCOL.md), so reelctl run, reelctl "
                 "gen and this client refuse it alike; for Wan2.1's empty-prompt context (the end-of-sequence token "
                 "alone) write it with reelctl encode --t5 T5 --tokenizer PATH --prompt '' -o C.safetensors and pass "
                 "its tensor 'context' as context=")


def _prompt_text(name, v):
    """v, a prompt the broker takes: text (_text) of at most 4096 bytes as
    UTF-8, without control characters but tab, newline and CR (C0, DEL and
    the C1 controls U+0080..U+009F), the rule the broker and reelctl apply;
    ValueError naming the first offender, before anything is sent."""
    _text(name, v)
    n = len(v.encode("utf-8"))
    if n > _MAX_TEXT:
        raise ValueError(f"{name} is {n} bytes: at most {_MAX_TEXT} (the wire's longest string; umT5 reads 512 "
                         "tokens, about 2 KiB of text)")
    for i, ch in enumerate(v):
        c = ord(ch)
        if (c < 0x20 and ch not in "\t\n\r") or 0x7F <= c <= 0x9F:
            raise ValueError(f"{name} holds a control character, U+{c:04X} at character {i} (only tab, newline "
                             "and CR are taken)")
    return v


def _json_value(o):
    """json.dumps' default for numpy scalars and arrays (an adapter config
    built from numpy values); TypeError for anything else."""
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not a JSON value")


def _liveness(v):
    """Seconds of silence before a STATUS: v, else $REEL_CLIENT_LIVENESS_MS
    / 1000, else 3.0; a finite number >= 0 (0: never resend)."""
    if v is None:
        env = os.environ.get("REEL_CLIENT_LIVENESS_MS")
        if not env:
            return 3.0
        try:
            ms = int(env, 10)
        except ValueError:
            ms = -1
        if ms < 0:
            raise ValueError(f"REEL_CLIENT_LIVENESS_MS must be a whole number of milliseconds >= 0 (0: never "
                             f"resend), got {env!r}")
        return ms / 1000.0
    v = _num("liveness", v)
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"liveness must be a finite number of seconds >= 0 (0: never resend), got {v}")
    return v


def _warn(message):
    """warnings.warn pointing at the caller's line: the first frame outside
    this package (a fixed stacklevel would name a wrapper here, _call's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    f, level = sys._getframe(1), 2
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        f, level = f.f_back, level + 1
    warnings.warn(message, stacklevel=level)


def _wait(name, v, default):
    """A timeout in seconds: None takes default; else a finite number > 0
    (every call has a deadline: infinity or NaN is refused)."""
    if v is None:
        return default
    v = _num(name, v)
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a finite number of seconds > 0 (None: the default), got {v}")
    return v


# A tensor name of Wan2.1's text-to-video DiT (wan/modules/model.py's
# WanModel state dict: the names docs/MODEL.md lists).
_WAN_NAME = re.compile(
    r"^(patch_embedding\.(weight|bias)|(text|time)_embedding\.[02]\.(weight|bias)|time_projection\.1\.(weight|bias)"
    r"|head\.head\.(weight|bias)|head\.modulation"
    r"|blocks\.\d+\.(modulation|norm3\.(weight|bias)|ffn\.[02]\.(weight|bias)"
    r"|(self|cross)_attn\.([qkvo]\.(weight|bias)|norm_[qk]\.weight)))$")

# tcp://HOST:PORT (HOST a name, an IPv4 address or a bracketed IPv6 one:
# [::1]), ipc://PATH, inproc://NAME
_ENDPOINT = re.compile(r"^(tcp://([^:/\s\[\]]+|\[[0-9A-Fa-f:.]+(%[\w.-]+)?\]):([0-9]{1,5})|ipc://\S+|inproc://\S+)$")


def _regular_file(path):
    """path, after checking it is a regular file: a FIFO or a device
    (/dev/zero) would be read forever."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f"{path}: not a regular file")
    return path


def sha256_file(path):
    """Lower-case hex sha256 of a file (a regular one: ValueError else)."""
    _regular_file(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _checkpoint_file(path, in_pipeline=False):
    """The file that names the checkpoint at path as Reel's loader resolves
    a folder (model/wan_ckpt.c): a pipeline root's transformer/,
    then diffusion_pytorch_model.safetensors, its index, the one index, or
    the one safetensors file. ValueError when the folder holds none or
    several."""
    if not os.path.isdir(path):
        return path
    names = [n for n in os.listdir(path) if not n.startswith(".")]
    st = sorted(n for n in names if n.endswith(".safetensors"))
    idx = sorted(n for n in names if n.endswith(".safetensors.index.json"))
    if not in_pipeline and ("model_index.json" in names or (not st and not idx and "transformer" in names)):
        return _checkpoint_file(os.path.join(path, "transformer"), True)
    if "diffusion_pytorch_model.safetensors" in st:
        return os.path.join(path, "diffusion_pytorch_model.safetensors")
    if "diffusion_pytorch_model.safetensors.index.json" in idx:
        return os.path.join(path, "diffusion_pytorch_model.safetensors.index.json")
    if len(idx) == 1:
        return os.path.join(path, idx[0])
    if not idx and len(st) == 1:
        return os.path.join(path, st[0])
    raise ValueError(f"{path}: {'several checkpoints' if st or idx else 'no safetensors file or index'} in this folder")


def checkpoint_identity(path):
    """The sha256 a SYNC announces for the checkpoint at path, in any layout
    Reel loads (docs/PROTOCOL.md, "The identity of a checkpoint"): a file's
    bytes; for a sharded checkpoint, sha256(index || sha256(shard)...) over
    its shards in name order. What `reelctl weights inspect` prints."""
    f = _checkpoint_file(path)
    if not f.endswith(".index.json"):
        return sha256_file(f)
    with open(_regular_file(f), "rb") as fh:
        raw = fh.read()
    h = hashlib.sha256(raw)
    for name in sorted(set(json.loads(raw)["weight_map"].values())):
        h.update(bytes.fromhex(sha256_file(os.path.join(os.path.dirname(f), name))))
    return h.hexdigest()


_KEY_FIELDS = ("role", "name", "public-key", "secret-key")


def read_key(path, secret):
    """A Reel key file (docs/SECURITY.md, `reelctl keys new`) as a dict of
    role, name, public-key and, in a NAME.key (secret=True), secret-key.
    Raises ValueError on anything net/keys.c refuses: a field unknown,
    twice or missing, a key that is not 40 z85 characters, a secret file
    its group or others may read, any key file they may write."""
    st = os.stat(path)
    import stat
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file")
    if st.st_size > 4096:
        raise ValueError(f"{path}: larger than a key file (4096 bytes)")
    if st.st_mode & 0o022:
        raise ValueError(f"{path}: group or others may write it (chmod 600)")
    if secret and st.st_mode & 0o077:
        raise ValueError(f"{path}: a secret key its group or others may read (chmod 600)")
    key = {}
    with open(path, "r", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"{path}: line {n}: expected 'field = value'")
            field, value = (x.strip() for x in line.split("=", 1))
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if field not in _KEY_FIELDS:
                raise ValueError(f"{path}: line {n}: unknown field {field!r}")
            if field in key:
                raise ValueError(f"{path}: line {n}: {field!r} given twice")
            if field.endswith("-key"):
                try:
                    ok = len(value) == 40 and len(zmq.utils.z85.decode(value.encode())) == 32
                except Exception:
                    ok = False
                if not ok:
                    raise ValueError(f"{path}: line {n}: {field!r} is not a z85 CURVE key (40 characters)")
            key[field] = value
    for field in _KEY_FIELDS[:3]:
        if field not in key:
            raise ValueError(f"{path}: no {field!r} field")
    if secret != ("secret-key" in key):
        raise ValueError(f"{path}: " + ("no 'secret-key' field: a public key file?" if secret else
                                        "holds a secret key: give the NAME.pub file, not NAME.key"))
    return key


def _one_progress(progress):
    """A caller's progress(step, steps) as the receive loop calls it (with
    the request's id first); None stays None."""
    return None if progress is None else (lambda rid, step, steps: progress(step, steps))


def _group_seeds(n, seeds, seed, latents, kw):
    """A group's n and its samples' seeds (seeds, else seed + i modulo
    2^64, as the protocol says), latents checked for one per sample."""
    n = _uint("n", n, 1, 64)
    if "latent" in kw:
        raise TypeError("a group takes latents= (one starting latent per sample, or an [n, C, F, H, W] "
                        "array), not latent=")
    if seeds is not None:
        if isinstance(seeds, (set, frozenset, dict, str, bytes)) or not hasattr(seeds, "__len__"):
            raise TypeError(f"seeds must be a sequence of n integers (a list, tuple or array), got "
                            f"{type(seeds).__name__}")
        if len(seeds) != n:
            raise ValueError(f"seeds must give one seed per sample: {len(seeds)} for n={n}")
        seeds = [_uint("seeds[%d]" % i, x) for i, x in enumerate(seeds)]
    else:
        base = _uint("seed", seed)
        seeds = [(base + i) % (1 << 64) for i in range(n)]
    if latents is not None and (isinstance(latents, (str, bytes)) or not hasattr(latents, "__len__")
                                or len(latents) != n):
        raise ValueError("latents must give one latent per sample")
    return n, seeds


def _call(fn):
    """A public call: one at a time per Client (a call from another thread
    waits for the running one; the client is not for concurrent use), and
    none after close(). A call from inside a progress callback (the same
    thread, in the middle of the call it reports on) raises RuntimeError:
    on the same socket it would read, and drop, the outer call's replies."""
    @functools.wraps(fn)
    def run(self, *args, **kw):
        with self._busy:
            if self._in_progress:
                raise RuntimeError(f"a Client call ({fn.__name__}) from inside its own progress callback: the "
                                   "call it reports on is still running on this socket; use another Client, "
                                   "or call after it returns")
            if self._closed:
                raise ReelError("closed", "this Client is closed")
            if self._depth:  # a call inside a call (sync's sync_lora): the outer one holds the socket and watch
                return fn(self, *args, **kw)
            self._ready()
            self._depth = 1
            try:
                return fn(self, *args, **kw)
            finally:
                self._depth = 0
                self._rest()
    return run


def _unwatch(sock, mon=None):
    """Stops sock's handshake monitor, then closes its reader mon (when
    given): in that order. libzmq's IO thread sends each event with a
    blocking send, and a reader closed while the socket still reports
    leaves that send, and every socket of the context, waiting for ever."""
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    if mon is not None:
        mon.close(0)


# The sockets Reel clients of this process hold (their DEALERs; a watch
# adds two more each): what an error at the context's socket limit or the
# process's open-file limit counts.
_open_lock = threading.Lock()
_open_count = 0
_clients = weakref.WeakSet()  # every Client of the process: a forked child resets each (_after_fork)


def _opened(n):
    global _open_count
    with _open_lock:
        _open_count += n


def _after_fork():
    """In a forked child (multiprocessing's fork, a DataLoader's workers):
    the parent's sockets are not this process's to use or count, and each
    Client opens its own at its next call, with a token and ids of its own
    (Client._forked)."""
    global _open_lock, _open_count
    _open_lock, _open_count = threading.Lock(), 0
    for c in list(_clients):
        c._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _Sockets:
    """A Client's DEALER and, while a call waits for the broker's first
    answer on it, the reader of its handshake monitor (libzmq's PAIR
    behind it makes a third socket), in the process that made them. The
    Client's finalizer holds this, so a client dropped without close()
    closes whatever it holds then, in the safe order (close)."""

    __slots__ = ("sock", "mon", "ctx", "pid", "linger")

    def __init__(self, sock, ctx):
        self.sock, self.mon, self.ctx, self.pid, self.linger = sock, None, ctx, os.getpid(), 0
        _opened(1)

    def unwatch(self):
        """Ends the watch, if one runs: the monitor stopped, its reader
        closed (pending events are dropped with it), and only then let go
        of (an interrupt before leaves it to close() in order). Nothing in
        another process (below)."""
        if self.mon is not None and self.pid == os.getpid():
            _unwatch(self.sock, self.mon)
        self.mon = None

    def close(self):
        """Closes the socket (lingering self.linger ms), its monitor
        stopped first; does nothing the second time, nor in a process
        forked after they were made: they are the parent's (pyzmq leaves
        them alone there too), and stopping a monitor would signal the
        parent's ZeroMQ threads through the descriptors the two processes
        share. Cannot fail."""
        if self.sock is None or self.pid != os.getpid():
            return
        self.unwatch()
        sock, self.sock = self.sock, None
        sock.close(self.linger)
        _opened(-1)


def _new_socket(ctx, kind):
    """ctx.socket(kind); at the context's socket limit or the process's
    open-file limit (libzmq's EMFILE), an OSError EMFILE that says which,
    and what to do, instead of zmq's bare 'Too many open files'."""
    try:
        return ctx.socket(kind)
    except zmq.ZMQError as e:
        if e.errno != errno.EMFILE:
            raise
    raise _out_of_sockets(ctx) from None


def _fd_use():
    """(in use, limit) of this process's file descriptors, in use None
    when not known; and whether they are all in use (a descriptor made now
    would fail with EMFILE)."""
    if resource is None:
        return None, None, False
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    try:  # (listing them takes one: when even that fails, the process is out of them)
        used = len(os.listdir("/proc/self/fd")) - 1
    except OSError as e:  # (no /proc: not known)
        return None, soft, e.errno == errno.EMFILE
    return used, soft, soft != resource.RLIM_INFINITY and used + 1 >= soft


def _out_of_fds_text(used, soft):
    return f"this process has {'all ' if used is None else f'{used} of '}its {soft} open files (ulimit -n) in use"


def _out_of_sockets(ctx):
    """The OSError EMFILE _new_socket raises: which limit, and the way out."""
    used, soft, out = _fd_use()
    held = (f"{_open_count} Reel Client{'s' if _open_count != 1 else ''} of this process hold"
            f"{'s' if _open_count == 1 else ''} a socket")
    if out:
        why = (f"{_out_of_fds_text(used, soft)} ({held}): a Client holds one descriptor for its socket and one for "
               "its connection (two more while a call waits for the broker's first answer); close() the clients no "
               "longer used, or raise the limit (ulimit -n, resource.setrlimit)")
    else:
        try:
            most = ctx.get(zmq.MAX_SOCKETS)
        except zmq.ZMQError:
            most = "?"
        why = (f"the ZeroMQ context has all its {most} sockets in use ({held}; a socket closed frees its place a "
               "moment later): a Client holds one socket once called (three while a call waits for the broker's "
               "first answer); close() the clients no longer used, or give Client(context=) a zmq.Context whose "
               "zmq.MAX_SOCKETS is larger (set before its first socket)")
    return OSError(errno.EMFILE, f"cannot open a socket for a Reel Client: {why}")


class Client:
    """Connects to the broker's client endpoint (default tcp://127.0.0.1:5555):
    tcp://HOST:PORT (an IPv6 address in brackets, tcp://[::1]:5555; a port
    in 1..65535), ipc://PATH or inproc://NAME; else ValueError.

    timeout: seconds to wait for a reply (a GEN waits at least its own
    deadline_ms plus a margin). key and broker_key: this client's NAME.key
    (a client key, or a trainer key to sync) and the broker's broker.pub,
    for a broker started with --keys (CURVE); when not given, $REEL_KEY and
    $REEL_BROKER_KEY; neither: a plain connection, which a broker with keys
    never answers (calls raise ReelTimeout). A socket whose handshake the
    broker refused so that libzmq never retries it (a key not in its
    allowlist, CURVE on one side only), or on which a send waited out its
    call's timeout, is replaced at the next call by a fresh one (the same
    endpoint and keys): a key the broker admits later (its allowlist
    reloaded) is admitted at this client's next call. One refused so while
    a call waits is replaced during the call too (after 0.1 s, then twice
    as long each time up to once a second, until the call's timeout; what
    the call sent goes again on it): a call already waiting when the key
    is added and the broker reloaded goes through. A call that times out
    so still says the key was refused.

    liveness: seconds of silence while a GEN waits before the client asks
    the broker for STATUS; when that goes unanswered as long, the broker is
    taken for gone and the GEN is sent again with its id and this client's
    token (a broker that still holds it answers it once; a restarted one
    runs it again, with the same result: docs/PROTOCOL.md "Delivery").
    The broker's boot id is learnt at the first GEN and from every RESULT
    (a broker restarted between two calls is then not taken for one that
    lost the second call's GEN).
    Default 3.0, or $REEL_CLIENT_LIVENESS_MS / 1000; 0: never resend. A
    number >= 0 (else TypeError or ValueError naming it; the variable must
    be a whole number of milliseconds >= 0, else a ValueError naming it).
    .resends counts the GENs sent again.

    broker may list up to 4 endpoints, "A,B": a standby pair
    (docs/PROTOCOL.md "A standby broker"). The client talks to one at a
    time, the first to begin with, on one socket; when its broker answers
    a GEN, SYNC or UPLOAD with ERROR standby, or stays silent for the
    liveness (as above), it moves to the next one: a new socket (the same
    keys), a STATUS first (the new broker's boot id), then what was
    unanswered again (the same id; a GEN with the same token). After a
    round of standby answers it pauses 200 ms. .endpoint is the endpoint it
    talks to now, .switches counts its moves. With one endpoint, ERROR
    standby is raised as any ReelError (code "standby").

    context: the zmq.Context its sockets are made on (None, the default:
    the process's zmq.Context.instance(), shared by every Client). What a
    Client holds: nothing until its first call; from then on one socket
    and, while connected, its connection: two file descriptors. While a
    call waits for the broker's first answer on that socket, a watch of its
    handshakes (for the hints of a ReelTimeout) adds two sockets and two
    descriptors; the watch ends with the call. close() (or the end of a
    with block) closes the socket at once (libzmq frees its descriptors a
    moment later); a Client dropped without close() closes at its garbage
    collection. A context holds at most
    zmq.MAX_SOCKETS (1023) sockets, a process ulimit -n descriptors: a call
    that cannot make its socket raises OSError EMFILE saying which limit.

    Forks: in a process forked after it was made (multiprocessing's fork,
    a DataLoader's workers) a Client opens its own socket at its first call
    there, on that process's zmq.Context.instance(), with a token and
    request ids of its own; the parent's socket is left to the parent. A
    Client cannot be pickled (spawn, forkserver): make one in each
    process."""

    def __init__(self, broker="tcp://127.0.0.1:5555", timeout=120.0, context=None, key=None, broker_key=None,
                 liveness=None):
        key = key or os.environ.get("REEL_KEY") or None
        broker_key = broker_key or os.environ.get("REEL_BROKER_KEY") or None
        if bool(key) != bool(broker_key):
            raise ValueError("give both key (this client's NAME.key, or REEL_KEY) and broker_key (the broker's "
                             "broker.pub, or REEL_BROKER_KEY), or neither")
        eps = [e.strip() for e in broker.split(",")] if isinstance(broker, str) else []
        if not 1 <= len(eps) <= MAX_BROKERS or any(not e or len(e) >= 256 for e in eps):
            raise ValueError(f"broker endpoint list {broker!r}: 1 to {MAX_BROKERS} endpoints separated by commas")
        for e in eps:
            m = _ENDPOINT.match(e)
            if not m:
                raise ValueError(f"broker endpoint {e!r}: expected tcp://HOST:PORT (HOST a name, an address or "
                                 "[IPv6]), ipc://PATH or inproc://NAME")
            if m.group(4) is not None and not 1 <= int(m.group(4)) <= 65535:
                raise ValueError(f"broker endpoint {e!r}: port {int(m.group(4))} is not in 1..65535")
        timeout = _wait("timeout", timeout, 120.0)
        liveness = _liveness(liveness)
        self._eps = eps  # a broker, or a standby pair: talked to one at a time
        self._at = 0     # ... the one the socket is connected to
        self.switches = 0  # moves to another endpoint of the list
        self._curve = None
        if key:
            mine, server = read_key(key, True), read_key(broker_key, False)
            if mine["role"] not in ("client", "trainer"):
                raise ValueError(f"{key}: a {mine['role']} key cannot be a client's")
            if server["role"] != "broker":
                raise ValueError(f"{broker_key}: a {server['role']} key, not the broker's (role broker)")
            # kept for the sockets of a move to another broker of the list
            self._curve = (server["public-key"].encode(), mine["public-key"].encode(), mine["secret-key"].encode())
        self._ctx = context  # None: the process's zmq.Context.instance(), looked up at each socket made
        # The socket is opened at the first call (_ready): a Client never
        # called holds none, and costs the process no descriptor.
        self._held = self._fin = None
        self._answered = False  # the broker answered on this socket: its handshake succeeded, no watch
        self._hs = None  # what the watch saw last: why the broker never answers (_handshake_hint)
        self._hs_inherited = False  # self._hs is the socket's it replaced: its own first event replaces it
        self._hs_events = 0  # handshake events read, over this client's life (they are not kept)
        self._unsendable = False  # a send on this socket waited out its deadline (no pipe: _ready)
        self._fresh = 0  # sockets opened in place of a dead one (_ready, _refresh), over this client's life
        self._retry_at = None  # when the call replaces its socket refused for good (_refresh; None: not due)
        self._retry_s = _RETRY_MIN  # ... the wait before the next such socket (backoff, per call)
        self._refreshed = False  # the call's socket was replaced so: what it awaits goes again (_recv_any)
        self._closed = False
        self._depth = 0  # public calls running (a sync's sync_lora runs inside its sync)
        self._fresh_identity()
        self.liveness = liveness
        self.resends = 0
        self.timeout = timeout
        self._base = None  # the last full version this client published
        self.broker = broker
        self._busy = threading.RLock()  # one call at a time (_call): another thread's waits its turn
        self._in_progress = False  # a progress callback runs (_call refuses a call from it)
        self._cancelled = False  # a CANCEL went: close() lingers a moment so it leaves
        _clients.add(self)

    def _fresh_identity(self):
        """New request ids and client token, no broker known: at the start,
        and in a process forked from this client's (where the parent's ids
        and token would name the parent's requests at the broker)."""
        self._ids = itertools.count(random.randrange(1, 1 << 30))
        self._token = int.from_bytes(os.urandom(8), "little") or 1  # GEN "client": this client's requests
        self._boot = None  # the broker's boot id last seen

    def _forked(self):
        """In a child process (os.register_at_fork): the parent's socket is
        left to it (never used or closed here; its finalizer does nothing
        here either) and the next call opens this process's own, on this
        process's zmq.Context.instance() (a context given is the parent's:
        libzmq contexts do not survive a fork). A lock another thread of the
        parent held stays held in the child: a new one."""
        if self._fin is not None:
            self._fin.detach()
        self._held = self._fin = None
        self._ctx = None
        self._answered = self._unsendable = self._hs_inherited = self._refreshed = False
        self._hs = None
        self._retry_at = None
        self._busy = threading.RLock()
        self._in_progress = False
        self._depth = 0
        self._cancelled = False
        self._fresh_identity()

    def __reduce__(self):
        raise TypeError("a reel.Client cannot be pickled (multiprocessing's spawn or forkserver, a DataLoader "
                        "worker that is not forked): make one in each process, e.g. in a DataLoader's "
                        "worker_init_fn; a process forked from this one may use it (it opens its own socket there)")

    @property
    def endpoint(self):
        """The endpoint of the list this client talks to now."""
        return self._eps[self._at]

    @property
    def endpoints(self):
        """The endpoint list it was given: one broker, or a standby pair."""
        return tuple(self._eps)

    @property
    def _sock(self):
        return self._held.sock if self._held is not None else None

    @property
    def _mon(self):
        return self._held.mon if self._held is not None else None

    def _open(self, inherit=False):
        """A DEALER connected to the current endpoint, watched (_watch), as
        self._held; self._held and self._fin are replaced only once it is
        made (a failure, an interrupt included, closes what was made and
        raises, leaving them as they were). Raises OSError EMFILE naming the
        limit when the process has no socket left (_new_socket). inherit:
        the verdict of the socket it replaces (the same endpoint) stays
        until the new one's first event replaces it; else it starts with
        none."""
        ctx = self._ctx if self._ctx is not None else zmq.Context.instance()
        held = _Sockets(_new_socket(ctx, zmq.DEALER), ctx)
        try:
            sock = held.sock
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MSG)
            if self._eps[self._at].startswith("tcp://["):  # an IPv6 address: ZeroMQ connects to none without
                sock.setsockopt(zmq.IPV6, 1)
            if self._curve:
                sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self._curve
            self._watch(held)
            sock.connect(self._eps[self._at])
        except BaseException:
            held.close()
            raise
        # A client dropped without close() (or in a reference cycle) closes
        # them in that order too: the finalizer holds them until it runs,
        # where the garbage collector would close them in any order.
        fin = weakref.finalize(self, held.close)
        fin.atexit = False  # at exit the sockets stay as they are (a daemon thread may still use them)
        self._held, self._fin, self._answered, self._unsendable = held, fin, False, False
        if not inherit:
            self._hs = None
        self._hs_inherited = self._hs is not None

    _HS_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                  zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH |
                  zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED)
    _monitors = itertools.count(1)

    def _watch(self, held):
        """Starts held's watch: a PAIR reading its socket's handshake
        events (none when libzmq cannot give one, at the socket limit say:
        the calls then go without the hints). A broker that refuses this
        client's key, or speaks no CURVE, or cannot read its HELLO, never
        answers, and a timeout is all the caller would see otherwise.

        A watch runs only while a call runs, until the broker's first
        answer on the socket: the events are read as they come (_wait), and
        at the call's end the watch stops (_rest). An idle client whose
        connection keeps failing (a broker down, one that hangs up every
        handshake: 7 to 20 events a second) piles nothing up, and holds one
        socket, not three."""
        addr = "inproc://reel-client-handshakes-%d-%d" % (id(self), next(self._monitors))
        mon = None
        try:
            held.sock.monitor(addr, self._HS_EVENTS)
            mon = held.ctx.socket(zmq.PAIR)
            mon.setsockopt(zmq.LINGER, 0)
            # no high-water mark: libzmq's IO thread would block on a full
            # pipe; what bounds the pipe is reading it as events come, and
            # the watch's end with the call
            mon.setsockopt(zmq.RCVHWM, 0)
            mon.connect(addr)
        except BaseException as e:
            _unwatch(held.sock, mon)
            if not isinstance(e, zmq.ZMQError):
                raise
            return
        held.mon = mon

    # Verdicts after which libzmq never connects that socket again: a key
    # the broker's ZAP handler refused, a mechanism mismatch (protocol
    # errors: libzmq ends the connection's session instead of retrying).
    _DEAD = ("auth", "mechanism")

    def _ready(self):
        """Before a call: the socket, opened at the first (or here again in
        a forked process); its watch started again when the broker has not
        answered on it yet. A socket dead for good is replaced by a fresh
        one (same endpoint, same keys): one whose handshake the broker
        refused so that libzmq never tries again (_DEAD: a key it did not
        admit then may be admitted since, by a reload), or one on which a
        send waited out its deadline (no pipe: its connection ended so,
        whatever the watch saw or missed; or a queue of what no broker
        took, dropped with it). During the call, a socket refused so is
        replaced again (_refresh)."""
        self._retry_at, self._retry_s, self._refreshed = None, _RETRY_MIN, False
        if self._held is None:
            self._open()
        elif self._unsendable or (self._hs is not None and self._hs[0] in self._DEAD):
            self._replace()
            self._fresh += 1
        elif self._held.mon is None and not self._answered:
            self._watch(self._held)

    def _rest(self):
        """After a call: its watch ends (what it saw so far is read into
        self._hs first)."""
        if self._held is not None and self._held.mon is not None:
            self._read_handshakes()
            if self._held is not None:
                self._held.unwatch()

    def _refresh(self):
        """While a call waits: when the broker refused the handshake of the
        call's socket for good (_DEAD, this socket's own verdict: libzmq
        never tries it again, and what was sent on it is dropped), a fresh
        socket (same endpoint, same keys) once the backoff has passed
        (_RETRY_MIN doubling to _RETRY_MAX), so that a key the broker admits
        meanwhile (added and reloaded) lets the waiting call through. The
        fresh socket inherits the verdict (a timeout still says the key was
        refused) until its own handshake ends. True, with self._refreshed
        set, when it replaced the socket; False otherwise (one that cannot
        be made is tried again after the backoff)."""
        if self._answered or self._hs is None or self._hs[0] not in self._DEAD or self._hs_inherited:
            self._retry_at = None
            return False
        now = time.monotonic()
        if self._retry_at is None:  # the refusal just seen: the backoff starts
            self._retry_at = now + self._retry_s
        if now < self._retry_at:
            return False
        self._retry_s, self._retry_at = min(2 * self._retry_s, _RETRY_MAX), None
        try:
            self._replace()
        except (OSError, zmq.ZMQError):  # no socket to be had now (EMFILE): the old one stays until the next try
            self._retry_at = now + self._retry_s
            return False
        self._fresh += 1
        self._refreshed = True
        return True

    def _read_handshakes(self):
        """Reads the socket's handshake events so far into self._hs, the
        one verdict the hint needs (the events themselves are not kept):
        each is read as it comes while a call waits (_wait), the rest when
        the call ends (_rest)."""
        held = self._held
        while held is not None and held.mon is not None:
            try:
                frames = held.mon.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            self._hs_events += 1
            if len(frames[0]) < 6:
                continue
            event, value = struct.unpack("<HI", bytes(frames[0][:6]))
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._heard()
                break
            elif event == zmq.EVENT_CONNECT_RETRIED:
                # every connection attempt failed so far (nothing listening);
                # a handshake's failure says more, but not the last socket's
                if self._hs is None or self._hs_inherited:
                    self._hs, self._hs_inherited = ("refused", value), False
            elif event == zmq.EVENT_CONNECTED:
                if self._hs is not None and self._hs[0] == "refused":
                    self._hs, self._hs_inherited = None, False
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._hs, self._hs_inherited = ("auth", value), False
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == 0x11000002:  # mechanism mismatch
                self._hs, self._hs_inherited = ("mechanism", value), False
            else:
                self._hs, self._hs_inherited = ("closed", value), False

    def _heard(self):
        """The broker answered on this socket (or its handshake succeeded):
        no hint to give, and the watch ends for the socket's life (it then
        holds one socket, not three: a context has 1023)."""
        self._answered = True
        self._hs, self._hs_inherited = None, False
        if self._held is not None:
            self._held.unwatch()

    def _handshake_hint(self):
        """What a timeout adds: why the broker never let this client in
        ("" when the socket saw no handshake fail). The verdict is the last
        the socket's watch saw, in this call or an earlier one, or the one
        its socket replaced saw (_replace) until it sees an event of its
        own: a socket refused for good gets nothing new."""
        self._read_handshakes()
        kind = self._hs[0] if self._hs else None
        if kind == "auth":
            return (f"; the broker refused this client's key at the handshake (ZAP status {self._hs[1]}: a key not "
                    "in its allowlist, or one of another role: docs/SECURITY.md)")
        if kind == "mechanism":
            return ("; the handshake failed: this client has CURVE keys and the broker runs without any"
                    if self._curve else "; the handshake failed: the broker requires CURVE keys and this client "
                    "has none (key=, broker_key=, or REEL_KEY and REEL_BROKER_KEY: docs/SECURITY.md)")
        if kind == "closed" and self._curve:
            return ("; the broker closed every CURVE handshake: the broker key given (broker_key, REEL_BROKER_KEY) "
                    "is probably not its public key")
        if kind in ("refused", None):
            # libzmq retries a connection whose descriptor it could not
            # make, as one refused, and says nothing else
            used, soft, out = _fd_use()
            if out:
                return (f"; {_out_of_fds_text(used, soft)}: a connection needs one more (close() the clients no "
                        "longer used, or raise the limit: ulimit -n, resource.setrlimit)")
        if kind == "refused":
            return (f"; nothing accepted a connection at {self._eps[self._at]} (is a broker running there? the "
                    "Client's endpoint names it)")
        if kind == "closed":  # a keyless broker takes a keyless client: one that requires keys hangs up first
            return ("; the broker closed every handshake: it probably requires CURVE keys and this client has none "
                    "(key=, broker_key=, or REEL_KEY and REEL_BROKER_KEY: docs/SECURITY.md)")
        return ""

    def _drop(self, linger=0):
        """Closes this client's socket (and its watch) now, once; none
        after. Cannot fail (but for an interrupt)."""
        held, fin = self._held, self._fin
        self._held = self._fin = None
        if fin is not None:
            # the watch stopped while the finalizer still holds the sockets:
            # an interrupt after leaves nothing to close in order
            held.unwatch()
            held.linger = linger
            fin()  # held.close(), once: a finalizer that ran already does nothing

    def _replace(self):
        """A fresh socket to the same endpoint in place of the current one,
        closed with what it held unsent; the verdict carries over (_open's
        inherit), no boot id known. Raises as _open, the old socket kept."""
        old, old_fin = self._held, self._fin
        self._open(inherit=True)
        if old_fin is not None:
            old.unwatch()
            old_fin()
        self._boot = None

    def _forget_unsent(self):
        """A fresh socket to the same broker, nothing of the old one kept:
        after a SYNC (or an upload) that timed out, what the socket still
        held unsent would otherwise go to a broker that comes back later,
        and a sync the caller was told failed (ReelTimeout) would apply
        after all."""
        try:
            self._replace()
        except BaseException:  # (a second interrupt, a terminated context, no socket left) the old one stays
            return

    def _switch(self):
        """Moves to the next endpoint of the list (a standby pair's other
        broker): a new socket, nothing of the old one's queue kept (late
        answers of the old broker are gone with it), no boot id known."""
        if len(self._eps) < 2:
            return
        self._drop()
        self._at = (self._at + 1) % len(self._eps)
        self._boot = None
        self.switches += 1
        self._open()

    def close(self):
        """Closes the socket now (libzmq's reaper thread gives its
        descriptors back a moment later); a call after raises ReelError
        "closed". Waits for a call running in another thread. Closing twice
        does nothing; a client dropped without close() closes at its
        garbage collection."""
        with self._busy:
            self._closed = True
            # a CANCEL still queued goes out, within 500 ms
            self._drop(500 if self._cancelled else 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- framing -------------------------------------------------------

    def _wait(self, flags, by):
        """Waits until the socket is ready for flags (zmq.POLLIN or
        zmq.POLLOUT), or the monotonic deadline by: True when it is; False
        at by, or earlier when the socket was replaced by a fresh one
        (_refresh: its handshake refused for good; the caller sends on the
        fresh one). While a watch runs, its events are read as they come
        (a call that waits long keeps no backlog of them either)."""
        while True:
            if self._refresh():
                return False
            left = by - time.monotonic()
            ms = min(int(left * 1000) + 1, _MAX_MS) if left > 0 else 0
            if self._retry_at is not None:  # a fresh socket is due before then
                ms = min(ms, max(0, int((self._retry_at - time.monotonic()) * 1000) + 1))
            held = self._held
            if held.mon is None:
                return bool(held.sock.poll(ms, flags))
            poller = zmq.Poller()
            poller.register(held.sock, flags)
            poller.register(held.mon, zmq.POLLIN)
            ready = dict(poller.poll(ms))
            if held.sock in ready:
                return True
            if held.mon not in ready:
                if self._retry_at is not None and time.monotonic() < by:
                    continue  # the poll was cut short for the fresh socket due
                return False
            self._read_handshakes()

    def _put(self, frames, by, rid):
        """Sends frames as one message, by the monotonic deadline by; raises
        ReelTimeout when it cannot go by then. A DEALER with no connection
        (a broker with --keys refused this client's handshake, or nothing
        listens) holds no pipe and a blocking send would wait forever."""
        while True:
            try:
                self._sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                pass
            if not self._wait(zmq.POLLOUT, by) and time.monotonic() >= by:
                self._unsendable = True  # the next call opens a fresh socket (_ready)
                raise ReelTimeout(f"could not send to {self.endpoint} in time: no connection (a broker with --keys "
                                  "refuses a client without its key)" + self._handshake_hint(), rid) from None

    def _send(self, mtype, rid, fields, tensors=(), *, by):
        """Sends a message by the monotonic deadline by (ReelTimeout else)."""
        # proto, type and id first: a receiver that refuses a later field
        # (a string too long) has read the id and answers it
        hdr = {"proto": PROTO, "type": mtype, "id": rid}
        hdr.update(fields)
        if mtype == "SYNC" and "client" not in hdr:
            # this client's token: a standby pair's standby knows a trainer that came back
            hdr["client"] = format(self._token, "016x")
        frames = []
        if tensors:
            hdr["tensors"] = []
            for name, a in tensors:
                hdr["tensors"].append({"name": name, "dtype": "F32", "shape": list(a.shape), "bytes": a.nbytes})
                frames.append(a.tobytes())
        self._put([msgpack.packb(hdr, use_bin_type=True)] + frames, by, rid)

    def _send_gen(self, rid, fields, tensors, by):
        self._send("GEN", rid, dict(fields, client=format(self._token, "016x")), tensors, by=by)

    def _send_gens(self, sent, by, send=None):
        """The GENs of sent (rid -> (fields, tensors)), or the messages
        send(rid, fields, tensors, by) sends (a SYNC: idempotent, so it may go
        again too), each by the call's deadline by; before this client's first, a STATUS (its answer names
        the broker that got them: its boot id). The waiting state
        _recv_live keeps across its calls."""
        send = send or self._send_gen
        st = {"ping": None, "boot": self._boot, "first": False, "asked": False, "resent": False, "send": send,
              "standbys": 0}
        if self.liveness and not self._boot:  # the first GEN: learn which broker gets it
            st.update(ping=next(self._ids), first=True, asked=True)
            self._send("STATUS", st["ping"], {}, by=by)
        for rid, (fields, tensors) in sent.items():
            send(rid, fields, tensors, by)
        return st

    def _recv_live(self, rids, deadline, sent, st, on_progress=None):
        """_recv_any for GENs sent by _send_gens: after `liveness` seconds of
        silence a STATUS; every GEN still waited for is sent again (same id
        and token) when that is not answered in as long either, or another
        broker answers (a new boot id: a restart lost them), or a RESULT
        names another boot than the one they reached (_resend_lost_to). A
        broker that still holds a GEN attaches the resend to it.

        With several endpoints (a standby pair), an ERROR standby answer to
        one of them, or that silence, moves the client to the next broker
        of the list (a new socket): a STATUS there first (its boot id), then
        every GEN still waited for again; after a round of standby answers
        a pause of 200 ms. With one endpoint, ERROR standby is raised.

        A socket the broker refused for good, replaced by a fresh one
        (_refresh), reached no broker: every GEN still waited for goes
        again on the fresh one (a STATUS first: no boot id known there),
        which is no resend (.resends does not count it)."""
        while True:
            move = False
            try:
                if not self.liveness:
                    return self._recv_any(rids, deadline, on_progress)
                ids = set(rids) | ({st["ping"]} if st["asked"] else set())
                got = self._recv_any(ids, min(deadline, time.monotonic() + self.liveness), on_progress)
                if got[0] != st["ping"]:
                    self._resend_lost_to(got, rids, sent, st, deadline)
                    return got
                was_first = st["first"]
                st.update(asked=False, first=False)
                now_boot = int(got[1].get("boot") or "0", 16)
                if was_first and now_boot:
                    st["boot"] = self._boot = now_boot  # the broker that got the GENs
                    continue
                if not now_boot or (not was_first and now_boot == st["boot"]):
                    continue  # the same broker (or one older than resends): they still run
                if not st["boot"] and st["resent"]:  # a late answer: the resend went after it, to this broker
                    st["boot"] = self._boot = now_boot
                    continue
                st["boot"] = self._boot = now_boot  # another broker: a restart lost them
            except _Refreshed:
                if self.liveness:
                    st.update(ping=next(self._ids), asked=True, first=True, boot=None, resent=False)
                    self._send("STATUS", st["ping"], {}, by=deadline)
                for rid in rids:
                    st["send"](rid, *sent[rid], deadline)
                continue
            except ReelTimeout as e:
                if not self.liveness or time.monotonic() >= deadline:
                    n = len(self._eps)
                    if n > 1 and st["standbys"] >= n:
                        # the deadline came while a broker was asked: what
                        # the others answered still says why
                        raise ReelTimeout(f"no answer from {self.broker} in time: every broker is the standby "
                                          f"({st['standbys']} answers standby, the last broker asked none in time)",
                                          e.request_id) from None
                    if st.get("shut_at") is not None:
                        raise ReelTimeout(f"{e.message}; the broker said it was shutting down "
                                          f"{time.monotonic() - st['shut_at']:.1f} s ago and none has answered since "
                                          "(the request goes again to the one that comes back)", e.request_id) from None
                    raise
                if not st["asked"]:  # silent for `liveness`: is it there?
                    st.update(ping=next(self._ids), asked=True, first=False, resent=False)
                    self._send("STATUS", st["ping"], {}, by=deadline)
                    continue
                st.update(asked=False, first=False)  # gone, or stuck
                move = len(self._eps) > 1  # a standby pair: the other broker
            except ReelError as e:
                if e.code == "shutdown" and e.request_id in rids and self.liveness:
                    # The broker is stopping (a restart, a deploy): not an
                    # answer. It goes silent, or another boot answers the
                    # next STATUS: the GENs go again there, as after a crash
                    # (docs/PROTOCOL.md "Delivery"). A pair's other broker
                    # is asked at once.
                    if st.get("shut_at") is None:
                        st["shut_at"] = time.monotonic()
                    if len(self._eps) < 2:
                        continue
                    move = True
                elif e.code != "standby" or e.request_id not in rids or len(self._eps) < 2:
                    raise
                else:
                    # The standby of a pair: the other broker serves. After a
                    # round of standbys (a pair still choosing), a pause.
                    st["standbys"] += 1
                    if st["standbys"] % len(self._eps) == 0:
                        pause = min(STANDBY_PAUSE, deadline - time.monotonic())
                        if pause > 0:
                            time.sleep(pause)
                    if time.monotonic() >= deadline:
                        raise ReelTimeout(f"no answer from {self.broker} in time: every broker is the standby",
                                          e.request_id)
                    move = True
            if move:  # to the next broker of the list, a STATUS first (its boot id)
                self._switch()
                if self.liveness:
                    st.update(ping=next(self._ids), asked=True, first=True, boot=None)
                    self._send("STATUS", st["ping"], {}, by=deadline)
            self.resends += 1
            st["resent"] = True
            for rid in rids:
                st["send"](rid, *sent[rid], deadline)

    def _resend_lost_to(self, got, rids, sent, st, deadline):
        """An answer got (rid, header, tensors) to one of rids: when it is a
        RESULT naming another broker than the one the others reached (a
        restart quicker than a liveness of silence, answering one sent
        since), every other GEN of rids goes again now. The answers to
        those sent since may never leave the silence a STATUS waits for,
        and those the restart lost would wait out their timeouts. A send
        that fails here is left to the next wait (this answer is kept)."""
        try:
            boot = int(got[1].get("boot") or "0", 16) if got[1].get("type") == "RESULT" else 0
        except (TypeError, ValueError):
            boot = 0
        others = [rid for rid in rids if rid != got[0]]
        if not boot or not st["boot"] or boot == st["boot"] or not others:
            return
        st["boot"] = boot
        self.resends += 1
        st["resent"] = True
        try:
            for rid in others:
                st["send"](rid, *sent[rid], deadline)
        except ReelError:
            pass

    def _recv_gens(self, rids, deadline, sent, st, on_progress=None):
        """_recv_live for GENs this call gives up on when it ends without
        their answers: when it raises (its timeout, a sample's error in a
        group of single GENs, KeyboardInterrupt), every GEN of rids still
        unanswered is cancelled, so the cluster stops it at its next step
        instead of running it to its deadline for nobody."""
        try:
            return self._recv_live(rids, deadline, sent, st, on_progress)
        except BaseException as e:
            self._cancel_after(e, rids)
            raise

    def _cancel_after(self, e, rids):
        """On exception e out of a call waiting for the GENs rids: a CANCEL
        for each, but the one e is the answer to (an ERROR or BUSY names
        it; a ReelTimeout's id names no answer)."""
        answered = e.request_id if isinstance(e, ReelError) and not isinstance(e, ReelTimeout) else None
        self._cancel([r for r in rids if r != answered])

    def _sending(self, sent, by):
        """_send_gens, cancelling the GENs of sent when it fails part-way
        (a send timeout, KeyboardInterrupt): those that went stop; a CANCEL
        of one that did not names nothing."""
        try:
            return self._send_gens(sent, by)
        except BaseException:
            self._cancel(list(sent))
            raise

    def _cancel(self, rids):
        """A CANCEL for each GEN of rids (docs/PROTOCOL.md "Cancelling"),
        never waiting: no reply of its own; the GEN's ERROR cancelled that
        follows is a late reply to an earlier call, which later calls drop.
        Nothing without a socket (a move to another broker that could not
        make one: its OSError is what the call raises)."""
        sock = self._sock
        if sock is None:
            return
        for rid in rids:
            hdr = {"proto": PROTO, "type": "CANCEL", "id": rid, "client": format(self._token, "016x")}
            try:
                sock.send(msgpack.packb(hdr, use_bin_type=True), zmq.NOBLOCK)
                self._cancelled = True
            except zmq.ZMQError:
                pass  # no connection: the broker's deadline ends it

    def _recv(self, rid, deadline, on_progress=None):
        """The final reply to rid: (header, {name: array}). Raises ReelError,
        BusyError or ReelTimeout."""
        return self._recv_any({rid}, deadline, on_progress)[1:]

    def _recv_any(self, rids, deadline, on_progress=None):
        """The next final reply to any of rids: (rid, header, {name: array});
        replies to other ids are late ones of earlier calls, dropped. Raises
        ReelError, BusyError (carrying the rid) or ReelTimeout; _Refreshed
        when the call's socket was replaced by a fresh one (_refresh, here
        or in a send since the last wait), for the caller to send again."""
        rid = min(rids) if rids else 0
        while True:
            left = deadline - time.monotonic()
            if left > 0 and self._refreshed:  # a fresh socket (_refresh): what rids answer goes again on it
                self._refreshed = False
                raise _Refreshed()
            if left <= 0 or not self._wait(zmq.POLLIN, deadline):
                if time.monotonic() >= deadline:
                    raise ReelTimeout(f"no reply from {self.endpoint} in time" + self._handshake_hint(), rid)
                continue
            # the rest of a message whose reading an interrupt cut short
            # (KeyboardInterrupt between its frames) is dropped first: its
            # tensor frames are no header
            while self._sock.getsockopt(zmq.RCVMORE):
                self._sock.recv()
            frames = self._sock.recv_multipart()
            if not self._answered:  # the broker answered: its handshake succeeded, the watch can end
                self._heard()
            try:
                hdr = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
            except ValueError:
                continue  # not a message of the protocol: no reply to wait for
            if not isinstance(hdr, dict) or hdr.get("id") not in rids:
                continue  # a late reply to an earlier call
            rid = hdr["id"]
            mtype = hdr.get("type")
            if mtype == "PROGRESS":
                if on_progress:  # a decode's latent frames continue the steps: one count over both
                    self._in_progress = True
                    try:
                        on_progress(rid, hdr.get("step", 0) + hdr.get("decoded", 0),
                                    hdr.get("steps", 0) + hdr.get("decode_frames", 0))
                    finally:
                        self._in_progress = False
                continue
            if mtype == "ERROR":
                raise ReelError(hdr.get("code", "internal"), hdr.get("message", ""), rid)
            if mtype == "BUSY":
                raise BusyError(hdr.get("message", "busy"), rid)
            if mtype == "RESULT" and hdr.get("boot"):
                # the answering broker's boot id, for the next call: a restart between calls is then no
                # reason to send a live GEN again at its first liveness STATUS
                try:
                    self._boot = int(hdr["boot"], 16) or self._boot
                except (TypeError, ValueError):
                    pass
            tensors = {}
            for desc, frame in zip(hdr.get("tensors", []) or [], frames[1:]):
                kind = {"F32": "<f4", "U8": "u1"}.get(desc.get("dtype"))
                if kind is None:
                    raise ReelError("malformed", f"reply tensor {desc.get('name')} is {desc.get('dtype')}", rid)
                tensors[desc["name"]] = np.frombuffer(frame, dtype=kind).reshape(desc["shape"]).copy()
            return rid, hdr, tensors

    # ---- calls ---------------------------------------------------------

    @_call
    def gen(self, model, context=None, *, steps=_DEFAULT, latent_shape=None, latent=None, uncond=None, cfg=_DEFAULT,
            shift=_DEFAULT, sde=False, eta=0.7, seed=0, version=None, deadline_ms=None, progress=None, timeout=None,
            return_trajectory=False, return_log_probs=False, return_means=False, solver=_DEFAULT,
            prompt=None, negative_prompt=None, output="latent"):
        """Runs one denoising loop on the cluster and returns a GenResult.

        context: [L, T] (T = the model's text width); uncond: [L, T] turns
        CFG on with scale cfg; latent: [C, F, H, W] (else drawn from seed by
        the worker, and latent_shape is required); version: the oldest
        transformer version it may run on (None: the current one);
        progress(step, steps) is called as steps finish (in this thread,
        inside the call: a call of this Client from it raises RuntimeError). return_trajectory,
        return_log_probs and return_means (the last two: sde with eta > 0)
        fill the GenResult's rollout fields. solver: "euler" (the default),
        or Wan2.1's "unipc" or "dpm++" (with their own sigma schedules); with
        sde, the grid the SDE steps run on (that solver's sigmas and int
        timesteps: Flow-GRPO's Wan rollouts with Wan's UniPC scheduler).

        steps is required with a context; cfg, shift and solver default to
        1.0, 1.0 and "euler" there.

        prompt (text) instead of context: the worker encodes it with its
        text encoder (with cfg != 1 also negative_prompt, or Wan's default
        negative prompt). With a prompt, steps, shift, cfg and solver not
        given are Wan2.1's text-to-video defaults (generate.py's): 50, 5.0,
        5.0 and "unipc" ("euler" with sde: Euler's grid, unless solver="unipc" asks for
        Flow-GRPO's Wan rollouts on UniPC's); cfg=1.0 turns guidance off. output: "latent" (the default), "frames" (the
        decoded video as uint8 [F', H', W', 3] in .frames) or "video" (an
        MP4's bytes in .video); the worker needs a VAE for those.

        A call that ends without its answer (timeout, ReelTimeout; an
        exception out of progress; KeyboardInterrupt) cancels the GEN: the
        cluster stops it at its next step, or its decode at its next latent
        frame (docs/PROTOCOL.md "Cancelling")."""
        fields, tensors, torch_out = self._gen_message(
            model, context, steps=steps, latent_shape=latent_shape, latent=latent, uncond=uncond, cfg=cfg,
            shift=shift, sde=sde, eta=eta, seed=seed, version=version, deadline_ms=deadline_ms, solver=solver,
            progress=progress is not None, return_trajectory=return_trajectory, return_log_probs=return_log_probs,
            return_means=return_means, prompt=prompt, negative_prompt=negative_prompt, output=output)
        rid = next(self._ids)
        wait = _wait("timeout", timeout, max(self.timeout, (fields.get("deadline_ms") or 60000) / 1000 + 5))
        t0 = time.monotonic()
        sent = {rid: (fields, tensors)}
        st = self._sending(sent, t0 + wait)
        _, hdr, out = self._recv_gens({rid}, t0 + wait, sent, st, _one_progress(progress))
        return self._gen_result(rid, hdr, out, fields["steps"], torch_out, t0)

    @_call
    def gen_group(self, model, context=None, *, n, steps=_DEFAULT, seeds=None, seed=0, latent_shape=None, latents=None,
                  timeout=None, deadline_ms=None, batched=True, progress=None, **kw):
        """A group of n samples of one prompt, as a Flow-GRPO trainer asks for
        them: sample i is gen(..., seed=seeds[i]) (or seed + i), with
        latents[i] as its starting latent when given. Returns the n
        GenResults in order; each is bitwise what gen() with the same
        arguments returns.

        batched=True (the default) sends one GEN with n: the worker runs the
        group as batched steps (batch n in the capture key, one graph for
        the group), in smaller batches when its budget demands.
        batched=False sends n separate GENs at once (the broker and the
        workers' streams run them side by side); it raises the first
        sample's ReelError (or BusyError) that comes back, and cancels the
        samples still running (as gen cancels on its timeout)."""
        n, seeds = _group_seeds(n, seeds, seed, latents, kw)
        if steps is not _DEFAULT:  # not given: gen()'s rule (a prompt's default 50; required with a context)
            steps = _uint("steps", steps)
        batched = _flag("batched", batched)
        if deadline_ms is not None:
            deadline_ms = _uint("deadline_ms", deadline_ms)
        wait = _wait("timeout", timeout, max(self.timeout, (deadline_ms or 60000) / 1000 + 5))
        # the rule of gen: torch out when any tensor in is torch (a latent of the list, or all of them as one)
        torch_latents = latents is not None and (_is_torch(latents) or any(_is_torch(x) for x in latents))
        t0 = time.monotonic()
        if batched:
            fields, tensors, torch_out = self._group_message(
                model, context, n, seeds, latents, steps=steps, latent_shape=latent_shape, deadline_ms=deadline_ms,
                progress=progress is not None, **kw)
            rid = next(self._ids)
            sent = {rid: (fields, tensors)}
            st = self._sending(sent, t0 + wait)
            _, hdr, out = self._recv_gens({rid}, t0 + wait, sent, st, _one_progress(progress))
            return self._group_results(rid, hdr, out, fields, seeds, torch_out, t0)
        order, torch_out, sent = {}, torch_latents, {}
        for i in range(n):
            fields, tensors, torch_one = self._gen_message(
                model, context, steps=steps, latent_shape=latent_shape,
                latent=None if latents is None else latents[i], seed=seeds[i], deadline_ms=deadline_ms,
                progress=progress is not None, **kw)
            steps = fields["steps"]  # a prompt's default, when not given
            torch_out = torch_out or torch_one
            rid = next(self._ids)
            order[rid] = i
            sent[rid] = (fields, tensors)
        st = self._sending(sent, t0 + wait)
        results = [None] * n
        pending = set(order)
        done = {rid: 0 for rid in order}  # progress: every sample's steps done, of n x steps

        def each(rid, step, total):
            done[rid] = max(done[rid], step)
            progress(sum(done.values()), n * total)

        try:  # a sample's failure (or any exception) cancels the samples still running
            while pending:
                rid, hdr, out = self._recv_live(pending, t0 + wait, sent, st, each if progress else None)
                pending.discard(rid)
                results[order[rid]] = self._gen_result(rid, hdr, out, steps, torch_out, t0)
                results[order[rid]].seed = seeds[order[rid]]
        except BaseException as e:
            self._cancel_after(e, pending)
            raise
        return results

    @_call
    def gen_many(self, requests, *, window=16, timeout=None, progress=None, return_exceptions=False):
        """Many GENs on this one connection, each with arguments of its
        own (a trainer's round: other prompts or contexts, seeds, guidance
        scales, step counts): requests is a sequence of dicts of gen()'s
        keyword arguments, `model` required, `progress` and `timeout` not
        (they are this call's). Returns their GenResults in the order
        given, each bitwise what gen() with the same arguments returns. A
        dict with `n` is a group, as gen_group(batched=True) takes it (n,
        seeds or seed, latents: one GEN, its samples run as batched steps):
        its place holds the list of its n GenResults, each with .seed (a
        Flow-GRPO round of B prompts x G samples is B such dicts). Every
        request is checked before any is sent (a bad one raises TypeError
        or ValueError naming its index).

        window: at most that many are in flight at once (sent, not yet
        answered; 1..1024); the next goes as one is answered, so a round of
        any size neither fills the broker's queue nor waits in it. The
        broker sends requests of one key to the worker that holds its
        graphs, where a worker with --max-batch > 1 runs those it holds
        together as batched steps (docs/CAPTURE.md).

        A request answered BUSY (the broker's queue or held bytes full,
        nothing started) goes again, as a new GEN, once another of this
        call's is answered; after a BUSY, no more are in flight than the
        broker then held, and one more with each answer, up to window (a
        full queue is not asked again and again). With none of this call's
        left in flight it is raised
        as BusyError (with return_exceptions, a BusyError takes its place
        and the place of each request not sent yet). timeout: the seconds each request may wait for its
        answer after it was sent (default: as gen()'s). progress(done,
        total): what is done of all the requests, counted as gen()'s
        progress counts each (its steps, then a decoded output's latent
        frames); called in this thread, inside the call (a call of this
        Client from it raises RuntimeError).

        A request's ERROR (or its timeout) raises that ReelError, with
        .index the request's place in the list, and cancels the requests
        still in flight (none of the rest is sent); with
        return_exceptions=True it takes the request's place in the list
        instead and the others go on."""
        if isinstance(requests, (dict, str, bytes)) or not hasattr(requests, "__len__"):
            raise TypeError(f"requests must be a sequence of dicts of gen()'s arguments, got "
                            f"{type(requests).__name__}")
        window = _uint("window", window, 1, 1024)
        return_exceptions = _flag("return_exceptions", return_exceptions)
        msgs = []  # per request: (fields, tensors, torch_out, wait, a group's seeds or None)
        for i, req in enumerate(requests):
            if not isinstance(req, dict):
                raise TypeError(f"requests[{i}] must be a dict of gen()'s arguments, got {type(req).__name__}")
            kw = dict(req)
            for name in ("progress", "timeout"):
                if name in kw:
                    raise TypeError(f"requests[{i}]: {name} is gen_many()'s own argument, not a request's")
            if "model" not in kw:
                raise TypeError(f"requests[{i}] has no model")
            if "batched" in kw:
                raise TypeError(f"requests[{i}]: batched is gen_group()'s; here a group (n) is one batched GEN, "
                                "and separate GENs are separate requests")
            model, context = kw.pop("model"), kw.pop("context", None)
            seeds = None
            try:
                if "n" in kw:
                    n, seeds = _group_seeds(kw.pop("n"), kw.pop("seeds", None), kw.pop("seed", 0),
                                            kw.get("latents"), kw)
                    fields, tensors, torch_out = self._group_message(model, context, n, seeds, kw.pop("latents", None),
                                                                     progress=progress is not None, **kw)
                else:
                    fields, tensors, torch_out = self._gen_message(model, context, progress=progress is not None,
                                                                   **kw)
            except TypeError as e:
                raise TypeError(f"requests[{i}]: {e}") from None
            except ValueError as e:
                raise ValueError(f"requests[{i}]: {e}") from None
            wait = _wait("timeout", timeout, max(self.timeout, (fields.get("deadline_ms") or 60000) / 1000 + 5))
            msgs.append((fields, tensors, torch_out, wait, seeds))
        results = [None] * len(msgs)
        # Each request's count as its PROGRESS reports it (gen()'s): its
        # steps, then for a decoded output its latent frames (the VAE's).
        of = [m[0]["steps"] + (m[0]["latent_shape"][1] if m[0].get("output", "latent") != "latent" else 0)
              for m in msgs]
        total = sum(of)
        done = [0] * len(msgs)  # counted so far, per request (never past its own: the sum never passes total)
        index, sent, due, t0 = {}, {}, {}, {}  # rid -> request index, message, deadline, send time
        unsent, held = list(range(len(msgs))), []  # not sent yet; answered BUSY, to go after another answer
        # In flight at most: window, down to what was in flight when a BUSY
        # came (the broker holds no more of this call now), one more with
        # each answer after it: a full queue is not asked again and again.
        limit = window
        st = None

        def each(rid, step, steps):
            if rid in index:
                i = index[rid]
                done[i] = max(done[i], min(step, of[i]))
                progress(sum(done), total)

        def send_more():
            nonlocal st
            unsent[:0], held[:] = held, []  # the BUSY ones go again first
            batch = {}
            while unsent and len(sent) + len(batch) < limit:
                i = unsent.pop(0)
                rid = next(self._ids)
                index[rid] = i
                batch[rid] = msgs[i][:2]
                t0[rid] = time.monotonic()
                due[rid] = t0[rid] + msgs[i][3]
            if not batch:
                return
            by = min(due[r] for r in batch)
            sent.update(batch)
            if st is None:
                st = self._sending(batch, by)
                return
            for rid, (fields, tensors) in batch.items():
                try:
                    st["send"](rid, fields, tensors, by)
                except ReelError as e:  # it could not go by its timeout
                    e.index = index[rid]
                    raise

        def settle(rid, value):
            i = index.pop(rid)
            del sent[rid], due[rid]
            results[i] = value
            return i

        try:
            send_more()
            while sent:
                try:
                    rid, hdr, out = self._recv_live(set(sent), min(due.values()), sent, st,
                                                    each if progress else None)
                except BusyError as e:
                    if e.request_id not in sent:
                        raise
                    i = settle(e.request_id, None)
                    held.append(i)
                    limit = max(1, len(sent))
                    if sent:
                        continue  # it goes again once another of this call's is answered
                    # none of this call's in flight: the queue is full of others'
                    e.index = i
                    if not return_exceptions:
                        raise
                    for j in held + unsent:
                        one = BusyError(e.message, e.request_id)
                        one.index = j
                        results[j] = one
                    held.clear()
                    unsent.clear()
                    continue
                except ReelTimeout as e:
                    now = time.monotonic()
                    late = [r for r in sent if due[r] <= now]
                    e.index = index[late[0]] if late else None
                    if late:  # (its id was the lowest waited for, or a liveness STATUS's)
                        e.request_id = late[0]
                    if not return_exceptions or not late:
                        raise
                    self._cancel(late)
                    for r in late:
                        one = ReelTimeout(f"no answer to requests[{index[r]}] in {msgs[index[r]][3]:g} s "
                                          f"from {self.endpoint}", r)
                        one.index = index[r]
                        settle(r, one)
                except ReelError as e:
                    if e.request_id not in sent:
                        raise
                    e.index = settle(e.request_id, e)
                    if not return_exceptions:
                        raise
                    limit = min(window, limit + 1)  # an ERROR is an answer too, as in C's reel_gen_many
                else:
                    i = index[rid]
                    fields, _, torch_out, _, seeds = msgs[i]
                    settle(rid, self._gen_result(rid, hdr, out, fields["steps"], torch_out, t0[rid]) if seeds is None
                           else self._group_results(rid, hdr, out, fields, seeds, torch_out, t0[rid]))
                    done[i] = of[i]
                    limit = min(window, limit + 1)
                    if progress:
                        # as from inside the receive loop: a call of this Client
                        # from it raises RuntimeError (_call), for this call's
                        # replies still come on this socket
                        self._in_progress = True
                        try:
                            progress(sum(done), total)
                        finally:
                            self._in_progress = False
                send_more()
        except BaseException as e:
            self._cancel_after(e, list(sent))
            raise
        return results

    def _group_message(self, model, context, n, seeds, latents, **kw):
        """The one GEN of a group (n, seeds as _group_seeds gives them):
        its fields, tensors and whether the caller uses torch."""
        lat = None
        if latents is not None:
            rows = [_f32("latents[%d]" % i, x, 4) for i, x in enumerate(latents)]
            if any(r.shape != rows[0].shape for r in rows):
                raise ValueError("latents must share one shape, got " + ", ".join(str(r.shape) for r in rows))
            lat = np.stack(rows) if n > 1 else rows[0]
        fields, tensors, torch_out = self._gen_message(model, context, latent=lat, seed=seeds[0], n=n, seeds=seeds,
                                                       **kw)
        torch_latents = latents is not None and (_is_torch(latents) or any(_is_torch(x) for x in latents))
        return fields, tensors, torch_out or torch_latents

    def _group_results(self, rid, hdr, out, fields, seeds, torch_out, t0):
        """A group GEN's answer as one GenResult per sample, each with its .seed."""
        n, steps = len(seeds), fields["steps"]
        if n == 1:  # a plain GEN: a plain RESULT
            one = self._gen_result(rid, hdr, out, steps, torch_out, t0)
            one.seed = seeds[0]
            return [one]
        if hdr.get("type") != "RESULT" or "latent" not in out or tuple(out["latent"].shape[:1]) != (n,):
            raise ReelError("malformed", f"expected a RESULT with {n} latents", rid)
        return [self._gen_result(rid, hdr, out, steps, torch_out, t0, sample=i) for i in range(n)]

    def _gen_result(self, rid, hdr, out, steps, torch_out, t0, sample=None):
        if hdr.get("type") != "RESULT" or "latent" not in out:
            raise ReelError("malformed", f"expected RESULT with a latent, got {hdr.get('type')}", rid)
        convert = (lambda a: a)
        if torch_out:
            import torch  # only when the caller uses torch
            convert = torch.from_numpy
        return GenResult(hdr, out, time.monotonic() - t0, int(steps), convert, sample=sample)

    def _gen_message(self, model, context, *, steps=_DEFAULT, latent_shape=None, latent=None, uncond=None,
                     cfg=_DEFAULT, shift=_DEFAULT, sde=False, eta=0.7, seed=0, version=None, deadline_ms=None,
                     progress=False, return_trajectory=False, return_log_probs=False, return_means=False, n=1,
                     seeds=None, solver=_DEFAULT, prompt=None, negative_prompt=None, output="latent"):
        """A GEN's fields and tensors, and whether the caller uses torch. n >
        1: a group (latent, when given, [n, C, F, H, W])."""
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty name, got {model!r}")
        _text("model", model)
        if prompt is not None:
            _prompt_text("prompt", prompt)
            if not prompt:  # reelctl run's and gen's exit 2; the broker would answer "missing tensor 'context'"
                raise ValueError(_EMPTY_PROMPT)
        if negative_prompt is not None:
            _prompt_text("negative_prompt", negative_prompt)
        if (prompt is None) == (context is None):
            raise ValueError("give a prompt or a context, not both and not neither")
        if prompt is not None and uncond is not None:
            raise ValueError("uncond goes with a context; with a prompt, give negative_prompt")
        if negative_prompt is not None and prompt is None:
            raise ValueError("negative_prompt needs a prompt")
        if prompt is not None:  # a prompt alone samples as Wan2.1's generate.py does
            steps = WAN_T2V_STEPS if steps is _DEFAULT else steps
            shift = WAN_T2V_SHIFT if shift is _DEFAULT else shift
            cfg = WAN_T2V_CFG if cfg is _DEFAULT else cfg
            solver = (WAN_T2V_SOLVER if not sde else "euler") if solver is _DEFAULT else solver
        if steps is _DEFAULT:
            raise TypeError("gen() needs steps= with a context (with a prompt it defaults to Wan's 50)")
        cfg = 1.0 if cfg is _DEFAULT else cfg
        shift = 1.0 if shift is _DEFAULT else shift
        solver = "euler" if solver is _DEFAULT else solver
        if negative_prompt is not None and _num("cfg", cfg) == 1.0:
            # as reelctl: at cfg 1 nothing reads it (the GEN leaves it out)
            raise ValueError("negative_prompt is used only with guidance: give cfg != 1 (Wan's default is 5)")
        if output not in ("latent", "frames", "video"):
            raise ValueError(f"output must be 'latent', 'frames' or 'video', got {output!r}")
        torch_out = any(_is_torch(x) for x in (context, uncond, latent))  # any torch in: torch out
        tensors = []
        if context is not None:
            tensors.append(("context", _f32("context", context, 2)))
        if uncond is not None:
            tensors.append(("uncond", _f32("uncond", uncond, 2)))
        if latent is not None:
            lat = _f32("latent", latent, 4 if n == 1 else 5)
            tensors.append(("latent", lat))
            if latent_shape is None:
                latent_shape = lat.shape[-4:]
        if latent_shape is None:
            raise ValueError("latent_shape [C, F, H, W] is required when no latent is given")
        if isinstance(latent_shape, (str, bytes)) or not hasattr(latent_shape, "__len__") or len(latent_shape) != 4:
            raise ValueError(f"latent_shape must be 4 integers [C, F, H, W], got {latent_shape!r}")
        if solver not in ("euler", "unipc", "dpm++"):
            raise ValueError(f"solver must be 'euler', 'unipc' or 'dpm++', got {solver!r}")
        fields = {"model": str(model), "steps": _uint("steps", steps, 1, MAX_STEPS),
                  "latent_shape": [_uint("latent_shape[%d]" % i, d, 1, MAX_DIM) for i, d in enumerate(latent_shape)],
                  "shift": _num("shift", shift), "cfg": _num("cfg", cfg), "sde": _flag("sde", sde),
                  "eta": _num("eta", eta), "seed": _uint("seed", seed), "progress": bool(progress)}
        # the rest of docs/PROTOCOL.md "What a GEN must satisfy" that needs no model, checked here
        c, f, h, w = fields["latent_shape"]
        if f * h * w > MAX_FHW:
            raise ValueError(f"latent_shape's F x H x W must be at most {MAX_FHW}, got {f * h * w}")
        if c * f * h * w * 4 * _uint("n", n, 1, 64) > MAX_GEN_BYTES:
            raise ValueError(f"{n} latent(s) of shape {fields['latent_shape']} are more than "
                             f"{MAX_GEN_BYTES >> 20} MiB")
        if output == "video" and n != 1:  # the broker's bad_request (docs/PROTOCOL.md "Prompts and videos")
            raise ValueError(f"output='video' is one MP4 of one sample; a group (n={n}) asks for output='frames' "
                             "(or batched=False: n GENs, a video each)")
        if not fields["shift"] > 0:
            raise ValueError(f"shift must be > 0, got {fields['shift']!r}")
        if not abs(fields["cfg"]) <= _FLT_MAX:
            raise ValueError(f"cfg must be a finite number that fits a float32, got {fields['cfg']!r}")
        if fields["sde"] and not 0 <= fields["eta"] <= _FLT_MAX:
            raise ValueError(f"eta must be >= 0 and fit a float32, got {fields['eta']!r}")
        if uncond is None and prompt is None and fields["cfg"] != 1.0:
            _warn(f"cfg={fields['cfg']:g} without uncond: classifier-free guidance is off (it needs an "
                  "unconditional context); the result is cfg=1's")
        if solver != "euler":
            fields["solver"] = solver
        if prompt is not None:
            fields["prompt"] = prompt
        if negative_prompt is not None:
            fields["negative_prompt"] = negative_prompt
        if output != "latent":
            fields["output"] = output
        if n != 1:
            fields["n"] = _uint("n", n, 1, 64)
            if seeds is not None:
                fields["seeds"] = [_uint("seeds[%d]" % i, x) for i, x in enumerate(seeds)]
        if version is not None:
            fields["version"] = _uint("version", version, 0, (1 << 63) - 1)
        if deadline_ms is not None:
            fields["deadline_ms"] = _uint("deadline_ms", deadline_ms)
        for k, on in (("return_trajectory", return_trajectory), ("return_log_probs", return_log_probs),
                      ("return_means", return_means)):
            if _flag(k, on):
                fields[k] = True
        if (fields.get("return_log_probs") or fields.get("return_means")) and not (
                fields["sde"] and np.float32(fields["eta"]) > 0):
            raise ValueError("return_log_probs and return_means need sde=True with eta > 0 (as a float32)")
        if fields.get("return_log_probs"):  # beside the sigmas: each step's t as the transformer took it
            fields["return_timesteps"] = True
        return fields, tensors, torch_out

    @_call
    def status(self, timeout=None):
        """The broker's STATUS_REPLY header as a dict (workers, queue,
        versions, pending, ...; a broker of a standby pair adds ha_state,
        ha_role, ha_term and ha_peer).

        With several endpoints (a standby pair): the active broker's (its
        ha_state "active", or none: a broker alone), else the first standby
        that answered; each endpoint is asked for its share of the timeout,
        and the client stays with the broker whose answer it returns."""
        wait = _wait("timeout", timeout, min(self.timeout, 10.0))
        if len(self._eps) < 2:
            return self._status_once(wait)
        best, best_at, why = None, None, None
        share = wait / len(self._eps)
        for k in range(len(self._eps)):
            if k:
                self._switch()
            try:
                hdr = self._status_once(share)
            except ReelError as e:
                why = e
                continue
            if not hdr.get("ha_state") or hdr.get("ha_state") == "active":
                return hdr
            if best is None:
                best, best_at = hdr, self._at
        if best is None:
            raise why
        while self._at != best_at:  # stay with the one that answered
            self._switch()
        return best

    def _status_once(self, wait):
        """One STATUS to the broker the socket is connected to (again on a
        fresh socket in place of one the broker refused: _refresh)."""
        rid = next(self._ids)
        by = time.monotonic() + wait
        while True:
            self._send("STATUS", rid, {}, by=by)
            try:
                hdr, _ = self._recv(rid, by)
                return hdr
            except _Refreshed:
                continue

    @_call
    def upload(self, version, path, *, component="transformer", sha256=None, timeout=None, window=4):
        """Sends the safetensors file at path to the broker as `version`
        (UPLOAD chunks of 4 MiB, `window` in flight), resuming where the
        broker's copy ends; returns once the broker holds all of it with the
        right sha256. The broker needs --weights-dir. A later
        sync(version, upload=True, ...) then publishes it without any file
        shared with the workers (docs/PROTOCOL.md, "Weights by value")."""
        return self._upload(version, path, component=component, sha256=sha256, timeout=timeout, window=window)

    def _upload(self, version, path, *, component="transformer", sha256=None, timeout=None, window=4,
                sync_fields=None):
        """_upload_run, and on a timeout (or an interrupt) a fresh socket:
        the chunks and the SYNC still queued must not reach a broker that
        comes back after the caller was told it failed (_forget_unsent)."""
        try:
            return self._upload_run(version, path, component=component, sha256=sha256, timeout=timeout,
                                    window=window, sync_fields=sync_fields)
        except BaseException as e:
            if isinstance(e, ReelTimeout) or not isinstance(e, ReelError):
                self._forget_unsent()
            raise

    def _upload_run(self, version, path, *, component="transformer", sha256=None, timeout=None, window=4,
                    sync_fields=None):
        """upload(); with sync_fields, also the SYNC (those fields) as soon
        as the broker holds the first chunk, so workers fetch while the rest
        comes: returns (digest, the SYNC_DONE header). The broker is watched
        as a GEN's is (liveness): silent, or another broker answering (a
        restart), the upload starts again from where the new broker's copy
        ends and the SYNC goes again (.resends counts it). With several
        endpoints (a standby pair), that, or an UPLOAD or SYNC answered
        ERROR standby, moves it to the next broker of the list: the
        endpoints are asked for STATUS in turn until one answers, and the
        upload starts again there."""
        window = _uint("window", window, 1, 1 << 16)
        version = _uint("version", version, 1, (1 << 63) - 1)
        path = _regular_file(os.path.abspath(path))
        size = os.path.getsize(path)
        if size == 0:
            raise ValueError(f"{path}: an empty file (an upload holds 1 byte at least; a checkpoint far more)")
        digest = (sha256 or sha256_file(path)).lower()
        wait = _wait("timeout", timeout, self.timeout)
        done = None
        heard = acked = time.monotonic()
        standbys = 0  # attempts refused ERROR standby
        n = len(self._eps)
        with open(path, "rb") as f:
            while True:
                try:
                    return self._upload_attempt(f, version, component, digest, size, wait, window, sync_fields, done)
                except _BrokerLost as lost:
                    done = lost.done
                    heard = lost.heard or heard
                    acked = lost.acked or acked
                    if lost.standby:
                        # Refused by the standby of a pair: the other broker
                        # serves. While every broker refuses (a pair still
                        # choosing, or one the client cannot reach), a pause
                        # after each round, and no longer than `wait` since
                        # an answer that moved the upload on.
                        standbys += 1
                        left = wait - (time.monotonic() - acked)
                        if left <= 0:
                            raise ReelTimeout(f"no answer from {self.broker} in time: every broker is the standby",
                                              0)
                        if standbys % n == 0:
                            time.sleep(min(STANDBY_PAUSE, left))
                    # No chunk goes again before a broker answers a STATUS:
                    # chunks sent to nobody would only queue in the socket.
                    # A standby pair: the other broker, then each in turn.
                    while True:
                        if time.monotonic() - heard >= wait:
                            raise ReelTimeout(f"no reply from {self.broker} in time" + self._handshake_hint(), 0)
                        self._switch()
                        try:
                            st = self._status_once(self.liveness or min(self.timeout, 10.0))
                        except ReelTimeout:
                            continue
                        self._boot = int(st.get("boot") or "0", 16) or self._boot
                        heard = time.monotonic()
                        break
                    self.resends += 1

    def _upload_attempt(self, f, version, component, digest, size, wait, window, sync_fields, done):
        rid = next(self._ids)
        sid = None
        chunk = 4 << 20
        ends, nxt, ignore, complete = [], 0, 0, False
        received = 0  # where the broker's copy ends, as its last UPLOAD_ACK said
        ping, first, ping_by = None, False, 0.0
        answer_by = time.monotonic() + wait
        if self.liveness and not self._boot:  # learn which broker this attempt talks to
            ping, first, ping_by = next(self._ids), True, time.monotonic() + self.liveness
            self._send("STATUS", ping, {}, by=answer_by)
        # Alone, a broker's first STATUS may take as long as any answer; of
        # a standby pair, a silent one is left after `liveness`.
        first_waits = len(self._eps) < 2
        heard = acked = None
        while True:
            while not complete and nxt < size and len(ends) + ignore < window:
                f.seek(nxt)
                data = f.read(min(chunk, size - nxt))
                if len(data) != min(chunk, size - nxt):
                    raise ReelError("changed", f"{f.name}: the file changed while it was uploaded (it ends at "
                                    f"{nxt + len(data)} bytes, {size} when the upload began); nothing was synced")
                hdr = {"proto": PROTO, "type": "UPLOAD", "id": rid, "component": component,
                       "version": int(version), "sha256": digest, "size": size, "offset": nxt,
                       "client": format(self._token, "016x"),
                       "tensors": [{"name": "chunk", "dtype": "U8", "shape": [len(data)], "bytes": len(data)}]}
                self._put([msgpack.packb(hdr, use_bin_type=True), data], answer_by, rid)
                nxt += len(data)
                ends.append(nxt)
            if complete and sync_fields is None:
                return digest
            if complete and done is not None:
                return digest, done
            pending = {sid} if complete else ({rid, sid} if sid is not None and done is None else {rid})
            pending.discard(None)
            until = answer_by
            if self.liveness:
                until = min(answer_by, answer_by if first and first_waits else
                            ping_by if ping else time.monotonic() + self.liveness)
            try:
                got, hdr, _ = self._recv_any(pending | ({ping} if ping else set()), until)
            except _Refreshed:
                # the socket was refused for good and replaced: what went on
                # it reached no broker; the attempt begins again on the fresh
                # one (a STATUS first when liveness asks: no boot id known there)
                nxt, ends, ignore = received, [], 0
                if done is None:
                    sid = None  # the SYNC goes again once the broker holds bytes
                if self.liveness:
                    ping, first, ping_by = next(self._ids), True, time.monotonic() + self.liveness
                    self._send("STATUS", ping, {}, by=answer_by)
                continue
            except ReelTimeout:
                if time.monotonic() >= answer_by:
                    raise
                if not ping:  # silent for `liveness`: is it there?
                    ping, ping_by = next(self._ids), time.monotonic() + self.liveness
                    self._send("STATUS", ping, {}, by=answer_by)
                    continue
                raise _BrokerLost(done, heard, acked=acked)  # that STATUS unanswered too: gone or stuck
            except ReelError as e:
                if e.code == "shutdown" and self.liveness:
                    # the broker is stopping: the upload goes again to the one that comes back
                    raise _BrokerLost(done, heard, acked=acked)
                if e.code != "standby" or len(self._eps) < 2:
                    raise
                # the standby of a pair: the upload goes to the other broker
                raise _BrokerLost(done, time.monotonic(), standby=True, acked=acked)
            heard = time.monotonic()
            if got == ping:
                boot = int(hdr.get("boot") or "0", 16)
                ping = None
                if first or not self._boot:
                    first = False
                    self._boot = boot or self._boot
                elif boot and boot != self._boot:  # another broker: a restart lost what was in flight
                    self._boot = boot
                    raise _BrokerLost(done, heard, acked=acked)
                continue
            acked = time.monotonic()
            answer_by = acked + wait
            if got == sid:
                if hdr.get("type") != "SYNC_DONE":
                    raise ReelError("malformed", f"expected SYNC_DONE, got {hdr.get('type')}", sid)
                # Answered before the last chunk went (no live worker, or
                # every worker failed early): the upload still completes.
                done = hdr
                continue
            if hdr.get("type") != "UPLOAD_ACK":
                raise ReelError("malformed", f"expected UPLOAD_ACK, got {hdr.get('type')}", rid)
            received = hdr.get("received", received) if isinstance(hdr.get("received"), int) else received
            if hdr.get("complete"):
                complete = True
            elif ignore:
                ignore -= 1
                continue
            elif ends:
                want = ends.pop(0)
                if hdr.get("received") != want:  # not written: go on from where the broker's copy ends
                    nxt, ignore, ends = hdr.get("received", 0), len(ends), []
            # The SYNC goes once the broker holds an upload of these bytes.
            if sync_fields is not None and sid is None and done is None and (complete or hdr.get("received", 0) > 0):
                sid = next(self._ids)
                self._send("SYNC", sid, sync_fields, by=answer_by)

    @_call
    def sync(self, version, *, path=None, state_dict=None, config=None, component="transformer", sha256=None,
             deadline_ms=0, weights_dir=None, timeout=None, upload=False, lora=None, lora_config=None, base=None):
        """Publishes transformer weights as `version` and waits for the
        broker's barrier; returns a SyncResult (check .complete: a worker may
        lag). Raises SyncFailed when no worker applied it (nothing changed),
        ReelError (e.g. stale_version) when the broker refused it.

        path: a checkpoint below every worker's --weights-dir
        (docs/PROTOCOL.md, "Weight files"), in any layout Reel loads: a
        safetensors file, a Wan2.1 release folder, a sharded index or its
        folder, a diffusers transformer or pipeline; its identity is
        computed here (checkpoint_identity). state_dict: tensors
        by Wan2.1 name (numpy or torch), written here as F32 safetensors into
        weights_dir (a fresh temporary folder by default; it must lie below
        every worker's --weights-dir, where workers read weights from, and
        no symlink may lead there), with config (a built-in name such as "tiny", or a
        dict of the size keys) as the file's metadata.

        upload=True: by value, for a trainer that shares no filesystem with
        the workers: the file (path, or the one written from state_dict) is
        sent to the broker in chunks (as upload() does) and the SYNC goes as
        soon as the broker holds the first one, so the workers fetch each
        chunk from the broker while the later ones still come; an upload
        that fails after (bytes that do not hash to its sha256) fails their
        fetches, and nothing of it is applied. The broker needs
        --weights-dir. A state_dict's file written into a temporary folder
        made here is removed after an upload (the broker keeps the bytes);
        by path it stays (workers that join later read it). A path that is
        not a regular file is a ValueError.

        lora=: a LoRA adapter instead (a PEFT folder, or a state dict with
        lora_config=), as sync_lora() publishes it, on base= (default: the
        last full version this client published; without one, base= is
        required)."""
        version = _uint("version", version, 1, (1 << 63) - 1)
        deadline_ms = _uint("deadline_ms", deadline_ms)
        if lora is not None:
            if path is not None or state_dict is not None:
                raise ValueError("give lora= alone (an adapter), or path=/state_dict= (whole weights)")
            if base is None:
                if self._base is None:
                    raise ValueError("sync(lora=...) needs base= (the full version the workers hold) unless this "
                                     "client published it: the broker's current version may be an adapter")
                base = self._base
            return self.sync_lora(version, base, lora=lora, lora_config=lora_config, weights_dir=weights_dir,
                                  component=component, deadline_ms=deadline_ms, timeout=timeout, upload=upload)
        if (path is None) == (state_dict is None):
            raise ValueError("give exactly one of path= and state_dict=")
        if state_dict is not None:
            if not config:
                raise ValueError("a state_dict sync needs config= (a built-in name or the size keys)")
            if "patch_embedding.weight" not in state_dict:
                raise ValueError("state_dict must use the Wan2.1 names (no 'patch_embedding.weight')")
            extra = sorted(k for k in state_dict if not isinstance(k, str) or not _WAN_NAME.match(k))
            if extra:  # a worker refuses the file (more than the model holds) and says only that
                raise ValueError(f"state_dict has {len(extra)} tensor(s) that are not the text-to-video DiT's "
                                 f"(Wan2.1 names only): {', '.join(map(repr, extra[:5]))}"
                                 f"{' ...' if len(extra) > 5 else ''}")
            meta = {"config": config} if isinstance(config, str) else dict(config)
            d = weights_dir or tempfile.mkdtemp(prefix="reel-sync-")
            path = os.path.join(d, f"{component}-v{int(version)}.safetensors")
            try:  # (save replaces a file already at path whole, or leaves it)
                safetensors.save(path, state_dict, meta)
            except BaseException:  # a tensor refused (or an interrupt): the folder made for it goes
                if not weights_dir:
                    shutil.rmtree(d, ignore_errors=True)
                raise
            if upload and not weights_dir:
                # By value the broker keeps the bytes: the folder made here goes.
                try:
                    return self._sync_file(version, path, component, sha256, deadline_ms, timeout, upload)
                finally:
                    shutil.rmtree(d, ignore_errors=True)
        return self._sync_file(version, path, component, sha256, deadline_ms, timeout, upload)

    @_call
    def sync_lora(self, version, base, *, lora=None, lora_config=None, weights_dir=None, component="transformer",
                  base_sha256=None, deadline_ms=0, timeout=None, upload=False):
        """Publishes a LoRA adapter as `version`: the full version `base`
        (which every worker holds as its base; they run with --lora) with
        the adapter merged in, keeping every captured graph (docs/PROTOCOL.md,
        "LoRA adapters"). Returns a SyncResult; raises as sync() does.

        lora: a PEFT adapter folder (adapter_config.json and
        adapter_model.safetensors, as peft's save_pretrained writes it),
        diffusers' (pytorch_lora_weights.safetensors, no config) or a LoRA's
        .safetensors file (a ComfyUI Wan LoRA: lora_down/lora_up and .alpha
        keys) below every worker's --weights-dir; without adapter_config.json
        the workers take the file's own ranks and alphas (docs/MODEL.md
        "LoRA adapters"); or a state dict in PEFT's names
        ("base_model.model.blocks.0.self_attn.q.lora_A.weight" or diffusers'
        "transformer.blocks.0.attn1.to_q.lora_A.weight"; numpy arrays or
        torch tensors) with lora_config (adapter_config.json as a dict: r,
        lora_alpha, use_rslora, target_modules, ...; None: the tensors'
        own ranks and .alpha keys, s = alpha / rank or 1), written here as a PEFT
        folder into weights_dir (it must lie below the workers'
        --weights-dir; a fresh temporary folder by default, for workers on
        this machine). lora=None with base_sha256 (the base file's identity,
        checkpoint_identity): the base itself again. Checked here, before
        any file is written or sent: base below version (ValueError), a
        state dict with a tensor at least (ValueError), lora_config of JSON
        values (numpy scalars taken as numbers; else TypeError).

        upload=True: by value, for a trainer that shares no filesystem with
        the workers: adapter_model.safetensors goes through the broker (it
        needs --weights-dir) as sync(upload=True) sends a file, and the
        config travels in the SYNC (lora_config, at most 4095 bytes); a
        folder written here from a state dict is removed after."""
        version = _uint("version", version, 1, (1 << 63) - 1)
        base = _uint("base", base, 1, (1 << 63) - 1)
        if base >= version:  # checked here: by value, before anything is uploaded
            raise ValueError(f"base ({base}) must be below version ({version}): the full version the adapter "
                             "goes on is an older one")
        deadline_ms = _uint("deadline_ms", deadline_ms)
        if lora is None:
            if not base_sha256:
                raise ValueError("lora=None (the base again) needs base_sha256=, the base's identity")
            fields = {"component": component, "version": int(version), "base_version": int(base),
                      "sha256": base_sha256.lower(), "deadline_ms": int(deadline_ms)}
            return self._sync_fields(fields, deadline_ms, timeout)
        made = None
        cfg_text = None
        if isinstance(lora, (str, os.PathLike)):
            folder = os.path.abspath(lora)
            if lora_config is not None:
                raise ValueError("lora_config= goes with a state dict; a folder holds its adapter_config.json")
        else:
            if lora_config is not None and (not isinstance(lora_config, dict) or "r" not in lora_config):
                raise ValueError("lora_config= is a dict with at least r (and lora_alpha), or None: the tensors' "
                                 "own ranks and .alpha keys (s = alpha / rank, or 1 without one)")
            tensors = dict(lora)
            if not tensors:
                raise ValueError("lora= holds no LoRA tensors (an empty state dict): nothing to publish")
            tensors = safetensors.checked(tensors, "lora=")  # judged before any file is touched
            if lora_config is not None:
                cfg = {"peft_type": "LORA", "bias": "none", "use_dora": False}
                cfg.update(lora_config)
                try:  # numpy scalars become JSON numbers; the text is made before any file
                    cfg_text = json.dumps(cfg, default=_json_value)
                except (TypeError, ValueError) as e:
                    raise TypeError(f"lora_config must hold JSON values (numbers, strings, lists, dicts; numpy "
                                    f"scalars are taken): {e}") from None
            if not weights_dir:
                made = weights_dir = tempfile.mkdtemp(prefix="reel-lora-")
            folder = os.path.join(weights_dir, f"{component}-v{int(version)}-lora")
            new = not os.path.exists(folder)
            try:
                os.makedirs(folder, exist_ok=True)
                if cfg_text is not None:
                    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
                        f.write(cfg_text)
                elif os.path.exists(os.path.join(folder, "adapter_config.json")):
                    os.remove(os.path.join(folder, "adapter_config.json"))  # an earlier try's: not this adapter's
                # Without a config, diffusers' file name: its tensors' own
                # ranks and .alpha keys (s = 1 without), as diffusers loads it.
                for stale in ("adapter_model.safetensors", "pytorch_lora_weights.safetensors"):
                    if os.path.exists(os.path.join(folder, stale)):
                        os.remove(os.path.join(folder, stale))
                safetensors.save(os.path.join(folder, "adapter_model.safetensors" if cfg_text is not None
                                              else "pytorch_lora_weights.safetensors"), tensors)
            except BaseException:  # no half-written adapter left behind
                if made or new:
                    shutil.rmtree(made or folder, ignore_errors=True)
                raise
        # A folder: PEFT's adapter_model.safetensors or diffusers'
        # pytorch_lora_weights.safetensors; or a .safetensors named (a
        # ComfyUI LoRA). Its adapter_config.json (in the folder or beside
        # the file) is optional: without one the workers read the file's
        # own ranks and alphas (docs/MODEL.md "LoRA adapters").
        if os.path.isdir(folder):
            names = ("adapter_model.safetensors", "pytorch_lora_weights.safetensors")
            weights = next((os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))), None)
            cfg_file = os.path.join(folder, "adapter_config.json")
        else:
            weights = folder if folder.endswith(".safetensors") and os.path.isfile(folder) else None
            cfg_file = os.path.join(os.path.dirname(folder), "adapter_config.json")
        if weights is None:
            raise ValueError(f"{folder}: not a LoRA adapter (a folder with adapter_model.safetensors or "
                             "pytorch_lora_weights.safetensors, or a .safetensors file)")
        h = hashlib.sha256()
        with open(weights, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        fields = {"component": component, "version": int(version), "base_version": int(base),
                  "sha256": h.hexdigest(), "deadline_ms": int(deadline_ms)}
        if not upload:
            fields["path"] = folder
            return self._sync_fields(fields, deadline_ms, timeout)
        try:
            if os.path.isfile(cfg_file):
                with open(cfg_file, encoding="utf-8") as f:
                    fields["lora_config"] = f.read()
            elif os.path.lexists(cfg_file):
                raise ValueError(f"{cfg_file}: not a regular file")
            else:  # none: the file's own config (the workers read "{}" so), if it says its scale
                if not _says_its_scale(weights):
                    raise ValueError(f"{weights}: no adapter_config.json beside it, and nothing in it says its "
                                     "scale (lora_A/lora_B without .alpha keys or diffusers' "
                                     "lora_adapter_metadata): give the adapter's adapter_config.json (PEFT), or "
                                     "name diffusers' pytorch_lora_weights.safetensors (s = 1)")
                fields["lora_config"] = "{}"
            if len(fields["lora_config"].encode()) > 4095:
                raise ValueError("adapter_config.json is over 4095 bytes: sync it by path")
            fields["uploaded"] = True
            _, hdr = self._upload(version, weights, component=component, sha256=fields["sha256"],
                                  timeout=self._sync_wait(deadline_ms, timeout), sync_fields=fields)
            return self._sync_done(hdr, hdr.get("id", 0))
        finally:
            if made:
                shutil.rmtree(made, ignore_errors=True)

    def _sync_wait(self, deadline_ms, timeout):
        """Seconds to wait for a SYNC_DONE: timeout, else the sync's deadline and 5 s."""
        return _wait("timeout", timeout, max(self.timeout, (deadline_ms or 30000) / 1000 + 5))

    @staticmethod
    def _sync_done(hdr, rid):
        """The SyncResult of answer hdr; SyncFailed when no worker applied it."""
        if hdr.get("type") != "SYNC_DONE":
            raise ReelError("malformed", f"expected SYNC_DONE, got {hdr.get('type')}", rid)
        res = SyncResult(hdr)
        if not res.applied:
            raise SyncFailed(res, rid)
        return res

    def _sync_fields(self, fields, deadline_ms, timeout):
        """A SYNC by path (or of nothing: the base again) and its SYNC_DONE.
        Sent again, as GENs are, when the broker goes silent or restarts
        (a SYNC is idempotent: docs/PROTOCOL.md "Weight syncs")."""
        rid = next(self._ids)
        sent = {rid: (fields, ())}
        by = time.monotonic() + self._sync_wait(deadline_ms, timeout)
        try:
            st = self._send_gens(sent, by, lambda r, f, t, by_: self._send("SYNC", r, f, t, by=by_))
            _, hdr, _ = self._recv_live({rid}, by, sent, st)
        except BaseException as e:
            if isinstance(e, ReelTimeout) or not isinstance(e, ReelError):  # no answer: nothing unsent goes later
                self._forget_unsent()
            raise
        return self._sync_done(hdr, rid)

    def _sync_file(self, version, path, component, sha256, deadline_ms, timeout, upload):
        path = os.path.abspath(path)
        if upload:
            # By value one file goes: a release folder's one file; several
            # (shards) are for `reelctl sync --upload`, which packs them.
            path = _checkpoint_file(path)
            if path.endswith(".index.json"):
                raise ValueError(f"{path}: a sharded checkpoint cannot be uploaded as one file here; "
                                 "sync it by path, or use `reelctl sync --upload` (it packs the shards)")
        digest = (sha256 or checkpoint_identity(path)).lower()
        fields = {"component": component, "version": int(version), "sha256": digest, "deadline_ms": int(deadline_ms)}
        if upload:
            # The SYNC goes with the first chunk the broker holds: workers
            # fetch each chunk while the later ones still come.
            fields["uploaded"] = True
            _, hdr = self._upload(version, path, component=component, sha256=digest,
                                  timeout=self._sync_wait(deadline_ms, timeout), sync_fields=fields)
            res = self._sync_done(hdr, hdr.get("id", 0))
        else:
            fields["path"] = path
            res = self._sync_fields(fields, deadline_ms, timeout)
        self._base = int(fields["version"])  # the base later adapters merge into (sync(lora=...))
        return res
