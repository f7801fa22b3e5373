"""Threaded host callers: while several threads launch, each BLAS call runs with one
thread (no oversubscription, no thrashing of the process-wide setting); one thread alone
gets its candidate's thread count back; results stay right against float64."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from adaptive.backends import host
from adaptive.backends.host import HostBackend


def test_blas_threads_is_one_while_threads_take_turns(monkeypatch):
    monkeypatch.setattr(host, "SHARED_HOLD_S", 0.2)
    b = HostBackend()
    assert b.blas_threads(4) == 4 and b.blas_threads(4) == 4     # one thread: its own
    seen = []
    t = threading.Thread(target=lambda: seen.append(b.blas_threads(4)))
    t.start()
    t.join()
    assert seen == [1] and b.blas_threads(4) == 1                 # two threads: one each
    time.sleep(0.25)
    assert b.blas_threads(4) == 4                                 # alone again


def test_threaded_launches_are_right_and_hold_blas_at_one_thread(monkeypatch):
    import benchmarks.cpu_threads as bench
    monkeypatch.setattr(bench, "WORK", bench.WORK[:1] + bench.WORK[2:])   # gemm, softmax
    # a hold no stall of a loaded machine outlasts: "after" is what the threads' turns left,
    # not the clock (the hold's expiry is test_blas_threads_is_one_while_threads_take_turns')
    monkeypatch.setattr(host, "SHARED_HOLD_S", 600.0)
    from adaptive.policy import MeasureEach
    r = bench.run(threads=4, launches=40, check_every=1, warmup=4, policy=MeasureEach())
    assert r["errors"] == [] and r["worst_rel_error"] < bench.TOLERANCE
    assert r["launches"] == 160 and r["blas_threads_after"] in (None, 1)


def test_gemm_threads_candidate_sets_and_keeps_one_count(rng):
    """Many threads on a ``threads=2`` plan: the setting changes at most twice (to 2 alone,
    to 1 once others join), not once per call."""
    b = HostBackend()
    calls = []
    real = HostBackend.set_threads

    def counting(self, n):
        calls.append(n)
        real(self, n)
    from adaptive.ops import OPS
    from adaptive.variants import default_registry, make_candidate
    cand = make_candidate(default_registry().get("gemm", "host_blas"), {"threads": 2})
    a = rng.standard_normal((33, 47)).astype(np.float32)
    w = rng.standard_normal((47, 29)).astype(np.float32)
    problem = OPS["gemm"].problem((a, w), {})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HostBackend, "set_threads", counting)
        run = b.prepare(cand, problem, OPS["gemm"])
        ref = a.astype(np.float64) @ w.astype(np.float64)
        bad = []

        def work():
            for _ in range(50):
                out = np.empty((33, 29), np.float32)
                run((a, w), out)
                if not np.allclose(out, ref, rtol=1e-4, atol=1e-4):
                    bad.append(1)
        run((a, w), np.empty((33, 29), np.float32))
        pool = [threading.Thread(target=work) for _ in range(6)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    assert not bad
    assert calls[:2] == [2, 1] and set(calls[2:]) <= {1, 2} and len(calls) <= 4, calls


def test_threads_benchmark_and_soak_command_lines_run(capsys):
    import benchmarks.cpu_threads as bench
    import benchmarks.soak as soak
    assert bench.main(["--threads", "2", "--launches", "10", "--policy", "measure-each"]) in (0, 1)
    out = capsys.readouterr().out
    assert "ADAPTIVE_MAX_THREADS=1" in out and "default / one BLAS thread" in out
    assert soak.main(["--launches", "3000", "--shapes", "100", "--plan-cache-size", "16",
                      "--policy", "measure-each", "--max-growth-mb", "1000"]) == 0
    out = capsys.readouterr().out
    assert "plan cache bound 16: at its bound" in out and "PASS" in out
