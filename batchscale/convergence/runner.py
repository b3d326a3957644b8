"""convergence core: build the trial spec for some batch sizes and run it with torchrun.

Locally the trials of one call run in one `torchrun --standalone` process group, one trial after
another (measurements never overlap). With `launcher: kubeflow` the same spec and entry point
run as a Kubeflow Trainer TrainJob (see trainjob.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from batchscale.config import ExperimentConfig
from batchscale.contract_check import check_workload, with_workload_targets
from batchscale.convergence import checkpoint, train
from batchscale.convergence.cell_server import CellServer
from batchscale.convergence.outcome import kept_text
from batchscale.convergence.schedule import scaled_lr
from batchscale.convergence.spec import (
    ConvergenceSpec,
    HalvingSpec,
    ProbeSpec,
    TargetSpec,
    TrainingSettings,
    TrialSpec,
    TwinSpec,
)
from batchscale.convergence.usererror import (
    ERROR_FILE_ENV,
    ERROR_FILE_NAME,
    UserCodeError,
    read_error_file,
)
from batchscale.errors import BadInput, BatchscaleError
from batchscale.location import Location, is_s3_uri, open_location
from batchscale.names import check_run_id
from batchscale.schemas import TUNED_RULE
from batchscale.stopping import (
    Terminated,
    die_with_parent,
    resume_run_id,
    signals_held,
    stop_group,
)
from batchscale.storage import write_bytes_atomic
from batchscale.workloads import get_workload

if TYPE_CHECKING:
    from batchscale.config.stage_inputs import Config

ENTRY_POINT = Path(train.__file__)
ENTRY_MODULE = "batchscale.convergence.train"


def trial_id(batch_size: int, rule: str, seed: int, workers: int, lr: float | None = None) -> str:
    """Readable and unique within a spec; tuned trials also carry their learning rate."""
    rule_part = f"{rule}-lr{lr:g}" if rule == TUNED_RULE else rule
    return f"b{batch_size}-{rule_part}-s{seed}-w{workers}"


def trial_lrs(cfg: ExperimentConfig, rule: str, batch_size: int) -> list[float]:
    """The learning rates a rule tries at one batch size: one scaled LR, or every candidate."""
    c = cfg.convergence
    if rule == TUNED_RULE:
        return list(c.lr_candidates)
    return [scaled_lr(rule, c.base_lr, batch_size, c.reference_batch_size)]


PROBE_SUFFIX = "-probe"
"""Ends the trial id of an adaptive search's probe: a probe stops before the target, so the
trial a cell later places at the same (batch size, LR, seed) is another trial, with its own
result files and checkpoints."""


def build_trials(cfg: ExperimentConfig, batch_sizes: list[int], workers: int,
                 prune_at_step: int | None = None,
                 probe: ProbeSpec | None = None) -> list[TrialSpec]:
    """Every (batch size, LR rule, LR, seed) of `batch_sizes`; with `probe`, as probe trials
    (TrialSpec.probe, trial ids ending in PROBE_SUFFIX)."""
    c = cfg.convergence
    suffix = PROBE_SUFFIX if probe is not None else ""
    return [
        TrialSpec(trial_id=trial_id(b, rule, seed, workers, lr) + suffix, batch_size=b,
                  lr_rule=rule, lr=lr, seed=seed, prune_at_step=prune_at_step, probe=probe)
        for b in batch_sizes for rule in c.lr_rules for lr in trial_lrs(cfg, rule, b)
        for seed in c.seeds
    ]


def optimization_settings(c) -> dict:
    """The optimizer, LR decay and precision of `c` (ConvergenceConfig) as spec settings; the
    decay's horizon is stated in the spec (max_steps unless decay_steps is set) and left out
    without a decay, where it changes nothing."""
    decay_steps = (c.decay_steps or c.max_steps) if c.lr_decay != "none" else None
    return {"optimizer": c.optimizer, "weight_decay": c.weight_decay,
            "adam_beta1": c.adam_beta1, "adam_beta2": c.adam_beta2, "adam_eps": c.adam_eps,
            "lr_decay": c.lr_decay, "decay_steps": decay_steps,
            "min_lr_ratio": c.min_lr_ratio, "precision": c.precision}


def target_settings(c) -> dict:
    """The targets and evaluation settings of `c` (ConvergenceConfig) as spec settings. One
    val_accuracy target is written the way specs always wrote it (target_val_accuracy), so a
    checkpoint of such a trial keeps resuming; the gap budget in epochs becomes examples once
    the dataset's size is known (by the trainer)."""
    targets = c.resolved_targets()
    if len(targets) == 1 and targets[0].metric == "val_accuracy":
        chosen = {"target_val_accuracy": targets[0].value, "targets": None}
    else:
        chosen = {"target_val_accuracy": None,
                  "targets": [TargetSpec(metric=t.metric, value=t.value) for t in targets]}
    return {**chosen, "train_eval_rows": c.train_eval_rows, "gap_epochs": c.gap_epochs}


