"""Helpers for tests that read a variant's own module."""

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
