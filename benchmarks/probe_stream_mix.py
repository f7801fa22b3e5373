"""Probe: what one ``sdpa_torch`` input costs the mixed attention stream.

Run S130 (H200) ran ``adaptive bench mixed``'s attention stream whole, pinned, its 240
calls over 6 inputs in the table's seeded order. With ``three_pass`` on every input it took
25.4 ms. With ``sdpa_torch`` on the 1024² input instead it took 31.8 ms: about 150 us a
call of that input more. Yet the re-timed price, 16 calls of that input back to back, puts
``sdpa_torch`` 0.010 ms ahead there. S131 showed that no call waits for the device.

This runs the same stream several ways, pinned and interleaved round by round (median wall
ms of ``--reps`` rounds):

- ``three_pass`` on every input;
- ``sdpa_torch`` on one input, for each input in turn;
- the same two with Python's garbage collector off.

For every way it also prints the host's median us per call of each input. Calls on
``--backend host`` use the host's variants (a dry run: the numbers mean nothing there).

    PYTHONPATH=$PWD python3 benchmarks/probe_stream_mix.py     # H200, about 30 s
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMES = {"cuda": ("three_pass", "sdpa_torch"), "host": ("host_materialised", "host_chunked")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda", choices=("cuda", "host"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--calls", type=int, default=40, help="calls per input (the table's 40)")
    args = p.parse_args(argv)
    from adaptive.bench.cli import _FULL, _to_backend
    from adaptive.dispatch import Dispatcher
    from adaptive.ops import OPS
    from adaptive.policy import MeasureEach
    from adaptive.timing import measure_each
    d = Dispatcher(args.backend, policy=MeasureEach())
    sync = d.backend.synchronize
    rng = np.random.default_rng(0)   # the mixed table's seed: its inputs and its order
    op = OPS["attention"]
    stream = _FULL["attention"]
    inputs = [_to_backend(op.make_inputs(dims, dtype, rng, **stats), d.backend.name)
              for dims, dtype, stats in stream]
    if args.backend == "host":   # the host's attention is slow: the small inputs only
        keep = [i for i, (dims, _, _) in enumerate(stream) if dims["Lk"] <= 512]
        inputs, stream = [inputs[i] for i in keep], [stream[i] for i in keep]
    order = [i for i in range(len(inputs)) for _ in range(args.calls)]
    rng.shuffle(order)
    base, other = NAMES[args.backend]

    def cand(i, name):
        return next(c for c in d.candidates("attention", *inputs[i]) if c.variant.name == name)
    ways = {f"{base} everywhere": [cand(i, base) for i in range(len(inputs))]}
    for j, (dims, _, _) in enumerate(stream):
        picks = [cand(i, other if i == j else base) for i in range(len(inputs))]
        ways[f"{other} on {dims['Lq']}x{dims['Lk']}"] = picks
    host_us: dict = {}

    def run_of(label, picks, collect):
        host_us[label] = [[] for _ in inputs]

        def run():
            was = gc.isenabled()
            if not collect:
                gc.disable()
            try:
                for i in order:
                    c = picks[i]
                    t0 = time.perf_counter_ns()
                    d.launch("attention", *inputs[i], variant=c.variant.name, config=c.config)
                    host_us[label][i].append((time.perf_counter_ns() - t0) / 1e3)
            finally:
                if was:
                    gc.enable()
        return run
    runs, labels = [], []
    for collect in (True, False):
        for way, picks in ways.items():
            labels.append(way + ("" if collect else ", gc off"))
            runs.append(run_of(labels[-1], picks, collect))
    ms = measure_each(runs, warmup=1, reps=args.reps, sync=sync, raise_errors=True)
    shapes = [f"{dims['Lq']}x{dims['Lk']}" for dims, _, _ in stream]
    print(f"attention stream, {len(order)} calls pinned: median wall ms of {args.reps} "
          f"rounds; host us a call per input ({', '.join(shapes)})")
    for label, m in zip(labels, ms):
        per = ", ".join(f"{statistics.median(v):.0f}" for v in host_us[label])
        print(f"  {label:<38} {m.median_ms:8.3f} ms   host us: {per}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
