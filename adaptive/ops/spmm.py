"""spmm: out[M, N] = w[M, K] @ b[K, N] with w a static :class:`SparseWeight`.

N is the token count when spmm serves a Linear layer (b = x transposed). Besides the
op, this module names the device form of a 2:4 weight for the cuda kernels
(``w_24_vals``, ``w_24_meta``: :meth:`Sparse24.fragments` on the device, cached on the
weight); CSR/BSR forms are named in ``adaptive/backends/cuda_sparse.py``.
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np

from adaptive.backends.cuda_args import ArgProvider, register
from adaptive.errors import InputValueError
from adaptive.ops.base import Op, Problem, random_array
from adaptive.ops.regimes import matmul_regimes
from adaptive.ops.sparse import SparseWeight


def device_24(w: SparseWeight) -> tuple:
    """(values, meta) of ``w``'s 2:4 fragment form on the current CuPy device (built once per
    device: :meth:`Sparse24.fragments`)."""
    import cupy
    device = cupy.cuda.runtime.getDevice()

    def build():
        vals, meta = w.sparse24().fragments()
        return cupy.asarray(vals), cupy.asarray(meta)
    return w.cached(f"cuda{device}_24_fragments", build)


register("spmm", "w_24_vals", ArgProvider(
    "2:4 compressed values of w in mma.sp fragment order (16 bytes a lane and 16 x 32 tile)",
    call=lambda w: device_24(w)[0], index=0))
register("spmm", "w_24_meta", ArgProvider(
    "2:4 metadata of w, one uint32 per metadata lane and 16 x 32 tile",
    call=lambda w: device_24(w)[1], index=0))


class Spmm(Op):
    name = "spmm"
    token_dims = ("N",)
    arrays = ("w", "b")
    sparse = ("w",)
    dtypes = ("float16", "float32")
    regimes = matmul_regimes(sparse=True)   # accumulate, extreme, mixed, empty_rows + generic
    reduction_dims = ("K",)
    tile_fill = True   # csr_rowsplit at N = 8 and LANES_N x VEC = 16: half its tile idle
    refine_configs = 1   # see Op.refine_configs

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
        extra = p.extra_dict
        nnz = extra["nnz"]
        w_bytes = nnz * (p.itemsize + 4)                 # CSR: a value and an index each
        if extra.get("is_2to4"):    # 2:4 compressed: K/2 values and K/8 metadata bytes a row
            w_bytes = min(w_bytes, m * (2 * -(-k // 4) * p.itemsize + 2 * -(-k // 16)))
        nbytes = w_bytes + (k * n + m * n) * p.itemsize
        return 2.0 * nnz * n, float(nbytes)

    def features(self, p: Problem):
        feats = super().features(p)
        feats["log2_nnz"] = float(np.log2(max(feats.pop("nnz"), 1.0)))
        return feats

    def work(self, features, variant, config):
        """The weight a candidate reads, by the form its declared arguments name (a BSR
        form reads whole blocks, the zeros inside included; CSR its non-zeros; the 2:4
        form half of the dense weight) or its ``block`` config (SciPy BSR):
        ``log2_fill``, stored entries read per non-zero (log2 of block density / density:
        a 16x16-structured weight costs a 32x32 kernel 4x the work, 0 for CSR), and
        ``log2_row_entries``, the entries (blocks or non-zeros) one row of the form holds,
        the chain one block row's walk makes. ``{}`` for a library call (its variant
        alone names what it reads)."""
        block = _form_block(variant, config)
        if block is None:
            return {}
        density = max(float(features.get("density", 0.0)), 1e-12)
        k = 2.0 ** float(features.get("log2_K", 0.0))
        if block == 0:                        # the 2:4 compressed form: half of each row
            stored, per_row = 0.5, k / 2
        elif block == 1:                      # CSR: the non-zeros
            stored, per_row = density, k * density
        else:
            stored = max(float(features.get(f"block_density_{block}", 1.0)), density)
            per_row = -(-k // block) * stored
        return {"log2_fill": math.log2(max(stored, density) / density),
                "log2_row_entries": math.log2(max(per_row, 2.0 ** -20))}

    def work_key(self, variant, config):
        """:meth:`work` reads only the form a candidate reads (its block size)."""
        return ("form", _form_block(variant, config))

    def reference(self, w, b):
        dense = w.csr().toarray() if isinstance(w, SparseWeight) else (
            w.toarray() if type(w).__module__.startswith("scipy.sparse") else w)
        return np.asarray(dense, np.float64) @ np.asarray(b, np.float64)

    def make_inputs(self, dims, dtype, rng, density=0.1, block=0, is_2to4=0.0, **stats):
        """A SparseWeight of the given density (in blocks of ``block`` if > 0) and dense b.
        With ``is_2to4`` the weight is then pruned to 2:4 (a density of 0.45 or more asks
        for a fully pruned dense matrix: density ~0.5)."""
        m, n, k = dims["M"], dims["N"], dims["K"]
        if is_2to4 and density >= 0.45:
            w = SparseWeight(prune_24(random_array(rng, (m, k), dtype)), dtype=dtype)
            return w, random_array(rng, (k, n), dtype, scale=1.0 / np.sqrt(max(k / 2, 1.0)))
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
        dense = np.where(mask, values, 0).astype(values.dtype)
        w = SparseWeight(prune_24(dense) if is_2to4 else dense, dtype=dtype)
        return (w, random_array(rng, (k, n), dtype, scale=1.0 / np.sqrt(max(density * k, 1.0))))


_FORM_ARG = re.compile(r"^w_(?:bsr(\d+)|(csr)|(24))_")


def _form_block(variant, config) -> int | None:
    """The block size of the weight form a candidate reads (1: CSR, 0: the 2:4 form), from
    its kernel arguments (``w_bsr32_values``: 32) or a ``block`` config; None: not said."""
    if isinstance(config.get("block"), int) and config["block"] > 0:
        return int(config["block"])
    hit = _VARIANT_BLOCK.get(id(variant))   # a miss asks for each of ~100 candidates
    if hit is not None and hit[0] is variant:
        return hit[1]
    block = _args_block(tuple(str(a) for a in (variant.launch or {}).get("args", ())))
    if len(_VARIANT_BLOCK) >= 1024:
        _VARIANT_BLOCK.clear()
    _VARIANT_BLOCK[id(variant)] = (variant, block)
    return block


# id(variant) -> (variant, the block its arguments name): kept with the variant itself, so
# a new variant object under a reused id is looked up afresh
_VARIANT_BLOCK: dict = {}


@functools.lru_cache(maxsize=256)   # one entry per distinct argument list (a variant's)
def _args_block(args: tuple[str, ...]) -> int | None:
    for arg in args:
        m = _FORM_ARG.match(arg)
        if m:
            return int(m.group(1)) if m.group(1) else (1 if m.group(2) else 0)
    return None


def prune_24(dense: np.ndarray) -> np.ndarray:
    """``dense`` [M, K] with the 2 smallest-magnitude entries of every group of 4 columns set
    to zero (the last group of a row counts its missing columns as zeros)."""
    m, k = dense.shape
    groups = -(-k // 4)
    padded = np.zeros((m, groups * 4), dense.dtype)
    padded[:, :k] = dense
    quads = padded.reshape(m, groups, 4)
    drop = np.argsort(np.abs(quads), axis=2, kind="stable")[:, :, :2]
    np.put_along_axis(quads, drop, 0, axis=2)
    return np.ascontiguousarray(padded[:, :k])
