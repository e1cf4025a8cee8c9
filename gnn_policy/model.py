"""The policy network (a plain `nn.Module`; training lives in `training/`).

- Graph encoder: GINEConv layers with edge features over the problem graph
  (`graphs.build`), mean and max pooled.
- Hardware encoder: an MLP over the spec vector (`hardware_specs.features`) plus a learned
  embedding per known GPU. In training, the embedding is replaced by the 'unknown' one with
  probability `gpu_dropout`, so a GPU never seen still gets an encoding from its numbers.
- Conditioning: FiLM, the hardware encoding scales and shifts the graph encoding.
- Policy: one categorical head per ConfigSpace knob, in the space's knob order, each
  conditioned on the knobs chosen before it (autoregressive). Values that leave no valid
  completion are masked out at every step, so the product of the heads is a distribution
  over valid configs only.
- Cost head: predicted log TFLOP/s of a (problem, GPU, config), from the encoding and the
  knob embeddings. `cost_model` 0 (the first checkpoints): an unbounded MLP, which with
  `geometry` also reads how the config's tiles cover the problem (`tile_geometry`).
  `cost_model` 1: the problem's roofline on this GPU times a learned efficiency
  sigmoid(MLP) in (0, 1), so no prediction exceeds physics; the MLP also reads
  `cost_features.analytic_features` (waves, padding, K steps, access widths, shared memory,
  occupancy, the variant, the epilogue). Its first layer is linear in its inputs, which
  `gnn_policy.scoring` uses to score every valid config of a problem in milliseconds.
  With `floored_bound` the roofline (bound and feature) includes the GPU's launch floor
  (`calibration.roofline_us`); the shipped checkpoints were trained without it.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GINEConv, global_max_pool, global_mean_pool

from graphs.build import EDGE_DIM, NODE_DIM
from hardware_specs.features import SPEC_DIM
from gnn_policy.cost_features import (FEATURE_DIM, GEOMETRY_DIM, PROBLEM_DIM, PROBLEM_FIELDS, analytic_features,
                                      config_values, problem_dims, tile_geometry)
from gnn_policy.space import ConfigSpace, space

__all__ = ["GEOMETRY_DIM", "ModelConfig", "PolicyModel", "problem_dims", "tile_geometry"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of the policy network (stored in every checkpoint)."""

    hidden: int = 128
    layers: int = 3
    knob_embed: int = 16
    gpu_names: tuple[str, ...] = ()  # GPUs with a learned embedding; others use index 0
    gpu_dropout: float = 0.3
    space: str = "full"
    geometry: bool = True  # cost_model 0: the cost head reads `tile_geometry` (checkpoints before it: False)
    cost_model: int = 0  # 0: unbounded cost head (meta-cost0.pt, plain-cost0.pt and older); 1: roofline x efficiency
    cost_features: bool = True  # cost_model 1: read `analytic_features` (False: an ablation)
    encoder: str = "gnn"  # "mlp": the same node features, no message passing (an ablation)
    floored_bound: bool = False  # cost_model 1: bound and roofline feature include the launch floor (`log_bound`)

    def __post_init__(self) -> None:
        if self.cost_model not in (0, 1):
            raise ValueError(f"ModelConfig.cost_model must be 0 or 1, got {self.cost_model!r}")
        if self.encoder not in ("gnn", "mlp"):
            raise ValueError(f"ModelConfig.encoder must be 'gnn' or 'mlp', got {self.encoder!r}")
        if self.floored_bound and self.cost_model != 1:
            raise ValueError("ModelConfig.floored_bound bounds the roofline-bounded cost head: it needs cost_model 1")


TILE_KNOBS = ("block_m", "block_n", "block_k", "split_k")  # the knobs `tile_geometry` reads, in its order
LOG_ROOF = PROBLEM_FIELDS.index("log_roofline")
LOG_BOUND = PROBLEM_FIELDS.index("log_bound")


def bound_dims(cfg: ModelConfig, dims: torch.Tensor) -> torch.Tensor:
    """`problem_vector`s [..., PROBLEM_DIM] as a cost head of `cfg` reads them: with
    `floored_bound`, the roofline with the launch floor in place of the work's alone (the
    bound and the roofline feature both read `log_roofline`); else `dims` itself."""
    if not cfg.floored_bound:
        return dims
    out = dims.clone()
    out[..., LOG_ROOF] = dims[..., LOG_BOUND]
    return out


