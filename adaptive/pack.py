"""Variant packs: variants + measurements + the device they were measured on, in one file.

A pack is a msgpack file (layout in ``docs/pack-format.md``): an outer map with a magic
string, the schema version, a sha256, and two byte strings — the header (creation time,
creator, device fingerprint) and the body (variants as source text + manifest entry,
measurement rows, optional cubins). The hash covers header and body and is checked
before either is decoded; nothing is pickled: the cost model is refitted from the rows.

Loading a pack runs its code (Python variant source, CUDA kernels): load only packs
you trust. :func:`load_pack` refuses a truncated, corrupted or hash-mismatched file and
an unknown schema with :class:`~adaptive.errors.PackError`, and then loads nothing.

Everything inside is data until checked: the header against :data:`HEADER_SCHEMA` before
it is printed or used, rows and cubins field by field, every expression with bounded
arithmetic (:mod:`adaptive.expr`) and every variant's config space against
:data:`MAX_SPACE_CONFIGS` when the pack is decoded. A cubin's key is never taken as
given: it must be a sha256 hex digest, and it is installed into the kernel cache only
when this process can run its arch and the key recomputed from the variant's source,
config, dtype, arch and this NVRTC's version is the same.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgpack

from adaptive.errors import ManifestError, PackError
from adaptive.fileio import atomic_write
from adaptive.observation import Observation
from adaptive.variants import Registry, Variant, variant_from_dict

log = logging.getLogger("adaptive")

MAGIC = "adaptive-pack"
SCHEMA_VERSION = 1          # bump when the layout or the meaning of a field changes
FOREIGN_WEIGHT = 0.25       # weight of rows measured on another device
# fingerprint fields that identify a device; driver and library versions do not
IDENTITY_KEYS = ("backend", "name", "cc", "compute_capability", "sm_count", "cpu_count")
MAX_SPACE_CONFIGS = 100_000  # largest config space (product of value lists) of a pack variant
_SCALAR = (str, int, float, bool, type(None))
# the header: field -> (accepted types, required); other fields must be plain data
HEADER_SCHEMA = {
    "schema": ((int,), True), "created_s": ((int, float), True), "creator": ((str,), True),
    "key_version": ((int,), False), "fingerprint": ((dict,), True), "build": ((dict,), False),
    "counts": ((dict,), False),
}


class PackDeviceWarning(UserWarning):
    """A pack measured on another device was loaded; its rows are down-weighted."""


@dataclasses.dataclass(frozen=True)
class Cubin:
    """A compiled kernel image carried by a pack (content address from ``adaptive.kcache``)."""

    key: str                 # kcache.kernel_key(source, options, arch, compiler)
    variant: str             # "op/name"
    config: Mapping
    arch: str                # "sm_90"
    image: bytes
    resources: Mapping = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"key": self.key, "variant": self.variant, "config": dict(self.config),
                "arch": self.arch, "image": bytes(self.image),
                "resources": dict(self.resources)}


@dataclasses.dataclass(frozen=True)
class Pack:
    """The decoded contents of a pack file."""

    header: Mapping
    variants: tuple[Variant, ...] = ()
    rows: tuple[Observation, ...] = ()
    cubins: tuple[Cubin, ...] = ()
    failures: tuple[Mapping, ...] = ()   # {op, dims, dtype, variant, config, reason}
    sha256: str = ""                     # of header + body as stored ("" before writing)

    @property
    def fingerprint(self) -> dict:
        return dict(self.header.get("fingerprint", {}))

    @property
    def ops(self) -> list[str]:
        return sorted({v.op for v in self.variants} | {r.op for r in self.rows})


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What :func:`load_pack` did."""

    path: str
    sha256: str
    variants_added: tuple[str, ...]
    variants_present: tuple[str, ...]    # already registered with the same source
    variants_skipped: tuple[str, ...]    # registered with other source, or unknown op
    rows: int
    weight: float
    same_device: bool


