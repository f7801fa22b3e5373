"""Greedy decode steps of a transformers causal LM over a static key/value cache, one step
captured in a CUDA graph and replayed: :class:`StaticDecode`.

A decode step of a 1B-parameter model issues about 10.7 ms of Python for about 3.3 ms of
GPU work at 8 rows on the H200 (run S85), so a server's decode is bound by its host.
Here every input of a step sits in a buffer of its own and the cache counts its own
positions on the device, so nothing in a step reads the host: the step can be captured
once and replayed, its kernels issued at once.

    >>> from adaptive.integrations.static import StaticDecode
    >>> out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
    ...             past_key_values=cache, use_cache=True, logits_to_keep=1)   # prefill
    >>> tokens = out.logits[:, -1].argmax(-1)
    >>> decode = StaticDecode(model, rows=ids.shape[0], length=1024)
    >>> decode.capture()                      # CUDA: once per rows and length, warm-up first
    >>> decode.load(cache, mask, positions, tokens)
    >>> nxt = decode.step()                   # the next tokens (a buffer), one per row
    >>> for host in decode.run(tokens, 63):   # or: host lists, each step issued before
    ...     ...                               # the one before it is read back

The capture runs a patched model's adaptive layers frozen
(:func:`adaptive.integrations.transformers.frozen`): each replay runs the kernels held
when it was captured, and no replayed step is timed for the policy. Imports torch and
transformers when a :class:`StaticDecode` is made.
"""

from __future__ import annotations

import time

WARM_STEPS = 64   # eager steps at most before a capture, until no key explores


