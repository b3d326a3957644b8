"""Gradient accumulation in the what-if plan ("accumulation where it helps"), from a
run's tables with known answers (tests/plan_tables.py): the sweep ran out of memory at 256, so
the largest per-worker batch that fits is 128 and b = 256 runs as 2 micro-batches of 128. One
device's measured step at 128 is 1 ms + 10 µs·128 = 2.28 ms, so b = 256 computes 2 · 2.28 =
4.56 ms per step (not the 3.56 ms measured at 256 by a run that, per the sweep, should not fit).
The link is stated, 8 Gbit/s = 1e9 bytes/s without latency: the 1e6-byte gradient's all-reduce
over 2 workers takes 2·1/2·1e6 / 1e9 = 1 ms, once per optimizer step."""

from __future__ import annotations

import plan_tables as pt
import pytest

from batchscale.checks import validate_table
from batchscale.planner.inputs import read_plan_inputs
from batchscale.planner.model import CommModel
from batchscale.planner.section import _draw, what_if_markdown
from batchscale.planner.table import make_plan, plan_lines, table_rows
from batchscale.schemas import make_table

LINK = CommModel.from_link(gbps=8, latency_us=0)


def plan(oom_at: int | None = 256):
    frames = pt.frames()
    sweep = make_table("sweep", pt.sweep_rows(oom_at), pt.ENV).to_pandas()
    inputs = read_plan_inputs(sweep, frames["runs"], frames["analysis"], pt.GRADIENT_BYTES)
    return make_plan(inputs, LINK, [1, 2])


def by_cell(rows: list[dict]) -> dict[tuple[int, int], dict]:
    return {(r["workers"], r["per_worker_batch"]): r for r in rows}


def test_the_table_carries_accumulation_steps_and_passes_its_suite():
    rows = table_rows(plan())
    cells = by_cell(rows)
    assert {cell: r["accumulation_steps"] for cell, r in cells.items()} == {
        (n, b): 2 if b == 256 else 1 for n in (1, 2) for b in pt.SINGLE_BATCHES}
    assert cells[(1, 256)]["compute_s"] == pytest.approx(2 * 2.28e-3)
    assert cells[(1, 256)]["compute_source"] == "measured"  # at the micro-batch, 128
    assert cells[(2, 256)]["comm_s"] == pytest.approx(1e-3)
    assert cells[(2, 256)]["step_time_s"] == pytest.approx(4.56e-3 + 1e-3)
    assert cells[(2, 256)]["feasible"] and cells[(2, 256)]["limit"] == "past B_crit"  # 512 > 96
    assert cells[(1, 128)]["step_time_s"] == pytest.approx(2.28e-3)
    assert validate_table("plan", make_table("plan", rows, pt.ENV)).success


@pytest.mark.parametrize(("value", "needle"), [
    (0, "expect_column_values_to_be_between(accumulation_steps)"),
    (None, "expect_column_values_to_not_be_null(accumulation_steps)"),
    (17, "expect_column_pair_values_a_to_be_greater_than_b(per_worker_batch"),  # 17 > b = 16
])
def test_the_suite_refuses_impossible_accumulation(value, needle):
    rows = table_rows(plan())
    rows[0] = {**rows[0], "accumulation_steps": value}
    assert rows[0]["per_worker_batch"] == 16
    report = validate_table("plan", make_table("plan", rows, pt.ENV))
    assert not report.success and needle in report.failure_message()


def test_the_printed_plan_the_section_and_the_plot_name_accumulated_rows():
    made = plan()
    lines = plan_lines(made)
    assert any(line.startswith("  memory: largest batch that fits: 128")
               and "a per-worker batch above 128 accumulates" in line for line in lines)
    accumulated = [line for line in lines if line.endswith("b 256 = 2×128 accumulated")]
    assert len(accumulated) == 2  # N = 1 and N = 2
    assert "accumulate gradients (b 256 = 2×128)" in what_if_markdown(made)
    legend = [t.get_text() for t in _draw(made).axes[0].get_legend().get_texts()]
    assert any(text.startswith("accumulated: k micro-batches") for text in legend)


def test_without_a_measured_limit_nothing_accumulates_and_larger_batches_are_unchecked():
    made = plan(oom_at=None)
    assert {r["accumulation_steps"] for r in table_rows(made)} == {1}
    assert "larger batches are unchecked" in plan_lines(made)[2]
    assert "accumulate" not in what_if_markdown(made)
    legend = [t.get_text() for t in _draw(made).axes[0].get_legend().get_texts()]
    assert not any("accumulated" in text for text in legend)
