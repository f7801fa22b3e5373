"""Figures of the benchmarks' results, where a reader would rather look than read a table:

    adaptive bench --plot bench.png            # selection: steady/oracle, tuning, first result;
                                               # the mixed table: adaptive against best fixed
    adaptive pack replay PACK --plot replay.png   # committed/best of every held-out input

Each figure is drawn from the numbers its report prints (``*_series`` return them, the
tests hold the drawn bars to them), with the issue's bars as dashed lines. matplotlib is
the ``[plot]`` extra, imported only when a figure is asked for; a name matplotlib cannot
write, or a missing matplotlib, is refused before any benchmark runs (:func:`check_output`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from adaptive import optional
from adaptive.errors import InputValueError

# what matplotlib's Agg canvas writes
FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")

# the bars the figures draw (issue 14's targets)
STEADY_BAR = 1.05        # steady/oracle on every stream
TUNING_BAR = 0.10        # tuning runs over exhaustive autotune's
FIRST_RESULT_BAR_MS = 5.0
WITHIN_BAR = 1.05        # a replayed input within 5% of its best
WORST_BAR = 1.5

# the selection policies in the order the bars are drawn (those a report has)
SELECTION_POLICIES = ("best-fixed", "measure-each", "learned-cold", "learned-pack",
                      "learned-shipped")
LEARNED = ("learned-cold", "learned-pack", "learned-shipped")


def check_output(path: str) -> None:
    """Refuse an image name matplotlib cannot write (InputValueError), and a missing
    matplotlib (MissingDependencyError), in one line."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in FORMATS:
        raise InputValueError(f"cannot write a plot to {path!r}: the extension "
                              f"{'.' + ext if ext else '(none)'} is not a supported image "
                              f"format; use one of {', '.join('.' + e for e in FORMATS)}")
    optional.require("matplotlib", "plotting")


def pyplot():
    """matplotlib's pyplot on the Agg canvas (no display needed)."""
    matplotlib = optional.require("matplotlib", "plotting")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# ---- the numbers each figure draws -----------------------------------------------------------

def selection_series(report) -> dict:
    """From a :class:`~adaptive.bench.selection.SelectionReport`: per panel, {policy:
    [value per stream]} in ``streams`` order (steady/oracle; tuning runs over autotune's;
    mean first result in ms), the policies the report ran."""
    streams = [s.stream for s in report.streams]
    ran = {r.policy for s in report.streams for r in s.results}
    policies = [p for p in SELECTION_POLICIES if p in ran]
    learned = [p for p in LEARNED if p in ran]

    return {
        "streams": streams,
        "steady/oracle": {p: [report.result(s, p).steady_ratio for s in streams]
                          for p in policies},
        "tuning share": {p: [report.tuning_share(s, p) for s in streams] for p in learned},
        "first result ms": {p: [report.result(s, p).first_result_ms for s in streams]
                            for p in learned},
    }


def mixed_series(reports: Sequence) -> dict:
    """From ``run_mixed``'s :class:`~adaptive.bench.cli.OpReport` list: {"ops": [...],
    "best fixed": [fixed/oracle per op], "adaptive": [adaptive steady/oracle per op]}."""
    return {"ops": [r.op for r in reports],
            "best fixed": [r.fixed_ratio for r in reports],
            "adaptive": [r.adaptive_ratio for r in reports]}


def replay_series(reports: Sequence) -> dict:
    """From ``replay_setups``'s :class:`~adaptive.bench.replay.ReplayReport` list: {op:
    {set-up: committed/best of each held-out input, ascending}}."""
    out: dict[str, dict[str, list[float]]] = {}
    for rep in reports:
        for case in rep.cases:
            out.setdefault(case.op, {}).setdefault(rep.variant, []).append(case.ratio)
    for by_setup in out.values():
        for ratios in by_setup.values():
            ratios.sort()
    return dict(sorted(out.items()))


# ---- the figures ------------------------------------------------------------------------------

def _grouped_bars(ax, groups: Sequence[str], series: dict, fmt: str) -> None:
    """One bar per (group, series entry), each labelled with its value."""
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, labels=[fmt.format(v) if math.isfinite(v) else "n/a"
                                   for v in values], fontsize=6, rotation=90, padding=2)
    ax.set_xticks(range(len(groups)), groups)


