"""The template's ceiling: for each shape of a fixed list, cuBLAS against the best config of
every variant, found by a sweep and a one-knob refinement, then re-timed interleaved.

1. Sweep: `--configs` valid configs per (shape, variant), the same seeded order for every
   shape (so shapes of one Triton specialisation share their compiles), split-K groups taken
   in turn, after the tiles of any `--named` lists in each variant; cuBLAS once per shape.
2. Refine: around the best `--refine-top` configs of each (shape, variant), every one-knob
   neighbour (one knob moved one step, or the same tiles in another swept variant) that is
   valid and unmeasured, round after round until no (shape, variant) improves.
3. Confirm: the best `--confirm-top` configs of each variant and cuBLAS, `--rounds` times
   each in a shuffled order; a figure is then the median of all its timings.

Everything lands in the database, so a run that stops (`--time-limit`) resumes where it was.
On the GPU machine:
    python -m gnn_policy.benchmarks.ceiling --db /tmp/ceiling.sqlite --time-limit 8 --shard-dir data/measurements
Anywhere, from the database or the shipped shards: add `--report` (with `--markdown PATH`).
"""
from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import math
import random
import signal
import sys
import time
from collections import defaultdict

from graphs import GemmProblem
from gnn_policy.args import positive
from gnn_policy.space import VARIANTS, TileConfig, fits_k, named_list, space, tma_fits, violations

# (category, batch, M, N, K, B layout): prefill aligned and not, M of 100-300 with large N and
# K, short K, skinny N, decode, batched; "col" is nn.Linear's weight as `x @ W.T` reads it.
SHAPES = (
    ("prefill", 1, 4096, 4096, 4096, "row"), ("prefill", 1, 8192, 8192, 8192, "row"),
    ("prefill", 1, 4096, 4096, 4096, "col"), ("prefill", 1, 2048, 14336, 4096, "col"),
    ("prefill", 1, 1024, 1024, 1024, "row"), ("prefill", 1, 3072, 768, 768, "row"),
    ("prefill-unaligned", 1, 1000, 1000, 1000, "row"), ("prefill-unaligned", 1, 1537, 4096, 4096, "col"),
    ("prefill-unaligned", 1, 2048, 4544, 4544, "col"), ("prefill-unaligned", 1, 777, 2560, 10240, "col"),
    ("prefill-unaligned", 1, 1234, 1800, 7000, "col"), ("prefill-unaligned", 1, 5000, 3072, 1800, "row"),
    ("prefill-unaligned", 1, 640, 18176, 4544, "col"), ("prefill-unaligned", 1, 1024, 1001, 1024, "row"),
    ("mid-m", 1, 256, 4544, 4544, "col"), ("mid-m", 1, 128, 4096, 4096, "row"),
    ("mid-m", 1, 200, 8192, 8192, "col"), ("mid-m", 1, 300, 11008, 4096, "col"),
    ("short-k", 1, 4096, 4096, 320, "row"), ("short-k", 1, 2048, 8192, 256, "col"),
    ("short-k", 1, 8192, 1024, 128, "row"),
    ("skinny-n", 1, 8192, 64, 4096, "row"), ("skinny-n", 1, 16384, 16, 2048, "col"),
    ("skinny-n", 1, 4096, 128, 8192, "col"),
    ("decode", 1, 1, 4096, 4096, "col"), ("decode", 1, 16, 4096, 4096, "row"),
    ("decode", 1, 32, 14336, 4096, "col"), ("decode", 1, 64, 128256, 4096, "col"),
    ("decode", 1, 80, 5120, 13824, "col"), ("decode", 1, 8, 1000, 3000, "row"),
    ("batched", 32, 512, 512, 128, "col"), ("batched", 16, 1024, 128, 1024, "row"),
    ("batched", 8, 333, 333, 64, "col"),
)
TARGETS = "geomean >= 1.00; every category >= 0.95; 1000^3 >= 0.95; 4096^3 and 8192^3 >= 0.98"


def problems(count: int = 0) -> list[tuple[str, GemmProblem]]:
    """The first `count` shapes as bf16 problems (0: all)."""
    return [(cat, GemmProblem(m, n, k, batch=b, dtype="bf16", b_layout=bl, model="ceiling"))
            for cat, b, m, n, k, bl in SHAPES[:count or len(SHAPES)]]


def _fits(config: TileConfig, problem: GemmProblem) -> bool:
    return fits_k(config, problem.k) and (config.variant == "ptr" or tma_fits(problem))


