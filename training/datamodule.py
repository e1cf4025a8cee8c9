"""The DataModule: samples from the measurement database, split by `graphs.classes.ROLES`.

`samples["train"]` holds the problems of the train families and of random-train, `"val"` those
of the val families and random-val, `"test"` those of the test families and random-test: only
the first two are ever loaded into batches, so neither test split weighs on training, early
stopping or the choice of a checkpoint. A problem's split is `graphs.classes.split_of`'s.

With imported demonstrations, training batches are dicts {"measured": ..., "imported": ...}
(Lightning's CombinedLoader, mode max_size_cycle: an epoch is a pass over the longer of the two,
the shorter one cycles). Demonstrations of validation or test problems are left out, like
their measurements.

Three changes of the training set, recorded in the card: `train_share` keeps a stable share of the
training problems (by a hash of the problem key: a learning curve over the same problems at every
seed), `train_config_share` keeps a stable share of each training problem's measured configs (by a
hash of problem and config: at the same share, half the configs of every problem against every
config of half the problems says whether a collection should measure fewer configs on more
problems), and `train_on_val` adds the validation problems to the training ones,
for the final retrain of a recipe already chosen on val (its val figures are then training
figures, not a selection).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from graphs.classes import ROLES
from graphs.suite import SPLITS as FAMILY_SPLITS
from hardware_specs.features import GpuVocab
from gnn_policy.database import Database
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import ConfigSpace
from training.dataset import Sample, collate, demonstration_samples, load_samples
from training.imported import Demonstration


def share_key(key: str) -> float:
    """A problem key's stable place in [0, 1): the same problems fall below a share at every seed and run."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2 ** 64


def thin_configs(sample: Sample, share: float) -> Sample:
    """`sample` with a share of its measured configs (at least one), the same ones at every seed (a
    hash of problem and config), and its failed configs thinned alike: a collection measuring fewer
    configs would have met fewer failures."""
    n = len(sample.configs)
    keep = max(1, round(n * share))

    def order(rows: torch.Tensor) -> list[int]:
        keys = [share_key(f"{sample.problem.key}/{'_'.join(map(str, r.tolist()))}") for r in rows]
        return sorted(range(len(rows)), key=keys.__getitem__)

    kept = torch.tensor(sorted(order(sample.configs)[:keep]))
    failed = torch.tensor(sorted(order(sample.failed)[:round(len(sample.failed) * share)]), dtype=torch.long)
    return dataclasses.replace(sample, configs=sample.configs[kept], log_tflops=sample.log_tflops[kept],
                               failed=sample.failed[failed].reshape(-1, sample.failed.shape[1]),
                               weights=None if sample.weights is None else sample.weights[kept])


class MeasurementDataModule(pl.LightningDataModule):
    def __init__(self, db: str, gpus: Sequence[str], space: ConfigSpace, vocab: GpuVocab,
                 batch_size: int = 8, load_snapshot: bool = True, demos: Sequence[Demonstration] = (),
                 named_weight: float = 1.0, train_share: float = 1.0, train_on_val: bool = False,
                 train_config_share: float = 1.0):
        super().__init__()
        for name, share in (("train_share", train_share), ("train_config_share", train_config_share)):
            if not 0 < share <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {share}")
        self.train_share, self.train_on_val, self.train_config_share = train_share, train_on_val, train_config_share
        self.named_weight = named_weight  # rows of the named lists weigh this much (training.dataset)
        self.db, self.gpus, self.space, self.vocab = db, tuple(gpus), space, vocab
        self.batch_size, self.load_snapshot, self.demos = batch_size, load_snapshot, tuple(demos)
        self.samples: dict[str, list[Sample]] = {}
        self.imported: list[Sample] = []

    def prepare_data(self) -> None:
        # Lightning runs this in one process per machine before any `setup`: the shards are
        # loaded by one writer, and the ranks' setups then only read
        if self.load_snapshot:
            with Database(self.db) as db:
                load_shipped(db)

    def setup(self, stage: str | None = None) -> None:
        if self.samples:
            return
        with Database(self.db) as db:
            if self.load_snapshot:
                load_shipped(db)
            for role, splits in ROLES.items():
                self.samples[role] = load_samples(db, self.gpus, self.space, splits, self.named_weight)
        if self.train_share < 1:
            self.samples["train"] = [x for x in self.samples["train"] if share_key(x.problem.key) < self.train_share]
        if self.train_config_share < 1:
            self.samples["train"] = [thin_configs(x, self.train_config_share) for x in self.samples["train"]]
        if self.train_on_val:
            self.samples["train"] = self.samples["train"] + self.samples["val"]
        if not self.samples["train"]:
            raise ValueError(f"{self.db}: no training problems measured on {', '.join(self.gpus)}: none of the "
                             f"train families ({', '.join(FAMILY_SPLITS['train'])}) and none of random-train "
                             "(graphs/random_gemms.py)")
        self.imported = demonstration_samples(self.demos, self.space, ROLES["train"])
        if self.demos and not self.imported:  # demonstrations are of suite shapes: random ones have none
            raise ValueError(f"none of the {len(self.demos)} imported demonstrations is of a train family "
                             f"({', '.join(FAMILY_SPLITS['train'])})")

    def _loader(self, samples: list[Sample], shuffle: bool) -> DataLoader:
        return DataLoader(samples, batch_size=self.batch_size, shuffle=shuffle,
                          collate_fn=functools.partial(collate, space=self.space, vocab=self.vocab))

    def train_dataloader(self) -> DataLoader | dict[str, DataLoader]:
        measured = self._loader(self.samples["train"], True)
        if not self.imported:
            return measured
        return {"measured": measured, "imported": self._loader(self.imported, True)}

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.samples["val"], False)
