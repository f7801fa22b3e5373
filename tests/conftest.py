"""Test layout by hardware: ``tests/cpu`` runs anywhere; ``tests/gpu`` needs a CUDA device.

The device probe and the skipping of ``gpu``-marked tests are in ``tests/gpu/conftest.py``.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's id so failures reproduce."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def quick_selection_report():
    """``run_selection("host", quick=True, seed=0)``, run once for every test that reads it
    (the selection tests and the selection benchmark's dry run)."""
    pytest.importorskip("sklearn")
    from adaptive.bench.selection import run_selection
    return run_selection("host", quick=True, seed=0)
