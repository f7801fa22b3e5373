"""The generator interface, and the parametric generator (the default; needs no model).

The parametric generator searches around the template variants of the op: new points
of their launch-config spaces (values between and beyond the manifest's, such as the
next power of two) and mutations of the best config found so far, one or two knobs at
a time. Each proposal is the template with a one-point space, so a promoted winner is
an ordinary variant whose only config is the one that won.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from adaptive.regen.request import Attempt, Proposal, Request
from adaptive.space import Space
from adaptive.variants import Registry, Variant


@runtime_checkable
class Generator(Protocol):
    """Proposes candidates for a request, given the attempts (with verdicts) so far."""

    name: str

    def propose(self, request: Request, history: Sequence[Attempt],
                limit: int) -> list[Proposal]:
        """At most ``limit`` new proposals; an empty list means the generator is exhausted."""


def derived_variant(template: Variant, config: Mapping, suffix: str, **changes) -> Variant:
    """``template`` as a generated variant with a one-point space at ``config``."""
    digest = hashlib.sha256(repr((template.id, sorted(config.items()), suffix,
                                  changes.get("source", ""))).encode()).hexdigest()[:8]
    space = Space(tuple((k, (v,)) for k, v in sorted(config.items())), template.space.constraints)
    return dataclasses.replace(template, name=f"{template.name}.{suffix}{digest}", space=space,
                               origin="generated", **changes)


def _neighbours(value, known: Sequence) -> list:
    """Other values for one knob: powers of two around ``value`` (0 and 1 reach each other,
    so flags flip), then the manifest's values, nearest first."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [v for v in known if v != value]
    flip = []
    if isinstance(value, int):
        near = [v for v in (value * 2, value // 2, value * 4, value // 4) if v > 0]
        if value > 2 and value & (value - 1):
            near += [1 << (value.bit_length() - 1), 1 << value.bit_length()]
        if set(known) <= {0, 1}:              # looks like a flag: 0 <-> 1, tried last
            flip = [1 - value] if value in (0, 1) else []
    else:
        near = [value * 2, value / 2, value * 4, value / 4]
    by_distance = sorted(known, key=lambda k: abs(math.log2((abs(k) + 1) / (abs(value) + 1))))
    out = []
    for v in [*near, *by_distance, *flip]:
        if v != value and v not in out:
            out.append(v)
    return out


class Parametric:
    """New points and mutations of the template config spaces.

    Args:
        registry: where the op's template variants come from (the dispatcher's registry).
        max_points: the most proposals per request over all rounds.
    """

    name = "parametric"

    def __init__(self, registry: Registry | None = None, max_points: int = 64):
        self.registry = registry
        self.max_points = max_points

    def _templates(self, request: Request) -> list[Variant]:
        """The op's variants with a config space (not earlier parametric results), the
        current best's template first."""
        from adaptive.dispatch import shared_registry
        registry = self.registry or shared_registry()
        out = [v for v in registry.variants(request.op, request.backend)
               if v.space.params and v.provenance.get("generator") != self.name]
        if request.best is not None:
            first = request.best.variant.provenance.get("template", request.best.variant.id)
            out.sort(key=lambda v: v.id != first)
        return out

    def _known(self, request: Request, template: Variant) -> set:
        """Configs the dispatcher already measures (in the space) or already tried."""
        return {tuple(sorted(c.items())) for c in template.space.configs(request.limits)}

    def _admits(self, request: Request, template: Variant, config: dict) -> bool:
        scope = {**request.dims, **request.stats, **request.params, "dtype": request.dtype}
        from adaptive.ops.base import DTYPE_BYTES
        scope["itemsize"] = DTYPE_BYTES.get(request.dtype, 4)
        try:
            return template.space.admits(config, request.limits) and template.fits(scope, config)
        except Exception:  # noqa: BLE001 (a constraint naming an unknown limit: not admitted)
            return False

    def propose(self, request: Request, history: Sequence[Attempt],
                limit: int) -> list[Proposal]:
        templates = self._templates(request)
        tried = {(a.proposal.variant.provenance.get("template"),
                  tuple(sorted(a.proposal.config.items()))) for a in history}
        if len(tried) >= self.max_points or not templates:
            return []
        centres = self._centres(request, history, templates)
        out: list[Proposal] = []
        for rank, (template, config, note_base) in enumerate(centres):
            # half a round around the best centre, then one move around each of the others
            per_centre = max(1, limit // 2) if rank == 0 else 1
            taken = 0
            known_values = dict(template.space.params)
            known = self._known(request, template)
            for width in (1, 2):            # single-knob moves first; pairs when they ran out
                for names in itertools.combinations(sorted(config), width):
                    for values in itertools.product(*(_neighbours(config[n], known_values[n])
                                                      for n in names)):
                        new = {**config, **dict(zip(names, values))}
                        key = (template.id, tuple(sorted(new.items())))
                        if key in tried or key[1] in known or not self._admits(request,
                                                                                template, new):
                            continue
                        tried.add(key)
                        change = ", ".join(f"{n}: {config[n]}->{v}" for n, v in zip(names, values))
                        variant = derived_variant(
                            template, new, "p", provenance={
                                "generator": self.name, "template": template.id,
                                "mutation": f"{note_base}: {change}"})
                        out.append(Proposal(variant, new, self.name, f"{note_base}: {change}"))
                        taken += 1
                        if len(out) >= limit:
                            return out
                        if taken >= per_centre:
                            break
                    if taken >= per_centre:
                        break
                if taken:
                    break
        return out

    def _centres(self, request, history, templates) -> list[tuple[Variant, dict, str]]:
        """Configs to mutate around: the best verified winner, the current best, one point
        of every other template, then the other winners and manifest points."""
        by_id = {t.id: t for t in templates}
        winners = []
        accepted = sorted((a for a in history if a.report.ok and a.report.speedup > 1.0),
                          key=lambda a: -a.report.speedup)     # beat the best beside them
        for a in accepted:
            t = by_id.get(a.proposal.variant.provenance.get("template"))
            if t is not None:
                winners.append((t, dict(a.proposal.config), f"around {a.proposal.label}"))
        first, rest = winners[:1], winners[1:]
        if request.best is not None:
            bv = request.best.variant
            t = by_id.get(bv.provenance.get("template", bv.id))
            if t is not None:
                first.append((t, request.best.config,
                              f"around the current best {request.best.label}"))
        points = [(t, c, f"around {t.name} manifest point")
                  for t in templates for c in t.space.configs(request.limits)]
        heads, seen = [], {t.id for t, _, _ in first}
        for p in points:
            if p[0].id not in seen:
                seen.add(p[0].id)
                heads.append(p)
        return first + heads + rest + points
