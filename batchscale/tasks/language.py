"""Byte-level causal language modelling: a small decoder-only transformer (or an LSTM, as in
the original study) predicting each next byte of text.

A stored example is seq_len + 1 byte ids as float32 (batchscale/data/text.py); `to_batch` splits
it into inputs (bytes 0..seq_len-1) and targets (bytes 1..seq_len), so every position is trained,
not only the last. The sample unit is a sequence; tokens per sample = seq_len. Loss and metrics
are in nats per token. See docs/architecture.md ("How to add a workload").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch import nn

from batchscale.errors import BadInput
from batchscale.tasks.builtin import evaluate_rows

VOCAB_SIZE = 256
DEFAULT_SEQ_LEN = 64
MLP_EXPANSION = 4
INIT_STD = 0.02
"""GPT-2's initialisation: small embeddings and weights keep the first logits near uniform,
so the untrained loss starts at about ln(256) = 5.55 nats."""
EVAL_CHUNK_TOKENS = 131_072
"""Tokens per evaluation chunk: at seq_len 64 that is 2048 rows, and the chunk's logits take
131072 x 256 x 4 bytes = 134 MB (the largest tensor of the forward)."""
MAX_EVAL_CHUNK_ROWS = 4096

Batch = tuple[torch.Tensor, torch.Tensor]


def example_shape(seq_len: int) -> tuple[int, ...]:
    """The stored feature shape: the input bytes and one more, the last target."""
    return (seq_len + 1,)


def input_shape(seq_len: int) -> tuple[int, ...]:
    """What the model takes: seq_len byte ids."""
    return (seq_len,)


# -------------------------------------------------------------------------------- models
class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(attended.transpose(1, 2).reshape(n, t, d))


class DecoderBlock(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.mlp_norm = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, MLP_EXPANSION * d_model), nn.GELU(),
                                 nn.Linear(MLP_EXPANSION * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class ByteDecoder(nn.Module):
    """Token and learned position embeddings, pre-norm decoder blocks, a final LayerNorm and
    an untied head to 256 logits. Input (n, T) byte ids with T <= seq_len; output (n, T, 256)."""

    def __init__(self, seq_len: int, d_model: int, layers: int, heads: int):
        super().__init__()
        self.seq_len = seq_len
        self.token_embedding = nn.Embedding(VOCAB_SIZE, d_model)
        self.position_embedding = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, heads) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB_SIZE, bias=False)
        self.apply(_init_weights)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token_embedding(ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x))


class ByteLSTM(nn.Module):
    """Embedding, LSTM, linear head: the recurrent language model of the original study."""

    def __init__(self, d_model: int, layers: int):
        super().__init__()
        self.token_embedding = nn.Embedding(VOCAB_SIZE, d_model)
        self.lstm = nn.LSTM(d_model, d_model, num_layers=layers, batch_first=True)
        self.head = nn.Linear(d_model, VOCAB_SIZE)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.token_embedding(ids))
        return self.head(hidden)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=INIT_STD)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def build_decoder(seq_len: int, d_model: int = 128, layers: int = 2,
                  heads: int = 4) -> ByteDecoder:
    """The decoder-only transformer; its weights depend only on torch's seed."""
    if seq_len < 1 or d_model < 1 or layers < 1 or heads < 1:
        raise BadInput(f"byte decoder: seq_len {seq_len}, d_model {d_model}, layers {layers}, "
                       f"heads {heads}: each must be at least 1")
    if d_model % heads:
        raise BadInput(f"byte decoder: d_model {d_model} must be a multiple of heads {heads} "
                       "(each head gets d_model / heads dimensions)")
    return ByteDecoder(seq_len, d_model, layers, heads)


def build_lstm(d_model: int = 128, layers: int = 1) -> ByteLSTM:
    """The LSTM language model. torch's FlopCounterMode counts no FLOPs inside nn.LSTM (only
    the head's), so its MFU in the sweep is an underestimate."""
    if d_model < 1 or layers < 1:
        raise BadInput(f"byte LSTM: d_model {d_model} and layers {layers} must be at least 1")
    return ByteLSTM(d_model, layers)


# ------------------------------------------------------------------------- batch and loss
def to_batch(x: torch.Tensor, y: torch.Tensor, device: str | torch.device) -> Batch:
    """(inputs, next-byte targets), both int64 (n, seq_len), on `device`. `y` (the last byte)
    is already the last target, so it is not used."""
    del y
    if x.dim() != 2 or x.shape[1] < 2:
        raise BadInput(f"language model batch: features of shape {tuple(x.shape)}; expected "
                       "(rows, seq_len + 1) byte ids with seq_len >= 1")
    ids = x.to(device=device, dtype=torch.long)
    return ids[:, :-1], ids[:, 1:]


def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy in nats per token over every position of the batch."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), targets.reshape(-1))


def synthetic_batch(batch_size: int, device: str | torch.device, seed: int = 0,
                    seq_len: int = DEFAULT_SEQ_LEN) -> Batch:
    """Random byte ids as a batch on the device, for the throughput sweep (pure compute)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB_SIZE, (batch_size, seq_len + 1), generator=gen)
    return to_batch(ids.float(), ids[:, -1], device)


# ------------------------------------------------------------------------------ metrics
def eval_rows(example_shape: tuple[int, ...]) -> int:
    """Sequences per evaluation batch: EVAL_CHUNK_TOKENS tokens (at most MAX_EVAL_CHUNK_ROWS)."""
    return eval_chunk_rows(example_shape[0] - 1)


def eval_chunk_rows(seq_len: int) -> int:
    return max(1, min(MAX_EVAL_CHUNK_ROWS, EVAL_CHUNK_TOKENS // seq_len))


def evaluate_batches(model: nn.Module, batches) -> dict[str, float]:
    """"loss" (nats per token over every token of the batches) and "perplexity" (exp of it);
    the model in eval mode without gradients (the caller's)."""
    total_nats, tokens = 0.0, 0
    for inputs, targets in batches:
        logits = model(inputs)
        # float32 logits, a float64 sum: a bf16 sum over 100k tokens would lose the digits.
        total_nats += F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE),
                                      targets.reshape(-1), reduction="sum").item()
        tokens += targets.numel()
    if tokens == 0:
        raise BadInput("language model evaluation: the split has no sequences")
    mean_nats = total_nats / tokens
    return {"loss": mean_nats, "perplexity": math.exp(mean_nats)}


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: str | torch.device,
             autocast: Callable[[], AbstractContextManager]) -> dict[str, float]:
    """`evaluate_batches` over whole rows, in chunks of `eval_chunk_rows`; the model's
    train/eval modes and weights are left as found."""
    if len(x) == 0:
        raise BadInput("language model evaluation: the split has no sequences")
    return evaluate_rows(model, x, y, device, autocast, eval_chunk_rows(x.shape[1] - 1),
                         to_batch=to_batch, evaluate_batches=evaluate_batches)
