"""A load generator for the completions server: N streaming clients, long-tailed prompts.

    python examples/server/loadgen.py --url http://127.0.0.1:8000 --concurrency 8 \\
        --requests 500 --duration-s 30 --max-tokens 64 --json report.json

Each request is ``POST /v1/completions`` with ``"stream": true`` and the prompt as token
ids (0..255, valid for every model the server has); prompt lengths are lognormal (median
``--prompt-median``, shape ``--prompt-sigma``) clipped to [1, ``--prompt-max``]: mostly
short prompts and a few long documents. ``--rate 0`` (default) is a closed loop: each of
``--concurrency`` clients sends its next request when the last one finished. With a rate,
requests arrive in bursts (sizes geometric with mean ``--burst-mean``) whose starts form a
Poisson process, and latency counts from a request's scheduled arrival.

Reports throughput (completed requests/s and generated tokens/s), time to first token,
the time between consecutive tokens of a stream (per-token p50/p99) and whole-request
latency. Standard library only (it also runs where the server's packages are not
installed). It only talks to loopback addresses, and stops after ``--requests`` or
``--duration-s``, whichever comes first.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import ipaddress
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import numpy as np

MAX_REQUESTS = 100_000
MAX_DURATION_S = 600.0
TOKEN_IDS = 256           # prompt ids drawn below this: bytes, valid for every model served


@dataclasses.dataclass(frozen=True)
class Request:
    at_s: float        # scheduled arrival, seconds after the start
    prompt_len: int
    seed: int
    max_tokens: int

    def prompt(self) -> list[int]:
        return np.random.default_rng(self.seed).integers(TOKEN_IDS, size=self.prompt_len
                                                         ).tolist()


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What a run measured; times in ms, throughput per second of the run."""

    sent: int
    ok: int
    errors: dict
    duration_s: float
    throughput_rps: float
    tokens_per_s: float
    tokens: int
    ttft_ms: dict              # time to first token
    token_ms: dict             # between consecutive tokens of one stream
    latency_ms: dict           # whole request
    prompt_len: dict
    # the raw values behind the percentiles ({"ttft_ms": [...], ...}): what :func:`pool`
    # reads; left out of to_dict
    samples: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(dataclasses.replace(self, samples={}))   # (keyed by requests)
        del d["samples"]
        return d

    def line(self) -> str:
        def p(d, k):
            return d.get(k, float("nan"))
        return (f"{self.ok}/{self.sent} ok in {self.duration_s:.2f} s: "
                f"{self.throughput_rps:.2f} req/s, {self.tokens_per_s:.1f} tokens/s, "
                f"TTFT p50 {p(self.ttft_ms, 'p50'):.2f} ms p99 {p(self.ttft_ms, 'p99'):.2f} ms, "
                f"per token p50 {p(self.token_ms, 'p50'):.2f} ms p99 "
                f"{p(self.token_ms, 'p99'):.2f} ms, errors {self.errors or 'none'}")


def make_stream(n: int, seed: int = 0, rate: float = 0.0, prompt_median: float = 128.0,
                prompt_sigma: float = 1.0, prompt_max: int = 2048, prompt_min: int = 1,
                max_tokens: int = 64, burst_mean: float = 4.0,
                min_tokens: int | None = None) -> list[Request]:
    """A reproducible request stream: the same arguments give the same requests.
    ``min_tokens``: new tokens drawn uniformly from ``min_tokens..max_tokens`` per request
    (None: ``max_tokens`` each)."""
    if not 1 <= n <= MAX_REQUESTS:
        raise ValueError(f"n must be in [1, {MAX_REQUESTS}], got {n}")
    low = max_tokens if min_tokens is None else min_tokens
    if not 1 <= prompt_min <= prompt_max or not 1 <= low <= max_tokens:
        raise ValueError(f"expected 1 <= prompt_min <= prompt_max and 1 <= min_tokens <= "
                         f"max_tokens, got {prompt_min}, {prompt_max}, {low}, {max_tokens}")
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(prompt_median), prompt_sigma, n)),
                      prompt_min, prompt_max)
    news = np.random.default_rng(seed + 1).integers(low, max_tokens + 1, n)
    times, t = [], 0.0
    while len(times) < n:
        size = int(rng.geometric(1.0 / max(burst_mean, 1.0)))
        times += [t] * size
        if rate > 0:
            t += float(rng.exponential(size / rate))
    return [Request(times[i], int(lengths[i]), int(rng.integers(2**31)), int(news[i]))
            for i in range(n)]


