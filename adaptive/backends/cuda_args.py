"""Kernel argument vocabulary: what each name in a manifest's ``launch.args`` passes.

A CUDA variant lists its kernel parameters by name (``args = ["a", "b", "out", "M",
"N", "K"]``). When a plan is built each name is bound once to a *slot*: either a constant
(a dim, a param, a config value, a device limit, the workspace pointer) or a per-call
value (an input array, the output, something derived from an input). The warm call then
only evaluates the per-call slots. Resolution order for a name:

1. ``out`` (the result), an array name of the op (``a``, ``b``, ``x``, ``q``...), or
   one of its optional arrays (attention's ``mask``: a null pointer where the call gave
   none);
2. ``workspace``: a zero-initialised device buffer of ``launch.workspace_bytes`` bytes,
   one per plan and stream (:class:`StreamWorkspaces`: a plan called from two streams at
   once must not share split-K partials and tile counters; kernels that use it as
   counters must leave it zeroed);
3. a per-op provider (:func:`register`), e.g. spmm's ``w_csr_indptr``;
4. a scalar from the plan scope: dims, op params, config values, device limits.

Scalars are ``int32`` (bools 0/1, ``None`` is an error) and ``float32`` for floats;
``name:i64``, ``name:u64``, ``name:f32``, ``name:i32`` force a type.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping

import numpy as np

from adaptive.errors import InputValueError

SCALAR_TYPES = {"i32": np.int32, "i64": np.int64, "u64": np.uint64, "f32": np.float32}


@dataclasses.dataclass(frozen=True)
class ArgProvider:
    """How to produce one kernel argument that is not an array, dim or param.

    Exactly one of ``plan`` and ``call`` is set:
      * ``plan(problem, scope) -> value``: computed once per plan (a constant);
      * ``call(arg) -> value``: computed on every call from ``args[index]`` (e.g. a device
        pointer of a format cached on a :class:`~adaptive.SparseWeight`).
    Values are what CuPy's kernel launcher accepts: a ``cupy.ndarray``, or a NumPy
    scalar (``np.uint64(ptr)`` for a raw device pointer, ``np.int32``, ``np.float32``).
    """

    doc: str
    plan: Callable | None = None
    call: Callable | None = None
    index: int = 0

    def __post_init__(self):
        if (self.plan is None) == (self.call is None):
            raise ValueError("an ArgProvider needs exactly one of plan= and call=")


PROVIDERS: dict[str, dict[str, ArgProvider]] = {}


def register(op: str, name: str, provider: ArgProvider) -> None:
    """Add (or replace) the provider of argument ``name`` for ``op``'s CUDA variants."""
    PROVIDERS.setdefault(op, {})[name] = provider


def _attention_scale(problem, scope):
    scale = scope.get("scale")
    return np.float32(1.0 / np.sqrt(scope["D"]) if scale is None else scale)


register("attention", "scale", ArgProvider("logit scale; 1/sqrt(D) when not given",
                                           plan=_attention_scale))


def _mask_strides(problem, scope) -> tuple[int, int]:
    """Elements between the mask rows of consecutive batch entries and of consecutive query
    heads (0 where the mask is broadcast over that dim, or absent)."""
    extra = problem.extra_dict
    plane = scope["Lq"] * scope["Lk"]
    sh = plane if extra.get("mask_per_head") else 0
    sb = (scope["H"] if sh else 1) * plane if extra.get("mask_per_batch") else 0
    return sb, sh


register("attention", "mask_sb", ArgProvider(
    "mask elements between batch entries (0: one mask row set for the batch, or no mask)",
    plan=lambda problem, scope: np.int32(_mask_strides(problem, scope)[0])))
register("attention", "mask_sh", ArgProvider(
    "mask elements between query heads (0: broadcast over heads, or no mask)",
    plan=lambda problem, scope: np.int32(_mask_strides(problem, scope)[1])))
register("attention", "mask_bool", ArgProvider(
    "1: the mask is boolean (True: seen); 0: additive in q's dtype, or no mask",
    plan=lambda problem, scope: np.int32(bool(problem.extra_dict.get("mask_bool")))))


@dataclasses.dataclass(frozen=True)
class Slot:
    """One bound kernel argument: ``code`` is a Python expression over the call's names."""

    name: str
    code: str
    constant: object = None


def pointer_code(kind: str, ref: str) -> str:
    """Expression giving the device pointer of array ``ref`` for an input of ``kind``."""
    if kind in ("cupy", "numpy"):        # numpy inputs were copied into CuPy arrays
        return ref
    if kind == "torch":
        return f"_u64({ref}.data_ptr())"
    return f"_u64({ref}.__cuda_array_interface__['data'][0])"


class StreamWorkspaces:
    """A plan's workspace, one zeroed buffer per CUDA stream it is launched on.

    Args:
        zeros: ``zeros(nbytes, stream_ptr)`` -> a zeroed device buffer, its memset ordered
            on that stream (so the first kernel there sees zeros).
        nbytes: the buffer size.
        stream_ptr: ``stream_ptr()`` -> the stream the launch goes to.
    """

    def __init__(self, zeros: Callable, nbytes: int, stream_ptr: Callable[[], int]):
        self._zeros, self.nbytes, self._stream_ptr = zeros, int(nbytes), stream_ptr
        self._buffers: dict[int, object] = {}
        self._lock = threading.Lock()

    def __call__(self):
        ptr = self._stream_ptr()
        buf = self._buffers.get(ptr)
        if buf is None:
            with self._lock:
                buf = self._buffers.get(ptr)
                if buf is None:
                    buf = self._buffers[ptr] = self._zeros(self.nbytes, ptr)
        return buf

    def __len__(self) -> int:
        return len(self._buffers)


