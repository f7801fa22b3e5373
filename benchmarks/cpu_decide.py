"""A miss's decision, timed: ``Learned.decide`` with the model fitted on the shipped pack,
on corpus inputs of each op (what a new input class costs the calling thread before its
first call runs).

    PYTHONPATH=$PWD python benchmarks/cpu_decide.py
    PYTHONPATH=$PWD python benchmarks/cpu_decide.py --corpus ../shared/data/h200-corpus
    PYTHONPATH=$PWD python benchmarks/cpu_decide.py --cold --off-thread

For each op, the 4th input of the corpus pack (its rows name the candidates, as a replay
does) is decided ``--repeats`` times by a fresh policy sharing one fitted model; prints the
minimum and median ms and the candidate count, and the minimum ms of listing the
candidates a miss decides among (every built-in CUDA variant's configs for the device,
kept by the input's requirements). ``--against-dicts``: every other decide ranks the rows
as a list of dicts (how misses did before :class:`adaptive.policy.features.Rows`), the two
alternating in one process, both printed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pack", default=str(ROOT / "adaptive" / "packs" / "h200.msgpack"))
    p.add_argument("--corpus", default=str(ROOT.parent / "shared" / "data" / "h200-corpus"))
    p.add_argument("--ops", default="spmm,gemm,softmax,attention")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--coverage", action="store_true",
                   help="instead of timing: for every corpus input of each op, whether the "
                   "miss's exploration list holds a candidate within 5%% of the input's "
                   "best (what the shipped pack's model leaves unexplored), the worst listed")
    p.add_argument("--cold", action="store_true",
                   help="before each decide, sweep 64 MiB of memory and 200,000 new Python "
                   "objects through the caches (a live stream's miss meets caches that "
                   "served other work, not its own previous decide)")
    p.add_argument("--off-thread", action="store_true",
                   help="instead of timing: each decide on a thread of its own (as off the "
                   "calling thread) while this one wakes every 50 us: the longest wait for "
                   "the interpreter per decide, median and worst (with --cold: what a "
                   "serving thread waits out beside a miss's decide)")
    p.add_argument("--against-dicts", action="store_true",
                   help="every other decide ranks the rows as a list of dicts (before "
                   "features.Rows), both printed")
    args = p.parse_args(argv)
    from adaptive.bench import replay as R
    from adaptive.limits import for_fingerprint
    from adaptive.ops import OPS
    from adaptive.packs.format import read_pack
    from adaptive.policy.cost_model import CostModel, LiveModel, training_set
    from adaptive.policy.features import row_geometry
    from adaptive.policy.learned import Learned, Neighbours
    from adaptive.regen.shapes import make_inputs
    from adaptive.space import as_config
    from adaptive.variants import default_registry, make_candidate
    ship = read_pack(args.pack)
    limits = for_fingerprint(ship.fingerprint)
    variants = {(v.op, v.name): R._as_registered(v) for v in ship.variants}
    rows = [r for r in ship.rows if (r.op, r.variant) in variants]
    ts = training_set(rows, geometry=lambda r: row_geometry(variants[(r.op, r.variant)], r,
                                                             limits))
    live = LiveModel(background=False, refit_every=1 << 30)
    live.model = CostModel().fit(ts.rows, ts.y, groups=ts.groups)
    near = Neighbours()
    for r in rows:
        near.add(r.op, r.dtype, r.features, r.variant, as_config(r.config), r.time_ms)
    for op in args.ops.split(","):
        path = Path(args.corpus) / f"h200-wide-{op}.msgpack"
        if not path.exists():
            print(f"{op}: no corpus pack at {path}")
            continue
        corpus = read_pack(path)
        known = {(v.op, v.name): R._as_registered(v) for v in corpus.variants}
        groups = R._group([r for r in corpus.rows if (r.op, r.variant) in known])
        if args.coverage:
            _coverage(op, groups, known, live, near, limits)
            continue
        key, group = sorted(groups.items())[3]
        cands = [make_candidate(known[(r.op, r.variant)], r.config) for r in group]
        if args.off_thread:
            _waits(op, lambda: _decide_fresh(live, near, group, key, limits, cands), args)
            continue
        times, as_dicts = [], []
        for i in range(args.repeats):
            # every other decide (with --against-dicts) ranks the rows as a list of dicts,
            # as misses did before features.Rows: the two alternate in one process
            dicts = args.against_dicts and i % 2 == 1
            policy = Learned(live, explore_budget=None)
            policy.neighbours = near.copy()
            if args.cold:
                _sweep_caches()
            t0 = time.perf_counter()
            with _rows_as_dicts(dicts):
                policy.decide(R._Context(group[0], key, limits), cands)
            (as_dicts if dicts else times).append((time.perf_counter() - t0) * 1e3)
        if as_dicts:
            print(f"{op:<10} {len(cands):>4} candidates: decide, rows as a list of dicts: min "
                  f"{min(as_dicts):.2f} ms, median {statistics.median(as_dicts):.2f} ms")
        # listing the candidates the miss decides among: every built-in CUDA variant's
        # configs for this device, kept by the input's requirements (Dispatcher._candidates)
        row = group[0]   # the input rebuilt from its row: the scope a live miss has
        params = ({"causal": bool(row.features["param_causal"])}
                  if "param_causal" in row.features else {})
        stats = {"density": row.features["density"]} if "density" in row.features else None
        inputs = make_inputs(OPS[op], row.dims, row.dtype if row.dtype != "bfloat16" else
                             "float16", 0, "normal", stats)
        scope = OPS[op].problem(inputs, params).scope() | {"dtype": row.dtype}
        pool = [(v, v.space.configs(limits)) for v in default_registry().variants(op, "cuda")]
        listed, each = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            kept = sum(len(v.fitting(scope, configs)) for v, configs in pool)
            listed.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()   # the same test config by config (before 2026-12-02)
            assert kept == sum(v.fits(scope, c) for v, configs in pool for c in configs)
            each.append((time.perf_counter() - t0) * 1e3)
        print(f"{op:<10} {len(cands):>4} candidates: decide min {min(times):.2f} ms, median "
              f"{statistics.median(times):.2f} ms; listing {kept} of "
              f"{sum(len(c) for _, c in pool)} configs min {min(listed):.2f} ms (config by "
              f"config {min(each):.2f} ms)")
    return 0


def _coverage(op, groups, known, live, near, limits) -> None:
    """Each corpus input of ``op`` decided as a miss (the shipped pack's model, a fresh
    policy): the best measured time among the candidates the decision runs or explores,
    over the input's best; prints the share within 5% and the five worst."""
    from adaptive.bench import replay as R
    from adaptive.policy.learned import Learned
    from adaptive.variants import make_candidate
    rows = []
    for key, group in sorted(groups.items()):
        cands = [make_candidate(known[(r.op, r.variant)], r.config) for r in group]
        policy = Learned(live, explore_budget=None)
        policy.neighbours = near.copy()
        d = policy.decide(R._Context(group[0], key, limits), cands)
        times = {(r.variant, tuple(sorted(r.config.items()))): r.time_ms for r in group}
        tried = [d.candidate, *(d.explore or ())]
        got = min(times[(c.variant.name, tuple(sorted(c.config.items())))] for c in tried)
        best = min(group, key=lambda r: r.time_ms)
        rows.append((got / best.time_ms, f"{dict(group[0].dims)} {group[0].dtype}",
                     best.variant, sorted({c.variant.name for c in tried})))
    within = sum(r[0] <= 1.05 for r in rows)
    print(f"{op:<10} {len(rows)} inputs: the best explored within 5% of the best on "
          f"{within} ({within / max(1, len(rows)):.0%}); worst:")
    for ratio, what, best, tried in sorted(rows, reverse=True)[:5]:
        print(f"  {ratio:.3f}x  {what}: best {best}, explored {', '.join(tried)}")


