"""CUDA event timer: a bounded ring of event pairs, harvested later without synchronising.

``start()`` and ``stop()`` record an event pair on the caller's current stream and return
at once; :meth:`EventTimer.harvest` (called from a background thread or on a later call)
queries the oldest pending pairs and reads the elapsed time of those the GPU has finished.
Nothing here waits for the device. When every slot is still pending the pair is dropped
and counted, never waited for.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable
from typing import Any

_DROPPED = -1


def _cupy_events(device: int | None):
    """(event factory, elapsed-ms function) from CuPy, imported on first use."""
    import cupy

    def make():
        if device is None:
            return cupy.cuda.Event()
        with cupy.cuda.Device(device):
            return cupy.cuda.Event()

    return make, cupy.cuda.get_elapsed_time


class EventTimer:
    """Times GPU work between :meth:`start` and :meth:`stop` with CUDA events.

    Args:
        capacity: event pairs in the ring; at most this many timings are pending at once.
        device: CUDA device ordinal the events belong to (default: the current one).
        events: ``(make_event, elapsed_ms)`` to use instead of CuPy's (tests pass fakes;
            an event needs ``record()`` and a ``done`` property).

    Example:
        >>> timer = EventTimer()
        >>> token = timer.start(); kernel(...); timer.stop(token, tag="gemm")
        >>> later: [(tag, time_ms), ...] = timer.harvest()
    """

    def __init__(self, capacity: int = 1024, device: int | None = None,
                 events: tuple[Callable[[], Any], Callable[[Any, Any], float]] | None = None):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        make, self._elapsed_ms = events if events is not None else _cupy_events(device)
        self.capacity = capacity
        self._start = [make() for _ in range(capacity)]
        self._end = [make() for _ in range(capacity)]
        self._busy = [False] * capacity
        self._tags: list[object] = [None] * capacity
        self._counter = itertools.count()     # next() is atomic: safe from many threads
        self._pending: collections.deque[int] = collections.deque()
        self._harvest_lock = threading.Lock()
        self.dropped = 0
        self.status = "ok"

    # ---- caller's thread: no waits, no locks -------------------------------------------
    def start(self) -> int:
        """Record the start event; return a slot for :meth:`stop` (-1: ring full, dropped)."""
        slot = next(self._counter) % self.capacity
        if self._busy[slot]:
            self.dropped += 1
            return _DROPPED
        self._busy[slot] = True
        self._start[slot].record()
        return slot

    def stop(self, slot: int, tag: object = None) -> None:
        """Record the end event of ``slot``; ``tag`` comes back from :meth:`harvest`."""
        if slot < 0:
            return
        self._end[slot].record()
        self._tags[slot] = tag
        self._pending.append(slot)

    # ---- any thread -------------------------------------------------------------------
    def harvest(self, limit: int | None = None) -> list[tuple[object, float]]:
        """``(tag, time_ms)`` of finished pairs, oldest first; stops at the first unfinished."""
        out: list[tuple[object, float]] = []
        with self._harvest_lock:
            pending = self._pending
            while pending and (limit is None or len(out) < limit):
                slot = pending[0]
                end = self._end[slot]
                if not end.done:
                    break
                pending.popleft()
                out.append((self._tags[slot], self._elapsed_ms(self._start[slot], end)))
                self._tags[slot] = None
                self._busy[slot] = False
        return out

    @property
    def pending(self) -> int:
        """Timings recorded and not yet harvested."""
        return len(self._pending)