def new_pack(variants: Iterable[Variant], rows: Iterable[Observation], fingerprint: Mapping,
             cubins: Iterable[Cubin] = (), failures: Iterable[Mapping] = (),
             build: Mapping | None = None, created_s: float | None = None) -> Pack:
    """A pack with a fresh header (schema, creation time, creator, device fingerprint)."""
    from adaptive import __version__
    from adaptive.ops import KEY_VERSION
    header = {"schema": SCHEMA_VERSION, "created_s": time.time() if created_s is None else
              created_s, "creator": f"adaptive {__version__}", "key_version": KEY_VERSION,
              "fingerprint": dict(fingerprint), "build": dict(build or {})}
    return Pack(header, tuple(variants), tuple(rows), tuple(cubins), tuple(failures))


# ---- encoding ---------------------------------------------------------------------------------

def _pack_bytes(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def encode(pack: Pack) -> tuple[bytes, str]:
    """The file's bytes and the sha256 of header + body."""
    body = {"variants": [v.to_dict() for v in pack.variants],
            "rows": [r.to_dict() for r in pack.rows],
            "cubins": [c.to_dict() for c in pack.cubins],
            "failures": [dict(f) for f in pack.failures]}
    header = dict(pack.header)
    header["counts"] = {name: len(body[name]) for name in body}
    header_bytes, body_bytes = _pack_bytes(header), _pack_bytes(body)
    digest = hashlib.sha256(header_bytes + body_bytes).hexdigest()
    outer = {"magic": MAGIC, "schema": SCHEMA_VERSION, "sha256": digest,
             "header": header_bytes, "body": body_bytes}
    return _pack_bytes(outer), digest


def _outer(data: bytes, where: str) -> dict:
    """The outer map, checked for magic, schema and hash; nothing inside is decoded yet."""
    try:
        outer = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # noqa: BLE001 (msgpack raises several kinds)
        raise PackError(where, f"not a readable pack: the file is truncated or corrupted "
                        f"({type(exc).__name__}: {exc}); rebuild it or copy it again") from None
    if not isinstance(outer, dict) or outer.get("magic") != MAGIC:
        raise PackError(where, f"not an adaptive pack (expected a msgpack map with magic "
                        f"{MAGIC!r}); pass a file written by `adaptive pack build`")
    schema = outer.get("schema")
    if schema != SCHEMA_VERSION:
        raise PackError(where, f"unknown schema version {schema!r}; this adaptive reads "
                        f"schema {SCHEMA_VERSION}: rebuild the pack with this version")
    header, body, digest = outer.get("header"), outer.get("body"), outer.get("sha256")
    if not isinstance(header, bytes) or not isinstance(body, bytes) or not isinstance(digest,
                                                                                      str):
        raise PackError(where, "corrupted: header, body or sha256 missing or of the wrong "
                        "type; rebuild the pack")
    actual = hashlib.sha256(header + body).hexdigest()
    if actual != digest:
        raise PackError(where, f"hash mismatch: the file says sha256 {digest[:16]}…, its "
                        f"contents hash to {actual[:16]}…; it was modified or corrupted: "
                        "rebuild the pack or copy it again")
    return outer


def _plain(value, depth: int = 0) -> bool:
    """True for msgpack plain data: scalars, lists and string-keyed maps, not too deep."""
    if isinstance(value, _SCALAR) or isinstance(value, bytes):
        return True
    if depth > 8:
        return False
    if isinstance(value, list):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _type_names(types) -> str:
    return " or ".join({"dict": "map", "str": "string"}.get(t.__name__, t.__name__)
                       for t in types)


def check_header(header, where: str) -> dict:
    """The header if it has :data:`HEADER_SCHEMA`'s shape, else :class:`PackError`."""
    if not isinstance(header, dict):
        raise PackError(where, f"header must be a map, got {type(header).__name__}; the "
                        "pack is damaged: rebuild it")
    for field, (types, required) in HEADER_SCHEMA.items():
        if field not in header:
            if required:
                raise PackError(where, f"header lacks {field!r}; the pack is damaged or not "
                                "written by `adaptive pack build`: rebuild it")
            continue
        value = header[field]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise PackError(where, f"header field {field!r} must be a {_type_names(types)}, "
                            f"got {type(value).__name__}: rebuild the pack")
    if header["schema"] != SCHEMA_VERSION:
        raise PackError(where, f"header says schema {header['schema']}, this adaptive reads "
                        f"{SCHEMA_VERSION}: rebuild the pack with this version")
    if not 0 <= header["created_s"] < 1e11:
        raise PackError(where, f"header field 'created_s' is {header['created_s']!r}, not a "
                        "time in seconds since 1970")
    fp = header["fingerprint"]
    bad = [k for k, v in fp.items() if not isinstance(k, str) or not isinstance(v, _SCALAR)]
    if bad:
        raise PackError(where, f"header fingerprint field {str(bad[0])[:40]!r} is not a string "
                        "name with a string or number value")
    counts = header.get("counts", {})
    if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in counts.items()):
        raise PackError(where, "header field 'counts' must map names to counts")
    for field, value in header.items():
        if not isinstance(field, str) or not _plain(value):
            raise PackError(where, f"header field {str(field)[:40]!r} is not plain data "
                            "(strings, numbers, lists and maps)")
    return header


