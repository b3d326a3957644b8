"""A Hugging Face causal language model through batchscale's workload contract.

A 2-layer GPT-2 built from a config with random weights (nothing is downloaded), byte-level
(vocabulary 256: no tokenizer), trained on the Python documentation's topic pages that ship
with CPython (`pydoc_data.topics`). The loss is the model's own `outputs.loss`; a sample is
one window of `SEQUENCE_BYTES` bytes, of which `SEQUENCE_BYTES - 1` are predicted tokens.

    batchscale sweep    --config config.yaml --out sweep.parquet
    batchscale converge --config config.yaml --out conv
    batchscale analyze  conv/runs.parquet --sweep sweep.parquet --out analysis
"""

import math

import torch
from torch.utils.data import Dataset

from batchscale import Workload

SEQUENCE_BYTES = 64
VAL_EVERY = 10  # every 10th window is held out for validation


def corpus() -> torch.Tensor:
    """The documentation topics in sorted order as one tensor of byte ids."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics)).encode()
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


class ByteWindows(Dataset):
    """Non-overlapping windows of the corpus; items are {"input_ids": LongTensor[SEQ]}."""

    def __init__(self, split: str):
        data = corpus()
        windows = data[: len(data) // SEQUENCE_BYTES * SEQUENCE_BYTES].view(-1, SEQUENCE_BYTES)
        held_out = torch.arange(len(windows)) % VAL_EVERY == 0
        self.windows = windows[held_out if split == "val" else ~held_out]

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.windows[i].long()}


def build_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=256, n_positions=SEQUENCE_BYTES, n_embd=64, n_layer=2,
                        n_head=2, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def loss(model, batch) -> torch.Tensor:
    """The model's own loss: next-byte cross-entropy, labels shifted inside the model."""
    return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


def evaluate(model, batches) -> dict[str, float]:
    """Mean next-byte loss (nats per predicted token) and its perplexity."""
    total, tokens = 0.0, 0
    for batch in batches:
        predicted = batch["input_ids"].numel() - len(batch["input_ids"])  # the first is given
        total += float(loss(model, batch)) * predicted
        tokens += predicted
    mean = total / tokens
    return {"loss": mean, "perplexity": math.exp(mean)}


workload = Workload(
    name="gpt2-bytes",
    model=build_model,
    loss=loss,
    train_data=lambda: ByteWindows("train"),
    val_data=lambda: ByteWindows("val"),
    evaluate=evaluate,
    metrics=("val_loss", "val_perplexity"),
    targets=(("val_loss", 3.0),),
    tokens_per_sample=SEQUENCE_BYTES - 1,
    description="2-layer GPT-2 (transformers, random weights), bytes of the Python docs",
)
