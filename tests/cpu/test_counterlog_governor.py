"""The counter log's overhead governor, driven by an injected clock and CPU-time source
(no timed assertions): the sampling interval rises while the log's measured cost is over
its budget and falls back (never below the configured one) when under; every record
carries the interval it was taken at; CUPTI over the budget hands over to sampled timing
for good (CUPTI stops once its tagged calls have their kernels) without mis-joining a
call; governed CUPTI starts on sampled event pairs and enables CUPTI only where the launch
rate of its first window says it fits (a host-bound rate never loads it); bad budgets are
refused with what was expected and what was given."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from test_counterlog_cupti import (Clock, FakeCupti, _Refusing, attach, before_run,
                                   kernels_in_run)

from adaptive import config
from adaptive.counterlog import CounterLog, read_log, recorders
from adaptive.counterlog.cli import summary_text
from adaptive.counterlog.governor import (CUPTI_COST_S_PER_LAUNCH, CUPTI_FIT, MAX_EVERY,
                                          PLAIN_OVER, Governor)
from adaptive.dispatch import Dispatcher
from adaptive.policy import MeasureEach
from profilers import cupti as cupti_mod
from profilers.cupti import CuptiActivity, CuptiTimer
from profilers.events import EventTimer


class Cost:
    """The log's CPU time so far, as the test says it."""

    def __init__(self):
        self.s = 0.0

    def __call__(self):
        return self.s


@pytest.fixture
def host():
    d = Dispatcher("host", policy=MeasureEach())
    d.sample_every = 0
    return d


def opened(path, clock, cost, **options) -> CounterLog:
    """A log whose writer has done its first (start-up) round and then sleeps; the test
    drives ``_drain`` and ``_govern`` itself."""
    clog = CounterLog(path, flush_interval_s=60.0, nvml=False, clock=clock, cpu_time=cost,
                      **options).open()
    while not clog.governor.started:          # the writer's first round sets the start
        time.sleep(0.001)
    return clog


def test_the_interval_doubles_over_budget_halves_under_and_stays_in_bounds():
    g = Governor(0.02, every=16, period_s=0.25)
    g.start(0.0, 0.0)
    assert g.step(0.1, 0.1).every == 16                   # within the period: not judged
    assert g.step(0.3, 0.1).every == 32                   # 33 % of the period: over
    assert g.step(0.6, 0.1 + 0.3 * 0.03).every == 64      # 3 %: over
    assert g.step(0.9, 0.1 + 0.3 * 0.03 + 0.3 * 0.01).every == 64   # 1 %: within, held
    assert g.step(1.2, 0.112).every == 32                 # 0 % (< budget / 3): halves
    assert g.step(1.5, 0.112).every == 16
    assert g.step(1.8, 0.112).every == 16                 # never below the configured one
    assert (g.state.every_min, g.state.every_max) == (16, 64)
    now, cost = 1.8, 0.112
    for _ in range(40):                                   # far over budget for long
        now, cost = now + 0.3, cost + 0.3
        g.step(now, cost)
    assert g.state.every == MAX_EVERY
    assert g.state.cupti == "on"                          # no CUPTI asked about: untouched


def test_cupti_hands_over_once_after_its_first_window_and_never_comes_back():
    g = Governor(0.02, every=16, period_s=0.25, window_s=0.5)
    g.start(0.0, 0.0)
    # 3 %: over budget inside the window, not plainly (PLAIN_OVER budgets): kept
    assert g.step(0.3, 0.009, cupti=True).cupti == "on"
    state = g.step(0.6, 0.018, cupti=True)                # 3 % again, the window done
    assert state.cupti == "events" and state.handover_cost == pytest.approx(0.03)
    assert state.active_s == pytest.approx(0.6)
    for t in (0.9, 1.2, 60.0):                            # under budget: stays handed over
        assert g.step(t, 0.018, cupti=False).cupti == "events"
    assert g.state.active_fraction == pytest.approx(0.01)
    g.keep_cupti()                                        # the caller could not hand over
    assert g.state.cupti == "on" and g.step(61.0, 61.0, cupti=True).cupti == "on"


@pytest.mark.parametrize("cost, first", [(0.9 * PLAIN_OVER, "on"), (1.1 * PLAIN_OVER, "events")],
                         ids=["just_under_plain", "plainly_over"])
