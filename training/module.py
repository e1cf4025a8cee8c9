"""The LightningModule of pretraining: owns the losses, the metrics and the optimiser."""
from __future__ import annotations

import pytorch_lightning as pl
import torch

from gnn_policy.model import ModelConfig, PolicyModel
from training.dataset import Collated, listwise_target
from training.losses import (failure_loss, imitation_loss, listwise_loss, ranking_loss, regression_loss,
                             top1_fraction)


class PolicyModule(pl.LightningModule):
    def __init__(self, model_config: ModelConfig, lr: float = 1e-3, temperature: float = 0.1,
                 failure_weight: float = 0.5, cost_weight: float = 1.0, regression_weight: float = 0.1,
                 imitation_weight: float = 0.0):
        super().__init__()
        self.model = PolicyModel(model_config)
        self.lr, self.temperature = lr, temperature
        self.failure_weight, self.cost_weight, self.regression_weight = failure_weight, cost_weight, regression_weight
        self.imitation_weight = imitation_weight

    def _step(self, batch: Collated, stage: str, demos: Collated | None = None) -> torch.Tensor:
        h = self.model.encode(batch.graphs, batch.spec, batch.gpu_index)
        logp = self.model.log_prob(h, batch.configs, batch.masks)
        target = listwise_target(batch.log_tflops, batch.valid, self.temperature)
        policy = listwise_loss(logp, target, batch.valid)
        failed = failure_loss(self.model.log_prob(h, batch.failed, batch.masks), batch.failed_valid)
        pred = self.model.cost(h, batch.configs)
        rank = ranking_loss(pred, batch.log_tflops, batch.valid)
        reg = regression_loss(pred, batch.log_tflops, batch.valid)
        loss = policy + self.failure_weight * failed + self.cost_weight * (rank + self.regression_weight * reg)
        metrics = {f"{stage}/policy": policy, f"{stage}/failed": failed, f"{stage}/rank": rank,
                   f"{stage}/regression": reg,
                   f"{stage}/top1_measured": top1_fraction(logp, batch.log_tflops, batch.valid),
                   f"{stage}/cost_top1_measured": top1_fraction(pred, batch.log_tflops, batch.valid)}
        if demos is not None:  # imported configs: only the policy imitates them, the cost head has no timings
            h_demo = self.model.encode(demos.graphs, demos.spec, demos.gpu_index)
            imitation = imitation_loss(self.model.log_prob(h_demo, demos.configs, demos.masks), demos.valid)
            loss = loss + self.imitation_weight * imitation
            metrics[f"{stage}/imitation"] = imitation
        self.log_dict({f"{stage}/loss": loss, **metrics}, batch_size=batch.valid.shape[0],
                      on_epoch=True, on_step=False)
        return loss

    def training_step(self, batch: Collated | dict[str, Collated], _: int) -> torch.Tensor:
        if isinstance(batch, dict):  # the DataModule pairs measured and imported batches when imitating
            return self._step(batch["measured"], "train", batch["imported"])
        return self._step(batch, "train")

    def validation_step(self, batch: Collated, _: int) -> torch.Tensor:
        return self._step(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=1e-4)
