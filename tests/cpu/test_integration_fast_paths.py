"""The warm paths of the transformers integration: a patched linear whose committed plan is
torch's own matmul calls ``F.linear`` itself, and attention plans that run one function
for every key of their input class are held by class. Both still send one call in
HOLD_EVERY through the dispatcher (fewer while the plan holds: one in HOLD_EVERY << level,
the level one up after each routed call that finds the same plan, to HOLD_DOUBLINGS), let
go of stale plans, and never hold exploring ones.

The default CPU dispatcher is replaced here by a host one whose variants are torch's own
calls (as the H200 commits cuBLAS and SDPA for such a model), and put back after."""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import re
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is in the test extra")
pytest.importorskip("transformers", reason="transformers is in the test extra")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import adaptive  # noqa: E402
from adaptive import runtime  # noqa: E402
from adaptive.integrations import transformers as at  # noqa: E402
from adaptive.integrations import linear as linear_mod  # noqa: E402
from adaptive.integrations import direct as direct_mod  # noqa: E402
from adaptive.integrations.norm import AdaptiveRMSNorm  # noqa: E402
from adaptive.integrations.routing import HOLD_DOUBLINGS  # noqa: E402
from adaptive.variants import Registry  # noqa: E402
from hf_masks import cache_keyword  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.cpu_patched_linear import library_dispatcher  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "server"))
from engine import route_spy  # noqa: E402

HOLD_EVERY = linear_mod.HOLD_EVERY
# the calls here are scripted one by one (which reach the dispatcher, which are held): a
# new class is decided on its miss, not off the calling thread
pytestmark = pytest.mark.usefixtures("decided_on_the_miss")


# a layer's warm calls from its first routed one to its fourth at the top level: the gaps
# between routed calls double from HOLD_EVERY to HOLD_EVERY << HOLD_DOUBLINGS
BACKOFF_CALLS = HOLD_EVERY * (2 << HOLD_DOUBLINGS) + 2 * (HOLD_EVERY << HOLD_DOUBLINGS)


def _backed_off(routed: list[int]) -> bool:
    """Whether the indices of routed warm calls (the first routed within HOLD_EVERY calls)
    are HOLD_EVERY, 2 HOLD_EVERY, ... apart, up to HOLD_EVERY << HOLD_DOUBLINGS."""
    gaps = [b - a for a, b in zip(routed, routed[1:])]
    return routed[0] < HOLD_EVERY and len(gaps) >= HOLD_DOUBLINGS + 2 and gaps == [
        HOLD_EVERY << min(j, HOLD_DOUBLINGS) for j in range(len(gaps))]


class _Counted:
    """Counts the dispatcher's ``run`` calls (what the layers send through it)."""

    def __init__(self, d):
        self.calls = 0
        real = d.run

        def run(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)
        d.run = run


@pytest.fixture
def library():
    """The library dispatcher as the CPU default (and the previous one back after)."""
    torch.set_num_threads(1)
    like = torch.empty(1)
    before = runtime.default_dispatcher(device="cpu")
    d = library_dispatcher()
    runtime.set_default(d, like)
    at.forget_held()
    yield d
    runtime.set_default(before, like)
    at.forget_held()


@pytest.fixture
def ours():
    """A CPU default dispatcher whose only gemm is the host's own (NumPy BLAS), not torch's:
    what a kernel of ours is to a patched layer (the default one also has torch_mm)."""
    torch.set_num_threads(1)
    like = torch.empty(1)
    before = runtime.default_dispatcher(device="cpu")
    d = adaptive.Dispatcher(backend="host", registry=Registry(
        [adaptive.variants.shared_registry().get("gemm", "host_blas")]))
    runtime.set_default(d, like)
    at.forget_held()
    yield d
    runtime.set_default(before, like)
    at.forget_held()


def _reference(x, layer):
    return x.double() @ layer.weight.detach().double().t() + layer.bias.detach().double()


def test_a_warm_library_plan_is_plain_f_linear_with_one_call_in_hold_every_routed(library):
    counted = _Counted(library)
    torch.manual_seed(0)
    layer = at.AdaptiveLinear(torch.nn.Linear(24, 10), "dense", "mlp").eval()
    x = torch.randn(3, 5, 24)
    y = layer(x)
    torch.testing.assert_close(y.double(), _reference(x, layer), rtol=1e-5, atol=1e-5)
    assert counted.calls == 1 and list(layer._library) == [x.shape]
    routed = []
    for i in range(BACKOFF_CALLS):
        x = torch.randn(3, 5, 24)
        before = counted.calls
        torch.testing.assert_close(layer(x).double(), _reference(x, layer), rtol=1e-5,
                                   atol=1e-5)
        if counted.calls > before:
            routed.append(i)
    assert _backed_off(routed), routed     # the rest never reached the dispatcher


def test_layers_called_once_per_token_route_on_different_tokens(library):
    """155 layers (a 1.1B Llama's linears) each routing one call in HOLD_EVERY: about
    155 / HOLD_EVERY of them per token, never all of them on one token (a p99 spike)."""
    layers = [at.AdaptiveLinear(torch.nn.Linear(8, 8), "dense").eval() for _ in range(155)]
    x = torch.randn(1, 1, 8)
    for layer in layers:
        layer(x)
    counted = _Counted(library)
    per_token = []
    for _ in range(2 * HOLD_EVERY):
        before = counted.calls
        for layer in layers:
            layer(x)
        per_token.append(counted.calls - before)
    assert sum(per_token) == 2 * len(layers)
    assert max(per_token) <= math.ceil(len(layers) / HOLD_EVERY) + 1, per_token


def test_a_stale_plan_goes_back_through_the_dispatcher(library):
    counted = _Counted(library)
    layer = at.AdaptiveLinear(torch.nn.Linear(16, 8), "dense").eval()
    x = torch.randn(1, 1, 16)
    layer(x)
    plan = layer._library[x.shape]
    layer._level = HOLD_DOUBLINGS           # as after many routed calls that held
    library.forget("gemm")
    assert plan.stale
    before = counted.calls
    x = torch.randn(1, 1, 16)
    torch.testing.assert_close(layer(x).double(), _reference(x, layer), rtol=1e-5, atol=1e-5)
    assert counted.calls == before + 1
    assert layer._library[x.shape] is not plan and not layer._library[x.shape].stale
    assert layer._level == 0                # the new plan watched at HOLD_EVERY again


