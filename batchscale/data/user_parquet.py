"""A user's own Parquet dataset: one column of examples (numeric arrays or encoded images) and
one integer label column, validated on the way in so a bad file stops data prep, not training.

Accepted feature columns:
- a list (or fixed-size list) of numbers: used as is, reshaped to `feature_shape`;
- binary: encoded images (PNG, JPEG, anything Pillow reads), decoded to float32 (C, H, W) in
  [0, 1]; grayscale stays one channel, every other mode becomes RGB;
- a struct with a binary `bytes` field (how Hugging Face `datasets` exports images).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchscale.data.datasets import RawDataset
from batchscale.errors import BadInput
from batchscale.location import Location, is_s3_uri, open_file, open_location

PARQUET_SUFFIX = ".parquet"
IMAGE_BYTES_FIELD = "bytes"
GRAYSCALE_MODE = "L"
COLOR_MODE = "RGB"
PIXEL_MAX = 255.0
MAX_SHOWN = 5
"""Offending rows or values named in an error message."""
MAX_CLASSES = 100_000
"""Labels lie in 0..MAX_CLASSES-1. The number of classes is the largest label + 1 and arrays
of that length are allocated (class histograms, the model's output layer): a stray label of
2**40 would otherwise ask for terabytes before anything else went wrong."""


def load_user_parquet(uri: str, feature_column: str, label_column: str,
                      feature_shape: list[int] | None) -> RawDataset:
    """Read every Parquet file at `uri` and turn it into a RawDataset, or raise BadInput naming
    the file, the column and what is allowed."""
    table = pa.concat_tables(_read_tables(uri))
    if table.num_rows == 0:
        raise BadInput(f"parquet {uri}: no rows")
    labels, num_classes = _labels(table, label_column, uri)
    features = _features(table, feature_column, feature_shape, uri)
    source = f"parquet {uri} (features {feature_column!r}, labels {label_column!r})"
    return RawDataset(features, labels, num_classes, source)


# ------------------------------------------------------------------------------ reading
def _read_tables(uri: str) -> list[pa.Table]:
    location, names = _parquet_files(uri)
    tables = [location.get_table(name) for name in names]
    schemas = {t.schema.remove_metadata() for t in tables}
    if len(schemas) > 1:
        raise BadInput(f"parquet {uri}: the files disagree on their schema: "
                       + " / ".join(str(s).replace("\n", ", ") for s in schemas))
    return tables


def _parquet_files(uri: str) -> tuple[Location, list[str]]:
    """One file (a local file, or an S3 key ending in .parquet) or every *.parquet file under a
    directory or prefix: the location to read them from and their names in it."""
    one_file = uri.endswith(PARQUET_SUFFIX) if is_s3_uri(uri) else not Path(uri).is_dir()
    if one_file:
        location, name = open_file(uri)
        return location, [name]
    location = open_location(uri)
    names = [n for n in location.names() if n.endswith(PARQUET_SUFFIX)]
    if not names:
        raise BadInput(f"parquet: {uri} holds no *{PARQUET_SUFFIX} files")
    return location, names


# ------------------------------------------------------------------------------- labels
def _column(table: pa.Table, name: str, role: str, uri: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise BadInput(f"parquet {uri}: no {role} column {name!r}; columns are "
                       f"{table.column_names} (set dataset.{role}_column)")
    copies = table.column_names.count(name)
    if copies > 1:
        raise BadInput(f"parquet {uri}: column {name!r} appears {copies} times; column names "
                       "must be unique")
    return table.column(name)


def _labels(table: pa.Table, name: str, uri: str) -> tuple[np.ndarray, int]:
    """The labels as int64 and the number of classes, refused before anything is sized by
    them unless they are integers in 0..MAX_CLASSES-1 naming at most one class per row."""
    column = _column(table, name, "label", uri)
    if not pa.types.is_integer(column.type):
        raise BadInput(f"parquet {uri}: label column {name!r} has type {column.type}; "
                       "labels must be integers 0..num_classes-1 (no floats, no NaN)")
    _no_nulls(column, name, uri)
    raw = column.to_numpy()  # its own integer type: uint64 labels above 2**63 do not wrap
    _refuse_rows(raw < 0, raw, f"label column {name!r} has negative labels", uri)
    _refuse_rows(raw >= MAX_CLASSES, raw, f"label column {name!r} has labels of "
                 f"{MAX_CLASSES} or more (at most {MAX_CLASSES:,} classes)", uri)
    labels = raw.astype(np.int64)
    num_classes = int(labels.max()) + 1
    if num_classes > len(labels):
        raise BadInput(f"parquet {uri}: label column {name!r} goes up to {num_classes - 1}, "
                       f"so {num_classes} classes for only {len(labels)} rows; labels must "
                       "number the classes 0..num_classes-1")
    return labels, num_classes


def _refuse_rows(bad: np.ndarray, values: np.ndarray, what: str, uri: str) -> None:
    rows = np.flatnonzero(bad)
    if rows.size:
        raise BadInput(f"parquet {uri}: {what} {values[rows[:MAX_SHOWN]].tolist()} at rows "
                       f"{rows[:MAX_SHOWN].tolist()}; labels must be 0..num_classes-1")


def _no_nulls(column: pa.ChunkedArray, name: str, uri: str) -> None:
    nulls = np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))
    if nulls.size:
        raise BadInput(f"parquet {uri}: column {name!r} has {nulls.size} nulls, at rows "
                       f"{nulls[:MAX_SHOWN].tolist()}")


# ----------------------------------------------------------------------------- features
def _features(table: pa.Table, name: str, shape: list[int] | None, uri: str) -> np.ndarray:
    column = _column(table, name, "feature", uri)
    _no_nulls(column, name, uri)
    kind = column.type
    if pa.types.is_struct(kind) and kind.get_field_index(IMAGE_BYTES_FIELD) >= 0:
        column = pc.struct_field(column, IMAGE_BYTES_FIELD)
        kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return _decode_images(column, name, uri)
    if _is_numeric_list(kind):
        return _numeric_arrays(column.combine_chunks(), name, shape, uri)
    raise BadInput(f"parquet {uri}: feature column {name!r} has type {kind}; allowed: a list "
                   "of numbers, binary image bytes, or a struct with a binary 'bytes' field")


def _is_numeric_list(kind: pa.DataType) -> bool:
    lists = pa.types.is_list(kind) or pa.types.is_large_list(kind) or \
        pa.types.is_fixed_size_list(kind)
    return lists and (pa.types.is_floating(kind.value_type) or pa.types.is_integer(kind.value_type))


def _numeric_arrays(column: pa.Array, name: str, shape: list[int] | None, uri: str) -> np.ndarray:
    """(rows, *shape) float32 in one bulk conversion, refusing ragged rows and NaN/inf."""
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    width = int(np.prod(shape)) if shape else int(lengths[0])
    ragged = np.flatnonzero(lengths != width)
    if ragged.size:
        raise BadInput(f"parquet {uri}: feature column {name!r} must hold {width} values per row "
                       f"(feature_shape {shape or [width]}); rows {ragged[:MAX_SHOWN].tolist()} "
                       f"hold {lengths[ragged[:MAX_SHOWN]].tolist()}")
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.float32)
    features = values.reshape(len(column), *(shape or [width]))
    bad_rows = np.flatnonzero(~np.isfinite(features.reshape(len(features), -1)).all(axis=1))
    if bad_rows.size:
        raise BadInput(f"parquet {uri}: feature column {name!r} holds NaN or infinite values "
                       f"at rows {bad_rows[:MAX_SHOWN].tolist()}")
    return features


def _decode_images(column: pa.ChunkedArray, name: str, uri: str) -> np.ndarray:
    """Decode every image (per row: decoding is Pillow's job) and stack them as (C, H, W)."""
    from PIL import Image, UnidentifiedImageError

    blobs = column.to_pylist()
    decoded = []
    mode = None
    for row, blob in enumerate(blobs):
        try:
            image = Image.open(io.BytesIO(blob))
            mode = mode or (GRAYSCALE_MODE if image.mode == GRAYSCALE_MODE else COLOR_MODE)
            decoded.append(np.asarray(image.convert(mode)))
        except (UnidentifiedImageError, OSError, ValueError) as err:
            raise BadInput(f"parquet {uri}: feature column {name!r} row {row} is not a "
                           f"readable image: {err}") from None
    sizes = sorted({a.shape for a in decoded})
    if len(sizes) > 1:
        raise BadInput(f"parquet {uri}: images in column {name!r} differ in size "
                       f"{sizes[:MAX_SHOWN]}; resize them to one size first")
    images = np.stack(decoded).astype(np.float32) / PIXEL_MAX
    return images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
