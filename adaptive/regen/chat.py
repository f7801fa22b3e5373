"""Generators backed by a code model: the shared loop step, the local ``transformers``
model and an OpenAI-compatible chat endpoint (vLLM, SGLang, the DeepSeek API).

Each step sends one prompt (contract, reference, current best, measurements, previous
verdict) and takes the code from the reply. The proposal keeps the current best's
manifest entry (entry name, launch expressions, config) with the new source, so a
verified reply is a drop-in. Sampling defaults follow DeepSeek-R1's recommendation:
temperature 0.6, top-p 0.95, no system prompt.
"""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence

from adaptive.regen.parametric import derived_variant
from adaptive.regen.prompt import build_prompt, extract_code
from adaptive.regen.request import Attempt, Proposal, Request

TEMPERATURE = 0.6
TOP_P = 0.95


@dataclasses.dataclass(frozen=True)
class Reply:
    content: str
    reasoning: str = ""


class ChatGenerator:
    """Base of model-backed generators; subclasses implement :meth:`complete`."""

    name = "chat"

    def __init__(self, max_tokens: int = 8192, temperature: float = TEMPERATURE,
                 top_p: float = TOP_P):
        self.max_tokens, self.temperature, self.top_p = max_tokens, temperature, top_p
        self.prompts: list[str] = []            # sent so far (tests and logs read them)

    def complete(self, prompt: str) -> Reply:
        raise NotImplementedError

    def propose(self, request: Request, history: Sequence[Attempt],
                limit: int) -> list[Proposal]:
        if request.best is None:
            return []          # nothing to take the contract's launch config from
        template = request.best.variant
        prompt = build_prompt(request, template, history)
        self.prompts.append(prompt)
        try:
            reply = self.complete(prompt)
        except Exception as exc:  # noqa: BLE001 (a failed call is a verdict, not a crash)
            reply = Reply(f"(generator error: {type(exc).__name__}: {exc})")
        code, how = extract_code(reply.content, template.entry, reply.reasoning)
        n = len(history) + 1
        variant = derived_variant(
            template, request.best.config, f"{self.name}{n}.", source=code,
            provenance={"generator": self.name, "extraction": how,
                        "template": template.provenance.get("template", template.id),
                        "model": getattr(self, "model", "")})
        return [Proposal(variant, request.best.config, self.name, how, prompt)]


class TransformersGenerator(ChatGenerator):
    """A local causal LM through ``transformers`` (the ``llm`` extra), loaded on first use.

    Args:
        model: local path or hub id (default ``ADAPTIVE_LLM_MODEL``), e.g. a
            DeepSeek-R1 distilled model.
        device: torch device string; default CUDA when available, else CPU.
        seed: sampling seed (None: not fixed).
    """

    name = "hf"

    def __init__(self, model: str | None = None, max_tokens: int = 4096,
                 device: str | None = None, seed: int | None = None, **kw):
        super().__init__(max_tokens=max_tokens, **kw)
        from adaptive import config
        self.model = model or config.get().llm_model
        if not self.model:
            raise ValueError("the hf generator needs a model: pass model= (a local path or hub "
                             "id) or set ADAPTIVE_LLM_MODEL")
        self.device, self.seed = device, seed
        self._lm = self._tokenizer = None

    def _load(self):
        try:
            import torch
            import transformers
        except ImportError as exc:
            raise ImportError("the hf generator needs transformers and torch: pip install "
                              "'adaptive-dispatch[llm]'") from exc
        if self._lm is None:
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(self.model)
            lm = transformers.AutoModelForCausalLM.from_pretrained(self.model,
                                                                   torch_dtype="auto")
            device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
            self._lm = lm.to(device).eval()
        return self._lm, self._tokenizer

    def complete(self, prompt: str) -> Reply:
        import torch
        lm, tok = self._load()
        messages = [{"role": "user", "content": prompt}]
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True,
                                          return_tensors="pt", return_dict=True)["input_ids"]
        else:
            ids = tok(prompt, return_tensors="pt")["input_ids"]
        ids = ids.to(lm.device)
        if self.seed is not None:
            torch.manual_seed(self.seed)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        with torch.no_grad():
            out = lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                              temperature=self.temperature, top_p=self.top_p,
                              max_new_tokens=self.max_tokens, pad_token_id=pad)
        return Reply(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


class OpenAIGenerator(ChatGenerator):
    """An OpenAI-compatible ``/chat/completions`` endpoint, through urllib only.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (default ``ADAPTIVE_OPENAI_BASE_URL``).
        model: model name (default ``ADAPTIVE_OPENAI_MODEL``).
        api_key: bearer key (default ``ADAPTIVE_OPENAI_API_KEY``, else ``OPENAI_API_KEY``).
        timeout_s: per request.
    """

    name = "openai"

    def __init__(self, base_url: str | None = None, model: str | None = None,
                 api_key: str | None = None, timeout_s: float = 600.0, **kw):
        super().__init__(**kw)
        from adaptive import config
        c = config.get()
        self.base_url = (base_url or c.openai_base_url).rstrip("/")
        self.model = model or c.openai_model
        self.api_key = api_key or c.openai_api_key or os.environ.get("OPENAI_API_KEY", "")
        self.timeout_s = timeout_s
        if not self.base_url or not self.model:
            raise ValueError("the openai generator needs base_url and model: pass them or set "
                             "ADAPTIVE_OPENAI_BASE_URL and ADAPTIVE_OPENAI_MODEL")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url {self.base_url!r}: expected http:// or https://")

    def complete(self, prompt: str) -> Reply:
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_tokens}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(f"{self.base_url}/chat/completions",
                                     data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                data = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")[:500]
            raise RuntimeError(f"{self.base_url} answered HTTP {exc.code}: {text}") from None
        try:
            message = data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"unexpected reply from {self.base_url}: expected "
                               f"choices[0].message, got {str(data)[:300]}") from None
        return Reply(message.get("content") or "", message.get("reasoning_content") or "")
