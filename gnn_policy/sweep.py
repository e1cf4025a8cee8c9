"""`gnn-policy sweep`: a well-founded best known for the problems we evaluate on (resumes).

Three phases, each skipped where the database already holds its work, so a run stopped by
`--time-limit` picks up where it stopped (with the shipped shards, on a fresh machine too):

1. Dense: `collect`'s plan with `--configs` stratified valid configs per problem (the whole
   valid space by default: a short K or strides that forbid TMA leave a small pool too few),
   the named lists, `default_config`, cuBLAS, the analytic model's pick and the top `--policy-top`
   picks of each `--policy` checkpoint, so that every picker is judged offline on measured
   figures, never on a guess of what its pick would have run at.
2. Refinement: every config one knob away from each problem's `--top` fastest (any other value
   of that knob, valid configs only), measured round after round until the top ones have no
   unmeasured neighbour: nothing near them improves.
3. `confirm`: the fastest configs and cuBLAS re-timed, interleaved, in a later step.
"""
from __future__ import annotations

import dataclasses
import time
from collections import defaultdict

from graphs import GemmProblem
from gnn_policy.args import flag
from gnn_policy.baselines import ANALYTIC, analytic_pick, fits
from gnn_policy.collect import CollectArgs, finish_counts, measure_planned, plan, select_problems, worker_pool
from gnn_policy.measure.result import CUBLAS
from gnn_policy.space import NAMED_LISTS, ConfigSpace, TileConfig, space


@dataclasses.dataclass(frozen=True)
class SweepArgs:
    """Sweep problems densely, refine around the best, then confirm the top (resumes where it stopped)."""

    db: str = flag(help="the SQLite database to fill (the shipped snapshot is loaded into it first)")
    gpu: str = flag("", "GPU spec name (default: the local device)")
    split: str = flag("random-test", "split to sweep (as collect's --split)")
    problems: int = flag(80, "the split's first N problems (collect's order)")
    configs: int = flag(1000, "stratified valid configs per problem in the dense phase")
    pool: int = flag(0, "configs per dtype the dense sample comes from (0: the whole valid space)")
    space: str = flag("full", "config space (gnn_policy.space.SPACES): the strata and the knobs refined")
    named: tuple[str, ...] = flag(tuple(NAMED_LISTS), "named lists measured on every problem (repeatable)",
                                  action="append")
    analytic: str = flag(str(ANALYTIC), "fitted analytic model whose pick is measured too ('': none)")
    policy: tuple[str, ...] = flag((), "policy checkpoint whose top picks are measured on every problem "
                                        "(repeatable)", action="append")
    policy_top: int = flag(8, "picks of each --policy measured per problem")
    top: int = flag(5, "fastest configs per problem whose one-knob neighbours are measured")
    max_rounds: int = flag(10, "refinement rounds at most in one run")
    confirm_top: int = flag(3, "fastest configs per problem that confirm re-times, besides cuBLAS")
    rounds: int = flag(3, "confirm's interleaved rounds")
    seed: int = flag(0, "random seed for the problem and config samples")
    timeout: float = flag(120.0, "seconds a config may take on the GPU before it is recorded as a timeout")
    compile_timeout: float = flag(120.0, "seconds a config may take to compile before it is a timeout")
    replays: int = flag(10, "at most this many CUDA-graph replays per timing (at least 3)")
    time_limit: float = flag(0.0, "minutes after which the run stores what it has and stops (0: no limit)")
    runner: str = flag("gnn_policy.measure.runner:measure_configs",
                       "dotted path of the measuring function (package.module:function)")
    shard_dir: str = flag("", "write this run's rows to new shards here (measurements, then re-timings)")


def neighbours(c: TileConfig, space_: ConfigSpace) -> list[TileConfig]:
    """Every point of the space that differs from `c` in exactly one knob."""
    index = space_.index(c)
    out = []
    for k, (_, values) in enumerate(space_.knobs):
        for j in range(len(values)):
            if j != index[k]:
                out.append(space_.at(index[:k] + (j,) + index[k + 1:]))
    return out


def top_configs(figures: dict[str, float], top: int) -> list[str]:
    """The `top` fastest Triton configs of a problem; ties go to the smaller key (a stable order)."""
    return sorted((k for k in figures if k != CUBLAS), key=lambda k: (-figures[k], k))[:top]


def refinement(db, gpu, problems: list[GemmProblem], space_: ConfigSpace, top: int) -> list[tuple]:
    """(problem, the unmeasured valid one-knob neighbours of its `top` fastest), where any are left."""
    measured: dict[str, set[str]] = defaultdict(set)
    for problem, config in db.measured(gpu.name):
        measured[problem].add(config)
    out = []
    for p in problems:
        best = [TileConfig.from_key(k) for k in top_configs(db.tflops(gpu.name, p.key), top)]
        ok = fits(space_, gpu, p)
        todo = dict.fromkeys(n for b in best if b in space_ for n in neighbours(b, space_)
                             if n.key not in measured[p.key] and ok(n))
        if todo:
            out.append((p, list(todo)))
    return out


