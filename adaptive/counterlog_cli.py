"""``adaptive log``: summarise, plot and export counter logs.

    adaptive log show run.alog               # per op and variant: calls, p50/p99, roofline
    adaptive log plot run.alog -o run.png    # time against size by variant; clocks over time
    adaptive log export run.alog --csv       # one row per record (stdout or -o FILE)
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys

from adaptive.counterlog import CounterLogError, LogContents, read_log

CSV_DEVICE_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c",
                     "gpu_util_ratio", "clock_event_reasons", "sm_active_ratio",
                     "sm_occupancy_ratio", "tensor_active_ratio", "dram_active_ratio")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="per op and variant: calls, p50/p99 time, roofline")
    show.add_argument("file")
    plot = sub.add_parser("plot", help="plot times against size and device state over time")
    plot.add_argument("file")
    plot.add_argument("-o", "--output", required=True, help="image file (.png, .svg, .pdf)")
    export = sub.add_parser("export", help="export records as CSV")
    export.add_argument("file")
    export.add_argument("--csv", action="store_true", required=True, help="CSV (the one format)")
    export.add_argument("-o", "--output", help="output file (default: stdout)")
    for p in (show, plot, export):
        p.add_argument("--no-rotated", action="store_true",
                       help="read only FILE, not its rotated predecessors FILE.1, FILE.2, ...")


def run(args: argparse.Namespace) -> int:
    try:
        contents = read_log(args.file, rotated=not args.no_rotated)
    except (CounterLogError, FileNotFoundError) as exc:
        print(f"adaptive log {args.action}: {exc}", file=sys.stderr)
        return 1
    if args.action == "show":
        print(summary_text(contents))
    elif args.action == "plot":
        plot(contents, args.output)
        print(f"wrote {args.output}")
    else:
        if args.output:
            with open(args.output, "w", newline="") as f:
                write_csv(contents, f)
        else:
            write_csv(contents, sys.stdout)
    return 0


# ---- show ---------------------------------------------------------------------------------

def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of a sorted, non-empty list."""
    rank = max(math.ceil(q * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def summarise(contents: LogContents) -> list[dict]:
    """One row per (op, variant): calls, share of the op's calls, p50/p99 time and the
    median fraction of the roofline floor reached (floor / time; 1 is the hardware limit)."""
    groups: dict[tuple, list[dict]] = {}
    for r in contents.records:
        groups.setdefault((r["op"], r["variant"]), []).append(r)
    per_op: dict[str, int] = {}
    for (op, _), recs in groups.items():
        per_op[op] = per_op.get(op, 0) + len(recs)
    rows = []
    for (op, variant), recs in sorted(groups.items()):
        times = sorted(r["time_ms"] for r in recs if math.isfinite(r.get("time_ms", math.nan)))
        fractions = sorted(r["floor_ms"] / r["time_ms"] for r in recs
                           if r.get("floor_ms") and r.get("time_ms", 0) > 0)
        rows.append({"op": op, "variant": variant, "calls": len(recs),
                     "share": len(recs) / per_op[op],
                     "p50_ms": _quantile(times, 0.5) if times else math.nan,
                     "p99_ms": _quantile(times, 0.99) if times else math.nan,
                     "roofline_fraction": _quantile(fractions, 0.5) if fractions else math.nan})
    return rows


def summary_text(contents: LogContents) -> str:
    rows = summarise(contents)
    head = (f"{len(contents.records)} records in {len(contents.files)} file(s)"
            + (f"; {contents.truncated_bytes} bytes of a truncated last record skipped"
               if contents.truncated_bytes else ""))
    lines = [head, f"{'op':<12}{'variant':<28}{'calls':>9}{'share':>8}{'p50 ms':>11}"
             f"{'p99 ms':>11}{'roofline':>10}"]
    for r in rows:
        roof = f"{r['roofline_fraction']:.1%}" if math.isfinite(r["roofline_fraction"]) else "-"
        lines.append(f"{r['op']:<12}{r['variant']:<28}{r['calls']:>9}{r['share']:>8.1%}"
                     f"{r['p50_ms']:>11.4g}{r['p99_ms']:>11.4g}{roof:>10}")
    return "\n".join(lines)


# ---- export -------------------------------------------------------------------------------

def write_csv(contents: LogContents, out: io.TextIOBase) -> int:
    """Write one CSV row per record; dims, config and device state become columns."""
    dims = sorted({k for r in contents.records for k in r.get("dims", {})})
    configs = sorted({k for r in contents.records for k in (r.get("config") or {})})
    fields = (["seq", "time_s", "op", "variant", "dtype", "backend", "device", "timer",
               "time_ms", "floor_ms", "flops", "bytes"] + [f"dim_{k}" for k in dims]
              + [f"config_{k}" for k in configs] + list(CSV_DEVICE_FIELDS))
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for r in contents.records:
        row = {k: r.get(k, "") for k in fields[:12]}
        row.update({f"dim_{k}": v for k, v in r.get("dims", {}).items()})
        row.update({f"config_{k}": v for k, v in (r.get("config") or {}).items()})
        row.update({k: v for k, v in (r.get("device_state") or {}).items()
                    if k in CSV_DEVICE_FIELDS})
        writer.writerow(row)
    return len(contents.records)


# ---- plot ---------------------------------------------------------------------------------

def plot(contents: LogContents, path: str) -> None:
    """Time against problem size (bytes moved) coloured by variant, one panel per op; and
    SM clock, power and utilisation over time when the log has device state."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
