"""spmm and attention cuda variants against float64 references, on fresh random inputs.

Every config of every cuda variant runs on one odd shape; the other cases (odd N, other
densities, Lq != Lk, decode, causal or not, bf16 through PyTorch tensors, fp32) run the
first config of each variant that fits. Outputs are poisoned with NaN before each run,
so an unwritten element fails the error check.
"""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.limits import SM90
from adaptive.ops import get_op
from adaptive.variants import load_manifest, builtin_folder

pytestmark = pytest.mark.gpu


def _cuda_candidates(op: str) -> list[tuple[str, dict]]:
    out = []
    for v in load_manifest(builtin_folder() / op / "manifest.toml"):
        if v.backend == "cuda":
            out += [(v.name, c) for c in v.space.configs(SM90)]
    return out


def _label(name: str, config: dict) -> str:
    return name + ("[" + ",".join(f"{k}={v}" for k, v in config.items()) + "]" if config else "")


SPMM = _cuda_candidates("spmm")
ATTN = _cuda_candidates("attention")
SPMM_VARIANTS = sorted({n for n, _ in SPMM})
ATTN_VARIANTS = sorted({n for n, _ in ATTN})


@pytest.fixture(scope="module")
def dispatcher():
    from adaptive.dispatch import Dispatcher
    return Dispatcher(backend="cuda")


def _fits(dispatcher, op, name, config, args, params) -> bool:
    v = dispatcher.registry.get(op, name)
    problem = get_op(op).problem(args, params)
    return v.fits(problem.scope(), config) and v.space.admits(config, dispatcher.limits)


# ---- spmm -------------------------------------------------------------------------------------

def _spmm_inputs(cp, rng, dtype, m, n, k, density, block):
    from adaptive.ops.sparse import SparseWeight
    op = get_op("spmm")
    w_host, b = op.make_inputs({"M": m, "N": n, "K": k}, dtype, rng, density=density, block=block)
    dense = w_host.csr().toarray().astype(dtype)
    w = SparseWeight(cp.asarray(dense), dtype=dtype)
    return w, cp.asarray(b), op.reference(w, b)


def _run_spmm(dispatcher, cp, name, config, w, b, ref, dtype):
    op = get_op("spmm")
    out = cp.full(ref.shape, np.nan, dtype)
    dispatcher.launch("spmm", w, b, out=out, variant=name, config=config or None)
    cp.cuda.Device().synchronize()
    err = op.error(out, ref)
    assert err < op.tolerance[dtype], f"{_label(name, config)} {dtype}: rel. error {err:.3g}"


@pytest.mark.parametrize("name,config", SPMM, ids=[_label(n, c) for n, c in SPMM])
def test_spmm_every_config(dispatcher, cp, rng, name, config):
    dtype = "float16" if "mma" in name else ("float32" if rng.random() < 0.5 else "float16")
    w, b, ref = _spmm_inputs(cp, rng, dtype, 77, 40, 93, 0.15, 16)
    if not _fits(dispatcher, "spmm", name, config, (w, b), {}):
        pytest.skip(f"{_label(name, config)} does not fit N=40 {dtype}")
    _run_spmm(dispatcher, cp, name, config, w, b, ref, dtype)


SPMM_CASES = [  # dtype, M, N, K, density, block
    ("float16", 131, 17, 75, 0.1, 0),
    ("float32", 131, 17, 75, 0.1, 0),
    ("float16", 200, 64, 257, 0.3, 32),
    ("float32", 65, 33, 129, 0.05, 64),
    ("float16", 64, 256, 512, 0.01, 0),
    ("float16", 33, 1, 47, 0.5, 0),
    ("float16", 40, 24, 4500, 1.0, 32),   # 141 blocks a row: > 32 per warp (index refill)
    ("float16", 1000, 136, 1000, 0.1, 32),  # 32 block rows of 0..~9 blocks, some empty
]


@pytest.mark.parametrize("name", SPMM_VARIANTS)
@pytest.mark.parametrize("case", SPMM_CASES, ids=lambda c: "x".join(map(str, c)))
def test_spmm_shapes(dispatcher, cp, rng, name, case):
    dtype, m, n, k, density, block = case
    w, b, ref = _spmm_inputs(cp, rng, dtype, m, n, k, density, block)
    fitting = [c for v, c in SPMM if v == name and _fits(dispatcher, "spmm", v, c, (w, b), {})]
    if not fitting:
        pytest.skip(f"{name} does not fit {case}")
    _run_spmm(dispatcher, cp, name, fitting[0], w, b, ref, dtype)
    _run_spmm(dispatcher, cp, name, fitting[-1], w, b, ref, dtype)


