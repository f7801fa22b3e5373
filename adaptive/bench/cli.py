"""``adaptive bench``: the main job. A mixed workload through ``launch`` against every
single fixed candidate and the per-input oracle, plus the hot-path overhead.

Every (input, candidate) pair is timed up front (warm-up, then the median of several
runs); the fixed candidates and the oracle are totals over that table, and the
adaptive run goes live through a fresh :class:`~adaptive.Dispatcher`, tuning included.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import sys
import time

import numpy as np

from adaptive import arrays
from adaptive.bench import verdict
from adaptive.errors import InputValueError
from adaptive.ops import OPS
from adaptive.progress import Heartbeat, doing
from adaptive.timing import measure_each

# (op, dims, dtype, stats) per input; the "quick" stream is a subset with smaller sizes
_FULL = {
    "gemm": [({"M": m, "N": n, "K": k}, "float32", {})
             for m, n, k in ((8, 512, 512), (64, 256, 1024), (512, 512, 512), (1024, 1024, 256),
                             (2048, 64, 2048), (1, 4096, 1024), (1536, 1536, 1536))],
    "spmm": [({"M": 2048, "N": n, "K": 2048}, "float32", {"density": d, "block": blk})
             for n in (16, 128) for d, blk in ((0.5, 0), (0.1, 32), (0.01, 0), (0.001, 0))],
    "attention": [({"B": 2, "H": 4, "Lq": lq, "Lk": lk, "D": 64}, "float32", {})
                  for lq, lk in ((1, 512), (1, 4096), (128, 128), (512, 512), (1024, 1024),
                                 (2048, 2048))],
    "softmax": [({"R": r, "C": c}, "float32", {})
                for r, c in ((8, 32000), (4096, 128), (2048, 2048), (64, 4096), (16384, 512))],
    "rmsnorm": [({"R": r, "C": c}, "float32", {})
                for r, c in ((1, 4096), (16, 4096), (4096, 2048), (512, 8192))],
}
_QUICK = {
    "gemm": [({"M": m, "N": n, "K": k}, "float32", {})
             for m, n, k in ((8, 256, 256), (256, 256, 256), (512, 128, 512))],
    "spmm": [({"M": 512, "N": 32, "K": 512}, "float32", {"density": d, "block": blk})
             for d, blk in ((0.5, 0), (0.1, 32), (0.005, 0))],
    "attention": [({"B": 1, "H": 2, "Lq": lq, "Lk": lk, "D": 32}, "float32", {})
                  for lq, lk in ((1, 512), (128, 128), (512, 512))],
    "softmax": [({"R": r, "C": c}, "float32", {})
                for r, c in ((8, 8192), (2048, 256), (512, 1024))],
    "rmsnorm": [({"R": r, "C": c}, "float32", {}) for r, c in ((1, 2048), (512, 1024))],
}


@dataclasses.dataclass
class OpReport:
    op: str
    inputs: int
    calls: int
    # oracle, best fixed and adaptive steady ms: the stream priced with each input's
    # finalists re-timed (run_mixed: the table's best, the best fixed, adaptive's choice);
    # the oracle is the fastest finalist of each input
    oracle_ms: float
    fixed_best: str             # picked by the table
    fixed_best_ms: float
    adaptive_ms: float          # live, tuning included
    adaptive_steady_ms: float   # the adaptive choices
    tuning_ms: float
    choices: dict
    exploring: int = 0          # inputs whose key was still exploring when the stream ended
    excess: str = ""            # the input whose choice cost the stream most over the oracle
    # the stream's calls run again, each way as a whole, median wall ms over rounds
    # (run_mixed's walls): each input's fastest finalist pinned, the best fixed pinned,
    # and launch's own choices; None where not run
    walls: dict | None = None
    # (fixed/oracle, adaptive/oracle) as the table alone prices them, before the finalists
    # are re-timed (the table's best fixed and oracle picked and priced on the same samples)
    table_ratios: tuple | None = None

    @property
    def fixed_ratio(self) -> float:
        return self.fixed_best_ms / self.oracle_ms

    @property
    def adaptive_ratio(self) -> float:
        return self.adaptive_steady_ms / self.oracle_ms


def _to_backend(args, backend_name: str):
    if backend_name == "host":
        return args
    return arrays.to_cuda(args)


def run_mixed(backend: str = "auto", quick: bool = False, seed: int = 0, repeats: int = 5,
              calls_per_input: int = 40, ops: list[str] | None = None, progress=print,
              walls_too: bool | None = None, table_batch: int | None = None):
    """Time the workload; return one :class:`OpReport` per op. ``calls_per_input``: each
    input's calls in the stream (40: enough for the learned policy to time each of the 8
    candidates it explores at most 3 times after a warm-up turn, as on a GPU timed by
    events, 32 calls, and serve a few steadily; run S59 on the H200 with 30 left 3 of 4
    rmsnorm inputs exploring, priced at the baseline they fall back on, 7.3x the oracle;
    a key still exploring at the end is priced at the candidate it falls back on and
    counted in the report). ``walls_too``: the stream also run whole, pinned and through
    ``launch`` (:func:`_stream_walls`; None: on a device only, where the table's rounds of
    calls from a drained device price a call's issuing as the stream may not pay it; the
    host's table times each call whole, and its walls would take minutes). ``table_batch``:
    a device table's calls back to back per timed round (None: :data:`BATCH`; the host's
    table times one call a round)."""
    from adaptive import runtime
    from adaptive.dispatch import Dispatcher
    from adaptive.policy import MeasureEach
    if table_batch is not None and not (type(table_batch) is int and table_batch >= 1):
        raise InputValueError("table_batch: expected a whole number >= 1 of calls a timed "
                              f"round, got {table_batch!r}")
    rng = np.random.default_rng(seed)
    streams = _QUICK if quick else _FULL
    table_d = Dispatcher(backend, policy=MeasureEach())   # pinned calls only: no model
    sync = table_d.backend.synchronize
    if walls_too is None:
        walls_too = table_d.backend.name != "host"
    reports = []
    for op_name in ops or list(streams):
        op = OPS[op_name]
        inputs = [_to_backend(op.make_inputs(dims, dtype, rng, **stats), table_d.backend.name)
                  for dims, dtype, stats in streams[op_name]]
        # the table: every candidate on every input, an input's candidates interleaved
        # round by round (a clock or load drift falls on all of them alike; one after
        # another, run S77 priced attention's choices 1.549x the oracle where S75 read
        # 1.002 on the same inputs), after two warm-up rounds (first touch, thread start,
        # format caches, a library's first call of a shape); on a device each round runs
        # BATCH calls back to back before its synchronise, as the stream runs them (a call
        # costs it its device time where the host issues ahead, its issuing where the
        # host is slower), not one call's latency to a synchronise
        batch = 1 if table_d.backend.name == "host" else table_batch or BATCH
        table: list[dict[str, float]] = []
        listed: list[dict] = []   # per input, its candidates by label
        for i, args in enumerate(inputs):
            doing(f"mixed: timing every candidate of {op_name} input {i + 1}/{len(inputs)}")
            cands = table_d.candidates(op_name, *args)
            listed.append({c.label: c for c in cands})
            runs = [_batch_of(table_d, op_name, args, c, batch) for c in cands]
            row = {}
            for cand, m in zip(cands, measure_each(runs, warmup=2, reps=repeats, sync=sync)):
                if m.error:   # a failing candidate is data
                    progress(f"  {op_name}: {cand.label} failed: {m.error}")
                row[cand.label] = math.inf if m.error else m.median_ms / batch
            table.append(row)
        progress(f"  {op_name}: timed {sum(len(r) for r in table)} (input, candidate) pairs")
        # the stream: every input calls_per_input times, interleaved in a seeded order
        order = [i for i in range(len(inputs)) for _ in range(calls_per_input)]
        rng.shuffle(order)
        labels = set().union(*table)
        fixed = {lab: sum(table[i].get(lab, math.inf) for i in order) for lab in labels}
        best_label = min(fixed, key=fixed.get)
        # adaptive as ``adaptive.launch`` serves it: started, so with the packs for this
        # device (until run S114 the stream ran without the shipped pack: learned cold)
        live = runtime.start(Dispatcher(table_d.backend))
        _fitted(live, progress)
        explored_s = _explore_s(live.policy)
        doing(f"mixed: {op_name} stream of {len(order)} calls through launch")
        # an input's first call waits for its class's decide off the calling thread, as
        # a server's warm-up does (its time counts in the stream's): without the wait,
        # run S154's gemm and spmm streams (280-320 calls of 15-50 us) were over before
        # their classes' decides (5-8 ms each, one after another on the worker), and every
        # input was priced at its stand-in, still exploring
        seen: set[int] = set()
        t0 = time.perf_counter_ns()
        for i in order:
            live.launch(op_name, *inputs[i])
            if i not in seen:
                seen.add(i)
                if not live.wait_for_decisions(60.0):
                    raise RuntimeError(f"mixed: {op_name} input {i + 1}'s decide off the "
                                       "calling thread took over 60 s")
        sync()
        adaptive_ms = (time.perf_counter_ns() - t0) / 1e6
        chosen = [live.decision(op_name, *args) for args in inputs]
        picks = [d.candidate.label for d in chosen]
        # the finalists re-timed: the table chose the oracle's and the best fixed
        # candidate by its own samples, so their prices there are the least of many
        # noisy medians (the best fixed of ~50 sums, the oracle of ~50 an input) where
        # adaptive's choice gets one; priced with fresh samples, every way is read alike
        # (run S126, 16 calls a round: rmsnorm's best fixed 1.028 against adaptive's 1.033
        # in the table, kernels that differ by their noise where the host's issuing bounds
        # them all)
        doing(f"mixed: re-timing {op_name}'s finalists")
        priced = _retime_finalists(table_d, op_name, inputs, listed, [
            {min(row, key=row.get), pick} | ({best_label} & row.keys())
            for row, pick in zip(table, picks)], batch, sync, rounds=2 * repeats + 1)
        oracle = sum(min(priced[i].values()) for i in order)
        steady = sum(priced[i][picks[i]] for i in order)
        table_oracle = sum(min(table[i].values()) for i in order)
        table_ratios = (fixed[best_label] / table_oracle,
                        sum(table[i][picks[i]] for i in order) / table_oracle)
        walls = _stream_walls(table_d, live, op_name, inputs, order, priced, listed,
                              best_label, sync, rounds=repeats, picks=picks) if walls_too \
            else None
        choices: dict[str, int] = {}
        for d in chosen:
            choices[d.candidate.label] = choices.get(d.candidate.label, 0) + 1
        reports.append(OpReport(op_name, len(inputs), len(order), oracle, best_label,
                                sum(priced[i].get(best_label, math.inf) for i in order),
                                adaptive_ms, steady,
                                _tuning_ms(live.policy, chosen, explored_s), choices,
                                sum(not d.settled for d in chosen),
                                _largest_excess(op_name, streams[op_name], priced, chosen,
                                                order, _samples_of(live, op_name, inputs),
                                                table),
                                walls, table_ratios))
    return reports


def _fitted(dispatcher, progress) -> None:
    """Wait for the first fit of the dispatcher's model (a learned policy fits the shipped
    pack's rows in a background thread as the dispatcher starts: on the H200's host several
    seconds, as a server's first seconds), so the stream is decided and timed as a server
    up for that long serves it, not cold beside the fit (run S113's mixed table did neither:
    samples of 1-2.6 ms among 0.03-0.2 ms kernels, cuBLAS committed against on them)."""
    rows = sum(len(batch) for batch, _ in dispatcher.registry.observations())
    t0 = time.perf_counter()
    if not dispatcher.settle(300.0):
        raise RuntimeError("the policy's model did not finish its first fit in 300 s")
    progress(f"  adaptive's policy: {rows} pack rows"
             + (f", its model's fit of them done {time.perf_counter() - t0:.1f} s after "
                "the stream's dispatcher started" if rows else
                " (no pack for this device: it learns from its own samples)"))


def _stream_walls(table_d, live, op_name: str, inputs, order: list[int], table, listed,
                  best_label, sync, rounds: int, picks: list[str]) -> dict:
    """The stream's calls in its order, run whole four ways, interleaved round by round
    (:func:`measure_each`, after a warm-up round): ``oracle`` (each input pinned to the
    fastest in its ``table`` row), ``fixed`` (the best fixed candidate pinned) and ``adaptive``
    (``launch``'s committed choices, warm). Median wall ms of each: what the stream costs
    the caller, issuing included, where the table prices each input's candidates alone
    from a drained device (S83: cuBLAS from CuPy priced at 69 µs a call against 8 µs of
    device time). The pinned ways go through ``launch(..., variant=, config=)``, about
    1.5-2.2 µs a call above a warm ``launch`` on the host backend: on calls of 15-25 µs
    that alone put ``launch``'s stream 7-9% ahead of the fixed one (runs S126-S129,
    rmsnorm). So a fourth way, ``chosen``, runs ``picks`` (adaptive's committed choices,
    by label) pinned like the others: the choices compared alike, ``launch``'s
    own cost the difference between it and ``adaptive``. ``listed``: each input's
    candidates by label, as the table timed them."""
    def pinned(labels):
        cands = [by[label] for by, label in zip(listed, labels)]

        def run():
            for i in order:
                c = cands[i]
                table_d.launch(op_name, *inputs[i], variant=c.variant.name, config=c.config)
        return run

    def adaptive():
        for i in order:
            live.launch(op_name, *inputs[i])
    best = [min(row, key=row.get) for row in table]
    ways = {"oracle": pinned(best), "adaptive": adaptive, "chosen": pinned(picks)}
    if all(math.isfinite(row.get(best_label, math.inf)) for row in table):
        ways["fixed"] = pinned([best_label] * len(inputs))
    ms = measure_each(list(ways.values()), warmup=1, reps=rounds, sync=sync,
                      raise_errors=True)
    return {way: m.median_ms for way, m in zip(ways, ms)}


# a device table's calls back to back per timed round. Three (until run S125) priced a
# call with a third of a synchronise's round trip and of the drained device's first-launch
# latency: a call issue-bound in the stream read 3-6x its cost there (run S123: cuBLAS on
# float32 gemm M=64 N=256 K=1024 at 0.0545 ms in the table against 0.010-0.013 live, so a
# split-K kernel at 0.0355 priced "best"), and the table's per-input best run as a stream
# took 17.7 ms where cuBLAS pinned on every input took 11.0: an "oracle" 1.6x slower than
# a fixed choice. Sixteen back to back price a call as a stream of them costs it: its
# device time where the host issues ahead, its issuing where the host is the slower.
BATCH = 16


def _retime_finalists(d, op_name: str, inputs, listed, finalists, batch: int, sync,
                      rounds: int) -> list[dict[str, float]]:
    """Per input, {label: ms a call} of its ``finalists`` (labels of ``listed``, the
    input's candidates by label) timed afresh as the table times them (``batch`` calls a
    round, the input's finalists interleaved round by round, after one warm-up round),
    the median over ``rounds``; a failing finalist is priced inf."""
    out = []
    for i, (args, names) in enumerate(zip(inputs, finalists)):
        names = sorted(names)
        ms = measure_each([_batch_of(d, op_name, args, listed[i][n], batch) for n in names],
                          warmup=1, reps=rounds, sync=sync)
        out.append({n: math.inf if m.error else m.median_ms / batch
                    for n, m in zip(names, ms)})
    return out


def _batch_of(d, op_name: str, args, cand, n: int):
    """``n`` launches of ``cand`` on ``args`` back to back (one timed run of the table)."""
    def run():
        for _ in range(n):
            d.launch(op_name, *args, variant=cand.variant.name, config=cand.config)
    return run


def _samples_of(live, op_name: str, inputs) -> list[dict[str, tuple]]:
    """Per input, {label: the live policy's samples of it, ms} (what its medians came
    from); empty where the policy keeps none."""
    out = []
    for args in inputs:
        plan = live.current_plan(OPS[op_name].key(args, {}))
        state = live.policy.state(plan.class_key) if plan is not None else None
        out.append({c.label: tuple(got) for c, got in state.observed.items()}
                   if state is not None else {})
    return out


def _largest_excess(op_name: str, stream: list, priced: list[dict[str, float]], chosen,
                    order: list[int], samples: list[dict] | None = None,
                    table: list[dict[str, float]] | None = None) -> str:
    """The input whose adaptive choice cost the stream most over the oracle: its choice and
    the best with their ``priced`` ms (the table's, or with ``table`` given the finalists'
    re-timed ms, the table's beside them) and, where the live policy timed them, the median
    it measured (what the live choice went by) and its samples, and the stream's ms lost;
    "" when every choice is the best."""
    calls = collections.Counter(order)
    lost = [(calls[i] * (priced[i][d.candidate.label] - min(priced[i].values())), i)
            for i, d in enumerate(chosen)]
    ms, i = max(lost)
    if not ms > 0:
        return ""
    d, row = chosen[i], priced[i]
    best = min(row, key=row.get)
    observed = d.observed
    got = samples[i] if samples else {}

    def price(label: str) -> str:
        live = observed.get(label)
        seen = got.get(label)
        return (f"{label} table {row[label]:.4f} ms" if table is None else
                f"{label} re-timed {row[label]:.4f} ms (table {table[i][label]:.4f})") + (
            f", live {live:.4f} ms" if live is not None else ", not timed live") + (
            f" (samples {', '.join(f'{t:.4f}' for t in seen)})" if seen else "")
    dims, dtype, _ = stream[i]
    return (f"mixed {op_name}: largest excess {dims} {dtype}: chose {price(d.candidate.label)}"
            f"; best {price(best)}; x{calls[i]} calls = {ms:.3f} ms of the stream")


def _explore_s(policy) -> float:
    """Seconds the learned ``policy`` has spent on exploring calls so far (0 for another
    policy)."""
    from adaptive.policy.learned import Learned
    return policy.stats["explore_s"] if isinstance(policy, Learned) else 0.0


def _tuning_ms(policy, chosen, explored_s: float) -> float:
    """What timing candidates cost the stream, in ms: the misses' sweeps (measure-each's
    decisions carry them) plus a learned policy's exploring calls since ``explored_s``
    (their measured times; a committed decision carries no tuning of its own)."""
    return sum(d.tuning_ms for d in chosen) + (_explore_s(policy) - explored_s) * 1e3


# the overhead's inputs: tiny, so the variant's own time is small next to the dispatch
_TINY = {"gemm": ({"M": 4, "N": 4, "K": 4}, {}), "softmax": ({"R": 4, "C": 8}, {}),
         "attention": ({"B": 1, "H": 1, "Lq": 1, "Lk": 8, "D": 8}, {}),
         "spmm": ({"M": 8, "N": 4, "K": 8}, {"density": 0.5}),
         "rmsnorm": ({"R": 4, "C": 8}, {})}


def run_overhead(backend: str = "host", n: int = 20000, rounds: int = 7,
                 op: str = "gemm") -> dict:
    """Warm ``launch`` against calling the chosen variant's entry directly (host, a tiny
    input of ``op``)."""
    import adaptive
    from adaptive.backends.pysource import load_entry
    from adaptive.dispatch import Dispatcher
    d = Dispatcher(backend)
    dims, stats = _TINY[op]
    args = OPS[op].make_inputs(dims, "float32", np.random.default_rng(1), **stats)
    out = d.launch(op, *args)
    plan = d.current_plan(OPS[op].key(args, {}))
    entry = load_entry(plan.candidate.variant)
    kwargs = {k: v for k, v in plan.candidate.config.items() if k != "threads"}

    def direct_n():
        for _ in range(n):
            entry(*args, out=out, **kwargs)

    def launch_n():
        for _ in range(n):
            d.launch(op, *args, out=out)

    def module_n():
        for _ in range(n):
            adaptive.launch(op, *args, out=out)
    # each sample is n calls, the three ways interleaved round by round
    doing(f"overhead: {op}, {rounds} rounds of {n} calls three ways")
    ms = measure_each((direct_n, launch_n, module_n), reps=rounds, raise_errors=True)
    direct, via, module = (m.median_ms * 1e3 / n for m in ms)
    return {"direct_us": direct, "dispatcher_launch_us": via, "module_launch_us": module,
            "overhead_us": via - direct, "module_overhead_us": module - direct,
            "variant": plan.candidate.label, "op": op}


def format_mixed(reports) -> str:
    """The mixed table. Every ratio is a quotient of printed columns: fixed/oracle = best
    fixed ms / oracle ms, adaptive/oracle = adaptive steady ms / oracle ms (all three
    priced from the same re-timed finalists, the oracle the fastest of an input's, so
    neither can be below it); then, per op, the two ratios as the table alone prices
    them."""
    head = (f"{'op':<10} {'inputs':>6} {'calls':>5} {'oracle ms':>10} {'best fixed':<28} "
            f"{'fixed ms':>9} {'fixed/oracle':>12} {'adaptive steady ms':>18} "
            f"{'adaptive/oracle':>15} {'live ms':>9} {'tuning ms':>9}  choices")
    lines = [head, "-" * len(head)]
    for r in reports:
        choices = ", ".join(f"{k}×{v}" for k, v in sorted(r.choices.items(), key=lambda kv: -kv[1]))
        if r.exploring:
            choices += f" ({r.exploring} of {r.inputs} still exploring)"
        lines.append(f"{r.op:<10} {r.inputs:>6} {r.calls:>5} {r.oracle_ms:>10.3f} "
                     f"{r.fixed_best:<28.28} {r.fixed_best_ms:>9.3f} {r.fixed_ratio:>12.3f} "
                     f"{r.adaptive_steady_ms:>18.3f} {r.adaptive_ratio:>15.3f} "
                     f"{r.adaptive_ms:>9.2f} {r.tuning_ms:>9.1f}  {choices}")
    total_oracle = sum(r.oracle_ms for r in reports)
    total_fixed = sum(r.fixed_best_ms for r in reports)
    total_steady = sum(r.adaptive_steady_ms for r in reports)
    lines.append(f"all ops: oracle {total_oracle:.3f} ms, best fixed {total_fixed:.3f} ms, "
                 f"adaptive steady {total_steady:.3f} ms: best-fixed/oracle "
                 f"{total_fixed / total_oracle:.3f}, adaptive-steady/oracle "
                 f"{total_steady / total_oracle:.3f} (1.000 is optimal). The up-front table "
                 "(every candidate, median per pair) picks the best fixed candidate and each "
                 "input's best; oracle, fixed and steady are priced from each input's "
                 "finalists (its table best, the best fixed, adaptive's choice) re-timed "
                 "together, the oracle the fastest; live ms is wall time through launch, "
                 "tuning included; tuning ms is the measured time of the calls that timed "
                 "candidates (exploring calls, miss-time sweeps)")
    lines += [f"{r.op}: the table alone prices fixed/oracle {r.table_ratios[0]:.3f}, "
              f"adaptive/oracle {r.table_ratios[1]:.3f} (both picked and priced on its "
              "samples)" for r in reports if r.table_ratios]
    return "\n".join(lines)


def mixed_verdicts(reports) -> list[str]:
    """One line per op: did the adaptive choices beat the best fixed candidate?"""
    return [f"mixed {r.op}: adaptive {verdict(r.adaptive_ratio, r.fixed_ratio)} the best "
            f"fixed choice ({r.fixed_best}): adaptive/oracle {r.adaptive_ratio:.3f} vs "
            f"fixed/oracle {r.fixed_ratio:.3f}"
            + (f" ({r.exploring} of {r.inputs} inputs still exploring)" if r.exploring else "")
            for r in reports]


def format_walls(reports) -> str:
    """The stream run whole (:func:`_stream_walls`), a row per op that ran it: wall ms of
    each way (median over rounds) and the quotients of those columns. The oracle here is
    each input's fastest re-timed finalist pinned, so a way can run below it (1.000 is
    that oracle, not a floor). ``launch`` is adaptive through ``launch``; ``pinned`` its
    committed choices pinned as the oracle and the fixed choice are."""
    rows = [r for r in reports if r.walls]
    if not rows:
        return ""
    head = (f"{'op':<10} {'oracle wall ms':>14} {'fixed wall ms':>13} {'fixed/oracle':>12} "
            f"{'launch wall ms':>14} {'launch/oracle':>13} {'launch/fixed':>12} "
            f"{'pinned wall ms':>14} {'pinned/oracle':>13} {'pinned/fixed':>12}")
    lines = [head, "-" * len(head)]
    for r in rows:
        w = r.walls
        fixed, chosen = w.get("fixed", math.nan), w.get("chosen", math.nan)
        lines.append(f"{r.op:<10} {w['oracle']:>14.3f} {fixed:>13.3f} "
                     f"{fixed / w['oracle']:>12.3f} {w['adaptive']:>14.3f} "
                     f"{w['adaptive'] / w['oracle']:>13.3f} {w['adaptive'] / fixed:>12.3f} "
                     f"{chosen:>14.3f} {chosen / w['oracle']:>13.3f} {chosen / fixed:>12.3f}")
    return "\n".join(lines)


def wall_verdicts(reports) -> list[str]:
    """Per op that ran the stream whole: did adaptive's choices beat the best fixed
    candidate on the stream's wall time, through ``launch`` and pinned alike?"""
    out = []
    for r in reports:
        if not r.walls or "fixed" not in r.walls:
            continue
        w = r.walls
        fixed = w["fixed"] / w["oracle"]
        for way, what in (("adaptive", "through launch"), ("chosen", "its choices pinned")):
            if way not in w:
                continue
            mine = w[way] / w["oracle"]
            out.append(f"mixed {r.op} (the stream's wall, {what}): adaptive "
                       f"{verdict(mine, fixed)} the best fixed choice ({r.fixed_best}): "
                       f"adaptive/oracle {mine:.3f} vs fixed/oracle {fixed:.3f}")
    return out


