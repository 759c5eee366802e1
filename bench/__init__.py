"""Benchmarks: ratios against baselines measured in the same run (docs/benchmarks.md).

Each runs as a module from the repository root, `.venv/bin/python -m bench.NAME`, so `bench.*`
and `draftgate` import without a bench editing sys.path. bench/targets.py holds the verdict.
"""
