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
    """New points and mutations of every family's config space, chosen by the cost model.

    Every variant of the op with a config space is a family (a template): the manifest's
    own and any registered later (a pack, ``registry.add``), plus those of ``catalogue``
    not in the serving registry. The search space of each is derived from its manifest
    space: the neighbours of a config (:func:`_neighbours`) one knob at a time, then pairs.
    Centres are the best verified winner, the current best, and each family's manifest
    points. With a cost model (``model.predict_dist(rows)``, the learned policy's model),
    the configs it predicts faster than the current best come first, most promising
    first; the rest of each round goes to the family explored least so far, so every
    family is reached within a budget of about as many candidates as there are families.

    Args:
        registry: where the op's template variants come from (the dispatcher's registry).
        max_points: the most proposals per request over all rounds.
        catalogue: more families to search (e.g. the built-in registry when ``registry``
            serves a subset); their manifest points are proposals too.
        model: a cost model with ``predict_dist(rows) -> (mean, sigma) | None`` over
            :func:`adaptive.policy.cost_model.candidate_row` rows (log time over the
            roofline floor).
    """

    name = "parametric"
    MOVES_PER_CENTRE = 24

    def __init__(self, registry: Registry | None = None, max_points: int = 64,
                 catalogue: Registry | None = None, model=None):
        self.registry = registry
        self.max_points = max_points
        self.catalogue = catalogue
        self.model = model
        self.predicted_ms: dict[str, float] = {}      # proposal label -> the model's estimate

    def _serving(self) -> Registry:
        from adaptive.variants import shared_registry
        return self.registry or shared_registry()

    def _templates(self, request: Request) -> list[Variant]:
        """Every family of the op with a config space (not earlier parametric results):
        the serving registry's, then the catalogue's not served; the current best's first."""
        out = [v for v in self._serving().variants(request.op, request.backend)
               if v.space.params and v.provenance.get("generator") != self.name]
        if self.catalogue is not None:
            names = {v.name for v in out}
            out += [v for v in self.catalogue.variants(request.op, request.backend)
                    if v.space.params and v.name not in names
                    and v.provenance.get("generator") != self.name]
        if request.best is not None:
            first = request.best.variant.provenance.get("template", request.best.variant.id)
            out.sort(key=lambda v: v.id != first)
        return out

    def _known(self, request: Request, template: Variant) -> set:
        """Configs the dispatcher already measures: the served variant's of this name."""
        try:
            served = self._serving().get(request.op, template.name)
        except Exception:  # noqa: BLE001 (a catalogue family the registry does not serve)
            return set()
        return {tuple(sorted(c.items())) for c in served.space.configs(request.limits)}

    def _admits(self, request: Request, template: Variant, config: dict) -> bool:
        scope = {**request.dims, **request.stats, **request.params, "dtype": request.dtype}
        from adaptive.ops.base import DTYPE_BYTES
        scope["itemsize"] = DTYPE_BYTES.get(request.dtype, 4)
        try:
            return template.space.admits(config, request.limits) and template.fits(scope, config)
        except Exception:  # noqa: BLE001 (a constraint naming an unknown limit: not admitted)
            return False

    def _moves(self, request, template, config, note_base, tried) -> list[tuple]:
        """Up to MOVES_PER_CENTRE untried, admitted configs around ``config``: the config
        itself when the dispatcher does not measure it, then one knob, then two."""
        known = self._known(request, template)
        known_values = {k: list(v) for k, v in template.space.params}
        if self.catalogue is not None:         # the full manifest's values, when stripped
            try:
                full = dict(self.catalogue.get(request.op, template.name).space.params)
            except Exception:  # noqa: BLE001 (not in the catalogue)
                full = {}
            for k, vals in full.items():
                if k in known_values:
                    known_values[k] += [v for v in vals if v not in known_values[k]]
        out = []
        own = (template.id, tuple(sorted(config.items())))
        if own not in tried and own[1] not in known and self._admits(request, template, config):
            out.append((template, dict(config), f"{note_base}: as listed"))
        for width in (1, 2):            # single-knob moves first; pairs when they ran out
            for names in itertools.combinations(sorted(config), width):
                for values in itertools.product(*(_neighbours(config[n], known_values[n])
                                                  for n in names)):
                    new = {**config, **dict(zip(names, values))}
                    key = (template.id, tuple(sorted(new.items())))
                    if key in tried or key[1] in known or not self._admits(request, template,
                                                                            new):
                        continue
                    change = ", ".join(f"{n}: {config[n]}->{v}" for n, v in zip(names, values))
                    out.append((template, new, f"{note_base}: {change}"))
                    if len(out) >= self.MOVES_PER_CENTRE:
                        return out
            if out:
                return out
        return out

    def propose(self, request: Request, history: Sequence[Attempt],
                limit: int) -> list[Proposal]:
        templates = self._templates(request)
        tried = {(a.proposal.variant.provenance.get("template"),
                  tuple(sorted(a.proposal.config.items()))) for a in history}
        if len(tried) >= self.max_points or not templates:
            return []
        limit = min(limit, self.max_points - len(tried))
        pools: dict[str, list[tuple]] = {}
        seen = set(tried)
        centres = self._centres(request, history, templates)
        for template, config, note_base in centres:
            for move in self._moves(request, template, config, note_base, seen):
                seen.add((move[0].id, tuple(sorted(move[1].items()))))
                pools.setdefault(template.id, []).append(move)
        if not pools:
            return []
        picks = self._by_model(request, pools, limit - 1 if limit > 1 else limit)
        lead = centres[0][0].id if centres else next(iter(pools))
        explored: dict[str, int] = {}
        for a in history:
            t = a.proposal.variant.provenance.get("template")
            explored[t] = explored.get(t, 0) + 1
        ids = [t.id for t in templates]
        order = sorted(pools, key=lambda tid: (tid == lead, explored.get(tid, 0),
                                               ids.index(tid)))
        if not picks and pools.get(lead):
            # around the best centre: half a round once a winner is found, else a quarter
            won = any(a.report.ok and a.report.speedup > 1.0 for a in history)
            share = max(1, limit // 2 if won else limit // 4)
            picks += pools[lead][:share]
            del pools[lead][:share]
        while len(picks) < limit and any(pools.values()):
            for tid in order:                  # then one move per family, least explored first
                if pools[tid] and len(picks) < limit:
                    picks.append(pools[tid].pop(0))
        return [self._proposal(t, c, note) for t, c, note in picks]

    def _by_model(self, request: Request, pools: dict, limit: int) -> list[tuple]:
        """The moves the cost model predicts faster than the current best, fastest first
        (removed from ``pools``); [] without a model or a prediction."""
        if self.model is None or limit < 1 or not math.isfinite(request.best_ms):
            return []
        from adaptive.policy.features import row as candidate_row, shape_and_work
        moves = [m for pool in pools.values() for m in pool]
        scope = {**request.dims, **request.stats, **request.params, "dtype": request.dtype}
        from adaptive.ops.base import DTYPE_BYTES
        scope["itemsize"] = DTYPE_BYTES.get(request.dtype, 4)
        try:
            own = shape_and_work(request.op, [(t, c) for t, c, _ in moves], scope,
                                 request.limits or None, request.features)
            rows = [candidate_row(request.features, request.op, t.name, c, None, None, g)
                    for (t, c, _), g in zip(moves, own)]
            dist = self.model.predict_dist(rows)
        except Exception:  # noqa: BLE001 (a model that cannot score these: explore instead)
            return []
        if dist is None:
            return []
        mean = dist[0]
        floor = request.floor_ms if request.floor_ms > 0 else 1.0
        predicted = [floor * math.exp(float(m)) for m in mean]
        gains = sorted((p, i) for i, p in enumerate(predicted) if p < request.best_ms)
        picks = []
        for p, i in gains[:limit]:
            t, c, note = moves[i]
            picks.append((t, c, f"{note} (model predicts {p:.4g} ms vs {request.best_ms:.4g})"))
            pools[t.id].remove(moves[i])
        return picks

    def _proposal(self, template: Variant, config: dict, note: str) -> Proposal:
        variant = derived_variant(template, config, "p", provenance={
            "generator": self.name, "template": template.id, "mutation": note})
        return Proposal(variant, config, self.name, note)

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
