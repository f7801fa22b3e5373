"""An HTTP inference server for the transformer block in block.py (standard library only).

    python examples/server/server.py --port 8000 --dispatch adaptive --metrics-port 9100

POST /infer with a JSON object, either token ids or a length and a seed::

    {"tokens": [3, 17, 42]}                  # embedded with the model's table
    {"seq_len": 300, "seed": 7}              # 300 token ids drawn from the seed

and get back a small summary: {"seq_len", "padded_len", "output_norm", "next_token",
"next_token_prob", "time_ms", "dispatch"}. GET /healthz and GET /stats describe the
server. A bad request gets a 4xx JSON error ({"error": ..., "status": ...}); the server
stays up. ``--dispatch`` picks how the block runs: ``adaptive`` (the library chooses per
input), ``static`` (one pinned variant per op) or ``torch`` (plain PyTorch).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from block import DISPATCH_MODES, BlockShape, build, input_activations

MAX_BODY_BYTES = 1 << 20
FIELDS = {"tokens": "list of token ids", "seq_len": "int", "seed": "int"}
log = logging.getLogger("adaptive.example.server")


class WarmupError(RuntimeError):
    """Warm-up could not settle every padded length in its budget."""


def padded_lengths(shape: BlockShape) -> list[int]:
    """Every padded length a request can produce: multiples of pad_to up to max_seq's."""
    return list(range(shape.pad_to, shape.padded(shape.max_seq) + 1, shape.pad_to))


def warm_up(model, shape: BlockShape, limit_s: float = 300.0, max_per_length: int = 64,
            min_per_length: int = 2, progress=None) -> dict:
    """Serve every padded length until the model has nothing left to decide.

    A model with ``pending_decisions`` (adaptive dispatch) gets requests of each length
    until every key it meets is committed (the learned policy explores on real calls);
    others get ``min_per_length`` requests per length (compilation, library heuristics).
    Raises :class:`WarmupError` naming the unsettled keys when a length needs more than
    ``max_per_length`` requests or the whole warm-up more than ``limit_s`` seconds.
    """
    pending_of = getattr(model, "pending_decisions", None)
    lengths = padded_lengths(shape)
    t0, total = time.perf_counter(), 0
    for i, length in enumerate(lengths):
        x = input_activations(shape, model.host_weights, seq_len=length, seed=length)
        t_len, pending = time.perf_counter(), {}
        for n in range(1, max_per_length + 1):
            if pending_of is not None:
                pending = pending_of(x)
            else:
                model(x)
            total += 1
            if not pending and n >= min_per_length:
                break
            if time.perf_counter() - t0 > limit_s:
                raise WarmupError(f"warm-up passed its {limit_s:.0f} s limit at length {length} "
                                  f"({i}/{len(lengths)} lengths settled); still exploring: "
                                  f"{_describe(pending)}; raise the limit or load a pack")
        else:
            raise WarmupError(f"length {length}: {len(pending)} key(s) still exploring after "
                              f"{max_per_length} requests: {_describe(pending)}")
        if progress is not None:
            progress(f"warm-up {i + 1}/{len(lengths)}: P={length} settled after {n} requests "
                     f"in {time.perf_counter() - t_len:.2f} s")
    return {"warmup_s": time.perf_counter() - t0, "warmed_lengths": len(lengths),
            "lengths": len(lengths), "warmup_requests": total}


def _describe(pending: dict) -> str:
    return "; ".join(f"{k[0]} {k[1]}: {why}" for k, why in list(pending.items())[:4]) or "-"


