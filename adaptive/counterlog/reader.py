"""Reading counter logs back: records, rotated files, measurement rows."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import zlib
from collections.abc import Sequence

import msgpack

from adaptive.observation import Observation
from adaptive.counterlog.format import _HEADER_KEYS, FORMAT, VERSION, CounterLogError

log = logging.getLogger("adaptive.counterlog")


# ---- reading ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LogContents:
    """What :func:`read_log` found: records oldest first, the files read, and their headers."""

    records: tuple[dict, ...]
    files: tuple[str, ...]
    headers: tuple[dict, ...]
    truncated_bytes: int = 0     # an incomplete last frame (a killed writer), skipped


def read_file(path: str | os.PathLike) -> tuple[dict, list[dict], int]:
    """(header, records, truncated bytes) of one log file; raises CounterLogError if corrupt."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1 << 20))
    unpacker.feed(data)
    header, records, offset, plans = None, [], 0, {}
    while True:
        offset = unpacker.tell()
        try:
            frame = next(unpacker)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 (msgpack raises several kinds)
            raise _corrupt(path, offset, f"not msgpack ({type(exc).__name__}: {exc})",
                           len(records)) from None
        payload = _unframe(path, offset, frame, len(records))
        if header is None:
            header = _check_header(path, payload)
        else:
            records += _expand(path, offset, payload, plans, len(records))
    truncated = len(data) - offset
    if header is None and truncated == 0:
        raise CounterLogError(f"{path} is empty; expected an adaptive counter log "
                              "(write one with adaptive.counter_log)")
    if header is None:
        raise _corrupt(path, 0, "the header frame is incomplete", 0)
    if truncated:
        log.warning("%s: last record incomplete (%d bytes at offset %d, the writer was probably "
                    "killed); skipped it", path, truncated, offset)
    return header, records, truncated


def _unframe(path, offset, frame, n) -> dict:
    if not (isinstance(frame, list) and len(frame) == 2 and isinstance(frame[0], int)
            and isinstance(frame[1], bytes)):
        raise _corrupt(path, offset, f"expected a [crc32, payload] frame, got "
                       f"{type(frame).__name__}", n)
    crc, payload = frame
    if zlib.crc32(payload) != crc:
        raise _corrupt(path, offset, "checksum mismatch", n)
    try:
        record = msgpack.unpackb(payload, raw=False)
    except Exception as exc:  # noqa: BLE001
        raise _corrupt(path, offset, f"payload is not msgpack ({exc})", n) from None
    if not isinstance(record, dict):
        raise _corrupt(path, offset, f"payload is a {type(record).__name__}, not a map", n)
    return record


def _expand(path, offset, batch: dict, plans: dict, n: int) -> list[dict]:
    """The records of one batch frame; ``plans`` carries plan fields across frames."""
    try:
        for pid, static in batch["plans"]:
            plans[pid] = static
        states = batch["states"]
        out = []
        for seq, pid, time_s, time_ms, timer, sid in batch["rows"]:
            record = {"seq": seq, "time_s": time_s, **plans[pid], "time_ms": time_ms,
                      "timer": timer}
            if sid >= 0:
                record["device_state"] = states[sid]
            out.append(record)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise _corrupt(path, offset, f"malformed batch ({type(exc).__name__}: {exc})",
                       n) from None
    return out


def _corrupt(path, offset, why, n) -> CounterLogError:
    return CounterLogError(f"{path}: corrupt record at byte {offset}: {why}; the {n} records "
                           "before it are intact. The file was damaged or is not an adaptive "
                           "counter log; copy the intact prefix or delete the file")


def _check_header(path, header: dict) -> dict:
    if any(k not in header for k in _HEADER_KEYS) or header["format"] != FORMAT:
        raise CounterLogError(f"{path} is not an adaptive counter log: its first record has "
                              f"format={header.get('format')!r}, expected {FORMAT!r}")
    if header["version"] > VERSION:
        raise CounterLogError(f"{path} is counter-log version {header['version']}; this "
                              f"adaptive reads up to version {VERSION}: upgrade adaptive")
    return header


def log_files(path: str | os.PathLike) -> list[str]:
    """``path`` and its rotated predecessors, oldest first."""
    path = os.fspath(path)
    rotated = []
    i = 1
    while os.path.exists(f"{path}.{i}"):
        rotated.append(f"{path}.{i}")
        i += 1
    files = rotated[::-1] + ([path] if os.path.exists(path) else [])
    if not files:
        raise FileNotFoundError(f"no counter log at {path} (nor rotated {path}.1, ...)")
    return files


def read_log(path: str | os.PathLike, rotated: bool = True) -> LogContents:
    """Every record of a counter log (and, with ``rotated``, its rotated files), oldest first.

    A truncated last record in a file is skipped with a warning; corruption anywhere else
    raises :class:`CounterLogError` naming the file and byte offset.
    """
    files = log_files(path) if rotated else [os.fspath(path)]
    records, headers, truncated = [], [], 0
    for name in files:
        header, recs, cut = read_file(name)
        headers.append(header)
        records += recs
        truncated += cut
    return LogContents(tuple(records), tuple(files), tuple(headers), truncated)


def to_observations(records: Sequence[dict] | LogContents) -> list[Observation]:
    """Counter-log records as cost-model training rows (``source="log"``).

    Records without a finite time are skipped; device state goes to ``counters``.
    """
    if isinstance(records, LogContents):
        records = records.records
    rows = []
    for r in records:
        time_ms = r.get("time_ms")
        if not isinstance(time_ms, (int, float)) or not math.isfinite(time_ms) or time_ms <= 0:
            continue
        state = r.get("device_state") or {}
        rows.append(Observation(
            op=r["op"], dims=dict(r["dims"]), dtype=r["dtype"], variant=r["variant"],
            config=dict(r.get("config") or {}), time_ms=float(time_ms),
            floor_ms=float(r.get("floor_ms") or 0.0), features=dict(r.get("features") or {}),
            device={"backend": r.get("backend", ""), "device": r.get("device", ""),
                    "timer": r.get("timer", "")},
            counters={k: float(v) for k, v in state.items() if isinstance(v, (int, float))},
            timestamp_s=float(r.get("time_s", 0.0)), source="log"))
    return rows
