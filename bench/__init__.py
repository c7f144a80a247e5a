"""The benchmarks, run from the repository root as ``python -m bench.bench_NAME``."""