DEEP = [(n, c) for n, c in SPMM if n in ("bsr32_deep_mma", "bsr32_rows_mma")]


@pytest.mark.parametrize("n", [136, 45])
@pytest.mark.parametrize("name,config", DEEP, ids=[_label(n, c) for n, c in DEEP])
def test_spmm_bsr32_uneven_rows_every_config(dispatcher, cp, rng, name, config, n):
    """Block rows of very different lengths (two empty, one full), M, K and N off the tiles:
    the rows kernel pairs them heavy with light and streams them through one pipeline."""
    from adaptive.ops.sparse import SparseWeight
    m, k = 301, 330                      # 10 block rows (the last partial), 11 block columns
    mask = rng.random((10, 11)) < 0.3
    mask[[1, 4]] = False
    mask[7] = True
    full = np.kron(mask, np.ones((32, 32), bool))[:m, :k]
    values = rng.standard_normal((m, k)).astype(np.float16)
    values[values == 0] = 1
    w = SparseWeight(cp.asarray(np.where(full, values, 0).astype(np.float16)), dtype="float16")
    b = (rng.standard_normal((k, n)) / np.sqrt(0.3 * k)).astype(np.float16)
    ref = get_op("spmm").reference(w, b)
    _run_spmm(dispatcher, cp, name, config, w, cp.asarray(b), ref, "float16")


def test_spmm_bsr32_row_order_is_cached_and_sorted(dispatcher, cp, rng):
    from adaptive.backends.cuda_sparse import device_bsr, device_bsr_order
    w, b, ref = _spmm_inputs(cp, rng, "float16", 300, 32, 400, 0.3, 32)
    order = device_bsr_order(w, 32)
    assert order is device_bsr_order(w, 32)
    counts = np.diff(cp.asnumpy(device_bsr(w, 32)[0]))[cp.asnumpy(order)]
    assert sorted(cp.asnumpy(order).tolist()) == list(range(10))
    assert np.all(np.diff(counts) <= 0), counts


def test_spmm_device_formats_are_cached(dispatcher, cp, rng):
    from adaptive.backends.cuda_sparse import device_bsr, device_csr
    w, b, ref = _spmm_inputs(cp, rng, "float16", 96, 32, 64, 0.2, 32)
    _run_spmm(dispatcher, cp, "csr_rowsplit", {"VEC": 4, "LANES_N": 8, "WARPS": 4}, w, b, ref,
              "float16")
    assert device_csr(w)[0] is device_csr(w)[0]
    indptr, indices, values = device_bsr(w, 32)
    assert values.shape[1:] == (32, 32) and values.dtype == np.float16
    assert int(indptr[-1]) == values.shape[0] == indices.size


# ---- attention --------------------------------------------------------------------------------

def _attn_inputs(cp, rng, dtype, b, h, lq, lk, d):
    op = get_op("attention")
    q, k, v = op.make_inputs({"B": b, "H": h, "Lq": lq, "Lk": lk, "D": d}, "float32", rng)
    if dtype == "bfloat16":
        import torch
        dev = [torch.from_numpy(x).cuda().to(torch.bfloat16) for x in (q, k, v)]
        host = [t.float().cpu().numpy() for t in dev]
    else:
        dev = [cp.asarray(x.astype(dtype)) for x in (q, k, v)]
        host = [x.astype(dtype) for x in (q, k, v)]
    return dev, host


def _run_attn(dispatcher, cp, name, config, dtype, dev, host, causal, scale=None):
    op = get_op("attention")
    ref = op.reference(*host, causal=causal, scale=scale)
    if dtype == "bfloat16":
        import torch
        out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
        dispatcher.launch("attention", *dev, out=out, variant=name, config=config or None,
                          causal=causal, scale=scale)
        torch.cuda.synchronize()
        got = out.float().cpu().numpy()
    else:
        out = cp.full(ref.shape, np.nan, dtype)
        dispatcher.launch("attention", *dev, out=out, variant=name, config=config or None,
                          causal=causal, scale=scale)
        cp.cuda.Device().synchronize()
        got = out
    err = op.error(got, ref)
    assert err < op.tolerance[dtype], (f"{_label(name, config)} {dtype} causal={causal}: "
                                       f"rel. error {err:.3g}")


@pytest.mark.parametrize("name,config", ATTN, ids=[_label(n, c) for n, c in ATTN])
def test_attention_every_config(dispatcher, cp, rng, name, config):
    d = config.get("HD", 64)
    lq = 5 if name == "decode_global" else 67
    dev, host = _attn_inputs(cp, rng, "float16", 2, 3, lq, 67, d)
    for causal in (False, True):
        if _fits(dispatcher, "attention", name, config, dev, {"causal": causal}):
            _run_attn(dispatcher, cp, name, config, "float16", dev, host, causal)


