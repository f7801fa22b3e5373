"""Selection benchmark on the GPU: oracle, best fixed, autotune, measure-each, learned.

    PYTHONPATH=$PWD python3 benchmarks/gpu_selection.py --out $OUT      # H200, ~2 min
    python benchmarks/gpu_selection.py --backend host --quick            # a dry run on CPU

Runs :func:`adaptive.bench.selection.run_selection` (three seeded streams: decode-heavy, a
long-sequence burst, a uniform mix). Every (input, candidate) pair is timed once up
front; oracle, best-fixed and autotune are replayed from that table, measure-each and
the learned policy (cold, from a pack of other inputs, and from the shipped pack when
one was measured on this device) run live through ``Dispatcher.launch``. Writes
``gpu_selection.json`` to ``--out``, prints the table, then the targets met or not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda", choices=("cuda", "host", "auto"))
    parser.add_argument("--quick", action="store_true", help="short streams, small inputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.environ.get("OUT", "."),
                        help="folder for gpu_selection.json (default: $OUT or .)")
    parser.add_argument("--learned", action="append", default=[], metavar="NAME=VALUE",
                        help="a keyword argument of every live learned policy (a number "
                             "or None), e.g. --learned race_ratio=1.5; repeatable")
    parser.add_argument("--plot", default=None, metavar="IMAGE",
                        help="also draw steady/oracle, tuning runs and first result per "
                             "stream into IMAGE (needs matplotlib)")
    parser.add_argument("--from-json", default=None, metavar="FILE",
                        help="run nothing: print and draw (--plot) the run saved in FILE, "
                             "a gpu_selection.json (on any machine)")
    args = parser.parse_args(argv)
    if args.plot is not None:
        from adaptive import plots
        plots.check_output(args.plot)       # before the run, not after it
    if args.from_json is not None:
        from adaptive.bench.selection import SelectionReport
        report = SelectionReport.from_dict(json.loads(Path(args.from_json).read_text()))
        print(report)
        if args.plot is not None:
            plots.save(plots.bench_figure(selection=report)[0], args.plot)
            print(f"wrote {args.plot}")
        return 0
    from adaptive.bench import policy_argument
    learned = {}
    for item in args.learned:
        try:
            learned.update([policy_argument(item)])
        except ValueError as exc:
            parser.error(f"--learned {exc}")
    from adaptive.bench.selection import run_selection
    if learned:
        print("  learned policies with " + ", ".join(f"{k}={v}" for k, v in learned.items()),
              flush=True)
    t0 = time.perf_counter()
    try:
        report = run_selection(args.backend, quick=args.quick, seed=args.seed,
                               progress=lambda s: print("  " + s, flush=True),
                               learned=learned)
    except Exception as exc:  # noqa: BLE001 (report why, for the GPU check's log)
        print(f"gpu_selection: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    wall_s = time.perf_counter() - t0
    print(report)
    print(f"wall time {wall_s:.1f} s")
    data = dataclasses.asdict(report)
    data["accuracy"] = dataclasses.asdict(report.accuracy)
    data["wall_s"] = wall_s
    data["steady_ratio"] = {p: report.steady_ratio(p) for p in
                            ("best-fixed", "measure-each", "learned-cold", "learned-pack")
                            + (("learned-shipped",) if report.shipped else ())}
    data["targets"] = report.targets()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gpu_selection.json.tmp"
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, out / "gpu_selection.json")
    print("\nselection targets (issues 5 and 7), this run:")
    print(report.targets_table())
    if args.plot is not None:
        plots.save(plots.bench_figure(selection=report)[0], args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
