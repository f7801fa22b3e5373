"""CUPTI activity: per-kernel GPU start and end times, tagged with the dispatch decision.

A second timing source beside CUDA events: ``CONCURRENT_KERNEL`` activity records give
each kernel's start and end on the GPU's clock, and an external correlation id pushed
around a launch ties the kernels it issued to a tag (the op and candidate). Uses the
``cupti-python`` package (CUDA 13), imported on first use. On r580 drivers CUPTI allows
one subscriber per process: when another tool (Nsight, a framework profiler) holds it,
``status`` says so and callers fall back to :class:`~profilers.events.EventTimer`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading

log = logging.getLogger("profilers.cupti")

_MAX_OPEN_TAGS = 1 << 16


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
        self.status = self._open(cupti)

    def _open(self, cupti) -> str:
        try:
            if cupti is None:
                from cupti import cupti
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
            cupti.activity_enable(cupti.ActivityKind.EXTERNAL_CORRELATION)
        except ImportError as exc:
            status = (f"CUPTI unavailable: {exc} (install adaptive-dispatch[cupti]); "
                      "timing falls back to CUDA events")
        except Exception as exc:  # noqa: BLE001
            text = f"{type(exc).__name__}: {exc}"
            if "MULTIPLE_SUBSCRIBERS" in text.upper() or "SUBSCRIBER" in text.upper():
                status = (f"CUPTI is held by another tool ({text}); r580 drivers allow one "
                          "subscriber per process; timing falls back to CUDA events")
            else:
                status = f"CUPTI refused: {text}; timing falls back to CUDA events"
        else:
            self._cupti, self._kinds = cupti, cupti.ActivityKind
            self._kind = cupti.ExternalCorrelationKind.CUSTOM0
            return "ok"
        log.warning("%s", status)
        return status

    # ---- CUPTI's threads ---------------------------------------------------------------
    def _buffer_requested(self):
        return self.buffer_bytes, 0

    def _buffer_completed(self, activities) -> None:
        self._raw.extend(activities)

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
        kinds = self._kinds
        if kinds is None:
            return []
        out, kernels = [], []
        with self._lock:
            while self._raw:
                rec = self._raw.popleft()
                if rec.kind == kinds.EXTERNAL_CORRELATION:
                    self._external[rec.correlation_id] = rec.external_id
                elif rec.kind == kinds.CONCURRENT_KERNEL:
                    kernels.append(rec)
            for k in kernels:
                ext = self._external.pop(k.correlation_id, None)
                tag = self._tags.pop(ext, None) if ext is not None else None
                out.append(KernelRecord(str(k.name), int(k.start), int(k.end), tag))
        return out

    def close(self) -> None:
        """Flush and stop collecting."""
        if self._cupti is None:
            return
        cupti, self._cupti = self._cupti, None
        try:
            cupti.activity_flush_all(1)
            cupti.activity_disable(cupti.ActivityKind.CONCURRENT_KERNEL)
            cupti.activity_disable(cupti.ActivityKind.EXTERNAL_CORRELATION)
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
