"""The learned policy and the dispatcher's provisional plans, on replayed timings.

The timings a policy sees are replayed from a table (fake the device, not the logic);
the end-to-end tests run real host variants through Dispatcher.launch.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import threading
import time

import numpy as np
import pytest

pytest.importorskip("sklearn")

import adaptive  # noqa: E402
from adaptive.dispatch import HOLD_US, PAST_GATE_RETRIES, Dispatcher  # noqa: E402
from adaptive.policy.learned import Learned, _diverse  # noqa: E402
from adaptive.policy.cost_model import LiveModel, training_set  # noqa: E402
from adaptive.observation import Observation  # noqa: E402
from adaptive.ops import OPS  # noqa: E402
from adaptive.policy import Context  # noqa: E402

# the dispatcher tests here script their calls one by one on a fake GPU (events timed): a
# new class is decided on its miss unless a test says otherwise
pytestmark = pytest.mark.usefixtures("decided_on_the_miss")


def softmax_context(rng, rows=300, cols=96):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    d = Dispatcher("host")
    op = OPS["softmax"]

    def no_sweep(*_, **__):
        raise AssertionError("the learned policy must not measure on a miss")
    ctx = Context(op, op.problem((x,), {}), op.key((x,), {}), no_sweep)
    return ctx, d.candidates("softmax", x), x


def replayed_model(candidates, fast_label: str, rng) -> LiveModel:
    """A model fitted on recorded rows where ``fast_label`` is 3x faster than the rest."""
    rows = []
    op = OPS["softmax"]
    for r in (64, 128, 256, 512, 1024):
        x = rng.standard_normal((r, 96)).astype(np.float32)
        p = op.problem((x,), {})
        feats = op.features(p)
        for c in candidates:
            if c.variant.fits(p.scope(), c.config):
                t = (1.0 if c.label == fast_label else 3.0) * r * 1e-3
                rows.append(Observation("softmax", dict(p.dims), p.dtype, c.variant.name,
                                        c.config, t * math.exp(rng.normal(0, 0.02)),
                                        r * 1e-3, feats))   # floor: the time normalised
    return LiveModel(training_set(rows), background=False)


def test_cold_policy_explores_a_few_diverse_candidates_without_a_sweep(rng):
    ctx, cands, _ = softmax_context(rng)
    policy = Learned(LiveModel(background=False), max_explore=3)
    d = policy.decide(ctx, cands)
    assert len(d.explore) == 3 < len(cands)
    assert d.candidate == d.explore[0]
    assert {c.variant.name for c in d.explore} == {"host_numpy", "host_blocked"}
    assert "cold" in d.reason


def test_diverse_order_covers_variants_then_config_extremes(rng):
    _, cands, _ = softmax_context(rng, rows=1000)
    labels = [c.label for c in _diverse(cands)]
    assert labels[:3] == ["host_numpy", "host_blocked[rows=128]", "host_blocked[rows=8]"]
    assert sorted(labels) == sorted(c.label for c in cands)


def test_model_ranking_explores_only_plausible_candidates_and_commits(rng):
    ctx, cands, _ = softmax_context(rng)
    fast = "host_blocked[rows=32]"
    policy = Learned(replayed_model(cands, fast, rng), regret_bound=0.2, samples=2)
    d = policy.decide(ctx, cands)
    assert d.candidate.label == fast
    assert len(d.explore) <= 2       # the others are predicted 3x slower
    predicted = dict(d.predicted_ms)
    assert predicted[fast] == min(predicted.values())
    # replay: whatever was explored, the truth is that rows=32 is fastest
    truth = {c: (0.1 if c.label == fast else 0.3) for c in cands}
    update = None
    for c in (d.explore or (d.candidate,)) * 2:
        update = policy.observe(ctx.key, c, truth[c]) or update
    if d.explore:
        assert update is not None and not update.explore and update.candidate.label == fast
        assert "committed" in update.reason
    assert policy.state(ctx.key).committed.label == fast


def test_commit_picks_the_fastest_observed_not_the_predicted(rng):
    ctx, cands, _ = softmax_context(rng)
    policy = Learned(LiveModel(background=False), max_explore=3, samples=2, race_ratio=None)
    d = policy.decide(ctx, cands)
    e0, e1, e2 = d.explore
    times = {e0: 0.5, e1: 0.2, e2: 0.9}
    decisions = [policy.observe(ctx.key, c, times[c]) for c in (e0, e1, e2, e0)]
    assert decisions[:3] == [None] * 3
    # e0 has its samples: the calls rotate over the two still short of theirs, and the
    # fastest so far serves the call of one that fails
    assert decisions[3].explore == (e1, e2) and decisions[3].candidate == e1
    assert policy.observe(ctx.key, e1, times[e1]).explore == (e2,)
    commit = policy.observe(ctx.key, e2, times[e2])
    assert commit.candidate == e1 and not commit.explore
    assert dict(commit.observed_ms)[e1.label] == pytest.approx(0.2)
    assert policy.state(ctx.key).explored == {e0: 2, e1: 2, e2: 2}   # none timed a third time


def test_drift_reopens_exploration_and_a_steady_key_stays(rng):
    ctx, cands, _ = softmax_context(rng)
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1, drift_window=3,
                     drift_ratio=1.5)
    d = policy.decide(ctx, cands)
    a, b = d.explore
    policy.observe(ctx.key, a, 0.10)
    commit = policy.observe(ctx.key, b, 0.20)
    assert commit.candidate == a
    for t in (0.11, 0.09, 0.12, 0.10):
        assert policy.observe(ctx.key, a, t) is None
    assert policy.observe(ctx.key, b, 5.0) is None          # not the committed candidate
    assert policy.observe(ctx.key, a, 0.4) is None           # one outlier is not drift
    out = policy.observe(ctx.key, a, 0.42)                    # median of 3 is now 0.4
    assert out is not None and out.explore[0] == a and set(out.explore) == {a, b}
    assert "drift" in out.reason and policy.stats["drifts"] == 1
    assert policy.state(ctx.key).committed is None


def test_steady_samples_are_learned_but_never_start_a_refit(rng):
    """A committed key's steady samples join the model's rows and wait for the next refit
    exploring starts: a refit while serving takes the interpreter from the serving
    threads (run S37: one refit made a batch-1 generate()'s tokens 1.5x slower)."""
    ctx, cands, _ = softmax_context(rng)
    model = LiveModel(background=False, refit_every=2)
    policy = Learned(model, max_explore=2, samples=1, drift_window=64)
    d = policy.decide(ctx, cands)
    a, b = d.explore
    policy.observe(ctx.key, a, 0.10)
    assert policy.observe(ctx.key, b, 0.20).candidate == a
    fits = model.generation
    assert fits >= 1                              # the exploring rows refitted it
    for _ in range(40):
        assert policy.observe(ctx.key, a, 0.1) is None
    assert model.generation == fits               # 40 steady rows: no refit
    ctx2, cands2, _ = softmax_context(rng, rows=77)
    d2 = policy.decide(ctx2, cands2)
    for c in d2.explore:                          # exploring another key refits, with
        policy.observe(ctx2.key, c, 0.3)          # every steady row kept
    assert model.generation > fits
    assert model.model.n_rows_ == 2 + 40 + len(d2.explore)


def test_a_keys_exploring_samples_are_counted_apart_from_its_steady_ones(rng):
    """``KeyState.explored``: exploring samples per candidate over every exploration of
    the key (what tuning cost); the committed candidate's steady samples (the calls
    served) go on in ``observed`` and are not counted there, and a drift's re-exploration
    adds to the count where ``observed`` starts anew."""
    ctx, cands, _ = softmax_context(rng)
    policy = Learned(LiveModel(background=False), max_explore=3, samples=2, drift_window=4,
                     drift_ratio=1.5, race_ratio=None)
    d = policy.decide(ctx, cands)
    times = dict(zip(d.explore, (0.1, 0.2, 0.3)))
    for _ in range(2):
        for c in d.explore:
            policy.observe(ctx.key, c, times[c])
    state = policy.keys[ctx.key]
    first = d.explore[0]
    assert state.committed == first
    assert dict(state.explored) == {c: 2 for c in d.explore}
    for _ in range(4):    # the steady baseline window, then steady samples as expected
        policy.observe(ctx.key, first, 0.1)
    assert len(state.observed[first]) == 6 and state.explored[first] == 2
    for n in range(1, 5):    # 3x slower: a drift re-explores the three
        policy.observe(ctx.key, first, 0.3)
        if state.committed is None:
            break
    assert state.committed is None and n < 5 and len(state.observed[first]) == 0
    assert state.explored[first] == 2
    policy.observe(ctx.key, first, 0.3)
    assert state.explored[first] == 3 and len(state.observed[first]) == 1
    assert sum(state.explored.values()) == policy.stats["explore_calls"] == 7


def test_parameters_are_validated():
    with pytest.raises(ValueError, match="max_explore"):
        Learned(LiveModel(background=False), max_explore=0)
    with pytest.raises(ValueError, match="drift_ratio > 1"):
        Learned(LiveModel(background=False), drift_ratio=1.0)


def test_dispatcher_explores_on_real_calls_then_serves_a_plain_plan(rng):
    x = rng.standard_normal((257, 301)).astype(np.float32)
    ref = OPS["softmax"].reference(x)
    # noise_ratio off: on a loaded 2-core host two samples of one candidate can read 2x
    # apart, and a third is then wanted (its own tests cover that); this one counts two
    policy = Learned(LiveModel(background=False), max_explore=3, samples=2, race_ratio=None,
                     noise_ratio=None)
    d = Dispatcher("host", policy=policy)
    d.sample_every = 0
    key = OPS["softmax"].key((x,), {})
    y = d.launch("softmax", x)                       # a miss returns at once: one run
    assert np.max(np.abs(y - ref)) < 1e-5
    plan = d._plans[key]
    assert plan.provisional and len(plan.decision.explore) == 3
    assert d.stats["samples"] == 1                   # only the call itself was timed
    for _ in range(5):
        y = d.launch("softmax", x)
        assert np.max(np.abs(y - ref)) < 1e-5        # every explored candidate is correct
    plan = d._plans[key]
    assert not plan.provisional and not plan.decision.explore
    assert plan.run is d._prepared[(key, plan.candidate)].run   # the committed hot path
    observed = policy.state(d._plans[key].class_key).observed   # the rule: the lowest median
    assert plan.candidate.label == min(observed, key=lambda c: observed[c].median()).label
    assert all(len(observed[c]) == 2 for c in observed)   # the count: the commit criterion
    text = str(adaptive.explain("softmax", x, dispatcher=d))
    assert "committed" in text and plan.candidate.label in text and "explored" in text
    assert "history:" in text and "miss: " in text and "(medians)" in text


def _explored_softmax(rng, rows, cols, max_explore):
    """A host dispatcher whose learned policy has just missed on a softmax input."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    policy = Learned(LiveModel(background=False), max_explore=max_explore, samples=1)
    d = Dispatcher("host", policy=policy)
    d.sample_every = 0
    d.launch("softmax", x)
    return x, policy, d, OPS["softmax"].key((x,), {})


def test_failed_exploration_candidate_falls_back_and_is_recorded(rng):
    x, policy, d, key = _explored_softmax(rng, 40, 33, max_explore=2)
    plan = d._plans[key]
    state = policy.state(plan.class_key)
    first, second = state.explore
    # one sample a candidate: the miss timed the first, so the calls rotate over the second
    # alone and the first serves a call of it that fails
    assert plan.decision.explore == (second,) and plan.candidate == first
    pooled = d._prepare_like(plan, second, (x,))

    def broken(args, out):
        raise RuntimeError("kernel fault")
    d._prepared[(key, second)] = dataclasses.replace(pooled, run=broken)
    d._plans[key] = d._plan_for(plan.decision, d._prepared[(key, first)])
    y = d.launch("softmax", x)                       # the broken one's turn: falls back
    np.testing.assert_allclose(y, OPS["softmax"].reference(x), rtol=1e-5, atol=1e-6)
    assert state.observed[second] == [math.inf]
    assert d._plans[key].candidate == first and not d._plans[key].provisional


def test_a_miss_prepares_one_candidate_and_one_that_cannot_be_prepared_is_recorded(rng):
    x, policy, d, key = _explored_softmax(rng, 41, 35, max_explore=3)
    plan = d._plans[key]
    explore = policy.state(plan.class_key).explore
    assert len(explore) == 3 and plan.decision.explore == explore[1:]   # (the first: timed)
    assert [k for k in d._prepared if k[0] == key] == [(key, explore[0])]
    prepare = d.backend.prepare

    def refuses_the_last(candidate, problem, op):
        if candidate == explore[2]:
            raise RuntimeError("compile error")
        return prepare(candidate, problem, op)
    d.backend.prepare = refuses_the_last
    ref = OPS["softmax"].reference(x)
    for _ in range(3):                               # turns 2 and 3: prepared on first use
        np.testing.assert_allclose(d.launch("softmax", x), ref, rtol=1e-5, atol=1e-6)
    state = policy.state(d._plans[key].class_key)
    assert state.observed[explore[2]] == [math.inf] and (key, explore[1]) in d._prepared
    plan = d._plans[key]
    assert not plan.provisional and plan.candidate in explore[:2]


def test_forget_key_redecides_only_that_key(rng):
    a = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal((8, 16)).astype(np.float32)
    d = Dispatcher("host")
    d.launch("softmax", a)
    d.launch("softmax", b)
    d.forget_key(OPS["softmax"].key((a,), {}))
    assert d.decision("softmax", a) is None and d.decision("softmax", b) is not None


def test_explain_before_any_launch_shows_the_model_ranking(rng):
    ctx, cands, x = softmax_context(rng)
    fast = "host_blocked[rows=32]"
    d = Dispatcher("host", policy=Learned(replayed_model(cands, fast, rng)))
    e = adaptive.explain("softmax", x, dispatcher=d)
    assert e.state == "undecided" and e.rows[0].label == fast
    assert all(not math.isnan(r.predicted_ms) for r in e.rows)
    assert "R=300, C=96" in str(e)


def _gemm_miss(rng, m=200, n=300, k=400):
    from adaptive.variants import default_registry, make_candidate
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    op = OPS["gemm"]
    problem = op.problem((a, b), {})
    ctx = Context(op, problem, op.key((a, b), {}), lambda *_, **__: math.inf)
    cands = [make_candidate(v, cfg) for v in default_registry().variants("gemm", "cuda")
             for cfg in list(v.space.all_configs())[:4]]
    return ctx, cands, op.features(problem)


@pytest.mark.parametrize("anchors", [True, False])
def test_anchors_explore_the_nearest_inputs_fastest_and_the_library_candidate(rng, anchors):
    ctx, cands, feats = _gemm_miss(rng)
    library = [c for c in cands if c.variant.language == "python"]
    kernels = [c for c in cands if c.variant.language != "python"]
    far_pick, near_pick = kernels[-1], kernels[-2]
    slow = {far_pick: 6.0, near_pick: 5.0} | {c: 10.0 for c in library}
    rows = [Observation("gemm", {"M": m, "N": 300, "K": 400}, "float16", c.variant.name,
                        c.config, slow.get(c, 1.0 + 0.01 * i), 0.5,
                        OPS["gemm"].features(OPS["gemm"].problem(
                            (np.ones((m, 400), np.float16), np.ones((400, 300), np.float16)),
                            {})))
            for m in (64, 128, 512, 1024) for i, c in enumerate(cands)]
    model = LiveModel(training_set(rows), background=False)   # ranks library and picks last
    policy = Learned(model, anchors=anchors, neighbours_k=1)
    far = {k: v + 6.0 for k, v in feats.items()}
    near = {k: v + 0.1 for k, v in feats.items()}
    for f, pick in ((far, far_pick), (near, near_pick)):
        policy.neighbours.add("gemm", "float16", f, pick.variant.name, pick.config_items, 0.5)
    policy.neighbours.add("gemm", "float32", feats, far_pick.variant.name,
                          far_pick.config_items, 0.1)               # another dtype: ignored
    decision = policy.decide(ctx, cands)
    explored = set(decision.explore)
    assert library and 2 <= len(decision.explore) <= policy.max_explore
    assert far_pick not in explored
    assert (near_pick in explored) == anchors
    assert any(c in explored for c in library) == anchors
    if anchors:
        assert "near measured input" in decision.reason and "library" in decision.reason
    policy.neighbours_k = 2                          # the two nearest inputs' fastest
    policy.keys.clear()
    explored = set(policy.decide(ctx, cands).explore)
    assert ({far_pick, near_pick} <= explored) == anchors


def test_a_commit_teaches_the_neighbours_and_pack_rows_fill_them(rng):
    ctx, cands, feats = _gemm_miss(rng)
    policy = Learned(LiveModel(background=False), samples=1)
    decision = policy.decide(ctx, cands)
    times = {c: 1.0 + i for i, c in enumerate(decision.explore)}
    for c in decision.explore:
        policy.observe(ctx.key, c, times[c])
    fastest = min(times, key=times.get)
    [((name, items), dist)] = policy.neighbours.fastest_near("gemm", "float16", feats)
    assert (name, items) == (fastest.variant.name, fastest.config_items) and dist < 1e-3
    row = Observation("gemm", {"M": 1, "N": 2, "K": 3}, "float32", "cublas", {}, 0.2, 0.1,
                      {"log2_M": 0.0})
    policy.add_observations([row, dataclasses.replace(row, time_ms=math.inf)])
    assert policy.neighbours.fastest_near("gemm", "float32", {"log2_M": 0.5}, k=3) == [
        (("cublas", ()), 0.5)]                      # one input measured: one answer


class _Event:
    def __init__(self, gpu):
        self.gpu, self.t, self.done = gpu, None, False

    def record(self):
        self.t = self.gpu.clock
        self.gpu.recorded.append(self)


class _EventHost:
    """The host backend with a fake GPU clock and fake CUDA events: each candidate's run
    advances the clock by its own cost; events complete only when the test says so. A run
    on an idle stream (``idle``, or waited for by ``wait_stream``) outside a gate first
    advances the clock by its ``pre`` ms: the host's latency up to its kernels' launch,
    which an ungated event pair reads. With ``gate_expires``, a gate runs out like the
    cuda backend's after its hold and says so (its release's ``expired()``): a call issued
    longer than that is read with the issuing's excess (the device waited for the host
    inside the pair). With ``spin``, the host's issuing is busy work of the issuing thread
    (its CPU time), else a wait (a sleep: the interpreter held by another thread)."""

    def __new__(cls):
        from adaptive.backends.host import HostBackend

        class EventHost(HostBackend):
            def __init__(self):
                super().__init__()
                self.clock, self.recorded, self.synced, self.cost = 0.0, [], 0, {}
                self.holds, self.issue_s, self.idle = [], {}, False
                self.pre, self.gated, self.stream_waits, self._waited = {}, False, 0, False
                self.gate_expires, self._hold_ms, self._expired = False, 0.0, [False]
                self.spin = False

            def prepare(self, candidate, problem, op):
                fn = super().prepare(candidate, problem, op)
                label = candidate.label
                self.cost.setdefault(label, 1.0 + 0.25 * len(self.cost))

                def run(args, out):
                    fn(args, out)
                    if not self.gated and (self.idle or self._waited):
                        self.clock += self.pre.get(label, 0.0)   # the device waits
                    self._waited = False
                    issue = self.issue_s.get(label, 0.0)       # the host's issuing
                    issue = issue() if callable(issue) else issue
                    if self.spin:   # the thread's own work: its CPU time, whatever the
                        # other threads holding the interpreter meanwhile add to the wall
                        t0 = time.thread_time()
                        while time.thread_time() - t0 < issue:
                            pass
                    else:
                        time.sleep(issue)
                    if self.gated and self.gate_expires and issue * 1e3 > self._hold_ms:
                        self.clock += issue * 1e3 - self._hold_ms   # read past the gate
                        self._expired[0] = True
                    self.clock += self.cost[label]
                return run

            def wait_stream(self, stream_ptr):
                self.stream_waits += 1
                self._waited = True

            def stream_idle(self, stream_ptr):
                return self.idle

            def synchronize(self):
                self.synced += 1

            def event_timer(self):
                from profilers.events import EventTimer
                return EventTimer(16, events=(lambda: _Event(self), lambda a, b: b.t - a.t))

            def stream_ptr(self, kind):
                return 0

            def gate(self, stream_ptr, limit_us):
                self.holds.append(self.clock)
                self.gated, self._hold_ms = True, limit_us / 1e3
                expired = self._expired = [False]

                def release():
                    self.gated = False
                if self.gate_expires:
                    release.expired = lambda: expired[0]
                return release

            def finish(self):          # the GPU catches up
                for e in self.recorded:
                    e.done = True
        return EventHost()


def test_gpu_timings_come_from_events_harvested_later_and_nothing_synchronises(rng):
    be = _EventHost()
    x = rng.standard_normal((129, 77)).astype(np.float32)
    ref = OPS["softmax"].reference(x)
    policy = Learned(LiveModel(background=False), max_explore=3, samples=2)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    key = OPS["softmax"].key((x,), {})
    for _ in range(9):    # each of 3 candidates: a warm-up turn, then 2 samples
        assert np.max(np.abs(d.launch("softmax", x) - ref)) < 1e-5
    assert d._plans[key].provisional            # timings recorded but the GPU is "behind"
    assert be.synced == 0 and d.stats["samples"] >= 6
    samples = d.stats["samples"]
    be.finish()
    d.launch("softmax", x)                      # this call harvests the finished pairs
    plan = d._plans[key]
    assert not plan.provisional and be.synced == 0
    # every candidate had its samples issued: the call was served untimed, no seventh
    assert d.stats["samples"] == samples
    explored = policy.state(d._plans[key].class_key).explore
    assert plan.candidate == min(explored, key=lambda c: be.cost[c.label])
    assert policy.state(d._plans[key].class_key).expected_ms == pytest.approx(
        be.cost[plan.candidate.label])
    d.launch("softmax", x)                      # a steady sample of the commit
    be.finish()
    assert d.harvest() >= 1 and list(policy.state(d._plans[key].class_key).recent)
    assert d.harvest() == 0                     # nothing pending: a flush is free


@pytest.mark.parametrize("pinned_first", [False, True])
def test_candidates_timed_pinned_first_are_sampled_for_the_class(rng, pinned_first):
    """A candidate launched pinned (``variant=``, ``config=``) before its input class
    explores has a plan bound to its own key; the class's rotation reuses that plan, and
    its samples must reach the class: they went to no class, and the class never
    committed (run S100: a benchmark timed the 2:4 kernels pinned, then every class of
    N <= 64 explored 600 calls). The same calls commit either way; a pinned launch after
    the commit still runs its own candidate."""
    be = _EventHost()
    x = rng.standard_normal((70, 45)).astype(np.float32)
    ref = OPS["softmax"].reference(x)
    policy = Learned(LiveModel(background=False))
    d = Dispatcher(be, policy=policy)
    cands = d.candidates("softmax", x)
    if pinned_first:
        for c in cands:
            out = d.launch("softmax", x, variant=c.variant.name, config=c.config)
            assert np.max(np.abs(out - ref)) < 1e-5
    key = OPS["softmax"].key((x,), {})
    for n in range(1, 40):
        assert np.max(np.abs(d.launch("softmax", x) - ref)) < 1e-5
        be.finish()
        if not d._plans[key].provisional:
            break
    state = policy.state(d._plans[key].class_key)
    assert state.committed is not None, "; ".join(state.history)
    assert n <= 4 * len(state.explore) + 2, n
    assert all(len(state.observed[c]) >= 1 for c in state.explore), state.observed
    assert state.committed == min(state.explore, key=lambda c: be.cost[c.label])
    d.sample_every = 1              # the commit's steady samples reach the class too
    for _ in range(3):
        d.launch("softmax", x)
        be.finish()
    d.harvest()
    assert list(state.recent) or state.steady_ms > 0, "; ".join(state.history)
    last = cands[-1]
    out = d.launch("softmax", x, variant=last.variant.name, config=last.config)
    assert np.max(np.abs(out - ref)) < 1e-5


def _lagging_exploration(rng, drop=None, settle_margin=None):
    """A class explored on the fake event host with its events finished only every third
    call (a GPU behind the host: samples harvested calls after they are issued), 3
    candidates of 3 samples each; ``drop``: the sampled calls (counted from 1) whose event
    pair is lost (a full ring). Returns the policy's state at the commit, the calls it
    took, the sampled calls issued and the calls served untimed."""
    be = _EventHost()
    x = rng.standard_normal((70, 45)).astype(np.float32)
    ref = OPS["softmax"].reference(x)
    policy = Learned(LiveModel(background=False), max_explore=3, samples=3,
                     clear_margin=None, race_ratio=None, explore_budget=None,
                     settle_margin=settle_margin)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    timer = d._event_timer()
    start, started = timer.start, [0]

    def dropping(stream_ptr=None):
        started[0] += 1
        return -1 if drop and started[0] in drop else start(stream_ptr)
    timer.start = dropping
    key = OPS["softmax"].key((x,), {})
    for n in range(1, 80):
        assert np.max(np.abs(d.launch("softmax", x) - ref)) < 1e-5
        if n % 3 == 0:
            be.finish()
        if not d._plans[key].provisional:
            state = policy.state(d._plans[key].class_key)
            untimed = n - len(state.explore) - started[0]
            return state, n, started[0], untimed
    raise AssertionError("no commit in 80 calls: " + "; ".join(
        policy.state(d._plans[key].class_key).history))


def test_a_candidate_gets_no_sample_past_its_count_while_samples_are_harvested(rng):
    """Samples harvested calls late: once every candidate has its samples issued, the
    class's calls are served untimed until they are in, so none is timed a fourth time
    (run S72's long-burst: each of 81 explored candidates was, 336 timed calls for 255)."""
    state, calls, sampled, untimed = _lagging_exploration(rng)
    assert dict(state.explored) == {c: 3 for c in state.explore}
    assert sampled == 9 and untimed >= 1 and calls == 3 + 9 + untimed


def test_a_settled_exploration_commits_on_two_samples_while_samples_are_harvested(rng):
    """settle_margin with samples harvested calls late: candidates 1.0, 1.25 and 1.5 ms
    apart settle on two samples each; the commit comes once those are in (a third issued
    before it is wasted, not counted), in fewer calls than three samples each take."""
    state, calls, sampled, untimed = _lagging_exploration(rng, settle_margin=0.02)
    assert dict(state.explored) == {c: 2 for c in state.explore}
    assert "settled" in state.history[-1]
    assert 6 <= sampled <= 6 + 2 and calls < 3 + 9
    off = _lagging_exploration(np.random.default_rng(0))
    assert calls < off[1]


def test_a_lost_sample_does_not_hold_the_exploration(rng):
    """A sample whose event pair is lost (a full ring) never arrives: after a few rounds
    served untimed the turn's candidate is timed again, and the class commits."""
    state, calls, sampled, untimed = _lagging_exploration(rng, drop={9})
    assert sum(state.explored.values()) == 9 and sampled == 10   # one sample issued again
    assert 4 <= untimed <= 4 * 3 + 3 and calls < 40     # after 4 rounds of the rotation left


def test_exploring_samples_are_queued_behind_a_gate_and_steady_samples_are_not(rng):
    """An idle GPU would add the host's launch latency to an exploring sample's event pair
    (a host-bound decode loop): each exploring sample gates the stream first; the drift
    samples of a committed plan do not."""
    be = _EventHost()
    x = rng.standard_normal((65, 33)).astype(np.float32)
    policy = Learned(LiveModel(background=False), max_explore=3, samples=2)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    key = OPS["softmax"].key((x,), {})
    while d._plans.get(key) is None or d._plans[key].provisional:
        d.launch("softmax", x)
        be.finish()
        assert len(be.holds) < 40, "exploration never ended"
    explored = policy.state(d._plans[key].class_key).explore
    assert len(be.holds) >= 2 * len(explored) - 1   # every exploring sample but the miss's
    held = len(be.holds)
    for _ in range(5):
        d.launch("softmax", x)
    assert len(be.holds) == held and d.stats["samples"] >= held + 5


def test_a_broken_event_timer_falls_back_to_host_timing_and_the_call_still_runs(rng, caplog):
    be = _EventHost()

    class Broken:
        pending = 0

        def start(self, stream_ptr):
            raise RuntimeError("cudaErrorInvalidResourceHandle")
    be.event_timer = lambda: Broken()
    x = rng.standard_normal((33, 47)).astype(np.float32)
    d = Dispatcher(be, policy=Learned(LiveModel(background=False), max_explore=2, samples=1))
    d.sample_every = 1
    ref = OPS["softmax"].reference(x)
    for _ in range(5):     # two warm-up turns (no event pair), then the pairs fail
        np.testing.assert_allclose(d.launch("softmax", x), ref, rtol=1e-5, atol=1e-6)
    assert d.stats["event_timing_failed"] == 1 and "timed on the host" in caplog.text
    assert be.synced >= 3                            # host timing from then on
    assert not d._plans[OPS["softmax"].key((x,), {})].provisional   # and it still commits


def test_commit_is_on_medians_after_the_sample_count_not_one_lucky_sample(rng):
    ctx, cands, _ = softmax_context(rng)
    # (noise_ratio off here: a's median over 2x its lucky sample would have it timed again,
    # below)
    policy = Learned(LiveModel(background=False), settle_margin=None, max_explore=2,
                     samples=3, noise_ratio=None)
    d = policy.decide(ctx, cands)
    a, b = d.explore
    # a: one lucky sample, otherwise slow; b: steadily faster than a's median
    feed = [(a, 0.05), (b, 0.2), (a, 0.3), (b, 0.21)]
    assert [policy.observe(ctx.key, c, t) for c, t in feed] == [None] * 4   # 2 < 3 samples
    policy.observe(ctx.key, a, 0.31)
    out = policy.observe(ctx.key, b, 0.19)
    assert out is not None and out.candidate == b and not out.explore
    assert dict(out.samples) == {a.label: 3, b.label: 3}
    assert dict(out.observed_ms)[a.label] == pytest.approx(0.3)   # the median, not 0.05
    history = list(policy.state(ctx.key).history)
    assert history[0].startswith("miss:") and "committed" in history[-1] and "n=3" in history[-1]
    # with noise_ratio (2): a, whose median is 6x its lucky sample, is timed up to 6 times
    policy = Learned(LiveModel(background=False), settle_margin=None, max_explore=2, samples=3)
    d = policy.decide(ctx, cands)
    outs = [policy.observe(ctx.key, c, t) for c, t in feed + [(a, 0.31), (b, 0.19)]]
    assert outs[-1] is not None and outs[-1].explore == (a,)
    outs = [policy.observe(ctx.key, a, t) for t in (0.32, 0.29, 0.3)]
    assert outs[:2] == [None, None] and outs[-1].candidate == b and not outs[-1].explore
    assert dict(outs[-1].samples) == {a.label: 6, b.label: 3}


def test_a_keys_timings_are_a_bounded_ring_with_a_full_count(rng):
    from adaptive.policy.learned import Samples
    ctx, cands, _ = softmax_context(rng)
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1, drift_window=4)
    d = policy.decide(ctx, cands)
    a, b = d.explore
    policy.observe(ctx.key, a, 0.1)
    policy.observe(ctx.key, b, 0.2)
    for _ in range(500):
        policy.observe(ctx.key, a, 0.1)
    kept = policy.state(ctx.key).observed[a]
    assert len(kept) == 501 and len(list(kept)) == Samples.RING_SIZE
    assert len(policy.state(ctx.key).recent) <= 8


