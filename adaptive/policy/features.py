"""The one feature builder: what the cost model sees of a candidate on an input.

Decision (:meth:`adaptive.policy.learned.Learned.decide`), training (pack, counter-log and live
rows through :func:`adaptive.policy.cost_model.training_set` and :meth:`Learned.observe`) and
:func:`adaptive.explain` all build their rows here, so a row means the same thing
wherever it was made. A row is a dict of named floats in six groups:

``op.*``    the op's features of the input (log2 sizes, itemsize, density, ...).
``variant=``/``cfg.*``  which candidate: a one-hot of the variant, its config values (and
            their log2).
``geo.*``   launch geometry on this device (CTAs, waves, the last wave's fill, threads
            per CTA, the input's flops per CTA and per launched thread; for an op with
            ``tile_fill``, the used share of the last tiles), from the variant's launch
            expressions and the device's limits; absent for library and host variants and
            when the limits are unknown.
``work.*``  what the candidate does on this input beyond the op's features, from
            :meth:`adaptive.ops.base.Op.work` (spmm: the entries its weight form reads per
            non-zero, and per row); absent where the op does not say.
``res.*``   kernel resources from ptxas (registers, shared memory, spills), as stored with
            the cubin in the kernel cache (:mod:`adaptive.kcache`). Unknown (a library or
            host variant, CuPy's own NVRTC, a candidate not compiled yet): the defaults of
            :data:`RESOURCE_DEFAULTS` with ``res.known`` = 0.
``dev.*``   the device state when the call was made (:class:`DeviceState`, filled from the
            NVML/GPM sampler's readings). Unknown (the host backend, no sampler): the
            defaults of :class:`DeviceState`, an idle device at its nominal clock (what a
            pack build measures), with ``dev.known`` = 0.

Every group is always present (defaults where unknown), so a row from a pack and a row
from a live call of the same candidate on the same input differ only where the device
or the kernel did. Nothing here imports scikit-learn.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

from adaptive.expr import compile_expr
from adaptive.observation import Observation
from adaptive.ops.base import DTYPE_BYTES

FEATURE_VERSION = 6   # bump when row names or meanings change: older fitted state is refused

# ptxas resources of a kernel; absent (not compiled here, a library call): these values
RESOURCE_DEFAULTS = {"registers": 0.0, "shared_bytes": 0.0, "spill_store_bytes": 0.0,
                     "spill_load_bytes": 0.0}

# clock-event bits that mean the clock is held down (NVML: SW power cap, HW slowdown,
# SW/HW thermal, power brake)
_THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


@dataclasses.dataclass(frozen=True)
class DeviceState:
    """The device when a call was made, as the model sees it; defaults: idle, nominal clock.

    Filled by :meth:`from_mapping` from the sampler's readings
    (:class:`profilers.nvml.DeviceSnapshot` fields, plus ``max_sm_clock_mhz``,
    ``mem_used_bytes``/``mem_total_bytes`` and ``other_processes`` where the backend knows
    them); a field not reported keeps its default.
    """

    known: bool = False               # False: nothing was reported (all defaults)
    sm_clock_ratio: float = 1.0       # SM clock / its maximum (1.0: not held down)
    gpu_util_ratio: float = 0.0       # NVML utilisation (all processes, ours included)
    sm_active_ratio: float = 0.0      # GPM SM activity over the last window
    mem_used_ratio: float = 0.0       # device memory in use / total
    other_processes: float = 0.0      # other processes with work on the device
    throttled: bool = False           # a power or thermal clock event is active

    @classmethod
    def from_mapping(cls, m: Mapping | None) -> DeviceState:
        """From a sampler reading (``{}`` or None: the defaults)."""
        if not m:
            return cls()

        def num(name: str) -> float | None:
            v = m.get(name)
            return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None
        out: dict = {"known": True}
        clock, peak = num("sm_clock_mhz"), num("max_sm_clock_mhz")
        if clock is not None and peak:
            out["sm_clock_ratio"] = min(1.0, clock / peak)
        elif num("sm_clock_ratio") is not None:
            out["sm_clock_ratio"] = num("sm_clock_ratio")
        for name in ("gpu_util_ratio", "sm_active_ratio", "mem_used_ratio", "other_processes"):
            if num(name) is not None:
                out[name] = num(name)
        used, total = num("mem_used_bytes"), num("mem_total_bytes")
        if used is not None and total:
            out["mem_used_ratio"] = used / total
        reasons = m.get("clock_event_reasons")
        if isinstance(reasons, int):
            out["throttled"] = bool(reasons & _THROTTLE_BITS)
        elif isinstance(m.get("throttled"), bool):
            out["throttled"] = m["throttled"]
        return cls(**out)

    def features(self) -> dict[str, float]:
        return {f"dev.{f.name}": float(getattr(self, f.name))
                for f in dataclasses.fields(self)}


def kernel_resources(candidate, lookup: Callable | None = None) -> dict[str, float]:
    """``res.*`` features of a candidate: ``lookup(candidate)`` (the backend's kernel cache)
    when given and it knows, else ``Variant.resources`` (one flat table or one per
    candidate label), else :data:`RESOURCE_DEFAULTS` with ``res.known`` = 0."""
    table = dict(lookup(candidate) or {}) if lookup is not None else {}
    if not table:
        res = getattr(candidate.variant, "resources", None) or {}
        per_label = res.get(candidate.label)
        table = dict(per_label) if isinstance(per_label, Mapping) else {
            k: v for k, v in res.items() if isinstance(v, (int, float))}
    known = any(k in table for k in RESOURCE_DEFAULTS)
    out = {f"res.{k}": float(table.get(k, d)) for k, d in RESOURCE_DEFAULTS.items()}
    out["res.known"] = 1.0 if known else 0.0
    return out


def row(op_features: Mapping[str, float], op: str, variant: str, config: Mapping,
        resources: Mapping | None = None, device: Mapping | DeviceState | None = None,
        geometry: Mapping | None = None) -> dict[str, float]:
    """One model row. ``resources``: ``res.*`` features (see :func:`kernel_resources`) or
    a raw ptxas table; ``device``: a :class:`DeviceState` or a sampler reading."""
    state = device if isinstance(device, DeviceState) else DeviceState.from_mapping(device)
    return _assembled(_op_part(op_features), geometry,
                      _candidate_part(op, variant, config, resources), state.features())


def _op_part(op_features: Mapping[str, float]) -> dict[str, float]:
    return {f"op.{k}": float(v) for k, v in op_features.items()}


def _candidate_part(op: str, variant: str, config: Mapping,
                    resources: Mapping | None) -> dict[str, float]:
    """What a row says of the candidate alone: its variant, config and resources."""
    out = {f"variant={op}/{variant}": 1.0}
    for name, value in config.items():
        if isinstance(value, (bool, int, float)):
            out[f"cfg.{name}"] = float(value)
            if value > 0:
                out[f"cfg.log2_{name}"] = math.log2(value)
        else:
            out[f"cfg.{name}={value}"] = 1.0
    res = dict(resources or {})
    if not any(k.startswith("res.") for k in res):   # a raw ptxas table
        known = any(k in res for k in RESOURCE_DEFAULTS)
        res = {f"res.{k}": float(res.get(k, d)) for k, d in RESOURCE_DEFAULTS.items()}
        res["res.known"] = 1.0 if known else 0.0
    out.update(res)
    return out


def _assembled(op_part: dict, geometry: Mapping | None, candidate_part: dict,
               device_part: dict) -> dict[str, float]:
    """A row from its parts, in the order :func:`row` has always written them."""
    out = dict(op_part)
    if geometry:
        out.update(geometry)
    out.update(candidate_part)
    out.update(device_part)
    return out


def candidate_rows(op: str, op_features: Mapping[str, float], candidates: Sequence,
                   scope: Mapping, limits: Mapping | None,
                   device: Mapping | DeviceState | None = None,
                   resources: Callable | None = None) -> list[dict[str, float]]:
    """The rows of every candidate of one input (a miss: one call). ``resources``: the
    backend's lookup of a candidate's ptxas resources (None: the variants' own tables)."""
    state = device if isinstance(device, DeviceState) else DeviceState.from_mapping(device)
    configs = [c.config for c in candidates]
    op_part, device_part = _op_part(op_features), state.features()   # once, not per row
    return Rows(op_part, shape_and_work(op, [(c.variant, cfg) for c, cfg in
                                             zip(candidates, configs)], scope, limits,
                                        op_features),
                [_part_of(op, c, cfg, resources) for c, cfg in zip(candidates, configs)],
                device_part)


class Rows(Sequence):
    """The rows of one input's candidates (:func:`candidate_rows`), kept as their parts:
    the op's and the device's, shared by every row, and each candidate's geometry and work
    and its own part (the same dict object for a candidate, miss after miss). A row is
    the dict :func:`row` makes, built when asked for; :meth:`matrix` gives the model's
    matrix without building them (a miss ranks ~100 candidates and keeps the rows of the
    few it explores: 1.3 ms of a decide went to assembling dicts, on a 2-core machine)."""

    def __init__(self, op_part: dict, geometry: list[dict], candidate: list[dict],
                 device_part: dict):
        self.op_part, self.geometry, self.candidate = op_part, geometry, candidate
        self.device_part = device_part
        self._built: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self.candidate)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]
        row = self._built.get(i)
        if row is None:
            row = self._built[i] = _assembled(self.op_part, self.geometry[i],
                                              self.candidate[i], self.device_part)
        return row

    def matrix(self, index: Mapping[str, int]):
        """The rows as a float64 matrix of ``len(index)`` columns, each value in its
        name's column (names ``index`` lacks left out, missing names 0.0): what
        :meth:`adaptive.policy.cost_model.CostModel._matrix` makes of the dicts."""
        import numpy as np
        n = len(self)
        M = np.zeros((n, len(index)))
        for part in (self.op_part, self.device_part):   # every row alike
            cols, vals = _columns(index, part)
            M[:, cols] = vals
        store_rows(M, self.geometry, index)              # each row's geometry and work
        if n:   # each candidate's own part: one scatter of every row's columns
            parts = [_columns(index, part) for part in self.candidate]
            at = np.repeat(np.arange(n), [len(c) for c, _ in parts])
            M[at, np.concatenate([c for c, _ in parts])] = np.concatenate([v for _, v in parts])
        return M


