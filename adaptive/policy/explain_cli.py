"""``adaptive explain OP --shape ...``: the ranked candidates for one input, and the choice.

    adaptive explain gemm --shape M=512,N=512,K=256
    adaptive explain attention --shape B=1,H=8,Lq=1,Lk=4096,D=128 --causal --calls 0

Makes fresh random inputs of that shape (the same ``--shape`` syntax as ``adaptive
regen``), launches them through a dispatcher until its policy commits (or ``--calls``
times), and prints :func:`adaptive.explain`'s table.
"""

from __future__ import annotations

import argparse
import sys

from adaptive import arrays

MAX_CALLS = 64   # launches before giving up on a commit (the learned policy needs a few)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from adaptive.ops import OPS
    parser.add_argument("op", choices=sorted(OPS), help="the op")
    parser.add_argument("--shape", required=True,
                        help="its dims, e.g. M=512,N=512,K=256 (as for adaptive regen)")
    parser.add_argument("--dtype", default="float32", help="input dtype (default float32)")
    parser.add_argument("--backend", default="auto", choices=("auto", "cuda", "host"))
    parser.add_argument("--policy", default=None, help="learned or measure-each (default: "
                        "ADAPTIVE_POLICY)")
    parser.add_argument("--causal", action="store_true", help="attention: causal mask")
    parser.add_argument("--density", type=float, default=0.1,
                        help="spmm: fraction of non-zeros of the sparse weight (default 0.1)")
    parser.add_argument("--calls", type=int, default=None,
                        help="launches before explaining (default: until the policy commits, "
                             f"at most {MAX_CALLS}; 0: the ranking alone, nothing launched)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")


def run(args: argparse.Namespace) -> int:
    from adaptive.errors import AdaptiveError
    try:
        print(explain_shape(args))
    except (AdaptiveError, ValueError, TypeError) as exc:
        print(f"adaptive explain: {exc}", file=sys.stderr)
        return 2
    return 0


def explain_shape(args: argparse.Namespace):
    """The :class:`~adaptive.policy.explain.Explanation` of fresh inputs described by ``args``."""
    import numpy as np

    from adaptive.dispatch import Dispatcher
    from adaptive.policy.explain import explain
    from adaptive.ops import get_op
    from adaptive.regen.shapes import check_dims, parse_dims
    op = get_op(args.op)
    dims = parse_dims(args.shape)
    check_dims(op, dims)
    if args.dtype not in op.dtypes:
        raise ValueError(f"--dtype {args.dtype} is not a dtype of {op.name}; expected one of "
                         f"{', '.join(op.dtypes)}")
    if args.calls is not None and args.calls < 0:
        raise ValueError(f"--calls must be 0 or more, got {args.calls}")
    from adaptive.runtime import start
    d = start(Dispatcher(args.backend, policy=args.policy))   # with the start-up packs
    stats = {"density": args.density} if op.name == "spmm" else {}
    inputs = op.make_inputs(dims, args.dtype, np.random.default_rng(args.seed), **stats)
    if d.backend.name == "cuda":
        inputs = arrays.to_cuda(inputs)
    params = {"causal": True} if args.causal else {}
    key = op.key(inputs, params)
    limit = MAX_CALLS if args.calls is None else args.calls
    for i in range(limit):
        d.launch(op.name, *inputs, **params)
        plan = d.current_plan(key)
        if args.calls is None and plan is not None and not plan.provisional:
            break
    d.harvest()
    return explain(op.name, *inputs, dispatcher=d, **params)