def build_spec(cfg: ExperimentConfig, batch_sizes: list[int], *, data_dir: str, out_dir: str,
               run_id: str, workers: int | None = None,
               checkpoint_dir: str | None = None, prune_at_step: int | None = None,
               probe: ProbeSpec | None = None) -> ConvergenceSpec:
    """Everything the training script needs; paths may be local or s3:// URIs. Checkpoints go
    to `checkpoint_dir`, else `<checkpoint_uri>/<run_id>` for an s3:// URI, else a directory
    inside `out_dir` (the config's relative `checkpoint_uri`, default `checkpoints`)."""
    c = cfg.convergence
    workers = workers or c.workers
    if checkpoint_dir is None:
        if c.checkpoint_uri and is_s3_uri(c.checkpoint_uri):
            checkpoint_dir = f"{c.checkpoint_uri.rstrip('/')}/{run_id}"
        else:  # a relative directory: always inside this trial's work directory
            checkpoint_dir = f"{out_dir.rstrip('/')}/{c.checkpoint_uri or 'checkpoints'}"
    training = TrainingSettings(
        workload=cfg.workload, workers=workers, accumulation_steps=c.accumulation_steps,
        momentum=c.momentum, warmup_steps=c.warmup_steps, max_steps=c.max_steps,
        **target_settings(c),
        eval_every_steps=c.eval_every_steps, divergence_factor=c.divergence_factor,
        patience_evals=c.patience_evals, gns_every_steps=c.gns_every_steps,
        **optimization_settings(c))
    return ConvergenceSpec(
        run_id=run_id, config_hash=cfg.config_hash, experiment=cfg.name, variant=cfg.variant,
        data_dir=str(data_dir), out_dir=str(out_dir), checkpoint_dir=str(checkpoint_dir),
        checkpoint_every_steps=c.checkpoint_every_steps, loader_workers=c.loader_workers,
        training=training,
        **split_twins(build_trials(cfg, batch_sizes, workers, prune_at_step, probe)),
        halving=halving_spec(c))


def trainings_per_seed(cfg: ExperimentConfig, batch_size: int) -> int:
    """How many trials one seed trains at `batch_size`: every rule's learning rates, less the
    twins `split_twins` records instead of training."""
    seed = cfg.convergence.seeds[0]
    kept = split_twins(build_trials(cfg, [batch_size], 1))["trials"]
    return sum(t.seed == seed for t in kept)


def split_twins(trials: list[TrialSpec]) -> dict[str, list]:
    """{"trials": what to train, "twins": the trials of a scaling rule that would train exactly
    what an earlier one trains (same batch size, learning rate and seed: the rules agree at the
    reference batch), recorded from it instead of trained again. The tuned rule's trials are
    kept as they are: successive halving ranks them among themselves."""
    kept, twins, seen = [], [], {}
    for t in trials:
        key = (t.batch_size, t.lr, t.seed, t.probe is not None)
        if t.lr_rule != TUNED_RULE and key in seen:
            twins.append(TwinSpec(trial_id=t.trial_id, lr_rule=t.lr_rule, same_as=seen[key]))
            continue
        if t.lr_rule != TUNED_RULE:
            seen[key] = t.trial_id
        kept.append(t)
    return {"trials": kept, "twins": twins}


