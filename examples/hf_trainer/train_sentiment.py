"""An existing Hugging Face `Trainer` script — a small BERT classifier built from a config (random
weights, nothing downloaded) on a synthetic sentiment task — that batchscale runs as a trial
function. The lines marked `batchscale:` are all that was added; run on its own it trains as
before:

    python train_sentiment.py --batch-size 32 --lr 1e-3

and batchscale runs the Trainer once per trial (batch size x LR x seed) to a target, then fits
the critical batch and recommends (docs/your-model.md, "A Hugging Face Trainer as your loop"):

    batchscale converge --workload train_sentiment:loop --config config.yaml --out conv
    batchscale analyze  conv/runs.parquet --out analysis

Needs transformers and accelerate (`pip install transformers accelerate`).
"""

import argparse

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from batchscale import TrainingLoop  # batchscale:

VOCAB, LENGTH = 200, 24
SENTIMENT_WORDS = 3  # per sentence, all of one kind
LABEL_NOISE = 0.1


class Reviews(Dataset):
    """Random 'sentences' of token ids, each with three words of one sentiment (ids 10-19
    good, 20-29 bad) planted at random places; 10 % of the labels flipped. Items are the dicts
    a Hugging Face model takes: input_ids, attention_mask, labels."""

    def __init__(self, rows: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(30, VOCAB, (rows, LENGTH), generator=g)
        labels = torch.randint(0, 2, (rows,), generator=g)
        for i in range(rows):
            places = torch.randperm(LENGTH, generator=g)[:SENTIMENT_WORDS]
            first = 10 if labels[i] else 20
            self.ids[i, places] = first + torch.randint(0, 10, (SENTIMENT_WORDS,), generator=g)
        flip = torch.rand(rows, generator=g) < LABEL_NOISE
        self.labels = torch.where(flip, 1 - labels, labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": self.labels[i]}


def build_model():
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=128,
                        max_position_embeddings=LENGTH, num_labels=2)
    return BertForSequenceClassification(config)


def accuracy(prediction) -> dict:
    return {"accuracy": float((np.argmax(prediction.predictions, -1)
                               == prediction.label_ids).mean())}


class ReportToBatchscale(TrainerCallback):  # batchscale: each evaluation is a report
    def __init__(self, trial):
        self.trial = trial

    def on_train_begin(self, args, state, control, **kwargs):
        self.trial.start_training()  # the model, data and Trainer are built: not timed

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.trial.report(step=state.global_step, metrics={
            "val_loss": metrics["eval_loss"], "val_accuracy": metrics["eval_accuracy"]},
            lr=kwargs["optimizer"].param_groups[0]["lr"])  # the Trainer's own schedule
        if self.trial.should_stop():
            control.should_training_stop = True


def fit(batch_size: int, lr: float, seed: int, steps: int, eval_every: int, trial=None):
    """The script's training: a Trainer on the reviews; with a batchscale `trial`, its settings
    and hooks."""

    class ScriptTrainer(Trainer):
        measuring = False

        def training_step(self, model, *args, **kwargs):
            if trial is not None and not self.measuring:  # batchscale: with 2+ workers, B_simple
                trial.measure_noise(model)  # from the DDP all-reduce (before the 1st backward)
                self.measuring = True
            return super().training_step(model, *args, **kwargs)

        def evaluate(self, *args, **kwargs):
            if trial is None:
                return super().evaluate(*args, **kwargs)
            with trial.evaluating():  # batchscale: evaluation is not training time
                return super().evaluate(*args, **kwargs)

    args = TrainingArguments(
        output_dir="trainer-output", per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=256, learning_rate=lr, max_steps=steps, seed=seed,
        eval_strategy="steps", eval_steps=eval_every, save_strategy="no", report_to=[],
        use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
        ddp_find_unused_parameters=False,  # every parameter is used: skip DDP's search
    )
    trainer = ScriptTrainer(model=build_model(), args=args, train_dataset=Reviews(4000, 0),
                            eval_dataset=Reviews(500, 1), compute_metrics=accuracy,
                            callbacks=[ReportToBatchscale(trial)] if trial else [])
    if trial:
        trainer.remove_callback(PrinterCallback)  # batchscale: batchscale prints progress
    trainer.train()


def train(trial):  # batchscale: one trial of the grid
    fit(trial.local_batch_size, trial.lr, trial.seed, trial.max_steps, trial.eval_every_steps,
        trial)


loop = TrainingLoop(  # batchscale:
    name="bert-sentiment-trainer",
    train=train,
    metrics=("val_loss", "val_accuracy"),
    targets=(("val_accuracy", 0.85),),
    description="a Hugging Face Trainer script: 2-layer BERT from a config, synthetic reviews",
)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=25)
    args = parser.parse_args()
    fit(args.batch_size, args.lr, args.seed, args.steps, args.eval_every)
