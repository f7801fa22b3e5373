"""DeviceState: what the NVML sampler reads (memory, other processes, throttling), the
latest reading as policy features, and its round trip through a log record."""

from __future__ import annotations

import math
import os

import pytest

from profilers import STATE_FEATURES, DeviceState, NvmlSampler
from fake_nvml import FakeNvml


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_sampler_reads_memory_other_processes_and_throttling():
    clock = Clock()
    nvml = FakeNvml(sm_mhz=1755, power_mw=612_000, util=(88, 31), mem_used_bytes=81 << 30,
                    processes=[(os.getpid(), 60 << 30), (111, 20 << 30), (222, 1 << 30)],
                    reasons=0x004 | 0x040)                 # sw power cap + hw thermal
    sampler = NvmlSampler(0, nvml=nvml, clock=clock)
    assert sampler.latest_state() is None
    sampler.sample_once()
    state = sampler.latest_state()
    assert isinstance(state, DeviceState) and state.time_s == 1000.0
    assert (state.sm_clock_mhz, state.power_w, state.gpu_util_ratio) == (1755, 612.0, 0.88)
    assert state.mem_used_bytes == 81 << 30
    assert state.other_processes == 2 and state.other_processes_mem_bytes == 21 << 30
    assert state.clock_event_names == ["sw_power_cap", "hw_thermal_slowdown"]
    clock.now += 5.0
    assert sampler.latest_state(max_age_s=10.0) is state
    assert sampler.latest_state(max_age_s=1.0) is None       # stale: not a feature


def test_features_are_a_fixed_set_of_floats_with_nan_for_unreported():
    state = DeviceState(5.0, sm_clock_mhz=1980, power_w=400.5, clock_event_reasons=0x080,
                        other_processes=0)
    f = state.features()
    assert tuple(f) == STATE_FEATURES and "time_s" not in f
    assert all(isinstance(v, float) for v in f.values())
    assert f["sm_clock_mhz"] == 1980.0 and f["other_processes"] == 0.0
    assert f["throttled_power"] == 1.0 and f["throttled_thermal"] == 0.0   # hw power brake
    assert math.isnan(f["sm_active_ratio"]) and math.isnan(f["temperature_c"])
    unknown = DeviceState(5.0).features()
    assert math.isnan(unknown["throttled_power"]) and math.isnan(unknown["throttled_thermal"])


def test_round_trip_through_a_log_record_and_bad_records_rejected():
    state = DeviceState(12.5, sm_clock_mhz=1980.0, mem_used_bytes=3 << 30,
                        clock_event_reasons=4, dram_active_ratio=0.61)
    record = state.to_dict()
    assert set(record) == {"time_s", "sm_clock_mhz", "mem_used_bytes", "clock_event_reasons",
                           "dram_active_ratio"}
    assert DeviceState.from_dict({**record, "from_a_newer_writer": 1}) == state
    with pytest.raises(ValueError, match="power_w must be a number, got 'high'"):
        DeviceState.from_dict({"time_s": 1.0, "power_w": "high"})
    with pytest.raises(ValueError, match="numeric time_s"):
        DeviceState.from_dict({"sm_clock_mhz": 1980})