def test_a_norm_committed_to_the_models_own_ops_calls_its_forward(library):
    """A shape committed to rmsnorm's baseline (the model's eight ops) runs the replaced
    LlamaRMSNorm's forward itself, bit for bit the plain norm's output, one call in
    HOLD_EVERY routed; a stale plan goes back through the dispatcher."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from adaptive.integrations import norm as norm_mod
    counted = _Counted(library)
    torch.manual_seed(0)
    plain = LlamaRMSNorm(40, eps=1e-5)
    with torch.no_grad():
        plain.weight.normal_()
    norm = norm_mod.AdaptiveRMSNorm(LlamaRMSNorm(40, eps=1e-5), "norm").eval()
    norm.load_state_dict(plain.state_dict())
    own = []
    original = norm._original.forward
    norm._original.forward = lambda x: own.append(1) or original(x)
    x = torch.randn(2, 3, 40) * 30
    with torch.no_grad():
        assert torch.equal(norm(x), plain(x))
        assert counted.calls == 1 and own == [] and list(norm._own) == [x.shape]
        assert norm.route_of(x) == "the model's norm (held)" and not norm._held
        routed = []
        for i in range(BACKOFF_CALLS):
            x = torch.randn(2, 3, 40) * 30
            before = counted.calls
            assert torch.equal(norm(x), plain(x))
            if counted.calls > before:
                routed.append(i)
        assert _backed_off(routed), routed
        assert len(own) == BACKOFF_CALLS - len(routed)
        plan = norm._own[x.shape]
        library.forget("rmsnorm")
        assert plan.stale and norm.route_of(x) == "dispatcher"
        before = counted.calls
        assert torch.equal(norm(x), plain(x))
        assert counted.calls == before + 1 and not norm._own[x.shape].stale
        assert norm._level == 0


def test_a_new_shape_goes_through_the_dispatcher_once_then_each_shape_is_held(library):
    counted = _Counted(library)
    layer = at.AdaptiveLinear(torch.nn.Linear(16, 8), "dense").eval()
    shapes = [(1, 1, 16), (2, 7, 16), (1, 1, 16), (5, 16), (2, 7, 16)]
    for shape in shapes:
        x = torch.randn(*shape)
        y = layer(x)
        assert y.shape == shape[:-1] + (8,)
        torch.testing.assert_close(y.double(), _reference(x, layer), rtol=1e-5, atol=1e-5)
    assert counted.calls == 3   # one per new shape
    assert set(layer._library) == {torch.Size(s) for s in shapes}


class _Copies:
    """Counts the copies torch makes (``aten::copy_``, what ``.contiguous()`` of a
    transposed view runs) while open."""

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU])
        self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        self._prof.__exit__(*exc)
        self.n = sum(e.count for e in self._prof.key_averages() if e.key == "aten::copy_")


def test_a_weight_kept_as_given_serves_a_new_shape_by_f_linear_without_copies(library):
    """A new input shape of a class whose plan is torch's matmul: F.linear on x as given
    (no transposed copy of x, none of the output), held from the first call; the
    dispatcher is asked for the plan only, never launched (run S33: the two copies of
    every new prefill shape were 21 ms of a 46 ms prefill)."""
    counted = _Counted(library)
    plain = torch.nn.Linear(16, 8)
    layer = at.AdaptiveLinear(plain, "shared").eval()
    shapes = [(1, 1, 16), (2, 7, 16), (1, 1, 16), (5, 16), (2, 7, 16), (3, 33, 16)]
    for shape in shapes:
        x = torch.randn(*shape)
        with _Copies() as copies:
            y = layer(x)
        with _Copies() as plain_copies:   # (addmm copies the bias into its output)
            plain(x)
        assert copies.n == plain_copies.n, f"{shape}: {copies.n} copies, nn.Linear's " \
            f"{plain_copies.n}"
        assert y.shape == shape[:-1] + (8,) and y.stride()[-1] == 1
        torch.testing.assert_close(y.double(), _reference(x, layer), rtol=1e-5, atol=1e-5)
    assert counted.calls == 0
    assert set(layer._library) == {torch.Size(s) for s in shapes}
    assert layer.route_of(torch.randn(2, 7, 16)) == "F.linear (held)"
    assert layer.route_of(torch.randn(4, 16)) == "F.linear (a new shape)"


@pytest.mark.parametrize("kernel_wins", [True, False])
def test_a_weight_kept_as_given_on_another_kernel_races_f_linear(ours, monkeypatch,
                                                                  kernel_wins):
    """The host backend's own gemm is not torch's: a new shape is launched as yᵀ = W xᵀ
    through the dispatcher (copies and all). Once committed, the kernel with its copies
    races F.linear on x as given, once for the plan and shape (``race_ms``): the kernel
    winning is held and said so by ``route_of``; F.linear winning serves the shape with
    no copies (run S66: ``tc_wide`` held on 32 prefill projections, two transposing copies
    each)."""
    races = []

    def race(first, second, device):
        races.append((first(), second()))   # both routes compute the layer
        time.sleep(0.01)
        return (1.0, 2.0) if kernel_wins else (2.0, 1.0)
    monkeypatch.setattr(linear_mod, "race_ms", race)
    counted = dict(linear_mod.races)
    layer = at.AdaptiveLinear(torch.nn.Linear(16, 8), "shared").eval()
    x = torch.randn(3, 5, 16)
    assert re.fullmatch(r"dispatcher \(x and the output transposed\): (exploring|committed) "
                        r"host_blas\[threads=\d+\]", layer.route_of(x)), layer.route_of(x)
    for _ in range(40):
        torch.testing.assert_close(layer(x).double(), _reference(x, layer), rtol=1e-5,
                                   atol=1e-5)
    assert len(races) == 1, len(races)                   # once for the plan and the shape
    # the process's count of races and their time on the calling thread (server stats)
    assert linear_mod.races["races"] == counted["races"] + 1
    assert linear_mod.races["race_s"] - counted["race_s"] >= 0.01
    for y in races[0]:   # (the kernel's route as rows [tokens, out])
        torch.testing.assert_close(y.double().reshape(3, 5, 8), _reference(x, layer),
                                   rtol=1e-5, atol=1e-5)
    if kernel_wins:
        assert not layer._library
        assert layer.route_of(x).startswith("held host_blas"), layer.route_of(x)
        return
    assert list(layer._library) == [x.shape] and layer.route_of(x) == "F.linear (held)"
    with _Copies() as copies:
        y = layer(x)
    with _Copies() as plain_copies:   # what the plain layer's own F.linear copies
        torch.nn.functional.linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(y.double(), _reference(x, layer), rtol=1e-5, atol=1e-5)
    assert copies.n == plain_copies.n, (copies.n, plain_copies.n)
    # a routed call finds the same plan: its verdict stands, no second race
    for _ in range(2 * HOLD_EVERY):
        layer(x)
    assert len(races) == 1 and list(layer._library) == [x.shape]


def test_f_linears_verdict_is_kept_for_a_class_of_token_counts(ours, monkeypatch):
    """A server's prefills come in ever new lengths: the race of F.linear against a
    kernel with its copies is run once per candidate and class of token counts (a quarter
    octave, as the dispatcher's input classes), not once per input shape."""
    races = []

    def race(first, second, device):
        races.append(1)
        return (2.0, 1.0)                    # F.linear wins
    monkeypatch.setattr(linear_mod, "race_ms", race)
    layer = at.AdaptiveLinear(torch.nn.Linear(16, 8), "shared").eval()

    def settle(*shape):
        x = torch.randn(*shape)
        for _ in range(40):
            torch.testing.assert_close(layer(x).double(), _reference(x, layer), rtol=1e-5,
                                       atol=1e-5)
        return x.shape
    first = settle(4, 25, 16)                # 100 tokens: the class (90.5, 107.6]
    assert len(races) == 1 and first in layer._library
    second = settle(2, 52, 16)               # 104 tokens: the same class, no second race
    assert len(races) == 1 and second in layer._library
    settle(4, 100, 16)                       # 400 tokens: another class, raced again
    assert len(races) == 2, len(races)


def test_race_ms_gives_each_routes_median_alone():
    """``race_ms``: each route's median over RACE_RUNS runs, alternating; a route that
    sleeps 5 ms reads at least that, one that does nothing far less."""
    calls = []

    def slow():
        calls.append("slow")
        time.sleep(0.005)

    def fast():
        calls.append("fast")
    slow_ms, fast_ms = linear_mod.race_ms(slow, fast, torch.device("cpu"))
    assert slow_ms >= 5.0 and fast_ms < 1.0, (slow_ms, fast_ms)
    assert calls == ["slow", "fast"] * (1 + linear_mod.RACE_RUNS)


def test_another_dtype_is_never_served_by_the_held_plan(library):
    layer = at.AdaptiveLinear(torch.nn.Linear(16, 8), "dense").eval()
    x = torch.randn(2, 16)
    layer(x)
    counted = _Counted(library)
    with pytest.raises(adaptive.InputTypeError, match=r"different dtypes \(a is float64, "
                                                     r"b is float32\)"):
        layer(x.double())
    assert counted.calls == 1 and list(layer._library) == [x.shape]


def test_a_layer_in_training_mode_is_refused_even_when_warm(library):
    layer = at.AdaptiveLinear(torch.nn.Linear(16, 8), "dense").eval()
    x = torch.randn(2, 16)
    layer(x)
    layer.train()
    with pytest.raises(RuntimeError, match="call model.eval"):
        layer(x)


def test_other_plans_are_held_by_exact_key_and_never_replaced_by_f_linear(ours):
    """The host backend's own gemm (NumPy BLAS) is not torch's: held, run as a plan."""
    layer = at.AdaptiveLinear(torch.nn.Linear(16, 8), "dense").eval()
    x = torch.randn(3, 16)
    for _ in range(40):
        torch.testing.assert_close(layer(x).double(), _reference(x, layer), rtol=1e-5,
                                   atol=1e-5)
    assert not layer._library
    (plan,) = layer._held.values()
    assert not plan.candidate.variant.torch_library


def test_exploring_shapes_always_go_through_the_dispatcher():
    import dataclasses
    d0 = library_dispatcher()
    (gemm,) = d0.registry.variants("gemm", "host")
    twin = dataclasses.replace(gemm, name="torch_mm_twin")
    like = torch.empty(1)
    before = runtime.default_dispatcher(device="cpu")
    with adaptive.config.override(sample_every=0):
        d = adaptive.Dispatcher(backend="host", registry=Registry([gemm, twin]))
    runtime.set_default(d, like)
    try:
        counted = _Counted(d)
        layer = at.AdaptiveLinear(torch.nn.Linear(16, 8), "dense").eval()
        x = torch.randn(4, 16)
        layer(x)
        n = 1
        assert d.plan("gemm", x, layer._wt).provisional, "two fresh candidates: explored"
        while d.plan("gemm", x, layer._wt).provisional:
            assert not layer._library, "an exploring plan was held"
            layer(x)
            n += 1
            assert n < 500, "the policy never committed"
        assert counted.calls == n
        layer(x)
        assert list(layer._library) == [x.shape]
    finally:
        runtime.set_default(before, like)


# ---- attention ------------------------------------------------------------------------------

class _Layer(torch.nn.Module):
    is_causal, num_key_value_groups, layer_idx = True, 2, 0


def _eager(q, k, v, mask=None, scale=None):
    from adaptive.ops import get_op
    args = (q, k, v) if mask is None else (q, k, v, mask)
    ref = get_op("attention").reference(*(a.numpy() for a in args), scale=scale)
    return torch.from_numpy(ref).transpose(1, 2)


def test_decode_attention_is_held_by_input_class_across_new_key_lengths(library):
    counted = _Counted(library)
    layer = _Layer()
    steps = 2 * HOLD_EVERY
    for lk in range(200, 200 + steps):   # Lk 200..327: a few quarter-octave classes
        q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, lk, 16), torch.randn(2, 2, lk, 16)
        out, _ = at.attention_forward(layer, q, k, v, None, scaling=0.3)
        torch.testing.assert_close(out.double(), _eager(q, k, v, scale=0.3), rtol=1e-4,
                                   atol=1e-5)
    from adaptive.ops.base import bucket
    classes = len({bucket(lk) for lk in range(200, 200 + steps)})
    assert classes < counted.calls <= classes + steps // HOLD_EVERY + 1
    assert len(at._held) == classes


