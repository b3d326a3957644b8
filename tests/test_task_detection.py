"""Detection task: boxes from masks, the summed loss, evaluation hygiene and mAP@0.5."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from batchscale.data.shapes import shapes
from batchscale.errors import BadInput
from batchscale.tasks import detection as det
from batchscale.workloads import get_workload

DETECTOR = "fasterrcnn_mobilenet_v3_large_320_fpn"  # resizes every image to 320 px inside


def _rows(n: int, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(shapes(n, size, seed).features)


def test_boxes_are_the_extent_of_each_class_mask():
    x = torch.zeros((1, 4, 16, 16))
    x[0, 3, 2:6, 3:9] = 2.0  # rows 2..5, columns 3..8
    x[0, 3, 10, 12] = 1.0  # a single pixel
    images, targets = det.to_batch(x, torch.tensor([2]), "cpu")
    assert len(images) == 1 and images[0].shape == (3, 16, 16)
    by_label = dict(zip(targets[0]["labels"].tolist(), targets[0]["boxes"].tolist(), strict=True))
    assert by_label == {1: [12.0, 10.0, 13.0, 11.0], 2: [3.0, 2.0, 9.0, 6.0]}
    assert targets[0]["labels"].dtype == torch.int64
    assert targets[0]["boxes"].dtype == torch.float32


def test_boxes_match_mask_extents_on_generated_shapes():
    x = _rows(30, seed=2)
    _, targets = det.to_batch(x, None, "cpu")
    for row, target in zip(x, targets, strict=True):
        mask = row[3].long().numpy()
        assert sorted(target["labels"].tolist()) == [c for c in np.unique(mask) if c]
        for (x0, y0, x1, y1), label in zip(target["boxes"].long().tolist(),
                                           target["labels"].tolist(), strict=True):
            ys, xs = np.nonzero(mask == label)
            assert (x0, y0, x1, y1) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)


def test_an_empty_mask_gives_no_boxes_and_a_bad_shape_is_refused():
    _, targets = det.to_batch(torch.zeros((1, 4, 16, 16)), None, "cpu")
    assert targets[0]["boxes"].shape == (0, 4) and targets[0]["labels"].shape == (0,)
    with pytest.raises(BadInput, match=r"\(n, 4, H, W\).*got shape \(1, 16, 16\)"):
        det.to_batch(torch.zeros((1, 16, 16)), None, "cpu")


def _truth(boxes, labels):
    return {"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels)}


def _found(boxes, labels, scores):
    return {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
            "labels": torch.tensor(labels, dtype=torch.int64),
            "scores": torch.tensor(scores, dtype=torch.float32)}


A, B, FAR = [0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0], [50.0, 50.0, 60.0, 60.0]


def test_map50_of_perfect_detections_is_one():
    truths = [_truth([A], [1]), _truth([B, A], [2, 3])]
    found = [_found([A], [1], [0.9]), _found([B, A], [2, 3], [0.8, 0.7])]
    assert det.mean_average_precision(found, truths) == 1.0


def test_map50_all_point_interpolation_on_a_known_ranking():
    # Class 1, two boxes in two images; ranked hit (0.9), miss (0.8), hit (0.7):
    # precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1 -> AP = 1/2 * 1 + 1/2 * 2/3 = 5/6.
    truths = [_truth([A], [1]), _truth([B], [1])]
    found = [_found([A, FAR], [1, 1], [0.9, 0.8]), _found([B], [1], [0.7])]
    assert det.average_precision(found, truths, 1) == pytest.approx(5 / 6)
    # A box of IoU below 0.5 is a miss (here 100/400), and so is a duplicate of a found box:
    # ranked miss (0.95), hit (0.9), miss (0.8) -> precision 1/2 at recall 1/2 -> AP = 1/4.
    wide, shifted = [5.0, 5.0, 25.0, 25.0], [5.0, 5.0, 15.0, 15.0]
    truths = [_truth([A], [1]), _truth([wide], [1])]
    found = [_found([A, A], [1, 1], [0.9, 0.8]), _found([shifted], [1], [0.95])]
    assert det.average_precision(found, truths, 1) == pytest.approx(0.25)


def test_map50_averages_over_classes_with_ground_truth_only():
    truths = [_truth([A, B], [1, 2])]
    # Class 1 found, class 2 missed (AP 0), class 3 has no ground truth and does not count.
    found = [_found([A, B], [1, 3], [0.9, 0.9])]
    assert det.mean_average_precision(found, truths) == pytest.approx(0.5)
    assert np.isnan(det.mean_average_precision([_found([], [], [])], [_truth([], [])]))


@pytest.fixture(scope="module")
def detector():
    torch.manual_seed(0)
    return get_workload(DETECTOR, num_classes=4, image_size=32).build()


def test_one_training_step_gives_a_finite_loss_and_changes_the_weights(detector):
    model = detector.train()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    value = det.loss(model, det.to_batch(_rows(2), None, "cpu"))
    optimizer.zero_grad()
    value.backward()
    optimizer.step()
    assert value.ndim == 0 and torch.isfinite(value) and float(value.detach()) > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_evaluate_is_finite_repeatable_and_leaves_model_and_rng_unchanged(detector):
    model = detector.train()
    model.backbone.eval()  # a mixed state must come back as it was
    modes = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    x = _rows(2, seed=5)
    whole = det.evaluate(model, x, None, "cpu", contextlib.nullcontext)
    again = det.evaluate(model, x, None, "cpu", contextlib.nullcontext)
    halves = det.evaluate(model, x, None, "cpu", contextlib.nullcontext, chunk_rows=1)
    assert np.isfinite(whole["loss"]) and whole["loss"] > 0
    assert 0.0 <= whole["map50"] <= 1.0
    assert whole == again
    # Eval-mode detections do not depend on the chunking; the loss samples proposals at
    # random per forward pass, so a different chunking draws other proposals (close, not equal).
    assert halves["map50"] == pytest.approx(whole["map50"], abs=1e-6)
    assert halves["loss"] == pytest.approx(whole["loss"], rel=0.2)
    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
