"""The integration's warm paths on CUDA, fp16, with a dispatcher whose only variants are
cuBLAS (torch.mm), SDPA through torch and the model's own RMSNorm ops
(``rmsnorm_torch``): a warm patched linear is F.linear itself (with layout="torch", bit
for bit the plain layer's output), decode attention is held by input class, and a patched
tiny Llama generates the plain model's greedy tokens; and a pruned layer committed to
spmm's dense matmul is F.linear too."""

from __future__ import annotations

import contextlib

import pytest


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import adaptive  # noqa: E402
from adaptive import runtime  # noqa: E402
from adaptive.integrations import transformers as at  # noqa: E402
from adaptive.integrations.linear import HOLD_EVERY  # noqa: E402
from adaptive.ops.base import bucket  # noqa: E402
from adaptive.variants import Registry, shared_registry  # noqa: E402

DEV = "cuda"
# the calls here are scripted (which reach the dispatcher, which are held): a new class is
# decided on its miss, not off the calling thread
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("decided_on_the_miss")]


@pytest.fixture
def library():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    like = torch.empty(1, device=DEV)
    before = runtime.default_dispatcher(device="cuda:0")
    shared = shared_registry()
    # not runtime.start(d): the start-up packs would add their variants to the registry
    d = adaptive.Dispatcher("cuda", device=0, registry=Registry(
        [shared.get("gemm", "cublas"), shared.get("attention", "sdpa_torch"),
         shared.get("rmsnorm", "rmsnorm_torch")]))
    runtime.set_default(d, like)
    at.forget_held()
    yield d
    runtime.set_default(before, like)
    at.forget_held()


def test_a_warm_linear_is_the_plain_layers_call_bit_for_bit(library):
    torch.manual_seed(0)
    plain = torch.nn.Linear(2048, 5632, device=DEV, dtype=torch.float16).eval()
    model = torch.nn.Sequential(torch.nn.Linear(2048, 5632, device=DEV, dtype=torch.float16))
    model[0].load_state_dict(plain.state_dict())
    at.patch(model, layout="torch")
    layer = model[0]
    runs = []
    real = library.run

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)
    library.run = counted
    with torch.no_grad():
        for _ in range(64 * HOLD_EVERY):   # the policy explores first: every call routed
            layer(torch.randn(1, 1, 2048, device=DEV, dtype=torch.float16))
            if list(layer._library) == [torch.Size([1, 1, 2048])]:
                break
        assert list(layer._library) == [torch.Size([1, 1, 2048])], "never committed"
        del runs[:]
        for _ in range(2 * HOLD_EVERY):
            x = torch.randn(1, 1, 2048, device=DEV, dtype=torch.float16)
            before = len(runs)
            y = layer(x)
            if len(runs) == before:   # warm, not routed: F.linear on the same [out, in] weight
                assert torch.equal(y, plain(x))
            else:        # through the dispatcher (each layer at its own offset): torch.mm
                torch.testing.assert_close(y, plain(x), rtol=2e-3, atol=2e-3)
    assert 1 <= len(runs) <= 3   # committed: one call in HOLD_EVERY goes through


def test_a_patched_llama_holds_its_plans_and_generates_the_plain_tokens(library):
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, vocab_size=512,
                         max_position_embeddings=1024, pad_token_id=0, eos_token_id=None,
                         bos_token_id=None, attn_implementation="sdpa")
    torch.manual_seed(1)
    plain = LlamaForCausalLM(config).to(DEV, torch.float16).eval()
    patched = LlamaForCausalLM(config).to(DEV, torch.float16)
    patched.load_state_dict(plain.state_dict())
    at.patch(patched)
    ids = torch.randint(1, 512, (2, 40), device=DEV)
    mask = torch.ones_like(ids)
    mask[1, :11] = 0
    with torch.no_grad():
        want = plain.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                              pad_token_id=0)
        got = patched.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                               pad_token_id=0)
    # the first 16 new tokens: fp16 sums over the transposed weight may round otherwise,
    # which can flip a near tie later in a random model
    assert torch.equal(got[:, :56], want[:, :56])
    layers = [m for m in patched.modules() if isinstance(m, at.AdaptiveLinear)]
    assert all(m._library for m in layers), [
        (m.path, {str(k[0]): (p.candidate.label, p.provisional, p.stale)
                  for k, p in m._held.items()}) for m in layers if not m._library]
    assert at._held


