"""What a fine-tune round measures: candidates from the policy's beam picks and mutations of the
best configs so far, screened by its cost head, measured for real, with the analytic model or
from a replay, within the round's share of the budget (`training.finetune` runs the rounds).
"""
from __future__ import annotations

import collections
import random
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the run's flags and budget live in its entry module, which imports this one
    from training.finetune import Budget, FinetuneArgs


class measurer:
    """The measuring callable of the run (real worker + compile pool, the analytic model, or a replay)."""

    def __init__(self, db, spec, args: FinetuneArgs, source: str):
        self.db, self.spec, self.args, self.source = db, spec, args, source

    def __enter__(self):
        import contextlib

        import torch

        from gnn_policy.measure.compile import CompilePool
        from gnn_policy.measure.simulator import SimulatedPool, load_fitted
        from gnn_policy.measure.workers import WorkerPool
        from gnn_policy.policy import DEFAULT_CHECKPOINT
        from gnn_policy.search import Measurer

        self.stack = contextlib.ExitStack()
        if self.args.replay:
            from gnn_policy.measure.replay import ReplayPool

            pool, compiler = ReplayPool(self.args.replay, self.spec.name), None
        elif self.source == "simulated":
            pool = SimulatedPool(load_fitted(self.args.analytic or DEFAULT_CHECKPOINT.parent / "analytic.json"),
                                 self.spec)
            compiler = None
        else:
            pool = self.stack.enter_context(WorkerPool(self.args.runner, gpu=self.spec.name,
                                                       timeout_s=self.args.timeout))
            real = self.args.runner.startswith("gnn_policy.measure.runner:") and torch.cuda.is_available()
            compiler = self.stack.enter_context(CompilePool()) if real else None
        return Measurer(self.db, self.spec, pool, compiler, collections.defaultdict(int), source=self.source)

    def __exit__(self, *exc: object) -> None:
        self.stack.close()


def _candidates(policy, problem, spec, known: dict, n: int, rng: random.Random, offered: set | None = None) -> list:
    """Up to n unmeasured configs: beam picks and mutations of the best so far, screened by the cost head.

    A replay can answer only its `offered` config keys, which the beam and the mutations rarely
    hit; there the pool is the same number of unmeasured offered configs, the most probable first.
    """
    import torch

    from gnn_policy.search import mutate
    from gnn_policy.space import TileConfig

    space_ = policy.model.space
    mask = space_.problem_mask(spec, problem)
    best = sorted((k for k, v in known.items() if v is not None and k != "cublas"), key=lambda k: -known[k])[:3]
    if offered is None:
        pool = [p.config for p in policy.top_k(problem, spec, 4 * n)]
        for key in best:
            pool += [mutate(TileConfig.from_key(key), space_, rng) for _ in range(2 * n)]
    else:
        stored = [TileConfig.from_key(k) for k in sorted(offered - set(known))]
        pool = [c for c, _ in policy.rank(problem, spec, stored)[:4 * n + 2 * n * len(best)]]
    fresh = [c for c in dict.fromkeys(pool) if c.key not in known and mask[space_.index(c)]]
    if not fresh:
        return []
    with torch.no_grad():
        h, _ = policy.encode(problem, spec)
        score = policy.cost(h, problem, spec, torch.tensor([space_.index(c) for c in fresh])[None])[0]
    return [fresh[i] for i in score.argsort(descending=True)[:n].tolist()]


def measure_round(policy, problems, spec, measure, budget: Budget, rounds_left: int, rng, save, since: int,
                  rnd: int) -> dict:
    """This round's measurements: problem key -> {config key: TFLOP/s, or None for a failed row}.

    What was spent is counted in the database (rows of this GPU and source since the run
    began), so a kill between a measurement and the state file cannot make a resume spend it
    twice. A count budget's share is split over the problems and measured in one batch; a time
    budget's share of the remaining seconds is spent in batches of two configs per problem.
    """
    db = measure.db
    budget.spent_count = db.count_since(spec.name, measure.source, since)
    timed = budget.count is None
    share = -(-budget.left() // rounds_left) if not timed else 0
    seconds = (budget.seconds - budget.spent_seconds) / rounds_left if timed else 0.0
    out: dict = {}
    round_start = time.monotonic()

    def spend(jobs: list) -> bool:
        start = time.monotonic()
        values = measure.many(jobs)
        budget.spent_seconds += time.monotonic() - start
        budget.spent_count = db.count_since(spec.name, measure.source, since)
        save()
        for (p, chosen), got in zip(jobs, values):
            stored = db.measured(spec.name, measure.source, problem=p.key)
            # a config that got no row (no valid layout, compile out of memory) teaches nothing
            out.setdefault(p.key, {}).update({c.key: v for c, v in zip(chosen, got) if (p.key, c.key) in stored})
        return any(chosen for _, chosen in jobs)

    while True:
        progress, jobs = False, []
        failed = db.failed_configs(spec.name, measure.source)  # a problem's failures change only when it is measured
        for i, p in enumerate(problems):
            if timed:  # two at a time, up to the measurements the adaptation holds (`Budget.cap`)
                n = min(2, budget.left()) if time.monotonic() - round_start < seconds else 0
            else:  # the round's share split evenly (at most what is left); the remainder rotates over problems
                n = min(share // len(problems) + ((i - rnd) % len(problems) < share % len(problems)), budget.left())
            if n <= 0:
                continue
            known = db.tflops(spec.name, p.key, measure.source)
            known.update({k: None for k in failed.get(p.key, ())})
            offered = measure.pool.offers(p) if hasattr(measure.pool, "offers") else None
            jobs.append((p, _candidates(policy, p, spec, {**known, **out.get(p.key, {})}, n, rng, offered)))
            if timed:  # a time budget is checked before every problem's batch
                progress = spend(jobs) or progress
                jobs = []
        if jobs:  # a count budget's whole round at once: its configs compile together
            progress = spend(jobs) or progress
        if not timed or not progress or time.monotonic() - round_start >= seconds or not budget.left():
            return out
