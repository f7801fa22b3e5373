"""Shipped variant packs: ``adaptive/packs/*.msgpack`` inside the wheel.

Each was built on one kind of device (``adaptive pack build``; the H200 pack by
``benchmarks/gpu_pack.py``). A dispatcher loads those whose fingerprint names its device
(:func:`adaptive.packs.format.load_startup_packs`); the others stay on disk.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def shipped_packs() -> list[Path]:
    """The pack files shipped with this installation, sorted by name."""
    return sorted(FOLDER.glob("*.msgpack"))
