"""attention_flash2.cu itself, run on the CPU (as test_attention_splitkv_emu.py runs the
split-KV kernels: the PTX helpers emulated by tests/cpu/ptx_emu.h, the rest compiled by g++
as written, launched on the manifest's grid and block) against the float64 reference.

flash2_pair_mma (PAIR = 1) serves two row blocks a CTA, the heaviest of the causal triangle
first: an even count of row blocks, an odd one (the middle block alone), a partial last
block, bottom-right causal limits with Lq < Lk, a negative scale (the q tile negated again
in the second block), large logits. flash2_ksplit_mma (KSPLIT = 2) splits each row block's
keys between two warp groups and merges them: on the same inputs, paired and not, with an
odd count of key tiles (the second group's last tile wholly masked), rows whose keys all
fall in one group's tiles (the other side of the merge empty), and not causal.
flash2_mma (PAIR = 0, KSPLIT = 1) is run beside them: the kernel it was measured as must
give the same results as before. The memory model is not emulated (copies land at issue):
a missing barrier between the two blocks or around the merge can pass here."""

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

WRAPPER = ("extern \"C\" void emu_run(unsigned gx, unsigned gy, unsigned bx, const __half* q, "
           "const __half* k, const __half* v, __half* out, int Lq, int Lk, float scale, "
           "int causal) {\n  emu_launch(gx, gy, 1, bx, 1, 1, [=] { "
           "attention_flash2(q, k, v, out, Lq, Lk, scale, causal); });\n}\n")

PAIRED = {"HD": 64, "BC": 32, "NWARPS": 2, "PAIR": 1}
UNPAIRED = {"HD": 64, "BC": 32, "NWARPS": 4}
SPLIT = {"HD": 64, "BC": 32, "NWARPS": 2, "KSPLIT": 2, "PAIR": 0}
SPLIT_PAIRED = {**SPLIT, "PAIR": 1}
CONFIGS = {"flash2_pair_mma": PAIRED, "flash2_mma": UNPAIRED, "flash2_ksplit_mma": SPLIT,
           "flash2_ksplit_mma+pair": SPLIT_PAIRED}


def _variant(name: str):
    name = name.split("+")[0]
    (v,) = [v for v in load_manifest(FOLDER / "manifest.toml") if v.name == name]
    return v


def emu_jobs(folder: Path) -> dict:
    """Each variant's config the cases use: its library -> (source, g++ flags)."""
    text = (cuda_emu.HEADER + cuda_emu.PTX + cuda_emu.VOTE_HALF
            + cuda_emu.kernel_source(FOLDER / "attention_flash2.cu") + "\n" + WRAPPER)
    return {folder / f"flash2_{i}.so": (text, [f"-D{k}={v}" for k, v in config.items()])
            for i, config in enumerate(CONFIGS.values())}


BACKGROUND = cuda_emu.background_build(__file__, cpu_s=20.0)


@pytest.fixture(scope="module")
def kernels(background):
    """variant name -> emu_run, compiled once in the background."""
    libs = cuda_emu.built(background, __file__, emu_jobs)
    out = {}
    for name, lib in zip(CONFIGS, libs):   # CONFIGS' order: emu_jobs lists them so
        fn = ctypes.CDLL(str(lib)).emu_run
        fn.argtypes = [ctypes.c_uint] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2 + \
            [ctypes.c_float, ctypes.c_int]
        out[name] = fn
    return out


def _scope(q, k, causal, scale=None, dtype=None):
    args = (q, k, k)
    scope = get_op("attention").problem(args, {"causal": causal, "scale": scale}).scope()
    return {**scope, **({"dtype": dtype} if dtype else {})}


def _launch(fn, name, q, k, v, causal, scale):
    variant, config = _variant(name), CONFIGS[name]
    assert config in variant.space.configs(SM90), config
    scope = {**_scope(q, k, causal, scale), **config, **SM90}
    assert variant.fits(scope, config), variant.why_not(scope, config)
    grid, block, _ = cuda_emu.launch_geometry(variant, scope)
    b, h, lq, d = q.shape
    s = 1.0 / np.sqrt(d) if scale is None else scale
    out = np.full(q.shape, np.nan, np.float16)
    fn(grid[0], grid[1], block, q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data,
       lq, k.shape[2], s, int(causal))
    return out, grid


