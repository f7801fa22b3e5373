"""Variants as data: the loader builds the registry and rejects malformed manifests
with the file and the field named."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from adaptive import ManifestError, config
from adaptive.errors import ExpressionError
from adaptive.expr import Expr
from adaptive.ops import OPS
from adaptive.variants import Registry, builtin_folder, load_folder, load_manifest

GOOD = """
op = "softmax"

[[variant]]
name = "mine"
backend = "host"
language = "python"
source = "mine.py"
entry = "run"
requires = ["C > 1"]
[variant.space]
rows = [1, 2, 4]
constraints = ["rows <= cpu_count * 4"]
"""

# the same variant marked experimental
FLAGGED = GOOD.replace('entry = "run"', 'entry = "run"\nexperimental = true')


def write(tmp_path, text, source=True):
    folder = tmp_path / "softmax"
    folder.mkdir(exist_ok=True)
    (folder / "manifest.toml").write_text(textwrap.dedent(text))
    if source:
        (folder / "mine.py").write_text("def run(x, out, rows):\n    out[...] = x\n")
    return folder / "manifest.toml"


def test_builtin_folder_covers_every_op():
    variants = load_folder(builtin_folder())
    assert {v.op for v in variants} == set(OPS)
    assert all(v.source for v in variants if v.language == "python" and v.backend == "host")


def test_good_manifest_loads(tmp_path):
    (v,) = load_manifest(write(tmp_path, GOOD))
    assert (v.op, v.name, v.entry, v.space.names) == ("softmax", "mine", "run", ("rows",))
    assert "def run" in v.source
    assert [c["rows"] for c in v.space.configs({"cpu_count": 1})] == [1, 2, 4]
    assert v.fits({"C": 5}) and not v.fits({"C": 1})
    registry = Registry(load_folder(tmp_path))
    assert registry.get("softmax", "mine") is not None


@pytest.mark.parametrize("edit,field,problem", [
    (('name = "mine"\n', ""), "variant[0].name", "missing"),
    (('backend = "host"', 'backend = "tpu"'), "variant[0] (mine).backend", "expected one of"),
    (('language = "python"', 'language = "rust"'), "variant[0] (mine).language", "expected one"),
    (('source = "mine.py"', 'source = "nope.py"'), "variant[0] (mine).source", "not found"),
    (('op = "softmax"', 'op = "softmx"'), "op", "did you mean 'softmax'"),
    (('entry = "run"', 'entry = 3'), "variant[0] (mine).entry", "non-empty string"),
    (('rows = [1, 2, 4]', 'rows = []'), "variant[0] (mine)", "non-empty list"),
    (('requires = ["C > 1"]', 'requires = ["__import__(1)"]'), "variant[0] (mine)", "calls"),
    (('requires = ["C > 1"]', 'requires = ["x.y"]'), "variant[0] (mine)", "Attribute"),
    (('constraints = ["rows <= cpu_count * 4"]', 'constraints = ["rows <= zzz"]'),
     "variant[0] (mine)", "neither parameters nor device limits"),
    (('entry = "run"', 'entry = "run"\nlaunchh = 1'), "variant[0] (mine).launchh", "unknown"),
    (('entry = "run"', 'entry = "run"\nexperimental = "yes"'), "variant[0] (mine).experimental",
     "expected true or false, got 'yes'"),
])
def test_bad_manifest_names_file_and_field(tmp_path, edit, field, problem):
    path = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    err = info.value
    assert err.path == str(path) and err.field == field, str(err)
    assert problem in str(err)
    assert str(path) in str(err)


def test_an_experimental_variant_is_run_only_where_named(tmp_path, rng):
    """Not listed as a candidate (a miss never explores it, a pack build measures it only
    where named), found by name, run when pinned; the flag travels in packs."""
    from adaptive.dispatch import Dispatcher
    from adaptive.variants import variant_from_dict
    (v,) = load_manifest(write(tmp_path, FLAGGED))
    assert v.experimental and v.to_dict()["experimental"] is True
    assert variant_from_dict(v.to_dict(), "softmax").experimental
    (plain,) = load_manifest(write(tmp_path, GOOD))
    assert "experimental" not in plain.to_dict()   # packs of other variants are unchanged
    builtin = Registry(load_folder(builtin_folder()))
    registry = Registry([*(x for op in builtin.ops() for x in builtin.variants(op)), v])
    assert v not in registry.variants("softmax") and v not in registry.variants("softmax",
                                                                                "host")
    assert v in registry.variants("softmax", "host", experimental=True)
    assert registry.get("softmax", "mine") is v
    d = Dispatcher("host", registry=registry)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    assert "mine" not in {c.variant.name for c in d.candidates("softmax", x)}
    out = d.launch("softmax", x, variant="mine", config={"rows": 2})
    np.testing.assert_array_equal(out, x)     # mine copies: the pinned call ran it
    from adaptive.packs.build import _candidates
    problem = OPS["softmax"].problem((x,), {})
    named = _candidates(d, OPS["softmax"], problem, ("mine",))
    assert {c.variant.name for c in named} == {"mine"} and len(named) == 3
    assert "mine" not in {c.variant.name for c in _candidates(d, OPS["softmax"], problem, ())}
    with config.override(experimental_variants=True):   # ADAPTIVE_EXPERIMENTAL_VARIANTS=1
        opted = Dispatcher("host", registry=registry)
    assert "mine" in {c.variant.name for c in opted.candidates("softmax", x)}
    assert "mine" not in {c.variant.name for c in d.candidates("softmax", x)}
    from adaptive.observation import Observation   # its measured rows: for the opted only
    row = Observation("softmax", {"R": 8, "C": 16}, "float32", "mine", {"rows": 2}, 0.01,
                      0.001, OPS["softmax"].features(OPS["softmax"].problem((x,), {})))
    for dispatcher, kept in ((d, 0), (opted, 1)):
        dispatcher.add_observations([row])
        assert dispatcher.stats.get("prior_rows", 0) == kept
    assert _candidates(d, OPS["softmax"], OPS["softmax"].problem((x[:, :1].copy(),), {}),
                       ("mine",)) == [], "C = 1: mine serves none (requires C > 1)"


def test_a_pack_measured_while_a_variant_was_experimental_serves_it_once_promoted(tmp_path):
    """The flag decides where a variant is listed, not what it runs: a pack's rows of it,
    measured while it was experimental, are kept once the registered one drops the flag
    (and the registry's flag rules); another source is still another variant."""
    import types
    from adaptive.packs.install import _plan_variants
    (flagged,) = load_manifest(write(tmp_path, FLAGGED))
    (plain,) = load_manifest(write(tmp_path, GOOD))
    builtin = Registry(load_folder(builtin_folder()))
    others = [x for op in builtin.ops() for x in builtin.variants(op)]
    add, present, skipped = _plan_variants(types.SimpleNamespace(variants=[flagged]),
                                           Registry([*others, plain]), "pack.msgpack")
    assert (add, present, skipped) == ([], [flagged], [])
    (changed,) = load_manifest(write(tmp_path, GOOD.replace('"C > 1"', '"C > 2"')))
    assert changed.to_dict() != plain.to_dict()
    add, present, skipped = _plan_variants(types.SimpleNamespace(variants=[flagged]),
                                           Registry([*others, changed]), "pack.msgpack")
    assert (add, present, skipped) == ([], [], ["softmax/mine"])


def test_toml_syntax_error(tmp_path):
    path = write(tmp_path, GOOD + "\n[[variant]\n")
    with pytest.raises(ManifestError, match="<toml>"):
        load_manifest(path)


def test_cuda_variant_needs_grid_and_block(tmp_path):
    folder = tmp_path / "gemm"
    folder.mkdir()
    (folder / "k.cu").write_text("extern \"C\" __global__ void k() {}\n")
    (folder / "manifest.toml").write_text(textwrap.dedent("""
        op = "gemm"
        [[variant]]
        name = "k"
        backend = "cuda"
        language = "cuda"
        source = "k.cu"
        entry = "k"
        [variant.launch]
        grid = ["1"]
    """))
    with pytest.raises(ManifestError, match=r"launch\.block"):
        load_manifest(folder / "manifest.toml")


def test_duplicate_names(tmp_path):
    text = GOOD + GOOD.split("\n", 2)[2].replace('op = "softmax"', "")
    with pytest.raises(ManifestError, match="duplicate names: mine"):
        load_manifest(write(tmp_path, text))


def test_expressions_are_whitelisted():
    assert Expr("ceil_div(M, BM) * BM >= M")(M=10, BM=4) is True
    for bad in ("open('x')", "x.__class__", "[i for i in y]", "lambda: 1", "a[0]"):
        with pytest.raises(ExpressionError):
            Expr(bad)
    with pytest.raises(ExpressionError, match="needs BM"):
        Expr("M % BM")(M=3)


def test_registry_rejects_duplicates_and_notifies(tmp_path):
    (v,) = load_manifest(write(tmp_path, GOOD))
    seen = []

    class Member:          # what the registry tells its dispatchers: the op to re-decide
        def add_observations(self, rows, weight):
            pass

        def forget(self, op):
            seen.append(op)
    registry = Registry()
    member = Member()
    registry.join(member)
    registry.add(v)
    with pytest.raises(ValueError, match="already registered"):
        registry.add(v)
    registry.add(v, replace=True)
    assert seen == ["softmax", "softmax"]



def test_fitting_is_fits_for_each_config_on_every_builtin_variant():
    """Variant.fitting (the input's own requirements evaluated once, then the config's)
    keeps exactly the configs ``fits`` keeps, in order, for every built-in variant on
    inputs of every op: ordinary, odd, bf16, one that fails input-only requirements
    (past int32), and one whose scope lacks a name a requirement reads (fits: False)."""
    from adaptive.limits import SM90
    from adaptive.ops.base import DTYPE_BYTES
    scopes = {
        "gemm": [{"M": 16, "N": 4096, "K": 4096}, {"M": 77, "N": 45, "K": 51}],
        "spmm": [{"M": 4096, "N": 16, "K": 4096, "density": 0.1, "nnz": 1.6e6, "block": 32}],
        "softmax": [{"R": 64, "C": 4096}, {"R": 3, "C": 2 ** 31}],
        "rmsnorm": [{"R": 1, "C": 2048, "eps": 1e-6}, {"R": 5, "C": 333, "eps": 1e-6}],
        "attention": [{"B": 1, "H": 32, "Hkv": 8, "Lq": 1, "Lk": 4096, "D": 128,
                       "causal": True, "scale": None, "masked": 0.0},
                      {"B": 2, "H": 4, "Hkv": 4, "Lq": 77, "Lk": 77, "D": 64,
                       "causal": False, "scale": 0.5, "masked": 1.0, "mask_bool": 1.0,
                       "mask_per_batch": 1.0, "mask_per_head": 0.0}],
    }
    seen = 0
    for v in load_folder(builtin_folder()):
        configs = v.space.configs(SM90)
        for dims in scopes[v.op]:
            for dtype in ("float16", "bfloat16", "float32"):
                scope = {**dims, "dtype": dtype, "itemsize": DTYPE_BYTES[dtype],
                         "kind": "cupy"}
                want = [c for c in configs if v.fits(scope, c)]
                assert v.fitting(scope, configs) == want, (v.id, dims, dtype)
                seen += len(want)
        assert v.fitting({}, configs) == [c for c in configs if v.fits({}, c)]
    assert seen > 1000


class _Counted:
    """A requirement that counts its evaluations (Variant.fitting reads ``names``)."""

    def __init__(self, text: str):
        self.expr, self.names, self.calls = Expr(text), Expr(text).names, 0

    def __call__(self, env):
        self.calls += 1
        return self.expr(env)


def test_fitting_evaluates_a_requirement_once_per_distinct_value_of_its_config_names():
    """Variant.fitting filters the configs one requirement at a time, each evaluated once
    per distinct value of the config parameters it reads: HD == D twice over 48 configs.
    Configs without a name a requirement reads take the input's value, a requirement that
    fails to evaluate (a division by zero) rejects that config alone, and unhashable
    config values are evaluated config by config; the kept configs and their order are
    what ``fits`` keeps."""
    import dataclasses
    from adaptive.space import Space
    reqs = (_Counted("HD == D"), _Counted("Lk // KPS >= 1"), _Counted("D // (4 - W) > 0"),
            _Counted("Lq <= 16"))
    configs = [{"HD": hd, "KPS": kps, "W": w, "S": s}
               for hd in (64, 128) for kps in (64, 128, 256, 512) for w in (1, 2, 4)
               for s in (2, 3)]
    configs += [{"KPS": 64, "W": 1}, {"HD": 128, "KPS": [128], "W": 2}]   # no HD; a list
    v = dataclasses.replace(load_folder(builtin_folder())[0], name="counted", space=Space(),
                            requires=reqs)
    scope = {"D": 128, "Lk": 200, "Lq": 1, "HD": 128}
    got = v.fitting(scope, configs)
    counts = [r.calls for r in reqs]
    want = []
    for c in configs:   # fits, one config at a time (W = 4 divides by zero: rejected)
        env = {**scope, **c}
        if c.get("W") != 4 and isinstance(env["KPS"], int) and env["HD"] == 128 \
                and 200 // env["KPS"] >= 1:
            want.append(c)
    assert got == want and len(want) == 2 * 2 * 2 + 1   # KPS 64, 128; W 1, 2; S 2, 3
    assert got == [c for c in configs if v.fits(scope, c)]
    # HD: 64, 128 and the input's (one config has none); KPS: the ints kept after HD, and
    # the list's config evaluated on its own (it fails: a list // int is an error)
    assert counts[0] == 3 and counts[1] == 4 + 1, counts
    assert counts[2] == 3 and counts[3] == 1, counts   # W: 1, 2, 4 left; Lq: once
    # the same list grown by a config with a name none had: its names are read again
    configs.append({"HD": 128, "KPS": 64, "W": 1, "Lq": 99})
    kept = v.fitting(scope, configs)     # Lq = 99 in the config: "Lq <= 16" rejects it
    assert configs[-1] not in kept and len(kept) == 9
    assert v.fitting(scope, configs) == [c for c in configs if v.fits(scope, c)]


def test_candidates_hash_and_compare_by_variant_and_config_with_the_hash_kept():
    """A candidate's hash is made once (a miss hashes ~100 candidates several times) and is
    the hash of its variant's id and config: two candidates made apart are one dict key,
    and one replaced with another config is another."""
    import dataclasses
    from adaptive.variants import make_candidate
    v, name, values = next((v, name, list(values)) for v in load_folder(builtin_folder())
                           for name, values in v.space.params if len(values) > 1)
    a, b = make_candidate(v, {name: values[0]}), make_candidate(v, {name: values[0]})
    assert a is not b and a == b and hash(a) == hash(b) and len({a: 1, b: 2}) == 1
    assert hash(a) == hash(a) == hash((v.id, a.config_items))
    c = dataclasses.replace(a, config_items=((name, values[-1]),))
    assert c != a and hash(c) == hash((v.id, c.config_items)) != hash(a)
    assert a != "not a candidate" and a == a


def test_a_space_holds_exactly_its_parameters_with_listed_values():
    from adaptive.space import Space
    space = Space.from_dict({"BM": [64, 128], "NWARPS": [2, 4]})
    assert space.holds({"BM": 64, "NWARPS": 4})
    assert not space.holds({"BM": 64, "NWARPS": 8}), "a value the space does not list"
    assert not space.holds({"BM": 64}), "a parameter missing"
    assert not space.holds({"BM": 64, "NWARPS": 2, "PAIR": 1}), "a parameter it lacks"
    assert Space.from_dict({}).holds({})


def test_adaptive_env_names_the_experimental_variants_as_such(tmp_path):
    """(No shipped variant is experimental since run S156 measured flash_wgmma: one from
    ``ADAPTIVE_VARIANT_PATH``.)"""
    from adaptive import envinfo
    from adaptive.variants import reset_shared_registry
    write(tmp_path, FLAGGED)
    reset_shared_registry()
    try:
        with config.override(variant_path=str(tmp_path)):
            listed = envinfo.collect()["variants"]
    finally:
        reset_shared_registry()
    assert "mine (host, experimental)" in listed["softmax"]
    assert "flash_wgmma (cuda)" in listed["attention"]
    assert "flash2_mma (cuda)" in listed["attention"] and "sdpa_torch (cuda)" in \
        listed["attention"]
