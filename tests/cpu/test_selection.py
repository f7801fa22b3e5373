"""The selection benchmark on the host backend, quick form (what CI runs)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

import pytest

pytest.importorskip("sklearn")

from adaptive.bench.selection import AUTOTUNE_RUNS  # noqa: E402

POLICIES = ("oracle", "best-fixed", "autotune", "measure-each", "learned-cold", "learned-pack")


@pytest.fixture(scope="module")
def report(quick_selection_report):
    print(quick_selection_report)
    return quick_selection_report


def test_every_stream_reports_every_policy_from_one_run(report):
    assert [s.stream for s in report.streams] == ["decode-heavy", "long-burst", "uniform-mix"]
    for s in report.streams:
        names = [r.policy for r in s.results]
        assert sorted(set(names)) == sorted(POLICIES)
        sources = {(r.policy, r.source) for r in s.results}
        assert ("measure-each", "live") in sources and ("learned-pack", "live") in sources
        assert ("autotune", "replayed") in sources
        for r in s.results:    # the learned policies say what their exploring did
            learned = r.policy.startswith("learned")
            assert r.issue_ms == {}   # the host backend times issuing in: nothing charged
            assert bool(r.policy_stats) == learned, r
            if learned:
                assert r.policy_stats["commits"] >= 1 and r.policy_stats["deferred"] >= 0
                # (the host times its calls whole: no gate, so no sample read past one)
                assert r.policy_stats["samples_past_gate"] == 0, r.policy_stats
                assert f"{r.policy}: commits {r.policy_stats['commits']}," in str(report)
        oracle = report.result(s.stream, "oracle")
        assert oracle.steady_ms == pytest.approx(s.oracle_ms) and oracle.steady_ratio == 1.0
        # the host runs each call whole: no pipelined regime to price, none printed
        assert all(math.isnan(r.pipelined_ms) and math.isnan(r.pipelined_ratio)
                   for r in s.results)
        assert all(math.isnan(c[3]) for row in s.per_input.values()
                   for c in row["choices"].values())
        for r in s.results:
            assert math.isfinite(r.total_ms) and math.isfinite(r.steady_ms)
            # steady is never below the oracle, and the ratio is the printed quotient
            assert r.steady_ms >= s.oracle_ms * (1 - 1e-12)
            assert r.steady_ratio == pytest.approx(r.steady_ms / s.oracle_ms)
            # a live policy's first result split: the miss (deciding within it) inside
            # the first result, every new key's miss logged
            assert (r.source == "live") == math.isfinite(r.first_miss_ms), r
            if r.source == "live":
                assert 0 < r.first_decide_ms <= r.first_miss_ms <= r.first_result_ms
                assert 0 < r.first_policy_ms <= r.first_decide_ms
                assert 0 < r.first_listing_ms <= r.first_decide_ms - r.first_policy_ms
                assert f"the listing {r.first_listing_ms:.2f}, the rest " in str(report)
                # the first results by op: every new key of the stream counted once
                assert sum(n for n, _, _ in r.first_by_op.values()) == s.keys
                assert f"{r.policy} first result by op: " in str(report)
                assert 0 <= r.first_gc_ms <= r.first_result_ms
                # the host decides on the miss (its calls are timed by the wall clock)
                assert r.off_thread[0] == 0 and "off the calling thread" not in str(report)
                assert f"garbage collection in it {r.first_gc_ms:.2f}" in str(report)
                assert (f"{r.policy} first result {r.first_result_ms:.2f} ms: the miss "
                        f"{r.first_miss_ms:.2f} (deciding {r.first_decide_ms:.2f}: the "
                        f"policy {r.first_policy_ms:.2f}" in str(report))
        for r in s.results:   # where a live policy loses most: named with its share
            if r.source != "live":
                continue
            losses = {name: e["calls"] * (e["choices"][f"{r.policy}/live"][1]
                                          - e["choices"]["oracle/replayed"][1])
                      for name, e in s.per_input.items()}
            # the per-input losses add up to the stream's steady excess
            assert sum(losses.values()) == pytest.approx(r.steady_ms - s.oracle_ms, abs=1e-6)
            line = s.largest_excess(r.policy)
            if max(losses.values()) > 0:
                worst = max(losses, key=losses.get)
                assert line.startswith(f"  {r.policy} (live) largest excess: {worst}: ")
                assert f"= {losses[worst]:.3f} ms of the stream's" in line
                assert line in str(report)
            else:
                assert line == ""
    text = str(report)
    assert "replayed" in text and "live" in text and "warm hit" in text
    assert "pipelined, " not in text
    verdicts = report.verdicts()
    assert len(verdicts) == 3 and text.rstrip().endswith(verdicts[-1])
    assert all("best fixed choice" in v and ("BEAT" in v or "NOT" in v or "MATCHED" in v)
               for v in verdicts)


def test_each_input_names_every_policy_choice_and_prices_its_steady_time(report):
    """per_input holds, for each distinct input, its calls and every (policy, source)'s
    final choice with its re-timed ms: a policy's steady ms is those times weighted by the
    calls, and the oracle's is the fastest re-timed choice of each input so weighted."""
    for s in report.streams:
        assert len(s.per_input) == s.keys
        assert sum(row["calls"] for row in s.per_input.values()) == s.calls
        learned = {f"{r.policy}/{r.source}" for r in s.results if r.policy_stats}
        for row in s.per_input.values():
            assert {f"{r.policy}/{r.source}" for r in s.results} == set(row["choices"])
            # each learned policy's account of the input's class: what it explored, how
            # each candidate timed, why it committed (what the choice can be traced to)
            assert set(row["why"]) == learned and learned
            for key, why in row["why"].items():
                choice = row["choices"][key][0]
                assert ("committed" in why or "deferred" in why) and choice in why, (key, why)
        assert sum(row["calls"] * min(c[1] for c in row["choices"].values())
                   for row in s.per_input.values()) == pytest.approx(s.oracle_ms)
        for r in s.results:
            key = f"{r.policy}/{r.source}"
            assert sum(row["calls"] * row["choices"][key][1]
                       for row in s.per_input.values()) == pytest.approx(r.steady_ms), key


