"""The BSR row order that spmm's bsr32_rows_mma balances its CTAs with, and the binding of
every spmm cuda variant's kernel arguments (a misspelt name in a manifest fails here, not
on the GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.backends import cuda_sparse   # registers the w_* providers
from adaptive.backends.cuda_args import bind
from adaptive.limits import SM90
from adaptive.ops import get_op
from adaptive.variants import builtin_folder, load_manifest


def test_rows_by_block_count_sorts_most_first_ties_by_row(rng):
    counts = rng.integers(0, 6, 97)
    counts[[3, 50]] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    order = cuda_sparse.rows_by_block_count(indptr)
    assert order.dtype == np.int32 and sorted(order.tolist()) == list(range(97))
    got = counts[order]
    assert np.all(np.diff(got) <= 0)
    for c in np.unique(counts):            # equal counts keep their row order
        rows = order[got == c]
        assert np.all(np.diff(rows) > 0)
    assert cuda_sparse.rows_by_block_count(np.array([0], np.int32)).size == 0


@pytest.mark.parametrize("variant", [v for v in load_manifest(builtin_folder() / "spmm" /
                                                               "manifest.toml")
                                     if v.backend == "cuda" and v.language == "cuda"],
                         ids=lambda v: v.name)
def test_every_spmm_kernel_argument_binds(rng, variant):
    op = get_op("spmm")
    w, b = op.make_inputs({"M": 70, "N": 40, "K": 90}, "float16", rng, density=0.2, block=32)
    problem = op.problem((w, b), {})
    config = next(iter(variant.space.configs(SM90)))
    scope = {**problem.scope(), **config, **SM90}
    workspace = object() if variant.launch.get("workspace_bytes") else None   # a stand-in
    slots, _ = bind(op, list(variant.launch["args"]), "cupy", scope, problem, workspace)
    assert [s.name for s in slots] == [a.partition(":")[0] for a in variant.launch["args"]]
    w_args = [s for s in slots if s.name.startswith("w_")]
    assert all(s.code.endswith("(args[0])") for s in w_args), w_args


@pytest.mark.parametrize("m", [1, 31, 33, 8192, 8200])
def test_rows_variant_grid_gives_every_block_row_one_cta_slot(m):
    """bsr32_rows_mma's grid.y is ceil(ceil(M / 32) / RPC): the snake positions of its CTAs
    (c, 2P - 1 - c, 2P + c, ...) cover every block row once; shared memory fits sm_90."""
    from adaptive.expr import compile_expr
    (v,) = [v for v in load_manifest(builtin_folder() / "spmm" / "manifest.toml")
            if v.name == "bsr32_rows_mma"]
    rows = -(-m // 32)
    for config in v.space.configs(SM90):
        scope = {"M": m, "N": 256, "K": 512, **config, **SM90}
        grid = [int(compile_expr(str(e))(scope)) for e in v.launch["grid"]]
        assert grid[0] == -(-256 // config["TN"])
        p, rpc = grid[1], config["RPC"]
        slots = [q * p + (p - 1 - c if q % 2 else c) for c in range(p) for q in range(rpc)]
        assert sorted(s for s in slots if s < rows) == list(range(rows)), (config, grid)
        smem = int(compile_expr(v.launch["shared_bytes"])(scope))
        assert smem == config["STAGES"] * 2 * (32 * 40 + 32 * (config["TN"] + 8))
        assert smem <= SM90["max_shared_bytes"]
