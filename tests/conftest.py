"""Test layout by hardware: ``tests/cpu`` runs anywhere; ``tests/gpu`` needs a CUDA device.

The device probe and the skipping of ``gpu``-marked tests are in ``tests/gpu/conftest.py``.

NVRTC compiles of the CUDA variants (``nvrtc_results``) run in a background process group
at the lowest CPU priority, started once the tests are collected, so they overlap the rest
of the suite; the tests that read them run last. By default they compile a covering set
(every variant, dtype and parameter value, the configs nearest each device limit, every
config of the variants checked for spills); ``--nvrtc-all`` compiles every config.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest

NVRTC_FIXTURE = "nvrtc_results"


def pytest_addoption(parser):
    parser.addoption("--nvrtc-all", action="store_true", default=False,
                     help="compile every CUDA variant x config x dtype with NVRTC (default: "
                          "a covering set, every variant, dtype and parameter value)")


def pytest_collection_modifyitems(session, config, items):
    """Tests reading the NVRTC results go last; their compiles start now, in the background."""
    needing = [item for item in items if NVRTC_FIXTURE in getattr(item, "fixturenames", ())]
    if not needing:
        return
    items[:] = [item for item in items if item not in needing] + needing
    from adaptive import nvrtc
    if nvrtc.available() and not config.option.collectonly:
        config.stash[_NVRTC] = _BackgroundCheck(config.getoption("--nvrtc-all"))


def pytest_unconfigure(config):
    check = config.stash.get(_NVRTC, None)
    if check is not None:
        check.stop()


# the adaptive command at the lowest CPU priority (its compile workers inherit it)
_NICE_CLI = "import os, sys; os.nice(19); from adaptive.cli import main; sys.exit(main())"


class _BackgroundCheck:
    """``adaptive nvrtc-check`` in its own process group at nice 19, writing JSON."""

    def __init__(self, every_config: bool):
        self.folder = tempfile.TemporaryDirectory(prefix="adaptive-nvrtc-")
        self.json_path = Path(self.folder.name) / "results.json"
        self.log_path = Path(self.folder.name) / "log.txt"
        cmd = [sys.executable, "-c", _NICE_CLI, "nvrtc-check", "--quiet",
               "--workers", "2", "--json", str(self.json_path)]
        if not every_config:
            cmd.append("--cover")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def results(self) -> list[dict]:
        rc = self.proc.wait()
        log = self.log_path.read_text(errors="replace")[-4000:]
        if rc not in (0, 1) or not self.json_path.exists():   # 1: some kernels failed
            raise RuntimeError(f"adaptive nvrtc-check exited with {rc}:\n{log}")
        return json.loads(self.json_path.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)   # its own group: it and its workers
            self.proc.wait()
        self.folder.cleanup()


_NVRTC = pytest.StashKey[_BackgroundCheck]()


@pytest.fixture(scope="session")
def nvrtc_results(request) -> list[dict]:
    """One dict per compiled (variant, config, dtype), as ``nvrtc.check_all`` returns them."""
    check = request.config.stash.get(_NVRTC, None)
    if check is None:
        pytest.skip("cuda.bindings is not installed (pip install .[nvrtc])")
    try:
        return check.results()
    except RuntimeError as exc:
        pytest.fail(str(exc))


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
