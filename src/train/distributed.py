"""Process-group setup from torchrun's environment (NCCL on GPU, gloo on CPU); a no-op for one process."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _export_slurm_env() -> None:
    """Under a submitit job of several tasks (hydra/launcher=submitit_slurm with tasks_per_node > 1) there
    is no torchrun: take rank and rendezvous from Slurm's variables, as submitit documents."""
    if "WORLD_SIZE" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:
        return
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def init_distributed(device_type: str) -> DistInfo:
    _export_slurm_env()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistInfo()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank)


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
