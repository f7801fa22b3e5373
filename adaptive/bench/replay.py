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

from adaptive.limits import for_fingerprint as _limits
from adaptive.observation import Observation
from adaptive.ops.base import DTYPE_BYTES


@dataclasses.dataclass(frozen=True)
class Case:
    """One held-out input: how the policy did on it, and how the model ranked it."""

    op: str
    dtype: str
    dims: dict
    candidates: int
    explored: int
    committed: str
    best: str
    ratio: float            # committed time / best time (1.0: the best)
    top1_ratio: float = math.nan   # the model's first pick / best time
    top3_ratio: float = math.nan   # the best of the model's first three / best time
    samples: int = 0        # timed exploring calls before the commit (the live loop's
    # ``explored`` count, which gpu_selection sets against autotune's 4 runs a candidate)


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    pack: str
    variant: str            # which policy set-up (with or without anchors)
    cases: tuple[Case, ...]
    folds: int = 0          # inputs split into this many folds (0: one input held out at a time)
    fold_seed: int = 0      # the seed that dealt them (fold_of)

    def _of(self, op: str | None) -> list[Case]:
        return [c for c in self.cases if op is None or c.op == op]

    def geomean_ratio(self, op: str | None = None) -> float:
        r = [c.ratio for c in self._of(op)]
        return math.exp(statistics.fmean(math.log(x) for x in r)) if r else math.nan

    def within(self, bound: float = 1.05, op: str | None = None) -> float:
        cases = self._of(op)
        return sum(c.ratio <= bound for c in cases) / max(1, len(cases))

    def worst(self, op: str | None = None) -> float:
        return max((c.ratio for c in self._of(op)), default=math.nan)

    def top1_within(self, bound: float = 1.05, op: str | None = None) -> float:
        """Share of inputs whose best-predicted candidate is within ``bound`` of the best."""
        cases = [c for c in self._of(op) if math.isfinite(c.top1_ratio)]
        return sum(c.top1_ratio <= bound for c in cases) / max(1, len(cases))

    def tuning_share(self, op: str | None = None) -> float:
        """Timed exploring calls over exhaustive autotune's runs (a warm-up and 3 timed
        runs of every candidate), summed over the inputs: the selection benchmark's
        "tuning runs"."""
        cases = self._of(op)
        return sum(c.samples for c in cases) / max(1, sum(4 * c.candidates for c in cases))

    def top3_within(self, bound: float = 1.02, op: str | None = None) -> float:
        """Share of inputs where the best of the model's first three is within ``bound``."""
        cases = [c for c in self._of(op) if math.isfinite(c.top3_ratio)]
        return sum(c.top3_ratio <= bound for c in cases) / max(1, len(cases))

    def op_lines(self) -> list[str]:
        """One line per op: the policy's result and the model's accuracy beside it."""
        out = []
        for op in sorted({c.op for c in self.cases}):
            cases = self._of(op)
            out.append(f"  {op:<10} {len(cases):>3} inputs: committed/best geomean "
                       f"{self.geomean_ratio(op):.3f}, within 5% {self.within(op=op):.0%}, "
                       f"worst {self.worst(op):.2f}x, explored "
                       f"{statistics.fmean(c.explored for c in cases):.1f}; model top-1 "
                       f"within 5% {self.top1_within(op=op):.0%}, best of top-3 within 2% "
                       f"{self.top3_within(op=op):.0%}")
        return out

    def __str__(self) -> str:
        explored = statistics.fmean(c.explored for c in self.cases) if self.cases else 0
        worst = max(self.cases, key=lambda c: c.ratio, default=None)
        held = f"{self.folds} folds by input" if self.folds else "one input held out at a time"
        if self.folds and self.fold_seed:
            held += f", dealt with seed {self.fold_seed}"
        text = (f"{self.variant}: committed/best geomean {self.geomean_ratio():.3f}; within 5% "
                f"on {self.within():.0%} of {len(self.cases)} inputs ({held}); "
                f"{explored:.1f} candidates explored per input")
        if worst is not None:
            text += (f"; worst {worst.ratio:.2f}x on {worst.op} {worst.dtype} {worst.dims} "
                     f"({worst.committed} vs {worst.best})")
        return "\n".join([text] + self.op_lines())


