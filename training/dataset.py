"""Database rows as training samples: one per (GPU, problem), with listwise targets.

A sample holds the problem graph, the GPU's spec vector and vocabulary index, the knob
indices of every correctly measured config with its TFLOP/s (re-timings included, through
`Database.tflops`), and the configs that failed (compile error, wrong result, crash,
timeout) as negatives. Listwise target: softmax over the measured configs of
log(TFLOP/s / best) / temperature, so the best config gets the most mass and one at half
speed e^(-ln 2 / T) times less.

The named lists (tutorial, Inductor, seed) are measured on every problem, besides a random
sample of the space: 38% of the rows of the shipped train problems, and the best row of 152 of
280. So that the targets follow the space rather than the collection plan, their rows weigh
`named_weight` (a per-row weight that the listwise target, ranking and regression read), on
suite and random problems alike: `collect` measures the lists on both.

Which problems a caller gets is decided by split name (`graphs.classes.split_of`: a suite
split by family or a random split by hash); `graphs.classes.ROLES` says which splits train,
validate and test.

Imported demonstrations (`training.imported`) become samples of the same shape, kept apart
from the measured ones: `configs` holds the demonstrated configs, `log_tflops` zeros (they
come without timings, so no listwise or cost loss may read them), no failures.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Sequence

import torch
from torch_geometric.data import Batch, Data

import hardware_specs
from graphs import GemmProblem
from graphs.build import problem_graph
from graphs.classes import ALL_SPLITS, split_of
from hardware_specs.features import GpuVocab, spec_vector
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.cost_features import problem_vector
from gnn_policy.space import NAMED_LISTS, ConfigSpace, TileConfig
from training.imported import Demonstration


@dataclasses.dataclass
class Sample:
    problem: GemmProblem
    gpu: str
    graph: Data
    configs: torch.Tensor  # [C, knobs] knob indices of correct configs
    log_tflops: torch.Tensor  # [C]
    failed: torch.Tensor  # [F, knobs] knob indices of failed configs
    weights: torch.Tensor | None = None  # [C] weight of each row in the losses (None: all 1)


NAMED_KEYS = frozenset(c.key for configs in NAMED_LISTS.values() for c in configs)


def _known(splits: Sequence[str] | None) -> Sequence[str] | None:
    """`splits` itself, once every name is a split: a family name here would silently select nothing."""
    unknown = sorted(set(splits or ()) - set(ALL_SPLITS))
    if unknown:
        raise KeyError(f"unknown split {', '.join(unknown)}; known: {', '.join(ALL_SPLITS)}")
    return splits


def load_samples(db: Database, gpus: Sequence[str], space: ConfigSpace,
                 splits: Sequence[str] | None = None, named_weight: float = 1.0) -> list[Sample]:
    """Samples of the given GPUs, restricted to problems of `splits` (split names of
    `graphs.classes.ALL_SPLITS`, e.g. `ROLES["train"]` or `("random-train",)`; None: all)."""
    splits = _known(splits)
    out = []
    for gpu in gpus:
        failed_by_problem = db.failed_configs(gpu)
        spec = hardware_specs.load(gpu)
        for p in db.problems(gpu):
            if splits is None or split_of(p) in splits:
                sample = measured_sample(p, spec, db.tflops(gpu, p.key), failed_by_problem.get(p.key, ()), space,
                                         named_weight)
                out += [sample] if sample else []
    return out


def measured_sample(p: GemmProblem, spec: hardware_specs.GpuSpec, figs: dict[str, float], failed: Sequence[str],
                    space: ConfigSpace, named_weight: float = 1.0) -> Sample | None:
    """One problem's sample from its TFLOP/s by config key and its failed config keys (None:
    nothing usable); rows of the named lists weigh `named_weight`."""
    allowed = space.problem_mask(spec, p)
    keys = [k for k in figs if k != CUBLAS and TileConfig.from_key(k) in space]
    ruled_out = [k for k in keys if not allowed[space.index(TileConfig.from_key(k))]]
    if ruled_out:  # measured correct, yet invalid by today's rules: the policy cannot give them mass
        warnings.warn(f"{spec.name}/{p.key}: {len(ruled_out)} measured configs break the space's rules; left out")
        keys = [k for k in keys if k not in ruled_out]
    if not keys:
        return None
    failed = [k for k in failed if TileConfig.from_key(k) in space]
    return Sample(problem=p, gpu=spec.name, graph=problem_graph(p),
                  configs=torch.tensor([space.index(TileConfig.from_key(k)) for k in keys]),
                  log_tflops=torch.tensor([math.log(figs[k]) for k in keys]),
                  failed=torch.tensor([space.index(TileConfig.from_key(k)) for k in failed],
                                      dtype=torch.long).reshape(-1, len(space.shape)),
                  weights=torch.tensor([named_weight if k in NAMED_KEYS else 1.0 for k in keys]))


def demonstration_samples(demos: Sequence[Demonstration], space: ConfigSpace,
                          splits: Sequence[str] | None = None) -> list[Sample]:
    """One sample per (GPU, problem) of `splits` (as `load_samples`'s; None: all), holding every
    config demonstrated for it."""
    splits = _known(splits)
    groups: dict[tuple[str, str], list[Demonstration]] = {}
    for d in demos:
        if splits is None or split_of(d.problem) in splits:
            groups.setdefault((d.gpu, d.problem.key), []).append(d)
    return [Sample(problem=ds[0].problem, gpu=gpu, graph=problem_graph(ds[0].problem),
                   configs=torch.tensor([space.index(d.config) for d in ds]),
                   log_tflops=torch.zeros(len(ds)),
                   failed=torch.zeros(0, len(space.shape), dtype=torch.long))
            for (gpu, _), ds in groups.items()]


def listwise_target(log_tflops: torch.Tensor, valid: torch.Tensor, temperature: float,
                    weights: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(log(tflops / best) / T + log(weight)) over the valid entries of each row; [B, C]."""
    scores = log_tflops / temperature
    if weights is not None:
        scores = scores + weights.log()
    return torch.softmax(scores.masked_fill(~valid, float("-inf")), -1)


@dataclasses.dataclass
class Collated:
    graphs: Batch
    spec: torch.Tensor  # [B, SPEC_DIM]
    gpu_index: torch.Tensor  # [B]
    masks: torch.Tensor  # [B, *space.shape] valid configs of each problem
    configs: torch.Tensor  # [B, C, knobs] padded with index 0
    log_tflops: torch.Tensor  # [B, C]
    valid: torch.Tensor  # [B, C] False on padding
    failed: torch.Tensor  # [B, F, knobs]
    failed_valid: torch.Tensor  # [B, F]
    dims: torch.Tensor  # [B, PROBLEM_DIM] `problem_vector`: the cost head's roofline and features
    weights: torch.Tensor  # [B, C] each row's weight in the losses (1 on padding)


def collate(samples: Sequence[Sample], space: ConfigSpace, vocab: GpuVocab) -> Collated:
    def pad(rows: list[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = max(1, max(len(r) for r in rows))
        out = torch.zeros(len(rows), n, width, dtype=torch.long)
        ok = torch.zeros(len(rows), n, dtype=torch.bool)
        for i, r in enumerate(rows):
            out[i, :len(r)], ok[i, :len(r)] = r, True
        return out, ok

    knobs = len(space.shape)
    configs, valid = pad([s.configs for s in samples], knobs)
    failed, failed_valid = pad([s.failed for s in samples], knobs)
    log_tflops, weights = torch.zeros(valid.shape), torch.ones(valid.shape)
    for i, s in enumerate(samples):
        log_tflops[i, :len(s.log_tflops)] = s.log_tflops
        if s.weights is not None:
            weights[i, :len(s.weights)] = s.weights
    specs = {s.gpu: hardware_specs.load(s.gpu) for s in samples}
    return Collated(
        graphs=Batch.from_data_list([s.graph for s in samples]),
        spec=torch.stack([spec_vector(specs[s.gpu]) for s in samples]),
        gpu_index=torch.tensor([vocab.index(s.gpu) for s in samples]),
        masks=torch.stack([space.problem_mask(specs[s.gpu], s.problem) for s in samples]),
        configs=configs, log_tflops=log_tflops, valid=valid, failed=failed, failed_valid=failed_valid,
        dims=torch.stack([problem_vector(s.problem, specs[s.gpu]) for s in samples]), weights=weights)
