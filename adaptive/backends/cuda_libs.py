"""NVIDIA libraries the ctypes variants call (cuSPARSELt, cuBLASLt), loaded once a process,
and their handles, made once a device (:func:`per_device`).

A library is looked up by its sonames first (one already in the process, loaded by PyTorch
or CuPy, is found so), then in the ``lib`` folder of each of NVIDIA's wheels named; its
functions get their argument types and an ``int`` status back. A library that cannot be
loaded raises ``RuntimeError`` naming every path tried, and is tried again next time.

ctypes releases the GIL around every foreign call. For a call that only enqueues work on a
stream (a matmul on a kept plan: microseconds) that is a loss: where another thread waits
for the interpreter (the cost model's refit, a harvester) it takes it, and the caller waits
to get it back, up to the interpreter's switch interval (5 ms). Run S120 read cuBLAS's
issuing, through ctypes, at 35-38 us least and 75-250 us sampled in the dispatcher where
the same call issues in 20 us pinned, and the policy committed a kernel of ours at 1.7x
cuBLAS's device time on it. Such calls are named in ``holding_gil``: they are bound
through a ``PyDLL`` of the same library, which keeps the GIL, as CuPy's kernel launches
do.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from collections.abc import Callable, Mapping, Sequence

_lock = threading.RLock()   # a handle's make() may load its library
_loaded: dict[tuple, ctypes.CDLL] = {}


def library(sonames: Sequence[str], packages: Sequence[str], need: str,
            signatures: Mapping[str, list], holding_gil: Sequence[str] = ()) -> ctypes.CDLL:
    """The loaded library: the first of ``sonames`` that loads, in the process or from the
    wheels ``packages`` (``nvidia.cusparselt``); ``need`` says who needs it and where it
    comes from, for the error; ``signatures``: function name -> argument types;
    ``holding_gil``: functions (of ``signatures``) called without releasing the GIL."""
    key = tuple(sonames)
    lib = _loaded.get(key)
    if lib is not None:
        return lib
    with _lock:
        lib = _loaded.get(key)
        if lib is None:
            tried = []
            for path in _paths(sonames, packages):
                try:
                    lib = ctypes.CDLL(path)
                    break
                except OSError as exc:
                    tried.append(f"{path}: {exc}")
            else:
                raise RuntimeError(f"{need}; tried " + "; ".join(tried))
            held = ctypes.PyDLL(path) if holding_gil else None   # the same handle
            for name, args in signatures.items():
                fn = getattr(held if name in holding_gil else lib, name)
                fn.argtypes, fn.restype = args, ctypes.c_int
                setattr(lib, name, fn)
            _loaded[key] = lib
    return lib


def _paths(sonames: Sequence[str], packages: Sequence[str]) -> list[str]:
    paths = list(sonames)
    for pkg in packages:
        try:
            spec = importlib.util.find_spec(pkg)
        except ModuleNotFoundError:   # no nvidia.* wheels at all: a missing library
            spec = None
        for folder in (spec.submodule_search_locations or []) if spec else []:
            paths += [os.path.join(folder, "lib", so) for so in sonames]
    return paths


def per_device(table: dict, device: int, make: Callable[[], object]):
    """``table[device]``, made by ``make()`` the first time it is asked for (one thread
    makes it: a library's handle on that device)."""
    value = table.get(device)
    if value is None:
        with _lock:
            value = table.get(device)
            if value is None:
                value = table[device] = make()
    return value
