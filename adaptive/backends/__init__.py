"""Backends: where variants run. ``host`` (NumPy/SciPy) always; ``cuda`` (CuPy) with a GPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from adaptive.errors import BackendUnavailableError, UnknownNameError

NAMES = ("host", "cuda")


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
        """Run ``fn(args, out)`` ``repeats`` times, synchronously; one time per run in ms."""

    def fingerprint(self) -> dict:
        """Identity of the device, for packs and logs."""

    def stream_ptr(self, kind: str) -> int:
        """The stream a launch of inputs of ``kind`` goes to (0 on the host)."""

    def hold(self, stream_ptr: int, us: float) -> None:
        """Keep the device busy on that stream for about ``us`` (a no-op on the host)."""


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 (any failure means no usable GPU)
        return False


def resolve_name(name: str) -> str:
    if name == "auto":
        return "cuda" if gpu_available() else "host"
    if name not in NAMES:
        raise UnknownNameError("backend", name, NAMES + ("auto",))
    return name


def get_backend(name: str = "auto", device: int | None = None) -> Backend:
    """A backend instance by name (``auto``: cuda where a GPU is present, else host)."""
    name = resolve_name(name)
    if name == "host":
        from adaptive.backends.host import HostBackend
        return HostBackend()
    if not gpu_available():
        raise BackendUnavailableError("the cuda backend needs CuPy and a visible CUDA device; "
                                      "install adaptive-dispatch[cuda13] on a GPU machine or "
                                      "use backend='host'")
    from adaptive.backends.cuda import CudaBackend
    return CudaBackend(device or 0)
