"""Where CUPTI's per-launch cost comes from, one configuration a process: launches per
second on the GPU-bound and host-bound streams of ``gpu_counterlog.py`` with nothing on,
then with one CUPTI configuration on, then off again (CUPTI's cost after its kinds are
disabled). Run S3 found CUPTI activity alone costing 40% (GPU-bound) and 82% (host-bound)
through cupti-python, and the cost staying after disable; these configurations split it:

  * ``kernel_noop``: CONCURRENT_KERNEL only, cupti-python callbacks that only count
    (the binding still builds a Python object a record before calling back);
  * ``kernel_serial_noop``: KERNEL (serialising) instead of CONCURRENT_KERNEL, counting;
  * ``all_noop``: the counter log's kinds (kernel, external correlation, driver and
    runtime API narrowed to launches), counting only;
  * ``all_parse``: the same with ``profilers.cupti.CuptiActivity``'s own parsing (what
    the counter log runs);
  * ``raw_kernel`` / ``raw_all``: the same kinds, the buffer callbacks registered with
    ``ctypes`` straight on libcupti (no binding between CUPTI and us): a completed buffer
    is copied out whole (one memcpy) and parsed after the timed blocks, with the
    per-record parse cost printed (``cuptiActivityGetNextRecord`` + field reads);
  * ``activity``: ``CuptiActivity`` as the counter log makes it now (its buffers through
    ctypes, parsed by ``profilers.cupti_buffers``), collected every 20 ms by a thread as
    the counter log's writer does.

    PYTHONPATH=$PWD python3 benchmarks/probe_cupti_variants.py     # H200, about 2 minutes
    python3 benchmarks/probe_cupti_variants.py --dry-run            # the plan, no GPU

Prints one line a configuration and stream, and writes ``probe_cupti_variants.json`` to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = ("kernel_noop", "kernel_serial_noop", "all_noop", "all_parse", "raw_kernel",
            "raw_all", "activity")
STREAM_NAMES = ("gpu_bound", "host_bound")


def _cupti_lib_path() -> str:
    """The libcupti the binding loaded (read from this process's mappings)."""
    with open("/proc/self/maps") as f:
        for line in f:
            if "libcupti" in line:
                return line.split()[-1]
    raise RuntimeError("libcupti is not mapped in this process")


class RawActivity:
    """CUPTI activity buffers through ctypes: buffers handed out from a pool, a completed
    buffer copied out whole (one memcpy under the GIL) and parsed later."""

    def __init__(self, cupti, kinds, buffer_bytes: int = 1 << 20):
        import ctypes

        import numpy as np
        self.ct, self.np, self.cupti, self.kinds = ctypes, np, cupti, kinds
        cupti.get_timestamp()    # the binding loads libcupti: find the same copy
        self.lib = ctypes.CDLL(_cupti_lib_path())
        self.buffer_bytes = buffer_bytes
        self.pool: dict[int, object] = {}
        self.free: list[int] = []
        self.done: list[bytes] = []
        self.callback_s = 0.0
        req_t = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.POINTER(ctypes.c_size_t),
                                 ctypes.POINTER(ctypes.c_size_t))
        done_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                  ctypes.c_size_t, ctypes.c_size_t)
        self._req, self._done = req_t(self._request), done_t(self._completed)
        rc = self.lib.cuptiActivityRegisterCallbacks(self._req, self._done)
        if rc:
            raise RuntimeError(f"cuptiActivityRegisterCallbacks returned {rc}")

    def _request(self, buf, size, max_records):
        if self.free:
            ptr = self.free.pop()
        else:
            arr = self.np.empty(self.buffer_bytes + 8, self.np.uint8)
            ptr = (arr.ctypes.data + 7) & ~7
            self.pool[ptr] = arr
        buf[0] = ptr
        size[0] = self.buffer_bytes
        max_records[0] = 0

    def _completed(self, ctx, stream, buf, size, valid):
        t0 = time.thread_time()
        if valid:
            self.done.append(self.ct.string_at(buf, valid))
        self.free.append(buf)
        self.callback_s += time.thread_time() - t0

    def enable(self) -> None:
        for k in self.kinds:
            self.cupti.activity_enable(k)

    def disable(self) -> None:
        self.cupti.activity_flush_all(1)
        for k in self.kinds:
            self.cupti.activity_disable(k)

    def parse(self) -> dict:
        """Walk every copied buffer: records by kind, and the seconds a record took."""
        ct = self.ct
        rec = ct.c_void_p()
        counts: dict[int, int] = {}
        kernel = int(self.cupti.ActivityKind.CONCURRENT_KERNEL)
        fields = self.cupti.activity_kernel10_dtype.fields
        off_start, off_end = fields["start"][1], fields["end"][1]
        off_corr = fields["correlation_id"][1] if "correlation_id" in fields else \
            fields["correlationId"][1]
        u32, u64 = ct.c_uint32, ct.c_uint64
        n, t0 = 0, time.perf_counter()
        spans = 0
        for data in self.done:
            buf = ct.create_string_buffer(data, len(data))
            rec.value = None
            while self.lib.cuptiActivityGetNextRecord(buf, ct.c_size_t(len(data)),
                                                      ct.byref(rec)) == 0:
                addr = rec.value
                kind = u32.from_address(addr).value
                counts[kind] = counts.get(kind, 0) + 1
                if kind == kernel:
                    s = u64.from_address(addr + off_start).value
                    e = u64.from_address(addr + off_end).value
                    u32.from_address(addr + off_corr)
                    spans += e > s
                n += 1
        dt = time.perf_counter() - t0
        return {"records": n, "by_kind": {str(k): v for k, v in counts.items()},
                "parse_us_per_record": dt / n * 1e6 if n else None, "kernel_spans": spans}


