"""Replay the learned policy against a pack's measurements, one input held out at a time.

A pack holds, for each input it measured, the time of every candidate on that device.
For each input in turn this module gives the policy every *other* input's rows (as a
loaded pack would), lets it decide on the held-out input exactly as on a miss, feeds it
the measured times of the candidates it explores (as real calls would), and prices the
candidate it commits to. No GPU is needed: the times are the pack's.

    adaptive pack replay adaptive/packs/h200.msgpack

It answers "how close to the per-input best does the policy land from a pack, and at what
exploration cost" on real device data, and compares the policy with and without its
anchors (the nearest measured input's fastest candidate, the library's candidate).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence

from adaptive.observation import Observation
from adaptive.ops.base import DTYPE_BYTES


@dataclasses.dataclass(frozen=True)
class Case:
    """One held-out input: how the policy did on it."""

    op: str
    dtype: str
    dims: dict
    candidates: int
    explored: int
    committed: str
    best: str
    ratio: float            # committed time / best time (1.0: the best)


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    pack: str
    variant: str            # which policy set-up (with or without anchors)
    cases: tuple[Case, ...]

    def geomean_ratio(self, op: str | None = None) -> float:
        r = [c.ratio for c in self.cases if op is None or c.op == op]
        return math.exp(statistics.fmean(math.log(x) for x in r)) if r else math.nan

    def within(self, bound: float = 1.05) -> float:
        return sum(c.ratio <= bound for c in self.cases) / max(1, len(self.cases))

    def __str__(self) -> str:
        ops = sorted({c.op for c in self.cases})
        per_op = ", ".join(f"{op} {self.geomean_ratio(op):.3f}" for op in ops)
        explored = statistics.fmean(c.explored for c in self.cases) if self.cases else 0
        worst = max(self.cases, key=lambda c: c.ratio, default=None)
        text = (f"{self.variant}: committed/best geomean {self.geomean_ratio():.3f} "
                f"({per_op}); within 5% on {self.within():.0%} of {len(self.cases)} inputs; "
                f"{explored:.1f} candidates explored per input")
        if worst is not None:
            text += (f"; worst {worst.ratio:.2f}x on {worst.op} {worst.dtype} {worst.dims} "
                     f"({worst.committed} vs {worst.best})")
        return text


def _group(rows: Sequence[Observation]) -> dict[tuple, list[Observation]]:
    from adaptive.model import input_key
    out: dict[tuple, list[Observation]] = {}
    for r in rows:
        out.setdefault(input_key(r.op, r.features, r.dtype), []).append(r)
    return out


class _Op:
    """The slice of an op a policy reads on a miss, with the pack's stored features."""

    def __init__(self, name: str, features: dict):
        self.name, self._features = name, features

    def features(self, problem) -> dict:
        return dict(self._features)


class _Problem:
    def __init__(self, row: Observation):
        self.dtype, self._row = row.dtype, row

    def scope(self) -> dict:
        return {**self._row.dims, "dtype": self.dtype,
                "itemsize": DTYPE_BYTES.get(self.dtype, 4)}


class _Context:
    """What :meth:`Learned.decide` reads from a miss's context, from the pack's rows."""

    def __init__(self, first: Observation, key: tuple, limits: dict):
        self.op, self.problem, self.key = _Op(first.op, first.features), _Problem(
            first), key
        self._floor_ms = first.floor_ms
        self.limits = limits

    def floor_ms(self) -> float:
        return self._floor_ms

    def device(self) -> dict:
        return {}


def _limits(fingerprint: dict) -> dict:
    """The limits the grid expressions read, for the pack's device: its SM count, and
    the sm_90 maxima otherwise (what every shipped pack's GPU has)."""
    return {"sm_count": int(fingerprint.get("sm_count", 132)), "max_threads_per_block": 1024,
            "max_shared_bytes": 232448, "warp_size": 32}


def replay(pack_path: str, anchors: bool = True, ops: Sequence[str] | None = None,
           progress: Callable[[int, int], None] | None = None, **policy_args
           ) -> ReplayReport:
    """Leave-one-input-out replay of :class:`~adaptive.learned.Learned` on a pack's rows."""
    from adaptive.learned import Learned
    from adaptive.model import LiveModel, row_geometry
    from adaptive.pack import read_pack
    from adaptive.variants import make_candidate
    pack = read_pack(pack_path)
    limits = _limits(pack.fingerprint)
    variants = {(v.op, v.name): v for v in pack.variants}
    rows = [r for r in pack.rows if (r.op, r.variant) in variants]
    groups = _group(rows)
    held = [k for k in groups if ops is None or k[0] in ops]
    cases = []
    for i, key in enumerate(held):
        mine = [r for r in groups[key] if math.isfinite(r.time_ms) and r.time_ms > 0]
        if len(mine) < 2:
            continue
        policy = Learned(LiveModel(background=False), anchors=anchors, **policy_args)
        policy.add_observations([r for k, g in groups.items() if k != key for r in g],
                                geometry=lambda r: row_geometry(
                                    variants[(r.op, r.variant)], r, limits))
        first = mine[0]
        times = {make_candidate(variants[(r.op, r.variant)], r.config): r.time_ms
                 for r in mine}
        cands = list(times)
        decision = policy.decide(_Context(first, key, limits), cands)
        chosen = decision.candidate
        explored = 1
        if decision.explore:
            explored = len(decision.explore)
            for _ in range(policy.samples):
                for c in decision.explore:
                    later = policy.observe(key, c, times[c])
                    if later is not None and not later.explore:
                        chosen = later.candidate
        best = min(times, key=times.get)
        cases.append(Case(first.op, first.dtype, dict(first.dims), len(cands), explored,
                          chosen.label, best.label, times[chosen] / times[best]))
        if progress is not None:
            progress(i + 1, len(held))
    name = "learned" if anchors else "learned, model picks only (no anchors)"
    return ReplayReport(str(pack_path), name, tuple(cases))
