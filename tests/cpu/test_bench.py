"""``adaptive bench`` runs on the host backend and its report is consistent."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

from adaptive import cli
from adaptive.bench import cli as bench


def test_mixed_report_is_consistent():
    reports = bench.run_mixed("host", quick=True, seed=3, repeats=2, calls_per_input=3,
                              ops=["softmax", "spmm"], progress=lambda s: None)
    assert [r.op for r in reports] == ["softmax", "spmm"]
    for r in reports:
        assert r.calls == 3 * r.inputs
        # the oracle is a lower bound of every fixed choice and of the adaptive choices
        assert r.oracle_ms <= r.fixed_best_ms + 1e-9
        assert r.oracle_ms <= r.adaptive_steady_ms + 1e-9
        assert math.isfinite(r.adaptive_ms) and r.adaptive_ms > 0
        assert sum(r.choices.values()) == r.inputs
    text = bench.format_mixed(reports)
    assert "softmax" in text and "adaptive-steady/oracle" in text
    # 3 calls an input are too few to time every explored candidate 3 times: said, not
    # hidden in the steady price
    spmm = reports[1]
    assert 0 < spmm.exploring <= spmm.inputs
    assert f"({spmm.exploring} of {spmm.inputs} still exploring)" in text
    assert any("inputs still exploring" in v for v in bench.mixed_verdicts(reports))


def test_the_largest_excess_names_the_choice_and_the_best_with_their_prices():
    """Per op, the input whose choice lost the stream most (calls x the table's price
    gap): its choice and the table's best with the table's ms and the live policy's own
    median where it timed them; nothing when every choice is the table's best."""
    def chose(label, observed):
        return SimpleNamespace(candidate=SimpleNamespace(label=label), observed=observed)
    stream = [({"R": 8, "C": 64}, "float32", {}), ({"R": 512, "C": 1024}, "float16", {}),
              ({"R": 3, "C": 7}, "float32", {})]
    table = [{"a": 1.0, "b": 1.5}, {"a": 2.0, "b": 2.25}, {"a": 0.5, "b": 0.25}]
    order = [0] * 10 + [1] * 30 + [2] * 7
    # input 0 loses 10 x 0.5 = 5 ms; input 1 30 x 0.25 = 7.5 ms (the largest); input 2
    # 7 x 0.25 = 1.75 ms
    chosen = [chose("b", {"b": 0.9}), chose("b", {"a": 2.5, "b": 1.75}), chose("a", {})]
    assert bench._largest_excess("softmax", stream, table, chosen, order) == (
        "mixed softmax: largest excess {'R': 512, 'C': 1024} float16: chose b table 2.2500 "
        "ms, live 1.7500 ms; best a table 2.0000 ms, live 2.5000 ms; x30 calls = 7.500 ms "
        "of the stream")
    # an input whose best the live policy never timed says so
    chosen[1] = chose("b", {"b": 1.75})
    assert "best a table 2.0000 ms, not timed live; x30" in bench._largest_excess(
        "softmax", stream, table, chosen, order)
    # every choice the table's best: no line
    best = [chose("a", {}), chose("a", {}), chose("b", {})]
    assert bench._largest_excess("softmax", stream, table, best, order) == ""
    report = bench.OpReport("softmax", 3, 47, 1.0, "a", 1.0, 1.0, 1.0, 0.0, {},
                            excess="x")
    assert bench.mixed_excesses([report, dataclasses.replace(report, excess="")]) == ["x"]


def test_a_device_tables_round_is_its_calls_back_to_back():
    """On a device, one timed run of the mixed table is BATCH launches of the candidate
    back to back (the stream's regime: one synchronise after them, not after each)."""
    launched = []

    class Spy:
        def launch(self, op, *args, variant, config):
            launched.append((op, args, variant, dict(config)))
    cand = SimpleNamespace(variant=SimpleNamespace(name="v"), config={"BM": 64})
    run = bench._batch_of(Spy(), "gemm", ("a", "b"), cand, bench.BATCH)
    assert launched == []                      # made, not run
    run()
    assert bench.BATCH > 1 and launched == [("gemm", ("a", "b"), "v", {"BM": 64})] * bench.BATCH


