"""Runs and sweep tables a user brings (Parquet or CSV, from batchscale or elsewhere), checked and
completed into batchscale's `runs` and `sweep` schemas for `batchscale analyze` (`external`).

A table needs only a few columns (RUNS_INPUT, SWEEP_INPUT); the others get the value that says
"not given" (null, NaN, a default stated in a note). Every refusal is a BadInput naming the file,
the column, the rows (data rows counted from 1, the CSV header not counted) and what is allowed.
Text in a number column is refused, not parsed; whole-valued floats (a CSV column with a gap,
written by pandas) are read as integers; fractional step and example counts are rounded up.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import get_args

import pyarrow as pa

from batchscale import schemas
from batchscale.config import section_models
from batchscale.errors import BadInput
from batchscale.fits import TIMING_MODES
from batchscale.names import quote
from batchscale.schemas import OLD_LR_RULES, TUNED_RULE, RunStatus, TrialStatus

KNOWN_LR_RULES: tuple[str, ...] = get_args(
    get_args(section_models()["convergence"].model_fields["lr_rules"].annotation)[0])
"""The LR rules the config, and the runs and analysis suites, allow."""
DEFAULT_LR_RULE = TUNED_RULE
"""A table without lr_rule: S(B) is the fewest steps over the learning rates given per batch
size (median over seeds), which is what the tuned rule means."""
PLACEHOLDER_LR = 1.0
"""A table without lr: every run at a batch size counts as one learning rate (the analysis
groups by it and never reports it: NO_LR_NOTE tells it so)."""
NO_LR_NOTE = "runs: no lr column: the runs at a batch size count as one learning rate"
NO_RULE_NOTE = (f"runs: rows without lr_rule are labelled {DEFAULT_LR_RULE!r}: S(B) is the "
                "fewest steps over the learning rates given per batch size (median over seeds)")
"""Said when some rows give no lr_rule: the analysis then says the rule is not given."""
ROUNDED_UP = ("steps_to_target", "examples_to_target", "steps_run")
"""Counts that may come as fractions (averaged, or epochs × dataset size) and are rounded up:
a partial step is a step taken."""
INT64_LIMIT = 2**63
ENV_NAMES = frozenset(f.name for f in schemas.ENV_FIELDS)
SHOWN_ROWS = 8


@dataclass(frozen=True)
class InputSpec:
    """The columns of one kind of table a user may bring."""

    kind: str
    required: tuple[str, ...]
    one_of: tuple[str, ...]
    """At least one of these (the other is derived)."""
    optional: tuple[str, ...]
    """The optional columns a message lists; any other column of the schema is read too."""

    @property
    def columns(self) -> list[str]:
        return list(schemas.TABLES[self.kind].names)

    def needs(self) -> str:
        return f"{', '.join(self.required)}, and {' or '.join(self.one_of)}"


RUNS_INPUT = InputSpec("runs", ("batch_size",), ("steps_to_target", "examples_to_target"),
                       ("seed", "lr_rule", "lr", "status", "workers", "time_to_target_s",
                        "train_time_s", "steps_run"))
SWEEP_INPUT = InputSpec("sweep", ("batch_size",), ("step_time_median_s", "samples_per_s"),
                        ("input_mode", "status", "peak_memory_bytes"))


@dataclass(frozen=True)
class UserTable:
    """One table as read from the user's file; `rows` and `notes` once completed."""

    label: str
    """e.g. "runs table 'results.csv'" — how messages name it."""
    path: Path
    sha256: str
    table: pa.Table
    rows: list[dict] = field(default_factory=list)
    notes: tuple[str, ...] = ()
    source_columns: tuple[str, ...] = ()
    """The file's own column names (before --column renamed them)."""
    mapped_from: dict[str, str] = field(default_factory=dict)
    """{ours: theirs} for the columns --column renamed, so messages name the user's column."""

    def renamed(self, mapping: dict[str, str]) -> UserTable:
        """The table with the user's columns renamed to ours ({ours: theirs}, from --column)."""
        names = self.table.column_names
        mapped = {ours: theirs for ours, theirs in mapping.items() if theirs in names}
        for ours, theirs in mapped.items():
            if ours in names and ours != theirs:
                raise BadInput(f"{self.label} has both {quote(ours)} and {quote(theirs)}, which "
                               f"--column {ours}={theirs} maps to it; keep one of them")
        sources = list(mapped.values())
        twice = sorted({s for s in sources if sources.count(s) > 1})
        if twice:
            raise BadInput(f"--column maps {', '.join(map(quote, twice))} of {self.label} to "
                           "more than one column; map each of your columns once")
        ours_of = {theirs: ours for ours, theirs in mapped.items()}
        return replace(self, table=self.table.rename_columns([ours_of.get(c, c) for c in names]),
                       mapped_from={**self.mapped_from, **{o: t for o, t in mapped.items()
                                                           if o != t}})

    def describe(self) -> dict:
        return {"path": str(self.path.resolve()), "sha256": self.sha256,
                "rows": self.table.num_rows, "columns": list(self.source_columns)}

    def refuse(self, column: str, rows: list[int], problem: str, allowed: str) -> BadInput:
        theirs = self.mapped_from.get(column)
        name = (f"{quote(theirs)} (read as {quote(column)} by --column {column}={theirs})"
                if theirs else quote(column))
        return BadInput(f"{self.label}: column {name} {problem} in {rows_text(rows)}; {allowed}")


