"""The host-side logic of benchmarks/gpu_spmm_mlp.py: which variants it times and the ratio
lines it prints last (the GPU part runs on the H200 through scripts/gpu-check)."""

from __future__ import annotations

from benchmarks.gpu_spmm_mlp import GROUPED, _timed_variants, ratios


def test_times_cublas_and_every_bsr32_mma_variant_including_the_grouped_ones():
    from adaptive.variants import shared_registry

    class _Dispatcher:   # _timed_variants only reads the registry
        registry = shared_registry()
    names = {v.name for v in _timed_variants(_Dispatcher())}
    assert "cublas_dense" in names and set(GROUPED) <= names and "bsr32_mma" in names
    assert not any(n.startswith(("bsr16", "bsr64", "csr", "cusparse")) or n.endswith("simt")
                   for n in names)


def test_ratio_lines_are_cublas_over_variant():
    rows = [{"M": 16384, "K": 4096, "density": 0.25, "N": 512,
             "times_ms": {"cublas_dense": 0.12, "bsr32_mma": 0.15, "bsr32_grouped_mma": 0.06},
             "configs": {"cublas_dense": {}, "bsr32_mma": {"TN": 128},
                         "bsr32_grouped_mma": {"TN": 128, "STAGES": 4}}},
            {"M": 1, "K": 1, "density": 0.1, "N": 1, "times_ms": {"bsr32_mma": 1.0},
             "configs": {"bsr32_mma": {}}}]
    (line,) = ratios(rows)
    assert "best bsr32_grouped_mma 0.0600 ms = 2.00x cuBLAS" in line
    assert "best single-row bsr32_mma 0.80x" in line
    assert "bsr32_grouped_mma 2.00x {'TN': 128, 'STAGES': 4}" in line


def test_bsr_targets_cover_the_10_percent_mlp_rows_only():
    from benchmarks.gpu_spmm_mlp import CASES_10, targets
    assert {(m, k) for m, k, d, n in CASES_10} == {(14336, 4096), (4096, 14336)}
    assert {n for *_, n in CASES_10} == {16, 64, 256, 512} and {d for _, _, d, _ in CASES_10} \
        == {0.1}
    rows = [{"M": 14336, "K": 4096, "density": 0.1, "N": 16,
             "times_ms": {"cublas_dense": 0.03, "bsr32_mma": 0.018, "bsr32_rows_mma": 0.025}},
            {"M": 4096, "K": 14336, "density": 0.1, "N": 512,
             "times_ms": {"cublas_dense": 0.10, "bsr32_mma": 0.08}},
            {"M": 8192, "K": 8192, "density": 0.1, "N": 256,
             "times_ms": {"cublas_dense": 1.0, "bsr32_mma": 0.5}}]
    (a, b) = targets(rows)
    assert a == ("M=14336 K=4096 10% blocks N=16: best BSR >= 1.5x cuBLAS",
                 "1.67x (bsr32_mma)", True)
    assert not b[2] and b[1] == "1.25x (bsr32_mma)"
