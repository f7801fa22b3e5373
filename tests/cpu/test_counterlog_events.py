"""The counter log's cuda path without a GPU: a stand-in ``cupy`` runtime (events recorded
on streams, finished when the test says so) under the event recorder on a host
dispatcher. Checks the raw runtime calls (events created once, recorded on the launch's
stream, timed by ``eventElapsedTime`` alone), the ring (reused only after harvest, full:
records dropped, calls never), failures, NVML absent and device snapshots by time."""

from __future__ import annotations

import dataclasses
import sys
import time
import types

import numpy as np
import pytest

from adaptive import config
from adaptive.counterlog import recorders
from adaptive.counterlog import CounterLog, read_log
from adaptive.dispatch import Dispatcher
from adaptive.ops import get_op
from adaptive.policy import MeasureEach
from profilers import EventTimer, NvmlSampler
from fake_nvml import FakeNvml  # noqa: E402


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int):
        super().__init__(f"cudaError {status}")
        self.status = status


class FakeRuntime:
    """Events on streams: each record gets the stream's clock; an event is complete once
    ``completed`` reaches its record number. Counts every call."""

    eventDefault = 0
    CUDARuntimeError = CUDARuntimeError

    def __init__(self):
        self.created, self.calls, self.recorded, self.completed = 0, [], 0, 0
        self.at = {}                         # event -> (record number, stream, time_ms)
        self.clock_ms = 0.0
        self.fail_status = None

    def eventCreateWithFlags(self, flags):
        self.created += 1
        return 1000 + self.created

    def eventRecord(self, event, stream):
        self.recorded += 1
        self.calls.append(("record", event, stream))
        self.at[event] = (self.recorded, stream, self.clock_ms)

    def eventQuery(self, event):
        self.calls.append(("query", event))
        return 0 if self.at[event][0] <= self.completed else 600

    def eventElapsedTime(self, start, end):
        self.calls.append(("elapsed", start, end))
        if self.fail_status is not None:
            raise CUDARuntimeError(self.fail_status)
        if self.at[end][0] > self.completed:
            raise CUDARuntimeError(600)
        return self.at[end][2] - self.at[start][2]

    def eventDestroy(self, event):
        self.calls.append(("destroy", event))



@pytest.fixture(autouse=True)
def log_every_launch():
    """These tests count records: every launch logged, events as the cuda timing."""
    with config.override(counter_log_every=1, counter_log_timing="events"):
        yield


