"""Benchmarks (`make bench`): speed and memory goals are measured here, never asserted in unit
tests. Each bench_*.py module exposes `run() -> dict` of named figures and prints a table."""
