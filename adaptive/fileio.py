"""Atomic file writes: a temp file in the target's folder, then ``os.replace``.

A reader sees the old file or the new one, never a torn one; a crash leaves at most a
stray temp file. Packs, cubins and stored peaks are written this way.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes, durable: bool = True,
                 mode: int | None = 0o644) -> None:
    """Write ``data`` to ``path`` atomically.

    Args:
        durable: fsync before the rename (a pack must survive a power cut; a cache
            entry need not: a lost one is only a recompile).
        mode: permissions of the file (mkstemp makes it private; None keeps that).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
