"""Compile CUDA variants with NVRTC (``cuda.bindings.nvrtc``), without a GPU.

A candidate (variant × config) for one dtype and arch becomes one cubin: the source is
the dtype prelude (:func:`prelude`) followed by the variant's text; the config enters as
``-D<NAME>=<value>`` macros. ptxas' verbose report (``--ptxas-options=-v``) is parsed
into resources (registers, static shared memory, spills) that are kept with the cubin
in the :class:`~adaptive.kcache.KernelCache` and become cost-model features.

Also the ``adaptive nvrtc-check [--arch sm_90] [--op OP]`` command, which compiles every
CUDA variant × config × dtype in the registry (``--cover``: a covering set of them, see
:func:`covering_jobs`), with a progress line every few seconds, and prints the failures
and a summary (``--verbose``: a line per kernel; ``--json PATH``: the results as JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from adaptive import headers
from adaptive.errors import CompileError, UnknownNameError
from adaptive.kcache import CachedKernel, KernelCache, kernel_key
from adaptive.limits import SM90

DEFAULT_ARCH = "sm_90"

_CTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
           "float64": "double"}


def prelude(dtype: str) -> str:
    """Text put before every CUDA variant: fp16/bf16 headers, ``T`` and conversions.

    ``T`` is the element type of the op's arrays; ``to_f32(T)`` / ``from_f32<T>(float)``
    convert; ``ADAPTIVE_DTYPE_<NAME>`` is defined (e.g. ``ADAPTIVE_DTYPE_FLOAT16``);
    ``INFINITY`` is defined (NVRTC has no <math.h>).
    """
    if dtype not in _CTYPES:
        raise ValueError(f"no CUDA element type for dtype {dtype!r}; expected one of "
                         f"{', '.join(_CTYPES)}")
    return (
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
        f"#define ADAPTIVE_DTYPE_{dtype.upper()} 1\n"
        f"typedef {_CTYPES[dtype]} T;\n"
        "#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif\n"
        "__device__ __forceinline__ float to_f32(float x) { return x; }\n"
        "__device__ __forceinline__ float to_f32(double x) { return (float)x; }\n"
        "__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }\n"
        "__device__ __forceinline__ float to_f32(__nv_bfloat16 x) "
        "{ return __bfloat162float(x); }\n"
        "template <typename U> __device__ __forceinline__ U from_f32(float x);\n"
        "template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }\n"
        "template <> __device__ __forceinline__ double from_f32<double>(float x) "
        "{ return x; }\n"
        "template <> __device__ __forceinline__ __half from_f32<__half>(float x) "
        "{ return __float2half_rn(x); }\n"
        "template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) "
        "{ return __float2bfloat16_rn(x); }\n"
    )


def full_source(variant_source: str, dtype: str, source_name: str = "variant.cu") -> str:
    """Prelude + variant text, the shipped headers it includes put in place
    (:func:`adaptive.headers.expand`); ``#line`` keeps compiler messages on each file's
    own lines. What is compiled and what the kernel-cache key hashes."""
    text = headers.expand(variant_source, source_name)
    return f"{prelude(dtype)}#line 1 \"{source_name}\"\n{text}"


def macro_options(config: Mapping) -> tuple[str, ...]:
    """``-DNAME=value`` for each config entry (bools as 0/1), sorted by name."""
    out = []
    for name, value in sorted(config.items()):
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float, str)):
            raise ValueError(f"config value {name}={value!r} cannot be a macro")
        out.append(f"-D{name}={value}")
    return tuple(out)


# ---- the compiler ---------------------------------------------------------------------------

def available() -> bool:
    """True when ``cuda.bindings.nvrtc`` imports (the ``nvrtc`` extra is installed)."""
    try:
        from cuda.bindings import nvrtc  # noqa: F401
        return True
    except ImportError:
        return False


@functools.lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """CUDA header folders from the ``nvidia`` wheels (runtime, crt, cccl), then CUDA_PATH."""
    import os
    dirs = []
    try:
        import nvidia
        for base in map(Path, nvidia.__path__):
            for pattern in ("cu*/include", "cu*/include/cccl", "cuda_runtime/include",
                            "cuda_nvrtc/include", "cuda_cccl/include", "cuda_crt/include"):
                dirs += [str(p) for p in sorted(base.glob(pattern)) if p.is_dir()]
    except ImportError:
        pass
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            dirs.append(str(Path(os.environ[env]) / "include"))
    dirs.append("/usr/local/cuda/include")
    return tuple(dict.fromkeys(d for d in dirs if Path(d).is_dir()))


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    """``nvrtc-<major>.<minor>`` (part of every cache key)."""
    from cuda.bindings import nvrtc
    _, major, minor = nvrtc.nvrtcVersion()
    return f"nvrtc-{major}.{minor}"


def _check(result, what: str):
    from cuda.bindings import nvrtc
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    return result[1] if len(result) == 2 else result[1:]


def base_options(arch: str) -> tuple[str, ...]:
    return (f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v",
            *(f"-I{d}" for d in include_dirs()))


def compile_source(source: str, options: tuple[str, ...], arch: str = DEFAULT_ARCH,
                   name: str = "variant.cu") -> tuple[bytes, str]:
    """(cubin, log) for ``source``; raises ``RuntimeError(log)`` when NVRTC rejects it."""
    from cuda.bindings import nvrtc
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []),
                  "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in (*base_options(arch), *options)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(log or str(err))
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check((nvrtc.nvrtcGetCUBIN(prog, cubin)[0], None), "nvrtcGetCUBIN")
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_store_bytes": re.compile(r"(\d+) bytes spill stores"),
    "spill_load_bytes": re.compile(r"(\d+) bytes spill loads"),
}


def parse_ptxas(log: str, entry: str | None = None) -> dict[str, int]:
    """Resources of ``entry`` (or of the first kernel) from ptxas' ``-v`` report."""
    if entry is not None:
        start = log.find(f"Compiling entry function '{entry}'")
        if start >= 0:
            nxt = log.find("Compiling entry function", start + 1)
            log = log[start:nxt if nxt > 0 else None]
    out = {}
    for field, pattern in _PTXAS.items():
        m = pattern.search(log)
        out[field] = int(m.group(1)) if m else 0
    return out


