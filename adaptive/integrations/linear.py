"""``AdaptiveLinear``: an ``nn.Linear`` for inference whose matmul is one adaptive launch.

Imports torch at module level: only :mod:`adaptive.integrations.transformers` imports this
module, on first use.

Three layouts of the same weight, chosen once by ``patch()``:

- ``dense``: the weight is kept transposed and contiguous, ``wt [in, out]``, and
  ``weight`` is a transposed view of it (state_dict keeps ``[out, in]``, no second copy);
  ``y = gemm(x, wt)``.
- ``shared``: a weight tied to another module (e.g. an embedding), or any dense weight
  under ``patch(layout="torch")``, stays as it is, ``[out, in]``; ``yᵀ = gemm(W, xᵀ)``.
- ``sparse``: a pruned weight as an :class:`adaptive.SparseWeight` built once (the dense
  ``weight`` stays for state_dict); ``yᵀ = spmm(W, xᵀ)``.

A warm call costs what the plain layer's costs: once the dispatcher has committed an input
shape to torch's own matmul (a ``torch_library`` variant: cuBLAS through ``torch.mm``; for a
sparse weight, spmm's baseline: the dense matmul on the pruned weight),
the layer calls ``F.linear(x, weight, bias)`` itself, as ``nn.Linear`` does, guarded by
one dict lookup on ``x.shape``, a dtype identity and the plan's ``stale`` flag. Other
committed plans are held per exact input and run without the dispatcher's key. In the
``shared`` and ``sparse`` layouts such a kernel runs on copies of ``xᵀ`` and of its output;
it serves a shape only after beating ``F.linear`` with them (:meth:`_f_linear_wins`).
cuSPARSELt's 2:4 matmul goes this way too: handed ``x``'s transposed view with its result
transposed back (``transpose_result``), as torch's own 2:4 linear does, one call took
0.26 to 7.0 s of host time on the H200 (run S85, one projection a prefill so served),
against about 1.1 ms a call on the contiguous copy. Either way one call in
:data:`HOLD_EVERY` (fewer while the plan holds:
:mod:`adaptive.integrations.routing`) goes through the dispatcher (sampling, drift, the
counter log), a plan the dispatcher drops is let go, and exploring shapes always go
through it.
"""

from __future__ import annotations

import itertools
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

from adaptive.integrations.direct import direct_route, rebound
from adaptive.integrations.routing import backed_off
from adaptive.runtime import default_dispatcher
from adaptive.ops.base import bucket
from adaptive.ops.sparse import SparseWeight

MODES = ("dense", "shared", "sparse")
RACE_RUNS = 3      # runs of each route when F.linear races a kernel and its copies
# every race so far in this process: how many and the seconds they took on the calling
# thread (a server's stats report them: a race is neither a miss nor an exploring call)
races = {"races": 0, "race_s": 0.0}
HOLD_EVERY = 64    # one warm call in this many goes through the dispatcher
MAX_HELD = 256     # input shapes whose plans one layer holds (prefill lengths, decode)
# where each layer's count of warm calls starts: layers called once per token route on
# different tokens (spread over HOLD_EVERY), not all on the same one (a per-token spike)
_stagger = itertools.count()


