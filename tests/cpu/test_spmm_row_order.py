"""The BSR row order that spmm's bsr32_rows_mma balances its CTAs with, and the binding of
every spmm cuda variant's kernel arguments (a misspelt name in a manifest fails here, not
on the GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.backends import cuda_sparse   # registers the w_* providers
from adaptive.backends.cuda_args import bind
from adaptive.nvrtc import SM90_LIMITS
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
    config = next(iter(variant.space.configs(SM90_LIMITS)))
    scope = {**problem.scope(), **config, **SM90_LIMITS}
    slots, _ = bind(op, list(variant.launch["args"]), "cupy", scope, problem)
    assert [s.name for s in slots] == [a.partition(":")[0] for a in variant.launch["args"]]
    w_args = [s for s in slots if s.name.startswith("w_")]
    assert all(s.code.endswith("(args[0])") for s in w_args), w_args
