"""``adaptive.integrations.static.StaticDecode`` on the CPU (uncaptured: the same steps a
CUDA graph replays): greedy tokens equal transformers' own ``generate()`` for padded
rows, in a plain and an adaptive-patched model, batch after batch on one state; bad
inputs are refused naming what was expected."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402

from adaptive.integrations.static import StaticDecode, exploring_keys  # noqa: E402
from hf_masks import cache_keyword  # noqa: E402
# the tiny Llama pair and torch's own calls as the CPU default dispatcher's candidates
# (few to explore), as the integration's fast-path tests make them
from test_integration_fast_paths import _tiny_pair, library  # noqa: E402, F401

pytestmark = pytest.mark.usefixtures("library")


def _model(patched: bool):
    plain, adapted = _tiny_pair(seed=7)
    return adapted if patched else plain


def _batch(lengths, seed):
    """Left-padded prompts of these lengths: ids, mask, position ids."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(1, 256, (n,), generator=gen)
        mask[i, width - n:] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _static_tokens(model, decode, ids, mask, positions, n):
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1, **{decode.cache_kw: cache})
        tokens = out.logits[:, -1].argmax(-1)
        decode.load(cache, mask, positions, tokens)
        steps = [tokens.clone()] + [decode.step().clone() for _ in range(n - 1)]
    return torch.stack(steps, dim=1)


@pytest.mark.parametrize("patched", [False, True], ids=["plain", "patched"])
def test_static_steps_give_generates_greedy_tokens_batch_after_batch(patched):
    model = _model(patched)
    kw = cache_keyword(model)
    decode = StaticDecode(model, rows=3, length=64, cache_kw=kw)
    for lengths, seed, n in (((9, 4, 13), 1, 10), ((20, 20, 2), 2, 8)):
        ids, mask, positions = _batch(lengths, seed)
        with torch.no_grad():
            want = model.generate(ids, attention_mask=mask, max_new_tokens=n,
                                  min_new_tokens=n, do_sample=False,
                                  pad_token_id=0)[:, ids.shape[1]:]
        got = _static_tokens(model, decode, ids, mask, positions, n)
        assert torch.equal(got, want), (lengths, got, want)
    assert not decode.captured and exploring_keys() >= 0


def test_bad_inputs_are_refused_naming_what_was_expected():
    model = _model(False)
    with pytest.raises(ValueError, match="rows >= 1 and length >= 2, got rows=0"):
        StaticDecode(model, rows=0, length=16)
    decode = StaticDecode(model, rows=2, length=16)
    ids, mask, positions = _batch((16, 3), 4)           # no room for a new token
    with pytest.raises(ValueError, match="2 rows and 16 positions does not fit a static "
                                         "decode of 2 rows and 16 positions"):
        decode.load(DynamicCache(config=model.config), mask, positions, ids[:, -1])
    ids, mask, positions = _batch((5, 3, 2), 4)         # three rows for two
    with pytest.raises(ValueError, match="3 rows and 5 positions does not fit"):
        decode.load(DynamicCache(config=model.config), mask, positions, ids[:, -1])
    with pytest.raises(ValueError, match="records CUDA graphs: the model is on cpu"):
        decode.capture()
    with pytest.raises(RuntimeError, match="call load\\(\\) first"):
        next(decode.run(ids[:, -1], 1))
    ids, mask, positions = _batch((5, 3), 4)            # 5 positions of 16: 11 steps fit
    cache = DynamicCache(config=model.config)
    kw = cache_keyword(model)
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
              logits_to_keep=1, **{kw: cache})
        decode.load(cache, mask, positions, ids[:, -1])
    for bad in (12, -1):
        with pytest.raises(ValueError, match=f"0 to 11 steps after a prefill of 5 "
                                             f"positions in a static cache of 16, got {bad}"):
            next(decode.run(ids[:, -1], bad))


def test_run_reads_each_step_back_after_issuing_the_next_and_gives_steps_tokens():
    """``run()``: the prefill's tokens, then each step's, as host lists equal to what
    step-by-step decoding gives; when step k's tokens reach the caller, step k + 1 is
    already issued (the last step has none after it); breaking out early leaves the
    state for the next ``load`` to set."""
    model = _model(True)
    kw = cache_keyword(model)
    decode = StaticDecode(model, rows=3, length=64, cache_kw=kw)
    ids, mask, positions = _batch((9, 4, 13), 3)
    want = _static_tokens(model, decode, ids, mask, positions, 7).tolist()
    issued = []
    real_step = decode._step
    decode._step = lambda: (issued.append(1), real_step())[1]
    cache = DynamicCache(config=model.config)
    got = []
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1, **{kw: cache})
        tokens = out.logits[:, -1].argmax(-1)
        decode.load(cache, mask, positions, tokens)
        for k, host in enumerate(decode.run(tokens, 6)):
            assert isinstance(host, list) and len(host) == 3
            assert len(issued) == min(k + 1, 6), (k, len(issued))
            got.append(host)
    assert [list(col) for col in zip(*got)] == want
    # stopped after two lists: one step issued ahead, unread; the next batch is exact
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1, **{kw: cache})
        decode.load(cache, mask, positions, tokens)
        for k, _ in enumerate(decode.run(tokens, 6)):
            if k == 1:
                break
    assert _static_tokens(model, decode, ids, mask, positions, 7).tolist() == want


def test_revised_keys_counts_keys_running_another_candidate_or_dropped():
    from adaptive.integrations.static import plan_table, revised_keys
    before = {"a": "x", "b": "y", "c": "z"}
    assert revised_keys(before, dict(before)) == 0
    assert revised_keys(before, {"a": "x", "b": "w", "c": "z", "d": "new"}) == 1
    assert revised_keys(before, {"a": "x"}) == 2          # b and c no longer planned
    table = plan_table()                                  # the process's dispatchers now
    assert isinstance(table, dict) and revised_keys(table, plan_table()) == 0
