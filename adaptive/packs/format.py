"""Variant packs: variants + measurements + the device they were measured on, in one file.

A pack is a msgpack file (layout in ``docs/pack-format.md``): an outer map with a magic
string, the schema version, a sha256, and two byte strings — the header (creation time,
creator, device fingerprint) and the body (variants as source text + manifest entry,
measurement rows, optional cubins). The hash covers header and body and is checked
before either is decoded; nothing is pickled: the cost model is refitted from the rows.

This module is the file format (encode, decode, check, read, write, the device
fingerprint); installing a pack into a registry is :mod:`adaptive.packs.install`.
Loading a pack runs its code (Python variant source, CUDA kernels): load only packs
you trust. :func:`read_pack` refuses a truncated, corrupted or hash-mismatched file and
an unknown schema with :class:`~adaptive.errors.PackError`.

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
import hashlib
import logging
import os
import time
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgpack

from adaptive.errors import ManifestError, PackError
from adaptive.fileio import atomic_write
from adaptive.observation import Observation
from adaptive.variants import Variant, variant_from_dict

log = logging.getLogger("adaptive")

MAGIC = "adaptive-pack"
SCHEMA_VERSION = 2          # bump when the layout or the meaning of a field changes
# schemas this adaptive reads -> how the body is stored: 1 plain msgpack, 2 zlib-compressed
# msgpack (a body of cubins shrinks about 5x: the H200 pack's 11.3 MB to 2.25 MB)
BODY_ENCODING = {1: None, 2: "zlib"}
MAX_BODY_BYTES = 1 << 30    # a compressed body may not inflate past this (1 GiB)
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


def new_pack(variants: Iterable[Variant], rows: Iterable[Observation], fingerprint: Mapping,
             cubins: Iterable[Cubin] = (), failures: Iterable[Mapping] = (),
             build: Mapping | None = None, created_s: float | None = None) -> Pack:
    """A pack with a fresh header (schema, creation time, creator, device fingerprint)."""
    from adaptive.version import __version__
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
    header_bytes = _pack_bytes(header)
    body_bytes = zlib.compress(_pack_bytes(body), 6)
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
    if type(schema) is not int or schema not in BODY_ENCODING:
        raise PackError(where, f"unknown schema version {schema!r}; this adaptive reads "
                        f"schemas {sorted(BODY_ENCODING)}: rebuild the pack with this version")
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
    if header["schema"] not in BODY_ENCODING:
        raise PackError(where, f"header says schema {header['schema']}, this adaptive reads "
                        f"{sorted(BODY_ENCODING)}: rebuild the pack with this version")
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


def _body_bytes(outer: dict, where: str) -> bytes:
    """The body's msgpack bytes, inflated (bounded by :data:`MAX_BODY_BYTES`) if stored so."""
    if BODY_ENCODING[outer["schema"]] is None:
        return outer["body"]
    inflate = zlib.decompressobj()
    try:
        body = inflate.decompress(outer["body"], MAX_BODY_BYTES)
    except zlib.error as exc:
        raise PackError(where, f"corrupted body: it does not inflate ({exc}); rebuild the "
                        "pack or copy it again") from None
    if inflate.unconsumed_tail or not inflate.eof:
        raise PackError(where, f"the body inflates past {MAX_BODY_BYTES >> 20} MiB or is "
                        "truncated; rebuild the pack")
    return body


def decode(data: bytes, where: str = "<bytes>") -> Pack:
    """Verify and decode a pack's bytes; :class:`PackError` if anything is wrong."""
    outer = _outer(data, where)
    body_bytes = _body_bytes(outer, where)
    try:
        header = msgpack.unpackb(outer["header"], raw=False)
        body = msgpack.unpackb(body_bytes, raw=False)
    except Exception as exc:  # noqa: BLE001
        raise PackError(where, f"corrupted header or body ({exc})") from None
    check_header(header, where)
    if header["schema"] != outer["schema"]:
        raise PackError(where, f"header says schema {header['schema']}, the file's outer map "
                        f"{outer['schema']}: the pack is damaged: rebuild it")
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