def _group(rows: Sequence[Observation]) -> dict[tuple, list[Observation]]:
    from adaptive.policy.cost_model import input_key
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
    kind = "cupy"      # a pack's rows are measured on CuPy arrays

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
        self.resources = None     # the variants' own resource tables (as in a pack)
        self.charge = None        # a pack's rows are device times: no issuing charged

    def floor_ms(self) -> float:
        return self._floor_ms

    def device(self) -> dict:
        return {}


def _as_registered(v):
    """A pack's variant with the registered one's ``baseline`` (packs written before the
    field did not carry it): the replay decides as a live dispatcher would."""
    import dataclasses
    from adaptive.errors import UnknownNameError
    from adaptive.variants import shared_registry
    try:
        known = shared_registry().get(v.op, v.name)
    except UnknownNameError:
        return v
    return dataclasses.replace(v, baseline=known.baseline) if known.baseline != v.baseline \
        else v


def fold_of(keys: Sequence[tuple], folds: int, seed: int = 0) -> dict[tuple, int]:
    """Each input's fold: a seeded shuffle of the inputs dealt round robin (0: each its own)."""
    order = sorted(keys)
    if folds <= 0 or folds >= len(order):
        return {k: i for i, k in enumerate(order)}
    import random
    random.Random(seed).shuffle(order)
    return {k: i % folds for i, k in enumerate(order)}


def replay(pack_path: str, anchors: bool = True, ops: Sequence[str] | None = None,
           progress: Callable[[int, int], None] | None = None, folds: int = 10,
           noise: tuple[float, float] | None = None, **policy_args) -> ReplayReport:
    """Held-out replay of :class:`~adaptive.policy.learned.Learned` on a pack's rows; see
    :func:`replay_setups` (this is one set-up of it)."""
    return replay_setups(pack_path, (anchors,), ops, progress, folds, noise=noise,
                         **policy_args)[0]


def replay_setups(pack_path: str, setups: Sequence[bool] = (False, True),
                  ops: Sequence[str] | None = None,
                  progress: Callable[[int, int], None] | None = None, folds: int = 10,
                  held_inputs: int | None = None, noise: tuple[float, float] | None = None,
                  fold_seed: int = 0, **policy_args) -> list[ReplayReport]:
    """Replay the learned policy on a pack's rows, held out by input, for each set-up
    (``True``: with anchors; ``False``: the model's picks only).

    The held inputs are dealt into ``folds`` folds (0: one input per fold, a fit per
    input); for each fold one model is fitted on every row of the other inputs and shared
    by every set-up and every input of the fold, so a whole op replays in seconds. An input
    never trains the model that decides it; the rows of an input are never split.
    ``held_inputs``: hold out only this many inputs (a seeded draw; a quick check), the
    rest always train. ``fold_seed``: how the inputs are dealt into the folds
    (:func:`fold_of`); another seed deals them otherwise, and the spread over seeds is
    how much a figure owes to the dealing.

    ``noise``: ``(sigma, outliers)``: each explored sample is the pack's time times a
    log-normal factor of ``sigma``, and with probability ``outliers`` times a further 1.5-3x
    (a call that met interference), seeded per input; None: every sample is the pack's
    time. The commit is still priced at the pack's time.
    """
    from adaptive.policy.learned import Learned
    from adaptive.policy.cost_model import LiveModel, training_set
    from adaptive.policy.features import row_geometry
    from adaptive.packs.format import read_pack
    from adaptive.variants import make_candidate
    pack = read_pack(pack_path)
    limits = _limits(pack.fingerprint)
    variants = {(v.op, v.name): _as_registered(v) for v in pack.variants}
    rows = [r for r in pack.rows if (r.op, r.variant) in variants]
    groups = _group(rows)
    held = [k for k in groups if ops is None or k[0] in ops]
    if held_inputs is not None:
        import random
        held = sorted(held)
        random.Random(1).shuffle(held)
        held = held[:held_inputs]
    fold = fold_of(held, folds, fold_seed)
    ts = training_set(rows, geometry=lambda r: row_geometry(variants[(r.op, r.variant)], r,
                                                             limits))
    cases: dict[bool, list[Case]] = {s: [] for s in setups}
    done = 0
    for f in sorted(set(fold.values())):
        mine = {k for k in held if fold[k] == f}
        fitted = fitted_without(ts, groups, mine)
        if fitted is None:
            continue
        model, near = fitted
        for key in sorted(mine):
            done += 1
            measured = [r for r in groups[key] if math.isfinite(r.time_ms) and r.time_ms > 0]
            if len(measured) >= 2:
                for setup in setups:
                    cases[setup].append(_one(key, measured, model, near.copy(), setup,
                                             variants, limits, Learned, LiveModel,
                                             make_candidate, policy_args, noise))
            if progress is not None:
                progress(done, len(held))
    names = {True: "learned", False: "learned, model picks only (no anchors)"}
    n_folds = 0 if len(set(fold.values())) == len(held) else folds
    return [ReplayReport(str(pack_path), names[s], tuple(cases[s]), n_folds, fold_seed)
            for s in setups]


