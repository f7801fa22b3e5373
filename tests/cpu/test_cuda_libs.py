"""The ctypes variants' library loader (adaptive.backends.cuda_libs) without a GPU: a
library found by a path is loaded once with its functions declared; one found nowhere is
an error naming every path tried, the wheels' folders included."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import pytest

from adaptive.backends import cuda_libs


def test_a_library_loads_once_with_its_functions_declared(monkeypatch):
    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no C library name to load on this machine")
    monkeypatch.setattr(cuda_libs, "_loaded", {})
    lib = cuda_libs.library(["libnope.so.9", libc], [], "test needs libc",
                            {"abs": [ctypes.c_int]})
    assert lib.abs.argtypes == [ctypes.c_int] and lib.abs.restype is ctypes.c_int
    assert lib.abs(-7) == 7
    assert cuda_libs.library(["libnope.so.9", libc], [], "x", {}) is lib


def test_a_missing_library_names_every_path_tried(monkeypatch, tmp_path):
    monkeypatch.setattr(cuda_libs, "_loaded", {})
    wheel = tmp_path / "fakewheel"
    wheel.mkdir()
    (wheel / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fakewheel", None)
    with pytest.raises(RuntimeError) as err:
        cuda_libs.library(["libnope.so.9"], ["fakewheel", "nvidia_absent_pkg.sub"],
                          "cublaslt_plan needs libnope", {})
    text = str(err.value)
    assert text.startswith("cublaslt_plan needs libnope; tried libnope.so.9: ")
    assert str(wheel / "lib" / "libnope.so.9") in text
    assert "nvidia_absent_pkg" not in text        # no such wheel: nothing to try there
    assert cuda_libs._loaded == {}                # tried again next time


def test_a_handle_is_made_once_a_device_by_one_thread():
    import threading
    table, made, gate = {}, [], threading.Barrier(8)

    def make(device):
        made.append(device)
        return f"handle {device}"
    got = []

    def ask(device):
        gate.wait()
        got.append(cuda_libs.per_device(table, device, lambda: make(device)))
    threads = [threading.Thread(target=ask, args=(i % 2,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(made) == [0, 1] and table == {0: "handle 0", 1: "handle 1"}
    assert sorted(got) == ["handle 0"] * 4 + ["handle 1"] * 4


def test_a_function_named_holding_gil_keeps_the_interpreter_through_the_call(monkeypatch):
    """``usleep`` bound holding the GIL: a Python thread spinning beside it runs no
    bytecode for the call's whole 100 ms (its timestamps leave a gap that long); bound
    plainly (ctypes releases the GIL) it runs throughout (stamps all through the middle)."""
    import threading
    import time
    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no C library name to load on this machine")
    monkeypatch.setattr(cuda_libs, "_loaded", {})
    lib = cuda_libs.library([libc], [], "test needs libc", {
        "usleep": [ctypes.c_uint], "abs": [ctypes.c_int]}, holding_gil=["usleep"])
    assert lib.usleep._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    assert not lib.abs._flags_ & ctypes._FUNCFLAG_PYTHONAPI and lib.abs(-4) == 4
    plain = ctypes.CDLL(libc).usleep
    plain.argtypes, plain.restype = [ctypes.c_uint], ctypes.c_int
    stamps, stop = [], threading.Event()

    def spin():
        while not stop.is_set():
            stamps.append(time.perf_counter())
    thread = threading.Thread(target=spin)
    thread.start()
    try:
        time.sleep(0.01)
        windows = {}
        for name, fn in (("held", lib.usleep), ("plain", plain)):
            t0 = time.perf_counter()
            fn(100_000)
            windows[name] = (t0, time.perf_counter())
    finally:
        stop.set()
        thread.join()

    def longest_gap(lo, hi):
        points = [lo, *(t for t in stamps if lo < t < hi), hi]
        return max(b - a for a, b in zip(points, points[1:]))
    # where in the window the call ran is not known: the spinner may hold the GIL between
    # a clock read and the call for a switch interval, or longer on a loaded machine (it
    # failed 2 of 4 full suites when the window's middle half was assumed to be the call)
    gap = longest_gap(*windows["held"])
    lo, hi = windows["plain"]
    middle = sum(lo + (hi - lo) / 4 < t < hi - (hi - lo) / 4 for t in stamps)
    assert gap >= 0.1 and middle > 1000, (gap, middle)
