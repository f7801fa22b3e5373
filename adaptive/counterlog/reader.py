"""Reading counter logs back: records, rotated files, damage accounting, measurement rows.

:func:`iter_log` streams records (bounded memory: one read chunk and one frame at a
time); :func:`read_log` collects them. A damaged frame is skipped: the reader searches
for the next frame marker, reads on, and counts the bytes, frames and (from the gap in
sequence numbers) records lost; an incomplete last frame (a killed writer) is counted
as truncated.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import zlib
from collections.abc import Iterator, Sequence

import msgpack

from adaptive.observation import Observation
from adaptive.counterlog.format import (HEADER_KEYS, FORMAT, FRAME_HEAD_BYTES, MAGIC,
                                        MAX_FRAME_BYTES, ROW_FIELDS, VERSION, CounterLogError,
                                        unpack_head)

log = logging.getLogger("adaptive.counterlog")

_CHUNK_BYTES = 1 << 20


@dataclasses.dataclass
class ReadStats:
    """What reading found besides records: damage, truncation, the writer's drop count."""

    files: list[str] = dataclasses.field(default_factory=list)
    headers: list[dict] = dataclasses.field(default_factory=list)
    records: int = 0
    truncated_bytes: int = 0     # an incomplete last frame (a killed writer), skipped
    lost_bytes: int = 0          # damaged bytes skipped while resynchronising
    lost_frames: int = 0         # frames that failed their length or checksum test
    lost_records: int = 0        # records missing between intact frames (sequence gaps)
    dropped_records: int = 0     # records the writer dropped (it fell behind), as it logged
    sample_every_min: int | None = None    # the range of sampling intervals of the records
    sample_every_max: int | None = None
    cupti_active: float | None = None      # the fraction of time CUPTI timed calls
    cupti_handover: str | None = None      # why the writer handed CUPTI over to events
    # governed CUPTI (newer logs): the probe's state (governor.CUPTI_STATES), the launch
    # rate it measured, its estimate of CUPTI's cost (a fraction of wall time), and why
    cupti_state: str | None = None
    launch_rate_per_s: float | None = None
    cupti_estimate: float | None = None
    cupti_decision: str | None = None

    def damage_text(self) -> str:
        """One line on damage and truncation ("" when the log read cleanly)."""
        parts = []
        if self.lost_frames:
            parts.append(f"{self.lost_frames} damaged frame(s) skipped ({self.lost_bytes} "
                         f"bytes, {self.lost_records} records lost)")
        if self.truncated_bytes:
            parts.append(f"{self.truncated_bytes} bytes of an incomplete last frame skipped "
                         "(the writer was stopped mid-write)")
        if self.dropped_records:
            parts.append(f"{self.dropped_records} records dropped by the writer (it fell "
                         "behind)")
        return "; ".join(parts)


@dataclasses.dataclass(frozen=True)
class LogContents:
    """What :func:`read_log` found: records oldest first, the files read, and their headers."""

    records: tuple[dict, ...]
    files: tuple[str, ...]
    headers: tuple[dict, ...]
    truncated_bytes: int = 0
    lost_bytes: int = 0
    lost_frames: int = 0
    lost_records: int = 0
    dropped_records: int = 0
    sample_every_min: int | None = None
    sample_every_max: int | None = None
    cupti_active: float | None = None
    cupti_handover: str | None = None
    cupti_state: str | None = None
    launch_rate_per_s: float | None = None
    cupti_estimate: float | None = None
    cupti_decision: str | None = None

    @property
    def stats(self) -> ReadStats:
        return ReadStats(list(self.files), list(self.headers), len(self.records),
                         self.truncated_bytes, self.lost_bytes, self.lost_frames,
                         self.lost_records, self.dropped_records, self.sample_every_min,
                         self.sample_every_max, self.cupti_active, self.cupti_handover,
                         self.cupti_state, self.launch_rate_per_s, self.cupti_estimate,
                         self.cupti_decision)


# ---- frames -----------------------------------------------------------------------------------

