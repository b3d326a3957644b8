"""The regression check's verdicts in words: the run summary's lines, the report's
"Regressions" section, and the attribution of a confirmed regression (regression.py judges;
changepoints.py holds the test)."""

from __future__ import annotations

import math

import pandas as pd

from batchscale.lake.changepoints import (
    CONFIRM_RUNS,
    CONFIRMED,
    INSUFFICIENT_HISTORY,
    MIN_DROP_SHARE,
    MIN_HISTORY_RUNS,
    NOISE_MADS,
    OK,
    SUSPECTED,
    TOO_NOISY,
)
from batchscale.lake.comparable import DISTURBED, FINGERPRINT_FIELDS, value_text
from batchscale.lake.next_run import MIN_STEPS, ROUNDS_ALONE
from batchscale.schemas import TrialStatus

NOT_JUDGED = "not_judged"
"""Measured badly (an unstable row, or a disturbed run): no verdict either way."""
ENVIRONMENT_CHANGED = "environment_changed"
"""The speed fingerprint differs from the last run judged well: a new baseline starts."""
LEGACY_REGRESSION = "regression"
"""The single-run verdict of tables published before change points (read as confirmed)."""
JUDGED = (CONFIRMED, SUSPECTED, OK)
FAILING = (CONFIRMED, LEGACY_REGRESSION)
ATTRIBUTION_COLUMNS = ("runs_below", "last_good_run_id", "last_good_commit",
                       "first_bad_run_id", "first_bad_commit", "attribution")


def _number(value: object) -> str:
    return f"{value:,.0f}" if isinstance(value, int | float) and math.isfinite(value) else "-"


def _run_text(row: dict) -> str:
    """"run X of 2026-04-01, 9,000 samples/s" (the date where the row came from the lake)."""
    date = row.get("date")
    when = f" of {date}" if isinstance(date, str) and date else ""
    figure = (f"{_number(row['samples_per_s'])} samples/s" if row["status"] == TrialStatus.OK
              else str(row["status"]))
    return f"run {row['run_id']}{when}, {figure}"


