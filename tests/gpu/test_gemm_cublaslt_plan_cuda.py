"""The staged cuBLASLt variant with kept plans (variants/gemm/cublaslt_plan.py, not in the
manifest until this passes on a GPU) against float64 references on fresh random inputs:
decode and odd shapes, float16, bfloat16 (int16 memory) and float32, large magnitudes,
outputs poisoned with NaN, a side stream; a shape met again reuses its plan, the plans
kept per device stay bounded, and a strided or mixed-dtype call is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.ops import get_op

pytestmark = pytest.mark.gpu

OP = get_op("gemm")


@pytest.fixture(scope="module")
def lt():
    from variant_modules import variant_module
    return variant_module("gemm", "cublaslt_plan.py")


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16, as int16 memory, and the values they hold."""
    u = x.astype(np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r.view(np.int16), (r.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (16, 4096, 4096), (5, 17, 33),
                                   (129, 257, 513), (2048, 64, 2048)])
def test_against_float64(lt, cp, dtype, m, n, k):
    rng = np.random.default_rng(m * 31 + n + k)
    a = rng.standard_normal((m, k)).astype(np.float32) * 3.0
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    if dtype == "bfloat16":
        (a_mem, a), (b_mem, b) = _bf16_bits(a), _bf16_bits(b)
        out_dtype = np.int16
    else:
        a_mem, b_mem = a.astype(dtype), b.astype(dtype)
        a, b = a_mem.astype(np.float32), b_mem.astype(np.float32)
        out_dtype = np.dtype(dtype)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    da, db = cp.asarray(a_mem), cp.asarray(b_mem)
    for run in range(2):                              # the second call reuses the plan
        out = cp.full((m, n), -1, out_dtype) if dtype == "bfloat16" else \
            cp.full((m, n), np.nan, out_dtype)
        lt.gemm_cublaslt_plan(da, db, out)
        cp.cuda.Device().synchronize()
        got = cp.asnumpy(out)
        if dtype == "bfloat16":
            got = (got.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        assert np.isfinite(got).all()
        assert OP.error(got, ref) < OP.tolerance_for(dtype, {"M": m, "N": n, "K": k}), \
            (dtype, m, n, k, run)
    assert (m, n, k, lt._CUDA_R[np.dtype(out_dtype)], 256) in lt._plans[0]


def test_a_side_stream_bounded_plans_and_refusals(lt, cp, monkeypatch):
    rng = np.random.default_rng(7)
    a = cp.asarray(rng.standard_normal((64, 96)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((96, 48)).astype(np.float16))
    ref = cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        out = cp.full((64, 48), np.nan, np.float16)
        lt.gemm_cublaslt_plan(a, b, out)
    side.synchronize()
    assert OP.error(cp.asnumpy(out), ref) < OP.tolerance["float16"]
    # views at an offset (a row slice: 2 bytes past a 256-byte boundary here) get a plan of
    # their own alignment, not one that reads them as aligned
    big_a = cp.asarray(rng.standard_normal((65, 97)).astype(np.float16))
    big_b = cp.asarray(rng.standard_normal((97 * 48 + 1,)).astype(np.float16))
    a2, b2 = big_a.ravel()[1:1 + 64 * 96].reshape(64, 96), big_b[1:].reshape(97, 48)[:96]
    assert a2.flags.c_contiguous and b2.flags.c_contiguous and a2.data.ptr % 4 == 2
    out2 = cp.full((64, 48), np.nan, np.float16)
    lt.gemm_cublaslt_plan(a2, b2, out2)
    ref2 = cp.asnumpy(a2).astype(np.float64) @ cp.asnumpy(b2).astype(np.float64)
    assert OP.error(cp.asnumpy(out2), ref2) < OP.tolerance["float16"]
    assert (64, 48, 96, 2, 2) in lt._plans[0]
    monkeypatch.setattr(lt, "PLANS", 3)
    for n in range(1, 7):
        lt.gemm_cublaslt_plan(a, b[:, :n].copy(), cp.empty((64, n), np.float16))
    assert len(lt._plans[0]) == 3
    with pytest.raises(ValueError, match=r"C-contiguous, non-empty float16, bfloat16 \(int16\) "
                                         r"or float32 arrays of one dtype expected, got "
                                         r"float16 \(64, 96\) x float16 \(96, 24\)"):
        lt.gemm_cublaslt_plan(a, b[:, ::2], cp.empty((64, 24), np.float16))
    with pytest.raises(ValueError, match="got float16 .* x float32"):
        lt.gemm_cublaslt_plan(a, b.astype(np.float32), cp.empty((64, 48), np.float16))
