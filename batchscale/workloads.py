"""Named workloads: a model, its input shape and its loss. No pretrained weights are loaded.

torch and torchvision are imported inside the builders so that listing workloads or validating a
config stays fast.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from batchscale.errors import BadInput

CLASSIFIERS = ("resnet18", "resnet50", "mobilenet_v3_small", "vit_b_16")
DETECTORS = ("fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_resnet50_fpn")
WORKLOAD_NAMES = ("digits-mlp", "digits-cnn", *CLASSIFIERS, *DETECTORS)
FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
DEFAULT_IMAGE_SIZE = 224
# ViT-B/16 cuts the image into 16x16 patches: the side must be a multiple of this.
VIT_PATCH_PX = 16
# Synthetic detection targets: boxes per image, chosen to resemble a sparse real scene.
DETECTION_BOXES_PER_IMAGE = 3


@dataclass(frozen=True)
class Workload:
    """What the sweep and the trainer need to know about a model."""

    name: str
    kind: str  # "classification" or "detection"
    input_shape: tuple[int, ...]
    num_classes: int
    build: Callable[[], object] = field(repr=False)
    description: str = ""
    uses_torchvision: bool = False

    @property
    def is_image(self) -> bool:
        """Inputs are (C, H, W) images: channels_last applies to them."""
        return len(self.input_shape) == 3

    def synthetic_batch(self, batch_size: int, device: str, seed: int = 0):
        """A batch already on the device: pure compute, no input pipeline."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        x = torch.randn((batch_size, *self.input_shape), generator=gen)
        if self.kind == "detection":
            return _detection_batch(x, self.num_classes, gen, device)
        y = torch.randint(0, self.num_classes, (batch_size,), generator=gen)
        return x.to(device), y.to(device)

    def loss(self, model, batch):
        """Scalar training loss of `model` on `batch`."""
        import torch.nn.functional as F

        if self.kind == "detection":
            images, targets = batch
            return sum(model(images, targets).values())
        x, y = batch
        return F.cross_entropy(model(x), y)


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


def _digits_mlp():
    from torch import nn

    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )


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


def _user_factory(spec: str) -> Callable[[], object]:
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise BadInput(f"workload {spec!r}: cannot import module {module_name!r}: {err}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise BadInput(f"workload {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def _check_vit_size(image_size: int) -> None:
    if image_size % VIT_PATCH_PX:
        nearest = max(VIT_PATCH_PX, image_size // VIT_PATCH_PX * VIT_PATCH_PX)
        raise BadInput(f"image size {image_size}: vit_b_16 needs a multiple of {VIT_PATCH_PX} "
                       f"pixels (e.g. {nearest})")


def get_workload(
    name: str, *, image_size: int = DEFAULT_IMAGE_SIZE, num_classes: int | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> Workload:
    """The workload called `name`; user models as 'package.module:factory' (a no-argument
    callable returning an nn.Module taking `input_shape` inputs, default (3, image_size,
    image_size), with `num_classes` outputs, default 10)."""
    if name == "digits-mlp":
        return Workload(name, "classification", (64,), 10, _digits_mlp, "3-layer MLP, 8x8 digits")
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
                        f"torchvision {name}, synthetic boxes", uses_torchvision=True)
    if FACTORY_PATTERN.match(name):
        factory = _user_factory(name)
        return Workload(
            name, "classification", input_shape or image, num_classes or 10, factory,
            f"user factory {name}",
        )
    raise BadInput(
        f"unknown workload {name!r}; allowed: {', '.join(WORKLOAD_NAMES)} "
        "or a user model as 'package.module:factory'"
    )


def is_known_workload_name(name: str) -> bool:
    return name in WORKLOAD_NAMES or bool(FACTORY_PATTERN.match(name))
