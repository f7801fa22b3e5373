"""``adaptive pack``: build, show, diff and merge variant packs.

    adaptive pack build --ops gemm,softmax --shapes default -o h200.msgpack
    adaptive pack build --from-log run.alog -o from-log.msgpack
    adaptive pack show h200.msgpack [--best]
    adaptive pack diff old.msgpack new.msgpack
    adaptive pack merge a.msgpack b.msgpack -o both.msgpack
    adaptive pack replay h200.msgpack [--ops gemm,spmm]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import math
import sys
from contextlib import nullcontext
from pathlib import Path

from adaptive.packs import format as packs
from adaptive.packs import compare, install
from adaptive.errors import AdaptiveError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="measure candidates on this machine and write a pack")
    b.add_argument("-o", "--out", required=True, help="the pack file to write")
    b.add_argument("--ops", default="", help="comma-separated ops (default: all in --shapes)")
    b.add_argument("--shapes", default="default",
                   help="a preset (quick, default, or wide: the shipped packs') or a "
                        ".json/.toml file {op: [{dims: ...}]}")
    b.add_argument("--backend", default="auto", choices=("auto", "cuda", "host"))
    b.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: one per GPU; one on the host backend)")
    b.add_argument("--warmup", type=int, default=2, help="untimed runs per candidate")
    b.add_argument("--repeats", type=int, default=7, help="timed runs per candidate")
    b.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    b.add_argument("--cubins", action="store_true", help="carry compiled kernels (cuda)")
    b.add_argument("--deadline-s", type=float, default=None,
                   help="start no case after this many seconds (the pack says how many ran)")
    b.add_argument("--fresh", action="store_true", help="ignore a journal of an earlier run")
    b.add_argument("--variants", default="",
                   help="comma-separated variant names: only these measured (a variant added "
                        "since a pack was built, measured on its inputs, then merged into it)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--from-log", nargs="+", default=None, metavar="LOG",
                   help="build from counter logs instead of measuring")
    s = sub.add_parser("show", help="header, device and contents of a pack")
    s.add_argument("pack")
    s.add_argument("--best", action="store_true", help="the fastest candidate per input")
    s.add_argument("--failures", action="store_true", help="list the candidates that failed")
    d = sub.add_parser("diff", help="what changed between two packs")
    d.add_argument("a")
    d.add_argument("b")
    m = sub.add_parser("merge", help="one pack from several (same device)")
    m.add_argument("packs", nargs="+")
    m.add_argument("-o", "--out", required=True)
    m.add_argument("--allow-other-devices", action="store_true",
                   help="merge packs of different devices (keeps the first's fingerprint)")
    m.add_argument("--fill-failures", action="store_true",
                   help="keep the first pack as it is and fill only its failed (input, "
                        "variant, config) entries from the others (same device, same "
                        "variant code)")
    a = sub.add_parser("adopt", help="take the registered records of variants whose file "
                                     "changed around unchanged measured work; rows kept")
    a.add_argument("pack")
    a.add_argument("--variants", required=True,
                   help="comma-separated ids (op/name) whose registered source replaces the "
                        "pack's; only where what was measured did not change")
    a.add_argument("-o", "--out", required=True)
    c = sub.add_parser("cubins", help="compile the kernels a build would carry (each input's "
                                      "candidates near its best) into the pack, rows kept; "
                                      "with the NVRTC that built it")
    c.add_argument("pack")
    c.add_argument("--variants", default="",
                   help="comma-separated ids (op/name) (default: every CUDA variant of the pack)")
    c.add_argument("-o", "--out", required=True)
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    r = sub.add_parser("replay", help="the learned policy on the pack's own measurements, "
                                      "one input held out at a time (no GPU needed)")
    r.add_argument("pack")
    r.add_argument("--ops", default="", help="comma-separated ops (default: all)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--folds", type=int, default=10,
                   help="held-out folds of inputs, one model fitted per fold (0: one input "
                        "held out at a time, a fit per input; slow)")
    r.add_argument("--fold-seed", type=int, default=0, metavar="S",
                   help="deal the inputs into the folds with this seed (default 0): the "
                        "spread over seeds is what a figure owes to the dealing")
    r.add_argument("--plot", default=None, metavar="IMAGE",
                   help="also draw each held-out input's committed/best per op into IMAGE "
                        "(.png, .svg, ...; needs matplotlib, the [plot] extra)")


def run(args: argparse.Namespace) -> int:
    try:
        return {"build": _build, "show": _show, "diff": _diff, "merge": _merge,
                "adopt": _adopt, "cubins": _cubins, "replay": _replay}[args.action](args)
    except (AdaptiveError, ValueError, FileNotFoundError) as exc:
        print(f"adaptive pack {args.action}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"adaptive pack {args.action}: interrupted; run the same command again to resume",
              file=sys.stderr)
        return 130


# ---- replay --------------------------------------------------------------------------------------

def _replay(args) -> int:
    from adaptive.packs.build import Progress
    from adaptive.bench.replay import replay_setups
    ops = [o for o in args.ops.split(",") if o] or None
    if args.plot is not None:
        from adaptive import plots
        plots.check_output(args.plot)   # a name it cannot write is said before the replay
    bar = None

    def step(done: int, total: int) -> None:
        nonlocal bar
        bar = bar or Progress(total)
        bar.update("replay, held out by input")
    reports = []
    for report in replay_setups(args.pack, (False, True), ops=ops, folds=args.folds,
                                progress=None if args.no_progress else step,
                                fold_seed=args.fold_seed):
        print(report)
        reports.append(report)
    if args.plot is not None:
        plots.save(plots.replay_figure(reports)[0], args.plot)
        print(f"wrote {args.plot}")
    return 0


# ---- build ---------------------------------------------------------------------------------------

def _build(args) -> int:
    ops = [o for o in args.ops.split(",") if o]
    if args.from_log:
        pack = build_from_logs(args.from_log, args.out, ops)
    else:
        from adaptive.packs.build import Settings, build_pack, load_shapes
        from adaptive.progress import Heartbeat
        if args.repeats < 1 or args.warmup < 1:
            raise ValueError(f"--repeats and --warmup must be at least 1, got {args.repeats} "
                             f"and {args.warmup}")
        cases = load_shapes(args.shapes, ops)
        settings = Settings(warmup=args.warmup, repeats=args.repeats, seed=args.seed,
                            cubins=args.cubins,
                            variants=tuple(v for v in args.variants.split(",") if v))
        with Heartbeat("adaptive pack build") if not args.no_progress else nullcontext():
            pack = build_pack(cases, args.out, args.backend, args.workers, settings,
                              args.fresh, not args.no_progress, args.deadline_s,
                              info={"shapes": args.shapes})
    size = Path(args.out).stat().st_size
    print(f"wrote {args.out}: {len(pack.variants)} variants, {len(pack.rows)} rows, "
          f"{len(pack.failures)} failures, {size / 1e3:.1f} kB")
    print(f"  file sha256 {packs.file_sha256(args.out)} (what sha256sum prints)")
    return 0


def build_from_logs(logs: list[str], out: str, ops: list[str] | None = None) -> packs.Pack:
    """A pack from counter logs: their rows, the registry's variants they name, and the
    device fingerprint of the log header (or this machine's, when the header has none)."""
    from adaptive import counterlog
    from adaptive.variants import shared_registry
    rows, headers = [], []
    for path in logs:
        contents = counterlog.read_log(path)
        headers += contents.headers
        rows += counterlog.to_observations(contents)
    if ops:
        rows = [r for r in rows if r.op in ops]
    registry = shared_registry()
    known = {(v.op, v.name): v for op in registry.ops()
             for v in registry.variants(op, experimental=True)}
    kept = [r for r in rows if (r.op, r.variant) in known]
    if not kept:
        raise ValueError(f"no usable rows in {', '.join(logs)} ({len(rows)} rows, none of a "
                         "registered variant)")
    fp = next((h["fingerprint"] for h in headers if h.get("fingerprint")), None)
    if fp is None:
        backends = collections.Counter(r.device.get("backend") or "host" for r in kept)
        fp = install.current_fingerprint(backends.most_common(1)[0][0]) or {}
    variants = [known[k] for k in sorted({(r.op, r.variant) for r in kept})]
    build = {"from_logs": [str(p) for p in logs], "rows_skipped": len(rows) - len(kept)}
    pack = packs.new_pack(variants, kept, fp, build=build)
    digest = packs.write_pack(pack, out)
    return dataclasses.replace(pack, sha256=digest)


# ---- show / diff / merge -------------------------------------------------------------------------

def _show(args) -> int:
    header = packs.peek_header(args.pack)
    pack = packs.read_pack(args.pack)
    created = datetime.datetime.fromtimestamp(header.get("created_s", 0), datetime.timezone.utc)
    print(f"{args.pack}: schema {header['schema']}, {header['size_bytes'] / 1e3:.1f} kB")
    print(f"  file sha256   {packs.file_sha256(args.pack)}  (as sha256sum prints it)")
    print(f"  content hash  {pack.sha256}  (of header + body; verified)")
    print(f"  created {created:%Y-%m-%d %H:%M:%S} UTC by {header.get('creator', '?')}")
    print(f"  device  {packs.describe_device(pack.fingerprint)}")
    others = {k: v for k, v in pack.fingerprint.items() if k not in packs.IDENTITY_KEYS}
    if others:
        print("          " + ", ".join(f"{k}={v}" for k, v in sorted(others.items())))
    build = header.get("build", {})
    if build:
        print("  build   " + ", ".join(f"{k}={v}" for k, v in build.items() if k != "settings"))
    print(f"  {len(pack.variants)} variants, {len(pack.rows)} rows, {len(pack.cubins)} cubins, "
          f"{len(pack.failures)} failures")
    inputs = collections.defaultdict(set)
    for r in pack.rows:
        inputs[r.op].add(compare.row_key(r)[:3])
    by_op = collections.defaultdict(list)
    for v in pack.variants:
        by_op[v.op].append(v.name)
    for op in pack.ops:
        print(f"  {op:<10} {len(inputs[op]):>4} inputs  {sum(r.op == op for r in pack.rows):>6} "
              f"rows  variants: {', '.join(sorted(by_op[op]))}")
    if args.best:
        best = compare.best_per_input(pack.rows)
        for (op, dims, dtype), (label, t) in sorted(best.items()):
            shape = ",".join(f"{k}={v}" for k, v in dims)
            print(f"    {op:<10} {shape:<36} {dtype:<9} {t:>10.4f} ms  {label}")
    if args.failures:
        for f in pack.failures:
            print(f"    FAIL {f.get('op')}/{f.get('variant')} {f.get('config')} "
                  f"{f.get('dims')} {f.get('dtype')}: {f.get('reason')}")
    return 0


def _diff(args) -> int:
    a, b = packs.read_pack(args.a), packs.read_pack(args.b)
    d = compare.diff(a, b)
    print(f"a: {args.a} ({packs.describe_device(a.fingerprint)}, {d['rows'][0]} rows)")
    print(f"b: {args.b} ({packs.describe_device(b.fingerprint)}, {d['rows'][1]} rows)")
    if not d["same_device"]:
        print("   (different devices: times are not comparable one to one)")
    for name in ("variants_added", "variants_removed", "variants_changed"):
        if d[name]:
            print(f"{name.replace('_', ' ')}: {', '.join(d[name])}")
    ratios = sorted(d["ratios"].values())
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"{len(ratios)} shared measurements: time b/a geometric mean {geo:.3f}, "
              f"min {ratios[0]:.3f}, max {ratios[-1]:.3f}")
    print(f"only in a: {d['only_in_a']} measurements, only in b: {d['only_in_b']}")
    for (op, dims, dtype), ((la, ta), (lb, tb)) in d["best_changed"].items():
        shape = ",".join(f"{k}={v}" for k, v in dims)
        print(f"  best changed {op} {shape} {dtype}: {la} ({ta:.4f} ms) -> {lb} ({tb:.4f} ms)")
    return 0