def test_the_per_variant_cap_spreads_the_exploration_budget_and_never_shrinks_it(rng):
    _, cands, _ = softmax_context(rng)
    by_variant: dict[str, list] = {}
    for c in cands:
        by_variant.setdefault(c.variant.id, []).append(c)
    many, other = sorted(by_variant.values(), key=len, reverse=True)[:2]
    assert len(many) >= 3 and other, "the host softmax needs two variants, one with 3 configs"
    policy = Learned(LiveModel(background=False), max_explore=4, per_variant=2)
    # the model ranks three configs of one variant first: two of them, then the other
    # variant's best, then the room left goes to the next of the first variant in order
    ranked = many[:3] + other[:1]
    assert policy._picks(ranked) == (many[0], many[1], other[0], many[2])
    # one variant within reach: its configs in order, up to max_explore, not just two
    assert policy._picks(many[:3]) == tuple(many[:3])
    assert Learned(LiveModel(background=False), max_explore=2)._picks(ranked) == tuple(
        many[:2])
    assert policy._picks(many[:1]) == (many[0],)
    with pytest.raises(ValueError, match="per_variant must be at least 1, got 0"):
        Learned(LiveModel(background=False), per_variant=0)


def test_the_library_anchors_are_the_baselines_whatever_the_model_ranks_first():
    """Of spmm's libraries (dense cuBLAS, cuSPARSE, cuSPARSELt through torch and with kept
    plans) the anchors are the two ways a plain program runs a pruned weight: the dense
    matmul, and on a 2:4 weight cuSPARSELt's kernels, with their plans kept (torch's path
    builds one every call); one config each, in the model's order, however it ranks them
    (run S7: cuSPARSELt ranked first was committed unseen against dense, 0.4x at N=16; runs
    S99-S100: cuSPARSELt left unexplored at N=2048, dense committed at 0.73x its speed).
    cuSPARSE and torch's own cuSPARSELt call are no baselines and never anchors."""
    from adaptive.variants import default_registry, make_candidate
    cands = [make_candidate(v, cfg) for v in default_registry().variants("spmm", "cuda")
             for cfg in list(v.space.all_configs())[:2]]
    library = [c for c in cands if c.variant.language == "python"]
    kernels = [c for c in cands if c.variant.language != "python"]
    assert len({c.variant.id for c in library}) >= 3, "spmm has three library variants"
    dense = next(c for c in library if c.variant.name == "cublas_dense")
    cslt = next(c for c in library if c.variant.name == "cusparselt_plan")
    torch24 = next(c for c in library if c.variant.name == "cusparselt_24")
    csr = next(c for c in library if c.variant.name == "cusparse_csr")
    assert dense.variant.baseline and cslt.variant.baseline and not csr.variant.baseline
    assert not torch24.variant.baseline
    policy = Learned(LiveModel(background=False), max_explore=8)
    others = [c for c in library if c is not dense]
    for ranked in (kernels + library, kernels + others + [dense],
                   kernels + [dense] + others[::-1]):
        explore, why = policy._anchored("spmm", "float16", {"log2_M": 10.0}, cands, ranked,
                                        tuple(kernels[:8]))
        # the model's first picks stay, the last two make room for the baselines, each
        # baseline variant's best-ranked config, in the model's order
        baselines = [c for c in dict.fromkeys(
            next(x for x in ranked if x.variant.id == c.variant.id) for c in ranked
            if c.variant.baseline)]
        assert explore == tuple(kernels[:6]) + tuple(baselines), why
        assert {c.variant.name for c in baselines} == {"cublas_dense", "cusparselt_plan"}
        assert why.count("a library's") == 2 and csr.label not in why
        assert torch24 not in explore[6:]
    # a baseline the model's picks hold already takes no slot
    explore, why = policy._anchored("spmm", "float16", {"log2_M": 10.0}, cands,
                                    kernels + library, tuple(kernels[:7]) + (dense,))
    assert explore == tuple(kernels[:6]) + (dense, cslt) and why.count("a library's") == 1
    others = [c for c in library if not c.variant.baseline]
    # an op without a baseline: the library the model ranks first
    plain = list(others)
    for c in plain:
        assert not c.variant.baseline
    explore, why = policy._anchored("spmm", "float16", {"log2_M": 10.0}, kernels + plain,
                                    kernels + plain[::-1], tuple(kernels[:8]))
    assert explore == tuple(kernels[:7]) + (plain[-1],), why
    explore, why = Learned(LiveModel(background=False), anchors=False)._anchored(
        "spmm", "float16", {"log2_M": 10.0}, cands, kernels + library, tuple(kernels[:8]))
    assert explore == tuple(kernels[:8]) and why == ""


