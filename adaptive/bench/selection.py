"""The selection benchmark: how well, and at what tuning cost, each policy picks candidates.

Three seeded streams of inputs (decode-heavy, a long-sequence burst, a uniform mix) go
through five ways of choosing: the per-input oracle, the best single fixed candidate, a
Triton-style exhaustive autotune of every new key, the foundation's measure-each, and
the learned policy: cold (no pack), started from a pack of other inputs measured in the
same run (``learned-pack``), and, where one was measured on this very device, started
from the shipped pack (``learned-shipped``). Each live policy gets a dispatcher of its
own on a fresh registry, so no pack reaches one unless the benchmark loads it there, the
way a server does (``load_pack``).

Every (input, candidate) pair is timed once up front (warm-up, median of ``repeats``)
into a table: it picks the oracle's and the best fixed candidate's choices and prices
autotune (1 warm-up + 3 timed runs of every candidate on first sight) and exploration
regret. Measure-each and the learned policy run *live* through :meth:`Dispatcher.launch`:
their total (tuning included) and first-result wall times are measured there.

Steady state is *re-timed*, the same way for every policy: after the live runs, each
(input, candidate) that some policy ends on (the table's best per input, the best fixed
candidate, every live policy's final choice) is timed in rounds, each call synchronised
as the live stream runs it (the live loop waits for every call), an input's candidates
interleaved round by round so that they meet the same machine, and its per-call time is
the minimum over rounds. A policy's ``steady ms`` is the stream's calls priced with those
times; the oracle's is, per input, the fastest of the re-timed candidates, so no policy's
steady time can be below it, and every ``steady/oracle`` is the quotient of the two
printed columns.

On a device the same pairs are also timed *pipelined*, in batches of
:data:`PIPELINED_BATCH` calls synchronised once (a caller that does not wait for each
call: the host's issuing of one call overlaps the device's run of the one before), and
each stream prints its policies' steady/oracle in that regime beside it. The two regimes
can rank one input's candidates oppositely where the host's issuing is as long as the
device's run: on the H200 (run S89, gemm M=16 N=2048 K=2048 fp16) cuBLAS called from CuPy
took 0.0372 ms synchronised against ``tc_wide``'s 0.0415, and 0.0406 against 0.0305 in
batches of 3. The policies are charged in the live stream's regime (the dispatcher adds
a host-bound class's issuing to its samples' device times, ``Dispatcher.issue_charge``
"sum"), so that is the regime their verdicts are read in.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import statistics
import tempfile
import time
import types
from pathlib import Path

import numpy as np

from adaptive import arrays
from adaptive.bench import verdict
from adaptive.ops import OPS
from adaptive.progress import doing
from adaptive.timing import GcClock, measure, measure_each

AUTOTUNE_RUNS = 4   # Triton-style: warm-up + 3 timed runs of every candidate on a new key
PIPELINED_BATCH = 8   # calls per synchronise in the pipelined re-time (devices only)


def _spec(op, dtype="float32", stats=None, params=None, **dims):
    return (op, tuple(dims.items()), dtype, tuple((stats or {}).items()),
            tuple((params or {}).items()))


def _streams(quick: bool, cuda: bool):
    """stream name -> function(rng) -> one input spec (op, dims, dtype, stats, params).

    On CUDA every stream is float16, the dtype an inference server runs (and the one the
    tensor-core variants serve). The uniform mix there draws each op equally often over
    the regimes a server meets (decode and prefill attention, one token to thousands in a
    projection, pruned weights from half full to nearly empty, rows of 128 to 32000), with
    sizes chosen so no single op's calls dominate the total.
    """
    big = 4 if cuda else 1
    lk_top = 14 if cuda else (10 if quick else 12)
    dt = "float16" if cuda else "float32"

    def decode(rng):
        if rng.random() < 0.7:
            lk = int(2 ** rng.integers(7, lk_top + 1))
            return _spec("attention", dt, B=int(rng.choice([1, 2])), H=4 * big, Lq=1, Lk=lk,
                         D=64, params={"causal": True})
        n = int(rng.choice([256, 512, 1024])) * big
        return _spec("gemm", dt, M=int(rng.choice([1, 4, 16])), N=n, K=n)

    def burst(rng):
        lmax = 12 if cuda else (9 if quick else 10)
        length = int(2 ** rng.integers(7, lmax + 1))
        if rng.random() < 0.75:
            return _spec("attention", dt, B=1, H=2 * big, Lq=length, Lk=length, D=64,
                         params={"causal": bool(rng.random() < 0.5)})
        return _spec("softmax", dt, R=2 * big * length, C=length)

    def uniform_host(rng):
        op = str(rng.choice(["gemm", "spmm", "softmax", "attention"]))
        side = [64, 128, 256, 512]
        if op == "gemm":
            m, n, k = (int(rng.choice(side)) for _ in range(3))
            return _spec("gemm", M=m, N=n, K=k)
        if op == "spmm":
            d = float(rng.choice([0.5, 0.1, 0.02, 0.005]))
            blk = int(rng.choice([0, 16, 32]))
            return _spec("spmm", stats={"density": d, "block": blk}, M=side[-1], N=int(
                rng.choice([16, 64, 128])), K=side[-1])
        if op == "softmax":
            return _spec("softmax", R=int(rng.choice(side)) * 4, C=int(rng.choice(side)) * 2)
        length = int(rng.choice(side))
        return _spec("attention", B=1, H=2, Lq=length, Lk=length, D=64)

    def uniform_cuda(rng):
        op = str(rng.choice(["gemm", "spmm", "softmax", "attention"]))
        if op == "gemm":
            n = int(rng.choice([1024, 2048, 4096]))
            return _spec("gemm", dt, M=int(rng.choice([1, 16, 64, 256, 1024])), N=n,
                         K=int(rng.choice([1024, 2048, 4096])))
        if op == "spmm":
            d = float(rng.choice([0.5, 0.1, 0.01, 0.001]))
            return _spec("spmm", dt, stats={"density": d, "block": int(rng.choice([0, 32]))},
                         M=4096, N=int(rng.choice([16, 64, 128, 256])), K=4096)
        if op == "softmax":
            cols = int(rng.choice([128, 512, 1024, 4096, 32000]))
            rows = int(rng.choice([1, 8, 64, 512, 4096]))
            return _spec("softmax", dt, R=max(1, min(rows, (1 << 23) // cols)), C=cols)
        length = int(rng.choice([128, 256, 512, 1024, 2048]))
        lq = 1 if rng.random() < 0.4 else length
        return _spec("attention", dt, B=int(rng.choice([1, 4])), H=16, Lq=lq, Lk=length,
                     D=128, params={"causal": True})

    return {"decode-heavy": decode, "long-burst": burst,
            "uniform-mix": uniform_cuda if cuda else uniform_host}


@dataclasses.dataclass
class PolicyResult:
    """One policy on one stream; times in ms."""

    policy: str
    source: str                  # "replayed" (from the table) or "live" (through launch)
    total_ms: float              # the whole stream, tuning included (live or from the table)
    steady_ms: float             # the stream with every key decided, re-timed (see above)
    steady_ratio: float          # steady_ms / the oracle's steady_ms
    first_result_ms: float       # mean over new keys: miss + tuning + first run
    first_result_max_ms: float
    regret_ms: float             # exploration/tuning work beyond the oracle's time
    explored: int = 0            # candidate runs spent on exploring/tuning
    # a live learned policy's own counts at the end of the stream (commits, those of them
    # settled before their last samples, drifts, classes deferred to the library for want
    # of exploration budget, reopened, explore_s)
    policy_stats: dict = dataclasses.field(default_factory=dict)
    # a live policy's host issuing charged to exploring samples, per variant and input kind:
    # [kept issuings, the least of them in ms] (Dispatcher.issue_charges: what a
    # host-bound input class's samples are charged)
    issue_ms: dict = dataclasses.field(default_factory=dict)
    # a live policy's first results split (means over the stream's new keys, ms): the
    # miss (the decision and the first candidate's preparation) and, of it, the decision
    first_miss_ms: float = math.nan
    first_decide_ms: float = math.nan
    first_policy_ms: float = math.nan   # of the decision, the policy's own decide
    first_listing_ms: float = math.nan  # of the decision, listing the candidates
    # per op: (new keys, mean first result ms, mean deciding ms) of a live policy
    first_by_op: dict = dataclasses.field(default_factory=dict)
    first_gc_ms: float = math.nan   # of a first result, Python's garbage collector (mean)
    # input classes decided off the calling thread (Dispatcher.off_thread_decides): how
    # many, and means of the policy's decide and of the time from the miss to the
    # decision (the stand-in served the class's calls meanwhile), ms
    off_thread: tuple = (0, math.nan, math.nan)
    # the same choices re-timed pipelined (PIPELINED_BATCH calls a synchronise; a device
    # only, else NaN): ms, and over the oracle's ms in that regime (its fastest per input)
    pipelined_ms: float = math.nan
    pipelined_ratio: float = math.nan


@dataclasses.dataclass
class StreamReport:
    stream: str
    keys: int
    calls: int
    candidates: int              # (input, candidate) pairs in the table
    oracle_ms: float             # the oracle's re-timed steady ms
    results: list[PolicyResult]
    # per input: {"calls": its calls in the stream, "choices": {"policy/source": [final
    # choice, its re-timed ms, its table ms, its pipelined re-timed ms (NaN on the
    # host)]}, "why": {"policy/source": the learned
    # policy's account of its class (what it explored, each candidate's samples, why it
    # committed)}}, so a steady/oracle can be traced to the inputs where a policy chose
    # differently, and to the samples it chose by
    per_input: dict = dataclasses.field(default_factory=dict)

    def largest_excess(self, policy: str) -> str:
        """The input where a live policy's final choice loses the most of the stream's time
        to the oracle's (its calls × the re-timed difference), in a line; "" when it loses
        none."""
        worst, line = 0.0, ""
        for name, entry in self.per_input.items():
            mine, best = entry["choices"].get(f"{policy}/live"), \
                entry["choices"].get("oracle/replayed")
            if mine is None or best is None:
                continue
            excess = entry["calls"] * (mine[1] - best[1])
            if excess > worst:
                worst = excess
                line = (f"  {policy} (live) largest excess: {name}: {mine[0]} {mine[1]:.4f} "
                        f"ms against {best[0]} {best[1]:.4f} ms, x{entry['calls']} calls = "
                        f"{excess:.3f} ms of the stream's "
                        f"{self.result(policy).steady_ms - self.oracle_ms:.3f}")
        return line

    def result(self, policy: str, source: str = "live") -> PolicyResult:
        return next(r for r in self.results if r.policy == policy and r.source == source)

    def lines(self) -> list[str]:
        """This stream's part of the printed report: its table of policies, the learned
        policies' counts and first results, the issuing charged, each live policy's
        largest excess and, on a device, the pipelined steady/oracle."""
        head = (f"  {'policy':<16} {'total from':<10} {'total ms':>9} {'steady ms':>9} "
                f"{'steady/oracle':>13} {'1st result ms':>13} {'1st max ms':>10} "
                f"{'regret ms':>9} {'tuning runs':>11}")
        out = ["", f"{self.stream}: {self.keys} inputs, {self.calls} calls, {self.candidates} "
                    f"(input, candidate) pairs timed; oracle steady {self.oracle_ms:.3f} ms",
               head]
        for r in self.results:
            out.append(f"  {r.policy:<16} {r.source:<10} {r.total_ms:>9.2f} "
                       f"{r.steady_ms:>9.3f} {r.steady_ratio:>13.3f} "
                       f"{r.first_result_ms:>13.3f} {r.first_result_max_ms:>10.2f} "
                       f"{r.regret_ms:>9.2f} {r.explored:>11}")
        out += [f"  {r.policy}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float)
                                              else f"{k} {v}"
                                              for k, v in r.policy_stats.items())
                for r in self.results if r.policy_stats]
        out += [f"  {r.policy} first result {r.first_result_ms:.2f} ms: the miss "
                f"{r.first_miss_ms:.2f} (deciding {r.first_decide_ms:.2f}: the policy "
                f"{r.first_policy_ms:.2f}, the listing {r.first_listing_ms:.2f}, the "
                f"rest {r.first_decide_ms - r.first_policy_ms - r.first_listing_ms:.2f};"
                f" preparing "
                f"{r.first_miss_ms - r.first_decide_ms:.2f}), the launch and its wait "
                f"{r.first_result_ms - r.first_miss_ms:.2f}; garbage collection in it "
                f"{r.first_gc_ms:.2f}"
                for r in self.results if not math.isnan(r.first_miss_ms)]
        out += [f"  {r.policy}: {r.off_thread[0]} input classes decided off the calling "
                f"thread, the policy's decide {r.off_thread[1]:.2f} ms each, "
                f"{r.off_thread[2]:.2f} ms from the miss to the decision (the stand-in "
                f"serving meanwhile)" for r in self.results if r.off_thread[0]]
        out += [f"  {r.policy} first result by op: " + ", ".join(
            f"{op} {ms:.2f} ms (deciding {dm:.2f}, {n} keys)"
            for op, (n, ms, dm) in r.first_by_op.items())
            for r in self.results if r.first_by_op]
        out += [f"  {r.policy} ({r.source}) issuing charged: " + ", ".join(
            f"{k} {ms * 1e3:.1f} us (last {n})" for k, (n, ms) in sorted(r.issue_ms.items()))
            for r in self.results if r.issue_ms]
        out += [line for r in self.results if r.source == "live"
                for line in [self.largest_excess(r.policy)] if line]
        piped = [r for r in self.results if not math.isnan(r.pipelined_ratio)]
        if piped:
            out.append(f"  pipelined, {PIPELINED_BATCH} calls a synchronise (a caller "
                       "that does not wait for each call), steady/oracle: " + ", ".join(
                           f"{r.policy} ({r.source}) {r.pipelined_ratio:.3f}"
                           for r in piped if r.policy != "oracle"))
        return out


@dataclasses.dataclass
class SelectionReport:
    backend: str
    quick: bool
    seed: int
    streams: list[StreamReport]
    accuracy: object             # adaptive.policy.cost_model.Accuracy on the stream inputs
    hot_path: dict               # warm-hit cost, learned vs measure-each
    max_threads: int = 0         # host BLAS thread cap in force (0: all cores)
    shipped: str = ""            # the shipped pack for this device ("" where none)
    learned: dict = dataclasses.field(default_factory=dict)   # the live Learned's arguments

    @classmethod
    def from_dict(cls, data: dict) -> SelectionReport:
        """The report ``dataclasses.asdict`` wrote (``gpu_selection.json``), read back: its
        tables, verdicts, targets and figure come out as the run's did."""
        from adaptive.policy.cost_model import Accuracy
        def known(klass, d):
            names = {f.name for f in dataclasses.fields(klass)}
            return {k: v for k, v in d.items() if k in names}

        def result(d):
            r = PolicyResult(**known(PolicyResult, d))
            r.off_thread = tuple(r.off_thread)
            return r
        streams = [StreamReport(**{**known(StreamReport, s),
                                   "results": [result(r) for r in s["results"]]})
                   for s in data["streams"]]
        accuracy = data["accuracy"]
        if isinstance(accuracy, dict):
            accuracy = Accuracy(**known(Accuracy, accuracy))
        return cls(**{**known(cls, data), "streams": streams, "accuracy": accuracy})

    def result(self, stream: str, policy: str) -> PolicyResult:
        """The live result of ``policy`` on ``stream`` where there is one, else the replayed."""
        s = next(s for s in self.streams if s.stream == stream)
        found = [r for r in s.results if r.policy == policy]
        return next((r for r in found if r.source == "live"), found[0])

    def tuning_share(self, stream: str, policy: str) -> float:
        """``policy``'s exploring runs on ``stream`` over exhaustive autotune's (its
        "tuning runs", the bar: under 10%)."""
        return (self.result(stream, policy).explored
                / max(1, self.result(stream, "autotune").explored))

    def steady_ratio(self, policy: str) -> float:
        """Steady-state time of ``policy``'s choices over the oracle's, all streams together."""
        num = sum(self.result(s.stream, policy).steady_ratio * s.oracle_ms for s in self.streams)
        return num / sum(s.oracle_ms for s in self.streams)

    def targets(self) -> list[tuple[str, str, bool]]:
        """(target, measured, met) for the selection targets, from this one run."""
        learned = [p for p in ("learned-pack", "learned-shipped")
                   if p != "learned-shipped" or self.shipped]
        out = []
        for p in learned:
            ratios = [self.result(s.stream, p).steady_ratio for s in self.streams]
            out.append((f"{p}: steady state within 5% of the oracle on each stream",
                        ", ".join(f"{r:.3f}" for r in ratios), max(ratios) <= 1.05))
            mix = next((s for s in self.streams if s.stream == "uniform-mix"), None)
            if mix is not None:
                gain = (self.result(mix.stream, "best-fixed").steady_ratio
                        / self.result(mix.stream, p).steady_ratio)
                out.append((f"{p}: >= 1.2x faster than the best fixed candidate on the "
                            "uniform mix", f"{gain:.3f}x", gain >= 1.2))
            firsts = [self.result(s.stream, p).first_result_ms for s in self.streams]
            out.append((f"{p}: first result of a new key under 5 ms (mean per stream)",
                        ", ".join(f"{t:.2f} ms" for t in firsts), max(firsts) < 5.0))
            shares = [self.tuning_share(s.stream, p) for s in self.streams]
            out.append((f"{p}: tuning runs under 10% of exhaustive autotune's",
                        ", ".join(f"{x:.1%}" for x in shares), max(shares) < 0.10))
        if self.shipped:
            for s in self.streams:
                a = self.result(s.stream, "learned-shipped")
                b = self.result(s.stream, "learned-cold")
                out.append((f"{s.stream}: shipped pack at least as good as none (first "
                            "result, steady/oracle)",
                            f"{a.first_result_ms:.2f} vs {b.first_result_ms:.2f} ms, "
                            f"{a.steady_ratio:.3f} vs {b.steady_ratio:.3f}",
                            a.first_result_ms <= b.first_result_ms
                            and a.steady_ratio <= b.steady_ratio))
        out.append(("warm hit no costlier than the foundation's hot path",
                    f"ratio {self.hot_path['ratio']:.3f}", self.hot_path["ratio"] <= 1.05))
        return out

    def targets_table(self) -> str:
        rows = ["| target | measured | status |", "| --- | --- | --- |"]
        rows += [f"| {t} | {m} | {'met' if ok else 'NOT met'} |" for t, m, ok in
                 self.targets()]
        return "\n".join(rows)

    def _shipped_line(self) -> str:
        if not self.shipped:
            return "shipped pack: none for this device (learned-shipped not run)"
        parts = []
        for s in self.streams:
            a, b = self.result(s.stream, "learned-shipped"), self.result(s.stream,
                                                                         "learned-cold")
            parts.append(f"{s.stream} first result {a.first_result_ms:.2f} vs "
                         f"{b.first_result_ms:.2f} ms, steady/oracle {a.steady_ratio:.3f} vs "
                         f"{b.steady_ratio:.3f}")
        return f"shipped pack {self.shipped} (with vs without): " + "; ".join(parts)

    def __str__(self) -> str:
        out = [f"selection benchmark: backend={self.backend} quick={self.quick} "
               f"seed={self.seed} max_threads={self.max_threads or 'all'}"]
        for s in self.streams:
            out += s.lines()
        learned = ("learned-cold", "learned-pack") + (("learned-shipped",) if self.shipped
                                                       else ())
        out += ["", "steady/oracle over all streams: " + ", ".join(
            f"{p} {self.steady_ratio(p):.3f}" for p in ("best-fixed", "measure-each")
            + learned), self._shipped_line(),
                str(self.accuracy) + " (model fitted on the pack inputs only)",
                f"warm hit: learned {self.hot_path['learned_us']:.2f} µs, measure-each "
                f"{self.hot_path['measure_each_us']:.2f} µs per launch; ratio "
                f"{self.hot_path['ratio']:.3f} (target <= 1.05); with 1-in-"
                f"{self.hot_path['sample_every']} sampling: learned "
                f"{self.hot_path['learned_sampled_us']:.2f} µs, measure-each "
                f"{self.hot_path['measure_each_sampled_us']:.2f} µs",
                "total from: replayed = priced from the up-front table, live = wall time "
                "through Dispatcher.launch, tuning included. steady ms: every policy's final "
                "choices re-timed the same way, each call synchronised as the live stream "
                "runs it (min over rounds); oracle: the fastest re-timed candidate per "
                "input; steady/oracle = steady ms / oracle steady ms.",
                ""] + self.verdicts()
        return "\n".join(out)

    def learned_policies(self) -> tuple[str, ...]:
        return ("learned-cold", "learned-pack") + (("learned-shipped",) if self.shipped
                                                   else ())

    def verdicts(self) -> list[str]:
        """One line per stream: did the adaptive policy beat the best fixed choice there?"""
        out = []
        for s in self.streams:
            fixed = self.result(s.stream, "best-fixed")
            parts = [f"{p} {self.result(s.stream, p).steady_ratio:.3f}"
                     for p in self.learned_policies()]
            main = self.learned_policies()[-1]
            won = verdict(self.result(s.stream, main).steady_ratio, fixed.steady_ratio)
            out.append(f"{s.stream}: adaptive ({main}) {won} the best fixed choice: "
                       f"steady/oracle {', '.join(parts)} vs best-fixed "
                       f"{fixed.steady_ratio:.3f}")
        return out


