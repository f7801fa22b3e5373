"""Prometheus metrics: launches, kernel times, cache misses, regeneration requests,
dropped log records and device gauges, exported by a loopback-or-wider HTTP endpoint.

The hot path pays one ``next()`` on a per-plan ``itertools.count`` (atomic in CPython,
no lock); everything else — summing per op and variant, reading dispatcher statistics,
NVML — happens in a custom collector when Prometheus scrapes. Labels are bounded sets
(op, variant, backend, gpu ordinal): never a shape. ``prometheus_client`` is imported by
:func:`serve_metrics` only.

    >>> server = adaptive.serve_metrics(9400)      # http://127.0.0.1:9400/metrics
    >>> server.close()
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import threading
import weakref
from collections.abc import Mapping

from adaptive import counterlog, dispatch

# kernel-time histogram bounds in seconds: 1 us .. 10 s
KERNEL_TIME_BUCKETS_S = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                         2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

# device gauges: snapshot field -> (metric name, help, scale to base units)
DEVICE_GAUGES = {
    "sm_active_ratio": ("adaptive_gpu_sm_active_ratio",
                        "fraction of time SMs had a warp resident (DCGM SM_ACTIVE)", 1.0),
    "sm_occupancy_ratio": ("adaptive_gpu_sm_occupancy_ratio",
                           "resident warps / maximum, over active SMs (DCGM SM_OCCUPANCY)", 1.0),
    "tensor_active_ratio": ("adaptive_gpu_tensor_active_ratio",
                            "fraction of cycles a tensor pipe was active (DCGM "
                            "PIPE_TENSOR_ACTIVE)", 1.0),
    "dram_active_ratio": ("adaptive_gpu_dram_active_ratio",
                          "fraction of peak DRAM bandwidth used (DCGM DRAM_ACTIVE)", 1.0),
    "gpu_util_ratio": ("adaptive_gpu_utilization_ratio", "NVML GPU utilisation", 1.0),
    "sm_clock_mhz": ("adaptive_gpu_sm_clock_hertz", "SM clock", 1e6),
    "mem_clock_mhz": ("adaptive_gpu_memory_clock_hertz", "memory clock", 1e6),
    "power_w": ("adaptive_gpu_power_watts", "board power draw", 1.0),
    "temperature_c": ("adaptive_gpu_temperature_celsius", "GPU temperature", 1.0),
}

_regen_lock = threading.Lock()
_regen_requests: dict[str, int] = {}


def count_regeneration_request(op: str) -> None:
    """Count one regeneration request for ``op`` (the regenerator calls this)."""
    with _regen_lock:
        _regen_requests[op] = _regen_requests.get(op, 0) + 1


def _count_value(counter: itertools.count) -> int:
    """How many times ``next`` was called on a ``count()`` (its repr is ``count(n)``)."""
    return int(repr(counter)[6:-1])


class _CountingRecorder(counterlog.Recorder):
    """Counts launches per plan; the one hot-path cost of metrics."""

    def __init__(self, owner: MetricsServer):
        super().__init__()
        self.owner = owner

    def __call__(self, plan, args, out):
        counter = self.owner.counts.get(plan)
        if counter is None:
            counter = self.owner.counts.setdefault(plan, itertools.count())
        next(counter)
        return self._next(plan, args, out)

    def sampled(self, plan, time_ms: float) -> None:
        counter = self.owner.counts.get(plan)
        if counter is None:
            counter = self.owner.counts.setdefault(plan, itertools.count())
        next(counter)
        self.owner.observe_time(plan, time_ms / 1e3)


@dataclasses.dataclass
class _Histogram:
    buckets: list[int]
    sum_s: float = 0.0


class MetricsServer:
    """The running endpoint; see :func:`serve_metrics`."""

    def __init__(self, samplers: Mapping[int, object] | None = None, nvml: bool = True):
        self.counts: dict = {}                      # plan -> itertools.count
        self._hist: dict[tuple, _Histogram] = {}
        self._hist_lock = threading.Lock()
        self._recorders = weakref.WeakKeyDictionary()   # dispatcher -> recorder
        self._samplers = dict(samplers or {})
        self._own_samplers: list = []
        self.nvml = nvml
        self._httpd = None
        self.port = 0

    # ---- attaching ---------------------------------------------------------------------
    def attach(self, d: dispatch.Dispatcher) -> None:
        if d in self._recorders:
            return
        rec = self._recorders[d] = _CountingRecorder(self)
        counterlog.install_recorder(d, rec)
        d.listeners.append(rec.sampled)

    def detach_all(self) -> None:
        for d, rec in list(self._recorders.items()):
            counterlog.remove_recorder(d, rec)
            if rec.sampled in d.listeners:
                d.listeners.remove(rec.sampled)
        self._recorders.clear()

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
        for plan, counter in list(self.counts.items()):
            key = (plan.problem.op, plan.candidate.variant.name, plan.candidate.variant.backend)
            totals[key] = totals.get(key, 0) + _count_value(counter)
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

        misses = CounterMetricFamily("adaptive_decision_cache_misses",
                                     "decision-cache misses (new keys decided)",
                                     labels=["backend"])
        by_backend: dict[str, int] = {}
        for d in dispatch.live_dispatchers():
            by_backend[d.backend.name] = by_backend.get(d.backend.name, 0) + d.stats["misses"]
        for name, n in sorted(by_backend.items()):
            misses.add_metric([name], n)
        yield misses

        evictions = CounterMetricFamily("adaptive_plan_cache_evictions",
                                        "plans evicted from the bounded plan cache "
                                        "(ADAPTIVE_PLAN_CACHE_SIZE)", labels=["backend"])
        by_backend = {}
        for d in dispatch.live_dispatchers():
            n = d.stats.get("plan_evictions", 0)
            by_backend[d.backend.name] = by_backend.get(d.backend.name, 0) + n
        for name, n in sorted(by_backend.items()):
            evictions.add_metric([name], n)
        yield evictions

        regen = CounterMetricFamily("adaptive_regeneration_requests",
                                    "requests for new variants", labels=["op"])
        with _regen_lock:
            for op, n in sorted(_regen_requests.items()):
                regen.add_metric([op], n)
        yield regen

        dropped = CounterMetricFamily("adaptive_counter_log_dropped_records",
                                      "counter-log records dropped (queue or event ring full)")
        dropped.add_metric([], counterlog.dropped_records_total())
        yield dropped

        yield from self._device_gauges(GaugeMetricFamily)

    def _device_gauges(self, GaugeMetricFamily):
        samplers = dict(self._samplers)
        for clog in counterlog.active_logs():
            for index, s in clog.samplers.items():
                samplers.setdefault(index, s)
        if self.nvml:
            for d in dispatch.live_dispatchers():
                index = counterlog._cuda_index(d.backend) if d.backend.name == "cuda" else None
                if index is not None and index not in samplers:
                    from profilers.nvml import NvmlSampler, nvml_device
                    s = self._samplers[index] = samplers[index] = NvmlSampler(nvml_device(index))
                    self._own_samplers.append(s.start())
        families = {field: GaugeMetricFamily(name, doc, labels=["gpu"])
                    for field, (name, doc, _) in DEVICE_GAUGES.items()}
        for index, s in sorted(samplers.items()):
            snap = s.latest
            if snap is None:
                continue
            for field, value in snap.to_dict().items():
                if field in families:
                    families[field].add_metric([str(index)], value * DEVICE_GAUGES[field][2])
        yield from families.values()

    # ---- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Stop serving, stop counting, stop the samplers this server started."""
        _hooks_remove(self)
        self.detach_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        for s in self._own_samplers:
            s.stop()


_servers: list[MetricsServer] = []
_servers_lock = threading.Lock()


def _on_new_dispatcher(d: dispatch.Dispatcher) -> None:
    with _servers_lock:
        servers = list(_servers)
    for s in servers:
        s.attach(d)


def _hooks_remove(server: MetricsServer) -> None:
    with _servers_lock:
        if server in _servers:
            _servers.remove(server)


dispatch.new_dispatcher_hooks.append(_on_new_dispatcher)


def serve_metrics(port: int, addr: str = "127.0.0.1", nvml: bool = True,
                  samplers: Mapping[int, object] | None = None) -> MetricsServer:
    """Serve Prometheus metrics on ``http://addr:port/metrics`` from a background thread.

    Counts launches of every dispatcher, present and future, from now on.

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
    with _servers_lock:
        _servers.append(server)
    for d in dispatch.live_dispatchers():
        server.attach(d)
    return server
