"""PyTorch work issued for CuPy callers: on CuPy's current stream, not torch's.

A library variant that needs torch, called with CuPy arrays (SDPA on DLPack views of
them), issues to torch's current stream. Where that is not CuPy's current stream, the
caller's later work on its stream is not ordered after torch's and reads an output not
yet written. :func:`cupy_stream` makes CuPy's current stream torch's for the call (a
``torch.cuda.ExternalStream`` per stream handle, made once); the cuda backend runs such
variants in it. Nothing here imports torch: the caller passes the module it imported.
"""

from __future__ import annotations

import contextlib
import threading

_lock = threading.Lock()   # guards _streams
_streams: dict = {}        # (device, CuPy stream handle) -> torch.cuda.ExternalStream
_DL_CUDA = 2                # DLPack's device type of CUDA memory
MAX_STREAMS = 64           # bounded: a program making streams without end drops the oldest


_NOTHING = contextlib.nullcontext()


def cupy_stream(torch, device: int):
    """A context in which torch's current device is ``device`` and its current stream is
    CuPy's current stream there. Where both already are, nothing to enter: read through
    torch's raw accessors (one C call each), as a server's steady calls find them. Run
    S136 (H200): the device and stream contexts took 11.9 us a call of SDPA from CuPy
    where torch and CuPy were on the same stream."""
    import cupy
    ptr = cupy.cuda.get_current_stream().ptr
    c = getattr(torch, "_C", None)
    get_device = getattr(c, "_cuda_getDevice", None)
    raw_stream = getattr(c, "_cuda_getCurrentRawStream", None)
    if get_device is not None and raw_stream is not None and get_device() == device \
            and raw_stream(device) == ptr:
        return _NOTHING
    stack = contextlib.ExitStack()
    stack.enter_context(torch.cuda.device(device))
    if ptr != torch.cuda.current_stream().cuda_stream:
        stack.enter_context(torch.cuda.stream(_external(torch, device, ptr)))
    return stack


def as_torch(torch, x):
    """A torch view of the CuPy array ``x`` for work inside :func:`cupy_stream`, without
    the DLPack protocol's stream exchange (``stream=-1``): torch's current stream is then
    CuPy's, so both already order their work on one stream. Run S66 (H200): 1.4 us a view
    against ``torch.from_dlpack(x)``'s 6.6 (SDPA on CuPy arrays makes four). A host array
    (NumPy: the CPU tests) has no stream and takes the protocol as it is."""
    if x.__dlpack_device__()[0] != _DL_CUDA:
        return torch.from_dlpack(x)
    return torch.from_dlpack(x.__dlpack__(stream=-1))


def _external(torch, device: int, ptr: int):
    stream = _streams.get((device, ptr))
    if stream is None:
        with _lock:
            if len(_streams) >= MAX_STREAMS:
                del _streams[next(iter(_streams))]
            stream = _streams[(device, ptr)] = torch.cuda.ExternalStream(
                ptr, device=torch.device("cuda", device))
    return stream
