"""The cuda backend: CUDA-language variants as cubins launched through CuPy, and library
variants (cuBLAS, cuSPARSE) as Python functions over CuPy arrays.

A CUDA variant × config × dtype is compiled once (NVRTC via ``cuda.bindings`` into the
content-addressed :class:`~adaptive.kcache.KernelCache`, else CuPy's own compiler),
loaded with ``cupy.RawModule(path=...)``, and bound into a generated launcher with its
grid, block, shared memory and argument slots fixed (:mod:`adaptive.backends.cuda_args`):
a warm call evaluates the argument pointers and launches, nothing else.

Arrays: CuPy arrays run natively; PyTorch tensors and ``__cuda_array_interface__``
objects are read in place (their device pointers). A tensor caller's result is allocated
by torch's caching allocator and written in place, and library variants that name a
``torch_entry`` get the tensors as they are (cuBLAS and SDPA through torch, no DLPack
round trip). Work is issued on the caller's current stream: CuPy's, or PyTorch's current
stream when the inputs are tensors. NumPy inputs
are copied in and the result copied out. bfloat16 is handled as raw 16-bit memory
(``int16`` CuPy arrays) inside the backend, because CuPy has no bfloat16 dtype; tensors
get ``torch.bfloat16`` back.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading

import numpy as np

from adaptive import nvrtc, optional
from adaptive.backends import cuda_args
from adaptive.backends.base import GateRelease, PlanIO, released
from adaptive.backends import cuda_sparse  # noqa: F401 (registers spmm's w_csr_*/w_bsr* args)
from adaptive.backends.pysource import load_entry
from adaptive.backends.torch_streams import as_torch, cupy_stream
from adaptive.errors import CompileError, InputTypeError, InputValueError
from adaptive.expr import compile_expr
from adaptive.kcache import KernelCache
from adaptive.limits import from_properties
from adaptive.timing import CudaEvents, measure

log = logging.getLogger("adaptive")

_NATIVE = {"float16": np.float16, "bfloat16": np.int16, "float32": np.float32,
           "float64": np.float64}


class _StreamRef:
    """What CuPy's launcher needs of a stream: ``.ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


@functools.lru_cache(maxsize=64)
def _stream_ref(ptr: int) -> _StreamRef:
    return _StreamRef(ptr)


def torch_stream() -> _StreamRef:
    """PyTorch's current stream on the current device, as a CuPy-launchable ref."""
    return _stream_ref(_current_raw_stream())


def _current_raw_stream() -> int:
    """The current stream's handle. Bound on first use to torch's raw accessor (what
    Triton launches with: one C call) where torch has it, else ``current_stream()``
    (which builds a ``torch.cuda.Stream`` object per call)."""
    global _current_raw_stream
    c = sys.modules["torch"]._C
    raw, device = (getattr(c, "_cuda_getCurrentRawStream", None),
                   getattr(c, "_cuda_getDevice", None))
    if raw is not None and device is not None:
        def _current_raw_stream() -> int:
            return raw(device())
    else:
        def _current_raw_stream() -> int:
            return sys.modules["torch"].cuda.current_stream().cuda_stream
    return _current_raw_stream()


