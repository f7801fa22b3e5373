"""Bad inputs are rejected with errors that name what was expected and what was got."""

from __future__ import annotations

import numpy as np
import pytest

import adaptive
from adaptive import InputTypeError, InputValueError, UnknownNameError


@pytest.fixture(scope="module")
def d():
    return adaptive.Dispatcher(backend="host")


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_unknown_op_suggests_nearest(d, rng):
    with pytest.raises(UnknownNameError, match="unknown op 'gem'; did you mean 'gemm'"):
        d.launch("gem", f32(rng, 2, 2), f32(rng, 2, 2))


@pytest.mark.parametrize("op,shapes,match", [
    ("gemm", [(3, 4, 1), (4, 2)], r"'a' must have rank 2 \(\[M, K\]\), got shape \(3, 4, 1\)"),
    ("gemm", [(3, 4), (5, 2)], r"inner dimensions differ: a is \(3, 4\) \(K=4\) but b is "
                               r"\(5, 2\) \(K=5\)"),
    ("softmax", [(3,)], r"'x' must have rank 2"),
    ("attention", [(1, 2, 3, 8), (1, 2, 3, 8), (1, 2, 4, 8)], r"k and v must have the same shape"),
    ("attention", [(1, 2, 3, 8), (1, 3, 3, 8), (1, 3, 3, 8)], r"multiple of k's.*H=2.*Hkv=3"),
    ("attention", [(1, 2, 3, 8), (1, 2, 3, 4), (1, 2, 3, 4)], r"must agree in B and D"),
    ("gemm", [(0, 4), (4, 2)], r"'a' has an empty dimension"),
])
def test_bad_shapes(d, rng, op, shapes, match):
    with pytest.raises(InputValueError, match=match):
        d.launch(op, *(f32(rng, *s) for s in shapes))


def test_causal_needs_lq_le_lk(d, rng):
    q, kv = f32(rng, 1, 1, 5, 8), f32(rng, 1, 1, 3, 8)
    with pytest.raises(InputValueError, match="causal needs Lq <= Lk, got Lq=5 and Lk=3"):
        d.launch("attention", q, kv, kv, causal=True)


def test_unsupported_dtype(d, rng):
    a = rng.integers(0, 5, (3, 3)).astype(np.int32)
    with pytest.raises(InputTypeError, match="unsupported dtype int32; expected one of float16, "
                                             "bfloat16, float32"):
        d.launch("gemm", a, a)


def test_mixed_dtypes(d, rng):
    with pytest.raises(InputTypeError, match="different dtypes \\(a is float32, b is float16\\)"):
        d.launch("gemm", f32(rng, 3, 3), f32(rng, 3, 3).astype(np.float16))


def test_non_contiguous(d, rng):
    a = f32(rng, 6, 6)[:, ::2]
    with pytest.raises(InputValueError, match="'a' is not C-contiguous"):
        d.launch("gemm", a, f32(rng, 3, 4))


def test_not_an_array(d, rng):
    with pytest.raises(InputTypeError, match="argument 'b' must be an array .* got list"):
        d.launch("gemm", f32(rng, 2, 2), [[1.0, 2.0], [3.0, 4.0]])


def test_wrong_arg_count(d, rng):
    with pytest.raises(InputTypeError, match=r"gemm takes 2 array arguments \(a, b\), got 1"):
        d.launch("gemm", f32(rng, 2, 2))


def test_unknown_and_mistyped_params(d, rng):
    q = f32(rng, 1, 1, 4, 8)
    with pytest.raises(UnknownNameError, match="did you mean 'causal'"):
        d.launch("attention", q, q, q, casual=True)
    with pytest.raises(InputTypeError, match="parameter 'causal' must be a scalar bool, got str"):
        d.launch("attention", q, q, q, causal="yes")


def test_mixed_devices_are_named():
    from adaptive.arrays import ArrayInfo
    from adaptive.ops import OPS

    class FakeDevice:
        """Pretends to live on a GPU through __cuda_array_interface__ (never dereferenced)."""

        def __init__(self, shape):
            self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (0, False),
                                             "version": 3, "strides": None}

    a = np.ones((2, 2), np.float32)
    assert isinstance(ArrayInfo, type)
    with pytest.raises((InputValueError, InputTypeError), match="different devices|mix array"):
        OPS["gemm"].problem((a, FakeDevice((2, 2))), {})


def test_spmm_needs_sparse_weight(d, rng):
    with pytest.raises(InputTypeError, match="must be an adaptive.SparseWeight"):
        d.launch("spmm", f32(rng, 4, 4), f32(rng, 4, 2))


def test_spmm_inner_dims(d, rng):
    w = adaptive.SparseWeight(f32(rng, 4, 6))
    with pytest.raises(InputValueError, match=r"w is \(4, 6\) \(K=6\) but b is \(5, 2\)"):
        d.launch("spmm", w, f32(rng, 5, 2))


def test_bad_out(d, rng):
    a, b = f32(rng, 3, 4), f32(rng, 4, 5)
    with pytest.raises(InputValueError, match=r"out has shape \(3, 4\).*expected shape \(3, 5\)"):
        d.launch("gemm", a, b, out=np.empty((3, 4), np.float32))
    d.launch("gemm", a, b)  # warm: the hit path checks out too
    with pytest.raises(InputValueError, match="dtype float16"):
        d.launch("gemm", a, b, out=np.empty((3, 5), np.float16))


def test_pinning_errors(d, rng):
    a, b = f32(rng, 3, 4), f32(rng, 4, 5)
    with pytest.raises(UnknownNameError, match="unknown variant of gemm 'host_blaz'; did you mean "
                                               "'host_blas'"):
        d.launch("gemm", a, b, variant="host_blaz")
    with pytest.raises(UnknownNameError, match="config parameter of 'host_blas' 'thread'"):
        d.launch("gemm", a, b, variant="host_blas", config={"thread": 1})
    with pytest.raises(InputValueError, match=r"threads=3 for 'host_blas' is not in its space"):
        d.launch("gemm", a, b, variant="host_blas", config={"threads": 3})
    x = f32(rng, 4, 8)
    with pytest.raises(InputValueError, match="does not fit this input .* requires rows < R"):
        d.launch("softmax", x, variant="host_blocked", config={"rows": 8})
