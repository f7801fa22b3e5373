"""spmm at the served model's MLP shapes: the BSR-32 tensor-core variants against dense cuBLAS.

    PYTHONPATH=$PWD python3 benchmarks/gpu_spmm_mlp.py --out $OUT      # H200, < 2.5 min
    PYTHONPATH=$PWD python3 benchmarks/gpu_spmm_mlp.py --cases bsr10 --out $OUT

Weights in 32x32 blocks, float16: first the served MLP shapes [14336, 4096] and
[4096, 14336] at 10% block density for N = 16, 64, 256, 512 (decode and prefill token
counts; issue 13's target: the best BSR variant >= 1.5x cuBLAS), then [16384, 4096] and
[4096, 16384] at 25% block density times b [K, N] for N = 128, 512, 2048 (sequence
lengths), plus [8192, 8192] at 10%, N = 256 (the point where the single-row BSR kernels
were L2-bound: bsr32_mma 0.0361 ms vs cuBLAS 0.0447 ms). ``--cases bsr10`` runs only the
first set, ``--cases bsr25`` only the second; the budget stops what is left. Every config
of each variant is timed as in gpu_spmm_attention.py (warm-up, batches between CUDA events
behind a spin kernel, median of 5); the best config is named.
Writes ``gpu_spmm_mlp.json`` to ``--out``; prints a table (ms), then each row's best BSR
variant and the grouped kernels as ratios to cuBLAS (higher is faster), then the 10% targets.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_spmm_attention import Timer, _best, _table, _weight  # noqa: E402

CASES_10 = [(m, k, 0.1, n) for m, k in ((14336, 4096), (4096, 14336)) for n in (16, 64, 256, 512)]
TARGET_10 = 1.5     # best BSR variant / cuBLAS at 10% blocks, N = 16..512 (issue 13)
CASES = [  # M, K, block density, N (the first four first: the budget may stop the rest)
    (8192, 8192, 0.1, 256),
    (16384, 4096, 0.25, 512),
    (4096, 16384, 0.25, 512),
    (16384, 4096, 0.25, 128),
    (16384, 4096, 0.25, 2048),
    (4096, 16384, 0.25, 128),
    (4096, 16384, 0.25, 2048),
]
QUICK = [(1024, 512, 0.25, 256), (512, 1024, 0.1, 64)]
GROUPED = ("bsr32_grouped_mma", "bsr32_grouped4_mma", "bsr32_grouped_splitk_mma")


def _timed_variants(dispatcher) -> list:
    """cuBLAS dense and every BSR-32 tensor-core variant (the others lose at these sizes)."""
    return [v for v in dispatcher.registry.variants("spmm", "cuda")
            if v.name == "cublas_dense" or (v.name.startswith("bsr32") and "mma" in v.name)]


def bench(cp, dispatcher, timer, cases, budget_s: float) -> list[dict]:
    rng = np.random.default_rng(0)
    variants = _timed_variants(dispatcher)
    rows, t_start = [], time.perf_counter()
    weights = {}   # one weight per (M, K, density), built when first needed
    for m, k, density, n in cases:
        if time.perf_counter() - t_start > budget_s:
            print(f"budget of {budget_s:.0f} s spent: M={m} K={k} d={density} N={n} not timed",
                  flush=True)
            continue
        if (m, k, density) not in weights:
            weights[(m, k, density)] = _weight(cp, rng, m, k, density, 32)
        w = weights[(m, k, density)]
        b = cp.asarray((rng.standard_normal((k, n)) / math.sqrt(density * k)).astype(np.float16))
        row = {"M": m, "K": k, "density": density, "N": n,
               "block_density_32": w.block_density[32], "times_ms": {}, "configs": {}}
        for v in variants:
            t, cfg = _best(timer, dispatcher, "spmm", (w, b), {}, v, dispatcher.limits)
            if math.isfinite(t):
                row["times_ms"][v.name] = t
                row["configs"][v.name] = cfg
        rows.append(row)
        top = sorted(row["times_ms"].items(), key=lambda x: x[1])[:4]
        print(f"spmm M={m} K={k} d={density} N={n}: " +
              ", ".join(f"{name}={t:.4f}" for name, t in top), flush=True)
    return rows


def ratios(rows: list[dict]) -> list[str]:
    """Per row: cuBLAS time over the best BSR variant's and over each grouped kernel's."""
    lines = []
    for r in rows:
        t = r["times_ms"]
        dense = t.get("cublas_dense")
        bsr = {name: v for name, v in t.items() if name != "cublas_dense"}
        if not dense or not bsr:
            continue
        best = min(bsr, key=bsr.get)
        single = {name: v for name, v in bsr.items() if name not in GROUPED}
        parts = [f"best {best} {bsr[best]:.4f} ms = {dense / bsr[best]:.2f}x cuBLAS "
                 f"({dense:.4f} ms)"]
        if single:
            s = min(single, key=single.get)
            parts.append(f"best single-row {s} {dense / single[s]:.2f}x")
        parts += [f"{g} {dense / t[g]:.2f}x {r['configs'][g]}" for g in GROUPED if g in t]
        lines.append(f"M={r['M']} K={r['K']} d={r['density']} N={r['N']}: " + "; ".join(parts))
    return lines


def targets(rows: list[dict]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for the 10%-block MLP rows: best BSR >= 1.5x cuBLAS."""
    out = []
    for r in rows:
        if (r["M"], r["K"], r["density"], r["N"]) not in CASES_10:
            continue
        t = r["times_ms"]
        bsr = {name: v for name, v in t.items() if name != "cublas_dense"}
        if "cublas_dense" not in t or not bsr:
            continue
        best = min(bsr, key=bsr.get)
        ratio = t["cublas_dense"] / bsr[best]
        out.append((f"M={r['M']} K={r['K']} 10% blocks N={r['N']}: best BSR >= {TARGET_10}x "
                    "cuBLAS", f"{ratio:.2f}x ({best})", ratio >= TARGET_10))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for gpu_spmm_mlp.json")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--cases", default="all", choices=("all", "bsr10", "bsr25"),
                        help="the 10%%-block MLP shapes, the 25%% ones, or both (10%% first)")
    parser.add_argument("--budget-s", type=float, default=130.0,
                        help="start no new shape after this many seconds")
    args = parser.parse_args(argv)
    import cupy as cp
    from adaptive.dispatch import Dispatcher
    dispatcher = Dispatcher(backend="cuda")
    timer = Timer(cp)
    t0 = time.perf_counter()
    cases = {"all": CASES_10 + CASES, "bsr10": CASES_10, "bsr25": CASES}[args.cases]
    rows = bench(cp, dispatcher, timer, QUICK if args.quick else cases, args.budget_s)
    result = {"device": dispatcher.backend.fingerprint(), "spmm": rows,
              "wall_s": time.perf_counter() - t0}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gpu_spmm_mlp.json.tmp"
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(out / "gpu_spmm_mlp.json")
    names = sorted({name for r in rows for name in r["times_ms"]})
    print("\nspmm, float16, 32x32 blocks, median ms per call")
    print(_table(rows, ["M", "K", "density", "N"], names))
    print(f"\nwall {result['wall_s']:.0f} s")
    print("\ncuBLAS dense time / variant time (higher is faster):")
    print("\n".join(ratios(rows)))
    print("\nBSR targets (issue 13), this run:")
    for target, measured, met in targets(rows):
        print(f"  [{'met' if met else 'NOT met'}] {target}: {measured}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