def _unpack(payload: bytes):
    return msgpack.unpackb(payload, raw=False)


def _unpack_plans(payload: bytes):
    """A payload map with only its ``plans`` (and header keys) decoded: rows are skipped
    without building them (the first pass of an export)."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(payload), 1 << 20))
    unpacker.feed(payload)
    out = {}
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if key in ("rows", "states"):
            unpacker.skip()
        else:
            out[key] = unpacker.unpack()
    return out


def _frames(path: str, stats: ReadStats, decode=_unpack) -> Iterator[tuple[int, dict]]:
    """(file offset, payload map) of every intact v2 frame of ``path``, in order."""
    with open(path, "rb") as f:
        buf = bytearray()
        base = pos = 0              # file offset of buf[0]; position in buf
        eof = False
        bad_since = None            # start of a damaged region being skipped
        failed = 0                  # failed frame tests in that region

        def fill() -> bool:
            nonlocal eof
            chunk = f.read(_CHUNK_BYTES)
            if not chunk:
                eof = True
                return False
            buf.extend(chunk)
            return True

        def damaged(at: int) -> None:
            nonlocal bad_since, failed
            if bad_since is None:
                bad_since = at
            failed += 1

        def resynchronised(at: int) -> None:
            nonlocal bad_since, failed
            if bad_since is not None:
                stats.lost_bytes += at - bad_since
                stats.lost_frames += max(failed, 1)
                log.warning("%s: %d damaged bytes at offset %d skipped; reading on from the "
                            "next frame at %d", path, at - bad_since, bad_since, at)
                bad_since, failed = None, 0

        while True:
            if pos > _CHUNK_BYTES:                  # keep the buffer about one chunk
                del buf[:pos]
                base += pos
                pos = 0
            if len(buf) - pos < FRAME_HEAD_BYTES and not eof and fill():
                continue
            if len(buf) - pos < FRAME_HEAD_BYTES:
                break
            magic, length, crc = unpack_head(buf, pos)
            if magic != MAGIC:
                if bad_since is None:
                    bad_since = base + pos
                nxt = buf.find(MAGIC, pos + 1)
                while nxt < 0 and not eof:
                    keep = len(buf) - (len(MAGIC) - 1)
                    pos = max(pos + 1, keep)
                    fill()
                    nxt = buf.find(MAGIC, pos)
                if nxt < 0:
                    pos = len(buf)
                    break
                pos = nxt
                continue
            end = pos + FRAME_HEAD_BYTES + length
            if length > MAX_FRAME_BYTES:
                damaged(base + pos)
                pos += 1
                continue
            while len(buf) < end and not eof:
                fill()
            if len(buf) < end:                      # runs past the end of the file
                if buf.find(MAGIC, pos + 1) >= 0:   # a later frame: this length is damaged
                    damaged(base + pos)
                    pos += 1
                    continue
                break                               # the last frame, cut short
            payload = bytes(buf[pos + FRAME_HEAD_BYTES:end])
            if zlib.crc32(payload) != crc:
                damaged(base + pos)
                pos += 1
                continue
            try:
                value = decode(payload)
            except Exception:  # noqa: BLE001 (a checksum collision on damage: skip it)
                damaged(base + pos)
                pos += 1
                continue
            if not isinstance(value, dict):
                damaged(base + pos)
                pos += 1
                continue
            resynchronised(base + pos)
            yield base + pos, value
            pos = end
        rest = len(buf) - pos
        if bad_since is not None:                   # damage running into the end
            stats.lost_bytes += base + len(buf) - bad_since
            stats.lost_frames += max(failed, 1)
            log.warning("%s: %d damaged bytes at offset %d, to the end of the file, skipped",
                        path, base + len(buf) - bad_since, bad_since)
        elif rest:
            stats.truncated_bytes += rest
            log.warning("%s: last record incomplete (%d bytes at offset %d, the writer was "
                        "probably killed); skipped it", path, rest, base + pos)


@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch frame, normalised: ``plans`` id -> per-plan fields, ``states`` device
    states, ``rows`` tuples of :data:`ROW_FIELDS` (``stream`` None in version-1 logs;
    ``sample_every`` the header's rate in logs before version 3)."""

    plans: dict
    states: list
    rows: list

    def records(self) -> Iterator[dict]:
        plans, states = self.plans, self.states
        for seq, pid, time_s, time_ms, timer, sid, stream, every in self.rows:
            record = {"seq": seq, "time_s": time_s, **plans[pid], "time_ms": time_ms,
                      "timer": timer, "stream": stream, "sample_every": every}
            if sid >= 0:
                record["device_state"] = states[sid]
            yield record


