"""Host timer: wall time and process CPU time around host-backend calls.

The host backend runs synchronously, so a wall-clock pair around the call is its time;
process CPU time alongside it tells a multi-threaded BLAS call (CPU time > wall time)
from one that waited (CPU time << wall time).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class HostTiming:
    """One timed host call."""

    wall_ms: float
    cpu_ms: float            # process CPU time (all threads) over the same interval

    @property
    def cpu_per_wall(self) -> float:
        """CPU time / wall time: about the number of busy threads."""
        return self.cpu_ms / self.wall_ms if self.wall_ms > 0 else 0.0


class HostTimer:
    """Times callables with a wall clock and process CPU time.

    Args:
        wall_ns: wall clock in ns (default ``time.perf_counter_ns``; tests pass a fake).
        cpu_ns: process CPU clock in ns (default ``time.process_time_ns``).

    Example:
        >>> timer = HostTimer()
        >>> result, t = timer.time(np.matmul, a, b)
        >>> t.wall_ms, t.cpu_ms
    """

    status = "ok"

    def __init__(self, wall_ns: Callable[[], int] = time.perf_counter_ns,
                 cpu_ns: Callable[[], int] = time.process_time_ns):
        self._wall_ns = wall_ns
        self._cpu_ns = cpu_ns

    def start(self) -> tuple[int, int]:
        """A token for :meth:`stop`."""
        return self._wall_ns(), self._cpu_ns()

    def stop(self, token: tuple[int, int]) -> HostTiming:
        wall0, cpu0 = token
        return HostTiming((self._wall_ns() - wall0) / 1e6, (self._cpu_ns() - cpu0) / 1e6)

    def time(self, fn: Callable, *args, **kwargs) -> tuple[object, HostTiming]:
        """Run ``fn(*args, **kwargs)``; return its result and the timing."""
        token = self.start()
        result = fn(*args, **kwargs)
        return result, self.stop(token)
