"""gemm: out[M, N] = a[M, K] @ b[K, N]."""

from __future__ import annotations

import numpy as np

from adaptive.errors import InputValueError
from adaptive.ops.base import Op, Problem, random_array
from adaptive.ops.regimes import matmul_regimes


class Gemm(Op):
    name = "gemm"
    # the rows of x @ w, or the columns of w @ x^T (a weight kept [out, in] as given, as
    # patch(layout="torch") launches it): either is a token count, classed by octave
    # quarters, so a new prompt length reuses its class's decision in both layouts
    token_dims = ("M", "N")
    arrays = ("a", "b")
    regimes = matmul_regimes(sparse=False)   # accumulate, extreme, mixed + generic
    reduction_dims = ("K",)

    def check_shapes(self, infos, args, params):
        a, b = infos
        self._rank(self.name, "a", a, 2, "[M, K]")
        self._rank(self.name, "b", b, 2, "[K, N]")
        if a.shape[1] != b.shape[0]:
            raise InputValueError(f"gemm: inner dimensions differ: a is {a.shape} (K={a.shape[1]})"
                                  f" but b is {b.shape} (K={b.shape[0]})")
        return {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1]}, {}

    def out_shape(self, p: Problem) -> tuple:
        return (p.dim("M"), p.dim("N"))

    def roofline(self, p: Problem):
        m, n, k = p.dim("M"), p.dim("N"), p.dim("K")
        return 2.0 * m * n * k, float((m * k + k * n + m * n) * p.itemsize)

    def reference(self, a, b):
        return np.asarray(a, np.float64) @ np.asarray(b, np.float64)

    def make_inputs(self, dims, dtype, rng, **stats):
        m, n, k = dims["M"], dims["N"], dims["K"]
        scale = 1.0 / np.sqrt(k)
        return (random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype, scale))