def _batch(path: str, offset: int, payload: dict, plans: dict | None = None,
           every: int | None = None) -> Batch:
    """A checked :class:`Batch` of a frame's payload (``plans``: v1's per-file table;
    ``every``: the header's sampling rate, the interval of rows before version 3)."""
    try:
        if plans is None:
            plans = {pid: static for pid, static in payload["plans"]}
        else:
            for pid, static in payload["plans"]:
                plans[pid] = static
        if not all(isinstance(v, dict) for v in plans.values()):
            raise TypeError("plan fields must be maps")
        states, rows = payload["states"], payload["rows"]
        if not isinstance(states, list) or not isinstance(rows, list):
            raise TypeError("states and rows must be lists")
        if rows and len(rows[0]) == 6:                     # version 1: no stream
            rows = [(*row, None, every) for row in rows]
        elif rows and len(rows[0]) == 7:                   # version 2: no sample_every
            rows = [(*row, every) for row in rows]
        # checked column-wise (a frame passed its checksum: damage here is a writer bug
        # or a forged file, so one clear error for the frame)
        if set(map(len, rows)) - {8}:
            raise ValueError(f"rows must have {len(ROW_FIELDS)} fields ({', '.join(ROW_FIELDS)})")
        if rows:
            seqs, pids, times, ms, timers, sids, streams, everys = zip(*rows)
            if not set(pids) <= plans.keys():
                raise ValueError(f"rows name plans {sorted(set(pids) - plans.keys())}, absent")
            if min(sids) < -1 or max(sids) >= len(states):
                raise ValueError(f"rows name device states outside 0..{len(states) - 1}")
            if not set(map(type, seqs)) <= {int} or not set(map(type, sids)) <= {int}:
                raise ValueError("sequence numbers and state indices must be integers")
            if not set(map(type, times)) | set(map(type, ms)) <= {int, float}:
                raise ValueError("times must be numbers")
            if not set(map(type, timers)) <= {str} or not set(map(type, streams)) <= {
                    int, type(None)}:
                raise ValueError("timers must be strings and streams integers")
            if not set(map(type, everys)) <= {int, type(None)}:
                raise ValueError("sampling intervals must be integers")
        out = rows
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise _corrupt(path, offset, f"malformed batch ({type(exc).__name__}: {exc})") from None
    return Batch(dict(plans), states, out)


def _header_every(header: dict) -> int | None:
    every = header.get("sample_every")
    return every if isinstance(every, int) and not isinstance(every, bool) else None


def _note_intervals(stats: ReadStats, rows: list) -> None:
    """Widen ``stats``' range of sampling intervals by a batch's rows."""
    everys = [row[7] for row in rows if row[7] is not None]
    if everys:
        lo, hi = min(everys), max(everys)
        stats.sample_every_min = lo if stats.sample_every_min is None else min(
            stats.sample_every_min, lo)
        stats.sample_every_max = hi if stats.sample_every_max is None else max(
            stats.sample_every_max, hi)


def _corrupt(path, offset, why, n: int | None = None) -> CounterLogError:
    before = f"; the {n} records before it are intact" if n is not None else ""
    return CounterLogError(f"{path}: corrupt record at byte {offset}: {why}{before}. The file "
                           "was damaged or is not an adaptive counter log")


