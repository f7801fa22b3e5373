"""The verifier, parent side: candidates run in a separate process with a time limit.

A candidate that faults, hangs, calls ``os._exit`` or corrupts the CUDA context takes
down only the worker process (:mod:`adaptive.regen.worker`); the verifier records a
``crash`` or ``timeout`` verdict for it and starts a fresh worker for the rest. Several
candidates share one worker while they behave, which saves the start-up (imports, CUDA
context) per candidate.

The worker runs code nobody has reviewed, so it gets a minimal environment
(:func:`worker_env`): the variables a Python, BLAS and CUDA process needs, and none
whose name looks like a key, token, secret, password or credential.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from adaptive.regen.report import Outcome, Stage, VerifyReport, rejected
from adaptive.variants import Candidate, Variant

# what the worker inherits: these names, and names with these prefixes ...
_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH",
    "XDG_CACHE_HOME", "SYSTEMROOT", "HF_HOME",
})
_ENV_PREFIXES = ("LC_", "ADAPTIVE_", "CUDA_", "NVIDIA_", "CUPY_", "OMP_", "MKL_", "OPENBLAS_",
                 "TRITON_", "PYTORCH_", "NVRTC_")
# ... unless the name looks like a secret
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|"
                          r"SIGNATURE|CERT", re.IGNORECASE)


def secret_looking(name: str) -> bool:
    """True for an environment variable name that looks like it holds a secret."""
    return _SECRET_NAME.search(name) is not None


def worker_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a verifier worker: an allow-list of what Python, BLAS and CUDA
    need, without any variable whose name looks like a key, token, secret or password."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items()
           if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)) and not secret_looking(k)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


STARTUP_S = 30.0          # imports and CUDA context before the first job starts
POLL_S = 0.02
SANITIZER_EXIT = 97
SANITIZER_MIN_S = 120.0


@dataclasses.dataclass(frozen=True)
class Job:
    """One candidate to verify at one target input class."""

    variant: Variant
    config: Mapping[str, object]
    dims: Mapping[str, int]
    dtype: str = "float32"
    params: Mapping[str, object] = dataclasses.field(default_factory=dict)
    stats: Mapping[str, float] = dataclasses.field(default_factory=dict)
    baseline: Candidate | None = None            # the current best, timed alongside
    regimes: tuple[str, ...] = ()                # value regimes to check (empty: all)

    def to_dict(self, verifier: Verifier) -> dict:
        if self.regimes:
            from adaptive.ops import get_op
            known = get_op(self.variant.op).regimes
            unknown = [r for r in self.regimes if r not in known]
            if unknown:
                raise ValueError(f"{self.variant.op} has no value regime "
                                 f"{', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        d = {"regimes": list(self.regimes), "variant": self.variant.to_dict(),
             "config": dict(self.config),
             "dims": dict(self.dims), "dtype": self.dtype, "params": dict(self.params),
             "stats": dict(self.stats), "seeds": verifier.seeds, "reps": verifier.reps,
             "timing_s": verifier.timing_s, "cache_dir": verifier.cache_dir,
             "seed0": verifier.seed if verifier.seed is not None else secrets.randbelow(10**6)}
        if self.baseline is not None:
            d["baseline"] = {"variant": self.baseline.variant.to_dict(),
                             "config": self.baseline.config}
        return d


def static_check(variant: Variant) -> str | None:
    """Why the source cannot be the variant's implementation, or None. Cheap, no execution."""
    src, entry = variant.source, variant.entry
    if not src.strip():
        return "the source is empty"
    if not re.fullmatch(r"[A-Za-z_]\w*", entry):
        return f"entry {entry!r} is not an identifier"
    if variant.language == "python":
        if not re.search(rf"^\s*def\s+{entry}\s*\(", src, re.M):
            return (f"the source defines no function {entry!r} (expected a Python "
                    f"`def {entry}(..., out)` writing into out)")
    elif variant.language == "cuda":
        if not re.search(rf"__global__[^;{{]*\b{entry}\s*\(", src):
            return (f"the source defines no kernel {entry!r} (expected `extern \"C\" "
                    f"__global__ void {entry}(...)` following the op's convention)")
    return None


