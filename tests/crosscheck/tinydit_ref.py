"""Independent numpy reference of the Wan2.1-style video DiT in /work/shared/TINYDIT.md.

Written from that page alone (no C code of the project was read).  All
arithmetic is done in float64 by default; `forward(..., dtype=np.float32)`
runs the same code in float32, which the self-test uses to see how much
float32-vs-float64 difference the cross-check tolerance has to absorb.

Public API
  load_weights(path)                -> Weights (tensors + Config)
  forward(w, latent, context, sigma) -> velocity, same shape as latent
  sigma_schedule(steps, shift)      -> float64 array of steps+1 sigmas
  generate(w, latent, context, uncond, steps, shift, cfg) -> final latent
"""

import math

import numpy as np

import safetensors_np

# ---------------------------------------------------------------------------
# Configs ("## Configs" table on the page)
# ---------------------------------------------------------------------------
#            name            D     H  layers  Fd    C   T     freq
CONFIG_TABLE = {
    "tiny":        dict(dim=64,   heads=4,  layers=2,  ffn_dim=128,  in_channels=4,  text_dim=32,   freq_dim=256),
    "small":       dict(dim=384,  heads=6,  layers=12, ffn_dim=1024, in_channels=16, text_dim=256,  freq_dim=256),
    "wan2.1-1.3b": dict(dim=1536, heads=12, layers=30, ffn_dim=8960, in_channels=16, text_dim=4096, freq_dim=256),
}
_INT_KEYS = ("dim", "heads", "layers", "ffn_dim", "in_channels", "text_dim", "freq_dim")

LN_EPS = 1e-6
RMS_EPS = 1e-6


class Config:
    def __init__(self, name, dim, heads, layers, ffn_dim, in_channels, text_dim, freq_dim):
        self.name = name
        self.dim = int(dim)              # D
        self.heads = int(heads)          # H
        self.layers = int(layers)
        self.ffn_dim = int(ffn_dim)      # Fd
        self.in_channels = int(in_channels)  # C
        self.text_dim = int(text_dim)    # T
        self.freq_dim = int(freq_dim)    # sinusoid width (256)
        if self.dim % self.heads:
            raise ValueError("dim %d not divisible by heads %d" % (self.dim, self.heads))
        self.head_dim = self.dim // self.heads   # d
        if self.head_dim % 2 or self.freq_dim % 2:
            raise ValueError("head_dim and freq_dim must be even")

    def __repr__(self):
        return ("Config(%s: D=%d H=%d layers=%d Fd=%d C=%d T=%d freq=%d)" %
                (self.name, self.dim, self.heads, self.layers, self.ffn_dim,
                 self.in_channels, self.text_dim, self.freq_dim))


def config_from_metadata(meta):
    """Config from a weights file's __metadata__ (values are strings).

    Explicit numeric keys win; any that are missing come from the table entry
    named by "config"."""
    name = meta.get("config")
    base = dict(CONFIG_TABLE[name]) if name in CONFIG_TABLE else {}
    for k in _INT_KEYS:
        if k in meta:
            base[k] = int(meta[k])
    missing = [k for k in _INT_KEYS if k not in base]
    if missing:
        raise ValueError("weights metadata %r does not determine the config (missing %s)"
                         % (meta, ", ".join(missing)))
    return Config(name or "custom", **base)


