"""Run simple CUDA kernels on the CPU: a fiber per CUDA thread, blocks one at a time.

For checking the logic of small kernels (index maths, shared-memory tiles, warp
shuffles, barriers) on machines without a GPU. The kernel source is compiled by g++
with a thin emulation of the CUDA built-ins it uses (``threadIdx``, ``__syncthreads``,
``__shfl_xor_sync``, ``__shared__`` as per-block statics); ``T`` is ``float``. Timing and
memory-model behaviour are not emulated: a race that real hardware would show may pass.

    lib = build(source, {"kernel": ["ptr", "i32", "f32"]}, tmp_path)
    lib["kernel"](grid, block, (array, np.int32(3), np.float32(1.0)))

Tensor-core variants run with :data:`PTX` (ptx_emu.h: fp16 built-ins and the emulation of
adaptive/include/adaptive_ptx.cuh) after :data:`HEADER`, and their text from
:func:`kernel_source`.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from adaptive import headers

# where the emulated kernels report a fault the GPU would raise (ptx_emu.h's emu_fault: a
# misaligned access); fault_reports() reads it, the tests' conftest after every test
_FAULTS = Path(tempfile.mkdtemp(prefix="cuda-emu-")) / "faults.txt"
os.environ["CUDA_EMU_FAULTS"] = str(_FAULTS)


def fault_reports() -> list[str]:
    """The faults emulated kernels reported since the last call, one line each (taken off
    the disk); empty when the kernels run so far were clean."""
    if not _FAULTS.exists():
        return []
    lines = _FAULTS.read_text().splitlines()
    _FAULTS.unlink()
    return lines

HEADER = r"""
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>
#include <ucontext.h>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
static dim3 threadIdx, blockIdx;     // the running CUDA thread's (one runs at a time)
static dim3 blockDim, gridDim;
// A CUDA thread is a fiber (ucontext) of one OS thread: it runs until it waits at a
// barrier or ends, then the next one runs. Barriers count arrivals; a waiting thread runs
// again once its barrier's phase has moved on.
struct emu_fiber { ucontext_t ctx; void* sp = nullptr; dim3 idx;
                   const struct emu_barrier_t* waits = nullptr;
                   unsigned long phase = 0; bool done = false; };
static std::vector<emu_fiber> emu_fibers;
static ucontext_t emu_main;
static void* emu_main_sp;
static int emu_current;
// The switch between the scheduler and a fiber: on x86-64 a swap of stack pointers that
// keeps the callee-saved registers and the SSE and x87 control words (what the ABI keeps
// across a call); elsewhere swapcontext, which also sets the signal mask: a system call on
// every switch, a quarter of an emulated kernel's time.
#if defined(__x86_64__)
extern "C" void emu_jump(void** save_sp, void* load_sp);
asm(".pushsection .text\n.p2align 4\n.globl emu_jump\n.hidden emu_jump\n"
    ".type emu_jump, @function\nemu_jump:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n.size emu_jump, .-emu_jump\n.popsection\n");
