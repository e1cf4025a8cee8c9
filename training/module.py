"""The LightningModule of pretraining: owns the optimiser and logs the objective's parts."""
from __future__ import annotations

import pytorch_lightning as pl
import torch

from gnn_policy.model import ModelConfig, PolicyModel
from training.dataset import Collated
from training.objective import LossWeights, objective


class PolicyModule(pl.LightningModule):
    def __init__(self, model_config: ModelConfig, lr: float = 1e-3, temperature: float = 0.1,
                 failure_weight: float = 0.5, cost_weight: float = 1.0, regression_weight: float = 0.1,
                 imitation_weight: float = 0.0, cost_listwise_weight: float = 0.0):
        super().__init__()
        self.model = PolicyModel(model_config)
        self.lr = lr
        self.weights = LossWeights(temperature=temperature, failure=failure_weight, cost=cost_weight,
                                   regression=regression_weight, imitation=imitation_weight,
                                   cost_listwise=cost_listwise_weight)

    def _step(self, batch: Collated, stage: str, demos: Collated | None = None) -> torch.Tensor:
        loss, metrics = objective(self.model, batch, demos, self.weights)
        self.log_dict({f"{stage}/{k}": v for k, v in metrics.items()}, batch_size=batch.valid.shape[0],
                      on_epoch=True, on_step=False, sync_dist=True)  # under DDP: the mean over the ranks
        return loss

    def training_step(self, batch: Collated | dict[str, Collated], _: int) -> torch.Tensor:
        if isinstance(batch, dict):  # the DataModule pairs measured and imported batches when imitating
            return self._step(batch["measured"], "train", batch["imported"])
        return self._step(batch, "train")

    def validation_step(self, batch: Collated, _: int) -> torch.Tensor:
        return self._step(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=1e-4)