def _start(variant: str):
    """Turn ``variant`` on; returns (stop() -> dict of what it saw)."""
    from cupti import cupti
    kinds_all = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.EXTERNAL_CORRELATION,
                 cupti.ActivityKind.DRIVER, cupti.ActivityKind.RUNTIME]
    if variant.startswith("raw_"):
        kinds = kinds_all if variant == "raw_all" else kinds_all[:1]
        raw = RawActivity(cupti, kinds)
        raw.enable()
        if variant == "raw_all":
            from profilers.cupti import CuptiActivity
            narrowed = CuptiActivity._select_api(_Narrower(), cupti, launches_only=True)
        else:
            narrowed = None

        def stop_raw():
            raw.disable()
            seen = {"callback_s": raw.callback_s, "buffers": len(raw.done),
                    "narrowed": narrowed}
            try:
                seen.update(raw.parse())
            except Exception as exc:  # noqa: BLE001 (the rates above still count)
                seen["parse_error"] = f"{type(exc).__name__}: {exc}"
            return seen
        return stop_raw
    if variant in ("kernel_noop", "kernel_serial_noop"):
        kind = (cupti.ActivityKind.CONCURRENT_KERNEL if variant == "kernel_noop"
                else cupti.ActivityKind.KERNEL)
        seen = {"records": 0, "buffers": 0, "callback_s": 0.0}

        def done(acts):
            t0 = time.thread_time()
            seen["records"] += len(acts)
            seen["buffers"] += 1
            seen["callback_s"] += time.thread_time() - t0
        cupti.activity_register_callbacks(lambda: (1 << 20, 0), done)
        cupti.activity_enable(kind)

        def stop_kernel():
            cupti.activity_flush_all(1)
            cupti.activity_disable(kind)
            return seen
        return stop_kernel
    from profilers.cupti import CuptiActivity

    class Counting(CuptiActivity):
        def _buffer_completed(self, activities) -> None:
            t0 = time.thread_time()
            self.counts["buffers"] += 1
            self.counts["other"] += len(activities)
            self.callback_cpu_s += time.thread_time() - t0
    if variant == "activity":
        act = CuptiActivity(cupti)
    else:
        act = (Counting if variant == "all_noop" else CuptiActivity)(cupti, lib=False)
    if act.status != "ok":
        raise RuntimeError(f"CUPTI: {act.status}")
    import threading
    done = threading.Event()
    collect_s = [0.0]

    def collector():                 # the reader's parsing, on its own thread
        while not done.wait(0.02):
            t0 = time.thread_time()
            act.flush()
            act.collect(time.monotonic())
            collect_s[0] += time.thread_time() - t0
    thread = threading.Thread(target=collector, daemon=True)
    if variant == "activity":
        thread.start()

    def stop_activity():
        done.set()
        if thread.is_alive():
            thread.join()
        act.close()
        b = act._buffers
        return {"callback_s": act.callback_cpu_s, "collect_cpu_s": collect_s[0],
                "flushes": act.flushes, "flush_s": act.flush_s, "flush_cpu_s": act.flush_cpu_s,
                "narrowed": act.narrowed, "ctypes": b is not None,
                "slow_buffers": b.slow_buffers if b else None,
                "mismatch": b.mismatch if b else None, **act.counts}
    return stop_activity


