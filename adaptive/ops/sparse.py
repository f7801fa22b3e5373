"""SparseWeight: a static sparse matrix for ``spmm``, with its formats built once.

Inference weights do not change between calls, so statistics (nnz, density, the
fraction of non-empty 16/32/64 blocks) are computed once at construction and every
format (dense, CSR, BSR with a block size, on the host or a device) is built the first
time a variant asks for it and then cached on the handle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from adaptive import arrays
from adaptive.arrays import ArrayInfo
from adaptive.errors import InputTypeError, InputValueError

BLOCK_SIZES = (16, 32, 64)
_HOST_DTYPES = {"float16": np.float32, "float32": np.float32, "float64": np.float64}


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
        self._sig = (SparseWeight, self.shape, dtype, device, _bucket(self.density),
                     _bucket(self.block_density[32]))
        self._formats: dict = {}
        self._lock = threading.RLock()  # a format may be built from another (bsr from csr)

    def _block_density(self, b: int) -> float:
        csr = self._host_csr
        rows = np.repeat(np.arange(self.shape[0]), np.diff(csr.indptr)) // b
        cols = csr.indices // b
        nbc = -(-self.shape[1] // b)
        occupied = np.unique(rows.astype(np.int64) * nbc + cols).size
        total = (-(-self.shape[0] // b)) * nbc
        return occupied / total

    # ---- array protocol used by adaptive.arrays ----------------------------------------------
    @staticmethod
    def signature(w: SparseWeight) -> tuple:
        return w._sig

    def info(self) -> ArrayInfo:
        return ArrayInfo("sparse", self.shape, self.dtype, True, self.device)

    def stats(self) -> dict[str, float]:
        """Statistics used as features: density and block densities."""
        out = {"density": self.density, "nnz": float(self.nnz)}
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
            m, k = self.shape
            pm, pk = -(-m // block) * block, -(-k // block) * block
            padded = sp.csr_matrix((self._host_csr.data, self._host_csr.indices,
                                    self._host_csr.indptr), shape=(m, k))
            if (pm, pk) != (m, k):
                padded.resize((pm, pk))
            return padded.tobsr(blocksize=(block, block))
        return self.cached(f"host_bsr{block}", build)

    def __repr__(self) -> str:
        return (f"SparseWeight(shape={self.shape}, dtype={self.dtype}, nnz={self.nnz}, "
                f"density={self.density:.4f}, device={self.device})")
