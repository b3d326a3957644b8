"""Clean tables of every kind, and the context the pipeline passes with each: what the suites
must accept (tests/test_checks.py) and what the corrupt-input tests corrupt."""

from __future__ import annotations

import hashlib

import pyarrow as pa

from batchscale.checks import validate_table
from batchscale.schemas import RunStatus, TrialStatus, make_table

ENV = {
    "run_id": "run-1",
    "config_hash": "c0ffee",
    "experiment": "unit",
    "workload": "mlp",
    "git_commit": "deadbeef",
    "batchscale_version": "0.1.0",
    "torch_version": "2.14.1",
    "python_version": "3.11.9",
    "device_name": "cpu",
    "threads": 2,
    "world_size": 1,
}
BATCH_SIZES = [4, 16, 64]
SHA = {name: hashlib.sha256(name.encode()).hexdigest() for name in ("train-0", "train-1", "val-0")}


def dataset_rows() -> list[dict]:
    return [{"features": [0.5 * i, 1.0, -1.0, 0.0], "label": i % 4} for i in range(40)]


def manifest_rows() -> list[dict]:
    common = {"dataset": "digits", "source": "sklearn", "feature_shape": [2, 2],
              "feature_dtype": "float32", "num_classes": 4, "split_seed": 0}
    return [
        {**common, "split": "train", "shard": "train-0", "rows": 16, "sha256": SHA["train-0"],
         "class_histogram": [4, 4, 4, 4]},
        {**common, "split": "train", "shard": "train-1", "rows": 14, "sha256": SHA["train-1"],
         "class_histogram": [4, 3, 4, 3]},
        {**common, "split": "val", "shard": "val-0", "rows": 10, "sha256": SHA["val-0"],
         "class_histogram": [3, 2, 3, 2]},
    ]


def sweep_row(mode: str, batch: int, status: str = TrialStatus.OK, **changes) -> dict:
    timed = {
        "timed_steps": 20, "step_time_median_s": 0.01 * batch, "step_time_p10_s": 0.009 * batch,
        "step_time_p90_s": 0.012 * batch, "step_time_cv": 0.05, "samples_per_s": 100.0,
        "peak_memory_bytes": 1000 * batch, "achieved_flops_per_s": 1e9, "mfu": 0.1,
        "rounds": 2, "retries": 0, "round_spread": 0.02, "quality": "ok",
        "process_cpu_per_wall": 1.9,
    }
    row = {"input_mode": mode, "batch_size": batch, "status": status, "precision": "fp32",
           "timed_steps": 0, "train_flops_per_sample": 1e6, "peak_flops_per_s": 1e10,
           "rounds": 0, "retries": 0, "load_avg_1m": 0.4, "usable_cpus": 2,
           "threads_oversubscribed": False}
    if status == TrialStatus.OK:
        row.update(timed)
    else:
        row["error"] = "OutOfMemoryError: out of memory"
    return {**row, **changes}


def sweep_rows() -> list[dict]:
    return [sweep_row(m, b) for m in ("synthetic", "real") for b in (4, 16)] + [
        sweep_row("synthetic", 64, TrialStatus.OOM)
    ]


def curve_rows() -> list[dict]:
    """t4 never reaches 0.9, t16 reaches it at step 20, tdiv diverges (NaN loss, last row)."""
    def trial(trial_id: str, batch: int, accs: list[float], losses: list[float]) -> list[dict]:
        return [
            {"trial_id": trial_id, "batch_size": batch, "lr_rule": "linear", "seed": 0,
             "step": 10 * i, "examples_seen": 10 * i * batch, "train_time_s": 0.1 * i,
             "train_loss": loss, "val_accuracy": acc, "lr": 0.05, "b_simple": 12.0}
            for i, (acc, loss) in enumerate(zip(accs, losses, strict=True))
        ]

    return (
        trial("t4", 4, [0.1, 0.5, 0.7, 0.8], [2.3, 1.0, 0.8, 0.7])
        + trial("t16", 16, [0.1, 0.6, 0.92], [2.3, 0.9, 0.5])
        + trial("tdiv", 64, [0.1, 0.2], [2.3, float("nan")])
    )


