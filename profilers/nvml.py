"""NVML sampler: clocks, power, temperature, utilisation, clock-event reasons and, on
Hopper, GPM metrics, read by a background thread into a short history of snapshots.

Measured on an H200: one NVML read costs 1-2 us, ``nvmlGpmSampleGet`` about 0.1 ms and
``nvmlGpmMetricsGet`` for 8 metrics about 19 ms, so all of it runs off the calling thread.
NVML's utilisation counters refresh only every 1/6-1 s, and GPM windows of 100 ms or
less read zeros and NaN under load: GPM metrics come from sample pairs ``gpm_period_s``
(default 0.2 s) apart. Under MIG utilisation rates are unsupported; GPM is read on the
MIG instance. Whatever is absent or refused is reported once (``status``, a warning) and
the rest keeps working.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("profilers.nvml")

# GPM calls of every sampler in the process, one at a time: two samplers of one device
# (a dispatcher's and a benchmark's) reading GPM at once crashed the process in
# nvmlGpmSampleGet while the other was in nvmlGpmMetricsGet (run S165, H100, a segfault)
_GPM_LOCK = threading.Lock()

MIN_GPM_PERIOD_S = 0.1

# GPM metric id -> snapshot field; the DCGM profiling fields these mirror in brackets.
GPM_METRICS = {
    2: "sm_active_ratio",         # NVML_GPM_METRIC_SM_UTIL        (DCGM_FI_PROF_SM_ACTIVE)
    3: "sm_occupancy_ratio",      # NVML_GPM_METRIC_SM_OCCUPANCY   (DCGM_FI_PROF_SM_OCCUPANCY)
    5: "tensor_active_ratio",     # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    #                               (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)
    10: "dram_active_ratio",      # NVML_GPM_METRIC_DRAM_BW_UTIL   (DCGM_FI_PROF_DRAM_ACTIVE)
}

CLOCK_EVENT_REASONS = {
    0x001: "gpu_idle", 0x002: "applications_clocks", 0x004: "sw_power_cap",
    0x008: "hw_slowdown", 0x010: "sync_boost", 0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown", 0x080: "hw_power_brake", 0x100: "display_clock",
}


def clock_event_names(mask: int) -> list[str]:
    """Names of the clock-event (throttle) reasons set in an NVML bitmask."""
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]


@dataclasses.dataclass(frozen=True)
class DeviceState:
    """One reading of the device; a field is None when the device does not report it.

    What the counter log joins to each launch (the newest reading at or before it) and
    what a policy reads as features (:meth:`features`). ``other_processes*`` count the
    other processes with a CUDA context on the device (NVML's process list, minus this
    process's pid: inside a container whose pid namespace differs from the host's this
    process counts too).
    """

    time_s: float
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    gpu_util_ratio: float | None = None          # NVML utilisation.gpu / 100
    mem_util_ratio: float | None = None          # NVML utilisation.memory / 100
    clock_event_reasons: int | None = None       # bitmask; see clock_event_names
    mem_used_bytes: int | None = None            # device memory in use, every process
    other_processes: int | None = None           # other processes with a compute context
    other_processes_mem_bytes: int | None = None  # device memory those processes hold
    sm_active_ratio: float | None = None         # GPM, over the last window
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None       # GPM DRAM bandwidth / peak

    def to_dict(self) -> dict:
        """The reported fields only (msgpack- and JSON-friendly)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> DeviceState:
        """A state from :meth:`to_dict`'s output (a log record's ``device_state``);
        unknown keys are ignored, a non-numeric value is a ValueError naming the field."""
        if not isinstance(d, dict) or not isinstance(d.get("time_s"), (int, float)):
            raise ValueError(f"expected a device-state map with a numeric time_s, got {d!r:.80}")
        values = {}
        for f in dataclasses.fields(cls):
            v = d.get(f.name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"device state field {f.name} must be a number, got {v!r}")
            values[f.name] = v
        return cls(**values)

    @property
    def clock_event_names(self) -> list[str]:
        """Names of the clock-event (throttle) reasons set."""
        return clock_event_names(self.clock_event_reasons or 0)

    def features(self) -> dict[str, float]:
        """Every field but ``time_s`` as a float (NaN when unreported), plus 0/1 flags for
        power and thermal throttling: a fixed set of keys (:data:`STATE_FEATURES`)."""
        out = {}
        for name in STATE_FEATURES[:-2]:
            v = getattr(self, name)
            out[name] = math.nan if v is None else float(v)
        mask = self.clock_event_reasons
        out["throttled_power"] = math.nan if mask is None else float(bool(mask & _POWER_BITS))
        out["throttled_thermal"] = (math.nan if mask is None
                                    else float(bool(mask & _THERMAL_BITS)))
        return out