def halving_spec(c) -> HalvingSpec | None:
    """Successive halving of `c` (ConvergenceConfig), ranking by the primary target's metric."""
    if c.lr_halving_eta is None:
        return None
    targets = c.resolved_targets()
    primary = next((t for t in targets if t.primary), targets[0])
    return HalvingSpec(eta=c.lr_halving_eta, first_rung_steps=c.lr_halving_first_rung_steps,
                       metric=primary.metric)


def check_checkpoints(spec: ConvergenceSpec) -> None:
    """Fail before any process starts when a stored checkpoint belongs to other settings (a
    changed config, another worker count) or another checkpoint format: torchrun would
    otherwise restart the group on the same error until its restarts run out."""
    location = open_location(spec.checkpoint_dir)
    for trial in spec.trials:
        name = checkpoint.latest(location, trial.trial_id)
        if name is not None:
            checkpoint.load(location, name, spec.identity(trial))


def torchrun_command(spec_path: str, workers: int, max_restarts: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={workers}", f"--max-restarts={max_restarts}",
            str(ENTRY_POINT), "--spec", spec_path]


def torchrun_env(workers: int) -> dict:
    env = dict(os.environ)
    # torchrun only sets OMP_NUM_THREADS for nproc > 1; set it always so ranks share the cores
    # evenly instead of oversubscribing them (a value the user set is theirs to keep).
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # A user's workload module is found from the launching directory, as in the launcher.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.getcwd()) if p)
    return env


def write_spec(spec: ConvergenceSpec) -> Path:
    """The spec file every rank reads (`spec.json` in the cell's directory)."""
    spec_path = Path(spec.out_dir) / "spec.json"
    write_bytes_atomic(spec_path, spec.to_json())
    return spec_path


TORCHRUN_LOG = "torchrun.log"
"""torchrun's stderr (its agent's and every rank's), kept in the cell's work directory."""
POLL_S = 0.1
"""How often the launcher looks at torchrun's log and for a rank's user error."""


class _LogEcho:
    """Passes what torchrun writes to its log file on to this process's stderr, whole lines as
    they come (the rest once torchrun has ended)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def read(self, final: bool) -> bytes:
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                chunk = log.read()
        except OSError:
            return b""
        if not final:
            chunk = chunk[:chunk.rfind(b"\n") + 1]
        self.offset += len(chunk)
        return chunk

    @staticmethod
    def show(chunk: bytes) -> None:
        if chunk:
            sys.stderr.write(chunk.decode(errors="replace"))
            sys.stderr.flush()


def launch_local(spec: ConvergenceSpec, timeout_s: float, max_restarts: int) -> None:
    """Train the spec's trials in one `torchrun --standalone` group. torchrun's stderr goes to
    `torchrun.log` in the work directory and on to this process's stderr as it comes, except
    once a rank has reported an error of the workload's own code (usererror.py): then the group
    is stopped at once (a restart would fail the same way) and UserCodeError (exit 2) says what
    failed, without the ranks' and torchrun's tracebacks (the log keeps them)."""
    out_dir = Path(spec.out_dir)
    spec_path = write_spec(spec)
    workers = spec.training.workers
    cmd = torchrun_command(str(spec_path), workers, max_restarts)
    error_file = out_dir / ERROR_FILE_NAME
    error_file.unlink(missing_ok=True)  # an earlier launch's: this one starts afresh
    log_path = out_dir / TORCHRUN_LOG
    # Own process group: a timeout, Ctrl-C or SIGTERM takes the agent and its workers down
    # together, instead of leaving workers orphaned in a collective; and the agent dies when
    # this process does, even by SIGKILL, its ranks after it (batchscale/stopping.py). SIGKILL,
    # not SIGTERM: trials checkpoint atomically, and the agent answers SIGTERM with a traceback.
    env = {**torchrun_env(workers), ERROR_FILE_ENV: str(error_file)}
    echo = _LogEcho(log_path)
    user_error, proc = None, None
    try:
        # Ctrl-C or SIGTERM during the start is held until `proc` is known, so the `finally`
        # below stops the group instead of leaving it running unseen.
        with open(log_path, "wb") as log, signals_held():  # the group's stderr
            proc = subprocess.Popen(cmd, env=env, stderr=log, start_new_session=True,
                                    preexec_fn=partial(die_with_parent, signal.SIGKILL))
        user_error = _watch(proc, timeout_s, error_file, echo, out_dir)
    finally:
        if proc is not None:
            stop_group(proc, first=signal.SIGKILL)
        if user_error is None and not error_file.exists():
            echo.show(echo.read(final=True))  # what the group wrote last (its failure, if any)
    if user_error is None and error_file.exists():  # written as the group ended
        user_error = read_error_file(error_file)
    if user_error is not None:
        raise UserCodeError(f"{user_error}; {kept_text(out_dir)} (torchrun's log: {log_path})")
    if proc.returncode != 0:
        raise BatchscaleError(f"torchrun exited with status {proc.returncode} (its log is "
                              f"above and in {log_path}); {kept_text(out_dir)}")


def _watch(proc: subprocess.Popen, timeout_s: float, error_file: Path, echo: _LogEcho,
           out_dir: Path) -> UserCodeError | None:
    """Wait for torchrun to end, passing its log on; the user error a rank reported (the
    group is then left to the caller to stop), else None once torchrun has ended. Output
    read after the error file appeared is not shown: it is that error's traceback-free line
    and torchrun's report of the failed rank."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
            ended = True
        except subprocess.TimeoutExpired:
            ended = False
        chunk = echo.read(final=ended)
        if error_file.exists():
            return read_error_file(error_file) or UserCodeError(
                f"a rank reported an error of the workload's code in {error_file}, which "
                "could not be read")
        echo.show(chunk)
        if ended:
            return None
        if time.monotonic() >= deadline:
            raise BatchscaleError(f"convergence trials timed out after {timeout_s:.0f} s; "
                                  f"{kept_text(out_dir)}")


