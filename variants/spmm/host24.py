"""Host spmm on the 2:4 compressed form of a weight (cached on it)."""

import numpy as np


def _as32(b):
    return b.astype(np.float32) if b.dtype == np.float16 else b


def spmm_24(w, b, out):
    """The 2:4 compressed form (2 kept values a group of 4 columns, with their positions) as a
    CSR of K/2 entries a row: exercises the compressed layout the cuda kernels read."""
    def build():
        import scipy.sparse as sp
        m, k = w.shape
        form = w.sparse24()
        cols = (np.arange(form.values.shape[1]) // 2 * 4)[None, :] + form.positions
        keep = cols < k                      # fillers of the last, partial group
        counts = keep.sum(axis=1)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        return sp.csr_matrix((form.values[keep].astype(np.float32 if w.dtype == "float16"
                                                      else form.values.dtype),
                              cols[keep], indptr), shape=(m, k))
    out[...] = w.cached("host_24_csr", build) @ _as32(b)
