"""Host cost of a patched ``nn.Linear`` forward against a plain one, on tiny CPU tensors.

The matmul is tiny, so the difference is the patched layer's Python work per call (reshape,
one ``adaptive.launch``: key, lookup, plan run, conversions on the host backend) and
nothing else. The patched forward's own part is also timed alone, with ``launch``
replaced by a call of the plain matmul, to separate it from the dispatcher's.

    python benchmarks/cpu_patched_linear.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _per_call_us(fn, x, calls: int, rounds: int = 5) -> float:
    for _ in range(2000):   # the adaptive plan explores its first calls; measure it committed
        fn(x)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn(x)
        times.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(times)


def main(calls: int = 20000) -> list[dict]:
    import torch
    from adaptive.integrations import linear as linear_mod
    from adaptive.integrations import transformers as at
    torch.set_num_threads(1)
    rows = []
    for tokens, features in ((1, 16), (4, 64)):
        plain = torch.nn.Linear(features, features, bias=True).eval()
        patched = at.AdaptiveLinear(torch.nn.Linear(features, features, bias=True), "dense",
                                    "bench").eval()
        x = torch.randn(1, tokens, features)
        with torch.no_grad():
            t_plain = _per_call_us(plain, x, calls)
            t_patched = _per_call_us(patched, x, calls)
            real = linear_mod.AdaptiveLinear._launch
            linear_mod.AdaptiveLinear._launch = lambda self, op, a, b, x: a @ b  # layer only
            try:
                t_layer = _per_call_us(patched, x, calls)
            finally:
                linear_mod.AdaptiveLinear._launch = real
        rows.append({"tokens": tokens, "features": features, "plain_us": t_plain,
                     "patched_us": t_patched, "layer_only_us": t_layer,
                     "overhead_us": t_patched - t_plain})
        print(f"x [1, {tokens}, {features}]: nn.Linear {t_plain:6.2f} us/call, patched "
              f"{t_patched:6.2f} us/call (+{t_patched - t_plain:.2f}); the patched layer "
              f"with a plain matmul for launch {t_layer:6.2f} us/call")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    main(parser.parse_args().calls)