def store_rows(M, rows: Sequence[Mapping[str, float]], index: Mapping[str, int]) -> None:
    """Store dict ``rows`` into the rows of ``M``, each value in its name's column (names
    ``index`` lacks left out): the rows of one key order (a variant's features; a miss
    has a few) as one array and one fancy-indexed store, not name by name."""
    import numpy as np
    by_names: dict[tuple, tuple[list, list]] = {}
    for i, row in enumerate(rows):
        group = by_names.setdefault(tuple(row), ([], []))
        group[0].append(i)
        group[1].append(list(row.values()))
    for names, (at, values) in by_names.items():
        kept = [(k, index[name]) for k, name in enumerate(names) if name in index]
        if kept:
            V = np.array(values, dtype=np.float64).reshape(len(at), len(names))
            M[np.array(at)[:, None], [j for _, j in kept]] = V[:, [k for k, _ in kept]]


# (id(index), id(part)) -> (index, part, columns, values): a candidate's part is one dict
# miss after miss (_PARTS), and the model's index one dict per fit
_COLUMNS: dict = {}
_COLUMNS_MAX = 16384


def _columns(index: Mapping[str, int], part: Mapping[str, float]):
    import numpy as np
    key = (id(index), id(part))
    hit = _COLUMNS.get(key)
    if hit is not None and hit[0] is index and hit[1] is part:
        return hit[2], hit[3]
    kept = [(index[name], float(v)) for name, v in part.items() if name in index]
    cols = np.array([j for j, _ in kept], dtype=np.intp)
    vals = np.array([v for _, v in kept], dtype=np.float64)
    if len(_COLUMNS) >= _COLUMNS_MAX:
        _COLUMNS.clear()
    _COLUMNS[key] = (index, part, cols, vals)
    return cols, vals


