"""The example inference server and load generator, end to end on the host backend.

Servers run as subprocesses on a loopback port they pick themselves; every test is
bounded (small model, a few dozen requests, timeouts on every wait).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_DIR = ROOT / "examples" / "server"
sys.path.insert(0, str(SERVER_DIR))

from block import BlockShape, input_activations, make_weights, reference  # noqa: E402
from loadgen import check_loopback, make_stream, run_load  # noqa: E402

SHAPE = BlockShape(d_model=64, heads=2, d_ff=192, vocab=96, layers=2, max_seq=256, pad_to=32)
SHAPE_ARGS = ["--d-model", "64", "--heads", "2", "--d-ff", "192", "--vocab", "96",
              "--layers", "2", "--max-seq", "256", "--pad-to", "32"]


class Server:
    def __init__(self, dispatch: str, *extra: str, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER_DIR / "server.py"), "--port", "0", "--device", "host",
             "--dispatch", dispatch, *SHAPE_ARGS, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        self.metrics_url = None
        line = self.proc.stdout.readline()
        if line.startswith("metrics at "):
            self.metrics_url = line.split()[-1]
            line = self.proc.stdout.readline()
        if "serving" not in line:          # "serving ... at http://127.0.0.1:PORT"
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.url = line.split()[-1]
        self.port = int(self.url.rsplit(":", 1)[1])

    def request(self, method: str, path: str, body: bytes | str | None = None,
                headers: dict | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body, headers or {})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def infer(self, payload) -> tuple[int, dict]:
        body = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
        return self.request("POST", "/infer", body, {"Content-Type": "application/json"})

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=10)
        finally:
            self.proc.kill()
            self.proc.stdout.close()
            self.proc.stderr.close()


@pytest.fixture(scope="module")
def server():
    s = Server("adaptive")
    yield s
    assert s.stop() == 0, "server did not shut down cleanly on SIGTERM"


@pytest.fixture(scope="module")
def weights():
    return make_weights(SHAPE)


@pytest.mark.parametrize("seq_len", [1, 33, 200])
def test_answer_matches_float64_reference(server, weights, rng, seq_len):
    seed = int(rng.integers(2**31))
    status, out = server.infer({"seq_len": seq_len, "seed": seed})
    assert status == 200, out
    norm, probs = reference(SHAPE, weights, input_activations(SHAPE, weights, seq_len=seq_len,
                                                              seed=seed))
    assert out["seq_len"] == seq_len and out["padded_len"] == SHAPE.padded(seq_len)
    assert out["output_norm"] == pytest.approx(norm, rel=1e-4)
    assert out["next_token_prob"] == pytest.approx(probs[out["next_token"]], rel=1e-3)
    assert probs[out["next_token"]] >= probs.max() * (1 - 1e-3)
    assert out["time_ms"] > 0 and out["dispatch"] == "adaptive"


def test_tokens_request(server, weights, rng):
    tokens = rng.integers(0, SHAPE.vocab, 45).tolist()
    status, out = server.infer({"tokens": tokens})
    assert status == 200, out
    norm, _ = reference(SHAPE, weights, weights["embed"][tokens])
    assert out["output_norm"] == pytest.approx(norm, rel=1e-4)


BAD = [
    ("{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    ("[1, 2]", 400, "expected a JSON object"),
    ({"seq_len": "12"}, 422, "must be an integer"),
    ({"seq_len": True}, 422, "must be an integer"),
    ({"seq_len": 1.5}, 422, "must be an integer"),
    ({"seq_len": 0}, 422, "at least 1"),
    ({"seq_len": 257}, 413, "exceeds this server's max_seq 256"),
    ({"tokens": list(range(300))}, 413, "max_seq"),
    ({"tokens": [1, 96]}, 422, "out of range"),
    ({"tokens": [1, "a"]}, 422, "must be an integer"),
    ({"tokens": "1 2 3"}, 422, "must be a list"),
    ({"tokens": [1], "seq_len": 3}, 422, "exactly one of"),
    ({}, 422, "exactly one of"),
    ({"seq_len": 4, "batch": 2}, 422, "unknown field(s) ['batch']"),
    ({"tokens": [1], "seed": 2}, 422, "'seed' goes with 'seq_len'"),
    ({"seq_len": 4, "seed": -1}, 422, "'seed' must be in"),
]


@pytest.mark.parametrize("payload,status,message", BAD, ids=[str(b[0])[:24] for b in BAD])
def test_bad_request_gets_clear_4xx_and_server_stays_up(server, payload, status, message):
    got, out = server.infer(payload)
    assert got == status, out
    assert out["status"] == status and message in out["error"]
    assert server.infer({"seq_len": 5})[0] == 200


def test_bad_routes_methods_and_raw_garbage(server):
    assert server.request("GET", "/nowhere")[0] == 404
    assert server.request("POST", "/other", "{}")[0] == 404
    assert server.request("PUT", "/infer", "{}")[0] == 405
    status, out = server.request("POST", "/infer", "x" * 10, {"Content-Length": str(2 << 20)})
    assert status == 413 and "exceeds" in out["error"]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/9.x\r\n\r\n")
        reply = s.makefile("rb").read()
    head, body = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.") and b" 400 " in head.split(b"\r\n")[0]
    assert "version" in json.loads(body)["error"]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"\x00\x01\xff not http at all\r\n\r\n")
        s.makefile("rb").read()
    assert server.request("GET", "/healthz") == (200, {"status": "ok", "dispatch": "adaptive"})


def test_loadgen_end_to_end(server, tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(SERVER_DIR / "loadgen.py"), "--url", server.url, "--requests", "40",
         "--duration-s", "30", "--concurrency", "4", "--rate", "200", "--seq-median", "40",
         "--seq-max", "256", "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["sent"] == report["ok"] == 40 and report["errors"] == {}
    lat = report["latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    assert report["throughput_rps"] > 0 and "req/s" in proc.stdout
    assert 1 <= report["seq_len"]["max"] <= 256
    assert server.request("GET", "/stats")[1]["requests"]["ok"] >= 40


def test_loadgen_stops_at_its_time_bound(server):
    stream = make_stream(5000, seed=1, rate=0.0, seq_max=64)
    t0 = time.perf_counter()
    report = run_load(server.url, stream, concurrency=2, duration_s=1.0)
    assert time.perf_counter() - t0 < 10
    assert 0 < report.ok < 5000 and report.sent == report.ok


def test_stream_is_long_tailed_bursty_and_reproducible():
    a = make_stream(4000, seed=3, rate=100.0, seq_median=100, seq_sigma=1.0, seq_max=2048)
    assert a == make_stream(4000, seed=3, rate=100.0, seq_median=100, seq_sigma=1.0,
                            seq_max=2048)
    lengths = np.array([r.seq_len for r in a])
    assert 70 < np.median(lengths) < 140 and lengths.max() > 8 * np.median(lengths)
    assert lengths.min() >= 1 and lengths.max() <= 2048
    times = np.array([r.at_s for r in a])
    assert np.all(np.diff(times) >= 0)
    assert np.mean(np.diff(times) == 0) > 0.5          # bursts: many arrive together
    assert 20 < times[-1] < 60                        # ~4000 requests at 100 req/s


@pytest.mark.parametrize("url", ["http://10.1.2.3:8000", "http://192.168.0.1",
                                 "http://example.com:8000", "https://127.0.0.1:8000"])
def test_loadgen_refuses_non_loopback(url):
    with pytest.raises(ValueError, match="loopback|http://"):
        check_loopback(url)
    proc = subprocess.run([sys.executable, str(SERVER_DIR / "loadgen.py"), "--url", url,
                           "--requests", "3"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "loadgen:" in proc.stderr


def test_static_dispatch_pins_one_variant_per_op(weights, rng):
    s = Server("static")
    try:
        seed = int(rng.integers(2**31))
        status, out = s.infer({"seq_len": 70, "seed": seed})
        assert status == 200 and out["dispatch"] == "static"
        norm, _ = reference(SHAPE, weights, input_activations(SHAPE, weights, seq_len=70,
                                                              seed=seed))
        assert out["output_norm"] == pytest.approx(norm, rel=1e-4)
        choices = s.request("GET", "/stats")[1]["static_choices"]
        assert set(choices) == {"gemm", "attention", "spmm", "softmax"}
        assert choices["gemm"].startswith("host_blas")
    finally:
        assert s.stop() == 0


def test_adaptive_mode_does_not_import_torch():
    code = (f"import sys; sys.path.insert(0, {str(SERVER_DIR)!r}); import server, block, "
            "loadgen; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_torch_mode_matches_reference(weights, rng):
    pytest.importorskip("torch")
    from block import build
    model = build(SHAPE, "torch", "host", "float32")
    x = input_activations(SHAPE, weights, seq_len=50, seed=int(rng.integers(2**31)))
    norm, token, prob = model(x)
    ref_norm, probs = reference(SHAPE, weights, x)
    assert norm == pytest.approx(ref_norm, rel=1e-4)
    assert prob == pytest.approx(probs[token], rel=1e-3)


def test_static_override_and_prometheus_metrics(rng):
    pytest.importorskip("prometheus_client")
    from adaptive.metrics import DEVICE_GAUGES
    s = Server("static", "--static", "spmm=host_bsr", "--metrics-port", "0")
    try:
        for length in rng.integers(1, 256, 6):
            assert s.infer({"seq_len": int(length), "seed": 1})[0] == 200
        assert s.request("GET", "/stats")[1]["static_choices"]["spmm"].startswith("host_bsr[")
        assert s.metrics_url is not None
        text = urllib.request.urlopen(s.metrics_url, timeout=10).read().decode()
        launches = {}
        for line in text.splitlines():
            if line.startswith("adaptive_launches_total{"):
                labels, value = line.rsplit(" ", 1)
                launches[labels] = float(value)
        ops = {op for op in ("gemm", "attention", "spmm", "softmax")
               if any(f'op="{op}"' in k for k in launches)}
        assert ops == {"gemm", "attention", "spmm", "softmax"}, text[:2000]
        exported = set(re.findall(r"^# TYPE (\w+) (\w+)", text, re.M))
        names = {n for n, _ in exported} | {n + "_total" for n, t in exported if t == "counter"}
        names |= {n + s for n, t in exported if t == "histogram" for s in ("_bucket", "_sum")}
        names |= {g[0] for g in DEVICE_GAUGES.values()}          # no GPU here: no samples
        dashboard = (SERVER_DIR / "grafana-dashboard.json").read_text()
        used = set(re.findall(r"\b(adaptive_\w+?)(?:\{|\[|\)|\b)", dashboard))
        assert used and used <= names, f"dashboard queries unknown metrics {used - names}"
        spmm = {k: v for k, v in launches.items() if 'op="spmm"' in k}
        assert all('variant="host_bsr"' in k for k in spmm), spmm    # the pinned variant
        assert sum(spmm.values()) >= 6 * 2 * SHAPE.layers   # two per layer per request
    finally:
        assert s.stop() == 0


def test_server_without_prometheus_client_says_so_and_serves(tmp_path):
    fake = tmp_path / "prometheus_client"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named prometheus_client')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    s = Server("adaptive", "--metrics-port", "0", env=env)
    try:
        assert s.metrics_url is None
        assert s.infer({"seq_len": 9})[0] == 200
    finally:
        s.proc.terminate()
        _, err = s.proc.communicate(timeout=10)
    assert "metrics: off" in err and "prometheus-client" in err


EXAMPLES = [("build_pack.py", ["--out", "{tmp}/p.pack", "--lengths", "64", "--repeats", "2"],
             "loaded: "),
            ("analyse_counter_log.py", [], "usable as cost-model training rows"),
            ("torch_interop.py", [], "nn.Module with AdaptiveLinear")]


@pytest.mark.parametrize("script,args,expect", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_examples_run(script, args, expect, tmp_path):
    if script == "torch_interop.py":
        pytest.importorskip("torch")
    args = [a.format(tmp=tmp_path) for a in args]
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expect in proc.stdout


def test_gpu_server_benchmark_dry_run_on_host(tmp_path):
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu_server
    payload = gpu_server.run(str(tmp_path), device="host", requests=300, duration_s=1.0,
                             warmup_limit_s=60.0, concurrency=2, quick=True)
    assert [r["mode"] for r in payload["results"]] == ["adaptive", "static", "torch",
                                                       "harness"]
    assert all("error" not in r for r in payload["results"]), payload["results"]
    ceiling = payload["results"][3]["load"]["throughput_rps"]
    assert all(r["load"]["throughput_rps"] < ceiling for r in payload["results"][:3])
    adaptive = payload["results"][0]
    assert adaptive["policy"] == "learned" and payload["pack"]["rows"] >= 0
    assert adaptive["warmed_lengths"] == adaptive["lengths"] == 4     # 64..256 by 64
    assert adaptive["misses_in_load"] == 0, "a key was decided inside the timed window"
    table = gpu_server.table(payload["results"])
    assert "adaptive / torch" in table.splitlines()[-1] and "targets" in table
    assert "harness alone (no model)" in table
    assert json.loads((tmp_path / "gpu_server.json").read_text())["device"] == "host"
    rows = gpu_server.summary_rows(payload)
    assert [r["case"] for r in rows] == ["adaptive throughput", "static throughput",
                                         "torch throughput", "harness throughput",
                                         "adaptive / static", "adaptive / torch"]
    assert all(float(r["value"]) > 0 and r["unit"] for r in rows)
    assert gpu_server.main(str(tmp_path))[0]["case"] == "skipped"     # no GPU here


def test_warm_up_settles_every_length_or_fails_loudly():
    from block import build
    from server import WarmupError, padded_lengths, warm_up
    shape = BlockShape(d_model=32, heads=2, d_ff=64, vocab=40, layers=2, max_seq=70, pad_to=32)
    assert padded_lengths(shape) == [32, 64, 96]
    model = build(shape, "adaptive", "host", "float32", policy="learned")
    lines = []
    done = warm_up(model, shape, limit_s=60.0, progress=lines.append)
    assert done["warmed_lengths"] == done["lengths"] == 3 and len(lines) == 3
    for length in padded_lengths(shape):        # every key met is committed: nothing left
        x = input_activations(shape, model.host_weights, seq_len=length, seed=1)
        assert model.pending_decisions(x) == {}
    misses = model.dispatcher.stats["misses"]
    model(input_activations(shape, model.host_weights, seq_len=41, seed=2))
    assert model.dispatcher.stats["misses"] == misses   # 41 pads to 64: already decided

    class NeverSettles:
        host_weights = model.host_weights

        def pending_decisions(self, x):
            return {("gemm", ((x.shape[0], 32),), ()): "still exploring 4 candidates"}

    with pytest.raises(WarmupError, match=r"length 32: 1 key\(s\) still exploring after 3 "
                       r"requests: gemm .*still exploring 4 candidates"):
        warm_up(NeverSettles(), shape, max_per_length=3)
