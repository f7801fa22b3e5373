"""Probe: where the host's time goes when SDPA is called from CuPy arrays.

Runs S121 and S122 (H200) left one input of ``gpu_contention.py`` over its bar in every
condition: attention B=1 H=16 1024² D=128 causal, where ``sdpa_torch`` takes 0.026 ms of
device time against ``flash2_mma``'s 0.046, but 67-85 us of the host's time to issue a
pinned call from CuPy arrays against 13-17. S133 read 161-171 us a call inside the mixed
attention stream. Which of its parts costs that: the dispatcher, the stream context, the
four DLPack views, SDPA's own dispatch, the copy into ``out``?

Each piece is called ``--calls`` times back to back and the host's median us a call over
``--reps`` batches is printed (a synchronise after each batch, outside the timed part),
with the device's us a call (CUDA events around a batch) where the piece runs kernels.
SDPA's backends are timed alone too (``torch.nn.attention.sdpa_kernel``), to see which
one SDPA picks and what calling it directly would save.

    PYTHONPATH=$PWD python3 benchmarks/probe_sdpa_issue.py            # H200, about 20 s
    PYTHONPATH=$PWD python3 benchmarks/probe_sdpa_issue.py --device cpu   # dry run (torch
                                                                          # pieces on CPU)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (name, dims): contention's input first, then the mixed table's 1024² and a decode step
CASES = [("contention 1x16x1024² D=128 causal", dict(B=1, H=16, L=1024, Lq=1024, D=128)),
         ("mixed 2x4x1024² D=64 causal", dict(B=2, H=4, L=1024, Lq=1024, D=64)),
         ("decode 1x32x1x8192 D=128", dict(B=1, H=32, L=8192, Lq=1, D=128))]


def timed(fn, calls: int, reps: int, sync, events=None) -> tuple[float, float]:
    """(host us a call, device us a call or NaN): medians over ``reps`` batches."""
    host, dev = [], []
    fn()
    sync()
    for _ in range(reps):
        if events is not None:
            start, end = events()
            start.record()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter_ns() - t0) / 1e3 / calls)
        if events is not None:
            end.record()
        sync()
        if events is not None:
            dev.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(host), statistics.median(dev) if dev else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    cuda = args.device == "cuda"
    dev = torch.device(args.device)
    if cuda:
        import cupy
        from adaptive.backends.torch_streams import as_torch, cupy_stream
        from adaptive.dispatch import Dispatcher
        from adaptive.policy import MeasureEach
        from variants.attention.library import attention_sdpa_torch
        d = Dispatcher("cuda", policy=MeasureEach())

        def sync():
            torch.cuda.synchronize()

        def events():
            return (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
    else:
        def sync():
            pass
        events = None
    calls, reps = args.calls, args.reps
    for name, dims in CASES:
        b, h, lk, lq, hd = dims["B"], dims["H"], dims["L"], dims["Lq"], dims["D"]
        g = torch.Generator(device="cpu").manual_seed(0)
        tq, tk, tv = (torch.randn(b, h, n, hd, generator=g, dtype=torch.float32)
                      .to(dev, torch.float16 if cuda else torch.float32)
                      for n in (lq, lk, lk))
        causal = lq > 1
        to = torch.empty_like(tq)
        rows = []

        def add(label, fn, ev=events):
            rows.append((label, *timed(fn, calls, reps, sync, ev)))
        add("plain torch: F.scaled_dot_product_attention",
            lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal))
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION):
            def one(backend=backend):
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
            try:
                one()
            except RuntimeError as e:
                rows.append((f"  only {backend.name}: {str(e).splitlines()[0][:60]}",
                             float("nan"), float("nan")))
                continue
            add(f"  only {backend.name} (with the context)", one)
        if cuda:
            try:
                add("  aten._scaled_dot_product_flash_attention",
                    lambda: torch.ops.aten._scaled_dot_product_flash_attention(
                        tq, tk, tv, 0.0, causal, False))
            except RuntimeError as e:
                rows.append((f"  aten flash: {str(e).splitlines()[0][:60]}", float("nan"),
                             float("nan")))
        add("  out.copy_(result)", lambda r=F.scaled_dot_product_attention(
            tq, tk, tv, is_causal=causal): to.copy_(r))
        if cuda:
            cq, ck, cv = (cupy.from_dlpack(t) for t in (tq, tk, tv))
            cout = cupy.empty_like(cq)
            add("cupy: 4 views (as_torch)", lambda: [as_torch(torch, a)
                                                     for a in (cq, ck, cv, cout)], None)

            def ctx():
                with cupy_stream(torch, 0):
                    pass
            add("cupy: the stream context (cupy_stream)", ctx, None)

            def entry():
                with cupy_stream(torch, 0):
                    attention_sdpa_torch(*(as_torch(torch, a) for a in (cq, ck, cv)),
                                         out=as_torch(torch, cout), causal=causal)
            add("cupy: context + views + entry (SDPA, copy)", entry)

            def bare():   # torch's current stream is CuPy's here (both the null stream)
                attention_sdpa_torch(*(as_torch(torch, a) for a in (cq, ck, cv)),
                                     out=as_torch(torch, cout), causal=causal)
            add("cupy: views + entry, no context", bare)
            params = {"causal": True} if causal else {}
            for variant in ("sdpa_torch", "flash2_mma", "splitkv2_mma", "three_pass"):
                cands = [c for c in d.candidates("attention", cq, ck, cv, **params)
                         if c.variant.name == variant]
                if not cands:
                    continue
                c = cands[0]

                def pinned(c=c):
                    d.launch("attention", cq, ck, cv, variant=c.variant.name, config=c.config,
                             **params)
                add(f"cupy: launch pinned {c.label}", pinned)

                def pinned_t(c=c):
                    d.launch("attention", tq, tk, tv, variant=c.variant.name, config=c.config,
                             **params)
                add(f"torch: launch pinned {c.label}", pinned_t)
        print(f"\n{name}: {calls} calls a batch, medians of {reps} batches")
        print(f"  {'piece':<58} {'host us':>9} {'device us':>10}")
        for label, host, device in rows:
            print(f"  {label:<58} {host:9.1f} {device:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
