"""Probe: causal prefill attention, device time of SDPA and the flash2 kernels.

Contention's attention prefill (B=1 H=16 1024² D=128 causal) ran 1.6-1.7x SDPA's device
time on flash2_mma in every run (S142-S147): 128 CTAs of 128 query rows in one wave, so
the kernel takes as long as its heaviest CTA, which reads all 16 key tiles while the
lightest reads 1. flash2_pair_mma gives each CTA the heaviest row block and the lightest
(S148: pays on several waves, not on one); flash2_ksplit_mma splits a row block's keys
between two warp groups (half the heaviest CTA's serial chain), paired or not;
flash_wgmma runs both products on Hopper's warpgroup tensor cores (wgmma).
Per input: SDPA as a torch program calls it (``F.scaled_dot_product_attention``, where its
causal mask is ours: Lq == Lk) and through the dispatcher (``sdpa_torch``), and every
config of the two flash kernels; the best of each and the ratios. Device time: CUDA events
around ``--calls`` launches queued behind a sleep kernel (so the host's issuing is not
timed), median over ``--reps``. ``--full``: the same inputs without the mask (the JSON
``probe_causal_prefill_full.json``); ``--padded``: as a left-padded batch, the causal
triangle and the padding in one boolean mask as transformers passes SDPA (SDPA's flash
kernel takes no mask: torch runs another), against flash_wgmma's masked configs
(``probe_causal_prefill_padded.json``). Each flash result is checked against SDPA's: a config off
by more than 2e-2 is reported (``wrong`` in the JSON), left out of the bests, and the probe
exits 1 after the last input. Every time goes to ``probe_causal_prefill.json`` in ``--out``.

    PYTHONPATH=$PWD python3 benchmarks/probe_causal_prefill.py            # H200, ~30 s
    PYTHONPATH=$PWD python3 benchmarks/probe_causal_prefill.py --dry-run  # the candidates
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (B, H, Lq, Lk, D, dtype[, Hkv]): contention's input first; the last, a 1B Llama's prefill
# (32 query heads on 8 key/value heads, D = 64)
CASES = [(1, 16, 1024, 1024, 128, "float16"), (1, 16, 1024, 1024, 128, "bfloat16"),
         (2, 4, 1024, 1024, 64, "float16"), (1, 32, 2048, 2048, 128, "float16"),
         (4, 32, 512, 512, 128, "float16"), (1, 8, 4096, 4096, 128, "float16"),
         (8, 32, 256, 256, 64, "float16"), (1, 32, 512, 2048, 128, "float16"),
         (1, 16, 998, 998, 64, "float16"), (1, 8, 4096, 4096, 64, "float16"),
         (1, 32, 1536, 1536, 64, "float16", 8)]
FLASH = ("flash2_mma", "flash2_pair_mma", "flash2_ksplit_mma", "flash_wgmma")


def padded_mask(b: int, lq: int, lk: int):
    """A left-padded batch's boolean mask [B, 1, Lq, Lk] as transformers builds one (the
    causal triangle, bottom-right, and entry i's first i * Lk // (4 B) keys hidden), where a
    padding row sees the keys up to itself (transformers un-masks rows that would see none:
    SDPA gives NaN there)."""
    import numpy as np
    i = np.arange(lq)[:, None] + (lk - lq)
    j = np.arange(lk)[None, :]
    pads = [e * lk // (4 * b) for e in range(b)]
    return np.stack([((j <= i) & ((j >= pad) | (i < pad)))[None] for pad in pads])


def candidates(registry, case, causal: bool = True, padded: bool = False
               ) -> dict[str, list[dict]]:
    """variant name -> the configs of it that fit ``case`` (causal or not; ``padded``: with
    :func:`padded_mask`, not causal: the mask holds the triangle)."""
    import numpy as np

    from adaptive.limits import SM90
    from adaptive.ops import get_op
    b, h, lq, lk, d, dtype, hkv = (*case, case[1])[:7]
    args = (np.zeros((b, h, lq, d), dtype if dtype != "bfloat16" else "float16"),
            *(np.zeros((b, hkv, lk, d), "float16"),) * 2)
    if padded:
        args = (*args, padded_mask(b, lq, lk))
    scope = {**get_op("attention").problem(args, {"causal": causal}).scope(), "dtype": dtype}
    out = {}
    for name in FLASH:
        v = registry.get("attention", name)
        out[name] = [c for c in v.space.configs(SM90) if v.fits(scope, c)]
    return out


def device_us(fn, calls: int, reps: int) -> float:
    """Median device us a call: ``calls`` launches between two events, queued behind a
    sleep kernel so the events time the device, not the host's issuing."""
    import torch
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(3_000_000)                 # ~1.5 ms of queue ahead of the host
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--dry-run", action="store_true", help="list the candidates, time nothing")
    p.add_argument("--full", action="store_true",
                   help="the same inputs without the causal mask (flash2_pair_mma: none)")
    p.add_argument("--padded", action="store_true",
                   help="the same inputs as a left-padded batch: a boolean mask holding the "
                   "causal triangle and the padding, as transformers passes SDPA (only the "
                   "masked kernels: flash_wgmma's MASKED = 1)")
    p.add_argument("--out", default=os.environ.get("OUT", "."),
                   help="folder for probe_causal_prefill.json (default: $OUT or .)")
    args = p.parse_args(argv)
    report, wrong = [], []
    from adaptive.dispatch import Dispatcher
    from adaptive.policy import MeasureEach
    d = Dispatcher("host" if args.dry_run else "cuda", policy=MeasureEach())
    for case in CASES:
        causal = not (args.full or args.padded)
        cands = candidates(d.registry, case, causal, args.padded)
        label = "B={} H={} Lq={} Lk={} D={} {}".format(*case[:6]) + (
            f" Hkv={case[6]}" if len(case) > 6 else "") + (
            " padded" if args.padded else "" if causal else " full")
        if args.dry_run:
            print(label, {n: len(c) for n, c in cands.items()})
            report.append({"input": label, "configs": {n: len(c) for n, c in cands.items()}})
            continue
        import torch
        import torch.nn.functional as F
        b, h, lq, lk, dim, dtype, hkv = (*case, case[1])[:7]
        tdt = getattr(torch, dtype)
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, h, lq, dim, device="cuda", dtype=tdt, generator=gen)
        k, v = (torch.randn(b, hkv, lk, dim, device="cuda", dtype=tdt, generator=gen)
                for _ in range(2))
        out = torch.empty_like(q)
        masks = (torch.from_numpy(padded_mask(b, lq, lk)).cuda(),) if args.padded else ()
        ref = d.launch("attention", q, k, v, *masks, variant="sdpa_torch", causal=causal)
        rows = [("sdpa_torch (dispatcher)", {}, device_us(
            lambda: d.launch("attention", q, k, v, *masks, out=out, variant="sdpa_torch",
                             causal=causal), args.calls, args.reps))]
        if lq == lk or not causal:   # torch's causal mask is top-left aligned
            rows.append(("F.scaled_dot_product_attention", {}, device_us(
                lambda: F.scaled_dot_product_attention(
                    q, k, v, attn_mask=masks[0] if masks else None, is_causal=causal,
                    enable_gqa=hkv != h), args.calls, args.reps)))
        for name, configs in cands.items():
            for c in configs:
                def run(name=name, c=c):
                    d.launch("attention", q, k, v, *masks, out=out, variant=name, config=c,
                             causal=causal)
                t = device_us(run, args.calls, args.reps)
                out.fill_(float("nan"))
                run()
                err = float((out.float() - ref.float()).abs().max())
                if not err <= 2e-2:   # NaN too: an element left unwritten
                    print(f"WRONG {label} {name} {c}: max |diff| to SDPA {err:.3g}",
                          flush=True)
                    wrong.append({"input": label, "candidate": name, "config": c,
                                  "max_abs_diff": err})
                    continue
                rows.append((name, c, t))
        sdpa = min(t for n, _, t in rows if n not in FLASH)   # the dispatcher's or torch's
        best = {n: min((r for r in rows if r[0] == n), key=lambda r: r[2], default=None)
                for n in FLASH}
        print(f"{label}: sdpa {sdpa:.1f} us", end="")
        for n, r in best.items():
            if r is not None:
                print(f" | {n} {r[2]:.1f} us ({r[2] / sdpa:.3f}x sdpa) {r[1]}", end="")
        for n in FLASH[1:]:
            if best[n] is not None and best[FLASH[0]] is not None:
                print(f" | {n.split('_')[1]}/unpaired {best[n][2] / best[FLASH[0]][2]:.3f}",
                      end="")
        print(flush=True)
        for n, c, t in rows:
            print(f"    {n} {c} {t:.1f} us")
        report.append({"input": label, "device_us": [
            {"candidate": n, "config": c, "us": t} for n, c, t in rows]})
    mode = "_padded" if args.padded else "_full" if args.full else ""
    out = Path(args.out) / f"probe_causal_prefill{mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"inputs": report, "wrong": wrong}, indent=1))
    print(f"wrote {out}")
    if wrong:
        print(f"{len(wrong)} configs gave wrong results (above)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
