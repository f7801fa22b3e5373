"""The CUDA headers shipped with adaptive, put into a variant's text where it includes them.

A CUDA variant writes ``#include "adaptive_ptx.cuh"`` (the inline-PTX helpers: cp.async,
ldmatrix, mma.sync, ...; the file is ``adaptive/include/adaptive_ptx.cuh``), or the name of
another header of :data:`HEADERS` (``adaptive_splitkv.cuh``: the device code the two split-KV
decode attention kernels share, included after adaptive_ptx.cuh and their config macros;
``adaptive_wgmma.cuh``: Hopper's warpgroup tensor-core helpers, for variants compiled for
sm_90a; headers include no other header). :func:`expand` replaces that line by the header's text
between ``#line`` markers, so compiler messages name the header's and the variant's own
lines. Every compile goes through
:func:`adaptive.nvrtc.full_source`, which expands, so the header's bytes are part of every
kernel-cache key, and a variant's :meth:`~adaptive.variants.Variant.to_dict` (what packs
store) and its ``source_hash`` use the expanded text: a pack carries the header it was
measured with, loads on a release without the header, and a changed header makes a packed
variant differ from the registered one (its rows and cubins are not used).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
HEADERS = ("adaptive_ptx.cuh", "adaptive_splitkv.cuh", "adaptive_wgmma.cuh")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([\w.]+)[>"][ \t]*(//.*)?$', re.MULTILINE)


@functools.cache
def header_text(name: str) -> str:
    """The text of one shipped header (read once per process)."""
    if name not in HEADERS:
        raise ValueError(f"no shipped CUDA header {name!r}; the headers are "
                         f"{', '.join(HEADERS)}")
    return (INCLUDE_DIR / name).read_text()


def includes(source: str) -> list[str]:
    """The shipped headers ``source`` includes, in order."""
    return [m.group(1) for m in _INCLUDE.finditer(source) if m.group(1) in HEADERS]


def expand(source: str, source_name: str = "variant.cu") -> str:
    """``source`` with each ``#include`` of a shipped header replaced by the header's text
    (``#line`` markers keep messages on both files' lines); other includes stay as they are.
    Idempotent: the result includes no shipped header."""
    if "include" not in source:
        return source

    def replace(m: re.Match) -> str:
        name = m.group(1)
        if name not in HEADERS:
            return m.group(0)
        line = source.count("\n", 0, m.start()) + 1
        return (f'#line 1 "{name}"\n{header_text(name).rstrip()}\n'
                f'#line {line + 1} "{source_name}"')
    return _INCLUDE.sub(replace, source)
