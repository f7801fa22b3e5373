"""What every op provides: validation, the hot-path key, features, roofline, reference.

An op is stateless; one instance per op name lives in :data:`adaptive.ops.OPS`. The
dispatcher calls :meth:`Op.key` on every launch and everything else on a miss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from adaptive import arrays
from adaptive.arrays import ArrayInfo
from adaptive.errors import InputTypeError, InputValueError, UnknownNameError
from adaptive.ops.regimes import GENERIC, Regime, accumulation_tolerance, rounding_floor

KEY_VERSION = 1  # bump when the meaning of keys changes: old caches and packs are then ignored

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
NUMPY_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


@dataclasses.dataclass(frozen=True)
class Problem:
    """A validated input: the op, named dims, dtype, where the data lives, and params."""

    op: str
    dims: tuple[tuple[str, int], ...]
    dtype: str
    kind: str
    device: str
    params: tuple[tuple[str, object], ...] = ()
    extra: tuple[tuple[str, float], ...] = ()   # op-specific statistics (density, ...)

    def dim(self, name: str) -> int:
        return dict(self.dims)[name]

    @property
    def dims_dict(self) -> dict:
        return dict(self.dims)

    @property
    def params_dict(self) -> dict:
        return dict(self.params)

    @property
    def extra_dict(self) -> dict:
        return dict(self.extra)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def describe(self) -> str:
        """The input in words, for messages: ``gemm M=64, N=16, K=32 float32``."""
        words = [self.op, ", ".join(f"{k}={v}" for k, v in self.dims), self.dtype]
        return " ".join(words + [f"{k}={v}" for k, v in self.params if v is not None])

    def scope(self) -> dict:
        """Names a manifest's ``requires`` and grid expressions may use."""
        scope = {**self.dims_dict, **self.extra_dict, "dtype": self.dtype,
                 "itemsize": self.itemsize, "kind": self.kind}
        for name, value in self.params:
            scope[name] = value
        return scope


@dataclasses.dataclass(frozen=True)
class Param:
    """A keyword parameter of an op (not an array): its type and default."""

    name: str
    types: tuple
    default: object
    doc: str
    # (predicate, what it demands) pairs checked after the type: ``(math.isfinite, "finite")``
    checks: tuple = ()


# NumPy scalars are accepted as the Python type of their kind (``np.float32(0.5)`` as a float)
_NUMPY_KINDS = ((bool, np.bool_), (int, np.integer), (float, np.floating))


def _scalar(op: str, p: Param, value):
    """``value`` as one of ``p.types`` (a NumPy scalar becomes its Python value); else the
    error naming the types expected and what was given."""
    if isinstance(value, bool) and bool not in p.types:
        pass   # True is an int to Python, but not a number a caller means
    elif isinstance(value, p.types):
        return value
    elif isinstance(value, np.generic):
        for py, np_kind in _NUMPY_KINDS:
            if py in p.types and isinstance(value, np_kind):
                return py(value.item())
    expected = " or ".join(t.__name__ for t in p.types)
    got = type(value).__name__
    if isinstance(value, np.ndarray) or hasattr(value, "shape"):
        got += f" of shape {tuple(value.shape)}"
    raise InputTypeError(f"{op}: parameter {p.name!r} must be a scalar {expected}, got {got}")


