"""Bounded state in a long-running process: the plan cache keeps its bound (sampled keys
survive the clock), evictions are counted and exported, prepared and pinned plans are
bounded too; and bad arguments (NumPy subclasses with other semantics, non-arrays,
unhashable parameters) are refused naming the op and the argument."""

from __future__ import annotations

import numpy as np
import pytest

import adaptive
from adaptive import arrays, config
from adaptive.dispatch import Dispatcher
from adaptive.errors import InputTypeError
from adaptive.policy import MeasureEach


def _softmax64(x):
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _dispatcher(size: int, sample_every: int = 0) -> Dispatcher:
    with config.override(plan_cache_size=size, sample_every=sample_every):
        return Dispatcher("host", policy=MeasureEach())


def test_plan_cache_stays_at_its_bound_and_counts_evictions(rng):
    d = _dispatcher(8)
    shapes = [(3, c) for c in range(5, 45)]          # 40 distinct keys
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32) * 30   # large logits
        np.testing.assert_allclose(d.launch("softmax", x), _softmax64(x), rtol=1e-5, atol=1e-7)
        assert len(d._plans) <= 8
    assert len(d._plans) == 8 and d.stats["misses"] == 40
    assert d.stats["plan_evictions"] == 32
    assert len(d._prepared) <= 4 * 8
    # an evicted key decides again and is still right
    x = rng.standard_normal(shapes[0]).astype(np.float32)
    np.testing.assert_allclose(d.launch("softmax", x), _softmax64(x), rtol=1e-5, atol=1e-7)
    assert d.stats["misses"] == 41


def test_sampled_hot_key_survives_a_stream_of_new_shapes(rng):
    d = _dispatcher(4, sample_every=1)
    hot = rng.standard_normal((7, 33)).astype(np.float32)
    for c in range(5, 35):                              # 30 cold keys, hot in between
        d.launch("softmax", rng.standard_normal((2, c)).astype(np.float32))
        np.testing.assert_allclose(d.launch("softmax", hot), _softmax64(hot), rtol=1e-5,
                                   atol=1e-7)
    assert d.stats["misses"] == 31, "the hot key was evicted and decided again"
    assert len(d._plans) == 4 and d.stats["plan_evictions"] == 27
    assert len(d._referenced) <= 4 + 1     # the bound, and the key sampled since


def test_pinned_plans_are_bounded(rng):
    d = _dispatcher(4)
    for c in range(5, 17):
        x = rng.standard_normal((2, c)).astype(np.float32)
        np.testing.assert_allclose(d.launch("softmax", x, variant="host_numpy"), _softmax64(x),
                                   rtol=1e-5, atol=1e-7)
    assert len(d._pinned) == 4 and d.stats["plan_evictions"] == 8


def test_plan_cache_size_comes_from_the_environment():
    assert config.from_env({"ADAPTIVE_PLAN_CACHE_SIZE": "123"}).plan_cache_size == 123
    assert config.Config().plan_cache_size == 4096
    with pytest.raises(ValueError, match="ADAPTIVE_PLAN_CACHE_SIZE"):
        config.from_env({"ADAPTIVE_PLAN_CACHE_SIZE": "many"})


def test_evictions_are_exported_as_a_metric(rng):
    pytest.importorskip("prometheus_client")
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    server = adaptive.serve_metrics(0, nvml=False)
    try:
        def scrape() -> float:
            text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics",
                                          timeout=10).read().decode()
            return sum(s.value for f in text_string_to_metric_families(text)
                       for s in f.samples if s.name == "adaptive_plan_cache_evictions_total"
                       and s.labels == {"backend": "host"})
        before = scrape()
        d = _dispatcher(2)
        for c in range(5, 10):
            d.launch("softmax", rng.standard_normal((2, c)).astype(np.float32))
        assert d.stats["plan_evictions"] == 3 and scrape() == before + 3
    finally:
        server.close()


