"""attention's wgmma kernel (flash_wgmma, sm_90a) against the float64 reference on the GPU:
whether the H200 reads the swizzled tiles through the descriptors as the CPU emulation of
the PTX ISA does (tests/cpu/test_attention_wgmma_emu.py runs the same kernel there).

Fresh random inputs per test; outputs poisoned with NaN before every run (an unwritten
element fails); every case runs twice on the same input and must give the same bits.
Covered: every config on causal and full inputs; odd lengths (1, 63, 65, 200, 1000, 4097
keys; 1 to 1000 query rows), bottom-right causal with Lq < Lk, grouped-query heads (4 query
heads a key/value head), fp16 (CuPy) and bf16 (PyTorch), D 64 and 128, logits x20, a
negative scale; padding masks (MASKED = 1: boolean per batch entry, additive per head, one
of finite minima for the batch, a row hidden everywhere). And the two wgmma products alone
(wgmma_products.cu, emulated on the CPU too): where the kernel is wrong on the device,
which product and layout path is, and how (the share of rows, their phases mod 8, the
columns).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

from adaptive.limits import SM90
from adaptive.variants import builtin_folder, load_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_checks  # noqa: E402

pytestmark = pytest.mark.gpu

NAME = "flash_wgmma"
(VARIANT,) = [v for v in load_manifest(builtin_folder() / "attention" / "manifest.toml")
              if v.name == NAME]
CONFIGS = VARIANT.space.configs(SM90)
PLAIN = [c for c in CONFIGS if not c["MASKED"]]     # the configs of inputs without a mask
MASKED = [c for c in CONFIGS if c["MASKED"]]
_label, _inputs = attention_checks.label, attention_checks.inputs
_check = functools.partial(attention_checks.check, name=NAME)


@pytest.fixture(scope="module")
def dispatcher():
    from adaptive.dispatch import Dispatcher
    return Dispatcher(backend="cuda")


def test_the_device_is_the_variants():
    """On this device (an H200: compute capability 9.0) every config of the space exists."""
    from adaptive.backends import device_limits
    assert device_limits(0)["cc"] == 90
    assert len(CONFIGS) == 27 and len(PLAIN) == 14


@pytest.mark.parametrize("config", PLAIN, ids=[_label(c) for c in PLAIN])
def test_every_config(dispatcher, cp, rng, config):
    d = config["HD"]
    for (b, h, hkv, lq, lk, causal) in ((1, 4, 4, 1000, 1000, True), (2, 3, 3, 200, 777, True),
                                        (1, 2, 2, 333, 4097, False), (2, 2, 2, 1, 65, True),
                                        (2, 8, 2, 300, 300, True)):
        dev, host = _inputs(cp, rng, "float16", b, h, hkv, lq, lk, d)
        _check(dispatcher, cp, config, "float16", dev, host, causal,
               what=f"B={b} H={h} Hkv={hkv} Lq={lq} Lk={lk}")


SHAPES = [(lq, lk) for lk in (1, 63, 65, 200, 1000) for lq in (1, 17, 64, 129, 1000) if lq <= lk]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lq,lk", SHAPES, ids=[f"Lq{a}-Lk{b}" for a, b in SHAPES])
def test_shapes(dispatcher, cp, rng, lq, lk, causal):
    i = SHAPES.index((lq, lk))
    dtype = ("float16", "bfloat16")[(i + causal) % 2]
    d = (64, 128)[i % 2]
    dev, host = _inputs(cp, rng, dtype, 2, 2, 2, lq, lk, d)
    fitting = [c for c in PLAIN if c["HD"] == d]
    config = fitting[(i + causal) % len(fitting)]
    _check(dispatcher, cp, config, dtype, dev, host, causal, what=f"Lq={lq} Lk={lk}")


@pytest.mark.parametrize("config", [c for c in PLAIN if c["NWG"] == 2 and c["BN"] * c["HD"]
                                    + c["PIPE"] * 8192 == 16384],
                         ids=lambda c: _label(c))
def test_large_logits_and_a_negative_scale(dispatcher, cp, rng, config):
    dev, host = _inputs(cp, rng, "float16", 1, 2, 2, 300, 300, config["HD"], magnitude=20.0)
    _check(dispatcher, cp, config, "float16", dev, host, True, scale=0.05, what="logits x20")
    _check(dispatcher, cp, config, "float16", dev, host, True, scale=-0.05,
           what="a negative scale")


@pytest.mark.parametrize("config", MASKED, ids=[_label(c) for c in MASKED])
def test_every_masked_config(dispatcher, cp, rng, config):
    """MASKED = 1 on padding masks as transformers builds them: a left-padded batch's
    boolean mask per batch entry (causal), an additive -inf mask per head, one mask of
    finite minima for the batch with logits x20; bf16 with a boolean mask; a row hidden
    everywhere gives zeros; the causal triangle in the mask itself, not causal (the tiles
    past a CTA's last seen key left out)."""
    from adaptive.ops.attention import padding_mask
    d = config["HD"]
    for i, (b, h, hkv, lq, lk, causal, kind, per_batch, per_head, dtype) in enumerate((
            (2, 4, 2, 300, 300, True, "bool", 1, 0, "float16"),
            (2, 2, 2, 77, 400, False, "add", 1, 1, "float16"),
            (1, 2, 1, 129, 200, True, "min", 0, 0, "float16"),
            (2, 2, 2, 256, 256, True, "bool", 1, 0, "bfloat16"),
            (2, 8, 2, 400, 400, False, "triangle", 1, 0, "float16"))):
        dev, host = _inputs(cp, rng, dtype, b, h, hkv, lq, lk, d,
                            magnitude=20.0 if kind == "min" else 1.0)
        seen = padding_mask(rng, (b if per_batch else 1, h if per_head else 1, lq, lk),
                            lk // 4 + 3)
        if kind == "triangle":   # transformers' padded prefill: not causal, the triangle in
            i = np.arange(lq)[:, None] + (lk - lq)   # the mask (the kernel leaves out the
            j = np.arange(lk)[None, :]               # tiles a CTA's rows do not see)
            seen = (seen & (j <= i)) | (j == i)
            kind = "bool"
        elif kind != "min":
            seen[-1, :, 0, :] = False          # this row sees no key: zeros
        if kind == "bool":
            mask = seen
        else:
            hidden = -np.inf if kind == "add" else float(np.finfo(np.float16).min)
            mask = np.where(seen, 0.0, hidden).astype(np.float16)
        if dtype == "bfloat16":
            import torch
            dev_mask = torch.from_numpy(mask).cuda()
        else:
            dev_mask = cp.asarray(mask)
        _check(dispatcher, cp, config, dtype, [*dev, dev_mask], [*host, mask], causal,
               what=f"case {i}: {kind} mask, B={b} H={h} Hkv={hkv} Lq={lq} Lk={lk}")


PRODUCTS = Path(__file__).with_name("wgmma_products.cu")


def _diagnosis(got, want) -> str:
    """Where a product went wrong: the share of rows and columns with a wrong element, the
    first wrong element (a swizzle or a descriptor offset read otherwise shows as a
    pattern: every row but those of one phase, a column block, all of it)."""
    bad = ~np.isclose(got, want, rtol=1e-3, atol=1e-2)
    if not bad.any():
        return "right"
    r, c = np.argwhere(bad)[0]
    phases = sorted({int(x) % 8 for x in np.where(bad.any(1))[0]})
    return (f"{bad.mean():.0%} of elements wrong; rows with one: {bad.any(1).sum()} of "
            f"{bad.shape[0]} (those mod 8: {phases}), "
            f"columns: {bad.any(0).sum()} of {bad.shape[1]}; first at ({r}, {c}): "
            f"{got[r, c]:.4g} for {want[r, c]:.4g}")


# Where the device disagrees with the ISA's reading (first), the readings tried next, each
# (what it is, LBO, SBO); the one that agrees says what to change in the kernel's
# descriptors.
def _readings(name: str, pk: int) -> list[tuple[str, int, int]]:
    if name == "wgmma_ss_product":    # K-major q, k: LBO unused by the 128-byte swizzle
        return [("the ISA's (LBO 16, SBO 1024)", 16, 1024), ("LBO 0", 0, 1024),
                ("LBO and SBO swapped", 1024, 16), ("SBO 128 (rows, not atoms)", 16, 128)]
    return [(f"the ISA's (LBO {pk * 128}, SBO 1024)", pk * 128, 1024),    # MN-major v
            ("LBO and SBO swapped", 1024, pk * 128), ("SBO 128", pk * 128, 128),
            ("LBO 1024 (an atom)", 1024, 1024)]


@pytest.mark.parametrize("pn,pk", [(64, 64), (128, 128), (64, 128), (128, 64)],
                         ids=lambda x: str(x))
def test_the_wgmma_products_alone(cp, rng, tmp_path, pn, pk):
    """The two products of adaptive_wgmma.cuh on one warpgroup with the attention kernel's
    layouts (q, k K-major; v MN-major, its halves LBO apart): which one, if any, the device
    reads otherwise than the PTX ISA as the CPU emulates it; then which other descriptor
    reading, if any, it agrees with."""
    from adaptive import nvrtc
    source = nvrtc.full_source(PRODUCTS.read_text(), "float16", PRODUCTS.name)
    cubin, _ = nvrtc.compile_source(source, (f"-DPN={pn}", f"-DPK={pk}",
                                             "--gpu-architecture=sm_90a"))
    (tmp_path / "p.cubin").write_bytes(cubin)
    module = cp.RawModule(path=str(tmp_path / "p.cubin"))
    a = rng.standard_normal((64, pk)).astype(np.float16)
    b = rng.standard_normal((pn, pk)).astype(np.float16)
    v = rng.standard_normal((pk, pn)).astype(np.float16)
    for name, second, want, smem in (
            ("wgmma_ss_product", b, a.astype(np.float64) @ b.astype(np.float64).T,
             1024 + (64 + pn) * pk * 2),
            ("wgmma_rs_product", v, a.astype(np.float64) @ v.astype(np.float64),
             1024 + pk * pn * 2)):
        fn = module.get_function(name)
        fn.max_dynamic_shared_size_bytes = smem

        def run(lbo, sbo):
            out = cp.full((64, pn), cp.nan, cp.float32)
            fn((1,), (128,), (cp.asarray(a), cp.asarray(second), out, np.int32(lbo),
                              np.int32(sbo)), shared_mem=smem)
            return cp.asnumpy(out).astype(np.float64)
        readings = _readings(name, pk)
        got = run(*readings[0][1:])
        if np.allclose(got, want, rtol=1e-3, atol=1e-2):
            continue
        agrees = [what for what, lbo, sbo in readings[1:]
                  if np.allclose(run(lbo, sbo), want, rtol=1e-3, atol=1e-2)]
        pytest.fail(f"{name} N={pn} K={pk}: {_diagnosis(got, want)}; the device agrees with "
                    f"{', '.join(agrees) or 'none of the other readings tried'}")
