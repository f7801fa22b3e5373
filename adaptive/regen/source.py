"""A variant from a hand-written or generated source file, and :func:`verify` on it.

The source borrows the rest of its manifest entry (launch expressions, config space,
requires, compiler options) from a registered variant of the op: the one named by
``like``, else the one with the same language and entry name, else the first of the
same language. That is what makes a verified source a drop-in for the registry.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path

from adaptive.backends import device_limits
from adaptive.limits import SM90
from adaptive.regen.report import VerifyReport
from adaptive.regen.shapes import DEFAULT_DIMS, check_dims
from adaptive.space import Space
from adaptive.variants import Registry, Variant, make_candidate


def _language(path: Path | None, text: str, language: str | None) -> str:
    if language:
        if language not in ("python", "cuda"):
            raise ValueError(f"language {language!r}: expected 'python' or 'cuda'")
        return language
    if path is not None and path.suffix in (".cu", ".cuh"):
        return "cuda"
    if path is not None and path.suffix == ".py":
        return "python"
    return "cuda" if "__global__" in text else "python"


def _entry(text: str, language: str) -> str:
    if language == "cuda":
        names = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(",
                           text)
    else:
        names = [n for n in re.findall(r"^def\s+(\w+)\s*\(", text, re.M) if not n.startswith("_")]
    if len(names) != 1:
        what = "__global__ kernels" if language == "cuda" else "public functions"
        raise ValueError(f"cannot tell the entry point: the source defines {len(names)} {what} "
                         f"({', '.join(names) or 'none'}); pass entry=NAME")
    return names[0]


def variant_from_source(source: str | Path, op: str, entry: str | None = None,
                        language: str | None = None, like: str | None = None,
                        registry: Registry | None = None, name: str | None = None) -> Variant:
    """A :class:`Variant` of ``op`` whose text is ``source`` (a path or the text itself)."""
    from adaptive.variants import shared_registry
    from adaptive.ops import get_op
    get_op(op)
    path = None
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source
                                    and len(source) < 4096 and Path(source).is_file()):
        path = Path(source)
        text = path.read_text()
    else:
        text = str(source)
    language = _language(path, text, language)
    entry = entry or _entry(text, language)
    registry = registry or shared_registry()
    pool = [v for v in registry.variants(op) if v.language == language]
    if like is not None:
        template = registry.get(op, like)
    else:
        template = next((v for v in pool if v.entry == entry), pool[0] if pool else None)
    if template is None:
        if language == "cuda":
            raise ValueError(f"no cuda variant of {op} is registered to borrow the launch "
                             "configuration from; pass like=NAME of a registered variant")
        template = Variant(name="source", op=op, backend="host", language="python", entry=entry)
    return dataclasses.replace(
        template, name=name or (path.stem if path else f"{template.name}.src"), entry=entry,
        source=text, source_name=path.name if path else "", origin=str(path or "<text>"),
        provenance={"template": template.id, "from": str(path or "<text>")})


def default_config(variant: Variant, limits: Mapping | None = None) -> dict:
    """The first config of the variant's space that this machine's GPU admits (a cuda
    variant; an H200 where there is none) and ``limits`` (overrides)."""
    device = device_limits() if variant.backend == "cuda" else SM90
    limits = {**device, **(limits or {})}
    configs = variant.space.configs(limits)
    if variant.space.params and not configs:
        raise ValueError(f"no config of {variant.id}'s space fits the device limits; pass "
                         "config={...}")
    return configs[0] if configs else {}


def verify(source: str | Path, op: str, *, entry: str | None = None,
           config: Mapping | None = None, dims: Mapping[str, int] | None = None,
           dtype: str = "float32", language: str | None = None, like: str | None = None,
           baseline: str | None = None, timeout_s: float | None = None,
           registry: Registry | None = None, regimes: tuple[str, ...] = ()) -> VerifyReport:
    """Run the isolated verifier on a variant source and return its report.

    Args:
        source: a file path (``.py`` or ``.cu``) or the source text.
        op: the op it implements ("gemm", "softmax", ...).
        entry: function or kernel name (default: the only one the source defines).
        config: launch-config values (default: the borrowed space's first config).
        dims: target shape, e.g. ``{"R": 512, "C": 1000}`` (default: a small odd shape).
        dtype: element type.
        like: registered variant to borrow launch/space/requires from.
        baseline: registered variant name to time against.
        timeout_s: per-candidate limit for the isolated process.
        regimes: value regimes to check (default: every one the op declares).

    Returns:
        A :class:`VerifyReport`; ``report.ok`` says accepted, ``report.verdict`` why.

    Example:
        >>> r = adaptive.verify("my_softmax.py", "softmax", dims={"R": 300, "C": 500})
        >>> print(r.verdict)
    """
    from adaptive.variants import shared_registry
    from adaptive.ops import get_op
    from adaptive.regen.verifier import Job, Verifier
    registry = registry or shared_registry()
    variant = variant_from_source(source, op, entry, language, like, registry)
    if config is None:
        config = default_config(variant)
    if config and set(config) != set(variant.space.names):
        raise ValueError(f"config names {sorted(config)}; {variant.name} (from "
                         f"{variant.provenance['template']}) takes {sorted(variant.space.names)}")
    variant = dataclasses.replace(variant, space=Space(
        tuple((k, (v,)) for k, v in sorted(config.items())), variant.space.constraints))
    dims = dict(dims or DEFAULT_DIMS[op])
    check_dims(get_op(op), dims)
    if dtype not in get_op(op).dtypes:
        raise ValueError(f"dtype {dtype}: {op} takes {', '.join(get_op(op).dtypes)}")
    base = None
    if baseline:
        bv = registry.get(op, baseline)
        base = make_candidate(bv, default_config(bv))
    job = Job(variant, dict(config), dims, dtype, baseline=base, regimes=tuple(regimes))
    return Verifier(timeout_s=timeout_s).verify(job)
