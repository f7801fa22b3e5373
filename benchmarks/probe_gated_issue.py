"""Where an exploring sample's host issuing goes, for library candidates under the gate.

    PYTHONPATH=$PWD python3 benchmarks/probe_gated_issue.py     # H200, about 20 s
    PYTHONPATH=$PWD python3 benchmarks/probe_gated_issue.py --contention-shapes  # cuBLAS only

Runs S26 and S28 charged library candidates far more host issuing in exploring samples
than they take when called plainly: cuBLAS on gemm M=1 N=K=4096 (CuPy arrays) sampled at
0.199 ms against 0.036 ms replayed, ``sdpa_torch`` 251-285 us of issuing, cuBLAS through
torch on gemm 2048x16x2048 (tensors) 0.283 ms, so the learned policy committed our kernels
over cuBLAS (a 1.1B Llama's decode at 0.86x torch). This probe issues each candidate
plainly and as an exploring sample does (behind the stream's gate, with the gate's limit
at 1000 and at 200 us: a wait inside the call that tracks the limit is a synchronisation
that waits for the gate), prints the median host issuing of each, and a cProfile of the
gated calls (which Python-visible call holds the time).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def explored(adaptive, cp, torch) -> None:
    """The learned policy's own exploration, as in the selection benchmark's streams (each
    call synchronised): cuBLAS against one kernel of ours on shapes this process has not
    run, every sample the policy is given (device ms, the issuing charged) printed."""
    from adaptive.variants import Registry, shared_registry
    shared = shared_registry()
    for ours, what, args in (
            ("tc_wide", "cupy M=1 N=K=4096",
             (cp.random.rand(1, 4096).astype(cp.float16),
              cp.random.rand(4096, 4096).astype(cp.float16))),
            ("tc_wide", "torch M=2048 N=8 K=2048",
             (torch.randn(2048, 2048, device="cuda", dtype=torch.float16),
              torch.randn(2048, 8, device="cuda", dtype=torch.float16)))):
        d = adaptive.Dispatcher("cuda", device=0, policy="learned", registry=Registry(
            [shared.get("gemm", "cublas"), shared.get("gemm", ours)]))
        given, real = [], d.feedback

        def spy(plan, time_ms, issue_ms=0.0, _given=given, _real=real):
            _given.append(f"{plan.candidate.variant.name} {time_ms * 1e3:.1f}+"
                          f"{issue_ms * 1e3:.1f}")
            return _real(plan, time_ms, issue_ms)
        d.feedback = spy
        wall = []
        for _ in range(40):
            t0 = time.perf_counter_ns()
            d.launch("gemm", *args)
            d.backend.synchronize()
            wall.append((time.perf_counter_ns() - t0) / 1e3)
        d.harvest()
        plan = d.plan("gemm", *args)
        print(f"explored gemm {what}: committed {plan.candidate.label}; "
              f"{plan.decision.reason[:300] if plan.decision else ''}\n    samples (device "
              f"us + issuing charged us): {', '.join(given)}\n    issue charges "
              f"{d.issue_charges()}; wall per call (us) first 5 {[round(w) for w in wall[:5]]}"
              f", last 10 median {statistics.median(wall[-10:]):.1f}", flush=True)


def contention_shapes(adaptive, cp) -> None:
    """cuBLAS from CuPy arrays on the contention run's gemm inputs (run S70: the issuing
    charged to it was 76 us, then 51, where a held plan issued in 21.5 us in S55): each
    shape's first 8 issuings one by one (a new shape: cuBLAS's heuristics), then 50
    synchronised one at a time and 50 back to back (the device busy), min and median."""
    d = adaptive.Dispatcher("cuda", device=0)
    from adaptive.ops import get_op
    o = get_op("gemm")
    for m, n, k in ((16, 4096, 4096), (128, 4096, 4096), (2048, 2048, 2048)):
        args = (cp.random.rand(m, k).astype(cp.float16), cp.random.rand(k, n).astype(cp.float16))
        problem, key = o.problem(args, {}), o.key(args, {})
        for name in ("cublas", "tc_wide"):
            cand = next(c for c in d.candidates("gemm", *args) if c.variant.name == name)
            plan = d._prepare(o, problem, key, cand, args[-1])
            rows = {}
            for what, n_calls, sync in (("first", 8, True), ("synced", 50, True),
                                        ("back to back", 50, False)):
                times = []
                for _ in range(n_calls):
                    t0 = time.perf_counter_ns()
                    plan.run(args, None)
                    times.append((time.perf_counter_ns() - t0) / 1e3)
                    if sync:
                        d.backend.synchronize()
                d.backend.synchronize()
                rows[what] = times
            print(f"issuing gemm cupy M={m} N={n} K={k} {name}: first 8 "
                  f"{[round(t) for t in rows['first']]} us; synced min "
                  f"{min(rows['synced']):.1f} median {statistics.median(rows['synced']):.1f}; "
                  f"back to back min {min(rows['back to back']):.1f} median "
                  f"{statistics.median(rows['back to back']):.1f} us", flush=True)


def main() -> int:
    import cupy as cp
    import torch

    import adaptive
    from adaptive.ops import get_op
    contention_shapes(adaptive, cp)
    if "--contention-shapes" in sys.argv:
        return 0
    d = adaptive.Dispatcher("cuda", device=0)
    be = d.backend
    explored(adaptive, cp, torch)
    cases = []
    a = cp.random.rand(1, 4096).astype(cp.float16)
    b = cp.random.rand(4096, 4096).astype(cp.float16)
    cases.append(("gemm", "cupy M=1 N=K=4096", (a, b), {}))
    ta = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    tb = torch.randn(2048, 16, device="cuda", dtype=torch.float16)
    cases.append(("gemm", "torch M=2048 N=16 K=2048", (ta, tb), {}))
    q = cp.random.rand(4, 16, 1, 128).astype(cp.float16)
    k = cp.random.rand(4, 16, 2048, 128).astype(cp.float16)
    cases.append(("attention", "cupy B=4 H=16 Lq=1 Lk=2048 D=128", (q, k, k.copy()),
                  {"causal": True}))
    for op_name, what, args, params in cases:
        o = get_op(op_name)
        problem, key = o.problem(args, params), o.key(args, params)
        pool = d.candidates(op_name, *args, **params)
        lib = [c for c in pool if c.variant.torch_library or c.variant.name in
               ("cublas", "sdpa_torch", "sdpa")]
        ours = [c for c in pool if c not in lib][:1]
        stream = be.stream_ptr(problem.kind)
        for cand in lib + ours:
            plan = d._prepare(o, problem, key, cand, args[-1])
            plain, gated = [], {}
            for _ in range(5):
                plan.run(args, None)
            be.synchronize()
            for _ in range(30):
                t0 = time.perf_counter_ns()
                plan.run(args, None)
                plain.append((time.perf_counter_ns() - t0) / 1e3)
                be.synchronize()
            for limit in (1000.0, 200.0):
                times = []
                for _ in range(30):
                    release = be.gate(stream, limit)
                    t0 = time.perf_counter_ns()
                    plan.run(args, None)
                    times.append((time.perf_counter_ns() - t0) / 1e3)
                    release()
                    be.synchronize()
                gated[limit] = statistics.median(times)
            print(f"{op_name} {what}: {cand.label}: plain issuing median "
                  f"{statistics.median(plain):.1f} us; behind the gate (limit 1000 us) "
                  f"{gated[1000.0]:.1f} us, (limit 200 us) {gated[200.0]:.1f} us", flush=True)
            if cand in lib:
                prof = cProfile.Profile()
                for _ in range(20):
                    release = be.gate(stream, 1000.0)
                    prof.enable()
                    plan.run(args, None)
                    prof.disable()
                    release()
                    be.synchronize()
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(8)
                lines = [ln for ln in s.getvalue().splitlines() if ln.strip()][-9:]
                print("    cProfile of 20 gated calls (tottime s):\n    " + "\n    ".join(
                    ln[:170] for ln in lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