def _bar_line(ax, y: float, text: str) -> None:
    ax.axhline(y, color="black", linestyle="--", linewidth=0.8)
    ax.annotate(text, (1.0, y), xycoords=("axes fraction", "data"), ha="right", va="bottom",
                fontsize=7)


def save(fig, path: str) -> None:
    """Write ``fig`` to ``path`` (its extension says the format) and release it."""
    check_output(path)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def bench_figure(selection=None, mixed: Sequence | None = None):
    """``adaptive bench``'s figure: the selection report's three panels and the mixed
    table's, those given. Returns (the figure, the series drawn)."""
    if selection is None and not mixed:
        raise ValueError("nothing to plot: neither a selection report nor a mixed table")
    plt = pyplot()
    drawn: dict = {}
    panels = (3 if selection is not None else 0) + (1 if mixed else 0)
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.4 * panels), squeeze=False)
    axes = list(axes[:, 0])
    if selection is not None:
        s = drawn["selection"] = selection_series(selection)
        for ax, key, fmt, bar, text, ylabel in (
                (axes.pop(0), "steady/oracle", "{:.3f}", STEADY_BAR, "target <= 1.05",
                 "steady ms / oracle's"),
                (axes.pop(0), "tuning share", "{:.1%}", TUNING_BAR, "target < 10%",
                 "timed exploring calls /\nexhaustive autotune's runs"),
                (axes.pop(0), "first result ms", "{:.2f}", FIRST_RESULT_BAR_MS,
                 "target < 5 ms", "mean first result (ms)")):
            _grouped_bars(ax, s["streams"], s[key], fmt)
            _bar_line(ax, bar, text)
            top = max((v for vals in s[key].values() for v in vals if math.isfinite(v)),
                      default=bar)
            low = 1.0 if key == "steady/oracle" else 0.0
            ax.set_ylim(low - (0.02 if low else 0), max(top, bar) * 1.15 + (0.02 if low else 0))
            ax.set(title=f"selection ({selection.backend}): {key}", ylabel=ylabel)
            ax.legend(fontsize=7, ncol=3, loc="upper left")
    if mixed:
        ax = axes.pop(0)
        m = drawn["mixed"] = mixed_series(mixed)
        _grouped_bars(ax, m["ops"], {"best fixed / oracle": m["best fixed"],
                                     "adaptive steady / oracle": m["adaptive"]}, "{:.3f}")
        top = max([*m["best fixed"], *m["adaptive"], 1.0])
        ax.set_ylim(0.98, top * 1.12)
        ax.set(title="mixed workload through launch: lower is better, 1 is the per-input best",
               ylabel="steady ms / oracle's")
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig, drawn


def replay_figure(reports: Sequence):
    """``adaptive pack replay``'s figure: one panel per op, each held-out input's
    committed/best in ascending order, one line per policy set-up, the 5% and worst bars
    dashed. Returns (the figure, the series drawn)."""
    series = replay_series(reports)
    if not series:
        raise ValueError("nothing to plot: the replay held out no input")
    plt = pyplot()
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 3.0 * len(series)), squeeze=False)
    for ax, (op, by_setup) in zip(axes[:, 0], series.items()):
        for setup, ratios in by_setup.items():
            n = len(ratios)
            within = sum(r <= WITHIN_BAR for r in ratios) / n
            geo = math.exp(sum(math.log(r) for r in ratios) / n)
            ax.step([(i + 1) / n for i in range(n)], ratios, where="post",
                    label=f"{setup}: geomean {geo:.3f}, within 5% {within:.0%}, "
                          f"worst {ratios[-1]:.2f}x")
        _bar_line(ax, WITHIN_BAR, "within 5%")
        top = max(r for ratios in by_setup.values() for r in ratios)
        if top >= WORST_BAR * 0.9:
            _bar_line(ax, WORST_BAR, "worst <= 1.5x")
        ax.set(title=f"{op}: held-out inputs, committed / best", xlabel="share of inputs",
               ylabel="committed / best", xlim=(0, 1), ylim=(0.99, max(top, WITHIN_BAR) * 1.03))
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig, series