def run_rows() -> list[dict]:
    common = {"lr_rule": "linear", "lr": 0.05, "seed": 0, "workers": 1,
              "target_val_accuracy": 0.9, "b_simple": 12.0}
    return [
        {**common, "trial_id": "t4", "batch_size": 4, "status": RunStatus.NOT_REACHED,
         "steps_run": 30, "final_val_accuracy": 0.8, "train_time_s": 0.3},
        {**common, "trial_id": "t16", "batch_size": 16, "status": RunStatus.REACHED,
         "steps_run": 20, "steps_to_target": 20, "examples_to_target": 320,
         "time_to_target_s": 0.2,
         "final_val_accuracy": 0.92, "train_time_s": 0.2},
        {**common, "trial_id": "tdiv", "batch_size": 64, "status": RunStatus.DIVERGED,
         "steps_run": 10, "final_val_accuracy": 0.2, "train_time_s": 0.1},
    ]


def analysis_rows() -> list[dict]:
    fit = {"s_min": 10.0, "e_min": 200.0, "b_crit": 20.0, "b_crit_low": 15.0,
           "b_crit_high": 25.0, "b_simple": 12.0, "saturation_batch": 16}
    return [
        {**fit, "lr_rule": "linear", "batch_size": b, "steps_to_target": s,
         "examples_to_target": s * b, "step_time_s": 0.01, "time_to_target_s": s * 0.01,
         "samples_per_s": b / 0.01, "regime": regime}
        for b, s, regime in ((4, 60.0, "perfect_scaling"), (16, 20.0, "diminishing_returns"),
                             (64, 15.0, "maximal_data_parallelism"))
    ]


def regression_rows() -> list[dict]:
    """One verdict of each kind that needs its own columns: judged, too little history, and
    not judged with its reason."""
    cell = {"run_id": "r1", "workload": "digits-mlp", "device_name": "cpu", "precision": "fp32",
            "input_mode": "synthetic", "status": "ok"}
    return [
        {**cell, "batch_size": 4, "samples_per_s": 1000.0, "history_runs": 3,
         "history_median": 1010.0, "history_mad": 5.0, "allowed_drop": 101.0,
         "change": -0.0099, "verdict": "ok", "fingerprint": "threads=2",
         "next_run_low": 940.0, "next_run_high": 1064.0, "next_run_basis": "history of 4 runs"},
        {**cell, "batch_size": 16, "samples_per_s": 4000.0, "history_runs": 1,
         "verdict": "insufficient_history", "reason": "1 comparable earlier run (3 needed)"},
        {**cell, "batch_size": 64, "samples_per_s": 900.0, "history_runs": 3,
         "verdict": "not_judged", "reason": "unstable: rounds disagree by 40% (> 15%)"},
    ]


def plan_rows() -> list[dict]:
    """One measured row that still helps, one extrapolated row past B_crit whose band is open
    above (null ends)."""
    common = {"target_metric": "val_accuracy", "target_value": 0.9, "lr_rule": "linear",
              "compute_source": "measured", "step_time_source": "convergence runs, 1 worker",
              "gradient_bytes": 4000, "bandwidth_Bps": 1e8, "latency_s": 0.0,
              "hidden_share": 0.0, "bandwidth_source": "measured", "latency_source": "assumed",
              "hidden_share_source": "assumed", "memory_note": "no memory limit measured",
              "b_crit": 20.0, "b_crit_low": 15.0, "feasible": True, "recommended": False,
              "accumulation_steps": 1}
    return [
        {**common, "workers": 1, "per_worker_batch": 16, "global_batch": 16,
         "extrapolated": False, "compute_s": 0.01, "comm_s": 0.0, "step_time_s": 0.01,
         "comm_share": 0.0, "steps": 22.5, "steps_low": 24.0, "steps_high": 26.0,
         "time_to_target_s": 0.225, "time_to_target_s_low": 0.24,
         "time_to_target_s_high": 0.26, "device_hours": 6.25e-5, "device_hours_low": 6.7e-5,
         "device_hours_high": 7.2e-5, "b_crit_high": 25.0, "on_pareto_front": True},
        {**common, "workers": 8, "per_worker_batch": 16, "global_batch": 128,
         "extrapolated": True, "compute_s": 0.01, "comm_s": 0.0001, "step_time_s": 0.0101,
         "comm_share": 0.0099, "steps": 11.6, "steps_low": 11.2, "time_to_target_s": 0.117,
         "time_to_target_s_low": 0.113, "device_hours": 2.6e-4, "device_hours_low": 2.5e-4,
         "limit": "past B_crit", "on_pareto_front": False},
    ]