def test_a_pruned_layer_on_the_dense_matmul_is_f_linear_bit_for_bit():
    """A 2:4-pruned fp16 linear patched sparse, with spmm's baseline (cuBLAS on the dense
    form of the pruned weight) the only spmm variant: the baseline reads the layer's own
    weight (no second dense copy: built from the host CSR on a serving call, it took
    152.7 ms, run S85), again after a state_dict load; once committed, a warm call is
    F.linear on x as given, bit for bit the plain layer's output, with no transposed copy."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from adaptive.backends.cuda_sparse import device_dense
    with _only("spmm", "cublas_dense"):
        torch.manual_seed(0)
        plain = torch.nn.Linear(1024, 2816, device=DEV, dtype=torch.float16).eval()
        with torch.no_grad():
            w = plain.weight.view(-1, 4)
            w.scatter_(1, w.abs().argsort(dim=1)[:, :2], 0.0)   # 2:4: the two smallest go
        layer = at.AdaptiveLinear(plain, "sparse").eval()
        assert device_dense(layer._sparse).data.ptr == layer.weight.data_ptr()
        layer.load_state_dict({k: v.clone() for k, v in plain.state_dict().items()})
        assert device_dense(layer._sparse).data.ptr == layer.weight.data_ptr()
        x = torch.randn(3, 37, 1024, device=DEV, dtype=torch.float16)
        with torch.no_grad():
            for _ in range(64 * HOLD_EVERY):   # exploring: routed, x transposed
                layer(x)
                if x.shape in layer._library:
                    break
            assert x.shape in layer._library, "never committed"
            assert layer.route_of(x) == "F.linear (held)"
            ys = [layer(x) for _ in range(4)]
            want = plain(x)
        warm = [y for y in ys if torch.equal(y, want)]
        assert len(warm) >= 3, "warm calls are F.linear on the same weight"
        for y in ys:
            torch.testing.assert_close(y, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("tokens", [(3, 37), (8, 512), (16, 512)])
def test_a_pruned_layer_on_cusparselt_hands_it_row_major_operands(tokens):
    """A 2:4-pruned fp16 linear patched sparse, with cuSPARSELt's 2:4 matmul the only spmm
    variant: once committed, every call hands cuSPARSELt a row-major dense operand and
    no ``transpose_result`` (x's transposed view with it, torch's own 2:4 linear's layout,
    took 0.26-7.0 s of host time a call in run S85's prefills), whichever route the race
    with F.linear gave the shape, and matches the plain layer against float64 at an odd
    token count (padded) and a prefill's."""
    if not torch.cuda.is_available() or not torch.backends.cusparselt.is_available():
        pytest.skip("no CUDA device with cuSPARSELt")
    real, seen = torch._cslt_sparse_mm, []

    def spy(packed, dense_b, *args, **kwargs):
        seen.append((dense_b.is_contiguous(), bool(kwargs.get("transpose_result"))))
        return real(packed, dense_b, *args, **kwargs)
    with _only("spmm", "cusparselt_24"):
        torch.manual_seed(0)
        plain = torch.nn.Linear(1024, 2816, bias=False, device=DEV,
                                dtype=torch.float16).eval()
        with torch.no_grad():
            w = plain.weight.view(-1, 4)
            w.scatter_(1, w.abs().argsort(dim=1)[:, :2], 0.0)   # 2:4: the two smallest go
        layer = at.AdaptiveLinear(plain, "sparse").eval()
        x = torch.randn(*tokens, 1024, device=DEV, dtype=torch.float16)
        want = (x.double() @ plain.weight.double().t())
        torch._cslt_sparse_mm = spy
        try:
            with torch.no_grad():
                for _ in range(64):   # exploring its one candidate, then committed and held
                    layer(x)
                    if layer.route_of(x) in ("held cusparselt_24", "F.linear (held)"):
                        break
                assert layer.route_of(x) in ("held cusparselt_24", "F.linear (held)"), \
                    layer.route_of(x)
                ys = [layer(x) for _ in range(4)]
        finally:
            torch._cslt_sparse_mm = real
        assert seen and set(seen) == {(True, False)}, set(seen)
        for y in ys:
            assert y.shape == x.shape[:-1] + (2816,) and y.is_contiguous()
            err = float((y.double() - want).abs().max() / want.abs().max())
            assert err < 2e-3, err


def test_a_kernel_for_a_weight_kept_as_given_races_f_linear_on_the_gpu():
    """A linear kept as given (``[out, in]``) whose only gemm is ``tc_wide``: once the
    prefill shape is committed, the kernel with its two transposing copies races F.linear
    on x as given (CUDA-synchronised runs); the verdict is recorded, the route serving the
    shape is the winner's, and the output matches float64 either way."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with _only("gemm", "tc_wide"):
        torch.manual_seed(0)
        plain = torch.nn.Linear(2048, 2048, bias=False, device=DEV,
                                dtype=torch.float16).eval()
        layer = at.AdaptiveLinear(plain, "shared").eval()
        x = torch.randn(8, 512, 2048, device=DEV, dtype=torch.float16)
        want = x.double() @ plain.weight.double().t()
        with torch.no_grad():
            tokens = bucket(x.numel() // 2048)     # races are held per token class
            for _ in range(64):
                layer(x)
                verdicts = [v for (_, b), v in layer._raced.items() if b == tokens]
                if verdicts:
                    break
            assert len(verdicts) == 1, f"never committed and raced: {layer._raced}"
            f_linear_won = verdicts[0]
            route = layer.route_of(x)
            assert route == "F.linear (held)" if f_linear_won else \
                route.startswith("held tc_wide"), (route, f_linear_won)
            y = layer(x)
        err = float((y.double() - want).abs().max() / want.abs().max())
        assert err < 2e-3, err


@contextlib.contextmanager
def _only(op: str, name: str):
    """The default CUDA dispatcher, while open, one whose only variant is ``op``'s
    ``name``."""
    like = torch.empty(1, device=DEV)
    before = runtime.default_dispatcher(device="cuda:0")
    d = adaptive.Dispatcher("cuda", device=0, registry=Registry(
        [shared_registry().get(op, name)]))
    runtime.set_default(d, like)
    at.forget_held()
    try:
        yield d
    finally:
        runtime.set_default(before, like)
        at.forget_held()
