"""`gnn-policy collect`: measure problems x configs into the database, resumably.

Problems come from a suite split (by model family) or a random split (graphs/random_gemms.py).
Per problem: a stratified random sample of the configs of a space (`--space`, default the full
one) valid for it, with equal shares per (variant, SPLIT_K) group of whatever variants that
space has, so split-K and every load variant are represented whatever their share of the
space; the named lists (`--named`), `default_config` as `gnn_policy.matmul` runs it, and
cuBLAS. A problem whose strides rule a variant out (TMA on unaligned rows) gets no config of
that variant. Pairs already in the database are skipped; each problem's rows are stored in
one transaction, so Ctrl-C or a kill loses at most the problem in flight.

Compiling (about 0.4 s of a CPU core per kernel) costs more than timing (tens of ms), so the
random samples come from a seeded pool per dtype (`--pool`, itself a stratified random
sample of the valid space): a kernel compiled for one problem then serves every problem with
the same specialisation. Random shapes spread over hundreds of specialisations, so
`--pool-by-class` gives each its own pool and measures class by class (`gnn_policy.pools`).
Kernels compile ahead on all cores but one while the GPU times the
problems already compiled. A run ends by printing how many specialisations (Triton cache keys)
its compile jobs needed, and its measurements a minute of wall time and of timing.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
import time
from collections import defaultdict
from typing import Callable, Iterator, Sequence

from graphs import GemmProblem, random_gemms
from graphs.random_gemms import SPLITS as RANDOM_SPLITS
from graphs.suite import SPLITS, split
from gnn_policy.args import at_least, flag, one_of, positive
from gnn_policy.baselines import default_pick, fits
from gnn_policy.interrupts import on_interrupt
from gnn_policy.measure.result import CUBLAS, Measurement
from gnn_policy.measure.workers import runner_path
from gnn_policy.pools import ConfigPools, class_order, stratified_configs
from gnn_policy.space import NAMED_LISTS, TileConfig, named_list, space


SPLIT_NAMES = (*SPLITS, "all", *RANDOM_SPLITS)  # what --split accepts: `select_problems` draws from each


@dataclasses.dataclass(frozen=True)
class CollectArgs:
    """Measure suite problems on the local GPU into the database (resumes where it stopped)."""

    db: str = flag(help="the SQLite database to fill")
    gpu: str = flag("", "GPU spec name (default: the local device)")
    split: str = flag("train", f"split to draw problems from: a suite split ({', '.join(SPLITS)}) or all, or "
                               f"a random one ({', '.join(RANDOM_SPLITS)}: graphs/random_gemms.py)",
                      check=one_of(*SPLIT_NAMES))
    problems: int = flag(0, "number of problems, spread evenly over families (0: the whole split); of a "
                            "random split, its first N (required)", check=at_least(0))
    configs: int = flag(200, "random valid configs per problem, stratified by (variant, SPLIT_K)", check=at_least(1))
    pool: int = flag(1000, "configs per dtype that every problem draws its sample from (0: the whole "
                           "valid space); a shared pool lets one compiled kernel serve many problems",
                     check=at_least(0))
    pool_by_class: bool = flag(False, "give each kernel class (dtype, layouts, epilogue, batched, which of M, N and "
                                      "K are multiples of 16) its own seeded pool, and measure the problems "
                                      "class by class in a seeded order of classes: a kernel then serves "
                                      "every problem of its class in a run, and the classes together still "
                                      "sample the whole space")
    space: str = flag("full", "config space the sample comes from (gnn_policy.space.SPACES); its variants "
                              "and SPLIT_K values make the strata")
    lists: bool = flag(True, "also measure the named lists, default_config and cuBLAS")
    named: tuple[str, ...] = flag(tuple(NAMED_LISTS), "named lists measured beside the sample unless --no-lists "
                                                       "(repeatable)", action="append")
    default: bool = flag(True, "also measure default_config as gnn_policy.matmul runs it (unless --no-lists)")
    policy: str = flag("", "also measure this checkpoint's --policy-top picks per problem (empty: none): labels "
                           "where the policy chooses, so its overrated configs get measured, and its first pick "
                           "is scored on problems it never saw")
    policy_top: int = flag(4, "picks of --policy per problem, `Policy.top_k`'s order", check=at_least(1))
    seed: int = flag(0, "random seed for the problem and config samples")
    timeout: float = flag(120.0, "seconds a config may take on the GPU before it is recorded as a timeout",
                          check=positive)
    compile_timeout: float = flag(120.0, "seconds a config may take to compile before it is a timeout", check=positive)
    replays: int = flag(10, "at most this many CUDA-graph replays per timing (at least 3)", check=at_least(1))
    time_limit: float = flag(0.0, "minutes after which the run stores what it has and stops (0: no limit)",
                             check=at_least(0, float))
    runner: str = flag("gnn_policy.measure.runner:measure_configs",
                       "dotted path of the measuring function (package.module:function)", check=runner_path)
    shard_dir: str = flag("", "write the rows this run adds to a new shard here (e.g. data/measurements)")
    max_gflop: float = flag(0.0, "only problems of at most this many GFLOP (0: any); on an SM slice a large "
                                 "problem costs seconds per config", check=at_least(0, float))
    min_gflop: float = flag(0.0, "only problems of more than this many GFLOP (0: any): the large problems a "
                                 "slice collected with --max-gflop lacks", check=at_least(0, float))


def select_problems(name: str, count: int, seed: int, max_gflop: float = 0.0,
                    where: Callable[[GemmProblem], bool] | None = None, min_gflop: float = 0.0) -> list[GemmProblem]:
    """`count` problems of a split, round-robin over its families (all when count is 0), of at
    most `max_gflop` and more than `min_gflop` GFLOP each when those are set, and only those
    `where` accepts when given.

    A split's selection is the `all` selection's order restricted to the split, so the first
    problems of a split that `collect --split all` measured are the ones a later
    `--split test --problems N` (a dense sweep, a bench, a transfer run) selects. A random split
    has no end: its first `count` problems in the seed's draw order.
    """
    def eligible(p: GemmProblem) -> bool:
        return ((not max_gflop or p.flops <= max_gflop * 1e9) and p.flops > min_gflop * 1e9
                and (where is None or where(p)))

    if name in RANDOM_SPLITS:
        return random_gemms.problems(name, count, seed, where=eligible)
    pool = [p for s in (SPLITS if name == "all" else [name]) for p in split(s) if eligible(p)]
    if not count or count >= len(pool):
        return pool
    by_family: dict[str, list[GemmProblem]] = defaultdict(list)
    for p in (p for s in SPLITS for p in split(s)):
        by_family[p.model].append(p)
    rng = random.Random(seed)
    for members in by_family.values():
        rng.shuffle(members)
    wanted = {p.model for p in pool}
    # members are taken from the end of each shuffled list, as the first collections did
    order = [p for row in itertools.zip_longest(*(m[::-1] for m in by_family.values())) for p in row
             if p is not None and p.model in wanted and eligible(p)]
    return order[:count]


def plan(problems: Sequence[GemmProblem], gpu, args: CollectArgs) -> list[tuple[GemmProblem, list]]:
    """For each problem, the configs to measure (None stands for cuBLAS), before skipping."""
    space_ = space(args.space)
    pools = ConfigPools(space_, gpu, args.pool, args.seed, args.pool_by_class)
    named = sorted({c for name in args.named for c in named_list(name)}) if args.lists else []
    policy = _policy(args.policy)
    out = []
    for p in problems:
        rng = random.Random(f"{args.seed}:{p.key}")
        pool, flat = pools.of(p)
        mask = space_.problem_mask(gpu, p)
        keep = mask.flatten()[flat].tolist()
        configs = stratified_configs([c for c, ok in zip(pool, keep) if ok], args.configs, rng)
        ok, extra = fits(space_, gpu, p, mask), []
        if args.lists:
            extra += [default_pick(p, gpu, ok)] * args.default + named
        if policy is not None:  # of the run's space: its variants alone
            extra += [pick.config for pick in policy.top_k(p, gpu, args.policy_top) if pick.config in space_]
        chosen = set(configs)
        configs += [c for c in dict.fromkeys(extra) if c not in chosen and ok(c)]
        out.append((p, ([None] if args.lists else []) + configs))
    return out


def _policy(path: str):
    """The checkpoint whose picks a plan adds, or None; a bad path fails before anything is measured."""
    if not path:
        return None
    from gnn_policy.policy import Policy

    return Policy.load(path)


def _missing(db, gpu_name: str, planned, counts: dict) -> list[tuple[GemmProblem, list]]:
    done = db.measured(gpu_name)
    todo = []
    for p, configs in planned:
        left = [c for c in configs if (p.key, c.key if c else CUBLAS) not in done]
        counts["skipped"] += len(configs) - len(left)
        if left:
            todo.append((p, left))
    return todo


def compile_ahead(jobs, runner: str, timeout_s: float = 120.0) -> Iterator | None:
    """CompileResults for the configs of `jobs` ((problem, configs), None for cuBLAS skipped),
    in order, compiled ahead on the CPU cores; None when nothing is compiled (no GPU, or a
    runner other than the real one)."""
    if not runner.startswith("gnn_policy.measure.runner:"):
        return None  # before torch is imported: another runner's run never needs it
    import torch

    if not torch.cuda.is_available():
        return None
    from gnn_policy.measure.compile import compile_stream

    pairs = ((p, c) for p, cs in jobs for c in cs if c is not None)
    return compile_stream(pairs, timeout_s=timeout_s)


def run(args: CollectArgs) -> dict:
    """Measure what is missing; returns counts (measured, skipped, per status) and timings."""
    import hardware_specs
    from gnn_policy import distributed
    from gnn_policy.database import Database
    from gnn_policy.snapshot import RunExport, load_shipped

    db_path = distributed.as_rank(args.db, args.shard_dir)  # under torchrun: this rank's GPU and database
    gpu = hardware_specs.resolve(args.gpu)
    problems = distributed.share(select_problems(args.split, args.problems, args.seed, args.max_gflop,
                                                 min_gflop=args.min_gflop))
    if args.pool_by_class:  # a machine's kernel cache dies with it: a run should finish whole classes
        problems = class_order(problems, args.seed)
    counts: dict = defaultdict(int)
    start = time.monotonic()
    deadline = start + args.time_limit * 60 if args.time_limit else float("inf")
    with Database(db_path) as db:
        counts["loaded_from_shards"] = load_shipped(db)
        export = RunExport(db, args.shard_dir, gpu.name, distributed.shard_kind("")) if args.shard_dir else None
        kernels: set[str] = set()
        stopped = on_interrupt(lambda: stored_note(counts["measured"], args.db, args.shard_dir))
        with stopped, worker_pool(gpu, args) as pool:
            # new problems before more configs of measured ones: a problem buys more than its configs
            # (docs/BENCHMARKS.md, "More data or another seed?"), and a run may end at its time limit
            measure_planned(db, gpu, plan(problems, gpu, args), args, counts, deadline, kernels, pool,
                            fresh_first=True)
        finish_counts(counts, start, kernels)
        if export is not None:
            counts["shard_rows"] = export.write()
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in counts.items()}


def worker_pool(gpu, args):
    """The measuring worker of `args` (runner, timeout, replays), to use as a context manager."""
    from gnn_policy.measure.workers import WorkerPool

    return WorkerPool(args.runner, gpu=gpu.name, timeout_s=args.timeout, replays=args.replays)


def measure_planned(db, gpu, planned: list[tuple[GemmProblem, list]], args, counts: defaultdict,
                    deadline: float, kernels: set[str], pool, fresh_first: bool = False) -> None:
    """Measure the pairs of `planned` the database lacks, problem by problem, until `deadline`,
    in `pool` (a `worker_pool`); with `fresh_first`, the problems none of whose pairs are stored
    go first (each part in planned order).

    `args` gives runner and compile_timeout. Each problem's rows are stored in one
    transaction; `kernels` gathers the Triton specialisations the compiles used."""
    from tqdm import tqdm

    from gnn_policy.measure.workers import ProblemSetupError

    todo = _missing(db, gpu.name, planned, counts)
    if fresh_first:
        sizes = {p.key: len(configs) for p, configs in planned}
        todo = sorted(todo, key=lambda job: len(job[1]) < sizes[job[0].key])  # stable: planned order within
    compiled = compile_ahead(todo, args.runner, args.compile_timeout)
    with tqdm(total=sum(len(cs) for _, cs in todo), desc=f"measure {gpu.name}", unit="cfg", smoothing=0.05) as bar:
        for p, configs in todo:
            if time.monotonic() > deadline:
                counts["stopped_by_time_limit"] = 1
                break
            rows, measure = take_compiled(p, configs, compiled, gpu.name, counts, kernels)
            t0 = time.monotonic()
            try:
                for m, c in zip(pool.run(p, measure), measure):
                    rows.append((m, p, c))
                    bar.update(1)
                    if time.monotonic() > deadline:  # keep what this problem has; the rest resumes
                        break
            except ProblemSetupError as exc:  # what was measured stays; the rest is tried again later
                tqdm.write(f"stopped {exc}")
                counts["problems_failed_setup"] += 1
            except KeyboardInterrupt:  # the problem in flight keeps what it has
                counts["measured"] += db.add(rows)
                raise
            counts["measure_s"] += time.monotonic() - t0
            bar.update(len(configs) - len(measure))
            for m, _, _ in rows:
                counts[m.status] += 1
            db.add(rows)
            counts["measured"] += len(rows)
            counts["problems_done"] += time.monotonic() <= deadline
    if compiled is not None:
        compiled.close()  # stops compiles that a time limit left unused


def stored_note(rows: int, db: str, shard_dir: str) -> str:
    """What an interrupted run stored, and how to go on (`gnn_policy.interrupts`)."""
    shard = ", not yet in a shard (the next run with --shard-dir writes them)" if shard_dir and rows else ""
    return f"{rows} rows stored in {db}{shard}; run the same command again to resume"


def finish_counts(counts: defaultdict, start: float, kernels: set[str]) -> None:
    """Add the run's throughput to `counts` and print it in a line (stderr)."""
    import sys

    counts["wall_s"] = time.monotonic() - start
    counts["per_minute"] = counts["measured"] / max(counts["wall_s"], 1e-9) * 60
    counts["per_minute_timing"] = counts["measured"] / max(counts["measure_s"], 1e-9) * 60
    counts["kernels"] = len(kernels)
    print(throughput(counts), file=sys.stderr)


