"""benchmarks/gpu_sparse24.py on the host: the dry run completes (so a Python error never
costs device time), and the ratios and targets it prints are computed as the issue states."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_sparse24


def test_dry_run_completes_on_the_host(tmp_path, capsys):
    rows = gpu_sparse24.main(str(tmp_path), device="host", quick=True, budget_s=60)
    data = json.loads((tmp_path / "gpu_sparse24.json").read_text())
    assert len(data["rows"]) == len(gpu_sparse24.QUICK_SHAPES) * len(gpu_sparse24.QUICK_TOKENS)
    assert all(r["chosen"].startswith("host_") for r in data["rows"])
    assert any(r["case"].endswith("at every N") for r in rows)
    assert "2:4 targets (issue 13)" in capsys.readouterr().out


def _row(n, dense, cslt, disp, m=4096, k=4096):
    return {"M": m, "K": k, "N": n, "chosen": "x",
            "times_ms": {"dense": dense, "cusparselt": cslt, "dispatcher": disp}}


def test_targets_compare_the_dispatcher_with_dense_and_the_better_torch_way():
    rows = [_row(1, 0.030, 0.060, 0.020), _row(64, 0.040, 0.050, 0.028),
            _row(2048, 0.400, 0.300, 0.310)]
    q = gpu_sparse24.ratios(rows[2])
    assert round(q["dispatcher/dense"], 3) == round(0.4 / 0.31, 3)
    assert round(q["dispatcher/best_torch"], 3) == round(0.3 / 0.31, 3)
    small, every = gpu_sparse24.targets(rows)
    assert small[2] and "worst 1.43x (N=64)" in small[1]         # 0.040 / 0.028
    assert not every[2] and "(N=2048)" in every[1]               # 0.97x of cuSPARSELt
    rows[2]["times_ms"]["dispatcher"] = 0.29
    assert gpu_sparse24.targets(rows)[1][2]
    rows[0]["times_ms"]["dispatcher"] = 0.025                    # 1.2x dense at N=1
    assert not gpu_sparse24.targets(rows)[0][2]


def test_each_kernel_times_every_fitting_config_fastest_first(rng):
    """_time_kernel over the registry's cuda variants (a fake dispatcher that records the
    launches and a fake timer): every config of sparse24_stream that fits N = 16, no other."""
    from adaptive.limits import SM90
    from adaptive.ops import get_op
    from adaptive.ops.sparse import SparseWeight
    from adaptive.ops.spmm import prune_24
    from adaptive.variants import shared_registry

    launched = []

    class Dispatcher:
        registry, limits = shared_registry(), SM90
        backend = type("Backend", (), {"name": "cuda"})()

        def launch(self, op, w, b, variant, config):
            launched.append((variant, tuple(sorted(config.items()))))

    side = type("Side", (), {"dispatcher": Dispatcher(),
                             "timer": staticmethod(lambda fn: (fn(), 1.0 / len(launched))[1])})
    w = SparseWeight(prune_24(rng.standard_normal((64, 128)).astype("float16")))
    b = rng.standard_normal((128, 16)).astype("float16")
    timed = gpu_sparse24._time_kernel(side, w, b, "sparse24_stream")
    (v,) = [v for v in shared_registry().variants("spmm", "cuda") if v.name == "sparse24_stream"]
    scope = get_op("spmm").problem((w, b), {}).scope()
    fitting = [c for c in v.space.configs(SM90) if v.fits(scope, c)]
    assert fitting and all(c["NT"] == 2 for c in fitting)
    assert [c for _, c in timed] == fitting[::-1]          # the later, the faster (fake)
    assert {name for name, _ in launched} == {"sparse24_stream"}
    assert gpu_sparse24._time_kernel(side, w, b, "no_such_variant") == []


def test_kernel_reach_is_the_worst_ratio_at_small_n():
    rows = [_row(1, 0.030, 0.060, 0.020), _row(64, 0.040, 0.050, 0.028),
            _row(256, 0.400, 0.300, 0.310)]
    for r, t in zip(rows, (0.020, 0.032, 0.100)):
        r["times_ms"]["sparse24_stream"] = t
    assert gpu_sparse24.kernel_reach(rows) == [("4096x4096", "worst 1.25x (N=64)")]
    assert gpu_sparse24.kernel_reach(rows, "sparse24_mma") == []


def test_the_eager_loop_times_each_way_interleaved_and_keeps_the_least_round(monkeypatch):
    """loop_ms: every way called ``calls`` times a round, rounds interleaved across the
    ways after one untimed warm-up round, each round between two synchronises; the least
    round's wall per call is kept (a slow round, here the second timed one of ``slow``, is
    not)."""
    clock, order, syncs = [0.0], [], []
    monkeypatch.setattr(gpu_sparse24.time, "perf_counter", lambda: clock[0])

    def way(name, ms, slow_calls=range(0)):
        def run():
            made = order.count(name)        # this way's calls before this one
            order.append(name)
            clock[0] += ms * (10 if made in slow_calls else 1) / 1e3
        return run

    fns = {"fast": way("fast", 0.5), "slow": way("slow", 2.0, slow_calls=range(8, 12))}
    got = gpu_sparse24.loop_ms(fns, lambda: syncs.append(len(order)), calls=4, rounds=3)
    assert got == pytest.approx({"fast": 0.5, "slow": 2.0})
    assert len(order) == 2 * 4 * 4                       # warm-up round + 3 rounds each
    assert order[:12] == ["fast"] * 4 + ["slow"] * 4 + ["fast"] * 4   # interleaved
    assert len(syncs) == 2 * 2 * 4 and syncs[:4] == [0, 4, 4, 8]   # around every round
