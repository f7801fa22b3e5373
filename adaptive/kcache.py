"""The kernel cache: compiled cubins on disk, content-addressed, hash-checked, atomic.

A cubin is stored under ``<cache_dir>/kernels/v<VERSION>/<key[:2]>/<key>.cubin`` with a
``.json`` beside it holding its resources (registers, shared memory, spills) and the
sha256 of the cubin. The key is the sha256 of everything that decides the binary: the
full source text, the compiler options (config macros included), the arch and the
compiler version. A missing, truncated or altered file is a miss, never an error.

A key is data (packs carry them): only a 64-digit lowercase hex string is ever joined
into a path; anything else is refused (:func:`check_key`), so no key can name a file
outside the cache folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

from adaptive.fileio import atomic_write

VERSION = 1  # bump when the layout or the meaning of the key changes
_KEY = re.compile(r"[0-9a-f]{64}")


def is_key(key) -> bool:
    """True for what :func:`kernel_key` returns: 64 lowercase hex digits, nothing else."""
    return isinstance(key, str) and _KEY.fullmatch(key) is not None


def check_key(key) -> str:
    if not is_key(key):
        raise ValueError(f"kernel cache key must be 64 lowercase hex digits (a sha256), got "
                         f"{str(key)[:80]!r}")
    return key


@dataclasses.dataclass(frozen=True)
class CachedKernel:
    """A cubin on disk and what ptxas reported about it."""

    key: str
    path: Path
    resources: dict


def kernel_key(source: str, options: tuple[str, ...], arch: str, compiler: str) -> str:
    """The content address of one compilation."""
    h = hashlib.sha256()
    for part in (f"v{VERSION}", source, "\0".join(options), arch, compiler):
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()


class KernelCache:
    """Cubins by content key under one folder; safe to share between processes."""

    def __init__(self, root: str | Path):
        self.root = Path(root) / "kernels" / f"v{VERSION}"

    def _paths(self, key: str) -> tuple[Path, Path]:
        check_key(key)    # the only thing ever joined into a path under root
        folder = self.root / key[:2]
        return folder / f"{key}.cubin", folder / f"{key}.json"

    def get(self, key: str) -> CachedKernel | None:
        """The cached kernel, or None when absent or when its hash does not match."""
        if not is_key(key):
            return None
        cubin, meta = self._paths(key)
        try:
            info = json.loads(meta.read_text())
            data = cubin.read_bytes()
        except (OSError, ValueError):
            return None
        if info.get("version") != VERSION or info.get("key") != key:
            return None
        if hashlib.sha256(data).hexdigest() != info.get("cubin_sha256"):
            return None
        return CachedKernel(key, cubin, dict(info.get("resources", {})))

    def put(self, key: str, cubin_bytes: bytes, resources: dict) -> CachedKernel:
        """Store a cubin (cubin first, then its metadata, so readers never see half).

        Raises ValueError for a key that is not a sha256 hex digest."""
        cubin, meta = self._paths(key)
        atomic_write(cubin, cubin_bytes, durable=False, mode=None)
        info = {"version": VERSION, "key": key, "resources": resources,
                "cubin_sha256": hashlib.sha256(cubin_bytes).hexdigest(),
                "cubin_bytes": len(cubin_bytes)}
        atomic_write(meta, json.dumps(info, sort_keys=True).encode(), durable=False,
                     mode=None)
        return CachedKernel(key, cubin, dict(resources))
