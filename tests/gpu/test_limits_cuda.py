"""The device's limits table: what the cuda backend reads from this GPU, and the sm_90
table (adaptive.limits.SM90) that stands for an H100/H200 offline must agree on one."""

from __future__ import annotations

import pytest

from adaptive import backends, limits

pytestmark = pytest.mark.gpu


def test_device_limits_are_the_backends_and_the_sm90_table_on_an_sm90_gpu():
    from adaptive.backends import get_backend
    got = backends.device_limits(0)
    assert got == get_backend("cuda", 0).limits()
    assert got["max_shared_bytes"] > 48 * 1024, "the opt-in maximum, not the default 48 KiB"
    name = get_backend("cuda", 0).fingerprint()["name"]
    if got["cc"] != 90 or "PCIe" in name:
        pytest.skip(f"{name} (cc {got['cc']}): the sm_90 table is an H100/H200 SXM's")
    offline = {k: v for k, v in limits.SM90.items() if k != "cpu_count"}
    differ = {k: (offline[k], got[k]) for k in offline if offline[k] != got.get(k)}
    assert not differ, f"adaptive.limits.SM90 vs this sm_90 GPU (table, device): {differ}"
