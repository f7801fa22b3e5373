"""Roofline peaks kept per device on disk, so only the first process on a GPU measures them.

Measuring a GPU's peaks (copy bandwidth, cuBLAS rates) takes a few hundred milliseconds
and a few hundred MiB of device memory, and it happens on the first miss of a process: in
a server, on its first request. The result depends on the device, so it is stored under
``<cache_dir>/peaks/v1/<sha256 of the device fingerprint>.json`` (written atomically) and
read by later processes on the same device. A file that does not parse, is of another
version or device, or holds non-positive rates is ignored and measured again.

The peaks are the measured ceiling: no run may beat the roofline floor they give. A run
that does proves them under-measured (a busy machine while measuring, data that stayed in
cache), so :func:`raise_to_observed` lifts the rate that set the floor to the rate that
run reached, in the process and in the stored file: floor / time never exceeds 1.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path

from adaptive.fileio import atomic_write

log = logging.getLogger("adaptive.peaks")

VERSION = 1


def peaks_path(fingerprint: Mapping, cache_dir: str | Path) -> Path:
    digest = hashlib.sha256(json.dumps(dict(fingerprint), sort_keys=True,
                                       default=str).encode()).hexdigest()
    return Path(cache_dir) / "peaks" / f"v{VERSION}" / f"{digest[:32]}.json"


def cached_peaks(fingerprint: Mapping, measure: Callable[[], dict],
                 cache_dir: str | Path | None) -> dict:
    """The peaks stored for this device, else ``measure()`` (then stored).

    Args:
        fingerprint: the device (``Backend.fingerprint()``): the file is per fingerprint.
        measure: measures ``{"flops_per_s": {dtype: rate}, "bytes_per_s": rate}``.
        cache_dir: where to keep them (None or "": measure every time).
    """
    path = peaks_path(fingerprint, cache_dir) if cache_dir else None
    if path is not None and path.exists():
        stored = _read(path, fingerprint)
        if stored is not None:
            return stored
    peaks = measure()
    if path is not None:
        _store(path, fingerprint, peaks)
    return peaks


def _store(path: Path, fingerprint: Mapping, peaks: Mapping) -> None:
    try:
        atomic_write(path, json.dumps({"version": VERSION, "fingerprint": dict(fingerprint),
                                       "peaks": peaks}, default=str, indent=1).encode())
    except OSError as exc:   # a read-only cache only costs a measurement per process
        log.warning("could not store peaks at %s: %s", path, exc)


def _read(path: Path, fingerprint: Mapping) -> dict | None:
    try:
        data = json.loads(path.read_text())
        peaks = data["peaks"]
        ok = (data.get("version") == VERSION
              and json.dumps(data.get("fingerprint"), sort_keys=True, default=str)
              == json.dumps(dict(fingerprint), sort_keys=True, default=str)
              and _positive(peaks["bytes_per_s"])
              and all(_positive(v) for v in peaks["flops_per_s"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("ignoring stored peaks %s (%s); measuring again", path, exc)
        return None
    if not ok:
        log.warning("ignoring stored peaks %s (another version or device, or bad rates); "
                    "measuring again", path)
        return None
    return peaks


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def raise_to_observed(backend, flops: float, nbytes: float, time_ms: float, dtype: str,
                      cache_dir: str | Path | None = None) -> bool:
    """Lift ``backend``'s peaks (in place, and in the stored file) when a run of ``time_ms``
    beat their roofline floor; True if they changed.

    Args:
        backend: whose ``peaks()`` (the same dict every call) and ``fingerprint()`` to use.
        flops, nbytes: the run's least work and bytes (``Op.roofline``).
        time_ms: its measured time.
        cache_dir: where the peaks are stored (default: the configured cache folder).
    """
    time_s = time_ms / 1e3
    if not (math.isfinite(time_s) and time_s > 0):
        return False
    peaks = backend.peaks()
    rates = peaks["flops_per_s"]
    name = dtype if rates.get(dtype) else max(rates, key=rates.get)   # as floor_ms picks
    changed = []
    # a hair above the run's rate, so that floor = work / rate stays <= time_ms after the
    # division's rounding
    if flops / rates[name] > time_s:
        rates[name] = flops / time_s * (1 + 1e-9)
        changed.append(f"{name} {rates[name]:.3g} flop/s")
    if nbytes / peaks["bytes_per_s"] > time_s:
        peaks["bytes_per_s"] = nbytes / time_s * (1 + 1e-9)
        changed.append(f"{peaks['bytes_per_s']:.3g} B/s")
    if not changed:
        return False
    log.info("a run beat the roofline floor: peaks raised to %s", ", ".join(changed))
    if cache_dir is None:
        from adaptive import config
        cache_dir = config.get().cache_dir
    if cache_dir:
        fingerprint = backend.fingerprint()
        _store(peaks_path(fingerprint, cache_dir), fingerprint, peaks)
    return True
