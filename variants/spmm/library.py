"""spmm through NVIDIA's libraries on the weight's cached device forms.

``spmm_cublas_dense``: cuBLAS GEMM on the dense form (wins at high density), one
``cublasLtMatmul`` on a kept plan as gemm's ``cublas`` makes it
(:func:`adaptive.backends.cuda_blas.gemm`; through ``cupy.matmul`` run S112 priced it
0.103 ms a call where its kernel took 0.020);
``spmm_cublas_dense_torch`` the same through ``torch.matmul`` for tensor callers.
``spmm_cusparse_csr``: cuSPARSE SpMM (generic API) on the CSR form, with row-major b and
out described as such (no transposes or copies) and float32 accumulation for float16.
"""

import cupy
import numpy as np

from adaptive.backends.cuda_blas import gemm
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
    gemm(device_dense(w), b, out)


def spmm_cublas_dense_torch(w, b, out=None):
    """torch.matmul on the cached dense form, tensors as they are, on torch's current
    stream: what a plain program's matmul on the pruned weight costs the host. Through
    CuPy (DLPack views and a stream context a call) run S101 (H200) read its samples at
    0.12-0.19 ms where its kernels take 0.010-0.036. Returns torch's own result where
    ``out`` is None, as ``w @ b`` does."""
    import torch   # the caller's tensors mean torch is imported: a sys.modules lookup
    device = b.device.index

    def build():   # w's dense form, made on torch's stream (or adopted), viewed by torch
        with cupy.cuda.Device(device), \
                cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream):
            return torch.from_dlpack(device_dense(w))
    dense = w.cached(f"cuda{device}_dense_torch", build)
    return torch.matmul(dense, b) if out is None else torch.matmul(dense, b, out=out)


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
