"""Export speed and memory of a large counter log, without a GPU.

    python benchmarks/cpu_counterlog_export.py                 # 1e6 records, every format
    python benchmarks/cpu_counterlog_export.py --records 20000 # a quick run

Writes a log of ``--records`` records through the counter log's own writer (its batch
and frame code, fed prepared items instead of launches: 3 devices' worth of plans, two
streams, a device sample every batch of 1024 records, rotation at 64 MiB), then times
``adaptive log export --format csv|parquet|trace`` on it, each in a fresh process whose
peak resident memory is read back (bounded memory: it must not grow with the log).
Target (issue 15): each export of 1e6 records in < 30 s on a developer machine. The CPU
time is printed beside the wall time: on a shared, loaded machine the wall time measures
the machine's load as much as the export.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptive.counterlog import BATCH_ROWS, CounterLog  # noqa: E402

TARGET_S = 30.0


def synthetic_log(path: str | os.PathLike, records: int, max_bytes: int = 64 << 20,
                  states: bool = True) -> int:
    """Write ``records`` records to ``path`` with the real writer; returns bytes written."""
    from profilers.nvml import DeviceState
    clog = CounterLog(path, sample_every=1, max_bytes=max_bytes, backups=1000, nvml=False)
    clog.open()
    clog._closing = True                    # the writer thread exits after one idle pass
    clog._wake.set()
    clog._thread.join()
    clog._thread = None
    backend = types.SimpleNamespace(name="cuda", device="cuda:0")
    rec = types.SimpleNamespace(static={}, backend=backend, peaks=None, index=0)
    plans = []
    for i, (op, dims, variant, config) in enumerate([
            ("gemm", {"M": 64, "K": 4096, "N": 4096}, "cublas", {}),
            ("softmax", {"R": 4096, "C": 1537}, "block_per_row", {"threads": 256, "vec": 4}),
            ("attention", {"B": 1, "H": 32, "Lq": 1, "Lk": 2048, "D": 128}, "decode_global",
             {"warps": 4})]):
        problem = types.SimpleNamespace(op=op, dims=tuple(dims.items()), dtype="float16",
                                        params=(("causal", True),), kind="cupy")
        problem.dims = dict(dims)
        candidate = types.SimpleNamespace(variant=types.SimpleNamespace(name=variant),
                                          config=config)
        plans.append(_Plan(problem, candidate, 1e9 * (i + 1), 1e7 * (i + 1)))
    sampler = _Samples()
    if states:
        clog.samplers[0] = sampler
    t0 = 1.7e9
    step = 0
    while step < records:
        n = min(BATCH_ROWS, records - step)
        if states:
            throttled = 0x4 * ((step // BATCH_ROWS) % 2)          # sw_power_cap
            sampler.add(DeviceState(t0 + step * 2e-5, sm_clock_mhz=1980.0, mem_clock_mhz=3201.0,
                                    power_w=300.0 + step % 97, temperature_c=45.0,
                                    gpu_util_ratio=0.9, clock_event_reasons=throttled,
                                    mem_used_bytes=10 << 30, other_processes=1,
                                    other_processes_mem_bytes=1 << 30, sm_active_ratio=0.7,
                                    dram_active_ratio=0.5))
        items = [(rec, t0 + (step + j) * 2e-5, plans[(step + j) % 3], 0.01 + (j % 7) * 1e-3,
                  "cupti", 0x5000 + 0x100 * ((step + j) % 2), 16) for j in range(n)]
        clog._write_batch(items)
        step += n
    clog._file.flush()
    clog._file.close()
    clog._file = None
    return clog.stats.bytes_written


@dataclasses.dataclass(eq=False)
class _Plan:
    """What the writer reads of a dispatcher's plan (hashed by identity, like a Plan)."""

    problem: object
    candidate: object
    flops: float
    bytes: float


@dataclasses.dataclass
class _Samples:
    """A sampler's history interface over samples added by hand (bounded like the real one)."""

    history: list = dataclasses.field(default_factory=list)

    def add(self, state) -> None:
        self.history = (self.history + [state])[-4:]

    def snapshots(self) -> list:
        return list(self.history)


def export_once(log_path: str, fmt: str, out_path: str) -> dict:
    """Run one export in a fresh process; its wall time and peak memory."""
    code = ("import resource, sys, time\n"
            "from adaptive.cli import main\n"
            "t0 = time.perf_counter()\n"
            f"rc = main(['log', 'export', {log_path!r}, '--format', {fmt!r}, '-o', {out_path!r}])\n"
            "u = resource.getrusage(resource.RUSAGE_SELF)\n"
            "print(time.perf_counter() - t0, u.ru_utime + u.ru_stime, u.ru_maxrss, rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise RuntimeError(f"export {fmt} failed: {proc.stderr[-2000:]}")
    wall_s, cpu_s, maxrss_kib, rc = proc.stdout.split()[-4:]
    return {"format": fmt, "export_s": float(wall_s), "cpu_s": float(cpu_s),
            "peak_rss_mib": int(maxrss_kib) / 1024,
            "rc": int(rc), "out_bytes": os.path.getsize(out_path), "message": proc.stderr.strip()}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--formats", default="csv,parquet,trace")
    p.add_argument("--out", default=None, help="folder for the results (default: a temp one)")
    args = p.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    if "parquet" in formats:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            print("cpu_counterlog_export: pyarrow absent, parquet skipped ([parquet] extra)")
            formats.remove("parquet")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        log_path = os.path.join(tmp, "big.alog")
        t0 = time.perf_counter()
        nbytes = synthetic_log(log_path, args.records)
        write_s = time.perf_counter() - t0
        print(f"wrote {args.records} records ({nbytes / 2**20:.1f} MiB) in {write_s:.1f} s",
              flush=True)
        for fmt in formats:
            res = export_once(log_path, fmt, os.path.join(tmp, f"out.{fmt}"))
            res.update(records=args.records, log_mib=nbytes / 2**20,
                       within_target=res["export_s"] < TARGET_S)
            rows.append(res)
            print(f"  {fmt:<8} {res['export_s']:6.1f} s wall, {res['cpu_s']:6.1f} s CPU (process, "
                  f"with imports)  peak RSS {res['peak_rss_mib']:6.0f} MiB"
                  f"  output {res['out_bytes'] / 2**20:7.1f} MiB  ({res['message']})", flush=True)
    print(f"targets: export of {args.records} records < {TARGET_S:.0f} s: "
          + ", ".join(f"{r['format']} {'yes' if r['within_target'] else 'NO'}" for r in rows))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "cpu_counterlog_export.json").write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
    sys.exit(0)