class _Clock:
    """A monotonic clock the test moves by hand (the exploration budget's time base)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _explore_fully(policy, key, decision, time_ms):
    update = None
    for _ in range(policy.samples):
        for c in decision.explore:
            update = policy.observe(key, c, time_ms) or update
    return update


def test_a_spent_exploration_budget_defers_new_classes_and_reopens_them_later(rng,
                                                                             monkeypatch):
    from adaptive.policy import learned
    clock = _Clock()
    monkeypatch.setattr(learned.time, "monotonic", clock)
    # the host has no library candidate: stand one in (what the plain program runs)
    monkeypatch.setattr(learned, "library_candidate", lambda problem, ranked: next(
        c for c in ranked if c.variant.name == "host_numpy"))
    policy = Learned(LiveModel(background=False), max_explore=3, samples=2,
                     explore_budget=0.01, explore_burst_s=0.5)
    ctx, cands, _ = softmax_context(rng)
    first = policy.decide(ctx, cands)
    assert len(first.explore) == 3
    # 6 exploring calls of 100 ms: 0.6 s spent of a 0.5 s bucket
    assert _explore_fully(policy, ctx.key, first, 100.0).candidate == first.explore[0]
    assert policy.stats["explore_s"] == pytest.approx(0.6)
    ctx2, cands2, _ = softmax_context(rng, rows=1000, cols=40)
    deferred = policy.decide(ctx2, cands2)
    assert deferred.explore == () and policy.stats["deferred"] == 1
    assert "budget" in deferred.reason and "1%" in deferred.reason
    assert deferred.candidate.variant.name == "host_numpy"
    state = policy.state(ctx2.key)
    assert state.deferred and state.committed == deferred.candidate
    assert len(state.explore) == 3              # what it will explore, later
    # a sampled call while the bucket is still empty changes nothing
    assert policy.observe(ctx2.key, deferred.candidate, 1.0) is None
    # 5 s at 1 %: 0.05 s refilled, half the debt (0.1 s) paid: still nothing to spend
    clock.now += 5.0
    assert policy.observe(ctx2.key, deferred.candidate, 1.0) is None
    clock.now += 10.0
    reopened = policy.observe(ctx2.key, deferred.candidate, 1.0)
    assert reopened is not None and reopened.candidate == deferred.candidate
    assert set(reopened.explore) == set(state.explore) | {deferred.candidate}
    assert policy.stats["reopened"] == 1 and not state.deferred
    assert state.committed is None              # exploring now, committed after samples
    assert _explore_fully(policy, ctx2.key, reopened, 1.0) is not None
    assert state.committed is not None
    # with no library candidate there is nothing safe to serve instead: explored at once
    monkeypatch.setattr(learned, "library_candidate", lambda problem, ranked: None)
    ctx3, cands3, _ = softmax_context(rng, rows=700, cols=33)
    assert len(policy.decide(ctx3, cands3).explore) == 3
    assert policy.stats["deferred"] == 1


def test_unbounded_exploration_neither_defers_nor_spends_the_budget(rng, monkeypatch):
    from adaptive.policy import learned
    monkeypatch.setattr(learned.time, "monotonic", _Clock())
    monkeypatch.setattr(learned, "library_candidate", lambda problem, ranked: ranked[-1])
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1,
                     explore_budget=0.01, explore_burst_s=0.1)
    with adaptive.unbounded_exploration():
        for rows in (300, 600, 900):
            ctx, cands, _ = softmax_context(rng, rows=rows)
            d = policy.decide(ctx, cands)
            assert len(d.explore) == 2
            _explore_fully(policy, ctx.key, d, 500.0)
    assert policy.stats["deferred"] == 0 and policy.stats["explore_s"] == pytest.approx(3.0)
    ctx, cands, _ = softmax_context(rng, rows=1200)
    assert len(policy.decide(ctx, cands).explore) == 2    # the bucket is whole afterwards
    _explore_fully(policy, ctx.key, policy.decide(ctx, cands), 500.0)   # now spent
    ctx, cands, _ = softmax_context(rng, rows=1500)
    assert policy.decide(ctx, cands).explore == () and policy.stats["deferred"] == 1
    unbounded = Learned(LiveModel(background=False), max_explore=2, samples=1,
                        explore_budget=None)
    for rows in (300, 600):
        ctx, cands, _ = softmax_context(rng, rows=rows)
        _explore_fully(unbounded, ctx.key, unbounded.decide(ctx, cands), 1e6)
    assert unbounded.stats["deferred"] == 0


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, "1%"])
def test_the_exploration_budget_is_validated(bad):
    with pytest.raises((ValueError, TypeError), match=r"explore_budget must be a fraction "
                       r"in \(0, 1\] or None \(unbounded\), got " + repr(bad).replace(".", r"\.")):
        Learned(LiveModel(background=False), explore_budget=bad)
    with pytest.raises(ValueError, match="explore_burst_s must be > 0 seconds, got 0"):
        Learned(LiveModel(background=False), explore_burst_s=0)


def test_a_deferred_class_is_served_by_what_the_plain_program_runs():
    from types import SimpleNamespace as NS
    from adaptive.policy.learned import library_candidate

    def cand(name, language="cuda", backend="cuda", torch_library=False, torch_entry="",
             baseline=False):
        return NS(label=name, variant=NS(language=language, backend=backend,
                                         torch_library=torch_library,
                                         torch_entry=torch_entry, baseline=baseline))
    ranked = [cand("tc_mma"), cand("cublas", "python"), cand("torch_mm", "python",
                                                              torch_library=True)]
    assert library_candidate(NS(kind="torch"), ranked).label == "torch_mm"
    assert library_candidate(NS(kind="cupy"), ranked).label == "cublas"
    # a baseline (the plain program's call) wins over a better-ranked library's torch entry
    pruned = [cand("cusparselt", "python", torch_entry="cslt"),
              cand("dense", "python", baseline=True)]
    assert library_candidate(NS(kind="torch"), pruned).label == "dense"
    assert library_candidate(NS(kind="numpy"), [cand("host_numpy", "python", "host")]) is None


def test_drift_is_measured_against_the_steady_samples_not_the_explored_ones(rng):
    """Explored samples queue behind a hold; steady ones on an idle GPU also read the
    launch latency (2x here on a short kernel): that alone is no drift, 2x more is."""
    ctx, cands, _ = softmax_context(rng)
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1, drift_window=3,
                     drift_ratio=1.5, explore_budget=None)
    d = policy.decide(ctx, cands)
    a, b = d.explore
    policy.observe(ctx.key, a, 0.010)
    assert policy.observe(ctx.key, b, 0.030).candidate == a
    for t in (0.021, 0.019, 0.020, 0.022, 0.018, 0.021):       # steady: 2x the explored
        assert policy.observe(ctx.key, a, t) is None
    assert policy.state(ctx.key).steady_ms == pytest.approx(0.020)
    assert policy.stats["drifts"] == 0
    assert policy.observe(ctx.key, a, 0.041) is None
    out = policy.observe(ctx.key, a, 0.043)                      # median 0.041: 2x steady
    assert out is not None and set(out.explore) == {a, b} and policy.stats["drifts"] == 1
    assert "steady 0.02 ms" in out.reason


def test_a_drift_met_with_the_budget_spent_re_explores_later(rng, monkeypatch):
    from adaptive.policy import learned
    clock = _Clock()
    monkeypatch.setattr(learned.time, "monotonic", clock)
    ctx, cands, _ = softmax_context(rng)
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1, drift_window=1,
                     drift_ratio=1.5, explore_budget=0.01, explore_burst_s=0.1)
    d = policy.decide(ctx, cands)
    a, b = d.explore
    policy.observe(ctx.key, a, 100.0)
    policy.observe(ctx.key, b, 300.0)                  # 0.4 s spent of the 0.1 s bucket
    assert policy.observe(ctx.key, a, 100.0) is None   # the steady baseline
    assert policy.observe(ctx.key, a, 400.0) is None   # drift, but nothing to spend
    state = policy.state(ctx.key)
    assert policy.stats["drifts"] == 1 and state.deferred and state.committed == a
    assert "deferred" in state.reason
    clock.now += 60.0                                  # 0.6 s refilled: the debt is paid
    out = policy.observe(ctx.key, a, 400.0)
    assert out is not None and set(out.explore) == {a, b} and policy.stats["reopened"] == 1



def _contended(rng, idle_ms: dict, loaded_ms: dict, race_ratio: float = 1.3,
               settle_margin: float | None = 0.02):
    """A dispatcher on a fake GPU (:func:`_EventHost`) whose candidates' times follow a
    simulated co-running load (``be.loaded``), cold-exploring three candidates named
    a, b, c here; every call sampled and its events finished at once. Returns the fake,
    ``calls_until(name, limit)`` (launch until the key is committed to ``name``: how many
    calls that took) and the policy."""
    from adaptive.backends.host import HostBackend
    be = _EventHost()
    be.loaded = False
    x = rng.standard_normal((96, 64)).astype(np.float32)
    policy = Learned(LiveModel(background=False), max_explore=3, samples=3, drift_window=4,
                     explore_budget=None, revalidate_every=8, race_ratio=race_ratio,
                     settle_margin=settle_margin)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    d.decide_off_thread = False   # the calls are counted from the miss on
    a, b, c = _diverse(d.candidates("softmax", x))[:3]
    names = {a.label: "a", b.label: "b", c.label: "c"}

    def prepare(candidate, problem, op):
        fn = HostBackend.prepare(be, candidate, problem, op)

        def run(args, out):
            fn(args, out)
            name = names.get(candidate.label)
            be.clock += (loaded_ms if be.loaded else idle_ms).get(name, 50.0)
        return run
    be.prepare = prepare
    key = OPS["softmax"].key((x,), {})

    def calls_until(name: str, limit: int) -> int:
        for n in range(1, limit + 1):
            d.launch("softmax", x)
            be.finish()
            plan = d._plans[key]
            if not plan.provisional and names.get(plan.candidate.label) == name:
                return n
        raise AssertionError(f"not committed to {name} after {limit} calls: "
                             + "; ".join(policy.state(plan.class_key).history))
    return be, calls_until, policy


def test_a_co_running_load_re_ranks_by_drift_and_the_choice_recovers_when_it_leaves(rng):
    """Idle: a is fastest. Under load a slows 2.5x and b only 1.3x, so b is: a drift of
    a re-ranks within a bounded number of calls. When the load leaves, b speeds up by too
    little to read as a drift: the re-validation that a drift's change of choice
    schedules brings a back, and under a lasting load re-validations grow rarer."""
    be, calls_until, policy = _contended(rng, idle_ms={"a": 1.0, "b": 1.4, "c": 3.0},
                                         loaded_ms={"a": 2.5, "b": 1.8, "c": 6.0})
    # 3 candidates x (a warm-up turn + 3 samples), then a; a re-exploration of the class
    # later warms up nothing again
    assert calls_until("a", 15) <= 13
    for _ in range(20):
        assert calls_until("a", 1) == 1               # steady on a: no drift while idle
    assert policy.stats["drifts"] == 0 and policy.stats["revalidations"] == 0
    be.loaded = True
    # the drift window (4 samples) sees the slowdown, then 3 candidates x 3 samples
    assert calls_until("b", 30) <= 4 + 9 + 1
    assert policy.stats["drifts"] == 1 and policy.stats["drift_switches"] == 1
    be.loaded = False
    # b's 1.8 -> 1.4 ms stays within the drift ratio: re-validated after 8 samples
    assert calls_until("a", 40) <= 8 + 9 + 1
    assert policy.stats["drifts"] == 1 and policy.stats["revalidations"] == 1
    assert "re-validating" in "; ".join(next(iter(policy.keys.values())).history)
    be.loaded = True
    calls_until("b", 30)
    before = policy.stats["revalidations"]
    for _ in range(1000):                             # a lasting load: b holds
        if policy.stats["revalidations"] - before == 6:
            break
        assert calls_until("b", 10) <= 10
    history = next(iter(policy.keys.values())).history
    intervals = [int(h.split(" after ")[1].split()[0]) for h in history
                 if h.startswith("re-validating")]
    assert intervals[-6:] == [8, 16, 32, 64, 128, 128]   # doubling, up to 16x


def test_a_candidate_the_leader_leaves_behind_is_explored_no_further(rng):
    """race_ratio: once a candidate is timed twice, one whose fastest sample is over
    2x the leader's median stops being explored (the class rotates over the rest from
    the decision the policy hands back) and the commit waits for the rest only; the first
    explored candidate is never left behind, whatever its time; a re-exploration times
    every candidate again."""
    ctx, cands, _ = softmax_context(rng)
    policy = Learned(LiveModel(background=False), settle_margin=None, max_explore=4,
                     samples=3, drift_window=3, drift_ratio=1.5, clear_margin=None,
                     race_ratio=2.0)
    d = policy.decide(ctx, cands)
    e0, e1, e2, e3 = d.explore
    times = {e0: 5.0, e1: 0.5, e2: 3.0, e3: 0.55}   # e0 (first) slow too: kept all the same
    assert [policy.observe(ctx.key, c, times[c]) for c in d.explore] == [None] * 4
    assert policy.observe(ctx.key, e0, times[e0]) is None   # leader e0 5.0: bar 10
    raced = policy.observe(ctx.key, e1, times[e1])           # leader e1 0.5: bar 1.0
    # the fastest so far serves a failing call
    assert raced is not None and raced.explore == (e0, e1, e3) and raced.candidate == e1
    state = policy.state(ctx.key)
    assert state.observed[e2].raced and not state.observed[e0].raced
    assert "left behind" in raced.reason and e2.label in raced.reason
    assert policy.observe(ctx.key, e2, 3.1) is None          # a late sample: counted only
    assert policy.observe(ctx.key, e3, times[e3]) is None
    narrowed = policy.observe(ctx.key, e0, times[e0])        # e0 has its 3 samples
    assert narrowed.explore == (e1, e3) and narrowed.candidate == e1
    assert policy.observe(ctx.key, e1, times[e1]).explore == (e3,)
    commit = policy.observe(ctx.key, e3, times[e3])
    assert commit is not None and commit.candidate == e1 and not commit.explore
    assert state.explored == {e0: 3, e1: 3, e2: 2, e3: 3}
    assert "(left behind)" in state.history[-1] and state.committed == e1
    for t in (0.5, 0.5, 0.5, 2.0, 2.0, 2.0):                 # a drift re-explores all four
        out = policy.observe(ctx.key, e1, t)
        if out is not None:
            break
    assert out is not None and set(out.explore) == {e0, e1, e2, e3}
    assert not any(state.observed[c].raced for c in out.explore)
    with pytest.raises(ValueError, match="race_ratio must be > 1 or None"):
        Learned(LiveModel(background=False), race_ratio=1.0)


def test_the_baseline_is_left_behind_only_on_two_samples_over_one_and_a_half_bars():
    """The baseline (what the plain program runs; explored first) stops being explored
    once two of its samples are over 1.5 race bars (1.5 x race_ratio x the leader's
    median): SDPA from CuPy at 3.3x a flash kernel took all its samples at twice the bar
    (run S138). One sample is not enough (it may have met interference), nor two under
    1.5 bars; another first-explored candidate is never left behind, and any other goes
    on the bar itself."""
    from collections import namedtuple
    from types import SimpleNamespace as NS
    from adaptive.policy.learned import BASELINE_RACE_FACTOR, Samples
    assert BASELINE_RACE_FACTOR == 1.5
    Variant, Cand = namedtuple("Variant", "baseline"), namedtuple("Cand", "label variant")

    def cand(name, baseline=False):
        return Cand(name, Variant(baseline))

    def raced(explore, times, race_ratio=2.0):
        policy = Learned(LiveModel(background=False), samples=3, race_ratio=race_ratio,
                         clear_margin=None)
        state = NS(explore=explore, observed={c: Samples(times[c]) for c in explore},
                   refining=())
        return {c.label for c in policy._race(state)}
    base, lead, other = cand("sdpa", baseline=True), cand("flash"), cand("flash2")
    explore = (base, lead, other)
    # leader 1.0 (timed twice): the bar 2.0, 1.5 bars 3.0
    assert raced(explore, {base: (5.0,), lead: (1.0, 1.0), other: (2.5,)}) == {"flash2"}
    assert raced(explore, {base: (3.3, 3.1), lead: (1.0, 1.0), other: (1.5,)}) == {"sdpa"}
    assert raced(explore, {base: (5.0, 2.9), lead: (1.0, 1.0), other: (1.5,)}) == set()
    assert raced(explore, {base: (2.5, 2.5), lead: (1.0, 1.0), other: (1.5,)}) == set()
    # the baseline not first: the same rule
    assert raced((lead, base), {base: (3.2, 3.2), lead: (1.0, 1.0)}) == {"sdpa"}
    # a first-explored candidate that is no baseline: never
    first = cand("reg_row")
    assert raced((first, lead), {first: (9.0, 9.0), lead: (1.0, 1.0)}) == set()
    # race_ratio None: nothing is left behind by the bar, the baseline included
    assert raced(explore, {base: (50.0, 50.0), lead: (1.0, 1.0), other: (9.0,)},
                 race_ratio=None) == set()


def test_samples_clear_of_the_leader_end_a_candidates_exploration(rng):
    """clear_margin: a candidate timed twice whose every sample is over (1 + margin) x the
    leader's slowest is timed no further, and the leader, timed twice, is committed once
    the others are; candidates whose samples overlap the leader's get all their samples.
    The first explored candidate and the baseline are never left behind this way."""
    ctx, cands, _ = softmax_context(rng)
    policy = Learned(LiveModel(background=False), settle_margin=None, max_explore=4,
                     samples=3, race_ratio=None, clear_margin=0.05)
    d = policy.decide(ctx, cands)
    e0, e1, e2, e3 = d.explore
    assert not any(c.variant.baseline for c in (e1, e2, e3))
    base = {e0: 1.30, e1: 1.00, e2: 1.04, e3: 1.20}   # e2 within 5% of e1, e3 clear of it
    wobble = {e0: (1.0, 1.01), e1: (1.0, 1.02), e2: (1.01, 0.99), e3: (1.0, 1.01)}
    for i in range(2):
        out = [policy.observe(ctx.key, c, base[c] * wobble[c][i]) for c in d.explore]
    state = policy.state(ctx.key)
    # leader e1, slowest sample 1.02: e3's samples (1.20, 1.212) are clear of 1.071, e2's
    # (1.0504, 1.0296) are not; e0 (the first) is kept whatever its time
    assert state.observed[e3].raced and not state.observed[e2].raced
    assert not state.observed[e0].raced
    assert out[-1].explore == (e0, e1, e2) and out[-1].candidate == e1
    assert "left behind" in out[-1].reason and "1.05x the leader's slowest" in out[-1].reason
    commit = None
    for c in (e0, e1, e2):
        commit = policy.observe(ctx.key, c, base[c])
    assert commit.candidate == e1 and not commit.explore
    assert state.explored == {e0: 3, e1: 3, e2: 3, e3: 2}
    # all clear of the leader: its two samples are enough
    policy2 = Learned(LiveModel(background=False), settle_margin=None, max_explore=4,
                      samples=3, race_ratio=None, clear_margin=0.05)
    d2 = policy2.decide(ctx, cands)
    f0, f1, f2, f3 = d2.explore
    far = {f0: 1.0, f1: 2.0, f2: 2.1, f3: 1.9}
    outs = [policy2.observe(ctx.key, c, far[c]) for _ in range(2) for c in d2.explore]
    assert outs[-1] is not None and outs[-1].candidate == f0 and not outs[-1].explore
    assert policy2.state(ctx.key).explored == {f0: 2, f1: 2, f2: 2, f3: 2}
    with pytest.raises(ValueError, match="clear_margin must be a fraction >= 0 or None"):
        Learned(LiveModel(background=False), clear_margin=-0.01)


def test_median_bounds_enclose_every_completion_of_the_samples(rng):
    """The least and most a median of ``total`` timings can reach with ``count`` known:
    attained by the rest all tiny or all huge, and every other completion lies between."""
    from adaptive.policy.learned import _median_bounds
    for _ in range(300):
        total = int(rng.integers(1, 8))
        count = int(rng.integers(1, total + 1))
        known = list(rng.uniform(0.5, 2.0, count))
        low, high = _median_bounds(known, count, total)
        for fill in [1e-9, 1e9, *rng.uniform(0.1, 3.0, 5)]:
            m = float(np.median(known + [fill] * (total - count)))
            assert low - 1e-12 <= m <= high + 1e-12, (known, total, low, high, m)
        rest = total - count   # attained: the rest all tiny reaches low, all huge high
        assert float(np.median(known + [1e-9] * rest)) == pytest.approx(low, abs=1e-8)
        huge = float(np.median(known + [1e9] * rest))
        assert huge == pytest.approx(high) if high < 1e8 else huge >= 5e8
    assert _median_bounds([1.0, 1.1], 2, 3) == (1.0, 1.1)   # a third sample: between them
    assert _median_bounds([1.0], 1, 3) == (0.0, math.inf)
    assert _median_bounds([1.0, 1.1, 5.0], 3, 3) == (1.1, 1.1)


def test_a_commit_decided_within_the_settle_margin_skips_the_last_samples(rng):
    """settle_margin: once every explored candidate is timed twice and no third sample
    could bring another's median within 2% of the leader's, the leader is committed on two
    samples each; where their samples interleave, or a noisy candidate's extra samples
    could still undercut the leader, every sample is taken."""
    ctx, cands, _ = softmax_context(rng)

    def explore(feed, **kwargs):
        policy = Learned(LiveModel(background=False), max_explore=2, samples=3,
                         race_ratio=None, clear_margin=None, **kwargs)
        a, b = policy.decide(ctx, cands).explore
        out = None
        for name, t in feed:
            out = policy.observe(ctx.key, {"a": a, "b": b}[name], t) or out
            if out is not None and not out.explore:
                break
        state = policy.state(ctx.key)
        return out, {"ab"[i]: state.explored[c] for i, c in enumerate((a, b))}, policy
    apart = [("a", 1.0), ("b", 1.20), ("a", 1.01), ("b", 1.25), ("a", 1.0), ("b", 1.2)]
    out, explored, policy = explore(apart)
    assert explored == {"a": 2, "b": 2} and policy.stats["settled"] == 1
    assert dict(out.observed_ms)[out.candidate.label] == pytest.approx(1.005)
    assert "settled" in out.reason and "2%" in out.reason
    # off: every candidate its three samples
    out, explored, policy = explore(apart, settle_margin=None)
    assert explored == {"a": 3, "b": 3} and policy.stats["settled"] == 0
    # interleaved: a (1.0, 1.08) median 1.04, b (1.03, 1.04) median 1.035 leads, and a's
    # third sample could still bring its median to 1.0; b's third (1.035) does not settle
    # it either: a's third sample is taken, and the medians decide
    out, explored, _ = explore([("a", 1.0), ("b", 1.03), ("a", 1.08), ("b", 1.04),
                                ("b", 1.035), ("a", 1.01)])
    assert explored == {"a": 3, "b": 3} and "settled" not in out.reason
    assert dict(out.observed_ms)[out.candidate.label] == pytest.approx(1.01)
    # a noisy candidate (median 6x its fastest, noise_ratio 2) may be timed again, and its
    # fastest sample is under b's: not settled while more samples could undercut b
    out, explored, _ = explore([("a", 0.05), ("b", 0.2), ("a", 0.3), ("b", 0.21),
                                ("a", 0.31), ("b", 0.19), ("a", 0.3)])
    assert explored["a"] >= 4 and explored["b"] == 3
    with pytest.raises(ValueError, match="settle_margin must be a fraction >= 0 or None"):
        Learned(LiveModel(background=False), settle_margin=-0.01)


def test_a_candidate_whose_samples_disagree_is_timed_again_before_the_commit(rng):
    """noise_ratio: a candidate whose median is over 2x its own fastest sample (two of its
    three samples met interference, as cuBLAS's 0.19, 2.04 and 1.40 ms in run S113) is
    timed again, a call at a time, up to twice ``samples``; its median then decides. A
    candidate still noisy at twice ``samples`` is judged on what it has, and one whose
    fastest sample is slower than another's median is not timed again."""
    ctx, cands, _ = softmax_context(rng)

    def explored(noise_ratio, first, second_extra=()):
        policy = Learned(LiveModel(background=False), settle_margin=None, max_explore=2, samples=3,
                         race_ratio=None, clear_margin=None, noise_ratio=noise_ratio)
        d = policy.decide(ctx, cands)
        a, b = d.explore
        out = None
        for ta, tb in zip(first, (0.30, 0.30, 0.30)):
            out = policy.observe(ctx.key, a, ta) or out
            out = policy.observe(ctx.key, b, tb) or out
        if second_extra:   # the class's calls now rotate over the noisy one alone
            assert out is not None and out.explore == (a,) and not out.observed_ms
        for t in second_extra:
            out = policy.observe(ctx.key, a, t)
        return policy.state(ctx.key), out, a, b
    state, out, a, b = explored(None, (0.10, 2.00, 1.40))        # off: the median decides
    assert state.committed == b and out.candidate == b
    state, out, a, b = explored(2.0, (0.10, 2.00, 1.40), (0.10, 0.11))   # 5 samples
    assert state.committed == a and out.candidate == a and state.explored[a] == 5
    assert state.explored[b] == 3
    state, out, a, b = explored(2.0, (0.10, 2.00, 1.40), (2.1, 1.9, 0.1))   # 6: the cap
    assert state.committed == b and state.explored[a] == 6
    # noisy, but its fastest (0.40) is slower than b's median (0.30): more samples could
    # only bring its median down to 0.40, so none is taken and b is committed at once
    state, out, a, b = explored(2.0, (0.40, 2.00, 1.40))
    assert state.committed == b and out.candidate == b and state.explored[a] == 3
    with pytest.raises(ValueError, match="noise_ratio must be > 1 or None"):
        Learned(LiveModel(background=False), noise_ratio=1.0)


def _count_runs(be) -> dict:
    """label -> runs of that candidate on the fake ``be`` from now on (its prepare wrapped)."""
    runs, real = {}, be.prepare

    def counted(candidate, problem, op):
        fn = real(candidate, problem, op)

        def run(args, out):
            runs[candidate.label] = runs.get(candidate.label, 0) + 1
            return fn(args, out)
        return run
    be.prepare = counted
    return runs


def test_a_class_stops_running_the_candidate_left_behind(rng):
    """Through the dispatcher: c (3x a's time) is left behind once a is timed twice, and
    the class's calls stop running it; the commit is the same as timing it fully."""
    be, calls_until, policy = _contended(rng, idle_ms={"a": 1.0, "b": 1.4, "c": 3.0},
                                         loaded_ms={"a": 1.0, "b": 1.4, "c": 3.0})
    runs = _count_runs(be)
    assert calls_until("a", 15) <= 11
    state = next(iter(policy.keys.values()))
    by_time = sorted(runs.items(), key=lambda kv: kv[1])
    assert by_time[0][1] <= 3 < by_time[-1][1]   # c: its warm-up and at most two samples
    assert sum(state.explored.values()) < 9      # three candidates x three samples, less


def test_a_class_stops_running_a_candidate_clear_of_the_leader(rng):
    """Through the dispatcher (events harvested a call late, a warm-up turn each): c,
    every sample 1.5x a's, is clear of the leader after its second sample and runs no
    more; a and b, 2% apart, are timed fully and the commit is a, after no more calls
    than three samples each would take. (The race bar at 2x: c under it, the clear margin
    is what stops it.)"""
    be, calls_until, policy = _contended(rng, idle_ms={"a": 1.0, "b": 1.02, "c": 1.5},
                                         loaded_ms={"a": 1.0, "b": 1.02, "c": 1.5},
                                         race_ratio=2.0, settle_margin=None)
    runs = _count_runs(be)
    assert calls_until("a", 15) <= 3 + 3 * 3 + 1   # warm-ups, samples, the harvest's lag
    state = next(iter(policy.keys.values()))
    c = next(c for c in state.explore if state.observed[c].raced)
    assert state.explored[c] == 2 and list(state.observed[c]) == [1.5, 1.5]
    assert runs[c.label] == 1 + 2   # its warm-up (its variant seeded by b's) and 2 samples
    assert all(state.explored[o] >= 3 for o in state.explore if o != c)
    assert f"{c.label} n=2 median 1.5 min 1.5 (left behind)" in state.history[-1]


def test_a_drift_that_keeps_the_choice_schedules_no_re_validation(rng):
    """Every candidate 2x slower (a clock drop): the drift re-explores once and keeps a;
    a key whose choice no drift changed costs no further exploring."""
    be, calls_until, policy = _contended(rng, idle_ms={"a": 1.0, "b": 1.4, "c": 3.0},
                                         loaded_ms={"a": 2.0, "b": 2.8, "c": 6.0})
    calls_until("a", 15)       # each candidate's first turn a warm-up, then 3 samples
    for _ in range(8):
        calls_until("a", 1)
    be.loaded = True
    for _ in range(200):
        calls_until("a", 12)
    assert policy.stats["drifts"] == 1 and policy.stats["drift_switches"] == 0
    assert policy.stats["revalidations"] == 0


@pytest.mark.parametrize("quick_cost, kept", [(0.98, True), (0.90, False)])
@pytest.mark.usefixtures("decided_on_the_miss")
def test_a_candidate_replaces_the_baseline_only_when_clearly_faster(rng, quick_cost, kept):
    """Three in-stream medians read a few percent apart: a candidate within the baseline
    margin (3%) of the plain program's call does not replace it; one 10% faster does."""
    from variant_modules import softmax_pair
    be = _EventHost()
    be.cost.update({"plain": 1.0, "quick": quick_cost})
    policy = Learned(LiveModel(background=False), max_explore=2, samples=2)
    d = Dispatcher(be, policy=policy, registry=softmax_pair())
    d.sample_every = 1
    x = rng.standard_normal((64, 33)).astype(np.float32)
    for _ in range(12):
        d.launch("softmax", x)
        be.finish()
    plan = d.plan("softmax", x)
    assert not plan.provisional
    assert plan.candidate.variant.name == ("plain" if kept else "quick")
    reason = policy.state(plan.class_key).reason
    assert ("kept the baseline plain" in reason) == kept, reason
    with pytest.raises(ValueError, match="baseline_margin must be a fraction"):
        Learned(LiveModel(background=False), baseline_margin=1.0)


def test_an_exploring_sample_is_gated_until_its_call_and_end_event_are_issued(rng):
    """Exploring samples wait behind the backend's stream gate (the cuda backend's is
    released by the host, not a fixed spin): gate, start event, the call, end event,
    release, in that order."""
    be = _EventHost()
    order = []

    def gate(stream, limit_us):
        order.append(("gate", limit_us))
        return lambda: order.append(("release", be.clock))
    be.gate = gate
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    x = rng.standard_normal((40, 24)).astype(np.float32)
    d.launch("softmax", x)
    d.launch("softmax", x)     # the two candidates' warm-up turns: not timed, not gated
    assert order == []
    d.launch("softmax", x)
    assert [o[0] for o in order] == ["gate", "release"] and order[0][1] == HOLD_US
    # the release comes after the call ran (its cost on the fake clock) and its end event
    assert order[1][1] == be.recorded[-1].t > be.recorded[-2].t


def _past_gate_exploration(rng, stall):
    """A class of 3 candidates explored on the fake event host (1 sample each; costs 1.0,
    1.25 and 1.5 ms) whose gate runs out after its hold, the fastest one's gated calls
    issued in ``stall(n)`` seconds (n: its gated calls so far, from 1). Returns the
    dispatcher, the policy's state at the commit and the fastest candidate."""
    be = _EventHost()
    be.gate_expires = True
    policy = Learned(LiveModel(background=False), max_explore=3, samples=1,
                     clear_margin=None, race_ratio=None, explore_budget=None,
                     settle_margin=None)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    x = rng.standard_normal((52, 31)).astype(np.float32)
    ref = OPS["softmax"].reference(x)
    plan = d.plan("softmax", x)
    explore = policy.state(plan.class_key).explore
    assert len(explore) == 3
    for i, c in enumerate(explore):
        be.cost[c.label] = 1.0 + 0.25 * i
    fastest, gated = explore[0], [0]

    def issuing():
        if not be.gated:
            return 0.0
        gated[0] += 1
        return stall(gated[0])
    be.issue_s[fastest.label] = issuing
    for _ in range(30):
        np.testing.assert_allclose(d.launch("softmax", x), ref, rtol=1e-5, atol=1e-6)
        be.finish()
        if not d.plan("softmax", x).provisional:
            break
    state = policy.state(plan.class_key)
    assert state.committed is not None, "; ".join(state.history)
    return d, state, fastest


@pytest.mark.usefixtures("no_collections")   # (a collection inside an issuing reads long)
def test_an_exploring_sample_read_past_its_gate_is_dropped_and_timed_again(rng):
    """An exploring sample whose call the host took longer to issue than the gate's hold
    (a background refit holding the interpreter, a collection) is read with the host's
    delay: the gate runs out and the device waits for the late kernels inside the pair
    (an H100's cold decode read SDPA at 0.93 ms for 0.16 of device time and committed a
    kernel at 2.76x the best). The sample is dropped, counted and noted in the key's
    history, and the candidate is timed again: the class commits the fastest."""
    d, state, fastest = _past_gate_exploration(rng, lambda n: 0.004 if n == 1 else 0.0)
    assert state.committed == fastest, "; ".join(state.history)
    assert list(state.observed[fastest]) == [pytest.approx(1.0)]
    assert d.stats["samples_past_gate"] == 1
    [line] = [h for h in state.history if "read past its gate" in h]
    assert fastest.label in line and "the gate holds 1 ms" in line
    issued = re.search(r"issued in ([0-9.]+) ms", line)
    assert issued and float(issued.group(1)) >= 4.0, line    # the 4 ms stall, or more


@pytest.mark.usefixtures("no_collections")
def test_a_candidate_read_past_its_gate_every_time_is_retimed_only_so_often(rng):
    """A candidate whose every gated call outlasts the hold is dropped at most
    PAST_GATE_RETRIES times in an exploration, then its reading counts: the exploration
    ends. A variant that issues slowly by nature (its warm-up seeds a slow issuing) is
    never dropped."""
    d, state, fastest = _past_gate_exploration(rng, lambda n: 0.004)
    assert d.stats["samples_past_gate"] == PAST_GATE_RETRIES
    assert state.committed != fastest                 # its reading holds the stall
    assert list(state.observed[fastest])[0] > 3.0
    be = _EventHost()
    be.gate_expires = True
    policy = Learned(LiveModel(background=False), max_explore=3, samples=1,
                     race_ratio=None, explore_budget=None)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    x = rng.standard_normal((52, 31)).astype(np.float32)
    for c in policy.state(d.plan("softmax", x).class_key).explore:
        be.issue_s[c.label] = 0.004            # every call, the seeds too
    for _ in range(8):
        d.launch("softmax", x)
        be.finish()
    assert not d.plan("softmax", x).provisional and d.stats["samples_past_gate"] == 0


def test_each_candidates_first_turn_is_a_warm_up_that_seeds_its_issuing(rng):
    """On a device timed by events a candidate's first call loads its module (a library:
    runs its heuristics for the shape), 12-15 ms of device time for a 10 us kernel on the
    H200 (run S31): each explored candidate's first turn in a class serves the call
    untimed, and the first time a variant is explored, two more runs back to back seed
    the least issuing charged to it. Its samples start on the next turn."""
    be = _EventHost()
    be.idle = True
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    x = rng.standard_normal((37, 29)).astype(np.float32)
    ref = OPS["softmax"].reference(x)
    plan = d.plan("softmax", x)
    a, b = policy.state(plan.class_key).explore[:2]
    be.issue_s.update({a.label: 0.002, b.label: 0.004})   # host issuing, 2 and 4 ms
    for _ in range(2):
        np.testing.assert_allclose(d.launch("softmax", x), ref, rtol=1e-5, atol=1e-6)
    state = policy.state(plan.class_key)
    assert all(len(state.observed.get(c, ())) == 0 for c in (a, b))   # nothing sampled
    assert be.recorded == [] and len(be.holds) == 0                   # no pair, no gate
    charges = d.issue_charges()      # per variant: its configs issue alike
    assert set(charges) == {f"{c.variant.id}/numpy" for c in (a, b)}
    for c in (a, b):
        n, least = charges[f"{c.variant.id}/numpy"]
        assert n == 1 and least >= min(be.issue_s[o.label] for o in (a, b)
                                       if o.variant.id == c.variant.id) * 1e3
    for _ in range(2):
        d.launch("softmax", x)
    be.finish()
    d.harvest()
    state = policy.state(plan.class_key)
    assert all(len(state.observed[c]) == 1 for c in (a, b))
    assert not d.plan("softmax", x).provisional



@pytest.mark.usefixtures("no_collections")   # (a full suite once read 12 ms for a 1 ms call)
def test_the_issuing_seed_reads_past_a_librarys_first_calls_of_a_shape(rng):
    """cuBLAS issues a new shape's first calls slowly while its heuristics run (run S72,
    H200, CuPy arrays: calls 2 to 8 in 80-155, 23-32, then 16-23 us, against 17-19 us
    held). The seed is the least of ISSUE_SEED_RUNS back-to-back runs after the warm-up
    call, so it reads the settled issuing, not the third call's."""

    class Settling(dict):   # each label's issuings in call order, then the last for good:
        def get(self, label, default=0.0):   # 20 ms for its first four calls, then 1 ms
            seq = self.setdefault(label, [0.020] * 4 + [0.001])
            return seq.pop(0) if len(seq) > 1 else seq[0]
    be = _EventHost()
    be.idle = True
    be.issue_s = Settling()
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    x = rng.standard_normal((37, 29)).astype(np.float32)
    plan = d.plan("softmax", x)
    explored = policy.state(plan.class_key).explore[:2]
    for _ in range(2):      # each candidate's first turn: the warm-up call and the seed
        d.launch("softmax", x)
    for c in explored:
        n, least = d.issue_charges()[f"{c.variant.id}/numpy"]
        # the fifth call onwards issue in 1 ms: the seed reaches it (two runs read only
        # 20 ms calls; the margin is for a sleep's overshoot on a busy machine: 4.2 ms
        # seen in a full suite)
        assert n == 1 and 1.0 <= least < 10.0, (c.label, least)
        assert d.issue_windows_ms()[f"{c.variant.id}/numpy"] == (least,)   # the window itself

@pytest.mark.usefixtures("no_collections")
def test_the_issuing_window_is_seeded_in_a_variants_first_three_input_classes(rng):
    """One seed read at a bad moment would stay the least of the window (samples only read
    higher): a variant's first turn in each of the first ISSUE_SEEDS input classes of its
    kind where it is explored seeds it, later classes do not. ``host_numpy`` is explored
    on four input classes; its runs issue in 18, 10, 4 and 1 ms within its first turn on
    each (where the seed's runs are) and 24 ms elsewhere (its samples): the window's least
    is the third class's seed. (The bounds leave a sleep's overshoot on a busy machine 6-8
    ms: 4.2 ms was seen in a full suite.)"""
    from adaptive import dispatch

    class Issuing(dict):   # a label's runs within the launch of its first call in a class
        launch, now, first = 0, 0.0, {}

        def get(self, label, default=0.0):
            first = self.first.setdefault(label, self.launch)
            return self.now if first == self.launch else 0.024
    be = _EventHost()
    be.issue_s = Issuing()
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    least = []
    for now, shape in zip((0.018, 0.010, 0.004, 0.001), [(37, 29), (70, 3), (9, 9), (300, 29)]):
        be.issue_s.now, be.issue_s.first = now, {}
        x = rng.standard_normal(shape).astype(np.float32)
        state = policy.state(d.plan("softmax", x).class_key)
        assert "host_numpy" in [c.label for c in state.explore] and len(state.explore) > 1
        for _ in range(len(state.explore) * 2):   # every candidate's first turn and more
            be.issue_s.launch += 1
            d.launch("softmax", x)
            be.finish()
        d.harvest()
        least.append(d.issue_charges()["softmax/host_numpy/numpy"][1])
    assert dispatch.ISSUE_SEEDS == 3
    # each of the first three classes lowered the least to its seed; the fourth did not
    assert 18.0 <= least[0] < 24 and 10.0 <= least[1] < 18 and 4.0 <= least[2] < 10, least
    assert least[3] == least[2], least


@pytest.mark.usefixtures("no_collections")
@pytest.mark.parametrize("floor", ["window", "seeded"])
def test_a_familys_seed_stays_its_floor_where_the_issue_floor_is_seeded(rng, floor):
    """A seed is read back to back; an exploring sample only ever reads higher, so a
    family explored more often than another loses its seed from the window first and is
    charged more for the same host work (run S181, H100: flash_wgmma's family 15-16 us
    against flash2_ksplit_mma's seed of 8.5 us). Under ``issue_floor`` "seeded" the least
    charged is taken over the window and the family's seeds: a seed of 2 ms outlives
    ISSUE_WINDOW later issuings of 6 ms; under "window" (the default) it does not."""
    from adaptive.dispatch import ISSUE_WINDOW
    be = _EventHost()
    be.idle = True
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1)
    d = Dispatcher(be, policy=policy)
    d.issue_floor = floor
    d.sample_every = 1
    x = rng.standard_normal((37, 29)).astype(np.float32)
    plan = d.plan("softmax", x)
    a = policy.state(plan.class_key).explore[0]
    be.issue_s[a.label] = 0.002                      # its seed's runs: 2 ms each
    d.launch("softmax", x)                           # a's first turn: the warm-up, the seed
    family = f"{a.variant.id}/numpy"
    n, seed = d.issue_charges()[family]
    assert n == 1 and 2.0 <= seed < 6.0, seed   # (the margin: a sleep's overshoot)
    charged = []
    policy.observe = lambda key, cand, ms: charged.append(ms)   # decides nothing
    pa = dataclasses.replace(plan, candidate=a, epoch=None)     # no exploration's hold
    for _ in range(ISSUE_WINDOW):
        d.feedback(pa, 1.0, 6.0)
    n, least = d.issue_charges()[family]
    assert n == ISSUE_WINDOW
    if floor == "seeded":
        assert least == seed and charged[-1] == pytest.approx(1.0 + seed)
    else:
        assert least == 6.0 and charged[-1] == pytest.approx(7.0)


