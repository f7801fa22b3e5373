"""Helpers for tests that read a variant's own module, or make variants of their own."""

from __future__ import annotations


def variant_module(op: str, filename: str):
    """A built-in variant's source file run as a module of its own (a staged variant not
    in a manifest, or one whose helpers a test reads: its plans, its module state)."""
    import importlib.util

    from adaptive.variants import builtin_folder
    path = builtin_folder() / op / filename
    spec = importlib.util.spec_from_file_location(f"{op}_{path.stem}_module", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def softmax_pair():
    """A registry of two host softmax variants computing as ``host_numpy`` does: ``plain``
    the baseline (what the plain program runs) and ``quick`` (a test gives them costs)."""
    from adaptive.variants import Registry, default_registry, variant_from_dict
    host = default_registry().get("softmax", "host_numpy")
    return Registry([variant_from_dict({"name": name, "backend": "host", "language": "python",
                                        "entry": host.entry, "source": host.source,
                                        "baseline": name == "plain"}, "softmax")
                     for name in ("plain", "quick")])
