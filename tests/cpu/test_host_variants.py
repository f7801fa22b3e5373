"""Every host candidate matches the float64 reference on fresh random inputs, odd and tiny
shapes included, within the op's tolerance; outputs are poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

import adaptive
from adaptive.ops import OPS

SHAPES = {
    "gemm": [{"M": 1, "N": 1, "K": 1}, {"M": 7, "N": 13, "K": 5}, {"M": 65, "N": 33, "K": 129},
             {"M": 1, "N": 300, "K": 97}],
    "softmax": [{"R": 1, "C": 1}, {"R": 3, "C": 1001}, {"R": 257, "C": 31}],
    "rmsnorm": [{"R": 1, "C": 1}, {"R": 3, "C": 1001}, {"R": 257, "C": 31}],
    "attention": [{"B": 1, "H": 1, "Lq": 1, "Lk": 1, "D": 8},
                  {"B": 2, "H": 3, "Lq": 17, "Lk": 17, "D": 16},
                  {"B": 1, "H": 2, "Lq": 1, "Lk": 301, "D": 32},
                  {"B": 1, "H": 1, "Lq": 70, "Lk": 1100, "D": 24}],
    "spmm": [{"M": 1, "N": 1, "K": 1}, {"M": 37, "N": 5, "K": 71}, {"M": 130, "N": 17, "K": 67}],
}
DTYPES = {"gemm": ("float32", "float16"), "softmax": ("float32", "float16"),
          "attention": ("float32", "float16"), "spmm": ("float32", "float16"),
          "rmsnorm": ("float32", "float16")}


def _cases():
    for op, shapes in SHAPES.items():
        for dims in shapes:
            for dtype in DTYPES[op]:
                extras = [{}]
                if op == "attention":
                    extras = [{"causal": False}, {"causal": True}]
                if op == "spmm":
                    extras = [{"density": 0.3, "block": 0}, {"density": 0.2, "block": 16}]
                if op == "rmsnorm":
                    extras = [{"eps": 1e-5}, {"eps": 0.5}]   # eps honoured, not assumed
                for extra in extras:
                    tag = ",".join(f"{k}={v}" for k, v in {**dims, **extra}.items())
                    yield pytest.param(op, dims, dtype, extra, id=f"{op}-{dtype}-{tag}")


@pytest.fixture(scope="module")
def host():
    return adaptive.Dispatcher(backend="host")


@pytest.mark.parametrize("op_name,dims,dtype,extra", list(_cases()))
def test_every_candidate_matches_reference(host, rng, op_name, dims, dtype, extra):
    op = OPS[op_name]
    params = {k: v for k, v in extra.items() if k in ("causal", "eps")}
    stats = {k: v for k, v in extra.items() if k not in ("causal", "eps")}
    args = op.make_inputs(dims, dtype, rng, **stats)
    ref = op.reference(*args, **params)
    assert np.abs(ref).max() > 0, "reference must not be trivially zero"
    cands = host.candidates(op_name, *args, **params)
    assert cands, "every op has at least one host candidate"
    for cand in cands:
        out = np.full(op.out_shape(op.problem(args, params)), np.nan, dtype=args[-1].dtype)
        result = host.launch(op_name, *args, out=out, variant=cand.variant.name,
                             config=cand.config, **params)
        assert result is out, f"{cand.label}: the given out must be returned"
        err = op.error(out, ref)
        assert err <= op.tolerance[dtype], f"{cand.label}: relative error {err:.2e}"


def test_error_detects_unwritten_and_nan(rng):
    op = OPS["gemm"]
    a, b = op.make_inputs({"M": 9, "N": 7, "K": 5}, "float32", rng)
    ref = op.reference(a, b)
    partial = (a @ b).copy()
    partial[-1] = np.nan
    assert op.error(partial, ref) == np.inf
    wrong = (a @ b).copy()
    wrong[0, 0] += 10.0
    assert op.error(wrong, ref) > op.tolerance["float32"]


@pytest.mark.parametrize("op_name", sorted(OPS))
def test_inputs_are_fresh_and_nonzero(rng, op_name):
    op = OPS[op_name]
    dims = SHAPES[op_name][-1]
    first = op.make_inputs(dims, "float32", rng)
    second = op.make_inputs(dims, "float32", rng)
    a, b = first[-1], second[-1]
    assert np.count_nonzero(a) > 0.9 * a.size
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("scale", [-0.2, 0.0, 0.3, None])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_library_variant_honours_any_scale(rng, scale, causal):
    """The SDPA variant's source, run on CPU tensors: negative and zero scales are mapped
    onto positive ones (SDPA returned non-finite output for them on the H200)."""
    pytest.importorskip("torch")
    import sys
    import types

    from adaptive.variants import shared_registry
    variant = shared_registry().get("attention", "sdpa_torch")
    namespace: dict = {}
    stub = {"cupy": types.ModuleType("cupy")} if "cupy" not in sys.modules else {}
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as m:   # the module uses CuPy only inside other functions
        for name, module in stub.items():
            m.setitem(sys.modules, name, module)
        exec(compile(variant.source, "library.py", "exec"), namespace)  # noqa: S102
    fn = namespace[variant.entry]
    op = OPS["attention"]
    q, k, v = op.make_inputs({"B": 1, "H": 2, "Lq": 9, "Lk": 9, "D": 16}, "float32", rng)
    out = np.full(q.shape, np.nan, np.float32)
    fn(q, k, v, out=out, causal=causal, scale=scale)
    assert op.error(out, op.reference(q, k, v, causal=causal, scale=scale)) < 1e-5


# ---- torch's own calls on CPU tensors (torch_mm, torch_sdpa) --------------------------------

def test_torch_variants_serve_tensors_only():
    """A CPU tensor caller is offered torch's own calls (what the plain program runs, the
    baseline); a NumPy caller is not (``kind == 'torch'``), and its candidates are as before."""
    torch = pytest.importorskip("torch")
    d = adaptive.Dispatcher(backend="host")
    a = np.zeros((4, 6), np.float32)
    b = np.zeros((6, 3), np.float32)
    names = {c.variant.name for c in d.candidates("gemm", a, b)}
    assert "torch_mm" not in names and "host_blas" in names
    tnames = {c.variant.name for c in d.candidates("gemm", torch.from_numpy(a),
                                                   torch.from_numpy(b))}
    assert {"torch_mm", "host_blas"} <= tnames
    q = np.zeros((1, 2, 3, 8), np.float32)
    assert "torch_sdpa" not in {c.variant.name for c in d.candidates("attention", q, q, q)}
    tq = torch.from_numpy(q)
    assert "torch_sdpa" in {c.variant.name for c in d.candidates("attention", tq, tq, tq)}


@pytest.mark.parametrize("case", ["plain", "causal", "decode", "bottom-right", "gqa",
                                  "gqa-masked", "bool-mask", "additive-mask", "neg-scale",
                                  "zero-scale", "large-logits"])
def test_torch_sdpa_matches_the_float64_reference(rng, case):
    """The host SDPA variant on CPU tensors, against the float64 reference: causal
    bottom-right with Lq < Lk (a KV cache), grouped heads with and without a mask, masks
    with fully masked rows (-inf), scales <= 0 and large logits; a poisoned ``out`` is
    overwritten."""
    torch = pytest.importorskip("torch")
    from adaptive.variants import make_candidate, shared_registry
    op = OPS["attention"]
    b, h, hkv, lq, lk, d = 2, 4, 4, 9, 9, 16
    causal, scale, mask = False, None, None
    if case in ("causal", "bottom-right", "gqa-masked"):
        causal = True
    if case == "decode":
        lq, lk, causal = 1, 37, True
    if case in ("bottom-right", "gqa-masked"):
        lq, lk = 5, 23
    if case in ("gqa", "gqa-masked"):
        hkv = 2
    q = rng.standard_normal((b, h, lq, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, lk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, lk, d)).astype(np.float32)
    if case == "large-logits":
        q *= 40.0
    if case in ("bool-mask", "additive-mask", "gqa-masked"):
        seen = rng.random((b, 1, lq, lk)) > 0.3
        seen[0, 0, 0, :] = False          # a row that sees no key
        seen[1, 0, :, 0] = True
        mask = seen if case != "additive-mask" else np.where(seen, 0.0, -np.inf).astype(
            np.float32)
        if case == "gqa-masked":
            mask = seen
    if case == "neg-scale":
        scale = -0.3
    if case == "zero-scale":
        scale = 0.0
    variant = shared_registry().get("attention", "torch_sdpa")
    assert variant.fits({"B": b, "H": h, "Hkv": hkv, "Lq": lq, "Lk": lk, "D": d,
                         "dtype": "float32", "itemsize": 4, "kind": "torch", "masked": 0}, {})
    from adaptive.backends.pysource import load_entry
    fn = load_entry(make_candidate(variant, {}).variant, variant.torch_entry)
    args = [torch.from_numpy(x) for x in (q, k, v)]
    tmask = None if mask is None else torch.from_numpy(mask)
    out = torch.full((b, h, lq, d), float("nan"))
    got = fn(*args, tmask, out=out, causal=causal, scale=scale)
    ref_args = (q, k, v) if mask is None else (q, k, v, mask)
    ref = op.reference(*ref_args, causal=causal, scale=scale)
    got = got.numpy()
    assert got is out.numpy() or np.shares_memory(got, out.numpy())   # out written
    assert np.isfinite(got).all()     # a row that sees no key is zeros, as the reference's
    assert op.error(got, ref) < 1e-4, op.error(got, ref)
