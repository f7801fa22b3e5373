"""One cuBLAS GEMM on CuPy arrays, each shape's cuBLASLt plan kept.

:func:`gemm` is one ``cublasLtMatmul`` (float32 accumulation) on CuPy's current stream for
C-contiguous float16, float32 and bfloat16 arrays (the cuda backend hands bfloat16 over as
int16 arrays: raw 16-bit memory; CuPy has no bfloat16), and ``cupy.matmul`` for other
layouts and dtypes. Used by gemm's ``cublas`` and spmm's ``cublas_dense``.

Why not ``cupy.matmul``: from CuPy arrays its layers cost the caller 79-83 us of host time
a call where the kernel runs 18 us (runs S32 and S51, H200, M=128 N=K=4096 fp16), so in a
host-bound loop a variant calling it is charged more than a kernel of ours. Why not one
``cublasGemmEx`` (what this was until run S117): it looks its algorithm up every call; here
the matmul and matrix layouts and the heuristic's algorithm of each (device, M, N, K,
dtype, pointer alignment) are made once and kept (at most :data:`PLANS` a device), so a
warm call is one ``cublasLtMatmul``. S117 (H200, ``benchmarks/probe_cublaslt_plan.py``):
the same device time as ``cublasGemmEx`` on 12 shapes, an eager call 0.004-0.011 ms
cheaper where the kernel is short (M=1-16 N=K=4096 fp16: 0.034 -> 0.027-0.028 ms).

A plan's workspace is one buffer per (device, stream) of :data:`WORKSPACE` bytes, made when
an algorithm first needs one on that stream: calls on one stream run in order, so they
share it; calls on two streams never do. ``libcublasLt`` is the one CuPy's cuBLAS comes
with (by soname, else from the ``nvidia`` wheels' folders).
"""

from __future__ import annotations

import collections
import ctypes
import threading

import cupy
import numpy as np

from adaptive.backends.cuda_libs import library, per_device

PLANS = 256                # shapes kept per device
WORKSPACE = 32 << 20       # bytes the heuristic may ask for: a stream's workspace

# enums (cublas_api.h, cublasLt.h, library_types.h)
_COMPUTE_32F = 68                       # CUBLAS_COMPUTE_32F
_CUDA_R = {np.dtype(np.float16): 2, np.dtype(np.float32): 0, np.dtype(np.int16): 14}
_CUDA_R_32F = 0
_PREF_MAX_WORKSPACE_BYTES = 1           # CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)      # CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES
_ALIGN_MAX = 256                        # the heuristic's assumption unless told less
_HEURISTIC_BYTES = 96                   # cublasLtMatmulHeuristicResult_t: algo (64), size_t
_ALGO_BYTES = 64                        # workspaceSize, status, float waves, int[4]
_ONE = ctypes.c_float(1.0)
_ZERO = ctypes.c_float(0.0)
_ALPHA, _BETA = ctypes.byref(_ONE), ctypes.byref(_ZERO)   # made once, not a call

_lock = threading.Lock()
_handles: dict[int, ctypes.c_void_p] = {}
_plans: dict[int, collections.OrderedDict] = {}
_workspaces: dict[tuple[int, int], cupy.ndarray] = {}


def _library() -> ctypes.CDLL:
    """libcublasLt: already in the process where CuPy's cuBLAS loaded it, else from the
    ``nvidia`` wheels' folders."""
    p, u64, i64, i32, sz = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int,
                            ctypes.c_size_t)
    return library(["libcublasLt.so.13", "libcublasLt.so.12"], ["nvidia.cu13", "nvidia.cublas"],
                   "the cuBLAS gemm (adaptive.backends.cuda_blas) needs libcublasLt", {
                       "cublasLtCreate": [p],
                       "cublasLtMatmulDescCreate": [p, i32, i32],
                       "cublasLtMatmulDescDestroy": [p],
                       "cublasLtMatrixLayoutCreate": [p, i32, u64, u64, i64],
                       "cublasLtMatrixLayoutDestroy": [p],
                       "cublasLtMatmulPreferenceCreate": [p],
                       "cublasLtMatmulPreferenceSetAttribute": [p, i32, p, sz],
                       "cublasLtMatmulPreferenceDestroy": [p],
                       "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i32, p, p],
                       "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, sz, p],
                   }, holding_gil=["cublasLtMatmul"])   # an enqueue: see cuda_libs


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status} (cublasStatus_t)")


def _handle(device: int) -> ctypes.c_void_p:
    def create():
        h = ctypes.c_void_p()
        with cupy.cuda.Device(device):
            _check(_library().cublasLtCreate(ctypes.byref(h)), "create")
        return h
    return per_device(_handles, device, create)


