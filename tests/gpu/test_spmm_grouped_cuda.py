"""spmm's bsr32_grouped_mma, bsr32_grouped4_mma and bsr32_grouped_splitk_mma (block rows in
groups sharing each b slab; the last with each group's entries split over CTAs), every
config, against float64 references on fresh random inputs with NaN-poisoned outputs: empty
block rows, a group whose rows share no column block, M, K and N off the tiles (the last
group partial, N = 45 through the scalar path), an all-zero weight, two calls in a row."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.limits import SM90
from adaptive.ops import get_op
from adaptive.variants import builtin_folder, load_manifest

pytestmark = pytest.mark.gpu

GROUPED = [(v.name, c) for v in load_manifest(builtin_folder() / "spmm" / "manifest.toml")
           if v.name.startswith("bsr32_grouped") for c in v.space.configs(SM90)]


def _label(name: str, config: dict) -> str:
    return name + "[" + ",".join(f"{k}={v}" for k, v in config.items()) + "]"


@pytest.fixture(scope="module")
def dispatcher():
    from adaptive.dispatch import Dispatcher
    return Dispatcher(backend="cuda")


def _weight(cp, rng, mask, m, k):
    from adaptive.ops.sparse import SparseWeight
    full = np.kron(mask, np.ones((32, 32), bool))[:m, :k]
    values = rng.standard_normal((m, k)).astype(np.float16)
    values[values == 0] = 1
    return SparseWeight(cp.asarray(np.where(full, values, 0).astype(np.float16)),
                        dtype="float16")


def _check(dispatcher, cp, name, config, w, b_host):
    """Two calls with different b: the split-K kernels must leave their workspace reusable."""
    op = get_op("spmm")
    for b_call in (b_host, (-0.5 * b_host).astype(b_host.dtype)):
        ref = op.reference(w, b_call)
        out = cp.full(ref.shape, np.nan, np.float16)
        dispatcher.launch("spmm", w, cp.asarray(b_call), out=out, variant=name, config=config)
        cp.cuda.Device().synchronize()
        assert not bool(cp.isnan(out).any()), f"{_label(name, config)}: elements left unwritten"
        err = op.error(out, ref)
        assert err < op.tolerance["float16"], f"{_label(name, config)}: rel. error {err:.3g}"


@pytest.mark.parametrize("n", [136, 45])
@pytest.mark.parametrize("name,config", GROUPED, ids=[_label(n, c) for n, c in GROUPED])
def test_grouped_every_config_odd_shape(dispatcher, cp, rng, name, config, n):
    m, k = 301, 330                      # 10 block rows (the last partial), 11 block columns
    mask = rng.random((10, 11)) < 0.3
    mask[[1, 4]] = False                 # empty block rows
    mask[7] = True                       # a full one
    mask[8:10] = False                   # the last group (rows 8, 9) shares no column ...
    mask[8, 2] = mask[9, 6] = True       # ... though both rows have a block
    w = _weight(cp, rng, mask, m, k)
    b = (rng.standard_normal((k, n)) / np.sqrt(0.3 * k)).astype(np.float16)
    _check(dispatcher, cp, name, config, w, b)


@pytest.mark.parametrize("name,config", GROUPED, ids=[_label(n, c) for n, c in GROUPED])
def test_grouped_wide_denser(dispatcher, cp, rng, name, config):
    """More entries than stages and several column tiles, at 25% block density."""
    m, k, n = 1000, 1000, 264
    mask = rng.random((32, 32)) < 0.25
    mask[5] = False
    w = _weight(cp, rng, mask, m, k)
    b = (rng.standard_normal((k, n)) / np.sqrt(0.25 * k)).astype(np.float16)
    _check(dispatcher, cp, name, config, w, b)


@pytest.mark.parametrize("name", sorted({n for n, _ in GROUPED}))
def test_grouped_all_zero_weight_writes_zeros(dispatcher, cp, rng, name):
    from adaptive.ops.sparse import SparseWeight
    config = next(c for v, c in GROUPED if v == name)
    w = SparseWeight(cp.zeros((70, 90), np.float16), dtype="float16")
    b = cp.asarray(rng.standard_normal((90, 40)).astype(np.float16))
    out = cp.full((70, 40), np.nan, np.float16)
    dispatcher.launch("spmm", w, b, out=out, variant=name, config=config)
    cp.cuda.Device().synchronize()
    assert bool((out == 0).all())


def test_grouped_form_is_cached_and_matches_host(cp, rng):
    from adaptive.backends.cuda_sparse import bsr_row_groups, device_bsr, device_bsr_groups
    mask = rng.random((10, 11)) < 0.3
    w = _weight(cp, rng, mask, 301, 330)
    for group in (4, 8):
        form = device_bsr_groups(w, group)
        assert form is device_bsr_groups(w, group)
        indptr, indices, _ = device_bsr(w, 32)
        want = bsr_row_groups(cp.asnumpy(indptr), cp.asnumpy(indices), group)
        for got, expected in zip(form, want):
            assert got.dtype == np.int32
            np.testing.assert_array_equal(cp.asnumpy(got), expected)
