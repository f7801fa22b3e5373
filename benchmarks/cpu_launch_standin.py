"""CPU stand-in for ``gpu_launch_overhead.py``: the pure-Python part of a warm CUDA launch.

No GPU: a fake CuPy-like array (module ``cupy``, ``shape``/``strides`` built per access as
CuPy's Cython properties do, ``data.device_id``) and a fake kernel ``Function`` whose
``__call__`` touches each argument once, behind the real cuda-backend launcher
(:func:`adaptive.backends.cuda_args.make_launcher`) and the real dispatcher. The numbers
are the dispatcher's own host cost per call minus the fake direct call's:

    python benchmarks/cpu_launch_standin.py [--calls 200000]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import adaptive  # noqa: E402
from adaptive import Dispatcher, Registry, config, runtime  # noqa: E402
from adaptive.backends import cuda_args  # noqa: E402
from adaptive.limits import SM90  # noqa: E402
from adaptive.variants import shared_registry  # noqa: E402
from adaptive.space import Space  # noqa: E402


class _Mem:
    __slots__ = ("device_id", "ptr")

    def __init__(self, ptr: int):
        self.device_id, self.ptr = 0, ptr


class _Flags:
    c_contiguous = True


class ndarray:  # noqa: N801 (stands in for cupy.ndarray)
    __module__ = "cupy"
    __slots__ = ("_shape", "_strides", "dtype", "data", "flags")

    def __init__(self, shape, dtype):
        self._shape, self.dtype = list(shape), np.dtype(dtype)
        step, strides = self.dtype.itemsize, []
        for n in reversed(shape):
            strides.append(step)
            step *= n
        self._strides = strides[::-1]
        self.data, self.flags = _Mem(id(self)), _Flags()

    @property
    def shape(self):          # CuPy builds the tuple from a C++ vector on each access
        return tuple(self._shape)

    @property
    def strides(self):
        return tuple(self._strides)


class FakeFunction:
    """``Function.__call__(grid, block, args, shared_mem, stream)``: one touch per arg."""

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        for a in args:
            a.__class__


class FakeCuda:
    """The cuda backend's kernel path, with a fake Function."""

    name = "cuda"
    device = "cuda:0"
    arch = "sm_90"
    index = 0

    def synchronize(self):
        pass

    def event_timer(self):
        return None

    def device_state(self):
        return {}

    def stream_ptr(self, kind):
        return 0

    def hold(self, stream_ptr, us):
        pass

    def limits(self):
        return dict(SM90)

    def peaks(self):
        return {"flops_per_s": {"float32": 6e13}, "bytes_per_s": 4.8e12}

    def adapter(self, kind):
        return None

    def empty(self, shape, dtype):
        return ndarray(shape, dtype)

    def io(self, candidate, problem, shape, like):
        from adaptive.backends import PlanIO
        return PlanIO(lambda: self.empty(shape, problem.dtype))

    def fingerprint(self):
        return {"backend": "cuda", "name": "fake"}

    def time_ms(self, fn, args, out, repeats=1):
        return [1e-3] * repeats

    def prepare(self, candidate, problem, op):
        variant = candidate.variant
        from adaptive.backends.cuda import CudaBackend
        geo = CudaBackend.launch_geometry(self, variant, candidate.config, problem)
        names = [str(n) for n in variant.launch["args"]]
        slots, env = cuda_args.bind(op, names, problem.kind, geo["scope"], problem)
        return cuda_args.make_launcher(slots, env, FakeFunction(), geo["grid"], geo["block"],
                                       geo["shared_bytes"])

    _limits = property(limits)


def per_call_us(fn, calls: int, rounds: int = 7) -> float:
    for _ in range(1000):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100000)
    calls = parser.parse_args().calls
    x, out = ndarray((8, 64), "float32"), ndarray((8, 64), "float32")
    cfg = {"WARPS": 4, "VEC": 4}
    only = dataclasses.replace(shared_registry().get("softmax", "warp_row"),
                               space=Space.from_dict({k: [v] for k, v in cfg.items()}))
    reg = Registry([only])
    with config.override(sample_every=0):
        d = Dispatcher(FakeCuda(), registry=reg)
        adaptive.reset_defaults()
        runtime.set_default(d, like=x)
        adaptive.launch("softmax", x, out=out)
    d.launch("softmax", x, out=out, variant="warp_row", config=cfg)
    fn = FakeFunction()
    kargs = (x, out, np.int32(8), np.int32(64))
    grid, block = (2,), (32, 4)
    rows = {
        "fake Function direct": per_call_us(lambda: fn(grid, block, kargs), calls),
        "adaptive.launch (out=)": per_call_us(lambda: adaptive.launch("softmax", x, out=out),
                                              calls),
        "Dispatcher.launch pinned": per_call_us(
            lambda: d.launch("softmax", x, out=out, variant="warp_row", config=cfg), calls),
        "adaptive.launch (allocates)": per_call_us(lambda: adaptive.launch("softmax", x),
                                                   calls),
    }
    direct = rows["fake Function direct"]
    for name, us in rows.items():
        extra = "" if name.startswith("fake") else f"  (+{us - direct:.2f} us)"
        print(f"{name:<30} {us:6.2f} us/call{extra}")


if __name__ == "__main__":
    main()
