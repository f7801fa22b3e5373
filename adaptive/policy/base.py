"""Selection policies: how a miss turns a list of candidates into a decision.

A policy sees a :class:`Context` (the op, the validated problem, a way to measure a
candidate on the real input) and returns a :class:`Decision`. It may also receive
sampled observations of later calls through :meth:`Policy.observe`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from adaptive.observation import floor_ms
from adaptive.ops.base import Op, Problem
from adaptive.variants import Candidate


@dataclasses.dataclass(frozen=True)
class Decision:
    """The choice for one key, and why it was made (shown by ``adaptive.explain``)."""

    candidate: Candidate
    reason: str
    observed_ms: tuple[tuple[str, float], ...] = ()     # label -> measured time (median)
    samples: tuple[tuple[str, int], ...] = ()           # label -> timed calls behind it
    predicted_ms: tuple[tuple[str, float], ...] = ()    # label -> model estimate
    tuning_ms: float = 0.0                               # time spent deciding
    # non-empty: a provisional decision; later calls of the key rotate through these
    # candidates (``candidate`` first), timed, until the policy's observe() commits
    explore: tuple[Candidate, ...] = ()
    # set: the input class is being decided off the calling thread, ``candidate`` (the
    # policy's stand-in, see Policy.stand_in) serving its calls meanwhile, untimed
    pending: bool = False

    @property
    def observed(self) -> dict:
        return dict(self.observed_ms)

    @property
    def settled(self) -> bool:
        """Committed: neither exploring nor waiting for its decide."""
        return not self.explore and not self.pending


@dataclasses.dataclass
class Context:
    """What a policy may use on a miss."""

    op: Op
    problem: Problem
    key: tuple
    # measure(candidate, warmup=0): one timed run on the real input, in ms (inf: it failed)
    measure: Callable[..., float]
    peaks: Callable[[], Mapping] | None = None          # the backend's peak rates
    device_state: Callable[[], Mapping] | None = None   # clocks, utilisation, throttling
    limits: Mapping | None = None                       # the backend's limits (SM count, ...)
    # resources(candidate): its ptxas resources from the kernel cache ({} or None: unknown)
    resources: Callable | None = None
    floor: float | None = None    # the roofline floor, when the dispatcher computed it
    # charge(candidate, device_ms): what a call of that device time costs the caller, the
    # host's issuing of the candidate included where the caller's device waits for the host
    # (the dispatcher charges its samples so: a ranking by device time alone would rank
    # what the samples are not); None: the device time
    charge: Callable | None = None

    def floor_ms(self) -> float:
        """Roofline floor of this input on this device in ms (0 when peaks are unknown)."""
        if self.floor is not None:
            return self.floor
        if self.peaks is None:
            return 0.0
        flops, nbytes = self.op.roofline(self.problem)
        return floor_ms(flops, nbytes, self.peaks(), self.problem.dtype)

    def device(self) -> dict:
        """The device state now ({} when the backend has no sampler)."""
        return dict(self.device_state()) if self.device_state is not None else {}


@runtime_checkable
class Policy(Protocol):
    """Everything the library asks of a policy. Subclass :class:`BasePolicy` to get the
    optional capabilities as no-ops and write only ``decide`` (and ``observe``)."""

    name: str
    # timed calls each explored candidate gets at most in one exploration (None: no
    # bound): the dispatcher gives a candidate no further turn once they are issued
    samples: int | None

    def decide(self, ctx: Context, candidates: Sequence[Candidate]) -> Decision:
        """Choose one of ``candidates`` (non-empty) for ``ctx.problem``."""

    def observe(self, key: tuple, candidate: Candidate, time_ms: float) -> Decision | None:
        """A timing of a later call of ``key`` that ran ``candidate``.

        Returns None to keep the key's plan, or a new :class:`Decision` for the key (commit
        after exploring; re-explore after drift); the dispatcher swaps it in.
        """

    def forget_key(self, key: tuple) -> None:
        """The dispatcher dropped ``key`` (its plan was evicted): drop its state too."""

    def note(self, key: tuple, text: str) -> None:
        """What the dispatcher did to ``key``'s samples (one dropped as read past its
        gate): a line for the key's history, where the policy keeps one."""

    def stand_in(self, ctx: Context, candidates: Sequence[Candidate]
                 ) -> tuple[Candidate, str] | None:
        """A candidate to serve a new input class's calls, untimed, while ``decide`` runs
        on a worker thread, and why it (a note for the reason); None: the miss decides on
        the calling thread. A policy that answers must decide without running anything
        (``ctx.measure`` unused) while ``observe`` runs for other classes."""

    def samples_wanted(self, key: tuple, candidate: Candidate) -> int | None:
        """Timed calls ``candidate`` needs in ``key``'s exploration now, where the policy
        asks for more than ``samples`` (a candidate whose samples disagree); None:
        ``samples``. The dispatcher gives a candidate turns up to the larger."""

    def charge_exploration(self, seconds: float) -> None:
        """Host time the dispatcher spent preparing a candidate to explore (a compile, a
        module load): exploring's cost beyond the timed calls."""

    def add_observations(self, rows: Sequence, weight: float = 1.0,
                         geometry: Callable | None = None) -> None:
        """Measurements made elsewhere (packs, counter logs); ``geometry(row)`` gives a
        row's launch-geometry features on this device."""

    def state(self, key: tuple):
        """What the policy knows of one input class (for ``adaptive.explain``), or None."""

    def rank(self, ctx: Context, candidates: Sequence[Candidate]):
        """The model's view of ``candidates`` for ``ctx`` (for ``adaptive.explain``):
        ``(rows, predictions, device, scope, limits)``, or None without a model."""

    @property
    def cost_model(self):
        """The policy's cost model (guides regeneration's search), or None."""