def collect(spec: ConvergenceSpec,
            out: Location | None = None) -> tuple[pa.Table, pa.Table]:
    """(curves, runs) of every trial in the spec, read from the trial files."""
    out = out or open_location(spec.out_dir)
    tables = {}
    for t in spec.trials:
        curves_name, run_name = train.trial_files(t.trial_id)
        if not out.exists(run_name):
            raise BatchscaleError(f"trial {t.trial_id} left no results in {out.uri}")
        tables[t.trial_id] = (out.get_table(curves_name), out.get_table(run_name))
    pairs = [*tables.values(), *((_renamed(tables[t.same_as][0], t),
                                  _renamed(tables[t.same_as][1], t, trained_as=t.same_as))
                                 for t in spec.twins)]
    return pa.concat_tables([c for c, _ in pairs]), pa.concat_tables([r for _, r in pairs])


def say_twins(spec: ConvergenceSpec) -> None:
    """One line per trial not trained because another trains the same thing."""
    lrs = {t.trial_id: t for t in spec.trials}
    for twin in spec.twins:
        same = lrs[twin.same_as]
        print(f"[{twin.trial_id}] the same training as {same.trial_id} (the {twin.lr_rule} and "
              f"{same.lr_rule} rules both give learning rate {same.lr:g} at batch "
              f"{same.batch_size}): trained once, recorded under both", file=sys.stderr)


def _renamed(table: pa.Table, twin: TwinSpec, **more: str) -> pa.Table:
    """`table`'s rows as the twin's: its trial id and LR rule (and `more` columns' values)."""
    for name, value in (("trial_id", twin.trial_id), ("lr_rule", twin.lr_rule), *more.items()):
        index = table.schema.get_field_index(name)
        if index < 0:  # not a column of this table (curves have no trained_as)
            continue
        field = table.schema.field(index)
        table = table.set_column(index, field, pa.array([value] * table.num_rows, field.type))
    return table


