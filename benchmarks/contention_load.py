"""The co-running load of the contention run (benchmarks/gpu_contention.py).

``stream``: a thread of this process keeps ``fraction`` of the SMs busy with a spin kernel
on its own non-blocking stream (``fraction x SMs`` CTAs of 1024 threads, each holding the
opt-in maximum of shared memory, so one CTA an SM), launched back to back with two in
flight; ``process``: the same loop in a child process (this module as a script: it says
``ready`` on stdout once running and stops on ``stop`` on stdin). On the host the load is
threads burning ``fraction`` of the cores with large NumPy multiplies (they release the
GIL). Each reports its throughput while it ran against its rate alone, measured just
before it starts (one spin launch alone is calibrated to ``LOAD_LAUNCH_MS``).

    python -m benchmarks.contention_load cuda 0.5     # a load process, by hand
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

SPIN_SOURCE = r"""
extern "C" __global__ void contention_spin(long long iters, float* sink) {
    extern __shared__ float pad[];          // sized at launch: one CTA per SM
    float x = threadIdx.x * 1e-3f;
    for (long long i = 0; i < iters; ++i) x = fmaf(x, 1.0001f, 1e-7f);
    if (x == 12345.678f) { pad[0] = x; sink[blockIdx.x] = pad[0]; }   // keeps the loop
}
"""
LOAD_LAUNCH_MS = 2.0        # one spin launch alone (calibrated); the host keeps 2 in flight
HOST_LOAD_ELEMENTS = 1 << 20



def run_load(device: str, fraction: float, stop, ready) -> dict:
    """Keep ``fraction`` of the device busy until ``stop()``; call ``ready(info)`` once
    running. Returns the load's throughput, alone (just before) and while it ran."""
    if device == "cuda":
        return _cuda_load(fraction, stop, ready)
    return _host_load(fraction, stop, ready)


def _cuda_load(fraction: float, stop, ready) -> dict:
    import cupy as cp
    with cp.cuda.Device(0):
        props = cp.cuda.runtime.getDeviceProperties(0)
        sms = int(props["multiProcessorCount"])
        ctas = max(1, round(fraction * sms))
        smem = int(props.get("sharedMemPerBlockOptin", props["sharedMemPerBlock"]))
        raw = cp.RawModule(code=SPIN_SOURCE).get_function("contention_spin")
        raw.max_dynamic_shared_size_bytes = smem     # as the cuda backend launches
        fn = raw.kernel
        sink = cp.zeros(ctas, np.float32)
        stream = cp.cuda.Stream(non_blocking=True)

        def launch(iters):
            fn((ctas,), (1024,), (np.int64(iters), sink), smem, stream)

        def timed(iters) -> float:
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            launch(iters)
            end.record(stream)
            end.synchronize()
            return cp.cuda.get_elapsed_time(start, end)
        timed(1 << 12)                                  # load the module, warm the clocks
        probe = 1 << 14
        iters = max(1, int(probe * LOAD_LAUNCH_MS / max(timed(probe), 1e-3)))
        alone_ms = statistics.median(timed(iters) for _ in range(3))
        ready({"ctas": ctas, "sm_count": sms, "threads": 1024, "shared_bytes": smem})
        launches, inflight = 0, deque()
        t0 = time.perf_counter()
        while not stop():
            launch(iters)
            event = cp.cuda.Event(disable_timing=True)
            event.record(stream)
            inflight.append(event)
            launches += 1
            while len(inflight) > 2:
                if inflight[0].done:
                    inflight.popleft()
                else:
                    time.sleep(LOAD_LAUNCH_MS / 4e3)    # sleeping lets the launching thread run
        stream.synchronize()
        wall_s = time.perf_counter() - t0
    rate = launches / wall_s if wall_s > 0 else 0.0
    return {"kind": "spin kernel", "ctas": ctas, "sm_count": sms, "shared_bytes": smem,
            "iters": iters, "alone_ms": alone_ms, "launches": launches, "wall_s": wall_s,
            "launches_per_s": rate, "vs_alone": rate * alone_ms / 1e3}