def weights_version(tensors) -> tuple:
    """A key that changes when any of `tensors` is modified in place (an optimiser step, a load).
    Tensors made under `torch.inference_mode` (a checkpoint loaded there) keep no version
    counter; nothing trains them, so they count as fixed."""
    return tuple((id(t), -1 if t.is_inference() else t._version) for t in tensors)


def _mlp(i: int, h: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o))


def prefix_masks(mask: torch.Tensor) -> list[torch.Tensor]:
    """For valid-config masks [B, n_0, ..., n_{K-1}]: per knob i, [B, n_0 * ... * n_{i-1}, n_i],
    True where some valid config starts with that prefix and value."""
    b, shape = mask.shape[0], mask.shape[1:]
    out = []
    for i in range(len(shape)):
        any_rest = mask.reshape(b, *shape[:i + 1], -1).any(-1)
        out.append(any_rest.reshape(b, -1, shape[i]))
    return out


def masked_log_softmax(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """log_softmax over the allowed values; all -inf where a row allows none (a dead prefix)."""
    dead = ~allowed.any(-1, keepdim=True)
    logp = torch.log_softmax(logits.masked_fill(~allowed | dead, float("-inf")).masked_fill(dead, 0.0), -1)
    return logp.masked_fill(~allowed, float("-inf"))


class PolicyModel(nn.Module):
    def __init__(self, cfg: ModelConfig = ModelConfig()):
        super().__init__()
        self.cfg = cfg
        self.space: ConfigSpace = space(cfg.space)
        h, e = cfg.hidden, cfg.knob_embed
        self.node_in = nn.Linear(NODE_DIM, h)
        if cfg.encoder == "gnn":
            self.convs = nn.ModuleList(GINEConv(_mlp(h, h, h), edge_dim=EDGE_DIM) for _ in range(cfg.layers))
        else:
            self.convs = nn.ModuleList(_mlp(h, h, h) for _ in range(cfg.layers))
        self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in range(cfg.layers))
        self.graph_out = nn.Linear(2 * h, h)
        self.hw = _mlp(SPEC_DIM, h, h)
        self.gpu_embed = nn.Embedding(len(cfg.gpu_names) + 1, h)
        self.film = nn.Linear(2 * h, 2 * h)
        self.knob_embed = nn.ModuleList(nn.Embedding(n, e) for n in self.space.shape)
        self.heads = nn.ModuleList(_mlp(h + i * e, h, n) for i, n in enumerate(self.space.shape))
        self.cost_head = _mlp(h + len(self.space.shape) * e + self._cost_feature_dim(), h, 1)
        names = [n for n, _ in self.space.knobs]
        self._tile_knobs = [names.index(n) for n in TILE_KNOBS] if cfg.geometry else []
        if cfg.geometry and cfg.cost_model == 0:  # value per knob index; not in the state_dict: the space defines them
            for n in TILE_KNOBS:
                self.register_buffer(f"{n}_sizes", torch.tensor(self.space.values[n], dtype=torch.float64),
                                     persistent=False)
        if cfg.cost_model == 1:  # knob values for the analytic features (the space defines them)
            self.register_buffer("point_values", config_values(self.space).float(), persistent=False)

    def _cost_feature_dim(self) -> int:
        if self.cfg.cost_model == 1:
            return FEATURE_DIM if self.cfg.cost_features else 0
        return GEOMETRY_DIM if self.cfg.geometry else 0

    def encode(self, graphs, spec: torch.Tensor, gpu_index: torch.Tensor) -> torch.Tensor:
        """[B, hidden]: a batch of problem graphs (PyG Batch), spec vectors [B, SPEC_DIM] and
        known-GPU indices [B] (0: unknown)."""
        x = self.node_in(graphs.x)
        for conv, norm in zip(self.convs, self.norms):
            y = conv(x, graphs.edge_index, graphs.edge_attr) if self.cfg.encoder == "gnn" else conv(x)
            x = x + torch.relu(norm(y))
        pooled = torch.cat([global_mean_pool(x, graphs.batch), global_max_pool(x, graphs.batch)], -1)
        g = self.graph_out(pooled)
        if self.training and self.cfg.gpu_dropout > 0:
            drop = torch.rand(gpu_index.shape, device=gpu_index.device) < self.cfg.gpu_dropout
            gpu_index = torch.where(drop, torch.zeros_like(gpu_index), gpu_index)
        hw = torch.cat([self.hw(spec), self.gpu_embed(gpu_index)], -1)
        scale, shift = self.film(hw).chunk(2, -1)
        return torch.relu(g * (1 + scale) + shift)

    def _knob_logits(self, h: torch.Tensor, chosen: torch.Tensor, i: int) -> torch.Tensor:
        """Logits of knob i for contexts h [..., H] given the first i knob indices chosen [..., i]."""
        parts = [h] + [self.knob_embed[j](chosen[..., j]) for j in range(i)]
        return self.heads[i](torch.cat(parts, -1))

    def _prefix_flat(self, chosen: torch.Tensor, i: int) -> torch.Tensor:
        flat = torch.zeros(chosen.shape[:-1], dtype=torch.long, device=chosen.device)
        for j in range(i):
            flat = flat * self.space.shape[j] + chosen[..., j]
        return flat

    def log_prob(self, h: torch.Tensor, configs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log p(config) [B, C] for knob indices configs [B, C, knobs] under valid masks [B, ...].

        Invalid configs get -inf.
        """
        b, c, _ = configs.shape
        hc = h[:, None, :].expand(b, c, h.shape[-1])
        total = torch.zeros(b, c, device=h.device)
        for i, allowed in enumerate(prefix_masks(mask)):
            logits = self._knob_logits(hc, configs, i)
            rows = allowed[torch.arange(b, device=h.device)[:, None], self._prefix_flat(configs, i)]
            total = total + masked_log_softmax(logits, rows).gather(-1, configs[..., i:i + 1]).squeeze(-1)
        return total

    def cost(self, h: torch.Tensor, configs: torch.Tensor, dims: torch.Tensor | None = None) -> torch.Tensor:
        """Predicted log TFLOP/s [B, C] for knob indices configs [B, C, knobs]. `dims`: each
        problem's `problem_vector` [B, PROBLEM_DIM] (cost_model 1), or at least its first five
        entries, `problem_dims` (cost_model 0 with the tile geometry)."""
        b, c, _ = configs.shape
        parts = [h[:, None, :].expand(b, c, h.shape[-1])]
        parts += [emb(configs[..., j]) for j, emb in enumerate(self.knob_embed)]
        if self.cfg.cost_model == 1:
            if dims is None or dims.shape != (b, PROBLEM_DIM):
                raise ValueError(f"this model's cost head reads the roofline: pass dims [{b}, {PROBLEM_DIM}] "
                                 "(cost_features.problem_vector of each problem)")
            dims = bound_dims(self.cfg, dims)
            if self.cfg.cost_features:
                values = self.point_values[self._prefix_flat(configs, len(self.space.shape))]
                parts.append(analytic_features(values, dims.to(values)[:, None, :]).to(h.dtype))
            raw = self.cost_head(torch.cat(parts, -1)).squeeze(-1)
            return dims[:, None, LOG_ROOF].to(raw) + F.logsigmoid(raw)
        if self.cfg.geometry:
            if dims is None or dims.shape[0] != b or dims.dim() != 2 or dims.shape[1] < 5:
                raise ValueError(f"this model's cost head reads the tile geometry: pass dims [{b}, 5] "
                                 "(problem_dims of each problem)")
            tiles = torch.stack([getattr(self, f"{n}_sizes")[configs[..., j]]
                                 for n, j in zip(TILE_KNOBS, self._tile_knobs)], -1)
            parts.append(tile_geometry(tiles, dims[:, :5].to(tiles)[:, None, :]).to(h.dtype))
        return self.cost_head(torch.cat(parts, -1)).squeeze(-1)

    @torch.no_grad()
    def beam_search(self, h: torch.Tensor, mask: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most probable valid configs per problem, by beam search over the knobs.

        Returns knob indices [B, k, knobs] and their log-probabilities [B, k], best first.
        Fewer than k valid configs leave -inf entries at the end.
        """
        b = h.shape[0]
        allowed = prefix_masks(mask)
        beams = torch.zeros(b, 1, 0, dtype=torch.long, device=h.device)
        scores = torch.zeros(b, 1, device=h.device)
        for i, n in enumerate(self.space.shape):
            w = beams.shape[1]
            logits = self._knob_logits(h[:, None, :].expand(b, w, h.shape[-1]), beams, i)
            rows = allowed[i][torch.arange(b, device=h.device)[:, None], self._prefix_flat(beams, i)]
            cand = (scores[..., None] + masked_log_softmax(logits, rows)).reshape(b, w * n)
            scores, flat = cand.topk(min(k, w * n), dim=-1)
            parent, value = flat // n, flat % n
            beams = torch.cat([beams.gather(1, parent[..., None].expand(-1, -1, i)), value[..., None]], -1)
        return beams, scores
