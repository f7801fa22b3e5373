"""profilers: sources of observations, each usable on its own and by the dispatcher.

- :class:`EventTimer` — CUDA event pairs in a bounded ring, harvested without syncing.
- :class:`NvmlSampler` — clocks, power, temperature, utilisation, clock-event reasons,
  memory, other processes and Hopper GPM metrics, read by a background thread into
  :class:`DeviceState` values (``sampler.latest_state()``; ``state.features()``).
- :class:`CuptiActivity` — per-kernel start/end from CUPTI activity records, tagged;
  :class:`CuptiTimer` times tagged calls by their kernels (the counter log's source).
- :class:`HostTimer` — wall and process CPU time for the host backend.

Heavy or optional libraries (CuPy, pynvml, cupti-python) are imported when a source is
created, never by ``import profilers``.
"""

from __future__ import annotations

from profilers.cupti import CuptiActivity, CuptiTimer, KernelRecord
from profilers.events import EventTimer
from profilers.host import HostTimer, HostTiming
from profilers.nvml import (STATE_FEATURES, DeviceSnapshot, DeviceState, NvmlSampler,
                            clock_event_names)

__all__ = ["STATE_FEATURES", "CuptiActivity", "CuptiTimer", "DeviceSnapshot", "DeviceState",
           "EventTimer", "HostTimer", "HostTiming", "KernelRecord", "NvmlSampler",
           "clock_event_names"]
