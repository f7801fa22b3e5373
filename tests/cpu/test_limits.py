"""adaptive.limits: one device-limits table per device, the sm_90 one offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptive import backends, limits
from adaptive.backends import gpu_available

ROOT = Path(__file__).resolve().parents[2]
H200_PROPS = {"major": 9, "minor": 0, "maxThreadsPerBlock": 1024, "sharedMemPerBlock": 49152,
              "sharedMemPerBlockOptin": 232448, "multiProcessorCount": 132, "warpSize": 32,
              "regsPerBlock": 65536, "l2CacheSize": 60 << 20}


@pytest.mark.skipif(gpu_available(), reason="a GPU is present: tests/gpu checks its table")
def test_without_a_gpu_a_device_has_the_sm90_table_as_a_copy():
    got = backends.device_limits()
    assert got == dict(limits.SM90) and got["max_shared_bytes"] == 232448
    got["sm_count"] = 1
    assert limits.SM90["sm_count"] == 132
    with pytest.raises(TypeError):
        limits.SM90["sm_count"] = 1


def test_from_properties_takes_the_opt_in_shared_maximum():
    got = limits.from_properties(H200_PROPS)
    assert got == {k: v for k, v in limits.SM90.items() if k != "cpu_count"}
    old = {k: v for k, v in H200_PROPS.items() if k != "sharedMemPerBlockOptin"}
    assert limits.from_properties({**old, "major": 7, "minor": 5})["max_shared_bytes"] == 49152
    assert limits.from_properties({**old, "major": 7, "minor": 5})["cc"] == 75


def test_a_fingerprint_gives_its_sm_count_and_cc_on_the_sm90_table():
    got = limits.for_fingerprint({"backend": "cuda", "sm_count": 114, "cc": 90})
    assert got == {**limits.SM90, "sm_count": 114}
    assert limits.for_fingerprint({"sm_count": "132?"}) == dict(limits.SM90)


def test_no_other_module_copies_the_table():
    """The H200 numbers live in adaptive/limits.py only (tests may spell them out)."""
    copies = []
    for folder in ("adaptive", "benchmarks", "scripts", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or path.suffix not in (".py", ""):
                continue
            text = path.read_text(errors="replace")
            if path.name != "limits.py" and re.search(r"\b232448\b|\b227 ?\* ?1024\b", text):
                copies.append(str(path.relative_to(ROOT)))
    assert not copies, f"use adaptive.limits (SM90, adaptive.backends.device_limits) instead of a copy: {copies}"
