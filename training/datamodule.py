"""The DataModule: samples from the measurement database, split by model family (graphs.suite)."""
from __future__ import annotations

import functools
from typing import Sequence

import pytorch_lightning as pl
from torch.utils.data import DataLoader

from graphs.suite import SPLITS
from hardware_specs.features import GpuVocab
from gnn_policy.database import Database
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import ConfigSpace
from training.dataset import collate, load_samples


class MeasurementDataModule(pl.LightningDataModule):
    def __init__(self, db: str, gpus: Sequence[str], space: ConfigSpace, vocab: GpuVocab,
                 batch_size: int = 8, load_snapshot: bool = True):
        super().__init__()
        self.db, self.gpus, self.space, self.vocab = db, tuple(gpus), space, vocab
        self.batch_size, self.load_snapshot = batch_size, load_snapshot
        self.samples: dict[str, list] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.samples:
            return
        with Database(self.db) as db:
            if self.load_snapshot:
                load_shipped(db)
            for name, families in SPLITS.items():
                self.samples[name] = load_samples(db, self.gpus, self.space, families)
        if not self.samples["train"]:
            raise ValueError(f"{self.db}: no training problems measured on {', '.join(self.gpus)} "
                             f"(train families: {', '.join(SPLITS['train'])})")

    def _loader(self, name: str, shuffle: bool) -> DataLoader:
        return DataLoader(self.samples[name], batch_size=self.batch_size, shuffle=shuffle,
                          collate_fn=functools.partial(collate, space=self.space, vocab=self.vocab))

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False)