# ---- the table ------------------------------------------------------------------------------

def _inputs(spec, rng, backend_name: str):
    op, dims, dtype, stats, params = spec
    args = OPS[op].make_inputs(dict(dims), dtype, rng, **dict(stats))
    if backend_name != "host":
        args = arrays.to_cuda(args)
    return args, dict(params)


def _time_table(d, specs, inputs, repeats: int, sync):
    """{spec: {label: median ms}} and the Observation rows of the same timings."""
    from adaptive.policy.cost_model import candidate_row  # noqa: F401 (sklearn is needed below anyway)
    from adaptive.observation import Observation, floor_ms
    peaks = d.backend.peaks()
    table, rows = {}, []
    for i, spec in enumerate(specs):
        doing(f"selection: timing every candidate of input {i + 1}/{len(specs)}")
        args, params = inputs[spec]
        op = OPS[spec[0]]
        problem = op.problem(args, params)
        floor = floor_ms(*op.roofline(problem), peaks, problem.dtype)
        feats = op.features(problem)
        times = {}
        for cand in d.candidates(spec[0], *args, **params):
            def call(c=cand):
                d.launch(spec[0], *args, variant=c.variant.name, config=c.config, **params)
            m = measure(call, warmup=1, reps=repeats, sync=sync)
            t = math.inf if m.error else m.median_ms   # a failing candidate is data
            times[cand.label] = t
            rows.append(Observation(spec[0], dict(problem.dims), problem.dtype,
                                    cand.variant.name, cand.config, t, floor, feats,
                                    samples=repeats, source="bench"))
        table[spec] = times
    return table, rows


