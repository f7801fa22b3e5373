"""spmm through cuSPARSELt's 2:4 matmul with its plans kept (tests:
tests/gpu/test_spmm_cusparselt_plan_cuda.py, run S111 on the H200).

Why: torch's 2:4 path (``torch._cslt_sparse_mm``, our ``cusparselt_24``) builds its
cuSPARSELt descriptors and plan on every call. On the H200 that costs 0.45-1.05 ms of host
time a call at every token count (run S106, an eager loop), against 0.03-0.47 ms of
kernels, and 22-24 ms of a 121-191 ms prefill of the pruned model (run S110). Here the
library is called directly (``ctypes`` on the ``libcusparseLt.so.0`` that PyTorch's CUDA
wheels ship and load): the weight is compressed once, and the descriptors, plan and
workspace of each token count N are made once and kept on the weight (at most
:data:`PLANS` per weight and device), so a warm call is one ``cusparseLtMatmul``.

    out [M, N] = w [M, K] (2:4, float16) @ b [K, N], row-major, float32 sums

N not a multiple of 8 (cuSPARSELt's float16 minimum), or b or out not 16-byte aligned (a view
at an offset), runs on b's columns padded with zeros into a buffer kept with the plan, and
the result is copied out of a padded one.
``spmm_cusparselt_plan`` takes CuPy arrays, ``spmm_cusparselt_plan_torch`` tensors (on
torch's current stream; given ``out=None`` the result comes from torch's allocator).
"""

from __future__ import annotations

import collections
import ctypes
import threading

import cupy
import numpy as np

from adaptive.backends.cuda_libs import library, per_device

PLANS = 16                 # plans (token counts) kept per weight and device
_OPAQUE = 16384            # bytes of each opaque struct: 1024 in cuSPARSELt 0.6-0.8, 11024
# in 0.1; larger than any is safe (the library writes what it needs)

# enums (cusparse.h, cusparseLt.h, library_types.h)
_ORDER_ROW = 2                 # CUSPARSE_ORDER_ROW
_OP_N = 0                      # CUSPARSE_OPERATION_NON_TRANSPOSE
_SPARSITY_50 = 0               # CUSPARSELT_SPARSITY_50_PERCENT
_COMPUTE_32F = 2               # CUSPARSE_COMPUTE_32F (float16 inputs, 0.6 on)
_ALG_DEFAULT = 0               # CUSPARSELT_MATMUL_ALG_DEFAULT
_CUDA_R_16F = 2
_ALIGN = 16                    # bytes
_ONE = ctypes.c_float(1.0)
_ZERO = ctypes.c_float(0.0)

_handles: dict[int, ctypes.Array] = {}


def _opaque():
    return (ctypes.c_uint8 * _OPAQUE)()


def _library() -> ctypes.CDLL:
    """libcusparseLt: already in the process where torch loaded it, else from the
    ``nvidia.cusparselt`` wheel's folder."""
    p, i64, u32, i32, sz = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_size_t))
    return library(["libcusparseLt.so.0"], ["nvidia.cusparselt"],
                   "cusparselt_plan needs libcusparseLt.so.0 (PyTorch's CUDA wheels ship it "
                   "as nvidia-cusparselt)", {
                       "cusparseLtInit": [p],
                       "cusparseLtStructuredDescriptorInit": [p, p, i64, i64, i64, u32, i32,
                                                              i32, i32],
                       "cusparseLtDenseDescriptorInit": [p, p, i64, i64, i64, u32, i32, i32],
                       "cusparseLtMatmulDescriptorInit": [p, p, i32, i32, p, p, p, p, i32],
                       "cusparseLtMatmulAlgSelectionInit": [p, p, p, i32],
                       "cusparseLtMatmulPlanInit": [p, p, p, p],
                       "cusparseLtMatmulGetWorkspace": [p, p, sz],
                       "cusparseLtSpMMACompressedSize": [p, p, sz, sz],
                       "cusparseLtSpMMACompress": [p, p, p, p, p, p],
                       "cusparseLtMatmul": [p, p, p, p, p, p, p, p, p, p, i32],
                       "cusparseLtMatmulPlanDestroy": [p],
                       "cusparseLtMatDescriptorDestroy": [p],
                   }, holding_gil=["cusparseLtMatmul"])   # an enqueue: see cuda_libs


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuSPARSELt {what} failed with status {status} "
                           "(cusparseStatus_t)")


def _handle(device: int):
    def init():
        h = _opaque()
        with cupy.cuda.Device(device):
            _check(_library().cusparseLtInit(h), "init")
        return h
    return per_device(_handles, device, init)


