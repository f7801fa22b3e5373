"""adaptive: runtime adaptive GPU kernel dispatch with profiler feedback.

    >>> import numpy as np, adaptive
    >>> a, b = np.random.rand(256, 128).astype("f4"), np.random.rand(128, 64).astype("f4")
    >>> c = adaptive.launch("gemm", a, b)          # picks, runs, remembers
    >>> adaptive.candidates("gemm", a, b)           # what it chose among

The public API is this module's ``__all__``; everything else is internal.
"""

from __future__ import annotations

from adaptive import config
from adaptive.counterlog import counter_log
from adaptive.dispatch import Dispatcher, Plan, launch, reset_defaults, shared_registry
from adaptive.errors import (AdaptiveError, BackendUnavailableError, CompileError,
                             InputTypeError, InputValueError, ManifestError, NoCandidateError,
                             UnknownNameError, VariantRunError)
from adaptive.ops import OPS, SparseWeight
from adaptive.metrics import count_regeneration_request, serve_metrics
from adaptive.errors import MissingDependencyError, PackError
from adaptive.pack import LoadReport, load_pack
from adaptive.explain import Explanation, explain
from adaptive.learned import Learned
from adaptive.policy import Decision, MeasureEach
from adaptive.variants import Candidate, Registry, Variant, load_folder
from adaptive.regen.source import verify

__version__ = "0.1.0"


def candidates(op: str, *args, **params) -> list[Candidate]:
    """The candidates (variant + config) that fit this input on its default dispatcher.

    Example:
        >>> [c.label for c in adaptive.candidates("softmax", x)]
        ['host_numpy', 'host_blocked[rows=8]', ...]
    """
    from adaptive.dispatch import default_dispatcher
    return default_dispatcher(args).candidates(op, *args, **params)


__all__ = [
    "AdaptiveError", "BackendUnavailableError", "Candidate", "CompileError", "Decision",
    "Dispatcher", "InputTypeError", "InputValueError", "ManifestError", "MeasureEach",
    "NoCandidateError", "OPS", "Plan", "Registry", "SparseWeight", "UnknownNameError",
    "Variant", "VariantRunError", "__version__", "candidates", "config",
    "count_regeneration_request", "counter_log", "launch",
    "LoadReport", "MissingDependencyError", "PackError", "load_pack",
    "load_folder", "reset_defaults", "serve_metrics", "shared_registry",
    "Explanation", "Learned", "explain",
    "verify",
]