def rows_text(rows: list[int]) -> str:
    """'rows 3, 7, 12 (data rows counted from 1)', at most SHOWN_ROWS named."""
    shown = [str(i + 1) for i in rows[:SHOWN_ROWS]]
    more = f" and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
    if len(rows) == 1:
        return f"row {shown[0]} (data rows counted from 1)"
    return f"rows {', '.join(shown)}{more} (data rows counted from 1)"


# ------------------------------------------------------------------------------ typed columns
# Words a user's own name for a needed column tends to hold (short ones must be a whole word:
# 'bs' but not 'abs_error'). None for the sweep's step time: a guess could not know its unit.
LIKELY_WORDS = {"batch_size": ("batch", "bs"), "steps_to_target": ("step", "iter"),
                "examples_to_target": ("example", "sample"),
                "samples_per_s": ("per_s", "throughput", "sps")}


def _check_present(user: UserTable, spec: InputSpec) -> None:
    names = user.table.column_names
    missing = [c for c in spec.required if c not in names]
    if not any(c in names for c in spec.one_of):
        missing.append(" or ".join(spec.one_of))
    if missing:
        example = " ".join(f"--column {ours}={theirs}" for ours, theirs in
                           _likely_sources(spec, names).items())
        raise BadInput(
            f"{user.label} lacks {'; '.join(missing)}. Required: {spec.needs()}. Optional: "
            f"{', '.join(spec.optional)} (and any other column of batchscale's {spec.kind} "
            f"table). Columns found: {', '.join(user.source_columns or names) or 'none'}. "
            f"Name a column of yours with --column NAME=SOURCE, e.g. "
            f"{example or f'--column {spec.one_of[0]}=<your column>'}")


def _likely_sources(spec: InputSpec, names: list[str]) -> dict[str, str]:
    """A guess at which of the user's columns holds each needed one that is missing: the only
    unclaimed column holding one of its LIKELY_WORDS (for one_of, the first that has one)."""
    free = [n for n in names if n not in spec.columns]
    guesses: dict[str, str] = {}
    for group in [[c] for c in spec.required] + [list(spec.one_of)]:
        if any(c in names for c in group):
            continue
        for ours in group:
            found = [n for n in free if n not in guesses.values() and _holds_word(n, ours)]
            if len(found) == 1:
                guesses[ours] = found[0]
                break
    return guesses


