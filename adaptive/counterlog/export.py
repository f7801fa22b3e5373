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
from collections.abc import Iterable

from adaptive.counterlog.format import CounterLogError
from adaptive.counterlog.reader import Batch, ReadStats, iter_log_batches

FORMATS = ("csv", "parquet", "trace")
RECORD_COLUMNS = ("seq", "time_s", "op", "variant", "dtype", "backend", "device", "timer",
                  "stream", "time_ms", "floor_ms", "flops", "bytes")
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


def _clock_names(mask) -> str:
    from profilers.nvml import clock_event_names
    return "|".join(clock_event_names(mask)) if isinstance(mask, int) else ""


class _Layout:
    """The columns of a log (first pass): dims and config keys and their value types."""

    def __init__(self):
        self.dims: dict[str, str] = {}      # key -> "int" | "float" | "str"
        self.config: dict[str, str] = {}

    def see(self, batch: Batch) -> None:
        for static in batch.plans.values():
            for key, v in (static.get("dims") or {}).items():
                self.dims[key] = _widen(self.dims.get(key), v)
            for key, v in (static.get("config") or {}).items():
                self.config[key] = _widen(self.config.get(key), v)

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


def _rows(batches: Iterable[Batch], layout: _Layout) -> Iterable[list]:
    """One list per record, in ``layout.columns`` order (None where absent)."""
    dims, configs = sorted(layout.dims), sorted(layout.config)
    none_state = [None] * len(STATE_COLUMNS)
    for batch in batches:
        plans = {}
        for pid, s in batch.plans.items():
            d, c = s.get("dims") or {}, s.get("config") or {}
            plans[pid] = ([s.get(k) for k in _PLAN_A],
                          [s.get(k) for k in _PLAN_B] + [d.get(k) for k in dims]
                          + [_scalar(c.get(k)) for k in configs])
        states = [([st.get(k) for k in DEVICE_COLUMNS],
                   _clock_names(st.get("clock_event_reasons")), st.get("time_s"))
                  for st in batch.states]
        for seq, pid, time_s, time_ms, timer, sid, stream in batch.rows:
            a, b = plans[pid]
            if sid >= 0:
                values, names, at_s = states[sid]
                age = (time_s - at_s) * 1e3 if at_s is not None else None
                state = [*values, names, age]
            else:
                state = none_state
            yield [seq, time_s, *a, timer, stream, time_ms, *b, *state]


def _scalar(v):
    return v if v is None or isinstance(v, (bool, int, float, str)) else json.dumps(v)


def write_csv(path, out: io.TextIOBase, rotated: bool = True,
              stats: ReadStats | None = None) -> int:
    """One CSV row per record of the log at ``path``; returns the rows written."""
    layout = _Layout()
    for batch in iter_log_batches(path, rotated, ReadStats()):
        layout.see(batch)
    writer = csv.writer(out)
    writer.writerow(layout.columns)
    n = 0
    for row in _rows(iter_log_batches(path, rotated, stats), layout):
        writer.writerow(["" if v is None else v for v in row])
        n += 1
    return n


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
    layout = _Layout()
    for batch in iter_log_batches(path, rotated, ReadStats()):
        layout.see(batch)
    types = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
    fields = [("seq", pa.int64()), ("time_s", pa.float64())] + [
        (k, pa.string()) for k in _PLAN_A] + [
        ("timer", pa.string()), ("stream", pa.int64()), ("time_ms", pa.float64()),
        ("floor_ms", pa.float64()), ("flops", pa.float64()), ("bytes", pa.float64())]
    fields += [(f"dim_{k}", types[layout.dims[k]]) for k in sorted(layout.dims)]
    fields += [(f"config_{k}", types[layout.config[k]]) for k in sorted(layout.config)]
    fields += [(k, pa.int64() if k in _INT_DEVICE else pa.float64()) for k in DEVICE_COLUMNS]
    fields += [("clock_event_names", pa.string()), ("state_age_ms", pa.float64())]
    schema = pa.schema(fields)
    converters = [_converter(t) for _, t in fields]
    n = 0
    tmp = f"{os.fspath(out_path)}.tmp{os.getpid()}"
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            chunk: list[list] = []
            for row in _rows(iter_log_batches(path, rotated, stats), layout):
                chunk.append(row)
                if len(chunk) >= PARQUET_ROWS:
                    writer.write_table(_table(pa, schema, converters, chunk))
                    n += len(chunk)
                    chunk = []
            if chunk or n == 0:
                writer.write_table(_table(pa, schema, converters, chunk))
                n += len(chunk)
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return n


def _converter(t):
    import pyarrow as pa
    if t == pa.int64():
        return lambda v: None if v is None else int(v)
    if t == pa.float64():
        return lambda v: None if v is None else float(v)
    return lambda v: None if v is None else str(v)


def _table(pa, schema, converters, rows: list[list]):
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    arrays = [pa.array([conv(v) for v in col], type=field.type)
              for col, conv, field in zip(columns, converters, schema)]
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
    write = out.write
    dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
    write('{"displayTimeUnit":"ms","traceEvents":[\n')
    first = True

    def emit(event: dict) -> None:
        nonlocal first
        write(dumps(event) if first else ",\n" + dumps(event))
        first = False

    for batch in iter_log_batches(path, rotated, stats):
        for seq, pid_, time_s, time_ms, timer, sid, stream in batch.rows:
            plan = batch.plans[pid_]
            device = f"{plan.get('backend', '?')} {plan.get('device', '?')}"
            pid = pids.get(device)
            if pid is None:
                pid = pids[device] = len(pids) + 1
                emit({"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0,
                      "args": {"name": f"adaptive {device}"}})
            key = (pid, stream)
            tid = tracks.get(key)
            if tid is None:
                tid = tracks[key] = len(tracks) + 1
                label = (f"stream {stream:#x}" if timer in ("cuda_event", "cupti")
                         and isinstance(stream, int) else f"thread {stream}")
                emit({"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": tid,
                      "args": {"name": label}})
            if t0 is None:
                t0 = time_s
                emit({"name": "clock_sync", "ph": "M", "ts": 0, "pid": pid, "tid": 0,
                      "args": {"unix_time_s_at_zero": t0}})
            dur_us = time_ms * 1e3 if isinstance(time_ms, (int, float)) and \
                math.isfinite(time_ms) and time_ms >= 0 else 0.0
            # host-timed records are stamped after the call; GPU ones when it was issued
            start_us = (time_s - t0) * 1e6 - (dur_us if timer in ("host", "sync") else 0.0)
            start_us = max(start_us, track_end.get(key, -math.inf))
            track_end[key] = start_us + dur_us
            if sid >= 0:
                state = batch.states[sid]
                at = state.get("time_s")
                if isinstance(at, (int, float)) and at > last_state.get(pid, -math.inf):
                    last_state[pid] = at
                    ts = max((at - t0) * 1e6, 0.0)
                    for field in TRACE_COUNTERS:
                        v = state.get(field)
                        if isinstance(v, (int, float)):
                            emit({"name": field, "ph": "C", "ts": ts, "pid": pid, "tid": 0,
                                  "args": {field: v}})
            emit({"name": f"{plan.get('op')}/{plan.get('variant')}", "cat": plan.get("op"),
                  "ph": "X", "ts": start_us, "dur": dur_us, "pid": pid, "tid": tid,
                  "args": {"seq": seq, "time_ms": time_ms, "timer": timer,
                           "dtype": plan.get("dtype"), "dims": plan.get("dims"),
                           "config": plan.get("config"), "floor_ms": plan.get("floor_ms")}})
            n += 1
    write("\n]}\n")
    return n
