"""The counter log's overhead governor: keeps the log's own cost under a budget.

In a host-bound process the log's cost is the CPU time its threads take from the serving
thread (the GIL): the writer building and packing records, and with CUPTI the buffer
callback copying every activity record (one kernel and one API record for every kernel
launched while activity is on, tagged or not). The writer measures that time (its own
``thread_time`` plus the CUPTI callback's) over each ``period_s`` as a fraction of wall
time and hands it to :meth:`Governor.step`:

* sampled recorders (host, event pairs): the interval ``every`` doubles while the
  fraction is over ``budget`` and halves (never below the configured one) while it is
  under ``budget / 3``, up to :data:`MAX_EVERY`; every record carries the interval in
  effect when it was taken, so counts can be scaled back;
* CUPTI: its cost grows with every kernel launched, logged or not, so no interval can
  bound it. The state turns "events" for the rest of the log at the first judged period
  whose cost is over ``budget`` once CUPTI has recorded ``window_s``, or more than
  ``plain_over`` (:data:`PLAIN_OVER`) times ``budget`` in any period, the first included:
  a cost plainly over needs no second period to tell (on the H200 every handover came
  at the second period, 0.5-0.6 s in, at 2-7 times the 2 % budget, run S23; the writer's
  own start-up adds about 0.1 % of wall time to the first period). The writer times
  calls by sampled event pairs from then on (their interval governed as above) and
  detaches CUPTI from the process once every call it tagged has its kernels (attached
  but idle, CUPTI still cost every launch: ``CuptiActivity.detach``). The handover is
  one-way: pausing and resuming CUPTI's activity (a duty cycle) cost the H200 more than
  it saved (run R2 in docs/benchmarks.md: 67 % throughput on a GPU-bound stream). The
  fraction of the log's time CUPTI recorded is :attr:`GovernorState.active_fraction`.

In the governed CUPTI mode CUPTI is not enabled at the log's open: enabled once, it costs
the process's launches for good, detached or not (run S23: a host-bound stream ran at
61,333 launches/s after CUPTI had been enabled and detached, 101,290/s before). The log
starts as the events mode (state "probe") and counts the launches its records stand for
(each scaled by its interval); at the first judged period once ``window_s`` has passed,
the launch rate times :data:`CUPTI_COST_S_PER_LAUNCH` estimates CUPTI's share of wall
time. Under :data:`CUPTI_FIT` of the budget the state turns "on" (the writer switches to
CUPTI timing from then on, and the handover above still applies); otherwise "declined":
event pairs for the rest of the log, CUPTI never loaded. The rate and the estimate stay in
the state (:attr:`GovernorState.launch_rate_per_s`, :attr:`GovernorState.cupti_estimate`).

The governor holds no clock: the writer passes ``now``, the cost and the launches so far
(tests pass their own numbers).
"""

from __future__ import annotations

import dataclasses
import math

MAX_EVERY = 65536            # the largest interval the governor raises ``every`` to
PLAIN_OVER = 2.0             # CUPTI's cost over this many budgets hands over at once
BUDGET_RANGE = (0.0, 1.0)    # a budget is a fraction of wall time in (0, 1]
# CUPTI's cost to the process per launch while its activity is on, the log ungoverned
# (cupti_raw, run S23 on the H200, against the same phase's log-off rounds): +1.44 us a
# launch on the GPU-bound stream, +3.36 us on the host-bound one; the larger is taken, so
# an estimate errs towards keeping CUPTI off
CUPTI_COST_S_PER_LAUNCH = 3.36e-6
CUPTI_FIT = 0.5              # CUPTI is enabled only where its estimate is under this x budget
# "probe": event pairs while the launch rate is measured (CUPTI not loaded); "on": CUPTI
# times calls (also every log that does not probe); "events": handed over from CUPTI for
# good; "declined": the probe's estimate did not fit, event pairs for the whole log;
# "unavailable": it fitted but CUPTI could not be enabled (the writer says why)
CUPTI_STATES = ("probe", "on", "events", "declined", "unavailable")


def check_budget(budget) -> float:
    """``budget`` as a float in (0, 1], or a ValueError/TypeError naming what was given."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"overhead_budget must be a number (a fraction of wall time in "
                        f"(0, 1], e.g. 0.02), got {type(budget).__name__} {budget!r}")
    if not math.isfinite(budget) or not BUDGET_RANGE[0] < budget <= BUDGET_RANGE[1]:
        raise ValueError(f"overhead_budget must be a fraction of wall time in (0, 1] (0.02: "
                         f"the log may take 2 % of the serving thread's time), got {budget!r}")
    return float(budget)


@dataclasses.dataclass
class GovernorState:
    """What the governor settled on (the log writes it into every frame)."""

    every: int                   # the interval of sampled (host, event) recorders now
    cost_fraction: float = 0.0   # the last period's measured cost / wall time
    cupti: str = "on"            # one of CUPTI_STATES
    handover_cost: float = 0.0   # the cost fraction that made CUPTI hand over (0: none)
    active_s: float = 0.0        # time CUPTI recorded (since the log opened)
    elapsed_s: float = 0.0       # time governed (since the log opened)
    every_min: int = 0           # the range of intervals used so far
    every_max: int = 0
    launch_rate_per_s: float = 0.0   # the probe's measured launch rate (0: no probe yet)
    cupti_estimate: float = 0.0      # its estimate of CUPTI's cost, a fraction of wall time

    @property
    def active_fraction(self) -> float:
        """The fraction of the log's time CUPTI timed calls so far (1 before any)."""
        return self.active_s / self.elapsed_s if self.elapsed_s > 0 else 1.0


