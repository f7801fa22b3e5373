"""Probe (run S106): what an ungated CUDA event pair reads around one call on a stream
the caller has just synchronised, against the same call behind the dispatcher's gate.
Run S104 read cuBLAS from CuPy at 0.6-1.0 ms that way for 0.03 ms of kernels.

    PYTHONPATH=$PWD python3 benchmarks/probe_ungated.py        # H200, a few seconds

Per way: cupy.matmul (cuBLAS) fp16 16x4096 @ 4096x4096, the same through torch.matmul,
and a CuPy elementwise kernel; each timed 30 times ungated after a device synchronise,
30 times ungated after a synchronise and a 2 ms host sleep (the device idles longer),
and 30 times gated (CudaBackend.device_timer); min / median / max in ms, and the host's
issuing of the call (perf_counter around it) beside.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(reps: int = 30) -> None:
    import cupy as cp
    import torch

    from adaptive.backends.cuda import CudaBackend
    be = CudaBackend()
    a = cp.random.standard_normal((16, 4096)).astype(cp.float16)
    b = cp.random.standard_normal((4096, 4096)).astype(cp.float16)
    out = cp.empty((16, 4096), cp.float16)
    ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
    ways = {"cupy.matmul": lambda: cp.matmul(a, b, out=out),
            "torch.matmul": lambda: torch.matmul(ta, tb),
            "cupy elementwise": lambda: cp.multiply(a, 2, out=out)}
    stream = cp.cuda.get_current_stream()
    for name, fn in ways.items():
        for _ in range(5):
            fn()
        cp.cuda.Device().synchronize()
        rows = {}
        for mode in ("ungated", "ungated after 2 ms idle", "gated"):
            times, issue = [], []
            timer = be.device_timer(stream.ptr, gated=(mode == "gated"))
            for _ in range(reps):
                cp.cuda.Device().synchronize()
                if mode.endswith("idle"):
                    time.sleep(0.002)

                def run():
                    t0 = time.perf_counter()
                    fn()
                    issue.append((time.perf_counter() - t0) * 1e3)
                times.append(timer(run))
            rows[mode] = (min(times), statistics.median(times), max(times),
                          statistics.median(issue))
        for mode, (lo, med, hi, iss) in rows.items():
            print(f"{name:>17} {mode:>24}: min {lo:.4f} median {med:.4f} max {hi:.4f} ms; "
                  f"issuing median {iss:.4f} ms", flush=True)


if __name__ == "__main__":
    main()
