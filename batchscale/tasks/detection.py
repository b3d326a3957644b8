"""Object detection trained to a target: torchvision Faster R-CNN on boxes taken from masks.

Dataset rows are the segmentation layout (docs/architecture.md, "Workloads and tasks"):
(4, H, W), RGB in [0, 1] plus the class id of each pixel. A class appears at most once per image
(the generated shapes guarantee it), so each class present gives one box: the extent of its
mask. The model is built by batchscale/workloads.py (its detectors, no pretrained weights); the
torchvision detectors resize every image internally (the 320_fpn one to 320 px, the resnet50
one to 800 px), so a step costs what a 320 or 800 px image costs whatever the stored size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torchvision.ops import box_iou

from batchscale.errors import BadInput
from batchscale.tasks.builtin import evaluate_rows, kept_modes
from batchscale.tasks.segmentation import FEATURE_CHANNELS

# Images per evaluation chunk: the detectors resize each image to 320 or 800 px inside.
EVAL_CHUNK_ROWS = 16
# The training-mode loss samples proposals at random; a fixed seed (in a forked RNG, so the
# trainer's own random stream is untouched) makes the validation loss repeatable.
EVAL_SEED = 0
MATCH_IOU = 0.5


def to_batch(x, y, device: str) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """(images: a list of (3, H, W) float tensors, targets: one {"boxes": (k, 4) float xyxy in
    pixel edges, "labels": (k,) int64} per image, one box per class in its mask) on `device`."""
    x = torch.as_tensor(x)
    if x.ndim != 4 or x.shape[1] != FEATURE_CHANNELS:
        raise BadInput(f"detection rows must be (n, {FEATURE_CHANNELS}, H, W): RGB plus the "
                       f"class-id mask; got shape {tuple(x.shape)}")
    images = [row[:3].float().to(device) for row in x]
    targets = [_boxes_from_mask(row[3].round().long(), device) for row in x]
    return images, targets


def _boxes_from_mask(mask: torch.Tensor, device: str) -> dict[str, torch.Tensor]:
    """One box per class present: from the first to one past the last pixel in x and y, so a
    one-pixel object has a box of width 1 (torchvision refuses boxes of zero width)."""
    classes = [int(c) for c in torch.unique(mask) if int(c) != 0]
    boxes = torch.zeros((len(classes), 4), dtype=torch.float32)
    for i, class_id in enumerate(classes):
        ys, xs = torch.nonzero(mask == class_id, as_tuple=True)
        boxes[i] = torch.stack([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]).float()
    labels = torch.tensor(classes, dtype=torch.int64)
    return {"boxes": boxes.to(device), "labels": labels.to(device)}


def loss(model, batch) -> torch.Tensor:
    """The sum of the detector's losses (RPN objectness and box, head class and box), each
    already a mean over its sampled anchors or proposals; the model must be in train mode."""
    images, targets = batch
    return sum(model(images, targets).values())


def _train_mode_with_frozen_norm(model: nn.Module) -> None:
    """Train mode (the detectors give losses only then) with every BatchNorm in eval, so that
    a validation pass does not move the running statistics."""
    model.train()
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()


@contextlib.contextmanager
def _fixed_rng(device: str) -> Iterator[None]:
    cuda = torch.device(device).type == "cuda"
    devices = list(range(torch.cuda.device_count())) if cuda else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(EVAL_SEED)
        yield


def eval_rows(example_shape: tuple[int, ...]) -> int:
    del example_shape
    return EVAL_CHUNK_ROWS


def evaluate_batches(model, batches) -> dict[str, float]:
    """{"loss": mean per image of the summed detector losses (train mode, BatchNorm frozen),
    "map50": mean over classes of the average precision at IoU 0.5 (eval-mode detections)}
    over the batches, without gradients. Modes, parameters, buffers and the caller's RNG are
    left unchanged."""
    loss_sum, seen = 0.0, 0
    detections: list[dict[str, torch.Tensor]] = []
    truths: list[dict[str, torch.Tensor]] = []
    device = next(model.parameters()).device
    with kept_modes(model), _fixed_rng(device), torch.no_grad():
        for images, targets in batches:
            _train_mode_with_frozen_norm(model)
            losses = model(images, targets)
            loss_sum += float(sum(v.float() for v in losses.values())) * len(images)
            seen += len(images)
            model.eval()
            found = model(images)
            detections += [{k: v.detach().float().cpu() for k, v in d.items()} for d in found]
            truths += [{k: v.cpu() for k, v in t.items()} for t in targets]
    if seen == 0:
        raise BadInput("detection evaluate: the split has no rows")
    return {"loss": loss_sum / seen, "map50": mean_average_precision(detections, truths)}


def evaluate(model, x, y, device: str, autocast, *,
             chunk_rows: int | None = None) -> dict[str, float]:
    """`evaluate_batches` over whole rows in chunks (default EVAL_CHUNK_ROWS)."""
    return evaluate_rows(model, x, None, device, autocast, chunk_rows or EVAL_CHUNK_ROWS,
                         to_batch=to_batch, evaluate_batches=evaluate_batches)


def mean_average_precision(detections: list[dict[str, torch.Tensor]],
                           truths: list[dict[str, torch.Tensor]],
                           iou_threshold: float = MATCH_IOU) -> float:
    """Mean over the classes that have ground truth of their average precision (VOC all-point
    interpolation). `detections[i]` holds "boxes", "labels", "scores" for image i, `truths[i]`
    "boxes" and "labels". NaN when no image has a ground-truth box."""
    classes = sorted({int(c) for t in truths for c in t["labels"]})
    if not classes:
        return float("nan")
    return sum(average_precision(detections, truths, c, iou_threshold)
               for c in classes) / len(classes)


def average_precision(detections, truths, class_id: int, iou_threshold: float = MATCH_IOU
                      ) -> float:
    """AP of one class: detections sorted by score, each a hit when its best-overlapping
    ground-truth box of the class (same image) has IoU >= the threshold and is not taken yet."""
    ranked = _ranked_detections(detections, class_id)
    truth_boxes = [t["boxes"][t["labels"] == class_id] for t in truths]
    taken = [torch.zeros(len(b), dtype=torch.bool) for b in truth_boxes]
    total = sum(len(b) for b in truth_boxes)
    hits = []
    for _, image, box in ranked:
        hits.append(_match(box, truth_boxes[image], taken[image], iou_threshold))
    return _all_point_area(torch.tensor(hits, dtype=torch.bool), total)


def _ranked_detections(detections, class_id: int) -> list[tuple[float, int, torch.Tensor]]:
    found = [(float(score), image, box)
             for image, d in enumerate(detections)
             for box, label, score in zip(d["boxes"], d["labels"], d["scores"], strict=True)
             if int(label) == class_id]
    return sorted(found, key=lambda item: -item[0])  # stable: ties keep image order


def _match(box: torch.Tensor, truth: torch.Tensor, taken: torch.Tensor,
           iou_threshold: float) -> bool:
    if len(truth) == 0:
        return False
    overlaps = box_iou(box[None], truth)[0]
    best = int(overlaps.argmax())
    if overlaps[best] < iou_threshold or taken[best]:
        return False
    taken[best] = True
    return True


def _all_point_area(hits: torch.Tensor, total_truths: int) -> float:
    """Area under the precision-recall curve with precision made monotone from the right."""
    if total_truths == 0 or len(hits) == 0:
        return 0.0
    true_pos = torch.cumsum(hits.double(), 0)
    false_pos = torch.cumsum((~hits).double(), 0)
    recall = torch.cat([torch.zeros(1), true_pos / total_truths, torch.ones(1)]).double()
    precision = torch.cat([torch.zeros(1), true_pos / (true_pos + false_pos),
                           torch.zeros(1)]).double()
    precision = torch.flip(torch.cummax(torch.flip(precision, [0]), 0).values, [0])
    steps = torch.nonzero(recall[1:] != recall[:-1]).flatten()
    return float(((recall[steps + 1] - recall[steps]) * precision[steps + 1]).sum())
