"""Decode steps with no per-layer Python where a patched layer holds the model's own call.

A patched layer's warm call reads a few attributes, looks its input shape up in a dict and
counts a turn before it makes the model's own call (``F.linear``, the norm's ops): on the
host that is 0.7–2 µs a layer, and a decode at batch 1 is host-bound (a 22-layer Llama
makes about 220 such calls a token: 2–4% of the token, the gap that issue 12's generate
benchmark measures). :class:`DecodeSteps` is a forward pre-hook on the patched model, one
Python call a forward. On a decode step (one token a row) it switches each layer that
holds, for this step's input shape, a plan that *is* the model's own call to make that
call directly (the layer's instance ``forward``), and switches them back when the input
changes (a prefill, another batch size), when the model trains, when the dispatcher
drops any plan (:data:`adaptive.dispatch.revision`: a drift, a new commit, ``forget``),
or when a layer derives its weights again (:func:`rebound`: ``.to()``, a load).

The model's attention is switched as a whole the same way: where every attention layer
holds, for the step's rows and cached length, the class adaptive serves with SDPA as the
plain model calls it, the model's own SDPA function serves the step (the model's
attention implementation set to it for the step), with no call of ours in between.

A direct call computes what the plain model computes, so a switch that comes late can only
delay adaptive's own choice, never change a result. Sampling, drift detection and the
counter log keep seeing every layer: each decode step sends one direct layer's call
through the dispatcher, in turn, so a layer is routed once in :data:`ROUTE_EVERY` steps,
the rate a steady held layer routes at by itself (:mod:`adaptive.integrations.routing`).
"""

from __future__ import annotations

import threading

from adaptive import dispatch
from adaptive.integrations.routing import HOLD_DOUBLINGS

ROUTE_EVERY = 64 << HOLD_DOUBLINGS   # decode steps between two routed calls of one layer
# with attention switched to the model's own function, one decode step in this many runs
# it through adaptive's (whose held calls route one in HOLD_EVERY << level themselves)
ATTENTION_ROUTE_EVERY = 16
# bumped when a layer derives its weights again (``.to()``, a state_dict load): every
# switch is made again, from the layer as it is now
epoch = 0


def rebound(layer) -> None:
    """``layer`` derived what its calls read again: its switch is undone, and every
    :class:`DecodeSteps` switches afresh at its next forward."""
    global epoch
    layer.__dict__.pop("forward", None)
    epoch += 1


