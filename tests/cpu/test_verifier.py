"""The isolated verifier on planted bad Python variants: each is rejected at the right
stage without harming this process; good variants are accepted with their checks."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

import adaptive
from adaptive import cli
from adaptive.regen import Job, Outcome, Stage, Verifier, static_check
from adaptive.regen.shapes import edge_shapes, parse_dims
from adaptive.variants import Variant, default_registry, make_candidate

DIMS = {"R": 48, "C": 96}      # C a multiple of 16 and 32; the edge shapes are not

GOOD = """
import numpy as np

def softmax_blocked(x, out, rows):
    for r0 in range(0, x.shape[0], rows):
        xb = x[r0:r0 + rows].astype(np.float64)
        e = np.exp(xb - xb.max(axis=1, keepdims=True))
        out[r0:r0 + rows] = e / e.sum(axis=1, keepdims=True)
"""

PLANTED = {
    # every row but the last
    "partial_write": (Stage.UNWRITTEN, """
def softmax_blocked(x, out, rows):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[:-1] = (e / e.sum(axis=1, keepdims=True))[:-1]
"""),
    "nan": (Stage.NONFINITE, """
def softmax_blocked(x, out, rows):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
    out[0, 0] = np.nan
"""),
    # returns its input instead of writing out
    "returns_input": (Stage.UNWRITTEN, """
def softmax_blocked(x, out, rows):
    return x
"""),
    "modifies_input": (Stage.INPUT_MODIFIED, """
def softmax_blocked(x, out, rows):
    x -= x.max(axis=1, keepdims=True)
    np.exp(x, out=x)
    out[...] = x / x.sum(axis=1, keepdims=True)
"""),
    # remembers the first result per shape: right once, wrong on fresh inputs
    "caches_across_calls": (Stage.WRONG, """
_cache = {}
def softmax_blocked(x, out, rows):
    if x.shape not in _cache:
        e = np.exp(x - x.max(axis=1, keepdims=True))
        _cache[x.shape] = e / e.sum(axis=1, keepdims=True)
    out[...] = _cache[x.shape]
"""),
    # writes only on its first call in the process (a stale output buffer)
    "stale_after_first_call": (Stage.UNWRITTEN, """
_done = []
def softmax_blocked(x, out, rows):
    if _done:
        return
    _done.append(1)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
"""),
    # sums over whole tiles of 16 columns only: right at the target, wrong at odd sizes
    "wrong_on_odd_sizes": (Stage.WRONG, """
