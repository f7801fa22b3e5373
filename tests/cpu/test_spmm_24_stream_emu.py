"""spmm_24_stream.cu (variant sparse24_stream) itself, run on the CPU: its PTX helpers
(adaptive_ptx.cuh: cp.async, ldmatrix, ldmatrix.trans, mma.sp m16n8k32) are the C++
emulations of tests/cpu/ptx_emu.h (the PTX ISA's fragment layouts, as the H200 runs them),
the rest of the kernel is compiled by g++ as written (fp16 as _Float16) and launched on the
grid, block and workspace the manifest gives, against a float64 product.

Checks the stream-K split (grids of one CTA, a few, and one a unit: row blocks covered
whole, in part, and a CTA ending one block and starting the next), the ring's slot reuse
across row blocks, each b slab form (N = 1 by cp.async and, misaligned, by plain loads;
N = 3 transposed; N = 8, 16, 64 by cp.async; N = 9, 17, 40 by plain loads), M and K off the
tiles (K not a multiple of 4), an empty row, large magnitudes, NaN-poisoned out, and the
workspace (sums and counters) left zeroed after each launch. The memory model is not
emulated (copies land at issue): a missing wait can pass here; tests/gpu/test_spmm_24_cuda.py
runs every config on the H200.
"""

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
from adaptive.ops.sparse import SparseWeight  # noqa: E402
from adaptive.ops.spmm import prune_24  # noqa: E402
from adaptive.variants import builtin_folder, load_manifest  # noqa: E402

pytestmark = pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")

SOURCE = builtin_folder() / "spmm" / "spmm_24_stream.cu"

EXTRA = r"""
#undef __launch_bounds__
#define __launch_bounds__(...)
"""

CONFIGS = [  # a sample: each NT, both W and MT, both CH, shallow and deep rings; N values
    ({"NT": 1, "W": 4, "MT": 1, "CH": 4, "STAGES": 3, "OCC": 1}, (1, 3)),
    ({"NT": 1, "W": 4, "MT": 2, "CH": 8, "STAGES": 4, "OCC": 1}, (1, 8)),
    ({"NT": 2, "W": 4, "MT": 1, "CH": 4, "STAGES": 6, "OCC": 2}, (16, 9)),
    ({"NT": 4, "W": 8, "MT": 1, "CH": 4, "STAGES": 3, "OCC": 1}, (17, 32)),
    ({"NT": 8, "W": 4, "MT": 2, "CH": 4, "STAGES": 3, "OCC": 2}, (64, 40)),
    ({"NT": 8, "W": 8, "MT": 2, "CH": 4, "STAGES": 3, "OCC": 1}, (64,)),
]
SM_COUNTS = (1, 5, 132)    # one CTA (every block whole), a few (blocks split), one per unit


def _label(config: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in config.items())


def _variant():
    (v,) = [v for v in load_manifest(builtin_folder() / "spmm" / "manifest.toml")
            if v.name == "sparse24_stream"]
    return v


def _wrapped_source() -> str:
    header = cuda_emu.HEADER.replace("typedef float T;", "typedef _Float16 T;")
    assert header != cuda_emu.HEADER
    wrapper = ("extern \"C\" int emu_run(unsigned gx, unsigned bx, const uint4* v, "
               "const unsigned* e, const __half* b, __half* out, int M, int N, int K, "
               "float* ws) {\n  emu_bad_meta = 0;\n  emu_launch(gx, 1, 1, bx, 1, 1, [=] { "
               "spmm_24_stream(v, e, b, out, M, N, K, ws); });\n  return emu_bad_meta;\n}\n")
    return header + cuda_emu.PTX + EXTRA + cuda_emu.kernel_source(SOURCE) + "\n" + wrapper


def emu_jobs(folder: Path) -> dict:
    """Each config of CONFIGS: its library -> (source, g++ flags)."""
    text = _wrapped_source()
    return {folder / f"stream_{i}.so": (text, [f"-D{k}={v}" for k, v in config.items()])
            for i, (config, _) in enumerate(CONFIGS)}


BACKGROUND = cuda_emu.background_build(__file__, cpu_s=10.0)


@pytest.fixture(scope="module")
def kernels(background):
    """The kernels of CONFIGS, compiled once, side by side, in the background."""
    fns = []
    for lib in cuda_emu.built(background, __file__, emu_jobs):
        fn = ctypes.CDLL(str(lib)).emu_run
        fn.argtypes = [ctypes.c_uint] * 2 + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3 + \
            [ctypes.c_void_p]
        fn.restype = ctypes.c_int
        fns.append(fn)
    return fns


def _weight(rng, m, k, scale=1.0):
    dense = prune_24((rng.standard_normal((m, k)) * scale).astype(np.float16))
    dense[5] = 0                                   # an empty row
    dense[6, :8] = [0, 0, 0, 3, 0, 0, 0, 0]
    return dense


