"""Counter-logging mode: a msgpack stream of launch records, its writer and its reader.

Each logged launch becomes one record: wall time, op, dims and features, variant and
config, the time it took (CUDA events harvested later on the cuda backend, a wall-clock
pair on the host), and the NVML/GPM snapshot nearest before it. The launch only records
a pre-created event pair (two raw ``cudaEventRecord`` calls on its stream) and appends
one small tuple, or on the host appends one tuple to a bounded queue; a writer thread
times the pairs (``cudaEventElapsedTime``, no synchronisation), builds the records from
per-plan fields made once, attaches the snapshot, packs and writes. When the queue or
the event ring is full, records are dropped and counted; a call is never delayed.

On disk: frames ``[crc32(payload), payload]`` where ``payload`` is a packed map; the
first frame is a header (``format``, ``version``), each later one a batch of up to
``BATCH_ROWS`` records written together (per-plan fields once per file, then compact rows;
see ``ROW_FIELDS``). :func:`read_log` gives back one dict per record. Files rotate by size: ``log`` →
``log.1`` → ``log.2`` …; a new log moves an existing file aside the same way. The reader
tolerates a truncated last frame (a killed process loses at most its last batch) and
names the byte offset of any corrupt one.

    >>> with adaptive.counter_log("/tmp/run.alog", sample_every=1):
    ...     serve()
    >>> rows = adaptive.counterlog.to_observations(adaptive.counterlog.read_log("/tmp/run.alog"))
"""

from __future__ import annotations

import atexit
import bisect
import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import operator
import os
import platform
import threading
import time
import weakref
import zlib
from collections.abc import Iterator, Sequence

import msgpack

from adaptive import config, dispatch
from adaptive.errors import AdaptiveError
from adaptive.observation import Observation, floor_ms

log = logging.getLogger("adaptive.counterlog")

FORMAT = "adaptive-counter-log"
VERSION = 1
_HEADER_KEYS = ("format", "version")
# a batch frame holds up to BATCH_ROWS records as rows of these fields; "plan" indexes the
# batch's or an earlier batch's "plans" (per file), "state" its "states" (-1: none)
ROW_FIELDS = ("seq", "plan", "time_s", "time_ms", "timer", "state")
BATCH_ROWS = 1024


class CounterLogError(AdaptiveError, ValueError):
    """A counter log that cannot be read: not one, a newer version, or corrupt."""


# ---- recorders: the per-launch hook -----------------------------------------------------------

def _run_plan(plan, args, out):
    return plan.run(args, out)


class Recorder:
    """Base of per-dispatcher launch hooks; chained through ``inner`` so several coexist.

    ``_next(plan, args, out)`` runs the rest of the chain; ``_direct`` is True when this
    recorder is the last one (it may then call ``plan.run`` itself, one frame less)."""

    def __init__(self):
        self._next = _run_plan
        self._direct = True

    @property
    def inner(self):
        return None if self._next is _run_plan else self._next

    @inner.setter
    def inner(self, recorder) -> None:
        self._next = _run_plan if recorder is None else recorder
        self._direct = recorder is None


def install_recorder(d: dispatch.Dispatcher, recorder: Recorder) -> None:
    """Put ``recorder`` in front of ``d``'s recorder chain."""
    recorder.inner = d.recorder
    d.recorder = recorder


def remove_recorder(d: dispatch.Dispatcher, recorder: Recorder) -> None:
    """Take ``recorder`` out of ``d``'s chain (wherever it is)."""
    if d.recorder is recorder:
        d.recorder = recorder.inner
        return
    r = d.recorder
    while isinstance(r, Recorder):
        if r.inner is recorder:
            r.inner = recorder.inner
            return
        r = r.inner


_now = time.time
_perf_ns = time.perf_counter_ns


