"""adaptive: runtime adaptive GPU kernel dispatch with profiler feedback.

    >>> import numpy as np, adaptive
    >>> a, b = np.random.rand(256, 128).astype("f4"), np.random.rand(128, 64).astype("f4")
    >>> c = adaptive.launch("gemm", a, b)          # picks, runs, remembers
    >>> adaptive.candidates("gemm", a, b)           # what it chose among

The public API is this module's ``__all__``; everything else is internal.
"""

from __future__ import annotations

from adaptive import config
from adaptive.dispatch import Dispatcher, Plan
from adaptive.errors import (AdaptiveError, BackendUnavailableError, CompileError,
                             InputTypeError, InputValueError, ManifestError,
                             MissingDependencyError, NoCandidateError, PackError,
                             UnknownNameError, VariantRunError)
from adaptive.ops import OPS, SparseWeight
from adaptive.policy import Decision, MeasureEach
from adaptive.runtime import launch, reset_defaults, shared_registry
from adaptive.variants import Candidate, Registry, Variant, load_folder

# the rest of the public API loads on first use: `import adaptive` imports only what a
# warm adaptive.launch needs (name -> module defining it)
_LAZY = {
    "counter_log": "adaptive.counterlog.writer",
    "serve_metrics": "adaptive.metrics",
    "count_regeneration_request": "adaptive.metrics",
    "load_pack": "adaptive.packs.install",
    "LoadReport": "adaptive.packs.install",
    "Explanation": "adaptive.policy.explain",
    "explain": "adaptive.policy.explain",
    "Learned": "adaptive.policy.learned",
    "unbounded_exploration": "adaptive.policy.base",
    "verify": "adaptive.regen.source",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'adaptive' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


from adaptive.version import __version__  # noqa: E402 (after the lazy table)


def candidates(op: str, *args, **params) -> list[Candidate]:
    """The candidates (variant + config) that fit this input on its default dispatcher.

    Example:
        >>> [c.label for c in adaptive.candidates("softmax", x)]
        ['host_numpy', 'host_blocked[rows=8]', ...]
    """
    from adaptive.runtime import default_dispatcher
    return default_dispatcher(args).candidates(op, *args, **params)


__all__ = [
    "AdaptiveError", "BackendUnavailableError", "Candidate", "CompileError", "Decision",
    "Dispatcher", "InputTypeError", "InputValueError", "ManifestError", "MeasureEach",
    "NoCandidateError", "OPS", "Plan", "Registry", "SparseWeight", "UnknownNameError",
    "Variant", "VariantRunError", "__version__", "candidates", "config",
    "count_regeneration_request", "counter_log", "launch",
    "LoadReport", "MissingDependencyError", "PackError", "load_pack",
    "load_folder", "reset_defaults", "serve_metrics", "shared_registry",
    "Explanation", "Learned", "explain", "unbounded_exploration",
    "verify",
]