def _pickers(gpu, args: SweepArgs) -> list:
    """Functions problem -> the configs a picker would run (the analytic model's pick, each
    policy's top picks), each a list of valid configs, best first."""
    out = []
    if args.analytic:
        from gnn_policy.measure.simulator import load_fitted

        model, space_ = load_fitted(args.analytic), space(args.space)
        out.append(lambda p: [c for c in [analytic_pick(p, gpu, space_, model)] if c is not None])
    if args.policy:
        from gnn_policy.policy import Policy
    for path in args.policy:  # top_k draws from the problem's valid configs only
        out.append(lambda p, pol=Policy.load(path): [pick.config for pick in pol.top_k(p, gpu, args.policy_top)])
    return out


def _dense_plan(db, gpu, problems: list[GemmProblem], args: SweepArgs, collect: CollectArgs) -> list[tuple]:
    """collect's plan, with the pickers' configs (`_pickers`) right after cuBLAS for every
    problem: measured before the problem's plan is done, so never left out, and a picker
    added to a finished sweep has its configs measured too (measured pairs are skipped)."""
    planned = plan(problems, gpu, collect)
    pickers = _pickers(gpu, args)
    if not pickers:
        return planned
    for p, configs in planned:
        first = 1 if configs and configs[0] is None else 0
        picked = dict.fromkeys(c for pick in pickers for c in pick(p) if c not in configs)
        configs[first:first] = list(picked)
    return planned


def run(args: SweepArgs) -> dict:
    """Dense, refine, confirm, as far as the time limit allows; returns counts and `complete`."""
    import hardware_specs
    from gnn_policy import distributed
    from gnn_policy.confirm import ConfirmArgs, run as confirm
    from gnn_policy.database import Database
    from gnn_policy.snapshot import export_run, load_shipped

    db_path = distributed.as_rank(args.db, args.shard_dir)  # under torchrun: this rank's GPU and database
    gpu = hardware_specs.resolve(args.gpu)
    collect = CollectArgs(db=args.db, gpu=args.gpu, split=args.split, problems=args.problems, configs=args.configs,
                          pool=args.pool, space=args.space, named=args.named, seed=args.seed, timeout=args.timeout,
                          compile_timeout=args.compile_timeout, replays=args.replays, runner=args.runner)
    problems = distributed.share(select_problems(args.split, args.problems, args.seed))
    counts: dict = defaultdict(int)
    start = time.monotonic()
    deadline = start + args.time_limit * 60 if args.time_limit else float("inf")
    kernels: set[str] = set()
    with Database(db_path) as db:
        counts["loaded_from_shards"] = load_shipped(db)
        since = db.high_water()
        with worker_pool(gpu, collect) as pool:
            dense = _dense_plan(db, gpu, problems, args, collect)
            measure_planned(db, gpu, dense, collect, counts, deadline, kernels, pool)
            dense_done = not counts.get("stopped_by_time_limit")
            left = refinement(db, gpu, problems, space(args.space), args.top) if dense_done else []
            while left and counts["refine_rounds"] < args.max_rounds and time.monotonic() < deadline:
                counts["refine_rounds"] += 1
                counts["refine_planned"] += sum(len(cs) for _, cs in left)
                measure_planned(db, gpu, left, collect, counts, deadline, kernels, pool)
                left = refinement(db, gpu, problems, space(args.space), args.top)
        counts["problems_refining"] = len(left) if dense_done else len(problems)
        finish_counts(counts, start, kernels)
        if args.shard_dir:
            counts["shard_rows"] = export_run(db, args.shard_dir, gpu.name, distributed.shard_kind("sweep"), since)
    minutes = (deadline - time.monotonic()) / 60
    complete = dense_done and not left
    if complete and minutes > 0 and problems:  # no problems: confirm would take every measured one
        confirmed = confirm(ConfirmArgs(db=args.db, gpu=args.gpu, top=args.confirm_top, rounds=args.rounds,
                                        seed=args.seed, timeout=args.timeout, replays=args.replays,
                                        time_limit=0.0 if minutes == float("inf") else minutes,
                                        runner=args.runner, shard_dir=args.shard_dir,
                                        problem=tuple(p.key for p in problems)))
        counts.update({f"confirm_{k}": v for k, v in confirmed.items()})
        complete = not confirmed.get("stopped_by_time_limit")
    counts["complete"] = complete and minutes > 0
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in counts.items()}
