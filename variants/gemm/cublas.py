"""gemm through cuBLAS: one ``cublasGemmEx`` (fp32 accumulation) on the current stream for
C-contiguous float16, float32 and bfloat16 arrays (the cuda backend hands bfloat16 over as
int16 arrays: raw 16-bit memory; CuPy has no bfloat16); ``cupy.matmul`` for other layouts.
Tensor callers go through torch (``gemm_torch``): the cuBLAS call torch itself makes.

The direct call is what ``cupy.matmul`` ends in, without its Python layers: from CuPy
arrays those cost the caller 79-83 us of host time a call where the kernel runs 18 us (runs
S32 and S51, M=128 N=K=4096 fp16), so in a host-bound loop the policy rightly charged
cuBLAS more than our own kernels, and committed ``tc_wide`` at 4x cuBLAS's device time
(S51's contention run).
"""

import cupy
import numpy as np

_CUDA_R = {np.dtype(np.float16): 2, np.dtype(np.float32): 0, np.dtype(np.int16): 14}
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)
_cublas = None


def gemm_cublas(a, b, out):
    global _cublas
    dt = _CUDA_R.get(a.dtype)
    m, k = a.shape
    n = b.shape[1]
    if dt is None or not (a.flags.c_contiguous and b.flags.c_contiguous
                          and out.flags.c_contiguous) or not (m and n and k):
        if a.dtype == np.int16:
            raise ValueError("gemm_cublas: bfloat16 (int16) arrays must be C-contiguous and "
                             f"non-empty, got shapes {a.shape} x {b.shape}")
        cupy.matmul(a, b, out=out)   # strided or empty: cupy's own handling
        return
    if _cublas is None:
        from cupy_backends.cuda.libs import cublas
        _cublas = cublas
    handle = cupy.cuda.device.get_cublas_handle()
    _cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    # row-major out = a @ b is column-major out^T = b^T a^T: swap the operands
    _cublas.gemmEx(handle, 0, 0, n, m, k, _ONE.ctypes.data, b.data.ptr, dt, n,
                   a.data.ptr, dt, k, _ZERO.ctypes.data, out.data.ptr, dt, n,
                   _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)


def gemm_torch(a, b, out=None):
    """PyTorch tensors as they are, on torch's current stream and cuBLAS handle; returns
    the result (torch allocates it when ``out`` is None, as a plain ``a @ b`` does)."""
    import torch   # the caller's tensors mean torch is imported: a sys.modules lookup
    return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)
