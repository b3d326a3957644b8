"""A user's workload checked before any trial starts, and the parts of the contract that
batchscale derives when the workload does not give them (its splits, a synthetic batch, its
default targets).

Each check runs the user's own code once on two examples, so a model that rejects its batches,
a loss that is not a finite scalar, a metric a target names but `evaluate` does not return, or a
dataset smaller than one global batch is refused (exit 2) naming the member, what it got and
what was expected, instead of failing inside every trial.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterable

from batchscale.contract import Batch, to_device
from batchscale.errors import BadInput
from batchscale.metrics import METRICS

CHECK_EXAMPLES = 2
"""Examples in the batch a check runs through the model (2: batch norm needs more than 1)."""


# ------------------------------------------------------------------ derived parts
def load_split(contract, split: str):
    """The contract's `train_data` or `val_data` as a DatasetSplit; refused (naming the member)
    when it is missing, fails, or is not a non-empty map-style dataset."""
    from batchscale.datasplit import DatasetSplit

    member = f"{split}_data"
    factory = getattr(contract, member)
    where = f"workload {contract.name!r}: Workload.{member}"
    if factory is None:
        raise BadInput(f"{where} is not given; convergence trials need a training and a "
                       "validation dataset (map-style: __len__ and __getitem__)")
    try:
        dataset = factory()
    except BadInput:
        raise
    except Exception as err:
        raise BadInput(f"{where} failed: {type(err).__name__}: {err}") from None
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise BadInput(f"{where} returned {type(dataset).__name__}, not a map-style dataset "
                       "(an object with __len__ and __getitem__, e.g. torch.utils.data.Dataset)")
    if len(dataset) < 1:
        raise BadInput(f"{where} returned an empty dataset")
    return DatasetSplit(contract, dataset, member)


def synthetic_batch(contract, batch_size: int, device: str) -> Batch:
    """The contract's `synthetic_batch(batch_size)`, or real training examples cycled to the
    batch size and collated (their shapes, dtypes and targets are the real ones)."""
    if contract.synthetic_batch is not None:
        return to_device(contract.synthetic_batch(batch_size), device)
    import torch

    train = load_split(contract, "train")
    idx = torch.arange(batch_size) % len(train)
    return train.batch(idx, device)


def default_targets(contract) -> list[dict]:
    """The contract's default targets as config entries ({"metric", "value"})."""
    return [{"metric": metric, "value": float(value)} for metric, value in contract.targets]


def with_workload_targets(cfg, workload):
    """`cfg` with the workload's default targets when the config names none of its own (a
    contract workload owns its targets). The built-in default, `target_val_accuracy: 0.95`
    (the embedded config's), counts as none: a config that wants exactly that target for such
    a workload lists it under `convergence.targets`."""
    from batchscale.config import ExperimentConfig
    from batchscale.config.convergence import DEFAULT_TARGET_VAL_ACCURACY
    from batchscale.config.loading import with_overrides

    contract = getattr(workload, "user_workload", None)
    c = cfg.convergence
    builtin = c.target_val_accuracy in (None, DEFAULT_TARGET_VAL_ACCURACY)
    if contract is None or not contract.targets or c.targets or not builtin:
        return cfg
    targets = {"targets": default_targets(contract), "target_val_accuracy": None}
    if isinstance(cfg, ExperimentConfig):
        return with_overrides(cfg, {"convergence": targets},
                              f"workload {contract.name!r} (Workload.targets)")
    # A pipeline step's config (StageConfig) holds sections only: replace the one, validated.
    section = type(c).model_validate({**c.model_dump(mode="json"), **targets})
    return cfg.model_copy(update={"convergence": section})


