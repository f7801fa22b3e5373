"""The served language models: a Llama-architecture ``transformers`` model from a preset
config (random weights, nothing downloaded) in its serving modes, and a byte tokenizer.

    model = build_llama("tiny", "torch", device="cpu")          # plain PyTorch: SDPA, nn.Linear
    model = build_llama("1b", "adaptive", device="cuda")        # adaptive.integrations.transformers

Modes: ``torch`` (``attn_implementation="sdpa"`` and plain ``nn.Linear``), ``torch24``
(``torch`` with the MLP weights in torch's 2:4 semi-structured form, cuSPARSELt: the other
way a user serves a 2:4-pruned model in plain PyTorch; CUDA, float16/bfloat16, ``prune=
"2:4"``), ``adaptive`` (the same model after ``adaptive.integrations.transformers.patch
(model)``; pruned MLP weights as ``adaptive.SparseWeight``) and ``static`` (built as
``adaptive``; the serving engine pins every key after warm-up, see
:func:`engine.pin_dispatchers`). ``torch-nocudnn`` and ``torch24-nocudnn`` are ``torch`` and
``torch24`` with cuDNN's SDPA backend switched off, process-wide, as
``torch.backends.cuda.enable_cudnn_sdp(False)`` does: torch takes a masked attention to its
memory-efficient kernel instead. cuDNN builds a graph for every new key length, so a
server's masked decode steps meet a new one at each token (run S49: torch's steps of 49-52
ms, against 11.8 where the lengths had been met before; S51: 11.3-14.9 ms with it off).
The same preset, seed and pruning give the same weights in every mode, so their greedy
tokens can be compared.

Pruning (``prune``, the MLP's gate, up and down projections): ``"2:4"`` keeps the 2
largest magnitudes of every 4 consecutive inputs of a row; ``"bsr10"`` keeps a seeded 10%
of the 32x32 blocks of each weight (at least one). ``benchmarks/`` import :data:`PRESETS` and
:func:`build_llama` from here.

Tokenisation is deliberately trivial (no tokenizer is downloaded): a prompt string is its
UTF-8 bytes, token id = byte value (ids 0..255); a prompt may also be a list of token ids,
as OpenAI's API allows. Generated ids 0..255 decode back to bytes (invalid UTF-8 becomes
U+FFFD); ids >= 256, which a byte has no name for, decode as ``<|id|>``.
"""

from __future__ import annotations

import codecs
import dataclasses
import threading

MODES = ("torch", "torch-nocudnn", "torch24", "torch24-nocudnn", "adaptive", "static")
NO_CUDNN = "-nocudnn"   # a plain mode with cuDNN's SDPA backend off
PRUNINGS = ("none", "2:4", "bsr10")
BLOCK = 32            # bsr10's block size
BLOCK_DENSITY = 0.1   # bsr10's kept fraction of blocks