def _holds_word(name: str, ours: str) -> bool:
    lowered = name.lower()
    words = re.split(r"[^a-z0-9]+", lowered)
    return any(w in words if len(w) <= 3 else w in lowered for w in LIKELY_WORDS.get(ours, ()))


def typed_columns(user: UserTable, spec: InputSpec, notes: list[str]) -> dict[str, list]:
    """The schema's columns that the table has, as Python values of the schema's types (None
    for an empty cell or NaN); a note names the columns that are ignored and the counts that
    were rounded up."""
    _check_present(user, spec)
    schema = schemas.TABLES[spec.kind]
    typed, ignored = {}, []
    for name in user.table.column_names:
        if name in schema.names:
            typed[name] = _convert(user, name, schema.field(name).type, notes)
        elif name not in ENV_NAMES:
            ignored.append(name)
    if ignored:
        notes.append(f"{spec.kind}: ignored columns (not in batchscale's {spec.kind} table): "
                     f"{', '.join(ignored)}")
    return typed


def _convert(user: UserTable, name: str, kind: pa.DataType, notes: list[str]) -> list:
    values = user.table.column(name).to_pylist()
    if pa.types.is_string(kind):
        return [None if v is None else str(v) for v in values]
    if pa.types.is_boolean(kind):
        bad = [i for i, v in enumerate(values) if v is not None and not isinstance(v, bool)]
        if bad:
            raise user.refuse(name, bad, f"holds {quote(values[bad[0]])}", "expected true/false")
        return values
    whole = pa.types.is_integer(kind)
    expected = "expected whole numbers" if whole else "expected numbers"
    bad = [i for i, v in enumerate(values)
           if v is not None and (isinstance(v, bool) or not isinstance(v, int | float | Decimal))]
    if bad:
        # Name the cells that are not numbers at all (the whole column is then read as text).
        bad = [i for i in bad if not _looks_numeric(values[i])] or bad
        raise user.refuse(name, bad, f"holds {quote(values[bad[0]])} "
                          f"({user.table.schema.field(name).type})", expected)
    numbers = [None if v is None or math.isnan(v) else float(v) for v in values]
    infinite = [i for i, v in enumerate(numbers) if v is not None and math.isinf(v)]
    if infinite:
        raise user.refuse(name, infinite, "is not finite", f"{expected}, or an empty cell")
    return _whole(user, name, numbers, values, notes) if whole else numbers


def _looks_numeric(value) -> bool:
    try:
        float(str(value))
    except ValueError:
        return False
    return True


def _whole(user: UserTable, name: str, numbers: list, values: list, notes: list[str]) -> list:
    outside = [i for i, v in enumerate(numbers) if v is not None and abs(v) >= INT64_LIMIT]
    if outside:
        raise user.refuse(name, outside, "is too large", "expected numbers below 2**63")
    fractional = [i for i, v in enumerate(numbers) if v is not None and not v.is_integer()]
    if fractional and name not in ROUNDED_UP:
        raise user.refuse(name, fractional, f"holds {quote(values[fractional[0]])}",
                          "expected whole numbers")
    if fractional:
        notes.append(f"{name}: {len(fractional)} values that were not whole rounded up (a "
                     "partial step is a step taken)")
    # Integers straight from the file keep every digit (a float loses them past 2**53).
    return [None if n is None else v if isinstance(v, int) else math.ceil(n)
            for v, n in zip(values, numbers, strict=True)]


def _require(user: UserTable, name: str, values: list, test: Callable, problem: str,
             allowed: str, *, empty_ok: bool = True) -> None:
    bad = [i for i, v in enumerate(values)
           if (v is None and not empty_ok) or (v is not None and not test(v))]
    if bad:
        value = values[bad[0]]
        what = "is empty" if value is None else f"{problem} ({quote(value)})"
        raise user.refuse(name, bad, what, allowed)


def _positive(v) -> bool:
    return v > 0


def _non_negative(v) -> bool:
    return v >= 0