class _Plan:
    """The matmul and layouts of one (M, N, K, dtype) and the heuristic's algorithm, as
    the column-major product out^T [N, M] = b^T [N, K] a^T [K, M] (row-major arrays read
    as column-major ones, no transposes)."""

    def __init__(self, lib, handle, m: int, n: int, k: int, dt: int, align: int):
        self.lib = lib
        self.desc = ctypes.c_void_p()
        self.layouts = [ctypes.c_void_p() for _ in range(3)]   # b^T, a^T, out^T
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), _COMPUTE_32F,
                                            _CUDA_R_32F), "matmul descriptor")
        for lay, (rows, cols) in zip(self.layouts, ((n, k), (k, m), (n, m))):
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dt, rows, cols, rows),
                   "matrix layout")
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        try:
            limit = ctypes.c_uint64(WORKSPACE)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(
                pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(limit), 8), "workspace limit")
            # the heuristic assumes 256-byte aligned pointers unless told less: a view at
            # an offset (a row slice) gets an algorithm that reads it as aligned
            aligned = ctypes.c_uint32(align)
            for attr in _PREF_MIN_ALIGNMENT:
                _check(lib.cublasLtMatmulPreferenceSetAttribute(
                    pref, attr, ctypes.byref(aligned), 4), "alignment")
            result = (ctypes.c_uint8 * _HEURISTIC_BYTES)()
            found = ctypes.c_int(0)
            bt, at, ot = self.layouts
            _check(lib.cublasLtMatmulAlgoGetHeuristic(handle, self.desc, bt, at, ot, ot, pref,
                                                      1, result, ctypes.byref(found)),
                   "heuristic")
            if found.value < 1:
                raise RuntimeError(f"cuBLASLt has no algorithm for {m}x{n}x{k} (type {dt})")
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        self.algo = (ctypes.c_uint8 * _ALGO_BYTES).from_buffer_copy(bytes(result)[:_ALGO_BYTES])
        size = ctypes.c_size_t.from_buffer_copy(bytes(result)[_ALGO_BYTES:_ALGO_BYTES + 8])
        self.workspace_size = int(size.value)

    def __del__(self):
        try:
            self.lib.cublasLtMatmulDescDestroy(self.desc)
            for lay in self.layouts:
                self.lib.cublasLtMatrixLayoutDestroy(lay)
        except Exception:  # noqa: BLE001,S110 (interpreter exit: nothing left to free)
            pass


def _plan(device: int, m: int, n: int, k: int, dt: int, align: int) -> _Plan:
    key = (m, n, k, dt, align)
    kept = _plans.get(device)
    p = kept.get(key) if kept is not None else None
    if p is not None:
        return p
    lib, handle = _library(), _handle(device)
    with _lock:
        kept = _plans.setdefault(device, collections.OrderedDict())
        p = kept.get(key)
        if p is None:
            with cupy.cuda.Device(device):
                p = kept[key] = _Plan(lib, handle, m, n, k, dt, align)
            while len(kept) > PLANS:
                kept.popitem(last=False)
    return p


def _run(device: int, a_ptr: int, b_ptr: int, out_ptr: int, m: int, n: int, k: int, dt: int,
         stream_ptr: int) -> None:
    low = a_ptr | b_ptr | out_ptr | _ALIGN_MAX   # the pointers' common alignment, <= 256
    p = _plan(device, m, n, k, dt, low & -low)
    bt, at, ot = p.layouts
    space = _workspace(device, stream_ptr) if p.workspace_size else 0
    _check(p.lib.cublasLtMatmul(_handles[device], p.desc, _ALPHA, b_ptr, bt, a_ptr, at,
                                _BETA, out_ptr, ot, out_ptr, ot, p.algo, space,
                                p.workspace_size, stream_ptr), "matmul")


def _workspace(device: int, stream_ptr: int) -> int:
    """The device pointer of the workspace of ``stream_ptr`` on ``device`` (made once)."""
    key = (device, stream_ptr)
    buf = _workspaces.get(key)
    if buf is None:
        with _lock:
            buf = _workspaces.get(key)
            if buf is None:
                with cupy.cuda.Device(device):
                    buf = _workspaces[key] = cupy.empty(WORKSPACE, cupy.uint8)
    return buf.data.ptr


def gemm(a, b, out) -> None:
    """``out[...] = a @ b`` for 2-D CuPy arrays ``a`` [M, K], ``b`` [K, N], ``out`` [M, N]
    of one dtype, on CuPy's current stream and device."""
    dt = _CUDA_R.get(a.dtype)
    m, k = a.shape
    n = b.shape[1]
    if dt is None or b.dtype != a.dtype or out.dtype != a.dtype or not (
            a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous) \
            or not (m and n and k):
        if a.dtype == np.int16:
            raise ValueError("cuBLAS gemm: bfloat16 (int16) arrays must be C-contiguous, "
                             f"non-empty and of one dtype, got {a.dtype} {a.shape} x "
                             f"{b.dtype} {b.shape} -> {out.dtype} {out.shape}")
        cupy.matmul(a, b, out=out)   # strided, empty or another dtype: cupy's own handling
        return
    _run(b.device.id, a.data.ptr, b.data.ptr, out.data.ptr, m, n, k, dt,
         cupy.cuda.get_current_stream().ptr)
