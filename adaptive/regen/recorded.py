"""Recorded model answers, replayed: the LLM path of the regeneration loop, offline.

A code model cannot be run in tests (no downloads; a tiny model built from a config
writes no kernels), so the path is exercised with recorded answers:

- :class:`RecordedChatServer`: an OpenAI-compatible ``/v1/chat/completions`` endpoint on
  127.0.0.1 that replays a script of :class:`Event` s in order: R1-style answers with
  ``<think>`` blocks, malformed answers, slow replies, failing (HTTP 500) replies. After
  the script it repeats its last successful answer. Every request is kept in
  ``requests`` (path, headers, body).
- :class:`RecordedLM` and :class:`RecordedTokenizer`: stand-ins with the interface the
  local ``transformers`` generator uses (``generate``, ``apply_chat_template``,
  ``decode``), returning recorded text; :func:`recorded_local_generator` wires them into
  a :class:`~adaptive.regen.chat.TransformersGenerator` so its own code runs unchanged.

Example:
    >>> with RecordedChatServer([Event(content=answer)]) as server:
    ...     gen = OpenAIGenerator(base_url=server.url, model="recorded")
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Event:
    """One reply of the script: the message (content, reasoning_content), or an HTTP error
    status with a body, after ``delay_s`` seconds."""

    content: str = ""
    reasoning: str = ""
    status: int = 200
    delay_s: float = 0.0
    body: str = ""                  # the error body when status != 200


class RecordedChatServer:
    """An OpenAI-compatible chat endpoint on loopback replaying ``events`` in order."""

    def __init__(self, events: Sequence[Event], host: str = "127.0.0.1"):
        if not events:
            raise ValueError("RecordedChatServer needs at least one event to replay")
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"host {host!r}: the recorded endpoint only listens on loopback")
        self.events = list(events)
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._host = host
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the recorded endpoint is not started; call start() first")
        return f"http://{self._host}:{self._server.server_address[1]}/v1"

    def _next(self) -> Event:
        with self._lock:
            i = len(self.requests) - 1
            if i < len(self.events):
                return self.events[i]
            ok = [e for e in self.events if e.status == 200]
            return ok[-1] if ok else self.events[-1]

    def start(self) -> RecordedChatServer:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, status: int, payload: bytes, kind: str = "application/json"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": "recorded", "object": "model"}]}).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"unparsable": raw.decode(errors="replace")}
                with outer._lock:
                    outer.requests.append({"path": self.path, "body": body, "time_s":
                                           time.time(), "headers": dict(self.headers)})
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                event = outer._next()
                if event.delay_s:
                    time.sleep(event.delay_s)
                if event.status != 200:
                    text = event.body or json.dumps({"error": {
                        "message": f"recorded failure (HTTP {event.status})",
                        "type": "server_error"}})
                    self._send(event.status, text.encode())
                    return
                message = {"role": "assistant", "content": event.content}
                if event.reasoning:
                    message["reasoning_content"] = event.reasoning
                self._send(200, json.dumps({
                    "id": f"recorded-{len(outer.requests)}", "object": "chat.completion",
                    "model": body.get("model", "recorded"),
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                }).encode())

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer((self._host, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="recorded-chat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> RecordedChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- the local transformers model, stood in for -------------------------------------------------

class RecordedTokenizer:
    """The tokenizer interface :class:`TransformersGenerator` uses; ``decode`` of the
    generated ids returns the recorded answer they stand for."""

    chat_template = "recorded"
    pad_token_id = 0
    eos_token_id = 0

    def __init__(self, answers: Sequence[str]):
        self.answers = list(answers)
        self.prompts: list[str] = []

    def apply_chat_template(self, messages, add_generation_prompt=True, return_tensors="pt",
                            return_dict=False, **kw):
        import torch
        self.prompts.append(messages[-1]["content"])
        ids = torch.tensor([[1, 2, 3]])
        return {"input_ids": ids} if return_dict else ids

    def __call__(self, text, return_tensors="pt", **kw):
        import torch
        self.prompts.append(text)
        return {"input_ids": torch.tensor([[1, 2, 3]])}

    def decode(self, ids, skip_special_tokens=True) -> str:
        ids = [int(i) for i in ids]
        return "".join(self.answers[i - 1000] for i in ids if i >= 1000)


class RecordedLM:
    """The model interface :class:`TransformersGenerator` uses: ``generate`` appends one
    id standing for the next recorded answer (the last repeats)."""

    def __init__(self, n_answers: int):
        import torch
        self.device = torch.device("cpu")
        self.n_answers = n_answers
        self.calls: list[dict] = []

    def to(self, device):
        return self

    def eval(self):
        return self

    def generate(self, input_ids, **kw):
        import torch
        k = min(len(self.calls), self.n_answers - 1)
        self.calls.append({k2: v for k2, v in kw.items() if k2 != "attention_mask"})
        return torch.cat([input_ids, torch.tensor([[1000 + k]])], dim=1)


def recorded_local_generator(answers: Sequence[str], **kw):
    """A :class:`~adaptive.regen.chat.TransformersGenerator` whose model and tokenizer are
    the recorded stand-ins (nothing is loaded); its ``complete`` runs as with a real model."""
    from adaptive.regen.chat import TransformersGenerator
    return TransformersGenerator(model="recorded", lm=RecordedLM(len(answers)),
                                 tokenizer=RecordedTokenizer(answers), **kw)
