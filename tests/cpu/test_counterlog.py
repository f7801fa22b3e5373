"""Counter-logging mode on the host backend: round trip, sampling, rotation, damaged
files, a full queue (records dropped, calls never), the env-var hook, and the GPU path's
harvest logic with fake events."""

from __future__ import annotations

import logging
import os

import msgpack
import numpy as np
import pytest

from adaptive import config, counterlog
from adaptive.counterlog import format as counterlog_format
from adaptive.counterlog import recorders
from adaptive.counterlog import (CounterLog, CounterLogError, counter_log, read_file, read_log,
                                 to_observations)
from adaptive.dispatch import Dispatcher
from adaptive.policy import MeasureEach
from adaptive.ops import get_op
from profilers import EventTimer, NvmlSampler
from fake_nvml import FakeNvml  # noqa: E402



@pytest.fixture(autouse=True)
def log_every_launch():
    """These tests count records: every launch logged, events as the cuda timing."""
    with config.override(counter_log_every=1, counter_log_timing="events"):
        yield


@pytest.fixture
def host():
    d = Dispatcher("host", policy=MeasureEach())   # one plain plan per key
    d.sample_every = 0          # no synchronised samples: only the log's own records
    return d


def gemm_inputs(rng, m, k, n):
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


def check_gemm(c, a, b):
    ref = get_op("gemm").reference(a, b)
    assert get_op("gemm").error(c, ref) < 1e-4


def _learned_gemm_log(path, rng, calls: int, **learned):
    """``calls`` gemm launches of one key through a learned policy (``learned``: its
    arguments), logged to ``path``: (the dispatcher, the log's stats, its records)."""
    from adaptive.policy.learned import Learned
    d = Dispatcher("host", policy=Learned(**learned))
    d.sample_every = 0
    with counter_log(path) as clog:
        for _ in range(calls):
            a, b = gemm_inputs(rng, 48, 40, 24)
            check_gemm(d.launch("gemm", a, b), a, b)
    return d, clog.stats, read_log(path).records


def test_exploring_launches_are_logged_once(tmp_path, rng):
    """Under the learned policy the first calls of a key explore (and are timed for the
    policy); each call still becomes exactly one record."""
    _, stats, recs = _learned_gemm_log(tmp_path / "explore.alog", rng, 12)
    assert stats.written == 12 and stats.dropped == 0
    assert [r["seq"] for r in recs] == list(range(1, 13))
    assert {r["timer"] for r in recs[:2]} == {"sync"}   # exploring calls: timed for the policy


def test_a_candidate_timed_again_for_its_noisy_samples_is_logged_call_by_call(tmp_path, rng):
    """With the noise rule on a hair trigger (noise_ratio 1.01: nearly every candidate is
    timed up to twice ``samples``) the extra exploring calls are turns like the others:
    every call is one record (an exploring one timed for the policy), and the key commits
    within the calls it takes. A candidate the leader has left behind (``race_ratio``,
    ``clear_margin``: the host's two thread counts can be that far apart) stops short of
    ``samples``; every other one takes them (settling a commit on two samples each is off:
    the host's two thread counts can read more than 2% apart)."""
    d, stats, recs = _learned_gemm_log(tmp_path / "noisy.alog", rng, 40, noise_ratio=1.01,
                                       settle_margin=None)
    assert stats.written == 40 and stats.dropped == 0
    assert [r["seq"] for r in recs] == list(range(1, 41))
    state = next(iter(d.policy.keys.values()))
    assert state.committed is not None
    samples = d.policy.samples
    assert all(n <= 2 * samples and (n >= samples or state.observed[c].raced)
               for c, n in state.explored.items()), state.explored
    assert not state.observed[state.committed].raced
    assert sum(r["timer"] == "sync" for r in recs) == sum(state.explored.values())


def test_round_trip_records_every_launch(tmp_path, rng, host):
    path = tmp_path / "run.alog"
    shapes = [(37, 19, 5), (64, 33, 17)]
    with counter_log(path) as clog:
        for m, k, n in shapes * 10:
            a, b = gemm_inputs(rng, m, k, n)
            check_gemm(host.launch("gemm", a, b), a, b)
    assert host.recorder is None                      # detached on exit
    assert clog.stats.written == 20 and clog.stats.dropped == 0
    contents = read_log(path)
    assert contents.headers[0]["format"] == "adaptive-counter-log"
    recs = contents.records
    assert [r["seq"] for r in recs] == list(range(1, 21))
    assert [tuple(r["dims"][x] for x in "MKN") for r in recs] == shapes * 10
    for r in recs:
        assert r["op"] == "gemm" and r["dtype"] == "float32" and r["timer"] == "host"
        assert r["backend"] == "host" and r["variant"]
        assert 0 < r["time_ms"] < 1e4 and r["floor_ms"] > 0
        assert r["features"]["log2_M"] == pytest.approx(np.log2(r["dims"]["M"]))
    assert all(b["time_s"] >= a["time_s"] for a, b in zip(recs, recs[1:]))
    rows = to_observations(contents)
    assert len(rows) == 20 and rows[0].source == "log"
    assert rows[1].dims == {"M": 64, "N": 17, "K": 33} and rows[1].time_ms == recs[1]["time_ms"]