ATTN_CASES = [  # dtype, B, H, Lq, Lk, D
    ("float16", 1, 2, 33, 129, 128),
    ("bfloat16", 2, 2, 77, 77, 64),
    ("bfloat16", 1, 3, 1, 301, 128),
    ("float16", 3, 1, 1, 1, 64),
    ("float16", 2, 2, 7, 250, 128),
    ("float32", 2, 2, 31, 45, 64),
    ("float16", 1, 1, 300, 300, 128),
]


@pytest.mark.parametrize("name", ATTN_VARIANTS)
@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_shapes(dispatcher, cp, rng, name, case, causal):
    dtype, b, h, lq, lk, d = case
    dev, host = _attn_inputs(cp, rng, dtype, b, h, lq, lk, d)
    fitting = [c for v, c in ATTN
               if v == name and _fits(dispatcher, "attention", v, c, dev, {"causal": causal})]
    if not fitting:
        pytest.skip(f"{name} does not fit {case} causal={causal}")
    _run_attn(dispatcher, cp, name, fitting[0], dtype, dev, host, causal)


@pytest.mark.parametrize("name", ATTN_VARIANTS)
@pytest.mark.parametrize("scale", [-0.2, 0.0, 0.3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_explicit_scale(dispatcher, cp, rng, name, scale, causal):
    """A given scale (negative and zero included) is honoured, not replaced by 1/sqrt(D)."""
    dev, host = _attn_inputs(cp, rng, "float16", 1, 2, 45, 70, 128)
    fitting = [c for v, c in ATTN
               if v == name and _fits(dispatcher, "attention", v, c, dev,
                                      {"causal": causal, "scale": scale})]
    if not fitting:
        pytest.skip(f"{name} does not fit 45x70 causal={causal}")
    _run_attn(dispatcher, cp, name, fitting[0], "float16", dev, host, causal, scale=scale)


def test_attention_rejects_misfits(dispatcher, cp, rng):
    from adaptive.errors import InputValueError
    dev, _ = _attn_inputs(cp, rng, "float16", 1, 1, 9, 17, 64)
    with pytest.raises(InputValueError, match="HD == D"):
        dispatcher.launch("attention", *dev, variant="flash_mma",
                          config={"HD": 128, "BC": 64, "NWARPS": 4})
    # SDPA takes causal 1 < Lq < Lk through our bottom-right triangle as a mask
    out = dispatcher.launch("attention", *dev, variant="sdpa_torch", causal=True)
    ref = get_op("attention").reference(*(x.get() for x in dev), causal=True)
    assert np.abs(out.get().astype(np.float64) - ref).max() < 1e-2


def test_torch_library_variants_from_cupy_run_on_cupys_stream(dispatcher, cp, rng):
    """SDPA and cuSPARSELt called with CuPy arrays on a non-blocking CuPy stream: torch's
    work goes to that stream, so a copy of ``out`` queued right after on it reads the
    result (issued to torch's own stream instead, the copy would read the NaN poison)."""
    pytest.importorskip("torch")
    import torch
    # sizes whose float64 references take seconds on the host (B=4 H=16 and N=2048 took
    # more than 40 s there, run S60), with kernels still long enough that an unordered
    # copy would read the poison
    dev, host = _attn_inputs(cp, rng, "float16", 2, 8, 2048, 2048, 128)
    attn = get_op("attention")
    from adaptive.ops.sparse import SparseWeight
    spmm = get_op("spmm")
    w_host, b_host = spmm.make_inputs({"M": 4096, "N": 256, "K": 4096}, "float16", rng,
                                      density=0.5, is_2to4=1.0)
    spmm_ref = spmm.reference(w_host, b_host)
    w = SparseWeight(cp.asarray(w_host.csr().toarray().astype("float16")), dtype="float16")
    b = cp.asarray(b_host)
    cases = [("attention", "sdpa_torch", dev, attn.reference(*host, causal=True),
              {"causal": True})]
    if torch.backends.cusparselt.is_available() and dispatcher.registry.get(
            "spmm", "cusparselt_24").fits(get_op("spmm").problem((w, b), {}).scope(), {}):
        cases.append(("spmm", "cusparselt_24", (w, b), spmm_ref, {}))
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    for op, name, args, ref, params in cases:
        with stream:
            out = cp.full(ref.shape, np.nan, "float16")
            for _ in range(3):   # a few calls in a row: the last one's copy races if unordered
                dispatcher.launch(op, *args, out=out, variant=name, **params)
            seen = out.copy()
        stream.synchronize()
        err = get_op(op).error(seen, ref)
        assert err < get_op(op).tolerance["float16"], f"{name} on a CuPy stream: {err:.3g}"