class _Narrower:
    """Stands in for a CuptiActivity in ``_select_api`` (it reads nothing of self but
    calls itself again when narrowing fails)."""

    def _select_api(self, cupti, launches_only: bool) -> bool:
        from profilers.cupti import CuptiActivity
        return CuptiActivity._select_api(self, cupti, launches_only)


def child(variant: str, blocks: int, block_s: float) -> dict:
    import cupy

    from adaptive.dispatch import Dispatcher
    from benchmarks.gpu_counterlog import STREAMS, committed, make_inputs
    d = Dispatcher("cuda")
    d.sample_every = 0
    streams = {name: make_inputs("cuda", STREAMS["cuda"][name], seed=len(name))
               for name in STREAM_NAMES}
    for inputs in streams.values():
        for op, xs in inputs:
            committed(d, op, xs)

    def rate(inputs) -> float:
        n = 0
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < block_s:
            for op, xs in inputs:
                d.launch(op, *xs)
            n += len(inputs)
        cupy.cuda.Device().synchronize()
        return n / (time.perf_counter() - t0)

    def phase() -> dict:
        out = {}
        for name, inputs in streams.items():
            rate(inputs)
            out[name] = statistics.median(rate(inputs) for _ in range(blocks))
        return out
    cpu0 = time.process_time()
    before = phase()
    stop = _start(variant)
    time.sleep(0.05)
    t_on, cpu_on = time.perf_counter(), time.process_time()
    on = phase()
    on_wall, on_cpu = time.perf_counter() - t_on, time.process_time() - cpu_on
    seen = stop()
    after = phase()
    return {"variant": variant, "off": before, "on": on, "off_after": after, "seen": seen,
            "on_cpu_per_wall": on_cpu / on_wall, "cpu_s": time.process_time() - cpu0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--block-s", type=float, default=0.5)
    p.add_argument("--timeout-s", type=float, default=60.0, help="a configuration's limit")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.blocks, args.block_s)), flush=True)
        return 0
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; expected some of {', '.join(VARIANTS)}")
    rows = []
    for v in variants:
        cmd = [sys.executable, __file__, "--child", v, "--blocks", str(args.blocks),
               "--block-s", str(args.block_s)]
        if args.dry_run:
            print(" ".join(cmd))
            continue
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s,
                                  cwd=ROOT)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
                "variant": v, "error": f"rc {proc.returncode}: {proc.stderr[-800:]}"}
        except subprocess.TimeoutExpired:
            row = {"variant": v, "error": f"timed out after {args.timeout_s:.0f} s"}
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        if "error" in row:
            print(f"{v:<20} ERROR {row['error']}", flush=True)
            continue
        for s in STREAM_NAMES:
            off, on, after = row["off"][s], row["on"][s], row["off_after"][s]
            print(f"{v:<20} {s:<10} off {off:>8.0f}/s  on {on:>8.0f}/s  loss {1 - on / off:+6.1%}"
                  f"  after {after:>8.0f}/s ({1 - after / off:+6.1%})", flush=True)
        print(f"{'':<20} seen {row['seen']}  cpu/wall on {row['on_cpu_per_wall']:.2f}",
              flush=True)
    if not args.dry_run:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "probe_cupti_variants.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
