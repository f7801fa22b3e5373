"""The grouped BSR form (``w_bsr32_g{G}_*``) that spmm's bsr32_grouped_mma kernels walk:
against a brute-force construction, and the kernel's walk emulated in NumPy against a
float64 product (empty rows, M and K off the 32 grid, a partial last group)."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.backends import cuda_sparse   # registers the w_* providers
from adaptive.expr import compile_expr
from adaptive.limits import SM90
from adaptive.ops.sparse import SparseWeight
from adaptive.variants import builtin_folder, load_manifest


def _brute(indptr, indices, group):
    """Loops over groups, columns and rows: the form as its docstring states it."""
    n_rows = len(indptr) - 1
    ptr, ks, blks = [0], [], []
    for g in range(-(-n_rows // group)):
        rows = range(g * group, min((g + 1) * group, n_rows))
        cols = sorted({int(indices[i]) for r in rows for i in range(indptr[r], indptr[r + 1])})
        for c in cols:
            ks.append(c)
            for r in range(g * group, (g + 1) * group):
                span = range(indptr[r], indptr[r + 1]) if r < n_rows else range(0)
                hit = [i for i in span if indices[i] == c]
                blks.append(hit[0] if hit else -1)
        ptr.append(len(ks))
    return np.array(ptr), np.array(ks, dtype=np.int64), np.array(blks, dtype=np.int64)


def _random_bsr(rng, n_rows, n_cols, density):
    mask = rng.random((n_rows, n_cols)) < density
    mask[rng.integers(0, n_rows, max(1, n_rows // 5))] = False      # empty rows
    counts = mask.sum(axis=1)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    indices = np.nonzero(mask)[1]
    return indptr, indices


@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("n_rows,n_cols,density", [(1, 1, 1.0), (10, 11, 0.3), (37, 5, 0.5),
                                                   (64, 40, 0.1), (9, 300, 0.02)])
def test_row_groups_match_brute_force(rng, group, n_rows, n_cols, density):
    indptr, indices = _random_bsr(rng, n_rows, n_cols, density)
    ptr, k, blk = cuda_sparse.bsr_row_groups(indptr, indices, group)
    want = _brute(indptr, indices, group)
    assert ptr.dtype == k.dtype == blk.dtype == np.int32
    assert ptr.size == -(-n_rows // group) + 1
    np.testing.assert_array_equal(ptr, want[0])
    np.testing.assert_array_equal(k, want[1])
    np.testing.assert_array_equal(blk, want[2])
    present = blk[blk >= 0]
    assert sorted(present.tolist()) == list(range(indices.size))   # every block exactly once


def test_row_groups_all_empty_and_bad_input():
    ptr, k, blk = cuda_sparse.bsr_row_groups(np.zeros(6, np.int32), np.zeros(0, np.int32), 4)
    assert ptr.tolist() == [0, 0, 0] and k.size == 0 and blk.size == 0
    ptr, k, blk = cuda_sparse.bsr_row_groups(np.zeros(1, np.int32), np.zeros(0, np.int32), 8)
    assert ptr.tolist() == [0] and k.size == blk.size == 0
    with pytest.raises(ValueError, match="repeat a column block"):
        cuda_sparse.bsr_row_groups(np.array([0, 2]), np.array([3, 3]), 4)
    with pytest.raises(ValueError, match="ending at"):
        cuda_sparse.bsr_row_groups(np.array([0, 3]), np.array([1, 2]), 4)
    with pytest.raises(ValueError, match="group must be"):
        cuda_sparse.bsr_row_groups(np.array([0, 1]), np.array([1]), 0)


def _emulate_kernel(w: SparseWeight, b: np.ndarray, group: int) -> np.ndarray:
    """bsr32_grouped_mma's walk: per group entry, the b slab once (zero past K), then each
    group row that has the block adds its product; rows past M are dropped."""
    m, k_dim = w.shape
    bsr = w.bsr(32)
    bsr.sort_indices()
    ptr, ks, blk = cuda_sparse.bsr_row_groups(bsr.indptr, bsr.indices, group)
    values = bsr.data.astype(np.float64)
    padded_b = np.zeros((-(-k_dim // 32) * 32, b.shape[1]))
    padded_b[:k_dim] = b
    out = np.full(((len(ptr) - 1) * group * 32, b.shape[1]), np.nan)
    for g in range(len(ptr) - 1):
        acc = np.zeros((group, 32, b.shape[1]))
        for e in range(ptr[g], ptr[g + 1]):
            slab = padded_b[ks[e] * 32:(ks[e] + 1) * 32]
            for r in range(group):
                if blk[e * group + r] >= 0:
                    acc[r] += values[blk[e * group + r]] @ slab
        out[g * group * 32:(g + 1) * group * 32] = acc.reshape(-1, b.shape[1])
    return out[:m]


@pytest.mark.parametrize("group", cuda_sparse.GROUP_SIZES)
def test_kernel_walk_over_the_form_gives_the_product(rng, group):
    m, k = 301, 330                            # 10 block rows (the last partial), 11 columns
    mask = rng.random((10, 11)) < 0.3
    mask[[1, 4]] = False                       # empty block rows
    mask[7] = True
    mask[8:10] = False                         # the last group's rows share no column ...
    mask[8, 2] = mask[9, 5] = True             # ... but both have one
    full = np.kron(mask, np.ones((32, 32), bool))[:m, :k]
    values = rng.standard_normal((m, k))
    values[values == 0] = 1
    dense = np.where(full, values, 0).astype(np.float16)
    w = SparseWeight(dense, dtype="float16")
    b = rng.standard_normal((k, 45))
    got = _emulate_kernel(w, b, group)
    want = dense.astype(np.float64) @ b
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("m", [1, 31, 33, 301, 8192, 16384 + 32])
def test_grouped_variants_grid_covers_every_group(m):
    variants = [v for v in load_manifest(builtin_folder() / "spmm" / "manifest.toml")
                if v.name.startswith("bsr32_grouped")]
    assert {v.name for v in variants} == {"bsr32_grouped_mma", "bsr32_grouped4_mma",
                                          "bsr32_grouped_splitk_mma"}
    for v in variants:
        group = int(next(o for o in v.options if o.startswith("-DGROUP=")).split("=")[1])
        assert f"w_bsr32_g{group}_ptr" in v.launch["args"]
        n_groups = -(-(-(-m // 32)) // group)
        configs = list(v.space.configs(SM90))
        assert 1 <= len(configs) <= 8
        for config in configs:
            scope = {"M": m, "N": 200, "K": 512, **config, **SM90}
            grid = [int(compile_expr(str(e))(scope)) for e in v.launch["grid"]]
            block = [int(compile_expr(str(e))(scope)) for e in v.launch["block"]]
            split = config.get("SPLIT", 1)
            assert grid == [-(-200 // config["TN"]), n_groups] + ([split] if split > 1 else [])
            assert block == [group * 32]
            if split > 1:   # the partial slices, then a counter per (column tile, group)
                ws = int(compile_expr(v.launch["workspace_bytes"])(scope))
                assert ws == 4 * split * m * 200 + 4 * grid[0] * grid[1]
                assert v.launch["args"][-1] == "workspace"
            smem = int(compile_expr(v.launch["shared_bytes"])(scope))
            tn, stages = config["TN"], config["STAGES"]
            assert smem == stages * 2 * (32 * (tn + 8) + group * 32 * 40)
            assert smem <= SM90["max_shared_bytes"]
