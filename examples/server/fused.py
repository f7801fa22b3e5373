"""The block's elementwise glue as a few fused CUDA kernels (source: ``fused.cu``).

On CUDA, layernorm, gelu, residual adds and the head split/merge transposes written with
CuPy array expressions cost one kernel launch (and its Python overhead) per operator:
about thirty per layer. :class:`Fused` does the same work in five kernels per layer, with
fp32 statistics, and writes the transposed layernorm the spmm takes directly.

The kernels are compiled once per dtype after adaptive's dtype prelude
(:func:`adaptive.nvrtc.full_source`): with NVRTC into adaptive's kernel cache and loaded
from the cubin, else by CuPy's own compiler. :class:`Fused` only needs an array module
and callables ``fn(grid, block, args)``, so tests can drive it with another launcher.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

SOURCE_PATH = Path(__file__).with_name("fused.cu")
KERNELS = ("residual_layernorm", "gelu_inplace", "pad_cast", "split_heads", "merge_heads",
           "summarise")
DTYPES = ("float16", "float32")
EPS = 1e-5

ROWS_PER_BLOCK, COLS_PER_BLOCK = 32, 256      # TR and COLS in fused.cu
LN_BLOCK = (32, 8, 1)                          # (32, NY) in fused.cu
EW_THREADS = 256                               # element-wise kernels: threads per block
EW_MAX_BLOCKS = 132 * 8                        # grid-stride beyond this
SUMMARY_THREADS = 1024
SUMMARY_MAX_BLOCKS = 132

_NULL = np.uint64(0)                           # a null pointer argument


def source(dtype: str) -> str:
    """The full CUDA source for ``dtype``: adaptive's prelude, then ``fused.cu``."""
    from adaptive import nvrtc
    if dtype not in DTYPES:
        raise ValueError(f"fused kernels are built for {DTYPES}, got dtype {dtype!r}")
    return nvrtc.full_source(SOURCE_PATH.read_text(), dtype, SOURCE_PATH.name)


@functools.lru_cache(maxsize=4)
def cuda_functions(dtype: str, device: int = 0) -> dict[str, Callable]:
    """The kernels as CuPy functions on ``device`` (compiled once per dtype and device)."""
    import cupy
    from adaptive import nvrtc
    with cupy.cuda.Device(device):
        cc = cupy.cuda.Device(device).compute_capability      # a string: "90" on Hopper
        text = source(dtype)
        if nvrtc.available():
            kernel = nvrtc.compile_cached(text, (), f"sm_{cc}", KERNELS[0],
                                          "examples/server/fused.cu", {"dtype": dtype}, None)
            module = cupy.RawModule(path=str(kernel.path))
        else:
            module = cupy.RawModule(code=text, options=("-std=c++17",))
        return {name: module.get_function(name) for name in KERNELS}


