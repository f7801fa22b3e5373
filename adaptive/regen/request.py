"""The values the regeneration loop passes around: request, budget, proposal, attempt.

A :class:`Request` is what a hot, under-performing (or failing) input class becomes: the
op and its input class, the current best candidate with its source, timings and
counters, and why it was raised. Generators turn a request plus the attempts so far into
:class:`Proposal` s; the verifier turns each into a report; an :class:`Attempt` pairs them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from adaptive.regen.report import VerifyReport
from adaptive.variants import Candidate, Variant


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much one regeneration loop may spend."""

    wall_s: float = 600.0
    candidates: int = 16

    def __post_init__(self):
        if not (self.wall_s > 0 and self.candidates >= 1):
            raise ValueError(f"budget needs wall_s > 0 and candidates >= 1, got "
                             f"wall_s={self.wall_s}, candidates={self.candidates}")

    @classmethod
    def from_config(cls) -> Budget:
        from adaptive import config
        c = config.get()
        return cls(wall_s=c.regen_budget_s, candidates=c.regen_candidates)


@dataclasses.dataclass(frozen=True)
class Request:
    """An input class that needs a better variant.

    Args:
        op: op name.
        dims: named dims of the input class (the target shape).
        dtype: element type.
        backend: where the new variant must run ("cuda" or "host").
        best: the current best candidate (None when every candidate failed).
        best_ms: its best observed time.
        floor_ms: the roofline floor of this input on this device.
        reason: why the request was raised (shown in prompts and logs).
    """

    op: str
    dims: Mapping[str, int]
    dtype: str
    backend: str
    best: Candidate | None = None
    best_ms: float = math.inf
    floor_ms: float = 0.0
    samples: int = 0
    params: Mapping[str, object] = dataclasses.field(default_factory=dict)
    stats: Mapping[str, float] = dataclasses.field(default_factory=dict)
    features: Mapping[str, float] = dataclasses.field(default_factory=dict)
    counters: Mapping[str, float] = dataclasses.field(default_factory=dict)
    observed_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)
    limits: Mapping[str, object] = dataclasses.field(default_factory=dict)
    reason: str = ""
    key: tuple = ()

    @property
    def efficiency(self) -> float:
        """Roofline floor over best time (1.0 = at the roofline)."""
        if not (self.best_ms > 0 and math.isfinite(self.best_ms)):
            return 0.0
        # the floor comes from peaks raised to any run that beat them (peaks.raise_to_observed),
        # so it is at most best_ms; min() only absorbs that division's rounding
        return min(1.0, self.floor_ms / self.best_ms)

    @property
    def label(self) -> str:
        dims = ",".join(f"{k}={v}" for k, v in self.dims.items())
        return f"{self.op}[{dims}] {self.dtype} on {self.backend}"

    def to_dict(self) -> dict:
        """Plain data (the part of a generated variant's provenance that says why)."""
        return {"op": self.op, "dims": dict(self.dims), "dtype": self.dtype,
                "backend": self.backend, "best": self.best.label if self.best else None,
                "best_ms": self.best_ms if math.isfinite(self.best_ms) else "inf",
                "floor_ms": self.floor_ms, "efficiency": self.efficiency,
                "samples": self.samples, "params": dict(self.params),
                "counters": dict(self.counters), "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A generated candidate: a variant (new source or new config space) and one config."""

    variant: Variant
    config: Mapping[str, object]
    generator: str
    note: str = ""                  # what was changed, or the model's reply when unusable
    prompt: str = ""                # LLM generators: the prompt that produced it

    @property
    def label(self) -> str:
        return Candidate(self.variant, tuple(sorted(self.config.items()))).label


@dataclasses.dataclass(frozen=True)
class Attempt:
    """A proposal and the verifier's verdict on it."""

    proposal: Proposal
    report: VerifyReport

    @property
    def time_ms(self) -> float:
        return self.report.time_ms if self.report.ok else math.inf