class DecodeSteps:
    """The forward pre-hook (``with_kwargs=True``) of a patched model; ``layers``: its
    patched linears and norms, each with ``direct_call(rows)`` (the model's own call for a
    decode step of ``rows`` rows where it holds one, else None) and ``route_call(x)`` (one
    call through the dispatcher).

    ``attention`` (optional): the model's attention the same way, as a whole: an object with
    ``served()`` (a count of attention calls served by the model's own function so far),
    ``layers`` (the attention calls of a forward), ``holds(rows, kwargs)`` (whether every
    layer's held plan covers a decode step of ``rows`` rows with the forward's
    ``kwargs``), ``covers(kwargs)`` (while on: whether a later step of the same rows is
    still inside what ``holds`` found), ``on()`` (the model's own attention function for
    the steps to come) and ``off()`` (adaptive's again). Attention is switched on once a
    whole decode step went to the model's own function through adaptive's, and while the
    held plans cover the steps; one step in :data:`ATTENTION_ROUTE_EVERY` runs through
    adaptive's function again."""

    def __init__(self, layers, attention=None):
        self.layers = list(layers)
        self.attention = attention
        self.attention_on = False  # the model's own attention function serves the steps
        self.attention_active = True   # False: attention is never switched (an ablation)
        self.served_before = None  # attention.served() before the last decode step
        self.rows = None          # the decode batch the direct layers were switched for
        self.revision = None      # (dispatch.revision, epoch) at the switch
        self.direct: list = []    # (layer, its direct call), in module order
        self.steps = 0            # decode steps served with direct layers
        self.routed = None        # (layer, its direct call) routed in the last step
        self.active = True        # False: paused (every layer its own forward)
        self._lock = threading.Lock()

    def __call__(self, module, args, kwargs):
        if not self.active:
            return None
        rows = _decode_rows(module, args, kwargs)
        with self._lock:
            if rows is None:
                if self.direct or self.attention_on:
                    self._restore()
                self.served_before = None
            elif rows != self.rows or (dispatch.revision, epoch) != self.revision:
                self._switch(rows)
            elif self.direct:
                self._route_next()
            if rows is not None and self.attention is not None and self.attention_active:
                self._attention_step(rows, kwargs)
        return None

    def _attention_step(self, rows: int, kwargs) -> None:
        """Switch the model's attention for this decode step: on after a step whose every
        attention call went to the model's own function, while the held plans cover the
        step; off for one step in :data:`ATTENTION_ROUTE_EVERY` and when they do not."""
        a = self.attention
        if self.attention_on:
            self.steps += not self.direct   # (the layers' routing counts steps otherwise)
            if self.steps % ATTENTION_ROUTE_EVERY == 0 or not a.covers(kwargs):
                a.off()
                self.attention_on = False
                self.served_before = a.served()
            return
        before, self.served_before = self.served_before, a.served()
        if before is not None and self.served_before - before == a.layers \
                and a.holds(rows, kwargs):
            a.on()
            self.attention_on = True

    def _switch(self, rows: int) -> None:
        self._restore()
        self.rows, self.revision = rows, (dispatch.revision, epoch)
        for layer in self.layers:
            call = layer.direct_call(rows)
            if call is not None:
                layer.__dict__["forward"] = call
                self.direct.append((layer, call))

    def _restore(self) -> None:
        self._unswitch()
        self.direct, self.rows = [], None

    def _attention_off(self) -> None:
        if self.attention_on:
            self.attention.off()
            self.attention_on = False
        self.served_before = None

    def _unswitch(self) -> None:
        """Every switched layer back to its own forward (the switches still listed), and
        the model's attention back to adaptive's function."""
        for layer, _ in self.direct:
            layer.__dict__.pop("forward", None)
        self.routed = None
        self._attention_off()

    def _route_next(self) -> None:
        if self.routed is not None:      # last step's routed layer: direct again
            layer, call = self.routed
            layer.__dict__["forward"] = call
            self.routed = None
        self.steps += 1
        i = self.steps % ROUTE_EVERY
        if i < len(self.direct):
            layer, call = self.routed = self.direct[i]
            layer.__dict__["forward"] = layer.route_call

    def close(self) -> None:
        """Every layer back to its own forward."""
        with self._lock:
            self._restore()

    def attention_off(self) -> None:
        """The model's attention back to adaptive's function now (it switches on again
        after a whole decode step went to the model's own through it)."""
        with self._lock:
            self._attention_off()

    def pause(self) -> None:
        """Every layer back to its own forward until :meth:`resume` (the switches kept:
        e.g. a benchmark's ablation, step by step)."""
        with self._lock:
            self.active = False
            self._unswitch()

    def resume(self) -> None:
        """The switches kept by :meth:`pause` made again; the next forward checks them as
        any (a plan dropped meanwhile: switched afresh)."""
        with self._lock:
            for layer, call in self.direct:
                layer.__dict__["forward"] = call
            self.active = True


def direct_route(layer) -> str | None:
    """How a layer's call goes while a :class:`DecodeSteps` has switched it (for its
    ``route_of``): ``"direct: the model's own call (decode step)"``, ``"routed: through the
    dispatcher (decode step)"``, or None (not switched: its own forward)."""
    call = layer.__dict__.get("forward")
    if call is None:
        return None
    if getattr(call, "__func__", None) is type(layer).route_call:
        return "routed: through the dispatcher (decode step)"
    return "direct: the model's own call (decode step)"


def _decode_rows(module, args, kwargs) -> int | None:
    """The rows of a decode step (one new token a row) in inference, else None."""
    if module.training:
        return None
    ids = kwargs.get("input_ids")
    if ids is None and args:
        ids = args[0]
    if ids is None:
        embeds = kwargs.get("inputs_embeds")
        shape = None if embeds is None else embeds.shape[:2]
    else:
        shape = getattr(ids, "shape", None)
    if shape is None or len(shape) != 2 or shape[1] != 1:
        return None
    return int(shape[0])
