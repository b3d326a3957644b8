"""The process group of a convergence trial: one rank per worker, under torchrun locally or a
Kubeflow TrainJob (both set RANK, WORLD_SIZE, MASTER_ADDR, ... in the environment)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from batchscale.errors import BatchscaleError


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(expected_world_size: int) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != expected_world_size:
        # Elastic shrink would silently change the global batch: refuse instead.
        raise BatchscaleError(
            f"world size is {world} but the spec asks for {expected_world_size} workers; "
            "refusing to continue with a different global batch")
    rank = int(os.environ.get("RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(group_backend(use_cuda), store=attempt_store(),
                                rank=rank, world_size=world)
    return Dist(rank, world, device)


def group_backend(use_cuda: bool) -> str:
    """The process group's backends: on GPUs NCCL for CUDA tensors (gradients, the all-reduce
    probe) and gloo beside it for the CPU tensors the trainer reduces at each evaluation (loss
    sums, training time, the CPU wait, a loop's verdict). A group of NCCL alone refuses those
    ("No backend type associated with device type cpu")."""
    return "cpu:gloo,cuda:nccl" if use_cuda else "gloo"


def backend_of(device: str) -> str:
    """The backend that carries collectives of tensors on `device` ("cuda:0" → "nccl" in a
    group of cpu:gloo,cuda:nccl; the group's one backend otherwise)."""
    name = str(dist.get_backend())
    if ":" not in name:
        return name
    per_device = dict(part.split(":", 1) for part in name.split(","))
    return per_device.get(device.split(":")[0], name)


def attempt_store() -> dist.Store:
    """torchrun's rendezvous store, under a prefix per restart attempt. The store outlives a
    restarted group; without the prefix a new rank can read the dead group's addresses and
    fail to connect (gloo: "connectFullMesh failed ... Connection refused")."""
    store, _, _ = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"batchscale/attempt-{attempt}/", store)


def all_reduce(value: torch.Tensor, d: Dist, op=None) -> torch.Tensor:
    if d.world_size > 1:
        dist.all_reduce(value, op=op or dist.ReduceOp.SUM)
    return value


def barrier(d: Dist) -> None:
    if d.world_size > 1:
        dist.barrier()
