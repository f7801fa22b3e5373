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
    """None when a CUDA device is usable, else why not, in a few words. CuPy decides; the
    device files only word the reason (no GPU at all, or one CUDA cannot use)."""
    try:
        import cupy
    except ImportError:
        cupy = None
    problem = "CuPy is not installed (pip install 'adaptive-dispatch[cuda13]')"
    if cupy is not None:
        try:
            if cupy.cuda.runtime.getDeviceCount() > 0:
                return None
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            problem = "no CUDA device is visible" + (
                f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
        except Exception as exc:  # noqa: BLE001 (any failure means: no usable device)
            problem = f"CUDA is not usable here ({type(exc).__name__}: {exc})"
    if not has_gpu_device_files():
        return "no CUDA GPU on this machine"
    return problem


def has_gpu_device_files() -> bool:
    """Whether the OS shows an NVIDIA GPU (Linux device files; True where it cannot tell)."""
    if sys.platform != "linux":
        return True
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/proc/driver/nvidia/gpus/*")
                or os.path.exists("/dev/dxg"))   # /dev/dxg: WSL2's GPU


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
    if report.skipped and (SKIPPED, True) in getattr(report, "user_properties", ()):
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