class _Plan:
    """Descriptors, plan and workspace of one weight at one (padded) token count; the
    ctypes buffers live as long as the plan."""

    def __init__(self, lib, handle, m: int, k: int, n: int):
        self.lib, self.handle, self.n = lib, handle, n
        self.a, self.b, self.c = _opaque(), _opaque(), _opaque()
        self.matmul, self.alg, self.plan = _opaque(), _opaque(), _opaque()
        _check(lib.cusparseLtStructuredDescriptorInit(handle, self.a, m, k, k, _ALIGN,
                                                      _CUDA_R_16F, _ORDER_ROW, _SPARSITY_50),
               "structured descriptor")
        _check(lib.cusparseLtDenseDescriptorInit(handle, self.b, k, n, n, _ALIGN, _CUDA_R_16F,
                                                 _ORDER_ROW), "dense descriptor (b)")
        _check(lib.cusparseLtDenseDescriptorInit(handle, self.c, m, n, n, _ALIGN, _CUDA_R_16F,
                                                 _ORDER_ROW), "dense descriptor (out)")
        _check(lib.cusparseLtMatmulDescriptorInit(handle, self.matmul, _OP_N, _OP_N, self.a,
                                                  self.b, self.c, self.c, _COMPUTE_32F),
               "matmul descriptor")
        _check(lib.cusparseLtMatmulAlgSelectionInit(handle, self.alg, self.matmul,
                                                    _ALG_DEFAULT), "algorithm selection")
        _check(lib.cusparseLtMatmulPlanInit(handle, self.plan, self.matmul, self.alg),
               "plan")
        size = ctypes.c_size_t(0)
        _check(lib.cusparseLtMatmulGetWorkspace(handle, self.plan, ctypes.byref(size)),
               "workspace size")
        self.workspace = cupy.empty(max(int(size.value), 1), cupy.uint8)
        self.padded_b = self.padded_out = None

    def __del__(self):
        try:
            self.lib.cusparseLtMatmulPlanDestroy(self.plan)
            for d in (self.a, self.b, self.c):
                self.lib.cusparseLtMatDescriptorDestroy(d)
        except Exception:  # noqa: BLE001,S110 (interpreter exit: nothing left to free)
            pass


class _Weight:
    """A weight's compressed form on one device and its plans by token count."""

    def __init__(self, w, device: int):
        self.lib, self.handle = _library(), _handle(device)
        self.m, self.k = w.shape
        self.lock = threading.Lock()
        self.plans: collections.OrderedDict[int, _Plan] = collections.OrderedDict()
        with cupy.cuda.Device(device):
            dense = cupy.asarray(w.csr().toarray().astype(np.float16))
            plan = self.plan(8)           # compression reads only the weight's descriptor
            size, buf = ctypes.c_size_t(0), ctypes.c_size_t(0)
            _check(self.lib.cusparseLtSpMMACompressedSize(self.handle, plan.plan,
                                                          ctypes.byref(size),
                                                          ctypes.byref(buf)),
                   "compressed size")
            self.compressed = cupy.empty(max(int(size.value), 1), cupy.uint8)
            scratch = cupy.empty(max(int(buf.value), 1), cupy.uint8)
            stream = cupy.cuda.get_current_stream()
            _check(self.lib.cusparseLtSpMMACompress(self.handle, plan.plan, dense.data.ptr,
                                                    self.compressed.data.ptr,
                                                    scratch.data.ptr, stream.ptr),
                   "compress")
            stream.synchronize()          # dense and scratch are freed on return

    def plan(self, n: int) -> _Plan:
        p = self.plans.get(n)
        if p is not None:
            self.plans.move_to_end(n)
            return p
        with self.lock:
            p = self.plans.get(n)
            if p is None:
                p = self.plans[n] = _Plan(self.lib, self.handle, self.m, self.k, n)
                while len(self.plans) > PLANS:
                    self.plans.popitem(last=False)
        return p

    def run(self, b_ptr: int, out_ptr: int, n: int, stream_ptr: int, b=None, out=None):
        """out = w @ b on ``stream_ptr``; b, out: CuPy views of the same memory, needed
        where N is padded or a pointer is not :data:`_ALIGN`-byte aligned (copies into and
        out of the plan's own buffers: the descriptors promise aligned operands)."""
        n8 = n + (-n) % 8
        p = self.plan(n8)
        staged = n8 != n or (b_ptr | out_ptr) % _ALIGN
        if staged:
            if p.padded_b is None:
                p.padded_b = cupy.zeros((self.k, n8), cupy.float16)
                p.padded_out = cupy.empty((self.m, n8), cupy.float16)
            p.padded_b[:, :n] = b        # the pad columns stay zero
            b_ptr, target = p.padded_b.data.ptr, p.padded_out.data.ptr
        else:
            target = out_ptr
        streams = (ctypes.c_void_p * 1)(stream_ptr)
        _check(self.lib.cusparseLtMatmul(self.handle, p.plan, ctypes.byref(_ONE),
                                         self.compressed.data.ptr, b_ptr, ctypes.byref(_ZERO),
                                         target, target, p.workspace.data.ptr, streams, 1),
               "matmul")
        if staged:
            out[...] = p.padded_out[:, :n]


def _weight(w, device: int) -> _Weight:
    return w.cached(f"cuda{device}_cslt_plan", lambda: _Weight(w, device))


def spmm_cusparselt_plan(w, b, out):
    device = b.device.id
    if not b.flags.c_contiguous:
        b = cupy.ascontiguousarray(b)
    stream = cupy.cuda.get_current_stream()
    _weight(w, device).run(b.data.ptr, out.data.ptr, b.shape[1], stream.ptr, b, out)


def spmm_cusparselt_plan_torch(w, b, out=None):
    import torch   # the caller's tensors mean torch is imported: a sys.modules lookup
    device = b.device.index
    if out is None:
        out = torch.empty((w.shape[0], b.shape[1]), dtype=b.dtype, device=b.device)
    stream = torch.cuda.current_stream(device).cuda_stream
    with cupy.cuda.Device(device), cupy.cuda.ExternalStream(stream):
        n = b.shape[1]
        bc = b if b.is_contiguous() else b.contiguous()
        staged = n % 8 != 0 or (bc.data_ptr() | out.data_ptr()) % _ALIGN != 0
        cb = cupy.from_dlpack(bc) if staged else None
        co = cupy.from_dlpack(out) if staged else None
        _weight(w, device).run(bc.data_ptr(), out.data_ptr(), n, stream, cb, co)
    return out
