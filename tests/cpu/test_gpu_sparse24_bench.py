"""benchmarks/gpu_sparse24.py on the host: the dry run completes (so a Python error never
costs device time), and the ratios and targets it prints are computed as the issue states."""

from __future__ import annotations

import json

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
