"""Grouped-query attention: k and v with fewer heads than q, on the host backend."""

import numpy as np
import pytest

import adaptive
from adaptive.errors import InputValueError
from adaptive.ops import get_op


def _ref_by_repeat(q, k, v, causal):
    """The float64 reference with k and v repeated explicitly (what GQA must equal)."""
    group = q.shape[1] // k.shape[1]
    op = get_op("attention")
    return op.reference(q, np.repeat(k, group, 1), np.repeat(v, group, 1), causal=causal)


@pytest.mark.parametrize("variant", ["host_materialised", "host_chunked"])
@pytest.mark.parametrize("h,hkv,lq,lk,causal", [(8, 2, 1, 37, True), (6, 3, 5, 19, True),
                                                (4, 1, 7, 7, False), (4, 4, 3, 11, True)])
def test_grouped_heads_match_repeated_kv(variant, h, hkv, lq, lk, causal):
    if variant == "host_chunked":
        lk += 70   # chunks of 64 keys, the last one partial
    rng = np.random.default_rng(h * 100 + lk)
    q = rng.standard_normal((2, h, lq, 16)).astype(np.float32) * 3
    k = rng.standard_normal((2, hkv, lk, 16)).astype(np.float32) * 3
    v = rng.standard_normal((2, hkv, lk, 16)).astype(np.float32)
    d = adaptive.Dispatcher(backend="host")
    config = {"threads": 1} if variant == "host_materialised" else {"threads": 1, "chunk": 64}
    out = d.launch("attention", q, k, v, causal=causal, variant=variant, config=config)
    ref = _ref_by_repeat(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                         causal)
    assert out.shape == (2, h, lq, 16)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_head_counts_that_do_not_divide_are_refused():
    q = np.ones((1, 6, 2, 8), np.float32)
    k = np.ones((1, 4, 3, 8), np.float32)
    with pytest.raises(InputValueError, match=r"H=6 .*Hkv=4"):
        adaptive.Dispatcher(backend="host").launch("attention", q, k, k)


def test_grouping_is_a_feature_and_counts_kv_bytes_once():
    op = get_op("attention")
    q = np.ones((1, 8, 1, 64), np.float16)
    kv = np.ones((1, 2, 1024, 64), np.float16)
    p = op.problem((q, kv, kv), {"causal": True, "scale": None})
    feats = op.features(p)
    assert feats["log2_group"] == 2.0 and "log2_Hkv" not in feats
    _, nbytes = op.roofline(p)
    assert nbytes == (2 * 8 * 1 + 2 * 2 * 1024) * 64 * 2
    full = np.ones((1, 8, 1024, 64), np.float16)
    mha = op.problem((q, full, full), {"causal": True, "scale": None})
    assert "log2_group" not in op.features(mha)
