"""Every ``ADAPTIVE_*`` environment variable, typed, with its default and one line of doc.

Read once into a frozen :class:`Config`; ``with override(field=value):`` swaps it in-process
(tests, benchmarks). Code reads ``config.get()`` on a miss, never on the hot path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator
from pathlib import Path


def _cache_dir_default() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "adaptive")


@dataclasses.dataclass(frozen=True)
class Config:
    backend: str = dataclasses.field(default="auto", metadata={
        "env": "ADAPTIVE_BACKEND",
        "doc": "default backend: auto (cuda if a GPU is present), cuda, host"})
    policy: str = dataclasses.field(default="learned", metadata={
        "env": "ADAPTIVE_POLICY", "doc": "default policy: learned (cost model, exploring on real "
        "calls; no sweep on a miss) or measure-each (every candidate timed on a miss)"})
    variant_path: str = dataclasses.field(default="", metadata={
        "env": "ADAPTIVE_VARIANT_PATH", "doc": "extra variant folders, ':'-separated"})
    packs: str = dataclasses.field(default="", metadata={
        "env": "ADAPTIVE_PACKS", "doc": "variant packs to load at start, ':'-separated"})
    counter_log: str = dataclasses.field(default="", metadata={
        "env": "ADAPTIVE_COUNTER_LOG",
        "doc": "append a counter-log record of launches to this path"})
    counter_log_every: int = dataclasses.field(default=16, metadata={
        "env": "ADAPTIVE_COUNTER_LOG_EVERY", "doc": "counter log: time and log every Nth "
        "launch per dispatcher (1: all; the rate is written in the log)"})
    counter_log_timing: str = dataclasses.field(default="auto", metadata={
        "env": "ADAPTIVE_COUNTER_LOG_TIMING", "doc": "counter log timing of cuda launches: auto "
        "(sampled CUDA event pairs), events, or cupti (CUPTI activity records: 2.9 % of a "
        "GPU-bound stream's launches and 44 % of a host-bound one's on the H200, "
        "docs/benchmarks.md run S7; governed, enabled only where the launch rate says "
        "it fits the budget)"})
    counter_log_budget: float = dataclasses.field(default=0.02, metadata={
        "env": "ADAPTIVE_COUNTER_LOG_BUDGET", "doc": "counter log: the share of wall time its "
        "own threads may take (0.02: 2 %); over it the log samples fewer launches and "
        "hands CUPTI over to sampled event pairs"})
    device_state: str = dataclasses.field(default="off", metadata={
        "env": "ADAPTIVE_DEVICE_STATE", "doc": "what the learned policy knows of the GPU's "
        "state: nvml (a thread samples NVML/GPM at 10 Hz: SM clock, utilisation, SM "
        "activity, memory, other processes; the model reads them as features) or off "
        "(an idle device)"})
    cache_dir: str = dataclasses.field(default_factory=_cache_dir_default, metadata={
        "env": "ADAPTIVE_CACHE_DIR", "doc": "content-addressed cache of compiled kernels, and "
        "each GPU's measured roofline peaks"})
    issue_charge: str = dataclasses.field(default="sum", metadata={
        "env": "ADAPTIVE_ISSUE_CHARGE", "doc": "how exploring samples are charged the host's "
        "issuing: sum, max, regime or measured (Dispatcher.issue_charge)"})
    issue_clock: str = dataclasses.field(default="wall", metadata={
        "env": "ADAPTIVE_ISSUE_CLOCK", "doc": "how the host's issuing of an exploring sample "
        "is read for its charge: wall (elapsed time) or thread (the issuing thread's CPU "
        "time: a background refit holding the interpreter is not counted) "
        "(Dispatcher.issue_clock)"})
    issue_floor: str = dataclasses.field(default="window", metadata={
        "env": "ADAPTIVE_ISSUE_FLOOR", "doc": "what the least issuing charged to a host-bound "
        "class's sample is taken over: window (its variant's last 32 issuings) or seeded "
        "(those and its back-to-back seeds, kept for good) (Dispatcher.issue_floor)"})
    sibling_packs: str = dataclasses.field(default="auto", metadata={
        "env": "ADAPTIVE_SIBLING_PACKS", "doc": "shipped packs measured on another GPU of "
        "this one's compute capability, loaded at the start with their rows weighted 0.25: "
        "auto (only on a GPU with no shipped pack of its own: those of the nearest device), "
        "on (also beside its own: every other one), off (never)"})
    sample_every: int = dataclasses.field(default=64, metadata={
        "env": "ADAPTIVE_SAMPLE_EVERY",
        "doc": "time one in N warm launches for feedback (0: never)"})
    plan_cache_size: int = dataclasses.field(default=4096, metadata={
        "env": "ADAPTIVE_PLAN_CACHE_SIZE", "doc": "decided plans one dispatcher keeps (oldest "
        "unsampled evicted first; pinned plans the same, prepared ones 4x)"})
    decide_off_thread: bool = dataclasses.field(default=True, metadata={
        "env": "ADAPTIVE_DECIDE_OFF_THREAD", "doc": "on a GPU, decide a new input class on a "
        "worker thread, a stand-in serving its calls meanwhile (the learned policy's: the "
        "library's candidate, else a near measured input's fastest; 0: the miss "
        "decides, the calling thread waits)"})
    experimental_variants: bool = dataclasses.field(default=False, metadata={
        "env": "ADAPTIVE_EXPERIMENTAL_VARIANTS", "doc": "list experimental variants (not yet "
        "verified on a device; adaptive env marks them) as candidates too, on dispatchers "
        "made after it is set (1: opt in; 0: they run only where named)"})
    max_threads: int = dataclasses.field(default=0, metadata={
        "env": "ADAPTIVE_MAX_THREADS",
        "doc": "host backend: largest thread count tried (0: all cores)"})
    regen_generator: str = dataclasses.field(default="off", metadata={
        "env": "ADAPTIVE_REGEN", "doc": "background regeneration: off, parametric, hf, openai"})
    regen_threshold: float = dataclasses.field(default=0.25, metadata={
        "env": "ADAPTIVE_REGEN_THRESHOLD",
        "doc": "regenerate a hot key whose efficiency stays below"})
    regen_min_samples: int = dataclasses.field(default=8, metadata={
        "env": "ADAPTIVE_REGEN_MIN_SAMPLES",
        "doc": "sampled launches of a key before it can trigger"})
    regen_interval_s: float = dataclasses.field(default=300.0, metadata={
        "env": "ADAPTIVE_REGEN_INTERVAL_S", "doc": "least time between two regeneration requests"})
    regen_budget_s: float = dataclasses.field(default=600.0, metadata={
        "env": "ADAPTIVE_REGEN_BUDGET_S", "doc": "wall-time budget of one regeneration loop"})
    regen_candidates: int = dataclasses.field(default=16, metadata={
        "env": "ADAPTIVE_REGEN_CANDIDATES", "doc": "candidates one regeneration loop may verify"})
    verify_timeout_s: float = dataclasses.field(default=60.0, metadata={
        "env": "ADAPTIVE_VERIFY_TIMEOUT_S", "doc": "verifier: seconds one candidate may take"})
    llm_model: str = dataclasses.field(default="", metadata={
        "env": "ADAPTIVE_LLM_MODEL", "doc": "hf generator: local path or hub id of a causal LM"})
    openai_base_url: str = dataclasses.field(default="", metadata={
        "env": "ADAPTIVE_OPENAI_BASE_URL", "doc": "openai generator: endpoint, e.g. http://host:8000/v1"})
    openai_model: str = dataclasses.field(default="", metadata={
        "env": "ADAPTIVE_OPENAI_MODEL", "doc": "openai generator: model name"})
    openai_api_key: str = dataclasses.field(default="", metadata={
        "env": "ADAPTIVE_OPENAI_API_KEY", "doc": "openai generator: key (else OPENAI_API_KEY)"})


def _parse(field: dataclasses.Field, text: str):
    if field.type in ("int", int):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{field.metadata['env']}={text!r}: expected an integer") from None
    if field.type in ("bool", bool):
        value = {"1": True, "true": True, "yes": True, "on": True,
                 "0": False, "false": False, "no": False, "off": False}.get(text.lower())
        if value is None:
            raise ValueError(f"{field.metadata['env']}={text!r}: expected 1 or 0 (true/false, "
                             f"yes/no, on/off)")
        return value
    if field.type in ("float", float):
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{field.metadata['env']}={text!r}: expected a number") from None
    return text


def from_env(environ: dict | None = None) -> Config:
    """Build a :class:`Config` from the environment (or the given mapping)."""
    environ = os.environ if environ is None else environ
    values = {}
    for field in dataclasses.fields(Config):
        text = environ.get(field.metadata["env"])
        if text is not None and text != "":
            values[field.name] = _parse(field, text)
    return Config(**values)


_lock = threading.Lock()
_current: Config | None = None


def get() -> Config:
    """The configuration in force (read from the environment on first use)."""
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                _current = from_env()
    return _current


@contextlib.contextmanager
def override(**changes) -> Iterator[Config]:
    """Temporarily replace fields of the configuration in this process."""
    global _current
    names = {f.name for f in dataclasses.fields(Config)}
    for name in changes:
        if name not in names:
            from adaptive.errors import UnknownNameError
            raise UnknownNameError("config field", name, names)
    previous = get()
    _current = dataclasses.replace(previous, **changes)
    try:
        yield _current
    finally:
        _current = previous


def describe() -> str:
    """One line per environment variable: name, default, doc."""
    lines = []
    for field in dataclasses.fields(Config):
        default = (field.default if field.default is not dataclasses.MISSING
                   else field.default_factory())
        lines.append(f"{field.metadata['env']:<28} default {default!r:<24} {field.metadata['doc']}")
    return "\n".join(lines)
