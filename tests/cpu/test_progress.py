"""Long commands say what they are doing at least every few seconds, never a line per item;
the benchmark command checks its arguments before it runs anything."""

from __future__ import annotations

import io
import sys
import time

import pytest

from adaptive.progress import Heartbeat, doing


def test_a_silent_command_gets_a_line_per_silence_saying_what_runs():
    out = io.StringIO()
    with Heartbeat("adaptive x", every_s=0.2, stream=out):
        doing("timing input 3/7")
        time.sleep(0.75)
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 4, lines
    assert all(line.startswith("adaptive x: timing input 3/7 (") and line.endswith(" s)")
               for line in lines)


def test_a_command_that_prints_gets_no_extra_lines_and_streams_are_restored():
    out = io.StringIO()
    before = sys.stdout, sys.stderr
    with Heartbeat("adaptive x", every_s=0.3, stream=out):
        for i in range(8):
            print(f"step {i}", file=sys.stderr if i % 2 else sys.stdout)
            time.sleep(0.1)
    assert out.getvalue() == ""
    assert (sys.stdout, sys.stderr) == before
    doing("nothing open")   # without a heartbeat: nothing happens


def test_pack_build_progress_says_something_every_few_seconds_when_not_a_terminal():
    from adaptive.packs.build import Progress
    out = io.StringIO()
    bar = Progress(1000, stream=out, every_s=0.05)
    for i in range(3):    # 0.3 % each: no 10 % step, but the last line is getting old
        time.sleep(0.06)
        bar.update(f"case {i}")
    assert len(out.getvalue().splitlines()) == 3
    quiet = io.StringIO()
    bar = Progress(1000, stream=quiet, every_s=60)
    for i in range(20):
        bar.update(f"case {i}")
    assert len(quiet.getvalue().splitlines()) == 1     # the first case only


@pytest.mark.parametrize("ops,message", [
    ("nope", "adaptive bench: --ops: unknown op 'nope'; valid ops: attention, gemm, rmsnorm, "
             "softmax, spmm\n"),
    ("softmax,gem", "adaptive bench: --ops: unknown op 'gem' (did you mean 'gemm'?); valid "
                    "ops: attention, gemm, rmsnorm, softmax, spmm\n"),
])
def test_bench_refuses_unknown_ops_before_running(capsys, ops, message):
    from adaptive.cli import main
    assert main(["bench", "--ops", ops]) == 2
    captured = capsys.readouterr()
    assert captured.err == message and captured.out == ""


def test_bench_on_an_unavailable_cuda_backend_is_one_line(capsys):
    from adaptive.backends import gpu_available
    from adaptive.cli import main
    if gpu_available():
        pytest.skip("this machine has a GPU: the cuda backend is available")
    assert main(["bench", "--backend", "cuda"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("adaptive bench: the cuda backend needs CuPy and a visible "
                                   "CUDA device")
    assert captured.err.count("\n") == 1 and captured.out == ""


def test_bench_overhead_runs_on_each_op_given(monkeypatch, capsys):
    from adaptive import config
    from adaptive.bench import cli as bench
    from adaptive.cli import main
    ran = []
    real = bench.run_overhead

    def quick(backend="host", n=20000, rounds=7, op="gemm"):
        ran.append(op)
        return real(backend, n=20, rounds=1, op=op)
    monkeypatch.setattr(bench, "run_overhead", quick)
    with config.override(policy="measure-each"):   # no scikit-learn import for this
        assert main(["bench", "overhead", "--ops", "softmax,attention,spmm"]) == 0
    text = capsys.readouterr().out
    assert ran == ["softmax", "attention", "spmm"]
    assert "tiny softmax, host_" in text and "tiny attention, host_" in text
    assert "tiny spmm, host_" in text and "tiny gemm" not in text


def test_a_heartbeat_after_a_redrawn_bar_starts_its_own_line():
    out = io.StringIO()
    with Heartbeat("adaptive x", every_s=0.2, stream=out):
        print("[###     ] 3/8", end="\r", file=sys.stderr)
        time.sleep(0.45)
    assert out.getvalue().startswith("\nadaptive x: starting (")
