"""Every sentence the analysis writes is checked against the tables it describes, over a corpus
of fixture runs: the shapes of S(B) the analysis must tell apart (a supported B_crit, steps
still falling like 1/B, flat steps, one batch size, two reached, every trial diverged), one or
three seeds, with a sweep, without one, or with a sweep that recorded no memory, with or
without B_simple, one worker or a data-parallel cell. The checks are claims, not wording: no
unfilled value reaches the text, "no batch size saved steps" only when the steps are flat, a
number's interval holds it, "not recorded" only when the column is empty, the card never says
"n/a" and never recommends a worker count from an efficiency above 100 %; the answer row of
the analysis table says what the card says. The planner's printed plan gets the same over 12
plans (cheap to dominant communication, calm or disturbed data-parallel cells).
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pandas as pd
import pytest
from test_analyze import BATCHES, make_sweep, run_row, sweep_line

from batchscale.analysis.analyze import analyze
from batchscale.config import AnalysisConfig

SHAPES = {
    "supported": lambda b: 100 + 6400 / b,
    "still_falling": lambda b: 65536 / b,
    "flat": lambda b: 500,
    "one_batch": lambda b: 500,
    "two_reached": lambda b: 6400 / b,
    "all_diverged": lambda b: 100,
}
SWEEPS = ("sweep", "no_sweep", "sweep_without_memory")
SEEDS = ((0,), (0, 1, 2))
CASES = list(itertools.product(SHAPES, SWEEPS, SEEDS))
UNFILLED = re.compile(r"\b(nan|NaN|None|inf)\b|\{[^}]*\}|n/a\*\*")


def fixture_runs(shape: str, seeds: tuple[int, ...], with_b_simple: bool,
                 data_parallel: str | None) -> pd.DataFrame:
    """One LR rule (linear) at every batch of BATCHES (one batch for "one_batch"), trained at
    the sweep's step-time line, 3 % seed noise."""
    rng = np.random.default_rng(len(seeds) * 7 + len(shape))
    line = sweep_line()
    batches = [64] if shape == "one_batch" else BATCHES
    rows = []
    for b in batches:
        status = "diverged" if shape == "all_diverged" else (
            "not_reached" if shape == "two_reached" and b > 8 else "reached")
        for seed in seeds:
            steps = max(1, round(SHAPES[shape](b) * (1 + rng.uniform(-0.03, 0.03))))
            rows.append(run_row(b, "linear", 0.1, seed, steps, status=status,
                                step_time=line(b), b_simple=40.0 + seed if with_b_simple else None))
    if data_parallel and shape == "supported":
        # The same cell on 2 workers: each takes half the batch, plus 0.3 ms of all-reduce (a
        # plausible cell), or a quarter of one worker's step (over 100 % efficient: impossible).
        step = line(32) + 3e-4 if data_parallel == "plausible" else line(64) / 4
        rows += [run_row(64, "linear", 0.1, seed, round(SHAPES[shape](64)), workers=2,
                         step_time=step) for seed in seeds]
    return pd.DataFrame(rows)


def fixture_sweep(kind: str) -> pd.DataFrame | None:
    if kind == "no_sweep":
        return None
    sweep = make_sweep()
    if kind == "sweep_without_memory":
        sweep["peak_memory_bytes"] = None
    return sweep


def median_steps(runs: pd.DataFrame) -> pd.Series:
    reached = runs[(runs["status"] == "reached") & (runs["workers"] == 1)]
    return reached.groupby("batch_size")["steps_to_target"].median().sort_index()


@pytest.mark.parametrize(("shape", "sweep_kind", "seeds"), CASES,
                         ids=[f"{s}-{k}-{len(n)}seed" for s, k, n in CASES])
