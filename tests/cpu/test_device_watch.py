"""The device's state as the policy's features (``ADAPTIVE_DEVICE_STATE=nvml``), on a fake
NVML: ``runtime.start`` starts the backend's watch, one sampler a device for the process;
the cuda backend's ``device_state`` is the newest reading (at most a second old) with the
SM clock's maximum beside it, so the policy's :class:`DeviceState` reads a held-down clock
and another process; without NVML it says why once and the policy sees an idle device."""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_nvml import FakeNvml  # noqa: E402

from adaptive import config, runtime  # noqa: E402
from adaptive.backends import cuda  # noqa: E402
from adaptive.policy.features import DeviceState  # noqa: E402
from profilers.nvml import NvmlSampler  # noqa: E402


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _backend(index: int = 0):
    be = object.__new__(cuda.CudaBackend)
    be.index, be._watch = index, None
    return be


@pytest.fixture
def watchers(monkeypatch):
    monkeypatch.setattr(cuda, "_watchers", {})
    started = []
    clock = Clock()

    class Other(FakeNvml):
        def nvmlDeviceGetMaxClockInfo(self, h, which):
            return 1980

    def start_watch(index, period_s):
        sampler = NvmlSampler(index, period_s=period_s, clock=clock,
                              nvml=Other(sm_mhz=1485, util=(97, 40),
                                         processes=[(1, 1 << 30), (2, 2 << 30)]))
        started.append(sampler)
        return sampler
    monkeypatch.setattr(cuda, "_start_watch", start_watch)
    return started, clock


def test_the_policy_reads_the_newest_reading_while_it_is_fresh(watchers):
    started, clock = watchers
    be = _backend()
    assert be.device_state() == {}                       # not watched: an idle device
    assert be.watch_device() == "ok" and be.watch_device() == "ok"
    other = _backend()
    assert other.watch_device() == "ok" and len(started) == 1   # one sampler a device
    assert be.device_state() == {}                       # no reading yet
    started[0].sample_once()
    state = be.device_state()
    assert state["sm_clock_mhz"] == 1485 and state["max_sm_clock_mhz"] == 1980
    seen = DeviceState.from_mapping(state)
    assert seen.known and seen.sm_clock_ratio == pytest.approx(0.75)
    assert seen.gpu_util_ratio == pytest.approx(0.97)
    assert seen.other_processes >= 1                      # pids 1 and 2 are not this process
    clock.now += 2.0                                     # the sampler stalled: stale
    assert be.device_state() == {}


def test_without_nvml_the_reason_is_said_once_and_the_device_looks_idle(monkeypatch, caplog):
    monkeypatch.setattr(cuda, "_watchers", {})

    def refusing(index, period_s=0.1, **kw):
        raise RuntimeError("NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "profilers.nvml", types.SimpleNamespace(
        NvmlSampler=refusing, nvml_device=lambda i: i))
    caplog.set_level("WARNING")
    be = _backend(3)
    why = be.watch_device()
    assert "NVML unavailable" in why and "Not Found" in why and be.device_state() == {}
    assert _backend(3).watch_device() == why                 # asked again: the same answer
    assert sum("policy sees an idle device" in r.message for r in caplog.records) == 1


def test_start_watches_the_device_when_asked_and_refuses_a_bad_setting():
    from adaptive import Dispatcher
    d = Dispatcher("host")
    asked = []
    d.backend.watch_device = lambda period_s=0.1: asked.append(period_s) or "ok"
    with config.override(device_state="off"):
        runtime.start(d)
    assert asked == []
    with config.override(device_state="nvml"):
        runtime.start(d)
    assert asked == [0.1]
    with config.override(device_state="dcgm"), \
            pytest.raises(ValueError, match="ADAPTIVE_DEVICE_STATE='dcgm': expected off or nvml"):
        runtime.start(d)
    assert "no device counters" in Dispatcher("host").backend.watch_device()


def test_one_sampler_a_device_when_backends_start_at_once(watchers):
    started, _ = watchers
    backends = [_backend() for _ in range(8)]
    threads = [threading.Thread(target=b.watch_device) for b in backends]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(started) == 1 and all(b._watch is not None for b in backends)
