"""Meta-pretraining by Reptile (Nichol, Achiam and Schulman, 2018) over GPU tasks.

Each meta-step takes one task (a GPU, `training.tasks`): the meta weights θ are copied, k
inner steps of Adam on the task's batches give θ', and the meta weights move towards them,
θ ← θ + ε (θ' − θ). ε anneals linearly from `epsilon` to `epsilon_end` over the run. The
inner loop is the adaptation we deploy (`gnn-policy finetune`): Adam at its learning rate,
3e-4, started afresh for every task (one GPU's gradient moments say nothing of the next).
At 1e-3, five steps from well-trained meta weights moved every weight by about the step
size whatever its gradient (a fresh Adam's first steps are sign steps) and made the
held-out GPU's loss worse; at 3e-4 they improved it.

Why Reptile rather than first-order MAML. Both drop MAML's second-order terms, which
would differentiate through the inner steps of the whole GNN. First-order MAML needs a
support/query split inside every task and a second, outer optimiser fed the query gradient
at θ'. Reptile's outer step is the displacement itself: one optimiser, the inner Adam,
stepped through Lightning's manual optimisation, and every problem of a task feeds the
inner steps. Its update also carries a joint-training term, which is welcome here: the
tasks share most of what is learned (the GEMM's structure), and the GPUs differ in a few
numbers.

Validation measures what meta-learning is for. For each held-out GPU, a copy of the meta
weights takes the same k inner steps on its support batches (train-family problems), and
its val-family query is scored before and after: `val/loss_before`, `val/loss_after`,
`val/top1_before`, `val/top1_after` and the gains `val/adaptation_gain` (loss before minus
after) and `val/top1_gain`.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Callable, Iterable, Sequence

import pytorch_lightning as pl
import torch

from gnn_policy.model import ModelConfig, PolicyModel
from training.ddp import average_weights
from training.meta_data import AdaptationBatch, Step, TaskBatch
from training.objective import LossWeights, objective


@dataclasses.dataclass(frozen=True)
class ReptileConfig:
    """Reptile's hyperparameters (stored in the card)."""

    inner_steps: int = 5  # k: Adam steps on one task's batches per meta-step (and in validation)
    inner_lr: float = 3e-4  # as `gnn-policy finetune`'s
    epsilon: float = 1.0  # outer step size at the first meta-step ...
    epsilon_end: float = 0.1  # ... annealed linearly to this at the last
    meta_steps: int = 1000  # the length of the ε schedule
    fresh_inner: bool = True  # False, with ε = 1: plain multi-task training, one Adam throughout


def inner_optimizer(params: Iterable[torch.nn.Parameter], cfg: ReptileConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=cfg.inner_lr)


def inner_steps(model: PolicyModel, batches: Sequence[Step], optimizer, backward: Callable[[torch.Tensor], None],
                weights: LossWeights) -> list[torch.Tensor]:
    """One optimiser step per batch on the objective; returns each step's loss, taken before its update.

    `optimizer` is a torch optimiser or Lightning's wrapper of one; `backward` is
    `torch.Tensor.backward` or the LightningModule's `manual_backward`.
    """
    losses = []
    for b in batches:
        optimizer.zero_grad()
        loss, _ = objective(model, b.measured, b.demos, weights)
        backward(loss)
        optimizer.step()
        losses.append(loss.detach())
    return losses


@torch.no_grad()
def reptile_update(params: Sequence[torch.Tensor], meta: Sequence[torch.Tensor], epsilon: float) -> None:
    """In place on the adapted `params`: θ_meta + ε (θ_adapted − θ_meta)."""
    for p, m in zip(params, meta):
        p.copy_(m + epsilon * (p - m))


@torch.no_grad()
def score(model: PolicyModel, batch: Step, weights: LossWeights) -> dict[str, torch.Tensor]:
    return objective(model, batch.measured, batch.demos, weights)[1]


class ReptileModule(pl.LightningModule):
    def __init__(self, model_config: ModelConfig, reptile: ReptileConfig = ReptileConfig(),
                 weights: LossWeights = LossWeights()):
        super().__init__()
        self.automatic_optimization = False  # the inner steps and the outer interpolation are ours
        self.model = PolicyModel(model_config)
        self.reptile, self.weights = reptile, weights

    def epsilon(self) -> float:
        """ε of the current meta-step (each meta-step takes `inner_steps` optimiser steps)."""
        done = self.trainer.global_step // self.reptile.inner_steps
        frac = min(1.0, done / max(1, self.reptile.meta_steps - 1))
        return self.reptile.epsilon + (self.reptile.epsilon_end - self.reptile.epsilon) * frac

    def training_step(self, task: TaskBatch, _: int) -> None:
        epsilon = self.epsilon()
        params = list(self.model.parameters())
        meta = [p.detach().clone() for p in params]
        optimizer = self.optimizers()
        if self.reptile.fresh_inner:
            optimizer.optimizer.state.clear()  # a fresh Adam for every task
        losses = inner_steps(self.model, task.inner, optimizer, self.manual_backward, self.weights)
        after = score(self.model, task.query, self.weights)
        average_weights(params)  # under DDP: towards the mean of the ranks' adapted weights
        reptile_update(params, meta, epsilon)
        self.log_dict({"train/meta_loss": after["loss"], "train/inner_loss_first": losses[0],
                       "train/inner_loss_last": losses[-1], "train/epsilon": epsilon},
                      batch_size=1, on_step=False, on_epoch=True, sync_dist=True)

    def validation_step(self, task: AdaptationBatch, _: int) -> None:
        before = score(self.model, task.query, self.weights)
        adapted = copy.deepcopy(self.model)
        with torch.enable_grad():  # Lightning validates under no_grad; the Trainer runs with inference_mode off
            inner_steps(adapted, task.support, inner_optimizer(adapted.parameters(), self.reptile),
                        torch.Tensor.backward, self.weights)
        after = score(adapted, task.query, self.weights)
        self.log_dict({"val/loss_before": before["loss"], "val/loss_after": after["loss"],
                       "val/top1_before": before["top1_measured"], "val/top1_after": after["top1_measured"],
                       "val/adaptation_gain": before["loss"] - after["loss"],
                       "val/top1_gain": after["top1_measured"] - before["top1_measured"]},
                      batch_size=1, on_step=False, on_epoch=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return inner_optimizer(self.model.parameters(), self.reptile)
