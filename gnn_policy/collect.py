"""`gnn-policy collect`: measure suite problems x configs into the database, resumably.

Per problem: a stratified random sample of valid configs of the full space (equal shares per
(variant, SPLIT_K) group, so split-K and TMA are represented whatever their share of the
space), the named lists (`seed`, `triton_tutorial`, `inductor_mm`) and cuBLAS. Pairs already
in the database are skipped; each problem's rows are stored in one transaction, so Ctrl-C or
a kill loses at most the problem in flight.

Compiling (about 0.4 s of a CPU core per kernel) costs more than timing (tens of ms), so the
random samples come from a seeded pool per dtype (`--pool`, itself a stratified random
sample of the valid space): a kernel compiled for one problem then serves every problem with
the same specialisation. Kernels compile ahead on all cores but one while the GPU times the
problems already compiled.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
import time
from collections import defaultdict
from typing import Callable, Iterator, Sequence

from graphs import GemmProblem
from graphs.suite import SPLITS, split
from gnn_policy.args import at_least, flag, one_of, positive
from gnn_policy.interrupts import on_interrupt
from gnn_policy.measure.result import CUBLAS, Measurement
from gnn_policy.measure.workers import runner_path
from gnn_policy.space import NAMED_LISTS, TileConfig, fits_k, space, tma_fits, violations


SPLIT_NAMES = (*SPLITS, "all")  # what --split accepts: `select_problems` draws from each


@dataclasses.dataclass(frozen=True)
class CollectArgs:
    """Measure suite problems on the local GPU into the database (resumes where it stopped)."""

    db: str = flag(help="the SQLite database to fill")
    gpu: str = flag("", "GPU spec name (default: the local device)")
    split: str = flag("train", f"suite split to draw problems from: {', '.join(SPLITS)} or all",
                      check=one_of(*SPLIT_NAMES))
    problems: int = flag(0, "number of problems, spread evenly over families (0: the whole split)", check=at_least(0))
    configs: int = flag(200, "random valid configs per problem, stratified by (variant, SPLIT_K)", check=at_least(1))
    pool: int = flag(1000, "configs per dtype that every problem draws its sample from (0: the whole "
                           "valid space); a shared pool lets one compiled kernel serve many problems",
                     check=at_least(0))
    lists: bool = flag(True, "also measure the named lists and cuBLAS")
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
    `--split test --problems N` (a dense sweep, a bench, a transfer run) selects.
    """
    def eligible(p: GemmProblem) -> bool:
        return ((not max_gflop or p.flops <= max_gflop * 1e9) and p.flops > min_gflop * 1e9
                and (where is None or where(p)))

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


def _by_stratum(configs: Sequence[TileConfig]) -> dict[tuple, list[TileConfig]]:
    groups: dict[tuple, list[TileConfig]] = defaultdict(list)
    for c in configs:
        groups[(c.variant, c.split_k)].append(c)
    return groups


def stratified_configs(valid: Sequence[TileConfig], count: int, rng: random.Random) -> list[TileConfig]:
    """`count` configs of `valid`, an equal share from each (variant, SPLIT_K) group first."""
    groups = _by_stratum(valid)
    picked: list[TileConfig] = []
    share = max(1, count // max(1, len(groups)))
    for key in sorted(groups):
        picked += rng.sample(groups[key], min(share, len(groups[key])))
    taken = set(picked)
    rest = [c for c in valid if c not in taken]
    picked += rng.sample(rest, min(len(rest), max(0, count - len(picked))))
    return picked


def config_pool(valid: Sequence[TileConfig], size: int, seed: int) -> list[TileConfig]:
    """The first `size` configs of a seeded order that takes the (variant, SPLIT_K) groups in turn.

    Pools of one seed are nested (a larger pool holds every smaller one), so a dense sweep
    reuses the kernels of a sparse one. Size 0 or past the space: all of `valid`.
    """
    groups = _by_stratum(valid)
    rng = random.Random(f"pool:{seed}")
    queues = [rng.sample(groups[key], len(groups[key])) for key in sorted(groups)]
    order = [c for row in itertools.zip_longest(*queues) for c in row if c is not None]
    return order[:size] if size else order


def plan(problems: Sequence[GemmProblem], gpu, args: CollectArgs) -> list[tuple[GemmProblem, list]]:
    """For each problem, the configs to measure (None stands for cuBLAS), before skipping."""
    full = list(space("full"))
    pools = {d: config_pool([c for c in full if not violations(c, gpu, d)], args.pool, args.seed)
             for d in {p.dtype for p in problems}}
    named = sorted({c for cs in NAMED_LISTS.values() for c in cs}) if args.lists else []
    out = []
    for p in problems:
        rng = random.Random(f"{args.seed}:{p.key}")
        tma = tma_fits(p)
        fit = [c for c in pools[p.dtype] if fits_k(c, p.k) and (tma or c.variant != "tma")]
        configs = stratified_configs(fit, args.configs, rng)
        chosen = set(configs)
        configs += [c for c in named if c not in chosen and not violations(c, gpu, p.dtype, p.k)
                    and (tma or c.variant != "tma")]
        out.append((p, ([None] if args.lists else []) + configs))
    return out


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
    from tqdm import tqdm

    import hardware_specs
    from gnn_policy.database import Database
    from gnn_policy.measure.workers import ProblemSetupError, WorkerPool
    from gnn_policy.snapshot import RunExport, load_shipped

    gpu = hardware_specs.resolve(args.gpu)
    problems = select_problems(args.split, args.problems, args.seed, args.max_gflop, min_gflop=args.min_gflop)
    counts: dict = defaultdict(int)
    start = time.monotonic()
    deadline = start + args.time_limit * 60 if args.time_limit else float("inf")
    with Database(args.db) as db:
        counts["loaded_from_shards"] = load_shipped(db)
        export = RunExport(db, args.shard_dir, gpu.name) if args.shard_dir else None
        todo = _missing(db, gpu.name, plan(problems, gpu, args), counts)
        compiled = compile_ahead(todo, args.runner, args.compile_timeout)
        stopped = on_interrupt(lambda: stored_note(counts["measured"], args.db, args.shard_dir))
        with stopped, WorkerPool(args.runner, gpu=gpu.name, timeout_s=args.timeout, replays=args.replays) as pool, \
                tqdm(total=sum(len(cs) for _, cs in todo), desc=f"collect {gpu.name}", unit="cfg",
                     smoothing=0.05) as bar:
            for p, configs in todo:
                if time.monotonic() > deadline:
                    counts["stopped_by_time_limit"] = 1
                    break
                rows, measure = take_compiled(p, configs, compiled, gpu.name, counts)
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
        counts["wall_s"] = time.monotonic() - start
        counts["per_minute"] = counts["measured"] / max(counts["wall_s"], 1e-9) * 60
        if export is not None:
            counts["shard_rows"] = export.write()
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in counts.items()}


def stored_note(rows: int, db: str, shard_dir: str) -> str:
    """What an interrupted run stored, and how to go on (`gnn_policy.interrupts`)."""
    shard = ", not yet in a shard (the next run with --shard-dir writes them)" if shard_dir and rows else ""
    return f"{rows} rows stored in {db}{shard}; run the same command again to resume"


def take_compiled(problem: GemmProblem, configs: list, compiled, gpu_name: str, counts: defaultdict):
    """Take this problem's results from the compile stream (one per config of `configs` that
    is not None, in order): rows for the configs that failed to compile, and the configs left
    to measure.

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
