"""On the GPU, an input past 2**31 elements in one dim never reaches a kernel that
takes 32-bit dims: softmax (CUDA kernels only) says so in a NoCandidateError, and a pinned
kernel refuses naming the guard; gemm falls to cuBLAS."""

from __future__ import annotations

import pytest

from adaptive.errors import InputValueError, NoCandidateError

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def dispatcher():
    from adaptive import Dispatcher
    return Dispatcher("cuda")


def test_softmax_row_past_int32_is_refused_clearly(cp, dispatcher):
    x = cp.zeros((1, 2 ** 31), dtype=cp.float16)       # 4 GiB
    try:
        with pytest.raises(NoCandidateError, match=r"2 \*\* 31"):
            dispatcher.launch("softmax", x)
        with pytest.raises(InputValueError, match=r"2 \*\* 31"):
            dispatcher.launch("softmax", x, variant="warp_row", config={"WARPS": 4, "VEC": 4})
    finally:
        del x
        cp.get_default_memory_pool().free_all_blocks()


def test_gemm_with_a_dim_past_int32_is_not_given_to_a_kernel(cp, dispatcher):
    m = 2 ** 31
    cands = dispatcher.candidates("gemm", cp.zeros((1, 1), cp.float16),
                                  cp.zeros((1, 1), cp.float16))
    assert any(c.variant.language == "cuda" for c in cands)
    a = cp.zeros((m, 1), dtype=cp.float16)              # 4 GiB
    b = cp.zeros((1, 2), dtype=cp.float16)
    try:
        big = dispatcher.candidates("gemm", a, b)
        assert big and all(c.variant.language != "cuda" for c in big), big
    finally:
        del a, b
        cp.get_default_memory_pool().free_all_blocks()
