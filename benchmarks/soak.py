"""Soak: millions of host launches over a few hot keys and a stream of distinct shapes, to
show that a long-running process's memory stops growing and the plan cache keeps its bound.

The launches are softmax on small float32 inputs: ``--hot`` hot shapes launched
round-robin, and every ``launches / shapes``-th launch a shape never seen before (each
one a miss, a decision and, once the cache is full, an eviction). Every fifth of the run
reports resident memory (after ``gc.collect()``), plans held, evictions and launch rate;
growth is measured from the end of the warm-up (the first ``--warmup`` fraction), and
the run passes when it is below ``--max-growth-mb`` with the plan cache at its bound.
Issue 19's full run (minutes to hours, depending on the machine):

    python benchmarks/soak.py                    # 10,000,000 launches, 100,000 shapes
    python benchmarks/soak.py --quick            # 60,000 launches, 1,500 shapes, bound 256
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adaptive import Dispatcher, config  # noqa: E402


def rss_bytes() -> int:
    """Resident set size of this process now (Linux ``/proc``; else peak RSS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _shape(i: int) -> tuple[int, int]:
    """The i-th distinct cold shape (never one of the hot ones: R >= 5)."""
    return 5 + i % 7, 9 + i // 7


def soak(launches: int, shapes: int, hot: int = 8, plan_cache_size: int | None = None,
         policy: str | None = None, warmup: float = 0.2, reports: int = 5,
         progress=print) -> dict:
    """Run the soak; a dict with the per-report rows and the verdict's numbers."""
    changes = {"plan_cache_size": plan_cache_size} if plan_cache_size else {}
    if policy:
        changes["policy"] = policy
    with config.override(**changes):
        d = Dispatcher("host")
    bound = d.plan_cache_size
    rng = np.random.default_rng(0)
    hots = [rng.standard_normal((1 + i % 4, 16 + 8 * i)).astype(np.float32)
            for i in range(hot)]
    every = max(1, launches // max(shapes, 1))
    run = d.run
    rows, base, cold, wrong = [], None, 0, 0
    marks = sorted({int(launches * warmup)} | {launches * k // reports
                                                for k in range(1, reports + 1)})
    t_mark, done, check_x = time.perf_counter(), 0, hots[0]
    check_ref = np.exp(check_x.astype(np.float64) - check_x.max(axis=1, keepdims=True))
    check_ref /= check_ref.sum(axis=1, keepdims=True)
    for mark in marks:
        for i in range(done, mark):
            if i % every == 0 and cold < shapes:
                x = np.ones(_shape(cold), np.float32)
                cold += 1
                run("softmax", (x,), None, {})
            else:
                run("softmax", (hots[i % hot],), None, {})
        got = run("softmax", (check_x,), None, {})
        wrong += not np.allclose(got, check_ref, rtol=1e-5, atol=1e-7)
        now = time.perf_counter()
        gc.collect()
        rss = rss_bytes()
        if base is None and mark >= int(launches * warmup):
            base = rss
        row = {"launches": mark, "distinct": cold + hot, "plans": len(d._plans),
               "prepared": len(d._prepared), "evictions": d.stats["plan_evictions"],
               "misses": d.stats["misses"], "rss_mb": rss / 2**20,
               "growth_mb": (rss - base) / 2**20 if base is not None else float("nan"),
               "launches_per_s": (mark - done) / (now - t_mark)}
        rows.append(row)
        if progress:
            progress(_row_text(row))
        done, t_mark = mark, time.perf_counter()
    growth = rows[-1]["growth_mb"]
    return {"rows": rows, "bound": bound, "growth_mb": growth, "wrong_checks": wrong,
            "plans_at_bound": rows[-1]["plans"] == bound, "policy": d.policy.name}


HEADER = (f"{'launches':>11} {'distinct':>9} {'plans':>6} {'prepared':>8} {'evictions':>9} "
          f"{'misses':>8} {'rss_mb':>8} {'growth_mb':>9} {'launches/s':>10}")


def _row_text(r: dict) -> str:
    return (f"{r['launches']:>11,} {r['distinct']:>9,} {r['plans']:>6} {r['prepared']:>8} "
            f"{r['evictions']:>9,} {r['misses']:>8,} {r['rss_mb']:>8.1f} "
            f"{r['growth_mb']:>9.2f} {r['launches_per_s']:>10.0f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=10_000_000)
    p.add_argument("--shapes", type=int, default=100_000, help="distinct cold shapes")
    p.add_argument("--hot", type=int, default=8, help="hot shapes")
    p.add_argument("--plan-cache-size", type=int, default=None,
                   help="default: ADAPTIVE_PLAN_CACHE_SIZE")
    p.add_argument("--policy", default=None, help="default: ADAPTIVE_POLICY")
    p.add_argument("--warmup", type=float, default=0.2, help="fraction before the baseline")
    p.add_argument("--max-growth-mb", type=float, default=20.0)
    p.add_argument("--quick", action="store_true",
                   help="60,000 launches, 1,500 shapes, plan cache 256")
    args = p.parse_args(argv)
    if args.quick:
        args.launches, args.shapes = 60_000, 1_500
        args.plan_cache_size = args.plan_cache_size or 256
    print(f"soak: {args.launches:,} host softmax launches, {args.hot} hot shapes, "
          f"{args.shapes:,} distinct shapes; RSS growth measured after {args.warmup:.0%}")
    print(HEADER)
    t0 = time.perf_counter()
    r = soak(args.launches, args.shapes, args.hot, args.plan_cache_size, args.policy,
             args.warmup)
    ok = r["growth_mb"] < args.max_growth_mb and r["plans_at_bound"] and not r["wrong_checks"]
    at = "at" if r["plans_at_bound"] else "NOT at"
    print(f"policy {r['policy']}, plan cache bound {r['bound']}: {at} its bound; RSS growth "
          f"after warm-up {r['growth_mb']:.2f} MB (limit {args.max_growth_mb} MB); wrong "
          f"results {r['wrong_checks']}; {time.perf_counter() - t0:.0f} s: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
