"""Another device's pack as the model's prior, replayed (CPU): what a GPU without a shipped
pack of its own gets from those of its compute capability (``shipped_packs_like``).

    python benchmarks/cpu_replay_foreign.py --prior adaptive/packs/h200.msgpack \\
        --pack adaptive/packs/h100-80gb-hbm3.msgpack [--ops spmm,softmax]

Every input of ``--pack`` is decided as on a miss by the learned policy whose model is
fitted on ``--prior``'s rows alone (another device's), then explored and committed on
``--pack``'s measured times (``adaptive.bench.replay``'s loop), against the same policy
with no model (cold: diverse candidates). Held out by input (``--folds``, 10 by default):
the prior's rows of the inputs being decided (the same op, dims and dtype, measured on the
other device) never fit the model that decides them; ``--folds 0`` keeps them. Per op:
committed/best geomean, the share within 5%, the worst input, timed exploring calls per
input.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prior", required=True, help="the pack whose rows fit the model")
    parser.add_argument("--pack", required=True, help="the pack whose inputs are decided")
    parser.add_argument("--ops", default=None, help="comma-separated ops (default: all)")
    parser.add_argument("--folds", type=int, default=10,
                        help="inputs held out of the prior in this many folds (0: none)")
    args = parser.parse_args(argv)
    from adaptive.bench import replay as R
    from adaptive.packs.format import describe_device, read_pack
    from adaptive.policy.cost_model import LiveModel, training_set
    from adaptive.policy.features import row_geometry
    from adaptive.policy.learned import Learned, Neighbours
    from adaptive.variants import make_candidate
    ops = set(args.ops.split(",")) if args.ops else None
    prior, pack = read_pack(args.prior), read_pack(args.pack)
    lim_p, lim = R._limits(prior.fingerprint), R._limits(pack.fingerprint)
    var_p = {(v.op, v.name): R._as_registered(v) for v in prior.variants}
    var = {(v.op, v.name): R._as_registered(v) for v in pack.variants}
    rows = [r for r in prior.rows if (r.op, r.variant) in var_p]
    prior_groups = R._group(rows)
    t0 = time.perf_counter()
    ts = training_set(rows, geometry=lambda r: row_geometry(var_p[(r.op, r.variant)], r,
                                                             lim_p))
    groups = R._group([r for r in pack.rows if (r.op, r.variant) in var])
    held = sorted(k for k in groups if not ops or k[0] in ops)
    fold = R.fold_of(held, args.folds) if args.folds > 0 else {k: 0 for k in held}
    print(f"prior: {len(rows)} rows of {args.prior} ({describe_device(prior.fingerprint)}); "
          f"deciding the {len(held)} inputs of {args.pack} "
          f"({describe_device(pack.fingerprint)}), "
          + (f"held out of the prior in {args.folds} folds" if args.folds > 0 else
             "the prior's rows of them kept"))
    cases: dict[str, dict[str, list]] = {"prior": {}, "cold": {}}
    for f in sorted(set(fold.values())):
        mine = {k for k in held if fold[k] == f} if args.folds > 0 else set()
        model, near = R.fitted_without(ts, prior_groups, mine)
        for key in (k for k in held if fold[k] == f):
            measured = [r for r in groups[key] if math.isfinite(r.time_ms) and r.time_ms > 0]
            if len(measured) < 2:
                continue
            for name, m, nb in (("prior", model, near), ("cold", None, Neighbours())):
                c = R._one(key, measured, m, nb.copy(), True, var, lim, Learned, LiveModel,
                           make_candidate, {}, None)
                cases[name].setdefault(c.op, []).append(c)
    print(f"({time.perf_counter() - t0:.1f} s)")
    print(f"{'model':6s} {'op':10s} inputs geomean within 5%  worst  samples/input")
    for name, by_op in cases.items():
        for op, cs in sorted(by_op.items()):
            g = math.exp(statistics.fmean(math.log(c.ratio) for c in cs))
            within = sum(c.ratio <= 1.05 for c in cs) / len(cs)
            worst = max(c.ratio for c in cs)
            per = statistics.fmean(c.samples for c in cs)
            print(f"{name:6s} {op:10s} {len(cs):6d} {g:7.3f} {within:9.0%} {worst:6.2f}x "
                  f"{per:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
