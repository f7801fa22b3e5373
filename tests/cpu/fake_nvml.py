"""A stand-in for the ``pynvml`` module with fixed readings, for tests without a GPU.

Utilisation and GPM answer "Not Supported" (as under MIG) unless given.
"""

from __future__ import annotations

import types


class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, sm_mhz: int = 1980, power_mw: int = 250_000, temp_c: int = 40,
                 util: tuple[int, int] | None = None, gpm_supported: bool | None = None,
                 mem_used_bytes: int | None = None,
                 processes: list[tuple[int, int]] | None = None, reasons: int = 0):
        self.sm_mhz, self.power_mw, self.temp_c = sm_mhz, power_mw, temp_c
        self.util, self.gpm_supported = util, gpm_supported
        self.mem_used_bytes, self.processes, self.reasons = mem_used_bytes, processes, reasons

    def nvmlDeviceGetMemoryInfo(self, h):
        if self.mem_used_bytes is None:
            raise RuntimeError("Not Supported")
        return types.SimpleNamespace(used=self.mem_used_bytes, total=141 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if self.processes is None:
            raise RuntimeError("Not Supported")
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self.processes]

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetClockInfo(self, h, which):
        return self.sm_mhz if which == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power_mw

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.temp_c

    def nvmlDeviceGetUtilizationRates(self, h):
        if self.util is None:
            raise RuntimeError("Not Supported")
        return types.SimpleNamespace(gpu=self.util[0], memory=self.util[1])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons

    def nvmlGpmQueryDeviceSupport(self, h):
        if self.gpm_supported is None:
            raise RuntimeError("Not Supported")
        return types.SimpleNamespace(isSupportedDevice=int(self.gpm_supported))
