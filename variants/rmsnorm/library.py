"""rmsnorm as plain programs compute it: NumPy on the host, CuPy, and PyTorch's own
computation (transformers' LlamaRMSNorm, op for op) on tensors as they are."""

import numpy as np


def rmsnorm_numpy(x, weight, out, eps=1e-6):
    """fp32 math (float64 stays float64); the normalised row rounded to x's dtype before
    the weight's product, as transformers does."""
    xf = x if x.dtype == np.float64 else x.astype(np.float32)
    scale = 1.0 / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True) + xf.dtype.type(eps))
    np.multiply(weight, (xf * scale).astype(x.dtype), out=out)


def rmsnorm_cupy(x, weight, *, out, eps=1e-6):
    """The same on CuPy arrays (float16 and float32)."""
    import cupy
    xf = x.astype(cupy.float32)
    scale = cupy.reciprocal(cupy.sqrt(cupy.mean(xf * xf, axis=1, keepdims=True)
                                      + cupy.float32(eps)))
    cupy.multiply(weight, (xf * scale).astype(x.dtype), out=out)


def rmsnorm_torch(x, weight, *, out=None, eps=1e-6):
    """transformers' LlamaRMSNorm.forward on torch tensors: what the plain model runs.
    Returns the result (``out`` None) or writes ``out``."""
    import torch
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * h.to(x.dtype)
    return y if out is None else out.copy_(y)
