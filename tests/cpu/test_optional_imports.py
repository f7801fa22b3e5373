"""Optional modules are imported once, under one lock, on the miss path."""

import importlib.util
import textwrap
from pathlib import Path

import numpy as np
import pytest
from background import Job

import adaptive
from adaptive.errors import MissingDependencyError
from adaptive.variants import Registry, variant_from_dict

_SOURCE = textwrap.dedent('''
    import numpy as np

    def softmax_torch(x, out):
        import torch   # imported by the dispatcher before the first run
        t = torch.softmax(torch.from_numpy(np.ascontiguousarray(x, np.float64)), dim=1)
        out[...] = t.numpy()
''')


def _variant(name="softmax_torch", needs=("torch",)):
    return variant_from_dict({"name": name, "backend": "host", "language": "python",
                              "entry": "softmax_torch", "source": _SOURCE,
                              "needs": list(needs)}, "softmax")


_SIXTEEN_THREADS = textwrap.dedent(f'''
    import sys, threading
    import numpy as np
    sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
    from test_optional_imports import _variant
    import adaptive
    from adaptive.variants import Registry
    assert "torch" not in sys.modules
    reg = Registry([_variant()])
    barrier = threading.Barrier(16)
    errors, worst = [], []

    def work(seed):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal((7, 33)) * 20).astype(np.float32)
        d = adaptive.Dispatcher(backend="host", registry=reg)
        barrier.wait()
        try:
            out = d.launch("softmax", x, variant="softmax_torch")
        except BaseException as exc:
            errors.append(repr(exc))
            return
        ref = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
        ref /= ref.sum(1, keepdims=True)
        worst.append(float(np.abs(out - ref).max()))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print("errors", errors)
    print("results", len(worst), max(worst) if worst else None)
    assert not errors and len(worst) == 16 and max(worst) < 1e-6
''')

# a fresh process, so that torch is not imported yet; started with the session
BACKGROUND = {"sixteen-threads-import-torch": Job(lambda folder, config: [
    "-c", _SIXTEEN_THREADS], cpu_s=3.0, nice=19, timeout_s=300)} if importlib.util.find_spec("torch") \
    else {}


def test_sixteen_threads_whose_first_launch_imports_torch_all_succeed(background):
    """A fresh process (torch not imported yet): 16 threads, each its own dispatcher, start
    at once on a variant that needs torch; every result matches the float64 reference."""
    pytest.importorskip("torch", reason="torch is in the test extra")
    done = background("sixteen-threads-import-torch")
    assert done.rc == 0, done.report()
    assert "results 16 " in done.stdout, done.report()


def test_a_missing_optional_module_fails_only_the_variants_that_need_it():
    reg = Registry([_variant("softmax_cupti", needs=("cupti",))])
    if adaptive.optional.available("cupti"):
        pytest.skip("cupti-python is installed here: nothing is missing")
    d = adaptive.Dispatcher(backend="host", registry=reg)
    x = np.random.default_rng(1).standard_normal((4, 9)).astype(np.float32)
    with pytest.raises(MissingDependencyError, match=r"softmax/softmax_cupti.*'cupti'.*"
                                                     r"adaptive-dispatch\[cupti\]"):
        d.launch("softmax", x, variant="softmax_cupti")
    # unpinned, the candidate is left out and the built-in host variants serve the call
    out = adaptive.Dispatcher(backend="host").launch("softmax", x)
    ref = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(out, ref / ref.sum(1, keepdims=True), rtol=1e-5)
    with pytest.raises(adaptive.NoCandidateError, match="softmax_cupti"):
        d.launch("softmax", x)


def test_needs_names_only_known_optional_modules():
    with pytest.raises(adaptive.ManifestError, match=r"needs.*optional modules"):
        _variant(needs=("os",))


# ---- the tensor path: torch entries, held plans -------------------------------------------

_TORCH_SOURCE = textwrap.dedent('''
    def gemm_numpy(a, b, out):
        out[...] = a @ b

    def gemm_torch(a, b, out=None):
        import torch
        return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)
''')


def _torch_dispatcher():
    v = variant_from_dict({"name": "torch_mm", "backend": "host", "language": "python",
                           "entry": "gemm_numpy", "torch_entry": "gemm_torch",
                           "source": _TORCH_SOURCE}, "gemm")
    with adaptive.config.override(sample_every=0):
        return adaptive.Dispatcher(backend="host", registry=Registry([v]))


def test_tensor_callers_run_the_torch_entry_with_their_tensors():
    torch = pytest.importorskip("torch", reason="torch is in the test extra")
    d = _torch_dispatcher()
    a, b = torch.randn(5, 7, dtype=torch.float32), torch.randn(7, 3, dtype=torch.float32)
    out = d.launch("gemm", a, b)
    assert isinstance(out, torch.Tensor) and out.shape == (5, 3)
    torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)
    given = torch.full((5, 3), float("nan"), dtype=torch.float32)
    assert d.launch("gemm", a, b, out=given) is given
    torch.testing.assert_close(given.double(), a.double() @ b.double(), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(adaptive.InputValueError, match=r"out has shape \(3, 5\).*expected "
                                                      r"shape torch.Size\(\[5, 3\]\)"):
        d.launch("gemm", a, b, out=torch.empty(3, 5, dtype=torch.float32))
    # NumPy callers of the same variant get its NumPy entry
    x, y = a.numpy(), b.numpy()
    np.testing.assert_allclose(d.launch("gemm", x, y), x @ y)


@pytest.mark.usefixtures("decided_on_the_miss")
def test_a_held_plan_runs_without_the_key_and_goes_stale_when_replaced():
    torch = pytest.importorskip("torch", reason="torch is in the test extra")
    d = _torch_dispatcher()
    a, b = torch.randn(4, 6, dtype=torch.float32), torch.randn(6, 2, dtype=torch.float32)
    plan = d.plan("gemm", a, b)
    assert not plan.stale and not plan.provisional
    a2 = torch.randn(4, 6, dtype=torch.float32)
    torch.testing.assert_close(plan.run((a2, b), None).double(), a2.double() @ b.double(),
                               rtol=1e-5, atol=1e-5)
    assert d.plan("gemm", a2, b) is plan                  # one input class, one plan
    d.forget_key(plan.key)
    assert plan.stale and d.plan("gemm", a, b) is not plan
    fresh = d.plan("gemm", a, b)
    d.forget("gemm")
    assert fresh.stale
