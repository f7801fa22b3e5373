"""The cost model on replayed, synthetic measurement rows: contract, accuracy, live refits."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from adaptive.observation import Observation

sklearn = pytest.importorskip("sklearn")

from adaptive.policy.cost_model import (CostModel, LiveModel, candidate_row, held_out_accuracy,  # noqa: E402
                            training_set)


def synthetic_rows(rng, n_inputs: int) -> list[Observation]:
    """A recorded device: three candidates whose order flips with size (crossovers)."""
    rows = []
    for _ in range(n_inputs):
        m, n = (int(2 ** rng.uniform(4, 12)) for _ in range(2))
        work = m * n
        feats = {"log2_M": math.log2(m), "log2_N": math.log2(n), "itemsize": 4.0}
        floor = work * 1e-7
        true = {("small", 1): 0.01 + work * 4e-7,           # low overhead, slow rate
                ("big", 64): 0.2 + work * 1e-7,             # high overhead, fast rate
                ("big", 128): 0.25 + work * 0.8e-7 + (m < 256) * 0.5}
        for (variant, tile), t in true.items():
            noisy = t * math.exp(rng.normal(0, 0.03))
            rows.append(Observation("gemm", {"M": m, "N": n, "K": 64}, "float32", variant,
                                    {"tile": tile}, noisy, floor, feats))
    return rows


def test_fit_follows_the_sklearn_contract(rng):
    ts = training_set(synthetic_rows(rng, 30))
    model = CostModel(n_estimators=16, random_state=3)
    assert model.get_params() == {"n_estimators": 16, "min_samples_leaf": 2, "random_state": 3,
                                  "min_group_rows": 8, "offset_cap": math.log(3.0)}
    assert not hasattr(model, "ensemble_")
    with pytest.raises(sklearn.exceptions.NotFittedError):
        model.predict(ts.rows[:2])
    assert model.fit(ts.rows, ts.y) is model
    assert model.n_rows_ == len(ts) and model.n_features_in_ == len(model.feature_names_)
    clone = sklearn.base.clone(model)
    assert clone.get_params() == model.get_params() and not hasattr(clone, "ensemble_")
    mean, sigma = model.predict_dist(ts.rows[:5])
    assert mean.shape == sigma.shape == (5,) and np.all(sigma > 0)
    np.testing.assert_allclose(mean, model.predict(ts.rows[:5]), rtol=1e-5, atol=1e-5)


def test_predictions_are_scikit_learns_own_to_the_bit(rng):
    """A miss predicts from the trees' low-level predict (the ensembles' checked predict
    took ~3 ms of a miss): the same numbers as scikit-learn's, level and offsets alike, on
    rows of many inputs and on the rows of one input (the level predicted once)."""
    ts = training_set(synthetic_rows(rng, 40))
    model = CostModel(n_estimators=16, min_group_rows=3).fit(ts.rows, ts.y, groups=ts.groups)
    assert model.level_ is not None
    for rows in (ts.rows, ts.rows[:3]):
        M = model._matrix(rows)
        want = (model.ensemble_.predict(M[:, model.used_])
                + model.level_.predict(M[:, model.level_cols_]))
        np.testing.assert_array_equal(model.predict(rows), want)
        mean, _ = model.predict_dist(rows)
        np.testing.assert_allclose(mean, want, rtol=1e-12, atol=1e-12)


def test_feature_dicts_become_the_matrix_name_by_name(rng):
    """Rows in any key order, with names the model never saw (dropped) and names missing
    (0.0), give each value in its name's column: the matrix a miss builds in groups of
    one key order is the name-by-name one."""
    ts = training_set(synthetic_rows(rng, 12))
    model = CostModel(n_estimators=4).fit(ts.rows, ts.y)
    names = model.feature_names_
    rows = []
    for i, r in enumerate(ts.rows[:30]):
        items = list(r.items())
        if i % 3 == 1:
            items.reverse()
        if i % 3 == 2:
            items = items[1:] + [("never.seen", 7.5)]
        rows.append(dict(items))
    want = np.array([[float(r.get(n, 0.0)) for n in names] for r in rows])
    np.testing.assert_array_equal(model._matrix(rows), want)
    assert model._matrix([{"never.seen": 1.0}]).tolist() == [[0.0] * len(names)]


def test_bad_inputs_are_rejected_with_clear_errors(rng):
    ts = training_set(synthetic_rows(rng, 4))
    with pytest.raises(ValueError, match="NaN or Inf"):
        CostModel().fit(ts.rows, np.full(len(ts), np.nan))
    with pytest.raises(ValueError, match="rows but y has"):
        CostModel().fit(ts.rows, ts.y[:-1])
    with pytest.raises(ValueError, match="2-D array"):
        CostModel().fit(np.zeros(5), np.zeros(5))
    fitted = CostModel(n_estimators=4).fit(ts.rows, ts.y)
    with pytest.raises(ValueError, match="pass dicts"):
        fitted.predict(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="offset_cap must be > 0"):
        CostModel(offset_cap=0.0).fit(ts.rows, ts.y, groups=ts.groups)


def test_offsets_count_up_to_the_cap_from_each_inputs_best(rng):
    """The input level is its best candidate; a candidate far slower than the best counts
    as ``offset_cap`` slower, however slow (the splits go to ordering the fast ones)."""
    ts = training_set(synthetic_rows(rng, 40))
    cap = math.log(3.0)
    model = CostModel(n_estimators=16, min_group_rows=3).fit(ts.rows, ts.y, groups=ts.groups)
    assert model.offset_cap == pytest.approx(cap)
    offsets = model.ensemble_.predict(model._matrix(ts.rows)[:, model.used_])
    assert offsets.min() >= -1e-9 and offsets.max() <= cap + 1e-9
    uncapped = CostModel(n_estimators=16, min_group_rows=3, offset_cap=None).fit(
        ts.rows, ts.y, groups=ts.groups)
    assert uncapped.ensemble_.predict(uncapped._matrix(ts.rows)[:, uncapped.used_]).max() > cap


def test_failed_measurements_stay_out_of_the_fit(rng):
    rows = synthetic_rows(rng, 3)
    rows.append(Observation("gemm", {"M": 1}, "float32", "big", {"tile": 64}, math.inf))
    assert len(training_set(rows)) == len(rows) - 1


def test_held_out_accuracy_beats_the_input_blind_baseline(rng):
    ts = training_set(synthetic_rows(rng, 120))
    acc = held_out_accuracy(ts, test_fraction=0.3, seed=1)
    assert acc.keys == 36
    assert acc.spearman > acc.baseline_spearman + 0.1
    assert acc.top1 > acc.baseline_top1 and acc.top1 >= 0.75
    assert acc.top3 == 1.0          # three candidates: a sanity check of the bookkeeping
    assert "held-out inputs" in str(acc)


def test_rows_name_variant_config_resources_and_device():
    row = candidate_row({"log2_M": 5.0}, "gemm", "tiled", {"BM": 64, "layout": "nt"},
                        {"registers": 96, "note": "x"},
                        {"sm_clock_mhz": 990, "max_sm_clock_mhz": 1980})
    assert row == {"op.log2_M": 5.0, "variant=gemm/tiled": 1.0, "cfg.BM": 64.0,
                   "cfg.log2_BM": 6.0, "cfg.layout=nt": 1.0, "res.registers": 96.0,
                   "res.shared_bytes": 0.0, "res.spill_store_bytes": 0.0,
                   "res.spill_load_bytes": 0.0, "res.known": 1.0, "dev.known": 1.0,
                   "dev.sm_clock_ratio": 0.5, "dev.gpu_util_ratio": 0.0,
                   "dev.sm_active_ratio": 0.0, "dev.mem_used_ratio": 0.0,
                   "dev.other_processes": 0.0, "dev.throttled": 0.0}


def test_background_refit_swaps_whole_models(rng):
    """A reader predicting while refits swap models always sees a whole model, and sees
    each new one. The reader keeps the models it saw (an ``id`` alone could come back for
    a later model once an earlier one is freed), and the writer waits, bounded, until the
    reader has predicted with each generation, so the check holds on a loaded host."""
    ts = training_set(synthetic_rows(rng, 40))
    live = LiveModel(refit_every=8, make=lambda: CostModel(n_estimators=8))
    assert live.predict_dist(ts.rows[:3]) is None
    errors, seen = [], []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                model = live.model
                out = live.predict_dist(ts.rows[:3])
                if out is not None:
                    assert out[0].shape == (3,) and out[1].shape == (3,)
                    if model is not None and not any(m is model for m in seen):
                        seen.append(model)
            except Exception as exc:  # noqa: BLE001 (the test reports it)
                errors.append(exc)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        for i in range(0, 64, 8):
            live.add(ts.rows[i:i + 8], ts.y[i:i + 8])
            assert live.wait()
            deadline = time.monotonic() + 10.0
            while not any(m is live.model for m in seen) and time.monotonic() < deadline:
                time.sleep(0.001)
    finally:
        stop.set()
        t.join()
    assert not errors
    assert live.generation >= 2
    assert len(seen) >= 2 and any(m is live.model for m in seen)
    assert live.model.n_rows_ == 64


def test_a_dispatcher_settles_when_its_models_background_refit_has_ended(rng):
    """``Dispatcher.settle`` waits for the learned policy's background refit (a server's
    warm-up ends with it, so no fit shares the interpreter with its first requests); a
    refit still running at the timeout is False; a policy without a model is settled."""
    from adaptive import Dispatcher
    from adaptive.policy import Learned
    go = threading.Event()

    class Slow(CostModel):
        def fit(self, *args, **kwargs):
            go.wait(10)
            return super().fit(*args, **kwargs)
    ts = training_set(synthetic_rows(rng, 16))
    live = LiveModel(refit_every=8, make=lambda: Slow(n_estimators=4))
    d = Dispatcher("host", policy=Learned(live))
    live.add(ts.rows[:8], ts.y[:8])                   # a refit starts, and blocks
    assert d.settle(timeout_s=0.05) is False and live.generation == 0
    go.set()
    assert d.settle() is True and live.generation == 1
    assert Dispatcher("host", policy="measure-each").settle(timeout_s=0.0) is True


def test_geometry_features_follow_the_manifest_grid_and_the_sm_count():
    from adaptive.policy.features import geometry, row_geometry
    from adaptive.variants import default_registry
    reg = default_registry()
    tc = reg.get("gemm", "tc_mma")
    cfg = {"BM": 64, "BN": 128, "WARPS_M": 2, "WARPS_N": 2}
    cfg = next(c for c in tc.space.all_configs() if all(c.get(k) == v for k, v in cfg.items()))
    limits = {"sm_count": 132, "max_shared_bytes": 232448, "max_threads_per_block": 1024}
    g = geometry(tc, cfg, {"M": 1000, "N": 1000, "K": 64, "itemsize": 2}, limits)
    ctas = math.ceil(1000 / 64) * math.ceil(1000 / 128)              # 16 x 8 = 128 CTAs
    assert g["geo.log2_ctas"] == pytest.approx(math.log2(ctas))
    assert g["geo.log2_waves"] == pytest.approx(math.log2(ctas / 132))
    assert g["geo.tail"] == pytest.approx(ctas / 132)                 # one partial wave
    assert g["geo.log2_threads"] == pytest.approx(math.log2(128))
    assert "geo.log2_flops_per_thread" not in g                      # no input features
    assert geometry(reg.get("gemm", "cublas"), {}, {"M": 8, "N": 8, "K": 8}, limits) == {}
    assert geometry(tc, cfg, {"M": 8, "N": 8, "K": 8}, {}) == {}      # no device: none
    row = Observation("gemm", {"M": 1000, "N": 1000, "K": 64}, "float16", "tc_mma", cfg,
                      0.1, 0.01, {})
    assert row_geometry(tc, row, limits) == g
    # the work per CTA and per launched thread: 2*M*N*K flops over 128 CTAs x 128 threads
    feats = {"log2_flops": math.log2(2 * 1000 * 1000 * 64), "log2_bytes": 21.5}
    per = geometry(tc, cfg, {"M": 1000, "N": 1000, "K": 64, "itemsize": 2}, limits, feats)
    assert per["geo.log2_flops_per_thread"] == pytest.approx(
        math.log2(2 * 1000 * 1000 * 64 / (ctas * 128)))
    assert per["geo.log2_flops_per_cta"] == pytest.approx(
        math.log2(2 * 1000 * 1000 * 64 / ctas))
    assert {k: v for k, v in per.items()
            if k not in ("geo.log2_flops_per_thread", "geo.log2_flops_per_cta")} == g
    row = Observation("gemm", {"M": 1000, "N": 1000, "K": 64}, "float16", "tc_mma", cfg,
                      0.1, 0.01, feats)
    assert row_geometry(tc, row, limits) == per
    r = candidate_row({"log2_M": 10.0}, "gemm", "tc_mma", cfg, geometry=g)
    assert r["geo.tail"] == g["geo.tail"] and r["op.log2_M"] == 10.0


def test_spmm_candidates_carry_the_used_share_of_their_last_tiles():
    """An op with ``tile_fill`` (spmm) gives its kernels ``geo.tile_fill``: the product over
    its ``ceil_div(extent, tile)`` grid dimensions of the last tile's used share.
    ``csr_rowsplit`` at N=8 with LANES_N x VEC = 16 leaves half its tile idle; N=8 with 4 x 2
    fills it; a nested ``ceil_div`` reads its inner extent; a grid dimension that is a
    product of two calls is not read; other ops' candidates carry none."""
    from adaptive.policy.features import _tile_exprs, geometry
    from adaptive.variants import default_registry
    reg = default_registry()
    limits = {"sm_count": 132, "max_shared_bytes": 232448, "max_threads_per_block": 1024}
    csr = reg.get("spmm", "csr_rowsplit")
    scope = {"M": 2050, "N": 8, "K": 1024, "itemsize": 2}
    wide = geometry(csr, {"VEC": 4, "LANES_N": 4, "WARPS": 4}, scope, limits)
    assert wide["geo.tile_fill"] == pytest.approx((2050 / 2052) * (8 / 16))
    exact = geometry(csr, {"VEC": 2, "LANES_N": 4, "WARPS": 4}, {**scope, "M": 2048}, limits)
    assert exact["geo.tile_fill"] == 1.0
    rows = reg.get("spmm", "bsr32_rows_mma")       # ceil_div(ceil_div(M, 32), RPC)
    cfg = next(c for c in rows.space.all_configs() if c.get("RPC") == 2 and c["TN"] == 128)
    g = geometry(rows, cfg, {"M": 96, "N": 200, "K": 64, "itemsize": 2}, limits)
    assert g["geo.tile_fill"] == pytest.approx((200 / 256) * (3 / 4))
    split = reg.get("attention", "splitkv2_mma")
    assert len(_tile_exprs(split)) == 0            # a product of two ceil_divs, then B*Hkv
    tc = reg.get("gemm", "tc_mma")
    cfg = next(iter(tc.space.all_configs()))
    assert "geo.tile_fill" not in geometry(tc, cfg, {"M": 100, "N": 100, "K": 64,
                                                     "itemsize": 2}, limits)