def compile_candidate(variant, config: Mapping, dtype: str, arch: str = DEFAULT_ARCH,
                      cache: KernelCache | None = None) -> CachedKernel:
    """The cubin of ``variant`` with ``config`` for ``dtype`` (from the cache if present).

    Raises :class:`~adaptive.errors.CompileError` with the numbered source and the log.
    """
    source = full_source(variant.source, dtype, variant.source_name or f"{variant.name}.cu")
    options = macro_options(config) + tuple(variant.options)
    return compile_cached(source, options, arch, variant.entry, variant.name, dict(config),
                          cache)


def compile_cached(source: str, options: tuple[str, ...], arch: str, entry: str,
                   label: str, config: dict, cache: KernelCache | None) -> CachedKernel:
    if cache is None:
        from adaptive import config as cfg
        cache = KernelCache(cfg.get().cache_dir)
    key = kernel_key(source, options, arch, compiler_version())
    hit = cache.get(key)
    if hit is not None:
        return hit
    try:
        cubin, log = compile_source(source, options, arch)
    except RuntimeError as exc:
        raise CompileError(label, config, str(exc), source) from None
    return cache.put(key, cubin, parse_ptxas(log, entry))


# ---- enumeration (the check and the CPU test share it) --------------------------------------

def variant_dtypes(variant, config: Mapping | None = None) -> list[str]:
    """The op's dtypes that this variant's ``requires`` admit, judged on the conditions
    that name only ``dtype``, ``itemsize`` and config parameters (not the input's dims)."""
    from adaptive.ops import get_op
    from adaptive.ops.base import DTYPE_BYTES
    out = []
    for dtype in get_op(variant.op).dtypes:
        scope = {"dtype": dtype, "itemsize": DTYPE_BYTES[dtype], **(config or {})}
        if all(r(scope) for r in variant.requires if r.names <= scope.keys()):
            out.append(dtype)
    return out


