"""Installing packs: a pack's variants into a registry, its rows to the registry's
dispatchers, its cubins into the kernel cache; and the packs installed at start-up
(``ADAPTIVE_PACKS``, the shipped ones matching the device: :func:`load_startup_packs`,
called by :func:`adaptive.runtime.start`). The file format is :mod:`adaptive.packs.format`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path

from adaptive.errors import PackError
from adaptive.packs.format import (FOREIGN_WEIGHT, Cubin, Pack, describe_device, peek_header,
                                   read_pack, same_device)
from adaptive.variants import Registry, Variant, shared_registry

log = logging.getLogger("adaptive")


class PackDeviceWarning(UserWarning):
    """A pack measured on another device was loaded; its rows are down-weighted."""


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
    pack = read_pack(path)
    registry = shared_registry() if registry is None else registry
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
    install_cubins(pack, registry)
    if rows:
        rows = [dataclasses.replace(r, source="pack") for r in rows]
        registry.add_observations(rows, weight)
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
        known = {x.name: x for x in registry.variants(v.op, experimental=True)}.get(v.name)
        if known is None:
            add.append(v)
        elif code_of(known) == code_of(v):
            present.append(v)
        else:
            skipped.append(v.id)
            log.warning("pack %s: variant %s differs from the registered one (from %s); kept "
                        "the registered one and ignored the pack's rows for it", where, v.id,
                        known.origin)
    return add, present, skipped


def code_of(v: Variant) -> dict:
    """What decides a variant's behaviour (not its doc, provenance or measured resources,
    nor ``torch_library`` and ``baseline``, hints to callers and to the policy about what
    it runs, nor ``experimental``, which decides where it is listed: a pack measured while
    a variant was experimental serves it once its flag is dropped; run S156's 246 rows of
    ``flash_wgmma`` were ignored as of another variant when it was)."""
    d = v.to_dict()
    for k in ("doc", "provenance", "resources", "source_name"):
        d.pop(k)
    for k in ("torch_library", "baseline", "experimental"):
        d.pop(k, None)
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


def recomputed_key(c: Cubin, variants: Mapping[str, Variant], compiler: str) -> str | None:
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


def install_cubins(pack: Pack, registry: Registry | None = None) -> int:
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
        registry = shared_registry()
    variants = {v.id: v for v in pack.variants}
    for v in {c.variant for c in usable}:
        op, _, name = v.partition("/")
        known = ({x.name: x for x in registry.variants(op, experimental=True)}.get(name)
                 if op in registry.ops() else None)
        if known is not None:
            variants[v] = known
    cache = KernelCache(config.get().cache_dir)
    written = 0
    for c in usable:
        key = recomputed_key(c, variants, compiler)
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


def shipped_packs_like(fingerprint: Mapping) -> list[Path]:
    """Where no shipped pack was measured on the device ``fingerprint`` describes: the
    shipped packs of its backend and compute capability measured on the device nearest in
    SM count, then sharing the most words of its name (an H100 PCIe: the H100 SXM's pack
    before the H200's), all of them on a tie, for their rows to serve as priors (each pack
    more is a longer first fit); [] for a device without a compute capability (the host),
    with a pack of its own, or with no such pack. A model fitted on the H200 pack alone,
    each decided input held out of it, decided the H100 pack's 275 inputs at committed/best
    geomean 1.000-1.045 per op (79-100% within 5%), about what the H100's own pack does
    held out (1.000-1.037), where deciding cold (no model) read 1.000-1.177 (15-100% within
    5%); the other way round, 1.000-1.016 against cold's 1.000-1.170
    (``benchmarks/cpu_replay_foreign.py``)."""
    return [] if shipped_packs_for(fingerprint) else _nearest(_siblings(fingerprint))


def _nearest(siblings: list[tuple[tuple, Path]]) -> list[Path]:
    """Those of ``siblings`` (:func:`_siblings`) at the least distance."""
    nearest = min((d for d, _ in siblings), default=None)
    return [p for d, p in siblings if d == nearest]


def _siblings(fingerprint: Mapping) -> list[tuple[tuple, Path]]:
    """The shipped packs of ``fingerprint``'s backend and compute capability measured on
    another device, each with its distance to it: (SM count difference, less the words of
    the name shared)."""
    from adaptive.packs import shipped_packs
    cc = fingerprint.get("cc", fingerprint.get("compute_capability"))
    if cc is None:
        return []
    out = []
    for p in shipped_packs():
        try:
            fp = _cached_header(p).get("fingerprint", {})
        except PackError as exc:
            log.error("shipped pack refused: %s", exc)
            continue
        if (fp.get("backend") == fingerprint.get("backend") and not same_device(fp, fingerprint)
                and fp.get("cc", fp.get("compute_capability")) == cc):
            sms = abs(int(fp.get("sm_count", 0)) - int(fingerprint.get("sm_count", 0)))
            out.append(((sms, -len(_words(fp) & _words(fingerprint))), p))
    return out


def _words(fingerprint: Mapping) -> set[str]:
    """The words of a device's name, lower case ("NVIDIA H100 PCIe": nvidia, h100, pcie)."""
    return set(str(fingerprint.get("name", "")).lower().split())