def sweep_configs(problem: GemmProblem, variant: str, count: int, gpu, seed: int,
                  named: tuple[str, ...] = ()) -> list[TileConfig]:
    """The first `count` configs valid for `problem` of one seeded order per variant, after the
    tiles of the `named` lists in this variant (those valid for the problem)."""
    seeds = [dataclasses.replace(c, variant=variant) for name in named for c in named_list(name)]
    seeds = [c for c in dict.fromkeys(seeds) if _fits(c, problem) and not violations(c, gpu, problem.dtype, problem.k)]
    rest = [c for c in _order(variant, gpu, problem.dtype, seed) if _fits(c, problem)][:count]
    seeded = set(seeds)
    return seeds + [c for c in rest if c not in seeded]


_ORDERS: dict = {}


def _order(variant: str, gpu, dtype: str, seed: int) -> list[TileConfig]:
    key = (variant, gpu.name, dtype, seed)
    if key not in _ORDERS:
        rng = random.Random(f"{seed}:{variant}")
        groups = defaultdict(list)
        for c in space("hopper-all"):
            if c.variant == variant and not violations(c, gpu, dtype):
                groups[c.split_k].append(c)
        for g in groups.values():
            rng.shuffle(g)
        # split-K groups in turn, so that a short sweep still covers every one
        _ORDERS[key] = [g[i] for i in range(max(map(len, groups.values()), default=0))
                        for g in groups.values() if i < len(g)]
    return _ORDERS[key]


def neighbours(config: TileConfig, variants: tuple[str, ...] = ()) -> list[TileConfig]:
    """Every config one knob-step away, and the same tiles in each of `variants`: a variant
    whose own sweep missed a tile that wins for another is measured on it too."""
    sp = space("hopper-all")
    index = sp.index(config)
    out = []
    for j, (name, values) in enumerate(sp.knobs):
        if name == "variant":
            continue
        for step in (-1, 1):
            if 0 <= index[j] + step < len(values):
                out.append(sp.at(tuple(i + step if n == j else i for n, i in enumerate(index))))
    return out + [dataclasses.replace(config, variant=v) for v in variants if v != config.variant]


def best_by_variant(figures: dict[str, float]) -> dict[str, tuple[str, float]]:
    out: dict[str, tuple[str, float]] = {}
    for key, tf in figures.items():
        if key == "cublas":
            continue
        variant = key.rsplit("_", 1)[1]
        if variant not in out or tf > out[variant][1]:
            out[variant] = (key, tf)
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


