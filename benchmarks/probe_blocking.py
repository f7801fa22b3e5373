"""Probe: does a candidate's call wait for the device?

Runs S127 and S130 (H200) ran the mixed table's streams whole: on attention, pinning
``three_pass`` on every input took 0.76 of the time of each input's fastest finalist
pinned, where the finalists were re-timed 16 calls of one input back to back. One input
on ``sdpa_torch`` among the six put adaptive's stream 1.25x behind the fixed one, about
140 us a call more than its re-timed price. spmm's walls lost the same way with
``cublas_dense`` on two of eight inputs. A stream whose device is busy hides the host's
issuing of a call, unless the call waits for the device.

For each candidate here this prints the host's time to issue one pinned call (``launch``
with ``variant=``/``config=``; the median of ``--reps``), on an idle device and behind a
spin kernel of ``--spin-ms`` queued on the same stream. A call that waits for the device
takes about the spin's time behind it. ``--backend host`` runs the same code without the
spin (a dry run: the numbers mean nothing there).

    PYTHONPATH=$PWD python3 benchmarks/probe_blocking.py     # H200, about 15 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (op, dims, stats, params, candidates by variant name on the cuda backend)
CASES = [
    ("attention", {"B": 2, "H": 4, "Lq": 128, "Lk": 128, "D": 64}, {}, {},
     ("sdpa_torch", "three_pass", "flash_mma")),
    ("attention", {"B": 2, "H": 4, "Lq": 1024, "Lk": 1024, "D": 64}, {}, {},
     ("sdpa_torch", "three_pass", "flash_mma")),
    ("spmm", {"M": 2048, "N": 16, "K": 2048}, {"density": 0.5, "block": 0}, {},
     ("cublas_dense", "csr_rowsplit", "cusparse_csr")),
    ("gemm", {"M": 64, "N": 256, "K": 1024}, {}, {}, ("cublas", "splitk", "simt_tiled")),
    ("softmax", {"R": 64, "C": 4096}, {}, {}, ("reg_row", "block_row")),
]
HOST = {"attention": ("host_materialised", "host_chunked"), "spmm": ("host_dense",),
        "gemm": ("host_blas",), "softmax": ("host_numpy",)}

_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda", choices=("cuda", "host"))
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--spin-ms", type=float, default=2.0)
    args = p.parse_args(argv)
    from adaptive import arrays
    from adaptive.dispatch import Dispatcher
    from adaptive.ops import OPS
    from adaptive.policy import MeasureEach
    d = Dispatcher(args.backend, policy=MeasureEach())
    sync = d.backend.synchronize
    spin = _spinner(args.backend, args.spin_ms)
    rng = np.random.default_rng(0)
    print(f"us to issue one pinned call (median of {args.reps}): idle device | behind a "
          f"{args.spin_ms:g} ms spin on its stream" + ("" if spin else " (no spin here)"))
    for op_name, dims, stats, params, names in CASES:
        op = OPS[op_name]
        inputs = op.make_inputs(dims, "float32", rng, **stats)
        inputs = arrays.to_cuda(inputs) if args.backend == "cuda" else inputs
        cands = d.candidates(op_name, *inputs, **params)
        wanted = names if args.backend == "cuda" else HOST[op_name]
        for name in wanted:
            cand = next((c for c in cands if c.variant.name == name), None)
            if cand is None:
                print(f"{op_name} {dims}: no {name} candidate here; skipped")
                continue

            def call(c=cand):
                d.launch(op_name, *inputs, variant=c.variant.name, config=c.config, **params)
            for _ in range(3):   # warm: the plan, its first launch, the library's first call
                call()
            sync()
            idle, behind = [], []
            for _ in range(args.reps):
                sync()
                t0 = time.perf_counter_ns()
                call()
                idle.append((time.perf_counter_ns() - t0) / 1e3)
                sync()
                if spin is not None:
                    spin()
                    t0 = time.perf_counter_ns()
                    call()
                    behind.append((time.perf_counter_ns() - t0) / 1e3)
                    sync()
            waits = behind and statistics.median(behind) > 0.5 * args.spin_ms * 1e3
            print(f"{op_name:<9} {_describe(dims, stats):<34} {cand.label:<44.44} "
                  f"{statistics.median(idle):>8.1f} | "
                  + (f"{statistics.median(behind):>8.1f}" if behind else "       -")
                  + ("  WAITS for the device" if waits else ""))
    return 0


def _spinner(backend: str, ms: float):
    """A callable queueing a kernel that spins about ``ms`` on the current stream (None on
    the host backend)."""
    if backend != "cuda":
        return None
    import cupy as cp
    kernel = cp.RawKernel(_SPIN, "spin")
    rate = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0)  # kHz
    cycles = np.int64(ms * rate)
    return lambda: kernel((1,), (1,), (cycles,))


def _describe(dims, stats) -> str:
    return ",".join(f"{k}={v}" for k, v in {**dims, **stats}.items())


if __name__ == "__main__":
    raise SystemExit(main())
