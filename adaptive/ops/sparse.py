"""SparseWeight: a static sparse matrix for ``spmm``, with its formats built once.

Inference weights do not change between calls, so statistics (nnz, density, the
fraction of non-empty 16/32/64 blocks, whether the matrix is 2:4 structured) are computed
once at construction and every format (dense, CSR, BSR with a block size, the 2:4
compressed form, on the host or a device) is built the first time a variant asks for it
and then cached on the handle.

2:4 structure: in every group of 4 consecutive columns of a row (columns 4j..4j+3, the
last group zero-padded when K is not a multiple of 4) at most 2 entries are non-zero.
Such a weight has a compressed form (:class:`Sparse24`, layout in
``variants/spmm/convention.md``): the 2 kept values of each group and their 2-bit
positions, half the value bytes plus 1/8 of that for the positions.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse as sp

from adaptive import arrays
from adaptive.arrays import ArrayInfo
from adaptive.errors import InputTypeError, InputValueError

BLOCK_SIZES = (16, 32, 64)
_ROWS_PER_PASS = 1024     # rows handled at once when scanning or compressing a weight
_HOST_DTYPES = {"float16": np.float32, "float32": np.float32, "float64": np.float64}


@dataclasses.dataclass(frozen=True, eq=False)
class Sparse24:
    """The 2:4 compressed form of an [M, K] weight (layout: variants/spmm/convention.md).

    Attributes:
        values: [M, 2 * G] in the weight's dtype (G = ceil(K / 4) groups): the 2 kept
            entries of group j of each row at columns 2j, 2j + 1, in column order (an entry
            kept to fill a group with fewer than 2 non-zeros is 0).
        positions: uint8 [M, 2 * G], the column of each kept entry within its group (0..3),
            ascending within a group.
        meta: uint16 [M, ceil(G / 4)]: the positions as 4-bit codes, group j at bits
            4 (j % 4) .. 4 (j % 4) + 3 of word j // 4 (first position in the low 2 bits);
            groups past the last are code 0b0100 (positions 0 and 1).
    """

    values: np.ndarray
    positions: np.ndarray
    meta: np.ndarray

    def fragments(self) -> tuple[np.ndarray, np.ndarray]:
        """The form in the order ``mma.sp`` m16n8k32 reads it (the ``sparse24_mma`` and
        ``sparse24_stream`` kernels):
        (values [ceil(M / 16), ceil(K / 32), 32 lanes, 8] in the weight's dtype, meta uint32
        [ceil(M / 16), ceil(K / 32), 16]); rows and columns padded with zeros. Lane
        l = 4 g + t of tile (i, c) holds rows 16 i + g, + 8 and compressed columns 16 c + 2 t,
        + 1, + 8, + 9 in register order; meta word 2 g + t' (t' = 0, 1) is the 16-bit
        metadata of row 16 i + g (low half) and 16 i + g + 8 (high half) for logical columns
        32 c + 16 t' .. + 15. See variants/spmm/convention.md."""
        m, kept = self.values.shape
        mt, kc = -(-m // 16), -(-kept // 16)
        vals = np.zeros((mt * 16, kc * 16), self.values.dtype)
        vals[:m, :kept] = self.values
        # rows (rh, g), columns (ch, t, e) -> [i, c, g, t, ch, rh, e]: register ch*2+rh, half e
        frag = vals.reshape(mt, 2, 8, kc, 2, 4, 2).transpose(0, 3, 2, 5, 4, 1, 6)
        meta = np.full((mt * 16, kc * 2), 0x4444, np.uint32)
        meta[:m, :self.meta.shape[1]] = self.meta
        halves = meta.reshape(mt, 2, 8, kc, 2)
        words = (halves[:, 0] | (halves[:, 1] << 16)).transpose(0, 2, 1, 3)   # [i, c, g, t']
        return (np.ascontiguousarray(frag).reshape(mt, kc, 32, 8),
                np.ascontiguousarray(words).reshape(mt, kc, 16).astype(np.uint32))

    def dense(self, k: int) -> np.ndarray:
        """The [M, k] matrix this form encodes (for checks), in float64."""
        m, kept = self.values.shape
        out = np.zeros((m, kept * 2), np.float64)
        cols = (np.arange(kept) // 2 * 4)[None, :] + self.positions
        np.put_along_axis(out, cols.astype(np.int64), self.values.astype(np.float64), axis=1)
        return out[:, :k]


def _pair_table() -> np.ndarray:
    """For each 4-bit mask of non-zeros in a group: the 2 positions kept (its non-zeros, then
    its lowest zero columns, in column order); [-1, -1] for masks with more than 2 bits."""
    table = np.full((16, 2), -1, np.int64)
    for mask in range(16):
        nz = [i for i in range(4) if mask >> i & 1]
        if len(nz) <= 2:
            fill = [i for i in range(4) if i not in nz][:2 - len(nz)]
            table[mask] = sorted(nz + fill)
    return table


_PAIRS = _pair_table()


def compress_24(dense: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(values, positions) of 2:4 rows ``dense`` [R, K] (see :class:`Sparse24`).

    Each group keeps its non-zeros, then its lowest zero columns, up to 2, in column order.
    Raises if a group has more than 2 non-zeros."""
    r, k = dense.shape
    groups = -(-k // 4)
    padded = np.zeros((r, groups * 4), dense.dtype)
    padded[:, :k] = dense
    quads = padded.reshape(r, groups, 4)
    masks = (quads != 0).astype(np.uint8) @ np.array([1, 2, 4, 8], np.uint8)
    order = _PAIRS[masks]
    if r and groups and int(order.min()) < 0:
        row, grp = np.argwhere(order[:, :, 0] < 0)[0]
        raise InputValueError(f"SparseWeight: not 2:4 structured: row {row} has "
                              f"{bin(int(masks[row, grp])).count('1')} non-zeros in columns "
                              f"{4 * grp}..{4 * grp + 3}; expected at most 2 in every group "
                              "of 4")
    values = np.take_along_axis(quads, order, axis=2).reshape(r, groups * 2).astype(dtype)
    return values, order.reshape(r, groups * 2).astype(np.uint8)


def pack_meta(positions: np.ndarray) -> np.ndarray:
    """uint16 [R, ceil(G / 4)] metadata words of uint8 positions [R, 2 G] (Sparse24.meta)."""
    r, kept = positions.shape
    groups = kept // 2
    words = -(-groups // 4)
    codes = np.full((r, words * 4), 0b0100, np.uint16)     # padding groups: positions 0, 1
    pairs = positions.reshape(r, groups, 2).astype(np.uint16)
    codes[:, :groups] = pairs[:, :, 0] | (pairs[:, :, 1] << 2)
    shifts = (np.arange(4, dtype=np.uint16) * 4)[None, None, :]
    return np.bitwise_or.reduce(codes.reshape(r, words, 4) << shifts, axis=2).astype(np.uint16)


def _bucket(x: float) -> int:
    """Density bucket for keys: log2 steps, so 9% and 11% share a plan but 1% does not."""
    return 0 if x <= 0 else int(round(np.log2(x) * 2))


class SparseWeight:
    """A sparse [M, K] matrix for ``adaptive.launch("spmm", w, b)``.

    Args:
        matrix: a dense NumPy/CuPy array or tensor (zeros are dropped) or a SciPy sparse
            matrix.
        dtype: "float16" or "float32"; default the matrix's own.

    Example:
        >>> w = SparseWeight(np.where(rng.random((64, 64)) < 0.1, 1.0, 0.0).astype("float32"))
        >>> w.nnz, round(w.density, 2)
    """

    def __init__(self, matrix, dtype: str | None = None):
        import scipy.sparse as sp   # on first use: not at `import adaptive`
        device = "cpu"
        if sp.issparse(matrix):
            csr = sp.csr_matrix(matrix)
            src_dtype = csr.dtype.name
        else:
            info = arrays.info(matrix)
            device = info.device
            if len(info.shape) != 2:
                raise InputValueError(f"SparseWeight needs a 2-D matrix [M, K], got shape "
                                      f"{info.shape}")
            src_dtype = info.dtype
            csr = sp.csr_matrix(arrays.to_numpy(matrix).astype(
                _HOST_DTYPES.get(src_dtype, np.float32)))
        dtype = dtype or src_dtype
        if dtype not in ("float16", "float32"):
            raise InputTypeError(f"SparseWeight: unsupported dtype {dtype}; expected float16 or "
                                 "float32")
        if 0 in csr.shape:
            raise InputValueError(f"SparseWeight: empty matrix of shape {csr.shape}")
        csr.eliminate_zeros()
        csr.sort_indices()
        self._host_csr = csr.astype(_HOST_DTYPES[dtype])
        self.shape = tuple(csr.shape)
        self.dtype = dtype
        self.device = device
        self.nnz = int(csr.nnz)
        self.density = self.nnz / float(self.shape[0] * self.shape[1])
        self.block_density = {b: self._block_density(b) for b in BLOCK_SIZES}
        self.is_2to4 = self._detect_2to4()
        self._sig = (SparseWeight, self.shape, dtype, device, _bucket(self.density),
                     _bucket(self.block_density[32]), self.is_2to4)
        self._formats: dict = {}
        self._lock = threading.RLock()  # a format may be built from another (bsr from csr)

    def _block_density(self, b: int) -> float:
        csr = self._host_csr
        rows = np.repeat(np.arange(self.shape[0]), np.diff(csr.indptr)) // b
        cols = csr.indices // b
        nbc = -(-self.shape[1] // b)
        total = (-(-self.shape[0] // b)) * nbc
        occupied = np.zeros(total, bool)     # a scatter, not a sort: O(nnz)
        occupied[rows.astype(np.int64) * nbc + cols] = True
        return int(np.count_nonzero(occupied)) / total

    def _detect_2to4(self) -> bool:
        """At most 2 non-zeros in every group of 4 columns of every row: column indices are
        sorted within rows, so a third non-zero in a group sits 2 entries after the first."""
        csr = self._host_csr
        groups = -(-self.shape[1] // 4)
        for r0 in range(0, self.shape[0], _ROWS_PER_PASS):
            r1 = min(r0 + _ROWS_PER_PASS, self.shape[0])
            lo, hi = csr.indptr[r0], csr.indptr[r1]
            rows = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(csr.indptr[r0:r1 + 1]))
            gid = rows * groups + csr.indices[lo:hi] // 4
            if gid.size > 2 and bool(np.any(gid[2:] == gid[:-2])):
                return False
        return True

    # ---- array protocol used by adaptive.arrays ----------------------------------------------
    @staticmethod
    def signature(w: SparseWeight) -> tuple:
        return w._sig

    def info(self) -> ArrayInfo:
        return ArrayInfo("sparse", self.shape, self.dtype, True, self.device)

    def stats(self) -> dict[str, float]:
        """Statistics used as features: density, nnz, 2:4 structure (1.0 / 0.0), block
        densities."""
        out = {"density": self.density, "nnz": float(self.nnz), "is_2to4": float(self.is_2to4)}
        for b, d in self.block_density.items():
            out[f"block_density_{b}"] = d
        return out

    # ---- formats ----------------------------------------------------------------------------
    def cached(self, name: str, build: Callable[[], object]):
        """The format called ``name``, built by ``build()`` the first time (thread-safe)."""
        value = self._formats.get(name)
        if value is None:
            with self._lock:
                value = self._formats.get(name)
                if value is None:
                    value = build()
                    self._formats[name] = value
        return value

    def csr(self) -> sp.csr_matrix:
        """Host CSR (float32 for float16 weights: SciPy has no float16 kernels)."""
        return self._host_csr

    def dense(self) -> np.ndarray:
        """Host dense form, in the compute dtype of the host backend."""
        return self.cached("host_dense", self._host_csr.toarray)

    def bsr(self, block: int) -> sp.bsr_matrix:
        """Host BSR with square blocks of this size (the matrix padded to a multiple)."""
        def build():
            import scipy.sparse as sp
            m, k = self.shape
            pm, pk = -(-m // block) * block, -(-k // block) * block
            padded = sp.csr_matrix((self._host_csr.data, self._host_csr.indices,
                                    self._host_csr.indptr), shape=(m, k))
            if (pm, pk) != (m, k):
                padded.resize((pm, pk))
            return padded.tobsr(blocksize=(block, block))
        return self.cached(f"host_bsr{block}", build)

    def sparse24(self) -> Sparse24:
        """The 2:4 compressed form (host, built once); raises if the weight is not 2:4."""
        if not self.is_2to4:
            raise InputValueError(f"SparseWeight{self.shape}: not 2:4 structured (some group "
                                  "of 4 consecutive columns of a row has 3 or 4 non-zeros); "
                                  "prune it to 2:4 first or use the CSR/BSR variants")

        def build():
            m = self.shape[0]
            np_dtype = np.float16 if self.dtype == "float16" else np.float32
            parts = [compress_24(self._host_csr[r0:r0 + _ROWS_PER_PASS].toarray(), np_dtype)
                     for r0 in range(0, m, _ROWS_PER_PASS)]
            positions = np.concatenate([p for _, p in parts])
            return Sparse24(np.concatenate([v for v, _ in parts]), positions,
                            pack_meta(positions))
        return self.cached("host_24", build)

    def __repr__(self) -> str:
        return (f"SparseWeight(shape={self.shape}, dtype={self.dtype}, nnz={self.nnz}, "
                f"density={self.density:.4f}, is_2to4={self.is_2to4}, device={self.device})")
