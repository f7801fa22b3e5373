"""A load generator for the example server: long-tailed sequence lengths, bursty arrivals.

    python examples/server/loadgen.py --url http://127.0.0.1:8000 --requests 500 \\
        --duration-s 30 --concurrency 8 --rate 50 --json report.json

Sequence lengths are lognormal (median ``--seq-median``, shape ``--seq-sigma``) clipped
to [1, ``--seq-max``]: mostly short prompts and a few long documents. Requests arrive in
bursts (sizes geometric with mean ``--burst-mean``) whose start times form a Poisson
process of ``--rate`` requests/s overall; ``--rate 0`` sends as fast as the workers can
(closed loop). With a rate, latency counts from a request's scheduled arrival, so time
spent waiting for a free worker during a burst shows up instead of being hidden.

It only talks to loopback addresses, and stops after ``--requests`` or ``--duration-s``,
whichever comes first.
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


@dataclasses.dataclass(frozen=True)
class Request:
    at_s: float        # scheduled arrival, seconds after the start
    seq_len: int
    seed: int


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What a run measured. Latencies in ms; ``server_ms`` is the server's own time_ms."""

    sent: int
    ok: int
    errors: dict
    duration_s: float
    throughput_rps: float
    latency_ms: dict
    server_ms: dict
    seq_len: dict

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def line(self) -> str:
        lat = self.latency_ms
        return (f"{self.ok}/{self.sent} ok in {self.duration_s:.2f} s: "
                f"{self.throughput_rps:.1f} req/s, p50 {lat.get('p50', float('nan')):.2f} ms, "
                f"p99 {lat.get('p99', float('nan')):.2f} ms, errors {self.errors or 'none'}")


def make_stream(n: int, seed: int = 0, rate: float = 0.0, seq_median: float = 128.0,
                seq_sigma: float = 1.0, seq_max: int = 1024, burst_mean: float = 4.0
                ) -> list[Request]:
    """A reproducible request stream: the same arguments give the same requests."""
    if not 1 <= n <= MAX_REQUESTS:
        raise ValueError(f"n must be in [1, {MAX_REQUESTS}], got {n}")
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(seq_median), seq_sigma, n)), 1, seq_max)
    times, t = [], 0.0
    while len(times) < n:
        size = int(rng.geometric(1.0 / max(burst_mean, 1.0)))
        times += [t] * size
        if rate > 0:
            t += float(rng.exponential(size / rate))
    return [Request(times[i], int(lengths[i]), int(rng.integers(2**31))) for i in range(n)]


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


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    a = np.asarray(values)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "max": float(a.max())}


def run_load(url: str, stream: list[Request], concurrency: int = 8,
             duration_s: float = 60.0, timeout_s: float = 60.0) -> LoadReport:
    """Send ``stream`` to ``url`` + /infer; stop early when ``duration_s`` has passed."""
    host, port = check_loopback(url)
    if not 0 < duration_s <= MAX_DURATION_S:
        raise ValueError(f"duration_s must be in (0, {MAX_DURATION_S}], got {duration_s}")
    open_loop = any(req.at_s > 0 for req in stream)
    local = threading.local()
    lock = threading.Lock()
    latencies, server_ms, lengths, errors = [], [], [], {}
    start = time.perf_counter()
    deadline = start + duration_s

    def send(req: Request) -> None:
        began = time.perf_counter()
        if began > deadline:
            return
        # open loop: from the scheduled arrival; closed loop: from the send
        t0 = start + req.at_s if open_loop else began
        body = json.dumps({"seq_len": req.seq_len, "seed": req.seed})
        try:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
            conn.request("POST", "/infer", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            payload = resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException) as exc:
            local.conn = None
            status, payload = type(exc).__name__, b"{}"
        done = time.perf_counter()
        with lock:
            if status == 200:
                latencies.append((done - t0) * 1e3)
                server_ms.append(json.loads(payload)["time_ms"])
                lengths.append(req.seq_len)
            else:
                errors[str(status)] = errors.get(str(status), 0) + 1

    with ThreadPoolExecutor(concurrency) as pool:
        for req in stream:
            wait = start + req.at_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            if time.perf_counter() > deadline:
                break
            pool.submit(send, req)
    elapsed = time.perf_counter() - start
    sent = len(latencies) + sum(errors.values())
    return LoadReport(sent=sent, ok=len(latencies), errors=errors, duration_s=elapsed,
                      throughput_rps=len(latencies) / elapsed if elapsed > 0 else 0.0,
                      latency_ms=_percentiles(latencies), server_ms=_percentiles(server_ms),
                      seq_len=_percentiles(lengths))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--requests", type=int, default=200, help=f"at most {MAX_REQUESTS}")
    p.add_argument("--duration-s", type=float, default=30.0, help=f"at most {MAX_DURATION_S}")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rate", type=float, default=0.0, help="mean req/s; 0: closed loop")
    p.add_argument("--seq-median", type=float, default=128.0)
    p.add_argument("--seq-sigma", type=float, default=1.0)
    p.add_argument("--seq-max", type=int, default=1024)
    p.add_argument("--burst-mean", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the report to this path")
    args = p.parse_args(argv)
    try:
        check_loopback(args.url)
        stream = make_stream(args.requests, args.seed, args.rate, args.seq_median,
                             args.seq_sigma, args.seq_max, args.burst_mean)
        report = run_load(args.url, stream, args.concurrency, args.duration_s)
    except ValueError as exc:
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
