"""The verifier's verdict on one candidate: a frozen record that travels as a plain dict.

A report is the provenance of every generated variant: it says what was compiled, on
which shapes, seeds and value distributions the candidate matched the float64 reference,
how fast it ran against the current best, and — when rejected — the stage and the text
(compiler log, traceback, mismatch) that the regeneration loop feeds back to the model.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping

REPORT_VERSION = 1


class Outcome(str, enum.Enum):
    """What the verifier concluded."""

    ACCEPTED = "accepted"              # compiled, correct everywhere, timed
    REJECTED = "rejected"              # failed a stage; ``stage`` and ``detail`` say which
    COMPILED_ONLY = "compiled-only"    # cuda candidate on a machine without a GPU


class Stage(str, enum.Enum):
    """Where a rejected candidate failed (closed set, so the loop can react per stage)."""

    SOURCE = "source"                  # no entry, unparsable, wrong language
    COMPILE = "compile"                # NVRTC or Python compile error
    LOAD = "load"                      # module load or entry lookup failed
    RUN = "run"                        # raised or reported a CUDA error while running
    UNWRITTEN = "unwritten"            # poisoned output elements survived
    NONFINITE = "nonfinite"            # NaN or Inf where the reference is finite
    WRONG = "wrong"                    # relative error above the op's tolerance
    RACE = "race"                      # two runs on the same input disagree
    INPUT_MODIFIED = "input-modified"  # an input changed during the call
    OUT_OF_BOUNDS = "out-of-bounds"    # wrote into the guard region around the output
    SANITIZER = "sanitizer"            # compute-sanitizer found an error
    TIMEOUT = "timeout"                # the isolated process ran past its time limit
    CRASH = "crash"                    # the isolated process died (signal, os._exit)
    NONE = ""                          # not rejected


@dataclasses.dataclass(frozen=True)
class Check:
    """One correctness run: shape, seed, value distribution and how close it came."""

    dims: Mapping[str, int]
    seed: int
    distribution: str
    rel_error: float                   # ||out - ref|| / ||ref||
    max_elem_rel_error: float          # max |out - ref| / |ref| over non-near-zero refs
    ok: bool
    problem: str = ""

    def to_dict(self) -> dict:
        return {"dims": dict(self.dims), "seed": self.seed, "distribution": self.distribution,
                "rel_error": _finite_or_str(self.rel_error),
                "max_elem_rel_error": _finite_or_str(self.max_elem_rel_error),
                "ok": self.ok, "problem": self.problem}


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """The verdict on one candidate (variant + config); ``to_dict`` is its provenance form."""

    op: str
    variant: str
    config: Mapping[str, object]
    backend: str
    language: str
    outcome: Outcome
    stage: Stage = Stage.NONE
    detail: str = ""                              # compiler log, traceback, first mismatch
    executed: bool = True                         # False: compile only (no GPU here)
    target_dims: Mapping[str, int] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"
    checks: tuple[Check, ...] = ()
    skipped_shapes: tuple[str, ...] = ()          # edge shapes the variant's requires exclude
    compile_ms: float = 0.0
    resources: Mapping[str, object] = dataclasses.field(default_factory=dict)
    time_ms: float = math.inf                     # median at the target shape
    samples_ms: tuple[float, ...] = ()
    baseline: str = ""                            # label of the current best, timed alongside
    baseline_ms: float = math.inf
    l2_flushed: bool = False
    sanitizer: Mapping[str, str] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    wall_s: float = 0.0
    device: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.ACCEPTED

    @property
    def speedup(self) -> float:
        """Baseline time over candidate time (> 1: the candidate is faster)."""
        if not (math.isfinite(self.time_ms) and math.isfinite(self.baseline_ms)):
            return 0.0
        return self.baseline_ms / self.time_ms if self.time_ms > 0 else math.inf

    @property
    def verdict(self) -> str:
        """One line for people and prompts."""
        label = _label(self.variant, self.config)
        if self.outcome is Outcome.ACCEPTED:
            worst = max((c.rel_error for c in self.checks), default=0.0)
            line = (f"{label}: accepted ({len(self.checks)} checks passed, worst relative error "
                    f"{worst:.2e}; {self.time_ms:.4g} ms")
            if self.baseline:
                line += f" vs {self.baseline_ms:.4g} ms for {self.baseline}"
            return line + ")"
        if self.outcome is Outcome.COMPILED_ONLY:
            return (f"{label}: compiled only — no GPU on this machine, so it was not run, "
                    "checked or timed; verify it on a GPU before trusting it")
        first = self.detail.strip().splitlines()[0] if self.detail.strip() else ""
        return f"{label}: rejected at stage {self.stage.value!r}: {first}"

    def to_dict(self) -> dict:
        """Plain data (JSON, msgpack): the variant's provenance."""
        return {
            "version": REPORT_VERSION, "op": self.op, "variant": self.variant,
            "config": dict(self.config), "backend": self.backend, "language": self.language,
            "outcome": self.outcome.value, "stage": self.stage.value, "verdict": self.verdict,
            "detail": self.detail, "executed": self.executed,
            "target_dims": dict(self.target_dims), "dtype": self.dtype,
            "checks": [c.to_dict() for c in self.checks],
            "skipped_shapes": list(self.skipped_shapes), "compile_ms": self.compile_ms,
            "resources": dict(self.resources), "time_ms": _finite_or_str(self.time_ms),
            "samples_ms": list(self.samples_ms), "baseline": self.baseline,
            "baseline_ms": _finite_or_str(self.baseline_ms), "l2_flushed": self.l2_flushed,
            "sanitizer": dict(self.sanitizer), "notes": list(self.notes),
            "wall_s": self.wall_s, "device": self.device,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> VerifyReport:
        if d.get("version") != REPORT_VERSION:
            raise ValueError(f"verify report version {d.get('version')!r}; expected "
                             f"{REPORT_VERSION} (re-run the verifier)")
        checks = tuple(Check(c["dims"], c["seed"], c["distribution"], _num(c["rel_error"]),
                             _num(c["max_elem_rel_error"]), c["ok"], c.get("problem", ""))
                       for c in d.get("checks", ()))
        return cls(
            op=d["op"], variant=d["variant"], config=dict(d["config"]), backend=d["backend"],
            language=d["language"], outcome=Outcome(d["outcome"]), stage=Stage(d["stage"]),
            detail=d.get("detail", ""), executed=d.get("executed", True),
            target_dims=dict(d.get("target_dims", {})), dtype=d.get("dtype", "float32"),
            checks=checks, skipped_shapes=tuple(d.get("skipped_shapes", ())),
            compile_ms=d.get("compile_ms", 0.0), resources=dict(d.get("resources", {})),
            time_ms=_num(d.get("time_ms", "inf")), samples_ms=tuple(d.get("samples_ms", ())),
            baseline=d.get("baseline", ""), baseline_ms=_num(d.get("baseline_ms", "inf")),
            l2_flushed=d.get("l2_flushed", False), sanitizer=dict(d.get("sanitizer", {})),
            notes=tuple(d.get("notes", ())), wall_s=d.get("wall_s", 0.0),
            device=d.get("device", ""))


def rejected(job: Mapping, stage: Stage, detail: str, **fields) -> VerifyReport:
    """A rejection for a job dict (as the worker and the parent build them)."""
    variant = job.get("variant", {})
    return VerifyReport(op=variant.get("op", job.get("op", "?")),
                        variant=variant.get("name", "?"), config=dict(job.get("config", {})),
                        backend=variant.get("backend", "?"), language=variant.get("language", "?"),
                        outcome=Outcome.REJECTED, stage=stage, detail=detail,
                        target_dims=dict(job.get("dims", {})), dtype=job.get("dtype", "float32"),
                        **fields)


def _label(name: str, config: Mapping) -> str:
    if not config:
        return name
    return f"{name}[{','.join(f'{k}={v}' for k, v in sorted(config.items()))}]"


def _finite_or_str(x: float):
    return x if math.isfinite(x) else str(x)


def _num(x) -> float:
    return float(x)