# ------------------------------------------------------------------ checks
def check_workload(workload, *, batch_sizes: Iterable[int] | str = (), targets: Iterable = (),
                   convergence: bool = False, probe_synthetic: bool = False,
                   device: str = "cpu") -> None:
    """Refuse a user workload that cannot run (BadInput, exit 2) before any trial: it builds;
    a contract workload's loss on two real examples is a finite scalar, its `evaluate` returns
    the metrics it declares and the targets need, and its training split holds the largest
    global batch; with `probe_synthetic` (the sweep) a model factory's loss on two synthetic
    examples of the configured shape. The registered workloads are not checked: they are known
    to work."""
    from batchscale.workloads import WORKLOAD_NAMES

    if workload.name in WORKLOAD_NAMES:
        return
    if workload.loop is not None:
        _check_loop(workload, convergence, targets)
        return
    model = _built(workload)
    contract = workload.contract
    if contract is None:
        if probe_synthetic:
            _check_factory_input(workload, model, device)
        return
    if isinstance(batch_sizes, str):  # "auto": the search finds what fits
        batch_sizes = ()
    _check_declared_metrics(contract)
    _check_eval_batch_size(contract)
    _check_targets(contract, workload.metrics, targets)
    if contract.train_data is None and not convergence:
        return  # a sweep of synthetic batches only
    train = load_split(contract, "train")
    largest = max(batch_sizes, default=0)
    if largest > len(train):
        raise BadInput(f"workload {contract.name!r}: Workload.train_data has {len(train)} "
                       f"examples, fewer than the largest global batch {largest}; give more "
                       "data or smaller batch sizes")
    model = model.to(device)
    _check_loss(contract, model, train, device)
    if convergence:
        _check_evaluate(contract, model, load_split(contract, "val"), device)


def _check_loop(workload, convergence: bool, targets: Iterable) -> None:
    """A training loop: its metrics are known names and its targets on them; it trains only in
    convergence trials (there is no model to sweep)."""
    loop = workload.loop
    if not convergence:
        workload.build()  # refuses, saying what a loop can be used for
    for name in loop.metrics:
        if name not in METRICS:
            raise BadInput(f"workload {loop.name!r}: TrainingLoop.metrics names {name!r}; "
                           f"allowed: {', '.join(METRICS)}")
    _check_targets(loop, workload.metrics, targets)


def _built(workload):
    try:
        return workload.build()
    except BadInput:
        raise
    except Exception as err:
        member = "Workload.model" if workload.contract is not None else "the factory"
        raise BadInput(f"workload {workload.name!r}: {member} failed: "
                       f"{type(err).__name__}: {err}") from None


def _check_declared_metrics(contract) -> None:
    for name in contract.metrics:
        if name not in METRICS or not name.startswith("val_"):
            allowed = ", ".join(m for m in METRICS if m.startswith("val_"))
            raise BadInput(f"workload {contract.name!r}: Workload.metrics names {name!r}; "
                           f"allowed: {allowed} (train_loss is always measured)")


def _check_eval_batch_size(contract) -> None:
    size = contract.eval_batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise BadInput(f"workload {contract.name!r}: Workload.eval_batch_size is {size!r}; "
                       "expected a whole number of examples, at least 1")


def _check_targets(contract, measured: tuple[str, ...], targets: Iterable) -> None:
    for metric in [*(t.metric for t in targets), *(m for m, _ in contract.targets)]:
        if metric not in measured:
            raise BadInput(f"workload {contract.name!r}: a target is on {metric}, which "
                           f"the workload does not report; its metrics "
                           f"({type(contract).__name__}.metrics): {', '.join(measured)}")


def _check_loss(contract, model, train, device: str) -> None:
    import torch

    idx = torch.arange(min(CHECK_EXAMPLES, len(train)))
    where = f"workload {contract.name!r}"
    try:
        batch = train.batch(idx, device)
    except Exception as err:
        raise BadInput(f"{where}: Workload.collate could not make a batch of "
                       f"{len(idx)} training examples: {type(err).__name__}: {err}") from None
    try:
        loss = contract.loss(model, batch)
    except Exception as err:
        raise BadInput(f"{where}: Workload.loss failed on a batch of {len(idx)} training "
                       f"examples {describe_batch(batch)}; the model must accept the batches "
                       f"its data make: {type(err).__name__}: {err}"
                       f"{transposed_list_hint(batch, len(idx))}") from None
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()
            and loss.requires_grad):
        raise BadInput(f"{where}: Workload.loss returned {_shown(loss)}; expected a scalar "
                       "floating-point tensor that requires grad (the mean loss of the batch)")
    if not math.isfinite(float(loss.detach())):
        raise BadInput(f"{where}: Workload.loss returned {float(loss.detach())} on the first "
                       "training examples; expected a finite value")


