"""Generated shapes: a segmentation and detection task that is learnable and needs no download.

Each image is a textured background (smooth colour noise or stripes, both random) with one to
three shapes on it, each of a different class: disc, square or triangle (at most one of each, so
a class's pixels are one object and its bounding box is the extent of its mask). Shapes do not
overlap. Position, size and colour are random and independent of the class: the colour of a
shape tells nothing about its class, so a network has to learn the outline. Everything is drawn
from `numpy.random.default_rng(seed)`: the same seed gives the same bytes.

Stored as the segmentation layout of docs/architecture.md ("How to add ... a workload"):
features (rows, 4, S, S) float32, channels 0..2 the RGB image in [0, 1], channel 3 the class id
of each pixel (0 = background); label = the class with the most pixels (ties: the lower id).
"""

from __future__ import annotations

import numpy as np

from batchscale.data.datasets import RawDataset
from batchscale.errors import BadInput

SHAPE_CLASSES = ("background", "disc", "square", "triangle")
MIN_IMAGE_SIZE_PX = 16
MAX_SHAPES_PER_IMAGE = 3
# Half the side of a shape's bounding square, as a share of the image side: big enough that a
# triangle is still a triangle at 16 px, small enough that three shapes fit without overlap.
HALF_SIZE_SHARE = (0.12, 0.22)
MIN_HALF_SIZE_PX = 3.0
PLACEMENT_TRIES = 50
# A shape's colour differs from the mean background colour by at least this (Euclidean, RGB in
# [0, 1]), so that every shape can be seen; the colour is still random and class-blind.
MIN_COLOUR_CONTRAST = 0.35
NOISE_GRID = 4  # smooth-noise background: random values on a 4x4 grid, bilinearly upsampled
STRIPE_PERIOD_PX = (4.0, 12.0)


def shapes(rows: int, image_size_px: int, seed: int) -> RawDataset:
    """`rows` images of `image_size_px` square pixels, generated from `seed`."""
    _check(rows, image_size_px)
    rng = np.random.default_rng(seed)
    features = np.empty((rows, 4, image_size_px, image_size_px), dtype=np.float32)
    for row in range(rows):
        features[row] = _one_image(rng, image_size_px)
    labels = np.array([_dominant_class(f[3]) for f in features], dtype=np.int64)
    source = (f"shapes(seed={seed}, image_size_px={image_size_px}, rows={rows}): "
              "discs, squares and triangles on textured backgrounds")
    return RawDataset(features, labels, len(SHAPE_CLASSES), source)


def _check(rows: int, image_size_px: int) -> None:
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise BadInput(f"shapes: rows must be a whole number >= 1, got {rows!r}")
    if isinstance(image_size_px, bool) or not isinstance(image_size_px, int) or \
            image_size_px < MIN_IMAGE_SIZE_PX:
        raise BadInput(f"shapes: image_size_px must be a whole number >= {MIN_IMAGE_SIZE_PX} "
                       f"(smaller shapes lose their outline), got {image_size_px!r}")


def _one_image(rng: np.random.Generator, size: int) -> np.ndarray:
    """(4, size, size): RGB then the class-id mask."""
    rgb = _background(rng, size)
    mask = np.zeros((size, size), dtype=np.float32)
    background_colour = rgb.reshape(3, -1).mean(axis=1)
    count = int(rng.integers(1, MAX_SHAPES_PER_IMAGE + 1))
    classes = rng.choice(np.arange(1, len(SHAPE_CLASSES)), size=count, replace=False)
    for class_id in classes:
        inside = _place(rng, int(class_id), size, occupied=mask > 0)
        if inside is None:
            continue  # no free spot for it: the image keeps the shapes already placed
        rgb[:, inside] = _contrasting_colour(rng, background_colour)[:, None]
        mask[inside] = class_id
    return np.concatenate([rgb, mask[None]], axis=0)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """(3, size, size) in [0, 1]: smooth colour noise or stripes of two random colours."""
    if rng.random() < 0.5:
        grid = rng.random((3, NOISE_GRID, NOISE_GRID))
        return _upsample(grid, size).astype(np.float32)
    yy, xx = _pixel_centres(size)
    angle = rng.uniform(0.0, np.pi)
    period = rng.uniform(*STRIPE_PERIOD_PX)
    phase = rng.uniform(0.0, 2 * np.pi)
    wave = 0.5 + 0.5 * np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period
                              + phase)
    first, second = rng.random(3), rng.random(3)
    return (first[:, None, None] * (1 - wave) + second[:, None, None] * wave).astype(np.float32)


