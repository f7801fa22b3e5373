"""Roofline peaks of a GPU, measured with a short probe (~0.2 s). :mod:`adaptive.peaks`
keeps them on disk per device, so only the first process on a device measures.

Copy bandwidth counts bytes read plus bytes written of a device-to-device copy of 256 MiB
(five times the H200's L2, and little memory taken from a busy server); matrix rates are
cuBLAS (``cupy.matmul``) at 4096³ on random data, median of several runs after a
warm-up. bfloat16 takes the float16 rate (same tensor-core peak).
"""

from __future__ import annotations

import numpy as np

from adaptive.timing import CudaEvents, measure


def _median_ms(cp, fn, repeats: int) -> float:
    return measure(fn, warmup=1, reps=repeats, timer=CudaEvents(cp),
                   raise_errors=True).median_ms


def copy_bytes_per_s(cp, nbytes: int = 1 << 28, repeats: int = 5) -> float:
    src = cp.empty(nbytes // 4, np.float32)
    src.fill(1.0)
    dst = cp.empty_like(src)
    ms = _median_ms(cp, lambda: dst.__setitem__(Ellipsis, src), repeats)
    return 2 * nbytes / (ms / 1e3)


def matmul_flops_per_s(cp, dtype, n: int = 4096, repeats: int = 5) -> float:
    rng = cp.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
    b = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
    out = cp.empty((n, n), dtype)
    ms = _median_ms(cp, lambda: cp.matmul(a, b, out=out), repeats)
    return 2.0 * n**3 / (ms / 1e3)


def measure_peaks(cp) -> dict:
    """``{"flops_per_s": {dtype: rate}, "bytes_per_s": rate}`` for this device."""
    f16 = matmul_flops_per_s(cp, np.float16)
    f32 = matmul_flops_per_s(cp, np.float32)
    return {"flops_per_s": {"float16": f16, "bfloat16": f16, "float32": f32,
                            "float64": f32 / 2},
            "bytes_per_s": copy_bytes_per_s(cp)}