def test_a_held_attention_class_routes_fewer_calls_while_its_plan_holds(library):
    """Decode steps of one input class: the held SDPA plan serves them, the routed calls
    (through the dispatcher) backed off from one in HOLD_EVERY to one in HOLD_EVERY <<
    HOLD_DOUBLINGS; a dropped plan puts the level back to 0."""
    counted = _Counted(library)
    layer = _Layer()
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 50, 16), torch.randn(2, 2, 50, 16)
    want = _eager(q, k, v, scale=0.3)
    at.attention_forward(layer, q, k, v, None, scaling=0.3)     # decided, then held
    routed = []
    for i in range(BACKOFF_CALLS):
        before = counted.calls
        out, _ = at.attention_forward(layer, q, k, v, None, scaling=0.3)
        if counted.calls > before:
            routed.append(i)
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    assert _backed_off(routed), routed
    library.forget("attention")
    before = counted.calls
    at.attention_forward(layer, q, k, v, None, scaling=0.3)
    assert counted.calls == before + 1 and at._level == 0


@pytest.mark.parametrize("masked", [False, True])
def test_a_class_held_on_sdpa_calls_the_models_own_sdpa_function(library, monkeypatch,
                                                                 masked):
    """A class committed to SDPA as the plain model calls it (a torch_library variant) is
    served by transformers' own SDPA attention function on the model's arguments: the
    plain model's output bit for bit, GQA and a left-padding mask included. Routed calls
    (one in HOLD_EVERY at first) still go through the dispatcher, and a dropped plan is
    decided again before the function serves the class."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    at.register()
    assert at._own_sdpa is sdpa_attention_forward
    own = []
    monkeypatch.setattr(at, "_own_sdpa", lambda *a, **kw: own.append(1) or
                        sdpa_attention_forward(*a, **kw))
    counted = _Counted(library)
    layer = _Layer()
    q, k, v = torch.randn(3, 4, 1, 16), torch.randn(3, 2, 37, 16), torch.randn(3, 2, 37, 16)
    mask = None
    if masked:
        mask = torch.ones(3, 1, 1, 37, dtype=torch.bool)
        mask[1, ..., :9] = False
    want, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.3)
    calls = 2 * HOLD_EVERY
    for _ in range(calls):
        out, _ = at.attention_forward(layer, q, k, v, mask, scaling=0.3)
        torch.testing.assert_close(out.double(), _eager(q, k, v, mask, 0.3), rtol=1e-4,
                                   atol=1e-5)
    routed = counted.calls - 1          # the first call decided the class
    assert 1 <= routed <= 2 and len(own) == calls - 1 - routed
    assert torch.equal(out, want)       # the last call: the model's own function
    library.forget("attention")
    before = (counted.calls, len(own))
    at.attention_forward(layer, q, k, v, mask, scaling=0.3)
    assert (counted.calls, len(own)) == (before[0] + 1, before[1])


def test_masked_attention_is_held_apart_and_a_stale_plan_is_let_go(library):
    counted = _Counted(library)
    layer = _Layer()
    lk = 40
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, lk, 16), torch.randn(2, 2, lk, 16)
    mask = torch.ones(2, 1, 1, lk, dtype=torch.bool)
    mask[0, ..., :7] = False   # left padding
    out, _ = at.attention_forward(layer, q, k, v, mask, scaling=0.3)
    torch.testing.assert_close(out.double(), _eager(q, k, v, mask, 0.3), rtol=1e-4, atol=1e-5)
    at.attention_forward(layer, q, k, v, None, scaling=0.3)
    assert counted.calls == 2 and len(at._held) == 2   # masked and unmasked: two classes
    held = list(at._held.values())
    library.forget("attention")
    assert all(p.stale for p in held)
    out, _ = at.attention_forward(layer, q, k, v, mask, scaling=0.3)
    torch.testing.assert_close(out.double(), _eager(q, k, v, mask, 0.3), rtol=1e-4, atol=1e-5)
    assert counted.calls == 3
    fresh = [p for p in at._held.values() if not p.stale]
    assert len(fresh) == 1 and all(fresh[0] is not p for p in held)


def test_a_held_sdpa_plan_takes_the_prefills_views_as_they_are(library, monkeypatch):
    """A prefill's q, k, v are views of the projections ([B, L, H, D] transposed) and its
    mask a slice: the held SDPA plan takes them as they are, with no contiguous copy (run
    S25: three copies a layer, +3.5 % of a prefill's device time); the call routed through
    the dispatcher (one in HOLD_EVERY) copies them for its key. Results match eager
    attention either way."""
    layer = _Layer()
    b, lq, lk_full = 2, 24, 30
    proj = [torch.randn(b, lq, h, 16) for h in (4, 2, 2)]
    q, k, v = (t.transpose(1, 2) for t in proj)             # [B, H, L, D] views
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    mask = torch.ones(b, 1, lq, lk_full, dtype=torch.bool).tril()[..., :lq]   # a slice
    mask[0, ..., :5] = False
    want = _eager(q, k, v, mask, 0.3)
    copies = []
    real = torch.Tensor.contiguous
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda t, *a, **kw: copies.append(
        tuple(t.shape)) or real(t, *a, **kw))
    counted = _Counted(library)
    held = 0
    for i in range(HOLD_EVERY + 1):       # one call in HOLD_EVERY is routed, the first too
        copies.clear()
        before = counted.calls
        out, _ = at.attention_forward(layer, q, k, v, mask, scaling=0.3)
        torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
        routed = counted.calls > before
        held += not routed
        # the output's own transpose back to [B, L, H, D] is copied in every mode
        assert copies.count(tuple(out.shape)) == 1
        inputs = [c for c in copies if c != tuple(out.shape)]
        assert (len(inputs) >= 3) if routed else not inputs, (i, routed, copies)
    assert 2 <= counted.calls <= 3 and held >= HOLD_EVERY - 2 and len(at._held) == 1


def test_attention_plans_bound_to_their_exact_key_are_held_by_it(monkeypatch):
    """The host backend's attention runs on NumPy copies: its plans are per key (as a CUDA
    kernel's, whose launch is bound to its shapes). They are held by exact shapes, never
    by class: a decode step's layers after the first run the plan without the
    dispatcher, and each new key length goes through it once."""
    torch.set_num_threads(1)
    at.forget_held()
    d = runtime.default_dispatcher(device="cpu")
    for lk in (9, 9, 10):                 # explore each key to its commit
        q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, lk, 8), torch.randn(1, 2, lk, 8)
        while d.plan("attention", q, k, v, causal=False, scale=None).provisional:
            d.launch("attention", q, k, v, causal=False, scale=None)
    counted = _Counted(d)
    monkeypatch.setattr(at, "_turn", itertools.count(1))   # no routed turn in 64 calls
    try:
        layers = 4
        for lk in (9, 10):                # two decode steps of a 4-layer model
            for _ in range(layers):
                q = torch.randn(1, 4, 1, 8)
                k, v = torch.randn(1, 2, lk, 8), torch.randn(1, 2, lk, 8)
                out, _ = at.attention_forward(_Layer(), q, k, v, None)
                torch.testing.assert_close(out.double(), _eager(q, k, v, scale=1 / math.sqrt(8)),
                                           rtol=1e-4, atol=1e-5)
        assert not at._held and len(at._exact) == 2
        assert counted.calls == 2         # the first layer of each step
        k11 = torch.randn(1, 2, 11, 8)
        at.attention_forward(_Layer(), torch.randn(1, 4, 1, 8), k11, k11.clone(), None)
        assert counted.calls == 3         # a new key length: through the dispatcher
        q = torch.randn(1, 4, 1, 8).to(torch.float64)   # another dtype: never the held plan
        k = torch.randn(1, 2, 9, 8, dtype=torch.float64)
        with pytest.raises(adaptive.InputTypeError, match="float32"):
            at.attention_forward(_Layer(), q, k, k.float(), None)
        assert counted.calls == 4
    finally:
        del d.run
        at.forget_held()


@pytest.mark.parametrize("layout", ["transposed", "torch"])
def test_a_patched_llama_on_library_plans_generates_the_plain_greedy_tokens(library, layout):
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         max_position_embeddings=512, pad_token_id=0, eos_token_id=None,
                         bos_token_id=None, attn_implementation="sdpa")
    torch.manual_seed(1)
    plain = LlamaForCausalLM(config).eval()
    patched = LlamaForCausalLM(config)
    patched.load_state_dict(plain.state_dict())
    weights = {n: m.weight for n, m in patched.named_modules()
               if isinstance(m, torch.nn.Linear)}
    at.patch(patched, layout=layout)
    ids = torch.randint(1, 256, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0   # left padding: the masked attention path too
    with torch.no_grad():
        want = plain.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                              pad_token_id=0)
        got = patched.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                               pad_token_id=0)
    assert torch.equal(got, want)
    layers = [m for m in patched.modules() if isinstance(m, at.AdaptiveLinear)]
    assert all(m._library for m in layers), "a library plan was not served by F.linear"
    assert at._held
    # a prompt of a length never seen: every linear served by F.linear at once, as the
    # server's profiled prefill lists them (engine.route_spy)
    with route_spy(patched) as routes, torch.no_grad():
        patched(torch.randint(1, 256, (3, 17)))
    norms = {"dispatcher, x (3, 17, 64)": 5}   # the norms' new shape: the dispatcher once
    if layout == "torch":
        assert routes == {"F.linear (a new shape), x (3, 17, 64)": 13,
                          "F.linear (a new shape), x (3, 17, 128)": 2, **norms}, routes
    else:   # a new key of a committed class; rows launched as given, no copies
        assert routes == {"dispatcher (rows as given): committed torch_mm, x (3, 17, 64)": 13,
                          "dispatcher (rows as given): committed torch_mm, x (3, 17, 128)": 2,
                          **norms}, routes
    with route_spy(patched) as routes, torch.no_grad():
        patched(torch.randint(1, 256, (3, 17)))
    assert routes == {"F.linear (held), x (3, 17, 64)": 13,
                      "F.linear (held), x (3, 17, 128)": 2,
                      "the model's norm (held), x (3, 17, 64)": 5}, routes
    kept = [n for n, m in patched.named_modules()
            if isinstance(m, at.AdaptiveLinear) and m.weight is weights[n]]
    if layout == "torch":   # every weight as given: no copy, F.linear on the very tensor
        assert len(kept) == len(layers)
    else:                   # transposed once, except the embedding-tied head
        assert len(kept) < len(layers)


def test_an_unknown_layout_is_refused_before_anything_changes():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(adaptive.InputValueError, match=r"layout='rows'.*'transposed', 'torch'"):
        at.patch(model, layout="rows")
    assert type(model[0]) is torch.nn.Linear


def test_torch_library_is_checked_in_manifests_and_kept_in_packs():
    from adaptive.errors import ManifestError
    from adaptive.variants import variant_from_dict
    base = {"name": "mm", "backend": "host", "language": "python", "entry": "gemm_numpy",
            "source": "def gemm_numpy(a, b, out):\n    out[...] = a @ b\n"}
    with pytest.raises(ManifestError, match="torch_library.*only with a torch_entry"):
        variant_from_dict({**base, "torch_library": True}, "gemm")
    with pytest.raises(ManifestError, match="torch_library.*got 'yes'"):
        variant_from_dict({**base, "torch_entry": "gemm_numpy", "torch_library": "yes"},
                          "gemm")
    v = variant_from_dict({**base, "torch_entry": "gemm_numpy", "torch_library": True}, "gemm")
    again = variant_from_dict(v.to_dict(), "gemm")
    assert v.torch_library and again.torch_library
    assert "torch_library" not in variant_from_dict(base, "gemm").to_dict()
    from adaptive.variants import shared_registry
    assert shared_registry().get("gemm", "cublas").torch_library   # cuBLAS through torch.mm


def test_baseline_is_checked_in_manifests_and_kept_in_packs():
    from adaptive.errors import ManifestError
    from adaptive.variants import shared_registry, variant_from_dict
    base = {"name": "mm", "backend": "host", "language": "python", "entry": "gemm_numpy",
            "source": "def gemm_numpy(a, b, out):\n    out[...] = a @ b\n"}
    with pytest.raises(ManifestError, match="baseline.*got 'yes'"):
        variant_from_dict({**base, "baseline": "yes"}, "gemm")
    kernel = {"name": "k", "backend": "cuda", "language": "cuda", "entry": "k",
              "source": "extern \"C\" __global__ void k() {}",
              "launch": {"grid": ["1"], "block": ["32"]}}
    with pytest.raises(ManifestError, match="baseline.*only for a library.*cuda variant"):
        variant_from_dict({**kernel, "baseline": True}, "gemm")
    v = variant_from_dict({**base, "baseline": True}, "gemm")
    assert v.baseline and variant_from_dict(v.to_dict(), "gemm").baseline
    assert "baseline" not in variant_from_dict(base, "gemm").to_dict()
    # the plain program's calls: one an op, and for a 2:4 weight cuSPARSELt's kernels (with
    # their plans kept, not torch's call that builds one each time) beside the dense matmul
    # (the better of the two is what plain PyTorch serves)
    for op, names in (("gemm", ["cublas"]), ("spmm", ["cublas_dense", "cusparselt_plan"]),
                      ("attention", ["sdpa_torch"])):
        assert [v.name for v in shared_registry().variants(op, "cuda") if v.baseline] == names


_SPMM_SOURCE = '''
def spmm_numpy(w, b, out):
    out[...] = w.dense() @ b

def spmm_torch(w, b, out=None):
    import torch
    dense = torch.from_numpy(w.dense()).to(b.dtype)
    return torch.mm(dense, b) if out is None else torch.mm(dense, b, out=out)

def spmm_rows(w, b, out=None):
    import torch
    dense = torch.from_numpy(w.dense()).to(b.dtype)
    y = torch.stack([dense[i] @ b for i in range(dense.shape[0])])
    return y if out is None else out.copy_(y)
'''


@pytest.fixture
def sparse_library():
    """A CPU default dispatcher whose spmm is a baseline (the dense matmul on the pruned
    weight, as cuBLAS-dense is on the GPU) or, with it, another kernel that must stay
    the choice: ``kernel`` names which one the policy may take."""
    from adaptive.variants import variant_from_dict
    torch.set_num_threads(1)
    like = torch.empty(1)
    before = runtime.default_dispatcher(device="cpu")

    def make(baseline: bool):
        name, entry = ("dense_mm", "spmm_torch") if baseline else ("rows_kernel", "spmm_rows")
        v = variant_from_dict({"name": name, "backend": "host", "language": "python",
                               "entry": "spmm_numpy", "torch_entry": entry,
                               "source": _SPMM_SOURCE, "baseline": baseline}, "spmm")
        d = adaptive.Dispatcher(backend="host", registry=Registry([v]))
        runtime.set_default(d, like)
        at.forget_held()
        return d
    yield make
    runtime.set_default(before, like)
    at.forget_held()


@pytest.mark.parametrize("baseline", [True, False])
def test_a_sparse_layer_on_spmms_baseline_is_f_linear_without_copies(sparse_library,
                                                                      baseline, monkeypatch):
    """A pruned weight whose committed spmm plan is the baseline (the dense matmul on the
    pruned weight) is served by F.linear on x as given: no transposed copies of x and of
    the output (run S56: 131 copies, 14.0 ms of a pruned model's prefill against torch's
    1.75 ms); any other kernel that beats F.linear with its copies (the race made to say
    so here) is launched transposed and held, copies and all."""
    monkeypatch.setattr(linear_mod, "race_ms", lambda first, second, device: (1.0, 2.0))
    d = sparse_library(baseline)
    torch.manual_seed(1)
    plain = torch.nn.Linear(32, 16)
    with torch.no_grad():
        plain.weight[:, ::2] = 0                         # pruned: half of each row
    layer = at.AdaptiveLinear(plain, "sparse").eval()
    x = torch.randn(2, 9, 32)
    for _ in range(3):
        torch.testing.assert_close(layer(x).double(), _reference(x, layer), rtol=1e-5,
                                   atol=1e-5)
    counted = _Counted(d)
    with _Copies() as copies:
        y = layer(x)
    with _Copies() as plain_copies:
        plain(x)
    torch.testing.assert_close(y.double(), _reference(x, layer), rtol=1e-5, atol=1e-5)
    if baseline:
        assert copies.n == plain_copies.n and counted.calls == 0
        assert layer.route_of(x) == "F.linear (held)" and x.shape in layer._library
    else:
        assert copies.n >= 2, copies.n                    # x and the output, transposed
        assert not layer._library and layer.route_of(x) == "held rows_kernel"


@pytest.mark.parametrize("masked", [False, True])
def test_a_decode_layer_remembers_its_held_sdpa_class(library, monkeypatch, masked):
    """A decode step whose layer last found its class held on SDPA goes to transformers'
    own function on integer comparisons alone (no class key): while the cached length
    stays in the class, the batch, dtype, parameters and mask layout (none, or a padding
    mask's batch and head extents and dtype) unchanged. A length past the class, another
    batch or dtype, another mask layout, a dropped plan and forget_held each send the call
    the long way (the class key), which remembers the new class; routed turns still reach
    the dispatcher."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from adaptive.ops.base import bucket
    at.register()
    attends = []
    real = at._attend
    monkeypatch.setattr(at, "_attend", lambda *a, **kw: attends.append(a[0][1].shape[2])
                        or real(*a, **kw))
    counted = _Counted(library)
    layer = _Layer()

    def step(b, lk, dtype=torch.float32, mask_kind=masked):
        q = torch.randn(b, 4, 1, 16, dtype=dtype)
        k, v = torch.randn(b, 2, lk, 16, dtype=dtype), torch.randn(b, 2, lk, 16, dtype=dtype)
        mask = None
        if mask_kind:   # left padding on the first row; or an additive mask of the dtype
            mask = torch.ones(b, 1, 1, lk, dtype=torch.bool)
            mask[0, ..., :5] = False
            if mask_kind == "additive":
                mask = torch.zeros(b, 1, 1, lk, dtype=dtype).masked_fill(~mask, -torch.inf)
        out, _ = at.attention_forward(layer, q, k, v, mask, scaling=0.3)
        want, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.3)
        if mask is None:
            assert torch.equal(out, want)
        else:   # a class's deciding call is our SDPA call (GQA grouped, not repeated)
            torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-5)
    lengths = list(range(300, 300 + 3 * HOLD_EVERY))   # 300..491: four classes
    for lk in lengths:
        step(2, lk)
    classes = sorted({bucket(n) for n in lengths})
    long_way = list(attends)
    # each class twice the long way (its decision, then the held call that remembers it),
    # plus the routed turns
    assert {bucket(n) for n in long_way} == set(classes)
    assert len(long_way) <= 2 * len(classes) + len(lengths) // HOLD_EVERY, long_way
    assert counted.calls >= 1
    before = len(attends)
    step(2, lengths[-1])                      # the same class: remembered
    assert len(attends) == before
    step(3, lengths[-1])                      # another batch: the long way
    step(3, lengths[-1], torch.float16)       # another dtype: the long way
    assert len(attends) == before + 2
    library.forget("attention")               # the held plan dropped: stale
    step(3, lengths[-1], torch.float16)
    assert len(attends) == before + 3
    at.forget_held()                          # every memo let go
    step(3, lengths[-1], torch.float16)
    assert len(attends) == before + 4
    step(3, lengths[-1], torch.float16)       # the held call that remembers the class
    step(3, lengths[-1], torch.float16)       # remembered
    assert len(attends) == before + 5
    # another mask layout: an additive mask for a boolean one (or one for none), and
    # none for a mask (or a boolean one for none), each the long way
    step(3, lengths[-1], torch.float16, "additive")
    assert len(attends) == before + 6
    step(3, lengths[-1], torch.float16, not masked)
    assert len(attends) == before + 7


