"""Host time per warm call: ``Dispatcher.launch`` / ``adaptive.launch`` of a small CUDA
kernel vs calling the same ``cupy.RawKernel`` directly (same grid, block and args)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

CALLS = 20000


def _per_call_us(cp, fn, calls: int = CALLS) -> float:
    for _ in range(200):
        fn()
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        cp.cuda.Device().synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main(out_dir: str) -> list[dict]:
    import cupy as cp

    import adaptive
    from adaptive import Dispatcher, Registry, config, runtime
    from adaptive.variants import shared_registry
    from adaptive.space import Space

    x = cp.asarray(np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32))
    out = cp.empty_like(x)
    cfg = {"WARPS": 4, "VEC": 4}
    # one variant with a one-point space, so the default dispatcher's decision is exactly
    # the kernel and config launched directly below
    only = dataclasses.replace(shared_registry().get("softmax", "warp_row"),
                               space=Space.from_dict({k: [v] for k, v in cfg.items()}))
    reg = Registry([only])
    with config.override(sample_every=0):
        d = Dispatcher("cuda", registry=reg)
        adaptive.reset_defaults()
        runtime.set_default(Dispatcher("cuda", registry=reg), like=x)
        adaptive.launch("softmax", x, out=out)          # default dispatcher, decided once
        chosen = runtime.default_dispatcher((x,)).decision("softmax", x).candidate.label
    d.launch("softmax", x, out=out, variant="warp_row", config=cfg)
    variant = reg.get("softmax", "warp_row")
    raw, _, _ = d.backend.function(variant, cfg, "float32")
    grid, block = (2,), (32, 4)
    kargs = (x, out, np.int32(8), np.int32(64))

    direct = _per_call_us(cp, lambda: raw(grid, block, kargs))
    pinned = _per_call_us(cp, lambda: d.launch("softmax", x, out=out, variant="warp_row",
                                               config=cfg))
    default = _per_call_us(cp, lambda: adaptive.launch("softmax", x, out=out))
    alloc = _per_call_us(cp, lambda: adaptive.launch("softmax", x))
    result = {"raw_kernel_us": direct, "dispatcher_pinned_us": pinned,
              "adaptive_launch_us": default, "adaptive_launch_alloc_us": alloc,
              "calls": CALLS}
    Path(out_dir, "launch_overhead.json").write_text(json.dumps(result, indent=1))
    return [
        {"bench": "launch", "case": "cupy.RawKernel direct", "value": f"{direct:.2f}",
         "unit": "us/call", "note": f"softmax 8x64 fp32, {chosen}"},
        {"bench": "launch", "case": "adaptive.launch (warm, out=)", "value": f"{default:.2f}",
         "unit": "us/call", "note": f"+{default - direct:.2f} us, x{default / direct:.2f} "
                                    "(target <= +1 us)"},
        {"bench": "launch", "case": "Dispatcher.launch pinned variant", "value":
         f"{pinned:.2f}", "unit": "us/call", "note": f"+{pinned - direct:.2f} us"},
        {"bench": "launch", "case": "adaptive.launch (warm, allocates out)", "value":
         f"{alloc:.2f}", "unit": "us/call", "note": f"+{alloc - direct:.2f} us"},
    ]
