"""Build the shipped variant pack on this GPU: every CUDA candidate of the shipped ops on
the ``wide`` shape preset (seeded LLM-serving regimes), measured (warm-up, median of 7 with
spread), with cubins.

    PYTHONPATH=$PWD python3 benchmarks/gpu_pack.py --out $OUT             # H200, < 3 min
    python benchmarks/gpu_pack.py --device host --quick                   # a dry run on CPU
    PYTHONPATH=$PWD scripts/gpu-check --only gpu_pack                      # in the GPU check

Writes ``<device>.msgpack`` (``h200.msgpack`` on an H200) and ``gpu_pack.json`` (build
time, size, counts, the fastest candidate per input) to ``--out`` and prints a summary.
Cases not started within ``--deadline-s`` are left for a resumed run (the journal stays
beside the pack; the same command continues). To ship the pack, copy it to
``adaptive/packs/``: a dispatcher on a GPU with the same fingerprint (name, compute
capability, SM count) loads it on creation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptive.packs import format as packs  # noqa: E402
from adaptive.backends import resolve_name  # noqa: E402
from adaptive.packs.build import Settings, build_pack, load_shapes  # noqa: E402
from adaptive.packs.compare import best_per_input  # noqa: E402

OPS = ("gemm", "softmax", "attention", "spmm", "rmsnorm")


def pack_name(fingerprint: dict) -> str:
    """``h200`` for "NVIDIA H200", ``host-x86_64`` for the host: the shipped file's stem."""
    name = str(fingerprint.get("name", "device")).lower()
    name = re.sub(r"^nvidia\s+", "", name)
    stem = re.sub(r"[^a-z0-9_]+", "-", name).strip("-") or "device"
    return stem if fingerprint.get("backend") == "cuda" else f"host-{stem}"


def interleave(cases: list) -> list:
    """Round robin over ops, so a deadline leaves every op some rows."""
    by_op: dict[str, list] = {}
    for c in cases:
        by_op.setdefault(c.op, []).append(c)
    out = []
    while any(by_op.values()):
        for queue in by_op.values():
            if queue:
                out.append(queue.pop(0))
    return out


def main(out_dir: str, device: str = "auto", quick: bool = False, deadline_s: float = 150.0,
         cubins: bool = True) -> list[dict]:
    """Build the pack into ``out_dir``; summary rows for ``scripts/gpu-check``."""
    backend = resolve_name(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    preset = "quick" if quick else "wide"
    cases = interleave(load_shapes(preset, OPS))
    settings = Settings(warmup=2, repeats=7, cubins=backend == "cuda" and cubins)
    tmp_path = out / "gpu_pack.building.msgpack"
    t0 = time.monotonic()
    pack = build_pack(cases, tmp_path, backend, settings=settings,
                      progress=sys.stderr.isatty(), deadline_s=deadline_s,
                      info={"shapes": preset, "script": "benchmarks/gpu_pack.py"})
    build_s = time.monotonic() - t0
    final = out / f"{pack_name(pack.fingerprint)}.msgpack"
    os.replace(tmp_path, final)
    journal = tmp_path.with_name(tmp_path.name + ".partial")
    size = final.stat().st_size
    build = pack.header["build"]
    complete = build["cases_done"] == build["cases"]
    summary = {
        "pack": final.name, "sha256": pack.sha256, "size_bytes": size,
        "build_time_s": round(build_s, 2), "device": pack.fingerprint,
        "cases": build["cases"], "cases_done": build["cases_done"], "complete": complete,
        "resume_journal": journal.name if journal.exists() else None,
        "variants": len(pack.variants), "rows": len(pack.rows), "cubins": len(pack.cubins),
        "cubin_bytes": sum(len(c.image) for c in pack.cubins), "failures": len(pack.failures),
        "failure_reasons": sorted({f"{f.get('variant')}: {str(f.get('reason'))[:120]}"
                                   for f in pack.failures})[:40],
        "best": [{"op": op, "dims": dict(dims), "dtype": dtype, "best": label,
                  "time_ms": round(t, 5)}
                 for (op, dims, dtype), (label, t) in sorted(best_per_input(pack.rows).items())],
    }
    tmp = out / f".gpu_pack.json.{os.getpid()}"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    os.replace(tmp, out / "gpu_pack.json")
    print(f"pack {final} ({packs.describe_device(pack.fingerprint)})")
    for row in summary["best"]:
        shape = ",".join(f"{k}={v}" for k, v in row["dims"].items())
        print(f"  {row['op']:<10} {shape:<34} {row['dtype']:<9} {row['time_ms']:>10.4f} ms  "
              f"{row['best']}")
    note = (f"{build['cases_done']}/{build['cases']} cases, {len(pack.rows)} rows, "
            f"{len(pack.failures)} failures" + ("" if complete else ", INCOMPLETE: rerun"))
    return [
        {"bench": "gpu_pack", "case": f"build {preset} ({final.name})",
         "value": f"{build_s:.1f}", "unit": "s", "note": note},
        {"bench": "gpu_pack", "case": "pack size", "value": f"{size / 1e6:.2f}", "unit": "MB",
         "note": f"{len(pack.variants)} variants, {len(pack.cubins)} cubins, "
                 f"sha256 {pack.sha256[:12]}"},
    ]


def _cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the outputs")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "host"))
    p.add_argument("--quick", action="store_true", help="the tiny preset (CI, dry runs)")
    p.add_argument("--deadline-s", type=float, default=150.0,
                   help="start no case after this many seconds (default 150)")
    p.add_argument("--no-cubins", action="store_true", help="do not carry compiled kernels")
    args = p.parse_args(argv)
    rows = main(args.out, args.device, args.quick, args.deadline_s, not args.no_cubins)
    for r in rows:
        print(f"{r['case']}: {r['value']} {r['unit']} ({r['note']})")
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