class StaticDecode:
    """Greedy decode steps of ``rows`` rows of ``model`` over a static key/value cache
    ``length`` positions long (transformers' ``StaticCache``), every input of a step in a
    buffer of its own: the token ids, the position ids, the attention mask (``[rows, 1,
    1, length]``, True where a row attends) and the picked tokens. A step marks the
    cache's next position in the mask, advances the positions, runs the model (which
    writes the step's keys and values at the cache's own device-side count) and picks the
    next tokens into the ids.

    A batch's prefill runs as the caller runs it (a dynamic cache); :meth:`load` copies
    its keys and values in, with its mask, positions and first tokens. Keys past a row's
    prompt and generated tokens are masked out, whatever an earlier batch left there, so
    one state serves batch after batch of the same rows.

    Args:
        model: a transformers causal LM (patched by adaptive or not), in eval mode.
        rows: the batch's rows (a server's padded batch size).
        length: the cache's positions: at least a batch's prompt width plus its new
            tokens.
        cache_kw: the model's ``forward`` keyword for its cache: ``"past_key_values"``
            (transformers 5.x; later releases call it ``"cache"`` and keep the old name as
            a deprecated alias).
    """

    def __init__(self, model, rows: int, length: int, cache_kw: str = "past_key_values"):
        import torch
        from transformers import StaticCache
        if rows < 1 or length < 2:
            raise ValueError(f"StaticDecode needs rows >= 1 and length >= 2, got rows={rows}, "
                             f"length={length}")
        self.torch, self.model, self.rows, self.length = torch, model, rows, length
        self.cache_kw = cache_kw
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        first = next(model.parameters())
        dev = first.device
        self.ids = torch.zeros((rows, 1), dtype=torch.long, device=dev)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=dev)
        self.mask = torch.zeros((rows, 1, 1, length), dtype=torch.bool, device=dev)
        self.tokens = torch.zeros((rows,), dtype=torch.long, device=dev)
        self.graph = None
        self.capture_s = None
        self.width = None    # the loaded prefill's positions (None: nothing loaded)
        # the cache's tensors made now, its position count among them on the device (a
        # layer makes them at its first update otherwise, the count on the host until then)
        config = model.config.get_text_config(decoder=True)
        heads = config.num_attention_heads
        kv = torch.zeros((rows, getattr(config, "num_key_value_heads", None) or heads, 1,
                          getattr(config, "head_dim", None) or config.hidden_size // heads),
                         dtype=first.dtype, device=dev)
        for layer in self.cache.layers:
            layer.lazy_initialization(kv, kv)

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def load(self, prefill_cache, mask, positions, tokens) -> None:
        """A batch's prefill made the state the next step starts from: its dynamic cache
        (keys and values ``[rows, kv heads, width, head dim]`` a layer), its 2-D attention
        mask and position ids (``[rows, width]``) and the tokens its logits picked."""
        width = mask.shape[1]
        if mask.shape[0] != self.rows or width >= self.length:
            raise ValueError(f"a prefill of {mask.shape[0]} rows and {width} positions does "
                             f"not fit a static decode of {self.rows} rows and "
                             f"{self.length} positions (it needs room for a new token)")
        for static, layer in zip(self.cache.layers, prefill_cache.layers):
            static.keys[:, :, :width].copy_(layer.keys)
            static.values[:, :, :width].copy_(layer.values)
            static.cumulative_length.fill_(width)
        self.mask.zero_()
        self.mask[:, 0, 0, :width] = mask.bool()
        self.positions.copy_(positions[:, -1:])
        self.ids.copy_(tokens[:, None])
        self.width = width

    def step(self):
        """One decode step (replayed where captured); the tokens it picked, one per row (a
        buffer the next step overwrites)."""
        self._issue()
        return self.tokens

    def run(self, first, steps: int, eager: bool = False):
        """The tokens of a batch as host lists, one per row: ``first`` (the prefill's,
        already :meth:`load`-ed), then ``steps`` decode steps', each step issued before
        the one before it is read back. The host's work on a step's tokens (a server
        streams them to its clients) overlaps the next step on the device, where
        :meth:`step` then ``tolist()`` leaves the device idle meanwhile (run S91: 0.39-0.49
        SM activity with steps of 1.8-2.5 ms).

        Stopping early (the caller breaks out) leaves at most one step issued and unread:
        the state moves past it, and the next :meth:`load` sets it again. The cache needs
        room for ``steps`` new positions past the prefill, as with :meth:`step`.

        Args:
            first: the prefill's tokens, ``[rows]`` on the model's device.
            steps: how many decode steps follow it (a batch's most new tokens, minus 1).
            eager: run the steps uncaptured even where a graph is captured: a patched
                model's layers route and sample as they do outside a capture, so the
                policy sees decode steps again (:func:`revised_keys` tells whether it
                changed a plan meanwhile: the graph then runs stale kernels).
        """
        if self.width is None:
            raise RuntimeError("run() decodes a loaded prefill: call load() first")
        if not 0 <= steps <= self.length - self.width:
            raise ValueError(f"run() takes 0 to {self.length - self.width} steps after a "
                             f"prefill of {self.width} positions in a static cache of "
                             f"{self.length}, got {steps}")
        torch = self.torch
        cuda = self.ids.device.type == "cuda"
        host = torch.empty((self.rows,), dtype=torch.long, pin_memory=cuda)
        read = torch.cuda.Event() if cuda else None
        advance = self._step if eager else self._issue
        source = first
        for k in range(steps + 1):
            host.copy_(source, non_blocking=cuda)   # step k's tokens, queued before k + 1
            if cuda:
                read.record()
            if k < steps:
                advance()
            if cuda:
                read.synchronize()                  # step k done; step k + 1 may run on
            yield host.tolist()
            source = self.tokens

    def _issue(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def capture(self, stream=None, pool=None, warm_steps: int = WARM_STEPS) -> None:
        """Capture one step in a CUDA graph: eager steps first on ``stream`` (every
        shape's plan decided and held: at least three, then until no key of the process's
        dispatchers explores, at most ``warm_steps``; the stream's own workspaces made),
        then one step recorded with adaptive's layers frozen. An earlier capture is let go
        first (a failed capture leaves the state uncaptured, never on the old graph). The
        state the steps leave is garbage: :meth:`load` sets it before a batch's first
        step.

        Args:
            stream: the stream to capture on (a new one when None; never the default).
            pool: a graph memory pool to share (``torch.cuda.graph_pool_handle()``) with
                this process's other captured steps, which never run at once.

        Raises:
            RuntimeError: naming the state and the keys still exploring, where the
                capture failed (a call that is not a held plan's cannot be captured).
        """
        from adaptive.integrations.transformers import frozen
        torch = self.torch
        if self.ids.device.type != "cuda":
            raise ValueError(f"capture() records CUDA graphs: the model is on "
                             f"{self.ids.device}; call step() uncaptured there")
        stream = stream or torch.cuda.Stream(device=self.ids.device)
        self.graph = None
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.ids.zero_()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for i in range(warm_steps):
                    self._start_over()
                    self._step()
                    if i >= 2 and not exploring_keys():
                        break
            torch.cuda.current_stream().wait_stream(stream)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            try:
                with frozen(self.model):
                    self._start_over()
                    # thread-local: another thread's CUDA calls meanwhile (an event
                    # harvest, a sampler) are not this capture's
                    with torch.cuda.graph(graph, pool=pool, stream=stream,
                                          capture_error_mode="thread_local"):
                        self._step()
            except Exception as exc:
                raise RuntimeError(
                    f"capturing a decode step of {self.rows} rows over a static cache of "
                    f"{self.length} failed ({type(exc).__name__}: {exc}); a call that is "
                    f"not a held plan's cannot be captured ({exploring_keys()} key(s) "
                    "still exploring after the warm steps)") from exc
            self.graph = graph
        self.capture_s = round(time.perf_counter() - t0, 3)

    def _step(self) -> None:
        at = self.cache.layers[0].cumulative_length.view(1)   # the position written next
        self.mask.index_fill_(3, at, True)
        self.positions.add_(1)
        out = self.model(input_ids=self.ids, attention_mask=self.mask,
                         position_ids=self.positions, use_cache=True, logits_to_keep=1,
                         **{self.cache_kw: self.cache})
        self.tokens.copy_(out.logits[:, -1].argmax(-1))
        self.ids.copy_(self.tokens[:, None])

    def _start_over(self) -> None:
        """A first step's state (a warm-up's or a capture's): the cache empty."""
        for layer in self.cache.layers:
            layer.cumulative_length.zero_()
        self.mask.zero_()
        self.positions.zero_()


def plan_table() -> dict:
    """Each key of the process's dispatchers (the default ones and those on the shared
    registry) -> the candidate its plan runs: compared before and after eager decode steps
    by :func:`revised_keys`."""
    from adaptive.runtime import process_dispatchers
    return {(id(d), key): plan.candidate for d in process_dispatchers()
            for key, plan in d.plans().items()}


def revised_keys(before: dict, after: dict) -> int:
    """How many keys of ``before`` (a :func:`plan_table`) run another candidate in
    ``after``, or are no longer planned (a revision drops a key's plan until its next
    call)."""
    return sum(after.get(key) != cand for key, cand in before.items())


def exploring_keys() -> int:
    """How many keys the process's dispatchers (the default ones and those on the shared
    registry) still serve with an exploring plan."""
    from adaptive.runtime import process_dispatchers
    return sum(plan.provisional for d in process_dispatchers() for plan in d.plans().values())
