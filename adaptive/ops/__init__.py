"""The ops: one instance each, looked up by name."""

from __future__ import annotations

from adaptive.errors import UnknownNameError
from adaptive.ops.attention import Attention
from adaptive.ops.base import KEY_VERSION, Op, Param, Problem
from adaptive.ops.gemm import Gemm
from adaptive.ops.rmsnorm import RMSNorm
from adaptive.ops.softmax import Softmax
from adaptive.ops.sparse import SparseWeight
from adaptive.ops.spmm import Spmm

OPS: dict[str, Op] = {op.name: op for op in (Gemm(), Spmm(), Attention(), Softmax(),
                                                  RMSNorm())}


def get_op(name: str) -> Op:
    """The op called ``name``; a clear error with the nearest name otherwise."""
    try:
        return OPS[name]
    except (KeyError, TypeError):
        raise UnknownNameError("op", str(name), OPS) from None


__all__ = ["OPS", "KEY_VERSION", "Op", "Param", "Problem", "SparseWeight", "get_op"]
