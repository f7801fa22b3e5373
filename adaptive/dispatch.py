"""The dispatcher: key → decision cache → plan → run, with sampled feedback.

The hot path (:meth:`Dispatcher.launch`) is one key computation, one dict lookup and
the plan's run. Everything else — validation, candidate enumeration, the policy,
compilation, conversion set-up — happens in :meth:`Dispatcher._miss`, under a lock that
hits never take.

The plan cache is bounded (``ADAPTIVE_PLAN_CACHE_SIZE`` plans): a miss that fills it past
the bound evicts the oldest plan, except that a plan sampled since it was last passed
over gets a second chance (a clock; hits record nothing, sampled calls set the bit).
Evictions are counted in ``stats["plan_evictions"]``.

A new input class is decided off the calling thread where the policy names a stand-in
(``Policy.stand_in``; the learned policy's: the library's candidate, what the plain program
runs, else a near measured input's fastest candidate): the miss lists the
candidates, prepares the stand-in and returns its result, and one worker thread decides
the class meanwhile and hands the decision to its keys (:meth:`Dispatcher.settle` waits for
it). A miss's first result then costs a listing and the stand-in's call, not the
model's ranking of ~100 candidates (3-6 ms on the H200's host, run S152).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import itertools
import logging
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from adaptive import arrays, config, optional
from adaptive.backends import Backend, get_backend
from adaptive.backends.base import released
from adaptive.errors import (InputTypeError, InputValueError, NoCandidateError,
                             UnknownNameError)
from adaptive.observation import Observation, floor_ms
from adaptive.ops import OPS, Op, Problem, get_op
from adaptive.policy import POLICIES, make_policy
from adaptive.policy.base import Context, Decision, Policy
from adaptive.timing import measure
from adaptive.variants import Candidate, Registry, Variant, make_candidate, shared_registry

log = logging.getLogger("adaptive")

MISS_LOG = 256    # misses of each kind ("decided", "class") kept for recent_misses(), and
#                   decides made off the calling thread kept for off_thread_decides()
# the longest an exploring sample's stream is gated before its event pair (GPU: released
# as soon as the call and its end event are issued, see CudaBackend.gate): longer than the
# host takes to issue any candidate, a torch library call included. At 100 µs the learned
# dispatcher committed split-KV configs 0.76-0.89x SDPA on 5 decode shapes; at 1000 µs it
# served 0.98-1.01x there (H200, run S18, docs/benchmarks.md)
HOLD_US = 1000.0
# an exploring sample whose gate ran out (the host took longer than HOLD_US to issue the
# call; the backend's GateRelease.expired says so) may have been read past its gate: the
# start event fired, and the device waited for the host's late kernels inside the pair.
# Its reading may hold up to the issuing's excess over the hold. Where that excess is over
# PAST_GATE_SHARE of the reading, and the issuing over PAST_GATE_ISSUE times the variant's
# least recent issuing (a variant that issues slowly by nature, e.g. one that synchronises,
# always outlasts the hold), the sample is dropped and the candidate's turn is given again,
# at most PAST_GATE_RETRIES times per candidate in one exploration (then its samples count
# as read). On an H100 (thirty-seventh session, no pack) a cold decode's exploring samples
# read 2-5x their device times (SDPA from CuPy: median 0.93, least 0.16 ms; its issuing
# 46-2,178 us) and the class committed flash2_ksplit_mma at 2.76x the best
PAST_GATE_SHARE = 0.05
PAST_GATE_ISSUE = 2.0
PAST_GATE_RETRIES = 2
# a call's host issuing, where the device waited for it, is charged as the least of the
# last ISSUE_WINDOW issuings of its variant on inputs of its kind, the window seeded by the
# least of ISSUE_SEED_RUNS back-to-back plain runs on its first exploring turns (ISSUE_SEEDS):
# configs of one variant issue alike, and an exploring sample's issuing only ever reads
# high (a collection, a page fault, the turn after another candidate's kernels): run S24's
# split-KV samples read 0.025-0.054 ms for 0.025 of device time; run S31's cuBLAS issued
# in 141-694 us while exploring, in 50 us called back to back (CuPy arrays; tensors:
# 78-170 against 26 us), so a median of its few samples committed our kernels at 2-4x
# cuBLAS's time
ISSUE_WINDOW = 32
# the seed's runs (after the turn's untimed first call): a library's first calls of a shape
# still pay its heuristics. Run S72 (H200, CuPy arrays) issued cuBLAS's calls 2 to 8 of a
# shape in 80-155, 23-32, then 16-23 us, against 17-19 us held: two runs seeded 23-32 us
ISSUE_SEED_RUNS = 5
# a compiled kernel's issuings are pooled with those of every kernel of its op launched
# with the same arguments (issue_family): the backend's launcher for an argument list does
# the same host work whatever the kernel, and a window of its own per variant read noise
# as differences. On the H200 (run S172) same-argument kernels' windows read 7.5-32 us
# apart (softmax R=64 C=32000: block_row 26.2, reg_row 19.0, reg_row_cs 31.6 us in one
# class; split-KV decodes: splitkv2_mma 10.7-15.2 against splitkv_mma 13.3-19.2) and the
# decode stream's busiest input committed splitkv2_mma at 1.07-1.08x splitkv_mma, the
# faster kernel by device time. Kernels launched with other arguments (8 against 15 on
# attention: 7.6-7.8 against 12.2-15.5 us on the H100, S171) and library calls keep their
# own
# the window is seeded in the first ISSUE_SEEDS input classes of its kind where the variant
# is explored (its first config's first turn in each), not in the first alone: one seed
# read at a bad moment stays the least of the window, as the samples only ever read
# higher. Runs S120 and S121 (H200, CuPy arrays) seeded cuBLAS at 16-32 us in selection's
# streams against 20 us for a pinned call and 8.5-15 us for our kernels, and a 31.6 us
# seed committed tc_wide at 1.34x cuBLAS's time on decode-heavy's gemm M=16 N=K=2048 (S121)
ISSUE_SEEDS = 3
# how a host-bound class's call is charged its issuing (Dispatcher.issue_charge):
#  - "sum" (the default): its gated samples' device time plus the whole issuing (a caller
#    that waits for each call: the device then runs after the host has issued);
#  - "max": the larger of the two (a caller that issues call after call: the host's
#    issuing of one call overlaps the device's run of the one before);
#  - "regime": "sum" where the class's samples mostly found the device waiting, and the
#    larger of the two where it was busy (a stream interleaving inputs keeps the device busy
#    with the call before, yet a small kernel's issuing is the longer);
#  - "measured": exploring samples timed by an ungated event pair on the idle stream (the
#    host's latency to the launch with the device time), charged at least the issuing.
# On the H200: run S59 (gemm 2048^3 from CuPy), "sum" charged cuBLAS 0.082 ms (0.027 of
# device time) against tc_wide's 0.062 (0.048) and committed tc_wide at 1.75x cuBLAS's
# device time; run S101, "sum" charged SDPA from CuPy 103 us over its device time and
# committed flash2_mma at 0.1882 ms a synchronised call against SDPA's 0.1515. Yet
# "measured" (S104: ungated pairs read 0.3-6 ms for kernels of 0.03 ms) and "regime" (S107,
# S108: no better on the selection streams nor the mixed table, contention under a process
# load 1.194) lost to it, and "max" did in S74-S75
ISSUE_CHARGES = ("sum", "max", "regime", "measured")
# how the issuing charged is read (Dispatcher.issue_clock): "wall", the time elapsed over
# the call; "thread", the issuing thread's CPU time over it, which leaves out the moments
# it waited for the interpreter (another thread, such as the policy's background refit,
# holding it) or was descheduled. Tried for run S168's softmax R=64 C=32000, whose four
# candidates were charged 2.5-5x their device times; S172 traced that to the key charge
# (KEY_CHARGE_KEYS), and its A/B on the H200 (overall 1.028 and 1.046 on the thread clock,
# 1.037 and 1.044 on the wall) decided nothing: "wall" stays the default. The wall clock
# is what tells whether a sample was read past its gate (_past_gate) either way
ISSUE_CLOCKS = {"wall": time.perf_counter_ns, "thread": time.thread_time_ns}
# what the least issuing charged is taken over (Dispatcher.issue_floor): "window", the last
# ISSUE_WINDOW issuings of the family (its seeds among them until later issuings push them
# out); "seeded", those and the family's seeds, kept for good. A seed is read back to back
# and an exploring sample only ever reads higher, so a family explored more often than
# another loses its seed first and is charged more for the same host work. On an H100 (run
# S181, contention) flash_wgmma's family, its window full, was charged 15.1-16.3 us after
# the stream load against flash2_ksplit_mma's 8.5 us (its window 28 issuings, its seed kept),
# where a pinned launch issued in 15.0-15.8 against 13.0-14.1 us: the square causal prefill
# kept flash2_ksplit_mma at 1.30x flash_wgmma's device time, 1.16x by the caller's clock.
# On the H200 (S183, one warm machine) the A/B decided nothing: the selection's overall
# steady/oracle 1.019 "seeded" against 1.013 and 1.025 "window", the contention's
# conditions 1.012-1.029 against 1.021-1.053. "window" stays the default until an A/B on
# the H100, where the bias was seen, says otherwise
ISSUE_FLOORS = ("window", "seeded")
# a host-bound class is charged its candidates' preparation of a key per call only once
# KEY_CHARGE_KEYS keys have joined it while it explored: a decode loop meets a new cached
# length step after step (run S36), while a class of a few fixed shapes meets its other
# keys once. On the H200 (run S172) softmax R=1 and R=64 at C=32000, one class of a stream
# of 16 fixed inputs, charged reg_row 0.018-0.040 ms a call for the one key that joined
# (its preparation over the 12-odd samples explored) against block_row's 0.008-0.016,
# and committed block_row at 1.15-1.22x in three runs of four. Nor is it charged once
# its keys recur (an exploring call back to a key after another key's, _InputClass.visits):
# S172's long-burst stream, 16 fixed inputs drawn at random, charged softmax classes of
# several shapes 2.5-9 us a call for keys that kept coming back (R=2048 C=256 committed
# reg_row at 1.16x reg_warp, which its charges without them put first)
KEY_CHARGE_KEYS = 3


@dataclasses.dataclass(eq=False)
class Plan:
    """A candidate bound to one key: its prepared kernel, output allocation and conversions."""

    candidate: Candidate
    problem: Problem
    key: tuple
    run: Callable            # run(args, out) -> result in the caller's array type
    decision: Decision | None = None
    flops: float = 0.0
    bytes: float = 0.0
    floor_ms: float = 0.0    # roofline floor on this device (0: peaks unknown)
    provisional: bool = False   # run rotates through the decision's exploration list
    # set once the dispatcher no longer serves this key with this plan (revised, forgotten):
    # a caller holding the plan (see Dispatcher.plan) asks again
    stale: bool = False
    # the input class this key belongs to (its decision is shared), and the factor that
    # turns this key's times into the time of the input the class was decided on
    class_key: tuple = ()
    time_scale: float = 1.0
    # the serial of the input class this plan was bound to (None: none, a pinned launch's):
    # a sample of a plan whose class was dropped since (forget, forget_key, eviction)
    # reaches no policy state (see Dispatcher.feedback)
    epoch: int | None = None


# bumped whenever the dispatcher drops a plan (``Plan.stale``): a holder of many plans
# (:mod:`adaptive.integrations.direct`) compares one number instead of every plan's flag
revision = 0


def _dropped(plan: Plan) -> None:
    """Mark ``plan`` no longer served (its holders ask again) and count the revision."""
    global revision
    plan.stale = True
    revision += 1


@dataclasses.dataclass(eq=False)
class _InputClass:
    """One decision shared by the keys of an input class (see ``Op.class_dims``): a
    decode step with one more cached key, a prefill one token longer, reuse it instead of
    deciding again, and their sampled times advance one exploration."""

    key: tuple
    decision: Decision
    floor_ms: float                                   # of the input it was decided on
    turn: Callable = dataclasses.field(default_factory=itertools.count)
    keys: set = dataclasses.field(default_factory=set)   # exact keys served from it
    # explored candidates whose first turn (a warm-up, not a sample) the class has run
    warmed: set = dataclasses.field(default_factory=set)
    # exploring samples that found the device waiting for the host, of all of them: the
    # class's loop is host-bound when most did, and then every candidate is charged its
    # issuing, not only those whose samples happened to follow an idle moment
    waited: int = 0
    explored: int = 0
    # keys that joined the class while it explored: in a loop whose keys change call by
    # call (a decode step's new cached length), each call of a key-bound plan pays a miss
    new_keys: int = 0
    # [the key of the class's last exploring call, exploring calls of a key called before
    # that came after another key's]: a class whose keys recur serves a set of shapes, not
    # a loop of new ones (see _key_charge)
    visits: list = dataclasses.field(default_factory=lambda: [None, 0])
    # exploring samples issued per candidate in this exploration (cleared at its commit):
    # a candidate whose samples are all issued gets no further turn while they are
    # harvested (see Dispatcher._plan_for)
    issued: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # exploring samples per candidate dropped as read past their gate in this exploration
    # (cleared at its commit; see PAST_GATE_RETRIES)
    past_gate: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # what each explored candidate's samples were charged in this exploration, in a
    # host-bound class (cleared at its commit, which notes them in the key's history, see
    # _charges_note): [(device ms, issuing, new keys' preparation, charged ms), ...]
    charges: dict = dataclasses.field(default_factory=dict)
    # the issuing charged per issue_family in this exploration (cleared at its commit):
    # the family's least recent issuing when its first sample came (see Dispatcher.feedback)
    issue_held: dict = dataclasses.field(default_factory=dict)
    # this class among every class made in the process (its plans carry it: Plan.epoch)
    serial: int = dataclasses.field(default_factory=lambda: next(_CLASS_SERIALS))


_CLASS_SERIALS = itertools.count(1)


def issue_family(variant: Variant) -> str:
    """Whose host issuings ``variant``'s are pooled with (see :data:`ISSUE_WINDOW`): a
    compiled kernel's with every kernel of its op launched with the same argument list
    (``"softmax/kernels(x,out,R,C)"``: the launcher does the same host work for each), any
    other variant's (a library call, a composition) are its own (its id)."""
    if variant.language == "cuda":
        args = ",".join(str(a) for a in variant.launch.get("args", ()))
        return f"{variant.op}/kernels({args})"
    return variant.id


