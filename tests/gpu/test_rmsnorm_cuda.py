"""rmsnorm on the GPU: every ``rms_rows`` config in every dtype against the float64
reference on odd and model shapes, the output NaN-poisoned before each of two runs that
must give the same bits; the value regimes (outliers at half the fp16 range, tiny rows,
constant rows) on one config of each row width; the baseline on torch tensors against
transformers' LlamaRMSNorm bit for bit; and a patched norm serving CUDA tensors."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.limits import SM90
from adaptive.ops import get_op
from adaptive.ops.base import DTYPE_BYTES
from adaptive.regen.shapes import make_inputs
from test_gemm_softmax_cuda import _to_device as _device   # (array, the float64 it holds)

pytestmark = pytest.mark.gpu

OP = get_op("rmsnorm")
SHAPES = [{"R": 5, "C": 2049}, {"R": 64, "C": 2048}, {"R": 1, "C": 8192}, {"R": 300, "C": 24}]
EPS = 1e-5


def _variant():
    from adaptive.variants import shared_registry
    return shared_registry().get("rmsnorm", "rms_rows")


def _configs():
    return _variant().space.configs(SM90)


def _cases():
    out = []
    for config in _configs():
        for dtype in OP.dtypes:
            for dims in SHAPES:
                scope = {**dims, "dtype": dtype, "itemsize": DTYPE_BYTES[dtype]}
                if _variant().fits(scope, config):
                    label = ",".join(f"{k}={x}" for k, x in config.items())
                    out.append(pytest.param(config, dtype, dims,
                                            id=f"[{label}]-{dtype}-{dims['R']}x{dims['C']}"))
    return out


@pytest.fixture(scope="module")
def dispatcher():
    from adaptive import Dispatcher
    return Dispatcher("cuda")


def _run(dispatcher, x, w, config):
    """Two runs into NaN-poisoned outputs: the host copies of both."""
    outs = []
    for _ in range(2):
        if type(x).__module__.startswith("torch"):
            import torch
            out = torch.full(tuple(x.shape), float("nan"), dtype=x.dtype, device=x.device)
        else:
            import cupy as cp
            out = cp.full(x.shape, np.nan, x.dtype)
        got = dispatcher.launch("rmsnorm", x, w, out=out, variant="rms_rows", config=config,
                                eps=EPS)
        assert got is out
        outs.append(got.float().cpu().numpy() if hasattr(got, "cpu") else got.get())
    return outs


@pytest.mark.parametrize("config, dtype, dims", _cases())
def test_every_config_matches_the_reference(dispatcher, rng, config, dtype, dims):
    x, w = OP.make_inputs(dims, "float32" if dtype == "bfloat16" else dtype, rng)
    (dx, ex), (dw, ew) = _device(x, dtype), _device(w, dtype)
    first, second = _run(dispatcher, dx, dw, config)
    assert np.isfinite(first).all(), f"{np.isnan(first).sum()} elements unwritten or NaN"
    ref = OP.reference(ex, ew, eps=EPS)
    err = OP.error(first, ref, OP.error_floor(dtype))
    assert err <= OP.tolerance_for(dtype, dims), f"relative error {err:.2e}"
    np.testing.assert_array_equal(first, second, err_msg="second run differs (a race?)")


@pytest.mark.parametrize("regime", ["outliers", "tiny", "constant", "shifted"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_value_regimes_on_each_row_width(dispatcher, regime, dtype):
    dims = {"R": 9, "C": 4097}
    x, w = make_inputs(OP, dims, dtype, 5, regime)
    import cupy as cp
    ref = OP.reference(x, w, eps=EPS)
    for g in sorted({c["G"] for c in _configs()}):
        config = next(c for c in _configs() if c["G"] == g)
        first, _ = _run(dispatcher, cp.asarray(x), cp.asarray(w), config)
        err = OP.error(first, ref, OP.error_floor(dtype))
        assert err <= OP.tolerance_for(dtype, dims), (config, regime, err)


def test_baseline_and_patched_norm_on_cuda_tensors(rng):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from adaptive.integrations.norm import AdaptiveRMSNorm
    from adaptive.variants import shared_registry
    ns: dict = {}
    exec(compile(shared_registry().get("rmsnorm", "rmsnorm_torch").source, "library.py",
                 "exec"), ns)  # noqa: S102
    plain = LlamaRMSNorm(2048, eps=EPS).cuda().half()
    with torch.no_grad():
        plain.weight.normal_()
    x = torch.randn(4, 7, 2048, device="cuda", dtype=torch.float16) * 3
    with torch.no_grad():
        want = plain(x)
        assert torch.equal(ns["rmsnorm_torch"](x, plain.weight, eps=EPS), want)
        norm = AdaptiveRMSNorm(LlamaRMSNorm(2048, eps=EPS).cuda().half(), "norm").eval()
        norm.load_state_dict(plain.state_dict())
        for _ in range(12):   # past the exploring calls
            got = norm(x)
    assert got.dtype == torch.float16 and got.device == x.device
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