def expected_shapes(cfg):
    """Every weight the page lists, with its shape ("## Weights")."""
    D, C, T, Fd, fq = cfg.dim, cfg.in_channels, cfg.text_dim, cfg.ffn_dim, cfg.freq_dim
    s = {
        "patch_embedding.weight": (D, C, 1, 2, 2), "patch_embedding.bias": (D,),
        "text_embedding.0.weight": (D, T), "text_embedding.0.bias": (D,),
        "text_embedding.2.weight": (D, D), "text_embedding.2.bias": (D,),
        "time_embedding.0.weight": (D, fq), "time_embedding.0.bias": (D,),
        "time_embedding.2.weight": (D, D), "time_embedding.2.bias": (D,),
        "time_projection.1.weight": (6 * D, D), "time_projection.1.bias": (6 * D,),
        "head.modulation": (1, 2, D),
        "head.head.weight": (4 * C, D), "head.head.bias": (4 * C,),
    }
    for i in range(cfg.layers):
        p = "blocks.%d." % i
        s[p + "modulation"] = (1, 6, D)
        for att in ("self_attn", "cross_attn"):
            for l in "qkvo":
                s[p + att + "." + l + ".weight"] = (D, D)
                s[p + att + "." + l + ".bias"] = (D,)
            s[p + att + ".norm_q.weight"] = (D,)
            s[p + att + ".norm_k.weight"] = (D,)
        s[p + "norm3.weight"] = (D,)
        s[p + "norm3.bias"] = (D,)
        s[p + "ffn.0.weight"] = (Fd, D)
        s[p + "ffn.0.bias"] = (Fd,)
        s[p + "ffn.2.weight"] = (D, Fd)
        s[p + "ffn.2.bias"] = (D,)
    return s


class Weights:
    def __init__(self, tensors, cfg):
        self.cfg = cfg
        exp = expected_shapes(cfg)
        for name, shape in exp.items():
            if name not in tensors:
                raise KeyError("weights file lacks %s" % name)
            if tuple(tensors[name].shape) != shape:
                raise ValueError("%s has shape %s, expected %s"
                                 % (name, tuple(tensors[name].shape), shape))
        self.t = {k: np.asarray(tensors[k], dtype=np.float64) for k in exp}
        self._cast = {}

    def as_dtype(self, dtype):
        dtype = np.dtype(dtype)
        if dtype not in self._cast:
            self._cast[dtype] = {k: v.astype(dtype) for k, v in self.t.items()}
        return self._cast[dtype]


def load_weights(path):
    tensors, meta = safetensors_np.load(path)
    return Weights(tensors, config_from_metadata(meta))


# ---------------------------------------------------------------------------
# Primitives
# ---------------------------------------------------------------------------
def linear(x, W, b):
    """Linear(x) = x . W^T + b, W stored [out, in] (PyTorch convention)."""
    return x @ W.T + b


def silu(u):
    return u / (1.0 + np.exp(-u))


def gelu_tanh(u):
    """GELU_tanh(u) = 0.5*u*(1 + tanh(sqrt(2/pi)*(u + 0.044715*u^3)))."""
    return 0.5 * u * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))


