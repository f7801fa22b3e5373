"""CUPTI activity: per-kernel GPU start and end times, tagged with the dispatch decision.

A second timing source beside CUDA events: ``CONCURRENT_KERNEL`` activity records give
each kernel's start and end on the GPU's clock, and an external correlation id pushed
around a launch ties the kernels it issued to a tag (the op and candidate). Uses the
``cupti-python`` package (CUDA 13), imported on first use. The DRIVER and RUNTIME API
kinds are enabled too: CUPTI writes an external-correlation record only beside an API
record, so without them no kernel carries the id pushed around its call (their records
are counted in ``counts["other"]`` and dropped). On r580 drivers CUPTI allows
one subscriber per process: when another tool (Nsight, a framework profiler) holds it,
``status`` says so and callers fall back to :class:`~profilers.events.EventTimer`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import traceback

log = logging.getLogger("profilers.cupti")

_MAX_OPEN_TAGS = 1 << 16
# CUPTI writes an EXTERNAL_CORRELATION record only beside an API activity record (the
# external id is attached to the driver/runtime call that launched the kernel): without
# DRIVER and RUNTIME enabled no kernel can be joined to the id pushed around its call
_KIND_NAMES = ("CONCURRENT_KERNEL", "EXTERNAL_CORRELATION", "DRIVER", "RUNTIME")


@dataclasses.dataclass(frozen=True)
class KernelRecord:
    """One kernel execution as CUPTI saw it."""

    name: str
    start_ns: int
    end_ns: int
    tag: object = None           # what was pushed around the launch; None if untagged

    @property
    def time_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


class CuptiActivity:
    """Collects kernel activity records in the background.

    Args:
        cupti: the ``cupti.cupti`` bindings module (default: imported; tests pass a fake).
        buffer_bytes: size of each activity buffer handed to CUPTI.

    ``status`` is "ok" or why CUPTI is unavailable; when it is not "ok" every method is a
    cheap no-op, so callers need no second code path.

    Example:
        >>> act = CuptiActivity()
        >>> if act.status == "ok":
        ...     with act.tagged(("gemm", "cublas")): run_kernel()
        ...     act.flush(); act.harvest()  # [KernelRecord(...)]
    """

    def __init__(self, cupti=None, buffer_bytes: int = 8 << 20):
        self.buffer_bytes = buffer_bytes
        self._cupti = None
        self._raw: collections.deque = collections.deque()
        self._tags: dict[int, object] = {}
        self._external: dict[int, int] = {}       # CUPTI correlation id -> our id
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._kinds = None
        # what CUPTI delivered (read them to tell "no kernels" from "no ids" on a device)
        self.counts = {"buffers": 0, "kernels": 0, "external": 0, "other": 0}
        self.error: str | None = None       # the first exception in the buffer callback
        self.status = self._open(cupti)

    def _enabled_kinds(self, cupti) -> list:
        return [getattr(cupti.ActivityKind, name) for name in _KIND_NAMES]

    def _enable(self, cupti) -> None:
        for kind in self._enabled_kinds(cupti):
            cupti.activity_enable(kind)

    def _disable(self, cupti) -> None:
        for kind in self._enabled_kinds(cupti):
            cupti.activity_disable(kind)

    def _open(self, cupti) -> str:
        try:
            if cupti is None:
                from cupti import cupti
            self._cupti, self._kinds = cupti, cupti.ActivityKind
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            self._enable(cupti)
        except ImportError as exc:
            self._cupti = self._kinds = None
            status = (f"CUPTI unavailable: {exc} (install adaptive-dispatch[cupti]); "
                      "timing falls back to CUDA events")
        except Exception as exc:  # noqa: BLE001
            self._cupti = self._kinds = None
            text = f"{type(exc).__name__}: {exc}"
            if "MULTIPLE_SUBSCRIBERS" in text.upper() or "SUBSCRIBER" in text.upper():
                status = (f"CUPTI is held by another tool ({text}); r580 drivers allow one "
                          "subscriber per process; timing falls back to CUDA events")
            else:
                status = f"CUPTI refused: {text}; timing falls back to CUDA events"
        else:
            self._kind = cupti.ExternalCorrelationKind.CUSTOM0
            return "ok"
        log.warning("%s", status)
        return status

    # ---- CUPTI's threads ---------------------------------------------------------------
    def _buffer_requested(self):
        return self.buffer_bytes, 0

    def _buffer_completed(self, activities) -> None:
        # copy the fields out now: the records live in CUPTI's buffer, reused afterwards.
        # This runs on CUPTI's thread, where an exception is lost: keep the first one.
        try:
            kinds, out, counts = self._kinds, [], self.counts
            external, kernel = kinds.EXTERNAL_CORRELATION, kinds.CONCURRENT_KERNEL
            counts["buffers"] += 1
            for a in activities:
                kind = a.kind
                if kind == external:
                    out.append((external, int(a.correlation_id), int(a.external_id)))
                    counts["external"] += 1
                elif kind == kernel:
                    out.append((kernel, int(a.correlation_id), str(a.name), int(a.start),
                                int(a.end)))
                    counts["kernels"] += 1
                else:
                    counts["other"] += 1
            self._raw.extend(out)
        except Exception as exc:  # noqa: BLE001 (CUPTI's thread: report, never raise)
            if self.error is None:
                self.error = (f"CUPTI buffer callback failed: {type(exc).__name__}: {exc}\n"
                              + traceback.format_exc())
                log.error("%s", self.error)

    # ---- caller's thread ---------------------------------------------------------------
    def push(self, tag: object) -> int:
        """Tag the kernels launched from this thread until :meth:`pop`; returns the id."""
        if self._cupti is None:
            return 0
        ext = next(self._ids)
        if len(self._tags) < _MAX_OPEN_TAGS:
            self._tags[ext] = tag
        self._cupti.activity_push_external_correlation_id(self._kind, ext)
        return ext

    def pop(self) -> None:
        if self._cupti is not None:
            self._cupti.activity_pop_external_correlation_id(self._kind)

    def tagged(self, tag: object):
        """Context manager: ``push(tag)`` on entry, ``pop()`` on exit."""
        return _Tagged(self, tag)

    # ---- any thread -------------------------------------------------------------------
    def flush(self) -> None:
        """Ask CUPTI to hand over every completed buffer now (it otherwise does so when full)."""
        if self._cupti is not None:
            self._cupti.activity_flush_all(0)

    def harvest(self) -> list[KernelRecord]:
        """Kernel records delivered so far, oldest first, with their tags."""
        out = []
        for ext, _, name, start, end in self._kernels():
            tag = self._tags.pop(ext, None) if ext is not None else None
            out.append(KernelRecord(name, start, end, tag))
        return out

    def _kernels(self) -> list[tuple[int | None, int, str, int, int]]:
        """(external id or None, correlation id, name, start ns, end ns) of the kernels
        delivered so far (an id that comes later: :meth:`external_of`)."""
        kinds = self._kinds
        if kinds is None:
            return []
        kernels, out = [], []
        with self._lock:
            raw = self._raw
            while raw:
                rec = raw.popleft()
                if rec[0] == kinds.EXTERNAL_CORRELATION:
                    self._external[rec[1]] = rec[2]
                else:
                    kernels.append(rec)
            for _, corr, name, start, end in kernels:
                out.append((self._external.pop(corr, None), corr, name, start, end))
            if len(self._external) > _MAX_OPEN_TAGS:     # ids whose kernels never came
                for corr in list(self._external)[:len(self._external) - _MAX_OPEN_TAGS]:
                    del self._external[corr]
        return out

    def external_of(self, corr: int) -> int | None:
        """The external id of CUPTI correlation ``corr`` if its record has come (taken)."""
        with self._lock:
            raw = self._raw
            while raw and raw[0][0] == self._kinds.EXTERNAL_CORRELATION:
                rec = raw.popleft()
                self._external[rec[1]] = rec[2]
            return self._external.pop(corr, None)

    def pause(self) -> None:
        """Stop recording kernels (flushing what was recorded); :meth:`resume` restarts.
        The callbacks stay registered: a process registers them once."""
        cupti = self._cupti
        if cupti is None or self.status != "ok":
            return
        try:
            cupti.activity_flush_all(1)
            self._disable(cupti)
        except Exception as exc:  # noqa: BLE001
            log.warning("pausing CUPTI activity: %s", exc)
        self.status = "paused"

    def resume(self) -> None:
        """Record kernels again after :meth:`pause`."""
        cupti = self._cupti
        if cupti is None or self.status != "paused":
            return
        try:
            self._enable(cupti)
        except Exception as exc:  # noqa: BLE001
            self.status = f"CUPTI refused to resume: {type(exc).__name__}: {exc}"
            log.warning("%s; timing falls back to CUDA events", self.status)
            return
        self.status = "ok"

    def close(self) -> None:
        """Flush and stop collecting."""
        if self._cupti is None:
            return
        cupti, self._cupti = self._cupti, None
        try:
            cupti.activity_flush_all(1)
            self._disable(cupti)
        except Exception as exc:  # noqa: BLE001
            log.warning("closing CUPTI activity: %s", exc)
        self.status = "closed"


class _Tagged:
    __slots__ = ("activity", "tag")

    def __init__(self, activity: CuptiActivity, tag: object):
        self.activity, self.tag = activity, tag

    def __enter__(self):
        return self.activity.push(self.tag)

    def __exit__(self, *exc):
        self.activity.pop()


_shared: CuptiActivity | None = None
_shared_lock = threading.Lock()
_shared_users = 0


def shared_activity(cupti=None) -> CuptiActivity:
    """The process's one :class:`CuptiActivity` (CUPTI takes one subscriber a process)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.status == "closed":
            _shared = CuptiActivity(cupti)
        elif _shared.status == "paused":
            _shared.resume()
        return _shared


