"""How the library times a candidate: :func:`measure` (and :func:`measure_each`, the same
over several runs interleaved), returning :class:`~adaptive.observation.Measurement`.

``warmup`` untimed runs absorb one-time costs (first touch, a sparse format built, a
kernel loaded); then each timed run is one sample. On the host clock a sample is the
wall time of the run and of the ``sync`` after it, so work a device queued is counted;
with a ``timer`` such as :class:`CudaEvents` the sample is the device's own time. A run
that raises is a sample of ``inf`` with the reason (failures are data inside search), or
the error goes to the caller with ``raise_errors=True``.

    m = measure(lambda: fn(args, out), warmup=2, reps=10, sync=backend.synchronize)
    m.median_ms, m.spread_ms
"""

from __future__ import annotations

import gc
import math
import numbers
import time
from collections.abc import Callable, Sequence

from adaptive.observation import Measurement

Run = Callable[[], object]
Timer = Callable[[Run], float]   # runs its argument once; that run's time in ms


class CudaEvents:
    """A :data:`Timer` of CUDA events (CuPy): a fresh event pair around the run, waited
    for; the sample is the GPU time between them.

    ``gate`` (a backend's ``gate(stream_ptr, limit_us) -> release``): the pair and the run
    are queued behind a gate of the stream, released once the end event is issued, so
    they run back to back and the sample is the run's device time. Without it, on an idle
    GPU the pair also times the host's issuing of the run: a torch library call through
    DLPack read 0.1-0.4 ms in the pack build where its kernels take 10-40 us (run S14).
    ``stream_ptr``: the stream the run's work goes to (default: CuPy's current stream)."""

    def __init__(self, cp=None, gate=None, limit_us: float = 2000.0,
                 stream_ptr: int | None = None):
        if cp is None:
            import cupy as cp
        self._cp, self._gate, self._limit_us, self._stream_ptr = cp, gate, limit_us, stream_ptr

    def __call__(self, run: Run) -> float:
        cuda = self._cp.cuda
        stream = (cuda.get_current_stream() if self._stream_ptr is None else
                  cuda.ExternalStream(self._stream_ptr))
        start, stop = cuda.Event(), cuda.Event()
        release = None if self._gate is None else self._gate(stream.ptr, self._limit_us)
        try:
            start.record(stream)
            run()
            stop.record(stream)
        finally:
            if release is not None:
                release()
        stop.synchronize()
        return cuda.get_elapsed_time(start, stop)


def measure(run: Run, *, warmup: int = 0, reps: int = 1, budget_s: float | None = None,
            sync: Callable[[], object] | None = None, timer: Timer | None = None,
            flush: Callable[[], object] | None = None,
            raise_errors: bool = False) -> Measurement:
    """Time ``run()``: ``warmup`` untimed runs, then ``reps`` timed ones.

    Args:
        run: the work, called with no arguments.
        warmup: untimed runs first (each followed by ``sync``).
        reps: timed runs, one sample each.
        budget_s: stop after the sample that ends later than this many seconds from the
            start (warm-up included); at least one sample is always taken.
        sync: waits for the device (e.g. ``backend.synchronize``). On the host clock it is
            called inside each timed sample; with a ``timer`` only after warm-up runs.
        timer: times one run in ms (e.g. :class:`CudaEvents`); default: the host's
            ``perf_counter_ns`` around the run and ``sync``.
        flush: called before every run, outside the timed part (e.g. overwrite a buffer of
            twice the L2 size); the measurement then says ``l2_flushed``.
        raise_errors: let an exception of ``run`` (or of the timer) reach the caller
            instead of recording it.

    Returns:
        A :class:`Measurement` of the samples in ms. A failed run ends the measurement:
        its sample is ``inf`` (one ``inf`` if a warm-up run failed) and ``error`` says why.
    """
    warmup, reps = _checked(warmup, reps, budget_s, (run,))
    t_end = None if budget_s is None else time.perf_counter() + budget_s
    samples, error = [], ""
    try:
        for i in range(warmup + reps):
            ms = _step(run, i >= warmup, sync, timer, flush)
            if ms is not None:
                samples.append(ms)
                if t_end is not None and time.perf_counter() > t_end:
                    break
    except Exception as exc:  # noqa: BLE001 (failures are data inside search)
        if raise_errors:
            raise
        samples.append(math.inf)
        error = f"{type(exc).__name__}: {exc}"
    return Measurement(tuple(samples), warmup, flush is not None, error)


