"""``measure()``: warm-up untimed, a sync inside every host-clock sample, failures as inf,
the budget, interleaving, timers; on a fake clock (nothing here depends on real speed)."""

from __future__ import annotations

import math
import statistics
import types

import numpy as np
import pytest

from adaptive import timing
from adaptive.observation import Measurement
from adaptive.timing import CudaEvents, measure, measure_each


class Clock:
    """Stands in for the ``time`` module inside adaptive.timing; ``log`` records calls."""

    def __init__(self):
        self.ns, self.log = 0, []

    def perf_counter_ns(self) -> int:
        return self.ns

    def perf_counter(self) -> float:
        return self.ns / 1e9

    def work(self, name: str, ms: float) -> None:
        self.log.append(name)
        self.ns += round(ms * 1e6)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(timing, "time", c)
    return c


def _costs(clock, name, costs_ms):
    """A run whose i-th call takes costs_ms[i] on the clock."""
    it = iter(costs_ms)
    return lambda: clock.work(name, next(it))


def test_warmup_is_untimed_and_each_sample_includes_its_sync(clock):
    run = _costs(clock, "run", [50.0, 40.0, 1.5, 2.5, 3.5])   # two slow first-touch runs
    m = measure(run, warmup=2, reps=3, sync=lambda: clock.work("sync", 0.25))
    assert m.samples_ms == pytest.approx((1.75, 2.75, 3.75))   # run + the sync after it
    assert m.warmup == 2 and not m.error and not m.l2_flushed
    assert clock.log == ["run", "sync"] * 5                    # a sync after every run
    assert m.median_ms == pytest.approx(2.75) and m.min_ms == pytest.approx(1.75)


def test_without_sync_the_host_clock_times_the_run_alone(clock):
    m = measure(_costs(clock, "run", [7.0, 0.5, 0.75]), warmup=1, reps=2)
    assert m.samples_ms == pytest.approx((0.5, 0.75)) and clock.log == ["run"] * 3


def test_a_failure_is_an_inf_sample_with_its_reason_and_ends_the_measurement(clock):
    calls = []

    def run():
        calls.append(1)
        clock.work("run", 1.0)
        if len(calls) == 4:
            raise RuntimeError("illegal memory access")
    m = measure(run, warmup=1, reps=6)
    assert m.samples_ms[:2] == pytest.approx((1.0, 1.0)) and m.samples_ms[2] == math.inf
    assert len(m.samples_ms) == 3 and len(calls) == 4           # nothing ran after it
    assert m.error == "RuntimeError: illegal memory access"
    assert m.median_ms == pytest.approx(1.0) and m.min_ms == pytest.approx(1.0)


def test_a_failed_warmup_is_one_inf_sample(clock):
    def run():
        raise ValueError("wrong result")
    m = measure(run, warmup=3, reps=5)
    assert m.samples_ms == (math.inf,) and m.error == "ValueError: wrong result"
    assert m.median_ms == math.inf and m.min_ms == math.inf


def test_raise_errors_gives_the_exception_to_the_caller(clock):
    def run():
        raise KeyError("out")
    with pytest.raises(KeyError, match="out"):
        measure(run, reps=2, raise_errors=True)


def test_the_budget_stops_after_the_sample_that_ends_past_it(clock):
    # warm-up 0.4 s, then samples ending at 0.8 s and 1.2 s: the second is past 1.0 s
    m = measure(lambda: clock.work("run", 400.0), warmup=1, reps=50, budget_s=1.0)
    assert len(m.samples_ms) == 2 and clock.log == ["run"] * 3
    # a warm-up longer than the budget still leaves one sample
    m = measure(lambda: clock.work("run", 400.0), warmup=5, reps=50, budget_s=0.1)
    assert len(m.samples_ms) == 1


def test_a_timer_times_the_timed_runs_and_sync_follows_only_the_warmup(clock):
    seen = []

    def timer(run):
        run()
        seen.append(len(clock.log))
        return 0.125 * len(seen)
    m = measure(lambda: clock.work("run", 9.0), warmup=2, reps=3, timer=timer,
                sync=lambda: clock.work("sync", 0.0))
    assert m.samples_ms == (0.125, 0.25, 0.375)
    assert clock.log == ["run", "sync", "run", "sync", "run", "run", "run"]


