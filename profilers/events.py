"""CUDA event timer: a bounded ring of event pairs, harvested later without synchronising.

``start()`` and ``stop()`` record an event pair on the caller's current stream and return
at once; :meth:`EventTimer.harvest` (called from a background thread or on a later call)
queries the oldest pending pairs and reads the elapsed time of those the GPU has finished.
Nothing here waits for the device. When every slot is still pending the pair is dropped
and counted, never waited for; a slot is reused only after its pair was harvested.

The events are created once (``cudaEventCreateWithFlags``) and recorded with the raw
runtime call on a stream pointer, so a timed launch costs two ``cudaEventRecord`` calls
and a few list operations: no event or stream objects are built per call. A hot caller
(the counter log) uses the ring directly: ``ticket``, ``busy``, ``starts``, ``ends``,
``record`` and ``pending`` (entries are tuples whose first item is the slot).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("profilers.events")

_DROPPED = -1
_DONE = 0                  # cudaSuccess from cudaEventQuery
NOT_READY = 600            # cudaErrorNotReady: the event's work has not finished


class _NullStream:
    ptr = 0


def _null_stream() -> _NullStream:
    return _NullStream


class CupyEvents:
    """Raw CUDA runtime event calls through CuPy (imported on first use).

    ``create()`` → event handle (int), ``record(event, stream_ptr)``, ``query(event)`` →
    0 when done, ``elapsed_ms(start, end)``, ``current_stream()`` → an object with
    ``.ptr`` (CuPy's current stream), ``destroy(event)``. ``error``: the exception type
    ``elapsed_ms`` raises, its ``status`` :data:`NOT_READY` while the end event is pending
    (``cudaEventElapsedTime`` answers that, so a harvest needs no separate query).
    """

    def __init__(self, device: int | None = None):
        import cupy
        rt = cupy.cuda.runtime
        self._cupy, self.device = cupy, device
        self.record = rt.eventRecord
        self.query = rt.eventQuery
        self.elapsed_ms = rt.eventElapsedTime
        self.destroy = rt.eventDestroy
        self.current_stream = cupy.cuda.get_current_stream
        self.error = rt.CUDARuntimeError
        self._create, self._flags = rt.eventCreateWithFlags, rt.eventDefault

    def create(self) -> int:
        if self.device is None:
            return self._create(self._flags)
        with self._cupy.cuda.Device(self.device):
            return self._create(self._flags)


class ObjectEvents:
    """Adapts ``(make_event, elapsed_ms)`` with event objects (``record()``, ``done``) —
    fakes in tests, or any event library — to the raw call shape."""

    error = None                # elapsed_ms of a pending pair is not an error: query first

    def __init__(self, make: Callable[[], Any], elapsed_ms: Callable[[Any, Any], float]):
        self.create, self.elapsed_ms = make, elapsed_ms
        self.current_stream = _null_stream

    @staticmethod
    def record(event, stream_ptr: int) -> None:
        event.record()

    @staticmethod
    def query(event) -> int:
        return _DONE if event.done else 600

    @staticmethod
    def destroy(event) -> None:
        pass


class EventTimer:
    """Times GPU work between :meth:`start` and :meth:`stop` with CUDA events.

    Args:
        capacity: event pairs in the ring; at most this many timings are pending at once.
        device: CUDA device ordinal the events belong to (default: the current one).
        events: the event calls to use instead of CuPy's: an object shaped like
            :class:`CupyEvents`, or ``(make_event, elapsed_ms)`` with event objects that
            have ``record()`` and a ``done`` property (tests pass fakes).

    Example:
        >>> timer = EventTimer()
        >>> token = timer.start(); kernel(...); timer.stop(token, tag="gemm")
        >>> later: [(tag, time_ms), ...] = timer.harvest()
    """

    def __init__(self, capacity: int = 1024, device: int | None = None, events=None):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if events is None:
            events = CupyEvents(device)
        elif isinstance(events, tuple):
            events = ObjectEvents(*events)
        self.events = events
        self.capacity = capacity
        self.record = events.record                 # record(event, stream_ptr)
        self.current_stream = events.current_stream
        self.starts = [events.create() for _ in range(capacity)]
        self.ends = [events.create() for _ in range(capacity)]
        self.busy = [False] * capacity              # True from start until harvested
        self.ticket = itertools.count()             # next() is atomic: safe from many threads
        self._pending: collections.deque[tuple] = collections.deque()
        self.append_pending = self._pending.append
        self._stream_ptr = [0] * capacity           # start()'s stream, for stop()
        self._harvest_lock = threading.Lock()
        self.dropped = 0
        self.status = "ok"
        self._closed = False

    # ---- caller's thread: no waits, no locks -------------------------------------------
    def start(self, stream_ptr: int | None = None) -> int:
        """Record the start event on ``stream_ptr`` (default: the current stream); return a
        slot for :meth:`stop` (-1: ring full, dropped)."""
        slot = next(self.ticket) % self.capacity
        if self.busy[slot]:
            self.dropped += 1
            return _DROPPED
        self.busy[slot] = True
        if stream_ptr is None:
            stream_ptr = self.current_stream().ptr
        self._stream_ptr[slot] = stream_ptr
        self.record(self.starts[slot], stream_ptr)
        return slot

    def stop(self, slot: int, tag: object = None) -> None:
        """Record the end event of ``slot``; ``tag`` comes back from :meth:`harvest`."""
        if slot < 0:
            return
        self.record(self.ends[slot], self._stream_ptr[slot])
        self._pending.append((slot, tag))

    def cancel(self, slot: int) -> None:
        """Give back a slot whose :meth:`stop` will never come (the timed work failed)."""
        if slot >= 0:
            self.busy[slot] = False

    # ---- any thread -------------------------------------------------------------------
    def harvest_entries(self, limit: int | None = None,
                        final: bool = False) -> list[tuple[tuple, float]]:
        """``(pending entry, time_ms)`` of finished pairs, oldest first; stops at the first
        unfinished. Frees their slots. A pair the runtime cannot time (an error other than
        not-ready) is dropped and counted. ``final`` (the log is closing) changes nothing
        here: a pair still pending then is counted by the log."""
        out: list[tuple[tuple, float]] = []
        append = out.append
        elapsed, error = self.events.elapsed_ms, getattr(self.events, "error", None)
        query = self.events.query
        starts, ends, busy = self.starts, self.ends, self.busy
        with self._harvest_lock:
            pending = self._pending
            pop = pending.popleft
            n = len(pending) if limit is None else min(limit, len(pending))
            for _ in range(n):
                entry = pending[0]
                slot = entry[0]
                if error is None:
                    if query(ends[slot]) != _DONE:
                        break
                    time_ms = elapsed(starts[slot], ends[slot])
                else:
                    try:
                        time_ms = elapsed(starts[slot], ends[slot])
                    except error as exc:
                        if getattr(exc, "status", None) == NOT_READY:
                            break
                        self._failed(exc)
                        time_ms = None
                pop()
                busy[slot] = False
                if time_ms is not None:
                    append((entry, time_ms))
        return out

    def _failed(self, exc: Exception) -> None:
        self.dropped += 1
        if self.status == "ok":
            self.status = f"event timing failed: {type(exc).__name__}: {exc}"
            log.warning("%s; such records are dropped and counted", self.status)

    def harvest(self, limit: int | None = None) -> list[tuple[object, float]]:
        """``(tag, time_ms)`` of finished pairs timed by start/stop, oldest first."""
        return [(entry[1], ms) for entry, ms in self.harvest_entries(limit)]

    def discard_pending(self) -> int:
        """Forget every pending pair (their slots stay unusable); returns how many."""
        with self._harvest_lock:
            n = len(self._pending)
            self._pending.clear()
        return n

    @property
    def pending(self) -> int:
        """Timings recorded and not yet harvested."""
        return len(self._pending)

    def __del__(self):
        if not sys.is_finalizing():
            with contextlib.suppress(Exception):
                self.close()

    def close(self) -> None:
        """Destroy the events (pending ones finish on the device first, CUDA's rule)."""
        if self._closed:
            return
        self._closed = True
        self.discard_pending()
        self.busy[:] = [True] * self.capacity       # a late start() drops, never records
        for event in self.starts + self.ends:
            try:
                self.events.destroy(event)
            except Exception:  # noqa: BLE001 (a torn-down context at exit: nothing to free)
                break
