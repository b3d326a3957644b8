"""The workload registry: every entry builds, the cheap ones train one step on CPU at a tiny
image size, and bad names are refused with the allowed values."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from batchscale.errors import BadInput
from batchscale.workloads import WORKLOAD_NAMES, get_workload

TINY_IMAGE_PX = 32
DETECTION_IMAGE_PX = 64
STEP_BATCH = 2
# fasterrcnn_resnet50_fpn resizes every image to 800 px inside the model: a CPU step takes
# tens of seconds, so it is built but not stepped here (benchmarks/bench_sweep.py runs the
# cheaper detector end to end).
BUILD_ONLY = {"fasterrcnn_resnet50_fpn"}


def tiny_conv():
    """A user factory (imported as `test_workloads:tiny_conv`)."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, 10))


def one_step(name: str, image_px: int) -> tuple[float, float]:
    """(loss, gradient norm) after one SGD step on a synthetic batch."""
    workload = get_workload(name, image_size=image_px)
    torch.manual_seed(0)
    model = workload.build()
    model.train()
    loss = workload.loss(model, workload.synthetic_batch(STEP_BATCH, "cpu"))
    loss.backward()
    grad = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None))
    torch.optim.SGD(model.parameters(), lr=1e-3).step()
    return loss.item(), grad.item()


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_every_registered_workload_builds(name):
    workload = get_workload(name, image_size=TINY_IMAGE_PX)
    model = workload.build()
    assert sum(p.numel() for p in model.parameters()) > 0
    assert workload.kind in ("classification", "detection")


@pytest.mark.parametrize("name", [n for n in WORKLOAD_NAMES if n not in BUILD_ONLY])
def test_cheap_workloads_train_one_step_on_cpu(name):
    image_px = DETECTION_IMAGE_PX if name.startswith("fasterrcnn") else TINY_IMAGE_PX
    loss, grad = one_step(name, image_px)
    assert torch.isfinite(torch.tensor(loss)) and loss > 0
    assert grad > 0


def test_detection_batches_carry_synthetic_boxes_inside_the_image():
    workload = get_workload("fasterrcnn_mobilenet_v3_large_320_fpn", image_size=64)
    images, targets = workload.synthetic_batch(3, "cpu")
    assert len(images) == len(targets) == 3
    for image, target in zip(images, targets, strict=True):
        boxes = target["boxes"]
        assert image.shape == (3, 64, 64)
        assert (boxes[:, 2:] > boxes[:, :2]).all() and (boxes >= 0).all() and (boxes <= 64).all()
        assert ((target["labels"] >= 1) & (target["labels"] < workload.num_classes)).all()


def test_image_size_sets_the_input_shape():
    assert get_workload("resnet18", image_size=48).input_shape == (3, 48, 48)
    assert get_workload("resnet18", image_size=48).is_image
    assert not get_workload("digits-mlp").is_image


def test_vit_needs_a_multiple_of_its_patch_size():
    with pytest.raises(BadInput, match="multiple of 16"):
        get_workload("vit_b_16", image_size=30)


def test_unknown_workload_lists_the_allowed_names():
    with pytest.raises(BadInput, match="allowed: digits-mlp"):
        get_workload("resnet19")


def test_user_factory_workload_trains():
    loss, grad = one_step("test_workloads:tiny_conv", TINY_IMAGE_PX)
    assert loss > 0 and grad > 0


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module_xyz:build", "cannot import module"),
    ("test_workloads:not_there", "has no callable"),
])
def test_bad_user_factory_is_refused(spec, message):
    with pytest.raises(BadInput, match=message):
        get_workload(spec)


def test_cli_lists_the_registry():
    out = subprocess.run([sys.executable, "-m", "batchscale.cli", "workloads"],
                         capture_output=True, text=True, check=True).stdout
    for name in WORKLOAD_NAMES:
        assert name in out
    assert "package.module:factory" in out
