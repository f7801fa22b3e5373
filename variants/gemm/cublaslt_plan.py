"""gemm through cuBLASLt with each shape's plan kept: staged, not in the manifest until run on
a GPU (tests/gpu/test_gemm_cublaslt_plan_cuda.py, benchmarks/probe_cublaslt_plan.py).

Why: cuBLAS from CuPy arrays (``cublas``: one ``cublasGemmEx``) costs the caller 35-42 us of
host time a call on the H200's host where our own kernels issue in 18-21 us (run S116's
contention log), so in a host-bound loop the policy rightly commits a kernel of ours that
takes the device 1.7-2.6x cuBLAS's time (S116: gemm M=16 N=K=4096, ``tc_wide`` at 2.58x).
``cublasGemmEx`` looks its algorithm up on every call; here the matmul and matrix layouts
and the heuristic's algorithm of each (device, M, N, K, dtype) are made once and kept
(at most :data:`PLANS` per device), so a warm call is one ``cublasLtMatmul``.

    out [M, N] = a [M, K] @ b [K, N], row-major, float32 accumulation

float16, bfloat16 (int16 arrays: raw 16-bit memory, as the cuda backend hands it over) and
float32, C-contiguous, at any offset (a plan is made for the pointers' common alignment);
anything else raises (the variant's ``requires`` keep it from other
inputs). ``libcublasLt`` is the one CuPy's cuBLAS comes with (by soname, else from the
``nvidia`` wheels' folders).
"""

from __future__ import annotations

import collections
import ctypes
import threading

import cupy
import numpy as np

from adaptive.backends.cuda_libs import library, per_device

PLANS = 256                # shapes kept per device
WORKSPACE = 32 << 20       # bytes the heuristic may ask for (a plan holds what its algo needs)

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

_lock = threading.Lock()
_handles: dict[int, ctypes.c_void_p] = {}
_plans: dict[int, collections.OrderedDict] = {}


def _library() -> ctypes.CDLL:
    """libcublasLt: already in the process where CuPy's cuBLAS loaded it, else from the
    ``nvidia`` wheels' folders."""
    p, u64, i64, i32, sz = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int,
                            ctypes.c_size_t)
    return library(["libcublasLt.so.13", "libcublasLt.so.12"], ["nvidia.cu13", "nvidia.cublas"],
                   "cublaslt_plan needs libcublasLt (CUDA's cuBLAS)", {
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
                   })


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
        self.workspace = cupy.empty(max(self.workspace_size, 1), cupy.uint8)

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
    _check(p.lib.cublasLtMatmul(_handles[device], p.desc, ctypes.byref(_ONE), b_ptr, bt,
                                a_ptr, at, ctypes.byref(_ZERO), out_ptr, ot, out_ptr, ot,
                                p.algo, p.workspace.data.ptr, p.workspace_size, stream_ptr),
           "matmul")


def gemm_cublaslt_plan(a, b, out):
    dt = _CUDA_R.get(a.dtype)
    m, k = a.shape
    n = b.shape[1]
    if dt is None or b.dtype != a.dtype or out.dtype != a.dtype or not (
            a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous) \
            or not (m and n and k):
        raise ValueError(f"gemm_cublaslt_plan: C-contiguous, non-empty float16, bfloat16 "
                         f"(int16) or float32 arrays of one dtype expected, got {a.dtype} "
                         f"{a.shape} x {b.dtype} {b.shape} -> {out.dtype} {out.shape}")
    _run(b.device.id, a.data.ptr, b.data.ptr, out.data.ptr, m, n, k, dt,
         cupy.cuda.get_current_stream().ptr)