def decision_rows() -> list[dict]:
    """A short adaptive search: a probe, the prediction, a refined cell, the stop."""
    common = {"lr_rule": "sqrt", "target_metric": "val_accuracy", "target_value": 0.9,
              "prediction_method": "near target", "predicted_b_crit": 12.5,
              "predicted_low": 10.4, "predicted_high": 17.4, "device_s_spent": 1.5, "workers": 1}
    return [
        {**common, "decision": 0, "action": "probe", "batch_size": 4, "seed": 0,
         "reason": "measures the gradient noise scale", "prediction_method": "none",
         "predicted_b_crit": None, "predicted_low": None, "predicted_high": None,
         "examples_spent": 1160},
        {**common, "decision": 1, "action": "predict", "reason": "placing 4, 16, 64, 256",
         "examples_spent": 1160},
        {**common, "decision": 2, "action": "refine", "batch_size": 16, "seed": 1,
         "reason": "narrows the interval most per example", "b_crit": 29.2, "b_crit_low": 21.2,
         "b_crit_high": 40.7, "interval_ratio": 1.92, "expected_ratio": 1.89,
         "examples_spent": 21960},
        {**common, "decision": 3, "action": "stop", "reason": "interval narrow enough at 90 %",
         "b_crit": 29.2, "b_crit_low": 21.2, "b_crit_high": 40.7, "interval_ratio": 1.92,
         "examples_spent": 21960},
    ]


def study_rows() -> list[dict]:
    """A fitted variant and one whose data support only a lower bound (NaN figures)."""
    nan = float("nan")
    common = {"study_id": ENV["run_id"], "target_metric": "val_accuracy", "target_value": 0.9,
              "lr_rule": "sqrt", "s_min": 40.0, "b_simple": 11.5, "saturation_batch": 64,
              "parameters": 26_122}
    return [
        {**common, "variant": "fraction0.5", "variant_run_id": "run-1-fraction0.5",
         "axis_values": '{"dataset_fraction": 0.5}', "b_crit": 40.0, "b_crit_low": 28.0,
         "b_crit_high": 56.0, "e_min": 1600.0, "b_star": 20.0, "b_star_low": 16.7,
         "b_star_high": 23.7, "s_min_se": 2.1, "e_min_se": 90.0, "answer_batch_size": 32,
         "answer_time_to_target_s": 0.05, "answer_time_to_target_s_low": 0.043,
         "answer_time_to_target_s_high": 0.058},
        {**common, "variant": "fraction1", "variant_run_id": "run-1-fraction1",
         "axis_values": '{"dataset_fraction": 1.0}', "b_crit": nan, "b_crit_low": nan,
         "b_crit_high": nan, "b_crit_bound": "above", "b_crit_bound_batch": 64.0,
         "b_crit_reason": "steps still fall like 1/B", "s_min": nan, "e_min": nan,
         "b_star": nan, "b_star_low": nan, "b_star_high": nan, "answer_batch_size": 64,
         "answer_time_to_target_s": 0.07, "answer_time_to_target_s_low": nan,
         "answer_time_to_target_s_high": nan},
    ]


def study_axes_rows() -> list[dict]:
    return [{"study_id": ENV["run_id"], "axis": "dataset_fraction", "x_name": "dataset_fraction",
             "x_scale": "log", "target_metric": "val_accuracy", "target_value": 0.9,
             "lr_rule": "sqrt", "variants_fitted": 3, "slope": 0.4, "slope_low": -0.1,
             "slope_high": 0.9, "range_factor": 1.7, "range_factor_low": 0.87,
             "range_factor_high": 3.5, "verdict": "no detectable change"}]


