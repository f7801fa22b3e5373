"""adaptive_ptx.cuh: the one home of the variants' inline-PTX helpers.

No .cu under variants/ defines a function the header defines or writes a PTX instruction
the header wraps; the CPU emulation (tests/cpu/ptx_emu.h) defines every function the header
does; expansion keeps compiler messages on each file's lines; the header's bytes are part of
a variant's identity (source hash, kernel-cache key, what a pack stores), so a changed
header turns packed rows and cubins away; packed sources compile without the header.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from adaptive import headers, nvrtc
from adaptive.kcache import kernel_key
from adaptive.limits import SM90
from adaptive.variants import Registry, builtin_folder, load_folder

HEADER = headers.INCLUDE_DIR / "adaptive_ptx.cuh"
WGMMA = headers.INCLUDE_DIR / "adaptive_wgmma.cuh"   # its sm_90a helpers, the same rules
EMULATION = Path(__file__).with_name("ptx_emu.h")
# the PTX instructions each header wraps: a variant's own asm must not issue them
WRAPPED = {HEADER: ("cp.async", "ldmatrix", "mma.sync", "mma.sp", "ex2.approx",
                    "ld.global.nc.L1::no_allocate"),
           WGMMA: ("wgmma.", "fence.proxy.async")}
_DEFINITION = re.compile(r"^(?:template\s*<[^>]*>\s*)?"
                         r"(?:(?:static|inline|__device__|__forceinline__|__noinline__)\s+)+"
                         r"[\w:<>&*\s]*?\b(\w+)\s*(?:<[^>()]*>)?\s*\(", re.MULTILINE)


def _functions(text: str) -> set[str]:
    text = re.sub(r"//[^\n]*", "", text)
    return set(_DEFINITION.findall(re.sub(r"template\s*<[^>]*>\s*\n", "", text)))


def _asm_strings(text: str) -> list[str]:
    text = re.sub(r"//[^\n]*", "", text)
    return re.findall(r"\basm\s*(?:volatile\s*)?\((.*?)\)\s*;", text, re.DOTALL)


def _cuda_files() -> list[Path]:
    return sorted(builtin_folder().rglob("*.cu")) + sorted(builtin_folder().rglob("*.cuh"))


def test_the_parser_finds_the_header_functions():
    assert _functions(HEADER.read_text()) == {
        "smem_u32", "cp_async16", "cp_async_commit", "cp_async_wait", "ldmatrix_x4",
        "ldmatrix_x4_trans", "mma16816", "mma_sp16832", "load_stream16", "ex2", "pack2"}
    copies = ("template <int N>\n__device__ __forceinline__ void cp_async_wait() {}\n"
              "__device__ __forceinline__ unsigned\nsmem_u32(const void* p) {}\n"
              "// __device__ void ex2(float x);\nstatic_assert(sizeof(T) == 2, \"x\");\n")
    assert _functions(copies) == {"cp_async_wait", "smem_u32"}
    assert _asm_strings('asm volatile("cp.async.commit_group;\\n" ::);') == [
        '"cp.async.commit_group;\\n" ::']


def test_the_parser_finds_the_wgmma_header_functions():
    assert _functions(WGMMA.read_text()) == {
        "fence_proxy_async", "wgmma_fence", "wgmma_commit", "wgmma_wait", "wgmma_hold",
        "wgmma_desc", "wgmma_ss", "wgmma_rs_tn"}


@pytest.mark.parametrize("header", [HEADER, WGMMA], ids=lambda p: p.name)
@pytest.mark.parametrize("path", _cuda_files(), ids=lambda p: p.name)
def test_no_variant_copies_a_helper_of_the_header(path, header):
    text = path.read_text()
    copied = _functions(text) & _functions(header.read_text())
    assert not copied, (f"{path.name} defines {sorted(copied)}, which {header.name} "
                        f"defines: #include \"{header.name}\" and use those")
    issued = sorted({w for s in _asm_strings(text) for w in WRAPPED[header] if w in s})
    assert not issued, (f"{path.name} issues {issued} in its own asm: use the helpers of "
                        f"{header.name} (add one there if a form is missing)")


@pytest.mark.parametrize("header", [HEADER, WGMMA], ids=lambda p: p.name)
def test_the_cpu_emulation_defines_every_function_of_the_header(header):
    missing = _functions(header.read_text()) - _functions(EMULATION.read_text())
    assert not missing, f"tests/cpu/ptx_emu.h lacks {sorted(missing)} of {header.name}"


def test_expand_puts_the_header_in_place_with_line_markers():
    src = "// a kernel\n#include \"adaptive_ptx.cuh\"  // helpers\n#include <cuda_fp16.h>\nx\n"
    out = headers.expand(src, "k.cu")
    lines = out.splitlines()
    assert lines[0] == "// a kernel" and lines[1] == '#line 1 "adaptive_ptx.cuh"'
    assert headers.header_text("adaptive_ptx.cuh").rstrip() in out
    assert lines[-3:] == ['#line 3 "k.cu"', "#include <cuda_fp16.h>", "x"]
    assert headers.expand(out, "k.cu") == out and headers.includes(out) == []
    assert headers.includes(src) == ["adaptive_ptx.cuh"]
    assert headers.expand("// #include \"adaptive_ptx.cuh\"\n") == \
        "// #include \"adaptive_ptx.cuh\"\n"
    with pytest.raises(ValueError, match=r"no shipped CUDA header 'nope.cuh'.*adaptive_ptx"):
        headers.header_text("nope.cuh")


def _builtin(op: str, name: str):
    return next(v for v in load_folder(builtin_folder()) if v.op == op and v.name == name)


def _grown(text: str) -> str:
    """The header as a later release might ship it (one more helper)."""
    return text.replace("#endif  // ADAPTIVE_PTX_CUH", "__device__ __forceinline__ float "
                        "twice(float x) { return 2.f * x; }\n#endif")


def test_the_header_is_part_of_the_variant_identity_and_cache_key(monkeypatch):
    old = _builtin("gemm", "tc_mma")
    old_code, old_hash = old.code, old.source_hash
    assert "ADAPTIVE_PTX_CUH" in old_code and headers.includes(old_code) == []
    grown = _grown(headers.header_text("adaptive_ptx.cuh"))
    monkeypatch.setattr(headers, "header_text", lambda name: grown)
    new = dataclasses.replace(old)                        # the same file, read again
    assert new.source == old.source
    assert "twice(float x)" in new.code and new.source_hash != old_hash
    assert new.to_dict()["source"] == new.code != old_code
    options = nvrtc.macro_options(old.space.configs(SM90)[0])
    keys = {kernel_key(nvrtc.full_source(text, "float16", "gemm_tc.cu"), options, "sm_90",
                       "nvrtc-x") for text in (old_code, new.source)}
    assert len(keys) == 2, "a changed header must change the kernel-cache key"


def test_a_pack_carries_the_header_and_a_changed_one_turns_its_rows_away(tmp_path,
                                                                       monkeypatch):
    import warnings

    from adaptive.packs import format as packs
    from adaptive.packs import install
    from adaptive.observation import Observation
    builtin = _builtin("gemm", "tc_mma")
    config = builtin.space.configs(SM90)[0]
    row = Observation(op="gemm", dims={"M": 64, "N": 64, "K": 64}, dtype="float16",
                      variant="tc_mma", config=config, time_ms=0.1, floor_ms=0.05)
    fp = {"backend": "cuda", "name": "NVIDIA H200", "cc": 90, "sm_count": 132}
    packs.write_pack(packs.new_pack([builtin], [row], fp), tmp_path / "p.msgpack")
    packed = packs.read_pack(tmp_path / "p.msgpack").variants[0]
    assert headers.includes(packed.source) == [] and headers.includes(builtin.source)
    assert headers.header_text("adaptive_ptx.cuh").rstrip() in packed.source
    for dtype in ("float16", "bfloat16"):   # cubin keys recompute the same from either text
        assert nvrtc.full_source(packed.source, dtype, "gemm_tc.cu") == \
            nvrtc.full_source(builtin.source, dtype, "gemm_tc.cu")
    report = install.load_pack(tmp_path / "p.msgpack", Registry([builtin]), fingerprint=fp)
    assert report.variants_present == ("gemm/tc_mma",) and report.rows == 1

    grown = _grown(headers.header_text("adaptive_ptx.cuh"))
    monkeypatch.setattr(headers, "header_text", lambda name: grown)
    registry = Registry([dataclasses.replace(builtin)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = install.load_pack(tmp_path / "p.msgpack", registry, fingerprint=fp)
    assert report.variants_skipped == ("gemm/tc_mma",) and report.rows == 0


@pytest.mark.skipif(not nvrtc.available(), reason="cuda.bindings is not installed")
def test_sources_of_packs_compile_without_the_header_and_errors_name_both_files(
        tmp_path, shipped_pack_contents):
    from adaptive.errors import CompileError
    from adaptive.kcache import KernelCache
    cache = KernelCache(tmp_path)
    # each shipped pack's copy, written before or after the header: self-contained
    for pack in shipped_pack_contents.values():
        v = next(v for v in pack.variants if v.id == "gemm/tc_mma")
        config = v.space.configs(SM90)[0]
        assert nvrtc.compile_candidate(v, config, "float16", cache=cache).resources[
            "registers"] > 0
    src = ('#include "adaptive_ptx.cuh"\nextern "C" __global__ void k(float* o) {\n'
           "    o[0] = ex2(o[1]) + undefined_y;\n}\n")
    with pytest.raises(CompileError) as err:
        nvrtc.compile_cached(nvrtc.full_source(src, "float16", "mine.cu"), (), "sm_90", "k",
                             "mine", {}, cache)
    assert re.search(r"mine\.cu\(3\).*undefined_y", err.value.log), err.value.log
    bad = src.replace("ex2(o[1]) + undefined_y", "pack2<float>(1.f, 2.f)")
    with pytest.raises(CompileError) as err:
        nvrtc.compile_cached(nvrtc.full_source(bad, "float16", "mine.cu"), (), "sm_90", "k",
                             "mine", {}, cache)
    assert re.search(r"adaptive_ptx\.cuh\(\d+\).*__half or __nv_bfloat16", err.value.log), \
        err.value.log
    flag = src.replace("ex2(o[1]) + undefined_y", "0.f; cp_async16(0u, o, true)")
    with pytest.raises(CompileError, match="deleted"):
        nvrtc.compile_cached(nvrtc.full_source(flag, "float16", "mine.cu"), (), "sm_90", "k",
                             "mine", {}, cache)


def test_the_regen_prompt_names_every_helper_of_the_header():
    import inspect

    from adaptive.regen import prompt
    text = inspect.getsource(prompt)
    missing = sorted(n for n in _functions(HEADER.read_text()) if n not in text)
    assert "adaptive_ptx.cuh" in text and not missing, f"the prompt does not name {missing}"


GENERATED = r"""
#include "adaptive_ptx.cuh"
extern "C" __global__ void softmax_thread(const T* __restrict__ x, T* __restrict__ out,
                                          int R, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= R) return;
    const float l2e = 1.4426950408889634f;
    float m = -INFINITY, s = 0.f;
    for (int c = 0; c < C; ++c) m = fmaxf(m, to_f32(x[(size_t)row * C + c]));
    for (int c = 0; c < C; ++c) s += ex2((to_f32(x[(size_t)row * C + c]) - m) * l2e);
    for (int c = 0; c < C; ++c) {
        const float e = ex2((to_f32(x[(size_t)row * C + c]) - m) * l2e);
        out[(size_t)row * C + c] = from_f32<T>(e / s);
    }
}
"""


@pytest.mark.skipif(not nvrtc.available(), reason="cuda.bindings is not installed")
def test_a_generated_variant_including_the_header_passes_the_verifiers_compile(tmp_path):
    from adaptive.backends import gpu_available
    from adaptive.regen import Job, Outcome, Stage, Verifier
    from adaptive.space import Space
    from adaptive.variants import Variant
    if gpu_available():
        pytest.skip("a GPU is present: the verifier runs the kernel (tests/gpu)")
    variant = Variant("ex2_row", "softmax", "cuda", "cuda", "softmax_thread",
                      source=GENERATED, space=Space((("THREADS", (64,)),)),
                      launch={"grid": ["ceil_div(R, THREADS)"], "block": ["THREADS"]})
    copy = dataclasses.replace(variant, source=GENERATED.replace(
        '#include "adaptive_ptx.cuh"',
        "__device__ float ex2(float x) { return exp2f(x); }\n#include \"adaptive_ptx.cuh\""))
    good, bad = Verifier(timeout_s=60, cache_dir=str(tmp_path)).verify_many(
        [Job(variant, {"THREADS": 64}, {"R": 48, "C": 96}, "float16"),
         Job(copy, {"THREADS": 64}, {"R": 48, "C": 96}, "float16")])
    assert good.outcome is Outcome.COMPILED_ONLY and good.resources["registers"] > 0, good
    assert bad.stage is Stage.COMPILE and "ex2" in bad.detail, bad.detail[:2000]
