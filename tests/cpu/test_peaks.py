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
