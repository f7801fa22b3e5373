"""The verifier's isolated process: ``python -m adaptive.regen.worker JOBS.json RESULTS.jsonl``.

Runs each job (one candidate: variant dict + config + target dims) through compile,
correctness and timing, and appends ``{"start": i}`` before and ``{"index": i, "report":
{...}}`` after each to RESULTS, flushed, so the parent knows which candidate was running
when this process hung or died. Nothing here is trusted by the caller: the parent
reads only that file. After a CUDA error the context is unusable, so the process exits
and the parent starts a fresh one for the remaining jobs.
"""

from __future__ import annotations

import faulthandler
import itertools
import json
import math
import os
import statistics
import sys
import time
import traceback

import numpy as np

from adaptive import arrays
from adaptive.ops.base import excess
from adaptive.regen import shapes
from adaptive.regen.report import Check, Outcome, Stage, VerifyReport, rejected
from adaptive.timing import CudaEvents, measure_each

SENTINEL = 1536.0                # first poison: exact in float16/32, far from every output
NEAR_ZERO = 0.1                  # element-wise errors count where |ref| >= this x rms(ref)
ELEM_FACTOR = 20.0               # element-wise bound: this x the op's norm-wise tolerance
EXIT_CONTEXT_LOST = 3
GUARD_BYTES = 4096               # canary region before and after every output buffer
CANARY = -24576.0                # exact in float16, bfloat16 and float32; compared bit-wise


class Reject(Exception):
    def __init__(self, stage: Stage, detail: str, fatal: bool = False):
        super().__init__(detail)
        self.stage, self.detail, self.fatal = stage, detail, fatal


def _gpu() -> bool:
    from adaptive.backends import gpu_available
    return gpu_available()


def _compile(variant, config: dict, dtype: str, cache_dir: str | None) -> tuple[float, dict]:
    """Compile (NVRTC for cuda, Python's compiler for python); (compile_ms, resources)."""
    t0 = time.perf_counter()
    if variant.language == "python":
        try:
            compile(variant.source, f"<candidate {variant.name}>", "exec")
        except SyntaxError as exc:
            raise Reject(Stage.COMPILE, "".join(traceback.format_exception_only(exc))) from None
        return (time.perf_counter() - t0) * 1e3, {}
    from adaptive import nvrtc
    from adaptive.errors import CompileError
    from adaptive.kcache import KernelCache
    if not nvrtc.available():
        raise Reject(Stage.COMPILE, "NVRTC is not installed here (pip install "
                     "adaptive-dispatch[nvrtc]); cannot compile a cuda candidate")
    try:
        kernel = nvrtc.compile_candidate(variant, config, dtype,
                                         cache=KernelCache(cache_dir) if cache_dir else None)
    except CompileError as exc:
        raise Reject(Stage.COMPILE, exc.log or str(exc)) from None
    except ValueError as exc:
        raise Reject(Stage.COMPILE, str(exc)) from None
    return (time.perf_counter() - t0) * 1e3, dict(kernel.resources)


class Runner:
    """Runs one candidate on one backend, synchronising the whole device after each call."""

    def __init__(self, backend, op, candidate):
        self.backend, self.op, self.candidate = backend, op, candidate
        self.cuda = backend.name == "cuda"
        self._prepared: dict = {}

    def native(self, inputs: tuple) -> tuple:
        if not self.cuda:
            return inputs
        return arrays.to_cuda(inputs)

    def sync(self) -> None:
        if self.cuda:
            import cupy
            cupy.cuda.runtime.deviceSynchronize()

    def problem(self, native: tuple, params: dict):
        return self.op.problem(native, params)

    def prepared(self, problem):
        fn = self._prepared.get(problem)
        if fn is None:
            try:
                fn = self._prepared[problem] = self.backend.prepare(self.candidate, problem,
                                                                    self.op)
            except Exception as exc:  # noqa: BLE001 (a candidate's failure is data)
                raise Reject(Stage.LOAD, _exc_text(exc), fatal=self.cuda) from None
        return fn

    def call(self, problem, native: tuple, out, sync: bool = True) -> None:
        fn = self.prepared(problem)
        try:
            fn(native, out)
            if sync:
                self.sync()
        except Reject:
            raise
        except Exception as exc:  # noqa: BLE001
            raise Reject(Stage.RUN, _exc_text(exc), fatal=self.cuda) from None

    def empty(self, problem):
        return self.backend.empty(self.op.out_shape(problem), problem.dtype)