# ---- replayed policies ----------------------------------------------------------------------

def _replayed(table, stream) -> tuple[float, list[PolicyResult], dict]:
    """Oracle, best-fixed, autotune and measure-each priced from the table; their steady
    ms are filled in by :func:`_steady` (NaN here). Returns the oracle's table total, the
    results and each one's final choice per input, keyed by (policy, "replayed")."""
    best = {s: min(t.values()) for s, t in table.items()}
    best_label = {s: min(t, key=t.get) for s, t in table.items()}
    oracle = sum(best[s] for s in stream)
    nan = math.nan
    out = [PolicyResult("oracle", "replayed", oracle, nan, nan, 0.0, 0.0, 0.0)]
    choices = {"oracle": {s: best_label[s] for s in set(stream)}}
    fixed_total, fixed_choice = 0.0, {}
    for op in sorted({s[0] for s in stream}):
        calls = [s for s in stream if s[0] == op]
        common = set.intersection(*(set(table[s]) for s in set(calls)))
        label = min(common, key=lambda lb: sum(table[s][lb] for s in calls))
        fixed_total += sum(table[s][label] for s in calls)
        fixed_choice.update({s: label for s in calls})
    out.append(PolicyResult("best-fixed", "replayed", fixed_total, nan, nan, 0.0, 0.0, 0.0))
    choices["best-fixed"] = fixed_choice
    for name, runs in (("autotune", AUTOTUNE_RUNS), ("measure-each", 2)):
        seen, total, firsts, explored = set(), 0.0, [], 0
        for s in stream:
            if s not in seen:
                seen.add(s)
                tuning = runs * sum(t for t in table[s].values() if math.isfinite(t))
                explored += runs * len(table[s])
                firsts.append(tuning + best[s])
                total += tuning
            total += best[s]
        out.append(PolicyResult(name, "replayed", total, nan, nan, statistics.mean(firsts),
                                max(firsts), total - oracle, explored))
        choices[name] = dict(choices["oracle"])
    return oracle, out, {(p, "replayed"): ch for p, ch in choices.items()}


