"""The counter log's event path on a real device: raw event pairs on the caller's stream,
harvested without waiting (cudaEventElapsedTime's not-ready answer ends a harvest), and
every logged launch written with its event time."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from adaptive.ops import get_op

pytestmark = pytest.mark.gpu

SPIN = r'''extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64(); while (clock64() - t0 < cycles) {} }'''


def _spin(cp):
    kernel = cp.RawKernel(SPIN, "spin")

    def spin(cycles: int) -> None:
        kernel((1,), (1,), (np.int64(cycles),))
    return spin


def test_raw_pairs_time_work_on_a_non_default_stream_without_waiting(cp):
    from profilers import EventTimer
    spin = _spin(cp)
    timer = EventTimer(4, 0)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        spin(1000)                                           # warm (module load)
        slot = timer.start()                                 # on the current stream
        spin(80_000_000)                                     # ~40 ms at 2 GHz
        timer.stop(slot, tag="spin")
        assert timer.harvest() == []                         # still running: no wait
        assert timer.pending == 1 and timer.dropped == 0 and timer.status == "ok"
    stream.synchronize()
    (tag, time_ms), = timer.harvest()
    # on the wrong stream the pair would bracket nothing (non-blocking stream: ~0 ms)
    assert tag == "spin" and 10.0 < time_ms < 500.0
    assert timer.pending == 0 and not any(timer.busy)
    timer.close()


def test_logged_launches_carry_event_times_close_to_cuda_events(cp, tmp_path):
    from adaptive import Dispatcher
    from adaptive.counterlog import counter_log, read_log
    d = Dispatcher("cuda")
    d.sample_every = 0
    rng = np.random.default_rng(7)
    x = cp.asarray(rng.standard_normal((4099, 1537)).astype(np.float32))
    ref = get_op("softmax").reference(cp.asnumpy(x))
    for _ in range(3):
        d.launch("softmax", x)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(50):
        d.launch("softmax", x)
    end.record()
    end.synchronize()
    event_ms = cp.cuda.get_elapsed_time(start, end) / 50
    with counter_log(tmp_path / "gpu.alog", nvml=False) as clog:
        for _ in range(50):
            y = d.launch("softmax", x)
    assert np.abs(cp.asnumpy(y) - ref).max() < 1e-5
    assert clog.stats.written == 50 and clog.stats.dropped == 0
    recs = read_log(tmp_path / "gpu.alog").records
    assert {r["timer"] for r in recs} == {"cuda_event"}
    log_ms = statistics.median(r["time_ms"] for r in recs)
    assert abs(log_ms / event_ms - 1) < 0.25, (log_ms, event_ms)
