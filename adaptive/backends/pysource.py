"""Load the entry function of a ``language = "python"`` variant from its source text.

Variant source is data (from the built-in folder, a pack or the regenerator), so it is
executed in a fresh namespace, once per source hash. Loading a pack therefore runs its
code: only load packs you trust (the README says so).
"""

from __future__ import annotations

import threading

from adaptive.errors import VariantRunError

_cache: dict[tuple[str, str], object] = {}
_lock = threading.Lock()


def load_entry(variant, entry: str | None = None):
    """The callable named ``entry`` (default ``variant.entry``) defined by ``variant.source``."""
    entry = entry or variant.entry
    key = (variant.source_hash, entry)
    fn = _cache.get(key)
    if fn is not None:
        return fn
    with _lock:
        if key not in _cache:
            namespace = {"__name__": f"adaptive_variant_{variant.op}_{variant.name}"}
            filename = f"<variant {variant.id} ({variant.source_name or 'inline'})>"
            try:
                exec(compile(variant.source, filename, "exec"), namespace)  # noqa: S102
            except Exception as exc:
                raise VariantRunError(variant.name, {}, f"its source failed to load: "
                                      f"{type(exc).__name__}: {exc}") from exc
            fn = namespace.get(entry)
            if not callable(fn):
                raise VariantRunError(variant.name, {}, f"its source defines no function "
                                      f"{entry!r}")
            _cache[key] = fn
    return _cache[key]