inline void emu_to_main(emu_fiber& f) { emu_jump(&f.sp, emu_main_sp); }
inline void emu_to_fiber(emu_fiber& f) { emu_jump(&emu_main_sp, f.sp); }
#else
inline void emu_to_main(emu_fiber& f) { swapcontext(&f.ctx, &emu_main); }
inline void emu_to_fiber(emu_fiber& f) { swapcontext(&emu_main, &f.ctx); }
#endif
struct emu_barrier_t {
    int expected, arrived = 0;
    unsigned long phase = 0;
    explicit emu_barrier_t(int n) : expected(n) {}
    void arrive_and_wait() {
        if (++arrived == expected) { arrived = 0; ++phase; return; }
        emu_fiber& f = emu_fibers[emu_current];
        f.waits = this;
        f.phase = phase;
        emu_to_main(f);
    }
};
static emu_barrier_t* emu_block_barrier;
static std::vector<std::unique_ptr<emu_barrier_t>> emu_warp_barriers;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __restrict__
using std::min; using std::max;
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline int __syncthreads_or(int p) {   // the block's OR of p, a barrier
    static int votes[1024];
    votes[threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)] = p;
    emu_block_barrier->arrive_and_wait();
    int any = 0;
    for (unsigned i = 0; i < blockDim.x * blockDim.y * blockDim.z; ++i) any |= votes[i] != 0;
    emu_block_barrier->arrive_and_wait();
    return any;
}
inline int emu_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
template <class V> V __shfl_xor_sync(unsigned, V v, int offset) {
    static V slots[1024];
    const int t = emu_tid(), w = t / 32;
    slots[t] = v;
    emu_warp_barriers[w]->arrive_and_wait();
    const V r = slots[(t & ~31) | ((t & 31) ^ offset)];
    emu_warp_barriers[w]->arrive_and_wait();
    return r;
}
typedef float T;
inline float to_f32(float x) { return x; }
template <typename U> inline U from_f32(float x);
template <> inline float from_f32<float>(float x) { return x; }
static const std::function<void()>* emu_kernel;
static void emu_fiber_main() {
    (*emu_kernel)();
    emu_fibers[emu_current].done = true;          // returns to emu_main (uc_link)
#if defined(__x86_64__)
    emu_to_main(emu_fibers[emu_current]);         // never resumed: the next block resets it
#endif
}
constexpr size_t emu_stack_bytes = 256 * 1024;
template <class F> void emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, F kernel) {
    gridDim = {gx, gy, gz};
    blockDim = {bx, by, bz};
    const unsigned n = bx * by * bz;
    const std::function<void()> fn = kernel;
    emu_kernel = &fn;
    emu_barrier_t bar(n);
    emu_block_barrier = &bar;
    emu_warp_barriers.clear();
    for (unsigned w = 0; w < (n + 31) / 32; ++w)
        emu_warp_barriers.emplace_back(new emu_barrier_t(std::min(32u, n - 32 * w)));
    static char* stacks = nullptr;
    static size_t stack_count = 0;
    if (stack_count < n) {
        std::free(stacks);
        stacks = static_cast<char*>(std::malloc(n * emu_stack_bytes));
        stack_count = n;
    }
    emu_fibers.assign(n, emu_fiber());
    for (unsigned z = 0; z < gz; ++z) for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
        blockIdx = {x, y, z};
        for (unsigned t = 0; t < n; ++t) {
            emu_fiber& f = emu_fibers[t];
            f = emu_fiber();
            f.idx = {t % bx, (t / bx) % by, t / (bx * by)};
#if defined(__x86_64__)
            // the stack emu_jump finds: its control words and registers, then the entry as
            // its return address (a call's alignment there), the entry's own never used
            void** sp = reinterpret_cast<void**>(stacks + (t + 1) * emu_stack_bytes);
            *--sp = nullptr;
            *--sp = reinterpret_cast<void*>(&emu_fiber_main);
            for (int r = 0; r < 6; ++r) *--sp = nullptr;
            --sp;
            asm volatile("stmxcsr %0\n  fnstcw %1" : "=m"(*reinterpret_cast<unsigned*>(sp)),
                         "=m"(*(reinterpret_cast<unsigned short*>(sp) + 2)));
            f.sp = sp;
#else
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = stacks + t * emu_stack_bytes;
            f.ctx.uc_stack.ss_size = emu_stack_bytes;
            f.ctx.uc_link = &emu_main;
            makecontext(&f.ctx, emu_fiber_main, 0);
#endif
        }
        // sweeps alternate direction, so a thread reading a neighbour's slot before a
        // barrier finds it unwritten in one of them whichever side the neighbour is on
        unsigned live = n;
        for (bool forward = true; live; forward = !forward) {
            bool ran = false;
            for (unsigned i = 0; i < n; ++i) {
                const int t = forward ? i : n - 1 - i;
                emu_fiber& f = emu_fibers[t];
                if (f.done || (f.waits && f.waits->phase == f.phase)) continue;
                f.waits = nullptr;
                emu_current = t;
                threadIdx = f.idx;
                emu_to_fiber(f);
                ran = true;
                live -= f.done;
            }
            if (!ran) {
                std::fprintf(stderr, "cuda_emu: deadlock in block (%u, %u, %u): %u of %u threads "
                             "wait at a barrier that the others never reach\n", x, y, z, live, n);
                std::fflush(stderr);
                std::abort();
            }
        }
    }
}
#line 1 "kernel.cu"
"""

PTX = '#line 1 "ptx_emu.h"\n' + (Path(__file__).with_name("ptx_emu.h")).read_text()

# After PTX, for the fp16 attention kernels (split-KV, flash2): ``__launch_bounds__``
# dropped, ``__any_sync`` over the calling thread's warp, ``T`` as ``__half``.
VOTE_HALF = r"""
#undef __launch_bounds__
#define __launch_bounds__(...)
static int emu_votes[1024];
inline bool __any_sync(unsigned, bool p) {
    const int t = emu_tid(), base = t & ~31;
    emu_votes[t] = p;
    emu_warp_sync();
    bool any = false;
    for (int i = 0; i < 32 && base + i < (int)(blockDim.x * blockDim.y * blockDim.z); ++i)
        any = any || emu_votes[base + i];
    emu_warp_sync();
    return any;
}
#define T __half
"""

_INCLUDE = '#include "adaptive_ptx.cuh"'
_INCLUDE_WGMMA = '#include "adaptive_wgmma.cuh"'
_SMEM = "extern __shared__ __align__(16) unsigned char smem_raw[];"


def kernel_source(path: Path) -> str:
    """A variant's .cu text for g++ after HEADER + PTX: its includes of adaptive_ptx.cuh
    and adaptive_wgmma.cuh dropped (PTX emulates both), the other shipped headers it
    includes put in place as the library does (:func:`adaptive.headers.expand`), its
    dynamic shared memory on ``emu_smem``."""
    src = Path(path).read_text()
    for text, what in ((_INCLUDE, "include of adaptive_ptx.cuh"),
                       (_SMEM, "dynamic shared memory declaration")):
        if src.count(text) != 1:
            raise ValueError(f"{path.name}: expected one {what} ({text!r}), found "
                             f"{src.count(text)}")
    src = src.replace(_INCLUDE, "// adaptive_ptx.cuh: emulated by ptx_emu.h")
    if src.count(_INCLUDE_WGMMA) > 1:
        raise ValueError(f"{path.name}: includes adaptive_wgmma.cuh more than once")
    src = src.replace(_INCLUDE_WGMMA, "// adaptive_wgmma.cuh: emulated by ptx_emu.h")
    src = headers.expand(src, path.name)
    return f'#line 1 "{path.name}"\n' + src.replace(_SMEM, "unsigned char* smem_raw = emu_smem;")


_C_TYPES = {"ptr": ("void*", ctypes.c_void_p), "i32": ("int", ctypes.c_int),
            "i64": ("long long", ctypes.c_longlong), "f32": ("float", ctypes.c_float)}


ARENA_BYTES = 240 * 1024   # ptx_emu.h's emu_smem: a kernel's dynamic shared memory


def launch_geometry(variant, scope) -> tuple[list[int], int, object]:
    """``variant``'s manifest launch at ``scope`` (an input's scope with the config and the
    device limits): (grid, block, ev), ``ev`` evaluating its other expressions (a
    workspace); its shared memory checked to fit the emulator's arena."""
    from adaptive.expr import compile_expr

    def ev(expr) -> int:
        return int(compile_expr(str(expr))(scope))
    grid = [ev(e) for e in variant.launch["grid"]]
    (block,) = [ev(e) for e in variant.launch["block"]]
    shared = ev(variant.launch.get("shared_bytes", 0))
    assert shared <= ARENA_BYTES, f"{variant.name}: {shared} bytes of shared memory"
    return grid, block, ev


