"""The learned policy on the GPU with the shipped pack: what a server's first requests get
while the pack's rows are still being fitted."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from adaptive.ops import OPS

pytestmark = pytest.mark.gpu


def test_a_request_before_the_shipped_packs_fit_runs_sdpa_then_the_models_choice(cp, rng):
    """A decode-attention miss while the shipped pack's fit runs is served by SDPA (what
    the plain program runs) unexplored; once the fit is there, its next call drops the
    class, and the call after is a miss the model ranks and explores. Every result is
    right throughout (float64 reference, a causal decode step, large logits)."""
    pytest.importorskip("torch")
    from adaptive.dispatch import Dispatcher
    from adaptive.packs.install import load_pack, shipped_packs_for
    from adaptive.policy.cost_model import CostModel, LiveModel
    from adaptive.policy.learned import Learned
    from adaptive.variants import default_registry
    gate = threading.Event()

    def held():            # the pack's fit waits for the test
        assert gate.wait(120), "the test never opened the gate"
        return CostModel()
    model = LiveModel(make=held)
    policy = Learned(model, explore_budget=None)
    d = Dispatcher("cuda", policy=policy, registry=default_registry())
    d.sample_every = 1
    packs = shipped_packs_for(d.backend.fingerprint())
    if not packs:
        pytest.skip(f"no shipped pack for this GPU ({d.backend.fingerprint().get('name')})")
    assert load_pack(packs[0], registry=d.registry,
                     fingerprint=d.backend.fingerprint()).rows
    q = (rng.standard_normal((1, 8, 1, 64)) * 4).astype(np.float16)
    k, v = (rng.standard_normal((1, 8, 777, 64)).astype(np.float16) for _ in range(2))
    want = OPS["attention"].reference(q, k, v, causal=True)
    args = [cp.asarray(t) for t in (q, k, v)]

    def call():
        got = d.launch("attention", *args, causal=True)
        np.testing.assert_allclose(got.get(), want, rtol=2e-2, atol=2e-2)
    for _ in range(6):
        call()
    (state,) = policy.keys.values()
    assert state.awaiting and state.committed.variant.name == "sdpa_torch", state.history
    assert policy.stats["explore_calls"] == 0 and "still running" in state.history[0]
    gate.set()
    assert model.wait(120) and model.model is not None
    call()                 # served by SDPA, and the class dropped
    call()                 # the miss, ranked by the model
    for _ in range(40):    # its exploration and commit
        call()
    cp.cuda.get_current_stream().synchronize()
    d.harvest()
    (state,) = policy.keys.values()
    assert policy.stats["redecided"] == 1 and not state.awaiting
    assert state.history[1].startswith("miss: model ranked"), state.history
    assert policy.stats["explore_calls"] > 0