class BasePolicy:
    """The optional parts of :class:`Policy` as no-ops: subclass and write ``decide``."""

    name = "base"
    # the fraction of wall time exploring calls may take (None: unbounded; see Learned)
    explore_budget: float | None = None
    samples: int | None = None   # timed calls an explored candidate gets (None: no bound)

    def decide(self, ctx: Context, candidates: Sequence[Candidate]) -> Decision:
        raise NotImplementedError

    def observe(self, key: tuple, candidate: Candidate, time_ms: float) -> Decision | None:
        return None

    def forget_key(self, key: tuple) -> None:
        pass

    def note(self, key: tuple, text: str) -> None:
        pass

    def stand_in(self, ctx: Context, candidates: Sequence[Candidate]
                 ) -> tuple[Candidate, str] | None:
        return None

    def samples_wanted(self, key: tuple, candidate: Candidate) -> int | None:
        return None

    def charge_exploration(self, seconds: float) -> None:
        pass

    def add_observations(self, rows: Sequence, weight: float = 1.0,
                         geometry: Callable | None = None) -> None:
        pass

    def state(self, key: tuple):
        return None

    def rank(self, ctx: Context, candidates: Sequence[Candidate]):
        return None

    @property
    def cost_model(self):
        return None


class MeasureEach(BasePolicy):
    """Run every candidate on the real input and keep the fastest.

    The foundation's policy: exact for the input at hand, but each new key costs a run of
    every candidate. The learned policy replaces it. ``rounds``: each candidate is timed
    this many times (each after a warm-up run), the candidates interleaved, and ranked by
    its median; 1 (the default) times each once. A single timing on a busy host can read
    several times a call's cost (a collection, another thread's turn): on the 2-core CI
    machine a regeneration test's naive softmax row loop was kept over a promoted
    vectorised one that served it faster.
    """

    name = "measure-each"

    def __init__(self, max_candidates: int | None = None, rounds: int = 1):
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
        self.max_candidates = max_candidates
        self.rounds = rounds

    def decide(self, ctx: Context, candidates: Sequence[Candidate]) -> Decision:
        pool = list(candidates)[: self.max_candidates] if self.max_candidates else candidates
        samples = {c: [] for c in pool}
        for _ in range(self.rounds):
            for c in pool:
                if not samples[c] or math.isfinite(samples[c][-1]):   # a failure is final
                    samples[c].append(ctx.measure(c, warmup=1))
        times = [(c, statistics.median(samples[c])) for c in pool]
        best, best_ms = min(times, key=lambda ct: ct[1])
        if math.isinf(best_ms):
            reasons = "; ".join(c.label for c, _ in times)
            raise RuntimeError(f"every candidate failed: {reasons}")
        how = ("timed once" if self.rounds == 1 else
               f"by the median of {self.rounds} timings, interleaved, each")
        return Decision(best, f"fastest of {len(times)} {how} (after a warm-up) on this input",
                        observed_ms=tuple((c.label, t) for c, t in times),
                        samples=tuple((c.label, len(samples[c])) for c in pool))


class First(BasePolicy):
    """Always the first candidate (the manifest's order): a baseline for benchmarks."""

    name = "first"

    def decide(self, ctx: Context, candidates: Sequence[Candidate]) -> Decision:
        return Decision(candidates[0], "first candidate in manifest order")


# ---- a process-wide warm-up: exploration without the budget ---------------------------------

_unbounded = 0          # unbounded_exploration() blocks open now
_unbounded_lock = threading.Lock()


def exploring_unbounded() -> bool:
    """Whether an :func:`unbounded_exploration` block is open in this process."""
    return _unbounded > 0


@contextlib.contextmanager
def unbounded_exploration():
    """Inside the block, policies explore with no exploration budget and what they explore
    is not charged to it: a server's warm-up, before it takes load, explores every input
    class it meets, and the budget is whole when serving starts. Applies to every
    dispatcher, those made inside the block too; blocks nest.

    Example:
        >>> with adaptive.unbounded_exploration():
        ...     warm_up(model)
    """
    global _unbounded
    with _unbounded_lock:
        _unbounded += 1
    try:
        yield
    finally:
        with _unbounded_lock:
            _unbounded -= 1
