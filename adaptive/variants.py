"""Variants as data: manifests, the :class:`Variant` record and the :class:`Registry`.

Built-in variants live in the ``variants/`` folder of the checkout (shipped in the wheel
as ``adaptive/_variants``): one sub-folder per op with a ``manifest.toml`` and source
files. Packs and the regenerator produce the same records, so one loader and one
registry serve all three.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from adaptive.errors import ExpressionError, ManifestError, UnknownNameError
from adaptive.expr import Expr, compile_expr
from adaptive.headers import expand
from adaptive.optional import OPTIONAL_MODULES
from adaptive.space import Space, as_config

BACKENDS = ("host", "cuda")
LANGUAGES = ("python", "cuda")
_REQUIRED = ("name", "backend", "language", "entry")
_KNOWN_FIELDS = {"name", "backend", "language", "entry", "source", "space", "requires",
                 "launch", "doc", "provenance", "options", "resources", "torch_entry", "needs"}


@dataclasses.dataclass(frozen=True, eq=False)
class Variant:
    """One implementation of an op on one backend, as source text plus its manifest entry."""

    name: str
    op: str
    backend: str
    language: str
    entry: str
    source: str = ""                        # the text itself; "" for pure library calls
    source_name: str = ""                   # file name the text came from
    space: Space = Space()
    requires: tuple[Expr, ...] = ()         # conditions on the input (and config)
    launch: Mapping = dataclasses.field(default_factory=dict)  # cuda: grid/block/shared
    options: tuple[str, ...] = ()           # extra compiler options (cuda)
    doc: str = ""
    provenance: Mapping = dataclasses.field(default_factory=dict)
    resources: Mapping = dataclasses.field(default_factory=dict)  # per-config, from ptxas
    origin: str = ""                        # manifest path, pack path or "generated"
    # python variants: the function called with PyTorch tensors as they are (out from
    # torch's allocator, torch's current stream); "" means tensors are converted for entry
    torch_entry: str = ""
    needs: tuple[str, ...] = ()             # optional modules imported once before a run

    @functools.cached_property
    def code(self) -> str:
        """The source as compiled and as packs store it: for a cuda variant, the shipped
        headers it includes are put in place (:func:`adaptive.headers.expand`), so a
        header's content is part of the variant's identity."""
        if self.language != "cuda":
            return self.source
        return expand(self.source, self.source_name or f"{self.name}.cu")

    @functools.cached_property
    def source_hash(self) -> str:
        """sha256 of :attr:`code`."""
        return hashlib.sha256(self.code.encode()).hexdigest()

    @property
    def id(self) -> str:
        return f"{self.op}/{self.name}"

    def fits(self, scope: Mapping, config: Mapping | None = None) -> bool:
        """True when every ``requires`` holds for this input (and config)."""
        env = {**scope, **(config or {})}
        try:
            return all(bool(r(env)) for r in self.requires)
        except ExpressionError:
            return False

    def why_not(self, scope: Mapping, config: Mapping | None = None) -> str | None:
        env = {**scope, **(config or {})}
        for r in self.requires:
            try:
                if not r(env):
                    return f"requires {r.text}"
            except ExpressionError as exc:
                return str(exc)
        return None

    def to_dict(self) -> dict:
        """Plain data for packs (msgpack); inverse of :func:`variant_from_dict`, except that
        ``source`` is :attr:`code` (the shipped headers in place: self-contained)."""
        return {
            "name": self.name, "op": self.op, "backend": self.backend,
            "language": self.language, "entry": self.entry, "source": self.code,
            "source_name": self.source_name, "space": self.space.to_dict(),
            "requires": [r.text for r in self.requires],
            "launch": {k: (list(v) if isinstance(v, (list, tuple)) else v)
                       for k, v in self.launch.items()},
            "options": list(self.options), "doc": self.doc,
            "provenance": dict(self.provenance), "resources": dict(self.resources),
            # only when set, so packs without them stay readable by older releases
            **({"torch_entry": self.torch_entry} if self.torch_entry else {}),
            **({"needs": list(self.needs)} if self.needs else {}),
        }


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A variant with one concrete launch config."""

    variant: Variant
    config_items: tuple = ()

    @property
    def config(self) -> dict:
        return dict(self.config_items)

    @property
    def label(self) -> str:
        if not self.config_items:
            return self.variant.name
        return f"{self.variant.name}[{','.join(f'{k}={v}' for k, v in self.config_items)}]"

    def __repr__(self) -> str:
        return f"Candidate({self.label})"

    def __hash__(self) -> int:
        return hash((self.variant.id, self.config_items))

    def __eq__(self, other) -> bool:
        return isinstance(other, Candidate) and (self.variant.id, self.config_items) == (
            other.variant.id, other.config_items)


