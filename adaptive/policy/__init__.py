"""Policies: how a miss turns candidates into a decision, and what they learn from.

- :mod:`adaptive.policy.base`: the :class:`Policy` protocol, :class:`Decision`,
  :class:`Context`, and the simple policies (``measure-each``, ``first``);
- :mod:`adaptive.policy.learned`: :class:`Learned`, the default (a cost model plus
  exploration of its closest calls);
- :mod:`adaptive.policy.cost_model`: the scikit-learn cost model and its training rows;
- :mod:`adaptive.policy.features`: the one feature builder every row goes through;
- :mod:`adaptive.policy.explain`: ``adaptive.explain`` (and ``adaptive explain``).

Importing this package loads only :mod:`~adaptive.policy.base`; ``Learned`` and the cost
model (scikit-learn) load on first use.
"""

from __future__ import annotations

from adaptive.policy.base import BasePolicy, Context, Decision, First, MeasureEach, Policy

__all__ = ["POLICIES", "BasePolicy", "Context", "Decision", "First", "Learned", "MeasureEach",
           "Policy", "make_policy"]


POLICIES = ("learned", "measure-each", "first")


def make_policy(name: str) -> Policy:
    """A fresh policy by name (``ADAPTIVE_POLICY``); the learned one loads scikit-learn."""
    if name == "learned":
        from adaptive.policy.learned import Learned
        return Learned()
    if name == "measure-each":
        return MeasureEach()
    if name == "first":
        return First()
    from adaptive.errors import UnknownNameError
    raise UnknownNameError("policy", name, POLICIES)


def __getattr__(name: str):
    if name == "Learned":
        from adaptive.policy.learned import Learned
        return Learned
    raise AttributeError(f"module 'adaptive.policy' has no attribute {name!r}")
