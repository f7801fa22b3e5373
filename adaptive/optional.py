"""Optional modules (torch, transformers, ...): imported once, under one lock, on a miss.

Importing PyTorch from several serving threads at once can leave the process with a
half-initialised ``torch`` ("partially initialized module 'torch' has no attribute
'library'"). Every optional import of the library therefore goes through
:func:`require`: the first caller imports under the lock while the others wait, and a
failure is remembered and raised as the same clear error to every later caller, for the
variants that need the module only; everything else keeps working.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
from types import ModuleType

from adaptive.errors import MissingDependencyError

# module -> the extra that installs it (named in the error)
OPTIONAL_MODULES = {"torch": "llm", "transformers": "llm", "cupy": "cuda13",
                    "matplotlib": "plot", "prometheus_client": "metrics",
                    "cupti": "cupti", "pyarrow": "parquet"}

_lock = threading.Lock()
_failed: dict[str, MissingDependencyError] = {}


def require(name: str, why: str = "") -> ModuleType:
    """The module ``name``, imported once under the process-wide lock.

    Args:
        name: a key of :data:`OPTIONAL_MODULES`.
        why: what needs it, for the error ("variant attention/sdpa_torch").

    Raises:
        MissingDependencyError: the module is not installed or failed to import; the
            message names the extra to install.
    """
    module = sys.modules.get(name)
    if module is not None and not getattr(module.__spec__, "_initializing", False):
        return module
    with _lock:   # an import still running elsewhere: import_module waits for it
        failed = _failed.get(name)
        if failed is not None:
            raise failed
        try:
            return importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 (an ImportError or a broken install alike)
            extra = OPTIONAL_MODULES.get(name, "")
            hint = f"pip install 'adaptive-dispatch[{extra}]'" if extra else f"install {name}"
            err = MissingDependencyError(
                f"{why or 'this feature'} needs the optional module {name!r}, which failed to "
                f"import ({type(exc).__name__}: {exc}); {hint}")
            _failed[name] = err
            raise err from None


def missing(names, why: str = "") -> MissingDependencyError | None:
    """The error for the first of ``names`` that is unavailable, or None (no import)."""
    for name in names:
        if not available(name):
            failed = _failed.get(name)
            if failed is not None:
                return failed
            extra = OPTIONAL_MODULES.get(name, "")
            return MissingDependencyError(
                f"{why or 'this feature'} needs the optional module {name!r}, which is not "
                f"installed; pip install 'adaptive-dispatch[{extra}]'")
    return None


def available(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (a failed import counts as
    unavailable): the miss path leaves out candidates whose modules are missing."""
    return name not in _failed and _installed(name)


@functools.cache
def _installed(name: str) -> bool:
    return name in sys.modules or importlib.util.find_spec(name) is not None
