"""gemm through cuBLAS: cupy.matmul for float16/float32; cublasGemmEx for bfloat16, which
the cuda backend hands over as int16 arrays (raw 16-bit memory; CuPy has no bfloat16).
Tensor callers go through torch (``gemm_torch``): the cuBLAS call torch itself makes."""

import cupy
import numpy as np

_CUDA_R_16BF = 14
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)


def gemm_cublas(a, b, out):
    if a.dtype != np.int16:
        cupy.matmul(a, b, out=out)
        return
    from cupy_backends.cuda.libs import cublas
    m, k = a.shape
    n = b.shape[1]
    handle = cupy.cuda.device.get_cublas_handle()
    # row-major out = a @ b is column-major out^T = b^T a^T: swap the operands
    cublas.gemmEx(handle, 0, 0, n, m, k, _ONE.ctypes.data, b.data.ptr, _CUDA_R_16BF, n,
                  a.data.ptr, _CUDA_R_16BF, k, _ZERO.ctypes.data, out.data.ptr, _CUDA_R_16BF,
                  n, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)


def gemm_torch(a, b, out=None):
    """PyTorch tensors as they are, on torch's current stream and cuBLAS handle; returns
    the result (torch allocates it when ``out`` is None, as a plain ``a @ b`` does)."""
    import torch   # the caller's tensors mean torch is imported: a sys.modules lookup
    return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)
