"""CUDA-event timing shared by the GPU benchmarks: warm-up, L2 flush, median of reps.

Before each timed run a buffer of twice the L2 size is overwritten, so inputs come from
memory, not L2; the flush is queued ahead of the start event, which keeps the GPU busy
while the host issues the launch (host overhead stays out of the measured time).
"""

from __future__ import annotations

import statistics


class Timer:
    def __init__(self, cp, l2_bytes: int):
        self.cp = cp
        self.scratch = cp.empty(max(2 * l2_bytes, 64 << 20) // 4, "float32")

    def time_ms(self, fn, warmup: int = 3, reps: int = 20) -> dict:
        """Median, min and spread (p90 - p10) of ``fn()``'s GPU time in ms."""
        cp = self.cp
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            self.scratch.fill(0)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        times.sort()
        return {"median_ms": statistics.median(times), "min_ms": times[0],
                "spread_ms": times[int(0.9 * (reps - 1))] - times[int(0.1 * (reps - 1))],
                "reps": reps}