def _retime(d, pairs, inputs, sync, rounds: int, batch: int) -> dict:
    """{(spec, label): per-call ms}: the pairs of one input timed together, interleaved
    (:func:`measure_each`: each round runs every candidate's ``batch`` calls once, in turn,
    synchronised after each), after one warm-up batch; the minimum over rounds. A drift of
    the machine between rounds falls on an input's candidates alike, so the ones compared
    are timed under the same conditions."""
    by_spec: dict = collections.defaultdict(list)
    for spec, label in pairs:
        by_spec[spec].append(label)
    out = {}
    for spec in sorted(by_spec, key=str):
        args, params = inputs[spec]
        labels = sorted(by_spec[spec])
        cands = {c.label: c for c in d.candidates(spec[0], *args, **params)}

        def batch_of(c, op=spec[0], a=args, p=params):
            def run():
                for _ in range(batch):
                    d.launch(op, *a, variant=c.variant.name, config=c.config, **p)
            return run
        ms = measure_each([batch_of(cands[lab]) for lab in labels], warmup=1, reps=rounds,
                          sync=sync)
        for lab, m in zip(labels, ms):
            out[(spec, lab)] = math.inf if m.error else m.min_ms / batch
    return out


def _steady(d, stream, inputs, results, choices, sync, quick: bool,
            pipelined: bool = False) -> tuple[float, dict, dict]:
    """Re-time every final choice the same way, each call synchronised as the live stream
    runs it, and fill each result's steady ms and steady/oracle; with ``pipelined`` (a
    device), re-time them in batches of :data:`PIPELINED_BATCH` too and fill each result's
    pipelined ms and ratio. Returns the oracle's steady ms (the fastest re-timed per
    input) and the re-timed ms of each (input, candidate) in both regimes (the pipelined
    one empty without ``pipelined``)."""
    pairs = {(s, lab) for ch in choices.values() for s, lab in ch.items()}
    rounds = 3 if quick else 5
    t = _retime(d, pairs, inputs, sync, rounds=rounds, batch=1)
    oracle, priced = _price(t, stream, results, choices)
    for r in results:
        r.steady_ms, r.steady_ratio = priced[id(r)], priced[id(r)] / oracle
    piped = {}
    if pipelined:
        piped = _retime(d, pairs, inputs, sync, rounds=rounds, batch=PIPELINED_BATCH)
        piped_oracle, priced = _price(piped, stream, results, choices)
        for r in results:
            r.pipelined_ms, r.pipelined_ratio = priced[id(r)], priced[id(r)] / piped_oracle
    return oracle, t, piped


