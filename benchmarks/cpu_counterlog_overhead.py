"""Caller-side cost of a logged launch, without a GPU: logged against unlogged, side by side.

    python benchmarks/cpu_counterlog_overhead.py                   # the tree on sys.path
    PYTHONPATH=/tmp/old python benchmarks/cpu_counterlog_overhead.py   # an older tree, same
                                                                   # command: before/after

The cuda recorder runs on a host dispatcher with a stand-in ``cupy`` module (installed
only when CuPy is not importable): its CUDA runtime calls (``eventRecord``,
``eventQuery``, ``eventElapsedTime``, ``get_current_stream``) are C builtins of the same
arity that return at once, and ``cupy.cuda.Event`` is a Python class shaped like CuPy's
(``record()`` a Python method over the runtime call, ``done`` a property). So the numbers
are the Python-level work around the CUDA calls, not the driver's own cost (about
0.1-0.5 us per event record on a real GPU, the same before and after).

Rows (median over alternating rounds, and the best round's difference, steadier on a
shared machine; microseconds per launch):
- ``cuda recorder``: the event recorder around a no-op plan, against the plan alone; then
  the same recorder logging one call in ``ADAPTIVE_COUNTER_LOG_EVERY`` (the default).
- ``cupti recorder``: the CUPTI recorder (external correlation id pushed and popped around
  the call, one tuple queued) on a stand-in ``cupti`` module whose push and pop are C
  builtins of the same arity, so the row is the Python-level work around them; then the
  same logging one call in ``ADAPTIVE_COUNTER_LOG_EVERY``.
- ``cuda launch``: a full ``Dispatcher.launch`` of a tiny softmax, logged (event
  recorder) against unlogged.
- ``host launch``: the same with the host recorder (perf-counter pair).
- ``writer us``: the writer thread's work per record (harvest, build, snapshot, pack,
  write), measured by draining a round's records synchronously. On a host-bound stream
  it shares the GIL with the caller, so it adds to the caller's cost.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import operator
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np


def install_fake_cupy() -> bool:
    """Put a stand-in ``cupy`` in ``sys.modules`` (False: the real one is importable)."""
    try:
        import cupy  # noqa: F401
        return False
    except ImportError:
        pass
    handles = itertools.count(1)
    runtime = types.SimpleNamespace(
        eventDefault=0, eventBlockingSync=1, eventDisableTiming=2, eventInterprocess=4,
        eventCreateWithFlags=lambda flags: next(handles),
        eventRecord=operator.add,                        # (event, stream) -> at once
        eventQuery=functools.partial(operator.mul, 0),   # 0: cudaSuccess, done
        eventElapsedTime=operator.truediv,               # (start, end) -> a float
        eventDestroy=abs, CUDARuntimeError=type("CUDARuntimeError", (RuntimeError,), {}))
    stream = types.SimpleNamespace(ptr=0)
    current_stream_ptr = itertools.repeat(0).__next__   # CuPy's C-level getter

    class Event:                                         # CuPy's Python-level shape
        def __init__(self, block=False, disable_timing=False, interprocess=False):
            self.ptr = runtime.eventCreateWithFlags(0)

        @property
        def done(self):
            return runtime.eventQuery(self.ptr) == 0

        def record(self, stream=None):
            stream_ptr = current_stream_ptr() if stream is None else stream.ptr
            runtime.eventRecord(self.ptr, stream_ptr)

    def get_elapsed_time(start, end):
        return runtime.eventElapsedTime(start.ptr, end.ptr)

    cuda = types.SimpleNamespace(runtime=runtime, Event=Event,
                                 get_elapsed_time=get_elapsed_time,
                                 get_current_stream=itertools.repeat(stream).__next__,
                                 Device=lambda i=None: contextlib.nullcontext())
    sys.modules["cupy"] = types.SimpleNamespace(cuda=cuda, __version__="fake")
    return True


class FakeCupti:
    """The ``cupti.cupti`` surface :class:`profilers.cupti.CuptiActivity` uses; push and
    pop are C builtins (``(kind, id)`` and ``(kind)``) that return at once."""

    class ActivityKind:
        DRIVER, RUNTIME, CONCURRENT_KERNEL, EXTERNAL_CORRELATION = 5, 6, 10, 19

    class ExternalCorrelationKind:
        CUSTOM0 = 4

    activity_push_external_correlation_id = operator.add
    activity_pop_external_correlation_id = abs

    def activity_register_callbacks(self, requested, completed):
        pass

    def activity_enable(self, kind):
        pass

    def activity_disable(self, kind):
        pass

    def activity_flush_all(self, flag):
        pass


class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1980 if which == 1 else 2619

    def nvmlDeviceGetPowerUsage(self, h):
        return 412_000

    def nvmlDeviceGetTemperature(self, h, s):
        return 41

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0

    def nvmlGpmQueryDeviceSupport(self, h):
        raise RuntimeError("Not Supported")


def counterlog_every() -> int:
    from adaptive import config
    return config.get().counter_log_every


def per_launch_us(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n / 1e3


def side_by_side(off, on, rounds: int, n: int, between=None) -> tuple[float, float]:
    """Median µs per launch of ``off(n)`` and ``on(n)``, alternating, order flipped (the
    best round of each too, in ``side_by_side.best``: steadier on a shared machine)."""
    times = {"off": [], "on": []}
    for r in range(rounds):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            times[mode].append(per_launch_us(off if mode == "off" else on, n))
            if between is not None:
                between()
    side_by_side.best = (min(times["off"]), min(times["on"]))
    return statistics.median(times["off"]), statistics.median(times["on"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launches", type=int, default=20000, help="launches per round")
    p.add_argument("--rounds", type=int, default=12, help="rounds per mode")
    args = p.parse_args(argv)
    fake = install_fake_cupy()
    from adaptive import counterlog
    from adaptive.counterlog import recorders
    from adaptive.dispatch import Dispatcher
    from adaptive.policy import MeasureEach
    from profilers import EventTimer, NvmlSampler
    from profilers.cupti import CuptiActivity, CuptiTimer

    n = args.launches
    tmp = Path(tempfile.mkdtemp(prefix="clbench"))
    d = Dispatcher("host", policy=MeasureEach())
    d.sample_every = 0
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    d.launch("softmax", x)
    plan = next(iter(d._plans.values()))
    noop = dataclasses.replace(plan, run=lambda a, o: o)
    xs = (x,)

    clog = counterlog.CounterLog(tmp / "bench.alog", sample_every=1, timing="events",
                                 flush_interval_s=3600.0, queue_size=1 << 20,
                                 event_capacity=n + 16, govern=False).open()   # 1 in 1
    timer = EventTimer(n + 16, None)
    clog._timers[0] = timer
    sampler = NvmlSampler(0, nvml=FakeNvml())
    for _ in range(8):
        sampler.sample_once()
    clog.samplers[None] = sampler                       # the host dispatcher's "device"
    rec = recorders.LogRecorder(clog, d, timer)
    written = []

    def drain():
        before = clog.stats.written
        t0 = time.perf_counter_ns()
        clog._drain()
        k = clog.stats.written - before
        if k:
            written.append((time.perf_counter_ns() - t0) / k / 1e3)

    def run_noop(k):
        for _ in range(k):
            noop.run(xs, None)

    def rec_noop(k):
        for _ in range(k):
            rec(noop, xs, None)

    rows = []
    def measure(name, off_fn, on_fn):
        written.clear()
        off, on = side_by_side(off_fn, on_fn, args.rounds, n, drain)
        rows.append((name, off, on, statistics.median(written) if written else 0.0,
                     side_by_side.best))

    measure("cuda recorder (no-op plan)", run_noop, rec_noop)
    every = counterlog_every()
    sampled = recorders.LogRecorder(clog, d, timer)
    sampled.every = every

    def sampled_noop(k):
        for _ in range(k):
            sampled(noop, xs, None)

    measure(f"  the same, 1 call in {every}", run_noop, sampled_noop)

    # the CUPTI recorder: its calls are not harvested (no kernel records come from the
    # stand-in), so its queue is emptied between rounds instead of drained
    cupti_timer = CuptiTimer(n + 16, activity=CuptiActivity(cupti=FakeCupti()),
                             clock=time.time).use_cupy_streams()
    assert cupti_timer.status == "ok", cupti_timer.status
    crec = recorders.LogRecorder(clog, d, cupti_timer)
    csampled = recorders.LogRecorder(clog, d, cupti_timer)
    csampled.every = every

    def cupti_noop(k):
        for _ in range(k):
            crec(noop, xs, None)

    def cupti_sampled_noop(k):
        for _ in range(k):
            csampled(noop, xs, None)

    for name, fn in (("cupti recorder (no-op plan)", cupti_noop),
                     (f"  the same, 1 call in {every}", cupti_sampled_noop)):
        off, on = side_by_side(run_noop, fn, args.rounds, n, cupti_timer.discard_pending)
        rows.append((name, off, on, 0.0, side_by_side.best))
    assert cupti_timer.dropped == 0, cupti_timer.dropped

    def launch(k):
        for _ in range(k):
            d.launch("softmax", x)

    d.add_recorder(rec)
    clog._recorders[d] = rec

    def launch_unlogged(k):
        d.remove_recorder(rec)
        launch(k)
        d.add_recorder(rec)

    measure("cuda launch (tiny softmax)", launch_unlogged, launch)
    d.remove_recorder(rec)
    clog._recorders.pop(d)

    host = recorders.LogRecorder(clog, d, None)

    def host_logged(k):
        d.add_recorder(host)
        launch(k)
        d.remove_recorder(host)

    measure("host launch (tiny softmax)", launch, host_logged)
    stats = clog.close()
    assert stats.dropped == 0, stats

    where = Path(counterlog.__file__).resolve().parents[2]
    print(f"cpu_counterlog_overhead: tree {where}; cupy {'stand-in' if fake else 'real'}; "
          f"{n} launches x {args.rounds} rounds per mode; {stats.written} records written")
    print(f"  {'path':<28} {'off us':>8} {'on us':>8} {'caller +us':>11} {'best +us':>9} "
          f"{'writer us':>10}")
    for name, off, on, writer_us, (best_off, best_on) in rows:
        print(f"  {name:<28} {off:>8.3f} {on:>8.3f} {on - off:>+11.3f} "
              f"{best_on - best_off:>+9.3f} {writer_us:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