def _fake_cslt_sparse_mm(seen):
    """``torch._cslt_sparse_mm``'s semantics on CPU tensors (the compressed weight is its
    dense form here): ``packed @ dense_b``, returned transposed with ``transpose_result``;
    each dense operand's shape, whether it is row-major, and ``transpose_result`` recorded
    in ``seen``."""
    def cslt(packed, dense_b, bias=None, transpose_result=False, **_):
        seen.append((tuple(dense_b.shape), dense_b.is_contiguous(), transpose_result))
        w = packed.to(dense_b.dtype)
        return dense_b.t() @ w.t() if transpose_result else w @ dense_b
    return cslt


_CSLT_SOURCE = '''
import numpy as np


def cslt_weight(w, torch, device):
    return w.cached("cpu_cslt", lambda: torch.from_numpy(np.ascontiguousarray(w.dense())))


def spmm_numpy(w, b, out):
    np.matmul(w.dense(), b, out=out)


def spmm_torch(w, b, out=None):
    import torch
    y = torch._cslt_sparse_mm(cslt_weight(w, torch, None), b)   # as cusparselt.py calls it
    return y if out is None else out.copy_(y)
'''


@pytest.mark.parametrize("tokens", [16, 9])
def test_a_sparse_layer_held_on_cusparselt_hands_it_a_row_major_copy(monkeypatch, tokens):
    """A pruned layer whose committed spmm plan is cuSPARSELt's (``cusparselt_24``), once it
    beats F.linear with its copies, is served on the held plan's route: cuSPARSELt gets
    ``xᵀ`` copied row-major and never x's transposed view with ``transpose_result`` (torch's
    own 2:4 linear's layout: one call took 0.26-7.0 s of host time on the H200, run S85).
    The output matches float64; one call in HOLD_EVERY still goes through the
    dispatcher."""
    from adaptive.variants import variant_from_dict
    seen = []
    monkeypatch.setattr(torch, "_cslt_sparse_mm", _fake_cslt_sparse_mm(seen), raising=False)
    monkeypatch.setattr(linear_mod, "race_ms", lambda first, second, device: (1.0, 2.0))
    torch.set_num_threads(1)
    like = torch.empty(1)
    before = runtime.default_dispatcher(device="cpu")
    v = variant_from_dict({"name": "cusparselt_24", "backend": "host",
                           "language": "python", "entry": "spmm_numpy",
                           "torch_entry": "spmm_torch", "source": _CSLT_SOURCE}, "spmm")
    d = adaptive.Dispatcher(backend="host", registry=Registry([v]))
    runtime.set_default(d, like)
    at.forget_held()
    try:
        torch.manual_seed(2)
        plain = torch.nn.Linear(32, 24)
        with torch.no_grad():
            plain.weight[:, ::2] = 0
        layer = at.AdaptiveLinear(plain, "sparse").eval()
        x = torch.randn(1, tokens, 32)
        for _ in range(4):   # the first calls commit the only candidate, which wins the race
            layer(x)
        assert layer.route_of(x) == "held cusparselt_24", layer.route_of(x)
        counted = _Counted(d)
        seen.clear()
        ys = [layer(x) for _ in range(2 * HOLD_EVERY)]
        for y in ys:
            assert y.shape == (1, tokens, 24) and y.is_contiguous()
            torch.testing.assert_close(y.double(), _reference(x, layer), rtol=1e-5,
                                       atol=1e-5)
        assert 1 <= counted.calls <= 2, counted.calls     # routed: one in HOLD_EVERY
        assert len(seen) == 2 * HOLD_EVERY and set(seen) == {((32, tokens), True, False)}, \
            set(seen)
    finally:
        runtime.set_default(before, like)
        at.forget_held()


