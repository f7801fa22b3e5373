"""``AdaptiveLinear``: an ``nn.Linear`` for inference whose matmul is one adaptive launch.

Imports torch at module level: only :mod:`adaptive.integrations.transformers` imports this
module, on first use.

Three layouts of the same weight, chosen once by ``patch()``:

- ``dense``: the weight is kept transposed and contiguous, ``wt [in, out]``, and
  ``weight`` is a transposed view of it (state_dict keeps ``[out, in]``, no second copy);
  ``y = gemm(x, wt)``.
- ``shared``: a weight tied to another module (e.g. an embedding) stays as it is, ``[out,
  in]``; ``yᵀ = gemm(W, xᵀ)``.
- ``sparse``: a pruned weight as an :class:`adaptive.SparseWeight` built once (the dense
  ``weight`` stays for state_dict); ``yᵀ = spmm(W, xᵀ)``.
"""

from __future__ import annotations

import torch
from torch import nn

from adaptive.runtime import default_dispatcher
from adaptive.ops.sparse import SparseWeight

MODES = ("dense", "shared", "sparse")
HOLD_EVERY = 64    # one warm call in this many goes through the dispatcher
MAX_HELD = 64      # input shapes whose plans one layer holds (prefill lengths, decode)


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
            self._w = s
        self._op = "spmm" if self.mode == "sparse" else "gemm"
        b = None if self.bias is None else self.bias.detach()
        self._bias = b if self.mode == "dense" else None
        self._bias_col = None if b is None or self.mode == "dense" else b.view(-1, 1)
        self._held = {}   # (x shape, dtype, device) -> the dispatcher's committed plan
        self._calls = 0

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
        if self.training:
            raise RuntimeError(f"{self.path or 'AdaptiveLinear'}: adaptive layers are for "
                               "inference and give no gradients; call model.eval()")
        x2 = x.reshape(-1, self.in_features)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        wt = self._wt
        if wt is not None:
            y = self._launch("gemm", x2, wt, x2)
            if self._bias is not None:
                y += self._bias
            return y.view(x.shape[:-1] + (self.out_features,))
        xt = x2.t().contiguous()
        y = self._launch(self._op, self._w, xt, xt)     # [out, tokens]
        if self._bias_col is not None:
            y += self._bias_col
        return y.t().reshape(x.shape[:-1] + (self.out_features,))

    def _launch(self, op: str, a, b, x):
        """One launch of ``op(a, b)``; ``x`` is the activation (the other operand is this
        layer's weight). The plan serving ``x``'s shape is held here once the dispatcher
        has committed it, so a warm call skips the dispatcher's key (four tensor
        attributes per argument); one call in ``HOLD_EVERY`` still goes through the
        dispatcher, so sampling, drift and the counter log keep seeing the layer."""
        key = (x.shape, x.dtype, x.device)
        plan = self._held.get(key)
        self._calls += 1
        if plan is not None and not plan.stale and self._calls % HOLD_EVERY:
            return plan.run((a, b), None)
        return self._through_dispatcher(op, key, a, b)

    def _through_dispatcher(self, op: str, key: tuple, a, b):
        d = default_dispatcher((a, b))
        y = d.run(op, (a, b), None, {})
        plan = d.plan(op, a, b)
        if plan.provisional or plan.stale:   # still exploring: every call goes through
            self._held.pop(key, None)
        elif key in self._held or len(self._held) < MAX_HELD:
            self._held[key] = plan
        return y

    def to_linear(self) -> nn.Linear:
        """A plain ``nn.Linear`` over the same parameters (no copy)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device="meta")
        linear.weight = self.weight
        linear.bias = self.bias
        return linear

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode}"