class _Run:
    """The GPU side: one database, one compile pool, one measuring pool, one deadline."""

    def __init__(self, db, gpu, args, counts):
        import torch

        from gnn_policy.measure.compile import CompilePool
        from gnn_policy.measure.workers import WorkerPool
        from gnn_policy.search import Measurer

        self.db, self.gpu, self.args, self.counts = db, gpu, args, counts
        self.started = time.monotonic()
        self.deadline = self.started + args.time_limit * 60 if args.time_limit else float("inf")
        self.stage = "cublas"
        real = args.runner.startswith("gnn_policy.measure.runner:") and torch.cuda.is_available()
        self.compiler = CompilePool(timeout_s=40.0) if real else None  # an aborted compile is overdue after 110 s
        self.pool = WorkerPool(args.runner, gpu=gpu.name, timeout_s=args.timeout, replays=10)
        self.measure = Measurer(db, gpu, self.pool, self.compiler, counts)

    def close(self) -> None:
        self.pool.close()
        if self.compiler:
            self.compiler.close()

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def many(self, jobs: list[tuple[GemmProblem, list[TileConfig]]], per_chunk: int = 300) -> None:
        """Measure in chunks of about `per_chunk` configs, so a deadline stops between chunks and
        a progress line comes after each."""
        i = 0
        while i < len(jobs):
            if self.out_of_time():
                return
            j, size = i, 0
            while j < len(jobs) and (j == i or size + len(jobs[j][1]) <= per_chunk):
                size += len(jobs[j][1])
                j += 1
            self.measure.many(jobs[i:j])
            i = j
            print(f"[{time.monotonic() - self.started:6.0f} s] {self.stage}: {i}/{len(jobs)} jobs, "
                  f"{self.counts['measured']} rows", file=sys.stderr, flush=True)

    def cublas(self, plist: list[GemmProblem]) -> None:
        for p in plist:
            if (p.key, "cublas") not in self.db.measured(self.gpu.name, problem=p.key) and not self.out_of_time():
                self.counts["measured"] += self.db.add([(m, p, None) for m in self.pool.run(p, [None])])
        print(f"[{time.monotonic() - self.started:6.0f} s] cublas: {len(plist)} shapes", file=sys.stderr, flush=True)

    def sweep(self, plist: list[GemmProblem], variants: tuple[str, ...]) -> None:
        jobs = [(p, sweep_configs(p, v, self.args.configs, self.gpu, self.args.seed, tuple(self.args.named)))
                for v in variants for p in plist]
        self.stage = "sweep"
        self.many([(p, cs) for p, cs in jobs if cs])

    def refine(self, plist: list[GemmProblem], variants: tuple[str, ...]) -> None:
        for _ in range(self.args.max_rounds):
            jobs = []
            for p in plist:
                figures = self.db.tflops(self.gpu.name, p.key)
                measured = {k for _, k in self.db.measured(self.gpu.name, problem=p.key)}
                for v in variants:
                    mine = sorted((k for k in figures if k.endswith("_" + v)), key=figures.get, reverse=True)
                    near = {n for k in mine[:self.args.refine_top] for n in neighbours(TileConfig.from_key(k), variants)}
                    new = sorted(c for c in near if c.key not in measured and _fits(c, p)
                                 and not violations(c, self.gpu, p.dtype, p.k))
                    if new:
                        jobs.append((p, new))
            if not jobs or self.out_of_time():
                return
            before = {p.key: self.db.tflops(self.gpu.name, p.key) for p, _ in jobs}
            self.stage = f"refine round {self.counts['refine_rounds'] + 1}"
            self.many(jobs)
            self.counts["refine_rounds"] += 1
            if not any(best_by_variant(self.db.tflops(self.gpu.name, p.key)) != best_by_variant(before[p.key])
                       for p, _ in jobs):
                return  # no (shape, variant) found a better config this round

    def confirm(self, plist: list[GemmProblem]) -> None:
        self.stage = "confirm"
        from gnn_policy.confirm import schedule
        from gnn_policy.measure.result import Retime
        from gnn_policy.snapshot import run_stamp

        run_id = run_stamp()
        retimed = self.db.retimed(self.gpu.name)
        for p in plist:
            if self.out_of_time():
                return
            figures = self.db.tflops(self.gpu.name, p.key)
            wanted = [k for v in VARIANTS
                      for k in sorted((k for k in figures if k.endswith("_" + v)), key=figures.get,
                                      reverse=True)[:self.args.confirm_top]]
            wanted += ["cublas"] if "cublas" in figures else []
            if set(wanted) <= retimed.get(p.key, set()):
                continue
            sched = schedule(wanted, self.args.rounds, random.Random(f"{self.args.seed}:{p.key}"))
            configs = [None if k == "cublas" else TileConfig.from_key(k) for _, k in sched]
            rows = [(Retime(self.gpu.name, p.key, key, run_id, rnd, m.status, m.median_ms, m.sm_mhz, m.versions), p, c)
                    for m, (rnd, key), c in zip(self.pool.run(p, configs), sched, configs)]
            self.counts["retimed"] += self.db.add_retimes(rows)
            print(f"[{time.monotonic() - self.started:6.0f} s] confirm: {p.key}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict:
    import hardware_specs
    from gnn_policy.database import Database
    from gnn_policy.interrupts import terminate_as_interrupt
    from gnn_policy.snapshot import export_run

    gpu = hardware_specs.resolve(args.gpu)
    plist = [p for _, p in problems(args.shapes)]
    variants = tuple(args.variant or VARIANTS)
    counts: dict = defaultdict(int)
    start = time.monotonic()
    with Database(args.db) as db:
        since = db.high_water()
        job = _Run(db, gpu, args, counts)
        # a `timeout` or `kill` (SIGTERM) still exports what was measured: the finally runs
        try:
            with terminate_as_interrupt():
                # where a killed run stood, for the log (a stalled call once returned no line at all)
                faulthandler.register(signal.SIGTERM, file=sys.__stderr__, all_threads=True, chain=True)
                try:
                    job.cublas(plist)
                    job.sweep(plist, variants)
                    job.refine(plist, variants)
                    job.confirm(plist)
                finally:
                    faulthandler.unregister(signal.SIGTERM)
        except KeyboardInterrupt:
            counts["interrupted"] = 1
        finally:
            job.close()
            if args.shard_dir:
                # one shard holds the run's measurements and its re-timings
                counts["shard_rows"] = export_run(db, args.shard_dir, gpu.name, "ceiling", since)
    counts["wall_s"] = round(time.monotonic() - start, 1)
    counts["done"] = not job.out_of_time() and not counts["interrupted"]
    return dict(counts)


def report(db, gpu_name: str) -> tuple[str, dict]:
    """The markdown table (one row per shape, then geomeans per category) and a JSON summary."""
    rows, ratios, by_cat = [], [], defaultdict(list)
    head = ("| category | batch x M x N x K | B | cuBLAS TFLOP/s | " + " | ".join(VARIANTS)
            + " | best | its config |\n|" + "---|" * (6 + len(VARIANTS)))
    summary: dict = {"shapes": []}
    for cat, p in problems():
        figures = db.tflops(gpu_name, p.key)
        cublas = figures.get("cublas")
        best = best_by_variant(figures)
        if not cublas or not best:
            continue
        top_key, top = max(best.values(), key=lambda kv: kv[1])
        cells = [f"{best[v][1]:.0f} ({best[v][1] / cublas:.2f}x)" if v in best else "-" for v in VARIANTS]
        rows.append(f"| {cat} | {p.batch}x{p.m}x{p.n}x{p.k} | {p.b_layout} | {cublas:.0f} | "
                    + " | ".join(cells) + f" | **{top / cublas:.2f}x** | `{top_key}` |")
        ratios.append(top / cublas)
        by_cat[cat].append(top / cublas)
        by_cat[f"B {p.b_layout}"].append(top / cublas)
        summary["shapes"].append(dict(category=cat, problem=p.key, cublas=cublas, best=top_key,
                                      ratio=top / cublas, per_variant={v: b[1] for v, b in best.items()}))
    lines = [head, *rows, "", "| group | shapes | geomean best / cuBLAS | min |", "|---|---|---|---|",
             f"| all | {len(ratios)} | {geomean(ratios):.3f} | {min(ratios, default=float('nan')):.2f} |"]
    lines += [f"| {c} | {len(r)} | {geomean(r):.3f} | {min(r):.2f} |" for c, r in sorted(by_cat.items())]
    summary.update(geomean=geomean(ratios), categories={c: geomean(r) for c, r in by_cat.items()})
    return "\n".join(lines) + "\n", summary


def main(argv: list[str] | None = None) -> None:
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="SQLite database (state of the run; resumes)")
    parser.add_argument("--gpu", default="", help="GPU spec name (default: the local device)")
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="variants to sweep (default: all)")
    parser.add_argument("--configs", type=int, default=300, help="sweep size per (shape, variant)")
    parser.add_argument("--named", action="append", default=[],
                        help="also sweep this named list's tiles in every variant (repeatable: triton_tutorial, inductor_mm)")
    parser.add_argument("--refine-top", type=int, default=5)
    parser.add_argument("--max-rounds", type=int, default=8)
    parser.add_argument("--confirm-top", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=0.0, help="minutes; 0: none")
    parser.add_argument("--timeout", type=positive, default=120.0,
                        help="seconds a config may run on the GPU before it is recorded as a timeout "
                             "(a hung kernel costs this much: keep it short when mapping hangs)")
    parser.add_argument("--shard-dir", default="", help="export this run's rows as a shard here")
    parser.add_argument("--load", default="", help="import the shards of this folder into --db first")
    parser.add_argument("--shapes", type=int, default=0, help="only the first N shapes (0: all)")
    parser.add_argument("--runner", default="gnn_policy.measure.runner:measure_configs",
                        help="dotted path of the measuring function")
    parser.add_argument("--report", action="store_true", help="only print the table from --db")
    parser.add_argument("--markdown", default="", help="also write the table here")
    parser.add_argument("--json", default="", help="also write the summary here")
    args = parser.parse_args(argv)
    import hardware_specs
    from gnn_policy.database import Database
    from gnn_policy.snapshot import load_shipped

    if args.load:
        with Database(args.db) as db:
            print("loaded", load_shipped(db, __import__("pathlib").Path(args.load)), "rows")
    if not args.report:
        print(json.dumps(run(args)))
    gpu = hardware_specs.resolve(args.gpu)
    with Database(args.db) as db:
        table, summary = report(db, gpu.name)
    print(table)
    print("targets:", TARGETS)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
