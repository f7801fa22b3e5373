"""The learned policy: rank with the cost model, explore on real calls, commit, watch drift.

On a miss :class:`Learned` predicts every candidate in one batched call and returns at
once: the best-predicted candidate runs this call, and later calls of the key rotate
through the few candidates whose optimistic estimate (mean - z·sigma) is within a regret
bound of the best. Once each has been timed ``samples`` times the policy commits to the
fastest observed; the dispatcher then serves the key with a plain plan. Sampled timings
of committed keys are compared with what exploring observed; a sustained drift (a clock
drop, another process) re-opens exploration. A drift watches only the committed
candidate's own time, so when it changes the choice (a co-running load slows the choice
2x and a smaller kernel 1.2x) the key is re-explored again later, after
``revalidate_every`` sampled calls, doubling while the choice holds (a bounded cost):
when the load leaves, the displaced candidate's recovery shows in no sampled time of the
new choice. With no model yet it explores a few diverse candidates, never all of them.

The policy does not know how times arrive (host timer, CUDA events harvested later): it
only sees :meth:`Learned.observe` calls.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from adaptive.policy.base import BasePolicy, Context, Decision, exploring_unbounded
from adaptive.variants import Candidate

log = logging.getLogger(__name__)


class Samples:
    """Timings of one candidate on one key: the last :attr:`RING_SIZE` kept (a ring, so a
    key's memory is bounded however long it runs), the count of all of them and whether
    any failed. Reads like the list of the kept timings (``len()`` is the full count)."""

    RING_SIZE = 16     # timings kept per candidate per key (the bound on a key's memory)
    __slots__ = ("_ring", "count", "failed", "raced")

    def __init__(self, times=()):
        self._ring: deque = deque(maxlen=self.RING_SIZE)
        self.count = 0
        self.failed = False
        self.raced = False   # left behind by this exploration's leader (Learned.race_ratio)
        for t in times:
            self.add(t)

    def add(self, time_ms: float) -> None:
        self._ring.append(time_ms)
        self.count += 1
        self.failed |= not (math.isfinite(time_ms) and time_ms > 0)

    def median(self) -> float:
        """The median of the kept finite timings (inf: none; robust to one cold first call
        and to one interfered call out of three)."""
        return _median(list(self._ring))

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(self._ring)

    def __getitem__(self, i):
        return list(self._ring)[i]

    def __eq__(self, other) -> bool:
        return list(self._ring) == list(other)

    def __repr__(self) -> str:
        return f"Samples({list(self._ring)!r}, count={self.count})"


# the fewest candidates a key with few of them explores under Learned.explore_fraction
EXPLORE_FLOOR = 4
# the baseline is left behind by the race once two of its samples are over this times the
# race bar (see Learned.race_ratio). Never, before run S135: SDPA from CuPy at 0.12 ms took
# its 3 samples beside flash kernels of 0.023 on long-burst's attention keys (S134, tuning
# runs 10.2%). At 2 (S135-S140), SDPA at 3.3x the leader still took them (S138: 3 samples
# on 10 of 11 keys; tuning runs 9.8-10.2% in six runs). On the H200 corpus with noisy
# samples (benchmarks/cpu_replay_knobs.py --ops attention,spmm): 1 cost spmm 4 points
# within 5%; 1.5 and 2 read the same (spmm 84% and 82%, attention 86% both)
BASELINE_RACE_FACTOR = 1.5
# a stand-in (Learned.stand_in) is looked for among the fastest candidates of this many
# nearest measured inputs (distinct candidates): the nearest's may not fit (a softmax
# kernel holding a row in registers on a wider row)
STAND_IN_NEAREST = 4
# the longest a miss waits for the model's first fit of the rows it was given (a start-up
# pack's: 17,755 rows of the shipped H200 pack fit in 4.3 s on a 2-core machine, in the
# background from the process's start). A miss decided without them explores diverse
# candidates and keeps what it commits: run S142's first miss, a decode input, came before
# the fit and served a config 1.14x the best for the whole run. Serving the library until
# the fit and deciding again after it (S143-S146) left a server's warm-up holding keys
# that still explored at its limit (37-46 of them). Waiting once, at the process's first
# misses, is what a server's start can absorb; past this bound the miss decides cold
FIRST_FIT_WAIT_S = 30.0

# configs of the leader's variant a refinement times at least where the model extrapolated
# (Learned.far_refine): the shipped H100 pack's replay (10 folds, dealings 0-3, exact
# times) attention within 5% 92.5% -> 93.1%, softmax's worst 1.47x -> 1.33x
FAR_REFINE = 1


@dataclasses.dataclass
class KeyState:
    """What the policy knows about one key (read by :func:`adaptive.explain`)."""

    op: str
    features: dict
    floor_ms: float
    device: object                             # the DeviceState the rows were built with
    candidates: tuple[Candidate, ...]          # in predicted order (best first)
    predicted: dict                            # candidate -> (mean, sigma) in log units
    explore: tuple[Candidate, ...]
    observed: dict                             # candidate -> Samples (bounded ring)
    committed: Candidate | None = None
    expected_ms: float = math.nan              # the committed candidate's explored median
    # the median of the first steady samples after a commit: what drift is measured
    # against (steady samples are timed without the hold exploring samples queue behind,
    # so on an idle GPU they read the launch latency too: like is compared with like)
    steady_ms: float = math.nan
    reason: str = ""
    recent: deque = dataclasses.field(default_factory=lambda: deque(maxlen=8))
    explorations: int = 0                      # how many times exploration was opened
    dtype: str = ""
    scope: dict = dataclasses.field(default_factory=dict)  # the input, for geometry
    limits: dict | None = None                                # the device's limits
    rows: dict = dataclasses.field(default_factory=dict)   # explored candidate -> model row
    # what happened to the key (miss, commits, drifts), newest last; bounded
    history: deque = dataclasses.field(default_factory=lambda: deque(maxlen=16))
    # committed to the library candidate without exploring (the exploration budget was
    # spent); ``explore`` holds what the policy would have explored, opened later
    deferred: bool = False
    previous: Candidate | None = None   # committed before this exploration (None: the miss)
    revalidating: bool = False          # this exploration re-validates a drift's choice
    # steady samples until the key is re-explored although no drift showed (0: never) and
    # the interval it was last scheduled at: set when a drift changed the choice
    revalidate_in: int = 0
    revalidate_interval: int = 0
    # exploring samples per candidate over the key's life, every exploration (``observed``
    # starts anew at each, and goes on with the committed candidate's steady samples,
    # which are the calls served, not tuning)
    explored: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # this exploration was widened once already (``Learned.widen_margin``)
    widened: bool = False
    # the configs this exploration's refinement added (``Learned.refine_configs``; once
    # per exploration; each is left behind once a sample of it is slower than the leader)
    refining: tuple = ()
    # the miss's nearest measured input was beyond ``Learned.far_distance``: the model
    # extrapolated its ranking (set by decide)
    far: bool = False
    cap: int = 0   # most candidates explored on this key (Learned._cap, set by decide)
    # the candidates the class's calls rotate over now (a subset of ``explore``: those
    # still short of their samples); empty: all of ``explore``
    rotation: tuple = ()

    def predicted_ms(self, c: Candidate) -> float:
        if c not in self.predicted:
            return math.nan
        return math.exp(self.predicted[c][0]) * self._unit()

    def predicted_table(self) -> tuple[tuple[str, float], ...]:
        """(label, :meth:`predicted_ms`) of every predicted candidate, best-ranked first,
        as one array (a miss ranks ~100)."""
        ranked = [c for c in self.candidates if c in self.predicted]
        ms = np.exp([self.predicted[c][0] for c in ranked]) * self._unit()
        return tuple(zip((c.label for c in ranked), ms.tolist()))

    def _unit(self) -> float:   # the predictions are in log units of the floor, if any
        return self.floor_ms if self.floor_ms > 0 else 1.0


class Neighbours:
    """Measured inputs per (op, dtype) with the fastest candidate of each: the prior that
    "what was fastest on the nearest measured input is worth one exploring call here".

    Filled from pack and counter-log rows and from the policy's own commits. Distance is
    Euclidean over the op features (log2 sizes, density), so a 4096x4096x1024 gemm is near
    4096x4096x2048 and far from a 1-row decode. Read on misses only.
    """

    # measured inputs kept per (op, dtype, feature names): a serving process commits one
    # per input class it meets, so the oldest go first past this (a pack holds ~100 an op)
    MAX_INPUTS = 4096

    def __init__(self):
        self._by: dict[tuple, dict[tuple, tuple[np.ndarray, tuple, float]]] = {}
        # per key, its inputs' points stacked and their fastest candidates, made on the
        # first read after a change (a miss reads them twice: anchors and the far guard)
        self._stacked: dict[tuple, tuple[np.ndarray, list]] = {}
        self._lock = threading.Lock()
        self.evicted = 0

    def add(self, op: str, dtype: str, features: dict, variant: str, config_items: tuple,
            time_ms: float) -> None:
        if not (math.isfinite(time_ms) and time_ms > 0):
            return
        names = tuple(sorted(features))
        point = tuple(round(float(features[k]), 4) for k in names)
        with self._lock:
            inputs = self._by.setdefault((op, dtype, names), {})
            self._stacked.pop((op, dtype, names), None)
            old = inputs.get(point)
            if old is None or time_ms < old[2]:
                inputs[point] = (np.asarray(point), (variant, config_items), time_ms)
            if len(inputs) > self.MAX_INPUTS:   # insertion order: the oldest input goes
                del inputs[next(iter(inputs))]
                self.evicted += 1

    def fastest_near(self, op: str, dtype: str, features: dict, k: int = 1
                     ) -> list[tuple[tuple, float]]:
        """``[((variant, config_items), distance)]``: the fastest candidates of the nearest
        measured inputs, nearest first, ``k`` distinct candidates at most."""
        names = tuple(sorted(features))
        got = self._stack((op, dtype, names))
        if got is None:
            return []
        points, whos = got
        here = np.asarray([float(features[n]) for n in names])
        dists = np.linalg.norm(points - here, axis=1)
        out: list[tuple[tuple, float]] = []
        for i in np.argsort(dists, kind="stable"):
            dist, who = float(dists[i]), whos[i]
            if all(who != w for w, _ in out):
                out.append((who, dist))
                if len(out) == k:
                    break
        return out

    def nearest(self, op: str, dtype: str, features: dict, same: Sequence[str] = ()
                ) -> float | None:
        """The distance to the nearest measured input whose features named in ``same``
        (flags such as ``param_causal``) equal these: None with no input of this op,
        dtype and features measured, ``inf`` with none of these flags."""
        names = tuple(sorted(features))
        got = self._stack((op, dtype, names))
        if got is None:
            return None
        points = got[0]
        here = np.asarray([float(features[n]) for n in names])
        flags = [names.index(n) for n in same if n in names]
        if flags:
            points = points[np.all(points[:, flags] == np.round(here[flags], 4), axis=1)]
            if not len(points):
                return math.inf
        return float(np.min(np.linalg.norm(points - here, axis=1)))

    def _stack(self, key: tuple) -> tuple[np.ndarray, list] | None:
        """(points, fastest candidates) of ``key``'s inputs; None with none."""
        got = self._stacked.get(key)
        if got is None:
            with self._lock:
                inputs = self._by.get(key)
                if not inputs:
                    return None
                got = self._stacked[key] = (
                    np.stack([point for point, _, _ in inputs.values()]),
                    [who for _, who, _ in inputs.values()])
        return got

    def copy(self) -> Neighbours:
        """An independent copy (the points are shared: they are never changed in place)."""
        out = Neighbours()
        with self._lock:
            out._by = {k: dict(v) for k, v in self._by.items()}
        return out

    def __len__(self) -> int:
        return sum(len(v) for v in self._by.values())


def _fraction_or_none(name: str, value):
    """``value`` if it is None or a fraction in (0, 1], else a ValueError naming ``name``."""
    if value is not None and not (isinstance(value, (int, float)) and 0 < value <= 1):
        raise ValueError(f"{name} must be a fraction in (0, 1] or None, got {value!r}")
    return value


class Learned(BasePolicy):
    """Choose with a learned cost model; explore only where the model is unsure.

    Args:
        model: a :class:`~adaptive.policy.cost_model.LiveModel` (or None: a fresh one,
            fitted from the observations this policy makes, refitted in the background). A
            miss while its first fit of the rows it was given (a start-up pack's) runs
            waits for that fit, at most :data:`FIRST_FIT_WAIT_S`.
        regret_bound: explore candidates whose optimistic time is within this fraction of
            the best prediction (0.2: at most 20 % slower, optimistically).
        z: how optimistic: mean - z·sigma in log units.
        max_explore: most candidates explored per key (cold or not), before a refinement's
            (``refine_configs``); 8: on the H200 corpus, 4 left spmm at 1.063
            committed/best, 8 at 1.027 (under 10 % of its ~105 candidates); the regret
            bound explores fewer where the model is sure.
        anchors: explore also the fastest candidates of the nearest measured inputs
            (:class:`Neighbours`) and the baselines (each baseline variant's best-ranked
            config; without one, the best-ranked library candidate), in place of the
            model's last picks (``adaptive pack replay`` measures what they buy).
        neighbours_k: how many nearest inputs' fastest candidates are anchors.
        per_variant: candidates of one variant among the model's first picks: four
            configs of one kernel all share the model's error about that kernel (on the
            H200 corpus, 2 instead of unlimited: spmm best-of-4 within 5% 73% -> 78%).
            Room left in ``max_explore`` after the cap goes to the next candidates within
            the regret bound, in model order (one variant within reach gets up to
            ``max_explore`` of its configs: on the corpus, softmax within 5% 88% -> 91-94%,
            where large-C inputs explored 3 configs of block_row and missed a 5-9% faster
            one ranked 5th to 8th).
        variant_reach: a variant with no candidate within the regret bound whose
            best-ranked config's optimistic time is within this fraction of the best
            prediction (0.5: 1.5x) gets that config one slot, in place of the model's last
            picks (anchors still displace those first; the model's first pick always
            stays): the model's prior may come from other conditions than the call's (a
            pack measures each candidate on one input repeated, L2-hot; run S10's stream
            of inputs arrived out of L2, where reg_row_cs ran softmax 2048x4096 in
            0.0125-0.016 ms against the committed block_row's 0.020, ranked 1.56x slower
            and never explored). 0: none. On the H200 corpus (5 folds by input) 0.5 keeps
            every op's committed/best within 0.001 and 1 point of within 5%; 1.0 (2x) cost
            softmax 3 points and, unbounded, spmm 1.019 -> 1.042.
        variant_slots: most slots those variants take (2: of the best-ranked first).
        far_distance: where the nearest measured input (pack rows and live samples, in
            feature space) is farther than this, the model extrapolates: every variant's
            best-ranked config competes for the ``variant_slots``, not only those within
            ``variant_reach``, and the picks within the regret bound take each variant's
            best-ranked config before any variant's second, and its second configs unlike
            its first (:meth:`_per_variant`) (None: never). On the shipped H200 pack an
            input's nearest other input is 1.3-3.0 away at the median, 1.7-4.5 at the 90th
            percentile. Run S107 (H200): softmax 32768x4096 fp16, 4.05 from the nearest,
            was ranked 8 configs of warp_row, multi_row and block_row within 20%,
            committed warp_row at 0.2234 ms against reg_row's 0.1445 (never explored): 1.5
            ms of long-burst's excess.
        min_explore: fewest candidates explored where there are that many (2: where the
            model puts one candidate alone within the regret bound and no anchor adds
            another, the best-ranked config of the next variant is timed beside it; run
            S24 committed cuBLAS unseen on gemm 4x1024x1024 at 1.7x the best candidate).
            1: a sure model commits without exploring. At most ``max_explore``.
        samples: timed calls per explored candidate before committing; the commit compares
            each candidate's median (3: one cold first call or one interfered call cannot
            decide it, as the fastest single sample could).
        drift_ratio: re-explore when the median of recent samples leaves
            [expected / ratio, expected · ratio].
        drift_window: how many recent samples that median covers.
        revalidate_every: when a drift's re-exploration changed the committed candidate,
            re-explore the key again after this many sampled calls of the new choice, and
            after twice as many each time the choice holds (up to 16x): a co-running load
            that made a smaller kernel the fastest is seen to leave only this way, since
            the new choice may barely slow under it (and so barely speed up without it).
        explore_budget: the fraction of wall time that exploring calls may take (None:
            unbounded). Exploring runs candidates that may be slower than the library on
            real calls; once the calls explored have taken more than ``explore_burst_s``
            plus ``explore_budget`` of the time since, a new input class that has a
            library candidate (cuBLAS or SDPA through torch: what the plain program runs)
            is served by it without exploring, and is explored later, on one of its
            sampled calls, when the budget allows again (a class with no library
            candidate, on the host, is explored at once). A serving process that warms up
            first lifts the bound for its warm-up (:func:`adaptive.unbounded_exploration`).
        explore_burst_s: exploring time allowed at once (the bucket's size; 0.5 s: a cold
            process explores its first classes at once, a warmed-up server that meets a new
            class mid-load spends at most this on it before the fraction applies).
        baseline_margin: an explored candidate replaces the baseline (what the plain
            program runs: the variant marked ``baseline``; of two, the faster) only when
            its median is at least this fraction faster than the baseline's: three
            in-stream samples read a few percent apart (run S9 served a decode shape with
            a config 13% slower than the best one, by its exploration's pick), and a
            patched model must never be slower than the plain one for a margin inside
            that noise. 0: the fastest median, whatever it is.
        race_ratio: an explored candidate whose fastest sample is more than this times
            the leader's median (the fastest median of a candidate timed at least twice)
            is explored no further in this exploration: more samples of it would not
            change the commit (None: every candidate timed ``samples`` times). 1.3, not
            2.0 as before: on the H200 (run S152, one run) long-burst's tuning runs went
            11.1% -> 9.9% of exhaustive autotune's with steady/oracle within 1.05 on
            every stream. The first
            explored candidate is never left behind unless it is the baseline, and the
            baseline only once two of its samples are over :data:`BASELINE_RACE_FACTOR`
            times the bar; a re-exploration times every candidate again.
        explore_fraction: on a key with few candidates, at most this fraction of them is
            explored (at least :data:`EXPLORE_FLOOR` and ``min_explore``; :meth:`_cap`).
            None: ``max_explore``.
        clear_margin: an explored candidate timed at least twice whose every sample is
            more than this fraction above the leader's slowest sample is timed no further
            (left behind as by ``race_ratio``), and the leader, timed at least twice, is
            committed once every other candidate is left behind: the last of ``samples``
            is spent only where two candidates' samples overlap. The first explored
            candidate is never left behind this way either, unless it is the baseline.
            None: off.
        noise_ratio: an explored candidate whose median is more than this times its own
            fastest sample (most of its samples met interference) is timed again, a call
            at a time, up to twice ``samples``, before the commit reads its median: run
            S113's mixed table read cuBLAS at 0.19, 2.04 and 1.40 ms (median 1.40) and
            committed a kernel 1.7x slower, and S114 read ``three_pass`` at 0.09, 0.82 and
            1.35 ms against SDPA's 0.44. Not where its fastest sample is already slower
            than another candidate's median (it cannot win: run S123's long-burst timed
            four softmax candidates of a 12-call key 6 times each). None: ``samples``
            always.
        widen_margin: before a commit, candidates the model left out are explored too
            when the measurements refute its ranking (:meth:`_widen`): predicted, at the
            least wrong explored candidate's error, this fraction faster than the
            measured best. None: never.
        explore_share: on a key with many candidates, up to this fraction of them is
            explored even past ``max_explore`` (:meth:`_cap`): spmm's and softmax's
            ~100-116 candidates hold many within a few percent of each other, and 8 of
            them reached 84-90% of the corpus's spmm inputs within 5% of the best over
            six dealings of the folds (worst 1.78x), 11 of them 90-94% (worst 1.29x), at
            a tuning share of 4.9% (exhaustive autotune times 4 runs a candidate: a cap
            of a tenth of them, 3 samples each, stays under 7.5% of its runs). None:
            ``max_explore`` bounds every key.
        settle_margin: the commit is made before every candidate has its ``samples`` once
            it is decided to within this fraction (:meth:`_settled`): every candidate still
            explored timed at least twice, and no further sample could bring another's
            median within this fraction of the leader's (with ``samples`` 3, a third sample
            can only move a median between the first two). Where two candidates' samples
            interleave, the last samples are still spent. 0.02: in the shipped H200 pack's
            replay (10 folds by input, 5% noise and outliers) prefills' tuning share 11.2%
            -> 10.5% of exhaustive autotune's, within 5% 91.2% -> 93.0%. None: off.
        refine_configs: configs of the leader's variant timed before a commit
            (:meth:`_refine`). None: the op's own
            (:attr:`adaptive.ops.base.Op.refine_configs`: 1 for spmm, 0 for the others);
            an int: that many on every op.
        far_refine: configs a refinement adds at least where the model extrapolated (the
            miss's nearest measured input beyond ``far_distance``), whatever the op's own
            count; those beyond the op's own are the leader's configs most unlike it (the
            model's order within the variant is extrapolated too). 0: none beyond the
            op's own.
    """

    name = "learned"

    def __init__(self, model=None, regret_bound: float = 0.2, z: float = 1.0,
                 max_explore: int = 8, samples: int = 3, drift_ratio: float = 1.5,
                 drift_window: int = 4, anchors: bool = True, neighbours_k: int = 2,
                 per_variant: int = 2, explore_budget: float | None = 0.01,
                 explore_burst_s: float = 0.5, revalidate_every: int = 8,
                 baseline_margin: float = 0.03, variant_reach: float = 0.5,
                 variant_slots: int = 2, min_explore: int = 2,
                 far_distance: float | None = 3.5,
                 race_ratio: float | None = 1.3, widen_margin: float | None = 0.1,
                 explore_fraction: float | None = 0.4, clear_margin: float | None = 0.03,
                 noise_ratio: float | None = 2.0, explore_share: float | None = None,
                 settle_margin: float | None = 0.02, refine_configs: int | None = None,
                 far_refine: int = FAR_REFINE):
        if model is None:
            from adaptive.policy.cost_model import LiveModel
            model = LiveModel()
        if not 1 <= max_explore:
            raise ValueError(f"max_explore must be at least 1, got {max_explore}")
        if not (isinstance(min_explore, int) and min_explore >= 1):
            raise ValueError(f"min_explore must be an int >= 1, got {min_explore!r}")
        self.min_explore = min(min_explore, max_explore)
        if samples < 1 or drift_window < 1 or drift_ratio <= 1.0 or regret_bound < 0 \
                or revalidate_every < 1:
            raise ValueError("expected samples >= 1, drift_window >= 1, drift_ratio > 1, "
                             "regret_bound >= 0 and revalidate_every >= 1; got "
                             f"{samples}, {drift_window}, {drift_ratio}, {regret_bound}, "
                             f"{revalidate_every}")
        if not (isinstance(baseline_margin, (int, float)) and 0 <= baseline_margin < 1):
            raise ValueError(f"baseline_margin must be a fraction in [0, 1), got "
                             f"{baseline_margin!r}")
        if not (isinstance(variant_reach, (int, float)) and variant_reach >= 0):
            raise ValueError(f"variant_reach must be a fraction >= 0, got {variant_reach!r}")
        if not (isinstance(variant_slots, int) and variant_slots >= 0):
            raise ValueError(f"variant_slots must be an int >= 0, got {variant_slots!r}")
        if far_distance is not None and not (isinstance(far_distance, (int, float))
                                             and far_distance > 0):
            raise ValueError(f"far_distance must be > 0 or None, got {far_distance!r}")
        self.far_distance = far_distance
        if race_ratio is not None and not (isinstance(race_ratio, (int, float))
                                           and race_ratio > 1):
            raise ValueError(f"race_ratio must be > 1 or None, got {race_ratio!r}")
        self.race_ratio = race_ratio
        if widen_margin is not None and not (isinstance(widen_margin, (int, float))
                                             and widen_margin >= 0):
            raise ValueError(f"widen_margin must be a fraction >= 0 or None, got "
                             f"{widen_margin!r}")
        self.widen_margin = widen_margin
        self.explore_share = _fraction_or_none("explore_share", explore_share)
        self.explore_fraction = _fraction_or_none("explore_fraction", explore_fraction)
        if clear_margin is not None and not (isinstance(clear_margin, (int, float))
                                             and clear_margin >= 0):
            raise ValueError(f"clear_margin must be a fraction >= 0 or None, got "
                             f"{clear_margin!r}")
        self.clear_margin = clear_margin
        if settle_margin is not None and not (isinstance(settle_margin, (int, float))
                                              and settle_margin >= 0):
            raise ValueError(f"settle_margin must be a fraction >= 0 or None, got "
                             f"{settle_margin!r}")
        self.settle_margin = settle_margin
        if refine_configs is not None and not (isinstance(refine_configs, int)
                                               and refine_configs >= 0):
            raise ValueError(f"refine_configs must be an int >= 0 or None (the op's own), "
                             f"got {refine_configs!r}")
        self.refine_configs = refine_configs
        if not (isinstance(far_refine, int) and far_refine >= 0):
            raise ValueError(f"far_refine must be an int >= 0, got {far_refine!r}")
        self.far_refine = far_refine
        self.variant_reach = variant_reach
        self.variant_slots = variant_slots
        self.baseline_margin = baseline_margin
        self.revalidate_every = revalidate_every
        self.model = model
        self.regret_bound = regret_bound
        self.z = z
        self.max_explore = max_explore
        self.anchors = anchors
        self.neighbours_k = neighbours_k
        if per_variant < 1:
            raise ValueError(f"per_variant must be at least 1, got {per_variant}")
        self.per_variant = per_variant
        if explore_budget is not None and not (
                isinstance(explore_budget, (int, float)) and 0 < explore_budget <= 1):
            raise ValueError(f"explore_budget must be a fraction in (0, 1] or None "
                             f"(unbounded), got {explore_budget!r}")
        if not (isinstance(explore_burst_s, (int, float)) and explore_burst_s > 0):
            raise ValueError(f"explore_burst_s must be > 0 seconds, got {explore_burst_s!r}")
        self.explore_budget = explore_budget
        self.explore_burst_s = explore_burst_s
        self._credit_s = explore_burst_s          # exploring time left (a token bucket)
        self._credit_at = time.monotonic()
        self.samples = samples
        if noise_ratio is not None and not noise_ratio > 1:
            raise ValueError(f"noise_ratio must be > 1 or None, got {noise_ratio!r}")
        self.noise_ratio = noise_ratio
        self.drift_ratio = drift_ratio
        self.drift_window = drift_window
        self.keys: dict[tuple, KeyState] = {}
        self.neighbours = Neighbours()
        self.stats = {"neighbour_added": 0, "decisions": 0, "cold": 0, "commits": 0,
                      "drifts": 0, "explore_calls": 0, "deferred": 0, "reopened": 0, "settled": 0,
                      "revalidations": 0, "drift_switches": 0, "explore_s": 0.0,
                      # seconds misses waited for the model's first fit (FIRST_FIT_WAIT_S)
                      "first_fit_wait_s": 0.0,
                      # a miss's ranking: building the candidates' rows, the model's
                      # prediction (seconds, all misses: where a decision's time goes)
                      "rows_s": 0.0, "predict_s": 0.0}
        self._lock = threading.Lock()

    # ---- miss ---------------------------------------------------------------------------
    def rank(self, ctx: Context, candidates: Sequence[Candidate]):
        """The model rows of ``candidates`` on this input and the model's (mean, sigma)
        of each (None before the first fit): what :meth:`decide` ranks by, and what
        :func:`adaptive.explain` shows for an input not decided yet."""
        from adaptive.policy.features import DeviceState, candidate_rows
        device = DeviceState.from_mapping(ctx.device())
        limits = ctx.limits
        scope = ctx.problem.scope() if limits else {}
        t0 = time.perf_counter()
        rows = candidate_rows(ctx.op.name, ctx.op.features(ctx.problem), candidates, scope,
                              limits, device, ctx.resources)
        t1 = time.perf_counter()
        dist = self.model.predict_dist(rows)
        self.stats["rows_s"] += t1 - t0
        self.stats["predict_s"] += time.perf_counter() - t1
        return rows, dist, device, scope, limits

    def decide(self, ctx: Context, candidates: Sequence[Candidate]) -> Decision:
        op = ctx.op.name
        features = ctx.op.features(ctx.problem)
        waited = self._first_fit() if self.model.first_fit_pending else ""
        rows, dist, device, scope, limits = self.rank(ctx, candidates)
        floor = ctx.floor_ms()
        cap = self._cap(len(candidates))
        far = None
        if dist is None:
            ranked = _diverse(candidates)
            predicted = {}
            explore = tuple(ranked[:cap])
            why = f"cold (no model yet): exploring {len(explore)} diverse candidates of " \
                  f"{len(candidates)}"
        else:
            mean, sigma = dist
            charged = ""
            if ctx.charge is not None:   # rank what the samples will be charged
                mean, charged = charged_mean(ctx.charge, candidates, mean, floor)
            order = model_order(mean)
            ranked = [candidates[i] for i in order]
            # as Python floats, whole arrays at a time (a miss ranks ~100 candidates)
            means, sigmas = np.asarray(mean).tolist(), np.asarray(sigma).tolist()
            bounds = (np.asarray(mean) - self.z * np.asarray(sigma)).tolist()
            predicted = {candidates[i]: (means[i], sigmas[i]) for i in order}
            best = means[order[0]]
            reach = best + math.log1p(self.regret_bound)
            wide = best + math.log1p(max(self.regret_bound, self.variant_reach))
            far = self._far(op, ctx.problem.dtype, features)
            if far is not None:   # extrapolating: every variant's best may take a slot
                wide = math.inf
            within = [candidates[i] for i in order if bounds[i] <= reach]
            explore = self._picks(within, _firsts(
                candidates[i] for i in order if bounds[i] <= wide), cap, far is not None)
            others = [c for c in explore if c not in within]
            why = (f"model ranked {len(candidates)}{charged}; {len(explore) - len(others)} "
                   f"within {self.regret_bound:.0%} of the best optimistically")
            if others:
                why += (f" and {len(others)} other variants' best " + (
                    f"(the nearest measured input {far:.2f} away, beyond "
                    f"{self.far_distance:g})" if far is not None else
                    f"within {1 + self.variant_reach:.3g}x") + " (" + ", ".join(
                        c.label for c in others) + ")")
        explore, also = self._anchored(op, ctx.problem.dtype, features, candidates, ranked,
                                       explore, cap)
        why = waited + why + also
        if len(explore) < self.min_explore and dist is not None:
            # a sure model is not a right one: run S24 committed cuBLAS unseen on gemm
            # 4x1024x1024 at 1.7x the best, every other candidate ranked 1.2x slower
            # the next variants' best configs first, then the model's order
            others = dict.fromkeys(c for c in (*_firsts(ranked), *ranked) if c not in explore)
            extra = tuple(others)[: self.min_explore - len(explore)]
            if extra:
                explore += extra
                why += "; plus " + ", ".join(c.label for c in extra) + \
                    f" (at least {self.min_explore} explored)"
        # the library's candidate, when explored, runs first: the class's first call (its
        # first result) pays no compile or module load, and runs what the plain program
        # would; the order of the others' turns changes nothing the commit reads
        library = library_candidate(ctx.problem, ranked)
        if library is not None and library in explore and explore[0] != library:
            explore = (library,) + tuple(c for c in explore if c != library)
        at = {c: i for i, c in enumerate(candidates)}
        state = KeyState(op, features, floor, device, tuple(ranked), predicted, explore,
                         {c: Samples() for c in explore}, reason=why, explorations=1, cap=cap,
                         dtype=ctx.problem.dtype, scope=scope, limits=limits,
                         rows={c: rows[at[c]] for c in explore}, far=far is not None)
        state.history.append("miss: " + why)
        with self._lock:
            self.keys[ctx.key] = state
            self.stats["decisions"] += 1
            self.stats["cold"] += dist is None
            # with the budget spent, a class with a library candidate (what the plain
            # program runs) is served by it and explored later; without one (the host)
            # there is nothing safe to serve instead, and it is explored now
            safe = library if len(explore) > 1 else None
            deferred = safe is not None and self._credit() <= 0
            if deferred:
                self.stats["deferred"] += 1
        predicted_ms = state.predicted_table()
        if deferred:
            state.committed, state.deferred = safe, True
            state.reason = (f"{why}; deferred: the exploration budget "
                            f"({self.explore_budget:.0%} of wall time) is spent, serving "
                            f"{safe.label} until a sampled call finds it again")
            state.history.append(state.reason)
            return Decision(safe, state.reason, predicted_ms=predicted_ms)
        if len(explore) == 1:
            state.committed = explore[0]
            state.reason = why + f"; committed {explore[0].label} without exploring"
            return Decision(explore[0], state.reason, predicted_ms=predicted_ms)
        return Decision(explore[0], why, predicted_ms=predicted_ms, explore=explore)

    def stand_in(self, ctx: Context, candidates: Sequence[Candidate]
                 ) -> tuple[Candidate, str] | None:
        """What serves a new input class while :meth:`decide` runs off the calling thread
        (it ranks by the model and runs nothing): the library's candidate (what the plain
        program runs), else the fastest candidate of the nearest measured input within
        ``far_distance`` whose fastest fits this input (of the :data:`STAND_IN_NEAREST`
        nearest distinct ones; softmax on CuPy arrays has no library candidate; the
        shipped pack's inputs and this process's commits are the measured ones); None
        without either, or with one candidate (nothing to decide)."""
        if len(candidates) < 2:
            return None
        library = library_candidate(ctx.problem, candidates)
        if library is not None:
            return library, "what the plain program runs"
        if self.far_distance is None:
            return None
        features = ctx.op.features(ctx.problem)
        by_id = {(c.variant.name, c.config_items): c for c in candidates}
        for who, dist in self.neighbours.fastest_near(ctx.op.name, ctx.problem.dtype,
                                                      features, STAND_IN_NEAREST):
            if dist > self.far_distance:
                break
            pick = by_id.get(who)   # None: that input's fastest does not fit this one
            if pick is not None:
                return pick, f"the fastest on a near measured input, {dist:.2f} away"
        return None

    def _far(self, op: str, dtype: str, features: dict) -> float | None:
        """The distance to the nearest measured input of the same flags (``param_*``,
        ``is_2to4``) where it is beyond ``far_distance`` (the model extrapolates there),
        else None (also with nothing measured: the model then has nothing of this op to
        extrapolate from but its priors); ``inf`` with no input of these flags measured.
        Flags count apart: run S109's non-causal
        attention B=1 H=8 L=4096 had its causal twin 1.4 away and the nearest non-causal
        input 9.1, explored two candidates and committed flash2_mma BC=32 at 1.17x BC=64."""
        if self.far_distance is None:
            return None
        same = [n for n in features if n.startswith("param_") or n == "is_2to4"]
        dist = self.neighbours.nearest(op, dtype, features, same)
        if dist is None or dist <= self.far_distance:
            return None
        return dist

    def _cap(self, n: int) -> int:
        """Most candidates explored on a key with ``n`` candidates: ``max_explore``, for
        few candidates ``explore_fraction`` of them (at least :data:`EXPLORE_FLOOR` and
        ``min_explore``: a host op's 5 candidates are explored 4 at a time), and for many
        ``explore_share`` of them where that is more than ``max_explore``. On the H200
        corpus (10 folds by input) exploring 5 of attention's 12 prefill candidates, not 8,
        kept its committed/best at 1.000 and 100% within 5%, while a cap of 5 for every op
        cost softmax and spmm 8-15 points: a small candidate set is cheaply covered, and
        exhaustive autotune's 4 runs of each of 12 candidates are the tuning-runs bar's
        denominator (run S47: long-burst's attention keys took 25 samples each, 13.0% of
        autotune's runs in all against the 10% bar)."""
        if self.explore_fraction is None:
            cap = self.max_explore
        else:
            cap = min(self.max_explore, max(self.min_explore, EXPLORE_FLOOR,
                                            math.ceil(self.explore_fraction * n)))
        if self.explore_share is not None:
            cap = max(cap, min(n, math.ceil(self.explore_share * n)))
        return cap

    def _picks(self, ranked: Sequence[Candidate], variants_best: Sequence[Candidate] = (),
               cap: int | None = None, spread: bool = False) -> tuple[Candidate, ...]:
        """The first ``max_explore`` of ``ranked`` with at most ``per_variant`` per variant
        first; room left (few variants within reach) goes to the next of ``ranked`` in
        order, whatever their variant: the cap spreads the budget, it does not shrink it.

        ``variants_best``: the best-ranked candidate of each variant within the wider
        ``variant_reach``; those of variants with none in ``ranked`` take the place of the
        last of these picks, one slot each (the model's first pick always stays), and come
        right after the first pick, so anchors displace the other picks before them.
        ``spread``: see :meth:`_per_variant`."""
        cap = self.max_explore if cap is None else cap
        present = {c.variant.id for c in ranked}
        others = [c for c in variants_best if c.variant.id not in present]
        others = others[: min(self.variant_slots, max(0, cap - 1))]
        room = cap - len(others)
        out, rest = self._per_variant(ranked, room, spread)
        picks = (out + rest)[:room]
        return tuple(picks[:1] + others + picks[1:])

    def _per_variant(self, ranked: Sequence[Candidate], room: int, spread: bool = False
                     ) -> tuple[list, list]:
        """Up to ``room`` of ``ranked`` in order with at most ``per_variant`` of each
        variant, and, up to ``room`` too, the ones the cap passed over before the last.

        ``spread`` (the model extrapolating, :meth:`_far`): the best-ranked config of each
        variant first, then the next configs, those most unlike their variant's first
        before the others (:func:`_config_spread`), the picks in model order. Far from every
        measured input the model's order across variants is the least sure thing it has:
        in the shipped H200 pack's replay a decode B=32 H=32 Lk=80 D=128, 4.8 from the
        nearest measured input, was given two configs each of three variants and none of
        ``decode_global`` (the best: within reach, ranked after those second configs), and
        committed ``splitkv_mma`` at 1.98x it. Over four dealings of the pack's replay, exact
        timings, decodes 1.060 -> 1.027 committed/best, within 5% 72.1 -> 82.4%, worst
        1.98 -> 1.42x; softmax's worst 1.50 -> 1.20x; prefills unchanged."""
        if spread:
            ranked = _config_spread(ranked)
            firsts = _firsts(ranked)[:room]
            count = {c.variant.id: 1 for c in firsts}
            chosen, rest = set(firsts), []
            for c in ranked:
                if c in chosen:
                    continue
                if count.get(c.variant.id, 0) < self.per_variant and len(chosen) < room:
                    count[c.variant.id] += 1
                    chosen.add(c)
                elif len(rest) < room:
                    rest.append(c)
            return [c for c in ranked if c in chosen], rest
        count: dict[str, int] = {}
        out, rest = [], []
        for c in ranked:
            if count.get(c.variant.id, 0) < self.per_variant:
                count[c.variant.id] = count.get(c.variant.id, 0) + 1
                out.append(c)
                if len(out) == room:
                    break
            elif len(rest) < room:
                rest.append(c)
        return out, rest

    def _anchored(self, op, dtype, features, candidates, ranked, explore,
                  cap: int | None = None):
        """Explore also the fastest candidates of the ``neighbours_k`` nearest measured
        inputs and the baselines (cuBLAS, SDPA; on a 2:4 weight the dense matmul and
        cuSPARSELt: a committed choice can then not be slower than what the plain program
        runs), in place of the model's last picks; the model's best pick always stays."""
        if not self.anchors:
            return explore, ""
        anchors, notes = [], []
        by_id = {(c.variant.name, c.config_items): c for c in candidates}
        for who, dist in self.neighbours.fastest_near(op, dtype, features, self.neighbours_k):
            pick = by_id.get(who)
            if pick is not None and pick not in explore and pick not in anchors:
                anchors.append(pick)
                notes.append(f"{pick.label}, the fastest on a near measured input "
                             f"(distance {dist:.2f})")
                self.stats["neighbour_added"] += 1
        # the baselines (what the plain program runs: the manifest's ``baseline``; a 2:4
        # weight has two, the dense matmul and torch's cuSPARSELt path), each variant's
        # best-ranked config, else the best-ranked library candidate (cuBLAS, SDPA, a CuPy
        # composition): the model ranks a library call by its name alone and can be far
        # off (on the H200, run S7, a pruned weight's cuSPARSELt outranked the dense
        # matmul it loses to 2.5x at 16 tokens, and was committed unseen against it; runs
        # S99-S100, cuSPARSELt left unexplored at 2048 tokens, dense committed at 0.73x
        # its speed). Not one per library: spmm's cuBLAS-dense and cuSPARSE both ranked
        # near last took 2 of its 8 slots (on the H200 corpus, one: worst 1.17-1.79x ->
        # 1.15-1.47x); cuSPARSE is no baseline
        libraries = _firsts(c for c in ranked if c.variant.baseline) or [
            c for c in ranked if c.variant.language == "python"
            and c.variant.backend != "host"][:1]
        for library in libraries:
            if library not in explore and library not in anchors:
                anchors.append(library)
                notes.append(f"{library.label}, a library's")
        cap = self.max_explore if cap is None else cap
        room = max(0, cap - 1)
        anchors, notes = anchors[:room], notes[:room]
        if not anchors:
            return explore, ""
        # the anchors take the places of the model's last picks, but never of its first
        # nor of a baseline it picked itself (two baselines: one picked, one anchored)
        keep = list(explore)
        for i in range(len(keep) - 1, 0, -1):
            if len(keep) + len(anchors) <= cap:
                break
            if keep[i] not in libraries:
                del keep[i]
        return tuple(keep) + tuple(anchors), "; plus " + " and ".join(notes)

    def _first_fit(self) -> str:
        """Wait (at most :data:`FIRST_FIT_WAIT_S`) for the model's first fit of the rows it
        was given; a note for the miss's reason."""
        t0 = time.perf_counter()
        rows = self.model.base_size
        done = self.model.wait(FIRST_FIT_WAIT_S)
        s = time.perf_counter() - t0
        self.stats["first_fit_wait_s"] += s
        if not done:
            log.warning("the cost model's first fit of %d pack rows is still running after "
                        "%.0f s: this miss decides without it", rows, s)
            return f"the model's first fit of {rows} pack rows not done after {s:.0f} s; "
        if self.model.last_error:   # (logged by the fit)
            return f"the model's first fit of {rows} pack rows failed " \
                   f"({self.model.last_error}); "
        return f"waited {s:.2f} s for the model's first fit of {rows} pack rows; "

    # ---- feedback -----------------------------------------------------------------------
    def observe(self, key: tuple, candidate: Candidate, time_ms: float) -> Decision | None:
        state = self.keys.get(key)
        if state is None:
            return None
        with self._lock:
            if candidate in state.observed:
                state.observed[candidate].add(time_ms)
            if state.committed is None:
                return self._after_explore_sample(state, candidate, time_ms)
            if candidate != state.committed:
                return None
            self._learn(state, candidate, time_ms, refit=False)
            if state.deferred:
                return self._reopen(state)
            state.recent.append(time_ms)
            return self._check_drift(state)

    # ---- the exploration budget (callers hold the lock) -------------------------------------
    def _credit(self) -> float:
        """Seconds of exploring left now (inf: unbounded)."""
        if self.explore_budget is None or exploring_unbounded():
            return math.inf
        now = time.monotonic()
        self._credit_s = min(self.explore_burst_s, self._credit_s
                             + (now - self._credit_at) * self.explore_budget)
        self._credit_at = now
        return self._credit_s

    def _spend(self, time_ms: float) -> None:
        if math.isfinite(time_ms) and time_ms > 0:
            self.stats["explore_s"] += time_ms / 1e3
            if not exploring_unbounded():
                self._credit_s -= time_ms / 1e3

    def charge_exploration(self, seconds: float) -> None:
        """Preparing an explored candidate (a compile, a module load) is exploring too."""
        with self._lock:
            self._spend(seconds * 1e3)

    def _reopen(self, state: KeyState) -> Decision | None:
        """A deferred key's sampled call: explore it now if the budget allows."""
        if self._credit() <= 0:
            return None
        current = state.committed
        explore = (current,) + tuple(c for c in state.explore if c != current)
        explore = explore[: max(state.cap, 1)]
        state.deferred = False
        state.steady_ms = math.nan
        state.recent.clear()
        if len(explore) == 1:
            return None
        self.stats["reopened"] += 1
        state.reason = (f"exploring {len(explore)} candidates, deferred "
                        f"{'by a drift' if state.previous is not None else 'at the miss'}: the "
                        "exploration budget allows it again")
        state.committed, state.explore, state.rotation = None, explore, ()
        state.observed = {c: Samples() for c in explore}
        state.explorations += 1
        state.widened, state.refining = False, ()
        state.history.append(state.reason)
        return Decision(current, state.reason, explore=explore)

    def _after_explore_sample(self, state: KeyState, candidate, time_ms) -> Decision | None:
        if candidate not in state.observed:
            return None
        self.stats["explore_calls"] += 1
        state.explored[candidate] += 1
        self._spend(time_ms)
        self._learn(state, candidate, time_ms)
        raced = self._race(state)
        # the sample count is the commit criterion: every explored candidate timed
        # ``samples`` times (a failed one is done: it is never chosen, and so is one
        # left behind by the leader)
        active = tuple(c for c in state.explore if not state.observed[c].raced)
        needed = self._needed(state, active)
        rest = tuple(sorted((c for c in active
                             if len(state.observed[c]) < self._needed_for(state, c, needed)
                             and not state.observed[c].failed),
                            key=lambda c: -len(state.observed[c])))
        if rest:
            # the class's calls rotate over the candidates that still need samples: a call
            # of one that has its samples would be tuning spent on nothing. The decision's
            # candidate, the fastest so far, serves the call of one that fails
            if not raced and set(rest) == set(state.rotation or state.explore):
                return None
            state.rotation = rest
            ran = [c for c in active if len(state.observed[c]) and not state.observed[c].failed]
            anchor = min(ran, key=lambda c: state.observed[c].median()) if ran else rest[0]
            if raced:
                rules = ([f"fastest sample over {self.race_ratio:g}x the leader's median"]
                         if self.race_ratio is not None else []) + (
                    [f"or every sample of two or more over {1 + self.clear_margin:g}x the "
                     "leader's slowest"] if self.clear_margin is not None else [])
                state.reason = (f"exploring {len(active)} of {len(state.explore)}: "
                                + ", ".join(c.label for c in raced) + " left behind ("
                                + " ".join(rules).removeprefix("or ") + ")")
            return Decision(anchor, state.reason, explore=rest)   # (the commit's
            # history line names the candidates left behind)
        # each candidate's median: a first call may pay one-time costs (a sparse format
        # built lazily, a cold cache) and any call may meet interference
        fastest = {c: math.inf if state.observed[c].failed else state.observed[c].median()
                   for c in active}
        best = min(fastest, key=fastest.get)
        # the fastest baseline (a 2:4 weight has two: the plain program's better way)
        base = min((c for c in fastest if c.variant.baseline and math.isfinite(fastest[c])),
                   key=fastest.get, default=None)
        kept = ""
        if base is not None and best is not base and \
                fastest[best] > fastest[base] * (1 - self.baseline_margin):
            kept = (f"; kept the baseline {base.label} {fastest[base]:.4g} ms: "
                    f"{best.label} {fastest[best]:.4g} ms is not "
                    f"{self.baseline_margin:.0%} faster")
            best = base
        widened = self._widen(state, fastest, best) or self._refine(state, fastest, best)
        if widened is not None:
            return widened
        if math.isinf(fastest[best]):
            failed = ", ".join(c.label for c in state.explore)
            state.reason = f"every explored candidate failed ({failed})"
            state.rotation = ()
            state.explore = tuple(c for c in state.candidates if c not in fastest)[
                : state.cap]
            if not state.explore:
                raise RuntimeError(f"every candidate of {state.op} failed on this input")
            state.observed = {c: Samples() for c in state.explore}
            state.history.append(state.reason)
            return Decision(state.explore[0], state.reason, explore=state.explore)
        state.committed, state.expected_ms = best, fastest[best]
        state.steady_ms = math.nan
        self._schedule_revalidation(state, best)
        self.neighbours.add(state.op, state.dtype, state.features, best.variant.name,
                            best.config_items, fastest[best])
        state.recent.clear()
        others = sorted((t, c.label) for c, t in fastest.items() if c != best)
        runner = f"; next {others[0][1]} {others[0][0]:.4g} ms" if others else ""
        settled = ""
        if any(len(state.observed[c]) < self.samples for c in active) \
                and self._settled(state, active):
            self.stats["settled"] += 1
            settled = (f"; settled: no further sample could bring another median within "
                       f"{self.settle_margin:.0%} of the leader's")
        state.reason = (f"committed after timing {len(fastest)} candidates up to "
                        f"{self.samples}x on "
                        f"real calls (medians): {best.label} {fastest[best]:.4g} ms{runner}"
                        f"{kept}{settled}")
        state.history.append(state.reason + "; samples " + ", ".join(
            f"{c.label} n={len(state.observed[c])} median "
            f"{state.observed[c].median():.4g} min "
            f"{min(state.observed[c], default=math.inf):.4g}"
            + (" (left behind)" if state.observed[c].raced else "")
            for c in state.explore))
        self.stats["commits"] += 1
        return Decision(best, state.reason, observed_ms=tuple(
            (c.label, t) for c, t in fastest.items()), samples=tuple(
            (c.label, len(state.observed[c])) for c in state.explore), predicted_ms=tuple(
            (c.label, state.predicted_ms(c)) for c in state.explore if c in state.predicted))

    def _widen(self, state: KeyState, fastest: dict, best: Candidate) -> Decision | None:
        """Explore further when the measurements refute the model's ranking: once per
        exploration, up to the key's cap in all, the candidates left out whose predicted
        time, wrong by as little as the least wrong explored candidate's, would beat the
        measured best by ``widen_margin`` (None: never). They were left out because the
        model put them ``regret_bound`` behind the explored ones; a measured best several
        times its prediction takes that reason away. Run S47 (H200, pack of 168 cases):
        the pack measured SDPA on prefill shapes where the flash kernels cannot run
        (grouped heads), the model ranked SDPA alone within reach on B=1 H=8 L=2048, and
        from CuPy arrays SDPA took 0.217 ms against a never-explored flash kernel's
        0.058. On the H200 corpus (10 folds by input) it changes no op's replay: where
        8 candidates were explored there is no room left."""
        if self.widen_margin is None or state.widened or not state.predicted \
                or not math.isfinite(fastest[best]):
            return None
        errors = [fastest[c] / state.predicted_ms(c) for c in fastest
                  if math.isfinite(fastest[c]) and state.predicted_ms(c) > 0]
        if not errors:
            return None
        bias = min(errors)
        bar = fastest[best] / (1 + self.widen_margin)
        room = state.cap - len(state.explore)   # the key's cap bounds it
        left = [c for c in state.candidates
                if c not in state.observed and state.predicted_ms(c) * bias < bar]
        if not left or room < 1:
            return None
        extra, _ = self._per_variant(left, room)   # model order, per_variant of each
        state.widened = True
        active = tuple(c for c in state.explore if not state.observed[c].raced)
        return self._explore_more(
            state, best, active, tuple(extra),
            f"widened by {len(extra)} ({', '.join(c.label for c in extra)}): the best "
            f"measured {best.label} {fastest[best]:.4g} ms is "
            f"{fastest[best] / state.predicted_ms(best):.3g}x its prediction, and they are "
            f"predicted under {bar:.4g} ms at the least wrong explored candidate's error "
            f"({bias:.3g}x)")

    def _refine(self, state: KeyState, fastest: dict, best: Candidate) -> Decision | None:
        """Before a commit, time the next configs of the leader's variant: once per
        exploration, the op's ``refine_configs`` best-ranked unexplored configs of that
        variant predicted within ``regret_bound`` of the leader's prediction, and where the
        model extrapolated and its first pick lost, at least ``far_refine`` (those beyond
        the op's own count are the configs most unlike the leader). Where the first pick
        lost, the measurement refuted the model's order across variants, so its order among
        this variant's configs, which chose the ones explored, is the next thing to doubt.
        Where the first pick leads, its variant's configs are the model's near-ties (spmm's
        tile widths, warps and stages, which meet the weight's block structure its features
        see only as block densities), and the exploration spread over variants timed only
        some of them. Each is left behind (:meth:`_race`) as soon as one sample of it is
        slower than the leader's median: it is there to beat the leader, and one that
        cannot costs one call."""
        if state.refining or not state.predicted or not state.candidates \
                or best.variant.baseline or not math.isfinite(fastest[best]):
            return None
        own = self._refine_count(state.op)
        first = best == state.candidates[0]
        count = max(own, self.far_refine) if state.far and not first else own
        if not count:
            return None
        bar = state.predicted_ms(best) * (1 + self.regret_bound)
        left = [c for c in state.candidates if c.variant.id == best.variant.id
                and c not in state.observed and state.predicted_ms(c) <= bar]
        if not left:
            return None
        extra = left[:own]
        if count > own:   # the far refinement's: the model's order within the variant is
            # extrapolated too, so the configs most unlike the leader first
            leader = dict(best.config_items)
            extra += sorted(left[own:], key=lambda c: -_unlike(leader, c))
        extra = state.refining = tuple(extra[:count])
        pick = ("the model's first pick" if first else
                f"not the model's first pick ({state.candidates[0].label})")
        # the explored set keeps the candidates left behind: the key's cap, which a later
        # widening reads, counts every candidate this exploration timed
        return self._explore_more(
            state, best, state.explore, extra,
            f"refined by {len(extra)} ({', '.join(c.label for c in extra)}): the leader "
            f"{best.label} {fastest[best]:.4g} ms is {pick}, and its variant's next "
            f"configs are predicted within {self.regret_bound:.0%} of it")

    @staticmethod
    def _explore_more(state: KeyState, best: Candidate, kept: tuple, extra: tuple,
                      why: str) -> Decision:
        """Go on exploring ``kept`` and ``extra`` (a widening's or a refinement's newcomers)
        before the commit, noted in the key's history as ``why``. The calls rotate over the
        measured best (what a failing newcomer's call falls back to) and the newcomers; the
        others have their samples."""
        state.explore, state.rotation = kept + extra, ()
        for c in extra:
            state.observed[c] = Samples()
        state.reason = why
        state.history.append(why)
        return Decision(best, why, explore=(best, *extra))

    def _refine_count(self, op: str) -> int:
        """Configs a refinement adds on ``op``: ``refine_configs``, else the op's own
        (:attr:`adaptive.ops.base.Op.refine_configs`)."""
        if self.refine_configs is not None:
            return self.refine_configs
        from adaptive.ops import OPS
        known = OPS.get(op)
        return known.refine_configs if known is not None else 0

    def _race(self, state: KeyState) -> list:
        """Mark the explored candidates the leader has left behind (see ``race_ratio`` and
        ``clear_margin``); the ones newly marked."""
        if self.race_ratio is None and self.clear_margin is None:
            return []
        obs = state.observed
        timed = [c for c in state.explore
                 if len(obs[c]) >= 2 and not obs[c].failed and not obs[c].raced]
        if not timed:
            return []
        leader = obs[min(timed, key=lambda c: obs[c].median())]
        bar = math.inf if self.race_ratio is None else self.race_ratio * leader.median()
        # above the leader's slowest sample
        clear = math.inf if self.clear_margin is None else (1 + self.clear_margin) * max(leader)
        out = []
        for i, c in enumerate(state.explore):
            s = obs[c]
            if s.raced or s.failed or not len(s) or len(s) >= self.samples \
                    or (i == 0 and not c.variant.baseline):
                continue
            # the baseline (what the plain program runs; explored first where it is
            # explored) only on two samples both over BASELINE_RACE_FACTOR x the bar: one
            # may have met interference, and it is the candidate kept within
            # ``baseline_margin``
            if c.variant.baseline:
                if len(s) >= 2 and min(s) > BASELINE_RACE_FACTOR * bar:
                    s.raced = True
                    out.append(c)
                continue
            if min(s) > bar or (len(s) >= 2 and min(s) > clear) or (
                    c in state.refining and min(s) > leader.median()):
                s.raced = True
                out.append(c)
        return out

    def _needed(self, state: KeyState, active: tuple) -> int:
        """Samples each candidate still explored needs before the commit: ``samples``, or
        2 where ``clear_margin`` has left every other candidate behind (the leader's)."""
        if self.clear_margin is not None and len(active) == 1 and len(state.explore) > 1:
            return min(2, self.samples)
        if self._settled(state, active):
            return 0
        return self.samples

    def _settled(self, state: KeyState, active: tuple) -> bool:
        """Whether the commit is already decided to within ``settle_margin``: every active
        candidate timed at least twice, and the leader's median, however its remaining
        samples fall, at most ``1 + settle_margin`` times the least median any other
        candidate could still reach (:func:`_median_bounds`). With ``samples`` 3 a third
        sample can only move a median between the first two, so two that agree decide it."""
        if self.settle_margin is None or len(active) < 2:
            return False
        obs = state.observed
        if any(obs[c].failed or len(obs[c]) < 2 for c in active):
            return False

        def bounds(c):   # up to the samples it would get (more where they disagree)
            return _median_bounds(list(obs[c]), len(obs[c]),
                                  self._needed_for(state, c, self.samples))
        leader = min(active, key=lambda c: obs[c].median())
        high = bounds(leader)[1]
        return all(high <= (1 + self.settle_margin) * bounds(c)[0]
                   for c in active if c is not leader)

    def samples_wanted(self, key: tuple, candidate: Candidate) -> int | None:
        """More than ``samples`` for an explored candidate whose samples disagree
        (:meth:`_needed_for`), else None."""
        state = self.keys.get(key)
        if state is None or self.noise_ratio is None or state.committed is not None:
            return None
        with self._lock:
            if candidate not in state.observed:
                return None
            wanted = self._needed_for(state, candidate, self.samples)
        return wanted if wanted > self.samples else None

    def _needed_for(self, state: KeyState, c: Candidate, needed: int) -> int:
        """Samples ``c`` needs: ``needed``, and one more while its median is over
        ``noise_ratio`` times its fastest sample and that fastest sample is below every
        other candidate's median (more samples can only lower its median to its fastest:
        one slower than another's median cannot win), up to twice ``needed``."""
        obs = state.observed[c]
        n = len(obs)
        if self.noise_ratio is None or n < needed or n >= 2 * needed:
            return needed
        fastest = min(obs, default=math.inf)
        if not (0 < fastest and obs.median() > self.noise_ratio * fastest):
            return needed
        rival = min((o.median() for other, o in state.observed.items()
                     if other != c and len(o)), default=math.inf)
        return n + 1 if fastest < rival else needed

    def _check_drift(self, state: KeyState) -> Decision | None:
        if state.revalidate_in > 0:
            state.revalidate_in -= 1
            if state.revalidate_in == 0:
                return self._reexplore(state, f"re-validating {state.committed.label} "
                                       f"after {state.revalidate_interval} sampled calls "
                                       "(a re-exploration chose it over the earlier choice)",
                                       revalidating=True)
        if len(state.recent) < self.drift_window:
            return None
        now = _median(list(state.recent)[-self.drift_window:])
        if not state.steady_ms > 0:      # the first window after the commit: the baseline
            state.steady_ms = now
            return None
        ratio = now / state.steady_ms
        if 1 / self.drift_ratio <= ratio <= self.drift_ratio:
            return None
        self.stats["drifts"] += 1
        return self._reexplore(state, f"drift: {state.committed.label} now {now:.4g} ms, "
                               f"steady {state.steady_ms:.4g} ms", now_ms=now)

    def _reexplore(self, state: KeyState, why: str, now_ms: float = math.nan,
                   revalidating: bool = False) -> Decision | None:
        """Open exploration again on the key's explored set, the committed candidate first
        (a drift, or a re-validation of a drift's choice); deferred while the exploration
        budget is spent."""
        current = state.committed
        explore = (current,) + tuple(c for c in state.explore if c != current)
        if self._credit() <= 0:          # re-explore when the budget allows it again
            state.reason = why + "; re-exploring deferred (the exploration budget is spent)"
            state.deferred = True
            state.previous, state.revalidating = current, revalidating   # for the reopening
            state.steady_ms = math.nan
            state.recent.clear()
            state.history.append(state.reason)
            return None
        state.reason = f"{why}; re-exploring {len(explore)}"
        state.history.append(state.reason)
        state.steady_ms = math.nan
        if len(explore) == 1:
            state.expected_ms = now_ms if now_ms > 0 else state.expected_ms
            state.recent.clear()
            state.revalidate_in = 0
            return None
        state.committed, state.explore, state.rotation = None, explore, ()
        state.observed = {c: Samples() for c in explore}
        state.explorations += 1
        state.widened, state.refining = False, ()
        state.previous, state.revalidating = current, revalidating
        self.stats["revalidations"] += revalidating
        return Decision(current, state.reason, explore=explore)

    def _schedule_revalidation(self, state: KeyState, best: Candidate) -> None:
        """After a re-exploration's commit: re-validate in ``revalidate_every`` sampled
        calls when it changed the choice, in twice the last interval when a re-validation
        kept it (up to 16x: a load that lasted T is seen to leave within about T, or 16
        ``revalidate_every`` samples), never when a drift kept it."""
        previous, revalidating = state.previous, state.revalidating
        state.previous, state.revalidating = None, False
        if previous is None:             # the miss's exploration (or a deferred one's)
            return
        if best != previous:
            self.stats["drift_switches"] += 1
            state.revalidate_interval = self.revalidate_every
        elif revalidating:
            state.revalidate_interval = min(2 * state.revalidate_interval,
                                            16 * self.revalidate_every)
        else:
            state.revalidate_interval = 0
        state.revalidate_in = state.revalidate_interval

    def _learn(self, state: KeyState, candidate: Candidate, time_ms: float,
               refit: bool = True) -> None:
        """A measured time as a row of the model (``refit=False``: a steady sample of the
        committed candidate, kept for the next refit that exploring starts, never starting
        one itself: see :meth:`LiveModel.add`)."""
        if not (math.isfinite(time_ms) and time_ms > 0):
            return
        from adaptive.policy.features import candidate_rows
        from adaptive.policy.cost_model import input_key, target
        row = state.rows.get(candidate)
        if row is None:   # explored later than the miss (all first picks failed)
            row = state.rows[candidate] = candidate_rows(
                state.op, state.features, [candidate], state.scope, state.limits,
                state.device)[0]
        self.model.add([row], [target(time_ms, state.floor_ms)],
                       [input_key(state.op, state.features, state.dtype)], refit=refit)

    def add_observations(self, rows, weight: float = 1.0, geometry=None) -> None:
        """Measurements made elsewhere (a pack, a counter log): the model's base rows.
        ``geometry(row)`` gives a row's launch-geometry features on this device (the
        dispatcher passes it: it knows the variants and the device's limits)."""
        from adaptive.policy.cost_model import training_set
        from adaptive.space import as_config
        for r in rows:
            self.neighbours.add(r.op, r.dtype, r.features, r.variant, as_config(r.config),
                                r.time_ms)
        ts = training_set(rows, geometry=geometry)
        if len(ts):
            self.model.extend_base(ts, weight)

    # ---- introspection ------------------------------------------------------------------
    def state(self, key: tuple) -> KeyState | None:
        """What the policy knows about ``key`` (None before its first miss)."""
        return self.keys.get(key)

    @property
    def cost_model(self):
        """The cost model (regeneration proposes where it predicts gains)."""
        return self.model

    def note(self, key: tuple, text: str) -> None:
        state = self.keys.get(key)
        if state is not None:
            with self._lock:
                state.history.append(text)

    def forget_key(self, key: tuple) -> None:
        """Drop what the policy keeps of ``key`` (the dispatcher calls this when it evicts
        an input class's last plan, so ``keys`` is bounded by the plan cache). What the
        key taught the model and the neighbours stays."""
        with self._lock:
            self.keys.pop(key, None)

    def forget(self) -> None:
        with self._lock:
            self.keys.clear()


def library_candidate(problem, ranked: Sequence[Candidate]) -> Candidate | None:
    """The best-ranked candidate that runs what the plain program would: a baseline
    variant's (the manifest says which: cuBLAS, the dense matmul on a pruned weight, SDPA),
    else on torch tensors torch's own call (a torch entry, torch's matmul), else a
    library's (a CuPy composition); None on the host."""
    base = next((c for c in ranked if c.variant.baseline), None)
    if base is not None:
        return base
    if problem.kind == "torch":
        for c in ranked:
            if c.variant.torch_library or c.variant.torch_entry:
                return c
    return next((c for c in ranked if c.variant.language == "python"
                 and c.variant.backend != "host"), None)


def charged_mean(charge, candidates, mean, floor: float):
    """The model's ``mean`` (log of time over the floor) of each candidate with the host's
    issuing charged as the dispatcher charges its samples (``Context.charge``), and a note
    for a reason ("" where nothing was added): :meth:`Learned.decide` and
    :func:`adaptive.explain` both rank with this."""
    unit = floor if floor > 0 else 1.0
    device = np.exp(np.asarray(mean, float)) * unit
    total = np.asarray([charge(c, float(t)) for c, t in zip(candidates, device)])
    if not np.any(total > device):
        return mean, ""
    return np.log(total / unit), " (with the host's issuing, the device waiting)"


def model_order(mean) -> list[int]:
    """Candidate indices best-predicted first (stable: ties keep the candidates' order);
    :meth:`Learned.decide` and :func:`adaptive.explain` both rank with this."""
    return np.argsort(np.asarray(mean, dtype=float), kind="stable").tolist()


def _config_spread(ranked: Sequence[Candidate]) -> list[Candidate]:
    """``ranked`` with each variant's configs after its best-ranked one reordered: those
    differing from it in the most config values first, model order among equals. Each
    variant keeps its places in the list, so the order across variants is the model's.
    An extrapolating model's first pick within a variant sets the values it is least sure
    of; its next picks mostly vary one of them (softmax R=18607 C=31 in the shipped H200
    pack: three reg_warp configs explored, all G=32, the best G=8)."""
    by_variant: dict[str, list] = {}
    for c in ranked:
        by_variant.setdefault(c.variant.id, []).append(c)
    for cs in by_variant.values():
        first = dict(cs[0].config_items)
        cs[1:] = sorted(cs[1:], key=lambda c: -_unlike(first, c))
    turns = {v: iter(cs) for v, cs in by_variant.items()}
    return [next(turns[c.variant.id]) for c in ranked]


def _unlike(config: dict, c: Candidate) -> int:
    """How many of ``c``'s config values differ from ``config``'s."""
    return sum(config.get(k) != v for k, v in c.config_items)


def _firsts(ranked) -> list[Candidate]:
    """The first candidate of each variant in ``ranked`` (its best-ranked config), in order."""
    seen: set[str] = set()
    out = []
    for c in ranked:
        if c.variant.id not in seen:
            seen.add(c.variant.id)
            out.append(c)
    return out


def _median_bounds(times: list[float], count: int, total: int) -> tuple[float, float]:
    """The least and the most the median of ``total`` timings can be, ``count`` of them
    known (``times``, the kept ones) and the rest still to come: the rest all 0, or all
    inf, moves every order statistic as far as it can go (exact once all are known)."""
    known = [t for t in times if math.isfinite(t)]
    missing = max(0, total - count) if len(known) == count else 0
    if not known:
        return math.inf, math.inf
    return (statistics.median(known + [0.0] * missing),
            statistics.median(known + [math.inf] * missing))


def _median(times: list[float]) -> float:
    finite = [t for t in times if math.isfinite(t)]
    return statistics.median(finite) if finite else math.inf


def _diverse(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Candidates in an order that covers variants first, then each variant's config range.

    Within a variant: the middle config, then the extremes, then the rest; across
    variants: round robin, manifest order.
    """
    by_variant: dict[str, list[Candidate]] = {}
    for c in candidates:
        by_variant.setdefault(c.variant.id, []).append(c)
    queues = []
    for pool in by_variant.values():
        order = [len(pool) // 2, 0, len(pool) - 1] + list(range(len(pool)))
        seen, queue = set(), []
        for i in order:
            if i not in seen:
                seen.add(i)
                queue.append(pool[i])
        queues.append(queue)
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out
