"""``adaptive verify FILE --op OP``: run the isolated verifier on a variant source."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from adaptive.ops import OPS
    parser.add_argument("file", help="variant source (.py for host, .cu for cuda)")
    parser.add_argument("--op", required=True, choices=sorted(OPS), help="the op it implements")
    parser.add_argument("--entry", help="function or kernel name (default: the only one)")
    parser.add_argument("--config", help='launch config as JSON, e.g. \'{"rows": 32}\'')
    parser.add_argument("--shape", help="target dims, e.g. R=512,C=1000 (default: small odd)")
    parser.add_argument("--dtype", default="float32", help="element type (default float32)")
    parser.add_argument("--like", help="registered variant to borrow launch/space/requires from")
    parser.add_argument("--baseline", help="registered variant to time against")
    parser.add_argument("--timeout", type=float, help="seconds the candidate may take")
    parser.add_argument("--regime", action="append", metavar="NAME",
                        help="check only these value regimes (repeatable; default: all of the "
                             "op's, e.g. softmax: normal, uniform, shifted, large, masked, "
                             "constant, tiny, mixed)")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adaptive.regen.shapes import parse_dims
    from adaptive.regen.source import verify
    if not Path(args.file).is_file():
        print(f"adaptive verify: {args.file}: no such file", file=sys.stderr)
        return 2
    try:
        config = json.loads(args.config) if args.config else None
        if config is not None and not isinstance(config, dict):
            raise ValueError(f"--config must be a JSON object, got {args.config!r}")
        dims = parse_dims(args.shape) if args.shape else None
        report = verify(Path(args.file), args.op, entry=args.entry, config=config, dims=dims,
                        dtype=args.dtype, like=args.like, baseline=args.baseline,
                        timeout_s=args.timeout, regimes=tuple(args.regime or ()))
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"adaptive verify: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.verdict)
        if report.detail.strip() and not report.ok:
            rest = report.detail.strip().splitlines()[1:]   # the first line is in the verdict
            if rest:
                print("\n".join(rest))
        for note in report.notes:
            print(f"note: {note}")
    from adaptive.regen.report import Outcome
    return 0 if report.outcome in (Outcome.ACCEPTED, Outcome.COMPILED_ONLY) else 1
