"""Background regeneration: trigger → queue → generator → isolated verifier → promotion.

Heavy dependencies load on use: ``transformers``/``torch`` only inside the hf generator,
CuPy only inside the verifier's worker process.
"""

from __future__ import annotations

from adaptive.regen.chat import (GENERATORS, ChatGenerator, OpenAIGenerator, Reply,
                                 TransformersGenerator, make_generator)
from adaptive.regen.loop import LoopResult, pick_winner, promote, run_loop
from adaptive.regen.parametric import Generator, Parametric
from adaptive.regen.regenerator import Regenerator, disable, enable
from adaptive.regen.report import Check, Outcome, Stage, VerifyReport
from adaptive.regen.request import Attempt, Budget, Proposal, Request
from adaptive.regen.source import variant_from_source, verify
from adaptive.regen.verifier import Job, Verifier, static_check

__all__ = [
    "Attempt", "Budget", "ChatGenerator", "Check", "GENERATORS", "Generator", "Job",
    "LoopResult", "OpenAIGenerator", "Outcome", "Parametric", "Proposal", "Regenerator",
    "Reply", "Request", "Stage", "TransformersGenerator", "Verifier", "VerifyReport",
    "disable", "enable", "make_generator", "pick_winner", "promote", "run_loop",
    "static_check", "variant_from_source", "verify",
]