SIBLING_PACKS = ("auto", "on", "off")


def startup_shipped(fingerprint: Mapping, siblings: str | None = None
                    ) -> list[tuple[Path, bool]]:
    """The shipped packs a start loads for the device ``fingerprint`` describes, each with
    whether it was measured on it: its own; with ``siblings`` (``ADAPTIVE_SIBLING_PACKS``
    where None) "auto", where it has none, those of :func:`shipped_packs_like`; "on", every
    other pack of its compute capability beside its own too; "off", none of another device.
    Held out by input on the H200 pack over three seeds of the model, the H100 pack's rows
    beside its own (weighted 0.25) read committed/best 1.000-1.002 per op on inputs the
    H100 measured (own alone: up to 1.024), and on inputs neither card measured moved
    attention by -0.007 to +0.001 and spmm by +0.003 to +0.018: hence "auto" (the default)
    (``benchmarks/cpu_replay_foreign.py --beside``, docs/benchmarks.md)."""
    from adaptive import config
    siblings = config.get().sibling_packs if siblings is None else siblings
    if siblings not in SIBLING_PACKS:
        raise ValueError(f"ADAPTIVE_SIBLING_PACKS={siblings!r}: expected one of "
                         f"{', '.join(SIBLING_PACKS)}")
    own = [(p, True) for p in shipped_packs_for(fingerprint)]
    if siblings == "off" or (own and siblings == "auto"):
        return own
    siblings = _siblings(fingerprint)
    if own:
        return own + [(p, False) for _, p in sorted(siblings, key=lambda dp: dp[0])]
    return [(p, False) for p in _nearest(siblings)]


def load_startup_packs(backend, registry: Registry | None = None) -> list[LoadReport]:
    """``ADAPTIVE_PACKS`` and the shipped packs matching ``backend``'s device, once per
    registry and device (:func:`adaptive.runtime.start` calls this); with none matching,
    those of its compute capability (:func:`startup_shipped`), their rows weighted
    :data:`FOREIGN_WEIGHT`, said once in a warning."""
    from adaptive import config
    registry = shared_registry() if registry is None else registry
    fp = backend.fingerprint()
    with _load_lock:
        done = _startup_done.setdefault(registry, set())
        if describe_device(fp) in done:
            return []
    reports = []
    for p in [p for p in config.get().packs.split(":") if p]:
        mine = _backend_of(p) == backend.name
        reports.append(load_pack(p, registry, fp if mine else None))
    shipped = startup_shipped(fp)
    others = [p.name for p, own in shipped if not own]
    if others and not any(own for _, own in shipped):
        log.warning("no shipped pack was measured on this GPU (%s); the shipped packs of its "
                    "compute capability serve as the model's priors, their rows weighted %s: "
                    "%s. A pack for this GPU: adaptive pack build --shapes wide --cubins -o "
                    "this-gpu.msgpack (about 10 min on an H100), then "
                    "ADAPTIVE_PACKS=this-gpu.msgpack", describe_device(fp), FOREIGN_WEIGHT,
                    ", ".join(others))
    elif others:
        log.info("beside this GPU's shipped pack, those of other GPUs of its compute "
                 "capability, their rows weighted %s (ADAPTIVE_SIBLING_PACKS=on): %s",
                 FOREIGN_WEIGHT, ", ".join(others))
    for p, _ in shipped:
        try:
            with warnings.catch_warnings():   # said once above, not once per pack
                warnings.simplefilter("ignore", PackDeviceWarning)
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
