"""Named workloads: a model, its input shape and its loss. No pretrained weights are loaded.

torch and torchvision are imported inside the builders so that listing workloads or validating a
config stays fast.

A user workload, 'package.module:name', names either a `batchscale.Workload` (the public
contract, batchscale/contract.py: model, data, loss, metrics, targets), a no-argument function
returning one, or (the older form) a model factory returning a torch.nn.Module, trained as a
classifier on a prepared dataset. It runs the user's code with the user's rights: importing the
module runs its top level, and a function is called with no arguments (like any Python import
and call). Two guards keep a typo or a borrowed command line from doing something else:
a module of the standard library (os, builtins, subprocess, ...) is refused before anything is
imported, and whatever the factory returns must be a torch.nn.Module before it is used.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import reprlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from batchscale import names
from batchscale.contract import is_contract
from batchscale.errors import BadInput
from batchscale.loop import is_loop

CLASSIFIERS = ("resnet18", "resnet50", "mobilenet_v3_small", "vit_b_16")
DETECTORS = ("fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_resnet50_fpn")
SEGMENTERS = ("lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "fcn_resnet50")
LANGUAGE_MODELS = ("byte-transformer", "byte-lstm")
# The digits MLP at other hidden widths: a model-size axis for studies (docs/studies.md).
DIGITS_MLP_WIDTHS = {"digits-mlp-narrow": 32, "digits-mlp": 128, "digits-mlp-wide": 512}
WORKLOAD_NAMES = (*DIGITS_MLP_WIDTHS, "digits-cnn", *CLASSIFIERS, *DETECTORS, *SEGMENTERS,
                  *LANGUAGE_MODELS)
# The module that turns dataset rows into batches, a loss and metrics, per kind of task.
TASK_MODULES = {
    "classification": "batchscale.tasks.classification",
    "detection": "batchscale.tasks.detection",
    "segmentation": "batchscale.tasks.segmentation",
    "language_model": "batchscale.tasks.language",
}
# A workload of the public contract: its own data, loss and metrics (batchscale/contract.py).
CONTRACT_KIND = "custom"
# A user's own training loop (batchscale/loop.py): batchscale sees only what it reports.
LOOP_KIND = "loop"
# Language models: byte-level (256 symbols, no tokenizer to download); a sequence of
# LM_SEQ_LEN bytes is one sample, and the model has positions for up to LM_MAX_SEQ_LEN.
LM_VOCAB_SIZE = 256
LM_SEQ_LEN = 64
LM_MAX_SEQ_LEN = 512
# Segmentation and detection on the generated shapes dataset: background + 3 shape classes.
SHAPES_CLASSES = 4
# Module names a factory may not come from (checked on the top-level package, before import):
# the standard library holds no model factory, and its callables (os:system, builtins:eval,
# pdb:set_trace, this) do other things. `__main__` would be whatever process runs the trial.
REFUSED_FACTORY_MODULES = frozenset(sys.stdlib_module_names) | {"__main__"}
DEFAULT_IMAGE_SIZE = 224
# ViT-B/16 cuts the image into 16x16 patches: the side must be a multiple of this.
VIT_PATCH_PX = 16
# Synthetic detection targets: boxes per image, chosen to resemble a sparse real scene.
DETECTION_BOXES_PER_IMAGE = 3


@dataclass(frozen=True)
class Workload:
    """What the sweep and the trainer need to know about a model."""

    name: str
    kind: str  # a key of TASK_MODULES
    input_shape: tuple[int, ...]
    num_classes: int
    build: Callable[[], object] = field(repr=False)
    description: str = ""
    uses_torchvision: bool = False
    tokens_per_sample: int | None = None
    """Language models: tokens in one sample (a sequence), for tokens/s."""
    contract: object | None = field(default=None, repr=False)
    """The user's `batchscale.Workload` (kind "custom"): its data, loss and metrics are used
    instead of a task module's."""
    loop: object | None = field(default=None, repr=False)
    """The user's `batchscale.TrainingLoop` (kind "loop"): trials call its `train(trial)`; no
    model, data or loss of it is visible to batchscale."""

    @property
    def user_workload(self) -> object | None:
        """The user's Workload or TrainingLoop (name, metrics, targets), None for a built-in."""
        return self.contract if self.contract is not None else self.loop

    @property
    def is_image(self) -> bool:
        """Inputs are (C, H, W) images: channels_last applies to them."""
        return len(self.input_shape) == 3

    @property
    def example_shape(self) -> tuple[int, ...]:
        """The shape of one dataset row's features: the input, plus what a dense target keeps
        inside the features (segmentation and detection: a class-id channel after the image;
        language models: the next byte after the sequence)."""
        if self.kind in ("segmentation", "detection"):
            channels, *size = self.input_shape
            return (channels + 1, *size)
        if self.kind == "language_model":
            return (self.input_shape[0] + 1,)
        return self.input_shape

    @property
    def shape_from_data(self) -> bool:
        """The model takes any image size or sequence length, so the dataset's shape is used
        as it is (the registered classifiers' shape is fixed by their first layer or the
        config); a user model is built for the dataset it trains on (flat features included)."""
        return self.kind != "classification" or names.is_factory_spec(self.name)

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics a convergence trial of this workload records (batchscale/metrics.py)."""
        from batchscale.metrics import TASK_METRICS

        if self.contract is not None:
            return tuple(dict.fromkeys((*self.contract.metrics, "train_loss")))
        if self.loop is not None:
            return tuple(dict.fromkeys(self.loop.metrics))
        return TASK_METRICS[self.kind]

    @property
    def has_own_data(self) -> bool:
        """A contract workload that brings its training data, or a training loop (no
        prepared dataset needed)."""
        return self.loop is not None or (self.contract is not None
                                         and self.contract.train_data is not None)

    @property
    def task(self):
        """The task module: to_batch, loss, evaluate (batchscale/tasks)."""
        return importlib.import_module(TASK_MODULES[self.kind])

    def contract_for(self, data_uri: str | None = None):
        """This workload as a `batchscale.Workload`, the public contract every stage reads:
        the user's own (its model checked to be a torch.nn.Module when built), or a built-in's
        (batchscale/tasks/builtin.py) whose data are the prepared dataset at `data_uri`."""
        if self.loop is not None:
            self.build()  # refuses, saying what a training loop can be used for
        if self.contract is not None:
            return dataclasses.replace(self.contract, model=self.build)
        from batchscale.tasks.builtin import as_contract

        return as_contract(self, data_uri)

    def synthetic_batch(self, batch_size: int, device: str):
        """A batch already on the device, from the contract's `synthetic_batch` (pure compute,
        no input pipeline)."""
        from batchscale.contract_check import synthetic_batch

        return synthetic_batch(self.contract_for(), batch_size, device)

    def builtin_synthetic_batch(self, batch_size: int, device: str, seed: int = 0):
        """A built-in's synthetic batch: random inputs of its shape and random targets."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        x = torch.randn((batch_size, *self.input_shape), generator=gen)
        if self.kind == "detection":
            return _detection_batch(x, self.num_classes, gen, device)
        if self.kind == "classification":
            y = torch.randint(0, self.num_classes, (batch_size,), generator=gen)
            return x.to(device), y.to(device)
        return self.task.to_batch(*_synthetic_rows(self, batch_size, gen), device)