def _upsample(grid: np.ndarray, size: int) -> np.ndarray:
    """Bilinear upsampling of (C, g, g) to (C, size, size)."""
    g = grid.shape[-1]
    position = np.linspace(0.0, g - 1.0, size)
    low = np.minimum(np.floor(position).astype(int), g - 2)
    frac = position - low
    rows = grid[:, low, :] * (1 - frac)[None, :, None] + grid[:, low + 1, :] * frac[None, :, None]
    return rows[:, :, low] * (1 - frac)[None, None, :] + rows[:, :, low + 1] * frac[None, None, :]


def _pixel_centres(size: int) -> tuple[np.ndarray, np.ndarray]:
    centres = np.arange(size) + 0.5
    return np.meshgrid(centres, centres, indexing="ij")


def _place(rng: np.random.Generator, class_id: int, size: int,
           occupied: np.ndarray) -> np.ndarray | None:
    """The pixels of a shape of `class_id` at a random free spot (with a one-pixel gap to the
    shapes already placed), or None when none of the tries found one."""
    gap = _grow(occupied)
    low, high = (max(MIN_HALF_SIZE_PX, share * size) for share in HALF_SIZE_SHARE)
    for _ in range(PLACEMENT_TRIES):
        half = rng.uniform(low, max(low, high))
        centre_y, centre_x = rng.uniform(half, size - half, size=2)
        inside = _shape_pixels(class_id, size, centre_y, centre_x, half)
        if inside.any() and not (inside & gap).any():
            return inside
    return None


def _grow(occupied: np.ndarray) -> np.ndarray:
    """`occupied` plus its 4-neighbours: shapes never touch, so each stays one object."""
    grown = occupied.copy()
    grown[1:] |= occupied[:-1]
    grown[:-1] |= occupied[1:]
    grown[:, 1:] |= occupied[:, :-1]
    grown[:, :-1] |= occupied[:, 1:]
    return grown


def _shape_pixels(class_id: int, size: int, cy: float, cx: float, half: float) -> np.ndarray:
    """Boolean (size, size): pixel centres inside the shape, `half` half its bounding side."""
    yy, xx = _pixel_centres(size)
    if class_id == 1:  # disc
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= half ** 2
    if class_id == 2:  # axis-aligned square
        return (np.abs(yy - cy) <= half) & (np.abs(xx - cx) <= half)
    # triangle: apex at the top, base at the bottom, as wide as it is tall
    top = cy - half
    return (yy <= cy + half) & (yy >= top) & (np.abs(xx - cx) <= (yy - top) / 2)


def _contrasting_colour(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    """A random colour at least MIN_COLOUR_CONTRAST away from `background` (the farthest of
    the draws if none is: a mid-grey background always has far colours, so this is rare)."""
    best = rng.random(3)
    for _ in range(PLACEMENT_TRIES):
        if np.linalg.norm(best - background) >= MIN_COLOUR_CONTRAST:
            break
        candidate = rng.random(3)
        if np.linalg.norm(candidate - background) > np.linalg.norm(best - background):
            best = candidate
    return best.astype(np.float32)


def _dominant_class(mask: np.ndarray) -> int:
    """The class with the most pixels other than background (0 if the mask is empty)."""
    counts = np.bincount(mask.astype(np.int64).ravel(), minlength=len(SHAPE_CLASSES))
    counts[0] = 0
    return int(np.argmax(counts)) if counts.any() else 0
