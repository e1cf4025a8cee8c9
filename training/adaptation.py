"""The fine-tune's adaptation: its gradient steps, and the guard that decides whether to keep them.

`adapt` takes the steps after each round of measurements:
- REINFORCE with a per-problem mean baseline on this round's measurements. The reward is
  log(TFLOP/s / best found), floored at log 0.1; a failed config scores log 0.05.
- The pretraining objective (`training.objective`: listwise, failures, the cost head's
  ranking and regression) on everything measured so far on this GPU, as in Reptile's inner
  loop, so the cost head that screens candidates and ranks the first pick adapts too.

`cross_fit` is the guard. A fine-tune learns from a few measurements on 8 problems and is
used on every other problem of the GPU. On replayed real labels and on both held-out
targets, it often made the first pick worse on unseen problems (docs/BENCHMARKS.md), so the
adapted weights must earn their place. The check cross-fits over the tuning problems: they
are split into FOLDS parts, and for each part a copy of the starting policy adapts on the
other parts' measurements (`adapt`, as many steps as the run took). The copy and the
starting policy then pick, by the first-pick rule, among each held-out problem's measured
configs. The fine-tune keeps its adapted weights only where the copies' picks beat the
start's on the held-out problems (geomean of the pick's TFLOP/s over the best measured);
otherwise it falls back to the starting weights. A problem with fewer than two correct
configs cannot show a ranking and is not scored.
"""
from __future__ import annotations

import copy
import dataclasses
import math

from gnn_policy.measure.result import CUBLAS

# transfer fingerprints fine-tunes by finetune.ADAPT_VERSION, not by these: a change to either needs a bump there
FOLDS = 2  # on replayed val labels, 4 and 8 (leave one out) decided wrongly more often, and cost more (BENCHMARKS)
MIN_SCORED = 2  # correct configs a held-out problem needs before a pick among them says anything
FAILED_REWARD = math.log(0.05)  # below every correct config's reward, which is clipped at log 0.1
FLOOR_REWARD = math.log(0.1)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    start: float | None  # geomean fraction of the start's picks over the scored held-out problems
    adapted: float | None  # the same for the copies, each adapted on the other folds
    scored: int  # held-out problems with at least MIN_SCORED correct configs (0: nothing to judge by)

    @property
    def keep_adapted(self) -> bool:
        return self.scored > 0 and self.adapted > self.start


def usable(policy, problem, spec, keys) -> list:
    """The configs of `keys` the policy can give mass to on this problem: in its space and valid
    by today's rules (a stored row may predate a rule)."""
    from gnn_policy.space import TileConfig

    space_ = policy.model.space
    allowed = space_.problem_mask(spec, problem)
    configs = [c for c in map(TileConfig.from_key, (k for k in keys if k != CUBLAS)) if c in space_]
    return [c for c in configs if allowed[space_.index(c)]]


def pick_fraction(policy, problem, spec, figures: dict[str, float]) -> float | None:
    """The first-pick rule's choice among a problem's measured configs, as a fraction of the
    best of them; None with fewer than MIN_SCORED usable correct configs."""
    import torch

    from gnn_policy.policy import first_pick

    space_ = policy.model.space
    configs = usable(policy, problem, spec, figures)
    if len(configs) < MIN_SCORED:
        return None
    idx = torch.tensor([space_.index(c) for c in configs])[None]
    with torch.no_grad():
        h, mask = policy.encode(problem, spec)
        logp, cost = policy.model.log_prob(h, idx, mask)[0], policy.cost(h, problem, spec, idx)[0]
    order = logp.argsort(descending=True).tolist()
    chosen = configs[order[first_pick([logp[i].item() for i in order], [cost[i].item() for i in order])]]
    return figures[chosen.key] / max(figures[c.key] for c in configs)


