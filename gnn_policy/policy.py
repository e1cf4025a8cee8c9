"""A trained policy at inference: load a checkpoint, rank configs for a problem and a GPU.

`Policy.load()` reads `checkpoints/pretrained.pt` (or another checkpoint) with
`torch.load(weights_only=True)`. `top_k` returns the configs to try, best first, with their
probabilities and the cost head's predicted TFLOP/s; `rank` orders configs someone else
proposes, which is what `autotune_pruner` does for `triton.autotune`.

A roofline-bounded cost model (`ModelConfig.cost_model` 1) scores every valid config of the
problem (`gnn_policy.scoring`): the first pick is the best predicted, the next ones the
best of each (variant, SPLIT_K, tile shape) group not yet picked (`diverse_order`), and the
policy's distribution is softmax(predicted log TFLOP/s / TEMPERATURE) over the valid configs.
An ensemble checkpoint (`gnn-policy ensemble`: seeds of one recipe) scores the same way with
its first member, then the others rescore that member's `VOTE` best and their mean decides.
The scores of the last problems are kept (`CACHED` of them), so a shape asked again costs a
lookup; so are the config tables of the last (GPU, dtype) pairs (`TABLES`). The first checkpoints (cost_model 0) keep their rule: a beam over the autoregressive
heads, reranked by the cost head.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch_geometric.data import Batch

from graphs import GemmProblem
from graphs.build import problem_graph
from hardware_specs import GpuSpec
from hardware_specs.features import GpuVocab, spec_vector
from gnn_policy.atomic import replacing
from gnn_policy.checkpoint import CheckpointError, model_fields, read_checkpoint, weights_fault
from gnn_policy.cost_features import problem_vector
from gnn_policy.model import LOG_ROOF, ModelConfig, PolicyModel, bound_dims, weights_version
from gnn_policy.scoring import ConfigTable, config_table, score_all, score_some, scoring_threads
from gnn_policy.space import TileConfig

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "pretrained.pt"
Measured = dict[str, dict[str, tuple[str, float]]]  # gpu name -> problem key -> (config key, TFLOP/s)


def save_checkpoint(model: PolicyModel, path: str | Path, members: Sequence[PolicyModel] = (),
                    measured: Measured | None = None) -> None:
    """Write `model` (and an ensemble's other `members`, of the same ModelConfig, and the winners
    a fine-tune `measured`) in the format `Policy.load` reads (ModelConfig + state_dict [+ members'
    state_dicts] [+ measured], safe for `torch.load(weights_only=True)`); written then renamed, so
    a kill leaves no half file."""
    state = {"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}
    if members:
        state["members"] = [m.state_dict() for m in members]
    kept = {gpu: {key: [config, tflops] for key, (config, tflops) in wins.items()}
            for gpu, wins in (measured or {}).items() if wins}
    if kept:
        state["measured"] = kept
    with replacing(path) as tmp:
        torch.save(state, tmp)


RERANK = 16  # the first pick comes from this many most probable configs ...
COST_WEIGHT = 10.0  # ... scored by log probability + COST_WEIGHT x predicted log TFLOP/s


def first_pick(log_probs: Sequence[float], log_tflops: Sequence[float], rerank: int = RERANK,
               cost_weight: float = COST_WEIGHT) -> int:
    """Index of the first pick among candidates listed most probable first: the best of the
    first `rerank` by log probability + `cost_weight` x predicted log TFLOP/s."""
    return max(range(min(rerank, len(log_probs))), key=lambda i: log_probs[i] + cost_weight * log_tflops[i])


TEMPERATURE = 0.1  # cost_model 1: p(config) = softmax(predicted log TFLOP/s / TEMPERATURE) over valid configs
CACHED = 64  # problems whose scores a Policy keeps
TABLES = 4  # (GPU, dtype) pairs whose `scoring.ConfigTable`s a Policy keeps, one a member (about 8 MB each)
HEAD = 1024  # best predicted configs kept in order per problem: where top_k's diverse picks come from
# an ensemble's first member's best configs that every member scores: at 4,096 the vote picked as a
# vote over every valid config did on both val splits, at 1,024 it lost up to 0.007 (docs/BENCHMARKS.md,
# "Three seeds' vote")
VOTE = 4096


def diversity_group(config: TileConfig) -> tuple:
    """The group `diverse_order` spreads the picks over: the variant, SPLIT_K and the tile shape.

    Without it, the shipped model's 4 best predicted configs of a val problem span 2.3 groups
    on average, and one alone for 16 of 110 problems (near-copies differing in warps, stages or
    GROUP_M, whose outcomes go together). With BLOCK_K in the group, best of 4 on val's
    measured configs was 0.994, against 0.991 without it (docs/BENCHMARKS.md, "The bounded cost model")."""
    return config.variant, config.split_k, config.block_m, config.block_n, config.block_k


def diverse_order(configs: Sequence[TileConfig], k: int,
                  group_of: Callable[[TileConfig], tuple] = diversity_group) -> list[int]:
    """Indices of the first k of `configs` (listed best first) to try: the best of each group
    in order, then the rest in order, so that a first pick the model is wrong about is backed
    by its best guesses of other kinds rather than by near-copies of it."""
    seen: set = set()
    first, rest = [], []
    for i, c in enumerate(configs):
        group = group_of(c)
        (rest if group in seen else first).append(i)
        seen.add(group)
        if len(first) >= k:
            break
    return (first + rest)[:k]


@dataclasses.dataclass(frozen=True)
class Pick:
    config: TileConfig
    probability: float
    predicted_tflops: float
    # the config a fine-tune measured best for this problem on this GPU: predicted_tflops is that
    # measurement, to be shown as it is rather than calibrated
    measured: bool = False


@dataclasses.dataclass(frozen=True)
class Scores:
    """Every valid config of one (problem, GPU) scored by a roofline-bounded cost model."""

    order: torch.Tensor  # flat grid indices of the best predicted valid configs (up to HEAD), best first
    log_tflops: torch.Tensor  # their predicted log TFLOP/s, in that order
    by_flat: torch.Tensor  # [len(space)] the same by flat grid index, -inf for invalid configs
    log_z: float  # logsumexp of log_tflops / TEMPERATURE: the distribution's normaliser
    context: torch.Tensor  # [hidden] the encoder's context h for the problem on the GPU

    def log_prob(self, log_tflops: torch.Tensor) -> torch.Tensor:
        return log_tflops / TEMPERATURE - self.log_z


class Policy:
    def __init__(self, model: PolicyModel, members: Sequence[PolicyModel] = (), measured: Measured | None = None):
        self.model = model.eval()
        # gpu name -> problem key -> (config key, TFLOP/s): the best config a fine-tune measured for
        # each problem it tuned, which `top_k` picks first on that GPU (a measurement beats a prediction)
        self.measured: Measured = {gpu: dict(wins) for gpu, wins in (measured or {}).items()}
        # an ensemble's other members (same ModelConfig): they rescore the first member's VOTE best
        self.members = tuple(m.eval() for m in members)
        for m in self.members:
            if m.cfg != model.cfg:
                raise ValueError("an ensemble's members must share the first member's ModelConfig")
        # listed once: walking the modules for them on every call cost about 1 ms for three members
        self._weights = [w for m in (self.model, *self.members) for w in m.parameters()]
        self.vocab = GpuVocab(model.cfg.gpu_names)
        self._scores: collections.OrderedDict = collections.OrderedDict()  # (problem, gpu, weights) -> Scores
        self._tables: collections.OrderedDict = collections.OrderedDict()  # (member, gpu, dtype, weights) -> ConfigTable

    @classmethod
    def load(cls, path: str | Path = DEFAULT_CHECKPOINT) -> Policy:
        """The policy a checkpoint holds; FileNotFoundError if there is none, CheckpointError
        (naming the file and the fault) for a file that is not a usable checkpoint."""
        state = read_checkpoint(path)
        try:
            config = ModelConfig(**model_fields(path, state))
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{path}: its model_config does not make a policy ({exc})") from None
        models = []
        for i, weights in enumerate([state["state_dict"], *state.get("members", [])]):
            models.append(PolicyModel(config))
            try:
                models[-1].load_state_dict(weights)
            except RuntimeError as exc:
                which = f"member {i}'s weights" if i else "its weights"
                raise CheckpointError(f"{path}: {which} do not fit its model_config ({weights_fault(exc)})") from None
        measured = {gpu: {key: (config, float(tflops)) for key, (config, tflops) in wins.items()}
                    for gpu, wins in state.get("measured", {}).items()}
        for wins in measured.values():
            for key, (config, _) in wins.items():
                try:
                    TileConfig.from_key(config)
                except ValueError as exc:
                    raise CheckpointError(f"{path}: its measured winner for {key} is not a config ({exc})") from None
        return cls(models[0], models[1:], measured)

    def first(self) -> Policy:
        """The first member alone, one model's scoring without the vote (a single policy is itself)."""
        return Policy(self.model, measured=self.measured) if self.members else self

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
        return self.model.cost(h, configs, problem_vector(problem, gpu)[None])

    @torch.no_grad()
    def predicted(self, problem: GemmProblem, gpu: GpuSpec, configs: torch.Tensor) -> torch.Tensor:
        """Predicted log TFLOP/s [1, C] of knob indices configs [1, C, knobs]: an ensemble's mean
        over its members (its vote, as `scores` takes it among the VOTE best), else `cost`'s."""
        return self.each_predicted(problem, gpu, configs).mean(0)

    @torch.no_grad()
    def each_predicted(self, problem: GemmProblem, gpu: GpuSpec, configs: torch.Tensor) -> torch.Tensor:
        """Each member's predicted log TFLOP/s [members, 1, C] of knob indices configs [1, C, knobs]."""
        graph, spec, index, _ = self.features(problem, gpu)
        dims = problem_vector(problem, gpu)[None]
        return torch.stack([m.cost(m.encode(graph, spec, index), configs, dims) for m in (self.model, *self.members)])

    @torch.no_grad()
    def _encode(self, problem: GemmProblem, gpu: GpuSpec) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode(problem, gpu)

    @torch.no_grad()
    def scores(self, problem: GemmProblem, gpu: GpuSpec) -> Scores:
        """Every valid config scored (cost_model 1), from the cache when the weights are unchanged."""
        weights = weights_version(self._weights)
        key = (problem, gpu, weights)
        if key in self._scores:
            self._scores.move_to_end(key)
            return self._scores[key]
        with scoring_threads():
            graph, spec, index, mask = self.features(problem, gpu)
            h = self.model.encode(graph, spec, index)
            dims = problem_vector(problem, gpu)
            flat, pred = score_all(self.model, self._table(0, gpu, problem.dtype, dims, weights), h, dims, mask[0])
            if self.members:
                pred = self._vote(problem, gpu, dims, (graph, spec, index), weights, flat, pred)
            by_flat = torch.full((mask.numel(),), float("-inf")).index_put_((flat,), pred)
            head, top = pred.topk(min(HEAD, len(pred)))  # a full sort of ~56,000 scores costs 4 ms
            self._scores[key] = Scores(flat[top], head, by_flat, torch.logsumexp(pred / TEMPERATURE, 0).item(), h[0])
        if len(self._scores) > CACHED:
            self._scores.popitem(last=False)
        return self._scores[key]

    def _vote(self, problem: GemmProblem, gpu: GpuSpec, dims: torch.Tensor, inputs: tuple, weights: tuple,
              flat: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """`pred` (the first member's scores of the configs `flat`) with its VOTE best replaced
        by the mean over the members, and the rest moved by the mean's average shift there, so
        that a config outside the vote is not favoured for having escaped it. Capped at the
        roofline bound: a shift never lifts a score above physics."""
        top = pred.topk(min(VOTE, len(pred))).indices
        votes = [pred[top]] + [score_some(m, self._table(i, gpu, problem.dtype, dims, weights), m.encode(*inputs),
                                          dims, flat[top])
                               for i, m in enumerate(self.members, 1)]
        mean = torch.stack(votes).mean(0)
        roof = bound_dims(self.model.cfg, dims).float()[LOG_ROOF]
        out = torch.clamp(pred + (mean - pred[top]).mean(), max=roof)
        out[top] = mean
        return out

    def context(self, problem: GemmProblem, gpu: GpuSpec) -> list[float]:
        """The encoder's context for the problem on the GPU (what a calibration's level reads);
        cached with the scores under a cost model."""
        if self.model.cfg.cost_model == 1:
            return self.scores(problem, gpu).context.tolist()
        return self._encode(problem, gpu)[0][0].tolist()

    def _table(self, member: int, gpu: GpuSpec, dtype: str, dims: torch.Tensor, weights: tuple) -> ConfigTable:
        key = (member, gpu, dtype, weights)
        if key not in self._tables:
            model = (self.model, *self.members)[member]
            self._tables[key] = config_table(model, model.space.mask(gpu, dtype), dims)
            if len(self._tables) > TABLES * (1 + len(self.members)):
                self._tables.popitem(last=False)
        self._tables.move_to_end(key)
        return self._tables[key]

    @torch.no_grad()
    def top_k(self, problem: GemmProblem, gpu: GpuSpec, k: int = 8) -> list[Pick]:
        """The k configs to try, best first (fewer if fewer are valid).

        cost_model 1: the best predicted of all valid configs, then `diverse_order`.
        cost_model 0: of the `RERANK` most probable valid configs (beam search), the one with
        the best log probability + `COST_WEIGHT` x predicted log TFLOP/s, then the others by
        probability. That rule raised the first checkpoints' val top-1 among measured configs
        from 0.904 to 0.944 at the same best of 8 (docs/BENCHMARKS.md).
        Either way, a config a fine-tune measured best for this problem on this GPU comes first.
        """
        if self.model.cfg.cost_model == 1:
            return self._measured_first(problem, gpu, self._top_k_scored(problem, gpu, k), k)
        h, mask = self._encode(problem, gpu)
        beams, logp = self.model.beam_search(h, mask, max(k, RERANK))
        tflops = self.cost(h, problem, gpu, beams)[0].exp()
        picks = [Pick(self.model.space.at(tuple(b)), math.exp(lp), tf)
                 for b, lp, tf in zip(beams[0].tolist(), logp[0].tolist(), tflops.tolist()) if lp > float("-inf")]
        if picks:
            first = first_pick([math.log(p.probability) for p in picks], [math.log(p.predicted_tflops) for p in picks])
            picks.insert(0, picks.pop(first))
        return self._measured_first(problem, gpu, picks[:k], k)

    def _measured_first(self, problem: GemmProblem, gpu: GpuSpec, picks: list[Pick], k: int) -> list[Pick]:
        """`picks` led by the config a fine-tune measured best for the problem on this GPU, if
        there is one the policy's space holds and today's rules allow."""
        known = self.measured.get(gpu.name, {}).get(problem.key)
        if known is None or k < 1:
            return picks
        config = TileConfig.from_key(known[0])
        probability = dict(self.rank(problem, gpu, [config])).get(config)
        if not probability:  # outside the space, or invalid under a rule added since
            return picks
        return [Pick(config, probability, known[1], measured=True)] + [p for p in picks if p.config != config][:k - 1]

    def _top_k_scored(self, problem: GemmProblem, gpu: GpuSpec, k: int) -> list[Pick]:
        s, points = self.scores(problem, gpu), self.model.space.points
        configs: list[TileConfig] = []
        groups: set = set()
        for flat in s.order.tolist():  # stop once k groups are found (near the top)
            configs.append(points[flat])
            groups.add(diversity_group(configs[-1]))
            if len(groups) >= k:
                break
        chosen = diverse_order(configs, k)
        pred = s.log_tflops[chosen]
        return [Pick(configs[i], math.exp(lp), math.exp(tf))
                for i, lp, tf in zip(chosen, s.log_prob(pred).tolist(), pred.tolist())]

    @torch.no_grad()
    def rank(self, problem: GemmProblem, gpu: GpuSpec, configs: Sequence[TileConfig]) -> list[tuple[TileConfig, float]]:
        """`configs` of the policy's space with their probabilities, most probable first."""
        inside = [c for c in configs if c in self.model.space]
        if not inside:
            return []
        if self.model.cfg.cost_model == 1:
            probs = self._probabilities(problem, gpu, inside)
        else:
            h, mask = self._encode(problem, gpu)
            idx = torch.tensor([self.model.space.index(c) for c in inside])[None]
            probs = self.model.log_prob(h, idx, mask)[0].exp().tolist()
        return sorted(zip(inside, probs), key=lambda x: -x[1])

    def _probabilities(self, problem: GemmProblem, gpu: GpuSpec, configs: Sequence[TileConfig]) -> list[float]:
        """p(config) under the cost model's softmax; 0 for configs invalid for this problem."""
        s = self.scores(problem, gpu)
        flat = torch.tensor([self.model.space.flat_index(c) for c in configs])
        return s.log_prob(s.by_flat[flat].double()).exp().tolist()  # float64: far tails stay above 0


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
