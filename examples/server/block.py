"""A transformer block served by the example server, with every op through ``adaptive.launch``.

The block is a pre-norm decoder layer plus an LM head::

    h = layernorm(x);  q, k, v = split(h @ w_qkv)          # gemm
    x = x + attention(q, k, v, causal) @ w_o                 # attention, gemm
    h = layernorm(x);  x = x + w_down · gelu(w_up · hᵀ)      # spmm on pruned weights
    probs = softmax(x @ w_head)                              # gemm, softmax

Sequences are padded at the end to a multiple of ``pad_to`` so a server meets a bounded
set of shapes; with causal attention the padding never reaches a real token, so the
valid rows are exact. Elementwise work (layernorm, gelu, residuals, transposes) runs in
the array module of the device: NumPy on the host backend, CuPy on CUDA.

``dispatch="adaptive"`` lets the library choose per input; ``"static"`` pins one variant
and config per op (what a library without adaptation would hard-code).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading

import numpy as np

import adaptive

log = logging.getLogger("adaptive.example.block")

# The fixed choice per op for --dispatch static: the variant (and preferred config values)
# a hand-written server would call. Of that variant's configs that fit the first input,
# the one matching most preferred values is kept for good; a variant not registered
# falls back, with a warning, to the op's first candidate.
STATIC_CHOICES = {
    "host": {"gemm": ("host_blas", {}), "attention": ("host_materialised", {}),
             "softmax": ("host_numpy", {}), "spmm": ("host_csr", {})},
    "cuda": {"gemm": ("cublas", {}), "attention": ("three_pass", {}),
             "softmax": ("block_row", {"THREADS": 256, "VEC": 8, "CACHE": 0}),
             "spmm": ("cusparse_csr", {})},
}
DISPATCH_MODES = ("adaptive", "static", "torch")


@dataclasses.dataclass(frozen=True)
class BlockShape:
    """Sizes of the served model. Defaults are small enough for the host backend."""

    d_model: int = 128
    heads: int = 4
    d_ff: int = 512
    vocab: int = 512
    layers: int = 1
    density: float = 0.25     # fraction of 32x32 blocks kept in the pruned MLP weights
    block: int = 32
    max_seq: int = 1024
    pad_to: int = 64

    def __post_init__(self):
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of heads={self.heads}")
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {self.density}")
        if self.pad_to < 1 or self.max_seq < 1:
            raise ValueError(f"pad_to and max_seq must be >= 1, got {self.pad_to}, {self.max_seq}")

    def padded(self, seq_len: int) -> int:
        return -(-seq_len // self.pad_to) * self.pad_to


@dataclasses.dataclass(frozen=True)
class Summary:
    """What a request gets back: small, so the response never dominates the time."""

    seq_len: int
    padded_len: int
    output_norm: float
    next_token: int
    next_token_prob: float
    time_ms: float


@functools.lru_cache(maxsize=2)   # one model served several ways shares its weights
def make_weights(shape: BlockShape, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 host weights (read-only); the MLP weights block-pruned to ``shape.density``."""
    rng = np.random.default_rng(seed)
    d, f = shape.d_model, shape.d_ff

    # drawn in float32 and scaled in place: an LLM-sized block has ~1.6e9 weights
    def dense(rows, cols):
        w = rng.standard_normal((rows, cols), dtype=np.float32)
        w *= np.float32(1.0 / math.sqrt(rows))
        return w

    def pruned(rows, cols):
        nb_r, nb_c = -(-rows // shape.block), -(-cols // shape.block)
        keep = rng.random((nb_r, nb_c)) < shape.density
        keep[rng.integers(nb_r), rng.integers(nb_c)] = True
        mask = np.kron(keep, np.ones((shape.block, shape.block), bool))[:rows, :cols]
        w = rng.standard_normal((rows, cols), dtype=np.float32)
        w *= np.float32(1.0 / math.sqrt(shape.density * cols))
        w *= mask
        return w

    weights = {"embed": rng.standard_normal((shape.vocab, d), dtype=np.float32),
               "w_head": dense(d, shape.vocab)}
    for i in range(shape.layers):
        weights |= {f"{i}.w_qkv": dense(d, 3 * d), f"{i}.w_o": dense(d, d),
                    f"{i}.w_up": pruned(f, d), f"{i}.w_down": pruned(d, f)}
    for w in weights.values():
        w.flags.writeable = False
    return weights


def input_activations(shape: BlockShape, weights: dict, tokens=None, seq_len=None,
                      seed: int = 0) -> np.ndarray:
    """[L, d_model] float32: the embedded token ids, or for ``seq_len`` the embedding of
    ``seq_len`` token ids drawn from ``seed``.

    A request is token ids, as a real server's is: drawing the activations themselves
    (``L * d_model`` normal samples, ~5 ms of host time holding the GIL at L = 256,
    d_model = 2048) would make every mode's throughput that of the random generator.
    """
    if tokens is None:
        tokens = np.random.default_rng(seed).integers(shape.vocab, size=seq_len)
    return weights["embed"][np.asarray(tokens, np.int64)]


class AdaptiveBlock:
    """The block with every op through ``adaptive.launch`` (dispatch adaptive or static).

    Args:
        shape: model sizes.
        dispatch: "adaptive" (the library chooses) or "static" (one fixed variant per op).
        device: "host" (NumPy) or "cuda" (CuPy).
        dtype: "float32" or "float16".
        static: op -> variant name for static dispatch, overriding :data:`STATIC_CHOICES`.
    """

    def __init__(self, shape: BlockShape, dispatch: str = "adaptive", device: str = "host",
                 dtype: str = "float32", seed: int = 0, static: dict | None = None,
                 policy: str | None = None, fused=None):
        if dispatch not in ("adaptive", "static"):
            raise ValueError(f"dispatch must be 'adaptive' or 'static', got {dispatch!r}")
        if device == "cuda":
            import cupy
            self.xp = cupy
        elif device == "host":
            self.xp = np
        else:
            raise ValueError(f"device must be 'host' or 'cuda', got {device!r}")
        self.shape, self.dispatch, self.device, self.dtype = shape, dispatch, device, dtype
        self.host_weights = make_weights(shape, seed)
        self.w = {}
        for name, value in self.host_weights.items():
            arr = self.xp.asarray(value.astype(dtype))
            leaf = name.rsplit(".", 1)[-1]
            self.w[name] = adaptive.SparseWeight(arr) if leaf in ("w_up", "w_down") else arr
        self.static_names = dict(static or {})     # op -> variant, overriding STATIC_CHOICES
        self._static: dict[str, tuple[str, dict]] = {}
        self._static_lock = threading.Lock()
        # policy=None: the process's default dispatcher (ADAPTIVE_POLICY); a name: a
        # dispatcher of this block's own with that policy (on the shared registry, so
        # loaded packs reach it)
        self.dispatcher = None
        if policy is not None:
            from adaptive.policy import make_policy
            self.dispatcher = adaptive.Dispatcher(
                "cuda" if device == "cuda" else "host", device=0 if device == "cuda" else None,
                policy=make_policy(policy))
        self._launch = adaptive.launch if self.dispatcher is None else self.dispatcher.launch
        # the elementwise glue: fused CUDA kernels on the GPU, NumPy expressions on the host
        # (a test may hand in a Fused over NumPy with emulated kernels)
        if fused is None and device == "cuda":
            from fused import Fused, cuda_functions
            fused = Fused(self.xp, cuda_functions(dtype, self.xp.cuda.Device().id), dtype)
        self.fused = fused
        self._tracking: dict | None = None

    # ---- one op ----------------------------------------------------------------------------
    def op(self, name: str, *args, **params):
        if self.dispatch == "adaptive":
            out = self._launch(name, *args, **params)
            if self._tracking is not None:
                self._track(name, args, params)
            return out
        variant, config = self._static_choice(name, args, params)
        return self._launch(name, *args, variant=variant, config=config, **params)

    def _track(self, name: str, args, params) -> None:
        d = self.dispatcher
        if d is None:
            from adaptive.runtime import default_dispatcher
            d = default_dispatcher(args)
        decision = d.decision(name, *args, **params)
        key = (name, tuple(getattr(a, "shape", None) for a in args), tuple(sorted(params.items())))
        self._tracking[key] = decision

    def pending_decisions(self, x_host: np.ndarray) -> dict[tuple, str]:
        """Run one request and return the keys it met that are not committed yet (the
        learned policy still exploring them), each with its decision's reason; {} when
        every key is settled. Static dispatch pins its plans: always {} after one run."""
        self._tracking = {}
        try:
            self(x_host)
            seen = self._tracking
        finally:
            self._tracking = None
        return {k: ("no decision" if dec is None else dec.reason) for k, dec in seen.items()
                if dec is None or not dec.settled}

    def _static_choice(self, name, args, params) -> tuple[str, dict]:
        choice = self._static.get(name)
        if choice is None:
            with self._static_lock:
                pool = (adaptive.candidates(name, *args, **params) if self.dispatcher is None
                        else self.dispatcher.candidates(name, *args, **params))
                wanted, prefer = STATIC_CHOICES[self.device][name]
                if name in self.static_names:
                    wanted, prefer = self.static_names[name], {}
                fits = [c for c in pool if c.variant.name == wanted] or pool[:1]
                if fits[0].variant.name != wanted:
                    log.warning("static dispatch: %s/%s is not registered on %s or does not "
                                "fit; pinning %s instead (choose with --static %s=NAME)", name,
                                wanted, self.device, fits[0].label, name)
                best = max(fits, key=lambda c: sum(c.config.get(k) == v
                                                   for k, v in prefer.items()))
                choice = self._static[name] = (best.variant.name, best.config)
        return choice

    def static_choices(self) -> dict[str, str]:
        """The pinned candidate per op, as labels (empty until the first request)."""
        return {op: v + (f"[{','.join(f'{k}={x}' for k, x in cfg.items())}]" if cfg else "")
                for op, (v, cfg) in self._static.items()}

    # ---- the forward pass ------------------------------------------------------------------
    def _layernorm(self, x):
        xp = self.xp
        x32 = x.astype(xp.float32)
        mu = x32.mean(axis=1, keepdims=True)
        var = x32.var(axis=1, keepdims=True)
        return ((x32 - mu) / xp.sqrt(var + 1e-5)).astype(x.dtype)

    def _gelu(self, x):
        xp = self.xp
        return 0.5 * x * (1.0 + xp.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    def _layer(self, x, i: int):
        xp, s = self.xp, self.shape
        p, d, heads = x.shape[0], s.d_model, s.heads
        qkv = self.op("gemm", self._layernorm(x), self.w[f"{i}.w_qkv"])
        qkv = qkv.reshape(p, 3, heads, d // heads).transpose(1, 2, 0, 3)   # [3, H, P, Dh]
        q, k, v = (xp.ascontiguousarray(qkv[j][None]) for j in range(3))
        a = self.op("attention", q, k, v, causal=True)                      # [1, H, P, Dh]
        a = xp.ascontiguousarray(a[0].transpose(1, 0, 2).reshape(p, d))
        x = x + self.op("gemm", a, self.w[f"{i}.w_o"])
        h_t = xp.ascontiguousarray(self._layernorm(x).T)                   # [d, P]
        u = self._gelu(self.op("spmm", self.w[f"{i}.w_up"], h_t))          # [F, P]
        y_t = self.op("spmm", self.w[f"{i}.w_down"], xp.ascontiguousarray(u))
        return xp.ascontiguousarray(x + y_t.T)

    def _forward_fused(self, x):
        """The same block with the glue in fused kernels (:mod:`fused`): five per layer."""
        f, s = self.fused, self.shape
        _, h, _ = f.layernorm(x)                                            # [P, d]
        for i in range(s.layers):
            buf = f.split_heads(self.op("gemm", h, self.w[f"{i}.w_qkv"]), s.heads)
            a = self.op("attention", buf[0:1], buf[1:2], buf[2:3], causal=True)
            o = self.op("gemm", f.merge_heads(a), self.w[f"{i}.w_o"])
            x, _, h_t = f.layernorm(x, o, want_sum=True, want_y=False, want_yt=True)
            u = f.gelu_(self.op("spmm", self.w[f"{i}.w_up"], h_t))          # [F, P]
            y_t = self.op("spmm", self.w[f"{i}.w_down"], u)                 # [d, P]
            last = i == s.layers - 1
            x, h, _ = f.layernorm(x, y_t, r_transposed=True, want_sum=True, want_y=not last)
        return x, self.op("softmax", self.op("gemm", x, self.w["w_head"]))

    def forward(self, x):
        """Padded activations [P, d] -> (final activations, next-token probabilities)."""
        if self.fused is not None:
            return self._forward_fused(x)
        for i in range(self.shape.layers):
            x = self._layer(x, i)
        probs = self.op("softmax", self.op("gemm", x, self.w["w_head"]))   # [P, vocab]
        return x, probs

    def __call__(self, x_host: np.ndarray) -> tuple[float, int, float]:
        """Run one request's activations [L, d]; (norm of valid rows, argmax, its prob)."""
        seq_len = x_host.shape[0]
        if self.fused is not None:     # float32 rows in, padded and cast on the device
            x32 = self.xp.asarray(np.ascontiguousarray(x_host, np.float32))
            x, probs = self.forward(self.fused.pad_cast(x32, self.shape.padded(seq_len)))
            return self.fused.summarise(x, probs, seq_len)               # one copy back
        padded = np.zeros((self.shape.padded(seq_len), self.shape.d_model), self.dtype)
        padded[:seq_len] = x_host
        x, probs = self.forward(self.xp.asarray(padded))
        last = probs[seq_len - 1].astype(self.xp.float32)
        token = int(last.argmax())
        norm = float(self.xp.linalg.norm(x[:seq_len].astype(self.xp.float32)))
        return norm, token, float(last[token])


def reference(shape: BlockShape, weights: dict, x: np.ndarray) -> tuple[float, np.ndarray]:
    """The block in float64 NumPy, unpadded: (norm of the output, next-token probabilities)."""
    x = np.asarray(x, np.float64)
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    length, d, heads = x.shape[0], shape.d_model, shape.heads
    mask = np.triu(np.ones((length, length), bool), 1)

    def ln(t):
        return (t - t.mean(1, keepdims=True)) / np.sqrt(t.var(1, keepdims=True) + 1e-5)

    for i in range(shape.layers):
        qkv = (ln(x) @ w[f"{i}.w_qkv"]).reshape(length, 3, heads, d // heads)
        q, k, v = qkv.transpose(1, 2, 0, 3)
        s = np.where(mask, -np.inf, q @ k.transpose(0, 2, 1) / math.sqrt(d // heads))
        p = np.exp(s - s.max(-1, keepdims=True))
        a = (p / p.sum(-1, keepdims=True)) @ v                      # [H, L, Dh]
        x = x + a.transpose(1, 0, 2).reshape(length, d) @ w[f"{i}.w_o"]
        u = w[f"{i}.w_up"] @ ln(x).T
        u = 0.5 * u * (1.0 + np.tanh(0.7978845608 * (u + 0.044715 * u**3)))
        x = x + (w[f"{i}.w_down"] @ u).T
    logits = x[-1] @ w["w_head"]
    e = np.exp(logits - logits.max())
    return float(np.linalg.norm(x)), e / e.sum()


def build(shape: BlockShape, dispatch: str, device: str, dtype: str, seed: int = 0,
          torch_sparse: bool = False, static: dict | None = None, policy: str | None = None):
    """The callable model for a dispatch mode: (activations [L, d]) -> (norm, token, prob)."""
    if dispatch == "torch":
        from torch_block import TorchBlock   # torch is imported only in this mode
        return TorchBlock(shape, device=device, dtype=dtype, seed=seed, sparse=torch_sparse)
    return AdaptiveBlock(shape, dispatch=dispatch, device=device, dtype=dtype, seed=seed,
                         static=static, policy=policy)
