"""Array kinds the library accepts, and the one place that looks inside them.

The hot path calls :func:`signature` per argument: a tuple that fixes everything the
miss path validated (kind, shape, dtype, strides, device). Conversions between kinds
are bound into a plan on a miss. NumPy is always present; CuPy and PyTorch are used
only if the caller already imported them (never imported here on the hot path).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from adaptive.errors import InputTypeError

DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """What the miss path knows of one array argument."""

    kind: str            # "numpy" | "cupy" | "torch" | "cuda"  (the last: __cuda_array_interface__)
    shape: tuple
    dtype: str           # one of DTYPE_NAMES, or the foreign name when unsupported
    contiguous: bool
    device: str          # "cpu" or "cuda:N"


def _numpy_sig(a):
    return (np.ndarray, a.shape, a.dtype, a.strides)


def _cupy_sig(a):
    return (type(a), a.shape, a.dtype, a.strides, a.data.device_id)


def _torch_sig(t):
    return (type(t), t.shape, t.dtype, t.stride(), t.device)   # torch.Size is a tuple


def _cai_sig(a):
    cai = a.__cuda_array_interface__
    return (type(a), tuple(cai["shape"]), cai["typestr"], cai.get("strides"))


def _instance_sig(x):
    """Types whose instances may carry ``__cuda_array_interface__`` themselves (or not)."""
    if hasattr(x, "__cuda_array_interface__"):
        return _cai_sig(x)
    raise InputTypeError(f"expected an array (NumPy, CuPy, PyTorch tensor or an object "
                         f"with __cuda_array_interface__), got {type(x).__name__}")


# NumPy subclasses that are plain arrays; others change what operations mean (a masked
# array's mask, np.matrix's products and 2-d rows) and would give silently wrong results
_PLAIN_NUMPY = (np.ndarray, np.memmap)


def _refuse_subclass(tp):
    hint = "x.filled(fill_value) (or np.ma.getdata(x))" if issubclass(tp, np.ma.MaskedArray) \
        else "np.asarray(x)"

    def refuse(x):
        raise InputTypeError(f"{tp.__module__}.{tp.__name__} is a NumPy array subclass with its "
                             f"own semantics, which adaptive does not take (it would be read "
                             f"as a plain array); pass a plain ndarray, e.g. {hint}")
    return refuse


def _signature_fn(tp):
    """Find (once per type) how to sign arrays of this type."""
    module = tp.__module__.split(".")[0]
    if issubclass(tp, np.ndarray):
        return _numpy_sig if tp in _PLAIN_NUMPY else _refuse_subclass(tp)
    if module == "cupy" or module == "cupy_backends":
        return _cupy_sig
    if module == "torch":
        return _torch_sig
    if hasattr(tp, "__cuda_array_interface__"):
        return _cai_sig
    if hasattr(tp, "signature") and hasattr(tp, "info"):   # SparseWeight and friends
        return tp.signature
    return _instance_sig


class _Signers(dict):
    """type -> its signature function; a new type is looked up once (``__missing__``).

    Bounded: past :data:`MAX_SIGNER_TYPES` types (classes made per call), a new type is
    looked up on every call instead of remembered."""

    def __missing__(self, tp):
        fn = _signature_fn(tp)
        if len(self) < MAX_SIGNER_TYPES:
            self[tp] = fn
        return fn


MAX_SIGNER_TYPES = 1024


# the hot path's table: ``SIGNERS[type(x)](x)`` is ``signature(x)`` without a call layer
SIGNERS: dict = _Signers({np.ndarray: _numpy_sig})


def signature(x):
    """A small hashable tuple fixing kind, shape, dtype, layout and device of ``x``."""
    return SIGNERS[type(x)](x)


def _numpy_out_sig(a):
    return (np.ndarray, a.shape, a.dtype, a.strides) if a.flags.writeable else None


def out_signer(tp):
    """How to sign a caller's ``out=`` of type ``tp``: as :func:`signature`, but None for an
    array that cannot be written (a read-only NumPy array), so a plan refuses it up front."""
    return _numpy_out_sig if issubclass(tp, np.ndarray) else SIGNERS[tp]


def _torch_dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def info(x) -> ArrayInfo:
    """Describe an array (miss path only)."""
    signature(x)  # raises the clear type error for non-arrays and refused subclasses
    if isinstance(x, np.ndarray):
        return ArrayInfo("numpy", x.shape, x.dtype.name, x.flags.c_contiguous, "cpu")
    module = type(x).__module__.split(".")[0]
    if module in ("cupy", "cupy_backends"):
        return ArrayInfo("cupy", x.shape, x.dtype.name, x.flags.c_contiguous,
                         f"cuda:{x.data.device_id}")
    if module == "torch":
        device = "cpu" if x.device.type == "cpu" else f"cuda:{x.device.index or 0}"
        return ArrayInfo("torch", tuple(x.shape), _torch_dtype_name(x.dtype), x.is_contiguous(),
                         device)
    if hasattr(x, "info") and hasattr(type(x), "signature"):
        return x.info()
    cai = x.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"]).name
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    contiguous = strides is None or tuple(strides) == _c_strides(shape, np.dtype(cai["typestr"]).itemsize)
    return ArrayInfo("cuda", shape, dtype, contiguous, _cai_device(cai))


def _cai_device(cai) -> str:
    """The device holding a __cuda_array_interface__ buffer (asks the driver through CuPy)."""
    try:
        import cupy
        return f"cuda:{cupy.cuda.runtime.pointerGetAttributes(cai['data'][0]).device}"
    except Exception:  # noqa: BLE001 (no CuPy or no driver: the device cannot be known)
        return "cuda:?"


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def to_numpy(x):
    """A NumPy view (host arrays) or copy (device arrays) of ``x``."""
    if isinstance(x, np.ndarray):
        return x
    module = type(x).__module__.split(".")[0]
    if module in ("cupy", "cupy_backends"):
        return x.get()
    if module == "torch":
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if str(t.dtype) == "torch.bfloat16":
            raise InputTypeError("bfloat16 tensors cannot run on the host backend (NumPy has "
                                 "no bfloat16); use the cuda backend or convert to float32")
        return t.numpy()
    if hasattr(x, "__cuda_array_interface__"):
        cupy = sys.modules.get("cupy") or __import__("cupy")
        return cupy.asarray(x).get()
    raise InputTypeError(f"cannot read a {type(x).__name__} as a NumPy array")


def to_cuda(inputs: tuple) -> tuple:
    """An op's host inputs on the current CUDA device: NumPy arrays copied with CuPy
    (bfloat16 data, which NumPy cannot hold, comes as float32 and becomes a torch
    bfloat16 tensor), everything else (a SparseWeight, arrays already on the device) as it
    is. The one place tools (pack build, verifier, benchmarks, CLIs) move inputs over."""
    cupy = sys.modules.get("cupy") or __import__("cupy")
    return tuple(cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in inputs)


def to_cuda_bfloat16(inputs: tuple) -> tuple:
    """As :func:`to_cuda`, for inputs drawn as float32 that the op takes in bfloat16: torch
    bfloat16 tensors on the current CUDA device."""
    torch = sys.modules.get("torch") or __import__("torch")
    return tuple(torch.from_numpy(a).to(device="cuda", dtype=torch.bfloat16)
                 if isinstance(a, np.ndarray) else a for a in inputs)


def from_numpy(result: np.ndarray, like):
    """Return ``result`` in the array type of ``like`` (the caller's first array)."""
    if isinstance(like, np.ndarray):
        return result
    module = type(like).__module__.split(".")[0]
    if module == "torch":
        torch = sys.modules["torch"]
        return torch.from_numpy(result).to(like.device)
    if module in ("cupy", "cupy_backends"):
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(like.data.device_id):
            return cupy.asarray(result)
    return result
