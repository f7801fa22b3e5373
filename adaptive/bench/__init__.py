"""Benchmarks that ship with the library: ``adaptive bench`` (:mod:`adaptive.bench.cli`:
the mixed workload, hot-path overhead and the selection benchmark), the selection
benchmark itself (:mod:`adaptive.bench.selection`) and the policy's replay on recorded
measurements (:mod:`adaptive.bench.replay`, ``adaptive pack replay``)."""
