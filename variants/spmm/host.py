"""Host spmm: dense BLAS on the dense form, SciPy CSR, SciPy BSR (formats cached on w)."""

import numpy as np


def _as32(b):
    return b.astype(np.float32) if b.dtype == np.float16 else b


def spmm_dense(w, b, out):
    dense = w.dense()
    if out.dtype == dense.dtype:
        np.matmul(dense, b, out=out)
    else:
        out[...] = np.matmul(dense, _as32(b))


def spmm_csr(w, b, out):
    out[...] = w.csr() @ _as32(b)


def spmm_bsr(w, b, out, block):
    m, k = w.shape
    bsr = w.bsr(block)
    rhs = _as32(b)
    if bsr.shape[1] != k:
        rhs = np.concatenate([rhs, np.zeros((bsr.shape[1] - k, rhs.shape[1]), rhs.dtype)])
    out[...] = (bsr @ rhs)[:m]
