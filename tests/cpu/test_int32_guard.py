"""CUDA kernels take their dims as 32-bit ints (and spmm's CSR/BSR index arrays are
int32): every CUDA-language variant refuses an input past 2**31 in its ``requires``, so
such an input goes to a library variant or fails with a clear NoCandidateError."""

from __future__ import annotations

import pytest

from adaptive.ops import OPS
from adaptive.variants import default_registry

BIG = 2 ** 31
REG = default_registry()
CUDA = [v for op in REG.ops() for v in REG.variants(op, "cuda") if v.language == "cuda"]
DIMS = {"softmax": ("R", "C"), "gemm": ("M", "N", "K"), "attention": ("B", "H", "Lq", "Lk", "D"),
        "spmm": ("M", "N", "K"), "rmsnorm": ("R", "C")}


def _scope(op: str, **big) -> dict:
    scope = {d: 64 for d in DIMS[op]} | {"dtype": "float16", "itemsize": 2, "nnz": 4096.0,
                                          "density": 0.1, "causal": False, "scale": None,
                                          "eps": 1e-6}
    return scope | big


@pytest.mark.parametrize("v", CUDA, ids=lambda v: v.id)
def test_cuda_variant_refuses_each_dim_past_int32(v):
    names = [d for d in DIMS[v.op] if d not in ("B", "H")]   # B * H is the grid's y
    if v.op == "spmm":
        names.append("nnz")
    for name in names:
        why = v.why_not(_scope(v.op, **{name: BIG}))
        assert why is not None and "2 ** 31" in why, (v.id, name, why)
        assert v.why_not(_scope(v.op, **{name: BIG - 1})) is None or "2 ** 31" not in \
            v.why_not(_scope(v.op, **{name: BIG - 1}))


def test_every_op_with_cuda_kernels_is_covered():
    assert {v.op for v in CUDA} <= set(DIMS) and set(DIMS) <= set(OPS)
    assert len(CUDA) >= 20