def _check_header(path, header: dict) -> dict:
    if any(k not in header for k in HEADER_KEYS) or header["format"] != FORMAT:
        raise CounterLogError(f"{path} is not an adaptive counter log: its first record has "
                              f"format={header.get('format')!r}, expected {FORMAT!r}")
    if not isinstance(header["version"], int) or header["version"] > VERSION:
        raise CounterLogError(f"{path} is counter-log version {header['version']}; this "
                              f"adaptive reads up to version {VERSION}: upgrade adaptive")
    return header


def iter_batches(path: str | os.PathLike, stats: ReadStats | None = None) -> Iterator[Batch]:
    """The batches of one log file, oldest first, streamed; damage goes to ``stats``."""
    path = os.fspath(path)
    stats = stats if stats is not None else ReadStats()
    stats.files.append(path)
    with open(path, "rb") as f:
        start = f.read(len(MAGIC))
    if not start:
        raise CounterLogError(f"{path} is empty; expected an adaptive counter log "
                              "(write one with adaptive.counter_log)")
    if start[:1] == b"\x92":                       # version 1: [crc32, payload] arrays
        yield from _read_v1(path, stats)
        return
    if start != MAGIC and not _has_magic(path):
        raise CounterLogError(f"{path} is not an adaptive counter log: no frame marker in "
                              "it (expected a file written by adaptive.counter_log)")
    header, last_seq, damage_seen = None, None, 0
    for offset, payload in _frames(path, stats):
        if "format" in payload:
            header = _check_header(path, payload)
            stats.headers.append(header)
            continue
        if header is None:
            header = {"format": FORMAT, "version": VERSION, "header_lost": True}
            stats.headers.append(header)
            log.warning("%s: the header frame is damaged; reading the batches as version %d",
                        path, VERSION)
        batch = _batch(path, offset, payload, every=_header_every(header))
        if batch.rows:
            _note_intervals(stats, batch.rows)
            first = batch.rows[0][0]
            if last_seq is not None and stats.lost_frames > damage_seen and first > last_seq + 1:
                stats.lost_records += first - last_seq - 1
            damage_seen = stats.lost_frames
            last_seq = batch.rows[-1][0]
        dropped = payload.get("dropped", 0)
        if isinstance(dropped, int):
            stats.dropped_records = max(stats.dropped_records, dropped)
        governor = payload.get("governor")
        if isinstance(governor, dict):
            _note_governor(stats, governor)
        stats.records += len(batch.rows)
        yield batch
    if header is None:
        raise _corrupt(path, 0, "no intact frame in the file", 0)


def _note_governor(stats: ReadStats, governor: dict) -> None:
    """The CUPTI fields of a batch's ``governor`` map (the latest batch's win); fields of
    the wrong type are ignored (data until validated)."""
    for key, field in (("cupti_active", "cupti_active"),
                       ("launch_rate_per_s", "launch_rate_per_s"),
                       ("cupti_estimate", "cupti_estimate")):
        value = governor.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(stats, field, float(value))
    for key, field in (("handover", "cupti_handover"), ("cupti_state", "cupti_state"),
                       ("cupti_decision", "cupti_decision")):
        value = governor.get(key)
        if isinstance(value, str):
            setattr(stats, field, value)


def iter_plans(path: str | os.PathLike, rotated: bool = True) -> Iterator[dict]:
    """The per-plan fields of every batch of a log (rows not decoded: fast); a plan
    appears once per batch that names it."""
    for name in (log_files(path) if rotated else [os.fspath(path)]):
        with open(name, "rb") as f:
            v2 = f.read(len(MAGIC)) == MAGIC
        if not v2:
            for batch in iter_batches(name):
                yield from batch.plans.values()
            continue
        for _, payload in _frames(name, ReadStats(), _unpack_plans):
            plans = payload.get("plans")
            if isinstance(plans, list):
                for item in plans:
                    if isinstance(item, list) and len(item) == 2 and isinstance(item[1], dict):
                        yield item[1]


def iter_file(path: str | os.PathLike, stats: ReadStats | None = None) -> Iterator[dict]:
    """The records of one log file, oldest first, streamed; damage goes to ``stats``."""
    for batch in iter_batches(path, stats):
        yield from batch.records()