def test_each_learned_commit_is_the_fastest_of_what_it_timed(report):
    """How close a live policy lands to the oracle is the benchmark's to print (a timed
    bound here failed on a shared 2-core machine); what a test can hold on any machine is
    the commit rule: each learned choice committed after exploring is the one whose median
    was the fastest of the candidates it timed (the baseline kept only within its margin)."""
    import re
    commit = re.compile(r"committed after timing \d+ candidates up to \d+x on real calls "
                        r"\(medians\): (\S+) ([0-9.e+-]+) ms(?:; next (\S+) ([0-9.e+-]+) ms)?"
                        r"(; kept the baseline)?")
    seen = 0
    for s in report.streams:
        for row in s.per_input.values():
            for key, why in row["why"].items():
                for m in commit.finditer(why):
                    seen += 1
                    chosen_ms, next_ms, kept = float(m.group(2)), m.group(4), m.group(5)
                    if next_ms is not None and not kept:
                        assert chosen_ms <= float(next_ms), (key, why)
                assert row["choices"][key][0] in why, (key, why)
    assert seen >= 3       # the quick streams commit after exploring on several inputs


def test_learned_policy_explores_on_real_calls_not_in_a_sweep(report):
    for s in report.streams:
        learned = report.result(s.stream, "learned-pack")
        autotune = report.result(s.stream, "autotune")
        assert learned.explored < autotune.explored
        # autotune runs every candidate AUTOTUNE_RUNS times before its first result
        assert autotune.explored == AUTOTUNE_RUNS * s.candidates