_SWEEP = None


def _decide_fresh(live, near, group, key, limits, cands) -> None:
    from adaptive.bench import replay as R
    from adaptive.policy.learned import Learned
    policy = Learned(live, explore_budget=None)
    policy.neighbours = near.copy()
    policy.decide(R._Context(group[0], key, limits), cands)


def _waits(op: str, decide, args) -> None:
    """Each decide on a thread of its own while this thread sleeps 50 us at a time: the
    longest gap between its wake-ups (the interpreter held by the decide), per decide."""
    import threading
    longest, took = [], []
    for _ in range(args.repeats):
        if args.cold:
            _sweep_caches()
        worker = threading.Thread(target=decide)
        t0 = time.perf_counter()
        gap = 0.0
        worker.start()
        last = time.perf_counter()   # (start() returns once the thread runs)
        while worker.is_alive():
            time.sleep(50e-6)
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
        took.append((time.perf_counter() - t0) * 1e3)
        longest.append(gap * 1e3)
    print(f"{op:<10} decide off the thread {statistics.median(took):.2f} ms (median); the "
          f"longest wait for the interpreter beside it: median {statistics.median(longest):.2f}"
          f" ms, worst {max(longest):.2f} ms")


def _sweep_caches() -> None:
    """Push the decide's code and data out of the CPU caches: read 64 MiB, make and drop
    200,000 small objects."""
    global _SWEEP
    import numpy as np
    if _SWEEP is None:
        _SWEEP = np.ones(8 << 20)
    float(_SWEEP.sum())
    junk = [(i, str(i)) for i in range(200_000)]
    del junk


@contextlib.contextmanager
def _rows_as_dicts(on: bool):
    """While open (``on``), a miss's rows reach the model as a list of dicts."""
    from adaptive.policy import features
    real = features.candidate_rows
    if on:
        features.candidate_rows = lambda *a, **k: list(real(*a, **k))
    try:
        yield
    finally:
        features.candidate_rows = real


if __name__ == "__main__":
    sys.exit(main())