def test_cupti_plainly_over_budget_hands_over_at_the_first_period(cost, first):
    """A cost over PLAIN_OVER budgets needs no window: the probe is one period."""
    g = Governor(0.02, every=16, period_s=0.25, window_s=0.5)
    g.start(0.0, 0.0)
    assert g.step(0.1, 0.0, cupti=True).cupti == "on"     # within the period: not judged
    state = g.step(0.25, 0.25 * cost * 0.02, cupti=True)
    assert state.cupti == first and state.every == 32
    assert state.handover_cost == (pytest.approx(cost * 0.02) if first == "events" else 0.0)
    assert g.step(0.5, 0.5 * cost * 0.02, cupti=True).cupti == "events"   # window done
    never = Governor(0.02, every=16, period_s=0.25, window_s=0.5, plain_over=math.inf)
    never.start(0.0, 0.0)
    assert never.step(0.25, 0.25, cupti=True).cupti == "on"   # 100 %, inside the window


def test_records_carry_the_interval_they_were_taken_at(tmp_path, rng, host):
    clock, cost = Clock(), Cost()
    path = tmp_path / "gov.alog"
    clog = opened(path, clock, cost, sample_every=2, overhead_budget=0.02)
    clog.attach(host)
    rec = clog._recorders[host]
    x = rng.standard_normal((4, 8)).astype(np.float32)
    for _ in range(8):                                    # 4 logged at 1 in 2
        host.launch("softmax", x)
    clock.now += 0.3
    cost.s += 0.03                                        # 10 % of the period: over 2 %
    assert clog._govern().every == 4 and rec.every == 4
    for _ in range(8):                                    # 2 logged at 1 in 4
        host.launch("softmax", x)
    clock.now += 0.3
    cost.s += 0.03
    assert clog._govern().every == 8 and rec.every == 8
    for _ in range(8):                                    # 1 logged at 1 in 8
        host.launch("softmax", x)
    clock.now += 0.3                                      # no cost: back down
    assert clog._govern().every == 4 and rec.every == 4
    clock.now += 0.3
    assert clog._govern().every == 2
    clock.now += 0.3
    assert clog._govern().every == 2                      # the configured floor
    for _ in range(4):                                    # 2 logged at 1 in 2
        host.launch("softmax", x)
    stats = clog.close()
    assert stats.dropped == 0 and clog.last_error is None
    contents = read_log(path)
    assert [r["sample_every"] for r in contents.records] == [2] * 4 + [4] * 2 + [8] + [2] * 2
    # scaled by its interval, each record stands for the launches it was drawn from
    assert sum(r["sample_every"] for r in contents.records) == 8 + 8 + 8 + 4
    assert contents.headers[0]["overhead_budget"] == 0.02
    assert (contents.sample_every_min, contents.sample_every_max) == (2, 8)
    assert "one launch in 2 to 8 logged" in summary_text(contents).splitlines()[0]


def test_records_of_older_logs_carry_the_headers_rate():
    from adaptive.counterlog import format as fmt
    from adaptive.counterlog.reader import _batch
    batch = _batch("old.alog", 0, {"plans": [[0, {"op": "gemm"}]], "states": [],
                                   "rows": [[1, 0, 1.0, 0.5, "host", -1, 7]]}, every=16)
    assert next(batch.records())["sample_every"] == 16
    assert fmt.ROW_FIELDS[-1] == "sample_every" and len(fmt.ROW_FIELDS_V2) == 7


@pytest.fixture
def fake_cupti(monkeypatch):
    import sys
    import types
    current = types.SimpleNamespace(ptr=0x7700)
    cuda = types.SimpleNamespace(get_current_stream=lambda: current)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    cupti, clock = FakeCupti(), Clock()
    timer = CuptiTimer(64, activity=CuptiActivity(cupti=cupti), settle_s=0.5,
                       clock=clock).use_cupy_streams()
    assert timer.status == "ok"
    return cupti, timer, clock


