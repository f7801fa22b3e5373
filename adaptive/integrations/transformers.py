"""transformers models on adaptive: an ``"adaptive"`` attention implementation and ``patch``.

    >>> from adaptive.integrations import transformers as at
    >>> model = at.patch(LlamaForCausalLM(config).eval())   # linears + attention, in place
    >>> model.generate(input_ids, max_new_tokens=32)

:func:`register` adds ``"adaptive"`` to transformers' ``AttentionInterface`` (attention as
``adaptive.launch("attention", q, k, v[, mask], causal=..., scale=...)``, grouped k/v
heads passed as they are, never repeated here) and to its ``AttentionMaskInterface`` with
SDPA's mask builder, so a model hands over no mask for pure causal attention and a
boolean ``[B, 1, Lq, Lk]`` mask only where padding (or a window) needs one; that mask
goes to the op, whose variants say whether they read masks (``requires = ["not
masked"]``), so a masked call is never routed silently.

:func:`patch` replaces every ``nn.Linear`` with an
:class:`~adaptive.integrations.linear.AdaptiveLinear`, every RMSNorm that computes as
transformers' ``LlamaRMSNorm`` with an :class:`~adaptive.integrations.norm.AdaptiveRMSNorm`
(op ``rmsnorm``), and switches the model's attention to ``"adaptive"``. Everything is
checked before anything changes: a module it cannot serve is an error naming the module
and why, and the model is left as it was.

torch and transformers are imported when a function here is first called (the
``[llm]`` extra); ``import adaptive`` imports neither.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping

from adaptive.integrations.routing import backed_off
from adaptive.runtime import default_dispatcher, launch
from adaptive.errors import InputTypeError, InputValueError
from adaptive.ops.base import bucket

NAME = "adaptive"
AUTO_MAX_DENSITY = 0.5      # sparse="auto": a weight with at most this fraction nonzero
LINEAR_DTYPES = {"cuda": ("float16", "bfloat16", "float32"),
                 "cpu": ("float16", "float32")}          # NumPy (host backend): no bfloat16
SPARSE_DTYPES = ("float16", "float32")                   # adaptive.SparseWeight's

HOLD_EVERY = 64     # one held attention call in this many goes through the dispatcher
# attention input classes whose plans are held: a server's shapes (prefill widths x batch
# sizes, decode batch sizes x cached-length classes) are a few hundred; an entry is a key
# and a plan reference
MAX_HELD = 1024

_lock = threading.Lock()
_registered = False
# attention plans that run the same function for every key of their input class (a torch
# entry: SDPA), held by (q shape, Hkv, Lk's class, dtype, device, params, mask layout), so
# a decode step's new Lk neither builds a key nor misses the dispatcher's exact-key cache
_held: dict[tuple, object] = {}
# the other committed attention plans (a CUDA kernel's launch is bound to its key's
# shapes), held by exact shapes: a decode step's layers after the first, which share the
# step's shapes, run it without building a key; the newest MAX_EXACT are kept
_exact: dict[tuple, object] = {}
MAX_EXACT = 256
_turn = itertools.count(1)
# transformers' own SDPA attention function (``attn_implementation="sdpa"``): a class held
# on a torch_library plan (SDPA, what the plain model runs) is served by it, the model's
# very call, as a patched linear held on torch's matmul calls F.linear (run S50's ablation:
# our function around the same SDPA call cost 1.4 % of batch 1's tokens/s)
_own_sdpa = None
_level = 0        # routing: one held call in HOLD_EVERY << _level (routing.backed_off)
# a decode step's attention held on SDPA (an _Own answer), remembered per layer: the same
# batch, dtype, device, parameters and mask layout (none, or a padding mask's batch and
# head extents and dtype), and a cached length within the same class, go to _own_sdpa on
# a few integer comparisons, without the class's key (a tuple hashed, the length's class
# computed). A layer's head counts and head size are its own and are not compared (were
# they to change, transformers' SDPA function still computes the call right). On a CPU
# decode loop of a tiny Llama (prompt 200) our function cost 30.2 us a token over 4 layers
# against transformers' own, 17.5 with the memo (docs/benchmarks.md); a masked decode (a
# batch of padded prompts, q [4, 4, 1, 16]) 3.3-4.9 us a call without it, 2.6-3.0 with it
_MEMO = "_adaptive_own_sdpa"
_generation = 0   # bumped by forget_held: an older generation's memos are not used
# attention calls served by transformers' own SDPA function through ours so far (a decode
# step whose every call was: the decode-steps hook may switch the model's attention to it)
_own_served = 0


class _Own:
    """_attend's answer where the class is held on SDPA as the plain model calls it: the
    caller calls _own_sdpa with the model's arguments (``plan``: the held plan, for the
    layer's memo)."""

    __slots__ = ("plan",)

    def __init__(self, plan):
        self.plan = plan


