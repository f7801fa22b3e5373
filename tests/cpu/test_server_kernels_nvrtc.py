"""The example server's fused CUDA glue (examples/server/fused.cu) without a GPU.

1. It compiles with NVRTC for sm_90 in float16 and float32, every kernel present, no
   spills.
2. Its logic runs on the CPU through a thin CUDA emulation (tests/cpu/cuda_emu.py: g++, a
   fiber per CUDA thread) driven by the real launcher (``fused.Fused``), against float64
   references on fresh random inputs with odd shapes; and the whole block's CUDA forward
   pass (fused glue + host ops) matches ``block.reference``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from adaptive import nvrtc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "server"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cuda_emu  # noqa: E402
import fused  # noqa: E402
from block import AdaptiveBlock, BlockShape, input_activations, reference  # noqa: E402

SIGNATURES = {
    "residual_layernorm": [("ptr", "const T*"), ("ptr", "const T*"), "i32", "ptr", "ptr",
                           "ptr", "i32", "i32", "f32"],
    "gelu_inplace": ["ptr", "i64"],
    "pad_cast": [("ptr", "const float*"), "ptr", "i32", "i32", "i32"],
    "split_heads": [("ptr", "const T*"), "ptr", "i32", "i32", "i32"],
    "merge_heads": [("ptr", "const T*"), "ptr", "i32", "i32", "i32"],
    "summarise": [("ptr", "const T*"), ("ptr", "const T*"), "i32", "i32", "i32",
                  ("ptr", "float*")],
}


# ---- NVRTC -----------------------------------------------------------------------------------
@pytest.mark.skipif(not nvrtc.available(), reason="cuda.bindings is not installed "
                    "(pip install .[nvrtc])")
@pytest.mark.parametrize("dtype", fused.DTYPES)
def test_fused_kernels_compile_for_sm90(dtype):
    cubin, log = nvrtc.compile_source(fused.source(dtype), (), "sm_90", "fused.cu")
    assert cubin[:4] == b"\x7fELF", "NVRTC did not return a cubin"
    for name in fused.KERNELS:
        res = nvrtc.parse_ptxas(log, name)
        assert f"Compiling entry function '{name}'" in log, f"{name} missing:\n{log}"
        assert res["registers"] > 0, f"{name}: no ptxas report\n{log}"
        assert res["spill_store_bytes"] == 0 and res["stack_bytes"] == 0, f"{name}: {res}"


def test_fused_source_rejects_other_dtypes():
    with pytest.raises(ValueError, match="float16"):
        fused.source("bfloat16")


# ---- emulated on the CPU -------------------------------------------------------------------
def emu_jobs(folder: Path) -> dict:
    """fused.cu with an entry point per kernel: library -> (source, g++ flags)."""
    return {folder / "emu.so": (cuda_emu.build_source(fused.SOURCE_PATH.read_text(),
                                                      SIGNATURES), [])}


# g++ builds it in the background from the start of the session (tests/background.py)
BACKGROUND = cuda_emu.background_build(__file__, cpu_s=1.0)


@pytest.fixture(scope="module")
def kernels(background):
    (lib,) = cuda_emu.built(background, __file__, emu_jobs)
    return fused.Fused(np, cuda_emu.load(lib, SIGNATURES), "float32")


def _ln64(s):
    s = np.asarray(s, np.float64)
    return (s - s.mean(1, keepdims=True)) / np.sqrt(s.var(1, keepdims=True) + fused.EPS)


@pytest.mark.parametrize("p,d", [(37, 300), (5, 45), (33, 64)])
def test_layernorm_plain_residual_and_transposed(kernels, rng, p, d):
    x = (rng.standard_normal((p, d)) * 2 + 3).astype(np.float32)   # a mean off zero
    r = rng.standard_normal((p, d)).astype(np.float32)
    s, y, yt = kernels.layernorm(x)
    assert s is None and yt is None
    np.testing.assert_allclose(y, _ln64(x), atol=2e-5, rtol=1e-4)

    s, y, yt = kernels.layernorm(x, r, want_sum=True, want_y=True, want_yt=True)
    want = _ln64(x.astype(np.float64) + r)
    np.testing.assert_allclose(s, x.astype(np.float64) + r, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y, want, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(yt, want.T, atol=2e-5, rtol=1e-4)

    rt = np.ascontiguousarray(r.T)                                    # [d, P]
    s, y, yt = kernels.layernorm(x, rt, r_transposed=True, want_sum=True, want_y=False,
                                 want_yt=True)
    assert y is None
    np.testing.assert_allclose(s, x.astype(np.float64) + r, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(yt, want.T, atol=2e-5, rtol=1e-4)

    s, y, yt = kernels.layernorm(x, rt, r_transposed=True, want_sum=True, want_y=False)
    assert y is None and yt is None                    # a plain (transposed) residual add
    np.testing.assert_allclose(s, x.astype(np.float64) + r, rtol=1e-6, atol=1e-6)


def test_layernorm_rejects_bad_shapes(kernels, rng):
    x = rng.standard_normal((6, 10)).astype(np.float32)
    with pytest.raises(ValueError, match=r"expected \(10, 6\)"):
        kernels.layernorm(x, x, r_transposed=True)
    with pytest.raises(ValueError, match="float32"):
        kernels.layernorm(x.astype(np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.layernorm(np.asfortranarray(x))


def test_gelu_pad_split_merge(kernels, rng):
    u = (rng.standard_normal((17, 29)) * 3).astype(np.float32)
    want = 0.5 * u.astype(np.float64) * (1 + np.tanh(0.7978845608 * (u + 0.044715 * u.astype(
        np.float64) ** 3)))
    assert kernels.gelu_(u) is u
    np.testing.assert_allclose(u, want, atol=1e-6, rtol=1e-5)

    x32 = rng.standard_normal((9, 31)).astype(np.float32)
    padded = kernels.pad_cast(x32, 14)
    assert padded.shape == (14, 31)
    np.testing.assert_array_equal(padded[:9], x32)
    assert not padded[9:].any()
    with pytest.raises(ValueError, match="padded length 8 < 9"):
        kernels.pad_cast(x32, 8)

    p, heads, dh = 13, 3, 5
    qkv = rng.standard_normal((p, 3 * heads * dh)).astype(np.float32)
    buf = kernels.split_heads(qkv, heads)
    np.testing.assert_array_equal(buf, qkv.reshape(p, 3, heads, dh).transpose(1, 2, 0, 3))
    merged = kernels.merge_heads(buf[1:2])
    np.testing.assert_array_equal(merged, buf[1].transpose(1, 0, 2).reshape(p, heads * dh))
    with pytest.raises(ValueError, match="do not split"):
        kernels.split_heads(qkv[:, :-1].copy(), heads)


def test_summarise(kernels, rng):
    x = rng.standard_normal((11, 23)).astype(np.float32)
    probs = rng.random((11, 3001)).astype(np.float32)
    for length in (1, 7, 11):
        norm, token, prob = kernels.summarise(x, probs, length)
        assert norm == pytest.approx(float(np.linalg.norm(x[:length].astype(np.float64))),
                                     rel=1e-5)
        assert token == int(probs[length - 1].argmax()) and prob == probs[length - 1, token]
    big = rng.standard_normal((40, 900)).astype(np.float32)   # 2 blocks share the norm
    big_probs = rng.random((40, 77)).astype(np.float32)
    norm, token, _ = kernels.summarise(big, big_probs, 33)
    assert norm == pytest.approx(float(np.linalg.norm(big[:33].astype(np.float64))), rel=1e-5)
    assert token == int(big_probs[32].argmax())
    probs[4, :] = 0.5                                  # ties: the first index wins
    assert kernels.summarise(x, probs, 5)[1:] == (0, 0.5)
    probs[4, :] = np.nan
    with pytest.raises(FloatingPointError, match="NaN"):
        kernels.summarise(x, probs, 5)
    with pytest.raises(ValueError, match="outside"):
        kernels.summarise(x, probs, 0)


@pytest.mark.parametrize("seq_len", [1, 19, 40])
def test_block_cuda_path_matches_float64_reference(kernels, rng, seq_len):
    """AdaptiveBlock's fused forward pass (as on CUDA), ops on the host backend."""
    shape = BlockShape(d_model=40, heads=4, d_ff=72, vocab=53, layers=2, max_seq=64, pad_to=7)
    block = AdaptiveBlock(shape, device="host", fused=kernels)
    x = input_activations(shape, block.host_weights, seq_len=seq_len,
                          seed=int(rng.integers(2**31)))
    norm, token, prob = block(x)
    ref_norm, probs = reference(shape, block.host_weights, x)
    assert norm == pytest.approx(ref_norm, rel=1e-4)
    assert prob == pytest.approx(probs[token], rel=1e-3)
    assert probs[token] >= probs.max() * (1 - 1e-3)
    assert math.isfinite(norm)
