"""The counter log itself (queue, writer thread, rotation) and ``counter_log``."""

from __future__ import annotations

import atexit
import bisect
import collections
import contextlib
import dataclasses
import logging
import math
import operator
import os
import platform
import threading
import time
import traceback
import weakref
from collections.abc import Iterator

import msgpack

from adaptive import config
from adaptive.dispatch import Dispatcher
from adaptive.variants import Registry, shared_registry
from adaptive.observation import floor_ms
from adaptive.counterlog.format import BATCH_ROWS, FORMAT, VERSION, frame, frame_bytes
from adaptive.counterlog.governor import Governor, GovernorState, check_budget
from adaptive.counterlog.recorders import CuptiLogRecorder, LogRecorder, cuda_index

log = logging.getLogger("adaptive.counterlog")

# timing sources of cuda launches: "auto" is sampled event pairs (CUPTI's activity alone
# took 40-82 % of the H200's launch throughput: docs/benchmarks.md, run S3), "cupti" where
# asked for; host launches are always timed by a perf-counter pair around the call
TIMINGS = ("auto", "cupti", "events")


# ---- the log ----------------------------------------------------------------------------------

@dataclasses.dataclass
class LogStats:
    """Counts of one counter log (read them any time; ``dropped`` includes full event rings)."""

    written: int = 0
    dropped: int = 0
    rotations: int = 0
    bytes_written: int = 0
    governor: GovernorState | None = None   # the overhead governor's state (live)


@dataclasses.dataclass
class _Retired:
    """A timer the governor switched away from: a CUPTI timer it handed over from (see
    :meth:`CounterLog._hand_over`), or the event ring a probe that found CUPTI fits left
    (:meth:`CounterLog._enable_cupti`; harvested until the log closes, then closed: a
    caller still inside an old recorder may record on it)."""

    index: int
    timer: object
    closed: bool = False          # every call it tagged written or counted; stopped


