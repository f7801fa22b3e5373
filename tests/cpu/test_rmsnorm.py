"""rmsnorm without a GPU: the op's checks, its baseline against transformers' LlamaRMSNorm
bit for bit, the fused CUDA kernel run through the CPU emulation (tests/cpu/cuda_emu.py)
against float64 on odd shapes and the value regimes, and AdaptiveRMSNorm in a model."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

import adaptive
from adaptive.errors import InputTypeError, InputValueError
from adaptive.limits import SM90
from adaptive.ops import OPS
from adaptive.regen.shapes import make_inputs
from adaptive.regen import worker
from adaptive.variants import builtin_folder, load_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_emu  # noqa: E402

OP = OPS["rmsnorm"]


# ---- the op ------------------------------------------------------------------------------------

def test_bad_inputs_name_what_was_expected(rng):
    x, w = OP.make_inputs({"R": 3, "C": 10}, "float32", rng)
    with pytest.raises(InputValueError, match=r"weight has 9 elements but x has C=10 columns"):
        adaptive.launch("rmsnorm", x, w[:9])
    with pytest.raises(InputValueError,
                       match=r"'x' must have rank 2 \(\[R, C\]\), got shape \(1, 3, 10\)"):
        adaptive.launch("rmsnorm", x[None], w)
    with pytest.raises(InputValueError, match=r"'eps' must be a finite number > 0, got 0.0"):
        adaptive.launch("rmsnorm", x, w, eps=0.0)
    with pytest.raises(InputTypeError, match=r"different dtypes"):
        adaptive.launch("rmsnorm", x, w.astype(np.float16))


def test_reference_is_the_formula_and_eps_counts(rng):
    x = rng.standard_normal((4, 7))
    w = rng.standard_normal(7)
    want = w * x / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + 0.25)
    np.testing.assert_allclose(OP.reference(x, w, eps=0.25), want, rtol=1e-12)
    zeros = np.zeros((2, 7))
    assert np.all(OP.reference(zeros, w, eps=1e-6) == 0)


# ---- the baseline: what transformers runs ------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_baseline_is_llamas_rmsnorm_bit_for_bit(rng, dtype):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from adaptive.variants import shared_registry
    ns: dict = {}
    exec(compile(shared_registry().get("rmsnorm", "rmsnorm_torch").source, "library.py",
                 "exec"), ns)  # noqa: S102
    t = getattr(torch, dtype)
    norm = LlamaRMSNorm(333, eps=1e-5)
    norm.weight.data = torch.from_numpy(rng.standard_normal(333).astype(np.float32)).to(t)
    x = torch.from_numpy(rng.standard_normal((2, 5, 333)).astype(np.float32) * 3).to(t)
    with torch.no_grad():
        want = norm(x)
    got = ns["rmsnorm_torch"](x, norm.weight.detach(), eps=1e-5)
    assert got.dtype == want.dtype and torch.equal(got, want)
    out = torch.full_like(want, float("nan"))
    assert ns["rmsnorm_torch"](x, norm.weight.detach(), out=out, eps=1e-5) is out
    assert torch.equal(out, want)


# ---- the fused kernel, emulated ----------------------------------------------------------------

CONFIGS = [{"G": 32, "ROWS": 4, "VEC": 1}, {"G": 64, "ROWS": 2, "VEC": 4},
           {"G": 256, "ROWS": 1, "VEC": 2}, {"G": 1024, "ROWS": 1, "VEC": 4}]
SOURCE = builtin_folder() / "rmsnorm" / "rmsnorm_rows.cu"


def _tag(c):
    return f"G{c['G']}_R{c['ROWS']}_V{c['VEC']}"


def emu_jobs(folder: Path) -> dict:
    """rmsnorm_rows.cu as written (T = float), a library per config: lib -> (source,
    g++ flags defining the config)."""
    wrapper = ('extern "C" void emu_run(unsigned gx, unsigned bx, unsigned by, const float* x, '
               'const float* w, float* out, int R, int C, float eps) {\n'
               "  emu_launch(gx, 1, 1, bx, by, 1, [=] { rmsnorm_rows(x, w, out, R, C, eps); });"
               "\n}\n")
    text = cuda_emu.HEADER + f'#line 1 "{SOURCE.name}"\n' + SOURCE.read_text() + "\n" + wrapper
    return {folder / f"rms_{_tag(c)}.so": (text, [f"-D{k}={v}" for k, v in c.items()])
            for c in CONFIGS}


BACKGROUND = cuda_emu.background_build(__file__, cpu_s=6.0)


@pytest.fixture(scope="module")
def kernels(background):
    """Each config of CONFIGS (a config of the manifest's space), compiled in the
    background: tag -> emu_run(grid, G, ROWS, x, w, out, R, C, eps)."""
    (variant,) = [v for v in load_manifest(builtin_folder() / "rmsnorm" / "manifest.toml")
                  if v.name == "rms_rows"]
    assert all(c in variant.space.configs(SM90) for c in CONFIGS)
    out = {}
    for c, lib in zip(CONFIGS, cuda_emu.built(background, __file__, emu_jobs)):
        fn = ctypes.CDLL(str(lib)).emu_run
        fn.argtypes = [ctypes.c_uint] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + \
            [ctypes.c_float]
        out[_tag(c)] = fn
    return out


@pytest.mark.skipif(not cuda_emu.available(), reason="g++ is not installed")
@pytest.mark.parametrize("config", CONFIGS, ids=_tag)
@pytest.mark.parametrize("regime", ["normal", "outliers", "tiny", "constant"])
def test_kernel_emulated_against_float64(kernels, config, regime):
    """Odd widths (scalar loads), widths the vector loads divide, a partial last block of
    rows; the output NaN-poisoned first and a guard region around it untouched."""
    fn = kernels[_tag(config)]
    for r, c in ((5, 333), (3, 1032), (1, 1)):
        dims = {"R": r, "C": c}
        x, w = make_inputs(OP, dims, "float32", 3, regime)
        eps = 1e-5
        n, guard = x.size, 32
        big = np.full(n + 2 * guard, worker.CANARY, np.float32)
        out = big[guard:guard + n].reshape(x.shape)
        out.fill(np.nan)
        fn(-(-r // config["ROWS"]), config["G"], config["ROWS"], x.ctypes.data,
           w.ctypes.data, out.ctypes.data, r, c, eps)
        assert np.all(big[:guard] == worker.CANARY) and np.all(big[guard + n:] ==
                                                                worker.CANARY)
        ref = OP.reference(x, w, eps=eps)
        err = OP.error(out, ref, OP.error_floor("float32"))
        assert err <= OP.tolerance_for("float32", dims), (dims, err)


# ---- AdaptiveRMSNorm ---------------------------------------------------------------------------

def _llama():
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         max_position_embeddings=256, pad_token_id=0, eos_token_id=None,
                         bos_token_id=None)
    return LlamaForCausalLM(config).eval()


def test_patch_serves_the_norms_and_keeps_the_state_dict():
    torch = pytest.importorskip("torch")
    from adaptive import runtime
    from adaptive.integrations import transformers as at
    from adaptive.integrations.norm import AdaptiveRMSNorm
    plain = _llama()
    model = _llama()
    keys = list(model.state_dict())
    at.patch(model)
    norms = {n: m for n, m in model.named_modules() if isinstance(m, AdaptiveRMSNorm)}
    assert sorted(norms) == ["model.layers.0.input_layernorm",
                             "model.layers.0.post_attention_layernorm",
                             "model.layers.1.input_layernorm",
                             "model.layers.1.post_attention_layernorm", "model.norm"]
    assert list(model.state_dict()) == keys
    x = torch.randn(2, 3, 64)
    norm, want_norm = norms["model.norm"], plain.model.norm
    with torch.no_grad():
        norm(x)   # the class's miss: decided off the calling thread, torch's norm serves
        runtime.default_dispatcher((x,)).wait_for_decisions()
        for _ in range(12):   # past the exploring calls: a committed, held plan
            got = norm(x)
        torch.testing.assert_close(got, want_norm(x), rtol=1e-5, atol=1e-5)
    held = norm._held.get(x.shape) or norm._own.get(x.shape)
    assert held is not None and not held.provisional   # the model's ops in _own, others held
    assert (x.shape in norm._own) == held.candidate.variant.torch_library
    norm.train()   # a held plan does not serve training: the error, on every call
    for _ in range(3):
        with pytest.raises(RuntimeError, match=r"model.norm: adaptive norms are for inference"):
            norm(x)
    norm.eval()
    ids = torch.randint(1, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = plain.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        b = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(a, b)
    at.unpatch(model)
    assert not any(isinstance(m, AdaptiveRMSNorm) for m in model.modules())
    assert list(model.state_dict()) == keys


def test_only_norms_that_compute_as_llamas_are_served():
    """Gemma's RMSNorm (1 + weight) and a LayerNorm are not LlamaRMSNorm's computation:
    left as they are; norms=False leaves every norm."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from adaptive.integrations import transformers as at
    from adaptive.integrations.norm import AdaptiveRMSNorm, is_rmsnorm
    llama, gemma = LlamaRMSNorm(16), GemmaRMSNorm(16)
    with torch.no_grad():
        gemma.weight.normal_()
    assert is_rmsnorm(llama) and not is_rmsnorm(gemma)
    assert not is_rmsnorm(torch.nn.LayerNorm(16))
    box = torch.nn.Sequential(llama, gemma, torch.nn.LayerNorm(16))
    at.patch(box)
    assert [type(m) for m in box] == [AdaptiveRMSNorm, GemmaRMSNorm, torch.nn.LayerNorm]
    other = at.patch(torch.nn.Sequential(LlamaRMSNorm(16)), norms=False)
    assert type(other[0]) is LlamaRMSNorm
    with pytest.raises(InputTypeError, match="norms must be True or False"):
        at.patch(torch.nn.Sequential(LlamaRMSNorm(16)), norms="yes")


def test_an_input_the_op_does_not_take_runs_the_models_own_computation():
    """x in another dtype than the weight: the plain module's result (its type promotion
    included), not an error and not a conversion; a moved norm rebinds its weight."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from adaptive.integrations.norm import AdaptiveRMSNorm
    plain = LlamaRMSNorm(24, eps=1e-5)
    with torch.no_grad():
        plain.weight.normal_()
    norm = AdaptiveRMSNorm(LlamaRMSNorm(24, eps=1e-5), "norm").eval()
    norm.load_state_dict(plain.state_dict())
    x = torch.randn(3, 24)
    with torch.no_grad():
        mixed = norm(x.double())
        assert mixed.dtype == plain(x.double()).dtype and torch.equal(mixed, plain(x.double()))
        norm.half()
        assert norm._w.dtype == torch.float16 and norm._w.data_ptr() == norm.weight.data_ptr()
        torch.testing.assert_close(norm(x.half()).float(), plain(x), rtol=2e-2, atol=2e-2)