class RequestError(Exception):
    """A client mistake: answered with ``status`` and a message saying what to send."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY,
                           f"field {name!r} must be an integer, got {type(value).__name__} "
                           f"{json.dumps(value)[:40]}")
    return value


def parse_request(body: bytes, shape: BlockShape) -> dict:
    """Validate one /infer body; returns {"tokens"} or {"seq_len", "seed"}."""
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST,
                           f"body is not valid JSON ({exc}); send e.g. {{\"seq_len\": 128}}"
                           ) from None
    if not isinstance(req, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, f"expected a JSON object, got "
                           f"{type(req).__name__}; send e.g. {{\"tokens\": [1, 2, 3]}}")
    unknown = sorted(set(req) - set(FIELDS))
    if unknown:
        raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY, f"unknown field(s) {unknown}; "
                           f"allowed: {', '.join(f'{k} ({v})' for k, v in FIELDS.items())}")
    if ("tokens" in req) == ("seq_len" in req):
        raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY,
                           "send exactly one of 'tokens' (list of token ids) or 'seq_len' "
                           "(with an optional 'seed')")
    if "tokens" in req:
        tokens = req["tokens"]
        if "seed" in req:
            raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY,
                               "'seed' goes with 'seq_len', not with 'tokens'")
        if not isinstance(tokens, list):
            raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY, f"field 'tokens' must be a "
                               f"list of integers, got {type(tokens).__name__}")
        _check_length(len(tokens), shape)
        tokens = [_int(t, "tokens[]") for t in tokens]
        bad = [t for t in tokens if not 0 <= t < shape.vocab]
        if bad:
            raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY, f"token id {bad[0]} is out of "
                               f"range; ids must be in [0, {shape.vocab})")
        return {"tokens": tokens}
    length = _check_length(_int(req["seq_len"], "seq_len"), shape)
    seed = _int(req.get("seed", 0), "seed")
    if not 0 <= seed < 2**63:
        raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY,
                           f"field 'seed' must be in [0, 2**63), got {seed}")
    return {"seq_len": length, "seed": seed}


def _check_length(length: int, shape: BlockShape) -> int:
    if length < 1:
        raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY,
                           f"sequence length must be at least 1, got {length}")
    if length > shape.max_seq:
        raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"sequence length {length} "
                           f"exceeds this server's max_seq {shape.max_seq}; split the input")
    return length


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"       # keep-alive: the load generator reuses connections
    timeout = 60                        # seconds; a client that stalls mid-request is dropped
    server: InferenceServer

    def setup(self):
        super().setup()
        # headers and body go out in two writes: without this, Nagle's algorithm and the
        # client's delayed ACK add ~40 ms to every keep-alive response
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _reply(self, status: int, payload: dict, headers: dict | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str, headers: dict | None = None) -> None:
        self.server.count("errors_4xx" if status < 500 else "errors_5xx")
        self._reply(status, {"error": message, "status": int(status)}, headers)

    def send_error(self, code, message=None, explain=None):
        # http.server's own rejections (bad request line, oversized headers) in JSON too
        self.close_connection = True
        self.request_version = "HTTP/1.0"   # always send a status line and headers
        self._error(HTTPStatus(code), message or HTTPStatus(code).phrase)

    def do_GET(self):
        if self.path == "/healthz":
            self._reply(200, {"status": "ok", "dispatch": self.server.dispatch})
        elif self.path == "/stats":
            self._reply(200, self.server.stats())
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no route GET {self.path}; try POST /infer, "
                        "GET /healthz or GET /stats")

    def do_POST(self):
        if self.path != "/infer":
            self._drain()
            return self._error(HTTPStatus.NOT_FOUND, f"no route POST {self.path}; "
                               "use POST /infer")
        try:
            body = self._body()
            req = parse_request(body, self.server.shape)
        except RequestError as exc:
            return self._error(exc.status, str(exc))
        try:
            summary = self.server.infer(req)
        except Exception as exc:  # noqa: BLE001 (a failed request never stops the server)
            log.exception("inference failed")
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR,
                               f"inference failed: {type(exc).__name__}: {exc}")
        self._reply(200, summary)

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length header")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes "
                               f"exceeds {MAX_BODY_BYTES} bytes")
        return self.rfile.read(int(length))

    def _drain(self) -> None:
        try:
            self._body()
        except RequestError:
            pass

    def do_PUT(self):
        self._drain()
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not supported; "
                    "use POST /infer", {"Allow": "GET, POST"})

    do_DELETE = do_PATCH = do_PUT

    def log_message(self, fmt, *args):
        log.debug("%s " + fmt, self.address_string(), *args)


class InferenceServer(ThreadingHTTPServer):
    """A threading HTTP server holding one model; counts requests for /stats."""

    daemon_threads = True

    def __init__(self, address, model, shape: BlockShape, dispatch: str):
        super().__init__(address, Handler)
        self.model, self.shape, self.dispatch = model, shape, dispatch
        self._counts = {"ok": 0, "errors_4xx": 0, "errors_5xx": 0}
        self._lock = threading.Lock()

    def count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def infer(self, req: dict) -> dict:
        x = input_activations(self.shape, self.model.host_weights, tokens=req.get("tokens"),
                              seq_len=req.get("seq_len"), seed=req.get("seed", 0))
        t0 = time.perf_counter()
        norm, token, prob = self.model(x)
        time_ms = (time.perf_counter() - t0) * 1e3
        self.count("ok")
        return {"seq_len": x.shape[0], "padded_len": self.shape.padded(x.shape[0]),
                "output_norm": norm, "next_token": token, "next_token_prob": prob,
                "time_ms": time_ms, "dispatch": self.dispatch}

    def stats(self) -> dict:
        with self._lock:
            out = {"dispatch": self.dispatch, "requests": dict(self._counts)}
        static = getattr(self.model, "static_choices", None)
        if static is not None and self.dispatch == "static":
            out["static_choices"] = static()
        return out


def start_metrics(port: int, host: str = "127.0.0.1"):
    """Serve adaptive's Prometheus metrics; None (with a message saying why) if unavailable."""
    import adaptive
    serve = getattr(adaptive, "serve_metrics", None)
    if serve is None:
        print("metrics: this adaptive build has no serve_metrics(); serving without metrics",
              file=sys.stderr, flush=True)
        return None
    try:
        metrics = serve(port, addr=host)
    except ImportError as exc:
        print(f"metrics: off ({exc}); serving without metrics", file=sys.stderr, flush=True)
        return None
    print(f"metrics at http://{host}:{metrics.port}/metrics", flush=True)
    return metrics


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--dispatch", choices=DISPATCH_MODES, default="adaptive")
    p.add_argument("--device", choices=("auto", "host", "cuda"), default="auto")
    p.add_argument("--dtype", choices=("float32", "float16"), default=None,
                   help="default float16 on cuda, float32 on the host")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (0: any free port)")
    p.add_argument("--policy", choices=("learned", "measure-each", "first"), default=None,
                   help="adaptive/static: a dispatcher of the block's own with this policy "
                   "(default: the process's, from ADAPTIVE_POLICY)")
    p.add_argument("--pack", action="append", default=[], metavar="PATH",
                   help="load this variant pack before serving (repeatable)")
    p.add_argument("--warmup", action="store_true",
                   help="before serving, run every padded length until its decisions settle")
    p.add_argument("--warmup-limit-s", type=float, default=300.0)
    p.add_argument("--static", action="append", default=[], metavar="OP=VARIANT",
                   help="static mode: pin this variant for an op (repeatable)")
    p.add_argument("--torch-sparse", action="store_true",
                   help="torch mode: pruned weights as torch.sparse CSR instead of dense")
    for field in ("d_model", "heads", "d_ff", "vocab", "layers", "max_seq", "pad_to"):
        p.add_argument("--" + field.replace("_", "-"), type=int,
                       default=BlockShape.__dataclass_fields__[field].default)
    p.add_argument("--density", type=float, default=BlockShape.density)
    p.add_argument("--verbose", action="store_true", help="log every request")


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import cupy
        return "cuda" if cupy.cuda.runtime.getDeviceCount() > 0 else "host"
    except Exception:  # noqa: BLE001 (no CuPy or no driver: the host backend)
        return "host"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    shape = BlockShape(d_model=args.d_model, heads=args.heads, d_ff=args.d_ff,
                       vocab=args.vocab, layers=args.layers, density=args.density,
                       max_seq=args.max_seq, pad_to=args.pad_to)
    device = resolve_device(args.device)
    dtype = args.dtype or ("float16" if device == "cuda" else "float32")
    static = dict(item.split("=", 1) for item in args.static if "=" in item)
    if len(static) != len(args.static):
        parser.error(f"--static takes OP=VARIANT, got {args.static}")
    if args.pack:
        import adaptive
        for path in args.pack:
            report = adaptive.load_pack(path)
            print(f"pack {path}: {report.rows} rows, weight {report.weight}", file=sys.stderr)
    model = build(shape, args.dispatch, device, dtype, torch_sparse=args.torch_sparse,
                  static=static, policy=args.policy)
    model(input_activations(shape, model.host_weights, seq_len=min(8, shape.max_seq)))  # fail fast
    if args.warmup:
        done = warm_up(model, shape, args.warmup_limit_s,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(f"warm-up: {done['lengths']} lengths in {done['warmup_s']:.1f} s", file=sys.stderr)
    if args.metrics_port is not None:
        start_metrics(args.metrics_port, args.host)
    server = InferenceServer((args.host, args.port), model, shape, args.dispatch)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    host, port = server.server_address[:2]
    print(f"serving {args.dispatch} on {device} ({dtype}) at http://{host}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