def attention_mask_args(problem, scope, mask) -> list:
    """An attention kernel's mask arguments as the CUDA backend binds them (cuda_args'
    providers): the mask's address (None without one), mask_sb, mask_sh, mask_bool."""
    from adaptive.backends.cuda_args import PROVIDERS
    return [None if mask is None else mask.ctypes.data] + [
        int(PROVIDERS["attention"][name].plan(problem, scope))
        for name in ("mask_sb", "mask_sh", "mask_bool")]


def attention_padding_mask(rng, b, h, lq, lk, kind, layout, hide_row: bool) -> np.ndarray:
    """A left-padding mask [B or 1, 1 or H, Lq, Lk] as transformers builds one (random pad
    lengths up to a quarter of Lk plus a few, each row seeing keys from its pad on), of
    ``kind`` (bool; add: 0 / -inf in fp16; min: 0 / finfo(fp16).min), ``layout`` (per batch
    entry, per head); with ``hide_row``, query row 0 of the last mask row set sees nothing."""
    from adaptive.ops.attention import padding_mask
    shape = (b if layout[0] else 1, h if layout[1] else 1, lq, lk)
    seen = padding_mask(rng, shape, lk // 4 + 3)
    if hide_row:
        seen[-1, :, 0, :] = False
    if kind == "bool":
        return seen
    hidden = -np.inf if kind == "add" else np.finfo(np.float16).min
    return np.where(seen, 0.0, hidden).astype(np.float16)


def available() -> bool:
    """True when g++ is on PATH."""
    return shutil.which("g++") is not None


def _wrapper(name: str, params: list[str], casts: list[str]) -> str:
    decl = ", ".join(f"{_C_TYPES[p][0]} a{i}" for i, p in enumerate(params))
    call = ", ".join(f"({c})a{i}" if p == "ptr" else f"a{i}"
                     for i, (p, c) in enumerate(zip(params, casts)))
    return (f'extern "C" void emu_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, '
            f"unsigned by, unsigned bz{', ' if decl else ''}{decl}) {{\n"
            f"    emu_launch(gx, gy, gz, bx, by, bz, [=] {{ {name}({call}); }});\n}}\n")


def _f16c() -> list[str]:
    """``-mf16c`` where the CPU converts fp16 itself (x86-64 since 2012): _Float16 <-> float
    in one instruction, not a libgcc call (an emulated fp16 kernel runs about 4x faster).
    Both round to nearest even: the results are bit for bit the same."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return []
    return ["-mf16c"] if "f16c" in flags else []


GXX = ["g++", "-std=c++20", "-O1", *_f16c(), "-shared", "-fPIC", "-pthread", "-w"]

# The system headers HEADER opens with, precompiled once a session and shared by its
# processes (the background builds inherit the folder through the environment): every
# emulated library's text starts with them, and parsing them was over half of each g++ run.
# The text after them is compiled as before (their own #include lines find the guards set),
# so a library is byte for byte the same; g++ ignores a header it cannot use and parses.
_PCH_DIR = os.environ.get("CUDA_EMU_PCH_DIR")
if _PCH_DIR is None:
    _PCH_DIR = os.environ["CUDA_EMU_PCH_DIR"] = tempfile.mkdtemp(prefix="cuda-emu-pch-")
    atexit.register(shutil.rmtree, _PCH_DIR, True)


def pch_flags(build: bool = True) -> list[str]:
    """``-include`` of the precompiled HEADER includes for a g++ run of :data:`GXX`, built
    by the first caller of the session that may (``build``: the background builds, under a
    lock); [] where it is not there (yet) or g++ could not build it. A test's own build in
    the session's process passes ``build=False``: it never waits for a build at nice 19."""
    text = "".join(line + "\n" for line in HEADER.splitlines() if line.startswith("#include"))
    flags = [f for f in GXX if f != "-shared"]
    tag = hashlib.sha256(repr((flags, text)).encode()).hexdigest()[:16]
    header = Path(_PCH_DIR) / f"emu_{tag}.h"
    gch = header.with_name(header.name + ".gch")
    if gch.exists() or not build:
        return ["-include", str(header)] if gch.exists() else []
    with open(header.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not gch.exists():
            header.write_text(text)
            tmp = gch.with_suffix(".tmp")
            proc = subprocess.run([*flags, "-x", "c++-header", "-o", str(tmp), str(header)],
                                  capture_output=True, timeout=300)
            if proc.returncode != 0:
                return []
            tmp.rename(gch)
    return ["-include", str(header)]


def compile_all(jobs: Mapping[Path, tuple[str, list[str]]], timeout_s: float = 300) -> None:
    """Compile each ``lib: (source text, extra g++ flags)`` into the shared library ``lib``,
    the g++ processes side by side; raise naming the first that failed, with the end of its
    errors."""
    procs, pch = {}, pch_flags()
    for lib, (text, flags) in jobs.items():
        src = lib.with_suffix(".cpp")
        src.write_text(text)
        procs[lib] = subprocess.Popen([*GXX, *pch, *flags, "-o", str(lib), str(src)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
    failed = []
    for lib, proc in procs.items():
        out, _ = proc.communicate(timeout=timeout_s)
        if proc.returncode != 0:
            failed.append(f"g++ failed on {lib.with_suffix('.cpp')}:\n{out[-4000:]}")
    if failed:
        raise RuntimeError(failed[0])


# compile a test module's ``emu_jobs(folder)`` (what compile_all takes), in a fresh process
_BUILD = ("import importlib, sys; from pathlib import Path; sys.path[:0] = sys.argv[1:3]; "
          "import cuda_emu; cuda_emu.compile_all(importlib.import_module(sys.argv[3])"
          ".emu_jobs(Path(sys.argv[4])))")


def built(background, test_file: str, emu_jobs) -> list[Path]:
    """The libraries of a test module's ``emu_jobs``, as :func:`background_build`'s job
    built them (in the order ``emu_jobs(folder)`` lists them); the test is skipped where
    g++ is not installed. ``background``: the session's fixture of that name."""
    import pytest
    if not available():
        pytest.skip("g++ is not installed: cannot emulate the CUDA kernels")
    done = background(f"emu-{Path(test_file).stem}")
    assert done.rc == 0, done.report()
    return list(emu_jobs(done.folder))


def background_build(test_file: str, cpu_s: float) -> dict:
    """The ``BACKGROUND`` entry of a test module whose ``emu_jobs(folder)`` gives the
    libraries to compile: g++ runs from the start of the session at nice 19; the module's
    fixture reads ``background("emu-<module>")`` and finds ``emu_jobs(its folder)`` built."""
    from background import Job
    if not available():
        return {}
    here = Path(test_file).resolve()
    name = here.stem

    def args(folder: Path, config) -> list[str]:
        return ["-c", _BUILD, str(here.parent), str(here.parents[1]), name, str(folder)]
    return {f"emu-{name}": Job(args, cpu_s=cpu_s, nice=19, timeout_s=600)}


def build(source: str, kernels: Mapping[str, list], workdir: Path) -> dict:
    """Compile ``source`` with entry points for ``kernels``: name -> parameter list, each
    "ptr", "i32", "i64", "f32" or ("ptr", "const T*") for a pointer's C type (default
    ``T*``). Returns name -> ``fn(grid, block, args)`` over NumPy arrays and scalars."""
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / "emu.cpp"
    lib = workdir / "emu.so"
    src.write_text(build_source(source, kernels))
    proc = subprocess.run([*GXX, *pch_flags(build=False), "-o", str(lib), str(src)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"g++ failed on the emulated kernels:\n{proc.stderr[-4000:]}")
    return load(lib, kernels)


def build_source(source: str, kernels: Mapping[str, list]) -> str:
    """The text :func:`build` compiles (for a background build: ``emu_jobs`` of a test
    module, then :func:`load` of the library)."""
    wrappers = [_wrapper(name, _kinds(params), [p[1] if isinstance(p, tuple) else "T*"
                                               for p in params])
                for name, params in kernels.items()]
    return HEADER + source + "\n" + "".join(wrappers)


def load(lib: Path, kernels: Mapping[str, list]) -> dict:
    """The entry points of a library compiled from :func:`build_source`: name ->
    ``fn(grid, block, args)``, as :func:`build` returns them."""
    dll = ctypes.CDLL(str(lib))
    out = {}
    for name, params in kernels.items():
        kinds = _kinds(params)
        fn = getattr(dll, f"emu_{name}")
        fn.argtypes = [ctypes.c_uint] * 6 + [_C_TYPES[k][1] for k in kinds]
        fn.restype = None
        out[name] = _launcher(fn, kinds, name)
    return out


def _kinds(params: list) -> list[str]:
    return [p[0] if isinstance(p, tuple) else p for p in params]


def _launcher(fn, kinds: list[str], name: str):
    def launch(grid, block, args):
        if len(args) != len(kinds):
            raise TypeError(f"{name}: {len(args)} arguments, expected {len(kinds)}")
        grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
        values = []
        for kind, a in zip(kinds, args):
            if kind == "ptr":
                if isinstance(a, np.ndarray):
                    if a.dtype != np.float32 or not a.flags.c_contiguous:
                        raise TypeError(f"{name}: emulated kernels take contiguous float32 "
                                        f"arrays, got {a.dtype}")
                    values.append(a.ctypes.data)
                elif isinstance(a, np.integer) and int(a) == 0:
                    values.append(None)
                else:
                    raise TypeError(f"{name}: expected an array or a null pointer, got {a!r}")
            else:
                values.append(a.item() if isinstance(a, np.generic) else a)
        fn(*grid, *block, *values)
    return launch
