"""End-to-end serving benchmark: adaptive vs static vs plain PyTorch on one request stream.

    PYTHONPATH=$PWD python3 benchmarks/gpu_server.py --out $OUT     # H200, about 2 minutes
    python benchmarks/gpu_server.py --device host --quick            # a dry run on the CPU

``scripts/gpu-check`` calls :func:`main` (``main(out_dir) -> list[dict]`` summary rows).

Each dispatch mode serves the example transformer block (examples/server) from its own
in-process HTTP server in turn; the same seeded load (long-tailed sequence lengths,
bursts, closed loop with ``--concurrency`` clients) is sent to each. Before the timed
load, one request per padded length warms the server (compilation and, for adaptive,
first decisions); that time is reported apart. While the load runs, an NVML sampler
reads SM clock, power, utilisation and the GPM SM-activity ratio every 0.1 s.

Writes ``gpu_server.json`` to ``--out`` and prints a table: throughput, p50/p99
latency (client side, HTTP included), p50 server time, and mean SM activity.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                        # profilers, when run as a script
sys.path.insert(0, str(ROOT / "examples" / "server"))

from block import BlockShape, build, input_activations  # noqa: E402
from loadgen import make_stream, run_load  # noqa: E402
from server import InferenceServer, resolve_device  # noqa: E402

MODES = ("adaptive", "static", "torch")
GPU_SHAPE = BlockShape(d_model=2048, heads=16, d_ff=8192, vocab=16384, layers=4,
                       density=0.25, max_seq=2048, pad_to=128)
QUICK_SHAPE = BlockShape(d_model=64, heads=2, d_ff=128, vocab=128, layers=1, max_seq=256,
                         pad_to=64)


class DeviceSampler:
    """NVML snapshots every ``period_s`` on a thread, kept per phase (None without NVML)."""

    def __init__(self, enabled: bool = True, period_s: float = 0.1):
        self.period_s, self.snapshots = period_s, []
        self._stop = threading.Event()
        self._thread = None
        self.nvml, self.status = None, "off (host backend)"
        if not enabled:
            return
        try:
            from profilers.nvml import NvmlSampler
            self.nvml = NvmlSampler(0, period_s=period_s, gpm_period_s=0.2)
            self.status = f"nvml {self.nvml.status}, gpm {self.nvml.gpm_status}"
        except Exception as exc:  # noqa: BLE001 (no profilers package or no NVML)
            self.nvml, self.status = None, f"no sampler: {type(exc).__name__}: {exc}"

    def __enter__(self):
        self.snapshots, self._stop = [], threading.Event()
        if self.nvml is not None and self.nvml.status == "ok":
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.period_s):
            snap = self.nvml.sample_once()
            if snap is not None:
                self.snapshots.append(snap.to_dict())

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def summary(self) -> dict:
        out = {"samples": len(self.snapshots)}
        for field in ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio",
                      "sm_clock_mhz", "power_w", "gpu_util_ratio"):
            values = [s[field] for s in self.snapshots[2:] if field in s]  # skip GPM's first
            if values:
                out[field] = float(np.mean(values))
        return out


def free_device_memory(mode: str) -> None:
    gc.collect()
    if "cupy" in sys.modules:
        sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
    if mode == "torch" and "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
        sys.modules["torch"].cuda.empty_cache()


def run_mode(mode: str, shape: BlockShape, device: str, dtype: str, stream, args,
             sampler: DeviceSampler) -> dict:
    t0 = time.perf_counter()
    model = build(shape, mode, device, dtype)
    server = InferenceServer(("127.0.0.1", 0), model, shape, mode)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    result = {"mode": mode, "setup_s": time.perf_counter() - t0}
    try:
        t0 = time.perf_counter()
        lengths = range(shape.pad_to, shape.max_seq + 1, shape.pad_to)
        warmed = 0
        for length in lengths:          # one request per padded length: every key is seen
            if time.perf_counter() - t0 > args.warmup_s:
                break
            model(input_activations(shape, model.host_weights, seq_len=length, seed=length))
            warmed += 1
        result |= {"warmup_s": time.perf_counter() - t0, "warmed_lengths": warmed,
                   "lengths": len(lengths)}
        with sampler:
            report = run_load(url, stream, args.concurrency, args.duration_s)
        result |= {"load": report.to_dict(), "device": sampler.summary()}
        if mode == "static":
            result["static_choices"] = model.static_choices()
    finally:
        server.shutdown()
        server.server_close()
        del model, server
        free_device_memory(mode)
    return result


def table(results: list[dict]) -> str:
    head = (f"{'mode':<9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'srv p50':>8} "
            f"{'ok/sent':>11} {'warmup s':>9} {'SM act':>7} {'SM MHz':>7}")
    lines = [head, "-" * len(head)]
    for r in results:
        if "error" in r:
            lines.append(f"{r['mode']:<9} failed: {r['error']}")
            continue
        load, dev = r["load"], r["device"]
        sm = dev.get("sm_active_ratio")
        mhz = dev.get("sm_clock_mhz")
        lat = load["latency_ms"]
        lines.append(
            f"{r['mode']:<9} {load['throughput_rps']:>8.1f} {lat.get('p50', 0):>8.2f}"
            f" {lat.get('p99', 0):>8.2f} {load['server_ms'].get('p50', 0):>8.2f}"
            f" {load['ok']:>5}/{load['sent']:<5} {r['warmup_s']:>9.1f}"
            f" {'-' if sm is None else f'{sm:.2f}':>7} {'-' if mhz is None else f'{mhz:.0f}':>7}")
    return "\n".join(lines)


def run(out_dir: str, device: str = "auto", modes: str = ",".join(MODES),
        requests: int = 20000, duration_s: float = 12.0, warmup_s: float = 25.0,
        concurrency: int = 8, quick: bool = False) -> dict:
    """Run every mode on one request stream; write gpu_server.json; return the payload."""
    device = resolve_device(device)
    shape = QUICK_SHAPE if quick or device == "host" else GPU_SHAPE
    if quick:
        duration_s, warmup_s = min(duration_s, 3.0), min(warmup_s, 10.0)
    dtype = "float16" if device == "cuda" else "float32"
    stream = make_stream(requests, seed=0, rate=0.0, seq_median=shape.max_seq / 8,
                         seq_sigma=0.9, seq_max=shape.max_seq, burst_mean=4.0)
    sampler = DeviceSampler(enabled=device == "cuda")
    print(f"gpu_server: {device} {dtype} {shape}; sampler: {sampler.status}", flush=True)
    knobs = argparse.Namespace(duration_s=duration_s, warmup_s=warmup_s, concurrency=concurrency)
    results = []
    for mode in modes.split(","):
        t0 = time.perf_counter()
        try:
            results.append(run_mode(mode, shape, device, dtype, stream, knobs, sampler))
        except Exception as exc:  # noqa: BLE001 (one mode failing still reports the others)
            results.append({"mode": mode, "error": f"{type(exc).__name__}: {exc}"[:400]})
        print(f"  {mode}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(table(results))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": "gpu_server", "device": device, "dtype": dtype,
               "shape": dataclasses.asdict(shape), "concurrency": concurrency,
               "duration_s": duration_s, "sampler": sampler.status, "results": results}
    tmp = out / f".gpu_server.json.{os.getpid()}"
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    os.replace(tmp, out / "gpu_server.json")
    return payload


def summary_rows(payload: dict) -> list[dict]:
    """gpu-check rows: per mode throughput, p99 and SM activity; adaptive's ratios."""
    rows, by_mode = [], {}
    for r in payload["results"]:
        if "error" in r:
            rows.append({"case": r["mode"], "value": "FAILED", "unit": "", "note": r["error"][:80],
                         "rc": 1})
            continue
        load, dev = r["load"], r["device"]
        by_mode[r["mode"]] = load
        sm = dev.get("sm_active_ratio")
        note = (f"p50 {load['latency_ms'].get('p50', 0):.2f} ms, p99 "
                f"{load['latency_ms'].get('p99', 0):.2f} ms, SM active "
                + ("-" if sm is None else f"{sm:.2f}")
                + f", {load['ok']}/{load['sent']} ok, warm-up {r['warmup_s']:.0f} s "
                f"({r['warmed_lengths']}/{r['lengths']} lengths)")
        rows.append({"case": f"{r['mode']} throughput", "value": f"{load['throughput_rps']:.1f}",
                     "unit": "req/s", "note": note})
    for base in ("static", "torch"):
        if "adaptive" in by_mode and base in by_mode and by_mode[base]["throughput_rps"] > 0:
            a, b = by_mode["adaptive"], by_mode[base]
            rows.append({"case": f"adaptive / {base}",
                         "value": f"{a['throughput_rps'] / b['throughput_rps']:.2f}",
                         "unit": "x req/s", "note": "p99 ratio (lower is better) "
                         f"{a['latency_ms']['p99'] / b['latency_ms']['p99']:.2f}"})
    return rows


def main(out_dir: str) -> list[dict]:
    """gpu-check entry point: the full run on the GPU (about 2 minutes); summary rows."""
    if resolve_device("auto") != "cuda":
        return [{"case": "skipped", "value": "-", "unit": "", "note": "no CUDA device"}]
    return summary_rows(run(out_dir))


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON")
    p.add_argument("--device", choices=("auto", "cuda", "host"), default="auto")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--duration-s", type=float, default=12.0, help="timed load per mode")
    p.add_argument("--warmup-s", type=float, default=25.0, help="warm-up cap per mode")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="tiny model, short run (dry run)")
    args = p.parse_args(argv)
    if args.device == "auto" and resolve_device("auto") != "cuda":
        print("gpu_server: SKIP (no CUDA device; use --device host for a dry run)")
        return 0
    payload = run(args.out, args.device, args.modes, args.requests, args.duration_s,
                  args.warmup_s, args.concurrency, args.quick)
    for row in summary_rows(payload):
        print(f"{row['case']:<22} {row['value']:>8} {row['unit']:<8} {row.get('note', '')}")
    return 0 if all("error" not in r for r in payload["results"]) else 1


if __name__ == "__main__":
    sys.exit(cli())
