"""attention_splitkv.cu itself, run on the CPU: its PTX helpers (adaptive_ptx.cuh: cp.async,
ldmatrix, mma.sync, ex2) are the C++ emulations of tests/cpu/ptx_emu.h (whose fragment
layouts reproduce a kernel the H200 tests check), the rest of the kernel is compiled by g++ as
written (fp16 as _Float16) and launched on the grid, block and workspace the manifest gives,
against the float64 reference. Checks the row-to-head mapping of grouped-query heads, the
bottom-right causal limits per row, keys off the tiles and off the splits, the merge of the
warps of an m tile and of the splits (the last CTA, the counters left at zero), and the
single-pass path. (tests/cpu/test_nvrtc.py compiles every config for sm_90, spills checked.)
splitkv2_mma (attention_splitkv2.cu) runs the same way: its cp.async ring deeper than a
split's tiles, 32-key warp steps, 16 warps, row groups (RB below the group's rows: each
row group's last CTA merges its own rows, the counters per row group), and the merge's
threads in parts over the splits where the rows are few. Both with a padding mask (MASKED = 1
configs): boolean and additive masks of every layout the op takes (per batch entry or one for
the batch, broadcast over heads or per head), random left padding, a row hidden everywhere,
large logits, odd Lk over several splits; and which configs claim masked inputs.
The memory model is not emulated (copies land at issue): a missing wait can pass here."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_emu  # noqa: E402
from adaptive.limits import SM90  # noqa: E402
from adaptive.ops import get_op  # noqa: E402
from adaptive.variants import builtin_folder, load_manifest  # noqa: E402

FOLDER = builtin_folder() / "attention"
SOURCES = {"splitkv_mma": (FOLDER / "attention_splitkv.cu", "attention_splitkv"),
           "splitkv2_mma": (FOLDER / "attention_splitkv2.cu", "attention_splitkv2")}


def _variant(name: str = "splitkv_mma"):
    (v,) = [v for v in load_manifest(FOLDER / "manifest.toml") if v.name == name]
    return v


def _wrapped_source(name: str) -> str:
    source, entry = SOURCES[name]
    wrapper = ("extern \"C\" void emu_run(unsigned gx, unsigned gy, unsigned bx, const __half* q, "
               "const __half* k, const __half* v, __half* out, int Lq, int Lk, int H, int Hkv, "
               "float scale, int causal, float* ws, const void* mask, int msb, int msh, "
               "int mbool) {\n  emu_launch(gx, gy, 1, bx, 1, 1, [=] { "
               f"{entry}(q, k, v, out, Lq, Lk, H, Hkv, scale, causal, ws, mask, msb, msh, "
               "mbool); });\n}\n")
    return (cuda_emu.HEADER + cuda_emu.PTX + cuda_emu.VOTE_HALF
            + cuda_emu.kernel_source(source) + "\n" + wrapper)


def _load(lib):
    fn = ctypes.CDLL(str(lib)).emu_run
    fn.argtypes = [ctypes.c_uint] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + \
        [ctypes.c_float, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 3
    return fn


def _key(name: str, config) -> tuple:
    return name, tuple(sorted(config.items()))


def _configs() -> dict:
    """(variant, config) of every case: key -> (variant name, config)."""
    out = {}
    for case in CASES + CASES2 + MASKED_CASES:
        values = getattr(case, "values", case)
        name, config = ("splitkv_mma", values[0]) if isinstance(values[0], dict) else \
            values[:2]
        out[_key(name, config)] = (name, config)
    return out


def emu_jobs(folder: Path) -> dict:
    """Each (variant, config) the cases use: its library -> (source, g++ flags)."""
    texts = {name: _wrapped_source(name) for name in SOURCES}
    return {folder / f"splitkv_{i}.so": (texts[name], [f"-D{k}={v}" for k, v in config.items()])
            for i, (name, config) in enumerate(_configs().values())}


BACKGROUND = cuda_emu.background_build(__file__, cpu_s=40.0)


@pytest.fixture(scope="module")
def kernels(background):
    """Each (variant, config) the cases use, compiled once, side by side, in the
    background: key -> emu_run."""
    return {key: _load(lib) for key, lib in zip(_configs(),
                                                 cuda_emu.built(background, __file__, emu_jobs))}


def _launch(fn, variant, config, q, k, v, causal, scale, mask=None):
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    args = (q, k, v) if mask is None else (q, k, v, mask)
    problem = get_op("attention").problem(args, {"causal": causal, "scale": scale})
    scope = {**problem.scope(), **config, **SM90}
    assert variant.fits(scope, config), variant.why_not(scope, config)
    mask_args = cuda_emu.attention_mask_args(problem, scope, mask)
    grid, block, ev = cuda_emu.launch_geometry(variant, scope)
    ws = np.zeros(ev(variant.launch["workspace_bytes"]) // 4, np.float32)
    s = 1.0 / np.sqrt(d) if scale is None else scale
    outs = []
    for _ in range(2):                     # twice: the split counters must be back at zero
        out = np.full(q.shape, np.nan, np.float16)
        fn(grid[0], grid[1], block, q.ctypes.data, k.ctypes.data, v.ctypes.data,
           out.ctypes.data, lq, lk, h, hkv, s, int(causal), ws.ctypes.data, *mask_args)
        outs.append(out)
    row_groups = -(-(h // hkv * lq) // config["RB"]) if "RB" in config else 1
    n_counters = b * hkv * row_groups
    counters = ws[-n_counters:].view(np.uint32)
    assert not counters.any(), "the split counters were not reset to zero"
    assert np.array_equal(outs[0], outs[1]), "two runs on the same input differ"
    return outs[0], grid


def _config1(**changes) -> dict:
    return {"HD": 64, "KPS": 64, "BN": 64, "NWARPS": 4, "MASKED": 0, **changes}


CASES = [  # config, (B, H, Hkv, Lq, Lk), causal, scale
    (_config1(), (1, 8, 2, 1, 550), True, None),                        # 9 splits
    (_config1(), (1, 8, 2, 3, 113), True, None),
    pytest.param(_config1(KPS=256), (2, 8, 2, 3, 300), True, None,
                 marks=pytest.mark.slow),                              # 4 tiles a split
    (_config1(), (1, 8, 2, 9, 70), True, 0.3),                          # 3 m tiles
    pytest.param(_config1(HD=128, NWARPS=8), (1, 4, 1, 3, 47), False, None,
                 marks=pytest.mark.slow),                              # one split
    (_config1(), (1, 2, 2, 5, 66), True, -0.2),                         # MHA; a
    # last split of 2 keys, that rows 0..2 of the causal mask see nothing of
]


@pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")
@pytest.mark.parametrize("config,dims,causal,scale", CASES,
                         ids=["gqa-decode", "gqa-lq3", "gqa-lq3-tiles", "mtiles3", "one-split",
                              "mha-empty"])
def test_splitkv_kernel_emulated_against_float64(kernels, rng, config, dims, causal, scale):
    variant = _variant()
    assert config in variant.space.configs(SM90)
    fn = kernels[_key("splitkv_mma", config)]
    b, h, hkv, lq, lk = dims
    d = config["HD"]
    q = rng.standard_normal((b, h, lq, d)).astype(np.float16)
    k = (rng.standard_normal((b, hkv, lk, d)) * 1.5).astype(np.float16)
    v = rng.standard_normal((b, hkv, lk, d)).astype(np.float16)
    got, grid = _launch(fn, variant, config, q, k, v, causal, scale)
    want = get_op("attention").reference(q, k, v, causal=causal, scale=scale)
    assert not np.isnan(got).any(), "elements left unwritten (or NaN)"
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 4e-3, f"{config} {dims} causal={causal}: rel. error {err:.3g} (grid {grid})"



def _config2(**changes) -> dict:
    base = {"HD": 64, "KPS": 64, "BN": 64, "NWARPS": 4, "STAGES": 3, "KC": 16, "RB": 256,
            "MASKED": 0}
    return {**base, **changes}


CASES2 = [  # variant, config, (B, H, Hkv, Lq, Lk), causal, scale, magnitude of q and k
    ("splitkv2_mma", _config2(), (1, 8, 2, 1, 550), True, None, 1.0),       # 9 splits
    ("splitkv2_mma", _config2(KPS=256, STAGES=4, KC=32), (2, 8, 2, 3, 700), True, None, 1.0),
    # 3 splits of 4, 4 and 3 tiles: the ring refilled, keys off the last tile
    ("splitkv2_mma", _config2(NWARPS=8, RB=32), (1, 16, 2, 5, 200), True, 0.3, 1.0),
    # 40 rows a kv head in row groups of 32 and 8 (two and one m tiles), 4 splits
    ("splitkv2_mma", _config2(NWARPS=8, RB=32, KPS=256), (1, 16, 2, 5, 200), True, None,
     1.0),
    # the same rows in one split: each row group writes its rows of out directly
    ("splitkv2_mma", _config2(NWARPS=8, KC=32), (1, 8, 2, 1, 2200), False, None, 1.0),
    # 35 splits, 4 rows: the merge's threads in parts of 16 splits' steps (three parts),
    # combined in shared memory
    ("splitkv2_mma", _config2(NWARPS=8, KC=32), (1, 2, 2, 5, 66), True, -0.2, 1.0),
    # MHA; rows 0..2 see nothing of the last split (2 keys): a split's rows fully masked
    ("splitkv2_mma", _config2(KPS=128, KC=32), (1, 8, 2, 4, 300), True, None, 30.0),
    # large logits (q and k times 30: scores in the hundreds), 32-key steps
    pytest.param("splitkv2_mma", _config2(HD=128, KPS=128, NWARPS=16, STAGES=4),
                 (1, 4, 1, 3, 100), False, None, 1.0, marks=pytest.mark.slow),
    # one split of 2 tiles (fewer than the ring's 3 first tiles): out written directly
    pytest.param("splitkv2_mma", _config2(KPS=128, NWARPS=8, RB=32, STAGES=4),
                 (2, 8, 2, 16, 300), True, None, 1.0, marks=pytest.mark.slow),
    # Lq = 16: 64 rows in two row groups of two m tiles (four warps each), 3 splits
]


@pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")
@pytest.mark.parametrize("name,config,dims,causal,scale,magnitude", CASES2,
                         ids=["gqa-decode", "ring-tiles-kc32", "row-groups",
                              "row-groups-one-split", "merge-parts", "mha-empty-kc32",
                              "large-logits", "one-split-16warps", "lq16-row-groups"])
def test_splitkv2_kernel_emulated_against_float64(kernels, rng, name, config, dims, causal,
                                                   scale, magnitude):
    _emulated(kernels, rng, name, config, dims, causal, scale, magnitude)


def _emulated(kernels, rng, name, config, dims, causal, scale, magnitude, mask_of=None):
    """The emulated kernel's result on random inputs (q, k times ``magnitude``; a mask from
    ``mask_of(rng)``), checked against the op's float64 reference."""
    variant = _variant(name)
    assert config in variant.space.configs(SM90), config
    fn = kernels[_key(name, config)]
    b, h, hkv, lq, lk = dims
    d = config["HD"]
    q = (rng.standard_normal((b, h, lq, d)) * magnitude).astype(np.float16)
    k = (rng.standard_normal((b, hkv, lk, d)) * 1.5 * magnitude).astype(np.float16)
    v = rng.standard_normal((b, hkv, lk, d)).astype(np.float16)
    mask = None if mask_of is None else mask_of(rng)
    got, grid = _launch(fn, variant, config, q, k, v, causal, scale, mask)
    want = get_op("attention").reference(q, k, v, mask, causal=causal, scale=scale)
    assert not np.isnan(got).any(), "elements left unwritten (or NaN)"
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 4e-3, f"{name} {config} {dims} causal={causal}: rel. error {err:.3g} " \
        f"(grid {grid})"
    return got