def _host_load(fraction: float, stop, ready) -> dict:
    cores = os.cpu_count() or 1
    threads = max(1, round(fraction * cores))
    done = [0] * threads
    halt = threading.Event()

    def burn(i: int) -> None:
        a = np.ones(HOST_LOAD_ELEMENTS)
        b = np.full(HOST_LOAD_ELEMENTS, 1.0000001)
        c = np.empty(HOST_LOAD_ELEMENTS)
        while not halt.is_set():
            np.multiply(a, b, out=c)                    # releases the GIL: a core busy
            done[i] += 1
    a = np.ones(HOST_LOAD_ELEMENTS)
    c = np.empty(HOST_LOAD_ELEMENTS)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.05:
        np.multiply(a, a, out=c)
        n += 1
    alone_per_s = n / (time.perf_counter() - t0)       # one thread, nothing else running
    workers = [threading.Thread(target=burn, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    ready({"threads": threads, "cores": cores})
    t0 = time.perf_counter()
    while not stop():
        time.sleep(0.005)
    halt.set()
    for w in workers:
        w.join()
    wall_s = time.perf_counter() - t0
    rate = sum(done) / wall_s if wall_s > 0 else 0.0
    return {"kind": "numpy multiply threads", "threads": threads, "cores": cores,
            "alone_per_s": alone_per_s * threads, "launches": sum(done), "wall_s": wall_s,
            "launches_per_s": rate, "vs_alone": rate / (alone_per_s * threads)}


class Load:
    """A co-running load, started and stopped with a handshake: ``stream`` in a thread of
    this process, ``process`` in a child process (this module run as a script) that says
    ``ready`` on its stdout and stops on ``stop`` on its stdin."""

    def __init__(self, kind: str, device: str, fraction: float):
        if kind not in ("stream", "process"):
            raise ValueError(f"expected a load kind 'stream' or 'process', got {kind!r}")
        self.kind, self.device, self.fraction = kind, device, fraction
        self.info: dict = {}
        self.result: dict = {}

    def start(self, timeout_s: float = 120.0) -> dict:
        if self.kind == "stream":
            self._halt = threading.Event()
            started = threading.Event()

            def ready(info):
                self.info = info
                started.set()

            def body():
                try:
                    self.result = run_load(self.device, self.fraction, self._halt.is_set,
                                           ready)
                except BaseException as exc:  # noqa: BLE001 (said by start/stop)
                    self.result = {"error": f"{type(exc).__name__}: {exc}"}
                    started.set()
            self._thread = threading.Thread(target=body, daemon=True, name="load")
            self._thread.start()
            if not started.wait(timeout_s) or "error" in self.result:
                raise RuntimeError(f"the stream load did not start: {self.result}")
            return self.info
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.contention_load", self.device,
             str(self.fraction)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=str(ROOT))
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        message = self._next(timeout_s)
        if not message.get("ready"):
            self._proc.kill()
            raise RuntimeError(f"the load process did not start: {message}")
        self.info = message["info"]
        return self.info

    def _read(self) -> None:
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _next(self, timeout_s: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            return {"error": f"no answer in {timeout_s:.0f} s"}
        try:
            return json.loads(line) if line else {"error": "the load process ended"}
        except json.JSONDecodeError:
            return {"error": f"unreadable answer {line[:200]!r}"}

    def stop(self, timeout_s: float = 60.0) -> dict:
        if self.kind == "stream":
            self._halt.set()
            self._thread.join(timeout_s)
            return self.result
        try:
            self._proc.stdin.write("stop\n")
            self._proc.stdin.flush()
        except OSError:
            pass
        self.result = self._next(timeout_s).get("result", {"error": "no result"})
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        return self.result


def worker(device: str, fraction: float) -> int:
    """The load process: ``{"ready": true, "info": ...}`` once running, then ``{"result":
    ...}`` after ``stop`` (or end of input) on stdin."""
    halt = threading.Event()

    def wait_for_stop():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        halt.set()

    def ready(info):
        print(json.dumps({"ready": True, "info": info}), flush=True)
        threading.Thread(target=wait_for_stop, daemon=True).start()
    result = run_load(device, fraction, halt.is_set, ready)
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1], float(sys.argv[2])))
