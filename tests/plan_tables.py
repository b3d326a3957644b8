"""A run's tables with known answers for the what-if planner's wiring (tests/test_plan_*.py).

One device takes t(b) = 1 ms + 10 µs·b per step; S(B) = 100 + 6400/B (B_crit 64, interval
48-96); two workers (a device each) add COMM_S per step over one device at the per-worker
batch. Every trial's
time to target is exactly S(B)·its step time, so a right prediction has error 0."""

from __future__ import annotations

from batchscale.schemas import make_table

ALPHA_S, BETA_S = 1e-3, 1e-5
S_MIN, E_MIN = 100.0, 6400.0
COMM_S = 2e-3
GRADIENT_BYTES = 1e6
TARGET = ("val_accuracy", 0.9)
SINGLE_BATCHES = (16, 32, 64, 128, 256)
ENV = {"run_id": "plan-run", "config_hash": "c0ffee", "experiment": "plan-test",
       "workload": "digits-mlp", "git_commit": "deadbeef", "batchscale_version": "0.1.0",
       "torch_version": "2.14.1", "python_version": "3.11.9", "device_name": "NVIDIA H200",
       "threads": 2, "world_size": 1}


def one_device_s(batch: float) -> float:
    return ALPHA_S + BETA_S * batch


def steps(batch: float) -> float:
    return S_MIN + E_MIN / batch


def trial(batch: int, workers: int, seed: int, step_s: float, **changes) -> dict:
    run = round(steps(batch))
    row = {"trial_id": f"linear-{batch}-w{workers}-{seed}", "batch_size": batch,
           "lr_rule": "linear", "lr": 0.05, "seed": seed, "workers": workers,
           "status": "reached", "steps_run": run, "steps_to_target": run,
           "examples_to_target": run * batch, "time_to_target_s": steps(batch) * step_s,
           "final_val_accuracy": 0.95, "train_time_s": run * step_s,
           "target_metric": TARGET[0], "target_value": TARGET[1]}
    return {**row, **changes}


def run_rows(parallel_batches=(128,), comm_s: float = COMM_S) -> list[dict]:
    """One-worker trials at every batch; two-worker trials at `parallel_batches`."""
    rows = [trial(b, 1, seed, one_device_s(b)) for b in SINGLE_BATCHES for seed in (0, 1)]
    rows += [trial(b, 2, seed, one_device_s(b / 2) + comm_s)
             for b in parallel_batches for seed in (0, 1)]
    return rows


def analysis_rows(**changes) -> list[dict]:
    fit = {"s_min": S_MIN, "e_min": E_MIN, "b_crit": E_MIN / S_MIN, "b_crit_low": 48.0,
           "b_crit_high": 96.0, "target_metric": TARGET[0], "target_value": TARGET[1]}
    return [{**fit, "lr_rule": "linear", "batch_size": b, "steps_to_target": steps(b),
             **changes} for b in SINGLE_BATCHES]


def sweep_rows(oom_at: int | None = 256) -> list[dict]:
    """Synthetic-input rows; batch `oom_at` ran out of memory (None: none did)."""
    rows = []
    for b in (16, 64, 128, 256):
        if b == oom_at:
            rows.append({"input_mode": "synthetic", "batch_size": b, "status": "oom",
                         "precision": "fp32", "timed_steps": 0})
        else:
            rows.append({"input_mode": "synthetic", "batch_size": b, "status": "ok",
                         "precision": "fp32", "timed_steps": 20, "quality": "ok",
                         "step_time_median_s": one_device_s(b), "samples_per_s":
                         b / one_device_s(b), "peak_memory_bytes": 1000 * b})
    return rows


def tables(parallel_batches=(128,), comm_s: float = COMM_S) -> dict:
    """The run's tables (pyarrow), as the lake holds them."""
    return {"runs": make_table("runs", run_rows(parallel_batches, comm_s), ENV),
            "analysis": make_table("analysis", analysis_rows(), ENV),
            "sweep": make_table("sweep", sweep_rows(), ENV)}


def frames(parallel_batches=(128,), comm_s: float = COMM_S) -> dict:
    return {name: t.to_pandas() for name, t in tables(parallel_batches, comm_s).items()}
