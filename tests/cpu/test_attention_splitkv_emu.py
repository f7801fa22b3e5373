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
threads in parts over the splits where the rows are few.
The memory model is not emulated (copies land at issue): a missing wait can pass here."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_emu  # noqa: E402
from adaptive.expr import compile_expr  # noqa: E402
from adaptive.limits import SM90  # noqa: E402
from adaptive.ops import get_op  # noqa: E402
from adaptive.variants import builtin_folder, load_manifest  # noqa: E402

FOLDER = builtin_folder() / "attention"
SOURCES = {"splitkv_mma": (FOLDER / "attention_splitkv.cu", "attention_splitkv"),
           "splitkv2_mma": (FOLDER / "attention_splitkv2.cu", "attention_splitkv2")}

EXTRA = r"""
#undef __launch_bounds__
#define __launch_bounds__(...)
static int emu_votes[1024];
inline bool __any_sync(unsigned, bool p) {
    const int t = emu_tid(), base = t & ~31;
    emu_votes[t] = p;
    emu_warp_sync();
    bool any = false;
    for (int i = 0; i < 32 && base + i < (int)(blockDim.x * blockDim.y * blockDim.z); ++i)
        any = any || emu_votes[base + i];
    emu_warp_sync();
    return any;
}
#define T __half
"""


def _variant(name: str = "splitkv_mma"):
    (v,) = [v for v in load_manifest(FOLDER / "manifest.toml") if v.name == name]
    return v


def _wrapped_source(name: str) -> str:
    source, entry = SOURCES[name]
    wrapper = ("extern \"C\" void emu_run(unsigned gx, unsigned gy, unsigned bx, const __half* q, "
               "const __half* k, const __half* v, __half* out, int Lq, int Lk, int H, int Hkv, "
               "float scale, int causal, float* ws) {\n  emu_launch(gx, gy, 1, bx, 1, 1, [=] { "
               f"{entry}(q, k, v, out, Lq, Lk, H, Hkv, scale, causal, ws); }});\n}}\n")
    return cuda_emu.HEADER + cuda_emu.PTX + EXTRA + cuda_emu.kernel_source(source) + "\n" + \
        wrapper


def _load(lib):
    fn = ctypes.CDLL(str(lib)).emu_run
    fn.argtypes = [ctypes.c_uint] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + \
        [ctypes.c_float, ctypes.c_int, ctypes.c_void_p]
    return fn


def _key(name: str, config) -> tuple:
    return name, tuple(sorted(config.items()))


def _configs() -> dict:
    """(variant, config) of every case: key -> (variant name, config)."""
    out = {}
    for case in CASES + CASES2:
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
    done = background(f"emu-{Path(__file__).stem}")
    assert done.rc == 0, done.report()
    return {key: _load(lib) for key, lib in zip(_configs(), emu_jobs(done.folder))}


def _launch(fn, variant, config, q, k, v, causal, scale):
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    scope = {"B": b, "H": h, "Hkv": hkv, "Lq": lq, "Lk": lk, "D": d, "causal": causal,
             "scale": scale, "dtype": "float16", "itemsize": 2, "masked": 0, **config,
             **SM90}
    assert variant.fits(scope, config), variant.why_not(scope, config)
    ev = lambda e: int(compile_expr(str(e))(scope))  # noqa: E731
    grid = [ev(e) for e in variant.launch["grid"]]
    (block,) = [ev(e) for e in variant.launch["block"]]
    assert ev(variant.launch["shared_bytes"]) <= 240 * 1024      # the emulator's arena
    ws = np.zeros(ev(variant.launch["workspace_bytes"]) // 4, np.float32)
    s = 1.0 / np.sqrt(d) if scale is None else scale
    outs = []
    for _ in range(2):                     # twice: the split counters must be back at zero
        out = np.full(q.shape, np.nan, np.float16)
        fn(grid[0], grid[1], block, q.ctypes.data, k.ctypes.data, v.ctypes.data,
           out.ctypes.data, lq, lk, h, hkv, s, int(causal), ws.ctypes.data)
        outs.append(out)
    row_groups = -(-(h // hkv * lq) // config["RB"]) if "RB" in config else 1
    n_counters = b * hkv * row_groups
    counters = ws[-n_counters:].view(np.uint32)
    assert not counters.any(), "the split counters were not reset to zero"
    assert np.array_equal(outs[0], outs[1]), "two runs on the same input differ"
    return outs[0], grid


CASES = [  # config, (B, H, Hkv, Lq, Lk), causal, scale
    ({"HD": 64, "KPS": 64, "BN": 64, "NWARPS": 4}, (1, 8, 2, 1, 550), True, None),  # 9 splits
    ({"HD": 64, "KPS": 64, "BN": 64, "NWARPS": 4}, (1, 8, 2, 3, 113), True, None),
    pytest.param({"HD": 64, "KPS": 256, "BN": 64, "NWARPS": 4}, (2, 8, 2, 3, 300), True, None,
                 marks=pytest.mark.slow),                              # 4 tiles a split
    ({"HD": 64, "KPS": 64, "BN": 64, "NWARPS": 4}, (1, 8, 2, 9, 70), True, 0.3),   # 3 m tiles
    pytest.param({"HD": 128, "KPS": 64, "BN": 64, "NWARPS": 8}, (1, 4, 1, 3, 47), False, None,
                 marks=pytest.mark.slow),                              # one split
    ({"HD": 64, "KPS": 64, "BN": 64, "NWARPS": 4}, (1, 2, 2, 5, 66), True, -0.2),  # MHA; a
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
    base = {"HD": 64, "KPS": 64, "BN": 64, "NWARPS": 4, "STAGES": 3, "KC": 16, "RB": 256}
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
    variant = _variant(name)
    assert config in variant.space.configs(SM90), config
    fn = kernels[_key(name, config)]
    b, h, hkv, lq, lk = dims
    d = config["HD"]
    q = (rng.standard_normal((b, h, lq, d)) * magnitude).astype(np.float16)
    k = (rng.standard_normal((b, hkv, lk, d)) * 1.5 * magnitude).astype(np.float16)
    v = rng.standard_normal((b, hkv, lk, d)).astype(np.float16)
    got, grid = _launch(fn, variant, config, q, k, v, causal, scale)
    want = get_op("attention").reference(q, k, v, causal=causal, scale=scale)
    assert not np.isnan(got).any(), "elements left unwritten (or NaN)"
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 4e-3, f"{name} {config} {dims} causal={causal}: rel. error {err:.3g} " \
        f"(grid {grid})"


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
    four = {"HD": 64, "KPS": 64, "BN": 64, "NWARPS": 4}
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
