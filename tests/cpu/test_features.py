"""The one feature builder: device state and kernel resources with documented defaults,
and explain() ranking exactly as the policy's decide()."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaptive.policy.features import RESOURCE_DEFAULTS, DeviceState, kernel_resources, row


class _Variant:
    def __init__(self, resources=None):
        self.resources, self.name = resources or {}, "k"


class _Cand:
    def __init__(self, label, resources=None):
        self.label, self.variant, self.config = label, _Variant(resources), {}


def test_device_state_defaults_are_an_idle_device_at_its_nominal_clock():
    for empty in (None, {}):
        f = DeviceState.from_mapping(empty).features()
        assert f == {"dev.known": 0.0, "dev.sm_clock_ratio": 1.0, "dev.gpu_util_ratio": 0.0,
                     "dev.sm_active_ratio": 0.0, "dev.mem_used_ratio": 0.0,
                     "dev.other_processes": 0.0, "dev.throttled": 0.0}


def test_device_state_from_sampler_readings():
    s = DeviceState.from_mapping({"sm_clock_mhz": 1485.0, "max_sm_clock_mhz": 1980.0,
                                  "gpu_util_ratio": 0.7, "sm_active_ratio": 0.55,
                                  "mem_used_bytes": 3 << 30, "mem_total_bytes": 12 << 30,
                                  "other_processes": 2, "clock_event_reasons": 0x40,
                                  "sm_clock_note": "ignored", "power_w": math.nan})
    assert s.known and s.sm_clock_ratio == pytest.approx(0.75) and s.throttled
    assert (s.gpu_util_ratio, s.sm_active_ratio, s.other_processes) == (0.7, 0.55, 2.0)
    assert s.mem_used_ratio == pytest.approx(0.25)
    assert not DeviceState.from_mapping({"clock_event_reasons": 0x1}).throttled  # GPU idle


def test_kernel_resources_lookup_then_variant_table_then_defaults():
    lookup = {"a": {"registers": 128, "shared_bytes": 49152, "spill_store_bytes": 8}}.get
    a = kernel_resources(_Cand("a", {"registers": 1}), lambda c: lookup(c.label))
    assert a["res.registers"] == 128 and a["res.spill_store_bytes"] == 8 and a["res.known"] == 1
    b = kernel_resources(_Cand("b", {"b": {"registers": 40}}), lambda c: lookup(c.label))
    assert b["res.registers"] == 40 and b["res.shared_bytes"] == 0 and b["res.known"] == 1
    c = kernel_resources(_Cand("c"))
    assert c == {**{f"res.{k}": v for k, v in RESOURCE_DEFAULTS.items()}, "res.known": 0.0}


def test_every_group_is_present_in_every_row():
    r = row({"log2_R": 4.0}, "softmax", "v", {"T": 128})
    groups = {k.split(".")[0].split("=")[0] for k in r}
    assert groups == {"op", "variant", "cfg", "res", "dev"}
    assert r["res.known"] == 0.0 and r["dev.known"] == 0.0


def test_explain_ranks_exactly_as_decide(rng):
    pytest.importorskip("sklearn")
    import adaptive
    from adaptive.dispatch import Dispatcher
    from adaptive.policy.learned import Learned
    from test_policy import replayed_model
    x = rng.standard_normal((300, 96)).astype(np.float32)
    d = Dispatcher("host")
    cands = d.candidates("softmax", x)
    policy = Learned(replayed_model(cands, "host_blocked[rows=32]", rng))
    d = Dispatcher("host", policy=policy)
    # a sampler reading reaches the rows of both paths (a busy, clocked-down device)
    d.backend.device_state = lambda: {"sm_clock_mhz": 1000.0, "max_sm_clock_mhz": 2000.0,
                                      "gpu_util_ratio": 0.9}
    before = adaptive.explain("softmax", x, dispatcher=d)
    assert before.state == "undecided"
    d.launch("softmax", x)
    state = next(iter(policy.keys.values()))
    assert [r.label for r in before.rows] == [c.label for c in state.candidates]
    assert state.device.known and state.device.sm_clock_ratio == 0.5
    row0 = next(iter(state.rows.values()))
    assert row0["dev.gpu_util_ratio"] == 0.9
    after = adaptive.explain("softmax", x, dispatcher=d)
    assert [r.label for r in after.rows] == [c.label for c in state.candidates]


def test_explain_ranks_as_decide_with_the_issuing_charged_where_the_device_waits(rng):
    """Where the caller's device waits for the host, a miss ranks by device time plus
    each variant's known issuing (Context.charge); explain's ranking of an undecided input
    charges it the same way, so both put the variant that issues slowly lower alike."""
    import collections
    pytest.importorskip("sklearn")
    import adaptive
    from adaptive.dispatch import Dispatcher
    from adaptive.policy.learned import Learned
    from test_policy import replayed_model
    x = rng.standard_normal((300, 96)).astype(np.float32)
    cands = Dispatcher("host").candidates("softmax", x)
    policy = Learned(replayed_model(cands, "host_blocked[rows=32]", rng))
    d = Dispatcher("host", policy=policy)
    plain = adaptive.explain("softmax", x, dispatcher=d)
    top = next(c for c in cands if c.label == plain.rows[0].label)
    d._device_waits = lambda stream_ptr: True          # a host-bound caller
    d._issued[(top.variant.id, "numpy")] = collections.deque([50.0])   # 50 ms to issue
    before = adaptive.explain("softmax", x, dispatcher=d)
    assert before.rows[0].label != top.label
    assert before.rows[[r.label for r in before.rows].index(top.label)].predicted_ms > 50
    d.launch("softmax", x)
    state = next(iter(policy.keys.values()))
    assert [r.label for r in before.rows] == [c.label for c in state.candidates]
    assert "(with the host's issuing, the device waiting)" in state.reason


def test_work_says_what_a_candidates_weight_form_reads_alike_for_packs_and_misses(rng):
    """A 16x16-structured weight: a BSR-16 kernel reads its non-zeros, a BSR-32 kernel the
    zeros of each 32x32 block too; CSR reads the non-zeros; a library call says nothing.
    A pack's row (its stored op features) and a live miss give the same ``work.*``."""
    from adaptive.observation import Observation
    from adaptive.ops import OPS
    from adaptive.policy.features import candidate_rows, row_geometry, work
    from adaptive.variants import default_registry, make_candidate
    spmm = OPS["spmm"]
    w, b = spmm.make_inputs({"M": 256, "N": 8, "K": 512}, "float16", rng, density=0.05,
                            block=16)
    feats = spmm.features(spmm.problem((w, b), {}))
    assert feats["block_density_32"] > 2 * feats["density"]   # 16x16 blocks, scattered
    reg = {v.name: v for v in default_registry().variants("spmm")}
    bsr16 = make_candidate(reg["bsr16_mma"], {"TN": 64, "NWARPS": 4, "STAGES": 2})
    bsr32 = make_candidate(reg["bsr32_mma"], {"TN": 64, "NWARPS": 4, "STAGES": 2})
    csr = make_candidate(reg["csr_rowsplit"], {"VEC": 1, "LANES_N": 4, "WARPS": 4})
    host_bsr = make_candidate(reg["host_bsr"], {"block": 32})
    lib = make_candidate(reg["cublas_dense"], {})
    fill = {c: work("spmm", c.variant, c.config, feats).get("work.log2_fill")
            for c in (bsr16, bsr32, csr, host_bsr, lib)}
    assert fill[bsr16] == pytest.approx(0.0, abs=1e-9) and fill[csr] == 0.0
    expected = math.log2(feats["block_density_32"] / feats["density"])
    assert fill[bsr32] == pytest.approx(expected) and fill[host_bsr] == pytest.approx(expected)
    assert fill[lib] is None
    entries = work("spmm", bsr32.variant, bsr32.config, feats)["work.log2_row_entries"]
    assert entries == pytest.approx(math.log2(512 / 32 * feats["block_density_32"]))
    assert work("gemm", bsr32.variant, bsr32.config, feats) == {}   # gemm says nothing
    live = candidate_rows("spmm", feats, [bsr16, bsr32, lib], {}, None)
    for c, r in zip((bsr16, bsr32, lib), live):
        obs = Observation("spmm", {"M": 256, "N": 8, "K": 512}, "float16", c.variant.name,
                          c.config, 0.01, 0.001, feats)
        packed = row_geometry(c.variant, obs, None)
        assert {k: v for k, v in r.items() if k.startswith("work.")} == packed