class AdaptiveLinear(nn.Linear):
    """An ``nn.Linear`` (same ``weight``, ``bias`` and state_dict keys) whose forward is
    one ``adaptive.launch``; for inference only (outputs carry no autograd history).

    Args:
        linear: the layer to replace (its parameters are taken over, not copied, except
            the dense layout's one transpose).
        mode: ``"dense"``, ``"shared"`` or ``"sparse"`` (see the module docstring).
        path: the module's name in its model, for error messages.
    """

    def __init__(self, linear: nn.Linear, mode: str = "dense", path: str = ""):
        if mode not in MODES:
            raise ValueError(f"AdaptiveLinear mode {mode!r}; expected one of {MODES}")
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.mode, self.path = mode, path
        if mode == "dense":
            wt = linear.weight.detach().t().contiguous()
            self.weight = nn.Parameter(wt.t(), requires_grad=False)
        else:
            self.weight = linear.weight
        self.bias = linear.bias
        self._sparse = None
        self._bind()

    def _bind(self) -> None:
        """Derive what forward reads from the parameters (after init, ``.to()``, loads)."""
        w = self.weight.detach()
        self._wt = self._w = None
        if self.mode == "dense":
            wt = w.t()
            if not wt.is_contiguous():   # a conversion gave the view a layout of its own
                wt = wt.contiguous()
                self.weight.data = wt.t()
            self._wt = wt
        elif self.mode == "shared":
            self._w = w if w.is_contiguous() else w.contiguous()
        else:
            dtype = str(w.dtype).removeprefix("torch.")
            s = self._sparse
            if s is None or s.dtype != dtype or s.shape != tuple(w.shape):
                s = self._sparse = SparseWeight(w)
            if w.is_cuda and w.is_contiguous():   # spmm's dense baseline reads w itself
                from adaptive.backends.cuda_sparse import adopt_device_dense
                adopt_device_dense(s, w)
            self._w = s
        self._op = "spmm" if self.mode == "sparse" else "gemm"
        b = None if self.bias is None else self.bias.detach()
        self._bias = b if self.mode == "dense" else None
        self._bias_col = None if b is None or self.mode == "dense" else b.view(-1, 1)
        self._held = {}   # (x shape, dtype, device) -> the dispatcher's committed plan
        # (a committed candidate, the class of token counts) -> whether F.linear beat it
        # with its copies (see _f_linear_wins)
        self._raced: dict = {}
        # x.shape -> a committed plan of torch's own matmul: F.linear is called instead
        self._library = {}
        self._dtype = w.dtype
        self._w_linear = w if self.mode != "dense" else self._wt.t()   # [out, in]
        self._b_linear = b
        # counts warm calls (next(): no nn.Module.__setattr__ on the hot path)
        self._turn = itertools.count(1 + next(_stagger) % HOLD_EVERY)
        self._level = 0          # routing: one warm call in HOLD_EVERY << _level
        rebound(self)            # a decode step's direct call read the weights before

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        self._bind()
        return module

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        if self.mode == "sparse":   # new values: the sparse formats are built again
            self._sparse = None
        self._bind()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = self._library.get(x.shape)
        if (plan is not None and x.dtype is self._dtype and not plan.stale
                and not self.training):
            if next(self._turn) % (HOLD_EVERY << self._level):
                return F.linear(x, self._w_linear, self._b_linear)
            y = self._compute(x, True)
            self._level = backed_off(self._level, plan, self._library.get(x.shape))
            return y
        if plan is not None and plan.stale:
            self._level = 0             # a plan dropped (drift, forget): watched closely
        return self._compute(x)

    def direct_call(self, rows: int):
        """The model's own call (``F.linear``) for a decode step of ``rows`` rows (x
        ``[rows, 1, in]``) where this layer holds torch's matmul for that shape, else None
        (:mod:`adaptive.integrations.direct`)."""
        plan = self._library.get((rows, 1, self.in_features))
        if plan is None or plan.stale or self.training:
            return None
        weight, bias = self._w_linear, self._b_linear

        def linear(x: torch.Tensor) -> torch.Tensor:   # positional: torch parses no kwargs
            return F.linear(x, weight, bias)
        return linear    # (weights derived again: _bind undoes the switch, direct.rebound)

    def route_call(self, x: torch.Tensor) -> torch.Tensor:
        """One call through the dispatcher (a direct decode step's routed turn)."""
        return self._compute(x, True)

    def _compute(self, x: torch.Tensor, route: bool = False) -> torch.Tensor:
        """The layer as adaptive launches (``route``: through the dispatcher)."""
        if self.training:
            raise RuntimeError(f"{self.path or 'AdaptiveLinear'}: adaptive layers are for "
                               "inference and give no gradients; call model.eval()")
        x2 = x.reshape(-1, self.in_features)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        wt = self._wt
        if wt is not None:
            y = self._launch("gemm", x2, wt, x2, x, route)
            if self._bias is not None:
                y += self._bias
            return y.view(x.shape[:-1] + (self.out_features,))
        if not route:           # a weight kept as given, or sparse: F.linear where it is
            y = self._library_first(x, x2)
            if y is not None:
                return y
        xt = x2.t().contiguous()
        y = self._launch(self._op, self._w, xt, xt, x, route)     # [out, tokens]
        if self._bias_col is not None:
            y += self._bias_col
        # row-major [..., out] as nn.Linear returns it: the transposed view's features are
        # tokens apart, and a q/k/v projection laid out so reaches SDPA with a last dim of
        # stride != 1, which none of its fused kernels take (its math path instead, fp32:
        # a prefill 3.3x torch's inside the server, run S26)
        return y.t().contiguous().view(x.shape[:-1] + (self.out_features,))

    def _library_first(self, x: torch.Tensor, x2: torch.Tensor) -> torch.Tensor | None:
        """A weight kept as given or sparse, on an input shape not held as torch's matmul:
        the plan held for it, or the dispatcher's, asked with an uninitialised stand-in of
        ``xᵀ`` (its key reads shape, dtype, strides and device only). A committed plan of
        torch's own matmul (for a sparse weight: spmm's baseline, the dense matmul on the
        pruned weight) is ``F.linear`` on ``x`` as given, held from now on, and the two
        transposing copies of ``x`` and of the output are never made (each a full pass
        over the activations: 222 copy kernels, 21 ms of a 46 ms prefill in run S33; a
        pruned model's prefill, run S56, 131 copies, 14.0 ms against torch's 1.75).
        None: anything else (another kernel, exploring, another dtype), launched as
        ``yᵀ = W xᵀ``."""
        if x.dtype is not self._dtype:
            return None
        key = self._held_key(x2)
        plan = self._held.get(key)   # a warm call of another kernel's plan: no new key
        if plan is None or plan.stale:
            args = self._launched(x2)
            plan = default_dispatcher(args).plan(self._op, *args)
        if not self._by_f_linear(plan, x):
            return None
        _hold(self._held, key, plan)
        _hold(self._library, x.shape, plan)
        return F.linear(x, self._w_linear, self._b_linear)

    def _by_f_linear(self, plan, x: torch.Tensor) -> bool:
        """Whether ``plan`` for ``x`` is served by ``F.linear``: a committed plan of torch's
        own matmul on the layer's dtype."""
        return (not plan.provisional and not plan.stale and _is_library(plan, self._op)
                and x.dtype is self._dtype)

    def _held_key(self, x2: torch.Tensor) -> tuple:
        """The key a plan for the rows ``x2`` is held by: the launched activation's shape
        (``xᵀ``'s for a weight kept as given), dtype and device."""
        shape = x2.shape if self._wt is not None else torch.Size((self.in_features,
                                                                   x2.shape[0]))
        return (shape, x2.dtype, x2.device)

    def _launched(self, x2: torch.Tensor) -> tuple:
        """The arguments launched for the rows ``x2`` (a weight kept as given: an
        uninitialised stand-in of ``xᵀ``, for the dispatcher's key)."""
        if self._wt is not None:
            return (x2 if x2.is_contiguous() else x2.contiguous(), self._wt)
        return (self._w, x2.new_empty((self.in_features, x2.shape[0])))

    def route_of(self, x: torch.Tensor) -> str:
        """Which way a call on ``x`` goes now (diagnostics: the dispatcher is asked for the
        plan as the call would ask it, deciding it on a miss): ``"F.linear (held)"``,
        ``"F.linear (a new shape)"`` (a committed plan of torch's matmul), ``"held
        <candidate>"`` (a held plan of another kernel) or ``"dispatcher (...): <state>
        <candidate>"``, which says whether ``x`` and the output are copied transposed; in a
        decode step switched by :mod:`adaptive.integrations.direct`, that switch."""
        switched = direct_route(self)
        if switched is not None:
            return switched
        plan = self._library.get(x.shape)
        if plan is not None and not plan.stale and x.dtype is self._dtype:
            return "F.linear (held)"
        x2 = x.reshape(-1, self.in_features)
        held = self._held.get(self._held_key(x2))
        if held is not None and not held.stale:
            return f"held {held.candidate.label}"
        args = self._launched(x2)
        plan = default_dispatcher(args).plan(self._op, *args)
        if self._wt is None and self._by_f_linear(plan, x):
            return "F.linear (a new shape)"
        how = "rows as given" if self._wt is not None else "x and the output transposed"
        state = "exploring" if plan.provisional else "committed"
        return f"dispatcher ({how}): {state} {plan.candidate.label}"

    def _launch(self, op: str, a, b, x, given, route: bool):
        """One launch of ``op(a, b)``; ``x`` is the activation as launched (the other
        operand is this layer's weight), ``given`` the layer's input. The plan serving
        ``x``'s shape is held here once the dispatcher has committed it, so a warm call
        skips the dispatcher's key (four tensor attributes per argument); one call in
        ``HOLD_EVERY << level`` still goes through the dispatcher, so sampling, drift and
        the counter log keep seeing the layer."""
        key = (x.shape, x.dtype, x.device)
        plan = None if route else self._held.get(key)
        if plan is not None and not plan.stale:
            if next(self._turn) % (HOLD_EVERY << self._level):
                return plan.run((a, b), None)
            y = self._through_dispatcher(op, key, a, b, given)
            self._level = backed_off(self._level, plan, self._held.get(key))
            return y
        if plan is not None:            # stale: dropped by the dispatcher
            self._level = 0
        return self._through_dispatcher(op, key, a, b, given)

    def _through_dispatcher(self, op: str, key: tuple, a, b, given):
        d = default_dispatcher((a, b))
        y = d.run(op, (a, b), None, {})
        plan = d.plan(op, a, b)
        shape = given.shape
        if plan.provisional or plan.stale:   # still exploring: every call goes through
            self._held.pop(key, None)
            self._library.pop(shape, None)
            return y
        _hold(self._held, key, plan)
        if given.dtype is self._dtype and (_is_library(plan, op) or
                                           self._f_linear_wins(plan, given)):
            _hold(self._library, shape, plan)
        else:
            self._library.pop(shape, None)
        return y

    def _f_linear_wins(self, plan, x: torch.Tensor) -> bool:
        """Whether ``F.linear`` on ``x`` as given beats ``plan``'s kernel with the copies
        its route makes (a weight kept as given or sparse: ``xᵀ`` and the output, copied
        transposed), timed here once per candidate and class of token counts (the
        quarter octave of ``adaptive.ops.base.bucket``, as the dispatcher shares a decision
        within an input class: a server's prefills of ever new lengths would race on every
        one, each route :data:`RACE_RUNS` + 1 times on the serving thread), by
        :func:`race_ms` (each route alone, alternating, the medians compared). The
        dispatcher times the kernel alone: run S66's pruned prefill held ``tc_wide`` on 32
        projections, each with two transposing copies. A dense-layout weight (``x``
        launched as given) copies nothing: never raced."""
        if self._wt is not None:
            return False
        key = (plan.candidate, bucket(x.numel() // self.in_features))
        raced = self._raced.get(key)
        if raced is not None:
            return raced
        x2 = x.reshape(-1, self.in_features)
        if not x2.is_contiguous():
            x2 = x2.contiguous()

        def kernel():
            xt = x2.t().contiguous()
            y = plan.run((self._w, xt), None)
            if self._bias_col is not None:
                y += self._bias_col
            return y.t().contiguous()

        def library():
            return F.linear(x, self._w_linear, self._b_linear)
        t0 = time.perf_counter()
        mine, theirs = race_ms(kernel, library, x.device)
        races["races"] += 1
        races["race_s"] += time.perf_counter() - t0
        wins = theirs <= mine
        _hold(self._raced, key, wins)
        return wins

    def to_linear(self) -> nn.Linear:
        """A plain ``nn.Linear`` over the same parameters (no copy)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device="meta")
        linear.weight = self.weight
        linear.bias = self.bias
        return linear

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode}"


def race_ms(first, second, device) -> tuple[float, float]:
    """The median ms of ``first()`` and of ``second()``, each run alone
    (:data:`RACE_RUNS` times, alternating, after one untimed run of each), the device
    drained before and after each run: what one call of each costs the caller."""
    sync = ((lambda: torch.cuda.synchronize(device)) if device.type == "cuda"
            else (lambda: None))
    first()
    second()
    times: tuple[list, list] = ([], [])
    for _ in range(RACE_RUNS):
        for fn, out in ((first, times[0]), (second, times[1])):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def _hold(table: dict, key, value) -> None:
    """``table[key] = value`` unless the table already holds :data:`MAX_HELD` other keys (a
    layer's tables are bounded; a full one keeps serving the keys it has)."""
    if key in table or len(table) < MAX_HELD:
        table[key] = value


def _is_library(plan, op: str) -> bool:
    """Whether ``plan`` runs what ``F.linear`` on the layer's weight computes, with the
    library torch calls: torch's own matmul (gemm, a ``torch_library`` variant), or
    spmm's dense matmul on the pruned weight (its baseline that runs on any pruned
    weight; cuBLAS), on torch tensors. spmm's other baseline, torch's cuSPARSELt path,
    needs a 2:4 weight (``is_2to4`` among its requirements) and runs another kernel than
    ``F.linear``: it is served through the dispatcher."""
    variant = plan.candidate.variant
    if plan.problem.kind != "torch":
        return False
    if op == "gemm":
        return variant.torch_library
    return op == "spmm" and variant.baseline and not any(
        "is_2to4" in r.text for r in variant.requires)
