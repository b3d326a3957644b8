"""What exists: the named datasets, with a line each for `batchscale datasets`.

The names live here, below the config, so the config can check a name without importing the
loaders (which need torch, torchvision, scikit-learn); `batchscale/data/datasets.py` maps each
name to its loader, and a test keeps the two in step.
"""

DATASETS = {
    "digits": "embedded default: scikit-learn's bundled 8x8 digits, 1,797 images, 10 classes",
    "teacher-student": "synthetic: labels from a seeded random 2-layer teacher, noise knob, "
                       "any number of rows",
    "cifar10": "torchvision CIFAR-10 (32x32 RGB, 10 classes) from source_uri (dir or s3://)",
    "mnist": "torchvision MNIST (28x28 grayscale digits) from source_uri (dir or s3://)",
    "fashion-mnist": "torchvision Fashion-MNIST (28x28 grayscale clothing) from source_uri",
    "parquet": "your own Parquet file(s) at source_uri: numeric arrays or image bytes plus an "
               "integer label column",
}
DATASET_NAMES = tuple(DATASETS)
SOURCE_DATASETS = ("cifar10", "mnist", "fashion-mnist", "parquet")
"""Datasets read from `source_uri`; the others are embedded or generated."""
