"""The fine-tune's guard: a cross-fit over the tuning problems decides which weights a run keeps.

A fine-tune learns from a few measurements on 8 problems and is used on every other problem
of the GPU. On replayed real labels and on both held-out targets, adapting every weight often
made the first pick worse on unseen problems (docs/BENCHMARKS.md), so adapted weights must
earn their place. The tuning problems are split into FOLDS parts; for each part, a copy of
the starting policy adapts on the other parts' measurements (`training.adaptation.Adapter`,
as many steps as the run took in all), and the copy and the start then pick, by the policy's
first-pick rule, among each held-out problem's measured configs. Scores are the geomean of the
pick's TFLOP/s over the best measured. Under `calibrate-whole` the copy is also scored after
its calibration, so the run can keep the calibration alone where the whole network's steps
do not add to it. A stage is kept only where it scores above everything before it over all
held-out problems and, with EVERY_FOLD, no worse on any fold; otherwise the run falls back to
the best earlier weights, the start's at worst. A problem with fewer
than two correct configs cannot show a ranking and is not scored.
"""
from __future__ import annotations

import copy
import dataclasses
import math

from gnn_policy.measure.result import CUBLAS
from training.adaptation import AdaptPlan, Adapter

# transfer fingerprints fine-tunes by finetune.ADAPT_VERSION, not by these: a change to either needs a bump there
FOLDS = 2  # on replayed val labels, 4 and 8 (leave one out) decided wrongly more often, and cost more (BENCHMARKS)
MIN_SCORED = 2  # correct configs a held-out problem needs before a pick among them says anything
# a stage must also pick no worse on any fold: on replayed labels this kept calibrations from hurting
# at B = 64 where the pooled geomean alone kept some that did (docs/BENCHMARKS.md)
EVERY_FOLD = True
# what a stage is judged by on the held-out folds: "pick" (the first pick among the measured
# configs, geomean fraction of their best) or "rank" (pairs of measured configs the predictions
# order as measured, in the hope that every pair says more than one pick among a few configs
# near the top). On replayed H200 val labels (docs/BENCHMARKS.md, 2026-12-06) "rank" did no
# better than "pick"; adapt_replay reports both.
SIGNAL = "pick"
RANK_MARGIN = 1.05  # pairs closer than this ratio of TFLOP/s are ties: timing noise, not a ranking


@dataclasses.dataclass(frozen=True)
class CheckResult:
    start: float | None  # geomean fraction of the start's picks over the scored held-out problems
    adapted: float | None  # the same for the copies after every stage of the plan, each adapted on the other folds
    scored: int  # held-out problems with at least MIN_SCORED correct configs (0: nothing to judge by)
    calibrated: float | None = None  # `calibrate-whole`: the copies after the calibration stage alone
    folds: tuple[dict[str, float], ...] = ()  # the same three geomeans on each fold's held-out problems alone
    every_fold: bool = EVERY_FOLD  # a stage must also be no worse on any fold than what it replaces
    ranks: dict[str, float] | None = None  # share of held-out pairs each stage orders as measured
    signal: str = SIGNAL

    @property
    def kept(self) -> str:
        """The weights the run keeps: 'adapted', 'calibrated' (the calibration alone) or 'start'."""
        if self.signal == "rank":
            if not self.ranks:
                return "start"
            kept = "start"
            for stage in ("calibrated", "adapted"):
                if self.ranks.get(stage) is not None and self.ranks[stage] > self.ranks[kept]:
                    kept = stage
            return kept
        if not self.scored:
            return "start"
        kept, best = "start", self.start
        for stage, score in (("calibrated", self.calibrated), ("adapted", self.adapted)):
            if score is not None and score > best and (
                    not self.every_fold or all(f[stage] >= f[kept] for f in self.folds)):
                kept, best = stage, score
        return kept

    @property
    def keep_adapted(self) -> bool:
        return self.kept == "adapted"


def usable(policy, problem, spec, keys) -> list:
    """The configs of `keys` the policy can give mass to on this problem: in its space and valid
    by today's rules (a stored row may predate a rule)."""
    from gnn_policy.space import TileConfig

    space_ = policy.model.space
    allowed = space_.problem_mask(spec, problem)
    configs = [c for c in map(TileConfig.from_key, (k for k in keys if k != CUBLAS)) if c in space_]
    return [c for c in configs if allowed[space_.index(c)]]


def first_choice(policy, problem, spec, configs: list) -> int:
    """Index of the config of `configs` that the policy's first-pick rule takes: the best
    predicted (cost_model 1, as `Policy.top_k`; an ensemble's vote), or `policy.first_pick` over
    the most probable."""
    import torch

    from gnn_policy.policy import first_pick

    idx = torch.tensor([policy.model.space.index(c) for c in configs])[None]
    if policy.model.cfg.cost_model == 1:
        return int(policy.predicted(problem, spec, idx)[0].argmax())
    with torch.no_grad():
        h, mask = policy.encode(problem, spec)
        cost = policy.cost(h, problem, spec, idx)[0]
        logp = policy.model.log_prob(h, idx, mask)[0]
    order = logp.argsort(descending=True).tolist()
    return order[first_pick([logp[i].item() for i in order], [cost[i].item() for i in order])]


