"""An independent numpy umT5 encoder, written from the published
architecture (Wan2.1's wan/modules/t5.py: T5Encoder with shared_pos=False),
not from Reel's C.

  x = E[ids]
  per block:  x = x + O·attn(Q n1, K n1, V n1; bias, mask),  n1 = norm(x)·w1
              x = x + fc2((fc1 n2) * gelu_tanh(gate n2)),     n2 = norm(x)·w2
  out = norm(x)·w

norm(x) = x / sqrt(mean(x^2) + 1e-6); attention has no 1/sqrt(d); the
bias of head h at (query i, key j) is the block's embedding[bucket(j - i), h]
(bidirectional buckets); masked keys get finfo(float32).min, as upstream.
Arithmetic in float64 except the bucket index, computed in float32 as torch
does. Weights come as a dict of float32 arrays under the release's names.
"""

import math

import numpy as np


def bucket(rel, num_buckets=32, max_dist=128):
    """T5RelativeEmbedding._relative_position_bucket, bidirectional=True,
    for an integer array rel = key - query."""
    rel = np.asarray(rel, dtype=np.int64)
    nb = num_buckets // 2
    out = (rel > 0).astype(np.int64) * nb
    a = np.abs(rel)
    max_exact = nb // 2
    with np.errstate(divide="ignore"):
        t = np.log(a.astype(np.float32) / np.float32(max_exact))
    t = t / np.float32(math.log(max_dist / max_exact))
    t = t * np.float32(nb - max_exact)
    t = np.where(np.isfinite(t), t, 0).astype(np.float32)
    large = max_exact + np.trunc(t).astype(np.int64)
    large = np.minimum(large, nb - 1)
    return out + np.where(a < max_exact, a, large)


def _norm(x, w):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def config(w):
    """(vocab, dim, dim_attn, dim_ffn, heads, layers, buckets) from shapes."""
    vocab, dim = w["token_embedding.weight"].shape
    layers = 0
    while "blocks.%d.norm1.weight" % layers in w:
        layers += 1
    buckets, heads = w["blocks.0.pos_embedding.embedding.weight"].shape
    return dict(vocab=vocab, dim=dim, dim_attn=w["blocks.0.attn.q.weight"].shape[0],
                dim_ffn=w["blocks.0.ffn.fc1.weight"].shape[0], heads=heads, layers=layers,
                buckets=buckets)


def encode(w, ids, pad_to=0):
    """Context [len(ids), dim] (float64) of the token ids; pad_to > len(ids)
    runs at that length with token 0 in the padding, masked, and returns the
    real rows only."""
    c = config(w)
    n = len(ids)
    L = pad_to or n
    full = list(ids) + [0] * (L - n)
    mask = np.array([1] * n + [0] * (L - n))
    x = w["token_embedding.weight"].astype(np.float64)[np.array(full)]
    H = c["heads"]
    d = c["dim_attn"] // H
    pos = np.arange(L)
    rel_bucket = bucket(pos[None, :] - pos[:, None], c["buckets"])  # [Lq, Lk]
    for l in range(c["layers"]):
        p = "blocks.%d." % l
        g = lambda k: w[p + k].astype(np.float64)  # noqa: E731
        h = _norm(x, g("norm1.weight"))
        q = (h @ g("attn.q.weight").T).reshape(L, H, d)
        k = (h @ g("attn.k.weight").T).reshape(L, H, d)
        v = (h @ g("attn.v.weight").T).reshape(L, H, d)
        bias = g("pos_embedding.embedding.weight")[rel_bucket].transpose(2, 0, 1)  # [H, Lq, Lk]
        bias = np.where(mask[None, None, :] == 0, np.finfo(np.float32).min, bias)
        s = np.einsum("inc,jnc->nij", q, k) + bias
        s = s - s.max(axis=-1, keepdims=True)
        e = np.exp(s)
        a = e / e.sum(axis=-1, keepdims=True)
        o = np.einsum("nij,jnc->inc", a, v).reshape(L, H * d)
        x = x + o @ g("attn.o.weight").T
        h = _norm(x, g("norm2.weight"))
        f = (h @ g("ffn.fc1.weight").T) * _gelu(h @ g("ffn.gate.0.weight").T)
        x = x + f @ g("ffn.fc2.weight").T
    x = _norm(x, w["norm.weight"].astype(np.float64))
    return x[:n]
