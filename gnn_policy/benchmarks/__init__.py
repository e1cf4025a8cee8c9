"""Benchmark scripts: they print tables and write results files (run them on a GPU)."""