class _LogRecorder(Recorder):
    """Times every ``every``-th launch of one dispatcher into a :class:`CounterLog`.

    This class times host launches (the call is synchronous: a perf-counter pair);
    with an event ``timer`` it is an :class:`_EventLogRecorder`. Either way the caller's
    thread only takes a time and appends one tuple; the writer thread builds the record
    (the per-plan fields once per plan, the device snapshot, the packing)."""

    def __new__(cls, owner: CounterLog, d: dispatch.Dispatcher, timer):
        if cls is _LogRecorder and timer is not None:
            cls = _EventLogRecorder
        return super().__new__(cls)

    def __init__(self, owner: CounterLog, d: dispatch.Dispatcher, timer):
        super().__init__()
        self.owner, self.every, self.timer = owner, owner.sample_every, timer
        self.backend = d.backend
        self.index = _cuda_index(d.backend)        # the sampler to read (None: host)
        self._count = itertools.count(1)
        self.static: dict = {}                      # plan -> its fixed record fields
        self.peaks = _peaks(d.backend)
        self._queue, self._queue_size = owner._queue, owner.queue_size

    def __call__(self, plan, args, out):
        if self.every != 1 and next(self._count) % self.every:
            return self._next(plan, args, out)
        t0 = _perf_ns()
        result = plan.run(args, out) if self._direct else self._next(plan, args, out)
        t1 = _perf_ns()
        queue = self._queue
        if len(queue) < self._queue_size:
            queue.append((self, _now(), plan, (t1 - t0) / 1e6, "host"))
        else:
            self.owner._queue_dropped += 1
        return result

    def sampled(self, plan, time_ms: float) -> None:
        """Listener for the dispatcher's sampled (synchronised) launches."""
        if self.every == 1 or next(self._count) % self.every == 0:
            self.owner.submit((self, _now(), plan, time_ms, "sync"))


class _EventLogRecorder(_LogRecorder):
    """The cuda recorder: a pre-created event pair from the timer's ring recorded around
    the launch with the raw runtime call on the launch's stream, and one tuple
    ``(slot, time_s, plan, recorder)`` appended to the ring's pending queue. A full ring
    drops the record (counted), never the call."""

    def __init__(self, owner: CounterLog, d: dispatch.Dispatcher, timer):
        super().__init__(owner, d, timer)
        self._ticket, self._capacity, self._busy = timer.ticket, timer.capacity, timer.busy
        self._starts, self._ends, self._record = timer.starts, timer.ends, timer.record
        self._append, self._stream = timer.append_pending, timer.current_stream
        self._torch_stream = None

    def __call__(self, plan, args, out):
        if self.every != 1 and next(self._count) % self.every:
            return self._next(plan, args, out)
        slot = next(self._ticket) % self._capacity
        busy = self._busy
        if busy[slot]:                              # still pending: drop the record
            self.timer.dropped += 1
            return self._next(plan, args, out)
        busy[slot] = True
        # the launch's stream: CuPy's current one, or PyTorch's for tensors
        stream = (self._stream() if plan.problem.kind != "torch" else
                  self._torch()).ptr
        record = self._record
        record(self._starts[slot], stream)
        try:
            result = plan.run(args, out) if self._direct else self._next(plan, args, out)
        except BaseException:
            busy[slot] = False
            raise
        record(self._ends[slot], stream)
        self._append((slot, _now(), plan, self))
        return result

    def _torch(self):
        if self._torch_stream is None:
            from adaptive.backends.cuda import torch_stream
            self._torch_stream = torch_stream
        return self._torch_stream()


def _peaks(backend) -> dict | None:
    try:
        return backend.peaks()
    except Exception as exc:  # noqa: BLE001 (no floor then; the log still works)
        log.warning("no roofline peaks for %s (%s); records carry no floor_ms", backend.name, exc)
        return None


def _cuda_index(backend) -> int | None:
    index = getattr(backend, "index", None)
    if index is None and str(backend.device).startswith("cuda:"):
        index = int(str(backend.device).split(":")[1])
    return index


# ---- the log ----------------------------------------------------------------------------------

@dataclasses.dataclass
class LogStats:
    """Counts of one counter log (read them any time; ``dropped`` includes full event rings)."""

    written: int = 0
    dropped: int = 0
    rotations: int = 0
    bytes_written: int = 0


