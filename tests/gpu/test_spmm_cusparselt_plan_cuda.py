"""The cuSPARSELt variant with kept plans (variants/spmm/cusparselt_plan.py; the 2:4 baseline)
against float64 references on fresh random 2:4 weights: odd token counts (padded to 8 and
copied out), views at an offset, an empty row, large magnitudes, CuPy arrays and tensors on
a side stream, outputs poisoned with NaN; a token count met again reuses its plan, and the
plans kept per weight stay bounded."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.ops import get_op
from adaptive.ops.spmm import prune_24

pytestmark = pytest.mark.gpu

OP = get_op("spmm")


@pytest.fixture(scope="module")
def plan_mod():
    from variant_modules import variant_module
    pytest.importorskip("torch")   # the library comes with PyTorch's CUDA wheels
    return variant_module("spmm", "cusparselt_plan.py")


def _weight(cp, rng, m, k, scale=1.0):
    from adaptive.ops.sparse import SparseWeight
    dense = prune_24((rng.standard_normal((m, k)) * scale).astype(np.float16))
    dense[min(5, m - 1)] = 0                         # an empty row
    return SparseWeight(cp.asarray(dense), dtype="float16"), dense


@pytest.mark.parametrize("m,k,n", [(96, 160, 1), (96, 160, 3), (128, 256, 8),
                                   (256, 512, 17), (4096, 1024, 64), (1024, 4096, 256)])
def test_cupy_arrays(plan_mod, cp, m, k, n):
    rng = np.random.default_rng(m * 7 + n)
    w, dense = _weight(cp, rng, m, k)
    b = cp.asarray((rng.standard_normal((k, n)) / np.sqrt(k / 2)).astype(np.float16))
    ref = dense.astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    for run in range(2):                             # the second call reuses the plan
        out = cp.full((m, n), np.nan, np.float16)
        plan_mod.spmm_cusparselt_plan(w, b, out)
        cp.cuda.Device().synchronize()
        assert OP.error(out, ref) < OP.tolerance["float16"], (m, k, n, run)
    state = w.cached("cuda0_cslt_plan", lambda: None)
    n8 = n + (-n) % 8       # one plan a padded token count, beside the compression's (8)
    assert n8 in state.plans and set(state.plans) <= {8, n8}, list(state.plans)


def test_large_magnitudes_and_tensors_on_a_side_stream(plan_mod, cp):
    import torch
    rng = np.random.default_rng(3)
    w, dense = _weight(cp, rng, 256, 512, scale=30.0)
    b_host = (rng.standard_normal((512, 24)) * 150.0 / np.sqrt(256)).astype(np.float16)
    ref = dense.astype(np.float64) @ b_host.astype(np.float64)
    assert 3e3 < np.abs(ref).max() < 6e4
    tb = torch.from_numpy(b_host).cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):                 # the work must go to this stream
        out = plan_mod.spmm_cusparselt_plan_torch(w, tb)
        odd = plan_mod.spmm_cusparselt_plan_torch(w, tb[:, :5].contiguous())
    stream.synchronize()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    assert OP.error(out.cpu().numpy(), ref) < OP.tolerance["float16"]
    assert OP.error(odd.cpu().numpy(), ref[:, :5]) < OP.tolerance["float16"]


def test_views_at_an_offset_run_through_the_plans_own_buffers(plan_mod, cp):
    """b and out 2 bytes past an aligned address (row slices of larger buffers): the
    descriptors promise 16-byte aligned operands, so the call runs on the plan's copies."""
    import torch
    rng = np.random.default_rng(11)
    w, dense = _weight(cp, rng, 128, 256)
    b_big = cp.asarray(rng.standard_normal((256 * 16 + 1,)).astype(np.float16) / 16)
    b = b_big[1:].reshape(256, 16)
    out_big = cp.full((128 * 16 + 1,), np.nan, np.float16)
    out = out_big[1:].reshape(128, 16)
    assert b.data.ptr % 16 == 2 and out.data.ptr % 16 == 2 and b.flags.c_contiguous
    plan_mod.spmm_cusparselt_plan(w, b, out)
    ref = dense.astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    tb = torch.from_dlpack(b)
    got_t = plan_mod.spmm_cusparselt_plan_torch(w, tb)
    cp.cuda.Device().synchronize()
    assert OP.error(cp.asnumpy(out), ref) < OP.tolerance["float16"]
    assert OP.error(got_t.cpu().numpy(), ref) < OP.tolerance["float16"]
    assert np.isnan(cp.asnumpy(out_big[:1])).all()       # nothing written before the view


def test_the_plans_kept_per_weight_are_bounded(plan_mod, cp):
    rng = np.random.default_rng(5)
    w, dense = _weight(cp, rng, 64, 128)
    for n in range(8, 8 * (plan_mod.PLANS + 3), 8):
        b = cp.asarray(rng.standard_normal((128, n)).astype(np.float16))
        out = cp.empty((64, n), np.float16)
        plan_mod.spmm_cusparselt_plan(w, b, out)
    state = w.cached("cuda0_cslt_plan", lambda: None)
    assert len(state.plans) == plan_mod.PLANS and 8 not in state.plans