def pick_fraction(policy, problem, spec, figures: dict[str, float], min_scored: int = MIN_SCORED) -> float | None:
    """The first-pick rule's choice among a problem's measured configs, as a fraction of the
    best of them; None with fewer than `min_scored` usable correct configs."""
    configs = usable(policy, problem, spec, figures)
    if len(configs) < min_scored:
        return None
    chosen = configs[first_choice(policy, problem, spec, configs)]
    return figures[chosen.key] / max(figures[c.key] for c in configs)


def ordered_pairs(policy, problem, spec, figures: dict[str, float]) -> tuple[int, int]:
    """(pairs of the problem's usable measured configs the policy's predictions order as measured,
    pairs compared); pairs within RANK_MARGIN of each other are not compared."""
    import torch

    configs = usable(policy, problem, spec, figures)
    if len(configs) < 2:
        return 0, 0
    idx = torch.tensor([policy.model.space.index(c) for c in configs])[None]
    pred = policy.predicted(problem, spec, idx)[0].tolist()
    measured = [math.log(figures[c.key]) for c in configs]
    right = total = 0
    for i in range(len(configs)):
        for j in range(i + 1, len(configs)):
            if abs(measured[i] - measured[j]) > math.log(RANK_MARGIN):
                total += 1
                right += (pred[i] - pred[j]) * (measured[i] - measured[j]) > 0
    return right, total


def cross_fit(start, problems: list, spec, db, source: str, plan: AdaptPlan, rounds: int, seed: int,
              folds: int = FOLDS, min_scored: int = MIN_SCORED, rank: bool = SIGNAL == "rank") -> CheckResult:
    """`folds`-fold cross-fit of the adaptation over the tuning problems (see the module doc);
    `rank` also counts the held-out pairs each stage orders (one more scoring a problem and stage)."""
    import torch

    figures = {p.key: {k: v for k, v in db.tflops(spec.name, p.key, source).items() if k != CUBLAS} for p in problems}
    failed = db.failed_configs(spec.name, source)
    parts = [problems[i::folds] for i in range(folds)]
    scores: dict[str, list[float]] = {"start": [], "calibrated": [], "adapted": []}
    pairs = {name: [0, 0] for name in scores}  # (ordered as measured, compared) over the held-out problems
    by_fold = []
    with torch.random.fork_rng(devices=[]):  # the same answer on a re-entered run, whatever ran before
        torch.manual_seed(seed)
        for i, held in enumerate(parts):
            learn = [p for j, part in enumerate(parts) if j != i for p in part]
            scored = [(p, s) for p in held
                      if (s := pick_fraction(start, p, spec, figures[p.key], min_scored)) is not None]
            if not scored:
                continue
            if rank:
                _count(pairs["start"], start, held, spec, figures)
            adapter = Adapter(copy.deepcopy(start), plan)
            # a stand-in for the run's rounds, which this replay cannot repeat without measuring: all of
            # the learning folds' measurements in one round, for as many steps as the run took in all
            measured = {}
            for p in learn:
                outcome = {**figures[p.key], **dict.fromkeys(failed.get(p.key, ()))}
                measured[p.key] = {c.key: outcome[c.key] for c in usable(start, p, spec, outcome)}
            fold = {"start": [s for _, s in scored]}
            for n, stage in enumerate(plan.stages):
                adapter.stage(stage, learn, spec, db, source, measured, {}, rounds)
                name = "adapted" if n == len(plan.stages) - 1 else "calibrated"
                fold[name] = [pick_fraction(adapter.policy, p, spec, figures[p.key]) for p, _ in scored]
                if rank:
                    _count(pairs[name], adapter.policy, held, spec, figures)
            for name, values in fold.items():
                scores[name] += values
            by_fold.append({name: _geomean(values) for name, values in fold.items()})
    if not scores["start"]:
        return CheckResult(None, None, 0)
    ranks = {name: right / total for name, (right, total) in pairs.items() if total} or None
    return CheckResult(_geomean(scores["start"]), _geomean(scores["adapted"]), len(scores["start"]),
                       _geomean(scores["calibrated"]) if scores["calibrated"] else None, tuple(by_fold), ranks=ranks)


def _count(tally: list[int], policy, problems: list, spec, figures: dict) -> None:
    for p in problems:
        right, total = ordered_pairs(policy, p, spec, figures[p.key])
        tally[0] += right
        tally[1] += total


def calibrated_only(start, problems: list, spec, db, source: str, plan: AdaptPlan, rounds: int, seed: int):
    """A copy of the start with the calibration stage alone fitted on all of the run's measurements:
    what a `calibrate-whole` run keeps when its guard finds the whole network's steps add nothing."""
    import torch

    adapter = Adapter(copy.deepcopy(start), plan)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        adapter.stage("calibrate", problems, spec, db, source, {}, {}, rounds)
    return adapter.policy


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))