class Verifier:
    """Verifies candidates in an isolated worker process.

    Args:
        timeout_s: wall time one candidate may take (default ``ADAPTIVE_VERIFY_TIMEOUT_S``).
        seeds: random seeds per shape (at least 5; value distributions rotate with them).
        reps: timed repetitions at the target shape (at least 1).
        timing_s: the time budget of that timing, warm-up included (> 0).
        sanitize: run accepted CUDA candidates under compute-sanitizer memcheck and
            racecheck: "auto" (where installed and a GPU is present), "on" or "off".
        cache_dir: kernel cache for NVRTC output (default ``ADAPTIVE_CACHE_DIR``).
        seed: base of the input seeds (None: fresh per candidate; each check's seed is in
            the report, so a failure reproduces).
        sanitizer_tools: compute-sanitizer tools run on accepted CUDA candidates.
    """

    def __init__(self, timeout_s: float | None = None, seeds: int = 5, reps: int = 10,
                 timing_s: float = 3.0, sanitize: str = "auto", cache_dir: str | None = None,
                 seed: int | None = None, python: str = sys.executable,
                 sanitizer_tools: tuple[str, ...] = ("memcheck", "racecheck")):
        from adaptive import config
        if seeds < 5:
            raise ValueError(f"seeds={seeds}: the verifier needs at least 5 seeds")
        if reps < 1 or not timing_s > 0:
            raise ValueError(f"reps={reps}, timing_s={timing_s}: the verifier times at least "
                             "one run (reps >= 1) within a budget above 0 seconds")
        if sanitize not in ("auto", "on", "off"):
            raise ValueError(f"sanitize={sanitize!r}: expected 'auto', 'on' or 'off'")
        self.timeout_s = float(timeout_s or config.get().verify_timeout_s)
        self.seeds, self.reps, self.timing_s = seeds, reps, timing_s
        self.sanitize, self.python, self.seed = sanitize, python, seed
        self.sanitizer_tools = tuple(sanitizer_tools)
        self.cache_dir = cache_dir or config.get().cache_dir

    # ---- public ----------------------------------------------------------------------------
    def verify(self, job: Job) -> VerifyReport:
        """The verdict on one candidate."""
        return self.verify_many([job])[0]

    def verify_many(self, jobs: Sequence[Job]) -> list[VerifyReport]:
        """Verdicts in order; one misbehaving candidate never affects another's verdict."""
        dicts = [j.to_dict(self) for j in jobs]
        reports: dict[int, VerifyReport] = {}
        for i, job in enumerate(jobs):
            why = static_check(job.variant)
            if why:
                reports[i] = rejected(dicts[i], Stage.SOURCE, why)
        self._run(dicts, reports, prefix=())
        out = [reports[i] for i in range(len(jobs))]
        wanted, why_not = self._sanitizer_wanted(jobs)
        if wanted:
            out = [self._sanitized(d, r) if r.ok and r.language == "cuda" else r
                   for d, r in zip(dicts, out)]
        elif why_not:
            out = [dataclasses.replace(r, notes=(*r.notes, why_not))
                   if r.ok and r.language == "cuda" and r.executed else r for r in out]
        return out

    # ---- the worker process ----------------------------------------------------------------
    def _run(self, dicts: list[dict], reports: dict, prefix: tuple[str, ...],
             limit_s: float | None = None) -> tuple[str, int | None]:
        """Run every job without a report; restart the worker after a crash or a hang."""
        output, returncode = "", None
        with tempfile.TemporaryDirectory(prefix="adaptive-verify-") as tmp:
            attempt = 0
            while len(reports) < len(dicts):
                attempt += 1
                todo = [dict(d, skip=i in reports) for i, d in enumerate(dicts)]
                jobs_path = Path(tmp) / f"jobs{attempt}.json"
                results_path = Path(tmp) / f"results{attempt}.jsonl"
                log_path = Path(tmp) / f"log{attempt}.txt"
                jobs_path.write_text(json.dumps(todo))
                results_path.write_text("")
                output, returncode = self._one_worker(dicts, reports, prefix, jobs_path,
                                                      results_path, log_path,
                                                      limit_s or self.timeout_s)
        return output, returncode

    def _one_worker(self, dicts, reports, prefix, jobs_path, results_path, log_path,
                    limit: float) -> tuple[str, int | None]:
        cmd = [*prefix, self.python, "-m", "adaptive.regen.worker", str(jobs_path),
               str(results_path)]
        env = worker_env()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        running, started_at = None, time.monotonic()
        seen = 0
        timed_out = False
        while True:
            done = proc.poll() is not None
            lines = results_path.read_text().split("\n")[:-1]   # complete lines only
            try:
                for line in lines[seen:]:
                    record = json.loads(line)
                    seen += 1
                    if "start" in record:
                        running, started_at = record["start"], time.monotonic()
                    else:
                        reports[record["index"]] = VerifyReport.from_dict(record["report"])
                        running = None
            except (ValueError, KeyError, TypeError):   # the candidate wrote into our stream
                _kill(proc)
                break
            if done:
                break
            waited = time.monotonic() - started_at
            if (running is not None and waited > limit) or (running is None and
                                                               waited > STARTUP_S + limit):
                _kill(proc)
                timed_out = True
                break
            time.sleep(POLL_S)
        output = log_path.read_text(errors="replace")[-4000:]
        pending = [i for i in range(len(dicts)) if i not in reports]
        if running is None and pending and not timed_out and proc.returncode == 0:
            running = pending[0]           # exited cleanly with jobs left: blame the next
        if timed_out:
            who = running if running is not None else pending[0]
            what = "its first job" if running is None else "the candidate"
            reports[who] = rejected(dicts[who], Stage.TIMEOUT, f"{what} ran past the "
                                    f"verifier's limit of {limit:.1f} s (hang or infinite loop);"
                                    f" the isolated process was killed")
        elif running is not None and running not in reports:
            reports[running] = rejected(dicts[running], Stage.CRASH, _death(proc.returncode,
                                                                            output))
        elif pending and proc.returncode not in (0, 3):
            for i in pending:              # died before starting any job: nothing can run
                reports[i] = rejected(dicts[i], Stage.CRASH, _death(proc.returncode, output))
        return output, proc.returncode

    # ---- compute-sanitizer -----------------------------------------------------------------
    def _sanitizer_wanted(self, jobs: Sequence[Job]) -> tuple[bool, str]:
        """(run compute-sanitizer?, why it is skipped: a note for the reports, or '')."""
        if self.sanitize == "off" or not any(j.variant.language == "cuda" for j in jobs):
            return False, ""
        if shutil.which("compute-sanitizer") is None:
            if self.sanitize == "on":
                raise RuntimeError("sanitize='on' but compute-sanitizer is not on PATH; install "
                                   "the CUDA toolkit's sanitizer or pass sanitize='auto'")
            return False, ("compute-sanitizer skipped: not on PATH (memcheck and racecheck not "
                           "run; the output guard regions still were)")
        from adaptive.backends import gpu_available
        if not gpu_available():
            return False, ""
        return True, ""

    def _sanitized(self, job: dict, report: VerifyReport) -> VerifyReport:
        """Re-run the small shapes (one seed set, untimed) under memcheck, then racecheck."""
        results = {}
        small = dict(job, small_only=True, timing=False)
        for tool in self.sanitizer_tools:
            prefix = ("compute-sanitizer", "--tool", tool, "--error-exitcode",
                      str(SANITIZER_EXIT), "--print-limit", "20")
            reports: dict = {}
            text, rc = self._run([small], reports, prefix,   # the sanitizer starts slowly
                                 limit_s=max(SANITIZER_MIN_S, 5 * self.timeout_s))
            got = reports.get(0)
            found = rc == SANITIZER_EXIT or re.search(r"ERROR SUMMARY: [1-9]", text) or (
                got is not None and got.stage is Stage.CRASH and f"code {SANITIZER_EXIT}"
                in got.detail)
            if found:
                return dataclasses.replace(
                    report, outcome=Outcome.REJECTED,
                    stage=Stage.SANITIZER, detail=f"compute-sanitizer {tool}:\n{text[-3000:]}",
                    sanitizer={**results, tool: "errors"})
            results[tool] = "clean" if got is not None and got.ok and rc == 0 else (
                f"inconclusive (exit {rc}; {got.verdict if got else 'no report'})")
        return dataclasses.replace(report, sanitizer=results)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _death(returncode: int | None, output: str) -> str:
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        how = f"the isolated process was killed by {name}"
    elif returncode == 3:
        how = "the CUDA context was lost (the worker exited after a CUDA error)"
    else:
        how = f"the isolated process exited with code {returncode} before reporting"
    tail = "\n".join(output.strip().splitlines()[-15:])
    return f"{how} while running the candidate" + (f"\n{tail}" if tail else "")
