"""The `kubernetes:` section's sizes and names (batchscale/config/kubernetes.py): a worker is one
process on one device, measuring pods in whole CPUs, Kubernetes object names checked."""

from __future__ import annotations

import pytest
from test_config import refused_dict

from batchscale.config import parse_config


def test_a_worker_is_one_process_on_one_device():
    """gpus_per_worker > 1 would make torchrun start a process per GPU (Trainer sets
    PET_NPROC_PER_NODE=auto) and break the world size: refused, pointing at the worker count."""
    message = str(refused_dict({"kubernetes": {"gpus_per_worker": 2}}))
    assert "kubernetes.gpus_per_worker: 2 GPUs per worker is not allowed" in message
    assert "a worker is one training process on one device" in message
    assert "0 (CPU) or 1" in message and "raise convergence.workers" in message
    for gpus in (0, 1):
        assert parse_config({"kubernetes": {"gpus_per_worker": gpus}}).kubernetes \
            .gpus_per_worker == gpus


@pytest.mark.parametrize(("patch", "field", "needle"), [
    ({"measure_cpus": 0}, "measure_cpus", "greater than 0"),
    ({"measure_cpus": 1.5}, "measure_cpus", "integer"),
    ({"measure_cpus": 1025}, "measure_cpus", "less than or equal to 1024"),
    ({"measure_memory_gib": 0}, "measure_memory_gib", "greater than 0"),
    ({"stage_cpus": 0}, "stage_cpus", "greater than 0"),
    ({"stage_memory_gib": -1}, "stage_memory_gib", "greater than 0"),
    ({"image_pull_secrets": ["Reg_Cred"]}, "image_pull_secrets",
     "'Reg_Cred' is not a Kubernetes object name"),
    ({"image_pull_secrets": ["ok"] * 65}, "image_pull_secrets", "at most 64"),
    ({"service_account": "Pipeline Runner"}, "service_account", "not a Kubernetes object name"),
    ({"s3_secret_name": "-creds"}, "s3_secret_name", "not a Kubernetes object name"),
])
def test_cluster_sizes_and_object_names_are_checked(patch, field, needle):
    message = str(refused_dict({"kubernetes": patch}))
    assert f"kubernetes.{field}" in message and needle in message, message


def test_cluster_defaults_measure_in_whole_cpus_and_write_a_shared_prefix():
    k8s = parse_config({}).kubernetes
    assert isinstance(k8s.measure_cpus, int) and k8s.measure_cpus >= 1
    assert k8s.s3_prefix == "shared/batchscale" and k8s.service_account == ""
    off = parse_config({"kubernetes": {"measure_cpus": None, "image_pull_secrets": ["a.b-c"],
                                       "service_account": "bench-runner"}}).kubernetes
    assert off.measure_cpus is None and off.image_pull_secrets == ["a.b-c"]
