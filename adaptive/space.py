"""Launch-config spaces as data: parameters with their values, and constraints.

A space is what a manifest's ``[variant.space]`` table holds. ``constraints`` may name
the parameters and the device limits (``max_threads_per_block``, ``max_shared_bytes``,
``sm_count``, ``cpu_count``); they decide which configs can launch at all, so the
NVRTC check and pack builder enumerate exactly those. Input-dependent conditions are
the variant's ``requires``, not the space's.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
from collections.abc import Iterator, Mapping

from adaptive.errors import (ExpressionError, InputTypeError, InputValueError,
                             UnknownNameError)
from adaptive.expr import Expr, compile_expr

Config = tuple  # a config is a tuple of (name, value) pairs, sorted by name: hashable
_ADMITTED: dict[tuple, tuple[dict, ...]] = {}   # (space, limits) -> its configs (Space.configs)
_ADMITTED_MAX = 4096


def as_config(mapping: Mapping) -> Config:
    return tuple(sorted(mapping.items()))


@dataclasses.dataclass(frozen=True)
class Space:
    params: tuple[tuple[str, tuple], ...] = ()
    constraints: tuple[Expr, ...] = ()

    @classmethod
    def from_dict(cls, table: Mapping, where: str = "space") -> Space:
        """Build from a manifest table: ``{"BM": [64, 128], "constraints": ["..."]}``."""
        params, constraints = [], []
        for name, values in table.items():
            if name == "constraints":
                if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                    raise ExpressionError(f"{where}.constraints: expected a list of strings")
                constraints = [compile_expr(v) for v in values]
                continue
            if not isinstance(values, list) or not values:
                raise ExpressionError(f"{where}.{name}: expected a non-empty list of values, "
                                      f"got {values!r}")
            params.append((name, tuple(values)))
        space = cls(tuple(params), tuple(constraints))
        unknown = set().union(*(c.names for c in space.constraints)) - set(space.names) \
            - DEVICE_LIMIT_NAMES if space.constraints else set()
        if unknown:
            raise ExpressionError(f"{where}.constraints name {', '.join(sorted(unknown))}, "
                                  f"which are neither parameters nor device limits")
        return space

    def to_dict(self) -> dict:
        table = {name: list(values) for name, values in self.params}
        if self.constraints:
            table["constraints"] = [c.text for c in self.constraints]
        return table

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)

    def all_configs(self) -> Iterator[dict]:
        names = self.names
        for values in itertools.product(*(v for _, v in self.params)):
            yield dict(zip(names, values))

    def configs(self, limits: Mapping) -> list[dict]:
        """Every config whose constraints hold under these device limits (new dicts).
        Enumerated once per process for a space and limits, whatever object holds the
        space: each dispatcher has a registry of its own, and a new one's first miss of
        an op enumerated its variants' spaces again (1.5-5.8 ms for gemm's, spmm's or
        attention's on our CPU, of a first result whose bar is 5 ms)."""
        key = (self.params, tuple(c.text for c in self.constraints),
               tuple(sorted(limits.items())))
        admitted = _ADMITTED.get(key)
        if admitted is None:
            admitted = tuple(c for c in self.all_configs() if self.admits(c, limits))
            if len(_ADMITTED) >= _ADMITTED_MAX:   # spaces made at run time (regenerated
                _ADMITTED.clear()                 # variants) keep coming: bounded
            _ADMITTED[key] = admitted
        return [dict(c) for c in admitted]

    def holds(self, config: Mapping) -> bool:
        """True when ``config`` names exactly this space's parameters, each with one of its
        listed values (constraints, which need a device's limits, not checked)."""
        return len(config) == len(self.params) and all(
            name in config and config[name] in values for name, values in self.params)

    def admits(self, config: Mapping, limits: Mapping) -> bool:
        scope = {**limits, **config}
        return all(bool(c(scope)) for c in self.constraints)

    def check(self, config: Mapping, limits: Mapping, variant: str) -> dict:
        """Validate a user-given config; fill nothing in, reject unknown or bad values."""
        config = dict(config)
        for name in config:
            if name not in self.names:
                raise UnknownNameError(f"config parameter of {variant!r}", name, self.names,
                                       none=f"{variant!r} takes no config (pass config=None)")
        missing = [n for n in self.names if n not in config]
        if missing:
            raise InputValueError(f"config for {variant!r} lacks {', '.join(missing)}; "
                                  f"expected values for {', '.join(self.names)}")
        for name, values in self.params:
            if not isinstance(config[name], (numbers.Number, str)):   # an array, a list
                raise InputTypeError(f"config {name} for {variant!r} must be one of "
                                     f"{list(values)}, got {type(config[name]).__name__}")
            if config[name] not in values:
                raise InputValueError(f"config {name}={config[name]!r} for {variant!r} is not "
                                      f"in its space {list(values)}")
        for c in self.constraints:
            if not c({**limits, **config}):
                raise InputValueError(f"config {config} for {variant!r} breaks its "
                                      f"constraint {c.text!r} on this device")
        return config


DEVICE_LIMIT_NAMES = frozenset({
    "max_threads_per_block", "max_shared_bytes", "sm_count", "cpu_count", "warp_size",
    "max_registers_per_block", "l2_bytes", "cc",
})
