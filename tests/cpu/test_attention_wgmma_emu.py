"""attention_wgmma.cu itself (flash_wgmma), run on the CPU against the float64 reference: the
wgmma helpers of adaptive/include/adaptive_wgmma.cuh emulated by tests/cpu/ptx_emu.h (the
operands read through their descriptors in the PTX ISA's 128-byte swizzle, the accumulator
and register-A layouts of the ISA), the rest compiled by g++ as written and launched on the
manifest's grid, block and shared memory.

What the emulation checks: the swizzled tile stores against the descriptors that read them
(q and k K-major, v MN-major with its two 64-column halves LBO apart at HD = 128), the k16
steps within a row, the double buffers (PIPE = 1: K a tile ahead of V, P in two halves),
P's registers as the A fragment, the masks and the online softmax; one and two warpgroups
a CTA; partial and wholly masked tiles, a single query row, a negative scale, large logits,
grouped-query heads (a key/value head read for each of its query heads); and the
asynchrony as far as the latest reading allows: an emulated wgmma runs when its group is
waited for (its tiles and A registers read then, its accumulators written then), so an
accumulator read before its wait, or a tile or P register overwritten while its product is
in flight, gives wrong results here (PIPE = 1 lives on both). What it cannot: a missing
proxy fence, and whether the H200 reads the descriptors as the ISA says:
tests/gpu/test_attention_wgmma_cuda.py runs the kernel there."""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_emu  # noqa: E402
from background import Job  # noqa: E402

from adaptive import nvrtc  # noqa: E402
from adaptive.limits import SM90  # noqa: E402
from adaptive.ops import get_op  # noqa: E402
from adaptive.ops.attention import padding_mask  # noqa: E402
from adaptive.variants import builtin_folder, load_manifest  # noqa: E402

FOLDER = builtin_folder() / "attention"

WRAPPER = ("extern \"C\" void emu_run(unsigned gx, unsigned gy, unsigned bx, const __half* q, "
           "const __half* k, const __half* v, __half* out, int Lq, int Lk, int H, int Hkv, "
           "float scale, int causal, const void* mask, int msb, int msh, int mbool) {\n"
           "  emu_launch(gx, gy, 1, bx, 1, 1, [=] { attention_wgmma(q, k, v, out, Lq, Lk, H, "
           "Hkv, scale, causal, mask, msb, msh, mbool); });\n}\n")

CONFIGS = {  # name -> config: head dims, tile widths, warpgroup counts, with and without PIPE
    "d64-bn64-wg1": {"HD": 64, "BN": 64, "NWG": 1, "PIPE": 0, "MASKED": 0},
    "d64-bn64-wg1-pipe": {"HD": 64, "BN": 64, "NWG": 1, "PIPE": 1, "MASKED": 0},
    "d64-bn128-wg2-pipe": {"HD": 64, "BN": 128, "NWG": 2, "PIPE": 1, "MASKED": 0},
    "d128-bn64-wg2": {"HD": 128, "BN": 64, "NWG": 2, "PIPE": 0, "MASKED": 0},
    "d128-bn64-wg2-pipe": {"HD": 128, "BN": 64, "NWG": 2, "PIPE": 1, "MASKED": 0},
    "d128-bn128-wg1": {"HD": 128, "BN": 128, "NWG": 1, "PIPE": 0, "MASKED": 0},
    # with a padding mask
    "d64-bn64-wg1-masked": {"HD": 64, "BN": 64, "NWG": 1, "PIPE": 0, "MASKED": 1},
    "d64-bn128-wg2-pipe-masked": {"HD": 64, "BN": 128, "NWG": 2, "PIPE": 1, "MASKED": 1},
    "d128-bn128-wg2-masked": {"HD": 128, "BN": 128, "NWG": 2, "PIPE": 0, "MASKED": 1},
}
UNMASKED = [n for n, c in CONFIGS.items() if not c["MASKED"]]
MASKED = [n for n, c in CONFIGS.items() if c["MASKED"]]


