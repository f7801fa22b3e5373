"""spmm_bsr_grouped.cu itself, run on the CPU: its cp.async / ldmatrix / mma.sync helpers
(adaptive_ptx.cuh) are the C++ emulations of tests/cpu/ptx_emu.h (per-warp exchanges
through tests/cpu/cuda_emu.py's barriers, copies done at issue), the rest of the kernel is
compiled by g++ as written and launched on the grid the manifest gives, against a float64
product. Checks the index maths, the
grouped walk, the pipeline's stage reuse, the epilogue bounds and the split-K fix-up
(NaN-poisoned out; M, K and N off the tiles; empty rows; a group sharing no column).
The memory model is not emulated (copies land at issue): a missing wait can pass here."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_emu  # noqa: E402
from adaptive.backends.cuda_sparse import bsr_row_groups  # noqa: E402
from adaptive.expr import compile_expr  # noqa: E402
from adaptive.limits import SM90  # noqa: E402
from adaptive.ops.sparse import SparseWeight  # noqa: E402
from adaptive.variants import builtin_folder, load_manifest  # noqa: E402

pytestmark = pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")

SOURCE = builtin_folder() / "spmm" / "spmm_bsr_grouped.cu"


def _kernel_source(path=None) -> str:
    """The .cu file after the emulated CUDA built-ins and PTX helpers (tests/cpu/ptx_emu.h)."""
    return cuda_emu.PTX + cuda_emu.kernel_source(path or SOURCE)


def _wrapped_source(split: bool) -> str:
    wrapper = ("extern \"C\" void emu_run(unsigned gx, unsigned gy, unsigned gz, unsigned bx, "
               "const int* p, const int* k, const int* blk, const __half* v, const __half* b, "
               "__half* out, int M, int N, int K, float* ws) {\n"
               "  emu_launch(gx, gy, gz, bx, 1, 1, [=] { spmm_bsr_grouped(p, k, blk, v, b, out, "
               f"M, N, K{', ws' if split else ''}); }});\n}}\n")
    return cuda_emu.HEADER + _kernel_source() + "\n" + wrapper


def _load(lib):
    fn = ctypes.CDLL(str(lib)).emu_run
    fn.argtypes = [ctypes.c_uint] * 4 + [ctypes.c_void_p] * 6 + [ctypes.c_int] * 3 + \
        [ctypes.c_void_p]
    return fn


def _variant(name):
    (v,) = [v for v in load_manifest(builtin_folder() / "spmm" / "manifest.toml")
            if v.name == name]
    return v


CONFIGS = [  # a sample: both groups, both tiles, shallow and deep pipelines, split-K
    ("bsr32_grouped_mma", {"TN": 128, "STAGES": 2}),
    ("bsr32_grouped4_mma", {"TN": 64, "STAGES": 6}),
    ("bsr32_grouped_splitk_mma", {"TN": 64, "STAGES": 4, "SPLIT": 4}),
]


MMA_FLAGS = ["-DBS=32", "-DTN=64", "-DNWARPS=4", "-DSTAGES=2"]


def _mma_source() -> str:
    src = _kernel_source(builtin_folder() / "spmm" / "spmm_bsr_mma.cu")
    wrapper = ("extern \"C\" void emu_run(unsigned gx, unsigned gy, unsigned bx, const int* p, "
               "const int* k, const __half* v, const __half* b, __half* out, int M, int N, "
               "int K) {\n  emu_launch(gx, gy, 1, bx, 1, 1, [=] { spmm_bsr_mma(p, k, v, b, out, "
               "M, N, K); });\n}\n")
    return cuda_emu.HEADER + src + "\n" + wrapper


def emu_jobs(folder: Path) -> dict:
    """The kernels of CONFIGS and spmm_bsr_mma.cu: library -> (source, g++ flags)."""
    jobs = {}
    for name, config in CONFIGS:
        variant = _variant(name)
        flags = [f"-D{k}={v}" for k, v in config.items()] + list(variant.options)
        jobs[folder / f"{name}.so"] = (_wrapped_source(config.get("SPLIT", 1) > 1), flags)
    jobs[folder / "mma.so"] = (_mma_source(), MMA_FLAGS)
    return jobs


BACKGROUND = cuda_emu.background_build(__file__, cpu_s=8.0)


@pytest.fixture(scope="module")
def libs(background):
    """The kernels of CONFIGS and spmm_bsr_mma.cu, compiled once, side by side, in the
    background: the name (or "mma") -> the shared library."""
    return {lib.stem: lib for lib in cuda_emu.built(background, __file__, emu_jobs)}


@pytest.mark.parametrize("name,config", CONFIGS, ids=[n for n, _ in CONFIGS])
def test_grouped_kernel_emulated_against_float64(libs, rng, name, config):
    variant = _variant(name)
    assert config in variant.space.configs(SM90)
    fn = _load(libs[name])
    m, k = 301, 330                            # 10 block rows (the last partial), 11 columns
    mask = rng.random((10, 11)) < 0.35
    mask[[1, 4]] = False                       # empty block rows
    mask[7] = True
    mask[8:10] = False                         # the last group's rows share no column
    mask[8, 2] = mask[9, 6] = True
    full = np.kron(mask, np.ones((32, 32), bool))[:m, :k]
    dense = np.where(full, rng.standard_normal((m, k)), 0).astype(np.float16)
    w = SparseWeight(dense, dtype="float16")
    bsr = w.bsr(32)
    bsr.sort_indices()
    group = int(next(o for o in variant.options if o.startswith("-DGROUP=")).split("=")[1])
    ptr, kk, blk = bsr_row_groups(bsr.indptr, bsr.indices, group)
    values = np.ascontiguousarray(bsr.data.astype(np.float16))
    for n in (45, 136):
        b = rng.standard_normal((k, n)).astype(np.float16)
        scope = {"M": m, "N": n, "K": k, **config, **SM90}
        grid = [int(compile_expr(str(e))(scope)) for e in variant.launch["grid"]] + [1, 1]
        (block,) = [int(compile_expr(str(e))(scope)) for e in variant.launch["block"]]
        ws_bytes = int(compile_expr(str(variant.launch.get("workspace_bytes", 0)))(scope))
        ws = np.zeros(max(ws_bytes // 4, 1), np.float32)
        want = dense.astype(np.float64) @ b.astype(np.float64)
        for _ in range(2 if ws_bytes else 1):  # twice with split-K: its counters must reset
            out = np.full((m, n), np.nan, np.float16)
            fn(grid[0], grid[1], grid[2], block, ptr.ctypes.data, kk.ctypes.data,
               blk.ctypes.data, values.ctypes.data, b.ctypes.data, out.ctypes.data, m, n, k,
               ws.ctypes.data)
            assert not np.isnan(out).any(), f"{name} {config} N={n}: elements left unwritten"
            err = np.abs(out - want).max() / np.abs(want).max()
            assert err < 2e-3, f"{name} {config} N={n}: rel. error {err:.3g}"
        if ws_bytes:
            counters = ws[config["SPLIT"] * m * n:].view(np.uint32)
            assert not counters.any(), "split-K tile counters were not reset"


def test_emulation_runs_the_h200_checked_bsr32_mma_kernel(libs, rng):
    """The emulated helpers reproduce spmm_bsr_mma.cu, whose results the GPU tests check on
    the H200: the fragment layouts emulated here are the hardware's."""
    fn = ctypes.CDLL(str(libs["mma"])).emu_run
    fn.argtypes = [ctypes.c_uint] * 3 + [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3
    m, k, n = 100, 130, 70
    full = np.kron(rng.random((4, 5)) < 0.5, np.ones((32, 32), bool))[:m, :k]
    dense = np.where(full, rng.standard_normal((m, k)), 0).astype(np.float16)
    bsr = SparseWeight(dense, dtype="float16").bsr(32)
    bsr.sort_indices()
    indptr, indices = bsr.indptr.astype(np.int32), bsr.indices.astype(np.int32)
    values = np.ascontiguousarray(bsr.data.astype(np.float16))
    b = rng.standard_normal((k, n)).astype(np.float16)
    out = np.full((m, n), np.nan, np.float16)
    fn(-(-n // 64), -(-m // 32), 128, indptr.ctypes.data, indices.ctypes.data,
       values.ctypes.data, b.ctypes.data, out.ctypes.data, m, n, k)
    want = dense.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(out - want).max() / np.abs(want).max() < 2e-3