def _synthetic_rows(workload: Workload, batch_size: int, gen):
    """Random dataset rows of a dense-target workload: byte ids, or an image with a class-id
    channel."""
    import torch

    if workload.kind == "language_model":
        x = torch.randint(0, LM_VOCAB_SIZE, (batch_size, *workload.example_shape), generator=gen)
        return x.float(), x[:, -1].clone()
    image = torch.rand((batch_size, *workload.input_shape), generator=gen)
    mask = torch.randint(0, workload.num_classes, (batch_size, 1, *workload.input_shape[1:]),
                         generator=gen)
    return torch.cat([image, mask.float()], dim=1), torch.zeros(batch_size, dtype=torch.int64)


def _detection_batch(x, num_classes: int, gen, device: str):
    import torch

    _, _, h, w = x.shape
    targets = []
    for _ in range(x.shape[0]):
        corner = torch.rand((DETECTION_BOXES_PER_IMAGE, 2), generator=gen) * 0.5
        size = 0.1 + torch.rand((DETECTION_BOXES_PER_IMAGE, 2), generator=gen) * 0.4
        boxes = torch.cat([corner, corner + size], dim=1) * torch.tensor([w, h, w, h])
        labels = torch.randint(1, num_classes, (DETECTION_BOXES_PER_IMAGE,), generator=gen)
        targets.append({"boxes": boxes.to(device), "labels": labels.to(device)})
    return [img.to(device) for img in x], targets


