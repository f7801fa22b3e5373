"""Optional modules are imported once, under one lock, on the miss path."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

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


def test_sixteen_threads_whose_first_launch_imports_torch_all_succeed():
    """A fresh process (torch not imported yet): 16 threads, each its own dispatcher, start
    at once on a variant that needs torch; every result matches the float64 reference."""
    pytest.importorskip("torch", reason="torch is in the test extra")
    code = textwrap.dedent(f'''
        import sys, threading
        import numpy as np
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


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