def throughput(counts: dict) -> str:
    """The run in one line: measurements against compiles, and where the minutes went."""
    return (f"{counts['measured']} measurements, {counts['kernels']} Triton specialisations "
            f"({counts['compile_jobs']} compile jobs, {counts['compile_cpu_s']:.0f} CPU-s compiling); "
            f"{counts['per_minute']:.0f} a minute of wall time ({counts['wall_s']:.0f} s), "
            f"{counts['per_minute_timing']:.0f} a minute of timing ({counts['measure_s']:.0f} s); "
            f"GPU idle waiting for compiles {counts['wait_compile_s']:.0f} s")


def take_compiled(problem: GemmProblem, configs: list, compiled, gpu_name: str, counts: defaultdict,
                  kernels: set[str] | None = None):
    """Take this problem's results from the compile stream (one per config of `configs` that
    is not None, in order): rows for the configs that failed to compile, and the configs left
    to measure. `kernels`, when given, gathers the Triton specialisations (cache keys) used.

    A config whose variant cannot serve this problem's layout (TMA on unaligned strides) is
    not a valid point for it and gets no row. Waiting here is time the GPU sits idle.
    """
    if compiled is None:
        return [], list(configs)
    from gnn_policy.measure.runner import environment

    rows, measure = [], []
    t0 = time.monotonic()
    for c in configs:
        if c is None:
            measure.append(c)
            continue
        r = next(compiled)
        counts["compile_cpu_s"] += r.seconds
        counts["compile_jobs"] += 1
        if kernels is not None and r.kernel:
            kernels.add(r.kernel)
        if r.status == "ok":
            measure.append(c)
        elif r.status == "invalid":
            counts["invalid_layout"] += 1
        elif r.status == "oom":  # the compile process ran out of GPU memory: no row, retried later
            counts["compile_oom"] += 1
        else:
            m = Measurement(gpu_name, problem.key, c.key, r.status, versions=environment(), error=r.error)
            rows.append((m, problem, c))
    counts["wait_compile_s"] += time.monotonic() - t0
    return rows, measure
