"""gemm through cuBLAS: one ``cublasLtMatmul`` on the shape's kept plan (fp32 accumulation)
on the current stream for C-contiguous float16, float32 and bfloat16 arrays,
``cupy.matmul`` for other layouts (:func:`adaptive.backends.cuda_blas.gemm`: why not
``cupy.matmul`` or ``cublasGemmEx``). Tensor callers
go through torch (``gemm_torch``): the cuBLAS call torch itself makes.
"""

from adaptive.backends.cuda_blas import gemm as gemm_cublas   # noqa: F401 (the entry)


def gemm_torch(a, b, out=None):
    """PyTorch tensors as they are, on torch's current stream and cuBLAS handle; returns
    the result (torch allocates it when ``out`` is None, as a plain ``a @ b`` does)."""
    import torch   # the caller's tensors mean torch is imported: a sys.modules lookup
    return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)
