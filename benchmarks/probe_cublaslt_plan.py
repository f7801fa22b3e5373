"""Probe: the cuBLAS gemm of gemm's ``cublas`` and spmm's ``cublas_dense``
(:func:`adaptive.backends.cuda_blas.gemm`: cuBLASLt, each shape's plan kept) against what a
plain CuPy program calls (``cupy.matmul``) and ``torch.mm``, from CuPy arrays: device time
(events behind a spin kernel) and an eager loop's wall per call (50 calls back to back, one
synchronise, least of 5 rounds: the host's issuing where the kernel is short). Run S117
compared the kept plans, then a staged variant, with the ``cublasGemmEx`` call
``cuda_blas.gemm`` made until then.

    PYTHONPATH=$PWD python3 benchmarks/probe_cublaslt_plan.py      # H200, about 20 s
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (16, 2048, 2048), (128, 4096, 4096),
          (2048, 2048, 2048), (8, 512, 512)]


def main() -> None:
    import cupy as cp
    import torch

    from adaptive.backends.cuda_blas import gemm
    from benchmarks.gpu_sparse24 import loop_ms
    from benchmarks.gpu_spmm_attention import Timer
    timer, sync = Timer(cp), cp.cuda.Device().synchronize
    print(f"{'M x N x K':>18} {'dtype':>8}  device ms: cupy.matmul / kept plan / torch.mm   "
          f"eager loop ms: cupy.matmul / kept plan / torch.mm", flush=True)
    for dtype in ("float16", "float32"):
        for m, n, k in SHAPES:
            rng = cp.random.default_rng(m + n + k)
            a = rng.standard_normal((m, k), dtype=cp.float32).astype(dtype)
            b = (rng.standard_normal((k, n), dtype=cp.float32) / k ** 0.5).astype(dtype)
            out = cp.empty((m, n), dtype)
            ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
            ways = {"cupy": lambda: cp.matmul(a, b, out=out),
                    "plan": lambda: gemm(a, b, out),
                    "torch": lambda: torch.mm(ta, tb)}
            gemm(a, b, out)
            ref = a.astype(cp.float64) @ b.astype(cp.float64)
            err = float(cp.abs(out.astype(cp.float64) - ref).max() / cp.abs(ref).max())
            dev = {name: timer(fn) for name, fn in ways.items()}
            loop = loop_ms(ways, sync)
            print(f"{m:>5}x{n:>5}x{k:<5} {dtype:>8}  {dev['cupy']:.4f} / {dev['plan']:.4f} / "
                  f"{dev['torch']:.4f}   {loop['cupy']:.4f} / {loop['plan']:.4f} / "
                  f"{loop['torch']:.4f}   (max rel. error {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
