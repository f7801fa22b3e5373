"""Progress of long commands: a line at least every few seconds, never a line per item.

:class:`Heartbeat` watches what a command writes to stdout and stderr; when nothing has
been written for ``every_s`` seconds it writes one line saying what is running and for how
long. Code deep inside a command says what it is doing with :func:`doing` (cheap: one attribute;
nothing when no heartbeat is open), so its own output stays the milestones it prints.

    with Heartbeat("adaptive bench"):
        for i, case in enumerate(cases):
            doing(f"timing input {i + 1}/{len(cases)}")
            ...
"""

from __future__ import annotations

import sys
import threading
import time

EVERY_S = 4.0   # silence before a heartbeat line (checked every 0.5 s: a line within 4.5 s,
#                 so a loaded machine still writes one within 5 s)
_active: list[Heartbeat] = []   # the open heartbeats, innermost last (commands nest rarely)


def doing(activity: str) -> None:
    """Tell the open heartbeat, if any, what is running now."""
    if _active:
        _active[-1].activity = activity


class _Noting:
    """A text stream that notes the time of every write and passes everything through."""

    def __init__(self, stream, beat: Heartbeat):
        self._stream, self._beat = stream, beat

    def write(self, text: str) -> int:
        if text:
            self._beat.last_s = time.monotonic()
            self._beat.line_open = not text.endswith("\n")   # e.g. a bar redrawn with \r
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class Heartbeat:
    """While open, a line on stderr whenever stdout and stderr have been silent ``every_s``.

    Args:
        command: how the lines start (``"adaptive bench"``).
        every_s: the longest silence.
        stream: where the lines go (default: stderr, so stdout stays the report).
    """

    def __init__(self, command: str, every_s: float = EVERY_S, stream=None):
        self.command, self.every_s = command, every_s
        self._target = stream
        self.activity = "starting"
        self.line_open = False
        self.t0_s = self.last_s = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved: tuple | None = None

    def __enter__(self) -> Heartbeat:
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Noting(sys.stdout, self), _Noting(sys.stderr, self)
        self.t0_s = self.last_s = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="adaptive-heartbeat",
                                        daemon=True)
        self._thread.start()
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.remove(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved

    def _run(self) -> None:
        while not self._stop.wait(min(0.5, self.every_s / 4)):
            now = time.monotonic()
            if now - self.last_s >= self.every_s:
                stream = self._target or self._saved[1]
                head = "\n" if self.line_open else ""
                self.line_open = False
                stream.write(f"{head}{self.command}: {self.activity} "
                             f"({now - self.t0_s:.0f} s)\n")
                stream.flush()
                self.last_s = now