def test_claims_only_what_it_serves():
    """requires: Lq <= 16, D equal to the config's HD, fp16/bf16, the group's rows within the
    warps (an m16 tile a warp at least), grouped heads of any group size."""
    variant, configs = _variant(), _variant().space.configs(SM90)

    def fits(b, h, hkv, lq, lk, d, dtype="float16", config=None, causal=False):
        shapes = ((b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, d))
        args = tuple(np.zeros(s, "float32") for s in shapes)
        scope = {**get_op("attention").problem(args, {"causal": causal}).scope(),
                 "dtype": dtype}
        return [c for c in ([config] if config else configs) if variant.fits(scope, c)]
    assert fits(1, 8, 2, 16, 40, 64) and fits(1, 32, 8, 1, 32768, 128, causal=True)
    assert fits(3, 5, 5, 2, 9, 128, dtype="bfloat16")
    assert not fits(1, 8, 2, 17, 40, 64), "Lq = 17 is past the decode kernel"
    assert not fits(1, 8, 2, 1, 40, 96), "D = 96 has no config"
    assert not fits(1, 8, 2, 1, 40, 64, dtype="float32")
    four = _config1()
    assert not fits(1, 16, 2, 16, 40, 64, config=four), "128 rows need 8 warps"
    assert fits(1, 16, 2, 16, 40, 64, config={**four, "NWARPS": 8})
    assert not fits(1, 8, 2, 1, 40, 64, config={**four, "HD": 128})


