"""The benchmarks' figures (adaptive.plots): drawn from the numbers the reports print, the
targets as dashed lines, a name matplotlib cannot write refused before any work."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("matplotlib")

from adaptive import cli, plots  # noqa: E402
from adaptive.bench.cli import OpReport  # noqa: E402
from adaptive.bench.replay import Case, ReplayReport  # noqa: E402
from adaptive.errors import InputValueError  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _bar_heights(ax) -> dict[str, list[float]]:
    return {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}


def _dashed(ax) -> list[float]:
    return [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]


def test_the_selection_panels_draw_what_the_report_prints(quick_selection_report, tmp_path):
    rep = quick_selection_report
    fig, drawn = plots.bench_figure(selection=rep)
    s = drawn["selection"]
    streams = [x.stream for x in rep.streams]
    assert s["streams"] == streams
    assert set(s["steady/oracle"]) == {"best-fixed", "measure-each", "learned-cold",
                                       "learned-pack"}          # no shipped pack on the host
    for p, ratios in s["steady/oracle"].items():
        assert ratios == [rep.result(st, p).steady_ratio for st in streams]
    for p, shares in s["tuning share"].items():
        assert shares == [rep.result(st, p).explored / rep.result(st, "autotune").explored
                          for st in streams]
        assert all(0 < x < 1 for x in shares)
    for p, ms in s["first result ms"].items():
        assert ms == [rep.result(st, p).first_result_ms for st in streams]
    steady, tuning, first = fig.axes[:3]
    assert len(fig.axes) == 3
    assert _bar_heights(steady) == s["steady/oracle"]
    assert _bar_heights(tuning) == s["tuning share"]
    assert _bar_heights(first) == s["first result ms"]
    assert _dashed(steady) == [1.05] and _dashed(tuning) == [0.10] and _dashed(first) == [5.0]
    assert [t.get_text() for t in steady.get_xticklabels()] == streams
    path = tmp_path / "selection.png"
    plots.save(fig, str(path))
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000


def _op_report(op, oracle, fixed, adaptive):
    return OpReport(op=op, inputs=3, calls=30, oracle_ms=oracle, fixed_best="x",
                    fixed_best_ms=fixed, adaptive_ms=adaptive * 1.1,
                    adaptive_steady_ms=adaptive, tuning_ms=0.1, choices={})


def test_the_mixed_panel_draws_each_ops_ratios_beside_the_best_fixed():
    reports = [_op_report("gemm", 2.0, 2.064, 2.064), _op_report("softmax", 1.0, 1.219, 1.015)]
    fig, drawn = plots.bench_figure(mixed=reports)
    assert drawn["mixed"] == {"ops": ["gemm", "softmax"], "best fixed": [1.032, 1.219],
                              "adaptive": [1.032, 1.015]}
    (ax,) = fig.axes
    heights = _bar_heights(ax)
    assert heights["best fixed / oracle"] == pytest.approx([1.032, 1.219])
    assert heights["adaptive steady / oracle"] == pytest.approx([1.032, 1.015])
    plots.pyplot().close(fig)


def _case(op, ratio, i):
    return Case(op=op, dtype="float16", dims={"N": i}, candidates=10, explored=4,
                committed="a" if ratio > 1 else "b", best="b", ratio=ratio)


def test_the_replay_figure_draws_every_held_out_input_in_order():
    ratios = {"gemm": [1.0, 1.2, 1.01, 1.0], "softmax": [1.6, 1.0, 1.04]}
    reports = [ReplayReport("p.msgpack", setup, tuple(
        _case(op, r * (1 + k), i) for op, rs in ratios.items() for i, r in enumerate(rs)))
        for k, setup in ((0.0, "learned"), (0.01, "model picks only (no anchors)"))]
    fig, drawn = plots.replay_figure(reports)
    assert list(drawn) == ["gemm", "softmax"]
    assert drawn["gemm"]["learned"] == sorted(ratios["gemm"])
    assert drawn["softmax"]["model picks only (no anchors)"] == pytest.approx(
        sorted(r * 1.01 for r in ratios["softmax"]))
    gemm, softmax = fig.axes
    steps = [line for line in gemm.get_lines() if line.get_linestyle() != "--"]
    assert [list(line.get_ydata()) for line in steps] == [sorted(ratios["gemm"]), pytest.approx(
        sorted(r * 1.01 for r in ratios["gemm"]))]
    assert "within 5% 75%" in steps[0].get_label() and "worst 1.20x" in steps[0].get_label()
    assert _dashed(gemm) == [1.05]                 # its worst is far under 1.5: no line
    assert _dashed(softmax) == [1.05, 1.5]
    geo = math.exp(sum(math.log(r) for r in ratios["softmax"]) / 3)
    assert f"geomean {geo:.3f}" in [ln for ln in softmax.get_lines()][0].get_label()
    plots.pyplot().close(fig)


def test_nothing_to_draw_is_refused():
    with pytest.raises(ValueError, match="neither a selection report nor a mixed table"):
        plots.bench_figure()
    with pytest.raises(ValueError, match="held out no input"):
        plots.replay_figure([ReplayReport("p", "learned", ())])


@pytest.mark.parametrize("name", ["out.txt", "out"])
def test_a_name_matplotlib_cannot_write_is_refused_before_the_bench_runs(name, capsys,
                                                                         monkeypatch):
    import adaptive.bench.selection as selection

    def never(*a, **k):
        raise AssertionError("the benchmark ran")
    monkeypatch.setattr(selection, "run_selection", never)
    assert cli.main(["bench", "selection", "--backend", "host", "--plot", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a supported image format" in err and ".png" in err
    with pytest.raises(InputValueError, match=r"\(none\)" if "." not in name else r"\.txt"):
        plots.check_output(name)


def test_the_overhead_benchmark_draws_no_figure_and_says_so(capsys):
    assert cli.main(["bench", "overhead", "--plot", "x.png"]) == 2
    err = capsys.readouterr().err
    assert "draws no figure" in err and "'selection'" in err
