"""The generation engine behind the server: a bounded request queue and one worker thread
that serves it in batches, so the event loop never runs model code.

A request is token ids and a number of new tokens; the worker takes up to ``max_batch``
queued requests at once and decodes them together greedily (static batching: a batch
runs until its longest request is done; requests that arrive meanwhile wait for the next
batch). Once a request is there, the worker collects more for up to ``batch_wait_s``
before it starts (a dynamic batcher's queue delay, as Triton's ``max_queue_delay``): the
clients of a finished batch send their next requests a few milliseconds apart, and
without the wait the first of them would start a batch of one and leave the rest a whole
batch behind, so batch sizes, and every latency, would follow those milliseconds.
Every new token goes to its request's ``on_token`` callback on the worker thread; a
callback returning False (the client left) drops that row from the batch's output.
The engine keeps the timing of its newest :data:`BATCH_LOG` batches (:meth:`Engine.batches`:
when each ran, its requests, the wait of its first request, the time to its first tokens
and each step between tokens), so a benchmark can tell the engine's own step time from
queueing and from the delivery of tokens to the clients.

Two language models fit the engine's :class:`LanguageModel` protocol:
:class:`CausalLM` (a ``transformers`` causal LM with a KV cache; prompts left-padded to a
multiple of ``pad_to``, or with ``buckets`` to a power of two, and batches padded to a
power of two rows, so that the shapes met are a small set a warm-up covers) and
:class:`BlockLM`
(the hand-built block of block.py, re-run on the whole sequence for each token).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import inspect
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("adaptive.example.engine")
PROFILES_KEPT = 64   # the newest prefill profiles kept (CausalLM.prefill_profiles)
PROFILED_STEP = 8    # a profiled batch's decode step profiled too (where its tokens go)


class GcClock:
    """Seconds Python's garbage collector has run in this process (every thread) since
    made: a batch's log reads it over its prefill (run S76's 2:4 prefills took 88-1244 ms
    of the engine thread's CPU, against 15-207 ms in torch's mode). The library's
    ``adaptive.timing.GcClock`` is not imported here: the plain modes never import
    adaptive."""

    def __init__(self):
        self.total_s = 0.0
        self._t0 = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.total_s += time.perf_counter() - self._t0
            self._t0 = None


GC_CLOCK = GcClock()


class StackSampler:
    """Where one thread's time goes, by sampling its Python stack every ``interval_s``
    while on: one daemon thread, asleep while off. A sample is the innermost ``depth``
    frames; a C call (a torch op, a lock's wait) is charged to the Python line that made
    it. Each sample is charged the time since the one before: a thread that holds the GIL
    delays the sampler until it lets go (``sys.getswitchinterval()``), and its stack is
    then charged all that time, not one interval. Only the sampled thread is seen: Python
    3.12's cProfile records every thread's calls (``sys.monitoring``), and run S81's
    profile of a 2:4 prefill listed the event loop's ``epoll`` and other threads' lock
    waits as its top entries.

    :meth:`start` on the thread to watch (or give its ident); :meth:`stop` returns the
    busiest stacks, most first, as "ms (share%) innermost < caller < ...", charged no time
    past ``until`` (samples taken between that moment and the stop, as a loaded host lets
    in, are trimmed back to it)."""

    def __init__(self, interval_s: float = 0.002, depth: int = 4):
        self.interval_s, self.depth = interval_s, depth
        self._on = threading.Event()
        self._lock = threading.Lock()
        self._seen: collections.Counter = collections.Counter()   # stack -> seconds
        self._target = 0
        self._last = 0.0
        # the latest samples' (stack, charged from, to): what stop(until=) trims back (64:
        # over 100 ms of samples at the default interval; a loaded host let 2 ms in, CI)
        self._recent: collections.deque = collections.deque(maxlen=64)
        threading.Thread(target=self._run, name="stack-sampler", daemon=True).start()

    def start(self, thread_id: int | None = None) -> None:
        with self._lock:
            self._seen = collections.Counter()
            self._recent.clear()
            self._target = thread_id or threading.get_ident()
            self._last = time.perf_counter()
        self._on.set()

    def stop(self, n: int = 5, until: float | None = None) -> list[str]:
        """The ``n`` busiest stacks; ``until``: a ``time.perf_counter()`` reading the
        samples are charged no time past."""
        self._on.clear()
        with self._lock:
            seen, self._seen = self._seen, collections.Counter()
            if until is not None:
                for stack, t_from, t_to in self._recent:
                    if t_to > until:
                        seen[stack] -= t_to - max(t_from, until)
        seen = +seen                          # a stack trimmed to nothing is left out
        total = sum(seen.values()) or 1.0
        return [f"{s * 1e3:.1f} ms ({100 * s / total:.0f}%) {stack}"
                for stack, s in seen.most_common(n)]

    def _run(self) -> None:
        while True:
            self._on.wait()
            time.sleep(self.interval_s)
            with self._lock:
                if not self._on.is_set():
                    continue
                now = time.perf_counter()
                # no collection inside: CPython 3.11's _current_frames() holds the runtime's
                # lock while it makes frame objects, and a collection there that frees a
                # threading.local takes that lock again (a test run hung so, 2026-12-04)
                collecting = gc.isenabled()
                gc.disable()
                try:
                    frame = sys._current_frames().get(self._target)
                finally:
                    if collecting:
                        gc.enable()
                if frame is not None:
                    stack = _stack(frame, self.depth)
                    self._seen[stack] += now - self._last
                    self._recent.append((stack, self._last, now))
                self._last = now


def _stack(frame, depth: int) -> str:
    """The innermost ``depth`` frames from ``frame`` out, as "file:line function",
    torch's module-call wrappers left out but for the innermost frame."""
    names = []
    while frame is not None and len(names) < depth:
        code = frame.f_code
        if not names or not code.co_filename.endswith(_WRAPPERS):
            where = "/".join(code.co_filename.split("/")[-2:])
            names.append(f"{where}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " < ".join(names)


_WRAPPERS = ("torch/nn/modules/module.py",)   # nn.Module.__call__'s frames


class QueueFullError(RuntimeError):
    """The engine's queue holds ``max_queued`` requests: the server is overloaded."""


class LanguageModel(Protocol):
    name: str
    vocab_size: int
    max_context: int

    def generate(self, prompts: list[list[int]], max_new: list[int],
                 emit: Callable[[int, int], bool]) -> None:
        """Greedy decoding of every prompt; ``emit(row, token)`` per new token, in order;
        a row whose ``emit`` returns False may stop early."""


@dataclasses.dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    on_token: Callable[[int], bool]        # on the worker thread; False: stop this one
    on_done: Callable[[BaseException | None], None]
    enqueued_s: float = dataclasses.field(default_factory=time.perf_counter)


BATCH_LOG = 512     # batches whose timing the engine keeps


class _Call:
    """A function for the worker thread to run between batches (:meth:`Engine.call`)."""

    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done = threading.Event()
        self.result = self.error = None

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 (handed to the caller, raised there)
            self.error = exc
        self.done.set()


class Engine:
    """One worker thread serving a queue of :class:`Request` in batches.

    Args:
        model: a :class:`LanguageModel`.
        max_batch: most requests decoded together.
        max_queued: most requests waiting; :meth:`submit` raises :class:`QueueFullError`
            beyond (the server answers 503).
        batch_wait_s: how long the first request of a batch waits for others (0: none).
    """

    def __init__(self, model: LanguageModel, max_batch: int = 8, max_queued: int = 1024,
                 batch_wait_s: float = 0.01):
        if max_batch < 1 or max_queued < 1 or batch_wait_s < 0:
            raise ValueError(f"max_batch and max_queued must be >= 1 and batch_wait_s >= 0, "
                             f"got {max_batch}, {max_queued}, {batch_wait_s}")
        self.model, self.max_batch, self.batch_wait_s = model, max_batch, batch_wait_s
        self._queue: queue.Queue[Request | _Call | None] = queue.Queue(max_queued)
        self._lock = threading.Lock()
        self.stats = {"batches": 0, "requests": 0, "tokens": 0, "failed": 0, "running": 0}
        self._log: collections.deque = collections.deque(maxlen=BATCH_LOG)
        self._sampler = StackSampler()
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def batches(self, since: float = 0.0) -> list[dict]:
        """The logged batches that started at or after ``since`` (``time.time()``), oldest
        first: ``start_s``, ``end_s`` (wall clock), ``requests``, ``wait_ms`` (the first
        request's time in the queue), ``first_ms`` (batch start to its first tokens),
        ``first_cpu_ms`` and ``first_process_cpu_ms`` (the CPU time of this engine's thread
        and of the whole process over ``first_ms``), ``first_gc_ms`` (the time Python's
        garbage collector ran over ``first_ms``, in any thread), ``first_stacks`` (where
        this engine's thread spent ``first_ms``: :class:`StackSampler`'s busiest stacks),
        ``steps_ms`` (the gaps between its later tokens, one a step)."""
        with self._lock:
            return [dict(b) for b in self._log if b["start_s"] >= since]

    def call(self, fn, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` on the worker thread, between batches, and return
        its result (its exception is raised here). A warm-up belongs there: torch keeps
        cuDNN's attention graphs per thread (``getMHAGraphCache_`` is thread-local), so a
        warm-up on another thread leaves every shape to be built again under load (run
        S51: masked prefills of 8 rows took 53-64 ms with cuDNN against 20-26 without)."""
        job = _Call(fn, args, kwargs)
        self._queue.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def submit(self, request: Request) -> None:
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            raise QueueFullError(f"{self._queue.maxsize} requests are already waiting; "
                                 "retry later") from None

    def close(self, timeout_s: float = 10.0) -> None:
        """Finish the batch in progress and stop (queued requests fail)."""
        while True:
            try:
                req = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(req, _Call):
                req.error = RuntimeError("the server is shutting down")
                req.done.set()
            elif req is not None:
                req.on_done(RuntimeError("the server is shutting down"))
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            if isinstance(first, _Call):
                first.run()
                continue
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.max_batch:
                wait = deadline - time.monotonic()
                try:
                    req = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if req is None or isinstance(req, _Call):
                    self._queue.put(req)           # stop, or run it, after this batch
                    break
                batch.append(req)
            self._run(batch)

    def _run(self, batch: list[Request]) -> None:
        live = [True] * len(batch)
        counts = [0] * len(batch)
        marks: list[float] = []               # when each step's first token came
        t0, start_s = time.perf_counter(), time.time()
        # CPU seconds to the first tokens, this thread's and the process's: a slow prefill
        # whose thread was busy spent it in Python or host work here; one whose thread
        # idled waited (the device, a lock, the GIL held by a thread beside it)
        cpu0, proc0, gc0 = time.thread_time(), time.process_time(), GC_CLOCK.total_s
        cpu_first: list[float] = []
        stacks: list[str] = []                # where this thread was until the first tokens
        self._sampler.start()

        def emit(row: int, token: int) -> bool:
            if not live[row] or counts[row] >= batch[row].max_tokens:
                return False
            if counts[row] == len(marks):     # the first token of a new step
                marks.append(time.perf_counter())
                if len(marks) == 1:
                    cpu_first[:] = [time.thread_time() - cpu0, time.process_time() - proc0,
                                    GC_CLOCK.total_s - gc0]
                    stacks[:] = self._sampler.stop(until=marks[0])
            counts[row] += 1
            try:
                live[row] = bool(batch[row].on_token(token))
            except Exception:  # noqa: BLE001 (a broken callback never stops the batch)
                log.exception("on_token failed")
                live[row] = False
            return live[row] and counts[row] < batch[row].max_tokens

        with self._lock:
            self.stats["running"] = len(batch)
        error = None
        try:
            self.model.generate([r.prompt for r in batch], [r.max_tokens for r in batch], emit)
        except Exception as exc:  # noqa: BLE001 (a failed batch fails its requests only)
            log.exception("generation failed for a batch of %d", len(batch))
            error = exc
        if not stacks:
            self._sampler.stop()              # no tokens came
        with self._lock:
            self.stats["batches"] += 1
            self.stats["requests"] += len(batch)
            self.stats["tokens"] += sum(counts)
            self.stats["failed"] += len(batch) if error else 0
            self.stats["running"] = 0
            self._log.append({
                "start_s": start_s, "end_s": time.time(), "requests": len(batch),
                "longest": max(len(r.prompt) for r in batch),
                "wait_ms": round((t0 - batch[0].enqueued_s) * 1e3, 3),
                "first_ms": round((marks[0] - t0) * 1e3, 3) if marks else None,
                "first_cpu_ms": round(cpu_first[0] * 1e3, 3) if cpu_first else None,
                "first_process_cpu_ms": round(cpu_first[1] * 1e3, 3) if cpu_first else None,
                "first_gc_ms": round(cpu_first[2] * 1e3, 3) if cpu_first else None,
                "first_stacks": stacks,
                "steps_ms": [round((b - a) * 1e3, 3) for a, b in zip(marks, marks[1:])]})
        for req in batch:
            try:
                req.on_done(error)
            except Exception:  # noqa: BLE001
                log.exception("on_done failed")


@dataclasses.dataclass
class StateLog:
    """What :class:`CausalLM` saw of one static decode state: why its last capture failed
    (None: it did not), and with re-checks, its batches served captured, re-checks and
    re-captures."""
    capture_error: str | None = None
    batches: int = 0
    rechecks: int = 0
    recaptures: int = 0


class CausalLM:
    """A ``transformers`` causal LM decoded greedily in batches with a KV cache.

    Prompts are left-padded to a multiple of ``pad_to`` (and to the batch's longest) with
    an attention mask and position ids that skip the padding, as ``generate()`` does.
    With ``buckets``, the padded width is a power of two (at least ``pad_to``) and a batch
    of n requests runs as the next power of two rows (the extra rows repeat the first
    prompt and are never emitted): every mode pays the padding alike, and a warm-up over
    the powers of two meets every shape the load will (what servers that capture CUDA
    graphs per batch size do too).

    With ``graphs`` (any mode), decode steps run over a static key/value cache
    (``adaptive.integrations.static.StaticDecode``, one per rows and cache length):
    ``True`` captures one step in a CUDA graph on first use and replays it for every step
    (CUDA only), ``"eager"`` runs the same steps without capturing (a CPU dry run of the
    same path). A failed capture is logged as an error, said in :meth:`static_states`,
    and that state's steps run uncaptured. A replayed step runs the kernels held at its
    capture and the policy sees none of it; with ``recheck_every`` N, one batch in N of
    a captured state decodes eagerly (routed and sampled), and a plan revised meanwhile
    has the state captured again.
    """

    def __init__(self, model, name: str, pad_to: int = 16, buckets: bool = False,
                 graphs: bool | str = False, max_new_tokens: int | None = None,
                 recheck_every: int = 0):
        import torch
        if graphs not in (False, True, "eager"):
            raise ValueError(f"graphs must be False, True or 'eager', got {graphs!r}")
        if graphs is True and next(model.parameters()).device.type != "cuda":
            raise ValueError("graphs=True captures decode steps in CUDA graphs: the model "
                             "must be on a CUDA device (graphs='eager' runs the same static "
                             "decode without capturing)")
        self.torch, self.model, self.name, self.pad_to = torch, model, name, pad_to
        self.buckets = buckets
        self.graphs = graphs
        if recheck_every < 0:
            raise ValueError(f"recheck_every must be >= 0 (0: never), got {recheck_every}")
        # with graphs=True, every this many batches of a captured state one runs its decode
        # steps eagerly (routed and sampled, the policy seeing decode again); a plan revised
        # meanwhile has the state re-captured (0: never; the choices stay the warm-up's)
        self.recheck_every = recheck_every
        # the most new tokens a request may ask (the server's limit): a static cache is
        # the width's power of two past it, so a warm-up over widths and rows meets every
        # static state (None: the batch's own most)
        self.max_new_tokens = max_new_tokens
        # (rows, cache length) -> its static decode state: bounded by the powers of two
        # of rows (to the batch limit) and of lengths (to the context plus the token limit)
        self._static: dict = {}
        self._graph_stream = self._graph_pool = None
        self._logs: dict[tuple[int, int], StateLog] = {}   # (rows, length) -> its log
        config = model.config
        self.vocab_size = config.vocab_size
        self.max_context = config.max_position_embeddings
        self.device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # 5.x renamed it
        self.profile_prefill: set[int] = set()   # which batches' prefill to profile (0: the
        self.batches_run = 0                     # first after count_from_here())
        self.prefill_profiles: collections.deque = collections.deque(maxlen=PROFILES_KEPT)
        self._sampler: StackSampler | None = None   # the profiled forwards' (made on use)

    def count_from_here(self) -> None:
        """Number the batches from the next one (after the warm-up)."""
        self.batches_run = 0

    def profiled(self, run, batch: int, what: str = "prefill"):
        """Run ``run()`` (a prefill, or with ``what`` another forward of the batch: it
        returns the model's output) under torch.profiler and
        keep, in :attr:`prefill_profiles`, its wall, device and host ms, its top ops by
        device time (``top``) and by host time of their own (``host_top``: a blocking
        call, a synchronisation or an allocation shows there), its SDPA calls grouped by
        their arguments, with the fused backends that take them (:func:`sdpa_spy`), the
        way each patched linear and norm went (:func:`route_spy`), and this thread's
        busiest stacks (``python``, :class:`StackSampler`: time outside torch's ops too,
        which the op profile does not show; run S76's 2:4 prefills spent 130 ms there):
        a server's time to first tokens broken down where it is spent. ``wall_ms`` is
        under both; ``issue_ms`` is its part until the forward returned, before the wait
        for its tokens (a host-bound forward: nearly all of it)."""
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                         if self.device.type == "cuda" else [])
        if self._sampler is None:
            self._sampler = StackSampler(interval_s=0.001, depth=6)
        with sdpa_spy(self.torch) as sdpa, route_spy(self.model) as linears, \
                profile(activities=acts) as prof:
            t0 = time.perf_counter()
            self._sampler.start()
            try:
                out = run()
                issued = time.perf_counter()   # the forward issued; then the wait for it
                out.logits[:, -1].argmax(-1).tolist()
            finally:
                python = self._sampler.stop(12)
            wall = (time.perf_counter() - t0) * 1e3

        def device_us(e):
            return float(getattr(e, "self_device_time_total", 0.0) or 0.0)
        events = sorted(prof.key_averages(), key=lambda e: (device_us(e),
                                                            e.self_cpu_time_total),
                        reverse=True)           # (host time orders a CPU-only profile)
        self.prefill_profiles.append({
            "batch": batch, "what": what, "wall_ms": round(wall, 3),
            "issue_ms": round((issued - t0) * 1e3, 3),
            "device_ms": round(sum(device_us(e) for e in events) / 1e3, 3),
            "host_ms": round(sum(e.self_cpu_time_total for e in events) / 1e3, 3),
            "top": [f"{device_us(e) / 1e3:.3f} ms {e.count} calls {e.key[:100]}"
                    for e in events[:15]],
            "host_top": [f"{e.self_cpu_time_total / 1e3:.3f} ms {e.count} calls {e.key[:100]}"
                         for e in sorted(events, key=lambda e: e.self_cpu_time_total,
                                         reverse=True)[:10]],
            "sdpa": [f"{n} call(s): {args}" for args, n in sdpa.most_common()],
            "routes": [f"{n} call(s): {way}" for way, n in linears.most_common()],
            "python": python})
        log.info("%s of batch %d profiled: %s", what, batch, self.prefill_profiles[-1])
        return out

    def _cache(self):
        from transformers import DynamicCache
        return DynamicCache(config=self.model.config)

    def width(self, longest: int, max_new: int) -> int:
        """The padded prompt width of a batch whose longest prompt is ``longest``."""
        width = -(-longest // self.pad_to) * self.pad_to
        if self.buckets:
            width = max(self.pad_to, 1 << (longest - 1).bit_length())
        return max(min(width, self.max_context - max_new), longest)

    def left_padded(self, prompts, max_new: int):
        """``prompts`` left-padded to :meth:`width`, on the model's device: the token ids,
        the attention mask (0 on padding) and position ids that skip the padding."""
        torch = self.torch
        width = self.width(max(len(p) for p in prompts), max_new)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def rows(self, n: int) -> int:
        """The rows a batch of ``n`` requests runs as."""
        return 1 << (n - 1).bit_length() if self.buckets else n

    def generate(self, prompts, max_new, emit) -> None:
        torch = self.torch
        real = len(prompts)
        prompts = list(prompts) + [prompts[0]] * (self.rows(real) - real)
        max_new = list(max_new) + [max_new[0]] * (len(prompts) - real)
        ids, mask, positions = self.left_padded(prompts, max(max_new))
        cache = self._cache()
        active = list(range(real))            # padding rows are computed, never emitted
        batch, self.batches_run = self.batches_run, self.batches_run + 1
        with torch.inference_mode():
            def run():
                return self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                  use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
            profiling = batch in self.profile_prefill
            if profiling:
                self.profile_prefill.discard(batch)
                out = self.profiled(run, batch)
            else:
                out = run()
            if self.graphs:
                tokens = out.logits[:, -1].argmax(-1)
                static = self.static_decode(len(prompts), ids.shape[1] + max(
                    max(max_new), self.max_new_tokens or 0))
                static.load(cache, mask, positions, tokens)
                before = self._recheck_start(static)   # None: replayed as captured
                # each step issued before the one before it is read back: the streaming
                # of a step's tokens overlaps the next step on the device
                for step, host in enumerate(static.run(tokens, max(max_new) - 1,
                                                       eager=before is not None)):
                    active = [i for i in active if emit(i, host[i]) and step + 1 < max_new[i]]
                    if not active:
                        break
                if before is not None:
                    self._after_recheck(static, before)
                return
            for step in range(max(max_new)):
                tokens = out.logits[:, -1].argmax(-1)
                host = tokens.tolist()                  # one sync per step: tokens stream
                active = [i for i in active if emit(i, host[i]) and step + 1 < max_new[i]]
                if not active:
                    return
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
                positions = positions[:, -1:] + 1

                def step_run(tokens=tokens, mask=mask, positions=positions):
                    return self.model(input_ids=tokens[:, None], attention_mask=mask,
                                      position_ids=positions, use_cache=True,
                                      **{self._cache_kw: cache})
                if profiling and step == PROFILED_STEP:   # a decode step of the same batch
                    out = self.profiled(step_run, batch, f"decode step {step}")
                else:
                    out = step_run()

    def _recheck_start(self, static) -> dict | None:
        """Where this batch of ``static`` (captured) re-checks its plans (every
        :attr:`recheck_every` batches of the state; its steps then run eagerly): the
        process's plan table before its steps, else None."""
        if self.graphs is not True or not self.recheck_every or not static.captured:
            return None
        state = self._log_of(static)
        state.batches += 1
        if state.batches % self.recheck_every:
            return None
        from adaptive.integrations.static import plan_table
        return plan_table()

    def _after_recheck(self, static, before: dict) -> None:
        """After a re-check's eager steps: where the policy revised a plan meanwhile, the
        state is captured again (its graph ran the kernels held before)."""
        from adaptive.integrations.static import plan_table, revised_keys
        state = self._log_of(static)
        state.rechecks += 1
        revised = revised_keys(before, plan_table())
        if not revised:
            return
        state.recaptures += 1
        log.info("decode re-check of %dx%d: %d plan(s) revised; capturing it again",
                 static.rows, static.length, revised)
        self._capture(static)

    def _log_of(self, static) -> StateLog:
        return self._logs.setdefault((static.rows, static.length), StateLog())

    def static_states(self) -> dict | None:
        """``graphs``' state (None without): the mode, and each static decode state's rows,
        cache length, whether captured, the seconds its capture took (warm steps
        included) and, where it failed, why (logged as an error; that state's steps run
        uncaptured)."""
        if not self.graphs:
            return None
        return {"mode": "capture" if self.graphs is True else "eager",
                "recheck_every": self.recheck_every,
                "states": [{"rows": rows, "length": length, "captured": s.captured,
                            "capture_s": s.capture_s,
                            **dataclasses.asdict(self._logs.get((rows, length), StateLog()))}
                           for (rows, length), s in sorted(self._static.items())]}

    def static_decode(self, rows: int, length: int):
        """The static decode state (``adaptive.integrations.static.StaticDecode``) of
        ``rows`` rows and a cache of the power of two at least ``length`` long (made, and
        with ``graphs=True`` captured, on first use)."""
        length = 1 << (length - 1).bit_length()
        static = self._static.get((rows, length))
        if static is None:
            from adaptive.integrations.static import StaticDecode   # graphs: adaptive's
            static = StaticDecode(self.model, rows, length, cache_kw=self._cache_kw)
            if self.graphs is True:
                self._capture(static)
            self._static[(rows, length)] = static
        return static

    def _capture(self, static) -> None:
        """Capture ``static``'s decode step (a failure is said loudly, kept in
        static_states(), and the state's steps run eagerly)."""
        torch = self.torch
        if self._graph_stream is None:
            self._graph_stream = torch.cuda.Stream(device=self.device)
            self._graph_pool = torch.cuda.graph_pool_handle()
        state = self._log_of(static)
        try:
            static.capture(self._graph_stream, self._graph_pool)
            state.capture_error = None
        except RuntimeError as exc:
            log.error("%s; its steps run uncaptured", exc)
            state.capture_error = str(exc)


class BlockLM:
    """The hand-built block of block.py as a language model: each new token re-runs the
    block on the whole sequence (no KV cache) and takes its argmax; rows run one by one."""

    def __init__(self, model, shape, name: str = "block"):
        self.model, self.shape, self.name = model, shape, name
        self.vocab_size, self.max_context = shape.vocab, shape.max_seq

    def generate(self, prompts, max_new, emit) -> None:
        from block import input_activations
        for row, (prompt, n) in enumerate(zip(prompts, max_new)):
            tokens = list(prompt)
            for _ in range(n):
                x = input_activations(self.shape, self.model.host_weights, tokens=tokens)
                _, token, _ = self.model(x)
                tokens.append(token)
                if not emit(row, token):
                    break


# ---- adaptive's decisions: warm-up and pinning ------------------------------------------
def pending_keys() -> int:
    """How many keys the live dispatchers' learned policies are still exploring, and how
    many keys wait for their class's decide off the calling thread (a stand-in serving)."""
    from adaptive.runtime import live_dispatchers
    return sum(1 for d in live_dispatchers()
               for state in getattr(d.policy, "keys", {}).values()
               if getattr(state, "committed", True) is None) + sum(
        1 for d in live_dispatchers() for plan in d.plans().values()
        if plan.decision is not None and plan.decision.pending)


@contextlib.contextmanager
def sdpa_spy(torch):
    """While open, every call of ``torch.nn.functional.scaled_dot_product_attention`` is
    counted (the yielded Counter) by its arguments' shapes, strides and dtypes, with which
    of SDPA's fused backends take them (torch's own reasons where one does not): a call
    none takes runs SDPA's math path (fp32 matmuls and copies, several times slower).
    Run S26 profiled that path in adaptive's prefills inside the server only."""
    import warnings

    from torch.backends import cuda as tbc
    F = torch.nn.functional
    real, seen = F.scaled_dot_product_attention, collections.Counter()
    backends: dict[str, str] = {}   # argument layout -> the fused backends' answers

    def described(t):
        return "None" if t is None else (f"{tuple(t.shape)} stride {tuple(t.stride())} "
                                         f"{str(t.dtype).removeprefix('torch.')}")

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False):
        layout = (f"q {described(q)}, k {described(k)}, v {described(v)}, mask "
                  f"{described(attn_mask)}, causal {is_causal}, gqa {enable_gqa}, "
                  f"{threading.current_thread().name}; ")
        if layout not in backends:   # asked once per layout: the spy runs inside a profile
            why = []
            params = tbc.SDPAParams(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
            for name, test in (("flash", tbc.can_use_flash_attention),
                               ("efficient", tbc.can_use_efficient_attention),
                               ("cudnn", tbc.can_use_cudnn_attention)):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    ok = test(params, True)
                why.append(f"{name} {'yes' if ok else 'no'}" + ("" if ok else ": " + "; ".join(
                    str(w.message).splitlines()[0][:160] for w in caught)))
            backends[layout] = ", ".join(why)
        seen[layout + backends[layout]] += 1
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa)
    F.scaled_dot_product_attention = spy
    try:
        yield seen
    finally:
        F.scaled_dot_product_attention = real


@contextlib.contextmanager
def route_spy(model):
    """While open, every call of ``model``'s adaptive linears and norms is counted (the
    yielded Counter) by the way it goes (``route_of``: torch's matmul by ``F.linear``, the
    model's own norm, a held plan of another kernel, or the dispatcher, and why) and its
    input shape. Empty for a model not patched. Run S33's adaptive prefills made two transposing
    copies per linear where torch's made none."""
    seen = collections.Counter()

    def hook(module, args):
        x = args[0]
        seen[f"{module.route_of(x)}, x {tuple(x.shape)}"] += 1
    handles = [m.register_forward_pre_hook(hook) for m in model.modules()
               if callable(getattr(m, "route_of", None))]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def ragged_prompts(rows: int, longest: int, vocab: int) -> list[list[int]]:
    """``rows`` prompts from ``longest`` tokens down to about half of it, as real prompts
    of a batch differ: the shorter ones are padded and attention meets a padding mask, a
    class of its own (prompts of one length left every masked class to be decided under
    load: 4-6 ms each, run S22)."""
    return [[(7 * i + j) % min(vocab, 256) for j in range(longest - longest * i // (2 * rows))]
            for i in range(rows)]


def warm_up(model: LanguageModel, batches: list[tuple[int, int, int]], settle: bool = True,
            limit_s: float = 120.0, max_rounds: int = 16, progress=None) -> dict:
    """Serve ``batches`` ((batch size, longest prompt, new tokens) each; the rows of a
    batch run from that length down to about half of it) twice, and with
    ``settle`` (adaptive) again until no key of the process's dispatchers is left
    exploring: compilation, library heuristics and the learned policy's exploration all
    happen here, not under load; with ``settle``, the cost models' last refits end here
    too (``Dispatcher.settle``); in every mode it ends with a full garbage collection and
    ``gc.freeze()`` of what survives.

    Returns {"warmup_s", "rounds", "pending_keys"} (``pending_keys`` None without
    ``settle``); a warm-up that runs out of rounds or time (``limit_s`` is checked from
    the second round on) says so in ``pending_keys`` (> 0) and in ``progress``.
    """
    t0 = time.perf_counter()
    pending = None
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        for batch, length, new in batches:
            model.generate(ragged_prompts(batch, length, model.vocab_size), [new] * batch,
                           lambda row, token: True)
        pending = pending_keys() if settle else None
        if progress is not None:
            progress(f"warm-up round {rounds}: {len(batches)} batches"
                     + (f", {pending} key(s) still exploring" if settle else "")
                     + f", {time.perf_counter() - t0:.1f} s")
        if rounds >= 2 and not pending:
            break
        if rounds >= 2 and time.perf_counter() - t0 > limit_s:   # (every batch twice first)
            if progress is not None:
                progress(f"warm-up stopped at its {limit_s:.0f} s limit with {pending} key(s) "
                         "still exploring")
            break
    if settle:   # the last exploring rows' refit ends here, not under the first requests
        from adaptive.runtime import live_dispatchers
        for d in live_dispatchers():
            d.settle()
    # every mode: the warm-up's long-lived objects collected and frozen, so no full
    # collection of them lands under load (one took 240 ms of a CPU generate's tokens)
    gc.collect()
    gc.freeze()
    return {"warmup_s": time.perf_counter() - t0, "rounds": rounds, "pending_keys": pending}


def adaptive_attention(model: CausalLM) -> bool:
    """Whether ``model``'s attention is adaptive's (a patched transformers model)."""
    return getattr(model.model.config, "_attn_implementation", None) == "adaptive"


def sweep_decode_attention(model: CausalLM, batch_rows, least_keys: int,
                           max_calls: int = 96, limit_s: float = 120.0,
                           progress=None) -> dict:
    """Decide every decode-attention input class a load can meet before the server
    listens: for each batch of ``batch_rows`` and each class of cached-key lengths from
    ``least_keys`` up to the model's context (quarter octaves: ``adaptive.ops.base.bucket``),
    one decode step's attention, as the patched model calls it (q ``[B, H, 1, D]``, k and v
    ``[B, Hkv, Lk, D]``, the padding mask ``[B, 1, 1, Lk]``), is called until its class is
    committed (at most ``max_calls`` calls); classes not reached within ``limit_s`` are
    left to be decided under load, and counted.

    The warm-up's decodes reach only ``--warmup-new-tokens`` past each prompt width; a
    request decoding further met a class there first and explored it under load (run
    S29: 9 of 492 steps at 64-95 ms against 16, at 608, 724 and 861 cached keys, in a
    batch of 8 rows). Calls of the attention op alone, with random q, k and v, cost
    milliseconds a class. Returns {"classes", "calls", "undecided", "skipped",
    "sweep_s"}."""
    import types

    import adaptive
    from adaptive.integrations import transformers as at
    from adaptive.ops.base import bucket
    from adaptive.runtime import default_dispatcher
    torch, config = model.torch, model.model.config
    layer = types.SimpleNamespace(is_causal=True)   # what transformers passes as ``module``
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dtype = next(model.model.parameters()).dtype
    scale = dim ** -0.5
    firsts, last = [], None   # each class's first key length
    for lk in range(max(2, least_keys), model.max_context + 1):
        if bucket(lk) != last:
            firsts.append(lk)
            last = bucket(lk)
    t0 = time.perf_counter()
    calls = undecided = skipped = 0
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.inference_mode(), adaptive.unbounded_exploration():
        for b in sorted(set(batch_rows)):
            for lk in firsts:
                if time.perf_counter() - t0 > limit_s:
                    skipped += 1
                    continue
                q = torch.randn((b, heads, 1, dim), generator=gen).to(model.device, dtype)
                k = torch.randn((b, kv_heads, lk, dim), generator=gen).to(model.device, dtype)
                v = torch.randn((b, kv_heads, lk, dim), generator=gen).to(model.device, dtype)
                mask = torch.ones((b, 1, 1, lk), dtype=torch.bool, device=model.device)
                mask[:, :, :, : lk // 8] = False       # left padding, as a ragged batch has
                dispatcher = default_dispatcher((q,))
                for i in range(max_calls):
                    at.attention_forward(layer, q, k, v, mask, scaling=scale)
                    calls += 1
                    if i == 0:   # a class decided off the calling thread: its decision
                        dispatcher.wait_for_decisions()
                    plan = dispatcher.plan("attention", q, k, v, mask, causal=False,
                                           scale=scale)
                    if not plan.provisional:   # this class committed
                        break
                else:
                    undecided += 1
            if progress is not None:
                progress(f"decode attention swept at {b} rows: {len(firsts)} key-length "
                         f"classes, {calls} calls, {time.perf_counter() - t0:.1f} s")
    if skipped and progress is not None:
        progress(f"decode attention sweep stopped at its {limit_s:.0f} s limit: {skipped} "
                 "classes left to be decided under load")
    return {"classes": len(firsts) * len(set(batch_rows)), "calls": calls,
            "undecided": undecided, "skipped": skipped, "sweep_s": time.perf_counter() - t0}


class Pinned:
    """A policy that keeps every decision already made: no exploring, no revision.

    Wraps the policy the warm-up ran with; a key first met after pinning gets, without
    exploring, the library candidate (torch's own call: what the plain program runs) where
    the wrapped policy would have explored, else its choice. Attributes (``keys``,
    ``stats``) are the wrapped policy's.
    """

    name = "pinned"

    def __init__(self, policy):
        self.policy = policy

    def decide(self, ctx, candidates):
        from adaptive.policy.learned import library_candidate
        decision = self.policy.decide(ctx, candidates)
        first = decision.candidate
        if decision.explore:
            first = (library_candidate(ctx.problem, decision.explore)
                     or library_candidate(ctx.problem, candidates) or decision.explore[0])
        return dataclasses.replace(decision, candidate=first, explore=(),
                                   reason=decision.reason + "; pinned (no exploring)")

    def observe(self, key, candidate, time_ms):
        return None

    def __getattr__(self, name):
        return getattr(self.policy, name)


def pin_dispatchers() -> dict:
    """Pin every live dispatcher (the static mode): sampled timing off, each committed
    key kept for good, a key still exploring decided again without exploring."""
    from adaptive.runtime import live_dispatchers
    pinned = reopened = 0
    for d in live_dispatchers():
        d.sample_every = 0
        if not isinstance(d.policy, Pinned):
            d.policy = Pinned(d.policy)
        for key, plan in d.plans().items():   # the dispatcher's own plans, any policy
            if plan.provisional:
                d.forget_key(key)
                reopened += 1
            else:
                pinned += 1
    return {"pinned_keys": pinned, "reopened_keys": reopened}
