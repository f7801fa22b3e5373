"""Profilers without a GPU: fake CUDA events, fake NVML and fake CUPTI; the ring, the
sampler's windowing, conversions and fallbacks are the real code under test."""

from __future__ import annotations

import logging
import math
import types

import pytest

from profilers import (CuptiActivity, EventTimer, HostTimer, NvmlSampler, clock_event_names)
from profilers.nvml import GPM_METRICS


# ---- fakes ------------------------------------------------------------------------------

class FakeStream:
    """A device that finishes work when told: events complete in record order."""

    def __init__(self):
        self.now_ms = 0.0
        self.recorded = 0
        self.completed = 0

    def event(self):
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, stream):
        self.stream, self.seq, self.at_ms = stream, None, None

    def record(self):
        self.stream.recorded += 1
        self.seq = self.stream.recorded
        self.at_ms = self.stream.now_ms

    @property
    def done(self):
        return self.seq is not None and self.seq <= self.stream.completed


def fake_events(stream):
    return stream.event, lambda a, b: b.at_ms - a.at_ms


class NVMLError(Exception):
    pass


class FakeMetricsGet:
    def __init__(self):
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
                        for _ in range(16)]


class FakeNvml:
    """Enough of pynvml for the sampler; GPM reads NaN over windows <= 100 ms, as the
    hardware does under load."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = FakeMetricsGet

    def __init__(self, clock, gpm=True, util=True, init_error=None):
        self.clock, self.gpm, self.util, self.init_error = clock, gpm, util, init_error
        self.sm_mhz, self.mem_mhz, self.power_mw, self.temp_c = 1755, 2619, 412_345, 47
        self.gpm_pct = {2: 55.0, 3: 31.0, 5: 12.5, 10: 40.0}
        self.calls = {"util": 0, "mig_sample": 0, "sample": 0, "metrics": 0}

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return ("mig" if uuid.startswith("MIG-") else "gpu", uuid)

    def nvmlDeviceGetClockInfo(self, h, which):
        return {1: self.sm_mhz, 2: self.mem_mhz}[which]

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power_mw

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.temp_c

    def nvmlDeviceGetUtilizationRates(self, h):
        self.calls["util"] += 1
        if not self.util or h[0] == "mig":
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=73, memory=20)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x4 | 0x40

    def nvmlDeviceIsMigDeviceHandle(self, h):
        return h[0] == "mig"

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        return ("gpu", 0)

    def nvmlDeviceGetGpuInstanceId(self, h):
        return 3

    def nvmlGpmQueryDeviceSupport(self, h):
        return types.SimpleNamespace(isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self):
        return {"t": None}

    def nvmlGpmSampleGet(self, h, s):
        self.calls["sample"] += 1
        s["t"] = self.clock()

    def nvmlGpmMigSampleGet(self, h, instance, s):
        assert instance == 3
        self.calls["mig_sample"] += 1
        s["t"] = self.clock()

    def nvmlGpmMetricsGet(self, req):
        self.calls["metrics"] += 1
        window = req.sample2["t"] - req.sample1["t"]
        for i in range(req.numMetrics):
            m = req.metrics[i]
            m.value = self.gpm_pct[m.metricId] if window > 0.1 else math.nan


class FakeClock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


# ---- EventTimer -------------------------------------------------------------------------

def test_event_timer_harvests_only_finished_pairs_in_order_without_waiting(rng):
    stream = FakeStream()
    timer = EventTimer(capacity=8, events=fake_events(stream))
    durations = rng.uniform(0.01, 2.0, size=5)
    for i, d in enumerate(durations):
        slot = timer.start()
        stream.now_ms += d
        timer.stop(slot, tag=f"launch{i}")
    assert timer.harvest() == []                 # nothing finished: no wait, no result
    stream.completed = 6                         # the first three pairs (6 events) done
    got = timer.harvest()
    assert [t for t, _ in got] == ["launch0", "launch1", "launch2"]
    assert [ms for _, ms in got] == pytest.approx(durations[:3])
    stream.completed = 10
    got = timer.harvest()
    assert [t for t, _ in got] == ["launch3", "launch4"]
    assert [ms for _, ms in got] == pytest.approx(durations[3:])
    assert timer.pending == 0 and timer.dropped == 0


def test_event_timer_full_ring_drops_and_counts_then_recovers():
    stream = FakeStream()
    timer = EventTimer(capacity=3, events=fake_events(stream))
    slots = [timer.start() for _ in range(5)]
    for i, s in enumerate(slots):
        timer.stop(s, tag=i)
    assert slots[3:] == [-1, -1] and timer.dropped == 2
    stream.completed = stream.recorded
    assert [t for t, _ in timer.harvest()] == [0, 1, 2]
    s = timer.start()                            # slots are free again
    assert s >= 0
    timer.stop(s, tag="again")
    stream.completed = stream.recorded
    assert [t for t, _ in timer.harvest()] == ["again"]


def test_event_timer_rejects_empty_ring():
    with pytest.raises(ValueError, match="capacity"):
        EventTimer(capacity=0, events=fake_events(FakeStream()))


# ---- NvmlSampler ------------------------------------------------------------------------

def test_nvml_sampler_converts_units_and_decodes_reasons():
    clock = FakeClock()
    nvml = FakeNvml(clock)
    s = NvmlSampler(0, nvml=nvml, clock=clock)
    assert s.status == "ok" and s.gpm_status == "ok"
    snap = s.sample_once()
    assert snap.sm_clock_mhz == 1755 and snap.mem_clock_mhz == 2619
    assert snap.power_w == pytest.approx(412.345)          # NVML reports mW
    assert snap.gpu_util_ratio == pytest.approx(0.73) and snap.mem_util_ratio == pytest.approx(0.2)
    assert snap.temperature_c == 47
    assert clock_event_names(snap.clock_event_reasons) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert snap.sm_active_ratio is None                      # no GPM window yet


def test_gpm_metrics_need_a_window_longer_than_100ms():
    clock = FakeClock()
    nvml = FakeNvml(clock)
    s = NvmlSampler(0, period_s=0.05, gpm_period_s=0.2, nvml=nvml, clock=clock)
    s.sample_once()
    clock.t += 0.05
    assert s.sample_once().sm_active_ratio is None           # window not elapsed: not read
    assert nvml.calls["metrics"] == 0
    clock.t += 0.2
    snap = s.sample_once()
    assert nvml.calls["metrics"] == 1
    want = {name: nvml.gpm_pct[mid] / 100 for mid, name in GPM_METRICS.items()}
    assert {k: getattr(snap, k) for k in want} == pytest.approx(want)
    nvml.gpm_pct[2] = 90.0
    clock.t += 0.25
    assert s.sample_once().sm_active_ratio == pytest.approx(0.9)


def test_two_samplers_never_read_gpm_at_once():
    """Two samplers of one device (a dispatcher's and a benchmark's) on their own threads:
    their GPM calls run one at a time (run S165, an H100: one sampler in nvmlGpmSampleGet
    while the other was in nvmlGpmMetricsGet crashed the process)."""
    import threading
    import time as _time

    class Overlapping(FakeNvml):
        def __init__(self, clock):
            super().__init__(clock)
            self.inside, self.most, self.lock = 0, 0, threading.Lock()

        def _enter(self):
            with self.lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
            _time.sleep(0.002)               # a call slow enough for the other to come
            with self.lock:
                self.inside -= 1

        def nvmlGpmSampleGet(self, h, s):
            self._enter()
            return super().nvmlGpmSampleGet(h, s)

        def nvmlGpmMetricsGet(self, request):
            self._enter()
            return super().nvmlGpmMetricsGet(request)
    clock = FakeClock()
    nvml = Overlapping(clock)
    samplers = [NvmlSampler(0, gpm_period_s=0.2, nvml=nvml, clock=clock) for _ in range(2)]

    def read(s):
        for _ in range(15):
            clock.t += 0.25
            s.sample_once()
    threads = [threading.Thread(target=read, args=(s,)) for s in samplers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert nvml.calls["metrics"] >= 20 and nvml.most == 1, (nvml.calls, nvml.most)


@pytest.mark.parametrize("period", [0.1, 0.05, 0.0])
def test_gpm_period_at_or_below_100ms_is_refused(period):
    with pytest.raises(ValueError, match="0.2 is safe"):
        NvmlSampler(0, gpm_period_s=period, nvml=FakeNvml(FakeClock()))


def test_nvml_absent_says_so_once_and_returns_nothing(caplog):
    caplog.set_level(logging.WARNING)
    nvml = FakeNvml(FakeClock(), init_error=NVMLError("NVML Shared Library Not Found"))
    s = NvmlSampler(0, nvml=nvml, clock=FakeClock())
    assert s.status.startswith("NVML unavailable") and "Not Found" in s.status
    assert s.sample_once() is None and s.latest is None and s.at(1e12) is None
    s.start().stop()                                          # no thread, no error
    assert sum("NVML unavailable" in r.message for r in caplog.records) == 1


def test_unsupported_field_is_reported_once_and_the_rest_keeps_working(caplog):
    caplog.set_level(logging.WARNING)
    clock = FakeClock()
    nvml = FakeNvml(clock, util=False, gpm=False)
    s = NvmlSampler(0, nvml=nvml, clock=clock)
    assert s.gpm_status.startswith("GPM unavailable")
    for _ in range(3):
        snap = s.sample_once()
        clock.t += 1
    assert snap.gpu_util_ratio is None and snap.sm_clock_mhz == 1755
    assert nvml.calls["util"] == 1                            # not asked again
    assert "utilisation" in s.refused
    assert sum("utilisation" in r.message for r in caplog.records) == 1


def test_mig_instance_reads_gpm_on_the_instance_and_no_utilisation():
    clock = FakeClock()
    nvml = FakeNvml(clock)
    s = NvmlSampler("MIG-1234", nvml=nvml, clock=clock)
    s.sample_once()
    clock.t += 0.3
    snap = s.sample_once()
    assert nvml.calls["mig_sample"] == 2 and nvml.calls["sample"] == 0
    assert snap.gpu_util_ratio is None and snap.dram_active_ratio == pytest.approx(0.4)


def test_history_lookup_and_background_thread():
    clock = FakeClock(100.0)
    nvml = FakeNvml(clock)
    s = NvmlSampler(0, nvml=nvml, clock=clock, history=4)
    for t in (100.0, 101.0, 102.0):
        clock.t = t
        nvml.sm_mhz = int(t)
        s.sample_once()
    assert s.at(101.5).sm_clock_mhz == 101
    assert s.at(50.0).sm_clock_mhz == 100                     # before history: the oldest
    live = NvmlSampler(0, period_s=0.01, nvml=FakeNvml(clock), clock=clock)
    with live:
        import time
        deadline = time.monotonic() + 5
        while live.latest is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert live.latest is not None and live._thread is None


# ---- CUPTI ------------------------------------------------------------------------------

class FakeCupti:
    """The cupti.cupti surface the activity source uses; kernels 'run' when flushed."""

    class ActivityKind:
        DRIVER, RUNTIME, CONCURRENT_KERNEL, EXTERNAL_CORRELATION = 5, 6, 10, 19

    class ExternalCorrelationKind:
        CUSTOM0 = 4

    def __init__(self, error=None):
        self.error = error
        self.stack, self.pending, self.correlation = [], [], 100

    def activity_register_callbacks(self, requested, completed):
        if self.error:
            raise self.error
        self.requested, self.completed = requested, completed

    def activity_enable(self, kind):
        pass

    def activity_disable(self, kind):
        pass

    def activity_push_external_correlation_id(self, kind, ext):
        self.stack.append(ext)

    def activity_pop_external_correlation_id(self, kind):
        return self.stack.pop()

    def launch(self, name, start, end):
        self.correlation += 1
        if self.stack:
            self.pending.append(types.SimpleNamespace(
                kind=19, correlation_id=self.correlation, external_id=self.stack[-1]))
        self.pending.append(types.SimpleNamespace(kind=10, correlation_id=self.correlation,
                                                  name=name, start=start, end=end))

    def activity_flush_all(self, flag):
        assert self.requested() == (1 << 20, 0)
        records, self.pending = self.pending, []
        self.completed(records)


def test_cupti_tags_kernels_through_external_correlation():
    fake = FakeCupti()
    act = CuptiActivity(cupti=fake)
    assert act.status == "ok"
    with act.tagged(("gemm", "cublas")):
        fake.launch("gemm_kernel", 1_000, 251_000)
    fake.launch("untagged", 300_000, 310_000)
    act.flush()
    recs = act.harvest()
    assert [(r.name, r.tag) for r in recs] == [("gemm_kernel", ("gemm", "cublas")),
                                               ("untagged", None)]
    assert recs[0].time_ms == pytest.approx(0.25)
    act.close()
    assert act.status == "closed" and act.harvest() == []


def test_cupti_held_by_another_tool_falls_back(caplog):
    caplog.set_level(logging.WARNING)
    err = RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
    act = CuptiActivity(cupti=FakeCupti(error=err))
    assert "another tool" in act.status and "CUDA events" in act.status
    assert act.push("x") == 0 and act.harvest() == []
    act.pop()
    act.flush()
    assert sum("another tool" in r.message for r in caplog.records) == 1


def test_cupti_not_installed_reports_how_to_install():
    pytest.importorskip("pynvml")   # any env; the real cupti-python is absent on CPU CI
    try:
        import cupti  # noqa: F401
        pytest.skip("cupti-python is installed here")
    except ImportError:
        pass
    assert "adaptive-dispatch[cupti]" in CuptiActivity().status


# ---- HostTimer --------------------------------------------------------------------------

def test_host_timer_wall_and_cpu_time():
    ticks = iter([0, 2_500_000])
    cpu = iter([10_000_000, 15_000_000])
    timer = HostTimer(wall_ns=lambda: next(ticks), cpu_ns=lambda: next(cpu))
    result, t = timer.time(lambda x: x * 2, 21)
    assert result == 42
    assert t.wall_ms == pytest.approx(2.5) and t.cpu_ms == pytest.approx(5.0)
    assert t.cpu_per_wall == pytest.approx(2.0)