# ------------------------------------------------------------------------------ runs
def complete_runs(user: UserTable) -> UserTable:
    """The runs table in the `runs` schema (without the environment columns), with notes on
    every value that was assumed or derived."""
    notes: list[str] = []
    typed = typed_columns(user, RUNS_INPUT, notes)
    n = user.table.num_rows
    col = {name: typed.get(name, [None] * n) for name in RUNS_INPUT.columns}
    _require(user, "batch_size", col["batch_size"], _positive, "is not positive",
             "batch sizes are whole numbers ≥ 1", empty_ok=False)
    steps, examples = _steps_and_examples(user, col, notes)
    col["steps_to_target"], col["examples_to_target"] = steps, examples
    _fill_status(user, col, "status" in typed, notes)
    _fill_run_settings(user, col, typed, notes)
    _fill_run_times(user, col)
    col["trial_id"] = [f"row-{i + 1}" if t is None else t for i, t in enumerate(col["trial_id"])]
    col["target_val_accuracy"] = [math.nan if v is None else v for v in col["target_val_accuracy"]]
    _refuse_duplicate_runs(user, col, typed)
    rows = [{name: col[name][i] for name in RUNS_INPUT.columns} for i in range(n)]
    return replace(user, rows=rows, notes=tuple(notes))


def _steps_and_examples(user: UserTable, col: dict, notes: list[str]) -> tuple[list, list]:
    """steps_to_target and examples_to_target, each derived from the other where missing:
    S = ceil(E/B), E = S·B; both given must agree within one batch."""
    batch, steps, examples = col["batch_size"], col["steps_to_target"], col["examples_to_target"]
    for name in ("steps_to_target", "examples_to_target"):
        _require(user, name, col[name], _positive, "is not positive",
                 "steps and examples to target are > 0, or empty for a run that did not reach "
                 "the target")
    both = [i for i in range(len(batch)) if steps[i] is not None and examples[i] is not None]
    disagree = [i for i in both if abs(examples[i] - steps[i] * batch[i]) >= batch[i]]
    if disagree:
        raise user.refuse("examples_to_target", disagree, "disagrees with steps_to_target × "
                          "batch_size", "give one of the two, or values that agree")
    derived = [i for i in range(len(batch)) if steps[i] is None and examples[i] is not None]
    if derived:
        notes.append(f"runs: steps_to_target = examples_to_target ÷ batch_size, rounded up to "
                     f"whole steps, in {len(derived)} rows")
    steps = [math.ceil(e / b) if s is None and e is not None else s
             for s, e, b in zip(steps, examples, batch, strict=True)]
    examples = [s * b if e is None and s is not None else e
                for s, e, b in zip(steps, examples, batch, strict=True)]
    return steps, examples


def _fill_status(user: UserTable, col: dict, given: bool, notes: list[str]) -> None:
    """status: as given (reached, not_reached, diverged), else reached where steps are given
    and not_reached where they are empty. A "reached" row without steps is not reached."""
    allowed = [s.value for s in RunStatus]
    _require(user, "status", col["status"], lambda v: v in allowed, "is not a run status",
             f"allowed: {', '.join(allowed)}, or an empty cell")
    steps = col["steps_to_target"]
    status = [s if s is not None else RunStatus.REACHED.value if n is not None
              else RunStatus.NOT_REACHED.value for s, n in zip(col["status"], steps, strict=True)]
    unreached = {i for i, (s, n) in enumerate(zip(status, steps, strict=True))
                 if n is None and s == RunStatus.REACHED.value}
    status = [RunStatus.NOT_REACHED.value if i in unreached else s
              for i, s in enumerate(status)]
    empty = [i for i, n in enumerate(steps) if n is None]
    if unreached:
        notes.append(f"runs: {rows_text(sorted(unreached))} say reached but give no steps or "
                     "examples to target: counted as not reached")
    elif empty and not given:
        notes.append(f"runs: {rows_text(empty)} give no steps or examples to target (empty or "
                     "NaN): counted as not reached")
    col["status"] = status


