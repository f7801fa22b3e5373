"""Device limits: what config constraints and launch expressions read about a device.

One table per device: the CUDA backend builds a GPU's from its properties
(:func:`from_properties`); :data:`SM90` stands for an H100/H200 where no GPU is at hand
(enumerating and compiling configs with NVRTC, regen's default config, replaying an H200
pack, host stand-ins). :func:`adaptive.backends.device_limits` gives the one or the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# An H100/H200 (sm_90), what the CUDA backend reports there; cpu_count: one host thread,
# for host variants' spaces that name it.
SM90: Mapping[str, int] = MappingProxyType({
    "max_threads_per_block": 1024, "max_shared_bytes": 232448, "sm_count": 132,
    "warp_size": 32, "max_registers_per_block": 65536, "l2_bytes": 60 << 20, "cc": 90,
    "cpu_count": 1,
})


def from_properties(props: Mapping) -> dict[str, int]:
    """A GPU's limits from the CUDA runtime's device properties (CuPy's
    ``getDeviceProperties``): the opt-in shared-memory maximum where the device has one."""
    cc = int(props["major"]) * 10 + int(props["minor"])
    return {
        "max_threads_per_block": int(props["maxThreadsPerBlock"]),
        "max_shared_bytes": int(props.get("sharedMemPerBlockOptin",
                                          props["sharedMemPerBlock"])),
        "sm_count": int(props["multiProcessorCount"]),
        "warp_size": int(props["warpSize"]),
        "max_registers_per_block": int(props["regsPerBlock"]),
        "l2_bytes": int(props["l2CacheSize"]),
        "cc": cc,
    }


def for_fingerprint(fingerprint: Mapping) -> dict[str, int]:
    """The limits of the device a pack's fingerprint describes, for evaluating its grid
    expressions offline: :data:`SM90` with the fingerprint's SM count and compute
    capability (every shipped pack's GPU is an sm_90 one)."""
    out = dict(SM90)
    for key in ("sm_count", "cc"):
        if isinstance(fingerprint.get(key), int):
            out[key] = int(fingerprint[key])
    return out