def measure_each(runs: Sequence[Run], *, warmup: int = 0, reps: int = 1,
                 budget_s: float | None = None, sync: Callable[[], object] | None = None,
                 timer: Timer | None = None, flush: Callable[[], object] | None = None,
                 raise_errors: bool = False) -> list[Measurement]:
    """:func:`measure` of several runs, interleaved: each round runs each one once, in
    order, so a drift of clocks or temperature falls on all of them alike (a candidate
    against its baseline). A failed run is left out of later rounds; the budget is
    checked after each round. One :class:`Measurement` per run, in order."""
    runs = tuple(runs)
    warmup, reps = _checked(warmup, reps, budget_s, runs)
    t_end = None if budget_s is None else time.perf_counter() + budget_s
    samples: list[list[float]] = [[] for _ in runs]
    errors = [""] * len(runs)
    live = list(range(len(runs)))
    for i in range(warmup + reps):
        for k in tuple(live):
            try:
                ms = _step(runs[k], i >= warmup, sync, timer, flush)
            except Exception as exc:  # noqa: BLE001 (failures are data inside search)
                if raise_errors:
                    raise
                samples[k].append(math.inf)
                errors[k] = f"{type(exc).__name__}: {exc}"
                live.remove(k)
                continue
            if ms is not None:
                samples[k].append(ms)
        if not live or (i >= warmup and t_end is not None and time.perf_counter() > t_end):
            break
    return [Measurement(tuple(s), warmup, flush is not None, e)
            for s, e in zip(samples, errors)]


def _step(run: Run, timed: bool, sync, timer, flush) -> float | None:
    """One run: its sample in ms, or None for a warm-up run."""
    if flush is not None:
        flush()
    if not timed:
        run()
        if sync is not None:
            sync()
        return None
    if timer is not None:
        return timer(run)
    t0 = time.perf_counter_ns()
    run()
    if sync is not None:
        sync()
    return (time.perf_counter_ns() - t0) / 1e6


def _checked(warmup, reps, budget_s, runs: tuple) -> tuple[int, int]:
    if (type(warmup) is int and type(reps) is int and warmup >= 0 and reps >= 1
            and budget_s is None and len(runs) == 1 and callable(runs[0])):
        return warmup, reps   # the common case, checked cheaply (sampled calls come here)
    if not runs or not all(callable(r) for r in runs):
        raise TypeError(f"measure needs callables to time, got {runs!r}")
    for name, value, least, what in (("warmup", warmup, 0, "untimed runs"),
                                     ("reps", reps, 1, "timed runs")):
        if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                or value < least):
            raise ValueError(f"{name} must be an int >= {least} ({what}), got {value!r}")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds or None (no budget), got {budget_s!r}")
    return int(warmup), int(reps)


class GcClock:
    """Time Python's garbage collector has run (every thread) since made, from
    ``gc.callbacks``, per generation, until :meth:`close`: a host-bound loop pays a
    collection's pause in full, so a first result, a request or a prefill can report the
    collections inside it."""

    def __init__(self):
        self.total_s = [0.0, 0.0, 0.0]   # per generation
        self.counts = [0, 0, 0]
        self._t0 = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            gen = info.get("generation", 0)
            self.total_s[gen] += time.perf_counter() - self._t0
            self.counts[gen] += 1
            self._t0 = None

    def seconds(self) -> float:
        """Seconds in every collection so far."""
        return sum(self.total_s)

    def read(self) -> tuple[float, int]:
        """(seconds in every collection so far, full collections so far)."""
        return self.seconds(), self.counts[2]

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
