"""2:4 sparse weights on the host: detection, the compressed form and its mma.sp fragment
order, the host_24 variant, and spmm_24_mma.cu itself run on the CPU.

The kernel's PTX helpers (adaptive_ptx.cuh: ldmatrix.trans, mma.sp m16n8k32, streaming
loads) are the C++ emulations of tests/cpu/ptx_emu.h, the PTX ISA's fragment layouts
(per-warp exchanges through tests/cpu/cuda_emu.py's barriers); the rest of the kernel is
compiled by g++ as written and launched on the grid the manifest gives, against a float64
product: NaN-poisoned out, M, K
and N off the tiles, several slabs (ping-pong register sets), K not a multiple of 4. The
emulated metadata must name two distinct positions in ascending order, as the hardware's
ordered metadata requires. Whether the hardware reads fragments as emulated here is what
tests/gpu/test_spmm_24_cuda.py checks on the H200.
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_emu  # noqa: E402
from adaptive.errors import InputValueError  # noqa: E402
from adaptive.expr import compile_expr  # noqa: E402
from adaptive.limits import SM90  # noqa: E402
from adaptive.ops import get_op  # noqa: E402
from adaptive.ops.sparse import SparseWeight, compress_24, pack_meta  # noqa: E402
from adaptive.ops.spmm import prune_24  # noqa: E402
from adaptive.variants import builtin_folder, load_manifest  # noqa: E402


def _pruned(rng, m, k, dtype=np.float16):
    return prune_24(rng.standard_normal((m, k)).astype(dtype))


# ---- detection and the compressed form ------------------------------------------------------

def test_2to4_is_detected_and_a_third_nonzero_in_a_group_is_not(rng):
    dense = _pruned(rng, 37, 45)
    assert SparseWeight(dense).is_2to4 and SparseWeight(dense).stats()["is_2to4"] == 1.0
    bad = dense.copy()
    row, grp = 20, 7
    bad[row, 4 * grp:4 * grp + 4] = [1, 2, 3, 0]
    w = SparseWeight(bad)
    assert not w.is_2to4 and w.stats()["is_2to4"] == 0.0
    with pytest.raises(InputValueError, match="not 2:4"):
        w.sparse24()
    tail = dense.copy()
    tail[3, 44] = 5.0                          # the last, one-column group: still 2:4
    assert SparseWeight(tail).is_2to4
    assert SparseWeight(dense).signature(SparseWeight(dense)) != w.signature(w)


def test_a_group_spanning_rows_is_not_a_group(rng):
    """Non-zeros at the end of one row and the start of the next are in different groups."""
    dense = np.zeros((3, 8), np.float32)
    dense[0, 6:8] = 1
    dense[1, 0:2] = 1
    dense[2, [0, 2]] = 1
    assert SparseWeight(dense).is_2to4
    dense[2, 3] = 1
    assert not SparseWeight(dense).is_2to4


@pytest.mark.parametrize("m,k", [(37, 45), (16, 32), (5, 3), (64, 130)])
def test_compressed_form_round_trips_and_positions_ascend(rng, m, k):
    dense = _pruned(rng, m, k)
    dense[0, :] = 0                            # a row of empty groups
    if k >= 4:
        dense[1, :4] = [0, 0, 7, 0]            # one non-zero in a group
    w = SparseWeight(dense)
    form = w.sparse24()
    groups = -(-k // 4)
    assert form.values.shape == (m, 2 * groups) and form.values.dtype == np.float16
    assert form.meta.shape == (m, -(-groups // 4)) and form.meta.dtype == np.uint16
    np.testing.assert_array_equal(form.dense(k), dense.astype(np.float64))
    pos = form.positions.reshape(m, groups, 2)
    assert np.all(pos[:, :, 0] < pos[:, :, 1]), "positions must be distinct and ascending"
    if k >= 4:
        assert list(pos[1, 0]) == [0, 2] and list(form.values[1, :2]) == [0, 7]
    assert list(pos[0, 0]) == [0, 1]
    # meta holds the positions as 4-bit codes, first position low
    codes = (form.meta[:, :, None] >> (np.arange(4) * 4)) & 0xF
    codes = codes.reshape(m, -1)[:, :groups]
    np.testing.assert_array_equal(codes & 3, pos[:, :, 0])
    np.testing.assert_array_equal(codes >> 2, pos[:, :, 1])


def test_compress_refuses_three_nonzeros_naming_the_place():
    dense = np.zeros((2, 8), np.float32)
    dense[1, 4:7] = 1
    with pytest.raises(InputValueError, match=r"row 1 has 3 non-zeros in columns 4..7"):
        compress_24(dense, np.float32)
    assert pack_meta(np.array([[0, 1, 2, 3]], np.uint8)).tolist() == [[0x4 | (0xE << 4) |
                                                                        (0x4 << 8) |
                                                                        (0x4 << 12)]]


def _mma_sp_model(frag_vals, frag_meta, b, m, k):
    """out = w @ b computed from the fragment form the way mma.sp m16n8k32 reads it (PTX ISA:
    A registers rows g / g + 8, compressed columns 2t, 2t + 8; metadata of rows g and g + 8 in
    the low / high half of lane 4g + t' for logical columns 16 t' .. + 15)."""
    mt, kc = frag_vals.shape[:2]
    a = np.zeros((mt * 16, kc * 32))
    for i in range(mt):
        for c in range(kc):
            comp = np.zeros((16, 16))
            for lane in range(32):
                g, t = divmod(lane, 4)
                h = frag_vals[i, c, lane].astype(np.float64)
                comp[g, 2 * t:2 * t + 2] = h[0:2]
                comp[g + 8, 2 * t:2 * t + 2] = h[2:4]
                comp[g, 2 * t + 8:2 * t + 10] = h[4:6]
                comp[g + 8, 2 * t + 8:2 * t + 10] = h[6:8]
            for g in range(8):
                for tq in range(2):
                    word = int(frag_meta[i, c, 2 * g + tq])
                    for row, bits in ((g, word & 0xFFFF), (g + 8, word >> 16)):
                        for j in range(4):
                            code = (bits >> (4 * j)) & 0xF
                            p0, p1 = code & 3, code >> 2
                            assert p0 < p1
                            base = c * 32 + tq * 16 + 4 * j
                            a[i * 16 + row, base + p0] = comp[row, tq * 8 + 2 * j]
                            a[i * 16 + row, base + p1] = comp[row, tq * 8 + 2 * j + 1]
    return a[:m, :k] @ b.astype(np.float64)


def test_fragment_form_is_what_mma_sp_reads(rng):
    m, k, n = 37, 75, 3
    dense = _pruned(rng, m, k)
    vals, meta = SparseWeight(dense).sparse24().fragments()
    assert vals.shape == (3, 3, 32, 8) and meta.shape == (3, 3, 16) and meta.dtype == np.uint32
    b = rng.standard_normal((k, n))
    np.testing.assert_allclose(_mma_sp_model(vals, meta, b, m, k),
                               dense.astype(np.float64) @ b, rtol=1e-12, atol=1e-12)


def test_host_24_variant_against_float64(rng):
    import adaptive
    op = get_op("spmm")
    for dtype, (m, n, k) in (("float16", (37, 5, 45)), ("float32", (64, 17, 130))):
        w, b = op.make_inputs({"M": m, "N": n, "K": k}, dtype, rng, density=0.5, is_2to4=1.0)
        assert w.is_2to4 and 0.4 < w.density <= 0.52
        out = adaptive.launch("spmm", w, b, variant="host_24")
        assert op.error(out, op.reference(w, b)) < op.tolerance[dtype]
    dense = SparseWeight(rng.standard_normal((40, 40)).astype(np.float32))
    assert get_op("spmm").problem((dense, b[:40]), {}).extra_dict["is_2to4"] == 0.0
    with pytest.raises(Exception, match=r"host_24: requires is_2to4"):
        adaptive.launch("spmm", dense, b[:40], variant="host_24")


def test_sparse_2to4_weights_at_low_density_keep_their_density(rng):
    w, _ = get_op("spmm").make_inputs({"M": 64, "N": 2, "K": 64}, "float16", rng,
                                      density=0.1, is_2to4=1.0)
    assert w.is_2to4 and w.density < 0.15


# ---- the kernel, emulated -------------------------------------------------------------------

SOURCE = builtin_folder() / "spmm" / "spmm_24_mma.cu"

def _kernel_source() -> str:
    """The .cu file with C++ linkage for its entry (one copy per config's namespace)."""
    src, n = re.subn(r'extern "C" __global__', "__global__", cuda_emu.kernel_source(SOURCE))
    assert n == 1, "the kernel's entry declaration changed"
    return src


def _variant():
    (v,) = [v for v in load_manifest(builtin_folder() / "spmm" / "manifest.toml")
            if v.name == "sparse24_mma"]
    return v


CONFIGS = [  # a sample: each NT, both MT, each warp split; (config, N values)
    ({"NT": 1, "MT": 1, "WR": 4, "WK": 2}, (1, 3)),
    ({"NT": 1, "MT": 1, "WR": 1, "WK": 8, "DIRECT": 1}, (1,)),
    ({"NT": 1, "MT": 1, "WR": 2, "WK": 4, "DIRECT": 1}, (3, 8)),
    ({"NT": 2, "MT": 1, "WR": 2, "WK": 4}, (16, 9)),
    ({"NT": 4, "MT": 2, "WR": 1, "WK": 4}, (17, 32)),
    ({"NT": 8, "MT": 2, "WR": 4, "WK": 2}, (40,)),
]


def _emulated_source() -> str:
    """One translation unit holding the kernel once per config (a namespace each)."""
    header = cuda_emu.HEADER.replace("typedef float T;", "typedef _Float16 T;")
    assert header != cuda_emu.HEADER
    parts = [header.replace('#line 1 "kernel.cu"', ""), cuda_emu.PTX]
    kernel = _kernel_source()
    for i, (config, _) in enumerate(CONFIGS):
        defines = "".join(f"#define {k} {v}\n" for k, v in config.items())
        undefs = "".join(f"#undef {k}\n" for k in ("NT", "MT", "WR", "WK", "DIRECT", "STAGE"))
        parts.append(f"namespace c{i} {{\n{defines}{kernel}\n"
                     f"{undefs}}}\n"
                     f'extern "C" int emu_run{i}(unsigned gx, unsigned gy, unsigned bx, '
                     "const uint4* v, const unsigned* e, const __half* b, __half* out, int M, "
                     "int N, int K) {\n  emu_bad_meta = 0;\n"
                     f"  emu_launch(gx, gy, 1, bx, 1, 1, [=] {{ c{i}::spmm_24_mma(v, e, b, out, "
                     "M, N, K); });\n  return emu_bad_meta;\n}\n")
    return "".join(parts)


def emu_jobs(folder: Path) -> dict:
    """The one library of every config: library -> (source, g++ flags)."""
    return {folder / "k.so": (_emulated_source(), [])}


# g++ builds it in the background from the start of the session (tests/background.py)
BACKGROUND = cuda_emu.background_build(__file__, cpu_s=2.0)


@pytest.fixture(scope="module")
def emulated(background):
    """The library of emu_jobs, built in the background: one emu_run{i} per config."""
    (lib,) = cuda_emu.built(background, __file__, emu_jobs)
    dll = ctypes.CDLL(str(lib))
    fns = []
    for i in range(len(CONFIGS)):
        fn = getattr(dll, f"emu_run{i}")
        fn.argtypes = [ctypes.c_uint] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3
        fn.restype = ctypes.c_int
        fns.append(fn)
    return fns


@pytest.mark.parametrize("index", range(len(CONFIGS)),
                         ids=["-".join(f"{k}{v}" for k, v in c.items()) for c, _ in CONFIGS])
def test_sparse24_kernel_emulated_against_float64(emulated, rng, index):
    config, ns = CONFIGS[index]
    variant = _variant()
    assert {"DIRECT": 0, **config} in variant.space.configs(SM90)
    fn = emulated[index]
    m, k = 77, 651                 # 5 row tiles (the last partial), 21 chunks, a 3-column group
    dense = _pruned(rng, m, k)
    dense[5] = 0                   # an empty row
    dense[6, :8] = [0, 0, 0, 3, 0, 0, 0, 0]
    vals, meta = SparseWeight(dense).sparse24().fragments()
    for n in ns:
        b = rng.standard_normal((k, n)).astype(np.float16)
        b[-1] = 1e4                # large values in the last row of b: must not be lost
        scope = {"M": m, "N": n, "K": k, "dtype": "float16", "is_2to4": 1.0,
                 "nnz": m * k // 2, "DIRECT": 0, **config, **SM90}
        grid = [int(compile_expr(str(e))(scope)) for e in variant.launch["grid"]]
        (block,) = [int(compile_expr(str(e))(scope)) for e in variant.launch["block"]]
        smem = int(compile_expr(variant.launch["shared_bytes"])(scope))
        assert smem <= 240 * 1024 and variant.fits(scope, config)
        out = np.full((m, n), np.nan, np.float16)
        bad = fn(grid[0], grid[1], block, vals.ctypes.data, meta.ctypes.data, b.ctypes.data,
                 out.ctypes.data, m, n, k)
        assert bad == 0, "metadata with positions not distinct and ascending"
        assert not np.isnan(out).any(), f"{config} N={n}: elements left unwritten"
        want = dense.astype(np.float64) @ b.astype(np.float64)
        err = np.linalg.norm(out - want) / np.linalg.norm(want)
        assert err < 2e-3, f"{config} N={n}: rel. error {err:.3g}"


def test_the_largest_register_config_compiles_for_sm90_without_spills(tmp_path):
    from adaptive import nvrtc
    from adaptive.kcache import KernelCache
    if not nvrtc.available():
        pytest.skip("cuda.bindings is not installed (pip install .[nvrtc])")
    config = {"NT": 8, "MT": 2, "WR": 1, "WK": 8, "DIRECT": 0}   # 64 fp32 sums a thread
    assert config in _variant().space.configs(SM90)
    res = nvrtc.compile_candidate(_variant(), config, "float16", "sm_90",
                                  KernelCache(tmp_path)).resources
    assert res["registers"] <= 255 and res["spill_store_bytes"] == 0, res
    assert res["spill_load_bytes"] == 0 and res["stack_bytes"] == 0, res


def test_roofline_counts_the_compressed_bytes_of_a_2to4_weight(rng):
    op = get_op("spmm")
    m, k, n = 64, 128, 8
    w, b = op.make_inputs({"M": m, "N": n, "K": k}, "float16", rng, density=0.5, is_2to4=1.0)
    flops, nbytes = op.roofline(op.problem((w, b), {}))
    assert nbytes == m * k * 2 * 9 / 16 + (k * n + m * n) * 2     # 9/16 of the dense weight
    assert flops == 2.0 * w.nnz * n
    unstructured = SparseWeight(rng.standard_normal((m, k)).astype(np.float16))
    _, dense_bytes = op.roofline(op.problem((unstructured, b), {}))
    assert dense_bytes == m * k * (2 + 4) + (k * n + m * n) * 2     # CSR, as before
