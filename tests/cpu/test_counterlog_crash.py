"""Crash safety of the counter log: damaged frames are skipped and counted, a SIGKILLed
writer leaves a log that reads to its last whole record, old (version-1) logs still read."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from adaptive import config
from adaptive.counterlog import CounterLog, read_log
from adaptive.counterlog import format as fmt
from adaptive.counterlog.reader import ReadStats, _frames
from adaptive.dispatch import Dispatcher
from adaptive.policy import MeasureEach

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def host():
    d = Dispatcher("host", policy=MeasureEach())
    d.sample_every = 0
    return d


def write_batches(path, host, rng, batches=8, per_batch=5) -> list[tuple[int, int]]:
    """A log of ``batches`` batch frames; returns (offset, size) of every frame."""
    a = rng.standard_normal((7, 5)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    clog = CounterLog(path, sample_every=1, flush_interval_s=60.0, nvml=False).open()
    clog.attach(host)
    for _ in range(batches):
        for _ in range(per_batch):
            host.launch("gemm", a, b)
        clog._drain()
    clog.close()
    data = Path(path).read_bytes()
    offsets = [off for off, _ in _frames(str(path), ReadStats())]
    return [(o, e - o) for o, e in zip(offsets, offsets[1:] + [len(data)])]


@pytest.mark.parametrize("part", ["magic", "length", "crc", "payload", "huge_length"])
def test_a_damaged_frame_is_skipped_and_every_later_frame_read(tmp_path, rng, host, part):
    path = tmp_path / "damaged.alog"
    frames = write_batches(path, host, rng)
    assert len(frames) == 9                                   # header + 8 batches
    data = bytearray(path.read_bytes())
    offset, size = frames[4]                                  # records 16..20
    at = {"magic": offset + 1, "length": offset + 4, "crc": offset + 9,
          "payload": offset + fmt.FRAME_HEAD_BYTES + size // 2}
    if part == "huge_length":
        struct.pack_into("<I", data, offset + 4, fmt.MAX_FRAME_BYTES + 1)
    else:
        data[at[part]] ^= 0x5A
    path.write_bytes(bytes(data))
    contents = read_log(path)
    seqs = [r["seq"] for r in contents.records]
    assert seqs == list(range(1, 16)) + list(range(21, 41))
    assert (contents.lost_frames, contents.lost_records, contents.lost_bytes) == (1, 5, size)
    assert contents.truncated_bytes == 0
    assert all(r["op"] == "gemm" and r["time_ms"] > 0 for r in contents.records)


def test_damage_in_the_header_two_frames_and_the_tail(tmp_path, rng, host, caplog):
    path = tmp_path / "worse.alog"
    frames = write_batches(path, host, rng)
    data = bytearray(path.read_bytes())
    for i in (0, 2, 6):
        offset, size = frames[i]
        data[offset + fmt.FRAME_HEAD_BYTES + size // 2] ^= 0xFF
    path.write_bytes(bytes(data[:-3]))                        # and a cut-off last frame
    contents = read_log(path)
    # the header, batch 2 (seq 6-10) and batch 6 (26-30) damaged, batch 8 (36-40) cut off
    assert [r["seq"] for r in contents.records] == (list(range(1, 6)) + list(range(11, 26))
                                                    + list(range(31, 36)))
    assert contents.headers[0].get("header_lost") is True
    assert contents.lost_frames == 3 and contents.lost_records == 10
    assert contents.truncated_bytes == frames[8][1] - 3
    assert any("damaged" in r.message for r in caplog.records)


def test_random_garbage_between_frames_is_skipped(tmp_path, rng, host):
    path = tmp_path / "garbage.alog"
    frames = write_batches(path, host, rng, batches=3)
    data = path.read_bytes()
    cut = frames[2][0]
    junk = bytes(rng.integers(0, 256, 5000, dtype=np.uint8)).replace(fmt.MAGIC, b"xxxx")
    path.write_bytes(data[:cut] + junk + data[cut:])
    contents = read_log(path)
    assert [r["seq"] for r in contents.records] == list(range(1, 16))
    assert contents.lost_bytes == 5000 and contents.lost_records == 0


def test_cli_show_reads_a_damaged_log_and_says_what_was_lost(tmp_path, rng, host, capsys):
    from adaptive.cli import main
    path = tmp_path / "show.alog"
    frames = write_batches(path, host, rng)
    data = bytearray(path.read_bytes())
    data[frames[3][0] + fmt.FRAME_HEAD_BYTES + 3] ^= 1
    path.write_bytes(bytes(data))
    assert main(["log", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("35 records in 1 file(s); 1 damaged frame(s) skipped "
                          f"({frames[3][1]} bytes, 5 records lost)")


def test_version_1_logs_still_read(tmp_path):
    path = tmp_path / "old.alog"
    static = {"op": "gemm", "dims": {"M": 4, "K": 3, "N": 2}, "dtype": "float32",
              "variant": "blas", "config": {"threads": 1}, "backend": "host", "device": "cpu"}
    batch1 = {"plans": [[0, static]], "states": [{"time_s": 1.0, "sm_clock_mhz": 1980}],
              "rows": [[1, 0, 1.5, 0.25, "host", 0], [2, 0, 1.6, 0.5, "host", -1]]}
    batch2 = {"plans": [], "states": [], "rows": [[3, 0, 1.7, 0.75, "host", -1]]}
    path.write_bytes(fmt._frame_v1({"format": fmt.FORMAT, "version": 1})
                     + fmt._frame_v1(batch1) + fmt._frame_v1(batch2))
    contents = read_log(path)
    assert [(r["seq"], r["time_ms"], r["variant"]) for r in contents.records] == [
        (1, 0.25, "blas"), (2, 0.5, "blas"), (3, 0.75, "blas")]
    assert contents.records[0]["device_state"]["sm_clock_mhz"] == 1980
    assert contents.headers[0]["version"] == 1


def test_a_writer_that_falls_behind_counts_its_drops_in_the_log(tmp_path, rng, host):
    path = tmp_path / "behind.alog"
    a = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal((4, 2)).astype(np.float32)
    clog = CounterLog(path, sample_every=1, queue_size=4, flush_interval_s=60.0,
                      nvml=False).open()
    clog.attach(host)
    for _ in range(10):
        host.launch("gemm", a, b)                             # 6 dropped, never waited
    clog._drain()
    host.launch("gemm", a, b)
    stats = clog.close()
    contents = read_log(path)
    assert stats.dropped == 6 and contents.dropped_records == 6
    assert len(contents.records) == 5


CHILD = r"""
import sys, time
import numpy as np
from adaptive.counterlog import CounterLog
from adaptive.dispatch import Dispatcher
from adaptive.policy import MeasureEach
d = Dispatcher("host", policy=MeasureEach())
d.sample_every = 0
rng = np.random.default_rng(0)
a = rng.standard_normal((8, 8)).astype(np.float32)
b = rng.standard_normal((8, 8)).astype(np.float32)
clog = CounterLog(sys.argv[1], sample_every=1, flush_interval_s=0.05, nvml=False).open()
clog.attach(d)
i = 0
while True:
    d.launch("gemm", a, b)
    i += 1
    print(i, time.time(), flush=True)
    time.sleep(0.002)
