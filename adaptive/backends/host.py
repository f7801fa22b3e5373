"""The host backend: NumPy/SciPy variants on the CPU; the BLAS thread count is a config.

Thread counts are process-wide in BLAS libraries, so the backend remembers the count it
last set and only calls into threadpoolctl's controllers when a candidate needs another.

When several threads launch (a server's workers), each BLAS call runs with one thread:
N callers × a BLAS pool each would oversubscribe the cores and thrash the process-wide
setting between candidates. A candidate's own ``threads`` applies again once one
thread has launched alone for :data:`SHARED_HOLD_S`.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import threading
import time

import numpy as np

from adaptive import arrays
from adaptive.backends.base import PlanIO, released
from adaptive.backends.pysource import load_entry
from adaptive.errors import InputTypeError
from adaptive.timing import measure

_NP_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
SHARED_HOLD_S = 1.0   # after two threads last took turns, BLAS stays at one thread this long


class HostBackend:
    name = "host"
    arch = "host"
    native_kind = "numpy"

    def __init__(self):
        self.device = "cpu"
        self._blas = None
        self._threads = None
        self._peaks = None
        self._blas_lock = threading.Lock()
        self._last_thread: int | None = None   # the thread that launched last
        self._shared_until = 0.0               # monotonic time; 0: one thread launches

    # ---- device description -----------------------------------------------------------------
    def limits(self) -> dict:
        from adaptive import config
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        cap = config.get().max_threads
        return {"cpu_count": min(cpus, cap) if cap else cpus}

    def fingerprint(self) -> dict:
        return {"backend": "host", "name": platform.processor() or platform.machine(),
                "cpu_count": self.limits()["cpu_count"], "numpy": np.__version__,
                "python": sys.version.split()[0]}

    def peaks(self) -> dict:
        """Float32 BLAS rate and copy bandwidth: measured by the first process on this
        machine, then read from the cache folder (:mod:`adaptive.peaks`), so every process
        on one machine computes the same floors."""
        if self._peaks is None:
            from adaptive import config
            from adaptive.peaks import cached_peaks
            self._peaks = cached_peaks(self.fingerprint(), _measure_peaks,
                                       config.get().cache_dir)
        return self._peaks

    # ---- arrays -----------------------------------------------------------------------------
    def adapter(self, kind: str):
        if kind == "numpy":
            return None
        if kind in ("torch", "cupy", "cuda"):
            return arrays.to_numpy, arrays.from_numpy
        raise InputTypeError(f"the host backend cannot take {kind} arrays")

    def empty(self, shape: tuple, dtype: str):
        return np.empty(shape, _NP_DTYPES[dtype])

    def io(self, candidate, problem, shape: tuple, like):
        """``(alloc, adapter)`` of a plan: tensors stay tensors for variants with a
        ``torch_entry``; everything else runs on NumPy arrays (converted per call)."""
        if problem.kind == "torch" and candidate.variant.torch_entry:
            torch = sys.modules["torch"]
            alloc = functools.partial(torch.empty, shape, dtype=getattr(torch, problem.dtype),
                                      device=like.device)
            return PlanIO(alloc, None, returns=True)
        return PlanIO(functools.partial(self.empty, shape, problem.dtype),
                      self.adapter(problem.kind))

    def hold(self, stream_ptr: int, us: float) -> None:
        """Nothing to hold: host calls run as they are issued."""

    def watch_device(self, period_s: float = 0.1) -> str:
        return "host backend: no device counters to sample"

    def gate(self, stream_ptr: int, limit_us: float):
        """Nothing to hold: host calls run as they are issued."""
        return released

    def synchronize(self) -> None:
        """Host runs are synchronous: nothing to wait for."""

    def wait_stream(self, stream_ptr: int) -> None:
        """Host runs are synchronous: nothing to wait for."""

    def event_timer(self):
        """None: sampled host calls are timed with the perf counter."""
        return None

    def device_state(self) -> dict:
        return {}

    def stream_ptr(self, kind: str) -> int:
        return 0

    def stream_idle(self, stream_ptr: int) -> None:
        """None: host runs are synchronous, and their host-clock times include the issuing."""
        return None

    # ---- running ----------------------------------------------------------------------------
    def set_threads(self, n: int) -> None:
        with self._blas_lock:      # one caller at a time into threadpoolctl
            if self._blas is None:
                from threadpoolctl import ThreadpoolController
                self._blas = ThreadpoolController().select(user_api="blas").lib_controllers
            if self._threads == n:
                return
            for lib in self._blas:
                lib.set_num_threads(n)
            self._threads = n

    def blas_threads(self, threads: int) -> int:
        """The BLAS thread count for a call of a candidate asking for ``threads``: its own
        while one thread launches, 1 while several do (and :data:`SHARED_HOLD_S` after)."""
        me = threading.get_ident()
        last = self._last_thread
        if me != last:
            self._last_thread = me
            if last is not None:
                self._shared_until = time.monotonic() + SHARED_HOLD_S
        if self._shared_until:
            if time.monotonic() < self._shared_until:
                return 1
            self._shared_until = 0.0
        return threads

    def prepare(self, candidate, problem, op):
        variant = candidate.variant
        native = problem.kind == "torch" and variant.torch_entry
        fn = load_entry(variant, variant.torch_entry if native else None)
        config = candidate.config
        threads = config.pop("threads", None)
        kwargs = {**config, **problem.params_dict}
        bound = functools.partial(fn, **kwargs) if kwargs else fn
        if threads is None:
            def run(args, out):
                return bound(*args, out=out)   # torch entries return their result
        else:
            def run(args, out):
                want = self.blas_threads(threads)
                if self._threads != want:
                    self.set_threads(want)
                return bound(*args, out=out)
        return run

    def time_ms(self, fn, args, out, repeats: int = 1) -> list[float]:
        return list(measure(lambda: fn(args, out), reps=repeats, raise_errors=True).samples_ms)

    def device_timer(self, stream_ptr: int, gated: bool = True):
        """None: a host run is timed by the host's clock."""
        return None


def _measure_peaks() -> dict:
    """The best rates over a few sizes (cache-resident copies included, since inputs that
    fit in cache run at its bandwidth) and repeats: a ceiling, not a typical rate."""
    rng = np.random.default_rng(0)
    flops = 0.0
    for n in (384, 768):
        a = rng.standard_normal((n, n), dtype=np.float32)
        flops = max(flops, 2 * n**3 / _best_s(lambda: np.matmul(a, a), 3))
    bw = 0.0
    for n in (64 << 10, 1 << 20, 8 << 20):    # 256 KiB, 4 MiB and 32 MiB of float32
        src = rng.standard_normal(n).astype(np.float32)
        dst = np.empty_like(src)
        bw = max(bw, 2 * src.nbytes / _best_s(lambda: np.copyto(dst, src), 5))
    return {"flops_per_s": {d: flops for d in ("float16", "float32", "float64")},
            "bytes_per_s": bw}


def _best_s(fn, repeats: int) -> float:
    """The fastest of ``repeats`` runs after one warm-up, in seconds."""
    return measure(fn, warmup=1, reps=repeats, raise_errors=True).min_ms / 1e3

