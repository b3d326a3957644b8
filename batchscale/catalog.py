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
    "python-docs": "embedded text: the Python documentation's topic pages (pydoc_data, ships "
                   "with CPython, PSF licence, ~466 KB), byte sequences for language models",
    "text": "your own text at source_uri: .txt files, or Parquet with a string column "
            "(text_column), byte sequences for language models",
    "shapes": "generated: discs, squares and triangles on textured backgrounds with pixel "
              "masks, for segmentation and detection, any number of rows",
}
DATASET_NAMES = tuple(DATASETS)
SOURCE_DATASETS = ("cifar10", "mnist", "fashion-mnist", "parquet", "text")
"""Datasets read from `source_uri`; the others are embedded or generated."""
TEXT_DATASETS = ("python-docs", "text")
MASK_DATASETS = ("shapes",)
DATASET_TASKS = {
    **{name: ("classification",) for name in DATASETS},
    **{name: ("language_model",) for name in TEXT_DATASETS},
    **{name: ("segmentation", "detection") for name in MASK_DATASETS},
}
"""The kinds of task each dataset can train (a workload of another kind is refused)."""
