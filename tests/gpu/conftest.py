"""The GPU tests: one device probe per session decides whether they run.

Without a usable device every ``gpu``-marked test is skipped with the probe's reason, and
the run reports them in one line ("N GPU tests skipped: no CUDA GPU on this machine")
instead of a letter and a summary line per test.
"""

from __future__ import annotations

import functools
import glob
import os
import sys

import pytest

SKIPPED = "gpu-skipped"   # the report category of a GPU test skipped for want of a device


@functools.lru_cache(maxsize=1)
def gpu_probe() -> str | None:
    """None when a CUDA device is usable, else why not, in a few words."""
    if sys.platform == "linux" and not (glob.glob("/dev/nvidia[0-9]*") or
                                        glob.glob("/proc/driver/nvidia/gpus/*") or
                                        os.path.exists("/dev/dxg")):   # WSL2's GPU
        return "no CUDA GPU on this machine"
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'adaptive-dispatch[cuda13]')"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 (any failure means: no usable device)
        return f"CUDA is not usable here ({type(exc).__name__}: {exc})"
    if n == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return "no CUDA device is visible" + (f" (CUDA_VISIBLE_DEVICES={visible!r})"
                                              if visible is not None else "")
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_probe()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
            item.user_properties.append((SKIPPED, True))


def pytest_report_teststatus(report, config):
    """A GPU test skipped for want of a device: counted, but no letter and no summary line."""
    if report.skipped and (SKIPPED, True) in report.user_properties:
        return SKIPPED, "", "SKIPPED (no GPU)"
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get(SKIPPED, [])
    if skipped:
        terminalreporter.write_line(f"{len(skipped)} GPU tests skipped: {gpu_probe()}")


@pytest.fixture(scope="session")
def cp():
    """The CuPy module (the probe has already checked a device is usable)."""
    return pytest.importorskip("cupy")
