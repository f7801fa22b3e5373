"""Long subprocess work that starts when the tests are collected and overlaps the rest.

A test module declares ``BACKGROUND = {name: Job(...)}``; once the session's tests are
collected, ``tests/conftest.py`` starts every job of a module that has tests to run, each
in its own process group, and moves the tests that read a result (through the session
fixture ``background``: ``background("name")`` waits and returns a :class:`Finished`) to the
end of the run, the longest jobs' readers last. CPU-bound work that needs no clock (NVRTC
compiles) runs at nice 19, on what the suite leaves idle; work that times itself keeps the
normal priority.

A job gets a process group of its own (to kill it and its workers together), not a session
of its own: where the kernel groups the scheduling of each session (autogroup, on by default
on most Linux desktops and VMs), a job in a new session is scheduled as a peer of the whole
test process whatever its nice value, and a dozen jobs left the tests a fraction of a core
(a 2-core machine: 67 s of tests took 100 s beside them).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# the command's interpreter, at a lower priority before it starts (its children inherit it)
_NICE = "import os, sys; os.nice(int(sys.argv[1])); os.execv(sys.executable, " \
        "[sys.executable, *sys.argv[2:]])"


@dataclasses.dataclass(frozen=True)
class Job:
    """A Python command: ``args(folder, config)`` gives what follows the interpreter (``-c
    CODE ...`` or ``-m MODULE ...``); ``folder`` is the job's own, empty, working folder."""
    args: Callable[[Path, object], list[str]]
    cpu_s: float              # about how long it takes on one free core (orders the readers)
    nice: int = 0             # 19: no clock inside, so it may wait for idle CPU
    timeout_s: float = 900.0  # from its start; then its process group is killed
    cwd: Path | None = None   # default: its folder
    env: Callable[[Path], dict] | None = None   # its whole environment, given its folder


@dataclasses.dataclass(frozen=True)
class Finished:
    rc: int | None            # None: killed at its timeout
    stdout: str
    stderr: str
    folder: Path

    def report(self, chars: int = 3000) -> str:
        """The exit code and the ends of both streams, for an assertion message."""
        return (f"exit code {self.rc}\n--- stdout\n{self.stdout[-chars:]}\n"
                f"--- stderr\n{self.stderr[-chars:]}")


class Running:
    def __init__(self, name: str, job: Job, config):
        self.name, self.job = name, job
        self._tmp = tempfile.TemporaryDirectory(prefix=f"adaptive-bg-{name.replace('/', '-')}-")
        self.folder = Path(self._tmp.name) / "work"
        self.folder.mkdir()
        self._out = Path(self._tmp.name) / "stdout"
        self._err = Path(self._tmp.name) / "stderr"
        argv = [sys.executable, *job.args(self.folder, config)]
        if job.nice:
            argv = [sys.executable, "-c", _NICE, str(job.nice), *argv[1:]]
        self.started = time.monotonic()
        with open(self._out, "wb") as out, open(self._err, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, cwd=job.cwd or self.folder,
                                         env=job.env(self.folder) if job.env else None,
                                         process_group=0)
        self._finished: Finished | None = None

    def done(self) -> bool:
        """Whether the job has ended (never waits)."""
        return self._finished is not None or self.proc.poll() is not None

    def result(self) -> Finished:
        if self._finished is None:
            try:
                rc = self.proc.wait(timeout=max(0.0, self.started + self.job.timeout_s
                                                - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill()
                rc = None
            self._finished = Finished(rc, self._out.read_text(errors="replace"),
                                      self._err.read_text(errors="replace"), self.folder)
        return self._finished

    def stop(self) -> None:
        self._kill()
        self._tmp.cleanup()

    def _kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)   # its own group: it and its workers
            self.proc.wait()
