"""Another device's pack as the model's prior, replayed (CPU): what a GPU without a shipped
pack of its own gets from those of its compute capability (``shipped_packs_like``).

    python benchmarks/cpu_replay_foreign.py --prior adaptive/packs/h200.msgpack \\
        --pack adaptive/packs/h100-80gb-hbm3.msgpack [--ops spmm,softmax]

Every input of ``--pack`` is decided as on a miss by the learned policy whose model is
fitted on ``--prior``'s rows alone (another device's), then explored and committed on
``--pack``'s measured times (``adaptive.bench.replay``'s loop), against the same policy
with no model (cold: diverse candidates). With ``--beside``: ``--pack``'s own held-out
replay (10 folds by input) with the prior's rows beside its own, weighted as another
device's (0.25), the prior's rows of the decided inputs left out too ("beside") or kept
("beside+"), against its own rows alone ("own"): what ``ADAPTIVE_SIBLING_PACKS=on`` gives a
GPU with a pack of its own. Held out by input (``--folds``, 10 by default):
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
                        help="inputs held out in this many folds (0: the prior keeps them)")
    parser.add_argument("--beside", action="store_true",
                        help="the prior's rows beside --pack's own (held out by input), "
                             "weighted as another device's, against its own alone")
    parser.add_argument("--seed", type=int, default=0, help="the model's random_state")
    args = parser.parse_args(argv)
    from adaptive.bench import replay as R
    from adaptive.packs.format import FOREIGN_WEIGHT, describe_device, read_pack
    from adaptive.policy.cost_model import CostModel, LiveModel, training_set
    from adaptive.policy.features import row_geometry
    from adaptive.policy.learned import Learned, Neighbours
    from adaptive.space import as_config
    from adaptive.variants import make_candidate
    import numpy as np
    ops = set(args.ops.split(",")) if args.ops else None
    prior, pack = read_pack(args.prior), read_pack(args.pack)

    def rows_of(p):
        lim = R._limits(p.fingerprint)
        var = {(v.op, v.name): R._as_registered(v) for v in p.variants}
        rows = [r for r in p.rows if (r.op, r.variant) in var]
        ts = training_set(rows, geometry=lambda r: row_geometry(var[(r.op, r.variant)], r, lim))
        return var, lim, R._group(rows), ts
    _, _, prior_groups, prior_ts = rows_of(prior)
    var, lim, groups, own_ts = rows_of(pack)
    held = sorted(k for k in groups if not ops or k[0] in ops)
    fold = R.fold_of(held, args.folds) if args.folds > 0 else {k: 0 for k in held}
    print(f"prior: {len(prior_ts)} rows of {args.prior} ({describe_device(prior.fingerprint)})"
          f"; deciding the {len(held)} inputs of {args.pack} "
          f"({describe_device(pack.fingerprint)}), "
          + (f"held out in {args.folds} folds" if args.folds > 0 else "the prior keeps them"))

    def fitted(parts, held_out):
        """A model on ``parts`` ((training set, its rows by input, weight, keep the held
        inputs)) and the neighbours of the rows it was fitted on (weights all 1: fitted
        without sample weights, as ``adaptive pack replay`` fits)."""
        sets = [(ts.subset([i for i, g in enumerate(ts.groups) if keep or g not in held_out]),
                 w) for ts, _, w, keep in parts]
        rows = [r for ts, _ in sets for r in ts.rows]
        y = np.concatenate([np.asarray(ts.y, dtype=float) for ts, _ in sets])
        weights = np.concatenate([np.full(len(ts), w) for ts, w in sets])
        names = [(i,) + tuple(g) for i, (ts, _) in enumerate(sets) for g in ts.groups]
        model = CostModel(random_state=args.seed).fit(
            rows, y, sample_weight=None if np.all(weights == 1.0) else weights, groups=names)
        near = Neighbours()
        for _, by_input, _, keep in parts:
            for k, g in by_input.items():
                if keep or k not in held_out:
                    for r in g:
                        near.add(r.op, r.dtype, r.features, r.variant, as_config(r.config),
                                 r.time_ms)
        return model, near
    keep = args.folds <= 0
    prior_part = (prior_ts, prior_groups, 1.0, keep)
    own_part = (own_ts, groups, 1.0, False)
    if args.beside:
        setups = [("own", [own_part]),
                  ("beside", [(prior_ts, prior_groups, FOREIGN_WEIGHT, keep), own_part]),
                  ("beside+", [(prior_ts, prior_groups, FOREIGN_WEIGHT, True), own_part])]
    else:
        setups = [("prior", [prior_part]), ("cold", None)]
    t0 = time.perf_counter()
    cases: dict[str, dict[str, list]] = {name: {} for name, _ in setups}
    for f in sorted(set(fold.values())):
        mine = {k for k in held if fold[k] == f}
        for name, parts in setups:
            model, near = fitted(parts, mine) if parts else (None, Neighbours())
            for key in sorted(mine):
                measured = [r for r in groups[key]
                            if math.isfinite(r.time_ms) and r.time_ms > 0]
                if len(measured) >= 2:
                    c = R._one(key, measured, model, near.copy(), True, var, lim, Learned,
                               LiveModel, make_candidate, {}, None)
                    cases[name].setdefault(c.op, []).append(c)
    print(f"({time.perf_counter() - t0:.1f} s)" + (
        "; beside: the prior's rows of the decided inputs left out too, beside+: kept"
        if args.beside else ""))
    print(f"{'model':8s} {'op':10s} inputs geomean within 5%  worst  samples/input")
    for name, by_op in cases.items():
        for op, cs in sorted(by_op.items()):
            g = math.exp(statistics.fmean(math.log(c.ratio) for c in cs))
            within = sum(c.ratio <= 1.05 for c in cs) / len(cs)
            worst = max(c.ratio for c in cs)
            per = statistics.fmean(c.samples for c in cs)
            print(f"{name:8s} {op:10s} {len(cs):6d} {g:7.3f} {within:9.0%} {worst:6.2f}x "
                  f"{per:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