def test_cupti_over_budget_hands_over_to_sampled_timing_without_mis_joining_a_call(
        tmp_path, rng, fake_cupti, host):
    cupti, timer, clock = fake_cupti
    cost = Cost()
    x = rng.standard_normal((4, 9)).astype(np.float32)
    # per call the kernels it issues (start, end ns): calls 0-2 tagged by CUPTI, then
    # calls timed by the fallback source (the host clock here: a host dispatcher)
    spans = [[(1000 * i, 1000 * i + 100 + i)] for i in range(12)]
    kernels_in_run(host, "softmax", (x,), cupti, list(spans))
    path = tmp_path / "handover.alog"
    clog = opened(path, clock, cost, sample_every=1, overhead_budget=0.02)
    clog._event_timer = lambda index: None                # no GPU: the host clock times
    rec = attach(clog, host, timer)
    clog.timings[0] = "cupti"
    for _ in range(3):                                    # calls 0-2: tagged
        host.launch("softmax", x)
    assert cupti.pushes == 3
    cupti.deliver(keep_last=1)                            # call 2's kernel still to come
    clog._drain()
    clock.now += 0.3
    cost.s += 0.009                                       # 3 %: over budget, not plainly
    assert clog._govern().cupti == "on"                   # CUPTI's first window: kept
    clock.now += 0.3
    cost.s += 0.3                                         # the log took all the time
    state = clog._govern()
    assert state.cupti == "events" and state.handover_cost == pytest.approx(1.0)
    assert clog._recorders[host] is not rec and clog.timings == {0: "host"}
    assert "over the 2.0% budget" in clog.handover
    assert rec not in host._recorders                     # the CUPTI recorder is gone
    assert clog._recorders[host].every == 4               # doubled while over budget
    for _ in range(8):                                    # calls 3-10: 2 host-timed
        host.launch("softmax", x)
    assert cupti.pushes == 3                              # nothing tagged any more
    clog._drain()
    assert timer.unsettled() == 1 and cupti.enabled       # call 2 waits: CUPTI still on
    clock.now += 0.05
    clog._govern()
    assert cupti.enabled and timer.recording
    cupti.deliver()
    clog._drain()
    assert timer.unsettled() == 0
    clock.now += 0.05
    clog._govern()                                        # settled: CUPTI stops
    assert not cupti.enabled and timer.activity.status == "paused"
    clog._drain()                                         # the pause let the last call out
    assert clog._live_timers() == []
    clock.now += 60.0
    assert clog._govern().cupti == "events"               # for good: no resume
    assert not cupti.enabled
    stats = clog.close()
    assert stats.written == 5 and stats.dropped == 0 and clog.last_error is None
    contents = read_log(path)
    by_timer = {}
    for r in contents.records:
        by_timer.setdefault(r["timer"], []).append(r["time_ms"])
    assert by_timer["cupti"] == pytest.approx([(s[0][1] - s[0][0]) / 1e6 for s in spans[:3]],
                                              rel=1e-12)
    assert len(by_timer["host"]) == 2
    assert sorted(r["sample_every"] for r in contents.records) == [1, 1, 1, 4, 4]
    assert contents.cupti_handover == clog.handover
    assert "then handed over" in summary_text(contents).splitlines()[0]


def test_a_tagged_call_whose_kernels_never_come_is_counted_lost_after_the_handover(
        tmp_path, rng, fake_cupti, host):
    cupti, timer, clock = fake_cupti
    cost = Cost()
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti, [[], [(5000, 5400)]])
    clog = opened(tmp_path / "lost.alog", clock, cost, sample_every=1)
    clog._event_timer = lambda index: None
    attach(clog, host, timer)
    host.launch("softmax", x)                             # its kernel never comes
    clog._drain()
    clock.now += 0.6
    cost.s += 0.6
    assert clog._govern().cupti == "events"
    clock.now += 0.05
    clog._drain()
    clog._govern()
    assert timer.unsettled() == 1 and cupti.enabled
    clock.now += 10.0                                     # past lost_after_s
    clog._drain()
    assert timer.dropped == 1 and timer.unsettled() == 0
    clog._govern()
    assert not cupti.enabled
    host.launch("softmax", x)                             # host-timed: its own time
    stats = clog.close()
    assert stats.written == 1 and stats.dropped == 1
    (record,) = read_log(tmp_path / "lost.alog").records
    assert record["timer"] == "host" and record["time_ms"] > 0
    assert "call 1 dropped: no kernel record came" in clog.last_error


@pytest.mark.parametrize("budget, error, words", [
    (0, ValueError, "got 0"), (1.5, ValueError, "got 1.5"), (-0.1, ValueError, "got -0.1"),
    (float("nan"), ValueError, "got nan"), ("2%", TypeError, "got str '2%'"),
    (True, TypeError, "got bool True")], ids=["zero", "over_one", "negative", "nan", "text",
                                             "bool"])
