"""Shape presets for ``adaptive pack build --shapes``: ``quick`` (tiny, for CI on the host
backend) and ``default`` (the shipped GPU pack: LLM-inference-like shapes, odd ones too).

The same layout as a shapes file: ``{op: [{"dims": {...}, "dtype": ..., "params": {...},
"stats": {...}}]}``; ``stats`` go to ``Op.make_inputs`` (density, block for spmm).
"""

from __future__ import annotations


def _gemm(dtype: str, shapes) -> list[dict]:
    return [{"dims": {"M": m, "N": n, "K": k}, "dtype": dtype} for m, n, k in shapes]


def _softmax(dtype: str, shapes) -> list[dict]:
    return [{"dims": {"R": r, "C": c}, "dtype": dtype} for r, c in shapes]


def _attention(dtype: str, shapes) -> list[dict]:
    return [{"dims": {"B": b, "H": h, "Lq": lq, "Lk": lk, "D": d}, "dtype": dtype,
             "params": {"causal": causal}} for b, h, lq, lk, d, causal in shapes]


def _spmm(dtype: str, shapes) -> list[dict]:
    return [{"dims": {"M": m, "N": n, "K": k}, "dtype": dtype,
             "stats": {"density": density, "block": block}}
            for m, n, k, density, block in shapes]


QUICK = {
    "gemm": _gemm("float32", [(8, 64, 32), (67, 45, 39)]),
    "softmax": _softmax("float32", [(3, 301), (64, 96)]),
    "attention": _attention("float32", [(1, 2, 5, 64, 16, False), (1, 1, 24, 24, 8, True)]),
    "spmm": _spmm("float32", [(64, 16, 48, 0.1, 0), (64, 8, 64, 0.3, 16)]),
}

DEFAULT = {
    "gemm": (
        _gemm("float16", [(1, 4096, 4096), (16, 4096, 4096), (64, 11008, 4096),
                          (128, 4096, 11008), (512, 4096, 4096), (2048, 4096, 4096),
                          (4096, 4096, 4096), (8192, 8192, 1024), (1024, 1024, 1024),
                          (333, 777, 1000)])
        + _gemm("bfloat16", [(16, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096)])
        + _gemm("float32", [(64, 1024, 1024), (1024, 1024, 1024), (2048, 2048, 2048)])),
    "softmax": (
        _softmax("float16", [(1, 32000), (8, 32000), (64, 4096), (4096, 128), (4096, 1024),
                             (16384, 512), (32768, 4096), (1000, 333)])
        + _softmax("float32", [(8, 32000), (4096, 1024), (16384, 512)])),
    "attention": _attention("float16", [
        (8, 32, 1, 1024, 128, True), (8, 32, 1, 8192, 128, True), (4, 8, 128, 128, 64, False),
        (1, 32, 512, 512, 128, True), (2, 16, 2048, 2048, 64, True),
        (1, 32, 4096, 4096, 128, True), (3, 5, 77, 300, 64, False)]),
    "spmm": _spmm("float16", [
        (4096, 16, 4096, 0.5, 0), (4096, 16, 4096, 0.1, 0), (4096, 16, 4096, 0.01, 0),
        (4096, 128, 4096, 0.1, 32), (4096, 128, 4096, 0.05, 64), (4096, 128, 4096, 0.01, 0),
        (1000, 64, 3000, 0.1, 16)]),
}

PRESETS = {"quick": QUICK, "default": DEFAULT}
