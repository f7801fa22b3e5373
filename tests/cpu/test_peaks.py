"""Peaks kept on disk per device: measured once, read back, refused when wrong."""

from __future__ import annotations

import json

import pytest

from adaptive.peaks import cached_peaks, peaks_path

FP = {"backend": "cuda", "name": "NVIDIA H200", "cc": 90, "sm_count": 132}
PEAKS = {"flops_per_s": {"float16": 6.7e14, "float32": 5.1e13}, "bytes_per_s": 4.2e12}


class Probe:
    def __init__(self, value=PEAKS):
        self.calls, self.value = 0, value

    def __call__(self):
        self.calls += 1
        return self.value


def test_first_process_measures_later_ones_read(tmp_path):
    probe = Probe()
    assert cached_peaks(FP, probe, tmp_path) == PEAKS and probe.calls == 1
    assert cached_peaks(FP, probe, tmp_path) == PEAKS and probe.calls == 1   # read back
    other = {**FP, "name": "NVIDIA H100", "sm_count": 132}
    assert cached_peaks(other, probe, tmp_path) == PEAKS and probe.calls == 2  # per device
    assert peaks_path(FP, tmp_path) != peaks_path(other, tmp_path)


def test_no_cache_dir_measures_every_time():
    probe = Probe()
    cached_peaks(FP, probe, None)
    cached_peaks(FP, probe, "")
    assert probe.calls == 2


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"version": 99, "fingerprint": FP, "peaks": PEAKS}),
    json.dumps({"version": 1, "fingerprint": {**FP, "cc": 80}, "peaks": PEAKS}),
    json.dumps({"version": 1, "fingerprint": FP, "peaks": {**PEAKS, "bytes_per_s": 0}}),
    json.dumps({"version": 1, "fingerprint": FP, "peaks": {"bytes_per_s": 1e12}}),
    json.dumps({"version": 1, "fingerprint": FP,
                "peaks": {**PEAKS, "flops_per_s": {"float16": float("nan")}}}),
])
def test_a_bad_stored_file_is_measured_again_and_replaced(tmp_path, content, caplog):
    path = peaks_path(FP, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    probe = Probe()
    assert cached_peaks(FP, probe, tmp_path) == PEAKS and probe.calls == 1
    assert "measuring again" in caplog.text
    assert json.loads(path.read_text())["peaks"] == PEAKS                  # replaced
    assert cached_peaks(FP, probe, tmp_path) == PEAKS and probe.calls == 1


class FakeBackend:
    def __init__(self, peaks):
        self._peaks = peaks

    def peaks(self):
        return self._peaks

    def fingerprint(self):
        return FP


@pytest.mark.parametrize("flops,nbytes,bound", [(1e12, 1e6, "flops"), (1e6, 1e12, "bytes")])
def test_a_run_below_the_floor_raises_the_peaks_here_and_on_disk(tmp_path, flops, nbytes,
                                                                 bound):
    from adaptive.observation import floor_ms
    from adaptive.peaks import raise_to_observed
    peaks = json.loads(json.dumps(PEAKS))
    be = FakeBackend(peaks)
    floor = floor_ms(flops, nbytes, peaks, "float32")
    assert not raise_to_observed(be, flops, nbytes, floor * 1.01, "float32", tmp_path)
    assert peaks == PEAKS and not peaks_path(FP, tmp_path).exists()
    time_ms = floor / 1.6                      # a run "at 160 % of the roofline"
    assert raise_to_observed(be, flops, nbytes, time_ms, "float32", tmp_path)
    assert floor_ms(flops, nbytes, be.peaks(), "float32") == pytest.approx(time_ms)
    if bound == "flops":
        assert peaks["flops_per_s"]["float32"] == pytest.approx(1.6 * PEAKS["flops_per_s"]
                                                                ["float32"])
        assert peaks["bytes_per_s"] == PEAKS["bytes_per_s"]
    else:
        assert peaks["bytes_per_s"] == pytest.approx(1.6 * PEAKS["bytes_per_s"])
    assert cached_peaks(FP, Probe(), tmp_path) == peaks      # the next process reads them
    assert not raise_to_observed(be, flops, nbytes, float("inf"), "float32", tmp_path)


def test_host_floors_are_the_same_in_every_process(tmp_path, monkeypatch):
    """The host's peaks come from the per-machine file, not a fresh noisy measurement."""
    from adaptive import config
    from adaptive.backends import host
    measured = [{"flops_per_s": {"float32": 1e10}, "bytes_per_s": 5e10},
                {"flops_per_s": {"float32": 3e10}, "bytes_per_s": 9e10}]
    monkeypatch.setattr(host, "_measure_peaks", lambda: measured.pop(0))
    with config.override(cache_dir=str(tmp_path)):
        first = host.HostBackend().peaks()       # a new backend is what a new process makes
        assert host.HostBackend().peaks() == first == {"flops_per_s": {"float32": 1e10},
                                                       "bytes_per_s": 5e10}
    assert len(measured) == 1


def test_regen_efficiency_never_exceeds_one_when_the_stored_peaks_are_too_low(tmp_path,
                                                                               monkeypatch):
    """Peaks measured on a busy machine (here: absurdly low) made a floor above the time:
    the run raises them, and the request's efficiency is at most 100 %."""
    from adaptive import config
    from adaptive.backends import host
    from adaptive.regen.cli import measured_request
    low = {"flops_per_s": {"float32": 1e6}, "bytes_per_s": 1e6}
    monkeypatch.setattr(host, "_measure_peaks", lambda: json.loads(json.dumps(low)))
    with config.override(cache_dir=str(tmp_path), policy="measure-each"):
        request, _ = measured_request("softmax", {"R": 64, "C": 256}, "float32", "host")
    assert 0 < request.efficiency <= 1.0 and request.floor_ms <= request.best_ms
    stored = json.loads(next((tmp_path / "peaks").rglob("*.json")).read_text())["peaks"]
    assert stored["bytes_per_s"] > low["bytes_per_s"]      # the next process starts higher
