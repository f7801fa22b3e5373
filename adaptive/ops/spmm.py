"""spmm: out[M, N] = w[M, K] @ b[K, N] with w a static :class:`SparseWeight`."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from adaptive.errors import InputValueError
from adaptive.ops.base import Op, Problem, random_array
from adaptive.ops.sparse import SparseWeight


class Spmm(Op):
    name = "spmm"
    arrays = ("w", "b")
    sparse = ("w",)
    dtypes = ("float16", "float32")

    def check_shapes(self, infos, args, params):
        w, b = infos
        self._rank(self.name, "b", b, 2, "[K, N]")
        if w.shape[1] != b.shape[0]:
            raise InputValueError(f"spmm: inner dimensions differ: w is {w.shape} "
                                  f"(K={w.shape[1]}) but b is {b.shape} (K={b.shape[0]})")
        return {"M": w.shape[0], "N": b.shape[1], "K": w.shape[1]}, args[0].stats()

    def out_shape(self, p: Problem) -> tuple:
        return (p.dim("M"), p.dim("N"))

    def roofline(self, p: Problem):
        m, n, k = p.dim("M"), p.dim("N"), p.dim("K")
        nnz = p.extra_dict["nnz"]
        nbytes = nnz * (p.itemsize + 4) + (k * n + m * n) * p.itemsize
        return 2.0 * nnz * n, float(nbytes)

    def features(self, p: Problem):
        feats = super().features(p)
        feats["log2_nnz"] = float(np.log2(max(feats.pop("nnz"), 1.0)))
        return feats

    def reference(self, w, b):
        dense = w.csr().toarray() if isinstance(w, SparseWeight) else (
            w.toarray() if sp.issparse(w) else w)
        return np.asarray(dense, np.float64) @ np.asarray(b, np.float64)

    def make_inputs(self, dims, dtype, rng, density=0.1, block=0, **stats):
        """A SparseWeight of the given density (in blocks of ``block`` if > 0) and dense b."""
        m, n, k = dims["M"], dims["N"], dims["K"]
        if block:
            nbm, nbk = -(-m // block), -(-k // block)
            mask = rng.random((nbm, nbk)) < density
            mask = np.kron(mask, np.ones((block, block), bool))[:m, :k]
        else:
            mask = rng.random((m, k)) < density
        if not mask.any():
            mask.flat[rng.integers(mask.size)] = True
        values = random_array(rng, (m, k), dtype)
        values[values == 0] = 1  # a kept entry is never an explicit zero
        w = SparseWeight(np.where(mask, values, 0).astype(values.dtype), dtype=dtype)
        return (w, random_array(rng, (k, n), dtype, scale=1.0 / np.sqrt(max(density * k, 1.0))))