def _price(t: dict, stream, results, choices) -> tuple[float, dict]:
    """The stream's calls priced with the re-timed ms ``t``: the oracle's ms (the fastest
    re-timed candidate per input) and each result's ms (by ``id``)."""
    fastest = {s: min(v for (s2, _), v in t.items() if s2 == s) for s in set(stream)}
    oracle = sum(fastest[s] for s in stream)
    return oracle, {id(r): oracle if r.policy == "oracle" else
                    sum(t[(s, choices[(r.policy, r.source)][s])] for s in stream)
                    for r in results}


def _per_input(stream, choices, retimed, table, whys=None, piped=None) -> dict:
    """{input: {"calls": n, "choices": {"policy/source": [choice, re-timed ms, table ms,
    pipelined re-timed ms]}, "why": {"policy/source": the learned policy's account}}}
    (see StreamReport)."""
    piped = piped or {}
    calls = collections.Counter(stream)
    out = {}
    for s in calls:
        # the oracle's steady time is the fastest re-timed candidate, which need not be
        # the table's pick: name that one
        fastest = min((lab for s2, lab in retimed if s2 == s), key=lambda lab: retimed[(s, lab)])
        picks = {(p, src): fastest if p == "oracle" else ch[s]
                 for (p, src), ch in choices.items()}
        out[_describe(s)] = {"calls": calls[s], "choices": {
            f"{p}/{src}": [lab, retimed[(s, lab)], table[s].get(lab, math.nan),
                           piped.get((s, lab), math.nan)]
            for (p, src), lab in picks.items()}, "why": {
            f"{p}/{src}": w[s] for (p, src), w in (whys or {}).items() if s in w}}
    return out


