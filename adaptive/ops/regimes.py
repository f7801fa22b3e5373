"""Value regimes: the inputs real models feed an op, as data the verifier draws from.

Each op declares ``Op.regimes``: a name -> :class:`Regime` mapping. A regime draws fresh
NumPy inputs for given dims and dtype (same shapes and dtypes as ``Op.make_inputs``), with
values that standard-normal test data never contains: attention logits after scaling
(|x| ~ 1e4 in fp32, up to the dtype's range in fp16), masked positions as −inf, constant
rows, tiny and subnormal values, mixed signs over many exponents, long positive sums.

The verifier (:mod:`adaptive.regen.worker`) compares every regime against the op's
float64 reference with the tolerance :meth:`Op.tolerance_for` derives from the dtype and
the reduction length (each convention file, ``variants/<op>/convention.md``, states the
rule and what each regime is for). Elements whose reference is NaN (softmax of a row that
is −inf everywhere) have no defined result and are not compared.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

# (largest finite, smallest normal, smallest subnormal) per dtype; bfloat16 has fp32's range
RANGE = {"float16": (65504.0, 2.0 ** -14, 2.0 ** -24),
         "bfloat16": (3.3895e38, 2.0 ** -126, 2.0 ** -133),
         "float32": (3.4028e38, 2.0 ** -126, 2.0 ** -149),
         "float64": (1.79e308, 2.0 ** -1022, 2.0 ** -1074)}
ACC_UNIT = 2.0 ** -24          # unit roundoff of the fp32 accumulation every convention asks for
ACC_FACTOR = 16.0              # tolerance growth: ACC_FACTOR * ACC_UNIT * sqrt(reduction length)


@dataclasses.dataclass(frozen=True)
class Regime:
    """One value regime: what it models and how to draw it.

    ``draw(op, dims, dtype, rng, **stats)`` returns the op's input tuple.
    """

    doc: str
    draw: Callable


def np_dtype(dtype: str):
    return {"float16": np.float16, "float64": np.float64}.get(dtype, np.float32)


def cast(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` clipped to the dtype's finite range (infinities kept) and cast, C-contiguous.

    C order matters: a copy of a broadcast (``np.array(np.broadcast_to(...))``) keeps the
    broadcast's memory order, which is Fortran order when the leading dims are 1, and a
    CuPy copy of it stays Fortran-ordered; kernels read raw pointers in row-major order."""
    big = RANGE[dtype][0]
    x = np.asarray(x, np.float64)
    finite = np.isfinite(x)
    x = np.where(finite, np.clip(x, -big, big), x)
    if dtype == "bfloat16":      # generated as float32: round to the values bf16 can hold
        return np.ascontiguousarray(round_bf16(x.astype(np.float32)))
    return np.ascontiguousarray(x.astype(np_dtype(dtype)))


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded (to nearest even) to bfloat16-representable float32 values."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    finite = np.isfinite(x)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return np.where(finite, u.view(np.float32), x).astype(np.float32)


def row_offsets(rng, rows: int, dtype: str) -> np.ndarray:
    """Large per-row logit offsets: |x| ~ 1e4 in fp32, up to 0.9x the range in fp16;
    positive and negative (exp overflows one way and underflows the other way)."""
    hi = 1e4 if dtype != "float16" else 0.9 * RANGE["float16"][0]
    lo = 0.3 * hi
    sign = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0)
    return sign * rng.uniform(lo, hi, rows)


def heavy_tailed(rng, shape, hi_exp: float, lo_exp: float = -3.0) -> np.ndarray:
    """Mixed signs over many exponents: ±10^U(lo_exp, hi_exp)."""
    sign = rng.choice((-1.0, 1.0), size=shape)
    return sign * 10.0 ** rng.uniform(lo_exp, hi_exp, shape)


def tiny_scale(dtype: str) -> float:
    """A scale that puts most drawn values at or under the dtype's smallest normal."""
    return 2.0 * RANGE[dtype][1]


