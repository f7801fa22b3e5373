"""The counter log's overhead governor, driven by an injected clock and CPU-time source
(no timed assertions): the sampling interval rises while the log's measured cost is over
its budget and falls back (never below the configured one) when under; every record
carries the interval it was taken at; CUPTI is duty-cycled (tagging stops, the activity
pauses once the tagged calls have their kernels, resumes later) without mis-joining a
call; bad budgets are refused with what was expected and what was given."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_counterlog_cupti import Clock, FakeCupti, attach, kernels_in_run

from adaptive import config
from adaptive.counterlog import CounterLog, read_log, recorders
from adaptive.counterlog.cli import summary_text
from adaptive.counterlog.governor import MAX_EVERY, Governor
from adaptive.dispatch import Dispatcher
from adaptive.policy import MeasureEach
from profilers.cupti import CuptiActivity, CuptiTimer


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


def test_cupti_is_duty_cycled_and_no_call_is_joined_to_anothers_kernels(tmp_path, rng,
                                                                        fake_cupti, host):
    cupti, timer, clock = fake_cupti
    cost = Cost()
    x = rng.standard_normal((4, 9)).astype(np.float32)
    # per call the kernels it issues (start, end ns): tagged calls 0-2, then untagged
    # ones while CUPTI drains and is paused, then tagged ones after it resumes
    spans = [[(1000 * i, 1000 * i + 100 + i)] for i in range(12)]
    kernels_in_run(host, "softmax", (x,), cupti, list(spans))
    path = tmp_path / "duty.alog"
    clog = opened(path, clock, cost, sample_every=1, overhead_budget=0.02)
    rec = attach(clog, host, timer)
    assert rec.every == 1
    for _ in range(3):                                    # calls 0-2: tagged
        host.launch("softmax", x)
    assert cupti.pushes == 3
    cupti.deliver(keep_last=1)                            # call 2's kernel still to come
    clog._drain()
    clock.now += 0.3
    cost.s += 0.3                                         # the log took all the time
    state = clog._govern()
    assert state.cupti == "draining" and rec.every == recorders.UNTAGGED
    host.launch("softmax", x)                             # call 3: not tagged
    assert cupti.pushes == 3
    clog._drain()
    assert timer.unsettled() == 1                         # call 2 waits for its kernel
    clock.now += 0.05
    assert clog._govern().cupti == "draining" and cupti.enabled   # not paused under it
    cupti.deliver()
    clog._drain()
    assert timer.unsettled() == 0
    clock.now += 0.05
    state = clog._govern()
    assert state.cupti == "off" and timer.activity.status == "paused" and not cupti.enabled
    assert 0 < state.cupti_share < 0.1 and state.cupti_pauses == 1   # 0.8 of 2 % of ~100 %
    clog._drain()                                         # the pause let the last call out
    assert clog.stats.written == 3 and timer.pending == 0
    for _ in range(2):                                    # calls 4-5: paused, not tagged
        host.launch("softmax", x)
    assert cupti.pushes == 3
    clock.now += 0.05
    assert clog._govern().cupti == "off"                  # the off time has not passed
    clock.now += 60.0                                     # past the longest off time
    state = clog._govern()
    assert state.cupti == "on" and timer.activity.status == "ok" and rec.every == 1
    assert 0 < state.active_fraction < 0.05
    cupti.pending.clear()                                 # records of no id (paused)
    for _ in range(2):                                    # calls 6-7: tagged again
        host.launch("softmax", x)
    assert cupti.pushes == 5
    cupti.deliver()
    clog._drain()
    clock.now += 1.0
    clog._drain()
    stats = clog.close()
    assert stats.written == 5 and stats.dropped == 0 and clog.last_error is None
    contents = read_log(path)
    expected = [(s[0][1] - s[0][0]) / 1e6 for s in spans[:3] + spans[6:8]]
    assert [r["time_ms"] for r in contents.records] == pytest.approx(expected, rel=1e-12)
    assert {r["sample_every"] for r in contents.records} == {1}
    assert contents.cupti_active is not None and contents.cupti_active < 0.05
    assert "CUPTI recording" in summary_text(contents).splitlines()[0]


def test_a_tagged_call_whose_kernels_never_come_is_counted_lost_before_the_pause(
        tmp_path, rng, fake_cupti, host):
    cupti, timer, clock = fake_cupti
    cost = Cost()
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti, [[], [(5000, 5400)]])
    clog = opened(tmp_path / "lost.alog", clock, cost, sample_every=1)
    attach(clog, host, timer)
    host.launch("softmax", x)                             # its kernel never comes
    clog._drain()
    clock.now += 0.3
    cost.s += 0.3
    assert clog._govern().cupti == "draining"
    clock.now += 0.05
    clog._drain()
    assert clog._govern().cupti == "draining" and timer.unsettled() == 1
    clock.now += 10.0                                     # past lost_after_s
    clog._drain()
    assert timer.dropped == 1 and timer.unsettled() == 0
    assert clog._govern().cupti == "off"
    clock.now += 60.0
    assert clog._govern().cupti == "on"
    host.launch("softmax", x)                             # tagged: its own kernel only
    cupti.deliver()
    clog._drain()
    clock.now += 1.0
    clog._drain()
    stats = clog.close()
    assert stats.written == 1 and stats.dropped == 1
    (record,) = read_log(tmp_path / "lost.alog").records
    assert record["time_ms"] == pytest.approx(0.0004)


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
    clock.now += 0.3
    timer.activity.callback_cpu_s += 0.001                # 0.3 %: within the budget
    assert clog._govern().cupti == "on" and rec.every == 1
    clock.now += 0.3
    timer.activity.callback_cpu_s += 0.03                 # 10 %: over it
    assert clog._govern().cupti == "draining" and rec.every == recorders.UNTAGGED
    host.launch("softmax", x)
    assert cupti.pushes == 0                              # nothing tagged while draining
    clog.close()