def bind(op, names: list[str], kind: str, scope: Mapping, problem,
         workspace=None) -> tuple[list[Slot], dict]:
    """Bind each argument name to a slot; returns slots and the constants they name."""
    slots, env = [], {}
    providers = PROVIDERS.get(op.name, {})
    for i, spec in enumerate(names):
        name, _, typ = spec.partition(":")
        if typ and typ not in SCALAR_TYPES:
            raise InputValueError(f"{op.name}: argument {spec!r} has unknown type {typ!r}; "
                                  f"expected one of {', '.join(SCALAR_TYPES)}")
        const = f"_c{i}"
        if name == "out":   # a CuPy result except for tensor callers (torch's allocator)
            slots.append(Slot(name, pointer_code(kind, "out") if kind == "torch" else "out"))
        elif name in op.arrays:
            slots.append(Slot(name, pointer_code(kind, f"args[{op.arrays.index(name)}]")))
        elif name in op.optional_arrays:
            index = len(op.arrays) + op.optional_arrays.index(name)
            if index < op.arrays_given(problem):
                slots.append(Slot(name, pointer_code(kind, f"args[{index}]")))
            else:   # not given: a null pointer (the kernel's config says it reads none)
                env[const] = np.uint64(0)
                slots.append(Slot(name, const, env[const]))
        elif name == "workspace":
            if workspace is None:
                raise InputValueError(f"{op.name}: argument 'workspace' needs "
                                      "launch.workspace_bytes in the manifest")
            env[const] = workspace
            # a StreamWorkspaces is called per launch (the buffer of the current stream)
            slots.append(Slot(name, f"{const}()") if callable(workspace) else
                         Slot(name, const, workspace))
        elif name in providers:
            p = providers[name]
            if p.plan is not None:
                env[const] = p.plan(problem, scope)
                slots.append(Slot(name, const, env[const]))
            else:
                env[f"_p{i}"] = p.call
                slots.append(Slot(name, f"_p{i}(args[{p.index}])"))
        elif name in scope:
            value = scope[name]
            if value is None or isinstance(value, str):
                raise InputValueError(f"{op.name}: kernel argument {name!r} is {value!r}; a "
                                      "scalar argument must be a number or bool")
            if typ:
                value = SCALAR_TYPES[typ](value)
            elif isinstance(value, (bool, int, np.integer)):
                value = np.int32(value)
            else:
                value = np.float32(value)
            env[const] = value
            slots.append(Slot(name, const, value))
        else:
            known = sorted({"out", "workspace", *op.arrays, *op.optional_arrays, *providers,
                            *scope})
            raise InputValueError(f"{op.name}: unknown kernel argument {name!r}; known names: "
                                  f"{', '.join(known)}")
    return slots, env


def make_launcher(slots: list[Slot], env: dict, function, grid: tuple, block: tuple,
                  shared_bytes: int, stream_code: str = "None", extra: dict | None = None):
    """A ``launch(args, out)`` function, generated once per plan (no per-call branching)."""
    arg_text = ", ".join(s.code for s in slots) + ("," if len(slots) == 1 else "")
    src = (f"def launch(args, out):\n"
           f"    _f(_grid, _block, ({arg_text}), _smem, {stream_code})\n")
    env, u64 = _as_kernel_args(env, function)
    namespace = {"_f": function, "_grid": grid, "_block": block, "_smem": shared_bytes,
                 "_u64": u64, **env, **(extra or {})}
    exec(_compiled(src), namespace)  # noqa: S102 (our own text)
    return namespace["launch"]


@functools.lru_cache(maxsize=1024)
def _compiled(src: str):
    """The launcher's code, compiled once per text: the keys of one variant share it (their
    constants differ, their names do not), and compiling took ~40 us of each miss."""
    return compile(src, "<adaptive launcher>", "exec")


def _as_kernel_args(env: dict, function) -> tuple[dict, Callable]:
    """Constants in the form CuPy's ``Function`` passes through untouched (its ``CPointer``
    holders), and the raw-pointer wrapper: otherwise every call converts each NumPy scalar
    (``x.view(...)`` plus a holder) again. Other callables get the values unchanged."""
    if not type(function).__module__.startswith("cupy"):
        return env, np.uint64
    from cupy.cuda import function as cuda_function
    try:
        holders = {1: cuda_function.CInt8, 2: cuda_function.CInt16, 4: cuda_function.CInt32,
                   8: cuda_function.CInt64}
        pointer = cuda_function.CIntptr
    except AttributeError:   # a CuPy without these holders: plain values still launch
        return env, np.uint64
    out = {}
    for name, value in env.items():
        if isinstance(value, np.generic) and value.dtype.itemsize in holders:
            size = value.dtype.itemsize
            value = holders[size](int(value.view(f"i{size}")))
        out[name] = value
    return out, pointer