def make_candidate(variant: Variant, config: Mapping) -> Candidate:
    return Candidate(variant, as_config(config))


def _fail(path, field, problem):
    raise ManifestError(str(path), field, problem)


def variant_from_dict(entry: Mapping, op: str, folder: Path | None = None,
                      where: str = "<dict>", index: int = 0) -> Variant:
    """Build a :class:`Variant` from a manifest entry or a pack's dict; strict."""
    prefix = f"variant[{index}]"
    if not isinstance(entry, Mapping):
        _fail(where, prefix, f"expected a table, got {type(entry).__name__}")
    name = entry.get("name", f"#{index}")
    prefix = f"variant[{index}] ({name})" if "name" in entry else prefix
    for field in _REQUIRED:
        if field not in entry:
            _fail(where, f"{prefix}.{field}", "missing (required: " + ", ".join(_REQUIRED) + ")")
        if not isinstance(entry[field], str) or not entry[field]:
            _fail(where, f"{prefix}.{field}", f"expected a non-empty string, got {entry[field]!r}")
    unknown = set(entry) - _KNOWN_FIELDS - {"op", "source_name"}
    if unknown:
        _fail(where, f"{prefix}.{sorted(unknown)[0]}",
              f"unknown field; known fields: {', '.join(sorted(_KNOWN_FIELDS))}")
    if entry["backend"] not in BACKENDS:
        _fail(where, f"{prefix}.backend", f"expected one of {BACKENDS}, got {entry['backend']!r}")
    if entry["language"] not in LANGUAGES:
        _fail(where, f"{prefix}.language",
              f"expected one of {LANGUAGES}, got {entry['language']!r}")
    source, source_name = entry.get("source", ""), entry.get("source_name", "")
    if folder is not None and source:
        path = folder / source
        if not path.is_file():
            _fail(where, f"{prefix}.source", f"file {source!r} not found beside the manifest")
        source, source_name = path.read_text(), source
    if entry["language"] == "cuda" and not source:
        _fail(where, f"{prefix}.source", "a cuda variant needs its kernel source")
    torch_entry = entry.get("torch_entry", "")
    if not isinstance(torch_entry, str) or (torch_entry and entry["language"] != "python"):
        _fail(where, f"{prefix}.torch_entry", f"expected the name of a function in a python "
              f"variant's source, got {torch_entry!r} ({entry['language']} variant)")
    needs = entry.get("needs", [])
    if not isinstance(needs, list) or not all(n in OPTIONAL_MODULES for n in needs):
        _fail(where, f"{prefix}.needs", f"expected a list of optional modules from "
              f"{sorted(OPTIONAL_MODULES)}, got {needs!r}")
    try:
        space = Space.from_dict(entry.get("space", {}), where=f"{prefix}.space")
        requires = tuple(compile_expr(r) for r in entry.get("requires", []))
        launch = dict(entry.get("launch", {}))
        for lk, lv in launch.items():
            for text in (lv if isinstance(lv, list) else [lv]):
                compile_expr(str(text))
    except ExpressionError as exc:
        _fail(where, f"{prefix}", str(exc))
    if entry["language"] == "cuda":
        for field in ("grid", "block"):
            if not isinstance(launch.get(field), list) or not 1 <= len(launch[field]) <= 3:
                _fail(where, f"{prefix}.launch.{field}", "a cuda variant needs a list of 1 to 3 "
                      "expressions")
    return Variant(
        name=entry["name"], op=op, backend=entry["backend"], language=entry["language"],
        entry=entry["entry"], source=source, source_name=source_name, space=space,
        requires=requires, launch=launch, options=tuple(entry.get("options", ())),
        doc=entry.get("doc", ""), provenance=dict(entry.get("provenance", {})),
        resources=dict(entry.get("resources", {})), origin=str(where),
        torch_entry=torch_entry, needs=tuple(needs))


