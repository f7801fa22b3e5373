"""softmax: out[R, C] = exp(x - max) / sum(exp(x - max)) along each row."""

from __future__ import annotations

import numpy as np

from adaptive.ops.base import Op, Problem, random_array
from adaptive.ops.regimes import softmax_regimes


class Softmax(Op):
    name = "softmax"
    token_dims = ("R",)
    arrays = ("x",)
    regimes = softmax_regimes()   # large, masked (-inf), constant, tiny, mixed + generic
    reduction_dims = ("C",)

    def check_shapes(self, infos, args, params):
        (x,) = infos
        self._rank(self.name, "x", x, 2, "[R, C]")
        return {"R": x.shape[0], "C": x.shape[1]}, {}

    def out_shape(self, p: Problem) -> tuple:
        return (p.dim("R"), p.dim("C"))

    def roofline(self, p: Problem):
        n = p.dim("R") * p.dim("C")
        return 5.0 * n, float(2 * n * p.itemsize)

    def reference(self, x):
        x = np.asarray(x, np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def make_inputs(self, dims, dtype, rng, **stats):
        return (random_array(rng, (dims["R"], dims["C"]), dtype, scale=2.0),)
