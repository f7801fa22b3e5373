"""One cuBLAS GEMM on CuPy arrays without ``cupy.matmul``'s Python layers.

:func:`gemm` is one ``cublasGemmEx`` (float32 accumulation) on CuPy's current stream for
C-contiguous float16, float32 and bfloat16 arrays (the cuda backend hands bfloat16 over as
int16 arrays: raw 16-bit memory; CuPy has no bfloat16), and ``cupy.matmul`` for other
layouts. The direct call is what ``cupy.matmul`` ends in: from CuPy arrays its layers cost
the caller 79-83 us of host time a call where the kernel runs 18 us (runs S32 and S51,
H200, M=128 N=K=4096 fp16), so in a host-bound loop a variant calling it is charged
more than a kernel of ours (S51 committed ``tc_wide`` at 4x cuBLAS's device time), and
spmm's dense baseline was priced 0.103 ms a call where its kernel took 0.020 (run S112's
mixed table, float32 M=K=2048 N=16). Used by gemm's ``cublas`` and spmm's
``cublas_dense``.
"""

from __future__ import annotations

import cupy
import numpy as np

_CUDA_R = {np.dtype(np.float16): 2, np.dtype(np.float32): 0, np.dtype(np.int16): 14}
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)
_cublas = None


def gemm(a, b, out) -> None:
    """``out[...] = a @ b`` for 2-D CuPy arrays ``a`` [M, K], ``b`` [K, N], ``out`` [M, N]
    of one dtype, on CuPy's current stream and device."""
    global _cublas
    dt = _CUDA_R.get(a.dtype)
    m, k = a.shape
    n = b.shape[1]
    if dt is None or not (a.flags.c_contiguous and b.flags.c_contiguous
                          and out.flags.c_contiguous) or not (m and n and k):
        if a.dtype == np.int16:
            raise ValueError("cuBLAS gemm: bfloat16 (int16) arrays must be C-contiguous and "
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