def _describe(spec) -> str:
    op, dims, dtype, stats, params = spec
    parts = [f"{k}={v}" for k, v in (*dims, *stats, *params)]
    return f"{op}:{','.join(parts)} {dtype}"


# ---- live policies --------------------------------------------------------------------------

def _live(name, dispatcher, stream, inputs, table, sync
          ) -> tuple[PolicyResult, dict, dict]:
    """Serve ``stream`` through ``dispatcher``; the result, the final choice of each input,
    and for a learned policy each input's account of its class (its history's last two
    entries: the exploration and the commit with every candidate's samples)."""
    firsts, seen, misses = [], set(), []
    by_op: dict = {}   # op -> ([first result ms], [deciding ms])
    collecting = GcClock()
    gc_firsts = []     # ms of garbage collection inside each first result
    since = time.time()
    t_start = time.perf_counter_ns()
    try:
        for s in stream:
            args, params = inputs[s]
            wall = time.time()
            gc_before = collecting.seconds()
            t0 = time.perf_counter_ns()
            dispatcher.launch(s[0], *args, **params)
            sync()
            if s not in seen:
                seen.add(s)
                firsts.append((time.perf_counter_ns() - t0) / 1e6)
                gc_firsts.append((collecting.seconds() - gc_before) * 1e3)
                mine = dispatcher.recent_misses(since=wall)[-1:]   # outside the timing
                misses += mine
                got = by_op.setdefault(s[0], ([], []))
                got[0].append(firsts[-1])
                got[1].extend(m["decide_ms"] for m in mine)
        total = (time.perf_counter_ns() - t_start) / 1e6
    finally:
        collecting.close()
    dispatcher.wait_for_decisions()
    for _ in range(3):   # let exploring keys finish: steady state means every key decided
        for s in dict.fromkeys(stream):
            plan = dispatcher.current_plan(OPS[s[0]].key(inputs[s][0], inputs[s][1]))
            while plan is not None and plan.provisional:
                dispatcher.launch(s[0], *inputs[s][0], **inputs[s][1])
                plan = dispatcher.current_plan(OPS[s[0]].key(inputs[s][0], inputs[s][1]))
    choice = {s: dispatcher.decision(s[0], *inputs[s][0], **inputs[s][1]).candidate.label
              for s in set(stream)}
    best = {s: min(table[s].values()) for s in set(stream)}
    regret, explored = 0.0, 0
    policy = dispatcher.policy
    states = {}    # input class -> (the first input of it seen, the policy's state of it)
    why = {}       # input -> the policy's account of its class (its last two entries)
    for s in seen:
        plan = dispatcher.current_plan(OPS[s[0]].key(*inputs[s]))
        state = policy.state(plan.class_key) if plan is not None else None
        if state is not None:
            states.setdefault(plan.class_key, (s, state))
            told = list(state.history)[-2:]
            why[s] = " | ".join(told + [state.reason] * (state.reason not in told))
    if states:     # learned: price the exploring calls from the table (its committed
        for spec, state in states.values():    # choice's steady samples are calls served)
            for cand, n in state.explored.items():
                if cand.label in table[spec]:
                    regret += n * (table[spec][cand.label] - best[spec])
                    explored += n
    else:          # measure-each: its miss-time sweep is the tuning work
        for s in seen:
            dec = dispatcher.decision(s[0], *inputs[s][0], **inputs[s][1])
            regret += dec.tuning_ms
            explored += 2 * len(table[s])
    from adaptive.policy.learned import Learned
    off = dispatcher.off_thread_decides(since)
    stats = ({k: v for k, v in policy.stats.items()
              if k in ("commits", "settled", "drifts", "deferred", "reopened", "explore_s",
                       "rows_s", "predict_s")}
             if isinstance(policy, Learned) else {})
    if stats:    # exploring samples the dispatcher dropped as read past their gate
        stats["samples_past_gate"] = dispatcher.stats.get("samples_past_gate", 0)
    return PolicyResult(name, "live", total, math.nan, math.nan, statistics.mean(firsts),
                        max(firsts), regret, explored, stats,
                        {k: list(v) for k, v in dispatcher.issue_charges().items()},
                        first_miss_ms=_mean([m["ms"] for m in misses]),
                        first_decide_ms=_mean([m["decide_ms"] for m in misses]),
                        first_policy_ms=_mean([m["policy_ms"] for m in misses]),
                        first_listing_ms=_mean([m["listing_ms"] for m in misses]),
                        first_by_op={op: (len(f), statistics.mean(f), _mean(dm))
                                     for op, (f, dm) in sorted(by_op.items())},
                        first_gc_ms=_mean(gc_firsts),
                        off_thread=(len(off), _mean([o["policy_ms"] for o in off]),
                                    _mean([o["wait_ms"] for o in off]))), \
        choice, why