def _fast_and_slow(rng, be, rule: str, fast_ms: float, slow_ms: float, issue_s: float,
                   pre_ms: float = 0.0):
    """Two softmax candidates explored once each on the fake event host ``be``: the first
    explored (``fast``) runs ``fast_ms`` on the device after ``issue_s`` of host issuing
    (``pre_ms`` of it before its kernels' launch, on the fake clock), the other
    ``slow_ms``; the dispatcher charges issuing by ``rule``. Returns the dispatcher, the
    input, the class's state, both candidates and the times its recorder saw."""
    policy = Learned(LiveModel(background=False), max_explore=2, samples=1)
    d = Dispatcher(be, policy=policy)
    d.issue_charge = rule
    d.sample_every = 1
    timed = []
    d.add_recorder(type("R", (), {"wraps_launches": False,
                                  "timed": lambda self, plan, ms: timed.append(ms)})())
    x = rng.standard_normal((33, 50)).astype(np.float32)
    plan = d.plan("softmax", x)
    fast, slow = policy.state(plan.class_key).explore[:2]
    be.cost.update({fast.label: fast_ms, slow.label: slow_ms})   # device ms, fake clock
    be.issue_s[fast.label] = issue_s
    be.pre[fast.label] = pre_ms
    for _ in range(4):
        d.launch("softmax", x)
        be.finish()
    d.harvest()
    return d, x, policy.state(plan.class_key), fast, slow, timed


