"""Secrets stay put: the chat client never sends the key to another origin on a redirect
(local servers on 127.0.0.1 and 127.0.0.2), retries 429/5xx/timeouts with bounded
backoff and says clearly what failed; the verifier's worker gets no secret-looking
variable of this process's environment."""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time
from pathlib import Path

import pytest

from adaptive.errors import GeneratorError
from adaptive.regen import Job, OpenAIGenerator, Verifier
from adaptive.regen.verifier import secret_looking, worker_env
from adaptive.variants import default_registry

pytest.importorskip("httpx")
KEY = "sk-test-not-for-other-hosts"
OK = json.dumps({"choices": [{"message": {"role": "assistant", "content": "hi"}}]}).encode()


class Server:
    """A loopback HTTP server answering each POST with ``script(n, handler)``'s
    (status, headers, body) and recording path and Authorization of every request."""

    def __init__(self, host: str, script):
        self.seen: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                   "host": self.headers.get("Host")})
                status, headers, body = script(len(outer.seen), self)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made = []

    def make(host, script):
        s = Server(host, script)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def _gen(url: str, **kw) -> OpenAIGenerator:
    return OpenAIGenerator(base_url=url + "/v1", model="m", api_key=KEY, timeout_s=5,
                           backoff_s=0.01, **kw)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("other", ["127.0.0.2", "other port"])
def test_redirect_to_another_host_never_gets_the_key(servers, status, other):
    host = "127.0.0.1" if other == "other port" else other
    elsewhere = servers(host, lambda n, h: (200, {}, OK))
    origin = servers("127.0.0.1", lambda n, h: (status, {"Location": elsewhere.url + "/v1/x"},
                                                b""))
    with pytest.raises(GeneratorError, match=r"another origin.*key stays") as info:
        _gen(origin.url).complete("p")
    assert elsewhere.url.split("//")[1] in str(info.value)
    assert elsewhere.seen == [], "the other host was contacted"
    assert [s["auth"] for s in origin.seen] == [f"Bearer {KEY}"]


def test_redirect_within_the_origin_is_followed_with_the_key(servers):
    def script(n, h):
        if h.path == "/v1/chat/completions":
            return 307, {"Location": "/v2/chat/completions"}, b""
        return 200, {"Content-Type": "application/json"}, OK
    s = servers("127.0.0.1", script)
    assert _gen(s.url).complete("p").content == "hi"
    assert [x["path"] for x in s.seen] == ["/v1/chat/completions", "/v2/chat/completions"]
    assert all(x["auth"] == f"Bearer {KEY}" for x in s.seen)


def test_redirect_loop_is_bounded(servers):
    s = servers("127.0.0.1", lambda n, h: (307, {"Location": f"/v1/{n}"}, b""))
    with pytest.raises(GeneratorError, match="redirects"):
        _gen(s.url).complete("p")
    assert len(s.seen) == OpenAIGenerator.MAX_REDIRECTS + 1


def test_429_and_5xx_are_retried_with_backoff(servers):
    answers = {1: (429, {"Retry-After": "0"}, b"slow down"), 2: (503, {}, b"busy"),
               3: (502, {}, b"bad gateway")}
    s = servers("127.0.0.1", lambda n, h: answers.get(n, (200, {}, OK)))
    t0 = time.perf_counter()
    assert _gen(s.url).complete("p").content == "hi"
    assert len(s.seen) == 4 and time.perf_counter() - t0 >= 0.01 + 0.02 + 0.04


def test_retries_are_bounded_and_the_error_says_what_came_back(servers):
    s = servers("127.0.0.1", lambda n, h: (500, {}, b"model crashed"))
    with pytest.raises(GeneratorError, match=r"HTTP 500 'model crashed' after 3 tries"):
        _gen(s.url, retries=2).complete("p")
    assert len(s.seen) == 3


def test_timeout_is_retried(servers):
    def script(n, h):
        if n == 1:
            time.sleep(0.6)
        return 200, {}, OK
    s = servers("127.0.0.1", script)
    gen = OpenAIGenerator(base_url=s.url + "/v1", model="m", api_key=KEY, timeout_s=0.2,
                          backoff_s=0.01)
    assert gen.complete("p").content == "hi" and len(s.seen) == 2
    gen.retries = 0
    s.seen.clear()
    with pytest.raises(GeneratorError, match="no answer within 0.2 s"):
        gen.complete("p")


def test_client_errors_are_not_retried_and_say_what_to_do(servers):
    s = servers("127.0.0.1", lambda n, h: (401, {}, b"bad key"))
    with pytest.raises(GeneratorError, match=r"HTTP 401 \(check the API key\): bad key"):
        _gen(s.url).complete("p")
    assert len(s.seen) == 1
    s2 = servers("127.0.0.1", lambda n, h: (200, {}, b"<html>not json"))
    with pytest.raises(GeneratorError, match="not JSON"):
        _gen(s2.url).complete("p")


def test_unreachable_endpoint_is_a_clear_error():
    import socket
    with socket.socket() as sock:          # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(GeneratorError, match="cannot reach the endpoint after 2 tries"):
        _gen(f"http://127.0.0.1:{port}", retries=1).complete("p")


# ---- the verifier's worker environment -----------------------------------------------------

SECRETS = {"OPENAI_API_KEY": "sk-1", "ADAPTIVE_OPENAI_API_KEY": "sk-2", "HF_TOKEN": "hf-3",
           "AWS_SECRET_ACCESS_KEY": "a", "DB_PASSWORD": "p", "GOOGLE_APPLICATION_CREDENTIALS":
           "/c.json", "GITHUB_TOKEN": "g", "MY_PASSWD": "x", "NPM_AUTH": "y",
           "ADAPTIVE_SESSION_COOKIE": "z"}


def test_worker_env_keeps_what_python_needs_and_no_secret():
    base = {"PATH": "/usr/bin", "HOME": "/root", "ADAPTIVE_CACHE_DIR": "/c", "LC_ALL": "C",
            "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "2", "SOME_APP_SETTING": "1"}
    env = worker_env({**base, **SECRETS})
    assert not [k for k in env if secret_looking(k)]
    assert not set(SECRETS) & set(env)
    assert {k: env[k] for k in base if k != "SOME_APP_SETTING"} == \
        {k: v for k, v in base.items() if k != "SOME_APP_SETTING"}
    assert "SOME_APP_SETTING" not in env and env["PYTHONUNBUFFERED"] == "1"


ENV_DUMP = """
import json, os
import numpy as np
with open({path!r}, "w") as f:
    json.dump(sorted(os.environ), f)

def softmax_blocked(x, out, rows):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out[...] = e / e.sum(axis=1, keepdims=True)
"""


def test_verifier_worker_sees_no_secret_looking_variable(tmp_path, monkeypatch):
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    dump = tmp_path / "env.json"
    template = default_registry().get("softmax", "host_blocked")
    v = dataclasses.replace(template, name="env_dump", source=ENV_DUMP.format(path=str(dump)))
    report = Verifier(timeout_s=30).verify(Job(v, {"rows": 8}, {"R": 16, "C": 24}))
    assert report.ok, report.detail
    names = json.loads(Path(dump).read_text())
    assert "PATH" in names
    leaked = [k for k in names if secret_looking(k)]
    assert leaked == [], f"the worker saw {leaked}"