# (id(variant), config items) -> (variant, its candidate part): a miss ranks ~100
# candidates, and what a row says of a candidate alone never changes while its resources
# come from the variant (a backend's lookup, which learns a kernel's after its compile,
# is asked every time)
_PARTS: dict = {}
_PARTS_MAX = 8192


def _part_of(op: str, candidate, config: Mapping, resources: Callable | None) -> dict:
    if resources is not None:
        return _candidate_part(op, candidate.variant.name, config,
                               kernel_resources(candidate, resources))
    key = (id(candidate.variant), candidate.config_items)
    hit = _PARTS.get(key)
    if hit is not None and hit[0] is candidate.variant:
        return hit[1]
    part = _candidate_part(op, candidate.variant.name, config, kernel_resources(candidate))
    if len(_PARTS) >= _PARTS_MAX:
        _PARTS.clear()
    _PARTS[key] = (candidate.variant, part)
    return part


def shape_and_work(op: str, candidates: Sequence[tuple], scope: Mapping,
                   limits: Mapping | None, op_features: Mapping[str, float]
                   ) -> list[dict[str, float]]:
    """Each (variant, config)'s :func:`geometry` and :func:`work` on one input, in one dict:
    the part of a row that is the candidate's on this input. A miss's rows
    (:func:`candidate_rows`), a measurement row's (:func:`row_geometry`) and the parametric
    regenerator's rows all come from here, so the model reads a candidate one way."""
    from adaptive.ops import OPS
    known = OPS.get(op)
    works: dict = {}   # the op's work_key -> the work it gives (equal keys, equal work)

    def work_of(variant, cfg):
        key = known.work_key(variant, cfg) if known is not None else None
        if key is None:
            return _work(known, variant, cfg, op_features)
        got = works.get(key)
        if got is None:
            got = works[key] = _work(known, variant, cfg, op_features)
        return got
    return [g | work_of(variant, cfg) for (variant, cfg), g in
            zip(candidates, geometries(candidates, scope, limits, op_features))]


