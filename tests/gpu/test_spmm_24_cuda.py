"""2:4 sparse weights on the GPU: sparse24_mma and sparse24_stream (our sparse tensor-core
kernels over the compressed weight) and cusparselt_24 (cuSPARSELt through torch) against
float64 references on fresh random inputs.

Every config of sparse24_mma and of sparse24_stream runs on odd shapes (M and K off the
tiles, K not a multiple of 64 or of 4, N = 1, 3, 17, 64 as fits the config); outputs are
poisoned with NaN before each run, so an unwritten element fails the error check.
Large-magnitude inputs (|out| ~ 1e4, near float16's range) and an empty row check the fp32
accumulation; CuPy and PyTorch inputs both run; the dispatcher, left to choose, picks a 2:4
variant's correct result. sparse24_stream runs each input twice (its stream-K workspace must
be left zeroed by every launch), on a weight whose CTAs take one unit each and on one whose
CTAs take several.
"""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.limits import SM90
from adaptive.ops import get_op
from adaptive.ops.spmm import prune_24
from adaptive.variants import builtin_folder, load_manifest

pytestmark = pytest.mark.gpu

OP = get_op("spmm")
_VARIANTS = load_manifest(builtin_folder() / "spmm" / "manifest.toml")
MMA = [c for v in _VARIANTS if v.name == "sparse24_mma" for c in v.space.configs(SM90)]
STREAM = [c for v in _VARIANTS if v.name == "sparse24_stream" for c in v.space.configs(SM90)]
CONFIGS = {"sparse24_mma": MMA, "sparse24_stream": STREAM}


def _label(config: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in config.items())


@pytest.fixture(scope="module")
def dispatcher():
    from adaptive.dispatch import Dispatcher
    return Dispatcher(backend="cuda")


def _weight(cp, rng, m, k, scale=1.0):
    from adaptive.ops.sparse import SparseWeight
    dense = prune_24((rng.standard_normal((m, k)) * scale).astype(np.float16))
    dense[min(5, m - 1)] = 0                         # an empty row
    w = SparseWeight(cp.asarray(dense), dtype="float16")
    assert w.is_2to4
    return w, dense


def _check(dispatcher, cp, name, config, w, dense, b, what=""):
    ref = dense.astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    for run in range(2 if name == "sparse24_stream" else 1):   # its workspace is reused
        out = cp.full(ref.shape, np.nan, np.float16)
        dispatcher.launch("spmm", w, b, out=out, variant=name, config=config or None)
        cp.cuda.Device().synchronize()
        err = OP.error(out, ref)
        assert err < OP.tolerance["float16"], \
            f"{name} {config} {what} (run {run + 1}): rel. error {err:.3g}"


def _fits(dispatcher, name, config, w, b) -> bool:
    v = dispatcher.registry.get("spmm", name)
    return v.fits(OP.problem((w, b), {}).scope(), config)


SINGLE = [("sparse24_mma", {"DIRECT": 0}, 8), ("sparse24_mma", {"DIRECT": 1}, 8),
          ("sparse24_stream", {}, 8), ("sparse24_stream", {}, 1)]


@pytest.mark.parametrize("name,pick,n", SINGLE,
                         ids=[f"{n}-{_label(p) or 'any'}-N{c}" for n, p, c in SINGLE])
