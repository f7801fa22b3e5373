"""Property-based fuzzing (hypothesis) of what comes from outside: pack bytes (random,
bit-flipped, and well-hashed packs of random contents) and ``launch`` arguments. Only
AdaptiveError subclasses may escape; no example may hang (a 5 s alarm) or write a file
outside the cache folder."""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import signal
import warnings
from pathlib import Path

import msgpack
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from adaptive import config  # noqa: E402
from adaptive.packs import format as packs
from adaptive.packs import install  # noqa: E402
from adaptive.dispatch import Dispatcher  # noqa: E402
from adaptive.errors import AdaptiveError  # noqa: E402
from adaptive.ops import OPS  # noqa: E402
from adaptive.policy import MeasureEach  # noqa: E402
from adaptive.variants import Registry, default_registry  # noqa: E402

FUZZ = settings(max_examples=25, deadline=2000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BUILTIN = default_registry().variants("softmax") + default_registry().variants("gemm")
HOST_FP = {"backend": "host", "name": "fuzz-cpu", "cpu_count": 2}


class Hang(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: float = 5.0):
    def ring(*_):
        raise Hang(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A watched folder as the working directory, the cache inside it, and a process
    that claims an sm_90 GPU so carried cubins reach the cache's key checks."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "cache").mkdir()
    old_cwd, old_archs = os.getcwd(), install.runnable_archs
    os.chdir(root)
    install.runnable_archs = lambda: frozenset({"sm_90"})
    try:
        with config.override(cache_dir=str(root / "cache")):
            yield root
    finally:
        install.runnable_archs = old_archs
        os.chdir(old_cwd)


def _outside_cache(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if "cache" not in p.relative_to(root).parts and p.name != "in.msgpack"}


def _load_all_ways(path: Path, root: Path) -> None:
    before = _outside_cache(root)
    reg = Registry(BUILTIN)
    with alarm(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for call in (lambda: packs.peek_header(path), lambda: packs.read_pack(path),
                     lambda: install.load_pack(path, registry=reg, fingerprint=HOST_FP)):
            try:
                call()
            except AdaptiveError:
                pass
    assert _outside_cache(root) == before, "loading a pack wrote outside the cache"


def _write_hashed(path: Path, header, body) -> None:
    import hashlib
    import zlib
    hb = msgpack.packb(header, use_bin_type=True)
    bb = zlib.compress(msgpack.packb(body, use_bin_type=True))
    outer = {"magic": packs.MAGIC, "schema": packs.SCHEMA_VERSION,
             "sha256": hashlib.sha256(hb + bb).hexdigest(), "header": hb, "body": bb}
    path.write_bytes(msgpack.packb(outer, use_bin_type=True))


scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.binary(max_size=12) | st.sampled_from(["../../x", "/tmp/x", "ab" * 32,
                                                       "9**9**9**9", "sm_90", "softmax"]))
plain = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8) | st.sampled_from(
                         ["key", "op", "name", "requires", "space", "launch", "source",
                          "dims", "config", "time_ms", "arch", "image"]), inner, max_size=4),
                     max_leaves=12)


@functools.cache     # the manifests parsed once, not once an example (50 registries)
def _host_numpy() -> dict:
    return default_registry().get("softmax", "host_numpy").to_dict()


def _good_parts():
    v = copy.deepcopy(_host_numpy())
    v["name"] = "fuzzed"
    row = {"op": "softmax", "dims": {"R": 3, "C": 7}, "dtype": "float32", "variant": "fuzzed",
           "config": {}, "time_ms": 0.1}
    cubin = {"key": "ab" * 32, "variant": "softmax/warp_row", "config": {"WARPS": 2, "VEC": 4},
             "arch": "sm_90", "image": b"\x7fELF", "resources": {"registers": 8}}
    header = {"schema": packs.SCHEMA_VERSION, "created_s": 1.0, "creator": "fuzz", "key_version": 1,
              "fingerprint": HOST_FP, "build": {}}
    return header, {"variants": [v], "rows": [row], "cubins": [cubin], "failures": []}


@FUZZ
@given(data=st.binary(max_size=600))
def test_random_bytes_are_refused(sandbox, data):
    path = sandbox / "in.msgpack"
    path.write_bytes(data)
    _load_all_ways(path, sandbox)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1,
                      max_size=4))
def test_bit_flipped_pack_is_refused(sandbox, flips):
    path = sandbox / "in.msgpack"
    header, body = _good_parts()
    _write_hashed(path, header, body)
    data = bytearray(path.read_bytes())
    for at, x in flips:
        data[at % len(data)] ^= x
    path.write_bytes(bytes(data))
    _load_all_ways(path, sandbox)


@FUZZ
@given(part=st.sampled_from(["header", "body", "variant", "row", "cubin"]),
       field=st.sampled_from(["schema", "created_s", "fingerprint", "variants", "rows",
                              "cubins", "name", "op", "requires", "space", "launch", "source",
                              "language", "entry", "dims", "config", "time_ms", "key", "arch",
                              "image", "variant", "resources", "new"]),
       value=plain)
def test_well_hashed_pack_with_a_wrong_field_is_refused_or_loaded(sandbox, part, field,
                                                                   value):
    header, body = _good_parts()
    target = {"header": header, "body": body, "variant": body["variants"][0],
              "row": body["rows"][0], "cubin": body["cubins"][0]}[part]
    target[field] = value
    path = sandbox / "in.msgpack"
    _write_hashed(path, header, body)
    _load_all_ways(path, sandbox)