# ---- decode steps with the model's own calls made directly (integrations.direct) ----------

def _tiny_pair(seed: int = 1):
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         max_position_embeddings=512, pad_token_id=0, eos_token_id=None,
                         bos_token_id=None, attn_implementation="sdpa")
    torch.manual_seed(seed)
    plain = LlamaForCausalLM(config).eval()
    patched = LlamaForCausalLM(config)
    patched.load_state_dict(plain.state_dict())
    return plain, at.patch(patched)


def _generate(model, ids, mask, n):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0)


def _switched(prompt: int, seed: int):
    """A plain and a patched tiny Llama, a prompt, its mask, and the patched model's
    decode-steps hook after two generates (its decode steps switched)."""
    plain, patched = _tiny_pair()
    ids = torch.randint(1, 256, (1, prompt), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for _ in range(2):
        _generate(patched, ids, mask, 6)
    hook, _ = patched.__dict__[at._DECODE_STEPS][0]
    assert hook.direct
    return plain, patched, ids, mask, hook


@contextlib.contextmanager
def _ways(model):
    """While open, each adaptive layer call's (tokens per row, its route_of) in order."""
    seen = []

    def hook(module, args):
        seen.append((args[0].shape[1], module.route_of(args[0])))
    handles = [m.register_forward_pre_hook(hook) for m in model.modules()
               if isinstance(m, (at.AdaptiveLinear, AdaptiveRMSNorm))]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def test_decode_steps_make_the_models_own_calls_directly_once_every_layer_holds_them(library):
    plain, patched = _tiny_pair()
    ids = torch.randint(1, 256, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    assert torch.equal(_generate(patched, ids, mask, 12), _generate(plain, ids, mask, 12))
    counted = _Counted(library)
    with _ways(patched) as seen:
        got = _generate(patched, ids, mask, 12)
    assert torch.equal(got, _generate(plain, ids, mask, 12))
    layers = 2 * 7 + 1 + 2 * 2 + 1            # linears and norms: one call each a forward
    assert len(seen) == 12 * layers
    prefill, decode = seen[:layers], seen[layers:]
    assert not any(way.startswith(("direct", "routed")) for _, way in prefill), prefill
    assert [t for t, _ in prefill].count(9) == layers - 1   # the head: the last token only
    # the first decode step's shapes switch every layer; a later step routes one layer at
    # most, another each time (ROUTE_EVERY steps go round once: steps 1..20 of 512 here)
    steps = [decode[i:i + layers] for i in range(0, len(decode), layers)]
    assert all(way.startswith("direct") for t, way in steps[0]), steps[0]
    routed = []
    for step in steps[1:]:
        assert all(t == 1 and way.startswith(("direct", "routed")) for t, way in step)
        routed += [i for i, (_, way) in enumerate(step) if way.startswith("routed")]
        assert [way.startswith("routed") for _, way in step].count(True) <= 1, step
    assert routed and len(set(routed)) == len(routed), routed
    # one routed layer a step through the dispatcher, attention's own routing besides
    assert counted.calls <= 11 + 12 * 2, counted.calls
    hook, _ = patched.__dict__[at._DECODE_STEPS][0]
    assert len(hook.direct) == layers and hook.rows == 2


def test_direct_steps_end_at_a_dropped_plan_a_prefill_and_training(library):
    plain, patched, ids, mask, hook = _switched(prompt=7, seed=4)
    library.forget()                       # every plan dropped: held ones no longer serve
    with _ways(patched) as seen:
        got = _generate(patched, ids, mask, 6)
    assert torch.equal(got, _generate(plain, ids, mask, 6))
    # the first decode step: no layer whose plan for its shape was dropped is switched
    # (the head's x is [1, 1, 64] in the prefill too: it may hold a plan made there)
    first = [way for _, way in seen[20:40]]
    assert sum(way.startswith(("direct", "routed")) for way in first) <= 1, first
    with torch.no_grad():                  # a prefill: every layer back to its forward
        patched(torch.randint(1, 256, (1, 5)))
    assert not hook.direct and not any("forward" in m.__dict__ for m in patched.modules())
    _generate(patched, ids, mask, 6)
    assert hook.direct
    patched.train()                        # a training step is never served directly
    with pytest.raises(RuntimeError, match="for inference"):
        patched(torch.randint(1, 256, (1, 1)))
    assert not hook.direct
    patched.eval()


def test_routing_sends_each_direct_layer_through_the_dispatcher_in_turn(library, monkeypatch):
    from adaptive.integrations import direct
    monkeypatch.setattr(direct, "ROUTE_EVERY", 24)
    plain, patched = _tiny_pair()
    ids = torch.randint(1, 256, (1, 5), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    _generate(patched, ids, mask, 4)
    routed = collections.Counter()
    for cls in (at.AdaptiveLinear, AdaptiveRMSNorm):
        real = cls.route_call

        def spy(self, x, real=real):
            routed[id(self)] += 1
            return real(self, x)
        monkeypatch.setattr(cls, "route_call", spy)
    hook, _ = patched.__dict__[at._DECODE_STEPS][0]
    got = _generate(patched, ids, mask, 30)
    assert torch.equal(got, _generate(plain, ids, mask, 30))
    layers = {id(m) for m, _ in hook.direct}
    assert len(layers) == 20 and set(routed) == layers, (len(routed), len(layers))


def test_frozen_serves_held_plans_only_and_puts_everything_back(library):
    """``frozen(model)`` (what a CUDA graph capture needs): while open, a patched model's
    forward over held shapes sends no call through the dispatcher however many it makes
    (no routed turn, no sampled call), its decode-steps hook is paused (every layer its
    own forward), and the output is the plain model's; on exit the routing periods, the
    dispatcher's sampling and the hook are as before, and routing resumes."""
    from adaptive.integrations import direct, linear, norm
    plain, patched = _tiny_pair()
    ids = torch.randint(1, 256, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for _ in range(3):      # every shape of a forward of these ids decided and held
            patched(input_ids=ids)
        want = plain(input_ids=ids).logits
    hook, _ = patched.__dict__[at._DECODE_STEPS][0]
    before = (linear.HOLD_EVERY, at.HOLD_EVERY, norm.HOLD_EVERY, direct.ROUTE_EVERY,
              library.sample_every, hook.active)
    assert library.sample_every > 0 and hook.active
    counted = _Counted(library)
    with at.frozen(patched), torch.no_grad():
        assert not hook.active and library.sample_every == 0
        for _ in range(3 * HOLD_EVERY):     # calls enough for several routed turns each
            got = patched(input_ids=ids).logits
    assert counted.calls == 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (linear.HOLD_EVERY, at.HOLD_EVERY, norm.HOLD_EVERY, direct.ROUTE_EVERY,
            library.sample_every, hook.active) == before
    with torch.no_grad():
        for _ in range(2 * HOLD_EVERY):
            patched(input_ids=ids)
    assert counted.calls > 0                # routed turns again
    # nested in one thread: the inner one's exit leaves the outer one's state
    with at.frozen(patched):
        with at.frozen(patched):
            assert library.sample_every == 0 and not hook.active
        assert library.sample_every == 0 and linear.HOLD_EVERY == at.NEVER
        assert not hook.active
    assert (linear.HOLD_EVERY, at.HOLD_EVERY, norm.HOLD_EVERY, direct.ROUTE_EVERY,
            library.sample_every, hook.active) == before
    # an exception inside still puts everything back
    with pytest.raises(RuntimeError, match="inside"):
        with at.frozen(patched):
            raise RuntimeError("inside")
    assert (linear.HOLD_EVERY, at.HOLD_EVERY, norm.HOLD_EVERY, direct.ROUTE_EVERY,
            library.sample_every, hook.active) == before


def test_unpatch_takes_the_decode_steps_hook_away(library):
    _, patched = _tiny_pair()
    ids = torch.randint(1, 256, (1, 5))
    _generate(patched, ids, torch.ones_like(ids), 4)
    at.unpatch(patched)
    assert at._DECODE_STEPS not in patched.__dict__
    assert not any(m._forward_pre_hooks for m in patched.modules())
    assert not any("forward" in m.__dict__ for m in patched.modules())


def test_new_weights_loaded_in_a_direct_decode_are_the_ones_used(library):
    """A state_dict loaded (or a ``.to()``) while decode steps are switched: every layer
    derives its weights again and the switches are made afresh, so the next tokens are the
    plain model's with the new weights, not the old weights' (the direct calls read
    them)."""
    plain, patched, ids, mask, hook = _switched(prompt=6, seed=6)
    torch.manual_seed(9)
    other = LlamaForCausalLM(plain.config).eval()
    state = {k: v for k, v in other.state_dict().items() if "rotary" not in k}
    plain.load_state_dict(state, strict=False)
    patched.load_state_dict(state, strict=False)
    with torch.no_grad():   # a decode step right away, with the cache of a fresh prefill
        want = plain(ids, attention_mask=mask, use_cache=True)
        got = patched(ids, attention_mask=mask, use_cache=True)
        step = torch.randint(1, 256, (1, 1))
        kw = cache_keyword(plain)
        want = plain(step, **{kw: want.past_key_values}).logits
        got = patched(step, **{kw: got.past_key_values}).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(_generate(patched, ids, mask, 8), _generate(plain, ids, mask, 8))
    assert hook.direct
    plain.to(torch.float16)   # new parameter tensors: a switch made before reads the old
    patched.to(torch.float16)
    assert not hook.direct or hook.revision[1] != direct_mod.epoch
    assert torch.equal(_generate(patched, ids, mask, 8), _generate(plain, ids, mask, 8))
    assert hook.direct and all(m.weight.dtype == torch.float16 for m, _ in hook.direct)


def test_a_paused_hook_leaves_every_layer_its_own_forward_until_resumed(library):
    plain, patched, ids, mask, hook = _switched(prompt=5, seed=7)
    switched = [layer for layer, _ in hook.direct]
    hook.pause()
    assert not any("forward" in m.__dict__ for m in patched.modules())
    with _ways(patched) as seen:
        got = _generate(patched, ids, mask, 6)
    assert torch.equal(got, _generate(plain, ids, mask, 6))
    assert not any(way.startswith(("direct", "routed")) for _, way in seen)
    assert [layer for layer, _ in hook.direct] == switched   # kept for resume()
    hook.resume()            # the kept switches again, before any forward
    assert all("forward" in layer.__dict__ for layer in switched)
    with _ways(patched) as seen:
        got = _generate(patched, ids, mask, 6)
    assert torch.equal(got, _generate(plain, ids, mask, 6))
    assert all(way.startswith(("direct", "routed")) for t, way in seen[20:]), seen[20:]


@contextlib.contextmanager
def _attention_impls(model):
    """While open, the attention implementation each attention layer call ran under, in
    order, with its query's tokens a row."""
    seen = []

    def hook(module, args, kwargs):
        seen.append((kwargs["hidden_states"].shape[1] if "hidden_states" in kwargs
                     else args[0].shape[1], module.config._attn_implementation))
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in model.modules()
               if type(m).__name__ == "LlamaAttention"]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("padded", [False, True])
def test_decode_steps_run_the_models_own_attention_where_every_layer_holds_sdpa(
        library, monkeypatch, padded):
    """Once a decode step's every attention call went to transformers' own SDPA function
    through ours (the class held on SDPA), the hook points the model at that function for
    the steps its held classes cover: the same tokens as the plain model, our function out
    of the way on all but one step in ATTENTION_ROUTE_EVERY, and never in a prefill."""
    from adaptive.integrations import direct
    from adaptive.ops.base import bucket
    monkeypatch.setattr(direct, "ATTENTION_ROUTE_EVERY", 8)
    plain, patched = _tiny_pair()
    # cached lengths of 61-90: classes of 12-14 lengths (up to 16, each length is one)
    ids = torch.randint(1, 256, (2, 60), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :4] = 0
    _generate(patched, ids, mask, 4)
    with _attention_impls(patched) as seen:
        got = _generate(patched, ids, mask, 30)
    assert torch.equal(got, _generate(plain, ids, mask, 30))
    assert patched.config._attn_implementation == at.NAME or seen[-1][1] == "sdpa"
    steps = [seen[i:i + 2] for i in range(0, len(seen), 2)]   # two layers a forward
    assert len(steps) == 30
    assert all(impl == at.NAME for _, impl in steps[0]), steps[0]          # the prefill
    impls = [{impl for _, impl in step} for step in steps[1:]]
    assert all(len(i) == 1 for i in impls), impls     # a step is switched whole or not
    ours = [k for k, i in enumerate(impls) if i == {at.NAME}]
    # the first decode step goes through ours, the next on the model's own; then ours for
    # one step in 8 and at each class's first length (the memos written for it), the
    # model's own on the rest
    assert ours[:1] == [0] and 1 not in ours, ours
    lengths = [61 + k for k in range(29)]         # the key length of each decode step
    firsts = [k for k in range(1, 29) if bucket(lengths[k]) != bucket(lengths[k - 1])]
    assert firsts and set(firsts) <= set(ours), (firsts, ours)
    assert len(ours) <= 1 + len(firsts) + 29 // 8 + 1, ours
    assert len(ours) >= 1 + len(firsts), ours
    # a prefill: ours again (and the switch let go)
    with _attention_impls(patched) as seen, torch.no_grad():
        patched(ids, attention_mask=mask)
    assert {impl for _, impl in seen} == {at.NAME}
    assert patched.config._attn_implementation == at.NAME


def test_the_attention_switch_ends_at_forget_held_and_at_a_class_past_the_held_one(library):
    """Held classes let go (``forget_held``: every memo's generation is old) or a cached
    length past the held class's: the next step runs our function again, which decides or
    finds the class and writes the memos afresh."""
    plain, patched = _tiny_pair()
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(12))
    mask = torch.ones_like(ids)
    _generate(patched, ids, mask, 4)
    hook, _ = patched.__dict__[at._DECODE_STEPS][0]
    with torch.no_grad():
        out = patched(ids, attention_mask=mask, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        kw = cache_keyword(patched)
        for _ in range(3):                       # past the first step: switched
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = patched(token, attention_mask=mask, use_cache=True, **{kw: cache})
            token = out.logits[:, -1:].argmax(-1)
        assert hook.attention_on and patched.config._attn_implementation == "sdpa"
        at.forget_held()
        with _attention_impls(patched) as seen:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            patched(token, attention_mask=mask, use_cache=True, **{kw: cache})
        assert {impl for _, impl in seen} == {at.NAME} and not hook.attention_on
        # (the first layer's call after forget_held finds the class through the dispatcher,
        # not yet as held: its memo is written by the next step's, still through ours)
        with _attention_impls(patched) as seen:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            patched(token, attention_mask=mask, use_cache=True, **{kw: cache})
        assert {impl for _, impl in seen} == {at.NAME}
        # a step whose cached length is past the held class is not switched on the memos
        # of the class before it, nor one of another batch size
        layer = next(m for m in patched.modules() if type(m).__name__ == "LlamaAttention")
        memo = layer.__dict__[at._MEMO]
        assert memo[0] == at._generation
        assert not hook.attention.holds(1, {"attention_mask": torch.ones(1, memo[3] + 1)})
        assert hook.attention.holds(1, {"attention_mask": torch.ones(1, memo[3])})
        assert not hook.attention.holds(2, {"attention_mask": torch.ones(2, memo[3])})
        # while switched on, a step is checked against the lengths every layer covered
        assert hook.attention.holds(1, {"attention_mask": torch.ones(1, memo[3])})
        assert hook.attention.covers({"attention_mask": torch.ones(1, memo[2])})
        assert not hook.attention.covers({"attention_mask": torch.ones(1, memo[3] + 1)})
        at.forget_held()
        assert not hook.attention.covers({"attention_mask": torch.ones(1, memo[3])})


def test_a_hook_with_attention_inactive_never_switches_it(library):
    """``attention_active = False`` (an ablation's mode): every decode step's attention goes
    through ours, the layers' own switches unchanged."""
    plain, patched = _tiny_pair()
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(13))
    mask = torch.ones_like(ids)
    hook, _ = patched.__dict__[at._DECODE_STEPS][0]
    _generate(patched, ids, mask, 6)
    hook.attention_active = False
    with _attention_impls(patched) as seen:
        got = _generate(patched, ids, mask, 12)
    assert torch.equal(got, _generate(plain, ids, mask, 12))
    assert {impl for _, impl in seen} == {at.NAME} and hook.direct
    hook.attention_active = True
    with _attention_impls(patched) as seen:
        _generate(patched, ids, mask, 12)
    assert "sdpa" in {impl for _, impl in seen}