def test_sparse24_single_entries_land_where_they_belong(dispatcher, cp, name, pick, n):
    """One non-zero w[r, c] = 1 at a time in a 16 x 64 weight, b[k, j] = k + 64 j: out must
    be b's row c in row r and 0 elsewhere. A fragment or metadata layout error shows as
    the row and the b row that arrived instead (decoded from the values). For
    sparse24_stream N = 8 reads b's slab row-major (ldmatrix.trans), N = 1 transposed."""
    from adaptive.ops.sparse import SparseWeight
    b_host = (np.arange(64)[:, None] + 64 * np.arange(n)[None, :]).astype(np.float16)
    b = cp.asarray(b_host)
    config = next(c for c in CONFIGS[name]
                  if c["NT"] == 1 and all(c[k] == v for k, v in pick.items()))
    wrong = []
    for r, c in [(0, 0), (0, 1), (0, 3), (1, 2), (7, 5), (8, 0), (9, 14), (15, 31), (3, 16),
                 (12, 33), (5, 47), (10, 62), (15, 63)]:
        dense = np.zeros((16, 64), np.float16)
        dense[r, c] = 1
        w = SparseWeight(cp.asarray(dense), dtype="float16")
        out = cp.full((16, n), np.nan, np.float16)
        dispatcher.launch("spmm", w, b, out=out, variant=name, config=config)
        got = cp.asnumpy(out).astype(np.float64)
        want = np.zeros((16, n))
        want[r] = b_host[c]
        if not np.array_equal(got, want):
            rows = sorted({int(i) for i in np.argwhere(got != 0)[:, 0]})
            wrong.append(f"w[{r},{c}]: non-zero out rows {rows}, row {r} holds b rows "
                         f"{sorted({int(v) % 64 for v in got[r] if v == v})}")
    assert not wrong, "; ".join(wrong)


@pytest.mark.parametrize("config", STREAM, ids=[_label(c) for c in STREAM])
def test_sparse24_stream_every_config(dispatcher, cp, rng, config):
    """N = 1 and 8, 16, 64 take the cp.async slab forms, 3, 9, 17, 40 the plain-load ones;
    77 x 651 is 5 row tiles and 21 chunks: on the GPU-wide grid every CTA has one unit (each
    row block is split, summed in the workspace), 1000 x 1500 gives CTAs several units."""
    ran = 0
    for m, k in ((77, 651), (1000, 1500)):
        w, dense = _weight(cp, rng, m, k)
        for n in (1, 3, 8, 9, 16, 17, 40, 64):
            b = cp.asarray((rng.standard_normal((k, n)) / np.sqrt(k / 2)).astype(np.float16))
            if _fits(dispatcher, "sparse24_stream", config, w, b):
                _check(dispatcher, cp, "sparse24_stream", config, w, dense, b,
                       f"{m}x{k} N={n}")
                ran += 1
    assert ran, f"{_label(config)}: no N of the test fits it"


@pytest.mark.parametrize("config", MMA, ids=[_label(c) for c in MMA])
def test_sparse24_mma_every_config(dispatcher, cp, rng, config):
    w, dense = _weight(cp, rng, 77, 651)             # 5 row tiles, 21 chunks, a 3-column group
    ran = 0
    for n in (1, 3, 17, 64, 40, 9):
        b = cp.asarray((rng.standard_normal((651, n)) / np.sqrt(325)).astype(np.float16))
        if _fits(dispatcher, "sparse24_mma", config, w, b):
            _check(dispatcher, cp, "sparse24_mma", config, w, dense, b, f"N={n}")
            ran += 1
    assert ran, f"{_label(config)}: no N of the test fits it"


SHAPES = [  # M, K, N
    (4096, 4096, 1),
    (1000, 1500, 3),        # K % 64 != 0, M % 16 != 0
    (333, 2050, 17),        # K % 32 == 2
    (256, 14336, 64),       # a down-projection's K
    (512, 14336, 1),        # ... at decode
    (130, 96, 64),
    (4096, 14336, 16),      # the MLP's down projection
    (4096, 4096, 64),       # every row block split over CTAs (sparse24_stream)
]


