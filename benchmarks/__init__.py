"""Benchmarks (`make bench`): speed and memory goals are measured here, never asserted in unit
tests. Each bench_*.py module exposes `run() -> dict` of named figures and prints a table; every
figure carries its 90 % interval and a verdict against its goal (benchmarks/stats.py).

BENCH_QUICK=1 shrinks rounds and repetitions to check that the code paths work end to end (for
development); its figures are too loose to quote."""

import os

QUICK = os.environ.get("BENCH_QUICK", "") == "1"


def scaled(full: int, quick: int) -> int:
    """A repetition count: `full` normally, `quick` under BENCH_QUICK=1."""
    return quick if QUICK else full
