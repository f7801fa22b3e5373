"""attention with a padding mask (the optional fourth array): host variants against the
float64 reference, rows that see nothing, the key and the scope, bad masks refused."""

import numpy as np
import pytest

import adaptive
from adaptive.errors import InputTypeError, InputValueError
from adaptive.ops import get_op

VARIANTS = {"host_materialised": {"threads": 1}, "host_chunked": {"threads": 1, "chunk": 64}}


def _inputs(rng, b, h, hkv, lq, lk, d=16):
    q = (rng.standard_normal((b, h, lq, d)) * 3).astype(np.float32)
    k = (rng.standard_normal((b, hkv, lk, d)) * 3).astype(np.float32)
    v = rng.standard_normal((b, hkv, lk, d)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("h,hkv,lq,lk,causal", [(4, 2, 1, 133, True), (4, 4, 6, 131, True),
                                                (6, 3, 9, 70, False), (2, 1, 70, 70, True)])
def test_masked_attention_matches_the_reference(rng, variant, h, hkv, lq, lk, causal):
    q, k, v = _inputs(rng, 3, h, hkv, lq, lk)
    pad = np.array([0, 5, lk - lq])           # left padding per batch row
    mask = np.broadcast_to(np.arange(lk) >= pad[:, None, None, None], (3, 1, lq, lk)).copy()
    mask[1, 0, :, 40:50] = False              # holes in the middle too
    op = get_op("attention")
    ref = op.reference(q, k, v, mask, causal=causal)
    d = adaptive.Dispatcher(backend="host")
    out = d.launch("attention", q, k, v, mask, causal=causal, variant=variant,
                   config=VARIANTS[variant])
    assert op.error(out, ref) < 1e-5
    additive = np.where(mask, 0.0, -np.inf).astype(np.float32)
    out = d.launch("attention", q, k, v, additive, causal=causal, variant=variant,
                   config=VARIANTS[variant])
    assert op.error(out, ref) < 1e-5
    # the mask matters: without it the result is another one
    plain = op.reference(q, k, v, causal=causal)
    assert op.error(plain, ref) > 1e-2


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_row_that_sees_nothing_is_zero_and_others_are_untouched(rng, variant):
    q, k, v = _inputs(rng, 2, 4, 2, 3, 80)
    mask = np.ones((2, 4, 3, 80), bool)       # per-head mask this time
    mask[0, 1] = False                        # batch 0, head 1: every row sees nothing
    mask[1, :, 2] = False                     # batch 1, query row 2 of every head
    out = adaptive.Dispatcher(backend="host").launch(
        "attention", q, k, v, mask, variant=variant, config=VARIANTS[variant])
    assert np.all(np.isfinite(out))
    assert not out[0, 1].any() and not out[1, :, 2].any()
    ref = get_op("attention").reference(q, k, v, mask)
    assert get_op("attention").error(out, ref) < 1e-5


def test_an_additive_mask_adds_to_the_scaled_scores(rng):
    q, k, v = _inputs(rng, 1, 2, 2, 4, 9)
    bias = rng.standard_normal((1, 2, 4, 9)).astype(np.float32)
    op = get_op("attention")
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * 0.3 + bias
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)
    got = adaptive.Dispatcher(backend="host").launch("attention", q, k, v, bias, scale=0.3)
    assert op.error(got, want) < 1e-5
    assert op.error(op.reference(q, k, v, bias, scale=0.3), want) < 1e-12


def test_the_mask_is_in_the_key_and_the_scope(rng):
    op = get_op("attention")
    q, k, v = _inputs(rng, 2, 4, 2, 1, 20)
    mask = np.ones((2, 1, 1, 20), bool)
    plain, masked = op.problem((q, k, v), {}), op.problem((q, k, v, mask), {})
    assert plain.scope()["masked"] == 0.0 and masked.scope()["masked"] == 1.0
    assert op.key((q, k, v), {}) != op.key((q, k, v, mask), {})
    assert "masked" not in op.features(plain) and op.features(masked)["masked"] == 1.0
    registry = adaptive.shared_registry()
    cuda = {v.name: v for v in registry.variants("attention", "cuda")}
    fits = {n for n, var in cuda.items() if var.fits(masked.scope(), {"HD": 16})}
    assert fits == {"sdpa_torch"}, fits         # no kernel reads masks; SDPA does
    assert "sdpa_torch" in {n for n, var in cuda.items()
                            if var.fits(op.problem((q, k, v, mask), {"causal": True})
                                        .scope(), {})}


@pytest.mark.parametrize("mask,error,match", [
    (np.ones((2, 1, 3, 19), bool), InputValueError, r"mask shape \(2, 1, 3, 19\); expected "
                                                    r"\[B or 1, 1 or H, Lq, Lk\] = \[2 or 1"),
    (np.ones((3, 1, 3, 20), bool), InputValueError, r"mask shape \(3, 1, 3, 20\)"),
    (np.ones((2, 2, 3, 20), bool), InputValueError, r"1 or 4"),
    (np.ones((2, 3, 20), bool), InputValueError, r"mask shape \(2, 3, 20\)"),
    (np.ones((2, 1, 3, 20), np.int32), InputTypeError, r"mask dtype int32; expected bool"),
    (np.ones((2, 1, 3, 20), np.float64), InputTypeError, r"or q's dtype float32"),
    (np.ones((2, 1, 20, 3), bool).transpose(0, 1, 3, 2), InputValueError, "not C-contiguous"),
    ([[1.0]], InputTypeError, "argument 'mask' must be an array"),
])
def test_bad_masks_are_refused(rng, mask, error, match):
    q, k, v = _inputs(rng, 2, 4, 2, 3, 20)
    with pytest.raises(error, match=match):
        adaptive.Dispatcher(backend="host").launch("attention", q, k, v, mask)


def test_five_arrays_are_refused(rng):
    q, k, v = _inputs(rng, 1, 2, 2, 3, 5)
    with pytest.raises(InputTypeError, match="q, k, v and an optional mask"):
        adaptive.Dispatcher(backend="host").launch("attention", q, k, v, q, q)


def test_make_inputs_gives_a_mask_every_row_can_use(rng):
    op = get_op("attention")
    dims = {"B": 4, "H": 2, "Lq": 5, "Lk": 30, "D": 8}
    q, k, v, mask = op.make_inputs(dims, "float32", rng, masked=1.0)
    assert mask.shape == (4, 1, 5, 30) and mask.dtype == np.bool_
    causal = np.arange(30)[None, :] <= np.arange(5)[:, None] + 25
    assert (mask & causal).any(axis=-1).all()
    assert len(op.make_inputs(dims, "float32", rng)) == 3
