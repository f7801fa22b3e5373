"""Per-launch recorders: the hook a dispatcher calls on each logged (or counted) launch."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING

from adaptive import dispatch
from adaptive.dispatch import Recorder

if TYPE_CHECKING:
    from adaptive.counterlog.writer import CounterLog

log = logging.getLogger("adaptive.counterlog")


# ---- the counter log's per-dispatcher recorders ---------------------------------------------

_now = time.time
_perf_ns = time.perf_counter_ns
_thread_id = threading.get_ident
GATE_US = dispatch.HOLD_US   # the longest a logged call's stream is gated before its pair


class LogRecorder(Recorder):
    """Times every ``every``-th launch of one dispatcher into a :class:`CounterLog`.

    This class times host launches (the call is synchronous: a perf-counter pair);
    with an event ``timer`` it is an :class:`EventLogRecorder`, with a CUPTI ``timer``
    a :class:`CuptiLogRecorder`. Either way the caller's thread only takes a time and
    appends one tuple to a bounded queue; the writer thread builds the record (the
    per-plan fields once per plan, the device snapshot, the packing).

    ``every`` is the log's overhead governor's to change (the writer thread sets it; a
    CUPTI recorder keeps the configured one, and the governor replaces it by an event
    recorder when CUPTI's cost is over the budget); each record carries the interval read
    at the start of its call."""

    def __new__(cls, owner: CounterLog, d: dispatch.Dispatcher, timer):
        if cls is LogRecorder and timer is not None:
            cls = CuptiLogRecorder if getattr(timer, "kind", "") == "cupti" else EventLogRecorder
        return super().__new__(cls)

    def __init__(self, owner: CounterLog, d: dispatch.Dispatcher, timer):
        super().__init__()
        self.owner, self.every, self.timer = owner, owner.sample_every, timer
        self.backend = d.backend
        self.index = cuda_index(d.backend)        # the sampler to read (None: host)
        self._count = itertools.count(1)
        self.static: dict = {}                      # plan -> its fixed record fields
        self.peaks = _peaks(d.backend)
        self.queue, self._queue_size = owner.queue, owner.queue_size

    def __call__(self, plan, args, out):
        every = self.every
        if every != 1 and next(self._count) % every:               # not logged
            return plan.run(args, out) if self._direct else self._next(plan, args, out)
        t0 = _perf_ns()
        result = plan.run(args, out) if self._direct else self._next(plan, args, out)
        t1 = _perf_ns()
        queue = self.queue
        if len(queue) < self._queue_size:
            queue.append((self, _now(), plan, (t1 - t0) / 1e6, "host", _thread_id(), every))
        else:
            self.owner.queue_dropped += 1
        return result

    def timed(self, plan, time_ms: float) -> None:
        """The dispatcher's sampled (synchronised) launches."""
        every = self.every
        if every == 1 or next(self._count) % every == 0:
            self.owner.submit((self, _now(), plan, time_ms, "sync", _thread_id(), every))


class EventLogRecorder(LogRecorder):
    """The cuda recorder: a pre-created event pair from the timer's ring recorded around
    the launch with the raw runtime call on the launch's stream, and one tuple
    ``(slot, time_s, plan, recorder, stream)`` appended to the ring's pending queue. A
    full ring drops the record (counted), never the call."""

    def __init__(self, owner: CounterLog, d: dispatch.Dispatcher, timer):
        super().__init__(owner, d, timer)
        self._ticket, self._capacity, self._busy = timer.ticket, timer.capacity, timer.busy
        self._starts, self._ends, self._record = timer.starts, timer.ends, timer.record
        self._append, self._stream = timer.append_pending, timer.current_stream
        self._torch_stream = None
        # a gate before each pair: the pair then times the call's kernels, not also the
        # host's launch of them on an idle GPU (run S8)
        self._gate = d.backend.gate

    def __call__(self, plan, args, out):
        every = self.every
        if every != 1 and next(self._count) % every:               # not logged
            return plan.run(args, out) if self._direct else self._next(plan, args, out)
        slot = next(self._ticket) % self._capacity
        busy = self._busy
        if busy[slot]:                              # still pending: drop the record
            self.timer.dropped += 1
            return self._next(plan, args, out)
        busy[slot] = True
        # the launch's stream: CuPy's current one, or PyTorch's for tensors; both events
        # go to it, the start before the plan's first kernel, the end after its last
        stream = (self._stream() if plan.problem.kind != "torch" else
                  self._torch()).ptr
        record = self._record
        release = self._gate(stream, GATE_US)
        record(self._starts[slot], stream)
        try:
            result = plan.run(args, out) if self._direct else self._next(plan, args, out)
        except BaseException:
            busy[slot] = False
            release()
            raise
        record(self._ends[slot], stream)
        release()
        self._append((slot, _now(), plan, self, stream, every))
        return result

    def _torch(self):
        if self._torch_stream is None:
            from adaptive.backends.cuda import torch_stream
            self._torch_stream = torch_stream
        return self._torch_stream()


class CuptiLogRecorder(LogRecorder):
    """The cuda recorder with CUPTI: the launch runs between a push and a pop of an
    external correlation id, so the activity records of the kernels it issued carry the
    id; the writer joins them to ``(id, time_s, plan, recorder, stream)`` tuples queued
    here. No event is recorded and nothing is read on the caller's thread: a logged call
    costs two C calls around the launch, the stream lookup and one deque append."""

    def __init__(self, owner: CounterLog, d: dispatch.Dispatcher, timer):
        super().__init__(owner, d, timer)
        self._push, self._pop = timer.push_id, timer.pop_id
        self._ids, self._append = timer.ids, timer.append_pending
        self._pending = timer.pending_calls
        self._capacity = timer.capacity
        self._stream = timer.current_stream
        self._torch_stream = None

    def __call__(self, plan, args, out):
        every = self.every
        if every != 1 and next(self._count) % every:               # not logged
            return plan.run(args, out) if self._direct else self._next(plan, args, out)
        if len(self._pending) >= self._capacity:    # the writer is behind: drop the record
            self.timer.dropped += 1
            return self._next(plan, args, out)
        ext = next(self._ids)
        self._push(ext)
        try:
            result = plan.run(args, out) if self._direct else self._next(plan, args, out)
        finally:
            self._pop()
        self._append((ext, _now(), plan, self,
                      (self._stream() if plan.problem.kind != "torch" else self._torch()).ptr,
                      every))
        return result

    _torch = EventLogRecorder._torch


def _peaks(backend) -> dict | None:
    try:
        return backend.peaks()
    except Exception as exc:  # noqa: BLE001 (no floor then; the log still works)
        log.warning("no roofline peaks for %s (%s); records carry no floor_ms", backend.name, exc)
        return None


def cuda_index(backend) -> int | None:
    """The CUDA ordinal of a backend's device (None: the host)."""
    device = str(backend.device)
    return int(device.split(":")[1]) if device.startswith("cuda:") else None
