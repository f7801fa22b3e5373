"""Measurements and observation rows: the one record shared by the cost model, packs,
counter logs and benchmarks.

A :class:`Measurement` is samples, not a number. An :class:`Observation` is one row of
training data: which candidate ran on which input, how long it took, and what the device
looked like. Rows travel through msgpack as plain dicts with unit-suffixed keys.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Timing samples of one candidate on one input (after ``warmup`` untimed runs); made
    by :func:`adaptive.timing.measure`. ``error``: why the last sample is ``inf`` (empty
    when no run failed)."""

    samples_ms: tuple[float, ...]
    warmup: int = 0
    l2_flushed: bool = False
    error: str = ""

    @property
    def median_ms(self) -> float:
        finite = [s for s in self.samples_ms if math.isfinite(s)]
        return statistics.median(finite) if finite else math.inf

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms, default=math.inf)

    @property
    def spread_ms(self) -> float:
        """Inter-quartile range (0 with fewer than 4 samples)."""
        s = sorted(x for x in self.samples_ms if math.isfinite(x))
        if len(s) < 4:
            return 0.0
        q = statistics.quantiles(s, n=4)
        return q[2] - q[0]


@dataclasses.dataclass(frozen=True)
class Observation:
    """One training row: candidate × input → time, with the device state."""

    op: str
    dims: Mapping[str, int]
    dtype: str
    variant: str
    config: Mapping[str, object]
    time_ms: float
    floor_ms: float = 0.0                         # roofline floor on the measuring device
    features: Mapping[str, float] = dataclasses.field(default_factory=dict)
    samples: int = 1
    spread_ms: float = 0.0
    device: Mapping[str, object] = dataclasses.field(default_factory=dict)   # clocks, util
    counters: Mapping[str, float] = dataclasses.field(default_factory=dict)
    timestamp_s: float = 0.0
    source: str = ""                              # "pack" | "log" | "live" | "bench"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for name in ("dims", "config", "features", "device", "counters"):
            d[name] = dict(d[name])
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Observation:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"op", "dims", "dtype", "variant", "config", "time_ms"} - d.keys()
        if missing:
            raise ValueError(f"observation row lacks {', '.join(sorted(missing))}")
        row = {k: v for k, v in d.items() if k in names}
        dims = row["dims"]
        if row["op"] == "attention" and "Hkv" not in dims and "H" in dims:
            # measured before grouped-query attention: k and v had H heads
            row["dims"] = {}
            for name, value in dims.items():
                row["dims"][name] = value
                if name == "H":
                    row["dims"]["Hkv"] = value
        return cls(**row)


def floor_ms(flops: float, nbytes: float, peaks: Mapping, dtype: str) -> float:
    """Roofline floor in ms: max(flops / peak rate, bytes / peak bandwidth)."""
    rate = peaks["flops_per_s"].get(dtype) or max(peaks["flops_per_s"].values())
    return max(flops / rate, nbytes / peaks["bytes_per_s"]) * 1e3


def summarise(rows: Sequence[Observation]) -> dict:
    """Counts per op and variant (for ``pack show`` and ``log show``)."""
    out: dict = {}
    for r in rows:
        out.setdefault(r.op, {}).setdefault(r.variant, 0)
        out[r.op][r.variant] += 1
    return out