@pytest.mark.parametrize("device_waits", [False, True])
def test_the_host_issuing_is_charged_where_the_device_waited_for_it(rng, device_waits):
    """An exploring sample costs its device time where the device had work queued, and
    the host's issuing too where the device was idle (a host-bound loop): a candidate
    with faster kernels but a 6 ms issue is committed only in the first case. Recorders
    see the device time either way."""
    be = _EventHost()
    be.idle = device_waits
    d, x, state, fast, slow, timed = _fast_and_slow(rng, be, "sum", 1.0, 1.5, 0.006)
    assert not d.plan("softmax", x).provisional
    assert state.committed == (slow if device_waits else fast), state.reason
    charged = min(state.observed[fast])
    assert (charged >= 7.0) if device_waits else charged == pytest.approx(1.0)
    assert min(timed) == pytest.approx(1.0) and max(timed) == pytest.approx(1.5)
    # the commit's history names what each candidate was charged, where it was host-bound:
    # the device's time and the issuing apart, fastest charged first
    notes = [h for h in state.history if h.startswith("charged (a host-bound class")]
    assert len(notes) == (1 if device_waits else 0), state.history
    if device_waits:
        parts = re.findall(r"(\S+) ([0-9.]+) = device ([0-9.]+) \+ issuing ([0-9.]+) \(n=1\)",
                           notes[0])
        assert [p[0] for p in parts] == [slow.label, fast.label], notes[0]
        by = {p[0]: [float(v) for v in p[1:]] for p in parts}
        assert by[fast.label][1] == pytest.approx(1.0, rel=1e-3)
        assert by[fast.label][2] >= 6.0 and by[slow.label][1] == pytest.approx(1.5, rel=1e-3)
        for total, device, issuing in by.values():
            assert total == pytest.approx(device + issuing, rel=1e-3)


@pytest.mark.parametrize("clock", ["wall", "thread"])
@pytest.mark.parametrize("spin", [False, True])
def test_the_thread_clock_charges_the_issuing_threads_work_not_its_waits(rng, clock, spin):
    """In a host-bound class, the issuing charged is read on the issue clock. On the wall
    clock a sample pays whatever delayed its call, the interpreter held by another thread
    (a background refit) as much as the issuing's own work. On
    the thread clock only the issuing thread's CPU time is charged: a 6 ms wait is not, a
    6 ms busy issuing is. The gate's hold is set against the wall clock either way."""
    be = _EventHost()
    be.idle, be.spin = True, spin
    from adaptive import config as config_mod
    with config_mod.override(issue_clock=clock):
        d, x, state, fast, slow, timed = _fast_and_slow(rng, be, "sum", 1.0, 1.5, 0.006)
    assert d.issue_clock == clock
    assert not d.plan("softmax", x).provisional
    charged = min(state.observed[fast])
    if clock == "wall" or spin:                       # the 6 ms are charged
        assert charged >= 7.0 and state.committed == slow, state.history
    else:                                             # a wait: not the issuing's work
        assert charged < 1.5 and state.committed == fast, state.history
    assert min(timed) == pytest.approx(1.0)           # the recorders see the device time


@pytest.mark.parametrize("knob, default, other, bad, allowed", [
    ("issue_clock", "wall", "thread", "cpu", r"\('wall', 'thread'\)"),
    ("issue_floor", "window", "seeded", "least", r"\('window', 'seeded'\)")])
def test_the_issue_clock_and_floor_are_checked(knob, default, other, bad, allowed):
    from adaptive import config as config_mod
    from adaptive.backends import get_backend
    d = Dispatcher(get_backend("host"))
    assert getattr(d, knob) == default
    with pytest.raises(adaptive.InputValueError,
                       match=rf"{knob} '{bad}'; expected one of {allowed}"):
        setattr(d, knob, bad)
    with config_mod.override(**{knob: other}):
        assert getattr(Dispatcher(get_backend("host")), knob) == other


@pytest.mark.parametrize("rule", ["measured", "sum"])
def test_the_issuing_is_charged_by_the_class_not_by_each_samples_moment(rng, rule):
    """In a host-bound loop a candidate explored right after a slower one finds the device
    still busy with that one's kernels at each of its samples. It is charged its issuing
    all the same: where most exploring samples of the class found the device waiting, all
    its candidates are (run S32: three_pass, 28 us of kernels and 75 us of issuing, was
    charged nothing behind a slower candidate and committed at 2.4x the best). Under
    "measured" such a sample waits for the stream first, then is timed ungated: 6 ms of
    issuing over 1 ms of kernels is charged 6 ms; under "sum", 7."""
    from adaptive.backends.host import HostBackend
    be = _EventHost()
    last = []

    def prepare(candidate, problem, op):
        fn = HostBackend.prepare(be, candidate, problem, op)
        label = candidate.label
        be.cost.setdefault(label, 1.0)

        def run(args, out):
            fn(args, out)
            time.sleep(be.issue_s.get(label, 0.0))   # the host's issuing
            be.clock += be.cost[label]
            last.append(label)
        return run
    be.prepare = prepare
    policy = Learned(LiveModel(background=False), max_explore=2, samples=2)
    d = Dispatcher(be, policy=policy)
    d.issue_charge = rule
    d.sample_every = 1
    x = rng.standard_normal((45, 21)).astype(np.float32)
    plan = d.plan("softmax", x)
    slow_kernels, slow_issue = policy.state(plan.class_key).explore[:2]
    be.cost.update({slow_kernels.label: 1.5, slow_issue.label: 1.0})   # device ms
    be.issue_s[slow_issue.label] = 0.006
    # busy exactly when slow_issue's turn follows slow_kernels' call: half the samples
    be.stream_idle = lambda stream: not (last and last[-1] == slow_kernels.label)
    for _ in range(6):                  # two warm-up turns, then two samples each
        d.launch("softmax", x)
        be.finish()
    d.harvest()
    state = policy.state(plan.class_key)
    assert not d.plan("softmax", x).provisional
    assert last.count(slow_kernels.label) >= 3 and last.count(slow_issue.label) >= 3
    # 1 ms of kernels and 6 ms of issuing: the larger, or the sum
    assert min(state.observed[slow_issue]) >= (6.0 if rule == "measured" else 7.0)
    assert state.committed == slow_kernels, state.reason
    assert (be.stream_waits >= 2) == (rule == "measured")   # the busy moments waited for


@pytest.mark.parametrize("keys", ["new each call", "one", "two", "four recurring"])
def test_a_plan_bound_to_its_key_is_charged_its_preparation_where_keys_change(rng, keys):
    """In a host-bound loop whose calls each bring a new key of one class (a decode step's
    new cached length), a candidate whose plan costs 40 ms to prepare for a key is charged
    that per call: the one with slower kernels but a cheap preparation is committed. With
    one key called again and again, preparation is paid once and the faster kernels win
    (run S36: our split-KV kernel's miss, 564 us a call, against 29 us held). So do they
    with two keys of the class called in turn (two fixed shapes: run S172's softmax R=1
    and R=64 at C=32000 charged reg_row its preparation for the second key and committed
    block_row at 1.15-1.22x): nothing is charged before KEY_CHARGE_KEYS keys have joined.
    Nor with four keys drawn in turn, once a call comes back to a key: keys that recur are
    a set of shapes, not a decode loop's new lengths."""
    new_key_each_call = keys == "new each call"
    be = _EventHost()
    be.idle = True                      # host-bound: issuing and preparation charged
    inner = be.prepare

    def prepare(candidate, problem, op):   # host_numpy's plans take 40 ms to prepare
        time.sleep(0.04 if candidate.variant.name == "host_numpy" else 0.0)
        return inner(candidate, problem, op)
    be.prepare = prepare
    policy = Learned(LiveModel(background=False), max_explore=2, samples=2)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    xs = [rng.standard_normal((109 + i, 21)).astype(np.float32) for i in range(19)]
    plan = d.plan("softmax", xs[0])
    explored = policy.state(plan.class_key).explore[:2]
    (fast_kernels,) = [c for c in explored if c.variant.name == "host_numpy"]
    (cheap_prep,) = [c for c in explored if c is not fast_kernels]
    # device ms, 10 apart: a host hiccup in every issuing of one candidate (a loaded
    # machine's other threads) cannot reorder them
    be.cost.update({fast_kernels.label: 1.0, cheap_prep.label: 11.0})
    for i in range(1, 19):
        x = (xs[i] if new_key_each_call else xs[i % 2] if keys == "two"
             else xs[i % 4] if keys == "four recurring" else xs[0])
        d.launch("softmax", x)
        be.finish()
        d.harvest()
        if not d.plan("softmax", x).provisional:
            break
    state = policy.state(plan.class_key)
    assert state.committed is not None, state.reason
    assert state.committed == (cheap_prep if new_key_each_call else fast_kernels), (
        state.reason)
    if new_key_each_call:   # 1 ms of kernels + 40 ms of preparation x new keys a sample
        assert min(state.observed[fast_kernels]) >= 30.0


