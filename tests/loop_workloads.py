"""Training loops (batchscale.TrainingLoop) for tests/test_loop.py: a small well-behaved one on
the contract tests' points, and one that misbehaves in each way a user's loop can. Imported by
the CLI from the tests directory (its cwd)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from contract_workloads import Points, mlp
from torch.utils.data import DataLoader

from batchscale import TrainingLoop

TRAIN, VAL = Points(600, 0), Points(200, 1)


def accuracy(model) -> float:
    with torch.no_grad():
        return float((model(VAL.x).argmax(1) == VAL.y).float().mean())


def points_loop(trial, misbehave: str | None = None, model=None) -> None:
    """SGD on the points to the target; `misbehave` names the way it goes wrong at batch 16;
    `model`: one the loop prepared itself (default: `trial.prepare`'s)."""
    model = trial.prepare(mlp()) if model is None else model
    opt = torch.optim.SGD(model.parameters(), lr=trial.lr)
    bad = misbehave if trial.batch_size == 16 else None
    if bad == "silent":
        return
    loader = DataLoader(TRAIN, batch_sampler=trial.batch_sampler(len(TRAIN)))
    for step, (x, y) in enumerate(loader, start=1):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if bad == "raises" and step == 7:
            raise RuntimeError("out of ideas at step 7")
        if step % trial.eval_every_steps == 0:
            with trial.evaluating():
                metrics = {"val_accuracy": accuracy(model), "train_loss": float(loss)}
            if bad == "nan":
                metrics["val_accuracy"] = float("nan")
            if bad == "undeclared":
                metrics["val_f1"] = 0.5
            trial.report(step=step, metrics=metrics)
            if trial.should_stop():
                return


good_loop = TrainingLoop(name="points-loop", train=points_loop, metrics=("val_accuracy",),
                         targets=(("val_accuracy", 0.9),))


def _misbehaving(how: str) -> TrainingLoop:
    return dataclasses.replace(good_loop, name=f"points-{how}",
                               train=lambda trial: points_loop(trial, how))


raises, silent, nan, undeclared = (_misbehaving(how) for how in
                                   ("raises", "silent", "nan", "undeclared"))


def framework_ddp_loop(trial, wrap: str = "own") -> None:
    """As a framework does (a Hugging Face Trainer, Lightning): the loop wraps the model in DDP
    itself and asks batchscale to measure the noise scale on it. Two mistakes: `wrap="plain"`
    passes the plain model, `wrap="prepared"` a model `trial.prepare` already measures."""
    model = trial.prepare(mlp()) if wrap == "prepared" else mlp()
    if trial.world_size > 1 and wrap == "own":
        model = torch.nn.parallel.DistributedDataParallel(model)
    trial.measure_noise(model)
    points_loop(trial, model=model)


framework_ddp = dataclasses.replace(good_loop, name="points-own-ddp", train=framework_ddp_loop)
framework_plain, framework_prepared = (
    dataclasses.replace(good_loop, name=f"points-{how}",
                        train=lambda trial, how=how: framework_ddp_loop(trial, how))
    for how in ("plain", "prepared"))
unknown_metric = dataclasses.replace(good_loop, metrics=("val_f1",))
unreported_target = dataclasses.replace(good_loop, targets=(("val_loss", 0.1),))


def hanging_loop(trial) -> None:
    """The points loop, but at batch 16 with BATCHSCALE_TEST_HANG set it reports once and then
    waits, as a slow trial does (the stopping tests signal the run while it waits)."""
    import os
    import time

    if trial.batch_size == 16 and os.environ.get("BATCHSCALE_TEST_HANG"):
        trial.report(step=1, metrics={"val_accuracy": 0.0})
        while not trial.should_stop():
            time.sleep(0.05)
        return
    points_loop(trial)


hanging = dataclasses.replace(good_loop, name="points-hanging", train=hanging_loop)