def rounding_floor(dtype: str) -> float:
    """Half the spacing of the dtype's subnormals (half its smallest subnormal; fp16 2^-25):
    the largest error of a correctly rounded result below the smallest normal, where no
    relative bound holds (fp16 1.7e-6 is 29 ulps of 2^-24: one rounding moves it 0.9%).
    Strictly below the smallest nonzero value, so an exact zero must still be exactly zero."""
    return RANGE[dtype][2] / 2.0


def accumulation_tolerance(base: float, length: int) -> float:
    """``max(base, ACC_FACTOR * 2^-24 * sqrt(length))``: the per-dtype tolerance, grown with
    the reduction length for fp32 accumulation (rounding errors of a length-L sum grow as
    sqrt(L) for random data)."""
    return max(base, ACC_FACTOR * ACC_UNIT * math.sqrt(max(length, 1)))


# ---- generic regimes every op has --------------------------------------------------------------

def _generic(distribution: str) -> Callable:
    def draw(op, dims, dtype, rng, **stats):
        inputs = op.make_inputs(dims, dtype, rng, **stats)
        return distribute(inputs, distribution, rng)
    return draw


def distribute(inputs: tuple, distribution: str, rng: np.random.Generator) -> tuple:
    """Re-draw the dense float inputs in another value distribution (same shapes, dtypes)."""
    if distribution == "normal":
        return inputs
    out = []
    for x in inputs:
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
            out.append(x)
            continue
        scale = float(np.max(np.abs(x))) if x.size else 1.0
        scale = scale if math.isfinite(scale) and scale > 0 else 1.0
        if distribution == "uniform":
            y = rng.uniform(-scale, scale, x.shape)
        elif distribution == "shifted":          # all positive, off-centre: tests cancellation
            y = np.abs(x.astype(np.float64)) + 0.5 * scale
        else:
            raise ValueError(f"unknown distribution {distribution!r}; known: normal, uniform, "
                             "shifted")
        out.append(y.astype(x.dtype))
    return tuple(out)


GENERIC = {
    "normal": Regime("the op's own generator (standard-normal based)", _generic("normal")),
    "uniform": Regime("uniform over the normal draw's range", _generic("uniform")),
    "shifted": Regime("all positive, off-centre (|x| + a half of the range)",
                      _generic("shifted")),
}


# ---- row-wise softmax logits (softmax's x; attention's scores are built from q and k) ----------

def logits_large(rng, rows: int, cols: int, dtype: str) -> np.ndarray:
    """Rows of large logits: a per-row offset (±1e4 fp32, up to 0.9x the range fp16) plus a
    spread of a few units; every third row spread over ±1e4 (one element dominates)."""
    off = row_offsets(rng, rows, dtype)[:, None]
    x = off + rng.standard_normal((rows, cols)) * (4.0 if dtype != "float16" else 64.0)
    wide = np.arange(rows) % 3 == 2
    x[wide] = rng.standard_normal((int(wide.sum()), cols)) * abs(off[wide])
    return x