def test_a_bad_budget_is_refused_naming_what_was_expected_and_given(tmp_path, budget, error,
                                                                    words):
    with pytest.raises(error, match="overhead_budget must be") as info:
        CounterLog(tmp_path / "bad.alog", overhead_budget=budget)
    assert "(0, 1]" in str(info.value) and words in str(info.value)
    with config.override(counter_log_budget=budget), pytest.raises(error):
        CounterLog(tmp_path / "bad.alog")


def test_the_budget_comes_from_the_environment(monkeypatch):
    assert config.from_env({"ADAPTIVE_COUNTER_LOG_BUDGET": "0.05"}).counter_log_budget == 0.05
    with pytest.raises(ValueError, match="ADAPTIVE_COUNTER_LOG_BUDGET='lots': expected a number"):
        config.from_env({"ADAPTIVE_COUNTER_LOG_BUDGET": "lots"})


def test_the_cupti_callbacks_time_counts_as_the_logs_cost(tmp_path, rng, fake_cupti, host):
    cupti, timer, clock = fake_cupti
    cost = Cost()                                         # the writer itself: idle
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti, [[(0, 400)]])
    clog = opened(tmp_path / "callback.alog", clock, cost, sample_every=1)
    rec = attach(clog, host, timer)
    clog._event_timer = lambda index: None
    clock.now += 0.3
    timer.activity._callback_cpu_s += 0.001               # 0.3 %: within the budget
    assert clog._govern().cupti == "on" and clog._recorders[host] is rec
    clock.now += 0.3
    timer.activity._callback_cpu_s += 0.03                # 10 %: over it
    assert clog._govern().cupti == "events" and clog._recorders[host] is not rec
    host.launch("softmax", x)
    assert cupti.pushes == 0                              # nothing tagged after it
    clog.close()


# ---- the probe: governed CUPTI is enabled only where the launch rate says it fits ----------

# the rate at which CUPTI's estimated cost is the share of a 2 % budget it may take (~2976/s)
FIT_RATE = CUPTI_FIT * 0.02 / CUPTI_COST_S_PER_LAUNCH


@pytest.mark.parametrize("rate, decided", [
    (100_000, "declined"), (20_000, "declined"), (5_000, "declined"),
    (1.05 * FIT_RATE, "declined"), (0.95 * FIT_RATE, "on"), (200, "on")],
    ids=["host_bound", "gpu_bound_s23", "under_budget_over_half", "just_over", "just_under",
         "low"])
def test_the_probe_decides_from_the_first_windows_launch_rate(rate, decided):
    g = Governor(0.02, every=16, period_s=0.25, window_s=0.5, probe=True)
    assert g.state.cupti == "probe"
    g.start(0.0, 0.0, launches=1000)                      # counted before the start: not its
    assert g.step(0.25, 0.0, launches=1000 + rate * 0.25).cupti == "probe"   # in the window
    state = g.step(0.5, 0.0, launches=1000 + rate * 0.5)
    assert state.cupti == decided
    assert state.launch_rate_per_s == pytest.approx(rate)
    assert state.cupti_estimate == pytest.approx(rate * CUPTI_COST_S_PER_LAUNCH)
    assert g.step(60.0, 0.0, launches=1000).cupti == decided    # decided once, for good
    plain = Governor(0.02, every=16)                      # not probing: CUPTI "on" at once
    assert plain.state.cupti == "on"
    assert plain.step(0.5, 0.0, launches=10 ** 9).cupti == "on"


class FakeEvents:
    """CUDA events for an event ring on a host dispatcher: each record 0.125 ms after the
    last on the fake GPU clock, complete at once."""

    class Event:
        def __init__(self, owner):
            self.owner, self.at_ms, self.done = owner, 0.0, False

        def record(self):
            self.at_ms, self.done = self.owner.now_ms, True
            self.owner.now_ms += 0.125

    def __init__(self):
        self.now_ms = 0.0

    def ring(self, index):
        return EventTimer(8192, events=(lambda: self.Event(self), lambda s, e: e.at_ms - s.at_ms))


@pytest.fixture
def lazy_cupti(monkeypatch):
    """A fake CUPTI the log can only reach through its own path (``_cupti_timer`` ->
    ``CuptiTimer`` -> the shared activity): ``made`` counts the activities built (each one
    loads and enables CUPTI), ``cost`` is charged 0.2 s of CPU for loading it."""
    import sys
    import types
    current = types.SimpleNamespace(ptr=0x7700)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_current_stream=lambda: current)))
    fake, made, cost = FakeCupti(), [], Cost()

    def activity(cupti=None):
        made.append(1)
        cost.s += 0.2
        return CuptiActivity(cupti=fake)
    monkeypatch.setattr(cupti_mod, "_shared", None)
    monkeypatch.setattr(cupti_mod, "_shared_users", 0)
    monkeypatch.setattr(cupti_mod, "CuptiActivity", activity)
    return fake, made, cost