class CudaBackend:
    """Runs cuda variants on one GPU.

    Args:
        device: CUDA device ordinal.
    """

    name = "cuda"
    native_kind = "cupy"

    def __init__(self, device: int = 0):
        import cupy
        self._cp = cupy
        self.index = int(device)
        self.device = f"cuda:{self.index}"
        props = cupy.cuda.runtime.getDeviceProperties(self.index)
        self._props = props
        self._limits = from_properties(props)
        self.cc = self._limits["cc"]
        self.arch = f"sm_{props['major']}{props['minor']}"
        self._modules: dict = {}
        self._hold_fn = None
        self._lock = threading.Lock()
        self._gate = None                     # gate(): made on first use (False: none)
        self._watch = None                    # the NVML sampler: watch_device
        self._gate_lock = threading.Lock()
        self._peaks = None
        from adaptive import config
        self._cache = KernelCache(config.get().cache_dir)

    # ---- device description -----------------------------------------------------------------
    def limits(self) -> dict:
        return dict(self._limits)

    def fingerprint(self) -> dict:
        rt = self._cp.cuda.runtime
        name = self._props["name"]
        fp = {"backend": "cuda", "name": name.decode() if isinstance(name, bytes) else name,
              "cc": self.cc, "sm_count": self._limits["sm_count"],
              "driver_version": rt.driverGetVersion(), "runtime_version": rt.runtimeGetVersion(),
              "cupy": self._cp.__version__, "mem_bytes": int(self._props["totalGlobalMem"])}
        if nvrtc.available():
            fp["nvrtc"] = nvrtc.compiler_version()
        return fp

    def peaks(self) -> dict:
        """Copy bandwidth and cuBLAS rates for fp16/fp32: measured by the first process on
        this device, then read from the cache folder (:mod:`adaptive.peaks`)."""
        if self._peaks is None:
            from adaptive import config
            from adaptive.backends.cuda_peaks import measure_peaks
            from adaptive.peaks import cached_peaks

            def measure():
                with self._cp.cuda.Device(self.index):
                    return measure_peaks(self._cp)
            self._peaks = cached_peaks(self.fingerprint(), measure, config.get().cache_dir)
        return self._peaks

    # ---- arrays -----------------------------------------------------------------------------
    def adapter(self, kind: str):
        cp = self._cp
        if kind == "cupy":
            return None
        if kind == "numpy":
            return cp.asarray, _to_host
        if kind == "torch":
            return _identity, _to_torch
        if kind == "cuda":
            return _identity, _identity_like
        raise InputTypeError(f"the cuda backend cannot take {kind} arrays; pass CuPy arrays, "
                             "PyTorch CUDA tensors, __cuda_array_interface__ objects or NumPy")

    def empty(self, shape: tuple, dtype: str):
        return self._cp.empty(shape, _NATIVE[dtype])

    def io(self, candidate, problem, shape: tuple, like):
        """``(alloc, adapter)`` of a plan. Tensors stay tensors: the result comes from
        torch's caching allocator on the input's device (its current stream) and nothing
        is converted per call; other kinds get CuPy results and the kind's adapter."""
        if problem.kind == "torch":
            torch = sys.modules["torch"]
            alloc = functools.partial(torch.empty, shape, dtype=getattr(torch, problem.dtype),
                                      device=like.device)
            return PlanIO(alloc, None, returns=bool(candidate.variant.torch_entry))
        return PlanIO(functools.partial(self.empty, shape, problem.dtype),
                      self.adapter(problem.kind))

    def synchronize(self) -> None:
        self._cp.cuda.Device(self.index).synchronize()

    def device_state(self) -> dict:
        """The newest NVML/GPM reading of this device (at most a second old) once
        :meth:`watch_device` runs, with ``max_sm_clock_mhz`` beside it; else ``{}`` (the
        policy then sees an idle device)."""
        sampler = self._watch
        state = sampler.latest_state(max_age_s=1.0) if sampler is not None else None
        if state is None:
            return {}
        out = state.to_dict()
        if sampler.max_sm_clock_mhz:
            out["max_sm_clock_mhz"] = sampler.max_sm_clock_mhz
        return out

    def watch_device(self, period_s: float = 0.1) -> str:
        """Sample this device's NVML/GPM counters in a thread (one per device, shared by
        every backend of it in the process) for :meth:`device_state`: "ok", or why not
        (said once, and the policy sees an idle device)."""
        if self._watch is not None:
            return "ok"
        with _watch_lock:
            entry = _watchers.get(self.index)
            if entry is None:
                entry = _watchers[self.index] = _start_watch(self.index, period_s)
        if isinstance(entry, str):
            return entry
        self._watch = entry
        return "ok"

    def _zeros_on(self, nbytes: int, stream_ptr: int):
        """A zeroed buffer whose memset is ordered before later work on ``stream_ptr`` (a
        workspace's; made once per plan and stream)."""
        cp = self._cp
        with cp.cuda.Device(self.index):
            try:
                with cp.cuda.ExternalStream(stream_ptr, self.index):
                    return cp.zeros(nbytes, np.uint8)
            except cp.cuda.runtime.CUDARuntimeError:   # not usable as a stream here: wait
                buf = cp.zeros(nbytes, np.uint8)
                cp.cuda.Device(self.index).synchronize()
                return buf

    # ---- timing without waiting -------------------------------------------------------------
    def event_timer(self, capacity: int = 256):
        """A ring of CUDA event pairs on this device (sampled calls are timed with it and
        harvested on later calls: nothing waits for the GPU)."""
        from profilers.events import EventTimer
        with self._cp.cuda.Device(self.index):
            return EventTimer(capacity, device=self.index)

    def hold(self, stream_ptr: int, us: float) -> None:
        """Keep the GPU busy on ``stream_ptr`` for about ``us`` (one thread spinning on
        the SM clock), so the work the host issues next is queued, not run as it comes."""
        fn = self._hold_fn
        if fn is None:
            module = self._cp.RawModule(code=_HOLD_SOURCE)
            fn = self._hold_fn = module.get_function("adaptive_hold")
        cycles = np.int64(us * self._props["clockRate"] / 1e3)   # clockRate: kHz
        with self._cp.cuda.Device(self.index):
            fn((1,), (1,), (cycles,), stream=_stream_ref(stream_ptr))

    def gate(self, stream_ptr: int, limit_us: float):
        """Hold ``stream_ptr`` until the host calls the returned function (at most
        ``limit_us``): an event pair and a call issued in between are queued behind the
        gate and run back to back, so the pair times the call's kernels, not the host's
        launch of them (on an idle GPU a pair around a 3 us kernel read 19 us, run S8). On
        a busy GPU the gate runs after the work before it and finds itself released: it
        costs a launch, not the fixed wait of :meth:`hold`. Where the gate cannot be made
        (no mapped host memory) or fails to launch, a :meth:`hold` of ``limit_us`` (from
        then on); the function then does nothing. Never raises; always call the function,
        also when the call fails."""
        g = self._gate
        if g is None:
            with self._lock:
                if self._gate is None:
                    self._gate = self._make_gate()
                g = self._gate
        if g is not False:
            fn, flag_ptr, flag, tickets, ring_ptr, ring = g
            ticket = next(tickets)
            try:
                with self._cp.cuda.Device(self.index):
                    fn((1,), (1,), (np.uint64(flag_ptr), np.uint64(ticket),
                                    np.uint64(int(limit_us * 1e3)), np.uint64(ring_ptr),
                                    np.uint64(len(ring))),
                       stream=_stream_ref(stream_ptr))
                # the flag bound now: a gate turned into the fixed hold later (another
                # thread's launch failed) still releases this one
                return GateRelease(functools.partial(self._release_gate, flag, ticket), ring,
                                   ticket)
            except Exception as exc:  # noqa: BLE001 (the fixed hold from now on)
                log.warning("cuda backend: the stream gate failed to launch (%s: %s); timed "
                            "samples hold the stream for a fixed time from now on",
                            type(exc).__name__, exc)
                self._gate = False
        self.hold(stream_ptr, limit_us)
        return released

    def _make_gate(self):
        """(kernel, the flag's device address, the flag, tickets, the expiry ring's device
        address, the ring), or False (said once)."""
        import ctypes
        import itertools
        cp = self._cp
        try:
            with cp.cuda.Device(self.index):
                rt = cp.cuda.runtime
                host = rt.hostAlloc(8 * (1 + GATE_RING), 2)   # cudaHostAllocMapped
                ctypes.memset(host, 0, 8 * (1 + GATE_RING))
                flag = ctypes.c_uint64.from_address(host)
                ring = (ctypes.c_uint64 * GATE_RING).from_address(host + 8)
                get_device_pointer = getattr(rt, "hostGetDevicePointer", None)
                device = get_device_pointer(host, 0) if get_device_pointer else host  # UVA
                fn = cp.RawModule(code=_GATE_SOURCE).get_function("adaptive_gate")
        except Exception as exc:  # noqa: BLE001 (a fixed hold is the fallback)
            log.warning("cuda backend: no stream gate (%s: %s); timed samples hold the "
                        "stream for a fixed time instead", type(exc).__name__, exc)
            return False
        return fn, device, flag, itertools.count(1), device + 8, ring

    def _release_gate(self, flag, ticket: int) -> None:
        with self._gate_lock:      # the flag only grows: ticket t releases every gate up to
            if flag.value < ticket:    # t, and an earlier ticket's release takes none back
                flag.value = ticket

    def wait_stream(self, stream_ptr: int) -> None:
        """Wait for ``stream_ptr``'s queued work (``cudaStreamSynchronize``)."""
        with self._cp.cuda.Device(self.index):
            self._cp.cuda.runtime.streamSynchronize(stream_ptr)

    def stream_idle(self, stream_ptr: int) -> bool | None:
        """Whether ``stream_ptr`` has finished all its queued work (``cudaStreamQuery``:
        success, or "not ready"); None for any other answer."""
        rt = self._cp.cuda.runtime
        try:
            with self._cp.cuda.Device(self.index):
                status = rt.streamQuery(stream_ptr)
        except rt.CUDARuntimeError as exc:   # a CuPy that raises on "not ready"
            if getattr(exc, "status", None) == _NOT_READY:
                return False
            raise
        return True if status == 0 else False if status == _NOT_READY else None

    def stream_ptr(self, kind: str) -> int:
        """The stream a launch of inputs of ``kind`` goes to (PyTorch's for tensors)."""
        return torch_stream().ptr if kind == "torch" else self._cp.cuda.get_current_stream().ptr

    # ---- compiling --------------------------------------------------------------------------
    def function(self, variant, config: dict, dtype: str):
        """The loaded kernel function (a CuPy ``Function``) and its resources."""
        key = (variant.id, variant.source_hash, tuple(sorted(config.items())), dtype)
        hit = self._modules.get(key)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._modules.get(key)
            if hit is None:
                hit = self._modules[key] = self._load(variant, config, dtype)
        return hit

    def _load(self, variant, config: dict, dtype: str):
        cp = self._cp
        if nvrtc.available():
            kernel = nvrtc.compile_candidate(variant, config, dtype, self.arch, self._cache)
            module = cp.RawModule(path=str(kernel.path))
            resources = kernel.resources
        else:  # CuPy's own NVRTC: no ptxas report, so no resources
            source = nvrtc.full_source(variant.source, dtype, variant.source_name or "v.cu")
            options = ("-std=c++17", *nvrtc.macro_options(config), *variant.options)
            module = cp.RawModule(code=source, options=options)
            resources = {}
        try:
            raw = module.get_function(variant.entry)
            fn = raw.kernel
        except Exception as exc:  # noqa: BLE001 (CuPy raises its own compile errors)
            raise CompileError(variant.name, config, f"{type(exc).__name__}: {exc}",
                               variant.source) from None
        return raw, fn, dict(resources)

    # ---- running ----------------------------------------------------------------------------
    def prepare(self, candidate, problem, op):
        variant, config = candidate.variant, candidate.config
        if variant.language == "python":
            return self._prepare_library(variant, config, problem)
        return self._prepare_kernel(variant, config, problem, op)

    def launch_geometry(self, variant, config: dict, problem) -> dict:
        """Grid, block, dynamic shared bytes and workspace bytes for this plan."""
        scope = {**problem.scope(), **self._limits, **config}
        launch = variant.launch
        grid = tuple(int(compile_expr(str(e))(scope)) for e in launch["grid"])
        block = tuple(int(compile_expr(str(e))(scope)) for e in launch["block"])
        smem = int(compile_expr(str(launch.get("shared_bytes", 0)))(scope))
        ws = int(compile_expr(str(launch.get("workspace_bytes", 0)))(scope))
        threads = int(np.prod(block))
        if threads > self._limits["max_threads_per_block"] or min(block) < 1 or min(grid) < 1:
            raise InputValueError(f"{variant.id}: block {block} / grid {grid} cannot launch "
                                  f"(max {self._limits['max_threads_per_block']} threads)")
        if smem > self._limits["max_shared_bytes"]:
            raise InputValueError(f"{variant.id}: {smem} bytes of dynamic shared memory exceed "
                                  f"the device's {self._limits['max_shared_bytes']}")
        return {"grid": grid, "block": block, "shared_bytes": smem, "workspace_bytes": ws,
                "scope": scope}

    def _prepare_kernel(self, variant, config, problem, op):
        raw, fn, _ = self.function(variant, config, problem.dtype)
        geo = self.launch_geometry(variant, config, problem)
        if geo["shared_bytes"] > 48 * 1024:
            raw.max_dynamic_shared_size_bytes = geo["shared_bytes"]
        workspace = None
        if geo["workspace_bytes"]:
            workspace = cuda_args.StreamWorkspaces(
                self._zeros_on, geo["workspace_bytes"],
                (lambda: torch_stream().ptr) if problem.kind == "torch" else
                (lambda: self._cp.cuda.get_current_stream().ptr))
        names = [str(n) for n in variant.launch.get("args", [])]
        if not names:
            raise InputValueError(f"{variant.id}: a cuda variant needs launch.args")
        slots, env = cuda_args.bind(op, names, problem.kind, geo["scope"], problem, workspace)
        stream_code, extra = "None", {}
        if problem.kind == "torch":
            stream_code, extra = "_stream()", {"_stream": torch_stream}
        launch = cuda_args.make_launcher(slots, env, fn, geo["grid"], geo["block"],
                                         geo["shared_bytes"], stream_code, extra)
        launch.workspace = workspace  # keeps the buffers alive with the plan
        return launch

    def _prepare_library(self, variant, config, problem):
        fn = load_entry(variant)
        kwargs = {**config, **problem.params_dict}
        bound = functools.partial(fn, **kwargs) if kwargs else fn
        kind, bf16 = problem.kind, problem.dtype == "bfloat16"
        cp = self._cp
        if kind == "cupy" and "torch" in variant.needs and variant.torch_entry:
            # the variant's torch entry on views of CuPy's arrays, made without DLPack's
            # stream exchange (torch's stream is CuPy's here): run S66 (H200), SDPA from
            # CuPy issued in 83 us, of which 4 views through the protocol took 26
            torch_fn = load_entry(variant, variant.torch_entry)
            native = functools.partial(torch_fn, **kwargs) if kwargs else torch_fn
            # imported here if no caller did yet (a pack build's first case: run S72's
            # KeyError), once, under optional's lock, on the miss path
            index, torch = self.index, optional.require("torch", f"variant {variant.id}")

            def view(a):
                if not hasattr(a, "__dlpack__"):   # a SparseWeight: the entry reads it
                    return a
                t = as_torch(torch, a)
                return t.view(torch.bfloat16) if bf16 and t.dtype == torch.int16 else t

            def run_torch_entry_on_cupy_stream(args, out):
                with cupy_stream(torch, index):
                    native(*[view(a) for a in args], out=view(out))
            return run_torch_entry_on_cupy_stream
        if kind in ("cupy", "numpy") and "torch" in variant.needs:
            index, torch = self.index, optional.require("torch", f"variant {variant.id}")

            def run_on_cupy_stream(args, out):   # torch's work on CuPy's current stream
                with cupy_stream(torch, index):
                    bound(*args, out=out)
            return run_on_cupy_stream
        if kind in ("cupy", "numpy"):
            def run(args, out):
                bound(*args, out=out)
            return run
        if kind == "torch" and variant.torch_entry:   # torch in, torch out: no round trip
            native_fn = load_entry(variant, variant.torch_entry)
            native = functools.partial(native_fn, **kwargs) if kwargs else native_fn

            def run_torch_native(args, out):   # out None: torch allocates, as plain torch
                return native(*args, out=out)
            return run_torch_native
        if kind == "torch":   # a CuPy-only library call: DLPack views on torch's stream
            def as_cupy(t):
                return cp.from_dlpack(t.view(sys.modules["torch"].int16) if bf16 else t)

            def run_torch(args, out):
                native = [a if hasattr(type(a), "signature") else as_cupy(a) for a in args]
                with cp.cuda.ExternalStream(torch_stream().ptr):
                    bound(*native, out=as_cupy(out))
            return run_torch

        def run_cai(args, out):
            native = [a if hasattr(type(a), "signature") else cp.asarray(a) for a in args]
            bound(*native, out=out)
        return run_cai

    def time_ms(self, fn, args, out, repeats: int = 1) -> list[float]:
        """Device times of ``fn(args, out)`` on the current stream, one per run (each run
        behind a gate: its kernels' time, not the host's issuing of them)."""
        timer = self.device_timer(self._cp.cuda.get_current_stream().ptr)
        return list(measure(lambda: fn(args, out), reps=repeats, timer=timer,
                            raise_errors=True).samples_ms)

    def device_timer(self, stream_ptr: int, gated: bool = True):
        """A :data:`~adaptive.timing.Timer` of one run's device time on that stream: CUDA
        events behind a :meth:`gate` (at most :data:`TIME_GATE_US` while the host issues
        the run); ``gated=False``: a bare pair, which on an idle stream reads the host's
        latency to the launch with the device time."""
        return CudaEvents(self._cp, gate=self.gate if gated else None, limit_us=TIME_GATE_US,
                          stream_ptr=stream_ptr)