def test_flush_runs_before_every_run_and_outside_the_sample(clock):
    m = measure(lambda: clock.work("run", 1.0), warmup=1, reps=2,
                flush=lambda: clock.work("flush", 100.0))
    assert m.samples_ms == pytest.approx((1.0, 1.0)) and m.l2_flushed
    assert clock.log == ["flush", "run"] * 3


def test_measure_each_interleaves_rounds_and_drops_a_failed_run(clock):
    def failing():
        clock.work("b", 1.0)
        if clock.log.count("b") == 2:
            raise RuntimeError("launch failed")
    a, b = measure_each([lambda: clock.work("a", 2.0), failing], warmup=1, reps=3)
    assert clock.log == ["a", "b", "a", "b", "a", "a"]   # b failed in round 2, then left out
    assert a.samples_ms == pytest.approx((2.0, 2.0, 2.0)) and not a.error
    assert b.samples_ms == (math.inf,) and b.error == "RuntimeError: launch failed"


def test_measure_each_checks_the_budget_after_whole_rounds(clock):
    runs = [lambda: clock.work("a", 300.0), lambda: clock.work("b", 300.0)]
    ms = measure_each(runs, reps=9, budget_s=1.0)   # rounds end at 0.6 s and 1.2 s
    assert [len(m.samples_ms) for m in ms] == [2, 2]


@pytest.mark.parametrize("kwargs, message", [
    ({"reps": 0}, "reps must be an int >= 1"),
    ({"warmup": -1}, "warmup must be an int >= 0"),
    ({"reps": 2.0}, "reps must be an int >= 1"),
    ({"budget_s": 0.0}, "budget_s must be > 0"),
], ids=["no-reps", "negative-warmup", "float-reps", "zero-budget"])
def test_bad_settings_are_refused_with_what_was_given(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        measure(lambda: None, **kwargs)
    assert repr(next(iter(kwargs.values()))) in str(info.value)


def test_a_run_that_is_not_callable_is_refused():
    with pytest.raises(TypeError, match="callables to time"):
        measure(3.5)


def test_median_min_and_spread_against_numpy_with_failures_left_out():
    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 8, 13):
        xs = rng.lognormal(0.0, 1.0, n)
        m = Measurement(tuple(xs) + (math.inf,))
        assert m.median_ms == pytest.approx(float(np.median(xs)))
        assert m.min_ms == pytest.approx(float(xs.min()))
        if n >= 4:
            q1, _, q3 = statistics.quantiles(xs, n=4)
            assert m.spread_ms == pytest.approx(q3 - q1)
        else:
            assert m.spread_ms == 0.0


class FakeCupy:
    """CuPy's events and arrays as far as the timers use them: every call is logged, and
    event pair i reports elapsed_ms[i]."""

    def __init__(self, elapsed_ms=(0.0625,)):
        self.log, self.elapsed = [], iter(elapsed_ms)
        log = self.log
        names = iter(["start", "stop"] * 100)

        class Event:
            def __init__(self):
                self.name = next(names)

            def record(self, stream=None):
                log.append(f"record {self.name}" if stream is None or stream.ptr == 0 else
                           f"record {self.name} on {stream.ptr:#x}")

            def synchronize(self):
                log.append(f"wait {self.name}")

        class Buffer:
            def fill(self, value):
                log.append("flush")

        def get_elapsed_time(start, stop):
            assert (start.name, stop.name) == ("start", "stop")
            return next(self.elapsed)
        def stream(ptr):
            return types.SimpleNamespace(ptr=ptr)
        self.cuda = types.SimpleNamespace(Event=Event, get_elapsed_time=get_elapsed_time,
                                          get_current_stream=lambda: stream(0),
                                          ExternalStream=stream)
        self.empty = lambda n, dtype: Buffer()


def test_cuda_events_bracket_the_run_and_wait_for_the_stop_event():
    cp = FakeCupy()
    assert CudaEvents(cp)(lambda: cp.log.append("run")) == 0.0625
    assert cp.log == ["record start", "run", "record stop", "wait stop"]


