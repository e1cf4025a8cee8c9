"""How well a timing reproduces: re-measure random stored pairs in a separate run.

Draws `--pairs` random correct (problem, config) rows of one GPU from the database (cuBLAS
rows included when drawn), measures them again in a fresh worker with the collect runner,
and writes one JSON line per pair (first and second median time, their ratio). `--report`
prints the spread from that file without a GPU.

    python -m gnn_policy.benchmarks.noise --db m.sqlite --out docs/data/noise.jsonl
    python -m gnn_policy.benchmarks.noise --db m.sqlite --gpu h200-sm64 --out docs/data/noise-sm64.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
from collections import defaultdict
from pathlib import Path

import hardware_specs
from gnn_policy.database import Database
from gnn_policy.db_schema import problem_from_fields
from gnn_policy.measure.result import CUBLAS
from gnn_policy.space import TileConfig


def draw(db: Database, gpu: str, pairs: int, seed: int) -> list[dict]:
    rows = [r for r in db.rows_after(0) if r["gpu"] == gpu and r["source"] == "real" and r["status"] == "ok"]
    return random.Random(seed).sample(rows, min(pairs, len(rows)))


def remeasure(rows: list[dict], gpu: str) -> list[dict]:
    from gnn_policy.measure.compile import precompile
    from gnn_policy.measure.workers import WorkerPool

    by_problem: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_problem[r["problem"]].append(r)
    jobs = [(problem_from_fields(group[0]["problem_fields"]),
             [None if r["config"] == CUBLAS else TileConfig.from_key(r["config"]) for r in group], group)
            for group in by_problem.values()]
    precompile([(p, [c for c in cs if c is not None]) for p, cs, _ in jobs])  # a fresh machine has no cache
    out = []
    with WorkerPool("gnn_policy.measure.runner:measure_configs", gpu=gpu, timeout_s=120) as pool:
        for problem, configs, group in jobs:
            for m, r in zip(pool.run(problem, configs), group):
                out.append({"problem": r["problem"], "config": r["config"], "first_ms": r["median_ms"],
                            "second_ms": m.median_ms, "status": m.status,
                            "ratio": m.median_ms / r["median_ms"] if m.median_ms else None})
    return out


def report(results: list[dict]) -> str:
    dev = sorted(abs(r["ratio"] - 1) for r in results if r["ratio"])
    if not dev:
        return "no pair was re-measured"
    q = statistics.quantiles(dev, n=10) if len(dev) > 1 else dev * 9
    within = lambda x: sum(d <= x for d in dev) / len(dev)  # noqa: E731
    return (f"{len(dev)} pairs re-measured in a separate run: |second / first - 1| median "
            f"{statistics.median(dev):.1%}, p90 {q[-1]:.1%}, max {dev[-1]:.1%}; "
            f"within 2%: {within(0.02):.0%}, within 5%: {within(0.05):.0%}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, one per pair")
    ap.add_argument("--gpu", default="h200", help="GPU spec name; an SM slice (h200-sm64) is timed on its SMs")
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", action="store_true", help="only summarise --out (no GPU)")
    ns = ap.parse_args(argv)
    gpu = hardware_specs.load(ns.gpu).name
    if not ns.report:
        from gnn_policy.snapshot import load_shipped

        with Database(ns.db) as db:
            load_shipped(db)
            rows = draw(db, gpu, ns.pairs, ns.seed)
        results = remeasure(rows, gpu)
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text("".join(json.dumps(r) + "\n" for r in results))
    print(report([json.loads(line) for line in ns.out.read_text().splitlines()]))


if __name__ == "__main__":
    main()
