"""The Prometheus exposition follows the conventions: it parses, every name passes a
checker (units, ``_total``, histograms, dcgm-exporter names), ``promtool check metrics``
passes where promtool is installed, the Grafana dashboard queries only exported metrics,
and launch counts are exact when many threads launch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from adaptive import metrics  # noqa: E402
from adaptive.dispatch import Dispatcher  # noqa: E402
from adaptive.policy import MeasureEach  # noqa: E402
from profilers import NvmlSampler  # noqa: E402
from fake_nvml import FakeNvml  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# dcgm-exporter's names (etc/default-counters.csv, dcp-metrics-included.csv) for the
# gauges we mirror: same name, unit and meaning
DCGM_EXPORTER = {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_POWER_USAGE",
                 "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
                 "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                 "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
                 "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"}
BASE_UNITS = ("seconds", "bytes", "ratio", "watts", "celsius", "hertz", "joules", "volts")
ABBREVIATIONS = ("ms", "us", "ns", "mhz", "khz", "kb", "mb", "gb", "kib", "mib", "pct",
                 "percent", "sec", "secs", "temp", "util")


def name_problems(name: str, kind: str, samples) -> list[str]:
    """What breaks the conventions in one metric family (empty: none)."""
    out = []
    if name.startswith("DCGM_"):
        if name not in DCGM_EXPORTER:
            out.append(f"{name}: not a dcgm-exporter name")
        if kind != "gauge":
            out.append(f"{name}: dcgm-exporter exports it as a gauge, not a {kind}")
        return out
    if not re.fullmatch(r"adaptive_[a-z][a-z0-9]*(_[a-z0-9]+)*", name):
        out.append(f"{name}: not adaptive_snake_case")
    words = name.split("_")
    for t in ("counter", "gauge", "histogram", "summary"):          # promtool's rule
        if t in words:
            out.append(f"{name}: names its type '{t}'")
    for abbrev in ABBREVIATIONS:
        if abbrev in words:
            out.append(f"{name}: abbreviated or non-base unit '{abbrev}'")
    sample_names = {s.name for s in samples}
    if kind == "counter":
        if name.endswith("_total") or not sample_names <= {name + "_total", name + "_created"}:
            out.append(f"{name}: a counter's samples must be {name}_total")
    elif name.endswith("_total"):
        out.append(f"{name}: only counters end in _total")
    if kind in ("gauge", "histogram") and words[-1] not in BASE_UNITS and \
            name not in metrics.UNITLESS_GAUGES:
        out.append(f"{name}: no base unit suffix ({', '.join(BASE_UNITS)})")
    if kind == "histogram" and samples:
        les = {s.labels.get("le") for s in samples if s.name == name + "_bucket"}
        if "+Inf" not in les or not {name + "_sum", name + "_count"} <= sample_names:
            out.append(f"{name}: a histogram needs _bucket (with le=+Inf), _sum and _count")
    if kind not in ("counter", "gauge", "histogram"):
        out.append(f"{name}: type {kind}; expected counter, gauge or histogram")
    return out


@pytest.fixture
def exposition(rng) -> str:
    """The text a scrape returns, with launches, sampled times and a full device sample."""
    import os
    sampler = NvmlSampler(0, nvml=FakeNvml(util=(40, 5), mem_used_bytes=7 << 30,
                                           processes=[(os.getpid(), 1 << 30), (4242, 1 << 29)],
                                           gpm_supported=False))
    sampler.sample_once()
    server = metrics.MetricsServer({0: sampler}, nvml=False)
    d = Dispatcher("host", policy=MeasureEach())
    d.sample_every = 3
    server.attach(d)
    x = rng.standard_normal((9, 31)).astype(np.float32)
    for _ in range(10):
        d.launch("softmax", x)
    metrics.count_regeneration_request("softmax")
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(server)
    text = prometheus_client.generate_latest(registry).decode()
    server.detach_all()
    return text


def test_exposition_parses_and_every_name_follows_the_conventions(exposition):
    families = list(text_string_to_metric_families(exposition))
    names = {f.name for f in families}
    assert {"adaptive_launches", "adaptive_kernel_time_seconds", "adaptive_log_dropped_records",
            "adaptive_log_written_records", "DCGM_FI_DEV_SM_CLOCK",
            "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL"} <= names
    problems = [p for f in families for p in name_problems(f.name, f.type, f.samples)]
    assert problems == []
    launches = next(f for f in families if f.name == "adaptive_launches")
    assert [s.value for s in launches.samples] == [10]


def test_the_checker_catches_the_old_mistakes():
    Sample = prometheus_client.samples.Sample
    assert name_problems("adaptive_counter_log_dropped_records", "counter",
                         [Sample("adaptive_counter_log_dropped_records_total", {}, 1)])
    assert name_problems("adaptive_kernel_time_ms", "histogram", [])
    assert name_problems("adaptive_gpu_sm_clock_mhz", "gauge", [])
    assert name_problems("adaptive_launches_total", "gauge", [])
    assert name_problems("DCGM_FI_DEV_SM_CLOCKS", "gauge", [])


def test_promtool_check_metrics_passes(exposition):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian/Ubuntu: apt-get install prometheus)")
    run = subprocess.run([promtool, "check", "metrics"], input=exposition, text=True,
                         capture_output=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    # and it does object to what the exposition used to say
    old = ("# HELP adaptive_counter_log_dropped_records_total dropped\n"
           "# TYPE adaptive_counter_log_dropped_records_total counter\n"
           "adaptive_counter_log_dropped_records_total 0.0\n")
    run = subprocess.run([promtool, "check", "metrics"], input=old, text=True,
                         capture_output=True, timeout=60)
    assert run.returncode != 0 and "should not include type 'counter'" in run.stdout + run.stderr


def test_grafana_dashboard_queries_only_exported_metrics(exposition):
    exported = set()
    for f in text_string_to_metric_families(exposition):
        exported |= {s.name for s in f.samples} | {f.name}
        if f.type == "histogram":
            exported |= {f.name + s for s in ("_bucket", "_sum", "_count")}
        if f.type == "counter":
            exported.add(f.name + "_total")
    doc = json.loads((ROOT / "examples/server/grafana-dashboard.json").read_text())
    queries = []

    def walk(node):
        if isinstance(node, dict):
            for key, v in node.items():
                if key in ("expr", "query", "definition") and isinstance(v, str):
                    queries.append(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(doc)
    used = {m for q in queries for m in re.findall(r"\b((?:adaptive|DCGM)_\w+)", q)}
    assert len(queries) >= 15 and len(used) >= 12
    assert used <= exported, f"the dashboard queries metrics never exported: {used - exported}"
    assert {"adaptive_launches_total", "adaptive_kernel_time_seconds_bucket",
            "DCGM_FI_DEV_SM_CLOCK"} <= used


def test_launch_counts_are_exact_with_many_threads(rng):
    server = metrics.MetricsServer(nvml=False)
    d = Dispatcher("host", policy=MeasureEach())
    d.sample_every = 0
    x = rng.standard_normal((3, 7)).astype(np.float32)
    d.launch("softmax", x)                                   # decided before counting
    server.attach(d)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)                              # many thread switches
    try:
        threads = [threading.Thread(target=lambda: [d.launch("softmax", x) for _ in range(300)])
                   for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
        server.detach_all()
    assert sum(server.counts.totals().values()) == 1800