class Governor:
    """Raises and lowers the sampling interval, decides whether CUPTI fits, and hands CUPTI
    over to sampled event pairs, to meet ``budget``.

    Args:
        budget: the log's cost as a fraction of wall time (0.02: 2 %).
        every: the configured interval (the floor of the raised one).
        period_s: how often the cost is judged.
        window_s: how long CUPTI records before a cost over ``budget`` makes it hand over;
            with ``probe``, also how long the launch rate is measured before deciding.
        plain_over: a CUPTI cost over this many budgets makes it hand over in any period,
            the first included (``math.inf``: only after ``window_s``).
        max_every: the ceiling of the raised interval.
        probe: start in state "probe" (the governed CUPTI mode): decide from the launch
            rate whether CUPTI may be enabled at all.
        cost_s_per_launch: CUPTI's estimated cost per launch (the probe's rule).
        fit: the share of ``budget`` the estimate must stay under.

    Example:
        >>> g = Governor(0.02, every=16)
        >>> g.start(now=0.0, cost_s=0.0)
        >>> g.step(now=0.5, cost_s=0.05).every      # 10 % of 0.5 s: over budget
        32
        >>> p = Governor(0.02, every=16, probe=True)
        >>> p.start(now=0.0, cost_s=0.0)
        >>> p.step(now=0.5, cost_s=0.0, launches=50_000).cupti   # 1e5/s x 3.36 us: 34 %
        'declined'
    """

    def __init__(self, budget: float, every: int, period_s: float = 0.25,
                 window_s: float = 0.5, plain_over: float = PLAIN_OVER,
                 max_every: int = MAX_EVERY, probe: bool = False,
                 cost_s_per_launch: float = CUPTI_COST_S_PER_LAUNCH, fit: float = CUPTI_FIT):
        self.budget = check_budget(budget)
        self.base_every, self.max_every = every, max(max_every, every)
        self.period_s, self.window_s, self.plain_over = period_s, window_s, plain_over
        self.cost_s_per_launch, self.fit, self.probe = cost_s_per_launch, fit, probe
        self.state = GovernorState(every, every_min=every, every_max=every,
                                   cupti="probe" if probe else "on")
        self._t0 = self._since = math.nan       # the log's start; the period's start
        self._cost0 = 0.0                       # cost at the period's start
        self._launches0 = 0                     # launches counted at the log's start
        self._last = math.nan

    @property
    def started(self) -> bool:
        """Whether :meth:`step` (or :meth:`start`) has set the first period's start."""
        return not math.isnan(self._t0)

    def start(self, now: float, cost_s: float, launches: int = 0) -> None:
        self._t0 = self._since = self._last = now
        self._cost0 = cost_s
        self._launches0 = launches

    def restart_period(self, now: float, cost_s: float) -> None:
        """Judge the next period from ``now``: what the caller spent switching to CUPTI (its
        loading, on the writer's thread) is not CUPTI's recording cost."""
        self._since, self._cost0 = now, cost_s

    def keep_cupti(self) -> None:
        """Undo a handover the caller could not make: CUPTI stays, never handed over."""
        self.state.cupti, self.state.handover_cost = "on", 0.0
        self.window_s = self.plain_over = math.inf

    def cupti_unavailable(self) -> None:
        """The probe's "on" could not be applied (CUPTI refused): event pairs stay."""
        self.state.cupti = "unavailable"

    def step(self, now: float, cost_s: float, cupti: bool = False,
             launches: int = 0) -> GovernorState:
        """Judge the cost up to ``now`` (``cost_s``: the log's CPU time so far; ``cupti``:
        the log times launches with CUPTI, which may hand over; ``launches``: the launches
        the log has seen so far, for the probe). Returns the state; the caller applies
        ``every``, CUPTI once a probe turns "on", and the handover once it is "events"."""
        s = self.state
        if math.isnan(self._t0):
            self.start(now, cost_s, launches)
            return s
        if cupti and s.cupti == "on":
            s.active_s += now - self._last
        s.elapsed_s = now - self._t0
        self._last = now
        if now - self._since < self.period_s:
            return s
        fraction = (cost_s - self._cost0) / (now - self._since)
        self._since, self._cost0 = now, cost_s
        s.cost_fraction = fraction
        if s.cupti == "probe" and now - self._t0 >= self.window_s:
            s.launch_rate_per_s = (launches - self._launches0) / (now - self._t0)
            s.cupti_estimate = s.launch_rate_per_s * self.cost_s_per_launch
            s.cupti = "on" if s.cupti_estimate < self.fit * self.budget else "declined"
        if fraction > self.budget:
            s.every = min(s.every * 2, self.max_every)
            if cupti and s.cupti == "on" and (s.active_s >= self.window_s or
                                              fraction > self.plain_over * self.budget):
                s.cupti, s.handover_cost = "events", fraction
        elif fraction < self.budget / 3:
            s.every = max(s.every // 2, self.base_every)
        s.every_min, s.every_max = min(s.every_min, s.every), max(s.every_max, s.every)
        return s