def test_the_finalists_alone_are_re_timed_each_input_apart():
    """The stream is priced from each input's finalists timed afresh: only they run, each
    (1 warm-up + rounds) x batch times on its own input, and a failing one is priced inf,
    not dropped (a choice that fails is the worst choice, not a missing one)."""
    launched = []

    class Spy:
        def launch(self, op, *args, variant, config):
            launched.append((args, variant))
            if variant == "broken":
                raise RuntimeError("launch failed")

    def cand(name):
        return SimpleNamespace(variant=SimpleNamespace(name=name), config={})
    listed = [{n: cand(n) for n in ("a", "b", "c")}, {n: cand(n) for n in ("a", "broken")}]
    priced = bench._retime_finalists(Spy(), "softmax", [("x",), ("y",)], listed,
                                     [{"a", "c"}, {"a", "broken"}], batch=4, sync=None,
                                     rounds=3)
    assert [sorted(p) for p in priced] == [["a", "c"], ["a", "broken"]]
    assert all(math.isfinite(v) and v >= 0 for v in (priced[0]["a"], priced[0]["c"],
                                                       priced[1]["a"]))
    assert priced[1]["broken"] == math.inf
    counts = {}
    for args, variant in launched:
        counts[(args, variant)] = counts.get((args, variant), 0) + 1
    # the failing finalist stops at its first call; "b" was not a finalist
    assert counts == {(("x",), "a"): 16, (("x",), "c"): 16, (("y",), "a"): 16,
                      (("y",), "broken"): 1}


def test_a_table_batch_that_is_not_a_count_of_calls_is_refused_before_timing():
    import pytest
    from adaptive.errors import InputValueError
    for bad in (0, -3, 2.5, True, "16"):
        with pytest.raises(InputValueError, match=r"table_batch: expected a whole number "
                           rf">= 1 of calls a timed round, got {bad!r}"):
            bench.run_mixed("host", quick=True, ops=["softmax"], table_batch=bad,
                            progress=lambda s: pytest.fail(f"timed before refusing: {s}"))


def test_a_committed_streams_tuning_is_its_exploring_calls():
    """Once every input has committed, the decisions carry no tuning of their own: the
    tuning column is the learned policy's exploring calls (before, it read 0.0 for every
    op on the H200, run S60), part of the stream's live wall time."""
    (r,) = bench.run_mixed("host", quick=True, seed=3, repeats=2, calls_per_input=40,
                           ops=["softmax"], progress=lambda s: None)
    assert r.exploring == 0
    # five inputs' exploring calls (every one timed, tens of them) take milliseconds; the
    # misses alone took 0.16 ms, what the column read before
    assert 1.0 < r.tuning_ms < r.adaptive_ms, (r.tuning_ms, r.adaptive_ms)


def test_the_stream_runs_whole_each_way_with_the_choices_it_names(monkeypatch):
    """The stream's calls are run again, whole, four ways interleaved: each input pinned
    to its fastest finalist, launch's own choices, those choices pinned, and the best
    fixed candidate pinned on every input; each way calls exactly the stream's inputs in
    its order with the candidates it names, and the walls and their printed quotients
    agree."""
    launched = {"pinned": [], "live": []}
    from adaptive.dispatch import Dispatcher
    real_launch = Dispatcher.launch

    def spy(self, op, *args, **kw):
        if "variant" in kw:
            launched["pinned"].append((id(args[0]), kw["variant"], dict(kw["config"] or {})))
        else:
            launched["live"].append(id(args[0]))
        return real_launch(self, op, *args, **kw)
    captured = {}
    real_walls = bench._stream_walls

    def walls(table_d, live, op_name, inputs, order, table, listed, best_label, sync, rounds,
              picks):
        # launch's choices as the stream ended (a key still exploring changes its own
        # during the walls): what the steady price and the pinned way take
        captured["chosen"] = [live.decision(op_name, *args).candidate.label
                              for args in inputs]
        monkeypatch.setattr(Dispatcher, "launch", spy)
        try:
            out = real_walls(table_d, live, op_name, inputs, order, table, listed,
                             best_label, sync, rounds, picks)
        finally:
            monkeypatch.setattr(Dispatcher, "launch", real_launch)
        captured.update(inputs=inputs, order=order, table=table, best=best_label, picks=picks,
                        labels={c.label: (c.variant.name, dict(c.config)) for args in inputs
                                for c in table_d.candidates(op_name, *args)})
        return out
    monkeypatch.setattr(bench, "_stream_walls", walls)
    (r,) = bench.run_mixed("host", quick=True, seed=3, repeats=2, calls_per_input=4,
                           ops=["softmax"], progress=lambda s: None, walls_too=True)
    inputs, order, table = captured["inputs"], captured["order"], captured["table"]
    rounds = 1 + 2                                  # a warm-up round, then the timed ones
    ids = [id(inputs[i][0]) for i in order]
    assert launched["live"] == ids * rounds
    oracle = [(id(inputs[i][0]), *captured["labels"][min(table[i], key=table[i].get)])
              for i in order]
    fixed = [(id(inputs[i][0]), *captured["labels"][captured["best"]]) for i in order]
    # the choices pinned are launch's committed ones
    assert captured["picks"] == captured["chosen"]
    chosen = [(id(inputs[i][0]), *captured["labels"][captured["picks"][i]]) for i in order]
    n = len(order)
    pinned = launched["pinned"]
    assert len(pinned) == 3 * n * rounds
    for k in range(rounds):                         # interleaved: oracle, chosen, fixed
        assert pinned[3 * n * k:3 * n * k + n] == oracle
        assert pinned[3 * n * k + n:3 * n * k + 2 * n] == chosen
        assert pinned[3 * n * k + 2 * n:3 * n * (k + 1)] == fixed
    w = r.walls
    assert set(w) == {"oracle", "fixed", "adaptive", "chosen"}
    assert all(v > 0 for v in w.values())
    text = bench.format_walls([r])
    row = text.splitlines()[2].split()
    assert row[0] == "softmax" and float(row[1]) == round(w["oracle"], 3)
    assert float(row[3]) == round(w["fixed"] / w["oracle"], 3)
    assert float(row[5]) == round(w["adaptive"] / w["oracle"], 3)
    assert float(row[6]) == round(w["adaptive"] / w["fixed"], 3)
    assert float(row[7]) == round(w["chosen"], 3)
    assert float(row[8]) == round(w["chosen"] / w["oracle"], 3)
    assert float(row[9]) == round(w["chosen"] / w["fixed"], 3)
    launch_line, pinned_line = bench.wall_verdicts([r])
    assert launch_line.startswith("mixed softmax (the stream's wall, through launch): "
                                  "adaptive ")
    assert pinned_line.startswith("mixed softmax (the stream's wall, its choices pinned): "
                                  "adaptive ")
    assert f"adaptive/oracle {w['chosen'] / w['oracle']:.3f} vs" in pinned_line
    assert bench.format_walls([dataclasses.replace(r, walls=None)]) == ""


