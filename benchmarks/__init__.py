"""GPU benchmarks run by scripts/gpu-check: every ``benchmarks/gpu_*.py`` module."""