def attach_cuda(clog, d, events: FakeEvents):
    """What ``attach`` does for a cuda dispatcher (device 0), on the host dispatcher: its
    timer from the log's own ``_make_timer`` (event rings faked), then its recorder."""
    clog._event_timer = events.ring
    clog._timers[0] = clog._make_timer(0)
    rec = recorders.LogRecorder(clog, d, clog._timers[0])
    clog._apply(rec, clog.governor.state)
    clog._recorders[d] = rec
    d.add_recorder(rec)
    return rec


def issue_kernels_while_enabled(d, x, cupti):
    """The plan of softmax issues one fake kernel a call while CUPTI's activity is on."""
    calls = iter(range(1 << 30))

    def issue():
        i = next(calls)
        if cupti.enabled:
            cupti.launch("softmax_k0", 10_000 * i, 10_000 * i + 1000 + i)
    before_run(d, "softmax", (x,), issue)


def probe(clog, clock, host, x, launches: int) -> list[str]:
    """Two periods of ``launches`` launches each (0.3 s apart on the log's clock); the
    governor's CUPTI state after each."""
    states = []
    for _ in range(2):
        for _ in range(launches):
            host.launch("softmax", x)
        clog._drain()
        clock.now += 0.3
        states.append(clog._govern().cupti)
    return states


def test_a_host_bound_rate_never_loads_cupti_and_the_log_says_why(tmp_path, rng, lazy_cupti,
                                                                  host):
    fake, made, cost = lazy_cupti
    clock = Clock()
    x = rng.standard_normal((4, 8)).astype(np.float32)
    issue_kernels_while_enabled(host, x, fake)
    path = tmp_path / "declined.alog"
    clog = opened(path, clock, cost, sample_every=4, overhead_budget=0.02, timing="cupti")
    rec = attach_cuda(clog, host, FakeEvents())
    assert isinstance(rec, recorders.EventLogRecorder) and clog.timings == {0: "cuda_event"}
    # 6000 launches a period: 20,000 launches/s (S23's GPU-bound stream), an estimate of
    # 6.7 % of wall time against the 1 % CUPTI may take
    assert probe(clog, clock, host, x, 6000) == ["probe", "declined"]
    state = clog.governor.state
    assert state.launch_rate_per_s == pytest.approx(12_000 / 0.6)
    assert state.cupti_estimate == pytest.approx(12_000 / 0.6 * CUPTI_COST_S_PER_LAUNCH)
    assert "CUPTI not enabled: 20,000 launches/s" in clog.cupti_decision
    for _ in range(40):
        host.launch("softmax", x)
    clock.now += 60.0
    assert clog._govern().cupti == "declined"            # for good
    assert clog._recorders[host] is rec and clog.timings == {0: "cuda_event"}
    stats = clog.close()
    # CUPTI never loaded, never enabled, nothing tagged
    assert made == [] and fake.enabled == set() and fake.pushes == 0
    assert cupti_mod._shared is None
    assert stats.dropped == 0 and clog.last_error is None
    contents = read_log(path)
    assert {r["timer"] for r in contents.records} == {"cuda_event"}
    assert len(contents.records) == (12_000 + 40) // 4
    assert contents.cupti_state == "declined" and contents.cupti_handover is None
    assert contents.launch_rate_per_s == pytest.approx(20_000)
    assert contents.cupti_estimate == pytest.approx(state.cupti_estimate)
    assert contents.cupti_decision == clog.cupti_decision
    assert contents.headers[0]["cupti_probe"] == {"window_s": 0.5, "fit": CUPTI_FIT,
                                                  "cost_s_per_launch": CUPTI_COST_S_PER_LAUNCH}
    assert "CUPTI not enabled" in summary_text(contents).splitlines()[0]