class CounterLog:
    """Writes launch records of the dispatchers it is attached to; see :func:`counter_log`."""

    def __init__(self, path: str | os.PathLike, sample_every: int | None = None,
                 max_bytes: int = 64 << 20, backups: int = 3, queue_size: int = 65536,
                 flush_interval_s: float = 0.05, nvml: bool = True, event_capacity: int = 4096,
                 timing: str | None = None, overhead_budget: float | None = None,
                 govern: bool = True, govern_period_s: float = 0.25, clock=None,
                 cpu_time=None):
        cfg = config.get()
        if sample_every is None:
            sample_every = cfg.counter_log_every
        timing = cfg.counter_log_timing if timing is None else timing
        if timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
        if not isinstance(sample_every, int) or sample_every < 1:
            raise ValueError(f"sample_every must be an integer >= 1 (1: every launch), "
                             f"got {sample_every!r}")
        if max_bytes < 4096:
            raise ValueError(f"max_bytes must be at least 4096, got {max_bytes}")
        if backups < 0 or queue_size < 1 or not flush_interval_s > 0:
            raise ValueError("backups must be >= 0, queue_size >= 1 and flush_interval_s > 0; "
                             f"got {backups}, {queue_size}, {flush_interval_s}")
        budget = check_budget(cfg.counter_log_budget if overhead_budget is None
                              else overhead_budget)
        self.path = os.fspath(path)
        self.sample_every, self.max_bytes, self.backups = sample_every, max_bytes, backups
        self.queue_size, self.flush_interval_s = queue_size, flush_interval_s
        self.nvml, self.event_capacity = nvml, event_capacity
        self.timing = timing            # asked for; ``timings`` says what each device got
        self.timings: dict[int, str] = {}
        # the overhead governor, driven by the writer thread's clock and CPU time (tests
        # pass their own ``clock`` and ``cpu_time``)
        self.overhead_budget, self.govern = budget, govern
        # governed CUPTI starts as the events mode and enables CUPTI only where the launch
        # rate measured over a first window says it fits (see ``governor``)
        self.governor = Governor(budget, sample_every, period_s=govern_period_s,
                                 probe=govern and timing == "cupti")
        self._clock = clock or time.monotonic
        self._cpu_time = cpu_time or time.thread_time
        self.stats = LogStats(governor=self.governor.state)
        self.queue: collections.deque = collections.deque()
        self.queue_dropped = 0
        self._recorders = weakref.WeakKeyDictionary()   # dispatcher -> its recorder
        self._timers: dict[int, object] = {}        # cuda index -> EventTimer
        self._closed_timers: dict[int, object] = {}
        # CUPTI timers the governor handed over from: harvested until every call they
        # tagged is written or counted, then stopped (kept: last_error reads them)
        self._retired: list[_Retired] = []
        self.handover: str | None = None            # why CUPTI handed over, and when
        self.cupti_decision: str | None = None      # what the probe decided, and from what
        # launches the written records stand for (each scaled by its interval), dropped
        # ones included: the probe's launch rate
        self._launches = 0
        self._dropped_seen = 0
        self.samplers: dict[int, object] = {}       # cuda index -> NvmlSampler
        self._lock = threading.Lock()
        self._govern_lock = threading.Lock()       # the writer's; tests drive it too
        self._wake = threading.Event()
        self._closing = False
        self._file = None
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._file_bytes = 0
        # the writer thread's own; numpy scalars (CuPy's and NVML's values) become plain
        self._pack = msgpack.Packer(use_bin_type=True, default=_plain).pack
        # failures of the writer thread, first one of each kind kept with its traceback
        self.errors: dict[str, str] = {}
        self.error_counts: dict[str, int] = {}
        self._last_error: str | None = None

    # ---- hot path (caller's thread) ----------------------------------------------------
    def submit(self, item: tuple) -> None:
        """Queue one record for the writer; drop and count it when the queue is full."""
        if len(self.queue) < self.queue_size:
            self.queue.append(item)
        else:
            self.queue_dropped += 1

    # ---- attaching ---------------------------------------------------------------------
    def attach(self, d: Dispatcher) -> None:
        """Log launches of dispatcher ``d`` (idempotent)."""
        with self._lock:
            if d in self._recorders:
                return
            timer = None
            if d.backend.name == "cuda":
                index = cuda_index(d.backend)
                timer = self._timers.get(index)
                if timer is None:
                    timer = self._timers[index] = self._make_timer(index)
                if self.nvml and index not in self.samplers:
                    from profilers.nvml import NvmlSampler, nvml_device
                    self.samplers[index] = NvmlSampler(nvml_device(index)).start()
            rec = LogRecorder(self, d, timer)
            self._apply(rec, self.governor.state)
            self._recorders[d] = rec
        d.add_recorder(rec)

    def _make_timer(self, index: int):
        """The timing source for one device: CUPTI where asked for ("cupti"), available
        and "on" (governed: once the probe found it fits, and not handed over), else a
        ring of CUDA event pairs."""
        if self.timing == "cupti" and self.governor.state.cupti == "on":
            timer = self._cupti_timer(index)
            if timer.status == "ok":
                self.timings[index] = "cupti"
                return timer
            timer.close()
            log.warning("counter log %s: CUPTI timing asked for but %s", self.path,
                        timer.status)
        self.timings[index] = "cuda_event"
        return self._event_timer(index)

    def _cupti_timer(self, index: int):
        """A CUPTI timer for device ``index`` (its ``status`` says whether CUPTI could
        subscribe); the first one loads CUPTI and enables its activity in the process."""
        from profilers.cupti import CuptiTimer
        timer = CuptiTimer(self.event_capacity)
        return timer.use_cupy_streams() if timer.status == "ok" else timer

    def _event_timer(self, index: int):
        """A ring of CUDA event pairs on device ``index`` (tests without a GPU replace it
        with one that returns None: their host dispatcher then times by the host clock)."""
        from profilers.events import EventTimer
        return EventTimer(self.event_capacity, index)

    def detach(self, d: Dispatcher) -> None:
        """Stop logging ``d``'s launches (records already taken are still written)."""
        with self._lock:
            rec = self._recorders.pop(d, None)
        if rec is not None:
            d.remove_recorder(rec)

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
        while any(t.pending for t in self._live_timers()) and time.monotonic() < deadline:
            self._wake.set()            # harvest now, not at the next flush interval
            time.sleep(0.005)
        self._closing = True
        self._wake.set()
        thread.join()
        for sampler in self.samplers.values():
            sampler.stop()
        for timer in self._live_timers():
            self.queue_dropped += timer.discard_pending() + timer.dropped   # unfinished too
            timer.close()
        self.queue_dropped += sum(r.timer.dropped for r in self._retired if r.closed)
        self._closed_timers = dict(self._timers)    # last_error still reads their problems
        self._timers.clear()                        # a reopened log makes fresh rings
        self.stats.dropped = self.queue_dropped
        self._file.close()
        self._file = None
        return self.stats

    def __enter__(self) -> CounterLog:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- writer thread -----------------------------------------------------------------
    @property
    def last_error(self) -> str | None:
        """Why records were lost, or None: the writer thread's last exception (its first
        traceback of each kind is in :attr:`errors`), else a timing source's problem
        (CUPTI delivering no kernels for logged calls, its buffer callback failing, event
        pairs the runtime cannot time). Tests and health checks assert it is None."""
        if self._last_error is not None:
            return self._last_error
        for index, timer in [*(sorted(self._timers.items()) or
                               sorted(self._closed_timers.items())),
                             *((r.index, r.timer) for r in self._retired)]:
            problem = _timer_problem(timer)
            if problem is not None:
                return f"device {index}: {problem}"
        return None

    def _live_timers(self) -> list:
        """Every timer still handing over calls: each device's, CUPTI's while it settles
        after a handover, and the event rings a switch to CUPTI left."""
        return [*self._timers.values(), *(r.timer for r in self._retired if not r.closed)]

    def _failed(self, exc: BaseException) -> None:
        """Count a writer failure; log the first of each kind with its traceback."""
        kind = type(exc).__name__
        self._last_error = f"{kind}: {exc}"
        self.error_counts[kind] = self.error_counts.get(kind, 0) + 1
        if kind not in self.errors:
            self.errors[kind] = "".join(traceback.format_exception(exc))
            log.error("counter log %s: writing failed (%s); the batch's records are dropped "
                      "and counted; later %s errors are counted only (CounterLog.errors)\n%s",
                      self.path, self._last_error, kind, self.errors[kind])

    def _loop(self) -> None:
        while True:
            closing = self._closing
            try:
                self._drain(final=closing)
                if self.govern and not closing:
                    self._govern()
            except Exception as exc:  # noqa: BLE001 (the writer never takes the process down)
                self._failed(exc)
            if closing:
                return
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()

    # ---- the overhead governor (writer thread) ----------------------------------------------
    def _cost_s(self) -> float:
        """The log's CPU time so far: the writer thread's (the caller's thread) and the CUPTI
        buffer callbacks' of its timers (a retired one's too: CUPTI records until it stops)."""
        activities = {id(t.activity): t.activity
                      for t in [*self._timers.values(), *(r.timer for r in self._retired)]
                      if _is_cupti(t)}
        return self._cpu_time() + sum(a.callback_cpu_s for a in activities.values())

    def _launches_seen(self) -> int:
        """The launches the log has seen so far, for the probe: those its written records
        stand for, dropped records and calls still in flight each counted at the interval
        in effect now."""
        every = self.governor.state.every
        in_flight = len(self.queue) + sum(t.pending for t in self._live_timers())
        return (self._launches + (self._dropped() - self._dropped_seen) * every
                + in_flight * every)

    def _govern(self) -> GovernorState:
        """Judge the log's cost against the budget and apply the governor's answer: the
        sampling interval of host and event recorders, the probe's decision (CUPTI from
        now on, or never), and CUPTI's handover to event pairs; a retired CUPTI timer
        stops once every call it tagged has its kernels."""
        with self._govern_lock:
            cupti = [t for t in list(self._timers.values()) if _is_cupti(t)]
            probing = self.governor.state.cupti == "probe"
            state = self.governor.step(self._clock(), self._cost_s(), bool(cupti),
                                       self._launches_seen() if probing else 0)
            if probing and state.cupti != "probe":
                self._decided(state)
            if cupti and state.cupti == "events":
                self._hand_over(state)
            with self._lock:
                recorders = list(self._recorders.values())
            for rec in recorders:
                self._apply(rec, state)
            for r in self._retired:
                if (not r.closed and _is_cupti(r.timer) and r.timer.recording
                        and r.timer.unsettled() == 0):
                    r.timer.set_recording(False)    # detaches CUPTI (its last user)
            return state

    def _decided(self, state: GovernorState) -> None:
        """Apply and record the probe's decision (governor thread)."""
        g = self.governor
        estimate = (f"{state.launch_rate_per_s:,.0f} launches/s over the first "
                    f"{state.elapsed_s:.1f} s x {g.cost_s_per_launch * 1e6:.2f} us a launch "
                    f"= {state.cupti_estimate:.2%} of wall time")
        limit = f"{g.fit:g} x the {self.overhead_budget:.1%} budget"
        if state.cupti == "declined":
            self.cupti_decision = (f"CUPTI not enabled: {estimate}, over {limit}; calls are "
                                   "timed by sampled CUDA event pairs for the whole log")
        else:
            with self._lock:
                devices = sorted(self._timers)
            problem = self._enable_cupti()
            if problem is None:
                self.cupti_decision = (
                    f"CUPTI enabled {state.elapsed_s:.1f} s into the log: {estimate}, under "
                    f"{limit}; calls before it were timed by sampled CUDA event pairs"
                    + ("" if devices else " (no cuda device attached yet: each one "
                                           "attached from now on is timed by CUPTI)"))
            else:
                g.cupti_unavailable()
                self.cupti_decision = (f"CUPTI fits ({estimate}, under {limit}) but could not "
                                       f"be enabled: {problem}; calls are timed by sampled "
                                       "CUDA event pairs for the whole log")
        log.info("counter log %s: %s", self.path, self.cupti_decision)

    def _enable_cupti(self) -> str | None:
        """Time calls by CUPTI from now on (governor thread), the reverse of
        :meth:`_hand_over`: each device's event ring is retired (harvested until the log
        closes) and each recorder of it replaced by a CUPTI recorder. Returns None, or why
        CUPTI could not be enabled (then nothing changes)."""
        with self._lock:
            rings = {i: t for i, t in self._timers.items()
                     if t is not None and not _is_cupti(t)}
        made: dict[int, object] = {}
        problem = None
        for index in rings:                 # outside the lock: loading CUPTI takes a while
            try:
                timer = self._cupti_timer(index)
            except Exception as exc:  # noqa: BLE001 (events stay)
                problem = f"{type(exc).__name__}: {exc}"
                break
            made[index] = timer
            if timer.status != "ok":
                problem = timer.status
                break
        if problem is not None:
            for timer in made.values():
                timer.close()
            log.warning("counter log %s: CUPTI fits but could not be enabled (%s); sampled "
                        "event pairs keep timing", self.path, problem)
            return problem
        with self._lock:
            new_recorders = self._replace_timers(made, self.governor.state)
        self._swap(new_recorders)
        # loading CUPTI took the writer's CPU time: not CUPTI's cost while it records
        self.governor.restart_period(self._clock(), self._cost_s())
        return None

    def _replace_timers(self, new: dict, state: GovernorState) -> list:
        """Retire each device's timer for ``new[index]`` (None: the host clock), under the
        log's lock: the retired one is harvested until its calls are in. Returns the
        ``(dispatcher, old recorder, new recorder)`` of every recorder of a retired timer,
        the new one made on the new timer with ``state``'s interval, for :meth:`_swap`."""
        swaps = []
        for index, timer in new.items():
            old = self._timers.get(index)
            if old is None:          # the device detached meanwhile: its new timer unused
                if timer is not None:
                    timer.close()
                continue
            self._retired.append(_Retired(index, old))
            if timer is None:
                del self._timers[index]
            else:
                self._timers[index] = timer
            self.timings[index] = ("cupti" if _is_cupti(timer) else
                                   "cuda_event" if timer is not None else "host")
            swaps += [(d, rec, timer) for d, rec in self._recorders.items()
                      if rec.timer is old]
        replaced = []
        for d, old, timer in swaps:
            rec = LogRecorder(self, d, timer)
            self._apply(rec, state)
            self._recorders[d] = rec
            replaced.append((d, old, rec))
        return replaced

    def _swap(self, new_recorders: list) -> None:
        """Install each new recorder in front of the old one, then take the old one out
        (outside the log's lock, as attach() does): no call goes unlogged in between."""
        for d, old, rec in new_recorders:
            if self._recorders.get(d) is rec:           # (not detached meanwhile)
                d.add_recorder(rec)
            d.remove_recorder(old)

    def _apply(self, rec: LogRecorder, state: GovernorState) -> None:
        if not isinstance(rec, CuptiLogRecorder):   # CUPTI tags at the configured rate
            rec.every = state.every

    def _hand_over(self, state: GovernorState) -> None:
        """Time calls by event pairs from now on (governor thread): each CUPTI timer is
        retired (harvested until its tagged calls are in) and each recorder of it replaced
        by one on the device's new event ring."""
        with self._lock:
            cupti = {i: t for i, t in self._timers.items() if _is_cupti(t)}
            try:
                rings = {index: self._event_timer(index) for index in cupti}
            except Exception as exc:  # noqa: BLE001 (no event ring: CUPTI keeps timing)
                self.governor.keep_cupti()
                self.handover = None
                log.warning("counter log %s: CUPTI is over its budget but no CUDA event ring "
                            "could be made (%s: %s); CUPTI keeps timing", self.path,
                            type(exc).__name__, exc)
                return
            new_recorders = self._replace_timers(rings, state)
            self.handover = (
                f"CUPTI's cost was {state.handover_cost:.1%} of wall time, over the "
                f"{self.overhead_budget:.1%} budget, {state.elapsed_s:.1f} s into the log: "
                "calls are timed by sampled CUDA event pairs from then on")
        self._swap(new_recorders)
        log.warning("counter log %s: %s", self.path, self.handover)

    def _drain(self, final: bool = False) -> None:
        """Write what was queued and what the timers finished (``final``: the log is
        closing; timers hand over or drop every call still in flight)."""
        popleft = self.queue.popleft
        self.stats.dropped = self._dropped()
        items = [popleft() for _ in range(len(self.queue))]     # callers append meanwhile
        for timer in self._live_timers():
            source = "cupti" if _is_cupti(timer) else "cuda_event"
            items += [(rec, time_s, plan, float(time_ms), source, stream, every)
                      for (_, time_s, plan, rec, stream, every), time_ms in
                      timer.harvest_entries(final=final)]
        if self.governor.state.cupti == "probe":
            dropped = self._dropped()
            self._launches += (sum(item[-1] for item in items)
                               + (dropped - self._dropped_seen) * self.governor.state.every)
            self._dropped_seen = dropped
        if items:
            items.sort(key=_time_of)                # mostly in order already: a linear pass
            done = 0
            try:
                for i in range(0, len(items), BATCH_ROWS):
                    self._write_batch(items[i:i + BATCH_ROWS])
                    done = min(i + BATCH_ROWS, len(items))
                self._file.flush()
            except BaseException:                   # disk full, a bad record: counted
                self.queue_dropped += len(items) - done
                raise
        for r in self._retired:                     # settled and stopped: done with
            if (not r.closed and _is_cupti(r.timer) and not r.timer.recording
                    and not r.timer.pending):
                r.closed = True
                r.timer.close()
        self.stats.dropped = self._dropped()

    def _dropped(self) -> int:
        return (self.queue_dropped + sum(t.dropped for t in self._timers.values())
                + sum(r.timer.dropped for r in self._retired))

    def _write_batch(self, items: list[tuple]) -> None:
        """One self-contained frame: the fields of the plans and the device states its rows
        name, then one row per record (see ROW_FIELDS); packed by one msgpack call."""
        plan_ids, plans, rows = {}, [], []
        states, state_ids = [], {}
        sampled = bool(self.samplers)
        histories: dict = {}
        # the snapshot found last and the time window it serves ([lo, hi) on one device):
        # records come in time order, so most share it
        at_index, lo, hi, at_sid = None, math.inf, -math.inf, -1
        seq = self._seq
        pid_of, row = plan_ids.get, rows.append
        for rec, time_s, plan, time_ms, timer, stream, every in items:
            pid = pid_of(plan)
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
            row((seq, pid, time_s, time_ms, timer, sid, stream, every))
        self._seq = seq
        g = self.governor.state
        governor = {"every": g.every, "cost": g.cost_fraction}
        if self._retired or any(_is_cupti(t) for t in list(self._timers.values())):
            governor["cupti_active"] = g.active_fraction
        if self.handover is not None:
            governor["handover"] = self.handover
        if self.timing == "cupti" and self.govern:      # the probe: its state, rate, estimate
            governor["cupti_state"] = g.cupti
            if g.cupti != "probe":
                governor["launch_rate_per_s"] = g.launch_rate_per_s
                governor["cupti_estimate"] = g.cupti_estimate
            if self.cupti_decision is not None:
                governor["cupti_decision"] = self.cupti_decision
        payload = self._pack({"plans": plans, "states": states, "rows": rows,
                              "dropped": self.stats.dropped, "governor": governor})
        frame = frame_bytes(payload)
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

    def _static(self, rec: LogRecorder, plan) -> dict:
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
                  "pid": os.getpid(), "host": platform.node(), "sample_every": self.sample_every,
                  "timing": self.timing, "flush_interval_s": self.flush_interval_s,
                  "overhead_budget": self.overhead_budget if self.govern else None}
        if self.governor.probe:       # the rule that decides whether CUPTI is enabled
            g = self.governor
            header["cupti_probe"] = {"window_s": g.window_s, "fit": g.fit,
                                     "cost_s_per_launch": g.cost_s_per_launch}
        self._file_bytes = self._file.write(frame(header))
        self._file.flush()
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