def _charges_recorded():
    """A measure-each policy that records (variant name, ms) of each time it is charged,
    and decides nothing from them."""
    from adaptive.policy import MeasureEach

    class Recording(MeasureEach):
        def __init__(self):
            super().__init__()
            self.charged = []

        def observe(self, key, candidate, time_ms):
            self.charged.append((candidate.variant.name, time_ms))
            return None
    return Recording()


def test_the_issuing_charged_is_the_least_of_the_variants_recent_issuings(rng):
    """An exploring sample's issuing only ever reads high (a collection, a page fault, the
    turn after another candidate's kernels) where the kernels of two configs differ by a
    few us: each sample is charged its device time plus the least of the last ISSUE_WINDOW
    issuings of its variant (on inputs of its kind), its own included; another variant's
    issuings are its own."""
    from adaptive.dispatch import ISSUE_WINDOW
    policy = _charges_recorded()
    from adaptive.backends import get_backend
    d = Dispatcher(get_backend("host"), policy=policy)
    x = rng.standard_normal((9, 31)).astype(np.float32)
    plan = d.plan("softmax", x)
    other = next(c for c in d.candidates("softmax", x)
                 if c.variant.name != plan.candidate.variant.name)
    pa, pb = plan, dataclasses.replace(plan, candidate=other)
    a, b = plan.candidate.variant.name, other.variant.name
    policy.charged.clear()                         # (the miss timed every candidate)
    for issue in (50.0, 5.0, 60.0, 7.0):
        d.feedback(pa, 1.0, issue)
    d.feedback(pb, 2.0, 40.0)
    d.feedback(pa, 1.0, 0.0)                      # the device had work: no issuing charged
    assert policy.charged == [(a, 51.0), (a, 6.0), (a, 6.0), (a, 6.0), (b, 42.0), (a, 1.0)]
    for _ in range(ISSUE_WINDOW):                  # the window forgets the 5 ms issuing
        d.feedback(pa, 1.0, 9.0)
    assert policy.charged[-1] == (a, 10.0)
    kind = plan.problem.kind                       # what a report reads of the charges
    assert d.issue_charges() == {f"{pa.candidate.variant.id}/{kind}": (ISSUE_WINDOW, 9.0),
                                 f"{other.variant.id}/{kind}": (1, 40.0)}


def test_compiled_kernels_launched_with_the_same_arguments_share_one_issuing_window(rng):
    """Our launcher does the same host work for every kernel of an op launched with the
    same argument list, so their issuings are one window (issue_family): a young window
    of one kernel read at a bad moment no longer charges it more than its sibling (run
    S172, H200: block_row's window read 26 us, reg_row's 19 and reg_row_cs's 32 in one
    class, their kernels 7-13 us). Kernels launched with other arguments, and library
    calls, keep windows of their own."""
    from adaptive.dispatch import issue_family
    from adaptive.variants import default_registry, make_candidate
    reg = default_registry()
    soft = {v.name: v for v in reg.variants("softmax", "cuda")}
    att = {v.name: v for v in reg.variants("attention", "cuda")}
    assert issue_family(soft["reg_row"]) == issue_family(soft["block_row"]) \
        == "softmax/kernels(x,out,R,C)"
    assert issue_family(att["splitkv_mma"]) == issue_family(att["splitkv2_mma"])
    assert issue_family(att["decode_global"]) != issue_family(att["splitkv_mma"])
    assert issue_family(att["sdpa_torch"]) == "attention/sdpa_torch"      # a library's own
    policy = _charges_recorded()
    from adaptive.backends import get_backend
    d = Dispatcher(get_backend("host"), policy=policy)
    x = rng.standard_normal((9, 31)).astype(np.float32)
    plan = d.plan("softmax", x)
    host = plan.candidate.variant
    assert issue_family(host) == host.id                # a python variant: its own window

    def as_(variant):
        cfg = {k: vals[0] for k, vals in variant.space.params}
        return dataclasses.replace(plan, candidate=make_candidate(variant, cfg))
    reg_row, block_row = as_(soft["reg_row"]), as_(soft["block_row"])
    policy.charged.clear()
    d.feedback(reg_row, 0.007, 0.030)     # a bad moment: 30 us
    d.feedback(block_row, 0.010, 0.009)   # 9 us
    d.feedback(reg_row, 0.007, 0.031)     # charged the shared least, 9 us
    d.feedback(plan, 0.005, 0.050)        # the host variant: a window of its own
    assert [n for n, _ in policy.charged] == ["reg_row", "block_row", "reg_row", host.name]
    assert [round(t, 4) for _, t in policy.charged] == [0.037, 0.019, 0.016, 0.055]
    kind = plan.problem.kind
    assert d.issue_charges() == {f"softmax/kernels(x,out,R,C)/{kind}": (3, 0.009),
                                 f"{host.id}/{kind}": (1, 0.050)}


def test_one_issuing_per_family_is_charged_for_a_whole_exploration(rng):
    """The family's least recent issuing moves while a class explores (a lower one comes,
    an old one leaves the window): its candidates are charged the one held when the
    family's first sample came, so two configs of a kernel are compared by their device
    times (run S175, H100: decode_global's configs were charged 8.5 and 35.4 us in one
    class). Another family holds its own; the next exploration reads the window anew."""
    from adaptive.backends import get_backend
    from adaptive.policy import Decision
    policy = Learned(LiveModel(background=False), max_explore=4, explore_budget=None)
    d = Dispatcher(get_backend("host"), policy=policy)
    x = rng.standard_normal((9, 31)).astype(np.float32)
    plan = d.plan("softmax", x)
    state = policy.state(plan.class_key)
    assert state.committed is None and len(state.explore) >= 2
    from adaptive.variants import default_registry, make_candidate
    host = {v.name: v for v in default_registry().variants("softmax", "host")}
    a, b = (make_candidate(host["host_blocked"], c)
            for c in list(host["host_blocked"].space.all_configs())[:2])
    numpy_ = make_candidate(host["host_numpy"], {})
    charged = []
    policy.observe = lambda key, c, ms: charged.append((c, round(ms, 4)))   # no commit

    def sample(c, device_ms, issue_ms):
        d.feedback(dataclasses.replace(plan, candidate=c), device_ms, issue_ms, waited=True)
    sample(a, 0.010, 0.009)      # the family's least: 9 us, held
    sample(a, 0.010, 0.004)      # the window's least now 4 us
    sample(b, 0.010, 0.030)
    sample(numpy_, 0.020, 0.002)  # a family of its own: 2 us
    sample(numpy_, 0.020, 0.001)
    assert charged == [(a, 0.019), (a, 0.019), (b, 0.019), (numpy_, 0.022), (numpy_, 0.022)]
    cls = d._classes[plan.class_key]
    d._revise(plan.class_key, Decision(a, "committed"))       # the commit lets go of them
    assert cls.issue_held == {}
    cls.decision = Decision(a, "exploring again", explore=(a, b))
    charged.clear()
    sample(b, 0.010, 0.030)
    assert charged == [(b, 0.014)]    # the window's least now


def _clock_timer(be):
    """A device_timer for an _EventHost: a run's time on its fake GPU clock (gated: the
    run's device time; ungated: its ``pre`` too where the stream is idle)."""
    def device_timer(stream_ptr, gated=True):
        def timer(run):
            be.gated = gated
            t0 = be.clock
            try:
                run()
            finally:
                be.gated = False
            return be.clock - t0
        return timer
    return device_timer


@pytest.fixture
def no_collections():
    """Python's collector off for the test: these tests time the host's issuing in ms, and
    a full collection with torch and transformers loaded (the full suite) takes several,
    in whichever run it falls."""
    import gc
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def _measured_miss(rng, device_waits: bool):
    """A MeasureEach dispatcher on the fake event host (``be.idle``: ``device_waits``), a
    softmax input and its first two candidates, ``fast`` at 1.0 ms of device time and
    ``slow`` at 1.5 (the others 4.0 and more): ``(be, d, x, fast, slow)``."""
    from adaptive.policy import MeasureEach
    be = _EventHost()
    be.idle = device_waits
    be.device_timer = _clock_timer(be)
    d = Dispatcher(be, policy=MeasureEach())
    x = rng.standard_normal((17, 90)).astype(np.float32)
    cands = d.candidates("softmax", x)
    assert len(cands) >= 2
    fast, slow = cands[0], cands[1]
    be.cost.update({c.label: 2.0 + i for i, c in enumerate(cands)})
    be.cost.update({fast.label: 1.0, slow.label: 1.5})
    return be, d, x, fast, slow


@pytest.mark.parametrize("device_waits", [False, True])
@pytest.mark.usefixtures("no_collections")
def test_a_miss_measured_whole_charges_the_issuing_where_the_device_waited(rng, device_waits):
    """MeasureEach times each candidate on the miss with the backend's device timer; where
    the caller's device was idle when the miss came, each run's host issuing is added."""
    be, d, x, fast, slow = _measured_miss(rng, device_waits)
    be.issue_s[fast.label] = 0.006
    chosen = d.plan("softmax", x).candidate
    assert chosen == (slow if device_waits else fast)


@pytest.mark.usefixtures("no_collections")
def test_a_miss_charges_the_least_issuing_of_a_candidates_runs(rng):
    """A collection or page fault in one run's issuing (here 20 ms in the timed run of the
    candidate that issues in no time) is not charged to it: the miss charges the least
    issuing of the warm-up and timed runs, and the candidate that is faster in both device
    time and issuing is chosen."""
    be, d, x, fast, slow = _measured_miss(rng, True)
    runs = iter([0.0, 0.020])               # the warm-up run, then a hiccup in the timed one
    be.issue_s[fast.label] = lambda: next(runs, 0.0)
    be.issue_s[slow.label] = 0.008
    assert d.plan("softmax", x).candidate == fast


class _FixedRanking:
    """A cost model that ranks the candidates of one decide() by fixed (mean, sigma)."""

    first_fit_pending = False      # (a LiveModel's: no pack fit to wait for)

    def __init__(self, mean, sigma):
        self.mean, self.sigma = np.asarray(mean, float), np.asarray(sigma, float)

    def predict_dist(self, rows):
        assert len(rows) == len(self.mean)
        return self.mean, self.sigma

    def add(self, rows, y, groups=None, refit=True):   # learns nothing: a fixed ranking
        pass


def _cuda_softmax_ranking():
    """CUDA softmax candidates (no GPU needed to rank them) and a constructed ranking:
    block_row best, warp_row within the 20 % regret reach, reg_row 1.4x (outside the regret
    reach, within the 1.5x variant reach), multi_row 1.7x (outside both); sigma 0."""
    from adaptive.variants import default_registry, make_candidate
    by = {v.name: [make_candidate(v, c) for c in list(v.space.all_configs())[:4]]
          for v in default_registry().variants("softmax", "cuda")}
    block, warp, reg, multi = by["block_row"], by["warp_row"], by["reg_row"], by["multi_row"]
    cands = block[:4] + reg[:2] + warp[:2] + multi[:1]
    ratio = [1.0, 1.01, 1.02, 1.03, 1.4, 1.45, 1.1, 1.15, 1.7]
    x = np.zeros((2048, 4096), np.float16)
    op = OPS["softmax"]
    ctx = Context(op, op.problem((x,), {}), op.key((x,), {}), lambda *_, **__: math.nan)
    return ctx, cands, [math.log(r) for r in ratio], block, warp, reg, multi


def test_a_variant_outside_the_regret_reach_within_the_variant_reach_gets_one_slot():
    """The model's prior may come from other conditions (a pack's L2-hot repeats; run S10's
    stream of inputs out of L2, where reg_row_cs beat the committed block_row and was never
    explored): the best config of another variant within 1.5x takes one of the model's
    last slots, no more slots than max_explore."""
    ctx, cands, mean, block, warp, reg, multi = _cuda_softmax_ranking()
    model = _FixedRanking(mean, [0.0] * len(mean))
    d = Learned(model, max_explore=4, per_variant=2, anchors=False,
                explore_budget=None).decide(ctx, cands)
    # right after the model's first pick; the per-variant cap fills the rest in order
    assert d.explore == (block[0], reg[0], block[1], warp[0]), d.reason
    assert "1 other variants' best within 1.5x (" + reg[0].label in d.reason
    # without it: the regret reach alone, as before (reg_row never explored)
    for off in ({"variant_reach": 0}, {"variant_slots": 0}):
        d = Learned(model, max_explore=4, per_variant=2, anchors=False,
                    explore_budget=None, **off).decide(ctx, cands)
        assert d.explore == (block[0], block[1], warp[0], warp[1]), off
    # a wider reach takes multi_row too; variant_slots bounds them
    d = Learned(model, max_explore=4, anchors=False, explore_budget=None,
                variant_reach=1.0).decide(ctx, cands)
    assert d.explore == (block[0], reg[0], multi[0], block[1])
    d = Learned(model, max_explore=4, anchors=False, explore_budget=None,
                variant_reach=1.0, variant_slots=1).decide(ctx, cands)
    assert d.explore == (block[0], reg[0], block[1], warp[0])
    # optimism counts as in the regret reach: a sure 1.6x is out, an unsure one in
    sigma = [0.0] * len(mean)
    mean = list(mean)
    mean[4], mean[5] = math.log(1.6), math.log(1.65)
    assert reg[0] not in Learned(_FixedRanking(mean, sigma), max_explore=4, anchors=False,
                                 explore_budget=None).decide(ctx, cands).explore
    sigma[4] = 0.1
    assert reg[0] in Learned(_FixedRanking(mean, sigma), max_explore=4, anchors=False,
                             explore_budget=None).decide(ctx, cands).explore
    # one slot: the model's first pick alone
    assert Learned(model, max_explore=1, anchors=False, explore_budget=None).decide(
        ctx, cands).explore == ()
    with pytest.raises(ValueError, match="variant_slots must be an int >= 0"):
        Learned(model, variant_slots=-1)
    with pytest.raises(ValueError, match="variant_reach must be a fraction >= 0"):
        Learned(model, variant_reach=-0.5)


@pytest.mark.parametrize("shift,far", [(1.0, False), (5.0, True)])
def test_far_from_every_measured_input_each_variants_best_competes_for_the_slots(shift, far):
    """Where the nearest measured input lies beyond far_distance the model extrapolates
    (run S107: softmax 32768x4096, 4.05 from the nearest, committed warp_row at 1.55x
    reg_row, which was ranked out of reach and never explored): every variant's best-ranked
    config competes for the variant slots, here multi_row at 1.7x beside reg_row at 1.4x,
    and the picks within the regret reach take warp_row's best config before block_row's
    second. Near a measured input the variant reach (1.5x) and the model's order hold as
    before."""
    from adaptive.policy.learned import Neighbours
    ctx, cands, mean, block, warp, reg, multi = _cuda_softmax_ranking()
    features = dict(ctx.op.features(ctx.problem))
    name = sorted(features)[0]
    near = Neighbours()
    near.add("softmax", "float16", {**features, name: features[name] + shift}, "block_row",
             block[0].config, 1.0)
    policy = Learned(_FixedRanking(mean, [0.0] * len(mean)), max_explore=4, anchors=False,
                     explore_budget=None)
    policy.neighbours = near
    d = policy.decide(ctx, cands)
    if far:
        assert d.explore == (block[0], reg[0], multi[0], warp[0]), d.reason
        assert "the nearest measured input 5.00 away, beyond 3.5" in d.reason
    else:
        assert d.explore == (block[0], reg[0], block[1], warp[0]), d.reason
    off = Learned(_FixedRanking(mean, [0.0] * len(mean)), max_explore=4, anchors=False,
                  explore_budget=None, far_distance=None)
    off.neighbours = near
    assert off.decide(ctx, cands).explore == (block[0], reg[0], block[1], warp[0])
    with pytest.raises(ValueError, match="far_distance must be > 0 or None"):
        Learned(_FixedRanking(mean, [0.0] * len(mean)), far_distance=0)