"""


def test_a_sigkilled_writer_leaves_a_log_that_reads_to_its_last_whole_record(tmp_path, capsys):
    path = tmp_path / "killed.alog"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True)
    launched = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            i, t = line.split()
            launched.append((int(i), float(t)))
            if int(i) >= 300:
                break
        assert launched and launched[-1][0] >= 300, "the writer process did not start"
        os.kill(child.pid, signal.SIGKILL)
        killed_s = time.time()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    with child.stdout:
        for line in child.stdout:                             # printed before the kill
            i, t = line.split()
            launched.append((int(i), float(t)))
    assert child.returncode == -signal.SIGKILL
    contents = read_log(path)
    seqs = [r["seq"] for r in contents.records]
    assert seqs == list(range(1, len(seqs) + 1))              # whole records, in order
    assert contents.lost_frames == 0
    n = launched[-1][0]
    assert 300 - 100 <= len(seqs) <= n
    # what is missing was launched within about one flush interval of the kill (the
    # writer thread flushes every 0.05 s; a loaded machine may delay it)
    first_missing_s = dict(launched).get(len(seqs) + 1, killed_s)
    assert killed_s - first_missing_s < 1.0
    from adaptive.cli import main
    assert main(["log", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(seqs)} records in 1 file(s)")


def test_config_sets_the_default_rate_and_the_header_says_it(tmp_path, rng, host):
    with config.override(counter_log_every=4):
        clog = CounterLog(tmp_path / "rate.alog", nvml=False).open()
    clog.attach(host)
    a = rng.standard_normal((5, 5)).astype(np.float32)
    for _ in range(12):
        host.launch("gemm", a, a)
    clog.close()
    contents = read_log(tmp_path / "rate.alog")
    assert len(contents.records) == 3 and contents.headers[0]["sample_every"] == 4
    assert contents.headers[0]["version"] == fmt.VERSION == 3


def test_a_batch_the_writer_cannot_write_is_counted_and_logging_goes_on(tmp_path, rng, host,
                                                                         caplog):
    path = tmp_path / "bad_item.alog"
    a = rng.standard_normal((6, 4)).astype(np.float32)
    clog = CounterLog(path, sample_every=1, flush_interval_s=60.0, nvml=False).open()
    clog.attach(host)
    host.launch("gemm", a, a.T.copy())
    clog.submit(("not a recorder", 1.0, None, 0.5, "host", 0, 1))   # breaks its batch
    with pytest.raises(AttributeError):
        clog._drain()
    host.launch("gemm", a, a.T.copy())
    stats = clog.close()
    assert stats.dropped == 2 and stats.written == 1
    assert [r["seq"] for r in read_log(path).records] == [1]
