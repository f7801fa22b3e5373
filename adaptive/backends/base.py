"""What a backend is: the :class:`Backend` protocol (every capability the library uses,
host defaults in :class:`~adaptive.backends.host.HostBackend`) and :class:`PlanIO`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True)
class PlanIO:
    """A plan's arrays.

    Attributes:
        alloc: ``alloc()`` makes a result array of the caller's kind (or the native one,
            when ``adapter`` converts).
        adapter: None when the caller's arrays run as they are; else ``(to_native,
            from_native)``, applied on each call.
        returns: the prepared function returns its result and allocates it itself when
            ``out`` is None (torch entries: the allocation torch makes anyway).
    """

    alloc: Callable
    adapter: tuple | None = None
    returns: bool = False


@runtime_checkable
class Backend(Protocol):
    """What the dispatcher needs of a backend."""

    name: str
    device: str
    arch: str     # the compile target ("sm_90"; "host" where nothing is compiled)

    def limits(self) -> dict:
        """Device limits that config constraints may name (``cpu_count``, ``sm_count``...)."""

    def peaks(self) -> dict:
        """``{"flops_per_s": {dtype: rate}, "bytes_per_s": rate}`` for roofline floors."""

    def prepare(self, candidate, problem, op):
        """A callable ``fn(args, out)`` that runs the candidate and writes ``out``."""

    def adapter(self, kind: str):
        """``(to_native, from_native)`` converting the caller's arrays to this backend's."""

    def empty(self, shape: tuple, dtype: str):
        """An uninitialised native array."""

    def io(self, candidate, problem, shape: tuple, like) -> PlanIO:
        """How a plan allocates its result and sees the caller's arrays (:class:`PlanIO`)."""

    def time_ms(self, fn, args, out, repeats: int = 1) -> list[float]:
        """Run ``fn(args, out)`` ``repeats`` times, synchronously; one time per run in ms
        (on a device: the run's device time, not the host's issuing of it)."""

    def device_timer(self, stream_ptr: int, gated: bool = True):
        """A :data:`~adaptive.timing.Timer` of one run's device time on that stream, or
        None where the host's clock times a run (the host backend). ``gated=False``: the
        pair is not held behind a gate, so on an idle stream it reads the host's latency
        to the run's launch too (what a caller waiting for the run pays)."""

    def fingerprint(self) -> dict:
        """Identity of the device, for packs and logs."""

    def stream_ptr(self, kind: str) -> int:
        """The stream a launch of inputs of ``kind`` goes to (0 on the host)."""

    def stream_idle(self, stream_ptr: int) -> bool | None:
        """Whether that stream has finished all its queued work (the device waits for the
        host), or None where it cannot be told (the host: its runs are synchronous)."""

    def hold(self, stream_ptr: int, us: float) -> None:
        """Keep the device busy on that stream for about ``us`` (a no-op on the host)."""

    def gate(self, stream_ptr: int, limit_us: float) -> Callable[[], None]:
        """Hold that stream until the returned function is called, at most ``limit_us``
        (what is issued in between runs back to back, as on a busy device); the caller
        always calls it. The host's runs are synchronous: a no-op there. Where the
        backend can tell, the function has an ``expired()`` method: once the work issued
        after the gate has completed, whether the gate ran out before its release (the
        stream then ran ahead of the host's issuing; see :class:`GateRelease`)."""

    def watch_device(self, period_s: float = 0.1) -> str:
        """Start sampling the device's state (for :meth:`device_state`): "ok", or why not
        (the host has no counters to sample)."""

    def synchronize(self) -> None:
        """Wait for the device's queued work (a no-op on the host: its runs are synchronous)."""

    def wait_stream(self, stream_ptr: int) -> None:
        """Wait for that stream's queued work (a no-op on the host)."""

    def event_timer(self):
        """A device event timer for sampled calls (``start(stream)``, ``stop(slot, plan)``,
        ``cancel``, ``harvest``, ``pending``), or None: time on the host with
        :meth:`synchronize`."""

    def device_state(self) -> dict:
        """The device's state now (clocks, utilisation, throttling: the policy's device
        features); {} where nothing is sampled."""


def released() -> None:
    """The release of a gate that holds nothing (the host's, a fixed hold's)."""


class GateRelease:
    """A gate's release, called once what the gate holds is issued, and whether the gate
    ran out first: ``expired()``, read once the work issued after the gate has completed
    (the device wrote ``ticket`` into ``ring[ticket % len(ring)]`` if it did; a slot
    overwritten by a later ticket reads as not expired)."""

    __slots__ = ("_release", "_ring", "ticket")

    def __init__(self, release: Callable[[], None], ring, ticket: int):
        self._release, self._ring, self.ticket = release, ring, ticket

    def __call__(self) -> None:
        self._release()

    def expired(self) -> bool:
        return self._ring[self.ticket % len(self._ring)] == self.ticket
