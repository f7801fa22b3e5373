"""Where CUPTI's cost comes from, on the GPU-bound and host-bound streams of
``gpu_counterlog.py``: launches per second with nothing on, against CUPTI's activity
recording alone (no counter log, no tagging), the NVML/GPM sampler alone, both, CUPTI
with every API record (widened), and an ungoverned CUPTI counter log without NVML.
Configurations alternate with "off" blocks; the median of ``--blocks`` blocks each.

    PYTHONPATH=$PWD python3 benchmarks/probe_cupti_cost.py      # H200, about 1 minute
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_counterlog import STREAMS, committed, make_inputs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--block-s", type=float, default=0.6)
    args = p.parse_args(argv)
    import cupy

    from adaptive.counterlog import CounterLog
    from adaptive.dispatch import Dispatcher
    from profilers.cupti import shared_activity
    from profilers.nvml import NvmlSampler, nvml_device
    d = Dispatcher("cuda")
    d.sample_every = 0
    act = shared_activity()
    print(f"CUPTI: {act.status}", flush=True)
    act.pause()

    def rate(inputs) -> float:
        n = 0
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.block_s:
            for op, xs in inputs:
                d.launch(op, *xs)
            n += len(inputs)
        cupy.cuda.Device().synchronize()
        return n / (time.perf_counter() - t0)

    def cupti_on():
        shared_activity()
        return act.pause

    def nvml_on():
        s = NvmlSampler(nvml_device(0)).start()
        return s.stop

    def both():
        stops = [cupti_on(), nvml_on()]
        return lambda: [s() for s in stops]

    def log_cupti():
        clog = CounterLog("/tmp/probe.alog", timing="cupti", nvml=False, govern=False).open()
        clog.attach(d)
        return clog.close

    def widened():
        shared_activity()
        act.widen()
        return act.pause

    configs = [("cupti activity alone", cupti_on), ("nvml/gpm sampler alone", nvml_on),
               ("cupti + nvml", both), ("cupti counter log, no nvml", log_cupti),
               ("cupti activity, every API record", widened)]
    for name in ("gpu_bound", "host_bound"):
        inputs = make_inputs("cuda", STREAMS["cuda"][name], seed=len(name))
        for op, xs in inputs:
            committed(d, op, xs)
        rate(inputs)
        print(f"{name}:", flush=True)
        for label, start in configs:
            offs, ons = [], []
            for _ in range(args.blocks):
                offs.append(rate(inputs))
                stop = start()
                time.sleep(0.05)
                ons.append(rate(inputs))
                stop()
            off, on = statistics.median(offs), statistics.median(ons)
            print(f"  {label:<34} off {off:>9.0f}/s  on {on:>9.0f}/s  loss {1 - on / off:+.1%}"
                  f"  (narrowed {act.narrowed}, counts {act.counts})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
