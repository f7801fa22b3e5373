"""Value regimes and output guards in the verifier, on the host backend.

Each planted host variant carries one defect that only the inputs real models feed
expose (large logits, -inf masks, constant and tiny rows, mixed signs, long positive
sums, subnormal rows, empty sparse rows) or a write outside the output; the same
defects as the CUDA kernels in tests/gpu/planted/. Each is rejected, naming the regime;
correct controls written in different styles are accepted.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from adaptive.errors import InputValueError
from adaptive.ops import OPS, get_op
from adaptive.ops.regimes import RANGE, accumulation_tolerance
from adaptive.regen import Job, Outcome, Stage, Verifier
from adaptive.regen.shapes import edge_shapes, make_inputs
from adaptive.variants import default_registry

SOFTMAX_DIMS = {"R": 24, "C": 96}        # C a multiple of 32: the tile-size bugs hide here

SOFTMAX_BAD = {
    # exp(x) / sum(exp(x)): Inf/Inf at +1e4, 0/0 at -1e4
    "no_max_subtraction": (Stage.NONFINITE, "large", """
def softmax_blocked(x, out, rows):
    e = np.exp(x.astype(np.float32))
    out[...] = e / e.sum(axis=1, keepdims=True)
"""),
    # exp(x - logsumexp(x)) in fp32: x - lse loses ~1e-3 at |x| ~ 1e4
    "logsumexp_precision": (Stage.WRONG, "large", """
def softmax_blocked(x, out, rows):
    x = x.astype(np.float32)
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True))).astype(np.float32)
    out[...] = np.exp(x - lse)
"""),
    # online softmax per lane of 32 strided columns, partial results combined; a lane
    # whose columns are all -inf rescales by exp(-inf - -inf) = NaN
    "online_masked_nan": (Stage.NONFINITE, "masked", """
def softmax_blocked(x, out, rows):
    x = x.astype(np.float32)
    lanes = min(32, x.shape[1])
    with np.errstate(invalid="ignore"):
        ms = [x[:, l::32].max(axis=1) for l in range(lanes)]
        ss = [np.exp(x[:, l::32] - ms[l][:, None]).sum(axis=1) for l in range(lanes)]
        m = np.max(ms, axis=0)
        s = sum(ss[l] * np.exp(ms[l] - m) for l in range(lanes))
        out[...] = np.exp(x - m[:, None]) / s[:, None]
"""),
    # clamps logits to +-30 "against overflow"
    "clamps_logits": (Stage.WRONG, "mixed", """
def softmax_blocked(x, out, rows):
    x = np.clip(x.astype(np.float64), -30, 30)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
"""),
    # treats a row of (near-)zeros as padding and writes zeros
    "zero_row_is_padding": (Stage.WRONG, "tiny", """
def softmax_blocked(x, out, rows):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
    out[np.abs(x).max(axis=1) < 1e-30] = 0
"""),
    # a constant row is answered 1/(C rounded up to the 32-wide tile)
    "uniform_row_shortcut": (Stage.WRONG, "constant", """
