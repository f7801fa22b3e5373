"""Replaying the learned policy on the shipped H200 pack's measurements (no GPU needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

import replay_background  # noqa: E402
from replay_background import BACKGROUND  # noqa: E402, F401 (the replays, in the background)

from adaptive import cli  # noqa: E402
from adaptive.bench.replay import fold_of  # noqa: E402
from adaptive.policy.learned import FAR_REFINE  # noqa: E402

H200 = replay_background.h200_pack()
pytestmark = pytest.mark.skipif(H200 is None, reason="no shipped H200 pack in this checkout")


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory, shipped_pack_contents):
    """The shipped pack's attention and softmax rows (their variants, no cubins) as a pack
    of their own: a replay fits its model on every row of a pack, and these tests are
    about the replay's bookkeeping, not the whole pack's model (test_replay_corpus.py
    checks the model on the corpus)."""
    from pathlib import Path
    return replay_background.write_small_pack(
        shipped_pack_contents[Path(H200).name],
        tmp_path_factory.mktemp("pack") / "h200-attention-softmax.msgpack")


@pytest.fixture(scope="module")
def attention(background):
    """Two folds: every input is held out once, two fits (one a fold) instead of one an
    input; the dealing itself is checked by test_folds_hold_out_every_input_once. The
    replays of ``replay_setups(<small_pack's twin>, (False, True), ops=["attention"],
    folds=2)``, run by the background job on a pack written as ``small_pack`` is."""
    without, with_ = replay_background.reports(background, "small-attention")
    return {True: with_, False: without}


def test_folds_hold_out_every_input_once():
    keys = [("attention", (("Lk", n),)) for n in (7, 3, 11, 5, 2, 13, 17)]
    own = fold_of(keys, 0)                                  # 0: each input its own fold
    assert own == {k: i for i, k in enumerate(sorted(keys))}
    assert fold_of(keys, len(keys)) == fold_of(keys, 99) == own
    three = fold_of(keys, 3)
    assert set(three) == set(keys) and sorted(three.values()) == [0, 0, 0, 1, 1, 2, 2]
    assert three == fold_of(keys[::-1], 3)                  # seeded: not the caller's order
    assert fold_of(keys, 3, seed=1) != three


def test_the_fold_seed_deals_the_folds_and_the_report_names_it(small_pack, monkeypatch):
    import adaptive.bench.replay as replay
    from adaptive.bench.replay import Case, ReplayReport
    dealt = []

    class Dealt(Exception):
        pass

    def fold_of(keys, folds, seed=0):
        dealt.append((folds, seed))
        raise Dealt
    monkeypatch.setattr(replay, "fold_of", fold_of)
    with pytest.raises(Dealt):
        replay.replay_setups(small_pack, (True,), ops=["attention"], folds=4, fold_seed=5)
    assert dealt == [(4, 5)]
    case = Case("gemm", "float16", {"M": 1}, 3, 2, "a", "a", 1.0)
    assert "10 folds by input, dealt with seed 5" in str(ReplayReport("p", "learned", (case,),
                                                                       10, 5))
    assert "(10 folds by input)" in str(ReplayReport("p", "learned", (case,), 10, 0))


def test_every_held_out_input_is_priced_from_its_own_measurements(attention, small_pack):
    from adaptive.packs.format import read_pack
    inputs = {(tuple(sorted(r.dims.items())), r.dtype, tuple(sorted(r.features.items())))
              for r in read_pack(small_pack).rows if r.op == "attention"}
    cases = [{(c.op, tuple(sorted(c.dims.items()))) for c in r.cases} for r in attention.values()]
    assert cases[0] == cases[1] and len(cases[0]) >= len(inputs) // 2 > 1   # both price the same
    for report in attention.values():
        assert report.folds == 2 and "2 folds by input" in str(report)
        for c in report.cases:   # max_explore, and a refinement's past it (far inputs')
            assert c.op == "attention" and c.ratio >= 1.0 and 1 <= c.explored <= 8 + FAR_REFINE
            assert c.ratio == 1.0 or c.committed != c.best     # ties: another can be 1.0


def test_anchors_land_at_least_as_close_to_the_best(background):
    """On the corpus's attention pack (the development set: 45 inputs measured on the
    H200). The shipped pack holds too few attention inputs per shape family for a
    leave-one-out replay to say much (docs/benchmarks.md, run J). The replays of
    ``replay_setups(<corpus>/h200-wide-attention.msgpack, (False, True),
    ops=["attention"], folds=10)``, run by the background job."""
    if replay_background.corpus() is None:
        pytest.skip("no ../shared/data/h200-corpus here")
    without, with_ = replay_background.reports(background, "anchors")
    assert with_.geomean_ratio() <= without.geomean_ratio()
    assert with_.geomean_ratio() <= 1.05, str(with_)


def test_cli_prints_both_set_ups(attention, monkeypatch, capsys, tmp_path):
    """On the fixture's reports: the same replay (attention, two folds), not fitted twice;
    and drawn (--plot: each held-out input's committed/best, both set-ups)."""
    import adaptive.bench.replay
    asked = []

    def replay_setups(pack, setups, ops=None, folds=10, progress=None, fold_seed=0):
        asked.append((pack, tuple(setups), ops, folds, progress, fold_seed))
        return [attention[s] for s in setups]
    monkeypatch.setattr(adaptive.bench.replay, "replay_setups", replay_setups)
    figure = tmp_path / "replay.png"
    assert cli.main(["pack", "replay", H200, "--ops", "attention", "--no-progress",
                     "--folds", "2", "--plot", str(figure)]) == 0
    assert asked == [(H200, (False, True), ["attention"], 2, None, 0)]
    out = capsys.readouterr().out
    assert "2 folds by input" in out
    assert "model picks only (no anchors)" in out and "\nlearned: committed/best" in out
    assert f"wrote {figure}" in out and figure.read_bytes()[:4] == b"\x89PNG"
    asked.clear()
    assert cli.main(["pack", "replay", H200, "--no-progress", "--fold-seed", "3"]) == 0
    assert asked == [(H200, (False, True), None, 10, None, 3)]
    asked.clear()
    assert cli.main(["pack", "replay", H200, "--plot", str(tmp_path / "replay.csv")]) == 2
    assert asked == [] and ".csv is not a supported image format" in capsys.readouterr().err


def test_a_packs_variants_decide_with_the_registered_baseline():
    """Packs written before ``baseline`` existed carry none; the replay gives each variant
    the registered one's, so it decides as a live dispatcher does."""
    import dataclasses
    from adaptive.bench.replay import _as_registered
    from adaptive.variants import shared_registry
    dense = shared_registry().get("spmm", "cublas_dense")
    old = dataclasses.replace(dense, baseline=False)       # as a pack from before stores it
    assert _as_registered(old).baseline
    csr = shared_registry().get("spmm", "csr_rowsplit")
    assert not _as_registered(csr).baseline
    gone = dataclasses.replace(dense, name="retired_dense", baseline=False)
    assert _as_registered(gone) is gone                     # not registered: as it was


def test_noisy_samples_are_seeded_per_input_and_drawn_as_asked():
    """The replay's noise: each sample the pack's time times a log-normal factor, with the
    asked share of 1.5-3x outliers, the same draws for the same input in every run."""
    import numpy as np
    from adaptive.bench.replay import _sampler
    times = {"a": 2.0}
    draw = _sampler(times, (0.05, 0.1), ("softmax", (("R", 7),)))
    again = _sampler(times, (0.05, 0.1), ("softmax", (("R", 7),)))
    other = _sampler(times, (0.05, 0.1), ("softmax", (("R", 8),)))
    got = np.array([draw("a") for _ in range(4000)])
    assert list(got[:50]) == [again("a") for _ in range(50)]
    assert list(got[:50]) != [other("a") for _ in range(50)]
    ratio = np.log(got / 2.0)
    out = ratio > np.log(1.5) - 4 * 0.05          # outliers: at least 1.5x, less the noise
    assert 0.08 < out.mean() < 0.12
    assert abs(ratio[~out].std() - 0.05) < 0.005 and abs(ratio[~out].mean()) < 0.005
    assert got.max() <= 2.0 * 3.0 * np.exp(4 * 0.05)
    assert _sampler(times, None, ())("a") == 2.0


def test_the_tuning_share_counts_every_timed_exploring_call(attention, small_pack,
                                                            monkeypatch):
    """Each explored candidate is timed at least once and the share is the timed calls over
    autotune's 4 runs a candidate (the fixture's exact replay); with noise, every timed
    call is one draw of the input's seeded sampler."""
    import adaptive.bench.replay as rp
    exact = attention[True]
    for c in exact.cases:
        assert c.samples >= c.explored >= 1 and c.candidates >= c.explored
    assert exact.tuning_share() == pytest.approx(
        sum(c.samples for c in exact.cases) / sum(4 * c.candidates for c in exact.cases))
    assert 0 < exact.tuning_share() < 1
    made, drawn = [], []

    def sampler(times, noise, key):
        made.append(noise)
        draw = real(times, noise, key)
        return lambda c: drawn.append(draw(c)) or drawn[-1]
    real = rp._sampler
    monkeypatch.setattr(rp, "_sampler", sampler)
    noisy = rp.replay(small_pack, ops=["softmax"], folds=1, held_inputs=4,
                      noise=(0.3, 0.3))
    assert len(noisy.cases) == 4 and made == [(0.3, 0.3)] * 4
    assert len(drawn) == sum(c.samples for c in noisy.cases) > 0
