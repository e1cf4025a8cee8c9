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
- Cost head: predicted log TFLOP/s of a (problem, GPU, config). With `geometry`, it also
  reads how the config's tiles cover the problem on this GPU (`tile_geometry`): wave
  quantisation and tile padding are ratios of integers that an MLP over log-scaled dims and
  knob embeddings can only approximate, and they decide the ranking of near-equal configs.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch_geometric.nn import GINEConv, global_max_pool, global_mean_pool

from graphs import GemmProblem
from graphs.build import EDGE_DIM, NODE_DIM
from hardware_specs import GpuSpec
from hardware_specs.features import SPEC_DIM
from gnn_policy.space import ConfigSpace, space


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of the policy network (stored in every checkpoint)."""

    hidden: int = 128
    layers: int = 3
    knob_embed: int = 16
    gpu_names: tuple[str, ...] = ()  # GPUs with a learned embedding; others use index 0
    gpu_dropout: float = 0.3
    space: str = "full"
    geometry: bool = True  # the cost head reads `tile_geometry` (checkpoints before it: False)


GEOMETRY_DIM = 7
TILE_KNOBS = ("block_m", "block_n", "block_k", "split_k")  # the knobs `tile_geometry` reads, in its order


def problem_dims(problem: GemmProblem, gpu: GpuSpec) -> torch.Tensor:
    """[5]: batch, M, N, K and the GPU's SM count, what `tile_geometry` needs of a (problem, GPU)."""
    return torch.tensor([problem.batch, problem.m, problem.n, problem.k, gpu.sm_count], dtype=torch.float64)


def tile_geometry(tiles: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
    """[..., GEOMETRY_DIM] for tile sizes [..., 4] (block_m, block_n, block_k, split_k) and
    `problem_dims` [..., 5] broadcast against them:
    log2 of tiles per SM, the wave efficiency tiles / (waves x SMs), M and N coverage by the
    tiles (padding waste), log2 of K iterations per tile, the coverage of K by them, and
    log2 of split_k. A tile is one program of the launch grid; several may share an SM.
    """
    bm, bn, bk, sk = tiles.unbind(-1)
    batch, m, n, k, sms = dims.unbind(-1)
    count = batch * torch.ceil(m / bm) * torch.ceil(n / bn) * sk
    waves = torch.ceil(count / sms)
    k_per_split = torch.ceil(k / sk)
    k_iters = torch.ceil(k_per_split / bk)
    feats = [torch.log2(count / sms), count / (waves * sms), m / (torch.ceil(m / bm) * bm),
             n / (torch.ceil(n / bn) * bn), torch.log2(k_iters), k_per_split / (k_iters * bk), torch.log2(sk)]
    return torch.stack(feats, -1)


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
        self.convs = nn.ModuleList(GINEConv(_mlp(h, h, h), edge_dim=EDGE_DIM) for _ in range(cfg.layers))
        self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in range(cfg.layers))
        self.graph_out = nn.Linear(2 * h, h)
        self.hw = _mlp(SPEC_DIM, h, h)
        self.gpu_embed = nn.Embedding(len(cfg.gpu_names) + 1, h)
        self.film = nn.Linear(2 * h, 2 * h)
        self.knob_embed = nn.ModuleList(nn.Embedding(n, e) for n in self.space.shape)
        self.heads = nn.ModuleList(_mlp(h + i * e, h, n) for i, n in enumerate(self.space.shape))
        geometry = GEOMETRY_DIM if cfg.geometry else 0
        self.cost_head = _mlp(h + len(self.space.shape) * e + geometry, h, 1)
        names = [n for n, _ in self.space.knobs]
        self._tile_knobs = [names.index(n) for n in TILE_KNOBS] if cfg.geometry else []
        if cfg.geometry:  # value per knob index; not in the state_dict: the space defines them
            for n in TILE_KNOBS:
                self.register_buffer(f"{n}_sizes", torch.tensor(self.space.values[n], dtype=torch.float64),
                                     persistent=False)

    def encode(self, graphs, spec: torch.Tensor, gpu_index: torch.Tensor) -> torch.Tensor:
        """[B, hidden]: a batch of problem graphs (PyG Batch), spec vectors [B, SPEC_DIM] and
        known-GPU indices [B] (0: unknown)."""
        x = self.node_in(graphs.x)
        for conv, norm in zip(self.convs, self.norms):
            x = x + torch.relu(norm(conv(x, graphs.edge_index, graphs.edge_attr)))
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
        """Predicted log TFLOP/s [B, C] for knob indices configs [B, C, knobs]; `dims` [B, 5]
        (`problem_dims`) is required when the model reads the tile geometry."""
        b, c, _ = configs.shape
        parts = [h[:, None, :].expand(b, c, h.shape[-1])]
        parts += [emb(configs[..., j]) for j, emb in enumerate(self.knob_embed)]
        if self.cfg.geometry:
            if dims is None or dims.shape != (b, 5):
                raise ValueError(f"this model's cost head reads the tile geometry: pass dims [{b}, 5] "
                                 "(problem_dims of each problem)")
            tiles = torch.stack([getattr(self, f"{n}_sizes")[configs[..., j]]
                                 for n, j in zip(TILE_KNOBS, self._tile_knobs)], -1)
            parts.append(tile_geometry(tiles, dims.to(tiles)[:, None, :]).to(h.dtype))
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