def _check_factory_input(workload, model, device: str) -> None:
    contract = workload.contract_for()
    batch = synthetic_batch(contract, CHECK_EXAMPLES, device)
    try:
        contract.loss(model.to(device), batch)
    except Exception as err:
        raise BadInput(f"workload {workload.name!r}: the model rejected a synthetic batch "
                       f"{describe_batch(batch)} of the shape a model factory is fed "
                       f"(sweep.image_size_px, {workload.num_classes} classes): "
                       f"{type(err).__name__}: {err}. A model that takes other inputs: give a "
                       "batchscale.Workload with its own data (docs/your-model.md)") from None


def _check_evaluate(contract, model, val, device: str) -> None:
    from contextlib import nullcontext

    head = val.head(CHECK_EXAMPLES)
    where = f"workload {contract.name!r}: Workload.evaluate"
    try:
        metrics = head.evaluate(model, device, nullcontext)
    except Exception as err:
        raise BadInput(f"{where} failed on {len(head)} validation examples: "
                       f"{type(err).__name__}: {err}") from None
    wanted = [m.removeprefix("val_") for m in contract.metrics]
    missing = [m for m in wanted if m not in metrics]
    if missing:
        raise BadInput(f"{where} returned the keys {sorted(metrics)}; Workload.metrics "
                       f"declares {', '.join(contract.metrics)}, so it must return "
                       f"{', '.join(missing)} (keys without the val_ prefix)")
    for key in wanted:
        try:
            float(metrics[key])
        except (TypeError, ValueError):
            raise BadInput(f"{where} returned {key}={_shown(metrics[key])}; expected a "
                           "number") from None


def describe_batch(batch: Batch) -> str:
    """A batch's structure as shapes and dtypes, for a message."""
    import torch

    if isinstance(batch, torch.Tensor):
        return f"tensor {list(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{k}: {describe_batch(v)}" for k, v in batch.items()) + "}"
    if isinstance(batch, list | tuple):
        return "(" + ", ".join(describe_batch(v) for v in batch) + ")"
    return type(batch).__name__


def transposed_list_hint(batch: Batch, rows: int) -> str:
    """Why a field of the batch is a list of per-position tensors, when one is: a Python list
    in each item, which torch's default_collate turns into one tensor per list position (each
    `rows` long) instead of one [rows, n] tensor; "" otherwise."""
    fields = batch.items() if isinstance(batch, dict) else (
        enumerate(batch) if isinstance(batch, list | tuple) else ())
    for name, value in fields:
        if _per_position(value, rows):
            field = repr(name) if isinstance(name, str) else f"at position {name}"
            return (f". The field {field} came out as {len(value)} tensors of {rows} values, "
                    "one per list position: each item holds a Python list (or tuple) there, "
                    "and the default collate stacks it position by position; return a tensor "
                    "from __getitem__ (torch.tensor(...)) or give Workload.collate")
    return ""


def _per_position(value: object, rows: int) -> bool:
    import torch

    return (isinstance(value, list | tuple) and len(value) >= 2 and rows >= 2
            and all(isinstance(v, torch.Tensor) and v.dim() == 1 and len(v) == rows
                    for v in value))


def scalar_loss(loss):
    """`loss` where it is one number, as the training step's backward needs; else a TypeError
    naming what Workload.loss returned (a loss fine on the check's few examples can still
    return one value per example on a bigger batch)."""
    numel = getattr(loss, "numel", None)
    if numel is None or numel() != 1:
        raise TypeError(f"Workload.loss returned {_shown(loss)} on this batch; expected a "
                        "scalar (the mean loss of the batch)")
    return loss


def _shown(value: object) -> str:
    """A returned value for a message: its type, its shape and dtype where it has them (what a
    truncated repr of a tensor hides), and its repr cut short."""
    shape = getattr(value, "shape", None)
    kind = type(value).__name__
    if shape is not None and hasattr(value, "dtype"):
        kind += f" of shape {list(shape)} ({value.dtype})"
    try:
        return f"{kind} {reprlib.repr(value)}"
    except Exception:
        return kind