class Op:
    """Base class. Subclasses set the class attributes and implement the abstract methods."""

    name: str = ""
    arrays: tuple[str, ...] = ()          # names of the array arguments, in order
    optional_arrays: tuple[str, ...] = ()  # array arguments that may follow them, in order
    sparse: tuple[str, ...] = ()          # the array arguments that are SparseWeights
    params: tuple[Param, ...] = ()
    dtypes: tuple[str, ...] = ("float16", "bfloat16", "float32")
    # relative error bound ||out - ref|| / ||ref|| per input dtype
    tolerance: Mapping[str, float] = {"float16": 5e-3, "bfloat16": 3e-2, "float32": 1e-4,
                                      "float64": 1e-10}
    # value regimes the verifier draws (adaptive/ops/regimes.py): name -> how to draw inputs
    regimes: Mapping[str, Regime] = GENERIC
    reduction_dims: tuple[str, ...] = ()  # dims summed over (the tolerance grows with them)
    # the used share of its candidates' last tiles is a feature of theirs (geo.tile_fill,
    # see adaptive.policy.features.geometries): spmm's, where csr_rowsplit tiles N by
    # LANES_N x VEC; for softmax and attention it moved their replays by noise only
    tile_fill: bool = False
    # configs of the leader's variant timed before a commit
    # (adaptive.policy.learned.Learned._refine): spmm's, whose configs (tile width, warps,
    # stages) meet the weight's block structure, which its features see only as block
    # densities. On the H200 corpus (10 folds, dealings 0-3) spmm within 5% 88/88/82/90%
    # -> 92/88/88/90% where the model's first pick lost, -> 92/90/90/90% before every
    # commit; softmax's and attention's replays gained at most a point there, and on the
    # shipped H200 pack with noise softmax lost 2 points and attention's prefills paid a
    # point more of tuning
    refine_configs: int = 0

    def tolerance_for(self, dtype: str, dims: Mapping[str, int]) -> float:
        """The norm-wise relative tolerance at ``dims``: ``tolerance[dtype]``, grown for
        long reductions to ``16 * 2^-24 * sqrt(L)`` (L: the longest reduction dim), the
        rounding of an fp32 accumulation of L random terms with a 16x margin.

        Errors are measured beyond :meth:`error_floor` (half the output dtype's subnormal
        spacing): a correctly rounded subnormal result can be off by more than ``tol``
        relative (fp16 1.7e-6 rounds with 0.8% error), never by more than the floor."""
        length = max((int(dims.get(d, 1)) for d in self.reduction_dims), default=1)
        return accumulation_tolerance(self.tolerance[dtype], length)

    def error_floor(self, dtype: str) -> float:
        """The absolute error no output element is charged for: half the spacing of the
        output dtype's subnormals (fp16 2^-25), what one correct rounding can cost there.
        Every op's output has its inputs' dtype."""
        return rounding_floor(dtype)

    def arrays_given(self, problem: Problem) -> int:
        """How many array arguments ``problem``'s call passed: ``arrays`` and the first of
        ``optional_arrays`` (an op with optional arrays says)."""
        return len(self.arrays)

    # ---- hot path ----------------------------------------------------------------------
    def key(self, args: Sequence, params: Mapping) -> tuple:
        """Small hashable key; equal keys mean equal validation outcome and equal plan."""
        try:
            sigs = tuple(map(arrays.signature, args))
        except InputTypeError:
            self.problem(args, params)  # raises the precise, argument-naming error
            raise
        return (self.name, sigs, tuple(params.items())) if params else (self.name, sigs)

    # ---- miss path ---------------------------------------------------------------------
    def problem(self, args: Sequence, params: Mapping) -> Problem:
        """Validate the arguments and describe them; raise a clear error if they are bad."""
        if len(args) != len(self.arrays):
            raise InputTypeError(
                f"{self.name} takes {len(self.arrays)} array arguments "
                f"({', '.join(self.arrays)}), got {len(args)}")
        infos = []
        for name, value in zip(self.arrays, args):
            try:
                arrays.signature(value)
            except InputTypeError as exc:
                if isinstance(value, np.ndarray):   # a subclass with other semantics
                    raise InputTypeError(f"{self.name}: argument {name!r}: {exc}") from None
                raise InputTypeError(
                    f"{self.name}: argument {name!r} must be an array (NumPy, CuPy, PyTorch or "
                    f"__cuda_array_interface__), got {type(value).__name__}") from None
            infos.append(arrays.info(value))
            if (infos[-1].kind == "sparse") != (name in self.sparse):
                raise InputTypeError(self._sparse_mismatch(name, value))
        # a SparseWeight is static and builds its formats on whichever device uses it
        dense = [(n, i) for n, i in zip(self.arrays, infos) if i.kind != "sparse"]
        devices = {i.device for _, i in dense}
        if len(devices) > 1:
            where = ", ".join(f"{n} on {i.device}" for n, i in dense)
            raise InputValueError(f"{self.name}: arguments are on different devices ({where}); "
                                  "move them to one device first")
        kinds = {i.kind for i in infos if i.kind != "sparse"}
        if len(kinds) > 1:
            where = ", ".join(f"{n} is {i.kind}" for n, i in zip(self.arrays, infos))
            raise InputTypeError(f"{self.name}: arguments mix array types ({where}); "
                                 "pass one array type")
        dtypes = {i.dtype for i in infos}
        if len(dtypes) > 1:
            where = ", ".join(f"{n} is {i.dtype}" for n, i in zip(self.arrays, infos))
            raise InputTypeError(f"{self.name}: arguments have different dtypes ({where})")
        dtype = infos[0].dtype
        if dtype not in self.dtypes:
            raise InputTypeError(f"{self.name}: unsupported dtype {dtype}; expected one of "
                                 f"{', '.join(self.dtypes)}")
        for name, i in zip(self.arrays, infos):
            if not i.contiguous:
                raise InputValueError(f"{self.name}: argument {name!r} is not C-contiguous; "
                                      "pass a contiguous array (e.g. np.ascontiguousarray)")
            if any(n == 0 for n in i.shape):
                raise InputValueError(f"{self.name}: argument {name!r} has an empty dimension "
                                      f"(shape {i.shape}); every dimension must be at least 1")
        checked = self._params(params)
        dims, extra = self.check_shapes(infos, args, checked)
        kind, device = dense[0][1].kind, dense[0][1].device
        return Problem(self.name, tuple(dims.items()), dtype, kind, device,
                       tuple(checked.items()), tuple(extra.items()))

    def _sparse_mismatch(self, name: str, value) -> str:
        if name in self.sparse:
            return (f"{self.name}: argument {name!r} must be an adaptive.SparseWeight, got "
                    f"{type(value).__name__}; wrap the matrix once with "
                    "adaptive.SparseWeight(matrix)")
        hint = ("; for a sparse weight times a dense matrix use adaptive.launch('spmm', w, b)"
                if self.name == "gemm" and name == "a" else "")
        return (f"{self.name}: argument {name!r} must be a dense array (NumPy, CuPy, PyTorch "
                f"or __cuda_array_interface__), got an adaptive.SparseWeight{hint}")

    def _params(self, params: Mapping) -> dict:
        known = {p.name: p for p in self.params}
        out = {}
        for name, value in params.items():
            if name not in known:
                raise UnknownNameError(f"parameter of {self.name}", name, known,
                                       none=f"{self.name} takes no parameters")
            p = known[name]
            if value is not None:
                value = _scalar(self.name, p, value)
                for check, why in p.checks:
                    if not check(value):
                        raise InputValueError(f"{self.name}: parameter {name!r} must be {why}, "
                                              f"got {value!r}")
            out[name] = value
        for p in self.params:
            out.setdefault(p.name, p.default)
        return out

    @staticmethod
    def _rank(op: str, name: str, info: ArrayInfo, rank: int, layout: str):
        if len(info.shape) != rank:
            raise InputValueError(f"{op}: argument {name!r} must have rank {rank} ({layout}), "
                                  f"got shape {info.shape}")

    def check_shapes(self, infos: list[ArrayInfo], args: Sequence, params: dict):
        """Return (dims, extra) or raise. Subclasses implement."""
        raise NotImplementedError

    def out_shape(self, problem: Problem) -> tuple:
        raise NotImplementedError

    def roofline(self, problem: Problem) -> tuple[float, float]:
        """(flops, bytes): the least work and the fewest bytes moved through memory."""
        raise NotImplementedError

    # dims that count tokens (rows of a batch, sequence lengths): inputs that differ only
    # in them by less than a quarter octave share one decision (see class_dims)
    token_dims: tuple[str, ...] = ()

    def class_dims(self, problem: Problem) -> tuple:
        """The dims naming ``problem``'s input class: token dims above 16 rounded up to a
        quarter octave, the rest exact. A decode step one cached key longer, or a prompt
        one token longer, reuses its class's decision (a policy decides once per class)."""
        return tuple((name, bucket(value) if name in self.token_dims else value)
                     for name, value in problem.dims)

    def features(self, problem: Problem) -> dict[str, float]:
        """Numeric features for the cost model: log2 of dims, dtype size, op statistics."""
        feats = {f"log2_{name}": math.log2(max(value, 1)) for name, value in problem.dims}
        feats["itemsize"] = float(problem.itemsize)
        for name, value in problem.extra:
            feats[name] = float(value)
        for name, value in problem.params:
            if isinstance(value, (bool, int, float)):
                feats[f"param_{name}"] = float(value)
        flops, nbytes = self.roofline(problem)
        feats["log2_flops"] = math.log2(max(flops, 1.0))
        feats["log2_bytes"] = math.log2(max(nbytes, 1.0))
        feats["log2_intensity"] = feats["log2_flops"] - feats["log2_bytes"]
        return feats

    def work(self, features: Mapping[str, float], variant, config: Mapping
             ) -> dict[str, float]:
        """What one candidate does on an input beyond what the op's ``features`` say, in
        log2 (names without a prefix; the cost model reads them as ``work.*``): an op
        whose variants read different forms of an input (spmm: CSR, BSR blocks of 16, 32,
        64) says here how much each form makes a candidate do. Computed from the op's
        features, which a pack's rows store, so a pack's rows and a live miss agree.
        ``{}``: every candidate does the op's work (the default)."""
        return {}

    def work_key(self, variant, config: Mapping):
        """What :meth:`work` reads of a candidate, as a hashable: candidates with equal keys
        get equal work on an input, so a miss computes it once per key (spmm: the weight
        form; ~100 candidates, 5 forms). None (the default): not said; computed for each
        candidate."""
        return None

    def reference(self, *inputs: np.ndarray, **params) -> np.ndarray:
        """The float64 NumPy result (inputs upcast); the ground truth in every test."""
        raise NotImplementedError

    def make_inputs(self, dims: Mapping[str, int], dtype: str, rng: np.random.Generator,
                    **stats) -> tuple:
        """Fresh random NumPy inputs (never zeros) for these dims."""
        raise NotImplementedError

    def error(self, out, ref: np.ndarray, floor: float = 0.0) -> float:
        """Relative error ||out - ref|| / ||ref|| in float64; inf when out has NaN/Inf.
        With ``floor`` (:meth:`error_floor`) each element's |out - ref| counts only beyond
        it: what rounding to the output dtype costs below its smallest normal."""
        out = np.asarray(arrays.to_numpy(out), dtype=np.float64)
        if out.shape != ref.shape:
            raise InputValueError(f"{self.name}: result shape {out.shape} != reference "
                                  f"shape {ref.shape}")
        if not np.all(np.isfinite(out)):
            return math.inf
        denom = float(np.linalg.norm(ref)) or 1.0
        return float(np.linalg.norm(excess(out, ref, floor))) / denom


def excess(out: np.ndarray, ref: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """|out - ref| beyond ``floor`` per element (0 where within it), float64."""
    diff = np.abs(np.asarray(out, np.float64) - ref)
    return np.maximum(diff - floor, 0.0) if floor else diff


def random_array(rng: np.random.Generator, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    """Standard-normal values in the given dtype (bfloat16 is generated as float32)."""
    np_dtype = NUMPY_DTYPES.get(dtype, np.float32)
    return (rng.standard_normal(shape) * scale).astype(np_dtype)


def bucket(n: int) -> int:
    """``n`` itself up to 16, else the quarter octave above it (17 -> 19, 100 -> 108)."""
    if n <= 16:
        return n
    return math.ceil(2 ** (math.ceil(4 * math.log2(n) - 1e-9) / 4))
