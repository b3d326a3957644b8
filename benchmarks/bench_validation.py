"""What validating a table with great-expectations costs, as the adapter runs it
(`checks/gx.py` `run_suite`: one BASIC pass over the suite, then the offending rows' positions
only where values offend: those expectations one by one, or the whole suite again where more
than a third offend) against one SUMMARY pass over the whole suite (what it ran before),
on a real sweep table (a short digits-mlp sweep measured here): the table as it is, with two
offending values, and with every number of its first row broken. Both in this process, after
GX's import and context (paid once per process either way), paired and interleaved over
ROUNDS rounds; the ratio of times, adapter ÷ one full pass. Reported, no goal: the figure behind
the FIRST_PASS note in checks/gx.py and docs/architecture.md.

    python -m benchmarks.run bench_validation
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batchscale.checks import gx, suites
from batchscale.checks.validate import validate_table
from batchscale.config import SweepConfig
from batchscale.envinfo import environment
from batchscale.sweep.sweep import sweep
from benchmarks import scaled
from benchmarks.stats import median_figure, paired_round, ratio_figure

ROUNDS = scaled(10, 2)
KIND = "sweep"


def real_sweep_table(folder: Path) -> pa.Table:
    cfg = SweepConfig(batch_sizes=[16, 64, 256], input_modes=["synthetic"], time_budget_s=0.5)
    env = environment(run_id="bench", config_hash="bench", experiment="bench_validation",
                      workload="digits-mlp")
    path = folder / "sweep.parquet"
    sweep(cfg, "digits-mlp", env, path, log=lambda _line: None)
    return pq.read_table(path)


def variants(clean: pa.Table) -> dict[str, pa.Table]:
    rows = clean.to_pylist()
    few = [dict(r) for r in rows]
    few[0]["samples_per_s"] = -5.0
    few[-1]["timed_steps"] = 0
    many = [dict(r) for r in rows]
    many[0] = {c: (-v - 1 if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
               for c, v in many[0].items()}
    return {"clean": clean, "two offending values": pa.Table.from_pylist(few, clean.schema),
            "every number of a row broken": pa.Table.from_pylist(many, clean.schema)}


def timers(tbl: pa.Table):
    """(adapter, one full pass, how many expectations `tbl` offends): the first two each time
    one validation of `tbl` as validate_table feeds it."""
    suite = suites.load_suite(KIND)
    meta = suite["meta"]
    df = suites.validation_frame(tbl, meta["derived_columns"])
    context = suites.checked_context(KIND, suite, {})
    values = {n: p["value"] for n, p in
              suites.resolve_parameters(meta["parameters"], context, df).items()}
    definition = gx._validation_definition(KIND)
    offending = sum(gx._offends(r) for r in gx.suite_results(definition, df, values,
                                                              gx.FIRST_PASS))

    def adapter() -> float:
        started = time.perf_counter()
        gx.run_suite(KIND, df, values, meta["row_keys"])
        return time.perf_counter() - started

    def full_pass() -> float:
        started = time.perf_counter()
        gx.suite_results(definition, df, values, gx.OFFENDERS)
        return time.perf_counter() - started

    return adapter, full_pass, offending


def run() -> dict:
    with tempfile.TemporaryDirectory() as folder:
        clean = real_sweep_table(Path(folder))
    validate_table(KIND, clean)  # GX's import and context, once, before any timing
    result = {"rows": clean.num_rows}
    for name, tbl in variants(clean).items():
        adapter, full_pass, offending = timers(tbl)
        pairs = [paired_round(r, adapter, full_pass) for r in range(ROUNDS)]
        result[name] = {
            "offending_expectations": offending,
            "adapter_s": median_figure([a for a, _ in pairs]),
            "one_full_pass_s": median_figure([b for _, b in pairs]),
            "adapter_over_full_pass": ratio_figure([a for a, _ in pairs],
                                                   [b for _, b in pairs]),
        }
    print(f"validating a real {KIND} table ({clean.num_rows} rows), {ROUNDS} paired rounds:")
    for name in variants(clean):
        r = result[name]
        print(f"  {name} ({r['offending_expectations']} of the suite's expectations offend): "
              f"adapter {r['adapter_s'].text()} s; one full pass "
              f"{r['one_full_pass_s'].text()} s; adapter ÷ full pass "
              f"{r['adapter_over_full_pass'].text()}")
    return result
