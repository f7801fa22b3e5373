"""attention: out = softmax(q kᵀ · scale [+ causal mask]) v over [B, H, L, D] tensors.

q may have fewer rows than k and v (decode: Lq = 1). With ``causal=True`` query i may
see keys j <= i + (Lk - Lq): the mask is aligned to the bottom right, so a decode step
sees the whole cache and Lq == Lk is the usual lower triangle.

``scale`` may be any finite number: 0 weighs the visible keys equally and a negative scale
is the formula as written; NaN and infinities are refused.
"""

from __future__ import annotations

import math

import numpy as np

from adaptive.errors import InputValueError
from adaptive.ops.base import Op, Param, Problem, random_array


class Attention(Op):
    name = "attention"
    arrays = ("q", "k", "v")
    params = (
        Param("causal", (bool,), False, "mask keys after each query (bottom-right aligned)"),
        Param("scale", (float, int), None, "logit scale, any finite number; None means "
              "1/sqrt(D), 0 weighs the visible keys equally",
              checks=((math.isfinite, "a finite number (None: 1/sqrt(D))"),)),
    )

    def check_shapes(self, infos, args, params):
        q, k, v = infos
        for name, i in zip(self.arrays, infos):
            self._rank(self.name, name, i, 4, "[B, H, L, D]")
        if k.shape != v.shape:
            raise InputValueError(f"attention: k and v must have the same shape, got k {k.shape} "
                                  f"and v {v.shape}")
        if q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[3] != k.shape[3]:
            raise InputValueError(f"attention: q {q.shape} and k {k.shape} must agree in B, H and "
                                  "D (dims 0, 1 and 3)")
        if params["causal"] and q.shape[2] > k.shape[2]:
            raise InputValueError(f"attention: causal needs Lq <= Lk, got Lq={q.shape[2]} and "
                                  f"Lk={k.shape[2]}")
        b, h, lq, d = q.shape
        return {"B": b, "H": h, "Lq": lq, "Lk": k.shape[2], "D": d}, {}

    def out_shape(self, p: Problem) -> tuple:
        return (p.dim("B"), p.dim("H"), p.dim("Lq"), p.dim("D"))

    def roofline(self, p: Problem):
        b, h, lq, lk, d = (p.dim(n) for n in ("B", "H", "Lq", "Lk", "D"))
        pairs = lq * lk
        if p.params_dict.get("causal"):
            pairs = sum(min(lk, i + 1 + lk - lq) for i in range(lq)) if lq < 4096 else pairs / 2
        flops = 4.0 * b * h * pairs * d
        nbytes = float(b * h * (2 * lq + 2 * lk) * d * p.itemsize)
        return flops, nbytes

    def reference(self, q, k, v, causal=False, scale=None):
        q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
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
        lq = dims.get("Lq", dims.get("L"))
        lk = dims.get("Lk", lq)
        return (random_array(rng, (b, h, lq, d), dtype), random_array(rng, (b, h, lk, d), dtype),
                random_array(rng, (b, h, lk, d), dtype))