def softmax_blocked(x, out, rows):
    full = max(16, x.shape[1] // 16 * 16)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e[:, :full].sum(axis=1, keepdims=True)
"""),
    # one wrong element among thousands: under the norm-wise tolerance, not element-wise
    "one_wrong_element": (Stage.WRONG, """
def softmax_blocked(x, out, rows):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
    rms = np.sqrt(np.mean(out.astype(np.float64) ** 2))
    small = np.where(np.abs(out) > 0.15 * rms, np.abs(out), np.inf)
    out.flat[np.argmin(small)] += 1e-3 * rms
"""),
    "hangs": (Stage.TIMEOUT, """
def softmax_blocked(x, out, rows):
    while True:
        pass
"""),
    "exits": (Stage.CRASH, """
import os
from pathlib import Path
def softmax_blocked(x, out, rows):
    os._exit(0)
"""),
    "segfaults": (Stage.CRASH, """
import ctypes
def softmax_blocked(x, out, rows):
    ctypes.string_at(0)
"""),
    "raises": (Stage.RUN, """
def softmax_blocked(x, out, rows):
    raise IndexError("tile index out of range")
"""),
    "syntax_error": (Stage.COMPILE, """
def softmax_blocked(x, out, rows)
    pass
"""),
    "no_entry": (Stage.SOURCE, """
def softmax(x, out, rows):
    out[...] = x
"""),
}


@pytest.fixture(scope="module")
def template() -> Variant:
    return default_registry().get("softmax", "host_blocked")


def _variant(template, name, body) -> Variant:
    return dataclasses.replace(template, name=name, source="import numpy as np\n" + body)


@pytest.fixture(scope="module")
def planted_reports(template):
    # the limit is what the planted hang costs; the other jobs take milliseconds each
    verifier = Verifier(timeout_s=1.5)
    names = list(PLANTED)
    jobs = [Job(_variant(template, n, PLANTED[n][1]), {"rows": 16}, DIMS) for n in names]
    jobs.append(Job(_variant(template, "good", GOOD), {"rows": 16}, DIMS))
    return dict(zip(names + ["good"], verifier.verify_many(jobs)))


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_bad_variant_is_rejected_at_its_stage(planted_reports, name):
    report = planted_reports[name]
    assert report.outcome is Outcome.REJECTED, report.verdict
    assert report.stage is PLANTED[name][0], f"{report.verdict}\n{report.detail}"
    assert "rejected" in report.verdict and report.detail


def test_rejection_details_say_what_happened(planted_reports):
    assert "never written" in planted_reports["partial_write"].detail
    assert "input #0 was modified" in planted_reports["modifies_input"].detail
    assert "SIGSEGV" in planted_reports["segfaults"].detail
    assert "killed" in planted_reports["hangs"].detail
    assert "IndexError: tile index out of range" in planted_reports["raises"].detail
    assert "line 3" in planted_reports["syntax_error"].detail
    assert planted_reports["one_wrong_element"].detail.startswith("element-wise")
    assert "defines no function 'softmax_blocked'" in planted_reports["no_entry"].detail
    # the odd-size bug shows at an edge shape, not at the target
    assert str(DIMS) not in planted_reports["wrong_on_odd_sizes"].detail


def test_good_variant_after_crashes_is_accepted(planted_reports):
    """A hang, an os._exit and a segfault earlier in the batch don't affect it."""
    r = planted_reports["good"]
    assert r.ok, r.detail
    assert r.executed and r.stage is Stage.NONE
    seeds = {c.seed for c in r.checks}
    assert len(seeds) >= 5
    assert len({c.distribution for c in r.checks}) > 1
    shapes = {tuple(sorted(c.dims.items())) for c in r.checks}
    assert tuple(sorted(DIMS.items())) in shapes and len(shapes) >= 3
    assert all(c.rel_error <= 1e-4 for c in r.checks)
    assert r.time_ms > 0 and len(r.samples_ms) >= 3


def test_report_round_trips_through_json(planted_reports):
    for r in planted_reports.values():
        d = json.loads(json.dumps(r.to_dict()))
        back = type(r).from_dict(d)
        assert back.outcome is r.outcome and back.stage is r.stage
        assert back.verdict == r.verdict


def test_timing_against_a_baseline(template):
    base = make_candidate(default_registry().get("softmax", "host_numpy"), {})
    job = Job(_variant(template, "good", GOOD), {"rows": 8}, {"R": 200, "C": 64}, baseline=base)
    r = Verifier(timeout_s=20).verify(job)
    assert r.ok, r.detail
    assert r.baseline == "host_numpy" and 0 < r.baseline_ms < float("inf")
    assert r.speedup > 0 and r.l2_flushed


def test_float16_and_other_ops_accepted():
    reg = default_registry()
    gemm = make_candidate(reg.get("gemm", "host_blas"), {"threads": 1})
    att = make_candidate(reg.get("attention", "host_materialised"), {"threads": 1})
    v = Verifier(timeout_s=30)
    reports = v.verify_many([
        Job(gemm.variant, gemm.config, {"M": 70, "N": 33, "K": 129}, "float16"),
        Job(att.variant, att.config, {"B": 1, "H": 2, "Lq": 9, "Lk": 21, "D": 16},
            params={"causal": True, "scale": None}),
    ])
    assert all(r.ok for r in reports), [r.detail for r in reports]
    assert all(c.dims["D"] == 16 for c in reports[1].checks)   # head size kept fixed


def test_edge_shapes_are_odd_tiny_and_one():
    shapes = dict(edge_shapes("gemm", {"M": 4096, "N": 4096, "K": 4096}))
    assert shapes["target"] == {"M": 4096, "N": 4096, "K": 4096}
    assert all(v % 2 == 1 for v in shapes["odd"].values())
    assert shapes["one"] == {"M": 1, "N": 1, "K": 1}
    with pytest.raises(ValueError, match="NAME=POSITIVE_INT"):
        parse_dims("M=12,N=x")


def test_static_check_names_the_missing_entry(template):
    assert static_check(template) is None
    bad = dataclasses.replace(template, source="x = 1\n")
    assert "defines no function 'softmax_blocked'" in static_check(bad)
    cuda = Variant("k", "softmax", "cuda", "cuda", "softmax_k", source="int x;",
                   launch={"grid": ["1"], "block": ["32"]})
    assert "defines no kernel 'softmax_k'" in static_check(cuda)


def test_public_verify_and_cli(tmp_path, capsys):
    good = tmp_path / "my_softmax.py"
    good.write_text("import numpy as np\n" + GOOD)
    r = adaptive.verify(good, "softmax", config={"rows": 8}, dims={"R": 33, "C": 17})
    assert r.ok and r.variant == "my_softmax", r.detail
    assert cli.main(["verify", str(good), "--op", "softmax", "--config", '{"rows": 8}',
                     "--shape", "R=40,C=24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outcome"] == "accepted" and out["target_dims"] == {"R": 40, "C": 24}
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy as np\n" + PLANTED["nan"][1])
    assert cli.main(["verify", str(bad), "--op", "softmax", "--entry", "softmax_blocked",
                     "--config", '{"rows": 8}', "--shape", "R=40,C=24"]) == 1
    printed = capsys.readouterr().out
    assert "rejected at stage 'nonfinite'" in printed
    reason = printed.splitlines()[0].split("rejected at stage 'nonfinite': ")[1]
    assert printed.count(reason) == 1, printed          # the reason once, not twice
    assert cli.main(["verify", str(bad), "--op", "softmax", "--shape", "Q=3"]) == 2
    assert "expected exactly ['C', 'R']" in capsys.readouterr().err
    assert cli.main(["verify", str(good), "--op", "softmax", "--dtype", "int8"]) == 2
    assert "--dtype" not in (err := capsys.readouterr().err) and "softmax takes float16, " \
        "bfloat16, float32" in err
    assert cli.main(["verify", str(good), "--op", "softmax", "--config", '{"rows": 8}',
                     "--shape", "R=40,C=24", "--regime", "masked", "--regime", "large",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {c["distribution"] for c in out["checks"]} == {"masked", "large"}
    assert cli.main(["verify", str(good), "--op", "softmax", "--regime", "bogus"]) == 2
    assert "no value regime 'bogus'" in capsys.readouterr().err


CUDA_GOOD = r"""
extern "C" __global__ void softmax_thread(const T* __restrict__ x, T* __restrict__ out,
                                          int R, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= R) return;
    float m = -INFINITY, s = 0.f;
    for (int c = 0; c < C; ++c) m = fmaxf(m, to_f32(x[(size_t)row * C + c]));
    for (int c = 0; c < C; ++c) s += __expf(to_f32(x[(size_t)row * C + c]) - m);
    for (int c = 0; c < C; ++c)
        out[(size_t)row * C + c] = from_f32<T>(__expf(to_f32(x[(size_t)row * C + c]) - m) / s);
}
"""


def _cuda_variant(source: str) -> Variant:
    from adaptive.space import Space
    return Variant("thread_per_row", "softmax", "cuda", "cuda", "softmax_thread", source=source,
                   space=Space((("THREADS", (64, 128)),)),
                   launch={"grid": ["ceil_div(R, THREADS)"], "block": ["THREADS"]})


def test_cuda_candidate_is_compiled_only_without_gpu(tmp_path):
    nvrtc = pytest.importorskip("adaptive.nvrtc")
    if not nvrtc.available():
        pytest.skip("NVRTC (cuda-bindings) is not installed")
    from adaptive.backends import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present: tests/gpu covers the executed path")
    v = Verifier(timeout_s=60, cache_dir=str(tmp_path))
    broken = _cuda_variant(CUDA_GOOD.replace("fmaxf(m,", "fmaxf(m"))
    good, bad = v.verify_many([Job(_cuda_variant(CUDA_GOOD), {"THREADS": 64}, DIMS),
                               Job(broken, {"THREADS": 64}, DIMS)])
    assert good.outcome is Outcome.COMPILED_ONLY and not good.ok and not good.executed
    assert "no GPU" in good.verdict and good.compile_ms > 0
    assert good.resources.get("registers", 0) > 0, good.resources
    assert bad.stage is Stage.COMPILE and "error" in bad.detail
    assert os.listdir(tmp_path)                       # the cubin went to the given cache


def test_target_excluded_by_requires_is_checked_at_edges_but_not_timed(template):
    from adaptive.expr import compile_expr
    v = dataclasses.replace(_variant(template, "short_rows", GOOD),
                            requires=(compile_expr("R < 40"),))
    r = Verifier(timeout_s=20).verify(Job(v, {"rows": 8}, DIMS))
    assert r.ok, r.detail
    assert any(s.startswith("target ") for s in r.skipped_shapes)
    assert all(c.dims["R"] < 40 for c in r.checks) and len(r.checks) >= 5
    assert r.time_ms == float("inf") and "not timed" in r.notes[0]


@pytest.mark.parametrize("errors", [0, 2])
def test_sanitizer_verdict_from_exit_code_and_summary(template, tmp_path, monkeypatch, errors,
                                                      planted_reports):
    """A stand-in compute-sanitizer (runs the worker, then reports) drives the verdict on
    the accepted report of the planted batch's good job."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text("#!/bin/sh\nshift 6\n\"$@\"\nrc=$?\n"
                    f"echo '========= ERROR SUMMARY: {errors} errors'\n"
                    f"if [ {errors} -gt 0 ]; then exit 97; fi\nexit $rc\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    v = Verifier(timeout_s=20, sanitizer_tools=("memcheck",))
    job = Job(_variant(template, "good", GOOD), {"rows": 16}, DIMS)
    report = planted_reports["good"]
    assert report.ok and report.config == job.config
    judged = v._sanitized(job.to_dict(v), report)
    if errors:
        assert judged.stage is Stage.SANITIZER and not judged.ok
        assert "ERROR SUMMARY: 2 errors" in judged.detail
    else:
        assert judged.ok and judged.sanitizer == {"memcheck": "clean"}


def test_verify_cli_on_a_cuda_file_compiles_only(tmp_path, capsys, monkeypatch):
    from adaptive import nvrtc
    from adaptive.backends import gpu_available
    if not nvrtc.available() or gpu_available():
        pytest.skip("needs NVRTC and no GPU")
    if not any(v.name == "warp_row" for v in default_registry().variants("softmax", "cuda")):
        pytest.skip("no warp_row variant to borrow the launch from")
    monkeypatch.setenv("ADAPTIVE_CACHE_DIR", str(tmp_path / "cache"))
    src = (Path(__file__).parents[1] / "gpu" / "planted" / "good.cu").read_text()
    kernel = tmp_path / "my_softmax.cu"
    kernel.write_text(src.replace("ROWS", "WARPS"))
    assert cli.main(["verify", str(kernel), "--op", "softmax", "--like", "warp_row",
                     "--config", '{"WARPS": 2, "VEC": 1}', "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert "my_softmax[VEC=1,WARPS=2]: compiled only" in out
    kernel.write_text(src.replace("ROWS", "WARPS").replace("fmaxf(m,", "fmaxf(m"))
    assert cli.main(["verify", str(kernel), "--op", "softmax", "--like", "warp_row",
                     "--config", '{"WARPS": 2, "VEC": 1}']) == 1
    assert "rejected at stage 'compile'" in capsys.readouterr().out