def test_splitkv2_claims_only_what_it_serves():
    """splitkv2_mma: as splitkv_mma, the rows of a CTA (min(R, RB)) within its warps; row
    groups (RB = 32) only where they split the rows (else a config would repeat another)."""
    variant = _variant("splitkv2_mma")
    configs = variant.space.configs(SM90)

    def fits(b, h, hkv, lq, lk, d, dtype="float16", **config):
        shapes = ((b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, d))
        args = tuple(np.zeros(s, "float32") for s in shapes)
        scope = {**get_op("attention").problem(args, {"causal": True}).scope(), "dtype": dtype}
        return [c for c in configs if variant.fits(scope, c)
                and all(c[k] == v for k, v in config.items())]
    assert fits(1, 32, 8, 1, 32768, 128) and fits(3, 5, 5, 2, 9, 64, dtype="bfloat16")
    assert not fits(1, 8, 2, 17, 40, 64) and not fits(1, 8, 2, 1, 40, 96)
    assert not fits(1, 8, 2, 1, 40, 64, dtype="float32")
    assert not fits(1, 32, 8, 1, 4096, 128, RB=32), "4 rows: no row groups"
    assert fits(1, 32, 8, 16, 8192, 128, RB=32, NWARPS=8), "64 rows: two groups of 32"
    assert not fits(1, 16, 2, 16, 40, 64, RB=256, NWARPS=4), "128 rows in a CTA need 8 warps"
    assert fits(1, 16, 2, 16, 40, 64, RB=256, NWARPS=8)
    assert not fits(1, 8, 2, 1, 40, 64, HD=128)