def _has_magic(path: str) -> bool:
    with open(path, "rb") as f:
        tail = b""
        while chunk := f.read(_CHUNK_BYTES):
            if MAGIC in tail + chunk:
                return True
            tail = chunk[-(len(MAGIC) - 1):]
    return False


def _read_v1(path: str, stats: ReadStats) -> Iterator[Batch]:
    """The batches of a version-1 file (no resynchronisation: damage is an error)."""
    with open(path, "rb") as f:
        data = f.read()
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1 << 20))
    unpacker.feed(data)
    header, offset, plans, n = None, 0, {}, 0
    while True:
        offset = unpacker.tell()
        try:
            frame = next(unpacker)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 (msgpack raises several kinds)
            raise _corrupt(path, offset, f"not msgpack ({type(exc).__name__}: {exc})",
                           n) from None
        if not (isinstance(frame, list) and len(frame) == 2 and isinstance(frame[0], int)
                and isinstance(frame[1], bytes)) or zlib.crc32(frame[1]) != frame[0]:
            raise _corrupt(path, offset, "checksum mismatch or not a [crc32, payload] frame "
                           "(version-1 logs cannot skip damage)", n)
        payload = msgpack.unpackb(frame[1], raw=False)
        if header is None:
            if not isinstance(payload, dict):
                raise _corrupt(path, offset, "the header is not a map", 0)
            header = _check_header(path, payload)
            stats.headers.append(header)
            continue
        batch = _batch(path, offset, payload, plans, _header_every(header))
        _note_intervals(stats, batch.rows)
        n += len(batch.rows)
        stats.records += len(batch.rows)
        yield batch
    truncated = len(data) - offset
    if header is None:
        raise _corrupt(path, 0, "the header frame is incomplete", 0)
    if truncated:
        stats.truncated_bytes += truncated
        log.warning("%s: last record incomplete (%d bytes at offset %d, the writer was probably "
                    "killed); skipped it", path, truncated, offset)


def read_file(path: str | os.PathLike) -> tuple[dict, list[dict], int]:
    """(header, records, truncated bytes) of one log file (damaged frames skipped)."""
    stats = ReadStats()
    records = list(iter_file(path, stats))
    return stats.headers[0], records, stats.truncated_bytes


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


def iter_log(path: str | os.PathLike, rotated: bool = True,
             stats: ReadStats | None = None) -> Iterator[dict]:
    """Every record of a counter log (with ``rotated``, its rotated files first), streamed
    in bounded memory; ``stats`` (a :class:`ReadStats`) fills in as it goes."""
    for batch in iter_log_batches(path, rotated, stats):
        yield from batch.records()


def iter_log_batches(path: str | os.PathLike, rotated: bool = True,
                     stats: ReadStats | None = None) -> Iterator[Batch]:
    """:func:`iter_log` by batches (exports work on these: per-plan fields once a batch)."""
    files = log_files(path) if rotated else [os.fspath(path)]
    stats = stats if stats is not None else ReadStats()
    for name in files:
        yield from iter_batches(name, stats)


def read_log(path: str | os.PathLike, rotated: bool = True) -> LogContents:
    """Every record of a counter log (and, with ``rotated``, its rotated files), oldest first.

    Damaged frames are skipped (each with a warning) and counted in the result's
    ``lost_*`` fields; an incomplete last frame in ``truncated_bytes``.
    """
    stats = ReadStats()
    records = tuple(iter_log(path, rotated, stats))
    return LogContents(records, tuple(stats.files), tuple(stats.headers),
                       stats.truncated_bytes, stats.lost_bytes, stats.lost_frames,
                       stats.lost_records, stats.dropped_records, stats.sample_every_min,
                       stats.sample_every_max, stats.cupti_active, stats.cupti_handover,
                       stats.cupti_state, stats.launch_rate_per_s, stats.cupti_estimate,
                       stats.cupti_decision)


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