def _exc_text(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines[-12:])


def _elem_error(out: np.ndarray, ref: np.ndarray, floor: float = 0.0) -> float:
    """Largest |out - ref| / |ref| over elements whose reference is not near zero
    (|ref| >= NEAR_ZERO * rms(ref)), where relative error means nothing; |out - ref|
    counts beyond ``floor`` (:meth:`Op.error_floor`: the cost of rounding a subnormal)."""
    mag = np.abs(ref)
    if not mag.size:
        return 0.0
    rms = float(np.sqrt(np.mean(mag * mag)))
    keep = mag > NEAR_ZERO * rms
    if not np.any(keep):
        return 0.0
    return float(np.max(excess(out[keep], ref[keep], floor) / mag[keep]))


def _row_error(out: np.ndarray, ref: np.ndarray, floor: float = 0.0) -> tuple[float, int]:
    """(largest ||out_r - ref_r|| / ||ref_r|| over output rows (the last axis), that row).

    Rows are independent in every op (a softmax row, a gemm row, an attention query), and
    regimes scale rows over the whole exponent range, so a row 1e-30 the size of another
    must be right on its own; the norm-wise error over the whole output cannot see it.
    A row whose reference is exactly zero (an empty sparse row) must be exactly zero
    (``floor`` is below every nonzero value of the dtype)."""
    if not out.size:
        return 0.0, -1
    o = out.reshape(-1, out.shape[-1]) if out.ndim else out.reshape(1, 1)
    r = ref.reshape(o.shape)
    num = np.sqrt(np.sum(excess(o, r, floor) ** 2, axis=1))
    den = np.sqrt(np.sum(r * r, axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))
    worst = int(np.argmax(err))
    return float(err[worst]), worst


def _compare(op, dims, seed, dist, r1, r2, ref, tol, floor: float = 0.0) -> Check:
    """Judge two candidate runs (poisoned with SENTINEL, then NaN) against the reference.
    Element errors count beyond ``floor`` (:meth:`Op.error_floor` of the output dtype).

    Elements whose reference is NaN (softmax of a row that is -inf everywhere) have no
    defined result: any value is accepted there, and they are left out of every error."""
    label = f"dims {dims}, seed {seed}, {dist} values"
    undefined = np.isnan(ref)
    if np.any(undefined):
        r1, r2, ref = (np.where(undefined, 0.0, a) for a in (r1, r2, ref))
    finite_ref = np.isfinite(ref)
    # the poison survived where the answer is not (within the tolerance) the poison itself
    could_be = np.abs(ref - SENTINEL) <= ELEM_FACTOR * tol * SENTINEL
    unwritten = int(np.count_nonzero((r1 == SENTINEL) & ~could_be))
    if unwritten:
        raise Reject(Stage.UNWRITTEN, f"{unwritten} of {r1.size} output elements were never "
                     f"written (the poison value survived) at {label}")
    nan2 = int(np.count_nonzero(np.isnan(r2) & np.isfinite(r1)))
    if nan2:
        raise Reject(Stage.UNWRITTEN, f"{nan2} of {r2.size} output elements were not written on "
                     f"the second call with the same input (stale or cached result?) at {label}")
    bad = int(np.count_nonzero(~np.isfinite(r1) & finite_ref))
    if bad:
        raise Reject(Stage.NONFINITE, f"{bad} of {r1.size} output elements are NaN or Inf where "
                     f"the reference is finite at {label}")
    e1, e2 = op.error(r1, ref, floor), op.error(r2, ref, floor)
    elem = _elem_error(r1, ref, floor)
    problem = ""
    if e1 > tol:
        raise Reject(Stage.WRONG, f"relative error {e1:.3e} > tolerance {tol:.1e} at {label} "
                     f"(largest element-wise relative error {elem:.3e})")
    if elem > ELEM_FACTOR * tol:
        raise Reject(Stage.WRONG, f"element-wise relative error {elem:.3e} > "
                     f"{ELEM_FACTOR * tol:.1e} (norm-wise {e1:.3e} passed) at {label}: a few "
                     "elements are wrong")
    row, which = _row_error(r1, ref, floor)
    if row > ELEM_FACTOR * tol:
        raise Reject(Stage.WRONG, f"row-wise relative error {row:.3e} > {ELEM_FACTOR * tol:.1e} "
                     f"in output row {which} (flattened; norm-wise {e1:.3e} passed) at {label}: "
                     "a row is wrong on its own scale")
    if e2 > tol:
        raise Reject(Stage.WRONG, f"the second call on the same input is wrong (relative error "
                     f"{e2:.3e} > {tol:.1e}; the first was {e1:.3e}) at {label}: stale state?")
    if not np.array_equal(r1, r2, equal_nan=True):
        diff = float(np.max(np.abs(r1.astype(np.float64) - r2.astype(np.float64))))
        scale = float(np.linalg.norm(ref)) / math.sqrt(max(ref.size, 1)) or 1.0
        if diff > tol * scale * 10:
            raise Reject(Stage.RACE, f"two runs on the same input differ by up to {diff:.3e} "
                         f"(tolerance {tol:.1e}) at {label}: a race or uninitialised read")
        problem = f"non-deterministic bits (max difference {diff:.2e}, within tolerance)"
    return Check(dict(dims), seed, dist, e1, elem, True, problem)


