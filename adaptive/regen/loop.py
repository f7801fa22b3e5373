"""One regeneration loop: generate → verify → feed the verdict back, within a budget;
then promote the fastest verified candidate that beats the current best.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable

from adaptive.regen.parametric import Generator
from adaptive.regen.request import Attempt, Budget, Request
from adaptive.regen.verifier import Job, Verifier
from adaptive.variants import Registry, Variant

log = logging.getLogger("adaptive.regen")

MIN_SPEEDUP = 1.03         # a winner must beat the current best by more than timing noise


@dataclasses.dataclass(frozen=True)
class LoopResult:
    """What one loop did: every attempt with its verdict, the winner and its promotion."""

    request: Request
    attempts: tuple[Attempt, ...]
    winner: Attempt | None
    promoted: Variant | None          # the registered variant (verifier report in provenance)
    stopped: str                      # why the loop ended
    wall_s: float

    @property
    def accepted(self) -> list[Attempt]:
        return [a for a in self.attempts if a.report.ok]

    def summary(self) -> str:
        head = (f"{self.request.label}: {len(self.attempts)} candidates, "
                f"{len(self.accepted)} accepted, {self.wall_s:.1f} s ({self.stopped})")
        if self.winner is None:
            return head + "; no winner"
        r = self.winner.report
        return (head + f"; winner {self.winner.proposal.label} {r.time_ms:.4g} ms vs "
                f"{r.baseline_ms:.4g} ms ({r.speedup:.2f}x)"
                + ("; promoted" if self.promoted is not None else ""))


def pick_winner(request: Request, attempts: list[Attempt],
                min_speedup: float = MIN_SPEEDUP) -> Attempt | None:
    """The fastest accepted attempt that beats the baseline timed beside it."""
    best = None
    for a in attempts:
        r = a.report
        if not r.ok or not math.isfinite(r.time_ms):
            continue
        beats = (not math.isfinite(r.baseline_ms) and request.best is None) or \
            r.speedup > min_speedup
        if beats and (best is None or r.time_ms < best.report.time_ms):
            best = a
    return best


def promote(registry: Registry, request: Request, attempt: Attempt) -> Variant:
    """Register the winner; its provenance holds the request and the verifier's report.

    The registry notifies its dispatchers, which re-rank the op on their next launch. The
    returned variant is what a pack stores (``variant.to_dict()`` carries the report).
    """
    p = attempt.proposal
    provenance = {**p.variant.provenance, "generator": p.generator, "request": request.to_dict(),
                  "verifier": attempt.report.to_dict(), "promoted_at_s": time.time()}
    variant = dataclasses.replace(p.variant, provenance=provenance, origin="generated")
    registry.add(variant, replace=True)
    log.info("promoted %s for %s (%.2fx)", variant.id, request.label, attempt.report.speedup)
    return variant


def run_loop(request: Request, generator: Generator, verifier: Verifier | None = None,
             budget: Budget | None = None, registry: Registry | None = None,
             progress: Callable[[Attempt, int, int], None] | None = None,
             batch: int = 4, min_speedup: float = MIN_SPEEDUP,
             cancelled: Callable[[], bool] | None = None) -> LoopResult:
    """Run one closed loop for ``request``; promote into ``registry`` when given.

    Args:
        request: the input class and its current best.
        generator: proposes candidates (parametric, hf, openai).
        verifier: isolated verifier (default settings when None).
        budget: wall time and number of candidates.
        registry: where a winner is promoted (None: report only).
        progress: called with (attempt, index, budget.candidates) after each verdict.
        batch: proposals verified per worker process (the parametric generator can
            fill a batch; model-backed generators propose one at a time).
        cancelled: checked between rounds; True ends the loop (no promotion).
    """
    verifier = verifier or Verifier()
    budget = budget or Budget.from_config()
    t0 = time.monotonic()
    attempts: list[Attempt] = []
    stopped = "candidate budget spent"
    while len(attempts) < budget.candidates:
        if time.monotonic() - t0 > budget.wall_s:
            stopped = "wall-time budget spent"
            break
        if cancelled is not None and cancelled():
            return LoopResult(request, tuple(attempts), None, None, "cancelled",
                              time.monotonic() - t0)
        limit = min(batch, budget.candidates - len(attempts))
        proposals = generator.propose(request, list(attempts), limit)[:limit]
        if not proposals:
            stopped = "generator exhausted"
            break
        jobs = [Job(p.variant, p.config, request.dims, request.dtype, request.params,
                    request.stats, baseline=request.best) for p in proposals]
        for p, report in zip(proposals, verifier.verify_many(jobs)):
            attempts.append(Attempt(p, report))
            log.info("regen %s: %s", request.label, report.verdict)
            if progress is not None:
                progress(attempts[-1], len(attempts), budget.candidates)
    winner = pick_winner(request, attempts, min_speedup)
    promoted = promote(registry, request, winner) if winner and registry is not None else None
    return LoopResult(request, tuple(attempts), winner, promoted, stopped,
                      time.monotonic() - t0)


def write_pack(result: LoopResult, path: str) -> str:
    """Write the promoted variant (its verifier report in the provenance) and its verified
    timing as a variant pack (:mod:`adaptive.packs.format`); returns the pack's sha256."""
    from adaptive.observation import Observation
    from adaptive.packs.format import new_pack
    from adaptive.packs.install import current_fingerprint
    from adaptive.packs.format import write_pack as write
    if result.promoted is None or result.winner is None:
        raise ValueError(f"nothing to pack: {result.summary()}")
    r, req = result.winner.report, result.request
    row = Observation(op=req.op, dims=dict(req.dims), dtype=req.dtype,
                      variant=result.promoted.name, config=dict(result.winner.proposal.config),
                      time_ms=r.time_ms, floor_ms=req.floor_ms, features=dict(req.features),
                      samples=len(r.samples_ms), timestamp_s=time.time(), source="regen")
    fingerprint = current_fingerprint(req.backend) or {"backend": req.backend}
    pack = new_pack([result.promoted], [row], fingerprint,
                    build={"regen": result.summary()})
    return write(pack, path)
