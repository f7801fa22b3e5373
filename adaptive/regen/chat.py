"""Generators backed by a code model: the shared loop step, the local ``transformers``
model and an OpenAI-compatible chat endpoint (vLLM, SGLang, the DeepSeek API).

Each step sends one prompt (contract, reference, current best, measurements, previous
verdict) and takes the code from the reply. The proposal keeps the current best's
manifest entry (entry name, launch expressions, config) with the new source, so a
verified reply is a drop-in. Sampling defaults follow DeepSeek-R1's recommendation:
temperature 0.6, top-p 0.95, no system prompt.

The endpoint client (httpx) keeps the key where it belongs: a redirect is followed only
to the same origin (scheme, host and port), never to another host; 429, 5xx, timeouts
and dropped connections are retried with exponential backoff (bounded tries, honouring
``Retry-After`` up to a cap); every failure is a :class:`~adaptive.errors.GeneratorError`
saying what was sent where and what came back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.parse
from collections.abc import Sequence

from adaptive.errors import GeneratorError
from adaptive.regen.parametric import Generator, Parametric, derived_variant
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
    model = ""     # the model's name, recorded in each variant's provenance

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
                        "model": self.model})
        return [Proposal(variant, request.best.config, self.name, how, prompt)]


class TransformersGenerator(ChatGenerator):
    """A local causal LM through ``transformers`` (the ``llm`` extra), loaded on first use.

    Args:
        model: local path or hub id (default ``ADAPTIVE_LLM_MODEL``), e.g. a
            DeepSeek-R1 distilled model.
        device: torch device string; default CUDA when available, else CPU.
        seed: sampling seed (None: not fixed).
        lm, tokenizer: a model object and its tokenizer already loaded (then ``model`` is
            only the name recorded with each attempt).
    """

    name = "hf"

    def __init__(self, model: str | None = None, max_tokens: int = 4096,
                 device: str | None = None, seed: int | None = None, lm=None, tokenizer=None,
                 **kw):
        super().__init__(max_tokens=max_tokens, **kw)
        from adaptive import config
        self.model = model or config.get().llm_model
        if not self.model:
            raise ValueError("the hf generator needs a model: pass model= (a local path or hub "
                             "id) or set ADAPTIVE_LLM_MODEL")
        self.device, self.seed = device, seed
        if (lm is None) != (tokenizer is None):
            raise ValueError("pass lm= and tokenizer= together (or neither: then the model is "
                             "loaded on first use)")
        self._lm, self._tokenizer = lm, tokenizer

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
    """An OpenAI-compatible ``/chat/completions`` endpoint, through httpx.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (default ``ADAPTIVE_OPENAI_BASE_URL``).
        model: model name (default ``ADAPTIVE_OPENAI_MODEL``).
        api_key: bearer key (default ``ADAPTIVE_OPENAI_API_KEY``, else ``OPENAI_API_KEY``);
            sent to ``base_url``'s origin only.
        timeout_s: per request (connecting: at most 10 s of it).
        retries: further tries after a 429, a 5xx, a timeout or a dropped connection.
        backoff_s: wait before the first retry; doubled each time, capped at
            :data:`MAX_BACKOFF_S` (a ``Retry-After`` from the server is honoured up to it).
    """

    name = "openai"
    MAX_BACKOFF_S = 60.0
    MAX_REDIRECTS = 5

    def __init__(self, base_url: str | None = None, model: str | None = None,
                 api_key: str | None = None, timeout_s: float = 600.0, retries: int = 4,
                 backoff_s: float = 1.0, **kw):
        super().__init__(**kw)
        from adaptive import config
        c = config.get()
        self.base_url = (base_url or c.openai_base_url).rstrip("/")
        self.model = model or c.openai_model
        self.api_key = api_key or c.openai_api_key or os.environ.get("OPENAI_API_KEY", "")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, max(0, retries), backoff_s
        if not self.base_url or not self.model:
            raise ValueError("the openai generator needs base_url and model: pass them or set "
                             "ADAPTIVE_OPENAI_BASE_URL and ADAPTIVE_OPENAI_MODEL")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url {self.base_url!r}: expected http:// or https://")
        self._origin = _origin(self.base_url)

    def complete(self, prompt: str) -> Reply:
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_tokens}
        data = self._post_json(f"{self.base_url}/chat/completions", body)
        try:
            message = data["choices"][0]["message"]
            return Reply(message.get("content") or "", message.get("reasoning_content") or "")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise GeneratorError(f"unexpected reply from {self.base_url}: expected "
                                 f"choices[0].message, got {str(data)[:300]}") from None

    # ---- HTTP -------------------------------------------------------------------------------
    def _post_json(self, url: str, body: dict) -> dict:
        """POST with retries and backoff; the parsed JSON reply."""
        try:
            import httpx
        except ImportError as exc:
            raise ImportError("the openai generator needs httpx: pip install "
                              "'adaptive-dispatch[openai]'") from exc
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        timeout = httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s))
        payload = json.dumps(body).encode()
        with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
            for attempt in range(self.retries + 1):
                last = attempt == self.retries
                try:
                    resp = self._send(client, url, payload, headers)
                except httpx.TimeoutException as exc:
                    if last:
                        raise GeneratorError(f"{url}: no answer within {self.timeout_s} s "
                                             f"after {attempt + 1} tries ({type(exc).__name__})"
                                             "; raise timeout_s or check the server") from None
                    self._wait(attempt, None)
                    continue
                except httpx.TransportError as exc:
                    if last:
                        raise GeneratorError(f"{url}: cannot reach the endpoint after "
                                             f"{attempt + 1} tries ({type(exc).__name__}: "
                                             f"{exc}); check base_url and that the server "
                                             "runs") from None
                    self._wait(attempt, None)
                    continue
                if resp.status_code == 429 or resp.status_code >= 500:
                    if last:
                        raise GeneratorError(f"{url} answered HTTP {resp.status_code} "
                                             f"{resp.text[:300]!r} after {attempt + 1} tries; "
                                             "try later or lower the request rate")
                    self._wait(attempt, resp.headers.get("retry-after"))
                    continue
                if resp.status_code >= 400:
                    hint = " (check the API key)" if resp.status_code in (401, 403) else ""
                    raise GeneratorError(f"{url} answered HTTP {resp.status_code}{hint}: "
                                         f"{resp.text[:500]}")
                try:
                    return resp.json()
                except ValueError:
                    raise GeneratorError(f"{url} answered HTTP {resp.status_code} with "
                                         f"something that is not JSON: {resp.text[:300]!r}"
                                         ) from None
        raise AssertionError("unreachable")

    def _send(self, client, url: str, payload: bytes, headers: dict):
        """One POST, following redirects within ``base_url``'s origin only (the key never
        leaves it); a redirect elsewhere is an error, not followed."""
        for _ in range(self.MAX_REDIRECTS + 1):
            resp = client.post(url, content=payload, headers=headers)
            if not resp.is_redirect:
                return resp
            target = urllib.parse.urljoin(url, resp.headers.get("location", ""))
            if _origin(target) != self._origin:
                raise GeneratorError(
                    f"{url} redirected (HTTP {resp.status_code}) to {_origin(target)}, another "
                    f"origin than {self._origin}: not followed, so the API key stays with "
                    f"{self._origin}; set base_url to the endpoint itself")
            url = target
        raise GeneratorError(f"{self.base_url}: more than {self.MAX_REDIRECTS} redirects")

    def _wait(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff_s * 2 ** attempt
        if retry_after:
            try:
                delay = max(delay, float(retry_after))
            except ValueError:   # an HTTP date: keep the exponential delay
                pass
        time.sleep(min(delay, self.MAX_BACKOFF_S))


def _origin(url: str) -> str:
    """``scheme://host:port`` of a URL (default ports filled in), lowercased."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:      # a port that is not a number
        port = None
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


GENERATORS = {"parametric": Parametric, "hf": TransformersGenerator, "openai": OpenAIGenerator}


def make_generator(name: str, registry=None, **kwargs) -> Generator:
    """A generator by name: ``parametric``, ``hf`` or ``openai``."""
    if name not in GENERATORS:
        from adaptive.errors import UnknownNameError
        raise UnknownNameError("generator", name, GENERATORS)
    if name == "parametric":
        return Parametric(registry, **kwargs)
    return GENERATORS[name](**kwargs)
