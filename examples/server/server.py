"""An OpenAI-compatible completions server for a transformers causal LM, on Starlette and
uvicorn, in three modes: plain PyTorch, adaptive, and adaptive pinned after warm-up.

    python examples/server/server.py --preset 1b --mode adaptive --port 8000
    curl -s http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"model": "llama-1b", "prompt": "Hello", "max_tokens": 16}'

Endpoints: ``POST /v1/completions`` (OpenAI's request and response; ``"stream": true``
answers with server-sent events ending in ``data: [DONE]``), ``GET /v1/models``,
``GET /healthz``, ``GET /stats`` and ``GET /metrics`` (Prometheus text: adaptive's
metrics and the server's own). Every client mistake gets a 4xx with OpenAI's error body
``{"error": {"message", "type", "param", "code"}}``; the server stays up.

Limits: request bodies over ``--max-body-bytes`` (1 MiB) get 413; JSON nested deeper than
the request schema allows gets 400; request headers must arrive within
``--header-timeout-s`` and the body within ``--body-timeout-s`` (else the connection is
closed, or 408); idle keep-alive connections close after ``--keep-alive-s``; beyond
``--max-connections`` open connections a request gets 503; beyond ``--max-queued``
waiting requests, 503. The listen backlog is ``--backlog`` (4096).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from engine import (BlockLM, CausalLM, Engine, QueueFullError, Request, adaptive_attention,
                    pin_dispatchers, sweep_decode_attention, warm_up)
from models import MODES, PRESETS, PRUNINGS, ByteTokenizer, build_llama

log = logging.getLogger("adaptive.example.server")

MAX_BODY_BYTES = 1 << 20
MAX_HEADER_BYTES = 16 << 10
DRAIN_BYTES = 4 << 20         # read and dropped past the limit before answering 413
MAX_JSON_DEPTH = 4             # {"prompt": [[1, 2]]} is three deep
# OpenAI's completion fields: those this server implements, and those it refuses by name
FIELDS = {"model": "string", "prompt": "string, list of token ids, or a list of one of "
          "either", "max_tokens": "integer", "stream": "boolean", "temperature": "number (0)",
          "seed": "integer", "user": "string", "stream_options": "object",
          "n": "integer (1)"}
UNSUPPORTED = ("best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
               "presence_penalty", "stop", "suffix", "top_p")


class ApiError(Exception):
    """A request the server refuses: HTTP ``status`` and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.type, self.code = status, param, type_, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class Completion:
    """A validated /v1/completions request."""

    prompt: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool


def _depth(value, limit: int, level: int = 1) -> int:
    """Nesting depth of a parsed JSON value, stopping past ``limit``."""
    if level > limit:
        return level
    if isinstance(value, dict):
        return max([_depth(v, limit, level + 1) for v in value.values()], default=level)
    if isinstance(value, list):
        return max([_depth(v, limit, level + 1) for v in value[:1024]], default=level)
    return level


def _typename(value) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def _int(req: dict, name: str, low: int, high: int, default: int) -> int:
    value = req.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer, got {_typename(value)} "
                       f"{json.dumps(value)[:40]}", name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be in [{low}, {high}], got {value}", name)
    return value


