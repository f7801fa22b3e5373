"""``measure()`` on a real GPU: CUDA events time the device's work, the host clock counts
it only through the synchronise inside each sample; the backend and peak probes use it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaptive.timing import CudaEvents, measure

pytestmark = pytest.mark.gpu

HOLD_US = 500.0


@pytest.fixture(scope="module")
def backend():
    from adaptive import Dispatcher
    return Dispatcher("cuda").backend


def _hold(backend, cp):
    stream = cp.cuda.get_current_stream().ptr
    return lambda: backend.hold(stream, HOLD_US)


def test_events_time_the_kernel_and_the_host_clock_needs_the_sync(backend, cp):
    run = _hold(backend, cp)
    events = measure(run, warmup=1, reps=5, timer=CudaEvents(cp))
    synced = measure(run, warmup=1, reps=5, sync=backend.synchronize)
    unsynced = measure(run, warmup=1, reps=5)
    backend.synchronize()
    assert all(0.4 <= s <= 2.0 for s in events.samples_ms), events   # ~0.5 ms of spinning
    assert synced.min_ms >= 0.4, synced          # the wait for the GPU is in each sample
    assert unsynced.min_ms < 0.25, unsynced      # a launch alone returns before the GPU ends
    assert not (events.error or synced.error or unsynced.error)


def test_backend_time_ms_gives_one_event_time_per_run(backend, cp):
    times = backend.time_ms(lambda args, out: _hold(backend, cp)(), (), None, 3)
    assert len(times) == 3 and all(0.4 <= t <= 2.0 for t in times), times


def test_a_failing_run_is_an_inf_sample_and_the_device_stays_usable(backend, cp):
    def run():
        cp.empty((1 << 62,), np.uint8)   # an allocation the device refuses
    m = measure(run, warmup=0, reps=3, timer=CudaEvents(cp))
    assert m.samples_ms == (math.inf,) and m.error, m
    ok = measure(_hold(backend, cp), reps=2, timer=CudaEvents(cp))
    assert all(math.isfinite(s) for s in ok.samples_ms), ok


def test_peak_probe_copy_bandwidth_is_plausible(cp):
    from adaptive.backends.cuda_peaks import copy_bytes_per_s
    bw = copy_bytes_per_s(cp, nbytes=1 << 26, repeats=3)
    assert 1e11 < bw < 2e13, bw   # above 100 GB/s, below any HBM


def test_the_stream_gate_says_whether_it_ran_out_before_its_release(backend, cp):
    """A gate released after its hold ran out says so once the work after it has run (its
    ticket in the mapped expiry ring); one released in time does not, nor does the one
    after an expired one. An event pair behind an expired gate reads the host's delay."""
    import time
    stream = cp.cuda.get_current_stream().ptr
    x = cp.ones(1 << 20, np.float32)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    late = backend.gate(stream, 50.0)            # released 20 ms later: runs out at 50 us
    start.record()
    time.sleep(0.02)
    x += 1
    end.record()
    late()
    on_time = backend.gate(stream, 200_000.0)     # released at once: holds until then
    x += 1
    on_time()
    backend.synchronize()
    assert late.expired() and not on_time.expired()
    assert cp.cuda.get_elapsed_time(start, end) > 15.0   # the pair read the sleep
    assert float(x[0]) == 3.0