def _digits_mlp(width: int):
    def build():
        from torch import nn

        return nn.Sequential(
            nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, 10),
        )

    return build


def _digits_cnn():
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def _torchvision(name: str, **kwargs):
    def build():
        import torchvision

        return torchvision.models.get_model(name, weights=None, **kwargs)

    return build


LANGUAGE_MODEL_DESCRIPTIONS = {
    "byte-transformer": "decoder-only transformer, byte-level text (a sample is one sequence)",
    "byte-lstm": "LSTM language model, byte-level text (a sample is one sequence)",
}


def _segmenter(name: str, num_classes: int):
    def build():
        from batchscale.tasks.segmentation import build_segmenter

        return build_segmenter(name, num_classes)

    return build


def _language_model(name: str):
    def build():
        from batchscale.tasks import language

        if name == "byte-lstm":
            return language.build_lstm()
        return language.build_decoder(LM_MAX_SEQ_LEN)

    return build


def refused_module(spec: str) -> str | None:
    """Why 'package.module:name' cannot name a workload without importing anything: a module
    of the standard library (os:system, builtins:eval, ...); None when it may."""
    module_name, _ = names.split_factory_spec(spec)
    if module_name.split(".")[0] in REFUSED_FACTORY_MODULES:
        return (f"{module_name!r} is part of Python's standard library, which holds no model "
                "factory; give a module of your own that returns a torch.nn.Module, a "
                "batchscale.Workload or a batchscale.TrainingLoop")
    return None


def _missing_dependency(err: ImportError, module_name: str) -> str | None:
    """The module a found user module failed to import (None when the user's module itself, or
    a package above it, is what is missing)."""
    missing, parts = getattr(err, "name", None), module_name.split(".")
    ours = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return missing if isinstance(err, ModuleNotFoundError) and missing not in ours else None


def _user_attribute(spec: str) -> object:
    """The object 'package.module:name' names; a standard-library module is refused before it
    is imported."""
    module_name, attr = names.split_factory_spec(spec)
    refused = refused_module(spec)
    if refused:
        raise BadInput(f"workload {spec!r}: {refused}")
    _importable_from_cwd()
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        if (missing := _missing_dependency(err, module_name)):
            raise BadInput(f"workload {spec!r}: module {module_name!r} was found, but it "
                           f"imports {missing!r}, which is not installed where batchscale "
                           f"runs ({sys.executable}): install the package that provides it "
                           "into that environment (e.g. `.venv/bin/pip install ...`)") from None
        raise BadInput(f"workload {spec!r}: cannot import module {module_name!r}: {err}. "
                       f"It is looked for in the current directory ({os.getcwd()}), then in "
                       f"PYTHONPATH ({os.environ.get('PYTHONPATH') or 'not set'}), then in the "
                       "installed packages: run from the directory that holds it, or add that "
                       "directory to PYTHONPATH") from None
    except Exception as err:  # the module's own top-level code failed: it is the user's code
        raise BadInput(f"workload {spec!r}: importing module {module_name!r} failed: "
                       f"{type(err).__name__}: {err}") from None
    value = getattr(module, attr, None)
    if value is None or not (callable(value) or is_contract(value) or is_loop(value)):
        raise BadInput(f"workload {spec!r}: {module_name} has no callable {attr!r} (a "
                       "batchscale.Workload, a batchscale.TrainingLoop, or a function "
                       "returning one or a torch.nn.Module)")
    return value


