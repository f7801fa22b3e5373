"""adaptive.integrations.transformers on the host backend: the "adaptive" attention against
transformers' own eager attention (causal, left padding, grouped heads, a KV cache), and
patch() on a tiny Llama: the same greedy tokens, state_dict unchanged, errors that name
the module, nothing half-patched."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama.modeling_llama import eager_attention_forward  # noqa: E402

import adaptive  # noqa: E402
from adaptive.errors import InputTypeError, InputValueError  # noqa: E402
from adaptive.integrations import linear as linear_mod  # noqa: E402
from adaptive.integrations import transformers as at  # noqa: E402
from hf_masks import cache_keyword, transformers_masks  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """Two CPU cores shared by many jobs: torch's own thread pool only slows this down."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _config(**kw):
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                max_position_embeddings=512, pad_token_id=0, eos_token_id=None,
                bos_token_id=None)
    return LlamaConfig(**{**base, **kw})


def _pair(seed=0, **kw):
    """The same random weights twice: a plain model and one to patch."""
    torch.manual_seed(seed)
    plain = LlamaForCausalLM(_config(**kw)).eval()
    other = LlamaForCausalLM(_config(**kw))
    other.load_state_dict(plain.state_dict())
    return plain, other.eval()


def _greedy(model, ids, mask, n=10):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                              pad_token_id=0)


class _Layer(torch.nn.Module):
    """What transformers passes as ``module``: the head grouping and causality."""

    def __init__(self, groups, causal=True):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, causal


# ---- the attention function -----------------------------------------------------------------

