"""Counter-log exports that other tools read: CSV, Parquet, and a Chrome/Perfetto trace.

All three stream: records are read batch by batch (:func:`iter_log_batches`) and written
as they come, so memory stays bounded whatever the log's size. CSV and Parquet take two
passes (the first finds the dims and config columns and their types); the trace one.

Columns: the record's fields (``seq`` .. ``bytes``), ``dim_*`` and ``config_*`` per key
seen in the log, and the device state joined to the launch (the NVML/GPM sample nearest
before it, :data:`DEVICE_COLUMNS`; ``state_age_ms`` is how long before the launch it was
taken). The trace has one process per device, one track per stream (host: per thread),
each logged launch a complete slice named ``op/variant`` (laid out in stream order: a
slice starts when it was issued or when the previous one on its stream ended, whichever
is later) with its dims, config and time as args, and the device samples as counter
tracks; open it in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os

from adaptive.counterlog.format import CounterLogError
from adaptive.counterlog.reader import ReadStats, iter_log_batches, iter_plans

FORMATS = ("csv", "parquet", "trace")
RECORD_COLUMNS = ("seq", "time_s", "op", "variant", "dtype", "backend", "device", "timer",
                  "stream", "sample_every", "time_ms", "floor_ms", "flops", "bytes")
# the device state's fields (profilers.nvml.DeviceState), in export order
DEVICE_COLUMNS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c",
                  "gpu_util_ratio", "mem_util_ratio", "clock_event_reasons",
                  "mem_used_bytes", "other_processes", "other_processes_mem_bytes",
                  "sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio",
                  "dram_active_ratio")
STATE_COLUMNS = DEVICE_COLUMNS + ("clock_event_names", "state_age_ms")
_INT_DEVICE = {"clock_event_reasons", "mem_used_bytes", "other_processes",
               "other_processes_mem_bytes"}
_PLAN_A = ("op", "variant", "dtype", "backend", "device")
_PLAN_B = ("floor_ms", "flops", "bytes")
PARQUET_ROWS = 65536          # rows per Parquet row group (the bound on buffered rows)


def _finite(v) -> float | None:
    """``v`` as a float when it is a finite number, else None (JSON has no inf or NaN)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _clock_names(mask) -> str:
    from profilers.nvml import clock_event_names
    return "|".join(clock_event_names(mask)) if isinstance(mask, int) else ""


class _Layout:
    """The columns of a log (first pass): dims and config keys and their value types."""

    def __init__(self):
        self.dims: dict[str, str] = {}      # key -> "int" | "float" | "str"
        self.config: dict[str, str] = {}

    @classmethod
    def of(cls, path, rotated: bool) -> _Layout:
        layout = cls()
        for static in iter_plans(path, rotated):
            for key, v in (static.get("dims") or {}).items():
                layout.dims[key] = _widen(layout.dims.get(key), v)
            for key, v in (static.get("config") or {}).items():
                layout.config[key] = _widen(layout.config.get(key), v)
        return layout

    @property
    def columns(self) -> list[str]:
        return (list(RECORD_COLUMNS) + [f"dim_{k}" for k in sorted(self.dims)]
                + [f"config_{k}" for k in sorted(self.config)] + list(STATE_COLUMNS))


def _widen(kind: str | None, v) -> str:
    got = ("int" if isinstance(v, int) and not isinstance(v, bool) else
           "float" if isinstance(v, float) else "str")
    if kind is None or kind == got:
        return got
    if {kind, got} == {"int", "float"}:
        return "float"
    return "str"


def _scalar(v):
    return v if v is None or isinstance(v, (bool, int, float, str)) else json.dumps(v)


def write_csv(path, out: io.TextIOBase, rotated: bool = True,
              stats: ReadStats | None = None) -> int:
    """One CSV row per record of the log at ``path``; returns the rows written."""
    layout = _Layout.of(path, rotated)
    csv.writer(out).writerow(layout.columns)
    dims, configs = sorted(layout.dims), sorted(layout.config)
    empty_state = "," * (len(STATE_COLUMNS) - 1)
    n = 0
    for batch in iter_log_batches(path, rotated, stats):
        # per plan and per state the CSV text is made once a batch; a row formats 6 values
        plans = {}
        for pid, s in batch.plans.items():
            d, c = s.get("dims") or {}, s.get("config") or {}
            plans[pid] = (_csv_line([s.get(k) for k in _PLAN_A]),
                          _csv_line([s.get(k) for k in _PLAN_B] + [d.get(k) for k in dims]
                                    + [_scalar(c.get(k)) for k in configs]))
        states = [(_csv_line([st.get(k) for k in DEVICE_COLUMNS]
                             + [_clock_names(st.get("clock_event_reasons"))]), st.get("time_s"))
                  for st in batch.states]
        if not batch.rows:
            continue
        # column-wise: each column formatted by one C-level map, rows joined at the end
        seqs, pids, times, ms, timers, sids, streams, everys = zip(*batch.rows)
        ab = [plans[p] for p in pids]
        timer_text = [t if t in _SAFE_TIMERS else _csv_line([t]) for t in timers]
        stream_text = [("" if x is None else str(x)) + ("," if e is None else f",{e}")
                       for x, e in zip(streams, everys)]
        state_text = []
        for time_s, sid in zip(times, sids):
            if sid < 0:
                state_text.append(empty_state)
            else:
                text, at_s = states[sid]
                state_text.append(f"{text},{(time_s - at_s) * 1e3!r}" if at_s is not None
                                  else f"{text},")
        lines = map(",".join, zip(map(str, seqs), map(repr, times), [x[0] for x in ab],
                                  timer_text, stream_text, map(repr, ms), [x[1] for x in ab],
                                  state_text))
        out.write("\r\n".join(lines) + "\r\n")
        n += len(batch.rows)
    return n


