"""The counter log's on-disk framing: format name, version, batch layout, frames."""

from __future__ import annotations

import zlib

import msgpack

from adaptive.errors import AdaptiveError


FORMAT = "adaptive-counter-log"
VERSION = 1
_HEADER_KEYS = ("format", "version")
# a batch frame holds up to BATCH_ROWS records as rows of these fields; "plan" indexes the
# batch's or an earlier batch's "plans" (per file), "state" its "states" (-1: none)
ROW_FIELDS = ("seq", "plan", "time_s", "time_ms", "timer", "state")
BATCH_ROWS = 1024


class CounterLogError(AdaptiveError, ValueError):
    """A counter log that cannot be read: not one, a newer version, or corrupt."""

def _pack(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _frame(record: dict) -> bytes:
    payload = _pack(record)
    return b"\x92" + _pack(zlib.crc32(payload)) + _pack(payload)     # [crc32, payload]
