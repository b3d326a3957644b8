"""An ordinary PyTorch training script — argparse, its own Dataset with augmentation, its own
loss, its own loop — that batchscale runs as a trial function. The lines marked `batchscale:`
are all that was added to the script; run on its own it trains as before:

    python train_digits.py --batch-size 32 --lr 0.05 --steps 300

and batchscale runs its loop once per trial (batch size x LR x seed) to a target, then fits
the critical batch and recommends (docs/your-model.md, "Your own training loop"):

    batchscale converge --workload train_digits:loop --config config.yaml --out conv
    batchscale analyze  conv/runs.parquet --out analysis
"""

import argparse
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

from batchscale import TrainingLoop  # batchscale:

VAL_EVERY = 5  # every 5th image is held out for validation
NOISE_STD = 0.05
FOCAL_GAMMA = 1.0


class Digits(Dataset):
    """scikit-learn's bundled 8x8 digits (1,797 images, no download) scaled to [0, 1]; the
    training split is augmented with a random one-pixel shift and Gaussian pixel noise."""

    def __init__(self, split: str):
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        held_out = torch.arange(len(images)) % VAL_EVERY == 0
        keep = held_out if split == "val" else ~held_out
        self.images, self.labels = images[keep], torch.tensor(digits.target)[keep]
        self.augment = split == "train"

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = self.images[i]
        if self.augment:
            shift = int(torch.randint(-1, 2, ()))
            image = torch.roll(image, shifts=shift, dims=-1)
            image = image + NOISE_STD * torch.randn_like(image)
        return image, self.labels[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def focal_loss(logits, labels, gamma: float = FOCAL_GAMMA):
    """Cross-entropy that down-weights examples the model already gets right."""
    log_p = F.log_softmax(logits.float(), dim=1).gather(1, labels[:, None]).squeeze(1)
    return (-(1 - log_p.exp()) ** gamma * log_p).mean()


@torch.no_grad()
def validate(model, val: Dataset, device: str) -> dict:
    model.eval()
    images, labels = val.images.to(device), val.labels.to(device)
    logits = model(images)
    model.train()
    return {"val_loss": float(F.cross_entropy(logits, labels)),
            "val_accuracy": float((logits.argmax(1) == labels).float().mean())}


def fit(batch_size: int, lr: float, seed: int, steps: int, eval_every: int, trial=None):
    """The script's training loop; with a batchscale `trial`, its settings and hooks."""
    torch.manual_seed(seed)
    device = trial.device if trial else "cpu"
    train, val = Digits("train"), Digits("val")
    model = Net()
    model = trial.prepare(model) if trial else model.to(device)  # batchscale: DDP + noise scale
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True)
    if trial:  # batchscale: this rank's slice of each global batch, the same for any workers
        loader = DataLoader(train, batch_sampler=trial.batch_sampler(len(train)))
    else:
        sampler = RandomSampler(train, replacement=True, num_samples=steps * batch_size)
        loader = DataLoader(train, batch_size=batch_size, sampler=sampler)
    model.train()
    for step, (images, labels) in enumerate(loader, start=1):
        if trial:  # batchscale: the config's warm-up and decay
            for group in opt.param_groups:
                group["lr"] = trial.lr_at(step - 1)
        loss = focal_loss(model(images.to(device)), labels.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % eval_every == 0 or step == steps:
            with trial.evaluating() if trial else nullcontext():  # batchscale: not timed
                metrics = validate(model, val, device)
            if trial:
                trial.report(step=step, metrics=metrics)  # batchscale:
                if trial.should_stop():  # batchscale:
                    return
            else:
                print(f"step {step}: {metrics}")
            if step >= steps:
                return


def train(trial):  # batchscale: one trial of the grid
    fit(trial.batch_size, trial.lr, trial.seed, trial.max_steps, trial.eval_every_steps, trial)


loop = TrainingLoop(  # batchscale:
    name="digits-script",
    train=train,
    metrics=("val_loss", "val_accuracy"),
    targets=(("val_accuracy", 0.93),),
    description="an ordinary script's loop: 2-conv CNN, focal loss, shift + noise augmentation",
)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=25)
    args = parser.parse_args()
    fit(args.batch_size, args.lr, args.seed, args.steps, args.eval_every)
