"""What the attention variants' GPU tests share: inputs on the device and in float64, a
pinned run into a NaN-poisoned output, and the check of a run against the float64
reference (twice: the second run must give the same bits)."""

from __future__ import annotations

import numpy as np

from adaptive.ops import get_op


def label(config: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


def inputs(cp, rng, dtype, b, h, hkv, lq, lk, d, magnitude=1.0):
    """(device q, k, v; their float64 values): fp16 as CuPy arrays, bf16 as torch tensors."""
    q = rng.standard_normal((b, h, lq, d)) * magnitude
    k = rng.standard_normal((b, hkv, lk, d)) * magnitude
    v = rng.standard_normal((b, hkv, lk, d))
    if dtype == "bfloat16":
        import torch
        dev = [torch.from_numpy(x.astype(np.float32)).cuda().to(torch.bfloat16)
               for x in (q, k, v)]
        host = [t.double().cpu().numpy() for t in dev]
    else:
        dev = [cp.asarray(x.astype(dtype)) for x in (q, k, v)]
        host = [x.astype(dtype).astype(np.float64) for x in (q, k, v)]
    return dev, host


def run(dispatcher, cp, config, dtype, dev, causal, scale=None, *, name):
    """The result of one run of variant ``name`` (float64 NumPy), NaN-poisoned out; ``dev``:
    q, k, v[, mask]."""
    shape = tuple(dev[0].shape)
    if dtype == "bfloat16":
        import torch
        out = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
        dispatcher.launch("attention", *dev, out=out, variant=name, config=config,
                          causal=causal, scale=scale)
        torch.cuda.synchronize()
        return out.double().cpu().numpy()
    out = cp.full(shape, np.nan, dtype)
    dispatcher.launch("attention", *dev, out=out, variant=name, config=config, causal=causal,
                      scale=scale)
    cp.cuda.Device().synchronize()
    return cp.asnumpy(out).astype(np.float64)


def check(dispatcher, cp, config, dtype, dev, host, causal, scale=None, what="", *, name):
    """Variant ``name`` on ``dev`` against the float64 reference of ``host`` (q, k, v[, mask]
    as float64, the mask as given), twice."""
    op = get_op("attention")
    ref = op.reference(*host, causal=causal, scale=scale)
    first = run(dispatcher, cp, config, dtype, dev, causal, scale, name=name)
    tag = f"{name}[{label(config)}] {dtype} causal={causal} {what}"
    assert np.isfinite(first).all(), f"{tag}: NaN/Inf in the output (unwritten or 0/0)"
    err = op.error(first, ref)
    assert err < op.tolerance[dtype], f"{tag}: rel. error {err:.3g}"
    worst = np.abs(first - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert worst < 8 * op.tolerance[dtype], f"{tag}: worst element off by {worst:.3g}"
    second = run(dispatcher, cp, config, dtype, dev, causal, scale, name=name)
    assert np.array_equal(first, second), f"{tag}: a second run on the same input differs"