def test_signer_table_is_bounded():
    made = [type(f"Arr{i}", (), {"__cuda_array_interface__": {}}) for i in range(5)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(arrays, "MAX_SIGNER_TYPES", len(arrays.SIGNERS))
        for tp in made:
            arrays.SIGNERS[tp]
        assert not any(tp in arrays.SIGNERS for tp in made)


# ---- bad arguments name the op and the argument -----------------------------------------------

def test_masked_array_is_refused_not_read_as_plain(rng):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    masked = np.ma.masked_array(x, mask=x > 0)
    with pytest.raises(InputTypeError, match=r"softmax: argument 'x'.*MaskedArray.*filled"):
        adaptive.launch("softmax", masked)
    with pytest.raises(InputTypeError, match=r"gemm: argument 'b'.*MaskedArray"):
        adaptive.launch("gemm", x.T.copy(), np.ma.masked_array(x))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")   # np.matrix itself
def test_matrix_is_refused_and_memmap_is_taken(rng, tmp_path):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    with pytest.raises(InputTypeError, match=r"softmax: argument 'x'.*numpy.matrix"):
        adaptive.launch("softmax", np.matrix(x))
    mm = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="w+", shape=x.shape)
    mm[:] = x
    np.testing.assert_allclose(_dispatcher(8).launch("softmax", mm), _softmax64(x), rtol=1e-5,
                               atol=1e-7)


def test_non_array_last_argument_names_op_and_argument(rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    with pytest.raises(InputTypeError, match=r"gemm: argument 'b' must be an array.*object"):
        adaptive.launch("gemm", a, object())
    with pytest.raises(InputTypeError, match=r"gemm: argument 'a' must be an array"):
        _dispatcher(8).launch("gemm", object(), a)


def test_unhashable_parameter_names_op_and_parameter(rng):
    q = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    with pytest.raises(InputTypeError, match=r"attention: parameter 'scale' must be .*list"):
        _dispatcher(8).launch("attention", q, q, q, scale=[1.0])
    with pytest.raises(InputTypeError, match=r"config rows for 'host_blocked' must be one of"):
        _dispatcher(8).launch("softmax", q[0, 0], variant="host_blocked", config={"rows": [1]})


def test_bad_out_names_op(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(adaptive.InputValueError, match=r"softmax: out has shape \(3, 5\)"):
        _dispatcher(8).launch("softmax", x, out=np.empty((3, 5), np.float32))
    with pytest.raises(InputTypeError, match=r"softmax: out must be an array"):
        _dispatcher(8).launch("softmax", x, out=[1.0])


def test_policy_is_told_of_evicted_keys(rng):
    class Forgetful(MeasureEach):
        def __init__(self):
            super().__init__()
            self.forgotten = []

        def forget_key(self, key):
            self.forgotten.append(key)
    with config.override(plan_cache_size=3, sample_every=0):
        d = Dispatcher("host", policy=Forgetful())
    xs = [rng.standard_normal((2, c)).astype(np.float32) for c in range(5, 10)]
    for x in xs:
        d.launch("softmax", x)
    # the policy keeps state per input class: it is told of a class once its last key goes
    assert len(d.policy.forgotten) == 2
    assert {dict(k[1])["C"] for k in d.policy.forgotten} == {5, 6}
    assert not set(d.policy.forgotten) & {p.class_key for p in d._plans.values()}


def test_soak_quick_keeps_the_bound_and_right_results():
    import benchmarks.soak as soak
    r = soak.soak(launches=6_000, shapes=300, plan_cache_size=32, policy="measure-each",
                  progress=None)
    assert r["plans_at_bound"] and r["wrong_checks"] == 0
    last = r["rows"][-1]
    assert last["distinct"] == 308 and last["evictions"] >= 300 - 32
    assert last["prepared"] <= 4 * 32


def test_the_learned_policy_forgets_the_classes_the_plan_cache_evicts(rng):
    from adaptive.policy.learned import Learned
    from adaptive.policy.cost_model import LiveModel
    with config.override(plan_cache_size=3, sample_every=0):
        d = Dispatcher("host", policy=Learned(LiveModel(background=False)))
    for c in range(5, 13):
        d.launch("softmax", rng.standard_normal((2, c)).astype(np.float32))
    assert len(d._plans) <= 3
    assert set(d.policy.keys) <= {p.class_key for p in d._plans.values()}


def test_neighbours_keep_at_most_their_bound_of_measured_inputs(monkeypatch):
    from adaptive.policy.learned import Neighbours
    monkeypatch.setattr(Neighbours, "MAX_INPUTS", 8)
    n = Neighbours()
    for i in range(20):
        n.add("softmax", "float32", {"log2_R": float(i), "log2_C": 5.0}, "v", (), 1.0 + i)
    assert len(n) == 8 and n.evicted == 12
    # the newest stay: the nearest to R=2**19 is the last one added
    assert n.fastest_near("softmax", "float32", {"log2_R": 19.0, "log2_C": 5.0})[0][1] == 0.0