def test_every_claim_agrees_with_the_tables(shape, sweep_kind, seeds):
    with_b_simple = len(seeds) > 1
    parallel = {"sweep": "plausible", "sweep_without_memory": "impossible"}.get(sweep_kind)
    runs = fixture_runs(shape, seeds, with_b_simple, data_parallel=parallel)
    sweep = fixture_sweep(sweep_kind)
    result = analyze(sweep, runs, None, AnalysisConfig(bootstrap_samples=50))
    text = result.markdown

    assert not UNFILLED.search(text), UNFILLED.search(text).group(0) + "\n" + text
    steps = median_steps(runs)
    if "no batch size saved steps" in text:
        assert steps.max() <= 1.5 * steps.min(), text
    if "steps still fall like 1/B" in text:
        assert steps.iloc[0] / steps.iloc[-1] >= 0.5 * steps.index[-1] / steps.index[0], text
    for value, low, high in re.findall(
            r"B_crit = E_min/S_min ≈ ([\d,.]+) \(90% interval ([\d,.]+)–([\d,.]+)\)", text):
        value, low, high = (float(v.replace(",", "")) for v in (value, low, high))
        assert low <= value <= high, text
    if re.search(r"[Pp]eak memory [^.]*not recorded", text):
        assert sweep is None or sweep["peak_memory_bytes"].isna().all(), text
    if re.search(r"B_simple[^.]*not recorded", text):
        assert runs["b_simple"].isna().all(), text
    if parallel == "impossible" and shape == "supported":  # 2 workers 2x faster than possible
        assert "**Workers: 2**" not in text and "not physical" in text, text
    chosen = re.search(r"\*\*Batch size: (\d+)\*\*", text)
    if chosen:
        assert int(chosen.group(1)) in set(runs["batch_size"]), text
    card_row_agrees(result.rows, text, chosen)


def card_row_agrees(rows: list[dict], text: str, chosen: re.Match | None) -> None:
    """The analysis table's answer row says what the card says: its batch size, learning rate
    and worker count, or (no recommended batch) no row at all."""
    answers = [row for row in rows if row["answer"]]
    if chosen is None:
        assert answers == [], text
        return
    assert len(answers) == 1, text
    row = answers[0]
    assert row["batch_size"] == int(chosen.group(1)), text
    workers = re.search(r"\*\*Workers: (\d+)\*\*", text)
    assert row["answer_workers"] == (int(workers.group(1)) if workers else None), text
    lr = re.search(r"\*\*Learning rate: ([\d.e+-]+)\*\*", text)
    if lr:
        assert f"{row['answer_learning_rate']:.4g}" == lr.group(1), text
    else:
        assert row["answer_learning_rate"] is None and "learning rate:" in row["answer_unanswered"]
    if row["answer_expected"]:
        assert row["answer_expected"] in text, text


def test_the_corpus_is_at_least_thirty_runs():
    assert len(CASES) >= 30


# ------------------------------------------------------------------ the planner's sentences
PLAN_CASES = list(itertools.product([(128,), (64, 128, 256)], [5e-4, 2e-3, 2e-2], [False, True]))


@pytest.mark.parametrize(("parallel", "comm_s", "disturbed"), PLAN_CASES,
                         ids=[f"{len(p)}cells-comm{c:g}-{'busy' if d else 'calm'}"
                              for p, c, d in PLAN_CASES])
def test_every_plan_claim_agrees_with_the_plan(parallel, comm_s, disturbed):
    """The what-if plan as printed (`plan_lines`), for data-parallel cells of cheap, moderate
    and dominant communication, calm or waiting for a CPU: each sentence against the plan's
    own rows."""
    import plan_tables as pt

    from batchscale.planner.table import default_plan, plan_lines

    frames = pt.frames(parallel_batches=parallel, comm_s=comm_s)
    runs = frames["runs"].assign(
        gradient_bytes=pt.GRADIENT_BYTES,
        cpu_wait_share=frames["runs"]["workers"].map({1: 0.02, 2: 0.4 if disturbed else 0.02}))
    plan, missing = default_plan(frames["sweep"], runs, frames["analysis"], workload=None,
                                 configured_workers=[1, 2])
    assert plan is not None, missing
    text = "\n".join(plan_lines(plan))

    assert not UNFILLED.search(text), UNFILLED.search(text).group(0) + "\n" + text
    assert ("NOT TRUSTED" in plan.recommendation) == disturbed, text
    assert all(0 <= row.comm_share <= 1 for row in plan.rows), text
    named = re.search(r"N = (\d+), b = (\d+) per worker", plan.recommendation)
    assert named, text
    front = {(row.workers, row.per_worker_batch) for row in plan.front}
    assert (int(named.group(1)), int(named.group(2))) in front, text
    for row in plan.front:  # nothing on the front is beaten on both time and device-hours
        assert not any(other.time_to_target_s.value < row.time_to_target_s.value and
                       other.device_hours.value < row.device_hours.value
                       for other in plan.rows if other.feasible), text
    link = next(line for line in text.splitlines() if "all-reduce of" in line)
    if "every communication parameter was measured" in text:
        assert "(assumed" not in link, text
    else:
        assert re.search(r"\((assumed|effective|set to 0)\)", link), text
        assert "not measured:" in text, text