def cuda_jobs(registry, op: str | None = None,
              limits: Mapping = SM90) -> Iterator[tuple]:
    """Every (variant, config, dtype) of a CUDA-language variant that can launch (on an
    sm_90 GPU unless ``limits`` says otherwise)."""
    ops = [op] if op else registry.ops()
    for name in ops:
        for v in registry.variants(name, "cuda", experimental=True):
            if v.language != "cuda":
                continue
            for config in v.space.configs(limits):
                for dtype in variant_dtypes(v, config):
                    yield v, config, dtype


# device limits a config can come close to, whose edge is worth a compile (static shared
# memory and block size are what ptxas and the launch reject when a constraint is wrong)
EDGE_LIMITS = ("max_shared_bytes", "max_threads_per_block", "max_registers_per_block")


def limit_need(space, config: Mapping, name: str, limits: Mapping = SM90) -> int:
    """The smallest value of the device limit ``name`` under which ``space`` still admits
    ``config``: how close the config comes to that limit (0 when no constraint reads it)."""
    lo, hi = 0, int(limits[name])
    if not space.admits(config, {**limits, name: hi}):
        return hi + 1
    while lo < hi:                      # constraints are monotone in a limit: bisect
        mid = (lo + hi) // 2
        if space.admits(config, {**limits, name: mid}):
            hi = mid
        else:
            lo = mid + 1
    return lo


# variants whose every config must also compile without register spills (memory-bound
# kernels where a spill costs the bandwidth they exist for): checked on every config by
# ``pytest --nvrtc-all`` (and the device runs' ``adaptive nvrtc-check``), on the covering
# set by the test command
NO_SPILLS = frozenset({"attention/splitkv_mma", "attention/splitkv2_mma",
                       "spmm/sparse24_stream"})


def covering_jobs(registry, op: str | None = None, limits: Mapping = SM90) -> list[tuple]:
    """A subset of :func:`cuda_jobs` that still compiles every CUDA variant: for each, every
    dtype and every value of each space parameter at least once, and, for each device limit
    its constraints read (:data:`EDGE_LIMITS`), the config nearest that limit in every
    dtype. Chosen greedily (the job covering the most unseen values first), in enumeration order
    on ties: deterministic.

    The test command compiles this set (spills checked for :data:`NO_SPILLS` variants on
    what it compiles) and ``--nvrtc-all`` every job: with the three spill-checked variants
    whole in float16 the set was 306 of 1062 jobs and the test command 157 s on a 2-core
    machine, over its 120 s target."""
    by_variant: dict[str, list[tuple]] = {}
    for v, config, dtype in cuda_jobs(registry, op, limits):
        by_variant.setdefault(v.id, []).append((v, config, dtype))
    out = []
    for jobs in by_variant.values():
        space = jobs[0][0].space
        read = set().union(*(c.names for c in space.constraints)) if space.constraints else set()
        chosen = set()
        for name in (n for n in EDGE_LIMITS if n in read):
            needs = [limit_need(space, config, name, limits) for _, config, _ in jobs]
            edge = jobs[needs.index(max(needs))][1]       # the first config nearest the limit
            chosen |= {i for i, (_, config, _) in enumerate(jobs) if config == edge}
        seen = set().union(*(_features(jobs[i]) for i in chosen)) if chosen else set()
        wanted = set().union(*(_features(j) for j in jobs))
        while wanted - seen:
            best = max((i for i in range(len(jobs)) if i not in chosen),
                       key=lambda i: (len(_features(jobs[i]) - seen), -i))
            chosen.add(best)
            seen |= _features(jobs[best])
        out += [jobs[i] for i in sorted(chosen)]
    return out


def _features(job: tuple) -> set[tuple]:
    _, config, dtype = job
    return {("dtype", dtype), *config.items()}


def _job(args) -> tuple[bool, dict, str, float]:
    source, options, arch, entry, label, config, cache_dir = args
    t0 = time.perf_counter()
    try:
        kernel = compile_cached(source, options, arch, entry, label, config,
                                KernelCache(cache_dir))
        return True, kernel.resources, "", time.perf_counter() - t0
    except CompileError as exc:
        return False, {}, exc.log, time.perf_counter() - t0


