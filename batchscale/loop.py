"""Your own training loop as a trial function: for training that cannot be handed over as a
model, a dataset and a loss (a `batchscale.Workload`).

    from batchscale import TrainingLoop

    def train(trial):
        model = trial.prepare(build_model())          # on trial.device; DDP when world_size > 1
        opt = torch.optim.SGD(model.parameters(), lr=trial.lr)
        loader = DataLoader(dataset, batch_sampler=trial.batch_sampler(len(dataset)))
        for step, (x, y) in enumerate(loader, start=1):
            for group in opt.param_groups:
                group["lr"] = trial.lr_at(step - 1)   # the config's warm-up and decay
            opt.zero_grad()
            my_loss(model(x.to(trial.device)), y.to(trial.device)).backward()
            opt.step()
            if step % trial.eval_every_steps == 0:
                with trial.evaluating():               # not counted as training time
                    metrics = my_validation(model)
                trial.report(step=step, metrics=metrics)
                if trial.should_stop():
                    break

    loop = TrainingLoop(name="my-script", train=train, metrics=("val_accuracy",),
                        targets=(("val_accuracy", 0.9),))

and `batchscale converge --workload my_module:loop` (or `batchscale run`: the whole pipeline,
whose sweep stage then says there is no sweep). batchscale runs the function once per trial
of the grid or the adaptive search (batch size x LR rule x LR x seed), under torchrun for
data-parallel runs, records the curve of what it reports, stops it at the targets, fits S(B) and
B_crit and recommends, as for a Workload (docs/your-model.md, "Your own training loop").
A trial's training time starts at the first batch drawn from `trial.batch_sampler` (or at
`trial.start_training()`), so building the data and the model is not counted per step.

What a loop cannot give: a throughput sweep or memory model (batchscale never sees a step it
could time in isolation: `analyze` uses the trials' own step times), checkpoint-resume inside a
trial (a restarted group reruns an unfinished trial from its start), successive halving of the
tuned rule's learning rates (it pauses trials at checkpoints), and the gradient noise scale on
one process (it needs two batch sizes: with more than one worker, `prepare` measures it from
DDP's own all-reduce, and `measure_noise` on a DDP your framework made).

Nothing here imports torch. The `trial` object is batchscale.convergence.loop_trial.LoopTrial.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NO_HALVING = ("lr_halving_eta: successive halving pauses trials at checkpoints, which a "
              "TrainingLoop does not give; train every learning rate of lr_candidates to the "
              "target (lr_halving_eta: null)")
"""The refusal of successive halving for a user's loop (the CLI's, and every rank's)."""


@dataclass(frozen=True)
class TrainingLoop:
    """Your training loop, as batchscale runs it: one call of `train` per trial."""

    name: str
    """A short name for messages; result rows record the `--workload` spec that loaded it."""
    train: Callable[[Any], None]
    """`train(trial)`: trains one trial with `trial.batch_size` (global), `trial.lr`,
    `trial.seed`, ..., calls `trial.report(...)` at each evaluation on every rank, and returns
    when `trial.should_stop()` says so. torch is seeded with `trial.seed` before it is called.
    `trial` is a batchscale.convergence.loop_trial.LoopTrial."""
    metrics: tuple[str, ...] = ("val_loss",)
    """The metrics `report` carries, as target names (val_loss, val_accuracy, train_loss, ...:
    docs/your-model.md lists them; their direction is known)."""
    targets: tuple[tuple[str, float], ...] = ()
    """The loop's default targets, e.g. (("val_accuracy", 0.9),): used when the config sets
    none (`convergence.targets`). Empty: a config must name one."""
    tokens_per_sample: int | None = None
    """Language models: tokens in one example, for tokens/s."""
    description: str = ""
    """One line for `batchscale workloads` and the report."""


def is_loop(value: object) -> bool:
    """Whether `value` is a TrainingLoop."""
    return isinstance(value, TrainingLoop)


class LoopStop(Exception):
    """Raised inside `report` when the trial must end at once: never seen by a well-behaved
    loop, which checks `should_stop()` after each report."""
