"""What pruning saved: trials stopped as `pruned` by successive halving over the tuned
rule's learning rates or by the adaptive search's bound, in one sentence for the report."""

from __future__ import annotations

import pandas as pd

from batchscale.fits import numeric_column, trained_trials
from batchscale.schemas import TUNED_RULE, RunStatus


def pruning_text(runs: pd.DataFrame) -> str:
    """The pruned trials, the steps they ran, and for successive halving the steps saved: per
    (batch size, seed), each pruned learning rate's steps short of the most any surviving one
    ran. An estimate, and a low one: a pruned rate was behind the survivors at its rung, so it
    would likely have needed more steps, or never reached. Empty when nothing was pruned."""
    trials = trained_trials(runs)
    pruned = trials["status"].eq(RunStatus.PRUNED).to_numpy(dtype=bool)
    if not pruned.any():
        return ""
    steps = numeric_column(trials, "steps_run")
    tuned = trials["lr_rule"].eq(TUNED_RULE).to_numpy(dtype=bool)
    frame = pd.DataFrame({"batch": numeric_column(trials, "batch_size"),
                          "seed": numeric_column(trials, "seed"), "steps": steps,
                          "pruned": pruned, "tuned": tuned})
    saved = 0.0
    for _, cell in frame[frame["tuned"]].groupby(["batch", "seed"]):
        kept = cell.loc[~cell["pruned"], "steps"]
        if len(kept):
            saved += (kept.max() - cell.loc[cell["pruned"], "steps"]).clip(lower=0).sum()
    halved, total = int((pruned & tuned).sum()), len(trials)
    text = (f"{int(pruned.sum())} of {total} trials stopped as pruned after "
            f"{int(steps[pruned].sum()):,} steps in all, left out of every fit")
    if halved:
        text += (f"; {halved} by successive halving over the learning rates, which saved at "
                 f"least ~{int(saved):,} steps (each pruned rate charged only the steps its "
                 "cell's longest surviving rate ran: an estimate)")
    if halved < pruned.sum():
        text += (f"; {int(pruned.sum()) - halved} by the adaptive search's bound "
                 "(hopelessly behind its fit)")
    return text + "."
