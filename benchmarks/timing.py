"""CUDA-event timing shared by the GPU benchmarks: warm-up, L2 flush, median of reps.

Before each run (warm-up too) a buffer of twice the L2 size is overwritten, so inputs
come from memory, not L2; the flush is queued ahead of the start event, which keeps the
GPU busy while the host issues the launch (host overhead stays out of the measured time).
The loop is :func:`adaptive.timing.measure` with :class:`~adaptive.timing.CudaEvents`.
"""

from __future__ import annotations

import statistics

from adaptive.timing import CudaEvents, measure


class Timer:
    def __init__(self, cp, l2_bytes: int):
        self.cp = cp
        self.scratch = cp.empty(max(2 * l2_bytes, 64 << 20) // 4, "float32")
        self.events = CudaEvents(cp)

    def time_ms(self, fn, warmup: int = 3, reps: int = 20) -> dict:
        """Median, min and spread (p90 - p10) of ``fn()``'s GPU time in ms."""
        m = measure(fn, warmup=warmup, reps=reps, timer=self.events,
                    flush=lambda: self.scratch.fill(0), raise_errors=True)
        times = sorted(m.samples_ms)
        return {"median_ms": statistics.median(times), "min_ms": times[0],
                "spread_ms": times[int(0.9 * (reps - 1))] - times[int(0.1 * (reps - 1))],
                "reps": reps}