def test_a_misses_rows_are_the_rows_training_builds_one_by_one(rng):
    """candidate_rows builds a miss's rows with the parts every candidate shares made once;
    each is the row ``row()`` builds alone from a measurement row's geometry and work
    (training's, :func:`row_geometry`), key for key and in the same order, with a device
    state and raw ptxas tables among the resources; the work per CTA and per launched
    thread is the input's log2 flops less log2 of the candidate's CTAs, of its CTAs x
    threads."""
    from adaptive.observation import Observation
    from adaptive.ops import OPS
    from adaptive.policy.features import (DeviceState, candidate_rows, kernel_resources, row,
                                          row_geometry)
    from adaptive.variants import default_registry, make_candidate
    x = rng.standard_normal((300, 700)).astype(np.float16)
    op = OPS["softmax"]
    problem = op.problem((x,), {})
    feats, scope = op.features(problem), problem.scope()
    cands = [make_candidate(v, c) for v in default_registry().variants("softmax", "cuda")
             for c in list(v.space.all_configs())[:5]]
    device = DeviceState.from_mapping({"sm_clock_mhz": 990, "max_sm_clock_mhz": 1980})
    raw = {cands[0].label: {"registers": 40, "shared_bytes": 0}}   # ptxas's, for one

    def lookup(candidate):
        return raw.get(candidate.label)
    limits = {"max_threads_per_block": 1024, "max_shared_per_block": 48 * 1024,
              "sm_count": 132, "max_regs_per_sm": 65536, "max_threads_per_sm": 2048}
    got = candidate_rows("softmax", feats, cands, scope, limits, device, lookup)
    measured = [Observation("softmax", dict(problem.dims), problem.dtype, c.variant.name,
                            c.config, 0.1, 0.01, feats) for c in cands]
    want = [row(feats, "softmax", c.variant.name, c.config, kernel_resources(c, lookup),
                device, row_geometry(c.variant, m, limits)) for c, m in zip(cands, measured)]
    assert len(got) == len(cands) > 5
    for a, b in zip(got, want):
        assert list(a.items()) == list(b.items())
    for r in got:
        lanes = r["geo.log2_ctas"] + r["geo.log2_threads"]
        assert r["geo.log2_flops_per_thread"] == pytest.approx(feats["log2_flops"] - lanes)
        assert r["geo.log2_flops_per_cta"] == pytest.approx(
            feats["log2_flops"] - r["geo.log2_ctas"])
    assert len({r["geo.log2_flops_per_thread"] for r in got}) >= 4   # the configs differ
    assert got[0]["res.registers"] == 40.0 and got[0]["res.known"] == 1.0
    assert got[0]["dev.sm_clock_ratio"] == 0.5 and got[1]["res.known"] == 0.0