def _fill_run_settings(user: UserTable, col: dict, typed: dict, notes: list[str]) -> None:
    """lr_rule, lr, seed and workers: checked where given, defaulted (with a note) where not."""
    old = sorted({v for v in col["lr_rule"] if v in OLD_LR_RULES})
    if old:
        notes.append("runs: lr_rule " + ", ".join(f"{v!r} is read as {OLD_LR_RULES[v]!r} (its "
                                                  "new name)" for v in old))
        col["lr_rule"] = [OLD_LR_RULES.get(v, v) for v in col["lr_rule"]]
    _require(user, "lr_rule", col["lr_rule"], lambda v: v in KNOWN_LR_RULES, "is not an LR rule",
             f"allowed: {', '.join(KNOWN_LR_RULES)}, or an empty cell ({DEFAULT_LR_RULE}: the "
             "fewest steps over the learning rates given)")
    if any(v is None for v in col["lr_rule"]):
        notes.append(NO_RULE_NOTE)
    col["lr_rule"] = [DEFAULT_LR_RULE if v is None else v for v in col["lr_rule"]]
    if "lr" in typed:
        _require(user, "lr", col["lr"], _positive, "is not positive",
                 "learning rates are > 0 (give every row one, or drop the column)", empty_ok=False)
    else:
        notes.append(NO_LR_NOTE)
        col["lr"] = [PLACEHOLDER_LR] * len(col["lr"])
    _require(user, "workers", col["workers"], _positive, "is not positive",
             "workers are whole numbers ≥ 1, or an empty cell (1)")
    if "workers" not in typed:
        notes.append("runs: no workers column: each run is read as 1 worker")
    col["workers"] = [1 if v is None else v for v in col["workers"]]
    if "seed" in typed:
        _require(user, "seed", col["seed"], lambda v: True, "", "give every row a seed, or "
                 "drop the column (each row is then one run)", empty_ok=False)
    else:
        notes.append("runs: no seed column: each row is one run, numbered as seeds 0, 1, … per "
                     "(lr_rule, batch_size, lr, workers) in file order")
        notes.extend(_identical_rows(col))
        col["seed"] = _numbered_seeds(col)


def _identical_rows(col: dict) -> list[str]:
    """A note naming rows identical in every column: without seeds they count as two runs,
    which a copied line would fake."""
    first: dict[tuple, int] = {}
    pairs = []
    for i, row in enumerate(zip(*(col[name] for name in sorted(col)), strict=True)):
        if row in first:
            pairs.append(f"{first[row] + 1} and {i + 1}")
        else:
            first[row] = i
    if not pairs:
        return []
    return [f"runs: rows {'; '.join(pairs)} are identical in every column (data rows counted "
            "from 1): read as separate runs (seeds) of the same setting; if one is a copy, "
            "delete it"]


def _numbered_seeds(col: dict) -> list[int]:
    counts: dict[tuple, int] = {}
    seeds = []
    for key in zip(col["lr_rule"], col["batch_size"], col["lr"], col["workers"], strict=True):
        seeds.append(counts.get(key, 0))
        counts[key] = seeds[-1] + 1
    return seeds


def _fill_run_times(user: UserTable, col: dict) -> None:
    """steps_run and train_time_s default to the steps and time to target of a reached run;
    unknown otherwise (0 steps, NaN seconds: no throughput is computed from them)."""
    for name, test, problem in (("time_to_target_s", _positive, "is not positive"),
                                ("train_time_s", _non_negative, "is negative"),
                                ("steps_run", _non_negative, "is negative")):
        _require(user, name, col[name], test, problem, "expected a number ≥ 0 (> 0 for a "
                 "time to target), or an empty cell")
    reached = [s == RunStatus.REACHED.value for s in col["status"]]
    col["steps_run"] = [v if v is not None else n if ok else 0 for v, n, ok in
                        zip(col["steps_run"], col["steps_to_target"], reached, strict=True)]
    col["train_time_s"] = [
        v if v is not None else t if ok and t is not None else math.nan
        for v, t, ok in zip(col["train_time_s"], col["time_to_target_s"], reached, strict=True)]