@pytest.mark.parametrize("name", ["sparse24_mma", "sparse24_stream"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_sparse24_shapes(dispatcher, cp, rng, shape, name):
    m, k, n = shape
    w, dense = _weight(cp, rng, m, k)
    b = cp.asarray((rng.standard_normal((k, n)) / np.sqrt(k / 2)).astype(np.float16))
    fitting = [c for c in CONFIGS[name] if _fits(dispatcher, name, c, w, b)]
    assert fitting
    picks = {_label(c): c for c in (fitting[0], fitting[len(fitting) // 2], fitting[-1])}
    for config in picks.values():
        _check(dispatcher, cp, name, config, w, dense, b, f"shape {shape}")


@pytest.mark.parametrize("name", ["sparse24_mma", "sparse24_stream", "cusparselt_24"])
def test_large_magnitudes(dispatcher, cp, rng, name):
    """|out| in the thousands to ~3e4: fp32 sums, a float16 result near its range."""
    w, dense = _weight(cp, rng, 256, 512, scale=30.0)
    b = cp.asarray((rng.standard_normal((512, 8)) * 150.0 / np.sqrt(256)).astype(np.float16))
    ref = dense.astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    assert 3e3 < np.abs(ref).max() < 6e4, np.abs(ref).max()
    config = next((c for c in CONFIGS.get(name, []) if _fits(dispatcher, name, c, w, b)), None)
    _check(dispatcher, cp, name, config, w, dense, b, "large magnitudes")


@pytest.mark.parametrize("n", [1, 3, 17, 64, 256])
def test_cusparselt_24(dispatcher, cp, rng, n):
    pytest.importorskip("torch")
    w, dense = _weight(cp, rng, 96, 160)
    b = cp.asarray((rng.standard_normal((160, n)) / np.sqrt(80)).astype(np.float16))
    _check(dispatcher, cp, "cusparselt_24", None, w, dense, b, f"N={n}")
    assert w.cached("cuda0_cslt", lambda: None) is not None, "the compressed weight is cached"


def test_cusparselt_24_requires_its_shapes(dispatcher, cp, rng):
    w, _ = _weight(cp, rng, 100, 160)                # M % 16 != 0
    b = cp.ones((160, 4), np.float16)
    assert not _fits(dispatcher, "cusparselt_24", {}, w, b)


@pytest.mark.parametrize("name", ["sparse24_mma", "sparse24_stream", "cusparselt_24",
                                  "cublas_dense"])
def test_torch_tensors_in_and_out(dispatcher, cp, rng, name):
    """Tensors in, tensors out, on torch's current stream (a side stream here); the dense
    baseline through its torch entry (torch.matmul on a dense form built on that stream)."""
    torch = pytest.importorskip("torch")
    w, dense = _weight(cp, rng, 128, 256)
    b_host = (rng.standard_normal((256, 16)) / np.sqrt(128)).astype(np.float16)
    tb = torch.from_numpy(b_host).cuda()
    config = next((c for c in CONFIGS.get(name, []) if _fits(dispatcher, name, c, w, tb)), None)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):                 # a side stream: the work must go there
        out = dispatcher.launch("spmm", w, tb, variant=name, config=config)
    stream.synchronize()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    ref = dense.astype(np.float64) @ b_host.astype(np.float64)
    assert OP.error(out.cpu().numpy(), ref) < OP.tolerance["float16"]


def test_not_2to4_weights_get_no_2to4_variant(dispatcher, cp, rng):
    from adaptive.ops.sparse import SparseWeight
    dense = rng.standard_normal((64, 64)).astype(np.float16)
    w = SparseWeight(cp.asarray(dense), dtype="float16")
    b = cp.ones((64, 4), np.float16)
    assert not w.is_2to4
    for name in ("sparse24_mma", "sparse24_stream", "cusparselt_24"):
        config = CONFIGS[name][0] if name in CONFIGS else None
        assert not _fits(dispatcher, name, config or {}, w, b)
        with pytest.raises(Exception, match="is_2to4"):
            dispatcher.launch("spmm", w, b, variant=name, config=config)


def test_the_dispatcher_left_to_choose_is_correct(dispatcher, cp, rng):
    w, dense = _weight(cp, rng, 512, 1024)
    for n in (1, 64, 300):
        b = cp.asarray((rng.standard_normal((1024, n)) / np.sqrt(512)).astype(np.float16))
        ref = dense.astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
        for _ in range(30):                          # explore, then commit
            out = dispatcher.launch("spmm", w, b)
        cp.cuda.Device().synchronize()
        assert OP.error(out, ref) < OP.tolerance["float16"], f"N={n}"
