"""The DataModule of meta-pretraining: tasks (`training.tasks`) as batches for Reptile.

A training batch is one task: `inner_steps` batches of its problems for the inner steps and
one more, unseen by them, for the loss after adaptation (`train/meta_loss`). Batches of a
task are disjoint while its problems last. Each inner batch pairs samples with timings and
imported demonstrations where the task has both. Tasks are drawn uniformly, from one
seeded stream that runs on over the epochs. A validation batch is one held-out GPU: its
support batches and its query.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any, Iterator, Sequence

import pytorch_lightning as pl
from torch.utils.data import DataLoader, IterableDataset

from hardware_specs.features import GpuVocab
from gnn_policy.space import ConfigSpace
from training.dataset import Collated, Sample, collate
from training.ddp import process_rank
from training.tasks import HeldOut, Task


@dataclasses.dataclass
class Step:
    """One batch of a task: samples with timings, demonstrations, or both (None where absent)."""

    measured: Collated | None
    demos: Collated | None


@dataclasses.dataclass
class TaskBatch:
    gpu: str
    inner: list[Step]  # one per inner step
    query: Step  # problems the inner steps did not see


def chunks(items: Sequence[Sample], n: int, size: int, rng: random.Random) -> list[list[Sample]]:
    """n batches of `size` items (fewer if there are fewer items): consecutive slices of one
    shuffled order, which wraps round only when the items run out."""
    if not items:
        return [[] for _ in range(n)]
    order = rng.sample(list(items), len(items))
    size = min(size, len(order))
    return [[order[(i * size + j) % len(order)] for j in range(size)] for i in range(n)]


def steps(measured: list[list[Sample]], demos: list[list[Sample]], space: ConfigSpace, vocab: GpuVocab) -> list[Step]:
    def batch(samples: list[Sample]) -> Collated | None:
        return collate(samples, space, vocab) if samples else None

    return [Step(batch(m), batch(d)) for m, d in zip(measured, demos)]


class TaskStream(IterableDataset):
    """`length` task batches per pass, drawn from a seeded stream that continues across passes;
    a task of real rows is drawn `real_weight` times as often as any other.

    Under DDP (`training.ddp`) with N ranks, every rank runs the same stream, draws a task for
    each rank at every meta-step and keeps its own: rank r takes draws r, r + N, r + 2N, ...,
    so the ranks' tasks differ, and N = 1 is the stream as it always was."""

    def __init__(self, tasks: Sequence[Task], length: int, inner_steps: int, batch_size: int, space: ConfigSpace,
                 vocab: GpuVocab, seed: int, real_weight: float = 1.0):
        self.tasks, self.length, self.inner_steps, self.batch_size = list(tasks), length, inner_steps, batch_size
        self.space, self.vocab, self.rng = space, vocab, random.Random(f"tasks:{seed}")
        # unweighted draws keep rng.choice, so the task order of earlier trainings is reproduced
        self.weights = [real_weight if t.source == "real" else 1.0 for t in self.tasks] if real_weight != 1 else None

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[TaskBatch]:
        rank, world = process_rank()
        n = self.inner_steps + 1
        for _ in range(self.length):
            for r in range(world):
                task = self.rng.choices(self.tasks, self.weights)[0] if self.weights else self.rng.choice(self.tasks)
                samples, demos = (chunks(task.samples, n, self.batch_size, self.rng),
                                  chunks(task.demos, n, self.batch_size, self.rng))
                if r == rank:
                    batches = steps(samples, demos, self.space, self.vocab)
                    yield TaskBatch(task.gpu, batches[:-1], batches[-1])


@dataclasses.dataclass
class AdaptationBatch:
    """One held-out GPU: adapt on `support` (one step per batch), score `query` before and after."""

    gpu: str
    support: list[Step]
    query: Step


def adaptation_batch(held: HeldOut, inner_steps: int, batch_size: int, space: ConfigSpace,
                     vocab: GpuVocab) -> AdaptationBatch:
    support = chunks(held.support, inner_steps, batch_size, random.Random(f"support:{held.gpu}"))
    return AdaptationBatch(held.gpu, steps(support, [[] for _ in support], space, vocab),
                           steps([held.query], [[]], space, vocab)[0])


def _as_is(item: Any) -> Any:
    return item


class MetaDataModule(pl.LightningDataModule):
    def __init__(self, tasks: Sequence[Task], held: Sequence[HeldOut], space: ConfigSpace, vocab: GpuVocab, *,
                 steps_per_epoch: int, inner_steps: int, batch_size: int, seed: int, real_weight: float = 1.0):
        super().__init__()
        self.tasks, self.held = list(tasks), list(held)
        self.stream = TaskStream(tasks, steps_per_epoch, inner_steps, batch_size, space, vocab, seed, real_weight)
        # built once, so every validation adapts on the same batches and scores the same query
        self.adaptation = [adaptation_batch(h, inner_steps, batch_size, space, vocab) for h in held]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.stream, batch_size=None, collate_fn=_as_is)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.adaptation, batch_size=None, collate_fn=_as_is)