def _run(fn, variant, config, dense, b, sm_count, misaligned=False, runs=2):
    """Launch ``runs`` times on the manifest's grid; the outputs, and the workspace after
    each."""
    m, k = dense.shape
    n = b.shape[1]
    vals, meta = SparseWeight(dense).sparse24().fragments()
    scope = {"M": m, "N": n, "K": k, "dtype": "float16", "is_2to4": 1.0, "nnz": m * k // 2,
             **config, **SM90, "sm_count": sm_count}
    assert variant.fits(scope, config), variant.why_not(scope, config)
    ev = lambda e: int(compile_expr(str(e))(scope))  # noqa: E731
    (grid,) = [ev(e) for e in variant.launch["grid"]]
    (block,) = [ev(e) for e in variant.launch["block"]]
    assert ev(variant.launch["shared_bytes"]) <= 240 * 1024       # the emulator's arena
    ws = np.zeros(ev(variant.launch["workspace_bytes"]) // 4, np.float32)
    if misaligned:                                 # b 2 bytes past a 16-byte boundary
        buf = np.zeros(b.size + 8, np.float16)
        b_ptr = buf.ctypes.data + 2 * ((-buf.ctypes.data // 2) % 8) + 2
        ctypes.memmove(b_ptr, b.ctypes.data, b.nbytes)
        assert b_ptr % 16 == 2
    else:
        b_ptr = b.ctypes.data
    outs = []
    for _ in range(runs):                          # twice: the workspace must be reusable
        out = np.full((m, n), np.nan, np.float16)
        bad = fn(grid, block, vals.ctypes.data, meta.ctypes.data, b_ptr, out.ctypes.data,
                 m, n, k, ws.ctypes.data)
        assert bad == 0, "metadata with positions not distinct and ascending"
        assert not ws.any(), f"{_label(config)} N={n}: workspace left non-zero " \
            f"({np.count_nonzero(ws[:m * n])} sums, {np.count_nonzero(ws[m * n:])} counters)"
        outs.append(out)
    assert all(np.array_equal(outs[0], o, equal_nan=True) for o in outs), "two runs differ"
    return outs[0], grid


@pytest.mark.parametrize("index", range(len(CONFIGS)),
                         ids=[_label(c) for c, _ in CONFIGS])
def test_stream_kernel_emulated_against_float64(kernels, rng, index):
    config, ns = CONFIGS[index]
    variant = _variant()
    assert config in variant.space.configs(SM90)
    for m, k in ((77, 651), (200, 518)):       # 5 and 13 row tiles, 21 and 17 chunks
        dense = _weight(rng, m, k)                 # K % 4 == 3, 2: a short last group
        units = -(-(-(-m // 16)) // (config["W"] * config["MT"])) * \
            -(-(-(-k // 32)) // config["CH"])
        grids = set()
        for n in ns:
            b = rng.standard_normal((k, n)).astype(np.float16)
            b[-1] = 1e4            # large values in the last row of b: must not be lost
            want = dense.astype(np.float64) @ b.astype(np.float64)
            # the larger shape at the grid's two ends only (the split blocks of the few-CTA
            # grid are the smaller shape's too)
            for sm_count in SM_COUNTS if m < 100 else (SM_COUNTS[0], SM_COUNTS[-1]):
                # twice where row blocks are split over CTAs (the workspace and counters
                # in use: they must come back zeroed), once at the grid's two ends
                out, grid = _run(kernels[index], variant, config, dense, b, sm_count,
                                 runs=2 if sm_count == SM_COUNTS[1] else 1)
                grids.add(grid)
                what = f"{_label(config)} {m}x{k} N={n} grid={grid}"
                assert not np.isnan(out).any(), f"{what}: elements left unwritten"
                err = np.linalg.norm(out - want) / np.linalg.norm(want)
                assert err < 2e-3, f"{what}: rel. error {err:.3g}"
                assert not out[5].any(), f"{what}: the empty row must be exact zeros"
        assert min(grids) == config["OCC"] and max(grids) == units, (grids, units)


def test_b_misaligned_and_large_magnitudes(kernels, rng):
    """N = 1 with b off a 16-byte boundary (its plain-load path) and |out| ~ 1e4: fp32 sums
    near float16's range."""
    config, _ = CONFIGS[0]
    variant = _variant()
    m, k = 70, 520
    dense = _weight(rng, m, k, scale=30.0)
    b = (rng.standard_normal((k, 1)) * 150.0 / np.sqrt(k / 2)).astype(np.float16)
    want = dense.astype(np.float64) @ b.astype(np.float64)
    assert 3e3 < np.abs(want).max() < 6e4, np.abs(want).max()
    for misaligned in (False, True):
        out, _ = _run(kernels[0], variant, config, dense, b, 5, misaligned)
        err = np.linalg.norm(out - want) / np.linalg.norm(want)
        assert err < 2e-3, f"misaligned={misaligned}: rel. error {err:.3g}"


def test_the_grid_spreads_units_evenly_and_caps_at_the_sms():
    """Stream-K: min(units, sm_count * OCC) CTAs; units of an MLP weight leave none idle."""
    variant = _variant()
    config = {"NT": 1, "W": 4, "MT": 1, "CH": 8, "STAGES": 4, "OCC": 2}
    assert config in variant.space.configs(SM90)
    for (m, k), want in (((4096, 4096), 264), ((16, 32), 1), ((40, 600), 3)):
        scope = {"M": m, "N": 1, "K": k, **config, **SM90}
        (grid,) = [int(compile_expr(str(e))(scope)) for e in variant.launch["grid"]]
        assert grid == want, (m, k, grid)