def _is_cupti(timer) -> bool:
    """Whether a timing source is a CUPTI timer (event rings and the host clock are not)."""
    return getattr(timer, "kind", "") == "cupti"


def _plain(value):
    """msgpack's hook for values it cannot pack: numpy scalars (``eventElapsedTime`` and
    NVML bindings may hand them over) become Python numbers; anything else is an error
    that names the type."""
    item = getattr(value, "item", None)
    if item is not None:
        return item()
    raise TypeError(f"counter log: cannot write a {type(value).__module__}."
                    f"{type(value).__qualname__} value ({value!r}); expected a number, "
                    "string, list or dict")


def _timer_problem(timer) -> str | None:
    """What went wrong in a timing source, or None."""
    problem = getattr(timer, "problem", None)
    if problem is not None:
        return problem
    activity = getattr(timer, "activity", None)
    if activity is not None and getattr(activity, "error", None):
        return activity.error.splitlines()[0]
    status = getattr(timer, "status", "ok")
    return None if status in ("ok", "paused", "detaching", "detached", "closed") else status

# ---- the public context manager and the ADAPTIVE_COUNTER_LOG hook ---------------------------

_active: list[CounterLog] = []
_active_lock = threading.Lock()


@contextlib.contextmanager
def counter_log(path: str | os.PathLike, sample_every: int | None = None,
                registry: Registry | None = None, **options) -> Iterator[CounterLog]:
    """Log every ``sample_every``-th launch of every dispatcher on ``registry`` to ``path``.

    Applies to the registry's dispatchers alive now and to those created inside the block
    (``registry``: default the shared one, which ``adaptive.launch`` and every
    ``Dispatcher()`` made without a registry use; ``CounterLog.attach(d)`` adds any other).
    Records go to a msgpack stream written by a background thread; a launch never waits
    for it.

    Args:
        path: the log file; an existing one is moved to ``path.1`` (and so on).
        sample_every: log one launch in this many (per dispatcher; default
            ``ADAPTIVE_COUNTER_LOG_EVERY``, 16: low enough a cost to stay on in serving).
            The rate is written in the log's header; it is the floor of the interval the
            overhead governor raises (each record's ``sample_every`` says the one used).
        **options: ``max_bytes`` (rotation size, default 64 MiB), ``backups`` (rotated
            files kept, default 3), ``queue_size``, ``flush_interval_s``, ``nvml`` (sample
            NVML/GPM for cuda dispatchers, default True), ``event_capacity`` (timings in
            flight, per device), ``timing`` ("auto" and "events": sampled CUDA event
            pairs; "cupti": CUPTI activity records where cupti-python can subscribe, else
            event pairs, at a cost measured at 40-82 % of launch throughput; governed, the
            log starts on event pairs and enables CUPTI only where the launch rate of its
            first 0.5 s times CUPTI's per-launch cost is under half the budget, since once
            enabled CUPTI slows the process's launches for good; default
            ``ADAPTIVE_COUNTER_LOG_TIMING``), ``overhead_budget`` (the share of wall time the
            log's own threads may take, default ``ADAPTIVE_COUNTER_LOG_BUDGET``, 0.02: over
            it the interval of sampled launches doubles, up to 65536, and CUPTI hands over
            to sampled event pairs for the rest of the log; each record carries the
            interval and the timer it was taken with), ``govern``
            (default True; False keeps the interval and CUPTI as configured, CUPTI enabled
            at once: measurements that need every call).

    Yields:
        the :class:`CounterLog` (``.stats`` has written, dropped and rotation counts).

    Example:
        >>> with adaptive.counter_log("run.alog", sample_every=1) as clog:
        ...     adaptive.launch("gemm", a, b)
        >>> clog.stats.written
        1
    """
    clog = CounterLog(path, sample_every, **options).open()
    with _active_lock:
        _active.append(clog)
    registry = shared_registry() if registry is None else registry
    try:
        registry.observe(clog)
        yield clog
    finally:
        global _closed_dropped, _closed_written
        registry.unobserve(clog)
        stats = clog.close()
        with _active_lock:
            _active.remove(clog)
            _closed_dropped += stats.dropped
            _closed_written += stats.written


