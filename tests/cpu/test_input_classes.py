"""Input classes: keys that differ only in token counts share one decision."""

import numpy as np
import pytest

import adaptive
from adaptive.ops import OPS
from adaptive.policy import First, MeasureEach
from adaptive.variants import Registry, default_registry, variant_from_dict
from adaptive.ops.base import bucket


@pytest.mark.parametrize("n,want", [(1, 1), (16, 16), (17, 20), (19, 20), (20, 23),
                                    (100, 108), (128, 128), (129, 153), (4096, 4096)])
def test_token_counts_round_up_to_a_quarter_octave(n, want):
    assert bucket(n) == want
    assert n <= bucket(n) < max(n * 2 ** 0.25 + 1, 17)


@pytest.mark.parametrize("as_given", [False, True])
def test_prompt_lengths_of_one_class_share_a_gemm_decision_in_either_layout(rng, as_given):
    """A linear's tokens are gemm's M (x @ w) or its N (w @ x^T, a weight kept [out, in]
    as given): prompts of 100..107 tokens are one class either way, decided once, and every
    product is right."""
    d = adaptive.Dispatcher(backend="host", policy=MeasureEach())
    w = rng.standard_normal((24, 40)).astype(np.float32)      # [out, in]
    for n in range(100, 108):
        x = rng.standard_normal((n, 40)).astype(np.float32)
        a, b = (w, np.ascontiguousarray(x.T)) if as_given else (x, np.ascontiguousarray(w.T))
        out = d.launch("gemm", a, b)
        ref = OPS["gemm"].reference(a, b)
        assert np.abs(out - ref).max() < 1e-4 * np.abs(ref).max(), n
    assert d.stats["decisions"] == 1 and d.stats["misses"] == 8


def test_a_decode_loop_decides_once_per_class_and_every_step_is_right(rng):
    d = adaptive.Dispatcher(backend="host", policy=MeasureEach())
    q = rng.standard_normal((1, 4, 1, 16)).astype(np.float32)
    lengths = range(100, 140)            # classes 108 and 128 (100..108, 109..128) and 153
    for lk in lengths:
        k = rng.standard_normal((1, 2, lk, 16)).astype(np.float32)
        v = rng.standard_normal((1, 2, lk, 16)).astype(np.float32)
        out = d.launch("attention", q, k, v, causal=True)
        ref = OPS["attention"].reference(q, k, v, causal=True)
        assert np.abs(out - ref).max() < 1e-5, lk
    assert d.stats["decisions"] == len({bucket(n) for n in lengths}) == 3
    assert d.stats["misses"] == len(lengths)           # each exact shape got its own plan


def test_times_within_a_class_reach_the_policy_scaled_to_the_decided_input(rng):
    d = adaptive.Dispatcher(backend="host", policy=MeasureEach())
    x = rng.standard_normal((100, 64)).astype(np.float32)
    y = rng.standard_normal((105, 64)).astype(np.float32)
    d.launch("softmax", x)
    d.launch("softmax", y)
    px, py = d.plan("softmax", x), d.plan("softmax", y)
    assert px.class_key == py.class_key and px.key != py.key
    assert px.time_scale == 1.0
    assert py.time_scale == pytest.approx(100 / 105, rel=0.02)   # a memory-bound floor


def test_a_class_choice_that_cannot_run_an_input_is_decided_again(rng):
    even = variant_from_dict({"name": "even_only", "backend": "host", "language": "python",
                              "entry": "attention_materialised",
                              "source": default_registry().get("attention",
                                                                "host_materialised").source,
                              "requires": ["Lk % 2 == 0"]}, "attention")
    fallback = default_registry().get("attention", "host_materialised")
    d = adaptive.Dispatcher(backend="host", policy=First(), registry=Registry([even, fallback]))
    q = rng.standard_normal((1, 2, 1, 8)).astype(np.float32)
    for lk in (70, 71, 72):                 # one class (65..76); 71 cannot run even_only
        k = rng.standard_normal((1, 2, lk, 8)).astype(np.float32)
        out = d.launch("attention", q, k, k)
        assert np.abs(out - OPS["attention"].reference(q, k, k)).max() < 1e-5
        want = "even_only" if lk % 2 == 0 else "host_materialised"
        assert d.plan("attention", q, k, k).candidate.variant.name == want
    assert d.stats["decisions"] == 2


def test_recent_misses_say_which_inputs_were_decided_and_which_reused_their_class(rng):
    import time
    d = adaptive.Dispatcher(backend="host", policy=MeasureEach())
    t0 = time.time()
    for rows in (100, 105, 400):           # 100 and 105 share a class; 400 is another
        d.launch("softmax", rng.standard_normal((rows, 64)).astype(np.float32))
    d.launch("softmax", rng.standard_normal((100, 64)).astype(np.float32))   # a hit
    misses = d.recent_misses()
    assert [(m["op"], m["how"]) for m in misses] == [("softmax", "decided"),
                                                     ("softmax", "class"),
                                                     ("softmax", "decided")]
    assert ["105" in m["input"] for m in misses] == [False, True, False]
    assert all(m["ms"] >= 0 and m["time_s"] >= t0 for m in misses)
    # the deciding's share: MeasureEach times every candidate when it decides (ms, not
    # zero), a class's decision reused decides nothing
    assert [m["decide_ms"] > 0 for m in misses] == [True, False, True]
    assert all(m["ms"] >= m["decide_ms"] for m in misses)
    # of the deciding, the policy's own decide (MeasureEach's timing of every candidate)
    assert [0 < m["policy_ms"] <= m["decide_ms"] for m in misses] == [True, False, True]
    # and the listing of the candidates decided among, beside it within the deciding
    assert [0 < m["listing_ms"] <= m["decide_ms"] - m["policy_ms"] for m in misses] == [
        True, False, True]
    # every miss prepares the plan that runs first (a class's too), beside the deciding
    assert all(0 < m["prepare_ms"] <= m["ms"] - m["decide_ms"] for m in misses), misses
    assert d.recent_misses(since=time.time() + 1) == []


def test_a_flood_of_class_misses_does_not_push_the_decided_ones_out_of_the_log(
        rng, monkeypatch):
    from adaptive import dispatch
    monkeypatch.setattr(dispatch, "MISS_LOG", 4)
    d = adaptive.Dispatcher(backend="host", policy=MeasureEach())
    d.launch("softmax", rng.standard_normal((100, 64)).astype(np.float32))   # decided
    for rows in range(101, 108):   # seven keys of 100's class (90.5, 107.6]: class misses
        d.launch("softmax", rng.standard_normal((rows, 64)).astype(np.float32))
    misses = d.recent_misses()
    assert [m["how"] for m in misses] == ["decided"] + ["class"] * 4
    assert "100" in misses[0]["input"]
    assert [m["time_s"] for m in misses] == sorted(m["time_s"] for m in misses)
    # the newest four class misses, not the first ones
    assert ["104" in m["input"] for m in misses[1:]] == [True, False, False, False]
    assert "107" in misses[-1]["input"]
