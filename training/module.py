"""The LightningModule of pretraining: owns the optimiser and logs the objective's parts."""
from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from gnn_policy.model import ModelConfig, PolicyModel
from training.dataset import Collated
from training.objective import LossWeights, objective


class PolicyModule(pl.LightningModule):
    def __init__(self, model_config: ModelConfig, lr: float = 1e-3, temperature: float = 0.1,
                 failure_weight: float = 0.5, cost_weight: float = 1.0, regression_weight: float = 0.1,
                 imitation_weight: float = 0.0, cost_listwise_weight: float = 0.0, ema_decay: float = 0.0):
        super().__init__()
        self.model = PolicyModel(model_config)
        # an exponential moving average of the weights (0: none): validated and shipped in their place
        self.ema = None
        if ema_decay > 0:
            self.ema = AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(ema_decay), use_buffers=True)
            self.ema.requires_grad_(False)  # no gradient: the optimiser and DDP leave it alone
        self.lr = lr
        self.weights = LossWeights(temperature=temperature, failure=failure_weight, cost=cost_weight,
                                   regression=regression_weight, imitation=imitation_weight,
                                   cost_listwise=cost_listwise_weight)

    @property
    def shipped(self) -> PolicyModel:
        """The weights a checkpoint gets: the average where there is one."""
        return self.ema.module if self.ema is not None else self.model

    def _step(self, model: PolicyModel, batch: Collated, stage: str, demos: Collated | None = None) -> torch.Tensor:
        loss, metrics = objective(model, batch, demos, self.weights)
        self.log_dict({f"{stage}/{k}": v for k, v in metrics.items()}, batch_size=batch.valid.shape[0],
                      on_epoch=True, on_step=False, sync_dist=True)  # under DDP: the mean over the ranks
        return loss

    def training_step(self, batch: Collated | dict[str, Collated], _: int) -> torch.Tensor:
        if isinstance(batch, dict):  # the DataModule pairs measured and imported batches when imitating
            return self._step(self.model, batch["measured"], "train", batch["imported"])
        return self._step(self.model, batch, "train")

    def on_train_batch_end(self, *_) -> None:
        if self.ema is not None:
            self.ema.update_parameters(self.model)

    def validation_step(self, batch: Collated, _: int) -> torch.Tensor:
        return self._step(self.shipped, batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=1e-4)