def _mean(values: list) -> float:
    return statistics.mean(values) if values else math.nan


def _hot_path(backend, rounds: int, n: int) -> dict:
    """Warm-hit cost of launch under the learned policy vs measure-each (tiny softmax)."""
    from adaptive.dispatch import Dispatcher
    from adaptive.policy.learned import Learned
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    if backend.name != "host":
        import cupy
        x = cupy.asarray(x)
    ds = {"learned": Dispatcher(backend, policy=Learned()),
          "measure_each": Dispatcher(backend)}
    for d in ds.values():
        while True:   # until the key is committed
            d.launch("softmax", x)
            plan = d.current_plan(OPS["softmax"].key((x,), {}))
            if not plan.provisional:
                break
    sample_every = next(iter(ds.values())).sample_every
    out = {"sample_every": sample_every}

    def calls(d):   # one sample: n warm calls
        def run():
            for _ in range(n):
                d.launch("softmax", x)
        return run
    runs = [calls(d) for d in ds.values()]
    for suffix, every in (("_us", 0), ("_sampled_us", sample_every)):
        for d in ds.values():
            d.sample_every = every
        ms = measure_each(runs, reps=rounds, raise_errors=True)   # interleaved by round
        for k, m in zip(ds, ms):
            out[k + suffix] = m.min_ms * 1e3 / n
    out["ratio"] = out["learned_us"] / out["measure_each_us"]
    return out


def run_selection(backend: str = "host", quick: bool = False, seed: int = 0,
                  progress=None, max_threads: int | None = None,
                  learned: dict | None = None) -> SelectionReport:
    """Run the selection benchmark; see the module docstring for what is live or replayed.

    Args:
        backend: "host" or "cuda" (or "auto").
        quick: small inputs and short streams (CI).
        seed: seeds the streams, the inputs and the models.
        max_threads: host BLAS thread cap; default 1 in quick host runs, because
            multi-threaded timings on a shared CI machine do not reproduce from the
            up-front table to the live run.
        learned: keyword arguments of every live :class:`Learned` policy (e.g.
            ``{"race_ratio": 1.5}``: an A/B of a parameter in one run's streams).
    """
    from adaptive import config
    from adaptive.backends import resolve_name
    if max_threads is None:
        max_threads = 1 if quick and resolve_name(backend) == "host" else \
            config.get().max_threads
    learned = dict(learned or {})
    with config.override(max_threads=max_threads):
        report = _run(backend, quick, seed, progress or (lambda s: None), learned)
    report.max_threads = max_threads
    report.learned = learned
    return report