@pytest.fixture
def fake_cupy(monkeypatch):
    rt = FakeRuntime()
    current = types.SimpleNamespace(ptr=0x5100)
    cuda = types.SimpleNamespace(runtime=rt, get_current_stream=lambda: current,
                                 Device=lambda i: __import__("contextlib").nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    return rt, current


@pytest.fixture
def host():
    d = Dispatcher("host", policy=MeasureEach())
    d.sample_every = 0
    return d


def timed_launch(d, rt, op, *args, gpu_ms: float):
    """One launch; the fake GPU takes ``gpu_ms`` between the recorder's two events."""
    plan = d._plans.get(get_op(op).key(args, {}))
    if plan is not None and not hasattr(plan, "_timed"):
        run = plan.run

        def run_on_gpu(a, out):
            rt.clock_ms += run_on_gpu.gpu_ms
            return run(a, out)
        d._plans[plan.key] = dataclasses.replace(plan, run=run_on_gpu)
        d._plans[plan.key]._timed = run_on_gpu
        plan = d._plans[plan.key]
    if plan is not None:
        plan._timed.gpu_ms = gpu_ms
    return d.launch(op, *args)


def attach(clog, d, timer):
    clog._timers[0] = timer
    rec = recorders.LogRecorder(clog, d, timer)
    clog._recorders[d] = rec
    d.add_recorder(rec)
    return rec


def test_raw_events_time_every_call_on_the_current_stream(tmp_path, rng, fake_cupy, host):
    rt, current = fake_cupy
    x = rng.standard_normal((13, 37)).astype(np.float32)
    host.launch("softmax", x)                                 # decide first (unlogged)
    clog = CounterLog(tmp_path / "raw.alog", flush_interval_s=60.0).open()
    timer = EventTimer(8, None)                               # CupyEvents on the fake
    assert rt.created == 16
    rec = attach(clog, host, timer)
    assert isinstance(rec, recorders.EventLogRecorder)
    durations = rng.uniform(0.005, 0.2, size=6)
    for i, ms in enumerate(durations):
        current.ptr = 0x5100 + i % 2                          # the caller switches streams
        y = timed_launch(host, rt, "softmax", x, gpu_ms=ms)
        ref = get_op("softmax").reference(x)
        assert np.abs(y - ref).max() < 1e-5
    records = [c for c in rt.calls if c[0] == "record"]
    assert len(records) == 12 and rt.created == 16            # no event made per call
    assert [c[2] for c in records] == [0x5100 + (i // 2) % 2 for i in range(12)]
    clog._drain()
    assert clog.stats.written == 0 and timer.pending == 6     # nothing finished yet
    rt.completed = rt.recorded
    rt.calls.clear()
    clog._drain()
    assert not any(c[0] == "query" for c in rt.calls)         # elapsed alone tells done
    stats = clog.close()
    assert stats.written == 6 and stats.dropped == 0
    recs = read_log(tmp_path / "raw.alog").records
    assert [r["time_ms"] for r in recs] == pytest.approx(durations, rel=1e-12)
    for r in recs:
        assert r["timer"] == "cuda_event" and r["op"] == "softmax"
        assert r["dims"] == {"R": 13, "C": 37} and r["variant"] and "config" in r
        assert r["features"] and r["time_s"] > 0
    assert [c[0] for c in rt.calls[-16:]] == ["destroy"] * 16  # closed: events freed


def test_full_ring_drops_records_never_calls_and_reuses_slots_after_harvest(
        tmp_path, rng, fake_cupy, host):
    rt, _ = fake_cupy
    a, b = (rng.standard_normal((9, 6)).astype(np.float32),
            rng.standard_normal((6, 4)).astype(np.float32))
    clog = CounterLog(tmp_path / "ring.alog", flush_interval_s=60.0).open()
    timer = EventTimer(4, None)
    attach(clog, host, timer)
    for _ in range(7):
        c = host.launch("gemm", a, b)
        assert get_op("gemm").error(c, get_op("gemm").reference(a, b)) < 1e-4
    assert timer.dropped == 3 and timer.pending == 4
    first = {c[1] for c in rt.calls if c[0] == "record"}
    rt.completed = rt.recorded - 2                            # the last pair still running
    clog._drain()
    assert clog.stats.written == 3 and timer.pending == 1
    # slots are taken in turn: the next one is the still-running pair's (dropped), then
    # the three harvested ones are reused
    for _ in range(4):
        host.launch("gemm", a, b)
    assert timer.dropped == 4 and timer.pending == 4
    assert {c[1] for c in rt.calls if c[0] == "record"} == first   # the same events
    rt.completed = rt.recorded
    stats = clog.close()
    assert stats.written == 7 and stats.dropped == 4
    assert len(read_log(tmp_path / "ring.alog").records) == 7


def test_failed_launch_frees_its_slot(tmp_path, rng, fake_cupy, host):
    rt, _ = fake_cupy
    x = rng.standard_normal((5, 11)).astype(np.float32)
    host.launch("softmax", x)
    plan = next(iter(host._plans.values()))

    def broken(args, out):
        raise RuntimeError("kernel launch failed")
    host._plans[plan.key] = dataclasses.replace(plan, run=broken)
    clog = CounterLog(tmp_path / "fail.alog", flush_interval_s=60.0).open()
    timer = EventTimer(2, None)
    attach(clog, host, timer)
    for _ in range(5):
        with pytest.raises(RuntimeError, match="kernel launch failed"):
            host.launch("softmax", x)
    assert timer.pending == 0 and timer.dropped == 0 and not any(timer.busy)
    host._plans[plan.key] = plan
    host.launch("softmax", x)
    rt.completed = rt.recorded
    assert clog.close().written == 1


def test_untimeable_pair_is_dropped_and_counted(tmp_path, rng, fake_cupy, host, caplog):
    rt, _ = fake_cupy
    x = rng.standard_normal((3, 7)).astype(np.float32)
    clog = CounterLog(tmp_path / "err.alog", flush_interval_s=60.0).open()
    timer = EventTimer(4, None)
    attach(clog, host, timer)
    host.launch("softmax", x)
    rt.completed = rt.recorded
    rt.fail_status = 400                                      # invalid resource handle
    clog._drain()
    rt.fail_status = None
    host.launch("softmax", x)
    rt.completed = rt.recorded
    stats = clog.close()
    assert stats.written == 1 and stats.dropped == 1
    assert "event timing failed" in timer.status


def test_each_record_gets_the_snapshot_nearest_before_it(tmp_path, rng, host):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    host.launch("softmax", x)
    plan = next(iter(host._plans.values()))
    now = [100.0]
    nvml = FakeNvml(sm_mhz=1000)
    sampler = NvmlSampler(0, nvml=nvml, clock=lambda: now[0])
    for t, mhz in ((100.0, 1100), (101.0, 1200), (102.0, 1300)):
        now[0], nvml.sm_mhz = t, mhz
        sampler.sample_once()
    clog = CounterLog(tmp_path / "snap.alog", flush_interval_s=60.0).open()
    clog.samplers[None] = sampler                             # a host dispatcher's device
    rec = recorders.LogRecorder(clog, host, None)
    times = [99.0, 100.0, 100.5, 100.99, 101.0, 101.7, 102.0, 250.0, 100.2]
    for t in times:
        clog.submit((rec, t, plan, 0.01, "sync", 0, 1))
    clog.submit((rec, 101.5, plan, 0.01, "host", 0, 1))       # host-timed: no device state
    clog.close()
    recs = read_log(tmp_path / "snap.alog").records
    assert [r["time_s"] for r in recs] == sorted(times + [101.5])
    by_time = {r["time_s"]: r.get("device_state", {}).get("sm_clock_mhz") for r in recs}
    assert by_time == {99.0: 1100, 100.0: 1100, 100.2: 1100, 100.5: 1100, 100.99: 1100,
                       101.0: 1200, 101.5: None, 101.7: 1200, 102.0: 1300, 250.0: 1300}


def test_nvml_absent_records_are_written_without_device_state(tmp_path, rng, fake_cupy,
                                                              host):
    rt, _ = fake_cupy

    class NoNvml:
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    sampler = NvmlSampler(0, nvml=NoNvml())
    assert "NVML unavailable" in sampler.status and sampler.sample_once() is None
    x = rng.standard_normal((6, 6)).astype(np.float32)
    clog = CounterLog(tmp_path / "nonvml.alog", flush_interval_s=60.0).open()
    clog.samplers[None] = sampler.start()                     # start: a no-op, says why
    attach(clog, host, EventTimer(8, None))
    for _ in range(3):
        host.launch("softmax", x)
    rt.completed = rt.recorded
    stats = clog.close()
    recs = read_log(tmp_path / "nonvml.alog").records
    assert stats.written == 3 and all("device_state" not in r for r in recs)
    assert all(r["timer"] == "cuda_event" for r in recs)


# ---- what a GPU hands over that the host does not --------------------------------------------

def test_numpy_scalar_times_and_device_readings_are_written_as_numbers(tmp_path, rng,
                                                                       fake_cupy, host):
    """``eventElapsedTime`` bindings and NVML wrappers may return numpy scalars, which
    msgpack cannot pack: each batch holding one would be dropped whole."""
    rt, _ = fake_cupy
    elapsed = rt.eventElapsedTime
    rt.eventElapsedTime = lambda s, e: np.float32(elapsed(s, e))
    x = rng.standard_normal((5, 11)).astype(np.float32)
    host.launch("softmax", x)
    now = [time.time()]
    nvml = FakeNvml(sm_mhz=np.uint32(1410), power_mw=np.float64(312_500.0))
    sampler = NvmlSampler(0, nvml=nvml, clock=lambda: now[0])
    sampler.sample_once()
    clog = CounterLog(tmp_path / "np.alog", flush_interval_s=60.0).open()
    clog.samplers[0] = sampler
    rec = attach(clog, host, EventTimer(8, None))
    rec.index = 0
    durations = [0.0125, 0.25, 0.0625]
    for ms in durations:
        timed_launch(host, rt, "softmax", x, gpu_ms=ms)
    rt.completed = rt.recorded
    clog._drain()
    stats = clog.close()
    assert (stats.written, stats.dropped, clog.last_error) == (3, 0, None)
    recs = read_log(tmp_path / "np.alog").records
    assert [r["time_ms"] for r in recs] == pytest.approx(durations, rel=1e-6)
    assert all(type(r["time_ms"]) is float for r in recs)
    assert {r["device_state"]["sm_clock_mhz"] for r in recs} == {1410}
    assert recs[0]["device_state"]["power_w"] == pytest.approx(312.5)


def test_a_writer_failure_is_logged_once_with_its_traceback_and_exposed(tmp_path, rng,
                                                                        fake_cupy, host,
                                                                        caplog):
    """A batch the writer cannot write is dropped and counted; the cause must not vanish:
    the first error of each kind is logged with its traceback, later ones counted, and
    ``last_error`` names it."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    host.launch("softmax", x)
    plan = next(iter(host._plans.values()))
    clog = CounterLog(tmp_path / "bad.alog", flush_interval_s=60.0, nvml=False)
    rec = recorders.LogRecorder(clog, host, None)
    clog.open()
    caplog.set_level("ERROR")
    rec.static[plan] = {"op": "softmax", "bad": object()}     # unpackable
    for _ in range(3):
        clog.submit((rec, time.time(), plan, 0.5, "host", 0, 1))
        clog._wake.set()
        deadline = time.monotonic() + 5
        while clog.queue and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
    stats = clog.close()
    assert stats.written == 0 and stats.dropped == 3
    assert clog.error_counts == {"TypeError": 3}
    assert clog.last_error.startswith("TypeError: counter log: cannot write a builtins.object")
    assert "Traceback" in clog.errors["TypeError"] and "_write_batch" in clog.errors["TypeError"]
    logged = [r for r in caplog.records if "writing failed" in r.message]
    assert len(logged) == 1 and "Traceback" in logged[0].getMessage()


def test_each_logged_pair_is_gated_until_the_call_and_its_end_are_issued(tmp_path, rng,
                                                                         fake_cupy, host):
    """Each logged call's pair sits behind the backend's stream gate (the cuda backend's
    holds the stream; here a recording stand-in), released once the end event is recorded
    (also when the call fails): on an idle GPU the pair then times the kernels, not their
    launch."""
    rt, current = fake_cupy
    x = rng.standard_normal((9, 21)).astype(np.float32)
    host.launch("softmax", x)

    def gate(stream, limit_us):
        rt.calls.append(("gate", stream, limit_us))
        return lambda: rt.calls.append(("release", stream))
    host.backend.gate = gate
    clog = CounterLog(tmp_path / "gated.alog", flush_interval_s=60.0).open()
    attach(clog, host, EventTimer(8, None))
    for _ in range(2):
        timed_launch(host, rt, "softmax", x, gpu_ms=0.05)
    kinds = [c[0] for c in rt.calls if c[0] in ("gate", "record", "release")]
    assert kinds == ["gate", "record", "record", "release"] * 2
    assert all(c[2] == recorders.GATE_US for c in rt.calls if c[0] == "gate")
    plan = host._plans[get_op("softmax").key((x,), {})]

    def broken(a, out):
        raise RuntimeError("the kernel failed")
    host._plans[plan.key] = dataclasses.replace(plan, run=broken)
    rt.calls.clear()
    with pytest.raises(RuntimeError, match="the kernel failed"):
        host.launch("softmax", x)
    assert [c[0] for c in rt.calls if c[0] in ("gate", "record", "release")] == [
        "gate", "record", "release"]
    clog.close(wait_gpu_s=0.0)         # the fake GPU never completes a pair: no waiting
