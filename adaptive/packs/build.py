"""Building a pack: measure every candidate on a sample of inputs on this machine.

Inputs come from a shape list (a preset or a JSON/TOML file), one :class:`Case` each.
Every case gets fresh random inputs from ``Op.make_inputs``; every candidate that fits
is checked against the float64 reference (when cheap), warmed up, then timed several
times (median and spread). One worker per GPU (one on the host backend) pulls cases;
each finished case is appended to a journal (``OUT.partial``), so an interrupted build
resumes where it stopped. The pack is written atomically at the end.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import sys
import time
import tomllib
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import msgpack

from adaptive import arrays
from adaptive.errors import PackError
from adaptive.observation import Measurement, Observation, floor_ms
from adaptive.packs.presets import PRESETS
from adaptive.peaks import raise_to_observed
from adaptive.progress import EVERY_S, doing

log = logging.getLogger("adaptive")
JOURNAL_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Case:
    """One input class to measure: op, dims, dtype, op params and generator statistics."""

    op: str
    dims: tuple[tuple[str, int], ...]
    dtype: str = "float32"
    params: tuple[tuple[str, object], ...] = ()
    stats: tuple[tuple[str, object], ...] = ()

    @property
    def id(self) -> str:
        parts = [self.op, ",".join(f"{k}={v}" for k, v in self.dims), self.dtype]
        parts += [",".join(f"{k}={v}" for k, v in t) for t in (self.params, self.stats) if t]
        return " ".join(parts)

    @classmethod
    def from_dict(cls, op: str, d: Mapping) -> Case:
        from adaptive.ops import get_op
        get_op(op)
        unknown = set(d) - {"dims", "dtype", "params", "stats"}
        if unknown or not isinstance(d.get("dims"), Mapping):
            raise ValueError(f"shape entry for {op} {dict(d)}: expected keys dims (a table of "
                             f"ints), dtype, params, stats; got {sorted(d)}")
        return cls(op, tuple(d["dims"].items()), d.get("dtype", "float32"),
                   tuple(sorted(d.get("params", {}).items())),
                   tuple(sorted(d.get("stats", {}).items())))


@dataclasses.dataclass(frozen=True)
class Settings:
    """How each candidate is measured."""

    warmup: int = 2
    repeats: int = 7
    budget_ms: float = 250.0          # fewer repeats (at least 3) for slow candidates
    check_max_flops: float = 2e9      # compare with the float64 reference below this
    check_max_bytes: float = 32e6     # and below this much memory traffic (copies, float64)
    seed: int = 0
    cubins: bool = False              # carry compiled kernels (cuda) ...
    cubin_within: float = 1.5         # ... of the candidates within this factor of the best
    # only these variants measured (names; empty: every one): a variant added since a
    # pack was built, measured on its inputs and merged into it (``adaptive pack merge``)
    variants: tuple[str, ...] = ()


def load_shapes(spec: str, ops: Iterable[str] | None = None) -> list[Case]:
    """Cases from a preset name or a ``.json`` / ``.toml`` file ``{op: [{dims: {...}}]}``."""
    if spec in PRESETS:
        table = PRESETS[spec]
    else:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"--shapes {spec!r}: neither a preset ({', '.join(PRESETS)}) nor "
                             "a file")
        text = path.read_text()
        table = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    ops = list(ops) if ops else list(table)
    missing = [op for op in ops if op not in table]
    if missing:
        raise ValueError(f"shapes {spec!r} have no entries for {', '.join(missing)}; they "
                         f"cover {', '.join(table)}")
    return [Case.from_dict(op, d) for op in ops for d in table[op]]


# ---- measuring one case (runs in a worker) -----------------------------------------------------

def measure_case(dispatcher, case: Case, settings: Settings) -> dict:
    """Rows and failures of every candidate on fresh inputs for ``case``."""
    from adaptive.ops import get_op
    op, backend = get_op(case.op), dispatcher.backend
    rng = _rng(settings.seed, case.id)
    inputs = op.make_inputs(dict(case.dims), case.dtype, rng, **dict(case.stats))
    params = dict(case.params)
    caller = _on_device(inputs, case.dtype, backend.name)
    problem = op.problem(caller, params)
    adapter = backend.adapter(problem.kind) or (_same, _same)
    native = tuple(a if hasattr(type(a), "signature") else adapter[0](a) for a in caller)
    flops, nbytes = op.roofline(problem)
    cheap = flops <= settings.check_max_flops and nbytes <= settings.check_max_bytes
    ref = op.reference(*inputs, **params) if cheap else None
    floor = floor_ms(flops, nbytes, backend.peaks(), problem.dtype)
    features = op.features(problem)
    state = backend.device_state   # clocks, utilisation (as live rows)
    rows, failures, cubins, timed = [], [], [], []
    for cand in _candidates(dispatcher, op, problem, settings.variants):
        base = {"op": case.op, "dims": problem.dims_dict, "dtype": problem.dtype,
                "variant": cand.variant.name, "config": cand.config}
        try:
            # the plan's own arrays: tensors stay tensors for torch callers (see Backend.io)
            io = backend.io(cand, problem, op.out_shape(problem), caller[-1])
            if io.adapter is None:
                args, to_caller = caller, _same
            else:
                args, to_caller = native, (lambda out: adapter[1](out, caller[-1]))
            m = _measure(backend, op, problem, cand, args, ref, settings, to_caller, io.alloc)
        except Exception as exc:  # noqa: BLE001 (a failing candidate is data)
            failures.append(base | {"reason": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        rows.append(Observation(**base, time_ms=m.median_ms, floor_ms=floor, features=features,
                                samples=len(m.samples_ms), spread_ms=m.spread_ms,
                                device=dict(state()) if state else {},
                                timestamp_s=time.time(), source="pack").to_dict())
        if cand.variant.language == "cuda":
            timed.append((m.median_ms, cand))
    best_ms = min((r["time_ms"] for r in rows), default=math.inf)
    if raise_to_observed(backend, flops, nbytes, best_ms, problem.dtype):   # floor <= times
        floor = floor_ms(flops, nbytes, backend.peaks(), problem.dtype)
        for r in rows:
            r["floor_ms"] = floor
    if settings.cubins and timed:
        best_ms = min(t for t, _ in timed)
        for t, cand in timed:
            if t <= best_ms * settings.cubin_within:
                cubins += _cubin(backend.arch, cand, problem.dtype)
    return {"case": case.id, "rows": rows, "failures": failures, "cubins": cubins}


def _measure(backend, op, problem, cand, args, ref, settings: Settings,
             to_caller, alloc) -> Measurement:
    fn = backend.prepare(cand, problem, op)
    out = alloc()
    first = backend.time_ms(fn, args, out, 1)[0]
    if ref is not None:
        err = op.error(_host_float(to_caller(out)), ref)
        tol = op.tolerance.get(problem.dtype, 1e-2)
        if not err <= tol:
            raise ValueError(f"wrong result: relative error {err:.3g} > tolerance {tol:g}")
    if settings.warmup > 1:
        backend.time_ms(fn, args, out, settings.warmup - 1)
    repeats = settings.repeats
    if first > 0 and first * repeats > settings.budget_ms:
        repeats = max(3, int(settings.budget_ms / first))
    return Measurement(tuple(backend.time_ms(fn, args, out, repeats)), settings.warmup)


def _same(x, like=None):
    return x


def _on_device(inputs: tuple, dtype: str, backend: str) -> tuple:
    """Inputs where the backend's variants read them without a copy: NumPy on the host,
    CuPy on the GPU (bfloat16 as PyTorch tensors: CuPy has no bfloat16)."""
    if backend == "host":
        return inputs
    return arrays.to_cuda_bfloat16(inputs) if dtype == "bfloat16" else arrays.to_cuda(inputs)


def _host_float(x):
    """A float32/64 NumPy copy of a result in any array type (bfloat16 tensors included)."""
    if type(x).__module__.split(".")[0] == "torch":
        return x.float().cpu().numpy()
    return arrays.to_numpy(x)


def _cubin(arch: str, cand, dtype: str) -> list[dict]:
    from adaptive import nvrtc
    try:
        k = nvrtc.compile_candidate(cand.variant, cand.config, dtype, arch)
        return [{"key": k.key, "variant": cand.variant.id, "config": cand.config,
                 "arch": arch, "image": k.path.read_bytes(),
                 "resources": dict(k.resources)}]
    except Exception as exc:  # noqa: BLE001 (a pack without this cubin still works)
        log.warning("no cubin for %s: %s", cand.label, exc)
        return []


def refresh_cubins(pack, variants: Iterable[str] = (), within: float | None = None,
                   progress: Callable[[int, int], None] | None = None):
    """``pack`` with the cubins a build would carry (each input's CUDA candidates within
    ``within`` of its best row, :attr:`Settings.cubin_within` by default) compiled here
    for the variants ``variants`` ("op/name"; all CUDA variants of the pack when empty),
    from the pack's own records of them: for a pack whose cubins were dropped (``adopt``
    after a source edit that left the compiled code as measured) or never built. Rows are
    untouched; cubins already carried are kept. This machine's NVRTC must be the one that
    built the pack: the key of a cubin covers the compiler, and a process on the pack's
    device looks its kernels up by its own (raises :class:`PackError` naming both)."""
    from adaptive import nvrtc
    from adaptive.packs import format as packs
    from adaptive.policy.cost_model import input_key
    from adaptive.variants import make_candidate
    fp = pack.fingerprint
    if fp.get("backend") != "cuda" or "cc" not in fp:
        raise PackError("<cubins>", f"the pack was built on {fp.get('backend')!r}, not a "
                        "CUDA device: it has no kernels to compile")
    if not nvrtc.available():
        raise PackError("<cubins>", "NVRTC is not available here (cuda-python's nvrtc)")
    here = nvrtc.compiler_version()
    if fp.get("nvrtc") != here:
        raise PackError("<cubins>", f"the pack was built with {fp.get('nvrtc')}, this "
                        f"machine has {here}: cubins compiled here would never be looked "
                        "up on the pack's device; run this on a machine of the pack's kind")
    records = {v.id: v for v in pack.variants if v.language == "cuda"}
    wanted = set(variants) or set(records)
    unknown = sorted(wanted - set(records))
    if unknown:
        raise ValueError(f"cubins: {', '.join(unknown)} not CUDA variants of the pack; it "
                         f"has {', '.join(sorted(records))}")
    within = Settings.cubin_within if within is None else within
    arch = f"sm_{fp['cc']}"
    groups: dict = {}
    for r in pack.rows:
        if f"{r.op}/{r.variant}" in records:
            groups.setdefault(input_key(r.op, r.features, r.dtype), []).append(r)
    jobs = {}
    for rows in groups.values():
        best = min(r.time_ms for r in rows)
        for r in rows:
            vid = f"{r.op}/{r.variant}"
            if vid in wanted and r.time_ms <= best * within:
                jobs.setdefault((vid, tuple(sorted(r.config.items())), r.dtype), r)
    have = {c.key for c in pack.cubins}
    added = {}
    for i, ((vid, _, dtype), row) in enumerate(jobs.items()):
        cand = make_candidate(records[vid], dict(row.config))
        for c in _cubin(arch, cand, dtype):
            if c["key"] not in have:
                added[c["key"]] = packs.Cubin(**c)
        if progress is not None:
            progress(i + 1, len(jobs))
    build = dict(pack.header.get("build", {}))
    build["cubins_refreshed"] = list(build.get("cubins_refreshed", [])) + [
        {"variants": sorted(wanted), "compiler": here, "added": len(added)}]
    return packs.new_pack(pack.variants, pack.rows, fp, (*pack.cubins, *added.values()),
                          pack.failures, build, created_s=pack.header.get("created_s"))


def _rng(seed: int, case_id: str):
    import numpy as np
    return np.random.default_rng([seed, zlib.crc32(case_id.encode())])


def make_dispatcher(backend: str, device: int | None = None):
    """A dispatcher on a fresh default registry (no startup packs: measure only our own).
    It only lists and runs candidates, so its policy is the cheapest (no scikit-learn to
    import in every worker)."""
    from adaptive.dispatch import Dispatcher
    from adaptive.variants import default_registry
    return Dispatcher(backend, device=device, policy="first", registry=default_registry())


# ---- the journal --------------------------------------------------------------------------------

class Journal:
    """Append-only msgpack stream beside the output: a plan record, then one per case."""

    def __init__(self, path: Path, plan: Mapping):
        self.path, self.plan = path, dict(plan)
        self.done: dict[str, dict] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        records, good = [], 0
        if path.exists():
            with open(path, "rb") as f:
                unpacker = msgpack.Unpacker(f, raw=False)
                try:
                    for record in unpacker:
                        records.append(record)
                        good = unpacker.tell()
                except (ValueError, msgpack.UnpackException):
                    pass   # a torn last record: keep what came before it
        if records and (not isinstance(records[0], dict) or records[0].get("plan") != self.plan):
            raise PackError(str(path), "this journal belongs to another build (other ops, "
                            "shapes, settings or device); delete it or pass --fresh")
        for record in records[1:]:
            if isinstance(record, dict) and isinstance(record.get("case"), str):
                self.done[record["case"]] = record
        if good == 0:
            self.done.clear()
            self._append_raw({"journal": JOURNAL_VERSION, "plan": self.plan}, truncate=0)
        elif good < path.stat().st_size:
            os.truncate(path, good)

    def _append_raw(self, record: Mapping, truncate: int | None = None) -> None:
        mode = "wb" if truncate == 0 else "ab"
        with open(self.path, mode) as f:
            f.write(msgpack.packb(record, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())

    def add(self, result: Mapping) -> None:
        self._append_raw(result)
        self.done[result["case"]] = dict(result)


def plan_of(cases: list[Case], backend: str, fingerprint: Mapping, settings: Settings) -> dict:
    from adaptive.packs.format import describe_device
    h = hashlib.sha256(json.dumps([c.id for c in cases]).encode()).hexdigest()
    plain = dataclasses.asdict(settings) | {"variants": list(settings.variants)}  # as read back
    return {"cases_sha256": h, "backend": backend, "device": describe_device(fingerprint),
            "settings": plain}


# ---- progress -----------------------------------------------------------------------------------

class Progress:
    """A small progress bar on stderr (when stderr is not a terminal: a line per 10 %, or
    sooner when the last line is ``every_s`` old)."""

    def __init__(self, total: int, done: int = 0, stream=None, every_s: float = EVERY_S):
        self.total, self.done, self.stream = total, done, stream or sys.stderr
        self.t0, self.tty, self._last = time.monotonic(), self.stream.isatty(), -1
        self.every_s, self._last_s = every_s, self.t0

    def update(self, label: str) -> None:
        self.done += 1
        frac = self.done / max(self.total, 1)
        now = time.monotonic()
        if (not self.tty and int(frac * 10) == self._last and self.done < self.total
                and now - self._last_s < self.every_s):
            return
        self._last, self._last_s = int(frac * 10), now
        bar = "#" * int(frac * 30)
        elapsed = time.monotonic() - self.t0
        end = "\r" if self.tty and self.done < self.total else "\n"
        self.stream.write(f"[{bar:<30}] {self.done}/{self.total} {elapsed:5.0f}s {label[:60]}"
                          f"{' ' * 10}{end}")
        self.stream.flush()


def count_gpus() -> int:
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001
        return 0


def _candidates(dispatcher, op, problem, names: Sequence[str]) -> list:
    """The candidates a case measures: every one listed for its input, or those of the
    variants ``names`` (an experimental one included: a build measures it where named)."""
    if not names:
        return dispatcher._candidates(op, problem)
    from adaptive.errors import NoCandidateError
    pool = [v for v in dispatcher.registry.variants(op.name, dispatcher.backend.name,
                                                    experimental=True) if v.name in names]
    try:
        return dispatcher._candidates(op, problem, pool) if pool else []
    except NoCandidateError:   # the named variants serve none of this input
        return []


def precompile(backend_name: str, arch: str, cases: Iterable[Case],
               variants: Iterable[str] = ()) -> list[str]:
    """Fill the kernel cache with every CUDA candidate of the cases' ops and dtypes (of
    ``variants`` only, where given), on all cores (NVRTC needs no GPU); return the compile
    errors (those candidates fail later)."""
    from adaptive import config, nvrtc
    from adaptive.variants import default_registry
    if backend_name != "cuda" or not nvrtc.available():
        return []
    wanted = {(c.op, c.dtype) for c in cases}
    names = set(variants)
    cache_dir = config.get().cache_dir
    jobs = [(v.op, v.name, cfg, dtype, arch, cache_dir)
            for op in sorted({op for op, _ in wanted})
            for v, cfg, dtype in nvrtc.cuda_jobs(default_registry(), op)
            if (op, dtype) in wanted and (not names or v.name in names)]
    if not jobs:
        return []
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    workers = max(1, min(len(jobs), (os.cpu_count() or 2) - 1))
    t0 = time.monotonic()
    # fork is safe here although the parent holds a CUDA context: children only run NVRTC,
    # which never touches the driver (as in ``adaptive nvrtc-check``)
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    try:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context(method)) as pool:
            errors = [e for e in pool.map(_compile_job, jobs, chunksize=4) if e]
    except Exception as exc:  # noqa: BLE001 (kernels then compile when first measured)
        log.warning("precompiling failed (%s); kernels compile as they are measured", exc)
        return []
    log.info("precompiled %d kernels in %.1f s (%d failed)", len(jobs), time.monotonic() - t0,
             len(errors))
    return errors


@functools.lru_cache(maxsize=1)
def _registry():
    from adaptive.variants import default_registry
    return default_registry()


def _compile_job(job) -> str | None:
    op, name, cfg, dtype, arch, cache_dir = job
    from adaptive import nvrtc
    from adaptive.kcache import KernelCache
    try:
        nvrtc.compile_candidate(_registry().get(op, name), cfg, dtype, arch,
                                KernelCache(cache_dir))
        return None
    except Exception as exc:  # noqa: BLE001 (a compile error is data: the candidate fails)
        return f"{op}/{name} {cfg} {dtype}: {str(exc)[:300]}"


# ---- the build ----------------------------------------------------------------------------------

def run_case(dispatcher, case: Case, settings: Settings) -> dict:
    """:func:`measure_case`, with a case that cannot run at all recorded as a failure."""
    try:
        return measure_case(dispatcher, case, settings)
    except Exception as exc:  # noqa: BLE001 (failures are data)
        reason = f"{type(exc).__name__}: {exc}"[:500]
        return {"case": case.id, "rows": [], "cubins": [],
                "failures": [{"op": case.op, "dims": dict(case.dims), "dtype": case.dtype,
                              "variant": "", "config": {}, "reason": reason}]}


def build_pack(cases: list[Case], out: str | os.PathLike, backend: str = "auto",
               workers: int | None = None, settings: Settings = Settings(),
               fresh: bool = False, progress: bool = True, deadline_s: float | None = None,
               on_case: Callable[[dict], None] | None = None, info: Mapping | None = None):
    """Measure ``cases`` on this machine and write the pack to ``out``; return the Pack.

    Resumes from ``out.partial`` when it exists (same cases, settings and device). With
    ``deadline_s``, cases not started by then are left out (the header says how many) and
    the journal is kept, so the same call later measures the rest.
    """
    from adaptive.packs import format as packs
    from adaptive.backends import resolve_name
    backend = resolve_name(backend)
    if workers is None:
        workers = max(1, count_gpus()) if backend == "cuda" else 1
    d = make_dispatcher(backend, 0 if backend == "cuda" else None)
    if settings.variants:
        known = {v.name for op in {c.op for c in cases}
                 for v in d.registry.variants(op, backend, experimental=True)}
        unknown = sorted(set(settings.variants) - known)
        if unknown:
            raise ValueError(f"variants {', '.join(unknown)}: not {backend} variants of "
                             f"{', '.join(sorted({c.op for c in cases}))}; known: "
                             f"{', '.join(sorted(known))}")
    fp = d.backend.fingerprint()
    out = Path(out)
    journal_path = out.with_name(out.name + ".partial")
    if fresh and journal_path.exists():
        journal_path.unlink()
    journal = Journal(journal_path, plan_of(cases, backend, fp, settings))
    todo = [c for c in cases if c.id not in journal.done]
    resumed = len(cases) - len(todo)
    bar = Progress(len(cases), resumed) if progress else None
    t0 = time.monotonic()
    if todo:
        doing(f"compiling the CUDA kernels of {len(todo)} cases")
        precompile(backend, d.backend.arch, todo, settings.variants)

    def record(result: dict) -> None:
        journal.add(result)
        if bar:
            bar.update(result["case"])
        if on_case:
            on_case(result)

    def in_time() -> bool:
        return deadline_s is None or time.monotonic() - t0 < deadline_s

    if workers <= 1 or len(todo) <= 1:
        for i, c in enumerate(todo):
            if not in_time():
                break
            doing(f"measuring case {resumed + i + 1}/{len(cases)}: {c.id}")
            record(run_case(d, c, settings))
    else:
        doing(f"measuring {len(todo)} cases on {workers} workers")
        _run_workers(backend, workers, todo, settings, record, in_time)
    done = [journal.done[c.id] for c in cases if c.id in journal.done]
    rows = [Observation.from_dict(r) for res in done for r in res["rows"]]
    used = {(r.op, r.variant) for r in rows}
    variants = [v for op in sorted({c.op for c in cases})
                for v in d.registry.variants(op, experimental=True)
                if (v.op, v.name) in used]
    cubins = {c["key"]: packs.Cubin(**c) for res in done for c in res.get("cubins", [])}
    failures = [f for res in done for f in res["failures"]]
    build = {"cases": len(cases), "cases_done": len(done), "cases_resumed": resumed,
             "time_s": round(time.monotonic() - t0, 3), "workers": workers,
             "settings": dataclasses.asdict(settings), **(info or {})}
    pack = packs.new_pack(variants, rows, fp, cubins.values(), failures, build)
    digest = packs.write_pack(pack, out)
    if len(done) == len(cases):   # else keep it: the same call resumes the rest
        journal_path.unlink()
    return dataclasses.replace(pack, sha256=digest)


def _worker(backend: str, device: int | None, settings: Settings, tasks, results) -> None:
    if device is not None:   # this process sees one GPU, as device 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(device + 1)]
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[device]
        device = 0
    d = make_dispatcher(backend, device)
    while True:
        case = tasks.get()
        if case is None:
            return
        results.put(run_case(d, case, settings))


def _run_workers(backend, workers, todo, settings, record, in_time) -> None:
    """One process per GPU (spawned: CUDA does not survive fork); cases from one queue."""
    import multiprocessing as mp
    import queue as queue_mod
    ctx = mp.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_worker, daemon=True, name=f"adaptive-pack-{i}",
                         args=(backend, i if backend == "cuda" else None, settings, tasks,
                               results)) for i in range(workers)]
    for p in procs:
        p.start()
    pending = list(todo)
    in_flight = 0
    try:
        while pending or in_flight:
            while pending and in_flight < workers and in_time():
                tasks.put(pending.pop(0))
                in_flight += 1
            if not in_flight:
                break
            try:
                result = results.get(timeout=2.0)
            except queue_mod.Empty:
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError("every pack worker died; run the build again to resume "
                                       "from the journal") from None
                continue
            in_flight -= 1
            record(result)
    finally:
        for _ in procs:
            tasks.put(None)
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
