"""A convergence trial's data: the workload sized by its dataset, and its (train, val) splits
(batchscale/datasplit.py) — a contract workload's own datasets, or a prepared dataset's shards."""

from __future__ import annotations

from batchscale.datasplit import TensorSplit
from batchscale.errors import BadInput
from batchscale.shards import load_split, read_manifest
from batchscale.workloads import Workload, get_workload


def load_data(data_uri: str, workload: Workload):
    """(train, val) splits (batchscale/datasplit.py): a contract workload's own datasets, read
    by index a batch at a time; else the prepared dataset at `data_uri` (a directory or an
    s3:// prefix) as tensors, in the workload's shape or the dataset's own where the model
    takes any size. Each rank reads its slice of each global batch, so the global batch is
    identical for any worker count."""
    if workload.has_own_data:
        from batchscale.contract_check import load_split as contract_split

        return contract_split(workload.contract, "train"), contract_split(workload.contract, "val")
    shape = None if workload.shape_from_data else workload.example_shape
    # The training split is streamed when large; the validation split is held in memory.
    return tuple(TensorSplit(workload, *load_split(data_uri, split, input_shape=shape,
                                                   stream=split == "train"))
                 for split in ("train", "val"))


def workload_for_data(name: str, data_uri: str) -> Workload:
    """The workload `name`, sized by the dataset where its model takes any size: the image
    side and classes of a segmentation or detection dataset, the sequence length of text."""
    workload = get_workload(name)
    if workload.has_own_data or not workload.shape_from_data:
        return workload
    first = read_manifest(data_uri).to_pylist()[0]
    shape, classes = tuple(first["feature_shape"]), first["num_classes"]
    if workload.kind == "language_model":
        return get_workload(name, input_shape=(shape[0] - 1,))
    if workload.kind == "classification":  # a user model: the dataset's examples and classes
        return get_workload(name, input_shape=shape, num_classes=classes)
    if len(shape) != 3 or shape[0] != 4:
        raise BadInput(f"{name} trains on images with a class-id channel (4, H, W); the "
                       f"dataset at {data_uri} has examples of shape {list(shape)}")
    return get_workload(name, image_size=shape[-1], num_classes=classes)
