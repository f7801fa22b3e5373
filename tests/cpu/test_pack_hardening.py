"""Pack contents are data: crafted keys, expression bombs, wrong-shape headers and foreign
cubins are refused (or ignored) within a second and write nothing outside the cache."""

from __future__ import annotations

import hashlib
import zlib
import time
import warnings
from pathlib import Path

import msgpack
import pytest

from adaptive import config
from adaptive.packs import format as packs
from adaptive.packs import install
from adaptive.errors import ExpressionError, PackError
from adaptive.expr import Expr
from adaptive.kcache import KernelCache
from adaptive.packs import shipped_packs
from adaptive.variants import Registry, default_registry

HOST_FP = {"backend": "host", "name": "test-cpu", "cpu_count": 2}
SRC = "def f(x, out):\n    out[...] = x\n"


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _variant_dict(**changes):
    d = {"name": "crafted", "op": "softmax", "backend": "host", "language": "python",
         "entry": "f", "source": SRC, "space": {"rows": [1]}}
    d.update(changes)
    return d


def _write(path: Path, header: dict | None = None, body: dict | None = None) -> Path:
    """A pack with a valid hash around whatever header and body are given."""
    header = header if header is not None else {
        "schema": packs.SCHEMA_VERSION, "created_s": 1.0, "creator": "test",
        "key_version": 1, "fingerprint": HOST_FP, "build": {}}
    body = body if body is not None else {"variants": [], "rows": [], "cubins": [],
                                          "failures": []}
    hb = msgpack.packb(header, use_bin_type=True)
    bb = zlib.compress(msgpack.packb(body, use_bin_type=True))
    outer = {"magic": packs.MAGIC, "schema": packs.SCHEMA_VERSION,
             "sha256": hashlib.sha256(hb + bb).hexdigest(), "header": hb, "body": bb}
    path.write_bytes(msgpack.packb(outer, use_bin_type=True))
    return path


