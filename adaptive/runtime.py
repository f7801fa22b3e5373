"""The process: its default dispatchers, how ``adaptive.launch`` finds them, and its start.

What dispatchers share lives on their registry (:class:`~adaptive.variants.Registry`:
rows, observers); this module owns what belongs to the process as a whole:

- the default dispatcher per device, made on the first launch of arrays on that device,
  and the routing from an array's type to its dispatcher (the warm path of
  :func:`launch`: one dict lookup);
- the start (:func:`start`): the packs installed at start-up (``ADAPTIVE_PACKS`` and the
  shipped packs matching the device) and the observers the environment asks for
  (``ADAPTIVE_COUNTER_LOG``, ``ADAPTIVE_REGEN``). Default dispatchers start their backend
  once; a :class:`~adaptive.dispatch.Dispatcher` you make yourself reads no file and starts
  no thread until you call :func:`start` for it.

Nothing here runs at import.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from adaptive import arrays, config
from adaptive.dispatch import Dispatcher
from adaptive.errors import InputTypeError
from adaptive.observation import Observation
from adaptive.ops import OPS, get_op
from adaptive.variants import Registry, reset_shared_registry, shared_registry

log = logging.getLogger("adaptive")

__all__ = ["add_observations", "default_dispatcher", "launch", "live_dispatchers",
           "reset_defaults", "set_default", "shared_registry", "start",
           "process_dispatchers"]

_defaults: dict[str, Dispatcher] = {}
# hot-path routing of module-level launch: array type -> getter(array) -> Dispatcher | None
_by_type: dict[type, Callable] = {}
_by_device_key: dict = {}
_lock = threading.RLock()
_environment_started = False


def start(dispatcher: Dispatcher) -> Dispatcher:
    """Give ``dispatcher`` the process's start: the start-up packs of its registry and
    device (read once per registry and device), its candidates made
    (:meth:`Dispatcher.prepare_candidates`), the device-state sampler where
    ``ADAPTIVE_DEVICE_STATE=nvml`` asks for it, and the observers asked for by
    ``ADAPTIVE_COUNTER_LOG`` / ``ADAPTIVE_REGEN`` (started once per process, attached to
    every dispatcher of the shared registry). Returns ``dispatcher``.

    Example:
        >>> d = adaptive.runtime.start(adaptive.Dispatcher("cuda"))   # the shipped pack too
    """
    from adaptive.packs.install import load_startup_packs
    # once per registry and device; a refused ADAPTIVE_PACKS entry raises again next time
    load_startup_packs(dispatcher.backend, dispatcher.registry)
    dispatcher.prepare_candidates()   # not on each op's first request
    state = config.get().device_state
    if state == "nvml":           # the device's state as the policy's features
        dispatcher.backend.watch_device()
    elif state != "off":
        raise ValueError(f"ADAPTIVE_DEVICE_STATE={state!r}: expected off or nvml")
    _start_environment()
    return dispatcher


def _start_environment() -> None:
    """The observers the environment asks for, once per process."""
    global _environment_started
    with _lock:
        if _environment_started:
            return
        _environment_started = True
    cfg = config.get()
    if cfg.counter_log:
        from adaptive.counterlog.writer import open_configured
        open_configured(cfg.counter_log, shared_registry())
    if cfg.regen_generator != "off":
        from adaptive.regen.regenerator import enable
        enable()


def live_dispatchers() -> list[Dispatcher]:
    """The dispatchers alive on the shared registry (the default ones among them)."""
    return shared_registry().members()


def add_observations(rows: Sequence[Observation], weight: float = 1.0,
                     registry: Registry | None = None) -> None:
    """Give measurements made elsewhere to every dispatcher on ``registry`` (default: the
    shared one), present and future."""
    (registry or shared_registry()).add_observations(rows, weight)


def default_dispatcher(args=(), device: str | None = None) -> Dispatcher:
    """The process's dispatcher for the device the arguments live on (made and started
    once)."""
    if device is None:
        if not args:
            raise InputTypeError("launch needs at least one array argument")
        device = arrays.info(args[-1]).device
    d = _defaults.get(device)
    if d is None:
        with _lock:
            d = _defaults.get(device)
            if d is None:
                want = config.get().backend
                if device == "cpu":
                    d = Dispatcher("cuda" if want == "cuda" else "host")
                elif want == "host":
                    d = Dispatcher("host")
                else:
                    d = Dispatcher("cuda", device=int(device.split(":")[1]))
                start(d)
                _defaults[device] = d
        if args:
            _route(args[-1], d)
    return d


def process_dispatchers() -> list[Dispatcher]:
    """Every dispatcher of the process a caller may reach: the default ones made so far,
    one per device (what ``launch`` and the integrations use), and those alive on the
    shared registry; each once."""
    with _lock:
        defaults = list(_defaults.values())
    return list(dict.fromkeys(defaults + live_dispatchers()))


def set_default(dispatcher: Dispatcher, like) -> None:
    """Make ``dispatcher`` the default one for arrays on ``like``'s device (benchmarks
    that time ``adaptive.launch`` on a dispatcher of their own; tests)."""
    with _lock:
        _defaults[arrays.info(like).device] = dispatcher
        _route(like, dispatcher)


def _route(x, d: Dispatcher) -> None:
    """Remember how to find ``d`` from arrays like ``x`` without describing them again."""
    tp = type(x)
    module = tp.__module__.split(".")[0]
    if module == "numpy":
        _by_type[tp] = lambda _x, _d=d: _d
    elif module in ("cupy", "cupy_backends"):
        _by_device_key[("cupy", x.data.device_id)] = d
        _by_type[tp] = lambda _x: _by_device_key.get(("cupy", _x.data.device_id))
    elif module == "torch":
        _by_device_key[("torch", x.device)] = d
        _by_type[tp] = lambda _x: _by_device_key.get(("torch", _x.device))


def launch(op: str, *args, out=None, **params):
    """Run ``op`` on ``args`` with the variant and config chosen for this input.

    The first call of an input class (shapes, dtypes, layout, device, params) chooses among
    the fitting candidates; later calls of it run the chosen plan at once. The dispatcher is
    the process's default one for the device the arrays live on.

    Args:
        op: "gemm", "spmm", "attention", "softmax" or "rmsnorm" (``adaptive.OPS``).
        *args: the op's arrays: NumPy, CuPy, PyTorch tensors or objects with
            ``__cuda_array_interface__``, all of one kind and device (an
            ``adaptive.SparseWeight`` where the op takes one).
        out: optional result array (the caller's array type, the result's shape and
            dtype, C-contiguous, writeable); a new one is returned when None.
        **params: the op's parameters as scalars (attention: ``causal``, ``scale``);
            ``variant="name"`` and ``config={...}`` pin a choice instead.

    Returns:
        The result in the caller's array type (``out`` when given).

    Raises:
        InputTypeError, InputValueError: bad arguments, checked before anything runs.
        UnknownNameError: an unknown op, parameter or variant (the nearest is suggested).
        NoCandidateError: no variant on this backend fits the input.

    Example:
        >>> c = adaptive.launch("gemm", a, b)
        >>> o = adaptive.launch("attention", q, k, v, causal=True)
    """
    route = _by_type.get(type(args[-1])) if args else None
    d = route(args[-1]) if route is not None else None
    if d is None:
        try:
            d = default_dispatcher(args)
        except InputTypeError:
            (OPS.get(op) or get_op(op)).problem(args, params)   # names op and argument
            raise
    if params and ("variant" in params or "config" in params):
        return d.launch(op, *args, out=out, **params)
    return d.run(op, args, out, params)


def reset_defaults() -> None:
    """Forget the default dispatchers, the shared registry and the start-up record
    (tests; after changing the configuration). Observers started from the environment
    stay open; the next default dispatcher starts again."""
    global _environment_started
    with _lock:
        _defaults.clear()
        _by_type.clear()
        _by_device_key.clear()
        _environment_started = False
        reset_shared_registry()
