"""Prometheus metrics: launches, kernel times, cache misses, regeneration requests,
counter-log records written and dropped, and device gauges, exported by a
loopback-or-wider HTTP endpoint.

Names follow the exposition conventions (``promtool check metrics`` passes): base units
in the name (``_seconds``, ``_bytes``, ``_ratio``), counters end in ``_total``, latencies
are histograms, and device gauges that dcgm-exporter also exports carry its names and
units (``DCGM_FI_DEV_SM_CLOCK`` in MHz, ``DCGM_FI_DEV_POWER_USAGE`` in W, ...), so one
dashboard reads either. The hot path adds one to a per-thread, per-plan count (a dict
only its thread writes: no lock, no lost updates); summing per op and variant, reading
dispatcher statistics and NVML happen in a custom collector when Prometheus scrapes.
Labels are bounded sets (op, variant, backend, gpu ordinal, UUID): never a shape.
``prometheus_client`` is imported by :func:`serve_metrics` only.

    >>> server = adaptive.serve_metrics(9400)      # http://127.0.0.1:9400/metrics
    >>> server.close()
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import weakref
from collections.abc import Mapping

from adaptive import counterlog
from adaptive.counterlog.recorders import cuda_index
from adaptive.dispatch import Dispatcher, Recorder
from adaptive.variants import shared_registry

# kernel-time histogram bounds in seconds: 1 us .. 10 s
KERNEL_TIME_BUCKETS_S = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                         2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

# device gauges: state field -> (metric name, help, scale from the field's unit); the
# DCGM_* ones mirror dcgm-exporter (same name, unit and meaning), the others have no
# DCGM field
DEVICE_GAUGES = {
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 1.0),
    "mem_clock_mhz": ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", 1.0),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 1.0),
    "temperature_c": ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", 1.0),
    "gpu_util_ratio": ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 100.0),
    "mem_util_ratio": ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 100.0),
    "mem_used_bytes": ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 1 / 2**20),
    "clock_event_reasons": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                            "Throttling reasons bitmask (NVML clock-event reasons).", 1.0),
    "sm_active_ratio": ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 "
                        "warp assigned (GPM).", 1.0),
    "sm_occupancy_ratio": ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps "
                           "resident on an SM (GPM).", 1.0),
    "tensor_active_ratio": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor "
                            "(HMMA) pipe is active (GPM).", 1.0),
    "dram_active_ratio": ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory "
                          "interface is active sending or receiving data (GPM).", 1.0),
    "other_processes": ("adaptive_gpu_other_processes", "other processes with a compute "
                        "context on the GPU", 1.0),
    "other_processes_mem_bytes": ("adaptive_gpu_other_processes_memory_bytes", "device "
                                  "memory held by other processes", 1.0),
}
# dispatcher counts exported per backend: (metric name, help, Dispatcher.stats key)
PER_BACKEND_COUNTERS = (
    ("adaptive_decision_cache_misses", "decision-cache misses (new keys decided)", "misses"),
    ("adaptive_plan_cache_evictions", "plans evicted from the bounded plan cache "
     "(ADAPTIVE_PLAN_CACHE_SIZE)", "plan_evictions"),
    ("adaptive_samples_past_gate", "exploring samples dropped as read past their stream "
     "gate (the host issued the call later than the gate holds) and timed again",
     "samples_past_gate"),
)
# adaptive_* gauges that count things, so carry no unit suffix (the name checker's list)
UNITLESS_GAUGES = ("adaptive_gpu_other_processes",)


_regen_lock = threading.Lock()
_regen_requests: dict[str, int] = {}


def count_regeneration_request(op: str) -> None:
    """Count one regeneration request for ``op`` (the regenerator calls this)."""
    with _regen_lock:
        _regen_requests[op] = _regen_requests.get(op, 0) + 1


class _LaunchCounts:
    """Launch counts per plan, one table per thread that launches (each written by its own
    thread only, so a count is never lost between threads); summed when scraped. Bounded
    by threads that launched × plans alive."""

    def __init__(self):
        self.local = threading.local()
        self._tables: list[dict] = []
        self._lock = threading.Lock()

    def table(self) -> dict:
        """This thread's table (made on its first launch)."""
        table = getattr(self.local, "table", None)
        if table is None:
            table = self.local.table = {}
            with self._lock:
                self._tables.append(table)
        return table

    def totals(self) -> dict:
        """plan -> launches, over every thread."""
        with self._lock:
            tables = list(self._tables)
        out: dict = {}
        for table in tables:
            for plan, n in list(table.items()):   # one C call: atomic under the GIL
                out[plan] = out.get(plan, 0) + n
        return out