@pytest.mark.parametrize("op, dims", [("gemm", {"M": 1000, "N": 333, "K": 64}),
                                      ("softmax", {"R": 4099, "C": 1500}),
                                      ("attention", {"B": 3, "H": 8, "Hkv": 2, "Lq": 1,
                                                     "Lk": 5000, "D": 128})])
def test_a_misss_geometries_are_each_candidates_own(op, dims):
    """A miss computes every candidate's geometry in one call, sharing the values of
    expressions over the candidates (``ceil_div(M, BM)`` for every BM); each must still be
    what the candidate alone gives, over every CUDA variant's configs."""
    from adaptive.policy.features import geometries, geometry
    from adaptive.variants import default_registry
    limits = {"sm_count": 132, "max_shared_bytes": 232448, "max_threads_per_block": 1024}
    scope = {**dims, "itemsize": 2, "dtype": "float16", "causal": False}
    pairs = [(v, c) for v in default_registry().variants(op, "cuda")
             for c in v.space.all_configs()]
    together = geometries(pairs, scope, limits)
    alone = [geometry(v, c, scope, limits) for v, c in pairs]
    assert together == alone
    shapes = {(g["geo.log2_ctas"], g["geo.log2_threads"]) for g in together if g}
    assert len(shapes) >= 4, shapes    # the configs launch differently: a real comparison