def work(op: str, variant, config: Mapping, op_features: Mapping[str, float]
         ) -> dict[str, float]:
    """``work.*`` features of a candidate on an input (:meth:`adaptive.ops.base.Op.work`;
    ``{}`` for an op this process does not know)."""
    from adaptive.ops import OPS
    return _work(OPS.get(op), variant, config, op_features)


def _work(known, variant, config: Mapping, op_features: Mapping[str, float]) -> dict:
    if known is None:
        return {}
    return {f"work.{k}": float(v) for k, v in known.work(op_features, variant, config).items()}


# ---- launch geometry ------------------------------------------------------------------------

def resources_of(candidate) -> dict:
    """A candidate's kernel resources (registers, shared bytes, spills), if the variant has them.

    ``Variant.resources`` is either one flat table or a table per candidate label.
    """
    res = candidate.variant.resources
    if not res:
        return {}
    per_label = res.get(candidate.label)
    if isinstance(per_label, Mapping):
        return dict(per_label)
    return {k: v for k, v in res.items() if isinstance(v, (int, float))}


def geometry(variant, config: Mapping, scope: Mapping, limits: Mapping | None,
             op_features: Mapping[str, float] | None = None) -> dict[str, float]:
    """Launch-geometry features of a kernel candidate on an input: log2 of the CTAs and of
    the waves (CTAs / SMs), the last wave's fill, log2 threads per CTA; with the input's
    ``op_features``, log2 of its flops per CTA and per launched thread (the op's
    ``log2_flops`` less log2 of the CTAs, of CTAs x threads). A tree splits on one feature
    at a time, and the work each CTA and each thread does, which tells a split-KV decode's
    configs apart, is a difference of two and of three features. The shipped H200 pack's
    replay (10 folds by input, four dealings, exact timings) put decodes within 5% of the
    best 82% -> 91% of the time, prefills 96.5% -> 98.7%, softmax 93.3% -> 95.1%; the
    bytes per thread gained nothing there. ``{}`` for library and host variants, or when
    the device's limits are unknown. For many candidates of one input,
    :func:`geometries` is cheaper."""
    return geometries([(variant, config)], scope, limits, op_features)[0]