def _check_row(d) -> Observation:
    if not isinstance(d, dict):
        raise ValueError(f"a row must be a map, got {type(d).__name__}")
    row = Observation.from_dict(d)
    for name in ("op", "dtype", "variant", "source"):
        if not isinstance(getattr(row, name), str):
            raise ValueError(f"row field {name!r} must be a string")
    for name in ("time_ms", "floor_ms", "spread_ms", "timestamp_s", "samples"):
        value = getattr(row, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"row field {name!r} must be a number, got {value!r:.40}")
    if not (isinstance(row.dims, dict) and all(isinstance(k, str) and type(v) is int
                                               for k, v in row.dims.items())):
        raise ValueError("row field 'dims' must map names to integers")
    for name in ("config", "features", "device", "counters"):
        value = getattr(row, name)
        if not (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, _SCALAR)
                                                for k, v in value.items())):
            raise ValueError(f"row field {name!r} must map names to numbers or strings")
    return row


def _check_cubin(d, i: int) -> Cubin:
    from adaptive.kcache import is_key
    if not isinstance(d, dict) or set(d) - {f.name for f in dataclasses.fields(Cubin)}:
        raise ValueError(f"cubin {i} must be a map of {', '.join(Cubin.__annotations__)}")
    c = Cubin(**d)
    if not is_key(c.key):
        raise ValueError(f"cubin {i} ({str(c.variant)[:60]}) has key {str(c.key)[:80]!r}; "
                         "expected a sha256 hex digest (64 lowercase hex digits)")
    if not isinstance(c.variant, str) or not isinstance(c.arch, str) \
            or not isinstance(c.image, bytes) or not isinstance(c.config, dict) \
            or not isinstance(c.resources, dict):
        raise ValueError(f"cubin {i} ({str(c.variant)[:60]}): variant and arch must be "
                         "strings, image bytes, config and resources maps")
    if not all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in
               c.config.items()) or not all(isinstance(k, str) and type(v) is int
                                             for k, v in c.resources.items()):
        raise ValueError(f"cubin {i} ({c.variant}): config must map names to numbers or "
                         "strings, resources names to integers")
    return c


def _check_space(v: Variant, where: str) -> Variant:
    size = 1
    for _, values in v.space.params:
        size *= len(values)
        if size > MAX_SPACE_CONFIGS:
            raise ValueError(f"variant {v.id}: its config space has more than "
                             f"{MAX_SPACE_CONFIGS} configs")
    return v


