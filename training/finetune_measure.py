"""What a fine-tune round measures: on the GEMMs a user serves, the policy's own ranking
(`_ranked`); on a split's problems, configs chosen for information (`_candidates`: the
policy's first pick, where it disagrees with itself, and neighbours of the best found),
measured for real, with the analytic model or from a replay, within the round's share of the budget
(`training.finetune` runs the rounds).
"""
from __future__ import annotations

import collections
import contextlib
import random
import time
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # the run's flags live in its entry module, which imports this one
    from training.finetune import FinetuneArgs
    from training.finetune_budget import Budget


@contextlib.contextmanager
def measurer(db, spec, args: FinetuneArgs, source: str) -> Iterator:
    """The measuring callable of the run (real worker + compile pool, the analytic model, or a replay)."""
    from gnn_policy.policy import DEFAULT_CHECKPOINT
    from gnn_policy.search import Measurer, local_measurer

    counts = collections.defaultdict(int)
    if args.replay:
        from gnn_policy.measure.replay import ReplayPool

        yield Measurer(db, spec, ReplayPool(args.replay, spec.name), None, counts, source=source)
        return
    analytic = None
    if source == "simulated":
        from gnn_policy.measure.simulator import load_fitted

        analytic = load_fitted(args.analytic or DEFAULT_CHECKPOINT.parent / "analytic.json")
    with local_measurer(db, spec, counts, args.runner, args.timeout, simulated=analytic) as measure:
        yield measure


SOURCES = ("top", "doubt", "mutation")  # where a problem's next measurement comes from, in turn
ENSEMBLE_TOP = 64  # the doubt is looked for among this many best predicted candidates


def _ranked(policy, problem, spec, known: dict, n: int, offered: set | None) -> list:
    """The first n unmeasured configs in the policy's own order: `top_k`'s (its first pick, then
    the best predicted of each kind, then the rest), as `tune` lists them; among the configs a
    replay offers when it does."""
    if offered is None:  # the first pick as `tune` takes it: a wider beam may rank another first
        picks = [pick.config for pick in policy.top_k(problem, spec, 1) + policy.top_k(problem, spec, len(known) + n)]
    else:
        from training.adapt_replay import ranked_among

        picks = ranked_among(policy, problem, spec, offered)
    return [c for c in dict.fromkeys(picks) if c.key not in known][:n]


