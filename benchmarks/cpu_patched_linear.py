"""Host cost of a patched model against the plain one, on tiny CPU tensors.

Four measurements, each patched against plain, rounds alternating and medians kept:

- one ``nn.Linear`` forward (x ``[1, 1, 16]`` and ``[1, 4, 64]``);
- one attention call at a decode step (transformers' SDPA attention function against
  ``adaptive.integrations.transformers.attention_forward``), batch 1 and batch 4 with a
  padding mask;
- a whole decode step of a tiny Llama (``generate()``, random weights built from a config,
  nothing downloaded): host time per token, and the plain/patched ratio (the tokens/s
  ratio of a host-bound decode loop), with the patched model's decode-steps hook and
  without it (:mod:`adaptive.integrations.direct`), and the same per decode forward alone;
- the same loop with only the attention function changed (transformers' SDPA, ours, and a
  pass-through to transformers' SDPA under another name).

The shapes are tiny, so the difference is the patched code's Python work per call and
nothing else. Times are this thread's CPU time (``time.thread_time_ns``, torch on one
thread), so other processes on a shared machine do not count in them. The dispatcher is
a host one whose variants are torch's own calls (``torch.mm`` with ``torch_library``, SDPA
through a torch entry, transformers' RMSNorm ops), so that the plans it
commits are the ones the H200 commits for such a model (cuBLAS and SDPA through torch):
what is timed is what the patched layers add around the same library calls.

    python benchmarks/cpu_patched_linear.py [--calls 20000] [--rounds 5] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_SOURCE = textwrap.dedent('''
    def gemm_numpy(a, b, out):
        out[...] = a @ b

    def gemm_torch(a, b, out=None):
        import torch
        return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)

    def attention_numpy(q, k, v, mask=None, *, out, causal=False, scale=None):
        raise NotImplementedError("this benchmark's attention takes torch tensors only")

    def attention_torch(q, k, v, mask=None, *, out=None, causal=False, scale=None):
        import torch
        F = torch.nn.functional
        h, hkv, lq, lk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
        causal = causal and lq > 1
        if causal and lq != lk:   # bottom-right causal as a mask (SDPA's is top-left)
            seen = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
            mask, causal = seen if mask is None else mask & seen, False
        if mask is not None and hkv != h:
            k = k.repeat_interleave(h // hkv, dim=1)
            v = v.repeat_interleave(h // hkv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           scale=scale, enable_gqa=mask is None and hkv != h)
        return y if out is None else out.copy_(y)
''')


def library_dispatcher():
    """A host dispatcher whose only variants are torch's own gemm, attention and rmsnorm
    calls."""
    import adaptive
    from adaptive.variants import Registry, Variant, default_registry, variant_from_dict
    gemm = variant_from_dict({"name": "torch_mm", "backend": "host", "language": "python",
                              "entry": "gemm_numpy", "torch_entry": "gemm_torch",
                              "source": _SOURCE}, "gemm")
    if "torch_library" in Variant.__dataclass_fields__:   # (absent from older trees)
        gemm = dataclasses.replace(gemm, torch_library=True)
    attention = variant_from_dict({"name": "torch_sdpa", "backend": "host",
                                   "language": "python", "entry": "attention_numpy",
                                   "torch_entry": "attention_torch", "source": _SOURCE},
                                  "attention")
    if "torch_library" in Variant.__dataclass_fields__:   # SDPA as the plain model calls it
        attention = dataclasses.replace(attention, torch_library=True)
    norms = [v for v in default_registry().variants("rmsnorm", "host") if v.torch_entry]
    return adaptive.Dispatcher(backend="host", registry=Registry([gemm, attention, *norms]))


def _timed_us(fn, calls: int) -> float:
    t0 = time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.thread_time_ns() - t0) / calls / 1e3


def _side_by_side(plain, patched, calls: int, rounds: int) -> tuple[float, float]:
    """Median µs per call of each, rounds alternating (the machine is shared and noisy)."""
    for _ in range(max(calls // 10, 300)):   # past exploration: measure the plans committed
        plain()
        patched()
    times = {"plain": [], "patched": []}
    for i in range(rounds):
        order = ("plain", "patched") if i % 2 == 0 else ("patched", "plain")
        for name in order:
            times[name].append(_timed_us(plain if name == "plain" else patched, calls))
    return statistics.median(times["plain"]), statistics.median(times["patched"])


def _linears(calls: int, rounds: int) -> list[dict]:
    import torch
    from adaptive.integrations import transformers as at
    rows = []
    for tokens, features in ((1, 16), (4, 64)):
        plain = torch.nn.Linear(features, features, bias=True).eval()
        patched = at.AdaptiveLinear(torch.nn.Linear(features, features, bias=True), "dense",
                                    "bench").eval()
        x = torch.randn(1, tokens, features)
        t_plain, t_patched = _side_by_side(functools.partial(plain, x),
                                           functools.partial(patched, x), calls, rounds)
        rows.append({"case": f"linear x [1, {tokens}, {features}]", "plain_us": t_plain,
                     "patched_us": t_patched, "overhead_us": t_patched - t_plain})
    return rows


def _attention(calls: int, rounds: int, batch: int = 1) -> dict:
    """One decode step's attention call; ``batch`` > 1: with a padding mask (the first
    row's 10 oldest keys masked), as a batch of padded prompts decodes."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from adaptive.integrations import transformers as at
    at.register()

    class Layer(torch.nn.Module):   # what transformers passes as ``module``
        is_causal, num_key_value_groups, layer_idx = True, 2, 0
    layer = Layer()
    q = torch.randn(batch, 4, 1, 16)
    k, v = torch.randn(batch, 2, 100, 16), torch.randn(batch, 2, 100, 16)
    mask = None
    if batch > 1:
        mask = torch.ones(batch, 1, 1, 100, dtype=torch.bool)
        mask[0, ..., :10] = False
    t_plain, t_patched = _side_by_side(
        lambda: sdpa_attention_forward(layer, q, k, v, mask, scaling=0.25),
        lambda: at.attention_forward(layer, q, k, v, mask, scaling=0.25), calls, rounds)
    what = "" if mask is None else f", padding mask [{batch}, 1, 1, 100]"
    return {"case": f"attention decode q [{batch}, 4, 1, 16], k/v [{batch}, 2, 100, 16]{what}",
            "plain_us": t_plain, "patched_us": t_patched, "overhead_us": t_patched - t_plain}


