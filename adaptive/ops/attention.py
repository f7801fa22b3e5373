"""attention: out = softmax(q kᵀ · scale [+ causal mask]) v over [B, H, L, D] tensors.

k and v may have fewer heads than q (grouped-query attention): with q [B, H, Lq, D] and
k, v [B, Hkv, Lk, D], H a multiple of Hkv, query head h reads key/value head h // (H / Hkv).
No variant needs k and v repeated to H heads. q may have fewer rows than k and v (decode: Lq = 1). With ``causal=True`` query i may
see keys j <= i + (Lk - Lq): the mask is aligned to the bottom right, so a decode step
sees the whole cache and Lq == Lk is the usual lower triangle.
"""

from __future__ import annotations

import math

import numpy as np

from adaptive.errors import InputValueError
from adaptive.ops.base import Op, Param, Problem, random_array
from adaptive.ops.regimes import attention_regimes


class Attention(Op):
    name = "attention"
    token_dims = ("Lq", "Lk")
    arrays = ("q", "k", "v")
    regimes = attention_regimes()   # large scores, constant keys, tiny, mixed + generic
    reduction_dims = ("Lk", "D")
    params = (
        Param("causal", (bool,), False, "mask keys after each query (bottom-right aligned)"),
        Param("scale", (float, int), None, "logit scale; None means 1/sqrt(D)"),
    )

    def check_shapes(self, infos, args, params):
        q, k, v = infos
        for name, i in zip(self.arrays, infos):
            self._rank(self.name, name, i, 4, "[B, H, L, D]")
        if k.shape != v.shape:
            raise InputValueError(f"attention: k and v must have the same shape, got k {k.shape} "
                                  f"and v {v.shape}")
        if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
            raise InputValueError(f"attention: q {q.shape} and k {k.shape} must agree in B and D "
                                  "(dims 0 and 3)")
        if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
            raise InputValueError(f"attention: q's head count must be a multiple of k's and v's "
                                  f"(grouped-query attention), got H={q.shape[1]} for q and "
                                  f"Hkv={k.shape[1]} for k and v")
        if params["causal"] and q.shape[2] > k.shape[2]:
            raise InputValueError(f"attention: causal needs Lq <= Lk, got Lq={q.shape[2]} and "
                                  f"Lk={k.shape[2]}")
        b, h, lq, d = q.shape
        return {"B": b, "H": h, "Hkv": k.shape[1], "Lq": lq, "Lk": k.shape[2], "D": d}, {}

    def out_shape(self, p: Problem) -> tuple:
        return (p.dim("B"), p.dim("H"), p.dim("Lq"), p.dim("D"))

    def roofline(self, p: Problem):
        b, h, lq, lk, d = (p.dim(n) for n in ("B", "H", "Lq", "Lk", "D"))
        pairs = lq * lk
        if p.params_dict.get("causal"):
            pairs = sum(min(lk, i + 1 + lk - lq) for i in range(lq)) if lq < 4096 else pairs / 2
        flops = 4.0 * b * h * pairs * d
        hkv = p.dims_dict.get("Hkv", h)
        nbytes = float(b * (2 * h * lq + 2 * hkv * lk) * d * p.itemsize)
        return flops, nbytes

    def features(self, p: Problem) -> dict[str, float]:
        """Base features, with the head grouping as ``log2_group`` (0 without grouping, the
        value rows measured before grouped-query attention existed are read with)."""
        feats = super().features(p)
        hkv = feats.pop("log2_Hkv", None)
        if hkv is not None and hkv != feats["log2_H"]:
            feats["log2_group"] = feats["log2_H"] - hkv
        return feats

    def reference(self, q, k, v, causal=False, scale=None):
        q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
        k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        lq, lk, d = q.shape[2], k.shape[2], q.shape[3]
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
        if causal:
            mask = np.arange(lk)[None, :] > (np.arange(lq)[:, None] + (lk - lq))
            s = np.where(mask, -np.inf, s)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        return np.einsum("bhqk,bhkd->bhqd", s, v)

    def make_inputs(self, dims, dtype, rng, **stats):
        b, h, d = dims["B"], dims["H"], dims["D"]
        hkv = dims.get("Hkv", h)
        lq = dims.get("Lq", dims.get("L"))
        lk = dims.get("Lk", lq)
        return (random_array(rng, (b, h, lq, d), dtype),
                random_array(rng, (b, hkv, lk, d), dtype),
                random_array(rng, (b, hkv, lk, d), dtype))


def repeat_kv(x, heads: int):
    """``x`` [B, Hkv, L, D] with each head repeated to ``heads`` heads (a view-free copy;
    references and host variants only)."""
    group = heads // x.shape[1]
    return x if group == 1 else np.repeat(x, group, axis=1)