def test_gated_cuda_events_queue_the_pair_and_the_run_behind_the_gate():
    """The gate goes on the run's stream before the start event and is released after the
    stop event is issued (also when the run raises), so the pair times the run's kernels
    back to back, not the host's issuing of them."""
    cp = FakeCupy((0.25, 0.5))

    def gate(stream_ptr, limit_us):
        cp.log.append(f"gate {stream_ptr:#x} {limit_us:g}")
        return lambda: cp.log.append("release")
    timer = CudaEvents(cp, gate=gate, limit_us=1500, stream_ptr=0xBEEF)
    assert timer(lambda: cp.log.append("run")) == 0.25
    assert cp.log == ["gate 0xbeef 1500", "record start on 0xbeef", "run",
                      "record stop on 0xbeef", "release", "wait stop"]
    cp.log.clear()

    def broken():
        raise RuntimeError("bad launch")
    with pytest.raises(RuntimeError, match="bad launch"):
        timer(broken)
    assert cp.log == ["gate 0xbeef 1500", "record start on 0xbeef", "release"]


def test_the_dispatchers_measurement_uses_the_backends_device_timer_on_the_plans_stream():
    """Where the backend has a device timer (CUDA), a miss-path measurement is the run's
    device time on the stream the plan runs on, as the exploring samples are: a library
    call's host overhead is not charged to it (the pack rows and MeasureEach had charged
    SDPA 0.1-0.4 ms at decode where its kernels take 10-40 us)."""
    from adaptive.backends.host import HostBackend
    from adaptive.dispatch import Dispatcher
    from adaptive.ops import OPS
    seen = []

    class TimedHost(HostBackend):
        def stream_ptr(self, kind):
            return 0x5EED

        def device_timer(self, stream_ptr):
            def timer(run):
                seen.append(stream_ptr)
                run()
                return 0.125
            return timer

    x = np.random.default_rng(6).standard_normal((17, 33)).astype(np.float32)
    d = Dispatcher(TimedHost())
    op = OPS["softmax"]
    cand = d.candidates("softmax", x)[0]
    assert d._measure(op, op.problem((x,), {}), op.key((x,), {}), (x,), cand, warmup=1) \
        == 0.125
    assert seen == [0x5EED]


def test_the_benchmarks_timer_flushes_before_each_run_and_reports_the_event_times():
    from benchmarks.timing import Timer
    samples = [0.5, 0.25, 2.0, 0.75, 1.0]
    cp = FakeCupy(samples)
    out = Timer(cp, 50 << 20).time_ms(lambda: cp.log.append("run"), warmup=2, reps=5)
    assert cp.log[:4] == ["flush", "run", "flush", "run"]          # warm-up: not timed
    assert cp.log[4:] == ["flush", "record start", "run", "record stop", "wait stop"] * 5
    # spread: p90 - p10 of the five sorted samples (1.0 - 0.25)
    assert out == {"median_ms": 0.75, "min_ms": 0.25, "spread_ms": 0.75, "reps": 5}

def test_the_dispatchers_measurement_is_warmup_then_one_synchronised_sample(clock, caplog):
    from adaptive.backends.host import HostBackend
    from adaptive.dispatch import Dispatcher
    from adaptive.ops import OPS

    class ClockedHost(HostBackend):   # each run costs 1 ms, each synchronise 0.5 ms
        def prepare(self, candidate, problem, op):
            fn = super().prepare(candidate, problem, op)

            def run(args, out):
                clock.work("run", 1.0)
                if candidate.label == broken:
                    raise RuntimeError("bad launch")
                return fn(args, out)
            return run

        def synchronize(self):
            clock.work("sync", 0.5)

    x = np.random.default_rng(5).standard_normal((33, 65)).astype(np.float32)
    d = Dispatcher(ClockedHost())
    op = OPS["softmax"]
    problem, key = op.problem((x,), {}), op.key((x,), {})
    good, bad = d.candidates("softmax", x)[:2]
    broken = bad.label
    assert d._measure(op, problem, key, (x,), good, warmup=2) == pytest.approx(1.5)
    assert clock.log == ["run", "sync"] * 3
    clock.log.clear()
    assert d._measure(op, problem, key, (x,), bad, warmup=2) == math.inf
    assert clock.log == ["run"]                        # the failed warm-up ended it
    assert f"candidate {bad.label} failed" in caplog.text and "bad launch" in caplog.text


@pytest.mark.parametrize("kwargs", [{"reps": 0}, {"timing_s": 0.0}], ids=["no-reps", "no-time"])
def test_the_verifier_refuses_timing_settings_that_time_nothing(kwargs):
    from adaptive.regen import Verifier
    with pytest.raises(ValueError, match="times at least one run") as info:
        Verifier(**kwargs)
    assert f"{next(iter(kwargs))}={next(iter(kwargs.values()))}" in str(info.value)
