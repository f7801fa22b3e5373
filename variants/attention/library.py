"""attention through libraries: three passes over cuBLAS, and PyTorch's SDPA.

``attention_three_pass``: S = q kᵀ by cuBLAS (strided-batched GemmEx, fp32 scores), a
row softmax kernel (scale, bottom-right causal mask) writing P in the input dtype, then
out = P v by cuBLAS. Needs B·H·Lq·Lk·(4 + itemsize) bytes of scratch.
``attention_sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on the same
memory (DLPack, no copies of q, k, v); torch is imported on first use.
``attention_sdpa_torch``: the same on torch tensors as given (the backend's torch entry:
no conversions, ``out`` from torch's allocator, torch's current stream). SDPA's own
causal mask is top-left aligned: it is used where that equals ours (Lq == Lk; Lq == 1 is
no mask at all), and with a padding mask the bottom-right triangle joins the mask. Grouped
heads go the way transformers sends them, so both run the same kernels: ``enable_gqa``
without a mask; with a mask, a decode step folds the group into query rows and a longer
query repeats k and v (SDPA's fused kernels take no mask with ``enable_gqa``).

bfloat16 arrays arrive as int16 CuPy arrays (raw 16-bit memory): the backend's convention.
"""

import math

import cupy
import numpy as np

_CUDA_R = {np.dtype(np.float16): 2, np.dtype(np.int16): 14, np.dtype(np.float32): 0}
_CUDA_R_32F = 0
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_OP_N, _OP_T = 0, 1
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)

_SOFTMAX_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#if defined(OUT_BF16)
typedef __nv_bfloat16 out_t;
__device__ __forceinline__ out_t cvt(float x) { return __float2bfloat16_rn(x); }
#elif defined(OUT_F16)
typedef __half out_t;
__device__ __forceinline__ out_t cvt(float x) { return __float2half_rn(x); }
#else
typedef float out_t;
__device__ __forceinline__ out_t cvt(float x) { return x; }
#endif
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float block_reduce(float x, bool is_max, float* red) {
    for (int off = 16; off > 0; off >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, off);
        x = is_max ? fmaxf(x, y) : x + y;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = is_max ? NEG_INF : 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) x = is_max ? fmaxf(x, red[w]) : x + red[w];
    return x;
}