def _tiny_llama(max_positions: int):
    """A 4-layer Llama with grouped heads and SDPA attention, random weights (seed 0)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         max_position_embeddings=max_positions, pad_token_id=0,
                         eos_token_id=None, bos_token_id=None, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _decode(rounds: int, new_tokens: int, prompt: int = 8) -> dict:
    """The tiny Llama's greedy decode, plain against patched and against patched without
    its decode-steps hook (:mod:`adaptive.integrations.direct`: each layer's own warm path
    instead), rounds rotating the three: host time per token of the whole ``generate()``,
    and per decode forward alone (a forward of one token a row, timed from the model's
    first pre-hook to its last hook), medians."""
    import copy
    import torch
    from adaptive.integrations import transformers as at
    plain = _tiny_llama(max(1024, 2 * (prompt + new_tokens)))
    config = plain.config
    patched = at.patch(copy.deepcopy(plain))
    own = at.patch(copy.deepcopy(plain))
    at._remove_decode_steps(own)
    models = {"plain": plain, "patched": patched, "own": own}
    forwards = {n: [] for n in models}
    for name, m in models.items():
        _time_decode_forwards(m, forwards[name])
    ids = torch.randint(1, 256, (1, prompt), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)

    def generate(model):
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    for _ in range(3):   # past exploration of every class the loop meets
        same = torch.equal(generate(plain), generate(patched))
    names = list(models)
    times = {n: [] for n in names}
    per_forward = {n: [] for n in names}
    for i in range(rounds):
        for name in names[i % 3:] + names[:i % 3]:
            forwards[name].clear()
            t0 = time.thread_time_ns()
            generate(models[name])
            times[name].append((time.thread_time_ns() - t0) / new_tokens / 1e3)
            per_forward[name].append(statistics.median(forwards[name]) / 1e3)
    us = {n: statistics.median(t) for n, t in times.items()}
    fw = {n: statistics.median(t) for n, t in per_forward.items()}
    return {"case": f"tiny Llama decode ({config.num_hidden_layers} layers, prompt {prompt}, "
                    f"{new_tokens} tokens, {rounds} rounds) per token",
            "plain_us": us["plain"], "patched_us": us["patched"],
            "overhead_us": us["patched"] - us["plain"], "ratio": us["plain"] / us["patched"],
            "same_tokens": same, "own_us": us["own"],
            "forward_us": fw, "forward_ratio": fw["plain"] / fw["patched"],
            "forward_ratio_own": fw["plain"] / fw["own"]}


def _time_decode_forwards(model, into: list) -> None:
    """Append the host ns of each of ``model``'s decode forwards (one token a row) to
    ``into``: a pre-hook ahead of every other, a forward hook after."""
    started = []

    def before(module, args, kwargs):
        ids = kwargs.get("input_ids")
        started[:] = [time.thread_time_ns()] if ids is not None and ids.shape[1] == 1 else []

    def after(module, args, kwargs, out):
        if started:
            into.append(time.thread_time_ns() - started[0])
    model.register_forward_pre_hook(before, with_kwargs=True, prepend=True)
    model.register_forward_hook(after, with_kwargs=True)


def _attention_in_loop(rounds: int, prompt: int, new_tokens: int) -> dict:
    """The same tiny Llama three times, only the attention function differing: transformers'
    SDPA, adaptive's, and a pass-through to transformers' SDPA registered under another
    name (what a function of ours costs at the least). Rounds alternate the three; host
    time per token, medians. ``prompt``: long enough that the decode's cached lengths stay
    in few classes, as a served prompt's do."""
    import copy
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from adaptive.integrations import transformers as at
    sdpa = _tiny_llama(4096)
    at.register()
    own = AttentionInterface._global_mapping["sdpa"]

    def pass_through(*args, **kwargs):
        return own(*args, **kwargs)
    AttentionInterface.register("pass_through", pass_through)
    AttentionMaskInterface.register("pass_through",
                                    AttentionMaskInterface._global_mapping["sdpa"])
    models = {"sdpa": sdpa, "adaptive": copy.deepcopy(sdpa),
              "pass_through": copy.deepcopy(sdpa)}
    at._set_attention(models["adaptive"], at.NAME)
    at._set_attention(models["pass_through"], "pass_through")
    ids = torch.randint(1, 256, (1, prompt), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)

    def generate(model):
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    for _ in range(3):
        for m in models.values():
            generate(m)
    names = list(models)
    times = {n: [] for n in names}
    for i in range(rounds):
        for name in names[i % 3:] + names[:i % 3]:
            t0 = time.thread_time_ns()
            generate(models[name])
            times[name].append((time.thread_time_ns() - t0) / new_tokens / 1e3)
    us = {n: statistics.median(t) for n, t in times.items()}
    return {"case": f"tiny Llama decode, attention only (prompt {prompt}, {new_tokens} "
                    f"tokens, {rounds} rounds) per token", "plain_us": us["sdpa"],
            "patched_us": us["adaptive"], "overhead_us": us["adaptive"] - us["sdpa"],
            "pass_through_us": us["pass_through"]}


