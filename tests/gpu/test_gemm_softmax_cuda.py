"""Every CUDA gemm and softmax variant × a sample of its configs × dtypes, against the
float64 reference on fresh random inputs, with the output poisoned (NaN) before each run,
regular and odd shapes, and a second run that must give the same bits (races)."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.limits import SM90
from adaptive.ops import get_op
from adaptive.ops.base import DTYPE_BYTES

pytestmark = pytest.mark.gpu

SHAPES = {
    "gemm": [{"M": 128, "N": 128, "K": 64}, {"M": 77, "N": 45, "K": 51},
             {"M": 200, "N": 136, "K": 72}, {"M": 3, "N": 300, "K": 4100},
             {"M": 64, "N": 128, "K": 4096}],
    "softmax": [{"R": 64, "C": 1024}, {"R": 33, "C": 77}, {"R": 5, "C": 3000},
                {"R": 1000, "C": 8},
                # rows over several 16-byte items per thread (reg_row): vector, then scalar
                {"R": 7, "C": 12000}, {"R": 3, "C": 12002}],
}


def _sample(configs: list[dict], n: int = 3) -> list[dict]:
    if len(configs) <= n:
        return configs
    idx = sorted({0, len(configs) // 2, len(configs) - 1})
    return [configs[i] for i in idx]


def _cases():
    from adaptive.variants import shared_registry
    reg = shared_registry()
    cases = []
    for op in ("gemm", "softmax"):
        for v in reg.variants(op, "cuda"):
            configs = v.space.configs(SM90) or [{}]
            picked = _sample(configs)
            if v.name == "tc_mma":   # one config over 48 KiB of dynamic shared memory
                big = [c for c in configs if c["STAGES"] == 4 and c["BM"] * c["BN"] >= 128 * 128]
                picked += big[:1]
            for config in picked:
                for dtype in get_op(op).dtypes:
                    for dims in SHAPES[op]:
                        scope = {**dims, "dtype": dtype, "itemsize": DTYPE_BYTES[dtype]}
                        if v.fits(scope, config):
                            label = ",".join(f"{k}={x}" for k, x in config.items())
                            shape = "x".join(map(str, dims.values()))
                            cases.append(pytest.param(op, v.name, config, dtype, dims,
                                                      id=f"{op}/{v.name}[{label}]-{dtype}-{shape}"))
    return cases


@pytest.fixture(scope="module")
def dispatcher():
    from adaptive import Dispatcher
    return Dispatcher("cuda")


def _to_device(x: np.ndarray, dtype: str):
    """(device array, the float64 values it really holds)."""
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        t = torch.from_numpy(x.astype(np.float32)).cuda().to(torch.bfloat16)
        return t, t.float().cpu().numpy().astype(np.float64)
    import cupy as cp
    return cp.asarray(x), x.astype(np.float64)


def _poisoned(like, shape):
    if type(like).__module__.startswith("torch"):
        import torch
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    import cupy as cp
    return cp.full(shape, np.nan, like.dtype)


def _host(x) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        return x.float().cpu().numpy()
    return x.get().astype(np.float32)


@pytest.mark.parametrize("op_name, variant, config, dtype, dims", _cases())
def test_variant_matches_reference(dispatcher, rng, op_name, variant, config, dtype, dims):
    op = get_op(op_name)
    inputs = op.make_inputs(dims, "float32" if dtype == "bfloat16" else dtype, rng)
    dev, exact = zip(*(_to_device(x, dtype) for x in inputs))
    ref = op.reference(*exact)
    out_shape = ref.shape
    results = []
    for _ in range(2):
        out = _poisoned(dev[0], out_shape)
        got = dispatcher.launch(op_name, *dev, out=out, variant=variant, config=config or None)
        assert got is out
        results.append(_host(got))
    first, second = results
    assert np.isfinite(first).all(), f"{np.isnan(first).sum()} elements unwritten or NaN"
    err = float(np.linalg.norm(first - ref) / np.linalg.norm(ref))
    assert err <= op.tolerance[dtype], f"relative error {err:.2e} > {op.tolerance[dtype]}"
    np.testing.assert_array_equal(first, second, err_msg="second run differs (a race?)")