def _warm_hit_calls(d, x) -> list[tuple[str, str]]:
    """The calls one warm ``d.launch`` makes in adaptive's own code up to the backend: Python
    functions as (file, name), and the C functions those call."""
    import adaptive
    root = Path(adaptive.__file__).parent
    seen = []

    def ours(frame) -> str | None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(root) and not path.is_relative_to(root / "backends"):
            return path.relative_to(root).as_posix()
        return None

    def profile(frame, event, arg):
        where = ours(frame)
        if where is not None and event == "call":
            seen.append((where, frame.f_code.co_name))
        elif where is not None and event == "c_call":
            seen.append(("C", getattr(arg, "__qualname__", repr(arg))))
    sys.setprofile(profile)
    try:
        d.launch("softmax", x)
    finally:
        sys.setprofile(None)
    return [c for c in seen if c != ("C", "setprofile")]


@pytest.mark.parametrize("sample_every", [0, 10**9], ids=["plain", "sampling-on"])
def test_a_warm_hit_costs_what_the_foundation_hot_path_costs(sample_every):
    """A committed key under the learned policy runs the foundation's hot path call for call:
    no policy code, no lock, no miss. (What it costs in µs, learned / measure-each, is the
    selection benchmark's ``warm hit`` line and target, not a timed test.)"""
    from adaptive.backends import get_backend
    from adaptive.dispatch import Dispatcher
    from adaptive.ops import OPS
    from adaptive.policy.learned import Learned
    be = get_backend("host")
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    key = OPS["softmax"].key((x,), {})
    traces = {}
    for name, d in (("learned", Dispatcher(be, policy=Learned())), ("measure-each",
                                                                    Dispatcher(be))):
        for _ in range(200):                      # until the key is committed
            d.launch("softmax", x)
            if not d.current_plan(key).provisional:
                break
        assert not d.current_plan(key).provisional, f"{name} never committed"
        d.sample_every = sample_every
        d.launch("softmax", x)                    # a tick past any sampled call
        traces[name] = _warm_hit_calls(d, x)
    learned = traces["learned"]
    assert ("dispatch.py", "run") in learned and ("ops/base.py", "key") in learned
    assert learned == traces["measure-each"]
    assert not [c for c in learned if c[0].startswith("policy/") or c[1] == "_miss"
                or "lock" in c[1].lower()]


def test_model_accuracy_is_reported_on_the_stream_inputs(report):
    acc = report.accuracy
    assert acc.keys >= 10 and -1.0 <= acc.spearman <= 1.0 and 0.0 <= acc.top1 <= acc.top3 <= 1.0


def test_live_dispatchers_get_a_pack_only_where_the_benchmark_loads_one(tmp_path, rng):
    from adaptive.backends import get_backend
    from adaptive.dispatch import Dispatcher
    from adaptive.policy.learned import Learned
    from adaptive.policy.cost_model import LiveModel
    from adaptive.observation import Observation
    from adaptive.bench.selection import _dispatcher, _write_pack
    be = get_backend("host")
    x = rng.standard_normal((37, 53)).astype(np.float32)
    shared = Dispatcher(be)                      # timed rows, as the table makes them
    rows = []
    for c in shared.candidates("softmax", x):
        shared.launch("softmax", x, variant=c.variant.name, config=c.config)
        rows.append(Observation("softmax", {"R": 37, "C": 53}, "float32", c.variant.name,
                                c.config, float(rng.uniform(0.01, 0.1)), 0.005, {}))
    cold = _dispatcher(be, Learned(LiveModel(background=False)))
    assert cold.registry is not shared.registry and "prior_rows" not in cold.stats
    path = _write_pack(be, rows, tmp_path / "p.msgpack")
    warm = _dispatcher(be, Learned(LiveModel(background=False)), path)
    assert warm.stats["prior_rows"] == len(rows) and warm.policy.model.model is not None
    assert "prior_rows" not in cold.stats        # loading into one registry leaves the other


def test_shipped_pack_is_compared_with_no_pack_in_the_report(report):
    text = str(report)
    if report.shipped:
        assert "learned-shipped" in text and "with vs without" in text
    else:
        assert "none for this device (learned-shipped not run)" in text
        assert all(r.policy != "learned-shipped" for s in report.streams for r in s.results)