def is_training_loop(spec: str) -> bool | None:
    """Whether `spec` names a batchscale.TrainingLoop, told by importing its module and calling
    nothing (a compile must not build the user's model): True or False, None where the module
    cannot be imported here. A function that returns a loop reads as False: only its call would
    tell."""
    if not names.is_factory_spec(spec):
        return False
    try:
        return is_loop(_user_attribute(spec))
    except BadInput:
        return None


def _importable_from_cwd() -> None:
    """The current directory is searched for a user's module (after the installed packages),
    as `python -m` would, also from the `batchscale` command; torchrun workers get it through
    PYTHONPATH (convergence/runner.py)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


@functools.cache
def _resolve_user(spec: str) -> tuple[object | None, Callable[[], object]]:
    """(the user's contract Workload or None, the model factory) of 'package.module:name'. A
    function is called once to see what it returns. A model it returned is dropped on the first
    build and built anew: it was built before the trial seeded torch, so its weights are not the
    trial seed's, and the trial would not be reproducible. It is freed before the new build, so
    a sweep trial's peak memory is still one model."""
    value = _user_attribute(spec)
    first: list = []  # the call's outcome: the first build raises its error or drops it
    if not (is_contract(value) or is_loop(value)):
        try:
            value = value()
        except BadInput:
            raise
        except Exception as err:  # a model factory failing: its build fails the same way
            first.append(err)
    if is_loop(value):
        if not callable(value.train):
            raise BadInput(f"workload {spec!r}: TrainingLoop.train must be a function taking "
                           f"the trial, got {_describe(value.train)}")
        return value, _no_model(spec)
    if is_contract(value):
        if not callable(value.model):
            raise BadInput(f"workload {spec!r}: Workload.model must be a no-argument function "
                           f"returning a torch.nn.Module, got {_describe(value.model)}")
        return value, _returning_a_module(spec, value.model, "Workload.model")
    first = first or [value]

    def factory():
        if first and isinstance(first[0], Exception):
            raise first.pop()
        first.clear()
        return _user_attribute(spec)()

    return None, _returning_a_module(spec, factory, "the factory")


def _no_model(spec: str) -> Callable[[], object]:
    def build():
        raise BadInput(f"workload {spec!r} is a TrainingLoop: batchscale cannot build its model "
                       "on its own, so there is no throughput sweep, memory model or gradient "
                       "size of it; `batchscale run`, `converge` and `analyze` measure its "
                       "training (docs/your-model.md, \"Your own training loop\")")

    return build


def _returning_a_module(spec: str, factory: Callable[[], object],
                        member: str) -> Callable[[], object]:
    """`factory`, with its result checked before anyone uses it. Exceptions it raises pass
    through as they are (an out-of-memory while building is an oom trial, not bad input)."""

    def build():
        from torch import nn

        model = factory()
        if not isinstance(model, nn.Module):
            raise BadInput(f"workload {spec!r}: {member} returned {_describe(model)}, not "
                           "a torch.nn.Module")
        return model

    return build


def _describe(value: object) -> str:
    """A value's type and a short repr, for a message (a failing __repr__ is not our error)."""
    try:
        shown = reprlib.repr(value)
    except Exception:
        shown = "(unprintable)"
    return f"{type(value).__name__} {names.redact_url(shown)}"


def _check_vit_size(image_size: int) -> None:
    if image_size % VIT_PATCH_PX:
        nearest = max(VIT_PATCH_PX, image_size // VIT_PATCH_PX * VIT_PATCH_PX)
        raise BadInput(f"image size {image_size}: vit_b_16 needs a multiple of {VIT_PATCH_PX} "
                       f"pixels (e.g. {nearest})")


def get_workload(
    name: str, *, image_size: int = DEFAULT_IMAGE_SIZE, num_classes: int | None = None,
    input_shape: tuple[int, ...] | None = None, seq_len: int = LM_SEQ_LEN,
) -> Workload:
    """The workload called `name`; user models as 'package.module:factory' (a no-argument
    callable returning an nn.Module taking `input_shape` inputs, default (3, image_size,
    image_size), with `num_classes` outputs, default 10). Language models take sequences of
    `seq_len` bytes (or `input_shape`'s one dimension); segmenters and detectors images of
    `image_size` pixels with `num_classes` classes, background included."""
    if name in DIGITS_MLP_WIDTHS:
        width = DIGITS_MLP_WIDTHS[name]
        return Workload(name, "classification", (64,), 10, _digits_mlp(width),
                        f"3-layer MLP, {width} wide, 8x8 digits")
    if name == "digits-cnn":
        return Workload(name, "classification", (1, 8, 8), 10, _digits_cnn, "2-conv CNN, digits")
    image = (3, image_size, image_size)
    if name in CLASSIFIERS:
        classes = num_classes or 1000
        if name == "vit_b_16":
            _check_vit_size(image_size)
            build = _torchvision(name, num_classes=classes, image_size=image_size)
        else:
            build = _torchvision(name, num_classes=classes)
        return Workload(name, "classification", image, classes, build, f"torchvision {name}",
                        uses_torchvision=True)
    if name in DETECTORS:
        classes = num_classes or 91
        build = _torchvision(name, num_classes=classes, weights_backbone=None)
        return Workload(name, "detection", image, classes, build,
                        f"torchvision {name}; sweep: synthetic boxes, training: shapes",
                        uses_torchvision=True)
    if name in SEGMENTERS:
        classes = num_classes or SHAPES_CLASSES
        return Workload(name, "segmentation", image, classes, _segmenter(name, classes),
                        f"torchvision {name}, pixel masks", uses_torchvision=True)
    if name in LANGUAGE_MODELS:
        seq_len = input_shape[0] if input_shape else seq_len
        return Workload(name, "language_model", (seq_len,), LM_VOCAB_SIZE, _language_model(name),
                        LANGUAGE_MODEL_DESCRIPTIONS[name], tokens_per_sample=seq_len)
    if names.is_factory_spec(name):
        contract, factory = _resolve_user(name)
        if is_loop(contract):
            return Workload(name, LOOP_KIND, (), 0, factory,
                            contract.description or f"user training loop {contract.name}",
                            tokens_per_sample=contract.tokens_per_sample, loop=contract)
        if contract is not None:
            return Workload(name, CONTRACT_KIND, (), 0, factory,
                            contract.description or f"user workload {contract.name}",
                            tokens_per_sample=contract.tokens_per_sample, contract=contract)
        return Workload(
            name, "classification", input_shape or image, num_classes or 10, factory,
            f"user model factory {name}",
        )
    module_file = Path(*name.split(".")).with_suffix(".py")  # a module of yours, named alone?
    own = f"; {module_file} is here: name what in it to use, e.g. '{name}:workload'" if (
        name.replace(".", "").replace("_", "").isalnum() and module_file.is_file()) else ""
    raise BadInput(
        f"unknown workload {name!r}; allowed: {', '.join(WORKLOAD_NAMES)} "
        f"or a user model as 'package.module:factory'{own}"
    )


def workload_kind(name: str) -> str:
    """The kind of task of workload `name` (a key of TASK_MODULES; no model is built). User
    models are classifiers."""
    if name in LANGUAGE_MODELS:
        return "language_model"
    if name in SEGMENTERS:
        return "segmentation"
    if name in DETECTORS:
        return "detection"
    return "classification"


def workload_metrics(name: str) -> tuple[str, ...]:
    """The metrics a convergence trial of workload `name` records (no model is built). A user
    workload's are known only once it is imported (contract_check.check_workload checks its
    targets then): any metric is allowed here."""
    from batchscale.metrics import METRIC_NAMES, TASK_METRICS

    if names.is_factory_spec(name):
        return METRIC_NAMES
    return TASK_METRICS[workload_kind(name)]


def is_known_workload_name(name: str) -> bool:
    """A registered name or the form of a user model (whether it imports is checked later)."""
    return name in WORKLOAD_NAMES or names.is_factory_spec(name)
