"""vae_ref.py -- a numpy (float64) reference of Wan2.1's VAE decoder, written
from the published architecture (wan/modules/vae.py: WanVAE, WanVAE_.decode,
Decoder3d, ResidualBlock, AttentionBlock, Resample, CausalConv3d, RMS_norm),
in PyTorch's channel-first layout [C, T, H, W]; nothing here follows
Reel's C code (which is channels-last, im2col + GEMM).

Two decoders:

decode_whole(w, z)   the whole clip at once: every causal conv zero-pads
                     its temporal kernel on the left over the full clip, and
                     each upsample3d passes frame 0 through and runs its
                     time conv over frames 1.. only.
decode_chunked(w, z) upstream's own loop: one latent frame per call of the
                     decoder with feat_cache / feat_idx, CACHE_T = 2, the
                     'Rep' marker of upsample3d, exactly as WanVAE_.decode.

Why the two agree (reference_checks() tests it): a CausalConv3d with
padding p pads 2p frames of zeros before its input; with a cache it
concatenates the cached frames and pads 2p - len(cache) zeros. The cache
after each chunk is that conv's last two input frames (x[:, :, -2:], or
the previous cache's last frame and x's single frame), which for a kernel
of 3 frames is exactly what the whole-clip conv sees before the chunk's
first frame; at the start of the clip the cache is shorter and the zeros
make up the rest, as in the whole clip. Every other layer (RMS_norm over
channels, SiLU, 1x1x1 convs, the per-frame attention, nearest upsampling,
the per-frame 2-D conv) acts on each frame alone. upsample3d is the
exception: on the first chunk its cache is None, so it sets it to 'Rep' and
skips the time conv (the frame passes through undoubled); on the second
chunk 'Rep' means time_conv(x) with no cache (zero padding), and the cache
it keeps is [zeros, x] (or x[-2:]); so its time conv runs over the frames
of chunks 1.. as one causal stream that never sees frame 0: the whole clip's
frame 0, then time_conv over frames 1.. interleaved. Frames: 1 + 4(F-1).
"""

import numpy as np

WAN_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
            0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
WAN_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
           3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]
CACHE_T = 2


def config_from_weights(w):
    o, z = w["decoder.conv1.weight"].shape[:2]
    return {"dim": o // 4, "z_dim": z, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
            "temperal_upsample": [True, True, False]}


# ---- layers ([C, T, H, W], float64) ---------------------------------------

