"""Counter-logging mode: a msgpack stream of launch records, its writer and its reader.

Each logged launch becomes one record: wall time, op, dims and features, variant and
config, the time it took (CUDA events harvested later on the cuda backend, a wall-clock
pair on the host), and the NVML/GPM snapshot nearest before it. The launch only records
a pre-created event pair (two raw ``cudaEventRecord`` calls on its stream) and appends
one small tuple, or on the host appends one tuple to a bounded queue; a writer thread
times the pairs (``cudaEventElapsedTime``, no synchronisation), builds the records from
per-plan fields made once, attaches the snapshot, packs and writes. When the queue or
the event ring is full, records are dropped and counted; a call is never delayed.

On disk: frames ``[crc32(payload), payload]`` where ``payload`` is a packed map; the
first frame is a header (``format``, ``version``), each later one a batch of up to
``BATCH_ROWS`` records written together (per-plan fields once per file, then compact rows;
see ``ROW_FIELDS``). :func:`read_log` gives back one dict per record. Files rotate by size: ``log`` →
``log.1`` → ``log.2`` …; a new log moves an existing file aside the same way. The reader
tolerates a truncated last frame (a killed process loses at most its last batch) and
names the byte offset of any corrupt one.

    >>> with adaptive.counter_log("/tmp/run.alog", sample_every=1):
    ...     serve()
    >>> rows = adaptive.counterlog.to_observations(adaptive.counterlog.read_log("/tmp/run.alog"))
"""

from adaptive.counterlog.format import BATCH_ROWS, FORMAT, ROW_FIELDS, VERSION, CounterLogError
from adaptive.counterlog.reader import (LogContents, log_files, read_file, read_log,
                                        to_observations)
from adaptive.counterlog.recorders import Recorder, install_recorder, remove_recorder
from adaptive.counterlog.writer import (CounterLog, LogStats, active_logs, close_configured,
                                        counter_log, dropped_records_total)

__all__ = ["BATCH_ROWS", "FORMAT", "ROW_FIELDS", "VERSION", "CounterLog", "CounterLogError",
           "LogContents", "LogStats", "Recorder", "active_logs", "close_configured",
           "counter_log", "dropped_records_total", "install_recorder", "log_files",
           "read_file", "read_log", "remove_recorder", "to_observations"]
