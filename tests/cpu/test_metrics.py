"""The Prometheus endpoint, scraped over loopback: exact launch counts, the kernel-time
histogram in seconds, misses, regeneration requests, dropped log records and device
gauges from a sampler reading fake NVML."""

from __future__ import annotations

import os
import urllib.request

import numpy as np
import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import adaptive  # noqa: E402
from adaptive import metrics  # noqa: E402
from adaptive.dispatch import Dispatcher  # noqa: E402
from adaptive.policy import MeasureEach  # noqa: E402
from profilers import NvmlSampler  # noqa: E402
from fake_nvml import FakeNvml  # noqa: E402


def scrape(server) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read()
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def server():
    s = adaptive.serve_metrics(0, nvml=False)
    yield s
    s.close()


def test_launches_histogram_misses_regen_counted(server, rng):
    d = Dispatcher("host", policy=MeasureEach())   # made after the server: attached by hook
    d.sample_every = 5
    x = rng.standard_normal((13, 29)).astype(np.float32)
    a = rng.standard_normal((17, 9)).astype(np.float32)
    b = rng.standard_normal((9, 4)).astype(np.float32)
    for _ in range(25):
        y = d.launch("softmax", x)
    ref = adaptive.OPS["softmax"].reference(x)
    assert adaptive.OPS["softmax"].error(y, ref) < 1e-4
    for _ in range(7):
        d.launch("gemm", a, b)
    soft = d.decision("softmax", x).candidate.variant.name
    gemm = d.decision("gemm", a, b).candidate.variant.name
    before = value(scrape(server), "adaptive_regeneration_requests_total", op="spmm") or 0
    adaptive.count_regeneration_request("spmm")
    adaptive.count_regeneration_request("spmm")
    got = scrape(server)
    assert value(got, "adaptive_launches_total", op="softmax", variant=soft, backend="host") == 25
    assert value(got, "adaptive_launches_total", op="gemm", variant=gemm, backend="host") == 7
    # every 5th of 32 launches was sampled: 6 timings, in seconds
    n_soft = value(got, "adaptive_kernel_time_seconds_count", op="softmax", variant=soft,
                   backend="host")
    n_gemm = value(got, "adaptive_kernel_time_seconds_count", op="gemm", variant=gemm,
                   backend="host")
    assert n_soft + n_gemm == 6
    total_s = value(got, "adaptive_kernel_time_seconds_sum", op="softmax", variant=soft,
                    backend="host")
    assert 0 < total_s < 1.0                    # seconds, not milliseconds
    assert value(got, "adaptive_kernel_time_seconds_bucket", op="softmax", variant=soft,
                 backend="host", le="1e-06") <= n_soft
    assert value(got, "adaptive_kernel_time_seconds_bucket", op="softmax", variant=soft,
                 backend="host", le="+Inf") == n_soft
    assert value(got, "adaptive_decision_cache_misses_total", backend="host") >= 2
    past = value(got, "adaptive_samples_past_gate_total", backend="host")
    d.stats["samples_past_gate"] += 3           # (counted by a GPU's gated samples alone)
    assert value(scrape(server), "adaptive_samples_past_gate_total", backend="host") == past + 3
    assert value(got, "adaptive_regeneration_requests_total", op="spmm") == before + 2
    labels = {k for (_, ls) in got for k, _ in ls}
    assert labels <= {"op", "variant", "backend", "le", "gpu", "UUID"}   # no shapes as labels


def test_dropped_log_records_are_exported(server, rng, tmp_path):
    d = Dispatcher("host", policy=MeasureEach())
    d.sample_every = 0
    a = rng.standard_normal((5, 6)).astype(np.float32)
    b = rng.standard_normal((6, 7)).astype(np.float32)
    before = scrape(server)
    with adaptive.counter_log(tmp_path / "m.alog", sample_every=1, queue_size=2,
                              flush_interval_s=60.0):
        for _ in range(12):
            d.launch("gemm", a, b)
    after = scrape(server)
    for name, n in (("adaptive_log_dropped_records_total", 10),
                    ("adaptive_log_written_records_total", 2)):
        assert value(after, name) - value(before, name) == n, name


def test_device_gauges_carry_dcgm_exporter_names_and_units():
    sampler = NvmlSampler(0, nvml=FakeNvml(power_mw=250_500, temp_c=51, util=(64, 10),
                                           gpm_supported=False, mem_used_bytes=3 << 30,
                                           processes=[(os.getpid(), 1 << 30), (1, 5 << 20)],
                                           reasons=0x4))
    sampler.sample_once()
    server = adaptive.serve_metrics(0, nvml=False, samplers={0: sampler})
    try:
        got = scrape(server)
    finally:
        server.close()
    gpu = {"gpu": "0", "UUID": ""}
    assert value(got, "DCGM_FI_DEV_SM_CLOCK", **gpu) == 1980                  # MHz, as DCGM
    assert value(got, "DCGM_FI_DEV_POWER_USAGE", **gpu) == pytest.approx(250.5)   # W
    assert value(got, "DCGM_FI_DEV_GPU_UTIL", **gpu) == pytest.approx(64)      # percent
    assert value(got, "DCGM_FI_DEV_GPU_TEMP", **gpu) == 51
    assert value(got, "DCGM_FI_DEV_FB_USED", **gpu) == 3 * 1024                # MiB
    assert value(got, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", **gpu) == 4
    assert value(got, "adaptive_gpu_other_processes", **gpu) == 1             # not this one
    assert value(got, "adaptive_gpu_other_processes_memory_bytes", **gpu) == 5 << 20
    assert value(got, "DCGM_FI_PROF_SM_ACTIVE", **gpu) is None                # no GPM here


def test_close_detaches_and_counting_is_one_cheap_hook(rng):
    d = Dispatcher("host", policy=MeasureEach())
    assert d.recorder is None                       # metrics off: the launch path as before
    server = adaptive.serve_metrics(0, nvml=False)
    assert isinstance(d.recorder, metrics._CountingRecorder)
    server.close()
    assert d.recorder is None and not d.recorders
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=2)


def test_buckets_reach_down_to_microseconds():
    assert metrics.KERNEL_TIME_BUCKETS_S[0] == 1e-6
    assert list(metrics.KERNEL_TIME_BUCKETS_S) == sorted(metrics.KERNEL_TIME_BUCKETS_S)