class CuptiTimer:
    """Times tagged calls by the kernels they issued, from CUPTI activity records.

    The counter log's CUPTI timing source, shaped for a hot caller like
    :class:`~profilers.events.EventTimer`: ``ids`` (next id), ``push_id(id)`` and
    ``pop_id()`` around a call, ``append_pending((id, ...))`` after it, ``pending_calls``
    (bounded by ``capacity`` by the caller). :meth:`harvest_entries` (writer thread)
    flushes CUPTI and gives ``(entry, time_ms)`` per call whose kernels arrived: the span
    from its first kernel's start to its last kernel's end on the GPU clock (what an event
    pair around the call would read, without the launch gaps before the first kernel).

    ``status`` is "ok" or why CUPTI cannot be used (then callers use events).
    """

    kind = "cupti"

    def __init__(self, capacity: int = 4096, activity: CuptiActivity | None = None,
                 settle_s: float = 0.5, clock=None):
        import time
        global _shared_users
        self._shared = activity is None
        self.activity = activity if activity is not None else shared_activity()
        if self._shared:
            with _shared_lock:
                _shared_users += 1
        self.status = self.activity.status
        self.capacity, self.settle_s = capacity, settle_s
        self._clock = clock or time.monotonic
        self.ids = itertools.count(1)
        self.pending_calls: collections.deque = collections.deque()
        self.append_pending = self._append
        self.dropped = 0
        self.problem: str | None = None            # why calls were dropped (the first time)
        self.untagged_kernels = 0                  # kernels no id ever came for
        self._untagged: dict[int, tuple] = {}      # CUPTI correlation -> (seen, start, end)
        self._spans: dict[int, list] = {}          # id -> [first start, last end, kernels]
        self._lock = threading.Lock()
        cupti, kind = self.activity._cupti, getattr(self.activity, "_kind", None)
        if cupti is not None:
            push, pop = cupti.activity_push_external_correlation_id, \
                cupti.activity_pop_external_correlation_id
            self.push_id = lambda ext: push(kind, ext)
            self.pop_id = lambda: pop(kind)
        else:
            self.push_id = lambda ext: None
            self.pop_id = lambda: None
        self.current_stream = _null_stream

    def _append(self, entry: tuple) -> None:
        self.pending_calls.append((self._clock(), entry))

    def use_cupy_streams(self) -> CuptiTimer:
        """Report CuPy's current stream as the launch's stream (the cuda backend's)."""
        import cupy
        self.current_stream = cupy.cuda.get_current_stream
        return self

    def harvest_entries(self, limit: int | None = None) -> list[tuple[tuple, float]]:
        """``(entry, time_ms)`` of calls whose kernels have arrived, in call order. A call
        with no kernel after ``settle_s`` (it issued none, or CUPTI lost them) is dropped
        and counted, and the first such drop sets :attr:`problem` (with what CUPTI
        delivered so far). A kernel whose external-correlation record has not come yet
        waits for it (up to ``settle_s``): the two may arrive in different buffers."""
        with self._lock:
            activity = self.activity
            activity.flush()
            spans, now = self._spans, self._clock()
            kernels = activity._kernels()
            if self._untagged:                        # ids that came after their kernels
                waiting, self._untagged = self._untagged, {}
                for corr, (seen_s, start, end) in waiting.items():
                    ext = activity.external_of(corr)
                    if ext is not None:
                        kernels.append((ext, corr, "", start, end))
                    elif now - seen_s <= self.settle_s:
                        self._untagged[corr] = (seen_s, start, end)
                    else:
                        self.untagged_kernels += 1    # not ours (or its id was lost)
            for ext, corr, _, start, end in kernels:
                if ext is None:
                    if len(self._untagged) < 4 * self.capacity:
                        self._untagged[corr] = (now, start, end)
                    else:
                        self.untagged_kernels += 1
                    continue
                span = spans.get(ext)
                if span is None:
                    spans[ext] = [start, end, 1]
                else:
                    span[0], span[1] = min(span[0], start), max(span[1], end)
                    span[2] += 1
            out, keep = [], []
            newest = max(spans, default=0)
            pending = self.pending_calls
            for _ in range(len(pending)):
                queued_s, entry = pending.popleft()
                span = spans.get(entry[0])
                # complete once a later call's kernels arrived or the call has settled
                if span is not None and (entry[0] < newest or now - queued_s > self.settle_s):
                    del spans[entry[0]]
                    out.append((entry, (span[1] - span[0]) / 1e6))
                elif span is None and now - queued_s > self.settle_s:
                    self.dropped += 1
                    if self.problem is None:
                        self._no_kernels(entry[0])
                else:
                    keep.append((queued_s, entry))
            pending.extend(keep)
            if len(spans) > 4 * self.capacity:        # kernels of calls no longer pending
                for ext in sorted(spans)[:len(spans) - 4 * self.capacity]:
                    del spans[ext]
        return out

    def _no_kernels(self, ext: int) -> None:
        counts = self.activity.counts
        self.problem = (
            f"CUPTI timing: call {ext} has no kernel record {self.settle_s} s after it was "
            f"queued; its record is dropped (CUPTI delivered {counts['buffers']} buffers, "
            f"{counts['kernels']} kernel records, {counts['external']} external-correlation "
            f"records, {counts['other']} others; {len(self._untagged)} kernels wait for "
            f"their id, {self.untagged_kernels} never got one"
            + (f"; {self.activity.error.splitlines()[0]}" if self.activity.error else "")
            + ")")
        log.warning("%s", self.problem)

    @property
    def pending(self) -> int:
        return len(self.pending_calls)

    def discard_pending(self) -> int:
        n = len(self.pending_calls)
        self.pending_calls.clear()
        return n

    def close(self) -> None:
        """Forget pending calls; the last user of the shared subscription pauses CUPTI (so
        kernels are no longer recorded once no log needs them)."""
        global _shared_users
        self.discard_pending()
        self._spans.clear()
        self._untagged.clear()
        if self._shared:
            self._shared = False
            with _shared_lock:
                _shared_users -= 1
                last = _shared_users == 0
            if last:
                self.activity.pause()


class _NullStream:
    ptr = 0


def _null_stream() -> _NullStream:
    return _NullStream