class CounterLog:
    """Writes launch records of the dispatchers it is attached to; see :func:`counter_log`."""

    def __init__(self, path: str | os.PathLike, sample_every: int = 1,
                 max_bytes: int = 64 << 20, backups: int = 3, queue_size: int = 65536,
                 flush_interval_s: float = 0.05, nvml: bool = True, event_capacity: int = 4096):
        if not isinstance(sample_every, int) or sample_every < 1:
            raise ValueError(f"sample_every must be an integer >= 1 (1: every launch), "
                             f"got {sample_every!r}")
        if max_bytes < 4096:
            raise ValueError(f"max_bytes must be at least 4096, got {max_bytes}")
        if backups < 0 or queue_size < 1 or not flush_interval_s > 0:
            raise ValueError("backups must be >= 0, queue_size >= 1 and flush_interval_s > 0; "
                             f"got {backups}, {queue_size}, {flush_interval_s}")
        self.path = os.fspath(path)
        self.sample_every, self.max_bytes, self.backups = sample_every, max_bytes, backups
        self.queue_size, self.flush_interval_s = queue_size, flush_interval_s
        self.nvml, self.event_capacity = nvml, event_capacity
        self.stats = LogStats()
        self._queue: collections.deque = collections.deque()
        self._queue_dropped = 0
        self._recorders = weakref.WeakKeyDictionary()   # dispatcher -> its recorder
        self._timers: dict[int, object] = {}        # cuda index -> EventTimer
        self.samplers: dict[int, object] = {}       # cuda index -> NvmlSampler
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._file = None
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._file_bytes = 0
        self._plan_ids: dict = {}
        self._pack = msgpack.Packer(use_bin_type=True).pack    # the writer thread's own

    # ---- hot path (caller's thread) ----------------------------------------------------
    def submit(self, item: tuple) -> None:
        """Queue one record for the writer; drop and count it when the queue is full."""
        if len(self._queue) < self.queue_size:
            self._queue.append(item)
        else:
            self._queue_dropped += 1

    # ---- attaching ---------------------------------------------------------------------
    def attach(self, d: dispatch.Dispatcher) -> None:
        """Log launches of dispatcher ``d`` (idempotent)."""
        with self._lock:
            if d in self._recorders:
                return
            timer = None
            if d.backend.name == "cuda":
                index = _cuda_index(d.backend)
                timer = self._timers.get(index)
                if timer is None:
                    from profilers.events import EventTimer
                    timer = self._timers[index] = EventTimer(self.event_capacity, index)
                if self.nvml and index not in self.samplers:
                    from profilers.nvml import NvmlSampler, nvml_device
                    self.samplers[index] = NvmlSampler(nvml_device(index)).start()
            rec = _LogRecorder(self, d, timer)
            self._recorders[d] = rec
        install_recorder(d, rec)
        d.listeners.append(rec.sampled)

    def detach(self, d: dispatch.Dispatcher) -> None:
        """Stop logging ``d``'s launches (records already taken are still written)."""
        with self._lock:
            rec = self._recorders.pop(d, None)
        if rec is not None:
            remove_recorder(d, rec)
            with contextlib.suppress(ValueError):
                d.listeners.remove(rec.sampled)

    # ---- lifecycle ---------------------------------------------------------------------
    def open(self) -> CounterLog:
        """Create the file (moving an existing one aside) and start the writer thread."""
        if self._thread is not None:
            return self
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            self._shift()
        self._start_file()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="adaptive-counterlog",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self, wait_gpu_s: float = 2.0) -> LogStats:
        """Detach everywhere, write what was taken (waiting up to ``wait_gpu_s`` for GPU
        timings still in flight) and close the file. Returns the final counts."""
        for d in list(self._recorders.keys()):
            self.detach(d)
        thread, self._thread = self._thread, None
        if thread is None:
            return self.stats
        deadline = time.monotonic() + wait_gpu_s
        while any(t.pending for t in self._timers.values()) and time.monotonic() < deadline:
            time.sleep(0.005)
        self._closing = True
        self._wake.set()
        thread.join()
        for sampler in self.samplers.values():
            sampler.stop()
        for timer in self._timers.values():
            self._queue_dropped += timer.discard_pending() + timer.dropped   # unfinished too
            timer.close()
        self._timers.clear()                        # a reopened log makes fresh rings
        self.stats.dropped = self._queue_dropped
        self._file.close()
        self._file = None
        return self.stats

    def __enter__(self) -> CounterLog:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- writer thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            closing = self._closing
            try:
                self._drain()
            except Exception:  # noqa: BLE001 (the writer never takes the process down)
                log.exception("counter log %s: writing failed; records dropped", self.path)
            if closing:
                return
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()

    def _drain(self) -> None:
        queue = self._queue
        items = []
        while queue:
            items.append(queue.popleft())
        for timer in list(self._timers.values()):
            items += [(rec, time_s, plan, time_ms, "cuda_event")
                      for (_, time_s, plan, rec), time_ms in timer.harvest_entries()]
        if items:
            items.sort(key=_time_of)                # mostly in order already: a linear pass
            for i in range(0, len(items), BATCH_ROWS):
                self._write_batch(items[i:i + BATCH_ROWS])
            self._file.flush()
        self.stats.dropped = self._queue_dropped + sum(t.dropped for t in self._timers.values())

    def _write_batch(self, items: list[tuple]) -> None:
        """One frame: the plans and device states first seen in this file, then one row per
        record (see ROW_FIELDS); packed by one msgpack call."""
        plan_ids, plans, rows = self._plan_ids, [], []
        states, state_ids = [], {}
        sampled = bool(self.samplers)
        histories: dict = {}
        # the snapshot found last and the time window it serves ([lo, hi) on one device):
        # records come in time order, so most share it
        at_index, lo, hi, at_sid = None, math.inf, -math.inf, -1
        seq = self._seq
        for rec, time_s, plan, time_ms, timer in items:
            pid = plan_ids.get(plan)
            if pid is None:
                pid = plan_ids[plan] = len(plan_ids)
                plans.append([pid, self._static(rec, plan)])
            sid = -1
            if sampled and timer != "host":
                if rec.index == at_index and lo <= time_s < hi:
                    sid = at_sid
                else:
                    snap, lo, hi = self._snapshot(rec.index, time_s, histories)
                    at_index, at_sid = rec.index, -1
                    if snap is not None:
                        sid = state_ids.get(id(snap))
                        if sid is None:
                            sid = state_ids[id(snap)] = len(states)
                            states.append(snap.to_dict())
                        at_sid = sid
            seq += 1
            rows.append((seq, pid, time_s, time_ms, timer, sid))
        self._seq = seq
        payload = self._pack({"plans": plans, "states": states, "rows": rows})
        frame = b"\x92" + self._pack(zlib.crc32(payload)) + self._pack(payload)
        self._file.write(frame)
        self._file_bytes += len(frame)
        self.stats.written += len(rows)
        self.stats.bytes_written += len(frame)
        if self._file_bytes >= self.max_bytes:
            self._rotate()

    def _snapshot(self, index, time_s: float, histories: dict):
        """(the device snapshot nearest before ``time_s``, the window [lo, hi) of times it
        also serves); the history is read once per batch."""
        found = histories.get(index)
        if found is None:
            sampler = self.samplers.get(index)
            snaps = sampler.snapshots() if sampler is not None else []
            found = histories[index] = ([s.time_s for s in snaps], snaps)
        times, snaps = found
        if not snaps:
            return None, -math.inf, math.inf
        i = bisect.bisect_right(times, time_s) - 1
        if i < 0:                                   # before the first: the oldest one
            return snaps[0], -math.inf, times[0]
        return snaps[i], times[i], times[i + 1] if i + 1 < len(times) else math.inf

    def _static(self, rec: _LogRecorder, plan) -> dict:
        """The part of a record fixed per plan, built once."""
        static = rec.static.get(plan)
        if static is None:
            p, c = plan.problem, plan.candidate
            static = {"op": p.op, "dims": dict(p.dims), "dtype": p.dtype,
                      "params": {k: v for k, v in p.params
                                 if v is None or isinstance(v, (bool, int, float, str))},
                      "variant": c.variant.name, "config": c.config,
                      "backend": rec.backend.name, "device": str(rec.backend.device),
                      "flops": float(plan.flops), "bytes": float(plan.bytes)}
            if rec.peaks:
                with contextlib.suppress(Exception):
                    static["floor_ms"] = floor_ms(plan.flops, plan.bytes, rec.peaks, p.dtype)
            with contextlib.suppress(Exception):
                from adaptive.ops import get_op
                static["features"] = get_op(p.op).features(p)
            rec.static[plan] = static
        return static

    # ---- files -------------------------------------------------------------------------
    def _start_file(self) -> None:
        self._file = open(self.path, "wb")
        header = {"format": FORMAT, "version": VERSION, "created_s": time.time(),
                  "pid": os.getpid(), "host": platform.node(), "sample_every": self.sample_every}
        self._file_bytes = self._file.write(_frame(header))
        self._plan_ids = {}                         # plan -> id, per file (files stand alone)
        self.stats.bytes_written += self._file_bytes

    def _shift(self) -> None:
        """``path`` → ``path.1`` → … → ``path.{backups}``; the oldest falls off."""
        if self.backups == 0:
            os.remove(self.path)
            return
        for i in range(self.backups - 1, 0, -1):
            older = f"{self.path}.{i}"
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{i + 1}")
        os.replace(self.path, f"{self.path}.1")

    def _rotate(self) -> None:
        self._file.close()
        self._shift()
        self._start_file()
        self.stats.rotations += 1


