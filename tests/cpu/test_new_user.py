"""What a new user meets first: policies by name and bad inputs refused before any
variant runs, each error naming what was expected and what was given."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest

import adaptive
from adaptive import InputTypeError, InputValueError, UnknownNameError
from adaptive.policy.learned import Learned
from adaptive.policy import MeasureEach


@pytest.fixture(scope="module")
def d():
    return adaptive.Dispatcher(backend="host", policy="measure-each")


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name,cls", [("learned", Learned), ("measure-each", MeasureEach)])
def test_policy_by_name_decides_and_computes(rng, name, cls):
    d = adaptive.Dispatcher(backend="host", policy=name)
    assert isinstance(d.policy, cls)
    a, b = f32(rng, 33, 17), f32(rng, 17, 9)
    np.testing.assert_allclose(d.launch("gemm", a, b), a.astype(np.float64) @ b, rtol=1e-4,
                               atol=1e-5)
    assert d.decision("gemm", a, b) is not None


def test_unknown_policy_name_suggests_nearest():
    with pytest.raises(UnknownNameError, match="unknown policy 'lerned'; did you mean 'learned'"):
        adaptive.Dispatcher(backend="host", policy="lerned")


@pytest.mark.parametrize("policy", [MeasureEach, 3])
def test_policy_must_be_a_name_or_an_instance(policy):
    with pytest.raises(InputTypeError, match=r"policy must be a name \(learned, measure-each, "
                                             r"first\) or a policy instance.*got "):
        adaptive.Dispatcher(backend="host", policy=policy)


def test_config_must_be_a_mapping(d, rng):
    with pytest.raises(InputTypeError, match=r"config must be a mapping such as \{'threads': 2\}"
                                             r", got list \[\('threads', 2\)\]"):
        d.launch("gemm", f32(rng, 4, 4), f32(rng, 4, 4), variant="host_blas",
                 config=[("threads", 2)])


def test_config_value_must_be_a_scalar(d, rng):
    with pytest.raises(InputTypeError, match=r"config threads for 'host_blas' must be one of "
                                             r"\[1, 2, .*\], got ndarray"):
        d.launch("gemm", f32(rng, 4, 4), f32(rng, 4, 4), variant="host_blas",
                 config={"threads": np.array(1)})


@pytest.mark.parametrize("pinned", [False, True], ids=["chosen", "pinned"])
@pytest.mark.parametrize("value,got", [(np.array(0.5), r"ndarray of shape \(\)"),
                                       (np.ones(3), r"ndarray of shape \(3,\)"),
                                       ([0.5], "list"), (True, "bool"), ("0.5", "str")])
def test_params_must_be_scalars_of_the_documented_types(d, rng, value, got, pinned):
    q = f32(rng, 1, 2, 3, 8)
    extra = {"variant": "host_materialised"} if pinned else {}
    with pytest.raises(InputTypeError, match=rf"attention: parameter 'scale' must be a scalar "
                                             rf"float or int, got {got}$"):
        d.launch("attention", q, q, q, scale=value, **extra)


def test_numpy_scalar_params_are_their_python_values(d, rng):
    q, k, v = f32(rng, 1, 2, 3, 8), f32(rng, 1, 2, 5, 8), f32(rng, 1, 2, 5, 8)
    op = adaptive.OPS["attention"]
    got = d.launch("attention", q, k, v, scale=np.float32(0.25), causal=np.bool_(True))
    np.testing.assert_allclose(got, op.reference(q, k, v, causal=True, scale=0.25), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), float("-inf")])
def test_attention_refuses_non_finite_scale(d, rng, scale):
    q = f32(rng, 1, 2, 3, 8)
    with pytest.raises(InputValueError, match=r"parameter 'scale' must be a finite number "
                                              rf"\(None: 1/sqrt\(D\)\), got {scale}"):
        d.launch("attention", q, q, q, scale=scale)


@pytest.mark.parametrize("scale", [0.0, -0.7])
def test_attention_zero_and_negative_scale_are_the_formula(d, rng, scale):
    """The op documents them: 0 weighs the visible keys equally, negative is as written."""
    q, k, v = f32(rng, 1, 2, 4, 8), f32(rng, 1, 2, 6, 8), f32(rng, 1, 2, 6, 8)
    ref = adaptive.OPS["attention"].reference(q, k, v, causal=True, scale=scale)
    np.testing.assert_allclose(d.launch("attention", q, k, v, causal=True, scale=scale), ref,
                               rtol=1e-4, atol=1e-5)


def test_unknown_parameter_of_an_op_without_parameters(d, rng):
    with pytest.raises(UnknownNameError, match="unknown parameter of gemm 'alpha'; gemm takes "
                                               "no parameters$"):
        d.launch("gemm", f32(rng, 3, 3), f32(rng, 3, 3), alpha=2.0)
    err = UnknownNameError("parameter of gemm", "alpha", [], none="gemm takes no parameters")
    assert str(pickle.loads(pickle.dumps(err))) == str(err)   # the verifier pickles errors


def test_unknown_config_parameter_of_a_variant_without_config(d, rng):
    with pytest.raises(UnknownNameError, match="'host_numpy' takes no config"):
        d.launch("softmax", f32(rng, 3, 3), variant="host_numpy", config={"rows": 8})


@pytest.fixture(scope="module")
def w():
    rng = np.random.default_rng(7)
    return adaptive.SparseWeight(np.where(rng.random((16, 16)) < 0.2, 1.0, 0.0)
                                 .astype(np.float32))


@pytest.mark.parametrize("op,where,match", [
    ("gemm", 0, r"gemm: argument 'a' must be a dense array .*got an adaptive.SparseWeight; "
                r"for a sparse weight times a dense matrix use adaptive.launch\('spmm', w, b\)"),
    ("gemm", 1, r"gemm: argument 'b' must be a dense array .*got an adaptive.SparseWeight$"),
    ("softmax", 0, r"softmax: argument 'x' must be a dense array .*got an adaptive.SparseWeight"),
    ("spmm", 1, r"spmm: argument 'b' must be a dense array .*got an adaptive.SparseWeight"),
], ids=["gemm-a", "gemm-b", "softmax-x", "spmm-b"])
@pytest.mark.parametrize("call", ["launch", "candidates"])
def test_sparse_weight_where_a_dense_array_is_expected(d, rng, w, op, where, match, call):
    args = [w if name in adaptive.OPS[op].sparse else f32(rng, 16, 16)
            for name in adaptive.OPS[op].arrays]
    args[where] = w
    with pytest.raises(InputTypeError, match=match):
        getattr(d, call)(op, *args)


def test_spmm_still_wants_a_sparse_weight(d, rng):
    with pytest.raises(InputTypeError, match=r"spmm: argument 'w' must be an "
                                             r"adaptive.SparseWeight, got ndarray"):
        d.launch("spmm", f32(rng, 4, 4), f32(rng, 4, 4))


@pytest.mark.parametrize("pinned", [False, True], ids=["chosen", "pinned"])
def test_read_only_out_is_refused_before_the_variant_runs(d, rng, pinned):
    a, b = f32(rng, 5, 4), f32(rng, 4, 3)
    out = np.full((5, 3), 7.0, np.float32)
    out.flags.writeable = False
    extra = {"variant": "host_blas", "config": {"threads": 1}} if pinned else {}
    with pytest.raises(InputValueError, match=r"out is read-only; pass a writeable array of "
                                              r"shape \(5, 3\), dtype float32"):
        d.launch("gemm", a, b, out=out, **extra)
    assert (out == 7.0).all()


def test_bad_out_while_exploring_blames_the_caller_not_a_candidate(rng, caplog):
    d = adaptive.Dispatcher(backend="host", policy="learned")
    a, b = f32(rng, 64, 32), f32(rng, 32, 16)
    d.launch("gemm", a, b)
    key = adaptive.OPS["gemm"].key((a, b), {})
    assert d._plans[key].provisional, "the learned policy should still be exploring this key"
    with caplog.at_level(logging.WARNING, logger="adaptive"):
        for _ in range(4):   # every candidate of the rotation meets the bad out=
            with pytest.raises(InputValueError, match=r"out has shape \(3, 3\)"):
                d.launch("gemm", a, b, out=np.empty((3, 3), np.float32))
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    state = d.policy.state(d._plans[key].class_key)
    assert not any(np.isinf(t) for ts in state.observed.values() for t in ts)


# ---- the command line -----------------------------------------------------------------------

def test_pack_show_prints_the_file_sha256_as_sha256sum_does(tmp_path, capsys):
    import hashlib

    from adaptive.cli import main
    from adaptive.packs.format import new_pack, write_pack
    path = tmp_path / "p.msgpack"
    content = write_pack(new_pack([], [], {"backend": "host"}), path)
    assert main(["pack", "show", str(path)]) == 0
    text = capsys.readouterr().out
    whole = hashlib.sha256(path.read_bytes()).hexdigest()
    assert whole != content
    assert f"file sha256   {whole}  (as sha256sum prints it)" in text
    assert f"content hash  {content}  (of header + body; verified)" in text


def test_version_and_help_read_as_plain_text(capsys):
    from adaptive.cli import COMMANDS, main
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"adaptive-dispatch {adaptive.__version__} ")
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "`" not in text and all(name in text for name in COMMANDS)


def test_explain_command_ranks_the_candidates_of_a_shape(capsys):
    from adaptive.cli import main
    assert main(["explain", "softmax", "--shape", "R=7,C=33", "--backend", "host",
                 "--policy", "measure-each"]) == 0
    text = capsys.readouterr().out
    labels = [c.label for c in adaptive.Dispatcher("host").candidates(
        "softmax", np.ones((7, 33), np.float32))]
    assert text.startswith("softmax R=7, C=33 float32: committed (policy measure-each)")
    assert all(label in text for label in labels) and " chosen" in text


@pytest.mark.parametrize("argv,message", [
    (["gemm", "--shape", "M=4,N=4"], "gemm shape names ['M', 'N']; expected exactly "
                                     "['K', 'M', 'N']"),
    (["gemm", "--shape", "M=4,N=4,K=x"], "shape part 'K=x': expected NAME=POSITIVE_INT"),
    (["attention", "--shape", "B=1,H=1,Lq=2,Lk=2,D=8", "--dtype", "float64"],
     "--dtype float64 is not a dtype of attention; expected one of float16, bfloat16, "
     "float32"),
])
def test_explain_command_refuses_bad_shapes_in_one_line(capsys, argv, message):
    from adaptive.cli import main
    assert main(["explain", *argv, "--backend", "host"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaptive explain: ") and message in err and err.count("\n") == 1


def test_torch_example_without_torch_says_which_extra_and_exits_0(monkeypatch, capsys):
    import pathlib
    import runpy
    import sys
    example = pathlib.Path(__file__).parents[2] / "examples" / "torch_interop.py"
    monkeypatch.setitem(sys.modules, "torch", None)     # import torch now fails
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(example), run_name="__main__")
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "pip install 'adaptive-dispatch[llm]'" in out


class _Runtime:
    def __init__(self, count):
        self.count = count

    def getDeviceCount(self):   # noqa: N802 (CuPy's name)
        if isinstance(self.count, Exception):
            raise self.count
        return self.count


@pytest.mark.parametrize("cupy_count,device_files,reason", [
    (None, False, "no CUDA GPU on this machine"),
    (RuntimeError("CUDA driver version is insufficient"), False,
     "no CUDA GPU on this machine"),
    (RuntimeError("CUDA driver version is insufficient"), True,
     "CUDA is not usable here (RuntimeError: CUDA driver version is insufficient)"),
    (None, True, "CuPy is not installed (pip install 'adaptive-dispatch[cuda13]')"),
    (2, False, None),                     # CuPy sees devices: the GPU tests run
])
def test_gpu_tests_skip_with_one_reason(monkeypatch, cupy_count, device_files, reason):
    import importlib.util
    import pathlib
    import sys
    import types
    path = pathlib.Path(__file__).parents[1] / "gpu" / "conftest.py"
    spec = importlib.util.spec_from_file_location("gpu_conftest_under_test", path)
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    fake = None if cupy_count is None else types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=_Runtime(cupy_count)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(conftest, "has_gpu_device_files", lambda: device_files)
    assert conftest.gpu_probe() == reason