def _run(backend: str, quick: bool, seed: int, say, learned: dict) -> SelectionReport:
    from adaptive.backends import get_backend
    from adaptive.policy.learned import Learned
    from adaptive.policy.cost_model import LiveModel, held_out_accuracy, training_set
    from adaptive.policy import MeasureEach
    be = get_backend(backend)
    sync = be.synchronize
    rng = np.random.default_rng(seed)
    n_keys, n_calls, repeats = (8, 160, 3) if quick else (16, 600, 5)
    streams = {}
    for name, draw in _streams(quick, be.name != "host").items():
        keys = list(dict.fromkeys(draw(rng) for _ in range(8 * n_keys)))[:n_keys]
        weights = 1.0 / np.arange(1, len(keys) + 1)    # Zipf: a few hot keys, a long tail
        picks = rng.choice(len(keys), size=n_calls, p=weights / weights.sum())
        streams[name] = [keys[i] for i in picks]
    pack_specs = []   # the "pack": other inputs from the same distributions
    for name, draw in _streams(quick, be.name != "host").items():
        stream_keys = set(streams[name])
        fresh = [s for s in dict.fromkeys(draw(rng) for _ in range(16 * n_keys))
                 if s not in stream_keys]
        pack_specs += fresh[: n_keys]
    specs = list(dict.fromkeys(s for st in streams.values() for s in st)) + [
        s for s in dict.fromkeys(pack_specs) if not any(s in st for st in streams.values())]
    inputs = {s: _inputs(s, rng, be.name) for s in specs}
    from adaptive.packs.format import FOREIGN_WEIGHT, read_pack
    from adaptive.packs.install import install_cubins
    shipped_paths, own = _shipped_packs(be)
    # the report's name of them: another device's (a GPU with no pack of its own starts from
    # those of its compute capability, as a server's start does) says so
    others = "all but the first" if own else "all"
    shipped = ", ".join(Path(p).name for p in shipped_paths) + (
        f" (another device's: {others}, rows weighted {FOREIGN_WEIGHT})"
        if len(shipped_paths) > own else "")
    for path in shipped_paths:   # their cubins spare the table the compiles (as a server)
        install_cubins(read_pack(path))
    if be.name == "cuda":   # the rest compile on all cores before anything is timed
        from adaptive.packs.build import precompile
        errors = precompile("cuda", be.arch, [
            types.SimpleNamespace(op=s[0], dtype=s[2]) for s in specs])
        say(f"precompiled the candidates of {len({(s[0], s[2]) for s in specs})} "
            f"(op, dtype) pairs; {len(errors)} failed to compile")
    table_d = _dispatcher(be, MeasureEach())
    table_d.sample_every = 0
    table, rows = _time_table(table_d, specs, inputs, repeats, sync)
    say(f"timed {sum(len(t) for t in table.values())} (input, candidate) pairs")
    stream_specs = {s for st in streams.values() for s in st}
    pack_rows = [r for r, s in zip(rows, _row_specs(table, specs)) if s not in stream_specs]
    test_rows = [r for r, s in zip(rows, _row_specs(table, specs)) if s in stream_specs]
    doing("selection: the model's accuracy on held-out inputs")
    # the rows as the policy's model reads them (with the candidates' launch geometry)
    accuracy = held_out_accuracy(training_set(pack_rows, geometry=table_d.row_geometry),
                                 test=training_set(test_rows, geometry=table_d.row_geometry))
    say(f"shipped pack for this device: {shipped or 'none'}")
    reports = []
    with tempfile.TemporaryDirectory(prefix="adaptive-selection-") as tmp:
        local_pack = _write_pack(be, pack_rows, Path(tmp) / "selection-pack.msgpack")
        for name, stream in streams.items():
            _, results, choices = _replayed(table, stream)
            whys = {}
            live = [("measure-each", _dispatcher(be, MeasureEach())),
                    ("learned-cold", _dispatcher(be, Learned(LiveModel(), **learned))),
                    ("learned-pack", _dispatcher(be, Learned(LiveModel(), **learned),
                                                 local_pack))]
            if shipped_paths:
                live.append(("learned-shipped",
                             _dispatcher(be, Learned(LiveModel(), **learned),
                                         *shipped_paths)))
            for label, d in live:
                doing(f"selection: {name} stream, {label}")
                result, choices[(label, "live")], whys[(label, "live")] = _live(
                    label, d, stream, inputs, table, sync)
                results.append(result)
                # a refit still running would share the interpreter with the next policy's
                # misses (a decide beside a refit of the shipped pack's rows: mean 2.2 ->
                # 4-6 ms on our CPU, single ones up to 120 ms): each policy runs alone
                waited = _settle(d)
                if waited > 0.05:
                    say(f"{name}: {label}'s model refits ran {waited:.2f} s past its stream")
            oracle, retimed, piped = _steady(table_d, stream, inputs, results, choices,
                                             sync, quick, pipelined=be.name != "host")
            keys = set(stream)
            reports.append(StreamReport(name, len(keys), len(stream),
                                        sum(len(table[s]) for s in keys), oracle, results,
                                        _per_input(stream, choices, retimed, table,
                                                   whys, piped)))
            say(f"{name}: done")
    doing("selection: hot-path timing")
    hot = _hot_path(be, rounds=21 if quick else 31, n=1000 if quick else 5000)
    return SelectionReport(be.name, quick, seed, reports, accuracy, hot, shipped=shipped or "")


def _settle(dispatcher, timeout_s: float = 120.0) -> float:
    """Wait for the dispatcher's policy's background work (a learned policy's refits); the
    seconds waited."""
    t0 = time.perf_counter()
    dispatcher.settle(timeout_s)
    return time.perf_counter() - t0


def _dispatcher(be, policy, *packs: str):
    """A dispatcher on its own registry of the built-in variants, so no pack reaches it
    unless given here, its candidates made as a started one's; with ``packs``, loaded the
    way a server loads them (``load_pack``; another device's down-weighted), the model's
    first fit done before the stream starts."""
    import warnings
    from adaptive.dispatch import Dispatcher
    from adaptive.packs.install import PackDeviceWarning, load_pack
    from adaptive.variants import default_registry
    d = Dispatcher(be, policy=policy, registry=default_registry())
    d.prepare_candidates()   # as adaptive.runtime.start does: not on each op's first miss
    for pack in packs:
        with warnings.catch_warnings():   # the report names another device's packs
            warnings.simplefilter("ignore", PackDeviceWarning)
            report = load_pack(pack, registry=d.registry, fingerprint=be.fingerprint())
        if not report.rows:
            raise RuntimeError(f"pack {pack} gave no rows for {be.name}: {report}")
    if packs:
        policy.model.wait()
    return d


def _write_pack(be, rows, path: Path) -> str:
    """The pack inputs' rows as a real pack file (variants as registered now)."""
    from adaptive.packs.format import new_pack, write_pack
    from adaptive.variants import default_registry
    reg = default_registry()
    names = sorted({(r.op, r.variant) for r in rows})
    write_pack(new_pack([reg.get(op, name) for op, name in names], rows, be.fingerprint(),
                        build={"by": "adaptive bench selection"}), path)
    return str(path)


def _shipped_packs(be) -> tuple[list[str], bool]:
    """The shipped packs a server on this device starts from
    (:func:`~adaptive.packs.install.startup_shipped`), and whether any was measured on it;
    ``([], False)`` where none."""
    from adaptive.packs.install import startup_shipped
    shipped = startup_shipped(be.fingerprint())
    return [str(p) for p, _ in shipped], any(own for _, own in shipped)


def _row_specs(table, specs):
    """The spec of each table row, in the order _time_table wrote them."""
    return [s for s in specs for _ in table[s]]


def main_report(backend: str = "host", quick: bool = False, seed: int = 0) -> str:
    """The benchmark as text (``adaptive bench selection`` prints this)."""
    return str(run_selection(backend, quick, seed, progress=lambda s: print("  " + s,
                                                                              flush=True)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", choices=("auto", "host", "cuda"))
    parser.add_argument("--quick", action="store_true", help="small inputs, for CI")
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    from adaptive.backends import resolve_name
    print(main_report(resolve_name(args.backend), args.quick, args.seed))
    return 0
