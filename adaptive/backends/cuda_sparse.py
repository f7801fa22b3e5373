"""Device formats of a :class:`~adaptive.SparseWeight` for spmm's cuda variants.

A weight is static, so its CSR, BSR and dense forms are copied to a GPU once and cached
on the handle (``SparseWeight.cached``), one entry per format, device and dtype. The
kernel-argument providers registered here name these arrays for a manifest's
``launch.args``:

=====================================  ====================================================
``w_csr_indptr``, ``w_csr_indices``     int32 [M + 1], int32 [nnz]
``w_csr_values``                        T [nnz]
``w_bsr{B}_indptr``, ``_indices``       int32 [ceil(M / B) + 1], int32 [blocks] (B = 16, 32, 64)
``w_bsr{B}_values``                     T [blocks, B, B], each block row-major; the matrix is
                                        zero-padded to multiples of B
``w_bsr{B}_order``                      int32 [ceil(M / B)]: the block rows by their number of
                                        blocks, most first (ties by row), for balancing
=====================================  ====================================================
"""

from __future__ import annotations

import numpy as np

from adaptive.backends.cuda_args import ArgProvider, register
from adaptive.ops.sparse import BLOCK_SIZES

_NP = {"float16": np.float16, "float32": np.float32}


def _device_id() -> int:
    import cupy
    return cupy.cuda.runtime.getDevice()


def device_csr(w) -> tuple:
    """(indptr int32, indices int32, values T) of ``w`` on the current device."""
    def build():
        import cupy
        csr = w.csr()
        return (cupy.asarray(csr.indptr.astype(np.int32)),
                cupy.asarray(csr.indices.astype(np.int32)),
                cupy.asarray(csr.data.astype(_NP[w.dtype])))
    return w.cached(f"cuda{_device_id()}_csr", build)


def device_bsr(w, block: int) -> tuple:
    """(indptr int32, indices int32, values T [blocks, block, block]) on the current device."""
    if block not in BLOCK_SIZES:
        raise ValueError(f"BSR block size must be one of {BLOCK_SIZES}, got {block}")

    def build():   # w's lock is reentrant: the host BSR may be built under it
        import cupy
        bsr = w.bsr(block)
        bsr.sort_indices()
        return (cupy.asarray(bsr.indptr.astype(np.int32)),
                cupy.asarray(bsr.indices.astype(np.int32)),
                cupy.asarray(np.ascontiguousarray(bsr.data.astype(_NP[w.dtype]))))
    return w.cached(f"cuda{_device_id()}_bsr{block}", build)


def rows_by_block_count(indptr: np.ndarray) -> np.ndarray:
    """Block rows sorted by their number of blocks, most first, ties by row (int32)."""
    counts = np.diff(np.asarray(indptr, dtype=np.int64))
    return np.argsort(-counts, kind="stable").astype(np.int32)


def device_bsr_order(w, block: int):
    """``rows_by_block_count`` of ``w``'s BSR with this block size, on the current device."""
    def build():   # w's lock is reentrant: building from another format is fine
        import cupy
        return cupy.asarray(rows_by_block_count(w.bsr(block).indptr))
    return w.cached(f"cuda{_device_id()}_bsr{block}_order", build)


def device_dense(w):
    """The dense [M, K] form of ``w`` in its dtype on the current device."""
    def build():
        import cupy
        return cupy.asarray(w.csr().toarray().astype(_NP[w.dtype]))
    return w.cached(f"cuda{_device_id()}_dense", build)


def _csr_part(i: int):
    return lambda w: device_csr(w)[i]


def _bsr_part(block: int, i: int):
    return lambda w: device_bsr(w, block)[i]


_PARTS = ("indptr", "indices", "values")
for _i, _part in enumerate(_PARTS):
    register("spmm", f"w_csr_{_part}",
             ArgProvider(f"CSR {_part} of w on the device (cached on the weight)",
                         call=_csr_part(_i), index=0))
    for _b in BLOCK_SIZES:
        register("spmm", f"w_bsr{_b}_{_part}",
                 ArgProvider(f"BSR ({_b}x{_b} blocks) {_part} of w on the device",
                             call=_bsr_part(_b, _i), index=0))
for _b in BLOCK_SIZES:
    register("spmm", f"w_bsr{_b}_order",
             ArgProvider(f"BSR ({_b}x{_b} blocks) rows by block count, most first (int32)",
                         call=lambda w, _b=_b: device_bsr_order(w, _b), index=0))