def critical_over_training_rows() -> list[dict]:
    """A checkpoint with B_crit and its interval, and one whose branches support only a bound."""
    nan = float("nan")
    common = {"base_batch_size": 8, "lr_rule": "sqrt", "branch_device_s": 4.2,
              "cpu_wait_share": 0.02, "base_batch_lr": 0.05}
    return [
        {**common, "checkpoint_step": 100, "examples": 800, "val_loss": 2.7,
         "milestone_loss": 2.6, "batches_reached": 4, "b_crit": 13.0, "b_crit_low": 5.3,
         "b_crit_high": 25.5, "s_min": 9.0, "e_min": 117.0, "b_simple": 6.5,
         "scheduled_batch_size": 8, "scheduled_lr": 0.05},
        {**common, "checkpoint_step": 300, "examples": 2400, "val_loss": 2.4,
         "milestone_loss": 2.35, "batches_reached": 4, "b_crit": nan, "b_crit_low": nan,
         "b_crit_high": nan, "b_crit_bound": "above", "b_crit_bound_batch": 64.0,
         "b_crit_reason": "steps still fall like 1/B", "s_min": nan, "e_min": nan,
         "b_simple": nan, "scheduled_batch_size": 64, "scheduled_lr": 0.05 * 8 ** 0.5},
    ]


def schedule_check_rows() -> list[dict]:
    """Two seeds of the check: both runs reached; one scheduled run carries the prediction."""
    nan = float("nan")
    common = {"base_batch_size": 8, "lr_rule": "sqrt", "target_metric": "val_loss",
              "target_value": 2.0, "reached": True, "diverged": False,
              "stages": "2.79:16,2.52:32", "reference_steps": 791.0, "cpu_wait_share": 0.01}
    rows = []
    for seed in (0, 1):
        rows.append({**common, "schedule": "scheduled", "seed": seed, "reference": False,
                     "steps_to_target": 371.0 + seed, "examples_to_target": 8100.0,
                     "train_time_s_to_target": 9.5, "batch_sizes": "8>16>32", "steps_run": 375,
                     "final_val_loss": 1.95, "final_metric": 1.95, "predicted_steps": 356.0,
                     "predicted_steps_low": 301.0, "predicted_steps_high": 399.0,
                     "predicted_examples": 9122.0, "predicted_examples_low": 8100.0,
                     "predicted_examples_high": 9700.0, "device_s": 14.0})
        rows.append({**common, "schedule": "constant", "seed": seed, "reference": seed == 0,
                     "steps_to_target": 810.0 - seed, "examples_to_target": 6480.0,
                     "train_time_s_to_target": 10.1, "batch_sizes": "8", "stages": "",
                     "steps_run": 825, "final_val_loss": 1.99, "final_metric": 1.99,
                     "predicted_steps": nan, "predicted_steps_low": nan,
                     "predicted_steps_high": nan, "predicted_examples": nan, "device_s": 17.4})
    return rows


ROWS = {"dataset": dataset_rows, "manifest": manifest_rows, "sweep": sweep_rows,
        "curves": curve_rows, "runs": run_rows, "analysis": analysis_rows,
        "regressions": regression_rows, "plan": plan_rows,
        "decisions": decision_rows, "study": study_rows, "study_axes": study_axes_rows,
        "critical_over_training": critical_over_training_rows,
        "schedule_check": schedule_check_rows}


def table(kind: str, rows: list[dict] | None = None) -> pa.Table:
    return make_table(kind, ROWS[kind]() if rows is None else rows, ENV)


def context(kind: str) -> dict:
    """The context the pipeline passes for each kind."""
    return {
        "dataset": {"num_classes": 4, "feature_length": 4},
        "manifest": {"shard_checksums": dict(SHA)},
        "sweep": {"batch_sizes": BATCH_SIZES},
        "curves": {"batch_sizes": BATCH_SIZES},
        "runs": {"batch_sizes": BATCH_SIZES, "curves": table("curves")},
        "analysis": {"batch_sizes": BATCH_SIZES},
        "regressions": {},
        "plan": {},
        "decisions": {},
        "study": {},
        "study_axes": {},
        "critical_over_training": {},
        "schedule_check": {},
    }[kind]


def refused(kind: str, tbl: pa.Table, expectation: str, *fragments: str, ctx=None) -> str:
    """Validate, expect failure, and check the message names table, expectation and values."""
    report = validate_table(kind, tbl, context=context(kind) if ctx is None else ctx)
    message = report.failure_message()
    assert not report.success, message
    assert message.startswith(f"{kind} table failed validation"), message
    assert expectation in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message
