"""Test layout by hardware: ``tests/cpu`` runs anywhere; ``tests/gpu`` needs a CUDA device.

One device probe per session decides whether ``gpu``-marked tests run; without a
device they skip with the reason the probe gave.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest


@functools.lru_cache(maxsize=1)
def gpu_probe() -> str | None:
    """None when a CUDA device is usable, else why not."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return f"no CUDA device ({type(exc).__name__}: {exc})"
    return None if n > 0 else "no CUDA device"


def pytest_collection_modifyitems(config, items):
    reason = gpu_probe()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's id so failures reproduce."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)
