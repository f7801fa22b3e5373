"""Fixtures of the GPU tests (they are skipped without a device: see ../conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cp():
    """The CuPy module (the gpu marker has already checked a device is usable)."""
    return pytest.importorskip("cupy")
