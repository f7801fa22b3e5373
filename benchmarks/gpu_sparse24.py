"""2:4 sparse MLP weights on the H200: dense cuBLAS, cuSPARSELt, our sparse24_mma and
sparse24_stream kernels, and what the dispatcher chooses, per token count.

    PYTHONPATH=$PWD python3 benchmarks/gpu_sparse24.py --out $OUT            # H200, < 3 min
    PYTHONPATH=$PWD python3 benchmarks/gpu_sparse24.py --tokens 1,16,64 --out $OUT  # issue 13
    python benchmarks/gpu_sparse24.py --device host --quick --out /tmp/s24   # a CPU dry run

Weights [M, K] = 14336 x 4096 (up-projection), 4096 x 14336 (down), 4096 x 4096, random
float16 pruned to 2:4 (the 2 smallest magnitudes of every 4 set to zero), times b [K, N]
for token counts N = 1, 16, 64, 256, 512, 2048, 4096 (spmm: out = w @ b, b = x^T).
  * dense:      torch.matmul on the pruned dense weight (cuBLAS);
  * cusparselt: torch._cslt_sparse_mm on torch._cslt_compress(weight), b's columns padded
                to a multiple of 8 as torch.sparse's semi-structured path does;
  * sparse24_mma: each fitting config, the best named (N <= 512);
  * sparse24_stream: each fitting config, the best named (N <= 64); every config's time is
                in the JSON (``config_times_ms``), for pruning its space;
  * dispatcher: Dispatcher.launch left to choose (PyTorch tensors in and out), after
                warm-up calls until its decision for the input is committed. The dispatcher
                is started as ``adaptive.launch``'s is (``adaptive.runtime.start``: the
                shipped pack for this device) and warmed up as a server warms up, inside
                ``adaptive.unbounded_exploration()``: run S98, warmed up under the
                exploration budget, had most inputs deferred to dense cuBLAS (the library
                candidate) unexplored, cuSPARSELt's 1.28-1.44x at N >= 512 never tried.
Timing: warm-up, then batches between CUDA events queued behind a spin kernel (host
overhead hidden: device time), median of 5 (benchmarks/gpu_spmm_attention.Timer).
Prints each as a speed ratio to dense and to the better of dense and cuSPARSELt (higher is
faster), then the issue's targets. Then the same three ways (dense, cuSPARSELt and the
dispatcher) in an eager loop's regime: the wall time per call of LOOP_CALLS calls issued
back to back and synchronised once (host issuing included: where the host is slower than
the kernels, the caller pays the issuing), the least of LOOP_ROUNDS rounds, the ways
interleaved. The dispatcher charges a host-bound class's candidates in that regime, so
this is the table its choice is read against; the targets stay on device time. Writes
``gpu_sparse24.json`` to the output folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [(14336, 4096), (4096, 14336), (4096, 4096)]      # weight [M, K]
TOKENS = [1, 16, 64, 256, 512, 2048, 4096]
QUICK_SHAPES = [(256, 128), (96, 320)]
QUICK_TOKENS = [1, 16, 64, 256]
WARMUP_CALLS = 600       # at most, per input, before the dispatcher's decision is timed
WARMUP_S = 8.0           # and at most this long (S99: 600 calls or 4 s left every N <= 64
                         # exploring)
TARGET_SMALL_N = 1.4     # dispatcher / dense at N <= 64 (issue 13)
KERNELS = ("sparse24_mma", "sparse24_stream")     # our variants, each config timed
LOOP_CALLS = 50          # calls a round in the eager-loop regime, synchronised once
LOOP_ROUNDS = 5


class HostTimer:
    """Median wall time of ``fn()`` over a few runs (the dry run's stand-in for CUDA events)."""

    def __call__(self, fn) -> float:
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return float(statistics.median(times))


def loop_ms(fns: dict, sync, calls: int = LOOP_CALLS, rounds: int = LOOP_ROUNDS) -> dict:
    """{name: wall ms per call}: each of ``fns`` called ``calls`` times back to back, then
    ``sync``; the least over ``rounds`` rounds, the ways interleaved round by round (one
    warm-up round first)."""
    best = {name: math.inf for name in fns}
    for r in range(rounds + 1):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            if r:
                best[name] = min(best[name], (time.perf_counter() - t0) * 1e3 / calls)
    return best


def _pruned_host(rng, m, k) -> np.ndarray:
    from adaptive.ops.spmm import prune_24
    return prune_24(rng.standard_normal((m, k)).astype(np.float16))


class CudaSide:
    """Inputs and baselines on the GPU: torch tensors over CuPy memory."""

    def __init__(self):
        import cupy as cp
        import torch

        from adaptive.dispatch import Dispatcher
        from benchmarks.gpu_spmm_attention import Timer
        self.cp, self.torch = cp, torch
        from adaptive.runtime import start
        self.dispatcher = start(Dispatcher(backend="cuda"))
        self.timer = Timer(cp)
        self.sync = torch.cuda.synchronize
        self.has_cslt = torch.backends.cusparselt.is_available()

    def weight(self, rng, m, k):
        """Random float16 [m, k] pruned to 2:4 on the GPU (k % 4 == 0): the 2 largest
        magnitudes of every 4 kept."""
        from adaptive.ops.sparse import SparseWeight
        torch = self.torch
        gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 31)))
        dense = torch.randn((m, k // 4, 4), generator=gen, device="cuda", dtype=torch.float16)
        keep = torch.zeros_like(dense, dtype=torch.bool)
        keep.scatter_(2, dense.abs().topk(2, dim=2).indices, True)
        dense = torch.where(keep, dense, torch.zeros_like(dense)).reshape(m, k).contiguous()
        w = SparseWeight(self.cp.from_dlpack(dense), dtype="float16")
        packed = self.torch._cslt_compress(dense) if self.has_cslt else None
        return w, dense, packed

    def tokens(self, rng, k, n):
        return self.torch.from_numpy(
            (rng.standard_normal((k, n)) / math.sqrt(k / 2)).astype(np.float16)).cuda()

    def dense_fn(self, dense, b):
        out = self.torch.empty((dense.shape[0], b.shape[1]), dtype=dense.dtype, device="cuda")
        return lambda: self.torch.matmul(dense, b, out=out)

    def cslt_fn(self, packed, b):
        if packed is None:
            return None
        torch, n = self.torch, b.shape[1]
        if n % 8:
            padded = torch.zeros((b.shape[0], n + (-n) % 8), dtype=b.dtype, device="cuda")

            def run():
                padded[:, :n] = b
                return torch._cslt_sparse_mm(packed, padded)[:, :n].contiguous()
            return run
        return lambda: torch._cslt_sparse_mm(packed, b)


class HostSide:
    """The dry run: NumPy dense, no cuSPARSELt, the host dispatcher."""

    def __init__(self):
        from adaptive.dispatch import Dispatcher
        from adaptive.runtime import start
        self.dispatcher = start(Dispatcher(backend="host"))
        self.timer = HostTimer()
        self.sync = lambda: None

    def weight(self, rng, m, k):
        from adaptive.ops.sparse import SparseWeight
        dense = _pruned_host(rng, m, k)
        return SparseWeight(dense, dtype="float16"), dense.astype(np.float32), None

    def tokens(self, rng, k, n):
        return (rng.standard_normal((k, n)) / math.sqrt(k / 2)).astype(np.float16)

    def dense_fn(self, dense, b):
        b32 = b.astype(np.float32)
        return lambda: dense @ b32

    def cslt_fn(self, packed, b):
        return None


def _warm(dispatcher, w, b) -> tuple[str, str]:
    """Launch until the dispatcher's decision for (w, b) is committed, as a server's
    warm-up does (no exploration budget): its label (with whether it is still exploring or
    was deferred to the library unexplored) and the policy's account of it: the calls and
    seconds the warm-up took, and the input class's history (what it explored, each
    candidate's samples, why it committed; still exploring, the samples so far: run S100
    left every 2:4 input of N <= 64 exploring after 600 calls, its history the miss
    alone)."""
    import adaptive
    from adaptive.ops import get_op
    decision, t0, calls = None, time.perf_counter(), 0
    with adaptive.unbounded_exploration():
        for calls in range(1, WARMUP_CALLS + 1):
            dispatcher.launch("spmm", w, b)
            decision = dispatcher.decision("spmm", w, b)
            if decision is not None and decision.settled:
                break
            if time.perf_counter() - t0 > WARMUP_S:
                break
    if decision is None:
        return "?", ""
    seconds = time.perf_counter() - t0
    plan = dispatcher.current_plan(get_op("spmm").key((w, b), {}))
    state = dispatcher.policy.state(plan.class_key) if plan is not None else None
    history = " | ".join(state.history) if state is not None else decision.reason
    if state is not None and not decision.settled:   # still exploring: what has come back
        history += " | samples so far: " + ", ".join(
            f"{c.label} n={len(got)}" + (f" median {got.median():.4g}" if len(got) else "")
            for c, got in state.observed.items())
        timer = getattr(dispatcher, "_timer", None)   # the dispatcher's ring of event pairs
        if timer is not None:
            history += (f" | event pairs pending {timer.pending}, dropped {timer.dropped}, "
                        f"status {timer.status}")
    return decision.candidate.label + (" (still exploring)" if not decision.settled else
                                       " (deferred)" if "deferred" in decision.reason
                                       else ""), \
        f"{calls} calls in {seconds:.2f} s: {history}"


def _time_kernel(side, w, b, name: str) -> list[tuple[float, dict]]:
    """(time, config) for each fitting config of our variant ``name``, fastest first (empty
    when none fits or the backend has no such variant)."""
    from adaptive.ops import get_op
    d = side.dispatcher
    variants = [v for v in d.registry.variants("spmm", d.backend.name) if v.name == name]
    if not variants:
        return []
    (v,) = variants
    scope = get_op("spmm").problem((w, b), {}).scope()
    timed = []
    for config in v.space.configs(d.limits):
        if not v.fits(scope, config):
            continue
        try:
            t = side.timer(lambda c=config: d.launch("spmm", w, b, variant=v.name, config=c))
        except Exception as exc:  # noqa: BLE001 (a failing config is a line, not a crash)
            print(f"  {name} {config}: {type(exc).__name__}: {exc}"[:300], flush=True)
            continue
        timed.append((t, config))
    return sorted(timed, key=lambda x: x[0])


def bench(side, shapes, tokens, budget_s: float) -> list[dict]:
    rng = np.random.default_rng(0)
    rows, t_start = [], time.perf_counter()
    for m, k in shapes:
        if time.perf_counter() - t_start > budget_s:
            print(f"budget of {budget_s:.0f} s spent: weight {m}x{k} not timed", flush=True)
            continue
        t0 = time.perf_counter()
        w, dense, packed = side.weight(rng, m, k)
        print(f"weight {m}x{k}: built in {time.perf_counter() - t0:.1f} s "
              f"(2:4: {w.is_2to4})", flush=True)
        for n in tokens:
            if time.perf_counter() - t_start > budget_s:
                print(f"budget of {budget_s:.0f} s spent: {m}x{k} N={n} not timed", flush=True)
                continue
            b = side.tokens(rng, k, n)
            dense_fn = side.dense_fn(dense, b)
            times = {"dense": side.timer(dense_fn)}
            cslt = side.cslt_fn(packed, b)
            if cslt is not None:
                times["cusparselt"] = side.timer(cslt)
            configs, config_times = {}, {}
            for name in KERNELS:
                timed = _time_kernel(side, w, b, name)
                if timed:
                    times[name], configs[name] = timed[0]
                    config_times[name] = [[c, t] for t, c in timed]
            chosen, why = _warm(side.dispatcher, w, b)
            times["dispatcher"] = side.timer(lambda: side.dispatcher.launch("spmm", w, b))
            ways = {"dense": dense_fn, "dispatcher": lambda: side.dispatcher.launch("spmm", w, b)}
            if cslt is not None:
                ways["cusparselt"] = cslt
            loop = loop_ms(ways, side.sync)
            row = {"M": m, "K": k, "N": n, "times_ms": times, "loop_ms": loop,
                   "kernel_configs": configs, "config_times_ms": config_times,
                   "chosen": chosen, "why": why}
            rows.append(row)
            print(f"{m}x{k} N={n}: " + ", ".join(f"{name}={v:.4f}" for name, v in times.items())
                  + f" ms; chosen {chosen}" + "".join(f"; best {name} {c}"
                                                      for name, c in configs.items())
                  + f"\n  why: {why[:2000]}", flush=True)
    return rows


def ratios(row: dict) -> dict[str, float]:
    """Speed ratios (higher is faster): each timing to dense, and to the better of dense
    and cuSPARSELt ("best_torch")."""
    t = row["times_ms"]
    best_torch = min(t["dense"], t.get("cusparselt", math.inf))
    out = {}
    for name, v in t.items():
        out[f"{name}/dense"] = t["dense"] / v
        out[f"{name}/best_torch"] = best_torch / v
    return out


def targets(rows: list[dict]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) per weight shape: the dispatcher >= 1.4x dense at N <= 64, and
    >= the better of dense and cuSPARSELt at every N."""
    out = []
    for m, k in dict.fromkeys((r["M"], r["K"]) for r in rows):
        mine = [r for r in rows if (r["M"], r["K"]) == (m, k)]
        small = [(r["N"], ratios(r)["dispatcher/dense"]) for r in mine if r["N"] <= 64]
        if small:
            n, worst = min(small, key=lambda x: x[1])
            out.append((f"{m}x{k}: dispatcher >= {TARGET_SMALL_N}x dense at N <= 64",
                        f"worst {worst:.2f}x (N={n})", worst >= TARGET_SMALL_N))
        every = [(r["N"], ratios(r)["dispatcher/best_torch"]) for r in mine]
        has_cslt = all("cusparselt" in r["times_ms"] for r in mine)
        n, worst = min(every, key=lambda x: x[1])
        out.append((f"{m}x{k}: dispatcher >= better of dense and cuSPARSELt at every N",
                    f"worst {worst:.2f}x (N={n})" + ("" if has_cslt else
                                                    " (no cuSPARSELt: vs dense only)"),
                    worst >= 1.0))
    return out


def _loop_table(rows: list[dict]) -> str:
    """The eager loop's wall per call, and the dispatcher's speed ratio to the better of
    dense and cuSPARSELt in that regime."""
    lines = [f"{'M x K':>12} {'N':>5} {'dense':>10} {'cusparselt':>10} {'dispatcher':>10}"
             f"   x better of the two"]
    for r in rows:
        t = r.get("loop_ms")
        if not t:
            continue
        best = min(t["dense"], t.get("cusparselt", math.inf))
        cslt = f"{t['cusparselt']:10.4f}" if "cusparselt" in t else f"{'-':>10}"
        lines.append(f"{r['M']:>6}x{r['K']:<5} {r['N']:>5} {t['dense']:10.4f} {cslt} "
                     f"{t['dispatcher']:10.4f}   {best / t['dispatcher']:.2f}")
    return "\n".join(lines)


def kernel_reach(rows: list[dict], name: str = "sparse24_stream") -> list[tuple[str, str]]:
    """(weight, measured) per weight shape: the worst ratio to dense at N <= 64 of our
    variant ``name`` at its best config: what the dispatcher can reach by choosing it."""
    out = []
    for m, k in dict.fromkeys((r["M"], r["K"]) for r in rows):
        small = [(r["N"], ratios(r)[f"{name}/dense"]) for r in rows
                 if (r["M"], r["K"]) == (m, k) and r["N"] <= 64 and name in r["times_ms"]]
        if small:
            n, worst = min(small, key=lambda x: x[1])
            out.append((f"{m}x{k}", f"worst {worst:.2f}x (N={n})"))
    return out


def _table(rows: list[dict]) -> str:
    names = ["dense", "cusparselt", *KERNELS, "dispatcher"]
    head = f"{'M x K':>12} {'N':>5} " + " ".join(f"{n:>15}" for n in names) + \
        "   x dense (disp/mma/stream/cslt)  x best torch   chosen"
    lines = [head]
    for r in rows:
        t, q = r["times_ms"], ratios(r)
        cells = " ".join(f"{t[n]:15.4f}" if n in t else f"{'-':>15}" for n in names)
        x = "/".join(f"{q[f'{n}/dense']:.2f}" if f"{n}/dense" in q else "-"
                     for n in ("dispatcher", *KERNELS, "cusparselt"))
        lines.append(f"{r['M']:>6}x{r['K']:<5} {r['N']:>5} {cells}   {x:>30}  "
                     f"{q['dispatcher/best_torch']:11.2f}   {r['chosen']}")
    return "\n".join(lines)


def main(out_dir: str = ".", device: str = "cuda", quick: bool = False,
         budget_s: float = 170.0, tokens: list[int] | None = None) -> list[dict]:
    """Run the benchmark (``tokens``: these N only); summary rows for scripts/gpu-check
    (details in the JSON)."""
    t0 = time.perf_counter()
    side = CudaSide() if device == "cuda" else HostSide()
    rows = bench(side, QUICK_SHAPES if quick else SHAPES,
                 tokens or (QUICK_TOKENS if quick else TOKENS), budget_s)
    result = {"device": side.dispatcher.backend.fingerprint(), "rows": rows,
              "targets": targets(rows), "wall_s": time.perf_counter() - t0}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gpu_sparse24.json.tmp"
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, out / "gpu_sparse24.json")
    print(f"\nspmm 2:4, float16, median ms per call (device {device})")
    print(_table(rows))
    print(f"\nan eager loop: wall ms per call, {LOOP_CALLS} calls back to back a "
          f"synchronise, the least of {LOOP_ROUNDS} rounds (host issuing included)")
    print(_loop_table(rows))
    print(f"\nwall {result['wall_s']:.0f} s")
    print("\n2:4 targets (issue 13), this run:")
    for target, measured, met in result["targets"]:
        print(f"  [{'met' if met else 'NOT met'}] {target}: {measured}")
    for weight, measured in kernel_reach(rows):
        print(f"  sparse24_stream at its best config, {weight}, x dense at N <= 64: {measured}")
    summary = [{"bench": "gpu_sparse24", "case": f"{r['M']}x{r['K']} N={r['N']}",
                "value": f"{ratios(r)['dispatcher/dense']:.2f}", "unit": "x dense",
                "note": f"{ratios(r)['dispatcher/best_torch']:.2f}x best torch; "
                        f"chosen {r['chosen']}"} for r in rows]
    summary += [{"bench": "gpu_sparse24", "case": target, "value": measured,
                 "unit": "", "note": "met" if met else "NOT met"}
                for target, measured, met in result["targets"]]
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--device", default="cuda", choices=("cuda", "host"))
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--budget-s", type=float, default=170.0,
                        help="start no new input after this many seconds")
    parser.add_argument("--tokens", type=lambda text: [int(n) for n in text.split(",")],
                        default=None, help="token counts N to run, e.g. 1,16,64 (default: all)")
    a = parser.parse_args()
    main(a.out, a.device, a.quick, a.budget_s, a.tokens)
