"""Prompts for code models, and taking the code back out of their replies.

A prompt carries the op's contract (its calling convention, ``variants/<op>/convention.md``),
the float64 reference, the current best source with its measurements and counters, and
the previous attempt's verdict with its compiler or error text. No system prompt:
DeepSeek-R1's recommendation, and harmless for other models.
"""

from __future__ import annotations

import inspect
import math
import re
import textwrap
from collections.abc import Sequence

from adaptive.regen.request import Attempt, Request
from adaptive.variants import Variant

FEEDBACK_CHARS = 3000      # compiler logs and tracebacks are trimmed to this in prompts
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[ \t]*\n(.*?)```", re.S)


def convention(op: str) -> str:
    """The op's calling convention text, or '' when it has none yet."""
    from adaptive.variants import builtin_folder
    try:
        path = builtin_folder() / op / "convention.md"
    except FileNotFoundError:
        return ""
    return path.read_text() if path.is_file() else ""


def python_contract(op, variant: Variant) -> str:
    args = ", ".join((*op.arrays, "out", *variant.space.names))
    return (f"Write a Python function `def {variant.entry}({args})` (NumPy/SciPy allowed). "
            f"Inputs ({', '.join(op.arrays)}) are C-contiguous NumPy arrays and must not be "
            "modified; write every element of the preallocated `out` (same dtype as the "
            "inputs) in place; the return value is ignored"
            + (f"; {', '.join(variant.space.names)} are launch-config values passed by "
               "keyword" if variant.space.names else "") + ".")


def _fmt_ms(x: float) -> str:
    return f"{x:.4g} ms" if math.isfinite(x) else "failed"


def build_prompt(request: Request, template: Variant, history: Sequence[Attempt]) -> str:
    """The full user message for one generation step."""
    from adaptive.ops import get_op
    op = get_op(request.op)
    lang = "cuda" if template.language == "cuda" else "python"
    parts = [f"You are improving the `{op.name}` operation of a GPU kernel library. Write a "
             f"faster, correct {lang.upper() if lang == 'cuda' else 'Python'} implementation "
             "for the input class below."]
    contract = convention(op.name) if lang == "cuda" else python_contract(op, template)
    if lang == "cuda":
        contract = (contract or "Same kernel signature as the current best below.") + (
            "\n\nThe library prepends a prelude: the fp16/bf16 headers, the element type `T`, "
            "`float to_f32(T)` and `T from_f32<T>(float)`. `#include \"adaptive_ptx.cuh\"` "
            "gives the inline-PTX helpers (smem_u32, cp_async16, cp_async_commit, "
            "cp_async_wait<N>, ldmatrix_x4, ldmatrix_x4_trans, mma16816, mma_sp16832, "
            "load_stream16, ex2, pack2); do not define functions of those names. Config values "
            "arrive as macros (-DNAME=value); grid and block come from the launch expressions "
            "shown below.")
    parts.append("## Contract (calling convention; a candidate must follow it exactly)\n"
                 + (contract or "Same signature as the current best below."))
    try:
        ref = inspect.getsource(type(op).reference)
    except (OSError, TypeError):
        ref = ""
    if ref:
        parts.append("## Reference (float64 NumPy; correctness is judged against it)\n"
                     f"```python\n{textwrap.dedent(ref)}```")
    dims = ", ".join(f"{k}={v}" for k, v in request.dims.items())
    params = ", ".join(f"{k}={v}" for k, v in request.params.items() if v is not None)
    parts.append(f"## Input class\n{dims}; dtype {request.dtype}" + (f"; {params}" if params
                                                                       else "")
                 + f"; backend {request.backend}. Why a new variant is needed: "
                 f"{request.reason or 'the current best is slow'}.")
    if request.best is not None:
        best = request.best
        lines = [f"## Current best: {best.label}",
                 f"time {_fmt_ms(request.best_ms)}, roofline floor {request.floor_ms:.4g} ms "
                 f"(efficiency {request.efficiency:.1%}), {request.samples} samples"]
        if best.config:
            lines.append(f"config values (given as macros / keyword arguments): {best.config}")
        if template.launch:
            lines.append(f"launch: {dict(template.launch)}")
        if request.counters:
            lines.append("counters: " + ", ".join(f"{k}={v:.4g}" for k, v in
                                                  request.counters.items()))
        if request.observed_ms:
            lines.append("other candidates measured: " + ", ".join(
                f"{k} {_fmt_ms(v)}" for k, v in list(request.observed_ms.items())[:8]))
        lines.append(f"```{lang}\n{best.variant.source.rstrip()}\n```")
        parts.append("\n".join(lines))
    last = next((a for a in reversed(history)), None)
    if last is not None:
        detail = last.report.detail.strip()
        if len(detail) > FEEDBACK_CHARS:
            detail = detail[:FEEDBACK_CHARS // 2] + "\n...\n" + detail[-FEEDBACK_CHARS // 2:]
        parts.append(f"## Previous attempt\nVerdict: {last.report.verdict}"
                     + (f"\nCompiler / error output:\n```\n{detail}\n```" if detail else ""))
    parts.append(f"## Task\nReply with the complete source in ONE fenced ```{lang} code block. "
                 f"Keep the entry name `{template.entry}` and its arguments unchanged. Every "
                 "output element must be written; inputs must stay unchanged; handle sizes that "
                 "are not multiples of any tile, down to one element.")
    return "\n\n".join(parts)


def extract_code(content: str, entry: str, reasoning: str | None = None) -> tuple[str, str]:
    """``(code, how)`` from a model reply: after the last ``</think>``, from a fenced block
    defining ``entry`` (else the last block, else the whole answer)."""
    text = content or ""
    if "</think>" in text:                      # R1 may omit the opening <think>
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        return "", "the reply is reasoning only (<think> never closed; raise max_tokens)"
    blocks = [body for _lang, body in _FENCE.findall(text)]
    defines = re.compile(rf"(def|__global__[^;{{]*)\s*\b{re.escape(entry)}\s*\(")
    for body in reversed(blocks):
        if defines.search(body):
            return body.strip() + "\n", "fenced block defining the entry"
    if blocks:
        return blocks[-1].strip() + "\n", "last fenced block (it does not define the entry)"
    if not text.strip() and reasoning:
        return "", "the answer is empty (only reasoning_content came back)"
    return text.strip() + "\n", "whole answer (no fenced code block)"