_SAFE_TIMERS = frozenset({"host", "sync", "cuda_event", "cupti"})
_AFTER_CALL = frozenset({"host", "sync"})          # stamped when the call returned


def _csv_line(values: list) -> str:
    """``values`` as one CSV line without its end (quoted as the csv module quotes)."""
    buf = io.StringIO()
    csv.writer(buf).writerow(["" if v is None else v for v in values])
    return buf.getvalue().rstrip("\r\n")


def write_parquet(path, out_path: str | os.PathLike, rotated: bool = True,
                  stats: ReadStats | None = None) -> int:
    """The records as a Parquet file (needs pyarrow: the ``[parquet]`` extra); returns the
    rows written. Row groups of :data:`PARQUET_ROWS` rows bound the memory used."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise CounterLogError("Parquet export needs pyarrow: pip install "
                              "'adaptive-dispatch[parquet]'") from None
    layout = _Layout.of(path, rotated)
    types = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
    dims, configs = sorted(layout.dims), sorted(layout.config)
    plan_fields = [(k, pa.string()) for k in _PLAN_A] + [
        (k, pa.float64()) for k in _PLAN_B] + [
        (f"dim_{k}", types[layout.dims[k]]) for k in dims] + [
        (f"config_{k}", types[layout.config[k]]) for k in configs]
    state_fields = [(k, pa.int64() if k in _INT_DEVICE else pa.float64())
                    for k in DEVICE_COLUMNS] + [("clock_event_names", pa.string())]
    fields = ([("seq", pa.int64()), ("time_s", pa.float64()), ("timer", pa.string()),
               ("stream", pa.int64()), ("sample_every", pa.int64()),
               ("time_ms", pa.float64())] + plan_fields
              + state_fields + [("state_age_ms", pa.float64())])
    schema = pa.schema(fields)
    plan_cast = [_cast(t) for _, t in plan_fields]
    state_cast = [_cast(t) for _, t in state_fields]
    none_state = (None,) * len(state_fields)
    n = 0
    tmp = f"{os.fspath(out_path)}.tmp{os.getpid()}"
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            chunk: list[list] = [[] for _ in fields]
            rows_in_chunk = 0
            for batch in iter_log_batches(path, rotated, stats):
                if not batch.rows:
                    continue
                # per plan and per state the values are made (and cast) once a batch
                plans = {}
                for pid, s in batch.plans.items():
                    d, c = s.get("dims") or {}, s.get("config") or {}
                    raw = ([s.get(k) for k in _PLAN_A] + [s.get(k) for k in _PLAN_B]
                           + [d.get(k) for k in dims] + [_scalar(c.get(k)) for k in configs])
                    plans[pid] = tuple(cast(v) for cast, v in zip(plan_cast, raw))
                states = [tuple(cast(v) for cast, v in zip(
                    state_cast, [st.get(k) for k in DEVICE_COLUMNS]
                    + [_clock_names(st.get("clock_event_reasons"))])) for st in batch.states]
                at = [st.get("time_s") for st in batch.states]
                seqs, pids, times, ms, timers, sids, streams, everys = zip(*batch.rows)
                columns = [seqs, times, timers, streams, everys, ms]   # checked by the reader
                columns += zip(*[plans[p] for p in pids])
                columns += zip(*[states[i] if i >= 0 else none_state for i in sids])
                columns.append([(t - at[i]) * 1e3 if i >= 0 and isinstance(at[i], (int, float))
                                else None for t, i in zip(times, sids)])
                for target, column in zip(chunk, columns):
                    target.extend(column)
                rows_in_chunk += len(batch.rows)
                if rows_in_chunk >= PARQUET_ROWS:
                    writer.write_table(_table(pa, schema, chunk))
                    n += rows_in_chunk
                    chunk, rows_in_chunk = [[] for _ in fields], 0
            if rows_in_chunk or n == 0:
                writer.write_table(_table(pa, schema, chunk))
                n += rows_in_chunk
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return n


def _cast(t):
    """A converter of one value to what a Parquet column of type ``t`` holds (None stays)."""
    import pyarrow as pa
    if t == pa.int64():
        return lambda v: int(v) if isinstance(v, (int, float)) and math.isfinite(v) else None
    if t == pa.float64():
        return lambda v: float(v) if isinstance(v, (int, float)) else None
    return lambda v: None if v is None else str(v)


def _table(pa, schema, columns: list[list]):
    arrays = [pa.array(col, type=field.type) for col, field in zip(columns, schema)]
    return pa.Table.from_arrays(arrays, schema=schema)


# ---- trace ------------------------------------------------------------------------------------

# device-state fields drawn as counter tracks (name in the trace: field)
TRACE_COUNTERS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c",
                  "gpu_util_ratio", "sm_active_ratio", "dram_active_ratio", "mem_used_bytes",
                  "other_processes")


def write_trace(path, out: io.TextIOBase, rotated: bool = True,
                stats: ReadStats | None = None) -> int:
    """The log as Chrome trace-event JSON (``{"traceEvents": [...]}``); returns the
    number of launch slices written."""
    pids: dict[str, int] = {}
    tracks: dict[tuple, int] = {}
    track_end: dict[tuple, float] = {}
    last_state: dict[int, float] = {}
    t0 = None
    n = 0
    dumps = json.JSONEncoder(separators=(",", ":"), default=str, allow_nan=False).encode
    out.write('{"displayTimeUnit":"ms","traceEvents":[\n')
    events: list[str] = []
    first = True

    def meta(name: str, pid: int, tid: int, args: dict) -> None:
        events.append(dumps({"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid,
                             "args": args}))

    for batch in iter_log_batches(path, rotated, stats):
        plans = {}                  # per plan once a batch: device, slice name and args
        for key, p in batch.plans.items():
            args = {"dtype": p.get("dtype"), "dims": p.get("dims"), "config": p.get("config"),
                    "floor_ms": _finite(p.get("floor_ms"))}
            plans[key] = (f"{p.get('backend', '?')} {p.get('device', '?')}",
                          dumps(f"{p.get('op')}/{p.get('variant')}"), dumps(str(p.get("op"))),
                          dumps(args)[1:-1])
        on_track: dict[tuple, tuple] = {}      # (plan, stream) -> its track, this batch
        last_sid = -1
        inf = math.inf
        for seq, pid_, time_s, time_ms, timer, sid, stream, _ in batch.rows:
            track = on_track.get((pid_, stream))
            if track is None:
                device, name, cat, plan_args = plans[pid_]
                pid = pids.get(device)
                if pid is None:
                    pid = pids[device] = len(pids) + 1
                    meta("process_name", pid, 0, {"name": f"adaptive {device}"})
                tid = tracks.get((pid, stream))
                if tid is None:
                    tid = tracks[(pid, stream)] = len(tracks) + 1
                    label = (f"stream {stream:#x}" if timer in ("cuda_event", "cupti")
                             and isinstance(stream, int) else f"thread {stream}")
                    meta("thread_name", pid, tid, {"name": label})
                if t0 is None:
                    t0 = float(time_s)
                    meta("clock_sync", pid, 0, {"unix_time_s_at_zero": t0})
                head = f'{{"name":{name},"cat":{cat},"ph":"X","ts":'
                tail = f',"pid":{pid},"tid":{tid},"args":{{"seq":'
                track = on_track[(pid_, stream)] = ((pid, stream), pid, head, tail,
                                                    f",{plan_args}}}}}")
            key, pid, head, tail, plan_args = track
            if type(time_ms) is float and 0.0 <= time_ms < inf:
                dur_us = time_ms * 1e3
                ms_text = repr(time_ms)
            else:
                ms = _finite(time_ms)
                dur_us = ms * 1e3 if ms is not None and ms >= 0 else 0.0
                ms_text = "null" if ms is None else repr(ms)
            # host-timed records are stamped after the call; GPU ones when it was issued.
            # Whole nanoseconds, so that a slice starting where the last ended nests exactly
            dur_ns = int(dur_us * 1e3 + 0.5)
            start_ns = int((time_s - t0) * 1e9)
            if timer in _AFTER_CALL:
                start_ns -= dur_ns
            end = track_end.get(key)
            if end is not None and start_ns < end:
                start_ns = end
            track_end[key] = start_ns + dur_ns
            if sid != last_sid and sid >= 0:
                last_sid = sid
                state = batch.states[sid]
                at = state.get("time_s")
                if isinstance(at, (int, float)) and at > last_state.get(pid, -inf):
                    last_state[pid] = at
                    ts = max((at - t0) * 1e6, 0.0)
                    for field in TRACE_COUNTERS:
                        v = _finite(state.get(field))
                        if v is not None:
                            events.append(f'{{"name":"{field}","ph":"C","ts":{ts:.3f},'
                                          f'"pid":{pid},"tid":0,"args":{{"{field}":{v!r}}}}}')
            timer_text = f'"{timer}"' if timer in _SAFE_TIMERS else dumps(timer)
            events.append(f'{head}{start_ns / 1e3:.3f},"dur":{dur_ns / 1e3:.3f}{tail}{int(seq)},'
                          f'"time_ms":{ms_text},"timer":{timer_text}{plan_args}')
            n += 1
        if events:
            out.write(("" if first else ",\n") + ",\n".join(events))
            first, events = False, []
    out.write("\n]}\n")
    return n
