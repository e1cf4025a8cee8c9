"""The LightningModule of pretraining: owns the losses, the metrics and the optimiser."""
from __future__ import annotations

import pytorch_lightning as pl
import torch

from gnn_policy.model import ModelConfig, PolicyModel
from training.dataset import Collated, listwise_target
from training.losses import failure_loss, listwise_loss, ranking_loss, regression_loss, top1_fraction


class PolicyModule(pl.LightningModule):
    def __init__(self, model_config: ModelConfig, lr: float = 1e-3, temperature: float = 0.1,
                 failure_weight: float = 0.5, cost_weight: float = 1.0, regression_weight: float = 0.1):
        super().__init__()
        self.model = PolicyModel(model_config)
        self.lr, self.temperature = lr, temperature
        self.failure_weight, self.cost_weight, self.regression_weight = failure_weight, cost_weight, regression_weight

    def _step(self, batch: Collated, stage: str) -> torch.Tensor:
        h = self.model.encode(batch.graphs, batch.spec, batch.gpu_index)
        logp = self.model.log_prob(h, batch.configs, batch.masks)
        target = listwise_target(batch.log_tflops, batch.valid, self.temperature)
        policy = listwise_loss(logp, target, batch.valid)
        failed = failure_loss(self.model.log_prob(h, batch.failed, batch.masks), batch.failed_valid)
        pred = self.model.cost(h, batch.configs)
        rank = ranking_loss(pred, batch.log_tflops, batch.valid)
        reg = regression_loss(pred, batch.log_tflops, batch.valid)
        loss = policy + self.failure_weight * failed + self.cost_weight * (rank + self.regression_weight * reg)
        n = batch.valid.shape[0]
        self.log_dict({f"{stage}/loss": loss, f"{stage}/policy": policy, f"{stage}/failed": failed,
                       f"{stage}/rank": rank, f"{stage}/regression": reg,
                       f"{stage}/top1_measured": top1_fraction(logp, batch.log_tflops, batch.valid),
                       f"{stage}/cost_top1_measured": top1_fraction(pred, batch.log_tflops, batch.valid)},
                      batch_size=n, on_epoch=True, on_step=False)
        return loss

    def training_step(self, batch: Collated, _: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Collated, _: int) -> torch.Tensor:
        return self._step(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=1e-4)
