"""CUPTI activity: per-kernel GPU start and end times, tagged with the dispatch decision.

A second timing source beside CUDA events: ``CONCURRENT_KERNEL`` activity records give
each kernel's start and end on the GPU's clock, and an external correlation id pushed
around a launch ties the kernels it issued to a tag (the op and candidate). Uses the
``cupti-python`` package (CUDA 13), imported on first use; the activity buffers
themselves are taken through ctypes on the libcupti it loads (see
:mod:`profilers.cupti_buffers` for why). The DRIVER and RUNTIME API
kinds are enabled too: CUPTI writes an external-correlation record only beside an API
record, so without them no kernel carries the id pushed around its call (their records
are counted in ``counts["other"]`` and dropped). On r580 drivers CUPTI allows
one subscriber per process: when another tool (Nsight, a framework profiler) holds it,
``status`` says so and callers fall back to :class:`~profilers.events.EventTimer`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import math
import re
import threading
import traceback
from time import perf_counter, thread_time

log = logging.getLogger("profilers.cupti")

_MAX_OPEN_TAGS = 1 << 16      # ids, spans and waiting kernels kept (oldest dropped first)
_ORPHAN_ROUNDS = 4            # deliveries a kernel without its id waits for the id
FLUSH_FORCED = 1              # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
# CUPTI writes an EXTERNAL_CORRELATION record only beside an API activity record (the
# external id is attached to the driver/runtime call that launched the kernel): without
# DRIVER and RUNTIME enabled no kernel can be joined to the id pushed around its call
_KIND_NAMES = ("CONCURRENT_KERNEL", "EXTERNAL_CORRELATION", "DRIVER", "RUNTIME")
# the API records kept when they are narrowed to launches: every other driver/runtime call
# (context queries, allocations, event calls: ~5 a CuPy launch) then costs CUPTI no record
_LAUNCH_API = re.compile(r"cu(?:da)?(?:LaunchKernel|LaunchCooperativeKernel|LaunchGrid|"
                         r"GraphLaunch|Launch(?:_|$))")
_CBID_ENUMS = (("driver_api_trace_cbid", "Driver_api_trace_cbid", "activity_enable_driver_api"),
               ("runtime_api_trace_cbid", "Runtime_api_trace_cbid",
                "activity_enable_runtime_api"))


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
    """Collects kernel activity records in the background and joins them to the external
    ids pushed around launches.

    Args:
        cupti: the ``cupti.cupti`` bindings module (default: imported; tests pass a fake).
        buffer_bytes: size of each activity buffer handed to CUPTI. CUPTI hands a buffer
            back when it is full, or on a flush once every record in it is complete; on a
            busy stream the newest kernel is always in flight, so a smaller buffer is what
            bounds how late a record comes (1 MiB: a few thousand launches).
        narrow: keep API records of kernel launches only (see ``narrowed``).
        names: copy each kernel's name out of the buffer (for :meth:`harvest`'s records;
            the timers join by id and need none: the shared activity copies none, which
            saves building a string of a mangled name for every kernel launched).
        lib: how CUPTI's buffers reach us. None (default): for the real binding, callbacks
            registered with ctypes on the libcupti it loaded, a buffer copied out whole
            and parsed by the reader (:mod:`profilers.cupti_buffers`: cupti-python's own
            callbacks build a Python object a record, which cost a launch stream 54-86%
            on the H200, run S5; these 2%); False: cupti-python's callbacks; or a
            stand-in for libcupti (tests).

    ``status`` is "ok" or why CUPTI is unavailable; when it is not "ok" every method is a
    cheap no-op, so callers need no second code path. External ids come from one
    process-wide counter (``ids``), so the records of one user (a closed log, another
    device's timer) can never be joined to another's calls.

    Records of one launch may come in any order and in different buffers: a kernel
    whose external-correlation record has not come yet waits ``_ORPHAN_ROUNDS``
    deliveries for it; a call's kernels add to its span whenever they come
    (:meth:`collect`, :meth:`take_span`).

    Example:
        >>> act = CuptiActivity()
        >>> if act.status == "ok":
        ...     with act.tagged(("gemm", "cublas")): run_kernel()
        ...     act.flush(); act.harvest()  # [KernelRecord(...)]
    """

    def __init__(self, cupti=None, buffer_bytes: int = 1 << 20, narrow: bool = True,
                 names: bool = True, lib=None):
        self.buffer_bytes = buffer_bytes
        self._lib = lib
        self._buffers = None      # CtypesBuffers: CUPTI's buffers taken through ctypes
        self.narrow, self.names = narrow, names
        self.narrowed = False        # API records limited to launches (1 id record a launch)
        self._cupti = None
        self._raw: collections.deque = collections.deque()
        self._tags: dict[int, object] = {}
        self._external: dict[int, int] = {}       # CUPTI correlation id -> our id
        self.ids = itertools.count(1)             # external ids, process-wide
        self._lock = threading.Lock()
        self._kinds = None
        self.users = 0                            # timers reading spans (see CuptiTimer)
        # joined state (collect): spans of our ids, kernels whose id has not come yet
        self._spans: dict[int, list] = {}         # id -> [first start, last end, kernels]
        self._launches: dict[int, int] = {}       # id -> its API calls seen (id records)
        self._touched: dict[int, float] = {}      # id -> when its last record came
        self._now = 0.0
        self._orphans: collections.deque = collections.deque()   # per delivery: corr -> k
        self.newest_id = 0                        # the highest id an id record came for
        # what CUPTI delivered (read them to tell "no kernels" from "no ids" on a device)
        self.counts = {"buffers": 0, "kernels": 0, "external": 0, "other": 0,
                       "incomplete": 0, "unmatched": 0}
        self.error: str | None = None       # the first exception in the buffer callback
        # CPU time spent in the buffer callback on CUPTI's own thread (taken from the
        # serving thread through the GIL; the counter log's governor counts it as its
        # cost); a callback inside a flush runs on the flushing thread, whose own CPU time
        # already holds it, so it is left out here
        self._callback_cpu_s = 0.0
        self.flushes, self.flush_s, self.flush_cpu_s = 0, 0.0, 0.0   # what flushing cost
        self._flushing: int | None = None         # the thread inside a flush, if any
        self.idle_users = 0                 # users that let recording pause (see idle())
        self._idle_lock = threading.Lock()
        self._detach_lock = threading.Lock()
        self._detacher = None               # the subscriber that detaches CUPTI (detach())
        self.status = self._open(cupti)

    def _enabled_kinds(self, cupti) -> list:
        return [getattr(cupti.ActivityKind, name) for name in _KIND_NAMES]

    def _enable(self, cupti) -> None:
        for kind in self._enabled_kinds(cupti):
            cupti.activity_enable(kind)
        if self.narrow:
            self.narrowed = self._select_api(cupti, launches_only=True)

    def _select_api(self, cupti, launches_only: bool) -> bool:
        """Enable API records of launches only (``launches_only``) or of every call; True
        when every launch call is known to be on and every other call off (then one id
        record comes per launch, which is what a call's kernel count is checked against)."""
        found, exact = False, True
        for lower, upper, setter in _CBID_ENUMS:
            cbids, enable = getattr(cupti, lower, None) or getattr(cupti, upper, None), \
                getattr(cupti, setter, None)
            if cbids is None or enable is None:
                return False
            for name, member in cbids.__members__.items():
                if name in ("INVALID", "SIZE", "FORCE_INT"):
                    continue
                launch = _LAUNCH_API.search(name) is not None
                try:
                    enable(int(member), 1 if launch or not launches_only else 0)
                except Exception as exc:  # noqa: BLE001
                    if launch and launches_only:  # a launch left without its id record
                        log.info("CUPTI: cannot narrow API records (%s: %s); keeping all",
                                 name, exc)
                        self._select_api(cupti, launches_only=False)
                        return False
                    exact = False                 # a call left on: ids are not launches
                found = found or launch
        return found and exact and launches_only

    def widen(self) -> None:
        """Record every API call again (a launch path the narrowing missed)."""
        if self._cupti is not None and self.narrowed:
            self.narrowed = False
            self.narrow = False
            self._select_api(self._cupti, launches_only=False)

    def _open(self, cupti) -> str:
        try:
            real = cupti is None or getattr(cupti, "__name__", "") == "cupti.cupti"
            if cupti is None:
                from cupti import cupti
            self._cupti, self._kinds = cupti, cupti.ActivityKind
            self._buffers = self._ctypes_buffers(cupti, real)
            if self._buffers is None:
                cupti.activity_register_callbacks(self._buffer_requested,
                                                  self._buffer_completed)
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

    def _ctypes_buffers(self, cupti, real: bool):
        """CUPTI's buffer callbacks registered through ctypes on libcupti (see
        :mod:`profilers.cupti_buffers`), or None: the binding's callbacks (``lib=False``,
        a fake CUPTI without ``lib``, or no libcupti found mapped)."""
        if self._lib is False or (self._lib is None and not real):
            return None
        from profilers.cupti_buffers import CtypesBuffers, Layout, loaded_cupti_path
        lib = self._lib
        if lib is None:
            import ctypes
            cupti.get_timestamp()             # the binding loads libcupti on first use
            path = loaded_cupti_path()
            if path is None:
                log.warning("CUPTI: libcupti is not mapped in this process; buffers go "
                            "through cupti-python's callbacks, which cost a launch far "
                            "more (a Python object a record)")
                return None
            lib = ctypes.CDLL(path)
        return CtypesBuffers(lib, Layout.from_binding(cupti), self.buffer_bytes,
                             flushing=lambda: threading.get_ident() == self._flushing)

    @property
    def callback_cpu_s(self) -> float:
        """CPU seconds in the buffer callbacks on CUPTI's own threads."""
        b = self._buffers
        return self._callback_cpu_s + (b.callback_cpu_s if b is not None else 0.0)

    def _drain(self) -> None:
        """Parse the buffers copied out through ctypes into ``_raw`` (under ``_lock``)."""
        b = self._buffers
        if b is None or not b.done:
            return
        deliveries, other = b.drain(self.names)
        self._raw.extend(deliveries)
        self.counts["buffers"] = b.buffers
        self.counts["other"] += other

    # ---- CUPTI's threads ---------------------------------------------------------------
    def _buffer_requested(self):
        return self.buffer_bytes, 0

    def _buffer_completed(self, activities) -> None:
        # copy the fields out now: the records live in CUPTI's buffer, reused afterwards.
        # This runs on CUPTI's thread, where an exception is lost: keep the first one.
        t0 = thread_time()
        try:
            kinds, out, counts = self._kinds, [], self.counts
            external, kernel = kinds.EXTERNAL_CORRELATION, kinds.CONCURRENT_KERNEL
            other, names = 0, self.names
            append = out.append
            for a in activities:
                kind = a.kind
                if kind == external:
                    append((external, int(a.correlation_id), int(a.external_id)))
                elif kind == kernel:
                    append((kernel, int(a.correlation_id), str(a.name) if names else "",
                            int(a.start), int(a.end)))
                else:
                    other += 1
            counts["buffers"] += 1
            counts["other"] += other
            self._raw.append(out)
        except Exception as exc:  # noqa: BLE001 (CUPTI's thread: report, never raise)
            if self.error is None:
                self.error = (f"CUPTI buffer callback failed: {type(exc).__name__}: {exc}\n"
                              + traceback.format_exc())
                log.error("%s", self.error)
        finally:
            if threading.get_ident() != self._flushing:
                self._callback_cpu_s += thread_time() - t0

    # ---- caller's thread ---------------------------------------------------------------
    def push(self, tag: object) -> int:
        """Tag the kernels launched from this thread until :meth:`pop`; returns the id."""
        if self._cupti is None:
            return 0
        ext = next(self.ids)
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
    def flush(self, forced: bool = False) -> None:
        """Ask CUPTI to hand over every buffer whose records are complete now (it otherwise
        does so when one is full). ``forced``: every buffer, a kernel still in flight
        then comes incomplete and is counted, not timed (so only when nothing runs).
        Detached, nothing to flush (and calling CUPTI would attach it again)."""
        if self._cupti is not None and self.status != "detached":
            self._flush_all(self._cupti, FLUSH_FORCED if forced else 0)

    def _flush_all(self, cupti, flag: int) -> None:
        self._flushing = threading.get_ident()
        t0, c0 = perf_counter(), thread_time()
        try:
            cupti.activity_flush_all(flag)
        finally:
            self._flushing = None
            self.flushes += 1
            self.flush_s += perf_counter() - t0
            self.flush_cpu_s += thread_time() - c0

    def harvest(self) -> list[KernelRecord]:
        """Kernel records delivered so far, oldest first, with their tags (a standalone
        reader: do not mix it with :class:`CuptiTimer`, which joins the same records)."""
        kinds = self._kinds
        if kinds is None:
            return []
        kernels, out = [], []
        with self._lock:
            self._drain()
            while self._raw:
                for rec in self._raw.popleft():
                    if rec[0] == kinds.EXTERNAL_CORRELATION:
                        self._external[rec[1]] = rec[2]
                    else:
                        kernels.append(rec)
            for _, corr, name, start, end in kernels:
                ext = self._external.pop(corr, None)
                tag = self._tags.pop(ext, None) if ext is not None else None
                out.append(KernelRecord(name, start, end, tag))
        return out

    def collect(self, now: float = 0.0) -> None:
        """Join what CUPTI delivered since the last call (any thread; the timers' writer
        threads call it): each kernel adds to the span of the id its launch carried,
        whatever order and buffers the kernel and id records came in. ``now``: the
        caller's clock, kept per id as the time its last record came
        (:meth:`quiet_since`)."""
        kinds = self._kinds
        if kinds is None or not (self._raw or (self._buffers and self._buffers.done)):
            return
        with self._lock:
            self._drain()
            self._now = now
            raw, ids, kernels = self._raw, [], []
            external = kinds.EXTERNAL_CORRELATION
            while raw:
                for rec in raw.popleft():
                    (ids if rec[0] == external else kernels).append(rec)
            counts, ext_of, launches = self.counts, self._external, self._launches
            counts["external"] += len(ids)
            counts["kernels"] += len(kernels)
            newest = self.newest_id
            touched = self._touched
            for _, corr, ext in ids:
                ext_of[corr] = ext
                launches[ext] = launches.get(ext, 0) + 1
                touched[ext] = now
                newest = max(newest, ext)
            self.newest_id = newest
            add = self._add
            if ids and self._orphans:                 # kernels that came before their id
                for _, corr, ext in ids:
                    for waiting in self._orphans:
                        k = waiting.pop(corr, None)
                        if k is not None:
                            add(ext, k[0], k[1])
                            break
            orphans = {}
            get = ext_of.get
            for _, corr, _, start, end in kernels:
                ext = get(corr)
                if ext is None:
                    if len(orphans) < _MAX_OPEN_TAGS:
                        orphans[corr] = (start, end)
                    else:
                        counts["unmatched"] += 1
                else:
                    add(ext, start, end)
            if ids or kernels:                        # one delivery: the oldest ages out
                self._orphans.append(orphans)
                while len(self._orphans) > _ORPHAN_ROUNDS:
                    counts["unmatched"] += len(self._orphans.popleft())
            for table in (ext_of, launches, self._spans, touched):
                if len(table) > _MAX_OPEN_TAGS:       # ids whose calls are gone
                    for key in list(itertools.islice(table, len(table) - _MAX_OPEN_TAGS)):
                        del table[key]

    def _add(self, ext: int, start: int, end: int) -> None:
        self._touched[ext] = self._now
        if end <= 0 or end < start:                   # delivered before CUPTI completed it
            self.counts["incomplete"] += 1
            start = end = -1
        span = self._spans.get(ext)
        if span is None:
            self._spans[ext] = [start, end, 1]
        elif span[0] < 0 or start < 0:
            span[0] = span[1] = -1
            span[2] += 1
        else:
            span[0], span[1] = min(span[0], start), max(span[1], end)
            span[2] += 1

    def span_of(self, ext: int) -> list | None:
        """``[first start ns, last end ns, kernels]`` of id ``ext`` so far (-1s: a kernel
        came incomplete), None before its first kernel."""
        return self._spans.get(ext)

    def quiet_since(self, ext: int, default: float) -> float:
        """When the last record of id ``ext`` came (``default``: none yet)."""
        return self._touched.get(ext, default)

    def launches_of(self, ext: int) -> int:
        """API calls CUPTI recorded under id ``ext`` so far (launches, when ``narrowed``)."""
        return self._launches.get(ext, 0)

    def take(self, ext: int) -> list | None:
        """Forget id ``ext`` (its call is written or dropped); returns its span."""
        with self._lock:
            self._launches.pop(ext, None)
            self._touched.pop(ext, None)
            return self._spans.pop(ext, None)

    def waiting_kernels(self) -> int:
        """Kernels delivered whose id has not come (yet)."""
        return sum(len(w) for w in self._orphans)

    def pause(self) -> None:
        """Stop recording kernels (flushing what was recorded); :meth:`resume` restarts.
        The callbacks stay registered: a process registers them once."""
        cupti = self._cupti
        if cupti is None or self.status != "ok":
            return
        try:
            self._flush_all(cupti, FLUSH_FORCED)
            self._disable(cupti)
        except Exception as exc:  # noqa: BLE001
            log.warning("pausing CUPTI activity: %s", exc)
        self.status = "paused"

    def idle(self, idle: bool) -> None:
        """A user lets recording stop (``idle``) or needs it again. CUPTI is detached
        (:meth:`detach`) when every user is idle and attached again when one is not (a
        counter log whose CUPTI hands over idles once each of its tagged calls has its
        kernels, since stopping forces a flush: what is in flight then comes incomplete)."""
        with self._idle_lock:
            self.idle_users += 1 if idle else -1
            if idle and self.idle_users >= self.users:
                self.detach()
            elif not idle:
                self.resume()

    def detach(self) -> None:
        """:meth:`pause`, then take CUPTI out of the process (``cuptiFinalize``). Attached
        but recording nothing, CUPTI still costs every launch: sampled event pairs cost a
        host-bound stream 19% of its launches in a process where CUPTI had been on and
        5.5% in one where it never was (runs S6, S7), and the counter log's handover from
        CUPTI to event pairs kept that cost.

        ``cuptiFinalize`` races with threads inside CUPTI (a serving thread launching) when
        called from anywhere else, so it is called where CUPTI says it is safe: at the exit
        of a CUDA API call, from a callback subscribed here for the next call that exits
        (status "detaching" until then, "detached" after). Without the binding's
        ``subscribe``/``finalize``, or when CUPTI refuses (another tool's subscriber),
        CUPTI stays attached, paused (said once). :meth:`resume` attaches again."""
        self.pause()
        cupti = self._cupti
        if cupti is None or self.status != "paused" or not all(
                hasattr(cupti, name) for name in ("subscribe", "enable_domain", "finalize")):
            return
        exit_site = int(cupti.ApiCallbackSite.API_EXIT)

        def at_exit(userdata, domain, cbid, data) -> None:
            with self._detach_lock:
                if self.status != "detaching" or data.callback_site != exit_site:
                    return
                try:
                    cupti.finalize()          # also drops this subscriber
                except Exception as exc:  # noqa: BLE001 (paused is the fallback)
                    self.status = "paused"
                    self._detach_failed(exc)
                    return
                self.status = "detached"
        with self._detach_lock:
            try:
                self._detacher = cupti.subscribe(at_exit, None)
                for domain in ("DRIVER_API", "RUNTIME_API"):
                    cupti.enable_domain(1, self._detacher, int(getattr(cupti.CallbackDomain,
                                                                       domain)))
            except Exception as exc:  # noqa: BLE001
                self._unsubscribe_detacher(cupti)
                self._detach_failed(exc)
                return
            self.status = "detaching"

    def _detach_failed(self, exc: BaseException) -> None:
        log.warning("CUPTI: could not detach from the process (%s: %s); it stays attached "
                    "with recording off", type(exc).__name__, exc)

    def _unsubscribe_detacher(self, cupti) -> None:
        if self._detacher is not None:
            try:
                cupti.unsubscribe(self._detacher)
            except Exception:  # noqa: BLE001 (finalize may have dropped it already)
                pass
            self._detacher = None

    def _disable(self, cupti) -> None:
        for kind in self._enabled_kinds(cupti):
            cupti.activity_disable(kind)

    def resume(self) -> None:
        """Record kernels again after :meth:`pause` (or :meth:`detach`: CUPTI attached
        again, the buffer callbacks registered anew)."""
        cupti = self._cupti
        with self._detach_lock:
            if cupti is not None and self.status == "detaching":   # not yet: stay attached
                self._unsubscribe_detacher(cupti)
                self.status = "paused"
        if cupti is not None and self.status == "detached":
            self._detacher = None
            with self._lock:
                self._drain()
            self.status = self._open(cupti)
            return
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
        if self.status == "detached":        # nothing recorded, nothing to flush
            self.status = "closed"
            return
        with self._detach_lock:
            self._unsubscribe_detacher(cupti)
        try:
            cupti.activity_flush_all(FLUSH_FORCED)
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
            _shared.names = False                   # its timers join by id: no names
        elif _shared.status in ("paused", "detaching", "detached"):
            _shared.resume()
        return _shared


class CuptiTimer:
    """Times tagged calls by the kernels they issued, from CUPTI activity records.

    The counter log's CUPTI timing source, shaped for a hot caller like
    :class:`~profilers.events.EventTimer`: ``ids`` (next id), ``push_id(id)`` and
    ``pop_id()`` around a call (C calls, no Python frame), ``append_pending((id, ...))``
    after it (a deque's append), ``pending_calls`` (bounded by ``capacity`` by the
    caller). :meth:`harvest_entries` (writer thread) flushes CUPTI, joins what came and
    gives ``(entry, time_ms)`` per finished call: the span from its first kernel's start
    to its last kernel's end on the GPU clock (the GPU time of the kernels it issued,
    without the launch latency before the first kernel that an event pair also reads).

    A call is finished when a kernel has come for every launch it made (``narrowed``
    activity: one id record a launch; else its first kernel) and either an id record of a
    later call has come, or no record of it came for ``settle_s``, or the activity is
    paused (pausing forces every buffer out: all its records are in). A call still without
    all its kernels is dropped and counted only ``lost_after_s`` after the writer first
    saw it, or at the final harvest, which forces CUPTI to hand over every buffer first:
    CUPTI keeps a buffer until it is full or all its records are complete, so on a busy
    stream a record can come a second late, and the records of one launch come in any
    order, in any buffers.

    ``status`` is "ok" or why CUPTI cannot be used (then callers use events).
    """

    kind = "cupti"

    def __init__(self, capacity: int = 4096, activity: CuptiActivity | None = None,
                 settle_s: float = 0.5, clock=None, lost_after_s: float = 5.0,
                 flush_every_s: float = 0.25):
        import time
        global _shared_users
        # CUPTI's flush costs the flushing thread milliseconds of CPU (run S6: a writer
        # flushing every 50 ms spent 33% of wall time); a busy stream fills a buffer in
        # a fraction of a second anyway, so a harvest flushes at most this often
        self.flush_every_s = flush_every_s
        self._flushed_s = -math.inf
        self._shared = activity is None
        self.activity = activity if activity is not None else shared_activity()
        if self._shared:
            with _shared_lock:
                _shared_users += 1
        self.activity.users += 1
        self.status = self.activity.status
        self.capacity, self.settle_s, self.lost_after_s = capacity, settle_s, lost_after_s
        self._clock = clock or time.monotonic
        self.ids = self.activity.ids                 # one process-wide sequence of ids
        self.pending_calls: collections.deque = collections.deque()   # caller -> writer
        self.append_pending = self.pending_calls.append
        self._waiting: collections.deque = collections.deque()   # [first seen s, entry]
        self.dropped = 0
        self.incomplete = 0                          # calls whose kernels came unfinished
        self.problem: str | None = None            # why calls were dropped (the first time)
        self.recording = True                      # False: idle (see set_recording)
        self._lock = threading.Lock()
        self._closed = False
        cupti, kind = self.activity._cupti, getattr(self.activity, "_kind", None)
        if cupti is not None:
            self.push_id = functools.partial(cupti.activity_push_external_correlation_id,
                                             kind)
            self.pop_id = functools.partial(cupti.activity_pop_external_correlation_id, kind)
        else:
            self.push_id = _ignore
            self.pop_id = _nothing
        self.current_stream = _null_stream

    def use_cupy_streams(self) -> CuptiTimer:
        """Report CuPy's current stream as the launch's stream (the cuda backend's)."""
        import cupy
        self.current_stream = cupy.cuda.get_current_stream
        return self

    def harvest_entries(self, limit: int | None = None,
                        final: bool = False) -> list[tuple[tuple, float]]:
        """``(entry, time_ms)`` of finished calls, oldest first. ``final`` (the log is
        closing, its caller done): force CUPTI's buffers out first (unless another timer
        still shares the subscription) and finish or drop every call."""
        with self._lock:
            activity = self.activity
            now = self._clock()
            if final or now - self._flushed_s >= self.flush_every_s:
                activity.flush(forced=final and activity.users <= 1)
                self._flushed_s = now
            activity.collect(now)
            waiting = self._waiting
            pending = self.pending_calls
            while pending:
                waiting.append((now, pending.popleft()))
            while len(waiting) > self.capacity:       # the writer fell far behind
                _, entry = waiting.popleft()
                activity.take(entry[0])
                self._lose(entry[0], "the writer fell behind")
            out, keep = [], []
            narrowed, newest = activity.narrowed, activity.newest_id
            # paused (a log handing over, once no call of it was unsettled): the pause's
            # forced flush handed over every record, so a call is finished or never will be
            paused = activity.status in ("paused", "detaching", "detached")
            for seen_s, entry in waiting:
                ext = entry[0]
                span = activity.span_of(ext)
                age = now - seen_s
                # finished: a kernel for every launch it made (narrowed: one id record a
                # launch; else: one kernel will do), and no record of it for settle_s or
                # a later id came (its own id records are then in)
                launches = activity.launches_of(ext)
                complete = span is not None and (span[2] >= launches if narrowed else True)
                if complete and (final or paused or (narrowed and ext < newest) or
                                 now - activity.quiet_since(ext, seen_s) > self.settle_s):
                    activity.take(ext)
                    if span[0] < 0:
                        self.incomplete += 1
                        self._lose(ext, "a kernel of it came incomplete (a forced flush "
                                        "while it ran)")
                    else:
                        out.append((entry, (span[1] - span[0]) / 1e6))
                elif final or paused or age > self.lost_after_s:
                    activity.take(ext)
                    got = (f"{span[2]} of its {launches} kernels came" if span is not None
                           else "no kernel record came")
                    self._lose(ext, f"{got} in {age:.1f} s"
                               + (", and a forced flush" if final or paused else ""),
                               no_id=launches == 0)
                else:
                    keep.append((seen_s, entry))
            waiting.clear()
            waiting.extend(keep)
        return out

    def _lose(self, ext: int, why: str, no_id: bool = False) -> None:
        """Count call ``ext`` lost. ``no_id``: no id record came for it, so its launch
        call may be one the narrowing to launch calls left out; with kernels waiting for
        their id, the API records are widened to every call (untagged calls' kernels
        wait for ids that never come too, so a call lost another way never widens:
        every API record costs the process more than a launch's own)."""
        self.dropped += 1
        a = self.activity
        widened = False
        if no_id and a.narrowed and a.waiting_kernels():
            a.widen()
            widened = True
        if self.problem is not None:
            return
        counts = a.counts
        api = ("narrowed to launches (now widened to every call)" if widened else
               "narrowed to launches" if a.narrowed else "all")
        self.problem = (
            f"CUPTI timing: call {ext} dropped: {why} (CUPTI delivered {counts['buffers']} "
            f"buffers, {counts['kernels']} kernel records, {counts['external']} "
            f"external-correlation records, {counts['other']} others, "
            f"{counts['incomplete']} incomplete; {a.waiting_kernels()} kernels wait for "
            f"their id, {counts['unmatched']} never got one; API records {api}"
            + (f"; {a.error.splitlines()[0]}" if a.error else "") + ")")
        log.warning("%s", self.problem)

    def unsettled(self) -> int:
        """Pending calls still missing a kernel of a launch whose id record came (or any
        kernel); the rest wait only for :meth:`harvest_entries`' settling. Read after a
        harvest: calls queued since count as unsettled."""
        with self._lock:
            a, n = self.activity, len(self.pending_calls)
            for _, entry in self._waiting:
                span = a.span_of(entry[0])
                if span is None or (a.narrowed and span[2] < a.launches_of(entry[0])):
                    n += 1
        return n

    def set_recording(self, on: bool) -> None:
        """Let the shared activity pause (``on`` False: call only once no tagged call of
        this timer is pending) or make it record again."""
        if on != self.recording and not self._closed:
            self.recording = on
            self.activity.idle(not on)

    @property
    def pending(self) -> int:
        return len(self.pending_calls) + len(self._waiting)

    def discard_pending(self) -> int:
        with self._lock:
            n = self.pending
            for _, entry in self._waiting:
                self.activity.take(entry[0])
            self._waiting.clear()
            self.pending_calls.clear()
        return n

    def close(self) -> None:
        """Forget pending calls; the last user of the shared subscription pauses CUPTI (so
        kernels are no longer recorded once no log needs them)."""
        global _shared_users
        self.discard_pending()
        if self._closed:
            return
        self._closed = True
        if not self.recording:                     # idle: no longer a user at all
            self.recording = True
            with self.activity._idle_lock:
                self.activity.idle_users -= 1
        self.activity.users -= 1
        if self._shared:
            self._shared = False
            with _shared_lock:
                _shared_users -= 1
                last = _shared_users == 0
            if last:
                self.activity.pause()


def _ignore(ext: int) -> None:
    return None


def _nothing() -> None:
    return None


class _NullStream:
    ptr = 0


def _null_stream() -> _NullStream:
    return _NullStream