def test_steady_state_is_priced_synchronised_and_pipelined_alike(rng):
    """Each final choice re-timed in the live stream's regime (every call synchronised) and,
    where asked (a device), pipelined: each regime's oracle is its own fastest candidate
    per input, each ratio the quotient of the ms it prints, and the per-input rows carry
    both times."""
    from adaptive.backends import get_backend
    from adaptive.bench.selection import (PIPELINED_BATCH, PolicyResult, StreamReport,
                                          _dispatcher, _inputs, _per_input, _spec, _steady)
    from adaptive.policy import MeasureEach
    be = get_backend("host")
    d = _dispatcher(be, MeasureEach())
    specs = [_spec("softmax", R=37, C=53), _spec("softmax", R=5, C=301)]
    inputs = {s: _inputs(s, rng, "host") for s in specs}
    labels = {s: [c.label for c in d.candidates("softmax", *inputs[s][0])][:3] for s in specs}
    stream = [specs[0]] * 3 + [specs[1]] * 2
    nan = math.nan
    results = [PolicyResult(p, "replayed", 0.0, nan, nan, 0.0, 0.0, 0.0)
               for p in ("oracle", "first", "last")]
    choices = {("oracle", "replayed"): {s: labels[s][0] for s in specs},
               ("first", "replayed"): {s: labels[s][0] for s in specs},
               ("last", "replayed"): {s: labels[s][-1] for s in specs}}
    oracle, synced, piped = _steady(d, stream, inputs, results, choices, be.synchronize,
                                    quick=True, pipelined=True)
    pairs = {(s, lab) for ch in choices.values() for s, lab in ch.items()}
    assert set(synced) == pairs == set(piped)
    for t, regime in ((synced, "steady"), (piped, "pipelined")):
        assert all(0 < ms < math.inf for ms in t.values())
        best = sum(min(t[(s, lab)] for lab in {ch[s] for ch in choices.values()})
                   for s in stream)
        for r in results:
            ms, ratio = getattr(r, f"{regime}_ms"), getattr(r, f"{regime}_ratio")
            if r.policy == "oracle":
                assert ms == pytest.approx(best) and ratio == 1.0
            else:
                mine = sum(t[(s, choices[(r.policy, "replayed")][s])] for s in stream)
                assert ms == pytest.approx(mine) and ratio == pytest.approx(mine / best)
                assert ratio >= 1 - 1e-12
    assert oracle == pytest.approx(results[0].steady_ms)
    rows = _per_input(stream, choices, synced, {s: {} for s in specs}, piped=piped)
    for s in specs:
        row = next(v for k, v in rows.items() if k.startswith(f"softmax:R={s[1][0][1]},"))
        label, ms, _, piped_ms = row["choices"]["last/replayed"]
        assert (ms, piped_ms) == (synced[(s, label)], piped[(s, label)])
    line = next(x for x in StreamReport("mix", len(specs), len(stream), 6, oracle, results,
                                        rows).lines() if "pipelined, " in x)
    assert line == (f"  pipelined, {PIPELINED_BATCH} calls a synchronise (a caller that "
                    "does not wait for each call), steady/oracle: "
                    f"first (replayed) {results[1].pipelined_ratio:.3f}, "
                    f"last (replayed) {results[2].pipelined_ratio:.3f}")


def test_the_report_names_the_classes_decided_off_the_calling_thread():
    from adaptive.bench.selection import PolicyResult, StreamReport
    live = PolicyResult("learned-shipped", "live", 10.0, 1.0, 1.0, 0.8, 1.5, 0.1,
                        off_thread=(3, 2.5, 4.25))
    quiet = PolicyResult("learned-cold", "live", 10.0, 1.0, 1.0, 0.8, 1.5, 0.1)
    text = "\n".join(StreamReport("decode-heavy", 3, 30, 9, 1.0, [live, quiet]).lines())
    assert ("learned-shipped: 3 input classes decided off the calling thread, the policy's "
            "decide 2.50 ms each, 4.25 ms from the miss to the decision (the stand-in "
            "serving meanwhile)") in text
    assert "learned-cold: 0 input" not in text