def _charges_note(charges: dict) -> str:
    """The key's history line for a host-bound exploration's charges: per candidate, the
    medians of what its samples were charged, of their device times, of the issuing and
    of the new keys' preparation (``_InputClass.charges``), fastest charged first. Under
    ``issue_charge`` "sum" (the default) the charge is their sum, written so; under the
    other rules the parts follow in parentheses."""
    def med(xs):
        return statistics.median(xs)

    def line(total, c, v):
        device, issuing = med([p[0] for p in v]), med([p[1] for p in v])
        keys = med([p[2] for p in v]) if any(p[2] for p in v) else None
        if all(math.isclose(p[3], p[0] + p[1] + p[2], rel_tol=1e-9) for p in v):
            return (f"{c.label} {total:.4g} = device {device:.4g} + issuing {issuing:.4g}"
                    + (f" + keys {keys:.4g}" if keys is not None else "") + f" (n={len(v)})")
        return (f"{c.label} {total:.4g} (device {device:.4g}, issuing {issuing:.4g}"
                + (f", keys {keys:.4g}" if keys is not None else "") + f"; n={len(v)})")
    rows = sorted(((med([p[3] for p in v]), c, v) for c, v in charges.items()),
                  key=lambda r: r[0])
    return ("charged (a host-bound class: the device's time with the host's issuing and "
            "new keys' preparation; medians, ms): " + "; ".join(line(*r) for r in rows))


def _issue_key(plan: Plan) -> tuple:
    """Whose window of issuings ``plan``'s call joins: its variant's :func:`issue_family`
    on inputs of its kind."""
    return issue_family(plan.candidate.variant), plan.problem.kind


def _window(table: dict, key: tuple) -> collections.deque:
    """``table[key]``, the recent measurements of one variant on inputs of one kind (at
    most :data:`ISSUE_WINDOW`), made empty on first use."""
    recent = table.get(key)
    return recent if recent is not None else table.setdefault(
        key, collections.deque(maxlen=ISSUE_WINDOW))


def _plan_runner(fn, alloc, adapter, out_sig, op: str = "", returns: bool = False):
    """Specialise the per-call closure once, so a hit does no branching on set-up facts.

    ``returns``: ``fn(args, out)`` returns the result and allocates it itself when ``out``
    is None (torch entries: the allocation torch makes anyway, not one more)."""
    out_type = out_sig[0]
    sign = arrays.out_signer(out_type)   # bound once: the type test guards it
    if returns:
        def run_returning(args, out):
            if out is not None and (type(out) is not out_type or sign(out) != out_sig):
                raise _bad_out(out, out_sig, op)
            return fn(args, out)
        return run_returning
    if adapter is None:
        def run(args, out):
            if out is None:
                out = alloc()
            elif type(out) is not out_type or sign(out) != out_sig:
                raise _bad_out(out, out_sig, op)
            fn(args, out)
            return out
        return run
    to_native, from_native = adapter

    def run_converted(args, out):
        native = tuple(a if hasattr(type(a), "signature") else to_native(a) for a in args)
        result = alloc()
        fn(native, result)
        result = from_native(result, args[-1])
        if out is None:
            return result
        if arrays.out_signer(type(out))(out) != out_sig:
            raise _bad_out(out, out_sig, op)
        out[...] = result
        return out
    return run_converted


def _bad_out(out, expected_sig, op: str = "") -> Exception:
    try:
        got = arrays.info(out)
    except InputTypeError:
        return InputTypeError(f"{op}: out must be an array like the inputs, got "
                              f"{type(out).__name__}")
    if arrays.out_signer(type(out))(out) is None:
        return InputValueError(f"{op}: out is read-only; pass a writeable array of shape "
                               f"{expected_sig[1]}, dtype {expected_sig[2]}")
    return InputValueError(f"{op}: out has shape {got.shape}, dtype {got.dtype}, "
                           f"contiguous={got.contiguous}; expected shape {expected_sig[1]}, "
                           f"dtype {expected_sig[2]}, C-contiguous, same array type as inputs")


def _run_plan(plan: Plan, args, out):
    return plan.run(args, out)


class Recorder:
    """A per-dispatcher hook (:meth:`Dispatcher.add_recorder`): the one way to watch a
    dispatcher's launches and timings (the counter log, metrics and the regeneration
    service each install one).

    ``wraps_launches``: the recorder runs each non-sampled launch instead of the plan
    (``__call__(plan, args, out)``, which must call ``self._next(plan, args, out)`` or,
    when ``self._direct``, may call ``plan.run`` itself); recorders chain, newest first.
    :meth:`timed` sees every timing the policy gets (sampled and exploring calls)."""

    wraps_launches = True

    def __init__(self):
        self._inner: Recorder | None = None
        self._next = _run_plan
        self._direct = True

    @property
    def inner(self) -> Recorder | None:
        """The next recorder of the chain (None: this one runs the plan)."""
        return self._inner

    @inner.setter
    def inner(self, recorder: Recorder | None) -> None:
        self._inner = recorder
        # its bound ``__call__``: calling an instance goes through the type's call slot,
        # about 30 ns more a launch than a bound method (CPython 3.11)
        self._next = _run_plan if recorder is None else recorder.__call__
        self._direct = recorder is None

    def __call__(self, plan: Plan, args, out):
        return self._next(plan, args, out)

    def timed(self, plan: Plan, time_ms: float) -> None:
        """A measured time of ``plan`` (ms): what :meth:`Dispatcher.feedback` gets."""


