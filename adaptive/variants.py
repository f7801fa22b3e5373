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
import operator
import threading
import tomllib
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from adaptive.errors import ExpressionError, ManifestError, UnknownNameError
from adaptive.expr import Expr, compile_expr
from adaptive.headers import expand
from adaptive.optional import OPTIONAL_MODULES
from adaptive.space import Space, as_config

if TYPE_CHECKING:
    from adaptive.dispatch import Dispatcher

BACKENDS = ("host", "cuda")
_ABSENT = object()   # a config without a name a requirement reads (the input's value holds)
LANGUAGES = ("python", "cuda")
_REQUIRED = ("name", "backend", "language", "entry")
_KNOWN_FIELDS = {"name", "backend", "language", "entry", "source", "space", "requires",
                 "launch", "doc", "provenance", "options", "resources", "torch_entry",
                 "torch_library", "needs", "baseline", "experimental"}


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
    # the torch entry is torch's own library call on the op's operands (``torch.mm``:
    # cuBLAS): a caller holding a committed plan of it may make that call itself
    torch_library: bool = False
    needs: tuple[str, ...] = ()             # optional modules imported once before a run
    # what a plain program runs for this op (cuBLAS for gemm, the dense matmul on a pruned
    # weight for spmm, SDPA for attention): always explored, and served while exploring
    # is deferred, so a committed choice is never one the plain call beats unseen
    baseline: bool = False
    # not yet verified on a device: never listed as a candidate (Registry.variants), run
    # only where a caller names it (``launch(..., variant=...)``, a pack build's --variants)
    experimental: bool = False

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

    @functools.cached_property
    def id(self) -> str:   # made once: every hash of a candidate reads it
        return f"{self.op}/{self.name}"

    def fits(self, scope: Mapping, config: Mapping | None = None) -> bool:
        """True when every ``requires`` holds for this input (and config)."""
        env = {**scope, **(config or {})}
        try:
            return all(bool(r(env)) for r in self.requires)
        except ExpressionError:
            return False

    def fitting(self, scope: Mapping, configs: Sequence[Mapping]) -> list:
        """The members of ``configs`` this input fits: :meth:`fits` for each, in order.
        The requirements that name no config parameter (the input's alone) are evaluated
        once, not once a config (a miss lists ~100 candidates: 5.5 ms for attention's
        before). The others filter the configs one requirement at a time, each evaluated
        once per distinct value of the config parameters it names (the input is fixed
        here): ``HD == D`` twice, not once for each of split-KV's 136 configs (a decode
        input's listing took 0.7 ms of its miss on a 2-core machine, 3-4x that on slow
        H200 hosts, runs S137 and S139)."""
        if not configs:
            return []
        alone, per_config = self._requires_split(self._config_names(configs))
        try:
            if not all(r(scope) for r in alone):
                return []
        except ExpressionError:
            return []
        kept = list(configs)
        for r, own, values in per_config:
            results: dict = {}
            out = []
            for config in kept:
                # what r reads: the config's values of the names it has, the input's
                # (fixed here) for the rest
                try:
                    key = values(config)
                except KeyError:
                    key = tuple(config.get(n, _ABSENT) for n in own)
                try:
                    ok = results.get(key)
                except TypeError:          # an unhashable value: evaluated as it comes
                    key, ok = None, None
                if ok is None:
                    try:
                        ok = bool(r({**scope, **config}))
                    except ExpressionError:
                        ok = False
                    if key is not None:
                        results[key] = ok
                if ok:
                    out.append(config)
            kept = out
            if not kept:
                break
        return kept

    def _config_names(self, configs: Sequence[Mapping]) -> frozenset:
        """Every parameter name of ``configs``; kept for the last few lists asked about (a
        dispatcher lists each variant's one list of configs, miss after miss), by identity
        and length (a list grown since is read again)."""
        cache = self.__dict__.setdefault("_names", {})
        got = cache.get(id(configs))
        if got is not None and got[0] is configs and got[1] == len(configs):
            return got[2]
        names = frozenset().union(*configs)
        if len(cache) >= 8:
            cache.clear()
        cache[id(configs)] = (configs, len(configs), names)
        return names

    def _requires_split(self, config_names: frozenset) -> tuple[tuple, tuple]:
        """(requirements naming none of ``config_names``, (requirement, the config names it
        reads, sorted, and a getter of a config's values of them) for the others), in
        manifest order."""
        cache = self.__dict__.setdefault("_split", {})
        split = cache.get(config_names)
        if split is None:
            per_config = []
            for r in self.requires:
                own = tuple(sorted(r.names & config_names))
                if own:
                    per_config.append((r, own, operator.itemgetter(*own)))
            split = cache[config_names] = (
                tuple(r for r in self.requires if not r.names & config_names),
                tuple(per_config))
        return split

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
            **({"torch_library": True} if self.torch_library else {}),
            **({"needs": list(self.needs)} if self.needs else {}),
            **({"baseline": True} if self.baseline else {}),
            **({"experimental": True} if self.experimental else {}),
        }


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A variant with one concrete launch config."""

    variant: Variant
    config_items: tuple = ()

    @property
    def config(self) -> dict:
        return dict(self.config_items)

    @functools.cached_property
    def label(self) -> str:   # made once: a miss's reasons and predictions name ~100
        if not self.config_items:
            return self.variant.name
        return f"{self.variant.name}[{','.join(f'{k}={v}' for k, v in self.config_items)}]"

    def __repr__(self) -> str:
        return f"Candidate({self.label})"

    def __hash__(self) -> int:   # made once: a miss hashes each of ~100 candidates ~4 times
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.variant.id, self.config_items))
        return h

    def __eq__(self, other) -> bool:
        return self is other or isinstance(other, Candidate) and (
            self.variant.id, self.config_items) == (other.variant.id, other.config_items)


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
    torch_library = entry.get("torch_library", False)
    if not isinstance(torch_library, bool) or (torch_library and not torch_entry):
        _fail(where, f"{prefix}.torch_library", f"expected true or false, and true only with "
              f"a torch_entry, got {torch_library!r} (torch_entry {torch_entry!r})")
    baseline = entry.get("baseline", False)
    if not isinstance(baseline, bool) or (baseline and entry["language"] != "python"):
        _fail(where, f"{prefix}.baseline", f"expected true or false, and true only for a "
              f"library (python) variant, got {baseline!r} ({entry['language']} variant)")
    experimental = entry.get("experimental", False)
    if not isinstance(experimental, bool):
        _fail(where, f"{prefix}.experimental", f"expected true or false, got {experimental!r}")
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
        torch_entry=torch_entry, torch_library=torch_library, needs=tuple(needs),
        baseline=baseline, experimental=experimental)


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


@runtime_checkable
class Observer(Protocol):
    """Something that watches the dispatchers of a registry (the counter log, the metrics
    endpoint, the regeneration service): :meth:`Registry.observe` attaches it to every
    member, present and future; it installs its per-dispatcher
    :class:`~adaptive.dispatch.Recorder` with ``Dispatcher.add_recorder``."""

    def attach(self, dispatcher: Dispatcher) -> None:
        """Start watching ``dispatcher`` (idempotent)."""

    def detach(self, dispatcher: Dispatcher) -> None:
        """Stop watching ``dispatcher``."""


class Registry:
    """All known variants by op; thread-safe to add to while dispatchers read it.

    A registry is also what its dispatchers share: each dispatcher made on it joins it
    (:meth:`join`), and from then on receives what is given to the registry: the
    variants' changes (the dispatcher re-decides the op), measurement rows
    (:meth:`add_observations`: packs, counter logs) and observers (:meth:`observe`: the
    counter log, metrics, regeneration; each attached to every member, present and future).
    """

    def __init__(self, variants: Iterable[Variant] = ()):
        self._by_op: dict[str, dict[str, Variant]] = {}
        self._lock = threading.RLock()
        self._members: weakref.WeakSet = weakref.WeakSet()   # dispatchers on this registry
        self._observers: list = []
        self._observations: list[tuple[tuple, float]] = []
        self.generation = 0   # bumped on every change
        for v in variants:
            self.add(v)

    # ---- members and what they share --------------------------------------------------------
    def join(self, dispatcher: Dispatcher) -> None:
        """A new dispatcher on this registry: give it the rows so far and attach the
        observers (in memory: no file is read, no thread started)."""
        with self._lock:
            self._members.add(dispatcher)
            batches, observers = list(self._observations), list(self._observers)
        for rows, weight in batches:
            dispatcher.add_observations(rows, weight)
        for observer in observers:
            observer.attach(dispatcher)

    def members(self) -> list[Dispatcher]:
        """The dispatchers alive on this registry."""
        with self._lock:
            return list(self._members)

    def observe(self, observer: Observer) -> None:
        """Attach ``observer`` to every dispatcher on this registry, now and later."""
        with self._lock:
            if observer in self._observers:
                return
            self._observers.append(observer)
            members = list(self._members)
        for d in members:
            observer.attach(d)

    def unobserve(self, observer: Observer) -> None:
        """Detach ``observer`` from every member (records it took stay its own)."""
        with self._lock:
            if observer not in self._observers:
                return
            self._observers.remove(observer)
            members = list(self._members)
        for d in members:
            observer.detach(d)

    def add_observations(self, rows: Iterable, weight: float = 1.0) -> None:
        """Measurements made elsewhere (a pack, a counter log) for every member's policy,
        present and future; ``weight`` < 1 marks rows measured on another device."""
        rows = tuple(rows)
        with self._lock:
            self._observations.append((rows, weight))
            members = list(self._members)
        for d in members:
            d.add_observations(rows, weight)

    def observations(self) -> list[tuple[tuple, float]]:
        """The (rows, weight) batches given so far."""
        with self._lock:
            return list(self._observations)

    def _changed(self, op: str) -> None:
        self.generation += 1
        for d in self.members():   # each member re-decides the op
            d.forget(op)

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

    def variants(self, op: str, backend: str | None = None,
                 experimental: bool = False) -> list[Variant]:
        """The variants of ``op`` (on ``backend``): the candidates a miss lists. An
        experimental variant (not yet verified on a device) only with ``experimental``;
        :meth:`get` finds it by name either way."""
        table = self._by_op.get(op, {})
        return [v for v in table.values() if (backend is None or v.backend == backend)
                and (experimental or not v.experimental)]

    def get(self, op: str, name: str) -> Variant:
        table = self._by_op.get(op, {})
        if name not in table:
            raise UnknownNameError(f"variant of {op}", name, table)
        return table[name]

    def ops(self) -> list[str]:
        return sorted(self._by_op)

    def __len__(self) -> int:
        return sum(len(t) for t in self._by_op.values())


_shared: Registry | None = None
_shared_lock = threading.Lock()


def shared_registry() -> Registry:
    """The process's registry: the default dispatchers' and every dispatcher made without
    one (packs, promotions and observers land here). Built on first use."""
    global _shared
    if _shared is None:
        with _shared_lock:
            if _shared is None:
                _shared = default_registry()
    return _shared


def reset_shared_registry() -> None:
    """Forget the shared registry (tests; after changing ``ADAPTIVE_VARIANT_PATH``): the
    next :func:`shared_registry` builds a fresh one."""
    global _shared
    with _shared_lock:
        _shared = None


def default_registry(extra_folders: Iterable[str] = ()) -> Registry:
    """Built-in variants plus those in ``ADAPTIVE_VARIANT_PATH`` and ``extra_folders``."""
    from adaptive import config
    folders = [builtin_folder()]
    folders += [Path(p) for p in config.get().variant_path.split(":") if p]
    folders += [Path(p) for p in extra_folders]
    return Registry(v for f in folders for v in load_folder(f))
