"""Planted bad CUDA kernels (``tests/gpu/planted/*.cu``) through the isolated verifier:
every one is rejected and this process's CUDA context stays healthy; correct kernels of
three styles pass (float32 and float16). The regime kernels (large logits, -inf masks,
constant and tiny rows, mixed signs, writes just outside the output) also run on the CPU
through the CUDA emulation: tests/cpu/test_planted_emu.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from adaptive.regen import Job, Outcome, Stage, Verifier
from adaptive.space import Space
from adaptive.variants import Variant, default_registry, make_candidate

pytestmark = pytest.mark.gpu

PLANTED = Path(__file__).parent / "planted"
DIMS = {"R": 200, "C": 512}          # C a multiple of 128: the odd-size bug hides at the target
ROWS = {"ROWS": 4}

# expected stage(s) of each planted kernel without the sanitizer
EXPECTED = {
    "partial_write": {Stage.UNWRITTEN},
    "nan": {Stage.NONFINITE},
    "returns_input": {Stage.WRONG},
    "caches_across_calls": {Stage.UNWRITTEN},
    "wrong_on_odd_sizes": {Stage.UNWRITTEN, Stage.WRONG},
    "hangs": {Stage.TIMEOUT},
    "illegal_address": {Stage.RUN, Stage.CRASH},
    # value regimes (adaptive/ops/regimes.py)
    "no_max_subtraction": {Stage.NONFINITE, Stage.WRONG},
    "logsumexp_precision": {Stage.WRONG},
    "online_masked_nan": {Stage.NONFINITE},
    "clamps_logits": {Stage.WRONG},
    "zero_row_is_padding": {Stage.WRONG},
    "uniform_row_shortcut": {Stage.WRONG},
    # guard regions around the output
    "one_past_the_end": {Stage.OUT_OF_BOUNDS},
    "one_before_the_start": {Stage.OUT_OF_BOUNDS},
    "oob_write": {Stage.OUT_OF_BOUNDS, Stage.WRONG, Stage.RACE},
}
# the regime whose values must show each regime defect (its detail names it)
REGIME = {"no_max_subtraction": "large", "logsumexp_precision": "large",
          "online_masked_nan": "masked", "zero_row_is_padding": ("tiny", "constant"),
          "uniform_row_shortcut": "constant", "clamps_logits": ("mixed", "large")}
GOOD = ("good", "good_online", "good_serial")
NEEDS_SANITIZER = {"oob_write": "memcheck", "race": "racecheck"}


def planted(name: str) -> Variant:
    path = PLANTED / f"{name}.cu"
    if name == "race":
        space, launch = Space((("THREADS", (256,)),)), {"grid": ["R"], "block": ["THREADS"]}
    else:
        space = Space((("ROWS", (4,)),))
        launch = {"grid": ["ceil_div(R, ROWS)"], "block": [32, "ROWS"]}
    return Variant(name, "softmax", "cuda", "cuda", "planted", source=path.read_text(),
                   source_name=path.name, space=space,
                   launch={**launch, "args": ["x", "out", "R", "C"]})


def _config(name: str) -> dict:
    return {"THREADS": 256} if name == "race" else dict(ROWS)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    names = [*EXPECTED, *GOOD]
    verifier = Verifier(timeout_s=20, sanitize="off",
                        cache_dir=str(tmp_path_factory.mktemp("kernels")))
    jobs = [Job(planted(n), _config(n), DIMS, "float32") for n in names]
    jobs += [Job(planted(n), _config(n), DIMS, "float16") for n in GOOD]
    got = verifier.verify_many(jobs)
    return dict(zip([*names, *(f"{n}_fp16" for n in GOOD)], got))


@pytest.mark.parametrize("name", list(EXPECTED))
def test_planted_kernel_is_rejected(reports, name):
    r = reports[name]
    assert r.outcome is Outcome.REJECTED, r.verdict
    assert r.stage in EXPECTED[name], f"{r.verdict}\n{r.detail}"


@pytest.mark.parametrize("name", sorted(REGIME))
def test_regime_defect_is_found_in_its_regime(reports, name):
    want = REGIME[name] if isinstance(REGIME[name], tuple) else (REGIME[name],)
    assert any(f"{w} values" in reports[name].detail for w in want), reports[name].detail


def test_odd_size_bug_is_found_at_an_edge_shape(reports):
    assert str(DIMS) not in reports["wrong_on_odd_sizes"].detail


def test_good_kernels_accepted_after_the_bad_ones(reports):
    from adaptive.ops import get_op
    for key in (*GOOD, *(f"{n}_fp16" for n in GOOD)):
        r = reports[key]
        assert r.ok, f"{key}: {r.verdict}\n{r.detail}"
        assert r.executed and len({c.seed for c in r.checks}) >= 5
        assert {c.distribution for c in r.checks} == set(get_op("softmax").regimes)
        assert r.resources.get("registers", 0) > 0 and 0 < r.time_ms < 100


def test_asking_process_is_unharmed(reports):
    import cupy as cp
    x = cp.asarray(np.random.default_rng(0).standard_normal((64, 33), dtype=np.float32))
    e = cp.exp(x - x.max(axis=1, keepdims=True))
    y = e / e.sum(axis=1, keepdims=True)
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_allclose(cp.asnumpy(y).sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(NEEDS_SANITIZER))
def test_sanitizer_catches_what_results_cannot(name, tmp_path):
    if shutil.which("compute-sanitizer") is None:
        pytest.skip("compute-sanitizer is not installed")
    verifier = Verifier(timeout_s=60, sanitize="on", cache_dir=str(tmp_path),
                        sanitizer_tools=(NEEDS_SANITIZER[name],))
    r = verifier.verify(Job(planted(name), _config(name), {"R": 64, "C": 96}, "float32"))
    if r.ok and any("inconclusive" in v for v in r.sanitizer.values()):
        pytest.skip(f"compute-sanitizer could not run here: {r.sanitizer}")
    assert r.outcome is Outcome.REJECTED, f"{r.verdict} sanitizer={r.sanitizer}"


def test_builtin_softmax_variants_accepted_with_baseline(tmp_path):
    reg = default_registry()
    cuda = [v for v in reg.variants("softmax", "cuda")]
    if not cuda:
        pytest.skip("no cuda softmax variants registered")
    limits = {"max_threads_per_block": 1024, "max_shared_bytes": 232448, "sm_count": 132}
    dims = {"R": 1000, "C": 700}
    scope = {**dims, "dtype": "float16", "itemsize": 2}
    jobs = []
    base = None
    for v in cuda:
        fitting = [c for c in v.space.configs(limits) if v.fits(scope, c)]
        if not fitting:
            continue
        cfg = fitting[0]
        cand = make_candidate(v, cfg)
        base = base or cand
        jobs.append(Job(v, cfg, dims, "float16", baseline=base))
    reports = Verifier(timeout_s=60, sanitize="off", cache_dir=str(tmp_path)).verify_many(jobs)
    for r in reports:
        assert r.ok, f"{r.verdict}\n{r.detail}"
        assert r.baseline and r.baseline_ms < 10


# ---- the built-in CUDA variants of every op, in every value regime ----------------------------

BUILTIN = {
    "gemm": [({"M": 256, "N": 192, "K": 320}, {}, {})],
    "attention": [({"B": 1, "H": 4, "Lq": 77, "Lk": 300, "D": 64}, {"causal": True}, {}),
                  ({"B": 2, "H": 8, "Hkv": 2, "Lq": 1, "Lk": 513, "D": 128}, {}, {})],
    "spmm": [({"M": 256, "N": 64, "K": 512}, {}, {"density": 0.1}),
             ({"M": 256, "N": 64, "K": 512}, {}, {"density": 0.5, "is_2to4": 1.0})],
}


@pytest.mark.parametrize("op_name", sorted(BUILTIN))
def test_builtin_cuda_variants_pass_every_regime(op_name, tmp_path):
    """Every built-in CUDA variant (its first config that fits) in float16: accepted in all
    of the op's value regimes. A rejection here is a built-in defect the regimes expose,
    or a regime that asks more than the dtype can give; the verdict says which regime."""
    from adaptive import optional
    from adaptive.ops import get_op
    from adaptive.regen.shapes import make_inputs
    op = get_op(op_name)
    limits = {"max_threads_per_block": 1024, "max_shared_bytes": 232448, "sm_count": 132}
    jobs = []
    for dims, params, stats in BUILTIN[op_name]:
        probe = make_inputs(op, dims, "float16", 0, "normal", stats)
        full = {p.name: p.default for p in op.params} | params
        scope = op.problem(probe, full).scope()
        for v in default_registry().variants(op_name, "cuda"):
            if v.needs and optional.missing(v.needs) is not None:
                continue
            fitting = [c for c in v.space.configs(limits) if v.fits(scope, c)] or (
                [{}] if not v.space.params and v.fits(scope, {}) else [])
            if fitting:
                jobs.append(Job(v, fitting[0], dims, "float16", params=full, stats=stats))
    if not jobs:
        pytest.skip(f"no cuda {op_name} variant fits")
    reports = Verifier(timeout_s=120, sanitize="off", reps=3, timing_s=0.5,
                       cache_dir=str(tmp_path)).verify_many(jobs)
    bad = [f"{r.verdict}\n{r.detail[:800]}" for r in reports if not r.ok]
    assert not bad, "\n\n".join(bad)
    for r in reports:
        assert {c.distribution for c in r.checks} == set(op.regimes), r.verdict