def check_all(registry, op: str | None = None, arch: str = DEFAULT_ARCH,
              cache_dir: str | None = None, workers: int = 2,
              on_result: Callable[[int, int], None] | None = None,
              cover: bool = False, variants: Sequence[str] = ()) -> list[dict]:
    """Compile every CUDA candidate (``cover``: only :func:`covering_jobs`; ``variants``:
    only these, named "op/name"); one result dict per (variant, config, dtype).
    ``on_result(done, total)`` is called as each compile finishes."""
    from adaptive import config as cfg
    cache_dir = cache_dir or cfg.get().cache_dir
    jobs = covering_jobs(registry, op) if cover else list(cuda_jobs(registry, op))
    if variants:
        known = {f"{v.op}/{v.name}" for v, _, _ in cuda_jobs(registry)}
        unknown = [n for n in variants if n not in known]
        if unknown:
            raise UnknownNameError("CUDA-language variant", unknown[0], sorted(known))
        jobs = [j for j in jobs if f"{j[0].op}/{j[0].name}" in variants]
    payload = []
    for v, config, dtype in jobs:
        source = full_source(v.source, dtype, v.source_name or f"{v.name}.cu")
        options = macro_options(config) + tuple(v.options)
        payload.append((source, options, arch, v.entry, v.name, config, cache_dir))
    results = []
    if workers > 1 and len(payload) > 1:
        with ProcessPoolExecutor(workers) as pool:
            for result in pool.map(_job, payload, chunksize=4):
                results.append(result)
                if on_result is not None:
                    on_result(len(results), len(payload))
    else:
        for p in payload:
            results.append(_job(p))
            if on_result is not None:
                on_result(len(results), len(payload))
    return [{"op": v.op, "variant": v.name, "config": config, "dtype": dtype, "ok": ok,
             "resources": res, "log": log, "time_s": t}
            for (v, config, dtype), (ok, res, log, t) in zip(jobs, results)]


# ---- CLI ------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default=DEFAULT_ARCH, help="GPU arch (default sm_90)")
    parser.add_argument("--op", default=None, help="only this op's variants")
    parser.add_argument("--variants", default="", metavar="OP/NAME,...",
                        help="only these variants (comma-separated), e.g. "
                             "attention/flash2_mma,attention/flash_wgmma: a kernel cache "
                             "filled for a benchmark that runs them")
    parser.add_argument("--workers", type=int, default=2, help="compile processes")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="a line per compiled kernel (registers, shared memory, spills)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress lines: the failures and the summary only")
    parser.add_argument("--cover", action="store_true",
                        help="a covering set only: every variant, dtype and parameter value, "
                             "the configs nearest each device limit (see covering_jobs)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the results (one object per kernel) to PATH")


def run(args: argparse.Namespace) -> int:
    if not available():
        print("adaptive nvrtc-check: cuda.bindings is not installed; "
              "pip install 'adaptive-dispatch[nvrtc]'", file=sys.stderr)
        return 2
    from adaptive.variants import shared_registry
    from adaptive.progress import Heartbeat, doing
    with Heartbeat("adaptive nvrtc-check") if not args.quiet else contextlib.nullcontext():
        doing("finding the kernels")
        names = tuple(n.strip() for n in args.variants.split(",") if n.strip())
        try:
            results = check_all(shared_registry(), args.op, args.arch, workers=args.workers,
                                on_result=lambda i, n: doing(f"compiled {i}/{n} kernels"),
                                cover=args.cover, variants=names)
        except UnknownNameError as exc:
            print(f"adaptive nvrtc-check: --variants: {exc}", file=sys.stderr)
            return 2
    if args.json:
        from adaptive.fileio import atomic_write
        atomic_write(args.json, json.dumps(results).encode(), durable=False)
    failed = [r for r in results if not r["ok"]]
    for r in results:
        if r["ok"] and args.verbose:
            res = r["resources"]
            print(f"ok   {r['op']}/{r['variant']} {r['dtype']} {r['config']} "
                  f"regs={res.get('registers')} smem={res.get('shared_bytes')} "
                  f"spills={res.get('spill_store_bytes')} ({r['time_s'] * 1e3:.0f} ms)")
    for r in failed:
        print(f"FAIL {r['op']}/{r['variant']} {r['dtype']} {r['config']}\n{r['log']}")
    print(f"{len(results) - len(failed)}/{len(results)} compiled for {args.arch}")
    return 1 if failed else 0
