"""The cuBLAS gemm of gemm's ``cublas`` and spmm's ``cublas_dense``
(adaptive.backends.cuda_blas: cuBLASLt, each shape's plan kept) against float64 references
on fresh random inputs: decode and odd shapes, float16, bfloat16 (int16 memory) and
float32, large magnitudes, outputs poisoned with NaN, a side stream, two streams at once
on one plan (each its own workspace); a shape met again reuses its plan, the plans kept per
device stay bounded, strided and mixed-dtype calls go to ``cupy.matmul`` and a strided
bfloat16 call is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.ops import get_op

pytestmark = pytest.mark.gpu

OP = get_op("gemm")


@pytest.fixture(scope="module")
def lt(cp):
    from adaptive.backends import cuda_blas
    return cuda_blas


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
        lt.gemm(da, db, out)
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
        lt.gemm(a, b, out)
    side.synchronize()
    assert OP.error(cp.asnumpy(out), ref) < OP.tolerance["float16"]
    # views at an offset (a row slice: 2 bytes past a 256-byte boundary here) get a plan of
    # their own alignment, not one that reads them as aligned
    big_a = cp.asarray(rng.standard_normal((65, 97)).astype(np.float16))
    big_b = cp.asarray(rng.standard_normal((97 * 48 + 1,)).astype(np.float16))
    a2, b2 = big_a.ravel()[1:1 + 64 * 96].reshape(64, 96), big_b[1:].reshape(97, 48)[:96]
    assert a2.flags.c_contiguous and b2.flags.c_contiguous and a2.data.ptr % 4 == 2
    out2 = cp.full((64, 48), np.nan, np.float16)
    lt.gemm(a2, b2, out2)
    ref2 = cp.asnumpy(a2).astype(np.float64) @ cp.asnumpy(b2).astype(np.float64)
    assert OP.error(cp.asnumpy(out2), ref2) < OP.tolerance["float16"]
    assert (64, 48, 96, 2, 2) in lt._plans[0]
    monkeypatch.setattr(lt, "PLANS", 3)
    for n in range(1, 7):
        lt.gemm(a, b[:, :n].copy(), cp.empty((64, n), np.float16))
    assert len(lt._plans[0]) == 3
    # strided or mixed dtypes: cupy.matmul's own handling; strided bfloat16 refused
    out3 = cp.full((64, 24), np.nan, np.float16)
    lt.gemm(a, b[:, ::2], out3)
    ref3 = ref.reshape(64, 48)[:, ::2]
    assert OP.error(cp.asnumpy(out3), ref3) < OP.tolerance["float16"]
    out4 = cp.full((64, 48), np.nan, np.float32)
    lt.gemm(a, b.astype(np.float32), out4)
    assert OP.error(cp.asnumpy(out4), ref) < OP.tolerance["float32"]
    bits = cp.zeros((96, 48), np.int16)
    with pytest.raises(ValueError, match=r"cuBLAS gemm: bfloat16 \(int16\) arrays must be "
                                         r"C-contiguous, non-empty and of one dtype, got int16 "
                                         r"\(64, 96\) x int16 \(96, 24\)"):
        lt.gemm(a.view(np.int16), bits[:, ::2], cp.empty((64, 24), np.int16))


def test_two_streams_at_once_on_one_plan(lt, cp):
    """Split-K shapes (M small, K long) whose algorithm takes a workspace, issued on two
    streams alternately without a synchronise between: each stream's own workspace."""
    rng = np.random.default_rng(11)
    m, n, k = 16, 4096, 14336
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    b = cp.asarray((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16))
    a_host = [rng.standard_normal((m, k)).astype(np.float16) for _ in streams]
    a = [cp.asarray(x) for x in a_host]
    outs = [cp.full((m, n), np.nan, np.float16) for _ in streams]
    cp.cuda.Device().synchronize()
    for _ in range(20):
        for s, x, o in zip(streams, a, outs):
            with s:
                lt.gemm(x, b, o)
    for s in streams:
        s.synchronize()
    bh = cp.asnumpy(b).astype(np.float64)
    for x, o in zip(a_host, outs):
        assert OP.error(cp.asnumpy(o), x.astype(np.float64) @ bh) < OP.tolerance["float16"]
    plan = lt._plans[0][(m, n, k, 2, 256)]
    if plan.workspace_size:
        assert {(0, s.ptr) for s in streams} <= set(lt._workspaces)