def test_a_spmm_misses_work_made_once_per_form_is_each_candidates_own(rng):
    """A miss computes spmm's ``work.*`` once per weight form (``Op.work_key``): every row
    carries what ``work()`` gives its candidate alone, for every variant of both backends
    (BSR 16/32/64, CSR, 2:4, library calls), on a weight with 32x32 structure."""
    from adaptive.ops import OPS
    from adaptive.policy.features import candidate_rows, geometries, work
    from adaptive.variants import default_registry, make_candidate
    spmm = OPS["spmm"]
    w, b = spmm.make_inputs({"M": 320, "N": 24, "K": 640}, "float16", rng, density=0.07,
                            block=32)
    problem = spmm.problem((w, b), {})
    feats, scope = spmm.features(problem), problem.scope()
    cands = [make_candidate(v, c) for v in default_registry().variants("spmm")
             for c in list(v.space.all_configs())[:3]]
    assert len({spmm.work_key(c.variant, c.config) for c in cands}) >= 5
    limits = {"max_threads_per_block": 1024, "max_shared_per_block": 48 * 1024,
              "sm_count": 132, "max_regs_per_sm": 65536, "max_threads_per_sm": 2048}
    got = candidate_rows("spmm", feats, cands, scope, limits)
    geo = geometries([(c.variant, c.config) for c in cands], scope, limits, feats)
    for r, c, g in zip(got, cands, geo):
        own = work("spmm", c.variant, c.config, feats)
        assert {k: v for k, v in r.items() if k.startswith("work.")} == own, c.label
        assert {k: v for k, v in r.items() if k.startswith("geo.")} == g, c.label


