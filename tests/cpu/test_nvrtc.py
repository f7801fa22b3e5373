"""Every CUDA variant in the registry compiles for sm_90 with NVRTC.

By default a covering set of its configs x dtypes is compiled (every dtype and every value
of each parameter at least once, the configs nearest each device limit; spills checked on
what is compiled of the ``NO_SPILLS`` variants); ``pytest --nvrtc-all`` compiles every
one, every config of those checked for spills. The compiles are ``adaptive nvrtc-check``
in the background, at nice 19, from the start of the session (``tests/background.py``),
into the kernel cache (so reruns are fast).
A failure names the variant, the config, the dtype and carries NVRTC's log.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from background import Job

from adaptive import nvrtc
from adaptive.errors import CompileError, InputValueError
from adaptive.kcache import KernelCache, kernel_key
from adaptive.limits import SM90
from adaptive.ops import get_op
from adaptive.space import Space

pytestmark = pytest.mark.skipif(not nvrtc.available(),
                                reason="cuda.bindings is not installed (pip install .[nvrtc])")


def _check_args(folder: Path, config) -> list[str]:
    args = ["-c", "import sys; from adaptive.cli import main; sys.exit(main())", "nvrtc-check",
            "--quiet", "--workers", "2", "--json", str(folder / "results.json")]
    return args if config.getoption("--nvrtc-all") else [*args, "--cover"]


BACKGROUND = {"nvrtc-check": Job(_check_args, cpu_s=60.0, nice=19)} if nvrtc.available() \
    else {}


def _registry():
    from adaptive.variants import shared_registry
    return shared_registry()


@pytest.fixture(scope="module")
def nvrtc_results(background) -> list[dict]:
    """One dict per compiled (variant, config, dtype), as ``nvrtc.check_all`` returns them."""
    done = background("nvrtc-check")
    path = done.folder / "results.json"
    assert done.rc in (0, 1) and path.exists(), done.report()   # 1: some kernels failed
    return json.loads(path.read_text())


def _cuda_variant_ids():
    reg = _registry()
    return [v.id for op in reg.ops() for v in reg.variants(op, "cuda") if v.language == "cuda"]


@pytest.mark.parametrize("variant_id", _cuda_variant_ids())
def test_every_config_compiles(nvrtc_results, variant_id):
    op, name = variant_id.split("/")
    mine = [r for r in nvrtc_results if r["op"] == op and r["variant"] == name]
    assert mine, f"{variant_id}: no config of it can launch on sm_90 (check its space)"
    failed = [r for r in mine if not r["ok"]]
    report = "\n\n".join(f"{variant_id} {r['dtype']} config={r['config']}:\n{r['log']}"
                         for r in failed[:3])
    assert not failed, f"{len(failed)}/{len(mine)} configs failed to compile:\n{report}"
    for r in mine:
        assert r["resources"]["registers"] > 0, f"no ptxas report for {variant_id} {r}"
    if variant_id in nvrtc.NO_SPILLS:
        spilled = [(r["dtype"], r["config"], r["resources"]) for r in mine
                   if r["resources"]["spill_store_bytes"] or r["resources"]["stack_bytes"]]
        assert not spilled, f"{variant_id}: configs that spill: {spilled}"


def _key(job):
    v, config, dtype = job
    return v.id, tuple(sorted(config.items())), dtype


def test_covering_set_holds_every_variant_dtype_value_and_limit_edge():
    reg = _registry()
    every = list(nvrtc.cuda_jobs(reg))
    cover = nvrtc.covering_jobs(reg)
    assert {_key(j) for j in cover} <= {_key(j) for j in every}
    assert len(cover) < len(every) / 3, "a covering set this large saves nothing"
    for vid in _cuda_variant_ids():
        all_mine = [j for j in every if j[0].id == vid]
        mine = [j for j in cover if j[0].id == vid]
        assert {j[2] for j in mine} == {j[2] for j in all_mine}, f"{vid}: a dtype left out"
        for name in all_mine[0][0].space.names:
            assert {j[1][name] for j in mine} == {j[1][name] for j in all_mine}, \
                f"{vid}: values of {name} left out"
        space = all_mine[0][0].space
        read = set().union(*(c.names for c in space.constraints)) if space.constraints else set()
        for limit in (n for n in nvrtc.EDGE_LIMITS if n in read):
            need = max(nvrtc.limit_need(space, j[1], limit) for j in all_mine)
            edges = [j[1] for j in mine if nvrtc.limit_need(space, j[1], limit) == need]

            def dtypes(jobs, config):
                return {j[2] for j in jobs if j[1] == config}
            assert any(dtypes(mine, c) == dtypes(all_mine, c) for c in edges), \
                f"{vid}: no config nearest {limit} is compiled in every dtype"


def test_limit_need_is_the_least_limit_that_admits_the_config():
    space = Space.from_dict({"T": [128, 256], "S": [1, 2],
                             "constraints": ["T <= max_threads_per_block",
                                             "4096 * S <= max_shared_bytes"]})
    assert nvrtc.limit_need(space, {"T": 256, "S": 1}, "max_threads_per_block") == 256
    assert nvrtc.limit_need(space, {"T": 128, "S": 2}, "max_shared_bytes") == 8192
    assert nvrtc.limit_need(space, {"T": 128, "S": 2}, "sm_count") == 0
    too_big = {**SM90, "max_threads_per_block": 128}
    assert nvrtc.limit_need(space, {"T": 256, "S": 1}, "max_shared_bytes", too_big) == \
        too_big["max_shared_bytes"] + 1


def test_ptxas_report_is_parsed():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas info    : Function properties for k\n"
           "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 72 registers, used 1 barriers, 4352 bytes smem\n")
    assert nvrtc.parse_ptxas(log, "k") == {"registers": 72, "shared_bytes": 4352,
                                           "stack_bytes": 8, "spill_store_bytes": 4,
                                           "spill_load_bytes": 12}


def test_compile_error_has_numbered_source_and_log(tmp_path):
    src = nvrtc.full_source("extern \"C\" __global__ void k(T* o) { o[0] = undefined_x; }",
                            "float32", "bad.cu")
    with pytest.raises(CompileError) as info:
        nvrtc.compile_cached(src, ("-DBM=64",), "sm_90", "k", "bad", {"BM": 64},
                             KernelCache(tmp_path))
    text = str(info.value)
    assert "undefined_x" in info.value.log and "bad.cu(1)" in info.value.log
    assert "   1 | " in text and info.value.config == {"BM": 64}


def test_cache_hit_and_corruption_is_a_miss(tmp_path):
    src = nvrtc.full_source("extern \"C\" __global__ void k(T* o, int n) { o[0] = n; }",
                            "float32", "k.cu")
    cache = KernelCache(tmp_path)
    first = nvrtc.compile_cached(src, (), "sm_90", "k", "k", {}, cache)
    key = kernel_key(src, (), "sm_90", nvrtc.compiler_version())
    assert first.key == key and cache.get(key).path == first.path
    data = bytearray(first.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.path.write_bytes(bytes(data))
    assert cache.get(key) is None, "a cubin whose hash does not match must be a miss"
    again = nvrtc.compile_cached(src, (), "sm_90", "k", "k", {}, cache)
    assert cache.get(key) is not None and again.resources["registers"] > 0


def test_macros_and_prelude():
    assert nvrtc.macro_options({"BN": 64, "CACHE": True}) == ("-DBN=64", "-DCACHE=1")
    assert "typedef __nv_bfloat16 T;" in nvrtc.prelude("bfloat16")
    with pytest.raises(ValueError, match="float8"):
        nvrtc.prelude("float8")


def test_argument_binding_resolves_names_and_rejects_unknown():
    from adaptive.backends import cuda_args
    op = get_op("gemm")
    problem = op.problem((np.ones((3, 5), "f4"), np.ones((5, 7), "f4")), {})
    scope = {**problem.scope(), "BM": 64}
    slots, env = cuda_args.bind(op, ["a", "b", "out", "M", "N", "K", "BM", "K:i64"], "torch",
                                scope, problem)
    assert [s.code for s in slots[:3]] == ["_u64(args[0].data_ptr())",
                                           "_u64(args[1].data_ptr())",
                                           "_u64(out.data_ptr())"]   # torch's allocator
    consts = [s.constant for s in slots[3:]]
    assert consts == [3, 7, 5, 64, 5] and isinstance(consts[-1], np.int64)
    assert isinstance(consts[0], np.int32)
    with pytest.raises(InputValueError, match="unknown kernel argument 'bogus'"):
        cuda_args.bind(op, ["a", "bogus"], "cupy", scope, problem)
    with pytest.raises(InputValueError, match="workspace_bytes"):
        cuda_args.bind(op, ["workspace"], "cupy", scope, problem)


def test_generated_launcher_passes_slots_in_order():
    from adaptive.backends import cuda_args
    calls = []
    op = get_op("softmax")
    problem = op.problem((np.ones((4, 9), "f4"),), {})
    slots, env = cuda_args.bind(op, ["x", "out", "R", "C"], "cupy", problem.scope(), problem)
    launch = cuda_args.make_launcher(slots, env, lambda *a: calls.append(a), (4,), (32,), 0)
    launch(("X",), "OUT")
    assert calls == [((4,), (32,), ("X", "OUT", 4, 9), 0, None)]


def test_launchers_of_two_keys_share_their_code_and_keep_their_own_constants():
    """A miss compiles no Python: the launcher text of a variant is the same for each key
    (its constants have names), compiled once; each launcher passes its key's values."""
    from adaptive.backends import cuda_args
    calls = []
    op = get_op("softmax")
    launches = []
    for shape in ((4, 9), (6, 11)):
        problem = op.problem((np.ones(shape, "f4"),), {})
        slots, env = cuda_args.bind(op, ["x", "out", "R", "C"], "cupy", problem.scope(),
                                    problem)
        launches.append(cuda_args.make_launcher(slots, env, lambda *a: calls.append(a),
                                                shape, (32,), 0))
    assert launches[0].__code__ is launches[1].__code__
    for launch in launches:
        launch(("X",), "OUT")
    assert calls == [((4, 9), (32,), ("X", "OUT", 4, 9), 0, None),
                     ((6, 11), (32,), ("X", "OUT", 6, 11), 0, None)]


