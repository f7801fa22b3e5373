"""Build a variant pack offline for the shapes the example server meets, then load it.

    python examples/build_pack.py --out server-host.pack                  # host backend
    python examples/build_pack.py --out server-h200.pack --backend cuda \\
        --d-model 1024 --heads 16 --d-ff 4096 --vocab 8192 --dtype float16

Every op of the block (examples/server/block.py) is measured at each padded sequence
length, every candidate timed several times; the pack holds the measurements, the
variants and the device fingerprint. A server started with ``ADAPTIVE_PACKS=<pack>``
fits its cost model from these rows instead of exploring on live requests.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "server"))

from block import BlockShape  # noqa: E402

from adaptive.packs.format import read_pack  # noqa: E402
from adaptive.packs.install import load_pack  # noqa: E402
from adaptive.packs.build import Case, Settings, build_pack  # noqa: E402


def server_cases(s: BlockShape, dtype: str, lengths: list[int]) -> list[Case]:
    """The (op, dims) the server's block launches for each padded length P."""
    d, f, dh = s.d_model, s.d_ff, s.d_model // s.heads
    sparse = (("block", s.block), ("density", s.density))
    cases = []
    for p in lengths:
        cases += [Case("gemm", (("M", p), ("N", n), ("K", d)), dtype)
                  for n in (3 * d, d, s.vocab)]
        cases.append(Case("attention", (("B", 1), ("H", s.heads), ("Lq", p), ("Lk", p),
                                        ("D", dh)), dtype, (("causal", True),)))
        cases += [Case("spmm", (("M", m), ("N", p), ("K", k)), dtype, (), sparse)
                  for m, k in ((f, d), (d, f))]
        cases.append(Case("softmax", (("R", p), ("C", s.vocab)), dtype))
    return cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="pack file to write")
    p.add_argument("--backend", default="host", choices=("host", "cuda", "auto"))
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    p.add_argument("--lengths", default="64,128,256,512", help="padded sequence lengths")
    p.add_argument("--repeats", type=int, default=5)
    for field in ("d_model", "heads", "d_ff", "vocab"):
        p.add_argument("--" + field.replace("_", "-"), type=int,
                       default=BlockShape.__dataclass_fields__[field].default)
    args = p.parse_args(argv)
    shape = BlockShape(d_model=args.d_model, heads=args.heads, d_ff=args.d_ff,
                       vocab=args.vocab)
    cases = server_cases(shape, args.dtype, [int(x) for x in args.lengths.split(",")])
    pack = build_pack(cases, args.out, backend=args.backend,
                      settings=Settings(repeats=args.repeats, cubins=args.backend != "host"))
    print(f"wrote {args.out}: {len(pack.rows)} measurements of {len(pack.variants)} variants "
          f"over {len(cases)} cases, {len(pack.failures)} failures, file sha256 "
          f"{hashlib.sha256(Path(args.out).read_bytes()).hexdigest()}")

    back = read_pack(args.out)              # hash-checked before anything is decoded
    print("device:", back.fingerprint.get("name"), "| ops:", ", ".join(back.ops))
    report = load_pack(args.out)            # into the default dispatchers of this process
    print(f"loaded: {report.rows} rows, same device: {report.same_device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