# ---- padding masks (MASKED = 1) -----------------------------------------------------------

MASKED_CASES = [  # variant, config, (B, H, Hkv, Lq, Lk), causal, mask kind, layout, magnitude
    # kind: bool, add (0 / -inf in fp16), min (0 / finfo(fp16).min); layout: (per batch entry,
    # per head); the last batch entry's mask hides every key of query row 0 (bool, add)
    ("splitkv2_mma", _config2(MASKED=1), (2, 8, 2, 1, 97), False, "bool", (1, 0), 1.0),
    # decode, G = 4: 2 splits, the last of 33 keys
    ("splitkv2_mma", _config2(MASKED=1, KPS=128, KC=32), (2, 8, 2, 4, 1025), True, "add",
     (1, 0), 1.0),
    # speculative decode with causal and an additive -inf mask: 9 splits, 32-key steps
    ("splitkv2_mma", _config2(MASKED=1, HD=128, NWARPS=8, KC=32), (2, 2, 2, 4, 1025), False,
     "min", (1, 1), 30.0),
    # MHA (G = 1), a mask per head of finite minima, logits x30; 17 splits (merge in parts)
    ("splitkv2_mma", _config2(MASKED=1, HD=128, NWARPS=8, RB=32), (2, 16, 2, 5, 200), False,
     "bool", (0, 0), 1.0),
    # one mask for the batch (stride 0), 40 rows a kv head in row groups of 32 and 8
    ("splitkv_mma", _config1(MASKED=1), (2, 8, 2, 4, 1025), False, "bool", (1, 1), 30.0),
    # splitkv_mma: G = 4, Lq = 4, a mask per head, logits x30, 17 splits
]


_padding_mask = cuda_emu.attention_padding_mask


@pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")
@pytest.mark.parametrize("name,config,dims,causal,kind,layout,magnitude", MASKED_CASES,
                         ids=["decode-bool-lk97", "lq4-causal-add-9splits",
                              "mha-per-head-min-x30", "row-groups-batch-broadcast",
                              "splitkv-per-head-bool-x30"])
def test_masked_kernels_emulated_against_float64(kernels, rng, name, config, dims, causal,
                                                 kind, layout, magnitude):
    """A padding mask read by the MASKED = 1 kernels: masked keys as -inf (a row hidden
    everywhere gives 0), additive values in the logits, against the op's float64 reference
    with the same mask; out poisoned with NaN (every element written)."""
    b, h, hkv, lq, lk = dims
    hide = kind != "min"   # a row of finite minima is a softmax of its scores, not hidden
    got = _emulated(kernels, rng, name, config, dims, causal, None, magnitude,
                    lambda rng: _padding_mask(rng, b, h, lq, lk, kind, layout, hide))
    if hide:   # query row 0 of the last mask row set: each batch entry and head it covers
        rows = got[-1 if layout[0] else slice(None), :, 0]
        assert not rows.any(), f"a row that sees no key gave {rows[rows != 0][:4]}"


