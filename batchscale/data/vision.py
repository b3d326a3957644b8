"""CIFAR-10, MNIST and Fashion-MNIST through torchvision's own dataset classes.

Nothing is downloaded (`download=False`): the files come from a local directory or an S3 prefix
laid out as torchvision expects (`cifar-10-batches-py/`, `MNIST/raw/`, `FashionMNIST/raw/`).
Only the training files are used; validation rows are held out from them by the seeded split, so
the official test set stays untouched by batch-size and learning-rate selection.
"""

from __future__ import annotations

import gzip
import pickle
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchscale.data.datasets import RawDataset
from batchscale.errors import BadInput
from batchscale.location import open_location

PIXEL_MAX = 255.0
VISION_CLASSES = 10
MNIST_SPLIT_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# What a damaged file makes torchvision's readers raise (truncated pickles, bad idx headers,
# sizes that do not reshape, gzip streams that end early).
READ_ERRORS = (RuntimeError, ValueError, TypeError, KeyError, AssertionError, EOFError, OSError,
               pickle.UnpicklingError, zlib.error)


@dataclass(frozen=True)
class VisionSpec:
    """One torchvision dataset: its class name and the folder its files sit in."""

    class_name: str
    folder: str


VISION_DATASETS = {
    "cifar10": VisionSpec("CIFAR10", "cifar-10-batches-py"),
    "mnist": VisionSpec("MNIST", "MNIST/raw"),
    "fashion-mnist": VisionSpec("FashionMNIST", "FashionMNIST/raw"),
}


def load_vision(name: str, source_uri: str, cache_dir: Path) -> RawDataset:
    """The training images of `name` as float32 (rows, C, H, W) in [0, 1] plus int64 labels."""
    spec = VISION_DATASETS[name]
    root = open_location(source_uri).local_dir(spec.folder, cache_dir / "download")
    if not root.is_dir():
        raise BadInput(f"source_uri {source_uri!r} is not a directory (or an "
                       "s3://bucket/prefix)")
    if name == "cifar10":
        images, labels, official = _cifar10(root)
    else:
        images, labels = _mnist(spec, root, cache_dir / "unpacked")
        official = None
    _check_labels(name, labels)
    features = (images.astype(np.float32) / PIXEL_MAX)
    note = "" if official is None else f", official release files: {'yes' if official else 'no'}"
    source = f"torchvision.datasets.{spec.class_name}(train=True) from {source_uri}{note}"
    return RawDataset(features, labels.astype(np.int64), VISION_CLASSES, source)


# ------------------------------------------------------------------------------- CIFAR-10
def _cifar10_class():
    """torchvision's CIFAR10 with the md5 check relaxed to "file exists": mirrors and test
    fixtures hold other bytes than the 2009 release. Whether the files are the official ones is
    still checked (`_is_official`) and recorded in the manifest's source."""
    from torchvision.datasets import CIFAR10

    return type("CIFAR10", (CIFAR10,), {
        "train_list": [[f, None] for f, _ in CIFAR10.train_list],
        "test_list": [[f, None] for f, _ in CIFAR10.test_list],
        "meta": {**CIFAR10.meta, "md5": None},
    })


def _cifar10_files() -> list[str]:
    from torchvision.datasets import CIFAR10

    return [f for f, _ in CIFAR10.train_list + CIFAR10.test_list] + [CIFAR10.meta["filename"]]


def _cifar10(root: Path) -> tuple[np.ndarray, np.ndarray, bool]:
    folder = root / VISION_DATASETS["cifar10"].folder
    _require_files("cifar10", folder, _cifar10_files())
    try:
        ds = _cifar10_class()(str(root), train=True, download=False)
    except READ_ERRORS as err:
        raise BadInput(f"cifar10: {_first_unreadable_pickle(folder) or folder} is not a CIFAR-10 "
                       f"python batch file: {err}") from None
    images = np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))  # torchvision keeps HWC
    return images, np.asarray(ds.targets), _is_official(folder)


def _is_official(folder: Path) -> bool:
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import check_md5

    return all(check_md5(str(folder / f), md5) for f, md5 in CIFAR10.train_list + CIFAR10.test_list)


def _first_unreadable_pickle(folder: Path) -> Path | None:
    """Which CIFAR file is damaged (only run after a failure, to name it in the message)."""
    for name in _cifar10_files():
        try:
            with open(folder / name, "rb") as f:
                pickle.load(f, encoding="latin1")
        except READ_ERRORS:
            return folder / name
    return None


# ------------------------------------------------------------------------ (Fashion-)MNIST
def _mnist(spec: VisionSpec, root: Path, unpack_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's MNIST readers take the raw idx files; gzipped ones (as published) are
    unpacked into `unpack_dir` first."""
    import torchvision.datasets

    raw = root / spec.folder
    if not all((raw / f).is_file() for f in MNIST_SPLIT_FILES):
        root = _gunzip_all(spec, raw, unpack_dir)
    try:
        ds = getattr(torchvision.datasets, spec.class_name)(str(root), train=True, download=False)
    except READ_ERRORS as err:
        raise BadInput(f"{spec.class_name}: the idx files under {raw} are unreadable ({err}); "
                       f"expected {', '.join(MNIST_SPLIT_FILES)} (raw or .gz)") from None
    return ds.data.numpy()[:, None], ds.targets.numpy()


def _gunzip_all(spec: VisionSpec, raw: Path, unpack_dir: Path) -> Path:
    """Copy or unpack every split file into `unpack_dir/<folder>`; BadInput naming what lacks."""
    out = unpack_dir / spec.folder
    out.mkdir(parents=True, exist_ok=True)
    for name in MNIST_SPLIT_FILES:
        plain, packed = raw / name, raw / f"{name}.gz"
        if plain.is_file():
            shutil.copyfile(plain, out / name)
        elif packed.is_file():
            _gunzip(packed, out / name)
        else:
            raise BadInput(f"{spec.class_name}: {raw} has neither {name} nor {name}.gz; "
                           f"expected {', '.join(MNIST_SPLIT_FILES)} (raw or .gz)")
    return unpack_dir


def _gunzip(packed: Path, target: Path) -> None:
    try:
        with gzip.open(packed, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except (OSError, EOFError, zlib.error) as err:
        raise BadInput(f"{packed} is not a readable gzip file: {err}") from None


# --------------------------------------------------------------------------------- common
def _require_files(name: str, folder: Path, files: list[str]) -> None:
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise BadInput(f"{name}: {folder} lacks {', '.join(missing)}; expected "
                       f"{', '.join(files)}")


def _check_labels(name: str, labels: np.ndarray) -> None:
    bad = labels[(labels < 0) | (labels >= VISION_CLASSES)]
    if bad.size:
        raise BadInput(f"{name}: labels must lie in 0..{VISION_CLASSES - 1}; found "
                       f"{sorted(set(bad.tolist()))[:5]}")
