"""data_prep: every dataset through the real readers (torchvision's classes on tiny files in the
real on-disk formats, a real SeaweedFS for S3), a deterministic split, a truthful manifest, and
bad input refused with a message naming the file or column before anything is written."""

from __future__ import annotations

import gzip
import io
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscale.config import DataPrepConfig
from batchscale.data.datasets import (
    DATASET_NAMES,
    TEACHER_CLASSES,
    RawDataset,
    TeacherStudent,
    load_dataset,
)
from batchscale.data.prep import (
    MANIFEST_FILE,
    MIN_SPLIT_ROWS,
    ROW_GROUP_TARGET_BYTES,
    check_split,
    prepare,
    row_group_rows,
    sha256_file,
    split_indices,
)
from batchscale.errors import BadInput
from batchscale.storage import ObjectStore, parquet_bytes
from helpers import run_cli, store_env

CIFAR_ROWS_PER_BATCH = 6
CIFAR_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
MNIST_TRAIN_ROWS = 20
MNIST_TEST_ROWS = 5
IDX_UBYTE_TYPE = 0x08
HALF = 0.5
"""val_fraction of the reader tests: their files hold a few rows of each class, and the default
0.2 would leave validation fewer rows than classes (refused, see test_too_small_splits_...)."""


# ------------------------------------------------------------ tiny files in the real formats
def write_cifar10(root: Path, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 python batches as the 2009 release lays them out (rows of 3,072 bytes, R then
    G then B planes); returns the training images (N, 3, 32, 32) and labels in file order."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for name in [*CIFAR_TRAIN_FILES, "test_batch"]:
        data = rng.integers(0, 256, (CIFAR_ROWS_PER_BATCH, 3072), dtype=np.uint8)
        targets = rng.integers(0, 10, CIFAR_ROWS_PER_BATCH).tolist()
        batch = {"batch_label": name, "data": data, "labels": targets,
                 "filenames": [f"{name}_{i}.png" for i in range(CIFAR_ROWS_PER_BATCH)]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        if name != "test_batch":
            images.append(data.reshape(-1, 3, 32, 32))
            labels += targets
    meta = {"label_names": [f"class{i}" for i in range(10)], "num_cases_per_batch": 6}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return np.concatenate(images), np.array(labels)


def idx_ubyte(array: np.ndarray) -> bytes:
    """The idx format of LeCun's MNIST files: magic (type 0x08, ndim), big-endian dims, data."""
    header = bytes([0, 0, IDX_UBYTE_TYPE, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def write_mnist(root: Path, class_name: str = "MNIST", gz: bool = False,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The four idx files under `<class_name>/raw/`; returns the training images and labels."""
    raw = root / class_name / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    out = {}
    for split, rows in (("train", MNIST_TRAIN_ROWS), ("t10k", MNIST_TEST_ROWS)):
        out[split] = (rng.integers(0, 256, (rows, 28, 28), dtype=np.uint8),
                      rng.integers(0, 10, rows, dtype=np.uint8))
        for kind, array in zip(("images-idx3", "labels-idx1"), out[split], strict=True):
            name = f"{split}-{kind}-ubyte"
            data = idx_ubyte(array)
            if gz:
                (raw / f"{name}.gz").write_bytes(gzip.compress(data))
            else:
                (raw / name).write_bytes(data)
    return out["train"]


def all_rows(out_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every prepared row (train then val), features flat, read straight from the shards."""
    manifest = pq.read_table(out_dir / MANIFEST_FILE).to_pylist()
    tables = [pq.read_table(out_dir / m["shard"]) for m in manifest]
    table = pa.concat_tables(tables)
    features = np.stack(table.column("features").to_numpy(zero_copy_only=False))
    return features, table.column("label").to_numpy()


def sorted_rows(features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Rows as a set (order-free), to compare prepared data with its source."""
    rows = np.concatenate([features.reshape(len(features), -1), labels[:, None]], axis=1)
    return rows[np.lexsort(rows.T[::-1])]


def prep(tmp_path: Path, **fields) -> tuple[pa.Table, Path]:
    out = tmp_path / "out"
    return prepare(DataPrepConfig(**fields), out), out


# ------------------------------------------------------------------------------ digits
def test_digits_manifest_tells_the_truth(tmp_path):
    manifest, out = prep(tmp_path)
    entries = manifest.to_pylist()
    assert sum(m["rows"] for m in entries) == 1797
    for m in entries:
        assert m["sha256"] == sha256_file(out / m["shard"])
        labels = pq.read_table(out / m["shard"]).column("label").to_numpy()
        assert m["class_histogram"] == np.bincount(labels, minlength=10).tolist()
        assert (m["feature_shape"], m["feature_dtype"], m["num_classes"]) == ([64], "float32", 10)
        assert (m["source"], m["split_seed"]) == ("sklearn.datasets.load_digits", 0)
    val_rows = sum(m["rows"] for m in entries if m["split"] == "val")
    assert val_rows == round(1797 * 0.2)


def test_split_is_deterministic_from_the_seed(tmp_path):
    first, _ = prep(tmp_path / "a")
    again, _ = prep(tmp_path / "b")
    other, _ = prep(tmp_path / "c", split_seed=1)
    assert first.column("sha256").to_pylist() == again.column("sha256").to_pylist()
    assert set(first.column("sha256").to_pylist()).isdisjoint(other.column("sha256").to_pylist())


def test_max_rows_keeps_a_seeded_subset(tmp_path):
    manifest, out = prep(tmp_path, max_rows=300)
    assert sum(manifest.column("rows").to_pylist()) == 300
    assert "300 rows sampled with seed 0" in manifest.column("source")[0].as_py()
    again, _ = prep(tmp_path / "again", max_rows=300)
    assert manifest.column("sha256").to_pylist() == again.column("sha256").to_pylist()


# ------------------------------------------------------------------ splits too small to use
# (seen: a one-row validation split "reached" the target at step 0; max_rows leaving no
# training rows made torchrun restart three times and dump a traceback.)
@pytest.mark.parametrize(("fields", "needle", "named"), [
    ({"max_rows": 5}, "5 rows split into 4 training and 1 validation rows", "dataset.max_rows"),
    ({"max_rows": 1}, "1 rows split into 0 training and 1 validation rows", "dataset.max_rows"),
    ({"val_fraction": 0.001}, "1797 rows split into 1795 training and 2 validation rows",
     "dataset.val_fraction"),
    ({"val_fraction": 0.999}, "1797 rows split into 2 training and 1795 validation rows",
     "dataset.val_fraction"),
    ({"max_rows": 45}, "into 36 training and 9 validation", "dataset.max_rows"),
    ({"name": "teacher-student", "synthetic_train_rows": 9}, "into 9 training and 2 validation",
     "dataset.synthetic_train_rows"),
])
def test_too_small_splits_are_refused_before_writing(tmp_path, fields, needle, named):
    with pytest.raises(BadInput) as err:
        prep(tmp_path, **fields)
    message = str(err.value)
    assert needle in message and named in message and "dataset.val_fraction" in message
    assert "each split needs at least 10 rows (one per class on average for 10 classes" in message
    assert not (tmp_path / "out").exists()


def test_the_smallest_allowed_split_is_prepared(tmp_path):
    manifest, _ = prep(tmp_path, max_rows=50)  # 40 + 10 rows: 10 classes, one each on average
    rows = {s: sum(m["rows"] for m in manifest.to_pylist() if m["split"] == s)
            for s in ("train", "val")}
    assert rows == {"train": 40, "val": 10}


def test_a_two_class_dataset_needs_two_rows_per_split(tmp_path):
    src = write_user_parquet(tmp_path / "two.parquet",
                             {"features": [[0.0], [1.0], [2.0]], "label": [0, 1, 1]})
    with pytest.raises(BadInput, match=r"3 rows split into 2 training and 1 validation rows "
                                       r"\(val_fraction 0.2\); each split needs at least 2 rows"):
        prep(tmp_path, name="parquet", source_uri=str(src))
    assert not (tmp_path / "out").exists()


@given(rows=st.integers(1, 400), classes=st.integers(1, 30),
       val_fraction=st.floats(0.001, 0.999))
@settings(max_examples=80, deadline=None)
def test_split_check_agrees_with_the_split_itself(rows, classes, val_fraction):
    raw = RawDataset(np.zeros((rows, 1), np.float32), np.arange(rows) % classes, classes, "t")
    cfg = DataPrepConfig(val_fraction=val_fraction)
    sizes = [len(idx) for idx in split_indices(rows, val_fraction, 0).values()]
    assert sum(sizes) == rows
    if min(sizes) >= max(MIN_SPLIT_ROWS, classes):
        check_split(raw, cfg)
    else:
        with pytest.raises(BadInput, match="falls short: change dataset.val_fraction"):
            check_split(raw, cfg)


def test_cli_refuses_a_split_without_training_rows(tmp_path):
    (tmp_path / "c.yaml").write_text("dataset:\n  max_rows: 1\n")
    result = run_cli(["converge", "--config", "c.yaml", "--out", "o"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "1 rows split into 0 training and 1 validation rows" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_shards_and_row_groups_are_sized(tmp_path):
    manifest, out = prep(tmp_path, name="teacher-student", synthetic_train_rows=2500,
                         rows_per_shard=1000)
    train = [m for m in manifest.to_pylist() if m["split"] == "train"]
    assert [m["rows"] for m in train] == [1000, 1000, 500]
    assert pq.ParquetFile(out / train[0]["shard"]).metadata.num_row_groups == 1
    # A CIFAR-sized example (3x32x32 float32 = 12 KiB) gets ~32 MiB row groups.
    assert row_group_rows((3, 32, 32), 100_000) == ROW_GROUP_TARGET_BYTES // (3 * 32 * 32 * 4)
    assert row_group_rows((64,), 4096) == 4096


# ----------------------------------------------------------------------- teacher-student
def test_teacher_student_is_deterministic_from_its_seed():
    x1, y1 = TeacherStudent(seed=3, noise=0.2).sample(500)
    x2, y2 = TeacherStudent(seed=3, noise=0.2).sample(500)
    x3, _ = TeacherStudent(seed=4, noise=0.2).sample(500)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert not np.array_equal(x1, x3)


def test_noise_moves_agreement_with_the_teacher():
    rows = 20_000
    agreement = {}
    for noise in (0.0, 0.3, 0.6, 1.0):
        task = TeacherStudent(seed=0, noise=noise)
        x, y = task.sample(rows)
        agreement[noise] = float(np.mean(y == task.teacher_labels(x)))
    assert agreement[0.0] == 1.0
    # A replaced label is uniform over 10 classes, so it keeps the teacher's label 1 in 10 times.
    for noise in (0.3, 0.6, 1.0):
        assert agreement[noise] == pytest.approx(1.0 - 0.9 * noise, abs=0.015)


def test_fresh_batches_never_repeat_and_share_the_teacher():
    task = TeacherStudent(seed=0, noise=0.0)
    batches = task.batches(64)
    (x1, y1), (x2, y2) = next(batches), next(batches)
    prepared, _ = task.sample(64)
    assert not np.array_equal(x1, x2) and not np.array_equal(x1, prepared)
    assert np.array_equal(y1, task.teacher_labels(x1))
    assert np.array_equal(y2, task.teacher_labels(x2))


def test_teacher_student_train_rows_are_as_configured(tmp_path):
    manifest, _ = prep(tmp_path, name="teacher-student", synthetic_train_rows=3000,
                       synthetic_noise=0.25)
    rows = {s: sum(m["rows"] for m in manifest.to_pylist() if m["split"] == s)
            for s in ("train", "val")}
    assert rows == {"train": 3000, "val": 750}
    assert "noise=0.25" in manifest.column("source")[0].as_py()
    assert manifest.column("num_classes")[0].as_py() == TEACHER_CLASSES


# ------------------------------------------------------------------------ torchvision
def test_cifar10_through_torchvision(tmp_path):
    images, labels = write_cifar10(tmp_path / "src")
    manifest, out = prep(tmp_path, name="cifar10", source_uri=str(tmp_path / "src"),
                         val_fraction=HALF)
    entry = manifest.to_pylist()[0]
    assert entry["feature_shape"] == [3, 32, 32] and entry["num_classes"] == 10
    assert "torchvision.datasets.CIFAR10(train=True)" in entry["source"]
    assert "official release files: no" in entry["source"]
    features, got = all_rows(out)
    assert len(got) == len(CIFAR_TRAIN_FILES) * CIFAR_ROWS_PER_BATCH  # the test batch stays out
    expected = images.astype(np.float32) / 255.0  # channel planes (C, H, W), as in the files
    assert np.array_equal(sorted_rows(features, got), sorted_rows(expected, labels))


@pytest.mark.parametrize(("name", "class_name", "gz"),
                         [("mnist", "MNIST", False), ("fashion-mnist", "FashionMNIST", True)])
def test_mnist_family_through_torchvision(tmp_path, name, class_name, gz):
    images, labels = write_mnist(tmp_path / "src", class_name, gz=gz)
    manifest, out = prep(tmp_path, name=name, source_uri=str(tmp_path / "src"), val_fraction=HALF)
    assert manifest.column("feature_shape")[0].as_py() == [1, 28, 28]
    assert f"torchvision.datasets.{class_name}(train=True)" in manifest.column("source")[0].as_py()
    features, got = all_rows(out)
    expected = images[:, None].astype(np.float32) / 255.0
    assert np.array_equal(sorted_rows(features, got), sorted_rows(expected, labels.astype(int)))
    if gz:  # unpacked into a temporary cache, never next to the user's files
        assert not list((tmp_path / "src").rglob("*-ubyte"))


def test_cifar10_from_s3_prefix(tmp_path, object_store: ObjectStore, monkeypatch):
    images, labels = write_cifar10(tmp_path / "src")
    for path in (tmp_path / "src").rglob("*"):
        if path.is_file():
            rel = path.relative_to(tmp_path / "src").as_posix()
            object_store.put_bytes(object_store.key("mirror", rel), path.read_bytes())
    for key, value in store_env(object_store).items():
        monkeypatch.setenv(key, value)
    uri = f"s3://{object_store.settings.bucket}/{object_store.key('mirror')}"
    manifest, out = prep(tmp_path, name="cifar10", source_uri=uri, val_fraction=HALF)
    assert uri in manifest.column("source")[0].as_py()
    features, got = all_rows(out)
    assert np.array_equal(sorted_rows(features, got),
                          sorted_rows(images.astype(np.float32) / 255.0, labels))


def test_missing_cifar_file_is_named_and_nothing_written(tmp_path):
    write_cifar10(tmp_path / "src")
    (tmp_path / "src" / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(BadInput, match="lacks data_batch_3; expected data_batch_1"):
        prep(tmp_path, name="cifar10", source_uri=str(tmp_path / "src"))
    assert not (tmp_path / "out").exists()


def test_truncated_cifar_batch_is_named(tmp_path):
    write_cifar10(tmp_path / "src")
    damaged = tmp_path / "src" / "cifar-10-batches-py" / "data_batch_2"
    damaged.write_bytes(damaged.read_bytes()[:500])
    with pytest.raises(BadInput, match=r"data_batch_2 is not a CIFAR-10 python batch file"):
        prep(tmp_path, name="cifar10", source_uri=str(tmp_path / "src"))
    assert not (tmp_path / "out").exists()


def test_truncated_mnist_idx_is_refused(tmp_path):
    write_mnist(tmp_path / "src")
    damaged = tmp_path / "src" / "MNIST" / "raw" / "train-images-idx3-ubyte"
    damaged.write_bytes(damaged.read_bytes()[:1000])
    with pytest.raises(BadInput, match=r"idx files under .*MNIST/raw are unreadable"):
        prep(tmp_path, name="mnist", source_uri=str(tmp_path / "src"))
    assert not (tmp_path / "out").exists()


def test_missing_mnist_file_is_named(tmp_path):
    write_mnist(tmp_path / "src", gz=True)
    (tmp_path / "src" / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(BadInput, match="neither t10k-labels-idx1-ubyte nor "
                                       "t10k-labels-idx1-ubyte.gz"):
        prep(tmp_path, name="mnist", source_uri=str(tmp_path / "src"))


# ------------------------------------------------------------------ user Parquet files
def png(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def write_user_parquet(path: Path, columns: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def test_user_float_arrays_with_shape(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((40, 2, 3)).astype(np.float32)
    y = np.arange(40) % 4
    src = write_user_parquet(tmp_path / "mine.parquet",
                             {"x": list(x.reshape(40, -1)), "cls": pa.array(y, pa.int32())})
    manifest, out = prep(tmp_path, name="parquet", source_uri=str(src), feature_column="x",
                         label_column="cls", feature_shape=[2, 3])
    entry = manifest.to_pylist()[0]
    assert (entry["feature_shape"], entry["num_classes"]) == ([2, 3], 4)
    features, got = all_rows(out)
    assert np.array_equal(sorted_rows(features, got), sorted_rows(x, y))


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_user_image_bytes_are_decoded(tmp_path, mode):
    rng = np.random.default_rng(1)
    shape = (12, 5, 7) if mode == "L" else (12, 5, 7, 3)
    pixels = rng.integers(0, 256, shape, dtype=np.uint8)
    write_user_parquet(tmp_path / "dir" / "part-0.parquet",
                       {"image": [png(p) for p in pixels], "label": np.arange(12) % 3})
    manifest, out = prep(tmp_path, name="parquet", source_uri=str(tmp_path / "dir"),
                         feature_column="image", val_fraction=HALF)
    chw = pixels[:, None] if mode == "L" else pixels.transpose(0, 3, 1, 2)
    assert manifest.column("feature_shape")[0].as_py() == list(chw.shape[1:])
    features, got = all_rows(out)
    expected = chw.astype(np.float32) / 255.0
    assert np.array_equal(sorted_rows(features, got), sorted_rows(expected, np.arange(12) % 3))


def test_hugging_face_image_struct_from_s3(tmp_path, object_store: ObjectStore, monkeypatch):
    pixels = np.random.default_rng(2).integers(0, 256, (10, 4, 4), dtype=np.uint8)
    images = pa.array([{"bytes": png(p), "path": f"{i}.png"} for i, p in enumerate(pixels)])
    object_store.put_bytes(object_store.key("hf", "train.parquet"),
                           parquet_bytes(pa.table({"image": images, "label": np.arange(10) % 2})))
    for key, value in store_env(object_store).items():
        monkeypatch.setenv(key, value)
    uri = f"s3://{object_store.settings.bucket}/{object_store.key('hf')}"
    for i, source_uri in enumerate((uri, f"{uri}/train.parquet")):  # a prefix, one object
        manifest, out = prep(tmp_path / str(i), name="parquet", source_uri=source_uri,
                             feature_column="image")
        assert sum(manifest.column("rows").to_pylist()) == 10
        features, got = all_rows(out)
        assert np.array_equal(sorted_rows(features, got),
                              sorted_rows(pixels[:, None] / np.float32(255.0), np.arange(10) % 2))


GOOD = {"features": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], "label": [0, 1, 1]}


@pytest.mark.parametrize(("columns", "needle"), [
    ({"pixels": GOOD["features"], "label": GOOD["label"]},
     "no feature column 'features'; columns are ['pixels', 'label']"),
    ({**GOOD, "label": ["cat", "dog", "dog"]},
     "label column 'label' has type string; labels must be integers"),
    ({**GOOD, "label": [0.0, 1.0, 1.0]}, "label column 'label' has type double"),
    ({**GOOD, "label": [0, -1, 1]}, "negative labels [-1] at rows [1]"),
    ({**GOOD, "label": [0, None, 1]}, "column 'label' has 1 nulls, at rows [1]"),
    ({**GOOD, "features": [[0.1, 0.2], [float("nan"), 0.4], [0.5, 0.6]]},
     "NaN or infinite values at rows [1]"),
    ({**GOOD, "features": [[0.1, 0.2], [0.3], [0.5, 0.6]]},
     "must hold 2 values per row (feature_shape [2]); rows [1] hold [1]"),
    ({**GOOD, "features": ["a", "b", "c"]}, "feature column 'features' has type string"),
    ({**GOOD, "features": [b"not an image", b"x", b"y"]}, "row 0 is not a readable image"),
])
def test_bad_user_parquet_is_refused_before_writing(tmp_path, columns, needle):
    src = write_user_parquet(tmp_path / "bad.parquet", columns)
    with pytest.raises(BadInput) as err:
        prep(tmp_path, name="parquet", source_uri=str(src))
    assert needle in str(err.value) and str(src) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_truncated_user_parquet_is_refused(tmp_path):
    src = write_user_parquet(tmp_path / "cut.parquet", GOOD)
    src.write_bytes(src.read_bytes()[:-20])
    with pytest.raises(BadInput, match="cut.parquet is not a valid Parquet file"):
        prep(tmp_path, name="parquet", source_uri=str(src))


# --------------------------------------------------------------------------- config / CLI
def test_loading_an_unknown_name_is_refused(tmp_path):
    cfg = DataPrepConfig.model_construct(name="imagenet")  # bypasses the config's own check
    with pytest.raises(BadInput, match="unknown dataset 'imagenet'; allowed: digits"):
        load_dataset(cfg, tmp_path)


def test_cli_lists_datasets_with_descriptions(tmp_path):
    result = run_cli(["datasets"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(DATASET_NAMES)
    assert all(len(line.split(None, 1)[1]) > 20 for line in lines)


def test_cli_refuses_missing_source_files_with_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "c.yaml").write_text(f"dataset:\n  name: cifar10\n  source_uri: "
                                     f"{tmp_path / 'empty'}\n")
    result = run_cli(["converge", "--config", "c.yaml", "--out", "o"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "cifar-10-batches-py lacks data_batch_1" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()