def parse_completion(body: bytes, model_name: str, tokenizer: ByteTokenizer | None,
                     vocab_size: int, max_context: int, max_tokens_limit: int) -> Completion:
    """Validate one /v1/completions body; :class:`ApiError` (4xx) says what to send."""
    try:
        req = json.loads(body)
    except RecursionError:
        raise ApiError(400, f"JSON nested too deeply; requests are at most {MAX_JSON_DEPTH} "
                       "levels deep") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"body is not valid JSON ({exc}); send e.g. "
                       '{"model": "...", "prompt": "Hello", "max_tokens": 16}') from None
    if not isinstance(req, dict):
        raise ApiError(400, f"expected a JSON object, got {_typename(req)}")
    if _depth(req, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ApiError(400, f"JSON nested too deeply; requests are at most {MAX_JSON_DEPTH} "
                       "levels deep")
    for name in req:
        if name in UNSUPPORTED:
            raise ApiError(400, f"'{name}' is not supported by this server (greedy decoding, "
                           "one choice, no logprobs or stop sequences); leave it out", name)
        if name not in FIELDS:
            raise ApiError(400, f"unrecognized request argument supplied: {name!r}; "
                           f"allowed: {', '.join(sorted(FIELDS))}", name)
    if "model" not in req:
        raise ApiError(400, f"'model' is required; this server serves {model_name!r}", "model")
    if req["model"] != model_name:
        raise ApiError(404, f"the model {str(req['model'])[:80]!r} does not exist; this server "
                       f"serves {model_name!r}", "model", code="model_not_found")
    prompt = _prompt(req, tokenizer, vocab_size)
    max_tokens = _int(req, "max_tokens", 1, max_tokens_limit, min(16, max_tokens_limit))
    if len(prompt) + max_tokens > max_context:
        raise ApiError(400, f"this model's maximum context length is {max_context} tokens; "
                       f"the prompt has {len(prompt)} and max_tokens is {max_tokens}; shorten "
                       "the prompt or lower max_tokens", "max_tokens",
                       code="context_length_exceeded")
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"'stream' must be a boolean, got {_typename(stream)}", "stream")
    temperature = req.get("temperature", 0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ApiError(400, f"'temperature' must be a number, got {_typename(temperature)}",
                       "temperature")
    if temperature != 0:
        raise ApiError(400, f"this server decodes greedily: 'temperature' must be 0 (or left "
                       f"out), got {temperature}", "temperature")
    _int(req, "n", 1, 1, 1)
    if "seed" in req:
        _int(req, "seed", -(2**63), 2**63 - 1, 0)
    if not isinstance(req.get("user", ""), str):
        raise ApiError(400, f"'user' must be a string, got {_typename(req['user'])}", "user")
    options = req.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"} \
            or not isinstance(options.get("include_usage", False), bool):
        raise ApiError(400, "'stream_options' must be an object like {\"include_usage\": true}",
                       "stream_options")
    if options and not stream:
        raise ApiError(400, "'stream_options' goes with 'stream': true", "stream_options")
    return Completion(prompt, max_tokens, stream, options.get("include_usage", False))


def _prompt(req: dict, tokenizer: ByteTokenizer | None, vocab_size: int) -> list[int]:
    if "prompt" not in req:
        raise ApiError(400, "'prompt' is required: a string or a list of token ids", "prompt")
    prompt = req["prompt"]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(400, f"this server takes one prompt per request, got {len(prompt)}; "
                           "send them as separate requests", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ApiError(400, f"this model's vocabulary ({vocab_size}) has no byte "
                           "tokenizer; send the prompt as a list of token ids", "prompt")
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list):
        bad = next((t for t in prompt if isinstance(t, bool) or not isinstance(t, int)), None)
        if bad is not None:
            raise ApiError(400, f"'prompt' token ids must be integers, got {_typename(bad)} "
                           f"{json.dumps(bad)[:40]}", "prompt")
        out = next((t for t in prompt if not 0 <= t < vocab_size), None)
        if out is not None:
            raise ApiError(400, f"token id {out} is out of range; ids must be in "
                           f"[0, {vocab_size})", "prompt")
        ids = prompt
    else:
        raise ApiError(400, f"'prompt' must be a string or a list of token ids, got "
                       f"{_typename(prompt)}", "prompt")
    if not ids:
        raise ApiError(400, "'prompt' is empty; send at least one token", "prompt")
    return ids


# ---- the ASGI application ---------------------------------------------------------------
class ServerMetrics:
    """The server's own Prometheus metrics (requests, time to first token, tokens)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Histogram
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("example_server_requests", "completion requests by status",
                                ["status"], registry=self.registry)
        self.tokens = Counter("example_server_generated_tokens", "tokens generated",
                              registry=self.registry)
        self.ttft = Histogram("example_server_time_to_first_token_seconds",
                              "from request received to its first token",
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                              registry=self.registry)


class App:
    """The served model behind Starlette routes; ``app.asgi`` is the ASGI application."""

    def __init__(self, engine: Engine, model_name: str, mode: str, tokenizer,
                 max_tokens_limit: int, max_body_bytes: int = MAX_BODY_BYTES,
                 body_timeout_s: float = 30.0, adaptive_metrics=None, info: dict | None = None):
        from starlette.applications import Starlette
        from starlette.routing import Route
        self.engine, self.model_name, self.mode, self.tokenizer = engine, model_name, mode, \
            tokenizer
        self.max_tokens_limit, self.max_body_bytes = max_tokens_limit, max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.adaptive_metrics, self.info = adaptive_metrics, dict(info or {})
        self.counts = {"ok": 0, "4xx": 0, "5xx": 0, "cancelled": 0}
        self.started = int(time.time())
        try:
            self.metrics = ServerMetrics()
        except ImportError:
            self.metrics = None
        self.starlette = Starlette(routes=[
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/stats", self.stats, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
            Route("/debug/profile-prefill", self.profile_prefill, methods=["POST"]),
        ], exception_handlers={404: self._not_found, 405: self._not_allowed,
                               Exception: self._internal})

    async def asgi(self, scope, receive, send):
        """The ASGI application: headers over ``MAX_HEADER_BYTES`` in all get 431 (uvicorn
        bounds only headers still arriving), the rest goes to Starlette."""
        if scope["type"] == "http" and sum(len(k) + len(v) for k, v in scope["headers"]) \
                > MAX_HEADER_BYTES:
            response = self._error(ApiError(431, f"request headers exceed {MAX_HEADER_BYTES} "
                                            "bytes", code="headers_too_large"))
            response.headers["Connection"] = "close"
            return await response(scope, receive, send)
        await self.starlette(scope, receive, send)

    # ---- helpers ---------------------------------------------------------------------
    def _count(self, status: int) -> None:
        key = "ok" if status < 400 else "4xx" if status < 500 else "5xx"
        self.counts[key] += 1
        if self.metrics is not None:
            self.metrics.requests.labels(str(status)).inc()

    def _error(self, exc: ApiError):
        from starlette.responses import JSONResponse
        self._count(exc.status)
        headers = {"Connection": "close"} if exc.status in (408, 413) else None
        return JSONResponse(exc.body(), exc.status, headers=headers)

    async def _not_found(self, request, exc):
        return self._error(ApiError(404, f"no route {request.method} {request.url.path}; try "
                                    "POST /v1/completions, GET /v1/models, /healthz, /stats "
                                    "or /metrics", type_="not_found_error"))

    async def _not_allowed(self, request, exc):
        return self._error(ApiError(405, f"{request.method} is not allowed on "
                                    f"{request.url.path}"))

    async def _internal(self, request, exc):
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return self._error(ApiError(500, f"internal error: {type(exc).__name__}",
                                    type_="server_error"))

    async def _body(self, request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and not length.isdigit():
            raise ApiError(400, f"Content-Length must be a number of bytes, got {length[:40]!r}")
        too_large = ApiError(413, f"body{'' if length is None else f' of {length} bytes'} "
                             f"exceeds this server's limit of {self.max_body_bytes} bytes",
                             code="request_too_large")
        chunks, size = [], 0

        async def read():
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size <= self.max_body_bytes:
                    chunks.append(chunk)
                elif size > self.max_body_bytes + DRAIN_BYTES:
                    return

        if length is not None and int(length) > self.max_body_bytes + DRAIN_BYTES:
            raise too_large                  # not worth reading: answered at once, closed
        try:
            await asyncio.wait_for(read(), self.body_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within "
                           f"{self.body_timeout_s:g} s") from None
        if size > self.max_body_bytes:
            # read (and dropped) up to DRAIN_BYTES past the limit first: a client still
            # sending when the connection closes would lose the answer to a reset
            raise too_large
        return b"".join(chunks)

    # ---- routes ------------------------------------------------------------------------
    async def healthz(self, request):
        from starlette.responses import JSONResponse
        return JSONResponse({"status": "ok", "mode": self.mode, "model": self.model_name})

    async def profile_prefill(self, request):
        """POST {"batches": n}: profile the prefill of the next ``n`` batches (1..16) under
        torch.profiler; their top kernels appear in /stats ``prefill_profiles``. On a GPU
        the profiler enables CUPTI, which may slow the process's launches after it (the
        counter log's measurements, docs/benchmarks.md run S23): profile after measuring."""
        from starlette.responses import JSONResponse
        try:
            body = await self._body(request)
            try:
                n = json.loads(body or b"{}").get("batches", 1)
            except (ValueError, AttributeError):
                raise ApiError(400, 'expected a JSON object such as {"batches": 1}') from None
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 16:
                raise ApiError(400, f"batches must be an int in 1..16, got {n!r}",
                               param="batches")
            lm = self.engine.model
            if not isinstance(lm, CausalLM):
                raise ApiError(409, "prefill profiles need the llama model (--model llama)")
        except ApiError as exc:
            return self._error(exc)
        nxt = lm.batches_run
        lm.profile_prefill |= set(range(nxt, nxt + n))
        self._count(200)
        return JSONResponse({"profiling": list(range(nxt, nxt + n))})

    async def models(self, request):
        from starlette.responses import JSONResponse
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.started,
            "owned_by": "adaptive-example"}]})

    async def stats(self, request):
        from starlette.responses import JSONResponse
        return JSONResponse({"mode": self.mode, "model": self.model_name,
                             "requests": dict(self.counts), "queued": self.engine.queued,
                             "engine": dict(self.engine.stats),
                             "engine_batches": self.engine.batches(),
                             "adaptive_misses": recent_misses(),
                             "adaptive_policy": policy_activity(),
                             "prefill_profiles": (list(self.engine.model.prefill_profiles)
                                                  if isinstance(self.engine.model, CausalLM)
                                                  else []),
                             "decode_graphs": (self.engine.model.static_states()
                                               if isinstance(self.engine.model, CausalLM)
                                               else None),
                             **self.info})

    async def prometheus(self, request):
        from starlette.responses import JSONResponse, Response
        try:
            from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        except ImportError:
            return JSONResponse(ApiError(503, "metrics need prometheus-client: pip install "
                                         "adaptive-dispatch[metrics]", type_="server_error")
                                .body(), 503)
        text = b""
        if self.adaptive_metrics is not None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(self.adaptive_metrics)
            text += generate_latest(registry)
        if self.metrics is not None:
            text += generate_latest(self.metrics.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    async def completions(self, request):
        try:
            body = await self._body(request)
            req = parse_completion(body, self.model_name, self.tokenizer,
                                   self.engine.model.vocab_size, self.engine.model.max_context,
                                   self.max_tokens_limit)
        except ApiError as exc:
            return self._error(exc)
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        received = time.perf_counter()

        def on_token(token: int) -> bool:
            loop.call_soon_threadsafe(tokens.put_nowait, token)
            return not cancelled.is_set()

        def on_done(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(tokens.put_nowait, error or StopIteration())

        try:
            self.engine.submit(Request(req.prompt, req.max_tokens, on_token, on_done))
        except QueueFullError as exc:
            return self._error(ApiError(503, f"the server is overloaded: {exc}",
                                        type_="server_error", code="overloaded"))
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": self.model_name}
        if req.stream:
            from starlette.responses import StreamingResponse
            return StreamingResponse(self._events(req, head, tokens, cancelled, received),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self._whole(req, head, tokens, received)

    async def _next(self, tokens: asyncio.Queue):
        item = await tokens.get()
        if isinstance(item, StopIteration):
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def _first(self, received: float) -> None:
        if self.metrics is not None:
            self.metrics.ttft.observe(time.perf_counter() - received)

    async def _whole(self, req: Completion, head: dict, tokens, received: float):
        from starlette.responses import JSONResponse
        ids = []
        try:
            while (token := await self._next(tokens)) is not None:
                if not ids:
                    self._first(received)
                ids.append(token)
        except Exception as exc:  # noqa: BLE001 (a failed generation is this request's 500)
            return self._error(ApiError(500, f"generation failed: {type(exc).__name__}: {exc}",
                                        type_="server_error"))
        self._count(200)
        if self.metrics is not None:
            self.metrics.tokens.inc(len(ids))
        text = self.tokenizer.decode(ids) if self.tokenizer is not None else ""
        return JSONResponse({**head, "choices": [{
            "index": 0, "text": text, "token_ids": ids, "logprobs": None,
            "finish_reason": "length"}], "usage": _usage(req, len(ids))})

    async def _events(self, req: Completion, head: dict, tokens, cancelled, received: float):
        decoder = self.tokenizer.stream() if self.tokenizer is not None else None
        n = 0

        def event(payload) -> bytes:
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        def chunk(text: str, ids: list, finish: str | None) -> bytes:
            return event({**head, "choices": [{"index": 0, "text": text, "token_ids": ids,
                                               "logprobs": None, "finish_reason": finish}]})
        try:
            while (token := await self._next(tokens)) is not None:
                if n == 0:
                    self._first(received)
                n += 1
                text = decoder.push(token) if decoder is not None else ""
                if n == req.max_tokens:            # the last token carries the finish reason
                    yield chunk(text + (decoder.flush() if decoder else ""), [token], "length")
                else:
                    yield chunk(text, [token], None)
            if req.include_usage:
                yield event({**head, "choices": [], "usage": _usage(req, n)})
            yield b"data: [DONE]\n\n"
            self._count(200)
        except Exception as exc:  # noqa: BLE001 (headers are sent: the error is an event)
            self._count(500)
            yield event(ApiError(500, f"generation failed: {type(exc).__name__}: {exc}",
                                 type_="server_error").body())
        finally:
            if not cancelled.is_set() and n < req.max_tokens:
                cancelled.set()                   # the client left: stop generating for it
                self.counts["cancelled"] += 1
            if self.metrics is not None:
                self.metrics.tokens.inc(n)


def _usage(req: Completion, n: int) -> dict:
    return {"prompt_tokens": len(req.prompt), "completion_tokens": n,
            "total_tokens": len(req.prompt) + n}


# ---- uvicorn: the connection-level limits -----------------------------------------------
def guarded_protocol(header_timeout_s: float):
    """uvicorn's h11 protocol with a deadline for each request's headers: a connection
    that opens and sends nothing, or trickles a request slowly, is closed after
    ``header_timeout_s`` (uvicorn's own keep-alive timer only covers idle time between
    requests, and any byte received cancels it); and with Nagle's algorithm off.

    A streamed token is a small write: with Nagle's algorithm on, each one after the first
    waits for the client's ACK of the one before, and a client on a kept-alive connection
    delays its ACKs (40 ms on Linux), so tokens reached the clients in 40 ms bunches (a
    4-token completion the engine had finished in 6 ms arrived whole at 44 ms). asyncio
    turns the algorithm off only on sockets made with ``proto=IPPROTO_TCP``; the listening
    socket of :func:`listen` (and uvicorn's own) is made with ``proto`` 0."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _deadline = None

        def connection_made(self, transport):
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            super().connection_made(transport)
            self._arm()

        def _arm(self):
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout_s, self._expired)

        def _disarm(self):
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self):
            self._deadline = None
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and not self.transport.is_closing():
                self.transport.close()

        def handle_events(self):
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()                      # headers in: the app has the request

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None
                                                    or self.cycle.response_complete):
                self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket (``port`` 0: any free one) with the given backlog."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def uvicorn_server(app: App, args: argparse.Namespace):
    import uvicorn
    config = uvicorn.Config(
        app.asgi, http=guarded_protocol(args.header_timeout_s), loop="asyncio",
        lifespan="off", ws="none", interface="asgi3", access_log=args.verbose,
        log_level="info" if args.verbose else "warning",
        limit_concurrency=args.max_connections, backlog=args.backlog,
        timeout_keep_alive=args.keep_alive_s, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_graceful_shutdown=5)
    return uvicorn.Server(config)


# ---- building and running ---------------------------------------------------------------
def resolve_device(device: str) -> str:
    """"auto": "cuda" when torch sees a GPU, else "cpu"."""
    if device != "auto":
        return device
    try:
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def build_model(args: argparse.Namespace, progress=None) -> tuple:
    """(language model, tokenizer or None, name, info) for the parsed arguments."""
    if args.model == "block":
        from block import BlockShape, build
        shape = BlockShape(d_model=64, heads=2, d_ff=128, vocab=256, layers=2, max_seq=512,
                           pad_to=32)
        device = "host" if args.device in ("auto", "cpu") else "cuda"
        dtype = "float16" if device == "cuda" else "float32"
        model = build(shape, args.mode, device, dtype)
        lm = BlockLM(model, shape)
        return lm, ByteTokenizer(shape.vocab), "block", {"device": device}
    device = resolve_device(args.device)
    if args.decode_graphs == "auto":   # the faster way where it can serve (runs S88-S91)
        args.decode_graphs = "on" if device.startswith("cuda") else "off"
    if args.decode_graphs == "on" and not device.startswith("cuda"):
        raise SystemExit(f"--decode-graphs on captures CUDA graphs: it needs a CUDA device, "
                         f"got {device} (--decode-graphs eager runs the same steps uncaptured)")
    if args.torch_threads:
        import torch
        torch.set_num_threads(args.torch_threads)   # process-wide: CPU ops' thread pool
    t0 = time.perf_counter()
    model = build_llama(args.preset, args.mode, device, args.dtype, seed=args.seed,
                        prune=args.prune)
    lm = CausalLM(model, f"llama-{args.preset}", pad_to=args.pad_to,
                  buckets=args.shape_buckets == "pow2",
                  graphs={"off": False, "on": True, "eager": "eager"}[args.decode_graphs],
                  max_new_tokens=args.max_tokens_limit,
                  recheck_every=args.graphs_recheck_every)
    lm.profile_prefill = set(args.profile_prefill)
    info = {"device": device, "dtype": str(next(model.parameters()).dtype),
            "preset": args.preset, "prune": args.prune,
            "build_s": round(time.perf_counter() - t0, 2)}
    tokenizer = ByteTokenizer(lm.vocab_size) if lm.vocab_size >= 256 else None
    return lm, tokenizer, lm.name, info


def prepare(lm, args: argparse.Namespace, progress=None) -> dict:
    """Warm-up (and, in static mode, pinning) before the server listens."""
    info = {}
    if args.warmup:
        new = 8
        lengths = [n for n in args.warmup_lengths if n + new <= lm.max_context]
        sizes = {1, args.max_batch}
        if getattr(lm, "buckets", False):
            # every shape the load can meet: each power-of-two width up to the longest
            # length asked for, at each power-of-two batch up to --max-batch
            top = lm.width(max(lengths), new)
            lengths = [w for w in (lm.width(1 << k, new) for k in range(top.bit_length()))
                       if w <= top]
            sizes = {lm.rows(b) for b in range(1, args.max_batch + 1)}
        reach = min(args.warmup_new_tokens, args.max_tokens_limit)

        def steps(n: int) -> int:   # a KV-cache decode's classes (the block re-runs whole;
            if not isinstance(lm, CausalLM) or args.mode not in ("adaptive", "static") \
                    or lm.graphs:   # (static caches: one attention class a rows and length)
                return new          # plain torch has none: S25's torch warm-up took 96 s)
            width = lm.width(n, new)
            return decode_steps(width, max(new, min(reach, lm.max_context - width)), new)
        batches = [(b, n, steps(n)) for n in sorted(set(lengths)) for b in sorted(sizes)]
        import adaptive
        if isinstance(lm, CausalLM) and adaptive_attention(lm) and not lm.graphs:
            # decode classes past the warm-up's reach, decided now (run S29: explored at
            # 608-861 cached keys under load); then the warm-up, whose end settles them
            info["attention_sweep"] = sweep_decode_attention(
                lm, sizes, lm.width(min(lengths), new) + 1, progress=progress)
        with adaptive.unbounded_exploration():   # explore it all now, not under load
            info["warmup"] = warm_up(lm, batches, settle=args.mode in ("adaptive", "static"),
                                     limit_s=args.warmup_limit_s, progress=progress)
    if args.mode == "static" and args.model == "llama":
        info["pinned"] = pin_dispatchers()
    if isinstance(lm, CausalLM):
        lm.count_from_here()             # --profile-prefill counts the served batches
    return info


def decode_steps(width: int, reach: int, least: int = 8) -> int:
    """How many new tokens a warm-up batch of prompt ``width`` needs so its decode meets
    every input class a request of up to ``reach`` new tokens meets. A request of ``n`` new
    tokens decodes ``n - 1`` times, with ``width + 1`` to ``width + n - 1`` cached keys, and
    attention's class buckets that length by quarter octaves (``adaptive.ops.base.bucket``):
    the decode of a 256-wide prompt crosses into a new class at 305 keys, and a warm-up of
    8 tokens left that class to be decided under load (run S24: 5.6 ms, then SDPA's slow
    masked decode on the batch's last 15 steps while the class explored)."""
    from adaptive.ops.base import bucket
    if reach <= 1:
        return least
    last = bucket(width + reach - 1)
    first = next(lk for lk in range(width + 1, width + reach) if bucket(lk) == last)
    return max(least, min(reach, first - width + 1))


def start_metrics(args: argparse.Namespace):
    """adaptive's Prometheus collector (also on ``--metrics-port`` when given); None with
    a message saying why when prometheus-client is missing."""
    import adaptive
    try:
        port = args.metrics_port if args.metrics_port is not None else 0
        metrics = adaptive.serve_metrics(port, addr="127.0.0.1" if args.metrics_port is None
                                         else args.host)
    except ImportError as exc:
        print(f"metrics: off ({exc}); serving without metrics", file=sys.stderr, flush=True)
        return None
    if args.metrics_port is not None:
        print(f"metrics at http://{args.host}:{metrics.port}/metrics", flush=True)
    return metrics


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--mode", choices=MODES, default="adaptive",
                   help="torch: plain PyTorch; torch24: plain PyTorch with the MLP weights "
                   "in torch's 2:4 form (--prune 2:4, CUDA); torch-nocudnn, torch24-nocudnn: the "
                   "same with cuDNN's SDPA backend off (masked attention on torch's "
                   "memory-efficient kernel); adaptive: patched by adaptive; "
                   "static: adaptive pinned after warm-up")
    p.add_argument("--prune", choices=PRUNINGS, default="none",
                   help="prune the MLP weights: 2:4 (2 of every 4 inputs kept) or bsr10 (10%% "
                   "of the 32x32 blocks kept); adaptive serves them as sparse weights")
    p.add_argument("--model", choices=("llama", "block"), default="llama",
                   help="llama: a transformers LlamaForCausalLM (default); block: the "
                   "hand-built block of block.py")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32", "float64"),
                   default=None, help="default float16 on CUDA, float32 on the CPU (float64: "
                   "reference checks)")
    p.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="threads of torch's CPU ops (0: torch's default, one per core)")
    p.add_argument("--pad-to", type=int, default=16,
                   help="prompts left-padded to a multiple of this (bounded shapes)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together")
    p.add_argument("--shape-buckets", choices=("pow2", "none"), default="pow2",
                   help="pow2: prompts padded to a power-of-two width (at least --pad-to) "
                   "and batches to a power-of-two rows, so the warm-up meets every shape "
                   "the load will; none: widths a multiple of --pad-to, batches as queued")
    p.add_argument("--decode-graphs", choices=("auto", "off", "on", "eager"), default="auto",
                   help="llama model, every mode (auto: on with a CUDA device, else off): "
                   "decode steps over a static key/value "
                   "cache, one step captured in a CUDA graph per rows and cache length at "
                   "its first use (the warm-up's) and replayed (on: CUDA only; eager: the "
                   "same steps uncaptured, a CPU dry run); a plain mode with graphs is what "
                   "a PyTorch user gets from capturing decode steps themselves")
    p.add_argument("--graphs-recheck-every", type=int, default=0,
                   help="with decode graphs captured: one batch in this many of a state "
                   "decodes eagerly, routed and sampled, so the policy sees decode steps "
                   "under the current load; a plan it revises meanwhile has the state "
                   "captured again (0: never, the warm-up's choices stay)")
    p.add_argument("--max-queued", type=int, default=1024,
                   help="requests waiting beyond this get 503")
    p.add_argument("--batch-wait-ms", type=float, default=10.0,
                   help="how long a batch's first request waits for more before it starts")
    p.add_argument("--max-tokens-limit", type=int, default=512, help="largest max_tokens")
    p.add_argument("--warmup", action="store_true",
                   help="before listening, serve a few batches of each prompt length until "
                   "every adaptive key is decided (static mode always warms up)")
    p.add_argument("--warmup-limit-s", type=float, default=120.0)
    p.add_argument("--profile-prefill", type=lambda v: [int(n) for n in v.split(",") if n],
                   default=[], help="profile the prefill of these served batches (0: the "
                   "first after the warm-up; llama), top kernels in /stats and the log")
    p.add_argument("--warmup-new-tokens", type=int, default=64,
                   help="the warm-up's decode meets every input class of requests up to "
                   "this many new tokens (at most --max-tokens-limit)")
    p.add_argument("--warmup-lengths", type=lambda v: [int(n) for n in v.split(",")],
                   default=[16, 64, 256, 1024, 2048],
                   help="prompt lengths the warm-up serves, comma-separated")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="also serve Prometheus metrics on this port (0: any free port)")
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    p.add_argument("--max-connections", type=int, default=4096,
                   help="open connections beyond this get 503 (uvicorn limit_concurrency)")
    p.add_argument("--backlog", type=int, default=4096, help="listen backlog")
    p.add_argument("--header-timeout-s", type=float, default=10.0)
    p.add_argument("--body-timeout-s", type=float, default=30.0)
    p.add_argument("--keep-alive-s", type=float, default=5.0)
    p.add_argument("--verbose", action="store_true", help="log every request")


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.backlog < 2048:
        p.error(f"--backlog must be at least 2048, got {args.backlog}")
    if args.graphs_recheck_every < 0:
        p.error(f"--graphs-recheck-every must be >= 0 (0: never), got "
                f"{args.graphs_recheck_every}")
    for name in ("pad_to", "max_batch", "max_queued", "max_tokens_limit", "max_body_bytes",
                 "max_connections"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.model == "block" and (args.prune != "none" or args.mode.startswith("torch24")):
        p.error("--prune and --mode torch24 serve the llama model; the block model has no "
                "MLP weights to prune (use --model llama)")
    if args.batch_wait_ms < 0:
        p.error(f"--batch-wait-ms must be >= 0, got {args.batch_wait_ms}")
    for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s", "warmup_limit_s"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.decode_graphs not in ("off", "auto") and args.model != "llama":
        p.error(f"--decode-graphs {args.decode_graphs} serves the llama model (static "
                f"key/value caches are transformers'); got --model {args.model}")
    if args.mode == "static":
        args.warmup = True


def recent_misses(limit: int = 256) -> list[dict]:
    """The newest decision-cache misses of the process's adaptive dispatchers, at most
    ``limit`` of each kind ("decided", "class": a flood of cheap class misses does not
    push out the decisions), oldest first (none before adaptive is imported: the torch
    mode never imports it)."""
    runtime = sys.modules.get("adaptive.runtime")
    if runtime is None:
        return []
    misses = sorted((m for d in runtime.live_dispatchers() for m in d.recent_misses()),
                    key=lambda m: m["time_s"])
    kept = [m for how in ("decided", "class") for m in
            [m for m in misses if m["how"] == how][-limit:]]
    return sorted(kept, key=lambda m: m["time_s"])


def policy_activity() -> dict:
    """What the process's learned policies have done so far, summed over dispatchers:
    model refits and the seconds spent fitting (background CPU beside the requests),
    exploring calls and their seconds, classes deferred, drifts (each re-explores a class
    on served calls) and commits (empty before adaptive is imported); and the patched
    linears' races of ``F.linear`` against a kernel with its copies, once per candidate and
    class of token counts, on the serving thread (:data:`adaptive.integrations.linear.races`)."""
    runtime = sys.modules.get("adaptive.runtime")
    if runtime is None:
        return {}
    from adaptive.policy.cost_model import LiveModel
    from adaptive.policy.learned import Learned
    out = {"refits": 0, "refit_s": 0.0, "explore_calls": 0, "explore_s": 0.0, "deferred": 0,
           "drifts": 0, "commits": 0, "races": 0, "race_s": 0.0}
    linear = sys.modules.get("adaptive.integrations.linear")
    if linear is not None:
        out.update(linear.races)
    for d in runtime.live_dispatchers():
        policy = d.policy
        if not isinstance(policy, Learned):
            continue
        for k in ("explore_calls", "explore_s", "deferred", "drifts", "commits"):
            out[k] += policy.stats[k]
        if isinstance(policy.model, LiveModel):
            out["refits"] += policy.model.generation
            out["refit_s"] += policy.model.refit_s
    return out


def make_app(args: argparse.Namespace, progress=None) -> App:
    """Build the model, warm it up, and wrap it in an :class:`App` (not yet listening)."""
    lm, tokenizer, name, info = build_model(args, progress)
    if lm.max_context <= args.max_tokens_limit:
        args.max_tokens_limit = lm.max_context - 1
    engine = Engine(lm, max_batch=args.max_batch, max_queued=args.max_queued,
                    batch_wait_s=args.batch_wait_ms / 1e3)
    try:   # on the thread that serves: torch's cuDNN attention graphs are per thread
        info |= engine.call(prepare, lm, args, progress)
    except BaseException:
        engine.close()
        raise
    metrics = start_metrics(args)
    return App(engine, name, args.mode, tokenizer, args.max_tokens_limit, args.max_body_bytes,
               args.body_timeout_s, metrics, info)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    check_arguments(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    app = make_app(args, progress=lambda line: print(line, file=sys.stderr, flush=True))
    sock = listen(args.host, args.port, args.backlog)
    host, port = sock.getsockname()[:2]
    server = uvicorn_server(app, args)
    print(f"serving {app.model_name} ({args.mode}) on {app.info.get('device')} at "
          f"http://{host}:{port}", flush=True)
    try:
        server.run(sockets=[sock])          # SIGINT/SIGTERM: graceful shutdown
    finally:
        app.engine.close()
        if app.adaptive_metrics is not None:
            app.adaptive_metrics.close()
        sock.close()
    return 0


class ServerThread:
    """The server on a background thread of this process (tests, dry runs): built, warmed
    up and listening when the constructor returns; ``close()`` stops it."""

    def __init__(self, argv: list[str], start_timeout_s: float = 60.0):
        args = parse_args(["--port", "0", *argv])
        self.app = make_app(args)
        self.sock = listen(args.host, args.port, args.backlog)
        host, port = self.sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.server = uvicorn_server(self.app, args)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the server did not start within {start_timeout_s:g} s")
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.app.engine.close()
        if self.app.adaptive_metrics is not None:
            self.app.adaptive_metrics.close()
        self.sock.close()


if __name__ == "__main__":
    sys.exit(main())
