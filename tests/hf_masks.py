"""The attention masks transformers itself builds, for the integration's CPU and GPU tests."""

from __future__ import annotations

import inspect


def transformers_masks(b, lq, lk, padding, device="cpu"):
    """The masks transformers builds for SDPA (bool or None) and for eager (additive) at a
    query offset of ``lk - lq``, through its own builders (their signature changed: newer
    releases take ``q_length``/``q_offset``, older ones ``cache_position``)."""
    import torch
    from transformers.masking_utils import eager_mask, sdpa_mask
    offset = lk - lq
    if "q_length" in inspect.signature(sdpa_mask).parameters:
        kw = dict(batch_size=b, q_length=lq, kv_length=lk, q_offset=offset, device=device)
    else:
        kw = dict(batch_size=b, cache_position=torch.arange(offset, lk, device=device),
                  kv_length=lk)
    mine = sdpa_mask(**kw, attention_mask=padding)
    theirs = eager_mask(**kw, attention_mask=padding, dtype=torch.float32)
    return mine, theirs


def cache_keyword(model) -> str:
    """The keyword ``model.forward`` takes its key/value cache by in the installed
    transformers: ``"cache"`` where it has one (a 5.x release renamed it, keeping
    ``past_key_values`` as a deprecated alias), ``"past_key_values"`` otherwise."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"