def main(calls: int = 20000, rounds: int = 5, quick: bool = False,
         out_dir: str | None = None) -> list[dict]:
    import torch
    from adaptive import runtime
    from adaptive.integrations import transformers as at
    torch.set_num_threads(1)
    if quick:
        calls, rounds = min(calls, 300), min(rounds, 2)
    runtime.set_default(library_dispatcher(), torch.empty(1))
    getattr(at, "forget_held", lambda: None)()   # plans of an earlier default dispatcher
    with torch.no_grad():
        rows = _linears(calls, rounds) + [_attention(calls, rounds),
                                          _attention(calls, rounds, batch=4)]
    rows.append(_decode(2 if quick else 6 * rounds + 1, 8 if quick else 32,
                        8 if quick else 100))
    rows.append(_attention_in_loop(2 if quick else 5 * rounds, 200, 8 if quick else 32))
    for r in rows:
        extra = (f"; plain/patched {r['ratio']:.3f}, same greedy tokens: {r['same_tokens']}"
                 if "ratio" in r else "")
        if "forward_us" in r:
            fw = r["forward_us"]
            extra += (f"; without the decode-steps hook {r['own_us']:.2f} us; one decode "
                      f"forward: plain {fw['plain']:.2f}, patched {fw['patched']:.2f}, "
                      f"without the hook {fw['own']:.2f} us: plain/patched "
                      f"{r['forward_ratio']:.3f} (without the hook {r['forward_ratio_own']:.3f})")
        if "pass_through_us" in r:
            extra = (f"; a pass-through function {r['pass_through_us']:.2f} us "
                     f"(+{r['pass_through_us'] - r['plain_us']:.2f})")
        print(f"{r['case']}: plain {r['plain_us']:8.2f} us, patched {r['patched_us']:8.2f} us "
              f"(+{r['overhead_us']:.2f}){extra}")
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "cpu_patched_linear.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="few calls (a dry run)")
    parser.add_argument("--out", default=None, help="folder for cpu_patched_linear.json")
    args = parser.parse_args()
    main(args.calls, args.rounds, args.quick, args.out)