DeviceSnapshot = DeviceState        # the earlier name
_POWER_BITS = 0x004 | 0x080         # sw_power_cap, hw_power_brake
_THERMAL_BITS = 0x020 | 0x040       # sw / hw thermal slowdown
STATE_FEATURES = tuple(f.name for f in dataclasses.fields(DeviceState)
                       if f.name != "time_s") + ("throttled_power", "throttled_thermal")


class NvmlSampler:
    """Reads one GPU through NVML every ``period_s`` on a background thread.

    Args:
        device: NVML index (int) or UUID (``"GPU-..."``, ``"MIG-..."``).
        period_s: time between readings.
        gpm_period_s: GPM window; more than 0.1 s (shorter windows read zeros and NaN).
        history: snapshots kept for :meth:`at`.
        nvml: the NVML module (default: ``pynvml`` from nvidia-ml-py; tests pass a fake).
        clock: seconds since the epoch (default ``time.time``; tests pass a fake).

    ``status`` says what works ("ok", or why NVML is unavailable); ``gpm_status`` the same
    for GPM. ``latest`` is the newest :class:`DeviceState` or None (also
    :meth:`latest_state`, with an age limit).

    Example:
        >>> with NvmlSampler(0, period_s=0.1) as s:
        ...     run_work()
        ...     s.latest.sm_clock_mhz, s.latest.power_w
    """

    def __init__(self, device: int | str = 0, period_s: float = 0.1, gpm_period_s: float = 0.2,
                 history: int = 256, nvml=None, clock: Callable[[], float] = time.time):
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, got {period_s}")
        if not gpm_period_s > MIN_GPM_PERIOD_S:
            raise ValueError(f"gpm_period_s must exceed {MIN_GPM_PERIOD_S} s (shorter GPM "
                             f"windows read zeros and NaN under load), got {gpm_period_s}; "
                             "0.2 is safe")
        self.device, self.period_s, self.gpm_period_s = device, period_s, gpm_period_s
        self._clock = clock
        self._history: collections.deque[DeviceState] = collections.deque(maxlen=history)
        self.latest: DeviceState | None = None
        self._refused: dict[str, str] = {}       # field -> why, reported once
        self._gpm: dict[str, float] = {}
        self._gpm_get = None
        self._gpm_prev = self._gpm_next = None
        self._gpm_prev_s = -math.inf
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.cpu_s = 0.0            # CPU time of the background thread's samples so far
        self._nvml = None
        self._pid = os.getpid()
        self.max_sm_clock_mhz: float | None = None   # the SM clock's maximum (once)
        self.status = self._open(nvml)
        self.gpm_status = self._open_gpm() if self._nvml is not None else self.status

    # ---- set-up ------------------------------------------------------------------------
    def _open(self, nvml) -> str:
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            if isinstance(self.device, str):
                self._handle = nvml.nvmlDeviceGetHandleByUUID(self.device)
            else:
                self._handle = nvml.nvmlDeviceGetHandleByIndex(self.device)
        except Exception as exc:  # noqa: BLE001 (absent library, no GPU, no permission)
            status = f"NVML unavailable: {type(exc).__name__}: {exc}"
            log.warning("%s; device counters will be missing from observations", status)
            return status
        self._nvml = nvml
        self.max_sm_clock_mhz = _call(nvml, "nvmlDeviceGetMaxClockInfo", self._handle,
                                      getattr(nvml, "NVML_CLOCK_SM", 1), default=None)
        return "ok"

    def _open_gpm(self) -> str:
        nvml, handle = self._nvml, self._handle
        try:
            target, get = handle, None
            if _call(nvml, "nvmlDeviceIsMigDeviceHandle", handle, default=False):
                target = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
                instance = nvml.nvmlDeviceGetGpuInstanceId(handle)
                get = lambda s: nvml.nvmlGpmMigSampleGet(target, instance, s)  # noqa: E731
            if not nvml.nvmlGpmQueryDeviceSupport(target).isSupportedDevice:
                raise RuntimeError("this device has no GPM (Hopper or newer needed)")
            self._gpm_get = get or (lambda s: nvml.nvmlGpmSampleGet(target, s))
            with _GPM_LOCK:
                self._gpm_prev = nvml.nvmlGpmSampleAlloc()
                self._gpm_next = nvml.nvmlGpmSampleAlloc()
        except Exception as exc:  # noqa: BLE001
            status = f"GPM unavailable: {type(exc).__name__}: {exc}"
            log.warning("%s; SM activity, occupancy, tensor and DRAM activity will be missing",
                        status)
            return status
        return "ok"

    # ---- reading -----------------------------------------------------------------------
    def sample_once(self) -> DeviceState | None:
        """Take one snapshot now (the background thread calls this every ``period_s``)."""
        if self._nvml is None:
            return None
        nvml, h = self._nvml, self._handle
        now = self._clock()
        values: dict = {}
        values["sm_clock_mhz"] = self._read("sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, h,
                                            nvml.NVML_CLOCK_SM)
        values["mem_clock_mhz"] = self._read("mem_clock_mhz", nvml.nvmlDeviceGetClockInfo, h,
                                             nvml.NVML_CLOCK_MEM)
        usage_mw = self._read("power_w", nvml.nvmlDeviceGetPowerUsage, h)
        values["power_w"] = usage_mw / 1e3 if usage_mw is not None else None  # NVML: mW
        values["temperature_c"] = self._read("temperature_c", nvml.nvmlDeviceGetTemperature, h,
                                             nvml.NVML_TEMPERATURE_GPU)
        util = self._read("utilisation", nvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            values["gpu_util_ratio"] = util.gpu / 100.0
            values["mem_util_ratio"] = util.memory / 100.0
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
        values["clock_event_reasons"] = self._read("clock_event_reasons", reasons, h)
        memory = self._read("mem_used_bytes", _fn(nvml, "nvmlDeviceGetMemoryInfo"), h)
        if memory is not None:
            values["mem_used_bytes"] = int(memory.used)
        procs = self._read("other_processes",
                           _fn(nvml, "nvmlDeviceGetComputeRunningProcesses"), h)
        if procs is not None:
            others = [p for p in procs if getattr(p, "pid", None) != self._pid]
            values["other_processes"] = len(others)
            values["other_processes_mem_bytes"] = sum(
                int(getattr(p, "usedGpuMemory", 0) or 0) for p in others)
        if self._gpm_get is not None and now - self._gpm_prev_s >= self.gpm_period_s:
            self._read_gpm(now)
        snap = DeviceState(now, **{k: v for k, v in values.items() if v is not None},
                              **self._gpm)
        self._history.append(snap)
        self.latest = snap
        return snap

    def _read(self, field: str, fn, *args):
        if field in self._refused:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 (unsupported under MIG, no permission, ...)
            self._refused[field] = f"{type(exc).__name__}: {exc}"
            log.warning("NVML %s unavailable on device %s (%s); not read again", field,
                        self.device, self._refused[field])
            return None

    def _read_gpm(self, now: float) -> None:
        nvml = self._nvml
        try:
            with _GPM_LOCK:
                self._read_gpm_locked(nvml)
        except Exception as exc:  # noqa: BLE001
            self.gpm_status = f"GPM failed: {type(exc).__name__}: {exc}"
            log.warning("%s; GPM metrics stop here", self.gpm_status)
            self._gpm_get, self._gpm = None, {}
            return
        self._gpm_prev, self._gpm_next = self._gpm_next, self._gpm_prev
        self._gpm_prev_s = now

    def _read_gpm_locked(self, nvml) -> None:
        """One GPM sample into the next buffer and, after the first, the metrics between
        the previous sample and it (the caller holds :data:`_GPM_LOCK`)."""
        self._gpm_get(self._gpm_next)
        if math.isfinite(self._gpm_prev_s):
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = self._gpm_prev, self._gpm_next
            for i, metric in enumerate(GPM_METRICS):
                request.metrics[i].metricId = metric
            nvml.nvmlGpmMetricsGet(request)
            gpm = {}
            for i, name in enumerate(GPM_METRICS.values()):
                m = request.metrics[i]
                if m.nvmlReturn == 0 and math.isfinite(m.value):
                    gpm[name] = min(max(m.value / 100.0, 0.0), 1.0)   # GPM: percent
            self._gpm = gpm

    def at(self, time_s: float) -> DeviceState | None:
        """The newest snapshot taken at or before ``time_s`` (else the oldest one)."""
        history = list(self._history)
        for snap in reversed(history):
            if snap.time_s <= time_s:
                return snap
        return history[0] if history else None

    def latest_state(self, max_age_s: float | None = None) -> DeviceState | None:
        """The newest reading as a :class:`DeviceState` (what a policy reads as features);
        None when there is none yet or it is older than ``max_age_s``."""
        snap = self.latest
        if snap is None or (max_age_s is not None and self._clock() - snap.time_s > max_age_s):
            return None
        return snap

    def snapshots(self) -> list[DeviceState]:
        """The kept history, oldest first."""
        return list(self._history)

    @property
    def refused(self) -> dict[str, str]:
        """Fields the device did not report, and why."""
        return dict(self._refused)

    # ---- background thread -------------------------------------------------------------
    def start(self) -> NvmlSampler:
        """Start the background thread (no-op when NVML is unavailable or already running)."""
        if self._nvml is None or self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="adaptive-nvml", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.thread_time()
            self.sample_once()
            self.cpu_s += time.thread_time() - t0
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        """Stop the background thread and wait for it."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"NvmlSampler(device={self.device!r}, status={self.status!r}, "
                f"gpm={self.gpm_status!r})")


def _fn(nvml, name: str):
    """``nvml.name``, or a function raising "not available" (older bindings, fakes)."""
    fn = getattr(nvml, name, None)
    if fn is None:
        def absent(*args):
            raise NotImplementedError(f"{name} is not in this NVML binding")
        return absent
    return fn


def _call(nvml, name: str, *args, default=None):
    fn = getattr(nvml, name, None)
    if fn is None:
        return default
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001
        return default


def nvml_device(cuda_index: int) -> int | str:
    """The NVML identity of a CUDA device ordinal: its UUID when CuPy can tell (CUDA and
    NVML may number devices differently; under MIG it names the instance), else the index."""
    try:
        import cupy
        raw = cupy.cuda.runtime.getDeviceProperties(cuda_index)["uuid"]
        h = bytes(raw).hex() if not isinstance(raw, str) else raw.replace("-", "")
        text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        import pynvml
        pynvml.nvmlInit()
        for prefix in ("GPU-", "MIG-"):
            try:
                pynvml.nvmlDeviceGetHandleByUUID(prefix + text)
                return prefix + text
            except Exception:  # noqa: BLE001
                continue
    except Exception:  # noqa: BLE001 (fall back to the ordinal)
        pass
    return cuda_index