def geometries(candidates: Sequence[tuple], scope: Mapping, limits: Mapping | None,
               op_features: Mapping[str, float] | None = None) -> list[dict[str, float]]:
    """:func:`geometry` of each (variant, config) on one input (a miss: one call)."""
    flops = (op_features or {}).get("log2_flops")
    flops = None if flops is None else float(flops)
    sms = (limits or {}).get("sm_count")
    if not sms:
        return [{} for _ in candidates]
    base = {**scope, **limits}
    out = []
    exprs_of: dict = {}   # per variant: its expressions looked up once a call
    # (expression, the values of its names) -> its value: a miss's candidates share the
    # input's dims, and an expression reads few config values (``ceil_div(M, BM)`` meets
    # three BMs among a hundred candidates)
    values: dict = {}
    shapes: dict = {}     # (ctas, threads) -> its features: one dict (never mutated)

    def value(e, config):
        key = (e, *[config[n] if n in config else base[n] for n in e.names])
        v = values.get(key)
        if v is None:
            v = values[key] = int(e(base | config))
        return v
    tiles_of: dict = {}   # per variant: its grid's (extent, tile) pairs, where its op asks
    for variant, config in candidates:
        exprs = exprs_of.get(id(variant), False)
        if exprs is False:
            exprs = exprs_of[id(variant)] = _launch_exprs(variant)
            tiles_of[id(variant)] = _tile_exprs(variant) if _tile_fill(variant) else None
        if exprs is None:
            out.append({})
            continue
        try:
            ctas = math.prod(value(e, config) for e in exprs[0])
            threads = math.prod(value(e, config) for e in exprs[1])
        except Exception:  # noqa: BLE001 (a candidate that cannot launch here has no geometry)
            out.append({})
            continue
        if ctas < 1 or threads < 1:
            out.append({})
            continue
        geo = shapes.get((ctas, threads))
        if geo is None:
            waves = ctas / sms
            geo = shapes[(ctas, threads)] = {
                "geo.log2_ctas": math.log2(ctas), "geo.log2_waves": math.log2(waves),
                "geo.tail": waves / math.ceil(waves), "geo.log2_threads": math.log2(threads),
                **({} if flops is None else
                   {"geo.log2_flops_per_cta": flops - math.log2(ctas),
                    "geo.log2_flops_per_thread": flops - math.log2(ctas * threads)})}
        tiles = tiles_of.get(id(variant))
        if tiles is not None:
            geo = geo | {"geo.tile_fill": _filled(tiles, lambda e: value(e, config))}
        out.append(geo)
    return out


def _tile_fill(variant) -> bool:
    from adaptive.ops import OPS
    op = OPS.get(getattr(variant, "op", ""))
    return op is not None and op.tile_fill


def _filled(tiles, value) -> float:
    """The used share of the last tiles: the product over ``(extent, tile)`` grid dimensions
    of extent / (ceil(extent / tile) x tile); 1.0 where one cannot be read."""
    fill = 1.0
    for extent_e, tile_e in tiles:
        try:
            extent, tile = value(extent_e), value(tile_e)
        except Exception:  # noqa: BLE001 (a dimension that cannot be read counts as full)
            continue
        if extent > 0 and tile > 0:
            fill *= extent / (math.ceil(extent / tile) * tile)
    return fill


def _tile_exprs(variant) -> tuple:
    """(extent, tile) expressions of each grid dimension of a kernel variant written as one
    ``ceil_div(extent, tile)`` call (``ceil_div(N, LANES_N * VEC)``; not a product of two)."""
    out = []
    for e in (variant.launch or {}).get("grid", ()):
        call = ast.parse(str(e), mode="eval").body
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "ceil_div" and len(call.args) == 2):
            out.append(tuple(compile_expr(ast.unparse(a)) for a in call.args))
    return tuple(out)


def _launch_exprs(variant):
    """(grid expressions, block expressions) of a kernel variant, or None."""
    launch = variant.launch or {}
    if variant.language != "cuda" or "grid" not in launch:
        return None
    return (tuple(compile_expr(str(e)) for e in launch["grid"]),
            tuple(compile_expr(str(e)) for e in launch.get("block", ())))


def row_geometry(variant, row: Observation, limits: Mapping | None) -> dict[str, float]:
    """:func:`geometry` of a measurement row (its dims, dtype and config), with its
    candidate's :func:`work` (from the row's stored op features): what a row needs from
    its variant beyond the row itself."""
    scope = {**row.dims, "dtype": row.dtype, "itemsize": DTYPE_BYTES.get(row.dtype, 4)}
    return shape_and_work(row.op, [(variant, row.config)], scope, limits, row.features)[0]
