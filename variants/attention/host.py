"""Host attention: materialised scores, and chunked online softmax over key blocks."""

import math

import numpy as np


def _f(x):
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _grouped(q, k, v):
    """k and v with their heads repeated to q's (grouped-query attention)."""
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return k, v
    return np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)


def attention_materialised(q, k, v, out, causal=False, scale=None):
    q, k, v = _f(q), _f(k), _f(v)
    k, v = _grouped(q, k, v)
    lq, lk = q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    s = np.matmul(q, k.swapaxes(-1, -2)) * np.asarray(scale, q.dtype)
    if causal:
        mask = np.arange(lk)[None, :] > (np.arange(lq)[:, None] + (lk - lq))
        s[..., mask] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    out[...] = np.matmul(s, v)


def attention_chunked(q, k, v, out, chunk, causal=False, scale=None):
    """Flash-style: never holds more than Lq x chunk scores; running max and sum."""
    q, k, v = _f(q), _f(k), _f(v)
    k, v = _grouped(q, k, v)
    lq, lk = q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    q = q * np.asarray(scale, q.dtype)
    m = np.full(q.shape[:3] + (1,), -np.inf, q.dtype)
    l = np.zeros_like(m)
    acc = np.zeros(q.shape[:3] + (v.shape[3],), q.dtype)
    rows = np.arange(lq)[:, None] + (lk - lq)
    for j0 in range(0, lk, chunk):
        j1 = min(j0 + chunk, lk)
        s = np.matmul(q, k[:, :, j0:j1].swapaxes(-1, -2))
        if causal:
            s[..., np.arange(j0, j1)[None, :] > rows] = -np.inf
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new)
        l = l * alpha + p.sum(axis=-1, keepdims=True)
        acc = acc * alpha + np.matmul(p, v[:, :, j0:j1])
        m = m_new
    out[...] = acc / l
