"""The exception hierarchy: one module, fields kept, every class survives pickling.

The verifier runs candidates in another process and sends its verdict back, so each
exception rebuilds from its fields (``__reduce__``) rather than from a formatted message.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AdaptiveError(Exception):
    """Base class of every error this library raises on purpose."""

    def __reduce__(self):
        return (self.__class__, self.args)


class InputTypeError(AdaptiveError, TypeError):
    """An argument of the wrong type (not an array, a foreign array kind, a bad dtype)."""


class InputValueError(AdaptiveError, ValueError):
    """An argument of the right type with a wrong value (shape, rank, empty dimension)."""


class UnknownNameError(AdaptiveError, ValueError):
    """An unknown op, variant, backend or parameter name; suggests the nearest known one."""

    def __init__(self, kind: str, name: str, known: Iterable[str], none: str = ""):
        known = sorted(known)
        self.kind, self.name, self.known = kind, name, known
        self.none = none or f"there is no {kind}"   # said instead when ``known`` is empty
        super().__init__(kind, name, known, none)

    def __str__(self) -> str:
        if not self.known:
            return f"unknown {self.kind} {self.name!r}; {self.none}"
        near = difflib.get_close_matches(self.name, self.known, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f"; known: {', '.join(self.known)}"
        return f"unknown {self.kind} {self.name!r}{hint}"


class ManifestError(AdaptiveError, ValueError):
    """A variant manifest that cannot be loaded: names the file and the field."""

    def __init__(self, path: str, field: str, problem: str):
        self.path, self.field, self.problem = path, field, problem
        super().__init__(path, field, problem)

    def __str__(self) -> str:
        return f"{self.path}: field {self.field!r}: {self.problem}"


class ExpressionError(AdaptiveError, ValueError):
    """A launch-config or constraint expression that is not in the allowed subset."""


class NoCandidateError(AdaptiveError, RuntimeError):
    """No variant of this op on this backend fits the input (or every one failed)."""


class CompileError(AdaptiveError, RuntimeError):
    """A CUDA variant failed to compile; ``str()`` shows the numbered source and the log."""

    def __init__(self, variant: str, config: dict, log: str, source: str = ""):
        self.variant, self.config, self.log, self.source = variant, dict(config), log, source
        super().__init__(variant, self.config, log, source)

    def __str__(self) -> str:
        numbered = "\n".join(f"{i:4d} | {line}" for i, line in enumerate(self.source.splitlines(), 1))
        head = f"variant {self.variant!r} with config {self.config} failed to compile:\n{self.log}"
        return f"{head}\n--- source ---\n{numbered}" if numbered else head


class VariantRunError(AdaptiveError, RuntimeError):
    """A variant raised or faulted while running; carries the variant and config."""

    def __init__(self, variant: str, config: dict, reason: str):
        self.variant, self.config, self.reason = variant, dict(config), reason
        super().__init__(variant, self.config, reason)

    def __str__(self) -> str:
        return f"variant {self.variant!r} with config {self.config} failed: {self.reason}"


class BackendUnavailableError(AdaptiveError, RuntimeError):
    """A backend was asked for but cannot run here (no GPU, CuPy missing)."""


class MissingDependencyError(AdaptiveError, ImportError):
    """An optional module (torch, transformers, ...) is missing; names the extra to install."""


class PackError(AdaptiveError, ValueError):
    """A variant pack that is refused (truncated, corrupted, hash mismatch, unknown schema).

    Nothing from a refused pack is loaded.
    """

    def __init__(self, path: str, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(self.path, problem)

    def __str__(self) -> str:
        return f"pack {self.path}: {self.problem}"


class GeneratorError(AdaptiveError, RuntimeError):
    """A code-model endpoint failed (HTTP error after retries, a redirect to another host,
    an unreadable reply); the regeneration loop records it as the step's verdict."""
