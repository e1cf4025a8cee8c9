"""`gnn-policy confirm`: re-time the configs that decide "best known", interleaved, in a later run.

A first timing of a top config can read several percent fast or slow (measured on the H200:
the top three of 4096^3 came out 7-13% slower seconds later, while cuBLAS moved 0.1%). So for
every measured problem the `--top` fastest configs and cuBLAS are timed again, `--rounds`
times each, in a new shuffled order every round, in a fresh worker. The rows go to the
`retimes` table; a config's figure is then the median of all its timings
(`Database.tflops`), which is what best known and every fraction of it use. A problem whose
contenders have all been re-timed is skipped, so the command resumes; one whose top changed
since (a later collect or bench measured a faster config) is confirmed again, all its
contenders interleaved.
"""
from __future__ import annotations

import dataclasses
import random
import time
from collections import defaultdict

from gnn_policy.args import at_least, flag, positive
from gnn_policy.interrupts import on_interrupt
from gnn_policy.measure.result import CUBLAS, Retime
from gnn_policy.measure.workers import runner_path
from gnn_policy.space import TileConfig


@dataclasses.dataclass(frozen=True)
class ConfirmArgs:
    """Re-time the best configs of every measured problem, interleaved with cuBLAS (resumes)."""

    db: str = flag(help="the SQLite database (the shipped snapshot is loaded into it first)")
    gpu: str = flag("", "GPU spec name (default: the local device)")
    top: int = flag(3, "fastest configs per problem to re-time, besides cuBLAS", check=at_least(1))
    rounds: int = flag(3, "interleaved rounds: each contender is timed once per round", check=at_least(1))
    seed: int = flag(0, "seed of the per-round orders")
    timeout: float = flag(120.0, "seconds a config may take on the GPU before it is recorded as a timeout",
                          check=positive)
    replays: int = flag(10, "at most this many CUDA-graph replays per timing (at least 3)", check=at_least(1))
    time_limit: float = flag(0.0, "minutes after which the run stores what it has and stops (0: no limit)",
                             check=at_least(0, float))
    runner: str = flag("gnn_policy.measure.runner:measure_configs",
                       "dotted path of the measuring function (package.module:function)", check=runner_path)
    shard_dir: str = flag("", "write the re-timings of this run to a new shard here (e.g. data/measurements)")
    split: str = flag("", "only the problems of this split (a family or random split, graphs.classes); "
                          "empty: every measured problem")
    problem: tuple[str, ...] = flag((), "only these problem keys (repeatable); empty: every measured problem",
                                    action="append")


def schedule(contenders: list[str], rounds: int, rng: random.Random) -> list[tuple[int, str]]:
    """(round, config key) in timing order: every contender once per round, shuffled anew."""
    return [(r, key) for r in range(rounds) for key in rng.sample(contenders, len(contenders))]


def _unique(sched: list[tuple[int, str]]) -> list[TileConfig]:
    """The Triton configs of a schedule, once each, in a fixed order (the compile order)."""
    return sorted({TileConfig.from_key(k) for _, k in sched if k != CUBLAS})


def contenders(figures: dict[str, float], top: int) -> list[str]:
    """The `top` fastest Triton configs and cuBLAS (when measured)."""
    ranked = sorted((k for k in figures if k != CUBLAS), key=figures.get, reverse=True)[:top]
    return ranked + ([CUBLAS] if CUBLAS in figures else [])


def run(args: ConfirmArgs) -> dict:
    """Re-time what has no re-timing yet; returns counts."""
    from tqdm import tqdm

    import hardware_specs
    from graphs.classes import split_of
    from gnn_policy import distributed
    from gnn_policy.collect import compile_ahead, take_compiled
    from gnn_policy.database import Database
    from gnn_policy.measure.workers import ProblemSetupError, WorkerPool
    from gnn_policy.snapshot import RunExport, load_shipped, run_stamp

    db_path = distributed.as_rank(args.db, args.shard_dir)  # under torchrun: this rank's GPU and database
    gpu = hardware_specs.resolve(args.gpu)
    run_id = run_stamp()
    counts: dict = defaultdict(int)
    start = time.monotonic()
    deadline = start + args.time_limit * 60 if args.time_limit else float("inf")
    with Database(db_path) as db:
        load_shipped(db)
        export = RunExport(db, args.shard_dir, gpu.name, distributed.shard_kind("retime")) if args.shard_dir else None
        retimed = db.retimed(gpu.name)
        jobs = []
        for p in distributed.share(db.problems(gpu.name)):
            if (args.split and split_of(p) != args.split) or (args.problem and p.key not in args.problem):
                continue
            wanted = contenders(db.tflops(gpu.name, p.key), args.top)
            if not set(wanted) <= retimed.get(p.key, set()):
                rng = random.Random(f"{args.seed}:{p.key}")
                jobs.append((p, schedule(wanted, args.rounds, rng)))
        compiled = compile_ahead([(p, _unique(s)) for p, s in jobs], args.runner)
        stopped = on_interrupt(lambda: f"{counts['retimed']} re-timings stored in {args.db} (the problem in flight "
                                       "is timed again); run the same command again to resume")
        with stopped, WorkerPool(args.runner, gpu=gpu.name, timeout_s=args.timeout, replays=args.replays) as pool:
            for p, sched in tqdm(jobs, desc=f"confirm {gpu.name}", unit="problem"):
                if time.monotonic() > deadline:
                    counts["stopped_by_time_limit"] = 1
                    break
                _, ready = take_compiled(p, _unique(sched), compiled, gpu.name, counts)
                keep = {c.key for c in ready if c is not None} | {CUBLAS}
                sched = [(r, k) for r, k in sched if k in keep]  # a contender that no longer compiles drops out
                configs = [None if k == CUBLAS else TileConfig.from_key(k) for _, k in sched]
                try:
                    rows = [(Retime(gpu.name, p.key, key, run_id, rnd, m.status, m.median_ms, m.sm_mhz, m.versions),
                             p, c) for m, (rnd, key), c in zip(pool.run(p, configs), sched, configs)]
                except ProblemSetupError as exc:
                    tqdm.write(f"skipped {exc}")
                    continue
                counts["retimed"] += db.add_retimes(rows)
                counts["problems_done"] += 1
        if compiled is not None:
            compiled.close()
        if export is not None:
            counts["shard_rows"] = export.write(run_id)
    counts["wall_s"] = round(time.monotonic() - start, 1)
    return dict(counts)
