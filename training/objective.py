"""The training objective on one batch: the losses of `training.losses`, weighed.

One definition for every trainer of the policy: pretraining (`training.module`) and the
Reptile inner loop (`training.meta`) differ in how they step, not in what they minimise.
"""
from __future__ import annotations

import dataclasses

import torch

from gnn_policy.model import PolicyModel
from training.dataset import Collated, listwise_target
from training.losses import (failure_loss, imitation_loss, listwise_loss, ranking_loss, regression_loss,
                             top1_fraction)


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """How the losses add up."""

    policy: float = 1.0  # the heads' listwise loss (0: the heads are not evaluated, as in a cost-head calibration)
    temperature: float = 0.1  # listwise target temperature on log(TFLOP/s / best)
    failure: float = 0.5  # -log(1 - p) of failed configs
    cost: float = 1.0  # the cost head's ranking loss ...
    regression: float = 0.1  # ... plus this times its MSE on log TFLOP/s
    cost_listwise: float = 0.0  # ... plus this times the listwise loss of softmax(cost / temperature)
    imitation: float = 0.0  # NLL of imported demonstrations (0: off)


def objective(model: PolicyModel, batch: Collated | None, demos: Collated | None,
              weights: LossWeights) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(weighted loss, its parts by unprefixed name) for a batch with timings (measured or
    simulated), a batch of imported demonstrations, or both; at least one must be given."""
    if batch is None and demos is None:
        raise ValueError("objective needs a batch with timings, demonstrations, or both")
    parts: list[torch.Tensor] = []
    metrics: dict[str, torch.Tensor] = {}
    if batch is not None:
        h = model.encode(batch.graphs, batch.spec, batch.gpu_index)
        target = listwise_target(batch.log_tflops, batch.valid, weights.temperature, batch.weights)
        pred = model.cost(h, batch.configs, batch.dims)
        rank = ranking_loss(pred, batch.log_tflops, batch.valid, batch.weights)
        reg = regression_loss(pred, batch.log_tflops, batch.valid, batch.weights)
        cost_list = listwise_loss(torch.log_softmax((pred / weights.temperature).masked_fill(~batch.valid, -1e9), -1),
                                  target, batch.valid)
        parts.append(weights.cost * (rank + weights.regression * reg + weights.cost_listwise * cost_list))
        metrics.update(rank=rank, regression=reg, cost_listwise=cost_list,
                       cost_top1_measured=top1_fraction(pred, batch.log_tflops, batch.valid))
        if weights.policy > 0:
            logp = model.log_prob(h, batch.configs, batch.masks)
            policy = listwise_loss(logp, target, batch.valid)
            failed = failure_loss(model.log_prob(h, batch.failed, batch.masks), batch.failed_valid)
            parts.append(weights.policy * policy + weights.failure * failed)
            metrics.update(policy=policy, failed=failed, top1_measured=top1_fraction(logp, batch.log_tflops, batch.valid))
    if demos is not None:  # imported configs: only the policy imitates them, the cost head has no timings
        h_demo = model.encode(demos.graphs, demos.spec, demos.gpu_index)
        imitation = imitation_loss(model.log_prob(h_demo, demos.configs, demos.masks), demos.valid)
        parts.append(weights.imitation * imitation)
        metrics["imitation"] = imitation
    loss = sum(parts[1:], parts[0])
    return loss, {"loss": loss, **metrics}
