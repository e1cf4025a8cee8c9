"""Training on several devices with Lightning's DDP: one process per GPU, or, on a machine
without one, processes on the CPU that talk through gloo.

`--devices N` (N > 1) makes the Trainer start N - 1 more copies of the command (Lightning's
subprocess launcher; under torchrun it takes torchrun's processes instead). Every process
builds the same data and the same seeded weights; rank 0 alone writes the checkpoint, the
card and the W&B run, and epoch metrics are averaged over the ranks (`sync_dist`).

- pretrain: Lightning's DDPStrategy. Each epoch, a DistributedSampler seeded by --seed gives
  each rank its share of the problems, and the gradients are all-reduced, so with --batch-size
  split over the devices a run takes the optimiser steps of a one-device run, each over as
  many problems (drawn in another order).
- meta-pretrain does not fit DDP's gradient all-reduce: a Reptile meta-step adapts to one task
  with k inner steps, and DDP would average the inner gradients of the ranks' different
  tasks. `TaskParallel` keeps Lightning's processes and process group but leaves the model
  unwrapped; each rank adapts to its own task, and the meta-step moves towards the mean of
  the ranks' adapted weights (`average_weights`): Reptile with N tasks per meta-step, the
  batched form of Nichol et al. (2018). With --plain the ranks' Adams step apart and their
  weights are averaged after every k steps (local SGD), not their gradients after each.
"""
from __future__ import annotations

from typing import Iterable

import torch
from pytorch_lightning.strategies import DDPStrategy


def process_rank() -> tuple[int, int]:
    """(rank, world size) of the process group; (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TaskParallel(DDPStrategy):
    """DDP's processes and process group without DDP's gradient all-reduce (see the module)."""

    def configure_ddp(self) -> None:
        import torch.distributed as dist

        with torch.no_grad():  # what DDP's wrapper would have done: every rank starts from rank 0's weights
            for t in self.model.state_dict().values():
                dist.broadcast(t, src=0)


def trainer_options(devices: int, *, task_parallel: bool = False) -> dict:
    """The Trainer's accelerator, devices and strategy for `devices` processes (1: as ever)."""
    if devices < 1:
        raise ValueError(f"--devices {devices}: give 1 or more")
    if devices == 1:
        return {"accelerator": "auto", "devices": 1}
    gpu = torch.cuda.is_available()
    strategy = (TaskParallel if task_parallel else DDPStrategy)(process_group_backend="nccl" if gpu else "gloo")
    return {"accelerator": "gpu" if gpu else "cpu", "devices": devices, "strategy": strategy}


@torch.no_grad()
def average_weights(params: Iterable[torch.nn.Parameter]) -> None:
    """Replace each parameter by its mean over the ranks (nothing without a process group)."""
    import torch.distributed as dist

    _, world = process_rank()
    if world == 1:
        return
    params = list(params)
    flat = torch.nn.utils.parameters_to_vector(params)  # one all-reduce per meta-step, not one per tensor
    dist.all_reduce(flat)
    torch.nn.utils.vector_to_parameters(flat / world, params)