def softmax_blocked(x, out, rows):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
    flat = x.max(axis=1) == x.min(axis=1)
    out[flat] = 1.0 / (-(-x.shape[1] // 32) * 32)
"""),
    # right values, then one element written past the end of the output
    "writes_one_past_the_end": (Stage.OUT_OF_BOUNDS, "", """
import ctypes
def softmax_blocked(x, out, rows):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
    ctypes.memset(out.ctypes.data + out.nbytes, 0, out.itemsize)
"""),
    "writes_one_before_the_start": (Stage.OUT_OF_BOUNDS, "", """
import ctypes
def softmax_blocked(x, out, rows):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
    ctypes.memset(out.ctypes.data - out.itemsize, 0, out.itemsize)
"""),
}

SOFTMAX_GOOD = {
    # two passes in float64, rows in blocks
    "two_pass_float64": """
def softmax_blocked(x, out, rows):
    for r0 in range(0, x.shape[0], rows):
        xb = x[r0:r0 + rows].astype(np.float64)
        e = np.exp(xb - xb.max(axis=1, keepdims=True))
        out[r0:r0 + rows] = e / e.sum(axis=1, keepdims=True)
""",
    # online per lane, as the NaN one, with the -inf lane guarded
    "online_guarded": """
def softmax_blocked(x, out, rows):
    x = x.astype(np.float32)
    lanes = min(32, x.shape[1])
    ms = [x[:, l::32].max(axis=1) for l in range(lanes)]
    m = np.max(ms, axis=0)
    safe = np.where(np.isfinite(m), m, 0)[:, None]
    s = sum(np.exp(x[:, l::32] - safe).sum(axis=1) for l in range(lanes))
    out[...] = np.exp(x - safe) / s[:, None]
""",
    # log domain with the subtraction done in float64; subnormal inputs flushed (no defect
    # for softmax: exp(±1e-38) is 1 to the last bit either way)
    "log_domain_flushing_subnormals": """
def softmax_blocked(x, out, rows):
    x = x.astype(np.float64)
    x[np.abs(x) < np.finfo(np.float32).tiny] = 0.0
    m = x.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    out[...] = np.exp(x - lse)
""",
}

GEMM_BAD = {
    # an fp16 accumulator: long positive sums lose their low bits
    "fp16_accumulator": (Stage.WRONG, "accumulate", "float16", """
def gemm_blas(a, b, out, **kw):
    acc = np.zeros(out.shape, np.float16)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    for k in range(a.shape[1]):
        acc = (acc.astype(np.float32) + a32[:, k:k + 1] * b32[k:k + 1]).astype(np.float16)
    out[...] = acc
"""),
    # subnormal inputs flushed to zero (what -ftz does to fp32 FMA operands)
    "flushes_subnormal_inputs": (Stage.WRONG, "extreme", "float32", """
def gemm_blas(a, b, out, **kw):
    tiny = np.finfo(a.dtype).tiny
    a = np.where(np.abs(a) < tiny, 0, a)
    out[...] = a.astype(np.float64) @ b.astype(np.float64)
"""),
    # inputs clipped to a fixed range of +-8 (a fixed-scale quantiser)
    "fixed_range_inputs": (Stage.WRONG, "mixed", "float32", """
def gemm_blas(a, b, out, **kw):
    out[...] = np.clip(a, -8, 8).astype(np.float64) @ b.astype(np.float64)
"""),
}

GEMM_GOOD = """
def gemm_blas(a, b, out, **kw):
    out[...] = a.astype(np.float64) @ b.astype(np.float64)
"""

SPMM_SKIPS_EMPTY = """
def spmm_csr(w, b, out):
    csr = w.csr()
    res = csr @ b.astype(np.float64)
    stored = np.diff(csr.indptr) > 0
    out[stored] = res[stored]
"""

ATTENTION_NO_MAX = """
import math
def attention_materialised(q, k, v, out, causal=False, scale=None, **kw):
    q, k, v = (t.astype(np.float32) for t in (q, k, v))
    lq, lk = q.shape[2], k.shape[2]
    scale = np.float32(1.0 / math.sqrt(q.shape[3]) if scale is None else scale)
    s = np.exp(np.einsum("bhqd,bhkd->bhqk", q, k) * scale)
    if causal:
        s[..., np.arange(lk)[None, :] > (np.arange(lq)[:, None] + (lk - lq))] = 0
    out[...] = np.einsum("bhqk,bhkd->bhqd", s / s.sum(-1, keepdims=True), v)
"""


def _with(op: str, name: str, entry_variant: str, body: str):
    v = default_registry().get(op, entry_variant)
    return dataclasses.replace(v, name=name, source="import numpy as np\n" + body)


CASES = {**{n: (s, r, "softmax", "host_blocked", {"rows": 8}, SOFTMAX_DIMS, "float32", b, {})
            for n, (s, r, b) in SOFTMAX_BAD.items()},
         **{n: (s, r, "gemm", "host_blas", {"threads": 1}, {"M": 20, "N": 12, "K": 64}, d, b, {})
            for n, (s, r, d, b) in GEMM_BAD.items()},
         "skips_empty_rows": (Stage.UNWRITTEN, "empty_rows", "spmm", "host_csr", {},
                              {"M": 40, "N": 8, "K": 256}, "float32", SPMM_SKIPS_EMPTY,
                              {"density": 0.1}),
         "attention_no_max": (Stage.NONFINITE, "large", "attention", "host_materialised",
                              {"threads": 1}, {"B": 1, "H": 2, "Lq": 5, "Lk": 9, "D": 8},
                              "float32", ATTENTION_NO_MAX, {})}


@pytest.fixture(scope="module")
def reports():
    """Each defect checked in every regime, in its own regime only, and in the normal
    regime only (where it must pass: the regime is what finds it)."""
    jobs, keys = [], []
    for name, (_, regime, op, like, cfg, dims, dtype, body, stats) in CASES.items():
        variant = _with(op, name, like, body)
        for mode, regimes in (("all", ()), ("own", (regime,) if regime else ()),
                              ("normal", ("normal",))):
            if mode != "all" and not regime:
                continue
            jobs.append(Job(variant, cfg, dims, dtype, stats=stats, regimes=regimes))
            keys.append((name, mode))
    for name, body in SOFTMAX_GOOD.items():
        for dtype in ("float32", "float16"):
            jobs.append(Job(_with("softmax", name, "host_blocked", body), {"rows": 8},
                            SOFTMAX_DIMS, dtype))
            keys.append((f"{name}/{dtype}", "all"))
    for dtype in ("float32", "float16"):
        jobs.append(Job(_with("gemm", "float64_gemm", "host_blas", GEMM_GOOD), {"threads": 1},
                        {"M": 20, "N": 12, "K": 64}, dtype))
        keys.append((f"float64_gemm/{dtype}", "all"))
    return dict(zip(keys, Verifier(timeout_s=30, seed=3).verify_many(jobs)))


@pytest.mark.parametrize("name", list(CASES))
def test_planted_defect_is_rejected_and_its_regime_is_what_finds_it(reports, name):
    stage, regime = CASES[name][:2]
    r = reports[name, "all"]
    assert r.outcome is Outcome.REJECTED, r.verdict
    if regime == "empty_rows" or not regime:
        assert r.stage is stage, f"{r.verdict}\n{r.detail}"
    if not regime:
        return
    own = reports[name, "own"]
    assert own.outcome is Outcome.REJECTED and own.stage is stage, f"{own.verdict}\n{own.detail}"
    assert f"{regime} values" in own.detail, own.detail
    normal = reports[name, "normal"]
    if name == "fp16_accumulator":     # the long-reduction shape finds it in any regime
        assert not normal.ok and "'K': 4096" in normal.detail, normal.detail
    elif regime != "empty_rows":       # tiny sparse shapes have empty rows anyway
        assert normal.ok, f"the normal regime alone already finds it: {normal.detail}"


def test_guard_detail_names_the_side(reports):
    assert "past the end" in reports["writes_one_past_the_end", "all"].detail
    assert "before the start" in reports["writes_one_before_the_start", "all"].detail


@pytest.mark.parametrize("name", [*[f"{n}/{d}" for n in SOFTMAX_GOOD for d in ("float32",
                                                                                  "float16")],
                                  "float64_gemm/float32", "float64_gemm/float16"])
def test_correct_controls_are_accepted_in_every_regime(reports, name):
    r = reports[name, "all"]
    assert r.ok, f"{r.verdict}\n{r.detail}"
    op = get_op(r.op)
    seen = {c.distribution for c in r.checks}
    assert seen == set(op.regimes), seen       # every regime ran, at the small shapes
    assert any(c.dims.get("C", c.dims.get("K")) >= 4096 for c in r.checks)


# ---- the regimes themselves --------------------------------------------------------------------

@pytest.mark.parametrize("op_name", sorted(OPS))
def test_every_regime_draws_the_ops_shapes_and_a_finite_reference(op_name):
    op = get_op(op_name)
    dims = {"softmax": {"R": 13, "C": 37}, "rmsnorm": {"R": 13, "C": 37},
            "gemm": {"M": 7, "N": 5, "K": 33},
            "spmm": {"M": 9, "N": 5, "K": 40},
            "attention": {"B": 1, "H": 2, "Lq": 3, "Lk": 7, "D": 8}}[op_name]
    stats = {"density": 0.2} if op_name == "spmm" else None
    for dtype in ("float32", "float16"):
        normal = make_inputs(op, dims, dtype, 0, "normal", stats)
        for regime in op.regimes:
            inputs = make_inputs(op, dims, dtype, 5, regime, stats)
            for x, y in zip(inputs, normal):
                assert np.shape(x) == np.shape(y)
                if isinstance(x, np.ndarray):
                    assert x.dtype == y.dtype
            with np.errstate(invalid="ignore"):
                ref = op.reference(*inputs)
            undefined = np.isnan(ref)
            if op_name == "softmax" and regime == "masked":
                assert undefined.all(axis=1).sum() == 1     # the row masked everywhere
            else:
                assert not undefined.any(), (regime, dtype)
            assert np.isfinite(ref[~undefined]).all(), (regime, dtype)


TARGETS = {"softmax": {"R": 13, "C": 37}, "rmsnorm": {"R": 13, "C": 37},
           "gemm": {"M": 7, "N": 5, "K": 33},
           "spmm": {"M": 9, "N": 5, "K": 40},
           "attention": {"B": 2, "H": 8, "Hkv": 2, "Lq": 1, "Lk": 65, "D": 16}}


@pytest.mark.parametrize("op_name", sorted(OPS))
def test_every_regime_draws_row_major_inputs_of_the_probes_input_class(op_name):
    """The verifier builds a shape's plan from its normal probe and feeds it every regime's
    inputs; kernels read raw row-major pointers. The constant attention regime once drew k
    as a copy of a broadcast, Fortran-ordered where B * Hkv = 1 (CuPy keeps that order):
    splitkv_mma read k transposed at B=1, H=7, Hkv=1 and was rejected on the H200."""
    op = get_op(op_name)
    stats = {"density": 0.2} if op_name == "spmm" else None
    params = {"causal": False} if op_name == "attention" else {}
    seen = 0
    for label, dims in edge_shapes(op_name, TARGETS[op_name]):
        for dtype in ("float16", "float32"):
            try:
                probe = op.problem(make_inputs(op, dims, dtype, 0, "normal", stats), params)
            except InputValueError:           # an edge shape the op refuses: skipped there
                continue
            seen += 1
            for regime in op.regimes:
                inputs = make_inputs(op, dims, dtype, 7, regime, stats)
                for x in inputs:
                    if isinstance(x, np.ndarray):
                        assert x.flags.c_contiguous, (label, dims, dtype, regime, x.strides)
                got = op.problem(inputs, params)      # refuses what a dispatcher refuses
                assert (got.dims, got.dtype, got.kind) == (probe.dims, probe.dtype,
                                                           probe.kind), (label, regime)
    assert seen >= 6


def test_the_worker_refuses_inputs_its_plan_was_not_built_for(monkeypatch):
    """A regime drawing an input the op refuses (here a Fortran-ordered k) is the
    verifier's error, raised as such, not a verdict on the candidate: a host variant
    (NumPy reads any layout) would pass, a CUDA kernel would read k transposed."""
    from adaptive.backends import get_backend
    from adaptive.regen import shapes, worker
    from adaptive.variants import make_candidate
    op = get_op("attention")
    (variant,) = [v for v in default_registry().variants("attention", "host")
                  if v.name == "host_materialised"]
    config = {"threads": 1}
    runner = worker.Runner(get_backend("host"), op, make_candidate(variant, config))
    draw = shapes.make_inputs

    def fortran_k(op_, dims, dtype, seed, dist, stats=None):
        q, k, v = draw(op_, dims, dtype, seed, dist, stats)
        return (q, np.asfortranarray(k), v) if dist == "constant" else (q, k, v)
    job = {"dtype": "float32", "dims": {"B": 1, "H": 2, "Hkv": 1, "Lq": 1, "Lk": 9, "D": 8},
           "params": {"causal": False}, "seeds": 5, "seed0": 1, "small_only": True}
    checks, _ = worker.check_correctness(runner, variant, config, job)   # the real regimes
    assert {c.distribution for c in checks} == set(op.regimes)
    monkeypatch.setattr(shapes, "make_inputs", fortran_k)
    with pytest.raises(RuntimeError, match="constant values.*not C-contiguous"):
        worker.check_correctness(runner, variant, config, job)


def test_regimes_reach_the_values_they_name():
    sm = get_op("softmax")
    x32 = make_inputs(sm, {"R": 12, "C": 50}, "float32", 1, "large")[0]
    assert 3e3 <= np.median(np.abs(x32)) and np.abs(x32).max() <= 1e5
    x16 = make_inputs(sm, {"R": 12, "C": 50}, "float16", 1, "large")[0]
    assert np.abs(x16).max() >= 0.25 * RANGE["float16"][0] and np.isfinite(x16).all()
    tiny = make_inputs(sm, {"R": 12, "C": 50}, "float32", 1, "tiny")[0]
    assert (np.abs(tiny) < np.finfo(np.float32).tiny).any()       # subnormals present
    masked = make_inputs(sm, {"R": 12, "C": 50}, "float32", 1, "masked")[0]
    assert np.isneginf(masked).any() and np.isfinite(masked).any(axis=1).sum() == 11
    a, _ = make_inputs(get_op("gemm"), {"M": 40, "N": 4, "K": 16}, "float32", 1, "extreme")
    rows = np.abs(a).max(axis=1)
    assert rows.min() < np.finfo(np.float32).tiny and rows.max() > 1e29
    w, _ = make_inputs(get_op("spmm"), {"M": 40, "N": 4, "K": 64}, "float32", 1, "empty_rows",
                       {"density": 0.2})
    assert (np.diff(w.csr().indptr) == 0).sum() >= 2


def test_tolerance_grows_with_the_reduction_length():
    gemm = get_op("gemm")
    assert gemm.tolerance_for("float32", {"M": 8, "N": 8, "K": 64}) == 1e-4
    long = gemm.tolerance_for("float32", {"M": 8, "N": 8, "K": 1 << 20})
    assert long == pytest.approx(16 * 2.0 ** -24 * 1024) and long > 1e-4
    assert gemm.tolerance_for("float16", {"K": 1 << 20}) == 5e-3
    assert accumulation_tolerance(0.0, 0) == pytest.approx(16 * 2.0 ** -24)
    assert get_op("softmax").reduction_dims == ("C",)


def _spmm_fp16_subnormal_case():
    """The H200 case: spmm M = N = K = 1, extreme regime: w = 6.7e-6 (subnormal in fp16),
    b = -0.259; the exact product -1.743e-6 is subnormal in fp16 (spacing 2^-24)."""
    op = get_op("spmm")
    dims = {"M": 1, "N": 1, "K": 1}
    inputs = make_inputs(op, dims, "float16", 559202032, "extreme")
    ref = op.reference(*inputs)
    assert 0 < abs(ref.item()) < RANGE["float16"][1]
    return op, dims, ref


def test_a_correctly_rounded_subnormal_result_passes_and_a_few_ulps_off_fail():
    """Rounding to fp16 costs up to half the subnormal spacing (2^-25), which is 0.83%
    relative here, past the 0.5% tolerance: the error floor (Op.error_floor) forgives
    exactly that and no more."""
    from adaptive.regen import worker
    op, dims, ref = _spmm_fp16_subnormal_case()
    tol, floor = op.tolerance_for("float16", dims), op.error_floor("float16")
    assert floor == 2.0 ** -25
    exact = ref.astype(np.float32).astype(np.float16).astype(np.float64)  # fp32 sum, rounded
    assert op.error(exact, ref) > tol                 # what the relative bound alone says
    assert worker._compare(op, dims, 1, "extreme", exact, exact, ref, tol, floor).ok
    ulp = RANGE["float16"][2]
    for off in (2, 3, -2):                            # a few ulps off (2 ulps: 3.4% here)
        bad = exact + off * ulp
        with pytest.raises(worker.Reject, match="relative error") as info:
            worker._compare(op, dims, 1, "extreme", bad, bad, ref, tol, floor)
        assert info.value.stage is Stage.WRONG


def test_the_error_floor_keeps_exact_zeros_and_normal_results_relative():
    from adaptive.regen import worker
    rng = np.random.default_rng(3)
    op, dims = get_op("gemm"), {"M": 8, "N": 64, "K": 4}
    floor = op.error_floor("float16")
    tol = op.tolerance_for("float16", dims)
    # results over the subnormal range and the normal range, each correctly rounded: pass
    ref = rng.standard_normal((8, 64)) * 2.0 ** rng.uniform(-24, 4, (8, 1))
    ref[3] = 0.0                                      # an empty row: exactly zero
    exact = ref.astype(np.float16).astype(np.float64)
    assert worker._compare(op, dims, 1, "extreme", exact, exact, ref, tol, floor).ok
    # the smallest fp16 subnormal where the reference is zero is still a wrong row
    bad = exact.copy()
    bad[3, 5] = RANGE["float16"][2]
    with pytest.raises(worker.Reject, match=r"row-wise relative error inf .* in output row 3 "):
        worker._compare(op, dims, 1, "extreme", bad, bad, ref, tol, floor)
    # the floor is absolute: at normal magnitudes a 1% error still fails
    big = exact * (1 + 0.01 * (np.abs(exact) > 1e-3))
    with pytest.raises(worker.Reject, match="relative error"):
        worker._compare(op, dims, 1, "extreme", big, big, ref, tol, floor)
    assert op.error(big, ref, floor) == pytest.approx(op.error(big, ref), rel=1e-3)


def test_long_reduction_shape_keeps_fixed_dims():
    shapes = dict(edge_shapes("attention", {"B": 2, "H": 4, "Lq": 64, "Lk": 64, "D": 64}))
    assert shapes["long-reduction"]["D"] == 64 and shapes["long-reduction"]["Lk"] == 4096
    assert shapes["long-reduction"]["Lq"] % 2 == 1
    big = dict(edge_shapes("gemm", {"M": 8, "N": 8, "K": 1 << 17}))["long-reduction"]
    assert big["K"] == 1 << 17


def test_unknown_regime_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="masked"):
        make_inputs(get_op("softmax"), {"R": 2, "C": 3}, "float32", 0, "bogus")
    job = Job(_with("softmax", "x", "host_blocked", SOFTMAX_GOOD["two_pass_float64"]),
              {"rows": 8}, SOFTMAX_DIMS, regimes=("masked", "bogus"))
    with pytest.raises(ValueError, match="no value regime 'bogus'; known: normal"):
        Verifier().verify(job)


def test_cuda_report_notes_a_missing_sanitizer(monkeypatch):
    import shutil

    from adaptive.regen import verifier as vmod
    monkeypatch.setattr(shutil, "which", lambda name: None)
    job = Job(_with("softmax", "x", "host_blocked", SOFTMAX_GOOD["two_pass_float64"]),
              {"rows": 8}, SOFTMAX_DIMS)
    cuda_job = dataclasses.replace(job, variant=dataclasses.replace(job.variant,
                                                                   language="cuda"))
    wanted, why = Verifier(sanitize="auto")._sanitizer_wanted([cuda_job])
    assert not wanted and "compute-sanitizer skipped: not on PATH" in why
    assert vmod.Verifier(sanitize="off")._sanitizer_wanted([cuda_job]) == (False, "")