def _scope(b, h, hkv, lq, lk, d, dtype="float16", mask=None, causal=False):
    shapes = ((b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, d))
    args = tuple(np.zeros(s, "float16") for s in shapes)
    if mask is not None:
        args += (mask,)
    return {**get_op("attention").problem(args, {"causal": causal}).scope(), "dtype": dtype}


def test_masked_claims():
    """Every mask the op takes (boolean or additive, per batch entry or one for the batch,
    over heads or per head) is claimed by the MASKED = 1 configs of both split-KV variants and
    of flash_wgmma, and by none of their MASKED = 0 configs (and the reverse without a mask);
    a masked input the split-KV kernels do not serve (Lq = 17) is left to SDPA and
    flash_wgmma, one of a head dim none of ours has (D = 96) to SDPA; a mask of 2^31
    elements is refused (int offsets). The MASKED configs are fewer (the spilling ones left
    out: manifest constraints)."""
    variants = [v for v in load_manifest(FOLDER / "manifest.toml") if v.backend == "cuda"]
    b, h, hkv, lq, lk, d = 2, 8, 2, 4, 40, 64

    def fitting(scope):
        return {v.name: [c for c in v.space.configs(SM90) if v.fits(scope, c)]
                for v in variants if any(v.fits(scope, c) for c in v.space.configs(SM90))}
    for mb, mh in ((b, 1), (1, 1), (b, h), (1, h)):
        for dtype in ("bool", "float16"):
            mask = np.ones((mb, mh, lq, lk), dtype)
            fit = fitting(_scope(b, h, hkv, lq, lk, d, mask=mask))
            assert set(fit) == {"sdpa_torch", "splitkv_mma", "splitkv2_mma",
                                "flash_wgmma"}, (mb, mh, dtype)
            assert all(c["MASKED"] == 1 for n in ("splitkv_mma", "splitkv2_mma",
                                                  "flash_wgmma") for c in fit[n])
    plain = fitting(_scope(b, h, hkv, lq, lk, d))
    assert all(c["MASKED"] == 0 for c in plain["splitkv2_mma"] + plain["splitkv_mma"]
               + plain["flash_wgmma"])
    for past, claim in (((b, h, hkv, 17, lk, d), {"sdpa_torch", "flash_wgmma"}),
                        ((b, h, hkv, lq, lk, 96), {"sdpa_torch"})):
        mask = np.ones((b, 1, past[3], lk), bool)
        assert set(fitting(_scope(*past, mask=mask))) == claim, past
    # 256 rows (16 warps at HD = 128): a mask of 256 * Lk elements, at 2^31 past int offsets
    v, configs = _variant("splitkv2_mma"), _variant("splitkv2_mma").space.configs(SM90)
    big = {**_scope(1, 16, 1, 16, lk, 128, mask=np.ones((1, 1, 16, lk), bool)),
           "Lk": 2 ** 23 - 1}
    assert [c for c in configs if v.fits(big, c)]
    assert not [c for c in configs if v.fits({**big, "Lk": 2 ** 23}, c)]
    assert [c for c in configs if v.fits({**big, "Lk": 2 ** 23, "masked": 0.0}, c)]


def test_mask_arguments_bound():
    """The kernels' mask arguments as the CUDA backend binds them: the mask is the call's
    fourth array (a null pointer without one), its strides 0 where it is broadcast."""
    from adaptive.backends import cuda_args
    op = get_op("attention")
    names = _variant("splitkv2_mma").launch["args"]
    b, h, hkv, lq, lk, d = 2, 8, 2, 3, 40, 64
    base = (np.zeros((b, h, lq, d), "float16"), *[np.zeros((b, hkv, lk, d), "float16")] * 2)

    def bound(*mask):
        problem = op.problem(base + mask, {"causal": False})
        slots, env = cuda_args.bind(op, names, "cupy", problem.scope(), problem,
                                    workspace=lambda: None)
        got = {s.name: (s.code if s.constant is None else int(s.constant)) for s in slots}
        return [got[n] for n in ("mask", "mask_sb", "mask_sh", "mask_bool")]
    assert bound() == [0, 0, 0, 0]
    assert bound(np.ones((b, 1, lq, lk), bool)) == ["args[3]", lq * lk, 0, 1]
    assert bound(np.ones((1, 1, lq, lk), "float16")) == ["args[3]", 0, 0, 0]
    assert bound(np.ones((b, h, lq, lk), bool)) == ["args[3]", h * lq * lk, lq * lk, 1]
    assert bound(np.ones((1, h, lq, lk), "float16")) == ["args[3]", 0, lq * lk, 0]