@FUZZ
@given(header=plain, body=plain)
def test_well_hashed_pack_of_random_contents_is_refused(sandbox, header, body):
    path = sandbox / "in.msgpack"
    _write_hashed(path, header, body)
    _load_all_ways(path, sandbox)


# ---- launch arguments -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dispatcher():
    with config.override(sample_every=0):
        return Dispatcher("host", policy=MeasureEach(max_candidates=2))


dtypes = st.sampled_from(["float16", "float32", "float64", "int32", "int8", "bool",
                          "complex64", "object"])


@st.composite
def arrays(draw):
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=4)))
    dtype = draw(dtypes)
    a = np.ones(shape, dtype=dtype) if dtype != "object" else np.empty(shape, object)
    kind = draw(st.sampled_from(["plain", "strided", "masked", "matrix", "scalar"]))
    if kind == "strided" and a.ndim and a.shape[-1] > 1:
        a = a[..., ::2]
    elif kind == "masked":
        a = np.ma.masked_array(a)
    elif kind == "matrix" and a.ndim == 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = np.asmatrix(a)
    elif kind == "scalar":
        a = a.reshape(-1)[:1].reshape(()) if a.size else np.float32(1.0)
    return a


args_strategy = st.lists(arrays() | st.none() | st.integers() | st.floats() | st.text(max_size=4)
                         | st.just(object()) | st.lists(st.floats(), max_size=3),
                         max_size=4)
params_strategy = st.dictionaries(st.sampled_from(["causal", "scale", "out", "variant", "config",
                                                   "bogus", "rows"]),
                                  st.none() | st.booleans() | st.integers(-5, 5)
                                  | st.floats(allow_nan=True) | st.text(max_size=4)
                                  | st.lists(st.integers(), max_size=2)
                                  | st.dictionaries(st.text(max_size=3), st.integers(),
                                                    max_size=2), max_size=3)


@settings(FUZZ, max_examples=100)
@given(op=st.sampled_from([*OPS, "gem", ""]), args=args_strategy, params=params_strategy)
def test_launch_with_random_arguments_raises_only_adaptive_errors(dispatcher, op, args, params):
    with alarm(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = dispatcher.launch(op, *args, **params)
        except AdaptiveError:
            return
    assert result is not None


@FUZZ
@given(shape=st.tuples(st.integers(1, 6), st.integers(1, 9)),
       scale=st.sampled_from([1e-30, 1.0, 1e30]), mask=st.booleans())
def test_launch_on_valid_inputs_is_right(dispatcher, shape, scale, mask):
    """The fuzzer's positive control: real inputs (large logits, masked -inf) are right."""
    x = (np.arange(math.prod(shape), dtype=np.float32).reshape(shape) % 7 - 3) * \
        np.float32(min(scale, 1e4))
    if mask:
        x[:, -1] = -np.inf
    with alarm():
        got = dispatcher.launch("softmax", x)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


@st.composite
def near_valid(draw):
    """Arguments one step from valid: right ranks, random sizes, dtypes and params."""
    op = draw(st.sampled_from(["softmax", "gemm", "attention"]))
    dt = draw(st.sampled_from(["float16", "float32", "float64", "int32", "float32"]))
    n = st.integers(1, 6)
    if op == "softmax":
        shapes = [(draw(n), draw(n))]
    elif op == "gemm":
        shapes = [(draw(n), draw(n)), (draw(n), draw(n))]
    else:
        b, h, lq, lk, d = (draw(n) for _ in range(5))
        shapes = [(b, h, lq, d), (b, h, lk, d), (b, h, lk, draw(st.sampled_from([d, d + 1])))]
    args = [np.full(s, 0.5, dtype=dt) for s in shapes]
    params = draw(params_strategy) if op == "attention" else {}
    return op, args, params


@settings(FUZZ, max_examples=60)
@given(case=near_valid())
def test_launch_near_valid_arguments_raises_only_adaptive_errors(dispatcher, case):
    op, args, params = case
    with alarm(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = dispatcher.launch(op, *args, **params)
        except AdaptiveError:
            return
    ref = OPS[op].reference(*args, **{k: v for k, v in params.items()
                                      if k in ("causal", "scale")})
    np.testing.assert_allclose(np.asarray(result, np.float64), ref, rtol=2e-2, atol=2e-3)


# ---- expressions ------------------------------------------------------------------------------

leaf = (st.integers(-10**6, 10**6).map(str)
        | st.sampled_from(["N", "M", "dtype", "9", "2.5", "'a'", "1e308", "0", "-1", "True"]))
expr_text = st.recursive(
    leaf, lambda inner: st.tuples(inner, st.sampled_from(
        ["**", "*", "<<", ">>", "%", "+", "-", "//", "/", "<", "==", "and", "or", "in", "&"]),
        inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
    | st.tuples(st.sampled_from(["ceil_div", "min", "max", "round_up", "log2", "abs",
                                 "is_pow2", "not "]), inner, inner).map(
        lambda t: f"{t[0]}({t[1]})" if t[0] in ("log2", "abs", "is_pow2", "not ")
        else f"{t[0]}({t[1]}, {t[2]})"),
    max_leaves=10)


@settings(FUZZ, max_examples=80)
@given(text=expr_text)
def test_expression_evaluates_or_refuses_quickly(text):
    from adaptive.errors import ExpressionError
    from adaptive.expr import Expr
    with alarm(1.0):
        try:
            e = Expr(text)
            e(N=3, M=10**6, dtype="float16")
        except ExpressionError:
            pass