def _refuse_duplicate_runs(user: UserTable, col: dict, typed: dict) -> None:
    """Each (lr_rule, batch_size, lr, seed, workers) once: a repeated trial would count twice
    in the median over seeds. The message names only the columns the table has."""
    keys = ("lr_rule", "batch_size", "lr", "seed", "workers")
    first: dict[tuple, int] = {}
    for i, key in enumerate(zip(*(col[k] for k in keys), strict=True)):
        if key in first:
            shown = ", ".join(f"{k} {v!r}" for k, v in zip(keys, key, strict=True) if k in typed)
            raise BadInput(f"{user.label}: {rows_text([first[key], i])} repeat the same run "
                           f"({shown}); each (lr_rule, batch_size, lr, seed, workers) appears "
                           "once: if they are separate runs, give them different seeds, or "
                           "drop the seed column (each row is then one run)")
        first[key] = i


# ------------------------------------------------------------------------------ sweep
def complete_sweep(user: UserTable) -> UserTable:
    """The sweep table in the `sweep` schema (without the environment columns). Repeated
    (input_mode, batch_size) rows are kept: the analysis takes their median."""
    notes: list[str] = []
    typed = typed_columns(user, SWEEP_INPUT, notes)
    n = user.table.num_rows
    col = {name: typed.get(name, [None] * n) for name in SWEEP_INPUT.columns}
    _require(user, "batch_size", col["batch_size"], _positive, "is not positive",
             "batch sizes are whole numbers ≥ 1", empty_ok=False)
    for name in ("step_time_median_s", "samples_per_s"):
        _require(user, name, col[name], _positive, "is not positive",
                 "expected a number > 0, or an empty cell")
    batch, times, rates = col["batch_size"], col["step_time_median_s"], col["samples_per_s"]
    col["step_time_median_s"] = [t if t is not None or r is None else b / r
                                 for b, t, r in zip(batch, times, rates, strict=True)]
    col["samples_per_s"] = [r if r is not None or t is None else b / t
                            for b, t, r in zip(batch, times, rates, strict=True)]
    _fill_sweep_labels(user, col, notes)
    rows = [{name: col[name][i] for name in SWEEP_INPUT.columns} for i in range(n)]
    return replace(user, rows=rows, notes=tuple(notes))


def _fill_sweep_labels(user: UserTable, col: dict, notes: list[str]) -> None:
    """input_mode (synthetic), status (ok where a time is given, else error), precision
    ("unknown") and timed_steps (0: not recorded) where the table does not say."""
    _require(user, "input_mode", col["input_mode"], lambda v: v in TIMING_MODES,
             "is not an input mode", f"allowed: {', '.join(TIMING_MODES)}, or an empty cell "
             "(synthetic)")
    allowed = [s.value for s in TrialStatus]
    _require(user, "status", col["status"], lambda v: v in allowed, "is not a sweep status",
             f"allowed: {', '.join(allowed)}, or an empty cell")
    col["input_mode"] = [TIMING_MODES[0] if v is None else v for v in col["input_mode"]]
    untimed = {i for i, (s, t) in enumerate(zip(col["status"], col["step_time_median_s"],
                                                strict=True)) if s is None and t is None}
    if untimed:
        notes.append(f"sweep: {rows_text(sorted(untimed))} give no step time or samples/s: kept as "
                     "status 'error' (not timed)")
    col["error"] = [e if i not in untimed else "no step time in the table"
                    for i, e in enumerate(col["error"])]
    col["status"] = [s if s is not None else TrialStatus.OK.value if t is not None
                     else TrialStatus.ERROR.value
                     for s, t in zip(col["status"], col["step_time_median_s"], strict=True)]
    col["precision"] = ["unknown" if v is None else v for v in col["precision"]]
    col["timed_steps"] = [0 if v is None else v for v in col["timed_steps"]]