@pytest.mark.parametrize("h,hkv,lq,lk,pads", [
    (4, 2, 7, 7, (0, 0)),          # prefill, pure causal: no mask (SDPA's builder skips it)
    (4, 2, 7, 7, (0, 3)),          # prefill, left padding in a batch
    (8, 2, 1, 12, (0, 0)),         # decode, one query row sees the whole cache
    (8, 2, 1, 12, (4, 0)),         # decode with padding
    (4, 4, 3, 11, (0, 2)),         # a chunk after a cache: bottom-right causal, padded
    (6, 1, 5, 13, (0, 0)),         # a chunk after a cache, no padding: mask built
])
def test_attention_matches_eager_with_transformers_masks(rng, h, hkv, lq, lk, pads):
    b, d = len(pads), 16
    q, k, v = (torch.from_numpy(rng.standard_normal(s).astype(np.float32) * 2) for s in
               ((b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)))
    padding = torch.ones(b, lk, dtype=torch.bool)
    for i, p in enumerate(pads):
        padding[i, :p] = False
    offset = lk - lq
    mine, theirs = transformers_masks(b, lq, lk, padding)
    layer = _Layer(h // hkv)
    got, weights = at.attention_forward(layer, q, k, v, mine, scaling=0.25)
    want, _ = eager_attention_forward(layer, q, k, v, theirs, scaling=0.25)
    assert weights is None and got.shape == (b, lq, h, d) and got.is_contiguous()
    # rows of padding tokens see nothing: eager spreads them evenly, SDPA gives zeros;
    # no real token reads them, so only rows that see something are compared
    seen = (torch.arange(lk) >= torch.tensor(pads)[:, None])[:, None, :].expand(b, lq, lk)
    causal = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + offset
    live = (seen & causal).any(-1)                                   # [B, Lq]
    assert live.any()
    torch.testing.assert_close(got[live], want[live], rtol=1e-5, atol=1e-5)
    if mine is None:
        assert pads == (0, 0) and (lq == 1 or lq == lk)


def test_attention_passes_grouped_heads_as_they_are(monkeypatch):
    seen = []
    real = at.launch

    def spy(op, *args, **params):
        seen.append([tuple(a.shape) for a in args])
        return real(op, *args, **params)
    monkeypatch.setattr(at, "launch", spy)
    q, k = torch.randn(1, 8, 5, 16), torch.randn(1, 2, 5, 16)
    at.attention_forward(_Layer(4), q, k, k.clone(), None)
    assert seen == [[(1, 8, 5, 16), (1, 2, 5, 16), (1, 2, 5, 16)]]


def test_attention_refuses_training_only_and_unsupported_inputs():
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(InputValueError, match=r"_Layer: attention dropout 0.1 .*model.eval"):
        at.attention_forward(_Layer(1), q, q, q, None, dropout=0.1)
    with pytest.raises(InputValueError, match="softcap is not supported"):
        at.attention_forward(_Layer(1), q, q, q, None, softcap=30.0)
    with pytest.raises(InputValueError, match=r"mask of shape \(3, 3\); expected 4-D"):
        at.attention_forward(_Layer(1), q, q, q, torch.ones(3, 3, dtype=torch.bool))


@pytest.mark.parametrize("pads", [(0, 0), (3, 0, 5)])
def test_model_logits_match_eager_through_a_kv_cache(pads):
    """A whole model, "adaptive" attention vs "eager": prefill, then a 3-token chunk and a
    decode step against the cache (bottom-right causal), with and without left padding."""
    eager, mine = _pair(seed=1)
    eager.set_attn_implementation("eager")
    at.register()
    mine.set_attn_implementation("adaptive")
    b = len(pads)
    ids = torch.randint(1, 256, (b, 14), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(b, 14, dtype=torch.long)
    for i, p in enumerate(pads):
        mask[i, :p] = 0
    with torch.no_grad():
        caches = []
        for model in (eager, mine):
            out = model(ids[:, :10], attention_mask=mask[:, :10], use_cache=True)
            caches.append((out.logits, out.past_key_values))
        for (a, _), (c, _) in [caches]:
            live = mask[:, :10].bool()
            torch.testing.assert_close(c[live], a[live], rtol=1e-4, atol=1e-4)
        for lo, hi in ((10, 13), (13, 14)):
            steps = []
            for (logits, cache), model in zip(caches, (eager, mine)):
                steps.append(model(ids[:, lo:hi], attention_mask=mask[:, :hi],
                                   use_cache=True, **{cache_keyword(model): cache}).logits)
            torch.testing.assert_close(steps[1], steps[0], rtol=1e-4, atol=1e-4)


# ---- patch ----------------------------------------------------------------------------------

def test_patched_model_generates_the_same_greedy_tokens():
    plain, patched = _pair()
    at.patch(patched)
    first = {n: id(m) for n, m in patched.named_modules()}
    at.patch(patched)                                   # a second time changes nothing
    assert {n: id(m) for n, m in patched.named_modules()} == first
    assert patched.config._attn_implementation == "adaptive"
    layers = [m for m in patched.modules() if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 2 * 7 + 1 and all(isinstance(m, at.AdaptiveLinear) for m in layers)
    ids = torch.randint(1, 256, (3, 11), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0                       # left padding
    mask[2, :9] = 0
    want, got = _greedy(plain, ids, mask, 12), _greedy(patched, ids, mask, 12)
    assert torch.equal(got, want), (got[:, 11:], want[:, 11:])
    with torch.no_grad():
        a = plain(ids, attention_mask=mask).logits
        b = patched(ids, attention_mask=mask).logits
    torch.testing.assert_close(b[mask.bool()], a[mask.bool()], rtol=1e-4, atol=1e-4)


def test_patch_keeps_the_state_dict_and_stores_each_weight_once():
    plain, patched = _pair(attention_bias=True, tie_word_embeddings=True)
    before = {k: v.clone() for k, v in patched.state_dict().items()}
    at.patch(patched, layout="transposed")     # the layout that copies: one copy only
    after = patched.state_dict()
    assert list(after) == list(before)
    for name, value in before.items():
        assert after[name].shape == value.shape and torch.equal(after[name], value), name
    q = patched.model.layers[0].self_attn.q_proj
    assert q.mode == "dense" and q.bias is not None
    assert q._wt.is_contiguous() and q._wt.data_ptr() == q.weight.data_ptr()
    head = patched.lm_head                  # tied to the embedding: used as it is
    assert head.mode == "shared" and head.weight is patched.model.embed_tokens.weight
    ids = torch.randint(1, 256, (2, 9), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    assert torch.equal(_greedy(patched, ids, mask), _greedy(plain, ids, mask))
    # loading new values goes into the one transposed copy
    fresh = {k: torch.randn_like(v) for k, v in before.items()}
    patched.load_state_dict(fresh)
    plain.load_state_dict(fresh)
    assert torch.equal(_greedy(patched, ids, mask), _greedy(plain, ids, mask))


@pytest.mark.parametrize("layout", ["torch", "transposed"])
def test_a_patched_linear_returns_nn_linears_layout(layout):
    """Whatever plan serves it (exploring, committed, a kernel of ours over the weight as
    given), a patched layer's output is laid out as nn.Linear's: row-major, features
    contiguous. A transposed view reached SDPA as q with a last dim of stride != 1, which
    sends it down its math path (run S26's prefills inside the server)."""
    plain, patched = _pair(attention_bias=True, seed=3)
    at.patch(patched, layout=layout)
    pairs = [(n, m, dict(plain.named_modules())[n]) for n, m in patched.named_modules()
             if isinstance(m, at.AdaptiveLinear)]
    assert {m.mode for _, m, _ in pairs} == ({"shared"} if layout == "torch" else
                                             {"dense"})
    g = torch.Generator().manual_seed(8)
    for shape in ((3, 7), (2, 5, 7), (1, 1, 7)):
        for name, layer, ref in pairs[:3]:
            x = torch.randn(shape[:-1] + (layer.in_features,), generator=g)
            with torch.no_grad():
                for _ in range(3):          # exploring, then committed
                    y, want = layer(x), ref(x)
                    assert y.shape == want.shape and y.stride() == want.stride(), (
                        name, shape, y.stride(), want.stride())
                    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.usefixtures("decided_on_the_miss")
def test_pruned_weights_run_as_sparse_weights_built_once(monkeypatch):
    plain, patched = _pair(seed=5)
    with torch.no_grad():
        for model in (plain, patched):
            for layer in model.model.layers:
                for lin in (layer.mlp.up_proj, layer.mlp.down_proj):
                    keep = torch.rand(lin.weight.shape, generator=torch.Generator()
                                      .manual_seed(lin.weight.numel())) < 0.2
                    lin.weight.mul_(keep)
    at.patch(patched, sparse={"mlp": "auto"}, layout="transposed")
    modes = {n: m.mode for n, m in patched.named_modules() if isinstance(m, at.AdaptiveLinear)}
    assert modes["model.layers.1.mlp.up_proj"] == "sparse"
    assert modes["model.layers.1.mlp.gate_proj"] == "dense"      # not pruned: "auto" says no
    assert modes["model.layers.0.self_attn.q_proj"] == "dense"   # not under "mlp"
    sparse = patched.model.layers[0].mlp.up_proj._sparse
    assert isinstance(sparse, adaptive.SparseWeight) and 0.1 < sparse.density < 0.3
    handles = {id(patched.model.layers[i].mlp.up_proj._sparse) for i in (0, 1)}
    handles |= {id(patched.model.layers[i].mlp.down_proj._sparse) for i in (0, 1)}
    calls, built = [], []
    real = at.AdaptiveLinear.forward
    monkeypatch.setattr(at.AdaptiveLinear, "forward",
                        lambda self, x: (calls.append(self._sparse), real(self, x))[1])
    monkeypatch.setattr(linear_mod, "SparseWeight",
                        lambda w: built.append(w) or adaptive.SparseWeight(w))
    ids = torch.randint(1, 256, (2, 8), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    assert torch.equal(_greedy(patched, ids, mask, 6), _greedy(plain, ids, mask, 6))
    # the handles made at patch time serve every call: none built again. A decode step
    # whose layer holds torch's own matmul (its direct call) skips forward, so the count
    # of forward calls is the prefill's at least, not one a step
    assert not built
    assert {id(s) for s in calls if s is not None} == handles
    assert 1 <= sum(s is sparse for s in calls) <= 6
    assert patched.model.layers[0].mlp.up_proj._sparse is sparse


def test_sparse_rules_by_predicate_and_bound():
    _, model = _pair()
    at.patch(model, sparse=lambda path, lin: path.endswith("o_proj"), layout="transposed")
    assert model.model.layers[0].self_attn.o_proj.mode == "sparse"
    assert model.model.layers[0].self_attn.k_proj.mode == "dense"
    _, model = _pair()
    at.patch(model, sparse={"layers.1": True, "layers.1.mlp": False}, layout="transposed")
    assert model.model.layers[1].self_attn.v_proj.mode == "sparse"
    assert model.model.layers[1].mlp.up_proj.mode == "dense"         # False wins
    assert model.model.layers[0].self_attn.v_proj.mode == "dense"


def _linear_types(model):
    return {n: type(m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def _assert_untouched(model, types, impl):
    assert _linear_types(model) == types
    assert all(t is torch.nn.Linear for t in types.values())
    assert getattr(getattr(model, "config", None), "_attn_implementation", impl) == impl


def test_every_module_that_cannot_be_served_is_named_and_nothing_changes():
    _, model = _pair()
    model.model.layers[0].mlp.up_proj.double()
    model.model.layers[1].self_attn.k_proj.to(torch.bfloat16)
    types, impl = _linear_types(model), model.config._attn_implementation
    with pytest.raises(InputValueError) as err:
        at.patch(model)
    text = str(err.value)
    assert "nothing was changed" in text and "2 problem(s)" in text
    assert "model.layers.0.mlp.up_proj: weight dtype float64 on cpu" in text
    assert ("model.layers.1.self_attn.k_proj: weight dtype bfloat16 on cpu; expected one of "
            "float16, float32 (the host backend has no bfloat16)") in text
    _assert_untouched(model, types, impl)


def test_unknown_attention_layouts_are_refused():
    class Opaque(LlamaForCausalLM):
        _supports_attention_backend = False
    torch.manual_seed(0)
    model = Opaque(_config()).eval()
    types, impl = _linear_types(model), model.config._attn_implementation
    with pytest.raises(InputValueError, match=r"\(the model\): Opaque does not route its "
                                              r"attention through transformers' "
                                              r"AttentionInterface \(unknown attention layout\)"):
        at.patch(model)
    _assert_untouched(model, types, impl)
    wrapper = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.MultiheadAttention(8, 2))
    types = _linear_types(wrapper)
    with pytest.raises(InputValueError, match=r"\n  1: torch.nn.MultiheadAttention computes "
                                              r"attention inside its own forward"):
        at.patch(wrapper)
    assert _linear_types(wrapper) == types


def test_linear_subclasses_and_bad_arguments_are_refused():
    class Quantised(torch.nn.Linear):
        pass
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), Quantised(8, 8))
    with pytest.raises(InputValueError, match=r"1: .*Quantised is a subclass of nn.Linear .*skip="):
        at.patch(model)
    assert type(model[0]) is torch.nn.Linear
    at.patch(model, skip=lambda path, lin: path == "1")
    assert isinstance(model[0], at.AdaptiveLinear) and type(model[1]) is Quantised
    x = torch.randn(3, 8)
    want = model[1](x @ model[0].weight.T + model[0].bias)
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputTypeError, match="takes a torch.nn.Module, got dict"):
        at.patch({})
    _, llama = _pair()
    with pytest.raises(InputValueError, match=r"sparse=\{'mpl': ...\}: matches no nn.Linear"):
        at.patch(llama, sparse={"mpl": "auto"})
    with pytest.raises(InputValueError, match=r"sparse\['mlp'\] = 2; expected 'auto'"):
        at.patch(llama, sparse={"mlp": 2})
    with pytest.raises(InputTypeError, match="sparse must be None, a mapping"):
        at.patch(llama, sparse="mlp")
    assert llama.config._attn_implementation != "adaptive"


def test_a_failure_half_way_puts_everything_back(monkeypatch):
    plain, model = _pair()
    types, impl = _linear_types(model), model.config._attn_implementation
    real, made = at.AdaptiveLinear.__init__, []

    def failing(self, *args, **kwargs):
        if len(made) == 5:
            raise MemoryError("simulated: out of memory")
        made.append(1)
        real(self, *args, **kwargs)
    monkeypatch.setattr(at.AdaptiveLinear, "__init__", failing)
    with pytest.raises(MemoryError):
        at.patch(model)
    _assert_untouched(model, types, impl)
    ids = torch.randint(1, 256, (1, 6), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    assert torch.equal(_greedy(model, ids, mask, 4), _greedy(plain, ids, mask, 4))


def test_a_patched_layer_moved_to_another_dtype_rebinds_its_weight():
    torch.manual_seed(9)
    plain = torch.nn.Linear(24, 40)
    layer = at.AdaptiveLinear(torch.nn.Linear(24, 40), "dense", "layer").eval()
    layer.load_state_dict(plain.state_dict())
    layer.half()
    assert layer._wt.dtype == torch.float16 and layer._wt.is_contiguous()
    assert layer._wt.data_ptr() == layer.weight.data_ptr()
    x = torch.randn(2, 3, 24)
    want = plain(x)
    torch.testing.assert_close(layer(x.half()).float(), want, rtol=2e-2, atol=2e-2)
    layer.float()
    torch.testing.assert_close(layer(x), want, rtol=2e-3, atol=2e-3)


def test_unpatch_and_training_mode():
    plain, model = _pair()
    model.set_attn_implementation("eager")
    at.patch(model)
    model.train()
    # the first adaptive module a training forward meets says so: the first norm
    with pytest.raises(RuntimeError, match=r"model.layers.0.input_layernorm: adaptive norms "
                                           r"are for inference .*model.eval\(\)"):
        model(torch.ones(1, 3, dtype=torch.long))
    q = model.model.layers[0].self_attn.q_proj
    with pytest.raises(RuntimeError, match=r"model.layers.0.self_attn.q_proj: adaptive layers "
                                           r"are for inference .*model.eval\(\)"):
        q(torch.ones(1, 3, 64))
    attn = model.model.layers[0].self_attn
    at._remember(attn, torch.ones(1, 4, 1, 16), 40, 0.25, None, object())   # a held class
    assert at._MEMO in attn.__dict__
    at.unpatch(model.eval())
    assert not any(at._MEMO in m.__dict__ for m in model.modules())   # memos let go too
    assert all(t is torch.nn.Linear for t in _linear_types(model).values())
    norms = [type(m).__name__ for n, m in model.named_modules() if n.endswith("norm")]
    assert norms and set(norms) == {"LlamaRMSNorm"}
    assert model.config._attn_implementation == "eager"       # what it was before
    ids = torch.randint(1, 256, (1, 6), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    assert torch.equal(_greedy(model, ids, mask, 4), _greedy(plain, ids, mask, 4))


def test_importing_the_integration_imports_neither_torch_nor_transformers():
    code = ("import sys, adaptive, adaptive.integrations.transformers as t\n"
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=120).stdout.strip()
    assert out == "[]", f"imported on import: {out}"


# ---- the SDPA variant's torch entry, run on CPU tensors ---------------------------------------

def _sdpa_entry():
    import types
    from adaptive.variants import shared_registry
    variant = shared_registry().get("attention", "sdpa_torch")
    namespace: dict = {}
    with pytest.MonkeyPatch().context() as m:   # CuPy is used only by other functions there
        if "cupy" not in sys.modules:
            m.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
        exec(compile(variant.source, "library.py", "exec"), namespace)  # noqa: S102
    return namespace["attention_sdpa_torch"]


@pytest.mark.parametrize("h,hkv,lq,lk,causal,mask_kind", [
    (8, 2, 9, 9, True, None),            # grouped, no mask: enable_gqa
    (8, 2, 1, 30, True, "bool"),         # decode with padding: the group folded into rows
    (8, 2, 6, 30, True, "bool"),         # chunk after a cache, padded: bottom-right + repeat
    (4, 4, 6, 30, True, "additive"),     # additive mask joined by the causal triangle
    (4, 2, 5, 12, False, "per_head"),    # a per-head mask with grouped heads
])
def test_sdpa_torch_entry_matches_the_reference(rng, h, hkv, lq, lk, causal, mask_kind):
    from adaptive.ops import get_op
    op = get_op("attention")
    q, k, v = (torch.from_numpy(x) for x in op.make_inputs(
        {"B": 3, "H": h, "Hkv": hkv, "Lq": lq, "Lk": lk, "D": 16}, "float32", rng))
    mask = None
    if mask_kind is not None:
        heads = h if mask_kind == "per_head" else 1
        mask = torch.from_numpy(rng.random((3, heads, lq, lk)) < 0.7)
        mask[..., -1] = True                          # every row sees some key
        mask[1, :, :, :5] = False                     # and some padding
        if mask_kind == "additive":
            mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    out = torch.full((3, h, lq, 16), float("nan"))
    _sdpa_entry()(q, k, v, mask, out=out, causal=causal, scale=0.2)
    args = (q, k, v) if mask is None else (q, k, v, mask.numpy())
    assert op.error(out, op.reference(*(np.asarray(a) for a in args), causal=causal,
                                      scale=0.2)) < 1e-5


def test_a_layer_holds_its_committed_plan_and_lets_go_when_it_goes_stale():
    from adaptive.runtime import default_dispatcher
    from adaptive.integrations.linear import HOLD_EVERY, AdaptiveLinear
    torch.manual_seed(3)
    layer = AdaptiveLinear(torch.nn.Linear(24, 10, bias=True)).eval()
    w = layer.weight.detach().double()
    b = layer.bias.detach().double()
    x = torch.randn(3, 5, 24)
    for _ in range(HOLD_EVERY + 20):       # long enough to explore, commit and be held
        y = layer(x)
        torch.testing.assert_close(y.double(), x.double() @ w.t() + b, rtol=1e-5, atol=1e-5)
    (plan,) = layer._held.values()
    assert not plan.stale and not plan.provisional
    default_dispatcher((x.reshape(-1, 24), layer._wt)).forget("gemm")
    assert plan.stale
    y = layer(torch.ones(3, 5, 24))       # the stale plan is not used: decided again
    torch.testing.assert_close(y.double(), torch.ones(3, 5, 24).double() @ w.t() + b,
                               rtol=1e-5, atol=1e-5)
    assert all(p is not plan for p in layer._held.values())