def test_sample_every_logs_every_nth_launch(tmp_path, rng, host):
    a, b = gemm_inputs(rng, 9, 7, 5)
    with counter_log(tmp_path / "n.alog", sample_every=3) as clog:
        for _ in range(30):
            check_gemm(host.launch("gemm", a, b), a, b)
    assert clog.stats.written == 10
    assert len(read_log(tmp_path / "n.alog").records) == 10


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_bad_sample_every_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="sample_every"):
        CounterLog(tmp_path / "x.alog", sample_every=bad)


def test_sampled_launches_are_logged_with_their_synchronised_time(tmp_path, rng):
    d = Dispatcher("host", policy=MeasureEach())   # one plain plan per key
    d.sample_every = 4
    a, b = gemm_inputs(rng, 11, 13, 3)
    with counter_log(tmp_path / "s.alog"):
        for _ in range(16):
            d.launch("gemm", a, b)
    timers = [r["timer"] for r in read_log(tmp_path / "s.alog").records]
    assert len(timers) == 16 and timers.count("sync") == 4


def test_rotation_keeps_backups_and_reads_in_order(tmp_path, rng, host):
    path = tmp_path / "rot.alog"
    a, b = gemm_inputs(rng, 5, 3, 2)
    # the writer sleeps; the test drains every 20 launches: one batch frame each
    with counter_log(path, max_bytes=4096, backups=2, flush_interval_s=60.0) as clog:
        for i in range(1, 601):
            host.launch("gemm", a, b)
            if i % 20 == 0:
                clog._drain()
    assert clog.stats.rotations >= 3                        # more than the backups kept
    assert sorted(os.listdir(tmp_path)) == ["rot.alog", "rot.alog.1", "rot.alog.2"]
    assert not os.path.exists(f"{path}.3")
    for name in ("rot.alog.1", "rot.alog.2"):
        assert os.path.getsize(tmp_path / name) >= 4096
    seqs = [r["seq"] for r in read_log(path).records]
    assert seqs == list(range(seqs[0], 601)) and seqs[0] > 1    # oldest fell off
    assert len(read_log(path, rotated=False).records) < len(seqs)


def test_a_new_log_moves_the_old_one_aside(tmp_path, rng, host):
    path = tmp_path / "again.alog"
    a, b = gemm_inputs(rng, 4, 4, 4)
    for runs in (3, 5):
        with counter_log(path):
            for _ in range(runs):
                host.launch("gemm", a, b)
    assert len(read_file(f"{path}.1")[1]) == 3 and len(read_file(path)[1]) == 5
    assert len(read_log(path).records) == 8


def write_log(path, rng, host, n=12):
    """Two batch frames of n/2 records each."""
    a, b = gemm_inputs(rng, 6, 5, 4)
    with counter_log(path, flush_interval_s=60.0) as clog:
        for i in range(n):
            host.launch("gemm", a, b)
            if i == n // 2 - 1:
                clog._drain()
    return path.read_bytes()


def test_truncated_last_record_is_skipped_with_a_warning(tmp_path, rng, host, caplog):
    path = tmp_path / "cut.alog"
    data = write_log(path, rng, host)
    path.write_bytes(data[:-7])                               # a killed writer
    caplog.set_level(logging.WARNING)
    contents = read_log(path)
    # the last batch is lost, the first one intact
    assert [r["seq"] for r in contents.records] == list(range(1, 7))
    assert contents.truncated_bytes > 7
    assert any("incomplete" in r.message for r in caplog.records)


def test_not_a_counter_log_empty_and_newer_version(tmp_path):
    other = tmp_path / "other.bin"
    payload = msgpack.packb({"format": "something-else", "version": 1})
    import zlib
    other.write_bytes(msgpack.packb([zlib.crc32(payload), payload]))
    with pytest.raises(CounterLogError, match="not an adaptive counter log"):
        read_log(other)
    text = tmp_path / "notes.txt"
    text.write_bytes(b"\xc1 this is not msgpack")
    with pytest.raises(CounterLogError, match="not an adaptive counter log: no frame marker"):
        read_log(text)
    empty = tmp_path / "empty.alog"
    empty.write_bytes(b"")
    with pytest.raises(CounterLogError, match="empty"):
        read_log(empty)
    newer = tmp_path / "newer.alog"
    newer.write_bytes(counterlog_format.frame({"format": counterlog.FORMAT, "version": 99}))
    with pytest.raises(CounterLogError, match="upgrade adaptive"):
        read_log(newer)
    with pytest.raises(FileNotFoundError, match="no counter log"):
        read_log(tmp_path / "missing.alog")


