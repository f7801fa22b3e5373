"""The dispatcher: decisions are cached per key, pinned choices are honoured, results come
back in the caller's array type, the default dispatcher is shared and thread-safe."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from background import Job
from variant_modules import softmax_pair

import adaptive
from adaptive.ops import OPS
from adaptive.policy import Decision, First
from adaptive.runtime import default_dispatcher


def test_launch_caches_one_decision_per_key(rng):
    d = adaptive.Dispatcher(backend="host", policy=adaptive.MeasureEach())
    a = rng.standard_normal((33, 17)).astype(np.float32)
    b = rng.standard_normal((17, 9)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(d.launch("gemm", a, b), a @ b, rtol=1e-4, atol=1e-5)
    assert d.stats["misses"] == 1
    decision = d.decision("gemm", a, b)
    assert isinstance(decision, Decision) and decision.candidate in d.candidates("gemm", a, b)
    assert len(decision.observed) == len(d.candidates("gemm", a, b))
    d.launch("gemm", b.T.copy(), a.T.copy())
    assert d.stats["misses"] == 2


def test_pinned_variant_runs_that_variant(rng):
    class Recording(First):
        def decide(self, ctx, candidates):
            raise AssertionError("a pinned variant with a full config needs no policy")

    d = adaptive.Dispatcher(backend="host", policy=Recording())
    x = rng.standard_normal((64, 40)).astype(np.float32)
    y = d.launch("softmax", x, variant="host_blocked", config={"rows": 8})
    np.testing.assert_allclose(y, OPS["softmax"].reference(x), rtol=1e-5)
    y = d.launch("softmax", x, variant="host_numpy")
    np.testing.assert_allclose(y, OPS["softmax"].reference(x), rtol=1e-5)


def test_policy_is_pluggable(rng):
    d = adaptive.Dispatcher(backend="host", policy=First())
    x = rng.standard_normal((20, 30)).astype(np.float32)
    d.launch("softmax", x)
    assert d.decision("softmax", x).candidate == d.candidates("softmax", x)[0]


def test_candidates_follow_requires(rng):
    x_small = rng.standard_normal((4, 10)).astype(np.float32)
    x_big = rng.standard_normal((600, 10)).astype(np.float32)
    small = {c.label for c in adaptive.candidates("softmax", x_small)}
    big = {c.label for c in adaptive.candidates("softmax", x_big)}
    assert small == {"host_numpy"}
    assert {"host_blocked[rows=8]", "host_blocked[rows=512]"} <= big


def test_module_launch_uses_one_default_dispatcher(rng):
    a = rng.standard_normal((5, 6)).astype(np.float32)
    b = rng.standard_normal((6, 7)).astype(np.float32)
    np.testing.assert_allclose(adaptive.launch("gemm", a, b), a @ b, rtol=1e-5)
    assert default_dispatcher((a,)) is default_dispatcher((b,))


def test_default_dispatcher_is_thread_safe(rng):
    adaptive.reset_defaults()
    a = rng.standard_normal((31, 29)).astype(np.float32)
    b = rng.standard_normal((29, 23)).astype(np.float32)
    ref = a @ b
    seen, errors = set(), []

    def work():
        try:
            for _ in range(20):
                np.testing.assert_allclose(adaptive.launch("gemm", a, b), ref, rtol=1e-4)
            seen.add(id(default_dispatcher((a,))))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(seen) == 1
    assert default_dispatcher((a,)).stats["misses"] == 1


def test_registry_change_drops_cached_decisions(rng, tmp_path):
    from adaptive.variants import Registry, builtin_folder, load_folder
    registry = Registry(load_folder(builtin_folder()))
    d = adaptive.Dispatcher(backend="host", registry=registry)
    x = rng.standard_normal((50, 8)).astype(np.float32)
    d.launch("softmax", x)
    assert d.decision("softmax", x) is not None
    registry.remove("softmax", "host_blocked")
    assert d.decision("softmax", x) is None
    d.launch("softmax", x)
    assert d.decision("softmax", x).candidate.variant.name == "host_numpy"


def test_torch_cpu_tensors_come_back_as_tensors(rng):
    torch = pytest.importorskip("torch")
    a = torch.from_numpy(rng.standard_normal((8, 5)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal((5, 3)).astype(np.float32))
    c = adaptive.Dispatcher(backend="host").launch("gemm", a, b)
    assert isinstance(c, torch.Tensor)
    np.testing.assert_allclose(c.numpy(), a.numpy() @ b.numpy(), rtol=1e-5)


_HEAVY = ("{'torch', 'transformers', 'sklearn', 'cupy', 'matplotlib', 'prometheus_client', "
          "'cupti', 'pynvml'}")
_ARGS = "np.ones((2, 2), 'f4'), np.ones((2, 2), 'f4')"
_IMPORTS = (f"import sys, adaptive, profilers, numpy as np\n"
            f"heavy = {_HEAVY}\n"
            "print(sorted(heavy & set(sys.modules)))\n"
            f"adaptive.launch('gemm', {_ARGS})\n"
            "print(sorted(heavy & set(sys.modules)))\n"
            f"adaptive.Dispatcher('host', policy='learned').launch('gemm', {_ARGS})\n"
            "print(sorted((heavy - {'sklearn'}) & set(sys.modules)))\n")

# a fresh process (each costs an interpreter start and scikit-learn's import), started with
# the session
BACKGROUND = {"heavy-imports": Job(lambda folder, config: ["-c", _IMPORTS], cpu_s=2.0, nice=19,
                                   timeout_s=300, env=lambda folder: {
                                       **os.environ, "ADAPTIVE_POLICY": "measure-each"})}


def test_import_leaves_heavy_dependencies_out(background):
    """One subprocess for every import check (each costs an interpreter start): importing
    adaptive and profilers, a host launch, then a learned dispatcher's launch."""
    done = background("heavy-imports")
    assert done.rc == 0, done.report()
    out = done.stdout.splitlines()
    assert out[0] == "[]", f"heavy modules imported by import adaptive, profilers: {out[0]}"
    assert out[1] == "[]", f"heavy modules imported by a host launch (measure-each): {out[1]}"
    assert out[2] == "[]", f"heavy modules imported by the learned policy: {out[2]}"


