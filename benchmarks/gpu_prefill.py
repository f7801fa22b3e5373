"""Prefill (time to a batch's first tokens) of plain PyTorch against adaptive, side by side.

    PYTHONPATH=$PWD python3 benchmarks/gpu_prefill.py --out $OUT     # H200, about 1.5 minutes
    python3 benchmarks/gpu_prefill.py --quick --out /tmp/p             # a dry run on the CPU

Run S24 served the same requests through the example server in both modes: adaptive's
decode steps were as fast or faster, but its prefill took 77.8 ms at the median against
torch's 45.9 (8 clients), growing with the batch's tokens. This benchmark isolates it: the
``1b`` Llama preset (fp16, random weights of one seed) built twice in one process, plain
(SDPA, ``nn.Linear``) and patched, both warmed up as the server warms up (each batch's rows
ragged, so attention meets the padding mask; adaptive inside
``adaptive.unbounded_exploration()`` until no key explores), then the prefill forward
(``logits_to_keep=1``, a fresh KV cache) of ragged left-padded batches timed in rounds that
alternate the modes (median of the rounds, each synchronised), and one prefill of each mode
under ``torch.profiler``: the kernels with the most device time, SDPA's arguments in one
prefill with the fused backends that take them (torch's reasons where one does not), and
for adaptive the
candidate each prefill-sized gemm and attention key committed to, with what the policy
measured of the others. Writes ``gpu_prefill.json`` and prints the ratios last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "server"))

CASES = ((8, 512), (8, 1024), (16, 1024), (32, 512))   # (rows, longest prompt)
QUICK_CASES = ((2, 32), (4, 64))


def prefill_inputs(lm, prompts):
    """The padded ids, mask and positions CausalLM.generate builds for ``prompts``, and
    the width."""
    ids, mask, positions = lm.left_padded(prompts, 1)
    return ids, mask, positions, ids.shape[1]


def forward(lm, inputs, torch):
    """One prefill forward (a fresh KV cache, the last position's logits): the output."""
    ids, mask, positions, _ = inputs
    with torch.inference_mode():
        return lm.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                        use_cache=True, logits_to_keep=1, **{lm._cache_kw: lm._cache()})


def prefill(lm, inputs, torch) -> float:
    """One prefill forward, synchronised; its wall ms."""
    torch.cuda.synchronize() if lm.device.type == "cuda" else None
    t0 = time.perf_counter()
    forward(lm, inputs, torch).logits[:, -1].argmax(-1).tolist()   # what the engine awaits
    return (time.perf_counter() - t0) * 1e3


def top_kernels(lm, inputs, torch) -> list[str]:
    """One prefill profiled as the server profiles one (CausalLM.profiled)."""
    lm.profiled(lambda: forward(lm, inputs, torch), batch=-1)
    p = lm.prefill_profiles[-1]
    return ([f"device total {p['device_ms']:.2f} ms, host {p['host_ms']:.2f} ms"] + p["top"]
            + ["SDPA " + line for line in p["sdpa"]]
            + ["route " + line for line in p["routes"]])


def committed(rows_min: int) -> list[str]:
    """Adaptive's prefill-sized keys (gemm M, attention Lq at least ``rows_min``): the
    committed candidate and the medians the policy measured of each explored one."""
    from adaptive.runtime import live_dispatchers
    out, seen = [], set()
    for d in live_dispatchers():
        state_of = d.policy.state
        for plan in list(d._plans.values()):
            p = plan.problem
            size = p.dims_dict.get("M" if p.op == "gemm" else "Lq", 0)
            if p.op not in ("gemm", "attention") or size < rows_min or plan.class_key in seen:
                continue
            seen.add(plan.class_key)
            state = state_of(plan.class_key)
            measured = "" if state is None else ", ".join(
                f"{c.label} {ts.median():.4g}" for c, ts in state.observed.items() if len(ts))
            out.append(f"{p.op} {p.dims_dict} {'masked ' if p.extra_dict.get('masked') else ''}"
                       f"-> {plan.candidate.label}{' (exploring)' if plan.provisional else ''}"
                       f"; measured: {measured}")
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--quick", action="store_true", help="tiny preset on the CPU (dry run)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--cases", default=None,
                   help="rows x longest, comma-separated (e.g. 32x512,16x1024); the first "
                   "is profiled (default: the four cases, the second profiled)")
    args = p.parse_args(argv)
    import torch

    import adaptive
    from engine import CausalLM, ragged_prompts, warm_up
    from models import build_llama
    device = "cpu" if args.quick or not torch.cuda.is_available() else "cuda"
    preset, cases = ("tiny", QUICK_CASES) if device == "cpu" else ("1b", CASES)
    rounds = 2 if device == "cpu" else args.rounds
    if args.cases:
        cases = tuple(tuple(int(x) for x in c.split("x")) for c in args.cases.split(","))
    print(f"gpu_prefill: {device}, preset {preset}, cases (rows, longest) {cases}, "
          f"{rounds} rounds", flush=True)
    lms = {}
    for mode in ("torch", "adaptive"):
        t0 = time.perf_counter()
        lm = CausalLM(build_llama(preset, mode, device), mode, pad_to=64, buckets=True)
        batches = sorted({(b, n, 2) for b, n in cases})
        if mode == "adaptive":
            with adaptive.unbounded_exploration():
                info = warm_up(lm, batches, settle=True, limit_s=60.0)
        else:
            info = warm_up(lm, batches, settle=False, limit_s=0.0)
        lms[mode] = lm
        print(f"  {mode}: built and warmed up in {time.perf_counter() - t0:.1f} s ({info})",
              flush=True)
    results = []
    for rows, longest in cases:
        inputs = {m: prefill_inputs(lm, ragged_prompts(rows, longest, lm.vocab_size))
                  for m, lm in lms.items()}
        times = {m: [] for m in lms}
        for _ in range(rounds):
            for m, lm in lms.items():
                times[m].append(prefill(lm, inputs[m], torch))
        med = {m: statistics.median(t) for m, t in times.items()}
        results.append({"rows": rows, "longest": longest, "width": inputs["torch"][3],
                        "torch_ms": med["torch"], "adaptive_ms": med["adaptive"],
                        "ratio": med["adaptive"] / med["torch"],
                        "times": {m: [round(x, 3) for x in t] for m, t in times.items()}})
        print(f"  rows {rows:>2}, longest {longest:>4} (width {inputs['torch'][3]}): torch "
              f"{med['torch']:.2f} ms, adaptive {med['adaptive']:.2f} ms, adaptive/torch "
              f"{med['adaptive'] / med['torch']:.3f}", flush=True)
    rows, longest = cases[0] if args.cases else cases[1]
    profiles = {}
    for m, lm in lms.items():
        profiles[m] = top_kernels(lm, prefill_inputs(lm, ragged_prompts(rows, longest,
                                                                        lm.vocab_size)), torch)
        print(f"\n  {m}: one prefill of rows {rows}, longest {longest} under torch.profiler, "
              "top kernels by device time:\n    " + "\n    ".join(profiles[m]), flush=True)
    keys = committed(rows_min=64 if device == "cuda" else 16)
    print("\n  adaptive's prefill-sized keys:\n    " + "\n    ".join(keys), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_prefill.json").write_text(json.dumps(
        {"benchmark": "gpu_prefill", "device": device, "preset": preset, "results": results,
         "profiles": profiles, "adaptive_keys": keys}, indent=1))
    print("\nprefill, adaptive / torch (median of rounds): " + ", ".join(
        f"rows {r['rows']} longest {r['longest']}: {r['ratio']:.3f}" for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
