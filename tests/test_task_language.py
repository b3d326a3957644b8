"""The byte-level language-model task: model shapes, batches, loss, chunked evaluation, FLOPs
counted as the sweep counts them, and a short training run on the Python-docs corpus that must
lower the validation loss well below the uniform guess."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from batchscale.data.text import byte_sequences, python_docs_text
from batchscale.errors import BadInput
from batchscale.tasks import language

SEQ_LEN = 32
UNIFORM_NATS = math.log(language.VOCAB_SIZE)  # 5.545: the loss of guessing every byte equally


def tiny_decoder(seed: int = 0, seq_len: int = SEQ_LEN) -> torch.nn.Module:
    torch.manual_seed(seed)
    return language.build_decoder(seq_len, d_model=32, layers=2, heads=4)


def byte_rows(rows: int, seq_len: int = SEQ_LEN, seed: int = 0) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, 256, (rows, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    return ids.float(), ids[:, -1].clone()


# ------------------------------------------------------------------------------ shapes
def test_decoder_and_lstm_give_logits_per_position():
    ids = torch.randint(0, 256, (3, 16))
    assert tiny_decoder()(ids).shape == (3, 16, 256)  # shorter than seq_len works too
    assert tiny_decoder()(torch.randint(0, 256, (2, SEQ_LEN))).shape == (2, SEQ_LEN, 256)
    assert language.build_lstm(d_model=16)(ids).shape == (3, 16, 256)


def test_decoder_is_causal():
    """Changing a later byte must not change the logits of earlier positions."""
    model = tiny_decoder().eval()
    ids = torch.randint(0, 256, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] + 1) % 256
    before, after = model(ids), model(changed)
    assert torch.equal(before[0, :8], after[0, :8])
    assert not torch.allclose(before[0, 8:], after[0, 8:])


def test_to_batch_shifts_by_one_byte():
    x, y = byte_rows(4)
    inputs, targets = language.to_batch(x, y, "cpu")
    assert inputs.dtype == targets.dtype == torch.long
    assert inputs.shape == targets.shape == (4, SEQ_LEN)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert torch.equal(targets[:, -1], y)


def test_synthetic_batch_is_random_bytes_fixed_by_the_seed():
    inputs, targets = language.synthetic_batch(5, "cpu", seed=3, seq_len=16)
    assert inputs.shape == targets.shape == (5, 16) and inputs.dtype == torch.long
    assert 0 <= int(inputs.min()) and int(inputs.max()) < 256
    again, _ = language.synthetic_batch(5, "cpu", seed=3, seq_len=16)
    other, _ = language.synthetic_batch(5, "cpu", seed=4, seq_len=16)
    assert torch.equal(inputs, again) and not torch.equal(inputs, other)
    assert language.synthetic_batch(2, "cpu")[0].shape == (2, language.DEFAULT_SEQ_LEN)


def test_untrained_loss_is_the_uniform_guess():
    model = tiny_decoder()
    loss = language.loss(model, language.to_batch(*byte_rows(8), "cpu"))
    assert loss.item() == pytest.approx(UNIFORM_NATS, abs=0.05)


@pytest.mark.parametrize(("build", "needle"), [
    (lambda: language.build_decoder(16, d_model=30, heads=4), "multiple of heads 4"),
    (lambda: language.build_decoder(0), "must be at least 1"),
    (lambda: language.build_lstm(layers=0), "must be at least 1"),
    (lambda: language.to_batch(torch.zeros(4), torch.zeros(4), "cpu"), r"shape \(4,\)"),
])
def test_bad_sizes_are_refused(build, needle):
    with pytest.raises(BadInput, match=needle):
        build()


def test_weights_depend_only_on_the_seed():
    first, again, other = tiny_decoder(0), tiny_decoder(0), tiny_decoder(1)
    for name, value in first.state_dict().items():
        assert torch.equal(value, again.state_dict()[name]), name
    assert not torch.equal(first.head.weight, other.head.weight)


# ---------------------------------------------------------------------------- evaluate
def test_evaluate_is_the_token_weighted_mean_over_chunks(monkeypatch):
    model = tiny_decoder()
    x, y = byte_rows(10)
    whole = language.evaluate(model, x, y, "cpu", contextlib.nullcontext)
    with torch.no_grad():
        direct = language.loss(model.eval(), language.to_batch(x, y, "cpu")).item()
    assert whole["loss"] == pytest.approx(direct, rel=1e-6)
    assert whole["perplexity"] == pytest.approx(math.exp(whole["loss"]), rel=1e-9)
    # 7 rows per chunk: chunks of 7 and 3 rows. A plain mean of the two chunk means would
    # weigh the 3 rows as much as the 7 and differ from the whole.
    monkeypatch.setattr(language, "EVAL_CHUNK_TOKENS", 7 * SEQ_LEN)
    chunks = []
    to_batch = language.to_batch

    def counting_to_batch(*args):
        chunks.append(1)
        return to_batch(*args)

    monkeypatch.setattr(language, "to_batch", counting_to_batch)
    chunked = language.evaluate(model, x, y, "cpu", contextlib.nullcontext)
    assert len(chunks) == 2
    assert chunked["loss"] == pytest.approx(whole["loss"], rel=1e-6)


@pytest.mark.parametrize("training", [True, False])
def test_evaluate_leaves_weights_and_modes_as_found(training):
    model = tiny_decoder()
    model.train(training)
    model.blocks[0].mlp.train(not training)  # a mixed state must come back exactly
    modes = [m.training for m in model.modules()]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    language.evaluate(model, *byte_rows(6), "cpu", contextlib.nullcontext)
    assert [m.training for m in model.modules()] == modes
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert all(p.grad is None for p in model.parameters())


def test_evaluate_refuses_an_empty_split():
    with pytest.raises(BadInput, match="no sequences"):
        language.evaluate(tiny_decoder(), *byte_rows(0), "cpu", contextlib.nullcontext)


# ------------------------------------------------------------------------------- FLOPs
def test_train_flops_are_about_six_per_parameter_per_token():
    """The sweep counts a step's FLOPs with FlopCounterMode around loss.backward(): forward
    2 and backward 4 multiply-adds per weight per token (Kaplan et al. 2020's C = 6N per token;
    embeddings are lookups, not matmuls, so N excludes them). Attention scores add up to
    12 x layers x T x d per token when the SDPA kernel is one FlopCounterMode knows (CUDA);
    CPU's is not counted, so the ratio is 0.97 here (LayerNorm weights and biases are in N
    but do no matmul)."""
    model = tiny_decoder(seq_len=64)
    batch = language.synthetic_batch(4, "cpu", seq_len=SEQ_LEN)
    counter = FlopCounterMode(display=False)
    with counter:
        language.loss(model, batch).backward()
    embeddings = model.token_embedding.weight.numel() + model.position_embedding.weight.numel()
    weights = sum(p.numel() for p in model.parameters()) - embeddings
    tokens = 4 * SEQ_LEN
    ratio = counter.get_total_flops() / (6 * weights * tokens)
    attention_share = 12 * 2 * SEQ_LEN * 32 / (6 * weights)
    assert 0.95 <= ratio <= 1.0 + attention_share + 0.02


# ---------------------------------------------------------------------------- learning
@pytest.mark.parametrize(("build", "most_nats"), [
    # Measured (torch 2.14, CPU): the decoder (d_model 32) goes 5.54 -> 2.88 nats/token,
    # the LSTM (d_model 64) 5.57 -> 3.00; the bounds leave 0.15-0.2 nats of room.
    (lambda: tiny_decoder(), 3.1),
    (lambda: (torch.manual_seed(0), language.build_lstm(d_model=64))[1], 3.15),
])
def test_sixty_adamw_steps_learn_the_python_docs(build, most_nats):
    raw = byte_sequences(python_docs_text()[:40_000], SEQ_LEN, "python docs")
    x, y = torch.from_numpy(raw.features), torch.from_numpy(raw.labels)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, val = order[:384], order[384:512]
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = language.evaluate(model, x[val], y[val], "cpu", contextlib.nullcontext)
    picks = torch.Generator().manual_seed(1)
    for _ in range(60):
        rows = train[torch.randint(0, len(train), (32,), generator=picks)]
        loss = language.loss(model, language.to_batch(x[rows], y[rows], "cpu"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = language.evaluate(model, x[val], y[val], "cpu", contextlib.nullcontext)
    assert before["loss"] == pytest.approx(UNIFORM_NATS, abs=0.1)
    assert after["loss"] < most_nats
    assert after["perplexity"] < math.exp(most_nats)
    # No predictor that ignores context beats the entropy of the validation bytes' own
    # frequencies (3.18 nats here): getting below it means the model uses the preceding bytes.
    assert after["loss"] < byte_entropy_nats(x[val][:, 1:])


def byte_entropy_nats(ids: torch.Tensor) -> float:
    shares = torch.bincount(ids.long().ravel(), minlength=256).double() / ids.numel()
    shares = shares[shares > 0]
    return float(-(shares * shares.log()).sum())
