"""attention: out = softmax(q kᵀ · scale [+ causal mask] [+ mask]) v over [B, H, L, D] tensors.

k and v may have fewer heads than q (grouped-query attention): with q [B, H, Lq, D] and
k, v [B, Hkv, Lk, D], H a multiple of Hkv, query head h reads key/value head h // (H / Hkv).
No variant needs k and v repeated to H heads. q may have fewer rows than k and v (decode:
Lq = 1). With ``causal=True`` query i may see keys j <= i + (Lk - Lq): the mask is aligned
to the bottom right, so a decode step sees the whole cache and Lq == Lk is the usual lower
triangle.

An optional fourth array ``mask`` [B or 1, 1 or H, Lq, Lk] (padding in a batch) is either
boolean (True: the key is seen) or additive in q's dtype (added to the scaled scores; -inf
hides a key). It combines with ``causal``. A query row that sees no key at all gives zeros
(PyTorch's SDPA does the same). Whether a mask is given is in the key and in the scope as
``masked`` (0 or 1), so a variant that cannot read one says ``requires = ["not masked"]``.
A masked problem also says how its mask is laid out (:data:`MASK_LAYOUT`, in the scope and
the input class, not in the features): ``mask_bool`` (1: boolean, 0: additive),
``mask_per_batch`` (1: a row per batch entry, dim 0 is B > 1) and ``mask_per_head`` (1: a
row per query head, dim 1 is H > 1); kernels that read the mask get its element strides
from them (``mask_sb``, ``mask_sh``: adaptive/backends/cuda_args.py).

``scale`` may be any finite number: 0 weighs the visible keys equally and a negative scale
is the formula as written; NaN and infinities are refused.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from adaptive import arrays
from adaptive.errors import InputTypeError, InputValueError
from adaptive.ops.base import Op, Param, Problem, random_array
from adaptive.ops.regimes import attention_regimes


# what a masked problem's extras say of its mask, beyond ``masked``
MASK_LAYOUT = ("mask_bool", "mask_per_batch", "mask_per_head")


class Attention(Op):
    name = "attention"
    token_dims = ("Lq", "Lk")
    arrays = ("q", "k", "v")       # and an optional fourth, "mask"
    optional_arrays = ("mask",)
    regimes = attention_regimes()   # large scores, constant keys, tiny, mixed + generic
    reduction_dims = ("Lk", "D")
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
        return ({"B": b, "H": h, "Hkv": k.shape[1], "Lq": lq, "Lk": k.shape[2], "D": d},
                {"masked": 0.0})

    def problem(self, args, params) -> Problem:
        """q, k, v validated by the base class; an optional mask checked against them."""
        if len(args) not in (3, 4):
            raise InputTypeError(f"attention takes q, k, v and an optional mask (4 arrays at "
                                 f"most), got {len(args)} array arguments")
        p = super().problem(args[:3], params)
        if len(args) == 3:
            return p
        shape, dtype = _check_mask(args[3], args[0], p)
        layout = (float(dtype == "bool"), float(shape[0] > 1), float(shape[1] > 1))
        return dataclasses.replace(p, extra=(("masked", 1.0), *zip(MASK_LAYOUT, layout)))

    def arrays_given(self, p: Problem) -> int:
        """q, k, v, and the mask where the problem is masked."""
        return 3 + bool(p.extra_dict.get("masked"))

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
        if not feats.get("masked"):   # rows measured before masks existed read the same
            feats.pop("masked", None)
        for name in MASK_LAYOUT:      # the input class and the scope hold the layout
            feats.pop(name, None)
        return feats

    def reference(self, q, k, v, mask=None, causal=False, scale=None):
        q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
        k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        lq, lk, d = q.shape[2], k.shape[2], q.shape[3]
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
        seen = np.ones((lq, lk), bool)
        if causal:
            seen = np.arange(lk)[None, :] <= (np.arange(lq)[:, None] + (lk - lq))
        if mask is not None:
            mask = np.asarray(arrays.to_numpy(mask))
            if mask.dtype == np.bool_:
                seen = seen & mask
            else:
                s = s + mask.astype(np.float64)
        s = np.where(seen, s, -np.inf)
        return softmax_v(s, v)

    def make_inputs(self, dims, dtype, rng, masked=0.0, mask_bool=1.0, mask_per_batch=1.0,
                    mask_per_head=0.0, **stats):
        """q, k, v; with ``masked`` also a padding mask (left padding of a random length
        per batch row, every query row seeing some key) laid out as the extras say:
        boolean, or additive (0 seen, -inf hidden) in q's dtype; [B, ...] or [1, ...] (one
        padding for the batch); [., 1, Lq, Lk] or [., H, Lq, Lk] (padding per head)."""
        b, h, d = dims["B"], dims["H"], dims["D"]
        hkv = dims.get("Hkv", h)
        lq = dims.get("Lq", dims.get("L"))
        lk = dims.get("Lk", lq)
        inputs = (random_array(rng, (b, h, lq, d), dtype),
                  random_array(rng, (b, hkv, lk, d), dtype),
                  random_array(rng, (b, hkv, lk, d), dtype))
        if not masked:
            return inputs
        shape = (b if mask_per_batch else 1, h if mask_per_head else 1, lq, lk)
        mask = padding_mask(rng, shape, max(1, lk - lq + 1))
        if not mask_bool:
            mask = np.where(mask, 0.0, -np.inf).astype(inputs[0].dtype)
        return inputs + (mask,)


def padding_mask(rng: np.random.Generator, shape: tuple, max_pad: int) -> np.ndarray:
    """A boolean left-padding mask of ``shape`` [B', H', Lq, Lk] (a new writable array): each
    (batch entry, head) row set hides its first ``pad`` keys, ``pad`` drawn in [0, max_pad)."""
    pad = rng.integers(0, max_pad, size=shape[:2])
    seen = np.arange(shape[3])[None, None, None, :] >= pad[:, :, None, None]
    return np.broadcast_to(seen, shape).copy()


def softmax_v(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(s) v over the last axis in float64; a row of only -inf gives zeros."""
    top = s.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    p = np.exp(s - top)
    total = p.sum(axis=-1, keepdims=True)
    p /= np.where(total > 0, total, 1.0)
    return np.einsum("bhqk,bhkd->bhqd", p, v)


