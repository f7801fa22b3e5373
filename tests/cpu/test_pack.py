"""Variant packs: format round-trip, refusals that load nothing, device mismatch, merge and
diff, building on the host backend, resuming an interrupted build, the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest

import adaptive
from adaptive import config, runtime
from adaptive.packs import format as packs
from adaptive.packs import install
from adaptive.dispatch import Dispatcher
from adaptive.packs import compare
from adaptive.errors import PackError
from adaptive.observation import Observation
from adaptive.ops import OPS
from adaptive.packs.build import Journal, Settings, build_pack, load_shapes
from adaptive.policy import MeasureEach
from adaptive.variants import Registry, default_registry, make_candidate, variant_from_dict

ROOT = Path(__file__).resolve().parents[2]

SOFTMAX_SRC = '''
import numpy as np

def softmax_pack(x, out, rows=1):
    xf = x.astype(np.float64)
    e = np.exp(xf - xf.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
'''
HOST_FP = {"backend": "host", "name": "test-cpu", "cpu_count": 2, "numpy": "x"}
FAST = Settings(warmup=1, repeats=3)


class Recording(MeasureEach):
    """MeasureEach that keeps what ``add_observations`` gives it."""

    def __init__(self):
        super().__init__()
        self.given: list[tuple[list, float]] = []

    def add_observations(self, rows, weight=1.0, geometry=None):
        self.given.append((list(rows), weight))


def _variant(name="pack_softmax", source=SOFTMAX_SRC):
    return variant_from_dict({"name": name, "backend": "host", "language": "python",
                              "entry": "softmax_pack", "source": source, "op": "softmax",
                              "space": {"rows": [1, 2]}, "provenance": {"by": "test"}},
                             "softmax")


def _row(variant="pack_softmax", time_ms=0.5, r=7, c=33, cfg=None):
    return Observation("softmax", {"R": r, "C": c}, "float32", variant, cfg or {"rows": 1},
                       time_ms, floor_ms=0.01, features={"log2_R": 2.8}, samples=5,
                       spread_ms=0.02, counters={"sm_clock_mhz": 1980.0}, source="bench")


def _cubin():
    return packs.Cubin("ab" * 32, "softmax/pack_softmax", {"rows": 1}, "sm_90",
                       bytes(range(256)) * 4, {"registers": 32})


@pytest.fixture
def small_pack(tmp_path):
    pack = packs.new_pack([_variant()], [_row(), _row(time_ms=0.7, cfg={"rows": 2})], HOST_FP,
                          cubins=[_cubin()], failures=[{"op": "softmax", "reason": "x"}])
    path = tmp_path / "small.msgpack"
    packs.write_pack(pack, path)
    return path


@pytest.fixture(scope="module")
def quick_pack(tmp_path_factory):
    path = tmp_path_factory.mktemp("packs") / "quick.msgpack"
    return path, build_pack(load_shapes("quick"), path, "host", settings=FAST, progress=False)


@pytest.fixture
def isolated():
    """A fresh registry and a dispatcher on it whose policy records the rows it is given."""
    reg = Registry(default_registry().variants("softmax"))
    policy = Recording()
    return reg, Dispatcher("host", registry=reg, policy=policy), policy


# ---- format -----------------------------------------------------------------------------------

def test_round_trip_keeps_every_field(small_pack):
    pack = packs.read_pack(small_pack)
    assert pack.header["schema"] == packs.SCHEMA_VERSION
    assert pack.header["fingerprint"] == HOST_FP
    assert pack.header["creator"] == f"adaptive {adaptive.__version__}"
    assert pack.header["counts"] == {"variants": 1, "rows": 2, "cubins": 1, "failures": 1}
    assert [v.to_dict() for v in pack.variants] == [_variant().to_dict()]
    assert pack.rows == (_row(), _row(time_ms=0.7, cfg={"rows": 2}))
    assert pack.cubins == (_cubin(),)
    assert len(pack.sha256) == 64
    assert oct(small_pack.stat().st_mode & 0o777) == "0o644"


def test_built_pack_round_trips(quick_pack):
    path, built = quick_pack
    again = packs.read_pack(path)
    assert again.sha256 == built.sha256
    assert again.rows == built.rows
    assert {v.id for v in again.variants} == {v.id for v in built.variants}


def _outer(path):
    return msgpack.unpackb(path.read_bytes(), raw=False)


def _write_outer(path, outer):
    path.write_bytes(msgpack.packb(outer, use_bin_type=True))


def _refused(path, isolated, match):
    reg, d, policy = isolated
    before = (len(reg), reg.generation, runtime.shared_registry().observations())
    with pytest.raises(PackError, match=match):
        install.load_pack(path, registry=reg, fingerprint=HOST_FP)
    assert (len(reg), reg.generation, runtime.shared_registry().observations()) == before
    assert policy.given == []
    with pytest.raises(Exception):
        reg.get("softmax", "pack_softmax")


@pytest.mark.parametrize("keep", [0, 1, 10, 0.5, -1], ids=lambda k: f"keep={k}")
def test_truncated_pack_is_refused(small_pack, isolated, keep):
    data = small_pack.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    small_pack.write_bytes(data[:n])
    _refused(small_pack, isolated, "truncated or corrupted|not an adaptive pack")


def test_every_flipped_byte_is_refused(small_pack, isolated):
    data = small_pack.read_bytes()
    reg, d, policy = isolated
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        with pytest.raises(PackError):
            packs.decode(bytes(bad), f"flip@{i}")
    small_pack.write_bytes(bytes(bad))
    _refused(small_pack, isolated, None)


@pytest.mark.parametrize("part", ["header", "body"])
def test_hash_mismatch_is_refused(small_pack, isolated, part):
    outer = _outer(small_pack)
    stored = outer[part] if part == "header" else zlib.decompress(outer[part])
    inner = msgpack.unpackb(stored, raw=False)
    if part == "header":
        inner["fingerprint"]["name"] = "NVIDIA H200"   # a lie about the device
        outer[part] = msgpack.packb(inner, use_bin_type=True)
    else:
        inner["rows"][0]["time_ms"] = 1e-9               # a lie about a measurement
        outer[part] = zlib.compress(msgpack.packb(inner, use_bin_type=True))
    _write_outer(small_pack, outer)
    _refused(small_pack, isolated, "hash mismatch")


def test_unknown_schema_is_refused(small_pack, isolated):
    outer = _outer(small_pack)
    outer["schema"] = packs.SCHEMA_VERSION + 1
    _write_outer(small_pack, outer)
    _refused(small_pack, isolated, f"unknown schema version {packs.SCHEMA_VERSION + 1}")


def _rehashed(outer, header=None, body=None) -> dict:
    """``outer`` with a new header and/or stored body, and a hash that matches them."""
    import hashlib
    if header is not None:
        outer["header"] = msgpack.packb(header, use_bin_type=True)
    if body is not None:
        outer["body"] = body
    outer["sha256"] = hashlib.sha256(outer["header"] + outer["body"]).hexdigest()
    return outer


def test_schema_1_packs_with_a_plain_body_still_load(small_pack, isolated):
    """Packs written before the body was compressed (the H200 corpus) load unchanged."""
    outer = _outer(small_pack)
    header = msgpack.unpackb(outer["header"], raw=False)
    header["schema"] = outer["schema"] = 1
    _write_outer(small_pack, _rehashed(outer, header, zlib.decompress(outer["body"])))
    pack = packs.read_pack(small_pack)
    assert pack.header["schema"] == 1 and len(pack.rows) == 2 and len(pack.variants) == 1


@pytest.mark.parametrize("case", ["truncated", "bomb", "schema mismatch", "plain under 2"])
def test_a_damaged_compressed_body_is_refused(small_pack, isolated, monkeypatch, case):
    outer = _outer(small_pack)
    header = msgpack.unpackb(outer["header"], raw=False)
    match = {"truncated": "truncated", "bomb": "inflates past 0 MiB",
             "schema mismatch": "header says schema 1, the file's outer map 2",
             "plain under 2": "does not inflate"}[case]
    if case == "truncated":
        _rehashed(outer, body=outer["body"][:-7])
    elif case == "bomb":     # a body inflating past the bound is stopped at the bound
        monkeypatch.setattr(packs, "MAX_BODY_BYTES", 64)
    elif case == "schema mismatch":
        header["schema"] = 1
        _rehashed(outer, header)
    else:
        _rehashed(outer, body=zlib.decompress(outer["body"]))
    _write_outer(small_pack, outer)
    _refused(small_pack, isolated, match)


def test_not_a_pack_is_refused(tmp_path, isolated):
    path = tmp_path / "other.msgpack"
    path.write_bytes(msgpack.packb({"format": "adaptive-counter-log", "version": 1}))
    _refused(path, isolated, "not an adaptive pack")
    with pytest.raises(PackError, match="cannot read"):
        packs.read_pack(tmp_path / "missing.msgpack")


def test_invalid_contents_with_a_valid_hash_are_refused(tmp_path, isolated):
    pack = packs.new_pack([_variant()], [_row()], HOST_FP)
    data, _ = packs.encode(pack)
    outer = msgpack.unpackb(data, raw=False)
    body = msgpack.unpackb(zlib.decompress(outer["body"]), raw=False)
    body["variants"][0]["language"] = "fortran"
    outer["body"] = zlib.compress(msgpack.packb(body, use_bin_type=True))
    import hashlib
    outer["sha256"] = hashlib.sha256(outer["header"] + outer["body"]).hexdigest()
    path = tmp_path / "bad.msgpack"
    _write_outer(path, outer)
    _refused(path, isolated, "invalid contents.*language")


def test_failed_write_leaves_the_old_file(small_pack, monkeypatch):
    before = small_pack.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        packs.write_pack(packs.new_pack([], [], HOST_FP), small_pack)
    assert small_pack.read_bytes() == before
    assert [p.name for p in small_pack.parent.iterdir()] == [small_pack.name]


# ---- loading ----------------------------------------------------------------------------------

def test_load_adds_variants_and_rows_and_the_variant_runs(small_pack, isolated, rng):
    reg, d, policy = isolated
    report = install.load_pack(small_pack, registry=reg, fingerprint=dict(HOST_FP, numpy="y"))
    assert report.same_device and report.weight == 1.0
    assert report.variants_added == ("softmax/pack_softmax",) and report.rows == 2
    assert reg.get("softmax", "pack_softmax").origin == f"pack {small_pack}"
    [(rows, weight)] = policy.given
    assert weight == 1.0 and [r.time_ms for r in rows] == [0.5, 0.7]
    assert all(r.source == "pack" for r in rows)
    x = OPS["softmax"].make_inputs({"R": 7, "C": 33}, "float32", rng)[0]
    out = d.launch("softmax", x, variant="pack_softmax", config={"rows": 2})
    assert OPS["softmax"].error(out, OPS["softmax"].reference(x)) < 1e-6
    again = install.load_pack(small_pack, registry=reg, fingerprint=HOST_FP)
    assert again.variants_added == () and again.rows == 0 and len(policy.given) == 1


def test_other_device_loads_with_a_warning_and_down_weighted(small_pack, isolated):
    reg, d, policy = isolated
    h200 = {"backend": "cuda", "name": "NVIDIA H200", "cc": 90, "sm_count": 132}
    with pytest.warns(install.PackDeviceWarning, match="down-weighted"):
        report = install.load_pack(small_pack, registry=reg, fingerprint=h200)
    assert not report.same_device and report.weight == packs.FOREIGN_WEIGHT
    assert [w for _, w in policy.given] == [packs.FOREIGN_WEIGHT]


def test_same_device_ignores_versions_but_not_identity():
    a = {"backend": "cuda", "name": "NVIDIA H200", "cc": 90, "sm_count": 132,
         "driver_version": 12080}
    assert packs.same_device(a, dict(a, driver_version=13000, nvrtc="13.0"))
    assert not packs.same_device(a, dict(a, sm_count=114))
    assert not packs.same_device(a, dict(a, name="NVIDIA H100"))
    assert not packs.same_device(a, HOST_FP)
    assert not packs.same_device({}, {})


def test_variant_differing_from_the_registered_one_is_skipped(tmp_path, isolated):
    reg, d, policy = isolated
    builtin = reg.get("softmax", "host_numpy")
    changed = dataclasses.replace(builtin, source=builtin.source + "\n# changed\n")
    same = reg.get("softmax", "host_blocked")
    rows = [_row("host_numpy", cfg={}), _row("host_blocked", cfg={"rows": 8})]
    path = tmp_path / "p.msgpack"
    packs.write_pack(packs.new_pack([changed, same], rows, HOST_FP), path)
    report = install.load_pack(path, registry=reg, fingerprint=HOST_FP)
    assert report.variants_skipped == ("softmax/host_numpy",)
    assert report.variants_present == ("softmax/host_blocked",)
    assert reg.get("softmax", "host_numpy") is builtin
    [(given, _)] = policy.given
    assert [r.variant for r in given] == ["host_blocked"]


def test_adaptive_packs_env_loads_at_the_start_into_new_dispatchers(small_pack, monkeypatch):
    monkeypatch.setenv("ADAPTIVE_PACKS", str(small_pack))
    runtime.reset_defaults()
    try:
        with config.override(packs=str(small_pack)), pytest.warns(install.PackDeviceWarning):
            d = Dispatcher("host", policy=Recording())
            assert "pack_softmax" not in {v.name for v in d.registry.variants("softmax")}
            runtime.start(d)                 # what adaptive.launch does for its dispatchers
            assert runtime.shared_registry().get("softmax", "pack_softmax").source == \
                SOFTMAX_SRC
            assert d.stats["prior_rows"] == 2 and len(d.policy.given) == 1
            later = Dispatcher("host", policy=Recording())
            assert [len(r) for r, _ in later.policy.given] == [2]   # rows reach later ones too
    finally:
        runtime.reset_defaults()


def test_refused_adaptive_packs_entry_fails_the_start(small_pack, rng):
    small_pack.write_bytes(small_pack.read_bytes()[:100])
    runtime.reset_defaults()
    try:
        with config.override(packs=str(small_pack)):
            for _ in range(2):   # every attempt says so, none half-loads
                with pytest.raises(PackError, match="truncated"):
                    runtime.start(Dispatcher("host"))
                with pytest.raises(PackError, match="truncated"):   # the default one too
                    adaptive.launch("softmax", rng.standard_normal((3, 5)))
                assert "pack_softmax" not in {
                    v.name for v in runtime.shared_registry().variants("softmax")}
                assert runtime.shared_registry().observations() == []
    finally:
        runtime.reset_defaults()


# ---- merge and diff ---------------------------------------------------------------------------

def test_merge_unions_and_deduplicates(tmp_path):
    a = packs.new_pack([_variant()], [_row(), _row(r=9)], HOST_FP)
    b = packs.new_pack([_variant(), _variant("other")], [_row(), _row(r=11)], HOST_FP)
    m = compare.merge([a, b])
    assert sorted(v.name for v in m.variants) == ["other", "pack_softmax"]
    assert sorted(r.dims["R"] for r in m.rows) == [7, 9, 11]
    packs.write_pack(m, tmp_path / "m.msgpack")
    assert packs.read_pack(tmp_path / "m.msgpack").rows == m.rows


def test_merge_refuses_other_devices_and_conflicting_variants():
    a = packs.new_pack([_variant()], [_row()], HOST_FP)
    other = packs.new_pack([], [_row()], {"backend": "cuda", "name": "NVIDIA H200", "cc": 90})
    with pytest.raises(PackError, match="different devices"):
        compare.merge([a, other])
    assert compare.merge([a, other], allow_other_devices=True).fingerprint == HOST_FP
    clash = packs.new_pack([_variant(source=SOFTMAX_SRC + "\n")], [], HOST_FP)
    with pytest.raises(PackError, match="differs between the packs"):
        compare.merge([a, clash])



def test_fill_failures_takes_only_the_failed_pairs_from_a_matching_donor(tmp_path):
    failed = {"op": "softmax", "variant": "pack_softmax", "dims": {"R": 9, "C": 33},
              "dtype": "float32", "config": {"rows": 1}, "reason": "KeyError: 'torch'"}
    unmatched = dict(failed, dims={"R": 5, "C": 33})
    pack = packs.new_pack([_variant()], [_row(), _row(r=9, cfg={"rows": 2})], HOST_FP,
                          failures=[failed, unmatched])
    donor = packs.new_pack([_variant()], [_row(time_ms=9.0), _row(r=9, time_ms=0.25),
                                          _row(r=9, time_ms=7.0, cfg={"rows": 2}),
                                          _row(r=11)], HOST_FP)
    other = packs.new_pack([_variant()], [_row(r=5)], {"backend": "cuda", "name": "H200"})
    filled, left = compare.fill_failures(pack, [other, donor])
    # R=9's failed config from the donor, its other config kept as measured (the donor's
    # 7 ms row of it not taken); R=7 kept (the donor's 9 ms row not taken); R=11 not asked
    # for; R=5 only on another device: still failed
    assert sorted((r.dims["R"], r.config["rows"], r.time_ms) for r in filled.rows) == [
        (7, 1, 0.5), (9, 1, 0.25), (9, 2, 0.5)]
    assert left == [unmatched] and list(filled.failures) == [unmatched]
    [record] = filled.header["build"]["filled_failures"]
    assert record["dims"] == {"R": 9, "C": 33} and record["rows"] == 1
    changed = packs.new_pack([_variant(source=SOFTMAX_SRC + "\n")], [_row(r=9)], HOST_FP)
    assert compare.fill_failures(pack, [changed])[1] == [failed, unmatched]   # code differs
    packs.write_pack(filled, tmp_path / "f.msgpack")
    assert packs.read_pack(tmp_path / "f.msgpack").rows == filled.rows

def test_diff_reports_variants_ratios_and_best_changes():
    a = packs.new_pack([_variant()], [_row(time_ms=1.0), _row(time_ms=2.0, cfg={"rows": 2})],
                       HOST_FP)
    b = packs.new_pack([_variant(), _variant("other")],
                       [_row(time_ms=0.5), _row(time_ms=0.25, cfg={"rows": 2}),
                        _row(time_ms=3.0, r=99)], HOST_FP)
    d = compare.diff(a, b)
    assert d["variants_added"] == ["softmax/other"] and d["variants_removed"] == []
    assert sorted(d["ratios"].values()) == [0.125, 0.5]
    assert d["only_in_b"] == 1 and d["only_in_a"] == 0
    [(labels)] = d["best_changed"].values()
    assert labels == (("pack_softmax[rows=1]", 1.0), ("pack_softmax[rows=2]", 0.25))


# ---- building ---------------------------------------------------------------------------------

def test_quick_build_on_the_host_measures_every_fitting_candidate(quick_pack):
    path, pack = quick_pack
    cases = load_shapes("quick")
    assert pack.header["build"]["cases_done"] == len(cases) and not pack.failures
    assert pack.fingerprint["backend"] == "host"
    assert not path.with_name(path.name + ".partial").exists()
    d = Dispatcher("host", registry=default_registry())
    for case in cases:
        op = OPS[case.op]
        args = op.make_inputs(dict(case.dims), case.dtype, np.random.default_rng(0),
                              **dict(case.stats))
        want = {c.label for c in d.candidates(case.op, *args, **dict(case.params))}
        dims = op.problem(args, dict(case.params)).dims_dict   # rows carry the problem's dims
        got = {compare.best_per_input([r])[(case.op, tuple(sorted(dims.items())), case.dtype)][0]
               for r in pack.rows if r.op == case.op and r.dims == dims}
        assert got == want, case.id
    for r in pack.rows:
        assert 0 < r.time_ms < 1e3 and r.samples == 3 and r.floor_ms > 0 and r.features


def test_build_resumes_after_an_interruption(tmp_path):
    cases = load_shapes("quick", ["softmax", "gemm"])
    out = tmp_path / "r.msgpack"
    seen = []

    def stop_after_two(result):
        seen.append(result["case"])
        if len(seen) == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        build_pack(cases, out, "host", settings=FAST, progress=False, on_case=stop_after_two)
    journal = out.with_name(out.name + ".partial")
    assert journal.exists() and not out.exists()
    with open(journal, "ab") as f:
        f.write(b"\x82\xa4case")          # a record torn by the interruption
    resumed = []
    pack = build_pack(cases, out, "host", settings=FAST, progress=False,
                      on_case=lambda r: resumed.append(r["case"]))
    assert resumed == [c.id for c in cases[2:]]
    assert {compare.row_key(r)[:3] for r in pack.rows} == {
        (c.op, tuple(sorted(c.dims)), c.dtype) for c in cases}
    assert pack.header["build"]["cases_resumed"] == 2 and not journal.exists()


def test_wrong_or_failing_candidates_become_failures_not_rows():
    from adaptive.packs.build import Case, measure_case
    wrong = _variant("wrong", SOFTMAX_SRC.replace("out[...] = e / e.sum", "out[...] = e * e.sum"))
    broken = _variant("broken", SOFTMAX_SRC.replace("xf = x.astype", "xf = x.nope"))
    reg = Registry([_variant(), wrong, broken])
    d = Dispatcher("host", registry=reg)
    case = Case("softmax", (("R", 9), ("C", 31)))
    result = measure_case(d, case, FAST)
    assert {r["variant"] for r in result["rows"]} == {"pack_softmax"}
    reasons = {f["variant"]: f["reason"] for f in result["failures"]}
    assert "wrong result: relative error" in reasons["wrong"]
    assert "AttributeError" in reasons["broken"]


def test_build_with_two_worker_processes(tmp_path):
    cases = load_shapes("quick", ["softmax", "gemm"])
    pack = build_pack(cases, tmp_path / "w.msgpack", "host", workers=2, settings=FAST,
                      progress=False)
    assert pack.header["build"]["workers"] == 2 and pack.header["build"]["cases_done"] == 4
    assert {r.op for r in pack.rows} == {"softmax", "gemm"} and not pack.failures


def test_cubins_travel_into_the_kernel_cache(tmp_path, isolated, monkeypatch):
    nvrtc = pytest.importorskip("adaptive.nvrtc")
    if not nvrtc.available():
        pytest.skip("NVRTC (cuda.bindings) is not installed")
    from adaptive.kcache import KernelCache
    from adaptive.packs.build import _cubin
    warp_row = default_registry().get("softmax", "warp_row")
    cand = make_candidate(warp_row, {"WARPS": 2, "VEC": 4})
    with config.override(cache_dir=str(tmp_path / "build-cache")):
        [c] = _cubin("sm_90", cand, "float32")
    assert c["image"][:4] == b"\x7fELF" and c["resources"]["registers"] > 0
    path = tmp_path / "c.msgpack"
    packs.write_pack(packs.new_pack([], [], HOST_FP, cubins=[packs.Cubin(**c)]), path)
    reg, _, _ = isolated
    with config.override(cache_dir=str(tmp_path / "fresh-cache")):
        install.load_pack(path, registry=reg, fingerprint=HOST_FP)   # no GPU here: no cubin
        assert KernelCache(str(tmp_path / "fresh-cache")).get(c["key"]) is None
        assert not (tmp_path / "fresh-cache").exists()
    monkeypatch.setattr(install, "runnable_archs", lambda: frozenset({"sm_90"}))  # an H200
    path2 = tmp_path / "c2.msgpack"
    packs.write_pack(packs.new_pack([], [], HOST_FP, cubins=[packs.Cubin(**c)],
                                    created_s=1.0), path2)
    with config.override(cache_dir=str(tmp_path / "fresh-cache")):
        install.load_pack(path2, registry=reg, fingerprint=HOST_FP)
        hit = KernelCache(str(tmp_path / "fresh-cache")).get(c["key"])
    assert hit is not None and hit.path.read_bytes() == c["image"]


def test_journal_of_another_build_is_refused(tmp_path):
    path = tmp_path / "j.partial"
    Journal(path, {"cases_sha256": "a"})
    with pytest.raises(PackError, match="another build"):
        Journal(path, {"cases_sha256": "b"})


def test_build_with_a_deadline_keeps_what_ran(tmp_path):
    cases = load_shapes("quick", ["softmax"])
    pack = build_pack(cases, tmp_path / "d.msgpack", "host", settings=FAST, progress=False,
                      deadline_s=0.0)
    assert pack.header["build"]["cases_done"] == 0 and pack.rows == ()


def test_shapes_file_and_bad_shapes(tmp_path):
    f = tmp_path / "s.json"
    f.write_text('{"softmax": [{"dims": {"R": 5, "C": 17}, "dtype": "float32"}]}')
    [case] = load_shapes(str(f))
    assert case.id == "softmax R=5,C=17 float32"
    with pytest.raises(ValueError, match="neither a preset"):
        load_shapes("nope")
    with pytest.raises(ValueError, match="no entries for gemm"):
        load_shapes(str(f), ["gemm"])
    f.write_text('{"softmax": [{"shape": [5, 17]}]}')
    with pytest.raises(ValueError, match="expected keys dims"):
        load_shapes(str(f))


# ---- the command ------------------------------------------------------------------------------

def test_cli_build_show_diff_merge(tmp_path, capsys, small_pack):
    from adaptive.cli import main
    out = tmp_path / "c.msgpack"
    assert main(["pack", "build", "--shapes", "quick", "--ops", "softmax", "--backend", "host",
                 "--repeats", "3", "--no-progress", "-o", str(out)]) == 0
    assert main(["pack", "show", str(out), "--best"]) == 0
    text = capsys.readouterr().out
    assert "(of header + body; verified)" in text and "host_numpy" in text and "softmax" in text
    assert main(["pack", "diff", str(out), str(out)]) == 0
    assert "geometric mean 1.000" in capsys.readouterr().out
    assert main(["pack", "merge", str(out), str(out), "-o", str(tmp_path / "m.msgpack")]) == 0
    small_pack.write_bytes(small_pack.read_bytes()[:-3])
    assert main(["pack", "show", str(small_pack)]) == 2
    assert "truncated or corrupted" in capsys.readouterr().err


def test_build_from_counter_log(tmp_path, rng):
    counterlog = pytest.importorskip("adaptive.counterlog")
    log_path = tmp_path / "run.alog"
    d = Dispatcher("host", registry=default_registry())
    with counterlog.counter_log(log_path, sample_every=1, registry=d.registry):
        for r, c in ((5, 17), (64, 96)):
            x = OPS["softmax"].make_inputs({"R": r, "C": c}, "float32", rng)[0]
            for _ in range(3):
                d.launch("softmax", x)
    from adaptive.packs.cli import build_from_logs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pack = build_from_logs([str(log_path)], str(tmp_path / "l.msgpack"))
    assert len(pack.rows) == 6 and {r.source for r in pack.rows} == {"log"}
    assert {v.op for v in pack.variants} == {"softmax"}
    assert packs.read_pack(tmp_path / "l.msgpack").rows == pack.rows


def test_shipped_pack_matches_the_built_in_variants():
    """A built-in variant changed after the shipped pack was measured would drop its rows
    (the pack's copy is skipped): rebuild the pack with the change (``gpu_pack``)."""
    import warnings
    from adaptive.packs import shipped_packs
    from adaptive.variants import default_registry
    for path in shipped_packs():
        pack = packs.read_pack(path)
        reg = default_registry()
        with warnings.catch_warnings():
            warnings.simplefilter("error")            # a skipped variant warns
            report = install.load_pack(path, registry=reg, fingerprint=pack.fingerprint)
        assert not report.variants_skipped and report.same_device
        assert report.rows == len(pack.rows) > 1000, report


def test_the_wide_preset_draws_softmax_rows_as_a_transformer_makes_them(
        shipped_pack_contents):
    """Attention-score rows (many rows of 1-8k keys) and vocabulary logits (few rows of
    32k-152k) besides the log-uniform draws, which kept their values, and a grid of the
    vocabulary at serving batch sizes: the shipped packs measured those (run S72: the
    draws alone; runs S159 and S167: the vocabulary grid; a rebuild measures all)."""
    from adaptive.packs.presets import wide
    s = wide()["softmax"]
    drawn = [tuple(sorted(c["dims"].items())) for c in s]
    assert len(s) == 78
    for name, pack in shipped_pack_contents.items():
        built = {tuple(sorted(r.dims.items())) for r in pack.rows if r.op == "softmax"}
        assert built <= set(drawn), (name, sorted(built - set(drawn)))
        assert set(drawn[56:]) <= built, name          # the vocabulary grid (S159, S167)
    built = {tuple(sorted(r.dims.items())) for r in shipped_pack_contents["h200.msgpack"].rows
             if r.op == "softmax"}
    assert set(drawn[:30]) <= built and set(drawn[46:56]) <= built   # and the scores' grid
    grid = [(c["dims"]["R"], c["dims"]["C"]) for c in s[46:56]]
    assert all(r * c >= 2 ** 24 and 1024 <= c <= 8192 for r, c in grid), grid
    dims = [(c["dims"]["R"], c["dims"]["C"]) for c in s[30:46]]
    scores = [(r, c) for r, c in dims if r >= 4096 and 1024 <= c <= 8192]
    vocab = [(r, c) for r, c in dims if r <= 64 and c >= 32000]
    assert len(scores) >= 2 and len(vocab) == 4, dims
    assert all(256 <= r <= 65536 and 128 <= c <= 8192 for r, c in dims
               if (r, c) not in vocab)
    serving = {(c["dims"]["R"], c["dims"]["C"], c["dtype"]) for c in s[56:]}
    assert len(serving) == 22 and (128, 32000, "float16") in serving
    assert {r for r, _, _ in serving} == {4, 24, 128, 384}


def test_the_wide_preset_measures_multi_head_prefills_causal_and_not(shipped_pack_contents):
    """The shipped pack's shapes: prefill attention with as many key/value heads as query
    heads (where the flash kernels run, not SDPA alone), both causal and not; the shipped
    pack (run S72) measured every attention input the preset draws, run S148 the causal
    multi-head prefills of scripts/device-runs/causal_prefill_mha.json and run S183 the 16
    long prefills of long_prefills.json, and only those."""
    from adaptive.packs.presets import wide
    added = [c for name in ("causal_prefill_mha.json", "long_prefills.json")
             for c in json.loads((ROOT / "scripts" / "device-runs" / name)
                                 .read_text())["attention"]]
    a = wide()["attention"]
    mha = [c for c in a if c["dims"]["Lq"] == c["dims"]["Lk"] > 16
           and c["dims"]["Hkv"] == c["dims"]["H"]]
    assert len(mha) >= 10 and len(a) == 64
    assert {c["params"]["causal"] for c in mha} == {True, False}
    built = {tuple(sorted(r.dims.items())) for r in shipped_pack_contents["h200.msgpack"].rows
             if r.op == "attention"}
    drawn = [tuple(sorted(c["dims"].items())) for c in a + added]
    assert built == set(drawn)


def test_build_of_named_variants_measures_only_them_and_merges_into_a_pack(tmp_path,
                                                                            quick_pack):
    from adaptive.cli import main
    path, full = quick_pack
    out = tmp_path / "one.msgpack"
    assert main(["pack", "build", "--shapes", "quick", "--ops", "softmax", "--backend", "host",
                 "--repeats", "3", "--no-progress", "--variants", "host_blocked",
                 "-o", str(out)]) == 0
    one = packs.read_pack(out)
    assert {r.variant for r in one.rows} == {"host_blocked"}
    assert {v.name for v in one.variants} == {"host_blocked"}
    inputs = {compare.row_key(r)[:3] for r in full.rows if r.variant == "host_blocked"}
    assert {compare.row_key(r)[:3] for r in one.rows} == inputs
    merged = compare.merge([full, one])
    assert len(merged.rows) == len(full.rows) + len(one.rows)
    with pytest.raises(ValueError, match=r"variants nope: not host variants of softmax; "
                                         r"known: .*host_blocked"):
        build_pack(load_shapes("quick", ["softmax"]), tmp_path / "x.msgpack", "host",
                   settings=dataclasses.replace(FAST, variants=("host_blocked", "nope")),
                   progress=False)


def test_adopt_takes_the_registered_record_and_keeps_the_rows(tmp_path, capsys):
    from adaptive.cli import main
    old = _variant()
    new = _variant(source=SOFTMAX_SRC + "\n# a comment around the function\n")
    assert new.source_hash != old.source_hash
    pack = packs.new_pack([old], [_row(), _row(time_ms=0.7, cfg={"rows": 2})], HOST_FP)
    got = compare.adopt(pack, [new], ["softmax/pack_softmax"])
    assert got.variants == (new,) and got.rows == pack.rows
    assert got.header["build"]["adopted"] == [{"variant": "softmax/pack_softmax",
                                               "from": old.source_hash,
                                               "to": new.source_hash, "rows_dropped": 0,
                                               "cubins_dropped": 0}]
    # a space narrowed to rows=2: the rows and cubins of rows=1 go, the others stay while
    # the source is the same; with the source changed every cubin goes (its key covers it)
    cubins = [_cubin(), dataclasses.replace(_cubin(), key="cd" * 32, config={"rows": 2})]
    rows = [_row(), _row(time_ms=0.7, cfg={"rows": 2})]
    narrowed = variant_from_dict({**old.to_dict(), "space": {"rows": [2]}}, "softmax")
    got = compare.adopt(packs.new_pack([old], rows, HOST_FP, cubins), [narrowed],
                        ["softmax/pack_softmax"])
    assert [r.config for r in got.rows] == [{"rows": 2}]
    assert [c.config for c in got.cubins] == [{"rows": 2}]
    assert got.header["build"]["adopted"][0]["rows_dropped"] == 1
    assert got.header["build"]["adopted"][0]["cubins_dropped"] == 1
    narrowed_new = variant_from_dict({**new.to_dict(), "space": {"rows": [2]}}, "softmax")
    got = compare.adopt(packs.new_pack([old], rows, HOST_FP, cubins), [narrowed_new],
                        ["softmax/pack_softmax"])
    assert [r.config for r in got.rows] == [{"rows": 2}] and got.cubins == ()
    assert got.header["build"]["adopted"][0]["cubins_dropped"] == 2
    with pytest.raises(ValueError, match=r"softmax/other has no record in the pack; it has "
                                         r"softmax/pack_softmax"):
        compare.adopt(pack, [new], ["softmax/other"])
    with pytest.raises(ValueError, match="softmax/x is not a registered variant"):
        compare.adopt(packs.new_pack([_variant("x")], [], HOST_FP), [new],
                      ["softmax/x"])
    path = tmp_path / "p.msgpack"
    packs.write_pack(pack, path)
    assert main(["pack", "adopt", str(path), "--variants", "softmax/nope",
                 "-o", str(tmp_path / "o.msgpack")]) == 2
    assert "softmax/nope has no record in the pack" in capsys.readouterr().err


def test_adopt_keeps_the_cubins_whose_key_the_registered_source_still_gives():
    """A CUDA variant's cubins are kept where their key recomputes from the registered
    source with the NVRTC that built the pack, and dropped where the source's text changed
    (a comment is enough: the key covers the text)."""
    from adaptive import nvrtc
    from adaptive.kcache import kernel_key
    v = default_registry().get("softmax", "warp_row")
    config = next(v.space.all_configs())
    fp = {"backend": "cuda", "name": "NVIDIA H200", "nvrtc": "nvrtc-13.0"}

    def cubin_of(variant):
        source = nvrtc.full_source(variant.source, "float16",
                                   variant.source_name or f"{variant.name}.cu")
        key = kernel_key(source, nvrtc.macro_options(config) + tuple(variant.options),
                         "sm_90", fp["nvrtc"])
        return packs.Cubin(key, variant.id, config, "sm_90", b"\0" * 64, {})
    pack = packs.new_pack([v], [], fp, [cubin_of(v)])
    assert compare.adopt(pack, [v], [v.id]).cubins == pack.cubins
    changed = dataclasses.replace(v, source=v.source + "\n// a comment\n")
    got = compare.adopt(pack, [changed], [v.id])
    assert got.cubins == () and got.header["build"]["adopted"][0]["cubins_dropped"] == 1
    assert compare.adopt(packs.new_pack([v], [], fp, [cubin_of(changed)]), [changed],
                         [v.id]).cubins != ()


def test_cubins_refresh_compiles_what_a_build_carries_with_the_packs_compiler(tmp_path, capsys):
    """``adaptive pack cubins``: each input's CUDA candidates within 1.5x of its best row
    compiled for the pack's arch and added (rows untouched, a second run adds none), their
    keys the ones a process with that NVRTC looks up; refused for another NVRTC, for a
    variant the pack lacks, and for a host pack."""
    from adaptive import nvrtc
    from adaptive.cli import main
    from adaptive.packs.build import refresh_cubins
    from adaptive.packs.install import recomputed_key
    if not nvrtc.available():
        pytest.skip("NVRTC is not installed here")
    v = default_registry().get("softmax", "warp_row")
    configs = list(v.space.all_configs())[:3]
    fp = {"backend": "cuda", "name": "NVIDIA H200", "cc": 90,
          "nvrtc": nvrtc.compiler_version()}

    def row(config, t):
        return Observation("softmax", {"R": 64, "C": 1000}, "float16", v.name, config, t,
                           features={"log2_R": 6.0, "log2_C": 9.97})
    rows = [row(configs[0], 0.010), row(configs[1], 0.014), row(configs[2], 0.016)]
    pack = packs.new_pack([v], rows, fp)
    got = refresh_cubins(pack)
    assert got.rows == pack.rows
    assert sorted(c.config.items() for c in got.cubins) == sorted(
        c.items() for c in configs[:2]), "the two within 1.5x of the best, not the third"
    assert all(recomputed_key(c, {v.id: v}, fp["nvrtc"]) == c.key and c.arch == "sm_90"
               and c.image for c in got.cubins)
    assert refresh_cubins(got).cubins == got.cubins
    assert got.header["build"]["cubins_refreshed"][-1]["added"] == 2
    path, out = tmp_path / "p.msgpack", tmp_path / "o.msgpack"
    packs.write_pack(packs.new_pack([v], rows, {**fp, "nvrtc": "nvrtc-0.1"}), path)
    assert main(["pack", "cubins", str(path), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"built with nvrtc-0.1, this machine has {fp['nvrtc']}" in err and not out.exists()
    with pytest.raises(ValueError, match="softmax/nope not CUDA variants of the pack"):
        refresh_cubins(pack, ["softmax/nope"])
    with pytest.raises(PackError, match="not a CUDA device"):
        refresh_cubins(packs.new_pack([v], rows, HOST_FP))


# ---- a GPU without a shipped pack of its own ---------------------------------------------------

def _shipped(tmp_path, monkeypatch, devices):
    """Shipped packs of ``devices`` ({file stem: fingerprint}) in place of the real ones."""
    paths = []
    for stem, fp in devices.items():
        path = tmp_path / f"{stem}.msgpack"
        packs.write_pack(packs.new_pack([_variant()], [_row(r=len(paths) + 3)], fp), path)
        paths.append(path)
    monkeypatch.setattr("adaptive.packs.shipped_packs", lambda: sorted(paths))
    return {p.stem: p for p in paths}


H200_FP = {"backend": "cuda", "name": "NVIDIA H200", "cc": 90, "sm_count": 132}
H100_FP = {"backend": "cuda", "name": "NVIDIA H100 80GB HBM3", "cc": 90, "sm_count": 132}
A100_FP = {"backend": "cuda", "name": "NVIDIA A100-SXM4-80GB", "cc": 80, "sm_count": 108}


def test_a_gpu_without_its_own_pack_gets_those_of_its_compute_capability(tmp_path,
                                                                         monkeypatch):
    """An H100 PCIe (cc 9.0, 114 SMs) has no shipped pack: of the H200's and the H100 SXM's
    (cc 9.0, 132 SMs each: a tie in SMs) the H100's, which shares more of its name, serves;
    a GH200 ties on both and gets both; an A100's (cc 8.0) never serves them. A device with
    a pack of its own, one with no pack of its compute capability, and the host get none."""
    got = _shipped(tmp_path, monkeypatch, {"a100": A100_FP, "h100": H100_FP, "h200": H200_FP})
    pcie = {"backend": "cuda", "name": "NVIDIA H100 PCIe", "cc": 90, "sm_count": 114}
    assert install.shipped_packs_for(pcie) == []
    assert install.shipped_packs_like(pcie) == [got["h100"]]
    gh200 = {**pcie, "name": "NVIDIA GH200 480GB", "sm_count": 132}
    assert install.shipped_packs_like(gh200) == [got["h100"], got["h200"]]
    fewer = {**gh200, "sm_count": 120}      # nearer in SMs to neither: both still tie
    assert install.shipped_packs_like(fewer) == [got["h100"], got["h200"]]
    a40 = {"backend": "cuda", "name": "NVIDIA A40", "cc": 86, "sm_count": 84}
    assert install.shipped_packs_like(a40) == []
    a100_40 = {**A100_FP, "name": "NVIDIA A100-SXM4-40GB"}
    assert install.shipped_packs_like(a100_40) == [got["a100"]]
    assert install.shipped_packs_like(H200_FP) == []          # its own pack is shipped
    assert install.shipped_packs_like(HOST_FP) == []
    # the selection benchmark's learned-shipped starts from the same packs
    import types
    from adaptive.bench.selection import _shipped_packs
    on = lambda fp: _shipped_packs(types.SimpleNamespace(fingerprint=lambda: fp))  # noqa: E731
    assert on(gh200) == ([str(got["h100"]), str(got["h200"])], False)
    assert on(pcie) == ([str(got["h100"])], False)
    assert on(H200_FP) == ([str(got["h200"])], True) and on(HOST_FP) == ([], False)


def test_sibling_packs_beside_a_gpus_own_pack_are_asked_for(tmp_path, monkeypatch):
    """ADAPTIVE_SIBLING_PACKS: "auto" loads another device's packs only where the GPU has
    none of its own; "on" also beside its own (every other pack of its compute capability,
    nearest first); "off" never. A bad value names the accepted ones."""
    got = _shipped(tmp_path, monkeypatch, {"a100": A100_FP, "h100": H100_FP, "h200": H200_FP})
    pcie = {"backend": "cuda", "name": "NVIDIA H100 PCIe", "cc": 90, "sm_count": 114}
    assert install.startup_shipped(H200_FP, "auto") == [(got["h200"], True)]
    assert install.startup_shipped(H200_FP, "on") == [(got["h200"], True),
                                                      (got["h100"], False)]
    assert install.startup_shipped(H200_FP, "off") == [(got["h200"], True)]
    assert install.startup_shipped(pcie, "auto") == [(got["h100"], False)]
    assert install.startup_shipped(pcie, "on") == [(got["h100"], False)]
    assert install.startup_shipped(pcie, "off") == []
    assert install.startup_shipped(HOST_FP, "on") == []
    with config.override(sibling_packs="on"):
        assert install.startup_shipped(H100_FP) == [(got["h100"], True), (got["h200"], False)]
    with pytest.raises(ValueError, match=r"ADAPTIVE_SIBLING_PACKS='all': expected one of "
                                         r"auto, on, off"):
        install.startup_shipped(H200_FP, "all")
    assert config.from_env({"ADAPTIVE_SIBLING_PACKS": "on"}).sibling_packs == "on"


def test_the_start_loads_them_down_weighted_and_says_so_once(tmp_path, monkeypatch, caplog):
    """At the start on such a GPU (a GH200), the packs of its compute capability load with
    their rows weighted FOREIGN_WEIGHT, one warning naming them and how to build a pack for
    this GPU (no PackDeviceWarning per pack); a GPU with its own pack loads it alone, weight
    1."""
    import types
    _shipped(tmp_path, monkeypatch, {"a100": A100_FP, "h100": H100_FP, "h200": H200_FP})

    def started(fp):
        reg = Registry(default_registry().variants("softmax"))
        policy = Recording()
        d = Dispatcher("host", registry=reg, policy=policy)   # the rows' recipient
        backend = types.SimpleNamespace(name="cuda", fingerprint=lambda: fp)
        caplog.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            reports = install.load_startup_packs(backend, reg)
        assert d.registry is reg
        return reports, policy
    caplog.set_level("WARNING", logger="adaptive")
    gh200 = {"backend": "cuda", "name": "NVIDIA GH200 480GB", "cc": 90, "sm_count": 132}
    reports, policy = started(gh200)
    assert [Path(r.path).stem for r in reports] == ["h100", "h200"]
    assert all(r.weight == packs.FOREIGN_WEIGHT and not r.same_device for r in reports)
    assert [w for _, w in policy.given] == [packs.FOREIGN_WEIGHT] * 2
    [warning] = [r.message for r in caplog.records if "no shipped pack" in r.message]
    assert "NVIDIA GH200 480GB" in warning and "h100.msgpack, h200.msgpack" in warning
    assert "adaptive pack build --shapes wide" in warning and "ADAPTIVE_PACKS=" in warning
    assert str(packs.FOREIGN_WEIGHT) in warning
    reports, policy = started(H200_FP)
    assert [Path(r.path).stem for r in reports] == ["h200"] and reports[0].weight == 1.0
    assert not [r for r in caplog.records if "no shipped pack" in r.message]
    with config.override(sibling_packs="on"):   # another GPU's beside its own, 0.25
        reports, policy = started(H200_FP)
    assert [(Path(r.path).stem, r.weight) for r in reports] == [
        ("h200", 1.0), ("h100", packs.FOREIGN_WEIGHT)]
    assert not [r for r in caplog.records if "no shipped pack" in r.message]