def layer_norm(x, eps=LN_EPS):
    """LN over the last axis without affine (biased variance)."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / np.sqrt(var + eps)


def rms_norm(x, g, eps=RMS_EPS):
    """RMS over the whole last axis (the full width D), times gain g."""
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def sinusoid(t, width, dtype=np.float64):
    """s = [cos(t*w_0..w_{h-1}), sin(t*w_0..w_{h-1})], h = width/2, w_j = 10000^(-j/h)."""
    h = width // 2
    j = np.arange(h, dtype=np.float64)
    om = np.power(10000.0, -j / h)
    ang = (np.asarray(t, dtype=np.float64) * om).astype(dtype)
    return np.concatenate([np.cos(ang), np.sin(ang)]).astype(dtype)


def attention(q, k, v, heads):
    """softmax(q.k^T/sqrt(d)).v per head; q [N, D], k, v [M, D] -> [N, D] (heads concatenated)."""
    N, D = q.shape
    M = k.shape[0]
    d = D // heads
    qh = q.reshape(N, heads, d).transpose(1, 0, 2)     # [H, N, d]
    kh = k.reshape(M, heads, d).transpose(1, 0, 2)     # [H, M, d]
    vh = v.reshape(M, heads, d).transpose(1, 0, 2)     # [H, M, d]
    s = qh @ kh.transpose(0, 2, 1) / np.sqrt(np.asarray(d, dtype=q.dtype))  # [H, N, M]
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(axis=-1, keepdims=True)
    o = p @ vh                                          # [H, N, d]
    return o.transpose(1, 0, 2).reshape(N, D)


# ---------------------------------------------------------------------------
# Patchify / unpatchify ("## Inputs" and Forward step 6)
# ---------------------------------------------------------------------------
def patchify(latent):
    """latent [C, F, Hh, Ww] -> tokens [N, 4C].

    "Patchify with patch (1, 2, 2): tokens in (f, h, w) order, f slowest;
    token vector = the C*1*2*2 values in (c, pt, ph, pw) order."  pt has
    extent 1, so the token's element (c, 0, ph, pw) is latent[c, f, 2h+ph, 2w+pw].
    """
    C, F, Hh, Ww = latent.shape
    if Hh % 2 or Ww % 2:
        raise ValueError("latent H and W must be even, got %s" % (latent.shape,))
    a = latent.reshape(C, F, Hh // 2, 2, Ww // 2, 2)      # (c, f, h, ph, w, pw)
    a = a.transpose(1, 2, 4, 0, 3, 5)                     # (f, h, w, c, ph, pw)
    return a.reshape(F * (Hh // 2) * (Ww // 2), C * 4)


def unpatchify(y, C, F, Hh, Ww):
    """y [N, 4C] -> latent [C, F, Hh, Ww].

    "each token's 4C outputs are in (pt, ph, pw, c) order, c fastest (note:
    not the patchify order); the value for (pt, ph, pw, c) of the token at
    grid (f, h, w) goes to latent[c, f + pt, 2h + ph, 2w + pw]."
    """
    a = y.reshape(F, Hh // 2, Ww // 2, 1, 2, 2, C)        # (f, h, w, pt, ph, pw, c)
    a = a.transpose(6, 0, 3, 1, 4, 2, 5)                  # (c, f, pt, h, ph, w, pw)
    return a.reshape(C, F, Hh, Ww)


def token_grid(F, Hg, Wg):
    """(f, h, w) grid position of each token, f slowest. Returns [N, 3] ints."""
    f, h, w = np.meshgrid(np.arange(F), np.arange(Hg), np.arange(Wg), indexing="ij")
    return np.stack([f.ravel(), h.ravel(), w.ravel()], axis=1)


# ---------------------------------------------------------------------------
# 3-D RoPE ("## 3-D RoPE")
# ---------------------------------------------------------------------------
def rope_parts(d):
    """Real-dim widths of the (frame, row, column) parts: (d - 4q, 2q, 2q), q = floor(d/6)."""
    q = d // 6
    return (d - 4 * q, 2 * q, 2 * q)


def rope_angles(pos, d):
    """Angles [N, d/2] for pair j of each token.

    "With q = floor(d/6), the first d - 4q real dims rotate with the token's
    frame index, the next 2q with its row index and the last 2q with its
    column index.  Within a part of r real dims, pair j (counted from the
    part's start) has frequency w_j = 10000^(-2j/r), j < r/2, and is rotated
    by the angle pos*w_j."
    """
    pos = np.asarray(pos, dtype=np.float64)
    cols = []
    for axis, r in enumerate(rope_parts(d)):
        if r == 0:
            continue
        j = np.arange(r // 2, dtype=np.float64)
        om = np.power(10000.0, -2.0 * j / r)
        cols.append(pos[:, axis:axis + 1] * om[None, :])
    return np.concatenate(cols, axis=1)


def apply_rope(x, theta):
    """x [N, H, d] with pairs (x_2j, x_2j+1); theta [N, d/2].

    (a, b) -> (a cos th - b sin th, a sin th + b cos th)."""
    cos = np.cos(theta)[:, None, :].astype(x.dtype)
    sin = np.sin(theta)[:, None, :].astype(x.dtype)
    a = x[..., 0::2]
    b = x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


# ---------------------------------------------------------------------------
# Forward ("## Forward (one velocity evaluation)")
# ---------------------------------------------------------------------------
def forward(w, latent, context, sigma, dtype=np.float64, timestep=None):
    """One velocity evaluation v(latent, t = 1000*sigma) given context [L, T].

    `timestep`, when given, is the transformer's t itself and sigma is unused:
    Wan's UniPC / DPM++ pipelines pass an int64 timestep (solvers_ref.py), and
    the sinusoid takes it as a float64 number exactly."""
    cfg = w.cfg
    P = w.as_dtype(dtype)
    D, H, C = cfg.dim, cfg.heads, cfg.in_channels
    d = cfg.head_dim
    latent = np.asarray(latent, dtype=dtype)
    context = np.asarray(context, dtype=dtype)
    Cl, F, Hh, Ww = latent.shape
    if Cl != C:
        raise ValueError("latent has %d channels, config wants %d" % (Cl, C))
    if context.ndim != 2 or context.shape[1] != cfg.text_dim:
        raise ValueError("context shape %s, want [L, %d]" % (context.shape, cfg.text_dim))
    t = 1000.0 * float(sigma) if timestep is None else float(timestep)   # "timestep t = 1000*sigma"

    # 1. Time: s = sinusoid(t) of width 256 ... e = Linear2(SiLU(Linear0(s)))
    #    (`time_embedding`), e6 = Linear1(SiLU(e)) (`time_projection`), viewed as [6, D].
    s = sinusoid(t, cfg.freq_dim, dtype)
    e = linear(silu(linear(s, P["time_embedding.0.weight"], P["time_embedding.0.bias"])),
               P["time_embedding.2.weight"], P["time_embedding.2.bias"])          # [D]
    e6 = linear(silu(e), P["time_projection.1.weight"], P["time_projection.1.bias"]).reshape(6, D)

    # 2. Text: c = Linear2(GELU_tanh(Linear0(context))) (`text_embedding`), [L, D].
    c = linear(gelu_tanh(linear(context, P["text_embedding.0.weight"], P["text_embedding.0.bias"])),
               P["text_embedding.2.weight"], P["text_embedding.2.bias"])

    # 3. Tokens: x = patchify(latent).Wpe^T + bpe, [N, D] (Wpe flattened to [D, 4C]).
    Wpe = P["patch_embedding.weight"].reshape(D, C * 4)    # [D, (c, pt, ph, pw)]
    x = linear(patchify(latent), Wpe, P["patch_embedding.bias"])
    N = x.shape[0]

    theta = rope_angles(token_grid(F, Hh // 2, Ww // 2), d)   # grid positions after patchify

    # 4. Each block, with m = modulation + e6 split in rows as
    #    (shift1, scale1, gate1, shift2, scale2, gate2):
    for i in range(cfg.layers):
        p = "blocks.%d." % i
        m = P[p + "modulation"].reshape(6, D) + e6
        shift1, scale1, gate1, shift2, scale2, gate2 = m

        # - a = LN(x).(1 + scale1) + shift1, LN without affine, eps 1e-6.
        a = layer_norm(x) * (1 + scale1) + shift1
        # - q = RMS(Linear_q(a)).g_q, k = RMS(Linear_k(a)).g_k, v = Linear_v(a);
        #   RMS over the whole width D, eps 1e-6.
        sa = p + "self_attn."
        q = rms_norm(linear(a, P[sa + "q.weight"], P[sa + "q.bias"]), P[sa + "norm_q.weight"])
        k = rms_norm(linear(a, P[sa + "k.weight"], P[sa + "k.bias"]), P[sa + "norm_k.weight"])
        v = linear(a, P[sa + "v.weight"], P[sa + "v.bias"])
        # - split q, k, v into H heads of width d; apply 3-D RoPE to q and k;
        #   attention softmax(q.k^T/sqrt(d)).v per head; concat; o = Linear_o.
        q = apply_rope(q.reshape(N, H, d), theta).reshape(N, D)
        k = apply_rope(k.reshape(N, H, d), theta).reshape(N, D)
        o = linear(attention(q, k, v, H), P[sa + "o.weight"], P[sa + "o.bias"])
        # - x = x + gate1.o
        x = x + gate1 * o

        # - b = LN(x; `norm3` weight and bias, eps 1e-6);
        #   q = RMS(Linear_q(b)).g_q, k = RMS(Linear_k(c)).g_k, v = Linear_v(c);
        #   attention over the L text tokens, no RoPE; x = x + Linear_o(.).
        ca = p + "cross_attn."
        b = layer_norm(x) * P[p + "norm3.weight"] + P[p + "norm3.bias"]
        q = rms_norm(linear(b, P[ca + "q.weight"], P[ca + "q.bias"]), P[ca + "norm_q.weight"])
        k = rms_norm(linear(c, P[ca + "k.weight"], P[ca + "k.bias"]), P[ca + "norm_k.weight"])
        v = linear(c, P[ca + "v.weight"], P[ca + "v.bias"])
        x = x + linear(attention(q, k, v, H), P[ca + "o.weight"], P[ca + "o.bias"])

        # - f = LN(x).(1 + scale2) + shift2 (LN without affine);
        #   x = x + gate2.Linear2(GELU_tanh(Linear0(f))).
        f = layer_norm(x) * (1 + scale2) + shift2
        hdn = gelu_tanh(linear(f, P[p + "ffn.0.weight"], P[p + "ffn.0.bias"]))
        x = x + gate2 * linear(hdn, P[p + "ffn.2.weight"], P[p + "ffn.2.bias"])

    # 5. Head: (shift, scale) = head.modulation + e (rows 0, 1);
    #    y = Linear_head(LN(x).(1 + scale) + shift), LN without affine, [N, 4C].
    hm = P["head.modulation"].reshape(2, D) + e
    shift, scale = hm[0], hm[1]
    y = linear(layer_norm(x) * (1 + scale) + shift, P["head.head.weight"], P["head.head.bias"])

    # 6. Unpatchify: each token's 4C outputs are in (pt, ph, pw, c) order, c fastest.
    return unpatchify(y, C, F, Hh, Ww)


# ---------------------------------------------------------------------------
# Guidance and schedule ("## Guidance and schedule")
# ---------------------------------------------------------------------------
def sigma_schedule(steps, shift):
    """for i = 0..N: u_i = 1 - i/N, sigma_i = S*u_i / (1 + (S - 1)*u_i)  (float64)."""
    N = int(steps)
    S = float(shift)
    if N < 1:
        raise ValueError("steps must be >= 1")
    u = 1.0 - np.arange(N + 1, dtype=np.float64) / N
    return S * u / (1.0 + (S - 1.0) * u)


def velocity(w, x, context, uncond, sigma, cfg, dtype=np.float64, timestep=None):
    """CFG: v = v_u + g.(v_c - v_u); with uncond None, v = v_c (no guidance)."""
    v_c = forward(w, x, context, sigma, dtype, timestep=timestep)
    if uncond is None:
        return v_c
    v_u = forward(w, x, uncond, sigma, dtype, timestep=timestep)
    return v_u + cfg * (v_c - v_u)


def generate(w, latent, context, uncond, steps, shift, cfg, dtype=np.float64):
    """Euler: x_{i+1} = x_i + (sigma_{i+1} - sigma_i).v(x_i, 1000.sigma_i)."""
    sig = sigma_schedule(steps, shift)
    x = np.asarray(latent, dtype=dtype)
    for i in range(int(steps)):
        v = velocity(w, x, context, uncond, sig[i], cfg, dtype)
        x = x + np.asarray(sig[i + 1] - sig[i], dtype=dtype) * v
    return x


# ---------------------------------------------------------------------------
# Fake weights (for testing this module without the C tool)
# ---------------------------------------------------------------------------
def fake_weight_tensors(cfg, seed, std=0.02):
    """N(0, std) for every matrix/bias/modulation, ones for norm gains/weights."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight")):
            out[name] = np.ones(shape, dtype=np.float32)
        else:
            out[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return out


def config_metadata(cfg):
    return {"config": cfg.name, "dim": cfg.dim, "heads": cfg.heads, "layers": cfg.layers,
            "ffn_dim": cfg.ffn_dim, "in_channels": cfg.in_channels,
            "text_dim": cfg.text_dim, "freq_dim": cfg.freq_dim}
