"""Background regeneration: the trigger on sampled launches, a queue and one worker thread.

:meth:`Regenerator.attach` installs a recorder on a dispatcher, whose ``timed``
:meth:`Dispatcher.feedback` calls on sampled launches. The recorder only appends
``(plan, time_ms)`` to a bounded deque: efficiency, statistics, requests and whole
regeneration loops run on the worker thread, never on the calling thread.

A key becomes a request when, after ``min_samples`` samples, its best observed
efficiency (roofline floor / time) is still under ``threshold``, or when its samples
failed (non-finite time). Requests are de-duplicated per key, rate-limited to one per
``interval_s``, and each runs within a :class:`Budget`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import Callable

from adaptive.dispatch import Recorder
from adaptive.variants import shared_registry
from adaptive.regen.loop import LoopResult, run_loop
from adaptive.regen.parametric import Generator
from adaptive.regen.request import Budget, Request
from adaptive.regen.verifier import Verifier

log = logging.getLogger("adaptive.regen")


@dataclasses.dataclass
class _KeyStats:
    samples: int = 0
    failures: int = 0
    best_ms: float = math.inf
    floor_ms: float = 0.0
    plan: object = None


class _Listener(Recorder):
    """What a dispatcher calls on each timed launch: O(1), never raises, never blocks."""

    wraps_launches = False

    def __init__(self, inbox, wake, backend, limits):
        super().__init__()
        self.inbox, self.wake, self.backend, self.limits = inbox, wake, backend, limits

    def timed(self, plan, time_ms: float) -> None:
        self.inbox.append((self, plan, time_ms))
        self.wake.set()


class Regenerator:
    """Watches dispatchers and regenerates variants for keys that no variant serves well.

    Args:
        generator: proposes candidates (default: parametric over ``registry``).
        registry: where winners are promoted (default: the first attached dispatcher's).
        verifier: the isolated verifier (default settings when None).
        threshold: efficiency under which a hot key triggers (``ADAPTIVE_REGEN_THRESHOLD``).
        min_samples: samples of a key before it may trigger (``ADAPTIVE_REGEN_MIN_SAMPLES``).
        interval_s: least time between two requests (``ADAPTIVE_REGEN_INTERVAL_S``).
        budget: per request (default from ``ADAPTIVE_REGEN_BUDGET_S`` / ``_CANDIDATES``).
        on_result: called on the worker thread with each :class:`LoopResult`.
        batch: candidates verified per worker process in one round of a loop.

    Example:
        >>> regen = Regenerator().attach(dispatcher).start()
        >>> ...  # serve; sampled launches feed the trigger
        >>> regen.stop()
    """

    def __init__(self, generator: Generator | None = None, registry=None,
                 verifier: Verifier | None = None, threshold: float | None = None,
                 min_samples: int | None = None, interval_s: float | None = None,
                 budget: Budget | None = None,
                 on_result: Callable[[LoopResult], None] | None = None,
                 max_pending: int = 8, batch: int = 4,
                 clock: Callable[[], float] = time.monotonic):
        from adaptive import config
        c = config.get()
        self.threshold = c.regen_threshold if threshold is None else threshold
        self.min_samples = c.regen_min_samples if min_samples is None else min_samples
        self.interval_s = c.regen_interval_s if interval_s is None else interval_s
        self.budget = budget or Budget.from_config()
        self.generator, self.registry, self.verifier = generator, registry, verifier
        self.on_result, self.batch = on_result, batch
        self.results: list[LoopResult] = []
        self.requests: list[Request] = []
        self._clock = clock
        self._inbox: collections.deque = collections.deque(maxlen=65536)
        self._wake = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._stats: dict[tuple, _KeyStats] = {}
        self._requested: set = set()
        self._last_request_s = -math.inf
        self._busy = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._model = None
        self._attached = weakref.WeakKeyDictionary()   # dispatcher -> its _Listener

    # ---- wiring ----------------------------------------------------------------------------
    def attach(self, dispatcher) -> Regenerator:
        """Subscribe to ``dispatcher``'s sampled launches; returns self."""
        if self.registry is None:
            self.registry = dispatcher.registry
        if dispatcher in self._attached:
            return self
        if self._model is None:            # the learned policy's cost model guides the search
            self._model = dispatcher.policy.cost_model
        listener = self._attached[dispatcher] = _Listener(
            self._inbox, self._wake, dispatcher.backend, dict(dispatcher.limits))
        dispatcher.add_recorder(listener)
        return self

    def detach(self, dispatcher) -> None:
        """Stop watching ``dispatcher``."""
        listener = self._attached.pop(dispatcher, None)
        if listener is not None:
            dispatcher.remove_recorder(listener)

    def start(self) -> Regenerator:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._work, name="adaptive-regen",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop after the loop in progress (if any) finishes."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def busy(self) -> bool:
        """True while a loop runs or observations and requests wait."""
        return bool(self._inbox) or not self._queue.empty() or self._busy

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Block until every observation and request so far has been handled."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not self._inbox and self._queue.empty() and not self._busy:
                return True
            time.sleep(0.01)
        return False

    def submit(self, request: Request) -> bool:
        """Queue a request directly (what the trigger does); False when full or duplicate."""
        if request.key and request.key in self._requested:
            return False
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            log.warning("regeneration queue full; dropping request for %s", request.label)
            return False
        self._requested.add(request.key)
        self.requests.append(request)
        try:
            from adaptive.metrics import count_regeneration_request
            count_regeneration_request(request.op)
        except ImportError:
            pass
        self._wake.set()
        return True

    # ---- the worker thread -----------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            self._busy = True
            try:
                self._drain()
                while not self._stop.is_set():
                    try:
                        request = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    self._run(request)
                    self._drain()
            except Exception:  # noqa: BLE001 (the worker must outlive one bad request)
                log.exception("regeneration worker error")
            finally:
                self._busy = False

    def _drain(self) -> None:
        while self._inbox:
            listener, plan, time_ms = self._inbox.popleft()
            st = self._stats.get(plan.key)
            if st is None:       # per key, over every candidate it was served (or explored) by
                st = self._stats[plan.key] = _KeyStats(plan=plan, floor_ms=plan.floor_ms)
            st.samples += 1
            if math.isfinite(time_ms) and time_ms > 0:
                if time_ms < st.best_ms:
                    st.best_ms, st.plan = time_ms, plan
            else:
                st.failures += 1
            self._consider(listener, st.plan, st)

    def _consider(self, listener, plan, st: _KeyStats) -> None:
        if st.samples < self.min_samples or plan.key in self._requested:
            return
        efficiency = st.floor_ms / st.best_ms if math.isfinite(st.best_ms) else 0.0
        if st.failures == st.samples:
            reason = f"all {st.samples} sampled runs failed"
        elif efficiency < self.threshold:
            reason = (f"best observed efficiency {efficiency:.1%} of the roofline stays under "
                      f"the threshold {self.threshold:.1%} after {st.samples} samples")
        else:
            return
        now = self._clock()
        if now - self._last_request_s < self.interval_s:
            return                                      # rate limit: ask again later
        self._last_request_s = now
        self.submit(self._request(listener, plan, st, reason))

    def _request(self, listener, plan, st: _KeyStats, reason: str) -> Request:
        from adaptive.ops import get_op
        op, problem = get_op(plan.problem.op), plan.problem
        decision = plan.decision
        return Request(
            op=op.name, dims=problem.dims_dict, dtype=problem.dtype,
            backend=listener.backend.name, best=plan.candidate, best_ms=st.best_ms,
            floor_ms=st.floor_ms, samples=st.samples, params=problem.params_dict,
            stats=problem.extra_dict, features=op.features(problem),
            observed_ms=decision.observed if decision is not None else {},
            limits=listener.limits, reason=reason, key=plan.key)

    def _run(self, request: Request) -> None:
        from adaptive.regen.parametric import Parametric
        generator = self.generator or Parametric(self.registry, model=self._model)
        log.info("regenerating %s: %s", request.label, request.reason)
        result = run_loop(request, generator, self.verifier, self.budget, self.registry,
                          batch=self.batch, cancelled=self._stop.is_set)
        log.info("%s", result.summary())
        self.results.append(result)
        if result.promoted is not None:
            self._requested.discard(request.key)        # judge the new best afresh
            self._stats.pop(request.key, None)
        if self.on_result is not None:
            self.on_result(result)


# ---- the process-wide service (``ADAPTIVE_REGEN`` or adaptive.regen.enable()) -----------------

_service: Regenerator | None = None
_service_lock = threading.Lock()


def enable(generator: Generator | str | None = None, **kwargs) -> Regenerator:
    """Regenerate in the background for every dispatcher on the shared registry, now and
    later; winners are promoted into the shared registry. Idempotent.

    Args:
        generator: a generator or its name ("parametric", "hf", "openai"); default
            ``ADAPTIVE_REGEN`` (parametric when that is "off").
        **kwargs: passed to :class:`Regenerator` (threshold, budget, verifier, ...).
    """
    global _service
    from adaptive import config
    with _service_lock:
        if _service is None:
            registry = shared_registry()
            if generator is None or isinstance(generator, str):
                from adaptive.regen.chat import make_generator
                name = generator or config.get().regen_generator
                generator = make_generator("parametric" if name == "off" else name, registry)
            service = Regenerator(generator=generator, registry=registry, **kwargs)
            registry.observe(service)
            _service = service.start()
    return _service


def disable() -> None:
    """Stop the background service (after its loop in progress) and detach it."""
    global _service
    with _service_lock:
        service, _service = _service, None
    if service is None:
        return
    service.registry.unobserve(service)
    service.stop()