_closed_dropped = 0
_closed_written = 0


def dropped_records_total() -> int:
    """Records dropped by every counter log of this process, open or closed."""
    with _active_lock:
        return _closed_dropped + sum(clog.stats.dropped for clog in _active)


def written_records_total() -> int:
    """Records written by every counter log of this process, open or closed."""
    with _active_lock:
        return _closed_written + sum(clog.stats.written for clog in _active)


def active_logs() -> list[CounterLog]:
    """Counter logs open now (metrics export their dropped counts)."""
    with _active_lock:
        return list(_active)


_configured: dict[str, CounterLog] = {}


def open_configured(path: str, registry) -> CounterLog:
    """The ``ADAPTIVE_COUNTER_LOG`` log (:func:`adaptive.runtime.start` opens it once):
    logs every dispatcher of ``registry``, present and future, until the interpreter
    exits or :func:`close_configured`."""
    clog = _configured.get(path)
    if clog is None:
        clog = _configured[path] = CounterLog(
            path, sample_every=max(config.get().counter_log_every, 1)).open()
        with _active_lock:
            _active.append(clog)
        atexit.register(close_configured)
    registry.observe(clog)
    return clog


def close_configured() -> None:
    """Close the ``ADAPTIVE_COUNTER_LOG`` logs now (otherwise at interpreter exit)."""
    global _closed_dropped, _closed_written
    for path in list(_configured):
        clog = _configured.pop(path)
        shared_registry().unobserve(clog)
        stats = clog.close()
        with _active_lock:
            if clog in _active:
                _active.remove(clog)
            _closed_dropped += stats.dropped
            _closed_written += stats.written