def mixed_excesses(reports) -> list[str]:
    """Per op, the input whose adaptive choice lost the stream most against the oracle."""
    return [r.excess for r in reports if r.excess]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mode", nargs="?", default="all",
                        choices=("all", "mixed", "overhead", "selection"),
                        help="which benchmark (default: all)")
    parser.add_argument("--backend", default="auto", choices=("auto", "host", "cuda"))
    parser.add_argument("--quick", action="store_true", help="small inputs, for CI")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", default="", help="comma-separated subset of "
                        f"{', '.join(sorted(OPS))} for the mixed workload and the overhead "
                        "(the selection benchmark's streams are fixed)")
    parser.add_argument("--table-batch", type=int, default=None, metavar="N",
                        help="the mixed table on a device: calls back to back per timed "
                        f"round (default {BATCH})")
    parser.add_argument("--plot", default=None, metavar="IMAGE",
                        help="also draw the results (selection: steady/oracle, tuning runs, "
                        "first result per stream; the mixed table) into IMAGE (.png, .svg, "
                        "...; needs matplotlib, the [plot] extra)")


def parse_ops(text: str) -> list[str] | None:
    """``--ops``: a comma-separated list of op names (None when empty); unknown names are
    refused with the valid ones."""
    import difflib
    ops = [o.strip() for o in text.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            near = difflib.get_close_matches(o, OPS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise InputValueError(f"--ops: unknown op {o!r}{hint}; valid ops: "
                                  f"{', '.join(sorted(OPS))}")
    return ops or None


def run(args) -> int:
    from adaptive.backends import get_backend, resolve_name
    ops = parse_ops(args.ops)
    if args.plot is not None:
        if args.mode == "overhead":
            raise InputValueError("--plot: the overhead benchmark draws no figure; plot "
                                  "'all', 'selection' or 'mixed'")
        from adaptive import plots
        plots.check_output(args.plot)   # a name it cannot write is said now, not after the run
    backend = resolve_name(args.backend)
    get_backend(backend)   # an unavailable backend is said now, in one line, not mid-run
    print(f"adaptive bench: backend={backend} quick={args.quick} seed={args.seed}", flush=True)
    with Heartbeat("adaptive bench"):
        return _run(args, backend, ops)


def _run(args, backend: str, ops: list[str] | None) -> int:
    verdicts: list[str] = []
    report = reports = None
    if args.mode in ("all", "selection"):
        doing("selection benchmark")
        try:
            from adaptive.bench.selection import run_selection
        except ImportError:
            if args.mode == "selection":
                print("selection benchmark not available in this build", file=sys.stderr)
                return 2
        else:
            report = run_selection(backend, args.quick, args.seed,
                                   progress=lambda m: print("  " + m, flush=True))
            print(report, flush=True)       # it ends with its verdicts
            if args.mode == "all":          # the job's last lines gather every verdict
                verdicts += report.verdicts()
    if args.mode in ("all", "overhead"):
        for op in ops or ["gemm"]:
            o = run_overhead("host", op=op)
            print(f"\nhot path (host, warm, tiny {op}, {o['variant']}): variant called directly "
                  f"{o['direct_us']:.2f} µs, Dispatcher.launch {o['dispatcher_launch_us']:.2f} "
                  f"µs (+{o['overhead_us']:.2f} µs), adaptive.launch "
                  f"{o['module_launch_us']:.2f} µs (+{o['module_overhead_us']:.2f} µs); "
                  f"launch/direct ratio {o['module_launch_us'] / o['direct_us']:.2f}; target: "
                  "at most +5 µs", flush=True)
    if args.mode in ("all", "mixed"):
        reports = run_mixed(backend, quick=args.quick, seed=args.seed, ops=ops,
                            progress=lambda s: print(s, flush=True),
                            table_batch=args.table_batch)
        print("\nmixed workload through launch vs every fixed candidate and the oracle")
        print(format_mixed(reports))
        excesses = mixed_excesses(reports)
        if excesses:
            print("\n" + "\n".join(excesses))
        walls = format_walls(reports)
        if walls:
            print("\nthe same stream run whole, each way pinned or through launch (wall time,"
                  " issuing included; median over rounds, the ways interleaved)")
            print(walls)
        verdicts += mixed_verdicts(reports) + wall_verdicts(reports)
    if args.plot is not None:
        from adaptive import plots
        plots.save(plots.bench_figure(selection=report, mixed=reports)[0], args.plot)
        print(f"\nwrote {args.plot}")
    if verdicts:
        print("\ndid adaptive beat the best fixed choice? (steady state, per stream)")
        print("\n".join(verdicts))
    return 0