def test_config_override_and_env():
    from adaptive import config
    c = config.from_env({"ADAPTIVE_SAMPLE_EVERY": "7", "ADAPTIVE_BACKEND": "host"})
    assert (c.sample_every, c.backend) == (7, "host")
    with pytest.raises(ValueError, match="ADAPTIVE_SAMPLE_EVERY='x': expected an integer"):
        config.from_env({"ADAPTIVE_SAMPLE_EVERY": "x"})
    with config.override(sample_every=3):
        assert config.get().sample_every == 3
    assert config.get().sample_every != 3 or config.from_env().sample_every == 3
    with pytest.raises(adaptive.UnknownNameError, match="did you mean 'sample_every'"):
        with config.override(sample_evry=1):
            pass


def test_errors_survive_pickling():
    import pickle
    for err in (adaptive.UnknownNameError("op", "gem", ["gemm"]),
                adaptive.ManifestError("m.toml", "variant[0].name", "missing"),
                adaptive.CompileError("k", {"BM": 64}, "error: x", "int main;")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
    assert "   1 | int main;" in str(adaptive.CompileError("k", {}, "log", "int main;"))


def test_sampling_reaches_every_key_of_a_periodic_launch_loop(rng):
    """A decode step repeats the same 8 launches; with one call in 64 timed at a fixed
    place, every sample met the step's first launch and drift never saw the other seven.
    One sample in each block of 64 calls, at a pseudo-random place in it: still exactly one
    in 64, spread over every key."""
    from collections import Counter
    from adaptive.dispatch import Recorder

    class Count(Recorder):
        wraps_launches = False

        def __init__(self):
            super().__init__()
            self.keys = Counter()

        def timed(self, plan, time_ms):
            self.keys[plan.key] += 1
    d = adaptive.Dispatcher(backend="host", policy=adaptive.MeasureEach())
    d.sample_every = 64
    count = Count()
    d.add_recorder(count)
    step = [rng.standard_normal((4, 8 + i)).astype(np.float32) for i in range(8)]
    for _ in range(640):
        for x in step:
            d.launch("softmax", x)
    assert sum(count.keys.values()) == 640 * 8 // 64
    assert len(count.keys) == 8 and min(count.keys.values()) >= 3, count.keys


def test_recorders_chain_newest_first_and_relink_when_one_leaves(rng):
    """Wrapping recorders run each launch newest first, the last one running the plan once;
    taking one out of the middle or the head links the rest, and it sees no launch after."""
    from adaptive.dispatch import Recorder

    class Through(Recorder):
        def __init__(self, name, order):
            super().__init__()
            self.name, self.order = name, order

        def __call__(self, plan, args, out):
            self.order.append(self.name)
            return self._next(plan, args, out)

    d = adaptive.Dispatcher(backend="host", policy=adaptive.MeasureEach())
    d.sample_every = 0
    x = rng.standard_normal((4, 8)).astype(np.float32)
    want = d.launch("softmax", x)              # committed: later calls go through the chain
    runs = []
    for plan in list(d._plans.values()):
        run = plan.run
        plan.run = lambda args, out, run=run: runs.append(1) or run(args, out)
    order = []
    a, b, c = (Through(n, order) for n in "abc")
    for r in (a, b, c):
        d.add_recorder(r)
    assert d.recorder is c and c.inner is b and b.inner is a and a.inner is None
    np.testing.assert_allclose(d.launch("softmax", x), want)
    assert order == ["c", "b", "a"] and runs == [1]
    d.remove_recorder(b)                       # the middle one
    assert c.inner is a
    order.clear()
    d.launch("softmax", x)
    assert order == ["c", "a"] and len(runs) == 2
    d.remove_recorder(c)                       # the head
    assert d.recorder is a
    order.clear()
    d.launch("softmax", x)
    assert order == ["a"] and len(runs) == 3
    d.remove_recorder(a)
    assert d.recorder is None
    order.clear()
    d.launch("softmax", x)
    assert order == [] and len(runs) == 4


def test_a_miss_lists_the_candidates_of_the_variants_registered_now(rng):
    """The dispatcher keeps each variant's configs and candidates between misses; a variant
    replaced under its name (a regenerated one, another space) is listed anew, and its
    candidates are its own."""
    import dataclasses

    from adaptive.space import Space
    from adaptive.variants import Registry, default_registry
    reg = Registry(default_registry().variants("softmax", "host"))
    d = adaptive.Dispatcher(backend="host", registry=reg)
    x = rng.standard_normal((300, 64)).astype(np.float32)
    first = d.candidates("softmax", x)
    assert {c.label for c in first} >= {"host_blocked[rows=8]", "host_blocked[rows=32]"}
    again = d.candidates("softmax", x)
    assert [c.label for c in again] == [c.label for c in first]
    assert all(a is b for a, b in zip(first, again))          # made once, kept
    old = reg.get("softmax", "host_blocked")
    new = dataclasses.replace(old, space=Space.from_dict({"rows": [16]}))
    reg.add(new, replace=True)
    labels = [c.label for c in d.candidates("softmax", x)]
    assert "host_blocked[rows=16]" in labels and "host_blocked[rows=8]" not in labels
    assert all(c.variant is new for c in d.candidates("softmax", x)
               if c.variant.name == "host_blocked")


def test_a_space_admits_its_configs_once_per_process_and_hands_out_new_dicts(monkeypatch):
    """Each dispatcher has a registry of its own, whose spaces are new objects: the configs
    a device admits are enumerated once per space definition and limits, not once per
    dispatcher; each caller gets dicts of its own; other limits or another definition
    enumerate anew."""
    from adaptive.space import Space
    table = {"BM": [32, 64, 128], "W": [1, 2, 4],
             "constraints": ["BM * W <= max_threads_per_block"]}
    calls = []
    admits = Space.admits
    monkeypatch.setattr(Space, "admits", lambda self, c, limits: calls.append(c) or
                        admits(self, c, limits))
    limits = {"max_threads_per_block": 256, "sm_count": 7}
    first = Space.from_dict(table).configs(limits)
    assert len(calls) == 9 and first == [{"BM": bm, "W": w} for bm in (32, 64, 128)
                                          for w in (1, 2, 4) if bm * w <= 256]
    again = Space.from_dict(dict(table)).configs(dict(reversed(list(limits.items()))))
    assert again == first and len(calls) == 9           # another object, the same space
    again[0]["BM"] = 999                                 # a caller's dicts are its own
    assert Space.from_dict(table).configs(limits) == first and len(calls) == 9
    assert len(Space.from_dict(table).configs({**limits, "max_threads_per_block": 128})) \
        == 6 and len(calls) == 18                        # other limits: enumerated anew
    Space.from_dict({**table, "W": [1, 2]}).configs(limits)
    assert len(calls) == 24                              # another definition: anew


def test_prepared_candidates_are_the_ones_a_miss_lists(rng):
    """prepare_candidates makes every variant's candidates (labels too) up front, as
    adaptive.runtime.start does; an op's first miss then lists those very objects, and a
    variant whose optional module is missing is left to its miss."""
    from adaptive import optional
    d = adaptive.Dispatcher("host")
    n = d.prepare_candidates(["softmax", "gemm"])
    made = {id(c) for v in d.registry.variants("softmax", "host") + d.registry.variants(
        "gemm", "host") if v.id in d._configs for c in d._configs[v.id][2].values()}
    assert n == len(made) > 4
    for v in d.registry.variants("gemm", "host"):
        assert (v.id in d._configs) == (not v.needs or optional.missing(v.needs) is None)
    x = rng.standard_normal((33, 70)).astype(np.float32)
    listed = d.candidates("softmax", x)
    assert listed and all(id(c) in made and "label" in vars(c) for c in listed)
    assert "attention/" not in " ".join(d._configs)     # only the ops asked for
    assert d.prepare_candidates() > n and all(
        any(k.startswith(op + "/") for k in d._configs) for op in ("attention", "spmm"))


def test_a_candidate_the_policy_wants_timed_again_gets_its_turns(rng):
    """Policy.samples_wanted: where the policy asks for more samples of an explored
    candidate than ``samples`` (its samples disagree), the rotation gives it those turns;
    the others stop at ``samples`` and the class commits once the policy has them."""
    from adaptive.policy import BasePolicy, Decision

    class Wanting(BasePolicy):
        samples = 2

        def __init__(self):
            self.seen = {}

        def decide(self, ctx, candidates):
            self.pair = tuple(candidates[:2])
            return Decision(self.pair[0], "explore two", explore=self.pair)

        def samples_wanted(self, key, candidate):
            return 4 if candidate == self.pair[1] else None

        def observe(self, key, candidate, time_ms):
            self.seen[candidate] = self.seen.get(candidate, 0) + 1
            a, b = self.pair
            if self.seen.get(a, 0) >= 2 and self.seen.get(b, 0) >= 4:
                return Decision(a, "committed")
            return None
    x = rng.standard_normal((600, 24)).astype(np.float32)
    key = OPS["softmax"].key((x,), {})

    def served(policy):
        d = adaptive.Dispatcher("host", policy=policy)
        for _ in range(12):
            np.testing.assert_allclose(d.launch("softmax", x), OPS["softmax"].reference(x),
                                       rtol=1e-5)
            if not d.current_plan(key).provisional:
                break
        return d.current_plan(key).provisional
    policy = Wanting()
    assert not served(policy)
    a, b = policy.pair
    # on the host a candidate's first turn is a sample too: a gets its 2 and that one
    assert policy.seen == {a: 3, b: 4}
    deaf = Wanting()
    deaf.samples_wanted = lambda key, candidate: None   # samples alone: b is held at 3
    from adaptive.counterlog import counter_log
    import tempfile
    with tempfile.TemporaryDirectory() as tmp, \
            counter_log(f"{tmp}/held.alog", sample_every=1, govern=False) as clog:
        assert served(deaf)
    assert deaf.seen == {a: 3, b: 3}
    # the calls served untimed while the samples are held reach the log as plain ones:
    # one record a call
    assert clog.stats.written == 12 and clog.stats.dropped == 0


# ---- a new input class decided off the calling thread ----------------------------------------

class _Gated(adaptive.Learned):
    """The learned policy whose decide waits for the test (``go``), counting its calls
    and the threads they ran on."""

    def __init__(self, fail: bool = False):
        from adaptive.policy.cost_model import LiveModel
        super().__init__(LiveModel(background=False), max_explore=2, samples=2)
        self.go, self.entered, self.threads, self.fail = threading.Event(), 0, [], fail
        self.inside = threading.Event()

    def decide(self, ctx, candidates):
        self.entered += 1
        self.threads.append(threading.current_thread().name)
        self.inside.set()
        assert self.go.wait(10.0)
        if self.fail:
            raise RuntimeError("the model broke")
        return super().decide(ctx, candidates)


def _softmax64(x):
    z = x.astype(np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_a_new_class_is_served_by_the_library_while_a_worker_decides_it(rng):
    """The miss returns the baseline's result at once, untimed, while the worker thread
    decides; a second key of the class meanwhile is served the same way; the decision then
    reaches both keys, and the worker ends once the queue is empty."""
    policy = _Gated()
    d = adaptive.Dispatcher("host", policy=policy, registry=softmax_pair())
    d.decide_off_thread = True
    d.sample_every = 1
    x = rng.standard_normal((48, 33)).astype(np.float32) * 30   # large logits
    x[:, :5] = -np.inf                                           # masked
    y = rng.standard_normal((49, 33)).astype(np.float32)          # same class, another key
    for _ in range(3):
        np.testing.assert_allclose(d.launch("softmax", x), _softmax64(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d.launch("softmax", y), _softmax64(y), rtol=1e-5, atol=1e-6)
    plan = d.current_plan(OPS["softmax"].key((x,), {}))
    assert plan.provisional and plan.candidate.variant.name == "plain"
    assert "off the calling thread; plain (what the plain program runs) serves" \
        in plan.decision.reason
    assert plan.decision.pending and not plan.decision.settled
    assert adaptive.explain("softmax", x, dispatcher=d).state == "deciding"
    assert policy.keys == {} and policy.stats["decisions"] == 0   # nothing decided yet
    assert d.stats["samples"] == 0          # served untimed, though every call is sampled
    assert policy.inside.wait(10.0) and policy.entered == 1
    assert policy.threads == ["adaptive-decide"]
    assert not d.wait_for_decisions(0.05)   # still deciding
    policy.go.set()
    assert d.wait_for_decisions(10.0) and d.settle(10.0)
    assert not any(t.name == "adaptive-decide" for t in threading.enumerate())
    assert policy.stats["decisions"] == 1 and d.stats["decisions"] == 1
    for key in (OPS["softmax"].key((x,), {}), OPS["softmax"].key((y,), {})):
        plan = d.current_plan(key)
        assert plan is None or "off the calling thread" not in plan.decision.reason
    decided = d.off_thread_decides()
    assert len(decided) == 1 and decided[0]["op"] == "softmax"
    assert decided[0]["wait_ms"] >= decided[0]["policy_ms"] > 0
    for _ in range(12):   # the exploration, then the commit, served as decided
        np.testing.assert_allclose(d.launch("softmax", x), _softmax64(x), rtol=1e-5, atol=1e-6)
    plan = d.current_plan(OPS["softmax"].key((x,), {}))
    assert not plan.provisional and plan.decision.settled and d.stats["samples"] > 0
    assert adaptive.explain("softmax", x, dispatcher=d).state == "committed"
    assert "explor" in " ".join(policy.state(plan.class_key).history)


def test_a_decide_that_fails_off_the_thread_says_so_and_the_library_serves(rng, caplog):
    policy = _Gated(fail=True)
    d = adaptive.Dispatcher("host", policy=policy, registry=softmax_pair())
    d.decide_off_thread = True
    x = rng.standard_normal((20, 7)).astype(np.float32)
    policy.go.set()
    with caplog.at_level("ERROR", logger="adaptive"):
        d.launch("softmax", x)
        assert d.wait_for_decisions(10.0)
    assert "deciding softmax" in caplog.text and "plain serves it" in caplog.text
    np.testing.assert_allclose(d.launch("softmax", x), _softmax64(x), rtol=1e-5, atol=1e-6)
    plan = d.current_plan(OPS["softmax"].key((x,), {}))
    assert not plan.provisional and plan.candidate.variant.name == "plain"
    assert "decide failed (RuntimeError: the model broke); plain, its stand-in, serves it, " \
        "committed" in plan.decision.reason


def test_a_failure_handing_over_the_decision_commits_the_stand_in_and_the_worker_goes_on(
        rng, caplog):
    """Past the policy's decide (a bug handing the decision to the keys): each class is
    committed to its stand-in and says why, the worker decides the next queued class and
    ends; no class stays pending."""
    policy = _Gated()
    d = adaptive.Dispatcher("host", policy=policy, registry=softmax_pair())
    d.decide_off_thread = True

    def broken(class_key, decision):
        raise KeyError("a bug")
    d._revise = broken
    xs = [rng.standard_normal(shape).astype(np.float32) for shape in ((20, 7), (20, 9))]
    for x in xs:   # two classes queued
        d.launch("softmax", x)
    with caplog.at_level("ERROR", logger="adaptive"):
        policy.go.set()
        assert d.wait_for_decisions(10.0)
    assert caplog.text.count("its decision failed; plain, its stand-in, serves it") == 2
    assert not any(t.name == "adaptive-decide" for t in threading.enumerate())
    for x in xs:
        np.testing.assert_allclose(d.launch("softmax", x), _softmax64(x), rtol=1e-5, atol=1e-6)
        decision = d.decision("softmax", x)
        assert decision.settled and decision.candidate.variant.name == "plain"
        assert "handing the decision to its keys failed (KeyError: 'a bug')" in decision.reason


def test_a_class_forgotten_while_it_is_decided_is_decided_again(rng):
    policy = _Gated()
    d = adaptive.Dispatcher("host", policy=policy, registry=softmax_pair())
    d.decide_off_thread = True
    x = rng.standard_normal((20, 7)).astype(np.float32)
    d.launch("softmax", x)
    d.forget()
    policy.go.set()
    assert d.wait_for_decisions(10.0)
    assert d.current_plan(OPS["softmax"].key((x,), {})) is None and d.off_thread_decides() == []
    d.launch("softmax", x)          # a new miss, a new decide
    assert d.wait_for_decisions(10.0) and policy.entered == 2


@pytest.mark.parametrize("how", ["dispatcher", "config", "policy", "host"])
def test_a_class_is_decided_on_the_miss_where_off_thread_decides_do_not_apply(rng, how):
    """Switched off on the dispatcher or by ADAPTIVE_DECIDE_OFF_THREAD, a policy without a
    stand-in (measure-each runs every candidate), or by default on the host (its calls are
    CPU work timed by the wall clock): the miss decides, on the calling thread."""
    from adaptive import config
    policy = adaptive.MeasureEach() if how == "policy" else _Gated()
    if how != "policy":
        policy.go.set()
    d = adaptive.Dispatcher("host", policy=policy, registry=softmax_pair())
    d.decide_off_thread = {"dispatcher": False, "policy": True}.get(how)
    if how == "config":   # timed as on a GPU: the config's choice
        d._event_timer = lambda: object()
    x = rng.standard_normal((20, 7)).astype(np.float32)
    with config.override(decide_off_thread=how != "config"):
        d.launch("softmax", x)
    plan = d.current_plan(OPS["softmax"].key((x,), {}))
    assert "off the calling thread" not in plan.decision.reason
    assert d.off_thread_decides() == [] and d.stats["decisions"] == 1
    if how != "policy":
        assert policy.threads == [threading.current_thread().name] and plan.provisional


def test_by_default_a_class_is_decided_off_the_thread_where_calls_are_timed_by_events(rng):
    policy = _Gated()
    policy.go.set()
    d = adaptive.Dispatcher("host", policy=policy, registry=softmax_pair())
    d._event_timer = lambda: None   # the host: decided on the miss
    x = rng.standard_normal((20, 7)).astype(np.float32)
    d.launch("softmax", x)
    assert not d.decision("softmax", x).pending
    d._event_timer = lambda: object()   # timed as on a GPU: off the calling thread
    y = rng.standard_normal((300, 70)).astype(np.float32)
    d.launch("softmax", y)
    assert d.wait_for_decisions(10.0) and policy.threads[-1] == "adaptive-decide"


def test_off_thread_decides_switch_reads_the_environment():
    from adaptive import config
    assert config.Config().decide_off_thread is True   # the default
    assert config.from_env({"ADAPTIVE_DECIDE_OFF_THREAD": "0"}).decide_off_thread is False
    assert config.from_env({"ADAPTIVE_DECIDE_OFF_THREAD": "on"}).decide_off_thread is True
    with pytest.raises(ValueError, match="ADAPTIVE_DECIDE_OFF_THREAD='maybe': expected 1 or 0"):
        config.from_env({"ADAPTIVE_DECIDE_OFF_THREAD": "maybe"})


def test_without_a_library_candidate_the_nearest_measured_inputs_fastest_stands_in(rng):
    """Host softmax on NumPy arrays has no library candidate: the fastest candidate of the
    nearest measured input (within far_distance) whose fastest fits serves the new class
    while it is decided; with no measured input near, the miss decides on the calling
    thread."""
    from adaptive.ops import get_op
    policy = _Gated()
    d = adaptive.Dispatcher("host", policy=policy)
    d.decide_off_thread = True
    seen = rng.standard_normal((64, 40)).astype(np.float32)
    o = get_op("softmax")
    pick = next(c for c in d.candidates("softmax", seen) if c.variant.name == "host_blocked"
                and c != d.candidates("softmax", seen)[0])
    policy.neighbours.add("softmax", "float32", o.features(o.problem((seen,), {})),
                          pick.variant.name, pick.config_items, 0.01)
    near = rng.standard_normal((70, 40)).astype(np.float32)
    # nearer still, an input whose fastest does not fit here (a retired variant): passed over
    policy.neighbours.add("softmax", "float32", o.features(o.problem((near,), {})),
                          "retired", (), 0.005)
    np.testing.assert_allclose(d.launch("softmax", near), _softmax64(near), rtol=1e-5,
                               atol=1e-6)
    plan = d.current_plan(o.key((near,), {}))
    assert plan.decision.pending and plan.candidate == pick
    assert f"{pick.label} (the fastest on a near measured input, 0." in plan.decision.reason
    policy.go.set()
    assert d.wait_for_decisions(10.0) and policy.stats["decisions"] == 1
    far = rng.standard_normal((2048, 1000)).astype(np.float32)
    np.testing.assert_allclose(d.launch("softmax", far), _softmax64(far), rtol=1e-5, atol=1e-6)
    plan = d.current_plan(o.key((far,), {}))
    assert not plan.decision.pending and policy.stats["decisions"] == 2
    assert policy.threads[-1] == threading.current_thread().name


def test_off_thread_decides_under_threads_launching_and_forgetting_at_once(rng):
    """Eight threads launch 12 input classes each (results checked against float64) while
    another forgets the softmax decisions twice: every call is right, no class is left
    pending, and each class, called again, settles."""
    from adaptive.policy.cost_model import LiveModel
    policy = adaptive.Learned(LiveModel(background=False), max_explore=2, samples=2)
    d = adaptive.Dispatcher("host", policy=policy, registry=softmax_pair())
    d.decide_off_thread = True
    d.sample_every = 1
    shapes = [(int(r), int(c)) for r, c in zip(rng.integers(1, 300, 12),
                                               rng.integers(2, 200, 12))]
    inputs = [rng.standard_normal(s).astype(np.float32) * 20 for s in shapes]
    errors = []

    def serve(seed):
        order = np.random.default_rng(seed).permutation(len(inputs))
        try:
            for i in np.concatenate([order, order, order]):
                np.testing.assert_allclose(d.launch("softmax", inputs[i]),
                                           _softmax64(inputs[i]), rtol=1e-5, atol=1e-6)
        except Exception as exc:  # noqa: BLE001 (reported by the test below)
            errors.append(exc)

    def forget():
        for _ in range(2):
            threading.Event().wait(0.005)
            d.forget("softmax")
    threads = [threading.Thread(target=serve, args=(s,)) for s in range(8)]
    threads.append(threading.Thread(target=forget))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert not errors, errors[:3]
    assert d.wait_for_decisions(30.0)
    for x in inputs:   # each class served to its commit (a class forgotten and not met
        for _ in range(40):   # since is decided anew: its decide waited for)
            d.launch("softmax", x)
            assert d.wait_for_decisions(10.0)
            if d.decision("softmax", x).settled:
                break
        assert d.decision("softmax", x).settled, d.decision("softmax", x).reason
    classes = {d.current_plan(OPS["softmax"].key((x,), {})).class_key for x in inputs}
    assert d.wait_for_decisions(1.0) and len(d.off_thread_decides()) >= len(classes)


def test_a_sample_of_a_plan_made_before_a_forget_reaches_no_policy_state(rng):
    """A call in flight across forget() or forget_key(): its sample would land on the state
    of the class decided since, whose exploration then never commits; it goes to the
    recorders only. Another op's plans are not touched by forgetting this one's."""
    from adaptive.policy.cost_model import LiveModel
    policy = adaptive.Learned(LiveModel(background=False), max_explore=2, samples=2)
    d = adaptive.Dispatcher("host", policy=policy, registry=softmax_pair())
    d.decide_off_thread = False
    timed = []

    from adaptive.dispatch import Recorder

    class Listening(Recorder):
        wraps_launches = False

        def timed(self, plan, time_ms):
            timed.append(plan.candidate.label)
    d.add_recorder(Listening())
    x = rng.standard_normal((20, 7)).astype(np.float32)
    d.launch("softmax", x)
    old = d.current_plan(OPS["softmax"].key((x,), {}))
    d.forget()
    d.launch("softmax", x)   # decided again: a fresh exploration
    (state,) = policy.keys.values()
    seen = {c.label: len(s) for c, s in state.observed.items()}
    d.feedback(old, 1.0)
    assert {c.label: len(s) for c, s in state.observed.items()} == seen
    assert timed[-1] == old.candidate.label          # the recorders saw it
    new = d.current_plan(OPS["softmax"].key((x,), {}))
    d.feedback(new, 1.0)                               # a sample of the new plan counts
    assert sum(len(s) for s in state.observed.values()) == sum(seen.values()) + 1
    d.forget("gemm")                                   # another op: this one's plans stand
    d.feedback(new, 1.0)
    assert sum(len(s) for s in state.observed.values()) == sum(seen.values()) + 2
    key = OPS["softmax"].key((x,), {})
    d.forget_key(key)                                  # one key's class (pinning, eviction)
    d.launch("softmax", x)
    (state,) = policy.keys.values()
    seen = sum(len(s) for s in state.observed.values())
    d.feedback(new, 1.0)
    assert sum(len(s) for s in state.observed.values()) == seen
    d.feedback(d.current_plan(key), 1.0)
    assert sum(len(s) for s in state.observed.values()) == seen + 1


def test_two_threads_samples_of_a_class_revise_it_in_the_order_the_policy_answered(rng):
    """The policy answers thread A's sample first (an older decision) but A is slow to
    hand it over; thread B's sample, answered after, must be the class's decision at the
    end: a sample's observe and revise are not interleaved with another's."""
    from adaptive.policy import BasePolicy

    class Slow(BasePolicy):
        name = "slow"

        def decide(self, ctx, candidates):
            self.cands = tuple(candidates)
            return Decision(candidates[0], "explore both", explore=self.cands)

        def observe(self, key, candidate, time_ms):
            if time_ms == 1.0:            # A: answered first, handed over late
                answer = Decision(self.cands[0], "older: narrowed", explore=self.cands[:1])
                threading.Event().wait(0.3)
                return answer
            if time_ms == 2.0:            # B: answered after A
                return Decision(self.cands[0], "newer: committed")
            return None                   # the launch's own samples
    d = adaptive.Dispatcher("host", policy=Slow(), registry=softmax_pair())
    d.sample_every = 0
    x = rng.standard_normal((20, 7)).astype(np.float32)
    d.launch("softmax", x)
    plan = d.current_plan(OPS["softmax"].key((x,), {}))
    a = threading.Thread(target=d.feedback, args=(plan, 1.0))
    b = threading.Thread(target=d.feedback, args=(plan, 2.0))
    a.start()
    threading.Event().wait(0.05)
    b.start()
    a.join()
    b.join()
    assert d.decision("softmax", x).reason == "newer: committed"