def _candidates(policy, problem, spec, known: dict, n: int, rng: random.Random, offered: set | None = None) -> list:
    """Up to n unmeasured valid configs, chosen for information. A problem's measurements take
    turns over three sources (`SOURCES`), counted from what it already has:
    - top: the policy's would-be first pick, whose error costs most, then its best predicted;
    - doubt: where the model disagrees with itself: the widest spread of predicted log TFLOP/s
      (each row's relative to its own best) over an ensemble's members and the GPU read through
      each GPU embedding the policy learned, among the ENSEMBLE_TOP best predicted;
    - mutation: the best predicted neighbour (one knob moved) of the best config found so far.
    A replay can answer only its `offered` config keys: the candidates are then those.
    """
    from gnn_policy.space import TileConfig
    from training.guard import first_choice

    space_ = policy.model.space
    mask = space_.problem_mask(spec, problem)
    if offered is None:
        pool = [p.config for p in policy.top_k(problem, spec, 4 * max(n, ENSEMBLE_TOP // 4))]
    else:
        pool = [TileConfig.from_key(k) for k in sorted(offered - set(known))]
    # stored rows may hold configs of a wider space (a GPU collected with `persistent`): the policy
    # can neither score nor mutate those, so they neither seed mutations nor become candidates
    found = sorted((k for k, v in known.items() if v is not None and k != "cublas"
                    and TileConfig.from_key(k) in space_), key=lambda k: -known[k])
    neighbours = _neighbours(TileConfig.from_key(found[0]), space_, offered, rng) if found else []
    fresh = [c for c in dict.fromkeys(pool + neighbours)
             if c.key not in known and c in space_ and mask[space_.index(c)]]
    if not fresh:
        return []
    rows = _ensemble(policy, problem, spec, fresh)
    pred = rows[0]
    by_pred = pred.argsort(descending=True).tolist()
    top = by_pred[:ENSEMBLE_TOP]
    spread = (rows[:, top] - rows[:, top].max(1, keepdim=True).values).std(0)
    near = set(neighbours)
    # a problem's first measurement is the policy's own first pick (as `tune` and `patch` take it, or
    # by its rule among what a replay offers), which is not the best predicted under every rule: a
    # winner kept for the problem is then never below it (looked for once: a beam search is slow)
    lead = by_pred[0]
    if not known:
        first = policy.top_k(problem, spec, 1)[0].config if offered is None else None
        lead = fresh.index(first) if first in fresh else first_choice(policy, problem, spec, fresh)
    orders = {"top": [lead] + [i for i in by_pred if i != lead],
              "doubt": [top[i] for i in spread.argsort(descending=True).tolist()],
              "mutation": [i for i in by_pred if fresh[i] in near]}
    chosen: list[int] = []
    turn = len(known)
    while len(chosen) < n and len(chosen) < len(fresh):
        for k in range(len(SOURCES)):  # a source with nothing left passes its turn on
            order = orders[SOURCES[(turn + k) % len(SOURCES)]]
            pick = next((i for i in order if i not in chosen), None)
            if pick is not None:
                chosen.append(pick)
                break
        turn += 1
    return [fresh[i] for i in chosen]


def _neighbours(config, space_, offered: set | None, rng: random.Random) -> list:
    """Configs one knob away from `config`: every one a replay offers, or a random dozen."""
    from gnn_policy.search import mutate

    if offered is None:
        return [mutate(config, space_, rng) for _ in range(12)]
    from gnn_policy.space import TileConfig

    near = []
    for key in offered:
        c = TileConfig.from_key(key)
        if c in space_ and sum(a != b for a, b in zip(space_.index(c), space_.index(config))) == 1:
            near.append(c)
    return sorted(near, key=lambda c: c.key)


def _ensemble(policy, problem, spec, configs: list):
    """Predicted log TFLOP/s [rows, C]: row 0 the policy's own prediction (an ensemble's vote),
    then each member's as it reads this GPU (an ensemble), then the first member's through
    every other GPU embedding it learned, with the spec unchanged."""
    import torch

    graph, spec_vec, index, _ = policy.features(problem, spec)
    idx = torch.tensor([policy.model.space.index(c) for c in configs])[None]
    own = policy.each_predicted(problem, spec, idx)[:, 0]
    rows = [torch.tensor([i]) for i in range(len(policy.model.cfg.gpu_names) + 1) if i != index.item()]
    with torch.no_grad():
        others = [policy.cost(policy.model.encode(graph, spec_vec, r), problem, spec, idx) for r in rows]
    return torch.cat([own.mean(0, keepdim=True)] + ([own] if policy.members else []) + others)


def measure_round(policy, problems, spec, measure, budget: Budget, rounds_left: int, rng, save, since: int,
                  rnd: int, served: bool = False) -> dict:
    """This round's measurements: problem key -> {config key: TFLOP/s, or None for a failed row}.
    On `served` problems (the GEMMs a user named) each one's go down the policy's own ranking
    (`_ranked`), since its best measured config is what the user gets there; on a split's,
    which stand for others, they are chosen for information (`_candidates`).

    What was spent is counted in the database (rows of this GPU and source since the run
    began), so a kill between a measurement and the state file cannot make a resume spend it
    twice. A count budget's share is split over the problems and measured in one batch; a time
    budget's share of the remaining seconds is spent in batches of two configs per problem.
    """
    db = measure.db
    budget.spent_count = db.count_since(spec.name, measure.source, since)
    timed = budget.count is None
    share = -(-budget.left() // rounds_left) if not timed else 0
    # every problem's first measurement is the start's own pick, where the budget allows: a winner kept
    # for it is then never below that pick; a served problem measured once gains nothing, so those go
    # in pairs, to the first problems, while the budget is short of two each
    per = 2 if served else 1
    pairs = served and rnd == 0 and not timed and budget.left() < per * len(problems)
    if rnd == 0 and not timed:
        share = max(share, min(per * len(problems), budget.left()))
    seconds = (budget.seconds - budget.spent_seconds) / rounds_left if timed else 0.0
    out: dict = {}
    round_start = time.monotonic()
    # pairs count what this run measured already (a killed call's), and a problem with nothing left to
    # offer passes its share on
    mine = collections.Counter(r["problem"] for r in db.rows_after(since)
                               if r["gpu"] == spec.name and r["source"] == measure.source) if pairs else {}
    left = share

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
            else:  # the round's share split evenly (at most what is left); the remainder goes on from where
                # the measurements so far stopped, so every problem gets its turn (a step of one a round left some without)
                extra = share % len(problems)
                n = min(max(0, 2 - mine[p.key]), left) if pairs else \
                    min(share // len(problems) + ((i - budget.spent_count) % len(problems) < extra), budget.left())
            if n <= 0:
                continue
            known = db.tflops(spec.name, p.key, measure.source)
            known.update({k: None for k in failed.get(p.key, ())})
            offered = measure.pool.offers(p) if hasattr(measure.pool, "offers") else None
            seen = {**known, **out.get(p.key, {})}
            chosen = _ranked(policy, p, spec, seen, n, offered) if served else \
                _candidates(policy, p, spec, seen, n, rng, offered)
            left -= len(chosen)
            jobs.append((p, chosen))
            if timed:  # a time budget is checked before every problem's batch
                progress = spend(jobs) or progress
                jobs = []
        if jobs:  # a count budget's whole round at once: its configs compile together
            progress = spend(jobs) or progress
        if not timed or not progress or time.monotonic() - round_start >= seconds or not budget.left():
            return out