def check_loopback(url: str) -> tuple[str, int]:
    """(host, port) of an http:// URL whose every address is loopback; ValueError otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected an http:// URL such as http://127.0.0.1:8000, got {url!r}")
    port = parts.port or 80
    if parts.hostname == "localhost":
        return parts.hostname, port
    try:
        addr = ipaddress.ip_address(parts.hostname)
    except ValueError:
        addr = None     # a DNS name: never resolved, so no lookup leaves the machine
    if addr is None or not addr.is_loopback:
        raise ValueError(f"refusing to send load to {parts.hostname}: only loopback targets "
                         "(127.0.0.0/8, [::1], localhost) are allowed")
    return parts.hostname, port


def percentiles(values) -> dict:
    if len(values) == 0:
        return {}
    a = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "max": float(a.max()),
            "n": int(a.size)}


def served_model(url: str, timeout_s: float = 10.0) -> str:
    """The id of the model the server serves (GET /v1/models)."""
    host, port = check_loopback(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        return json.loads(resp.read())["data"][0]["id"]
    finally:
        conn.close()


def stream_completion(conn: http.client.HTTPConnection, model: str, req: Request
                      ) -> tuple[int | str, list[float], dict | None, list[int]]:
    """One streamed completion: (status, arrival time of each token, the error if any,
    the token ids as they came)."""
    body = json.dumps({"model": model, "prompt": req.prompt(), "max_tokens": req.max_tokens,
                       "stream": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        payload = resp.read()
        try:
            return resp.status, [], json.loads(payload).get("error"), []
        except ValueError:
            return resp.status, [], {"message": payload[:200].decode(errors="replace")}, []
    stamps, error, ids = [], None, []
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            error = event["error"]
            continue
        now = time.perf_counter()
        for choice in event.get("choices", ()):
            got = choice.get("token_ids") or [None]
            stamps += [now] * len(got)
            ids += got
    resp.read()
    return (200 if error is None else "stream_error"), stamps, error, ids


def run_load(url: str, stream: list[Request], concurrency: int = 8, duration_s: float = 60.0,
             timeout_s: float = 120.0, model: str | None = None) -> LoadReport:
    """Send ``stream`` to ``url``'s /v1/completions; stop when ``duration_s`` has passed."""
    host, port = check_loopback(url)
    if not 0 < duration_s <= MAX_DURATION_S:
        raise ValueError(f"duration_s must be in (0, {MAX_DURATION_S}], got {duration_s}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    model = model or served_model(url)
    open_loop = any(req.at_s > 0 for req in stream)
    local = threading.local()
    lock = threading.Lock()
    ttft, gaps, latency, lengths, errors = [], [], [], [], {}
    outputs: dict = {}          # request -> its token ids (greedy: comparable by mode)
    conns: list = []            # every connection opened, closed when the load ends
    tokens = 0
    start = time.perf_counter()
    deadline = start + duration_s

    def send(req: Request) -> None:
        nonlocal tokens
        began = time.perf_counter()
        if began > deadline:
            return
        t0 = start + req.at_s if open_loop else began
        conn = getattr(local, "conn", None)
        try:
            if conn is None:
                conn = local.conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
                with lock:
                    conns.append(conn)
            status, stamps, _, ids = stream_completion(conn, model, req)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if conn is not None:
                conn.close()
            local.conn = None
            status, stamps, ids = type(exc).__name__, [], []
        done = time.perf_counter()
        with lock:
            if status == 200 and len(stamps) == req.max_tokens:
                ttft.append((stamps[0] - t0) * 1e3)
                gaps.extend(np.diff(stamps) * 1e3)
                latency.append((done - t0) * 1e3)
                lengths.append(req.prompt_len)
                outputs[req] = ids
                tokens += len(stamps)
            else:
                key = str(status) if status != 200 else "short_stream"
                errors[key] = errors.get(key, 0) + 1

    with ThreadPoolExecutor(concurrency) as pool:
        if open_loop:
            for req in stream:
                wait = start + req.at_s - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                if time.perf_counter() > deadline:
                    break
                pool.submit(send, req)
        else:
            queue = iter(stream)
            queue_lock = threading.Lock()

            def client() -> None:
                while time.perf_counter() < deadline:
                    with queue_lock:
                        req = next(queue, None)
                    if req is None:
                        return
                    send(req)

            for f in [pool.submit(client) for _ in range(concurrency)]:
                f.result()
    elapsed = time.perf_counter() - start
    for conn in conns:
        conn.close()
    return _report(len(latency) + sum(errors.values()), errors, elapsed, tokens,
                   {"ttft_ms": ttft, "token_ms": [float(g) for g in gaps],
                    "latency_ms": latency, "prompt_len": lengths, "outputs": outputs})


def _report(sent: int, errors: dict, elapsed: float, tokens: int, samples: dict) -> LoadReport:
    ok = len(samples["latency_ms"])
    return LoadReport(sent=sent, ok=ok, errors=errors, duration_s=elapsed,
                      throughput_rps=ok / elapsed if elapsed > 0 else 0.0,
                      tokens_per_s=tokens / elapsed if elapsed > 0 else 0.0, tokens=tokens,
                      ttft_ms=percentiles(samples["ttft_ms"]),
                      token_ms=percentiles(samples["token_ms"]),
                      latency_ms=percentiles(samples["latency_ms"]),
                      prompt_len=percentiles(samples["prompt_len"]), samples=samples)


def pool(reports: list[LoadReport]) -> LoadReport:
    """Several runs' reports as one: their requests, errors, tokens and seconds added (so
    tokens/s is all tokens over all seconds) and the percentiles over every run's values
    (windows of one load served in turns with other modes' windows)."""
    if not reports:
        raise ValueError("pool() needs at least one report")
    errors: dict = {}
    for r in reports:
        for k, n in r.errors.items():
            errors[k] = errors.get(k, 0) + n
    return _report(sum(r.sent for r in reports), errors, sum(r.duration_s for r in reports),
                   sum(r.tokens for r in reports),
                   {**{k: [v for r in reports for v in r.samples.get(k, [])]
                       for k in ("ttft_ms", "token_ms", "latency_ms", "prompt_len")},
                    "outputs": {q: ids for r in reports
                                for q, ids in r.samples.get("outputs", {}).items()}})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: what GET /v1/models names")
    p.add_argument("--requests", type=int, default=200, help=f"at most {MAX_REQUESTS}")
    p.add_argument("--duration-s", type=float, default=30.0, help=f"at most {MAX_DURATION_S}")
    p.add_argument("--concurrency", type=int, default=8, help="clients at once")
    p.add_argument("--rate", type=float, default=0.0, help="mean req/s; 0: closed loop")
    p.add_argument("--prompt-median", type=float, default=128.0)
    p.add_argument("--prompt-sigma", type=float, default=1.0)
    p.add_argument("--prompt-min", type=int, default=1)
    p.add_argument("--prompt-max", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--burst-mean", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the report to this path")
    args = p.parse_args(argv)
    try:
        check_loopback(args.url)
        stream = make_stream(args.requests, args.seed, args.rate, args.prompt_median,
                             args.prompt_sigma, args.prompt_max, args.prompt_min,
                             args.max_tokens, args.burst_mean)
        report = run_load(args.url, stream, args.concurrency, args.duration_s,
                          model=args.model)
    except (ValueError, OSError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    print(report.line())
    if args.json:
        tmp = f"{args.json}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        os.replace(tmp, args.json)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