def _recorded(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def attribution_text(good: dict, bad: dict, fields: tuple[str, ...]) -> str:
    """"between commit abc123 (run X, 9,000 samples/s) and def456 (run Y, 6,000 samples/s);
    changed: git_commit abc123 -> def456" — or what did not change, when nothing did."""
    commit = {r["run_id"]: r["git_commit"] if _recorded(r["git_commit"]) else "?"
              for r in (good, bad)}
    between = (f"between commit {commit[good['run_id']]} ({_run_text(good)}) and "
               f"{commit[bad['run_id']]} ({_run_text(bad)})")
    changed = [f"{f} {value_text(f, good)} -> {value_text(f, bad)}" for f in fields
               if _recorded(good[f]) and _recorded(bad[f])
               and value_text(f, good) != value_text(f, bad)]
    if changed:
        return f"{between}; changed: {', '.join(changed)}"
    if ":" in str(bad.get("workload", "")):  # a user's module:attribute, versioned elsewhere
        return (f"{between}; no change in {', '.join(fields)} recorded between them (look at "
                "your workload's own code, whose commit is not recorded unless "
                "BATCHSCALE_GIT_COMMIT names it: git_commit is batchscale's; then the data, "
                "driver, node)")
    return (f"{between}; no change in {', '.join(fields)} recorded between them (look outside "
            "the code: data, driver, node)")


def _with_verdict_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Tables published before these columns existed read as null there."""
    missing = [c for c in ("reason", "fingerprint", *ATTRIBUTION_COLUMNS) if c not in frame]
    return frame.assign(**{c: None for c in missing})


def _percent(change: float) -> str:
    return f"{change:+.1%}".replace("-", "−")


def _cell_name(row: dict) -> str:
    return (f"{row['workload']} on {row['device_name']}, {row['precision']}, "
            f"{row['input_mode']} input, batch {row['batch_size']}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _drop_text(row: dict) -> str:
    """The cell's figure against its baseline, or its failure."""
    if row["status"] != TrialStatus.OK:
        return f"{row['status']} now, timed fine in {_count(row['history_runs'], 'earlier run')}"
    bound = "" if row["verdict"] == LEGACY_REGRESSION else f", {_allowed_by(row)}"
    return (f"{row['samples_per_s']:,.0f} samples/s vs median {row['history_median']:,.0f} "
            f"({_percent(row['change'])}; noise allows a drop of {row['allowed_drop']:,.0f}"
            f"{bound}) over {row['history_runs']} runs")


def _allowed_by(row: dict) -> str:
    """Which bound set the allowed drop: the fixed floor, or the history's own scatter (of
    today's rule: a legacy row's drop was set by the older one, and is not labelled)."""
    floor = MIN_DROP_SHARE * row["history_median"]
    if math.isclose(row["allowed_drop"], floor, rel_tol=1e-9):
        return f"the {MIN_DROP_SHARE:.0%} floor, as this history scatters less"
    return f"{NOISE_MADS:g} robust standard deviations of this history"


def regressed_cells(frame: pd.DataFrame) -> list[str]:
    """One line per confirmed regression (the only verdict that fails a run), attributed."""
    rows = _with_verdict_columns(frame)
    lines = []
    for row in rows[rows["verdict"].isin(FAILING)].to_dict("records"):
        line = f"{_cell_name(row)}: {_drop_text(row)}"
        if isinstance(row["attribution"], str):
            line += (f"; {int(row['runs_below'])} runs in a row below the baseline, "
                     f"{row['attribution']}")
        lines.append(line)
    return lines


def suspected_cells(frame: pd.DataFrame) -> list[str]:
    """One line per suspected cell: one run below its baseline, not (yet) a sustained shift."""
    rows = frame[frame["verdict"].eq(SUSPECTED)].to_dict("records")
    return [f"{_cell_name(row)}: {_drop_text(row)}" for row in rows]


WHOLE_RUN_SHARE = 0.75
"""When at least this share of the judged cells (four or more) moved the same way against
their baselines, the run moved as a whole: the summary says so before the cells."""


def whole_run_shift(frame: pd.DataFrame) -> str | None:
    """"11 of 12 judged cells ran below their baseline (median −21 %): …" when the run moved
    as a whole, else None. Such a shift comes from something every cell shares: the machine
    at another speed, or a change in the code or a library that touches every batch. The
    confirmed cells still name what changed."""
    judged = frame[frame["verdict"].isin(JUDGED).to_numpy(dtype=bool)]
    change = pd.to_numeric(judged.get("change"), errors="coerce").dropna()
    if len(change) < 4:
        return None
    for moved, way in ((change < 0, "below"), (change > 0, "above")):
        if moved.sum() >= WHOLE_RUN_SHARE * len(change):
            return (f"{int(moved.sum())} of {len(change)} judged cells ran {way} their baseline "
                    f"(median {change[moved].median():+.0%}), together: a shift of the whole "
                    "run, which something every cell shares gives (the machine at another "
                    "speed, or a change in the code, a library or a driver)").replace("-", "−")
    return None


def disturbed_reason(frame: pd.DataFrame) -> str | None:
    """The reason when the whole run was not judged because its measurement was disturbed."""
    frame = _with_verdict_columns(frame)
    reasons = frame["reason"][frame["verdict"].eq(NOT_JUDGED)].dropna()
    disturbed = reasons[reasons.str.startswith(DISTURBED)]
    return str(disturbed.iloc[0]) if len(disturbed) == len(frame) and len(frame) else None


def environment_changes(frame: pd.DataFrame) -> list[str]:
    """One line per cell whose environment changed, with the step it showed."""
    lines = []
    for row in _with_verdict_columns(frame)[frame["verdict"].eq(ENVIRONMENT_CHANGED)].to_dict(
            "records"):
        step = (f"{row['samples_per_s']:,.0f} samples/s vs median {row['history_median']:,.0f} "
                f"over {_count(row['history_runs'], 'run')} before ({_percent(row['change'])})"
                if math.isfinite(row["change"]) else f"{row['status']} now")
        lines.append(f"{_cell_name(row)}: {row['reason']}; {step}")
    return lines


def too_noisy_cells(frame: pd.DataFrame) -> list[str]:
    """One line per cell whose history scatters too much to see its throughput halve."""
    rows = _with_verdict_columns(frame)
    rows = rows[rows["verdict"].eq(TOO_NOISY)].to_dict("records")
    return [f"{_cell_name(r)}: {_number(r['samples_per_s'])} samples/s "
            f"({_percent(r['change'])}), {r['reason']}" for r in rows]


def unstable_cells(frame: pd.DataFrame) -> list[str]:
    """One line per cell not judged because its own rows were unstable."""
    rows = _with_verdict_columns(frame)
    rows = rows[rows["verdict"].eq(NOT_JUDGED)].to_dict("records")
    return [f"{_cell_name(r)}: {r['samples_per_s']:,.0f} samples/s, {r['reason']}" for r in rows]


def _nothing_judged(frame: pd.DataFrame) -> str:
    """"not judged: ..." with why, when no cell was judged against history."""
    if frame.empty:
        return "not judged: the run has no throughput rows (a TrainingLoop has no sweep)"
    counts = frame["verdict"].value_counts()
    few = f"fewer than {MIN_HISTORY_RUNS} comparable earlier runs"
    if counts.get(INSUFFICIENT_HISTORY, 0) == len(frame):
        return f"not judged: {few} of this workload in the lake"
    parts = [f"{_count(int(counts[verdict]), 'cell')} {why}" for verdict, why in (
        (ENVIRONMENT_CHANGED, "with a changed environment"), (NOT_JUDGED, "measured unstably"),
        (TOO_NOISY, "with a history too noisy to see the throughput halve"),
        (INSUFFICIENT_HISTORY, f"with {few}")) if counts.get(verdict, 0)]
    return f"not judged: {', '.join(parts)}"


def _judged(frame: pd.DataFrame) -> int:
    return int(frame["verdict"].isin((*JUDGED, LEGACY_REGRESSION)).sum())


SUSPECTED_NOTE = ("one run below the baseline; not failing, confirmed if the next run is "
                  "below too")


def next_run_text(frame: pd.DataFrame) -> str | None:
    """Where the next comparable run should land: the median half-width over the cells whose
    range saw their history ("within ±6 % … (median over 5 cells, 90 %)"), then the cells with
    too little history, whose range is their rounds' alone and may be left; None where no cell
    has a range (tables before it, nothing timed well)."""
    if "next_run_low" not in frame:
        return None
    rows = frame.dropna(subset=["next_run_low", "next_run_high", "samples_per_s"])
    if rows.empty:
        return None
    low = rows["next_run_low"] / rows["samples_per_s"] - 1
    high = rows["next_run_high"] / rows["samples_per_s"] - 1
    alone = rows["next_run_basis"].eq(ROUNDS_ALONE).to_numpy()
    parts = []
    if (~alone).any():
        parts.append(f"the next comparable run should land within {_band(low, high, ~alone)} "
                     f"of this one's samples/s (median over {_count(int((~alone).sum()), 'cell')}"
                     ", 90 %, from their run-to-run history and this run's rounds)")
    if alone.any():
        parts.append(f"{_count(int(alone.sum()), 'cell')} with under {MIN_STEPS + 1} runs of "
                     f"history: only this run's rounds, {_band(low, high, alone)}, which the "
                     "next run may leave")
    return "; ".join(parts) + " (each cell's range: next_run_low/high, regressions table)"


def _band(low: pd.Series, high: pd.Series, cells) -> str:
    """"−53 % to +114 %": the median low and high ends over `cells`, relative to this run (a
    ratio's range is lopsided: ±x % would hide that)."""
    return f"{low[cells].median():+.0%} to {high[cells].median():+.0%}".replace("-", "−")


def verdict_lines(frame: pd.DataFrame) -> list[str]:
    """The run summary's lines about the regression check (`batchscale run`, `report`)."""
    disturbed = disturbed_reason(frame)
    if disturbed:
        return [f"regressions: not judged: {disturbed} (nothing fails on it; rerun on a quiet "
                "node)"]
    judged, flagged, suspected = _judged(frame), regressed_cells(frame), suspected_cells(frame)
    if flagged:
        lines = [f"regressions: {len(flagged)} confirmed of {judged} judged cells",
                 *(f"  {line}" for line in flagged)]
    elif judged:
        lines = [f"regressions: none confirmed in {judged} cells judged against history"]
    else:
        lines = [f"regressions: {_nothing_judged(frame)}"]
    if shift := whole_run_shift(frame):
        lines.append(f"  whole run: {shift}")
    if suspected:
        lines += [f"  suspected ({SUSPECTED_NOTE}):", *(f"    {line}" for line in suspected)]
    lines += [f"  environment changed: {line}" for line in environment_changes(frame)]
    lines += [f"  too noisy to judge: {line}" for line in too_noisy_cells(frame)]
    lines += [f"  not judged: {line}" for line in unstable_cells(frame)]
    upcoming = next_run_text(frame)
    return lines + ([f"  next run: {upcoming}"] if upcoming else [])


def rule_text() -> str:
    return (f"Rule: a run lies below its baseline (the median of the last runs) when it drops "
            f"by more than max({NOISE_MADS:g} × 1.4826 × MAD, {MIN_DROP_SHARE:.0%} of the "
            f"median); one run below is suspected, {CONFIRM_RUNS} in a row confirm a regression "
            "(only that fails --fail-on-regression). At least "
            f"{MIN_HISTORY_RUNS} earlier runs per cell, measured well (no unstable rows, no "
            f"disturbed run) with the same fingerprint ({', '.join(FINGERPRINT_FIELDS)}).")


def regressions_markdown(frame: pd.DataFrame) -> str:
    """The report's "Regressions" section, in the Markdown subset the report renders."""
    lines = ["## Regressions", ""]
    disturbed = disturbed_reason(frame)
    if disturbed:
        lines += [f"**Not judged: {disturbed}.** A regression check on these figures would "
                  "cry wolf; rerun on a quiet node (pin CPUs, request Guaranteed QoS). This "
                  "run is left out of later baselines.", "", rule_text()]
        return "\n".join(lines) + "\n"
    judged, flagged, suspected = _judged(frame), regressed_cells(frame), suspected_cells(frame)
    if flagged:
        lines.append(f"**{len(flagged)} of {judged} judged cells regressed** (confirmed) "
                     "against history:")
        lines += ["", *(f"- {line}" for line in flagged)]
    elif judged:
        lines.append(f"No confirmed throughput regression in {judged} cells judged against "
                     "history.")
    else:
        nothing = _nothing_judged(frame)
        lines.append(f"{nothing[0].upper()}{nothing[1:]}.")  # "Not judged: ..."
    if shift := whole_run_shift(frame):
        lines += ["", f"**The whole run moved:** {shift}."]
    if suspected:
        lines += ["", f"**Suspected** ({_count(len(suspected), 'cell')}: {SUSPECTED_NOTE}):",
                  "", *(f"- {line}" for line in suspected)]
    changed = environment_changes(frame)
    if changed:
        lines += ["", f"**Environment changed: new baseline** ({_count(len(changed), 'cell')}; "
                  "not regressions):", "", *(f"- {line}" for line in changed)]
    blind = too_noisy_cells(frame)
    if blind:
        lines += ["", f"**Too noisy to judge** ({_count(len(blind), 'cell')}: no regression "
                  "could have been seen there):", "", *(f"- {line}" for line in blind)]
    unstable = unstable_cells(frame)
    if unstable:
        lines += ["", f"Not judged, measured unstably ({_count(len(unstable), 'cell')}):", "",
                  *(f"- {line}" for line in unstable)]
    unjudged = int(frame["verdict"].eq(INSUFFICIENT_HISTORY).sum())
    if judged and unjudged:
        lines += ["", f"{_count(unjudged, 'cell')} had too little comparable history to judge."]
    upcoming = next_run_text(frame)
    if upcoming:
        lines += ["", f"Next run: {upcoming}."]
    return "\n".join([*lines, "", rule_text()]) + "\n"