def decode(data: bytes, where: str = "<bytes>") -> Pack:
    """Verify and decode a pack's bytes; :class:`PackError` if anything is wrong."""
    outer = _outer(data, where)
    try:
        header = msgpack.unpackb(outer["header"], raw=False)
        body = msgpack.unpackb(outer["body"], raw=False)
    except Exception as exc:  # noqa: BLE001
        raise PackError(where, f"corrupted header or body ({exc})") from None
    check_header(header, where)
    if not isinstance(body, dict):
        raise PackError(where, "corrupted: the body must be a map")
    try:
        parts = {name: body.get(name, []) for name in ("variants", "rows", "cubins",
                                                       "failures")}
        for name, value in parts.items():
            if not isinstance(value, list):
                raise ValueError(f"body field {name!r} must be a list")
        variants = tuple(_check_space(variant_from_dict(d, d.get("op", "") if isinstance(
            d, dict) else "", None, f"{where} variants", i), where)
            for i, d in enumerate(parts["variants"]))
        for v in variants:
            if not v.op or not isinstance(v.op, str):
                raise ManifestError(f"{where} variants", f"{v.name}.op", "missing")
        rows = tuple(_check_row(d) for d in parts["rows"])
        cubins = tuple(_check_cubin(d, i) for i, d in enumerate(parts["cubins"]))
        failures = tuple(dict(f) for f in parts["failures"])
        if not all(_plain(f) for f in failures):
            raise ValueError("failures must be plain maps")
    except (ManifestError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise PackError(where, f"invalid contents: {exc}") from None
    return Pack(header, variants, rows, cubins, failures, outer["sha256"])


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PackError(str(path), f"cannot read: {exc.strerror}") from None


def read_pack(path: str | os.PathLike) -> Pack:
    """Read, verify and decode a pack file (nothing is registered or executed)."""
    path = Path(path)
    return decode(_read_bytes(path), str(path))


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of the whole file, as ``sha256sum`` prints it: the value a publisher gives
    and a user compares. (The pack's ``sha256`` field is another hash: of header + body.)"""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def peek_header(path: str | os.PathLike) -> dict:
    """The header of a verified pack without decoding its body (for ``show`` and matching)."""
    path = Path(path)
    data = _read_bytes(path)
    outer = _outer(data, str(path))
    try:
        header = msgpack.unpackb(outer["header"], raw=False)
    except Exception as exc:  # noqa: BLE001 (msgpack raises several kinds)
        raise PackError(str(path), f"corrupted header ({exc})") from None
    check_header(header, str(path))
    return header | {"sha256": outer["sha256"], "size_bytes": len(data)}


def write_pack(pack: Pack, path: str | os.PathLike) -> str:
    """Write atomically (temp file + ``os.replace``); return the sha256 of header + body."""
    data, digest = encode(pack)
    atomic_write(Path(path), data)
    return digest


# ---- devices ----------------------------------------------------------------------------------

def same_device(a: Mapping, b: Mapping) -> bool:
    """True when two fingerprints name the same kind of device (versions may differ)."""
    shared = [k for k in IDENTITY_KEYS if k in a and k in b]
    return bool(shared) and all(a[k] == b[k] for k in shared) and "backend" in shared


def describe_device(fp: Mapping) -> str:
    parts = [str(fp.get("name", "?"))]
    for k in ("cc", "compute_capability", "sm_count", "cpu_count"):
        if k in fp:
            parts.append(f"{k}={fp[k]}")
    return f"{fp.get('backend', '?')}: " + ", ".join(parts)


def current_fingerprint(backend: str) -> dict | None:
    """The fingerprint of this machine's device for ``backend``; None if it has none."""
    from adaptive.backends import get_backend
    try:
        return get_backend(backend).fingerprint()
    except Exception:  # noqa: BLE001 (no such device here)
        return None


# ---- loading ----------------------------------------------------------------------------------

_loaded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # registry -> {sha256}
_load_lock = threading.RLock()


def load_pack(path: str | os.PathLike, registry: Registry | None = None,
              fingerprint: Mapping | None = None) -> LoadReport:
    """Verify a pack, then add its variants to the registry and its rows to the dispatchers.

    The hash is checked before anything is decoded; any problem raises
    :class:`~adaptive.errors.PackError` and nothing is loaded. A pack measured on another
    device loads with a :class:`PackDeviceWarning` and its rows get weight
    :data:`FOREIGN_WEIGHT`. Loading the same pack twice into a registry is a no-op.
    Packs carry code (kernel and Python source): load only packs you trust.

    Args:
        path: the pack file.
        registry: where variants go (default: the shared registry of default dispatchers).
        fingerprint: the device to compare with (default: this machine's device for the
            pack's backend).

    Returns:
        A :class:`LoadReport`.

    Example:
        >>> adaptive.load_pack("h200.msgpack").rows
        1840
    """
    from adaptive import dispatch
    pack = read_pack(path)
    shared = registry is None or registry is dispatch.shared_registry()
    registry = dispatch.shared_registry() if shared else registry
    if fingerprint is None:
        fingerprint = current_fingerprint(pack.fingerprint.get("backend", "host"))
    match = fingerprint is not None and same_device(pack.fingerprint, fingerprint)
    with _load_lock:
        done = _loaded.setdefault(registry, set())
        if pack.sha256 in done:
            return LoadReport(str(path), pack.sha256, (), tuple(v.id for v in pack.variants),
                              (), 0, 1.0 if match else FOREIGN_WEIGHT, match)
        add, present, skipped = _plan_variants(pack, registry, str(path))
        usable = {v.id for v in add} | {v.id for v in present}
        rows = [r for r in pack.rows if f"{r.op}/{r.variant}" in usable]
        weight = 1.0 if match else FOREIGN_WEIGHT
        if not match:
            here = describe_device(fingerprint) if fingerprint else "no such device here"
            warnings.warn(f"pack {path} was measured on {describe_device(pack.fingerprint)}, "
                          f"not this device ({here}); its {len(rows)} rows are down-weighted to "
                          f"{weight}", PackDeviceWarning, stacklevel=2)
        from adaptive.ops import KEY_VERSION
        if pack.header.get("key_version") != KEY_VERSION:
            log.warning("pack %s: key version %s != %s; its rows are ignored", path,
                        pack.header.get("key_version"), KEY_VERSION)
            rows = []
        for v in add:
            registry.add(dataclasses.replace(v, origin=f"pack {path}"))
        done.add(pack.sha256)
    _install_cubins(pack, registry)
    if rows:
        rows = [dataclasses.replace(r, source="pack") for r in rows]
        if shared:
            dispatch.add_observations(rows, weight)
        else:
            dispatch.add_observations(rows, weight, registry=registry)
    log.info("loaded pack %s: %d variants added, %d rows (weight %s)", path, len(add),
             len(rows), weight)
    return LoadReport(str(path), pack.sha256, tuple(v.id for v in add),
                      tuple(v.id for v in present), tuple(skipped), len(rows), weight, match)


def _plan_variants(pack: Pack, registry: Registry, where: str):
    """Split the pack's variants into new, already present, and skipped (with a warning)."""
    from adaptive.ops import OPS
    add, present, skipped = [], [], []
    for v in pack.variants:
        if v.op not in OPS:
            skipped.append(v.id)
            log.warning("pack %s: variant %s is of unknown op %r; skipped", where, v.id, v.op)
            continue
        known = {x.name: x for x in registry.variants(v.op)}.get(v.name)
        if known is None:
            add.append(v)
        elif _code_of(known) == _code_of(v):
            present.append(v)
        else:
            skipped.append(v.id)
            log.warning("pack %s: variant %s differs from the registered one (from %s); kept "
                        "the registered one and ignored the pack's rows for it", where, v.id,
                        known.origin)
    return add, present, skipped


def _code_of(v: Variant) -> dict:
    """What decides a variant's behaviour (not its doc, provenance or measured resources)."""
    d = v.to_dict()
    for k in ("doc", "provenance", "resources", "source_name"):
        d.pop(k)
    return d


@functools.lru_cache(maxsize=1)
def runnable_archs() -> frozenset[str]:
    """The GPU archs (``sm_90``) of the CUDA devices this process sees; empty without a
    GPU or CuPy. Cubins of other archs in a pack are never written to the cache."""
    try:
        import cupy
        rt = cupy.cuda.runtime
        return frozenset(f"sm_{p['major']}{p['minor']}" for p in
                         (rt.getDeviceProperties(i) for i in range(rt.getDeviceCount())))
    except Exception:  # noqa: BLE001 (no CuPy, no driver, no device: nothing runs)
        return frozenset()


def _recomputed_key(c: Cubin, variants: Mapping[str, Variant], compiler: str) -> str | None:
    """The kernel-cache key of ``c`` computed here from its variant's source and config
    for each dtype of its op; None when none of them is ``c.key``."""
    from adaptive import nvrtc
    from adaptive.kcache import kernel_key
    from adaptive.ops import OPS
    v = variants.get(c.variant)
    if v is None or v.language != "cuda" or v.op not in OPS:
        return None
    try:
        options = nvrtc.macro_options(c.config) + tuple(v.options)
        for dtype in OPS[v.op].dtypes:
            source = nvrtc.full_source(v.source, dtype, v.source_name or f"{v.name}.cu")
            key = kernel_key(source, options, c.arch, compiler)
            if key == c.key:
                return key
    except ValueError:   # a config value that cannot be a macro, a dtype without a C type
        return None
    return None


def _install_cubins(pack: Pack, registry: Registry | None = None) -> int:
    """Hand carried cubins to the kernel cache: only those of an arch this process can
    run, whose key recomputes from the variant (registered, else the pack's) to the same
    digest; the number written. Without NVRTC the backend compiles with CuPy and never
    reads the cache, so nothing is written."""
    archs = runnable_archs()
    usable = [c for c in pack.cubins if c.arch in archs]
    if not usable:
        if pack.cubins:
            log.info("pack: %d cubins for %s, none for this process's GPUs (%s); not cached",
                     len(pack.cubins), ", ".join(sorted({c.arch for c in pack.cubins})),
                     ", ".join(sorted(archs)) or "none")
        return 0
    from adaptive import config, nvrtc
    from adaptive.kcache import KernelCache
    if not nvrtc.available():
        return 0
    compiler = nvrtc.compiler_version()
    if registry is None:
        from adaptive import dispatch
        registry = dispatch.shared_registry()
    variants = {v.id: v for v in pack.variants}
    for v in {c.variant for c in usable}:
        op, _, name = v.partition("/")
        known = {x.name: x for x in registry.variants(op)}.get(name) if op in \
            registry.ops() else None
        if known is not None:
            variants[v] = known
    cache = KernelCache(config.get().cache_dir)
    written = 0
    for c in usable:
        key = _recomputed_key(c, variants, compiler)
        if key is None:
            log.warning("pack cubin %s… of %s does not match its variant's source and config "
                        "here (or another NVRTC built it); not cached", c.key[:12], c.variant)
            continue
        try:
            if cache.get(key) is None:
                cache.put(key, bytes(c.image), dict(c.resources))
                written += 1
        except OSError as exc:   # a cache failure only costs a compile
            log.warning("pack cubin %s not cached: %s", key[:12], exc)
    return written


_startup_done: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # registry -> {device}


def shipped_packs_for(fingerprint: Mapping) -> list[Path]:
    """The shipped packs measured on the device ``fingerprint`` describes (a pack whose
    header cannot be read is logged and left out; loading it would refuse it anyway)."""
    from adaptive.packs import shipped_packs
    out = []
    for p in shipped_packs():
        try:
            if same_device(_cached_header(p).get("fingerprint", {}), fingerprint):
                out.append(p)
        except PackError as exc:
            log.error("shipped pack refused: %s", exc)
    return out


def load_startup_packs(backend, registry: Registry | None = None) -> list[LoadReport]:
    """``ADAPTIVE_PACKS`` and the shipped packs matching ``backend``'s device, once per
    registry and device (a dispatcher on the shared registry calls this when created)."""
    from adaptive import config, dispatch
    registry = dispatch.shared_registry() if registry is None else registry
    fp = backend.fingerprint()
    with _load_lock:
        done = _startup_done.setdefault(registry, set())
        if describe_device(fp) in done:
            return []
    reports = []
    for p in [p for p in config.get().packs.split(":") if p]:
        mine = _backend_of(p) == backend.name
        reports.append(load_pack(p, registry, fp if mine else None))
    for p in shipped_packs_for(fp):
        try:
            reports.append(load_pack(p, registry, fp))
        except PackError as exc:
            log.error("shipped pack refused: %s", exc)
    with _load_lock:
        done.add(describe_device(fp))   # only now: a refused ADAPTIVE_PACKS raises again
    return reports


@functools.lru_cache(maxsize=32)
def _header_at(path: str, mtime_ns: int, size: int) -> dict:
    return peek_header(path)


def _cached_header(path: Path) -> dict:
    st = path.stat()
    return _header_at(str(path), st.st_mtime_ns, st.st_size)


def _backend_of(path: str) -> str | None:
    try:
        return peek_header(path).get("fingerprint", {}).get("backend")
    except PackError:
        return None   # load_pack reports the problem
