"""spmm_bsr_grouped.cu itself, run on the CPU: its cp.async / ldmatrix / mma.sync helpers are
swapped for C++ emulations (per-warp exchanges through tests/cpu/cuda_emu.py's barriers,
copies done at issue), the rest of the kernel is compiled by g++ as written and launched on
the grid the manifest gives, against a float64 product. Checks the index maths, the
grouped walk, the pipeline's stage reuse, the epilogue bounds and the split-K fix-up
(NaN-poisoned out; M, K and N off the tiles; empty rows; a group sharing no column).
The memory model is not emulated (copies land at issue): a missing wait can pass here."""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_emu  # noqa: E402
from adaptive.backends.cuda_sparse import bsr_row_groups  # noqa: E402
from adaptive.expr import compile_expr  # noqa: E402
from adaptive.nvrtc import SM90_LIMITS  # noqa: E402
from adaptive.ops.sparse import SparseWeight  # noqa: E402
from adaptive.variants import builtin_folder, load_manifest  # noqa: E402

pytestmark = pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")

SOURCE = builtin_folder() / "spmm" / "spmm_bsr_grouped.cu"

EMULATION = r"""
#include <atomic>
#include <cstring>
#define __align__(n)
typedef _Float16 __half;
struct __half2 { __half x, y; };
inline __half __float2half(float x) { return (__half)x; }
inline __half __float2half_rn(float x) { return (__half)x; }
inline __half2 __floats2half2_rn(float a, float b) { return {(__half)a, (__half)b}; }
template <class V> inline V __ldcg(const V* p) { return *p; }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
alignas(16) static unsigned char emu_smem[240 * 1024];

static void cp_async16(void* dst, const void* src, int src_bytes) {
    std::memset(dst, 0, 16);
    std::memcpy(dst, src, src_bytes);
}
static void cp_async_commit() {}
template <int N> static void cp_async_wait() {}

static const void* emu_ptrs[1024];
static unsigned emu_regs[1024][10];
static void emu_warp_sync() { emu_warp_barriers[emu_tid() / 32]->arrive_and_wait(); }
static unsigned emu_pack(__half lo, __half hi) {
    unsigned short a, b;
    std::memcpy(&a, &lo, 2);
    std::memcpy(&b, &hi, 2);
    return a | (unsigned(b) << 16);
}
static __half emu_half(unsigned r, int i) {
    unsigned short s = i ? (r >> 16) : (r & 0xffff);
    __half h;
    std::memcpy(&h, &s, 2);
    return h;
}
// lane l's register j: matrix j (rows given by lanes 8j..8j+7), row l/4, columns 2(l%4)+0/1
static void ldmatrix_x4(unsigned* r, const void* p) {
    const int t = emu_tid(), base = t & ~31, l = t & 31;
    emu_ptrs[t] = p;
    emu_warp_sync();
    for (int j = 0; j < 4; ++j) {
        const __half* row = (const __half*)emu_ptrs[base + 8 * j + l / 4];
        r[j] = emu_pack(row[2 * (l % 4)], row[2 * (l % 4) + 1]);
    }
    emu_warp_sync();
}
// transposed: lane l's register j holds column l/4 of rows 2(l%4), 2(l%4)+1 of matrix j
static void ldmatrix_x4_trans(unsigned* r, const void* p) {
    const int t = emu_tid(), base = t & ~31, l = t & 31;
    emu_ptrs[t] = p;
    emu_warp_sync();
    for (int j = 0; j < 4; ++j) {
        const __half* r0 = (const __half*)emu_ptrs[base + 8 * j + 2 * (l % 4)];
        const __half* r1 = (const __half*)emu_ptrs[base + 8 * j + 2 * (l % 4) + 1];
        r[j] = emu_pack(r0[l / 4], r1[l / 4]);
    }
    emu_warp_sync();
}
// m16n8k16, A row-major fragments, B column fragments, fp32 C (PTX ISA fragment layouts)
static void mma16816(float* c, const unsigned* a, const unsigned* b) {
    const int t = emu_tid(), base = t & ~31, l = t & 31;
    for (int i = 0; i < 4; ++i) emu_regs[t][i] = a[i];
    for (int i = 0; i < 2; ++i) emu_regs[t][4 + i] = b[i];
    emu_warp_sync();
    float A[16][16], B[16][8];
    for (int q = 0; q < 32; ++q) {
        const int g = q / 4, tq = q % 4;
        const unsigned* R = emu_regs[base + q];
        for (int h = 0; h < 2; ++h) {
            A[g][2 * tq + h] = (float)emu_half(R[0], h);
            A[g + 8][2 * tq + h] = (float)emu_half(R[1], h);
            A[g][2 * tq + 8 + h] = (float)emu_half(R[2], h);
            A[g + 8][2 * tq + 8 + h] = (float)emu_half(R[3], h);
            B[2 * tq + h][g] = (float)emu_half(R[4], h);
            B[2 * tq + 8 + h][g] = (float)emu_half(R[5], h);
        }
    }
    emu_warp_sync();
    const int g = l / 4, tq = l % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * tq + (i % 2);
        float s = 0.f;
        for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
        c[i] += s;
    }
}
"""


