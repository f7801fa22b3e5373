"""Host attention: materialised scores, and chunked online softmax over key blocks.

Both take an optional ``mask`` [B or 1, 1 or H, Lq, Lk] (boolean: True is seen; or
additive), combined with ``causal``; a query row that sees no key gives zeros.
``attention_sdpa_torch``: torch's scaled_dot_product_attention on CPU tensors as they are
(what a plain PyTorch program runs), causal bottom-right aligned as ours.
"""

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


def _masked(s, mask, j0, j1):
    """Scores ``s`` (keys j0..j1) with the mask's columns applied."""
    if mask is None:
        return s
    part = mask[..., j0:j1]
    if part.dtype == np.bool_:
        return np.where(part, s, -np.inf)
    return s + _f(part)


def attention_materialised(q, k, v, mask=None, *, out, causal=False, scale=None):
    q, k, v = _f(q), _f(k), _f(v)
    k, v = _grouped(q, k, v)
    lq, lk = q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    s = np.matmul(q, k.swapaxes(-1, -2)) * np.asarray(scale, q.dtype)
    s = _masked(s, mask, 0, lk)
    if causal:
        hidden = np.arange(lk)[None, :] > (np.arange(lq)[:, None] + (lk - lq))
        s[..., hidden] = -np.inf
    top = s.max(axis=-1, keepdims=True)
    s -= np.where(np.isfinite(top), top, 0)          # a row that sees nothing stays -inf
    np.exp(s, out=s)
    total = s.sum(axis=-1, keepdims=True)
    s /= np.where(total > 0, total, 1)
    out[...] = np.matmul(s, v)


def attention_chunked(q, k, v, mask=None, *, out, chunk, causal=False, scale=None):
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
        s = _masked(np.matmul(q, k[:, :, j0:j1].swapaxes(-1, -2)), mask, j0, j1)
        if causal:
            s[..., np.arange(j0, j1)[None, :] > rows] = -np.inf
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        base = np.where(np.isfinite(m_new), m_new, 0)   # rows with nothing seen yet
        alpha = np.exp(m - base)
        p = np.exp(s - base)
        l = l * alpha + p.sum(axis=-1, keepdims=True)
        acc = acc * alpha + np.matmul(p, v[:, :, j0:j1])
        m = m_new
    out[...] = acc / np.where(l > 0, l, 1)


def attention_sdpa_torch(q, k, v, mask=None, *, out=None, causal=False, scale=None):
    """SDPA of this op's semantics on torch tensors; returns the [B, H, Lq, D] result
    (or writes ``out``). SDPA's causal mask is top-left: used where that equals ours
    (Lq == Lk; Lq == 1 is none), else the bottom-right triangle joins the mask."""
    import torch
    F = torch.nn.functional
    if scale is not None and scale <= 0:   # softmax((-q)k^T |s|); scale 0 is q = 0
        q = -q if scale < 0 else torch.zeros_like(q)
        scale = -scale if scale < 0 else 1.0
    h, hkv, lq, lk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    causal = bool(causal) and lq > 1
    if mask is None and (not causal or lq == lk):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                           enable_gqa=hkv != h)
    else:
        if causal:
            seen = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
            mask = seen if mask is None else (
                mask & seen if mask.dtype == torch.bool else mask.masked_fill(~seen,
                                                                              float("-inf")))
        if hkv != h:
            k, v = k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return y if out is None else out.copy_(y)
