"""``AdaptiveRMSNorm``: a model's RMSNorm whose computation is one adaptive launch.

Imports torch at module level: only :mod:`adaptive.integrations.transformers` imports this
module, on first use.

transformers' ``LlamaRMSNorm`` (and the copies other architectures make of it) runs eight
PyTorch ops: cast to fp32, square, mean, add eps, rsqrt, multiply, cast back, multiply by
the weight. A decode step calls it twice a layer on a few rows, where each op's host cost
is more than its kernel's work; ``rmsnorm``'s fused kernel is one launch, and its baseline
(``rmsnorm_torch``) is those eight ops as the model ran them, so the dispatcher serves
each input shape with whichever is faster, measured.

A warm call holds the committed plan of its input shape (one dict lookup, the plan's
``stale`` flag and the dtype); one call in :data:`HOLD_EVERY` goes through the dispatcher
(sampling, drift, the counter log), and exploring shapes always do. A shape committed to
the baseline (the model's own ops) runs the replaced module's forward itself, as
``AdaptiveLinear`` calls ``F.linear`` for torch's matmul: the plan's call costs the host
more than the eight ops (run S43: 132 against 97 µs a call, 0.91x the plain model's
tokens/s when every norm was served so).
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from adaptive.integrations.direct import direct_route, rebound
from adaptive.integrations.routing import backed_off
from adaptive.runtime import default_dispatcher

HOLD_EVERY = 64    # one warm call in this many goes through the dispatcher
MAX_HELD = 256     # input shapes whose plans one norm holds
_stagger = itertools.count()


def is_rmsnorm(module: nn.Module) -> bool:
    """Whether ``module`` computes ``weight * (x * rsqrt(mean(x², -1) + eps)).to(dtype)``
    in fp32 exactly as ``rmsnorm_torch`` (transformers' LlamaRMSNorm) does: it has a 1-D
    ``weight`` and a float ``variance_epsilon``, and its forward on a small random input
    gives that computation's bits. Other norms (Gemma's ``1 + weight``, LayerNorm) differ
    and are left as they are."""
    w = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or not isinstance(eps, float) \
            or w.device.type == "meta" or isinstance(module, AdaptiveRMSNorm):
        return False
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn((3, w.shape[0]), generator=gen).to(device=w.device, dtype=w.dtype)
    with torch.no_grad():
        try:
            got = module(x)
        except Exception:  # noqa: BLE001 (a module that cannot run alone is not a norm here)
            return False
        h = x.to(torch.float32)
        want = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)


class AdaptiveRMSNorm(nn.Module):
    """An RMSNorm (same ``weight``, state_dict keys and ``variance_epsilon``) whose forward
    is one ``adaptive.launch("rmsnorm", ...)``; for inference only.

    Args:
        norm: the module to replace (checked by :func:`is_rmsnorm`; its weight is taken
            over, not copied).
        path: the module's name in its model, for error messages.
    """

    def __init__(self, norm: nn.Module, path: str = ""):
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = float(norm.variance_epsilon)
        self.path = path
        # the replaced module, kept unregistered (its weight is ours: no second state_dict
        # key); it serves the inputs the op does not take, as the plain model would
        object.__setattr__(self, "_original", norm)
        self._turn = itertools.count(1 + next(_stagger) % HOLD_EVERY)
        self._level = 0          # routing: one warm call in HOLD_EVERY << _level
        self._bind()

    def _bind(self) -> None:
        """What forward reads from the weight (after init, ``.to()``, a load)."""
        self._w = self.weight.detach()
        self._dtype = self._w.dtype
        self._held: dict = {}   # x.shape -> the dispatcher's committed plan
        # x.shape -> a committed plan of the model's own computation: its forward is called
        self._own: dict = {}
        self._original.weight = self.weight
        rebound(self)            # a decode step's direct call read the weights before

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        self._bind()
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        own = self._own.get(x.shape)
        if own is not None and not own.stale and x.dtype is self._dtype \
                and not self.training:
            if next(self._turn) % (HOLD_EVERY << self._level):
                return self._original.forward(x)
            return self._routed(x, own, self._own)
        plan = self._held.get(x.shape)
        if plan is not None and not plan.stale and x.dtype is self._dtype \
                and x.is_contiguous() and not self.training:
            if next(self._turn) % (HOLD_EVERY << self._level):
                return plan.run((x.view(-1, x.shape[-1]), self._w), None).view(x.shape)
            return self._routed(x, plan, self._held)
        if (own is not None and own.stale) or (plan is not None and plan.stale):
            self._level = 0             # a plan dropped (drift, forget): watched closely
        return self._compute(x)

    def direct_call(self, rows: int):
        """The model's own norm (its forward) for a decode step of ``rows`` rows (x
        ``[rows, 1, C]``) where this norm holds it for that shape, else None
        (:mod:`adaptive.integrations.direct`)."""
        own = self._own.get((rows, 1, self.weight.shape[0]))
        if own is None or own.stale or self.training:
            return None
        return self._original.forward

    def route_call(self, x: torch.Tensor) -> torch.Tensor:
        """One call through the dispatcher (a direct decode step's routed turn)."""
        return self._compute(x)

    def _routed(self, x: torch.Tensor, plan, held: dict) -> torch.Tensor:
        """A warm call of a held ``plan`` sent through the dispatcher (one in
        ``HOLD_EVERY << level``), the level then backed off or reset."""
        y = self._compute(x)
        self._level = backed_off(self._level, plan, held.get(x.shape))
        return y

    def _compute(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise RuntimeError(f"{self.path or 'AdaptiveRMSNorm'}: adaptive norms are for "
                               "inference and give no gradients; call model.eval()")
        w = self._w
        if x.dtype != w.dtype or x.shape[-1] != w.shape[0]:
            # the op takes one dtype and weight [C]: another input is the model's own
            # computation, as the plain module would run it (type promotion included)
            return self.to_norm()(x)
        x2 = x.reshape(-1, x.shape[-1])
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        params = {"eps": self.variance_epsilon}
        d = default_dispatcher((x2, w))
        y = d.run("rmsnorm", (x2, w), None, params)
        plan = d.plan("rmsnorm", x2, w, **params)
        self._held.pop(x.shape, None)
        self._own.pop(x.shape, None)
        if plan.provisional or plan.stale:
            pass                            # exploring: every call through the dispatcher
        elif plan.candidate.variant.torch_library:
            if len(self._own) < MAX_HELD:   # the model's own ops, on x as given
                self._own[x.shape] = plan
        elif x.is_contiguous() and len(self._held) < MAX_HELD:
            self._held[x.shape] = plan      # (a layout the warm path skips is not held)
        return y.view(x.shape)

    def route_of(self, x: torch.Tensor) -> str:
        """Which way a warm call on ``x`` goes now (diagnostics): ``"the model's norm
        (held)"``, ``"held <candidate>"`` or ``"dispatcher"`` (exploring, a new shape, or
        another dtype); in a decode step switched by :mod:`adaptive.integrations.direct`,
        that switch."""
        switched = direct_route(self)
        if switched is not None:
            return switched
        plan = self._own.get(x.shape)
        if plan is not None and not plan.stale and x.dtype is self._dtype:
            return "the model's norm (held)"
        plan = self._held.get(x.shape)
        if plan is not None and not plan.stale and x.dtype is self._dtype \
                and x.is_contiguous():
            return f"held {plan.candidate.label}"
        return "dispatcher"

    def to_norm(self) -> nn.Module:
        """The module this one replaced, over the same weight."""
        self._original.weight = self.weight
        return self._original

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"