def _kernel_source(path=None, helpers_end: str = "// The whole CTA stages the 32 x TN slab of b"
                   ) -> str:
    """The .cu file with its PTX helpers cut out and its dynamic shared memory redirected."""
    src = (path or SOURCE).read_text()
    start = src.index("__device__ __forceinline__ unsigned smem_u32")
    end = src.index(helpers_end)
    helpers = src[start:end]
    for name in ("cp_async16", "ldmatrix_x4(", "ldmatrix_x4_trans", "mma16816"):
        assert name in helpers, f"{name} is no longer among the kernel's PTX helpers"
    src = src[:start] + src[end:]
    src, n = re.subn(r"extern __shared__ __align__\(16\) unsigned char smem_raw\[\];",
                     "unsigned char* smem_raw = emu_smem;", src)
    assert n == 1, "the kernel's dynamic shared memory declaration changed"
    return EMULATION + src


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
    src = _kernel_source(builtin_folder() / "spmm" / "spmm_bsr_mma.cu", "// Stage one A block")
    wrapper = ("extern \"C\" void emu_run(unsigned gx, unsigned gy, unsigned bx, const int* p, "
               "const int* k, const __half* v, const __half* b, __half* out, int M, int N, "
               "int K) {\n  emu_launch(gx, gy, 1, bx, 1, 1, [=] { spmm_bsr_mma(p, k, v, b, out, "
               "M, N, K); });\n}\n")
    return cuda_emu.HEADER + src + "\n" + wrapper


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """The kernels of CONFIGS and spmm_bsr_mma.cu, compiled once and side by side: the
    name (or "mma") -> the shared library."""
    tmp = tmp_path_factory.mktemp("grouped")
    jobs = {}
    for name, config in CONFIGS:
        variant = _variant(name)
        flags = [f"-D{k}={v}" for k, v in config.items()] + list(variant.options)
        jobs[tmp / f"{name}.so"] = (_wrapped_source(config.get("SPLIT", 1) > 1), flags)
    jobs[tmp / "mma.so"] = (_mma_source(), MMA_FLAGS)
    cuda_emu.compile_all(jobs)
    return {lib.stem: lib for lib in jobs}


@pytest.mark.parametrize("name,config", CONFIGS, ids=[n for n, _ in CONFIGS])
def test_grouped_kernel_emulated_against_float64(libs, rng, name, config):
    variant = _variant(name)
    assert config in variant.space.configs(SM90_LIMITS)
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
        scope = {"M": m, "N": n, "K": k, **config, **SM90_LIMITS}
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