def test_spread_picks_take_each_variants_best_config_before_any_second():
    """_per_variant's spread (the model extrapolating): each variant's best-ranked config
    first, then second configs up to per_variant, a variant's configs most unlike its
    first before the others; the picks keep the model's order across variants, and the
    ones passed over follow. Without it, the model's order with the per-variant cap."""
    ctx, cands, mean, block, warp, reg, multi = _cuda_softmax_ranking()
    # block_row: [0] CACHE=0 VEC=1, [1] CACHE=1 VEC=1, [2] CACHE=0 VEC=2, [3] CACHE=1 VEC=2
    assert [dict(c.config_items)["CACHE"] for c in block] == [0, 1, 0, 1]
    assert [dict(c.config_items)["VEC"] for c in block] == [1, 1, 2, 2]
    ranked = [c for _, c in sorted(zip(mean, cands), key=lambda t: t[0])]
    policy = Learned(_FixedRanking(mean, [0.0] * len(mean)), per_variant=2)
    assert policy._per_variant(ranked, 3, spread=True) == (
        [block[0], warp[0], reg[0]], [block[3], block[1], block[2]])
    assert policy._per_variant(ranked, 6, spread=True) == (
        [block[0], block[3], warp[0], warp[1], reg[0], multi[0]],
        [block[1], block[2], reg[1]])
    assert policy._per_variant(ranked, 3) == ([block[0], block[1], warp[0]], [block[2],
                                                                              block[3]])


def test_config_spread_puts_a_variants_most_unlike_configs_after_its_first():
    """_config_spread: within each variant, after its best-ranked config, the configs that
    differ from it in the most values, model order among equals; each variant keeps its
    places, so a list of one config per variant is unchanged."""
    from adaptive.policy.learned import _config_spread
    ctx, cands, mean, block, warp, reg, multi = _cuda_softmax_ranking()
    order = [block[1], warp[0], block[0], block[2], reg[0], block[3], warp[1]]
    # block[1] (CACHE=1 VEC=1) first: block[2] (CACHE=0 VEC=2) differs in both values
    assert _config_spread(order) == [block[1], warp[0], block[2], block[0], reg[0],
                                     block[3], warp[1]]
    assert _config_spread([block[0], warp[0], reg[0], multi[0]]) == [
        block[0], warp[0], reg[0], multi[0]]
    assert _config_spread([]) == []


def test_the_ranking_charges_the_hosts_issuing_where_the_device_waits():
    """A miss whose device waits for the host ranks each candidate by its device time
    plus its variant's known issuing, as its samples will be charged (run S109: SDPA from
    CuPy ranked by device time alone beside flash kernels whose samples came to 0.8x it):
    block_row ranked first by 1.1x on device time, but issued in 0.5 ms a call, goes
    behind warp_row; nothing known, nothing added."""
    import dataclasses
    ctx, cands, mean, block, warp, reg, multi = _cuda_softmax_ranking()
    model = _FixedRanking(mean, [0.0] * len(mean))
    plain = Learned(model, max_explore=4, anchors=False, explore_budget=None).decide(
        ctx, cands)
    assert plain.explore[0] == block[0] and "issuing" not in plain.reason

    def charge(c, device_ms):
        return device_ms + (0.5 if c.variant.name == "block_row" else 0.0)
    charged = Learned(model, max_explore=4, anchors=False, explore_budget=None)
    d = charged.decide(dataclasses.replace(ctx, charge=charge), cands)
    assert d.explore[0] == warp[0], d.reason
    assert "(with the host's issuing, the device waiting)" in d.reason
    assert charged.state(ctx.key).predicted_ms(block[0]) == pytest.approx(1.5)
    nothing = Learned(model, max_explore=4, anchors=False, explore_budget=None).decide(
        dataclasses.replace(ctx, charge=lambda c, t: t), cands)
    assert nothing.explore == plain.explore and "issuing" not in nothing.reason


@pytest.mark.parametrize("device_waits", [False, True])
def test_a_miss_hands_the_policy_the_issuing_charge_where_the_device_waits(
        rng, device_waits):
    """The dispatcher gives the miss's context a charge where the caller's device waits
    (the variant's least recent issuing added, as its samples are charged), none where it
    is busy; under "measured" none (its samples read the issuing themselves)."""
    from adaptive.policy import MeasureEach
    seen = []

    class Recording(MeasureEach):
        def decide(self, ctx, candidates):
            seen.append(ctx.charge)
            return super().decide(ctx, candidates)
    be = _EventHost()
    be.idle = device_waits
    d = Dispatcher(be, policy=Recording())
    x = rng.standard_normal((23, 41)).astype(np.float32)
    c = d.candidates("softmax", x)[0]
    d._issued[(c.variant.id, "numpy")] = collections.deque([0.3, 0.2, 0.4])
    d.plan("softmax", x)
    charge = seen[-1]
    if not device_waits:
        assert charge is None
        return
    assert charge(c, 1.0) == pytest.approx(1.2)              # the least issuing added
    other = next(o for o in d.candidates("softmax", x) if o.variant.id != c.variant.id)
    assert charge(other, 1.0) == 1.0                          # none known: none added
    d.issue_charge = "max"
    assert d._charge_of("numpy")(c, 0.1) == pytest.approx(0.2)
    d.issue_charge = "measured"
    assert d._charge_of("numpy") is None


def test_the_nearest_measured_input_counts_flags_apart():
    """Neighbours.nearest: Euclidean over the features, among the inputs whose named flags
    equal the input's (a causal twin is no evidence for the non-causal input: run S109);
    inf where none has them, None where nothing of the op was measured."""
    from adaptive.policy.learned import Neighbours
    near = Neighbours()
    here = {"log2_L": 12.0, "param_causal": 0.0}
    assert near.nearest("attention", "float16", here, ["param_causal"]) is None
    near.add("attention", "float16", {"log2_L": 12.0, "param_causal": 1.0}, "a", (), 1.0)
    assert near.nearest("attention", "float16", here) == pytest.approx(1.0)
    assert near.nearest("attention", "float16", here, ["param_causal"]) == math.inf
    near.add("attention", "float16", {"log2_L": 9.0, "param_causal": 0.0}, "b", (), 1.0)
    assert near.nearest("attention", "float16", here, ["param_causal"]) == pytest.approx(3.0)
    assert near.nearest("attention", "float32", here, ["param_causal"]) is None


def test_a_sure_model_still_times_a_second_variant_beside_its_pick():
    """Run S24: the model put cuBLAS alone within the regret reach of gemm 4x1024x1024,
    nothing else within 1.5x, and it was committed unseen at 1.7x the best candidate. With
    min_explore 2 the best config of the next variant is timed beside the pick, and the
    faster of the two is committed; min_explore 1 keeps the old unseen commit."""
    ctx, cands, mean, block, warp, reg, multi = _cuda_softmax_ranking()
    mean = [0.0] + [math.log(2.0)] * (len(mean) - 1)     # block[0] 2x ahead of the rest
    model = _FixedRanking(mean, [0.0] * len(mean))
    policy = Learned(model, anchors=False, explore_budget=None)
    d = policy.decide(ctx, cands)
    assert d.explore == (block[0], reg[0]), d.reason        # reg_row: the next variant
    assert f"plus {reg[0].label} (at least 2 explored)" in d.reason
    done = None
    for _ in range(policy.samples):                          # the model was wrong
        policy.observe(ctx.key, block[0], 0.030)
        done = policy.observe(ctx.key, reg[0], 0.012) or done
    assert done.candidate == reg[0] and policy.state(ctx.key).committed == reg[0]
    d = Learned(model, anchors=False, explore_budget=None, min_explore=1).decide(ctx, cands)
    assert d.explore == () and d.candidate == block[0]
    assert f"committed {block[0].label} without exploring" in d.reason
    with pytest.raises(ValueError, match="min_explore must be an int >= 1, got 0"):
        Learned(model, min_explore=0)


def test_the_library_candidate_explored_runs_first():
    """A class's first call runs the library's candidate when it is explored (cuBLAS for
    gemm): it needs no compile or module load, so the first result comes soonest, and it
    is what the plain program runs; the set explored is the model's, only the order moves."""
    from adaptive.variants import default_registry, make_candidate
    cands = [make_candidate(v, c) for v in default_registry().variants("gemm", "cuda")
             for c in list(v.space.all_configs())[:3]]
    lib = next(c for c in cands if c.variant.baseline)
    a, b = np.zeros((64, 96), np.float16), np.zeros((96, 80), np.float16)
    op = OPS["gemm"]
    ctx = Context(op, op.problem((a, b), {}), op.key((a, b), {}), lambda *_, **__: math.nan)
    mean = [0.0 if c is not lib else math.log(1.1) for c in cands]   # ranked below others
    model = _FixedRanking(mean, [0.0] * len(cands))
    d = Learned(model, max_explore=4, explore_budget=None).decide(ctx, cands)   # anchored
    assert lib in d.explore and d.explore[0] == lib and d.candidate == lib, d.reason
    assert len(d.explore) == 4 and "a library's" in d.reason
    others = Learned(model, max_explore=4, anchors=False, explore_budget=None,
                     regret_bound=0.05, variant_reach=0.0).decide(ctx, cands)
    assert lib not in others.explore and others.explore[0] != lib     # not explored: not run


def test_anchors_stay_beside_another_variants_slot():
    """A near measured input's fastest candidate is still explored: it displaces the model's
    last pick, not the other variant's slot nor the model's first pick."""
    ctx, cands, mean, block, warp, reg, multi = _cuda_softmax_ranking()
    policy = Learned(_FixedRanking(mean, [0.0] * len(mean)), max_explore=4, per_variant=2,
                     explore_budget=None)
    features = ctx.op.features(ctx.problem)
    policy.neighbours.add("softmax", "float16", features, block[3].variant.name,
                          block[3].config_items, 0.01)
    d = policy.decide(ctx, cands)
    assert d.explore == (block[0], reg[0], block[1], block[3]), d.reason
    assert "the fastest on a near measured input" in d.reason


def _tiered_model(candidates, tiers: dict, rng) -> LiveModel:
    """A model fitted on recorded rows where each label's time is ``tiers[label]`` units
    (3 where not named)."""
    rows = []
    op = OPS["softmax"]
    for r in (64, 128, 256, 512, 1024):
        x = rng.standard_normal((r, 96)).astype(np.float32)
        p = op.problem((x,), {})
        for c in candidates:
            if c.variant.fits(p.scope(), c.config):
                t = tiers.get(c.label, 3.0) * r * 1e-3
                rows.append(Observation("softmax", dict(p.dims), p.dtype, c.variant.name,
                                        c.config, t * math.exp(rng.normal(0, 0.01)),
                                        r * 1e-3, op.features(p)))
    return LiveModel(training_set(rows), background=False)


@pytest.mark.parametrize("refuted", [True, False])
def test_a_ranking_the_measurements_refute_widens_the_exploration_once(rng, refuted):
    """widen_margin: the model puts A alone within reach (1 unit), B 1.6 units (outside
    the 20% bound), the rest 3. When A measures 10x its prediction while the other
    explored candidate measures as predicted, B (predicted under the measured best at
    that candidate's error) is explored before the commit, and the commit is B; when A
    measures as predicted, nothing is added."""
    ctx, cands, _ = softmax_context(rng)
    blocked = [c for c in cands if c.variant.name == "host_blocked"]
    a, b = blocked[0], blocked[1]
    model = _tiered_model(cands, {a.label: 1.0, b.label: 1.6}, rng)
    policy = Learned(model, max_explore=4, min_explore=2, samples=2, anchors=False,
                     race_ratio=None)
    d = policy.decide(ctx, cands)
    assert d.explore[0] == a and b not in d.explore and len(d.explore) == 2
    # the miss's ranking timed in its two parts (the rows, the model's prediction)
    assert policy.stats["rows_s"] > 0 and policy.stats["predict_s"] > 0
    predicted = dict(d.predicted_ms)
    truth = {c: predicted[c.label] for c in cands}
    truth[a] = predicted[a.label] * (10.0 if refuted else 1.0)
    out = [policy.observe(ctx.key, c, truth[c]) for _ in range(2) for c in d.explore]
    assert out[:2] == [None] * 2 and out[2].explore == d.explore[1:]   # a has its two
    state = policy.state(ctx.key)
    if not refuted:
        assert out[-1].candidate == a and not out[-1].explore and not state.widened
        return
    widened = out[-1]
    best = min(d.explore, key=truth.get)
    assert widened.explore[0] == best and b in widened.explore[1:]
    assert all(c not in d.explore for c in widened.explore[1:])
    assert "widened by" in widened.reason and b.label in widened.reason
    assert state.committed is None and state.widened
    commit = None
    for _ in range(2):
        for c in widened.explore:
            commit = policy.observe(ctx.key, c, truth[c]) or commit
    assert commit is not None and commit.candidate == b and not commit.explore
    assert state.committed == b
    with pytest.raises(ValueError, match="widen_margin must be a fraction >= 0 or None"):
        Learned(LiveModel(background=False), widen_margin=-0.1)


def _explore_to_commit(policy, key, decision, truth):
    """Feed each explored candidate its time in ``truth`` as a class's calls would, following
    every rotation the policy hands back, until it commits; the key's state."""
    rotation = decision.explore
    for _ in range(100):
        if policy.state(key).committed is not None or not rotation:
            break
        for c in rotation:
            later = policy.observe(key, c, truth[c])
            if later is not None:
                rotation = later.explore
                break
    return policy.state(key)


@pytest.mark.parametrize("case", ["faster", "slower", "first pick won, next slower",
                                  "first pick won, next faster", "op's own: none"])
def test_the_leaders_next_config_is_timed_before_the_commit(case):
    """refine_configs: block_row's first config is the model's first pick, warp_row's first
    the other explored one. When warp_row leads (the model's order across variants was
    wrong), warp_row's next config is timed before the commit; when the first pick leads,
    block_row's next (a near-tie the exploration left out). The newcomer is committed when
    faster, left behind after one sample when slower than the leader's median. When the
    op's own count is 0 (softmax; spmm's is 1), nothing is added."""
    ctx, cands, mean, block, warp, reg, multi = _cuda_softmax_ranking()
    count = None if case == "op's own: none" else 1
    policy = Learned(_FixedRanking(mean, [0.0] * len(mean)), max_explore=2, per_variant=1,
                     anchors=False, variant_reach=0.0, explore_budget=None,
                     refine_configs=count)
    d = policy.decide(ctx, cands)
    assert d.explore == (block[0], warp[0]), d.reason
    truth = {c: 3.0 for c in cands}
    truth.update({block[0]: 2.0, warp[0]: 1.0, warp[1]: 0.8 if case == "faster" else 1.2})
    leader, newcomer = warp[0], warp[1]
    if case.startswith("first pick won"):
        leader, newcomer = block[0], block[1]
        truth.update({block[0]: 1.0, warp[0]: 2.0,
                      block[1]: 0.8 if case.endswith("faster") else 1.2})
    state = _explore_to_commit(policy, ctx.key, d, truth)
    if case == "op's own: none":
        assert state.refining == () and warp[1] not in state.observed
        assert state.committed == min(d.explore, key=truth.get), state.reason
        assert not any(h.startswith("refined by") for h in state.history)
        assert OPS["softmax"].refine_configs == 0 and OPS["spmm"].refine_configs == 1
        return
    assert state.refining == (newcomer,)
    [note] = [h for h in state.history if h.startswith("refined by 1")]
    assert newcomer.label in note and leader.label in note
    assert ("is the model's first pick" if leader == block[0]
            else f"not the model's first pick ({block[0].label})") in note
    if truth[newcomer] < truth[leader]:
        assert state.committed == newcomer, state.reason
    else:
        assert state.committed == leader, state.reason
        assert len(state.observed[newcomer]) == 1 and state.observed[newcomer].raced
    with pytest.raises(ValueError, match="refine_configs must be an int >= 0 or None"):
        Learned(LiveModel(background=False), refine_configs=-1)


@pytest.mark.parametrize("case", ["far", "near", "far, far_refine 0"])
def test_far_from_every_measured_input_the_leaders_config_most_unlike_it_is_timed(case):
    """far_refine: where the model extrapolated (the nearest measured input beyond
    far_distance) and its first pick lost, one more config of the leader's variant is timed
    even for an op that refines none (softmax), and the one most unlike the leader comes
    first, not the model's next: its order within the variant is extrapolated too. The
    shipped H100 pack's replay: decode B=32 H=32 Lk=80 D=128, 4.8 from its nearest input,
    committed decode_global NWARPS=8 UNROLL=4 at 1.55x NWARPS=4 UNROLL=1 (two values
    unlike it), the model's next configs differing in one. Near a measured input, or with
    far_refine 0, softmax refines nothing."""
    from adaptive.policy.learned import Neighbours
    from adaptive.variants import default_registry, make_candidate
    by = {v.name: [make_candidate(v, c) for c in list(v.space.all_configs())[:6]]
          for v in default_registry().variants("softmax", "cuda")}
    block, reg = by["block_row"], by["reg_row"]
    like, unlike = reg[1], reg[4]      # THREADS=128 ITEMS=2; THREADS=256 ITEMS=2
    assert dict(reg[0].config_items) == {"THREADS": 128, "ITEMS": 1}
    cands = block[:4] + [reg[0], like, unlike]
    mean = [math.log(r) for r in (1.0, 1.01, 1.02, 1.03, 1.4, 1.42, 1.45)]
    x = np.zeros((2048, 4096), np.float16)
    op = OPS["softmax"]
    ctx = Context(op, op.problem((x,), {}), op.key((x,), {}), lambda *_, **__: math.nan)
    features = dict(op.features(ctx.problem))
    name = sorted(features)[0]
    near = Neighbours()
    near.add("softmax", "float16", {**features, name: features[name] + (
        1.0 if case == "near" else 5.0)}, "block_row", block[0].config, 1.0)
    policy = Learned(_FixedRanking(mean, [0.0] * len(mean)), max_explore=2, anchors=False,
                     explore_budget=None, **({"far_refine": 0} if "0" in case else {}))
    policy.neighbours = near
    d = policy.decide(ctx, cands)
    assert d.explore == (block[0], reg[0]), d.reason
    truth = {c: 3.0 for c in cands}
    truth.update({block[0]: 2.0, reg[0]: 1.0, like: 0.9, unlike: 0.8})
    state = _explore_to_commit(policy, ctx.key, d, truth)
    assert state.far == (case != "near")
    if case == "far":
        assert state.refining == (unlike,), state.history
        assert state.committed == unlike and like not in state.observed, state.reason
    else:
        assert state.refining == () and state.committed == reg[0], state.reason
        assert not any(h.startswith("refined by") for h in state.history)
    with pytest.raises(ValueError, match="far_refine must be an int >= 0"):
        Learned(LiveModel(background=False), far_refine=-1)