def _cubin(key: str) -> dict:
    return {"key": key, "variant": "softmax/warp_row", "config": {"WARPS": 2, "VEC": 4},
            "arch": "sm_90", "image": b"\x7fELF" + bytes(60), "resources": {"registers": 8}}


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A cache folder inside a watched folder; the process's GPUs claim sm_90, so only
    the key checks stand between a crafted cubin and the disk."""
    monkeypatch.setattr(install, "runnable_archs", lambda: frozenset({"sm_90"}))
    watched = tmp_path / "watched"
    (watched / "cache").mkdir(parents=True)
    monkeypatch.chdir(watched)
    with config.override(cache_dir=str(watched / "cache")):
        yield watched


def _refused(path: Path, match: str, watched: Path) -> PackError:
    before = _files(watched)
    reg = Registry(default_registry().variants("softmax"))
    t0 = time.perf_counter()
    with pytest.raises(PackError, match=match) as info:
        install.load_pack(path, registry=reg, fingerprint=HOST_FP)
    assert time.perf_counter() - t0 < 1.0
    assert _files(watched) == before, "a refused pack wrote files"
    return info.value


@pytest.mark.parametrize("key", ["../../../../escaped", "/tmp/adaptive-absolute-key",
                                 "AB" * 32, "ab" * 31 + "a/", "ab" * 33, ""],
                         ids=["traversal", "absolute", "uppercase", "slash", "long", "empty"])
def test_cubin_key_that_is_not_a_digest_is_refused(sandbox, key):
    path = _write(sandbox / "k.msgpack", body={"variants": [], "rows": [],
                                               "cubins": [_cubin(key)], "failures": []})
    err = _refused(path, "sha256 hex digest", sandbox)
    assert "softmax/warp_row" in str(err)
    assert not Path("/tmp/adaptive-absolute-key.cubin").exists()


def test_kernel_cache_never_joins_a_foreign_key(tmp_path):
    cache = KernelCache(tmp_path)
    for key in ("../x", "/etc/x", "ab" * 31 + "zz"):
        assert cache.get(key) is None
        with pytest.raises(ValueError, match="64 lowercase hex digits"):
            cache.put(key, b"x", {})
    assert _files(tmp_path) == set()


def test_well_formed_key_that_does_not_recompute_is_not_cached(sandbox, caplog):
    """A digest-shaped key of no compilation here (another source) is never written."""
    nvrtc = pytest.importorskip("adaptive.nvrtc")
    if not nvrtc.available():
        pytest.skip("NVRTC (cuda.bindings) is not installed")
    path = _write(sandbox / "k.msgpack", body={"variants": [], "rows": [],
                                               "cubins": [_cubin("ab" * 32)], "failures": []})
    reg = Registry(default_registry().variants("softmax"))
    install.load_pack(path, registry=reg, fingerprint=HOST_FP)
    assert not any(p.is_file() for p in (sandbox / "cache").rglob("*"))
    assert "does not match its variant" in caplog.text


@pytest.mark.parametrize("where", ["requires", "constraint", "launch", "names"])
def test_expression_bomb_is_refused_at_load_naming_the_variant(sandbox, where):
    bomb = "9**9**9**9"
    d = _variant_dict()
    if where == "requires":
        d["requires"] = [f"C > {bomb}"]
    elif where == "constraint":
        d["space"] = {"rows": [1], "constraints": [f"rows < {bomb}"]}
    elif where == "launch":
        d.update(language="cuda", source="__global__ void f() {}",
                 launch={"grid": [bomb], "block": ["1"]}, backend="cuda")
    else:
        d["requires"] = ["'%0999999999d' % 1 == C"]
    path = _write(sandbox / "b.msgpack", body={"variants": [d], "rows": [], "cubins": [],
                                               "failures": []})
    err = _refused(path, "crafted", sandbox)
    assert "expression" in str(err)
    with pytest.raises(PackError, match="crafted"):
        packs.read_pack(path)     # `pack show` reads this way


def test_expression_with_names_is_bounded_when_evaluated():
    e = Expr("C ** K")          # no constant part to refuse at parse time
    t0 = time.perf_counter()
    with pytest.raises(ExpressionError, match="exponent .* beyond"):
        e(C=9, K=9**9)
    with pytest.raises(ExpressionError, match="needs numbers"):
        Expr("s * C")(s="x", C=10**9)
    with pytest.raises(ExpressionError, match="bits"):
        Expr("1 << C")(C=10**6)
    assert time.perf_counter() - t0 < 1.0
    assert Expr("B * H * Lq * Lk <= 2 ** 30")(B=1, H=2, Lq=3, Lk=4) is True
    assert Expr("round_up(N, 8) % 5")(N=13) == 1


def test_expression_budgets():
    with pytest.raises(ExpressionError, match="characters"):
        Expr("1 + " * 400 + "1")
    with pytest.raises(ExpressionError, match="syntax nodes"):
        Expr(" + ".join(["C"] * 200))
    with pytest.raises(ExpressionError, match="ZeroDivisionError"):
        Expr("C // 0")(C=3)
    with pytest.raises(ExpressionError, match="not a number or string"):
        Expr("C > None")


def test_space_too_large_is_refused(sandbox):
    d = _variant_dict(space={f"p{i}": list(range(10)) for i in range(8)})
    path = _write(sandbox / "s.msgpack", body={"variants": [d], "rows": [], "cubins": [],
                                               "failures": []})
    _refused(path, "config space has more than", sandbox)


WRONG_HEADERS = {
    "list": [1, 2, 3],
    "string fingerprint": {"schema": 1, "created_s": 1.0, "creator": "x", "fingerprint": "x"},
    "no creator": {"schema": 1, "created_s": 1.0, "fingerprint": {}},
    "created_s string": {"schema": 1, "created_s": "soon", "creator": "x", "fingerprint": {}},
    "created_s huge": {"schema": 1, "created_s": 1e300, "creator": "x", "fingerprint": {}},
    "nested fingerprint": {"schema": 1, "created_s": 1.0, "creator": "x",
                           "fingerprint": {"backend": {"a": 1}}},
    "bool schema": {"schema": True, "created_s": 1.0, "creator": "x", "fingerprint": {}},
    "counts of strings": {"schema": 1, "created_s": 1.0, "creator": "x", "fingerprint": {},
                          "counts": {"rows": "many"}},
}


@pytest.mark.parametrize("name", list(WRONG_HEADERS))
def test_wrong_shape_header_is_refused_by_every_reader(sandbox, name):
    path = _write(sandbox / "h.msgpack", header=WRONG_HEADERS[name])
    with pytest.raises(PackError, match="header"):
        packs.peek_header(path)
    with pytest.raises(PackError, match="header"):
        packs.read_pack(path)
    _refused(path, "header", sandbox)


def test_pack_show_of_a_wrong_shape_header_prints_an_error_not_a_traceback(tmp_path, capsys):
    from adaptive.cli import main
    path = _write(tmp_path / "h.msgpack", header=WRONG_HEADERS["string fingerprint"])
    assert main(["pack", "show", str(path)]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "header field 'fingerprint'" in err


def test_shipped_gpu_pack_on_a_machine_without_its_gpu_writes_no_cubin(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(install, "runnable_archs", lambda: frozenset())   # this machine
    [h200] = [p for p in shipped_packs() if p.name == "h200.msgpack"]
    assert packs.read_pack(h200).cubins, "the shipped pack carries cubins"
    reg = Registry(default_registry().variants("softmax"))
    with config.override(cache_dir=str(tmp_path / "cache")), warnings.catch_warnings():
        warnings.simplefilter("ignore", install.PackDeviceWarning)
        install.load_pack(h200, registry=reg, fingerprint=HOST_FP)
    assert not (tmp_path / "cache").exists() or _files(tmp_path / "cache") == set()


def test_runnable_archs_is_empty_without_a_gpu():
    install.runnable_archs.cache_clear()
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed: the answer depends on the GPUs here")
    except ImportError:
        assert install.runnable_archs() == frozenset()
