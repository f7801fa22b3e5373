"""Probe: torch's 2:4 path (``torch._cslt_sparse_mm``, a plan built every call) against the
staged cuSPARSELt variant that keeps its plans (variants/spmm/cusparselt_plan.py) and dense
cuBLAS, in device time (events behind a spin kernel) and in an eager loop's wall per call
(50 calls back to back, one synchronise, least of 5 rounds). The staged variant joins the
manifest once this and tests/gpu/test_spmm_cusparselt_plan_cuda.py pass on a GPU.

    PYTHONPATH=$PWD python3 benchmarks/probe_cusparselt_plan.py      # H200, about 30 s
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [(14336, 4096), (4096, 14336), (4096, 4096)]
TOKENS = [1, 16, 64, 256, 2048]


def main() -> None:
    import cupy as cp
    import torch

    from adaptive.ops.sparse import SparseWeight
    from adaptive.variants import builtin_folder
    from benchmarks.gpu_sparse24 import loop_ms
    from benchmarks.gpu_spmm_attention import Timer
    path = builtin_folder() / "spmm" / "cusparselt_plan.py"
    spec = importlib.util.spec_from_file_location("cusparselt_plan_staged", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    timer, sync = Timer(cp), torch.cuda.synchronize
    print(f"{'M x K':>12} {'N':>5}  device ms: dense / torch 2:4 / kept plans   "
          f"eager loop ms: dense / torch 2:4 / kept plans", flush=True)
    for m, k in SHAPES:
        dense = torch.randn((m, k // 4, 4), device="cuda", dtype=torch.float16)
        keep = torch.zeros_like(dense, dtype=torch.bool)
        keep.scatter_(2, dense.abs().topk(2, dim=2).indices, True)
        dense = torch.where(keep, dense, torch.zeros_like(dense)).reshape(m, k).contiguous()
        w = SparseWeight(cp.from_dlpack(dense), dtype="float16")
        packed = torch._cslt_compress(dense)
        for n in TOKENS:
            b = torch.randn((k, n), device="cuda", dtype=torch.float16) / math.sqrt(k / 2)
            n8 = n + (-n) % 8
            pad = torch.zeros((k, n8), device="cuda", dtype=torch.float16)

            def torch24(b=b, n=n, n8=n8, pad=pad):
                if n8 == n:
                    return torch._cslt_sparse_mm(packed, b)
                pad[:, :n] = b
                return torch._cslt_sparse_mm(packed, pad)[:, :n].contiguous()
            ways = {"dense": lambda b=b: torch.matmul(dense, b), "torch24": torch24,
                    "plans": lambda b=b: mod.spmm_cusparselt_plan_torch(w, b)}
            ref = (dense.double() @ b.double())
            err = float((ways["plans"]().double() - ref).abs().max() / ref.abs().max())
            dev = {name: timer(fn) for name, fn in ways.items()}
            loop = loop_ms(ways, sync)
            print(f"{m:>6}x{k:<5} {n:>5}  {dev['dense']:.4f} / {dev['torch24']:.4f} / "
                  f"{dev['plans']:.4f}   {loop['dense']:.4f} / {loop['torch24']:.4f} / "
                  f"{loop['plans']:.4f}   (max rel. error {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