def _ew_grid(n: int) -> tuple[int, int, int]:
    return (max(1, min(EW_MAX_BLOCKS, -(-n // EW_THREADS))), 1, 1)


def _check_index_range(name: str, n: int) -> None:
    if n >= 2**31:
        raise ValueError(f"{name}: {n} elements; the kernel indexes with 32 bits (< 2**31), "
                         "split the batch")


class Fused:
    """Fused glue over arrays of one array module.

    Args:
        xp: the array module (CuPy on the GPU).
        functions: kernel name -> ``fn(grid, block, args)`` (:func:`cuda_functions`).
        dtype: "float16" or "float32": the element type the kernels were built for.
    """

    def __init__(self, xp, functions: Mapping[str, Callable], dtype: str):
        missing = [k for k in KERNELS if k not in functions]
        if missing:
            raise ValueError(f"fused kernels missing: {missing}; expected {KERNELS}")
        if dtype not in DTYPES:
            raise ValueError(f"fused kernels are built for {DTYPES}, got dtype {dtype!r}")
        self.xp, self.fn, self.dtype = xp, dict(functions), np.dtype(dtype)

    def _check(self, name: str, a, ndim: int) -> None:
        if a.dtype != self.dtype or a.ndim != ndim or not a.flags.c_contiguous:
            raise ValueError(f"{name}: expected a C-contiguous {ndim}-d {self.dtype} array, got "
                             f"shape {a.shape} {a.dtype} contiguous={a.flags.c_contiguous}")

    def layernorm(self, x, r=None, r_transposed: bool = False, want_sum: bool = False,
                  want_y: bool = True, want_yt: bool = False):
        """s = x (+ r, or + rᵀ when ``r_transposed``: r is [d, P]); returns (s, y, yt), each
        None unless wanted: s itself, layernorm(s) [P, d], layernorm(s)ᵀ [d, P]."""
        self._check("layernorm x", x, 2)
        p, d = x.shape
        if r is not None:
            self._check("layernorm r", r, 2)
            want = (d, p) if r_transposed else (p, d)
            if r.shape != want:
                raise ValueError(f"layernorm: r has shape {r.shape}, expected {want} "
                                 f"(r_transposed={r_transposed}) for x of shape {x.shape}")
        elif want_sum:
            raise ValueError("layernorm: want_sum without r would copy x; use x itself")
        xp = self.xp
        s = xp.empty((p, d), self.dtype) if want_sum else None
        y = xp.empty((p, d), self.dtype) if want_y else None
        yt = xp.empty((d, p), self.dtype) if want_yt else None
        grid = (-(-p // ROWS_PER_BLOCK), -(-d // COLS_PER_BLOCK), 1)
        self.fn["residual_layernorm"](grid, LN_BLOCK, (
            x, _NULL if r is None else r, np.int32(bool(r_transposed)),
            _NULL if s is None else s, _NULL if y is None else y, _NULL if yt is None else yt,
            np.int32(p), np.int32(d), np.float32(EPS)))
        return s, y, yt

    def gelu_(self, u):
        """gelu (tanh form) in place; returns ``u``."""
        if u.dtype != self.dtype or not u.flags.c_contiguous:
            raise ValueError(f"gelu: expected a C-contiguous {self.dtype} array, got "
                             f"{u.dtype} contiguous={u.flags.c_contiguous}")
        self.fn["gelu_inplace"](_ew_grid(u.size), (EW_THREADS, 1, 1), (u, np.int64(u.size)))
        return u

    def pad_cast(self, x32, padded: int):
        """float32 rows [L, d] -> [padded, d] in the kernels' dtype, rows L.. zero."""
        if x32.dtype != np.float32 or x32.ndim != 2 or not x32.flags.c_contiguous:
            raise ValueError(f"pad_cast: expected a C-contiguous 2-d float32 array, got shape "
                             f"{x32.shape} {x32.dtype}")
        length, d = x32.shape
        if padded < length:
            raise ValueError(f"pad_cast: padded length {padded} < {length} rows")
        _check_index_range("pad_cast", padded * d)
        out = self.xp.empty((padded, d), self.dtype)
        self.fn["pad_cast"](_ew_grid(out.size), (EW_THREADS, 1, 1),
                            (x32, out, np.int32(length), np.int32(padded), np.int32(d)))
        return out

    def split_heads(self, qkv, heads: int):
        """qkv [P, 3·d] -> [3, heads, P, d / heads]: q, k, v as contiguous [heads, P, Dh]."""
        self._check("split_heads qkv", qkv, 2)
        p, three_d = qkv.shape
        if three_d % (3 * heads):
            raise ValueError(f"split_heads: {three_d} columns do not split into 3 x {heads} "
                             "heads")
        dh = three_d // (3 * heads)
        _check_index_range("split_heads", qkv.size)
        out = self.xp.empty((3, heads, p, dh), self.dtype)
        self.fn["split_heads"](_ew_grid(qkv.size), (EW_THREADS, 1, 1),
                               (qkv, out, np.int32(p), np.int32(heads), np.int32(dh)))
        return out

    def merge_heads(self, a):
        """a [heads, P, Dh] (or [1, heads, P, Dh]) -> [P, heads·Dh]."""
        if a.ndim == 4 and a.shape[0] == 1:
            a = a.reshape(a.shape[1:])
        self._check("merge_heads a", a, 3)
        heads, p, dh = a.shape
        _check_index_range("merge_heads", a.size)
        out = self.xp.empty((p, heads * dh), self.dtype)
        self.fn["merge_heads"](_ew_grid(a.size), (EW_THREADS, 1, 1),
                               (a, out, np.int32(p), np.int32(heads), np.int32(dh)))
        return out

    def summarise(self, x, probs, seq_len: int) -> tuple[float, int, float]:
        """(‖x[:seq_len]‖₂, argmax of probs[seq_len - 1], its value) with one copy back."""
        self._check("summarise x", x, 2)
        self._check("summarise probs", probs, 2)
        if not 1 <= seq_len <= min(x.shape[0], probs.shape[0]):
            raise ValueError(f"summarise: seq_len {seq_len} outside [1, {x.shape[0]}]")
        n = seq_len * x.shape[1]
        blocks = max(1, min(SUMMARY_MAX_BLOCKS, -(-n // (SUMMARY_THREADS * 16))))
        out = self.xp.empty(2 + blocks, np.float32)
        self.fn["summarise"]((blocks, 1, 1), (SUMMARY_THREADS, 1, 1), (
            x, probs, np.int32(seq_len), np.int32(x.shape[1]), np.int32(probs.shape[1]), out))
        host = out.get() if hasattr(out, "get") else out
        token, prob = float(host[0]), float(host[1])
        norm = float(np.sqrt(host[2:].astype(np.float64).sum()))
        if not 0 <= token < probs.shape[1]:
            raise FloatingPointError(f"summarise: no finite maximum in probs[{seq_len - 1}] "
                                     "(NaN probabilities?)")
        return norm, int(token), prob
