"""Semantic segmentation: every pixel gets a class; torchvision models, no pretrained weights.

Dataset rows keep the target inside the features (docs/architecture.md, "Workloads and tasks"):
(4, H, W) with channels 0..2 the RGB image in [0, 1] and channel 3 the class id of each pixel
(0 = background). `to_batch` splits them; `loss` is the mean pixel cross-entropy; `evaluate_batches`
gives the loss, the mean IoU and the pixel accuracy over a whole split.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from batchscale.errors import BadInput
from batchscale.tasks.builtin import evaluate_rows

SEGMENTERS = ("lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "fcn_resnet50")
FEATURE_CHANNELS = 4  # RGB + the class-id mask
EVAL_CHUNK_ROWS = 4096
# Pixels per evaluation chunk: fcn_resnet50 keeps 2048 channels at 1/8 of the resolution, so
# big images need far fewer rows per chunk than 4096 (2**20 px: 1024 rows at 32 px, 20 at 224).
EVAL_CHUNK_PIXELS = 2 ** 20
SYNTHETIC_IMAGE_SIZE_PX = 32
SYNTHETIC_NUM_CLASSES = 4


class SegmentationLogits(nn.Module):
    """A torchvision segmentation model that returns only its "out" logits (n, K, H, W)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)["out"]


BATCHNORM_MOMENTUM = 0.1
"""PyTorch's default; see build_segmenter."""


def build_segmenter(name: str, num_classes: int) -> nn.Module:
    """The torchvision segmenter `name` with random weights, no auxiliary head."""
    if name not in SEGMENTERS:
        raise BadInput(f"unknown segmentation model {name!r}; allowed: {', '.join(SEGMENTERS)}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise BadInput(f"segmentation model {name}: num_classes must be a whole number >= 2 "
                       f"(background plus at least one class), got {num_classes!r}")
    builder = getattr(torchvision.models.segmentation, name)
    net = builder(weights=None, weights_backbone=None, num_classes=num_classes, aux_loss=False)
    # torchvision's MobileNetV3 uses BatchNorm momentum 0.01: its running statistics, which
    # evaluation uses, lag the weights by ~100 steps, and in batchscale's short runs evaluation
    # predicted background everywhere for the first 400-600 steps while training already
    # segmented. PyTorch's default 0.1 keeps them current (a documented deviation).
    for module in net.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = BATCHNORM_MOMENTUM
    return SegmentationLogits(net)


def to_batch(x, y, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (n, 3, H, W) float, masks (n, H, W) int64) on `device`; `y` (the dominant
    class) is not needed: the mask is the target."""
    x = torch.as_tensor(x)
    if x.ndim != 4 or x.shape[1] != FEATURE_CHANNELS:
        raise BadInput(f"segmentation rows must be (n, {FEATURE_CHANNELS}, H, W): RGB plus the "
                       f"class-id mask; got shape {tuple(x.shape)}")
    images = x[:, :3].float()
    masks = x[:, 3].round().long()
    return images.to(device), masks.to(device)


def loss(model, batch) -> torch.Tensor:
    """Mean cross-entropy over all pixels of the batch, in nats."""
    images, masks = batch
    return F.cross_entropy(model(images), masks)


def confusion_matrix(target: torch.Tensor, predicted: torch.Tensor,
                     num_classes: int) -> torch.Tensor:
    """(K, K) int64 counts: row the true class, column the predicted one."""
    flat = target.reshape(-1).long() * num_classes + predicted.reshape(-1).long()
    counts = torch.bincount(flat.cpu(), minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)


def miou_from_confusion(confusion: torch.Tensor) -> float:
    """Mean over classes of TP / (TP + FP + FN), counting only the classes that occur in the
    target or the prediction (a class absent from both has no IoU, not 0 or 1)."""
    true_positive = confusion.diagonal().double()
    union = confusion.sum(0).double() + confusion.sum(1).double() - true_positive
    present = union > 0
    if not present.any():
        return float("nan")
    return float((true_positive[present] / union[present]).mean())


def pixel_accuracy_from_confusion(confusion: torch.Tensor) -> float:
    return float(confusion.diagonal().sum()) / max(1, int(confusion.sum()))


def eval_chunk_rows(image_pixels: int) -> int:
    """Rows per evaluation chunk: at most EVAL_CHUNK_ROWS and EVAL_CHUNK_PIXELS pixels."""
    return max(1, min(EVAL_CHUNK_ROWS, EVAL_CHUNK_PIXELS // max(1, image_pixels)))


def eval_rows(example_shape: tuple[int, ...]) -> int:
    return eval_chunk_rows(int(example_shape[-1] * example_shape[-2]))


def evaluate_batches(model, batches) -> dict[str, float]:
    """{"loss": mean pixel cross-entropy (nats), "miou", "pixel_accuracy"} over the batches (the
    model in eval mode, no gradients: the caller's); the confusion matrix is summed over the
    batches before the IoU is taken, so the result does not depend on the batch size."""
    confusion, loss_sum, pixels = None, 0.0, 0
    for images, masks in batches:
        logits = model(images).float()
        _check_mask_classes(masks, logits.shape[1])
        loss_sum += float(F.cross_entropy(logits, masks, reduction="sum"))
        pixels += masks.numel()
        counts = confusion_matrix(masks, logits.argmax(1), logits.shape[1])
        confusion = counts if confusion is None else confusion + counts
    if confusion is None:
        raise BadInput("segmentation evaluate: the split has no rows")
    return {"loss": loss_sum / pixels, "miou": miou_from_confusion(confusion),
            "pixel_accuracy": pixel_accuracy_from_confusion(confusion)}


def evaluate(model, x, y, device: str, autocast, *,
             chunk_rows: int | None = None) -> dict[str, float]:
    """`evaluate_batches` over whole rows in chunks (default `eval_chunk_rows`), in eval mode;
    the model's modes are restored."""
    x = torch.as_tensor(x)
    rows = chunk_rows or eval_chunk_rows(int(x.shape[-1] * x.shape[-2]))
    return evaluate_rows(model, x, None, device, autocast, rows, to_batch=to_batch,
                         evaluate_batches=evaluate_batches)


def _check_mask_classes(masks: torch.Tensor, num_classes: int) -> None:
    low, high = int(masks.min()), int(masks.max())
    if low < 0 or high >= num_classes:
        raise BadInput(f"segmentation mask holds class ids {low}..{high}, but the model has "
                       f"{num_classes} classes (ids 0..{num_classes - 1}); check num_classes")


def synthetic_batch(batch_size: int, device: str, seed: int = 0, *,
                    image_size_px: int = SYNTHETIC_IMAGE_SIZE_PX,
                    num_classes: int = SYNTHETIC_NUM_CLASSES) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images and masks already on `device`, for timing steps (pure compute)."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand((batch_size, 3, image_size_px, image_size_px), generator=gen)
    masks = torch.randint(0, num_classes, (batch_size, image_size_px, image_size_px),
                          generator=gen)
    return images.to(device), masks.to(device)