class Dispatcher:
    """Chooses and runs variants for one backend and device.

    Args:
        backend: "auto" (cuda where a GPU is present, else host), "cuda" or "host", or a
            backend instance.
        device: CUDA device ordinal (cuda backend only).
        policy: how a miss is decided: a name (``"learned"``,
            :class:`~adaptive.policy.learned.Learned`; ``"measure-each"``,
            :class:`~adaptive.policy.MeasureEach`) or a policy instance; default from
            ``ADAPTIVE_POLICY``.
        registry: the variants to choose from (default: the process's shared registry,
            built-in + ``ADAPTIVE_VARIANT_PATH`` + loaded packs). The dispatcher joins it:
            rows and observers given to the registry reach it.

    Making a dispatcher reads no file and starts no thread: the packs installed at
    start-up, ``ADAPTIVE_COUNTER_LOG`` and ``ADAPTIVE_REGEN`` are applied by
    :func:`adaptive.runtime.start` (which ``adaptive.launch`` calls for its default
    dispatchers; call it yourself to give a dispatcher you made the same start).

    Example:
        >>> d = Dispatcher(backend="host")
        >>> c = d.launch("gemm", a, b)
    """

    def __init__(self, backend: str | Backend = "auto", device: int | None = None,
                 policy: str | Policy | None = None, registry: Registry | None = None):
        self.backend = backend if isinstance(backend, Backend) else get_backend(backend, device)
        self.registry = registry if registry is not None else shared_registry()
        if policy is None or isinstance(policy, str):
            policy = make_policy(config.get().policy if policy is None else policy)
        elif isinstance(policy, type) or not isinstance(policy, Policy):
            raise InputTypeError(f"policy must be a name ({', '.join(POLICIES)}) or a policy "
                                 f"instance such as adaptive.Learned() (write your own by "
                                 f"subclassing adaptive.policy.BasePolicy), got {policy!r}")
        self.policy = policy
        self.limits = self.backend.limits()
        self._issue_charge = "sum"
        self.issue_charge = config.get().issue_charge   # checked: ADAPTIVE_ISSUE_CHARGE
        self._issue_clock, self._issue_now = "wall", time.perf_counter_ns
        self.issue_clock = config.get().issue_clock     # checked: ADAPTIVE_ISSUE_CLOCK
        self._plans: dict[tuple, Plan] = {}
        self._pinned: dict[tuple, Plan] = {}
        self._prepared: dict[tuple, Plan] = {}
        # variant id -> (the variant, its configs for this device, id(config) -> its
        # candidate): a miss lists the configs by the input's requirements, and the
        # candidates are made once
        self._configs: dict[str, tuple] = {}
        self._classes: dict[tuple, _InputClass] = {}
        self.plan_cache_size = max(1, config.get().plan_cache_size)
        self._referenced: set = set()      # keys sampled since the clock last passed them
        self._lock = threading.RLock()
        self._tick = itertools.count(1)
        self._sample_rng = random.Random(0)  # where in each block of calls the sample falls
        self._recorder: Recorder | None = None       # the launch chain's head
        self._head = None                            # its bound __call__ (see Recorder.inner)
        self._recorders: tuple[Recorder, ...] = ()   # every installed recorder
        self._timer = None                 # CUDA events for sampled calls (made on first use)
        self._timer_tried = False
        self._issued: dict[tuple, collections.deque] = {}   # see ISSUE_WINDOW
        self._seeds: dict[tuple, set] = {}   # the classes that seeded each window
        self._seed_ms: dict[tuple, float] = {}   # each window's least seed (see issue_floor)
        self._issue_floor = "window"
        self.issue_floor = config.get().issue_floor     # checked: ADAPTIVE_ISSUE_FLOOR
        self._preps: dict[tuple, collections.deque] = {}    # see _key_charge
        self.sample_every = config.get().sample_every
        self.stats = {"misses": 0, "samples": 0, "plan_evictions": 0, "samples_past_gate": 0}
        # the newest misses of each kind (:meth:`recent_misses`): what a serving window paid
        # for. Apart, so that a flood of cheap class misses (a decode's growing key length)
        # does not push out the decisions
        self._miss_log = {how: collections.deque(maxlen=MISS_LOG)
                          for how in ("decided", "class")}
        # whether a new input class is decided off the calling thread. True/False: this
        # dispatcher's choice; None: ADAPTIVE_DECIDE_OFF_THREAD's (read on each miss) where
        # calls are timed by device events (a GPU). On the host a call is CPU work timed by
        # the wall clock, which a decide running beside it would disturb
        self.decide_off_thread: bool | None = None
        # experimental variants among the candidates (ADAPTIVE_EXPERIMENTAL_VARIANTS): by
        # default they run only where named (a pinned launch)
        self.experimental_variants = config.get().experimental_variants
        # such decides: the queue, its worker (None when idle: started by a submit, it
        # ends when the queue is empty) and what it did
        self._decide_cv = threading.Condition(threading.Lock())
        self._decide_jobs: collections.deque = collections.deque()
        self._decider: threading.Thread | None = None
        self._decide_log: collections.deque = collections.deque(maxlen=MISS_LOG)
        self._feedback_lock = threading.Lock()   # see feedback; taken before self._lock
        self.registry.join(self)   # the registry's rows and observers (in memory)

    # ---- hot path ---------------------------------------------------------------------------
    # ``_plain``: no sampling and no recorder, so a hit runs the plan directly (one test)
    @property
    def sample_every(self) -> int:
        """Time one launch in this many for the policy (0: never): one in each block of
        this many calls, at a pseudo-random place in the block."""
        return self._sample_every

    @sample_every.setter
    def sample_every(self, every: int) -> None:
        self._sample_every = every
        self._plain = not every and self._recorder is None
        self._block = next(self._tick)      # the next block of calls starts after this one
        self._next_sample = self._block + 1 + self._sample_rng.randrange(max(every, 1))

    def _schedule_sample(self) -> None:
        """The next sampled call: in the next block of ``sample_every`` calls, at a
        pseudo-random offset. A fixed place (every 64th call) would meet the same key
        forever in a loop whose launches repeat with a period sharing a factor with the
        interval: a decode step of 8 launches would have only its first launch timed, and
        no drift, re-validation or deferred exploration would ever reach the others."""
        every = self._sample_every
        self._block += every
        self._next_sample = self._block + 1 + self._sample_rng.randrange(every)

    @property
    def recorder(self) -> Recorder | None:
        """The head of the launch-recording chain (None: launches run their plan)."""
        return self._recorder

    def _set_head(self, recorder: Recorder | None) -> None:
        self._recorder = recorder
        self._head = None if recorder is None else recorder.__call__
        self._plain = not self._sample_every and recorder is None

    @property
    def recorders(self) -> tuple[Recorder, ...]:
        """The installed recorders (:meth:`add_recorder`)."""
        return self._recorders

    def add_recorder(self, recorder: Recorder) -> None:
        """Install ``recorder``: it sees every timing (``timed``), and, when it
        ``wraps_launches``, runs each launch in front of those installed before it."""
        with self._lock:
            if recorder in self._recorders:
                return
            if recorder.wraps_launches:
                recorder.inner = self._recorder
                self._set_head(recorder)
            self._recorders = (*self._recorders, recorder)

    def remove_recorder(self, recorder: Recorder) -> None:
        """Take ``recorder`` out (wherever it is in the chain)."""
        with self._lock:
            if recorder not in self._recorders:
                return
            self._recorders = tuple(r for r in self._recorders if r is not recorder)
            if not recorder.wraps_launches:
                return
            if self._recorder is recorder:
                self._set_head(recorder.inner)
                return
            r = self._recorder
            while r is not None:
                if r.inner is recorder:
                    r.inner = recorder.inner
                    return
                r = r.inner

    def launch(self, op: str, *args, out=None, variant: str | None = None,
               config: Mapping | None = None, **params):
        """Run ``op`` on ``args`` with the best known candidate; see :func:`adaptive.launch`."""
        if variant is None and config is None:
            return self.run(op, args, out, params)
        if config is not None and not isinstance(config, Mapping):
            raise InputTypeError(f"config must be a mapping such as {{'threads': 2}}, got "
                                 f"{type(config).__name__} {config!r}")
        o = OPS.get(op) or get_op(op)
        key = o.key(args, params)
        if not isinstance(variant, (str, type(None))):   # config was checked above
            raise InputTypeError(f"{op}: variant= must be a variant name and config= a "
                                 f"mapping, got {type(variant).__name__} and "
                                 f"{type(config).__name__}")
        # config items in the caller's order: another order is one more entry, same plan
        pkey = (key, variant, tuple(config.items()) if config else None)
        try:
            plan = self._pinned.get(pkey)
        except TypeError:   # an unhashable param or config value: validation names it
            plan = None
        if plan is None:
            plan = self._pinned_plan(o, key, args, params, variant, config)
        if self._plain:
            return plan.run(args, out)
        return self._execute(plan, args, out)

    def run(self, op: str, args: tuple, out, params: dict):
        """The hot path with arguments already packed (what ``launch`` calls)."""
        o = OPS.get(op) or get_op(op)
        key = o.key(args, params)
        try:
            plan = self._plans.get(key)
        except TypeError:      # an unhashable parameter (free when there is none)
            o.problem(args, params)   # raises the error naming op and parameter
            raise
        if plan is None:
            plan = self._miss(o, key, args, params)
        if self._plain:
            return plan.run(args, out)
        # _execute written out: one Python frame less a launch (~40 ns on CPython 3.11)
        if self._sample_every and next(self._tick) >= self._next_sample:
            self._schedule_sample()
            return self._sampled(plan, args, out)
        head = self._head
        if head is not None and not plan.provisional:
            return head(plan, args, out)
        return plan.run(args, out)

    def _execute(self, plan: Plan, args: tuple, out):
        if self._sample_every and next(self._tick) >= self._next_sample:
            self._schedule_sample()
            return self._sampled(plan, args, out)
        head = self._head
        if head is not None and not plan.provisional:   # exploring calls reach listeners
            return head(plan, args, out)                 # when timed
        return plan.run(args, out)

    # ---- miss path --------------------------------------------------------------------------
    def _miss(self, op: Op, key: tuple, args, params) -> Plan:
        problem = op.problem(args, params)
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                return plan
            t0 = time.perf_counter()
            ckey = (op.name, op.class_dims(problem), problem.dtype, problem.kind,
                    problem.device, problem.params, problem.extra)
            cls = self._classes.get(ckey)
            roofline = self._roofline(op, problem)
            floor = roofline[2]
            if cls is not None and not _serves(cls.decision, problem):
                ckey = ckey + (key,)   # the class's choice cannot run here: decide alone
                cls = self._classes.get(ckey)
            decided = cls is None
            decide_ms = policy_ms = listing_ms = 0.0
            if cls is None:
                waits = self._device_waits(self.backend.stream_ptr(problem.kind))
                t_list = time.perf_counter()
                candidates = self._candidates(op, problem)
                listing_ms = (time.perf_counter() - t_list) * 1e3
                ctx = Context(op, problem, ckey, functools.partial(
                    self._measure, op, problem, key, args, charge_issue=waits),
                    self.backend.peaks,
                    self.backend.device_state, self.limits, floor=floor,
                    charge=self.miss_charge(problem, waits))
                stand_in = self._stand_in(ctx, candidates)
                if stand_in is not None:
                    decision = Decision(stand_in[0], (
                        f"deciding among {len(candidates)} candidates off the calling "
                        f"thread; {stand_in[0].label} ({stand_in[1]}) serves meanwhile, "
                        f"untimed"), pending=True)
                    cls = self._classes[ckey] = _InputClass(ckey, decision, floor)
                    self._submit_decide(cls, ctx, candidates, t0)
                else:
                    t1 = time.perf_counter()
                    decision = self.policy.decide(ctx, candidates)
                    policy_ms = (time.perf_counter() - t1) * 1e3
                    decision = dataclasses.replace(decision, tuning_ms=decision.tuning_ms or (
                        time.perf_counter() - t0) * 1e3)
                    cls = self._classes[ckey] = _InputClass(ckey, decision, floor)
                    self.stats["decisions"] = self.stats.get("decisions", 0) + 1
                decide_ms = (time.perf_counter() - t0) * 1e3
            # only the candidate that runs now is prepared: the other explored ones are
            # prepared on their first turn, so the first result pays for one
            scale = cls.floor_ms / floor if floor > 0 and cls.floor_ms > 0 else 1.0
            t_prep = time.perf_counter()
            first = self._prepare(op, problem, key, _first_of(cls.decision), args[-1],
                                  ckey, scale, roofline, exploring=bool(cls.decision.explore),
                                  epoch=cls.serial)
            prepare_ms = (time.perf_counter() - t_prep) * 1e3
            plan = (self._pending_plan(cls.decision, first) if cls.decision.pending else
                    self._plan_for(cls.decision, first, cls.turn, cls.warmed, cls.issued,
                                   cls.visits))
            self._plans[key] = plan
            if not decided and cls.decision.explore:
                cls.new_keys += 1
            cls.keys.add(key)
            self.stats["misses"] += 1
            how = "decided" if decided else "class"
            self._miss_log[how].append((time.time(), op.name, problem.describe(), how,
                                        (time.perf_counter() - t0) * 1e3, decide_ms,
                                        policy_ms, listing_ms, prepare_ms))
            if len(self._plans) > self.plan_cache_size:
                self._evict()
            log.debug("miss %s -> %s (%s)", key, cls.decision.candidate.label,
                      cls.decision.reason)
        return plan

    def _stand_in(self, ctx: Context, candidates: Sequence[Candidate]
                  ) -> tuple[Candidate, str] | None:
        """The policy's stand-in for a new input class decided off the calling thread (see
        ``Policy.stand_in``), or None where the miss decides it: off-thread decides
        switched off (by default, on the host: see ``decide_off_thread``), or a policy
        without one (measure-each runs every candidate)."""
        off = self.decide_off_thread
        if off is None:
            off = config.get().decide_off_thread and self._event_timer() is not None
        return self.policy.stand_in(ctx, candidates) if off else None

    def _pending_plan(self, decision: Decision, first: Plan) -> Plan:
        """The plan of a key whose class is being decided off the calling thread: the
        policy's stand-in (``first``), untimed, reaching the recorders as a plain call;
        provisional, so that callers holding plans (the integrations) keep coming back."""
        def serve(args, out):
            head = self._head
            return first.run(args, out) if head is None else head(first, args, out)
        return dataclasses.replace(first, decision=decision, run=serve, provisional=True)

    def _submit_decide(self, cls: _InputClass, ctx: Context, candidates, t0: float) -> None:
        """Queue ``cls``'s decide for the worker thread, starting it if idle."""
        with self._decide_cv:
            self._decide_jobs.append((cls, ctx, tuple(candidates), t0))
            if self._decider is None:
                self._decider = threading.Thread(target=self._decide_queued, daemon=True,
                                                 name="adaptive-decide")
                self._decider.start()

    def _decide_queued(self) -> None:
        """The worker: decide the queued classes in order, then end. A failure past the
        policy's decide (handing the decision to the keys) commits the class to its
        stand-in, says why, and the worker goes on: no class stays pending."""
        while True:
            with self._decide_cv:
                if not self._decide_jobs:
                    self._decider = None
                    self._decide_cv.notify_all()
                    return
                cls, ctx, candidates, t0 = self._decide_jobs.popleft()
            try:
                self._decide_one(cls, ctx, candidates, t0)
            except Exception as exc:  # noqa: BLE001 (a bug here must not leave it pending)
                log.exception("handing %s its decision failed; %s, its stand-in, serves it",
                              ctx.problem.describe(), cls.decision.candidate.label)
                with self._lock:
                    if self._classes.get(cls.key) is cls:
                        cls.decision = _stand_in_kept(cls, "handing the decision to its "
                                                      "keys failed", exc)
                        for key in cls.keys:   # their next calls plan from that decision
                            plan = self._plans.pop(key, None)
                            if plan is not None:
                                _dropped(plan)
                        cls.keys.clear()

    def _decide_one(self, cls: _InputClass, ctx: Context, candidates, t0: float) -> None:
        """Decide ``cls`` (queued at ``t0``) and hand the decision to its keys."""
        t1 = time.perf_counter()
        try:
            decision = self.policy.decide(ctx, candidates)
        except Exception as exc:  # noqa: BLE001 (the class stays served, and says why)
            log.exception("deciding %s off the calling thread failed; %s serves it",
                          ctx.problem.describe(), cls.decision.candidate.label)
            decision = _stand_in_kept(cls, "the policy's decide failed", exc)
        done = time.perf_counter()
        decision = dataclasses.replace(
            decision, tuning_ms=decision.tuning_ms or (done - t1) * 1e3)
        with self._lock:
            if self._classes.get(cls.key) is not cls:   # forgotten meanwhile
                return
            self.stats["decisions"] = self.stats.get("decisions", 0) + 1
            self._decide_log.append((time.time(), ctx.op.name, ctx.problem.describe(),
                                     (done - t1) * 1e3, (done - t0) * 1e3))
            self._revise(cls.key, decision)

    def off_thread_decides(self, since: float = 0.0) -> list[dict]:
        """The newest input classes decided off the calling thread (at most
        :data:`MISS_LOG`), oldest first, since ``since`` (``time.time()`` at the end):
        the op and input, the policy's decide (``policy_ms``) and the time from the miss
        to the decision (``wait_ms``: the calls between were served by the stand-in)."""
        return [{"time_s": t, "op": op, "input": what, "policy_ms": round(policy_ms, 3),
                 "wait_ms": round(wait_ms, 3)}
                for t, op, what, policy_ms, wait_ms in list(self._decide_log) if t >= since]

    def _roofline(self, op: Op, problem: Problem) -> tuple[float, float, float]:
        """``(flops, bytes, floor_ms)`` of ``problem`` here, computed once per miss (the
        floor is 0 where the peaks cannot be had: times are not scaled within a class)."""
        flops, nbytes = op.roofline(problem)
        try:
            return flops, nbytes, floor_ms(flops, nbytes, self.backend.peaks(), problem.dtype)
        except Exception:  # noqa: BLE001 (no peaks: no floor)
            return flops, nbytes, 0.0

    def _evict(self) -> None:
        """Bring the plan cache back to its bound (caller holds the lock): the oldest plan
        goes, unless it was sampled since the clock last passed it (then it moves to the
        back, its bit cleared); its prepared candidates go with it, and a policy with a
        ``forget_key(key)`` method is told, so it can drop its own state of the key."""
        plans, referenced = self._plans, self._referenced
        forget = self.policy.forget_key
        while len(plans) > self.plan_cache_size:
            key = next(iter(plans))
            plan = plans.pop(key)
            if key in referenced:
                referenced.discard(key)
                plans[key] = plan
                continue
            self.stats["plan_evictions"] += 1
            decision = plan.decision
            if decision is not None:
                for c in (decision.candidate, *decision.explore):
                    self._prepared.pop((key, c), None)
            self._prepared.pop((key, plan.candidate), None)
            cls = self._classes.get(plan.class_key)
            if cls is not None:
                cls.keys.discard(key)
                if not cls.keys:   # the class's last key: its decision and state go too
                    del self._classes[plan.class_key]
                    forget(plan.class_key)
        if len(referenced) > self.plan_cache_size:   # keys of pinned or forgotten plans
            referenced.intersection_update(plans)   # (so at most the bound + 1 between misses)

    @staticmethod
    def _trim(table: dict, bound: int) -> int:
        """Drop the oldest entries of ``table`` down to ``bound``; how many went."""
        n = len(table) - bound
        for k in list(itertools.islice(table, max(n, 0))):
            del table[k]
        return max(n, 0)

    def _candidates(self, op: Op, problem: Problem, variants: list[Variant] | None = None):
        scope = problem.scope()
        out = []
        pool = variants if variants is not None else self.registry.variants(
            op.name, self.backend.name, self.experimental_variants)
        unavailable = {}
        for v in pool:
            if v.needs:
                unavailable[v.name] = optional.missing(v.needs, f"variant {v.id}")
                if unavailable[v.name] is not None:
                    continue
            _, configs, made = self._made(v)
            out += [made[id(c)] for c in v.fitting(scope, configs)]
        if not out:
            if variants is not None and len(pool) == 1 and unavailable.get(pool[0].name):
                raise unavailable[pool[0].name]   # a pinned variant whose module is missing
            why = "; ".join(f"{v.name}: " + str(unavailable.get(v.name) or v.why_not(scope)
                                                or "no config fits this device")
                            for v in pool) or "no variants registered"
            raise NoCandidateError(f"no {self.backend.name} variant of {op.name} fits "
                                   f"{dict(problem.dims)} {problem.dtype} ({why})")
        return out

    def _made(self, v: Variant) -> tuple:
        """(v, its configs on this device, its candidates by id(config)), made once."""
        cached = self._configs.get(v.id)
        if cached is None or cached[0] is not v:   # (a variant replaced under its id)
            configs = v.space.configs(self.limits)
            cached = self._configs[v.id] = (v, configs, {id(c): make_candidate(v, c)
                                                         for c in configs})
        return cached

    def prepare_candidates(self, ops: Iterable[str] | None = None) -> int:
        """Make every variant's candidates on this device now (``ops``: those ops' only),
        with their labels, as the first miss of each op otherwise does: on the H200's host
        1-3 ms of that op's first result (attention has 205 configs). Variants whose
        optional modules are missing are left to their miss, which says so. Returns the
        number of candidates made; :func:`adaptive.runtime.start` calls it."""
        from adaptive.ops import OPS
        names = list(OPS) if ops is None else list(ops)
        n = 0
        with self._lock:
            for op in names:
                for v in self.registry.variants(op, self.backend.name,
                                                self.experimental_variants):
                    if v.needs and optional.missing(v.needs, f"variant {v.id}") is not None:
                        continue
                    for c in self._made(v)[2].values():
                        c.label          # noqa: B018 (computed once, kept on the candidate)
                        n += 1
        return n

    def _prepare(self, op: Op, problem: Problem, key: tuple, candidate: Candidate,
                 like, class_key: tuple = (), time_scale: float = 1.0,
                 roofline: tuple[float, float, float] | None = None,
                 exploring: bool = False, epoch: int | None = None) -> Plan:
        """The plan of ``candidate`` on ``key`` (prepared once: compiled, loaded, its
        output allocation set). ``exploring``: a candidate prepared to be explored, whose
        preparation time (a compile, a module load) the policy charges to exploring.
        ``epoch``: the serial of the class ``class_key`` names (see ``Plan.epoch``)."""
        pkey = (key, candidate)
        plan = self._prepared.get(pkey)
        if plan is None:
            t0 = time.perf_counter()
            for module in candidate.variant.needs:   # once, under one lock, never on a hit
                optional.require(module, f"variant {candidate.variant.id}")
            fn = self.backend.prepare(candidate, problem, op)
            io = self.backend.io(candidate, problem, op.out_shape(problem), like)
            alloc, adapter = io.alloc, io.adapter
            sample = alloc() if adapter is None else adapter[1](alloc(), like)
            out_sig = arrays.signature(sample)
            flops, nbytes, floor = roofline or self._roofline(op, problem)
            run = _plan_runner(fn, alloc, adapter, out_sig, op.name, io.returns)
            plan = Plan(candidate, problem, key, run, flops=flops, bytes=nbytes,
                        floor_ms=floor, class_key=class_key or key, time_scale=time_scale,
                        epoch=epoch)
            self._prepared[pkey] = plan
            _window(self._preps, (candidate.variant.id, problem.kind)).append(
                (time.perf_counter() - t0) * 1e3)   # see _key_charge
            if len(self._prepared) > 4 * self.plan_cache_size:   # measure-each prepares many
                self._trim(self._prepared, 4 * self.plan_cache_size)
            if exploring:
                self.policy.charge_exploration(time.perf_counter() - t0)
        elif class_key:   # prepared to be measured or pinned, first
            plan = self._in_class(pkey, class_key, time_scale, epoch)
        return plan

    def _in_class(self, pkey: tuple, class_key: tuple, time_scale: float,
                  epoch: int | None) -> Plan | None:
        """The prepared plan ``pkey`` (a key and a candidate) bound to the input class
        ``class_key`` with its key's ``time_scale``, so that its samples are the class's;
        None where it was never prepared. A plan prepared outside the class (a pinned
        launch's is bound to its own key) and reused by the class as it was sent its
        samples to no class, and a class exploring candidates timed pinned first never
        committed (run S100: 2:4 weights whose kernels the benchmark had timed pinned,
        600 calls). ``epoch``: the class's serial (a class made again for the key after its
        eviction binds the key's prepared plans anew)."""
        plan = self._prepared.get(pkey)
        if plan is not None and (plan.class_key != class_key or plan.epoch != epoch
                                 or plan.time_scale != time_scale):
            plan = self._prepared[pkey] = dataclasses.replace(
                plan, class_key=class_key, time_scale=time_scale, epoch=epoch)
        return plan

    @property
    def issue_charge(self) -> str:
        """How a host-bound class's call is charged its host issuing: ``"sum"`` (device
        time plus issuing, the default), ``"max"`` (the larger), ``"regime"`` ("sum" where
        the class's device waited, the larger of the two where it was busy) or
        ``"measured"`` (samples timed ungated on an idle stream, the host's latency to the
        launch included, charged at least the issuing); see :data:`ISSUE_CHARGES`. The
        default comes from ``ADAPTIVE_ISSUE_CHARGE``."""
        return self._issue_charge

    @issue_charge.setter
    def issue_charge(self, rule: str) -> None:
        if rule not in ISSUE_CHARGES:
            raise InputValueError(f"issue_charge {rule!r}; expected one of {ISSUE_CHARGES} "
                                  "(Dispatcher.issue_charge, or ADAPTIVE_ISSUE_CHARGE)")
        self._issue_charge = rule

    @property
    def issue_clock(self) -> str:
        """How the host's issuing of an exploring sample is read for its charge:
        ``"wall"`` (the time elapsed over the call, the default) or ``"thread"`` (the
        issuing thread's CPU time over it: waits for the interpreter, which a background
        refit holds, are not counted); see :data:`ISSUE_CLOCKS`. The default comes from
        ``ADAPTIVE_ISSUE_CLOCK``."""
        return self._issue_clock

    @issue_clock.setter
    def issue_clock(self, clock: str) -> None:
        if clock not in ISSUE_CLOCKS:
            raise InputValueError(f"issue_clock {clock!r}; expected one of "
                                  f"{tuple(ISSUE_CLOCKS)} (Dispatcher.issue_clock, or "
                                  "ADAPTIVE_ISSUE_CLOCK)")
        self._issue_clock, self._issue_now = clock, ISSUE_CLOCKS[clock]

    @property
    def issue_floor(self) -> str:
        """What the least issuing charged to a host-bound class's sample is taken over:
        ``"window"`` (its family's last :data:`ISSUE_WINDOW` issuings, the default) or
        ``"seeded"`` (those and the family's back-to-back seeds, kept for good); see
        :data:`ISSUE_FLOORS`. The default comes from ``ADAPTIVE_ISSUE_FLOOR``."""
        return self._issue_floor

    @issue_floor.setter
    def issue_floor(self, floor: str) -> None:
        if floor not in ISSUE_FLOORS:
            raise InputValueError(f"issue_floor {floor!r}; expected one of {ISSUE_FLOORS} "
                                  "(Dispatcher.issue_floor, or ADAPTIVE_ISSUE_FLOOR)")
        self._issue_floor = floor

    def _charged(self, time_ms: float, issue_ms: float, ungated: bool = False) -> float:
        """What a call of ``time_ms`` on the device, issued in ``issue_ms`` by a host the
        device waited for, costs the caller (``issue_charge``). ``ungated``: ``time_ms``
        was read by an ungated pair on an idle stream, the host's latency to the launch
        in it: the larger of the two."""
        if issue_ms <= 0:
            return time_ms
        if ungated or self._issue_charge == "max":
            return max(time_ms, issue_ms)
        return time_ms + issue_ms

    def _ungated(self) -> bool:
        """Whether host-bound samples are timed ungated on an idle stream (``"measured"``)."""
        return self._issue_charge == "measured"

    def _measure(self, op: Op, problem: Problem, key: tuple, args, candidate: Candidate,
                 warmup: int = 0, charge_issue: bool = False) -> float:
        """One timed run of ``candidate`` on the real input (after ``warmup`` untimed runs,
        which absorb one-time costs such as building a sparse format); ``inf`` if it fails.
        On a device the run's device time (the backend's ``device_timer``), as exploring
        samples are timed, plus, with ``charge_issue`` (the caller's device was waiting for
        the host when the miss came), the host's issuing of the run (the least over the
        warm-up runs and the timed one): what the call costs the caller's timeline (see
        :meth:`_device_waits`)."""
        try:
            plan = self._prepare(op, problem, key, candidate, args[-1])
        except Exception as exc:  # noqa: BLE001 (failures are data inside search)
            error = f"{type(exc).__name__}: {exc}"
        else:
            ungated = charge_issue and self._ungated()
            stream = self.backend.stream_ptr(problem.kind)
            # "measured": after the warm-up's synchronise the stream is idle, and an
            # ungated pair reads the host's latency to the launch with the device time
            timer = (self.backend.device_timer(stream, gated=False) if ungated
                     else self.backend.device_timer(stream))
            call, issue_ms = functools.partial(plan.run, args, None), []

            now = self._issue_now

            def issued():   # the run, and how long the host took to issue it
                t0 = now()
                call()
                issue_ms.append((now() - t0) / 1e6)
            track = (charge_issue or self._issue_charge == "regime") and timer is not None
            m = measure(issued if track else call,
                        warmup=warmup, sync=self.backend.synchronize, timer=timer)
            if not m.error:   # the least issuing of the runs: one collection or page
                # fault in the timed run would otherwise be charged to the candidate
                if not charge_issue and issue_ms:   # "regime", the device busy: the larger
                    return max(m.samples_ms[0], min(issue_ms))
                return self._charged(m.samples_ms[0], min(issue_ms, default=0.0),
                                     ungated and timer is not None)
            error = m.error
        log.warning("candidate %s failed on %s: %s", candidate.label, problem.describe(), error)
        return math.inf

    def _pinned_plan(self, op, key, args, params, variant, config_) -> Plan:
        pkey = (key, variant, tuple(config_.items()) if config_ else None)
        if variant is None:
            raise InputValueError("config= needs variant= too (a config belongs to a variant)")
        problem = op.problem(args, params)
        v = self.registry.get(op.name, variant)
        if v.backend != self.backend.name:
            raise InputValueError(f"variant {v.id} runs on the {v.backend} backend, but this "
                                  f"dispatcher uses {self.backend.name}")
        if config_ is not None:
            cfg = v.space.check(config_, self.limits, v.name)
            why = v.why_not(problem.scope(), cfg)
            if why:
                raise InputValueError(f"variant {v.id} with config {cfg} does not fit this input "
                                      f"({dict(problem.dims)} {problem.dtype}): {why}")
            candidate = make_candidate(v, cfg)
        else:
            pool = self._candidates(op, problem, [v])
            if len(pool) == 1:
                candidate = pool[0]
            else:
                ctx = Context(op, problem, key, functools.partial(
                    self._measure, op, problem, key, args,
                    charge_issue=self._device_waits(self.backend.stream_ptr(problem.kind))),
                    limits=self.limits)
                candidate = self.policy.decide(ctx, pool).candidate
        with self._lock:
            plan = self._prepare(op, problem, key, candidate, args[-1])
            self._pinned[pkey] = plan
            if len(self._pinned) > self.plan_cache_size:
                self.stats["plan_evictions"] += self._trim(self._pinned, self.plan_cache_size)
                if len(self._referenced) > self.plan_cache_size:
                    self._referenced.intersection_update(self._plans)
        return plan

    # ---- feedback ---------------------------------------------------------------------------
    def _sampled(self, plan: Plan, args, out, exploring: bool = False):
        """One timed call. ``exploring``: a sample that decides between candidates; on a
        GPU its event pair is queued behind a gate of the stream, so that it times the
        candidate's kernels and not the host's launch latency, which an idle GPU would
        otherwise add to it at random. What the policy is charged is what the call costs
        the caller's timeline: the device time where the device had work queued (the
        host's issuing overlaps it), the host's issuing of the call plus the device time
        where the device was waiting for the host (a host-bound loop; see
        :meth:`_device_waits`), judged per input class from its exploring samples (see
        :meth:`feedback`); recorders see the device time."""
        if plan.provisional:   # an exploring plan times every call itself
            return plan.run(args, out)
        self._referenced.add(plan.key)   # the eviction clock's second chance
        timer = self._timer if self._timer_tried else self._event_timer()
        # no collection inside an exploring sample's window: a collection of the heap a
        # torch and transformers process holds takes milliseconds, which a gated pair reads
        # past its gate's hold and the issuing reads whole (runs S104, S106: single samples
        # of 3-8 ms among kernels of 0.02-0.4 ms); the collection runs after the window
        hold_gc = exploring and gc.isenabled()
        if hold_gc:
            gc.disable()
        try:
            slot, release, waits, ungated = (
                self._start_events(timer, plan, exploring) if timer is not None
                else (None, None, False, False))
            if slot is not None:   # GPU: an event pair, read on a later call; nothing waits
                now = self._issue_now
                t0, c0 = (time.perf_counter_ns(), now()) if exploring else (0, 0)
                try:
                    result = plan.run(args, out)
                except BaseException:
                    timer.cancel(slot)
                    release()
                    raise
                try:   # tagged (plan, its issuing in ms on the wall clock and on the
                    # issue clock, whether the device waited, whether the pair was ungated
                    # on an idle stream, its gate's release): see harvest
                    timer.stop(slot, (plan, ((time.perf_counter_ns() - t0) / 1e6,
                                             (now() - c0) / 1e6), waits, ungated, release)
                               if exploring else (plan, (0.0, 0.0), None, False, None))
                except Exception as exc:  # noqa: BLE001 (the timer broke, not the launch)
                    self._events_failed(exc)
                release()
                self.stats["samples"] += 1
                return result
        finally:
            if hold_gc:
                gc.enable()
        result = None

        def call():
            nonlocal result
            result = plan.run(args, out)
        time_ms = measure(call, sync=self.backend.synchronize, raise_errors=True).samples_ms[0]
        self.stats["samples"] += 1
        self.feedback(plan, time_ms)
        return result

    def _start_events(self, timer, plan: Plan, hold: bool = False):
        """Harvest finished pairs and start one for ``plan``: ``(slot, release, waits,
        ungated)``, release to be called once the pair's end is recorded, ``waits``: the
        device was waiting for the host before the gate (``(None, None, False, False)``:
        the timer broke and this call is timed on the host). ``hold`` (an exploring
        sample): behind a gate of the stream (the backend's ``gate``: released once the
        call and its end event are issued, at most ``HOLD_US``), so the pair reads the
        device time; or, in a host-bound class under ``issue_charge`` "measured", on the
        stream made idle (waited for, if a call before it still runs) and ungated
        (``ungated`` True), so the pair reads the host's latency to the launch with the
        device time, what a caller waiting for the call pays. Else behind nothing
        (``waits`` is then False)."""
        release = released
        try:
            self.harvest()
            stream = self.backend.stream_ptr(plan.problem.kind)
            waits = ungated = False
            if hold:
                waits = self._device_waits(stream)   # before the gate queues work
                ungated = self._ungated() and self._bound_so_far(plan.class_key, waits)
                if ungated:
                    if not waits:   # a call before it still runs (a slower candidate's)
                        self.backend.wait_stream(stream)
                else:
                    release = self.backend.gate(stream, HOLD_US)
            return timer.start(stream), release, waits, ungated
        except Exception as exc:  # noqa: BLE001 (the timer broke, not the launch)
            release()
            self._events_failed(exc)
            return None, None, False, False

    def _bound_so_far(self, class_key: tuple, waits: bool) -> bool:
        """Whether ``class_key``'s exploring samples so far mostly found the device
        waiting (:meth:`_host_bound`, not counting this one); with none yet, ``waits``."""
        cls = self._classes.get(class_key)
        if cls is None or not cls.explored:
            return waits
        return 2 * cls.waited >= cls.explored

    def _device_waits(self, stream_ptr: int) -> bool:
        """Whether ``stream_ptr`` has no queued work: the device waits for the host, so the
        host's issuing of a call is part of what the call costs (a host-bound loop, a loop
        that synchronises per call). Where the device has work queued, the
        issuing overlaps it and a call costs its device time. False where it cannot be
        told (the host backend, whose host-clock timing includes the issuing anyway)."""
        try:
            return self.backend.stream_idle(stream_ptr) is True
        except Exception as exc:  # noqa: BLE001 (a query failing costs the charge only)
            log.debug("stream query failed: %s", exc)
            return False

    def _event_timer(self):
        """The backend's event timer, made on first use (None: time on the host)."""
        with self._lock:
            if not self._timer_tried:
                try:
                    self._timer = self.backend.event_timer()
                except Exception as exc:  # noqa: BLE001 (said once; host timing then)
                    log.warning("CUDA event timing is unavailable (%s): sampled calls "
                                "are timed on the host, with a synchronise", exc)
                self._timer_tried = True
        return self._timer

    def _events_failed(self, exc: Exception) -> None:
        """An event call failed: say so once and time sampled calls on the host from now."""
        log.warning("CUDA event timing failed (%s: %s): sampled calls are timed on the host, "
                    "with a synchronise, from now on", type(exc).__name__, exc)
        self._timer = None
        self.stats["event_timing_failed"] = self.stats.get("event_timing_failed", 0) + 1

    def harvest(self) -> int:
        """Give the policy the event timings the GPU has finished; never waits. Sampled
        and exploring calls do this themselves; call it to flush after the last one."""
        timer = self._timer
        if timer is None or not timer.pending:
            return 0
        done = timer.harvest()      # an error here reaches _sampled's guard, or the caller
        for (plan, (wall_ms, issue_ms), waited, ungated, gate), time_ms in done:
            expired = getattr(gate, "expired", None)   # where the backend can tell
            self.feedback(plan, time_ms, issue_ms, waited, ungated,
                          expired is not None and expired(), issued_wall_ms=wall_ms)
        return len(done)

    def feedback(self, plan: Plan, time_ms: float, issue_ms: float = 0.0,
                 waited: bool | None = None, ungated: bool = False,
                 gate_expired: bool = False, issued_wall_ms: float | None = None) -> None:
        """Give a measured time of ``plan`` to the policy and to every listener.

        Any thread may call this (e.g. a harvester of CUDA event timings). When the policy
        answers with a new decision (commit, re-explore) the key's plan is swapped. Every
        recorder's ``timed`` sees ``time_ms`` too. ``issue_ms``: the host's issuing of
        the call (its variant's least recent issuing is charged, see :data:`ISSUE_WINDOW`,
        the one its family had at its first sample of the class's exploration);
        ``waited``: whether the device was waiting for the host when the call came (an
        exploring sample), or None (the caller's own account: ``issue_ms`` is charged as
        given). The policy is charged ``time_ms`` with the issuing (as ``issue_charge``
        says) where most exploring samples of the input class found the device waiting (a
        host-bound loop): one
        rule for every candidate of the class, not a sample's own moment (run S32:
        ``three_pass``'s samples followed a slower candidate's kernels, were charged
        nothing, and it was committed at 2.4x the best). There, a class whose calls
        bring new keys is charged each candidate's preparation of a key per call too
        (:meth:`_key_charge`). ``ungated``: ``time_ms`` was read by an ungated pair on an
        idle stream (``issue_charge`` "measured"): it holds the host's latency to the
        launch, and the call is charged the larger of it and the issuing; recorders see it
        as read. ``gate_expired``: the sample's gate ran out before the call was issued
        (the backend's ``GateRelease.expired``); the sample may then be dropped, given to
        neither the policy nor the recorders, its candidate's turn given again
        (:meth:`_past_gate`). ``issued_wall_ms``: the issuing on the wall clock where
        ``issue_ms`` was read on another (``issue_clock`` "thread"), what the gate's hold
        is set against (None: ``issue_ms``).
        """
        wall_ms = issue_ms if issued_wall_ms is None else issued_wall_ms
        if gate_expired and not ungated and self._past_gate(plan, time_ms, wall_ms):
            return
        # a plan whose class was dropped since (forget, forget_key, eviction): its sample
        # would land on the state of the class decided next; the recorders see it all the
        # same
        cls = self._classes.get(plan.class_key) if plan.epoch is not None else None
        current = plan.epoch is None or (cls is not None and cls.serial == plan.epoch)
        charged, parts = time_ms, None
        if issue_ms > 0:
            typical = self._typical_issue(plan, issue_ms)
            if current and cls is not None and cls.decision.explore:
                # one issuing per family for the whole exploration: the window's least moves
                # as issuings come and go (run S175, H100: decode_global's configs charged
                # 8.5 and 35.4 us in one class, splitkv_mma's 16.5 and 39.0, and the busiest
                # decode input committed splitkv2_mma at 1.16x splitkv_mma by a charge 15 us
                # lower, its kernel the slower)
                typical = cls.issue_held.setdefault(issue_family(plan.candidate.variant),
                                                    typical)
            if waited is None or self._host_bound(plan.class_key, waited) or ungated:
                key_ms = self._key_charge(plan)
                charged = (self._charged(time_ms, typical, ungated) + key_ms if ungated
                           else self._charged(time_ms, typical + key_ms))
                parts = (time_ms, typical, key_ms, charged)
            elif self._issue_charge == "regime":   # the device was busy: a pipelined caller
                charged = max(time_ms, typical)
        if current:
            # one sample at a time from observe to revise: two threads' samples of a class
            # otherwise revise it in the other order, the class then rotating over what an
            # older decision asked while the policy waits for what the newer one did
            with self._feedback_lock:
                if parts is not None and cls is not None and cls.decision.explore:
                    cls.charges.setdefault(plan.candidate, []).append(parts)
                update = self.policy.observe(plan.class_key, plan.candidate,
                                             charged * plan.time_scale)
                if update is not None:
                    self._revise(plan.class_key, update)
        for recorder in self._recorders:
            try:
                recorder.timed(plan, time_ms)
            except Exception:  # noqa: BLE001 (a recorder never breaks a launch)
                log.exception("recorder %r failed", recorder)

    def _past_gate(self, plan: Plan, time_ms: float, issue_ms: float) -> bool:
        """Whether an exploring sample of ``plan`` whose gate ran out, issued in
        ``issue_ms``, is dropped as read past its gate (see :data:`PAST_GATE_SHARE`): its
        possible excess over ``time_ms`` is too large, its variant does not issue that
        slowly by nature, and its candidate has retries left in the exploration. A dropped
        sample's turn is given again; it is counted in ``stats["samples_past_gate"]`` and
        noted in the key's history."""
        excess = issue_ms - HOLD_US / 1e3
        if not excess > PAST_GATE_SHARE * time_ms:
            return False
        recent = tuple(self._issue_window(plan))
        least = min(recent) if recent else 0.0
        if issue_ms <= PAST_GATE_ISSUE * least:
            return False
        cand = plan.candidate
        with self._lock:
            cls = self._classes.get(plan.class_key)
            if (cls is None or cls.serial != plan.epoch or not cls.decision.explore
                    or cls.past_gate[cand] >= PAST_GATE_RETRIES):
                return False
            cls.past_gate[cand] += 1
            cls.issued[cand] = max(0, cls.issued[cand] - 1)   # its turn comes again
            self.stats["samples_past_gate"] += 1
        self.policy.note(plan.class_key,
                         f"a sample of {cand.label} dropped, read past its gate: issued in "
                         f"{issue_ms:.3f} ms (the gate holds {HOLD_US / 1e3:g} ms, its "
                         f"variant's least recent issuing {least:.3f} ms) for {time_ms:.4f} "
                         "ms read; timed again")
        return True

    def _host_bound(self, class_key: tuple, waited: bool) -> bool:
        """Count one exploring sample of ``class_key`` (``waited``: it found the device
        waiting for the host); whether most of the class's samples so far did."""
        cls = self._classes.get(class_key)
        if cls is None:          # the class was let go meanwhile: the sample's own moment
            return waited
        with self._lock:
            cls.explored += 1
            cls.waited += waited
            return 2 * cls.waited >= cls.explored

    def _key_charge(self, plan: Plan) -> float:
        """What a new key costs ``plan``'s candidate per call of its class, in a host-bound
        loop: the least of its variant's recent preparations (on inputs of its kind; none
        charged before two are known: the first loads modules) times the class's new keys
        per exploring sample. A decode loop meets a new cached length every step: run S36
        measured 564 us a call for our split-KV kernel's plan, a miss each (its launch is
        bound to its key's shapes), against 29 us held; its samples read ~3 us below
        SDPA's, whose plan the transformers integration holds by class. The rate is read
        while the class explores: keys that stop coming after a first burst (a fixed set
        of shapes) are charged as if they kept coming, and so nothing is charged before
        :data:`KEY_CHARGE_KEYS` keys have joined (a few fixed shapes sharing a class), nor
        once an exploring call has come back to a key after another key's (the class's
        keys recur: a set of shapes, where a decode loop's lengths never come back)."""
        cls = self._classes.get(plan.class_key)
        if cls is None or cls.new_keys < KEY_CHARGE_KEYS or cls.visits[1] \
                or not cls.explored:
            return 0.0
        window = self._preps.get((plan.candidate.variant.id, plan.problem.kind))
        if window is None or len(window) < 2:
            return 0.0
        return min(tuple(window)) * min(1.0, cls.new_keys / cls.explored)

    def miss_charge(self, problem: Problem, waits: bool | None = None):
        """``charge(candidate, device_ms)`` for a miss on ``problem`` (``Context.charge``)
        where the caller's device waits for the host (``waits``; None: asked of the
        stream now), else None: what :meth:`feedback` will charge the candidates'
        samples, for the policy's ranking and :func:`adaptive.explain`'s."""
        if waits is None:
            waits = self._device_waits(self.backend.stream_ptr(problem.kind))
        return self._charge_of(problem.kind) if waits else None

    def _charge_of(self, kind: str):
        """``charge(candidate, device_ms)`` for a miss whose device waits for the host: the
        device time charged with the least recent issuing known of the candidate's variant
        on inputs of ``kind`` (as its samples will be; nothing where none is known yet,
        or under "measured", whose samples read the issuing themselves)."""
        if self._issue_charge == "measured":
            return None

        least: dict[str, float] = {}   # per family, read once a miss (~100 candidates)
        families: dict[str, str] = {}  # variant id -> its issue_family, made once a miss

        def charge(candidate, device_ms: float) -> float:
            vid = candidate.variant.id
            family = families.get(vid)
            if family is None:
                family = families[vid] = issue_family(candidate.variant)
            issue = least.get(family)
            if issue is None:
                recent = tuple(self._issued.get((family, kind), ()))
                issue = least[family] = (self._least_issue((family, kind), recent) if recent
                                         else 0.0)
            return self._charged(device_ms, issue)
        return charge

    def _typical_issue(self, plan: Plan, issue_ms: float) -> float:
        """The least of the recent issuings of ``plan``'s variant on inputs of its kind,
        ``issue_ms`` included (see :data:`ISSUE_WINDOW`; under :attr:`issue_floor`
        "seeded", of them and its seeds)."""
        key = _issue_key(plan)
        recent = _window(self._issued, key)
        recent.append(issue_ms)
        return self._least_issue(key, tuple(recent))   # a copy: a harvester may append

    def _least_issue(self, key: tuple, recent: tuple) -> float:
        """The issuing charged for the window ``key`` holding ``recent`` (see
        :attr:`issue_floor`)."""
        least = min(recent)
        if self._issue_floor == "seeded":
            least = min(least, self._seed_ms.get(key, least))
        return least

    def _issue_window(self, plan: Plan) -> collections.deque:
        """The recent issuings of ``plan``'s variant (its :func:`issue_family`) on inputs of
        its kind."""
        return _window(self._issued, _issue_key(plan))

    def issue_charges(self) -> dict[str, tuple[int, float]]:
        """The host issuing known for exploring samples so far, per variant (its
        :func:`issue_family`: compiled kernels launched with the same arguments share one)
        and input kind (``"attention/sdpa_torch/cupy"``,
        ``"softmax/kernels(x,out,R,C)/cupy"``): how many of the recent issuings are kept (at most
        :data:`ISSUE_WINDOW`, the warm-up turns' seeds among them) and the least of them in
        ms (under :attr:`issue_floor` "seeded", of them and the seeds), what the policy adds
        to their device times in a host-bound input class. Empty where nothing was
        measured (the host backend times its calls whole)."""
        windows = {key: tuple(q) for key, q in list(self._issued.items())}
        return {f"{family}/{kind}": (len(q), self._least_issue((family, kind), q))
                for (family, kind), q in windows.items() if q}

    def issue_windows_ms(self) -> dict[str, tuple[float, ...]]:
        """Each variant's (:func:`issue_family`'s) window of recent issuings in ms, oldest
        first (the seeds among them while kept): what :meth:`issue_charges` takes the least
        of."""
        return {f"{family}/{kind}": tuple(q)
                for (family, kind), q in list(self._issued.items()) if q}

    def _plan_for(self, decision: Decision, first: Plan, turn=None,
                  warmed: set | None = None,
                  issued: collections.Counter | None = None,
                  visits: list | None = None) -> Plan:
        """The plan serving a decision: plain when committed, rotating while exploring.

        ``first`` serves the decision's first candidate (:func:`_first_of`: explored, or,
        for a rotation narrowed to the candidates still short of samples, the fastest so
        far, which then only serves failing calls). Each other explored candidate is
        prepared on its first turn; one that fails to prepare or to run is recorded as
        failed (``inf``) and that call is served by ``first``. ``turn`` (the input class's
        counter) is shared by the keys of one class, so their calls advance one rotation.
        On a device timed by events, each candidate's first turn in the class (``warmed``:
        the class's record of them) is a warm-up, not a sample (:meth:`_warm_turn`): run
        S31's first samples read a module's loading and cuBLAS's first call of a shape,
        12-15 ms of device time for kernels of 10 us.

        A turn goes to the next candidate whose samples (the policy's ``samples``, or its
        ``samples_wanted`` where more) are not all issued yet (``issued``: the class's
        count); where every one's are, the call
        is served by ``first``, untimed, until the policy has them. Event timings are
        harvested calls later, and run S72's long-burst stream gave each of its 81
        explored candidates a fourth sample of three (336 timed calls, not 255).
        ``visits`` (the class's ``_InputClass.visits``) counts this key's exploring calls
        that come back to it after another key's.
        """
        plan = dataclasses.replace(first, decision=decision)
        if not decision.explore:
            return plan
        cands = decision.explore
        pool = [first if c == first.candidate else
                self._in_class((first.key, c), first.class_key, first.time_scale, first.epoch)
                for c in cands]
        turn = turn if turn is not None else itertools.count()
        warmed = warmed if warmed is not None else set()
        issued = issued if issued is not None else collections.Counter()
        cap = self.policy.samples
        cap = cap if isinstance(cap, int) and cap > 0 else None
        sampled, warm_turn = self._sampled, self._warm_turn
        wanted = self.policy.samples_wanted

        held = [0]   # calls served untimed in a row, every candidate's samples issued
        mine, called = first.key, [False]

        def untimed(p, args, out):   # a call no timing records reaches the recorders
            head = self._head
            return p.run(args, out) if head is None else head(p, args, out)

        def due(c) -> bool:   # a turn of c would warm it up or time it short of its samples
            if cap is None or c not in warmed or issued[c] < cap:
                return True
            more = wanted(first.class_key, c)   # a candidate whose samples disagree
            return more is not None and issued[c] < more

        def explore(args, out):
            if visits is not None and visits[0] != mine:
                if called[0] and visits[0] is not None:   # back to this key: it recurs
                    visits[1] += 1
                visits[0] = mine
            called[0] = True
            n = len(pool)
            i = next(turn) % n
            if not due(cands[i]):
                j = next((k % n for k in range(i + 1, i + n) if due(cands[k % n])), None)
                if j is None:
                    # every sample issued: the call is served, untimed, until they are
                    # harvested (here too: no timed call harvests meanwhile); a sample
                    # lost on the way would hold the class, so after a few rounds the
                    # turn's candidate is timed again
                    self.harvest()
                    held[0] += 1
                    if held[0] <= 4 * n:
                        return untimed(first, args, out)
                else:
                    i = j
            held[0] = 0
            p = pool[i]
            try:
                if p is None:
                    p = pool[i] = self._prepare_like(first, cands[i], args)
                if cands[i] not in warmed:
                    warmed.add(cands[i])
                    return warm_turn(p, args, out)
                issued[cands[i]] += 1
                return sampled(p, args, out, True)
            except Exception as exc:  # noqa: BLE001 (an explored candidate failing is data)
                if p is first or isinstance(exc, (InputTypeError, InputValueError)):
                    raise   # the caller's out= is wrong (checked before the variant runs)
                log.warning("explored candidate %s failed on %s: %s", cands[i].label,
                            first.problem.describe(), exc)
                if p is not None:
                    self.feedback(p, math.inf)
                else:
                    update = self.policy.observe(first.class_key, cands[i], math.inf)
                    if update is not None:
                        self._revise(first.class_key, update)
                return untimed(first, args, out)
        return dataclasses.replace(plan, run=explore, provisional=True)

    def _warm_turn(self, plan: Plan, args, out):
        """An explored candidate's first turn in its class: the call served, untimed, where
        the sampled calls are timed by events (a device: the first call loads modules and
        runs a library's heuristics for the shape); then, the first time a variant is
        explored in an input class of its kind (in the first :data:`ISSUE_SEEDS` classes),
        :data:`ISSUE_SEED_RUNS` more runs back to back whose least host issuing seeds the
        variant's window of issuings (see :data:`ISSUE_WINDOW`). Elsewhere (the host,
        whose calls are timed whole) a sample like any other."""
        timer = self._timer if self._timer_tried else self._event_timer()
        if timer is None:
            return self._sampled(plan, args, out, True)
        head = self._head   # untimed: the call reaches the recorders as a plain one
        result = plan.run(args, out) if head is None else head(plan, args, out)
        key = _issue_key(plan)
        seeded = self._seeds.setdefault(key, set())
        if len(seeded) < ISSUE_SEEDS and plan.class_key not in seeded:
            seeded.add(plan.class_key)
            times, now = [], self._issue_now
            for _ in range(ISSUE_SEED_RUNS):
                t0 = now()
                plan.run(args, out)
                times.append((now() - t0) / 1e6)
            _window(self._issued, key).append(min(times))
            self._seed_ms[key] = min(min(times), self._seed_ms.get(key, math.inf))
        return result

    def _prepare_like(self, plan: Plan, candidate: Candidate, args) -> Plan:
        """``candidate`` prepared for ``plan``'s input (an explored candidate's first turn)."""
        with self._lock:
            return self._prepare(get_op(plan.problem.op), plan.problem, plan.key, candidate,
                                 args[-1], plan.class_key, plan.time_scale,
                                 (plan.flops, plan.bytes, plan.floor_ms), exploring=True,
                                 epoch=plan.epoch)

    def _revise(self, class_key: tuple, decision: Decision) -> None:
        """The policy's new decision for an input class: each key served from it gets a
        plan for it (or decides again on its next call, if that candidate was never
        prepared for it)."""
        with self._lock:
            cls = self._classes.get(class_key)
            if cls is None:
                return
            cls.decision = decision
            if not decision.explore:     # committed: the next exploration counts anew
                cls.issued.clear()
                cls.past_gate.clear()
                cls.issue_held.clear()
                charges, cls.charges = cls.charges, {}
                if charges:
                    self.policy.note(class_key, _charges_note(charges))
            for key in list(cls.keys):
                old = self._plans.pop(key, None)
                if old is None:
                    cls.keys.discard(key)
                    continue
                _dropped(old)
                first = self._in_class((key, _first_of(decision)), old.class_key,
                                       old.time_scale, cls.serial)
                if first is None:   # never prepared here: built from the class next call
                    cls.keys.discard(key)
                    continue
                self._plans[key] = self._plan_for(decision, first, cls.turn, cls.warmed,
                                                  cls.issued, cls.visits)
            log.debug("revised %s -> %s (%s)", class_key, decision.candidate.label,
                      decision.reason)

    def forget_key(self, key: tuple) -> None:
        """Drop one key's decision: its next launch decides again."""
        with self._lock:
            plan = self._plans.pop(key, None)
            if plan is not None:
                _dropped(plan)
                cls = self._classes.pop(plan.class_key, None)
                for other in cls.keys if cls is not None else ():
                    stale = self._plans.pop(other, None)
                    if stale is not None:
                        _dropped(stale)
            self._referenced.discard(key)

    def add_observations(self, rows: Sequence[Observation], weight: float = 1.0) -> None:
        """Measurements made elsewhere (a pack, a counter log) for this dispatcher's policy.

        Rows of variants this dispatcher cannot run, or does not list (experimental ones,
        unless it opted in), are dropped; the rest go to the policy's ``add_observations``
        (with this device's launch geometry), and the cached decisions of their ops are
        dropped so the next launch re-decides. ``weight`` < 1 marks rows measured on
        another device.
        """
        ops = {r.op for r in rows}
        mine = {(v.op, v.name) for op in ops for v in self.registry.variants(
            op, self.backend.name, self.experimental_variants)}
        rows = [r for r in rows if (r.op, r.variant) in mine]
        if not rows:
            return
        self.policy.add_observations(rows, weight, geometry=self.row_geometry)
        self.stats["prior_rows"] = self.stats.get("prior_rows", 0) + len(rows)
        for op in {r.op for r in rows}:
            self.forget(op)

    def row_geometry(self, row: Observation) -> dict:
        """Launch-geometry (and work) features of a measurement row's candidate on this
        device: what the policy's model reads of the row beyond the row itself."""
        from adaptive.policy.features import row_geometry
        try:
            variant = self.registry.get(row.op, row.variant)
        except UnknownNameError:   # removed since (a promotion replaced it): no geometry
            return {}
        return row_geometry(variant, row, self.limits)

    def plan(self, op: str, *args, **params) -> Plan:
        """The plan serving this input now (deciding it on a miss), for callers that run
        one input class many times: ``plan.run(args, out)`` is the launch without the key.

        A held plan is only good while ``plan.stale`` is False and ``plan.provisional`` is
        False (a provisional plan explores and should be called through :meth:`run`); the
        dispatcher's sampling and counter log see only calls made through it.
        """
        o = OPS.get(op) or get_op(op)
        key = o.key(args, params)
        plan = self._plans.get(key)
        return plan if plan is not None else self._miss(o, key, args, params)

    def time_candidate(self, candidate: Candidate, op: str, *args, warmup: int = 0,
                       **params) -> float:
        """One timed run of ``candidate`` on this input in ms, after ``warmup`` untimed
        runs (``inf`` if it fails); the policy's measurements are made the same way."""
        o = get_op(op)
        return self._measure(o, o.problem(args, params), o.key(args, params), args, candidate,
                             warmup)

    # ---- introspection ----------------------------------------------------------------------
    def recent_misses(self, since: float = 0.0) -> list[dict]:
        """The newest decision-cache misses (at most :data:`MISS_LOG` of each kind), oldest
        first, since ``since`` (``time.time()``): when, the op and input, ``how``
        ("class": the input class's decision reused, a plan prepared; "decided": the
        policy decided), the miss's own ms (deciding and preparing, not the launch) and of
        them the deciding's (the candidates listed and the policy's decision; 0 for a
        class's decision reused), and of that the policy's own ``decide`` (``policy_ms``)
        and the listing of the candidates it decided among (``listing_ms``: the rest is the
        roofline, the stream's state and the class's bookkeeping); and the preparing of the
        plan that runs first (``prepare_ms``: compiling or loading, its launch set, its
        output allocated; nothing where it was prepared before)."""
        return [{"time_s": t, "op": op, "input": what, "how": how, "ms": round(ms, 3),
                 "decide_ms": round(decide_ms, 3), "policy_ms": round(policy_ms, 3),
                 "listing_ms": round(listing_ms, 3), "prepare_ms": round(prepare_ms, 3)}
                for t, op, what, how, ms, decide_ms, policy_ms, listing_ms, prepare_ms
                in sorted(
                    (m for log in self._miss_log.values() for m in list(log) if m[0] >= since),
                    key=lambda m: m[0])]

    def candidates(self, op: str, *args, **params) -> list[Candidate]:
        """The candidates that fit this input on this dispatcher's backend."""
        o = get_op(op)
        return self._candidates(o, o.problem(args, params))

    def current_plan(self, key: tuple) -> Plan | None:
        """The plan serving ``key`` (``op.key(args, params)``) now, or None before its
        first launch; never decides (see :meth:`plan`)."""
        return self._plans.get(key)

    def plans(self) -> dict[tuple, Plan]:
        """A snapshot of the plans serving keys now (key -> plan; exploring ones have
        ``provisional`` set)."""
        return dict(self._plans)

    def decision(self, op: str, *args, **params) -> Decision | None:
        """The cached decision for this input, or None before its first launch."""
        o = get_op(op)
        plan = self._plans.get(o.key(args, params))
        return plan.decision if plan else None

    def wait_for_decisions(self, timeout_s: float = 30.0) -> bool:
        """Wait until no input class waits for its decide off the calling thread; True
        when none does. A warm-up that calls each class until it is committed calls this
        after a class's first call, so that the calls its stand-in served meanwhile do not
        count against its own limit."""
        with self._decide_cv:
            return self._decide_cv.wait_for(lambda: self._decider is None, timeout_s)

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Wait for what runs off the serving threads (input classes decided off the
        calling thread, then the cost model's refit in the background) to finish; True
        when nothing is left running. A server calls it at the end of its warm-up: a
        refit shares the interpreter with the threads that serve (run S37: a batch-1
        decode 1.5x slower while one ran)."""
        from adaptive.policy.cost_model import LiveModel
        deadline = time.monotonic() + timeout_s
        if not self.wait_for_decisions(timeout_s):
            return False
        model = self.policy.cost_model
        return (model.wait(max(0.0, deadline - time.monotonic()))
                if isinstance(model, LiveModel) else True)

    def forget(self, op: str | None = None) -> None:
        """Drop cached decisions (for one op, or all): the next launch re-decides. Samples
        of calls in flight meanwhile reach no policy state (``Plan.epoch``): the policy
        keeps its state of a class until it decides the class again, and a forgotten
        plan's late sample, and the revision it brought, would land on that new decision
        (a class's rotation then timed candidates its new exploration did not wait for,
        and never committed)."""
        with self._lock:
            for table, op_of in ((self._plans, lambda k: k[0]), (self._pinned, lambda k: k[0][0]),
                                 (self._prepared, lambda k: k[0][0])):
                for k in [k for k in table if op is None or op_of(k) == op]:
                    _dropped(table.pop(k))
            self._configs = {k: v for k, v in self._configs.items()
                             if op is not None and not k.startswith(op + "/")}
            self._classes = {k: v for k, v in self._classes.items()
                             if op is not None and k[0] != op}
            self._referenced.intersection_update(self._plans)

    def __repr__(self) -> str:
        return (f"Dispatcher(backend={self.backend.name!r}, device={self.backend.device!r}, "
                f"policy={self.policy.name!r}, plans={len(self._plans)})")


def _serves(decision: Decision, problem: Problem) -> bool:
    """Whether a class's decision can run ``problem`` (every candidate it may run fits)."""
    scope = problem.scope()
    return all(c.variant.fits(scope, c.config)
               for c in (decision.candidate, *decision.explore))


def _stand_in_kept(cls: _InputClass, what: str, exc: Exception) -> Decision:
    """A class decided off the calling thread whose decide or hand-over failed: its
    stand-in committed, the failure in the reason."""
    label = cls.decision.candidate.label
    return Decision(cls.decision.candidate, f"{what} ({type(exc).__name__}: {exc}); {label}, "
                    f"its stand-in, serves it, committed")


def _first_of(decision: Decision) -> Candidate:
    """The candidate a decision's plan is built on (it serves the call of an explored
    candidate that fails): its choice where that is committed or not explored (a rotation
    narrowed to the candidates still short of samples), else its first explored one."""
    if not decision.explore or decision.candidate not in decision.explore:
        return decision.candidate
    return decision.explore[0]