def _check_mask(mask, q, p: Problem) -> tuple[tuple, str]:
    """The shape and dtype of ``mask``; raise unless it is a [B or 1, 1 or H, Lq, Lk]
    boolean or q-dtype array of q's kind and device, C-contiguous."""
    try:
        arrays.signature(mask)
    except InputTypeError:
        raise InputTypeError(f"attention: argument 'mask' must be an array (or left out), got "
                             f"{type(mask).__name__}") from None
    info, qi = arrays.info(mask), arrays.info(q)
    if info.kind != qi.kind or info.device != qi.device:
        raise InputTypeError(f"attention: mask is a {info.kind} array on {info.device} but q "
                             f"is a {qi.kind} array on {qi.device}; pass the mask like q")
    if info.dtype not in ("bool", p.dtype):
        raise InputTypeError(f"attention: mask dtype {info.dtype}; expected bool (True: "
                             f"seen) or q's dtype {p.dtype} (additive)")
    b, h, lq, lk = (p.dim(n) for n in ("B", "H", "Lq", "Lk"))
    shape = tuple(info.shape)
    if (len(shape) != 4 or shape[0] not in (1, b) or shape[1] not in (1, h)
            or shape[2:] != (lq, lk)):
        raise InputValueError(f"attention: mask shape {shape}; expected [B or 1, 1 or H, Lq, "
                              f"Lk] = [{b} or 1, 1 or {h}, {lq}, {lk}]")
    if not info.contiguous:
        raise InputValueError("attention: argument 'mask' is not C-contiguous; pass a "
                              "contiguous mask (e.g. mask.contiguous())")
    return shape, info.dtype


def repeat_kv(x, heads: int):
    """``x`` [B, Hkv, L, D] with each head repeated to ``heads`` heads (a view-free copy;
    references and host variants only)."""
    group = heads // x.shape[1]
    return x if group == 1 else np.repeat(x, group, axis=1)
