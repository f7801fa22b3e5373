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
``w_bsr32_g{G}_ptr``, ``_k``, ``_blk``  the 32x32 block rows in groups of G (G = 4, 8):
                                        int32 [n_groups + 1], int32 [E] (the column blocks
                                        present in any row of a group, ascending), int32
                                        [E * G] (entry e, group row r: the block's index in
                                        ``w_bsr32_values``, or -1); see ``bsr_row_groups``
=====================================  ====================================================
"""

from __future__ import annotations

import numpy as np

from adaptive.backends.cuda_args import ArgProvider, register
from adaptive.ops.sparse import BLOCK_SIZES

_NP = {"float16": np.float16, "float32": np.float32}
GROUP_SIZES = (4, 8)   # block rows per group of the w_bsr32_g{G}_* forms


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


def bsr_row_groups(indptr: np.ndarray, indices: np.ndarray,
                   group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The block rows of a BSR matrix in groups of ``group`` consecutive rows, for kernels
    that stage each slab of b once per group instead of once per row.

    Args:
        indptr: int [R + 1], the BSR block-row pointers.
        indices: int [blocks], column block of each block (no duplicates within a row).
        group: rows per group, >= 1; the last group may be partial (its missing rows and
            rows without blocks get -1 everywhere).

    Returns:
        (ptr int32 [ceil(R / group) + 1], k int32 [E], blk int32 [E * group]): entries
        ``ptr[g]:ptr[g + 1]`` of group g are the column blocks present in any of its rows,
        ascending, in ``k``; ``blk[e * group + r]`` is the index (into ``indices`` and the
        BSR values) of entry e's block in the group's row r, or -1 when that row lacks it.
    """
    if group < 1:
        raise ValueError(f"group must be >= 1 rows, got {group}")
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    if indptr.size == 0 or indptr[-1] != indices.size or np.any(np.diff(indptr) < 0):
        raise ValueError(f"expected BSR indptr [R + 1], non-decreasing, ending at the "
                         f"{indices.size} indices; got {indptr.size} entries ending at "
                         f"{indptr[-1] if indptr.size else None}")
    n_rows = indptr.size - 1
    n_groups = -(-n_rows // group)
    rows = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(indptr))
    width = int(indices.max()) + 1 if indices.size else 1
    uniq, inverse = np.unique((rows // group) * width + indices, return_inverse=True)
    ptr = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(uniq // width, minlength=n_groups), out=ptr[1:])
    slots = inverse.reshape(-1) * group + rows % group
    if np.unique(slots).size != slots.size:
        raise ValueError("BSR indices repeat a column block within a row: call "
                         "sort_indices()/sum_duplicates() on the BSR matrix first")
    blk = np.full(uniq.size * group, -1, dtype=np.int32)
    blk[slots] = np.arange(indices.size, dtype=np.int32)
    return ptr.astype(np.int32), (uniq % width).astype(np.int32), blk


def device_bsr_groups(w, group: int) -> tuple:
    """``bsr_row_groups`` of ``w``'s 32x32 BSR (the block order of ``device_bsr(w, 32)``)
    on the current device: (ptr, k, blk), int32 CuPy arrays."""
    def build():   # w's lock is reentrant: the host BSR may be built under it
        import cupy
        bsr = w.bsr(32)
        bsr.sort_indices()
        return tuple(cupy.asarray(x) for x in bsr_row_groups(bsr.indptr, bsr.indices, group))
    return w.cached(f"cuda{_device_id()}_bsr32_g{group}", build)


def device_dense(w):
    """The dense [M, K] form of ``w`` in its dtype on the current device."""
    def build():
        import cupy
        return cupy.asarray(w.csr().toarray().astype(_NP[w.dtype]))
    return w.cached(f"cuda{_device_id()}_dense", build)


def adopt_device_dense(w, dense) -> None:
    """Make ``dense`` (a CUDA array with ``__cuda_array_interface__``: w's dense form, of its
    shape and dtype, row-major) ``w``'s dense form on its device, shared, not copied. A
    patched pruned layer keeps its dense weight anyway (state_dict): built from the host
    CSR instead, spmm's dense baseline spent 152.7 ms of a serving prefill on its first
    routed call (run S85)."""
    import cupy
    arr = cupy.asarray(dense)
    if arr.shape != tuple(w.shape) or arr.dtype != _NP[w.dtype] or \
            not arr.flags.c_contiguous:
        raise ValueError(f"adopt_device_dense: expected a row-major {w.dtype} array of shape "
                         f"{tuple(w.shape)}, got {arr.dtype} {arr.shape} (row-major "
                         f"{arr.flags.c_contiguous})")
    w.cached(f"cuda{arr.device.id}_dense", lambda: arr)


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
for _g in GROUP_SIZES:
    for _i, _part in enumerate(("ptr", "k", "blk")):
        register("spmm", f"w_bsr32_g{_g}_{_part}",
                 ArgProvider(f"BSR (32x32 blocks) rows in groups of {_g}: {_part} (int32)",
                             call=lambda w, _g=_g, _i=_i: device_bsr_groups(w, _g)[_i],
                             index=0))
