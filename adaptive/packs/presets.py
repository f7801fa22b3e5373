"""Shape presets for ``adaptive pack build --shapes``: ``quick`` (tiny, for CI on the host
backend), ``default`` (LLM-inference-like shapes, odd ones too) and ``wide`` (the shipped
GPU pack: seeded draws over the regimes a serving process meets, see :func:`wide`).

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


def _rmsnorm(dtype: str, shapes) -> list[dict]:
    return [{"dims": {"R": r, "C": c}, "dtype": dtype, "params": {"eps": 1e-5}}
            for r, c in shapes]


def _spmm(dtype: str, shapes) -> list[dict]:
    return [{"dims": {"M": m, "N": n, "K": k}, "dtype": dtype,
             "stats": {"density": density, "block": block}}
            for m, n, k, density, block in shapes]


QUICK = {
    "gemm": _gemm("float32", [(8, 64, 32), (67, 45, 39)]),
    "softmax": _softmax("float32", [(3, 301), (64, 96)]),
    "attention": _attention("float32", [(1, 2, 5, 64, 16, False), (1, 1, 24, 24, 8, True)]),
    "spmm": _spmm("float32", [(64, 16, 48, 0.1, 0), (64, 8, 64, 0.3, 16)]),
    "rmsnorm": _rmsnorm("float32", [(3, 301), (64, 96)]),
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
    "rmsnorm": (
        _rmsnorm("float16", [(1, 4096), (16, 4096), (8, 2048), (4096, 4096), (512, 2048),
                             (333, 5120)])
        + _rmsnorm("bfloat16", [(1, 4096), (2048, 4096)])
        + _rmsnorm("float32", [(16, 1024), (1024, 4096)])),
}



def wide(seed: int = 2026) -> dict:
    """Seeded draws over what an LLM server runs: decode (1-16 tokens) and prefill
    (long-tailed 17-4096) token counts against model widths 1024-14336 (and a grid of
    decode projections at common widths, and float32 projections and pruned weights),
    decode attention
    (mostly one token a step; multi-head and grouped-query) over 64-32768 cached keys,
    multi-head prefill attention (causal and not) of 128-4096 tokens,
    softmax rows of 16-128k (and as a transformer makes them: attention scores and the
    vocabulary's logits), pruned weights from 2:4 and 25-60% to 0.1% (unstructured and
    in 16/32/64 blocks), and decoder norms. The same seed gives the same shapes;
    :data:`PRESETS` holds the shipped one."""
    import numpy as np
    rng = np.random.default_rng(seed)
    widths = (1024, 2048, 4096, 5120, 8192, 11008, 14336)

    def tokens(decode_share: float = 0.4) -> int:
        if rng.random() < decode_share:
            return int(rng.integers(1, 17))
        return int(min(4096, round(17 * np.exp(rng.exponential(1.6)))))

    gemm = [{"dims": {"M": tokens(), "N": int(rng.choice(widths)),
                      "K": int(rng.choice(widths))},
             "dtype": str(rng.choice(["float16", "float16", "bfloat16", "float32"]))}
            for _ in range(36)]
    # decode projections at common models' widths, 1, 2 and 8 tokens, not drawn (no RNG:
    # the other ops' draws stay as they were): the draws met one token at two shapes only,
    # and a miss at M=1 N=K=2048 explored tiles of 256 rows, committing cuBLAS at
    # 1.17-1.27x the best tc_wide config (run S83)
    gemm += [{"dims": {"M": m, "N": n, "K": k}, "dtype": "float16"}
             for m in (1, 2, 8)
             for n, k in ((2048, 2048), (4096, 4096), (5120, 5120), (8192, 8192),
                          (2048, 8192), (4096, 14336), (14336, 4096))]
    softmax = [{"dims": {"R": int(min(65536, round(np.exp(rng.uniform(0, 10.5))))),
                         "C": int(round(np.exp(rng.uniform(np.log(16), np.log(131072)))))},
                "dtype": str(rng.choice(["float16", "float16", "float32"]))}
               for _ in range(30)]
    attention = []
    for i in range(30):
        d = int(rng.choice([64, 128, 128]))
        h = int(rng.choice([8, 16, 32, 32]))
        hkv = int(rng.choice([g for g in (1, 2, 4, 8, h) if h % g == 0 and g <= h]))
        decode = i % 3 != 2
        lk = int(round(np.exp(rng.uniform(np.log(128), np.log(32768 if decode else 4096)))))
        lq = int(rng.integers(1, 17)) if decode else lk
        b = int(rng.choice([1, 1, 2, 8, 16, 32])) if decode else int(rng.choice([1, 2, 4]))
        attention.append({"dims": {"B": b, "H": h, "Hkv": hkv, "Lq": lq, "Lk": lk, "D": d},
                          "dtype": "float16", "params": {"causal": True}})
    spmm = []
    for i in range(28):
        m, k = (int(x) for x in rng.choice([(14336, 4096), (4096, 14336), (4096, 4096),
                                            (11008, 4096), (1024, 3000)]))
        n = tokens(0.5)
        kind = i % 4
        if kind == 0:       # 2:4 pruned, as torch's semi-structured sparsity makes it
            stats = {"density": 0.5, "block": 0, "is_2to4": 1.0}
        elif kind == 1:     # block-sparse MLP weights
            stats = {"density": float(rng.choice([0.05, 0.1, 0.25])), "block": 32}
        else:
            stats = {"density": float(np.exp(rng.uniform(np.log(0.001), np.log(0.6)))),
                     "block": int(rng.choice([0, 16, 64]))}
        spmm.append({"dims": {"M": m, "N": n, "K": k}, "dtype": "float16", "stats": stats})
    # decoder norms: a decode batch's or a prefill's rows at a model's width (drawn last:
    # the draws above are the ones earlier packs were built from)
    rmsnorm = [{"dims": {"R": tokens() * int(rng.choice([1, 1, 8, 16])),
                         "C": int(rng.choice(widths[:5]))},
                "dtype": str(rng.choice(["float16", "float16", "bfloat16", "float32"])),
                "params": {"eps": 1e-5}} for _ in range(20)]
    # decode attention as servers run it, from a generator of its own (the draws above
    # stay those of earlier packs): most steps decode one token (the draws above give
    # Lq = 1 one decode case in 16, and the H200 selection run S43 committed flash_mma at
    # 1.47x decode_global on B=1, Lq=1, Lk=128, a variant the pack had no short-Lk row of),
    # from short to long caches, batch 1-32, multi-head and grouped-query
    more = np.random.default_rng(seed + 1)
    for i in range(24):
        d = int(more.choice([64, 128]))
        h = int(more.choice([8, 16, 32]))
        hkv = int(more.choice([g for g in (1, 4, 8, h) if h % g == 0 and g <= h]))
        lq = 1 if i % 3 != 2 else int(more.integers(2, 17))
        lk = int(round(np.exp(more.uniform(np.log(64), np.log(16384)))))
        b = int(more.choice([1, 1, 2, 4, 8, 16, 32]))
        attention.append({"dims": {"B": b, "H": h, "Hkv": hkv, "Lq": lq, "Lk": max(lk, lq),
                                   "D": d}, "dtype": "float16", "params": {"causal": True}})
    # multi-head prefill attention, causal and not (a generator of its own again): the draws
    # above make prefills grouped-query two times in three, where only SDPA runs, so the
    # pack of run S47 measured the flash kernels on 2 prefill inputs; the model then put
    # SDPA alone within reach on B=1 H=8 L=2048-4096, where flash2_mma took 0.058 ms
    # against SDPA's 0.217 from CuPy arrays
    prefill = np.random.default_rng(seed + 2)
    for i in range(10):
        h, d = int(prefill.choice([8, 16, 32])), int(prefill.choice([64, 128]))
        lk = int(round(np.exp(prefill.uniform(np.log(128), np.log(4096)))))
        attention.append({"dims": {"B": int(prefill.choice([1, 1, 2, 4])), "H": h, "Hkv": h,
                                   "Lq": lk, "Lk": lk, "D": d},
                          "dtype": "float16", "params": {"causal": i % 2 == 0}})
    # softmax rows as a transformer makes them (a generator of its own again): attention
    # scores, one row a query and head (R = B*H*Lq 256-65536, C = cached keys 128-8192),
    # and the vocabulary's logits (R = 1-64 rows, C = 32000-152064). The draws above are
    # log-uniform over R and C and left R >= 4096 with C of 1-8k unmeasured: run S75's
    # model then never explored reg_row on R=16384 C=2048, and committed block_row at 1.8x
    # its time
    rows = np.random.default_rng(seed + 3)
    for i in range(16):
        if i % 4 == 3:
            r, c = int(rows.integers(1, 65)), int(rows.choice([32000, 50257, 128256, 152064]))
        else:
            r = int(round(np.exp(rows.uniform(np.log(256), np.log(65536)))))
            c = int(round(np.exp(rows.uniform(np.log(128), np.log(8192)))))
        softmax.append({"dims": {"R": r, "C": c},
                        "dtype": str(rows.choice(["float16", "float16", "float32"]))})
    # and a grid of them, not drawn: the 16 draws above put 2 float16 inputs at R*C >= 2^24
    # with 2-8k columns, and on the H200 (runs S107, S108) the shipped pack's model then
    # ranked reg_row out of reach on softmax 32768x4096 and committed warp_row at 1.55x
    # its time
    softmax += _softmax("float16", [(4096, 4096), (8192, 2048), (8192, 8192), (16384, 1024),
                                    (16384, 4096), (24576, 2048), (49152, 1536),
                                    (65536, 4096)])
    softmax += _softmax("float32", [(16384, 2048), (32768, 1024)])
    # and the vocabulary's logits at serving batch sizes, not drawn: the four draws above
    # left fp16 C of 18,278-50,256 (where reg_row still fits) and R of 23-386 at C >= 10,000
    # unmeasured, and run S156's uniform-mix (H200) committed block_row at 1.16x reg_row_cs
    # on R=64 C=32000 (runs S159 and S167 measured this grid into the shipped packs)
    softmax += _softmax("float16", [(r, c) for r in (4, 24, 128, 384)
                                    for c in (32000, 32768, 50257, 128256)])
    softmax += _softmax("float32", [(r, c) for r in (4, 128) for c in (16384, 32000, 128256)])
    # float32 projections and pruned weights, not drawn (every draw above is half
    # precision): the shipped pack of run S79 had no float32 spmm row and 168 float32 gemm
    # rows, and the main job's float32 stream (adaptive bench mixed, run S83) had its spmm
    # choices at 1.555x the oracle (a csr_rowsplit config never explored)
    gemm += _gemm("float32", [(1, 2048, 2048), (4, 1024, 4096), (32, 512, 512),
                              (256, 1024, 256), (1024, 128, 1024), (3000, 3000, 64)])
    spmm += _spmm("float32", [(4096, 64, 4096, 0.5, 0), (4096, 64, 4096, 0.05, 32),
                              (4096, 8, 4096, 0.005, 0), (1024, 256, 1024, 0.1, 0),
                              (1024, 16, 1024, 0.02, 16), (2048, 512, 2048, 0.002, 0)])
    # and more of them, densities 0.002-0.5 at 8-256 tokens: with the 6 above, the main
    # job's float32 spmm stream (adaptive bench mixed, runs S104-S108) committed cuSPARSE
    # at 3.6x csr_rowsplit's time on M=2048 N=16 K=2048 density 0.5, csr_rowsplit never
    # explored
    spmm += _spmm("float32", [(1024, 32, 1024, 0.5, 0), (2048, 8, 2048, 0.3, 0),
                              (2048, 64, 2048, 0.3, 0), (2048, 32, 2048, 0.05, 32),
                              (4096, 16, 4096, 0.02, 0), (2048, 256, 2048, 0.005, 0),
                              (1024, 128, 4096, 0.002, 0), (4096, 128, 1024, 0.2, 0),
                              (3072, 48, 3072, 0.01, 0), (2048, 24, 1024, 0.1, 16)])
    # 2:4 pruned MLP weights from decode batches to prefills, not drawn: the draws above
    # put 2:4 weights at 37 tokens at most, and on the H200 (runs S99-S100) the model then
    # ranked block-sparse kernels within reach of dense at 256-2048 tokens, where
    # cuSPARSELt is 1.3-1.4x dense and the block-sparse kernels 3-5x slower than it
    spmm += [{"dims": {"M": m, "N": n, "K": k}, "dtype": "float16",
              "stats": {"density": 0.5, "block": 0, "is_2to4": 1.0}}
             for m, k in ((14336, 4096), (4096, 14336), (4096, 4096))
             for n in (64, 256, 1024, 4096)]
    return {"gemm": gemm, "softmax": softmax, "attention": attention, "spmm": spmm,
            "rmsnorm": rmsnorm}


PRESETS = {"quick": QUICK, "default": DEFAULT, "wide": wide()}