def _inputs_unchanged(native: tuple, saved: tuple, label: str) -> None:
    for i, (now, before) in enumerate(zip(native, saved)):
        if before is None:
            continue
        if not np.array_equal(arrays.to_numpy(now), before, equal_nan=True):
            raise Reject(Stage.INPUT_MODIFIED, f"input #{i} was modified by the call at {label}; "
                         "a variant must treat its inputs as read-only")


class Guarded:
    """An output buffer with guard regions: the variant gets a view into a larger buffer,
    GUARD_BYTES before and after it filled with a canary; :meth:`check` says whether a write
    landed outside the output (one element past the end is enough)."""

    def __init__(self, runner: Runner, problem):
        shape = runner.op.out_shape(problem)
        n = math.prod(shape)
        self.big = runner.backend.empty((n + 2 * GUARD_BYTES // problem.itemsize,),
                                        problem.dtype)
        self.g = GUARD_BYTES // problem.itemsize
        self.n = n
        self.big.fill(CANARY)
        self.out = self.big[self.g:self.g + n].reshape(shape)
        self.before = self._guards()

    def _guards(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.array(arrays.to_numpy(self.big[:self.g]), copy=True),
                np.array(arrays.to_numpy(self.big[self.g + self.n:]), copy=True))

    def check(self, label: str) -> None:
        head, tail = self._guards()
        for name, now, was in (("before the start", head, self.before[0]),
                               ("past the end", tail, self.before[1])):
            changed = np.flatnonzero(now.view(np.uint8) != was.view(np.uint8))
            if changed.size:
                first = changed[0] // now.itemsize if name == "before the start" else None
                where = (f"from {self.g - first} elements before the output" if first is not None
                         else f"up to {changed[-1] // now.itemsize + 1} elements past its end")
                raise Reject(Stage.OUT_OF_BOUNDS, f"the call wrote {name} of the output "
                             f"({where}; {changed.size} bytes of the {GUARD_BYTES}-byte guard "
                             f"region changed) at {label}")


def _same_input_class(runner: Runner, problem, native: tuple, params: dict,
                      label: str) -> None:
    """Validate a regime's inputs as a dispatcher validates a call and check that the plan
    built for ``problem`` (from the shape's probe) serves them: the same key (shapes,
    dtypes, strides). A kernel reads raw pointers, so a Fortran-ordered array given to a
    plan of row-major ones is read transposed; that is the verifier's fault, not the
    candidate's, and is raised as such."""
    op = runner.op
    try:
        got = runner.problem(native, params)
    except Exception as exc:  # noqa: BLE001 (the regime drew inputs the op refuses)
        raise RuntimeError(f"the verifier drew inputs {op.name} refuses at {label}: {exc}; "
                           "a value regime must draw valid inputs") from None
    if got.dims != problem.dims or got.dtype != problem.dtype or got.kind != problem.kind:
        raise RuntimeError(f"the verifier drew inputs of another input class at {label}: "
                           f"{got.describe()} for a plan of {problem.describe()}")


def check_correctness(runner: Runner, variant, config, job) -> tuple[list, list]:
    """Every edge shape × value regime (seeds rotate through the op's regimes; small shapes
    see every regime); returns (checks, skipped shape labels)."""
    op, dtype, params = runner.op, job["dtype"], dict(job.get("params", {}))
    regimes = [r for r in op.regimes if not job.get("regimes") or r in job["regimes"]]
    checks, skipped = [], []
    edges = shapes.edge_shapes(op.name, job["dims"])
    for label, dims in edges:
        if job.get("small_only") and label == "target" and len(edges) > 1:
            continue
        probe = shapes.make_inputs(op, dims, dtype, 0, "normal", job.get("stats"))
        try:
            problem = runner.problem(runner.native(probe), params)
        except Exception as exc:  # noqa: BLE001 (an edge shape the op itself refuses)
            skipped.append(f"{label} {dims}: {exc}")
            continue
        if not variant.fits(problem.scope(), config):
            skipped.append(f"{label} {dims}: {variant.why_not(problem.scope(), config)}")
            continue
        tol = op.tolerance_for(dtype, dims)
        flops, _ = op.roofline(problem)
        elems = math.prod(op.out_shape(problem))
        n = shapes.seeds_for(flops, elems, job.get("seeds", 5))
        if n >= job.get("seeds", 5):
            n = max(n, len(regimes))            # a small shape sees every regime
        for i in range(n):
            seed = int(job.get("seed0", 1)) * 1000 + len(checks)
            if n >= len(regimes) or i == 0 or len(regimes) == 1:
                dist = regimes[i % len(regimes)]
            else:                               # a big shape: the first regime, then others
                dist = regimes[1 + (int(job.get("seed0", 1)) + i) % (len(regimes) - 1)]
            inputs = shapes.make_inputs(op, dims, dtype, seed, dist, job.get("stats"))
            saved = tuple(np.array(x, copy=True) if isinstance(x, np.ndarray) else None
                          for x in inputs)
            native = runner.native(inputs)
            where = f"dims {dims}, seed {seed}, {dist} values"
            _same_input_class(runner, problem, native, params, where)
            guarded = Guarded(runner, problem)
            out = guarded.out
            out.fill(SENTINEL)
            runner.call(problem, native, out)
            guarded.check(where)
            r1 = np.array(arrays.to_numpy(out), dtype=np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                ref = op.reference(*inputs, **params)
            out.fill(float("nan"))
            runner.call(problem, native, out)
            guarded.check(where + " (second call)")
            r2 = np.array(arrays.to_numpy(out), dtype=np.float64)
            _inputs_unchanged(native, saved, where)
            checks.append(_compare(op, dims, seed, dist, r1, r2, ref, tol,
                                   op.error_floor(dtype)))
    if not checks:
        raise Reject(Stage.WRONG, "no shape to check: the variant's requires exclude the target "
                     "and every edge shape: " + "; ".join(skipped))
    return checks, skipped


def time_candidates(runners: list[Runner], job) -> tuple[list[list[float]], bool]:
    """Interleaved timing at the target shape, caches flushed and input sets rotated."""
    op, dtype, params = runners[0].op, job["dtype"], dict(job.get("params", {}))
    sets = [runners[0].native(shapes.make_inputs(op, job["dims"], dtype, 7000 + i, "normal",
                                                 job.get("stats"))) for i in range(3)]
    problem = runners[0].problem(sets[0], params)
    outs = [r.empty(problem) for r in runners]
    cuda = runners[0].cuda
    if cuda:
        import cupy
        l2 = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["l2CacheSize"]
        flush_buf = cupy.empty(max(2 * l2, 1 << 20), dtype=cupy.uint8)
        timer = CudaEvents(cupy)   # events time the GPU only: runs do not synchronise
    else:
        flush_buf, timer = np.empty(32 << 20, dtype=np.uint8), None
    reps, warmup, budget_s = int(job.get("reps", 10)), 2, float(job.get("timing_s", 3.0))
    fills = itertools.count()

    def run_of(k: int, runner: Runner):
        inputs = itertools.cycle(sets[k:] + sets[:k])   # round r runs set (r + k) % 3
        return lambda: runner.call(problem, next(inputs), outs[k], sync=False)
    try:
        measured = measure_each(
            [run_of(k, r) for k, r in enumerate(runners)], warmup=warmup, reps=reps,
            budget_s=budget_s, sync=runners[0].sync, timer=timer,
            flush=lambda: flush_buf.fill(next(fills) & 0xFF), raise_errors=True)
    except Reject:
        raise
    except Exception as exc:  # noqa: BLE001 (an asynchronous fault shows at the wait)
        raise Reject(Stage.RUN, _exc_text(exc), fatal=True) from None
    return [list(m.samples_ms) for m in measured], all(m.l2_flushed for m in measured)


def verify_job(job: dict) -> VerifyReport:
    from adaptive.backends import get_backend
    from adaptive.ops import get_op
    from adaptive.variants import make_candidate, variant_from_dict
    t0 = time.perf_counter()
    op = get_op(job["variant"]["op"])
    variant = variant_from_dict(job["variant"], op.name, where="<candidate>")
    config = dict(job.get("config", {}))
    execute = job.get("execute", True) and (variant.backend == "host" or _gpu())
    notes = []
    compile_ms, resources = _compile(variant, config, job["dtype"], job.get("cache_dir"))
    base = dict(op=op.name, variant=variant.name, config=config, backend=variant.backend,
                language=variant.language, target_dims=dict(job["dims"]), dtype=job["dtype"],
                compile_ms=compile_ms, resources=resources)
    if not execute:
        return VerifyReport(outcome=Outcome.COMPILED_ONLY, executed=False,
                            notes=("no GPU on this machine: compiled with NVRTC only",),
                            wall_s=time.perf_counter() - t0, device="none", **base)
    from adaptive import config as cfg
    with cfg.override(cache_dir=job.get("cache_dir") or cfg.get().cache_dir):
        backend = get_backend(variant.backend)     # loads the cubin compiled above
    runner = Runner(backend, op, make_candidate(variant, config))
    checks, skipped = check_correctness(runner, variant, config, job)
    target_skipped = any(s.startswith("target ") for s in skipped)
    if not job.get("timing", True) or target_skipped:
        note = ("not timed: the variant's requires exclude the target shape" if target_skipped
                else "not timed")
        return VerifyReport(outcome=Outcome.ACCEPTED, checks=tuple(checks),
                            skipped_shapes=tuple(skipped), notes=(note,),
                            wall_s=time.perf_counter() - t0, **base)
    runners, baseline = [runner], ""
    if job.get("baseline"):
        b = job["baseline"]
        bv = variant_from_dict(b["variant"], op.name, where="<baseline>")
        bc = make_candidate(bv, b.get("config", {}))
        runners.append(Runner(backend, op, bc))
        baseline = bc.label
    try:
        samples, flushed = time_candidates(runners, job)
    except Reject as exc:
        if exc.stage is Stage.LOAD and len(runners) > 1:   # the baseline failed, not us
            notes.append(f"baseline {baseline} could not be timed: {exc.detail}")
            runners, baseline = runners[:1], ""
            samples, flushed = time_candidates(runners, job)
        else:
            raise
    median = [statistics.median(s) if s else math.inf for s in samples]
    return VerifyReport(
        outcome=Outcome.ACCEPTED, checks=tuple(checks), skipped_shapes=tuple(skipped),
        time_ms=median[0], samples_ms=tuple(samples[0]), baseline=baseline,
        baseline_ms=median[1] if len(median) > 1 else math.inf, l2_flushed=flushed,
        notes=tuple(notes), wall_s=time.perf_counter() - t0,
        device=json.dumps(backend.fingerprint(), sort_keys=True), **base)


def _write(fh, record: dict) -> None:
    fh.write(json.dumps(record) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m adaptive.regen.worker JOBS.json RESULTS.jsonl", file=sys.stderr)
        return 2
    faulthandler.enable()          # a segfaulting candidate leaves its Python traceback
    with open(argv[0]) as fh:
        jobs = json.load(fh)
    with open(argv[1], "a") as out:
        for i, job in enumerate(jobs):
            if job.get("skip"):
                continue
            _write(out, {"start": i})
            t0 = time.perf_counter()
            fatal = False
            try:
                report = verify_job(job)
            except Reject as exc:
                report = rejected(job, exc.stage, exc.detail, wall_s=time.perf_counter() - t0)
                fatal = exc.fatal
            except Exception as exc:  # noqa: BLE001 (the verifier's own bug: say so)
                report = rejected(job, Stage.RUN, "verifier error: " + _exc_text(exc),
                                  wall_s=time.perf_counter() - t0)
            _write(out, {"index": i, "report": report.to_dict()})
            if fatal:
                return EXIT_CONTEXT_LOST
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
