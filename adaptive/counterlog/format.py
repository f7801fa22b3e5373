"""The counter log's on-disk framing: format name, version, batch layout, frames.

Version 3 (this one) adds a row field, ``sample_every``: the sampling interval in effect
when the record was taken (the overhead governor raises and lowers it; scale counts by
it), and a batch key ``governor`` (the interval, the measured cost fraction and, with
CUPTI, the fraction of time activity was recorded; governed CUPTI adds, without a version
change, ``cupti_state``, the probe's ``launch_rate_per_s`` and ``cupti_estimate``, and
``cupti_decision``, and its header ``cupti_probe``, the rule). Versions 2 and 3 frame each
msgpack payload as::

    MAGIC (4 bytes) | payload length (u32 LE) | crc32(payload) (u32 LE) | payload

so a reader that meets a damaged frame searches forward for the next ``MAGIC`` and reads
every intact frame after it (the damage is counted, never fatal). Each batch frame is
self-contained: it carries the per-plan fields of every plan its rows name, so no frame
depends on an earlier one. Version 1 files (``[crc32, payload]`` msgpack arrays with no
marker) are still read, without resynchronisation.
"""

from __future__ import annotations

import struct
import zlib

import msgpack

from adaptive.errors import AdaptiveError


FORMAT = "adaptive-counter-log"
VERSION = 3
HEADER_KEYS = ("format", "version")
# a batch frame holds up to BATCH_ROWS records as rows of these fields; "plan" indexes the
# frame's "plans", "state" its "states" (-1: none); "stream" is the CUDA stream pointer
# of the launch (host: the calling thread's id), one trace track each; "sample_every" the
# interval (one launch in it logged) when the record was taken (older logs: the header's)
ROW_FIELDS = ("seq", "plan", "time_s", "time_ms", "timer", "state", "stream", "sample_every")
ROW_FIELDS_V2 = ROW_FIELDS[:7]
ROW_FIELDS_V1 = ROW_FIELDS[:6]
BATCH_ROWS = 1024

MAGIC = b"\xadCL\x02"                    # starts every v2/v3 frame; resynchronisation marker
_FRAME_HEAD = struct.Struct("<4sII")     # magic, payload length, crc32 of the payload
FRAME_HEAD_BYTES = _FRAME_HEAD.size
MAX_FRAME_BYTES = 64 << 20               # larger length fields are damage, not frames


class CounterLogError(AdaptiveError, ValueError):
    """A counter log that cannot be read: not one, a newer version, or corrupt."""


def _pack(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def frame_bytes(payload: bytes) -> bytes:
    """``payload`` (packed msgpack) in a v2 frame."""
    return _FRAME_HEAD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def frame(record: dict) -> bytes:
    return frame_bytes(_pack(record))


def _frame_v1(record: dict) -> bytes:
    """A version-1 frame (tests write old logs with it)."""
    payload = _pack(record)
    return b"\x92" + _pack(zlib.crc32(payload)) + _pack(payload)     # [crc32, payload]


def unpack_head(data, offset: int) -> tuple[bytes, int, int]:
    """(magic, length, crc) of the frame head at ``offset``."""
    return _FRAME_HEAD.unpack_from(data, offset)