// One block per row of S (B*H*Lq rows of Lk scores): p = softmax(s * scale) with row i
// of each head seeing keys j <= i + Lk - Lq when causal; masked entries get 0.
extern "C" __global__ void softmax_rows(const float* __restrict__ s, out_t* __restrict__ p,
                                        int Lq, int Lk, float scale_log2, int causal) {
    __shared__ float red[32];
    const size_t row = blockIdx.x;
    const int i = (int)(row % Lq);
    const int limit = causal ? min(Lk, i + Lk - Lq + 1) : Lk;
    const float* x = s + row * Lk;
    out_t* y = p + row * Lk;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < limit; j += blockDim.x) m = fmaxf(m, x[j] * scale_log2);
    m = block_reduce(m, true, red);
    float sum = 0.f;
    for (int j = threadIdx.x; j < limit; j += blockDim.x) sum += exp2f(x[j] * scale_log2 - m);
    sum = block_reduce(sum, false, red);
    const float inv = 1.f / sum;
    for (int j = threadIdx.x; j < Lk; j += blockDim.x)
        y[j] = cvt(j < limit ? exp2f(x[j] * scale_log2 - m) * inv : 0.f);
}
"""
_OPTIONS = {np.dtype(np.float16): ("-DOUT_F16",), np.dtype(np.int16): ("-DOUT_BF16",),
            np.dtype(np.float32): ()}
_kernels: dict = {}


def _softmax_kernel(dtype):
    fn = _kernels.get(dtype)
    if fn is None:
        module = cupy.RawModule(code=_SOFTMAX_SOURCE, options=("-std=c++17", *_OPTIONS[dtype]))
        fn = _kernels[dtype] = module.get_function("softmax_rows")
    return fn


def attention_three_pass(q, k, v, out, causal=False, scale=None):
    from cupy_backends.cuda.libs import cublas
    b, h, lq, d = q.shape
    lk = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    dt = _CUDA_R[q.dtype]
    batch = b * h
    stream = cupy.cuda.get_current_stream()
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, stream.ptr)
    s = cupy.empty(batch * lq * lk, cupy.float32)
    # row-major S[Lq, Lk] = q kᵀ is column-major Sᵀ[Lk, Lq] = (k as D x Lk)ᵀ (q as D x Lq)
    cublas.gemmStridedBatchedEx(handle, _OP_T, _OP_N, lk, lq, d, _ONE.ctypes.data,
                                k.data.ptr, dt, d, lk * d, q.data.ptr, dt, d, lq * d,
                                _ZERO.ctypes.data, s.data.ptr, _CUDA_R_32F, lk, lq * lk,
                                batch, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)
    p = cupy.empty(batch * lq * lk, q.dtype)
    _softmax_kernel(q.dtype)((batch * lq,), (256,),
                             (s, p, np.int32(lq), np.int32(lk),
                              np.float32(scale * 1.4426950408889634), np.int32(bool(causal))))
    # row-major out[Lq, D] = P v is column-major outᵀ[D, Lq] = (v as D x Lk) (P as Lk x Lq)
    cublas.gemmStridedBatchedEx(handle, _OP_N, _OP_N, d, lq, lk, _ONE.ctypes.data,
                                v.data.ptr, dt, d, lk * d, p.data.ptr, dt, lk, lq * lk,
                                _ZERO.ctypes.data, out.data.ptr, dt, d, lq * d,
                                batch, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)


def attention_sdpa(q, k, v, mask=None, *, out, causal=False, scale=None):
    import torch
    tq, tk, tv, to = (torch.from_dlpack(x) for x in (q, k, v, out))
    tm = None if mask is None else torch.from_dlpack(mask)
    if tq.dtype == torch.int16:
        tq, tk, tv, to = (t.view(torch.bfloat16) for t in (tq, tk, tv, to))
        tm = tm.view(torch.bfloat16) if tm is not None and tm.dtype == torch.int16 else tm
    to.copy_(_sdpa(torch, tq, tk, tv, tm, causal, scale))


def attention_sdpa_torch(q, k, v, mask=None, *, out=None, causal=False, scale=None):
    """Returns SDPA's own result when ``out`` is None (no copy), else writes ``out``."""
    import torch
    result = _sdpa(torch, q, k, v, mask, causal, scale)
    if out is None:
        return result
    out.copy_(result)
    return out


def _sdpa(torch, q, k, v, mask, causal, scale):
    """SDPA of our semantics on torch tensors; returns the [B, H, Lq, D] result."""
    F = torch.nn.functional
    if scale is not None and scale <= 0:
        # SDPA gave non-finite output for scale <= 0 on the H200 (2026-11-30, torch 2.11):
        # softmax((-q)k^T * |s|) is the same function, and scale 0 is q = 0 (uniform weights)
        q = -q if scale < 0 else torch.zeros_like(q)
        scale = -scale if scale < 0 else 1.0
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    # bottom-right causal with one query row sees the whole cache: no mask at all
    causal = bool(causal) and lq > 1
    if mask is None and (not causal or lq == lk):   # SDPA's top-left causal is ours here
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                              enable_gqa=hkv != h)
    if mask is None:   # 1 < Lq < Lk (speculative decoding, chunked prefill): our triangle
        mask = torch.ones(1, 1, lq, lk, dtype=torch.bool, device=q.device)
    if causal:   # bottom-right triangle into the mask (SDPA takes no mask with is_causal)
        seen = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        mask = mask & seen if mask.dtype == torch.bool else mask.masked_fill(~seen,
                                                                             float("-inf"))
    if hkv != h:
        group = h // hkv
        if lq == 1 and mask.shape[1] == 1:   # the group's query rows share each k/v head
            mask = mask.view(mask.shape[0], 1, 1, lk)
            o = F.scaled_dot_product_attention(q.view(b, hkv, group, d), k, v,
                                               attn_mask=mask, scale=scale)
            return o.reshape(b, h, 1, d)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