def test_a_misses_matrix_from_the_rows_parts_is_the_dicts_matrix(rng):
    """The model's matrix of a miss's rows, made from their parts without building the
    dicts, is the one the dicts give, value for value, on a model fitted on rows of other
    inputs (names the miss's rows lack: 0; names the model never saw: left out); the
    predictions alike; the rows a sequence of row()'s dicts (index, negative, slice)."""
    from adaptive.ops import OPS
    from adaptive.policy.cost_model import CostModel
    from adaptive.policy.features import Rows, candidate_rows
    from adaptive.variants import default_registry, make_candidate
    op = OPS["softmax"]
    limits = {"max_threads_per_block": 1024, "max_shared_per_block": 48 * 1024,
              "sm_count": 132, "max_regs_per_sm": 65536, "max_threads_per_sm": 2048}
    cands = [make_candidate(v, c) for v in default_registry().variants("softmax", "cuda")
             for c in list(v.space.all_configs())[:6]]

    def rows_of(r, c):
        problem = op.problem((rng.standard_normal((r, c)).astype(np.float16),), {})
        return candidate_rows("softmax", op.features(problem), cands, problem.scope(),
                              limits)
    train = [dict(r) for shape in ((64, 300), (900, 40), (7, 4096)) for r in rows_of(*shape)]
    for r in train[::3]:
        r.pop("geo.tail", None)              # some names only some rows have
    model = CostModel(n_estimators=8).fit(train, rng.standard_normal(len(train)))
    miss = rows_of(333, 517)
    assert isinstance(miss, Rows) and len(miss) == len(cands) > 6
    miss.op_part["op.never_seen"] = 3.0      # a name the model never saw
    dicts = list(miss)
    np.testing.assert_array_equal(model._matrix(miss), model._matrix(dicts))
    for a, b in zip(model.predict_dist(miss), model.predict_dist(dicts)):
        np.testing.assert_array_equal(a, b)
    assert miss[-1] is dicts[-1] and miss[1:3] == dicts[1:3]
    with pytest.raises(IndexError):
        miss[len(cands)]


def test_a_candidates_part_is_kept_between_misses_and_follows_a_replaced_variant(rng):
    """Without a backend's lookup (the dispatcher's misses) what a row says of a candidate
    alone is made once and kept: a second miss's rows are still ``row()``'s key for key,
    and a variant replaced under the same id (regenerated, new ptxas resources) is read
    anew, not served from the kept part."""
    import dataclasses

    from adaptive.ops import OPS
    from adaptive.policy.features import candidate_rows, kernel_resources, row, work
    from adaptive.variants import default_registry, make_candidate
    op = OPS["softmax"]
    problem = op.problem((rng.standard_normal((37, 515)).astype(np.float16),), {})
    feats, scope = op.features(problem), problem.scope()
    variant = default_registry().variants("softmax", "cuda")[0]
    cands = [make_candidate(variant, c) for c in list(variant.space.all_configs())[:4]]

    def want(cs):
        return [row(feats, "softmax", c.variant.name, c.config, kernel_resources(c), None,
                    work("softmax", c.variant, c.config, feats)) for c in cs]
    for _ in range(2):   # the second miss: every candidate part kept from the first
        got = candidate_rows("softmax", feats, cands, scope, None)
        assert [list(r.items()) for r in got] == [list(r.items()) for r in want(cands)]
    got[0]["res.registers"] = -1.0   # a caller's edit of its row reaches no kept part
    again = candidate_rows("softmax", feats, cands, scope, None)
    assert again[0]["res.registers"] != -1.0
    regenerated = dataclasses.replace(variant, resources={"registers": 77, "shared_bytes": 0})
    assert regenerated.id == variant.id
    fresh = [make_candidate(regenerated, c.config) for c in cands]
    got = candidate_rows("softmax", feats, fresh, scope, None)
    assert {r["res.registers"] for r in got} == {77.0}
    assert [list(r.items()) for r in got] == [list(r.items()) for r in want(fresh)]