def _variant():
    (v,) = [v for v in load_manifest(FOLDER / "manifest.toml") if v.name == "flash_wgmma"]
    return v


PRODUCTS = Path(__file__).resolve().parents[1] / "gpu" / "wgmma_products.cu"
PRODUCT_SIZES = [(64, 64), (128, 128), (64, 128), (128, 64)]   # (PN, PK)
PRODUCT_WRAPPER = (
    "extern \"C\" void emu_ss(const __half* a, const __half* b, float* out, int lbo, "
    "int sbo) {\n  emu_launch(1, 1, 1, 128, 1, 1, [=] { wgmma_ss_product(a, b, out, lbo, "
    "sbo); });\n}\n"
    "extern \"C\" void emu_rs(const __half* p, const __half* v, float* out, int lbo, "
    "int sbo) {\n  emu_launch(1, 1, 1, 128, 1, 1, [=] { wgmma_rs_product(p, v, out, lbo, "
    "sbo); });\n}\n")


def emu_jobs(folder: Path) -> dict:
    """Each config the cases use, then each size of the two products alone: its library ->
    (source, g++ flags)."""
    text = (cuda_emu.HEADER + cuda_emu.PTX + cuda_emu.VOTE_HALF
            + cuda_emu.kernel_source(FOLDER / "attention_wgmma.cu") + "\n" + WRAPPER)
    jobs = {folder / f"wgmma_{i}.so": (text, [f"-D{k}={v}" for k, v in config.items()])
            for i, config in enumerate(CONFIGS.values())}
    products = (cuda_emu.HEADER + cuda_emu.PTX + cuda_emu.VOTE_HALF
                + cuda_emu.kernel_source(PRODUCTS) + "\n" + PRODUCT_WRAPPER)
    jobs.update({folder / f"products_{n}_{k}.so": (products, [f"-DPN={n}", f"-DPK={k}"])
                 for n, k in PRODUCT_SIZES})
    return jobs


# ptxas' verdict on every config (NVRTC, no device): compiled in the background at nice 19,
# one JSON line a config
_PTXAS = r"""
import json, sys
from adaptive import nvrtc
from adaptive.limits import SM90
from adaptive.variants import builtin_folder, load_manifest
(v,) = [v for v in load_manifest(builtin_folder() / "attention" / "manifest.toml")
        if v.name == "flash_wgmma"]
source = nvrtc.full_source(v.source, "float16", "attention_wgmma.cu")
with open(sys.argv[1], "w") as out:
    for config in v.space.configs(SM90):
        _, log = nvrtc.compile_source(source, nvrtc.macro_options(config) + v.options)
        out.write(json.dumps({"config": config, "used": nvrtc.parse_ptxas(log, v.entry),
                              "log": log}) + "\n")
"""
BACKGROUND = {
    **cuda_emu.background_build(__file__, cpu_s=20.0),
    **({"wgmma-ptxas": Job(lambda folder, config: ["-c", _PTXAS, str(folder / "ptxas.jsonl")],
                           cpu_s=14.0, nice=19, cwd=Path(__file__).resolve().parents[2])}
       if nvrtc.available() else {}),
}


