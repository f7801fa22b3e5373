"""Contention on the GPU: the learned policy's choices with and without a co-running load.

    PYTHONPATH=$PWD python3 benchmarks/gpu_contention.py --out $OUT              # H200, ~2 min
    PYTHONPATH=$PWD python3 benchmarks/gpu_contention.py --device host --quick --out /tmp/c

One dispatcher (``adaptive.runtime.start(Dispatcher(policy="learned"))``: the learned
policy with its default settings and the start-up packs) serves a few inputs whose best
candidate can plausibly move when SMs are taken (split-K against not, split-KV decode
attention, many small CTAs against few big ones) through a sequence of conditions:
``idle``, then for each load kind (``--loads``) the load on and ``idle`` again. In each
condition it is called ``--rounds`` times per input (every input once a round, in a
shuffled order, one synchronise a round), with the dispatcher's own sampling; the first
idle condition is the warm-up a server does (``adaptive.unbounded_exploration``), the
rest run under the default exploration budget. A condition records per input: the
choice at its end, after how many calls of that input the choice first changed and when
it last committed, how many times the key was re-explored (drift, re-validation).

Then, with the condition still in force, every candidate of every input is timed the same
way, interleaved in ``--oracle-rounds`` rounds of shuffled candidates (GPU: each call by
its own CUDA event pair, after a write of twice the L2 that leaves the cache as the
stream's other inputs do and keeps the GPU busy while the call is issued; host: the wall
time of a batch): the
oracle is the fastest, and ``steady`` is the time of the dispatcher's choice from the same
table, so ``steady/oracle`` is the quotient of the two printed columns.

Loads (``--fraction`` of the device; :mod:`benchmarks.contention_load`):
  * ``stream``: a thread of this process launches a spin kernel on its own non-blocking
    stream, back to back, with ``fraction x SMs`` CTAs of 1024 threads each holding the
    opt-in maximum of shared memory (one CTA an SM): those SMs are busy while the
    dispatcher's kernels run on the rest (what another stream of a server does);
  * ``process``: the same loop in a separate process (without MPS the GPU time-slices the
    two contexts rather than sharing SMs: another tenant).
  The load's own throughput is reported against its rate alone (measured just before).
  On the host (the dry run) the load is threads (``stream``) or a process (``process``)
  burning ``fraction`` of the cores with large NumPy multiplies.

Also recorded per condition: the device state the policy sees (``backend.device_state()``
as :class:`adaptive.policy.features.DeviceState` features: the backend samples NVML as
``ADAPTIVE_DEVICE_STATE=nvml`` asks, unless ``--no-device-state``) and, beside it, NVML's
readings over the condition (clock, utilisation, GPM SM activity, other processes).
The policy's view is what its model conditions on: where it reads ``known=0`` the model
ranks as on an idle device, and only timings (drift, re-validation) can move a choice.
Prints a table per condition, the choices under load against the idle choice (was the
change right: the new choice's time under load against the idle choice's), then the
targets (issue 14: steady/oracle <= 1.10 under each condition, as a geometric mean over
the inputs). Writes ``contention.json`` under ``--out``. ``--budget-s`` skips a load
that would end past it (with the idle condition after it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.contention_load import Load  # noqa: E402
from adaptive.dispatch import ISSUE_CHARGES  # noqa: E402

TARGET_RATIO = 1.10
LIBRARIES = ("cublas", "sdpa_torch", "cublas_dense")   # issuing windows printed in full
BATCH_MS = 0.5              # work in one timed batch of a candidate (at least 2 calls)
GATE_US = 2000.0            # GPU: the longest a gate waits for the host to issue a timed call
ORACLE_CALLS = 3            # GPU: calls of a candidate timed a round (each after a flush)
CALLER_CALLS = 8            # calls issued back to back per caller-time sample


def say(text: str) -> None:
    print("  " + text, flush=True)


# ---- inputs -----------------------------------------------------------------------------------

def contention_inputs(device: str, quick: bool) -> list[tuple]:
    """Input specs (``adaptive.bench.selection._spec``) whose best candidate can move when
    SMs (or cores) are taken."""
    from adaptive.bench.selection import _spec
    if device == "host":
        side = 128 if quick else 384
        return [_spec("gemm", M=side, N=side, K=side),
                _spec("gemm", M=16, N=2 * side, K=2 * side),
                _spec("softmax", R=8 * side, C=side),
                _spec("attention", B=1, H=2, Lq=side, Lk=side, D=32),
                _spec("spmm", stats={"density": 0.1, "block": 16}, M=2 * side, N=64,
                      K=2 * side)]
    dt = "float16"
    return [_spec("gemm", dt, M=16, N=4096, K=4096),
            _spec("gemm", dt, M=128, N=4096, K=4096),
            _spec("gemm", dt, M=2048, N=2048, K=2048),
            _spec("softmax", dt, R=2048, C=4096),
            _spec("attention", dt, B=1, H=32, Lq=1, Lk=8192, D=128, params={"causal": True}),
            _spec("attention", dt, B=1, H=16, Lq=1024, Lk=1024, D=128,
                  params={"causal": True}),
            _spec("spmm", dt, stats={"density": 0.1, "block": 32}, M=4096, N=64, K=4096)]


def input_name(spec) -> str:
    op, dims, _, stats, params = spec
    parts = [f"{k}={v}" for k, v in dims] + [f"{k}={v}" for k, v in stats]
    parts += [f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in params]
    return f"{op}:" + ",".join(parts)


# ---- timing -------------------------------------------------------------------------------------

class BatchTimer:
    """Per-call ms of ``fn``. GPU: each call timed alone by a CUDA event pair, right after
    a write of ``flush_bytes`` (twice the L2) on the same stream: the call finds the L2
    as the stream leaves it (the other inputs' calls between two calls of one input evict
    it; run S7 timed batches of back-to-back calls, whose inputs stayed in the 50 MB L2,
    and its table ranked a softmax variant 2.3x faster than the one the stream measured
    best). Write, pair and call are queued behind the backend's gate, released once the
    end event is issued, so the host's issuing of the call stays out (run S10 timed without
    the gate and read cuBLAS at 0.067 ms on an idle GPU where it takes 0.018-0.033 ms
    under load); the median of ``n`` calls. Host: the wall time of ``n`` calls."""

    def __init__(self, backend, per_batch: int, flush_bytes: int = 0):
        self.backend, self.per_batch = backend, per_batch
        self._cp = self._scratch = None
        if backend.name == "cuda":
            import cupy
            self._cp = cupy
            self._scratch = cupy.empty(max(flush_bytes, 1), cupy.uint8)

    def __call__(self, fn, n: int | None = None) -> float:
        n = n or self.per_batch
        if self._cp is None:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) * 1e3 / n
        cuda = self._cp.cuda
        stream = cuda.get_current_stream()
        pairs = []
        for _ in range(n):
            release = self.backend.gate(stream.ptr, GATE_US)
            try:
                self._scratch.fill(0)
                start, end = cuda.Event(), cuda.Event()
                start.record(stream)
                fn()
                end.record(stream)
            finally:
                release()
            pairs.append((start, end))
        pairs[-1][1].synchronize()
        return statistics.median(cuda.get_elapsed_time(a, b) for a, b in pairs)


def pinned_calls(timer_d, op: str, args, params, sync) -> dict:
    """{candidate label: a call of it pinned on this input, or None where its first call
    (run and synchronised here: compiles, heuristics) failed}."""
    fns = {}
    for c in timer_d.candidates(op, *args, **params):
        def call(c=c):
            timer_d.launch(op, *args, variant=c.variant.name, config=c.config, **params)
        try:
            call()
            sync()
            fns[c.label] = call
        except Exception:  # noqa: BLE001 (a failing candidate is data)
            fns[c.label] = None
    return fns


def time_every_candidate(fns: dict, timer, rounds: int, rng) -> dict:
    """{candidate label: median per-call ms}: every candidate of :func:`pinned_calls`'
    ``fns`` timed in ``rounds`` rounds of a shuffled order (a failing candidate: inf); a
    slow candidate's batch is shorter (at least 2 calls, about ``BATCH_MS`` of work), so
    slow ones cost no more."""
    samples = {label: [] for label in fns}
    labels = [label for label, fn in fns.items() if fn is not None]
    batch = {}
    for label in labels:
        try:
            probe = timer(fns[label], 1)
        except Exception:  # noqa: BLE001 (a failing candidate is data)
            probe = math.inf
        batch[label] = max(2, min(timer.per_batch, int(BATCH_MS / max(probe, 1e-4))))
        if timer.backend.name == "cuda":
            batch[label] = ORACLE_CALLS              # each call alone: a few are enough
    for _ in range(rounds):
        for i in rng.permutation(len(labels)):
            try:
                samples[labels[i]].append(timer(fns[labels[i]], batch[labels[i]]))
            except Exception:  # noqa: BLE001
                samples[labels[i]].append(math.inf)
    return {label: statistics.median(ts) if ts else math.inf for label, ts in samples.items()}


def caller_ms(fns: dict, rounds: int, rng, sync, calls: int = CALLER_CALLS) -> dict:
    """{candidate label: per-call ms}: every candidate of :func:`pinned_calls`' ``fns``
    issued ``calls`` times back
    to back with one synchronise after them, by the host's clock (the least over
    ``rounds`` rounds of a shuffled order; a failing candidate: inf). That is what a
    caller that issues call after call pays a call: the host's issuing where it is the
    longer part, the device time where that is, with the L2 as repeated calls leave it.
    The oracle above prices device time alone (an L2 flush before each call, the issuing
    kept out by the gate), while the policy charges a host-bound class its issuing: where
    the two disagree (a library's issuing from CuPy), this table says which choice the
    caller's loop runs faster with. Information, not the issue's bar."""
    best = {label: math.inf for label in fns}
    labels = [label for label, fn in fns.items() if fn is not None]
    for _ in range(rounds):
        for i in rng.permutation(len(labels)):
            fn = fns[labels[i]]
            try:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                sync()
                ms = (time.perf_counter() - t0) * 1e3 / calls
            except Exception:  # noqa: BLE001
                ms = math.inf
            best[labels[i]] = min(best[labels[i]], ms)
    return best


def issuing_us(fn, sync, calls: int = 20):
    """(least, median) host time in us of issuing ``fn`` (a pinned call of
    :func:`pinned_calls`; None: None), a synchronise after each call (outside the timed
    part): what a call of that candidate costs this process's host where the device waits
    for it. The policy charges a host-bound class's samples the least of its variant's
    exploring issuings; run S70 charged cuBLAS 51-76 us here where a fresh process (S72's
    probe) issued it in 17-19."""
    if fn is None:
        return None
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
        sync()
    return min(times), statistics.median(times)


# ---- one condition ------------------------------------------------------------------------------

def _plan_state(d, key):
    """(plan, the policy's state of its input class) of ``key`` now."""
    plan = d.current_plan(key)
    state = d.policy.state(plan.class_key) if plan is not None else None
    return plan, state


def drive(d, specs, inputs, rounds: int, rng, sync) -> dict:
    """Call every input ``rounds`` times (a shuffled order a round, one synchronise a
    round); per input: the choice at the start and end, the calls (of that input) until
    the choice first changed and until the last commit, re-explorations."""
    from adaptive.ops import OPS
    keys = {s: OPS[s[0]].key(*inputs[s]) for s in specs}
    trace = {}
    for s in specs:
        plan, state = _plan_state(d, keys[s])
        start = plan.candidate.label if plan is not None and not plan.provisional else None
        trace[s] = {"start_choice": start, "first_change_calls": None,
                    "last_commit_calls": None, "explorations0": state.explorations
                    if state is not None else 0, "provisional": plan is None
                    or plan.provisional, "calls": 0}
    for _ in range(rounds):
        for i in rng.permutation(len(specs)):
            s = specs[i]
            args, params = inputs[s]
            d.launch(s[0], *args, **params)
            t = trace[s]
            t["calls"] += 1
            plan = d.current_plan(keys[s])
            if plan.provisional:
                t["provisional"] = True
                continue
            if t["provisional"]:          # exploring until now: committed on this call
                t["provisional"] = False
                t["last_commit_calls"] = t["calls"]
            if t["first_change_calls"] is None and plan.candidate.label != t["start_choice"]:
                t["first_change_calls"] = t["calls"]
        sync()
    return trace


def settle(d, specs, inputs, sync, limit: int = 400) -> None:
    """Call exploring inputs until committed (steady state means every input decided)."""
    from adaptive.ops import OPS
    for s in specs:
        args, params = inputs[s]
        key = OPS[s[0]].key(args, params)
        for _ in range(limit):
            plan = d.current_plan(key)
            if plan is not None and not plan.provisional:
                break
            d.launch(s[0], *args, **params)
            sync()
            d.harvest()


def nvml_summary(sampler, t0: float, t1: float) -> dict:
    """Medians of the NVML readings between ``t0`` and ``t1`` (epoch seconds)."""
    if sampler is None:
        return {}
    snaps = [s for s in sampler.snapshots() if t0 <= s.time_s <= t1]
    out = {"readings": len(snaps)}
    for name in ("sm_clock_mhz", "gpu_util_ratio", "sm_active_ratio", "sm_occupancy_ratio",
                 "other_processes", "power_w"):
        values = [getattr(s, name) for s in snaps if getattr(s, name) is not None]
        finite = [float(v) for v in values if math.isfinite(float(v))]
        if finite:
            out[name] = statistics.median(finite)
    return out


def _measure_condition(name: str, ctx: dict):
    """The dispatcher driven, then every candidate timed: (trace, drive s, the device
    state the policy saw, {spec: {label: ms}} by device time and by the caller's wall,
    {spec: {label: its pinned call}})."""
    import adaptive
    from adaptive.policy.features import DeviceState
    d, timer_d, specs, inputs, args = (ctx[k] for k in ("d", "timer_d", "specs", "inputs",
                                                        "args"))
    rng, sync, timer = ctx["rng"], ctx["sync"], ctx["timer"]
    t0 = time.perf_counter()
    if ctx["warm_up"]:
        with adaptive.unbounded_exploration():
            trace = drive(d, specs, inputs, args.rounds, rng, sync)
            settle(d, specs, inputs, sync)
    else:
        trace = drive(d, specs, inputs, args.rounds, rng, sync)
        settle(d, specs, inputs, sync)
    drive_s = time.perf_counter() - t0
    policy_view = DeviceState.from_mapping(d.backend.device_state()).features()
    say(f"{name}: {args.rounds} rounds driven in {drive_s:.1f} s; timing every candidate")
    calls = {s: pinned_calls(timer_d, s[0], *inputs[s], sync) for s in specs}
    tables = {s: time_every_candidate(calls[s], timer, args.oracle_rounds, rng)
              for s in specs}
    callers = {s: caller_ms(calls[s], args.oracle_rounds, rng, sync) for s in specs}
    return trace, drive_s, policy_view, tables, callers, calls


def run_condition(name: str, load_kind: str | None, ctx: dict) -> dict:
    """One condition: the load (if any) on, the dispatcher driven, every candidate timed,
    the load off. Returns the condition's record."""
    d, specs, inputs, args = (ctx[k] for k in ("d", "specs", "inputs", "args"))
    load = Load(load_kind, args.device, args.fraction) if load_kind else None
    t_start = time.time()
    info = load.start() if load else {}
    if load:
        say(f"{name}: load running ({info})")
    stats0 = dict(d.policy.stats)
    past_gate0 = d.stats["samples_past_gate"]
    try:
        trace, drive_s, policy_view, tables, callers, calls = _measure_condition(name, ctx)
    finally:                             # the load never outlives its condition
        result = load.stop() if load else {}
    t_end = time.time()
    stats = {k: v - stats0.get(k, 0) for k, v in d.policy.stats.items()
             if isinstance(v, (int, float))}
    # exploring samples dropped as read past their gate (Dispatcher._past_gate)
    stats["samples_past_gate"] = d.stats["samples_past_gate"] - past_gate0
    rows = []
    for s in specs:
        from adaptive.ops import OPS
        a, p = inputs[s]
        plan, state = _plan_state(d, OPS[s[0]].key(a, p))
        table = tables[s]
        choice = plan.candidate.label
        oracle_label = min(table, key=table.get)
        # times as printed (5 significant digits): steady/oracle is their quotient
        steady_ms = float(f"{table.get(choice, math.inf):.5g}")
        oracle_ms = float(f"{table[oracle_label]:.5g}")
        t = trace[s]
        rows.append({"input": input_name(s), "op": s[0], "choice": choice,
                     "start_choice": t["start_choice"], "steady_ms": steady_ms,
                     "oracle_ms": oracle_ms, "oracle_choice": oracle_label,
                     "ratio": steady_ms / oracle_ms, "candidates": len(table),
                     "calls": t["calls"], "first_change_calls": t["first_change_calls"],
                     "last_commit_calls": t["last_commit_calls"],
                     "re_explorations": (state.explorations - t["explorations0"])
                     if state is not None else 0,
                     "history": list(state.history)[-4:] if state is not None else [],
                     "times_ms": {k: float(f"{v:.5g}") for k, v in table.items()}})
        caller = callers[s]
        caller_label = min(caller, key=caller.get)   # times as printed, as above
        c_steady = float(f"{caller.get(choice, math.inf):.5g}")
        c_oracle = float(f"{caller[caller_label]:.5g}")
        rows[-1]["caller"] = {"steady_ms": c_steady, "oracle_ms": c_oracle,
                              "oracle_choice": caller_label, "ratio": c_steady / c_oracle}
        if choice != oracle_label:   # the host's side of a choice the oracle disputes
            rows[-1]["issuing_us"] = {
                which: issuing_us(calls[s].get(label), ctx["sync"])
                for which, label in (("choice", choice), ("oracle", oracle_label))}
    return {"condition": name, "load": load_kind, "load_info": info, "load_result": result,
            "drive_s": drive_s, "wall_s": t_end - t_start, "policy_stats": stats,
            # the host issuing charged to exploring samples in host-bound classes, per
            # variant and input kind: (issuings kept, least of them in ms)
            "issue_charges": {k: [n, ms] for k, (n, ms) in d.issue_charges().items()},
            # the windows themselves, oldest (the seed) first: whether the least is the
            # seed's or every exploring sample's
            "issuings_us": {k: [round(ms * 1e3, 1) for ms in q]
                            for k, q in d.issue_windows_ms().items()},
            "device_state_policy": policy_view,
            "nvml": nvml_summary(ctx["sampler"], t_start, t_end),
            "geomean_ratio": geomean([r["ratio"] for r in rows]),
            "max_ratio": max(r["ratio"] for r in rows),
            "caller_geomean_ratio": geomean([r["caller"]["ratio"] for r in rows]),
            "rows": rows}


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


# ---- the report ---------------------------------------------------------------------------------

def compare_with_idle(conditions: list[dict]) -> list[dict]:
    """Per load condition and input: the idle choice (end of the first idle condition)
    against the choice under load, both timed under load."""
    from adaptive.bench import verdict
    idle = {r["input"]: r["choice"] for r in conditions[0]["rows"]}
    out = []
    for c in conditions:
        if not c["load"]:
            continue
        for r in c["rows"]:
            before = idle[r["input"]]
            before_ms = r["times_ms"].get(before, math.inf)
            before_ratio = before_ms / r["oracle_ms"]
            out.append({"condition": c["condition"], "input": r["input"], "idle_choice": before,
                        "idle_choice_ms": before_ms, "idle_choice_ratio": before_ratio,
                        "choice": r["choice"], "steady_ms": r["steady_ms"],
                        "ratio": r["ratio"], "changed": r["choice"] != before,
                        "verdict": verdict(r["ratio"], before_ratio)})
    return out


def targets(conditions: list[dict]) -> list[tuple[str, str, bool]]:
    """Issue 14's contention target: steady/oracle <= 1.10 under each condition (the
    geometric mean over the inputs; the worst input beside it)."""
    loads = [c["condition"] for c in conditions if c["load"]]
    return [(f"{c['condition']}: steady/oracle <= {TARGET_RATIO:.2f} (geomean over "
             f"{len(c['rows'])} inputs)", f"{c['geomean_ratio']:.3f} (worst "
             f"{c['max_ratio']:.3f})", round(c["geomean_ratio"], 3) <= TARGET_RATIO)
            for c in conditions] + [("measured with and without a co-running load",
                                     ", ".join(loads) or "no load condition ran", bool(loads))]


def _calls(v) -> str:
    return "-" if v is None else str(v)


def print_report(report: dict) -> None:
    for c in report["conditions"]:
        load = c["load_result"]
        print(f"\n{c['condition']}: driven {c['drive_s']:.1f} s, condition {c['wall_s']:.1f} s")
        if c["load"]:
            print(f"  load ({c['load']}): {load.get('kind', '?')} {c['load_info']}; "
                  f"{load.get('launches_per_s', math.nan):.1f} units/s, "
                  f"{load.get('vs_alone', math.nan):.2f}x its rate alone"
                  + (f"; error {load['error']}" if "error" in load else ""))
        seen = c["device_state_policy"]
        print("  device state the policy sees: " + ", ".join(
            f"{k[4:]}={v:g}" for k, v in seen.items()))
        print("  NVML over the condition: " + (", ".join(
            f"{k}={v:.3g}" for k, v in c["nvml"].items()) or "unavailable"))
        stats = c["policy_stats"]
        print(f"  policy: drifts {stats.get('drifts', 0)}, re-validations "
              f"{stats.get('revalidations', 0)}, choices changed by them "
              f"{stats.get('drift_switches', 0)}, commits {stats.get('commits', 0)}, "
              f"deferred {stats.get('deferred', 0)}, decided without a model "
              f"{stats.get('cold', 0)}, waited for its first fit "
              f"{stats.get('first_fit_wait_s', 0.0):.2f} s, exploring "
              f"{stats.get('explore_s', 0.0) * 1e3:.1f} ms, samples read past their gate "
              f"(dropped, timed again) {stats.get('samples_past_gate', 0)}")
        if c.get("issue_charges"):
            print("  issuing charged so far: " + ", ".join(
                f"{k} {ms * 1e3:.1f} us (last {n})"
                for k, (n, ms) in sorted(c["issue_charges"].items())))
        for k, window in sorted(c.get("issuings_us", {}).items()):
            if c is report["conditions"][0] and k.split("/")[1] in LIBRARIES:
                print(f"  issuings of {k}, oldest (the seed) first (us): "
                      + ", ".join(f"{v:g}" for v in window))
        print(f"  {'input':<44} {'choice':<40} {'steady ms':>10} {'oracle ms':>10} "
              f"{'steady/oracle':>13} {'changed@':>8} {'commit@':>7} {'re-expl':>7}  oracle")
        for r in c["rows"]:
            print(f"  {r['input']:<44} {r['choice']:<40} {r['steady_ms']:>10.5g} "
                  f"{r['oracle_ms']:>10.5g} {r['ratio']:>13.3f} "
                  f"{_calls(r['first_change_calls']):>8} {_calls(r['last_commit_calls']):>7} "
                  f"{r['re_explorations']:>7}  {r['oracle_choice']}")
        print(f"  geomean steady/oracle {c['geomean_ratio']:.3f}, worst {c['max_ratio']:.3f}")
        print(f"  caller time ({CALLER_CALLS} pinned calls back to back, one synchronise, "
              "host wall per call; information, not the bar):")
        for r in c["rows"]:
            k = r["caller"]
            print(f"    {r['input']:<44} choice {k['steady_ms']:>9.5g} ms, fastest "
                  f"{k['oracle_ms']:>9.5g} ms ({k['oracle_choice']}): {k['ratio']:.3f}")
        print(f"    geomean caller steady/oracle {c['caller_geomean_ratio']:.3f}")
        for r in c["rows"]:
            if r.get("issuing_us"):
                print(f"  {r['input']}: issuing of a pinned launch, least/median of 20 "
                      "(us): " + ", ".join(
                          f"{which} {r[which if which == 'choice' else 'oracle_choice']} "
                          + (f"{v[0]:.1f}/{v[1]:.1f}" if v else "-")
                          for which, v in r["issuing_us"].items()))
        for r in c["rows"]:
            if r["ratio"] > TARGET_RATIO:   # why a row over the bar committed what it did, in full
                print(f"  {r['input']} over the bar; its key's history: "
                      + " | ".join(r["history"]))
            elif r["re_explorations"] and c is not report["conditions"][0]:
                print(f"  {r['input']}: " + " | ".join(h[:140] for h in r["history"][-3:]))
    if report["under_load"]:
        print("\nunder load, the idle choice against the choice made (both timed under load):")
        print(f"  {'condition':<14} {'input':<44} {'idle choice':<40} {'ms':>10} "
              f"{'choice':<40} {'ms':>10}  verdict")
        for r in report["under_load"]:
            print(f"  {r['condition']:<14} {r['input']:<44} {r['idle_choice']:<40} "
                  f"{r['idle_choice_ms']:>10.5g} {r['choice']:<40} {r['steady_ms']:>10.5g}  "
                  + ("changed: " + r["verdict"] + " the idle choice" if r["changed"]
                     else "unchanged"))
        changed = [r for r in report["under_load"] if r["changed"]]
        right = [r for r in changed if r["verdict"] != "did NOT beat"]
        print(f"  choices changed under load: {len(changed)} of {len(report['under_load'])}; "
              f"of those, as fast or faster than the idle choice: {len(right)}")
    for note in report["notes"]:
        print("note: " + note)
    print("\ncaller time, steady/oracle by condition (information, not the bar): " + ", ".join(
        f"{c['condition']} {c['caller_geomean_ratio']:.3f}" for c in report["conditions"]))
    print(f"\ncontention targets (issue 14), this run ({report['wall_s']:.0f} s):")
    print("| target | measured | status |\n| --- | --- | --- |")
    for target, measured, ok in report["targets"]:
        print(f"| {target} | {measured} | {'met' if ok else 'NOT met'} |")


# ---- main ---------------------------------------------------------------------------------------

def run(args) -> dict:
    from adaptive import config
    from adaptive.bench.selection import _inputs
    from adaptive.dispatch import Dispatcher
    from adaptive.policy import MeasureEach
    from adaptive.runtime import start
    t_run = time.perf_counter()
    # the policy reads the device's state (ADAPTIVE_DEVICE_STATE=nvml): what lets its model
    # tell a shared device from an idle one before any time moves
    with config.override(device_state="nvml" if args.device_state else "off"):
        d = start(Dispatcher(args.device, policy="learned"))
    be = d.backend
    say(f"device state for the policy: {be.watch_device() if args.device_state else 'off'}")
    if args.sample_every is not None:
        d.sample_every = args.sample_every
    d.issue_charge = args.issue_charge
    say(f"issuing charged to host-bound classes as the {args.issue_charge} of device time "
        f"and issuing; issue floor {d.issue_floor} (Dispatcher.issue_floor)")
    timer_d = Dispatcher(be, policy=MeasureEach(), registry=d.registry)
    timer_d.sample_every = 0
    rng = np.random.default_rng(args.seed)
    specs = contention_inputs(args.device, args.quick)
    inputs = {s: _inputs(s, rng, be.name) for s in specs}
    if be.name == "cuda":
        import types
        from adaptive.packs.build import precompile
        errors = precompile("cuda", be.arch, [types.SimpleNamespace(op=s[0], dtype=s[2])
                                              for s in specs])
        say(f"precompiled the candidates of {len({(s[0], s[2]) for s in specs})} (op, dtype) "
            f"pairs; {len(errors)} failed ({time.perf_counter() - t_run:.0f} s)")
    sampler = None
    if be.name == "cuda":
        try:
            from profilers.nvml import NvmlSampler, nvml_device
            sampler = NvmlSampler(nvml_device(0), period_s=0.1, history=8192).start()
        except Exception as exc:  # noqa: BLE001 (NVML is context, not the measurement)
            say(f"NVML sampler unavailable: {exc}")
    sync = be.synchronize
    if be.name == "cuda":   # this stream's work, not the device's: the load's stream runs on
        import cupy
        sync = lambda: cupy.cuda.get_current_stream().synchronize()  # noqa: E731
    ctx = {"d": d, "timer_d": timer_d, "specs": specs, "inputs": inputs, "args": args,
           "rng": rng, "sync": sync, "sampler": sampler, "warm_up": True,
           "timer": BatchTimer(be, args.per_batch,
                               2 * int(be.limits().get("l2_bytes") or 0))}
    plan = [("idle", None)]
    for kind in args.loads:
        plan += [(f"{kind} load", kind), (f"idle after {kind}", None)]
    conditions, notes = [], []
    skip_next = False
    for name, kind in plan:
        elapsed = time.perf_counter() - t_run
        # a load and the idle condition after it take about two conditions' time
        ahead = 2 * statistics.mean(c["wall_s"] for c in conditions) if conditions else 0.0
        if kind is not None and elapsed + ahead > args.budget_s:
            notes.append(f"{name} skipped: {elapsed:.0f} s spent, about {ahead:.0f} s more "
                         f"needed, of the {args.budget_s:.0f} s budget")
            break
        if skip_next:                    # the load before it never ran
            skip_next = False
            continue
        try:
            conditions.append(run_condition(name, kind, ctx))
        except Exception as exc:  # noqa: BLE001 (a load that cannot start is reported)
            if kind is None:
                raise
            notes.append(f"{name} failed: {type(exc).__name__}: {exc}")
            say(notes[-1])
            skip_next = True
            continue
        ctx["warm_up"] = False
        c = conditions[-1]
        say(f"{name}: geomean steady/oracle {c['geomean_ratio']:.3f} "
            f"({time.perf_counter() - t_run:.0f} s)")
    if sampler is not None:
        sampler.stop()
    if args.loads and not any(c["load"] for c in conditions):
        notes.append("no load condition ran: nothing measured under contention")
    notes.append(f"sampling: one launch in {d.sample_every} timed for the policy "
                 f"(config default {config.get().sample_every}); inputs called in a shuffled "
                 "order each round")
    report = {"device": be.name, "fingerprint": be.fingerprint(), "quick": args.quick,
              "fraction": args.fraction, "issue_charge": args.issue_charge,
              "issue_floor": d.issue_floor, "rounds": args.rounds,
              "oracle_rounds": args.oracle_rounds, "per_batch": args.per_batch,
              "sample_every": d.sample_every, "inputs": [input_name(s) for s in specs],
              "conditions": conditions, "under_load": compare_with_idle(conditions),
              "notes": notes, "policy_stats": {k: v for k, v in d.policy.stats.items()},
              "nvml_status": getattr(sampler, "status", "not started")}
    report["targets"] = targets(conditions)
    report["wall_s"] = time.perf_counter() - t_run
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "host"),
                        help="host: a dry run of the code paths on CPU inputs and CPU loads")
    parser.add_argument("--quick", action="store_true", help="small inputs, short conditions")
    parser.add_argument("--loads", default="stream,process",
                        help="load kinds in turn, comma-separated: stream, process")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="the share of SMs (host: cores) the load keeps busy")
    parser.add_argument("--rounds", type=int, default=None,
                        help="calls of each input per condition (default 3000; quick 120)")
    parser.add_argument("--oracle-rounds", type=int, default=3)
    parser.add_argument("--per-batch", type=int, default=None,
                        help="calls per timed batch (default 20 on the GPU, 3 on the host)")
    parser.add_argument("--sample-every", type=int, default=None,
                        help="the dispatcher's sampling (default: the config's; the quick "
                             "host run 4, so its short conditions see drift)")
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="no load condition starts that would end (with the idle one "
                             "after it) past this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--issue-charge", default="sum", choices=ISSUE_CHARGES,
                        help="how a host-bound class's call is charged its issuing "
                             "(Dispatcher.issue_charge; default sum)")
    parser.add_argument("--no-device-state", dest="device_state", action="store_false",
                        help="the policy sees an idle device (ADAPTIVE_DEVICE_STATE=off)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."),
                        help="folder for contention.json (default: $OUT or .)")
    args = parser.parse_args(argv)
    args.loads = [k for k in args.loads.split(",") if k]
    for kind in args.loads:
        if kind not in ("stream", "process"):
            parser.error(f"--loads: expected stream or process, got {kind!r}")
    if not 0 < args.fraction <= 1:
        parser.error(f"--fraction must be in (0, 1], got {args.fraction}")
    if args.rounds is None:
        args.rounds = 120 if args.quick else 3000
    if args.per_batch is None:
        args.per_batch = 20 if args.device == "cuda" else 3
    if args.sample_every is None and args.quick and args.device == "host":
        args.sample_every = 4
    report = run(args)
    print_report(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "contention.json.tmp"
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, out / "contention.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