CASES = [  # (B, H, Lq, Lk), causal, scale, magnitude of q and k; row blocks of 64 rows
    ((1, 2, 256, 256), True, None, 1.0),     # 4 row blocks: CTAs serve (3, 0) and (2, 1)
    ((2, 1, 150, 230), True, -0.2, 1.0),     # 3 blocks, the last partial: (2, 0), then 1
    # alone; the causal limit shifted by Lk - Lq = 80; a negative scale in both blocks; with
    # KSPLIT the first block needs 144 keys: 3 steps of 64, group 1's last 32 keys masked
    ((1, 2, 130, 130), True, 0.3, 20.0),     # large logits (scores in the hundreds)
    ((1, 2, 100, 20), False, None, 1.0),     # not causal, 20 keys: group 1 sees none (its
    # side of the merge empty, every row's keys in group 0's one tile)
]


@pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")
@pytest.mark.parametrize("dims,causal,scale,magnitude", CASES,
                         ids=["even-blocks", "odd-blocks-shifted-negative-scale",
                              "large-logits", "full-few-keys"])
def test_flash2_kernels_emulated_against_float64(kernels, rng, dims, causal, scale,
                                                 magnitude):
    b, h, lq, lk = dims
    d = PAIRED["HD"]
    q = (rng.standard_normal((b, h, lq, d)) * magnitude).astype(np.float16)
    k = (rng.standard_normal((b, h, lk, d)) * 1.5 * magnitude).astype(np.float16)
    v = rng.standard_normal((b, h, lk, d)).astype(np.float16)
    want = get_op("attention").reference(q, k, v, causal=causal, scale=scale)
    scale_of = np.abs(want).max()
    ran = []
    for name, config in CONFIGS.items():
        if not _variant(name).fits(_scope(q, k, causal, scale), config):
            continue
        got, grid = _launch(kernels[name], name, q, k, v, causal, scale)
        blocks = -(-lq // 64)
        if config.get("PAIR"):
            assert grid == [-(-blocks // 2), b * h], f"{blocks} row blocks in pairs: {grid}"
        assert not np.isnan(got).any(), f"{name}: elements left unwritten (or NaN)"
        err = np.abs(got.astype(np.float64) - want).max() / scale_of
        assert err < 4e-3, f"{name} {dims} causal={causal}: rel. error {err:.3g} " \
            f"(grid {grid})"
        ran.append(name)
    assert ran == (list(CONFIGS) if causal else ["flash2_mma", "flash2_ksplit_mma"]), ran


def test_the_variants_claim_what_they_serve():
    """flash2_pair_mma (and PAIR = 1 of flash2_ksplit_mma): causal, and more query rows than
    one row block (with one block the pairing is the unpaired kernel: the same candidate
    twice); flash2_ksplit_mma's PAIR = 0 and the unpaired variant serve both."""
    pair, plain = _variant("flash2_pair_mma"), _variant("flash2_mma")
    q = np.zeros((1, 2, 129, 64), np.float16)
    k = np.zeros((1, 2, 300, 64), np.float16)
    for config in ({**PAIRED, "NWARPS": 2}, {**PAIRED, "NWARPS": 4}):
        assert config in pair.space.configs(SM90)
        assert pair.fits(_scope(q, k, True), config)
        assert not pair.fits(_scope(q, k, False), config), "not causal: nothing to balance"
    q128 = np.zeros((1, 2, 128, 64), np.float16)
    assert not pair.fits(_scope(q128, k, True), {**PAIRED, "NWARPS": 4}), "one row block"
    assert pair.fits(_scope(q128, k, True), {**PAIRED, "NWARPS": 2})
    split = _variant("flash2_ksplit_mma")
    assert split.fits(_scope(q128, k, False), SPLIT), "split keys serve full attention too"
    assert not split.fits(_scope(q128, k, False), SPLIT_PAIRED)
    assert not pair.fits(_scope(q, k, True, dtype="float32"), PAIRED)
    assert plain.fits(_scope(q, k, False), UNPAIRED) and plain.fits(_scope(q, k, True),
                                                                   UNPAIRED)
