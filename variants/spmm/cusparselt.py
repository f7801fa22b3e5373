"""spmm through cuSPARSELt's 2:4 matmul, called through PyTorch.

``spmm_cusparselt_24``: ``torch._cslt_sparse_mm`` (what
``torch.sparse.to_sparse_semi_structured`` runs when cuSPARSELt is available) on the weight
compressed once by ``torch._cslt_compress`` and cached on it; b's columns padded to a
multiple of 8 when needed (cuSPARSELt's minimum for float16). Arrays are CuPy's, work goes
to CuPy's current stream; torch is imported on first use. ``spmm_cusparselt_24_torch`` is
the same over torch tensors on torch's current stream (no array conversion), for backends
that hand library variants torch tensors directly; given ``out=None`` it returns
cuSPARSELt's own result tensor, saving the copy into ``out`` (M x N elements read and
written: ~7% of the matmul at M = 14336, K = 4096).
"""

import threading

import cupy

_torch_lock = threading.Lock()   # guards _streams

_streams = {}        # CuPy stream pointer -> torch.cuda.ExternalStream; bounded by _MAX_STREAMS
_MAX_STREAMS = 64


def _torch():
    import torch   # the dispatcher imported it (manifest: needs = ["torch"])
    if not torch.cuda.is_available() or not torch.backends.cusparselt.is_available():
        raise RuntimeError("cusparselt_24 needs PyTorch built with CUDA and cuSPARSELt "
                           f"(torch {torch.__version__}: cuda available "
                           f"{torch.cuda.is_available()}, cuSPARSELt available "
                           f"{torch.backends.cusparselt.is_available()}); install such a "
                           "PyTorch or use the other spmm variants")
    return torch


def cslt_weight(w, torch, device: int):
    """``w`` compressed by cuSPARSELt (``torch._cslt_compress``) on CUDA device ``device``,
    built once (from a temporary dense copy) and cached on the weight."""
    def build():
        dense = torch.tensor(w.csr().toarray(), dtype=torch.float16, device=f"cuda:{device}")
        packed = torch._cslt_compress(dense)
        del dense
        return packed
    return w.cached(f"cuda{device}_cslt", build)


def _cslt_mm(torch, packed, tb, tout=None):
    """packed @ tb into tout; without tout, the result tensor (sliced to N columns)."""
    n = tb.shape[1]
    if n % 8:    # cuSPARSELt's float16 minimum: pad b's columns with zeros
        padded = torch.zeros((tb.shape[0], n + (-n) % 8), dtype=tb.dtype, device=tb.device)
        padded[:, :n] = tb
        result = torch._cslt_sparse_mm(packed, padded)[:, :n]
    else:
        result = torch._cslt_sparse_mm(packed, tb)
    if tout is None:
        return result.contiguous()
    tout.copy_(result)
    return tout


def spmm_cusparselt_24_torch(w, b, out=None):
    torch = _torch()
    return _cslt_mm(torch, cslt_weight(w, torch, b.device.index), b, out)


def _torch_stream(torch, ptr: int):
    stream = _streams.get(ptr)
    if stream is None:
        with _torch_lock:
            if len(_streams) >= _MAX_STREAMS:
                _streams.clear()
            stream = _streams[ptr] = torch.cuda.ExternalStream(ptr)
    return stream


def spmm_cusparselt_24(w, b, out):
    torch = _torch()
    device = b.device.id
    ptr = cupy.cuda.get_current_stream().ptr
    with torch.cuda.device(device):
        # CuPy's current stream for torch's work (None: already torch's: a no-op context)
        stream = None if ptr == torch.cuda.current_stream().cuda_stream else \
            _torch_stream(torch, ptr)
        with torch.cuda.stream(stream):
            packed = cslt_weight(w, torch, device)
            _cslt_mm(torch, packed, torch.from_dlpack(b), torch.from_dlpack(out))
