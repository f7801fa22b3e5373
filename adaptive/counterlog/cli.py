"""``adaptive log``: summarise, plot and export counter logs.

    adaptive log show run.alog                      # per op and variant: calls, p50/p99, roofline
    adaptive log plot run.alog -o run.png           # time against size by variant; clocks over time
    adaptive log export run.alog --format csv       # one row per record (stdout or -o FILE)
    adaptive log export run.alog --format parquet -o run.parquet   # needs the [parquet] extra
    adaptive log export run.alog --format trace -o run.json        # open in ui.perfetto.dev
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Iterable

from adaptive import plots
from adaptive.counterlog import CounterLogError, LogContents, ReadStats, iter_log, read_log
from adaptive.counterlog.export import (DEVICE_COLUMNS, FORMATS, write_csv, write_parquet,
                                        write_trace)

CSV_DEVICE_FIELDS = DEVICE_COLUMNS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="per op and variant: calls, p50/p99 time, roofline")
    show.add_argument("file")
    plot = sub.add_parser("plot", help="plot times against size and device state over time")
    plot.add_argument("file")
    plot.add_argument("-o", "--output", required=True,
                      help=f"image file ({', '.join('.' + e for e in plots.FORMATS)})")
    export = sub.add_parser("export", help="export records as CSV, Parquet or a Perfetto trace")
    export.add_argument("file")
    export.add_argument("--format", choices=FORMATS, default=None,
                        help="csv (one row per record), parquet (the same columns; needs the "
                             "[parquet] extra), trace (Chrome/Perfetto trace JSON)")
    export.add_argument("--csv", action="store_true", help="the same as --format csv")
    export.add_argument("-o", "--output", help="output file (default: stdout; parquet needs one)")
    for p in (show, plot, export):
        p.add_argument("--no-rotated", action="store_true",
                       help="read only FILE, not its rotated predecessors FILE.1, FILE.2, ...")


def run(args: argparse.Namespace) -> int:
    name = f"adaptive log {args.action}"
    try:
        if args.action == "plot":
            plots.check_output(args.output)
        if args.action == "export":
            return _export(args, name)
        if args.action == "show":                  # streamed: any size of log
            stats = ReadStats()
            rows = summarise(iter_log(args.file, not args.no_rotated, stats))
            print(_summary_text(rows, stats))
        else:
            contents = read_log(args.file, rotated=not args.no_rotated)
            plot(contents, args.output)
            print(f"wrote {args.output}")
    except (CounterLogError, FileNotFoundError, ValueError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    return 0


def _export(args: argparse.Namespace, name: str) -> int:
    fmt = args.format or ("csv" if args.csv else None)
    if fmt is None:
        raise ValueError(f"say which format: --format {{{','.join(FORMATS)}}}")
    if args.csv and fmt != "csv":
        raise ValueError(f"--csv and --format {fmt} disagree; give one")
    stats = ReadStats()
    rotated = not args.no_rotated
    if fmt == "parquet":
        if not args.output:
            raise ValueError("--format parquet writes a binary file: give -o FILE.parquet")
        n = write_parquet(args.file, args.output, rotated, stats)
    else:
        writer = write_csv if fmt == "csv" else write_trace
        if args.output:
            tmp = f"{args.output}.tmp{os.getpid()}"
            try:
                with open(tmp, "w", newline="", encoding="utf-8") as f:
                    n = writer(args.file, f, rotated, stats)
                os.replace(tmp, args.output)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
        else:
            n = writer(args.file, sys.stdout, rotated, stats)
    damage = stats.damage_text()
    where = args.output or "stdout"
    print(f"{name}: {n} records to {where} ({fmt})" + (f"; {damage}" if damage else ""),
          file=sys.stderr)
    return 0


# ---- show ---------------------------------------------------------------------------------

def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of a sorted, non-empty list."""
    rank = max(math.ceil(q * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def summarise(contents: LogContents | Iterable[dict]) -> list[dict]:
    """One row per (op, variant): calls, share of the op's calls, p50/p99 time and the
    median fraction of the roofline floor reached (floor / time; 1 is the hardware limit).
    Takes a :class:`LogContents` or any iterable of records (streamed: per group only the
    times are kept)."""
    records = contents.records if isinstance(contents, LogContents) else contents
    times: dict[tuple, list[float]] = {}
    fractions: dict[tuple, list[float]] = {}
    calls: dict[tuple, int] = {}
    for r in records:
        key = (r["op"], r["variant"])
        calls[key] = calls.get(key, 0) + 1
        t = r.get("time_ms")
        if isinstance(t, (int, float)) and math.isfinite(t):
            times.setdefault(key, []).append(t)
            if r.get("floor_ms") and t > 0:
                fractions.setdefault(key, []).append(r["floor_ms"] / t)
    per_op: dict[str, int] = {}
    for (op, _), n in calls.items():
        per_op[op] = per_op.get(op, 0) + n
    rows = []
    for (op, variant), n in sorted(calls.items()):
        ts = sorted(times.get((op, variant), []))
        fs = sorted(fractions.get((op, variant), []))
        rows.append({"op": op, "variant": variant, "calls": n, "share": n / per_op[op],
                     "p50_ms": _quantile(ts, 0.5) if ts else math.nan,
                     "p99_ms": _quantile(ts, 0.99) if ts else math.nan,
                     "roofline_fraction": _quantile(fs, 0.5) if fs else math.nan})
    return rows


def summary_text(contents: LogContents) -> str:
    """``adaptive log show``'s text for records already read."""
    return _summary_text(summarise(contents), contents.stats)


def _summary_text(rows: list[dict], stats: ReadStats) -> str:
    damage = stats.damage_text()
    every = sorted({h.get("sample_every", 1) for h in stats.headers})
    lo, hi = stats.sample_every_min, stats.sample_every_max
    if lo is not None and hi != lo:         # the governor moved it: each record says its own
        rate = f" (one launch in {lo} to {hi} logged, per record's sample_every)"
    else:
        rate = (f" (one launch in {every[0]} logged)" if every and every != [1] and
                len(every) == 1 else "")
    if stats.cupti_decision:
        rate += f"; {stats.cupti_decision}"
    if stats.cupti_handover:
        rate += (f"; CUPTI timed calls for {stats.cupti_active or 0:.1%} of the log's time, "
                 f"then handed over: {stats.cupti_handover}")
    head = (f"{stats.records} records in {len(stats.files)} file(s)" + rate
            + (f"; {damage}" if damage else ""))
    lines = [head, f"{'op':<12}{'variant':<28}{'calls':>9}{'share':>8}{'p50 ms':>11}"
             f"{'p99 ms':>11}{'roofline':>10}"]
    for r in rows:
        roof = f"{r['roofline_fraction']:.1%}" if math.isfinite(r["roofline_fraction"]) else "-"
        lines.append(f"{r['op']:<12}{r['variant']:<28}{r['calls']:>9}{r['share']:>8.1%}"
                     f"{r['p50_ms']:>11.4g}{r['p99_ms']:>11.4g}{roof:>10}")
    return "\n".join(lines)


# ---- plot ---------------------------------------------------------------------------------

def plot(contents: LogContents, path: str) -> None:
    """Time against problem size (bytes moved) coloured by variant, one panel per op; and
    SM clock, power and utilisation over time when the log has device state."""
    plots.check_output(path)
    plt = plots.pyplot()

    records = contents.records
    if not records:
        raise CounterLogError(f"{contents.files[-1]} has no records to plot")
    ops = sorted({r["op"] for r in records})
    states = [r for r in records if r.get("device_state")]
    n = len(ops) + (1 if states else 0)
    fig, axes = plt.subplots(n, 1, figsize=(8, 3.2 * n), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        by_variant: dict[str, list] = {}
        for r in records:
            if r["op"] == op:
                size = r.get("bytes") or math.prod(r.get("dims", {}).values())
                by_variant.setdefault(r["variant"], []).append((size, r["time_ms"]))
        for variant, points in sorted(by_variant.items()):
            xs, ys = zip(*points)
            ax.scatter(xs, ys, s=6, alpha=0.6, label=variant)
        ax.set(xscale="log", yscale="log", title=op, xlabel="bytes moved (roofline)",
               ylabel="time (ms)")
        ax.legend(fontsize=7, markerscale=2)
    if states:
        ax = axes[-1, 0]
        t0 = states[0]["time_s"]
        t = [r["time_s"] - t0 for r in states]
        clock = [r["device_state"].get("sm_clock_mhz", math.nan) for r in states]
        ax.plot(t, clock, color="tab:blue", label="SM clock (MHz)")
        ax.set(xlabel="time (s)", ylabel="SM clock (MHz)", title="device state")
        twin = ax.twinx()
        for field, colour in (("gpu_util_ratio", "tab:orange"), ("sm_active_ratio", "tab:green"),
                              ("dram_active_ratio", "tab:red")):
            values = [r["device_state"].get(field, math.nan) for r in states]
            if any(math.isfinite(v) for v in values):
                twin.plot(t, values, color=colour, label=field)
        twin.set(ylabel="ratio", ylim=(0, 1.05))
        lines = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
