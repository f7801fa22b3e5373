"""Per-call host cost of a warm adaptive launch on PyTorch tensors, against calling torch.

The cuda backend's tensor path (results from torch's allocator, library variants called
with the tensors as they are) is run here on CPU tensors through a host variant with the
same shape of code (``torch_entry`` = ``torch.mm``), so the dispatcher's own cost per call
shows: key, lookup, allocation, call. Small matrices keep the arithmetic out of the way.

    python benchmarks/cpu_torch_overhead.py [--calls 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_SOURCE = textwrap.dedent('''
    def gemm_numpy(a, b, out):
        out[...] = a @ b

    def gemm_torch(a, b, out=None):
        import torch
        return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)
''')


def _per_call_us(fn, calls: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(times)


def measure(calls: int = 20000, rounds: int = 7) -> list[dict]:
    import torch
    import torch.nn.functional as F

    import adaptive
    from adaptive import config
    from adaptive.variants import Registry, variant_from_dict

    torch.set_num_threads(1)
    v = variant_from_dict({"name": "torch_mm", "backend": "host", "language": "python",
                           "entry": "gemm_numpy", "torch_entry": "gemm_torch",
                           "source": _SOURCE}, "gemm")
    with config.override(sample_every=0):
        d = adaptive.Dispatcher(backend="host", registry=Registry([v]))
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    w = b.t().contiguous()
    run = d.run
    args, params = (a, b), {}
    run("gemm", args, None, params)
    plan = d.plan("gemm", a, b)
    cases = {
        "torch.mm(a, b)": lambda: torch.mm(a, b),
        "F.linear(a, w)": lambda: F.linear(a, w),
        "Dispatcher.run": lambda: run("gemm", args, None, params),
        "Dispatcher.launch": lambda: d.launch("gemm", a, b),
        "held Dispatcher.plan": lambda: plan.run(args, None),
    }
    rows = [{"case": name, "us_per_call": _per_call_us(fn, calls, rounds)}
            for name, fn in cases.items()]
    base = rows[0]["us_per_call"]
    for r in rows:
        r["added_us"] = r["us_per_call"] - base
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=7)
    ns = p.parse_args(argv)
    rows = measure(ns.calls, ns.rounds)
    print(f"{'case':<20} {'us/call':>9} {'vs torch.mm':>12}")
    for r in rows:
        print(f"{r['case']:<20} {r['us_per_call']:>9.2f} {r['added_us']:>+12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