def causal_conv3d(x, wt, b, cache=None):
    """CausalConv3d with padding (kt//2, kh//2, kw//2): 2*(kt//2) zero frames
    before, none after, unless `cache` (frames to put first) shortens them."""
    O, C, kt, kh, kw = wt.shape
    pt = 2 * (kt // 2)
    if cache is not None and pt > 0:
        x = np.concatenate([cache, x], axis=1)
        pt -= cache.shape[1]
    xp = np.pad(x, ((0, 0), (pt, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)))
    T = xp.shape[1] - kt + 1
    H, W = x.shape[2], x.shape[3]
    out = np.zeros((O, T, H, W))
    for dt in range(kt):
        for dy in range(kh):
            for dx in range(kw):
                out += np.einsum("oc,cthw->othw", wt[:, :, dt, dy, dx],
                                 xp[:, dt:dt + T, dy:dy + H, dx:dx + W])
    return out + b[:, None, None, None]


def conv2d_frames(x, wt, b):
    """nn.Conv2d(k, padding=k//2) on every frame."""
    return causal_conv3d(x, wt[:, :, None], b)


def rms_norm(x, gamma):
    """F.normalize over channels (eps 1e-12) * sqrt(C) * gamma."""
    n = np.sqrt(np.sum(x * x, axis=0, keepdims=True))
    return x / np.maximum(n, 1e-12) * np.sqrt(x.shape[0]) * gamma.reshape(-1, 1, 1, 1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def upsample_nearest2x(x):
    return x.repeat(2, axis=2).repeat(2, axis=3)


def attention(w, p, x):
    """AttentionBlock: per frame, RMS_norm, 1x1 to q, k, v (channel thirds),
    single-head softmax(q k^T / sqrt(C)) v over the H*W pixels, 1x1 proj, residual."""
    C, T, H, W = x.shape
    out = np.empty_like(x)
    wq = w[p + ".to_qkv.weight"].reshape(3 * C, C)
    bq = w[p + ".to_qkv.bias"]
    wp = w[p + ".proj.weight"].reshape(C, C)
    bp = w[p + ".proj.bias"]
    for t in range(T):
        xn = rms_norm(x[:, t:t + 1], w[p + ".norm.gamma"])[:, 0].reshape(C, H * W)
        qkv = wq @ xn + bq[:, None]
        q, k, v = qkv[:C].T, qkv[C:2 * C].T, qkv[2 * C:].T
        s = q @ k.T / np.sqrt(C)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
        o = (s @ v).T
        out[:, t] = (wp @ o + bp[:, None]).reshape(C, H, W) + x[:, t]
    return out


# ---- the whole clip at once -----------------------------------------------

def resblock_whole(w, p, x):
    h = x
    if p + ".shortcut.weight" in w:
        h = causal_conv3d(x, w[p + ".shortcut.weight"], w[p + ".shortcut.bias"])
    y = silu(rms_norm(x, w[p + ".residual.0.gamma"]))
    y = causal_conv3d(y, w[p + ".residual.2.weight"], w[p + ".residual.2.bias"])
    y = silu(rms_norm(y, w[p + ".residual.3.gamma"]))
    y = causal_conv3d(y, w[p + ".residual.6.weight"], w[p + ".residual.6.bias"])
    return y + h


def interleave(y, C):
    """[2C, T, H, W] -> [C, 2T, H, W]: reshape (2, C) then stack along time."""
    T = y.shape[1]
    out = np.empty((C, 2 * T) + y.shape[2:])
    out[:, 0::2] = y[:C]
    out[:, 1::2] = y[C:]
    return out


def resample_whole(w, p, x, temporal):
    if temporal and x.shape[1] > 1:
        C = x.shape[0]
        y = causal_conv3d(x[:, 1:], w[p + ".time_conv.weight"], w[p + ".time_conv.bias"])
        x = np.concatenate([x[:, :1], interleave(y, C)], axis=1)
    return conv2d_frames(upsample_nearest2x(x), w[p + ".resample.1.weight"], w[p + ".resample.1.bias"])


def unscale(w, z):
    cfg = config_from_weights(w)
    zd = cfg["z_dim"]
    mean = np.array(WAN_MEAN if zd == 16 else [0.0] * zd).reshape(-1, 1, 1, 1)
    std = np.array(WAN_STD if zd == 16 else [1.0] * zd).reshape(-1, 1, 1, 1)
    return np.asarray(z, np.float64) / (1.0 / std) + mean


def decode_whole(w, z):
    """z [z_dim, F, H, W] -> video [3, 1+4(F-1), 8H, 8W], clamped."""
    cfg = config_from_weights(w)
    x = causal_conv3d(unscale(w, z), w["conv2.weight"], w["conv2.bias"])
    x = causal_conv3d(x, w["decoder.conv1.weight"], w["decoder.conv1.bias"])
    x = resblock_whole(w, "decoder.middle.0", x)
    x = attention(w, "decoder.middle.1", x)
    x = resblock_whole(w, "decoder.middle.2", x)
    idx = 0
    for i in range(4):
        for _ in range(cfg["num_res_blocks"] + 1):
            x = resblock_whole(w, "decoder.upsamples.%d" % idx, x)
            idx += 1
        if i < 3:
            x = resample_whole(w, "decoder.upsamples.%d" % idx, x, cfg["temperal_upsample"][i])
            idx += 1
    x = silu(rms_norm(x, w["decoder.head.0.gamma"]))
    x = causal_conv3d(x, w["decoder.head.2.weight"], w["decoder.head.2.bias"])
    return np.clip(x, -1.0, 1.0)


# ---- upstream's chunked loop ------------------------------------------------

class Cache:
    def __init__(self):
        self.map = {}
        self.idx = 0


def cached_conv(cache, x, wt, b):
    """The feat_cache step around one CausalConv3d (Decoder3d, ResidualBlock)."""
    i = cache.idx
    prev = cache.map.get(i)
    cx = x[:, -CACHE_T:].copy()
    if cx.shape[1] < 2 and prev is not None:
        cx = np.concatenate([prev[:, -1:], cx], axis=1)
    out = causal_conv3d(x, wt, b, prev)
    cache.map[i] = cx
    cache.idx += 1
    return out


def resblock_chunk(w, p, x, cache):
    h = x
    if p + ".shortcut.weight" in w:
        h = causal_conv3d(x, w[p + ".shortcut.weight"], w[p + ".shortcut.bias"])
    y = silu(rms_norm(x, w[p + ".residual.0.gamma"]))
    y = cached_conv(cache, y, w[p + ".residual.2.weight"], w[p + ".residual.2.bias"])
    y = silu(rms_norm(y, w[p + ".residual.3.gamma"]))
    y = cached_conv(cache, y, w[p + ".residual.6.weight"], w[p + ".residual.6.bias"])
    return y + h


def resample_chunk(w, p, x, temporal, cache):
    if temporal:
        i = cache.idx
        prev = cache.map.get(i)
        if prev is None:
            cache.map[i] = "Rep"
            cache.idx += 1
        else:
            cx = x[:, -CACHE_T:].copy()
            if cx.shape[1] < 2 and not isinstance(prev, str):
                cx = np.concatenate([prev[:, -1:], cx], axis=1)
            if cx.shape[1] < 2 and isinstance(prev, str):
                cx = np.concatenate([np.zeros_like(cx), cx], axis=1)
            wt, b = w[p + ".time_conv.weight"], w[p + ".time_conv.bias"]
            y = causal_conv3d(x, wt, b) if isinstance(prev, str) else causal_conv3d(x, wt, b, prev)
            cache.map[i] = cx
            cache.idx += 1
            x = interleave(y, x.shape[0])
    return conv2d_frames(upsample_nearest2x(x), w[p + ".resample.1.weight"], w[p + ".resample.1.bias"])


def decode_chunked(w, z):
    cfg = config_from_weights(w)
    x_all = causal_conv3d(unscale(w, z), w["conv2.weight"], w["conv2.bias"])
    cache = Cache()
    outs = []
    for f in range(x_all.shape[1]):
        cache.idx = 0
        x = cached_conv(cache, x_all[:, f:f + 1], w["decoder.conv1.weight"], w["decoder.conv1.bias"])
        x = resblock_chunk(w, "decoder.middle.0", x, cache)
        x = attention(w, "decoder.middle.1", x)
        x = resblock_chunk(w, "decoder.middle.2", x, cache)
        idx = 0
        for i in range(4):
            for _ in range(cfg["num_res_blocks"] + 1):
                x = resblock_chunk(w, "decoder.upsamples.%d" % idx, x, cache)
                idx += 1
            if i < 3:
                x = resample_chunk(w, "decoder.upsamples.%d" % idx, x, cfg["temperal_upsample"][i], cache)
                idx += 1
        x = silu(rms_norm(x, w["decoder.head.0.gamma"]))
        x = cached_conv(cache, x, w["decoder.head.2.weight"], w["decoder.head.2.bias"])
        outs.append(x)
    return np.clip(np.concatenate(outs, axis=1), -1.0, 1.0)


# ---- random weights for the reference's own checks ------------------------

def random_weights(dim, z_dim, seed):
    """Random weights under WanVAE_'s decoder names (conv2 and decoder.*)."""
    rng = np.random.default_rng(seed)
    dims = [dim * m for m in (4, 4, 4, 2, 1)]
    w = {}

    def conv(name, o, c, *k):
        fan = c * int(np.prod(k))
        w[name + ".weight"] = rng.standard_normal((o, c) + k) / np.sqrt(fan)
        w[name + ".bias"] = 0.05 * rng.standard_normal(o)

    def gamma(name, c, nd):
        w[name + ".gamma"] = (1 + 0.1 * rng.standard_normal(c)).reshape((c,) + (1,) * nd)

    def rb(p, i, o):
        gamma(p + ".residual.0", i, 3)
        conv(p + ".residual.2", o, i, 3, 3, 3)
        gamma(p + ".residual.3", o, 3)
        conv(p + ".residual.6", o, o, 3, 3, 3)
        if i != o:
            conv(p + ".shortcut", o, i, 1, 1, 1)

    conv("conv2", z_dim, z_dim, 1, 1, 1)
    conv("decoder.conv1", dims[0], z_dim, 3, 3, 3)
    rb("decoder.middle.0", dims[0], dims[0])
    gamma("decoder.middle.1.norm", dims[0], 2)
    conv("decoder.middle.1.to_qkv", 3 * dims[0], dims[0], 1, 1)
    conv("decoder.middle.1.proj", dims[0], dims[0], 1, 1)
    rb("decoder.middle.2", dims[0], dims[0])
    idx = 0
    for i in range(4):
        cin, cout = (dims[i] // 2 if i else dims[i]), dims[i + 1]
        for _ in range(3):
            rb("decoder.upsamples.%d" % idx, cin, cout)
            cin = cout
            idx += 1
        if i < 3:
            conv("decoder.upsamples.%d.resample.1" % idx, cout // 2, cout, 3, 3)
            if i < 2:
                conv("decoder.upsamples.%d.time_conv" % idx, 2 * cout, cout, 3, 1, 1)
            idx += 1
    gamma("decoder.head.0", dims[4], 3)
    conv("decoder.head.2", 3, dims[4], 3, 3, 3)
    return w
