"""The learned policy's exploring knobs, replayed on a pack with noisy samples (CPU).

    python benchmarks/cpu_replay_knobs.py [--pack adaptive/packs/h200.msgpack]
        [--ops attention,softmax] [--noise 0.05,0.05] [--fold-seeds 0,1,2]
        [--set NAME:KEY=VALUE,...]...

For each setting (the default policy first, then each ``--set``: a name and keyword
arguments of :class:`adaptive.policy.learned.Learned`) the pack is replayed held out by
input (``adaptive.bench.replay``, 10 folds), each explored sample being the pack's time
with log-normal noise and occasional 1.5-3x outliers (``--noise SIGMA,OUTLIERS``, seeded
per input: every setting meets the same draws in the same order of calls). Per op it
(and for attention, prefills and single-token decodes apart) prints committed/best
geomean, the share within 5%, the worst input and the tuning share:
timed exploring calls over exhaustive autotune's runs (4 a candidate), the selection
benchmark's "tuning runs" (issue 14's bar: under 10%).

A development tool on the H200's measurements: a knob that lowers the tuning share here
without moving the commits is a candidate for the GPU's selection run, where the figures
that count are measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _setting(text: str) -> tuple[str, dict]:
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected NAME:KEY=VALUE,...")
    from adaptive.bench import policy_argument
    try:
        return name, dict(policy_argument(item) for item in filter(None, rest.split(",")))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--set {text!r}: {exc}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack", default=str(ROOT / "adaptive" / "packs" / "h200.msgpack"))
    parser.add_argument("--ops", default="attention,softmax")
    parser.add_argument("--noise", default="0.05,0.05", help="SIGMA,OUTLIERS (none: exact)")
    parser.add_argument("--folds", type=int, default=10)
    parser.add_argument("--fold-seeds", default="0", metavar="S,S,...",
                        help="deal the folds with each seed in turn (default 0); with more "
                             "than one, each row is the mean over the dealings, within 5%% "
                             "with its least, worst the largest")
    parser.add_argument("--set", dest="settings", action="append", type=_setting,
                        default=[], metavar="NAME:KEY=VALUE,...")
    args = parser.parse_args(argv)
    noise = None
    if args.noise != "none":
        try:
            sigma, outliers = (float(x) for x in args.noise.split(","))
        except ValueError:
            parser.error(f"--noise {args.noise!r}: expected SIGMA,OUTLIERS, e.g. 0.05,0.05")
        noise = (sigma, outliers)
    try:
        seeds = [int(x) for x in args.fold_seeds.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--fold-seeds {args.fold_seeds!r}: expected whole numbers, e.g. 0,1,2")
    from adaptive.bench.replay import replay
    ops = [o for o in args.ops.split(",") if o]
    dealt = f"dealt with seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
    print(f"pack {args.pack}, ops {', '.join(ops)}, noise {noise}, {args.folds} folds by input "
          f"({dealt})", flush=True)
    within = "within 5%" if len(seeds) == 1 else "within 5% (least)"
    print(f"{'setting':<28} {'op':<14} {'inputs':>6} {'geomean':>8} {within:>9} "
          f"{'worst':>6} {'tuning':>7}")
    for name, kwargs in [("default", {}), *args.settings]:
        t0 = time.perf_counter()
        for op in ops:
            per_seed = [_rows(op, replay(args.pack, ops=[op], folds=args.folds, noise=noise,
                                         fold_seed=s, **kwargs)) for s in seeds]
            for label, reps in zip(per_seed[0], zip(*(r.values() for r in per_seed))):
                shares = [rep.within() for rep in reps]
                least = f" ({min(shares):.0%})" if len(seeds) > 1 else ""
                print(f"{name:<28} {label:<14} {len(reps[0].cases):>6} "
                      f"{statistics.fmean(rep.geomean_ratio() for rep in reps):>8.3f} "
                      f"{statistics.fmean(shares):>9.1%}{least} "
                      f"{max(rep.worst() for rep in reps):>5.2f}x "
                      f"{statistics.fmean(rep.tuning_share() for rep in reps):>7.1%}",
                      flush=True)
        print(f"  ({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


def _rows(op: str, r) -> dict:
    """label -> the report's rows to print: the op, and for attention prefills and
    single-token decodes apart (the selection's long-burst is prefills, Lq > 1)."""
    rows = {op: r}
    if op == "attention":
        rows[f"{op} Lq>1"] = dataclasses.replace(r, cases=tuple(
            c for c in r.cases if c.dims.get("Lq", 1) > 1))
        rows[f"{op} Lq=1"] = dataclasses.replace(r, cases=tuple(
            c for c in r.cases if c.dims.get("Lq", 1) == 1))
    return rows


if __name__ == "__main__":
    sys.exit(main())