def load_manifest(path: str | Path) -> list[Variant]:
    """Read one ``manifest.toml``; raise :class:`ManifestError` naming file and field."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(str(path), "<toml>", str(exc)) from None
    op = table.get("op")
    if not isinstance(op, str):
        _fail(path, "op", "missing or not a string (the op these variants implement)")
    from adaptive.ops import OPS
    if op not in OPS:
        _fail(path, "op", str(UnknownNameError("op", op, OPS)))
    entries = table.get("variant", [])
    if not isinstance(entries, list):
        _fail(path, "variant", "expected an array of tables ([[variant]])")
    out = [variant_from_dict(e, op, path.parent, str(path), i) for i, e in enumerate(entries)]
    names = [v.name for v in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        _fail(path, "variant.name", f"duplicate names: {', '.join(sorted(dupes))}")
    return out


def load_folder(folder: str | Path) -> list[Variant]:
    """Every manifest in ``folder/*/manifest.toml`` (or ``folder/manifest.toml``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"variant folder {folder} does not exist")
    manifests = sorted(folder.glob("*/manifest.toml")) or sorted(folder.glob("manifest.toml"))
    return [v for m in manifests for v in load_manifest(m)]


def builtin_folder() -> Path:
    """The shipped variants: ``variants/`` in a checkout, ``adaptive/_variants`` installed."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_variants", here.parent / "variants"):
        if (candidate / "gemm" / "manifest.toml").is_file():
            return candidate
    raise FileNotFoundError(f"built-in variants not found beside {here}")


class Registry:
    """All known variants by op; thread-safe to add to while dispatchers read it."""

    def __init__(self, variants: Iterable[Variant] = ()):
        self._by_op: dict[str, dict[str, Variant]] = {}
        self._lock = threading.Lock()
        self._listeners: list = []
        self.generation = 0   # bumped on every change
        for v in variants:
            self.add(v)

    def subscribe(self, callback) -> None:
        """Call ``callback(op)`` after every change to ``op``'s variants (dispatchers re-rank)."""
        self._listeners.append(callback)

    def _changed(self, op: str) -> None:
        self.generation += 1
        for callback in list(self._listeners):
            callback(op)

    def add(self, variant: Variant, replace: bool = False) -> None:
        with self._lock:
            table = dict(self._by_op.get(variant.op, {}))
            if variant.name in table and not replace:
                raise ValueError(f"variant {variant.id} is already registered (from "
                                 f"{table[variant.name].origin}); pass replace=True to swap it")
            table[variant.name] = variant
            self._by_op[variant.op] = table
        self._changed(variant.op)

    def remove(self, op: str, name: str) -> None:
        with self._lock:
            table = dict(self._by_op.get(op, {}))
            table.pop(name)
            self._by_op[op] = table
        self._changed(op)

    def variants(self, op: str, backend: str | None = None) -> list[Variant]:
        table = self._by_op.get(op, {})
        return [v for v in table.values() if backend is None or v.backend == backend]

    def get(self, op: str, name: str) -> Variant:
        table = self._by_op.get(op, {})
        if name not in table:
            raise UnknownNameError(f"variant of {op}", name, table)
        return table[name]

    def ops(self) -> list[str]:
        return sorted(self._by_op)

    def __len__(self) -> int:
        return sum(len(t) for t in self._by_op.values())


def default_registry(extra_folders: Iterable[str] = ()) -> Registry:
    """Built-in variants plus those in ``ADAPTIVE_VARIANT_PATH`` and ``extra_folders``."""
    from adaptive import config
    folders = [builtin_folder()]
    folders += [Path(p) for p in config.get().variant_path.split(":") if p]
    folders += [Path(p) for p in extra_folders]
    return Registry(v for f in folders for v in load_folder(f))
