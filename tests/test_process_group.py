"""The convergence trials' process group: on GPUs NCCL carries the CUDA tensors and gloo the CPU
tensors the trainer reduces at every evaluation (loss sums, training time, the CPU wait, a
loop's verdict). A group of NCCL alone refuses CPU tensors ("No backend type associated with
device type cpu"), so every multi-GPU trial would have failed at its first evaluation. NCCL
cannot start without a GPU: here the choice of backends is tested, and a real group on the
GPU path under the `gpu` marker (skipped without CUDA)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from batchscale.convergence import distributed
from batchscale.convergence.distributed import backend_of, group_backend


def test_a_gpu_group_has_gloo_beside_nccl_for_cpu_tensors():
    assert group_backend(use_cuda=True) == "cpu:gloo,cuda:nccl"
    assert group_backend(use_cuda=False) == "gloo"


@pytest.mark.parametrize(("group", "device", "carrier"), [
    ("cpu:gloo,cuda:nccl", "cuda:1", "nccl"),
    ("cpu:gloo,cuda:nccl", "cpu", "gloo"),
    ("gloo", "cpu", "gloo"),
])
def test_the_probe_records_the_backend_that_carried_its_tensors(monkeypatch, group, device,
                                                               carrier):
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: dist.Backend(group))
    assert backend_of(device) == carrier


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_group_reduces_cpu_and_cuda_tensors(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group(group_backend(use_cuda=True), rank=0, world_size=1)
    try:
        on_cpu = torch.tensor([1.5], dtype=torch.float64)
        dist.all_reduce(on_cpu, op=dist.ReduceOp.MAX)
        on_gpu = torch.ones(4, device="cuda")
        dist.all_reduce(on_gpu)
        assert float(on_cpu[0]) == 1.5 and float(on_gpu.sum()) == 4.0
        assert backend_of("cuda:0") == "nccl" and backend_of("cpu") == "gloo"
    finally:
        dist.destroy_process_group()