_NOT_READY = 600   # cudaErrorNotReady: the stream still has work queued

# how long a measuring gate waits for the host to issue the run: a Python library call
# with a mask built per call issues for a few hundred us
TIME_GATE_US = 2000.0

_HOLD_SOURCE = r"""
extern "C" __global__ void adaptive_hold(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
"""

# waits until the host has written a ticket at least this one's into the mapped flag, or
# limit_ns passed (the GPU's global timer): a gate never holds a stream for longer. A gate
# that ran out writes its ticket into its slot of the mapped ring (GateRelease.expired)
_GATE_SOURCE = r"""
extern "C" __global__ void adaptive_gate(const volatile unsigned long long* flag,
                                         unsigned long long ticket,
                                         unsigned long long limit_ns,
                                         volatile unsigned long long* expired,
                                         unsigned long long ring) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (*flag < ticket) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > limit_ns) {
            expired[ticket % ring] = ticket;
            __threadfence_system();
            return;
        }
        __nanosleep(100);
    }
}
"""
# slots of the gate's expiry ring: a sample is harvested long before this many more gates
GATE_RING = 4096



_watch_lock = threading.Lock()
_watchers: dict = {}        # cuda index -> its NVML sampler, or why there is none


def _start_watch(index: int, period_s: float):
    """One NVML sampler of device ``index`` for the process (never stopped: a daemon
    thread), or the reason there is none."""
    from profilers.nvml import NvmlSampler, nvml_device
    try:
        sampler = NvmlSampler(nvml_device(index), period_s=period_s)
    except Exception as exc:  # noqa: BLE001 (the device state is context, not the launch)
        why = f"NVML unavailable: {type(exc).__name__}: {exc}"
    else:
        if sampler.status == "ok":
            return sampler.start()
        why = f"NVML: {sampler.status}"
    log.warning("cuda:%d device state: %s; the policy sees an idle device", index, why)
    return why


def _identity(x):
    return x


def _identity_like(result, like):
    return result


def _to_host(result, like):
    return result.get()


def _to_torch(result, like):
    torch = sys.modules["torch"]
    t = torch.from_dlpack(result)
    return t.view(torch.bfloat16) if like.dtype == torch.bfloat16 else t

