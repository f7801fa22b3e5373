"""Probe: why the mixed table prices cuBLAS above its live samples.

Runs S121-S123 (H200) priced gemm's ``cublas`` at 0.055-0.066 ms a call on float32 M=64
N=256 K=1024 and M=1024 N=1024 K=256 in ``adaptive bench mixed``'s table (pinned launches,
``BATCH`` a synchronise, interleaved with the other candidates), where the live policy's
samples read it at 0.010-0.020 ms and kernels of ours at 0.035-0.042 in the same table;
spmm's ``cublas_dense`` on float32 M=2048 N=16 K=2048 density 0.5 read 0.040-0.097 in
the table against 0.042-0.054 live. For each such input this prints, ms a call, each way
measured as the table measures (``measure_each``: interleaved rounds, ``BATCH`` calls a
synchronise, median):

- the table's own way: ``Dispatcher.launch(op, *args, variant=..., config=...)``;
- the same pinned plan run directly (``plan.run``: no sampling, no recorders);
- the entry on preallocated output (gemm: ``cuda_blas.gemm``), and with ``BATCH``
  raised to 16 (the host's issuing overlapping the device);

beside the best-ranked kernel of ours the table found, and each candidate's device time
(events behind a spin kernel). ``--backend host`` runs the same code on the host's
variants (a dry run: the numbers mean nothing there).

    PYTHONPATH=$PWD python3 benchmarks/probe_table_pricing.py     # H200, about 20 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = [("gemm", {"M": 64, "N": 256, "K": 1024}, "float32", {}),
         ("gemm", {"M": 1024, "N": 1024, "K": 256}, "float32", {}),
         ("spmm", {"M": 2048, "N": 16, "K": 2048}, "float32", {"density": 0.5, "block": 0})]
LIBRARY = {"cuda": {"gemm": "cublas", "spmm": "cublas_dense"},
           "host": {"gemm": "host_blas", "spmm": "host_dense"}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda", choices=("cuda", "host"))
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    from adaptive import arrays
    from adaptive.bench.cli import BATCH, _batch_of   # the table's own way
    from adaptive.dispatch import Dispatcher
    from adaptive.ops import OPS
    from adaptive.policy import MeasureEach
    from adaptive.timing import measure_each
    d = Dispatcher(args.backend, policy=MeasureEach())
    sync = d.backend.synchronize
    rng = np.random.default_rng(0)
    device_ms = _device_timer(args.backend)
    print(f"ms a call ({BATCH} a synchronise unless said; median of {args.reps} rounds)")
    for op_name, dims, dtype, stats in CASES:
        op = OPS[op_name]
        inputs = op.make_inputs(dims, dtype, rng, **stats)
        inputs = arrays.to_cuda(inputs) if args.backend == "cuda" else inputs
        cands = d.candidates(op_name, *inputs)
        lib_name = LIBRARY[args.backend][op_name]
        lib = next((c for c in cands if c.variant.name == lib_name), None)
        if lib is None:
            print(f"{op_name} {dims}: no {lib_name} candidate here; skipped")
            continue
        ours = [c for c in cands if c is not lib and not c.variant.baseline][:12]
        # the table's pass over these candidates: the best kernel of ours by its pricing
        table = measure_each([_batch_of(d, op_name, inputs, c, BATCH) for c in [lib] + ours],
                             warmup=2, reps=args.reps, sync=sync)
        priced = [m.median_ms / BATCH for m in table]
        best = min(range(len(ours)), key=lambda i: priced[i + 1]) if ours else None
        kernel = ours[best] if best is not None else None
        pinned = {c.label: _pinned_plan(args.backend, op_name, inputs, c.label)
                  for c in [lib] + ([kernel] if kernel else [])}
        ways = {"table": _batch_of(d, op_name, inputs, lib, BATCH),
                "plan.run": _runs(lambda: pinned[lib.label].run(inputs, None), BATCH)}
        out = pinned[lib.label].run(inputs, None)
        if op_name == "gemm" and args.backend == "cuda":
            from adaptive.backends.cuda_blas import gemm
            ways["entry, out kept"] = _runs(lambda: gemm(inputs[0], inputs[1], out), BATCH)
            ways["entry, out kept, 16"] = _runs(lambda: gemm(inputs[0], inputs[1], out), 16)
        if kernel is not None:
            ways[f"table: {kernel.label}"] = _batch_of(d, op_name, inputs, kernel, BATCH)
            ways["plan.run: ours"] = _runs(lambda: pinned[kernel.label].run(inputs, None),
                                           BATCH)
        got = measure_each(list(ways.values()), warmup=2, reps=args.reps, sync=sync)
        scale = {name: 16 if name.endswith(", 16") else BATCH for name in ways}
        print(f"{op_name} {dims} {dtype}: {lib.label} against {kernel.label if kernel else '-'}")
        for (name, _), m in zip(ways.items(), got):
            print(f"  {name:<40} {m.median_ms / scale[name]:.4f}")
        if device_ms is not None:
            for label, plan in pinned.items():
                print(f"  device time {label:<28} "
                      f"{device_ms(lambda: plan.run(inputs, None)):.4f}")
        print(f"  the table's first pass: {lib.label} {priced[0]:.4f}, the best of ours "
              f"{statistics.median(priced[1:]) if ours else float('nan'):.4f} (median of "
              f"{len(ours)}), {min(priced[1:]) if ours else float('nan'):.4f} (best)")
    return 0


def _pinned_plan(backend: str, op_name: str, inputs, label: str):
    """The plan of the candidate ``label`` on ``inputs``, from a dispatcher of its own whose
    policy picks it."""
    from adaptive.dispatch import Dispatcher
    from adaptive.policy.base import BasePolicy, Decision

    class Pin(BasePolicy):
        name = "pin"

        def decide(self, ctx, candidates):
            return Decision(next(c for c in candidates if c.label == label), "pinned")
    return Dispatcher(backend, policy=Pin()).plan(op_name, *inputs)


def _runs(fn, n: int):
    def run():
        for _ in range(n):
            fn()
    return run


def _device_timer(backend: str):
    if backend != "cuda":
        return None
    import cupy as cp

    from benchmarks.gpu_spmm_attention import Timer
    return Timer(cp)


if __name__ == "__main__":
    raise SystemExit(main())
