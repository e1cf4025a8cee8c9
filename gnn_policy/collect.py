"""`gnn-policy collect`: measure suite problems x configs into the database, resumably.

Per problem: a stratified random sample of valid configs of the full space (equal shares per
(variant, SPLIT_K) group, so split-K and TMA are represented whatever their share of the
space), the named lists (`seed`, `triton_tutorial`, `inductor_mm`) and cuBLAS. Pairs already
in the database are skipped; each problem's rows are stored in one transaction, so Ctrl-C or
a kill loses at most the problem in flight. Kernels compile ahead on every CPU core.
"""
from __future__ import annotations

import dataclasses
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from graphs import GemmProblem
from graphs.suite import SPLITS, split
from gnn_policy.args import flag
from gnn_policy.space import NAMED_LISTS, TileConfig, fits_k, space, violations


@dataclasses.dataclass(frozen=True)
class CollectArgs:
    """Measure suite problems on the local GPU into the database (resumes where it stopped)."""

    db: str = flag(help="the SQLite database to fill")
    gpu: str = flag("", "GPU spec name (default: the local device)")
    split: str = flag("train", f"suite split to draw problems from: {', '.join(SPLITS)} or all")
    problems: int = flag(0, "number of problems, spread evenly over families (0: the whole split)")
    configs: int = flag(200, "random valid configs per problem, stratified by (variant, SPLIT_K)")
    lists: bool = flag(True, "also measure the named lists and cuBLAS")
    seed: int = flag(0, "random seed for the problem and config samples")
    timeout: float = flag(120.0, "seconds a config may take before it is recorded as a timeout")
    replays: int = flag(10, "CUDA-graph replays per timing")
    runner: str = flag("gnn_policy.measure.runner:measure_configs",
                       "dotted path of the measuring function (package.module:function)")
    shard_dir: str = flag("", "write the rows this run adds to a new shard here (e.g. data/measurements)")


def select_problems(name: str, count: int, seed: int) -> list[GemmProblem]:
    """`count` problems of a split, round-robin over its families (all when count is 0)."""
    pool = [p for s in (SPLITS if name == "all" else [name]) for p in split(s)]
    if not count or count >= len(pool):
        return pool
    by_family: dict[str, list[GemmProblem]] = defaultdict(list)
    for p in pool:
        by_family[p.model].append(p)
    rng = random.Random(seed)
    for members in by_family.values():
        rng.shuffle(members)
    chosen: list[GemmProblem] = []
    while len(chosen) < count:
        for members in by_family.values():
            if members and len(chosen) < count:
                chosen.append(members.pop())
    return chosen


def stratified_configs(valid: Sequence[TileConfig], count: int, rng: random.Random) -> list[TileConfig]:
    groups: dict[tuple, list[TileConfig]] = defaultdict(list)
    for c in valid:
        groups[(c.variant, c.split_k)].append(c)
    picked: list[TileConfig] = []
    share = max(1, count // max(1, len(groups)))
    for key in sorted(groups):
        picked += rng.sample(groups[key], min(share, len(groups[key])))
    taken = set(picked)
    rest = [c for c in valid if c not in taken]
    picked += rng.sample(rest, min(len(rest), max(0, count - len(picked))))
    return picked


def plan(problems: Sequence[GemmProblem], gpu, args: CollectArgs) -> list[tuple[GemmProblem, list]]:
    """For each problem, the configs to measure (None stands for cuBLAS), before skipping."""
    full = list(space("full"))
    valid_by_dtype = {d: [c for c in full if not violations(c, gpu, d)] for d in {p.dtype for p in problems}}
    named = sorted({c for cs in NAMED_LISTS.values() for c in cs}) if args.lists else []
    out = []
    for p in problems:
        rng = random.Random(f"{args.seed}:{p.key}")
        valid = [c for c in valid_by_dtype[p.dtype] if fits_k(c, p.k)]
        configs = stratified_configs(valid, args.configs, rng)
        chosen = set(configs)
        configs += [c for c in named if c not in chosen and not violations(c, gpu, p.dtype, p.k)]
        out.append((p, ([None] if args.lists else []) + configs))
    return out


def run(args: CollectArgs) -> dict:
    """Measure what is missing; returns counts (measured, skipped, per status)."""
    import torch
    from tqdm import tqdm

    import hardware_specs
    from gnn_policy.database import Database
    from gnn_policy.measure.workers import WorkerPool
    from gnn_policy.snapshot import export_shard, load_shipped

    gpu = hardware_specs.load(args.gpu) if args.gpu else hardware_specs.detect()
    problems = select_problems(args.split, args.problems, args.seed)
    counts: dict[str, int] = defaultdict(int)
    with Database(args.db) as db:
        counts["loaded_from_shards"] = load_shipped(db)
        first_new = db.max_id()
        done = db.measured(gpu.name)
        todo = []
        for p, configs in plan(problems, gpu, args):
            left = [c for c in configs if (p.key, c.key if c else "cublas") not in done]
            counts["skipped"] += len(configs) - len(left)
            if left:
                todo.append((p, left))
        if torch.cuda.is_available() and args.runner.startswith("gnn_policy.measure.runner:"):
            from gnn_policy.measure.compile import precompile

            precompile([(p, [c for c in cs if c is not None]) for p, cs in todo])
        total = sum(len(cs) for _, cs in todo)
        with WorkerPool(args.runner, gpu=gpu.name, timeout_s=args.timeout, replays=args.replays) as pool, \
                tqdm(total=total, desc=f"collect {gpu.name}", unit="cfg", smoothing=0.05) as bar:
            for p, configs in todo:
                rows = []
                for m, c in zip(pool.run(p, configs), configs):
                    rows.append((m, p, c))
                    counts[m.status] += 1
                    bar.update(1)
                db.add(rows)
                counts["measured"] += len(rows)
        if args.shard_dir:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            counts["shard_rows"] = export_shard(db, Path(args.shard_dir) / f"{gpu.name}_{stamp}.jsonl.gz", first_new)
    return dict(counts)