def test_mixed_verdicts_tell_a_tie_from_a_win_and_a_loss():
    def report(adaptive_ms, fixed_ms):
        return bench.OpReport("gemm", 2, 60, 10.0, "host_blas", fixed_ms, 50.0, adaptive_ms,
                              0.0, {"host_blas": 2})
    verdicts = bench.mixed_verdicts([report(10.0, 10.0), report(10.0, 12.0),
                                     report(12.5, 12.0)])
    assert [v.split(": adaptive ")[1].split(" the best")[0] for v in verdicts] == [
        "MATCHED", "BEAT", "did NOT beat"]


def test_overhead_is_measured():
    o = bench.run_overhead("host", n=500, rounds=3)
    assert o["direct_us"] > 0 and o["dispatcher_launch_us"] > 0
    assert o["variant"].startswith("host_blas")


def test_cli_runs(capsys, tmp_path):
    figure = tmp_path / "mixed.svg"
    assert cli.main(["bench", "mixed", "--quick", "--backend", "host", "--ops", "softmax",
                     "--plot", str(figure)]) == 0
    out = capsys.readouterr().out
    assert "mixed workload" in out and "softmax" in out
    assert f"wrote {figure}" in out     # drawn after the table (tests/cpu/test_plots.py)
    assert figure.read_text().lstrip().startswith("<?xml") and "softmax" in figure.read_text()
    # the job ends with the verdict per op (on the host, the table's prices only: the
    # stream is run whole on a device)
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("mixed softmax: adaptive") and "best fixed choice" in last
    assert "the same stream run whole" not in out
    assert cli.main([]) == 0


def test_the_mixed_stream_starts_after_the_models_first_fit():
    import threading
    import time

    import numpy as np
    import pytest

    from adaptive.dispatch import Dispatcher
    from adaptive.policy.cost_model import LiveModel, TrainingSet
    from adaptive.policy.learned import Learned
    from adaptive.variants import Registry
    rng = np.random.default_rng(0)
    rows = [{"op.x": float(x), "cand.y": float(y)} for x, y in rng.random((400, 2))]
    base = TrainingSet(rows, rng.random(400), [("i", i // 8) for i in range(400)],
                       [f"c{i % 8}" for i in range(400)])
    live = LiveModel(base)                      # fits in a background thread
    packs = SimpleNamespace(observations=lambda: [((None,) * 400, 1.0)])   # a pack's rows
    d = SimpleNamespace(registry=packs, settle=Dispatcher("host", policy=Learned(live),
                                                          registry=Registry(())).settle)
    said = []
    bench._fitted(d, said.append)
    assert live.model is not None and live.wait(0.0)
    assert len(said) == 1 and said[0].startswith("  adaptive's policy: 400 pack rows, its ")
    gate = threading.Event()   # a first fit that never ends is an error, not a cold stream
    stuck = SimpleNamespace(registry=packs, settle=lambda timeout_s: gate.wait(0.01))
    with pytest.raises(RuntimeError, match="did not finish its first fit in 300 s"):
        bench._fitted(stuck, said.append)
    t0 = time.perf_counter()
    bench._fitted(Dispatcher("host", registry=Registry(())), said.append)
    assert time.perf_counter() - t0 < 1.0 and "no pack for this device" in said[-1]
