"""What the verifier runs a candidate on: target and edge shapes, seeds, value distributions.

Edge shapes are derived from the target's named dims: sizes that are odd (so not a
multiple of any power-of-two tile), tiny, and one element. Dims that are a model
constant (attention's head size) keep their target value, since variants legitimately
require them. Values come from the op's value regimes (``Op.regimes``,
:mod:`adaptive.ops.regimes`): the inputs real models feed, beyond the op's own generator,
so a kernel tuned to one value range (or one that ignores the data) is caught.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


FIXED_DIMS = {"attention": ("D",)}       # model constants the edge shapes keep
DEFAULT_DIMS = {                          # `adaptive verify` without --shape
    "gemm": {"M": 192, "N": 160, "K": 96},
    "softmax": {"R": 96, "C": 1000},
    "rmsnorm": {"R": 96, "C": 1000},
    "attention": {"B": 2, "H": 3, "Lq": 77, "Lk": 77, "D": 64},
    "spmm": {"M": 192, "N": 64, "K": 160},
}
BIG_FLOPS = 2e9                           # above this, fewer seeds at the target shape
BIG_ELEMS = 1 << 20                       # ... or above this many output elements
LONG_REDUCTION = 4096                     # the long-reduction shape sums at least this many
MAX_REDUCTION = 1 << 16


def edge_shapes(op: str, target: Mapping[str, int]) -> list[tuple[str, dict]]:
    """``[(label, dims)]``: the target first, then odd, tiny and one-element shapes, and
    for ops with a reduction (``Op.reduction_dims``) a long one with few outputs."""
    fixed = FIXED_DIMS.get(op, ())

    def shape(fn) -> dict:
        return {n: (v if n in fixed else max(1, fn(v))) for n, v in target.items()}

    out = [("target", dict(target)),
           ("odd", shape(lambda v: _odd(min(v, 257)))),
           ("odd-small", shape(lambda v: _odd(min(v, 37)))),
           ("tiny", shape(lambda v: min(v, 3))),
           ("one", shape(lambda v: 1))]
    reduce = _reduction_dims(op)
    if reduce:                  # long sums, few outputs: accumulation error at its largest
        long = {n: (v if n in fixed else _odd(min(v, 17))) for n, v in target.items()}
        for n in reduce:
            if n in target and n not in fixed:
                long[n] = min(max(4 * target[n], LONG_REDUCTION), max(target[n], MAX_REDUCTION))
        out.append(("long-reduction", long))
    seen, unique = set(), []
    for label, dims in out:
        key = tuple(sorted(dims.items()))
        if key not in seen:
            seen.add(key)
            unique.append((label, dims))
    return unique


def _reduction_dims(op: str) -> tuple[str, ...]:
    from adaptive.ops import OPS
    o = OPS.get(op)
    return tuple(getattr(o, "reduction_dims", ())) if o is not None else ()


def _odd(v: int) -> int:
    return v if v % 2 == 1 or v <= 1 else v - 1


def parse_dims(text: str) -> dict[str, int]:
    """``"M=128,N=64,K=32"`` → ``{"M": 128, "N": 64, "K": 32}``; clear error otherwise."""
    dims = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"shape part {part!r}: expected NAME=POSITIVE_INT, e.g. M=128")
        dims[name.strip()] = int(value)
    if not dims:
        raise ValueError(f"shape {text!r}: expected NAME=INT pairs separated by commas")
    return dims


def check_dims(op, dims: Mapping[str, int]) -> None:
    """Raise if ``dims`` does not name exactly the op's dims."""
    want = set(DEFAULT_DIMS.get(op.name, dims))
    if op.name == "attention":
        want = {"B", "H", "Lq", "Lk", "D"} | ({"Hkv"} & set(dims))   # Hkv: grouped heads
    if set(dims) != want:
        raise ValueError(f"{op.name} shape names {sorted(dims)}; expected exactly "
                         f"{sorted(want)} (e.g. {_example(op.name)})")


def _example(op: str) -> str:
    return ",".join(f"{k}={v}" for k, v in DEFAULT_DIMS.get(op, {}).items())


def seeds_for(flops: float, out_elems: int, n_seeds: int) -> int:
    """Seeds at one shape: all of them, or 2 for a big shape, where the float64 reference
    on the host dominates (the small edge shapes still get every seed)."""
    return n_seeds if flops < BIG_FLOPS and out_elems <= BIG_ELEMS else 2


def make_inputs(op, dims: Mapping[str, int], dtype: str, seed: int, distribution: str,
                stats: Mapping | None = None) -> tuple:
    """Fresh NumPy inputs for ``op`` at ``dims`` in one of the op's value regimes
    (``op.regimes``: normal, uniform, shifted and the op's own, e.g. softmax's masked)."""
    rng = np.random.default_rng(seed)
    kwargs = {}
    if op.name == "spmm" and stats:
        kwargs = {k: stats[k] for k in ("density", "block", "is_2to4") if k in stats}
    regime = op.regimes.get(distribution)
    if regime is None:
        raise ValueError(f"{op.name} has no value regime {distribution!r}; known: "
                         f"{', '.join(op.regimes)}")
    return regime.draw(op, dims, dtype, rng, **kwargs)
