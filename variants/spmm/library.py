"""spmm through NVIDIA's libraries on the weight's cached device forms.

``spmm_cublas_dense``: cuBLAS GEMM on the dense form (wins at high density).
``spmm_cusparse_csr``: cuSPARSE SpMM (generic API) on the CSR form, with row-major b and
out described as such (no transposes or copies) and float32 accumulation for float16.
``spmm_cusparselt_24``: cuSPARSELt's 2:4 matmul through PyTorch (``torch._cslt_sparse_mm``,
what ``torch.sparse.to_sparse_semi_structured`` runs when cuSPARSELt is available) on the
weight compressed once by ``torch._cslt_compress`` and cached on it; b's columns padded to
a multiple of 8 when needed (cuSPARSELt's minimum for float16). torch is imported on first
use. ``spmm_cusparselt_24_torch`` is the same over torch tensors on torch's current stream
(no array conversion), for backends that hand library variants torch tensors directly;
given ``out=None`` it returns cuSPARSELt's own result tensor, saving the copy into ``out``
(M x N elements read and written: ~7% of the matmul at M = 14336, K = 4096).
"""

import threading

import cupy
import numpy as np

from adaptive.backends.cuda_sparse import device_csr, device_dense

_CUDA_R = {np.dtype(np.float16): 2, np.dtype(np.float32): 0}   # cudaDataType
_CUDA_R_32F = 0
_INDEX_32I = 2            # CUSPARSE_INDEX_32I
_INDEX_BASE_ZERO = 0
_ORDER_ROW = 2            # CUSPARSE_ORDER_ROW
_OP_N = 0
_SPMM_ALG_DEFAULT = 0
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)


def spmm_cublas_dense(w, b, out):
    cupy.matmul(device_dense(w), b, out=out)


def spmm_cusparse_csr(w, b, out):
    from cupy_backends.cuda.libs import cusparse
    indptr, indices, values = device_csr(w)
    m, k = w.shape
    n = b.shape[1]
    dt = _CUDA_R[b.dtype]
    handle = cupy.cuda.device.get_cusparse_handle()
    cusparse.setStream(handle, cupy.cuda.get_current_stream().ptr)
    a_desc = cusparse.createCsr(m, k, values.size, indptr.data.ptr, indices.data.ptr,
                                values.data.ptr, _INDEX_32I, _INDEX_32I, _INDEX_BASE_ZERO, dt)
    b_desc = cusparse.createDnMat(k, n, n, b.data.ptr, dt, _ORDER_ROW)
    c_desc = cusparse.createDnMat(m, n, n, out.data.ptr, dt, _ORDER_ROW)
    try:
        size = cusparse.spMM_bufferSize(handle, _OP_N, _OP_N, _ONE.ctypes.data, a_desc, b_desc,
                                        _ZERO.ctypes.data, c_desc, _CUDA_R_32F,
                                        _SPMM_ALG_DEFAULT)
        buf = cupy.empty(max(size, 1), cupy.uint8)
        cusparse.spMM(handle, _OP_N, _OP_N, _ONE.ctypes.data, a_desc, b_desc,
                      _ZERO.ctypes.data, c_desc, _CUDA_R_32F, _SPMM_ALG_DEFAULT, buf.data.ptr)
    finally:
        cusparse.destroySpMat(a_desc)
        cusparse.destroyDnMat(b_desc)
        cusparse.destroyDnMat(c_desc)


_torch_lock = threading.Lock()
_streams = {}        # CuPy stream pointer -> torch.cuda.ExternalStream; bounded by _MAX_STREAMS
_MAX_STREAMS = 64


def _torch():
    with _torch_lock:
        import torch
    if not torch.cuda.is_available() or not torch.backends.cusparselt.is_available():
        raise RuntimeError("cusparselt_24 needs PyTorch built with CUDA and cuSPARSELt "
                           f"(torch {torch.__version__}: cuda available "
                           f"{torch.cuda.is_available()}, cuSPARSELt available "
                           f"{torch.backends.cusparselt.is_available()}); install such a "
                           "PyTorch or use the other spmm variants")
    return torch


def cslt_weight(w, torch, device: int):
    """``w`` compressed by cuSPARSELt (``torch._cslt_compress``) on CUDA device ``device``,
    built once (from a temporary dense copy) and cached on the weight."""
    def build():
        dense = torch.tensor(w.csr().toarray(), dtype=torch.float16, device=f"cuda:{device}")
        packed = torch._cslt_compress(dense)
        del dense
        return packed
    return w.cached(f"cuda{device}_cslt", build)


def _cslt_mm(torch, packed, tb, tout=None):
    """packed @ tb into tout; without tout, the result tensor (sliced to N columns)."""
    n = tb.shape[1]
    if n % 8:    # cuSPARSELt's float16 minimum: pad b's columns with zeros
        padded = torch.zeros((tb.shape[0], n + (-n) % 8), dtype=tb.dtype, device=tb.device)
        padded[:, :n] = tb
        result = torch._cslt_sparse_mm(packed, padded)[:, :n]
    else:
        result = torch._cslt_sparse_mm(packed, tb)
    if tout is None:
        return result.contiguous()
    tout.copy_(result)
    return tout


def spmm_cusparselt_24_torch(w, b, out=None):
    torch = _torch()
    return _cslt_mm(torch, cslt_weight(w, torch, b.device.index), b, out)


def _torch_stream(torch, ptr: int):
    stream = _streams.get(ptr)
    if stream is None:
        with _torch_lock:
            if len(_streams) >= _MAX_STREAMS:
                _streams.clear()
            stream = _streams[ptr] = torch.cuda.ExternalStream(ptr)
    return stream


def spmm_cusparselt_24(w, b, out):
    torch = _torch()
    device = b.device.id
    packed = cslt_weight(w, torch, device)
    ptr = cupy.cuda.get_current_stream().ptr
    with torch.cuda.device(device):
        if ptr == torch.cuda.current_stream().cuda_stream:
            _cslt_mm(torch, packed, torch.from_dlpack(b), torch.from_dlpack(out))
        else:
            with torch.cuda.stream(_torch_stream(torch, ptr)):
                _cslt_mm(torch, packed, torch.from_dlpack(b), torch.from_dlpack(out))
