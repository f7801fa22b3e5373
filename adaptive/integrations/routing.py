"""How often a patched layer's warm call still goes through the dispatcher (torch-free).

A layer holding a committed plan runs it without the dispatcher, except one call in
``HOLD_EVERY << level``: that call is sampled, seen by drift detection and the counter log.
Each routed call that finds the plan it held still the one committed takes ``level`` one
up, to :data:`HOLD_DOUBLINGS`; one that finds another (a drift, a new commit, a dropped
plan) puts it back to 0. A steady layer so routes one call in 512, not one in 64: run
S46's batch-1 ablation put 3.3 % of a token's time in the routed calls (adaptive 0.939x
torch's tokens/s, with no routing 0.972x). A plan the dispatcher drops is seen on the
next warm call all the same (its ``stale`` flag), so a re-decision made through another
layer's routed call is taken at once. The level is written by routed calls only (a plain
attribute, or the attention module's global): serving threads racing on it lose at most one
step of the backoff, which moves when a later call routes, never what it computes.
"""

from __future__ import annotations

HOLD_DOUBLINGS = 3    # one routed call in HOLD_EVERY << 3 (512) at most


def backed_off(level: int, held, now) -> int:
    """The next ``level`` after a routed call of a layer that held ``held``: one up (at
    most :data:`HOLD_DOUBLINGS`) when the plan it holds after the call, ``now``, is the
    same choice, else 0."""
    same = now is held or (now is not None and not now.stale
                           and now.candidate == held.candidate)
    return min(level + 1, HOLD_DOUBLINGS) if same else 0
