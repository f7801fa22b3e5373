"""Comparing and combining packs: :func:`merge`, :func:`diff`, the best candidate per input.

Rows are matched by :func:`row_key` (op, dims, dtype, variant, config); variants by id and
by the code that decides their behaviour (source, entry, space, launch), not their docs.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping, Sequence

import msgpack

from adaptive.errors import PackError
from adaptive.observation import Observation
from adaptive.packs.format import Pack, describe_device, new_pack, same_device
from adaptive.packs.install import code_of, recomputed_key
from adaptive.variants import Variant

def merge(packs: Sequence[Pack], allow_other_devices: bool = False) -> Pack:
    """One pack with every variant and row of ``packs`` (identical rows once).

    The packs must come from the same kind of device (unless ``allow_other_devices``, in
    which case the first pack's fingerprint is kept) and agree on every shared variant.
    """
    if not packs:
        raise ValueError("merge needs at least one pack")
    fp = packs[0].fingerprint
    for p in packs[1:]:
        if not same_device(fp, p.fingerprint) and not allow_other_devices:
            raise PackError("<merge>", f"packs come from different devices "
                            f"({describe_device(fp)} and {describe_device(p.fingerprint)}); "
                            "keep them as separate packs (several can be loaded) or pass "
                            "--allow-other-devices")
    variants: dict[str, Variant] = {}
    for p in packs:
        for v in p.variants:
            if v.id in variants and code_of(variants[v.id]) != code_of(v):
                raise PackError("<merge>", f"variant {v.id} differs between the packs (source "
                                f"hash {variants[v.id].source_hash[:12]} vs "
                                f"{v.source_hash[:12]}); rename one before merging")
            variants.setdefault(v.id, v)
    rows, seen = [], set()
    for p in packs:
        for r in p.rows:
            k = msgpack.packb(r.to_dict(), use_bin_type=True)
            if k not in seen:
                seen.add(k)
                rows.append(r)
    cubins = {c.key: c for p in packs for c in p.cubins}
    failures = [f for p in packs for f in p.failures]
    build = {"merged_from": [p.sha256 for p in packs]}
    return new_pack(variants.values(), rows, fp, cubins.values(), failures, build)


def fill_failures(pack: Pack, donors: Sequence[Pack]) -> tuple[Pack, list[Mapping]]:
    """``pack`` with each failed (input, variant, config) filled from the first donor that
    measured it, on the same kind of device, with the variant's code unchanged: the donor's
    rows for that input, variant and config are added and the failure dropped. Returns the new pack
    (its header's ``build`` lists what was filled, from which pack) and the failures still
    unfilled. A build whose first cases failed for a reason since fixed (run S72: torch not
    yet imported) keeps the rest of its measurements instead of being rebuilt whole."""
    ours = {v.id: code_of(v) for v in pack.variants}
    rows, failures, filled = list(pack.rows), [], []
    for f in pack.failures:
        vid = f"{f['op']}/{f['variant']}"
        dims, config = dict(f["dims"]), dict(f.get("config") or {})   # the failed config only
        for donor in donors:
            if not same_device(pack.fingerprint, donor.fingerprint):
                continue
            theirs = next((v for v in donor.variants if v.id == vid), None)
            if theirs is None or code_of(theirs) != ours.get(vid):
                continue
            found = [r for r in donor.rows if r.op == f["op"] and r.variant == f["variant"]
                     and r.dtype == f["dtype"] and dict(r.dims) == dims
                     and dict(r.config) == config]
            if found:
                rows += found
                filled.append({"op": f["op"], "variant": f["variant"], "dims": dims,
                               "dtype": f["dtype"], "rows": len(found), "from": donor.sha256})
                break
        else:
            failures.append(f)
    header = dict(pack.header)
    build = dict(header.get("build", {}))
    if filled:
        build["filled_failures"] = filled
    header["build"] = build
    return Pack(header, pack.variants, tuple(rows), pack.cubins, tuple(failures)), failures


def adopt(pack: Pack, registered: Iterable[Variant], ids: Sequence[str]) -> Pack:
    """``pack`` with the variants ``ids`` ("op/name") replaced by their ``registered``
    records, rows kept: for a variant whose file changed around a function whose measured
    work did not (a helper moved out, an entry added for another caller, a space narrowed
    to the configs that measured best), so the pack's rows of it are not dropped as another
    variant's. Rows and cubins of a config the registered space no longer holds are
    dropped (they would describe no candidate), and so are cubins whose key, recomputed
    from the registered source with the NVRTC that built the pack, differs (install would
    refuse them, warning). The header's ``build`` lists what was adopted, from which source
    hash to which, and how many rows and cubins were dropped. Every id must be in the pack
    and registered."""
    mine = {v.id: v for v in pack.variants}
    theirs = {v.id: v for v in registered}
    for vid in ids:
        if vid not in mine:
            raise ValueError(f"adopt: {vid} has no record in the pack; it has "
                             f"{', '.join(sorted(mine))}")
        if vid not in theirs:
            raise ValueError(f"adopt: {vid} is not a registered variant")
    compiler = pack.fingerprint.get("nvrtc")   # what built the pack's cubins

    def kept_row(r: Observation) -> bool:
        vid = f"{r.op}/{r.variant}"
        return vid not in ids or theirs[vid].space.holds(r.config)

    def kept_cubin(c) -> bool:
        if c.variant not in ids:
            return True
        if not theirs[c.variant].space.holds(c.config):
            return False
        if compiler is None:
            return mine[c.variant].source == theirs[c.variant].source
        return recomputed_key(c, theirs, compiler) is not None
    rows = [r for r in pack.rows if kept_row(r)]
    cubins = [c for c in pack.cubins if kept_cubin(c)]

    def dropped(items, kept, variant_of) -> dict:
        counts = collections.Counter(variant_of(x) for x in items)
        counts.subtract(variant_of(x) for x in kept)
        return counts
    rows_dropped = dropped(pack.rows, rows, lambda r: f"{r.op}/{r.variant}")
    cubins_dropped = dropped(pack.cubins, cubins, lambda c: c.variant)
    adopted = [{"variant": vid, "from": mine[vid].source_hash, "to": theirs[vid].source_hash,
                "rows_dropped": rows_dropped[vid], "cubins_dropped": cubins_dropped[vid]}
               for vid in ids]
    variants = [theirs[v.id] if v.id in ids else v for v in pack.variants]
    build = dict(pack.header.get("build", {}))
    build["adopted"] = list(build.get("adopted", [])) + adopted
    return new_pack(variants, rows, pack.fingerprint, cubins, pack.failures, build,
                    created_s=pack.header.get("created_s"))


def row_key(r: Observation) -> tuple:
    """(op, dims, dtype, variant, config): rows with equal keys measure the same thing."""
    return (r.op, tuple(sorted(r.dims.items())), r.dtype, r.variant,
            tuple(sorted((k, str(v)) for k, v in r.config.items())))


def diff(a: Pack, b: Pack) -> dict:
    """Variants added, removed and changed; per shared measurement the time ratio b/a;
    per input the best candidate in each pack where they differ."""
    va, vb = {v.id: v for v in a.variants}, {v.id: v for v in b.variants}
    ta, tb = _best_times(a.rows), _best_times(b.rows)
    shared = sorted(set(ta) & set(tb))
    ratios = {k: tb[k] / ta[k] for k in shared if ta[k] > 0 and math.isfinite(tb[k])}
    best_a, best_b = _best_per_input(ta), _best_per_input(tb)
    changed_best = {k: (best_a[k], best_b[k]) for k in sorted(set(best_a) & set(best_b))
                    if best_a[k][0] != best_b[k][0]}
    return {
        "same_device": same_device(a.fingerprint, b.fingerprint),
        "variants_added": sorted(set(vb) - set(va)),
        "variants_removed": sorted(set(va) - set(vb)),
        "variants_changed": sorted(k for k in set(va) & set(vb)
                                   if code_of(va[k]) != code_of(vb[k])),
        "rows": (len(a.rows), len(b.rows)),
        "only_in_a": len(set(ta) - set(tb)), "only_in_b": len(set(tb) - set(ta)),
        "ratios": ratios,
        "best_changed": changed_best,
    }


def best_per_input(rows: Iterable[Observation]) -> dict[tuple, tuple[str, float]]:
    """(op, dims, dtype) -> (label of the fastest candidate measured, its time in ms)."""
    return _best_per_input(_best_times(rows))


def _best_times(rows: Iterable[Observation]) -> dict[tuple, float]:
    out: dict[tuple, float] = {}
    for r in rows:
        k = row_key(r)
        out[k] = min(out.get(k, math.inf), r.time_ms)
    return out


def _best_per_input(times: Mapping[tuple, float]) -> dict[tuple, tuple[str, float]]:
    """(op, dims, dtype) -> (label of the fastest candidate, its time)."""
    best: dict[tuple, tuple[str, float]] = {}
    for (op, dims, dtype, variant, cfg), t in times.items():
        label = variant + (f"[{','.join(f'{k}={v}' for k, v in cfg)}]" if cfg else "")
        k = (op, dims, dtype)
        if k not in best or t < best[k][1]:
            best[k] = (label, t)
    return best