def test_a_plan_has_one_workspace_per_stream():
    """Two streams running one split-K plan at once must not share partials and counters."""
    from adaptive.backends import cuda_args
    current = [0]
    made = []

    def zeros(nbytes, stream_ptr):
        buf = bytearray(nbytes)                      # stands in for a zeroed device buffer
        made.append((stream_ptr, nbytes))
        return buf
    ws = cuda_args.StreamWorkspaces(zeros, 64, lambda: current[0])
    op = get_op("gemm")
    problem = op.problem((np.ones((3, 5), "f4"), np.ones((5, 7), "f4")), {})
    slots, env = cuda_args.bind(op, ["a", "out", "workspace"], "cupy", problem.scope(),
                                problem, ws)
    calls = []
    launch = cuda_args.make_launcher(slots, env, lambda g, b, args, smem, stream:
                                     calls.append(args[2]), (1, 1, 1), (32, 1, 1), 0)
    for ptr in (0, 0, 1234, 0, 1234, 99):
        current[0] = ptr
        launch((np.ones((3, 5), "f4"),), np.empty((3, 7), "f4"))
    assert made == [(0, 64), (1234, 64), (99, 64)] and len(ws) == 3
    assert calls[0] is calls[1] is calls[3] and calls[2] is calls[4]
    assert calls[0] is not calls[2] and all(calls[5] is not c for c in (calls[0], calls[2]))


