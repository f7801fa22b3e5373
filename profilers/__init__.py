"""profilers: sources of observations, each usable on its own and by the dispatcher.

- :class:`EventTimer` — CUDA event pairs in a bounded ring, harvested without syncing.
- :class:`NvmlSampler` — clocks, power, temperature, utilisation, clock-event reasons and
  Hopper GPM metrics, read by a background thread.
- :class:`CuptiActivity` — per-kernel start/end from CUPTI activity records, tagged.
- :class:`HostTimer` — wall and process CPU time for the host backend.

Heavy or optional libraries (CuPy, pynvml, cupti-python) are imported when a source is
created, never by ``import profilers``.
"""

from __future__ import annotations

from profilers.cupti import CuptiActivity, KernelRecord
from profilers.events import EventTimer
from profilers.host import HostTimer, HostTiming
from profilers.nvml import DeviceSnapshot, NvmlSampler, clock_event_names

__all__ = ["CuptiActivity", "DeviceSnapshot", "EventTimer", "HostTimer", "HostTiming",
           "KernelRecord", "NvmlSampler", "clock_event_names"]
