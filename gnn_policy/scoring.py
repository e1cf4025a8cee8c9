"""Every valid config of a problem scored by a roofline-bounded cost head, in milliseconds.

`Policy.scores` runs the cost head (`ModelConfig.cost_model` 1) on every config valid for a
problem: up to 62,000 of the 90,000 points of the `full` space. The head's first layer is
linear, so its input is split by what each part depends on, and each part is computed where
it varies (the `cost_features.FEATURE_COLUMNS` groups):

- per weights, GPU and dtype (`ConfigTable`, cached by the policy): the rows, i.e. the configs
  valid on the GPU for the dtype with GROUP_M left out (no feature reads it), and each row's
  knob embeddings and `resource_features` through the layer;
- per problem: its encoding and `problem_features` (one vector), `tile_features` of the few
  hundred tile shapes and `access_features` of the two load kinds, gathered to the rows beside
  `occupancy_feature`: a narrow matrix, through the layer in one addmm per chunk of rows;
- per config: GROUP_M's part, the ReLU and the output layer, written
  relu(x + e) . w = max(x, -e) . w + e . w, so a chunk of rows stays in the CPU's cache while
  it serves each GROUP_M value in two passes.

`score_some` computes the same for a few thousand configs, on the rows they fall on alone: how
an ensemble's other members vote on its first member's favourites.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Iterator

import torch
import torch.nn.functional as F

from gnn_policy.cost_features import (CONFIG_FIELDS, FEATURE_COLUMNS, PROBLEM_FIELDS, RESOURCE_FIELDS,
                                      access_features, config_values, occupancy_feature, problem_features,
                                      resource_features, tile_features)
from gnn_policy.model import LOG_ROOF, PolicyModel, bound_dims

# Rows per step: a chunk's activations (2,048 x 128 float32, 1 MB) stay in a core's 2 MB L2,
# where a pass over all rows at once goes to memory and allocates tens of MB anew
ROWS_PER_CHUNK = 2048
_RESOURCES = [PROBLEM_FIELDS.index(f) for f in RESOURCE_FIELDS]
THREADS = "GNN_POLICY_THREADS"


@contextlib.contextmanager
def scoring_threads() -> Iterator[None]:
    """Run the block with $GNN_POLICY_THREADS torch threads (default 1; 0 leaves torch's setting).

    Scoring is a few hundred small operations. Split over two OpenMP threads while other
    processes hold the cores, each one waits for a thread the OS has not scheduled yet: a new
    shape took 940 ms instead of 7 (docs/BENCHMARKS.md, "The bounded cost model"). torch's
    setting is restored afterwards, for the caller's own work."""
    wanted = int(os.environ.get(THREADS) or 1)
    before = torch.get_num_threads()
    if wanted <= 0 or wanted == before:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclasses.dataclass(frozen=True)
class ConfigTable:
    """What a cost head reads of the configs valid on one GPU for one dtype, for its weights."""

    rows: torch.Tensor  # [R, hidden]: each row's knob embeddings and resource features through the first layer
    group_m: torch.Tensor  # [G, hidden]: each GROUP_M value's embedding through the first layer
    flat: torch.Tensor  # [G * R]: the flat grid index of each row with each GROUP_M value, GROUP_M outer
    values: torch.Tensor  # [R, CONFIG_DIM] float32: the rows' `config_values`
    tiles: torch.Tensor  # [T, 4]: the distinct (block_m, block_n, block_k, split_k) of the rows
    tile_of: torch.Tensor  # [R]: each row's tile in `tiles`
    tma_of: torch.Tensor  # [R]: 1 for a row with TMA loads, else 0
    weights: dict[str, torch.Tensor]  # [hidden, n] for each group of `FEATURE_COLUMNS` (empty without features)
    resources: torch.Tensor  # the problem fields `RESOURCE_FIELDS` the rows were built for
    position: torch.Tensor  # [points of the space]: each config's place in `flat`, -1 for one not in the table


def _feature_weights(model: PolicyModel) -> dict[str, torch.Tensor]:
    """The first layer's weights of each group of analytic features."""
    if not model.cfg.cost_features:
        return {}
    start = model.cfg.hidden + len(model.space.shape) * model.cfg.knob_embed
    weight = model.cost_head[0].weight
    return {name: weight[:, [start + c for c in columns]] for name, columns in FEATURE_COLUMNS.items()}


@torch.no_grad()
def config_table(model: PolicyModel, base: torch.Tensor, dims: torch.Tensor) -> ConfigTable:
    """The table of the configs valid in `base` (`ConfigSpace.mask` of a GPU and dtype) for
    `dims`, the `problem_vector` of any problem of that GPU and dtype."""
    names, shape = [n for n, _ in model.space.knobs], model.space.shape
    g = names.index("group_m")
    grid = torch.arange(len(model.space)).reshape(math.prod(shape[:g]), shape[g], -1)
    live = base.reshape(grid.shape).any(1).flatten()  # a row with any valid GROUP_M
    flat = grid.transpose(1, 2).reshape(-1, shape[g])[live].T.contiguous()
    index = torch.stack(torch.unravel_index(flat[0], shape), -1)
    weight, hid, e = model.cost_head[0].weight, model.cfg.hidden, model.cfg.knob_embed
    parts = [emb.weight @ weight[:, hid + j * e:hid + (j + 1) * e].T for j, emb in enumerate(model.knob_embed)]
    rows = sum(part[index[:, j]] for j, part in enumerate(parts) if j != g)
    values, dims, weights = config_values(model.space)[flat[0]].float(), dims.float(), _feature_weights(model)
    if weights:
        rows = rows + resource_features(values, dims) @ weights["resources"].T
    tiles, tile_of = torch.unique(values[:, :4], dim=0, return_inverse=True)
    tma_of = values[:, CONFIG_FIELDS.index("tma")].long()
    flat = flat.flatten()
    position = torch.full((len(model.space),), -1, dtype=torch.long)
    position[flat] = torch.arange(len(flat))
    return ConfigTable(rows.contiguous(), parts[g], flat, values, tiles, tile_of, tma_of, weights,
                       dims[_RESOURCES], position)


def _row_features(table: ConfigTable, dims: torch.Tensor, constant: torch.Tensor,
                  rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """([R, n], [n, hidden]): what each row (of `rows`, None: all) reads of this problem, and the
    first layer's weights of it; the last column is 1, weighted by the problem's share of the
    layer, `constant`."""
    tile_of, tma_of, values = ((table.tile_of, table.tma_of, table.values) if rows is None
                               else (table.tile_of[rows], table.tma_of[rows], table.values[rows]))
    ones = torch.ones(len(tile_of), 1)
    if not table.weights:
        return ones, constant[None]
    features = [tile_features(table.tiles, dims)[tile_of],
                access_features(torch.tensor([0.0, 1.0]), dims)[tma_of],
                occupancy_feature(values, dims)[:, None], ones]
    weights = [table.weights["tile"], table.weights["access"], table.weights["occupancy"], constant[:, None]]
    return torch.cat(features, 1), torch.cat(weights, 1).T


@torch.no_grad()
def score_all(model: PolicyModel, table: ConfigTable, h: torch.Tensor, dims: torch.Tensor,
              mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat grid indices [C], predicted log TFLOP/s [C]) of the configs valid in `mask` (a
    problem's `ConfigSpace.problem_mask`, within the table's); h: the problem's context
    [1, hidden] (`Policy.encode`), dims: its `problem_vector`. Float32, equal to
    `PolicyModel.cost` on each config up to rounding."""
    d = _checked_dims(model, table, dims)
    raw = _raw_scores(model, table, h, d, None)
    valid = mask.flatten()[table.flat]
    return table.flat[valid], d[LOG_ROOF] + F.logsigmoid(raw.flatten()[valid])


@torch.no_grad()
def score_some(model: PolicyModel, table: ConfigTable, h: torch.Tensor, dims: torch.Tensor,
               flat: torch.Tensor) -> torch.Tensor:
    """Predicted log TFLOP/s [C] of the configs at flat grid indices `flat` (each in the table),
    as `score_all` gives them, computing only the table rows they fall on: an ensemble's other
    members rescore 4,096 configs this way in about 2 ms, against 5-6 ms for all of them."""
    d = _checked_dims(model, table, dims)
    at = table.position[flat]
    if bool((at < 0).any()):
        raise ValueError("score_some: a config is not in this ConfigTable (not valid on its GPU for its dtype)")
    group, row = at // len(table.rows), at % len(table.rows)
    rows, inverse = torch.unique(row, return_inverse=True)
    raw = _raw_scores(model, table, h, d, rows)
    return d[LOG_ROOF] + F.logsigmoid(raw[group, inverse])


def _checked_dims(model: PolicyModel, table: ConfigTable, dims: torch.Tensor) -> torch.Tensor:
    d = bound_dims(model.cfg, dims).float()
    if not torch.equal(d[_RESOURCES], table.resources):
        raise ValueError("this ConfigTable was built for another GPU or dtype")
    return d


def _raw_scores(model: PolicyModel, table: ConfigTable, h: torch.Tensor, d: torch.Tensor,
                rows: torch.Tensor | None) -> torch.Tensor:
    """The output layer's input to the sigmoid [GROUP_M values, rows] of the table's `rows` (None: all)."""
    first, _, last = model.cost_head
    hid = model.cfg.hidden
    constant = first.bias + h.reshape(-1) @ first.weight[:, :hid].T  # the problem's share, the same for all rows
    if table.weights:
        constant = constant + problem_features(d) @ table.weights["problem"].T
    features, weights = _row_features(table, d, constant, rows)
    table_rows = table.rows if rows is None else table.rows[rows]
    w_out, floor = last.weight[0], -table.group_m
    raw = torch.empty(len(floor), len(table_rows))
    x, y = torch.empty(ROWS_PER_CHUNK, hid), torch.empty(ROWS_PER_CHUNK, hid)
    for start in range(0, len(table_rows), ROWS_PER_CHUNK):
        part = slice(start, start + ROWS_PER_CHUNK)
        n = len(table_rows[part])
        torch.addmm(table_rows[part], features[part], weights, out=x[:n])
        for g in range(len(floor)):
            torch.mv(torch.maximum(x[:n], floor[g], out=y[:n]), w_out, out=raw[g, part])
    raw += (table.group_m @ w_out + last.bias)[:, None]
    return raw