_time_of = operator.itemgetter(1)


def _pack(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _frame(record: dict) -> bytes:
    payload = _pack(record)
    return b"\x92" + _pack(zlib.crc32(payload)) + _pack(payload)     # [crc32, payload]


# ---- the public context manager and the ADAPTIVE_COUNTER_LOG hook ---------------------------

_active: list[CounterLog] = []
_active_lock = threading.Lock()


@contextlib.contextmanager
def counter_log(path: str | os.PathLike, sample_every: int = 1, **options) -> Iterator[CounterLog]:
    """Log every (or every ``sample_every``-th) launch of every dispatcher to ``path``.

    Applies to dispatchers alive now and to those created inside the block. Records go
    to a msgpack stream written by a background thread; a launch never waits for it.

    Args:
        path: the log file; an existing one is moved to ``path.1`` (and so on).
        sample_every: log one launch in this many (per dispatcher).
        **options: ``max_bytes`` (rotation size, default 64 MiB), ``backups`` (rotated
            files kept, default 3), ``queue_size``, ``flush_interval_s``, ``nvml`` (sample
            NVML/GPM for cuda dispatchers, default True), ``event_capacity``.

    Yields:
        the :class:`CounterLog` (``.stats`` has written, dropped and rotation counts).

    Example:
        >>> with adaptive.counter_log("run.alog") as clog:
        ...     adaptive.launch("gemm", a, b)
        >>> clog.stats.written
        1
    """
    clog = CounterLog(path, sample_every, **options).open()
    with _active_lock:
        _active.append(clog)
    try:
        for d in dispatch.live_dispatchers():
            clog.attach(d)
        yield clog
    finally:
        global _closed_dropped
        stats = clog.close()
        with _active_lock:
            _active.remove(clog)
            _closed_dropped += stats.dropped


_closed_dropped = 0


def dropped_records_total() -> int:
    """Records dropped by every counter log of this process, open or closed."""
    with _active_lock:
        return _closed_dropped + sum(clog.stats.dropped for clog in _active)


def active_logs() -> list[CounterLog]:
    """Counter logs open now (metrics export their dropped counts)."""
    with _active_lock:
        return list(_active)


_configured: dict[str, CounterLog] = {}


def _on_new_dispatcher(d: dispatch.Dispatcher) -> None:
    with _active_lock:
        logs = list(_active)
    cfg = config.get()
    if cfg.counter_log:
        clog = _configured.get(cfg.counter_log)
        if clog is None:
            clog = _configured[cfg.counter_log] = CounterLog(
                cfg.counter_log, sample_every=max(cfg.counter_log_every, 1)).open()
            with _active_lock:
                _active.append(clog)
            atexit.register(close_configured)
        if clog not in logs:
            logs.append(clog)
    for clog in logs:
        clog.attach(d)


def close_configured() -> None:
    """Close the ``ADAPTIVE_COUNTER_LOG`` logs now (otherwise at interpreter exit)."""
    global _closed_dropped
    for path in list(_configured):
        clog = _configured.pop(path)
        stats = clog.close()
        with _active_lock:
            if clog in _active:
                _active.remove(clog)
            _closed_dropped += stats.dropped


dispatch.new_dispatcher_hooks.append(_on_new_dispatcher)


# ---- reading ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LogContents:
    """What :func:`read_log` found: records oldest first, the files read, and their headers."""

    records: tuple[dict, ...]
    files: tuple[str, ...]
    headers: tuple[dict, ...]
    truncated_bytes: int = 0     # an incomplete last frame (a killed writer), skipped


def read_file(path: str | os.PathLike) -> tuple[dict, list[dict], int]:
    """(header, records, truncated bytes) of one log file; raises CounterLogError if corrupt."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1 << 20))
    unpacker.feed(data)
    header, records, offset, plans = None, [], 0, {}
    while True:
        offset = unpacker.tell()
        try:
            frame = next(unpacker)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 (msgpack raises several kinds)
            raise _corrupt(path, offset, f"not msgpack ({type(exc).__name__}: {exc})",
                           len(records)) from None
        payload = _unframe(path, offset, frame, len(records))
        if header is None:
            header = _check_header(path, payload)
        else:
            records += _expand(path, offset, payload, plans, len(records))
    truncated = len(data) - offset
    if header is None and truncated == 0:
        raise CounterLogError(f"{path} is empty; expected an adaptive counter log "
                              "(write one with adaptive.counter_log)")
    if header is None:
        raise _corrupt(path, 0, "the header frame is incomplete", 0)
    if truncated:
        log.warning("%s: last record incomplete (%d bytes at offset %d, the writer was probably "
                    "killed); skipped it", path, truncated, offset)
    return header, records, truncated


def _unframe(path, offset, frame, n) -> dict:
    if not (isinstance(frame, list) and len(frame) == 2 and isinstance(frame[0], int)
            and isinstance(frame[1], bytes)):
        raise _corrupt(path, offset, f"expected a [crc32, payload] frame, got "
                       f"{type(frame).__name__}", n)
    crc, payload = frame
    if zlib.crc32(payload) != crc:
        raise _corrupt(path, offset, "checksum mismatch", n)
    try:
        record = msgpack.unpackb(payload, raw=False)
    except Exception as exc:  # noqa: BLE001
        raise _corrupt(path, offset, f"payload is not msgpack ({exc})", n) from None
    if not isinstance(record, dict):
        raise _corrupt(path, offset, f"payload is a {type(record).__name__}, not a map", n)
    return record


def _expand(path, offset, batch: dict, plans: dict, n: int) -> list[dict]:
    """The records of one batch frame; ``plans`` carries plan fields across frames."""
    try:
        for pid, static in batch["plans"]:
            plans[pid] = static
        states = batch["states"]
        out = []
        for seq, pid, time_s, time_ms, timer, sid in batch["rows"]:
            record = {"seq": seq, "time_s": time_s, **plans[pid], "time_ms": time_ms,
                      "timer": timer}
            if sid >= 0:
                record["device_state"] = states[sid]
            out.append(record)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise _corrupt(path, offset, f"malformed batch ({type(exc).__name__}: {exc})",
                       n) from None
    return out


def _corrupt(path, offset, why, n) -> CounterLogError:
    return CounterLogError(f"{path}: corrupt record at byte {offset}: {why}; the {n} records "
                           "before it are intact. The file was damaged or is not an adaptive "
                           "counter log; copy the intact prefix or delete the file")


def _check_header(path, header: dict) -> dict:
    if any(k not in header for k in _HEADER_KEYS) or header["format"] != FORMAT:
        raise CounterLogError(f"{path} is not an adaptive counter log: its first record has "
                              f"format={header.get('format')!r}, expected {FORMAT!r}")
    if header["version"] > VERSION:
        raise CounterLogError(f"{path} is counter-log version {header['version']}; this "
                              f"adaptive reads up to version {VERSION}: upgrade adaptive")
    return header


def log_files(path: str | os.PathLike) -> list[str]:
    """``path`` and its rotated predecessors, oldest first."""
    path = os.fspath(path)
    rotated = []
    i = 1
    while os.path.exists(f"{path}.{i}"):
        rotated.append(f"{path}.{i}")
        i += 1
    files = rotated[::-1] + ([path] if os.path.exists(path) else [])
    if not files:
        raise FileNotFoundError(f"no counter log at {path} (nor rotated {path}.1, ...)")
    return files


def read_log(path: str | os.PathLike, rotated: bool = True) -> LogContents:
    """Every record of a counter log (and, with ``rotated``, its rotated files), oldest first.

    A truncated last record in a file is skipped with a warning; corruption anywhere else
    raises :class:`CounterLogError` naming the file and byte offset.
    """
    files = log_files(path) if rotated else [os.fspath(path)]
    records, headers, truncated = [], [], 0
    for name in files:
        header, recs, cut = read_file(name)
        headers.append(header)
        records += recs
        truncated += cut
    return LogContents(tuple(records), tuple(files), tuple(headers), truncated)


def to_observations(records: Sequence[dict] | LogContents) -> list[Observation]:
    """Counter-log records as cost-model training rows (``source="log"``).

    Records without a finite time are skipped; device state goes to ``counters``.
    """
    if isinstance(records, LogContents):
        records = records.records
    rows = []
    for r in records:
        time_ms = r.get("time_ms")
        if not isinstance(time_ms, (int, float)) or not math.isfinite(time_ms) or time_ms <= 0:
            continue
        state = r.get("device_state") or {}
        rows.append(Observation(
            op=r["op"], dims=dict(r["dims"]), dtype=r["dtype"], variant=r["variant"],
            config=dict(r.get("config") or {}), time_ms=float(time_ms),
            floor_ms=float(r.get("floor_ms") or 0.0), features=dict(r.get("features") or {}),
            device={"backend": r.get("backend", ""), "device": r.get("device", ""),
                    "timer": r.get("timer", "")},
            counters={k: float(v) for k, v in state.items() if isinstance(v, (int, float))},
            timestamp_s=float(r.get("time_s", 0.0)), source="log"))
    return rows