@dataclasses.dataclass(frozen=True)
class Preset:
    """A Llama config's sizes; ``params`` is the parameter count it gives (untied head)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int

    @property
    def params(self) -> int:
        h, kv = self.hidden_size, self.num_key_value_heads * self.hidden_size \
            // self.num_attention_heads
        layer = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size + 2 * h
        return self.num_hidden_layers * layer + 2 * self.vocab_size * h + h


PRESETS = {
    # CPU tests: a forward pass in about a millisecond
    "tiny": Preset(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                   max_position_embeddings=512),
    # about 1.1e9 parameters (2.2 GB in float16): Llama-3.2-1B-like, GQA 32/8 heads
    "1b": Preset(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                 num_key_value_heads=8, intermediate_size=8192, vocab_size=32000,
                 max_position_embeddings=4096),
}

_import_lock = threading.Lock()


def llama_config(preset: str | Preset):
    """A ``transformers.LlamaConfig`` for a preset name (or a :class:`Preset`)."""
    p = preset_of(preset)
    from transformers import LlamaConfig
    # no special tokens: with random weights an end-of-sequence token would only be noise,
    # so a completion always runs to max_tokens (finish_reason "length")
    return LlamaConfig(**dataclasses.asdict(p), bos_token_id=None, eos_token_id=None,
                       pad_token_id=None, tie_word_embeddings=False)


def preset_of(preset: str | Preset) -> Preset:
    if isinstance(preset, Preset):
        return preset
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[preset]


def build_llama(preset: str | Preset, mode: str, device: str = "cpu",
                dtype: str | None = None, seed: int = 0, sparse=None, prune: str = "none"):
    """A Llama causal LM with random weights (seeded) in eval mode, ready for one mode.

    Args:
        preset: a :data:`PRESETS` name or a :class:`Preset`.
        mode: one of :data:`MODES` (see the module docstring); a ``"-nocudnn"`` mode
            switches cuDNN's SDPA backend off for the whole process.
        device: "cpu" or "cuda" (or "cuda:N").
        dtype: "float16", "bfloat16", "float32" or "float64" (default float16 on CUDA,
            else float32; float64 for reference checks on the CPU).
        seed: the weights' seed: the same seed gives the same weights in every mode.
        sparse: adaptive/static only, passed to ``patch(model, sparse=...)`` (default with
            ``prune``: the MLP's weights).
        prune: "none", "2:4" or "bsr10" (see the module docstring).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if prune not in PRUNINGS:
        raise ValueError(f"unknown pruning {prune!r}; expected one of {PRUNINGS}")
    base = mode.removesuffix(NO_CUDNN)
    if base == "torch24" and (prune != "2:4" or not device.startswith("cuda")
                              or (dtype or "float16") not in ("float16", "bfloat16")):
        raise ValueError(f"mode {mode!r} (torch's 2:4 semi-structured matmul) needs "
                         f"prune='2:4' on a CUDA device in float16 or bfloat16; got prune="
                         f"{prune!r}, device {device!r}, dtype {dtype or 'float16'!r}")
    config = llama_config(preset)
    with _import_lock:                     # never import torch from two threads at once
        import torch
        from transformers import LlamaForCausalLM
    dtype = dtype or ("float16" if device.startswith("cuda") else "float32")
    if dtype not in ("float16", "bfloat16", "float32", "float64"):
        raise ValueError(f"dtype must be float16, bfloat16, float32 or float64, got {dtype!r}")
    torch.manual_seed(seed)
    with torch.device(device):             # weights drawn where they live: no host copy
        model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa",
                                              dtype=getattr(torch, dtype))
    model.eval().requires_grad_(False)
    if prune != "none":
        prune_mlp(model, prune, seed)
    if mode.endswith(NO_CUDNN):
        torch.backends.cuda.enable_cudnn_sdp(False)     # process-wide, as a user would
    if base == "torch24":
        from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured
        SparseSemiStructuredTensor._FORCE_CUTLASS = False   # cuSPARSELt (CUTLASS's fails
        for linear in _mlp_linears(model):                  # on the H200, issue 13)
            linear.weight = torch.nn.Parameter(to_sparse_semi_structured(linear.weight),
                                               requires_grad=False)
    if mode in ("adaptive", "static"):
        try:
            from adaptive.integrations import transformers as integration
        except ImportError as exc:
            raise ImportError(f"mode {mode!r} needs adaptive.integrations.transformers "
                              f"(pip install adaptive-dispatch[llm]): {exc}") from exc
        if sparse is None and prune != "none":
            sparse = {"mlp": True}
        model = integration.patch(model, sparse=sparse)
    return model


def _mlp_linears(model) -> list:
    import torch
    return [m for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and ".mlp." in f".{name}."]


def prune_mlp(model, how: str, seed: int = 0) -> int:
    """Prune the MLP's linear weights in place ("2:4" or "bsr10", see the module
    docstring; the same seed, the same blocks); returns how many weights were pruned."""
    import torch
    linears = _mlp_linears(model)
    gen = torch.Generator(device="cpu").manual_seed(seed + 24)
    for linear in linears:
        w = linear.weight.data
        out_f, in_f = w.shape
        if how == "2:4":
            if in_f % 4:
                raise ValueError(f"2:4 pruning needs in_features % 4 == 0, got {in_f}")
            groups = w.view(out_f, in_f // 4, 4)
            drop = groups.abs().argsort(dim=-1)[..., :2]        # the 2 smallest of each 4
            groups.scatter_(-1, drop, 0)
        elif how == "bsr10":
            if out_f % BLOCK or in_f % BLOCK:
                raise ValueError(f"bsr10 pruning needs both dims multiples of {BLOCK}, got "
                                 f"{tuple(w.shape)}")
            nb = (out_f // BLOCK, in_f // BLOCK)
            n = nb[0] * nb[1]                                   # exactly 10% of the blocks
            keep = torch.zeros(n, dtype=torch.bool)
            keep[torch.randperm(n, generator=gen)[:max(1, round(BLOCK_DENSITY * n))]] = True
            mask = keep.view(nb).repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
            w.mul_(mask.to(device=w.device, dtype=w.dtype))
        else:
            raise ValueError(f"unknown pruning {how!r}; expected one of {PRUNINGS[1:]}")
    return len(linears)


class ByteTokenizer:
    """Text <-> token ids: UTF-8 bytes are ids 0..255 (needs a vocabulary of >= 256)."""

    def __init__(self, vocab_size: int):
        if vocab_size < 256:
            raise ValueError(f"the byte tokenizer needs a vocabulary of at least 256 ids, "
                             f"got {vocab_size}; send prompts as token ids instead")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        stream = self.stream()
        return "".join(stream.push(i) for i in ids) + stream.flush()

    def stream(self) -> _DecodeStream:
        """An incremental decoder: ``push(id)`` returns the text complete so far."""
        return _DecodeStream()


class _DecodeStream:
    def __init__(self):
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        if token < 256:
            return self._utf8.decode(bytes((token,)))
        return self.flush() + f"<|{token}|>"

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