class _CountingRecorder(Recorder):
    """Counts launches per plan; the one hot-path cost of metrics."""

    def __init__(self, owner: MetricsServer):
        super().__init__()
        self.owner = owner
        self._local, self._table = owner.counts.local, owner.counts.table

    def __call__(self, plan, args, out):
        try:
            table = self._local.table
        except AttributeError:
            table = self._table()
        table[plan] = table.get(plan, 0) + 1
        return self._next(plan, args, out)

    def timed(self, plan, time_ms: float) -> None:
        table = self._table()
        table[plan] = table.get(plan, 0) + 1
        self.owner.observe_time(plan, time_ms / 1e3)


@dataclasses.dataclass
class _Histogram:
    buckets: list[int]
    sum_s: float = 0.0


class MetricsServer:
    """The running endpoint; see :func:`serve_metrics`."""

    def __init__(self, samplers: Mapping[int, object] | None = None, nvml: bool = True):
        self.counts = _LaunchCounts()
        self._hist: dict[tuple, _Histogram] = {}
        self._hist_lock = threading.Lock()
        self._recorders = weakref.WeakKeyDictionary()   # dispatcher -> recorder
        self._samplers = dict(samplers or {})
        self._own_samplers: list = []
        self.nvml = nvml
        self._httpd = None
        self.port = 0
        self._registry = shared_registry()   # whose dispatchers it counts

    # ---- attaching ---------------------------------------------------------------------
    def attach(self, d: Dispatcher) -> None:
        if d in self._recorders:
            return
        rec = self._recorders[d] = _CountingRecorder(self)
        d.add_recorder(rec)

    def detach(self, d: Dispatcher) -> None:
        rec = self._recorders.pop(d, None)
        if rec is not None:
            d.remove_recorder(rec)

    def detach_all(self) -> None:
        for d in list(self._recorders):
            self.detach(d)

    def dispatchers(self) -> list[Dispatcher]:
        """The dispatchers this endpoint counts."""
        return list(self._recorders)

    def observe_time(self, plan, time_s: float) -> None:
        key = (plan.problem.op, plan.candidate.variant.name, plan.candidate.variant.backend)
        i = bisect.bisect_left(KERNEL_TIME_BUCKETS_S, time_s)
        with self._hist_lock:
            h = self._hist.get(key)
            if h is None:
                h = self._hist[key] = _Histogram([0] * (len(KERNEL_TIME_BUCKETS_S) + 1))
            h.buckets[i] += 1
            h.sum_s += time_s

    # ---- scrape time -------------------------------------------------------------------
    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)
        launches = CounterMetricFamily("adaptive_launches", "launches by op and variant",
                                       labels=["op", "variant", "backend"])
        totals: dict[tuple, int] = {}
        for plan, n in self.counts.totals().items():
            key = (plan.problem.op, plan.candidate.variant.name, plan.candidate.variant.backend)
            totals[key] = totals.get(key, 0) + n
        for key, n in sorted(totals.items()):
            launches.add_metric(list(key), n)
        yield launches

        hist = HistogramMetricFamily("adaptive_kernel_time_seconds",
                                     "time of sampled launches", labels=["op", "variant",
                                                                         "backend"])
        with self._hist_lock:
            snapshot = {k: (list(h.buckets), h.sum_s) for k, h in self._hist.items()}
        for key, (buckets, sum_s) in sorted(snapshot.items()):
            cumulative, rows = 0, []
            for bound, n in zip(KERNEL_TIME_BUCKETS_S, buckets):
                cumulative += n
                rows.append((repr(bound), cumulative))
            rows.append(("+Inf", cumulative + buckets[-1]))
            hist.add_metric(list(key), rows, sum_s)
        yield hist

        for name, help_text, stat in PER_BACKEND_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=["backend"])
            by_backend: dict[str, int] = {}
            for d in self.dispatchers():
                n = d.stats.get(stat, 0)
                by_backend[d.backend.name] = by_backend.get(d.backend.name, 0) + n
            for backend, n in sorted(by_backend.items()):
                family.add_metric([backend], n)
            yield family

        regen = CounterMetricFamily("adaptive_regeneration_requests",
                                    "requests for new variants", labels=["op"])
        with _regen_lock:
            for op, n in sorted(_regen_requests.items()):
                regen.add_metric([op], n)
        yield regen

        written = CounterMetricFamily("adaptive_log_written_records",
                                      "counter-log records written")
        written.add_metric([], counterlog.written_records_total())
        yield written
        dropped = CounterMetricFamily("adaptive_log_dropped_records",
                                      "counter-log records dropped (the writer fell behind: "
                                      "queue or timing ring full)")
        dropped.add_metric([], counterlog.dropped_records_total())
        yield dropped

        yield from self._device_gauges(GaugeMetricFamily)

    def _device_gauges(self, GaugeMetricFamily):
        samplers = dict(self._samplers)
        for clog in counterlog.active_logs():
            for index, s in clog.samplers.items():
                samplers.setdefault(index, s)
        if self.nvml:
            for d in self.dispatchers():
                index = cuda_index(d.backend) if d.backend.name == "cuda" else None
                if index is not None and index not in samplers:
                    from profilers.nvml import NvmlSampler, nvml_device
                    s = self._samplers[index] = samplers[index] = NvmlSampler(nvml_device(index))
                    self._own_samplers.append(s.start())
        families = {field: GaugeMetricFamily(name, doc, labels=["gpu", "UUID"])
                    for field, (name, doc, _) in DEVICE_GAUGES.items()}
        for index, s in sorted(samplers.items()):
            snap = s.latest
            if snap is None:
                continue
            uuid = s.device if isinstance(s.device, str) else ""
            for field, value in snap.to_dict().items():
                if field in families:
                    families[field].add_metric([str(index), uuid],
                                               value * DEVICE_GAUGES[field][2])
        yield from families.values()

    # ---- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Stop serving, stop counting, stop the samplers this server started."""
        self._registry.unobserve(self)
        self.detach_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        for s in self._own_samplers:
            s.stop()


def serve_metrics(port: int, addr: str = "127.0.0.1", nvml: bool = True,
                  samplers: Mapping[int, object] | None = None) -> MetricsServer:
    """Serve Prometheus metrics on ``http://addr:port/metrics`` from a background thread.

    Counts launches of every dispatcher on the shared registry, present and future, from
    now on.

    Args:
        port: TCP port (0: any free one; read ``server.port``).
        addr: interface to bind (default loopback; "0.0.0.0" for all).
        nvml: start an NVML sampler per cuda device for the device gauges.
        samplers: ``{gpu ordinal: NvmlSampler}`` to read instead of starting new ones.

    Returns:
        a :class:`MetricsServer`; ``close()`` stops it.

    Example:
        >>> server = adaptive.serve_metrics(0)
        >>> urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics").read()
    """
    try:
        import prometheus_client
    except ImportError:
        raise ImportError("serve_metrics needs prometheus-client: pip install "
                          "adaptive-dispatch[metrics]") from None
    server = MetricsServer(samplers, nvml)
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(server)
    started = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    server._httpd = started[0] if isinstance(started, tuple) else None
    server.port = server._httpd.server_port if server._httpd is not None else port
    server._registry.observe(server)
    return server
