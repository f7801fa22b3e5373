"""Analyse a counter log: which variant ran where, how close to the roofline, and why.

    python examples/analyse_counter_log.py                   # records a small log first
    python examples/analyse_counter_log.py --log run.alog    # a log from a real server
                                                             # (ADAPTIVE_COUNTER_LOG=run.alog)

Prints the per-variant summary (the same as ``adaptive log show``), then three views
that summary does not give: the variant chosen per attention length (the crossover the
dispatcher learned), the inputs furthest from the roofline floor (what regeneration
would target), and, on a GPU, time against SM clock (throttling shows up here).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

import adaptive
from adaptive.counterlog import read_log, to_observations
from adaptive.counterlog.cli import summary_text


def record_demo_log(path: str) -> None:
    """Serve a few lengths of the example block on the host with every launch logged."""
    sys.path.insert(0, str(Path(__file__).parent / "server"))
    from block import BlockShape, build, input_activations
    shape = BlockShape()
    model = build(shape, "adaptive", "host", "float32")
    with adaptive.counter_log(path, sample_every=1) as clog:
        for length in (8, 60, 130, 300, 500) * 2:
            model(input_activations(shape, model.host_weights, seq_len=length, seed=length))
    print(f"recorded {clog.stats.written} launches to {path}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--log", help="counter log to read (default: record a demo log)")
    args = p.parse_args(argv)
    path = args.log or str(Path(tempfile.mkdtemp()) / "demo.alog")
    if args.log is None:
        record_demo_log(path)
    contents = read_log(path)
    records = [r for r in contents.records if r.get("time_ms", 0) > 0]
    print(summary_text(contents))

    print("\nattention: variant chosen per query length (calls), p50 time")
    by_length = defaultdict(list)
    for r in records:
        if r["op"] == "attention":
            by_length[r["dims"]["Lq"]].append(r)
    for length, recs in sorted(by_length.items()):
        chosen = Counter(r["variant"] + "".join(f"[{k}={v}]" for k, v in
                                                (r.get("config") or {}).items()) for r in recs)
        p50 = np.median([r["time_ms"] for r in recs])
        print(f"  Lq={length:<6} {chosen.most_common(1)[0][0]:<44} {p50:9.3f} ms")

    print("\nfurthest from the roofline floor (median floor/time per input):")
    groups = defaultdict(list)
    for r in records:
        if r.get("floor_ms"):
            groups[(r["op"], tuple(sorted(r["dims"].items())), r["variant"])].append(
                r["floor_ms"] / r["time_ms"])
    worst = sorted((float(np.median(v)), k) for k, v in groups.items())[:5]
    for frac, (op, dims, variant) in worst:
        print(f"  {frac:7.2%}  {op:<10} {dict(dims)}  {variant}")

    clocked = [(r["device_state"]["sm_clock_mhz"], r["time_ms"] / r["floor_ms"])
               for r in records if (r.get("device_state") or {}).get("sm_clock_mhz")
               and r.get("floor_ms")]
    if len(clocked) > 10:
        clock, slowdown = np.array(clocked).T
        print(f"\nSM clock {clock.min():.0f}-{clock.max():.0f} MHz; correlation of clock with "
              f"time/floor: {np.corrcoef(clock, slowdown)[0, 1]:+.2f}")
    rows = to_observations(contents)
    print(f"\n{len(rows)} records usable as cost-model training rows (source='log')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
