"""The LLM path of the regeneration loop on the host backend, with recorded answers: an
OpenAI-compatible loopback endpoint (R1-style <think> answers, a malformed one, a slow
one, an HTTP 500) and a stand-in for the local transformers model object. Generate →
verify → promote works, the verdict goes back into the next prompt, and serving goes on
while the loop runs. benchmarks/gpu_regen_llm.py runs the same on the GPU."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from adaptive.regen.prompt import extract_code
from adaptive.regen.recorded import Event, RecordedChatServer, recorded_local_generator


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory):
    from benchmarks import gpu_regen_llm
    out = tmp_path_factory.mktemp("regen_llm")
    rows = gpu_regen_llm.main(str(out), backend="host", dims={"R": 64, "C": 96}, slow_s=0.5)
    return rows, json.loads((out / "regen_llm.json").read_text()), out


@pytest.mark.slow
def test_both_generators_promote_and_serving_goes_on(llm_run):
    rows, details, _ = llm_run
    assert all(r.get("rc", 0) == 0 for r in rows), rows
    for name in ("openai", "hf"):
        d = details[name]
        assert d["promoted"] and d["promoted_source_from"] == name
        assert d["serving"].startswith(d["promoted"]) and d["result_correct_after"]
        assert d["launches_during_loop"] > 0        # launched while the loop ran, on this thread
        assert d["worst_launch_ms_during_loop"] < 2000      # none waited for the loop
        assert d["served_after_ms"] < d["served_before_ms"]


@pytest.mark.slow
def test_endpoint_answers_are_judged_and_fed_back(llm_run):
    _, details, out = llm_run
    stages = [a["stage"] for a in details["openai"]["attempts"]]
    # the slow malformed answer and the 500 are rejected (or the 500 retried by the client)
    assert stages[0] == "source" and stages[-1] == "" and "nonfinite" in stages
    wrong = next(a for a in details["openai"]["attempts"] if a["stage"] == "nonfinite")
    assert "large values" in wrong["verdict"]        # the regime that exposes exp(x) overflow
    prompts = [p.read_text() for p in sorted(out.glob("openai_prompt_*.txt"),
                                             key=lambda p: int(p.stem.rsplit("_", 1)[1]))]
    # the attempt after the wrong answer is told why it was rejected (the client retries a
    # 500 itself, so which prompt that is depends on the replies' order)
    wrong_at = stages.index("nonfinite")
    told = prompts[wrong_at + 1]
    assert "Previous attempt" in told and "rejected at stage 'nonfinite'" in told
    assert "## Contract" in prompts[-1] and "def softmax_row" in prompts[-1]
    assert (out / "openai_answer_1.py").read_text().strip() == ""      # <think> never closed
    answer = sorted(out.glob("openai_answer_*.py"))[-1].read_text()
    assert "xf.max(axis=1" in answer and "<think>" not in answer
    report = json.loads(sorted(out.glob("openai_report_*.json"))[-1].read_text())
    assert report["outcome"] == "accepted" and report["baseline"] == "naive_row[ROWS=4]"
    assert details["openai"]["endpoint_requests"] >= 3


def test_local_model_stand_in_goes_through_the_transformers_generator():
    gen = recorded_local_generator(["<think>x</think>\n```python\ndef f(x, out):\n    pass\n```"])
    reply = gen.complete("write a softmax")
    assert extract_code(reply.content, "f")[0].startswith("def f(x, out)")
    call = gen._lm.calls[0]
    assert call["do_sample"] and call["temperature"] == 0.6 and call["top_p"] == 0.95
    assert gen._tokenizer.prompts == ["write a softmax"]


def _post(url: str, timeout: float = 10):
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback)
        return json.loads(resp.read())


def test_recorded_server_replays_slow_failing_and_reasoning_replies():
    events = [Event(content="a", delay_s=0.3), Event(status=500),
              Event(content="b", reasoning="thought")]
    with RecordedChatServer(events) as server:
        assert server.url.startswith("http://127.0.0.1:")
        t0 = time.monotonic()
        assert _post(server.url)["choices"][0]["message"]["content"] == "a"
        assert time.monotonic() - t0 >= 0.3
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(server.url)
        assert err.value.code == 500
        msg = _post(server.url)["choices"][0]["message"]
        assert msg == {"role": "assistant", "content": "b", "reasoning_content": "thought"}
        assert _post(server.url)["choices"][0]["message"]["content"] == "b"   # repeats
        assert len(server.requests) == 4 and server.requests[0]["body"]["model"] == "m"
    with pytest.raises(ValueError, match="loopback"):
        RecordedChatServer(events, host="0.0.0.0")