def cross_fit(start, problems: list, spec, db, source: str, steps: int, lr: float, seed: int,
              folds: int = FOLDS) -> CheckResult:
    """`folds`-fold cross-fit of the adaptation over the tuning problems (see the module doc)."""
    import torch

    figures = {p.key: {k: v for k, v in db.tflops(spec.name, p.key, source).items() if k != CUBLAS} for p in problems}
    failed = db.failed_configs(spec.name, source)
    parts = [problems[i::folds] for i in range(folds)]
    start_scores, adapted_scores = [], []
    with torch.random.fork_rng(devices=[]):  # the same answer on a re-entered run, whatever ran before
        torch.manual_seed(seed)
        for i, held in enumerate(parts):
            learn = [p for j, part in enumerate(parts) if j != i for p in part]
            scored = [(p, s) for p in held if (s := pick_fraction(start, p, spec, figures[p.key])) is not None]
            if not scored:
                continue
            adapted = copy.deepcopy(start)
            optimiser = torch.optim.Adam(adapted.model.parameters(), lr=lr)
            # a stand-in for the run's rounds, which this replay cannot repeat without measuring: all of
            # the learning folds' measurements in one round, for as many steps as the run took in all
            measured = {}
            for p in learn:
                outcome = {**figures[p.key], **dict.fromkeys(failed.get(p.key, ()))}
                measured[p.key] = {c.key: outcome[c.key] for c in usable(start, p, spec, outcome)}
            adapt(adapted, learn, spec, db, source, measured, optimiser, steps, {"reinforce": [], "supervised": []})
            start_scores += [s for _, s in scored]
            adapted_scores += [pick_fraction(adapted, p, spec, figures[p.key]) for p, _ in scored]
    if not start_scores:
        return CheckResult(None, None, 0)
    return CheckResult(_geomean(start_scores), _geomean(adapted_scores), len(start_scores))


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def adapt(policy, problems: list, spec, db, source: str, measured: dict, optimiser, steps: int, norms: dict) -> None:
    """REINFORCE on this round's measurements plus the pretraining objective (`training.objective`:
    listwise, failures, the cost head) on all of this GPU's, as Reptile's inner loop adapts."""
    import torch

    from gnn_policy.space import TileConfig
    from training.dataset import collate, measured_sample
    from training.objective import LossWeights, objective

    model, space_ = policy.model, policy.model.space
    failed = db.failed_configs(spec.name, source)
    samples, reinforce = [], []
    for p in problems:
        figs = {k: v for k, v in db.tflops(spec.name, p.key, source).items() if k != CUBLAS}
        sample = measured_sample(p, spec, figs, failed.get(p.key, ()), space_) if figs else None
        if sample is None:
            continue
        samples.append(sample)
        best = max(figs.values())
        new = measured.get(p.key, {})
        if len(new) > 1:
            rewards = [max(FLOOR_REWARD, math.log(v / best)) if v else FAILED_REWARD for v in new.values()]
            reinforce.append((p, [space_.index(TileConfig.from_key(k)) for k in new], rewards))
    batch = collate(samples, space_, policy.vocab) if samples else None
    model.train()
    for _ in range(steps if samples else 0):
        pg_total = torch.zeros(())
        for p, new_idx, rewards in reinforce:
            h, mask = policy.encode(p, spec)
            r = torch.tensor(rewards)
            logp = model.log_prob(h, torch.tensor(new_idx)[None], mask)[0]
            pg_total = pg_total + -((r - r.mean()) * logp).mean()
        # summed over problems like the REINFORCE term, so the two keep their balance at any problem count
        sl_total = objective(model, batch, None, LossWeights())[0] * len(samples)
        optimiser.zero_grad()
        for name, loss in (("reinforce", pg_total), ("supervised", sl_total)):
            if loss.requires_grad:
                grads = torch.autograd.grad(loss, [q for q in model.parameters() if q.requires_grad],
                                            retain_graph=True, allow_unused=True)
                norms[name].append(float(torch.sqrt(sum((g ** 2).sum() for g in grads if g is not None))))
        (pg_total + sl_total).backward()
        optimiser.step()
    model.eval()
