"""Backends: where variants run. ``host`` (NumPy/SciPy) always; ``cuda`` (CuPy) with a GPU."""

from __future__ import annotations

from adaptive.backends.base import Backend, PlanIO
from adaptive.errors import BackendUnavailableError, UnknownNameError

__all__ = ["NAMES", "Backend", "PlanIO", "device_limits", "get_backend", "gpu_available",
           "resolve_name"]

NAMES = ("host", "cuda")


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


def device_limits(device: int = 0) -> dict[str, int]:
    """The limits of CUDA device ``device`` as the cuda backend reads them, or a copy of
    :data:`SM90` where there is no GPU (or no CuPy)."""
    from adaptive.limits import SM90
    if not gpu_available():
        return dict(SM90)
    return get_backend("cuda", device).limits()