def test_nvrtc_check_compiles_only_the_variants_named(monkeypatch, capsys, tmp_path):
    """--variants: the kernel cache filled for a benchmark's variants alone (run S155's
    probe: the flash kernels, not the decode kernels' 342); an unknown name is refused with
    the nearest known one."""
    from adaptive.cli import main
    compiled = []

    def job(payload):
        compiled.append(payload[4])                 # the variant's name
        return True, {}, "", 0.0
    monkeypatch.setattr(nvrtc, "_job", job)
    out = tmp_path / "r.json"
    assert main(["nvrtc-check", "--quiet", "--workers", "1", "--json", str(out),
                 "--variants", "spmm/bsr64_simt, spmm/bsr32_grouped_splitk_mma"]) == 0
    expected = [j for j in nvrtc.cuda_jobs(_registry())
                if j[0].name in ("bsr64_simt", "bsr32_grouped_splitk_mma")]
    assert sorted(compiled) == sorted(v.name for v, _, _ in expected) and len(compiled) > 4
    assert f"{len(expected)}/{len(expected)} compiled" in capsys.readouterr().out
    assert {(r["variant"], r["dtype"]) for r in json.loads(out.read_text())} == {
        (v.name, d) for v, _, d in expected}
    compiled.clear()
    assert main(["nvrtc-check", "--workers", "1", "--variants", "spmm/bsr64_simd"]) == 2
    err = capsys.readouterr().err
    assert "unknown CUDA-language variant 'spmm/bsr64_simd'; did you mean 'spmm/bsr64_simt'" \
        in err and compiled == []
