"""adaptive.backends.torch_streams on stand-ins of torch and CuPy (the GPU test runs SDPA
from CuPy on a non-blocking stream: tests/gpu/test_spmm_attention_cuda.py)."""

from __future__ import annotations

import contextlib
import sys
import types

from adaptive.backends import torch_streams


class _Torch:
    """What cupy_stream reads of torch: the device and stream contexts, the current
    stream's handle, ExternalStream."""

    def __init__(self, current: int, raw: bool = False, device: int = 0):
        self.log = []
        self.current, self.current_device = current, device
        torch = self
        if raw:   # torch's raw accessors, as torch has them
            def raw_stream(index):
                torch.log.append(("raw stream", index))
                return torch.current if index == torch.current_device else -1
            self._C = types.SimpleNamespace(_cuda_getDevice=lambda: torch.current_device,
                                            _cuda_getCurrentRawStream=raw_stream)

        class ExternalStream:
            def __init__(self, ptr, device=None):
                torch.log.append(("external", ptr, device))
                self.ptr = ptr

        @contextlib.contextmanager
        def device_ctx(index):
            torch.log.append(("device", index))
            before, torch.current_device = torch.current_device, index
            yield
            torch.current_device = before

        @contextlib.contextmanager
        def stream_ctx(stream):
            before, torch.current = torch.current, stream.ptr
            torch.log.append(("stream", stream.ptr))
            yield
            torch.current = before

        self.cuda = types.SimpleNamespace(
            device=device_ctx, stream=stream_ctx, ExternalStream=ExternalStream,
            current_stream=lambda: types.SimpleNamespace(cuda_stream=torch.current))
        self.device = lambda kind, index: (kind, index)


def _cupy(monkeypatch, ptr: int):
    stream = types.SimpleNamespace(ptr=ptr)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "cupy", fake)


def test_torch_work_goes_to_cupys_stream_and_the_stream_object_is_made_once(monkeypatch):
    monkeypatch.setattr(torch_streams, "_streams", {})
    torch = _Torch(current=0)
    _cupy(monkeypatch, 77)
    for _ in range(3):
        with torch_streams.cupy_stream(torch, 1):
            assert torch.current == 77            # torch's current stream is CuPy's
        assert torch.current == 0                 # and torch's own again after
    assert torch.log.count(("external", 77, ("cuda", 1))) == 1
    assert torch.log.count(("stream", 77)) == 3 and torch.log.count(("device", 1)) == 3


def test_the_same_stream_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(torch_streams, "_streams", {})
    torch = _Torch(current=5)
    _cupy(monkeypatch, 5)
    with torch_streams.cupy_stream(torch, 0):
        assert torch.current == 5
    assert [e for e in torch.log if e[0] != "device"] == []


def test_the_stream_objects_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(torch_streams, "_streams", {})
    monkeypatch.setattr(torch_streams, "MAX_STREAMS", 4)
    torch = _Torch(current=0)
    for ptr in range(1, 11):
        _cupy(monkeypatch, ptr)
        with torch_streams.cupy_stream(torch, 0):
            assert torch.current == ptr
    assert len(torch_streams._streams) == 4
    assert set(torch_streams._streams) == {(0, p) for p in (7, 8, 9, 10)}   # the newest


def test_as_torch_takes_a_cuda_arrays_view_without_the_stream_exchange():
    """``as_torch``: a CUDA array (DLPack device type 2) is asked for its capsule with
    ``stream=-1`` (no exchange: torch's stream is the array's inside ``cupy_stream``); a
    host array goes through the protocol as it is. Either way the view shares the memory."""
    import numpy as np
    import pytest
    torch = pytest.importorskip("torch", reason="torch is in the test extra")
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = torch_streams.as_torch(torch, host)
    assert t.shape == (2, 3) and t.data_ptr() == host.ctypes.data

    asked = []

    class CudaLike:   # a CUDA array's protocol over host memory, recording its stream
        def __init__(self, a):
            self.a = a

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, stream=None, **_):
            asked.append(stream)
            return self.a.__dlpack__()
    view = torch_streams.as_torch(torch, CudaLike(host))
    assert asked == [-1] and view.data_ptr() == host.ctypes.data
    np.testing.assert_array_equal(view.numpy(), host)


def test_nothing_is_entered_where_torch_is_on_cupys_device_and_stream(monkeypatch):
    monkeypatch.setattr(torch_streams, "_streams", {})
    torch = _Torch(current=5, raw=True, device=1)
    _cupy(monkeypatch, 5)
    for _ in range(2):
        with torch_streams.cupy_stream(torch, 1):
            assert (torch.current, torch.current_device) == (5, 1)
    assert torch.log == [("raw stream", 1)] * 2   # read through the raw accessors only


def test_another_device_or_stream_takes_the_contexts_with_the_raw_accessors_there(monkeypatch):
    monkeypatch.setattr(torch_streams, "_streams", {})
    torch = _Torch(current=5, raw=True, device=0)
    _cupy(monkeypatch, 5)
    with torch_streams.cupy_stream(torch, 1):     # the same stream handle, another device
        assert torch.current_device == 1
    assert ("device", 1) in torch.log and torch.current_device == 0
    torch.log.clear()
    _cupy(monkeypatch, 9)
    with torch_streams.cupy_stream(torch, 0):     # this device, CuPy on another stream
        assert torch.current == 9
    assert torch.current == 5 and ("stream", 9) in torch.log