def _adopt(args) -> int:
    from adaptive.variants import default_registry
    ids = [v for v in args.variants.split(",") if v]
    reg = default_registry()
    registered = [v for op in {i.partition("/")[0] for i in ids}
                  for v in reg.variants(op, experimental=True)]
    pack = compare.adopt(packs.read_pack(args.pack), registered, ids)
    packs.write_pack(pack, args.out)
    for a in pack.header["build"]["adopted"][-len(ids):]:
        rows, cubins = a.get("rows_dropped", 0), a.get("cubins_dropped", 0)
        print(f"adopted {a['variant']}: source {a['from'][:12]} -> {a['to'][:12]}"
              + (f"; {rows} rows of configs its space no longer holds dropped" if rows else "")
              + (f"; {cubins} cubins dropped (compiled from other source or configs)"
                 if cubins else ""))
    print(f"wrote {args.out}: {len(pack.variants)} variants, {len(pack.rows)} rows")
    print(f"  file sha256 {packs.file_sha256(args.out)} (what sha256sum prints)")
    return 0


def _cubins(args) -> int:
    from adaptive.packs.build import Progress, refresh_cubins
    ids = [v for v in args.variants.split(",") if v]
    bar = None

    def step(done: int, total: int) -> None:
        nonlocal bar
        bar = bar or Progress(total)
        bar.update("compiling")
    pack = packs.read_pack(args.pack)
    got = refresh_cubins(pack, ids, progress=None if args.no_progress else step)
    packs.write_pack(got, args.out)
    r = got.header["build"]["cubins_refreshed"][-1]
    print(f"compiled with {r['compiler']}: {r['added']} cubins added for "
          f"{', '.join(r['variants'])} ({len(pack.cubins)} carried before)")
    print(f"wrote {args.out}: {len(got.variants)} variants, {len(got.rows)} rows, "
          f"{len(got.cubins)} cubins")
    print(f"  file sha256 {packs.file_sha256(args.out)} (what sha256sum prints)")
    return 0


def _merge(args) -> int:
    loaded = [packs.read_pack(p) for p in args.packs]
    if args.fill_failures:
        merged, left = compare.fill_failures(loaded[0], loaded[1:])
        filled = merged.header["build"].get("filled_failures", [])
        packs.write_pack(merged, args.out)
        print(f"wrote {args.out}: {len(filled)} failed (input, variant, config) entries of "
              f"{args.packs[0]} filled ({sum(f['rows'] for f in filled)} rows), "
              f"{len(left)} left failed")
        for f in left:
            print(f"  still failed: {f['op']}/{f['variant']} {dict(f['dims'])} {f['dtype']}: "
                  f"{f.get('reason', '')[:120]}")
        print(f"  file sha256 {packs.file_sha256(args.out)} (what sha256sum prints)")
        return 0
    merged = compare.merge(loaded, args.allow_other_devices)
    packs.write_pack(merged, args.out)
    print(f"wrote {args.out}: {len(merged.variants)} variants, {len(merged.rows)} rows from "
          f"{len(loaded)} packs")
    print(f"  file sha256 {packs.file_sha256(args.out)} (what sha256sum prints)")
    return 0
