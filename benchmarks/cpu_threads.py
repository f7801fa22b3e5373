"""Threaded host callers: throughput of many threads launching host ops at once, with
default settings against ``ADAPTIVE_MAX_THREADS=1`` (one BLAS thread per call).

Each thread launches gemm, attention and softmax in turn on its own inputs and checks
every ``--check-every``-th result against a float64 reference; each setting gets a
fresh dispatcher and a warm-up (the misses) before the timed launches. Issue 19 asks the
default to reach >= 70% of the one-thread setting's throughput:

    python benchmarks/cpu_threads.py [--threads 16] [--launches 2000] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adaptive import Dispatcher, config  # noqa: E402
from adaptive.ops import OPS  # noqa: E402

# (op, dims): small enough that a launch is ~0.1 ms, large enough that BLAS threads matter
WORK = (("gemm", {"M": 96, "N": 128, "K": 160}), ("attention", {"B": 1, "H": 2, "Lq": 48,
                                                                  "Lk": 64, "D": 32}),
        ("softmax", {"R": 64, "C": 200}))
TOLERANCE = 1e-4   # relative, float32 against float64


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for op, dims in WORK:
        args = OPS[op].make_inputs(dims, "float32", rng)
        ref = OPS[op].reference(*args)
        out.append((op, args, ref))
    return out


def _worker(d: Dispatcher, work, launches: int, check_every: int, errors: list, start,
            done: list):
    start.wait()
    t0 = time.perf_counter()
    worst = 0.0
    for i in range(launches):
        op, args, ref = work[i % len(work)]
        result = d.launch(op, *args)
        if i % check_every == 0:
            err = float(np.linalg.norm(result - ref) / np.linalg.norm(ref))
            worst = max(worst, err)
    done.append((time.perf_counter() - t0, worst))
    if worst > TOLERANCE:
        errors.append(f"relative error {worst:.2e} > {TOLERANCE}")


def run(threads: int, launches: int, max_threads: int = 0, check_every: int = 16,
        warmup: int = 30, policy=None) -> dict:
    """Launches per second of ``threads`` threads × ``launches`` each on a fresh host
    dispatcher (default policy unless given), with ``ADAPTIVE_MAX_THREADS=max_threads``
    (0: the default, all cores)."""
    with config.override(max_threads=max_threads):
        d = Dispatcher("host", policy=policy)
    works = [_inputs(seed) for seed in range(threads)]
    for work in works:                      # the misses and the policy's exploration
        for i in range(warmup):
            op, args, _ = work[i % len(work)]
            d.launch(op, *args)
    errors: list = []
    done: list = []
    start = threading.Barrier(threads + 1)
    pool = [threading.Thread(target=_worker, args=(d, w, launches, check_every, errors,
                                                   start, done)) for w in works]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    wall_s = time.perf_counter() - t0
    return {"setting": f"ADAPTIVE_MAX_THREADS={max_threads}" if max_threads else "default",
            "threads": threads, "launches": threads * launches, "wall_s": wall_s,
            "launches_per_s": threads * launches / wall_s,
            "worst_rel_error": max(w for _, w in done), "errors": errors,
            "blas_threads_after": d.backend._threads}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--launches", type=int, default=2000, help="per thread")
    p.add_argument("--policy", default=None, help="default: ADAPTIVE_POLICY")
    p.add_argument("--quick", action="store_true", help="4 threads x 100 launches")
    args = p.parse_args(argv)
    if args.quick:
        args.threads, args.launches = 4, 100
    from adaptive.policy import make_policy
    rows = [run(args.threads, args.launches, max_threads=m,
                policy=make_policy(args.policy) if args.policy else None) for m in (1, 0)]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{args.threads} threads x {args.launches} host launches (gemm, attention, softmax), "
          f"{cpus} cores")
    print(f"{'setting':<26} {'launches':>9} {'wall_s':>8} {'launches/s':>11} {'max rel err':>12}")
    for r in rows:
        print(f"{r['setting']:<26} {r['launches']:>9} {r['wall_s']:>8.2f} "
              f"{r['launches_per_s']:>11.0f} {r['worst_rel_error']:>12.1e}")
    ratio = rows[1]["launches_per_s"] / rows[0]["launches_per_s"]
    print(f"default / one BLAS thread: {ratio:.2f} (target >= 0.70)")
    bad = [e for r in rows for e in r["errors"]]
    for e in bad:
        print("WRONG RESULT:", e)
    return 1 if bad or ratio < 0.7 else 0


if __name__ == "__main__":
    sys.exit(main())
