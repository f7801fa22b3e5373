"""A new user's first calls on the GPU: policies by name, bad inputs refused before any
variant runs, the explain command, roofline figures within the measured ceiling."""

from __future__ import annotations

import numpy as np
import pytest

import adaptive
from adaptive import InputTypeError, InputValueError

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("policy", ["learned", "measure-each"])
def test_policy_by_name_on_cuda(cp, rng, policy):
    d = adaptive.Dispatcher("cuda", policy=policy)
    a = rng.standard_normal((65, 33)).astype(np.float32)
    b = rng.standard_normal((33, 17)).astype(np.float32)
    got = d.launch("gemm", cp.asarray(a), cp.asarray(b))
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(got.get(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_bad_inputs_are_refused_on_cuda(cp, rng):
    d = adaptive.Dispatcher("cuda", policy="measure-each")
    x = cp.asarray(rng.standard_normal((16, 16)).astype(np.float16))
    w = adaptive.SparseWeight(cp.where(x > 1, x, 0))
    with pytest.raises(InputTypeError, match="gemm: argument 'a' must be a dense array"):
        d.launch("gemm", w, x)
    with pytest.raises(InputTypeError, match="softmax: argument 'x' must be a dense array"):
        d.candidates("softmax", w)
    q = cp.asarray(rng.standard_normal((1, 2, 4, 64)).astype(np.float16))
    with pytest.raises(InputValueError, match="'scale' must be a finite number"):
        d.launch("attention", q, q, q, scale=float("nan"))
    with pytest.raises(InputTypeError, match=r"'scale' must be a scalar float or int, got "
                                             r"ndarray of shape \(\)"):
        d.launch("attention", q, q, q, scale=cp.asarray(0.5).get())
    with pytest.raises(InputTypeError, match="config must be a mapping"):
        d.launch("gemm", x, x, variant="cublas", config=[("x", 1)])


def test_zero_and_negative_scale_on_cuda_match_the_formula(cp, rng):
    d = adaptive.Dispatcher("cuda", policy="measure-each")
    q, k, v = (rng.standard_normal((1, 2, 5, 64)).astype(np.float32) for _ in range(3))
    for scale in (0.0, -0.3):
        want = adaptive.OPS["attention"].reference(q, k, v, causal=True, scale=scale)
        got = d.launch("attention", *(cp.asarray(t) for t in (q, k, v)), causal=True,
                       scale=scale)
        np.testing.assert_allclose(got.get(), want, rtol=2e-3, atol=2e-3)


def test_explain_command_on_cuda(capsys):
    from adaptive.cli import main
    assert main(["explain", "softmax", "--shape", "R=300,C=1000", "--backend", "cuda",
                 "--policy", "measure-each"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("softmax R=300, C=1000 float32: committed (policy measure-each)")
    assert " chosen" in text


def test_measured_times_never_beat_the_floor_after_a_pack_build(tmp_path, capsys):
    """Every row of a small cuda pack is at or above its own floor (the peaks are raised
    where a run beat them). The peaks before and after are said as a warning, to see how
    far L2-resident repeats lift the copy bandwidth."""
    import json
    import warnings

    from adaptive import config
    from adaptive.backends import get_backend
    from adaptive.cli import main
    from adaptive.packs.format import read_pack
    from adaptive.peaks import peaks_path
    be = get_backend("cuda")
    before = dict(be.peaks(), flops_per_s=dict(be.peaks()["flops_per_s"]))
    out = tmp_path / "p.msgpack"
    assert main(["pack", "build", "--shapes", "quick", "--ops", "softmax,gemm", "--backend",
                 "cuda", "--repeats", "3", "--no-progress", "-o", str(out)]) == 0
    rows = read_pack(out).rows
    assert rows and all(r.floor_ms <= r.time_ms * (1 + 1e-9) for r in rows), \
        [(r.dims, r.variant, r.floor_ms, r.time_ms) for r in rows if r.floor_ms > r.time_ms]
    assert "file sha256" in capsys.readouterr().out
    after = json.loads(peaks_path(be.fingerprint(), config.get().cache_dir).read_text())
    warnings.warn(f"H200 peaks before the build {before}; after {after['peaks']}")
