"""``adaptive.explain``: for one input, the ranked candidates and why the choice was made."""

from __future__ import annotations

import dataclasses
import math
import statistics

from adaptive.ops import get_op
from adaptive.policy.base import Context


@dataclasses.dataclass(frozen=True)
class ExplainRow:
    """One candidate: the model's estimate, what was observed, and its part in the choice."""

    label: str
    predicted_ms: float = math.nan
    sigma: float = math.nan          # model uncertainty, log units (0.1 ≈ ±10 %)
    observed_ms: float = math.nan    # median of the timed calls (the kept ring of them)
    samples: int = 0
    status: str = ""                 # chosen | exploring | explored | ""


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The dispatcher's view of one input; ``str()`` gives a table."""

    op: str
    key: tuple
    input: str                       # dims, dtype and params, readable
    policy: str
    state: str                       # committed | exploring | deciding (off the calling
    #                                  thread, a stand-in serving) | undecided
    chosen: str
    reason: str
    floor_ms: float
    rows: tuple[ExplainRow, ...]
    history: tuple[str, ...] = ()    # the key's miss, commits and drifts, oldest first

    def __str__(self) -> str:
        def ms(x: float) -> str:
            return "-" if math.isnan(x) else f"{x:.4g}"
        lines = [f"{self.op} {self.input}: {self.state} (policy {self.policy})",
                 f"choice: {self.chosen or '-'}; {self.reason or 'no decision yet'}",
                 f"roofline floor: {ms(self.floor_ms)} ms"]
        head = f"{'candidate':<34} {'predicted ms':>12} {'± %':>6} {'observed ms':>11} " \
               f"{'n':>3}  status"
        lines += [head, "-" * len(head)]
        for r in self.rows:
            spread = "-" if math.isnan(r.sigma) else f"{100 * math.expm1(r.sigma):.0f}"
            lines.append(f"{r.label:<34.34} {ms(r.predicted_ms):>12} {spread:>6} "
                         f"{ms(r.observed_ms):>11} {r.samples:>3}  {r.status}")
        if self.history:
            lines += ["history:"] + [f"  {h}" for h in self.history]
        return "\n".join(lines)


def _no_measure(candidate, warmup: int = 0) -> float:
    raise RuntimeError("explain() launches nothing")


def explain(op: str, *args, dispatcher=None, **params) -> Explanation:
    """Show, for this input, the ranked candidates with predicted and observed times.

    Nothing is launched: an input not seen yet shows the model's ranking alone.

    Args:
        op: the op name, as for :func:`adaptive.launch`.
        *args, **params: the input, as for :func:`adaptive.launch`.
        dispatcher: whose decisions to show (default: the input's default dispatcher).

    Returns:
        An :class:`Explanation`; ``print()`` it for a table.

    Example:
        >>> print(adaptive.explain("softmax", x))
    """
    if dispatcher is None:
        from adaptive.runtime import default_dispatcher
        dispatcher = default_dispatcher(args)
    o = get_op(op)
    key = o.key(args, params)
    problem = o.problem(args, params)
    candidates = dispatcher.candidates(op, *args, **params)
    dispatcher.harvest()   # GPU timings finished since the last call reach the policy first
    plan = dispatcher.current_plan(key)
    decision = plan.decision if plan is not None else None
    policy = dispatcher.policy
    # the policy keeps its state per input class (keys differing only in token counts)
    state = policy.state(plan.class_key if plan is not None else key)
    ctx = Context(o, problem, key, _no_measure, dispatcher.backend.peaks,
                  dispatcher.backend.device_state, dispatcher.limits,
                  charge=dispatcher.miss_charge(problem))
    ranking = policy.rank(ctx, candidates) if state is None else None
    predicted: dict = {}
    observed: dict = {}
    order: dict = {}      # label -> the policy's rank (0: its best-predicted)
    floor = 0.0
    if state is not None:
        floor = state.floor_ms
        predicted = {c.label: (state.predicted_ms(c), sd) for c, (_, sd) in
                     state.predicted.items()}
        order = {c.label: n for n, c in enumerate(state.candidates)}
        # the median and the count of each explored candidate's timings (a ring of the
        # latest: the count is of all of them)
        observed = {c.label: (ts.median() if hasattr(ts, "median") else
                              statistics.median(ts), len(ts))
                    for c, ts in state.observed.items() if len(ts)}
    elif ranking is not None:
        # the rows and ranking decide() would make now (one feature builder, one order)
        from adaptive.policy.learned import charged_mean, model_order
        floor = ctx.floor_ms()
        _, dist, _, _, _ = ranking
        if dist is not None:
            mean = dist[0]
            if ctx.charge is not None:   # as decide() charges a waiting device's miss
                mean, _ = charged_mean(ctx.charge, candidates, mean, floor)
            scale = floor if floor > 0 else 1.0
            predicted = {candidates[i].label: (math.exp(mean[i]) * scale, dist[1][i])
                         for i in model_order(mean)}
            order = {candidates[i].label: n for n, i in enumerate(model_order(mean))}
    else:   # a policy without a model: the floor all the same
        floor = ctx.floor_ms()
    if decision is not None:
        counts = dict(decision.samples)
        for label, t in decision.observed_ms:
            observed.setdefault(label, (t, counts.get(label, 1)))
        for label, t in decision.predicted_ms:
            predicted.setdefault(label, (t, math.nan))
    chosen = decision.candidate.label if decision is not None else ""
    exploring = plan is not None and plan.provisional
    explore = {c.label for c in decision.explore} if decision is not None else set()
    rows = []
    for c in candidates:
        p_ms, sd = predicted.get(c.label, (math.nan, math.nan))
        seen_ms, n = observed.get(c.label, (math.nan, 0))
        status = ("exploring" if exploring and c.label in explore else
                  "chosen" if c.label == chosen else "explored" if n else "")
        rows.append(ExplainRow(c.label, p_ms, sd, seen_ms, n, status))
    # the policy's own order where it ranked (exactly as decide() did), then by time
    rows.sort(key=lambda r: (order.get(r.label, len(order)), math.isnan(r.predicted_ms),
                             r.predicted_ms, math.isnan(r.observed_ms), r.observed_ms))
    where = ("undecided" if plan is None else
             "deciding" if decision is not None and decision.pending else
             "exploring" if exploring else "committed")
    reason = state.reason if state is not None else (decision.reason if decision else "")
    shown = " ".join([", ".join(f"{k}={v}" for k, v in problem.dims), problem.dtype]
                     + [f"{k}={v}" for k, v in problem.params + problem.extra])
    history = tuple(state.history) if state is not None else ()
    return Explanation(op, key, shown, policy.name, where, chosen, reason, floor, tuple(rows),
                       history)
