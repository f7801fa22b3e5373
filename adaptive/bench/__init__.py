"""Benchmarks that ship with the library: ``adaptive bench`` (:mod:`adaptive.bench.cli`:
the mixed workload, hot-path overhead and the selection benchmark), the selection
benchmark itself (:mod:`adaptive.bench.selection`) and the policy's replay on recorded
measurements (:mod:`adaptive.bench.replay`, ``adaptive pack replay``)."""


def verdict(adaptive_ratio: float, fixed_ratio: float) -> str:
    """Adaptive's steady/oracle against the best fixed choice's, judged on the ratios as
    printed (three decimals): "BEAT", "MATCHED" (equal as printed) or "did NOT beat"."""
    mine, theirs = round(adaptive_ratio, 3), round(fixed_ratio, 3)
    return "MATCHED" if mine == theirs else "BEAT" if mine < theirs else "did NOT beat"