@pytest.fixture(scope="module")
def kernels(background):
    """config name -> emu_run, compiled once in the background."""
    libs = cuda_emu.built(background, __file__, emu_jobs)[:len(CONFIGS)]
    out = {}
    for name, lib in zip(CONFIGS, libs):   # CONFIGS' order: emu_jobs lists them so
        fn = ctypes.CDLL(str(lib)).emu_run
        fn.argtypes = [ctypes.c_uint] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + \
            [ctypes.c_float, ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 3
        out[name] = fn
    return out


def _scope(q, k, causal, scale=None, mask=None):
    args = (q, k, k) if mask is None else (q, k, k, mask)
    return get_op("attention").problem(args, {"causal": causal, "scale": scale}).scope()


def _launch(fn, config, q, k, v, causal, scale, mask=None):
    variant = _variant()
    assert config in variant.space.configs(SM90), config
    args = (q, k, v) if mask is None else (q, k, v, mask)
    problem = get_op("attention").problem(args, {"causal": causal, "scale": scale})
    scope = {**problem.scope(), **config, **SM90}
    assert variant.fits(scope, config), variant.why_not(scope, config)
    mask_args = cuda_emu.attention_mask_args(problem, scope, mask)
    grid, block, _ = cuda_emu.launch_geometry(variant, scope)
    b, h, lq, d = q.shape
    s = 1.0 / np.sqrt(d) if scale is None else scale
    out = np.full(q.shape, np.nan, np.float16)
    fn(grid[0], grid[1], block, q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data,
       lq, k.shape[2], h, k.shape[1], s, int(causal), *mask_args)
    return out


CASES = [  # (B, H, Hkv, Lq, Lk), causal, scale, magnitude of q and k
    ((1, 2, 2, 150, 230), True, -0.2, 1.0),  # partial last row block and key tile, the
    # causal limit shifted by Lk - Lq = 80, a negative scale (q negated in shared memory)
    ((2, 1, 1, 130, 130), True, 0.3, 20.0),  # large logits (scores in the hundreds)
    ((1, 1, 1, 100, 300), False, None, 1.0),  # not causal: 3-5 key tiles through both buffers
    ((2, 2, 2, 1, 200), True, None, 1.0),    # one query row (decode): 63 rows of the block
    # computed on zeros and never stored
    ((2, 6, 2, 70, 150), True, None, 1.0),   # grouped-query heads: 3 query heads a kv head
]


@pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")
@pytest.mark.parametrize("name", UNMASKED)
@pytest.mark.parametrize("dims,causal,scale,magnitude", CASES,
                         ids=["shifted-negative-scale", "large-logits", "full-long-keys",
                              "one-row", "grouped-query"])
def test_flash_wgmma_emulated_against_float64(kernels, rng, name, dims, causal, scale,
                                              magnitude):
    b, h, hkv, lq, lk = dims
    d = CONFIGS[name]["HD"]
    q = (rng.standard_normal((b, h, lq, d)) * magnitude).astype(np.float16)
    k = (rng.standard_normal((b, hkv, lk, d)) * 1.5 * magnitude).astype(np.float16)
    v = rng.standard_normal((b, hkv, lk, d)).astype(np.float16)
    want = get_op("attention").reference(q, k, v, causal=causal, scale=scale)
    got = _launch(kernels[name], CONFIGS[name], q, k, v, causal, scale)
    assert not np.isnan(got).any(), f"{name}: elements left unwritten (or NaN)"
    err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert err < 4e-3, f"{name} {dims} causal={causal}: rel. error {err:.3g}"


MASKED_CASES = [  # (B, H, Hkv, Lq, Lk), causal, mask kind, layout (per batch, per head),
    # magnitude; kind: bool, add (0 / -inf in fp16), min (0 / finfo(fp16).min); the last
    # mask row set's query row 0 sees no key (bool, add)
    ((2, 4, 2, 150, 150), True, "bool", (1, 0), 1.0),    # a batch left-padded, as
    # transformers masks a padded prefill (its causal triangle in the mask and the flag)
    ((2, 2, 2, 70, 200), False, "add", (1, 1), 1.0),     # per head, additive -inf, 4 tiles
    ((1, 2, 1, 100, 130), True, "min", (0, 0), 20.0),    # one mask for all, finite minima,
    # logits x20
    ((2, 4, 2, 160, 176), False, "triangle", (1, 0), 1.0),   # as transformers passes a
    # padded prefill: not causal, the bottom-right triangle and the padding in a boolean mask
    # of Lk % 16 == 0 (the kernel leaves out each CTA's key tiles no row of it sees)
    ((2, 4, 2, 160, 176), False, "triangle+", (1, 0), 1.0),  # the same with query row 0
    # seeing the last key too: the tiles up to it stay in
    ((1, 2, 2, 129, 129), False, "triangle", (1, 1), 1.0),   # Lk % 16 != 0: byte loads;
    # the last row's block sees one key of its last tile, the tile's first
    ((2, 2, 2, 320, 320), False, "triangle-pad", (1, 0), 1.0),   # the second entry padded
    # by 150: the row blocks past its padding leave out their first key tiles too (one of
    # 128 keys, two of 64: the first tile computed of either parity)
]


def _padding_mask(rng, b, h, lq, lk, kind, layout, hide_row: bool):
    """cuda_emu.attention_padding_mask, and the triangle kinds: the causal triangle
    (bottom-right) in a boolean padding mask, a row in the padding seeing itself
    (transformers un-masks such rows); triangle+: query row 0 sees the last key too;
    triangle-pad: entry e padded by 150 e keys."""
    if not kind.startswith("triangle"):
        return cuda_emu.attention_padding_mask(rng, b, h, lq, lk, kind, layout, hide_row)
    shape = (b if layout[0] else 1, h if layout[1] else 1, lq, lk)
    seen = padding_mask(rng, shape, lk // 4 + 3)
    i = np.arange(lq)[:, None] + (lk - lq)
    j = np.arange(lk)[None, :]
    if kind == "triangle-pad":
        seen = np.stack([(j >= 150 * e)[None] for e in range(shape[0])])
    seen = (seen & (j <= i)) | (j == i)
    if kind == "triangle+":
        seen[..., 0, -1] = True
    return seen


@pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")
@pytest.mark.parametrize("name", MASKED)
@pytest.mark.parametrize("dims,causal,kind,layout,magnitude", MASKED_CASES,
                         ids=["padded-prefill-bool", "per-head-add", "broadcast-min-x20",
                              "triangle-in-the-mask", "triangle-and-a-future-key",
                              "triangle-odd-lk-per-head", "triangle-left-padding"])
def test_masked_flash_wgmma_emulated_against_float64(kernels, rng, name, dims, causal, kind,
                                                     layout, magnitude):
    """MASKED = 1: each key's mask term in its log2-domain logit (hidden keys -inf, a row
    hidden everywhere gives 0), against the op's float64 reference with the same mask."""
    b, h, hkv, lq, lk = dims
    d = CONFIGS[name]["HD"]
    q = (rng.standard_normal((b, h, lq, d)) * magnitude).astype(np.float16)
    k = (rng.standard_normal((b, hkv, lk, d)) * 1.5 * magnitude).astype(np.float16)
    v = rng.standard_normal((b, hkv, lk, d)).astype(np.float16)
    hide = kind in ("bool", "add")
    mask = _padding_mask(rng, b, h, lq, lk, kind, layout, hide)
    want = get_op("attention").reference(q, k, v, mask, causal=causal, scale=None)
    got = _launch(kernels[name], CONFIGS[name], q, k, v, causal, None, mask)
    assert not np.isnan(got).any(), f"{name}: elements left unwritten (or NaN)"
    err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert err < 4e-3, f"{name} {dims} {kind}: rel. error {err:.3g}"
    if hide:
        rows = got[-1 if layout[0] else slice(None), :, 0]
        assert not rows.any(), f"a row that sees no key gave {rows[rows != 0][:4]}"


@pytest.fixture(scope="module")
def products(background):
    """(PN, PK) -> (ss, rs): the two products alone (tests/gpu/wgmma_products.cu)."""
    libs = cuda_emu.built(background, __file__, emu_jobs)[len(CONFIGS):]
    out = {}
    for size, lib in zip(PRODUCT_SIZES, libs):
        dll = ctypes.CDLL(str(lib))
        for fn in (dll.emu_ss, dll.emu_rs):
            fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2
        out[size] = (dll.emu_ss, dll.emu_rs)
    return out


@pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")
@pytest.mark.parametrize("pn,pk", PRODUCT_SIZES, ids=[f"N{n}-K{k}" for n, k in PRODUCT_SIZES])
def test_the_products_alone_emulated_against_float64(products, rng, pn, pk):
    """The GPU test runs the same kernels on the device: emulated, they are the PTX ISA's
    products, so a disagreement there is the device reading a layout otherwise."""
    ss, rs = products[(pn, pk)]
    a = rng.standard_normal((64, pk)).astype(np.float16)
    b = rng.standard_normal((pn, pk)).astype(np.float16)
    out = np.full((64, pn), np.nan, np.float32)
    ss(a.ctypes.data, b.ctypes.data, out.ctypes.data, 16, 1024)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64).T,
                               rtol=1e-5, atol=1e-4)
    v = rng.standard_normal((pk, pn)).astype(np.float16)
    out = np.full((64, pn), np.nan, np.float32)
    rs(a.ctypes.data, v.ctypes.data, out.ctypes.data, pk * 128, 1024)
    np.testing.assert_allclose(out, a.astype(np.float64) @ v.astype(np.float64),
                               rtol=1e-5, atol=1e-4)