@pytest.mark.parametrize("rule,committed", [("sum", "slow"), ("max", "fast"),
                                            ("measured", "fast")])
def test_the_issuing_charge_rule_sums_or_takes_the_larger(rng, rule, committed):
    """A host-bound class: the candidate with faster kernels (20 ms) but 20 ms of issuing
    costs 40 ms charged as a sum (a caller that waits for each call), 20 ms as the larger
    of the two (a caller issuing call after call: its issuing overlaps the previous call's
    device time), against the other's 30 ms of device time and a negligible issuing. Each
    rule's verdict has 10 ms to spare for a loaded machine's own issuing time, on either
    candidate (with 12 ms of issuing against 15 ms, and then 18 against 25, the whole
    suite on 2 cores read one side's issuing 3.5 ms high)."""
    be = _EventHost()
    be.idle = True
    d, _, state, fast, slow, _ = _fast_and_slow(rng, be, rule, 20.0, 30.0, 0.020)
    charged = min(state.observed[fast])
    assert charged >= 40.0 if rule == "sum" else 20.0 <= charged < 30.0, charged
    assert state.committed == {"fast": fast, "slow": slow}[committed], state.reason
    # the history's charges: a sum written as one, the larger of the two with its parts
    [note] = [h for h in state.history if h.startswith("charged (a host-bound class")]
    got = re.search(re.escape(fast.label) + r" ([0-9.]+) (= device|\(device) ([0-9.]+)"
                    r"(?: \+|,) issuing ([0-9.]+)", note)
    assert got and (got.group(2) == "= device") == (rule == "sum"), note
    total, device, issuing = (float(got.group(i)) for i in (1, 3, 4))
    assert device == pytest.approx(20.0, rel=1e-3) and issuing >= 20.0, note
    assert total == pytest.approx(device + issuing if rule == "sum" else
                                  max(device, issuing), rel=1e-3), note
    with pytest.raises(adaptive.InputValueError,
                       match=r"issue_charge 'mean'; expected one of "
                             r"\('sum', 'max', 'regime', 'measured'\)"):
        d.issue_charge = "mean"


def test_no_collection_runs_inside_an_exploring_samples_window(rng):
    """A collection of a large heap takes milliseconds: inside an exploring sample's window
    it would be read as the candidate's time (runs S104, S106: single samples of 3-8 ms
    among kernels of 0.02-0.4 ms). The window runs with the collector off, and it is on
    again after each call; a caller that turned it off keeps it off."""
    import gc
    be = _EventHost()
    seen = []
    policy = Learned(LiveModel(background=False), max_explore=2, samples=2)
    d = Dispatcher(be, policy=policy)
    d.sample_every = 1
    x = rng.standard_normal((31, 40)).astype(np.float32)
    plan = d.plan("softmax", x)
    for c in policy.state(plan.class_key).explore[:2]:
        be.issue_s[c.label] = lambda: seen.append(gc.isenabled()) or 0.0
    for _ in range(6):                      # two warm-up turns, then two samples each
        d.launch("softmax", x)
        assert gc.isenabled()
    # the warm-up turns (with the issuing seed's runs) outside any window, then 4 samples
    assert len(seen) > 4 and all(seen[:-4]) and not any(seen[-4:]), seen
    gc.disable()
    try:
        d.launch("softmax", x)
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("device_waits", [False, True])
def test_regime_charges_a_busy_devices_samples_the_larger_of_device_time_and_issuing(
        rng, device_waits):
    """"regime": where the class's device waited for the host (a caller waiting for each
    call) the issuing is added, as "sum" does; where the device was busy (a caller issuing
    call after call, a stream interleaving inputs) a call costs at least its issuing,
    which "sum" does not charge there. A candidate with 1 ms of kernels and 6 ms of
    issuing loses to 1.5 ms of kernels either way under "regime"; under "sum" it wins
    where the device was busy. The setting comes from ADAPTIVE_ISSUE_CHARGE too."""
    from adaptive import config
    be = _EventHost()
    be.idle = device_waits
    with config.override(issue_charge="regime"):
        d, x, state, fast, slow, timed = _fast_and_slow(rng, be, "regime", 1.0, 1.5, 0.006)
        assert Dispatcher(be).issue_charge == "regime"
    assert state.committed == slow, state.reason
    charged = min(state.observed[fast])
    assert charged >= (7.0 if device_waits else 6.0), charged
    assert min(timed) == pytest.approx(1.0)                # recorders: the device time
    be2 = _EventHost()
    be2.idle = device_waits
    _, _, state2, fast2, slow2, _ = _fast_and_slow(rng, be2, "sum", 1.0, 1.5, 0.006)
    assert state2.committed == (slow2 if device_waits else fast2), state2.reason
    with config.override(issue_charge="mean"), \
            pytest.raises(adaptive.InputValueError, match="ADAPTIVE_ISSUE_CHARGE"):
        Dispatcher(be)


@pytest.mark.parametrize("pre_ms,committed", [(5.0, "fast"), (15.0, "slow")])
@pytest.mark.usefixtures("no_collections")
def test_measured_charges_the_latency_to_the_launch_not_the_work_after_it(
        rng, pre_ms, committed):
    """A library call from another framework issues for 12 ms, of which only ``pre_ms``
    come before its 20 ms of kernels; the rest (views, a stream context's exit) overlaps
    them. A caller waiting for each call pays ``pre_ms`` + 20 ms: 25 ms beats the other
    candidate's 30 ms of kernels, 35 ms does not. "measured" reads that from an ungated
    pair on the idle stream and commits accordingly; "sum" charges 32 ms in both cases
    and "max" 20 (run S101: "sum" charged SDPA from CuPy 103 us over its device time and
    committed flash2_mma at 0.1882 ms a synchronised call against SDPA's 0.1515)."""
    be = _EventHost()
    be.idle = True
    d, x, state, fast, slow, timed = _fast_and_slow(rng, be, "measured", 20.0, 30.0, 0.012,
                                                    pre_ms=pre_ms)
    assert not d.plan("softmax", x).provisional
    charged = min(state.observed[fast])
    assert 20.0 + pre_ms <= charged < 20.0 + pre_ms + 5.0, charged   # the pair's reading
    assert state.committed == {"fast": fast, "slow": slow}[committed], state.reason
    assert be.holds == []                          # no sample was gated
    assert 20.0 + pre_ms in timed                  # recorders see the pair as read
    for rule in ("sum", "max"):                    # the same loop under the old rules
        be2 = _EventHost()
        be2.idle = True
        _, _, state2, fast2, slow2, _ = _fast_and_slow(rng, be2, rule, 20.0, 30.0, 0.012,
                                                       pre_ms=pre_ms)
        assert state2.committed == (slow2 if rule == "sum" else fast2), (rule, state2.reason)


def test_a_key_with_few_candidates_explores_a_fraction_of_them(rng, monkeypatch):
    """explore_fraction: 12 candidates (attention's prefill set on the H200) are explored 5
    at most, 5 candidates 4 (EXPLORE_FLOOR), 100 candidates max_explore; None: always
    max_explore. A cold decision keeps to the key's cap."""
    import adaptive.policy.learned as learned_mod
    policy = Learned(LiveModel(background=False))
    assert [policy._cap(n) for n in (2, 5, 12, 20, 100)] == [4, 4, 5, 8, 8]
    assert Learned(LiveModel(background=False), explore_fraction=None)._cap(12) == 8
    assert Learned(LiveModel(background=False), max_explore=3)._cap(12) == 3
    monkeypatch.setattr(learned_mod, "EXPLORE_FLOOR", 2)
    ctx, cands, _ = softmax_context(rng)
    assert len(cands) >= 4
    small = Learned(LiveModel(background=False), max_explore=8, min_explore=1,
                    explore_fraction=0.25)
    d = small.decide(ctx, cands)
    assert len(d.explore) == 2 and small.state(ctx.key).cap == 2
    with pytest.raises(ValueError, match=r"explore_fraction must be a fraction in \(0, 1\] "
                                         r"or None, got 0"):
        Learned(LiveModel(background=False), explore_fraction=0)


def test_a_key_with_many_candidates_explores_a_share_of_them(rng):
    """explore_share: past max_explore on a key with many candidates (spmm's 116: 12 at
    0.1), never fewer than the other rules give (max_explore 3 on 2 candidates: the cap
    is 3, the share asks no more than the 2 there are); a cold decision explores that
    many."""
    share = Learned(LiveModel(background=False), explore_share=0.1)
    assert [share._cap(n) for n in (2, 5, 12, 20, 84, 100, 116)] == [4, 4, 5, 8, 9, 10, 12]
    tiny = Learned(LiveModel(background=False), explore_share=1.0, max_explore=3,
                   explore_fraction=None)
    assert [tiny._cap(n) for n in (2, 3, 7)] == [3, 3, 7]
    ctx, cands, _ = softmax_context(rng)
    wide = Learned(LiveModel(background=False), max_explore=2, min_explore=1,
                   explore_fraction=None, explore_share=1.0)
    d = wide.decide(ctx, cands)
    assert len(d.explore) == len(cands) == wide.state(ctx.key).cap
    for bad in (0, 1.5, "0.1"):
        with pytest.raises(ValueError, match=r"explore_share must be a fraction in \(0, 1\] "
                                             rf"or None, got {bad!r}"):
            Learned(LiveModel(background=False), explore_share=bad)


def _pack_rows(d, rng) -> list:
    """Softmax rows as a pack gives them: host_blocked[rows=32] 3x faster than the rest."""
    rows, op = [], OPS["softmax"]
    for r in (64, 128, 256, 512, 1024):
        x = rng.standard_normal((r, 96)).astype(np.float32)
        p = op.problem((x,), {})
        for c in d.candidates("softmax", x):
            t = (1.0 if c.label == "host_blocked[rows=32]" else 3.0) * r * 1e-3
            rows.append(Observation("softmax", dict(p.dims), p.dtype, c.variant.name,
                                    c.config, t, r * 1e-3, op.features(p)))
    return rows


def _held_fit(gate):
    """A model factory whose fit waits for ``gate`` (the start-up pack's fit, slowed)."""
    from adaptive.policy.cost_model import CostModel

    def held():
        assert gate.wait(30), "the test never opened the gate"
        return CostModel()
    return held


@pytest.mark.parametrize("off_thread", [False, True])
def test_a_miss_before_the_packs_first_fit_waits_for_it_once(rng, off_thread):
    """A server's first requests may come while the start-up pack's rows are still being
    fitted in the background (run S142: a decode input decided then explored diverse
    candidates and served a config 1.14x the best for the whole run). The decide waits for
    the fit and is ranked by the model; later misses do not wait; results are right.
    Decided on the miss, the caller waits; off the calling thread, the worker does, and
    the nearest pack input's fastest candidate serves the call at once."""
    gate = threading.Event()
    model = LiveModel(make=_held_fit(gate))
    policy = Learned(model, max_explore=3, samples=2, explore_budget=None)
    d = Dispatcher("host", policy=policy)
    d.decide_off_thread = off_thread
    d.add_observations(_pack_rows(d, rng))
    assert model.first_fit_pending
    # the fit is let go 0.3 s after the decide begins to wait for it (a fresh process's
    # first launch imports and prepares for 0.1-0.3 s first: a timer started before it
    # let the fit go before the decide came, or 0.12-0.19 s into its wait)
    first_fit = policy._first_fit

    def held_first_fit():
        threading.Timer(0.3, gate.set).start()
        return first_fit()
    policy._first_fit = held_first_fit
    x = rng.standard_normal((300, 96)).astype(np.float32) * 30.0   # large logits
    x[::7, ::5] = -np.inf                                            # masked
    t0 = time.perf_counter()
    assert np.max(np.abs(d.launch("softmax", x) - OPS["softmax"].reference(x))) < 1e-5
    if off_thread:
        assert time.perf_counter() - t0 < 0.25 and model.first_fit_pending
        assert d.decision("softmax", x).pending and not policy.keys
        assert d.wait_for_decisions(10.0)
    assert time.perf_counter() - t0 >= 0.25 and not model.first_fit_pending
    (state,) = policy.keys.values()
    assert re.match(r"waited 0\.[2-9]\d s for the model's first fit of \d+ pack rows; "
                    r"model ranked", state.reason), state.reason
    assert "host_blocked[rows=32]" in {c.label for c in state.explore}
    waited = policy.stats["first_fit_wait_s"]
    assert 0.29 <= waited < 5 and policy.stats["cold"] == 0
    y = rng.standard_normal((77, 40)).astype(np.float32)
    assert np.max(np.abs(d.launch("softmax", y) - OPS["softmax"].reference(y))) < 1e-5
    assert policy.stats["first_fit_wait_s"] == waited     # the second miss did not wait


def test_a_first_fit_past_its_bound_or_failed_leaves_the_miss_cold(rng, monkeypatch, caplog):
    """Past FIRST_FIT_WAIT_S the miss decides without the model and says so (a warning
    too); a fit that failed is not waited for at all."""
    from adaptive.policy import learned
    monkeypatch.setattr(learned, "FIRST_FIT_WAIT_S", 0.2)
    gate = threading.Event()
    model = LiveModel(make=_held_fit(gate))
    policy = Learned(model, max_explore=3, samples=2, explore_budget=None)
    d = Dispatcher("host", policy=policy)
    d.decide_off_thread = False   # the miss decides: its warning and its reason
    d.add_observations(_pack_rows(d, rng))
    x = rng.standard_normal((200, 50)).astype(np.float32)
    try:
        with caplog.at_level("WARNING", logger="adaptive.policy.learned"):
            d.launch("softmax", x)
    finally:
        gate.set()
    (state,) = policy.keys.values()
    assert state.reason.startswith(f"the model's first fit of {model.base_size} pack rows "
                                   "not done after 0 s; cold (no model yet)"), state.reason
    assert "still running after 0 s: this miss decides without it" in caplog.text

    monkeypatch.setattr(learned, "FIRST_FIT_WAIT_S", 30.0)
    gate = threading.Event()

    def broken():
        assert gate.wait(30), "the test never opened the gate"
        raise RuntimeError("no fit here")
    model = LiveModel(make=broken)
    policy = Learned(model, max_explore=3, samples=2, explore_budget=None)
    d = Dispatcher("host", policy=policy)
    d.decide_off_thread = False
    d.add_observations(_pack_rows(d, rng))
    threading.Timer(0.2, gate.set).start()
    with caplog.at_level("WARNING", logger="adaptive.policy.cost_model"):
        d.launch("softmax", x)            # waits for the fit, which fails
    (state,) = policy.keys.values()
    assert state.reason.startswith(f"the model's first fit of {model.base_size} pack rows "
                                   "failed (RuntimeError: no fit here); cold (no model "
                                   "yet)"), state.reason
    assert "the policy decides without a model" in caplog.text
    assert not model.first_fit_pending
    waited = policy.stats["first_fit_wait_s"]
    y = rng.standard_normal((20, 50)).astype(np.float32)
    d.launch("softmax", y)                # a failed fit is not waited for
    assert policy.stats["first_fit_wait_s"] == waited
    assert policy.keys[list(policy.keys)[-1]].reason.startswith("cold (no model yet)")


def test_measure_each_with_rounds_ranks_by_the_median_of_interleaved_timings(rng):
    """MeasureEach(rounds=3): one timing that met interference (the fast candidate's first,
    read 10x) does not decide; the candidates are timed in turn, each after a warm-up, and
    a failed one is not timed again. rounds=1 keeps the single timing's verdict."""
    from adaptive.policy import MeasureEach
    ctx0, cands, x = softmax_context(rng, rows=40, cols=24)
    fast, slow, broken = cands[0], cands[1], cands[2]
    calls = []
    reads = {fast.label: [5.0, 0.5, 0.5], slow.label: [1.0, 1.0, 1.0]}

    def measure(c, warmup=0):
        calls.append((c.label, warmup))
        if c == broken:
            return math.inf
        return reads[c.label][sum(1 for label, _ in calls if label == c.label) - 1]
    ctx = dataclasses.replace(ctx0, measure=measure)
    d = MeasureEach(rounds=3).decide(ctx, [fast, slow, broken])
    assert d.candidate == fast and dict(d.observed_ms) == {
        fast.label: 0.5, slow.label: 1.0, broken.label: math.inf}
    assert dict(d.samples) == {fast.label: 3, slow.label: 3, broken.label: 1}
    assert [label for label, _ in calls] == [fast.label, slow.label, broken.label,
                                             fast.label, slow.label, fast.label, slow.label]
    assert all(w == 1 for _, w in calls) and "median of 3" in d.reason
    calls.clear()
    assert MeasureEach().decide(ctx, [fast, slow]).candidate == slow    # 5.0 against 1.0
    for bad in (0, 2.0, True, None):
        with pytest.raises(ValueError, match=f"rounds must be an int >= 1, got {bad!r}"):
            MeasureEach(rounds=bad)