def test_a_low_rate_switches_to_cupti_after_the_window_and_can_still_hand_over(
        tmp_path, rng, lazy_cupti, host):
    fake, made, cost = lazy_cupti
    clock = Clock()
    x = rng.standard_normal((4, 8)).astype(np.float32)
    issue_kernels_while_enabled(host, x, fake)
    path = tmp_path / "switched.alog"
    clog = opened(path, clock, cost, sample_every=1, overhead_budget=0.02, timing="cupti")
    ring = attach_cuda(clog, host, FakeEvents()).timer
    # 300 launches a period: 1000 launches/s, an estimate of 0.34 % of wall time
    assert probe(clog, clock, host, x, 300) == ["probe", "on"]
    assert made == [1] and fake.enabled == {5, 6, 10, 19}
    assert clog.governor.state.launch_rate_per_s == pytest.approx(1000)
    assert clog.cupti_decision.startswith("CUPTI enabled 0.6 s into the log: 1,000 launches/s")
    rec = clog._recorders[host]
    assert isinstance(rec, recorders.CuptiLogRecorder) and clog.timings == {0: "cupti"}
    assert host._recorders == (rec,)                      # the event recorder is gone
    assert [r.timer for r in clog._retired] == [ring]
    for _ in range(5):                                    # tagged, each with its kernel
        host.launch("softmax", x)
    assert fake.pushes == 5
    fake.deliver()
    clog._drain()
    clock.now += 0.3
    cost.s += 0.001                                       # 0.3 %: the 0.2 s CUPTI's loading
    assert clog._govern().cupti == "on"                   # took is not judged its cost
    clock.now += 0.3
    cost.s += 0.3                                         # then CUPTI over budget: handed over
    state = clog._govern()
    assert state.cupti == "events" and clog.timings == {0: "cuda_event"}
    assert isinstance(clog._recorders[host], recorders.EventLogRecorder)
    for _ in range(4):                                    # 2 logged: the interval doubled
        host.launch("softmax", x)
    assert fake.pushes == 5
    stats = clog.close()
    assert (stats.dropped, clog.last_error) == (0, None)
    contents = read_log(path)
    records = sorted(contents.records, key=lambda r: r["seq"])
    timers = [r["timer"] for r in sorted(records, key=lambda r: r["time_s"])]
    assert timers == ["cuda_event"] * 600 + ["cupti"] * 5 + ["cuda_event"] * 2
    cupti_ms = [r["time_ms"] for r in records if r["timer"] == "cupti"]
    assert cupti_ms == pytest.approx([(1000 + i) / 1e6 for i in range(600, 605)], rel=1e-12)
    assert contents.cupti_state == "events" and contents.cupti_handover == clog.handover
    assert contents.launch_rate_per_s == pytest.approx(1000)
    assert contents.cupti_decision == clog.cupti_decision
    head = summary_text(contents).splitlines()[0]
    assert "CUPTI enabled" in head and "then handed over" in head


def test_cupti_that_fits_but_refuses_leaves_event_pairs_and_says_why(tmp_path, rng,
                                                                     monkeypatch, host):
    monkeypatch.setattr(cupti_mod, "_shared", None)
    monkeypatch.setattr(cupti_mod, "_shared_users", 0)
    monkeypatch.setattr(cupti_mod, "CuptiActivity",
                        lambda cupti=None: CuptiActivity(cupti=_Refusing()))
    clock, cost = Clock(), Cost()
    x = rng.standard_normal((4, 8)).astype(np.float32)
    host.launch("softmax", x)
    clog = opened(tmp_path / "refused.alog", clock, cost, sample_every=1, timing="cupti")
    rec = attach_cuda(clog, host, FakeEvents())
    assert probe(clog, clock, host, x, 30) == ["probe", "unavailable"]
    assert clog._recorders[host] is rec and clog.timings == {0: "cuda_event"}
    assert "could not be enabled" in clog.cupti_decision
    assert "MULTIPLE_SUBSCRIBERS" in clog.cupti_decision
    host.launch("softmax", x)
    clog.close()
    contents = read_log(tmp_path / "refused.alog")
    assert contents.cupti_state == "unavailable"
    assert {r["timer"] for r in contents.records} == {"cuda_event"}
    assert len(contents.records) == 61


def test_an_ungoverned_cupti_log_enables_cupti_at_once(tmp_path, lazy_cupti):
    """cupti_raw, the reference: no probe, CUPTI on the first attach."""
    fake, made, _ = lazy_cupti
    clog = CounterLog(tmp_path / "raw.alog", timing="cupti", govern=False, nvml=False)
    timer = clog._make_timer(0)
    assert timer.kind == "cupti" and made == [1] and fake.enabled == {5, 6, 10, 19}
    assert clog.governor.state.cupti == "on"
    timer.close()
