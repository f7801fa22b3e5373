"""Counter-logging mode: a msgpack stream of launch records, its writer and its reader.

Each logged launch (one in ``sample_every`` per dispatcher) becomes one record: wall
time, op, dims and features, variant and config, the GPU time of the kernels it issued,
its stream, and the NVML/GPM sample nearest before it. On the cuda backend the time
comes from a pre-created CUDA event pair recorded around the call on its stream (the
default), or from CUPTI activity records (``timing="cupti"``: an external correlation id
pushed around the call); on the host from a perf-counter pair. The
caller's thread appends one small tuple to a bounded queue; a writer thread reads the
times (no synchronisation), builds the records from per-plan fields made once, joins
the device sample, packs and writes. When a queue or the event ring is full, records
are dropped and counted; a call is never delayed.

On disk (version 2): frames ``MAGIC | length | crc32 | payload`` (see ``format``), the
first a header (``format``, ``version``, ``sample_every``, ``timing``), each later one a
self-contained batch of up to ``BATCH_ROWS`` records (the fields of the plans its rows
name, device states, compact rows; see ``ROW_FIELDS``). A damaged frame is skipped by
searching for the next marker, and counted; a killed writer loses at most what it had
not yet flushed (one ``flush_interval_s``). Files rotate by size: ``log`` → ``log.1`` →
``log.2`` …; a new log moves an existing file aside the same way. :func:`iter_log`
streams records in bounded memory, :func:`read_log` collects them.

    >>> with adaptive.counter_log("/tmp/run.alog", sample_every=1):
    ...     serve()
    >>> rows = adaptive.counterlog.to_observations(adaptive.counterlog.read_log("/tmp/run.alog"))
"""

from adaptive.counterlog.format import BATCH_ROWS, FORMAT, ROW_FIELDS, VERSION, CounterLogError
from adaptive.counterlog.reader import (Batch, LogContents, ReadStats, iter_log,
                                        iter_log_batches, log_files, read_file, read_log,
                                        to_observations)
from adaptive.counterlog.writer import (CounterLog, LogStats, active_logs, close_configured,
                                        counter_log, dropped_records_total,
                                        written_records_total)

__all__ = ["BATCH_ROWS", "FORMAT", "ROW_FIELDS", "VERSION", "Batch", "CounterLog",
           "CounterLogError", "LogContents", "LogStats", "ReadStats", "active_logs",
           "close_configured", "counter_log", "dropped_records_total",
           "iter_log", "iter_log_batches", "log_files", "read_file", "read_log",
           "to_observations", "written_records_total"]