def test_full_queue_drops_records_never_calls(tmp_path, rng, host):
    path = tmp_path / "full.alog"
    inputs = [gemm_inputs(rng, 8, 6, 3) for _ in range(100)]
    # the writer sleeps for a minute between drains: nothing leaves the queue meanwhile
    with counter_log(path, queue_size=8, flush_interval_s=60.0) as clog:
        for a, b in inputs:
            check_gemm(host.launch("gemm", a, b), a, b)
    assert clog.stats.dropped == 92 and clog.stats.written == 8
    assert len(read_log(path).records) == 8
    assert counterlog.dropped_records_total() >= 92


def test_env_var_logs_started_dispatchers(tmp_path, rng):
    from adaptive import runtime
    path = str(tmp_path / "env.alog")
    a, b = gemm_inputs(rng, 10, 3, 7)
    runtime.reset_defaults()
    with config.override(counter_log=path, counter_log_every=2):
        d = Dispatcher("host", policy=MeasureEach())   # one plain plan per key
        assert d.recorder is None and not os.path.exists(path)   # made: nothing opened
        runtime.start(d)                               # as adaptive.launch's dispatchers
    d.sample_every = 0
    for _ in range(10):
        check_gemm(d.launch("gemm", a, b), a, b)
    counterlog.close_configured()
    assert d.recorder is None
    assert len(read_log(path).records) == 5
    runtime.reset_defaults()
    assert runtime.start(Dispatcher("host")).recorder is None   # env var off again


class _Stream:
    def __init__(self):
        self.recorded = self.completed = 0
        self.now_ms = 0.0


class _Event:
    def __init__(self, stream):
        self.stream, self.seq, self.at_ms = stream, None, 0.0

    def record(self):
        self.stream.recorded += 1
        self.seq, self.at_ms = self.stream.recorded, self.stream.now_ms
        self.stream.now_ms += 0.125               # each event 0.125 ms after the last

    @property
    def done(self):
        return self.seq is not None and self.seq <= self.stream.completed


def test_gpu_path_writes_event_times_after_they_complete(tmp_path, rng, host):
    """The cuda recorder logic on a host dispatcher with fake events: records appear
    only once their end events complete, with the event-measured time."""
    stream = _Stream()
    timer = EventTimer(4, events=(lambda: _Event(stream), lambda s, e: e.at_ms - s.at_ms))
    clog = CounterLog(tmp_path / "gpu.alog", flush_interval_s=0.01).open()
    clog._timers[0] = timer
    sampler = NvmlSampler(0, nvml=FakeNvml(sm_mhz=1410, power_mw=300_250))
    sampler.sample_once()
    clog.samplers[None] = sampler           # the host backend's "device index" is None
    rec = recorders.LogRecorder(clog, host, timer)
    clog._recorders[host] = rec
    host.add_recorder(rec)
    a, b = gemm_inputs(rng, 7, 7, 7)
    for _ in range(6):
        check_gemm(host.launch("gemm", a, b), a, b)          # the ring holds 4: 2 dropped
    clog._drain()
    assert clog.stats.written == 0                            # nothing finished on the "GPU"
    stream.completed = stream.recorded
    stats = clog.close()
    recs = read_log(tmp_path / "gpu.alog").records
    assert stats.written == 4 and stats.dropped == 2 and host.recorder is None
    assert [r["timer"] for r in recs] == ["cuda_event"] * 4
    assert [r["time_ms"] for r in recs] == pytest.approx([0.125] * 4)
    assert [r["device_state"]["sm_clock_mhz"] for r in recs] == [1410] * 4
    assert recs[0]["device_state"]["power_w"] == pytest.approx(300.25)


def test_cli_show_export_plot(tmp_path, rng, host, capsys):
    pytest.importorskip("matplotlib")
    from adaptive.cli import main
    path = tmp_path / "cli.alog"
    x = rng.standard_normal((21, 45)).astype(np.float32)
    a, b = gemm_inputs(rng, 12, 8, 6)
    with counter_log(path):
        for _ in range(9):
            host.launch("softmax", x)
        for _ in range(3):
            host.launch("gemm", a, b)
    assert main(["log", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "12 records" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert lines["softmax"][2] == "9" and lines["gemm"][2] == "3"
    assert lines["gemm"][3] == "100.0%"
    assert main(["log", "export", str(path), "--format", "csv", "-o",
                 str(tmp_path / "x.csv")]) == 0
    import csv
    rows = list(csv.DictReader((tmp_path / "x.csv").read_text().splitlines()))
    assert len(rows) == 12 and rows[0]["op"] == "softmax" and rows[0]["dim_C"] == "45"
    assert main(["log", "plot", str(path), "-o", str(tmp_path / "x.png")]) == 0
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "bad.alog").write_bytes(b"\xc1\xc1")
    assert main(["log", "show", str(tmp_path / "bad.alog")]) == 1
    assert "not an adaptive counter log" in capsys.readouterr().err
