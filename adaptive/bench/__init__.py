"""Benchmarks that ship with the library: ``adaptive bench`` (:mod:`adaptive.bench.cli`:
the mixed workload, hot-path overhead and the selection benchmark), the selection
benchmark itself (:mod:`adaptive.bench.selection`) and the policy's replay on recorded
measurements (:mod:`adaptive.bench.replay`, ``adaptive pack replay``)."""


def verdict(adaptive_ratio: float, fixed_ratio: float) -> str:
    """Adaptive's steady/oracle against the best fixed choice's, judged on the ratios as
    printed (three decimals): "BEAT", "MATCHED" (equal as printed) or "did NOT beat"."""
    mine, theirs = round(adaptive_ratio, 3), round(fixed_ratio, 3)
    return "MATCHED" if mine == theirs else "BEAT" if mine < theirs else "did NOT beat"


def policy_argument(item: str) -> tuple[str, int | float | None]:
    """``NAME=VALUE``, a keyword argument of the learned policy given on a benchmark's
    command line (a number or None), as ``(name, value)``; ValueError naming what was
    expected."""
    name, sep, value = item.partition("=")
    if not sep or not name.isidentifier():
        raise ValueError(f"{item!r}: expected NAME=VALUE, e.g. race_ratio=1.5")
    if value == "None":
        return name, None
    try:
        return name, int(value) if value.lstrip("-").isdigit() else float(value)
    except ValueError:
        raise ValueError(f"{item!r}: the value must be a number or None") from None