def run_convergence(cfg: ExperimentConfig, batch_sizes: list[int], *, data_dir: str,
                    out_dir: str, run_id: str, workers: int | None = None,
                    prune_at_step: int | None = None, server: CellServer | None = None,
                    probe: ProbeSpec | None = None):
    """Train every trial of `batch_sizes` to the target; (curves, runs) tables. torchrun here,
    or a TrainJob on the cluster with `launcher: kubeflow` (`out_dir` is then unused: the
    TrainJob's pods write to the object store). The run id (a directory and a key part) and
    a user model (built once) are checked before any process starts. `prune_at_step`: the
    adaptive search's bound (TrialSpec.prune_at_step). `server`: a cell of the server's worker
    count trains in that long-lived group instead of its own torchrun (torchrun again if the
    server fails).
    `probe`: the trials are the adaptive search's probes (TrialSpec.probe)."""
    check_run_id(run_id)
    if workers is not None and workers < 1:
        raise BadInput(f"workers: must be at least 1, got {workers}")
    workload = get_workload(cfg.workload)
    cfg = with_workload_targets(cfg, workload)
    c = cfg.convergence
    check_workload(workload, batch_sizes=batch_sizes, targets=c.resolved_targets(),
                   convergence=True)
    if c.launcher == "kubeflow":
        from batchscale.convergence.trainjob import run_on_kubeflow

        return run_on_kubeflow(cfg, batch_sizes, data_dir=data_dir, run_id=run_id,
                               workers=workers or c.workers, prune_at_step=prune_at_step,
                               probe=probe)
    spec = build_spec(cfg, batch_sizes, data_dir=data_dir, out_dir=out_dir, run_id=run_id,
                      workers=workers, prune_at_step=prune_at_step, probe=probe)
    say_twins(spec)
    check_checkpoints(spec)
    if not finished(spec):  # a resumed run reads finished trials back without a torchrun
        # timeout_s is per batch size: a cell of several batch sizes gets one limit per size.
        timeout_s = c.timeout_s * len(batch_sizes)
        try:
            served = (server is not None and spec.training.workers == server.workers
                      and server.run(write_spec(spec), timeout_s))
            if not served:
                launch_local(spec, timeout_s, c.max_restarts)
        except (KeyboardInterrupt, Terminated):
            print(f"batchscale: {kept_text(Path(spec.out_dir))} (unfinished ones in their "
                  f"checkpoints); to resume, rerun the same command "
                  f"with --run-id {resume_run_id(run_id)}", file=sys.stderr, flush=True)
            raise
    return collect(spec)


def finished(spec: ConvergenceSpec) -> bool:
    """Whether every trial of the spec has left its result files (a run being resumed)."""
    out = open_location(spec.out_dir)
    return all(out.exists(name) for t in spec.trials for name in train.trial_files(t.trial_id))


def work_dir(run_id: str, batch_sizes: list[int], workers: int,
             root: Path | None = None) -> Path:
    """Where trials keep checkpoints and finished results: stable for a run id and its cell, so
    running the same run again resumes instead of starting over. Under `root`, else
    $BATCHSCALE_WORK_DIR, else .batchscale/work."""
    check_run_id(run_id)
    root = root or Path(os.environ.get("BATCHSCALE_WORK_DIR",
                                       Path.cwd() / ".batchscale" / "work"))
    sizes = "-".join(str(b) for b in batch_sizes)
    return root / run_id / f"convergence-b{sizes}-w{workers}"


def parse_batch_sizes(text: str) -> list[int]:
    """A cell's batch sizes as the pipeline passes them: "16,64,256" (a KFP loop item carries
    strings reliably; a list field does not survive every backend)."""
    try:
        sizes = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise BadInput(f"batch_sizes: expected positive integers separated by commas, got "
                       f"{text!r}")
    return sizes


def run_stage(config: str | Config, run_id: str, batch_sizes: str, workers: int, dataset_dir: str,
              curves_path: str, runs_path: str) -> None:
    """Pipeline entry: train every (batch size, LR rule, LR, seed) of one cell in one torchrun
    process group; write the two tables. A cell is one batch size on a cluster (a pod each)
    and all of one worker count's batch sizes locally (one task: docs/architecture.md)."""
    from batchscale.config.stage_inputs import stage_config
    from batchscale.storage import write_table_atomic

    cfg = stage_config(config)
    sizes = parse_batch_sizes(batch_sizes)
    curves, runs = run_convergence(cfg, sizes, data_dir=dataset_dir,
                                   out_dir=str(work_dir(run_id, sizes, workers)),
                                   run_id=run_id, workers=workers)
    write_table_atomic(curves_path, curves)
    write_table_atomic(runs_path, runs)
