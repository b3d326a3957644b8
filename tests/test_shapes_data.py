"""The generated shapes dataset: layout, determinism, bad input, and what makes it learnable."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from batchscale.data.shapes import SHAPE_CLASSES, shapes
from batchscale.errors import BadInput


@pytest.fixture(scope="module")
def dataset():
    return shapes(300, 32, seed=3)


def test_layout_rgb_in_unit_range_and_a_class_id_channel(dataset):
    assert dataset.features.shape == (300, 4, 32, 32)
    assert dataset.features.dtype == np.float32 and dataset.labels.dtype == np.int64
    assert dataset.num_classes == len(SHAPE_CLASSES) == 4
    rgb, mask = dataset.features[:, :3], dataset.features[:, 3]
    assert rgb.min() >= 0.0 and rgb.max() <= 1.0
    assert set(np.unique(mask)) == {0.0, 1.0, 2.0, 3.0}


def test_one_to_three_shapes_of_distinct_classes_each_one_object(dataset):
    counts = []
    for mask in dataset.features[:, 3].astype(int):
        present = [c for c in np.unique(mask) if c != 0]
        counts.append(len(present))
        for class_id in present:
            _, objects = ndimage.label(mask == class_id)
            assert objects == 1, f"class {class_id} is split into {objects} pieces"
    assert min(counts) >= 1 and max(counts) <= 3
    assert set(counts) == {1, 2, 3}


def test_label_is_the_class_with_most_foreground_pixels(dataset):
    for mask, label in zip(dataset.features[:, 3].astype(int), dataset.labels, strict=True):
        pixels = np.bincount(mask.ravel(), minlength=4)[1:]
        assert label == 1 + int(np.argmax(pixels))
    assert set(dataset.labels) == {1, 2, 3}


def test_colour_does_not_give_the_class_away(dataset):
    """Each class's mean colour is the same within sampling noise (uniform colours average
    0.5 per channel); measured largest gap between classes: 0.046 on these 300 images."""
    rgb, mask = dataset.features[:, :3], dataset.features[:, 3]
    means = [rgb.transpose(1, 0, 2, 3)[:, mask == c].mean(axis=1) for c in (1, 2, 3)]
    gaps = [np.abs(a - b).max() for a in means for b in means]
    assert max(gaps) < 0.1, means


def test_shapes_stand_out_from_the_background(dataset):
    """A shape's colour differs from the background's mean by the contrast the generator keeps
    (0.35 in RGB distance from the whole background; measured here against the part left
    visible, which shifts it a little: smallest 0.33 on these 300 images)."""
    for row in dataset.features:
        rgb, mask = row[:3], row[3]
        background = rgb[:, mask == 0].mean(axis=1)
        for class_id in np.unique(mask[mask > 0]):
            colour = rgb[:, mask == class_id][:, 0]
            assert np.linalg.norm(colour - background) >= 0.3


def test_same_seed_same_bytes_other_seed_other_images():
    first, again, other = shapes(20, 16, 7), shapes(20, 16, 7), shapes(20, 16, 8)
    assert first.features.tobytes() == again.features.tobytes()
    assert np.array_equal(first.labels, again.labels)
    assert not np.array_equal(first.features, other.features)


def test_smallest_allowed_image_still_has_shapes():
    data = shapes(50, 16, 0)
    assert data.features.shape == (50, 4, 16, 16)
    assert all((mask > 0).any() for mask in data.features[:, 3])


@pytest.mark.parametrize(("rows", "size", "named"), [
    (0, 32, "rows"), (-3, 32, "rows"), (True, 32, "rows"), (2.5, 32, "rows"),
    (10, 15, "image_size_px"), (10, 0, "image_size_px"), (10, 32.0, "image_size_px"),
])
def test_bad_sizes_are_refused_naming_the_argument_and_the_limit(rows, size, named):
    with pytest.raises(BadInput, match=named) as caught:
        shapes(rows, size, 0)
    assert ">=" in str(caught.value)
