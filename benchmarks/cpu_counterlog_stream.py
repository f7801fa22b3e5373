"""The counter log's cost on a warm host-bound stream, end to end, without a GPU: a host
dispatcher launching tiny kernels round-robin (``gpu_counterlog.py``'s host ``host_bound``
stream), the log off against on, in alternating rounds.

    PYTHONPATH=$PWD python benchmarks/cpu_counterlog_stream.py                  # this tree
    PYTHONPATH=/tmp/old python /tmp/old/benchmarks/cpu_counterlog_stream.py     # another

Each "on" round opens a fresh :class:`CounterLog` (its writer thread running at its
default flush interval, no NVML), attaches it, runs the stream untimed for ``--settle-s``,
times ``--launches`` launches and closes the log; each "off" round gets the same untimed
lead. So the "on" time includes the writer thread's share of the GIL, as in serving.
``--timer events`` logs through the cuda recorder (event pairs on a stand-in ``cupy``
whose runtime calls are C builtins that return at once: the Python-level work of the
H200's path, not the driver's); ``--timer host`` through the host recorder
(perf-counter pair). ``--govern`` lets the overhead governor change the interval (off by
default: a fixed ``--every`` compares trees at the same sampling rate).

Prints the median microseconds per launch off and on, the median of the rounds' paired
differences ("+us/launch") and the records written per round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

STREAM = [("softmax", [(8, 64)]), ("gemm", [(16, 16), (16, 16)]), ("softmax", [(4, 256)])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launches", type=int, default=30000, help="timed launches per round")
    p.add_argument("--rounds", type=int, default=10, help="rounds per mode")
    p.add_argument("--every", type=int, default=None,
                   help="log one launch in this many (default ADAPTIVE_COUNTER_LOG_EVERY)")
    p.add_argument("--timer", choices=("events", "host"), default="events")
    p.add_argument("--govern", action="store_true", help="the overhead governor on")
    p.add_argument("--settle-s", type=float, default=0.2, help="untimed lead per round")
    args = p.parse_args(argv)
    if args.timer == "events":
        from cpu_counterlog_overhead import install_fake_cupy
        install_fake_cupy()
    from adaptive import config
    from adaptive.counterlog import CounterLog
    from adaptive.counterlog.recorders import LogRecorder
    from adaptive.dispatch import Dispatcher
    from adaptive.policy import MeasureEach
    from profilers import EventTimer

    every = config.get().counter_log_every if args.every is None else args.every
    d = Dispatcher("host", policy=MeasureEach())
    d.sample_every = 0
    rng = np.random.default_rng(0)
    inputs = [(op, tuple(rng.standard_normal(s).astype(np.float32) for s in shapes))
              for op, shapes in STREAM]
    launch = d.launch

    def launches(k: int) -> None:
        for i in range(k):
            op, xs = inputs[i % 3]
            launch(op, *xs)

    for _ in range(200):                           # past exploration: every key committed
        launches(3)
    tmp = Path(tempfile.mkdtemp(prefix="clstream"))

    def one_round(mode: str, r: int) -> tuple[float, int]:
        clog = None
        if mode == "on":
            clog = CounterLog(tmp / f"r{r}.alog", sample_every=every, timing="events",
                              nvml=False, govern=args.govern, event_capacity=1 << 14).open()
            clog.attach(d)
            if args.timer == "events":             # the cuda recorder on a stand-in ring
                host = clog._recorders[d]
                timer = clog._timers[0] = EventTimer(1 << 14, None)
                rec = clog._recorders[d] = LogRecorder(clog, d, timer)
                rec.every = every
                d.add_recorder(rec)
                d.remove_recorder(host)
        deadline = time.monotonic() + args.settle_s
        while time.monotonic() < deadline:
            launches(48)
        t0 = time.perf_counter_ns()
        launches(args.launches)
        us = (time.perf_counter_ns() - t0) / args.launches / 1e3
        written = 0
        if clog is not None:
            stats = clog.close()
            assert stats.dropped == 0 and clog.last_error is None, (stats, clog.last_error)
            written = stats.written
        return us, written

    times = {"off": [], "on": []}
    written = []
    for r in range(-1, args.rounds):               # round -1: untimed warm-up
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            us, k = one_round(mode, r)
            if r >= 0:
                times[mode].append(us)
                if mode == "on":
                    written.append(k)
    diffs = [on - off for off, on in zip(times["off"], times["on"])]
    import adaptive
    print(f"cpu_counterlog_stream: tree {Path(adaptive.__file__).resolve().parents[1]}; "
          f"{args.timer} recorder, one launch in {every} logged"
          f"{' (governed)' if args.govern else ''}; {args.launches} launches x "
          f"{args.rounds} rounds per mode; {statistics.median(written):.0f} records a round")
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"  off {off:.3f} us/launch   on {on:.3f} us/launch   "
          f"+{statistics.median(diffs):.3f} us/launch (median of paired rounds; "
          f"best rounds {min(times['on']) - min(times['off']):+.3f})   loss "
          f"{1 - off / on:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
