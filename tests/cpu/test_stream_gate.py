"""The cuda backend's stream gate (``CudaBackend.gate``) without a GPU: its kernel and the
fixed hold compile with NVRTC for sm_90; the host side hands out tickets in order, launches
the gate with the flag's device address, its ticket, its limit in ns and the expiry ring's
device address and size, releases by raising the mapped flag (never lowering it: a later
ticket's release is not undone by an earlier one's), reads a gate as expired where the
device wrote its ticket into its ring slot, and falls back to the fixed hold where the gate
cannot be made or fails to launch."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import sys
import threading
import types

import numpy as np
import pytest

from adaptive import nvrtc
from adaptive.backends import cuda


@pytest.mark.skipif(not nvrtc.available(), reason="cuda.bindings is not installed "
                    "(pip install .[nvrtc])")
@pytest.mark.parametrize("source, entry", [(cuda._GATE_SOURCE, "adaptive_gate"),
                                           (cuda._HOLD_SOURCE, "adaptive_hold")])
def test_the_gate_and_hold_kernels_compile_for_sm90(source, entry):
    cubin, log = nvrtc.compile_source(source, (), "sm_90", f"{entry}.cu")
    assert cubin and entry.encode() in cubin
    res = nvrtc.parse_ptxas(log, entry)
    assert res["spill_store_bytes"] == 0 and res["stack_bytes"] == 0, res


def _backend(made):
    """A CudaBackend with no device behind it: the gate's state as _make_gate leaves it."""
    be = object.__new__(cuda.CudaBackend)
    be.index, be._lock, be._gate_lock = 0, threading.Lock(), threading.Lock()
    be._cp = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda i: contextlib.nullcontext()))
    be._gate = None
    be._make_gate = lambda: made
    be.holds = []
    be.hold = lambda stream, us: be.holds.append((stream, us))
    return be


def test_tickets_in_order_and_a_release_only_raises_the_flag():
    launched, types_seen = [], set()

    def kernel(grid, block, args, stream):
        types_seen.update(type(a) for a in args)
        launched.append((grid, block, tuple(int(a) for a in args), stream.ptr))
    flag, ring = ctypes.c_uint64(0), (ctypes.c_uint64 * 8)()
    be = _backend((kernel, 0xD000, flag, itertools.count(1), 0xD008, ring))
    first = be.gate(0x51, 100.0)
    second = be.gate(0x52, 250.0)
    assert launched == [((1,), (1,), (0xD000, 1, 100_000, 0xD008, 8), 0x51),
                        ((1,), (1,), (0xD000, 2, 250_000, 0xD008, 8), 0x52)]
    assert types_seen == {np.uint64}           # 64-bit kernel parameters, as declared
    second()                                   # ticket 2: releases both gates
    assert flag.value == 2
    first()                                    # ticket 1 after it: the flag stays at 2
    assert flag.value == 2
    third = be.gate(0x51, 100.0)
    assert launched[-1][2][1] == 3 and flag.value == 2   # a new gate waits
    third()
    assert flag.value == 3 and not be.holds
    # the device writes an expired gate's ticket into its slot (ticket % ring size)
    assert not first.expired() and not second.expired()
    ring[2] = 2
    assert second.expired() and not first.expired()
    ring[2] = 10                               # a later ticket's (10 % 8): not this one's
    assert not second.expired()

def test_without_mapped_memory_a_gate_is_the_fixed_hold():
    be = _backend(False)
    release = be.gate(0x77, 100.0)
    assert be.holds == [(0x77, 100.0)]
    assert release() is None and be._gate is False
    assert not hasattr(release, "expired")     # a fixed hold cannot tell
    be.gate(0x78, 50.0)
    assert be.holds[-1] == (0x78, 50.0)


def test_a_gate_that_fails_to_launch_becomes_the_fixed_hold_for_good(caplog):
    calls = []

    def kernel(grid, block, args, stream):
        calls.append(stream.ptr)
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE")
    be = _backend((kernel, 0xD000, ctypes.c_uint64(0), itertools.count(1), 0xD008,
                   (ctypes.c_uint64 * 8)()))
    caplog.set_level("WARNING")
    release = be.gate(0x51, 100.0)
    assert release() is None and be.holds == [(0x51, 100.0)] and be._gate is False
    assert any("the stream gate failed to launch" in r.message for r in caplog.records)
    be.gate(0x52, 100.0)                       # no second launch: the hold at once
    assert calls == [0x51] and be.holds[-1] == (0x52, 100.0)


def test_a_torch_library_variant_from_cupy_imports_torch_itself(monkeypatch):
    """A pack build's first case met ``sdpa_torch`` and ``cusparselt_24`` before anything
    had imported torch, and their plans failed with ``KeyError: 'torch'`` (run S72: 4 rows
    missing from the shipped pack). The plan now asks optional.require for torch, naming
    the variant, on both routes (the torch entry on views, and the entry as given)."""
    fake_torch = types.SimpleNamespace(name="torch")
    asked = []

    def require(name, why=""):
        asked.append((name, why))
        return fake_torch
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(cuda.optional, "require", require)
    monkeypatch.setattr(cuda, "load_entry", lambda variant, entry=None: (lambda *a, **k: None))
    be = object.__new__(cuda.CudaBackend)
    be.index, be._cp = 0, None
    problem = types.SimpleNamespace(kind="cupy", dtype="float16", params_dict={})
    for torch_entry in ("attention_torch", None):
        variant = types.SimpleNamespace(id="attention/sdpa_torch", needs=("torch",),
                                        torch_entry=torch_entry)
        assert callable(be._prepare_library(variant, {}, problem))
    assert asked == [("torch", "variant attention/sdpa_torch")] * 2