def fitted_without(ts, groups: dict, held: set):
    """The model fitted on the rows of ``ts`` whose input is not in ``held``, and the
    neighbours of those inputs (``groups``: rows by input, :func:`_group`'s keys): what
    decides the held inputs, none of their rows in it; None with under two rows left."""
    from adaptive.policy.cost_model import CostModel
    from adaptive.policy.learned import Neighbours
    from adaptive.space import as_config
    train = ts.subset([i for i, g in enumerate(ts.groups) if g not in held])
    if len(train) < 2:
        return None
    model = CostModel().fit(train.rows, train.y, groups=train.groups)
    near = Neighbours()
    for k, g in groups.items():
        if k not in held:
            for r in g:
                near.add(r.op, r.dtype, r.features, r.variant, as_config(r.config), r.time_ms)
    return model, near


def _one(key, measured, model, near, anchors, variants, limits, Learned, LiveModel,
         make_candidate, policy_args, noise=None) -> Case:
    """Decide one held-out input as on a miss, feed the explored candidates their measured
    times (with ``noise``, see :func:`replay_setups`) as real calls would, and price the
    commit."""
    live = LiveModel(background=False, refit_every=1 << 30)
    live.model = model            # fitted on the other folds; live rows never refit it
    # times here are a pack's, not spent now: the wall-clock exploration budget is off
    policy = Learned(live, anchors=anchors, **{"explore_budget": None, **policy_args})
    policy.neighbours = near
    first = measured[0]
    times = {make_candidate(variants[(r.op, r.variant)], r.config): r.time_ms
             for r in measured}
    cands = list(times)
    decision = policy.decide(_Context(first, key, limits), cands)
    chosen, explored = decision.candidate, 1
    rotation, timed, samples = decision.explore, set(), 0
    sample = _sampler(times, noise, key)
    # the calls rotate over the explored candidates as a class's do, and follow each new
    # rotation the policy hands back (one left behind, a widened exploration) to the commit
    for _ in range(policy.samples * 4 * policy.max_explore):
        if not rotation:
            break
        for c in rotation:
            timed.add(c)
            samples += 1
            later = policy.observe(key, c, sample(c))
            if later is not None:
                chosen, rotation = later.candidate, later.explore
                break
    explored = max(explored, len(timed))
    best = min(times.values())
    top1 = top3 = math.nan
    state = policy.state(key)
    if state is not None and state.predicted:
        ranked = [c for c in state.candidates if c in state.predicted]
        top1 = times[ranked[0]] / best
        top3 = min(times[c] for c in ranked[:3]) / best
    best_c = min(times, key=times.get)
    return Case(first.op, first.dtype, dict(first.dims), len(cands), explored, chosen.label,
                best_c.label, times[chosen] / best, top1, top3, samples)


def _sampler(times: dict, noise: tuple[float, float] | None, key: tuple):
    """candidate -> one sample of its time: the pack's, or with ``noise`` (see
    :func:`replay_setups`), seeded by the input."""
    if noise is None:
        return times.__getitem__
    import zlib
    import numpy as np
    sigma, outliers = noise
    rng = np.random.default_rng(zlib.crc32(repr(key).encode()))

    def sample(c):
        t = times[c] * float(np.exp(rng.normal(0.0, sigma)))
        return t * float(rng.uniform(1.5, 3.0)) if rng.random() < outliers else t
    return sample
