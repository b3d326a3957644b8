"""A convergence trial's data: the workload sized by its dataset, and its (train, val) splits
(batchscale/datasplit.py) through the workload's contract — a user's own datasets, or a
built-in's prepared dataset."""

from __future__ import annotations

from batchscale.contract_check import load_split
from batchscale.errors import BadInput
from batchscale.shards import read_manifest
from batchscale.workloads import Workload, get_workload


def load_data(data_uri: str, workload: Workload):
    """(train, val) splits (batchscale/datasplit.py) of the workload's contract: a user
    workload's own datasets, or a built-in's prepared dataset at `data_uri` (a directory or an
    s3:// prefix) in the workload's shape or the dataset's own where the model takes any size.
    Items are read by index a batch at a time: each rank reads its slice of each global batch,
    so the global batch is identical for any worker count."""
    contract = workload.contract_for(data_uri)
    return load_split(contract, "train"), load_split(contract, "val")


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
