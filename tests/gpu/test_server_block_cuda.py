"""The example server's block on CUDA: fused glue kernels and the whole forward pass
against float64 references, on fresh random inputs with odd lengths (float32, float16)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "server"))

TOL = {"float32": dict(atol=1e-4, rtol=1e-4), "float16": dict(atol=2e-2, rtol=1e-2)}
BLOCK_TOL = {"float32": 2e-4, "float16": 2e-2}


def _fused(cp, dtype):
    import fused
    return fused.Fused(cp, fused.cuda_functions(dtype), dtype)


def _ln64(s):
    return (s - s.mean(1, keepdims=True)) / np.sqrt(s.var(1, keepdims=True) + 1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("p,d", [(37, 300), (1, 45), (129, 2048)])
def test_layernorm_kernels(cp, rng, dtype, p, d):
    f = _fused(cp, dtype)
    x = (rng.standard_normal((p, d)) * 2 + 3).astype(dtype)
    r = rng.standard_normal((p, d)).astype(dtype)
    s64 = x.astype(np.float64) + r
    _, y, _ = f.layernorm(cp.asarray(x))
    np.testing.assert_allclose(y.get(), _ln64(x.astype(np.float64)), **TOL[dtype])
    s, y, yt = f.layernorm(cp.asarray(x), cp.asarray(r), want_sum=True, want_yt=True)
    np.testing.assert_allclose(s.get(), s64, **TOL[dtype])
    np.testing.assert_allclose(y.get(), _ln64(s64), **TOL[dtype])
    np.testing.assert_allclose(yt.get(), _ln64(s64).T, **TOL[dtype])
    s, y, yt = f.layernorm(cp.asarray(x), cp.asarray(np.ascontiguousarray(r.T)),
                           r_transposed=True, want_sum=True, want_y=False, want_yt=True)
    assert y is None
    np.testing.assert_allclose(s.get(), s64, **TOL[dtype])
    np.testing.assert_allclose(yt.get(), _ln64(s64).T, **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gelu_pad_split_merge_summarise(cp, rng, dtype):
    f = _fused(cp, dtype)
    u = (rng.standard_normal((61, 333)) * 3).astype(dtype)
    g = cp.asarray(u)
    f.gelu_(g)
    u64 = u.astype(np.float64)
    want = 0.5 * u64 * (1 + np.tanh(0.7978845608 * (u64 + 0.044715 * u64 ** 3)))
    np.testing.assert_allclose(g.get(), want, **TOL[dtype])
    x32 = rng.standard_normal((19, 333)).astype(np.float32)
    padded = f.pad_cast(cp.asarray(x32), 26).get()
    np.testing.assert_array_equal(padded[:19], x32.astype(dtype))
    assert padded.shape == (26, 333) and not padded[19:].any()
    p, heads, dh = 77, 5, 24
    qkv = rng.standard_normal((p, 3 * heads * dh)).astype(dtype)
    buf = f.split_heads(cp.asarray(qkv), heads).get()
    np.testing.assert_array_equal(buf, qkv.reshape(p, 3, heads, dh).transpose(1, 2, 0, 3))
    merged = f.merge_heads(cp.asarray(buf[2:3])).get()
    np.testing.assert_array_equal(merged, buf[2].transpose(1, 0, 2).reshape(p, heads * dh))
    x = rng.standard_normal((2053, 2048)).astype(dtype)     # many blocks share the norm
    probs = rng.random((2053, 16381)).astype(dtype)
    for length in (1, 40, 2053):
        norm, token, prob = f.summarise(cp.asarray(x), cp.asarray(probs), length)
        row = probs[length - 1]
        assert norm == pytest.approx(np.linalg.norm(x[:length].astype(np.float64)), rel=1e-4)
        assert token == int(row.argmax()) and prob == float(row[token])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("dispatch,policy", [("adaptive", "learned"), ("adaptive", None),
                                             ("static", None)])
def test_block_matches_float64_reference(cp, rng, dtype, dispatch, policy):
    from block import AdaptiveBlock, BlockShape, input_activations, reference
    shape = BlockShape(d_model=256, heads=4, d_ff=768, vocab=1001, layers=2, max_seq=300,
                       pad_to=13)
    block = AdaptiveBlock(shape, dispatch=dispatch, device="cuda", dtype=dtype,
                          policy=policy)
    assert block.fused is not None
    for seq_len in (1, 27, 299):
        x = input_activations(shape, block.host_weights, seq_len=seq_len,
                              seed=int(rng.integers(2**31)))
        for _ in range(3):                    # exploring calls run other candidates
            norm, token, prob = block(x)
            ref_norm, probs = reference(shape, block.host_weights, x)
            assert norm == pytest.approx(ref_norm, rel=BLOCK_TOL[dtype])
            assert prob == pytest.approx(probs[token], rel=10 * BLOCK_TOL[dtype], abs=1e-4)
            assert probs[token] >= probs.max() * (1 - 10 * BLOCK_TOL[dtype])


def test_pending_decisions_settle_with_the_learned_policy(cp, rng):
    from block import AdaptiveBlock, BlockShape, input_activations
    shape = BlockShape(d_model=128, heads=2, d_ff=256, vocab=257, layers=2, max_seq=64,
                       pad_to=32)
    block = AdaptiveBlock(shape, device="cuda", dtype="float16", policy="learned")
    x = input_activations(shape, block.host_weights, seq_len=45, seed=int(rng.integers(99)))
    pending = [len(block.pending_decisions(x)) for _ in range(40)]
    assert pending[-1] == 0, f"keys still exploring after 40 requests: {pending}"
    assert block.dispatcher.stats["misses"] >= 7       # qkv, attention, w_o, 2 spmm, head, softmax