def __getattr__(name: str):
    if name == "AdaptiveLinear":   # imports torch: only when asked for
        from adaptive.integrations.linear import AdaptiveLinear
        return AdaptiveLinear
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> str:
    """Register ``"adaptive"`` with transformers (attention and mask builder); idempotent.

    Returns:
        The implementation's name, for ``from_pretrained(..., attn_implementation=...)``
        or ``model.set_attn_implementation(...)``.
    """
    global _registered
    if _registered:
        return NAME
    with _lock:
        if not _registered:
            try:
                import transformers
                from transformers import AttentionInterface
                from transformers.masking_utils import AttentionMaskInterface
            except ImportError as exc:
                raise ImportError(
                    f"adaptive.integrations.transformers needs transformers >= 4.53 "
                    f"(AttentionInterface and AttentionMaskInterface) and torch: {exc}; "
                    "pip install 'adaptive-dispatch[llm]'") from None
            sdpa_mask = AttentionMaskInterface._global_mapping.get("sdpa")
            if sdpa_mask is None:
                raise ImportError(f"transformers {transformers.__version__} has no SDPA mask "
                                  "builder to register; expected transformers >= 4.53")
            global _own_sdpa
            _own_sdpa = AttentionInterface._global_mapping.get("sdpa")
            AttentionInterface.register(NAME, attention_forward)
            AttentionMaskInterface.register(NAME, sdpa_mask)
            _registered = True
    return NAME


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention-function contract, served by ``adaptive.launch``.

    Args:
        module: the calling attention layer (its ``is_causal`` is the default).
        query: ``[B, H, Lq, D]``; key, value: ``[B, Hkv, Lk, D]`` with ``H % Hkv == 0``.
        attention_mask: None (pure causal, or none at all) or a boolean/additive
            ``[B or 1, 1 or H, Lq, Lk']`` mask, ``Lk' >= Lk``, that already holds the
            causal pattern (transformers builds it whole).
        dropout: must be 0 (inference).
        scaling: the logit scale (None: ``1/sqrt(D)``).
        is_causal: overrides ``module.is_causal``.

    Returns:
        ``(out [B, Lq, H, D], None)``: no attention weights, as with SDPA.
    """
    global _own_served
    memo = module.__dict__.get(_MEMO)
    route = False
    if memo is not None and not dropout \
            and memo[0] == _generation and query.size(2) == 1 and query.size(0) == memo[1] \
            and memo[2] <= key.size(2) <= memo[3] and query.dtype is memo[4] \
            and query.get_device() == memo[5] and scaling == memo[6] \
            and is_causal is memo[7] and not memo[8].stale \
            and (attention_mask is None if memo[9] is None
                 else _same_mask_layout(attention_mask, memo[9], key.size(2))) \
            and kwargs.get("softcap") is None and kwargs.get("position_bias") is None \
            and kwargs.get("s_aux") is None:
        if next(_turn) % (HOLD_EVERY << _level):
            _own_served += 1
            return _own_sdpa(module, query, key, value, attention_mask, dropout=dropout,
                             scaling=scaling, is_causal=is_causal, **kwargs)
        route = True   # this layer's turn to go through the dispatcher
    if dropout:
        raise InputValueError(f"{_layer(module)}: attention dropout {dropout} (training); "
                              "adaptive attention is for inference: call model.eval()")
    for name in ("softcap", "position_bias", "s_aux"):
        if kwargs.get(name) is not None:
            raise InputValueError(f"{_layer(module)}: attention with {name} is not supported "
                                  "by adaptive; use attn_implementation='sdpa' or 'eager'")
    given = (query, key, value, attention_mask)
    caller_causal = is_causal
    lq, lk = query.shape[2], key.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if lq == 1 and not query.is_contiguous():   # a decode's q is small: SDPA's grouped
        query = query.contiguous()              # decode path views it per k/v head
    mask = attention_mask
    if mask is None:
        causal = bool(is_causal) and lq > 1
        if causal and lk > lq:
            # transformers leaves the mask out with Lk > Lq only for the prefill of an
            # empty static cache: the keys past Lq are unused slots (top-left causal)
            key, value = key[:, :, :lq], value[:, :, :lq]
        out = _attend((query, key, value), causal, scaling, None, route)
    else:
        if mask.dim() != 4:
            raise InputValueError(f"{_layer(module)}: attention mask of shape "
                                  f"{tuple(mask.shape)}; expected 4-D [B, 1, Lq, Lk]")
        if mask.shape[-1] != lk:
            mask = mask[..., :lk]
        if mask.dtype != query.dtype and mask.dtype.is_floating_point:
            mask = mask.to(query.dtype)
        out = _attend((query, key, value, mask), False, scaling,
                      (mask.shape[0], mask.shape[1], mask.dtype), route)
    if isinstance(out, _Own):
        if lq == 1:
            _remember(module, query, lk, scaling, caller_causal, out.plan,
                      None if attention_mask is None else _mask_layout(attention_mask))
            _own_served += 1
        return _own_sdpa(module, *given, dropout=dropout, scaling=scaling,
                         is_causal=is_causal, **kwargs)
    return out.transpose(1, 2).contiguous(), None


def _mask_layout(mask) -> tuple:
    """What of a decode step's attention mask its held class depends on: its batch and head
    extents and its dtype (the class key's mask layout, before any conversion)."""
    return (mask.shape[0], mask.shape[1], mask.dtype)


def _same_mask_layout(mask, layout: tuple, lk: int) -> bool:
    """Whether ``mask`` (None or a 4-D mask covering ``lk`` keys) has the remembered
    ``layout`` of a mask."""
    return mask is not None and mask.dim() == 4 and mask.shape[-1] >= lk \
        and mask.shape[0] == layout[0] and mask.shape[1] == layout[1] \
        and mask.dtype is layout[2]


def _remember(module, query, lk: int, scaling, is_causal, held, mask_layout=None) -> None:
    """Remember on ``module`` that its decode steps of this batch, dtype, device and
    parameters (and this mask layout, or none), with a cached length of ``lk``'s class, are
    ``held`` (see :data:`_MEMO`)."""
    lo = hi = lk
    if lk > 16:   # the lengths of lk's class: (2^((e-1)/4), 2^(e/4)], checked both ways
        b, e = bucket(lk), math.ceil(4 * math.log2(lk) - 1e-9)
        lo, hi = max(17, int(2 ** ((e - 1) / 4))), int(2 ** (e / 4)) + 1
        while bucket(lo) != b:
            lo += 1
        while lo > 17 and bucket(lo - 1) == b:
            lo -= 1
        while bucket(hi) != b:
            hi -= 1
        while bucket(hi + 1) == b:
            hi += 1
    object.__setattr__(module, _MEMO, (_generation, query.size(0), lo, hi, query.dtype,
                                       query.get_device(), scaling, is_causal, held,
                                       mask_layout))


def _attend(args: tuple, causal: bool, scale, mask_layout, route: bool = False):
    """``adaptive.launch("attention", *args, ...)``, or the held plan of its input class
    (one call in ``HOLD_EVERY << level`` still goes through the dispatcher:
    :mod:`adaptive.integrations.routing`), or an :class:`_Own` where that plan is SDPA as the
    plain model calls it (a ``torch_library`` variant): the caller then calls
    transformers' own SDPA attention function on the model's arguments. ``route``: the
    caller already counted this call's turn and it is the dispatcher's.

    A held plan (a torch entry: SDPA) takes q, k, v and the mask as the model made them:
    q, k and v of a prefill are views of the projections (``[B, L, H, D]`` transposed),
    and copying the three of them contiguous cost each layer a copy SDPA never needs (run
    S25: 66 more copy kernels in a prefill of 22 layers, +3.5 % of its device time). The
    dispatcher's key is of contiguous arrays: they are made so for it."""
    global _level
    q, k = args[0], args[1]
    hold = (q.shape, k.shape[1], bucket(k.shape[2]), q.dtype, q.device, causal, scale,
            mask_layout)
    held = _held.get(hold)
    if held is not None and not held.stale and not route \
            and next(_turn) % (HOLD_EVERY << _level):
        if held.candidate.variant.torch_library and _own_sdpa is not None:
            return _Own(held)
        return held.run(args, None)
    args = tuple(a if a.is_contiguous() else a.contiguous() for a in args)
    q, k = args[0], args[1]
    exact = (hold, k.shape, k.dtype, args[2].shape, args[2].dtype,
             args[3].shape if len(args) > 3 else None)
    plan = _exact.get(exact)
    if held is not None and held.stale or plan is not None and plan.stale:
        held, _level = None, 0     # a plan dropped (drift, forget): watched closely
    if plan is not None and not plan.stale and held is None:
        if not route and next(_turn) % (HOLD_EVERY << _level):
            return plan.run(args, None)
        held = plan
    out = launch("attention", *args, causal=causal, scale=scale)
    plan = default_dispatcher(args).plan("attention", *args, causal=causal, scale=scale)
    with _lock:
        if plan.provisional or plan.stale:
            _held.pop(hold, None)      # exploring: not held
            _exact.pop(exact, None)
        elif _any_key(plan):
            if hold not in _held and len(_held) >= MAX_HELD:
                del _held[next(iter(_held))]   # the oldest class goes
            _held[hold] = plan
        else:                          # bound to this key's shapes: held by them
            _held.pop(hold, None)
            if exact not in _exact and len(_exact) >= MAX_EXACT:
                del _exact[next(iter(_exact))]
            _exact[exact] = plan
        if held is not None:          # a held plan's routed call: back off or reset
            _level = backed_off(_level, held, _held.get(hold) or _exact.get(exact))
    return out


def _any_key(plan) -> bool:
    """Whether ``plan`` runs the same function for every key of its input class: a torch
    entry (bound to the op's parameters and its config, never to shapes) on tensors, with
    no requirement on the input that another key of the class could fail."""
    variant = plan.candidate.variant
    return bool(variant.torch_entry) and plan.problem.kind == "torch" and not variant.requires


def forget_held() -> None:
    """Let go of the attention plans held here (after replacing the default dispatcher;
    plans the dispatcher itself drops are let go on their next call)."""
    global _level, _turn, _generation
    with _lock:
        _held.clear()
        _exact.clear()
        _level, _turn = 0, itertools.count(1)
        _generation += 1            # every layer's memo of a held plan is let go too


NEVER = 1 << 40   # a routing period no call count reaches (frozen)
_frozen_lock = threading.RLock()   # one frozen() at a time (nested in one thread: fine)


@contextlib.contextmanager
def frozen(model):
    """While open, a patched ``model``'s calls take the plans they hold and nothing else:
    no warm call is routed through the dispatcher, the live dispatchers sample no call,
    and its decode-steps hooks are paused. What capturing a forward in a CUDA graph needs:
    its Python runs once and every kernel it launches is recorded, so a routed call's
    events and synchronisations would break the capture, and a choice made at capture is
    the one every replay runs. Event timings already finished are harvested on entry
    (synchronise the device first for all of them). A call with no held plan still goes
    to the dispatcher (a miss: run the forward's shapes eagerly first, until nothing
    explores). Routing and sampling are process-wide (the default dispatchers' and those
    on the shared registry): other threads' calls are not routed or sampled meanwhile
    either, and another thread's ``frozen`` waits for this one to close."""
    from adaptive.integrations import direct, linear, norm
    from adaptive.runtime import process_dispatchers
    global HOLD_EVERY
    with _frozen_lock:
        hooks = [hook for hook, _ in model.__dict__.get(_DECODE_STEPS, ()) if hook.active]
        routing = (linear.HOLD_EVERY, HOLD_EVERY, norm.HOLD_EVERY, direct.ROUTE_EVERY)
        sampling = [(d, d.sample_every) for d in process_dispatchers()]
        for hook in hooks:
            hook.pause()
        linear.HOLD_EVERY = HOLD_EVERY = norm.HOLD_EVERY = direct.ROUTE_EVERY = NEVER
        for d, _ in sampling:
            d.sample_every = 0
            d.harvest()   # finished event timings read now, not by a call in the capture
        try:
            yield model
        finally:
            for d, every in sampling:
                d.sample_every = every
            linear.HOLD_EVERY, HOLD_EVERY, norm.HOLD_EVERY, direct.ROUTE_EVERY = routing
            for hook in hooks:
                hook.resume()


def _layer(module) -> str:
    idx = getattr(module, "layer_idx", None)
    return type(module).__name__ + (f" (layer {idx})" if idx is not None else "")


# ---- patch ----------------------------------------------------------------------------------

LAYOUTS = ("transposed", "torch")


def patch(model, *, sparse=None, skip=None, layout: str = "torch", norms: bool = True):
    """Serve ``model``'s linears, attention and RMSNorms through adaptive, in place;
    inference only.

    Every ``nn.Linear`` becomes an :class:`~adaptive.integrations.linear.AdaptiveLinear`
    (dense: the weight kept transposed once, ``weight`` a view of it; tied to another
    module: used as it is; pruned: an :class:`adaptive.SparseWeight` built once), every
    transformers model inside is switched to ``attn_implementation="adaptive"``, every
    RMSNorm that computes as transformers' ``LlamaRMSNorm`` does (checked on a small
    input: :func:`adaptive.integrations.norm.is_rmsnorm`) becomes an
    :class:`~adaptive.integrations.norm.AdaptiveRMSNorm` (op ``rmsnorm``: its fused
    kernel or the eight ops the model ran), and the model is put in eval mode.

    Args:
        model: a ``torch.nn.Module`` (a transformers ``PreTrainedModel`` or any module).
        sparse: which weights run as sparse (spmm): None (none); a mapping from a module
            name part (``"mlp"``, ``"mlp.down_proj"``, ``"layers.3"``) to ``"auto"`` (at
            most :data:`AUTO_MAX_DENSITY` of the weight nonzero), a density bound in (0,
            1], or True/False; or a predicate ``(path, linear) -> bool``.
        skip: a predicate ``(path, linear) -> bool`` naming linears to leave as they are.
        layout: how dense weights are kept: ``"torch"`` (the default: ``[out, in]`` as
            given, no copy: ``yᵀ = gemm(W, xᵀ)``, and a warm call whose plan is torch's own
            matmul is then the plain layer's very call, the same cuBLAS kernel, so a
            patched model is never slower where the library wins) or ``"transposed"``
            (``[in, out]``, one copy at patch time: ``y = gemm(x, Wᵀ)``, what our gemm
            kernels read best).
        norms: whether RMSNorms are served too (False: left as they are).

    Returns:
        ``model``, patched.

    Raises:
        InputValueError: a module cannot be served (unknown attention layout, a Linear
            subclass, an unsupported dtype or device, a sparse rule that matches nothing);
            every such module is named and the model is left unchanged.
        InputTypeError: ``model``, ``sparse`` or ``skip`` of the wrong type.

    Example:
        >>> patch(model, sparse={"mlp": "auto"})
    """
    import torch
    register()
    if not isinstance(model, torch.nn.Module):
        raise InputTypeError(f"patch() takes a torch.nn.Module, got {type(model).__name__}")
    if skip is not None and not callable(skip):
        raise InputTypeError(f"skip must be a predicate (path, linear) -> bool, got "
                             f"{type(skip).__name__}")
    if layout not in LAYOUTS:
        raise InputValueError(f"patch(layout={layout!r}); expected one of {LAYOUTS}")
    if not isinstance(norms, bool):
        raise InputTypeError(f"norms must be True or False, got {type(norms).__name__}")
    linears, models = _plan(model, _sparse_rule(sparse), skip, layout == "torch")
    rms = _norms(model) if norms else []
    from adaptive.integrations.linear import AdaptiveLinear
    from adaptive.integrations.norm import AdaptiveRMSNorm
    previous = [(m, m.config._attn_implementation) for _, m in models]
    done = []
    try:
        for _, m in models:
            if m.config._attn_implementation != NAME:
                m._adaptive_attention_before = m.config._attn_implementation   # unpatch()
            _set_attention(m, NAME)
        for path, parent, attr, linear, mode in linears:
            setattr(parent, attr, AdaptiveLinear(linear, mode, path))
            done.append((parent, attr))
        for path, parent, attr, norm in rms:
            setattr(parent, attr, AdaptiveRMSNorm(norm, path))
            done.append((parent, attr))
    except BaseException:   # out of memory half-way: put back what was changed
        for parent, attr in done:
            child = getattr(parent, attr)
            setattr(parent, attr, child.to_norm() if isinstance(child, AdaptiveRMSNorm)
                    else child.to_linear())
        for m, impl in previous:
            _set_attention(m, impl)
        raise
    model.eval()
    _install_decode_steps(model)
    return model


_DECODE_STEPS = "_adaptive_decode_steps"   # on a patched model: [(hook, its handle)]


class _SdpaSteps:
    """The model's attention for :class:`~adaptive.integrations.direct.DecodeSteps`: where
    every attention layer holds, for a decode step's rows and cached length, the class
    adaptive serves with SDPA as the plain model calls it (the layers' memos, see
    :data:`_MEMO`), the model's own SDPA function serves the step, with no call of ours
    between (run S77's ablation: ours around the same call cost 0.6% of batch 1's
    tokens/s). The memos are written by calls through our function; the hook turns this
    on only after a step whose every call went to the model's own function that way."""

    def __init__(self, model, layers: list):
        self.config = model.config
        self.modules = layers          # the attention layers (their memos)
        self.layers = len(layers)
        self.span = (0, -1, -1)        # (generation, lo, hi) every layer held at on()

    @staticmethod
    def served() -> int:
        return _own_served

    def holds(self, rows: int, kwargs) -> bool:
        """Whether every layer's memo covers a decode step of ``rows`` rows with these
        forward ``kwargs``; notes the cached lengths they all cover (for :meth:`covers`)."""
        lk = _step_keys(kwargs)
        if lk is None or self.config._attn_implementation not in (NAME, "sdpa"):
            return False
        lo, hi = 0, 1 << 62
        for m in self.modules:
            memo = m.__dict__.get(_MEMO)
            if memo is None or memo[0] != _generation or memo[1] != rows \
                    or not memo[2] <= lk <= memo[3] or memo[8].stale:
                return False
            lo, hi = max(lo, memo[2]), min(hi, memo[3])
        self.span = (_generation, lo, hi)
        return True

    def covers(self, kwargs) -> bool:
        """While switched on: whether this step is still inside what :meth:`holds` found
        (the hook switches off at another batch size and at a dropped plan itself)."""
        lk = _step_keys(kwargs)
        generation, lo, hi = self.span
        return generation == _generation and lk is not None and lo <= lk <= hi

    def on(self) -> None:
        self.config._attn_implementation = "sdpa"

    def off(self) -> None:
        if self.config._attn_implementation == "sdpa":
            self.config._attn_implementation = NAME


def _step_keys(kwargs) -> int | None:
    """A decode step's key length (the cached tokens and its own), from its 2-D padding
    mask or its cache; None: not known here."""
    mask = kwargs.get("attention_mask")
    if mask is not None and getattr(mask, "dim", None) is not None and mask.dim() == 2:
        return int(mask.shape[-1])
    cache = kwargs.get("cache")   # transformers 5.x's name; past_key_values before
    if cache is None:
        cache = kwargs.get("past_key_values")
    if cache is None or not hasattr(cache, "get_seq_length"):
        return None
    return int(cache.get_seq_length()) + 1


def _install_decode_steps(model) -> None:
    """A :class:`~adaptive.integrations.direct.DecodeSteps` pre-hook on each outermost
    transformers model inside ``model``, over its patched linears and norms and, where it
    runs adaptive's attention, its attention layers (a module that is not a transformers
    model gets none: its layers keep their own warm path)."""
    from adaptive.integrations.direct import DecodeSteps
    from adaptive.integrations.linear import AdaptiveLinear
    from adaptive.integrations.norm import AdaptiveRMSNorm
    _remove_decode_steps(model)
    hooks = []
    for _, m in _transformers_models(model):
        layers = [x for x in m.modules() if isinstance(x, (AdaptiveLinear, AdaptiveRMSNorm))]
        attention = [x for x in m.modules() if hasattr(x, "is_causal") and x is not m]
        sdpa = (_SdpaSteps(m, attention)
                if attention and m.config._attn_implementation == NAME else None)
        if layers or sdpa is not None:
            hook = DecodeSteps(layers, sdpa)
            hooks.append((hook, m.register_forward_pre_hook(hook, with_kwargs=True)))
    if hooks:
        model.__dict__[_DECODE_STEPS] = hooks


def _remove_decode_steps(model) -> None:
    for hook, handle in model.__dict__.pop(_DECODE_STEPS, ()):
        handle.remove()
        hook.close()


def unpatch(model):
    """Undo :func:`patch`: plain ``nn.Linear`` layers over the same parameters (dense
    ones keep their transposed layout) and the attention implementation from before.
    Returns ``model``."""
    from adaptive.integrations.linear import AdaptiveLinear
    from adaptive.integrations.norm import AdaptiveRMSNorm
    _remove_decode_steps(model)
    for path, module in list(model.named_modules()):
        module.__dict__.pop(_MEMO, None)   # an attention layer's memo of its held plan
        for attr, child in list(module.named_children()):
            if isinstance(child, AdaptiveLinear):
                setattr(module, attr, child.to_linear())
            elif isinstance(child, AdaptiveRMSNorm):
                setattr(module, attr, child.to_norm())
    for _, m in _transformers_models(model):
        if m.config._attn_implementation == NAME:
            _set_attention(m, getattr(m, "_adaptive_attention_before", "sdpa"))
    return model


def _set_attention(model, impl: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter(impl)
    else:   # transformers before set_attn_implementation
        model.config._attn_implementation = impl


def _transformers_models(model) -> list:
    """The outermost transformers ``PreTrainedModel``s in ``model`` (with their paths)."""
    import sys
    tf = sys.modules.get("transformers")
    if tf is None:
        return []
    found = []
    for path, m in model.named_modules():
        if isinstance(m, tf.PreTrainedModel) and not any(
                path.startswith(p + ".") or p == "" for p, _ in found):
            found.append((path, m))
    return found


def _plan(model, sparse_rule, skip, as_given: bool = False):
    """Everything patch() will change, or an error naming every module it cannot serve."""
    import torch
    nn = torch.nn
    from adaptive.integrations.linear import AdaptiveLinear
    problems: list[str] = []
    models = _transformers_models(model)
    for path, m in models:
        why = _attention_problem(m)
        if why:
            problems.append(f"{path or '(the model)'}: {why}")
    owners = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    linears, matched = [], set()
    for path, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            problems.append(f"{path}: torch.nn.MultiheadAttention computes attention inside "
                            "its own forward (unknown attention layout); adaptive cannot "
                            "route it")
        for attr, child in module.named_children():
            cpath = f"{path}.{attr}" if path else attr
            if not isinstance(child, nn.Linear) or isinstance(child, AdaptiveLinear):
                continue
            if skip is not None and skip(cpath, child):
                continue
            if type(child) is not nn.Linear:
                problems.append(f"{cpath}: {type(child).__module__}.{type(child).__name__} is a "
                                "subclass of nn.Linear that may compute differently "
                                "(quantised, adapters); leave it out with skip=")
                continue
            w = child.weight
            dtype = str(w.dtype).removeprefix("torch.")
            device = w.device.type
            if device not in LINEAR_DTYPES:
                problems.append(f"{cpath}: weight on device {w.device}; expected cpu or cuda "
                                "(load the weights first if this is 'meta')")
                continue
            if dtype not in LINEAR_DTYPES[device]:
                problems.append(f"{cpath}: weight dtype {dtype} on {device}; expected one of "
                                f"{', '.join(LINEAR_DTYPES[device])}"
                                + (" (the host backend has no bfloat16)" if device == "cpu"
                                   and dtype == "bfloat16" else ""))
                continue
            shared = owners[id(w)] > 1
            as_sparse = False
            if sparse_rule is not None:
                as_sparse, hit = sparse_rule(cpath, child)
                matched |= hit
                if as_sparse and dtype not in SPARSE_DTYPES:
                    problems.append(f"{cpath}: sparse weight of dtype {dtype}; "
                                    f"adaptive.SparseWeight takes {', '.join(SPARSE_DTYPES)}")
                    continue
            mode = "sparse" if as_sparse else ("shared" if shared or as_given else "dense")
            linears.append((cpath, module, attr, child, mode))
    if isinstance(sparse_rule, _PatternRule):
        for pattern in sparse_rule.patterns:
            if pattern not in matched:
                problems.append(f"sparse={{{pattern!r}: ...}}: matches no nn.Linear (names "
                                f"look like {linears[0][0] if linears else 'none found'!r})")
    if problems:
        raise InputValueError(f"cannot patch {type(model).__name__}; nothing was changed. "
                              f"{len(problems)} problem(s):\n  " + "\n  ".join(problems))
    return linears, models


def _norms(model) -> list:
    """The RMSNorms patch() serves: ``(path, parent, attr, module)`` of each module that
    computes as ``rmsnorm_torch`` does, on a device and dtype the op's backends take."""
    from adaptive.integrations.norm import is_rmsnorm
    out = []
    for path, module in model.named_modules():
        for attr, child in module.named_children():
            w = getattr(child, "weight", None)
            dtype = str(getattr(w, "dtype", "")).removeprefix("torch.")
            device = getattr(getattr(w, "device", None), "type", "")
            if dtype in LINEAR_DTYPES.get(device, ()) and is_rmsnorm(child):
                out.append((f"{path}.{attr}" if path else attr, module, attr, child))
    return out


def _attention_problem(m) -> str | None:
    """Why transformers model ``m`` cannot take the adaptive attention (None: it can)."""
    cls = type(m)
    routed = getattr(cls, "_supports_attention_backend", False)
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if not routed or (can_set is not None and not can_set()):
        return (f"{cls.__name__} does not route its attention through transformers' "
                "AttentionInterface (unknown attention layout)")
    cap = getattr(m.config, "attn_logit_softcapping", None)
    if cap:
        return f"soft-capped attention logits (config.attn_logit_softcapping={cap})"
    return None


class _PatternRule:
    """sparse={pattern: rule}: a pattern matches a dotted part of the module path."""

    def __init__(self, rules: Mapping):
        self.patterns = list(rules)
        self._rules = []
        for pattern, rule in rules.items():
            if not isinstance(pattern, str) or not pattern:
                raise InputTypeError(f"sparse: keys are module name parts (str), got "
                                     f"{pattern!r}")
            if rule == "auto":
                bound = AUTO_MAX_DENSITY
            elif isinstance(rule, bool):
                bound = 1.0 if rule else None
            elif isinstance(rule, (int, float)) and 0 < rule <= 1:
                bound = float(rule)
            else:
                raise InputValueError(f"sparse[{pattern!r}] = {rule!r}; expected 'auto', a "
                                      "density bound in (0, 1], True or False")
            regex = re.compile(rf"(^|\.){re.escape(pattern)}(\.|$)")
            self._rules.append((pattern, regex, bound))

    def __call__(self, path: str, linear) -> tuple[bool, set]:
        hit = {p for p, regex, _ in self._rules if regex.search(path)}
        bounds = [b for p, _, b in self._rules if p in hit]
        if not bounds or any(b is None for b in bounds):   # False wins
            return False, hit
        bound = min(bounds)
        if bound >= 1.0:
            return True, hit
        w = linear.weight.detach()
        density = float((w != 0).sum()) / w.numel()
        return density <= bound, hit


def _sparse_rule(sparse) -> Callable | None:
    if sparse is None:
        return None
    if isinstance(sparse, Mapping):
        return _PatternRule(sparse)
    if callable(sparse):
        return lambda path, linear: (bool(sparse(path, linear)), set())
    raise InputTypeError(f"sparse must be None, a mapping {{name part: 'auto' | bound | bool}}"
                         f" or a predicate (path, linear) -> bool, got {type(sparse).__name__}")