def test_flash_wgmma_claims_hopper_only():
    """The sm_90a cubins run on compute capability 9.0 only: no config exists elsewhere (a
    Blackwell has no wgmma); float32 and masked inputs are not claimed."""
    v = _variant()
    # 32 combinations: PIPE at HD = BN = 128 would spill (2 with a mask, 2 without), and
    # the mask's loads in one warpgroup at HD = BN = 128 (1)
    assert len(v.space.configs(SM90)) == 27
    assert v.space.configs({**SM90, "cc": 100}) == []
    assert v.space.configs({**SM90, "cc": 80}) == []
    assert "--gpu-architecture=sm_90a" in v.options
    q = np.zeros((1, 2, 129, 64), np.float16)
    config = CONFIGS["d64-bn64-wg1"]
    assert v.fits({**_scope(q, q, True), **SM90}, config)
    assert not v.fits({**_scope(q.astype(np.float32), q.astype(np.float32), True), **SM90},
                      config)
    assert not v.fits({**_scope(q, q, True), **SM90}, CONFIGS["d128-bn64-wg2"]), "HD != D"
    assert v.fits({**_scope(q, q[:, :1].copy(), True), **SM90}, config), "grouped-query heads"
    assert {**CONFIGS["d128-bn128-wg1"], "PIPE": 1} not in v.space.configs(SM90)
    assert {**CONFIGS["d128-bn128-wg1"], "MASKED": 1} not in v.space.configs(SM90)
    mask = np.ones((1, 1, 129, 129), bool)
    assert not v.fits({**_scope(q, q, True, mask=mask), **SM90}, config), "MASKED == masked"
    assert v.fits({**_scope(q, q, True, mask=mask), **SM90}, CONFIGS["d64-bn64-wg1-masked"])


@pytest.mark.skipif(not nvrtc.available(), reason="cuda.bindings is not installed")
def test_every_config_compiles_for_sm90a_without_spills_or_serialized_wgmma(background):
    """ptxas' own verdicts, read on the CPU: no config spills registers, and none has its
    wgmma chains serialized (C7510-C7515: a non-wgmma instruction touching an in-flight
    accumulator, too few registers for the pipeline; the kernel would run, slowly). S zeroed
    before its chain rather than the first k-step's scale-d 0 avoids C7511 under PIPE = 1."""
    done = background("wgmma-ptxas")
    path = done.folder / "ptxas.jsonl"
    assert done.rc == 0 and path.exists(), done.report()
    seen = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["config"] for r in seen] == _variant().space.configs(SM90)
    for r in seen:
        config, used, log = r["config"], r["used"], r["log"]
        assert used["spill_store_bytes"] == used["spill_load_bytes"] == 0, (config, log)
        assert used["stack_bytes"] == 0, (config, "local memory (an indexed register array?)")
        assert "C751" not in log and "serialized" not in log, (config, log)
