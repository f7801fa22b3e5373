"""rmsnorm: out[r, :] = weight · x[r, :] / sqrt(mean(x[r, :]²) + eps), row-wise over x[R, C].

The normalisation of Llama-family models (transformers' ``LlamaRMSNorm`` and its copies):
the mean of squares in fp32, the normalised row rounded to x's dtype, then multiplied by
``weight`` [C] in that dtype. A decode step runs it twice a layer on a few rows, where
PyTorch's eight kernels (cast, square, mean, add, rsqrt, multiply, cast, multiply) cost
the host more than the work: one fused launch is the point of the op's kernels.
"""

from __future__ import annotations

import math

import numpy as np

from adaptive.errors import InputValueError
from adaptive.ops.base import Op, Param, Problem, random_array
from adaptive.ops.regimes import rmsnorm_regimes


class RMSNorm(Op):
    name = "rmsnorm"
    token_dims = ("R",)
    arrays = ("x", "weight")
    regimes = rmsnorm_regimes()   # outliers, tiny, constant rows + generic
    reduction_dims = ("C",)
    params = (
        Param("eps", (float, int), 1e-6, "added to the mean of squares (a positive number)",
              checks=((lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),)),
    )

    def check_shapes(self, infos, args, params):
        x, w = infos
        self._rank(self.name, "x", x, 2, "[R, C]")
        self._rank(self.name, "weight", w, 1, "[C]")
        if w.shape[0] != x.shape[1]:
            raise InputValueError(f"rmsnorm: weight has {w.shape[0]} elements but x has "
                                  f"C={x.shape[1]} columns; expected weight [C]")
        return {"R": x.shape[0], "C": x.shape[1]}, {}

    def out_shape(self, p: Problem) -> tuple:
        return (p.dim("R"), p.dim("C"))

    def roofline(self, p: Problem):
        n = p.dim("R") * p.dim("C")
        return 4.0 * n, float((2 * n + p.dim("C")) * p.itemsize)

    def reference(self, x, weight, eps: float = 1e-6):
        x = np.asarray(x, np.float64)
        rms = np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)
        return np.asarray(weight, np.float64)[None, :] * (x / rms)

    def make_inputs(self, dims, dtype, rng, **stats):
        return (random_array(rng, (dims["R"], dims["C"]), dtype),
                random_array(rng, (dims["C"],), dtype, scale=0.5) + 1.0)
