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


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo, group=None) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


@dataclass(frozen=True)
class Layout:
    """Data parallel x context parallel (trainer.context_parallel=N): global rank r is context rank r % N of the CP
    group of ranks [N * (r // N), ..., N * (r // N) + N - 1] (consecutive ranks, one node where N <= GPUs a node),
    and data-parallel rank r // N of W / N; each DP rank reads its own documents, the N ranks of its CP group each
    a slice of them along the context. `dp_group` joins the ranks holding the same slice (they sum the evaluation's
    documents); gradients are averaged over the whole world by DDP, which is right: every rank's loss is a mean over
    the same number of tokens. N = 1: plain DDP (cp None, the default group)."""
    dp_rank: int = 0
    dp_world: int = 1
    cp: object = None        # models.context_parallel.ContextParallel, None without CP
    dp_group: object = None  # None: the default group


def context_parallel_layout(info: DistInfo, n: int) -> Layout:
    """The groups of trainer.context_parallel=n (n must divide the world size: config.check_context_parallel).
    Every rank creates every group, in the same order, as torch.distributed requires."""
    if n == 1:
        return Layout(info.rank, info.world_size)
    from longctx.models.context_parallel import ContextParallel

    cp_groups = [dist.new_group(list(range(i * n, (i + 1) * n))) for i in range(info.world_size // n)]
    dp_groups = [dist.new_group(list(range(j, info.world_size, n))) for j in range(n)]
    cp = ContextParallel(cp_groups[info.rank // n], info.rank % n, n)
    return Layout(info.rank // n, info.world_size // n, cp, dp_groups[info.rank % n])


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