def logits_masked(rng, rows: int, cols: int, dtype: str) -> np.ndarray:
    """Logits with −inf masks as models build them, cycling over rows: causal (row r sees a
    growing prefix), key padding (a masked tail), random (half masked), one visible key,
    causal over large logits, and — from 4 rows on — one row masked everywhere (softmax of
    it is undefined: the reference is NaN, any value is accepted there)."""
    x = rng.standard_normal((rows, cols)) * 3.0
    off = row_offsets(rng, rows, dtype)
    for r in range(rows):
        kind = r % 6
        if kind == 0:                                   # causal
            keep = np.arange(cols) <= (r * cols) // max(rows, 1)
        elif kind == 1:                                 # key padding
            keep = np.arange(cols) < rng.integers(1, cols + 1)
        elif kind == 2:                                 # random
            keep = rng.random(cols) < 0.5
            keep[rng.integers(cols)] = True
        elif kind == 3:                                 # a single visible key
            keep = np.zeros(cols, bool)
            keep[rng.integers(cols)] = True
        elif kind == 4:                                 # causal over large logits
            keep = np.arange(cols) <= (r * cols) // max(rows, 1)
            x[r] += off[r]
        else:                                           # nothing masked, large logits
            keep = np.ones(cols, bool)
            x[r] += off[r]
        x[r, ~keep] = -np.inf
    if rows >= 4:
        x[rows // 2] = -np.inf                          # masked everywhere: undefined
    return x


def logits_constant(rng, rows: int, cols: int, dtype: str) -> np.ndarray:
    """Constant rows (the answer is uniform 1/C): zero, ordinary and large values; every
    other row two-valued (ties)."""
    big = row_offsets(rng, rows, dtype)
    values = np.where(np.arange(rows) % 3 == 0, 0.0,
                      np.where(np.arange(rows) % 3 == 1, rng.standard_normal(rows), big))
    x = np.repeat(values[:, None], cols, axis=1)
    ties = np.arange(rows) % 2 == 1
    x[ties] += np.where(rng.random((int(ties.sum()), cols)) < 0.5, 0.0, 1.0)
    return x


def logits_tiny(rng, rows: int, cols: int, dtype: str) -> np.ndarray:
    """Tiny values: most at or under the dtype's smallest normal (subnormals included);
    the answer is close to uniform."""
    return rng.standard_normal((rows, cols)) * tiny_scale(dtype)


def logits_mixed(rng, rows: int, cols: int, dtype: str) -> np.ndarray:
    """Mixed signs over five decades (±1e-3 .. ±100)."""
    return heavy_tailed(rng, (rows, cols), 2.0)


SOFTMAX_LOGITS = {
    "large": ("large logits: per-row offsets of ±1e4 (fp32) or up to 0.9x the fp16 range, "
              "some rows spread over ±1e4", logits_large),
    "masked": ("−inf masks: causal, key padding, random, one visible key, masks over large "
               "logits, one row masked everywhere (undefined, not compared)", logits_masked),
    "constant": ("constant rows (0, ordinary, large) and two-valued rows: uniform answers and "
                 "ties", logits_constant),
    "tiny": ("tiny and subnormal values (the answer is nearly uniform)", logits_tiny),
    "mixed": ("mixed signs over five decades (±1e-3 .. ±100)", logits_mixed),
}


def softmax_regimes() -> dict[str, Regime]:
    def make(fn):
        def draw(op, dims, dtype, rng, **stats):
            return (cast(fn(rng, dims["R"], dims["C"], dtype), dtype),)
        return draw
    return {**GENERIC, **{name: Regime(doc, make(fn))
                          for name, (doc, fn) in SOFTMAX_LOGITS.items()}}


# ---- rmsnorm: hidden states as a decoder's residual stream carries them -----------------------

def rmsnorm_regimes() -> dict[str, Regime]:
    def weight(rng, dims, dtype):
        return cast(rng.standard_normal(dims["C"]) * 0.5 + 1.0, dtype)

    def outliers(op, dims, dtype, rng, **stats):
        """Rows with a few massive activations (a residual stream's outlier channels): a
        handful of columns at 0.5x the fp16 range (1e15 in fp32, whose squares still sum
        within fp32), the rest ordinary, so the mean of squares is one column's."""
        x = rng.standard_normal((dims["R"], dims["C"]))
        big = 0.5 * RANGE["float16"][0] if dtype == "float16" else 1e15
        cols = rng.choice(dims["C"], size=max(1, dims["C"] // 64), replace=False)
        x[:, cols] = big * np.where(rng.random((dims["R"], len(cols))) < 0.5, -1.0, 1.0)
        return cast(x, dtype), weight(rng, dims, dtype)

    def tiny(op, dims, dtype, rng, **stats):
        """Rows at the dtype's smallest normal: their squares underflow any fp16 (and in
        fp32 every) accumulation, so the result is x / sqrt(eps) (eps dominates)."""
        t = tiny_scale(dtype)
        return (cast(rng.standard_normal((dims["R"], dims["C"])) * t, dtype),
                weight(rng, dims, dtype))

    def constant(op, dims, dtype, rng, **stats):
        """Every element of a row equal (a padded position's hidden state): the result is
        weight · sign(x) up to eps."""
        x = np.repeat(rng.standard_normal((dims["R"], 1)) * 3.0, dims["C"], axis=1)
        return cast(x, dtype), weight(rng, dims, dtype)

    return {**GENERIC, "outliers": Regime(outliers.__doc__, outliers),
            "tiny": Regime(tiny.__doc__, tiny), "constant": Regime(constant.__doc__, constant)}


# ---- attention: q, k, v whose scores fall in the regimes above -------------------------------

# Scores are computed (not given), so their rounding bounds what any fp32 kernel can reach:
# the output's relative error is about 2^-24 * |score| * sqrt(D). Offsets of ~300 keep an
# exact kernel at ~1e-4 while still overflowing exp(score) in fp32 either way.
ATTENTION_LARGE_SCORE = 300.0


def _qkv_shapes(dims):
    b, h, d = dims["B"], dims["H"], dims["D"]
    hkv = dims.get("Hkv", h)
    lq = dims.get("Lq", dims.get("L"))
    lk = dims.get("Lk", lq)
    return (b, h, lq, d), (b, hkv, lk, d)


def attention_regimes() -> dict[str, Regime]:
    def large(op, dims, dtype, rng, **stats):
        """q and k share a bias direction: scores = scale·q·k carry an offset of about ±300
        per head (sign alternating over heads: exp overflows one way, underflows the other
        without the max subtracted), plus a spread of tens."""
        qs, ks = _qkv_shapes(dims)
        bias = math.sqrt(ATTENTION_LARGE_SCORE / math.sqrt(qs[3]))
        sign = np.where(np.arange(qs[1]) % 2 == 0, 1.0, -1.0)[None, :, None, None]
        q = (rng.standard_normal(qs) + bias) * sign
        k = rng.standard_normal(ks) + bias
        v = rng.standard_normal(ks)
        return cast(q, dtype), cast(k, dtype), cast(v, dtype)

    def constant(op, dims, dtype, rng, **stats):
        """Every key equal (uniform weights: the answer is the mean of the visible values);
        q ordinary."""
        qs, ks = _qkv_shapes(dims)
        k = np.broadcast_to(rng.standard_normal((ks[0], ks[1], 1, ks[3])), ks)
        return (cast(rng.standard_normal(qs), dtype), cast(k, dtype),
                cast(rng.standard_normal(ks), dtype))

    def tiny(op, dims, dtype, rng, **stats):
        """q and k at the smallest normal (scores ~0: nearly uniform weights), v ordinary;
        in fp32 v is tiny as well (1e-30)."""
        qs, ks = _qkv_shapes(dims)
        t = tiny_scale(dtype)
        v = rng.standard_normal(ks) * (1e-30 if dtype in ("float32", "float64") else 1.0)
        return (cast(rng.standard_normal(qs) * t, dtype), cast(rng.standard_normal(ks) * t,
                                                                   dtype), cast(v, dtype))

    def mixed(op, dims, dtype, rng, **stats):
        """v with mixed signs over five decades; q and k ordinary."""
        qs, ks = _qkv_shapes(dims)
        return (cast(rng.standard_normal(qs), dtype), cast(rng.standard_normal(ks), dtype),
                cast(heavy_tailed(rng, ks, 2.0), dtype))

    return {**GENERIC, **{f.__name__: Regime(f.__doc__.split("\n")[0] + " ...", f)
                          for f in (large, constant, tiny, mixed)}}


# ---- gemm and spmm: long sums, extreme exponents ------------------------------------------------

def row_scales(rng, rows: int, dtype: str) -> np.ndarray:
    """Per-row scales over the dtype's exponent range, the output staying finite and normal:
    fp32 10^[-39.5, 30] (the lowest rows subnormal), bf16 10^[-36, 30], fp16 2^[-14, 6]
    (mostly subnormal inputs up to 64; b carries 2^5 so output rows are normal in scale;
    an element can still be subnormal where its sum is small, at K = 1 above all: the
    verifier charges no error within :meth:`Op.error_floor` of it)."""
    if dtype == "float16":
        e = rng.uniform(-14.0, 6.0, rows)
        e[:2] = (-14.0, 6.0)[:rows]
        return 2.0 ** e
    low = -39.5 if dtype == "float32" else -36.0   # bf16: normal rows (its subnormals
    e = rng.uniform(low, 30.0, rows)                # carry one or two significant bits)
    e[:2] = (low, 30.0)[:rows]
    return 10.0 ** e


def matmul_regimes(sparse: bool) -> dict[str, Regime]:
    def _b(dims, dtype, rng, scale):
        return cast(rng.standard_normal((dims["K"], dims["N"])) * scale, dtype)

    def _a(op, dims, dtype, rng, values, stats):
        if not sparse:
            return cast(values, dtype)
        from adaptive.ops.sparse import SparseWeight
        w = op.make_inputs(dims, dtype, rng, **stats)[0]
        mask = w.csr().toarray() != 0
        return SparseWeight(np.where(mask, cast(values, dtype), 0).astype(np_dtype(dtype)),
                            dtype=dtype)

    def accumulate(op, dims, dtype, rng, **stats):
        """All positive, so the sum grows with K and nothing cancels: an fp16 accumulator
        (or one that drops the low bits of a long sum) is visibly wrong."""
        m, k = dims["M"], dims["K"]
        a = rng.uniform(0.25, 1.0, (m, k))
        b = rng.uniform(0.25, 1.0, (k, dims["N"])) / k
        return _a(op, dims, dtype, rng, a, stats), cast(b, dtype)

    def extreme(op, dims, dtype, rng, **stats):
        """Rows of a scaled over the dtype's exponent range (fp32 1e-39.5 .. 1e30, the low
        rows subnormal; fp16 2^-14 .. 2^6), output rows of normal scale: every row must be
        right on its own."""
        m, k = dims["M"], dims["K"]
        a = rng.standard_normal((m, k)) * row_scales(rng, m, dtype)[:, None]
        if dtype == "float32" or dtype == "bfloat16":
            b_scale = 1e7 / math.sqrt(k)     # lifts the subnormal rows' output to normal
        else:
            b_scale = 32.0 / math.sqrt(k)
        return _a(op, dims, dtype, rng, a, stats), _b(dims, dtype, rng, b_scale)

    def mixed(op, dims, dtype, rng, **stats):
        """Mixed signs over five decades in a and b (fp16: two and a half, ±0.1 .. ±30, so
        that a single product stays normal)."""
        m, k = dims["M"], dims["K"]
        lo, hi = (-1.0, 1.5) if dtype == "float16" else (-3.0, 2.0)
        a = heavy_tailed(rng, (m, k), hi, lo)
        b = heavy_tailed(rng, (k, dims["N"]), hi, lo) / math.sqrt(k) / 10 ** hi
        return _a(op, dims, dtype, rng, a, stats), cast(b, dtype)

    out = {**GENERIC, **{f.__name__: Regime(f.__doc__.split("\n")[0] + " ...", f)
                         for f in (accumulate, extreme, mixed)}}
    if sparse:
        def empty_rows(op, dims, dtype, rng, **stats):
            """Many rows (and columns) of w without a stored value, the first eighth of the
            rows in one band (whole empty blocks, as pruned heads give): their outputs are
            exact zeros a kernel must still write."""
            m, k = dims["M"], dims["K"]
            w = op.make_inputs(dims, dtype, rng, **stats)[0].csr().toarray()
            w[rng.random(m) < 0.5] = 0
            w[:, rng.random(k) < 0.3] = 0
            if m >= 2:
                w[:max(1, m // 8)] = 0
                w[-1] = 0
                if not w.any():
                    w[1, rng.integers(k)] = 1.0
            from adaptive.ops.sparse import SparseWeight
            b = rng.standard_normal((k, dims["N"])) / math.sqrt(max(k * 0.1, 1.0))
            return SparseWeight(w.astype(np_dtype(dtype)), dtype=dtype), cast(b, dtype)
        out["empty_rows"] = Regime(empty_rows.__doc__.split("\n")[0] + " ...", empty_rows)
    return out
