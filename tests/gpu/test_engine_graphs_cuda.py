"""The example engine's decode steps in CUDA graphs: an adaptive-patched Llama (float32,
the tiny preset) gives the same greedy tokens with its decode steps captured once per
rows and cache length and replayed as decoded step by step over a dynamic cache; and the
captured step's wall time beside the eager one's (printed, not asserted: the serving
benchmark's ratios decide speed)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "server"))

BATCHES = [([[5, 9, 13], [7] * 70, [1, 2, 3, 4, 5, 6]], [12, 9, 12]),
           ([[3] * 90, [11, 12]], [10, 10]),
           ([[2, 4] * 40, [9] * 100, [8], [6, 6, 6]], [12, 7, 11, 12])]


def _tokens(lm, batches):
    out = []
    for prompts, new in batches:
        got = {i: [] for i in range(len(prompts))}
        lm.generate(prompts, new, lambda row, token: got[row].append(token) or True)
        out.append(got)
    return out


def test_captured_decode_steps_give_the_eager_tokens_batch_after_batch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    from engine import CausalLM, warm_up
    from models import build_llama
    model = build_llama("tiny", "adaptive", "cuda", "float32")
    eager = CausalLM(model, "tiny", pad_to=64, buckets=True)
    graphed = CausalLM(model, "tiny", pad_to=64, buckets=True, graphs=True,
                       max_new_tokens=16)
    warm_up(eager, [(b, n, 4) for b in (1, 2, 4) for n in (16, 100)])
    want = _tokens(eager, BATCHES)
    t0 = time.perf_counter()
    got = _tokens(graphed, BATCHES)          # the first use of each state captures it
    first_s = time.perf_counter() - t0
    assert got == want
    states = graphed.static_states()
    assert states["mode"] == "capture" and all(s["captured"] for s in states["states"])
    assert {(s["rows"], s["length"]) for s in states["states"]} == {(4, 256), (2, 256)}
    assert _tokens(graphed, BATCHES) == want   # replayed again: the same tokens
    # one decode step's wall, eager against replayed (4 rows, printed)
    static = graphed.static_decode(4, 256)
    torch.cuda.synchronize()
    times = {}
    for name, step in (("eager", static._step), ("replayed", static.graph.replay)):
        with torch.inference_mode():         # the state's tensors are inference tensors
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        times[name] = (time.perf_counter() - t0) / 20 * 1e3
    print(f"\ndecode step, 4 rows, tiny preset: eager {times['eager']:.3f} ms, replayed "
          f"{times['replayed']:.3f} ms ({times['eager'] / times['replayed']:.1f}x); "
          f"first batches with their captures {first_s:.2f} s")
