"""A trained policy at inference: load a checkpoint, rank configs for a problem and a GPU.

`Policy.load()` reads `checkpoints/pretrained.pt` (or another checkpoint) with
`torch.load(weights_only=True)`. `top_k` returns the k most probable valid configs (beam
search) with their probabilities and the cost head's predicted TFLOP/s; `rank` orders
configs someone else proposes, which is what `autotune_pruner` does for `triton.autotune`.
"""
from __future__ import annotations

import dataclasses
import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch_geometric.data import Batch

from graphs import GemmProblem
from graphs.build import problem_graph
from hardware_specs import GpuSpec
from hardware_specs.features import GpuVocab, spec_vector
from gnn_policy.checkpoint import CheckpointError, model_fields, read_checkpoint, weights_fault
from gnn_policy.model import ModelConfig, PolicyModel, problem_dims
from gnn_policy.space import TileConfig

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "pretrained.pt"


def save_checkpoint(model: PolicyModel, path: str | Path) -> None:
    """Write `model` in the format `Policy.load` reads (ModelConfig + state_dict, safe for
    `torch.load(weights_only=True)`); written then renamed, so a kill leaves no half file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, tmp)
    os.replace(tmp, path)


RERANK = 16  # the first pick comes from this many most probable configs ...
COST_WEIGHT = 10.0  # ... scored by log probability + COST_WEIGHT x predicted log TFLOP/s


def first_pick(log_probs: Sequence[float], log_tflops: Sequence[float], rerank: int = RERANK,
               cost_weight: float = COST_WEIGHT) -> int:
    """Index of the first pick among candidates listed most probable first: the best of the
    first `rerank` by log probability + `cost_weight` x predicted log TFLOP/s."""
    return max(range(min(rerank, len(log_probs))), key=lambda i: log_probs[i] + cost_weight * log_tflops[i])


@dataclasses.dataclass(frozen=True)
class Pick:
    config: TileConfig
    probability: float
    predicted_tflops: float


class Policy:
    def __init__(self, model: PolicyModel):
        self.model = model.eval()
        self.vocab = GpuVocab(model.cfg.gpu_names)

    @classmethod
    def load(cls, path: str | Path = DEFAULT_CHECKPOINT) -> Policy:
        """The policy a checkpoint holds; FileNotFoundError if there is none, CheckpointError
        (naming the file and the fault) for a file that is not a usable checkpoint."""
        state = read_checkpoint(path)
        try:
            model = PolicyModel(ModelConfig(**model_fields(path, state)))
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{path}: its model_config does not make a policy ({exc})") from None
        try:
            model.load_state_dict(state["state_dict"])
        except RuntimeError as exc:
            raise CheckpointError(f"{path}: its weights do not fit its model_config ({weights_fault(exc)})") from None
        return cls(model)

    def features(self, problem: GemmProblem, gpu: GpuSpec) -> tuple[Batch, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The model's inputs for one problem on one GPU: graph batch, spec vector, GPU index, valid mask."""
        return (Batch.from_data_list([problem_graph(problem)]), spec_vector(gpu)[None],
                torch.tensor([self.vocab.index(gpu.name)]), self.model.space.problem_mask(gpu, problem)[None])

    def encode(self, problem: GemmProblem, gpu: GpuSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """(context [1, hidden], valid mask [1, ...]); differentiable, for adaptation."""
        graph, spec, index, mask = self.features(problem, gpu)
        return self.model.encode(graph, spec, index), mask

    def cost(self, h: torch.Tensor, problem: GemmProblem, gpu: GpuSpec, configs: torch.Tensor) -> torch.Tensor:
        """Predicted log TFLOP/s [1, C] of knob indices configs [1, C, knobs] for context h of `encode`."""
        return self.model.cost(h, configs, problem_dims(problem, gpu)[None])

    @torch.no_grad()
    def _encode(self, problem: GemmProblem, gpu: GpuSpec) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode(problem, gpu)

    @torch.no_grad()
    def top_k(self, problem: GemmProblem, gpu: GpuSpec, k: int = 8) -> list[Pick]:
        """The k configs to try, best first (fewer if fewer are valid): of the `RERANK` most
        probable valid configs, the one with the best log probability + `COST_WEIGHT` x
        predicted log TFLOP/s, then the others by probability.

        The policy head fits the train families almost exactly; the cost head, which also reads
        the tile geometry, ranks unseen families better: the rule raised val top-1 among measured
        configs from 0.904 to 0.944 for the shipped checkpoint, at the same best of 8
        (docs/BENCHMARKS.md). With a weight of 10, a 5% faster prediction outweighs half a nat
        of probability.
        """
        h, mask = self._encode(problem, gpu)
        beams, logp = self.model.beam_search(h, mask, max(k, RERANK))
        tflops = self.cost(h, problem, gpu, beams)[0].exp()
        picks = [Pick(self.model.space.at(tuple(b)), math.exp(lp), tf)
                 for b, lp, tf in zip(beams[0].tolist(), logp[0].tolist(), tflops.tolist()) if lp > float("-inf")]
        if picks:
            first = first_pick([math.log(p.probability) for p in picks], [math.log(p.predicted_tflops) for p in picks])
            picks.insert(0, picks.pop(first))
        return picks[:k]

    @torch.no_grad()
    def rank(self, problem: GemmProblem, gpu: GpuSpec, configs: Sequence[TileConfig]) -> list[tuple[TileConfig, float]]:
        """`configs` of the policy's space with their probabilities, most probable first."""
        inside = [c for c in configs if c in self.model.space]
        if not inside:
            return []
        h, mask = self._encode(problem, gpu)
        idx = torch.tensor([self.model.space.index(c) for c in inside])[None]
        probs = self.model.log_prob(h, idx, mask)[0].exp().tolist()
        return sorted(zip(inside, probs), key=lambda x: -x[1])


def autotune_pruner(policy: Policy, k: int, gpu: GpuSpec, problem_of: Callable[[dict], GemmProblem],
                    names: dict[str, str] | None = None) -> dict[str, Any]:
    """`prune_configs_by` for `triton.autotune`: benchmark only the policy's k favourite configs.

    `problem_of(named_args)` builds the GemmProblem of a launch from the kernel's arguments.
    The configs' meta-parameters are read in any common spelling (this template's `BLOCK_M`,
    the tutorial's and vLLM's `BLOCK_SIZE_M`, `BM`; see `gnn_policy.config_names`), or through
    `names`, a mapping from our knobs to the kernel's, e.g. {"block_m": "TILE_M", ...}.
    Configs outside the policy's space are kept only to fill the k slots. A config it cannot
    read is warned about once, naming the keys it saw; unread configs come after the policy's
    picks, and when none can be read every config is kept (a full autotune, not a guess).

        @triton.autotune(configs=[...], key=["M", "N", "K"],
                         prune_configs_by=autotune_pruner(policy, 4, gpu, lambda a: GemmProblem(a["M"], a["N"], a["K"])))
    """
    from gnn_policy import config_names

    names = config_names.check_names(names) if names else None
    warned: list[bool] = []

    def prune(configs: list, named_args: dict, **kwargs: Any) -> list:
        problem = problem_of({**named_args, **kwargs})  # triton passes keyword arguments apart
        tiles, unread = {}, []
        for c in configs:
            tile = config_names.read(c, names)
            if tile is None:
                unread.append(c)
            else:
                tiles.setdefault(tile, c)
        if unread and not warned:
            warned.append(True)
            warnings.warn(f"autotune_pruner cannot read {len(unread)} of {len(configs)} configs (keys seen: "
                          f"{', '.join(config_names.keys_seen(unread))}); it reads BLOCK_M / BLOCK_SIZE_M / BM-style "
                          "names, or pass names={'block_m': ..., 'block_n': ..., 'block_k': ...}; "
                          + ("every config is autotuned" if not tiles else "they are tried after the policy's picks"),
                          stacklevel=2)
        if not tiles:
            return list(configs)
        ranked = policy.rank(problem, gpu, list(tiles))
        allowed = [tiles[t] for t, p in ranked if p > 0]
        ruled_out = [tiles[t] for t, p in ranked if p == 0]  # invalid for this problem: last resort
        rest = [c for c in configs if c not in allowed and c not in ruled_out]
        return (allowed + rest + ruled_out)[:k]

    return {"early_config_prune": prune}
