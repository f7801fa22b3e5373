"""``adaptive regen --op OP --shape ... --generator ...``: one regeneration loop, with progress.

Measures the current best for the input class on this machine's backend (the
dispatcher's own choice), then runs generate → verify → feedback within the budget and
prints each verdict as it comes. ``--pack FILE`` writes the winner as a variant pack.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from adaptive import arrays
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from adaptive.ops import OPS
    parser.add_argument("--op", required=True, choices=sorted(OPS))
    parser.add_argument("--shape", required=True, help="target dims, e.g. M=512,N=512,K=256")
    parser.add_argument("--dtype", default="float32",
                        help="element type, one the op takes (e.g. float16, bfloat16, float32)")
    parser.add_argument("--generator", default="parametric", choices=("parametric", "hf",
                                                                       "openai"))
    parser.add_argument("--backend", default="auto", help="auto, cuda or host")
    parser.add_argument("--model", help="hf: path or hub id; openai: model name")
    parser.add_argument("--base-url", help="openai: endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--candidates", type=int, help="candidate budget")
    parser.add_argument("--budget-s", type=float, help="wall-time budget in seconds")
    parser.add_argument("--timeout", type=float, help="verifier limit per candidate (s)")
    parser.add_argument("--pack", metavar="FILE", help="write the winner (variant, verifier "
                        "report, timing) as a variant pack")
    parser.add_argument("--json", action="store_true", help="print the loop's result as JSON")


MAX_TIMED = 64          # candidates timed for the current best (the policy's picks first)
REPS = 3                # timed runs each (the minimum counts), after one warm-up


def current_best(d, op, problem, key, inputs, plan, max_timed: int = MAX_TIMED,
                 reps: int = REPS) -> tuple[object, float, dict[str, float]]:
    """``(candidate, best_ms, timed)``: the fastest current candidate for this input.

    The dispatcher's own decision and the policy's measurements come first; then every
    other candidate that fits, timed here on the target input (up to ``max_timed``), so
    the baseline a regenerated variant must beat is the true current best, not whichever
    candidate the policy happened to try first."""
    decision = plan.decision
    observed = dict(decision.observed) if decision is not None else {}
    predicted = dict(decision.predicted_ms) if decision is not None else {}
    pool = d.candidates(op.name, *inputs, **problem.params_dict)
    order = sorted(pool, key=lambda c: (c.label != plan.candidate.label,
                                        observed.get(c.label, math.inf),
                                        predicted.get(c.label, math.inf)))
    timed: dict[str, float] = {}
    by_label = {}
    for cand in order[:max_timed]:
        runs = [d.time_candidate(cand, op.name, *inputs, warmup=1 if i == 0 else 0,
                                 **problem.params_dict) for i in range(reps)]
        timed[cand.label] = min(runs)
        by_label[cand.label] = cand
    finite = {k: v for k, v in timed.items() if math.isfinite(v)}
    if not finite:
        return plan.candidate, math.inf, timed
    label = min(finite, key=finite.get)
    return by_label[label], finite[label], timed


def check_dtype(op, dtype: str) -> None:
    """Raise ValueError unless ``op`` takes ``dtype``."""
    if dtype not in op.dtypes:
        raise ValueError(f"--dtype {dtype}: {op.name} takes {', '.join(op.dtypes)}")


def measured_request(op_name: str, dims: dict, dtype: str, backend: str = "auto"):
    """A Request for the input class with its true current best: the dispatcher runs once
    on fresh inputs, then its candidates are timed on them (:func:`current_best`)."""
    from adaptive.dispatch import Dispatcher
    from adaptive.observation import floor_ms
    from adaptive.ops import get_op
    from adaptive.peaks import raise_to_observed
    from adaptive.regen.request import Request
    from adaptive.regen.shapes import check_dims, make_inputs
    op = get_op(op_name)
    check_dims(op, dims)
    check_dtype(op, dtype)
    d = Dispatcher(backend)
    inputs = make_inputs(op, dims, dtype, 0, "normal")
    if d.backend.name == "cuda":
        inputs = arrays.to_cuda(inputs)
    try:
        d.launch(op_name, *inputs)
    except Exception as exc:  # noqa: BLE001 (say which input class cannot run here)
        raise ValueError(f"{op_name} {dims} {dtype} cannot run on the {d.backend.name} "
                         f"backend: {exc}") from None
    plan = d.current_plan(op.key(inputs, {}))
    best, best_ms, timed = current_best(d, op, plan.problem, plan.key, inputs, plan)
    raise_to_observed(d.backend, plan.flops, plan.bytes, best_ms, dtype)   # floor <= best_ms
    floor = floor_ms(plan.flops, plan.bytes, d.backend.peaks(), dtype)
    chose = plan.candidate.label
    reason = (f"requested from the command line; the current best is the fastest of "
              f"{len(timed)} candidates timed on the target input"
              + (f" (the dispatcher's pick was {chose})" if chose != best.label else ""))
    return Request(op=op_name, dims=dims, dtype=dtype, backend=d.backend.name,
                   best=best, best_ms=best_ms, floor_ms=floor, samples=REPS,
                   stats=plan.problem.extra_dict, features=op.features(plan.problem),
                   observed_ms=timed, limits=d.limits, reason=reason), d.registry


def run(args: argparse.Namespace) -> int:
    from adaptive.regen import Budget, Verifier, make_generator, run_loop
    from adaptive.regen.loop import MIN_SPEEDUP
    from adaptive.regen.shapes import parse_dims
    try:
        dims = parse_dims(args.shape)
        request, registry = measured_request(args.op, dims, args.dtype, args.backend)
        kwargs = {}
        if args.generator == "hf" and args.model:
            kwargs["model"] = args.model
        if args.generator == "openai":
            kwargs.update({k: v for k, v in (("model", args.model),
                                              ("base_url", args.base_url)) if v})
        generator = make_generator(args.generator, registry, **kwargs)
        default = Budget.from_config()
        budget = Budget(wall_s=args.budget_s or default.wall_s,
                        candidates=args.candidates or default.candidates)
    except ValueError as exc:
        print(f"adaptive regen: {exc}", file=sys.stderr)
        return 2
    print(f"{request.label}: current best {request.best.label} "
          f"{request.best_ms:.4g} ms (efficiency {request.efficiency:.1%}; fastest of "
          f"{len(request.observed_ms)} candidates timed here); "
          f"generator {args.generator}, budget {budget.candidates} candidates / "
          f"{budget.wall_s:.0f} s", flush=True)
    t0 = time.monotonic()

    def progress(attempt, i, n):
        r = attempt.report
        mark = "ok " if r.ok else "-- "
        speed = f" {r.speedup:.2f}x" if r.ok and math.isfinite(r.baseline_ms) else ""
        print(f"[{i:>3}/{n}] {time.monotonic() - t0:6.1f}s {mark}{r.verdict}{speed}", flush=True)

    result = run_loop(request, generator, Verifier(timeout_s=args.timeout), budget, registry,
                      progress=progress)
    print(result.summary())
    status = 0
    if args.pack and result.promoted is not None:
        from adaptive.regen.loop import write_pack
        print(f"wrote {args.pack} (sha256 {write_pack(result, args.pack)[:12]})")
    elif args.pack:
        print(f"adaptive regen: no winner (no verified candidate beat the current best "
              f"{request.best.label} by {MIN_SPEEDUP:.2f}x); nothing written to {args.pack}",
              file=sys.stderr)
        status = 1
    if args.json:
        print(json.dumps({"summary": result.summary(), "stopped": result.stopped,
                          "wall_s": result.wall_s,
                          "attempts": [a.report.to_dict() for a in result.attempts]}, indent=2))
    return status
