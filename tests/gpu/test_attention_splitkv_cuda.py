"""attention's split-KV decode variants (splitkv_mma, splitkv2_mma) against the float64
reference on the GPU.

Fresh random inputs per test; outputs poisoned with NaN before every run (an unwritten
element fails); every case runs twice on the same input and must give the same bits (the
merge order is fixed, so a race or a counter left non-zero shows as a difference).
Covered: every config; odd Lk (1, 17, 1000, 4097) against Lq 1..16, query heads per kv head
1, 4 and 8, causal (bottom-right) and not, D 64 and 128, fp16 (CuPy) and bf16 (PyTorch);
large-magnitude logits (q and k times 30); a given scale; two streams at once. splitkv2_mma
as well: every config (ring depth, 16/32-key warp steps, 16 warps, row groups of 32 rows at
Lq = 16 with 4 and 8 query heads a kv head), the same shapes with one config per (split size,
row group size). Padding masks (the MASKED = 1 configs): boolean and additive (-inf, and
finite minima) masks of left padding per batch entry, per head or one for the batch, a query
row hidden everywhere (zeros), Lq 1 and 4, G 1 and 4, odd Lk over several splits, logits x30,
with and without causal; and the dispatcher on a padded decode batch as transformers passes it.
(What the variant claims through `requires` is checked on the CPU:
tests/cpu/test_attention_splitkv_emu.py.)
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

from adaptive.limits import SM90
from adaptive.ops import get_op
from adaptive.ops.attention import padding_mask
from adaptive.variants import builtin_folder, load_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_checks  # noqa: E402

pytestmark = pytest.mark.gpu

NAME = "splitkv_mma"
NAMES = (NAME, "splitkv2_mma")
VARIANTS = {v.name: v for v in load_manifest(builtin_folder() / "attention" / "manifest.toml")
            if v.name in NAMES}
ALL_CONFIGS = [(name, c) for name in NAMES for c in VARIANTS[name].space.configs(SM90)]
_label, _inputs = attention_checks.label, attention_checks.inputs
_run = functools.partial(attention_checks.run, name=NAME)       # name=: another variant
_check = functools.partial(attention_checks.check, name=NAME)


@pytest.fixture(scope="module")
def dispatcher():
    from adaptive.dispatch import Dispatcher
    return Dispatcher(backend="cuda")


def _fitting(dev, causal, scale=None, name=NAME):
    problem = get_op("attention").problem(tuple(dev), {"causal": causal, "scale": scale})
    scope = problem.scope()
    variant = VARIANTS[name]
    return [c for c in variant.space.configs(SM90) if variant.fits(scope, c)]


@pytest.mark.parametrize("name,config", ALL_CONFIGS,
                         ids=[f"{n}[{_label(c)}]" for n, c in ALL_CONFIGS])
def test_every_config(dispatcher, cp, rng, name, config):
    d = config["HD"]
    # GQA 8 query heads on 2 kv heads; 16 heads on 2 (8 a group) needs 8 warps at Lq = 16
    # (or row groups); 4 heads a group at Lq = 16: 64 rows, two row groups of 32
    for (h, lq, lk, causal) in ((8, 3, 1000, True), (8, 1, 777, False), (16, 16, 1500, True),
                                (8, 16, 2100, True)):
        dev, host = _inputs(cp, rng, "float16", 2, h, 2, lq, lk, d)
        if config in _fitting(dev, causal, name=name):
            _check(dispatcher, cp, config, "float16", dev, host, causal, what=f"H={h} Lq={lq}",
                   name=name)


SHAPES = [(lk, lq, group) for lk in (1, 17, 1000, 4097) for lq in (1, 2, 5, 16)
          for group in (1, 4, 8)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lk,lq,group", SHAPES, ids=[f"Lk{a}-Lq{b}-G{c}" for a, b, c in SHAPES])
def test_shapes(dispatcher, cp, rng, lk, lq, group, causal, name):
    if causal and lq > lk:
        pytest.skip("causal needs Lq <= Lk")
    i = SHAPES.index((lk, lq, group))
    dtype = ("float16", "bfloat16")[(i + causal) % 2]
    d = (64, 128)[i % 2]
    hkv = 2 if group < 8 else 1
    dev, host = _inputs(cp, rng, dtype, 2, group * hkv, hkv, lq, lk, d)
    fitting = _fitting(dev, causal, name=name)
    assert fitting, f"no config of {name} serves Lq={lq} G={group} D={d} {dtype}"
    sizes = sorted({(c["KPS"], c.get("RB", 0)) for c in fitting})
    for kps, rb in sizes:                    # one config per split size (and row group size)
        config = next(c for c in fitting if c["KPS"] == kps and c.get("RB", 0) == rb)
        _check(dispatcher, cp, config, dtype, dev, host, causal,
               what=f"Lk={lk} Lq={lq} G={group}", name=name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_large_logits(dispatcher, cp, rng, dtype, causal, name):
    """q and k times 30: logits in the hundreds, softmax close to one-hot per row."""
    dev, host = _inputs(cp, rng, dtype, 1, 32, 8, 4, 4097, 128, magnitude=30.0)
    for config in _fitting(dev, causal, name=name):
        if config["NWARPS"] == 4 and config.get("STAGES", 4) == 4:
            _check(dispatcher, cp, config, dtype, dev, host, causal, what="x30", name=name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [0.5, -0.3, 0.0])
def test_given_scale(dispatcher, cp, rng, scale, name):
    dev, host = _inputs(cp, rng, "float16", 1, 8, 2, 2, 1100, 64)
    (config, *_) = _fitting(dev, True, scale, name=name)
    _check(dispatcher, cp, config, "float16", dev, host, True, scale=scale, name=name)


@pytest.mark.parametrize("name", NAMES)
def test_two_streams_at_once(dispatcher, cp, rng, name):
    """The same plan on two streams: each stream has its own workspace (partials, counters)."""
    dev, host = _inputs(cp, rng, "float16", 1, 32, 8, 1, 8192, 128)
    config = next(c for c in _fitting(dev, False, name=name) if c["KPS"] == 64)
    ref = get_op("attention").reference(*host)
    outs = []
    cp.cuda.Device().synchronize()          # the inputs are ready before the other streams
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    for s in streams:
        with s:
            for _ in range(20):
                out = cp.full(ref.shape, np.nan, "float16")
                dispatcher.launch("attention", *dev, out=out, variant=name, config=config)
            outs.append(out)
    for s in streams:
        s.synchronize()
    for out in outs:
        assert get_op("attention").error(out, ref) < 5e-3


def test_dispatcher_serves_speculative_decode_with_it(cp, rng):
    """Lq = 4 causal with grouped heads: no other CUDA variant serves it (SDPA's causal is
    top-left aligned); the dispatcher, choosing on its own, picks a config of a split-KV
    variant."""
    from adaptive.dispatch import Dispatcher
    from adaptive.policy import MeasureEach
    d = Dispatcher(backend="cuda", policy=MeasureEach())
    dev, host = _inputs(cp, rng, "float16", 2, 32, 8, 4, 3001, 128)
    out = cp.full(tuple(dev[0].shape), np.nan, "float16")
    d.launch("attention", *dev, out=out, causal=True)
    cp.cuda.Device().synchronize()
    op = get_op("attention")
    plan = d._plans[op.key(tuple(dev), {"causal": True})]
    assert plan.candidate.variant.name in NAMES, plan.candidate.label
    assert op.error(out, op.reference(*host, causal=True)) < op.tolerance["float16"]


def _padding_mask(rng, b, h, lq, lk, kind, layout, hide_row):
    """A left-padding mask [B or 1, 1 or H, Lq, Lk] (random pads up to a quarter of Lk plus a
    few): ``kind`` bool, add (0 / -inf) or min (0 / the dtype's finite minimum); with
    ``hide_row`` query row 0 of the last mask row set sees nothing."""
    shape = (b if layout[0] else 1, h if layout[1] else 1, lq, lk)
    seen = padding_mask(rng, shape, lk // 4 + 3)
    if hide_row:
        seen[-1, :, 0, :] = False
    return seen


def _mask_arrays(cp, seen, kind, dtype):
    """(device mask, float64/bool host mask) of ``kind`` in the inputs' array type."""
    if kind == "bool":
        if dtype == "bfloat16":
            import torch
            return torch.from_numpy(seen).cuda(), seen
        return cp.asarray(seen), seen
    hidden = -np.inf if kind == "add" else \
        float(np.finfo(np.float16).min if dtype == "float16" else -3.3895313892515355e38)
    add = np.where(seen, 0.0, hidden)
    if dtype == "bfloat16":
        import torch
        dev = torch.from_numpy(add.astype(np.float32)).cuda().to(torch.bfloat16)
        return dev, dev.double().cpu().numpy()
    dev = cp.asarray(add.astype(dtype))
    return dev, cp.asnumpy(dev).astype(np.float64)


MASKED = [(lk, lq, group) for lk in (97, 1025, 4097) for lq in (1, 4) for group in (1, 4)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["bool", "add", "min"])
@pytest.mark.parametrize("lk,lq,group", MASKED, ids=[f"Lk{a}-Lq{b}-G{c}" for a, b, c in MASKED])
def test_padding_mask(dispatcher, cp, rng, lk, lq, group, kind, name):
    """Left padding masks read by the MASKED configs, one config per split size: masked keys
    as -inf (a row hidden everywhere gives zeros, NaN-poisoned out fully written), additive
    values in the logits; against the op's float64 reference with the same mask."""
    i = MASKED.index((lk, lq, group))
    dtype = ("float16", "bfloat16")[i % 2]
    d = (128, 64)[(i // 2) % 2]
    layout = ((1, 0), (1, 1), (0, 0))[i % 3]
    causal = bool(i % 4 == 3)
    magnitude = 30.0 if i % 5 == 0 else 1.0
    hkv = 2
    b, h = 3, group * hkv
    dev, host = _inputs(cp, rng, dtype, b, h, hkv, lq, lk, d, magnitude)
    hide = kind != "min"      # a row of finite minima is a softmax of its scores, not hidden
    mdev, mhost = _mask_arrays(cp, _padding_mask(rng, b, h, lq, lk, kind, layout, hide), kind,
                               dtype)
    dev, host = [*dev, mdev], [*host, mhost]
    fitting = _fitting(dev, causal, name=name)
    assert fitting and all(c["MASKED"] == 1 for c in fitting), (name, d, lq, group)
    for kps in sorted({c["KPS"] for c in fitting}):
        config = next(c for c in fitting if c["KPS"] == kps)
        _check(dispatcher, cp, config, dtype, dev, host, causal,
               what=f"{kind} mask {layout} Lk={lk} Lq={lq} G={group} x{magnitude:g}", name=name)
        if hide:
            out = _run(dispatcher, cp, config, dtype, dev, causal, name=name)
            rows = out[-1 if layout[0] else slice(None), :, 0]
            assert not rows.any(), f"{name}[{_label(config)}]: a hidden row is not zero"


def test_dispatcher_serves_padded_decode_with_it(rng):
    """A left-padded decode batch as transformers passes it (torch tensors, a boolean
    [B, 1, Lq, Lk] mask, causal=False) at B = 8, Lk = 4096, 32/8 heads, Lq 1 and 4: the
    dispatcher, timing every candidate, picks a MASKED config of a split-KV variant (SDPA
    with a mask ran at 17-19% of copy, runs S15/S16) and its result is right."""
    import torch
    from adaptive.dispatch import Dispatcher
    from adaptive.policy import MeasureEach
    op = get_op("attention")
    for lq in (1, 4):
        d = Dispatcher(backend="cuda", policy=MeasureEach())
        host = [rng.standard_normal(s) for s in ((8, 32, lq, 128), (8, 8, 4096, 128),
                                                 (8, 8, 4096, 128))]
        pad = rng.integers(0, 1025, size=8)
        seen = np.arange(4096)[None, None, None, :] >= pad[:, None, None, None]
        seen = np.ascontiguousarray(np.broadcast_to(seen, (8, 1, lq, 4096)))
        dev = [torch.from_numpy(x.astype(np.float16)).cuda() for x in host] + \
            [torch.from_numpy(seen).cuda()]
        out = d.launch("attention", *dev)
        torch.cuda.synchronize()
        plan = d._plans[op.key(tuple(dev), {})]
        assert plan.candidate.variant.name in NAMES, plan.candidate.label
        assert plan.candidate.config["MASKED"] == 1
        ref = op.reference(*[x.astype(np.float16) for x in host], seen)
        assert op.error(out.double().cpu().numpy(), ref) < op.tolerance["float16"]
