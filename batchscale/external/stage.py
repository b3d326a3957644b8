"""`batchscale analyze`: the analysis stage on tables a user brings — batchscale's own runs and
sweep tables, or results from elsewhere (a benchmark's published reference convergence points,
another team's training logs) — as Parquet or CSV. This is how a user checks batchscale against
results they already trust.

The files are read here (the type by extension), the user's columns renamed (`--column
steps_to_target=their_name`), checked and completed into the `runs` and `sweep` schemas
(`usertables`); the tables then go through the same `analyze` and
`render_html` as the pipeline's analysis stage (docs/architecture.md, "Data flow"). The CLI
validates the analysis table with the pipeline's suite (the checks package is another stage).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import platform
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

import batchscale
from batchscale import schemacheck, schemas
from batchscale.analysis.critical import ADAPTIVE_READ_LEVEL, BOOTSTRAP_CONFIDENCE
from batchscale.analysis.usertables import (
    NO_LR_NOTE,
    NO_RULE_NOTE,
    RUNS_INPUT,
    SWEEP_INPUT,
    UserTable,
    complete_runs,
    complete_sweep,
)
from batchscale.config import ExperimentConfig
from batchscale.envinfo import git_commit
from batchscale.errors import BadInput
from batchscale.names import quote
from batchscale.storage import write_bytes_atomic, write_table_atomic
from batchscale.storage.files import parse_parquet

FILE_TYPES = (".parquet", ".csv")
EXTERNAL = "external"
"""workload, experiment and device_name of an analysis of tables batchscale did not measure."""
MEASURED_ENV_FIELDS = ("experiment", "workload", "device_name", "torch_version")
"""Environment columns an input table may state of itself (external_env's "external" ones)."""
RUN_ID_PREFIX = "external-"
RUN_ID_DIGEST_CHARS = 12
ANALYSIS_FILE = "analysis.parquet"
SEARCH_DECISIONS_FILE = "decisions.parquet"
"""The adaptive search's decisions, beside its runs table (`batchscale converge`'s --out)."""
PLAN_FILE = "plan.parquet"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"
INPUT_SPECS = {"runs": RUNS_INPUT, "sweep": SWEEP_INPUT}
MAPPABLE = sorted(set(RUNS_INPUT.columns) | set(SWEEP_INPUT.columns))
"""Columns `--column NAME=SOURCE` may name (the runs and sweep schemas' columns)."""


@dataclass(frozen=True)
class ExternalInputs:
    """The user's tables, read, renamed, checked and completed into batchscale's schemas."""

    runs: UserTable
    sweep: UserTable | None
    mapping: dict[str, str]
    """Our column name → the user's, as given with --column."""
    decisions: pa.Table | None = None
    """The decisions of the adaptive search that chose these trials, when its table (with rows)
    lies beside the runs table, as `batchscale converge --strategy adaptive` writes them."""
    measured_env: dict = field(default_factory=dict)
    """What the runs table says of where it was measured (MEASURED_ENV_FIELDS with one value
    over its rows: a table batchscale wrote), used instead of "external"."""

    @property
    def searched(self) -> bool:
        """An adaptive search chose these trials (its decisions lie beside the runs)."""
        return self.decisions is not None

    @property
    def notes(self) -> list[str]:
        """What was assumed or derived, in plain words (printed, and kept in summary.json)."""
        searched = ([f"{self.runs.path.with_name(SEARCH_DECISIONS_FILE)} lies beside the runs: "
                     "an adaptive search chose these trials, so B_crit's interval is read at "
                     f"{ADAPTIVE_READ_LEVEL:.0%} to hold its claimed "
                     f"{BOOTSTRAP_CONFIDENCE:.0%} (docs/convergence.md)"] if self.searched
                    else [])
        return [*self.runs.notes, *(self.sweep.notes if self.sweep else []), *searched]

    def default_run_id(self, config: ExperimentConfig) -> str:
        """external-<digest of the input files, the mapping and the analysis settings>: the
        same inputs analysed the same way land in the same directory."""
        digest = hashlib.sha256()
        for part in (self.runs.sha256, self.sweep.sha256 if self.sweep else "",
                     json.dumps(self.mapping, sort_keys=True),
                     config.analysis.model_dump_json()):
            digest.update(part.encode() + b"\0")
        return RUN_ID_PREFIX + digest.hexdigest()[:RUN_ID_DIGEST_CHARS]


@dataclass(frozen=True)
class ExternalAnalysis:
    """What `batchscale analyze` writes: the analysis table, the summary and the report."""

    run_id: str
    table: pa.Table
    """The analysis table (schema `analysis`, with the environment columns)."""
    summary: dict
    """summary.json: inputs, notes, settings, the typed summary, metrics and the narrative."""
    markdown: str
    report_html: str
    plan_table: pa.Table
    """The what-if plan table (schema `plan`; no rows when the tables lack what it needs)."""


def parse_column_mapping(items: list[str] | None) -> dict[str, str]:
    """`--column NAME=SOURCE` flags → {NAME: SOURCE}. NAME is a runs or sweep column, or
    `runs.NAME` / `sweep.NAME` for one table only (when the two tables name it differently)."""
    mapping: dict[str, str] = {}
    for item in items or []:
        name, sep, source = (part.strip() for part in item.partition("="))
        if not sep or not name or not source:
            raise BadInput(f"--column {quote(item)}: write NAME=SOURCE, e.g. "
                           "--column steps_to_target=steps (NAME is batchscale's column, SOURCE "
                           "the column in your file; sweep.NAME for the sweep table only)")
        table, _, column = name.rpartition(".")
        allowed = INPUT_SPECS[table].columns if table in INPUT_SPECS else MAPPABLE
        if (table and table not in INPUT_SPECS) or column not in allowed:
            close = difflib.get_close_matches(column, allowed, n=1)
            hint = f" Did you mean {quote(close[0])}?" if close else ""
            raise BadInput(f"--column {quote(item)}: {quote(name)} is not a column batchscale "
                           f"reads.{hint} The runs table's: {RUNS_INPUT.needs()}; optional "
                           f"{', '.join(RUNS_INPUT.optional)}, target_metric, target_value. "
                           f"Every name allowed: {', '.join(MAPPABLE)}, each also as runs.NAME "
                           "or sweep.NAME for one table only")
        if name in mapping:
            raise BadInput(f"--column: {quote(name)} is mapped twice ({quote(mapping[name])} "
                           f"and {quote(source)}); give it once")
        mapping[name] = source
    return mapping


def mapping_for(mapping: dict[str, str], kind: str) -> dict[str, str]:
    """The --column mapping of one table: plain NAMEs, then `kind.NAME` (which wins)."""
    plain = {name: source for name, source in mapping.items() if "." not in name}
    prefix = f"{kind}."
    return plain | {name.removeprefix(prefix): source for name, source in mapping.items()
                    if name.startswith(prefix)}


def read_inputs(runs_path: str, sweep_path: str | None,
                mapping: dict[str, str]) -> ExternalInputs:
    """Read, rename, check and complete the user's tables; BadInput (nothing written) naming
    the file, the column and the rows on any problem."""
    raw = {"runs": read_user_table(runs_path, "runs table")}
    if sweep_path:
        raw["sweep"] = read_user_table(sweep_path, "sweep table")
    _check_mapping_sources(mapping, raw)
    runs = complete_runs(raw["runs"].renamed(mapping_for(mapping, "runs")))
    sweep = complete_sweep(raw["sweep"].renamed(mapping_for(mapping, "sweep"))) \
        if sweep_path else None
    return ExternalInputs(runs, sweep, mapping, decisions=search_decisions(Path(runs_path)),
                          measured_env=measured_env(raw["runs"].table))


def measured_env(table: pa.Table) -> dict:
    """MEASURED_ENV_FIELDS the table holds with exactly one value over its rows (a runs table
    batchscale wrote has them all), so its analysis is labelled with its workload and device
    rather than "external"; fields absent, null or mixed stay unknown."""
    known = {}
    for name in MEASURED_ENV_FIELDS:
        kind = table.schema.field(name).type if name in table.column_names else None
        if kind is None or not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            continue
        values = {v for v in table.column(name).to_pylist() if v}
        if len(values) == 1:
            known[name] = values.pop()
    return known


SWEEP_CONDITION_FIELDS = ("threads", "cuda_version")
"""Environment fields a sweep row keeps from the user's table when it has them: the
measurement-quality notes read them per row (a CPU sweep on several threads)."""


def with_sweep_conditions(sweep: pd.DataFrame, table: pa.Table) -> pd.DataFrame:
    """`sweep` with SWEEP_CONDITION_FIELDS taken row by row from the user's `table` (a sweep
    batchscale wrote has them), instead of this analysis's own environment."""
    kept = {name: table.column(name).to_pylist() for name in SWEEP_CONDITION_FIELDS
            if name in table.column_names}
    return sweep.assign(**kept) if kept else sweep


def search_decisions(runs_path: Path) -> pa.Table | None:
    """The decisions table of an adaptive search, with rows, beside the runs, held to its
    schema (columns added since it was written read as null); None when there is none."""
    path = runs_path.with_name(SEARCH_DECISIONS_FILE)
    if not path.is_file():
        return None
    try:
        table = schemacheck.with_added_columns("decisions", parse_parquet(str(path), str(path)))
        table = schemacheck.check_schema("decisions", table)
    except BadInput as err:
        raise BadInput(f"{path} beside the runs table cannot be read as the adaptive search's "
                       f"decisions: {err}; move it away to analyze the runs as a grid") from None
    return table if table.num_rows else None


def _check_mapping_sources(mapping: dict[str, str], raw: dict[str, UserTable]) -> None:
    """Each SOURCE is a column of the table(s) its NAME is for."""
    for name, source in mapping.items():
        table, _, _ = name.rpartition(".")
        if table and table not in raw:
            raise BadInput(f"--column {name}={source}: no {table} table given (--sweep FILE)")
        candidates = [raw[table]] if table else list(raw.values())
        if not any(source in t.table.column_names for t in candidates):
            found = "; ".join(f"{t.label}: {', '.join(t.table.column_names)}"
                              for t in candidates)
            raise BadInput(f"--column {name}={source}: no column {quote(source)} in the input "
                           f"(columns found — {found})")


def _parquet_by_content(path: Path) -> str:
    """".parquet" for a file without an extension that starts with Parquet's magic bytes (a
    pipeline run's artifacts under .batchscale/pipeline_root are named without one), else ""."""
    try:
        with path.open("rb") as fh:
            return ".parquet" if fh.read(4) == b"PAR1" else ""
    except OSError:
        return ""


def read_user_table(path_text: str, what: str) -> UserTable:
    """A Parquet or CSV file (by extension), read whole; BadInput naming the file otherwise."""
    path = Path(path_text)
    label = f"{what} {quote(path_text)}"
    suffix = path.suffix.lower() or _parquet_by_content(path)
    if not suffix and not path.is_file():
        raise BadInput(f"{label} does not exist or is not a file")
    if suffix not in FILE_TYPES:
        raise BadInput(f"{label}: unknown file type {quote(suffix or '(no extension)')}; "
                       f"allowed: {', '.join(FILE_TYPES)} (by extension, or a Parquet file "
                       "without one, as a pipeline run's artifacts are)")
    if not path.is_file():
        raise BadInput(f"{label} does not exist or is not a file")
    try:
        with path.open("rb") as fh:
            sha256 = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as err:
        raise BadInput(f"{label} cannot be read: {err.strerror}") from None
    table = parse_parquet(str(path), label) if suffix == ".parquet" else _read_csv(path, label)
    duplicated = schemacheck.duplicated_columns(table)
    if duplicated:
        raise BadInput(f"{label} has duplicated columns {', '.join(map(quote, duplicated))}; "
                       "each column name must appear once")
    if table.num_rows == 0:
        raise BadInput(f"{label} has no rows")
    return UserTable(label, path, sha256, table, source_columns=tuple(table.column_names))


def _read_csv(path: Path, label: str) -> pa.Table:
    """A CSV with a header line; empty cells are empty (null) whatever the column's type."""
    try:
        table = pacsv.read_csv(str(path), convert_options=pacsv.ConvertOptions(
            strings_can_be_null=True))
        _ = table.column_names  # decoded only when asked: a non-UTF-8 header fails here
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise BadInput(f"{label} is not a readable CSV file (UTF-8 text, a header line, then "
                       f"one line per row): {err}") from None
    return table


def external_env(run_id: str, config_hash: str) -> dict:
    """The environment columns of an analysis of tables measured elsewhere: the analysis's own
    code version, and "external" where the measuring machine is unknown. threads and
    world_size must be ≥ 1 (schema and suite); 1 says nothing about the original runs."""
    return {
        "run_id": run_id,
        "config_hash": config_hash,
        "experiment": EXTERNAL,
        "workload": EXTERNAL,
        "git_commit": git_commit(),
        "batchscale_version": batchscale.__version__,
        "torch_version": EXTERNAL,
        "python_version": platform.python_version(),
        "device_name": EXTERNAL,
        "threads": 1,
        "world_size": 1,
    }


def analyze_inputs(inputs: ExternalInputs, config: ExperimentConfig,
                   run_id: str, warmup_steps: int | None = None) -> ExternalAnalysis:
    """The pipeline's analysis (`analyze`, `render_html`) on the completed tables;
    `warmup_steps`: the warm-up the runs trained with, where known (the config they ran
    with), said with the learning rate."""
    from batchscale.analysis.analyze import analyze
    from batchscale.analysis.stage import settings_for
    from batchscale.report.render import render_html

    env = {**external_env(run_id, config.config_hash), **inputs.measured_env}
    runs = schemas.make_table("runs", inputs.runs.rows, env).to_pandas()
    sweep = (with_sweep_conditions(schemas.make_table("sweep", inputs.sweep.rows, env)
                                   .to_pandas(), inputs.sweep.table)
             if inputs.sweep else None)
    settings = settings_for(config.analysis, inputs.searched)
    result = analyze(sweep, runs, None, settings,
                     learning_rates_given=NO_LR_NOTE not in inputs.runs.notes,
                     lr_rule_given=NO_RULE_NOTE not in inputs.runs.notes,
                     warmup_steps=warmup_steps)
    table = schemas.make_table("analysis", result.rows, env)
    plan, plan_missing = what_if_plan(sweep, runs, result.rows)
    title = f"batchscale analyze: {inputs.runs.path.name} ({run_id})"
    search = _search_section(inputs, runs, config)
    page = render_html(result, sweep, runs, None, title=title, plan=plan,
                       plan_missing=plan_missing, adaptive=search)
    summary = {
        "run_id": run_id,
        "inputs": {"runs": inputs.runs.describe(),
                   "sweep": inputs.sweep.describe() if inputs.sweep else None},
        "column_mapping": inputs.mapping,
        "notes": inputs.notes,
        "analysis_settings": settings.model_dump(mode="json"),
        "summary": json_safe(result.summary.stored()),
        "metrics": result.metrics,
        "markdown": result.markdown,
        "plan": plan_missing or "in report.html and plan.parquet",
        "adaptive_search": list(search.sentences) if search else None,
    }
    from batchscale.planner.table import table_rows

    plan_table = schemas.make_table("plan", table_rows(plan) if plan else [], env)
    markdown = result.markdown + (_search_markdown(search) if search else "")
    return ExternalAnalysis(run_id, table, summary, markdown, page, plan_table)


def _search_section(inputs: ExternalInputs, runs: pd.DataFrame, config: ExperimentConfig):
    """The report's "Adaptive search" section when a search chose the trials: its cost against
    the grid its decisions record, its interval read as the analysis reads it."""
    if inputs.decisions is None:
        return None
    from batchscale.adaptive.section import adaptive_section
    from batchscale.analysis.critical import read_level

    return adaptive_section(inputs.decisions.to_pandas(), runs,
                            range_factor=config.analysis.b_crit_range_factor,
                            read_level=read_level(config.analysis, adaptive=True))


def _search_markdown(section) -> str:
    return "\n\n## Adaptive search\n\n" + "\n\n".join(section.sentences) + "\n"


def what_if_plan(sweep: pd.DataFrame | None, runs: pd.DataFrame, rows: list[dict]):
    """The pipeline's what-if plan (worker counts the runs measured, and 4 and 8) when the
    tables carry what it needs: batchscale's own runs record their gradient bytes and
    all-reduce probe; a table from elsewhere gets the reason there is none."""
    from batchscale.planner.table import default_plan

    workers = {int(w) for w in pd.to_numeric(runs.get("workers", pd.Series(dtype=float)),
                                             errors="coerce").dropna()}
    return default_plan(sweep, runs, pd.DataFrame(rows), workload=None,
                        configured_workers=sorted(workers or {1}))


def json_safe(value):
    """`value` with NaN as null and ±inf as the strings "inf" / "-inf" (strict JSON has
    neither), tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_outputs(analysis: ExternalAnalysis, out_dir: Path) -> dict[str, Path]:
    """analysis.parquet, plan.parquet, summary.json and report.html in `out_dir`, each
    written atomically."""
    paths = {"analysis": out_dir / ANALYSIS_FILE, "plan": out_dir / PLAN_FILE,
             "summary": out_dir / SUMMARY_FILE, "report": out_dir / REPORT_FILE}
    write_table_atomic(paths["analysis"], analysis.table)
    write_table_atomic(paths["plan"], analysis.plan_table)
    text = json.dumps(analysis.summary, indent=1, allow_nan=False, ensure_ascii=False)
    write_bytes_atomic(paths["summary"], (text + "\n").encode())
    write_bytes_atomic(paths["report"], analysis.report_html.encode())
    return paths
